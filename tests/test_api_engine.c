/* test_api_engine.c — the batch engine through the public API only
 * (include/dspark.h): requests submitted to one engine and stepped together
 * give exactly dspark_generate's tokens on a context of their own; a batch
 * of two sequences gives each its solo logits; fork, truncate, prefix reuse,
 * save and load keep the bits; malformed batches, damaged files and a pool
 * too small are refused with the right codes. */
#include "dspark.h"
#include "testutil.h"

#include <math.h>

#define TARGET_F16 "models/dspark-tiny-f16.gguf"
#define NREQ 6
#define NPRED 24

typedef struct {
    int32_t got[NPRED];
    int n, done;
    char stop[16];
} req_out;

static int on_tok(void *user, int32_t token, const char *bytes, size_t n) {
    req_out *r = user;
    (void)bytes; (void)n;
    if (r->n < NPRED) r->got[r->n] = token;
    r->n++;
    return 0;
}
/* processors through the public API: what a token carried */
typedef struct {
    int32_t id[NPRED];
    float   lp[NPRED];
    int     n_top[NPRED];
    int32_t top_id[NPRED][4];
    float   top_lp[NPRED][4];
    int     n, stop_at, starts, done;
    dspark_status rc;
    char    stop[16];
    int     n_cached;
} ex_out;

static int on_tok_ex(void *user, const dspark_token *t) {
    ex_out *r = user;
    if (r->n < NPRED) {
        r->id[r->n] = t->id;
        r->lp[r->n] = t->logprob;
        r->n_top[r->n] = t->n_top;
        for (int k = 0; k < t->n_top && k < 4; k++) { r->top_id[r->n][k] = t->top_id[k]; r->top_lp[r->n][k] = t->top_logprob[k]; }
    }
    r->n++;
    return r->stop_at && r->n == r->stop_at ? DSPARK_STOP : 0;
}
static void on_start_ex(void *user) { ((ex_out *)user)->starts++; }
static void on_done_ex(void *user, dspark_status rc, const dspark_error *err, const dspark_stats *st) {
    ex_out *r = user;
    r->done++;
    r->rc = rc;
    snprintf(r->stop, sizeof r->stop, "%s", st->stop);
    r->n_cached = st->n_cached;
    (void)err;
}
static int ex_equal(const ex_out *a, const ex_out *b) {
    if (a->n != b->n || strcmp(a->stop, b->stop)) return 0;
    for (int i = 0; i < a->n && i < NPRED; i++)
        if (a->id[i] != b->id[i] || memcmp(&a->lp[i], &b->lp[i], sizeof(float)) || a->n_top[i] != b->n_top[i] ||
            memcmp(a->top_id[i], b->top_id[i], (size_t)a->n_top[i] * sizeof(int32_t)) ||
            memcmp(a->top_lp[i], b->top_lp[i], (size_t)a->n_top[i] * sizeof(float)))
            return 0;
    return 1;
}

static void on_done(void *user, const char *stop, int n_gen) {
    req_out *r = user;
    r->done++;
    snprintf(r->stop, sizeof r->stop, "%s", stop);
    (void)n_gen;
}

int main(void) {
    dspark_error err;
    dspark_model_params mp;
    dspark_model_params_default(&mp);
    mp.model_path = TARGET_F16;
    dspark_model *m = dspark_model_load(&mp, &err);
    if (!m) { printf("FAIL load: %s\n", err.message); return 1; }
    static const char *texts[NREQ] = {"The river", "In the beginning", "Once upon a time there was", "A",
                                      "The quick brown fox jumps over the lazy dog and", "Debian"};
    int32_t prompts[NREQ][64];
    int np[NREQ];
    for (int i = 0; i < NREQ; i++) np[i] = dspark_tokenize(m, texts[i], strlen(texts[i]), -1, 0, prompts[i], 64, &err);

    /* the server's default number of sequences: 1..64, never more for a
     * longer context, 8 without a model */
    {
        const int a = dspark_engine_default_seqs(m, 16), b = dspark_engine_default_seqs(m, 512);
        const int ok = a >= 1 && a <= 64 && b >= 1 && b <= a && dspark_engine_default_seqs(NULL, 16) == 8;
        printf("%s engine_default_seqs n_ctx=16: %d n_ctx=512: %d\n", ok ? "PASS" : "FAIL", a, b);
        if (!ok) return 1;
    }

    /* references: each request alone on its own context */
    int32_t ref[NREQ][NPRED];
    int nref[NREQ];
    dspark_ctx_params cp;
    dspark_ctx_params_default(&cp);
    cp.n_ctx = 512;
    dspark_ctx *c = dspark_ctx_new(m, &cp, &err);
    for (int i = 0; i < NREQ; i++) {
        dspark_gen_params gp;
        dspark_gen_params_default(&gp);
        gp.max_tokens = NPRED;
        gp.speculative = 0;
        gp.temperature = i % 2 ? 0.7f : 0.0f;
        gp.seed = 40 + (uint64_t)i;
        dspark_stats st;
        CHECK(dspark_generate(c, prompts[i], np[i], &gp, ref[i], &st, &err) == DSPARK_OK, "reference: %s", err.message);
        nref[i] = st.n_generated;
    }
    dspark_ctx_free(c);

    /* the scheduler: all six at once, on one engine */
    dspark_engine_params ep;
    dspark_engine_params_default(&ep);
    ep.n_ctx = 512;
    ep.step_rows = 32;                          /* prompts chunked, decode rows first */
    dspark_engine *e = dspark_engine_new(m, &ep, &err);
    CHECK(e != NULL, "engine: %s", err.message);
    req_out out[NREQ];
    memset(out, 0, sizeof out);
    for (int i = 0; i < NREQ; i++) {
        dspark_gen_params gp;
        dspark_gen_params_default(&gp);
        gp.max_tokens = NPRED;
        gp.temperature = i % 2 ? 0.7f : 0.0f;
        gp.seed = 40 + (uint64_t)i;
        gp.on_token = on_tok;
        gp.user = &out[i];
        CHECK(dspark_engine_submit(e, prompts[i], np[i], &gp, on_done, &err) > 0, "submit: %s", err.message);
    }
    int steps = 0;
    while (dspark_engine_step(e, &err) > 0) steps++;
    int same = 1;
    for (int i = 0; i < NREQ; i++)
        same &= out[i].done == 1 && out[i].n == nref[i] && !memcmp(out[i].got, ref[i], (size_t)nref[i] * sizeof(int32_t));
    CHECK(same, "requests stepped together != each alone");
    dspark_engine_stats es;
    dspark_engine_get_stats(e, &es);
    CHECK(es.requests_done == NREQ && es.pages_free == es.pages_total && es.running == 0, "stats after the run");
    if (same) printf("PASS engine scheduler: %d requests (greedy and seeded) in %d shared steps == dspark_generate alone\n", NREQ, steps);

    /* processors (logprobs and top lists, logit_bias, penalties, a grammar)
     * and a DSPARK_STOP, submitted with dspark_engine_submit_ex and stepped
     * together: the same ids, logprob bits and stops as dspark_generate */
    {
        dspark_grammar *g = dspark_grammar_new(m, dspark_grammar_json_object(), strlen(dspark_grammar_json_object()), &err);
        CHECK(g != NULL, "grammar: %s", err.message);
        const dspark_logit_bias bias[2] = {{13, -INFINITY}, {11, 4.0f}};
        dspark_gen_params gp[4];
        ex_out ref_ex[4], got[4];
        memset(ref_ex, 0, sizeof ref_ex);
        memset(got, 0, sizeof got);
        dspark_ctx *c2 = dspark_ctx_new(m, &cp, &err);
        for (int i = 0; i < 4; i++) {
            dspark_gen_params_default(&gp[i]);
            gp[i].max_tokens = NPRED;
            gp[i].speculative = 0;
            gp[i].temperature = i % 2 ? 0.8f : 0.0f;
            gp[i].seed = 7 + (uint64_t)i;
            gp[i].on_token_ex = on_tok_ex;
            gp[i].logprobs = 1;
            gp[i].top_logprobs = i == 3 ? 0 : 3;
        }
        gp[1].logit_bias = bias;
        gp[1].n_logit_bias = 2;
        gp[2].presence_penalty = 0.7f;
        gp[2].frequency_penalty = 1.1f;
        gp[3].grammar = g;
        ref_ex[0].stop_at = got[0].stop_at = 5;
        for (int i = 0; i < 4; i++) {
            gp[i].user = &ref_ex[i];
            dspark_stats st;
            CHECK(dspark_generate(c2, prompts[i], np[i], &gp[i], NULL, &st, &err) == DSPARK_OK, "processor reference: %s", err.message);
            snprintf(ref_ex[i].stop, sizeof ref_ex[i].stop, "%s", st.stop);
        }
        dspark_ctx_free(c2);
        const dspark_engine_callbacks cbs = {on_start_ex, on_done_ex};
        for (int i = 0; i < 4; i++) {
            gp[i].user = &got[i];
            CHECK(dspark_engine_submit_ex(e, prompts[i], np[i], &gp[i], &cbs, &err) > 0, "submit_ex: %s", err.message);
        }
        while (dspark_engine_step(e, &err) > 0) {}
        int eq = 1;
        for (int i = 0; i < 4; i++) eq &= got[i].done == 1 && got[i].starts == 1 && got[i].rc == DSPARK_OK && ex_equal(&got[i], &ref_ex[i]);
        CHECK(eq, "processor requests through the engine != dspark_generate alone");
        CHECK(!strcmp(got[0].stop, "stop") && got[0].n == 5 && ref_ex[0].n_top[0] == 3 && got[3].n_top[0] == 0 && got[3].lp[0] < 0,
              "DSPARK_STOP, top lists, logprobs: stop %s after %d", got[0].stop, got[0].n);
        /* refused at submit with dspark_generate's checks */
        dspark_gen_params bad = gp[0];
        bad.top_logprobs = 25;
        CHECK(dspark_engine_submit_ex(e, prompts[0], np[0], &bad, &cbs, &err) < 0 && err.code == DSPARK_ERR_INVALID,
              "top_logprobs 25 refused: %s", err.message);
        bad = gp[0];
        bad.presence_penalty = 3.0f;
        CHECK(dspark_engine_submit(e, prompts[0], np[0], &bad, on_done, &err) < 0 && err.code == DSPARK_ERR_INVALID,
              "presence_penalty 3 refused");
        dspark_grammar_free(g);
        if (eq) PASS("engine processors: logprobs/top, logit_bias, penalties, a grammar, DSPARK_STOP == dspark_generate alone");
    }

    /* a batch of two sequences' prompts: each row's logits == that sequence alone */
    const int V = dspark_model_n_vocab(m);
    float *solo = malloc(2 * (size_t)V * sizeof(float));
    for (int w = 0; w < 2; w++) {
        int s = dspark_seq_new(e, &err);
        int32_t pos[64], seq[64];
        for (int k = 0; k < np[w + 2]; k++) { pos[k] = k; seq[k] = s; }
        dspark_batch b = {np[w + 2], prompts[w + 2], pos, seq, NULL, NULL};
        CHECK(dspark_decode(e, &b, &err) == DSPARK_OK, "solo decode: %s", err.message);
        memcpy(solo + (size_t)w * V, dspark_get_logits(e, np[w + 2] - 1), (size_t)V * sizeof(float));
        dspark_seq_free(e, s);
    }
    int sa = dspark_seq_new(e, &err), sb = dspark_seq_new(e, &err);
    int32_t tok[128], pos[128], seq[128];
    int8_t outf[128];
    int n = 0;
    for (int w = 0; w < 2; w++)
        for (int k = 0; k < np[w + 2]; k++, n++) {
            tok[n] = prompts[w + 2][k];
            pos[n] = k;
            seq[n] = w ? sb : sa;
            outf[n] = k == np[w + 2] - 1 ? DSPARK_OUT_LOGITS | DSPARK_OUT_TOKEN : 0;
        }
    dspark_batch b2 = {n, tok, pos, seq, outf, NULL};
    CHECK(dspark_decode(e, &b2, &err) == DSPARK_OK, "two-sequence decode: %s", err.message);
    CHECK(!memcmp(dspark_get_logits(e, np[2] - 1), solo, (size_t)V * sizeof(float)) &&
              !memcmp(dspark_get_logits(e, n - 1), solo + V, (size_t)V * sizeof(float)) && dspark_get_logits(e, 0) == NULL &&
              dspark_get_token(e, n - 1) >= 0,
          "two sequences in one batch != each alone");
    /* fork, save, load: the continuation's logits equal the original's */
    int sf = dspark_seq_fork(e, sb, np[3], &err);
    CHECK(sf >= 0 && dspark_seq_n_pos(e, sf) == np[3], "fork: %s", err.message);
    char dir[256], path[300];
    tu_tmpdir(dir, sizeof dir);
    snprintf(path, sizeof path, "%s/seq.bin", dir);
    CHECK(dspark_seq_save(e, sb, path, &err) == DSPARK_OK, "save: %s", err.message);
    int sl = dspark_seq_load(e, path, &err);
    CHECK(sl >= 0 && dspark_seq_n_pos(e, sl) == np[3], "load: %s", err.message);
    float *cont = malloc(3 * (size_t)V * sizeof(float));
    const int ss[3] = {sb, sf, sl};
    for (int k = 0; k < 3; k++) {
        int32_t t1 = 42, p1 = np[3], q1 = ss[k];
        dspark_batch b1 = {1, &t1, &p1, &q1, NULL, NULL};
        CHECK(dspark_decode(e, &b1, &err) == DSPARK_OK, "continue %d: %s", k, err.message);
        memcpy(cont + (size_t)k * V, dspark_get_logits(e, 0), (size_t)V * sizeof(float));
    }
    CHECK(!memcmp(cont, cont + V, (size_t)V * sizeof(float)) && !memcmp(cont, cont + 2 * (size_t)V, (size_t)V * sizeof(float)),
          "fork / save+load continuations differ from the original");
    /* truncate and prefix reuse */
    CHECK(dspark_seq_truncate(e, sb, 2, &err) == DSPARK_OK && dspark_seq_n_pos(e, sb) == 2, "truncate");
    CHECK(dspark_seq_truncate(e, sb, 99, &err) == DSPARK_ERR_INVALID, "truncate past the end refused");
    /* damaged files and bad batches */
    FILE *f = fopen(path, "r+b");
    if (f) { fseek(f, 0, SEEK_END); long sz = ftell(f); fclose(f); CHECK(truncate(path, sz - 4) == 0, "truncate file"); }
    CHECK(dspark_seq_load(e, path, &err) == -1 && err.code == DSPARK_ERR_LOAD, "a truncated file is refused: %s", err.message);
    CHECK(dspark_seq_load(e, TARGET_F16, &err) == -1 && err.code == DSPARK_ERR_LOAD, "a GGUF is not a sequence file: %s", err.message);
    int32_t bt = 1, bp = 500, bs = sa;
    dspark_batch bad = {1, &bt, &bp, &bs, NULL, NULL};
    CHECK(dspark_decode(e, &bad, &err) == DSPARK_ERR_INVALID, "a position past the sequence is refused: %s", err.message);
    bs = 999;
    bp = 0;
    CHECK(dspark_decode(e, &bad, &err) == DSPARK_ERR_INVALID, "an unknown sequence is refused: %s", err.message);
    dspark_engine_free(e);
    /* a pool too small: NOMEM, nothing run */
    dspark_engine_params tiny;
    dspark_engine_params_default(&tiny);
    tiny.n_ctx = 512;
    tiny.n_pages = 2;
    e = dspark_engine_new(m, &tiny, &err);
    int s0 = dspark_seq_new(e, &err);
    int32_t tt[40], tp[40], tq[40];
    for (int k = 0; k < 40; k++) { tt[k] = 5; tp[k] = k; tq[k] = s0; }
    dspark_batch bb = {40, tt, tp, tq, NULL, NULL};
    CHECK(dspark_decode(e, &bb, &err) == DSPARK_ERR_NOMEM && dspark_seq_n_pos(e, s0) == 0, "no pages: %s", err.message);
    dspark_engine_free(e);
    tu_rmdir(dir);
    free(solo); free(cont);
    dspark_model_free(m);
    PASS("engine API: two-sequence batch == alone, fork / save / load continue bit for bit, refusals with codes");
    return tu_finish("test_api_engine");
}
