"""C source of the fused CPU kernels (compiled on first use by `_native`).

Kept as Python strings so it installs with the package without package-data
rules. Every kernel is a fused, single-pass, cache-friendly version of a
function in the plain-torch reference; `tests/kernels/test_fast.py` proves the
two bit-exact (for every ISA path this CPU runs) and
`tests/kernels/test_aarch64.py` does so for the AArch64 build under qemu.
Rules the C code relies on:
- compiled WITHOUT -ffast-math: IEEE fp32 division/compare, no FTZ/DAZ,
  no reassociation, so `x / s` here is the same float as torch's `x / s`;
- |x| maxima are taken on integer bit patterns: for non-negative floats the
  integer order is the float order, and NaN/Inf patterns sort above every
  finite value, so the block maximum doubles as the NaN/Inf detector;
- one always-inline body per kernel, exported per input dtype (f32/bf16/f16).
  The hot loops are written once against a 16-lane vector API (`V` fp32,
  `VI` u32 lanes: v_bf16 loads, v_div, v_e2m1, v_e2m1_pack32, v_e4m3, v_max16x16...)
  that `_csrc_x86` implements for AVX-512 and AVX2 and `_csrc_arm` for NEON;
  the -march of the build picks one (`VEC16` names it). Without one (or with
  -DTFC_SCALAR) only the scalar loops, which also do every tail, compile.
Every exported kernel returns 1 if it saw a NaN/Inf input, else 0;
`tfc_isa()` returns the vector path compiled in ("avx512", "avx2", "neon",
"scalar"). The scale search's kernel (`_csrc_search`) is written in GCC's
generic vectors instead, lanes = rows, and compiles to every path alike.
"""

from ._csrc_arm import NEON
from ._csrc_search import SEARCH
from ._csrc_x86 import AVX2, AVX512

COMMON = r"""#include <stdint.h>
#include <string.h>

typedef uint32_t u32;
typedef uint16_t u16;
typedef uint8_t u8;
typedef int64_t i64;

static inline u32 f2u(float f) { u32 u; memcpy(&u, &f, 4); return u; }
static inline float u2f(u32 u) { float f; memcpy(&f, &u, 4); return f; }

/* ---- element encoders (branch-free so loops vectorize) ------------------- */
/* E2M1 magnitude code of |y| with RNE and saturation at 6: the thresholds are
   the midpoints between neighbours; ties go to the even code (`>` when the
   lower neighbour is even, `>=` when the upper one is). */
static inline u32 e2m1_code(float y) {
    float a = y < 0 ? -y : y;
    u32 m = (a > 0.25f) + (a >= 0.75f) + (a > 1.25f) + (a >= 1.75f)
          + (a > 2.5f) + (a >= 3.5f) + (a > 5.0f);
    return m | ((f2u(y) >> 28) & 8u);
}

/* fp32 -> E4M3FN code, RNE, saturating at 448 (no NaN produced). */
static inline u32 e4m3_code(float y) {
    u32 sign = (f2u(y) >> 24) & 0x80u;
    float a = y < 0 ? -y : y;
    a = a < 448.0f ? a : 448.0f;
    u32 ab = f2u(a);
    u32 rn = ab + 0x7ffffu + ((ab >> 20) & 1u);      /* RNE to 3 mantissa bits */
    u32 cn = (rn >> 20) - (120u << 3);                /* rebias 127 -> 7 */
    float q = (a * 512.0f + 8388608.0f) - 8388608.0f; /* subnormal: RNE(a/2^-9) */
    u32 cs = (u32)q;
    return (a < 0.015625f ? cs : cn) | sign;
}

static inline float e4m3_value(u32 c) {               /* c in 0..0x7e, sign 0 */
    u32 e = c >> 3, m = c & 7u;
    if (e == 0) return (float)m * 0.001953125f;       /* m * 2^-9 */
    return u2f(((e + 120u) << 23) | (m << 20));
}

static inline float pow2f(int e) {                    /* 2^e, e in [-127, 127] */
    return e >= -126 ? u2f((u32)(e + 127) << 23) : u2f(0x00400000u);
}


"""

KERNELS = r"""
/* ---- kernels: one always-inline body, instantiated per input dtype ------ */
/* Scalar loaders (exact conversion to fp32). |x| maxima use the fp32 bit
   pattern of the converted value, so NaN/Inf is always >= BAD. */
#define BAD 0x7f800000u
typedef float (*ld_fn)(const void*, i64);
static inline float ld_f32(const void* p, i64 i) { return ((const float*)p)[i]; }
static inline float ld_bf16(const void* p, i64 i) { return u2f(((u32)((const u16*)p)[i]) << 16); }
static inline float ld_f16(const void* p, i64 i) {
    _Float16 v; memcpy(&v, (const u16*)p + i, 2); return (float)v;
}
static inline u32 absbits(float f) { return f2u(f) & 0x7fffffffu; }
#define INLINE static inline __attribute__((always_inline))
/* Software prefetch PF_BYTES ahead of a streaming read (any ISA; a prefetch
   past the end never faults). One core's loads alone did not keep enough
   lines in flight: on a Xeon the per-tensor FP8 pass went from 22 to 17.5 ms
   of CPU on a 117 MB bf16 weight (docs/performance.md). */
#define PF_BYTES 2048
typedef void (*pf_fn)(const void*, i64);
static inline void pf_f32(const void* p, i64 i) { __builtin_prefetch((const char*)p + 4 * i + PF_BYTES); }
static inline void pf_bf16(const void* p, i64 i) { __builtin_prefetch((const char*)p + 2 * i + PF_BYTES); }
static inline void pf_f16(const void* p, i64 i) { __builtin_prefetch((const char*)p + 2 * i + PF_BYTES); }

#ifdef VEC16
typedef V (*vld_fn)(const void*, i64);
#define VEC_ARG , vld_fn VLD, pf_fn VPF
#define VEC(SFX) , v_##SFX, pf_##SFX
#define VPASS , VLD, VPF
#else
#define VEC16 "scalar"
#define VEC_ARG
#define VEC(SFX)
#define VPASS
#define SCALAR_ONLY 1
#endif
const char* tfc_isa(void) { return VEC16; }

/* out[r, kb] = max |x[r, kb*bk : (kb+1)*bk]| (NaN/Inf kept) for rows x K. */
INLINE int amax_grid(const void* x, i64 rows, i64 K, i64 bk, float* out, ld_fn LD VEC_ARG) {
    i64 nkb = (K + bk - 1) / bk; u32 worst = 0;
    for (i64 r = 0; r < rows; r++)
        for (i64 kb = 0; kb < nkb; kb++) {
            i64 k = r * K + kb * bk, k1 = r * K + (kb * bk + bk < K ? kb * bk + bk : K);
            u32 m = 0;
#ifndef SCALAR_ONLY
            VI vm = v_zero();
            for (; k + 16 <= k1; k += 16) { VPF(x, k); vm = v_maxu(vm, v_absbits(VLD(x, k))); }
            m = v_hmax(vm);
#endif
            for (; k < k1; k++) { u32 a = absbits(LD(x, k)); m = a > m ? a : m; }
            out[r * nkb + kb] = u2f(m); worst = m > worst ? m : worst;
        }
    return worst >= BAD;
}

/* data[r, k] = e4m3(x[r, k] / s[r * srs + k / bk]) */
INLINE int fp8_quant(const void* x, i64 rows, i64 K, const float* s, i64 srs, i64 bk,
                     u8* out, ld_fn LD VEC_ARG) {
    i64 nkb = (K + bk - 1) / bk; u32 worst = 0;
    for (i64 r = 0; r < rows; r++)
        for (i64 kb = 0; kb < nkb; kb++) {
            i64 k = r * K + kb * bk, k1 = r * K + (kb * bk + bk < K ? kb * bk + bk : K);
            float sc = s[r * srs + kb]; u32 m = 0;
#ifndef SCALAR_ONLY
            VI vm = v_zero(); V vs = v_set1(sc);
            for (; k + 16 <= k1; k += 16) {
                VPF(x, k);
                V v = VLD(x, k);
                vm = v_maxu(vm, v_absbits(v));
                v_bytes(v_e4m3(v_div(v, vs)), out + k);
            }
            m = v_hmax(vm);
#endif
            for (; k < k1; k++) {
                float v = LD(x, k); u32 a = absbits(v); m = a > m ? a : m;
                out[k] = (u8)e4m3_code(v / sc);
            }
            worst = m > worst ? m : worst;
        }
    return worst >= BAD;
}

/* FP8 with the scale of each tile computed in the same pass: for every tile of
   bn rows x bk columns (the last ones clipped), s = max|x| / 448 (0 -> 1.0, as
   fp8.scale_from_amax) goes to s_out[tile row, tile column] and the tile is
   quantized e4m3(x / s) while it is still in cache: one pass over memory where
   amax_grid + fp8_quant read the input twice. A band of bn rows is taken in
   chunks of up to TILE_COLS columns (128 x 4096 bf16 = 1 MiB, its codes 0.5 MiB:
   the second read from L2 where L2 holds 2 MiB or more; a row of channel
   scaling, bn = 1, is one chunk, in L1/L2), each row of a chunk read front to
   back: square 128 x 128 tiles (one page-strided run of 256 B per row) ran
   slower on one thread of a Zen 3 than reading twice, and chunks of 16384
   columns (4 MiB + 2 MiB of codes) spilled a 4 MiB L2: 0.27 of copy on the AVX2
   build of a Xeon with AVX-512, 0.43 with 4096 (docs/performance.md). Data of a
   tile that holds NaN/Inf is left unwritten (the caller raises). */
#define TILE_COLS 4096
#define TILE_MAXB 128
INLINE u32 row_amax(const void* x, i64 k, i64 k1, ld_fn LD VEC_ARG) {
    u32 m = 0;
#ifndef SCALAR_ONLY
    VI vm = v_zero();
    for (; k + 16 <= k1; k += 16) { VPF(x, k); vm = v_maxu(vm, v_absbits(VLD(x, k))); }
    m = v_hmax(vm);
#endif
    for (; k < k1; k++) { u32 a = absbits(LD(x, k)); m = a > m ? a : m; }
    return m;
}
INLINE void row_e4m3(const void* x, i64 k, i64 k1, float sc, u8* out, ld_fn LD VEC_ARG) {
#ifndef SCALAR_ONLY
    V vs = v_set1(sc);
    for (; k + 16 <= k1; k += 16) v_bytes(v_e4m3(v_div(VLD(x, k), vs)), out + k);
#endif
    for (; k < k1; k++) out[k] = (u8)e4m3_code(LD(x, k) / sc);
}
INLINE int fp8_tiles(const void* x, i64 rows, i64 K, i64 bn, i64 bk, float* s_out, u8* out,
                     ld_fn LD VEC_ARG) {
    i64 nkb = (K + bk - 1) / bk, gb = bn == 1 || bk >= TILE_COLS ? 1 : TILE_COLS / bk;
    gb = gb > TILE_MAXB ? TILE_MAXB : gb;
    u32 worst = 0, m[TILE_MAXB]; float sc[TILE_MAXB];
    for (i64 r0 = 0; r0 < rows; r0 += bn) {
        i64 r1 = r0 + bn < rows ? r0 + bn : rows;
        for (i64 kb0 = 0; kb0 < nkb; kb0 += gb) {
            i64 kb1 = kb0 + gb < nkb ? kb0 + gb : nkb;
            for (i64 j = 0; j < kb1 - kb0; j++) m[j] = 0;
            for (i64 r = r0; r < r1; r++)
                for (i64 kb = kb0; kb < kb1; kb++) {
                    i64 c0 = r * K + kb * bk, c1 = r * K + (kb * bk + bk < K ? kb * bk + bk : K);
                    u32 a = row_amax(x, c0, c1, LD VPASS);
                    m[kb - kb0] = a > m[kb - kb0] ? a : m[kb - kb0];
                }
            for (i64 kb = kb0; kb < kb1; kb++) {
                u32 a = m[kb - kb0];
                float v = u2f(a) / 448.0f;
                sc[kb - kb0] = v == 0.0f ? 1.0f : v;
                s_out[(r0 / bn) * nkb + kb] = sc[kb - kb0];
                worst = a > worst ? a : worst;
            }
            for (i64 r = r0; r < r1; r++)
                for (i64 kb = kb0; kb < kb1; kb++) {
                    if (m[kb - kb0] >= BAD) continue;
                    i64 c0 = r * K + kb * bk, c1 = r * K + (kb * bk + bk < K ? kb * bk + bk : K);
                    row_e4m3(x, c0, c1, sc[kb - kb0], out, LD VPASS);
                }
        }
    }
    return worst >= BAD;
}

/* NVFP4 block scale code: e4m3(amax / 6 * g), all-zero/underflow -> 1.0 */
static inline u32 nvfp4_scale_code(u32 m, float g) {
    u32 sc = e4m3_code(u2f(m) / 6.0f * g);
    return sc == 0 ? 0x38u : sc;
}

/* NVFP4, one block of 16 (scalar; also the tail of the vector path). */
static inline u32 nvfp4_block(const void* x, i64 b, float g, u8* packed, u8* scales, ld_fn LD) {
    i64 o = b * 16; u32 m = 0, c[16];
    for (int j = 0; j < 16; j++) { u32 a = absbits(LD(x, o + j)); m = a > m ? a : m; }
    u32 sc = nvfp4_scale_code(m, g);
    float eff = e4m3_value(sc) / g;
    for (int j = 0; j < 16; j++) c[j] = e2m1_code(LD(x, o + j) / eff);
    for (int j = 0; j < 8; j++) packed[b * 8 + j] = (u8)(c[2 * j] | (c[2 * j + 1] << 4));
    scales[b] = (u8)sc;
    return m;
}

/* NVFP4: nblocks blocks of 16; g = global multiplier (compressed-tensors). */
INLINE int nvfp4_quant(const void* x, i64 nblocks, float g, u8* packed, u8* scales,
                       ld_fn LD VEC_ARG) {
    u32 worst = 0; i64 b = 0;
#ifndef SCALAR_ONLY
    /* tiles of 16 blocks: the 16 block maxima in one vector, scales 16-wide;
       the second pass reloads x (512 B of bf16, still in L1) instead of
       keeping 16 vectors live (AVX2 has 16 registers, a vector takes 2) */
    LUT L = v_lut();
    VI vworst = v_zero();
    const V vg = v_set1(g);
    for (; b + 16 <= nblocks; b += 16) {
        VI ab[16]; float eff[16];
        for (int i = 0; i < 16; i++) { VPF(x, (b + i) * 16); ab[i] = v_absbits(VLD(x, (b + i) * 16)); }
        VI m = v_max16x16(ab);
        vworst = v_maxu(vworst, m);
        VI sc = v_zero_to(v_e4m3(v_mul(v_div(v_asf(m), v_set1(6.0f)), vg)), 0x38);  /* zero -> 1.0 */
        v_store_f32(eff, v_div(v_e4m3_value(sc), vg));
        v_bytes(sc, scales + b);
        for (int i = 0; i < 16; i += 2)      /* two blocks = 32 codes = 16 bytes per step */
            v_e2m1_pack32(v_div(VLD(x, (b + i) * 16), v_set1(eff[i])),
                          v_div(VLD(x, (b + i + 1) * 16), v_set1(eff[i + 1])), &L, packed + (b + i) * 8);
    }
    worst = v_hmax(vworst);
#endif
    for (; b < nblocks; b++) { u32 m = nvfp4_block(x, b, g, packed, scales, LD); worst = m > worst ? m : worst; }
    return worst >= BAD;
}

/* MX shared exponent of a block from its |max| bits m (see mx.py for the rule). */
static inline int mx_exponent(u32 m, int emax, u32 fracmax, int ceil_rule) {
    if (m == 0) return 0;                                    /* all-zero -> 1.0 */
    int fl; u32 frac;
    if (m >= 0x00800000u) { fl = (int)(m >> 23) - 127; frac = m & 0x7fffffu; }
    else { int lz = __builtin_clz(m); fl = (31 - lz) - 149; frac = (m << (lz - 8)) & 0x7fffffu; }
    int e = fl - emax + (ceil_rule && frac > fracmax);
    return e < -127 ? -127 : (e > 127 ? 127 : e);
}

/* MX, one block of 32 (scalar; also the tail of the vector path). */
static inline u32 mx_block(const void* x, i64 b, int elem, int ceil_rule, u8* data, u8* scales, ld_fn LD) {
    int emax = elem == 4 ? 2 : 8;
    u32 fracmax = elem == 4 ? 0x400000u : 0x600000u;        /* 6 = 1.5*2^2, 448 = 1.75*2^8 */
    i64 o = b * 32; u32 m = 0, c[32];
    for (int j = 0; j < 32; j++) { u32 a = absbits(LD(x, o + j)); m = a > m ? a : m; }
    int e = mx_exponent(m, emax, fracmax, ceil_rule);
    float inv = pow2f(-e);                                   /* exact: x * 2^-e == x / 2^e */
    if (elem == 4) {
        for (int j = 0; j < 32; j++) c[j] = e2m1_code(LD(x, o + j) * inv);
        for (int j = 0; j < 16; j++) data[b * 16 + j] = (u8)(c[2 * j] | (c[2 * j + 1] << 4));
    } else {
        for (int j = 0; j < 32; j++) data[o + j] = (u8)e4m3_code(LD(x, o + j) * inv);
    }
    scales[b] = (u8)(e + 127);
    return m;
}

/* MX: nblocks blocks of 32; elem 4 (E2M1, packed) or 8 (E4M3); ceil_rule 0/1. */
INLINE int mx_quant(const void* x, i64 nblocks, int elem, int ceil_rule, u8* data,
                    u8* scales, ld_fn LD VEC_ARG) {
    u32 worst = 0; i64 b = 0;
#ifndef SCALAR_ONLY
    int emax = elem == 4 ? 2 : 8;
    u32 fracmax = elem == 4 ? 0x400000u : 0x600000u;
    LUT L = v_lut();
    for (; b + 16 <= nblocks; b += 16) {     /* tiles of 16 blocks (512 elements) */
        VI ab[16]; u32 m[16]; float inv[16];
        for (int i = 0; i < 16; i++) {
            VPF(x, (b + i) * 32); VPF(x, (b + i) * 32 + 16);
            ab[i] = v_maxu(v_absbits(VLD(x, (b + i) * 32)), v_absbits(VLD(x, (b + i) * 32 + 16)));
        }
        v_store_u32(m, v_max16x16(ab));
        for (int i = 0; i < 16; i++) {
            int e = mx_exponent(m[i], emax, fracmax, ceil_rule);
            inv[i] = pow2f(-e);
            scales[b + i] = (u8)(e + 127);
            worst = m[i] > worst ? m[i] : worst;
        }
        for (int i = 0; i < 16; i++) {
            i64 o = (b + i) * 32; V vi = v_set1(inv[i]);
            V v0 = v_mul(VLD(x, o), vi), v1 = v_mul(VLD(x, o + 16), vi);
            if (elem == 4) {
                v_e2m1_pack32(v0, v1, &L, data + (b + i) * 16);
            } else {
                v_bytes(v_e4m3(v0), data + o);
                v_bytes(v_e4m3(v1), data + o + 16);
            }
        }
    }
#endif
    for (; b < nblocks; b++) { u32 m = mx_block(x, b, elem, ceil_rule, data, scales, LD); worst = m > worst ? m : worst; }
    return worst >= BAD;
}

#define EXPORT(SFX)                                                                         \
int amax_grid_##SFX(const void* x, i64 rows, i64 K, i64 bk, float* out) {                   \
    return amax_grid(x, rows, K, bk, out, ld_##SFX VEC(SFX)); }                             \
int fp8_quant_##SFX(const void* x, i64 rows, i64 K, const float* s, i64 srs, i64 bk, u8* out) { \
    return fp8_quant(x, rows, K, s, srs, bk, out, ld_##SFX VEC(SFX)); }                     \
int fp8_tiles_##SFX(const void* x, i64 rows, i64 K, i64 bn, i64 bk, float* s, u8* out) {    \
    return fp8_tiles(x, rows, K, bn, bk, s, out, ld_##SFX VEC(SFX)); }                      \
int nvfp4_quant_##SFX(const void* x, i64 nblocks, float g, u8* packed, u8* scales) {        \
    return nvfp4_quant(x, nblocks, g, packed, scales, ld_##SFX VEC(SFX)); }                 \
int mx_quant_##SFX(const void* x, i64 nblocks, int elem, int ceil_rule, u8* data, u8* scales) { \
    return mx_quant(x, nblocks, elem, ceil_rule, data, scales, ld_##SFX VEC(SFX)); }

EXPORT(f32)
EXPORT(bf16)
EXPORT(f16)
"""

# Order matters: the first ISA block whose -march macros hold defines VEC16.
C_SOURCE = COMMON + AVX512 + AVX2 + NEON + KERNELS + SEARCH
