/* matmul_kq.h — the engine the seven kquant matmul families share
 * (matmul_q4_0.c ... matmul_q6_k.c each instantiate it for their type; the
 * "why the bits differ" paragraphs are in those files). Private to
 * src/kernels/cpu; included once per family file.
 *
 * ==== One definition, written as integers plus a fixed f32 epilogue ====================
 * For a weight row n and an activation row m, block b (32 elements for the
 * legacy types, a 256-element super-block for the K types) contributes
 *   I  = an EXACT integer: the block's quant dot, sub-block scales applied
 *        (K types: sum_j sc_j * sum_{l in j} q_l * p_l) with the weight's
 *        zero offset folded in (Q4_0: q - 8, Q5_0: q - 16, Q6_K: q - 32),
 *   and for the types with a min, a second term (F2, G2):
 *        Q4_1 / Q5_1   F2 = m_w (fp16 min),  G2 = e * sum_l p_l (exact: the
 *                      sum has 12 bits, e 11)
 *        Q4_K / Q5_K   F2 = -(float)Mn, Mn = sum_j m_j * (activation sum over
 *                      sub-block j) (exact integer), G2 = dmin_w * e
 * where p are the activation row's quants and e their block scale
 * (matmul.c quantizes the row once per call: Q8_0 blocks for the legacy
 * types, Q8_K super-blocks for the K types). The canonical (= decode)
 * output is, with d_w the weight's block scale:
 *     acc = +0
 *     for b in block order:   acc = fmaf((float)I, d_w * e, acc)
 *                             [acc = fmaf(F2, G2, acc)]          (types with a min)
 *     y = acc   (a NaN result is stored as the one quiet NaN 0x7fc00000)
 * Every rounding is in the epilogue, in one order fixed by K alone. The
 * integer I is exact whatever order its products are summed in, so the
 * SIMD levels (AVX2 maddubs/madd, AVX-512, scalar) and the tile shapes
 * choose how to compute it and never change a bit; the epilogue is the same
 * C code on every level (fmaf is IEEE fusedMultiplyAdd on each). NaN
 * payloads are the one thing an x86 FMA's operand order could change
 * between compilations (malformed blocks with NaN/inf scales), hence the
 * single stored NaN.
 *
 * Fast keeps the same integers and rounds the f32 updates as llama.cpp's
 * vec_dot loops do (the products rounded before they are added, several
 * accumulators, the min terms apart):
 *     accE/accO = acc + ((float)I * d_w) * e     for even/odd blocks
 *     accM      = accM + F2 * G2
 *     y = (accE + accO) + accM
 * Two independent chains (three with a min) instead of one dependent fma
 * chain: shorter latency per output, and other roundings — even a row of
 * one block differs, since its product is rounded twice.
 *
 * ==== Tiles ===============================================================================
 * 8 weight rows x up to 16 activation rows: for each block the 8 rows are
 * unpacked ONCE (quants widened to unsigned bytes, scales to int16 lanes),
 * then every activation row of the tile is dotted with them. Rows past the
 * end repeat the last row (ds_tile_rows) and are not stored. */
#ifndef DSPARK_MATMUL_KQ_H
#define DSPARK_MATMUL_KQ_H

#include "kernels/cpu/matmul_internal.h"

#include <math.h>

#define KQ_NT 8                     /* weight rows per tile   */
static const uint32_t kq_qnan_bits = 0x7fc00000u;   /* the one NaN stored */
#define KQ_MT 64                    /* activation rows per pass */

/* One weight row's block, unpacked. */
typedef struct {
    uint8_t u[DS_QK_K] __attribute__((aligned(64)));  /* unsigned quants             */
    int16_t scv[DS_QK_K / 2] __attribute__((aligned(64))); /* K: per 32-chunk, 16 lanes:
                                                             lanes 0..7 the scale of its
                                                             first 16 elements, 8..15 of
                                                             the second (maddubs pairs) */
    int16_t sc16[16] __attribute__((aligned(32)));    /* K: scale per 16 elements     */
    int16_t mn16[16] __attribute__((aligned(32)));    /* Q4_K/Q5_K: min per 16 elems  */
    float   d, dm;                                    /* d_w; dmin_w (K) or m_w (_1)  */
    uint16_t dh, dmh;                                 /* the same as stored (fp16); the
                                                         AVX2 unpacker sets only these */
} kq_wblk;

/* ---- type traits (constants after inlining) ---------------------------------------- */
DS_INLINE int kq_qk(uint32_t t) { return t == DS_TYPE_Q4_K || t == DS_TYPE_Q5_K || t == DS_TYPE_Q6_K ? DS_QK_K : 32; }
DS_INLINE int kq_is_k(uint32_t t) { return kq_qk(t) == DS_QK_K; }
DS_INLINE int kq_off(uint32_t t) {
    return t == DS_TYPE_Q4_0 ? 8 : t == DS_TYPE_Q5_0 ? 16 : t == DS_TYPE_Q6_K ? 32 : 0;
}
/* 0: no second term; 1: m_w * e * sum(p) (_1 types); 2: -Mn * dmin_w * e (Q4_K/Q5_K) */
DS_INLINE int kq_sec(uint32_t t) {
    return t == DS_TYPE_Q4_1 || t == DS_TYPE_Q5_1 ? 1 : t == DS_TYPE_Q4_K || t == DS_TYPE_Q5_K ? 2 : 0;
}

/* ---- unpacking ----------------------------------------------------------------------- */
DS_INLINE void kq_nib32(const uint8_t *qs, uint8_t *u) {
    for (int l = 0; l < 16; l++) { u[l] = qs[l] & 15; u[l + 16] = qs[l] >> 4; }
}
DS_INLINE void kq_hi32(const uint8_t *qh4, uint8_t *u) {
    uint32_t qh;
    memcpy(&qh, qh4, 4);
    for (int l = 0; l < 32; l++) u[l] |= (uint8_t)(((qh >> l) & 1) << 4);
}
DS_INLINE void kq_scale_min_k4(int j, const uint8_t *q, int *sc, int *m) {
    if (j < 4) {
        *sc = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *sc = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
        *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}
/* The same 8 scales then 8 mins, all at once: the 32-bit mask-and-shift
 * of llama.cpp (the vector paths' form: AVX2 and NEON both read it) */
DS_INLINE void kq_q4k_scales(const uint8_t sc12[12], uint8_t out[16]) {
    uint32_t u[4];
    memcpy(u, sc12, 12);
    const uint32_t k1 = 0x3f3f3f3fu, k2 = 0x0f0f0f0fu, k3 = 0x03030303u;
    u[3] = ((u[2] >> 4) & k2) | (((u[1] >> 6) & k3) << 4);     /* mins 4..7   */
    const uint32_t m03 = u[1] & k1;                             /* mins 0..3   */
    u[1] = (u[2] & k2) | (((u[0] >> 6) & k3) << 4);             /* scales 4..7 */
    u[2] = m03;
    u[0] &= k1;                                                 /* scales 0..3 */
    memcpy(out, u, 16);
}
DS_INLINE void kq_fill_scv(kq_wblk *o) {
    for (int c = 0; c < 8; c++)
        for (int l = 0; l < 16; l++) o->scv[16 * c + l] = o->sc16[2 * c + (l >= 8)];
}

DS_INLINE void kq_unpack(uint32_t t, const void *row, int64_t b, kq_wblk *o) {
    switch (t) {
    case DS_TYPE_Q4_0: {
        const ds_block_q4_0 *x = (const ds_block_q4_0 *)row + b;
        kq_nib32(x->qs, o->u);
        o->d = ds_fp16_to_f32(x->d);
        break;
    }
    case DS_TYPE_Q4_1: {
        const ds_block_q4_1 *x = (const ds_block_q4_1 *)row + b;
        kq_nib32(x->qs, o->u);
        o->d = ds_fp16_to_f32(x->d);
        o->dm = ds_fp16_to_f32(x->m);
        break;
    }
    case DS_TYPE_Q5_0: {
        const ds_block_q5_0 *x = (const ds_block_q5_0 *)row + b;
        kq_nib32(x->qs, o->u);
        kq_hi32(x->qh, o->u);
        o->d = ds_fp16_to_f32(x->d);
        break;
    }
    case DS_TYPE_Q5_1: {
        const ds_block_q5_1 *x = (const ds_block_q5_1 *)row + b;
        kq_nib32(x->qs, o->u);
        kq_hi32(x->qh, o->u);
        o->d = ds_fp16_to_f32(x->d);
        o->dm = ds_fp16_to_f32(x->m);
        break;
    }
    case DS_TYPE_Q4_K:
    case DS_TYPE_Q5_K: {
        const uint8_t *qs, *sc12, *qh = NULL;
        if (t == DS_TYPE_Q4_K) {
            const ds_block_q4_K *x = (const ds_block_q4_K *)row + b;
            qs = x->qs; sc12 = x->scales;
            o->d = ds_fp16_to_f32(x->d);
            o->dm = ds_fp16_to_f32(x->dmin);
        } else {
            const ds_block_q5_K *x = (const ds_block_q5_K *)row + b;
            qs = x->qs; sc12 = x->scales; qh = x->qh;
            o->d = ds_fp16_to_f32(x->d);
            o->dm = ds_fp16_to_f32(x->dmin);
        }
        for (int g = 0; g < 4; g++)
            for (int l = 0; l < 32; l++) {
                o->u[64 * g + l] = qs[32 * g + l] & 15;
                o->u[64 * g + 32 + l] = qs[32 * g + l] >> 4;
            }
        if (qh)
            for (int g = 0; g < 4; g++)
                for (int l = 0; l < 32; l++) {
                    o->u[64 * g + l] |= (uint8_t)(((qh[l] >> (2 * g)) & 1) << 4);
                    o->u[64 * g + 32 + l] |= (uint8_t)(((qh[l] >> (2 * g + 1)) & 1) << 4);
                }
        for (int j = 0; j < 8; j++) {
            int sc, m;
            kq_scale_min_k4(j, sc12, &sc, &m);
            o->sc16[2 * j] = o->sc16[2 * j + 1] = (int16_t)sc;
            o->mn16[2 * j] = o->mn16[2 * j + 1] = (int16_t)m;
        }
        kq_fill_scv(o);
        break;
    }
    case DS_TYPE_Q6_K: {
        const ds_block_q6_K *x = (const ds_block_q6_K *)row + b;
        for (int h = 0; h < 2; h++) {
            const uint8_t *ql = x->ql + 64 * h, *qh = x->qh + 32 * h;
            uint8_t *u = o->u + 128 * h;
            for (int l = 0; l < 32; l++) {
                u[l] = (uint8_t)((ql[l] & 15) | ((qh[l] & 3) << 4));
                u[l + 32] = (uint8_t)((ql[l + 32] & 15) | (((qh[l] >> 2) & 3) << 4));
                u[l + 64] = (uint8_t)((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4));
                u[l + 96] = (uint8_t)((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4));
            }
        }
        for (int j = 0; j < 16; j++) o->sc16[j] = x->scales[j];
        o->d = ds_fp16_to_f32(x->d);
        kq_fill_scv(o);
        break;
    }
    default:
        break;
    }
}

/* ---- the activation side of one (row m, block b) --------------------------------------- */
typedef struct {
    const int8_t  *p;       /* QK quants                                   */
    float          e;       /* block scale                                 */
    int32_t        psum;    /* legacy: sum of the 32 quants                */
    const int16_t *bsums;   /* K: 16 sums of 16 quants                     */
} kq_act;

DS_INLINE kq_act kq_act_at(uint32_t t, const ds_mm_ctx *c, int m, int64_t b) {
    kq_act a;
    if (kq_is_k(t)) {
        const int64_t nsb = c->W->n_in / DS_QK_K, i = (int64_t)m * nsb + b;
        a.p = c->xk->q + i * DS_QK_K;
        a.e = c->xk->d[i];
        a.bsums = c->xk->bsums + i * 16;
        a.psum = 0;
    } else {
        const int64_t nb = c->W->n_in / 32, i = (int64_t)m * nb + b;
        a.p = c->xq->q[i].qs;
        a.e = c->xq->d[i];
        a.psum = c->xq->nsum[i] / -128;
        a.bsums = NULL;
    }
    return a;
}

/* ---- integer parts, portable: I[j] (and Mn[j]) for the 8 unpacked rows ------------------ */
DS_INLINE void kq_ints_scalar(uint32_t t, const kq_wblk *w, const kq_act *a, int32_t I[KQ_NT],
                              int32_t Mn[KQ_NT]) {
    for (int j = 0; j < KQ_NT; j++) {
        int32_t s = 0;
        if (kq_is_k(t)) {
            for (int g = 0; g < 16; g++) {
                int32_t d = 0;
                for (int l = 0; l < 16; l++) d += (int32_t)w[j].u[16 * g + l] * a->p[16 * g + l];
                s += w[j].sc16[g] * (d - kq_off(t) * a->bsums[g]);
            }
            if (kq_sec(t) == 2) {
                int32_t mn = 0;
                for (int g = 0; g < 16; g++) mn += w[j].mn16[g] * a->bsums[g];
                Mn[j] = mn;
            }
        } else {
            for (int l = 0; l < 32; l++) s += (int32_t)w[j].u[l] * a->p[l];
            s -= kq_off(t) * a->psum;
        }
        I[j] = s;
    }
}

#if DS_ARM
/* sum_{g<16} x[g] * (b0, b1)[g]: int16 x int16 products widened (SMULL,
 * SMLAL), exact */
DS_INLINE int32_t kq_dot16s_neon(const int16_t x[16], int16x8_t b0, int16x8_t b1) {
    const int16x8_t x0 = vld1q_s16(x), x1 = vld1q_s16(x + 8);
    int32x4_t s = vmull_s16(vget_low_s16(x0), vget_low_s16(b0));
    s = vmlal_high_s16(s, x0, b0);
    s = vmlal_s16(s, vget_low_s16(x1), vget_low_s16(b1));
    s = vmlal_high_s16(s, x1, b1);
    return vaddvq_s32(s);
}

/* ---- integer parts, AArch64 (neon / dotprod levels): the same integers as
 * kq_ints_scalar. The unpacked quants are at most 6 bits, so they are valid
 * signed bytes and the signed dot (ds_neon_dot16: SDOT, or SMULL + SADALP)
 * gives the exact products; ADDP folds four 16-element groups' lanes into
 * one vector of their four dots, and the K types' scales and offsets are
 * applied lane-wise in int32 (MLA): the same exact integers in another
 * order of addition. */
DS_INLINE void kq_ints_neon(uint32_t t, const kq_wblk *w, const kq_act *a, int32_t I[KQ_NT],
                            int32_t Mn[KQ_NT], int dp) {
    const int32x4_t z = vdupq_n_s32(0);
    if (!kq_is_k(t)) {
        const int8x16_t p0 = vld1q_s8(a->p), p1 = vld1q_s8(a->p + 16);
        for (int j = 0; j < KQ_NT; j++) {
            const int32x4_t s = ds_neon_dot16(ds_neon_dot16(z, vreinterpretq_s8_u8(vld1q_u8(w[j].u)), p0, dp),
                                              vreinterpretq_s8_u8(vld1q_u8(w[j].u + 16)), p1, dp);
            I[j] = vaddvq_s32(s) - kq_off(t) * a->psum;
        }
        return;
    }
    int8x16_t pv[16];
    for (int g = 0; g < 16; g++) pv[g] = vld1q_s8(a->p + 16 * g);
    int32x4_t offv[4];              /* off * bsums, four groups a vector */
    for (int g4 = 0; g4 < 4; g4++) offv[g4] = vmulq_n_s32(vmovl_s16(vld1_s16(a->bsums + 4 * g4)), kq_off(t));
    const int16x8_t bs0 = vld1q_s16(a->bsums), bs1 = vld1q_s16(a->bsums + 8);
    for (int j = 0; j < KQ_NT; j++) {
        int32x4_t tot = z;
        for (int g4 = 0; g4 < 4; g4++) {
            int32x4_t d[4];
            for (int k = 0; k < 4; k++)
                d[k] = ds_neon_dot16(z, vreinterpretq_s8_u8(vld1q_u8(w[j].u + 16 * (4 * g4 + k))), pv[4 * g4 + k], dp);
            const int32x4_t dg = vsubq_s32(vpaddq_s32(vpaddq_s32(d[0], d[1]), vpaddq_s32(d[2], d[3])), offv[g4]);
            tot = vmlaq_s32(tot, vmovl_s16(vld1_s16(w[j].sc16 + 4 * g4)), dg);
        }
        I[j] = vaddvq_s32(tot);
        if (kq_sec(t) == 2) Mn[j] = kq_dot16s_neon(w[j].mn16, bs0, bs1);
    }
}

/* ---- integer parts, AArch64 i8mm: the same integers for TWO activation rows
 * a[0], a[1] at once. SMMLA (ds_neon_mmla) of the pair's 8-quant halves
 * (ds_neon_zip2x8) against weight rows (j, j+1) gives per 16-element group
 * the 2 x 2 block [a0.wj, a0.wj+1, a1.wj, a1.wj+1] of exact dots; the legacy
 * types sum their two groups and subtract off * psum per row, the K types
 * scale each group's block lane-wise by [sc_j, sc_j+1, sc_j, sc_j+1]
 * (kq_scpair_neon) with MLA and subtract off * sum_g sc_g * bsums_g (an
 * exact int16 dot, kq_dot16s_neon) once at the end: the definition's
 * integers, regrouped. */
DS_INLINE void kq_scpair_neon(const int16_t s0[16], const int16_t s1[16], int32x4_t out[16]) {
    DS_UNROLL
    for (int h = 0; h < 2; h++) {
        const int16x8_t x0 = vld1q_s16(s0 + 8 * h), x1 = vld1q_s16(s1 + 8 * h);
        /* (s0[g], s1[g]) pairs as 32-bit lanes, groups 8h + 4q .. 8h + 4q + 3 */
        const int16x8_t z[2] = {vzip1q_s16(x0, x1), vzip2q_s16(x0, x1)};
        DS_UNROLL
        for (int q = 0; q < 2; q++) {
            const int32x4_t pr = vreinterpretq_s32_s16(z[q]);
            const int16x8_t lo = vreinterpretq_s16_s32(vzip1q_s32(pr, pr)), hi = vreinterpretq_s16_s32(vzip2q_s32(pr, pr));
            int32x4_t *o = out + 8 * h + 4 * q;
            o[0] = vmovl_s16(vget_low_s16(lo));
            o[1] = vmovl_high_s16(lo);
            o[2] = vmovl_s16(vget_low_s16(hi));
            o[3] = vmovl_high_s16(hi);
        }
    }
}
DS_INLINE void kq_ints_mmla2(uint32_t t, const kq_wblk *w, const kq_act a[2], int32_t I[2][KQ_NT],
                             int32_t Mn[2][KQ_NT]) {
    const int G = kq_qk(t) / 16;                /* 16-element groups */
    const int32x4_t z = vdupq_n_s32(0);
    int8x16_t pv[DS_QK_K / 16][2];
    for (int g = 0; g < G; g++)
        ds_neon_zip2x8(vld1q_s8(a[0].p + 16 * g), vld1q_s8(a[1].p + 16 * g), &pv[g][0], &pv[g][1]);
    int16x8_t bs[2][2] = {{vdupq_n_s16(0), vdupq_n_s16(0)}, {vdupq_n_s16(0), vdupq_n_s16(0)}};
    if (kq_is_k(t))
        for (int r = 0; r < 2; r++) {
            bs[r][0] = vld1q_s16(a[r].bsums);
            bs[r][1] = vld1q_s16(a[r].bsums + 8);
        }
    for (int j = 0; j < KQ_NT; j += 2) {
        int32x4_t scv[DS_QK_K / 16];
        if (kq_is_k(t)) kq_scpair_neon(w[j].sc16, w[j + 1].sc16, scv);
        int32x4_t tot = z;
        for (int g = 0; g < G; g++) {
            int8x16_t wlo, whi;
            ds_neon_zip2x8(vreinterpretq_s8_u8(vld1q_u8(w[j].u + 16 * g)),
                           vreinterpretq_s8_u8(vld1q_u8(w[j + 1].u + 16 * g)), &wlo, &whi);
            const int32x4_t D = ds_neon_mmla(ds_neon_mmla(z, pv[g][0], wlo), pv[g][1], whi);
            tot = kq_is_k(t) ? vmlaq_s32(tot, scv[g], D) : vaddq_s32(tot, D);
        }
        int32_t d[4];
        vst1q_s32(d, tot);
        for (int r = 0; r < 2; r++)
            for (int e = 0; e < 2; e++) {
                const kq_wblk *wj = &w[j + e];
                int32_t off = kq_off(t) * a[r].psum;
                if (kq_is_k(t)) off = kq_off(t) ? kq_off(t) * kq_dot16s_neon(wj->sc16, bs[r][0], bs[r][1]) : 0;
                I[r][j + e] = d[2 * r + e] - off;
                if (kq_sec(t) == 2) Mn[r][j + e] = kq_dot16s_neon(wj->mn16, bs[r][0], bs[r][1]);
            }
    }
}

/* The integers of activation rows m, m + 1 (i8mm, two rows left) or of row m
 * alone into a[] / I[] / Mn[]; returns how many rows (1 or 2). */
DS_INLINE int kq_ints_rows_neon(uint32_t t, const ds_mm_ctx *c, const kq_wblk *w, int m, int left, int64_t b,
                                int dp, kq_act a[2], int32_t I[2][KQ_NT], int32_t Mn[2][KQ_NT]) {
    a[0] = kq_act_at(t, c, m, b);
    if (dp && c->i8mm && left >= 2) {
        a[1] = kq_act_at(t, c, m + 1, b);
        kq_ints_mmla2(t, w, a, I, Mn);
        return 2;
    }
    kq_ints_neon(t, w, &a[0], I[0], Mn[0], dp);
    return 1;
}
/* the K types' NEON unpacking, fused and epilogue blocks */
#include "kernels/cpu/matmul_kq_neon.h"
#endif

#if DS_X86
#include <immintrin.h>
/* 8 vectors of 8 int32 -> one vector of their 8 totals (exact integers) */
#define KQ_HSUM8(v, out)                                                                    \
    do {                                                                                    \
        const __m256i e_ = _mm256_hadd_epi32(_mm256_hadd_epi32(v[0], v[1]),                 \
                                             _mm256_hadd_epi32(v[2], v[3]));                \
        const __m256i f_ = _mm256_hadd_epi32(_mm256_hadd_epi32(v[4], v[5]),                 \
                                             _mm256_hadd_epi32(v[6], v[7]));                \
        out = _mm256_add_epi32(_mm256_permute2x128_si256(e_, f_, 0x20),                     \
                               _mm256_permute2x128_si256(e_, f_, 0x31));                    \
    } while (0)

/* AVX2 unpacking: the same bytes as kq_unpack, with vector shifts and masks
 * (the scalar loops compile to byte inserts that stall on store forwarding;
 * unpacking is half the work of a decode-time block dot). */
#define KQ_TGT_AVX2 __attribute__((target("avx2,fma,f16c")))
static inline KQ_TGT_AVX2 __m256i kq_nib_lohi(const uint8_t *qs16) {   /* 16 bytes -> 32 nibbles */
    const __m128i q = _mm_loadu_si128((const __m128i *)qs16), m = _mm_set1_epi8(15);
    return _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(q, 4), m), _mm_and_si128(q, m));
}
static inline KQ_TGT_AVX2 __m256i kq_bits32(const uint8_t *qh4) {       /* bit j -> 0x10 in byte j */
    uint32_t qh;
    memcpy(&qh, qh4, 4);
    const __m256i shuf = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1,
                                          2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
    const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ull);
    const __m256i b = _mm256_shuffle_epi8(_mm256_set1_epi32((int)qh), shuf);
    return _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(b, bit), bit), _mm256_set1_epi8(0x10));
}
static inline KQ_TGT_AVX2 void kq_fill_scv_avx2(kq_wblk *o) {
    for (int c = 0; c < 8; c++)
        _mm256_store_si256((__m256i *)(o->scv + 16 * c),
                           _mm256_set_m128i(_mm_set1_epi16(o->sc16[2 * c + 1]), _mm_set1_epi16(o->sc16[2 * c])));
}
static inline KQ_TGT_AVX2 void kq_unpack_avx2(uint32_t t, const void *row, int64_t b, kq_wblk *o) {
    const __m256i m4 = _mm256_set1_epi8(15);
    switch (t) {
    case DS_TYPE_Q4_0: case DS_TYPE_Q4_1: case DS_TYPE_Q5_0: case DS_TYPE_Q5_1: {
        const uint8_t *qs, *qh = NULL;
        uint16_t d, m = 0;
        if (t == DS_TYPE_Q4_0) { const ds_block_q4_0 *x = (const ds_block_q4_0 *)row + b; qs = x->qs; d = x->d; }
        else if (t == DS_TYPE_Q4_1) { const ds_block_q4_1 *x = (const ds_block_q4_1 *)row + b; qs = x->qs; d = x->d; m = x->m; }
        else if (t == DS_TYPE_Q5_0) { const ds_block_q5_0 *x = (const ds_block_q5_0 *)row + b; qs = x->qs; qh = x->qh; d = x->d; }
        else { const ds_block_q5_1 *x = (const ds_block_q5_1 *)row + b; qs = x->qs; qh = x->qh; d = x->d; m = x->m; }
        __m256i u = kq_nib_lohi(qs);
        if (qh) u = _mm256_or_si256(u, kq_bits32(qh));
        _mm256_store_si256((__m256i *)o->u, u);
        o->dh = d;
        o->dmh = m;
        break;
    }
    case DS_TYPE_Q4_K: case DS_TYPE_Q5_K: {
        const uint8_t *qs, *sc12, *qh = NULL;
        if (t == DS_TYPE_Q4_K) {
            const ds_block_q4_K *x = (const ds_block_q4_K *)row + b;
            qs = x->qs; sc12 = x->scales;
            o->dh = x->d;
            o->dmh = x->dmin;
        } else {
            const ds_block_q5_K *x = (const ds_block_q5_K *)row + b;
            qs = x->qs; sc12 = x->scales; qh = x->qh;
            o->dh = x->d;
            o->dmh = x->dmin;
        }
        const __m256i H = qh ? _mm256_loadu_si256((const __m256i *)qh) : _mm256_setzero_si256();
        const __m256i one = _mm256_set1_epi8(1);
        for (int g = 0; g < 4; g++) {
            const __m256i q = _mm256_loadu_si256((const __m256i *)(qs + 32 * g));
            __m256i lo = _mm256_and_si256(q, m4), hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
            if (qh) {
                const __m256i hs = _mm256_srl_epi16(H, _mm_cvtsi32_si128(2 * g));
                lo = _mm256_or_si256(lo, _mm256_slli_epi16(_mm256_and_si256(hs, one), 4));
                hi = _mm256_or_si256(hi, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hs, 1), one), 4));
            }
            _mm256_store_si256((__m256i *)(o->u + 64 * g), lo);
            _mm256_store_si256((__m256i *)(o->u + 64 * g + 32), hi);
        }
        for (int j = 0; j < 8; j++) {
            int sc, m;
            kq_scale_min_k4(j, sc12, &sc, &m);
            o->sc16[2 * j] = o->sc16[2 * j + 1] = (int16_t)sc;
            o->mn16[2 * j] = o->mn16[2 * j + 1] = (int16_t)m;
        }
        kq_fill_scv_avx2(o);
        break;
    }
    case DS_TYPE_Q6_K: {
        const ds_block_q6_K *x = (const ds_block_q6_K *)row + b;
        const __m256i m2 = _mm256_set1_epi8(3);
        for (int h = 0; h < 2; h++) {
            const __m256i l0 = _mm256_loadu_si256((const __m256i *)(x->ql + 64 * h));
            const __m256i l1 = _mm256_loadu_si256((const __m256i *)(x->ql + 64 * h + 32));
            const __m256i qh = _mm256_loadu_si256((const __m256i *)(x->qh + 32 * h));
            uint8_t *u = o->u + 128 * h;
#define KQ_H2(s) _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, s), m2), 4)
            _mm256_store_si256((__m256i *)u, _mm256_or_si256(_mm256_and_si256(l0, m4), KQ_H2(0)));
            _mm256_store_si256((__m256i *)(u + 32), _mm256_or_si256(_mm256_and_si256(l1, m4), KQ_H2(2)));
            _mm256_store_si256((__m256i *)(u + 64),
                               _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), m4), KQ_H2(4)));
            _mm256_store_si256((__m256i *)(u + 96),
                               _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), m4), KQ_H2(6)));
#undef KQ_H2
        }
        _mm256_store_si256((__m256i *)o->sc16,
                           _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)x->scales)));
        o->dh = x->d;
        o->dmh = 0;
        kq_fill_scv_avx2(o);
        break;
    }
    default:
        break;
    }
}

/* AVX2 (also run by the AVX-512 level): maddubs of the unsigned weight
 * quants (<= 63) with the signed activation quants (|p| <= 127; a pair sum
 * is at most 16002, no int16 saturation), madd with the int16 scales (or
 * ones), int32 lanes accumulated over the block, one hadd tree for 8 rows. */
static inline KQ_TGT_AVX2 void kq_ints_avx2(uint32_t t, const kq_wblk *w, const kq_act *a, int32_t I[KQ_NT],
                            int32_t Mn[KQ_NT]) {
    __m256i v[KQ_NT], tot;
    if (kq_is_k(t)) {
        __m256i P[8];
        for (int c = 0; c < 8; c++) P[c] = _mm256_loadu_si256((const __m256i *)(a->p + 32 * c));
        const __m256i bs = _mm256_loadu_si256((const __m256i *)a->bsums);
        for (int j = 0; j < KQ_NT; j++) {
            __m256i acc = _mm256_setzero_si256();
            for (int c = 0; c < 8; c++) {
                const __m256i u = _mm256_load_si256((const __m256i *)(w[j].u + 32 * c));
                const __m256i sc = _mm256_load_si256((const __m256i *)(w[j].scv + 16 * c));
                acc = _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(u, P[c]), sc));
            }
            if (kq_off(t)) {
                const __m256i corr = _mm256_madd_epi16(_mm256_load_si256((const __m256i *)w[j].sc16), bs);
                acc = _mm256_sub_epi32(acc, _mm256_mullo_epi32(corr, _mm256_set1_epi32(kq_off(t))));
            }
            v[j] = acc;
        }
        KQ_HSUM8(v, tot);
        _mm256_storeu_si256((__m256i *)I, tot);
        if (kq_sec(t) == 2) {
            for (int j = 0; j < KQ_NT; j++)
                v[j] = _mm256_madd_epi16(_mm256_load_si256((const __m256i *)w[j].mn16), bs);
            KQ_HSUM8(v, tot);
            _mm256_storeu_si256((__m256i *)Mn, tot);
        }
    } else {
        const __m256i P = _mm256_loadu_si256((const __m256i *)a->p), ones = _mm256_set1_epi16(1);
        for (int j = 0; j < KQ_NT; j++)
            v[j] = _mm256_madd_epi16(
                _mm256_maddubs_epi16(_mm256_load_si256((const __m256i *)w[j].u), P), ones);
        KQ_HSUM8(v, tot);
        if (kq_off(t)) tot = _mm256_sub_epi32(tot, _mm256_set1_epi32(kq_off(t) * a->psum));
        _mm256_storeu_si256((__m256i *)I, tot);
    }
}

/* The f32 epilogue of one activation row and 8 weight rows on AVX2 (the
 * unpacking and the fused blocks share it): lane j performs exactly the
 * scalar epilogue's operations (int -> f32 conversion, products, fma / add:
 * IEEE, one rounding each), so it is the same bits as the portable loop.
 * tI / tM: the 8 rows' I and Mn; dv / mv: their d_w and m_w / dmin_w. */
static inline __attribute__((always_inline)) KQ_TGT_AVX2 void
kq_epi_avx2(uint32_t t, int fast, int64_t b, const kq_act *a, __m256i tI, __m256i tM, __m256 dv, __m256 mv,
            float *acc, float *acc2, float *acc3) {
    const __m256 fi = _mm256_cvtepi32_ps(tI);
    const __m256 ev = _mm256_set1_ps(a->e);
    float *A = fast && (b & 1) ? acc2 : acc;
    __m256 av = _mm256_loadu_ps(A);
    if (!fast) av = _mm256_fmadd_ps(fi, _mm256_mul_ps(dv, ev), av);
    else av = _mm256_add_ps(av, _mm256_mul_ps(_mm256_mul_ps(fi, dv), ev));
    _mm256_storeu_ps(A, av);
    if (kq_sec(t)) {
        float *S = fast ? acc3 : acc;
        __m256 F2, G2;
        if (kq_sec(t) == 1) {
            F2 = mv;
            G2 = _mm256_set1_ps((float)a->psum * a->e);
        } else {
            F2 = _mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_setzero_si256(), tM));
            G2 = _mm256_mul_ps(mv, ev);
        }
        __m256 sv = _mm256_loadu_ps(S);
        sv = fast ? _mm256_add_ps(sv, _mm256_mul_ps(F2, G2)) : _mm256_fmadd_ps(F2, G2, sv);
        _mm256_storeu_ps(S, sv);
    }
}

/* ---- AVX2, few activation rows, Q4_K / Q6_K: unpack fused into the dot ---------------
 * With one or two activation rows the unpacked block (kq_wblk: 256 quant
 * bytes, 128 int16 scale lanes, stored and loaded back) is used once or
 * twice, and storing it costs as much as the dot. Here each 32-quant chunk
 * is split into its nibbles (Q6_K: plus its two high bits) in registers and
 * fed straight to maddubs/madd with the activation chunk; the Q4_K scales
 * and mins come out of their 12 bytes with the usual 32-bit mask-and-shift
 * (8 scale bytes, then 8 min bytes). The integers are the definition's: the
 * same products and sums as kq_ints_scalar, grouped otherwise (exact). */
/* one weight row's super-block b against one activation row: 8 int32 lanes
 * summing to I, and (Q4_K) 8 summing to Mn; dh / dmh: the fp16 scales */
static inline KQ_TGT_AVX2 void kq_fused_avx2(uint32_t t, const void *row, int64_t b, const __m256i P[8],
                                             __m256i bs, __m256i *vI, __m256i *vM, uint16_t *dh,
                                             uint16_t *dmh) {
    const __m256i m4 = _mm256_set1_epi8(15);
    __m256i acc = _mm256_setzero_si256();
    if (t == DS_TYPE_Q4_K) {
        const ds_block_q4_K *x = (const ds_block_q4_K *)row + b;
        uint8_t sm[16];
        kq_q4k_scales(x->scales, sm);
        for (int g = 0; g < 4; g++) {
            const __m256i q = _mm256_loadu_si256((const __m256i *)(x->qs + 32 * g));
            const __m256i lo = _mm256_and_si256(q, m4), hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
            acc = _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(lo, P[2 * g]),
                                                          _mm256_set1_epi16(sm[2 * g])));
            acc = _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(hi, P[2 * g + 1]),
                                                          _mm256_set1_epi16(sm[2 * g + 1])));
        }
        /* mins per 16 elements: each min twice (the bsums are per 16) */
        const __m128i m8 = _mm_cvtepu8_epi16(_mm_loadl_epi64((const __m128i *)(sm + 8)));
        const __m256i mn16 = _mm256_set_m128i(_mm_unpackhi_epi16(m8, m8), _mm_unpacklo_epi16(m8, m8));
        *vM = _mm256_madd_epi16(mn16, bs);
        *dh = x->d;
        *dmh = x->dmin;
    } else {                                    /* Q6_K */
        const ds_block_q6_K *x = (const ds_block_q6_K *)row + b;
        const __m256i m2 = _mm256_set1_epi8(3);
        int16_t sc[16];
        const __m256i s16 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)x->scales));
        _mm256_storeu_si256((__m256i *)sc, s16);
        for (int h = 0; h < 2; h++) {
            const __m256i l0 = _mm256_loadu_si256((const __m256i *)(x->ql + 64 * h));
            const __m256i l1 = _mm256_loadu_si256((const __m256i *)(x->ql + 64 * h + 32));
            const __m256i qh = _mm256_loadu_si256((const __m256i *)(x->qh + 32 * h));
#define KQ_H2(s) _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, s), m2), 4)
            const __m256i u[4] = {
                _mm256_or_si256(_mm256_and_si256(l0, m4), KQ_H2(0)),
                _mm256_or_si256(_mm256_and_si256(l1, m4), KQ_H2(2)),
                _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), m4), KQ_H2(4)),
                _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), m4), KQ_H2(6))};
#undef KQ_H2
            for (int k = 0; k < 4; k++) {
                const int c = 4 * h + k;
                const __m256i scv = _mm256_set_m128i(_mm_set1_epi16(sc[2 * c + 1]), _mm_set1_epi16(sc[2 * c]));
                acc = _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(u[k], P[c]), scv));
            }
        }
        /* the offset: 32 * sum_g sc_g * bsum_g, as kq_ints_avx2 */
        acc = _mm256_sub_epi32(acc, _mm256_slli_epi32(_mm256_madd_epi16(s16, bs), 5));
        *vM = _mm256_setzero_si256();
        *dh = x->d;
        *dmh = 0;
    }
    *vI = acc;
}

/* The fused block for rows m0 .. m0 + mb - 1 (the f32 epilogue as KQ_BLOCK_BODY's).
 * Out of line (one instance per type and variant, below): inlined into the
 * walker it changed the register allocation of the unpacking path beside it
 * (the 8-row Q6_K verify measured ~10% slower). */
static inline __attribute__((always_inline)) KQ_TGT_AVX2 void
kq_block_fused_body(uint32_t t, int fast, const ds_mm_ctx *c, const void *const wr[], int64_t b, int m0, int mb,
                    float (*acc)[KQ_NT], float (*acc2)[KQ_NT], float (*acc3)[KQ_NT]) {
    for (int i = 0; i < mb; i++) {
        const kq_act a = kq_act_at(t, c, m0 + i, b);
        __m256i P[8], vI[KQ_NT], vM[KQ_NT], tI, tM;
        for (int k = 0; k < 8; k++) P[k] = _mm256_loadu_si256((const __m256i *)(a.p + 32 * k));
        const __m256i bs = _mm256_loadu_si256((const __m256i *)a.bsums);
        uint16_t dh[KQ_NT], mh[KQ_NT];
        for (int j = 0; j < KQ_NT; j++) kq_fused_avx2(t, wr[j], b, P, bs, &vI[j], &vM[j], &dh[j], &mh[j]);
        KQ_HSUM8(vI, tI);
        if (kq_sec(t) == 2) KQ_HSUM8(vM, tM);
        else tM = _mm256_setzero_si256();
        kq_epi_avx2(t, fast, b, &a, tI, tM, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)dh)),
                    _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)mh)), acc[i], acc2[i], acc3[i]);
    }
}
#define KQ_FUSED_FN(name, T, F)                                                               \
    static __attribute__((noinline)) KQ_TGT_AVX2 void name(const ds_mm_ctx *c, const void *const wr[], int64_t b, \
                                                           int m0, int mb, float (*acc)[KQ_NT],         \
                                                           float (*acc2)[KQ_NT], float (*acc3)[KQ_NT]) { \
        kq_block_fused_body(T, F, c, wr, b, m0, mb, acc, acc2, acc3);                             \
    }
/* the family files of Q4_K and Q6_K define KQ_FUSED_TYPE before including this */
#ifdef KQ_FUSED_TYPE
KQ_FUSED_FN(kq_fused_canon, KQ_FUSED_TYPE, 0)
KQ_FUSED_FN(kq_fused_fast, KQ_FUSED_TYPE, 1)
#endif
/* Up to this many activation rows the fused block runs (AVX2 and AVX-512):
 * Q4_K's unpacking (the 6-bit scales and mins) is the dearer one and pays
 * off to two rows on both; Q6_K's only for decode on AVX2
 * (bench/results/cpu-kq-fused-ab.txt). */
#ifndef KQ_FUSED_MAX_M
#define KQ_FUSED_MAX_M 2
#endif
DS_INLINE int kq_fused_rows(uint32_t t, int lv) {
    if (t == DS_TYPE_Q4_K) return KQ_FUSED_MAX_M;
    /* Q6_K at AVX-512 VNNI: no clear gain measured, the VNNI block stays */
    if (t == DS_TYPE_Q6_K && lv == DS_LVL_AVX2) return KQ_FUSED_MAX_M < 1 ? KQ_FUSED_MAX_M : 1;
    return 0;
}

/* One block of the tile on AVX2: unpack the 8 weight rows, then for each
 * activation row the exact integers and the f32 epilogue as 8-lane vector
 * operations — lane j performs exactly the scalar epilogue's operations
 * (int -> f32 conversion, products, fma / add: IEEE, one rounding each), so
 * it is the same bits as the portable loop. The fp16 scales are widened with
 * VCVTPH2PS (exact; NaN payloads may differ from the software converter,
 * but every NaN output is stored as the one quiet NaN). */
/* The block body, instantiated for AVX2 and for AVX-512 + VNNI (its integer
 * part: INTS). */
#define KQ_BLOCK_BODY(INTS)                                                                  \
    uint16_t dh[KQ_NT], mh[KQ_NT];                                                           \
    for (int j = 0; j < KQ_NT; j++) {                                                        \
        kq_unpack_avx2(t, wr[j], b, &wb[j]);                                                 \
        dh[j] = wb[j].dh;                                                                    \
        mh[j] = wb[j].dmh;                                                                   \
    }                                                                                        \
    const __m256 dv = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)dh));                 \
    const __m256 mv = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)mh));                 \
    for (int i = 0; i < mb; i++) {                                                           \
        const kq_act a = kq_act_at(t, c, m0 + i, b);                                         \
        int32_t I[KQ_NT], Mn[KQ_NT];                                                         \
        INTS(t, wb, &a, I, Mn);                                                              \
        kq_epi_avx2(t, fast, b, &a, _mm256_loadu_si256((const __m256i *)I),                   \
                    kq_sec(t) == 2 ? _mm256_loadu_si256((const __m256i *)Mn) : _mm256_setzero_si256(), \
                    dv, mv, acc[i], acc2[i], acc3[i]);                                       \
    }

#define KQ_BLOCK_ARGS uint32_t t, int fast, const ds_mm_ctx *c, const void *const wr[], int64_t b, \
                      kq_wblk wb[], int m0, int mb, float (*acc)[KQ_NT], float (*acc2)[KQ_NT],      \
                      float (*acc3)[KQ_NT]
static inline KQ_TGT_AVX2 void kq_block_avx2(KQ_BLOCK_ARGS) { KQ_BLOCK_BODY(kq_ints_avx2) }

/* AVX-512 with VNNI: the same integers with fewer instructions — legacy
 * blocks as one VPDPBUSD (unsigned weight quants x signed activation
 * quants, four products per lane) per row, K super-blocks as 512-bit
 * maddubs/madd over two 32-element chunks at a time. */
#define KQ_TGT_VNNI __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")))
static inline KQ_TGT_VNNI void kq_ints_vnni(uint32_t t, const kq_wblk *w, const kq_act *a, int32_t I[KQ_NT],
                                            int32_t Mn[KQ_NT]) {
    __m256i v[KQ_NT], tot;
    if (kq_is_k(t)) {
        __m512i P[4];
        for (int c2 = 0; c2 < 4; c2++) P[c2] = _mm512_loadu_si512((const void *)(a->p + 64 * c2));
        const __m256i bs = _mm256_loadu_si256((const __m256i *)a->bsums);
        for (int j = 0; j < KQ_NT; j++) {
            __m512i acc = _mm512_setzero_si512();
            for (int c2 = 0; c2 < 4; c2++) {
                const __m512i u = _mm512_load_si512((const void *)(w[j].u + 64 * c2));
                const __m512i sc = _mm512_load_si512((const void *)(w[j].scv + 32 * c2));
                acc = _mm512_add_epi32(acc, _mm512_madd_epi16(_mm512_maddubs_epi16(u, P[c2]), sc));
            }
            __m256i r = _mm256_add_epi32(_mm512_castsi512_si256(acc), _mm512_extracti64x4_epi64(acc, 1));
            if (kq_off(t)) {
                const __m256i corr = _mm256_madd_epi16(_mm256_load_si256((const __m256i *)w[j].sc16), bs);
                r = _mm256_sub_epi32(r, _mm256_slli_epi32(corr, 5));        /* Q6_K: offset 32 */
            }
            v[j] = r;
        }
        KQ_HSUM8(v, tot);
        _mm256_storeu_si256((__m256i *)I, tot);
        if (kq_sec(t) == 2) {
            for (int j = 0; j < KQ_NT; j++)
                v[j] = _mm256_madd_epi16(_mm256_load_si256((const __m256i *)w[j].mn16), bs);
            KQ_HSUM8(v, tot);
            _mm256_storeu_si256((__m256i *)Mn, tot);
        }
    } else {
        const __m256i P = _mm256_loadu_si256((const __m256i *)a->p);
        for (int j = 0; j < KQ_NT; j++)
            v[j] = _mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm256_load_si256((const __m256i *)w[j].u), P);
        KQ_HSUM8(v, tot);
        if (kq_off(t)) tot = _mm256_sub_epi32(tot, _mm256_set1_epi32(kq_off(t) * a->psum));
        _mm256_storeu_si256((__m256i *)I, tot);
    }
}
static inline KQ_TGT_VNNI void kq_block_vnni(KQ_BLOCK_ARGS) { KQ_BLOCK_BODY(kq_ints_vnni) }

/* ---- legacy types, M >= KQ_TILE16_MIN_M: the transposed VNNI tile ----------------------
 * 16 weight rows per tile: each row's block is unpacked to 32 unsigned
 * bytes, then the 16 x 8 dwords are transposed (the layout of the Q8_0 tile,
 * matmul_q8_0.c) so that vector s holds dword s of the 16 rows, one row per
 * 32-bit lane. For an activation row, VPDPBUSD of vector s with dword s of
 * its quants broadcast gives in lane j four products of row j; eight of them
 * give the exact I of 16 outputs at once — no horizontal sums — and the f32
 * epilogue runs on 16 lanes with the scalar loop's operations lane by lane:
 * the same bits as every other path. */
/* 16 rows' 32-byte chunks (wb[j].u + off) -> T[s], lane j = dword s of row j
 * (the 16 x 8 dword transpose of the Q8_0 tile, matmul_q8_0.c) */
static inline KQ_TGT_VNNI void kq_transpose16(const kq_wblk wb[16], int off, __m512i T[8]) {
    const __m512i lo = _mm512_setr_epi64(0, 1, 8, 9, 4, 5, 12, 13);
    const __m512i hi = _mm512_setr_epi64(2, 3, 10, 11, 6, 7, 14, 15);
    __m512i z[8], tt[8], u[8];
    for (int q = 0; q < 8; q++)
        z[q] = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_load_si256((const __m256i *)(wb[q].u + off))),
                                  _mm256_load_si256((const __m256i *)(wb[q + 8].u + off)), 1);
    for (int q = 0; q < 4; q++) {
        tt[2 * q] = _mm512_unpacklo_epi32(z[2 * q], z[2 * q + 1]);
        tt[2 * q + 1] = _mm512_unpackhi_epi32(z[2 * q], z[2 * q + 1]);
    }
    for (int g = 0; g < 2; g++) {
        u[4 * g + 0] = _mm512_unpacklo_epi64(tt[4 * g], tt[4 * g + 2]);
        u[4 * g + 1] = _mm512_unpackhi_epi64(tt[4 * g], tt[4 * g + 2]);
        u[4 * g + 2] = _mm512_unpacklo_epi64(tt[4 * g + 1], tt[4 * g + 3]);
        u[4 * g + 3] = _mm512_unpackhi_epi64(tt[4 * g + 1], tt[4 * g + 3]);
    }
    for (int q = 0; q < 4; q++) {
        T[q] = _mm512_permutex2var_epi64(u[q], lo, u[4 + q]);
        T[q + 4] = _mm512_permutex2var_epi64(u[q], hi, u[4 + q]);
    }
}

/* zero the accumulators of a pass / store its outputs (NaN -> the one NaN) */
static inline KQ_TGT_VNNI void kq_acc16_zero(float (*acc)[16], float (*acc2)[16], float (*acc3)[16], int mb) {
    for (int i = 0; i < mb; i++) {
        _mm512_store_ps(acc[i], _mm512_setzero_ps());
        _mm512_store_ps(acc2[i], _mm512_setzero_ps());
        _mm512_store_ps(acc3[i], _mm512_setzero_ps());
    }
}
static inline void kq_acc16_store(const ds_mm_ctx *c, int fast, float (*acc)[16], float (*acc2)[16],
                                  float (*acc3)[16], int m0, int mb, int64_t n, int nv) {
    for (int i = 0; i < mb; i++)
        for (int j = 0; j < nv; j++) {
            float y = fast ? (acc[i][j] + acc2[i][j]) + acc3[i][j] : acc[i][j];
            if (y != y) y = ds_bits_f32(kq_qnan_bits);
            c->y[(size_t)(m0 + i) * (size_t)c->W->n_out + (size_t)(n + j)] = y;
        }
}

#define KQ_TILE16_MIN_M 4
#define KQ_TILE16K_MIN_M 16         /* K types: the per-super-block scale transposition pays from here */
static inline KQ_TGT_VNNI void kq_tile16_vnni(uint32_t t, int fast, const ds_mm_ctx *c, int64_t n0, int64_t n1) {
    const int64_t K = c->W->n_in, nb = K / 32;
    const size_t wrow = (size_t)nb * ds_type_block_bytes(t);
    kq_wblk wb[16];
    float acc[KQ_MT][16] __attribute__((aligned(64))), acc2[KQ_MT][16] __attribute__((aligned(64)));
    float acc3[KQ_MT][16] __attribute__((aligned(64)));
    for (int64_t n = n0; n < n1; n += 16) {
        const int nv = (int)(n1 - n < 16 ? n1 - n : 16);
        const void *wr[16];
        ds_tile_rows(c->W->data, wrow, n, nv, 16, wr);
        for (int m0 = 0; m0 < c->M; m0 += KQ_MT) {
            const int mb = c->M - m0 < KQ_MT ? c->M - m0 : KQ_MT;
            kq_acc16_zero(acc, acc2, acc3, mb);
            for (int64_t b = 0; b < nb; b++) {
                uint16_t dh[16], mh[16];
                for (int j = 0; j < 16; j++) {
                    kq_unpack_avx2(t, wr[j], b, &wb[j]);
                    dh[j] = wb[j].dh;
                    mh[j] = wb[j].dmh;
                }
                __m512i T[8];
                kq_transpose16(wb, 0, T);
                const __m512 dv = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)dh));
                const __m512 mv = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)mh));
                for (int i = 0; i < mb; i++) {
                    const kq_act a = kq_act_at(t, c, m0 + i, b);
                    __m512i D = _mm512_set1_epi32(-kq_off(t) * a.psum);
                    for (int q = 0; q < 8; q++) {
                        int32_t pd;
                        memcpy(&pd, a.p + 4 * q, 4);
                        D = _mm512_dpbusd_epi32(D, T[q], _mm512_set1_epi32(pd));
                    }
                    const __m512 fi = _mm512_cvtepi32_ps(D), ev = _mm512_set1_ps(a.e);
                    float *A = fast && (b & 1) ? acc2[i] : acc[i];
                    __m512 av = _mm512_load_ps(A);
                    if (!fast) av = _mm512_fmadd_ps(fi, _mm512_mul_ps(dv, ev), av);
                    else av = _mm512_add_ps(av, _mm512_mul_ps(_mm512_mul_ps(fi, dv), ev));
                    _mm512_store_ps(A, av);
                    if (kq_sec(t) == 1) {
                        float *S = fast ? acc3[i] : acc[i];
                        const __m512 G2 = _mm512_set1_ps((float)a.psum * a.e);
                        __m512 sv = _mm512_load_ps(S);
                        sv = fast ? _mm512_add_ps(sv, _mm512_mul_ps(mv, G2)) : _mm512_fmadd_ps(mv, G2, sv);
                        _mm512_store_ps(S, sv);
                    }
                }
            }
            kq_acc16_store(c, fast, acc, acc2, acc3, m0, mb, n, nv);
        }
    }
}

/* ---- K types, M >= KQ_TILE16_MIN_M: the same transposed tile per 32-element chunk ----------
 * Chunk c of the super-block (sub-block c of Q4_K / Q5_K, sub-blocks 2c and
 * 2c+1 of Q6_K) is transposed like a legacy block; its dots, exact int32
 * per lane, are multiplied by the 16 rows' scales of the sub-block
 * (VPMULLD) and summed into the row's S; the offset (Q6_K: 32 * sum_g sc_g
 * * bsum_g) and the mins (Q4_K / Q5_K: sum_j m_j * bsum of sub-block j)
 * are lane-wise integer sums too. The integers are the definition's, so
 * the epilogue gives the same bits as every other path. */
static inline KQ_TGT_VNNI void kq_tile16k_vnni(uint32_t t, int fast, const ds_mm_ctx *c, int64_t n0, int64_t n1) {
    const int64_t K = c->W->n_in, nb = K / DS_QK_K;
    const size_t wrow = (size_t)nb * ds_type_block_bytes(t);
    kq_wblk wb[16];
    float acc[KQ_MT][16] __attribute__((aligned(64))), acc2[KQ_MT][16] __attribute__((aligned(64)));
    float acc3[KQ_MT][16] __attribute__((aligned(64)));
    int32_t S[KQ_MT][16] __attribute__((aligned(64)));
    int32_t sc[16][16] __attribute__((aligned(64))), mn[16][16] __attribute__((aligned(64)));  /* [group][row] */
    for (int64_t n = n0; n < n1; n += 16) {
        const int nv = (int)(n1 - n < 16 ? n1 - n : 16);
        const void *wr[16];
        ds_tile_rows(c->W->data, wrow, n, nv, 16, wr);
        for (int m0 = 0; m0 < c->M; m0 += KQ_MT) {
            const int mb = c->M - m0 < KQ_MT ? c->M - m0 : KQ_MT;
            kq_acc16_zero(acc, acc2, acc3, mb);
            for (int64_t b = 0; b < nb; b++) {
                uint16_t dh[16], mh[16];
                for (int j = 0; j < 16; j++) {
                    kq_unpack_avx2(t, wr[j], b, &wb[j]);
                    dh[j] = wb[j].dh;
                    mh[j] = wb[j].dmh;
                    for (int g = 0; g < 16; g++) { sc[g][j] = wb[j].sc16[g]; mn[g][j] = wb[j].mn16[g]; }
                }
                /* per activation row: offset and mins first (S starts at -offset) */
                for (int i = 0; i < mb; i++) {
                    const kq_act a = kq_act_at(t, c, m0 + i, b);
                    __m512i corr = _mm512_setzero_si512();
                    if (kq_off(t))
                        for (int g = 0; g < 16; g++)
                            corr = _mm512_add_epi32(corr, _mm512_mullo_epi32(_mm512_load_si512((const void *)sc[g]),
                                                                            _mm512_set1_epi32(a.bsums[g])));
                    _mm512_store_si512((void *)S[i], _mm512_sub_epi32(_mm512_setzero_si512(),
                                                                      _mm512_slli_epi32(corr, 5)));
                }
                for (int ch = 0; ch < 8; ch++) {
                    __m512i T[8];
                    kq_transpose16(wb, 32 * ch, T);
                    const __m512i s0 = _mm512_load_si512((const void *)sc[2 * ch]);
                    const __m512i s1 = _mm512_load_si512((const void *)sc[2 * ch + 1]);
                    for (int i = 0; i < mb; i++) {
                        const int8_t *p = kq_act_at(t, c, m0 + i, b).p + 32 * ch;
                        __m512i D0 = _mm512_setzero_si512(), D1 = _mm512_setzero_si512();
                        for (int q = 0; q < 4; q++) {
                            int32_t p0, p1;
                            memcpy(&p0, p + 4 * q, 4);
                            memcpy(&p1, p + 16 + 4 * q, 4);
                            D0 = _mm512_dpbusd_epi32(D0, T[q], _mm512_set1_epi32(p0));
                            D1 = _mm512_dpbusd_epi32(D1, T[q + 4], _mm512_set1_epi32(p1));
                        }
                        __m512i Si = _mm512_load_si512((const void *)S[i]);
                        Si = _mm512_add_epi32(Si, _mm512_add_epi32(_mm512_mullo_epi32(D0, s0), _mm512_mullo_epi32(D1, s1)));
                        _mm512_store_si512((void *)S[i], Si);
                    }
                }
                const __m512 dv = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)dh));
                const __m512 mv = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)mh));
                for (int i = 0; i < mb; i++) {
                    const kq_act a = kq_act_at(t, c, m0 + i, b);
                    const __m512 fi = _mm512_cvtepi32_ps(_mm512_load_si512((const void *)S[i]));
                    const __m512 ev = _mm512_set1_ps(a.e);
                    float *A = fast && (b & 1) ? acc2[i] : acc[i];
                    __m512 av = _mm512_load_ps(A);
                    if (!fast) av = _mm512_fmadd_ps(fi, _mm512_mul_ps(dv, ev), av);
                    else av = _mm512_add_ps(av, _mm512_mul_ps(_mm512_mul_ps(fi, dv), ev));
                    _mm512_store_ps(A, av);
                    if (kq_sec(t) == 2) {
                        __m512i Mn = _mm512_setzero_si512();      /* mn16 holds m_j twice: 8 products */
                        for (int g = 0; g < 16; g += 2)
                            Mn = _mm512_add_epi32(Mn, _mm512_mullo_epi32(_mm512_load_si512((const void *)mn[g]),
                                                                        _mm512_set1_epi32(a.bsums[g] + a.bsums[g + 1])));
                        const __m512 F2 = _mm512_cvtepi32_ps(_mm512_sub_epi32(_mm512_setzero_si512(), Mn));
                        const __m512 G2 = _mm512_mul_ps(mv, ev);
                        float *Sf = fast ? acc3[i] : acc[i];
                        __m512 sv = _mm512_load_ps(Sf);
                        sv = fast ? _mm512_add_ps(sv, _mm512_mul_ps(F2, G2)) : _mm512_fmadd_ps(F2, G2, sv);
                        _mm512_store_ps(Sf, sv);
                    }
                }
            }
            kq_acc16_store(c, fast, acc, acc2, acc3, m0, mb, n, nv);
        }
    }
}

static inline int kq_have_vnni(void) {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512vnni");
}
#endif

#if DS_X86
/* ---- Q4_0 / Q5_0 on AVX2 and AVX-VNNI: the T8 tile (packed at load) ---------------------
 * Layout DS_PACK_KQ_T8 (matmul_internal.h): per block, vector a of an 8-row
 * tile holds dword a of the rows' nibble bytes, lane j = row j. So
 *   dword s of the 8 rows' unsigned quants (q, 0..31), lane j = row j, is
 *     s < 4: N_s & 0x0F,  s >= 4: (N_{s-4} >> 4) & 0x0F
 *     Q5_0: | (H shifted so that bit s of each byte lands on bit 4) & 0x10
 * — three or four instructions per 32 bytes, done once per block for all
 * rows of the register tile; no per-row unpacking and no horizontal sums.
 * For an activation row, VPMADDUBSW of that vector with dword s of the
 * row's quants p broadcast gives, in lane j, two int16 sums of two products
 * of row j; four of them (s = 0..3, then 4..7) are added in int16 (at most
 * 4 * 2 * 31 * 128 = 31744 in magnitude: exact) and VPMADDWD with ones
 * widens them: lane j ends with the exact sum_l q_l p_l of (m, n + j).
 * AVX-VNNI (level avxvnni): VPDPBUSD of the same vector and broadcast,
 * four products per lane, eight per block. With the row's -off * sum(p)
 * that is the definition's exact I, and the f32 update is the definition's
 * fmaf((float)I, d_w * e, acc) lane by lane (VCVTDQ2PS exact, d_w * e
 * exact, VFMADD one rounding): the same bits as kq_walk's other paths. */
#define KQ_T8_MAXNT 4
#define KQ_T8_TGT_VNNI __attribute__((target("avx2,fma,f16c,avxvnni")))

/* dword s of a T8 block's unsigned quants (q5: with the fifth bits) */
#define KQ_T8_U(blk, s, q5)                                                                   \
    ({                                                                                        \
        const __m256i N_ = _mm256_load_si256((const __m256i *)((blk) + 32 * ((s) & 3)));      \
        __m256i u_ = (s) < 4 ? _mm256_and_si256(N_, m4) : _mm256_and_si256(_mm256_srli_epi16(N_, 4), m4); \
        if (q5) {                                                                             \
            const __m256i H_ = _mm256_load_si256((const __m256i *)((blk) + 128));             \
            const __m256i h_ = (s) <= 4 ? _mm256_slli_epi16(H_, 4 - (s)) : _mm256_srli_epi16(H_, (s) - 4); \
            u_ = _mm256_or_si256(u_, _mm256_and_si256(h_, m10));                              \
        }                                                                                     \
        u_;                                                                                   \
    })

/* rows m0 .. m0 + MT - 1 against NT consecutive T8 tiles t[0..NT) (the last
 * nv valid columns); pf: the tiles after these, prefetched block by block
 * into L2 (T1), as matmul_q8_0.c's walkers do and for the same reason: into
 * L1 (T0, until session 36) the stream did not overlap the compute (a 326 MB
 * Q5_0 make-model shape on an AMD EPYC Zen 4, one thread, interleaved:
 * decode 29 -> 19 ms at avx512, 30 -> 22 at avx2; the 8-row verify 75 -> 52
 * at avx512). Addresses only: no bit depends on it. */
#define KQ_T8_TILE_BODY(vnni)                                                                 \
    const __m256i m4 = _mm256_set1_epi8(15), m10 = _mm256_set1_epi8(0x10), ones = _mm256_set1_epi16(1); \
    const int q5 = t == DS_TYPE_Q5_0, off = q5 ? 16 : 8;                                     \
    const size_t QB = KQ_T8_QB(t);                                                            \
    (void)ones;                                                                               \
    __m256 acc[KQ_T8_MAXNT][KQ_T8_MAXNT];                                                     \
    DS_UNROLL                                                                                 \
    for (int i = 0; i < MT; i++)                                                              \
        DS_UNROLL                                                                             \
        for (int j = 0; j < NT; j++) acc[i][j] = _mm256_setzero_ps();                         \
    const ds_block_q8_0 *xq[KQ_T8_MAXNT];                                                     \
    const float *xd[KQ_T8_MAXNT];                                                             \
    const int32_t *xs[KQ_T8_MAXNT];                                                           \
    DS_UNROLL                                                                                 \
    for (int i = 0; i < MT; i++) {                                                            \
        xq[i] = a->q + (int64_t)(m0 + i) * nb;                                                \
        xd[i] = a->d + (int64_t)(m0 + i) * nb;                                                \
        xs[i] = a->nsum + (int64_t)(m0 + i) * nb;                                             \
    }                                                                                         \
    for (int64_t b = 0; b < nb; b++) {                                                        \
        if (pf) {                                                                             \
            DS_UNROLL                                                                         \
            for (int j = 0; j < NT; j++) {                                                    \
                const char *pj = (const char *)pf + (size_t)j * KQ_T8_TILE(t, nb) + (size_t)b * QB; \
                _mm_prefetch(pj, _MM_HINT_T1);                                                \
                _mm_prefetch(pj + 64, _MM_HINT_T1);                                           \
                if (q5) _mm_prefetch(pj + 128, _MM_HINT_T1);                                  \
                if (b % 4 == 0)                                                               \
                    _mm_prefetch((const char *)pf + (size_t)j * KQ_T8_TILE(t, nb) + (size_t)nb * QB + (size_t)b * 16, \
                                 _MM_HINT_T1);                                                \
            }                                                                                 \
        }                                                                                     \
        __m256i D[KQ_T8_MAXNT][KQ_T8_MAXNT];                                                  \
        DS_UNROLL                                                                             \
        for (int i = 0; i < MT; i++) {                                                        \
            /* -off * sum(p): nsum is -128 * sum(p) */                                        \
            const __m256i o_ = _mm256_set1_epi32(off * (xs[i][b] / 128));                     \
            DS_UNROLL                                                                         \
            for (int j = 0; j < NT; j++) D[i][j] = o_;                                        \
        }                                                                                     \
        DS_UNROLL                                                                             \
        for (int g = 0; g < 2; g++) {                                                         \
            __m256i A[KQ_T8_MAXNT][KQ_T8_MAXNT];                                              \
            DS_UNROLL                                                                         \
            for (int s4 = 0; s4 < 4; s4++) {                                                  \
                const int s = 4 * g + s4;                                                     \
                __m256i pb[KQ_T8_MAXNT];                                                      \
                DS_UNROLL                                                                     \
                for (int i = 0; i < MT; i++) {                                                \
                    int32_t pp;                                                               \
                    memcpy(&pp, xq[i][b].qs + 4 * s, sizeof pp);                              \
                    pb[i] = _mm256_set1_epi32(pp);                                            \
                }                                                                             \
                DS_UNROLL                                                                     \
                for (int j = 0; j < NT; j++) {                                                \
                    const unsigned char *blk = tl[j] + (size_t)b * QB;                        \
                    const __m256i u = fromb ? _mm256_load_si256((const __m256i *)(ub[j] + ((size_t)b * 8 + s) * 32)) \
                                            : KQ_T8_U(blk, s, q5);                            \
                    DS_UNROLL                                                                 \
                    for (int i = 0; i < MT; i++) {                                            \
                        if (vnni) {                                                           \
                            D[i][j] = KQ_T8_DP(D[i][j], u, pb[i]);                            \
                        } else {                                                              \
                            const __m256i m_ = _mm256_maddubs_epi16(u, pb[i]);                \
                            A[i][j] = s4 == 0 ? m_ : _mm256_add_epi16(A[i][j], m_);           \
                        }                                                                     \
                    }                                                                         \
                }                                                                             \
            }                                                                                 \
            if (!vnni) {                                                                      \
                DS_UNROLL                                                                     \
                for (int i = 0; i < MT; i++)                                                  \
                    DS_UNROLL                                                                 \
                    for (int j = 0; j < NT; j++)                                              \
                        D[i][j] = _mm256_add_epi32(D[i][j], _mm256_madd_epi16(A[i][j], ones)); \
            }                                                                                 \
        }                                                                                     \
        __m256 dw[KQ_T8_MAXNT];                                                               \
        DS_UNROLL                                                                             \
        for (int j = 0; j < NT; j++)                                                          \
            dw[j] = _mm256_cvtph_ps(_mm_load_si128((const __m128i *)(tl[j] + (size_t)nb * QB + (size_t)b * 16))); \
        DS_UNROLL                                                                             \
        for (int i = 0; i < MT; i++) {                                                        \
            const __m256 ev = _mm256_set1_ps(xd[i][b]);                                       \
            DS_UNROLL                                                                         \
            for (int j = 0; j < NT; j++)                                                      \
                acc[i][j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(D[i][j]), _mm256_mul_ps(dw[j], ev), acc[i][j]); \
        }                                                                                     \
    }                                                                                         \
    /* store; a NaN as the one quiet NaN (kq_walk's rule) */                                  \
    const __m256 qn = _mm256_castsi256_ps(_mm256_set1_epi32((int)kq_qnan_bits));             \
    DS_UNROLL                                                                                 \
    for (int i = 0; i < MT; i++)                                                              \
        DS_UNROLL                                                                             \
        for (int j = 0; j < NT; j++) {                                                        \
            const __m256 v = _mm256_blendv_ps(acc[i][j], qn, _mm256_cmp_ps(acc[i][j], acc[i][j], _CMP_UNORD_Q)); \
            float *yo = y + (size_t)(m0 + i) * (size_t)N + (size_t)(n0 + 8 * j);              \
            if (j < NT - 1 || nv == 8) {                                                      \
                _mm256_storeu_ps(yo, v);                                                      \
            } else {                                                                          \
                float o8[8];                                                                  \
                _mm256_storeu_ps(o8, v);                                                      \
                memcpy(yo, o8, (size_t)nv * sizeof(float));                                   \
            }                                                                                 \
        }

#define KQ_T8_ARGS uint32_t t, const unsigned char *const tl[], int NT, int nv, int64_t nb, const ds_q8_act *a, \
                   int m0, int MT, float *y, int64_t N, int64_t n0, const unsigned char *pf, int fromb,        \
                   const unsigned char *const ub[]
#define KQ_T8_DP(d, u, p) (d)                       /* not taken on AVX2 */
static inline __attribute__((always_inline)) KQ_TGT_AVX2 void kq_t8_tile_avx2(KQ_T8_ARGS) { KQ_T8_TILE_BODY(0) }
#undef KQ_T8_DP
#define KQ_T8_DP(d, u, p) _mm256_dpbusd_avx_epi32(d, u, p)
static inline __attribute__((always_inline)) KQ_T8_TGT_VNNI void kq_t8_tile_vnni(KQ_T8_ARGS) { KQ_T8_TILE_BODY(1) }
#undef KQ_T8_DP
/* the AVX-512 level with AVX512-VNNI: the same VPDPBUSD on ymm, EVEX-encoded
 * (AVX512VL; CPUs with AVX512-VNNI need not have AVX-VNNI's VEX form) */
#define KQ_T8_TGT_V512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")))
#define KQ_T8_DP(d, u, p) _mm256_dpbusd_epi32(d, u, p)
static inline __attribute__((always_inline)) KQ_T8_TGT_V512 void kq_t8_tile_v512(KQ_T8_ARGS) { KQ_T8_TILE_BODY(1) }
#undef KQ_T8_DP

/* All nb blocks of one T8 tile expanded to their unsigned quant vectors:
 * block b's dword s at ub + (8 b + s) * 32. With four and more activation
 * rows the expansion is done once per call instead of once per row tile. */
static inline __attribute__((always_inline)) KQ_TGT_AVX2 void kq_t8_expand(uint32_t t, const unsigned char *tile,
                                                                          int64_t nb, unsigned char *ub) {
    const __m256i m4 = _mm256_set1_epi8(15), m10 = _mm256_set1_epi8(0x10);
    const int q5 = t == DS_TYPE_Q5_0;
    const size_t QB = KQ_T8_QB(t);
    for (int64_t b = 0; b < nb; b++) {
        const unsigned char *blk = tile + (size_t)b * QB;
        DS_UNROLL
        for (int s = 0; s < 8; s++)
            _mm256_store_si256((__m256i *)(ub + ((size_t)b * 8 + s) * 32), KQ_T8_U(blk, s, q5));
    }
}
#define KQ_T8_EXPAND_MIN_M 4

/* The range walker: column groups of up to 4 tiles (decode) or 2 (two and
 * more rows), row tiles of 1 (decode) or 2; every shape is the same
 * operations per (m, n), so the shapes only change speed. From
 * KQ_T8_EXPAND_MIN_M rows on (with scratch) the group's tiles are expanded
 * once into the thread's scratch and the row tiles read them from there. */
#define KQ_T8_RANGE_BODY(TILE)                                                                \
    const int64_t K = c->W->n_in, N = c->W->n_out, nb = K / 32;                               \
    const size_t TB = KQ_T8_TILE(t, nb);                                                      \
    const unsigned char *pk = ds_pack_data(c->W);                                             \
    const int M = c->M, GT = M == 1 ? 4 : 2;                                                  \
    unsigned char *ubuf = M >= KQ_T8_EXPAND_MIN_M && c->tmp && !((uintptr_t)c->tmp & 31) &&   \
                                  c->tmp_bytes >= 2 * (size_t)nb * 256                         \
                              ? c->tmp : NULL;                                                \
    for (int64_t n = n0; n < n1; n += 8 * GT) {                                               \
        const int64_t cols = n1 - n < 8 * GT ? n1 - n : 8 * GT;                               \
        const int NT = (int)((cols + 7) / 8), nv = (int)(cols - 8 * (NT - 1));                \
        const unsigned char *tl[KQ_T8_MAXNT], *ub[KQ_T8_MAXNT] = {NULL};                      \
        for (int j = 0; j < NT; j++) tl[j] = pk + (size_t)(n / 8 + j) * TB;                   \
        const unsigned char *pf = n + cols < n1 ? tl[NT - 1] + TB : NULL;                     \
        if (ubuf)                                                                             \
            for (int j = 0; j < NT; j++) {                                                    \
                kq_t8_expand(t, tl[j], nb, ubuf + (size_t)j * (size_t)nb * 256);              \
                ub[j] = ubuf + (size_t)j * (size_t)nb * 256;                                  \
            }                                                                                 \
        for (int m = 0; m < M; pf = NULL) {                                                   \
            const int MT = M - m >= 2 ? 2 : 1;                                                \
            _Pragma("GCC unroll 1")                                                           \
            for (int z = 0; z < 1; z++) {                                                     \
                if (MT == 1 && NT == 4) TILE(t, tl, 4, nv, nb, c->xq, m, 1, c->y, N, n, pf, 0, ub); \
                else if (MT == 1 && NT == 3) TILE(t, tl, 3, nv, nb, c->xq, m, 1, c->y, N, n, pf, 0, ub); \
                else if (ubuf && MT == 1 && NT == 2) TILE(t, tl, 2, nv, nb, c->xq, m, 1, c->y, N, n, pf, 1, ub); \
                else if (ubuf && MT == 1) TILE(t, tl, 1, nv, nb, c->xq, m, 1, c->y, N, n, pf, 1, ub); \
                else if (ubuf && NT == 2) TILE(t, tl, 2, nv, nb, c->xq, m, 2, c->y, N, n, pf, 1, ub); \
                else if (ubuf) TILE(t, tl, 1, nv, nb, c->xq, m, 2, c->y, N, n, pf, 1, ub);   \
                else if (MT == 1 && NT == 2) TILE(t, tl, 2, nv, nb, c->xq, m, 1, c->y, N, n, pf, 0, ub); \
                else if (MT == 1) TILE(t, tl, 1, nv, nb, c->xq, m, 1, c->y, N, n, pf, 0, ub); \
                else if (NT == 2) TILE(t, tl, 2, nv, nb, c->xq, m, 2, c->y, N, n, pf, 0, ub); \
                else TILE(t, tl, 1, nv, nb, c->xq, m, 2, c->y, N, n, pf, 0, ub);             \
            }                                                                                 \
            m += MT;                                                                          \
        }                                                                                     \
    }

#define KQ_T8_FN(name, T, TILE, TGT)                                                          \
    static __attribute__((noinline, unused)) TGT void name(const ds_mm_ctx *c, int64_t n0, int64_t n1) { \
        const uint32_t t = T;                                                                 \
        KQ_T8_RANGE_BODY(TILE)                                                                \
    }
KQ_T8_FN(kq_t8_q4_0_avx2, DS_TYPE_Q4_0, kq_t8_tile_avx2, KQ_TGT_AVX2)
KQ_T8_FN(kq_t8_q5_0_avx2, DS_TYPE_Q5_0, kq_t8_tile_avx2, KQ_TGT_AVX2)
KQ_T8_FN(kq_t8_q4_0_vnni, DS_TYPE_Q4_0, kq_t8_tile_vnni, KQ_T8_TGT_VNNI)
KQ_T8_FN(kq_t8_q5_0_vnni, DS_TYPE_Q5_0, kq_t8_tile_vnni, KQ_T8_TGT_VNNI)
KQ_T8_FN(kq_t8_q4_0_v512, DS_TYPE_Q4_0, kq_t8_tile_v512, KQ_T8_TGT_V512)
KQ_T8_FN(kq_t8_q5_0_v512, DS_TYPE_Q5_0, kq_t8_tile_v512, KQ_T8_TGT_V512)

/* the T8 tile runs this call: canonical Q4_0 / Q5_0 with a T8 copy and a
 * range starting on a tile (DS_MM_GROUP is a multiple of 8), at the AVX2
 * level (AVX-VNNI included) and at AVX-512 (VPDPBUSD on ymm there too):
 * every M, so that the original bytes, paged out once packed
 * (backend_cpu.c), are not read back by a canonical call */
DS_INLINE int kq_t8_runs(uint32_t t, int fast, const ds_mm_ctx *c, int64_t n0, int lv) {
    return !fast && (lv == DS_LVL_AVX2 || lv == DS_LVL_AVX512) && (t == DS_TYPE_Q4_0 || t == DS_TYPE_Q5_0) &&
           n0 % 8 == 0 && ds_pack_layout(c->W) == DS_PACK_KQ_T8;
}
DS_INLINE void kq_t8_run(uint32_t t, const ds_mm_ctx *c, int64_t n0, int64_t n1, int lv) {
    const int v512 = lv == DS_LVL_AVX512 && kq_have_vnni();
    if (t == DS_TYPE_Q5_0) (v512 ? kq_t8_q5_0_v512 : c->avxvnni ? kq_t8_q5_0_vnni : kq_t8_q5_0_avx2)(c, n0, n1);
    else (v512 ? kq_t8_q4_0_v512 : c->avxvnni ? kq_t8_q4_0_vnni : kq_t8_q4_0_avx2)(c, n0, n1);
}
#endif

/* ---- the tile walker ---------------------------------------------------------------------- */

DS_INLINE void kq_walk(uint32_t t, int fast, const ds_mm_ctx *c, int64_t n0, int64_t n1, int lv) {
    const int64_t K = c->W->n_in, N = c->W->n_out, nb = K / kq_qk(t);
    const size_t wrow = (size_t)nb * ds_type_block_bytes(t);
    kq_wblk wb[KQ_NT];
#if DS_X86
    if (kq_t8_runs(t, fast, c, n0, lv)) {
        kq_t8_run(t, c, n0, n1, lv);
        return;
    }
    const int vnni = lv == DS_LVL_AVX512 && kq_have_vnni();
    if (vnni && !kq_is_k(t) && c->M >= KQ_TILE16_MIN_M) {
        kq_tile16_vnni(t, fast, c, n0, n1);
        return;
    }
    if (vnni && kq_is_k(t) && c->M >= KQ_TILE16K_MIN_M) {
        kq_tile16k_vnni(t, fast, c, n0, n1);
        return;
    }
#endif
    for (int64_t n = n0; n < n1; n += KQ_NT) {
        const int nv = (int)(n1 - n < KQ_NT ? n1 - n : KQ_NT);
        const void *wr[KQ_NT];
        ds_tile_rows(c->W->data, wrow, n, nv, KQ_NT, wr);
        for (int m0 = 0; m0 < c->M; m0 += KQ_MT) {
            const int mb = c->M - m0 < KQ_MT ? c->M - m0 : KQ_MT;
            float acc[KQ_MT][KQ_NT], acc2[KQ_MT][KQ_NT], acc3[KQ_MT][KQ_NT];
            for (int i = 0; i < mb; i++)
                for (int j = 0; j < KQ_NT; j++) acc[i][j] = acc2[i][j] = acc3[i][j] = 0.0f;
            for (int64_t b = 0; b < nb; b++) {
#if DS_X86
#ifdef KQ_FUSED_TYPE
                /* also on the AVX-512 levels: it beats the VNNI unpacking
                 * block there too at these row counts (Q4_K M=1: 43 -> 21 us) */
                if (lv >= DS_LVL_AVX2 && t == KQ_FUSED_TYPE && mb <= kq_fused_rows(t, lv)) {
                    (fast ? kq_fused_fast : kq_fused_canon)(c, wr, b, m0, mb, acc, acc2, acc3);
                    continue;
                }
#endif
                if (vnni) {
                    kq_block_vnni(t, fast, c, wr, b, wb, m0, mb, acc, acc2, acc3);
                    continue;
                }
                if (lv >= DS_LVL_AVX2) {
                    kq_block_avx2(t, fast, c, wr, b, wb, m0, mb, acc, acc2, acc3);
                    continue;
                }
#endif
#if DS_ARM
                /* K types on neon / dotprod: the NEON blocks (matmul_kq_neon.h) */
                if (DS_LVL_IS_NEON(lv) && kq_is_k(t)) {
                    if (mb <= KQ_NEON_FUSED_MAX_M)
                        kq_block_fused_neon(t, fast, c, wr, b, m0, mb, acc, acc2, acc3, lv == DS_LVL_DOTPROD);
                    else
                        kq_block_neon(t, fast, c, wr, b, wb, m0, mb, acc, acc2, acc3, lv == DS_LVL_DOTPROD);
                    continue;
                }
#endif
                for (int j = 0; j < KQ_NT; j++) kq_unpack(t, wr[j], b, &wb[j]);
                for (int i = 0; i < mb;) {
                    /* one activation row, or two at once (AArch64 i8mm) */
                    kq_act ap[2];
                    int32_t Ip[2][KQ_NT], Mp[2][KQ_NT] = {{0}};
                    int r = 1;
#if DS_ARM
                    if (DS_LVL_IS_NEON(lv))
                        r = kq_ints_rows_neon(t, c, wb, m0 + i, mb - i, b, lv == DS_LVL_DOTPROD, ap, Ip, Mp);
                    else
#endif
                    {
                        ap[0] = kq_act_at(t, c, m0 + i, b);
                        kq_ints_scalar(t, wb, &ap[0], Ip[0], Mp[0]);
                    }
                    for (int h = 0; h < r; h++, i++) {
                        const kq_act a = ap[h];
                        const int32_t *I = Ip[h], *Mn = Mp[h];
                        /* the f32 epilogue: the same C on every level */
                        float *A = fast && (b & 1) ? acc2[i] : acc[i];
                        if (!fast)
                            for (int j = 0; j < KQ_NT; j++) A[j] = fmaf((float)I[j], wb[j].d * a.e, A[j]);
                        else            /* llama.cpp's scalar rounding: (I * d_w) * e, then add */
                            for (int j = 0; j < KQ_NT; j++) A[j] = A[j] + ((float)I[j] * wb[j].d) * a.e;
                        if (kq_sec(t)) {
                            float *S = fast ? acc3[i] : acc[i];
                            for (int j = 0; j < KQ_NT; j++) {
                                const float F2 = kq_sec(t) == 1 ? wb[j].dm : -(float)Mn[j];
                                const float G2 = kq_sec(t) == 1 ? (float)a.psum * a.e : wb[j].dm * a.e;
                                S[j] = fast ? S[j] + F2 * G2 : fmaf(F2, G2, S[j]);
                            }
                        }
                    }
                }
            }
            for (int i = 0; i < mb; i++)
                for (int j = 0; j < nv; j++) {
                    float y = fast ? (acc[i][j] + acc2[i][j]) + acc3[i][j] : acc[i][j];
                    if (y != y) y = ds_bits_f32(kq_qnan_bits);
                    c->y[(size_t)(m0 + i) * (size_t)N + (size_t)(n + j)] = y;
                }
        }
    }
    (void)lv;
}

/* Canonical and fast range kernels of one type, per level. */
#define KQ_FAMILY(tname, TYPE)                                                               \
    DS_INLINE void kq_canon_##tname(const ds_mm_ctx *c, int64_t n0, int64_t n1, int lv) {    \
        kq_walk(TYPE, 0, c, n0, n1, lv);                                                     \
    }                                                                                        \
    DS_INLINE void kq_fast_##tname(const ds_mm_ctx *c, int64_t n0, int64_t n1, int lv) {     \
        kq_walk(TYPE, 1, c, n0, n1, lv);                                                     \
    }                                                                                        \
    DS_MM_INSTANTIATE(ds_mm_##tname##_canonical, kq_canon_##tname, )                         \
    DS_MM_INSTANTIATE(ds_mm_##tname##_fast, kq_fast_##tname, )

#endif
