"""What emission (passes/emit.py), tuning (tfcompile/tune) and the runtime need to know of a kernel.

A `KernelDef` is registered once per Triton kernel. For one GEMM shape
(M bucket, N, K) and one tuning `config` (a dict of the kernel's knobs, e.g.
{"BLOCK_M": 64, "BLOCK_N": 128, "BLOCK_K": 128, "num_warps": 4,
"num_stages": 3, "SPLIT_K": 1}) it answers:

- `signature(n, k, config)`: Triton's AOT signature, argument name -> type
  string ("*bf16", "*fp8e4nv", "*u8", "*fp32", "i32", "constexpr"), for
  `triton.compiler.ASTSource(fn, signature, constexprs)`;
- `constexprs(n, k, config)`: constexpr argument name -> value (tile sizes,
  N/K when specialised, format switches);
- `grid(m, n, k, config)`: the launch grid (a tuple of 1-3 ints) for M rows;
- `smem_bytes(config)`: the shared memory the config needs (for pruning);
- `flops(m, n, k)` and `bytes_moved(m, n, k)`: for the cost model and the
  TFLOP/s and GB/s the GPU bench reports.

`targets` lists where the kernel can be emitted ("sm_90a", "sm_100a"), and
`formats` which weight formats it serves (tfcompile.schemes names).

Optional (added with the kernels, defaults keep older definitions valid):
`presets` names starting configs (e.g. "decode" for M <= 16, "prefill") for
the tuner to seed its search with; `followup` names a registered kernel to
launch after this one when `config["SPLIT_K"] > 1` (the split-K reduction),
with the same config dict and (m, n, k).

Conventions shared by every kernel (docs/kernels.md): tensors are contiguous
row-major, GEMMs are TN (A [M, K], B [N, K]); `M` is the only runtime size,
N and K are constexprs; `num_warps` / `num_stages` in a config are compile
options, every other key named by `constexprs` is a kernel constexpr.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

KERNELS: dict[str, "KernelDef"] = {}


@dataclass(frozen=True)
class KernelDef:
    name: str
    fn: Any  # the @triton.jit function
    kind: str  # "gemm" | "act_quant"
    formats: tuple[str, ...]
    targets: tuple[str, ...]
    signature: Callable[[int, int, dict], dict[str, str]]
    constexprs: Callable[[int, int, dict], dict[str, Any]]
    grid: Callable[[int, int, int, dict], tuple[int, ...]]
    smem_bytes: Callable[[dict], int]
    flops: Callable[[int, int, int], float]
    bytes_moved: Callable[[int, int, int], float]
    knobs: tuple[str, ...] = ("BLOCK_M", "BLOCK_N", "BLOCK_K", "num_warps", "num_stages")
    default_config: dict = field(default_factory=dict)
    launch: Callable[..., Any] | None = None  # python launcher (tensors in, tensor out) for tests/runtime
    presets: dict = field(default_factory=dict)  # name -> config, e.g. {"decode": {...}}
    followup: str | None = None  # kernel to run after this one when config["SPLIT_K"] > 1


def register_kernel(k: KernelDef) -> KernelDef:
    if k.name in KERNELS:
        raise ValueError(f"kernel {k.name!r} registered twice")
    KERNELS[k.name] = k
    return k
