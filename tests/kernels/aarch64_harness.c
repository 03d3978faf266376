/* Runs the fused format kernels of kernels/formats/_csrc.py on recorded calls.

   Compiled together with C_SOURCE for aarch64 (aarch64-linux-gnu-gcc, static)
   and run under qemu-aarch64 by tests/kernels/test_aarch64.py, which records
   the calls the host makes for each quantizer and compares what this build
   returns with the plain-torch reference.

   `harness isa` prints tfc_isa(). `harness < calls > outputs` reads records
       i32 kernel (0 amax_grid, 1 fp8_quant, 2 nvfp4_quant, 3 mx_quant, 4 fp8_tiles)
       i32 dtype (0 f32, 1 bf16, 2 f16), i64 a[4], f32 g, i32 pad,
       i64 nx, x bytes, i64 ns, s bytes (fp8 scales; ns 0 otherwise)
   with a[] = amax: rows K bk -; fp8: rows K srs bk; nvfp4: nblocks; mx: nblocks elem ceil;
   fp8_tiles: rows K bn bk, and writes per record: i32 return, i32 pad, then i64 n + n bytes for
   each output (amax: out; fp8: out; nvfp4, mx and fp8_tiles: data, scales). Little-endian both ends.

   `harness search < calls > outputs` runs fp4_search (kernels/formats/_csrc_search.py) on records
       i32 dtype, i32 blk, i32 mx, i32 ceil, i32 noff, i32 has_fixed, i64 rows, i64 K, f32 g, i32 pad,
       then blobs (i64 n + bytes): x, offsets (i32), fixed scale codes (empty if none), A (f32)
   and writes per record: i32 return, i32 pad, blobs packed, scales, row errors (f64). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef int64_t i64;
typedef uint8_t u8;
const char* tfc_isa(void);
#define DECL(SFX)                                                                        \
    int amax_grid_##SFX(const void*, i64, i64, i64, float*);                            \
    int fp8_quant_##SFX(const void*, i64, i64, const float*, i64, i64, u8*);            \
    int nvfp4_quant_##SFX(const void*, i64, float, u8*, u8*);                           \
    int mx_quant_##SFX(const void*, i64, int, int, u8*, u8*);                           \
    int fp8_tiles_##SFX(const void*, i64, i64, i64, i64, float*, u8*);
DECL(f32) DECL(bf16) DECL(f16)
#define DECL_SEARCH(SFX) int fp4_search_##SFX(const void*, i64, i64, int, int, float, int, const int*, int, \
                                              const u8*, const float*, u8*, u8*, double*);
DECL_SEARCH(f32) DECL_SEARCH(bf16) DECL_SEARCH(f16)
typedef int (*search_t)(const void*, i64, i64, int, int, float, int, const int*, int, const u8*, const float*,
                        u8*, u8*, double*);
static const search_t SEARCH[3] = {fp4_search_f32, fp4_search_bf16, fp4_search_f16};

typedef int (*amax_t)(const void*, i64, i64, i64, float*);
typedef int (*fp8_t)(const void*, i64, i64, const float*, i64, i64, u8*);
typedef int (*nvfp4_t)(const void*, i64, float, u8*, u8*);
typedef int (*mx_t)(const void*, i64, int, int, u8*, u8*);
typedef int (*tiles_t)(const void*, i64, i64, i64, i64, float*, u8*);
static const amax_t AMAX[3] = {amax_grid_f32, amax_grid_bf16, amax_grid_f16};
static const fp8_t FP8[3] = {fp8_quant_f32, fp8_quant_bf16, fp8_quant_f16};
static const nvfp4_t NVFP4[3] = {nvfp4_quant_f32, nvfp4_quant_bf16, nvfp4_quant_f16};
static const mx_t MX[3] = {mx_quant_f32, mx_quant_bf16, mx_quant_f16};
static const tiles_t TILES[3] = {fp8_tiles_f32, fp8_tiles_bf16, fp8_tiles_f16};

static void get(void* p, size_t n) {
    if (n && fread(p, 1, n, stdin) != n) { fprintf(stderr, "harness: short read\n"); exit(2); }
}
static void* blob(i64* n) {                 /* i64 length + bytes; never a NULL pointer */
    get(n, 8);
    void* p = malloc(*n ? (size_t)*n : 1);
    get(p, (size_t)*n);
    return p;
}
static void put(const void* p, i64 n) { fwrite(&n, 8, 1, stdout); fwrite(p, 1, (size_t)n, stdout); }

static int search_calls(void) {
    int32_t h[6], pad; i64 rk[2]; float g;
    while (fread(h, 4, 6, stdin) == 6) {
        get(rk, sizeof rk); get(&g, 4); get(&pad, 4);
        i64 nx, no, nf, na;
        void* x = blob(&nx); int* offs = blob(&no); u8* fixed = blob(&nf); float* A = blob(&na);
        if (h[0] < 0 || h[0] > 2) { fprintf(stderr, "harness: bad dtype %d\n", h[0]); return 2; }
        i64 rows = rk[0], K = rk[1], np = rows * K / 2, ns = rows * (K / h[1]);
        u8 *p = malloc(np ? (size_t)np : 1), *sc = malloc(ns ? (size_t)ns : 1);
        double* e = malloc(rows ? (size_t)rows * 8 : 1);
        int32_t r[2] = {SEARCH[h[0]](x, rows, K, h[1], h[2], g, h[3], offs, h[4], h[5] ? fixed : 0, A, p, sc, e), 0};
        fwrite(r, 4, 2, stdout);
        put(p, np); put(sc, ns); put(e, rows * 8);
        free(x); free(offs); free(fixed); free(A); free(p); free(sc); free(e);
    }
    return 0;
}

int main(int argc, char** argv) {
    if (argc > 1 && strcmp(argv[1], "isa") == 0) { puts(tfc_isa()); return 0; }
    if (argc > 1 && strcmp(argv[1], "search") == 0) return search_calls();
    int32_t head[2], pad = 0; i64 a[4]; float g;
    while (fread(head, 4, 2, stdin) == 2) {
        get(a, sizeof a); get(&g, 4); get(&pad, 4);
        i64 nx, ns; void* x = blob(&nx); float* s = blob(&ns);
        int d = head[1], ret;
        if (d < 0 || d > 2) { fprintf(stderr, "harness: bad dtype %d\n", d); return 2; }
        i64 n1 = 0, n2 = 0; u8 *o1, *o2;
        switch (head[0]) {
        case 0: n1 = a[0] * ((a[1] + a[2] - 1) / a[2]) * 4; o1 = malloc(n1); o2 = malloc(1);
                ret = AMAX[d](x, a[0], a[1], a[2], (float*)o1); break;
        case 1: n1 = a[0] * a[1]; o1 = malloc(n1); o2 = malloc(1);
                ret = FP8[d](x, a[0], a[1], s, a[2], a[3], o1); break;
        case 2: n1 = a[0] * 8; n2 = a[0]; o1 = malloc(n1); o2 = malloc(n2);
                ret = NVFP4[d](x, a[0], g, o1, o2); break;
        case 3: n1 = a[0] * (a[1] == 4 ? 16 : 32); n2 = a[0]; o1 = malloc(n1); o2 = malloc(n2);
                ret = MX[d](x, a[0], (int)a[1], (int)a[2], o1, o2); break;
        case 4: n1 = a[0] * a[1]; n2 = ((a[0] + a[2] - 1) / a[2]) * ((a[1] + a[3] - 1) / a[3]) * 4;
                o1 = malloc(n1); o2 = calloc((size_t)n2, 1);
                ret = TILES[d](x, a[0], a[1], a[2], a[3], (float*)o2, o1); break;
        default: fprintf(stderr, "harness: bad kernel %d\n", head[0]); return 2;
        }
        int32_t r[2] = {ret, 0};
        fwrite(r, 4, 2, stdout);
        put(o1, n1);
        if (head[0] >= 2) put(o2, n2);
        free(x); free(s); free(o1); free(o2);
    }
    return 0;
}
