"""The quantization configs engines read: compressed-tensors and modelopt.

The compressed-tensors block is built from `ct_presets.CONFIG_GROUP`, a table
generated from compressed-tensors' own pydantic models (QuantizationConfig,
preset_name_to_scheme) by scripts/gen_ct_presets.py, so its schema is what
the vLLM/transformers loaders parse. Importing compressed-tensors at run time
would cost 2.6 s (it imports transformers); tests/interop/test_ct_presets.py
checks that this function's output equals compressed-tensors' live dump.
"""

from __future__ import annotations

import copy
from importlib import metadata

from tfcompile import __version__
from tfcompile.artifact.ct_presets import CONFIG_GROUP, KV_CACHE_SCHEME
from tfcompile.schemes import Scheme, get_kv_format


def kv_cache_scheme(kv: str | None, kv_format: str = "fp8") -> dict | None:
    """quantization_config.kv_cache_scheme: FP8 E4M3 per tensor / per head (compressed-tensors' own
    dump), or NVFP4: compressed-tensors' NVFP4 activation arguments (E2M1, E4M3 scales per 16,
    computed at run time; a static per-tensor global scale: the stored k_scale / v_scale)."""
    if not kv:
        return None
    preset = get_kv_format(kv_format).ct_preset
    if preset:
        return copy.deepcopy(CONFIG_GROUP[preset]["input_activations"])
    return copy.deepcopy(KV_CACHE_SCHEME[kv])


def ct_quantization_config(scheme: Scheme, ignore: list[str], kv: str | None = None,
                           kv_format: str = "fp8") -> dict:
    """config.json["quantization_config"] for the compressed-tensors view."""
    try:
        version = metadata.version("compressed-tensors")
    except metadata.PackageNotFoundError:
        version = None
    return {
        "version": version,
        "quant_method": "compressed-tensors",
        "sparsity_config": {},
        "transform_config": {},
        "config_groups": {"group_0": copy.deepcopy(CONFIG_GROUP[scheme.ct_preset])},
        "kv_cache_scheme": kv_cache_scheme(kv, kv_format),
        "format": scheme.ct_format,
        "quantization_status": "compressed",
        "global_compression_ratio": None,
        "ignore": sorted(ignore),
        "moe_sparsity_config": None,
    }


def modelopt_quant_config(scheme: Scheme, exclude: list[str], kv: str | None = None,
                          kv_format: str = "fp8") -> tuple[dict, dict]:
    """(hf_quant_config.json, config.json["quantization_config"]) for TensorRT-LLM/vLLM.

    Mirrors what modelopt 0.47's `export_hf_checkpoint` writes for the same
    scheme (tests/interop/test_modelopt_view.py compares the two): vLLM's
    modelopt loader reads config.json and takes excluded layers from `ignore`;
    TensorRT-LLM reads hf_quant_config.json's `exclude_modules`.
    """
    producer = {"name": "tfcompile", "version": __version__}
    kv_algo = get_kv_format(kv_format).modelopt_algo if kv else None
    quant: dict = {"quant_algo": scheme.modelopt_algo, "kv_cache_quant_algo": kv_algo}
    if scheme.modelopt_group_size:  # the scheme's (modelopt omits it for mxfp4 and fp8)
        quant["group_size"] = scheme.modelopt_group_size
    quant["exclude_modules"] = sorted(exclude)
    cfg: dict = {"quant_method": "modelopt", "quant_algo": scheme.modelopt_algo,
                 "ignore": sorted(exclude), "producer": producer}
    if kv:
        cfg["kv_cache_quant_algo"] = kv_algo
    groups = _modelopt_config_groups(scheme)
    if groups:
        cfg["config_groups"] = groups
    return {"producer": producer, "quantization": quant}, cfg


def _modelopt_config_groups(scheme: Scheme) -> dict | None:
    """modelopt writes config_groups for NVFP4 (W4A4, W4A16) and static FP8 only: the schemes that
    state `modelopt_group_bits` (with the group size where they state one)."""
    if scheme.modelopt_group_bits is None:
        return None
    args: dict = {"dynamic": False, "num_bits": scheme.modelopt_group_bits, "type": "float"}
    if scheme.modelopt_group_size:
        args["group_size"] = scheme.modelopt_group_size
    group = {"weights": args, "targets": ["Linear"]}
    if scheme.act:
        group["input_activations"] = dict(args)
    return {"group_0": group}
