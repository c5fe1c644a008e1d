/* test_spec_batch.c — speculative rounds in the batch engine (engine.h
 * DS_ROW_DCTX / ds_engine_draft, scheduler.h speculative requests).
 *
 * 1. The drafter inside the engine is the drafter alone: the context rows
 *    the engine builds from its forward's taps (group 1 of the page pool,
 *    prompts prefilled in chunks of 1, 7 and 64 rows next to another
 *    sequence's rows) memcmp-equal the rows of a drafter context of its own
 *    fed by a one-sequence target context, and ds_engine_draft's drafts for
 *    several sequences at once equal ds_draft on each one's own context.
 * 2. Speculative requests through the scheduler give exactly plain
 *    generation's tokens alone (ds_generate), greedy and seeded, mixed with
 *    plain requests, whatever shares the steps: all at once, staggered
 *    arrivals, a row budget that cuts the verify blocks, the prefix cache
 *    (drafter rows reused with the pages), a pool small enough to preempt.
 *    On the shipped pair drafts are accepted (the rounds are real: fewer
 *    steps than plain), and with the random drafter of a made model almost
 *    none are (rejection paths).
 *    Counter-test: with --kernels fast the batched drafter rows differ.
 * 3. Bad requests: draft_max past the block size is refused; drafting a
 *    sequence whose drafter rows lag its target rows is refused. */
#include "drafter.h"
#include "drafter_internal.h"
#include "drafter_make.h"
#include "engine.h"
#include "generate.h"
#include "model_make.h"
#include "scheduler.h"
#include "testutil.h"

#define NREQ 12
#define NPRED 24

/* ---- 1. drafter rows and drafts ------------------------------------------ */

/* The reference: target context + a drafter context of its own, the prompt
 * prefilled with taps to the host, appended as context rows; then the
 * drafts of one round at n. */
/* DSPARK_ENGINE_GRAPHS=2 (tests/cuda/run.sh): the engines here record
 * their verify chunks too (ds_engine_params.no_graphs = -1), so that path's
 * bytes are proven on a recording device as well */
static int graphs_mode(void) {
    const char *g = getenv("DSPARK_ENGINE_GRAPHS");
    return g && !strcmp(g, "2") ? -1 : g && !strcmp(g, "0") ? 1 : 0;
}

static void ref_rows_samp(const ds_model *m, const ds_drafter *d, const int32_t *toks, int n, float *k, float *v,
                          int32_t *ids, int n_keep, const ds_sampler *samp) {
    char err[DS_ERRLEN];
    ds_ctx *c = ds_ctx_new(m, 512, 1, err, sizeof err);
    ds_dctx *x = c ? ds_dctx_new(d, 512 + ds_drafter_block_size(d), ds_ctx_exec(c), err, sizeof err) : NULL;
    const size_t T = (size_t)ds_drafter_n_taps(d) * m->hp.n_embd;
    float *taps = malloc((size_t)n * T * sizeof(float));
    if (!x || !taps || ds_set_taps(c, ds_drafter_tap_layers(d), ds_drafter_n_taps(d), err, sizeof err) ||
        ds_forward_batch(c, toks, n, 0, DS_LOGITS_NONE, NULL, taps, err, sizeof err) ||
        ds_dctx_append(x, taps, n, 0, err, sizeof err)) {
        printf("FAIL reference drafter rows: %s\n", err);
        exit(1);
    }
    ds_seq_read(x->seq, x->pool, x->ex, 0, 0, n, k, v);
    const ds_draft_opts o = {samp, n_keep};
    if (ds_draft(x, toks[n], n, &o, ids, NULL, NULL, err, sizeof err)) { printf("FAIL reference draft: %s\n", err); exit(1); }
    free(taps);
    ds_dctx_free(x);
    ds_ctx_free(c);
}

static void ref_rows(const ds_model *m, const ds_drafter *d, const int32_t *toks, int n, float *k, float *v, int32_t *ids,
                     int n_keep) {
    ref_rows_samp(m, d, toks, n, k, v, ids, n_keep, NULL);
}

/* Many sequences' rounds at once (ds_draft_many's passes): 20 sequences of
 * different lengths — passes of `pass` (0: 16, so 16 and 4) — each keeping
 * its own number of drafts (1..gamma: the shorter chains run beside the
 * longer ones), greedy and seeded sampled mixed in one pass (mixed) or all
 * greedy (a device records such passes): every sequence's drafts equal
 * ds_draft on a context of its own, and a second identical round gives
 * them again. */
static void test_draft_many_n(const char *what, const ds_model *m, const ds_drafter *d, int pass, int mixed, int ns) {
    char err[DS_ERRLEN];
    const int gamma = ds_drafter_block_size(d);
    enum { NS = 20, LMAX = 120 };
    if (ns < 1 || ns > NS) { printf("FAIL draft_many: %d sequences (1..%d)\n", ns, NS); exit(1); }
    int len[NS];
    int32_t toks[NS][LMAX + 1];
    ds_sampler samp[NS];
    uint64_t r = 91;
    for (int s = 0; s < ns; s++) {
        len[s] = 5 + (s * 37) % (LMAX - 5);
        for (int i = 0; i <= LMAX; i++) {
            r ^= r << 13; r ^= r >> 7; r ^= r << 17;
            toks[s][i] = (int32_t)(r % (uint64_t)m->hp.n_vocab);
        }
        samp[s] = (ds_sampler){.temp = s % 3 || !mixed ? 0.0f : 0.9f, .top_p = 1.0f, .seed = 100u + (uint64_t)s};
    }
    const ds_engine_params ep = {.n_seq_max = ns, .n_ctx = 256, .n_threads = 2, .drafter = d, .draft_pass = pass, .no_graphs = graphs_mode()};
    ds_engine *e = ds_engine_new(m, &ep, err, sizeof err);
    if (!e) { printf("FAIL engine with a drafter: %s\n", err); exit(1); }
    const int per = pass ? pass : 16;
    int slot[NS];
    ds_draft_req dr[NS];
    ds_row *rows = malloc((size_t)ns * LMAX * sizeof *rows);
    int n = 0;
    for (int s = 0; s < ns; s++) {
        slot[s] = ds_engine_seq_new(e, err, sizeof err);
        for (int j = 0; j < len[s]; j++) rows[n++] = (ds_row){slot[s], j, toks[s][j], DS_ROW_DCTX, NULL};
        dr[s] = (ds_draft_req){slot[s], toks[s][len[s]], 1 + (s * 5) % gamma, samp[s].temp > 0.0f ? &samp[s] : NULL};
    }
    CHECK(ds_engine_forward(e, rows, n, NULL, err, sizeof err) == 0, "%s: prefill of %d sequences: %s", what, ns, err);
    int32_t *eids = malloc((size_t)ns * gamma * sizeof(int32_t)), rids[64];
    CHECK(ds_engine_draft(e, ns, dr, eids, err, sizeof err) == 0, "%s: engine draft of %d sequences: %s", what, ns, err);
    /* again: nothing a sequence holds changed, so the same drafts — on a
     * backend that records launch sequences, from the recorded passes */
    int32_t *again = malloc((size_t)ns * gamma * sizeof(int32_t));
    CHECK(ds_engine_draft(e, ns, dr, again, err, sizeof err) == 0, "%s: second engine draft: %s", what, err);
    int rep_bad = 0;
    for (int s = 0; s < ns; s++)
        rep_bad += memcmp(again + (size_t)s * gamma, eids + (size_t)s * gamma, (size_t)dr[s].n_keep * sizeof(int32_t)) != 0;
    CHECK(rep_bad == 0, "%s: %d sequences' drafts differ between two identical rounds (pass %d)", what, rep_bad, per);
    free(again);
    int n_layer = 0, row = 0;
    ds_drafter_kv_shape(d, &n_layer, &row);
    const size_t nf = (size_t)n_layer * (LMAX + 1) * (size_t)row;
    float *rk = malloc(nf * sizeof(float)), *rv = malloc(nf * sizeof(float));
    int bad = 0, sampled = 0;
    for (int s = 0; s < ns; s++) {
        ref_rows_samp(m, d, toks[s], len[s], rk, rv, rids, dr[s].n_keep, dr[s].samp);
        const int differ = memcmp(rids, eids + (size_t)s * gamma, (size_t)dr[s].n_keep * sizeof(int32_t)) != 0;
        if (differ) printf("  sequence %d (len %d, keep %d, temp %.1f) differs\n", s, len[s], dr[s].n_keep, (double)samp[s].temp);
        bad += differ;
        sampled += dr[s].samp != NULL;
        const ds_seq *q = ds_engine_seq(e, slot[s]);
        CHECK(q->n_past == len[s] && q->n_dctx == len[s], "%s: sequence %d changed (%d, %d rows; want %d)", what, s, q->n_past,
              q->n_dctx, len[s]);
    }
    CHECK(bad == 0, "%s: %d of %d sequences' drafts (batched passes) differ from ds_draft alone", what, bad, ns);
    if (!bad)
        printf("PASS %s draft_many sequences=%d per_pass=%d passes=%d sampled=%d keep=1..%d: every sequence's drafts == ds_draft alone, twice\n",
               what, ns, per, (ns + per - 1) / per, sampled, gamma);
    free(rows); free(eids); free(rk); free(rv);
    ds_engine_free(e);
}

static void test_draft_many(const char *what, const ds_model *m, const ds_drafter *d, int pass, int mixed) {
    test_draft_many_n(what, m, d, pass, mixed, 20);
}

static void test_rows(const ds_model *m, const ds_drafter *d) {
    char err[DS_ERRLEN];
    const int gamma = ds_drafter_block_size(d);
    int n_layer = 0, row = 0;
    ds_drafter_kv_shape(d, &n_layer, &row);
    enum { NS = 3 };
    static const int len[NS] = {150, 37, 90};
    static const int chunk[NS] = {64, 7, 1};
    int32_t toks[NS][200];
    uint64_t r = 17;
    for (int s = 0; s < NS; s++)
        for (int i = 0; i < 200; i++) {
            r ^= r << 13; r ^= r >> 7; r ^= r << 17;
            toks[s][i] = (int32_t)(r % (uint64_t)m->hp.n_vocab);
        }
    const size_t nf = (size_t)n_layer * 200 * (size_t)row;
    float *rk = malloc(nf * sizeof(float)), *rv = malloc(nf * sizeof(float));
    float *ek = malloc(nf * sizeof(float)), *ev = malloc(nf * sizeof(float));
    const ds_engine_params ep = {.n_seq_max = 4, .n_ctx = 512, .n_threads = 2, .drafter = d, .no_graphs = graphs_mode()};
    ds_engine *e = ds_engine_new(m, &ep, err, sizeof err);
    if (!e) { printf("FAIL engine with a drafter: %s\n", err); exit(1); }
    int slot[NS], done[NS] = {0};
    for (int s = 0; s < NS; s++) slot[s] = ds_engine_seq_new(e, err, sizeof err);
    /* prefill all three, interleaved: each step takes the next chunk of
     * every sequence that has one, in one forward */
    ds_row rows[256];
    for (;;) {
        int n = 0;
        for (int s = 0; s < NS; s++) {
            const int k = len[s] - done[s] < chunk[s] ? len[s] - done[s] : chunk[s];
            for (int j = 0; j < k; j++)
                rows[n++] = (ds_row){slot[s], done[s] + j, toks[s][done[s] + j], DS_ROW_DCTX, NULL};
            done[s] += k;
        }
        if (!n) break;
        if (ds_engine_forward(e, rows, n, NULL, err, sizeof err)) { printf("FAIL forward with drafter rows: %s\n", err); exit(1); }
    }
    int32_t eids[NS * 64], rids[64];
    ds_draft_req dr[NS];
    for (int s = 0; s < NS; s++) dr[s] = (ds_draft_req){slot[s], toks[s][len[s]], gamma, NULL};
    CHECK(ds_engine_draft(e, NS, dr, eids, err, sizeof err) == 0, "engine draft: %s", err);
    int bad_rows = 0, bad_ids = 0;
    for (int s = 0; s < NS; s++) {
        const ds_seq *q = ds_engine_seq(e, slot[s]);
        CHECK(q->n_dctx == len[s] && q->n_past == len[s], "sequence %d holds %d target and %d drafter rows, want %d", s,
              q->n_past, q->n_dctx, len[s]);
        ref_rows(m, d, toks[s], len[s], rk, rv, rids, gamma);
        ds_seq_read(q, ds_engine_pool(e), ds_engine_exec(e), 1, 0, len[s], ek, ev);
        const size_t bytes = (size_t)n_layer * len[s] * row * sizeof(float);
        bad_rows += memcmp(rk, ek, bytes) != 0 || memcmp(rv, ev, bytes) != 0;
        bad_ids += memcmp(rids, eids + (size_t)s * gamma, (size_t)gamma * sizeof(int32_t)) != 0;
    }
    CHECK(bad_rows == 0, "%d of %d sequences' drafter K/V rows differ from a drafter context of their own", bad_rows, NS);
    CHECK(bad_ids == 0, "%d of %d sequences' drafts differ from ds_draft alone", bad_ids, NS);
    if (!bad_rows && !bad_ids)
        printf("PASS drafter_in_engine sequences=%d chunks=64,7,1: drafter K/V rows and %d drafts == a drafter context alone\n",
               NS, gamma);
    /* queued drafts: the same rounds left on the device, a verify block of
     * every sequence whose draft rows (DS_ROW_DRAFTED) read them there —
     * their tokens are the drafts above, and every selection is the one
     * the same rows with the drafts given by the host make */
    {
        CHECK(ds_engine_draft_queue(e, NS, dr, err, sizeof err) == 0, "queued draft: %s", err);
        const int ell = gamma - 1;   /* fewer rows than drafts kept: a prefix of them */
        ds_row vr[NS * 64];
        int32_t qids[NS * 64], qtok[NS * 64], hids[NS * 64];
        int n = 0;
        for (int s = 0; s < NS; s++) {
            vr[n++] = (ds_row){slot[s], len[s], toks[s][len[s]], DS_ROW_SELECT | DS_ROW_DCTX, NULL};
            for (int k = 0; k < ell; k++) vr[n++] = (ds_row){slot[s], len[s] + 1 + k, -7, DS_ROW_SELECT | DS_ROW_DCTX | DS_ROW_DRAFTED, NULL};
        }
        for (int i = 0; i < n; i++) qtok[i] = -1;
        CHECK(ds_engine_forward(e, vr, n, &(ds_fwd_out){NULL, qids, qtok}, err, sizeof err) == 0, "verify of queued drafts: %s", err);
        int bad_tok = 0;
        for (int s = 0, i = 0; s < NS; s++, i += ell + 1)
            for (int k = 0; k < ell; k++) bad_tok += qtok[i + 1 + k] != eids[(size_t)s * gamma + k];
        for (int s = 0; s < NS; s++) CHECK(ds_engine_seq_truncate(e, slot[s], len[s], err, sizeof err) == 0, "truncate: %s", err);
        for (int s = 0, i = 0; s < NS; s++, i += ell + 1)
            for (int k = 0; k < ell; k++) {
                vr[i + 1 + k].token = eids[(size_t)s * gamma + k];
                vr[i + 1 + k].want &= (uint8_t)~DS_ROW_DRAFTED;
            }
        CHECK(ds_engine_forward(e, vr, n, &(ds_fwd_out){NULL, hids, NULL}, err, sizeof err) == 0, "verify of host drafts: %s", err);
        CHECK(bad_tok == 0, "%d queued draft rows did not carry the drafts", bad_tok);
        CHECK(!memcmp(qids, hids, (size_t)n * sizeof *qids), "a verify of queued drafts selects other ids than the same drafts from the host");
        if (!bad_tok && !memcmp(qids, hids, (size_t)n * sizeof *qids))
            printf("PASS queued_drafts sequences=%d rows=%d: DRAFTED rows carry the drafts, selections == the host-given drafts'\n", NS, n);
        for (int s = 0; s < NS; s++) CHECK(ds_engine_seq_truncate(e, slot[s], len[s], err, sizeof err) == 0, "truncate: %s", err);
        /* refusals: the anchor was truncated away (its drafts with it); a
         * DRAFTED row with no row of its sequence before it */
        vr[0] = (ds_row){slot[0], len[0], toks[0][len[0]], DS_ROW_SELECT, NULL};
        vr[1] = (ds_row){slot[0], len[0] + 1, 0, DS_ROW_SELECT | DS_ROW_DRAFTED, NULL};
        CHECK(ds_engine_forward(e, vr, 2, &(ds_fwd_out){NULL, qids, qtok}, err, sizeof err) != 0 && strstr(err, "no queued draft"),
              "a DRAFTED row after its drafts were truncated away was accepted (%s)", err);
        CHECK(ds_engine_draft_queue(e, 1, dr, err, sizeof err) == 0, "queued draft: %s", err);
        CHECK(ds_engine_forward(e, vr + 1, 1, &(ds_fwd_out){NULL, qids, qtok}, err, sizeof err) != 0 && strstr(err, "no queued draft"),
              "a DRAFTED row without its anchor was accepted (%s)", err);
    }
    /* refusals: DCTX rows with a gap; drafting a sequence whose drafter rows lag */
    rows[0] = (ds_row){slot[1], len[1], 5, 0, NULL};
    CHECK(ds_engine_forward(e, rows, 1, NULL, err, sizeof err) == 0, "plain row: %s", err);
    dr[0] = (ds_draft_req){slot[1], 5, gamma, NULL};
    CHECK(ds_engine_draft(e, 1, dr, eids, err, sizeof err) != 0 && strstr(err, "drafter context rows"),
          "a lagging drafter context was drafted (%s)", err);
    rows[0] = (ds_row){slot[1], len[1] + 1, 5, DS_ROW_DCTX, NULL};
    CHECK(ds_engine_forward(e, rows, 1, NULL, err, sizeof err) != 0 && strstr(err, "drafter context holds"),
          "drafter rows past a gap were accepted (%s)", err);
    ds_engine_free(e);
    /* and an engine without a drafter refuses DCTX rows */
    const ds_engine_params ep0 = {.n_seq_max = 1, .n_ctx = 64, .n_threads = 1};
    e = ds_engine_new(m, &ep0, err, sizeof err);
    const int s0 = e ? ds_engine_seq_new(e, err, sizeof err) : -1;
    rows[0] = (ds_row){s0, 0, 1, DS_ROW_DCTX, NULL};
    CHECK(e && ds_engine_forward(e, rows, 1, NULL, err, sizeof err) != 0 && strstr(err, "no drafter"),
          "DCTX rows without a drafter were accepted (%s)", err);
    ds_engine_free(e);
    /* counter-test: with the fast kernels the batched drafter rows (the
     * longest sequence, prefilled in 64-row chunks beside another) are not
     * the rows of the sequence alone — the comparison above can fail */
    {
        const ds_engine_params epf = {.n_seq_max = 2, .n_ctx = 512, .n_threads = 2, .drafter = d};
        ds_engine *ef = ds_engine_new(m, &epf, err, sizeof err);
        if (!ef) { printf("FAIL fast engine: %s\n", err); exit(1); }
        ds_kernel_set ks;
        ds_kernel_set_all(&ks, DS_FAST);
        ds_engine_set_kernels(ef, &ks);
        const int a = ds_engine_seq_new(ef, err, sizeof err), b = ds_engine_seq_new(ef, err, sizeof err);
        int n = 0;
        for (int j = 0; j < 64; j++) rows[n++] = (ds_row){a, j, toks[0][j], DS_ROW_DCTX, NULL};
        for (int j = 0; j < 7; j++) rows[n++] = (ds_row){b, j, toks[1][j], DS_ROW_DCTX, NULL};
        CHECK(ds_engine_forward(ef, rows, n, NULL, err, sizeof err) == 0, "fast forward: %s", err);
        ref_rows(m, d, toks[0], 64, rk, rv, rids, gamma);
        ds_seq_read(ds_engine_seq(ef, a), ds_engine_pool(ef), ds_engine_exec(ef), 1, 0, 64, ek, ev);
        const size_t bytes = (size_t)n_layer * 64 * row * sizeof(float);
        const int differ = memcmp(rk, ek, bytes) != 0 || memcmp(rv, ev, bytes) != 0;
        CHECK(differ, "counter-test: with --kernels fast the batched drafter rows still equal the canonical ones alone");
        if (differ) printf("PASS counter_test kernels=fast: batched drafter rows differ from the sequence alone\n");
        ds_engine_free(ef);
    }
    free(rk); free(rv); free(ek); free(ev);
}

/* ---- 2. the scheduler ------------------------------------------------------ */

typedef struct {
    int32_t prompt[300];
    int n_prompt, spec, draft_max;
    ds_sampler samp;
    int32_t ref[NPRED];
    int n_ref;
    int32_t got[NPRED + 4];
    int n_got, done;
    ds_req_result res;
} req;

static int on_tok(void *u, int32_t t) {
    req *q = u;
    if (q->n_got < NPRED + 4) q->got[q->n_got] = t;
    q->n_got++;
    return 0;
}
static void on_done(void *u, const ds_req_result *r) {
    req *q = u;
    q->done++;
    q->res = *r;
}

typedef struct { long steps, rounds, drafted, accepted, preempt, cached; } run_stats;

static int run_n(const ds_model *m, const ds_drafter *d, req *rq, int n, int n_pages, int max_rows, int prefix, int stagger,
                 int force_plain, int policy, int n_seq, run_stats *rs) {
    char err[DS_ERRLEN];
    const ds_engine_params ep = {.n_seq_max = n_seq, .n_ctx = 512, .n_pages = n_pages, .n_threads = 2, .drafter = d, .no_graphs = graphs_mode()};
    ds_engine *e = ds_engine_new(m, &ep, err, sizeof err);
    const ds_sched_params sp = {.max_rows = max_rows, .prefill_chunk = max_rows / 2, .prefix_cache = prefix,
                                .spec_policy = policy};
    ds_sched *s = e ? ds_sched_new(e, &sp, err, sizeof err) : NULL;
    if (!s) { printf("FAIL scheduler: %s\n", err); exit(1); }
    int submitted = 0;
    long steps = 0;
    for (int i = 0; i < n; i++) { rq[i].n_got = 0; rq[i].done = 0; }
    for (;;) {
        while (submitted < n && (!stagger || steps % 4 == 0 || submitted < 2)) {
            req *q = &rq[submitted];
            const ds_req_params p = {.prompt = q->prompt, .n_prompt = q->n_prompt, .n_predict = NPRED, .samp = q->samp,
                                     .stop_at_eog = 1, .on_token = on_tok, .on_done = on_done, .user = q,
                                     .speculative = q->spec && !force_plain, .draft_max = q->draft_max};
            if (ds_sched_submit(s, &p, err, sizeof err) < 0) { printf("FAIL submit: %s\n", err); exit(1); }
            submitted++;
            if (stagger) break;
        }
        const int rc = ds_sched_step(s, err, sizeof err);
        if (rc < 0) { printf("FAIL step: %s\n", err); exit(1); }
        steps += rc;
        if (!rc && submitted == n) break;
        if (steps > 100000) { printf("FAIL the scheduler does not finish\n"); exit(1); }
    }
    int bad = 0;
    for (int i = 0; i < n; i++) {
        req *q = &rq[i];
        const int same = q->done == 1 && q->n_got == q->n_ref && !memcmp(q->got, q->ref, (size_t)q->n_ref * sizeof(int32_t));
        if (!same && bad < 3)
            printf("  request %d (spec %d, temp %.1f): %d tokens, reference %d, done %d\n", i, q->spec, (double)q->samp.temp,
                   q->n_got, q->n_ref, q->done);
        bad += !same;
    }
    ds_sched_stats st;
    ds_sched_get_stats(s, &st);
    *rs = (run_stats){steps, st.spec_rounds, st.drafted, st.accepted, st.preemptions, st.cached_tokens};
    CHECK(st.pages_free == st.pages_total, "pages leaked: %d of %d free", st.pages_free, st.pages_total);
    ds_sched_free(s);
    ds_engine_free(e);
    return bad;
}

static int run(const ds_model *m, const ds_drafter *d, req *rq, int n, int n_pages, int max_rows, int prefix, int stagger,
               int force_plain, int policy, run_stats *rs) {
    return run_n(m, d, rq, n, n_pages, max_rows, prefix, stagger, force_plain, policy, 6, rs);
}

static void make_reqs(const ds_model *m, req *rq, int n, const int32_t *text, int n_text) {
    char err[DS_ERRLEN];
    ds_ctx *c = ds_ctx_new(m, 512, 1, err, sizeof err);
    if (!c) { printf("FAIL context: %s\n", err); exit(1); }
    for (int i = 0; i < n; i++) {
        req *q = &rq[i];
        memset(q, 0, sizeof *q);
        /* prompts: windows of the text, every third sharing a long prefix */
        const int off = i % 3 == 0 ? 0 : (i * 37) % (n_text - 120);
        q->n_prompt = i % 3 == 0 ? 60 + i : 8 + (i * 13) % 90;
        if (q->n_prompt > n_text - off) q->n_prompt = n_text - off;
        memcpy(q->prompt, text + off, (size_t)q->n_prompt * sizeof(int32_t));
        q->spec = i % 4 != 3;                       /* a plain request among them */
        q->draft_max = i % 5 == 1 ? 2 : 0;
        q->samp.temp = i % 2 ? 0.8f : 0.0f;
        q->samp.top_p = 1.0f;
        q->samp.seed = 1000 + (uint64_t)i;
        ds_gen_opts go = {NPRED, DS_PREFILL_BATCH, 1, NULL, NULL};
        ds_gen_stats gs;
        if (ds_generate(c, q->prompt, q->n_prompt, &go, &q->samp, q->ref, &gs, err, sizeof err)) {
            printf("FAIL reference: %s\n", err);
            exit(1);
        }
        q->n_ref = gs.n_gen;
    }
    ds_ctx_free(c);
}

static void test_sched(const char *what, const ds_model *m, const ds_drafter *d, const int32_t *text, int n_text,
                       int want_accepts) {
    const int hybrid = m->hp.n_rec > 0;   /* no prefix reuse: the pages lack the recurrent state */
    static req rq[NREQ];
    make_reqs(m, rq, NREQ, text, n_text);
    struct { int pages, rows, prefix, stagger, policy; const char *what; } cases[] = {
        {0, 512, 0, 0, DS_SPEC_FIXED, "all at once"},
        {0, 40, 0, 1, DS_SPEC_FIXED, "staggered, 40-row budget (blocks and prompts cut)"},
        {0, 96, 1, 1, DS_SPEC_FIXED, "prefix cache"},
        {20, 96, 1, 1, DS_SPEC_FIXED, "20 pages: preemption"},
        {0, 96, 0, 1, DS_SPEC_AUTO, "auto caps (measured)"},
    };
    run_stats plain;
    CHECK(run(m, d, rq, NREQ, 0, 512, 0, 0, 1, DS_SPEC_FIXED, &plain) == 0, "%s: plain through the scheduler differs", what);
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        run_stats st;
        const int bad = run(m, d, rq, NREQ, cases[k].pages, cases[k].rows, cases[k].prefix, cases[k].stagger, 0,
                            cases[k].policy, &st);
        CHECK(bad == 0, "%s %s: %d of %d requests differ from plain generation alone", what, cases[k].what, bad, NREQ);
        CHECK(st.rounds > 0 && st.drafted > 0, "%s %s: no speculative rounds ran", what, cases[k].what);
        if (cases[k].prefix && !hybrid) CHECK(st.cached > 0, "%s %s: the prefix cache reused nothing", what, cases[k].what);
        if (cases[k].prefix && hybrid) CHECK(st.cached == 0, "%s %s: a hybrid model reused %ld cached tokens", what, cases[k].what, st.cached);
        if (cases[k].pages) CHECK(st.preempt > 0, "%s %s: nothing was preempted", what, cases[k].what);
        if (want_accepts && k == 0)
            CHECK(st.accepted > 0 && st.steps < plain.steps, "%s: %ld drafts accepted, %ld steps vs plain's %ld", what,
                  st.accepted, st.steps, plain.steps);
        if (!bad)
            printf("PASS spec_batch %s %s: %d requests == plain alone (steps %ld vs plain %ld, rounds %ld, accepted %ld/%ld, "
                   "preemptions %ld, cached %ld)\n",
                   what, cases[k].what, NREQ, st.steps, plain.steps, st.rounds, st.accepted, st.drafted, st.preempt, st.cached);
    }
}

/* N in {1, 2, 3, 8} speculative requests of different prompts, greedy and
 * seeded alternating, all at once on an engine of N slots: every step
 * drafts all of them in one ds_engine_draft call (one batched drafter
 * forward per pass) and verifies all blocks in one target forward. Each
 * request's tokens are exactly plain generation alone (ds_generate), and
 * its rounds, drafts verified and drafts accepted are exactly those of the
 * same request run alone through the scheduler (a wrong draft id would be
 * rejected by the verify and leave the tokens right: the counts catch it).
 * rounds > steps shows several sequences' rounds shared a step. */
static void test_sched_alone(const char *what, const ds_model *m, const ds_drafter *d, const int32_t *text, int n_text,
                             int want_accepts) {
    static req rq[8];
    static const int ns[] = {1, 2, 3, 8};
    for (size_t k = 0; k < sizeof ns / sizeof ns[0]; k++) {
        const int n = ns[k];
        make_reqs(m, rq, n, text, n_text);
        ds_req_result alone[8];
        run_stats st;
        for (int i = 0; i < n; i++) {
            rq[i].spec = 1;
            CHECK(run_n(m, d, &rq[i], 1, 0, 512, 0, 0, 0, DS_SPEC_FIXED, 1, &st) == 0, "%s request %d alone differs", what, i);
            alone[i] = rq[i].res;
        }
        const int bad = run_n(m, d, rq, n, 0, 512, 0, 0, 0, DS_SPEC_FIXED, n, &st);
        int moved = 0;
        for (int i = 0; i < n; i++) {
            const ds_req_result *a = &alone[i], *b = &rq[i].res;
            const int differ = a->rounds != b->rounds || a->drafted != b->drafted || a->accepted != b->accepted;
            if (differ)
                printf("  request %d: rounds/drafted/accepted %d/%d/%d among %d, %d/%d/%d alone\n", i, b->rounds, b->drafted,
                       b->accepted, n, a->rounds, a->drafted, a->accepted);
            moved += differ;
        }
        CHECK(moved == 0, "%s %d speculative at once: %d requests' rounds or accepted drafts differ from the request alone", what,
              n, moved);
        CHECK(bad == 0, "%s %d speculative at once: %d of %d requests differ from plain generation alone", what, n, bad, n);
        CHECK(st.rounds > 0 && st.drafted > 0, "%s %d speculative at once: no speculative rounds ran", what, n);
        if (n > 1) CHECK(st.rounds > st.steps, "%s %d speculative at once: %ld rounds in %ld steps (never batched)", what, n,
                         st.rounds, st.steps);
        if (want_accepts) CHECK(st.accepted > 0, "%s %d speculative at once: no draft accepted", what, n);
        if (!bad && !moved)
            printf("PASS spec_batch %s %d speculative at once: every request's tokens == plain alone, its rounds and accepted drafts "
                   "== it alone (steps %ld, rounds %ld, accepted %ld/%ld)\n",
                   what, n, st.steps, st.rounds, st.accepted, st.drafted);
    }
}

int main(void) {
    char err[DS_ERRLEN], dir[256];
    tu_tmpdir(dir, sizeof dir);
    /* the shipped pair: a trained drafter, real acceptance */
    ds_model *m = ds_model_load_on(tu_shipped_target(), tu_device(), err, sizeof err);
    ds_drafter *d = m ? ds_drafter_load("models/dspark-tiny-drafter-f16.gguf", m, err, sizeof err) : NULL;
    if (!d) { printf("FAIL load the shipped pair: %s\n", err); return 1; }
    static const char txt[] =
        "The package provides a library and a command line tool. The library reads the configuration file at start "
        "and writes its log to the standard error stream. If the file does not exist, the default settings are used. "
        "See the manual page for the list of options and the format of the configuration file. Bugs should be "
        "reported to the maintainer of the package with the output of the version command.";
    int32_t *tv = NULL, text[400];
    size_t nt = 0;
    if (ds_tokenize(m->tok, txt, sizeof txt - 1, 1, &tv, &nt, err, sizeof err) || nt < 80) {
        printf("FAIL tokenize: %zu tokens %s\n", nt, err);
        return 1;
    }
    const int n_text = nt < 400 ? (int)nt : 400;
    memcpy(text, tv, (size_t)n_text * sizeof(int32_t));
    free(tv);
    test_rows(m, d);
    test_draft_many("shipped", m, d, 0, 1);
    test_draft_many("shipped", m, d, 3, 0);   /* all greedy: recorded passes, one chain launch per pass on a device */
    test_draft_many("shipped", m, d, 0, 0);
    static const int ns[] = {1, 2, 3, 8};     /* each in one pass */
    for (size_t k = 0; k < sizeof ns / sizeof ns[0]; k++) test_draft_many_n("shipped", m, d, 0, 1, ns[k]);
    test_sched_alone("shipped", m, d, text, n_text, 1);
    test_sched("shipped", m, d, text, n_text, 1);
    /* refusal: draft_max past the block */
    {
        const ds_engine_params ep = {.n_seq_max = 1, .n_ctx = 128, .n_threads = 1, .drafter = d};
        ds_engine *e = ds_engine_new(m, &ep, err, sizeof err);
        const ds_sched_params sp = {0};
        ds_sched *s = e ? ds_sched_new(e, &sp, err, sizeof err) : NULL;
        const ds_req_params p = {.prompt = text, .n_prompt = 4, .n_predict = 4, .speculative = 1,
                                 .draft_max = ds_drafter_block_size(d) + 1};
        CHECK(s && ds_sched_submit(s, &p, err, sizeof err) < 0 && strstr(err, "draft_max"), "draft_max past the block was taken");
        ds_sched_free(s);
        ds_engine_free(e);
    }
    ds_drafter_free(d);
    ds_model_free(m);
    /* a made Q8_0 target and its random drafter: drafts are mostly rejected */
    {
        char path[600];
        snprintf(path, sizeof path, "%s/t.gguf", dir);
        ds_make_model_opts o;
        ds_make_model_defaults(&o);
        o.arch = "qwen3"; o.type = DS_TYPE_Q8_0;
        o.n_embd = 64; o.n_layer = 2; o.n_head = 4; o.n_head_kv = 2; o.head_dim = 16; o.n_ff = 128;
        o.n_vocab = 300; o.n_ctx = 512; o.seed = 5;
        if (ds_make_model(&o, path, err, sizeof err) || !(m = ds_model_load_on(path, tu_device(), err, sizeof err))) {
            printf("FAIL make target: %s\n", err);
            return 1;
        }
        char dpath[600];
        snprintf(dpath, sizeof dpath, "%s/d.gguf", dir);
        ds_make_drafter_opts dopt;
        ds_make_drafter_defaults(&dopt);
        dopt.block_size = 4;
        dopt.type = DS_TYPE_Q8_0;
        if (ds_make_drafter(&dopt, m, dpath, err, sizeof err) || !(d = ds_drafter_load(dpath, m, err, sizeof err))) {
            printf("FAIL make drafter: %s\n", err);
            return 1;
        }
        int32_t t2[300];
        for (int i = 0; i < 300; i++) t2[i] = (int32_t)((i * 71 + 3) % 300);
        test_rows(m, d);
        test_draft_many("made-q8_0", m, d, 0, 1);
        test_sched_alone("made-q8_0", m, d, t2, 300, 0);
        test_sched("made-q8_0", m, d, t2, 300, 0);
        ds_drafter_free(d);
        /* every head the batched passes run op by op: gated and rnn Markov
         * heads, a correction head */
        static const struct { const char *markov; int corr; } heads[] = {{"gated", 0}, {"rnn", 0}, {"vanilla", 32}};
        for (size_t h = 0; h < sizeof heads / sizeof heads[0]; h++) {
            dopt.markov = heads[h].markov;
            dopt.correction = heads[h].corr;
            char what[64];
            snprintf(what, sizeof what, "made-%s%s", heads[h].markov, heads[h].corr ? "-corr" : "");
            if (ds_make_drafter(&dopt, m, dpath, err, sizeof err) || !(d = ds_drafter_load(dpath, m, err, sizeof err))) {
                printf("FAIL make drafter %s: %s\n", what, err);
                return 1;
            }
            test_draft_many(what, m, d, 0, 1);
            ds_drafter_free(d);
        }
        ds_model_free(m);
        /* the hybrid (qwen35): verify blocks of several sequences in one
         * step, each rejected row's recurrent state rolled back in the
         * engine's per-slot rings */
        if (!strcmp(tu_device(), "cpu")) {
            o.arch = "qwen35"; o.n_embd = 64; o.head_dim = 16; o.ssm_d_state = 16; o.full_attn_interval = 2;
            snprintf(path, sizeof path, "%s/h.gguf", dir);
            if (ds_make_model(&o, path, err, sizeof err) || !(m = ds_model_load_on(path, tu_device(), err, sizeof err))) {
                printf("FAIL make qwen35 target: %s\n", err);
                return 1;
            }
            snprintf(dpath, sizeof dpath, "%s/hd.gguf", dir);
            if (ds_make_drafter(&dopt, m, dpath, err, sizeof err) || !(d = ds_drafter_load(dpath, m, err, sizeof err))) {
                printf("FAIL make qwen35 drafter: %s\n", err);
                return 1;
            }
            test_rows(m, d);
            test_sched("made-qwen35", m, d, t2, 300, 0);
            ds_drafter_free(d);
            ds_model_free(m);
        }
    }
    tu_rmdir(dir);
    return tu_finish("test_spec_batch");
}
