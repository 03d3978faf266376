"""C source of the fused CPU kernels (compiled on first use by `_native`).

Kept as a Python string so it installs with the package without package-data
rules. Every kernel is a fused, single-pass, cache-friendly version of a
function in the plain-torch reference; `tests/kernels/test_fast.py` proves the
two bit-exact. Rules the C code relies on:
- compiled WITHOUT -ffast-math: IEEE fp32 division/compare, no FTZ/DAZ,
  no reassociation, so `x / s` here is the same float as torch's `x / s`;
- |x| maxima are taken on integer bit patterns: for non-negative floats the
  integer order is the float order, and NaN/Inf patterns sort above every
  finite value, so the block maximum doubles as the NaN/Inf detector;
- one always-inline body per kernel, exported per input dtype (f32/bf16/f16);
  with AVX-512 the hot loops use 16-lane intrinsics of the same arithmetic.
Every exported kernel returns 1 if it saw a NaN/Inf input, else 0.
"""

C_SOURCE = r"""
#include <stdint.h>
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


/* ---- AVX-512 versions of the hot loops (same arithmetic, 16 lanes) ------- */
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512DQ__) && defined(__AVX512VL__)
#include <immintrin.h>
#define HAVE_AVX512 1
static inline __m512 v_f32(const void* p, i64 i) { return _mm512_loadu_ps((const float*)p + i); }
static inline __m512 v_bf16(const void* p, i64 i) {
    __m256i h = _mm256_loadu_si256((const __m256i*)((const u16*)p + i));
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}
static inline __m512 v_f16(const void* p, i64 i) {
    return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)((const u16*)p + i)));
}
/* |v| as monotone fp32 bit patterns (NaN/Inf >= 0x7f800000 after conversion) */
static inline __m512i v_absbits(__m512 v) {
    return _mm512_and_si512(_mm512_castps_si512(v), _mm512_set1_epi32(0x7fffffff));
}
static inline __m512i v_e2m1(__m512 y) {               /* = e2m1_code, 16 lanes */
    __m512 a = _mm512_abs_ps(y);
    __m512i one = _mm512_set1_epi32(1);
    __m512i c0 = _mm512_maskz_mov_epi32(_mm512_cmp_ps_mask(a, _mm512_set1_ps(0.25f), _CMP_GT_OQ), one);
    __m512i c1 = _mm512_maskz_mov_epi32(_mm512_cmp_ps_mask(a, _mm512_set1_ps(0.75f), _CMP_GE_OQ), one);
    __m512i c2 = _mm512_maskz_mov_epi32(_mm512_cmp_ps_mask(a, _mm512_set1_ps(1.25f), _CMP_GT_OQ), one);
    __m512i c3 = _mm512_maskz_mov_epi32(_mm512_cmp_ps_mask(a, _mm512_set1_ps(1.75f), _CMP_GE_OQ), one);
    __m512i c4 = _mm512_maskz_mov_epi32(_mm512_cmp_ps_mask(a, _mm512_set1_ps(2.5f), _CMP_GT_OQ), one);
    __m512i c5 = _mm512_maskz_mov_epi32(_mm512_cmp_ps_mask(a, _mm512_set1_ps(3.5f), _CMP_GE_OQ), one);
    __m512i c6 = _mm512_maskz_mov_epi32(_mm512_cmp_ps_mask(a, _mm512_set1_ps(5.0f), _CMP_GT_OQ), one);
    __m512i m = _mm512_add_epi32(_mm512_add_epi32(_mm512_add_epi32(c0, c1), _mm512_add_epi32(c2, c3)),
                                 _mm512_add_epi32(_mm512_add_epi32(c4, c5), c6));
    __m512i s = _mm512_and_si512(_mm512_srli_epi32(_mm512_castps_si512(y), 28), _mm512_set1_epi32(8));
    return _mm512_or_si512(m, s);
}
/* 16 codes (u32 lanes) -> 8 bytes, low nibble = even element */
static inline void v_pack_store(__m512i c, u8* out) {
    __m512i q = _mm512_or_si512(c, _mm512_srli_epi64(c, 28));
    _mm_storel_epi64((__m128i*)out, _mm512_cvtepi64_epi8(q));
}
static inline __m512i v_e4m3(__m512 y) {               /* = e4m3_code, 16 lanes */
    __m512i sign = _mm512_and_si512(_mm512_srli_epi32(_mm512_castps_si512(y), 24), _mm512_set1_epi32(0x80));
    __m512 a = _mm512_min_ps(_mm512_abs_ps(y), _mm512_set1_ps(448.0f));
    __m512i ab = _mm512_castps_si512(a);
    __m512i rn = _mm512_add_epi32(ab, _mm512_add_epi32(_mm512_set1_epi32(0x7ffff),
                     _mm512_and_si512(_mm512_srli_epi32(ab, 20), _mm512_set1_epi32(1))));
    __m512i cn = _mm512_sub_epi32(_mm512_srli_epi32(rn, 20), _mm512_set1_epi32(960));
    __m512 q = _mm512_sub_ps(_mm512_add_ps(_mm512_mul_ps(a, _mm512_set1_ps(512.0f)),
                   _mm512_set1_ps(8388608.0f)), _mm512_set1_ps(8388608.0f));
    __m512i cs = _mm512_cvttps_epi32(q);
    __mmask16 sub = _mm512_cmp_ps_mask(a, _mm512_set1_ps(0.015625f), _CMP_LT_OQ);
    return _mm512_or_si512(_mm512_mask_blend_epi32(sub, cn, cs), sign);
}

/* E2M1 by table: after clamping |y| to [0.125, 6], bits >> 21 (exponent and the
   top 2 mantissa bits, a quarter-binade bucket t in 496..518) decides the code,
   because every E2M1 rounding boundary (0.25 0.75 1.25 1.75 2.5 3.5 5) is a
   bucket start. Lane table entry = code inside the bucket | code exactly at
   its start << 8 (ties). Built from the scalar e2m1_code, indexed by t & 31. */
typedef struct { __m512i lo, hi; } e2m1_lut;
static inline e2m1_lut e2m1_table(void) {
    u32 tab[32];
    for (u32 t = 496; t <= 518; t++)
        tab[t & 31] = e2m1_code(u2f((t << 21) | 1u)) | (e2m1_code(u2f(t << 21)) << 8);
    for (u32 t = 519; t < 528; t++) tab[t & 31] = 0;   /* unused slots */
    e2m1_lut L = {_mm512_loadu_si512(tab), _mm512_loadu_si512(tab + 16)};
    return L;
}
static inline __m512i v_e2m1_lut(__m512 y, e2m1_lut L) {
    __m512 a = _mm512_abs_ps(y);
    a = _mm512_max_ps(_mm512_min_ps(a, _mm512_set1_ps(6.0f)), _mm512_set1_ps(0.125f));
    __m512i ab = _mm512_castps_si512(a);
    __m512i ent = _mm512_permutex2var_epi32(L.lo, _mm512_srli_epi32(ab, 21), L.hi);
    __mmask16 exact = _mm512_testn_epi32_mask(ab, _mm512_set1_epi32(0x1fffff));
    ent = _mm512_mask_srli_epi32(ent, exact, ent, 8);
    __m512i sign = _mm512_srli_epi32(_mm512_castps_si512(y), 28);
    /* (ent & 7) | (sign & 8): ternary-logic on (ent, sign, mask 7) */
    return _mm512_ternarylogic_epi32(ent, sign, _mm512_set1_epi32(7), 0xE4);  /* C ? A : B */
}
/* Lane i of the result = max over the 16 lanes of a[i] (unsigned). */
static inline __m512i v_max16x16(const __m512i* a) {
    __m512i b[8], c[4], d[2];
    for (int k = 0; k < 8; k++)
        b[k] = _mm512_max_epu32(_mm512_shuffle_i32x4(a[2 * k], a[2 * k + 1], 0x44),
                                _mm512_shuffle_i32x4(a[2 * k], a[2 * k + 1], 0xEE));
    for (int k = 0; k < 4; k++)
        c[k] = _mm512_max_epu32(_mm512_shuffle_i32x4(b[2 * k], b[2 * k + 1], 0x88),
                                _mm512_shuffle_i32x4(b[2 * k], b[2 * k + 1], 0xDD));
    for (int k = 0; k < 2; k++)
        d[k] = _mm512_max_epu32(_mm512_unpacklo_epi64(c[2 * k], c[2 * k + 1]),
                                _mm512_unpackhi_epi64(c[2 * k], c[2 * k + 1]));
    __m512 d0 = _mm512_castsi512_ps(d[0]), d1 = _mm512_castsi512_ps(d[1]);
    __m512i r = _mm512_max_epu32(_mm512_castps_si512(_mm512_shuffle_ps(d0, d1, 0x88)),
                                 _mm512_castps_si512(_mm512_shuffle_ps(d0, d1, 0xDD)));
    /* lane 4q+t now holds block 4t+q: transpose back */
    const __m512i idx = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
    return _mm512_permutexvar_epi32(idx, r);
}
static inline __m512 v_e4m3_value(__m512i c) {         /* codes 0..0x7e -> fp32 */
    __m512 nrm = _mm512_castsi512_ps(_mm512_add_epi32(_mm512_slli_epi32(c, 20), _mm512_set1_epi32(120 << 23)));
    __m512 sub = _mm512_mul_ps(_mm512_cvtepi32_ps(c), _mm512_set1_ps(0.001953125f));
    return _mm512_mask_blend_ps(_mm512_cmplt_epu32_mask(c, _mm512_set1_epi32(8)), nrm, sub);
}
#endif

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

#ifdef HAVE_AVX512
typedef __m512 (*vld_fn)(const void*, i64);
#define VEC_ARG , vld_fn VLD
#else
#define VEC_ARG
#endif

/* out[r, kb] = max |x[r, kb*bk : (kb+1)*bk]| (NaN/Inf kept) for rows x K. */
INLINE int amax_grid(const void* x, i64 rows, i64 K, i64 bk, float* out, ld_fn LD VEC_ARG) {
    i64 nkb = (K + bk - 1) / bk; u32 worst = 0;
    for (i64 r = 0; r < rows; r++)
        for (i64 kb = 0; kb < nkb; kb++) {
            i64 k = r * K + kb * bk, k1 = r * K + (kb * bk + bk < K ? kb * bk + bk : K);
            u32 m = 0;
#ifdef HAVE_AVX512
            __m512i vm = _mm512_setzero_si512();
            for (; k + 16 <= k1; k += 16) vm = _mm512_max_epu32(vm, v_absbits(VLD(x, k)));
            m = _mm512_reduce_max_epu32(vm);
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
#ifdef HAVE_AVX512
            __m512i vm = _mm512_setzero_si512(); __m512 vs = _mm512_set1_ps(sc);
            for (; k + 16 <= k1; k += 16) {
                __m512 v = VLD(x, k);
                vm = _mm512_max_epu32(vm, v_absbits(v));
                _mm_storeu_si128((__m128i*)(out + k), _mm512_cvtepi32_epi8(v_e4m3(_mm512_div_ps(v, vs))));
            }
            m = _mm512_reduce_max_epu32(vm);
#endif
            for (; k < k1; k++) {
                float v = LD(x, k); u32 a = absbits(v); m = a > m ? a : m;
                out[k] = (u8)e4m3_code(v / sc);
            }
            worst = m > worst ? m : worst;
        }
    return worst >= BAD;
}

/* NVFP4 block scale code: e4m3(amax / 6 * g), all-zero/underflow -> 1.0 */
static inline u32 nvfp4_scale_code(u32 m, float g) {
    u32 sc = e4m3_code(u2f(m) / 6.0f * g);
    return sc == 0 ? 0x38u : sc;
}

/* NVFP4, one block of 16 (scalar; also the tail of the AVX-512 path). */
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
#ifdef HAVE_AVX512
    /* tiles of 16 blocks: 16 block maxima in one vector, scales computed 16-wide */
    e2m1_lut L = e2m1_table();
    __m512i vworst = _mm512_setzero_si512();
    const __m512 vg = _mm512_set1_ps(g);
    for (; b + 16 <= nblocks; b += 16) {
        __m512 v[16]; __m512i ab[16]; float eff[16];
        for (int i = 0; i < 16; i++) { v[i] = VLD(x, (b + i) * 16); ab[i] = v_absbits(v[i]); }
        __m512i m = v_max16x16(ab);
        vworst = _mm512_max_epu32(vworst, m);
        __m512i sc = v_e4m3(_mm512_mul_ps(_mm512_div_ps(_mm512_castsi512_ps(m), _mm512_set1_ps(6.0f)), vg));
        sc = _mm512_mask_mov_epi32(sc, _mm512_cmpeq_epi32_mask(sc, _mm512_setzero_si512()),
                                   _mm512_set1_epi32(0x38));          /* zero -> 1.0 */
        _mm512_storeu_ps(eff, _mm512_div_ps(v_e4m3_value(sc), vg));
        _mm_storeu_si128((__m128i*)(scales + b), _mm512_cvtepi32_epi8(sc));
        for (int i = 0; i < 16; i++)
            v_pack_store(v_e2m1_lut(_mm512_div_ps(v[i], _mm512_set1_ps(eff[i])), L), packed + (b + i) * 8);
    }
    worst = _mm512_reduce_max_epu32(vworst);
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

/* MX, one block of 32 (scalar; also the tail of the AVX-512 path). */
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
#ifdef HAVE_AVX512
    int emax = elem == 4 ? 2 : 8;
    u32 fracmax = elem == 4 ? 0x400000u : 0x600000u;
    e2m1_lut L = e2m1_table();
    for (; b + 16 <= nblocks; b += 16) {
        __m512i ab[16]; u32 m[16]; float inv[16];
        for (int i = 0; i < 16; i++)
            ab[i] = _mm512_max_epu32(v_absbits(VLD(x, (b + i) * 32)), v_absbits(VLD(x, (b + i) * 32 + 16)));
        _mm512_storeu_si512(m, v_max16x16(ab));
        for (int i = 0; i < 16; i++) {
            int e = mx_exponent(m[i], emax, fracmax, ceil_rule);
            inv[i] = pow2f(-e);
            scales[b + i] = (u8)(e + 127);
            worst = m[i] > worst ? m[i] : worst;
        }
        for (int i = 0; i < 16; i++) {
            i64 o = (b + i) * 32; __m512 vi = _mm512_set1_ps(inv[i]);
            __m512 v0 = _mm512_mul_ps(VLD(x, o), vi), v1 = _mm512_mul_ps(VLD(x, o + 16), vi);
            if (elem == 4) {
                v_pack_store(v_e2m1_lut(v0, L), data + (b + i) * 16);
                v_pack_store(v_e2m1_lut(v1, L), data + (b + i) * 16 + 8);
            } else {
                _mm_storeu_si128((__m128i*)(data + o), _mm512_cvtepi32_epi8(v_e4m3(v0)));
                _mm_storeu_si128((__m128i*)(data + o + 16), _mm512_cvtepi32_epi8(v_e4m3(v1)));
            }
        }
    }
#endif
    for (; b < nblocks; b++) { u32 m = mx_block(x, b, elem, ceil_rule, data, scales, LD); worst = m > worst ? m : worst; }
    return worst >= BAD;
}

#ifdef HAVE_AVX512
#define VEC(SFX) , v_##SFX
#else
#define VEC(SFX)
#endif
#define EXPORT(SFX)                                                                         \
int amax_grid_##SFX(const void* x, i64 rows, i64 K, i64 bk, float* out) {                   \
    return amax_grid(x, rows, K, bk, out, ld_##SFX VEC(SFX)); }                             \
int fp8_quant_##SFX(const void* x, i64 rows, i64 K, const float* s, i64 srs, i64 bk, u8* out) { \
    return fp8_quant(x, rows, K, s, srs, bk, out, ld_##SFX VEC(SFX)); }                     \
int nvfp4_quant_##SFX(const void* x, i64 nblocks, float g, u8* packed, u8* scales) {        \
    return nvfp4_quant(x, nblocks, g, packed, scales, ld_##SFX VEC(SFX)); }                 \
int mx_quant_##SFX(const void* x, i64 nblocks, int elem, int ceil_rule, u8* data, u8* scales) { \
    return mx_quant(x, nblocks, elem, ceil_rule, data, scales, ld_##SFX VEC(SFX)); }

EXPORT(f32)
EXPORT(bf16)
EXPORT(f16)
"""
