/* bench/engine.c — what batching many sequences buys (issue 21): decode
 * throughput of N sequences stepped together by the batch engine against
 * one sequence, and a long prompt's time to first token with and without
 * the prefix cache. Medians of REPS runs, the ratios side by side.
 *
 *   build/bench/engine MODEL.gguf [--device cpu|cuda] [-t N] [--reps N]
 *                      [--decode N] [--prompt N] [--long N]
 *
 * Every batch is checked against the sequences' own greedy tokens (one
 * sequence alone): a faster wrong answer is not a result. */
#include "engine.h"
#include "generate.h"

#include <stdlib.h>
#include <time.h>

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}
static int cmp_d(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static void die(const char *what, const char *err) {
    fprintf(stderr, "engine bench: %s: %s\n", what, err);
    exit(2);
}

/* N sequences: prompt of n_prompt ids each (different), then D decode steps
 * with all N rows in every step. Returns decode seconds; ids[N][D]. */
static double run_batch(ds_engine *e, int N, int n_prompt, int D, int V, int32_t *ids) {
    char err[DS_ERRLEN];
    int slot[256];
    ds_row *rows = malloc((size_t)N * (size_t)n_prompt * sizeof *rows);
    int32_t *sel = malloc((size_t)N * (size_t)n_prompt * sizeof *sel), *last = malloc((size_t)N * sizeof *last);
    int n = 0;
    for (int s = 0; s < N; s++) {
        if ((slot[s] = ds_engine_seq_new(e, err, sizeof err)) < 0) die("sequence", err);
        for (int p = 0; p < n_prompt; p++)
            rows[n++] = (ds_row){slot[s], p, (int32_t)((s * 131 + p * 17 + 3) % V), p == n_prompt - 1 ? DS_ROW_SELECT : 0, NULL};
    }
    ds_fwd_out out = {.ids = sel};
    if (ds_engine_forward(e, rows, n, &out, err, sizeof err)) die("prefill", err);
    for (int s = 0; s < N; s++) last[s] = sel[(size_t)s * n_prompt + n_prompt - 1];
    const double t0 = now_s();
    for (int d = 0; d < D; d++) {
        for (int s = 0; s < N; s++) rows[s] = (ds_row){slot[s], n_prompt + d, last[s], DS_ROW_SELECT, NULL};
        if (ds_engine_forward(e, rows, N, &out, err, sizeof err)) die("decode", err);
        for (int s = 0; s < N; s++) {
            last[s] = sel[s];
            ids[(size_t)s * D + d] = sel[s];
        }
    }
    const double t = now_s() - t0;
    for (int s = 0; s < N; s++) ds_engine_seq_free(e, slot[s]);
    free(rows); free(sel); free(last);
    return t;
}

int main(int argc, char **argv) {
    const char *path = NULL, *device = "cpu";
    int threads = 2, reps = 3, D = 32, n_prompt = 32, n_long = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--device") && i + 1 < argc) device = argv[++i];
        else if (!strcmp(argv[i], "-t") && i + 1 < argc) threads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--reps") && i + 1 < argc) reps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--decode") && i + 1 < argc) D = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--prompt") && i + 1 < argc) n_prompt = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--long") && i + 1 < argc) n_long = atoi(argv[++i]);
        else if (!path && argv[i][0] != '-') path = argv[i];
        else { fprintf(stderr, "engine bench: unknown argument '%s'\n", argv[i]); return 2; }
    }
    if (!path || reps < 1 || reps > 99 || D < 1 || D > 4096 || n_prompt < 1 || n_prompt > 4096 || threads < 1) {
        fprintf(stderr, "usage: engine MODEL.gguf [--device cpu|cuda] [-t N] [--reps N] [--decode N] [--prompt N] [--long N]\n");
        return 2;
    }
    char err[DS_ERRLEN];
    ds_model *m = ds_model_load_on(path, device, err, sizeof err);
    if (!m) die("load", err);
    const int V = m->hp.n_vocab;
    static const int Ns[] = {1, 2, 4, 8, 16, 32, 64};
    const int n_ctx = n_prompt + D + 1 > n_long + 2 ? n_prompt + D + 1 : n_long + 2;
    const ds_engine_params ep = {.n_seq_max = 64, .n_ctx = n_ctx, .m_max = 64, .n_threads = threads};
    ds_engine *e = ds_engine_new(m, &ep, err, sizeof err);
    if (!e) die("engine", err);
    printf("engine bench: model=%s device=%s threads=%d prompt=%d decode_steps=%d reps=%d (medians)\n", path, device,
           threads, n_prompt, D, reps);
    int32_t *ref = malloc((size_t)64 * D * sizeof *ref), *got = malloc((size_t)64 * D * sizeof *got);
    double t1 = 0;
    for (size_t k = 0; k < sizeof Ns / sizeof *Ns; k++) {
        const int N = Ns[k];
        double t[99];
        for (int r = 0; r < reps; r++) t[r] = run_batch(e, N, n_prompt, D, V, got);
        qsort(t, (size_t)reps, sizeof *t, cmp_d);
        const double med = t[reps / 2], toks = (double)N * D / med;
        if (N == 1) t1 = toks;
        /* the bytes: each sequence's tokens == itself alone (N = 1 runs of
         * sequence s have the ids the first column of a batch would) */
        int same = 1;
        if (N > 1) {
            for (int s = 0; s < N && same; s++) {
                /* sequence s alone: its prompt ids are a function of s */
                ds_engine *e1 = e;
                char e2[DS_ERRLEN];
                int slot = ds_engine_seq_new(e1, e2, sizeof e2);
                ds_row rows[4096];
                int32_t sel[4096];
                for (int p = 0; p < n_prompt; p++)
                    rows[p] = (ds_row){slot, p, (int32_t)((s * 131 + p * 17 + 3) % V), p == n_prompt - 1 ? DS_ROW_SELECT : 0, NULL};
                ds_fwd_out out = {.ids = sel};
                ds_engine_forward(e1, rows, n_prompt, &out, e2, sizeof e2);
                int32_t last = sel[n_prompt - 1];
                for (int d = 0; d < D && same; d++) {
                    rows[0] = (ds_row){slot, n_prompt + d, last, DS_ROW_SELECT, NULL};
                    ds_engine_forward(e1, rows, 1, &out, e2, sizeof e2);
                    last = sel[0];
                    same &= last == got[(size_t)s * D + d];
                }
                ds_engine_seq_free(e1, slot);
            }
        }
        printf("batch N=%-3d decode %8.1f tok/s  %6.2fx one sequence  step %7.3f ms  tokens==alone: %s\n", N, toks,
               t1 > 0 ? toks / t1 : 1.0, 1e3 * med / D, same ? "yes" : "NO");
    }
    free(ref); free(got);
    /* a long prompt twice: the second hits the prefix cache */
    if (n_long > 0) {
        int32_t *ids = malloc((size_t)n_long * sizeof *ids);
        for (int p = 0; p < n_long; p++) ids[p] = (int32_t)((p * 7919 + 11) % V);
        ds_row *rows = malloc((size_t)n_long * sizeof *rows);
        int32_t *sel = malloc((size_t)n_long * sizeof *sel);
        double tm[99], th[99];
        int32_t first[2] = {-1, -1};
        for (int r = 0; r < reps; r++)
            for (int hit = 0; hit < 2; hit++) {
                const int s = ds_engine_seq_new(e, err, sizeof err);
                const double t0 = now_s();
                const int from = hit ? ds_engine_prefix_lookup(e, s, ids, n_long, 0) : 0;
                for (int p = from; p < n_long; p++) rows[p - from] = (ds_row){s, p, ids[p], p == n_long - 1 ? DS_ROW_SELECT : 0, NULL};
                ds_fwd_out out = {.ids = sel};
                if (ds_engine_forward(e, rows, n_long - from, &out, err, sizeof err)) die("long prompt", err);
                (hit ? th : tm)[r] = now_s() - t0;
                first[hit] = sel[n_long - from - 1];
                if (!hit) ds_engine_prefix_publish(e, s);
                ds_engine_seq_free(e, s);
            }
        qsort(tm, (size_t)reps, sizeof *tm, cmp_d);
        qsort(th, (size_t)reps, sizeof *th, cmp_d);
        printf("prefix cache: %d-token prompt, time to first token miss %.2f ms, hit %.2f ms: %.1fx faster, same first token: %s\n",
               n_long, 1e3 * tm[reps / 2], 1e3 * th[reps / 2], tm[reps / 2] / th[reps / 2], first[0] == first[1] ? "yes" : "NO");
        free(ids); free(rows); free(sel);
    }
    ds_engine_free(e);
    ds_model_free(m);
    return 0;
}
