/* test_serve_gen.c — the generation side of `dspark serve`, engine and API,
 * on the shipped pair (trained target + drafter, so drafts are accepted and
 * verify rows carry real extra history):
 *
 *   processors   speculative == plain, greedy and seeded, for presence /
 *                frequency penalties, logit_bias, a grammar, logprob capture
 *                and all of them at once: the tokens, every captured
 *                logprob and top list, memcmp-equal; each processor also
 *                shown to act (the counter-tests: output differs from the
 *                unprocessed run, a banned token never appears, ...)
 *   stop state   a stop inside an accepted block (callback stop), at the
 *                length limit and at an end-of-generation token leaves the
 *                target's KV rows exactly as plain decoding leaves them
 *                (n_past and every row memcmp-equal)
 *   cancel       the engine's cancel hook is polled between the prefill's
 *                chunks (a long prompt stops after the chunk the cancel
 *                came in); DSPARK_STOP gives stop "stop"
 *   busy flag    a context entered by a second generation (re-entrantly or
 *                from another thread) refuses it with INVALID, and the
 *                running generation's tokens are unchanged */
#include "dspark.h"
#include "drafter.h"
#include "generate.h"
#include "grammar.h"
#include "lproc.h"
#include "model.h"
#include "spec.h"
#include "testutil.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <pthread.h>

#define DRAFTER    "models/dspark-tiny-drafter-f16.gguf"
#define NGEN 32

static const char *target_path(void) { return tu_shipped_target(); }

/* ========================================================================
 * API level: processors keep speculative == plain
 * ===================================================================== */

typedef struct {
    int     n;
    int32_t id[NGEN];
    float   lp[NGEN];
    int     n_top[NGEN];
    int32_t top_id[NGEN][DS_LPROC_TOP_MAX];
    float   top_lp[NGEN][DS_LPROC_TOP_MAX];
    int     stop_at;                 /* >0: return DSPARK_STOP at that token */
} trace;

static int on_tok(void *user, const dspark_token *t) {
    trace *r = user;
    if (r->n < NGEN) {
        r->id[r->n] = t->id;
        r->lp[r->n] = t->logprob;
        r->n_top[r->n] = t->n_top;
        for (int k = 0; k < t->n_top && k < DS_LPROC_TOP_MAX; k++) {
            r->top_id[r->n][k] = t->top_id[k];
            r->top_lp[r->n][k] = t->top_logprob[k];
        }
    }
    r->n++;
    return r->stop_at && r->n == r->stop_at ? DSPARK_STOP : 0;
}

static int traces_equal(const trace *a, const trace *b) {
    if (a->n != b->n) return 0;
    for (int i = 0; i < a->n && i < NGEN; i++) {
        if (a->id[i] != b->id[i] || memcmp(&a->lp[i], &b->lp[i], sizeof(float)) || a->n_top[i] != b->n_top[i]) return 0;
        if (memcmp(a->top_id[i], b->top_id[i], (size_t)a->n_top[i] * sizeof(int32_t)) ||
            memcmp(a->top_lp[i], b->top_lp[i], (size_t)a->n_top[i] * sizeof(float)))
            return 0;
    }
    return 1;
}

static dspark_status run(dspark_ctx *c, const int32_t *p, int n, dspark_gen_params *gp, int spec, trace *t, dspark_stats *st) {
    memset(t, 0, sizeof *t);
    gp->speculative = spec;
    gp->on_token_ex = on_tok;
    gp->user = t;
    dspark_error e;
    dspark_status rc = dspark_generate(c, p, n, gp, NULL, st, &e);
    if (rc) printf("  generate: %s\n", e.message);
    return rc;
}

static int count_tok(const trace *t, int32_t id) {
    int k = 0;
    for (int i = 0; i < t->n && i < NGEN; i++) k += t->id[i] == id;
    return k;
}

static void test_processors(const dspark_model *m, dspark_ctx *c) {
    int32_t p[64];
    dspark_error e;
    int n = dspark_tokenize(m, "The river", 9, -1, 1, p, 64, &e);
    dspark_grammar *json = dspark_grammar_new(m, dspark_grammar_json_object(), strlen(dspark_grammar_json_object()), &e);
    CHECK(json != NULL, "json grammar: %s", e.message);
    const char *small = "root ::= \" \" [a-z]+ ( \" \" [a-z]+ ){2,6} \".\"";
    dspark_grammar *words = dspark_grammar_new(m, small, strlen(small), &e);
    CHECK(words != NULL, "words grammar: %s", e.message);
    /* the plain greedy run without processing: the reference the
     * counter-tests compare with */
    dspark_gen_params base;
    dspark_gen_params_default(&base);
    base.max_tokens = NGEN;
    base.stop_at_eog = 0;
    trace ref, a, b;
    dspark_stats st, st2;
    run(c, p, n, &base, 0, &ref, &st);
    int32_t common = ref.id[0];
    int best = 0;
    for (int i = 0; i < ref.n; i++) {
        int k = count_tok(&ref, ref.id[i]);
        if (k > best) { best = k; common = ref.id[i]; }
    }
    dspark_logit_bias ban = { common, -INFINITY }, push = { 13, 100.0f }, mix[2] = { { common, -3.5f }, { 200, 2.25f } };
    struct { const char *name; float pres, freq; const dspark_logit_bias *bias; int nb; const dspark_grammar *g; int lp, top; } cases[] = {
        { "frequency_penalty", 0, 1.5f, NULL, 0, NULL, 0, 0 },
        { "presence_penalty", 1.2f, 0, NULL, 0, NULL, 0, 0 },
        { "logit_bias_ban", 0, 0, &ban, 1, NULL, 0, 0 },
        { "logit_bias_mix", 0, 0, mix, 2, NULL, 0, 0 },
        { "grammar_json", 0, 0, NULL, 0, json, 0, 0 },
        { "grammar_words", 0, 0, NULL, 0, words, 0, 0 },
        { "logprobs_top5", 0, 0, NULL, 0, NULL, 1, 5 },
        { "everything", 0.4f, 0.6f, mix, 2, json, 1, 3 },
    };
    static const struct { float temp; uint64_t seed; float top_p; int top_k; } samp[] = {
        { 0.0f, 0, 1.0f, 0 }, { 0.9f, 5, 0.95f, 0 }, { 1.1f, 8, 1.0f, 40 },
    };
    int all = 1, rounds_with_accepts = 0, n_runs = 0;
    /* under the sanitizers (DSPARK_SAN): greedy and one seeded sampler */
    const size_t n_samp = getenv("DSPARK_SAN") ? 2 : sizeof samp / sizeof samp[0];
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        for (size_t s = 0; s < n_samp; s++) {
            dspark_gen_params gp = base;
            gp.presence_penalty = cases[k].pres;
            gp.frequency_penalty = cases[k].freq;
            gp.logit_bias = cases[k].bias;
            gp.n_logit_bias = cases[k].nb;
            gp.grammar = cases[k].g;
            gp.logprobs = cases[k].lp;
            gp.top_logprobs = cases[k].top;
            gp.temperature = samp[s].temp;
            gp.seed = samp[s].seed;
            gp.top_p = samp[s].top_p;
            gp.top_k = samp[s].top_k;
            gp.stop_at_eog = cases[k].g != NULL;       /* a grammar ends with EOG */
            dspark_status r1 = run(c, p, n, &gp, 1, &a, &st);
            dspark_status r2 = run(c, p, n, &gp, 0, &b, &st2);
            int eq = !r1 && !r2 && traces_equal(&a, &b) && st.speculative && !st2.speculative;
            CHECK(eq, "%s temp=%g: speculative != plain (n %d vs %d)", cases[k].name, samp[s].temp, a.n, b.n);
            all &= eq;
            rounds_with_accepts += st.accepted > 0;
            n_runs++;
            if (s == 0 && eq) {   /* the counter-tests, greedy */
                int acts = 1;
                const int only_capture = cases[k].lp && !cases[k].pres && !cases[k].freq && !cases[k].nb && !cases[k].g;
                if (!strcmp(cases[k].name, "logit_bias_ban")) acts = count_tok(&a, common) == 0 && count_tok(&ref, common) > 0;
                else if (only_capture)   /* capture changes no token */
                    acts = a.n == ref.n && !memcmp(a.id, ref.id, (size_t)a.n * sizeof(int32_t));
                else acts = a.n != ref.n || memcmp(a.id, ref.id, (size_t)(a.n < NGEN ? a.n : NGEN) * sizeof(int32_t));
                /* logprobs: <= 0, a sorted top list; unprocessed greedy picks its top token */
                for (int i = 0; i < a.n && i < NGEN && cases[k].lp && acts; i++) {
                    const int t = cases[k].top;
                    acts = a.lp[i] <= 0.0f && a.lp[i] >= -9999.0f && a.n_top[i] == t && a.top_lp[i][0] >= a.top_lp[i][t - 1] &&
                           a.top_lp[i][0] <= 0.0f;
                    if (only_capture) acts = acts && a.top_id[i][0] == a.id[i] && a.top_lp[i][0] == a.lp[i];
                }
                if (cases[k].g == words) {
                    char txt[1024];
                    long len = dspark_detokenize(m, a.id, a.n < NGEN ? a.n : NGEN, txt, sizeof txt, &e);
                    acts = acts && len > 0 && txt[len - 1] == '.' && !strcmp(st.stop, "eog");
                }
                CHECK(acts, "%s: the processor must act (and logprobs change nothing)", cases[k].name);
                all &= acts;
            }
            if (cases[k].g == json && !strcmp(st.stop, "eog")) {
                char txt[4096];
                long len = dspark_detokenize(m, a.id, a.n < NGEN ? a.n : NGEN, txt, sizeof txt, &e);
                cJSON *j = len > 0 ? cJSON_ParseWithLength(txt, (size_t)len) : NULL;
                CHECK(j && cJSON_IsObject(j), "%s: a finished json_object text must parse: %.*s", cases[k].name, (int)len, txt);
                cJSON_Delete(j);
            }
        }
    }
    CHECK(rounds_with_accepts > n_runs / 2, "too few speculative runs accepted drafts (%d of %d)", rounds_with_accepts, n_runs);
    printf("%s processors_spec_equals_plain runs=%d with_accepted_drafts=%d\n", all ? "PASS" : "FAIL", n_runs, rounds_with_accepts);
    /* a bias of +100 on one token makes greedy pick it every time */
    dspark_gen_params gp = base;
    gp.logit_bias = &push;
    gp.n_logit_bias = 1;
    run(c, p, n, &gp, 1, &a, &st);
    CHECK(count_tok(&a, 13) == a.n && a.n == NGEN, "logit_bias +100: %d of %d", count_tok(&a, 13), a.n);
    /* DSPARK_STOP: stop "stop", both ways, at the same token */
    gp = base;
    for (int spec = 0; spec < 2; spec++) {
        memset(&a, 0, sizeof a);
        a.stop_at = 7;
        gp.speculative = spec;
        gp.on_token_ex = on_tok;
        gp.user = &a;
        dspark_generate(c, p, n, &gp, NULL, &st, &e);
        CHECK(a.n == 7 && st.n_generated == 7 && !strcmp(st.stop, "stop"), "DSPARK_STOP spec=%d: n=%d stop=%s", spec, a.n, st.stop);
    }
    PASS("api_logit_bias_and_stop");
    dspark_grammar_free(json);
    dspark_grammar_free(words);
}

/* ========================================================================
 * Engine level: the state a stop leaves; the prefill's cancel poll
 * ===================================================================== */

typedef struct {
    int *n_predict;
    int  stop_at, n;
} stopper;

static void stop_tok(void *user, int32_t t) {
    (void)t;
    stopper *s = user;
    if (++s->n == s->stop_at) *s->n_predict = s->n;   /* as the API stops a run */
}

typedef struct { int p, a; } round_log;
typedef struct { round_log r[256]; int n; } rounds;
static void on_round(void *user, const ds_spec_round *r) {
    rounds *L = user;
    if (L->n < 256) L->r[L->n++] = (round_log){ r->p, r->accepted };
}

static int kv_equal(ds_ctx *a, ds_ctx *b, const ds_model *m) {
    const int n = ds_ctx_n_past(a);
    if (n != ds_ctx_n_past(b) || n < 1) return 0;
    const size_t row = (size_t)m->hp.n_head_kv * m->hp.head_dim, all = (size_t)m->hp.n_layer * n * row;
    float *ka = malloc(all * sizeof *ka), *va = malloc(all * sizeof *va), *kb = malloc(all * sizeof *kb), *vb = malloc(all * sizeof *vb);
    ds_ctx_read_kv(a, 0, n, ka, va);
    ds_ctx_read_kv(b, 0, n, kb, vb);
    int eq = !memcmp(ka, kb, all * sizeof *ka) && !memcmp(va, vb, all * sizeof *va);
    free(ka); free(va); free(kb); free(vb);
    return eq;
}

/* plain and speculative with the same stop; returns 1 when the KV states match */
static int stop_case(ds_ctx *cp, ds_ctx *cs, const ds_model *m, const ds_drafter *d, const int32_t *p, int n, int n_predict,
                     int stop_at, const ds_gen_hooks *hp, const ds_gen_hooks *hs, const char **why, int *n_gen) {
    int32_t out_p[128], out_s[128];
    const ds_sampler samp = { 0.0f, 0, 1.0f, 0, 0.0f };
    char e[256];
    stopper sp = { NULL, stop_at, 0 }, ss = { NULL, stop_at, 0 };
    ds_gen_opts go = { n_predict, DS_PREFILL_BATCH, 1, stop_tok, &sp };
    sp.n_predict = &go.n_predict;
    ds_gen_stats gs;
    int rc1 = ds_generate_ex(cp, p, n, &go, &samp, hp, out_p, &gs, e, sizeof e);
    ds_spec_opts so;
    ds_spec_opts_default(&so);
    so.n_predict = n_predict;
    so.on_token = stop_tok;
    so.user = &ss;
    so.hooks = hs;
    ss.n_predict = &so.n_predict;
    ds_spec_stats st;
    int rc2 = ds_spec_generate(cs, d, p, n, &so, out_s, &st, e, sizeof e);
    *why = st.stop;
    *n_gen = st.n_gen;
    return !rc1 && !rc2 && gs.n_gen == st.n_gen && !memcmp(out_p, out_s, (size_t)st.n_gen * sizeof(int32_t)) &&
           !strcmp(gs.stop, st.stop) && kv_equal(cp, cs, m);
}

typedef struct { int calls, at; } poll_state;
static int poll_cancel(void *user) {
    poll_state *s = user;
    return ++s->calls >= s->at;
}

static void test_engine(void) {
    char e[256];
    ds_model *m = ds_model_load_on(target_path(), tu_device(), e, sizeof e);
    CHECK(m != NULL, "load: %s", e);
    if (!m) return;
    ds_drafter *d = ds_drafter_load(DRAFTER, m, e, sizeof e);
    ds_ctx *cp = ds_ctx_new(m, 512, 2, e, sizeof e), *cs = ds_ctx_new(m, 512, 2, e, sizeof e);
    CHECK(d && cp && cs, "setup: %s", e);
    if (!d || !cp || !cs) goto out;
    int32_t *p = NULL;
    size_t n = 0;
    ds_tokenize(m->tok, "It is a truth universally acknowledged, that", 44, 0, &p, &n, e, sizeof e);
    /* where speculation accepts: a round with a >= 2 gives a stop inside a block */
    {
        rounds L = { .n = 0 };
        int32_t out[128];
        ds_spec_opts so;
        ds_spec_opts_default(&so);
        so.n_predict = 64;
        so.on_round = on_round;
        so.round_user = &L;
        ds_spec_stats st;
        ds_spec_generate(cs, d, p, (int)n, &so, out, &st, e, sizeof e);
        int inside = -1;
        for (int i = 0; i < L.n && inside < 0; i++)
            if (L.r[i].a >= 2) inside = L.r[i].p - (int)n + 2;    /* the first accepted draft's token index + 1 */
        CHECK(inside > 0, "no round accepted two drafts");
        const char *why;
        int ng;
        int ok = inside > 0 && stop_case(cp, cs, m, d, p, (int)n, 64, inside, NULL, NULL, &why, &ng);
        CHECK(ok && ng == inside, "stop inside an accepted block (token %d): KV differs from plain's", inside);
        int ok2 = stop_case(cp, cs, m, d, p, (int)n, 37, 0, NULL, NULL, &why, &ng);
        CHECK(ok2 && !strcmp(why, "length"), "stop at the length limit: KV differs from plain's (%s)", why);
        /* an EOG forced by a grammar that ends: plain's state at the EOG */
        const char *g3 = "root ::= \" was a\" [a-z ]{1,12} \".\"";
        ds_grammar *g = ds_grammar_new(g3, strlen(g3), m->tok, e, sizeof e);
        ds_lchain_cfg cfg = { 0, 0, NULL, NULL, 0, g, 0, 0 };
        ds_lchain *c1 = ds_lchain_new(&cfg, m->hp.n_vocab, e, sizeof e), *c2 = ds_lchain_new(&cfg, m->hp.n_vocab, e, sizeof e);
        ds_gen_hooks h1 = { ds_lchain_proc(c1), NULL, NULL }, h2 = { ds_lchain_proc(c2), NULL, NULL };
        int ok3 = g && c1 && c2 && stop_case(cp, cs, m, d, p, (int)n, 64, 0, &h1, &h2, &why, &ng);
        CHECK(ok3 && !strcmp(why, "eog"), "stop at a grammar's EOG: KV differs from plain's (%s, n=%d)", why, ng);
        ds_lchain_free(c1);
        ds_lchain_free(c2);
        ds_grammar_free(g);
        printf("%s stop_leaves_plain_kv_state inside_block_at=%d length=%d eog=%d\n", ok && ok2 && ok3 ? "PASS" : "FAIL", inside,
               ok2, ok3);
    }
    /* the cancel poll reaches inside a long prefill (both loops) */
    {
        int32_t longp[480];
        for (int i = 0; i < 480; i++) longp[i] = p[i % n];
        int32_t out[8];
        const ds_sampler samp = { 0.0f, 0, 1.0f, 0, 0.0f };
        poll_state ps = { 0, 3 }, ss = { 0, 3 };
        ds_gen_hooks hp = { NULL, poll_cancel, &ps }, hs = { NULL, poll_cancel, &ss };
        ds_gen_opts go = { 8, DS_PREFILL_BATCH, 1, NULL, NULL };
        ds_gen_stats gs;
        int rc1 = ds_generate_ex(cp, longp, 480, &go, &samp, &hp, out, &gs, e, sizeof e);
        ds_spec_opts so;
        ds_spec_opts_default(&so);
        so.n_predict = 8;
        so.hooks = &hs;
        ds_spec_stats st;
        int rc2 = ds_spec_generate(cs, d, longp, 480, &so, out, &st, e, sizeof e);
        const int mm = ds_ctx_m_max(cp);
        int ok = !rc1 && !rc2 && gs.n_gen == 0 && st.n_gen == 0 && !strcmp(gs.stop, "cancel") && !strcmp(st.stop, "cancel") &&
                 ps.calls == 3 && ss.calls == 3 && ds_ctx_n_past(cp) == 2 * mm;
        CHECK(ok, "prefill cancel: plain n=%d stop=%s polls=%d n_past=%d; spec n=%d stop=%s polls=%d", gs.n_gen, gs.stop, ps.calls,
              ds_ctx_n_past(cp), st.n_gen, st.stop, ss.calls);
        /* the chunked prefill gives the plain run's tokens when nothing cancels */
        int32_t o1[16], o2[16];
        poll_state never = { 0, 1 << 30 };
        ds_gen_hooks hn = { NULL, poll_cancel, &never };
        ds_gen_opts g16 = { 16, DS_PREFILL_BATCH, 0, NULL, NULL };
        int r1 = ds_generate_ex(cp, longp, 400, &g16, &samp, NULL, o1, &gs, e, sizeof e);
        int r2 = ds_generate_ex(cp, longp, 400, &g16, &samp, &hn, o2, &gs, e, sizeof e);
        CHECK(!r1 && !r2 && !memcmp(o1, o2, sizeof o1) && never.calls > 400 / mm, "a chunked prefill changed the tokens");
        printf("%s cancel_inside_prefill chunk_rows=%d polls=%d\n", ok ? "PASS" : "FAIL", mm, ps.calls);
    }
    free(p);
out:
    ds_ctx_free(cp);
    ds_ctx_free(cs);
    ds_drafter_free(d);
    ds_model_free(m);
}

/* ========================================================================
 * The busy flag
 * ===================================================================== */

typedef struct {
    dspark_ctx *c;
    const int32_t *p;
    int n, calls;
    dspark_status inner;
} reenter;

static int reenter_tok(void *user, int32_t t, const char *b, size_t n) {
    (void)t; (void)b; (void)n;
    reenter *r = user;
    if (r->calls++ == 3) {
        dspark_gen_params gp;
        dspark_gen_params_default(&gp);
        gp.max_tokens = 4;
        dspark_error e;
        r->inner = dspark_generate(r->c, r->p, r->n, &gp, NULL, NULL, &e);
    }
    return 0;
}

typedef struct {
    dspark_ctx *c;
    const int32_t *p;
    int n;
    int32_t ref[NGEN];
    int ok, refused, ran;
} hammer;

static void *hammer_main(void *arg) {
    hammer *h = arg;
    for (int i = 0; i < 12; i++) {
        dspark_gen_params gp;
        dspark_gen_params_default(&gp);
        gp.max_tokens = 12;
        int32_t out[NGEN];
        dspark_stats st;
        dspark_error e;
        dspark_status rc = dspark_generate(h->c, h->p, h->n, &gp, out, &st, &e);
        if (rc == DSPARK_OK) {
            h->ran++;
            if (memcmp(out, h->ref, (size_t)st.n_generated * sizeof(int32_t)) || st.n_generated != 12) h->ok = 0;
        } else if (rc == DSPARK_ERR_INVALID && strstr(e.message, "in use")) h->refused++;
        else h->ok = 0;
    }
    return NULL;
}

static void test_busy(const dspark_model *m, dspark_ctx *c) {
    int32_t p[64];
    dspark_error e;
    int n = dspark_tokenize(m, "The river", 9, -1, 1, p, 64, &e);
    reenter r = { c, p, n, 0, DSPARK_OK };
    dspark_gen_params gp;
    dspark_gen_params_default(&gp);
    gp.max_tokens = 12;
    gp.on_token = reenter_tok;
    gp.user = &r;
    int32_t out[NGEN], ref[NGEN];
    dspark_stats st;
    dspark_status rc = dspark_generate(c, p, n, &gp, out, &st, &e);
    gp.on_token = NULL;
    dspark_generate(c, p, n, &gp, ref, NULL, &e);
    CHECK(rc == DSPARK_OK && r.inner == DSPARK_ERR_INVALID && st.n_generated == 12 && !memcmp(out, ref, 12 * sizeof(int32_t)),
          "re-entered context: inner rc=%d", (int)r.inner);
    /* two threads on one context: each call runs whole or is refused */
    hammer h[2];
    pthread_t th[2];
    for (int i = 0; i < 2; i++) {
        h[i] = (hammer){ c, p, n, { 0 }, 1, 0, 0 };
        memcpy(h[i].ref, ref, sizeof ref);
        pthread_create(&th[i], NULL, hammer_main, &h[i]);
    }
    for (int i = 0; i < 2; i++) pthread_join(th[i], NULL);
    int ok = h[0].ok && h[1].ok && h[0].ran + h[1].ran + h[0].refused + h[1].refused == 24 && h[0].ran + h[1].ran >= 12;
    CHECK(ok, "two threads: ran %d+%d refused %d+%d", h[0].ran, h[1].ran, h[0].refused, h[1].refused);
    printf("%s busy_context_refused reentrant=1 threads_ran=%d refused=%d\n", ok ? "PASS" : "FAIL", h[0].ran + h[1].ran,
           h[0].refused + h[1].refused);
}

int main(void) {
    dspark_model_params mp;
    dspark_model_params_default(&mp);
    mp.model_path = target_path();
    mp.drafter_path = DRAFTER;
    mp.device = tu_device();
    dspark_error err;
    dspark_model *m = dspark_model_load(&mp, &err);
    CHECK(m != NULL, "load: %s", err.message);
    if (!m) return tu_finish("test_serve_gen");
    dspark_ctx_params cp;
    dspark_ctx_params_default(&cp);
    cp.n_ctx = 256;
    dspark_ctx *c = dspark_ctx_new(m, &cp, &err);
    CHECK(c != NULL, "ctx: %s", err.message);
    if (c) {
        test_processors(m, c);
        test_busy(m, c);
        dspark_ctx_free(c);
    }
    dspark_model_free(m);
    test_engine();
    return tu_finish("test_serve_gen");
}
