"""Issue 24, case 6 (and the first two input errors of case 9): every scale of a published
checkpoint is checked against its weight (shape, dtype, finite, sign) before it is used, and
malformed block sizes or impossible tensor shapes are exit 1 naming the tensor, never exit 0
(a garbage artifact that verifies) or exit 2."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from safety_helpers import quantize_to

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
LINEAR = "model.layers.0.self_attn.q_proj"


@pytest.fixture(scope="module")
def published():
    spec = importlib.util.spec_from_file_location("tfcompile_test_published_safety", FIXTURES / "published.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _edit(model: Path, name: str, fn) -> None:
    """Replace tensor `name` of MODEL/model.safetensors by fn(tensor)."""
    f = model / "model.safetensors"
    tensors = load_file(f)
    tensors[name] = fn(tensors[name]).contiguous()
    save_file(tensors, f, metadata={"format": "pt"})


def _refused(run_cli, src: Path, out: Path, *needles: str) -> None:
    res = run_cli("quantize", src, "-o", out, "--format", "nvfp4a16")
    assert res.code == 1 and "Traceback" not in res.err and "hint: " in res.err, (res.code, res.err)
    for n in needles:
        assert n in res.err, (n, res.err)
    assert not out.exists()


@pytest.mark.parametrize("bad", ["shape", "int", "nan", "negative"])
def test_fp8_block_scale_checked_against_its_weight(bad, tiny_llama, tmp_path, run_cli, published):
    src = published.to_fp8_block(tiny_llama, tmp_path / "fp8")
    edit = {"shape": lambda s: torch.cat([s, s], 0), "int": lambda s: s.to(torch.int32),
            "nan": lambda s: s.index_fill(0, torch.tensor([0]), float("nan")), "negative": lambda s: -s}[bad]
    _edit(src, f"{LINEAR}.weight_scale_inv", edit)
    _refused(run_cli, src, tmp_path / "out", f"{LINEAR}.weight_scale_inv")


@pytest.mark.parametrize("block", [["a", 128], [0, 128], [128], [True, 128], 128, [128, 1 << 40]])
def test_malformed_weight_block_size_is_a_user_error(block, tiny_llama, tmp_path, run_cli, published):
    src = published.to_fp8_block(tiny_llama, tmp_path / "fp8")
    cfg = json.loads((src / "config.json").read_text())
    cfg["quantization_config"]["weight_block_size"] = block
    (src / "config.json").write_text(json.dumps(cfg))
    _refused(run_cli, src, tmp_path / "out", "weight_block_size")


@pytest.mark.parametrize("bad", ["shape", "dtype", "zero_global", "missing_global"])
def test_compressed_tensors_scales_checked_against_their_weight(bad, tiny_llama, tmp_path, run_cli):
    src = quantize_to(tiny_llama, tmp_path / "ct")  # nvfp4a16: weight_packed, weight_scale, global scale
    for f in ("tfcompile/manifest.json",):
        (src / f).unlink()  # a compressed-tensors checkpoint from elsewhere: no tfcompile manifest
    name = {"shape": f"{LINEAR}.weight_scale", "dtype": f"{LINEAR}.weight_scale",
            "zero_global": f"{LINEAR}.weight_global_scale", "missing_global": f"{LINEAR}.weight_global_scale"}[bad]
    if bad == "missing_global":
        tensors = load_file(src / "model.safetensors")
        del tensors[name]
        save_file(tensors, src / "model.safetensors", metadata={"format": "pt"})
    else:
        edit = {"shape": lambda s: s[:, :-1], "dtype": lambda s: s.float(),
                "zero_global": lambda s: torch.zeros_like(s)}[bad]
        _edit(src, name, edit)
    _refused(run_cli, src, tmp_path / "out", name)


def test_compressed_tensors_weight_of_an_impossible_shape(tiny_llama, tmp_path, run_cli):
    src = quantize_to(tiny_llama, tmp_path / "ct")
    (src / "tfcompile/manifest.json").unlink()
    _edit(src, f"{LINEAR}.weight_packed", lambda w: w.reshape(-1))
    _refused(run_cli, src, tmp_path / "out", f"{LINEAR}.weight_packed")


def test_the_unedited_sources_quantize(tiny_llama, tmp_path, run_cli, published):
    """The control: the same sources, unedited, give an artifact verify passes."""
    ct = quantize_to(tiny_llama, tmp_path / "ct")
    (ct / "tfcompile/manifest.json").unlink()
    for src in (published.to_fp8_block(tiny_llama, tmp_path / "fp8"), ct):
        out = tmp_path / f"out-{src.name}"
        res = run_cli("quantize", src, "-o", out, "--format", "nvfp4a16")
        assert res.code == 0, res.err
        assert run_cli("verify", out).code == 0
