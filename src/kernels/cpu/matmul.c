/* matmul.c — the ds_matmul / ds_matmul_decode dispatcher.
 *
 * Picks the family's range kernel for (weight type, variant) and splits the
 * OUTPUT columns N over the pool. The one per-call preparation is canonical
 * (= decode) Q8_0's: it quantizes the activation rows once (below) before the
 * split; every
 * other kernel reads the f32 activations directly. Threads never split
 * K, so each y[m][n] is produced by one thread running the one sequence
 * defined in its family file — the result is the same for any thread count.
 *
 * Columns are handed out in groups of 16 (64 bytes of each y row), so two
 * threads never write the same cache line of y, and tiles (NT = 2..8)
 * stay aligned within a group. */
#include "kernels/cpu/matmul_internal.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define DS_MM_GROUP 16          /* output columns per work item            */
#define DS_MM_MIN_WORK 65536    /* weight elements per chunk, at least     */

/* One job: up to DS_MM_MULTI weights on the same activations, their column
 * groups laid end to end (weight i owns groups [g_off[i], g_off[i+1])), so
 * q/k/v or gate/up are one hand-off and one activation quantization. */
#define DS_MM_MULTI 4
typedef struct {
    const ds_mm_ctx *ctx;
    ds_mm_range_fn fn;
    ds_pool *pool;
    int n;
    const ds_weight *W[DS_MM_MULTI];
    float *y[DS_MM_MULTI];
    int64_t g_off[DS_MM_MULTI + 1];
    ds_mm_epi_fn epi;           /* ds_matmul_epi: after a range's columns   */
    void *epi_arg;
} mm_job;

/* Each range gets its thread's reserved scratch (ds_pool_reserve) in a
 * private copy of the call's context: the walkers' dequantization and
 * repacking buffers live there, so a forward never allocates. */
static void mm_range(void *arg, int64_t g0, int64_t g1, int chunk) {
    const mm_job *j = arg;
    ds_mm_ctx c = *j->ctx;
    c.tmp = ds_pool_thread_scratch(j->pool, chunk, &c.tmp_bytes);
    for (int i = 0; i < j->n; i++) {
        const int64_t a = g0 > j->g_off[i] ? g0 : j->g_off[i];
        const int64_t b = g1 < j->g_off[i + 1] ? g1 : j->g_off[i + 1];
        if (a >= b) continue;
        const int64_t N = j->W[i]->n_out;
        int64_t n0 = (a - j->g_off[i]) * DS_MM_GROUP, n1 = (b - j->g_off[i]) * DS_MM_GROUP;
        if (n1 > N) n1 = N;
        if (n0 >= n1) continue;
        c.W = j->W[i];
        c.y = j->y[i];
        j->fn(&c, n0, n1);
        if (j->epi) j->epi(j->epi_arg, n0, n1, chunk);
    }
}

/* ---- canonical Q8_0: the activation rows quantized once per call ---------------------
 * ds_quantize_row_q8_0 per row (ggml's quantize_row_q8_0), plus each block's
 * scale as f32 and -128 * (sum of its quants), the correction the VNNI tile
 * needs (matmul_q8_0.c). Rows are independent, so they are spread over the
 * pool (small batches stay on the caller: one row of K = 1024 quantizes in
 * well under a microsecond, less than a hand-off). The arrays live in the
 * pool's reserved shared scratch (ds_pool_reserve, sized at context
 * creation by ds_kernels_shared_scratch): a forward never allocates. A call
 * outside the reservation (the standalone API, tests) grows the pool's slot
 * DS_MM_SCRATCH_SLOT, or without a pool mallocs; and if even that fails,
 * q8_rows_nomem computes the same bits with a fixed stack buffer — there is
 * no failure path. */
#define DS_MM_SCRATCH_SLOT 3
#define DS_Q8_ACT_BYTES 42      /* per block: ds_block_q8_0 (34) + d (4) + nsum (4) */

typedef struct {
    const float *x;
    int64_t K;
    ds_block_q8_0 *q;
    float *d;
    int32_t *nsum;
    unsigned char *qi;          /* the interleaved copy (ds_q8_act.qi)       */
    int16_t *qw;                /* the int16 copy (ds_q8_act.qw) or NULL      */
} q8_quant_job;

/* Row m's quants widened to int16 into the AVX2 tile's copy (ds_q8_act.qw):
 * groups of 8 rows, block b of row i at ((m / 8) * nb + b) * 256 + 32 i. */
static void q8_widen_row(const ds_block_q8_0 *q, int64_t nb, int64_t m, int16_t *qw) {
    int16_t *o = qw + (size_t)(m / 8) * (size_t)nb * 256 + 32 * (size_t)(m % 8);
    for (int64_t b = 0; b < nb; b++, o += 256)
        for (int l = 0; l < DS_QK8_0; l++) o[l] = q[b].qs[l];
}

#if DS_X86
#include "kernels/cpu/q8_round.h"

/* ---- the same four outputs on AVX-512, 16 blocks at a time -----------------
 * Per block the reference (registry.c: ds_quantize_row_q8_0 and the loop in
 * q8_quant_range) runs a chain of latencies: the |x| maximum, d = amax / 127,
 * id = 1 / d, d to fp16, then the rounding, the quant sum, fp16 back to f32
 * — about 20 ns a block, 2 us for the 8 rows of a verify's K = 384, on the
 * calling thread before the workers can start (a seventh of a verify). Here
 * the maxima of 16 blocks go into one vector and the divisions, the fp16
 * conversion (VCVTPS2PH, round to nearest even) and its way back run once
 * for the 16. Same bits: the max of |x| over a NaN-free block is one value
 * in any order, the divisions are the same IEEE operations, VCVTPS2PH with
 * nearest-even gives ds_f32_to_fp16's bits on every non-negative non-NaN
 * float (overflow to inf and the fp16 subnormals included: test_matmul
 * compares them on every exponent) and VCVTPH2PS is exact; each block's
 * rounding is q8_quant_avx512's instruction sequence (ds_q8_round16); the
 * quant sum is an integer. A group holding a NaN takes the reference path. */
#define Q8Q_TGT __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx2,f16c")))
Q8Q_TGT static int q8_quant_row16(const float *x, int64_t nb, ds_block_q8_0 *q, float *d, int32_t *nsum,
                                  unsigned char *g, int i) {
    const __m512 c127 = _mm512_set1_ps(127.0f);
    for (int64_t b0 = 0; b0 < nb; b0 += 16) {
        const int n = nb - b0 < 16 ? (int)(nb - b0) : 16;
        const float *xg = x + b0 * DS_QK8_0;
        __mmask16 nan = 0;
        float am[16];
        for (int k = 0; k < n; k++) {
            const __m512 x0 = _mm512_loadu_ps(xg + k * DS_QK8_0), x1 = _mm512_loadu_ps(xg + k * DS_QK8_0 + 16);
            nan |= _mm512_cmp_ps_mask(x0, x0, _CMP_UNORD_Q) | _mm512_cmp_ps_mask(x1, x1, _CMP_UNORD_Q);
            am[k] = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(x0), _mm512_abs_ps(x1)));
        }
        if (nan) return -1;
        const __mmask16 kn = (__mmask16)((1u << n) - 1u);
        const __m512 vd = _mm512_div_ps(_mm512_maskz_loadu_ps(kn, am), c127);
        const __mmask16 nz = _mm512_cmp_ps_mask(vd, _mm512_setzero_ps(), _CMP_NEQ_OQ);
        const __m512 vid = _mm512_maskz_div_ps(nz, _mm512_set1_ps(1.0f), vd);
        const __m256i vh = _mm512_cvtps_ph(vd, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        float idv[16], df[16];
        uint16_t dh[16];
        _mm512_storeu_ps(idv, vid);
        _mm512_storeu_ps(df, _mm512_cvtph_ps(vh));
        _mm256_storeu_si256((__m256i *)dh, vh);
        for (int k = 0; k < n; k++, g += DS_Q8_GROUP_BYTES) {
            const float *xb = xg + k * DS_QK8_0;
            const __m512 id = _mm512_set1_ps(idv[k]);
            const __m512i qv[2] = {ds_q8_round16(_mm512_loadu_ps(xb), id), ds_q8_round16(_mm512_loadu_ps(xb + 16), id)};
            /* the 32 quant bytes stored from registers to both places (not
             * copied back out of the block: a 32-byte load of two fresh
             * 16-byte stores stalls on store forwarding) */
            const __m256i qb = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm512_cvtepi32_epi8(qv[0])),
                                                       _mm512_cvtepi32_epi8(qv[1]), 1);
            ds_block_q8_0 *o = q + b0 + k;
            o->d = dh[k];
            _mm256_storeu_si256((__m256i *)o->qs, qb);
            _mm256_storeu_si256((__m256i *)(g + 32 * i), qb);
            const int32_t ns = -128 * _mm512_reduce_add_epi32(_mm512_add_epi32(qv[0], qv[1]));
            d[b0 + k] = df[k];
            nsum[b0 + k] = ns;
            memcpy(g + 256 + 4 * i, &ns, sizeof ns);
            memcpy(g + 288 + 4 * i, &df[k], sizeof(float));
        }
    }
    return 0;
}

static int q8_quant_fast_ok(void) {
    __builtin_cpu_init();
    return ds_simd_level() == DS_LVL_AVX512 && __builtin_cpu_supports("f16c");
}

/* ---- the same on AVX2, one block at a time ------------------------------------
 * ds_quantize_row_q8_0's AVX2 form (registry.c: the block max, d, id, the
 * rounding of q8_round.h) plus everything the tiles read, in one pass: the
 * block, d as f32, -128 * the quant sum, the interleaved copy and the int16
 * copy (ds_q8_act.qw). d's fp16 is ds_f32_to_fp16 itself. A block holding a
 * NaN takes the reference path (returns -1: the caller redoes the row). */
#define Q8Q_TGT2 __attribute__((target("avx2,f16c")))
Q8Q_TGT2 static int q8_quant_row8(const float *x, int64_t nb, ds_block_q8_0 *q, float *d, int32_t *nsum,
                                  unsigned char *g, int i, int16_t *qw) {
    for (int64_t b = 0; b < nb; b++, g += DS_Q8_GROUP_BYTES) {
        const float *xb = x + b * DS_QK8_0;
        __m256 v[4];
        float amax;
        if (ds_q8_block8(xb, v, &amax)) return -1;
        const float dd = amax / 127.0f;
        const float id = dd != 0.0f ? 1.0f / dd : 0.0f;
        const uint16_t dh = ds_f32_to_fp16(dd);
        const __m256 vid = _mm256_set1_ps(id);
        __m256i qv[4];
        for (int k = 0; k < 4; k++) qv[k] = ds_q8_round8(v[k], vid);
        const __m256i qb = ds_q8_pack32(qv);
        ds_block_q8_0 *o = q + b;
        o->d = dh;
        _mm256_storeu_si256((__m256i *)o->qs, qb);
        _mm256_storeu_si256((__m256i *)(g + 32 * i), qb);
        const __m256i s4 = _mm256_add_epi32(_mm256_add_epi32(qv[0], qv[1]), _mm256_add_epi32(qv[2], qv[3]));
        int32_t sb[8], sum = 0;
        _mm256_storeu_si256((__m256i *)sb, s4);
        for (int l = 0; l < 8; l++) sum += sb[l];
        const float df = ds_fp16_to_f32(dh);
        const int32_t ns = -128 * sum;
        d[b] = df;
        nsum[b] = ns;
        memcpy(g + 256 + 4 * i, &ns, sizeof ns);
        memcpy(g + 288 + 4 * i, &df, sizeof df);
        if (qw) {
            int16_t *w = qw + (size_t)b * 256;
            _mm256_storeu_si256((__m256i *)w, _mm256_cvtepi8_epi16(_mm256_castsi256_si128(qb)));
            _mm256_storeu_si256((__m256i *)(w + 16), _mm256_cvtepi8_epi16(_mm256_extracti128_si256(qb, 1)));
        }
    }
    return 0;
}
#endif

static void q8_quant_range(void *arg, int64_t m0, int64_t m1) {
    const q8_quant_job *j = arg;
    const int64_t nb = j->K / DS_QK8_0;
    for (int64_t m = m0; m < m1; m++) {
#if DS_X86
        if (ds_simd_level() == DS_LVL_AVX2 &&
            q8_quant_row8(j->x + m * j->K, nb, j->q + m * nb, j->d + m * nb, j->nsum + m * nb,
                          j->qi + (size_t)(m / 8) * (size_t)nb * DS_Q8_GROUP_BYTES, (int)(m % 8),
                          j->qw ? j->qw + (size_t)(m / 8) * (size_t)nb * 256 + 32 * (size_t)(m % 8) : NULL) == 0)
            continue;
        if (q8_quant_fast_ok() &&
            q8_quant_row16(j->x + m * j->K, nb, j->q + m * nb, j->d + m * nb, j->nsum + m * nb,
                           j->qi + (size_t)(m / 8) * (size_t)nb * DS_Q8_GROUP_BYTES, (int)(m % 8)) == 0) {
            if (j->qw) q8_widen_row(j->q + m * nb, nb, m, j->qw);
            continue;
        }
#endif
        ds_quantize_row_q8_0(j->x + m * j->K, j->K, j->q + m * nb);
        unsigned char *g = j->qi + (size_t)(m / 8) * (size_t)nb * DS_Q8_GROUP_BYTES;
        const int i = (int)(m % 8);
        for (int64_t b = m * nb; b < (m + 1) * nb; b++, g += DS_Q8_GROUP_BYTES) {
            int32_t s = 0;
            for (int l = 0; l < DS_QK8_0; l++) s += j->q[b].qs[l];
            j->d[b] = ds_fp16_to_f32(j->q[b].d);
            j->nsum[b] = -128 * s;
            memcpy(g + 32 * i, j->q[b].qs, DS_QK8_0);
            memcpy(g + 256 + 4 * i, &j->nsum[b], sizeof(int32_t));
            memcpy(g + 288 + 4 * i, &j->d[b], sizeof(float));
        }
        if (j->qw) q8_widen_row(j->q + m * nb, nb, m, j->qw);
    }
}

/* q | d | nsum | (64-aligned) the interleaved groups */
static size_t q8_act_head_bytes(int M, int64_t K) {
    const size_t nq = (size_t)M * (size_t)(K / DS_QK8_0);
    return (((nq * sizeof(ds_block_q8_0) + 63) & ~(size_t)63) + nq * (sizeof(float) + sizeof(int32_t)) + 63) &
           ~(size_t)63;
}
/* ... then the int16 copy: per group of 8 rows and block, 8 x 32 int16 */
static size_t q8_act_qi_bytes(int M, int64_t K) {
    return ((size_t)M + 7) / 8 * (size_t)(K / DS_QK8_0) * DS_Q8_GROUP_BYTES;
}
static size_t q8_act_bytes(int M, int64_t K) {
    return q8_act_head_bytes(M, K) + q8_act_qi_bytes(M, K) + ((size_t)M + 7) / 8 * (size_t)(K / DS_QK8_0) * 512;
}

size_t ds_kernels_shared_scratch(int m_max, int64_t k_max) {
    return m_max > 0 && k_max > 0 ? q8_act_bytes(m_max, k_max) + 64 : 0;
}

static void q8_quantize_into(const float *x, int M, int64_t K, char *mem, ds_pool *pool, int want_qw,
                             ds_q8_act *act) {
    const size_t nq = (size_t)M * (size_t)(K / DS_QK8_0);
    const size_t qb = (nq * sizeof(ds_block_q8_0) + 63) & ~(size_t)63;
    q8_quant_job j = {.x = x, .K = K, .q = (ds_block_q8_0 *)mem, .d = (float *)(mem + qb),
                      .nsum = (int32_t *)(mem + qb + nq * sizeof(float)),
                      .qi = (unsigned char *)mem + q8_act_head_bytes(M, K),
                      .qw = want_qw ? (int16_t *)(mem + q8_act_head_bytes(M, K) + q8_act_qi_bytes(M, K)) : NULL};
    ds_pool_for(pool, M, (4096 + K - 1) / K, q8_quant_range, &j);
    *act = (ds_q8_act){.q = j.q, .d = j.d, .nsum = j.nsum, .qi = j.qi, .qw = j.qw};
}

/* The definition with no scratch at all: per row, 32 blocks at a time
 * quantized into a stack buffer (quantization is per block, so a slice of
 * the row quantizes as the whole row would), and y[m][n] itself carries the
 * accumulator between slices (an f32 stored and reloaded is the same f32):
 * the block-order fma sequence, bit for bit. Slow; only for out-of-memory. */
static void q8_rows_nomem(const ds_weight *W, int M, const float *x, float *y) {
    const int64_t K = W->n_in, N = W->n_out, nb = K / DS_QK8_0;
    ds_block_q8_0 xq[32];
    for (int m = 0; m < M; m++)
        for (int64_t b0 = 0; b0 < nb; b0 += 32) {
            const int64_t bn = nb - b0 < 32 ? nb - b0 : 32;
            ds_quantize_row_q8_0(x + (size_t)m * (size_t)K + (size_t)b0 * DS_QK8_0, bn * DS_QK8_0, xq);
            for (int64_t n = 0; n < N; n++) {
                const ds_block_q8_0 *w = (const ds_block_q8_0 *)W->data + n * nb + b0;
                float *yo = y + (size_t)m * (size_t)N + (size_t)n;
                float acc = b0 == 0 ? 0.0f : *yo;
                for (int64_t b = 0; b < bn; b++) {
                    int32_t D = 0;
                    for (int l = 0; l < DS_QK8_0; l++) D += (int32_t)w[b].qs[l] * xq[b].qs[l];
                    acc = fmaf((float)D, ds_fp16_to_f32(w[b].d) * ds_fp16_to_f32(xq[b].d), acc);
                }
                *yo = acc;
            }
        }
}

/* ---- kquant K types: the activation rows quantized to Q8_K once per call ----------------
 * Per 256-element super-block: the value of largest magnitude (the first
 * one) maps to -127: iscale = -127 / max, q = round-to-nearest-even(iscale
 * * x) clamped to [-127, 127] (NaN -> 0), d = 1 / iscale, plus the 16 sums
 * of 16 quants. ggml's quantize_row_q8_K rule, written out in scalar C: it
 * is O(M K) per call against the matmul's O(M K N), and one code path
 * keeps it the same on every level. An all-zero block gets d = 0. */
void ds_quantize_row_q8_k(const float *x, int64_t K, int8_t *q, float *d, int16_t *bsums) {
    for (int64_t i = 0; i < K / DS_QK_K; i++) {
        const float *xb = x + i * DS_QK_K;
        int8_t *qb = q + i * DS_QK_K;
        float amax = 0.0f, max = 0.0f;
        for (int j = 0; j < DS_QK_K; j++) {
            const float a = fabsf(xb[j]);
            if (a > amax) { amax = a; max = xb[j]; }
        }
        if (amax == 0.0f) {
            d[i] = 0.0f;
            memset(qb, 0, DS_QK_K);
            memset(bsums + 16 * i, 0, 16 * sizeof(int16_t));
            continue;
        }
        const float iscale = -127.0f / max;
        for (int j = 0; j < DS_QK_K; j++) {
            float v = iscale * xb[j];
            v = v != v ? 0.0f : v > 127.0f ? 127.0f : v < -127.0f ? -127.0f : v;
            qb[j] = (int8_t)rintf(v);
        }
        for (int g = 0; g < 16; g++) {
            int s = 0;
            for (int l = 0; l < 16; l++) s += qb[16 * g + l];
            bsums[16 * i + g] = (int16_t)s;
        }
        d[i] = 1.0f / iscale;
    }
}

typedef struct {
    const float *x;
    int64_t K;
    int8_t *q;
    float *d;
    int16_t *bsums;
} q8k_quant_job;

static void q8k_quant_range(void *arg, int64_t m0, int64_t m1) {
    const q8k_quant_job *j = arg;
    const int64_t nsb = j->K / DS_QK_K;
    for (int64_t m = m0; m < m1; m++)
        ds_quantize_row_q8_k(j->x + m * j->K, j->K, j->q + m * j->K, j->d + m * nsb, j->bsums + m * nsb * 16);
}

static int q8k_quantize_acts(const ds_weight *W, int M, const float *x, ds_pool *pool,
                             ds_q8k_act *act, void **owned) {
    const int64_t K = W->n_in, nsb = (int64_t)M * (K / DS_QK_K);
    const size_t qb = ((size_t)M * (size_t)K + 63) & ~(size_t)63;
    const size_t db = ((size_t)nsb * sizeof(float) + 63) & ~(size_t)63;
    const size_t bytes = qb + db + (size_t)nsb * 16 * sizeof(int16_t);
    char *mem = ds_pool_scratch(pool, DS_MM_SCRATCH_SLOT, bytes);
    if (!mem) mem = *owned = malloc(bytes);
    if (!mem) return -1;
    q8k_quant_job j = {.x = x, .K = K, .q = (int8_t *)mem, .d = (float *)(mem + qb),
                       .bsums = (int16_t *)(mem + qb + db)};
    ds_pool_for(pool, M, (4096 + K - 1) / K, q8k_quant_range, &j);
    *act = (ds_q8k_act){.q = j.q, .d = j.d, .bsums = j.bsums};
    return 0;
}

static ds_mm_range_fn pick(uint32_t type, ds_variant v) {
    switch (type) {
    case DS_TYPE_F32: return v == DS_FAST ? ds_mm_f32_fast : ds_mm_f32_canonical;
    case DS_TYPE_F16: return v == DS_FAST ? ds_mm_f16_fast : ds_mm_f16_canonical;
    case DS_TYPE_BF16: return v == DS_FAST ? ds_mm_bf16_fast : ds_mm_bf16_canonical;
    case DS_TYPE_Q8_0: return v == DS_FAST ? ds_mm_q8_0_fast : ds_mm_q8_0_canonical;
    case DS_TYPE_Q4_0: return v == DS_FAST ? ds_mm_q4_0_fast : ds_mm_q4_0_canonical;
    case DS_TYPE_Q4_1: return v == DS_FAST ? ds_mm_q4_1_fast : ds_mm_q4_1_canonical;
    case DS_TYPE_Q5_0: return v == DS_FAST ? ds_mm_q5_0_fast : ds_mm_q5_0_canonical;
    case DS_TYPE_Q5_1: return v == DS_FAST ? ds_mm_q5_1_fast : ds_mm_q5_1_canonical;
    case DS_TYPE_Q4_K: return v == DS_FAST ? ds_mm_q4_k_fast : ds_mm_q4_k_canonical;
    case DS_TYPE_Q5_K: return v == DS_FAST ? ds_mm_q5_k_fast : ds_mm_q5_k_canonical;
    case DS_TYPE_Q6_K: return v == DS_FAST ? ds_mm_q6_k_fast : ds_mm_q6_k_canonical;
    default: return NULL;
    }
}

/* n weights of one type and n_in (checked by the callers) on the same x;
 * with epi (n = 1), ds_matmul_epi's epilogue after each range. */
static void matmul_multi_at_level(int level, ds_variant v, int n, const ds_weight *const W[], int M,
                                  const float *x, float *const y[], ds_pool *pool, ds_mm_epi_fn epi,
                                  void *epi_arg) {
    if (M <= 0) return;
    const int64_t K = W[0]->n_in;
    ds_mm_range_fn fn = pick(W[0]->type, v);
    if (!fn || K < 0 || K % (int64_t)ds_type_block_elems(W[0]->type)) {
        fprintf(stderr, "ds_matmul: unsupported weight (type %u, n_in %lld)\n", W[0]->type,
                (long long)K);
        abort();
    }
    if (K == 0) {                               /* empty sums: +0 everywhere */
        for (int i = 0; i < n; i++)
            for (int64_t e = 0; e < (int64_t)M * W[i]->n_out; e++) y[i][e] = 0.0f;
        if (epi) epi(epi_arg, 0, W[0]->n_out, 0);
        return;
    }
    /* AVXVNNI is AVX2 for every kernel but canonical Q8_0 and the T8 tile,
     * I8MM dotprod for every kernel but the SMMLA tiles (simd.h) */
    ds_mm_ctx ctx = {.W = W[0], .M = M, .x = x, .y = y[0], .level = DS_LVL_BASE(level),
                     .avxvnni = level == DS_LVL_AVXVNNI, .i8mm = level == DS_LVL_I8MM};
    /* canonical (= decode) Q8_0 multiplies quantized activations: quantize
     * x once, here, before the columns are split (matmul_q8_0.c) */
    ds_q8_act act;
    ds_q8k_act actk;
    void *owned = NULL;
    const int kq = ds_type_is_kq(W[0]->type), kq_k = kq && ds_type_block_elems(W[0]->type) == DS_QK_K;
    if (kq_k) {                                 /* both variants of the K types */
        if (q8k_quantize_acts(W[0], M, x, pool, &actk, &owned)) {
            fprintf(stderr, "ds_matmul: out of memory quantizing %d activation rows\n", M);
            abort();
        }
        ctx.xk = &actk;
    } else if ((W[0]->type == DS_TYPE_Q8_0 && v == DS_CANONICAL) || kq) {
        const size_t bytes = q8_act_bytes(M, K);
        char *mem = ds_pool_shared_scratch(pool, bytes);
        if (!mem) mem = ds_pool_scratch(pool, DS_MM_SCRATCH_SLOT, bytes);
        if (!mem && !pool) mem = owned = malloc(bytes);
        if (!mem) {
            if (kq) {   /* the kquant engines have no scratch-free path (yet) */
                fprintf(stderr, "ds_matmul: out of memory quantizing %d activation rows\n", M);
                abort();
            }
            for (int i = 0; i < n; i++) q8_rows_nomem(W[i], M, x, y[i]);
            if (epi) epi(epi_arg, 0, W[0]->n_out, 0);
            return;
        }
        q8_quantize_into(x, M, K, mem, pool, W[0]->type == DS_TYPE_Q8_0 && ds_q8_0_wants_qw(level), &act);
        ctx.xq = &act;
    } else if (W[0]->type == DS_TYPE_Q8_0 && ds_q8_0_fast_vnni(level)) {
        /* fast Q8_0 on VNNI: its own activation quantization, one scale per
         * row (matmul_q8_0.c); same scratch as canonical's (row scales fit in
         * the per-block scale array). Without scratch: the f32 tile engine. */
        const size_t nq = (size_t)M * (size_t)(K / DS_QK8_0);
        const size_t qb = (nq * sizeof(ds_block_q8_0) + 63) & ~(size_t)63;
        char *mem = ds_pool_shared_scratch(pool, q8_act_bytes(M, K));
        if (!mem) mem = ds_pool_scratch(pool, DS_MM_SCRATCH_SLOT, q8_act_bytes(M, K));
        if (mem) {
            act = (ds_q8_act){.q = (ds_block_q8_0 *)mem, .d = (float *)(mem + qb),
                              .nsum = (int32_t *)(mem + qb + nq * sizeof(float))};
            ds_q8_0_fast_quantize(x, M, K, (ds_block_q8_0 *)act.q, (int32_t *)act.nsum, (float *)act.d);
            ctx.xq = &act;
        }
    }
    /* normally a no-op: the context reserved this at creation; a call with a
     * larger K grows the reservation once, here, outside the job */
    ds_pool_reserve(pool, ds_matmul_thread_scratch(K), 0);
    mm_job job = {.ctx = &ctx, .fn = fn, .pool = pool, .n = n, .epi = epi, .epi_arg = epi_arg};
    for (int i = 0; i < n; i++) {
        job.W[i] = W[i];
        job.y[i] = y[i];
        job.g_off[i + 1] = job.g_off[i] + (W[i]->n_out + DS_MM_GROUP - 1) / DS_MM_GROUP;
    }
    const int64_t per_group = K * DS_MM_GROUP;
    int64_t grain = (DS_MM_MIN_WORK + per_group - 1) / per_group;
    /* One row against a weight of at most two blocks per output (K <= 64:
     * the drafter's Markov W2, rank -> vocab, once per drafted slot) stays on
     * the calling thread: each output is one or two integer dots, the whole
     * call a few microseconds, and splitting it saves about what the hand-off
     * (wake, join, the imbalance) costs on an idle machine — and far less
     * than it costs on a loaded one, where the worker may not be running.
     * Seven such calls per drafting round, each one hand-off fewer. */
    if (M == 1 && K <= 2 * DS_QK8_0 && !epi) grain = job.g_off[n];
    /* an epilogue carries work of its own (the drafter's chain: a bias add
     * and an argmax over the columns): count it as one more K block */
    if (epi) grain = (DS_MM_MIN_WORK + (K + DS_QK8_0) * DS_MM_GROUP - 1) / ((K + DS_QK8_0) * DS_MM_GROUP);
    ds_pool_for_idx(pool, job.g_off[n], grain, mm_range, &job);
    free(owned);
}

void ds_matmul_at_level(int level, ds_variant v, const ds_weight *W, int M, const float *x,
                        float *y, ds_pool *pool) {
    if (W->n_out <= 0) return;
    matmul_multi_at_level(level, v, 1, &W, M, x, &y, pool, NULL, NULL);
}

void ds_matmul_epi(ds_variant v, const ds_weight *W, int M, const float *x, float *y, ds_pool *pool,
                   ds_mm_epi_fn epi, void *arg) {
    if (W->n_out <= 0) return;
    matmul_multi_at_level(ds_simd_mm_level(), v, 1, &W, M, x, &y, pool, epi, arg);
}

/* Same bits as n ds_matmul calls (every output column runs the same range
 * kernel on the same quantized rows whichever job carries it); weights of
 * different types or n_in, or more than DS_MM_MULTI, go one by one. */
void ds_matmul_multi(ds_variant v, int n, const ds_weight *const W[], int M, const float *x,
                     float *const y[], ds_pool *pool) {
    int same = n >= 1 && n <= DS_MM_MULTI;
    for (int i = 1; same && i < n; i++) same = W[i]->type == W[0]->type && W[i]->n_in == W[0]->n_in;
    for (int i = 0; same && i < n; i++) same = W[i]->n_out > 0;
    if (!same) {
        for (int i = 0; i < n; i++) ds_matmul(v, W[i], M, x, y[i], pool);
        return;
    }
    matmul_multi_at_level(ds_simd_mm_level(), v, n, W, M, x, y, pool, NULL, NULL);
}

void ds_matmul(ds_variant v, const ds_weight *W, int M, const float *x, float *y, ds_pool *pool) {
    ds_matmul_at_level(ds_simd_mm_level(), v, W, M, x, y, pool);
}

/* The decode kernel is not a separate implementation: it IS canonical(M=1). */
void ds_matmul_decode(const ds_weight *W, const float *x, float *y, ds_pool *pool) {
    ds_matmul(DS_CANONICAL, W, 1, x, y, pool);
}

/* ---- scratch sizes (kernels.h) ----------------------------------------------------
 * Per thread: the walker's dequantization buffer (at most DS_NT_MAX rows of
 * K floats) or the VNNI tile's repacking buffer (K / 32 blocks of at most 576
 * bytes), never both at once. */
size_t ds_matmul_thread_scratch(int64_t k_max) {
    if (k_max <= 0) return 0;
    const size_t deq = (size_t)DS_NT_MAX * (size_t)k_max * sizeof(float);
    /* the VNNI tile (576 bytes a block) or four AVX2 S8 tiles (4 x 272) */
    const size_t rep = (size_t)(k_max / DS_QK8_0) * 1152;
    return deq > rep ? deq : rep;
}

size_t ds_kernels_thread_scratch(int64_t k_max, int hd_max, int64_t n_ctx) {
    const size_t a = ds_matmul_thread_scratch(k_max), b = ds_attention_thread_scratch(hd_max, n_ctx);
    return a > b ? a : b;
}
