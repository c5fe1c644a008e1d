/* test_tp.c — tensor parallelism whose bits do not depend on the number of
 * ranks (issue 25, src/tp.c, docs/TP.md), on CPU ranks in one process.
 *
 *   1. the communicator fake: all_gather is a rank-major copy (also in
 *      place), all_reduce_sum adds in rank order (an order-sensitive sum
 *      proves which order);
 *   2. TP = 1 (the plain engine), 2 and 4 ranks (where the model's KV heads
 *      divide): a 70-row prefill (two chunks) with every row's logits and
 *      taps, greedy decode steps, and every layer's KV rows — memcmp
 *      identical; on the shipped Q8_0 and F16 targets and on random qwen3
 *      (F16) and llama (Q8_0) models with 4 KV heads;
 *   3. generated tokens, plain greedy and seeded, and speculative (the
 *      shipped pair) at TP = 2 identical to TP = 1;
 *   4. the counter-test: the fast tp_reduce layout (row-parallel all-reduce)
 *      moves logits at TP = 2 and 4 — so the comparisons above can see a
 *      layout that changes bits — and is a no-op without ranks;
 *   state: ds_state_save / restore at TP = 2 (what diverge's S0 needs);
 *   5. refusals: N that does not divide, N out of range, a MoE model, --tp
 *      after the first forward, the fast layout where K does not split into
 *      whole blocks: one line each. */
#include "comm.h"
#include "drafter.h"
#include "generate.h"
#include "model.h"
#include "model_make.h"
#include "spec.h"
#include "testutil.h"

#include <math.h>

#define P_ROWS 70                /* more than a CPU chunk (64): two chunks */
#define STEPS  4

/* First differing float of a and b (n floats), printed with both values; 0
 * when identical. */
static int diff_at(const float *a, const float *b, size_t n, const char *what, const char *model, int tp) {
    if (!memcmp(a, b, n * sizeof(float))) return 0;
    size_t i = 0;
    while (i < n && !memcmp(a + i, b + i, sizeof(float))) i++;
    printf("  %s %s tp=%d: first difference at float %zu of %zu: %.9g vs %.9g\n", model, what, tp, i, n, a[i], b[i]);
    return 1;
}

/* ========================================================================
 * 1. the communicator fake
 * ===================================================================== */
static void test_comm(void) {
    char err[DS_ERRLEN];
    ds_comm *c = ds_comm_cpu_new(3, 4, err, sizeof err);
    CHECK(c != NULL, "comm: %s", err);
    if (!c) return;
    float send[3][2] = {{1, 2}, {3, 4}, {5, 6}}, recv[3][6];
    const float *s[3] = {send[0], send[1], send[2]};
    float *r[3] = {recv[0], recv[1], recv[2]};
    ds_exec *ex[3] = {NULL, NULL, NULL};
    CHECK(c->i->all_gather(c, ex, s, r, 2, err, sizeof err) == 0, "all_gather: %s", err);
    int ok = 1;
    for (int k = 0; k < 3; k++)
        for (int i = 0; i < 6; i++) ok &= recv[k][i] == (float)(i + 1);
    CHECK(ok, "all_gather: every rank receives 1..6 in rank order");
    /* in place: rank k's contribution already at its offset of recv[k] */
    float ip[3][6];
    for (int k = 0; k < 3; k++) {
        memset(ip[k], 0, sizeof ip[k]);
        ip[k][2 * k] = (float)(10 * k + 1);
        ip[k][2 * k + 1] = (float)(10 * k + 2);
        s[k] = ip[k] + 2 * k;
        r[k] = ip[k];
    }
    CHECK(c->i->all_gather(c, ex, s, r, 2, err, sizeof err) == 0, "in-place all_gather: %s", err);
    ok = 1;
    for (int k = 0; k < 3; k++)
        for (int i = 0; i < 6; i++) ok &= ip[k][i] == (float)(10 * (i / 2) + 1 + i % 2);
    CHECK(ok, "in-place all_gather");
    /* rank order: (1e8 + 1) - 1e8 = 0 in f32; any other order gives 1 */
    float a0[1] = {1e8f}, a1[1] = {1.0f}, a2[1] = {-1e8f}, o[3][1];
    const float *sr[3] = {a0, a1, a2};
    float *rr[3] = {o[0], o[1], o[2]};
    CHECK(c->i->all_reduce_sum(c, ex, sr, rr, 1, err, sizeof err) == 0, "all_reduce: %s", err);
    CHECK(o[0][0] == 0.0f && o[1][0] == 0.0f && o[2][0] == 0.0f, "all_reduce: rank order ((1e8 + 1) - 1e8 = 0), got %g %g %g",
          o[0][0], o[1][0], o[2][0]);
    const float *sw[3] = {a0, a2, a1};    /* the mutation: another order, another sum */
    CHECK(c->i->all_reduce_sum(c, ex, sw, rr, 1, err, sizeof err) == 0 && o[0][0] == 1.0f,
          "all_reduce: the swapped order gives 1 (the test sees the order), got %g", o[0][0]);
    CHECK(c->i->all_reduce_sum(c, ex, sr, rr, 5, err, sizeof err) == -1 && strstr(err, "exceeds"),
          "all_reduce wider than the staging is refused: %s", err);
    ds_comm_free(c);
    CHECK(ds_comm_cpu_new(0, 1, err, sizeof err) == NULL && strstr(err, "ranks"), "0 ranks refused");
    CHECK(ds_comm_cpu_new(DS_TP_MAX + 1, 1, err, sizeof err) == NULL, "%d ranks refused", DS_TP_MAX + 1);
    PASS("comm: all_gather (also in place) and the rank-ordered all_reduce");
}

/* ========================================================================
 * 2. logits, taps, KV rows at TP = 1, 2, 4
 * ===================================================================== */
typedef struct {
    float *logits, *taps, *k, *v;
    size_t n_logits, n_taps, n_kv;
} run_out;

static void run_free(run_out *o) {
    free(o->logits);
    free(o->taps);
    free(o->k);
    free(o->v);
    memset(o, 0, sizeof *o);
}

/* A context on m at tp ranks (fast: tp_reduce fast): the P_ROWS prefill
 * (every row's logits and taps), STEPS greedy decode steps (their logits),
 * then every position's KV rows. 0, or -1 with err. */
static int run_model(const ds_model *m, int tp, int fast, run_out *o, char *err, size_t errlen) {
    const ds_hparams *hp = &m->hp;
    const size_t V = (size_t)hp->n_vocab, d = (size_t)hp->n_embd, N = P_ROWS + STEPS;
    const size_t kvd = (size_t)hp->n_head_kv * hp->head_dim;
    memset(o, 0, sizeof *o);
    ds_ctx *c = ds_ctx_new(m, 128, 2, err, errlen);
    if (!c) return -1;
    int rc = -1;
    ds_kernel_set ks;
    ds_kernel_set_all(&ks, DS_CANONICAL);
    if (fast) ks.v[DS_FAM_TP_REDUCE] = DS_FAST;
    ds_ctx_set_kernels(c, &ks);
    const int taps[2] = {0, hp->n_layer - 1};
    int32_t toks[P_ROWS];
    for (int i = 0; i < P_ROWS; i++) toks[i] = (int32_t)((i * 2654435761u) % (unsigned)hp->n_vocab);
    o->n_logits = (P_ROWS + STEPS) * V;
    o->n_taps = P_ROWS * 2 * d;
    o->n_kv = (size_t)ds_hp_kv_layers(hp) * N * kvd;
    o->logits = malloc(o->n_logits * sizeof(float));
    o->taps = malloc(o->n_taps * sizeof(float));
    o->k = malloc(o->n_kv * sizeof(float));
    o->v = malloc(o->n_kv * sizeof(float));
    if (!o->logits || !o->taps || !o->k || !o->v) { ds_errf(err, errlen, "out of memory"); goto out; }
    if ((tp > 1 && ds_ctx_set_tp(c, tp, err, errlen)) || ds_set_taps(c, taps, 2, err, errlen) ||
        ds_forward_batch(c, toks, P_ROWS, 0, DS_LOGITS_ALL, o->logits, o->taps, err, errlen))
        goto out;
    for (int s = 0; s < STEPS; s++) {
        const float *prev = o->logits + (size_t)(P_ROWS - 1 + s) * V;
        if (ds_decode(c, (int32_t)ds_argmax(prev, (int)V), P_ROWS + s, o->logits + (size_t)(P_ROWS + s) * V, NULL, err,
                      errlen))
            goto out;
    }
    ds_ctx_read_kv(c, 0, (int)N, o->k, o->v);
    rc = 0;
out:
    ds_ctx_free(c);
    if (rc) run_free(o);
    return rc;
}

/* The model at TP = 1 (the plain engine) against each listed N. */
static void tp_identity(const char *path, const char *name, const int *ns, int n_ns) {
    char err[DS_ERRLEN];
    ds_model *m = ds_model_load_on(path, tu_device(), err, sizeof err);
    CHECK(m != NULL, "%s: %s", path, err);
    if (!m) return;
    run_out ref, got;
    if (run_model(m, 1, 0, &ref, err, sizeof err)) {
        CHECK(0, "%s tp=1: %s", name, err);
        ds_model_free(m);
        return;
    }
    for (int i = 0; i < n_ns; i++) {
        const int n = ns[i];
        if (run_model(m, n, 0, &got, err, sizeof err)) {
            CHECK(0, "%s tp=%d: %s", name, n, err);
            continue;
        }
        const int bad = diff_at(ref.logits, got.logits, ref.n_logits, "logits", name, n) |
                        diff_at(ref.taps, got.taps, ref.n_taps, "taps", name, n) |
                        diff_at(ref.k, got.k, ref.n_kv, "K rows", name, n) | diff_at(ref.v, got.v, ref.n_kv, "V rows", name, n);
        CHECK(!bad, "%s: tp=%d differs from tp=1", name, n);
        if (!bad)
            printf("PASS %s tp=%d: %d prefill rows + %d decode steps of logits, taps and every layer's KV rows identical to tp=1\n",
                   name, n, P_ROWS, STEPS);
        run_free(&got);
        /* the counter-test: the row-parallel layout moves bits at this N */
        if (run_model(m, n, 1, &got, err, sizeof err)) {
            /* a type whose blocks K / N does not fill has no fast layout (refusals below) */
            CHECK(strstr(err, "whole blocks") != NULL, "%s tp=%d fast: %s", name, n, err);
            continue;
        }
        size_t nd = 0;
        for (size_t j = 0; j < ref.n_logits; j++) nd += memcmp(ref.logits + j, got.logits + j, sizeof(float)) != 0;
        /* Q8_0 targets: each matmul quantizes its input rows to 8 bits, which
         * absorbs the last-bit differences of the partial sums on the tiny
         * model — the counter-test is made where it can show (F16); for Q8_0
         * it is reported, not required */
        if (m->weight_type != DS_TYPE_Q8_0)
            CHECK(nd > 0, "%s tp=%d: the fast tp_reduce layout gave the canonical logits (the test could not see a layout that moves bits)",
                  name, n);
        printf("%s %s tp=%d fast tp_reduce: %zu of %zu logits differ from tp=1\n", nd ? "PASS" : "NOTE", name, n, nd, ref.n_logits);
        run_free(&got);
    }
    /* without ranks the family has nothing to do: fast at TP = 1 is canonical */
    if (run_model(m, 1, 1, &got, err, sizeof err) == 0) {
        CHECK(!diff_at(ref.logits, got.logits, ref.n_logits, "logits (fast tp_reduce, tp=1)", name, 1),
              "%s: fast tp_reduce at tp=1 moved bits", name);
        run_free(&got);
    }
    run_free(&ref);
    ds_model_free(m);
}

static int make(const char *dir, const char *file, const char *arch, uint32_t type, long n_expert, char *path, size_t n) {
    ds_make_model_opts o;
    ds_make_model_defaults(&o);
    o.arch = arch;
    o.type = type;
    o.n_embd = 256; o.n_layer = 2; o.n_head = 8; o.n_head_kv = 4; o.head_dim = 32; o.n_ff = 512;
    o.n_vocab = 384; o.n_ctx = 256; o.seed = 11;
    if (n_expert) { o.n_expert = n_expert; o.n_expert_used = 2; o.n_ff_exp = 128; }
    snprintf(path, n, "%s/%s", dir, file);
    char err[DS_ERRLEN];
    if (ds_make_model(&o, path, err, sizeof err)) {
        CHECK(0, "make-model %s: %s", file, err);
        return -1;
    }
    return 0;
}

/* ========================================================================
 * 3. generated tokens: plain greedy / seeded, speculative
 * ===================================================================== */
static void test_generate(void) {
    char err[DS_ERRLEN];
    ds_model *m = ds_model_load_on(tu_shipped_target(), tu_device(), err, sizeof err);
    CHECK(m != NULL, "%s", err);
    if (!m) return;
    ds_drafter *dr = ds_drafter_load("models/dspark-tiny-drafter-f16.gguf", m, err, sizeof err);
    CHECK(dr != NULL, "drafter: %s", err);
    const int32_t prompt[6] = {84, 104, 101, 32, 114, 105};
    enum { NG = 40 };
    int32_t out[2][3][2][NG];     /* [tp 1|2][greedy|seeded|spec greedy][..][NG]; [.][.][1]: spec seeded */
    memset(out, 0, sizeof out);
    for (int t = 0; t < 2; t++) {
        for (int s = 0; s < 2; s++) {
            ds_ctx *c = ds_ctx_new(m, 256, 2, err, sizeof err);
            CHECK(c != NULL, "%s", err);
            if (!c) continue;
            if (t && ds_ctx_set_tp(c, 2, err, sizeof err)) { CHECK(0, "%s", err); ds_ctx_free(c); continue; }
            ds_sampler smp = {s ? 0.8f : 0.0f, 0, 1.0f, 7, 0.0f};
            ds_gen_opts o = {NG, DS_PREFILL_BATCH, 0, NULL, NULL};
            ds_gen_stats st;
            CHECK(ds_generate(c, prompt, 6, &o, &smp, out[t][s][0], &st, err, sizeof err) == 0, "generate: %s", err);
            if (dr) {
                ds_spec_opts so;
                ds_spec_opts_default(&so);
                so.n_predict = NG;
                so.stop_at_eog = 0;
                so.samp = smp;
                ds_spec_stats ss;
                CHECK(ds_spec_generate(c, dr, prompt, 6, &so, out[t][2][s], &ss, err, sizeof err) == 0, "spec tp=%d: %s",
                      t ? 2 : 1, err);
            }
            ds_ctx_free(c);
        }
    }
    for (int s = 0; s < 2; s++) {
        CHECK(!memcmp(out[0][s][0], out[1][s][0], sizeof out[0][s][0]), "plain %s: tp=2 tokens differ from tp=1",
              s ? "seeded" : "greedy");
        if (dr) {
            CHECK(!memcmp(out[1][2][s], out[1][s][0], sizeof out[1][s][0]), "speculative %s at tp=2 differs from plain",
                  s ? "seeded" : "greedy");
            CHECK(!memcmp(out[1][2][s], out[0][2][s], sizeof out[1][s][0]), "speculative %s: tp=2 differs from tp=1",
                  s ? "seeded" : "greedy");
        }
    }
    printf("PASS generate: %d tokens plain greedy and seeded (T=0.8) %sat tp=2 identical to tp=1\n", NG,
           dr ? "and speculative (the shipped pair) " : "");
    ds_drafter_free(dr);
    ds_model_free(m);
}

/* ========================================================================
 * state snapshots at TP = 2 (diverge's S0): every rank's rows come back
 * ===================================================================== */
static void test_state(void) {
    char err[DS_ERRLEN];
    ds_model *m = ds_model_load_on("models/dspark-tiny-f16.gguf", tu_device(), err, sizeof err);
    CHECK(m != NULL, "%s", err);
    if (!m) return;
    ds_ctx *c = ds_ctx_new(m, 64, 2, err, sizeof err);
    const size_t V = (size_t)m->hp.n_vocab;
    float *l[3];
    for (int i = 0; i < 3; i++) l[i] = malloc(4 * V * sizeof(float));
    const int32_t prompt[6] = {84, 104, 101, 32, 114, 105}, other[6] = {7, 8, 9, 10, 11, 12}, blk[4] = {50, 60, 70, 80};
    ds_state s0;
    memset(&s0, 0, sizeof s0);
    int ok = c && l[0] && l[1] && l[2] && ds_ctx_set_tp(c, 2, err, sizeof err) == 0 &&
             ds_forward_batch(c, prompt, 6, 0, DS_LOGITS_NONE, NULL, NULL, err, sizeof err) == 0 && ds_state_save(c, &s0) == 0 &&
             ds_forward_batch(c, blk, 4, 6, DS_LOGITS_ALL, l[0], NULL, err, sizeof err) == 0 &&
             /* overwrite the prompt's rows on every rank, restore, rerun */
             ds_forward_batch(c, other, 6, 0, DS_LOGITS_NONE, NULL, NULL, err, sizeof err) == 0 &&
             ds_forward_batch(c, blk, 4, 6, DS_LOGITS_ALL, l[2], NULL, err, sizeof err) == 0 && ds_state_restore(c, &s0) == 0 &&
             ds_forward_batch(c, blk, 4, 6, DS_LOGITS_ALL, l[1], NULL, err, sizeof err) == 0;
    CHECK(ok, "state at tp=2: %s", err);
    if (ok) {
        CHECK(!diff_at(l[0], l[1], 4 * V, "logits after restore", "shipped-f16", 2), "tp=2: restored S0 gives other logits");
        CHECK(memcmp(l[0], l[2], 4 * V * sizeof(float)) != 0, "tp=2: overwritten prompt rows did not change the logits (the restore test is blind)");
        PASS("state at tp=2: ds_state_restore brings every rank's KV rows back (an overwritten prompt changes the logits until then)");
    }
    ds_state_free(&s0);
    for (int i = 0; i < 3; i++) free(l[i]);
    ds_ctx_free(c);
    ds_model_free(m);
}

/* ========================================================================
 * the collectives a decode step issues: 4 all-gathers a layer (canonical),
 * 2 all-reduces a layer (fast), and the bytes a rank receives
 * ===================================================================== */
static void test_stats(void) {
    char err[DS_ERRLEN];
    ds_model *m = ds_model_load_on(tu_shipped_target(), tu_device(), err, sizeof err);
    CHECK(m != NULL, "%s", err);
    if (!m) return;
    const ds_hparams *hp = &m->hp;
    const double qr = (double)hp->n_head / 2 * hp->head_dim, dr = hp->n_embd / 2.0, ffr = hp->n_ff / 2.0;
    for (int fast = 0; fast < 2; fast++) {
        ds_ctx *c = ds_ctx_new(m, 64, 2, err, sizeof err);
        if (!c) { CHECK(0, "%s", err); continue; }
        ds_kernel_set ks;
        ds_kernel_set_all(&ks, DS_CANONICAL);
        ks.v[DS_FAM_TP_REDUCE] = fast ? DS_FAST : DS_CANONICAL;
        ds_ctx_set_kernels(c, &ks);
        long g = -1, r = -1;
        double by = -1;
        ds_ctx_tp_stats(c, &g, &r, &by);
        CHECK(g == 0 && r == 0 && by == 0, "no --tp: no collectives");
        const int32_t t[3] = {3, 4, 5};
        CHECK(ds_ctx_set_tp(c, 2, err, sizeof err) == 0 &&
                  ds_forward_batch(c, t, 3, 0, DS_LOGITS_NONE, NULL, NULL, err, sizeof err) == 0,
              "%s", err);
        ds_ctx_tp_stats(c, &g, &r, &by);
        const double L = hp->n_layer;
        if (!fast)
            CHECK(g == 4 * hp->n_layer && r == 0 && by == 3 * L * (qr + dr + ffr + dr) * 4,
                  "canonical: %ld gathers %ld reduces %.0f bytes (want %d, 0, %.0f)", g, r, by, 4 * hp->n_layer,
                  3 * L * (qr + dr + ffr + dr) * 4);
        else
            CHECK(g == 0 && r == 2 * hp->n_layer && by == 3 * L * 2 * hp->n_embd * 4,
                  "fast: %ld gathers %ld reduces %.0f bytes (want 0, %d, %.0f)", g, r, by, 2 * hp->n_layer, 3 * L * 2 * hp->n_embd * 4.0);
        ds_ctx_free(c);
    }
    PASS("collectives: 4 all-gathers a layer (canonical), 2 all-reduces a layer (fast tp_reduce), the bytes a rank receives");
    ds_model_free(m);
}

/* ========================================================================
 * 5. refusals
 * ===================================================================== */
static void test_refusals(const char *dir) {
    char err[DS_ERRLEN], path[600];
    ds_model *m = ds_model_load_on(tu_shipped_target(), tu_device(), err, sizeof err);
    CHECK(m != NULL, "%s", err);
    if (!m) return;
    ds_ctx *c = ds_ctx_new(m, 64, 1, err, sizeof err);
    CHECK(c != NULL, "%s", err);
    if (c) {
        CHECK(ds_ctx_set_tp(c, 3, err, sizeof err) == -1 && strstr(err, "KV heads") && !strchr(err, '\n'),
              "tp 3 on 2 KV heads: one line naming the KV heads, got '%s'", err);
        CHECK(ds_ctx_set_tp(c, 4, err, sizeof err) == -1 && strstr(err, "KV heads"), "tp 4 on 2 KV heads: '%s'", err);
        CHECK(ds_ctx_set_tp(c, 0, err, sizeof err) == -1 && strstr(err, "out of range"), "tp 0: '%s'", err);
        CHECK(ds_ctx_set_tp(c, DS_TP_MAX + 1, err, sizeof err) == -1 && strstr(err, "out of range"), "tp 9: '%s'", err);
        CHECK(ds_ctx_tp(c) == 1, "a refused --tp leaves the context plain");
        int32_t t = 5;
        CHECK(ds_decode(c, t, 0, NULL, NULL, err, sizeof err) == 0, "%s", err);
        CHECK(ds_ctx_set_tp(c, 2, err, sizeof err) == -1 && strstr(err, "already holds"), "tp after a forward: '%s'", err);
        ds_ctx_free(c);
    }
    ds_model_free(m);
    /* a MoE model has no tensor-parallel layout */
    if (make(dir, "moe.gguf", "qwen3moe", DS_TYPE_Q8_0, 4, path, sizeof path) == 0) {
        m = ds_model_load_on(path, tu_device(), err, sizeof err);
        CHECK(m != NULL, "%s", err);
        if (m) {
            c = ds_ctx_new(m, 64, 1, err, sizeof err);
            CHECK(c && ds_ctx_set_tp(c, 2, err, sizeof err) == -1 && strstr(err, "tensor-parallel"), "MoE refused: '%s'", err);
            ds_ctx_free(c);
            ds_model_free(m);
        }
    }
    /* Q4_K: the canonical layout splits rows and runs; the fast one would
     * split K into 128-wide slices of 256-wide blocks, and says so */
    if (make(dir, "q4k.gguf", "qwen3", DS_TYPE_Q4_K, 0, path, sizeof path) == 0) {
        m = ds_model_load_on(path, tu_device(), err, sizeof err);
        CHECK(m != NULL, "%s", err);
        if (m) {
            const int ns[1] = {2};
            c = ds_ctx_new(m, 64, 1, err, sizeof err);
            if (c) {
                ds_kernel_set ks;
                ds_kernel_set_all(&ks, DS_CANONICAL);
                ks.v[DS_FAM_TP_REDUCE] = DS_FAST;
                ds_ctx_set_kernels(c, &ks);
                int32_t t[2] = {1, 2};
                float *lg = malloc((size_t)m->hp.n_vocab * sizeof(float));
                CHECK(ds_ctx_set_tp(c, 2, err, sizeof err) == 0, "q4_k tp=2: %s", err);
                CHECK(lg && ds_forward_batch(c, t, 2, 0, DS_LOGITS_LAST, lg, NULL, err, sizeof err) == -1 &&
                          strstr(err, "whole blocks") && !strchr(err, '\n'),
                      "fast tp_reduce where K does not split into whole Q4_K blocks: one line, got '%s'", err);
                free(lg);
                ds_ctx_free(c);
            }
            ds_model_free(m);
            tp_identity(path, "random-qwen3-q4_k", ns, 1);
        }
    }
    PASS("refusals: N that does not divide the KV heads, N out of range, --tp after a forward, MoE, fast without whole K blocks");
}

int main(void) {
    char dir[512], path[600];
    tu_tmpdir(dir, sizeof dir);
    test_comm();
    const int two[1] = {2}, four[2] = {2, 4};
    tp_identity(tu_shipped_target(), "shipped-q8_0", two, 1);
    tp_identity("models/dspark-tiny-f16.gguf", "shipped-f16", two, 1);
    if (make(dir, "qwen3-f16.gguf", "qwen3", DS_TYPE_F16, 0, path, sizeof path) == 0)
        tp_identity(path, "random-qwen3-f16", four, 2);
    if (make(dir, "llama-q8.gguf", "llama", DS_TYPE_Q8_0, 0, path, sizeof path) == 0)
        tp_identity(path, "random-llama-q8_0", four, 2);
    if (make(dir, "llama-f32.gguf", "llama", DS_TYPE_F32, 0, path, sizeof path) == 0)
        tp_identity(path, "random-llama-f32", four, 2);
    test_generate();
    test_state();
    test_stats();
    test_refusals(dir);
    tu_rmdir(dir);
    return tu_finish("test_tp");
}
