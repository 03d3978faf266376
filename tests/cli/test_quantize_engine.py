"""`quantize --engine`: what the named engine cannot serve is refused before the artifact is published;
without it the default engines (vllm, sglang) are asked and only warn.

The rules are tfcompile/artifact/engines.py's (the ones `verify --engine` applies, read from vLLM
0.32's code; tests/engines checks them against vLLM itself where it is installed). Here the oracle
for "refuses" is vLLM's own message text and the module names from the checkpoint.
"""

from __future__ import annotations

import torch
from tests_helpers import tensors


def test_default_engines_warn_about_fp8_block_kv_rows_of_64(tiny_llama_src, tmp_path, run_cli):
    r = run_cli("quantize", tiny_llama_src, "-o", tmp_path / "out", "--format", "fp8-block", "--json")
    assert r.code == 0 and (tmp_path / "out" / "config.json").exists()
    doc = r.json()
    assert doc["passes"]["verify"]["engines"] == {"vllm": "refuses", "sglang": "refuses"}
    (w,) = [w for w in doc["warnings"] if w.startswith("engine vllm cannot load")]
    assert "k_proj: Weight output_partition_size = 64 is not divisible by weight quantization block_n = 128" in w
    assert "quantize --engine vllm refuses" in w and "\nhint: " in w and "fp8-dynamic" in w
    assert "engine vllm cannot load" in r.err


def test_engine_vllm_refuses_to_write_what_vllm_cannot_load(tiny_llama_src, tmp_path, run_cli):
    out = tmp_path / "out"
    r = run_cli("quantize", tiny_llama_src, "-o", out, "--format", "fp8-block", "--engine", "vllm")
    assert r.code == 1 and not out.exists()  # atomic: nothing published
    assert "--engine vllm: vllm refuses fp8-block at --tp 1" in r.err and "block_n = 128" in r.err
    assert "hint: " in r.err and "--format fp8-dynamic" in r.err and "drop --engine vllm" in r.err
    r = run_cli("quantize", tiny_llama_src, "-o", out, "--format", "fp8-block", "--engine", "trtllm", "--json")
    assert r.code == 0 and r.json()["passes"]["verify"]["engines"] == {"trtllm": "serves it as written"}


def test_engine_tp_from_the_recipe(tiny_llama_src, tmp_path, run_cli):
    """The TP size the engine splits by: hidden 128 at tp 2 leaves o_proj 64 input columns per rank."""
    r = run_cli("quantize", tiny_llama_src, "-o", tmp_path / "o", "--format", "fp8-block", "--engine", "vllm",
                "--set", "verify.engine_tp=2")
    assert r.code == 1 and "at --tp 2" in r.err and "input_size_per_partition = 64" in r.err


def test_engine_checks_change_no_byte(tiny_llama_src, tmp_path, run_cli):
    a, b = tmp_path / "a", tmp_path / "b"
    assert run_cli("quantize", tiny_llama_src, "-o", a, "--format", "fp8-dynamic", "-q").code == 0
    assert run_cli("quantize", tiny_llama_src, "-o", b, "--format", "fp8-dynamic", "-q", "--engine", "vllm").code == 0
    for f in sorted(p.relative_to(a) for p in a.rglob("*") if p.is_file()):
        assert (a / f).read_bytes() == (b / f).read_bytes(), f


def test_modules_vllm_builds_unquantized_are_refused_when_included(family_factory, tmp_path, run_cli):
    """DeepSeek-V3.2's indexer wk / weights_proj (vLLM `Indexer.wk_weights_proj`, quant_config=None) and
    the MTP eh_proj / shared_head.head (nn.Linear / ParallelLMHead) quantized with select.include."""
    fam = family_factory
    src = fam.make_tiny_deepseek_v32(tmp_path / "v32")
    r = run_cli("quantize", src, "-o", tmp_path / "a", "--format", "nvfp4a16", "--engine", "vllm",
                "--set", 'select.include=["dsa_indexer"]')
    assert r.code == 1 and "model.layers.0.self_attn.indexer.weights_proj" in r.err
    assert "without a quantization config" in r.err and "dsa_indexer" in r.err
    mtp = fam.add_mtp_layer(fam.make_tiny_deepseek_v3(tmp_path / "v3"))
    r = run_cli("quantize", mtp, "-o", tmp_path / "b", "--format", "nvfp4a16", "--json",
                "--set", 'select.include=["mtp_head"]')
    assert r.code == 0 and r.json()["passes"]["verify"]["engines"]["vllm"] == "refuses"
    assert "model.layers.4.eh_proj.weight_packed" in tensors(tmp_path / "b")  # what vLLM cannot load
    assert any("model.layers.4.eh_proj" in w for w in r.json()["warnings"])


def test_replicated_mla_projections_are_not_split_by_tp():
    """vLLM deepseek_v2.py builds q_a_proj + kv_a_proj_with_mqa as one `DeepSeekV2FusedQkvAProjLinear`
    with disable_tp=True: DeepSeek-V3's 1536 + 576 rows stay whole at TP 8 (its published FP8 blocks
    serve there). The same rows as a column-parallel q/k/v split into 192 / 72 and are refused."""
    from tfcompile.artifact.engines import engine_problems

    def doc(a: str, b: str) -> dict:
        layers = [{"module": f"model.layers.0.self_attn.{a}", "shape": [1536, 7168]},
                  {"module": f"model.layers.0.self_attn.{b}", "shape": [576, 7168]}]
        return {"scheme": {"name": "fp8-block", "kv_cache": None}, "family": "deepseek_v3", "layers": layers,
                "groups": [[x["module"] for x in layers]]}

    assert not engine_problems(doc("q_a_proj", "kv_a_proj_with_mqa"), "vllm", tp=8)
    (p,) = engine_problems(doc("q_proj", "k_proj"), "vllm", tp=8)
    assert p.error and "output_partition_size = 192" in p.message and "output_partition_size = 72" in p.message


def test_unfused_nvfp4_groups_warn_that_the_engine_serves_the_largest_global_scale(tiny_llama_src, tmp_path,
                                                                                    run_cli):
    """vLLM loads q/k/v as one qkv_proj and gate/up as one gate_up_proj with one NVFP4 global scale
    (the largest, with a warning): written apart (select.fuse_groups=false), they are served coarser."""
    out = tmp_path / "apart"
    r = run_cli("quantize", tiny_llama_src, "-o", out, "--format", "nvfp4a16", "--json",
                "--set", "select.fuse_groups=false")
    assert r.code == 0 and r.json()["passes"]["verify"]["engines"]["vllm"] == "warns"
    t = tensors(out)
    p = "model.layers.0.self_attn"
    assert not torch.equal(t[f"{p}.q_proj.weight_global_scale"], t[f"{p}.k_proj.weight_global_scale"])  # the oracle
    (w,) = [w for w in r.json()["warnings"] if w.startswith("engine vllm serves")]
    mlp = "model.layers.0.mlp"  # 2 layers x (q/k/v, gate/up)
    assert f"{mlp}.gate_proj + {mlp}.up_proj into one layer" in w and "(and 3 more fused layers)" in w
    assert "largest" in w and "fuse_groups" in w
    r = run_cli("quantize", tiny_llama_src, "-o", tmp_path / "fused", "--format", "nvfp4a16", "--json")
    assert r.json()["passes"]["verify"]["engines"]["vllm"] == "serves it as written"
