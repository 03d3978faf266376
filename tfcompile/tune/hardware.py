"""What the tuner knows of each target: hardware limits and peaks, each with its source.

`FACTS` is the one table of numbers; `TargetSpec` is built from it. Limits
prune configs (a config that needs more shared memory, registers or tensor
memory than a block may have cannot launch); peaks drive the roofline of the
cost model (cost.py). Peaks are per device, not per architecture: sm_90a
uses the H100 SXM's (the H200 has the same SMs and clocks, 4.8 TB/s HBM3e),
sm_100a the B200's.

`MODEL` holds the cost model's own constants: assumptions, not hardware
facts, said as such.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

from tfcompile.errors import RecipeError

_GUIDE = "CUDA C++ Programming Guide, Technical Specifications per Compute Capability (cc 9.0 / 10.0)"
_PTX_TMEM = "PTX ISA 8.7+, Tensor Memory (tcgen05): 128 lanes x 512 columns of 32-bit cells per CTA pair/SM"
_H100 = "NVIDIA H100 Tensor Core GPU datasheet (SXM5; dense, without sparsity); docs/kernels.md \"Hardware facts\""
_B200 = "NVIDIA DGX/HGX B200 datasheet (per GPU, dense); docs/kernels.md \"Hardware facts\""

# target,  quantity,              value,   unit,          source
FACTS: tuple[tuple[str, str, float, str, str], ...] = (
    ("sm_90a", "device", 0, "H100 SXM5", _H100),
    ("sm_90a", "sms", 132, "SMs", "NVIDIA H100 Tensor Core GPU Architecture whitepaper (H100 SXM5: 132 SMs)"),
    ("sm_90a", "smem_per_block", 227 * 1024, "bytes", _GUIDE + ": 227 KB per block (opt-in)"),
    ("sm_90a", "smem_per_sm", 228 * 1024, "bytes", _GUIDE + ": 228 KB per SM"),
    ("sm_90a", "smem_reserved_per_block", 1024, "bytes", _GUIDE + ": 1 KB per block reserved for the system"),
    ("sm_90a", "regs_per_sm", 65536, "32-bit registers", _GUIDE),
    ("sm_90a", "regs_per_thread", 255, "32-bit registers", _GUIDE),
    ("sm_90a", "threads_per_sm", 2048, "threads", _GUIDE),
    ("sm_90a", "ctas_per_sm", 32, "blocks", _GUIDE),
    ("sm_90a", "tmem_lanes", 0, "lanes", "no tensor memory before sm_100"),
    ("sm_90a", "tmem_cols", 0, "32-bit columns", "no tensor memory before sm_100"),
    ("sm_90a", "peak_bf16", 989.4, "TFLOP/s", _H100),
    ("sm_90a", "peak_fp8", 1978.9, "TFLOP/s", _H100),
    ("sm_90a", "peak_fp4", 0, "TFLOP/s", "no FP4 tensor cores on Hopper (docs/kernels.md \"Hardware facts\")"),
    ("sm_90a", "hbm", 3.35, "TB/s", _H100 + " (HBM3; H200: 4.8)"),
    ("sm_90a", "smem_bw_per_sm", 128 * 1.83, "GB/s", "32 banks x 4 B = 128 B/clk per SM (CUDA C++ Best Practices "
     "Guide, Shared Memory) at 1.83 GHz, the clock of the 989 TFLOP/s figure (132 SMs x 4096 flop/clk)"),
    ("sm_100a", "device", 0, "B200", _B200),
    ("sm_100a", "sms", 148, "SMs", "NVIDIA Blackwell architecture technical brief (B200: 148 SMs)"),
    ("sm_100a", "smem_per_block", 227 * 1024, "bytes", _GUIDE + ": 227 KB per block (opt-in); "
     "228 KB is the per-SM figure"),
    ("sm_100a", "smem_per_sm", 228 * 1024, "bytes", _GUIDE + ": 228 KB per SM"),
    ("sm_100a", "smem_reserved_per_block", 1024, "bytes", _GUIDE + ": 1 KB per block reserved for the system"),
    ("sm_100a", "regs_per_sm", 65536, "32-bit registers", _GUIDE),
    ("sm_100a", "regs_per_thread", 255, "32-bit registers", _GUIDE),
    ("sm_100a", "threads_per_sm", 2048, "threads", _GUIDE),
    ("sm_100a", "ctas_per_sm", 32, "blocks", _GUIDE),
    ("sm_100a", "tmem_lanes", 128, "lanes", _PTX_TMEM),
    ("sm_100a", "tmem_cols", 512, "32-bit columns", _PTX_TMEM),
    ("sm_100a", "peak_bf16", 2250, "TFLOP/s", _B200 + " (2.25 PFLOP/s dense BF16)"),
    ("sm_100a", "peak_fp8", 4500, "TFLOP/s", _B200),
    ("sm_100a", "peak_fp4", 9000, "TFLOP/s", _B200),
    ("sm_100a", "hbm", 8.0, "TB/s", _B200 + " (HBM3e)"),
    ("sm_100a", "smem_bw_per_sm", 128 * 1.86, "GB/s", "128 B/clk per SM (32 banks x 4 B) at ~1.86 GHz, derived: "
     "2.25 PFLOP/s / (148 SMs x 8192 dense bf16 flop/clk), an estimate"),
)

# Cost-model constants: assumptions (orders of magnitude), not hardware facts.
MODEL = {
    "version": 1,
    "mma_efficiency": 0.78,  # best FP8 GEMM on Hopper ~1.5 of 1.98 PFLOP/s (docs/kernels.md "Hardware facts")
    "hbm_efficiency": 0.90,  # copy kernels reach ~90% of the HBM peak (bench/gpu_kernels.py measures it)
    "dram_latency_us": 0.8,  # load-to-use latency of a DRAM access, ~0.5-1 us on recent GPUs
    # One SM draws at most this multiple of its fair share (HBM / SMs): memory-bound kernels
    # need about half the SMs busy to reach the HBM peak (why decode GEMMs split K).
    "sm_share_max": 2.0,
    "launch_us": 3.0,  # a kernel launch plus ramp-up; split-K pays one more (zeroing / reduction)
    "regs_overhead": 32,  # registers per thread beside the accumulator (addresses, loop, epilogue)
}


@dataclass(frozen=True)
class TargetSpec:
    name: str  # "sm_90a" | "sm_100a"
    capability: int  # triton GPUTarget("cuda", capability, 32)
    device: str  # the part the peaks are from
    sms: int
    smem_per_block: int  # bytes a block may use (opt-in maximum)
    smem_per_sm: int  # bytes
    smem_reserved_per_block: int  # bytes the system takes per resident block
    regs_per_sm: int
    regs_per_thread: int
    threads_per_sm: int
    ctas_per_sm: int
    tmem_lanes: int  # 0: no tensor memory
    tmem_cols: int
    peak_tflops: Mapping[str, float]  # dense, per MMA class: "bf16", "fp8", "fp4"
    hbm_tbps: float  # TB/s
    smem_gbps_per_sm: float  # shared-memory bandwidth of one SM, GB/s (feeds the tensor cores)


def _spec(name: str, capability: int) -> TargetSpec:
    rows = {q: (v, unit) for t, q, v, unit, _ in FACTS if t == name}
    num = {q: v for q, (v, _) in rows.items()}
    return TargetSpec(
        name=name, capability=capability, device=rows["device"][1], sms=int(num["sms"]),
        smem_per_block=int(num["smem_per_block"]), smem_per_sm=int(num["smem_per_sm"]),
        smem_reserved_per_block=int(num["smem_reserved_per_block"]), regs_per_sm=int(num["regs_per_sm"]),
        regs_per_thread=int(num["regs_per_thread"]), threads_per_sm=int(num["threads_per_sm"]),
        ctas_per_sm=int(num["ctas_per_sm"]), tmem_lanes=int(num["tmem_lanes"]),
        tmem_cols=int(num["tmem_cols"]),
        peak_tflops={k: float(num[f"peak_{k}"]) for k in ("bf16", "fp8", "fp4")},
        hbm_tbps=float(num["hbm"]), smem_gbps_per_sm=float(num["smem_bw_per_sm"]),
    )


TARGETS: dict[str, TargetSpec] = {"sm_90a": _spec("sm_90a", 90), "sm_100a": _spec("sm_100a", 100)}


def get_target(name: str) -> TargetSpec:
    try:
        return TARGETS[name]
    except KeyError:
        raise RecipeError(f"unknown target {name!r}",
                          hint="targets: " + ", ".join(TARGETS) + " (e.g. --target sm_90a,sm_100a)") from None


def parse_targets(value: str | tuple | list) -> tuple[str, ...]:
    """"sm_90a,sm_100a" or a list -> validated names, in the order given, without repeats."""
    items = value.split(",") if isinstance(value, str) else list(value)
    names = []
    for item in (s.strip() for s in items):
        if item and item not in names:
            get_target(item)
            names.append(item)
    if not names:
        raise RecipeError("no target given", hint="e.g. --target sm_90a,sm_100a")
    return tuple(names)


def target_of_capability(major: int, minor: int) -> str | None:
    """The emitted target a GPU of compute capability major.minor runs (None: none of ours)."""
    return {(9, 0): "sm_90a", (10, 0): "sm_100a"}.get((major, minor))
