"""C source of the block-scale search kernel (part of `_csrc.C_SOURCE`; `block_search` is its
plain-torch reference and Python entry).

`fp4_search` picks, for every block of 16 (NVFP4) or 32 (MXFP4) weights, the scale among a few
candidates whose rounding has the least quadratic error d A d^T, d = q - x (passes/quantize/
output_scales.py: A from the block's diagonal block of the layer's input Hessian), and writes that
rounding's E2M1 codes, the chosen scale code and each row's summed error. It is the whole inner
loop of the output-scale search, one pass over the weights per global-scale candidate where the
torch passes it replaces moved ~40 bytes per weight for each of 4 candidate codes.

Written once in GCC's generic vectors of the build's widest fp32 register (16 lanes on AVX-512, 8
on AVX2, 4 on NEON; compiled per ISA by the same -march as the rest of `_csrc`), lane l = row
r0 + l of one column block, so every operation is elementwise: no horizontal sum, and each lane
does exactly the fp32 operations of the reference in the same order (-ffp-contract=off, no
-ffast-math), hence the same bits on every ISA and in torch. Per block and candidate:
    s      = e4m3_value(code) / g  (NVFP4)   or   2^e  (MXFP4)
    v_i    = round_e2m1(x_i / s) * s         (RNE, saturating at 6, sign kept)
    d_i    = v_i - x_i
    p_i    = A[i,i] d_i + sum_{j>i, ascending} A[i,j] d_j     (A[i,j] = H[i,j] + H[j,i] above the diagonal)
    err    = sum_{i ascending} d_i p_i                       (fp32; the first candidate wins ties)
and each row's errors are summed over its blocks in order in fp64.
"""

SEARCH = r"""
/* ---- fp4_search: block scales by a per-block quadratic error ------------ */
/* lanes = the widest fp32 vector the build has: GCC splits a wider generic vector's compares
   and conversions into scalar code (16 lanes on an AVX2 build ran 9x slower than 8) */
#if defined(__AVX512F__)
#define VL 16
#elif defined(__AVX__)
#define VL 8
#else
#define VL 4
#endif
typedef float vf16 __attribute__((vector_size(4 * VL)));
typedef int32_t vi16 __attribute__((vector_size(4 * VL)));
typedef uint32_t vu16 __attribute__((vector_size(4 * VL)));
#define SMAXB 32
/* helpers are macros: a function passing 64-byte vectors by value changes the ABI of a build
   without AVX-512 (gcc -Wpsabi) */
#define VF(f) ((vf16){0} + (float)(f))
#define VU(u) ((vu16){0} + (u32)(u))
#define VSEL(m, a, b) (((vu16)(m) & (vu16)(a)) | (~(vu16)(m) & (vu16)(b)))   /* m ? a : b, bitwise */
/* |y| -> E2M1 magnitude 0..7: e2m1_code's count of rounding boundaries below |y| (masks are -1) */
#define E2M1_MAG(a) (-((a) > VF(0.25f)) - ((a) >= VF(0.75f)) - ((a) > VF(1.25f)) - ((a) >= VF(1.75f)) \
                     - ((a) > VF(2.5f)) - ((a) >= VF(3.5f)) - ((a) > VF(5.0f)))
/* |y| (>= 0) rounded to the E2M1 grid 0 0.5 1 1.5 2 3 4 6, RNE, saturating at 6: the grid's step is
   0.5 below 2, 1 below 4, 2 up to 6, and adding then subtracting M = 2^22, 2^23, 2^24 (whose ulp is
   that step) rounds to a multiple of it with the hardware's ties-to-even, which is E2M1's even code
   (round_e2m1 in elements.py divides by the step instead; the tests compare the two bit for bit) */
#define E2M1_ROUND(a, out) do {                                                                \
    vf16 c_ = (vf16)VSEL((a) > VF(6.0f), VF(6.0f), (a));                                       \
    vf16 m_ = (vf16)VSEL(c_ < VF(2.0f), VF(4194304.0f), VSEL(c_ < VF(4.0f), VF(8388608.0f), VF(16777216.0f))); \
    out = (c_ + m_) - m_;                                                                      \
} while (0)
#define VCLAMP(c, lo, hi) ((vi16)VSEL((c) < (lo), (vi16){0} + (lo), VSEL((c) > (hi), (vi16){0} + (hi), (c))))
/* = e4m3_code of a >= 0 (finite), lanewise: RNE to 3 mantissa bits on the bits, or the subnormal
   grid by the 2^23 add (as _csrc_arm's q_e4m3) */
#define E4M3_POS(a, out) do {                                                                  \
    vf16 a_ = (vf16)VSEL((a) < VF(448.0f), (a), VF(448.0f));                                   \
    vu16 ab_ = (vu16)a_, rn_ = ab_ + 0x7ffffu + ((ab_ >> 20) & 1u);                            \
    vf16 q_ = (a_ * VF(512.0f) + VF(8388608.0f)) - VF(8388608.0f);                             \
    out = (vi16)VSEL(a_ < VF(0.015625f), (vu16)__builtin_convertvector(q_, vi16), (rn_ >> 20) - 960u); \
} while (0)
/* = e4m3_value of codes 1..126, lanewise: (c << 20) + (120 << 23) from code 8 up, c * 2^-9 below */
#define E4M3_VAL(c) ((vf16)VSEL((c) < 8, __builtin_convertvector((c), vf16) * VF(0.001953125f), \
                                ((vu16)(c) << 20) + (120u << 23)))
/* = pow2f(e) for e in -127..127, lanewise */
#define POW2(e) ((vf16)VSEL((e) >= -126, (vu16)((e) + 127) << 23, VU(0x00400000u)))

INLINE int fp4_search(const void* x, i64 rows, i64 K, const int BLK, int mx, float g, int ceil_rule,
                      const int* offs, int noff, const u8* fixed, const float* A,
                      u8* packed, u8* scales, double* rowerr, ld_fn LD) {
    const i64 nb = K / BLK, T = BLK * (BLK + 1) / 2;
    const vu16 ABS = VU(0x7fffffffu), SIGN = VU(0x80000000u);
    u32 worst = 0;
    for (i64 r0 = 0; r0 < rows; r0 += VL) {
        int nl = rows - r0 < VL ? (int)(rows - r0) : VL;
        double acc[VL] = {0};
        for (i64 b = 0; b < nb; b++) {
            vf16 X[SMAXB], D[SMAXB];
            for (int l = 0; l < VL; l++)           /* gather: lane l = row r0 + l (zeros past the end) */
                for (int i = 0; i < BLK; i++) X[i][l] = l < nl ? LD(x, (r0 + l) * K + b * BLK + i) : 0.0f;
            vu16 m = {0};
            for (int i = 0; i < BLK; i++) { vu16 a = (vu16)X[i] & ABS; m = VSEL(a > m, a, m); }
            vi16 base = {0};
            for (int l = 0; l < VL; l++) { u32 ml = m[l]; worst = ml > worst ? ml : worst; }
            if (fixed != 0) {
                for (int l = 0; l < nl; l++) base[l] = (int)fixed[(r0 + l) * nb + b] - (mx ? 127 : 0);
            } else if (mx) {
                for (int l = 0; l < VL; l++) base[l] = mx_exponent(m[l], 2, 0x400000u, ceil_rule);
            } else {
                E4M3_POS((vf16)m / VF(6.0f) * VF(g), base);
            }
            vf16 best_err = {0}, best_s = {0}; vi16 best_c = {0};
            for (int o = 0; o < noff; o++) {
                vi16 c = base + offs[o];
                vf16 s;
                if (mx) { c = VCLAMP(c, -127, 127); s = POW2(c); }
                else { c = VCLAMP(c, 1, 126); s = E4M3_VAL(c) / VF(g); }
                for (int i = 0; i < BLK; i++) {
                    vf16 y = X[i] / s, ay = (vf16)((vu16)y & ABS);
                    vf16 r;
                    E2M1_ROUND(ay, r);
                    vf16 v = (vf16)((vu16)r | ((vu16)y & SIGN));
                    D[i] = v * s - X[i];
                }
                const float* a = A + b * T;
                vf16 err = {0};
                for (int i = 0, t = 0; i < BLK; i++) {
                    vf16 p = D[i] * a[t++];
                    for (int j = i + 1; j < BLK; j++) p = p + D[j] * a[t++];
                    err = err + D[i] * p;
                }
                if (o == 0) { best_err = err; best_s = s; best_c = c; continue; }
                vi16 better = err < best_err;
                best_err = (vf16)VSEL(better, err, best_err);
                best_s = (vf16)VSEL(better, s, best_s);
                best_c = (vi16)VSEL(better, c, best_c);
            }
            vu16 code[SMAXB], pk[SMAXB / 2];
            for (int i = 0; i < BLK; i++) {
                vf16 y = X[i] / best_s, ay = (vf16)((vu16)y & ABS);
                code[i] = (vu16)E2M1_MAG(ay) | (((vu16)y >> 28) & VU(8u));
            }
            for (int j = 0; j < BLK / 2; j++) pk[j] = code[2 * j] | (code[2 * j + 1] << 4);
            for (int l = 0; l < nl; l++) {
                i64 row = r0 + l;
                u8* pr = packed + row * (K / 2) + b * (BLK / 2);
                for (int j = 0; j < BLK / 2; j++) pr[j] = (u8)pk[j][l];
                scales[row * nb + b] = (u8)(mx ? best_c[l] + 127 : best_c[l]);
                acc[l] += (double)best_err[l];
            }
        }
        for (int l = 0; l < nl; l++) rowerr[r0 + l] = acc[l];
    }
    return worst >= BAD;
}

#define EXPORT_SEARCH(SFX)                                                                      \
int fp4_search_##SFX(const void* x, i64 rows, i64 K, int blk, int mx, float g, int ceil_rule,   \
                     const int* offs, int noff, const u8* fixed, const float* A,                \
                     u8* packed, u8* scales, double* rowerr) {                                  \
    if (blk == 32) return fp4_search(x, rows, K, 32, mx, g, ceil_rule, offs, noff, fixed, A,     \
                                     packed, scales, rowerr, ld_##SFX);                         \
    return fp4_search(x, rows, K, 16, mx, g, ceil_rule, offs, noff, fixed, A, packed, scales,   \
                      rowerr, ld_##SFX); }

EXPORT_SEARCH(f32)
EXPORT_SEARCH(bf16)
EXPORT_SEARCH(f16)
"""
