"""AArch64 NEON vector primitives of the fused kernels (C source, part of `_csrc.C_SOURCE`).

The same 16-lane API as the x86 blocks in `_csrc_x86`, on four 128-bit
registers `q[0..3]` (lanes 0-3, 4-7, 8-11, 12-15). NEON (Advanced SIMD) is
mandatory on ARMv8-A, so every AArch64 CPU takes this path (Grace's Neoverse
V2 as well as older cores); its fp32 arithmetic is IEEE with FZ off by default
on Linux, so it rounds as torch does. Tested bit-exact under qemu-aarch64
(tests/kernels/test_aarch64.py).
"""

NEON = r"""
#if !defined(TFC_SCALAR) && !defined(VEC16) && defined(__aarch64__) && defined(__ARM_NEON)
#include <arm_neon.h>
#define VEC16 "neon"
typedef struct { float32x4_t q[4]; } V;
typedef struct { uint32x4_t q[4]; } VI;
#define EACH(T, r, expr) T r; for (int j = 0; j < 4; j++) r.q[j] = (expr)
static inline V v_f32(const void* p, i64 i) { EACH(V, r, vld1q_f32((const float*)p + i + 4 * j)); return r; }
static inline V v_bf16(const void* p, i64 i) {          /* bf16 -> fp32: bits << 16 (shll) */
    const u16* h = (const u16*)p + i; uint16x8_t h0 = vld1q_u16(h), h1 = vld1q_u16(h + 8); V r;
    r.q[0] = vreinterpretq_f32_u32(vshll_n_u16(vget_low_u16(h0), 16));
    r.q[1] = vreinterpretq_f32_u32(vshll_high_n_u16(h0, 16));
    r.q[2] = vreinterpretq_f32_u32(vshll_n_u16(vget_low_u16(h1), 16));
    r.q[3] = vreinterpretq_f32_u32(vshll_high_n_u16(h1, 16));
    return r;
}
static inline V v_f16(const void* p, i64 i) {           /* exact fcvtl */
    const float16_t* h = (const float16_t*)((const u16*)p + i); float16x8_t h0 = vld1q_f16(h), h1 = vld1q_f16(h + 8); V r;
    r.q[0] = vcvt_f32_f16(vget_low_f16(h0)); r.q[1] = vcvt_high_f32_f16(h0);
    r.q[2] = vcvt_f32_f16(vget_low_f16(h1)); r.q[3] = vcvt_high_f32_f16(h1);
    return r;
}
static inline V v_set1(float f) { EACH(V, r, vdupq_n_f32(f)); return r; }
static inline V v_div(V x, V y) { EACH(V, r, vdivq_f32(x.q[j], y.q[j])); return r; }
static inline V v_mul(V x, V y) { EACH(V, r, vmulq_f32(x.q[j], y.q[j])); return r; }
static inline V v_asf(VI x) { EACH(V, r, vreinterpretq_f32_u32(x.q[j])); return r; }
static inline VI v_zero(void) { EACH(VI, r, vdupq_n_u32(0)); return r; }
static inline VI v_absbits(V v) { EACH(VI, r, vandq_u32(vreinterpretq_u32_f32(v.q[j]), vdupq_n_u32(0x7fffffffu))); return r; }
static inline VI v_maxu(VI x, VI y) { EACH(VI, r, vmaxq_u32(x.q[j], y.q[j])); return r; }
static inline u32 v_hmax(VI x) { return vmaxvq_u32(vmaxq_u32(vmaxq_u32(x.q[0], x.q[1]), vmaxq_u32(x.q[2], x.q[3]))); }
static inline void v_store_f32(float* p, V v) { for (int j = 0; j < 4; j++) vst1q_f32(p + 4 * j, v.q[j]); }
static inline void v_store_u32(u32* p, VI v) { for (int j = 0; j < 4; j++) vst1q_u32(p + 4 * j, v.q[j]); }
static inline VI v_zero_to(VI c, u32 val) {
    EACH(VI, r, vbslq_u32(vceqq_u32(c.q[j], vdupq_n_u32(0)), vdupq_n_u32(val), c.q[j])); return r;
}
static inline uint8x16_t h_bytes(VI c) {                 /* 16 codes < 256 -> 16 bytes */
    uint16x8_t lo = vcombine_u16(vmovn_u32(c.q[0]), vmovn_u32(c.q[1]));
    uint16x8_t hi = vcombine_u16(vmovn_u32(c.q[2]), vmovn_u32(c.q[3]));
    return vcombine_u8(vmovn_u16(lo), vmovn_u16(hi));
}
static inline void v_bytes(VI c, u8* out) { vst1q_u8(out, h_bytes(c)); }
/* u16 lane j = c[2j] | c[2j+1] << 8; | (>> 4), keep the low byte: c[2j] | c[2j+1] << 4 */
static inline void v_pack4(VI c, u8* out) {
    uint16x8_t w = vreinterpretq_u16_u8(h_bytes(c));
    vst1_u8(out, vmovn_u16(vorrq_u16(w, vshrq_n_u16(w, 4))));
}
static inline uint32x4_t q_e4m3(float32x4_t y) {         /* = e4m3_code, 4 lanes */
    uint32x4_t sign = vandq_u32(vshrq_n_u32(vreinterpretq_u32_f32(y), 24), vdupq_n_u32(0x80));
    float32x4_t a = vminq_f32(vabsq_f32(y), vdupq_n_f32(448.0f));
    uint32x4_t ab = vreinterpretq_u32_f32(a);
    uint32x4_t rn = vaddq_u32(ab, vaddq_u32(vdupq_n_u32(0x7ffff), vandq_u32(vshrq_n_u32(ab, 20), vdupq_n_u32(1))));
    uint32x4_t cn = vsubq_u32(vshrq_n_u32(rn, 20), vdupq_n_u32(960));
    float32x4_t q = vsubq_f32(vaddq_f32(vmulq_f32(a, vdupq_n_f32(512.0f)), vdupq_n_f32(8388608.0f)),
                              vdupq_n_f32(8388608.0f));
    uint32x4_t sub = vcltq_f32(a, vdupq_n_f32(0.015625f));
    return vorrq_u32(vbslq_u32(sub, vcvtq_u32_f32(q), cn), sign);
}
static inline VI v_e4m3(V y) { EACH(VI, r, q_e4m3(y.q[j])); return r; }
static inline float32x4_t q_e4m3_value(uint32x4_t c) {   /* codes 0..0x7e -> fp32 */
    float32x4_t nrm = vreinterpretq_f32_u32(vaddq_u32(vshlq_n_u32(c, 20), vdupq_n_u32(120u << 23)));
    float32x4_t sub = vmulq_f32(vcvtq_f32_u32(c), vdupq_n_f32(0.001953125f));
    return vbslq_f32(vcltq_u32(c, vdupq_n_u32(8)), sub, nrm);
}
static inline V v_e4m3_value(VI c) { EACH(V, r, q_e4m3_value(c.q[j])); return r; }
/* E2M1 magnitude = number of rounding boundaries below |y| (masks are all-ones). */
typedef struct { char unused; } LUT;
static inline LUT v_lut(void) { LUT L = {0}; return L; }
static inline uint32x4_t q_e2m1(float32x4_t y) {
    float32x4_t a = vabsq_f32(y);
    uint32x4_t m = vdupq_n_u32(0);
    m = vsubq_u32(m, vcgtq_f32(a, vdupq_n_f32(0.25f))); m = vsubq_u32(m, vcgeq_f32(a, vdupq_n_f32(0.75f)));
    m = vsubq_u32(m, vcgtq_f32(a, vdupq_n_f32(1.25f))); m = vsubq_u32(m, vcgeq_f32(a, vdupq_n_f32(1.75f)));
    m = vsubq_u32(m, vcgtq_f32(a, vdupq_n_f32(2.5f))); m = vsubq_u32(m, vcgeq_f32(a, vdupq_n_f32(3.5f)));
    m = vsubq_u32(m, vcgtq_f32(a, vdupq_n_f32(5.0f)));
    return vorrq_u32(m, vandq_u32(vshrq_n_u32(vreinterpretq_u32_f32(y), 28), vdupq_n_u32(8)));
}
static inline VI v_e2m1(V y, const LUT* L) { (void)L; EACH(VI, r, q_e2m1(y.q[j])); return r; }
static inline void v_e2m1_pack32(V y0, V y1, const LUT* L, u8* out) {  /* 32 codes -> 16 bytes */
    v_pack4(v_e2m1(y0, L), out); v_pack4(v_e2m1(y1, L), out + 8);
}
/* Lane i = max over a[i]: fold the 4 quarters, then two rounds of pairwise max
   (vpmaxq: [max(x0,x1) max(x2,x3) max(y0,y1) max(y2,y3)]) give 4 blocks per register. */
static inline VI v_max16x16(const VI* a) {
    uint32x4_t t[16]; VI r;
    for (int k = 0; k < 16; k++) t[k] = vmaxq_u32(vmaxq_u32(a[k].q[0], a[k].q[1]), vmaxq_u32(a[k].q[2], a[k].q[3]));
    for (int k = 0; k < 4; k++)
        r.q[k] = vpmaxq_u32(vpmaxq_u32(t[4 * k], t[4 * k + 1]), vpmaxq_u32(t[4 * k + 2], t[4 * k + 3]));
    return r;
}
#endif
"""
