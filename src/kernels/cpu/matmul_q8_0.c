/* matmul_q8_0.c — MATMUL_Q8_0 family: y[m][n] = sum_k W[n][k] * x[m][k] with
 * Q8_0 weights (blocks of 32 int8 quants q and one fp16 scale d).
 *
 *   decode     ds_matmul_decode -> the canonical kernel below with M = 1.
 *   canonical  llama.cpp's Q8_0 x Q8_0 scheme. Each activation row is
 *              quantized to Q8_0 with ds_quantize_row_q8_0 — the same
 *              routine, per row, for every M (done once per call by the
 *              dispatcher, matmul.c, into pool scratch, and expanded to f32
 *              so the tiles need no conversion on the activation side).
 *              Then per (m, n) and block b, for lane j < 16:
 *                  p_j   = qw[j]*qx[j] + qw[j+16]*qx[j+16]     (exact integer)
 *                  s     = d_w * d_x                           (one rounding)
 *                  acc_j = acc_j + p_j * s                     (two roundings)
 *              and y = fixed tree 8-4-2-1 over the 16 lanes. The lane layout
 *              depends on K only.
 *   fast       no activation quantization: weights dequantized to f32
 *              (d*q is exact: 11-bit x 8-bit significands), fused
 *              multiply-add with the f32 activations over lane = k mod 16,
 *              left-to-right lane sum. Fewer instructions per block, more
 *              accurate, and (by construction) other bits.
 *
 * ==== Why the integer part is safe in f32 =========================================
 * |q| <= 128, so every partial integer sum in a block is below 2^24 and is
 * exact in f32 however it is formed (f32 mul+add here; any order, FMA or
 * integer SIMD would give the same values). Only the float steps (s, the
 * scaling and the lane accumulation) are rounded, and those are written
 * once, in a fixed order.
 * Two products per lane (rather than ggml's scalar per-block sum) keeps the
 * block dot free of horizontal reductions; llama.cpp's own SIMD path also
 * scales per-lane partial sums rather than one block sum. */
#include "kernels/cpu/matmul_internal.h"

/* ==========================================================================
 * activation side of the canonical kernel (called by matmul.c, per call)
 * ========================================================================== */
void ds_mm_q8_0_prepare(const float *x, int M, int64_t K, ds_block_q8_0 *tmp, float *xq,
                        float *xd) {
    const int64_t nb = K / DS_QK8_0;
    for (int m = 0; m < M; m++) {
        ds_quantize_row_q8_0(x + (size_t)m * (size_t)K, K, tmp);
        for (int64_t b = 0; b < nb; b++) {
            xd[(size_t)m * (size_t)nb + (size_t)b] = ds_fp16_to_f32(tmp[b].d);
            for (int j = 0; j < DS_QK8_0; j++)
                xq[(size_t)m * (size_t)K + (size_t)(b * DS_QK8_0 + j)] = (float)tmp[b].qs[j];
        }
    }
}

/* ==========================================================================
 * DECODE == CANONICAL (M = 1 is just the narrowest tile)
 * ========================================================================== */
DS_INLINE void q8_canon_tile(const ds_mm_ctx *c, int m0, int mv, int64_t n0, int nv, int MT,
                             int NT, int lv) {
    const int64_t K = c->W->n_in, nb = K / DS_QK8_0;
    const void *wr[DS_NT_MAX], *xr[DS_MT_MAX], *dr[DS_MT_MAX];
    ds_tile_rows(c->W->data, (size_t)nb * sizeof(ds_block_q8_0), n0, nv, NT, wr);
    ds_tile_rows(c->xq, (size_t)K * sizeof(float), m0, mv, MT, xr);
    ds_tile_rows(c->xd, (size_t)nb * sizeof(float), m0, mv, MT, dr);

    ds_v16f acc[DS_MT_MAX][DS_NT_MAX];
    DS_UNROLL
    for (int i = 0; i < MT; i++)
        DS_UNROLL
        for (int j = 0; j < NT; j++) acc[i][j] = ds_zero16();
    for (int64_t b = 0; b < nb; b++) {
        ds_v16f wl[DS_NT_MAX], wh[DS_NT_MAX];
        float dw[DS_NT_MAX];
        DS_UNROLL
        for (int j = 0; j < NT; j++) {
            const ds_block_q8_0 *blk = (const ds_block_q8_0 *)wr[j] + b;
            wl[j] = ds_ld16_q8(blk->qs);
            wh[j] = ds_ld16_q8(blk->qs + 16);
            dw[j] = ds_fp16_to_f32(blk->d);
        }
        DS_UNROLL
        for (int i = 0; i < MT; i++) {
            const float *xb = (const float *)xr[i] + b * DS_QK8_0;
            const ds_v16f xl = ds_ld16(xb), xh = ds_ld16(xb + 16);
            const float dx = ((const float *)dr[i])[b];
            DS_UNROLL
            for (int j = 0; j < NT; j++) {
                const ds_v16f p = xl * wl[j] + xh * wh[j];         /* exact */
                float s = dw[j] * dx;
                acc[i][j] = acc[i][j] + p * s;
            }
        }
    }
    float out[DS_MT_MAX][DS_NT_MAX];
    DS_UNROLL
    for (int i = 0; i < MT; i++)
        DS_UNROLL
        for (int j = 0; j < NT; j++) out[i][j] = ds_hsum16_tree(&acc[i][j]);
    ds_tile_store(c->y, c->W->n_out, m0, mv, n0, nv, out);
}

DS_INLINE void q8_canonical(const ds_mm_ctx *c, int64_t n0, int64_t n1, int lv) {
    DS_MM_WALK(q8_canon_tile, c, n0, n1, lv, 1);
}
DS_MM_INSTANTIATE(ds_mm_q8_0_canonical, q8_canonical, /* contraction off */)

/* ==========================================================================
 * FAST — dequantize the weight block once per tile, FMA against f32 x
 * ========================================================================== */
DS_INLINE void q8_fast_tile(const ds_mm_ctx *c, int m0, int mv, int64_t n0, int nv, int MT,
                            int NT, int lv) {
    const int64_t K = c->W->n_in, nb = K / DS_QK8_0;
    const void *wr[DS_NT_MAX], *xr[DS_MT_MAX];
    ds_tile_rows(c->W->data, (size_t)nb * sizeof(ds_block_q8_0), n0, nv, NT, wr);
    ds_tile_rows(c->x, (size_t)K * sizeof(float), m0, mv, MT, xr);

    ds_v16f acc[DS_MT_MAX][DS_NT_MAX];
    DS_UNROLL
    for (int i = 0; i < MT; i++)
        DS_UNROLL
        for (int j = 0; j < NT; j++) acc[i][j] = ds_zero16();
    for (int64_t b = 0; b < nb; b++) {
        ds_v16f wl[DS_NT_MAX], wh[DS_NT_MAX];
        DS_UNROLL
        for (int j = 0; j < NT; j++) {
            const ds_block_q8_0 *blk = (const ds_block_q8_0 *)wr[j] + b;
            const float d = ds_fp16_to_f32(blk->d);
            wl[j] = ds_ld16_q8(blk->qs) * d;               /* exact */
            wh[j] = ds_ld16_q8(blk->qs + 16) * d;
        }
        DS_UNROLL
        for (int i = 0; i < MT; i++) {
            const float *xb = (const float *)xr[i] + b * DS_QK8_0;
            const ds_v16f xl = ds_ld16(xb), xh = ds_ld16(xb + 16);
            DS_UNROLL
            for (int j = 0; j < NT; j++) {
                acc[i][j] = acc[i][j] + wl[j] * xl;        /* FMA: DS_FAST_FN */
                acc[i][j] = acc[i][j] + wh[j] * xh;
            }
        }
    }
    float out[DS_MT_MAX][DS_NT_MAX];
    DS_UNROLL
    for (int i = 0; i < MT; i++)
        DS_UNROLL
        for (int j = 0; j < NT; j++) out[i][j] = ds_hsum16_seq(&acc[i][j]);
    ds_tile_store(c->y, c->W->n_out, m0, mv, n0, nv, out);
}

DS_INLINE void q8_fast(const ds_mm_ctx *c, int64_t n0, int64_t n1, int lv) {
    DS_MM_WALK(q8_fast_tile, c, n0, n1, lv, 1);
}
DS_MM_INSTANTIATE(ds_mm_q8_0_fast, q8_fast, DS_FAST_FN)
