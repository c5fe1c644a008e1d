/* test_api.c — the public C API (include/dspark.h) on the shipped pair:
 * load errors, tokenize/detokenize, plain == speculative through the API
 * (greedy and sampled with top-k/top-p/min-p), streaming callbacks carry the
 * tokens' bytes, stopping from the callback and dspark_ctx_cancel from
 * another thread, two contexts on one model generating at once with the
 * bytes each produces alone, and parameter errors. Uses only dspark.h.
 * Runs under ASan/UBSan too (tests/SAN_SUITES). */
#include "dspark.h"
#include "testutil.h"

#include <pthread.h>
#include <stdatomic.h>
#include <time.h>

#define DRAFTER    "models/dspark-tiny-drafter-f16.gguf"
#define NGEN 40

static const char *target_path(void) { return tu_shipped_target(); }

static int tokenize(const dspark_model *m, const char *s, int32_t *out, int cap) {
    dspark_error e;
    int n = dspark_tokenize(m, s, strlen(s), -1, 1, out, cap, &e);
    CHECK(n > 0 && n <= cap, "tokenize '%s': %d (%s)", s, n, e.message);
    return n;
}

/* ---- errors at load / context creation ---------------------------------- */
static void test_load_errors(void) {
    dspark_error e;
    dspark_model_params mp;
    dspark_model_params_default(&mp);
    CHECK(!dspark_model_load(&mp, &e) && e.code == DSPARK_ERR_INVALID && e.message[0], "no path: %d", e.code);
    mp.model_path = "models/does-not-exist.gguf";
    CHECK(!dspark_model_load(&mp, &e) && e.code == DSPARK_ERR_LOAD && strstr(e.message, "does-not-exist"), "missing file: %s", e.message);
    mp.model_path = target_path();
    mp.device = "cuda:7";
    CHECK(!dspark_model_load(&mp, &e) && e.code == DSPARK_ERR_UNSUPPORTED && strstr(e.message, "cuda:7"), "device: %s", e.message);
    mp.device = "cpu";
    mp.drafter_path = target_path();              /* a target is not a drafter */
    CHECK(!dspark_model_load(&mp, &e) && e.code == DSPARK_ERR_LOAD, "target as drafter: %d %s", e.code, e.message);
    CHECK(!strcmp(dspark_status_name(DSPARK_ERR_CONTEXT), "context"), "status name");
    CHECK(dspark_version()[0] >= '0' && dspark_version()[0] <= '9', "version '%s'", dspark_version());
    PASS("api_load_errors");
}

static void test_ctx_errors(const dspark_model *m) {
    dspark_error e;
    dspark_ctx_params cp;
    dspark_ctx_params_default(&cp);
    cp.n_ctx = dspark_model_n_ctx_train(m) + 1;
    CHECK(!dspark_ctx_new(m, &cp, &e) && e.code == DSPARK_ERR_INVALID, "n_ctx too big: %d", e.code);
    dspark_ctx_params_default(&cp);
    cp.n_threads = -1;
    CHECK(!dspark_ctx_new(m, &cp, &e) && e.code == DSPARK_ERR_INVALID, "threads -1: %d", e.code);
    dspark_ctx_params_default(&cp);
    cp.kernels = "fastest";
    CHECK(!dspark_ctx_new(m, &cp, &e) && e.code == DSPARK_ERR_INVALID && strstr(e.message, "fastest"), "kernels: %s", e.message);
    dspark_ctx_params_default(&cp);
    cp.fast = "matmul_q8_0,attention";
    dspark_ctx *c = dspark_ctx_new(m, &cp, &e);
    CHECK(c && strstr(dspark_ctx_kernels(c), "fast=") && strstr(dspark_ctx_kernels(c), "attention"), "kernel set text '%s'",
          c ? dspark_ctx_kernels(c) : "");
    dspark_ctx_free(c);
    PASS("api_ctx_errors");
}

/* ---- tokens ------------------------------------------------------------------ */
static void test_tokens(const dspark_model *m) {
    const char *s = "It is a truth universally acknowledged, that ünïcödé <|endoftext|>";
    int32_t ids[128];
    dspark_error e;
    int n = dspark_tokenize(m, s, strlen(s), -1, 1, ids, 2, &e);
    CHECK(n > 2, "count beyond cap: %d", n);
    CHECK(dspark_tokenize(m, s, strlen(s), -1, 1, ids, 128, &e) == n, "same count");
    CHECK(ids[n - 1] == dspark_model_eos(m), "<|endoftext|> parsed as a special token");
    char buf[256];
    long len = dspark_detokenize(m, ids, n - 1, buf, sizeof buf, &e);
    const size_t want = strlen(s) - strlen("<|endoftext|>");
    CHECK(len == (long)want && !memcmp(buf, s, want) && buf[len] == 0, "detokenize round trip: %ld '%s'", len, buf);
    CHECK(dspark_detokenize(m, ids, n, NULL, 0, &e) == len, "length query");
    int32_t bad = dspark_model_n_vocab(m);
    CHECK(dspark_detokenize(m, &bad, 1, buf, sizeof buf, &e) == -1 && e.code == DSPARK_ERR_INVALID, "bad id");
    CHECK(dspark_token_to_bytes(m, -1, buf, sizeof buf) == -1, "token_to_bytes range");
    PASS("api_tokens");
}

/* ---- generation helpers --------------------------------------------------------- */
typedef struct {
    char   text[8192];
    size_t len;
    int    calls, stop_after;
    atomic_int seen;
} collector;

static int collect(void *user, int32_t token, const char *bytes, size_t n) {
    (void)token;
    collector *c = user;
    if (c->len + n < sizeof c->text) { memcpy(c->text + c->len, bytes, n); c->len += n; }
    c->calls++;
    atomic_fetch_add(&c->seen, 1);
    return c->stop_after > 0 && c->calls >= c->stop_after;
}

static int gen(dspark_ctx *c, const int32_t *p, int n, const dspark_gen_params *gp, int32_t *out, dspark_stats *st) {
    dspark_error e;
    dspark_status rc = dspark_generate(c, p, n, gp, out, st, &e);
    CHECK(rc == DSPARK_OK, "generate: %s", e.message);
    return rc == DSPARK_OK ? st->n_generated : -1;
}

/* Under the sanitizers (DSPARK_SAN set by tests/run.sh) the sweeps are
 * shortened: that pass looks for memory and threading errors, not coverage. */
static int san(void) { return getenv("DSPARK_SAN") != NULL; }

static void test_spec_equals_plain(const dspark_model *m, dspark_ctx *c) {
    static const char *prompts[] = { "The river", "It is a truth universally acknowledged, that", "Once upon a time" };
    int32_t p[64], a[NGEN], b[NGEN];
    int cases = 0;
    const size_t n_prompts = san() ? 1 : sizeof prompts / sizeof prompts[0];
    for (int cfg = 0; cfg < 3; cfg++)
        for (size_t k = 0; k < n_prompts; k++) {
            int n = tokenize(m, prompts[k], p, 64);
            dspark_gen_params gp;
            dspark_gen_params_default(&gp);
            gp.max_tokens = NGEN;
            if (cfg == 1) { gp.temperature = 0.8f; gp.top_p = 0.9f; gp.seed = 7 + k; }
            if (cfg == 2) { gp.temperature = 1.1f; gp.top_k = 50; gp.min_p = 0.05f; gp.seed = 11 + k; gp.commit = DSPARK_COMMIT_REPLAY; }
            dspark_stats sa, sb;
            gp.speculative = 0;
            int na = gen(c, p, n, &gp, a, &sa);
            gp.speculative = 1;
            int nb = gen(c, p, n, &gp, b, &sb);
            CHECK(na == nb && na > 0 && !memcmp(a, b, (size_t)na * sizeof *a), "cfg %d prompt %zu: spec != plain", cfg, k);
            CHECK(!sa.speculative && sb.speculative && sb.rounds > 0 && sb.draft_max == dspark_model_draft_block(m),
                  "spec stats: rounds %d draft_max %d", sb.rounds, sb.draft_max);
            long hist0 = sb.accept_hist[0];
            CHECK(sb.accepted >= hist0 && sb.drafted >= sb.accepted && sb.mean_accepted_len >= 1.0, "stats consistent");
            CHECK(sa.n_prompt == n && sb.n_prompt == n && sb.t_total_s >= sb.t_prefill_s, "stats fields");
            cases++;
        }
    printf("PASS api_spec_equals_plain cases=%d (greedy, top-p, top-k+min-p+replay)\n", cases);
}

static void test_stream_and_stop(const dspark_model *m, dspark_ctx *c) {
    int32_t p[64], out[NGEN];
    int n = tokenize(m, "The river", p, 64);
    for (int spec = 0; spec < 2; spec++) {
        collector *col = calloc(1, sizeof *col);
        dspark_gen_params gp;
        dspark_gen_params_default(&gp);
        gp.max_tokens = NGEN;
        gp.speculative = spec;
        gp.on_token = collect;
        gp.user = col;
        dspark_stats st;
        int ng = gen(c, p, n, &gp, out, &st);
        char buf[8192];
        dspark_error e;
        long len = dspark_detokenize(m, out, ng, buf, sizeof buf, &e);
        CHECK(col->calls == ng && len == (long)col->len && !memcmp(buf, col->text, col->len), "stream bytes == detokenize(out)");
        /* stop from the callback after 5 tokens, mid-round for spec */
        memset(col, 0, sizeof *col);
        col->stop_after = 5;
        ng = gen(c, p, n, &gp, out, &st);
        CHECK(ng == 5 && !strcmp(st.stop, "cancel") && col->calls == 5, "callback stop: n=%d stop=%s", ng, st.stop);
        free(col);
    }
    /* a cancel names a generation: with nothing running it reaches nothing
     * (the next generation runs whole); a cancel by id waits for that id */
    dspark_ctx_cancel(c);
    dspark_gen_params gp;
    dspark_gen_params_default(&gp);
    gp.max_tokens = NGEN;
    dspark_stats st;
    int ng = gen(c, p, n, &gp, out, &st);
    CHECK(ng == NGEN || !strcmp(st.stop, "eog"), "idle cancel must not reach the next generation: n=%d stop=%s", ng, st.stop);
    dspark_ctx_cancel_id(c, 77);
    gp.id = 76;
    ng = gen(c, p, n, &gp, out, &st);
    CHECK(ng == NGEN || !strcmp(st.stop, "eog"), "a cancel of id 77 must not stop id 76: n=%d stop=%s", ng, st.stop);
    gp.id = 77;
    ng = gen(c, p, n, &gp, out, &st);
    CHECK(ng == 0 && !strcmp(st.stop, "cancel"), "pending cancel of id 77: n=%d stop=%s", ng, st.stop);
    ng = gen(c, p, n, &gp, out, &st);
    CHECK(ng == NGEN || !strcmp(st.stop, "eog"), "cancel consumed: n=%d stop=%s", ng, st.stop);
    PASS("api_stream_and_stop");
}

/* ---- threads -------------------------------------------------------------------------- */
typedef struct {
    dspark_ctx *c;
    const int32_t *p;
    int n, max_tokens, spec;
    float temp;
    int32_t out[512];
    dspark_stats st;
    dspark_status rc;
    collector *col;
} run_arg;

static void *run_thread(void *arg) {
    run_arg *r = arg;
    dspark_gen_params gp;
    dspark_gen_params_default(&gp);
    gp.max_tokens = r->max_tokens;
    gp.speculative = r->spec;
    gp.temperature = r->temp;
    gp.seed = 3;
    gp.stop_at_eog = 0;
    if (r->col) { gp.on_token = collect; gp.user = r->col; }
    dspark_error e;
    r->rc = dspark_generate(r->c, r->p, r->n, &gp, r->out, &r->st, &e);
    return NULL;
}

static void test_cancel_from_thread(const dspark_model *m, dspark_ctx *c) {
    int32_t p[64];
    int n = tokenize(m, "The river", p, 64);
    run_arg *r = calloc(1, sizeof *r);
    r->c = c; r->p = p; r->n = n; r->max_tokens = 400; r->spec = 1;
    r->col = calloc(1, sizeof *r->col);
    pthread_t t;
    pthread_create(&t, NULL, run_thread, r);
    while (atomic_load(&r->col->seen) < 3) {
        struct timespec ts = { 0, 200000 };
        nanosleep(&ts, NULL);
    }
    dspark_ctx_cancel(c);
    pthread_join(t, NULL);
    CHECK(r->rc == DSPARK_OK && !strcmp(r->st.stop, "cancel") && r->st.n_generated >= 3 && r->st.n_generated < 400,
          "cancel from another thread: n=%d stop=%s", r->st.n_generated, r->st.stop);
    free(r->col);
    free(r);
    PASS("api_cancel_from_thread");
}

static void test_two_contexts(const dspark_model *m) {
    dspark_error e;
    dspark_ctx_params cp;
    dspark_ctx_params_default(&cp);
    cp.n_threads = 1;
    dspark_ctx *c1 = dspark_ctx_new(m, &cp, &e), *c2 = dspark_ctx_new(m, &cp, &e);
    CHECK(c1 && c2, "two contexts: %s", e.message);
    if (!c1 || !c2) { dspark_ctx_free(c1); dspark_ctx_free(c2); return; }
    int32_t p1[64], p2[64];
    int n1 = tokenize(m, "The river", p1, 64), n2 = tokenize(m, "Once upon a time there was", p2, 64);
    run_arg *alone = calloc(2, sizeof *alone), *both = calloc(2, sizeof *both);
    alone[0] = (run_arg){ .c = c1, .p = p1, .n = n1, .max_tokens = 60, .spec = 1, .temp = 0.0f };
    alone[1] = (run_arg){ .c = c2, .p = p2, .n = n2, .max_tokens = 60, .spec = 0, .temp = 0.9f };
    run_thread(&alone[0]);
    run_thread(&alone[1]);
    int same = 1;
    for (int rep = 0; rep < (san() ? 1 : 3); rep++) {
        both[0] = alone[0];
        both[1] = alone[1];
        pthread_t t0, t1;
        pthread_create(&t0, NULL, run_thread, &both[rep % 2]);
        pthread_create(&t1, NULL, run_thread, &both[1 - rep % 2]);
        pthread_join(t0, NULL);
        pthread_join(t1, NULL);
        for (int k = 0; k < 2; k++)
            same &= both[k].rc == DSPARK_OK && both[k].st.n_generated == alone[k].st.n_generated &&
                    !memcmp(both[k].out, alone[k].out, (size_t)alone[k].st.n_generated * sizeof(int32_t));
    }
    CHECK(alone[0].st.n_generated == 60 && alone[1].st.n_generated == 60, "lengths");
    CHECK(same, "two contexts at once differ from each alone");
    free(alone);
    free(both);
    dspark_ctx_free(c1);
    dspark_ctx_free(c2);
    PASS("api_two_contexts_at_once");
}

static void test_param_errors(const dspark_model *m, dspark_ctx *c) {
    int32_t p[600];
    int n = tokenize(m, "The river", p, 64);
    dspark_error e;
    dspark_gen_params gp;
    struct { const char *what; dspark_status want; } cases[] = {
        { "max_tokens 0", DSPARK_ERR_INVALID }, { "temperature -1", DSPARK_ERR_INVALID }, { "top_p 0", DSPARK_ERR_INVALID },
        { "min_p 2", DSPARK_ERR_INVALID }, { "top_k > vocab", DSPARK_ERR_INVALID }, { "draft_max > gamma", DSPARK_ERR_INVALID },
        { "bad token", DSPARK_ERR_INVALID }, { "prompt fills context", DSPARK_ERR_CONTEXT }, { "empty prompt", DSPARK_ERR_INVALID },
        { "commit 9", DSPARK_ERR_INVALID },
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        dspark_gen_params_default(&gp);
        int np = n;
        int32_t saved = p[0];
        switch (i) {
        case 0: gp.max_tokens = 0; break;
        case 1: gp.temperature = -1; break;
        case 2: gp.top_p = 0; break;
        case 3: gp.min_p = 2; break;
        case 4: gp.top_k = dspark_model_n_vocab(m) + 1; break;
        case 5: gp.draft_max = dspark_model_draft_block(m) + 1; break;
        case 6: p[0] = -5; break;
        case 7: np = dspark_ctx_n_ctx(c); for (int k = 0; k < np; k++) p[k] = p[k % n]; break;
        case 8: np = 0; break;
        case 9: gp.commit = (dspark_commit)9; break;
        }
        dspark_status rc = dspark_generate(c, p, np, &gp, NULL, NULL, &e);
        CHECK(rc == cases[i].want && e.code == rc && e.message[0], "%s: rc=%d msg='%s'", cases[i].what, rc, e.message);
        p[0] = saved;
    }
    /* PMIN through the API (the shipped drafter has a confidence head) */
    dspark_gen_params_default(&gp);
    gp.sched = DSPARK_SCHED_PMIN;
    gp.draft_p_min = 0.5f;
    gp.max_tokens = 20;
    dspark_stats st;
    int32_t a[20], b[20];
    CHECK(dspark_generate(c, p, n, &gp, a, &st, &e) == DSPARK_OK && st.speculative, "pmin: %s", e.message);
    /* TABLE: verify costs measured on this context at first use */
    gp.sched = DSPARK_SCHED_TABLE;
    gp.draft_p_min = 0.0f;
    CHECK(dspark_generate(c, p, n, &gp, b, &st, &e) == DSPARK_OK && st.speculative, "table: %s", e.message);
    int ng = st.n_generated;
    gp.speculative = 0;
    CHECK(dspark_generate(c, p, n, &gp, a, &st, &e) == DSPARK_OK && st.n_generated == ng && !memcmp(a, b, (size_t)ng * sizeof *a),
          "table scheduler output != plain");
    PASS("api_param_errors");
}

int main(void) {
    test_load_errors();
    dspark_error e;
    dspark_model_params mp;
    dspark_model_params_default(&mp);
    mp.model_path = target_path();
    mp.drafter_path = DRAFTER;
    mp.device = getenv("DSPARK_DEVICE");          /* as tests/cli_golden.sh: run the suite on another device */
    dspark_model *m = dspark_model_load(&mp, &e);
    CHECK(m != NULL, "load the shipped pair: %s", e.message);
    if (!m) return tu_finish("test_api");
    CHECK(dspark_model_has_drafter(m) && dspark_model_draft_block(m) == 7 && !strcmp(dspark_model_name(m), "dspark-tiny"),
          "model info");
    dspark_ctx_params cp;
    dspark_ctx_params_default(&cp);
    cp.n_threads = 1;                             /* the CI machine is 2 shared cores */
    dspark_ctx *c = dspark_ctx_new(m, &cp, &e);
    CHECK(c != NULL, "context: %s", e.message);
    if (c) {
        CHECK(dspark_ctx_n_ctx(c) == dspark_model_n_ctx_train(m), "default n_ctx");
        test_ctx_errors(m);
        test_tokens(m);
        test_spec_equals_plain(m, c);
        test_stream_and_stop(m, c);
        test_cancel_from_thread(m, c);
        test_param_errors(m, c);
        dspark_ctx_free(c);
    }
    test_two_contexts(m);
    dspark_model_free(m);
    return tu_finish("test_api");
}
