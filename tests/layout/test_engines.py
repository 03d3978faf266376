"""The engine rules table and the errors an invalid combination gives (exit 1, with a hint)."""

from __future__ import annotations

import pytest

from tfcompile.errors import RecipeError
from tfcompile.layout import engines as E

DEMO_ARGS = ("--format", "nvfp4a16")


def test_every_rule_names_its_source_and_a_valid_default():
    for key, r in E.all_rules().items():
        assert key == f"{r.engine}/{r.backend}" and len(r.source) > 40
        assert E.block_ok(r.block_sizes, r.default_block)
        assert set(r.kv_layouts) <= set(E.KV_LAYOUTS) and set(r.kv_dtypes) <= set(E.KV_DTYPES)
    assert E.block_ok("multiple:16", 32) and not E.block_ok("multiple:16", 8)
    assert E.block_ok("pow2", 64) and not E.block_ok("pow2", 48)
    assert E.block_ok("one_of:16,32,64", 64) and not E.block_ok("one_of:16,32,64", 128)


def test_flashinfer_collapses_per_head_scales_with_a_warning_and_pads_head_dims():
    r = E.rules_for("vllm", "flashinfer")
    assert E.check_kv(r, "fp8_e4m3", per_head=True)[0].startswith("layout: vllm (flashinfer) collapses")
    assert E.check_kv(E.rules_for("vllm"), "fp8_e4m3", per_head=True) == []  # FlashAttention: per head
    assert E.padded_head_dim(r, 80) == 128 and E.padded_head_dim(r, 64) == 64
    assert E.padded_head_dim(E.rules_for("vllm"), 80) == 80
    with pytest.raises(RecipeError, match="head_dim_pad 96"):
        E.padded_head_dim(r, 80, 96)


@pytest.mark.parametrize("args,message", [
    (("--layout", "vllm", "--kv-block-size", "8"), "must be a multiple of 16"),
    (("--layout", "trtllm", "--kv-block-size", "48"), "must be a power of two"),
    (("--layout", "vllm", "--set", "layout.backend=flashinfer", "--kv-block-size", "128"), "one of 16,32,64"),
    (("--layout", "trtllm", "--kv-layout", "NHD"), "KV layout NHD is not what trtllm"),
    (("--layout", "vllm", "--set", "layout.rope=interleaved"), "RoPE layout interleaved"),
    (("--layout", "trtllm", "--kv-cache", "fp8", "--kv-per-head"), "reads one KV scale per layer"),
    (("--layout", "sglang", "--kv-cache", "fp8", "--kv-per-head"), "reads one KV scale per layer"),
    (("--layout", "vllm", "--kv-cache", "fp8", "--set", "layout.kv_dtype=nvfp4"), "nvfp4 is not supported"),
    (("--layout", "trtllm", "--set", "layout.kv_dtype=nvfp4"), "needs calibrated KV scales"),
    (("--layout", "vllm", "--kv-cache", "fp8", "--set", "layout.kv_dtype=bf16"), "contradicts --kv-cache"),
    (("--layout", "vllm", "--set", "layout.backend=xformers"), "not a vllm attention backend"),
    (("--layout", "trtllm", "--set", "select.fuse_groups=false"), "fuse_groups"),
])
def test_invalid_combinations_fail_before_anything_runs(run_cli, args, message):
    res = run_cli("plan", *DEMO_ARGS, *args)
    assert res.code == 1, res.err
    assert message in res.err and "\nhint: " in res.err


def test_plan_schedules_layout_right_after_select(run_cli):
    names = [p["name"] for p in run_cli("plan", *DEMO_ARGS, "--layout", "trtllm", "--tp", "2").json()["passes"]]
    assert names[:3] == ["load", "select", "layout"]
    assert "layout" not in [p["name"] for p in run_cli("plan", *DEMO_ARGS).json()["passes"]]
    cfg = run_cli("plan", *DEMO_ARGS, "--set", "layout.fuse_qkv=true").json()["passes"][2]
    assert cfg["name"] == "layout" and cfg["config"]["fuse_qkv"] is True and cfg["config"]["target"] == "vllm"


def test_incompatible_tp_exits_1_with_a_hint(run_cli, tmp_path, sources):
    res = run_cli("quantize", sources["demo"], "-o", tmp_path / "out", *DEMO_ARGS, "--layout", "vllm",
                  "--tp", "3", "-q")
    assert res.code == 1
    assert "--tp 3 does not divide the 4 query heads" in res.err and "hint: choose a TP size" in res.err
    assert not (tmp_path / "out").exists()
