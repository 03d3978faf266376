"""The hardware table, the config space and its pruning, the cost model and the ranking (no GPU)."""

from __future__ import annotations

import math

import pytest

from tfcompile.errors import RecipeError
from tfcompile.tune.cost import estimate
from tfcompile.tune.hardware import FACTS, MODEL, TARGETS, get_target, parse_targets
from tfcompile.tune.search import canonical, rank
from tfcompile.tune.shapes import Problem, bucket_for, layer_shapes
from tfcompile.tune.space import fit, shape_ok, space


def test_hardware_table_has_a_source_for_every_number():
    for target, quantity, value, unit, source in FACTS:
        assert target in TARGETS and quantity and unit and len(source) > 10, (target, quantity)
    h100, b200 = get_target("sm_90a"), get_target("sm_100a")
    assert (h100.sms, b200.sms) == (132, 148)
    assert h100.smem_per_block == b200.smem_per_block == 227 * 1024  # opt-in per block; 228 KB per SM
    assert h100.regs_per_sm == 65536 and h100.regs_per_thread == 255
    assert (b200.tmem_lanes, b200.tmem_cols, h100.tmem_cols) == (128, 512, 0)
    assert h100.peak_tflops == {"bf16": 989.4, "fp8": 1978.9, "fp4": 0.0} and h100.hbm_tbps == 3.35
    assert b200.peak_tflops == {"bf16": 2250.0, "fp8": 4500.0, "fp4": 9000.0} and b200.hbm_tbps == 8.0


def test_targets_are_validated():
    assert parse_targets("sm_90a, sm_100a,sm_90a") == ("sm_90a", "sm_100a")
    with pytest.raises(RecipeError, match="unknown target 'sm_80'"):
        parse_targets("sm_80")
    with pytest.raises(RecipeError, match="no target"):
        parse_targets("")


def test_buckets_and_shapes():
    assert [bucket_for(m, (1, 16, 64)) for m in (1, 2, 16, 17, 64, 5000)] == [1, 16, 16, 64, 64, 64]
    layers = [{"format": "nvfp4", "shape": [256, 768]}, {"format": "nvfp4", "shape": [256, 768]},
              {"format": "nvfp4", "shape": [768, 256]}]
    assert layer_shapes(layers) == {"nvfp4": [(256, 768), (768, 256)]}
    p = Problem("sm_90a", "fp8_gemm_tensor", 256, 768, 16)
    assert p.stem == "kernels/sm_90a/fp8_gemm_tensor_256x768_m16"
    assert Problem("sm_100a", "act_quant_nvfp4", 0, 768, 1).stem == "kernels/sm_100a/act_quant_nvfp4_k768_m1"


def test_pruning_by_shape_and_hardware(standin_kernels):
    from tfcompile.kernels.triton.registry import KERNELS

    kd = KERNELS["standin_bf16_gemm"]
    configs = space(kd)
    assert len(configs) == len({canonical(c) for c in configs}) > 1000
    small = Problem("sm_90a", kd.name, 256, 4096, 1)
    cfg = {"BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 64, "num_warps": 4, "num_stages": 3, "SPLIT_K": 1}
    assert shape_ok(kd, small, cfg)
    assert not shape_ok(kd, small, dict(cfg, BLOCK_M=256))  # 256 rows for one token
    assert not shape_ok(kd, small, dict(cfg, BLOCK_M=32))  # below the MMA's 64 rows (no SWAP_AB knob)
    assert not shape_ok(kd, Problem("sm_90a", kd.name, 256, 4096, 1024), dict(cfg, SPLIT_K=4))  # large M
    assert not shape_ok(kd, small, dict(cfg, SPLIT_K=16, BLOCK_K=512))  # 16 * 512 does not divide 4096
    h100, b200 = get_target("sm_90a"), get_target("sm_100a")
    big = dict(cfg, BLOCK_M=256, BLOCK_N=256, BLOCK_K=256, num_stages=5)
    assert fit(kd, big, h100).reason == "smem"  # 5 * 512 * 256 * 2 bytes > 227 KB
    regs = dict(cfg, BLOCK_M=256, BLOCK_N=256, BLOCK_K=32, num_stages=2)
    assert fit(kd, regs, h100).reason == "registers"  # 65536 fp32 accumulators / 128 threads
    tmem = dict(cfg, BLOCK_M=256, BLOCK_N=512, BLOCK_K=16, num_warps=32, num_stages=2)
    assert fit(kd, dict(tmem, num_warps=64), b200).reason == "threads"  # 2048 threads > 1024
    assert fit(kd, tmem, b200).reason == "tmem"  # 2 x 512 accumulator columns > 512
    ok = fit(kd, cfg, h100)
    assert ok.ok and ok.ctas_per_sm == 4  # smem: 228 KB // (3 stages x 16 KB + 1 KB reserved)


def test_cost_model_roofline_and_wave_quantization(standin_kernels):
    from tfcompile.kernels.triton.registry import KERNELS

    kd = KERNELS["standin_fp8_gemm"]  # an fp8-MMA GEMM
    spec = get_target("sm_90a")
    cfg = {"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 128, "num_warps": 8, "num_stages": 4, "SPLIT_K": 1}
    n = k = m = 8192
    e = estimate(kd, Problem("sm_90a", kd.name, n, k, m), cfg, spec, fit(kd, cfg, spec))
    ideal = 2 * m * n * k / (spec.peak_tflops["fp8"] * 1e12 * MODEL["mma_efficiency"]) * 1e6
    assert e.bound == "compute" and e.tiles == 64 * 64
    assert ideal <= e.us <= ideal * 1.1  # 4096 tiles on 132 SMs: 32 rounds, 31.03 needed
    # one tile more than the SMs costs a whole extra round of tiles
    def us(tiles_n):
        p = Problem("sm_90a", kd.name, 128 * tiles_n, 8192, 128)
        return estimate(kd, p, cfg, spec, fit(kd, cfg, spec)).compute_us
    assert us(133) == pytest.approx(2 * us(132))
    assert us(132) == pytest.approx(us(100))


def test_split_k_wins_for_decode_with_long_k(standin_kernels):
    from tfcompile.kernels.triton.registry import KERNELS

    kd = KERNELS["standin_bf16_gemm"]
    c = rank(kd, Problem("sm_90a", kd.name, 512, 16384, 1))
    assert c.best.config["SPLIT_K"] > 1  # 512 x 16384 weights: 8-16 column tiles leave SMs idle
    assert c.best.est.bound == "memory"
    big = rank(kd, Problem("sm_90a", kd.name, 4096, 4096, 4096))
    assert big.best.config["SPLIT_K"] == 1 and big.best.config["BLOCK_M"] >= 128


def test_ranking_is_deterministic_and_keeps_runner_ups(standin_kernels):
    from tfcompile.kernels.triton.registry import KERNELS

    kd = KERNELS["standin_bf16_gemm"]
    p = Problem("sm_100a", kd.name, 768, 256, 64)
    a, b = rank(kd, p), rank(kd, p)
    assert [canonical(r.config) for r in a.ranked] == [canonical(r.config) for r in b.ranked]
    assert len(a.ranked) == 4 and a.feasible <= a.candidates
    assert all(x.est.us <= y.est.us for x, y in zip(a.ranked, a.ranked[1:]))
    assert sum(a.pruned.values()) + a.feasible == a.candidates
    assert all(math.isfinite(r.est.us) and r.est.us > 0 for r in a.ranked)


def test_cost_model_charges_shallow_pipelines_and_small_tiles(standin_kernels):
    from tfcompile.kernels.triton.registry import KERNELS

    kd = KERNELS["standin_fp8_gemm"]
    spec = get_target("sm_90a")
    p = Problem("sm_90a", kd.name, 8192, 8192, 8192)

    def us(**over):
        cfg = dict({"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 128, "num_warps": 8, "num_stages": 4,
                    "SPLIT_K": 1}, **over)
        return estimate(kd, p, cfg, spec, fit(kd, cfg, spec)).compute_us

    assert us(num_stages=2) > 1.3 * us(num_stages=4)  # one stage in flight per block cannot cover DRAM latency
    assert us(BLOCK_M=64, BLOCK_N=32) > 1.3 * us()  # 64x32 tiles: too few flops per shared-memory byte
