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
 * S8 tile (VPMADDWD), the AVX-VNNI 8-row tile (VPDPBUSD on ymm, level
 * avxvnni), the AArch64 SDOT / SMULL tiles and SMMLA pairs (levels dotprod,
 * neon, i8mm) and the portable scalar loop. M, the tile shape, the thread
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

/* The VNNI16 layout's sizes (below), also known where it is never built
 * (ds_weight_packed_row reads either layout on every architecture). */
#define Q8C_QB 512                              /* quant bytes per repacked block */
/* bytes of a repacked 16-row tile of nb blocks (64-byte multiple) */
#define Q8C_TILE(nb) ((size_t)(nb) * Q8C_QB + (((size_t)(nb) * 32 + 63) & ~(size_t)63))

#if DS_X86
#include <immintrin.h>

#define Q8C_TGT_AVX2 __attribute__((target("avx2,fma,f16c")))

/* ---- the weight stream: software prefetch into L2, a tile ahead ---------------------
 * Every packed walker below asks for the tile(s) after the ones it computes,
 * block by block while it computes, at every M: a whole tile of lead time
 * (~1 us at decode, more for a batch) against a memory latency of ~0.1-0.2
 * us. The hint is T1, into L2. Until session 36 it was T0, into L1, and
 * that is what kept an 8-row verify from overlapping its compute with the
 * weight stream: on the 505 MB Q8_0 shape at avx512 (AMD EPYC Zen 4, one
 * thread) the verify's matmuls took decode's stream time PLUS their
 * hot-weight compute time (52 ms = 31 + 22). The likely reasons: the next
 * tile (17 KB at K = 1024), the current one and an 8-row batch's
 * interleaved activations (10 KB) do not fit a 32-48 KB L1, so prefetched
 * lines evict the ones in use; and each T0 request holds one of the L1's
 * few miss buffers until its line arrives, which caps the stream's
 * concurrency below what the L2's own misses reach. Into L2 the tile ahead
 * waits where there is room (>= 1 MB) and the tile's loads hit L2, whose
 * latency the out-of-order core hides. Measured, interleaved A/B medians
 * (bench/results/cpu-s36-verify-m505.txt): the 8-row verify at avx512 52 ->
 * 35 ms, the drafting round (7 rows) 6.7 -> 4.0 ms, decode 33 -> 29 ms at
 * avx512 and 45 -> 31 ms at avx2 (the S8 tile had prefetched into L1 at
 * M = 1 too; VNNI16 did not prefetch at M = 1 and now does). T2 measured as
 * T1, NTA and T0 at 2-4 tiles as T0 at 1. Only addresses are prefetched,
 * never a value read: no bit depends on it. */
#if DS_X86
#define Q8_PF_HINT _MM_HINT_T1
#endif

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
        if (pf)   /* the next tile's block b (and its scales' line), a tile ahead, into L2 */
            for (int s = 0; s < 8; s++) _mm_prefetch((const char *)pf + b * Q8C_QB + 64 * s, Q8_PF_HINT);
        if (pf && b % 2 == 0) _mm_prefetch((const char *)pf + (size_t)nb * Q8C_QB + (size_t)b * 32, Q8_PF_HINT);
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
    const unsigned char *pk = n0 % 16 == 0 && ds_pack_layout(c->W) == DS_PACK_Q8_VNNI16 ? ds_pack_data(c->W) : NULL;
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
        /* A tile's compute is long enough to hide the next tile's fetch from
         * L3 / memory if it is asked for now, into L2 (above): the hardware
         * prefetcher alone left the 8-row verify paying compute + stalls,
         * and decode's stream runs faster with it too. The first register
         * tile of rows issues the prefetches. */
        const unsigned char *pf = pk && n + 16 < n1 ? tile + Q8C_TILE(nb) : NULL;
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

/* ---- the 8-row signed tile (AVX2) -------------------------------------------------------
 * Layout DS_PACK_Q8_S8: tiles of 8 weight rows; in a tile, block b's quants
 * at b * 256: chunk t (16 bytes at b * 256 + 16 t, t = 0..15) holds quants
 * 2t and 2t+1 of the 8 rows, row j at bytes 2j, 2j+1 — a transpose of the
 * rows' int16 pairs, the quants kept as signed bytes; after the nb blocks
 * the 8 fp16 scales of each block (16 bytes at nb * 256 + 16 b), padded to
 * 32 bytes. 34 bytes per row and block, as stored, plus the padding.
 *
 * The AVX2 dot (q8s_rows8): VPMOVSXBW widens chunk t to int16 (lane j = row
 * j's pair), and for an activation row VPMADDWD with its pair t broadcast
 * (the int16 copy of the quants, ds_q8_act.qw) adds the two exact products
 * into lane j; after the 16 pairs lane j holds the exact D of (m, n + j): no
 * horizontal sums, and the f32 update is one convert, one multiply
 * (d_w * e) and one FMA for 8 outputs — the definition's sequence lane by
 * lane. Two multiply-class instructions per 32 products and row, where the
 * byte form (VPSIGNB + VPMADDUBSW + VPMADDWD, llama.cpp's AVX2 dot) needs
 * three: on a CPU with two vector multiply pipes that is the bound (a
 * 2-core AMD EPYC, DSPARK_SIMD=avx2: ~55 -> see README). The widening is
 * done once per (block, chunk) and shared by all rows of the tile. */
#define Q8S_QB 256                              /* quant bytes per block of a tile */
#define Q8S_TILE(nb) ((size_t)(nb) * Q8S_QB + (((size_t)(nb) * 16 + 31) & ~(size_t)31))
#define Q8S_MT 8                                /* activation rows per register tile */

/* 8 weight rows (wr, padding rows repeated) -> one S8 tile (portable C: it
 * runs once per weight at load, or per call where no packed copy exists) */
static void q8s_pack8(const void *const wr[8], int64_t nb, unsigned char *buf) {
    for (int64_t b = 0; b < nb; b++) {
        unsigned char *o = buf + b * Q8S_QB;
        for (int j = 0; j < 8; j++) {
            const ds_block_q8_0 *r = (const ds_block_q8_0 *)wr[j] + b;
            for (int t = 0; t < 16; t++) memcpy(o + 16 * t + 2 * j, r->qs + 2 * t, 2);
            memcpy(buf + (size_t)nb * Q8S_QB + (size_t)b * 16 + 2 * (size_t)j, &r->d, 2);
        }
    }
    memset(buf + (size_t)nb * Q8S_QB + (size_t)nb * 16, 0, Q8S_TILE(nb) - (size_t)nb * Q8S_QB - (size_t)nb * 16);
}

#if DS_X86
/* The 8-row tiles' shared pieces (S8 and VNNI8 have the same tile size and
 * scale placement): the prefetch of the NT tiles after these, one block at a
 * time, and the store of an MT x NT accumulator tile (the last tile nv valid
 * columns). */
static inline __attribute__((always_inline)) Q8C_TGT_AVX2 void
q8_tiles8_prefetch(const unsigned char *pf, int NT, int64_t nb, int64_t b) {
    DS_UNROLL
    for (int j = 0; j < NT; j++) {
        const char *pj = (const char *)pf + (size_t)j * Q8S_TILE(nb);
        for (int l = 0; l < 4; l++) _mm_prefetch(pj + b * Q8S_QB + 64 * l, Q8_PF_HINT);
        if (b % 4 == 0) _mm_prefetch(pj + (size_t)nb * Q8S_QB + (size_t)b * 16, Q8_PF_HINT);
    }
}
static inline __attribute__((always_inline)) Q8C_TGT_AVX2 void
q8_tiles8_store(__m256 acc[4][4], int MT, int NT, int nv, float *y, int64_t N, int m0, int64_t n0) {
    DS_UNROLL
    for (int i = 0; i < MT; i++)
        DS_UNROLL
        for (int j = 0; j < NT; j++) {
            float *yo = y + (size_t)(m0 + i) * (size_t)N + (size_t)(n0 + 8 * j);
            if (j < NT - 1 || nv == 8) {
                _mm256_storeu_ps(yo, acc[i][j]);
            } else {
                float o8[8];
                _mm256_storeu_ps(o8, acc[i][j]);
                memcpy(yo, o8, (size_t)nv * sizeof(float));
            }
        }
}

/* The register tile: rows m0 .. m0 + MT - 1 of the activations (inside one
 * group of 8 of the copies: m0 % 8 + MT <= 8) against NT consecutive S8
 * tiles t[0..NT) (8 columns each; the last has nv valid). MT x NT int32 D's
 * (<= 8) live in registers over a block; per pair t the NT widened weight
 * chunks are shared by the MT rows and each row's broadcast pair by the NT
 * tiles. The f32 accumulators (updated once per block) stay in a small
 * array. Shapes: decode 1 x 4, two rows 2 x 4, three 3 x 2, four or more
 * 4 x 2 (M = 8: two row tiles, the second reading the tiles from L1). */
static inline __attribute__((always_inline)) Q8C_TGT_AVX2 void
q8s_tile_rows(const unsigned char *const t[], int NT, int nv, int64_t nb, const ds_q8_act *a, int m0, int MT,
              float *y, int64_t N, int64_t n0, const unsigned char *pf) {
    __m256 acc[4][4];
    DS_UNROLL
    for (int i = 0; i < MT; i++)
        DS_UNROLL
        for (int j = 0; j < NT; j++) acc[i][j] = _mm256_setzero_ps();
    const int16_t *w16 = a->qw + (size_t)(m0 / 8) * (size_t)nb * 256 + 32 * (m0 % 8);
    const unsigned char *ge = a->qi + (size_t)(m0 / 8) * (size_t)nb * DS_Q8_GROUP_BYTES + 288 + 4 * (m0 % 8);
    for (int64_t b = 0; b < nb; b++, w16 += 256, ge += DS_Q8_GROUP_BYTES) {
        if (pf) q8_tiles8_prefetch(pf, NT, nb, b);   /* the NT tiles after these, a block ahead */
        __m256i D[4][4];
        DS_UNROLL
        for (int i = 0; i < MT; i++)
            DS_UNROLL
            for (int j = 0; j < NT; j++) D[i][j] = _mm256_setzero_si256();
        _Pragma("GCC unroll 2")
        for (int k = 0; k < 16; k++) {
            __m256i q[4];
            DS_UNROLL
            for (int j = 0; j < NT; j++)
                q[j] = _mm256_cvtepi8_epi16(_mm_load_si128((const __m128i *)(t[j] + b * Q8S_QB + 16 * k)));
            DS_UNROLL
            for (int i = 0; i < MT; i++) {
                int32_t pp;
                memcpy(&pp, w16 + 32 * i + 2 * k, sizeof pp);
                const __m256i p = _mm256_set1_epi32(pp);
                DS_UNROLL
                for (int j = 0; j < NT; j++) D[i][j] = _mm256_add_epi32(D[i][j], _mm256_madd_epi16(q[j], p));
            }
        }
        __m256 dw[4];
        DS_UNROLL
        for (int j = 0; j < NT; j++)
            dw[j] = _mm256_cvtph_ps(_mm_load_si128((const __m128i *)(t[j] + (size_t)nb * Q8S_QB + (size_t)b * 16)));
        DS_UNROLL
        for (int i = 0; i < MT; i++) {
            float e;
            memcpy(&e, ge + 4 * i, sizeof e);
            const __m256 ev = _mm256_set1_ps(e);
            DS_UNROLL
            for (int j = 0; j < NT; j++)
                acc[i][j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(D[i][j]), _mm256_mul_ps(dw[j], ev), acc[i][j]);
        }
    }
    q8_tiles8_store(acc, MT, NT, nv, y, N, m0, n0);
}

/* MT rows at m0 against NT tiles, the shapes instantiated (MT, NT constants) */
static inline __attribute__((always_inline)) Q8C_TGT_AVX2 void
q8s_run(const unsigned char *const t[], int NT, int nv, int64_t nb, const ds_q8_act *a, int m0, int MT, float *y,
        int64_t N, int64_t n0, const unsigned char *pf) {
#define Q8S_CASE(mt, nt) \
    if (MT == mt && NT == nt) { q8s_tile_rows(t, nt, nv, nb, a, m0, mt, y, N, n0, pf); return; }
    Q8S_CASE(1, 1) Q8S_CASE(1, 2) Q8S_CASE(1, 3) Q8S_CASE(1, 4)
    Q8S_CASE(2, 1) Q8S_CASE(2, 2) Q8S_CASE(2, 3) Q8S_CASE(2, 4)
    Q8S_CASE(3, 1) Q8S_CASE(3, 2)
    Q8S_CASE(4, 1) Q8S_CASE(4, 2)
#undef Q8S_CASE
}

/* NT S8 tiles of weight rows n .. n + 8 NT - 1 (the last nv valid): the
 * packed ones (pk), else packed here into buf. */
typedef void (*q8_pack8_fn)(const void *const wr[8], int64_t nb, unsigned char *buf);
static inline void q8s_tiles(const ds_mm_ctx *c, const unsigned char *pk, size_t wrow, int64_t nb, int64_t n,
                             int NT, int nv, unsigned char *buf, const unsigned char *t[4], q8_pack8_fn pack) {
    for (int j = 0; j < NT; j++) {
        if (pk) {
            t[j] = pk + (size_t)(n / 8 + j) * Q8S_TILE(nb);
            continue;
        }
        const void *wr[8];
        ds_tile_rows(c->W->data, wrow, n + 8 * j, j == NT - 1 ? nv : 8, 8, wr);
        unsigned char *o = buf + (size_t)j * Q8S_TILE(nb);
        pack(wr, nb, o);
        t[j] = o;
    }
}

Q8C_TGT_AVX2 static void q8c_avx2_rows(const ds_mm_ctx *c, int64_t n0, int64_t n1);

/* All M rows over [n0, n1) in column groups of up to 4 tiles (32 columns;
 * 2 tiles from three rows on), each group's tiles read by every row tile.
 * Without a packed copy it packs into the thread's scratch (with no scratch
 * or no int16 activations it runs the one-row kernel: same bits). */
Q8C_TGT_AVX2 static void q8c_avx2_s8(const ds_mm_ctx *c, int64_t n0, int64_t n1) {
    const int64_t K = c->W->n_in, N = c->W->n_out, nb = K / DS_QK8_0;
    const size_t wrow = (size_t)nb * sizeof(ds_block_q8_0);
    const int M = c->M, GT = M <= 2 ? 4 : 2;            /* tiles per column group */
    const unsigned char *pk = n0 % 8 == 0 && ds_pack_layout(c->W) == DS_PACK_Q8_S8 ? ds_pack_data(c->W) : NULL;
    unsigned char *buf = NULL;
    if (!c->xq->qw) {
        q8c_avx2_rows(c, n0, n1);
        return;
    }
    if (!pk) {
        if (c->tmp_bytes < 4 * Q8S_TILE(nb) || ((uintptr_t)c->tmp & 31)) {
            q8c_avx2_rows(c, n0, n1);
            return;
        }
        buf = c->tmp;
    }
    for (int64_t n = n0; n < n1; n += 8 * GT) {
        const int64_t cols = n1 - n < 8 * GT ? n1 - n : 8 * GT;
        const int NT = (int)((cols + 7) / 8), nv = (int)(cols - 8 * (NT - 1));
        const unsigned char *t[4];
        q8s_tiles(c, pk, wrow, nb, n, NT, nv, buf, t, q8s_pack8);
        const unsigned char *pf = pk && n + cols < n1 ? t[NT - 1] + Q8S_TILE(nb) : NULL;
        /* row tiles of up to 4 (2 beside 3 or 4 tiles: at most 8 D's),
         * inside the groups of 8 rows of the activation copies */
        const int mt_max = NT > 2 ? 2 : 4;
        for (int m = 0; m < M; pf = NULL) {
            int MT = M - m < mt_max ? M - m : mt_max;
            if (MT > 8 - m % 8) MT = 8 - m % 8;
            q8s_run(t, NT, nv, nb, c->xq, m, MT, c->y, N, n, pf);
            m += MT;
        }
    }
}
#endif

/* ---- the 8-row VNNI tile (AVX-VNNI: VPDPBUSD on ymm without AVX-512) ------------------
 * Layout DS_PACK_Q8_VNNI8: tiles of 8 weight rows; in a tile, block b's quants
 * at b * 256: vector s (32 bytes at b * 256 + 32 s, s = 0..7) holds dword s
 * (quants 4s .. 4s+3) of the 8 rows, row j at bytes 4j .. 4j+3, biased to
 * unsigned (q ^ 0x80 = q + 128) — the VNNI16 tile's transpose at 8 lanes;
 * after the nb blocks the 8 fp16 scales of each block (16 bytes at nb * 256
 * + 16 b), padded to 32 bytes: the S8 tile's size, Q8S_TILE(nb).
 *
 * The dot (q8v_tile_rows): VPDPBUSD of vector s with the activation row's
 * dword s broadcast adds, in lane j, the four products (q + 128) p of row j;
 * the eight of a block, started from the row's -128 * sum(p) (nsum), give in
 * lane j the exact D of (m, n + j), as on VNNI16. One instruction per 32
 * products and row where the S8 tile needs a VPMADDWD and a VPADDD per 16:
 * a quarter of the integer work, which is what bounds an 8-row verify on an
 * AVX2 core. The f32 update is the definition's, lane by lane. */
static void q8v_pack8(const void *const wr[8], int64_t nb, unsigned char *buf) {
    for (int64_t b = 0; b < nb; b++) {
        unsigned char *o = buf + b * Q8S_QB;
        for (int j = 0; j < 8; j++) {
            const ds_block_q8_0 *r = (const ds_block_q8_0 *)wr[j] + b;
            for (int s = 0; s < 8; s++)
                for (int e = 0; e < 4; e++) o[32 * s + 4 * j + e] = (unsigned char)(r->qs[4 * s + e] ^ 0x80);
            memcpy(buf + (size_t)nb * Q8S_QB + (size_t)b * 16 + 2 * (size_t)j, &r->d, 2);
        }
    }
    memset(buf + (size_t)nb * Q8S_QB + (size_t)nb * 16, 0, Q8S_TILE(nb) - (size_t)nb * Q8S_QB - (size_t)nb * 16);
}

#if DS_X86
#define Q8V_TGT __attribute__((target("avx2,fma,f16c,avxvnni")))

/* MT rows at m0 (inside one group of 8 of the interleaved copy) against NT
 * consecutive VNNI8 tiles: MT x NT int32 D's and f32 accumulators in
 * registers (<= 6 + 6 of the 16 ymm), the NT weight vectors of a dword
 * shared by the MT rows. */
static inline __attribute__((always_inline)) Q8V_TGT void
q8v_tile_rows(const unsigned char *const t[], int NT, int nv, int64_t nb, const ds_q8_act *a, int m0, int MT,
              float *y, int64_t N, int64_t n0, const unsigned char *pf) {
    __m256 acc[4][4];
    DS_UNROLL
    for (int i = 0; i < MT; i++)
        DS_UNROLL
        for (int j = 0; j < NT; j++) acc[i][j] = _mm256_setzero_ps();
    const unsigned char *g = a->qi + (size_t)(m0 / 8) * (size_t)nb * DS_Q8_GROUP_BYTES + 32 * (m0 % 8);
    const unsigned char *ge = a->qi + (size_t)(m0 / 8) * (size_t)nb * DS_Q8_GROUP_BYTES + 4 * (m0 % 8);
    for (int64_t b = 0; b < nb; b++, g += DS_Q8_GROUP_BYTES, ge += DS_Q8_GROUP_BYTES) {
        if (pf) q8_tiles8_prefetch(pf, NT, nb, b);   /* the NT tiles after these, a block ahead */
        __m256i D[4][4];
        DS_UNROLL
        for (int i = 0; i < MT; i++) {
            int32_t ns;
            memcpy(&ns, ge + 256 + 4 * i, sizeof ns);
            DS_UNROLL
            for (int j = 0; j < NT; j++) D[i][j] = _mm256_set1_epi32(ns);
        }
        DS_UNROLL
        for (int s = 0; s < 8; s++) {
            __m256i q[4];
            DS_UNROLL
            for (int j = 0; j < NT; j++) q[j] = _mm256_load_si256((const __m256i *)(t[j] + b * Q8S_QB + 32 * s));
            DS_UNROLL
            for (int i = 0; i < MT; i++) {
                int32_t pp;
                memcpy(&pp, g + 32 * i + 4 * s, sizeof pp);
                const __m256i p = _mm256_set1_epi32(pp);
                DS_UNROLL
                for (int j = 0; j < NT; j++) D[i][j] = _mm256_dpbusd_avx_epi32(D[i][j], q[j], p);
            }
        }
        __m256 dw[4];
        DS_UNROLL
        for (int j = 0; j < NT; j++)
            dw[j] = _mm256_cvtph_ps(_mm_load_si128((const __m128i *)(t[j] + (size_t)nb * Q8S_QB + (size_t)b * 16)));
        DS_UNROLL
        for (int i = 0; i < MT; i++) {
            float e;
            memcpy(&e, ge + 288 + 4 * i, sizeof e);
            const __m256 ev = _mm256_set1_ps(e);
            DS_UNROLL
            for (int j = 0; j < NT; j++)
                acc[i][j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(D[i][j]), _mm256_mul_ps(dw[j], ev), acc[i][j]);
        }
    }
    q8_tiles8_store(acc, MT, NT, nv, y, N, m0, n0);
}

static inline __attribute__((always_inline)) Q8V_TGT void
q8v_run(const unsigned char *const t[], int NT, int nv, int64_t nb, const ds_q8_act *a, int m0, int MT, float *y,
        int64_t N, int64_t n0, const unsigned char *pf) {
#define Q8V_CASE(mt, nt) \
    if (MT == mt && NT == nt) { q8v_tile_rows(t, nt, nv, nb, a, m0, mt, y, N, n0, pf); return; }
    Q8V_CASE(1, 1) Q8V_CASE(1, 2) Q8V_CASE(1, 3) Q8V_CASE(1, 4)
    Q8V_CASE(2, 1) Q8V_CASE(2, 2)
    Q8V_CASE(3, 1) Q8V_CASE(3, 2)
    Q8V_CASE(4, 1) Q8V_CASE(4, 2)
#undef Q8V_CASE
}

/* All M rows over [n0, n1): decode in groups of 4 tiles (32 columns, 4 + 4
 * registers), more rows in groups of 2 tiles and row tiles of up to 4 (8 D's
 * and 8 accumulators), M = 8 as 4 + 4 over the same two tiles (L1; tiles of
 * 3, 3 + 3 + 2, measured 5-20% slower: bench/results/cpu-s33-verify-profile.txt). */
Q8V_TGT static void q8c_avxvnni(const ds_mm_ctx *c, int64_t n0, int64_t n1) {
    const int64_t K = c->W->n_in, N = c->W->n_out, nb = K / DS_QK8_0;
    const size_t wrow = (size_t)nb * sizeof(ds_block_q8_0);
    const int M = c->M, GT = M == 1 ? 4 : 2, mt_max = M == 1 ? 1 : M == 2 ? 2 : M == 3 ? 3 : 4;
    const unsigned char *pk = n0 % 8 == 0 && ds_pack_layout(c->W) == DS_PACK_Q8_VNNI8 ? ds_pack_data(c->W) : NULL;
    unsigned char *buf = NULL;
    if (!pk) {
        if (c->tmp_bytes < 4 * Q8S_TILE(nb) || ((uintptr_t)c->tmp & 31)) {
            q8c_avx2_rows(c, n0, n1);          /* no scratch: the one-row kernel, same bits */
            return;
        }
        buf = c->tmp;
    }
    for (int64_t n = n0; n < n1; n += 8 * GT) {
        const int64_t cols = n1 - n < 8 * GT ? n1 - n : 8 * GT;
        const int NT = (int)((cols + 7) / 8), nv = (int)(cols - 8 * (NT - 1));
        const unsigned char *t[4];
        q8s_tiles(c, pk, wrow, nb, n, NT, nv, buf, t, q8v_pack8);
        const unsigned char *pf = pk && n + cols < n1 ? t[NT - 1] + Q8S_TILE(nb) : NULL;
        for (int m = 0; m < M; pf = NULL) {
            int MT = M - m < mt_max ? M - m : mt_max;
            if (MT > 8 - m % 8) MT = 8 - m % 8;
            q8v_run(t, NT, nv, nb, c->xq, m, MT, c->y, N, n, pf);
            m += MT;
        }
    }
}
#endif

#if DS_ARM
/* ---- AArch64: NEON / dotprod ------------------------------------------------------------
 * The same tile structure as the x86 ones: a tile of 4 weight rows is loaded
 * once per block for up to 4 activation rows. Per (row, weight row) the
 * block's 32 products go into 4 int32 lanes (ds_neon_dot16: SDOT on the
 * dotprod level, SMULL + SADALP on neon), ADDP folds the four weight rows'
 * lanes into one vector whose lane j is the exact D of weight row j, and
 * the f32 update is one convert, one multiply (d_w * e) and one FMLA for 4
 * outputs: acc = fma((float)D, d_w * e, acc), the definition's sequence lane
 * by lane (FMLA is IEEE fusedMultiplyAdd like fmaf). The 4 fp16 weight
 * scales are converted with FCVTL (exact). */
/* rows m0 .. m0 + MT - 1 of a tile: lane j of acc[i] is output (m0 + i, n + j) */
DS_INLINE void q8n_store(const ds_mm_ctx *c, const float32x4_t acc[], int m0, int MT, int64_t n, int nv) {
    const int64_t N = c->W->n_out;
    DS_UNROLL
    for (int i = 0; i < MT; i++) {
        float o[4];
        vst1q_f32(o, acc[i]);
        memcpy(c->y + (size_t)(m0 + i) * (size_t)N + (size_t)n, o, (size_t)nv * sizeof(float));
    }
}

DS_INLINE void q8n_tile(const ds_mm_ctx *c, const ds_block_q8_0 *const w[4], int nv, int m0, int MT,
                        int64_t n, int dp) {
    const int64_t nb = c->W->n_in / DS_QK8_0;
    const ds_q8_act *a = c->xq;
    float32x4_t acc[4];
    DS_UNROLL
    for (int i = 0; i < MT; i++) acc[i] = vdupq_n_f32(0.0f);
    for (int64_t b = 0; b < nb; b++) {
        int8x16_t q[4][2];
        uint16_t dh[4];
        DS_UNROLL
        for (int j = 0; j < 4; j++) {
            q[j][0] = vld1q_s8(w[j][b].qs);
            q[j][1] = vld1q_s8(w[j][b].qs + 16);
            dh[j] = w[j][b].d;
        }
        const float32x4_t dw = vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(dh)));
        DS_UNROLL
        for (int i = 0; i < MT; i++) {
            const int64_t xi = (int64_t)(m0 + i) * nb + b;
            const int8x16_t p0 = vld1q_s8(a->q[xi].qs), p1 = vld1q_s8(a->q[xi].qs + 16);
            int32x4_t s[4];
            DS_UNROLL
            for (int j = 0; j < 4; j++)
                s[j] = ds_neon_dot16(ds_neon_dot16(vdupq_n_s32(0), q[j][0], p0, dp), q[j][1], p1, dp);
            const int32x4_t D = vpaddq_s32(vpaddq_s32(s[0], s[1]), vpaddq_s32(s[2], s[3]));
            acc[i] = vfmaq_f32(acc[i], vcvtq_f32_s32(D), vmulq_n_f32(dw, a->d[xi]));
        }
    }
    q8n_store(c, acc, m0, MT, n, nv);
}

/* ---- AArch64 i8mm: SMMLA, 2 weight rows x 2 activation rows an instruction ---------------
 * The same 4-weight-row tile, for up to 4 activation rows taken in pairs.
 * SMMLA multiplies a 2 x 8 int8 matrix by the transpose of another into a
 * 2 x 2 int32 block, so with A = 8 quants of activation rows (i, i+1) and
 * B = the same 8 positions of weight rows (j, j+1) (ds_neon_zip2x8 pairs the
 * rows' 64-bit halves), four SMMLAs over a block's 32 quants leave in lanes
 * [2i' + j'] the exact D of (row i + i', weight row j + j') — 32 products an
 * instruction where SDOT does 16, and the weight operands serve both
 * activation rows. ZIP1/ZIP2 of the two weight pairs' blocks then give each
 * activation row the vector of its four D's, and the f32 update is the
 * dotprod tile's: one FMLA per row and block, fma((float)D, d_w * e, acc),
 * in block order. An odd row count pads the last pair with a repeat of its
 * row (computed, not stored), as ds_tile_rows pads weight rows. One row
 * alone (decode, and the last row of an odd M above 4) runs the dotprod tile:
 * SMMLA would spend half its lanes on the padding row, and the bits are the
 * same either way. */
DS_INLINE void q8m_tile(const ds_mm_ctx *c, const ds_block_q8_0 *const w[4], int nv, int m0, int MT,
                        int64_t n) {
    const int64_t nb = c->W->n_in / DS_QK8_0;
    const ds_q8_act *a = c->xq;
    const int P = (MT + 1) / 2;                 /* activation row pairs */
    int64_t row[4];
    DS_UNROLL
    for (int i = 0; i < 4; i++) row[i] = m0 + (i < MT ? i : MT - 1);
    float32x4_t acc[4];
    DS_UNROLL
    for (int i = 0; i < 2 * P; i++) acc[i] = vdupq_n_f32(0.0f);
    for (int64_t b = 0; b < nb; b++) {
        int8x16_t wv[2][4];                     /* weight pair q, quants 8k .. 8k + 7 */
        uint16_t dh[4];
        DS_UNROLL
        for (int q = 0; q < 2; q++) {
            const ds_block_q8_0 *r0 = &w[2 * q][b], *r1 = &w[2 * q + 1][b];
            ds_neon_zip2x8(vld1q_s8(r0->qs), vld1q_s8(r1->qs), &wv[q][0], &wv[q][1]);
            ds_neon_zip2x8(vld1q_s8(r0->qs + 16), vld1q_s8(r1->qs + 16), &wv[q][2], &wv[q][3]);
            dh[2 * q] = r0->d;
            dh[2 * q + 1] = r1->d;
        }
        const float32x4_t dw = vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(dh)));
        DS_UNROLL
        for (int p = 0; p < P; p++) {
            const int64_t x0 = row[2 * p] * nb + b, x1 = row[2 * p + 1] * nb + b;
            int8x16_t av[4];
            ds_neon_zip2x8(vld1q_s8(a->q[x0].qs), vld1q_s8(a->q[x1].qs), &av[0], &av[1]);
            ds_neon_zip2x8(vld1q_s8(a->q[x0].qs + 16), vld1q_s8(a->q[x1].qs + 16), &av[2], &av[3]);
            int32x4_t D[2];
            DS_UNROLL
            for (int q = 0; q < 2; q++) {
                D[q] = vdupq_n_s32(0);
                DS_UNROLL
                for (int k = 0; k < 4; k++) D[q] = ds_neon_mmla(D[q], av[k], wv[q][k]);
            }
            /* D[q] = [r0.w2q, r0.w2q+1, r1.w2q, r1.w2q+1] -> per row [w0, w1, w2, w3] */
            const int32x4_t d0 = vreinterpretq_s32_s64(vzip1q_s64(vreinterpretq_s64_s32(D[0]), vreinterpretq_s64_s32(D[1])));
            const int32x4_t d1 = vreinterpretq_s32_s64(vzip2q_s64(vreinterpretq_s64_s32(D[0]), vreinterpretq_s64_s32(D[1])));
            acc[2 * p] = vfmaq_f32(acc[2 * p], vcvtq_f32_s32(d0), vmulq_n_f32(dw, a->d[x0]));
            acc[2 * p + 1] = vfmaq_f32(acc[2 * p + 1], vcvtq_f32_s32(d1), vmulq_n_f32(dw, a->d[x1]));
        }
    }
    q8n_store(c, acc, m0, MT, n, nv);
}

/* the level's tile for MT rows: SMMLA pairs (i8mm, MT >= 2), else SDOT /
 * SMULL + SADALP */
DS_INLINE void q8n_tile_lv(const ds_mm_ctx *c, const ds_block_q8_0 *const w[4], int nv, int m0, int MT,
                           int64_t n, int lv) {
    if (lv == DS_LVL_I8MM && MT >= 2) q8m_tile(c, w, nv, m0, MT, n);
    else q8n_tile(c, w, nv, m0, MT, n, lv != DS_LVL_NEON);
}

DS_INLINE void q8n_canonical(const ds_mm_ctx *c, int64_t n0, int64_t n1, int lv) {
    const int64_t nb = c->W->n_in / DS_QK8_0;
    const size_t wrow = (size_t)nb * sizeof(ds_block_q8_0);
    for (int64_t n = n0; n < n1; n += 4) {
        const int nv = (int)(n1 - n < 4 ? n1 - n : 4);
        const void *wr[4];
        ds_tile_rows(c->W->data, wrow, n, nv, 4, wr);
        const ds_block_q8_0 *w[4] = {wr[0], wr[1], wr[2], wr[3]};
        int m = 0;
        for (; m + 4 <= c->M; m += 4) q8n_tile_lv(c, w, nv, m, 4, n, lv);
        switch (c->M - m) {      /* the rest in one pass over the 4 weight rows */
        case 3: q8n_tile_lv(c, w, nv, m, 3, n, lv); break;
        case 2: q8n_tile_lv(c, w, nv, m, 2, n, lv); break;
        case 1: q8n_tile_lv(c, w, nv, m, 1, n, lv); break;
        default: break;
        }
    }
}
static void q8n_neon(const ds_mm_ctx *c, int64_t n0, int64_t n1) { q8n_canonical(c, n0, n1, DS_LVL_NEON); }
static void q8n_dotprod(const ds_mm_ctx *c, int64_t n0, int64_t n1) { q8n_canonical(c, n0, n1, DS_LVL_DOTPROD); }
static void q8n_i8mm(const ds_mm_ctx *c, int64_t n0, int64_t n1) { q8n_canonical(c, n0, n1, DS_LVL_I8MM); }
#endif

/* ---- pre-packing at load time (kernels.h) ---------------------------------------------
 * The whole weight as consecutive tiles of the level's layout, tile t at
 * t * TILE(nb) bytes after the header, the last tile padded by repeating row
 * N - 1 (as ds_tile_rows does per call): AVX-512 with VNNI the 16-row VNNI
 * tile, AVX2 (and AVX-512 without VNNI) the 8-row S8 tile. */
static int q8_pack_layout_at(const ds_weight *W, int lv) {
    if (W->n_in <= 0 || W->n_in % DS_QK8_0 || W->n_out <= 0) return DS_PACK_NONE;
#if DS_X86
    /* Q4_0 / Q5_0 on AVX2 (AVX-VNNI included) and AVX-512: the dword-transposed tile
     * (matmul_kq.h, kq_t8): no horizontal sums, nibbles and fifth bits
     * expanded once per block for all rows of a register tile */
    if ((W->type == DS_TYPE_Q4_0 || W->type == DS_TYPE_Q5_0) &&
        (lv == DS_LVL_AVX2 || lv == DS_LVL_AVXVNNI || lv == DS_LVL_AVX512))
        return DS_PACK_KQ_T8;
#endif
    if (W->type != DS_TYPE_Q8_0) return DS_PACK_NONE;
#if DS_X86
    if (lv == DS_LVL_AVX512 && q8c_have_vnni()) return DS_PACK_Q8_VNNI16;
    if (lv == DS_LVL_AVXVNNI) return DS_PACK_Q8_VNNI8;
    if (lv == DS_LVL_AVX2 || lv == DS_LVL_AVX512) return DS_PACK_Q8_S8;
#endif
    (void)lv;
    return DS_PACK_NONE;
}
static size_t q8_pack_tile_bytes(int layout, uint32_t type, int64_t nb) {
    return layout == DS_PACK_Q8_VNNI16 ? Q8C_TILE(nb) : layout == DS_PACK_KQ_T8 ? KQ_T8_TILE(type, nb) : Q8S_TILE(nb);
}
static int q8_pack_rows(int layout) { return layout == DS_PACK_Q8_VNNI16 ? 16 : 8; }

/* 8 Q4_0 / Q5_0 weight rows (padding rows repeated) -> one T8 tile
 * (matmul_internal.h: DS_PACK_KQ_T8) */
static void kq_t8_pack8(uint32_t type, const void *const wr[8], int64_t nb, unsigned char *buf) {
    const size_t QB = KQ_T8_QB(type);
    for (int64_t b = 0; b < nb; b++) {
        unsigned char *o = buf + (size_t)b * QB;
        for (int j = 0; j < 8; j++) {
            const uint8_t *qs;
            uint16_t d;
            if (type == DS_TYPE_Q5_0) {
                const ds_block_q5_0 *x = (const ds_block_q5_0 *)wr[j] + b;
                uint32_t qh;
                memcpy(&qh, x->qh, 4);
                for (int e = 0; e < 4; e++) {
                    /* bits e, e+4, ..., e+28 of qh -> bits 0..7 (compress the
                     * nibble-strided bits in three mask-and-shift steps) */
                    uint32_t v = (qh >> e) & 0x11111111u;
                    v = (v | v >> 3) & 0x03030303u;
                    v = (v | v >> 6) & 0x000f000fu;
                    v = (v | v >> 12) & 0xffu;
                    o[128 + 4 * j + e] = (unsigned char)v;
                }
                qs = x->qs;
                d = x->d;
            } else {
                const ds_block_q4_0 *x = (const ds_block_q4_0 *)wr[j] + b;
                qs = x->qs;
                d = x->d;
            }
            for (int a = 0; a < 4; a++) memcpy(o + 32 * a + 4 * j, qs + 4 * a, 4);
            memcpy(buf + (size_t)nb * QB + (size_t)b * 16 + 2 * (size_t)j, &d, 2);
        }
    }
    memset(buf + (size_t)nb * QB + (size_t)nb * 16, 0, KQ_T8_TILE(type, nb) - (size_t)nb * QB - (size_t)nb * 16);
}

size_t ds_weight_pack_bytes_at(const ds_weight *W, int lv) {
    const int layout = q8_pack_layout_at(W, lv);
    if (layout == DS_PACK_NONE) return 0;
    const int R = q8_pack_rows(layout);
    const uint64_t tiles = (uint64_t)(W->n_out + R - 1) / (uint64_t)R, nb = (uint64_t)(W->n_in / DS_QK8_0);
    const size_t tb = q8_pack_tile_bytes(layout, W->type, (int64_t)nb);
    if (tiles > (SIZE_MAX - DS_PACK_HDR) / tb) return 0;
    return DS_PACK_HDR + (size_t)tiles * tb;
}
size_t ds_weight_pack_bytes(const ds_weight *W) { return ds_weight_pack_bytes_at(W, ds_simd_mm_level()); }

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

int ds_weight_pack_at(const ds_weight *W, int lv, void *dst) {
    const int layout = q8_pack_layout_at(W, lv);
    if (layout == DS_PACK_NONE || !dst || ((uintptr_t)dst & 63)) return -1;
    const int64_t nb = W->n_in / DS_QK8_0, N = W->n_out;
    unsigned char *d = (unsigned char *)dst + DS_PACK_HDR;
    if (layout == DS_PACK_Q8_VNNI16) {
#if DS_X86
        q8c_pack_all(W, d);
#endif
    } else if (layout == DS_PACK_KQ_T8) {
        const size_t wrow = (size_t)nb * ds_type_block_bytes(W->type);
        for (int64_t n = 0; n < N; n += 8) {
            const void *wr[8];
            ds_tile_rows(W->data, wrow, n, (int)(N - n < 8 ? N - n : 8), 8, wr);
            kq_t8_pack8(W->type, wr, nb, d + (size_t)(n / 8) * KQ_T8_TILE(W->type, nb));
        }
    } else {
        const size_t wrow = (size_t)nb * sizeof(ds_block_q8_0);
        for (int64_t n = 0; n < N; n += 8) {
            const void *wr[8];
            ds_tile_rows(W->data, wrow, n, (int)(N - n < 8 ? N - n : 8), 8, wr);
            (layout == DS_PACK_Q8_VNNI8 ? q8v_pack8 : q8s_pack8)(wr, nb, d + (size_t)(n / 8) * Q8S_TILE(nb));
        }
    }
    const ds_pack_hdr h = {.magic = DS_PACK_MAGIC, .layout = (uint32_t)layout, .type = W->type,
                           .level = (uint32_t)lv, .n_in = W->n_in, .n_out = W->n_out};
    memset(dst, 0, DS_PACK_HDR);
    memcpy(dst, &h, sizeof h);
    return 0;
}
int ds_weight_pack(const ds_weight *W, void *dst) { return ds_weight_pack_at(W, ds_simd_mm_level(), dst); }
int ds_weight_is_packed(const ds_weight *W) { return ds_pack_layout(W) != DS_PACK_NONE; }

/* Row `row` of a packed weight back to f32, read from the tile layout alone.
 * VNNI16: lane j = row % 16 of tile row / 16; dword s of block b at b * 512 +
 * 64 s + 4 j (biased: q ^ 0x80), the block's fp16 scale at nb * 512 + 32 b +
 * 2 j. S8: lane j = row % 8, pair t at b * 256 + 16 t + 2 j (signed), the
 * scale at nb * 256 + 16 b + 2 j. d * q is exact, so this equals
 * ds_row_to_f32 of the original row bit for bit — and the original's pages
 * need not be resident (the embedding lookup of a tied head reads this). */
void ds_weight_packed_row(const ds_weight *W, int64_t row, float *out) {
    const int layout = ds_pack_layout(W);
    const int64_t nb = W->n_in / DS_QK8_0;
    if (layout == DS_PACK_KQ_T8) {
        /* T8: rebuild each stored block from the tile and dequantize it as
         * ds_row_to_f32 does (the same function, so the same bits) */
        const size_t QB = KQ_T8_QB(W->type);
        const unsigned char *t = ds_pack_data(W) + (size_t)(row / 8) * KQ_T8_TILE(W->type, nb);
        const int j = (int)(row % 8);
        for (int64_t b = 0; b < nb; b++) {
            const unsigned char *o = t + (size_t)b * QB;
            uint8_t qs[16];
            uint16_t d;
            for (int a = 0; a < 4; a++) memcpy(qs + 4 * a, o + 32 * a + 4 * j, 4);
            memcpy(&d, t + (size_t)nb * QB + (size_t)b * 16 + 2 * (size_t)j, 2);
            if (W->type == DS_TYPE_Q5_0) {
                ds_block_q5_0 x;
                uint32_t qh = 0;
                for (int e = 0; e < 4; e++)
                    for (int s2 = 0; s2 < 8; s2++) qh |= (uint32_t)((o[128 + 4 * j + e] >> s2) & 1u) << (4 * s2 + e);
                x.d = d;
                memcpy(x.qh, &qh, 4);
                memcpy(x.qs, qs, 16);
                ds_row_to_f32(DS_TYPE_Q5_0, &x, DS_QK8_0, out + b * DS_QK8_0);
            } else {
                ds_block_q4_0 x;
                x.d = d;
                memcpy(x.qs, qs, 16);
                ds_row_to_f32(DS_TYPE_Q4_0, &x, DS_QK8_0, out + b * DS_QK8_0);
            }
        }
        return;
    }
    const int R = q8_pack_rows(layout), QB = layout == DS_PACK_Q8_VNNI16 ? Q8C_QB : Q8S_QB;
    const unsigned char bias = layout == DS_PACK_Q8_S8 ? 0 : 0x80;
    const unsigned char *t = ds_pack_data(W) + (size_t)(row / R) * q8_pack_tile_bytes(layout, W->type, nb);
    const int j = (int)(row % R);
    for (int64_t b = 0; b < nb; b++) {
        const unsigned char *o = t + b * QB;
        uint16_t dh;
        memcpy(&dh, t + (size_t)nb * QB + (size_t)b * 2 * R + 2 * (size_t)j, sizeof dh);
        const float d = ds_fp16_to_f32(dh);
        if (layout != DS_PACK_Q8_S8)    /* VNNI16 (64-byte vectors) / VNNI8 (32-byte) */
            for (int s = 0; s < 8; s++)
                for (int e = 0; e < 4; e++)
                    out[b * DS_QK8_0 + 4 * s + e] = d * (float)(int8_t)(o[4 * R * s + 4 * j + e] ^ bias);
        else
            for (int t = 0; t < 16; t++)
                for (int e = 0; e < 2; e++) out[b * DS_QK8_0 + 2 * t + e] = d * (float)(int8_t)o[16 * t + 2 * j + e];
    }
}

/* Path choice: M < Q8C_REPACK_MIN_M runs the non-repacked one-row kernels
 * (AVX512-VNNI / AVX2), larger M the repacked VNNI tile / the AVX2 S8 tile
 * (packed per call into the thread's scratch). With pre-packed weights of the
 * level's layout (ds_weight_pack, set by the CPU backend's prepare_weight)
 * the tile costs no repacking and is the faster path from M = 1 (decode
 * included). c->q8_path forces one (tests). All give the definition's bits. */
#define Q8C_REPACK_MIN_M 2
/* With pre-packed weights the tile costs no repacking: */
#ifndef Q8C_PACKED_MIN_M
#define Q8C_PACKED_MIN_M 1
#endif

void ds_mm_q8_0_canonical(const ds_mm_ctx *c, int64_t n0, int64_t n1) {
#if DS_X86
    const int avxvnni = c->avxvnni && c->level == DS_LVL_AVX2;
    const int packed = ds_pack_layout(c->W) == q8_pack_layout_at(c->W, avxvnni ? DS_LVL_AVXVNNI : c->level);
    const int repack = c->q8_path ? c->q8_path == DS_Q8_PATH_REPACKED
                                  : c->M >= (packed ? Q8C_PACKED_MIN_M : Q8C_REPACK_MIN_M);
    if (avxvnni) {
        if (repack) q8c_avxvnni(c, n0, n1);
        else q8c_avx2_rows(c, n0, n1);
        return;
    }
    if (c->level == DS_LVL_AVX512 && q8c_have_vnni()) {
        if (repack) q8c_vnni_repacked(c, n0, n1);
        else q8c_vnni_rows(c, n0, n1);
        return;
    }
    if (c->level >= DS_LVL_AVX2) {
        if (repack) q8c_avx2_s8(c, n0, n1);
        else q8c_avx2_rows(c, n0, n1);
        return;
    }
#elif DS_ARM
    if (c->level == DS_LVL_DOTPROD && c->i8mm) { q8n_i8mm(c, n0, n1); return; }
    if (c->level == DS_LVL_DOTPROD) { q8n_dotprod(c, n0, n1); return; }
    if (c->level == DS_LVL_NEON) { q8n_neon(c, n0, n1); return; }
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
int ds_q8_0_wants_qw(int level) {
    return (level == DS_LVL_AVX2 || level == DS_LVL_AVX512) && !ds_q8_0_fast_vnni(level);
}

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
    const unsigned char *pk = n0 % 16 == 0 && ds_pack_layout(c->W) == DS_PACK_Q8_VNNI16 ? ds_pack_data(c->W) : NULL;
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
int ds_q8_0_wants_qw(int level) { (void)level; return 0; }
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
