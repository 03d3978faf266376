"""Helpers for tests/families (tests/families is on sys.path, like tests/interop)."""

from __future__ import annotations

import contextlib
import importlib.util
import io
import json
import os
from pathlib import Path

import torch

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
FORMATS = ("nvfp4", "nvfp4a16", "mxfp4", "mxfp4a16", "mxfp8", "fp8", "fp8-dynamic", "fp8-block")
STATIC = {"nvfp4", "fp8"}  # formats with calibrated input scales
# Quick calibration: random tokens; the statistics only need to exist and be valid.
CALIB = ("--calib", "random", "--calib-samples", "2", "--calib-seq-len", "32")
# The CI subset of the family x format matrix: every family twice, every format at least twice, the
# calibrated ones on every MoE layout. TFCOMPILE_FAMILY_MATRIX=full runs all 14 x 8 (bench/families.py
# runs them too, with the loader checks, into docs/models.md).
CI_MATRIX = (
    ("deepseek_v3", "nvfp4"), ("deepseek_v3", "fp8-block"), ("kimi_k2", "mxfp4a16"),
    ("gpt_oss", "mxfp4"), ("gpt_oss", "fp8"), ("glm4_moe", "nvfp4a16"), ("glm4_moe", "mxfp8"),
    ("qwen3", "fp8-dynamic"), ("qwen3", "nvfp4"), ("qwen3_moe", "nvfp4"), ("qwen3_moe", "mxfp4a16"),
    ("qwen3_next", "fp8"), ("qwen3_next", "nvfp4a16"), ("qwen2_5_vl", "mxfp8"), ("qwen2_5_vl", "fp8-block"),
    ("kimi_k2", "fp8-dynamic"), ("qwen2_5_vl", "mxfp4"),
    # the 2026 families: DSA with calibration and FP8 blocks, Qwen3.5-MoE (vision wrapper) and MiniMax-M2
    # (experts w1/w2/w3) calibrated
    ("deepseek_v32", "fp8-block"), ("glm_moe_dsa", "nvfp4"), ("qwen3_5_moe", "nvfp4"), ("qwen3_5", "mxfp8"),
    ("minimax_m2", "nvfp4"),
)


def load_fixture(name: str):
    spec = importlib.util.spec_from_file_location(f"tfcompile_test_{name}", FIXTURES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# Families `tfcompile eval` cannot build yet, with why (a strict xfail in the full matrix: it must go when fixed).
EVAL_GAPS = {"kimi_k25": "tfcompile eval loads an artifact's plain tensors by transformers' renames only; Kimi "
                         "K2.5's published vision tower needs its WeightConverter (wqkv split + RoPE permutation) and "
                         "the `model.` prefix fallback (mm_projector.pre_norm, vision_tower.patch_embed)"}


def matrix() -> list:
    import pytest

    if os.environ.get("TFCOMPILE_FAMILY_MATRIX") == "full":
        return [pytest.param(f, fmt, marks=pytest.mark.xfail(strict=True, reason=EVAL_GAPS[f])) if f in EVAL_GAPS
                else (f, fmt) for f in load_fixture("families").FAMILIES for fmt in FORMATS]
    return list(CI_MATRIX)


def run_cli(*args) -> tuple[int, str, str]:
    """`tfcompile ARGS` in-process: (exit code, stdout, stderr)."""
    from tfcompile.cli.main import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main([str(a) for a in args])
    return code, out.getvalue(), err.getvalue()


def quantize(src: Path, out: Path, fmt: str, *extra: str) -> Path:
    calib = CALIB if (fmt in STATIC or any(e in ("--kv-cache", "--algorithm") for e in extra)) else ()
    if any(e == "--calib" for e in extra):
        calib = ()
    code, _, err = run_cli("quantize", src, "-o", out, "--format", fmt, "-q", *calib, *extra)
    assert code == 0, f"quantize {src.name} --format {fmt} {extra}: exit {code}\n{err[-3000:]}"
    return out


def manifest(artifact: Path) -> dict:
    return json.loads((Path(artifact) / "tfcompile" / "manifest.json").read_text())


def tensors(directory: Path) -> dict[str, torch.Tensor]:
    from tests_helpers import tensors as read

    return read(Path(directory))


def model_class(src: Path):
    from tfcompile.io.hf_config import transformers_class  # published names of native classes too

    return transformers_class(json.loads((Path(src) / "config.json").read_text())["architectures"][0])


def dequantized_reference(src: Path, artifact: Path, dtype=torch.bfloat16):
    """The *original* model with every quantized Linear replaced by tfcompile's dequantized weight
    (plain bf16), fused experts written in the model's own layout: the independent decoder."""
    from tfcompile.artifact.naming import qtensor_of
    from tfcompile.families.experts import set_expert
    from tfcompile.families.names import NameMap
    from tfcompile.kernels.formats import dequantize
    from tfcompile.schemes import get_scheme

    model = model_class(src).from_pretrained(str(src), dtype=dtype).eval()
    m = manifest(artifact)
    scheme = get_scheme(m["scheme"]["name"])
    names, mods = NameMap(model), dict(model.named_modules())
    from tfcompile.io.checkpoint import open_checkpoint

    with open_checkpoint(artifact) as ckpt:
        for layer in m["layers"]:
            w = dequantize(qtensor_of(ckpt, scheme, layer["module"], *layer["shape"]), torch.float32).to(dtype)
            name = names.to_model(layer["module"])
            if name in mods and hasattr(mods[name], "weight"):
                with torch.no_grad():
                    mods[name].weight.copy_(w)
                continue
            parent, e, proj = name.rsplit(".", 2)
            set_expert(mods[parent], int(e), proj, w)
    return model


def ids(n: int = 24, batch: int = 2, seed: int = 0) -> torch.Tensor:
    return torch.randint(4, 250, (batch, n), generator=torch.Generator().manual_seed(seed))


def ct_load(artifact: Path, dtype=torch.bfloat16):
    """transformers + compressed-tensors' own loader, decompressing to bf16 at load (CPU)."""
    import warnings

    from transformers import CompressedTensorsConfig

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return model_class(artifact).from_pretrained(
            str(artifact), dtype=dtype, quantization_config=CompressedTensorsConfig(dequantize=True)).eval()


def weight_mismatches(loaded, reference) -> list[str]:
    """Parameters whose values differ between two models of one architecture (bit-exact compare)."""
    ref = dict(reference.named_parameters())
    return sorted(n for n, p in loaded.named_parameters() if n in ref and not torch.equal(p, ref[n]))
