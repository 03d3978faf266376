"""`tfcompile verify` checks the engine view: fused q/k/v must share one NVFP4 global scale with
their members (a test builds artifacts where they differ)."""

from __future__ import annotations

import shutil

import torch
from safetensors.torch import load_file, save_file

ARGS = ("nvfp4a16", "--layout", "trtllm", "--tp", "2")


def _edit(path, name, fn):
    tensors = load_file(path)
    tensors[name] = fn(tensors[name])
    save_file(tensors, path, metadata={"format": "pt"})


def _checks(run_cli, art) -> dict:
    res = run_cli("verify", art, "--json")
    return res.code, {c["check"]: c for c in res.json()["checks"]}


def test_good_view_verifies(run_cli, quantized):
    code, checks = _checks(run_cli, quantized("gqa2", *ARGS))
    assert code == 0
    assert checks["engine view layers"]["ok"] and checks["engine view shares global scale"]["ok"]
    assert "trtllm: " in checks["engine view layers"]["detail"]


def test_fused_view_global_scale_differing_from_members_is_rejected(run_cli, quantized, tmp_path):
    art = tmp_path / "bad"
    shutil.copytree(quantized("gqa2", *ARGS), art)
    _edit(art / "trtllm" / "model.safetensors", "model.layers.1.self_attn.qkv_proj.weight_global_scale",
          lambda t: t * 2)
    code, checks = _checks(run_cli, art)
    assert code == 1
    bad = checks["engine view shares global scale"]
    assert not bad["ok"] and "trtllm/model.layers.1.self_attn.qkv_proj vs model.layers.1.self_attn.q_proj" in bad["detail"]
    assert checks["fused groups share global scale"]["ok"]  # the compressed-tensors view is intact


def test_member_global_scales_that_differ_are_rejected_in_both_views(run_cli, quantized, tmp_path):
    art = tmp_path / "bad"
    shutil.copytree(quantized("gqa2", *ARGS), art)
    _edit(art / "model.safetensors", "model.layers.0.self_attn.k_proj.weight_global_scale",
          lambda t: t * torch.tensor(1.5))
    code, checks = _checks(run_cli, art)
    assert code == 1
    assert not checks["fused groups share global scale"]["ok"]
    assert not checks["engine view shares global scale"]["ok"]
    assert "model.layers.0.self_attn.qkv_proj" in checks["engine view shares global scale"]["detail"]


def test_missing_view_tensor_is_rejected(run_cli, quantized, tmp_path):
    art = tmp_path / "bad"
    shutil.copytree(quantized("gqa2", *ARGS), art)
    path = art / "trtllm" / "model.safetensors"
    tensors = load_file(path)
    del tensors["model.layers.0.mlp.gate_up_proj.weight_scale"]
    save_file(tensors, path, metadata={"format": "pt"})
    code, checks = _checks(run_cli, art)
    assert code == 1 and "gate_up_proj.weight_scale: missing" in checks["engine view layers"]["detail"]
