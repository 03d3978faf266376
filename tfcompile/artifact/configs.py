"""The quantization configs engines read: compressed-tensors and modelopt.

compressed-tensors' own pydantic models build the `quantization_config` block
so that its schema is whatever the installed loader (vLLM, transformers)
expects, not our transcription of it.
"""

from __future__ import annotations

import compressed_tensors
from compressed_tensors.quantization import QuantizationConfig
from compressed_tensors.quantization.quant_scheme import preset_name_to_scheme

from tfcompile import __version__
from tfcompile.schemes import Scheme


def ct_quantization_config(scheme: Scheme, ignore: list[str]) -> dict:
    """config.json["quantization_config"] for the compressed-tensors view."""
    qscheme = preset_name_to_scheme(scheme.ct_preset, ["Linear"])
    qc = QuantizationConfig(
        config_groups={"group_0": qscheme},
        format=scheme.ct_format,
        quantization_status="compressed",
        ignore=sorted(ignore),
        kv_cache_scheme=None,
    )
    body = qc.model_dump(mode="json", exclude={"quant_method"})
    return {
        "version": compressed_tensors.__version__,
        "quant_method": "compressed-tensors",
        "sparsity_config": {},
        "transform_config": {},
        **body,
    }


def modelopt_quant_config(scheme: Scheme, ignore: list[str]) -> tuple[dict, dict]:
    """(hf_quant_config.json, config.json["quantization_config"]) for TensorRT-LLM/vLLM."""
    group = {"nvfp4": 16, "mxfp4": 32, "mxfp8": 32}.get(scheme.weight)
    quant = {
        "quant_algo": scheme.modelopt_algo,
        "kv_cache_quant_algo": None,
        "exclude_modules": sorted(ignore),
    }
    if group:
        quant["group_size"] = group
    if scheme.granularity == "block":
        quant["block_size"] = list(scheme.block)
    hf_quant = {"producer": {"name": "tfcompile", "version": __version__}, "quantization": quant}
    cfg = {"quant_method": "modelopt", **quant}
    return hf_quant, cfg
