/* test_sched_lproc.c — requests with logits processors (lproc.h: logprob
 * capture and top_logprobs, logit_bias, presence / frequency penalties, a
 * GBNF grammar) and sampler settings (temperature, top_k, top_p, min_p,
 * seed) of their own, all running at once through the scheduler, each get
 * exactly what one context's plain generation gives them alone
 * (ds_generate_ex with the same chain as its hook): the same token ids and
 * the same captured logprob and top list bits, memcmp-equal. Requests
 * without a processor share the steps (their rows keep the device-side
 * selection). Schedules: everything at once; staggered arrivals under a
 * small row budget with the prefix cache (prompts share a prefix, so hits
 * happen); a pool small enough to preempt (recompute) processor requests.
 * Counter-tests: the processors act (a banned token never appears and the
 * output differs from the unprocessed one; the grammar's output is JSON-
 * shaped), and a processor that fails ends its request alone with stop
 * "error" while the others finish. */
#include "scheduler.h"
#include "generate.h"
#include "grammar.h"
#include "lproc.h"
#include "testutil.h"

#include <math.h>

#define NREQ 10
#define NGEN 20

typedef struct {
    int32_t id[NGEN + 2];
    float   lp[NGEN + 2];
    int     n_top[NGEN + 2];
    int32_t top_id[NGEN + 2][DS_LPROC_TOP_MAX];
    float   top_lp[NGEN + 2][DS_LPROC_TOP_MAX];
    int     n;
} trace;

typedef struct {
    int32_t prompt[400];
    int     n_prompt;
    ds_sampler samp;
    ds_lchain_cfg cfg;
    int     use_lp;
    int32_t bias_id[2];
    float   bias[2];
    trace   ref, got;
    const char *ref_stop;
    ds_lchain *chain;            /* the live run's chain                  */
    int     done;
    ds_req_result res;
} req;

static void record(trace *t, const ds_lchain *c, int64_t pos, int32_t tok) {
    if (t->n >= NGEN + 2) { t->n++; return; }
    const int i = t->n++;
    t->id[i] = tok;
    t->lp[i] = 0.0f;
    t->n_top[i] = 0;
    const int32_t *ti = NULL;
    const float *tl = NULL;
    if (c && ds_lchain_captured(c, pos, &t->lp[i], &t->n_top[i], &ti, &tl))
        for (int k = 0; k < t->n_top[i]; k++) { t->top_id[i][k] = ti[k]; t->top_lp[i][k] = tl[k]; }
    else
        t->lp[i] = -1.0f;
}

static int traces_equal(const trace *a, const trace *b) {
    if (a->n != b->n) return 0;
    for (int i = 0; i < a->n && i < NGEN + 2; i++)
        if (a->id[i] != b->id[i] || memcmp(&a->lp[i], &b->lp[i], sizeof(float)) || a->n_top[i] != b->n_top[i] ||
            memcmp(a->top_id[i], b->top_id[i], (size_t)a->n_top[i] * sizeof(int32_t)) ||
            memcmp(a->top_lp[i], b->top_lp[i], (size_t)a->n_top[i] * sizeof(float)))
            return 0;
    return 1;
}

/* the reference: one context, the request alone */
typedef struct { req *q; trace *t; } ref_cb;
static void ref_tok(void *u, int32_t t) {
    ref_cb *c = u;
    record(c->t, c->q->chain, (int64_t)c->q->n_prompt + c->t->n, t);
}

static ds_lchain *new_chain(req *q, int V) {
    if (!q->use_lp) return NULL;
    char err[DS_ERRLEN];
    ds_lchain *c = ds_lchain_new(&q->cfg, V, err, sizeof err);
    if (!c) { printf("FAIL chain: %s\n", err); exit(1); }
    return c;
}

static int sch_tok(void *u, int32_t t) {
    req *q = u;
    record(&q->got, q->chain, (int64_t)q->n_prompt + q->got.n, t);
    return 0;
}
static void sch_done(void *u, const ds_req_result *r) {
    req *q = u;
    q->done++;
    q->res = *r;
}

/* All requests through one scheduler; the number that differ from alone. */
static int run(const ds_model *m, req *rq, int n, int n_pages, int max_rows, int prefix, int stagger, long *pre, long *hit) {
    char err[DS_ERRLEN];
    const ds_engine_params ep = {.n_seq_max = 6, .n_ctx = 512, .n_pages = n_pages, .n_threads = 2};
    ds_engine *e = ds_engine_new(m, &ep, err, sizeof err);
    const ds_sched_params sp = {.max_rows = max_rows, .prefill_chunk = max_rows / 2, .prefix_cache = prefix};
    ds_sched *s = e ? ds_sched_new(e, &sp, err, sizeof err) : NULL;
    if (!s) { printf("FAIL scheduler: %s\n", err); exit(1); }
    for (int i = 0; i < n; i++) {
        memset(&rq[i].got, 0, sizeof rq[i].got);
        rq[i].done = 0;
        rq[i].chain = new_chain(&rq[i], m->hp.n_vocab);
    }
    int submitted = 0, steps = 0;
    for (;;) {
        while (submitted < n && (!stagger || steps % 2 == 0)) {
            req *q = &rq[submitted];
            const ds_req_params p = {.prompt = q->prompt, .n_prompt = q->n_prompt, .n_predict = NGEN, .samp = q->samp,
                                     .stop_at_eog = 1, .on_token = sch_tok, .on_done = sch_done, .user = q,
                                     .lp = q->chain ? ds_lchain_proc(q->chain) : NULL};
            if (ds_sched_submit(s, &p, err, sizeof err) < 0) { printf("FAIL submit: %s\n", err); exit(1); }
            submitted++;
            if (stagger) break;
        }
        const int rc = ds_sched_step(s, err, sizeof err);
        if (rc < 0) { printf("FAIL step: %s\n", err); exit(1); }
        steps++;
        if (rc == 0 && submitted == n) break;
    }
    int bad = 0;
    for (int i = 0; i < n; i++) {
        req *q = &rq[i];
        if (q->done != 1 || !traces_equal(&q->got, &q->ref) || strcmp(q->res.stop, q->ref_stop)) {
            printf("  request %d: %d tokens (stop %s) vs %d alone (stop %s)\n", i, q->got.n, q->done ? q->res.stop : "-",
                   q->ref.n, q->ref_stop);
            bad++;
        }
        ds_lchain_free(q->chain);
        q->chain = NULL;
    }
    ds_sched_stats st;
    ds_sched_get_stats(s, &st);
    *pre = st.preemptions;
    *hit = st.cached_tokens;
    CHECK(st.pages_free == st.pages_total, "pages leaked: %d of %d free", st.pages_free, st.pages_total);
    ds_sched_free(s);
    ds_engine_free(e);
    return bad;
}

/* a processor that fails at its third row */
typedef struct { int calls; } failing;
static int fail_apply(void *u, int64_t pos, const int32_t *x, int nx, float *lg, int V) {
    failing *f = u;
    return ++f->calls >= 3 ? -1 : 0;
}

int main(void) {
    char err[DS_ERRLEN];
    ds_model *m = ds_model_load(tu_shipped_target(), err, sizeof err);
    if (!m) { printf("FAIL load: %s\n", err); return 1; }
    const int V = m->hp.n_vocab;
    ds_grammar *g = ds_grammar_new(ds_grammar_json_object, strlen(ds_grammar_json_object), m->tok, err, sizeof err);
    if (!g) { printf("FAIL grammar: %s\n", err); return 1; }
    static const char *texts[] = {
        "The river flows through the valley and the town beside it",
        "Once upon a time",
        "def main():\n    print(",
        "A list of colors: red, green,",
    };
    const char *shared = "In the beginning the story was told again and again by the people of the hills, who kept it "
                         "through the long winters, and every telling added a little more to it until nobody knew the "
                         "first words any more. ";
    static req rq[NREQ];
    for (int i = 0; i < NREQ; i++) {
        req *q = &rq[i];
        memset(q, 0, sizeof *q);
        char text[1024];
        snprintf(text, sizeof text, "%s%s", i % 3 == 0 ? shared : "", texts[i % 4]);
        int32_t *ids = NULL;
        size_t n_ids = 0;
        if (ds_tokenize(m->tok, text, strlen(text), 0, &ids, &n_ids, err, sizeof err) || n_ids < 1 || n_ids > 400) {
            printf("FAIL tokenize: %s\n", err);
            return 1;
        }
        memcpy(q->prompt, ids, n_ids * sizeof *ids);
        q->n_prompt = (int)n_ids;
        free(ids);
        q->samp = (ds_sampler){.temp = 0.0f, .top_p = 1.0f, .seed = 1000 + (uint64_t)i};
        q->use_lp = 1;
        q->cfg.top_n = 0;
        switch (i) {
        case 0: q->cfg.capture = 1; q->cfg.top_n = 5; break;                                  /* greedy, top 5 */
        case 1: q->samp.temp = 0.8f; q->samp.top_k = 40; q->cfg.capture = 1; break;            /* seeded, logprobs */
        case 2: q->cfg.n_bias = 2; break;                                                       /* greedy, bias */
        case 3: q->samp.temp = 1.0f; q->samp.top_p = 0.9f; q->cfg.presence = 0.5f; q->cfg.frequency = 0.8f; break;
        case 4: q->cfg.grammar = g; q->cfg.capture = 1; q->cfg.top_n = 2; break;               /* greedy, grammar */
        case 5:                                                                                 /* everything */
            q->samp.temp = 0.9f; q->samp.min_p = 0.05f; q->samp.top_k = 100;
            q->cfg.presence = -0.4f; q->cfg.frequency = 1.2f; q->cfg.n_bias = 2; q->cfg.grammar = g;
            q->cfg.capture = 1; q->cfg.top_n = 20;
            break;
        case 6: q->use_lp = 0; break;                                                           /* greedy, device */
        case 7: q->use_lp = 0; q->samp.temp = 0.7f; break;                                      /* seeded, device */
        case 8: q->samp.temp = 1.3f; q->cfg.frequency = 2.0f; q->cfg.capture = 1; q->cfg.top_n = 3; break;
        default: q->samp.temp = 0.5f; q->samp.top_p = 0.5f; q->cfg.presence = 2.0f; break;
        }
        q->cfg.bias_id = q->bias_id;
        q->cfg.bias = q->bias;
    }
    /* the reference of each request alone; the bias bans request 2's
     * unprocessed greedy choices (found on the fly) */
    ds_ctx *c = ds_ctx_new(m, 512, 1, err, sizeof err);
    if (!c) { printf("FAIL ctx: %s\n", err); return 1; }
    trace plain2 = {0};
    for (int i = 0; i < NREQ; i++) {
        req *q = &rq[i];
        if (i == 2 || i == 5) {
            /* ban the first token plain greedy picks, and favour another */
            ds_gen_opts go = {NGEN, DS_PREFILL_BATCH, 1, NULL, NULL};
            ds_gen_stats gs;
            int32_t out[NGEN];
            if (ds_generate(c, q->prompt, q->n_prompt, &go, NULL, out, &gs, err, sizeof err)) { printf("FAIL plain: %s\n", err); return 1; }
            q->bias_id[0] = out[0]; q->bias[0] = -INFINITY;
            q->bias_id[1] = (out[0] + 17) % V; q->bias[1] = 3.0f;
            if (i == 2) { plain2.n = gs.n_gen; memcpy(plain2.id, out, (size_t)gs.n_gen * sizeof(int32_t)); }
        }
        q->chain = new_chain(q, V);
        ref_cb rc = {q, &q->ref};
        ds_gen_opts go = {NGEN, DS_PREFILL_BATCH, 1, ref_tok, &rc};
        const ds_gen_hooks h = {q->chain ? ds_lchain_proc(q->chain) : NULL, NULL, NULL};
        int32_t out[NGEN];
        ds_gen_stats gs;
        if (ds_generate_ex(c, q->prompt, q->n_prompt, &go, &q->samp, &h, out, &gs, err, sizeof err)) {
            printf("FAIL reference %d: %s\n", i, err);
            return 1;
        }
        q->ref_stop = gs.stop;
        ds_lchain_free(q->chain);
        q->chain = NULL;
    }
    ds_ctx_free(c);
    /* the processors act */
    {
        int banned = 0, differs = plain2.n != rq[2].ref.n;
        for (int k = 0; k < rq[2].ref.n && k < NGEN; k++) {
            banned |= rq[2].ref.id[k] == rq[2].bias_id[0];
            differs |= k < plain2.n && plain2.id[k] != rq[2].ref.id[k];
        }
        CHECK(!banned && differs, "logit_bias: banned token appears %d, output differs from plain %d", banned, differs);
        char txt[512];
        int len = 0;
        for (int k = 0; k < rq[4].ref.n && k < NGEN; k++) {
            const int b = ds_token_to_bytes(m->tok, rq[4].ref.id[k], txt + len, sizeof txt - (size_t)len - 1);
            if (b > 0 && len + b < (int)sizeof txt - 1) len += b;
        }
        txt[len] = 0;
        CHECK(len > 0 && txt[strspn(txt, " \n\t")] == '{', "grammar: the output '%s' does not start an object", txt);
        CHECK(rq[0].ref.n_top[0] == 5 && rq[5].ref.n_top[0] == 20 && rq[1].ref.lp[0] < 0.0f, "captures: top 5, top 20, a logprob");
        PASS("the processors act: a banned token never appears, the grammar gives JSON, captures hold");
    }
    struct { int pages, rows, prefix, stagger; const char *what; } cases[] = {
        {0, 512, 0, 0, "all at once"},
        {0, 40, 1, 1, "staggered arrivals, 40-row budget, prefix cache"},
        {12, 64, 1, 0, "12 pages: preemption"},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        long pre = 0, hit = 0;
        const int bad = run(m, rq, NREQ, cases[k].pages, cases[k].rows, cases[k].prefix, cases[k].stagger, &pre, &hit);
        CHECK(bad == 0, "%s: %d of %d requests differ from one context alone", cases[k].what, bad, NREQ);
        if (k == 1) CHECK(hit > 0, "the prefix cache reused nothing");
        if (k == 2) CHECK(pre > 0, "nothing was preempted");
        if (!bad)
            printf("PASS processors, %s: %d requests (tokens, logprobs, top lists) == alone (preemptions %ld, cached %ld)\n",
                   cases[k].what, NREQ, pre, hit);
    }
    /* a failing processor ends its own request only */
    {
        const ds_engine_params ep = {.n_seq_max = 3, .n_ctx = 512, .n_threads = 1};
        ds_engine *e = ds_engine_new(m, &ep, err, sizeof err);
        const ds_sched_params sp = {.max_rows = 64};
        ds_sched *s = ds_sched_new(e, &sp, err, sizeof err);
        failing f = {0};
        const ds_lproc bad = {fail_apply, NULL, NULL, &f};
        for (int i = 0; i < 3; i++) {
            memset(&rq[i].got, 0, sizeof rq[i].got);
            rq[i].done = 0;
            rq[i].chain = NULL;
            const ds_req_params p = {.prompt = rq[i].prompt, .n_prompt = rq[i].n_prompt, .n_predict = NGEN, .samp = rq[i].samp,
                                     .stop_at_eog = 0, .on_token = sch_tok, .on_done = sch_done, .user = &rq[i],
                                     .lp = i == 1 ? &bad : NULL};
            ds_sched_submit(s, &p, err, sizeof err);
        }
        for (int k = 0; k < 200 && ds_sched_step(s, err, sizeof err) > 0; k++) {}
        CHECK(rq[1].done == 1 && !strcmp(rq[1].res.stop, "error") && rq[1].got.n == 2, "failing processor: stop %s after %d",
              rq[1].done ? rq[1].res.stop : "-", rq[1].got.n);
        CHECK(rq[0].done == 1 && rq[2].done == 1 && rq[0].got.n == NGEN && rq[2].got.n == NGEN, "the others run on");
        ds_sched_stats st;
        ds_sched_get_stats(s, &st);
        CHECK(st.pages_free == st.pages_total, "pages back");
        ds_sched_free(s);
        ds_engine_free(e);
        PASS("a failing processor ends its request alone (stop error); the others finish");
    }
    ds_grammar_free(g);
    ds_model_free(m);
    return tu_finish("test_sched_lproc");
}
