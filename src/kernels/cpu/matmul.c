/* matmul.c — the ds_matmul / ds_matmul_decode dispatcher.
 *
 * Picks the family's range kernel for (weight type, variant) and splits the
 * OUTPUT columns N over the pool (no per-call preparation: every family
 * reads the f32 activations directly). Threads never split
 * K, so each y[m][n] is produced by one thread running the one sequence
 * defined in its family file — the result is the same for any thread count.
 *
 * Columns are handed out in groups of 16 (64 bytes of each y row), so two
 * threads never write the same cache line of y, and tiles (NT = 2..8)
 * stay aligned within a group. */
#include "kernels/cpu/matmul_internal.h"

#include <stdio.h>
#include <stdlib.h>

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

static ds_mm_range_fn pick(uint32_t type, ds_variant v) {
    switch (type) {
    case DS_TYPE_F32: return v == DS_FAST ? ds_mm_f32_fast : ds_mm_f32_canonical;
    case DS_TYPE_F16: return v == DS_FAST ? ds_mm_f16_fast : ds_mm_f16_canonical;
    case DS_TYPE_BF16: return v == DS_FAST ? ds_mm_bf16_fast : ds_mm_bf16_canonical;
    case DS_TYPE_Q8_0: return v == DS_FAST ? ds_mm_q8_0_fast : ds_mm_q8_0_canonical;
    default: return NULL;
    }
}

void ds_matmul_at_level(int level, ds_variant v, const ds_weight *W, int M, const float *x,
                        float *y, ds_pool *pool) {
    if (M <= 0 || W->n_out <= 0) return;
    const int64_t K = W->n_in, N = W->n_out;
    ds_mm_range_fn fn = pick(W->type, v);
    if (!fn || K < 0 || (W->type == DS_TYPE_Q8_0 && K % DS_QK8_0)) {
        fprintf(stderr, "ds_matmul: unsupported weight (type %u, n_in %lld)\n", W->type,
                (long long)K);
        abort();
    }
    ds_mm_ctx ctx = {.W = W, .M = M, .x = x, .y = y, .level = level};

    if (K == 0) {                               /* empty sums: +0 everywhere */
        for (int64_t i = 0; i < (int64_t)M * N; i++) y[i] = 0.0f;
        return;
    }
    mm_job job = {.ctx = &ctx, .fn = fn};
    int64_t groups = (N + DS_MM_GROUP - 1) / DS_MM_GROUP;
    int64_t per_group = K * DS_MM_GROUP;
    int64_t grain = (DS_MM_MIN_WORK + per_group - 1) / per_group;
    ds_pool_for(pool, groups, grain, mm_range, &job);
}

void ds_matmul(ds_variant v, const ds_weight *W, int M, const float *x, float *y, ds_pool *pool) {
    ds_matmul_at_level(ds_simd_level(), v, W, M, x, y, pool);
}

/* The decode kernel is not a separate implementation: it IS canonical(M=1). */
void ds_matmul_decode(const ds_weight *W, const float *x, float *y, ds_pool *pool) {
    ds_matmul(DS_CANONICAL, W, 1, x, y, pool);
}
