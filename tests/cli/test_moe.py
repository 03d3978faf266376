"""MoE experts are quantized whether stored per expert or fused (transformers v5)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
from safetensors.torch import save_file

from tests_helpers import tensors


def _fused_copy(src: Path, dst: Path) -> Path:
    """Re-save a Qwen3-MoE checkpoint with experts fused as transformers v5 holds them."""
    from transformers import AutoModelForCausalLM

    shutil.copytree(src, dst)
    (dst / "model.safetensors").unlink()
    model = AutoModelForCausalLM.from_pretrained(src, dtype=torch.bfloat16)
    sd = {k: v.contiguous() for k, v in model.state_dict().items()}
    assert "model.layers.0.mlp.experts.gate_up_proj" in sd  # [E, 2I, H]
    save_file(sd, dst / "model.safetensors", metadata={"format": "pt"})
    return dst


def _check_moe_artifact(out: Path, experts: int, layers: int) -> None:
    t = tensors(out)
    cfg = json.loads((out / "config.json").read_text())["quantization_config"]
    for layer in range(layers):
        p = f"model.layers.{layer}.mlp"
        assert f"{p}.gate" in cfg["ignore"]  # the router stays high precision
        assert t[f"{p}.gate.weight"].dtype == torch.bfloat16
        for e in range(experts):
            for proj in ("gate_proj", "up_proj", "down_proj"):
                assert t[f"{p}.experts.{e}.{proj}.weight_packed"].dtype == torch.uint8
            g = t[f"{p}.experts.{e}.gate_proj.weight_global_scale"]
            assert torch.equal(g, t[f"{p}.experts.{e}.up_proj.weight_global_scale"])  # w1/w3 share


def test_per_expert_checkpoint(model_factory, tmp_path, run_cli):
    src = model_factory.make_tiny_qwen3_moe(tmp_path / "moe")
    out = tmp_path / "out"
    res = run_cli("quantize", src, "-o", out, "--format", "nvfp4a16", "--json")
    assert res.code == 0, res.err
    _check_moe_artifact(out, experts=4, layers=2)
    assert run_cli("verify", out).code == 0


def test_fused_expert_checkpoint_is_split_and_quantized(model_factory, tmp_path, run_cli):
    src = model_factory.make_tiny_qwen3_moe(tmp_path / "moe")
    fused = _fused_copy(src, tmp_path / "moe-fused")
    a, b = tmp_path / "a", tmp_path / "b"
    assert run_cli("quantize", src, "-o", a, "--format", "nvfp4a16").code == 0
    res = run_cli("quantize", fused, "-o", b, "--format", "nvfp4a16", "--json")
    assert res.code == 0, res.err
    _check_moe_artifact(b, experts=4, layers=2)
    # Splitting the fused tensor must give exactly what the per-expert checkpoint gives.
    ta, tb = tensors(a), tensors(b)
    experts = [k for k in ta if ".experts." in k]
    assert experts and all(torch.equal(ta[k].view(torch.uint8), tb[k].view(torch.uint8)) for k in experts)
    assert run_cli("verify", b).code == 0
