"""Ahead-of-time compilation of a registered kernel for one target, without a GPU.

    ck = compile_kernel("fp8_gemm_block", "sm_90a", n=4096, k=7168)
    ck.asm["ptx"], ck.asm["cubin"], ck.metadata  # PTX, cubin, launch metadata

This is what the emit pass needs from the registry, in one place: the
registry's `signature` / `constexprs` for (n, k, config) go into
`triton.compiler.ASTSource`, `num_warps` / `num_stages` / `enable_fp_fusion`
become compile options (`common.compile_options`; fusion is passed explicitly
because Triton 3.10 changes its default), and `triton.compile(...,
target=GPUTarget("cuda", 90 | 100, 32))` returns PTX and cubin (sm_90a /
sm_100a). Launch contract of the result (Triton 3.9): the kernel's parameters
are the signature's non-constexpr arguments in order, then two pointers Triton
appends, `global_scratch` (metadata.global_scratch_size bytes per program:
256 for the GEMMs, which build their TMA descriptors on the device; 0 for the
others) and `profile_scratch`; dynamic shared memory = metadata.shared bytes.

Nothing is cached in the repository; Triton's own cache (~/.triton/cache or
TRITON_CACHE_DIR) applies.
"""

from __future__ import annotations

import re

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from .common import compile_options
from .interpret import as_jit, language
from .registry import KERNELS

TARGETS = {"sm_90a": 90, "sm_100a": 100}


def resolve_config(name: str, config: dict | None = None) -> dict:
    """The kernel's default config overlaid with `config`."""
    return {**KERNELS[name].default_config, **(config or {})}


def compile_kernel(name: str, target: str, n: int, k: int, config: dict | None = None):
    """Compile registered kernel `name` for `target` ("sm_90a" | "sm_100a") and
    the GEMM shape (n, k); returns Triton's CompiledKernel (asm, metadata)."""
    kd = KERNELS[name]
    if target not in kd.targets:
        raise ValueError(f"{name} is not meant for {target} (targets: {kd.targets})")
    cfg = resolve_config(name, config)
    src = ASTSource(as_jit(kd.fn), kd.signature(n, k, cfg), kd.constexprs(n, k, cfg))
    options = compile_options(cfg)
    with language("jit"):  # tl.* library functions as JITFunctions even under TRITON_INTERPRET=1
        return triton.compile(src, target=GPUTarget("cuda", TARGETS[target], 32), options=options)


_MMA = re.compile(r"\b(wgmma\.mma_async\S*|tcgen05\.mma\S*|mma\.sync\S*)")


def mma_instructions(ptx: str) -> set[str]:
    """The distinct tensor-core MMA opcodes in a PTX listing, e.g.
    {"wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3"} or
    {"tcgen05.mma.cta_group::1.kind::mxf4nvf4.block_scale.block16"}."""
    return set(_MMA.findall(ptx))
