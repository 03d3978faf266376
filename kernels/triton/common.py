"""Device helpers shared by the kernels, and small host helpers.

Every encoder here is integer/compare arithmetic on fp32 bit patterns, so it
gives the same bytes on a GPU and under Triton's CPU interpreter. Measured on
Triton 3.9's interpreter (docs/kernels.md): its fp32->fp8e4nv cast rounds
half-away and drops mantissa carries (7.95 -> 4.0), its fp32->bf16 cast
truncates, and it decodes bf16 subnormals wrongly -- so the quantizers never use
those casts; they build E4M3/E2M1 codes from bits, exactly as
`tfcompile.kernels.formats` specifies (RNE, saturating).

Nothing here multiplies and then adds in one expression, so fp-contraction
(`enable_fp_fusion`, on by default) cannot change a quantizer's result.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .interpret import launchable

# Blackwell block-scale atom (CUTLASS SfKMajorAtom): 128 rows x 4 K-blocks = 512 bytes.
ATOM_ROWS = 128
ATOM_KB = 4
ATOM_BYTES = 512


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def swizzled_numel(rows: int, kb: int) -> int:
    """Elements of `to_blackwell_scale_layout` for a [rows, kb] scale matrix (pads 128 x 4)."""
    return cdiv(rows, ATOM_ROWS) * cdiv(kb, ATOM_KB) * ATOM_BYTES


def pick(fn, *tensors: torch.Tensor):
    """The kernel to launch for these tensors: the JIT kernel on CUDA, its
    interpreter twin on CPU (whatever TRITON_INTERPRET says)."""
    if all(t.device.type == "cuda" for t in tensors):
        _ensure_allocator()
        return fn
    if any(t.device.type != "cpu" for t in tensors):
        raise ValueError("kernel inputs must all be on CUDA or all on CPU")
    return launchable(fn)


_ALLOCATOR_SET = False


def _ensure_allocator() -> None:
    """Device-side tensor descriptors (tl.make_tensor_descriptor) need a global
    scratch buffer per launch; Triton 3.9 asks `triton.set_allocator` for it."""
    global _ALLOCATOR_SET
    if not _ALLOCATOR_SET:
        triton.set_allocator(lambda size, align, stream: torch.empty(size, dtype=torch.int8, device="cuda"))
        _ALLOCATOR_SET = True


# ----------------------------------------------------------------------------- device helpers


@triton.jit
def tile_ids(M, N: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr):
    """1-D program id -> (pid_m, pid_n), GROUP_M row tiles per band so that
    neighbouring programs share B tiles in L2 (Triton matmul tutorial order)."""
    pid = tl.program_id(0)
    num_m = tl.cdiv(M, BLOCK_M)
    num_n: tl.constexpr = (N + BLOCK_N - 1) // BLOCK_N
    per_group = GROUP_M * num_n
    first_m = (pid // per_group) * GROUP_M
    rows = tl.minimum(num_m - first_m, GROUP_M)
    pid_m = first_m + (pid % per_group) % rows
    pid_n = (pid % per_group) // rows
    return pid_m, pid_n


@triton.jit
def bf16_to_f32(x):
    """bf16 -> fp32 by moving the 16 bits up: exact, subnormals included."""
    bits = x.to(tl.uint16, bitcast=True).to(tl.uint32) << 16
    return bits.to(tl.float32, bitcast=True)


@triton.jit
def e4m3_code(x):
    """fp32 -> uint8 E4M3FN code, round-to-nearest-even, saturating at +-448
    (`formats.cast_e4m3`). NaN input is not handled (the reference rejects it)."""
    sign = (x.to(tl.int32, bitcast=True) >> 24) & 0x80
    ab = tl.minimum(tl.abs(x), 448.0).to(tl.int32, bitcast=True)  # saturate first: 448 is exact
    exp = ab >> 23  # fp32 biased exponent; E4M3 normals need exp >= 121 (2^-6)
    # normal: drop 20 mantissa bits with RNE (+0x7FFFF plus the kept lsb), rebias 127 -> 7
    nrm = ((ab + 0x7FFFF + ((ab >> 20) & 1)) >> 20) - (120 << 3)
    # subnormal: |x| / 2^-9 rounded to an integer 0..8 with RNE (8 is the smallest normal)
    sig = (ab & 0x7FFFFF) | 0x800000
    sh = tl.maximum(tl.minimum(141 - exp, 31), 1)  # 21..31 where used; clamped to avoid UB shifts
    q = sig >> sh
    rem = sig & ((1 << sh) - 1)
    half = 1 << (sh - 1)
    q += ((rem > half) | ((rem == half) & ((q & 1) == 1))).to(tl.int32)
    return (tl.where(exp >= 121, nrm, q) | sign).to(tl.uint8)


@triton.jit
def e2m1_code(y):
    """fp32 -> uint8 E2M1 code (0..15): RNE at the midpoints, saturating at +-6,
    sign bit from the float's sign (-0.0 -> 8), as `formats.encode_e2m1`."""
    a = tl.abs(y)
    mag = (a > 0.25).to(tl.int32) + (a >= 0.75).to(tl.int32) + (a > 1.25).to(tl.int32)
    mag += (a >= 1.75).to(tl.int32) + (a > 2.5).to(tl.int32) + (a >= 3.5).to(tl.int32)
    mag += (a > 5.0).to(tl.int32)
    sign = (y.to(tl.int32, bitcast=True) >> 28) & 8
    return (mag | sign).to(tl.uint8)


@triton.jit
def e2m1_to_f32(codes):
    """uint8 E2M1 codes (low 4 bits) -> fp32, built from bits (exact)."""
    c = codes.to(tl.int32)
    e = (c >> 1) & 3
    m = c & 1
    bits = tl.where(e == 0, m * 0x3F000000, ((e + 126) << 23) | (m << 22))  # 0 / 0.5, else 2^(e-1)*(1+m/2)
    bits = bits | ((c & 8) << 28)
    return bits.to(tl.float32, bitcast=True)


@triton.jit
def e8m0_to_f32(codes):
    """uint8 E8M0 -> fp32 2^(c-127) from bits; code 0 is the fp32 subnormal 2^-127."""
    c = codes.to(tl.int32)
    return tl.where(c == 0, 0x00400000, c << 23).to(tl.float32, bitcast=True)


@triton.jit
def pack_fp4(codes, ROWS: tl.constexpr, COLS: tl.constexpr):
    """uint8 codes [ROWS, COLS] -> [ROWS, COLS/2] bytes, low nibble = even column."""
    lo, hi = tl.split(codes.reshape(ROWS, COLS // 2, 2))
    return lo | (hi << 4)


@triton.jit
def unpack_fp4(packed, ROWS: tl.constexpr, BYTES: tl.constexpr):
    """[ROWS, BYTES] bytes -> [ROWS, 2*BYTES] uint8 codes (inverse of pack_fp4)."""
    return tl.join(packed & 0xF, packed >> 4).reshape(ROWS, 2 * BYTES)


@triton.jit
def fp4_dequant(packed, scale, ROWS: tl.constexpr, BK: tl.constexpr, VEC: tl.constexpr,
                E8M0: tl.constexpr):
    """Packed E2M1 [ROWS, BK/2] x block scales [ROWS, BK/VEC] (E8M0 bytes or
    fp8e4nv) -> bf16 [ROWS, BK]. Exact: an E2M1 value (2 significant bits)
    times an E4M3 or power-of-two scale has <= 6 significant bits, so the
    product fits bf16's 8 (for scales >= 2^-126; smaller MX scales round)."""
    v = e2m1_to_f32(unpack_fp4(packed, ROWS, BK // 2))
    if E8M0:
        s = e8m0_to_f32(scale)
    else:
        s = scale.to(tl.float32)
    w = v.reshape(ROWS, BK // VEC, VEC) * s[:, :, None]
    return w.reshape(ROWS, BK).to(tl.bfloat16)


@triton.jit
def swizzled_offset(m, kb, KT):
    """Byte offset of scale (row m, K-block kb) in the Blackwell layout with KT
    atoms along K: atom (m//128)*KT + kb//4, then (m%32)*16 + (m//32%4)*4 + kb%4."""
    atom = (m // 128) * KT + kb // 4
    return atom * 512 + (m % 32) * 16 + ((m // 32) % 4) * 4 + kb % 4


@triton.jit
def load_swizzled_scales(ptr, tile_m, kt0, ROWS_VALID_ATOMS, KT, BLOCK_M: tl.constexpr,
                         SK: tl.constexpr):
    """Scales of a [BLOCK_M rows, 4*SK K-blocks] tile from the Blackwell layout.

    BLOCK_M rows = BLOCK_M/128 row atoms (from row atom tile_m*BLOCK_M/128),
    SK atoms along K from atom kt0. Each row atom's SK atoms are contiguous
    (SK*512 bytes), so this is a 2-D load, reshaped to the 5-D atom view
    (rows/128, SK, 32, 4, 4) and permuted to [BLOCK_M, 4*SK] as dot_scaled
    wants (the Triton block-scaled matmul tutorial's access pattern). Atoms past
    the padded matrix read as 0 (their data is zero-filled too)."""
    RA: tl.constexpr = BLOCK_M // 128
    ra = tile_m * RA + tl.arange(0, RA)
    inner = tl.arange(0, SK * 512)
    ka = kt0 + inner // 512
    offs = ra.to(tl.int64)[:, None] * (KT * 512) + kt0 * 512 + inner[None, :]
    mask = (ra < ROWS_VALID_ATOMS)[:, None] & (ka < KT)[None, :]
    s = tl.load(ptr + offs, mask=mask, other=0.0)
    s = s.reshape(RA, SK, 32, 4, 4).trans(0, 3, 2, 1, 4)
    return s.reshape(BLOCK_M, SK * 4)


OPTION_KNOBS = ("num_warps", "num_stages", "num_ctas", "maxnreg")


def compile_options(cfg: dict) -> dict:
    """The config's compile options (the knobs that are not constexprs: num_warps, num_stages,
    num_ctas, maxnreg) and enable_fp_fusion, the last explicit (True unless the config says
    otherwise) because Triton 3.10 flips its default; fusion only ever contracts GEMM
    epilogues here, the quantizers have no multiply-add to contract. The same options for an
    ahead-of-time compile (tfcompile/tune/compile.py) and a launch under the interpreter."""
    opts = {key: int(cfg[key]) for key in OPTION_KNOBS if cfg.get(key) is not None}
    opts["enable_fp_fusion"] = bool(cfg.get("enable_fp_fusion", True))
    return opts


def signature_for(fn, types: dict[str, str], constexprs: dict) -> dict[str, str]:
    """Triton AOT signature in parameter order: runtime args from `types`,
    every constexpr parameter typed "constexpr" (values go in `constexprs`)."""
    names = list(fn.arg_names)
    missing = [a for a in names if a not in types and a not in constexprs]
    extra = [a for a in list(types) + list(constexprs) if a not in names]
    if missing or extra:
        raise ValueError(f"{fn.__name__}: signature missing {missing}, unknown {extra}")
    return {a: "constexpr" if a in constexprs else types[a] for a in names}
