/* matmul_q8_0.c — MATMUL_Q8_0 family: y[m][n] = sum_k W[n][k] * x[m][k] with
 * Q8_0 weights (blocks of 32 int8 quants q and one fp16 scale d).
 *
 *   decode     ds_matmul_decode -> the canonical kernel below with M = 1.
 *   canonical  weight dequantized on the fly, f32 activations as they are.
 *              Per (m, n), for every block b and half h (k = 32b + 16h):
 *                  w_l   = d_w * q[16h + l]                     (exact)
 *                  acc_l = fma(w_l, x[k + l], acc_l)       (one rounding)
 *              for lane l < 16 (lane = k mod 16), then y = the fixed tree
 *              8-4-2-1 over the 16 lanes. This is exactly MATMUL_F32's
 *              canonical kernel applied to the dequantized weight row.
 *              Decode (M = 1) and small batches dequantize in registers;
 *              for M > MT each weight tile is dequantized ONCE into a small
 *              f32 buffer that all row tiles of the batch read
 *              (matmul_internal.h): the same values, so the same bits.
 *   fast       what llama.cpp's CPU Q8_0 path does (ggml_vec_dot_q8_0_q8_0
 *              and its repacked GEMM): each activation row is QUANTIZED to
 *              Q8_0 once per call (ds_quantize_row_q8_0, in matmul.c), every
 *              32-block contributes the exact int32 dot of weight quants and
 *              activation quants, and that is scaled by d_w * d_x and
 *              accumulated in f32, one fma per block in block order (the
 *              FAST section below). AVX512-VNNI (VPDPBUSD on a repacked
 *              16-row weight tile), AVX2 (maddubs + madd) and scalar paths,
 *              all with the same bits. It differs from canonical by the
 *              activation's rounding to 8 bits (relative ~1e-3 per block,
 *              not an ulp), so batched verification with it really drifts
 *              from decode — as llama.cpp's does — and `dspark surface
 *              --kernels fast` finds greedy flips on the trained model.
 *
 * ==== Why this is canonical =========================================================
 * d_w is an fp16 (11-bit significand) and q an int8 (at most 8 bits), so
 * d_w * q has at most 19 significant bits and is exact in f32: the weight
 * vector a tile computes is the same value however, wherever and by whichever
 * instruction it is formed (in a register or through the buffer). After it,
 * every rounded operation — the fused multiply-add into lane k mod 16, the
 * combine tree — is written once, in one order that depends only on K, and
 * fusedMultiplyAdd is correctly rounded on every level (simd.h). Nothing depends on M, on the tile shape,
 * on the thread that owns the column or on the SIMD width (a lane is a lane
 * in a zmm, two ymm or four xmm), so canonical(M) row m is bit for bit
 * decode(row m), and decode is literally canonical with M = 1.
 *
 * ==== Why canonical does not quantize the activations ===============================
 * The previous canonical kernel was llama.cpp's Q8_0 x Q8_0 scheme: each
 * activation row quantized with ds_quantize_row_q8_0, exact integer block
 * dots, scaled by d_w * d_x. That is also canonical (the quantization is a
 * per-row function; the fast kernel is that scheme again, now with integer
 * dot instructions), but on f32 SIMD it is slower, not faster: a pass over
 * the activations per call, two integer->float conversions per block and
 * row, a scalar d_w * d_x and a vector broadcast per (m, n, block), and an
 * extra rounding of the activation that costs accuracy. Dequantizing the
 * weight instead costs one conversion per block *per weight row*, shared by
 * every activation row of the tile (of the batch, through the buffer), and
 * leaves the inner loop the F32 kernel's fused multiply-add, and it keeps
 * decode at f32 activation accuracy.
 *
 * The canonical tile engine is matmul_internal.h / matmul_tile.h, shared with
 * the dense families; each weight tile is read once for all M rows. The fast
 * kernel has its own tiles below; it too reads each weight tile once for all
 * M rows. */
#include "kernels/cpu/matmul_internal.h"

/* ==========================================================================
 * DECODE == CANONICAL (M = 1 is just the narrowest tile)
 * ========================================================================== */
DS_INLINE void q8_canonical(const ds_mm_ctx *c, int64_t n0, int64_t n1, int lv) {
    ds_mm_walk(DS_TYPE_Q8_0, 0, c, n0, n1, lv);
}
DS_MM_INSTANTIATE(ds_mm_q8_0_canonical, q8_canonical, /* contraction off */)

/* ==========================================================================
 * FAST — quantized activations, exact int8 x int8 block dots
 * ==========================================================================
 * For every (m, n), with the activation row quantized by matmul.c
 * (ds_quantize_row_q8_0: quants p, fp16 scales e) and the weight row's
 * quants q and fp16 scales d:
 *     acc = +0
 *     for b = 0 .. K/32 - 1:
 *         D   = sum_{l<32} q[32b + l] * p[32b + l]         (int32, exact)
 *         acc = fma((float)D, d_b * e_b, acc)               (one rounding)
 *     y = acc
 * (float)D is exact (|D| <= 32 * 128 * 127 < 2^24) and so is d_b * e_b (two
 * 11-bit significands), so the block's contribution is exact and each block
 * adds ONE rounding, in block order. Every path below computes exactly this,
 * so fast too gives the same bits on every SIMD level and thread count
 * (test_matmul compares each level with a scalar reference). */
static void q8f_portable(const ds_mm_ctx *c, int64_t n0, int64_t n1) {
    const int64_t K = c->W->n_in, N = c->W->n_out, nb = K / DS_QK8_0;
    const ds_q8_act *a = c->xq;
    for (int64_t n = n0; n < n1; n++) {
        const ds_block_q8_0 *w = (const ds_block_q8_0 *)c->W->data + n * nb;
        for (int m = 0; m < c->M; m++) {
            const ds_block_q8_0 *xb = a->q + (int64_t)m * nb;
            float acc = 0.0f;
            for (int64_t b = 0; b < nb; b++) {
                int32_t D = 0;
                for (int l = 0; l < DS_QK8_0; l++) D += (int32_t)w[b].qs[l] * xb[b].qs[l];
                acc = fmaf((float)D, ds_fp16_to_f32(w[b].d) * a->d[(int64_t)m * nb + b], acc);
            }
            c->y[(size_t)m * (size_t)N + (size_t)n] = acc;
        }
    }
}

#if DS_X86
#include <immintrin.h>

/* ---- AVX2: 2 x 2 tiles, llama.cpp's AVX2 block dot ---------------------------------
 * maddubs needs an unsigned operand: |q| as u8 times p carrying q's sign
 * (pair sums <= 2 * 128 * 127, no int16 saturation: activation quants are in
 * [-127, 127]), madd to int32, then the four (m, n) dots of the tile reduced
 * together with hadd; the four sums are exact integers, so the reduction
 * order is immaterial. */
#define Q8F_TGT_AVX2 __attribute__((target("avx2,fma,f16c")))
Q8F_TGT_AVX2 static void q8f_avx2(const ds_mm_ctx *c, int64_t n0, int64_t n1) {
    const int64_t K = c->W->n_in, N = c->W->n_out, nb = K / DS_QK8_0;
    const size_t wrow = (size_t)nb * sizeof(ds_block_q8_0);
    const ds_q8_act *a = c->xq;
    const int M = c->M;
    const __m256i ones = _mm256_set1_epi16(1);
    for (int64_t n = n0; n < n1; n += 2) {
        const int nv = n1 - n < 2 ? 1 : 2;
        const void *wr[2];
        ds_tile_rows(c->W->data, wrow, n, nv, 2, wr);
        const ds_block_q8_0 *w0 = wr[0], *w1 = wr[1];
        for (int m = 0; m < M; m += 2) {
            const int mv = M - m < 2 ? 1 : 2;
            const int64_t r0 = (int64_t)m * nb, r1 = (int64_t)(m + mv - 1) * nb;
            __m128 acc = _mm_setzero_ps();
            for (int64_t b = 0; b < nb; b++) {
                const __m256i q0 = _mm256_loadu_si256((const __m256i *)w0[b].qs);
                const __m256i q1 = _mm256_loadu_si256((const __m256i *)w1[b].qs);
                const __m256i p0 = _mm256_loadu_si256((const __m256i *)a->q[r0 + b].qs);
                const __m256i p1 = _mm256_loadu_si256((const __m256i *)a->q[r1 + b].qs);
                const __m256i u0 = _mm256_sign_epi8(q0, q0), u1 = _mm256_sign_epi8(q1, q1);
#define Q8F_DOT(u, q, p) _mm256_madd_epi16(_mm256_maddubs_epi16(u, _mm256_sign_epi8(p, q)), ones)
                const __m256i d00 = Q8F_DOT(u0, q0, p0), d01 = Q8F_DOT(u1, q1, p0);
                const __m256i d10 = Q8F_DOT(u0, q0, p1), d11 = Q8F_DOT(u1, q1, p1);
#undef Q8F_DOT
                const __m256i h = _mm256_hadd_epi32(_mm256_hadd_epi32(d00, d01),
                                                    _mm256_hadd_epi32(d10, d11));
                const __m128i D = _mm_add_epi32(_mm256_castsi256_si128(h),
                                                _mm256_extracti128_si256(h, 1));
                const float e0 = a->d[r0 + b], e1 = a->d[r1 + b];
                const float dw0 = ds_fp16_to_f32(w0[b].d), dw1 = ds_fp16_to_f32(w1[b].d);
                const __m128 sc = _mm_mul_ps(_mm_setr_ps(dw0, dw1, dw0, dw1),
                                             _mm_setr_ps(e0, e0, e1, e1));
                acc = _mm_fmadd_ps(_mm_cvtepi32_ps(D), sc, acc);   /* [m][n] [m][n+1] [m+1][n] [m+1][n+1] */
            }
            float o[4];
            _mm_storeu_ps(o, acc);
            for (int i = 0; i < mv; i++)
                for (int j = 0; j < nv; j++)
                    c->y[(size_t)(m + i) * (size_t)N + (size_t)(n + j)] = o[2 * i + j];
        }
    }
}

/* ---- AVX-512 VNNI: 16 output columns per vector ---------------------------------
 * Each 16-column tile of weight rows is first repacked (per call, into a small
 * buffer: 576 bytes per block, L1/L2-resident) so that vector s of block b
 * holds dword s (quants 4s .. 4s+3) of the 16 rows, one row per 32-bit lane
 * (a 16 x 8 dword transpose), biased to unsigned (q + 128 = q ^ 0x80), plus
 * the 16 scales as f32. Then for an activation row m, VPDPBUSD of vector s
 * with dword s of the row's block broadcast gives, in lane j, four products
 * of row j; eight of them, started from -128 * sum(p) (matmul.c), give in
 * lane j the exact D of (m, n + j) — no horizontal sums, and the f32 update
 * is one convert, one multiply (the scales) and one FMA for 16 outputs.
 * Rows run in register tiles of 8 (then 4, 2, 1): 8 weight vectors, 8 int32
 * and 8 f32 accumulators live; each repacked tile is read by all M rows. */
#define Q8F_TGT_VNNI \
    __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")))
#define Q8F_BLK 576                             /* bytes per repacked block */

Q8F_TGT_VNNI static void q8f_pack16(const void *const wr[16], int64_t nb, unsigned char *buf) {
    const __m512i lo = _mm512_setr_epi64(0, 1, 8, 9, 4, 5, 12, 13);
    const __m512i hi = _mm512_setr_epi64(2, 3, 10, 11, 6, 7, 14, 15);
    const __m512i bias = _mm512_set1_epi8((char)0x80);
    for (int64_t b = 0; b < nb; b++) {
        __m512i z[8];
        uint16_t dh[16];
        for (int p = 0; p < 8; p++) {          /* rows p (low half) and p + 8 (high half) */
            const ds_block_q8_0 *r = (const ds_block_q8_0 *)wr[p] + b;
            const ds_block_q8_0 *s = (const ds_block_q8_0 *)wr[p + 8] + b;
            z[p] = _mm512_inserti64x4(
                _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)r->qs)),
                _mm256_loadu_si256((const __m256i *)s->qs), 1);
            dh[p] = r->d;
            dh[p + 8] = s->d;
        }
        /* 8 x 8 dword transpose in each 256-bit half */
        __m512i t[8], u[8];
        for (int p = 0; p < 4; p++) {
            t[2 * p] = _mm512_unpacklo_epi32(z[2 * p], z[2 * p + 1]);
            t[2 * p + 1] = _mm512_unpackhi_epi32(z[2 * p], z[2 * p + 1]);
        }
        for (int g = 0; g < 2; g++) {           /* rows 0-3 (g = 0) and 4-7 (g = 1) */
            u[4 * g + 0] = _mm512_unpacklo_epi64(t[4 * g], t[4 * g + 2]);       /* dwords 0 | 4 */
            u[4 * g + 1] = _mm512_unpackhi_epi64(t[4 * g], t[4 * g + 2]);       /* 1 | 5 */
            u[4 * g + 2] = _mm512_unpacklo_epi64(t[4 * g + 1], t[4 * g + 3]);   /* 2 | 6 */
            u[4 * g + 3] = _mm512_unpackhi_epi64(t[4 * g + 1], t[4 * g + 3]);   /* 3 | 7 */
        }
        unsigned char *o = buf + b * Q8F_BLK;
        for (int s = 0; s < 4; s++) {
            _mm512_store_si512(o + 64 * s,
                               _mm512_xor_si512(_mm512_permutex2var_epi64(u[s], lo, u[4 + s]), bias));
            _mm512_store_si512(o + 64 * (s + 4),
                               _mm512_xor_si512(_mm512_permutex2var_epi64(u[s], hi, u[4 + s]), bias));
        }
        _mm512_store_ps(o + 512, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)dh)));
    }
}

static inline __attribute__((always_inline)) Q8F_TGT_VNNI void
q8f_rows16(const unsigned char *buf, int64_t nb, const ds_q8_act *a, int m0, int MT, float *y,
           int64_t N, int64_t n0, __mmask16 km) {
    __m512 acc[8];
    for (int i = 0; i < MT; i++) acc[i] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const unsigned char *o = buf + b * Q8F_BLK;
        __m512i T[8];
        for (int s = 0; s < 8; s++) T[s] = _mm512_load_si512(o + 64 * s);
        const __m512 dw = _mm512_load_ps(o + 512);
        for (int i = 0; i < MT; i++) {
            const int64_t ib = (int64_t)(m0 + i) * nb + b;
            const int8_t *p = a->q[ib].qs;
            __m512i D = _mm512_set1_epi32(a->nsum[ib]);
            for (int s = 0; s < 8; s++) {
                int32_t ps;
                memcpy(&ps, p + 4 * s, sizeof ps);
                D = _mm512_dpbusd_epi32(D, T[s], _mm512_set1_epi32(ps));
            }
            const __m512 sc = _mm512_mul_ps(dw, _mm512_set1_ps(a->d[ib]));
            acc[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(D), sc, acc[i]);
        }
    }
    for (int i = 0; i < MT; i++)
        _mm512_mask_storeu_ps(y + (size_t)(m0 + i) * (size_t)N + (size_t)n0, km, acc[i]);
}

Q8F_TGT_VNNI static void q8f_vnni(const ds_mm_ctx *c, int64_t n0, int64_t n1) {
    const int64_t K = c->W->n_in, N = c->W->n_out, nb = K / DS_QK8_0;
    const size_t wrow = (size_t)nb * sizeof(ds_block_q8_0);
    const int M = c->M;
    unsigned char *buf = aligned_alloc(64, (size_t)nb * Q8F_BLK);
    if (!buf) {                                 /* same bits, without the repacking */
        q8f_avx2(c, n0, n1);
        return;
    }
    for (int64_t n = n0; n < n1; n += 16) {
        const int nv = (int)(n1 - n < 16 ? n1 - n : 16);
        const void *wr[16];
        ds_tile_rows(c->W->data, wrow, n, nv, 16, wr);
        q8f_pack16(wr, nb, buf);
        const __mmask16 km = (__mmask16)((1u << nv) - 1u);
        int m = 0;
        for (; m + 8 <= M; m += 8) q8f_rows16(buf, nb, c->xq, m, 8, c->y, N, n, km);
        if (m + 4 <= M) { q8f_rows16(buf, nb, c->xq, m, 4, c->y, N, n, km); m += 4; }
        if (m + 2 <= M) { q8f_rows16(buf, nb, c->xq, m, 2, c->y, N, n, km); m += 2; }
        if (m < M) q8f_rows16(buf, nb, c->xq, m, 1, c->y, N, n, km);
    }
    free(buf);
}

static int q8f_have_vnni(void) {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512vnni");
}
#endif

void ds_mm_q8_0_fast(const ds_mm_ctx *c, int64_t n0, int64_t n1) {
#if DS_X86
    if (c->level == DS_LVL_AVX512 && q8f_have_vnni()) {
        q8f_vnni(c, n0, n1);
        return;
    }
    if (c->level >= DS_LVL_AVX2) {
        q8f_avx2(c, n0, n1);
        return;
    }
#endif
    q8f_portable(c, n0, n1);
}
