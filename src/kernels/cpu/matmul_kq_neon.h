/* matmul_kq_neon.h — the AArch64 (neon / dotprod levels) blocks of the K-quant
 * matmuls Q4_K, Q5_K and Q6_K: the ARM counterparts of matmul_kq.h's AVX2
 * kq_block_avx2 (unpack 8 weight rows once, then every activation row) and
 * kq_block_fused_body (few activation rows: unpack fused into the dot).
 * Private to src/kernels/cpu; included by matmul_kq.h inside its DS_ARM part,
 * after kq_ints_neon. (A file of its own so the shared engine, which the
 * legacy families use too, changes by two hooks only.)
 *
 * ==== Why these are the definition's bits ====================================
 * Nothing here changes what is computed (matmul_kq.h's definition):
 *   - the unpacked bytes, scales and mins are those of kq_unpack (the same
 *     masks and shifts on 16 bytes at a time);
 *   - the integers I and Mn are exact whatever the grouping (SDOT or SMULL +
 *     SADALP lanes, ADDP folds, MLA with the scales): they are the
 *     definition's integers. The fused Q6_K dot uses the signed quants
 *     q - 32 directly, i.e. sum_j sc_j * sum_l (q_l - 32) p_l, the same
 *     integer as sum_j sc_j * (sum q p - 32 * sum p);
 *   - the f32 epilogue is the scalar one lane by lane, in the same order per
 *     output: canonical acc = fma((float)I, d_w * e, acc) as FMLA (IEEE
 *     fusedMultiplyAdd, = fmaf) after one FMUL for d_w * e, then
 *     acc = fma(-(float)Mn, dmin_w * e, acc) likewise; fast
 *     acc = acc + ((float)I * d_w) * e as FMUL, FMUL, FADD (three roundings,
 *     never fused: -ffp-contract=off and no DS_FAST_FN on these instances),
 *     accM = accM + F2 * G2 as FMUL, FADD. The fp16 d_w / dmin_w are widened
 *     with FCVTL (exact for every non-NaN; a NaN output is stored as the one
 *     quiet NaN anyway).
 * So every path here is memcmp-equal to the portable loop on every M and
 * thread count (test_kquant, test_matmul run each AArch64 level). */
#ifndef DSPARK_MATMUL_KQ_NEON_H
#define DSPARK_MATMUL_KQ_NEON_H

/* Up to this many activation rows per pass the fused block runs on the neon
 * and dotprod levels, as KQ_FUSED_MAX_M on x86 (where it pays to 2 rows for
 * Q4_K). Not measured on ARM hardware (none here; qemu timings mean nothing):
 * the x86 value, for all three K types. */
#ifndef KQ_NEON_FUSED_MAX_M
#define KQ_NEON_FUSED_MAX_M 2
#endif


/* Q4_K / Q5_K: 16 bytes of quants at qs -> the low nibbles (elements l of
 * the 32-group) and the high nibbles (elements 32 + l), each with its fifth
 * bit from *H (Q5_K: bit 0 for lo, bit 1 for hi; *H then moves down by 2
 * for the next group). The fused and the unpacking blocks both read it. */
DS_INLINE void kq_q45_chunk_neon(const uint8_t *qs, int has_qh, uint8x16_t *H, uint8x16_t *lo, uint8x16_t *hi) {
    const uint8x16_t q = vld1q_u8(qs), m4 = vdupq_n_u8(0x0f);
    *lo = vandq_u8(q, m4);
    *hi = vshrq_n_u8(q, 4);
    if (has_qh) {
        *lo = vorrq_u8(*lo, vshlq_n_u8(vandq_u8(*H, vdupq_n_u8(1)), 4));
        *hi = vorrq_u8(*hi, vshlq_n_u8(vandq_u8(*H, vdupq_n_u8(2)), 3));
        *H = vshrq_n_u8(*H, 2);
    }
}

/* each of 8 bytes twice, widened: the per-16-element lanes of sc16 / mn16 */
DS_INLINE void kq_dup16_neon(const uint8_t v8[8], int16_t out[16]) {
    const int16x8_t s = vreinterpretq_s16_u16(vmovl_u8(vld1_u8(v8)));
    vst1q_s16(out, vzip1q_s16(s, s));
    vst1q_s16(out + 8, vzip2q_s16(s, s));
}

/* ---- unpacking: the same kq_wblk fields as kq_unpack (u, sc16, mn16, d, dm;
 * plus dh / dmh for the FCVTL epilogue; scv is x86's and not filled) ---------- */
DS_INLINE void kq_unpack_neon(uint32_t t, const void *row, int64_t b, kq_wblk *o) {
    const uint8x16_t m4 = vdupq_n_u8(15);
    if (t == DS_TYPE_Q4_K || t == DS_TYPE_Q5_K) {
        const uint8_t *qs, *sc12, *qh = NULL;
        if (t == DS_TYPE_Q4_K) {
            const ds_block_q4_K *x = (const ds_block_q4_K *)row + b;
            qs = x->qs; sc12 = x->scales; o->dh = x->d; o->dmh = x->dmin;
        } else {
            const ds_block_q5_K *x = (const ds_block_q5_K *)row + b;
            qs = x->qs; sc12 = x->scales; qh = x->qh; o->dh = x->d; o->dmh = x->dmin;
        }
        /* Q5_K: bit 2g of qh[l] is the fifth bit of element 64g + l, bit
         * 2g+1 that of 64g + 32 + l; H is shifted down by 2 per g */
        uint8x16_t H[2] = {vdupq_n_u8(0), vdupq_n_u8(0)};
        if (qh) { H[0] = vld1q_u8(qh); H[1] = vld1q_u8(qh + 16); }
        DS_UNROLL
        for (int g = 0; g < 4; g++) {
            DS_UNROLL
            for (int h = 0; h < 2; h++) {
                uint8x16_t lo, hi;
                kq_q45_chunk_neon(qs + 32 * g + 16 * h, qh != NULL, &H[h], &lo, &hi);
                vst1q_u8(o->u + 64 * g + 16 * h, lo);
                vst1q_u8(o->u + 64 * g + 32 + 16 * h, hi);
            }
        }
        uint8_t sm[16];
        kq_q4k_scales(sc12, sm);
        kq_dup16_neon(sm, o->sc16);
        kq_dup16_neon(sm + 8, o->mn16);
        o->d = ds_fp16_to_f32(o->dh);
        o->dm = ds_fp16_to_f32(o->dmh);
    } else {                                    /* Q6_K */
        const ds_block_q6_K *x = (const ds_block_q6_K *)row + b;
        const uint8x16_t m3 = vdupq_n_u8(3), m30 = vdupq_n_u8(0x30);
        DS_UNROLL
        for (int h = 0; h < 2; h++) {
            const uint8_t *ql = x->ql + 64 * h, *qhp = x->qh + 32 * h;
            uint8_t *u = o->u + 128 * h;
            DS_UNROLL
            for (int s = 0; s < 2; s++) {
                const uint8x16_t l0 = vld1q_u8(ql + 16 * s), l1 = vld1q_u8(ql + 32 + 16 * s);
                const uint8x16_t qv = vld1q_u8(qhp + 16 * s);
                /* bits 2r, 2r+1 of qh[l] -> bits 4, 5 of quarter r */
                vst1q_u8(u + 16 * s, vorrq_u8(vandq_u8(l0, m4), vshlq_n_u8(vandq_u8(qv, m3), 4)));
                vst1q_u8(u + 32 + 16 * s, vorrq_u8(vandq_u8(l1, m4), vandq_u8(vshlq_n_u8(qv, 2), m30)));
                vst1q_u8(u + 64 + 16 * s, vorrq_u8(vshrq_n_u8(l0, 4), vandq_u8(qv, m30)));
                vst1q_u8(u + 96 + 16 * s, vorrq_u8(vshrq_n_u8(l1, 4), vandq_u8(vshrq_n_u8(qv, 2), m30)));
            }
        }
        const int8x16_t sc = vld1q_s8(x->scales);
        vst1q_s16(o->sc16, vmovl_s8(vget_low_s8(sc)));
        vst1q_s16(o->sc16 + 8, vmovl_high_s8(sc));
        o->dh = x->d;
        o->dmh = 0;
        o->d = ds_fp16_to_f32(x->d);
    }
}

/* ---- the f32 epilogue of one activation row and 8 weight rows: two 4-lane
 * halves, lane j the scalar epilogue's operations on output j (see the top).
 * I / Mn: the 8 rows' exact integers; dv / mv: their d_w and dmin_w. ---------- */
DS_INLINE void kq_epi_neon(uint32_t t, int fast, int64_t b, const kq_act *a, const int32x4_t I[2],
                           const int32x4_t Mn[2], const float32x4_t dv[2], const float32x4_t mv[2],
                           float *acc, float *acc2, float *acc3) {
    float *A = fast && (b & 1) ? acc2 : acc;
    DS_UNROLL
    for (int h = 0; h < 2; h++) {
        const float32x4_t fi = vcvtq_f32_s32(I[h]);
        float32x4_t av = vld1q_f32(A + 4 * h);
        if (!fast) av = vfmaq_f32(av, fi, vmulq_n_f32(dv[h], a->e));
        else av = vaddq_f32(av, vmulq_n_f32(vmulq_f32(fi, dv[h]), a->e));
        vst1q_f32(A + 4 * h, av);
    }
    if (kq_sec(t) == 2) {
        float *S = fast ? acc3 : acc;
        DS_UNROLL
        for (int h = 0; h < 2; h++) {
            const float32x4_t F2 = vnegq_f32(vcvtq_f32_s32(Mn[h]));
            const float32x4_t G2 = vmulq_n_f32(mv[h], a->e);
            float32x4_t sv = vld1q_f32(S + 4 * h);
            sv = fast ? vaddq_f32(sv, vmulq_f32(F2, G2)) : vfmaq_f32(sv, F2, G2);
            vst1q_f32(S + 4 * h, sv);
        }
    }
}

/* the 8 rows' fp16 scales -> two f32 halves (FCVTL / FCVTL2, exact) */
DS_INLINE void kq_cvt8_neon(const uint16_t h8[KQ_NT], float32x4_t out[2]) {
    const float16x8_t v = vreinterpretq_f16_u16(vld1q_u16(h8));
    out[0] = vcvt_f32_f16(vget_low_f16(v));
    out[1] = vcvt_high_f32_f16(v);
}

/* ---- unpacking block: 8 weight rows unpacked once, then per activation row
 * kq_ints_neon and the epilogue (the counterpart of kq_block_avx2) ------------ */
DS_INLINE void kq_block_neon(uint32_t t, int fast, const ds_mm_ctx *c, const void *const wr[], int64_t b,
                             kq_wblk wb[], int m0, int mb, float (*acc)[KQ_NT], float (*acc2)[KQ_NT],
                             float (*acc3)[KQ_NT], int dp) {
    uint16_t dh[KQ_NT], mh[KQ_NT];
    for (int j = 0; j < KQ_NT; j++) {
        kq_unpack_neon(t, wr[j], b, &wb[j]);
        dh[j] = wb[j].dh;
        mh[j] = wb[j].dmh;
    }
    float32x4_t dv[2], mv[2];
    kq_cvt8_neon(dh, dv);
    kq_cvt8_neon(mh, mv);
    for (int i = 0; i < mb;) {
        kq_act a[2];
        int32_t I[2][KQ_NT], Mn[2][KQ_NT] = {{0}};
        const int r = kq_ints_rows_neon(t, c, wb, m0 + i, mb - i, b, dp, a, I, Mn);
        for (int h = 0; h < r; h++, i++) {
            const int32x4_t vI[2] = {vld1q_s32(I[h]), vld1q_s32(I[h] + 4)};
            const int32x4_t vM[2] = {vld1q_s32(Mn[h]), vld1q_s32(Mn[h] + 4)};
            kq_epi_neon(t, fast, b, &a[h], vI, vM, dv, mv, acc[i], acc2[i], acc3[i]);
        }
    }
}

/* ---- fused block, few activation rows: each 16-quant chunk is unpacked in
 * registers and fed straight to the dot (the counterpart of kq_fused_avx2).
 * One weight row's super-block b against one activation row (pv: its 16
 * chunks of 16 quants, bs8: its 8 sums per 32 (Q4_K / Q5_K)): 4 int32 lanes
 * summing to I, and (Q4_K / Q5_K) 4 summing to Mn; dh / dmh its fp16 scales. */
DS_INLINE void kq_fused_neon(uint32_t t, const void *row, int64_t b, const int8x16_t pv[16], int16x8_t bs8,
                             int32x4_t *vI, int32x4_t *vM, uint16_t *dh, uint16_t *dmh, int dp) {
    const int32x4_t z = vdupq_n_s32(0);
    const uint8x16_t m4 = vdupq_n_u8(15);
    if (t == DS_TYPE_Q4_K || t == DS_TYPE_Q5_K) {
        const uint8_t *qs, *sc12, *qh = NULL;
        if (t == DS_TYPE_Q4_K) {
            const ds_block_q4_K *x = (const ds_block_q4_K *)row + b;
            qs = x->qs; sc12 = x->scales; *dh = x->d; *dmh = x->dmin;
        } else {
            const ds_block_q5_K *x = (const ds_block_q5_K *)row + b;
            qs = x->qs; sc12 = x->scales; qh = x->qh; *dh = x->d; *dmh = x->dmin;
        }
        uint8x16_t H[2] = {vdupq_n_u8(0), vdupq_n_u8(0)};
        if (qh) { H[0] = vld1q_u8(qh); H[1] = vld1q_u8(qh + 16); }
        int32x4_t d[8];                 /* d[j]: lanes summing to sub-block j's dot */
        DS_UNROLL
        for (int g = 0; g < 4; g++) {
            int32x4_t dl = z, dhi = z;
            DS_UNROLL
            for (int h = 0; h < 2; h++) {
                uint8x16_t lo, hi;
                kq_q45_chunk_neon(qs + 32 * g + 16 * h, qh != NULL, &H[h], &lo, &hi);
                dl = ds_neon_dot16(dl, vreinterpretq_s8_u8(lo), pv[4 * g + h], dp);
                dhi = ds_neon_dot16(dhi, vreinterpretq_s8_u8(hi), pv[4 * g + 2 + h], dp);
            }
            d[2 * g] = dl;
            d[2 * g + 1] = dhi;
        }
        uint8_t sm[16];
        kq_q4k_scales(sc12, sm);
        const uint16x8_t s16 = vmovl_u8(vld1_u8(sm)), m16 = vmovl_u8(vld1_u8(sm + 8));
        const int32x4_t D0 = vpaddq_s32(vpaddq_s32(d[0], d[1]), vpaddq_s32(d[2], d[3]));  /* sub-blocks 0..3 */
        const int32x4_t D1 = vpaddq_s32(vpaddq_s32(d[4], d[5]), vpaddq_s32(d[6], d[7]));  /* 4..7 */
        *vI = vmlaq_s32(vmulq_s32(D0, vreinterpretq_s32_u32(vmovl_u16(vget_low_u16(s16)))),
                        D1, vreinterpretq_s32_u32(vmovl_high_u16(s16)));
        const int16x8_t mn = vreinterpretq_s16_u16(m16);
        *vM = vmlal_high_s16(vmull_s16(vget_low_s16(mn), vget_low_s16(bs8)), mn, bs8);
    } else {                                    /* Q6_K */
        const ds_block_q6_K *x = (const ds_block_q6_K *)row + b;
        const uint8x16_t m3 = vdupq_n_u8(3), m30 = vdupq_n_u8(0x30);
        const int8x16_t o32 = vdupq_n_s8(32);
        int32x4_t d[16];                /* d[g]: lanes summing to group g's dot of (q - 32) and p */
        DS_UNROLL
        for (int h = 0; h < 2; h++) {
            const uint8_t *ql = x->ql + 64 * h, *qhp = x->qh + 32 * h;
            DS_UNROLL
            for (int s = 0; s < 2; s++) {
                const uint8x16_t l0 = vld1q_u8(ql + 16 * s), l1 = vld1q_u8(ql + 32 + 16 * s);
                const uint8x16_t qv = vld1q_u8(qhp + 16 * s);
                const uint8x16_t u[4] = {
                    vorrq_u8(vandq_u8(l0, m4), vshlq_n_u8(vandq_u8(qv, m3), 4)),
                    vorrq_u8(vandq_u8(l1, m4), vandq_u8(vshlq_n_u8(qv, 2), m30)),
                    vorrq_u8(vshrq_n_u8(l0, 4), vandq_u8(qv, m30)),
                    vorrq_u8(vshrq_n_u8(l1, 4), vandq_u8(vshrq_n_u8(qv, 2), m30))};
                DS_UNROLL
                for (int r = 0; r < 4; r++) {   /* elements 128h + 32r + 16s ..: group 8h + 2r + s */
                    const int g = 8 * h + 2 * r + s;
                    d[g] = ds_neon_dot16(z, vsubq_s8(vreinterpretq_s8_u8(u[r]), o32), pv[g], dp);
                }
            }
        }
        const int8x16_t sc8 = vld1q_s8(x->scales);
        const int16x8_t s0 = vmovl_s8(vget_low_s8(sc8)), s1 = vmovl_high_s8(sc8);
        const int32x4_t sc[4] = {vmovl_s16(vget_low_s16(s0)), vmovl_high_s16(s0),
                                 vmovl_s16(vget_low_s16(s1)), vmovl_high_s16(s1)};
        int32x4_t tot = z;
        DS_UNROLL
        for (int k = 0; k < 4; k++) {     /* lane i: group 4k + i */
            const int32x4_t G = vpaddq_s32(vpaddq_s32(d[4 * k], d[4 * k + 1]), vpaddq_s32(d[4 * k + 2], d[4 * k + 3]));
            tot = vmlaq_s32(tot, G, sc[k]);
        }
        *vI = tot;
        *vM = z;
        *dh = x->d;
        *dmh = 0;
    }
}

/* 4 vectors of 4 int32 -> one vector of their 4 totals (exact) */
DS_INLINE int32x4_t kq_hsum4_neon(const int32x4_t v[4]) {
    return vpaddq_s32(vpaddq_s32(v[0], v[1]), vpaddq_s32(v[2], v[3]));
}

/* The fused block for activation rows m0 .. m0 + mb - 1 (the epilogue as
 * kq_block_neon's). */
DS_INLINE void kq_block_fused_neon(uint32_t t, int fast, const ds_mm_ctx *c, const void *const wr[], int64_t b,
                                   int m0, int mb, float (*acc)[KQ_NT], float (*acc2)[KQ_NT],
                                   float (*acc3)[KQ_NT], int dp) {
    for (int i = 0; i < mb; i++) {
        const kq_act a = kq_act_at(t, c, m0 + i, b);
        int8x16_t pv[16];
        DS_UNROLL
        for (int g = 0; g < 16; g++) pv[g] = vld1q_s8(a.p + 16 * g);
        /* sums per 32 (sub-block) from the 16 sums per 16: |sum| <= 32 * 128 */
        const int16x8_t bs8 = vpaddq_s16(vld1q_s16(a.bsums), vld1q_s16(a.bsums + 8));
        int32x4_t vI[KQ_NT], vM[KQ_NT];
        uint16_t dh[KQ_NT], mh[KQ_NT];
        DS_UNROLL
        for (int j = 0; j < KQ_NT; j++) kq_fused_neon(t, wr[j], b, pv, bs8, &vI[j], &vM[j], &dh[j], &mh[j], dp);
        const int32x4_t tI[2] = {kq_hsum4_neon(vI), kq_hsum4_neon(vI + 4)};
        const int32x4_t tM[2] = {kq_hsum4_neon(vM), kq_hsum4_neon(vM + 4)};
        float32x4_t dv[2], mv[2];
        kq_cvt8_neon(dh, dv);
        kq_cvt8_neon(mh, mv);
        kq_epi_neon(t, fast, b, &a, tI, tM, dv, mv, acc[i], acc2[i], acc3[i]);
    }
}

#endif
