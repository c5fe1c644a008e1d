/* kquant.c — ggml's legacy (Q4_0, Q4_1, Q5_0, Q5_1) and K (Q4_K, Q5_K,
 * Q6_K) block types: dequantization, and quantizers for `dspark quantize`.
 *
 * ==== Dequantization is ggml's definition ============================================
 * Element order and bit packing are ggml's (common.h has the structs):
 *   Q4_0  x[j]      = d * ((qs[j] & 15) - 8),  x[j+16] = d * ((qs[j] >> 4) - 8)
 *   Q4_1  x[j]      = d * (qs[j] & 15) + m,    x[j+16] = d * (qs[j] >> 4) + m
 *   Q5_0  as Q4_0 with bit 4 of element j = bit j of the u32 qh, minus 16
 *   Q5_1  as Q4_1 with that fifth bit
 *   Q4_K  group g of 64 (g = 0..3): sub-blocks 2g (low nibbles of qs[32g..32g+31])
 *         and 2g+1 (high nibbles); x = (d * sc) * q - (dmin * m), with the
 *         6-bit (sc, m) of sub-block j unpacked from scales[12] (kq_scale_min)
 *   Q5_K  as Q4_K, the fifth bit of sub-block 2g / 2g+1 is bit 2g / 2g+1 of qh[l]
 *   Q6_K  half h of 128 (h = 0, 1), l < 32: four 6-bit quants from ql[64h+l],
 *         ql[64h+l+32] (low/high nibbles) and the 2-bit pairs of qh[32h+l];
 *         x = (d * sc[s]) * (q - 32), s = 8h + l/16 + {0, 2, 4, 6}
 * Every product a dequantization forms is exact in f32 except Q6_K's last
 * one (d * sc has at most 19 significant bits, times a 6-bit q can need 25),
 * which is one rounding of the exact value however it is grouped; Q4_1 /
 * Q5_1 / Q4_K / Q5_K add the min after an exact product: one rounding, so
 * contraction, grouping and SIMD width cannot change a dequantized value.
 *
 * ==== Quantizers =====================================================================
 * Q4_0..Q5_1 follow ggml's reference rounding (the value with the largest
 * magnitude maps to -8 / -16; the _1 types span [min, max]); the K types
 * choose each sub-block's scale and min by a small least-squares search (in
 * the spirit of ggml's make_qkx2_quants, not its code), quantize them to 6
 * bits (8 for Q6_K) against the super-block scale, and requantize the
 * elements with the final scales. The files need not be byte-identical to
 * llama-quantize's; they are valid blocks of the type that llama.cpp reads. */
#include "kernels/kernels.h"

#include <math.h>
#include <string.h>

/* ==========================================================================
 * 6-bit scale/min packing of Q4_K and Q5_K (12 bytes for 8 pairs)
 * ========================================================================== */
static inline void kq_scale_min(int j, const uint8_t *q, uint8_t *sc, uint8_t *m) {
    if (j < 4) {
        *sc = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *sc = (uint8_t)((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
        *m = (uint8_t)((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
    }
}

static void kq_pack_scales(const uint8_t ls[8], const uint8_t lm[8], uint8_t out[12]) {
    memset(out, 0, 12);
    for (int j = 0; j < 8; j++) {
        if (j < 4) {
            out[j] |= ls[j];
            out[j + 4] |= lm[j];
        } else {
            out[j + 4] = (uint8_t)((ls[j] & 0xF) | ((lm[j] & 0xF) << 4));
            out[j - 4] |= (uint8_t)((ls[j] >> 4) << 6);
            out[j] |= (uint8_t)((lm[j] >> 4) << 6);
        }
    }
}

/* ==========================================================================
 * dequantization
 * ========================================================================== */
static void dq_q4_0(const ds_block_q4_0 *b, int64_t nb, float *y) {
    for (int64_t i = 0; i < nb; i++, y += 32) {
        const float d = ds_fp16_to_f32(b[i].d);
        for (int j = 0; j < 16; j++) {
            y[j] = (float)((b[i].qs[j] & 15) - 8) * d;
            y[j + 16] = (float)((b[i].qs[j] >> 4) - 8) * d;
        }
    }
}

static void dq_q4_1(const ds_block_q4_1 *b, int64_t nb, float *y) {
    for (int64_t i = 0; i < nb; i++, y += 32) {
        const float d = ds_fp16_to_f32(b[i].d), m = ds_fp16_to_f32(b[i].m);
        for (int j = 0; j < 16; j++) {
            y[j] = (float)(b[i].qs[j] & 15) * d + m;
            y[j + 16] = (float)(b[i].qs[j] >> 4) * d + m;
        }
    }
}

static void dq_q5(const uint8_t *qh4, const uint8_t *qs, float d, float m, int off, float *y) {
    uint32_t qh;
    memcpy(&qh, qh4, 4);
    for (int j = 0; j < 16; j++) {
        const int h0 = (int)((qh >> j) & 1) << 4, h1 = (int)((qh >> (j + 16)) & 1) << 4;
        y[j] = (float)(((qs[j] & 15) | h0) - off) * d + m;
        y[j + 16] = (float)(((qs[j] >> 4) | h1) - off) * d + m;
    }
}

static void dq_q4_k(const ds_block_q4_K *b, int64_t nb, float *y) {
    for (int64_t i = 0; i < nb; i++) {
        const float d = ds_fp16_to_f32(b[i].d), dmin = ds_fp16_to_f32(b[i].dmin);
        const uint8_t *q = b[i].qs;
        for (int g = 0; g < 4; g++, q += 32) {
            uint8_t sc, m;
            kq_scale_min(2 * g, b[i].scales, &sc, &m);
            const float d1 = d * (float)sc, m1 = dmin * (float)m;
            kq_scale_min(2 * g + 1, b[i].scales, &sc, &m);
            const float d2 = d * (float)sc, m2 = dmin * (float)m;
            for (int l = 0; l < 32; l++) *y++ = d1 * (float)(q[l] & 15) - m1;
            for (int l = 0; l < 32; l++) *y++ = d2 * (float)(q[l] >> 4) - m2;
        }
    }
}

static void dq_q5_k(const ds_block_q5_K *b, int64_t nb, float *y) {
    for (int64_t i = 0; i < nb; i++) {
        const float d = ds_fp16_to_f32(b[i].d), dmin = ds_fp16_to_f32(b[i].dmin);
        const uint8_t *q = b[i].qs, *qh = b[i].qh;
        for (int g = 0; g < 4; g++, q += 32) {
            uint8_t sc, m;
            kq_scale_min(2 * g, b[i].scales, &sc, &m);
            const float d1 = d * (float)sc, m1 = dmin * (float)m;
            kq_scale_min(2 * g + 1, b[i].scales, &sc, &m);
            const float d2 = d * (float)sc, m2 = dmin * (float)m;
            const uint8_t u1 = (uint8_t)(1u << (2 * g)), u2 = (uint8_t)(2u << (2 * g));
            for (int l = 0; l < 32; l++) *y++ = d1 * (float)((q[l] & 15) + (qh[l] & u1 ? 16 : 0)) - m1;
            for (int l = 0; l < 32; l++) *y++ = d2 * (float)((q[l] >> 4) + (qh[l] & u2 ? 16 : 0)) - m2;
        }
    }
}

static void dq_q6_k(const ds_block_q6_K *b, int64_t nb, float *y) {
    for (int64_t i = 0; i < nb; i++) {
        const float d = ds_fp16_to_f32(b[i].d);
        const uint8_t *ql = b[i].ql, *qh = b[i].qh;
        const int8_t *sc = b[i].scales;
        for (int h = 0; h < 2; h++, y += 128, ql += 64, qh += 32, sc += 8) {
            for (int l = 0; l < 32; l++) {
                const int s = l / 16;
                const int q1 = ((ql[l] & 15) | (((qh[l] >> 0) & 3) << 4)) - 32;
                const int q2 = ((ql[l + 32] & 15) | (((qh[l] >> 2) & 3) << 4)) - 32;
                const int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
                const int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
                y[l] = d * (float)sc[s] * (float)q1;
                y[l + 32] = d * (float)sc[s + 2] * (float)q2;
                y[l + 64] = d * (float)sc[s + 4] * (float)q3;
                y[l + 96] = d * (float)sc[s + 6] * (float)q4;
            }
        }
    }
}

void ds_kq_row_to_f32(uint32_t type, const void *row, int64_t n, float *out) {
    switch (type) {
    case DS_TYPE_Q4_0: dq_q4_0(row, n / 32, out); break;
    case DS_TYPE_Q4_1: dq_q4_1(row, n / 32, out); break;
    case DS_TYPE_Q5_0: {
        const ds_block_q5_0 *b = row;
        for (int64_t i = 0; i < n / 32; i++) dq_q5(b[i].qh, b[i].qs, ds_fp16_to_f32(b[i].d), 0.0f, 16, out + 32 * i);
        break;
    }
    case DS_TYPE_Q5_1: {
        const ds_block_q5_1 *b = row;
        for (int64_t i = 0; i < n / 32; i++)
            dq_q5(b[i].qh, b[i].qs, ds_fp16_to_f32(b[i].d), ds_fp16_to_f32(b[i].m), 0, out + 32 * i);
        break;
    }
    case DS_TYPE_Q4_K: dq_q4_k(row, n / DS_QK_K, out); break;
    case DS_TYPE_Q5_K: dq_q5_k(row, n / DS_QK_K, out); break;
    case DS_TYPE_Q6_K: dq_q6_k(row, n / DS_QK_K, out); break;
    default: memset(out, 0, (size_t)n * sizeof(float)); break;
    }
}

/* ==========================================================================
 * quantizers
 * ========================================================================== */
/* round to nearest, ties to even, for |v| < 2^22 (NaN -> 0) */
static inline int kq_nearest(float v) {
    if (v != v) return 0;
    if (v > 4194303.0f) v = 4194303.0f;
    if (v < -4194303.0f) v = -4194303.0f;
    return (int)rintf(v);
}
static inline int kq_clamp(int v, int lo, int hi) { return v < lo ? lo : v > hi ? hi : v; }

/* Q4_0 / Q5_0 (nmax = 8 / 16): the value with the largest magnitude maps to
 * -nmax; q = clamp(trunc(x / d + nmax + 0.5)). Q4_1 / Q5_1 (span = 15 / 31):
 * d = (max - min) / span, q = round((x - min) / d). ggml's reference rules. */
static void q_sym(const float *x, int nmax, uint16_t *d_out, int q[32]) {
    float amax = 0.0f, max = 0.0f;
    for (int j = 0; j < 32; j++)
        if (fabsf(x[j]) > amax) { amax = fabsf(x[j]); max = x[j]; }
    const float d = max / (float)-nmax;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    *d_out = ds_f32_to_fp16(d);
    for (int j = 0; j < 32; j++) {
        float v = x[j] * id + ((float)nmax + 0.5f);         /* ggml: x*id + 8.5f */
        v = v != v ? 0.0f : v < 0.0f ? 0.0f : v > (float)(2 * nmax - 1) ? (float)(2 * nmax - 1) : v;
        q[j] = (int)v;
    }
}

static void q_asym(const float *x, int span, uint16_t *d_out, uint16_t *m_out, int q[32]) {
    float mn = INFINITY, mx = -INFINITY;
    for (int j = 0; j < 32; j++) {
        if (x[j] < mn) mn = x[j];
        if (x[j] > mx) mx = x[j];
    }
    if (!(mn <= mx)) mn = mx = 0.0f;                       /* all NaN */
    const float d = (mx - mn) / (float)span;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    *d_out = ds_f32_to_fp16(d);
    *m_out = ds_f32_to_fp16(mn);
    for (int j = 0; j < 32; j++) {
        float v = (x[j] - mn) * id + 0.5f;
        v = v != v ? 0.0f : v < 0.0f ? 0.0f : v > (float)span ? (float)span : v;
        q[j] = (int)v;
    }
}

static void pack_nibbles(const int q[32], uint8_t qs[16]) {
    for (int j = 0; j < 16; j++) qs[j] = (uint8_t)((q[j] & 15) | ((q[j + 16] & 15) << 4));
}
static void pack_qh(const int q[32], uint8_t qh4[4]) {
    uint32_t qh = 0;
    for (int j = 0; j < 32; j++) qh |= (uint32_t)((q[j] >> 4) & 1) << j;      /* bit j = element j */
    memcpy(qh4, &qh, 4);
}

/* Scale and min for n values with L in [0, nmax]: x ~ s * L - mn, mn >= 0.
 * Tries iscales around nmax / (max - min), each followed by a weighted
 * least-squares fit of (s, mn) to its levels; keeps the best. */
static float fit_scale_min(int n, int nmax, const float *x, const float *w, float *mn_out) {
    float lo = x[0], hi = x[0], sw = 0.0f, swx = 0.0f;
    for (int i = 0; i < n; i++) {
        if (x[i] < lo) lo = x[i];
        if (x[i] > hi) hi = x[i];
        sw += w[i];
        swx += w[i] * x[i];
    }
    if (lo > 0.0f) lo = 0.0f;
    if (!(hi > lo)) { *mn_out = -lo; return 0.0f; }
    float best_s = (hi - lo) / (float)nmax, best_m = -lo, best_err = INFINITY;
    for (int step = -8; step <= 12; step++) {
        const float is = ((float)nmax + 0.1f * (float)step) / (hi - lo);
        float sl = 0.0f, sl2 = 0.0f, slx = 0.0f;
        int L[DS_QK_K];
        for (int i = 0; i < n; i++) {
            L[i] = kq_clamp(kq_nearest(is * (x[i] - lo)), 0, nmax);
            sl += w[i] * (float)L[i];
            sl2 += w[i] * (float)L[i] * (float)L[i];
            slx += w[i] * (float)L[i] * x[i];
        }
        const float det = sw * sl2 - sl * sl;
        if (!(det > 0.0f)) continue;
        float s = (sw * slx - sl * swx) / det, m = (sl2 * swx - sl * slx) / det;  /* x ~ s*L + m */
        if (m > 0.0f) { m = 0.0f; s = sl2 > 0.0f ? slx / sl2 : 0.0f; }
        float err = 0.0f;
        for (int i = 0; i < n; i++) {
            const float e = s * (float)L[i] + m - x[i];
            err += w[i] * e * e;
        }
        if (err < best_err && s > 0.0f) { best_err = err; best_s = s; best_m = -m; }
    }
    *mn_out = best_m;
    return best_s;
}

/* Q4_K / Q5_K super-block (nmax 15 / 31). */
static void quant_k45(const float *x, int nmax, uint16_t *d_out, uint16_t *dmin_out, uint8_t scales[12],
                      int L[DS_QK_K]) {
    float sc[8], mn[8], w[32], max_sc = 0.0f, max_mn = 0.0f;
    float sum2 = 0.0f;
    for (int i = 0; i < DS_QK_K; i++) sum2 += x[i] * x[i];
    const float av = sqrtf(sum2 / DS_QK_K);
    for (int j = 0; j < 8; j++) {
        for (int l = 0; l < 32; l++) w[l] = av + fabsf(x[32 * j + l]);
        sc[j] = fit_scale_min(32, nmax, x + 32 * j, w, &mn[j]);
        if (sc[j] > max_sc) max_sc = sc[j];
        if (mn[j] > max_mn) max_mn = mn[j];
    }
    const float is = max_sc > 0.0f ? 63.0f / max_sc : 0.0f, im = max_mn > 0.0f ? 63.0f / max_mn : 0.0f;
    uint8_t ls[8], lm[8];
    for (int j = 0; j < 8; j++) {
        ls[j] = (uint8_t)kq_clamp(kq_nearest(is * sc[j]), 0, 63);
        lm[j] = (uint8_t)kq_clamp(kq_nearest(im * mn[j]), 0, 63);
    }
    kq_pack_scales(ls, lm, scales);
    *d_out = ds_f32_to_fp16(max_sc / 63.0f);
    *dmin_out = ds_f32_to_fp16(max_mn / 63.0f);
    const float d = ds_fp16_to_f32(*d_out), dmin = ds_fp16_to_f32(*dmin_out);
    for (int j = 0; j < 8; j++) {
        const float dl = d * (float)ls[j], ml = dmin * (float)lm[j];
        for (int l = 0; l < 32; l++)
            L[32 * j + l] = dl != 0.0f ? kq_clamp(kq_nearest((x[32 * j + l] + ml) / dl), 0, nmax) : 0;
    }
}

static void quant_q6_k(const float *x, ds_block_q6_K *y) {
    float sc[16], max_sc = 0.0f, amax_sc = 0.0f;
    for (int j = 0; j < 16; j++) {
        float amax = 0.0f, max = 0.0f;
        for (int l = 0; l < 16; l++)
            if (fabsf(x[16 * j + l]) > amax) { amax = fabsf(x[16 * j + l]); max = x[16 * j + l]; }
        /* the largest magnitude maps to -32; try a few nearby scales */
        float best = max / -32.0f, best_err = INFINITY;
        for (int step = -4; step <= 4 && amax > 0.0f; step++) {
            const float s = max / (-32.0f + 0.25f * (float)step);
            float err = 0.0f;
            for (int l = 0; l < 16; l++) {
                const int q = kq_clamp(kq_nearest(x[16 * j + l] / s), -32, 31);
                const float e = s * (float)q - x[16 * j + l];
                err += e * e;
            }
            if (err < best_err) { best_err = err; best = s; }
        }
        sc[j] = best;
        if (fabsf(best) > amax_sc) { amax_sc = fabsf(best); max_sc = best; }
    }
    int L[DS_QK_K];
    memset(y, 0, sizeof *y);
    if (amax_sc == 0.0f || amax_sc != amax_sc) {
        for (int i = 0; i < DS_QK_K; i++) L[i] = 32;
    } else {
        const float iscale = -128.0f / max_sc;
        y->d = ds_f32_to_fp16(1.0f / iscale);
        const float d = ds_fp16_to_f32(y->d);
        for (int j = 0; j < 16; j++) y->scales[j] = (int8_t)kq_clamp(kq_nearest(iscale * sc[j]), -128, 127);
        for (int j = 0; j < 16; j++) {
            const float dl = d * (float)y->scales[j];
            for (int l = 0; l < 16; l++)
                L[16 * j + l] = dl != 0.0f ? kq_clamp(kq_nearest(x[16 * j + l] / dl), -32, 31) + 32 : 32;
        }
    }
    for (int h = 0; h < 2; h++) {
        const int *Lh = L + 128 * h;
        uint8_t *ql = y->ql + 64 * h, *qh = y->qh + 32 * h;
        for (int l = 0; l < 32; l++) {
            ql[l] = (uint8_t)((Lh[l] & 15) | ((Lh[l + 64] & 15) << 4));
            ql[l + 32] = (uint8_t)((Lh[l + 32] & 15) | ((Lh[l + 96] & 15) << 4));
            qh[l] = (uint8_t)((Lh[l] >> 4) | ((Lh[l + 32] >> 4) << 2) | ((Lh[l + 64] >> 4) << 4) |
                              ((Lh[l + 96] >> 4) << 6));
        }
    }
}

void ds_kq_quantize(uint32_t type, const float *x, int64_t nrows, int64_t n_per_row, void *out) {
    const int64_t n = nrows * n_per_row;
    int q[32];
    switch (type) {
    case DS_TYPE_Q4_0:
        for (int64_t i = 0; i < n / 32; i++) {
            ds_block_q4_0 *b = (ds_block_q4_0 *)out + i;
            q_sym(x + 32 * i, 8, &b->d, q);
            pack_nibbles(q, b->qs);
        }
        break;
    case DS_TYPE_Q5_0:
        for (int64_t i = 0; i < n / 32; i++) {
            ds_block_q5_0 *b = (ds_block_q5_0 *)out + i;
            q_sym(x + 32 * i, 16, &b->d, q);
            pack_nibbles(q, b->qs);
            pack_qh(q, b->qh);
        }
        break;
    case DS_TYPE_Q4_1:
        for (int64_t i = 0; i < n / 32; i++) {
            ds_block_q4_1 *b = (ds_block_q4_1 *)out + i;
            q_asym(x + 32 * i, 15, &b->d, &b->m, q);
            pack_nibbles(q, b->qs);
        }
        break;
    case DS_TYPE_Q5_1:
        for (int64_t i = 0; i < n / 32; i++) {
            ds_block_q5_1 *b = (ds_block_q5_1 *)out + i;
            q_asym(x + 32 * i, 31, &b->d, &b->m, q);
            pack_nibbles(q, b->qs);
            pack_qh(q, b->qh);
        }
        break;
    case DS_TYPE_Q4_K:
    case DS_TYPE_Q5_K:
        for (int64_t i = 0; i < n / DS_QK_K; i++) {
            int L[DS_QK_K];
            const float *xb = x + DS_QK_K * i;
            if (type == DS_TYPE_Q4_K) {
                ds_block_q4_K *b = (ds_block_q4_K *)out + i;
                quant_k45(xb, 15, &b->d, &b->dmin, b->scales, L);
                for (int g = 0; g < 4; g++)
                    for (int l = 0; l < 32; l++)
                        b->qs[32 * g + l] = (uint8_t)(L[64 * g + l] | (L[64 * g + 32 + l] << 4));
            } else {
                ds_block_q5_K *b = (ds_block_q5_K *)out + i;
                quant_k45(xb, 31, &b->d, &b->dmin, b->scales, L);
                memset(b->qh, 0, sizeof b->qh);
                for (int g = 0; g < 4; g++)
                    for (int l = 0; l < 32; l++) {
                        const int a = L[64 * g + l], c = L[64 * g + 32 + l];
                        b->qs[32 * g + l] = (uint8_t)((a & 15) | ((c & 15) << 4));
                        b->qh[l] |= (uint8_t)(((a >> 4) << (2 * g)) | ((c >> 4) << (2 * g + 1)));
                    }
            }
        }
        break;
    case DS_TYPE_Q6_K:
        for (int64_t i = 0; i < n / DS_QK_K; i++) quant_q6_k(x + DS_QK_K * i, (ds_block_q6_K *)out + i);
        break;
    default:
        break;
    }
}
