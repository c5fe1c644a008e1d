/* matmul_internal.h — the shared machinery of the four matmul families.
 * Private to src/kernels/cpu.
 *
 *   ds_mm_ctx              one matmul call, as the per-thread range kernels see it
 *   ds_mm_<fam>_<variant>  range kernels: compute y[0..M)[n0..n1) (matmul_<fam>.c)
 *   ds_dense_tile          the tile engine all four families share (weights
 *                          converted to f32 on the fly, exactly; Q8_0: d * q),
 *                          written once in matmul_tile.h over the level's
 *                          native vector width
 *   ds_mm_walk             the range walker: tiles over y[0..M)[n0..n1), and
 *                          the dequantization buffer for batched calls
 *
 * ==== The tile rule =============================================================
 * A range kernel walks its output columns n in tiles of NT weight rows and
 * the activation rows m in tiles of MT. Inside a tile, every (m, n) pair owns
 * one 16-lane accumulator vector, and the k loop performs, for that pair, the
 * same sequence of lane operations whatever MT and NT are. Tile shapes are
 * therefore free to change with M, with the SIMD level and at the edges
 * (remainder rows are padded by repeating the last row and discarding its
 * results): they change speed, never bits. This is what lets the canonical
 * kernel load each weight tile once and use it for all M rows while every
 * row keeps the decode sequence.
 *
 * ==== The dequantization buffer ===================================================
 * Converting a weight (Q8_0: sign-extend, int -> float, times d; F16:
 * VCVTPH2PS) costs as much as the FMAs it feeds when a tile has few rows,
 * and those conversions compete with the FMAs for the same FP pipes (AMD
 * Zen). A register tile converts each weight chunk once for its MT rows, but
 * a batch of M > MT rows has several row tiles, and each would convert the
 * same weights again. So for M > MT the walker converts each NT-row weight
 * tile ONCE into a small f32 buffer (NT x K floats, L1/L2-resident) and runs
 * every row tile of the batch on it as F32 weights. Every conversion is
 * exact, so the buffer holds the very values the converting tile would form
 * in registers: same operands, same FMA sequence, same bits (test_matmul
 * compares canonical(M) with decode, which never uses the buffer). */
#ifndef DSPARK_MATMUL_INTERNAL_H
#define DSPARK_MATMUL_INTERNAL_H

#include "kernels/kernels.h"
#include "kernels/cpu/simd.h"

#include <stdlib.h>

/* The activations of a canonical (= decode) Q8_0 call, quantized once per
 * call by matmul.c (ds_quantize_row_q8_0 per row) before the columns are
 * split over threads; row m's block b is entry m * (K / 32) + b of each array. */
typedef struct {
    const ds_block_q8_0 *q;     /* M x nb blocks: ds_quantize_row_q8_0 of each row */
    const float         *d;     /* M x nb: the block scale q[].d as f32 (exact)    */
    const int32_t       *nsum;  /* M x nb: -128 * (sum of the block's 32 quants)   */
    /* The same three, interleaved for the VNNI tile (NULL when not built):
     * rows in groups of 8, group g's block b at (g * nb + b) * DS_Q8_GROUP_BYTES:
     * 8 x 32 quant bytes (row i at 32 i), 8 x int32 nsum (at 256), 8 x f32 d
     * (at 288). One pointer walks all rows of a register tile, every row's
     * operand an immediate offset from it. */
    const unsigned char *qi;
    /* The quants widened to int16 for the AVX2 tile (NULL unless
     * ds_q8_0_wants_qw(level)): groups of 8 rows, group g's block b at
     * (g * nb + b) * 256 int16, row i's 32 quants at 32 i. */
    const int16_t *qw;
} ds_q8_act;
#define DS_Q8_GROUP_BYTES 320

/* The activations of a kquant K-type call (Q4_K / Q5_K / Q6_K), quantized
 * once per call by matmul.c to the 8-bit super-block partner "Q8_K": per
 * row and 256-element super-block i, quants q[256 i ..], an f32 scale d[i]
 * and the 16 sums of 16 consecutive quants bsums[16 i ..]. */
typedef struct {
    const int8_t  *q;
    const float   *d;
    const int16_t *bsums;
} ds_q8k_act;

/* ---- pre-packed weights (ds_weight.extra on the CPU) -----------------------------------
 * A weight packed at load (ds_weight_pack, kernels.h) is a 64-byte header and
 * then the layout the canonical tile of one SIMD level reads. The header
 * names the layout, so a kernel running at another level (tests compare all
 * levels on one weight; DSPARK_SIMD caps the level after load is impossible,
 * the level is fixed per process) uses the original bytes instead of
 * misreading tiles built for someone else. Every layout is a permutation of
 * the original quants and scales (plus padding rows), so it computes the
 * definition's bits like any other path. */
#define DS_PACK_MAGIC 0x4b505344u          /* "DSPK" */
#define DS_PACK_HDR 64
enum {
    DS_PACK_NONE = 0,
    DS_PACK_Q8_VNNI16 = 1,  /* Q8_0, AVX-512 VNNI: 16-row tiles, quants biased to u8 */
    DS_PACK_Q8_S8 = 2,      /* Q8_0, AVX2 / NEON: 8-row tiles, signed quants          */
    DS_PACK_Q8_VNNI8 = 3,   /* Q8_0, AVX-VNNI: 8-row tiles, quants biased to u8       */
    DS_PACK_KQ_T8 = 4,      /* Q4_0 / Q5_0, AVX2 and AVX-VNNI: 8-row dword-transposed
                               tiles, the quants as stored (nibbles, fifth bits)      */
};
/* Layout DS_PACK_KQ_T8 (matmul_kq.h reads it): tiles of 8 weight rows (the
 * last padded by repeating row N - 1); in a tile, block b at b * KQ_T8_QB(t):
 * 4 vectors of 32 bytes, vector a (at 32 a) holding dword a of the 8 rows'
 * qs (row j at bytes 4j .. 4j+3: quants 4a .. 4a+3 in the low nibbles,
 * 16+4a .. 16+4a+3 in the high ones); Q5_0 then 32 bytes of fifth bits,
 * row j's at bytes 4j .. 4j+3, byte e's bit s the fifth bit of quant 4s + e
 * (so that "dword s" of every row comes out with one shift and one mask).
 * After the nb blocks the 8 fp16 scales of each block (16 bytes at
 * nb * QB + 16 b), padded to 32 bytes. The bytes per row and block are the
 * stored ones (18 / 22): a permutation, read at the stored size. */
#define KQ_T8_QB(t) ((t) == DS_TYPE_Q5_0 ? 160 : 128)
#define KQ_T8_TILE(t, nb) ((size_t)(nb) * KQ_T8_QB(t) + (((size_t)(nb) * 16 + 31) & ~(size_t)31))
typedef struct {
    uint32_t magic, layout, type, level;
    int64_t  n_in, n_out;
} ds_pack_hdr;
/* the layout of W's packed copy, DS_PACK_NONE when it has none */
DS_INLINE int ds_pack_layout(const ds_weight *W) {
    if (!W->extra) return DS_PACK_NONE;
    ds_pack_hdr h;
    memcpy(&h, W->extra, sizeof h);
    return h.magic == DS_PACK_MAGIC && h.type == W->type && h.n_in == W->n_in && h.n_out == W->n_out
               ? (int)h.layout : DS_PACK_NONE;
}
DS_INLINE const unsigned char *ds_pack_data(const ds_weight *W) {
    return (const unsigned char *)W->extra + DS_PACK_HDR;
}
/* ds_weight_pack_bytes / ds_weight_pack for an explicit level (tests; the
 * public ones use ds_simd_level()) */
size_t ds_weight_pack_bytes_at(const ds_weight *W, int level);
int    ds_weight_pack_at(const ds_weight *W, int level, void *dst);

typedef struct {
    const ds_weight *W;
    int          M;
    const float *x;      /* M x K activations                                   */
    float       *y;      /* M x N outputs                                       */
    int          level;  /* DS_LVL_* (AVXVNNI runs as AVX2 with avxvnni set, I8MM
                            as DOTPROD with i8mm set)                          */
    int          avxvnni;/* canonical Q8_0: the AVX-VNNI tile (level AVX2)       */
    int          i8mm;   /* AArch64: the SMMLA tiles (level DOTPROD)              */
    const ds_q8_act *xq; /* canonical Q8_0, and Q4_0..Q5_1: x quantized to Q8_0   */
    const ds_q8k_act *xk;/* Q4_K / Q5_K / Q6_K: x quantized to Q8_K (else NULL)  */
    int          q8_path;/* canonical Q8_0: 0 = by M, else DS_Q8_PATH_* (tests)  */
    void        *tmp;    /* this thread's reserved scratch (64-aligned) or NULL */
    size_t       tmp_bytes;
} ds_mm_ctx;

/* Canonical Q8_0 paths (matmul_q8_0.c), all with the same bits: the
 * non-repacked one-activation-row kernels or the repacked / 2 x 2 tiles. */
enum { DS_Q8_PATH_AUTO = 0, DS_Q8_PATH_ROWS = 1, DS_Q8_PATH_REPACKED = 2 };

typedef void (*ds_mm_range_fn)(const ds_mm_ctx *c, int64_t n0, int64_t n1);

void ds_mm_f32_canonical (const ds_mm_ctx *c, int64_t n0, int64_t n1);
void ds_mm_f32_fast      (const ds_mm_ctx *c, int64_t n0, int64_t n1);
void ds_mm_f16_canonical (const ds_mm_ctx *c, int64_t n0, int64_t n1);
void ds_mm_f16_fast      (const ds_mm_ctx *c, int64_t n0, int64_t n1);
void ds_mm_bf16_canonical(const ds_mm_ctx *c, int64_t n0, int64_t n1);
void ds_mm_bf16_fast     (const ds_mm_ctx *c, int64_t n0, int64_t n1);
void ds_mm_q8_0_canonical(const ds_mm_ctx *c, int64_t n0, int64_t n1);
void ds_mm_q8_0_fast     (const ds_mm_ctx *c, int64_t n0, int64_t n1);
void q8_fast_f32_range   (const ds_mm_ctx *c, int64_t n0, int64_t n1);

/* Fast Q8_0 on AVX-512 VNNI (matmul_q8_0.c): whether it runs at this level,
 * and its activation quantization (one scale per row: d[m]; per block the
 * quants and -128 * their sum). matmul.c quantizes before the split and
 * sets ctx.xq; without xq (no scratch) fast runs the f32 tile engine. */
int  ds_q8_0_fast_vnni(int level);
/* canonical Q8_0 at this level reads the int16 activation copy (ds_q8_act.qw) */
int  ds_q8_0_wants_qw(int level);
void ds_q8_0_fast_quantize(const float *x, int M, int64_t K, ds_block_q8_0 *q, int32_t *nsum,
                           float *d);

/* the kquant families (matmul_q4_0.c ... matmul_q6_k.c, engine matmul_kq.h) */
#define DS_KQ_DECL(t) void ds_mm_##t##_canonical(const ds_mm_ctx *c, int64_t n0, int64_t n1); \
                      void ds_mm_##t##_fast(const ds_mm_ctx *c, int64_t n0, int64_t n1);
DS_KQ_DECL(q4_0) DS_KQ_DECL(q4_1) DS_KQ_DECL(q5_0) DS_KQ_DECL(q5_1)
DS_KQ_DECL(q4_k) DS_KQ_DECL(q5_k) DS_KQ_DECL(q6_k)
#undef DS_KQ_DECL
/* Quantize one activation row of K (K % 256 == 0) to Q8_K (matmul.c). */
void ds_quantize_row_q8_k(const float *x, int64_t K, int8_t *q, float *d, int16_t *bsums);

/* ds_matmul at an explicit SIMD level (tests compare the levels bit for bit;
 * level must satisfy ds_simd_level_ok). ds_matmul uses ds_simd_level(). */
void ds_matmul_at_level(int level, ds_variant v, const ds_weight *W, int M, const float *x,
                        float *y, ds_pool *pool);

/* ---- tile shapes per level -----------------------------------------------------
 * An accumulator is 16 lanes = 16/W registers of the level's width W (1 zmm
 * on AVX-512, 2 ymm on AVX2, 4 xmm on SSE2/NEON). A 16-element step runs
 * chunk by chunk, so what is live is MT x NT x 16/W accumulator registers
 * plus NT weight chunks and one activation chunk; that must fit 32 zmm /
 * 16 ymm / 16 xmm without spilling:
 *   AVX-512  4 x 4 (16 + 4 + 1 = 21 zmm)      one row: 1 x 8 (8 + 8 + 1)
 *   AVX2     2 x 2 (8 + 2 + 1 = 11 ymm)       one row: 1 x 4 (8 + 4 + 1)
 *   SSE2     2 x 1 (8 + 1 + 2 = 11 xmm)       one row: 1 x 2 (8 + 2 + 1)
 *   NEON     3 x 2 (24 + 2 + 1 = 27 of 32 q)  one row: 1 x 4 (16 + 4 + 1)
 *            (the neon and dotprod levels; AArch64's portable level keeps
 *            the SSE2 shapes)
 * (the spare registers hold the weight conversion: Q8_0 scales, software
 * fp16). The one-row (decode) tile is wider in N: with a single activation
 * row the only reuse is of x, and more accumulators hide add latency. */
#define DS_MT_MAX 4
#define DS_NT_MAX 8
#define DS_LVL_IS_NEON(lv) ((lv) == DS_LVL_NEON || (lv) == DS_LVL_DOTPROD)
#define DS_TILE_MT(lv)     ((lv) == DS_LVL_AVX512 ? 4 : (lv) == DS_LVL_AVX2 || DS_LVL_IS_NEON(lv) ? 3 : 2)
#define DS_TILE_NT(lv)     ((lv) == DS_LVL_AVX512 ? 4 : (lv) == DS_LVL_AVX2 || DS_LVL_IS_NEON(lv) ? 2 : 1)
#define DS_TILE_NT_ONE(lv) ((lv) == DS_LVL_AVX512 ? 8 : (lv) == DS_LVL_AVX2 || DS_LVL_IS_NEON(lv) ? 4 : 2)

/* ---- per-level instantiation -----------------------------------------------------
 * BODY(c, n0, n1, level) is an always-inline function; NAME becomes the
 * exported range kernel that switches on c->level. ATTR is empty for the
 * canonical kernels and DS_FAST_FN (contraction on) for the fast ones. */
/* one instance (TGT: a target attribute or nothing) and the switch over two
 * levels plus portable */
#define DS_MM_INST1(NAME, BODY, ATTR, TGT, SUF, LVL)                                        \
    TGT ATTR static void NAME##_##SUF(const ds_mm_ctx *c, int64_t a, int64_t b) {           \
        BODY(c, a, b, LVL);                                                                 \
    }
#define DS_MM_DISPATCH(NAME, S2, L2, S1, L1)                                                \
    void NAME(const ds_mm_ctx *c, int64_t a, int64_t b) {                                   \
        if (c->level == L2) NAME##_##S2(c, a, b);                                           \
        else if (c->level == L1) NAME##_##S1(c, a, b);                                      \
        else NAME##_portable(c, a, b);                                                      \
    }
#if DS_X86
#define DS_MM_INSTANTIATE(NAME, BODY, ATTR)                                                 \
    DS_MM_INST1(NAME, BODY, ATTR, DS_TARGET_AVX512, avx512, DS_LVL_AVX512)                  \
    DS_MM_INST1(NAME, BODY, ATTR, DS_TARGET_AVX2, avx2, DS_LVL_AVX2)                        \
    DS_MM_INST1(NAME, BODY, ATTR, , portable, DS_LVL_PORTABLE)                              \
    DS_MM_DISPATCH(NAME, avx512, DS_LVL_AVX512, avx2, DS_LVL_AVX2)
#elif DS_ARM
/* AArch64: the base ISA has NEON, so no target attributes; the levels differ
 * in their integer dots (ds_neon_dot16) and tile shapes, chosen by the level
 * constant after inlining. */
#define DS_MM_INSTANTIATE(NAME, BODY, ATTR)                                                 \
    DS_MM_INST1(NAME, BODY, ATTR, , dotprod, DS_LVL_DOTPROD)                                \
    DS_MM_INST1(NAME, BODY, ATTR, , neon, DS_LVL_NEON)                                      \
    DS_MM_INST1(NAME, BODY, ATTR, , portable, DS_LVL_PORTABLE)                              \
    DS_MM_DISPATCH(NAME, dotprod, DS_LVL_DOTPROD, neon, DS_LVL_NEON)
#else
#define DS_MM_INSTANTIATE(NAME, BODY, ATTR)                                                 \
    DS_MM_INST1(NAME, BODY, ATTR, , portable, DS_LVL_PORTABLE)                              \
    void NAME(const ds_mm_ctx *c, int64_t a, int64_t b) { NAME##_portable(c, a, b); }
#endif

/* Tile loops must be fully unrolled so that every accumulator is a register. */
#define DS_UNROLL _Pragma("GCC unroll 8")

/* ---- helpers for tiles -------------------------------------------------------------- */
/* Row pointers for a tile of T rows of which v are valid: the padding rows
 * repeat the last valid row (they compute a duplicate that is not stored). */
DS_INLINE void ds_tile_rows(const void *base, size_t stride, int64_t r0, int v, int T,
                            const void *out[]) {
    for (int t = 0; t < T; t++)
        out[t] = (const char *)base + (size_t)(r0 + (t < v ? t : v - 1)) * stride;
}
DS_INLINE void ds_tile_store(float *y, int64_t N, int m0, int mv, int64_t n0, int nv,
                             float out[DS_MT_MAX][DS_NT_MAX]) {
    for (int i = 0; i < mv; i++)
        for (int j = 0; j < nv; j++) y[(size_t)(m0 + i) * (size_t)N + (size_t)(n0 + j)] = out[i][j];
}

/* ====================================================================================
 * Tile engine (F32 / F16 / BF16 / Q8_0 weights; type is a constant after inlining)
 * ==================================================================================== */

/* CANONICAL (and decode), fast = 0. For every (m, n):
 *   acc[l] = +0                            for l < 16
 *   for k in steps of 16:   acc[l] = fma(w[n][k+l], x[m][k+l], acc[l])
 *   tail (K % 16 = r > 0):  acc[l] = fma(w[n][k+l], x[m][k+l], acc[l])   for l < r
 *   y = tree(acc): (l, l+8) -> (l, l+4) -> (l, l+2) -> (l, l+1)
 * fma is IEEE fusedMultiplyAdd (one rounding), written explicitly per level
 * (VFMADD, FMLA, or fmaf() on the portable level; simd.h says why all give
 * the same bits). w is the weight
 * converted to f32, which is exact for F16, BF16 and Q8_0 (d * q: at most
 * 19 significant bits). Nothing here depends on M, on the tile shape, on the
 * thread or on the vector width (a 16-lane accumulator is 1 zmm, 2 ymm or
 * 4 xmm chunks, lane for lane the same operations: matmul_tile.h).
 *
 * (Canonical Q8_0 is not this engine: it is its own integer kernel on
 * quantized activations, matmul_q8_0.c. Fast Q8_0 is, below.)
 *
 * FAST, fast = 1. What a GEMM writer does: the same register tiles, with
 * `acc + w * x` left to the compiler's contraction (an FMA where the level
 * has one, a plain multiply and add on portable x86-64, so no libm call),
 * and the 16 lanes summed left to right at the end (a scalar epilogue)
 * instead of the tree. Still a function of K (and the level) only, so thread
 * counts and M do not change its bits; it simply is not the decode
 * sequence: the combine differs everywhere, the rounding of the products
 * too on portable x86-64.
 *
 * The tail is run as one more full-width step on zero-padded copies of the
 * last K % 16 elements: fma(+0, +0, acc) = acc + (+0) exactly, which leaves
 * an accumulator unchanged (it starts at +0 and round-to-nearest never turns
 * a sum starting at +0 into -0), so this IS "lanes l < r only" — and it
 * keeps a single, fully vectorized step body for the compiler. */
#define DS_W 16
#include "kernels/cpu/matmul_tile.h"
#undef DS_W
#define DS_W 8
#include "kernels/cpu/matmul_tile.h"
#undef DS_W
#define DS_W 4
#include "kernels/cpu/matmul_tile.h"
#undef DS_W

/* The tile at the level's native width (lv is a constant after inlining). */
DS_INLINE void ds_dense_tile(uint32_t type, int fast, int64_t K, const void *const wr[],
                             const float *x, int m0, int mv, float *y, int64_t N, int64_t n0,
                             int nv, int MT, int NT, int lv) {
    if (lv == DS_LVL_AVX512) ds_tile16(type, fast, K, wr, x, m0, mv, y, N, n0, nv, MT, NT);
    else if (lv == DS_LVL_AVX2) ds_tile8(type, fast, K, wr, x, m0, mv, y, N, n0, nv, MT, NT);
    else ds_tile4(type, fast, K, wr, x, m0, mv, y, N, n0, nv, MT, NT);
}
DS_INLINE void ds_cvt_row(uint32_t type, const void *row, int64_t K, float *out, int lv) {
    if (lv == DS_LVL_AVX512) ds_cvt_row16(type, row, K, out);
    else if (lv == DS_LVL_AVX2) ds_cvt_row8(type, row, K, out);
    else ds_cvt_row4(type, row, K, out);
}

/* All M activation rows against weight rows wr[0..NT) (nv valid): row
 * tiles of MT, the remainder as a narrower tile (3 rows: the 4-row tile
 * with a repeated row). */
DS_INLINE void ds_mm_rows(uint32_t type, int fast, const ds_mm_ctx *c, const void *const wr[],
                          int64_t n, int nv, int NT, int lv) {
    const int M = c->M, MT = DS_TILE_MT(lv);
    const int64_t K = c->W->n_in, N = c->W->n_out;
    int m = 0;
    for (; m + MT <= M; m += MT)
        ds_dense_tile(type, fast, K, wr, c->x, m, MT, c->y, N, n, nv, DS_TILE_MT(lv), NT, lv);
    const int r = M - m;
    if (r == 1) ds_dense_tile(type, fast, K, wr, c->x, m, 1, c->y, N, n, nv, 1, NT, lv);
    else if (r == 2) ds_dense_tile(type, fast, K, wr, c->x, m, 2, c->y, N, n, nv, 2, NT, lv);
    else if (MT == 4 && r == 3)
        ds_dense_tile(type, fast, K, wr, c->x, m, 3, c->y, N, n, nv, 4, NT, lv);
}

/* All M activation rows against the bv converted weight rows in buf (f32,
 * K each; outputs n .. n + bv): row tiles outer, the block's NT-row weight
 * tiles inner. Every (m, n) pair is still one tile's accumulator running the
 * one sequence (the tile rule): only the visiting order changes. */
DS_INLINE void ds_mm_rows_blk(int fast, const ds_mm_ctx *c, const float *buf, int64_t n, int bv,
                              int lv) {
    const int M = c->M, MT = DS_TILE_MT(lv), NT = DS_TILE_NT(lv);
    const int64_t K = c->W->n_in, N = c->W->n_out;
    const void *wr[DS_NT_MAX];
    for (int m = 0; m < M; m += MT) {
        const int r = M - m < MT ? M - m : MT;
        for (int j0 = 0; j0 < bv; j0 += NT) {
            const int nv = bv - j0 < NT ? bv - j0 : NT;
            ds_tile_rows(buf + (size_t)j0 * (size_t)K, (size_t)K * sizeof(float), 0, nv, NT, wr);
            if (r == MT)
                ds_dense_tile(DS_TYPE_F32, fast, K, wr, c->x, m, MT, c->y, N, n + j0, nv,
                              DS_TILE_MT(lv), DS_TILE_NT(lv), lv);
            else if (r == 1)
                ds_dense_tile(DS_TYPE_F32, fast, K, wr, c->x, m, 1, c->y, N, n + j0, nv, 1,
                              DS_TILE_NT(lv), lv);
            else if (r == 2)
                ds_dense_tile(DS_TYPE_F32, fast, K, wr, c->x, m, 2, c->y, N, n + j0, nv, 2,
                              DS_TILE_NT(lv), lv);
            else    /* r == 3 < MT = 4 */
                ds_dense_tile(DS_TYPE_F32, fast, K, wr, c->x, m, 3, c->y, N, n + j0, nv, 4,
                              DS_TILE_NT(lv), lv);
        }
    }
}

/* ---- AVX2 canonical batches: the half-lane tile ----------------------------------------
 * The 16 lane chains of an accumulator are independent until the tree, and
 * the tree's first step is lanes 0..7 + lanes 8..15 (chunk 0 + chunk 1 on
 * AVX2). So chunk 0 (k mod 16 < 8) can run over the whole of K first and
 * chunk 1 after it: every lane sees the same fma sequence, in the same
 * order, as in ds_tile8, and the tree gets the same operands in the same
 * order — the same bits. What changes is the registers: one ymm per (m, n)
 * pair at a time instead of two, so the tile grows from 3 x 2 (12 FMAs per
 * 10 loads per 8 k) to 4 x 3 (12 FMAs per 7 loads), which is what limited
 * F16 / BF16 prefill (and F32 batches) on AVX2 (AMD Zen: ~0.7x llama.cpp's
 * tinyBLAS). Weights are F32 rows: the dequantization buffer's (F16, BF16)
 * or the weight's own (F32); the K % 16 tail is ds_tile8's zero-padded step,
 * half by half. */
#if DS_X86
#define DS_H8_MT 4
#define DS_H8_NT 3
/* one half (chunk h: lanes 8h .. 8h+7) of the tile over all of K. Out of
 * line: inlined twice, GCC kept the first half's 12 results in registers
 * through the second half's loop and spilled its accumulators instead. */
static __attribute__((noinline, unused)) DS_TARGET_AVX2 void ds_tile8h_half(int64_t K, const void *const wr[DS_H8_NT], const void *const xr[DS_H8_MT], int h,
                              ds_v8f out[DS_H8_MT][DS_H8_NT]) {
    ds_v8f acc[DS_H8_MT][DS_H8_NT];
    DS_UNROLL
    for (int i = 0; i < DS_H8_MT; i++)
        DS_UNROLL
        for (int j = 0; j < DS_H8_NT; j++) acc[i][j] = (ds_v8f){0};
    const int64_t Kf = K & ~(int64_t)15;
    for (int64_t k = 8 * h; k < Kf; k += 16) {
        ds_v8f w[DS_H8_NT];
        DS_UNROLL
        for (int j = 0; j < DS_H8_NT; j++) w[j] = ds_ld8_f32((const float *)wr[j] + k);
        DS_UNROLL
        for (int i = 0; i < DS_H8_MT; i++) {
            const ds_v8f xv = ds_ld8_f32((const float *)xr[i] + k);
            DS_UNROLL
            for (int j = 0; j < DS_H8_NT; j++) acc[i][j] = ds_fma8(w[j], xv, acc[i][j]);
        }
    }
    if (Kf < K) {       /* the K % 16 tail: ds_tile8's zero-padded step, this half of it */
        const size_t r = (size_t)(K - Kf);
        _Alignas(64) float wpad[DS_H8_NT][16], xpad[DS_H8_MT][16];
        for (int j = 0; j < DS_H8_NT; j++) {
            memset(wpad[j], 0, sizeof wpad[j]);
            memcpy(wpad[j], (const float *)wr[j] + Kf, r * sizeof(float));
        }
        for (int i = 0; i < DS_H8_MT; i++) {
            memset(xpad[i], 0, sizeof xpad[i]);
            memcpy(xpad[i], (const float *)xr[i] + Kf, r * sizeof(float));
        }
        DS_UNROLL
        for (int i = 0; i < DS_H8_MT; i++)
            DS_UNROLL
            for (int j = 0; j < DS_H8_NT; j++)
                acc[i][j] = ds_fma8(ds_ld8_f32(wpad[j] + 8 * h), ds_ld8_f32(xpad[i] + 8 * h), acc[i][j]);
    }
    DS_UNROLL
    for (int i = 0; i < DS_H8_MT; i++)
        DS_UNROLL
        for (int j = 0; j < DS_H8_NT; j++) out[i][j] = acc[i][j];
}
DS_INLINE void ds_tile8h(int64_t K, const void *const wr[DS_H8_NT], const float *x, int m0, int mv, float *y,
                         int64_t N, int64_t n0, int nv) {
    const void *xr[DS_H8_MT];
    ds_tile_rows(x, (size_t)K * sizeof(float), m0, mv, DS_H8_MT, xr);
    ds_v8f lo[DS_H8_MT][DS_H8_NT], acc[DS_H8_MT][DS_H8_NT];
    ds_tile8h_half(K, wr, xr, 0, lo);
    ds_tile8h_half(K, wr, xr, 1, acc);
    float out[DS_MT_MAX][DS_NT_MAX];
    DS_UNROLL
    for (int i = 0; i < DS_H8_MT; i++)
        DS_UNROLL
        for (int j = 0; j < DS_H8_NT; j++) {
            /* ds_tile8's canonical tree: chunk 0 + chunk 1, halves, pairs */
            typedef float v4f_ __attribute__((vector_size(16)));
            const ds_v8f t = lo[i][j] + acc[i][j];
            const v4f_ u = __builtin_shufflevector(t, t, 0, 1, 2, 3) + __builtin_shufflevector(t, t, 4, 5, 6, 7);
            const v4f_ v = u + __builtin_shufflevector(u, u, 2, 3, 2, 3);
            out[i][j] = v[0] + v[1];
        }
    ds_tile_store(y, N, m0, mv, n0, nv, out);
}
/* All M rows over [n0, n1) with the half-lane tile: F32 weights read in
 * place, F16 / BF16 through the dequantization buffer in blocks of 6 rows
 * (each row tile runs against the block while its activations are in L1).
 * Returns 0 (nothing done) where it does not apply. */
DS_INLINE int ds_mm_walk_h8(uint32_t type, const ds_mm_ctx *c, int64_t n0, int64_t n1, size_t wrow) {
    const int64_t K = c->W->n_in, N = c->W->n_out;
    const int M = c->M;
    const void *wr[DS_NT_MAX];
    if (type == DS_TYPE_F32) {
        for (int64_t n = n0; n < n1; n += DS_H8_NT) {
            const int nv = (int)(n1 - n < DS_H8_NT ? n1 - n : DS_H8_NT);
            ds_tile_rows(c->W->data, wrow, n, nv, DS_H8_NT, wr);
            for (int m = 0; m < M; m += DS_H8_MT)
                ds_tile8h(K, wr, c->x, m, M - m < DS_H8_MT ? M - m : DS_H8_MT, c->y, N, n, nv);
        }
        return 1;
    }
    const size_t rowb = (size_t)K * sizeof(float);
    if (!c->tmp || c->tmp_bytes < DS_H8_NT * rowb) return 0;
    int NB = (int)(c->tmp_bytes / rowb < 2 * DS_H8_NT ? c->tmp_bytes / rowb : 2 * DS_H8_NT);
    NB -= NB % DS_H8_NT;
    float *buf = c->tmp;
    for (int64_t n = n0; n < n1; n += NB) {
        const int bv = (int)(n1 - n < NB ? n1 - n : NB);
        ds_tile_rows(c->W->data, wrow, n, bv, bv, wr);
        for (int j = 0; j < bv; j++) ds_cvt_row8(type, wr[j], K, buf + (size_t)j * (size_t)K);
        for (int m = 0; m < M; m += DS_H8_MT) {
            const int mv = M - m < DS_H8_MT ? M - m : DS_H8_MT;
            for (int j0 = 0; j0 < bv; j0 += DS_H8_NT) {
                const int nv = bv - j0 < DS_H8_NT ? bv - j0 : DS_H8_NT;
                const void *wt[DS_H8_NT];
                ds_tile_rows(buf + (size_t)j0 * (size_t)K, rowb, 0, nv, DS_H8_NT, wt);
                ds_tile8h(K, wt, c->x, m, mv, c->y, N, n + j0, nv);
            }
        }
    }
    return 1;
}
#endif

/* ---- the range walker -------------------------------------------------------------
 * y[0..M)[n0..n1): NT weight rows at a time (outer, so each weight tile is
 * fetched from memory once), then all M activation rows in tiles of MT
 * (inner, hitting cache). M = 1 (decode) uses the wider one-row tile and
 * converts in registers. M > MT with converted weights goes through the
 * dequantization buffer (top of this file), which lives in the thread's
 * reserved scratch (c->tmp); without one the tiles convert in registers —
 * the same bits either way, and never an allocation. */
DS_INLINE void ds_mm_walk(uint32_t type, int fast, const ds_mm_ctx *c, int64_t n0, int64_t n1,
                          int lv) {
    const int64_t K = c->W->n_in;
    const size_t wrow = type == DS_TYPE_Q8_0 ? (size_t)(K / DS_QK8_0) * sizeof(ds_block_q8_0)
                                             : (size_t)K * (type == DS_TYPE_F32 ? 4 : 2);
    const void *wr[DS_NT_MAX];
    if (c->M == 1) {
        const int NT1 = DS_TILE_NT_ONE(lv);
        for (int64_t n = n0; n < n1; n += NT1) {
            const int nv = (int)(n1 - n < NT1 ? n1 - n : NT1);
            ds_tile_rows(c->W->data, wrow, n, nv, NT1, wr);
            ds_dense_tile(type, fast, K, wr, c->x, 0, 1, c->y, c->W->n_out, n, nv, 1,
                          DS_TILE_NT_ONE(lv), lv);
        }
        return;
    }
    /* AVX2 canonical, more rows than one 3-row tile: the half-lane tile */
#if DS_X86
    if (lv == DS_LVL_AVX2 && !fast && c->M > DS_TILE_MT(lv) && ds_mm_walk_h8(type, c, n0, n1, wrow))
        return;
#endif
    const int NT = DS_TILE_NT(lv);
    float *buf = NULL;      /* in the thread's reserved scratch; without it, registers */
    if (type != DS_TYPE_F32 && c->M > DS_TILE_MT(lv) &&
        c->tmp_bytes >= (size_t)NT * (size_t)K * sizeof(float))
        buf = c->tmp;
    if (buf) {
        /* Blocked over the buffer: NB weight rows (a multiple of NT, as many
         * as the scratch holds, at most DS_NT_MAX) converted once; then each
         * row tile of x runs against all NB / NT weight tiles of the block
         * while its MT x K activations are hot in L1. Without the blocking
         * every NT-row weight tile streamed all M x K activations from L3
         * (prefill: M x K x 4 bytes is far beyond L2), once per NT outputs. */
        const size_t rowb = (size_t)K * sizeof(float);
        int NB = (int)(c->tmp_bytes / rowb < DS_NT_MAX ? c->tmp_bytes / rowb : DS_NT_MAX);
        NB -= NB % NT;
        for (int64_t n = n0; n < n1; n += NB) {
            const int bv = (int)(n1 - n < NB ? n1 - n : NB);
            ds_tile_rows(c->W->data, wrow, n, bv, bv, wr);
            for (int j = 0; j < bv; j++) ds_cvt_row(type, wr[j], K, buf + (size_t)j * (size_t)K, lv);
            ds_mm_rows_blk(fast, c, buf, n, bv, lv);
        }
        return;
    }
    for (int64_t n = n0; n < n1; n += NT) {
        const int nv = (int)(n1 - n < NT ? n1 - n : NT);
        ds_tile_rows(c->W->data, wrow, n, nv, NT, wr);
        ds_mm_rows(type, fast, c, wr, n, nv, DS_TILE_NT(lv), lv);
    }
}

#endif
