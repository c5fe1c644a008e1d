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

typedef struct {
    const ds_mm_ctx *ctx;
    ds_mm_range_fn fn;
} mm_job;

static void mm_range(void *arg, int64_t g0, int64_t g1) {
    const mm_job *j = arg;
    int64_t N = j->ctx->W->n_out;
    int64_t n0 = g0 * DS_MM_GROUP, n1 = g1 * DS_MM_GROUP;
    if (n1 > N) n1 = N;
    if (n0 < n1) j->fn(j->ctx, n0, n1);
}

/* ---- canonical Q8_0: the activation rows quantized once per call ---------------------
 * ds_quantize_row_q8_0 per row (ggml's quantize_row_q8_0), plus each block's
 * scale as f32 and -128 * (sum of its quants), the correction the VNNI tile
 * needs (matmul_q8_0.c). Rows are independent, so they are spread over the
 * pool; the arrays live in the pool's scratch slot DS_MM_SCRATCH_SLOT (no
 * allocation in steady state) or, without a pool, in one malloc per call. */
#define DS_MM_SCRATCH_SLOT 3

typedef struct {
    const float *x;
    int64_t K;
    ds_block_q8_0 *q;
    float *d;
    int32_t *nsum;
} q8_quant_job;

static void q8_quant_range(void *arg, int64_t m0, int64_t m1) {
    const q8_quant_job *j = arg;
    const int64_t nb = j->K / DS_QK8_0;
    for (int64_t m = m0; m < m1; m++) {
        ds_quantize_row_q8_0(j->x + m * j->K, j->K, j->q + m * nb);
        for (int64_t b = m * nb; b < (m + 1) * nb; b++) {
            int32_t s = 0;
            for (int l = 0; l < DS_QK8_0; l++) s += j->q[b].qs[l];
            j->d[b] = ds_fp16_to_f32(j->q[b].d);
            j->nsum[b] = -128 * s;
        }
    }
}

static int q8_quantize_acts(const ds_weight *W, int M, const float *x, ds_pool *pool,
                            ds_q8_act *act, void **owned) {
    const int64_t K = W->n_in, nq = (int64_t)M * (K / DS_QK8_0);
    const size_t qb = ((size_t)nq * sizeof(ds_block_q8_0) + 63) & ~(size_t)63;
    const size_t bytes = qb + (size_t)nq * (sizeof(float) + sizeof(int32_t));
    char *mem = ds_pool_scratch(pool, DS_MM_SCRATCH_SLOT, bytes);
    if (!mem) mem = *owned = malloc(bytes);
    if (!mem) return -1;
    q8_quant_job j = {.x = x, .K = K, .q = (ds_block_q8_0 *)mem, .d = (float *)(mem + qb),
                      .nsum = (int32_t *)(mem + qb + (size_t)nq * sizeof(float))};
    ds_pool_for(pool, M, (4096 + K - 1) / K, q8_quant_range, &j);
    *act = (ds_q8_act){.q = j.q, .d = j.d, .nsum = j.nsum};
    return 0;
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

void ds_matmul_at_level(int level, ds_variant v, const ds_weight *W, int M, const float *x,
                        float *y, ds_pool *pool) {
    if (M <= 0 || W->n_out <= 0) return;
    const int64_t K = W->n_in, N = W->n_out;
    ds_mm_range_fn fn = pick(W->type, v);
    if (!fn || K < 0 || K % (int64_t)ds_type_block_elems(W->type)) {
        fprintf(stderr, "ds_matmul: unsupported weight (type %u, n_in %lld)\n", W->type,
                (long long)K);
        abort();
    }
    ds_mm_ctx ctx = {.W = W, .M = M, .x = x, .y = y, .level = level};

    if (K == 0) {                               /* empty sums: +0 everywhere */
        for (int64_t i = 0; i < (int64_t)M * N; i++) y[i] = 0.0f;
        return;
    }
    /* canonical (= decode) Q8_0 multiplies quantized activations: quantize
     * x once, here, before the columns are split (matmul_q8_0.c) */
    ds_q8_act act;
    ds_q8k_act actk;
    void *owned = NULL;
    const int kq = ds_type_is_kq(W->type), kq_k = kq && ds_type_block_elems(W->type) == DS_QK_K;
    if (kq_k) {                                 /* both variants of the K types */
        if (q8k_quantize_acts(W, M, x, pool, &actk, &owned)) {
            fprintf(stderr, "ds_matmul: out of memory quantizing %d activation rows\n", M);
            abort();
        }
        ctx.xk = &actk;
    } else if ((W->type == DS_TYPE_Q8_0 && v == DS_CANONICAL) || kq) {
        if (q8_quantize_acts(W, M, x, pool, &act, &owned)) {
            fprintf(stderr, "ds_matmul: out of memory quantizing %d activation rows\n", M);
            abort();
        }
        ctx.xq = &act;
    }
    mm_job job = {.ctx = &ctx, .fn = fn};
    int64_t groups = (N + DS_MM_GROUP - 1) / DS_MM_GROUP;
    int64_t per_group = K * DS_MM_GROUP;
    int64_t grain = (DS_MM_MIN_WORK + per_group - 1) / per_group;
    ds_pool_for(pool, groups, grain, mm_range, &job);
    free(owned);
}

void ds_matmul(ds_variant v, const ds_weight *W, int M, const float *x, float *y, ds_pool *pool) {
    ds_matmul_at_level(ds_simd_level(), v, W, M, x, y, pool);
}

/* The decode kernel is not a separate implementation: it IS canonical(M=1). */
void ds_matmul_decode(const ds_weight *W, const float *x, float *y, ds_pool *pool) {
    ds_matmul(DS_CANONICAL, W, 1, x, y, pool);
}
