"""The transformers model of a published quantized checkpoint, with its decoded bf16 weights.

transformers would load a DeepSeek FP8 or GPT-OSS MXFP4 checkpoint through its own
quantizers (GPU kernels, or its own dequantization), and refuses or changes what runs on
this CPU machine. Where tfcompile needs the model in memory (the whole-model calibration
loop, `tfcompile eval --reference` with the published checkpoint), it builds the
architecture from config.json without its quantization_config and loads the tensors of
`open_source` (tfcompile/io/sources/): plain names by the model's renaming rules
(families/names.py), per-expert weights and biases into the fused expert parameters
(families/experts.py). Every parameter must be loaded.
"""

from __future__ import annotations

import re
import warnings
from pathlib import Path

import torch

from tfcompile.errors import CheckpointError
from tfcompile.families.experts import set_expert, set_expert_bias
from tfcompile.families.names import NameMap
from tfcompile.io.hf_config import load_hf_config, transformers_class
from tfcompile.io.sources import READERS, open_source

_EXPERT = re.compile(r"^(?P<parent>.*\.experts)\.(?P<e>\d+)\.(?P<proj>gate_proj|up_proj|down_proj)\.(?P<leaf>weight|bias)$")


def is_published(config: dict) -> bool:
    qc = config.get("quantization_config")
    return isinstance(qc, dict) and qc.get("quant_method") in READERS


def load_decoded_model(model_dir: Path, dtype: torch.dtype):
    """transformers' model for config.json's architecture, weights decoded by tfcompile (eval mode)."""

    source = open_source(model_dir)
    cfg = load_hf_config(model_dir)  # CheckpointError for a config transformers cannot read
    if hasattr(cfg, "quantization_config"):
        delattr(cfg, "quantization_config")
    arch = (cfg.architectures or [None])[0]
    cls = transformers_class(arch)
    if cls is None:
        raise CheckpointError(f"{model_dir}/config.json: architecture {arch!r} is not in transformers",
                              hint="tfcompile builds models with transformers (no remote code)")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = cls._from_config(cfg, dtype=dtype).eval()
    names = NameMap(model, source.names())
    modules = dict(model.named_modules())
    state, loaded = {}, set()
    with torch.no_grad():
        for n in source.names():
            m = _EXPERT.match(names.to_model(n))
            if m and m["parent"] in modules and hasattr(modules[m["parent"]], "gate_up_proj"):
                t = source.get(n).to(dtype)
                put = set_expert if m["leaf"] == "weight" else set_expert_bias
                put(modules[m["parent"]], int(m["e"]), m["proj"], t)
                fused = "down_proj" if m["proj"] == "down_proj" else "gate_up_proj"
                loaded.add(f"{m['parent']}.{fused}{'' if m['leaf'] == 'weight' else '_bias'}")
            else:
                state[names.to_model(n)] = source.get(n)
        result = model.load_state_dict(state, strict=False)
    missing = sorted(set(result.missing_keys) - loaded)
    if missing or result.unexpected_keys:
        what = missing[0] if missing else sorted(result.unexpected_keys)[0]
        raise CheckpointError(f"{model_dir}: tensor {what} is {'missing' if missing else 'not a parameter'} "
                              f"after decoding the {source.source_format['format']} checkpoint",
                              hint="the checkpoint does not match its config.json")
    source.close()
    return model
