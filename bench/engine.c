/* bench/engine.c — what batching many sequences buys (issue 21): decode
 * throughput of N sequences stepped together by the batch engine against
 * one sequence, and a long prompt's time to first token with and without
 * the prefix cache. Medians of REPS runs, the ratios side by side.
 *
 *   build/bench/engine MODEL.gguf [--device cpu|cuda] [-t N] [--reps N]
 *                      [--decode N] [--prompt N] [--long N [--long-seqs K]] [--chunk N]
 *                      [--drafter D.gguf [--text FILE] [--oracle-accept Q] [--draft-pass N]]
 *                      [--no-graphs | --graphs-verify | --graphs-ab] [--seqs N (with a drafter: only N = 1, 4, 16 or 64)]
 *
 * --long-seqs K: after the prefix-cache line, K different long prompts
 * prefilled in one engine forward (the batch engine's prompt chunks holding
 * runs of several sequences), their time and tokens/s, each sequence's
 * first token checked against it prefilled alone.
 * --chunk N: the engine's rows per chunk (ds_engine_params.m_max; 64, as
 * `dspark serve --ubatch`'s default; the long prompt is cut into chunks of N).
 * --no-graphs: the engine records no batch shape (ds_engine_params
 * no_graphs); --graphs-verify: it records verify chunks too; --graphs-ab: the batch decode with and without, interleaved
 * rep by rep on two engines, side by side (a device that records launch
 * sequences; on the CPU both are the same path).
 *
 * With a drafter: N requests (N = 1..64, prompts from windows of the text)
 * through the scheduler, plain and speculative interleaved, generated
 * tokens per second of each and the ratio, the acceptance, and whether
 * every speculative request's tokens equal its plain tokens. With
 * --oracle-accept Q the drafts are replaced after each drafting round (the
 * drafter still runs, for its cost) by the plain continuation, each draft
 * kept right with probability Q (a fixed hash of its position): the
 * acceptance of a trained pair on a shape that has none. Labelled so.
 *
 * Every batch is checked against the sequences' own greedy tokens (one
 * sequence alone): a faster wrong answer is not a result. */
#include "drafter.h"
#include "engine.h"
#include "generate.h"
#include "scheduler.h"

#include <stdlib.h>
#include <time.h>

#include "bench_util.h"

static void die(const char *what, const char *err) {
    fprintf(stderr, "engine bench: %s: %s\n", what, err);
    exit(2);
}

/* N sequences: prompt of n_prompt ids each (different), then D decode steps
 * with all N rows in every step. Returns decode seconds; ids[N][D]. */
static double run_batch(ds_engine *e, int N, int n_prompt, int D, int V, int32_t *ids) {
    char err[DS_ERRLEN];
    int slot[256];
    ds_row *rows = calloc((size_t)N * (size_t)n_prompt, sizeof *rows);
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

/* ---- speculative requests through the scheduler ---------------------------- */

typedef struct {
    int32_t *out;               /* [D] what it generated                 */
    int n, D;
    const int32_t *ref;         /* oracle: the plain tokens [D]          */
    double q;
    int V, n_prompt;
} breq;

static int b_tok(void *u, int32_t t) {
    breq *q = u;
    if (q->n < q->D) q->out[q->n] = t;
    q->n++;
    return 0;
}

/* the oracle: the draft for position p + k + 1 is the plain token there
 * with probability q (a hash of the position), else another token */
static void b_override(void *u, int p, int n, int32_t *ids) {
    breq *q = u;
    if (!q->ref) return;
    for (int k = 0; k < n; k++) {
        const int g = p + k + 1 - q->n_prompt;          /* index into the generated tokens */
        if (g < 0 || g >= q->D) continue;
        uint64_t h = (uint64_t)(p + k + 1) * 0x9e3779b97f4a7c15ull;
        h ^= h >> 29; h *= 0xbf58476d1ce4e5b9ull; h ^= h >> 32;
        const double x = (double)(h >> 11) / 9007199254740992.0;
        ids[k] = x < q->q ? q->ref[g] : (q->ref[g] + 1) % q->V;
    }
}

/* N requests at once through s (a server's scheduler: it lives across runs,
 * so AUTO's measurements carry over); seconds from submit to the last
 * token, and the counters this run added */
static double run_sched(ds_sched *s, int N, const int32_t *text, int n_text, int n_prompt, int D, int spec, breq *rq,
                        double oracle, const int32_t *ref, ds_sched_stats *st) {
    char err[DS_ERRLEN];
    ds_sched_stats st0;
    ds_sched_get_stats(s, &st0);
    const double t0 = now_s();
    for (int i = 0; i < N; i++) {
        rq[i].n = 0;
        rq[i].D = D;
        rq[i].ref = ref ? ref + (size_t)i * D : NULL;
        rq[i].q = oracle;
        rq[i].n_prompt = n_prompt;
        const int off = (int)(((size_t)i * 197) % (size_t)(n_text - n_prompt));
        const ds_req_params p = {.prompt = text + off, .n_prompt = n_prompt, .n_predict = D, .stop_at_eog = 0,
                                 .on_token = b_tok, .user = &rq[i], .speculative = spec};
        if (ds_sched_submit(s, &p, err, sizeof err) < 0) die("submit", err);
    }
    int rc;
    while ((rc = ds_sched_step(s, err, sizeof err)) > 0) {}
    if (rc < 0) die("step", err);
    const double t = now_s() - t0;
    ds_sched_get_stats(s, st);
    st->steps -= st0.steps;
    st->spec_rounds -= st0.spec_rounds;
    st->drafted -= st0.drafted;
    st->accepted -= st0.accepted;
    return t;
}

static void bench_spec(const ds_model *m, const char *dpath, const char *text_path, int threads, int reps, int D,
                       int n_prompt, double oracle, int draft_pass, int no_graphs, int only_n) {
    char err[DS_ERRLEN];
    ds_drafter *d = ds_drafter_load(dpath, m, err, sizeof err);
    if (!d) die("drafter", err);
    /* the text: a file, or a paragraph; tokenized with the model's vocabulary */
    static const char para[] =
        "The package provides a library and a command line tool. The library reads the configuration file at start "
        "and writes its log to the standard error stream. If the file does not exist, the default settings are used. "
        "See the manual page for the list of options and the format of the configuration file. Bugs should be "
        "reported to the maintainer of the package with the output of the version command. ";
    char *buf = NULL;
    size_t len = 0;
    if (text_path) {
        FILE *f = fopen(text_path, "rb");
        if (!f) die("cannot open the --text file", text_path);
        buf = malloc(1 << 20);
        len = fread(buf, 1, (1 << 20) - 1, f);
        fclose(f);
    } else {
        buf = malloc(16 * sizeof para);
        for (int i = 0; i < 16; i++) memcpy(buf + len, para, sizeof para - 1), len += sizeof para - 1;
    }
    int32_t *text = NULL;
    size_t n_text = 0;
    const int want = n_prompt + 64 * 197;
    if (m->tok && ds_tokenize(m->tok, buf, len, 0, &text, &n_text, err, sizeof err)) die("tokenize", err);
    free(buf);
    if ((int)n_text < want) {   /* no tokenizer (a made shape) or a short text: ids of a fixed sequence */
        int32_t *t = realloc(text, (size_t)want * sizeof *t);
        if (!t) die("text", "out of memory");
        text = t;
        for (int i = (int)n_text; i < want; i++) text[i] = (int32_t)(((int64_t)i * 7919 + 11) % m->hp.n_vocab);
        printf("text: %zu tokens of text, %d more from a fixed id sequence\n", n_text, want - (int)n_text);
        n_text = (size_t)want;
    }
    const ds_engine_params ep = {.n_seq_max = 64, .n_ctx = n_prompt + D + 2, .m_max = 64, .n_threads = threads, .drafter = d,
                                 .draft_pass = draft_pass, .no_graphs = no_graphs};
    ds_engine *e = ds_engine_new(m, &ep, err, sizeof err);
    if (!e) die("engine with drafter", err);
    printf("speculative requests: drafter=%s gamma=%d prompt=%d generated=%d reps=%d draft_pass=%d graphs=%s%s (medians; plain and speculative interleaved)\n",
           dpath, ds_drafter_block_size(d), n_prompt, D, reps, draft_pass ? draft_pass : 16,
           no_graphs == 1 ? "off" : no_graphs ? "on+verify" : "on",
           oracle > 0 ? " ORACLE acceptance (drafts replaced)" : "");
    if (oracle > 0) printf("oracle: each draft is the plain token with probability %.2f; the drafter runs for its cost\n", oracle);
    static const int Ns[] = {1, 4, 16, 64};
    ds_sched *sch[3];
    for (int k = 0; k < 3; k++) {
        const ds_sched_params sp = {.max_rows = 1024, .prefix_cache = 0, .draft_override = oracle > 0 && k ? b_override : NULL,
                                    .spec_policy = k == 2 ? DS_SPEC_AUTO : DS_SPEC_FIXED};
        if (!(sch[k] = ds_sched_new(e, &sp, err, sizeof err))) die("scheduler", err);
    }
    breq *rp = calloc(64, sizeof *rp), *rs = calloc(64, sizeof *rs), *ra = calloc(64, sizeof *ra);
    int32_t *outp = malloc((size_t)64 * D * sizeof *outp), *outs = malloc((size_t)64 * D * sizeof *outs);
    int32_t *outa = malloc((size_t)64 * D * sizeof *outa);
    for (int i = 0; i < 64; i++) {
        rp[i].out = outp + (size_t)i * D; rp[i].V = m->hp.n_vocab;
        rs[i].out = outs + (size_t)i * D; rs[i].V = m->hp.n_vocab;
        ra[i].out = outa + (size_t)i * D; ra[i].V = m->hp.n_vocab;
    }
    for (size_t k = 0; k < sizeof Ns / sizeof *Ns; k++) {
        const int N = Ns[k];
        if (only_n && N != only_n) continue;
        double tp[99], ts[99], ta[99];
        ds_sched_stats sp, ss, sa;
        long rec0, rep0, rec1, rep1;
        ds_engine_graph_counts(e, &rec0, &rep0);
        for (int r = -1; r < reps; r++) {   /* r = -1: a warm-up of each */
            if (r < 0) {
                run_sched(sch[0], N, text, (int)n_text, n_prompt, D, 0, rp, 0, NULL, &sp);
                run_sched(sch[2], N, text, (int)n_text, n_prompt, D, 2, ra, oracle, outp, &sa);
                continue;
            }
            tp[r] = run_sched(sch[0], N, text, (int)n_text, n_prompt, D, 0, rp, 0, NULL, &sp);
            ts[r] = run_sched(sch[1], N, text, (int)n_text, n_prompt, D, 1, rs, oracle, outp, &ss);
            ta[r] = run_sched(sch[2], N, text, (int)n_text, n_prompt, D, 2, ra, oracle, outp, &sa);
        }
        qsort(tp, (size_t)reps, sizeof *tp, cmp_d);
        qsort(ts, (size_t)reps, sizeof *ts, cmp_d);
        qsort(ta, (size_t)reps, sizeof *ta, cmp_d);
        int same = 1;
        for (int i = 0; i < N; i++)
            same &= rp[i].n == D && rs[i].n == D && ra[i].n == D && !memcmp(rp[i].out, rs[i].out, (size_t)D * sizeof(int32_t)) &&
                    !memcmp(rp[i].out, ra[i].out, (size_t)D * sizeof(int32_t));
        const double kp = (double)N * D / tp[reps / 2], ks = (double)N * D / ts[reps / 2], ka = (double)N * D / ta[reps / 2];
        printf("spec N=%-3d plain %8.1f tok/s | fixed %8.1f tok/s %5.2fx, accepted %ld/%ld (%.0f%%), tokens/round %.2f | "
               "auto %8.1f tok/s %5.2fx, accepted %ld/%ld, last cap %d | tokens==plain: %s\n",
               N, kp, ks, ks / kp, ss.accepted, ss.drafted, ss.drafted ? 100.0 * ss.accepted / ss.drafted : 0.0,
               ss.spec_rounds ? (double)(ss.accepted + ss.spec_rounds) / ss.spec_rounds : 0.0, ka, ka / kp, sa.accepted,
               sa.drafted, sa.spec_cap, same ? "yes" : "NO");
        ds_engine_graph_counts(e, &rec1, &rep1);
        printf("spec N=%-3d graphs: %ld chunks recorded, %ld replayed (all runs of this N)\n", N, rec1 - rec0, rep1 - rep0);
    }
    for (int k = 0; k < 3; k++) ds_sched_free(sch[k]);
    free(rp); free(rs); free(ra); free(outp); free(outs); free(outa); free(text);
    ds_engine_free(e);
    ds_drafter_free(d);
}

int main(int argc, char **argv) {
    const char *path = NULL, *device = "cpu", *dpath = NULL, *text_path = NULL;
    int threads = 2, reps = 3, D = 32, n_prompt = 32, n_long = 0, draft_pass = 0, no_graphs = 0, graphs_ab = 0, only_n = 0;
    int chunk = 64;             /* rows per engine chunk (ds_engine_params.m_max) */
    int long_seqs = 1;          /* --long-seqs K: K long prompts prefilled in one forward */
    double oracle = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--device") && i + 1 < argc) device = argv[++i];
        else if (!strcmp(argv[i], "-t") && i + 1 < argc) threads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--reps") && i + 1 < argc) reps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--decode") && i + 1 < argc) D = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--prompt") && i + 1 < argc) n_prompt = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--long") && i + 1 < argc) n_long = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--chunk") && i + 1 < argc) chunk = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--long-seqs") && i + 1 < argc) long_seqs = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--drafter") && i + 1 < argc) dpath = argv[++i];
        else if (!strcmp(argv[i], "--text") && i + 1 < argc) text_path = argv[++i];
        else if (!strcmp(argv[i], "--oracle-accept") && i + 1 < argc) oracle = atof(argv[++i]);
        else if (!strcmp(argv[i], "--draft-pass") && i + 1 < argc) draft_pass = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--no-graphs")) no_graphs = 1;
        else if (!strcmp(argv[i], "--graphs-verify")) no_graphs = -1;   /* record verify chunks too */
        else if (!strcmp(argv[i], "--seqs") && i + 1 < argc) only_n = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--graphs-ab")) graphs_ab = 1;
        else if (!path && argv[i][0] != '-') path = argv[i];
        else { fprintf(stderr, "engine bench: unknown argument '%s'\n", argv[i]); return 2; }
    }
    if (!path || reps < 1 || reps > 99 || D < 1 || D > 4096 || n_prompt < 1 || n_prompt > 4096 || threads < 1 ||
        oracle < 0 || oracle > 1 || chunk < 1 || chunk > 8192 || long_seqs < 1 || long_seqs > 64) {
        fprintf(stderr, "usage: engine MODEL.gguf [--device cpu|cuda] [-t N] [--reps N] [--decode N] [--prompt N] [--long N [--long-seqs K]] [--chunk N]\n"
                        "              [--drafter D.gguf [--text FILE] [--oracle-accept Q]]\n");
        return 2;
    }
    char err[DS_ERRLEN];
    ds_model *m = ds_model_load_on(path, device, err, sizeof err);
    if (!m) die("load", err);
    if (dpath) {   /* the speculative comparison alone */
        printf("engine bench: model=%s device=%s threads=%d\n", path, device, threads);
        bench_spec(m, dpath, text_path, threads, reps, D, n_prompt, oracle, draft_pass, no_graphs, only_n);
        ds_model_free(m);
        return 0;
    }
    const int V = m->hp.n_vocab;
    static const int Ns[] = {1, 2, 4, 8, 16, 32, 64};
    const int n_ctx = n_prompt + D + 1 > n_long + 2 ? n_prompt + D + 1 : n_long + 2;
    const ds_engine_params ep = {.n_seq_max = 64, .n_ctx = n_ctx, .m_max = chunk, .n_threads = threads, .no_graphs = no_graphs};
    ds_engine *e = ds_engine_new(m, &ep, err, sizeof err);
    if (!e) die("engine", err);
    ds_engine *eo = NULL;       /* --graphs-ab: the same engine recording nothing */
    if (graphs_ab) {
        const ds_engine_params eq = {.n_seq_max = 64, .n_ctx = n_ctx, .m_max = 64, .n_threads = threads, .no_graphs = 1};
        if (!(eo = ds_engine_new(m, &eq, err, sizeof err))) die("engine without graphs", err);
    }
    printf("engine bench: model=%s device=%s threads=%d prompt=%d decode_steps=%d reps=%d graphs=%s (medians)\n", path, device,
           threads, n_prompt, D, reps, graphs_ab ? "A/B" : no_graphs ? "off" : "on");
    int32_t *ref = malloc((size_t)64 * D * sizeof *ref), *got = malloc((size_t)64 * D * sizeof *got);
    double t1 = 0;
    for (size_t k = 0; k < sizeof Ns / sizeof *Ns; k++) {
        const int N = Ns[k];
        double t[99], to[99];
        int same_ab = 1;
        for (int r = 0; r < reps; r++) {
            t[r] = run_batch(e, N, n_prompt, D, V, got);
            if (eo) {   /* interleaved: the same batch op by op, the same tokens */
                to[r] = run_batch(eo, N, n_prompt, D, V, ref);
                same_ab &= !memcmp(ref, got, (size_t)N * D * sizeof *got);
            }
        }
        qsort(t, (size_t)reps, sizeof *t, cmp_d);
        if (eo) {
            qsort(to, (size_t)reps, sizeof *to, cmp_d);
            printf("graphs N=%-3d recorded %8.1f tok/s  op by op %8.1f tok/s  %5.2fx  tokens equal: %s\n", N,
                   (double)N * D / t[reps / 2], (double)N * D / to[reps / 2], to[reps / 2] / t[reps / 2],
                   same_ab ? "yes" : "NO");
        }
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
        printf("prefix cache: %d-token prompt in %d-row chunks, time to first token miss %.2f ms, hit %.2f ms: %.1fx faster, same first token: %s\n",
               n_long, chunk, 1e3 * tm[reps / 2], 1e3 * th[reps / 2], tm[reps / 2] / th[reps / 2], first[0] == first[1] ? "yes" : "NO");
        free(ids); free(rows); free(sel);
        if (long_seqs > 1) {
            const int K = long_seqs, NT = K * n_long;
            ds_row *kr = malloc((size_t)NT * sizeof *kr);
            int32_t *ks = malloc((size_t)NT * sizeof *ks), *alone = malloc((size_t)K * sizeof *alone);
            int slot[64];
            double tk[99];
            /* sequence q's prompt ids: a function of (q, p); alone first */
            for (int q = 0; q < K; q++) {
                const int s1 = ds_engine_seq_new(e, err, sizeof err);
                if (s1 < 0) die("sequence", err);
                for (int p = 0; p < n_long; p++)
                    kr[p] = (ds_row){s1, p, (int32_t)((p * 7919 + 11 + q * 101) % V), p == n_long - 1 ? DS_ROW_SELECT : 0, NULL};
                ds_fwd_out o1 = {.ids = ks};
                if (ds_engine_forward(e, kr, n_long, &o1, err, sizeof err)) die("long prompt alone", err);
                alone[q] = ks[n_long - 1];
                ds_engine_seq_free(e, s1);
            }
            int same = 1;
            for (int r = 0; r < reps; r++) {
                for (int q = 0; q < K; q++)
                    if ((slot[q] = ds_engine_seq_new(e, err, sizeof err)) < 0) die("sequence", err);
                for (int q = 0; q < K; q++)
                    for (int p = 0; p < n_long; p++)
                        kr[q * n_long + p] = (ds_row){slot[q], p, (int32_t)((p * 7919 + 11 + q * 101) % V),
                                                      p == n_long - 1 ? DS_ROW_SELECT : 0, NULL};
                ds_fwd_out ok = {.ids = ks};
                const double t0 = now_s();
                if (ds_engine_forward(e, kr, NT, &ok, err, sizeof err)) die("long prompts", err);
                tk[r] = now_s() - t0;
                for (int q = 0; q < K; q++) {
                    same &= ks[q * n_long + n_long - 1] == alone[q];
                    ds_engine_seq_free(e, slot[q]);
                }
            }
            qsort(tk, (size_t)reps, sizeof *tk, cmp_d);
            printf("long prompts: %d x %d tokens in one forward, %d-row chunks: %.2f ms, %.1f tok/s, first tokens == each alone: %s\n",
                   K, n_long, chunk, 1e3 * tk[reps / 2], NT / tk[reps / 2], same ? "yes" : "NO");
            free(kr); free(ks); free(alone);
        }
    }
    ds_engine_free(eo);
    ds_engine_free(e);
    ds_model_free(m);
    return 0;
}
