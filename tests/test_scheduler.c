/* test_scheduler.c — continuous batching (scheduler.h) gives every request
 * exactly the tokens plain generation gives it alone (ds_generate on its
 * own context), whatever shares its steps: requests arriving while others
 * run, prompts chunked under a small row budget, shared prefixes served from
 * the prefix cache, a pool small enough to force preemption, greedy and
 * seeded sampling. Cancellation in the queue, in the prompt and while
 * generating ends the request at once and gives its pages back. */
#include "scheduler.h"
#include "generate.h"
#include "model_make.h"
#include "testutil.h"

#define NREQ 24
#define NPRED 12

typedef struct {
    int32_t prompt[300];
    int n_prompt;
    ds_sampler samp;
    int32_t ref[NPRED];
    int n_ref;
    const char *ref_stop;
    /* what the scheduler gave */
    int32_t got[NPRED + 4];
    int n_got, done, cancel_after;
    long id;
    ds_req_result res;
} req;

static uint64_t rs = 5;
static uint32_t rnd32(void) { rs ^= rs << 13; rs ^= rs >> 7; rs ^= rs << 17; return (uint32_t)rs; }

static int on_tok(void *u, int32_t t) {
    req *q = u;
    if (q->n_got < NPRED + 4) q->got[q->n_got] = t;
    q->n_got++;
    return q->cancel_after > 0 && q->n_got >= q->cancel_after;
}
static void on_done(void *u, const ds_req_result *r) {
    req *q = u;
    q->done++;
    q->res = *r;
}

static ds_model *make(const char *dir) {
    char path[512], err[DS_ERRLEN];
    snprintf(path, sizeof path, "%s/m.gguf", dir);
    ds_make_model_opts o;
    ds_make_model_defaults(&o);
    o.arch = "qwen3"; o.type = DS_TYPE_Q8_0;
    o.n_embd = 128; o.n_layer = 2; o.n_head = 4; o.n_head_kv = 2; o.head_dim = 32; o.n_ff = 256;
    o.n_vocab = 384; o.n_ctx = 512; o.seed = 3;
    if (ds_make_model(&o, path, err, sizeof err)) { printf("FAIL make-model: %s\n", err); exit(1); }
    ds_model *m = ds_model_load(path, err, sizeof err);
    if (!m) { printf("FAIL load: %s\n", err); exit(1); }
    return m;
}

/* Runs every request through a scheduler with these settings; returns the
 * number of requests whose tokens differ from their reference. */
static int run(const ds_model *m, req *rq, int n, int n_pages, int max_rows, int prefix, int stagger, long *preempt,
               long *cached) {
    char err[DS_ERRLEN];
    const ds_engine_params ep = {.n_seq_max = 8, .n_ctx = 512, .n_pages = n_pages, .n_threads = 2};
    ds_engine *e = ds_engine_new(m, &ep, err, sizeof err);
    const ds_sched_params sp = {.max_rows = max_rows, .prefill_chunk = max_rows / 2, .prefix_cache = prefix};
    ds_sched *s = e ? ds_sched_new(e, &sp, err, sizeof err) : NULL;
    if (!s) { printf("FAIL scheduler: %s\n", err); exit(1); }
    int submitted = 0, steps = 0;
    for (int i = 0; i < n; i++) { rq[i].n_got = 0; rq[i].done = 0; }
    for (;;) {
        /* arrivals: all at once, or a few per step while others run */
        while (submitted < n && (!stagger || steps % 3 == 0 || submitted < 2)) {
            req *q = &rq[submitted];
            const ds_req_params p = {.prompt = q->prompt, .n_prompt = q->n_prompt, .n_predict = NPRED, .samp = q->samp,
                                     .stop_at_eog = 1, .on_token = on_tok, .on_done = on_done, .user = q};
            q->id = ds_sched_submit(s, &p, err, sizeof err);
            if (q->id < 0) { printf("FAIL submit: %s\n", err); exit(1); }
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
        const req *q = &rq[i];
        if (q->done != 1 || q->n_got != q->n_ref || memcmp(q->got, q->ref, (size_t)q->n_ref * sizeof(int32_t)) ||
            strcmp(q->res.stop, q->ref_stop))
            bad++;
    }
    ds_sched_stats st;
    ds_sched_get_stats(s, &st);
    *preempt = st.preemptions;
    *cached = st.cached_tokens;
    CHECK(st.pages_free == st.pages_total, "pages leaked: %d of %d free", st.pages_free, st.pages_total);
    ds_sched_free(s);
    ds_engine_free(e);
    return bad;
}

int main(void) {
    char dir[256], err[DS_ERRLEN];
    tu_tmpdir(dir, sizeof dir);
    ds_model *m = make(dir);
    static req rq[NREQ];
    int32_t shared[200];
    for (int i = 0; i < 200; i++) shared[i] = (int32_t)((i * 53 + 1) % 383);
    ds_ctx *c = ds_ctx_new(m, 512, 1, err, sizeof err);
    for (int i = 0; i < NREQ; i++) {
        req *q = &rq[i];
        memset(q, 0, sizeof *q);
        /* every third request shares a long prefix with the others */
        const int base = i % 3 == 0 ? 40 + (int)(rnd32() % 150) : 0;
        memcpy(q->prompt, shared, (size_t)base * sizeof(int32_t));
        q->n_prompt = base + 2 + (int)(rnd32() % 60);
        for (int p = base; p < q->n_prompt; p++) q->prompt[p] = (int32_t)(rnd32() % 383);
        q->samp.temp = i % 2 ? 0.9f : 0.0f;
        q->samp.top_p = 1.0f;
        q->samp.seed = 77 + (uint64_t)i;
        ds_gen_opts go = {NPRED, DS_PREFILL_BATCH, 1, NULL, NULL};
        ds_gen_stats gs;
        if (ds_generate(c, q->prompt, q->n_prompt, &go, &q->samp, q->ref, &gs, err, sizeof err)) {
            printf("FAIL reference: %s\n", err);
            return 1;
        }
        q->n_ref = gs.n_gen;
        q->ref_stop = gs.stop;
    }
    ds_ctx_free(c);
    struct { int pages, rows, prefix, stagger; const char *what; } cases[] = {
        {0, 512, 0, 0, "all at once"},
        {0, 48, 0, 1, "staggered arrivals, 48-row budget (prompts chunked)"},
        {0, 64, 1, 1, "prefix cache"},
        {26, 64, 1, 1, "26 pages and the prefix cache: preemption"},
        {24, 32, 0, 0, "24 pages, 32 rows"},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        long pre = 0, hit = 0;
        const int bad = run(m, rq, NREQ, cases[k].pages, cases[k].rows, cases[k].prefix, cases[k].stagger, &pre, &hit);
        CHECK(bad == 0, "%s: %d of %d requests differ from plain generation alone", cases[k].what, bad, NREQ);
        if (k == 2) CHECK(hit > 0, "the prefix cache reused nothing");
        if (k >= 3) CHECK(pre > 0, "%s: nothing was preempted", cases[k].what);
        if (!bad) printf("PASS scheduler %s: %d requests == alone (preemptions %ld, cached positions %ld)\n", cases[k].what,
                         NREQ, pre, hit);
    }
    /* cancellation: queued, inside the prompt, while generating */
    {
        const ds_engine_params ep = {.n_seq_max = 2, .n_ctx = 512, .n_threads = 1};
        ds_engine *e = ds_engine_new(m, &ep, err, sizeof err);
        const ds_sched_params sp = {.max_rows = 16, .prefill_chunk = 8};
        ds_sched *s = ds_sched_new(e, &sp, err, sizeof err);
        req q[4];
        memset(q, 0, sizeof q);
        for (int i = 0; i < 4; i++) {
            memcpy(q[i].prompt, rq[i].prompt, sizeof q[i].prompt);
            q[i].n_prompt = 100;
            const ds_req_params p = {.prompt = q[i].prompt, .n_prompt = 100, .n_predict = NPRED, .samp = rq[0].samp,
                                     .stop_at_eog = 1, .on_token = on_tok, .on_done = on_done, .user = &q[i]};
            q[i].id = ds_sched_submit(s, &p, err, sizeof err);
        }
        q[3].cancel_after = 2;                          /* stops itself after two tokens */
        ds_sched_step(s, err, sizeof err);               /* 0 and 1 in their prompts; 2, 3 queued */
        CHECK(ds_sched_cancel(s, q[0].id) == 0 && ds_sched_cancel(s, q[2].id) == 0, "cancel known ids");
        CHECK(ds_sched_cancel(s, 9999) == -1, "an unknown id is refused");
        for (int k = 0; k < 200 && ds_sched_step(s, err, sizeof err) > 0; k++) {}
        CHECK(q[0].done == 1 && !strcmp(q[0].res.stop, "cancel") && q[0].n_got == 0, "cancel inside the prompt");
        CHECK(q[2].done == 1 && !strcmp(q[2].res.stop, "cancel") && q[2].n_got == 0, "cancel in the queue");
        CHECK(q[1].done == 1 && !strcmp(q[1].res.stop, "length") && q[1].n_got == NPRED, "the others run on");
        CHECK(q[3].done == 1 && !strcmp(q[3].res.stop, "cancel") && q[3].n_got == 2, "stop from the token callback");
        ds_sched_stats st;
        ds_sched_get_stats(s, &st);
        CHECK(st.pages_free == st.pages_total && st.running == 0 && st.waiting == 0, "all pages back after cancels");
        ds_sched_free(s);
        ds_engine_free(e);
        PASS("cancel: queued, in the prompt, from the token callback; pages back");
    }
    /* a pool smaller than a request: a prompt it can never hold is refused
     * at submit; a request alone that outgrows it ends with stop "context"
     * after the tokens it had room for (the prefix of its tokens alone) */
    {
        const ds_engine_params ep = {.n_seq_max = 2, .n_ctx = 512, .n_pages = 4, .n_threads = 1};
        ds_engine *e = ds_engine_new(m, &ep, err, sizeof err);
        const ds_sched_params sp = {.max_rows = 64};
        ds_sched *s = ds_sched_new(e, &sp, err, sizeof err);
        req q;
        memset(&q, 0, sizeof q);
        memcpy(q.prompt, rq[0].prompt, sizeof q.prompt);
        ds_req_params p = {.prompt = q.prompt, .n_prompt = 100, .n_predict = NPRED, .samp = rq[0].samp,
                           .stop_at_eog = 0, .on_token = on_tok, .on_done = on_done, .user = &q};
        CHECK(ds_sched_submit(s, &p, err, sizeof err) < 0 && strstr(err, "pool holds 4"), "a prompt past the pool refused: %s", err);
        /* 40 prompt tokens: 3 pages; 4 pages hold 64 positions, so at most
         * 24 new tokens fit, and NPRED + 40 > 48 makes it outgrow 3 + spare */
        p.n_prompt = 40;
        p.n_predict = 40;
        CHECK(ds_sched_submit(s, &p, err, sizeof err) > 0, "submit: %s", err);
        for (int k = 0; k < 200 && ds_sched_step(s, err, sizeof err) > 0; k++) {}
        ds_ctx *c1 = ds_ctx_new(m, 512, 1, err, sizeof err);
        int32_t ref[40];
        ds_gen_opts go = {40, DS_PREFILL_BATCH, 0, NULL, NULL};
        ds_gen_stats gs;
        ds_generate(c1, q.prompt, 40, &go, &rq[0].samp, ref, &gs, err, sizeof err);
        ds_ctx_free(c1);
        CHECK(q.done == 1 && !strcmp(q.res.stop, "context") && q.n_got > 0 && q.n_got < 40 &&
                  !memcmp(q.got, ref, (size_t)(q.n_got < NPRED + 4 ? q.n_got : NPRED + 4) * sizeof(int32_t)),
              "outgrowing the pool: stop %s after %d tokens", q.done ? q.res.stop : "-", q.n_got);
        ds_sched_stats st;
        ds_sched_get_stats(s, &st);
        CHECK(st.pages_free == st.pages_total, "pages back");
        ds_sched_free(s);
        ds_engine_free(e);
        PASS("pool smaller than a request: refused at submit, or stop context after the tokens that fit (== alone)");
    }
    ds_model_free(m);
    tu_rmdir(dir);
    return tu_finish("test_scheduler");
}
