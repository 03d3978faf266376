"""The CUTLASS GEMMs tfcompile can generate, and the tile configs each may be built with.

A `CutlassKernel` is one template (templates/*.cu.in) for one target and its weight
formats. It quacks like the Triton `KernelDef` where the tuner needs it
(tfcompile.tune: `kind`, `formats`, `targets`, `knobs`, `default_config`, `presets`,
`grid`, `smem_bytes`, `flops`, `bytes_moved`), so the same config-space pruning and cost
model rank its configs. Unlike a Triton kernel, N, K and M are *runtime* arguments: one
compiled source serves every Linear shape, so an artifact needs one source per
(target, kernel, config) its shapes choose, not one per shape.

A config (dict, JSON-able):
  id                  short name, part of the file name ("coop_128x128x128_c1x1")
  BLOCK_M/N/K         the CTA (sm_90a) / MMA (sm_100a) tile, elements
  CLUSTER_M/N         thread-block cluster shape
  mainloop, epilogue  CUTLASS schedule class names (cutlass::gemm::*, cutlass::epilogue::*)
  num_warps           threads per CTA / 32 (fixed by the schedule), for occupancy pruning
  num_stages          the smem pipeline depth StageCountAutoCarveout is expected to pick
                      (an estimate for the cost model; CUTLASS computes the real one)

The candidate lists are deliberately short: every config is a 15-50 s nvcc compile, and
the cost model picks per (shape, M bucket) among them; an artifact compiles the union
of its picks (tests: the demo LM needs 2 configs on sm_90a, 1-2 per format on sm_100a).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

SMEM_CAPACITY = 232448  # bytes of shared memory per block on sm_90 / sm_100 (227 KB opt-in)
EPILOGUE_CARVEOUT = 16 * 1024  # bytes: TMA store buffers of the epilogue (bf16 sub-tiles, 2 stages), estimate
BARRIER_BYTES = 32  # per pipeline stage (mbarriers)


@dataclass(frozen=True)
class CutlassKernel:
    name: str  # "cutlass_fp8_gemm_sm90"
    template: str  # file in templates/
    formats: tuple[str, ...]  # tfcompile.schemes names it serves
    targets: tuple[str, ...]  # one target per template (its arch-specific MMA)
    arch: str  # nvcc arch: "90a" | "100a"
    a_bits: int  # bits per A/B element (8: e4m3, 4: e2m1)
    sf_vec: int  # elements per block scale factor (0: none, FP8 scales are in the epilogue)
    mma: tuple[str, ...]  # SASS opcodes at least one of which the compiled kernel must contain
    presets: dict = field(default_factory=dict)  # config id -> config
    default: str = ""  # id of the config used when nothing else is known
    params: dict = field(default_factory=dict)  # template substitutions fixed for the kernel
    kind: str = "gemm"
    knobs: tuple[str, ...] = ()  # the space is exactly `presets` (tune/space.py adds them)
    followup: str | None = None
    fn: object = None  # no Triton function: never given to Triton's front end

    @property
    def default_config(self) -> dict:
        return dict(self.presets[self.default])

    def config(self, cid: str) -> dict:
        return dict(self.presets[cid])

    def grid(self, m: int, n: int, k: int, cfg: dict) -> tuple[int, ...]:
        """Output tiles (the persistent scheduler runs min(tiles, SMs) CTAs over them)."""
        return (math.ceil(m / cfg["BLOCK_M"]) * math.ceil(n / cfg["BLOCK_N"]),)

    def stage_bytes(self, cfg: dict) -> int:
        """Shared memory of one K step: A and B tiles plus their scale factors."""
        bm, bn, bk = cfg["BLOCK_M"], cfg["BLOCK_N"], cfg["BLOCK_K"]
        ab = (bm + bn) * bk * self.a_bits // 8
        sf = (bm + bn) * bk // self.sf_vec if self.sf_vec else 0
        return ab + sf + BARRIER_BYTES

    def smem_bytes(self, cfg: dict) -> int:
        return cfg["num_stages"] * self.stage_bytes(cfg) + EPILOGUE_CARVEOUT

    def flops(self, m: int, n: int, k: int) -> float:
        return 2.0 * m * n * k

    def bytes_moved(self, m: int, n: int, k: int) -> float:
        """A and B once, their scale factors, D in bf16 (scales of FP8: negligible)."""
        elems = (m + n) * k
        sf = elems / self.sf_vec if self.sf_vec else 0
        return elems * self.a_bits / 8 + sf + 2.0 * m * n


def _stages(kernel_bits: int, sf_vec: int, bm: int, bn: int, bk: int) -> int:
    """StageCountAutoCarveout's choice: as many stages as fit beside the epilogue."""
    stage = (bm + bn) * bk * kernel_bits // 8 + ((bm + bn) * bk // sf_vec if sf_vec else 0) + BARRIER_BYTES
    return max(2, (SMEM_CAPACITY - EPILOGUE_CARVEOUT) // stage)


def _sm90(schedule: str, bm: int, bn: int, bk: int = 128, cm: int = 1, cn: int = 1) -> dict:
    """An sm_90a FP8 config: warp-specialized TMA, cooperative (2 consumer warpgroups share a
    >= 128-row tile) or ping-pong (each consumer warpgroup owns a tile; epilogue overlaps MMA)."""
    coop = schedule == "coop"
    mainloop = f"KernelTmaWarpSpecialized{'Cooperative' if coop else 'Pingpong'}FP8FastAccum"
    epilogue = "TmaWarpSpecializedCooperative" if coop else "TmaWarpSpecialized"
    return {"id": f"{schedule}_{bm}x{bn}x{bk}_c{cm}x{cn}", "BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk,
            "CLUSTER_M": cm, "CLUSTER_N": cn, "mainloop": mainloop, "epilogue": epilogue,
            "num_warps": 12, "num_stages": _stages(8, 0, bm, bn, bk)}  # 384 threads: 1 producer + 2 MMA WGs


def _sm100(operand: str, bm: int, bn: int, bk: int = 256, sf_vec: int = 16) -> dict:
    """An sm_100a block-scaled config: one CTA per MMA tile (1SM tcgen05), accumulator in TMEM.
    `operand`: CUTLASS's name of the FP4 flavour in the mainloop class, "Nvf4" (E4M3 scales per
    16) or "Mxf4" (E8M0 scales per 32)."""
    mainloop = f"KernelTmaWarpSpecialized1Sm{operand}Sm100"
    return {"id": f"1sm_{bm}x{bn}x{bk}_c1x1", "BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "CLUSTER_M": 1,
            "CLUSTER_N": 1, "mainloop": mainloop, "epilogue": "TmaWarpSpecialized1Sm",
            # 256 threads: scheduler, TMA load, MMA and epilogue-load warps + 4 epilogue warps
            "num_warps": 8, "num_stages": _stages(4, sf_vec, bm, bn, bk)}


def _table(*cfgs: dict) -> dict:
    return {c["id"]: c for c in cfgs}


FP8_SM90 = CutlassKernel(
    name="cutlass_fp8_gemm_sm90", template="sm90_fp8_gemm.cu.in", formats=("fp8", "fp8-dynamic"),
    targets=("sm_90a",), arch="90a", a_bits=8, sf_vec=0, mma=("QGMMA",),
    presets=_table(_sm90("pingpong", 64, 128), _sm90("coop", 128, 128), _sm90("coop", 128, 256)),
    default="coop_128x128x128_c1x1")
NVFP4_SM100 = CutlassKernel(
    name="cutlass_nvfp4_gemm_sm100", template="sm100_blockscaled_gemm.cu.in", formats=("nvfp4",),
    targets=("sm_100a",), arch="100a", a_bits=4, sf_vec=16, mma=("UTCOMMA",),  # SASS: UTCOMMA.4X (block 16)
    presets=_table(_sm100("Nvf4", 128, 128), _sm100("Nvf4", 128, 256)), default="1sm_128x128x256_c1x1",
    params={"FORMAT": "NVFP4", "OPERAND": "nv_float4_t", "SF_NAME": "E4M3 (ue4m3)", "SF_VEC": "16",
            "MMA_KIND": "kind::mxf4nvf4.block_scale.block16"})
MXFP4_SM100 = CutlassKernel(
    name="cutlass_mxfp4_gemm_sm100", template="sm100_blockscaled_gemm.cu.in", formats=("mxfp4",),
    targets=("sm_100a",), arch="100a", a_bits=4, sf_vec=32, mma=("UTCOMMA",),  # SASS: UTCOMMA (block 32)
    presets=_table(_sm100("Mxf4", 128, 128, sf_vec=32), _sm100("Mxf4", 128, 256, sf_vec=32)),
    default="1sm_128x128x256_c1x1",
    params={"FORMAT": "MXFP4", "OPERAND": "mx_float4_t", "SF_NAME": "E8M0 (ue8m0)", "SF_VEC": "32",
            "MMA_KIND": "kind::mxf4.block_scale.block32"})

KERNELS: dict[str, CutlassKernel] = {k.name: k for k in (FP8_SM90, NVFP4_SM100, MXFP4_SM100)}


def serving(scheme_name: str, target: str) -> list[CutlassKernel]:
    """The CUTLASS GEMMs that run `scheme_name` (a --format) on `target`."""
    return [k for k in KERNELS.values() if scheme_name in k.formats and target in k.targets]


# targets whose tensor cores have no FP4 MMA (Hopper): a 4-bit-element format has no CUTLASS GEMM there
NO_FP4_MMA = ("sm_90a",)


def gaps(scheme_name: str, target: str, element_bits: int) -> str:
    """Why no CUTLASS GEMM serves (scheme, target): one line for the index and the warnings.
    `element_bits`: the scheme's weight element width (the format's fact: 4 for E2M1)."""
    if target in NO_FP4_MMA and element_bits == 4:
        return "no FP4 tensor cores on Hopper: the Triton W4A16 GEMM serves it"
    return f"no CUTLASS template for {scheme_name} on {target} yet: the Triton kernels serve it"
