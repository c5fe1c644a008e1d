/* bench/gdn_rollback.c — what exact rollback of a hybrid model's recurrent
 * state costs, the two ways (issue 26 item 3), on one gated delta net layer
 * of a Qwen3.5-9B-like shape (16 key heads, 32 value heads of 128, conv 4;
 * the projections around it are the same matmuls either way and are left
 * out):
 *
 *   per-row   the verify's L rows keep the state after each row (a ring of
 *             L + 1 states); a rollback to row a is free (pos = a + 1).
 *   replay    (dspark's choice, rstate.h) checkpoint + recompute, double
 *             buffered: the verify reads the current state and writes only
 *             the last row's state into the other buffer, its input rows
 *             logged; when rows were rejected the accepted a + 1 rows run
 *             again from the checkpoint (no state is ever copied).
 *
 * Per round: L rows verified, a accepted (a + 1 rows kept, the bonus row's
 * state being the anchor's of the next round). Medians of REPS rounds, the
 * two interleaved round by round, for a = 0, L/2, L - 1 (all accepted);
 * memory per sequence and layer beside them. Both give the same bits (the
 * bench checks the final states memcmp-equal).
 *
 *   build/bench/gdn_rollback [-t N] [--rows L] [--reps N] [--heads HK,HV,S] */
#include "kernels/kernels.h"
#include "threadpool.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench_util.h"
static uint64_t rng = 88172645463325252ull;
static float frand(void) {
    rng ^= rng << 13; rng ^= rng >> 7; rng ^= rng << 17;
    return (float)(rng >> 40) / (float)(1u << 24) * 2.0f - 1.0f;
}

typedef struct {
    ds_gdn_shape s;
    size_t C, Hv, vd, cs, ss, sn;
    float *w, *dt, *A;
    ds_pool *pool;
} layer_t;

/* conv + recurrence over n rows of in (raw q|k|v, alpha, beta) from state
 * st_in; outs[t]: where row t's state goes (NULL: not kept). X / AB:
 * scratch the call overwrites (the in-place norms and gates). */
static void step(const layer_t *L, int n, const float *in, const float *st_in, float *const *outs, float *X, float *XC,
                 float *AB, float *o, float **co, float **so) {
    const size_t row = L->C + 2 * L->Hv;
    for (int t = 0; t < n; t++) {
        memcpy(X + (size_t)t * L->C, in + (size_t)t * row, L->C * sizeof(float));
        memcpy(AB + (size_t)t * L->Hv, in + (size_t)t * row + L->C, L->Hv * sizeof(float));
        memcpy(AB + (size_t)(n + t) * L->Hv, in + (size_t)t * row + L->C + L->Hv, L->Hv * sizeof(float));
        co[t] = outs[t];
        so[t] = outs[t] ? outs[t] + L->cs : NULL;
    }
    ds_gdn_conv(DS_CANONICAL, &L->s, n, X, L->w, st_in, co, XC, L->pool);
    ds_gdn_recur(DS_CANONICAL, &L->s, n, XC, AB, AB + (size_t)n * L->Hv, L->dt, L->A, st_in ? st_in + L->cs : NULL, so, o,
                 L->pool);
}

int main(int argc, char **argv) {
    int threads = 1, Lrows = 8, reps = 21, Hk = 16, Hv = 32, S = 128;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-t") && i + 1 < argc) threads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--rows") && i + 1 < argc) Lrows = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--reps") && i + 1 < argc) reps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--heads") && i + 1 < argc) {
            if (sscanf(argv[++i], "%d,%d,%d", &Hk, &Hv, &S) != 3) { fprintf(stderr, "gdn_rollback: --heads HK,HV,S\n"); return 2; }
        } else { fprintf(stderr, "usage: gdn_rollback [-t N] [--rows L] [--reps N] [--heads HK,HV,S]\n"); return 2; }
    }
    if (threads < 1 || threads > 256 || Lrows < 2 || Lrows > 64 || reps < 3 || Hk < 1 || Hv % Hk || S < 1 || S > DS_GDN_MAX_HEAD) {
        fprintf(stderr, "gdn_rollback: bad arguments\n");
        return 2;
    }
    layer_t L;
    L.s = (ds_gdn_shape){Hk, Hv, S, 4, (2 * Hk + Hv) * S, 1e-6f};
    L.C = (size_t)L.s.conv_dim; L.Hv = (size_t)Hv; L.vd = (size_t)Hv * S;
    L.cs = 3 * L.C; L.ss = (size_t)Hv * S * S; L.sn = L.cs + L.ss;
    L.pool = ds_pool_new(threads);
    L.w = malloc(L.C * 4 * sizeof(float));
    L.dt = malloc(2 * L.Hv * sizeof(float));
    L.A = L.dt + L.Hv;
    for (size_t i = 0; i < L.C * 4; i++) L.w[i] = 0.5f * frand();
    for (size_t h = 0; h < L.Hv; h++) { L.dt[h] = 0.3f * frand(); L.A[h] = -1.0f + 0.4f * frand(); }
    const size_t row = L.C + 2 * L.Hv, M = (size_t)Lrows;
    float *in = malloc(M * row * sizeof(float));
    float *X = malloc(M * L.C * sizeof(float)), *XC = malloc(M * L.C * sizeof(float));
    float *AB = malloc(2 * M * L.Hv * sizeof(float)), *o = malloc(M * L.vd * sizeof(float));
    float **co = malloc(M * sizeof(float *)), **so = malloc(M * sizeof(float *)), **outs = malloc(M * sizeof(float *));
    /* per-row: a ring of L + 1 states; replay: two buffers (st: the
     * checkpoint the round starts from, nx: the other) and the input log */
    float *ring = malloc((M + 1) * L.sn * sizeof(float)), *logb = malloc(M * row * sizeof(float));
    float *st = malloc(L.sn * sizeof(float)), *nx = malloc(L.sn * sizeof(float));
    if (!in || !ring || !st || !nx || !outs || !logb) { fprintf(stderr, "gdn_rollback: out of memory\n"); return 2; }
    for (size_t i = 0; i < M * row; i++) in[i] = frand();
    for (size_t i = 0; i < L.sn; i++) ring[i] = 0.1f * frand();
    memcpy(st, ring, L.sn * sizeof(float));
    const int accepts[3] = {0, Lrows / 2, Lrows - 1};
    printf("gdn_rollback: one gated delta net layer, key heads %d, value heads %d x %d, conv 4, verify rows L=%d, threads %d, reps %d\n",
           Hk, Hv, S, Lrows, threads, reps);
    printf("memory per sequence and layer: per-row ring %.1f MiB (L + 1 states), replay %.2f MiB (2 states + L logged input rows)\n",
           (double)((M + 1) * L.sn * 4) / 1048576.0, (double)(2 * L.sn * 4 + M * row * 4) / 1048576.0);
    printf("%-22s %12s %12s %8s\n", "accepted a", "per-row ms", "replay ms", "ratio");
    int same = 1;
    for (int ai = 0; ai < 3; ai++) {
        const int a = accepts[ai];
        double *ta = malloc((size_t)reps * sizeof(double)), *tb = malloc((size_t)reps * sizeof(double));
        for (int r = 0; r < reps; r++) {
            /* A: per-row states; the ring's slot 0 holds the start state,
             * rows go to slots 1..L, the next round starts from slot a + 1 */
            double t0 = now_s();
            for (int t = 0; t < Lrows; t++) outs[t] = ring + (size_t)(t + 1) * L.sn;
            step(&L, Lrows, in, ring, outs, X, XC, AB, o, co, so);
            /* rollback: nothing to do (the state after row a is slot a + 1) */
            double t1 = now_s();
            /* B: the L rows from st into nx (the last state only), their
             * inputs logged; a + 1 rows replayed from st into nx when any
             * was rejected */
            memcpy(logb, in, M * row * sizeof(float));
            for (int t = 0; t < Lrows; t++) outs[t] = t == Lrows - 1 ? nx : NULL;
            step(&L, Lrows, in, st, outs, X, XC, AB, o, co, so);
            if (a < Lrows - 1) {
                for (int t = 0; t <= a; t++) outs[t] = t == a ? nx : NULL;
                step(&L, a + 1, logb, st, outs, X, XC, AB, o, co, so);
            }
            double t2 = now_s();
            ta[r] = t1 - t0;
            tb[r] = t2 - t1;
            same &= !memcmp(nx, ring + (size_t)(a + 1) * L.sn, L.sn * sizeof(float));
            /* both restart from the same state next round (ring[0] == st) */
        }
        qsort(ta, (size_t)reps, sizeof(double), cmp_d);
        qsort(tb, (size_t)reps, sizeof(double), cmp_d);
        const double ma = ta[reps / 2] * 1e3, mb = tb[reps / 2] * 1e3;
        char lab[32];
        snprintf(lab, sizeof lab, "a=%d%s", a, a == Lrows - 1 ? " (all)" : "");
        printf("%-22s %12.3f %12.3f %8.2f   (per-row spread %.3f..%.3f, replay %.3f..%.3f)\n", lab, ma, mb, mb / ma,
               ta[reps / 4] * 1e3, ta[3 * reps / 4] * 1e3, tb[reps / 4] * 1e3, tb[3 * reps / 4] * 1e3);
        free(ta);
        free(tb);
    }
    printf("%s rolled-back states identical both ways (memcmp)\n", same ? "PASS" : "FAIL");
    free(in); free(X); free(XC); free(AB); free(o); free(co); free(so); free(outs);
    free(ring); free(logb); free(st); free(nx); free(L.w); free(L.dt);
    ds_pool_free(L.pool);
    return same ? 0 : 1;
}
