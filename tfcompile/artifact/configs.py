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


def modelopt_quant_config(scheme: Scheme, exclude: list[str]) -> tuple[dict, dict]:
    """(hf_quant_config.json, config.json["quantization_config"]) for TensorRT-LLM/vLLM.

    Mirrors what modelopt 0.47's `export_hf_checkpoint` writes for the same
    scheme (tests/interop/test_modelopt_view.py compares the two): vLLM's
    modelopt loader reads config.json and takes excluded layers from `ignore`;
    TensorRT-LLM reads hf_quant_config.json's `exclude_modules`.
    """
    producer = {"name": "tfcompile", "version": __version__}
    quant: dict = {"quant_algo": scheme.modelopt_algo, "kv_cache_quant_algo": None}
    group_size = {"nvfp4": 16, "mxfp8": 32}.get(scheme.weight)  # modelopt omits it for mxfp4
    if group_size:
        quant["group_size"] = group_size
    quant["exclude_modules"] = sorted(exclude)
    cfg: dict = {"quant_method": "modelopt", "quant_algo": scheme.modelopt_algo,
                 "ignore": sorted(exclude), "producer": producer}
    groups = _modelopt_config_groups(scheme)
    if groups:
        cfg["config_groups"] = groups
    return {"producer": producer, "quantization": quant}, cfg


def _modelopt_config_groups(scheme: Scheme) -> dict | None:
    """modelopt writes config_groups for NVFP4 (W4A4, W4A16) and static FP8 only."""
    if scheme.weight == "nvfp4":
        args = {"dynamic": False, "num_bits": 4, "type": "float", "group_size": 16}
    elif scheme.weight == "fp8" and scheme.granularity == "tensor":
        args = {"dynamic": False, "num_bits": 8, "type": "float"}
    else:
        return None
    group = {"weights": args, "targets": ["Linear"]}
    if scheme.act:
        group["input_activations"] = dict(args)
    return {"group_0": group}
