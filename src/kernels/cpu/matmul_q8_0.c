/* matmul_q8_0.c — MATMUL_Q8_0 family: y[m][n] = sum_k W[n][k] * x[m][k] with
 * Q8_0 weights (blocks of 32 int8 quants q and one fp16 scale d).
 *
 *   decode     ds_matmul_decode = ds_matmul(DS_CANONICAL, W, 1, ...): the
 *              canonical kernel below with M = 1 (matmul.c).
 *   canonical  the int8 definition (llama.cpp's Q8_0 x Q8_0 dot): each
 *              activation row is QUANTIZED to Q8_0 once per call
 *              (ds_quantize_row_q8_0, matmul.c: quants p, fp16 scales e),
 *              and for every (m, n), with the weight row's quants q and
 *              fp16 scales d:
 *                  acc = +0
 *                  for b = 0 .. K/32 - 1:                     (block order)
 *                      D   = sum_{l<32} q[32b + l] * p[32b + l]  (int32, exact)
 *                      acc = fma((float)D, d_b * e_b, acc)       (one rounding)
 *                  y = acc
 *   fast       the f32 GEMM an engine calls for a batch after dequantizing
 *              the weights once: w = d * q (exact) against the UNQUANTIZED
 *              f32 activations, register tiles with FMA, split-K (the two
 *              halves of the blocks accumulated separately, then added) and
 *              the 16 lanes summed left to right (the shared tile engine,
 *              matmul_internal.h, fast = 1).
 *
 * ==== Why the int8 definition is canonical ==========================================
 * The activation quantization is a function of the activation row alone,
 * computed once per row by the same ds_quantize_row_q8_0 whatever M is.
 * After it, D is an exact integer (|D| <= 32 * 128 * 127 < 2^24, so (float)D
 * is exact too) and d_b * e_b is exact (two 11-bit significands): the
 * block's contribution is the same VALUE however the 32 products are
 * summed. Only the fma into acc rounds, once per block, in block order — one
 * sequence per output that depends on K alone. So every way of computing D
 * gives the same bits: the repacked AVX512-VNNI tile (VPDPBUSD, 16 outputs
 * per vector), the non-repacked one-activation-row kernels (VPDPBUSD or
 * AVX2 maddubs per row block, exact horizontal integer reduce), the AVX2
 * 2 x 2 tile and the portable scalar loop. M, the tile shape, the thread
 * that owns a column and the SIMD level choose between them and never change
 * a bit (test_matmul compares every path and level with a scalar reference
 * of the definition), so canonical(M) row m is bit for bit decode(row m), and
 * decode is literally canonical with M = 1.
 *
 * It is also the fast way to run Q8_0 on a CPU, for decode as for batches:
 * 32 weights cost one integer dot instruction (or three on AVX2) instead
 * of 32 conversions and two f32 FMAs per row, and the weight bytes are
 * read as they are stored.
 *
 * ==== Why fast differs ================================================================
 * Fast multiplies the f32 activations themselves (no 8-bit rounding of x,
 * relative ~1e-3 per block) and sums in another order (split-K, lane sum):
 * what "dequantize the weights once, call an f32 GEMM" gives a batched
 * verifier. Its results are close to canonical's but not the decode bits —
 * the difference is the activation quantization, not an ulp — so batched
 * verification with it visibly drifts from decode, and `dspark surface
 * --kernels fast` finds greedy flips on the trained model. */
#include "kernels/cpu/matmul_internal.h"

/* ==========================================================================
 * CANONICAL (= decode) — quantized activations, exact int8 x int8 block dots
 * ==========================================================================
 * The portable path is the definition, literally: a scalar integer dot per
 * block and C's fmaf. */
static void q8c_portable(const ds_mm_ctx *c, int64_t n0, int64_t n1) {
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
#define Q8C_TGT_AVX2 __attribute__((target("avx2,fma,f16c")))
Q8C_TGT_AVX2 static void q8c_avx2(const ds_mm_ctx *c, int64_t n0, int64_t n1) {
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
#define Q8C_DOT(u, q, p) _mm256_madd_epi16(_mm256_maddubs_epi16(u, _mm256_sign_epi8(p, q)), ones)
                const __m256i d00 = Q8C_DOT(u0, q0, p0), d01 = Q8C_DOT(u1, q1, p0);
                const __m256i d10 = Q8C_DOT(u0, q0, p1), d11 = Q8C_DOT(u1, q1, p1);
#undef Q8C_DOT
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
 * buffer, L1/L2-resident) so that vector s of block b holds dword s (quants
 * 4s .. 4s+3) of the 16 rows, one row per 32-bit lane (a 16 x 8 dword
 * transpose), biased to unsigned (q + 128 = q ^ 0x80): 512 bytes per block
 * at b * 512; after the nb blocks, the 16 fp16 scales of each block (32
 * bytes at nb * 512 + 32 b, converted with VCVTPH2PS, exact), the region
 * padded to 64 bytes. A tile is Q8C_TILE(nb) bytes: the original's 34 bytes
 * per row-block exactly, plus at most 32 bytes of padding, so a pre-packed
 * copy costs no more memory than the weights it replaces. Then for an activation row m, VPDPBUSD of vector s
 * with dword s of the row's block broadcast gives, in lane j, four products
 * of row j; eight of them, started from -128 * sum(p) (matmul.c), give in
 * lane j the exact D of (m, n + j) — no horizontal sums, and the f32 update
 * is one convert, one multiply (the scales) and one FMA for 16 outputs.
 * Rows run in register tiles of 8 (the remainder, 1..7, as one more tile):
 * 8 weight vectors, 8 int32 and 8 f32 accumulators live; each repacked tile
 * is read by all M rows.
 * When W->packed is set (ds_q8_0_pack, once at load time) the tiles are
 * read from there instead of being rebuilt on every call. */
#define Q8C_TGT_VNNI \
    __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")))
#define Q8C_QB 512                              /* quant bytes per repacked block */
/* bytes of a repacked 16-row tile of nb blocks (64-byte multiple) */
#define Q8C_TILE(nb) ((size_t)(nb) * Q8C_QB + (((size_t)(nb) * 32 + 63) & ~(size_t)63))

Q8C_TGT_VNNI static void q8c_pack16(const void *const wr[16], int64_t nb, unsigned char *buf) {
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
        unsigned char *o = buf + b * Q8C_QB;
        for (int s = 0; s < 4; s++) {
            _mm512_store_si512(o + 64 * s,
                               _mm512_xor_si512(_mm512_permutex2var_epi64(u[s], lo, u[4 + s]), bias));
            _mm512_store_si512(o + 64 * (s + 4),
                               _mm512_xor_si512(_mm512_permutex2var_epi64(u[s], hi, u[4 + s]), bias));
        }
        _mm256_store_si256((__m256i *)(buf + (size_t)nb * Q8C_QB + (size_t)b * 32),
                           _mm256_loadu_si256((const __m256i *)dh));
    }
}

/* D += T . broadcast(dword at p): VPDPBUSD with the activation dword as an
 * embedded {1to16} broadcast memory operand — one load uop, no separate
 * VPBROADCASTD competing for the vector pipes (GCC does not fold it). */
#define Q8C_DPBUSD_BCST(D, T, p) \
    __asm__("vpdpbusd %2%{1to16%}, %1, %0" : "+v"(D) : "v"(T), "m"(*(const int32_t *)(const void *)(p)))

/* Rows m0 .. m0 + MT - 1 (MT <= 8, m0 % 8 == 0: one group of the
 * interleaved activations, ds_q8_act.qi) against one repacked 16-column
 * tile. Every activation operand is an immediate offset from one pointer per
 * block, so the register tile needs no general register per row (per-row
 * pointers spilled at MT = 8: ~3% at M = 8). */
static inline __attribute__((always_inline)) Q8C_TGT_VNNI void
q8c_rows16(const unsigned char *buf, int64_t nb, const ds_q8_act *a, int m0, int MT, float *y,
           int64_t N, int64_t n0, __mmask16 km, const unsigned char *pf) {
    __m512 acc[8];
    for (int i = 0; i < MT; i++) acc[i] = _mm512_setzero_ps();
    const unsigned char *g = a->qi + (size_t)(m0 / 8) * (size_t)nb * DS_Q8_GROUP_BYTES;
    for (int64_t b = 0; b < nb; b++, g += DS_Q8_GROUP_BYTES) {
        const unsigned char *o = buf + b * Q8C_QB;
        if (pf)   /* the next tile's block b (and its scales' line), a tile ahead */
            for (int s = 0; s < 8; s++) _mm_prefetch((const char *)pf + b * Q8C_QB + 64 * s, _MM_HINT_T0);
        if (pf && b % 2 == 0) _mm_prefetch((const char *)pf + (size_t)nb * Q8C_QB + (size_t)b * 32, _MM_HINT_T0);
        __m512i T[8];
        for (int s = 0; s < 8; s++) T[s] = _mm512_load_si512(o + 64 * s);
        const __m512 dw = _mm512_cvtph_ps(
            _mm256_load_si256((const __m256i *)(buf + (size_t)nb * Q8C_QB + (size_t)b * 32)));
        __m512i D[8];
        for (int i = 0; i < MT; i++) {
            int32_t ns;
            memcpy(&ns, g + 256 + 4 * i, sizeof ns);
            D[i] = _mm512_set1_epi32(ns);
        }
        for (int s = 0; s < 8; s++)
            for (int i = 0; i < MT; i++) Q8C_DPBUSD_BCST(D[i], T[s], g + 32 * i + 4 * s);
        for (int i = 0; i < MT; i++) {
            float e;
            memcpy(&e, g + 288 + 4 * i, sizeof e);
            const __m512 sc = _mm512_mul_ps(dw, _mm512_set1_ps(e));
            acc[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(D[i]), sc, acc[i]);
        }
    }
    for (int i = 0; i < MT; i++)
        _mm512_mask_storeu_ps(y + (size_t)(m0 + i) * (size_t)N + (size_t)n0, km, acc[i]);
}

Q8C_TGT_VNNI static void q8c_vnni_rows(const ds_mm_ctx *c, int64_t n0, int64_t n1);

/* The VNNI tile of weight rows n .. n+nv-1: the pre-packed one (pk, from
 * load time), else packed here into buf. */
Q8C_TGT_VNNI static inline const unsigned char *q8c_tile(const ds_mm_ctx *c, const unsigned char *pk, size_t wrow,
                                                         int64_t nb, int64_t n, int nv, unsigned char *buf) {
    if (pk) return pk + (size_t)(n / 16) * Q8C_TILE(nb);
    const void *wr[16];
    ds_tile_rows(c->W->data, wrow, n, nv, 16, wr);
    q8c_pack16(wr, nb, buf);
    return buf;
}

Q8C_TGT_VNNI static void q8c_vnni_repacked(const ds_mm_ctx *c, int64_t n0, int64_t n1) {
    const int64_t K = c->W->n_in, N = c->W->n_out, nb = K / DS_QK8_0;
    const size_t wrow = (size_t)nb * sizeof(ds_block_q8_0);
    const int M = c->M;
    /* pre-packed weights (ds_q8_0_pack, at load time): tile t = rows 16t ..
     * 16t + 15 is at t * Q8C_TILE(nb), exactly what q8c_pack16 builds here.
     * Ranges start on 16-column groups (matmul.c); any other start repacks. */
    const unsigned char *pk = n0 % 16 == 0 ? c->W->extra : NULL;
    unsigned char *buf = NULL;
    if (!pk) {                  /* repack into the thread's reserved scratch */
        if (c->tmp_bytes < Q8C_TILE(nb)) {   /* none: same bits, no repacking */
            q8c_vnni_rows(c, n0, n1);
            return;
        }
        buf = c->tmp;
    }
    for (int64_t n = n0; n < n1; n += 16) {
        const int nv = (int)(n1 - n < 16 ? n1 - n : 16);
        const unsigned char *tile = q8c_tile(c, pk, wrow, nb, n, nv, buf);
        const __mmask16 km = (__mmask16)((1u << nv) - 1u);
        /* With several rows a tile's compute is long enough to hide the next
         * tile's fetch from L3 / memory if it is asked for now (the hardware
         * prefetcher alone left the 8-row verify paying compute + stalls).
         * The first register tile of rows issues the prefetches. */
        const unsigned char *pf = pk && M > 1 && n + 16 < n1 ? tile + Q8C_TILE(nb) : NULL;
        /* canonical activations always carry the interleaved copy (matmul.c) */
        int m = 0;
        for (; m + 8 <= M; m += 8, pf = NULL) q8c_rows16(tile, nb, c->xq, m, 8, c->y, N, n, km, pf);
        /* the rest (a verify of ell + 1 <= 8 rows, the drafter's 7) in ONE
         * pass over the tile: each register-tile height is its own
         * instantiation, so the weights are read once for all rows */
        switch (M - m) {
        case 7: q8c_rows16(tile, nb, c->xq, m, 7, c->y, N, n, km, pf); break;
        case 6: q8c_rows16(tile, nb, c->xq, m, 6, c->y, N, n, km, pf); break;
        case 5: q8c_rows16(tile, nb, c->xq, m, 5, c->y, N, n, km, pf); break;
        case 4: q8c_rows16(tile, nb, c->xq, m, 4, c->y, N, n, km, pf); break;
        case 3: q8c_rows16(tile, nb, c->xq, m, 3, c->y, N, n, km, pf); break;
        case 2: q8c_rows16(tile, nb, c->xq, m, 2, c->y, N, n, km, pf); break;
        case 1: q8c_rows16(tile, nb, c->xq, m, 1, c->y, N, n, km, pf); break;
        default: break;
        }
    }
}

/* ---- one activation row, weight rows as stored (decode, small M) -------------------
 * Repacking a 16-row tile costs about as much as one pass of VPDPBUSD over
 * it, so for few activation rows the weights are read as stored instead:
 * 8 weight rows at a time, per block one 256-bit integer dot per row (8
 * int32 partial sums), the 8 x 8 partial sums reduced to the 8 exact D's
 * with a hadd tree (integers: the order is immaterial), then the 8 outputs'
 * fma in one vector, lane j = weight row j: the definition's sequence. The
 * 8 weight scales come in with one gather (dword at the scale: the fp16 and
 * the block's first two quants, which are masked off). The activation
 * rows run one after the other over the L1-resident 8-row weight slab. */
#define Q8C_TGT_ROW_AVX2 __attribute__((target("avx2,fma,f16c")))
#define Q8C_TGT_ROW_VNNI \
    __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")))

/* 8 vectors of 8 int32 -> one vector of their 8 totals (exact) */
#define Q8C_HSUM8(v, out)                                                                   \
    do {                                                                                    \
        const __m256i e_ = _mm256_hadd_epi32(_mm256_hadd_epi32(v[0], v[1]),                 \
                                             _mm256_hadd_epi32(v[2], v[3]));                \
        const __m256i f_ = _mm256_hadd_epi32(_mm256_hadd_epi32(v[4], v[5]),                 \
                                             _mm256_hadd_epi32(v[6], v[7]));                \
        out = _mm256_add_epi32(_mm256_permute2x128_si256(e_, f_, 0x20),                     \
                               _mm256_permute2x128_si256(e_, f_, 0x31));                    \
    } while (0)

/* vnni = 1: VPDPBUSD of (q ^ 0x80) (= q + 128, unsigned) with p, plus the
 * row's -128 * sum(p); vnni = 0: AVX2 maddubs of |q| with p signed by q. */
#define Q8C_ROW8_BODY(vnni)                                                                 \
    const int64_t K = c->W->n_in, N = c->W->n_out, nb = K / DS_QK8_0;                       \
    const size_t wrow = (size_t)nb * sizeof(ds_block_q8_0);                                 \
    const ds_q8_act *a = c->xq;                                                             \
    const __m256i bias = _mm256_set1_epi8((char)0x80), ones = _mm256_set1_epi16(1);         \
    const __m256i lo16 = _mm256_set1_epi32(0xffff);                                         \
    (void)bias; (void)ones;                                                                 \
    for (int64_t n = n0; n < n1; n += 8) {                                                  \
        const int nv = (int)(n1 - n < 8 ? n1 - n : 8);                                      \
        const void *wr[8];                                                                  \
        ds_tile_rows(c->W->data, wrow, n, nv, 8, wr);                                       \
        const ds_block_q8_0 *w[8];                                                          \
        int32_t off[8];                                                                     \
        for (int j = 0; j < 8; j++) {                                                       \
            w[j] = wr[j];                                                                   \
            off[j] = (int32_t)((const char *)wr[j] - (const char *)wr[0]);                  \
        }                                                                                   \
        const __m256i vidx = _mm256_loadu_si256((const __m256i *)off);                      \
        for (int m = 0; m < c->M; m++) {                                                    \
            const ds_block_q8_0 *xb = a->q + (int64_t)m * nb;                               \
            const float *xd = a->d + (int64_t)m * nb;                                       \
            const int32_t *xs = a->nsum + (int64_t)m * nb;                                  \
            __m256 acc = _mm256_setzero_ps();                                               \
            for (int64_t b = 0; b < nb; b++) {                                              \
                const __m256i p = _mm256_loadu_si256((const __m256i *)xb[b].qs);            \
                __m256i v[8], D;                                                            \
                for (int j = 0; j < 8; j++) {                                               \
                    const __m256i q = _mm256_loadu_si256((const __m256i *)w[j][b].qs);      \
                    v[j] = Q8C_ROW_DOT(vnni, q, p);                                         \
                }                                                                           \
                Q8C_HSUM8(v, D);                                                            \
                if (vnni) D = _mm256_add_epi32(D, _mm256_set1_epi32(xs[b]));                \
                const __m256i g = _mm256_and_si256(                                         \
                    _mm256_i32gather_epi32((const int *)&w[0][b].d, vidx, 1), lo16);       \
                const __m128i h = _mm_packus_epi32(_mm256_castsi256_si128(g),               \
                                                   _mm256_extracti128_si256(g, 1));         \
                const __m256 sc = _mm256_mul_ps(_mm256_cvtph_ps(h), _mm256_set1_ps(xd[b])); \
                acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(D), sc, acc);                      \
            }                                                                               \
            float o[8];                                                                     \
            _mm256_storeu_ps(o, acc);                                                       \
            for (int j = 0; j < nv; j++) c->y[(size_t)m * (size_t)N + (size_t)(n + j)] = o[j]; \
        }                                                                                   \
    }

#define Q8C_ROW_DOT(vnni, q, p)                                                             \
    ((vnni) ? Q8C_DOT_VNNI(q, p)                                                            \
            : _mm256_madd_epi16(                                                            \
                  _mm256_maddubs_epi16(_mm256_sign_epi8(q, q), _mm256_sign_epi8(p, q)), ones))

#define Q8C_DOT_VNNI(q, p) _mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm256_xor_si256(q, bias), p)
Q8C_TGT_ROW_VNNI static void q8c_vnni_rows(const ds_mm_ctx *c, int64_t n0, int64_t n1) {
    Q8C_ROW8_BODY(1)
}
#undef Q8C_DOT_VNNI
#define Q8C_DOT_VNNI(q, p) _mm256_setzero_si256()          /* not taken on AVX2 */
Q8C_TGT_ROW_AVX2 static void q8c_avx2_rows(const ds_mm_ctx *c, int64_t n0, int64_t n1) {
    Q8C_ROW8_BODY(0)
}
#undef Q8C_DOT_VNNI
#undef Q8C_ROW_DOT
#undef Q8C_ROW8_BODY
#undef Q8C_HSUM8

static int q8c_have_vnni(void) {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512vnni");
}
#endif

/* ---- pre-packing at load time (kernels.h) ---------------------------------------------
 * The whole weight as consecutive repacked 16-row tiles, tile t at
 * t * Q8C_TILE(nb) bytes, the last tile padded by repeating row N - 1 (as
 * ds_tile_rows does per call). Only where the VNNI tile runs: AVX-512 level
 * with VNNI. */
size_t ds_q8_0_packed_bytes(const ds_weight *W) {
#if DS_X86
    if (W->type != DS_TYPE_Q8_0 || W->n_in <= 0 || W->n_in % DS_QK8_0 || W->n_out <= 0) return 0;
    if (ds_simd_level() != DS_LVL_AVX512 || !q8c_have_vnni()) return 0;
    const uint64_t tiles = (uint64_t)(W->n_out + 15) / 16, nb = (uint64_t)(W->n_in / DS_QK8_0);
    if (tiles > SIZE_MAX / Q8C_TILE(nb)) return 0;
    return (size_t)tiles * Q8C_TILE(nb);
#else
    (void)W;
    return 0;
#endif
}

#if DS_X86
Q8C_TGT_VNNI static void q8c_pack_all(const ds_weight *W, unsigned char *dst) {
    const int64_t nb = W->n_in / DS_QK8_0, N = W->n_out;
    const size_t wrow = (size_t)nb * sizeof(ds_block_q8_0);
    for (int64_t n = 0; n < N; n += 16) {
        const int nv = (int)(N - n < 16 ? N - n : 16);
        const void *wr[16];
        ds_tile_rows(W->data, wrow, n, nv, 16, wr);
        q8c_pack16(wr, nb, dst + (size_t)(n / 16) * Q8C_TILE(nb));
    }
}
#endif

/* Row `row` of a pre-packed weight (W->extra) back to f32, read from the
 * tile layout alone: lane j = row % 16 of tile row / 16; dword s of block b
 * at b * 512 + 64 s + 4 j (biased: q ^ 0x80), the block's fp16 scale at
 * nb * 512 + 32 b + 2 j. d * q is exact, so
 * this equals ds_row_to_f32 of the original row bit for bit — and the
 * original's pages need not be resident (the embedding lookup of a tied
 * head reads this). */
void ds_q8_0_packed_row(const ds_weight *W, int64_t row, float *out) {
    const int64_t nb = W->n_in / DS_QK8_0;
    const unsigned char *t = (const unsigned char *)W->extra + (size_t)(row / 16) * Q8C_TILE(nb);
    const int j = (int)(row % 16);
    for (int64_t b = 0; b < nb; b++) {
        const unsigned char *o = t + b * Q8C_QB;
        uint16_t dh;
        memcpy(&dh, t + (size_t)nb * Q8C_QB + (size_t)b * 32 + 2 * (size_t)j, sizeof dh);
        const float d = ds_fp16_to_f32(dh);
        for (int s = 0; s < 8; s++)
            for (int e = 0; e < 4; e++)
                out[b * DS_QK8_0 + 4 * s + e] = d * (float)(int8_t)(o[64 * s + 4 * j + e] ^ 0x80);
    }
}

int ds_q8_0_pack(const ds_weight *W, void *dst) {
    if (!ds_q8_0_packed_bytes(W) || ((uintptr_t)dst & 63)) return -1;
#if DS_X86
    q8c_pack_all(W, dst);
    return 0;
#else
    return -1;
#endif
}

/* Path choice: M < Q8C_REPACK_MIN_M runs the non-repacked one-row kernels
 * (AVX512-VNNI / AVX2), larger M the repacked VNNI tile / the AVX2 2 x 2
 * tile. With pre-packed weights (W->extra, set by the CPU backend's prepare_weight on
 * AVX-512 VNNI) the VNNI tile costs no repacking and is the faster path from
 * M = 1 (decode included: ~2x over the one-row kernel on the tiny model).
 * c->q8_path forces one (tests). All give the definition's bits. */
#define Q8C_REPACK_MIN_M 2
/* With pre-packed weights (W->extra) the tile costs no repacking: */
#ifndef Q8C_PACKED_MIN_M
#define Q8C_PACKED_MIN_M 1
#endif

void ds_mm_q8_0_canonical(const ds_mm_ctx *c, int64_t n0, int64_t n1) {
#if DS_X86
    const int repack = c->q8_path ? c->q8_path == DS_Q8_PATH_REPACKED
                                  : c->M >= (c->W->extra ? Q8C_PACKED_MIN_M : Q8C_REPACK_MIN_M);
    if (c->level == DS_LVL_AVX512 && q8c_have_vnni()) {
        if (repack) q8c_vnni_repacked(c, n0, n1);
        else q8c_vnni_rows(c, n0, n1);
        return;
    }
    if (c->level >= DS_LVL_AVX2) {
        if (repack) q8c_avx2(c, n0, n1);
        else q8c_avx2_rows(c, n0, n1);
        return;
    }
#endif
    q8c_portable(c, n0, n1);
}

/* ==========================================================================
 * FAST — int8 VNNI with its own activation grouping (AVX-512 VNNI), else
 * dequantized weights against f32 activations (other levels)
 * ==========================================================================
 * On AVX-512 VNNI the fast kernel is what a performance engineer writes for
 * a batch once the weights sit in the VNNI tile layout: the same packed
 * tiles and VPDPBUSD as canonical, but each activation ROW is quantized
 * with ONE scale (amax / 127 over the whole row, not per 32-block), so the
 * per-block update needs no activation scale: per (row, 16 columns, block)
 * one convert and one FMA with the weight scales (canonical: convert,
 * multiply d_w * e_b, FMA), and the row scale multiplies the sum once at the
 * end. Fewer vector ops per VPDPBUSD and no per-block scale loads: faster
 * than canonical at every M (bench --profile's kernel table).
 *
 * Why the bits differ: the activation rounding is another one (a row scale
 * rounds small blocks of a row with a large amax more coarsely), and the
 * sum is sum_b (float)D_b * d_b then times e, not sum_b (float)D_b * (d_b * e_b).
 * Still a function of the row and K alone: thread counts and M never change
 * it. On AVX2 / portable (and without scratch for repacking) fast is the
 * shared f32 tile engine (matmul_internal.h, fast = 1): dequantized weights
 * against the unquantized activations, split-K and a left-to-right lane sum. */
DS_INLINE void q8_fast_f32(const ds_mm_ctx *c, int64_t n0, int64_t n1, int lv) {
    ds_mm_walk(DS_TYPE_Q8_0, 1, c, n0, n1, lv);
}
DS_MM_INSTANTIATE(q8_fast_f32_range, q8_fast_f32, DS_FAST_FN)

#if DS_X86
int ds_q8_0_fast_vnni(int level) { return level == DS_LVL_AVX512 && q8c_have_vnni(); }

/* Row m of x (K floats) -> K / 32 blocks of quants (the d field unused), the
 * blocks' -128 * sum(quants) and the row scale amax / 127. Rounding: VCVTPS2DQ
 * (nearest even) of x * (127 / amax), saturated to [-127, 127]. */
Q8C_TGT_VNNI void ds_q8_0_fast_quantize(const float *x, int M, int64_t K, ds_block_q8_0 *q,
                                        int32_t *nsum, float *d) {
    const int64_t nb = K / DS_QK8_0;
    const __m512 absmask = _mm512_castsi512_ps(_mm512_set1_epi32(0x7fffffff));
    for (int m = 0; m < M; m++) {
        const float *xr = x + (size_t)m * (size_t)K;
        __m512 mx = _mm512_setzero_ps();
        for (int64_t k = 0; k < K; k += 16) mx = _mm512_max_ps(mx, _mm512_and_ps(_mm512_loadu_ps(xr + k), absmask));
        const float amax = _mm512_reduce_max_ps(mx);
        d[m] = amax / 127.0f;
        const __m512 inv = _mm512_set1_ps(amax > 0.0f ? 127.0f / amax : 0.0f);
        const __m512i lo = _mm512_set1_epi32(-127), hi = _mm512_set1_epi32(127);
        for (int64_t b = 0; b < nb; b++) {
            const float *xb = xr + b * DS_QK8_0;
            __m512i a = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(xb), inv));
            __m512i c = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(xb + 16), inv));
            a = _mm512_min_epi32(_mm512_max_epi32(a, lo), hi);
            c = _mm512_min_epi32(_mm512_max_epi32(c, lo), hi);
            ds_block_q8_0 *o = q + (size_t)m * (size_t)nb + b;
            o->d = 0;
            _mm_storeu_si128((__m128i *)o->qs, _mm512_cvtepi32_epi8(a));
            _mm_storeu_si128((__m128i *)(o->qs + 16), _mm512_cvtepi32_epi8(c));
            nsum[(size_t)m * (size_t)nb + b] = -128 * _mm512_reduce_add_epi32(_mm512_add_epi32(a, c));
        }
    }
}

static inline __attribute__((always_inline)) Q8C_TGT_VNNI void
q8f_rows16(const unsigned char *buf, int64_t nb, const ds_q8_act *a, int m0, int MT, float *y,
           int64_t N, int64_t n0, __mmask16 km) {
    __m512 acc[8];
    for (int i = 0; i < MT; i++) acc[i] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const unsigned char *o = buf + b * Q8C_QB;
        __m512i T[8];
        for (int s = 0; s < 8; s++) T[s] = _mm512_load_si512(o + 64 * s);
        const __m512 dw = _mm512_cvtph_ps(
            _mm256_load_si256((const __m256i *)(buf + (size_t)nb * Q8C_QB + (size_t)b * 32)));
        __m512i D[8];
        for (int i = 0; i < MT; i++) D[i] = _mm512_set1_epi32(a->nsum[(int64_t)(m0 + i) * nb + b]);
        for (int s = 0; s < 8; s++)
            for (int i = 0; i < MT; i++) {
                int32_t ps;
                memcpy(&ps, a->q[(int64_t)(m0 + i) * nb + b].qs + 4 * s, sizeof ps);
                D[i] = _mm512_dpbusd_epi32(D[i], T[s], _mm512_set1_epi32(ps));
            }
        for (int i = 0; i < MT; i++) acc[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(D[i]), dw, acc[i]);
    }
    for (int i = 0; i < MT; i++)
        _mm512_mask_storeu_ps(y + (size_t)(m0 + i) * (size_t)N + (size_t)n0, km,
                              _mm512_mul_ps(acc[i], _mm512_set1_ps(a->d[m0 + i])));
}

Q8C_TGT_VNNI static int q8f_vnni(const ds_mm_ctx *c, int64_t n0, int64_t n1) {
    const int64_t K = c->W->n_in, N = c->W->n_out, nb = K / DS_QK8_0;
    const size_t wrow = (size_t)nb * sizeof(ds_block_q8_0);
    const unsigned char *pk = n0 % 16 == 0 ? c->W->extra : NULL;
    if (!pk && c->tmp_bytes < Q8C_TILE(nb)) return -1;
    const int M = c->M;
    for (int64_t n = n0; n < n1; n += 16) {
        const int nv = (int)(n1 - n < 16 ? n1 - n : 16);
        const unsigned char *tile = q8c_tile(c, pk, wrow, nb, n, nv, c->tmp);
        const __mmask16 km = (__mmask16)((1u << nv) - 1u);
        int m = 0;
        for (; m + 8 <= M; m += 8) q8f_rows16(tile, nb, c->xq, m, 8, c->y, N, n, km);
        if (m + 4 <= M) { q8f_rows16(tile, nb, c->xq, m, 4, c->y, N, n, km); m += 4; }
        if (m + 2 <= M) { q8f_rows16(tile, nb, c->xq, m, 2, c->y, N, n, km); m += 2; }
        if (m < M) q8f_rows16(tile, nb, c->xq, m, 1, c->y, N, n, km);
    }
    return 0;
}
#else
int ds_q8_0_fast_vnni(int level) { (void)level; return 0; }
void ds_q8_0_fast_quantize(const float *x, int M, int64_t K, ds_block_q8_0 *q, int32_t *nsum, float *d) {
    (void)x; (void)M; (void)K; (void)q; (void)nsum; (void)d;
}
#endif

void ds_mm_q8_0_fast(const ds_mm_ctx *c, int64_t n0, int64_t n1) {
#if DS_X86
    /* c->xq is set (by matmul.c) exactly when the VNNI fast path runs */
    if (c->xq && q8f_vnni(c, n0, n1) == 0) return;
#endif
    q8_fast_f32_range(c, n0, n1);
}
