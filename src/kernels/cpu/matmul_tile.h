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

/* ---- the tile ------------------------------------------------------------------------
 * y[m0 .. m0+mv)[n0 .. n0+nv) for weight type `type` (F32, F16, BF16 or
 * Q8_0); MT x NT accumulators of 16 lanes. The per-(m, n) sequence is the
 * one matmul_internal.h (dense) and matmul_q8_0.c (Q8_0) define: for every
 * 16-element step k, acc[l] = acc[l] + w[k+l] * x[k+l], where w is the
 * weight converted to f32 exactly (Q8_0: d * q, an exact product), then the
 * 16-lane combine. fast = 1 is the same code in a DS_FAST_FN instance (so
 * `acc + w * x` contracts to FMA) with the left-to-right lane sum. */
DS_INLINE void DS_CAT(ds_tile, DS_W)(uint32_t type, int fast, const ds_mm_ctx *c, int m0,
                                     int mv, int64_t n0, int nv, int MT, int NT) {
    const int64_t K = c->W->n_in;
    const int q8 = type == DS_TYPE_Q8_0;
    const size_t es = type == DS_TYPE_F32 ? 4 : 2;
    const size_t wrow = q8 ? (size_t)(K / DS_QK8_0) * sizeof(ds_block_q8_0) : (size_t)K * es;
    const void *wr[DS_NT_MAX], *xr[DS_MT_MAX];
    ds_tile_rows(c->W->data, wrow, n0, nv, NT, wr);
    ds_tile_rows(c->x, (size_t)K * sizeof(float), m0, mv, MT, xr);

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
                for (int j = 0; j < NT; j++) acc[i][j][h_] = acc[i][j][h_] + w_[j] * xv_;   \
            }                                                                               \
        }                                                                                   \
    } while (0)

    if (q8) {
        const int64_t nb = K / DS_QK8_0;
        for (int64_t b = 0; b < nb; b++) {
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
        const int64_t Kf = K & ~(int64_t)15;
        for (int64_t k = 0; k < Kf; k += 16) {
#define DS_D_W(j, h) DS_WFN(ds_ld, _w)(type, wr[j], k + (h) * DS_W)
#define DS_D_X(i) ((const float *)xr[i] + k)
            DS_TILE_STEP(DS_D_W, DS_D_X);
#undef DS_D_W
#undef DS_D_X
        }
        /* The K % 16 tail as one more step on zero-padded copies: adding
         * +0 * +0 leaves an accumulator unchanged (see matmul_internal.h). */
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

    float out[DS_MT_MAX][DS_NT_MAX];
    DS_UNROLL
    for (int i = 0; i < MT; i++)
        DS_UNROLL
        for (int j = 0; j < NT; j++) {
            float a[16];                         /* the 16 lanes, back in lane order */
            memcpy(a, acc[i][j], sizeof a);
            out[i][j] = fast ? ds_hsum16_seq(a) : ds_hsum16_tree(a);
        }
    ds_tile_store(c->y, c->W->n_out, m0, mv, n0, nv, out);
}

#undef DS_VF
#undef DS_VI
#undef DS_VU
#undef DS_VH
#undef DS_VS
#undef DS_VB
#undef DS_NC
