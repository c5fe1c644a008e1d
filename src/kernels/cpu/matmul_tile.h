/* matmul_tile.h — the register-tile engine of the four matmul families, written
 * once over a chunk vector of DS_W lanes. Private to src/kernels/cpu; included
 * only by matmul_internal.h, three times: DS_W = 16 (AVX-512: one zmm per
 * chunk), 8 (AVX2: one ymm) and 4 (SSE2 / NEON / scalar: one xmm).
 *
 * ==== Why chunks ===================================================================
 * Every accumulator is 16 lanes (lane = k mod 16); that is the canonical
 * definition and never changes. But GCC keeps a 64-byte vector *variable* in
 * memory on targets without 512-bit registers (it splits each operation and
 * round-trips every intermediate through the stack), which made the AVX2
 * instances slower than the SSE2 ones and the AVX2 fast Q8_0 kernel 5x slower
 * than its canonical twin. So a tile holds each 16-lane accumulator as 16/W
 * chunks of W lanes in the level's native register width: chunk ch holds
 * lanes ch*W .. ch*W+W-1. Operations are lane-wise, so chunking changes
 * registers, never bits; the epilogue writes the chunks back into lane order
 * and applies the same 16-lane combine.
 *
 * Defines, with S = DS_W (16, 8 or 4):
 *   ds_ldS_f32 / _bf16 / _f16 / _f16sw / _q8   W lanes of a row -> f32 (exact)
 *   ds_fmaS(a, b, c)                          a * b + c, one rounding per lane
 *   ds_cvt_rowS(type, row, K, out)            one weight row -> f32 (exact)
 *   ds_tileS(type, fast, ...)                 one MT x NT register tile */

#define DS_CAT_(a, b) a##b
#define DS_CAT(a, b) DS_CAT_(a, b)
#define DS_WFN(pre, post) DS_CAT(DS_CAT(pre, DS_W), post)

#if DS_W == 16
#define DS_VF ds_v16f
#define DS_VI ds_v16i
#define DS_VU ds_v16u
#define DS_VH ds_v16h
#define DS_VS ds_v16s
#define DS_VB ds_v16b
#elif DS_W == 8
#define DS_VF ds_v8f
#define DS_VI ds_v8i
#define DS_VU ds_v8u
#define DS_VH ds_v8h
#define DS_VS ds_v8s
#define DS_VB ds_v8b
#elif DS_W == 4
#define DS_VF ds_v4f
#define DS_VI ds_v4i
#define DS_VU ds_v4u
#define DS_VH ds_v4h
#define DS_VS ds_v4s
#define DS_VB ds_v4b
#else
#error "DS_W must be 16, 8 or 4"
#endif
#define DS_NC (16 / DS_W)                    /* chunks per 16-lane accumulator */
#ifndef DS_PF_TILES
#define DS_PF_TILES 4                        /* decode weight prefetch distance, in tiles */
#endif

/* ---- loaders: W consecutive elements of a weight/activation row as f32 ---------- */
DS_INLINE DS_VF DS_WFN(ds_ld, _f32)(const float *p) {
    DS_VF v;
    memcpy(&v, p, sizeof v);
    return v;
}
/* bfloat16 -> f32 is exact: the 16 bits become the high half. */
DS_INLINE DS_VF DS_WFN(ds_ld, _bf16)(const uint16_t *p) {
    DS_VH h;
    memcpy(&h, p, sizeof h);
    return (DS_VF)(__builtin_convertvector(h, DS_VU) << 16);
}
/* fp16 -> f32 in software, exact, branch-free (the same values as
 * ds_fp16_to_f32, NaN payloads included; tests check all 65536 inputs).
 * Normal: rebias the exponent (+112). Inf/NaN: exponent field 31 -> 255.
 * Subnormal/zero: man * 2^-24, an exact int->float conversion and an exact
 * power-of-two scaling (no denormal f32 operands, so no microcode assists).
 * Masks come from arithmetic shifts, not compares: GCC splits a wide vector
 * compare into scalar code where the target lacks the registers, while
 * shifts and logic ops split cleanly. */
DS_INLINE DS_VF DS_WFN(ds_ld, _f16sw)(const uint16_t *p) {
    DS_VH h16;
    memcpy(&h16, p, sizeof h16);
    DS_VI h     = __builtin_convertvector(h16, DS_VI);
    DS_VI sign  = (DS_VI)((DS_VU)(h & 0x8000) << 16);
    DS_VI em    = h & 0x7fff;
    DS_VI isinf = (DS_VI)((DS_VU)(em + 0x0400) << 16) >> 31;   /* em >= 0x7c00 */
    DS_VI issub = (em - 0x0400) >> 31;                          /* em <  0x0400 */
    DS_VI norm  = (em << 13) + 0x38000000 + (isinf & 0x38000000);
    DS_VF sub   = __builtin_convertvector(em, DS_VF) * 5.9604644775390625e-08f;
    DS_VI bits  = (issub & (DS_VI)sub) | (~issub & norm);
    return (DS_VF)(bits | sign);
}
/* fp16 -> f32 as the level does it fastest: VCVTPH2PS (exact; see DS_X86_BUILTINS in
 * simd.h) for W = 16 (used only at AVX-512) and W = 8 (only at AVX2, which
 * requires F16C); software for W = 4. See DS_X86_BUILTINS in simd.h. */
DS_INLINE DS_VF DS_WFN(ds_ld, _f16)(const uint16_t *p) {
#if DS_X86_BUILTINS && DS_W == 16
    typedef short v16hi_ __attribute__((vector_size(32)));
    v16hi_ h;
    memcpy(&h, p, sizeof h);
    const DS_VF z = {0};
    return __builtin_ia32_vcvtph2ps512_mask(h, z, (unsigned short)0xffff, 4 /* current rounding */);
#elif DS_X86_BUILTINS && DS_W == 8
    typedef short v8hi_ __attribute__((vector_size(16)));
    v8hi_ h;
    memcpy(&h, p, sizeof h);
    return __builtin_ia32_vcvtph2ps256(h);
#elif DS_ARM && DS_W == 4
    /* AArch64 (every level: FCVTL is base ISA): exact like VCVTPH2PS, the
     * same signalling-NaN quieting (simd.h) */
    float16x4_t h;
    memcpy(&h, p, sizeof h);
    return (DS_VF)vcvt_f32_f16(h);
#else
    return DS_WFN(ds_ld, _f16sw)(p);
#endif
}
/* int8 quants -> f32 (exact): VPMOVSXBD where the level has it (W = 16:
 * AVX-512F, W = 8: AVX2), else via int16 (GCC 12 lowers a direct
 * int8 -> int32 vector conversion byte by byte). */
DS_INLINE DS_VF DS_WFN(ds_ld, _q8)(const int8_t *p) {
#if DS_X86_BUILTINS && DS_W == 16
    typedef char v16qi_ __attribute__((vector_size(16)));
    v16qi_ b;
    memcpy(&b, p, sizeof b);
    const DS_VI z = {0};
    return __builtin_convertvector(__builtin_ia32_pmovsxbd512_mask(b, z, (unsigned short)0xffff),
                                   DS_VF);
#elif DS_X86_BUILTINS && DS_W == 8
    typedef char v16qi_ __attribute__((vector_size(16)));
    typedef long long v2di_ __attribute__((vector_size(16)));
    long long lo;                               /* 8 bytes -> low half: one vmovq */
    memcpy(&lo, p, sizeof lo);
    const v2di_ b = {lo, 0};
    return __builtin_convertvector(__builtin_ia32_pmovsxbd256((v16qi_)b), DS_VF);
#else
    DS_VB b;
    memcpy(&b, p, sizeof b);
    DS_VS s = __builtin_convertvector(b, DS_VS);
    return __builtin_convertvector(__builtin_convertvector(s, DS_VI), DS_VF);
#endif
}
/* One fp16 scale -> f32 (exact). */
DS_INLINE float DS_WFN(ds_ld, _f16s)(uint16_t h) {
#if DS_X86_BUILTINS && DS_W >= 8
    typedef short v8hi_ __attribute__((vector_size(16)));
    const v8hi_ v = {(short)h};
    return __builtin_ia32_vcvtph2ps(v)[0];
#else
    return ds_fp16_to_f32(h);
#endif
}
/* W weights of a dense row (type is a compile-time constant after inlining). */
DS_INLINE DS_VF DS_WFN(ds_ld, _w)(uint32_t type, const void *row, int64_t k) {
    if (type == DS_TYPE_F16) return DS_WFN(ds_ld, _f16)((const uint16_t *)row + k);
    if (type == DS_TYPE_BF16) return DS_WFN(ds_ld, _bf16)((const uint16_t *)row + k);
    return DS_WFN(ds_ld, _f32)((const float *)row + k);
}

/* ---- fused multiply-add: a * b + c with ONE rounding, lane by lane ------------
 * The canonical lane update. Every form below is IEEE fusedMultiplyAdd, so
 * they all give the same bits: VFMADD (W = 16: AVX-512F, W = 8: the AVX2
 * instance, which requires FMA), FMLA (AArch64 NEON), and elsewhere C's
 * fmaf() lane by lane (correctly rounded by definition; glibc computes it
 * with hardware FMA where the CPU has it and exactly in software where not —
 * slow, but the same bits). The x86 forms go through GCC's builtins for the
 * reason the loaders above do (DS_X86_BUILTINS in simd.h). */
DS_INLINE DS_VF DS_CAT(ds_fma, DS_W)(DS_VF a, DS_VF b, DS_VF c) {
#if DS_X86_BUILTINS && DS_W == 16
    return __builtin_ia32_vfmaddps512_mask(a, b, c, (unsigned short)0xffff, 4 /* current rounding */);
#elif DS_X86_BUILTINS && DS_W == 8
    /* register operands only: with the builtin, GCC 12 folds one operand
     * into a memory form and re-loads the shared one for every FMA of the
     * tile (two loads per FMA: load-bound at a third of the FMA rate) */
    __asm__("vfmadd231ps %1, %2, %0" : "+x"(c) : "x"(a), "x"(b));
    return c;
#elif DS_NEON_FMA && DS_W == 4
    return (DS_VF)vfmaq_f32((float32x4_t)c, (float32x4_t)a, (float32x4_t)b);
#else
    DS_VF r;
    for (int l = 0; l < DS_W; l++) r[l] = fmaf(a[l], b[l], c[l]);
    return r;
#endif
}

/* ---- one weight row -> f32 (the dequantization buffer, matmul_internal.h) ------
 * Exactly the values the tile's loaders produce (every conversion is exact),
 * so a tile reading this row as F32 computes the same bits as one converting
 * on the fly. */
DS_INLINE void DS_CAT(ds_cvt_row, DS_W)(uint32_t type, const void *row, int64_t K, float *out) {
    if (type == DS_TYPE_Q8_0) {
        const ds_block_q8_0 *blk = row;
        for (int64_t b = 0; b < K / DS_QK8_0; b++) {
            const float d = DS_WFN(ds_ld, _f16s)(blk[b].d);
            DS_UNROLL
            for (int h = 0; h < DS_QK8_0 / DS_W; h++) {
                const DS_VF w = DS_WFN(ds_ld, _q8)(blk[b].qs + h * DS_W) * d;
                memcpy(out + b * DS_QK8_0 + h * DS_W, &w, sizeof w);
            }
        }
        return;
    }
    int64_t k = 0;
    for (; k + DS_W <= K; k += DS_W) {
        const DS_VF w = DS_WFN(ds_ld, _w)(type, row, k);
        memcpy(out + k, &w, sizeof w);
    }
    for (; k < K; k++)
        out[k] = type == DS_TYPE_F16 ? ds_fp16_to_f32(((const uint16_t *)row)[k])
                                     : ds_bf16_to_f32(((const uint16_t *)row)[k]);
}

/* ---- the tile ------------------------------------------------------------------------
 * y[m0 .. m0+mv)[n0 .. n0+nv) (y has N columns) from the NT weight rows wr[]
 * (type F32, F16, BF16 or Q8_0; padding rows repeat a valid one) and the
 * activation rows x[m0 ..] (K floats each); MT x NT accumulators of 16 lanes.
 * The per-(m, n) sequence is the one matmul_internal.h defines: for every
 * 16-element step k, acc[l] = fma(w[k+l], x[k+l], acc[l]), where w is the
 * weight converted to f32 exactly (Q8_0: d * q, an exact product), then the
 * 16-lane tree. fast = 1 writes `acc + w * x` in a DS_FAST_FN instance (so
 * it contracts to FMA where the level has one) with the left-to-right lane
 * sum. */
DS_INLINE void DS_CAT(ds_tile, DS_W)(uint32_t type, int fast, int64_t K, const void *const wr[],
                                     const float *x, int m0, int mv, float *y, int64_t N,
                                     int64_t n0, int nv, int MT, int NT) {
    const int q8 = type == DS_TYPE_Q8_0;
    const size_t es = type == DS_TYPE_F32 ? 4 : 2;
    const void *xr[DS_MT_MAX];
    ds_tile_rows(x, (size_t)K * sizeof(float), m0, mv, MT, xr);

    DS_VF acc[DS_MT_MAX][DS_NT_MAX][DS_NC];
    DS_UNROLL
    for (int i = 0; i < MT; i++)
        DS_UNROLL
        for (int j = 0; j < NT; j++)
            DS_UNROLL
            for (int h = 0; h < DS_NC; h++) acc[i][j][h] = (DS_VF){0};

    /* One 16-element step, chunk by chunk (so only NT weight chunks and one
     * activation chunk are live beside the accumulators). WLOAD(j, h) gives
     * chunk h of weight row j, XPTR(i) the step's first activation of row i. */
#define DS_TILE_STEP(WLOAD, XPTR)                                                           \
    do {                                                                                    \
        DS_UNROLL                                                                           \
        for (int h_ = 0; h_ < DS_NC; h_++) {                                                \
            DS_VF w_[DS_NT_MAX];                                                            \
            DS_UNROLL                                                                       \
            for (int j = 0; j < NT; j++) w_[j] = WLOAD(j, h_);                              \
            DS_UNROLL                                                                       \
            for (int i = 0; i < MT; i++) {                                                  \
                const DS_VF xv_ = DS_WFN(ds_ld, _f32)((XPTR(i)) + h_ * DS_W);               \
                DS_UNROLL                                                                   \
                for (int j = 0; j < NT; j++)                                                \
                    acc[i][j][h_] = fast ? acc[i][j][h_] + w_[j] * xv_                      \
                                         : DS_CAT(ds_fma, DS_W)(w_[j], xv_, acc[i][j][h_]); \
            }                                                                               \
        }                                                                                   \
    } while (0)

    /* FAST splits K in two (split-K, as a GEMM does for parallelism): the
     * first half's accumulators are set aside at the split point and the
     * second half starts again from +0; the halves are added lane-wise at the
     * end. Canonical has no split (ksplit = end: phase 1 is empty). Zeroed
     * so that no compiler can think the halves' sum reads it unset (the
     * device's GCC under -O3 did: maybe-uninitialized, an error here). */
    DS_VF acc_lo[DS_MT_MAX][DS_NT_MAX][DS_NC] = {{{{0}}}};
#define DS_TILE_SPLIT()                                                                     \
    do {                                                                                    \
        DS_UNROLL                                                                           \
        for (int i = 0; i < MT; i++)                                                        \
            DS_UNROLL                                                                       \
            for (int j = 0; j < NT; j++)                                                    \
                DS_UNROLL                                                                   \
                for (int h = 0; h < DS_NC; h++) {                                           \
                    acc_lo[i][j][h] = acc[i][j][h];                                         \
                    acc[i][j][h] = (DS_VF){0};                                              \
                }                                                                           \
    } while (0)

    if (q8) {
        const int64_t nb = K / DS_QK8_0, bsplit = fast ? nb / 2 : nb;
        for (int64_t b = 0; b < nb; b++) {
            if (fast && b == bsplit) DS_TILE_SPLIT();
            const int8_t *qs[DS_NT_MAX];
            float d[DS_NT_MAX];
            DS_UNROLL
            for (int j = 0; j < NT; j++) {
                const ds_block_q8_0 *blk = (const ds_block_q8_0 *)wr[j] + b;
                qs[j] = blk->qs;
                d[j] = DS_WFN(ds_ld, _f16s)(blk->d);
            }
            /* d * q is exact in f32 (11-bit times 8-bit significand) */
#define DS_Q8_LO(j, h) (DS_WFN(ds_ld, _q8)(qs[j] + (h) * DS_W) * d[j])
#define DS_Q8_HI(j, h) (DS_WFN(ds_ld, _q8)(qs[j] + 16 + (h) * DS_W) * d[j])
#define DS_X_LO(i) ((const float *)xr[i] + b * DS_QK8_0)
#define DS_X_HI(i) ((const float *)xr[i] + b * DS_QK8_0 + 16)
            DS_TILE_STEP(DS_Q8_LO, DS_X_LO);
            DS_TILE_STEP(DS_Q8_HI, DS_X_HI);
#undef DS_Q8_LO
#undef DS_Q8_HI
#undef DS_X_LO
#undef DS_X_HI
        }
    } else {
        const int64_t Kf = K & ~(int64_t)15, ksplit = fast ? (Kf / 32) * 16 : Kf;
        /* One activation row (decode): the tile's NT weight rows are
         * consecutive, so the weights are one contiguous stream read as NT
         * short interleaved ones, which the hardware prefetchers follow
         * poorly (AMD Zen: a third below llama.cpp's row-at-a-time F16
         * decode). Each step therefore prefetches its share (NT x 16
         * elements) of the tile DS_PF_TILES tiles ahead, into L2 (locality
         * 2 = T1: into L1, as until session 36, the 1 GB F16 make-model
         * shape decoded at 59-67 ms a step on an AMD EPYC Zen 4, into L2 at
         * 49-54, interleaved; matmul_q8_0.c says why); past the weight's
         * end a prefetch is a no-op. A hint only: no value changes. */
        const size_t pf_step = (size_t)NT * 16 * es;
        const char *pf = MT == 1 ? (const char *)wr[0] + DS_PF_TILES * (size_t)K * es * (size_t)NT : NULL;
        for (int64_t k = 0; k < Kf; k += 16) {
            if (fast && k == ksplit) DS_TILE_SPLIT();
            if (pf) {
                const char *a = pf + (size_t)(k / 16) * pf_step;
                for (size_t o = 0; o < pf_step; o += 64) __builtin_prefetch(a + o, 0, 2);
            }
#define DS_D_W(j, h) DS_WFN(ds_ld, _w)(type, wr[j], k + (h) * DS_W)
#define DS_D_X(i) ((const float *)xr[i] + k)
            DS_TILE_STEP(DS_D_W, DS_D_X);
#undef DS_D_W
#undef DS_D_X
        }
        /* The K % 16 tail as one more step on zero-padded copies: fma(+0, +0,
         * acc) leaves an accumulator unchanged (see matmul_internal.h). */
        if (Kf < K) {
            const size_t r = (size_t)(K - Kf);
            _Alignas(64) unsigned char wpad[DS_NT_MAX][64];
            _Alignas(64) float xpad[DS_MT_MAX][16];
            DS_UNROLL
            for (int j = 0; j < NT; j++) {
                memset(wpad[j], 0, 64);                         /* +0 in f32, f16, bf16 */
                memcpy(wpad[j], (const char *)wr[j] + (size_t)Kf * es, r * es);
            }
            DS_UNROLL
            for (int i = 0; i < MT; i++) {
                memset(xpad[i], 0, 64);
                memcpy(xpad[i], (const float *)xr[i] + Kf, r * sizeof(float));
            }
#define DS_P_W(j, h) DS_WFN(ds_ld, _w)(type, wpad[j], (h) * DS_W)
#define DS_P_X(i) (xpad[i])
            DS_TILE_STEP(DS_P_W, DS_P_X);
#undef DS_P_W
#undef DS_P_X
        }
    }
#undef DS_TILE_STEP
#undef DS_TILE_SPLIT
    /* fast: add the halves (a K < 32 dense or one-block Q8_0 fast tile never
     * split: its first half is the +0 it started from) */
    if (fast) {
        const int split_done = q8 ? K / DS_QK8_0 / 2 > 0 : (K & ~(int64_t)15) / 32 > 0;
        if (split_done)
            DS_UNROLL
            for (int i = 0; i < MT; i++)
                DS_UNROLL
                for (int j = 0; j < NT; j++)
                    DS_UNROLL
                    for (int h = 0; h < DS_NC; h++) acc[i][j][h] = acc_lo[i][j][h] + acc[i][j][h];
    }

    float out[DS_MT_MAX][DS_NT_MAX];
    DS_UNROLL
    for (int i = 0; i < MT; i++)
        DS_UNROLL
        for (int j = 0; j < NT; j++) {
#if DS_W == 8
            /* canonical on AVX2: ds_hsum16_tree's additions, the same operands
             * in the same order, on vectors (GCC lowers the array loops to 15
             * scalar adds per output, a quarter of a K = 384 tile's time):
             * chunk 0 + chunk 1 is a[l] + a[l + 8] (l < 8); low + high half is
             * a[l] + a[l + 4] (l < 4); then a[l] + a[l + 2] and a[0] + a[1]. */
            if (!fast) {
                typedef float v4f_ __attribute__((vector_size(16)));
                const DS_VF t = acc[i][j][0] + acc[i][j][1];
                const v4f_ u = __builtin_shufflevector(t, t, 0, 1, 2, 3) +
                               __builtin_shufflevector(t, t, 4, 5, 6, 7);
                const v4f_ v = u + __builtin_shufflevector(u, u, 2, 3, 2, 3);
                out[i][j] = v[0] + v[1];
                continue;
            }
#endif
            float a[16];                         /* the 16 lanes, back in lane order */
            memcpy(a, acc[i][j], sizeof a);
            out[i][j] = fast ? ds_hsum16_seq(a) : ds_hsum16_tree(a);
        }
    ds_tile_store(y, N, m0, mv, n0, nv, out);
}

#undef DS_VF
#undef DS_VI
#undef DS_VU
#undef DS_VH
#undef DS_VS
#undef DS_VB
#undef DS_NC
