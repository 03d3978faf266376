"""`tfcompile plan --estimate`: the output size is exact (the real select/quantize passes plan it
from config.json alone), and the resource model answers for DeepSeek-V3 671B on 1 and 4 nodes
of 8 H200 (docs/distributed.md "Resource plan")."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tfcompile.errors import RecipeError
from tfcompile.estimate.plan import estimate, parse_devices
from tfcompile.recipe.build import build_recipe

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = ROOT / "examples" / "configs"


@pytest.mark.parametrize("fmt", ["nvfp4a16", "fp8-block", "mxfp4"])
def test_output_size_is_the_artifacts_to_the_byte(fmt, model_factory, tmp_path, run_cli):
    """Estimated from a directory holding only config.json, against the artifact quantized from
    the weights (the manifest's bytes_out: every tensor of the compressed-tensors view)."""
    src = model_factory.make_tiny_qwen3_moe(tmp_path / "moe")
    res = run_cli("quantize", src, "-o", tmp_path / "out", "--format", fmt, "--json")
    assert res.code == 0, res.err
    only_config = tmp_path / "config-only"
    only_config.mkdir()
    (only_config / "config.json").write_bytes((src / "config.json").read_bytes())
    doc = estimate(only_config, build_recipe(fmt=fmt))
    assert doc["output_bytes"] == res.json()["summary"]["bytes_out"]
    assert doc["model"]["quantized_linears"] == res.json()["summary"]["quantized_linears"]


DSV3 = ["--calib-samples", "512", "--calib-seq-len", "2048", "--estimate", "--devices", "8xH200", "--json"]


def test_deepseek_v3_on_one_and_four_nodes_of_eight_h200(run_cli):
    one, four = (run_cli("plan", CONFIGS / "deepseek-v3", "--format", "nvfp4", *DSV3, "--nodes", str(n))
                 for n in (1, 4))
    assert one.code == 0 and four.code == 0, one.err + four.err
    a, b = one.json(), four.json()
    assert a["model"]["params"] == 671_026_419_200  # transformers' DeepseekV3Config() (without MTP)
    assert a["model"]["layers"] == 61 and a["cluster"]["ranks"] == 8 and b["cluster"]["ranks"] == 32
    assert a["output_gb"] == b["output_gb"] and 370 < a["output_gb"] < 390  # ~4.5 bits per weight
    for doc in (a, b):  # one layer (an MoE layer: 22.5 GB bf16) + activations fits an H200
        assert 22.5 < doc["memory"]["device_gb_per_rank"] < 60 and doc["memory"]["fits"]["device"]
        assert set(doc["passes"]) == {"calibrate", "pack"}
    # W4A4 RTN searches its scales by output error (quantize.scale_search=output, the default): the
    # spill holds each group's 16 x 16 diagonal blocks of H, K x 16 floats (passes/quantize/output_scales.py):
    # 58 MoE layers x 256 experts x (7168 + 2048) x 16 x 4 B = 8.8 GB (the whole H would be 56.9 GB
    # a layer), over 8 or 32 ranks, plus the attention and dense groups' blocks
    spill = [doc["disk"]["hessian_spill_gb_per_rank"] for doc in (a, b)]
    assert 8.8 / 8 < spill[0] < 1.3 and 8.8 / 32 < spill[1] < 0.33, spill
    assert b["passes"]["pack"]["seconds"] < a["passes"]["pack"]["seconds"]  # 4x the disks and cores
    assert b["passes"]["calibrate"]["batches_per_rank"] * 4 == a["passes"]["calibrate"]["batches_per_rank"]


def test_deepseek_v3_gptq_fits_one_node_of_eight_h200(run_cli):
    """Each routed expert has its own Hessians (gate/up: K = 7168, down: K = 2048; fp32): 256 x
    (7168^2 + 2048^2) x 4 B = 56.9 GB for one MoE layer. They are owned per solve batch of
    quantize.gptq_expert_batch (8) experts, spread over the ranks by LPT, and an expert's routed
    rows (not its K x K partial) go to the owner: so a rank holds the layer (22.5 GB), its share
    of the expert Hessians (about 1/8 of 56.9 GB) and a round's rows, not all of them. With
    calibrate.propagate each layer is solved in the layer loop and the spill holds the solved
    codes, not the Hessians; without (the default) it holds every Hessian and pack solves."""
    one, four = (run_cli("plan", CONFIGS / "deepseek-v3", "--format", "nvfp4a16", "--algorithm", "gptq", *DSV3,
                         "--nodes", str(n), "--set", "calibrate.propagate=true").json() for n in (1, 4))
    expert_h = 256 * 4 * (7168 ** 2 + 2048 ** 2) / 1e9  # one MoE layer's expert Hessians, GB
    for doc in (one, four):
        ranks = doc["cluster"]["ranks"]
        assert 22.5 + expert_h / ranks < doc["memory"]["device_gb_per_rank"] < 22.5 + 2.5 * expert_h / ranks + 15
        assert doc["memory"]["fits"]["device"]
        # the spill: this rank's solved codes (FP4, half a byte per weight; nearly all weights are experts')
        spill, codes = doc["disk"]["hessian_spill_gb_per_rank"], 0.5 * doc["model"]["params"] / 1e9 / ranks
        assert doc["disk"]["spill_holds"] == "solved codes" and 0.8 * codes < spill < 1.2 * codes
        assert doc["passes"]["pack"]["gptq_solve_s"] == 0 < doc["passes"]["calibrate"]["gptq_solve_s"]
    assert one["memory"]["device_gb_per_rank"] > four["memory"]["device_gb_per_rank"]  # 1/32 of the experts
    assert four["passes"]["calibrate"]["gptq_solve_s"] < one["passes"]["calibrate"]["gptq_solve_s"]  # 4x the owners
    # without propagation: 58 MoE layers' expert Hessians (and the dense ones) over the ranks, LPT-balanced
    noprop = run_cli("plan", CONFIGS / "deepseek-v3", "--format", "nvfp4a16", "--algorithm", "gptq", *DSV3).json()
    spill = noprop["disk"]["hessian_spill_gb_per_rank"]
    assert noprop["disk"]["spill_holds"] == "hessians" and 58 * expert_h / 8 < spill < 1.3 * 61 * expert_h / 8
    assert noprop["passes"]["pack"]["gptq_solve_s"] > 0 and "gptq_solve_s" not in noprop["passes"]["calibrate"]
    # one process holds all of a layer's expert Hessians (and every batch's activations)
    solo = run_cli("plan", CONFIGS / "deepseek-v3", "--format", "nvfp4a16", "--algorithm", "gptq", *DSV3[:-3],
                   "--devices", "1xH200", "--json").json()
    assert solo["memory"]["device_gb_per_rank"] > 22.5 + expert_h


def test_table_on_stderr_and_errors(run_cli, tmp_path):
    res = run_cli("plan", CONFIGS / "llama-3.1-8b", "--format", "nvfp4", "--estimate", "--devices", "8xH100")
    assert res.code == 0 and res.out == "" and "8.0B params" in res.err and "device" in res.err
    assert run_cli("plan", "--format", "nvfp4", "--estimate").code == 2  # MODEL is needed
    res = run_cli("plan", tmp_path, "--format", "nvfp4", "--estimate")
    assert res.code == 1 and "config.json" in res.err
    with pytest.raises(RecipeError, match="--devices"):
        parse_devices("8xA100", 1)
    assert parse_devices("2xcpu", 1).ranks == 2 and parse_devices("H200", 4).ranks == 4


def test_more_calibration_tokens_need_more_device_memory_and_time():
    small, large = (estimate(CONFIGS / "llama-3.1-8b", build_recipe(fmt="nvfp4", overrides={
        "calibrate": {"samples": n, "seq_len": 2048}}), "8xH100") for n in (64, 1024))
    assert large["memory"]["device_gb_per_rank"] > small["memory"]["device_gb_per_rank"]
    assert large["passes"]["calibrate"]["seconds"] > small["passes"]["calibrate"]["seconds"]
    assert json.dumps(large)  # JSON-ready


def test_scale_search_is_costed_in_pack_by_its_scored_roundings():
    """W4A4 NVFP4 RTN searches its scales by output error by default (passes/quantize/quantize.py):
    pack scores every quantized weight under each global candidate on one thread, which on a 1.1B
    Llama took 486.5 s of a 495 s run (docs/performance.md). The plan counts it: NVFP4 each global
    candidate the search tries, MXFP4 one rounding, none without the search."""
    import math

    import torch

    from tfcompile.passes.quantize import output_scales
    from tfcompile.estimate.throughputs import ASSUMED, this_machine

    model = CONFIGS / "llama-3.1-8b"
    w4a4 = estimate(model, build_recipe(fmt="nvfp4"))
    none = estimate(model, build_recipe(fmt="nvfp4", overrides={"quantize": {"scale_search": "none"}}))
    mx = estimate(model, build_recipe(fmt="mxfp4", overrides={"quantize": {"scale_search": "output"}}))
    assert "scale_search_s" not in none["passes"]["pack"]
    assert "scale_search_s" not in estimate(model, build_recipe(fmt="nvfp4a16"))["passes"]["pack"]
    pack = w4a4["passes"]["pack"]
    assert pack["seconds"] == pytest.approx(pack["stream_s"] + pack["scale_search_s"], abs=0.02)
    # the global candidates of a g that bf16 does not represent: the count the search runs through
    tried = len(output_scales.global_candidates(torch.tensor([2688 / 3.7])))
    weights = sum(math.prod(t) for t in _linear_shapes(model))
    # the candidates spread over this machine's cores (`cpu`: its cores, one rank), MXFP4's one on one
    threads = min(this_machine()["cpu_cores"], tried)
    speed = threads * ASSUMED["search_thread_efficiency"] if threads > 1 else 1.0
    one = weights * this_machine()["scale_search_ns"] * 1e-9
    assert pack["scale_search_s"] == pytest.approx(tried * one / speed, rel=1e-3)
    assert mx["passes"]["pack"]["scale_search_s"] == pytest.approx(one, rel=1e-3)
    assert w4a4["total_s"] > none["total_s"] + pack["scale_search_s"] * 0.99


def _linear_shapes(model: Path) -> list[tuple[int, int]]:
    """(N, K) of every decoder Linear of a Llama config (q, k, v, o, gate, up, down per layer)."""
    c = json.loads((model / "config.json").read_text())
    h, i, heads = c["hidden_size"], c["intermediate_size"], c["num_attention_heads"]
    kv = c.get("num_key_value_heads", heads) * c.get("head_dim", h // heads)
    return [(h, h), (kv, h), (kv, h), (h, h), (i, h), (i, h), (h, i)] * c["num_hidden_layers"]
