"""`tfcompile verify --engine`: the engines' own constraints (tfcompile/artifact/engines.py; the rules
are checked against vLLM itself in tests/engines, slow job)."""

from __future__ import annotations

import json

from tfcompile.artifact.engines import engine_problems


def _doc(layers, groups=(), fmt="fp8-block", kv=None):
    return {"scheme": {"name": fmt, "kv_cache": kv}, "groups": [list(g) for g in groups],
            "layers": [{"module": m, "shape": list(s), "format": fmt} for m, s in layers]}


QKV = [("model.layers.0.self_attn.q_proj", (576, 576)), ("model.layers.0.self_attn.k_proj", (192, 576)),
       ("model.layers.0.self_attn.v_proj", (192, 576)), ("model.layers.0.self_attn.o_proj", (576, 576))]
QKV_GROUP = [m for m, _ in QKV[:3]]  # one NVFP4 global scale, as select writes q/k/v


def test_fused_members_but_the_last_must_divide_the_block_as_vllm_validates():
    doc = _doc(QKV, [[m for m, _ in QKV[:3]]])
    (p,) = engine_problems(doc, "vllm")
    assert p.error and "q_proj: Weight output_partition_size = 576 is not divisible by weight quantization " \
                       "block_n = 128" in p.message
    assert "v_proj" not in p.message and "o_proj" not in p.message  # merged: last may be partial; unfused: free
    assert "--format fp8-dynamic" in p.hint


def test_tensor_parallel_splits_rows_and_columns():
    layers = [("m.layers.0.self_attn.q_proj", (1024, 512)), ("m.layers.0.self_attn.k_proj", (256, 512)),
              ("m.layers.0.self_attn.v_proj", (256, 512)), ("m.layers.0.self_attn.o_proj", (512, 640)),
              ("m.layers.0.mlp.experts.3.gate_proj", (320, 512)), ("m.layers.0.mlp.experts.3.down_proj", (512, 320))]
    doc = _doc(layers, [[m for m, _ in layers[:3]]])
    assert [p.message for p in engine_problems(doc, "vllm", tp=1) if p.error] == [
        "vllm refuses fp8-block at --tp 1: m.layers.0.mlp.experts.3.down_proj: Weight expert intermediate size "
        "per partition = 320 is not divisible by weight quantization block_n = 128; "
        "m.layers.0.mlp.experts.3.gate_proj: Weight expert intermediate size per partition = 320 is not divisible "
        "by weight quantization block_n = 128"]
    msg = engine_problems(doc, "vllm", tp=2)[0].message
    assert "k_proj: Weight output_partition_size = 128" not in msg  # 256 / 2 divides
    assert "o_proj: Weight input_size_per_partition = 320" in msg and "experts.3.gate_proj" in msg
    assert not engine_problems(doc, "trtllm", tp=2)


def test_kv_cache_nvfp4_is_refused_by_vllm_and_sglang_not_trtllm():
    doc = _doc(QKV, [QKV_GROUP], fmt="nvfp4", kv={"dtype": "nvfp4", "strategy": "tensor"})
    assert all(p.error for e in ("vllm", "sglang") for p in engine_problems(doc, e))
    assert not [p for p in engine_problems(doc, "trtllm") if p.error]


def test_targets_and_weight_only_mxfp4_are_warnings():
    assert [p.error for p in engine_problems(_doc(QKV, fmt="mxfp4a16"), "vllm")] == [False]
    assert [p.error for p in engine_problems(_doc(QKV, [QKV_GROUP], fmt="nvfp4"), "vllm", target="sm_90a")] == [False]
    assert not engine_problems(_doc(QKV, [QKV_GROUP], fmt="nvfp4"), "vllm", target="sm_100a")


def test_cli_verify_engine_refuses_fp8_block_kv_rows_of_64(tiny_llama_src, tmp_path, run_cli):
    out = tmp_path / "fp8-block"
    assert run_cli("quantize", tiny_llama_src, "-o", out, "--format", "fp8-block", "-q").code == 0
    assert run_cli("verify", out).code == 0  # the artifact is sound; the engine cannot serve it
    r = run_cli("verify", out, "--engine", "vllm", "--json")
    assert r.code == 1
    (check,) = [c for c in r.json()["checks"] if c["check"].startswith("engine vllm")]
    assert not check["ok"] and "k_proj: Weight output_partition_size = 64 is not divisible" in check["detail"]
    assert "\nhint: " in check["detail"]
    r = run_cli("verify", out, "--engine", "trtllm", "--json")
    assert r.code == 0, r.out


def test_cli_verify_engine_refuses_the_576_wide_smollm2_fp8_block_artifact(tmp_path, run_cli):
    from tfcompile.fixtures.smollm2 import smollm2_checkpoint

    out = tmp_path / "smol"
    assert run_cli("quantize", smollm2_checkpoint(), "-o", out, "--format", "fp8-block", "-q").code == 0
    r = run_cli("verify", out, "--engine", "vllm", "--json")
    assert r.code == 1
    detail = json.dumps(r.json()["checks"])
    assert "Weight output_partition_size = 576 is not divisible by weight quantization block_n = 128" in detail
