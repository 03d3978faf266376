"""Ahead-of-time compilation without a GPU, through the product's one compile path
(tfcompile/tune/compile.py `compile_kernel`, what `quantize --target` emits with): every
kernel compiles for its targets from the registry's signature/constexprs, and the GEMMs
lower to the tensor-core instructions they are written for: wgmma on sm_90a, tcgen05 on
sm_100a, `block_scale` MMAs for dot_scaled. Also checks the registry's shared-memory
estimate never undercuts the compiler's (the tuner prunes with it). Nothing is cached in
the repository (Triton's cache lives in ~/.triton or TRITON_CACHE_DIR)."""

from __future__ import annotations

import re

import pytest

from tfcompile.kernels.triton import KERNELS
from tfcompile.kernels.triton.w4a16_gemm import DECODE_CONFIG
from tfcompile.tune.compile import compile_kernel as _compile
from tfcompile.tune.hardware import get_target

N, K = 4096, 4096  # a typical projection; constexpr values do not change the instruction choice
_MMA = re.compile(r"\b(wgmma\.mma_async\S*|tcgen05\.mma\S*|mma\.sync\S*)")


def mma_instructions(ptx: str) -> set[str]:
    """The distinct tensor-core MMA opcodes in a PTX listing, e.g.
    {"wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3"}."""
    return set(_MMA.findall(ptx))


def compile_kernel(name: str, target: str, n: int, k: int, config: dict | None = None):
    """Registered kernel `name` for `target`, its default config overlaid with `config`."""
    kd = KERNELS[name]
    assert target in kd.targets, f"{name} is not meant for {target}"
    return _compile(kd, n, k, {**kd.default_config, **(config or {})}, get_target(target).capability)

# (kernel, target, config overrides, substrings one MMA opcode must all contain)
GEMM_CASES = [
    ("fp8_gemm_tensor", "sm_90a", {}, ("wgmma.mma_async", "e4m3.e4m3")),
    ("fp8_gemm_channel", "sm_90a", {}, ("wgmma.mma_async", "e4m3.e4m3")),
    ("fp8_gemm_block", "sm_90a", {}, ("wgmma.mma_async", "e4m3.e4m3")),
    ("fp8_gemm_channel", "sm_100a", {}, ("tcgen05.mma", "kind::f8f6f4")),
    ("fp8_gemm_block", "sm_100a", {}, ("tcgen05.mma", "kind::f8f6f4")),
    ("fp4_gemm_mxfp4", "sm_100a", {}, ("tcgen05.mma", "block_scale", "kind::mxf4")),
    ("fp4_gemm_nvfp4", "sm_100a", {}, ("tcgen05.mma", "block_scale", "kind::mxf4nvf4", "block16")),
    ("mxfp8_gemm", "sm_100a", {}, ("tcgen05.mma", "block_scale", "kind::mxf8f6f4")),
    ("w4a16_gemm_nvfp4", "sm_90a", {}, ("wgmma.mma_async", "bf16.bf16")),
    ("w4a16_gemm_nvfp4", "sm_90a", DECODE_CONFIG, ("wgmma.mma_async", "m64n16k16", "bf16.bf16")),
    ("w4a16_gemm_mxfp4", "sm_90a", {}, ("wgmma.mma_async", "bf16.bf16")),
    ("w4a16_gemm_nvfp4", "sm_100a", DECODE_CONFIG, ("tcgen05.mma", "kind::f16")),
]


@pytest.mark.parametrize("name,target,cfg,want", GEMM_CASES,
                         ids=[f"{c[0]}-{c[1]}{'-decode' if c[2] else ''}" for c in GEMM_CASES])
def test_gemm_lowers_to_tensor_cores(name, target, cfg, want):
    ck = compile_kernel(name, target, N, K, cfg)
    ptx = ck.ptx
    assert f".target {target}" in ptx
    ops = mma_instructions(ptx)
    assert any(all(w in op for w in want) for op in ops), f"no MMA with {want}; found {sorted(ops)}"
    if "block_scale" in want:  # dot_scaled must not fall back to an upcast-and-multiply emulation
        assert all("block_scale" in op for op in ops), sorted(ops)
    assert "cp.async.bulk.tensor" in ptx  # operand tiles come through TMA descriptors
    assert ck.cubin
    kd = KERNELS[name]
    assert kd.smem_bytes({**kd.default_config, **cfg}) >= ck.metadata["shared"]


NON_GEMM = ["act_quant_fp8_group", "act_quant_fp8_static", "act_quant_fp8_token", "act_quant_mxfp4",
            "act_quant_mxfp8", "act_quant_nvfp4", "splitk_reduce"]


def test_non_gemm_list_is_complete():
    ours = {n for n, kd in KERNELS.items() if kd.fn.fn.__module__.startswith("tfcompile.kernels.triton")}
    assert {n for n in ours if KERNELS[n].kind != "gemm"} == set(NON_GEMM)
    assert {c[0] for c in GEMM_CASES} == {n for n in ours if KERNELS[n].kind == "gemm"}


@pytest.mark.parametrize("name", NON_GEMM)
def test_non_gemm_kernels_compile(name):
    """Act-quant and split-K reduce kernels: the interpreter accepts code that
    the compiler rejects, so compile each once for its first target."""
    kd = KERNELS[name]
    ck = compile_kernel(name, kd.targets[0], N, K)
    assert ck.cubin and not mma_instructions(ck.ptx)
