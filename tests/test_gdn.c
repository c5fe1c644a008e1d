/* test_gdn.c — the gated delta net family (gdn.c): a canonical call over M
 * rows gives, for every row, decode's output AND decode's state after that
 * row (conv window and recurrence, memcmp), for M = 1..16 on several shapes
 * and thread counts; a call may start from a state in the ring it writes;
 * the fast variant does differ; bad shapes are refused. */
#include "kernels/kernels.h"
#include "threadpool.h"
#include "testutil.h"

#include <math.h>
#include <stdint.h>

static uint64_t rng = 0x243f6a8885a308d3ull;
static float frand(void) {          /* xorshift64*, uniform in [-1, 1) */
    rng ^= rng >> 12; rng ^= rng << 25; rng ^= rng >> 27;
    return (float)((rng * 2685821657736338717ull) >> 40) / (float)(1u << 24) * 2.0f - 1.0f;
}

typedef struct {
    ds_gdn_shape s;
    size_t C, Hv, vd, cs, ss;
    float *w, *dt, *A;
} shape_t;

static void shape_init(shape_t *t, int Hk, int Hv, int S, int K) {
    t->s = (ds_gdn_shape){Hk, Hv, S, K, (2 * Hk + Hv) * S, 1e-6f};
    t->C = (size_t)t->s.conv_dim;
    t->Hv = (size_t)Hv;
    t->vd = (size_t)Hv * S;
    t->cs = (size_t)(K - 1) * t->C;
    t->ss = (size_t)Hv * S * S;
    t->w = malloc(t->C * K * sizeof(float));
    t->dt = malloc(2 * t->Hv * sizeof(float));
    t->A = t->dt + t->Hv;
    for (size_t i = 0; i < t->C * K; i++) t->w[i] = frand();
    for (size_t h = 0; h < t->Hv; h++) { t->dt[h] = 0.3f * frand(); t->A[h] = -1.0f + 0.5f * frand(); }
}

/* Rows [n][C + 2 Hv] (raw q|k|v, alpha, beta) through conv + recurrence from
 * state (st_in: conv | ssm, NULL = zeros); per-row states into st_rows
 * (n x (cs + ss)) or only the last into st_rows. */
static void run(ds_variant v, const shape_t *t, int n, const float *in, const float *st_in, float *st_rows, int keep_all,
                float *out, ds_pool *pool) {
    float *X = malloc((size_t)n * t->C * sizeof(float)), *XC = malloc((size_t)n * t->C * sizeof(float));
    float *AL = malloc(2 * (size_t)n * t->Hv * sizeof(float)), *BE = AL + (size_t)n * t->Hv;
    float **co = calloc((size_t)n, sizeof(float *)), **so = calloc((size_t)n, sizeof(float *));
    const size_t row = t->C + 2 * t->Hv, sn = t->cs + t->ss;
    for (int r = 0; r < n; r++) {
        memcpy(X + (size_t)r * t->C, in + (size_t)r * row, t->C * sizeof(float));
        memcpy(AL + (size_t)r * t->Hv, in + (size_t)r * row + t->C, t->Hv * sizeof(float));
        memcpy(BE + (size_t)r * t->Hv, in + (size_t)r * row + t->C + t->Hv, t->Hv * sizeof(float));
        if (keep_all || r == n - 1) {
            float *dst = st_rows + (keep_all ? (size_t)r * sn : 0);
            co[r] = dst;
            so[r] = dst + t->cs;
        }
    }
    ds_gdn_conv(v, &t->s, n, X, t->w, st_in, co, XC, pool);
    ds_gdn_recur(v, &t->s, n, XC, AL, BE, t->dt, t->A, st_in ? st_in + t->cs : NULL, so, out, pool);
    free(X); free(XC); free(AL); free(co); free(so);
}

int main(void) {
    static const int shapes[][4] = {{2, 4, 32, 4}, {1, 1, 16, 2}, {2, 2, 48, 3}, {4, 8, 16, 4}, {1, 2, 128, 4}};
    ds_pool *pools[2] = {ds_pool_new(1), ds_pool_new(3)};
    int canon_ok = 1, states_ok = 1, alias_ok = 1, fast_diff = 0, fast_runs = 0, finite = 1;
    long rows_checked = 0;
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
        shape_t t;
        shape_init(&t, shapes[si][0], shapes[si][1], shapes[si][2], shapes[si][3]);
        const size_t row = t.C + 2 * t.Hv, sn = t.cs + t.ss;
        for (int M = 1; M <= 16; M++) {
            /* a prefix of P rows first, so the block starts from a real state */
            const int P = 3 + M % 4;
            float *in = malloc((size_t)(P + M) * row * sizeof(float));
            for (size_t i = 0; i < (size_t)(P + M) * row; i++) in[i] = 2.0f * frand();
            float *s0 = malloc(sn * sizeof(float)), *ref_st = malloc((size_t)M * sn * sizeof(float));
            float *ref_out = malloc((size_t)M * t.vd * sizeof(float)), *o = malloc(((size_t)P + M) * t.vd * sizeof(float));
            float *got_out = malloc((size_t)M * t.vd * sizeof(float)), *got_st = malloc((size_t)M * sn * sizeof(float));
            run(DS_CANONICAL, &t, P, in, NULL, s0, 0, o, pools[0]);
            /* decode: one row a call, chaining the state */
            const float *prev = s0;
            for (int r = 0; r < M; r++) {
                run(DS_CANONICAL, &t, 1, in + (size_t)(P + r) * row, prev, ref_st + (size_t)r * sn, 0,
                    ref_out + (size_t)r * t.vd, pools[0]);
                prev = ref_st + (size_t)r * sn;
            }
            for (int pi = 0; pi < 2; pi++) {
                run(DS_CANONICAL, &t, M, in + (size_t)P * row, s0, got_st, 1, got_out, pools[pi]);
                if (memcmp(got_out, ref_out, (size_t)M * t.vd * sizeof(float))) {
                    canon_ok = 0;
                    printf("FAIL shape %zu M=%d threads=%d: canonical outputs differ from decode\n", si, M, pi ? 3 : 1);
                }
                if (memcmp(got_st, ref_st, (size_t)M * sn * sizeof(float))) {
                    states_ok = 0;
                    printf("FAIL shape %zu M=%d threads=%d: a canonical row's state differs from decode's\n", si, M,
                           pi ? 3 : 1);
                }
                rows_checked += M;
            }
            for (size_t i = 0; i < (size_t)M * t.vd; i++) finite &= isfinite(ref_out[i]) != 0;
            /* in place: the block's last state written over the state it starts from */
            {
                float *st = malloc(sn * sizeof(float));
                memcpy(st, s0, sn * sizeof(float));
                run(DS_CANONICAL, &t, M, in + (size_t)P * row, st, st, 0, got_out, pools[1]);
                if (memcmp(st, ref_st + (size_t)(M - 1) * sn, sn * sizeof(float)) ||
                    memcmp(got_out, ref_out, (size_t)M * t.vd * sizeof(float)))
                    alias_ok = 0;
                free(st);
            }
            /* counter-test: the fast variant over the same block */
            run(DS_FAST, &t, M, in + (size_t)P * row, s0, got_st, 1, got_out, pools[1]);
            fast_runs++;
            fast_diff += memcmp(got_out, ref_out, (size_t)M * t.vd * sizeof(float)) != 0 ||
                         memcmp(got_st, ref_st, (size_t)M * sn * sizeof(float)) != 0;
            free(in); free(s0); free(ref_st); free(ref_out); free(o); free(got_out); free(got_st);
        }
        free(t.w);
        free(t.dt);
    }
    CHECK(canon_ok, "canonical outputs == decode");
    CHECK(states_ok, "canonical per-row states == decode's");
    CHECK(alias_ok, "a call whose last state overwrites its input state");
    CHECK(finite, "outputs finite");
    printf("%s gdn canonical == decode: %ld rows (5 shapes, M = 1..16, 1 and 3 threads), outputs and per-row states memcmp\n",
           canon_ok && states_ok ? "PASS" : "FAIL", rows_checked);
    CHECK(fast_diff == fast_runs, "fast differs on %d of %d blocks", fast_diff, fast_runs);
    printf("%s gdn fast differs from decode on %d of %d blocks\n", fast_diff == fast_runs ? "PASS" : "FAIL", fast_diff,
           fast_runs);
    /* bad shapes: one refusal, nothing written */
    ds_gdn_shape bad = {3, 4, 16, 4, (6 + 4) * 16, 1e-6f};   /* value heads not a multiple of key heads */
    float one = 0.0f;
    float *no[1] = {NULL};
    CHECK(ds_gdn_recur(DS_CANONICAL, &bad, 1, &one, &one, &one, &one, &one, NULL, no, &one, NULL) == -1,
          "bad shape refused");
    ds_pool_free(pools[0]);
    ds_pool_free(pools[1]);
    return tu_finish("test_gdn");
}
