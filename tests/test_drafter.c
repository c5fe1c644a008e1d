/* test_drafter.c — the DSpark drafter (src/drafter*.c) on a tiny random
 * target (qwen3, n_embd 64, 3 layers, vocab 300) and random drafters from
 * ds_make_drafter:
 *   tier1      synthetic taps -> finite logits of the right shape
 *   tier2      dspark vs the independent double-precision reference
 *              (tests/drafter_ref.h) through ref.bin (seed 004's layout),
 *              vanilla / gated / rnn / no-Markov / correction, rel. 1e-4
 *   oracle     the correction head recomputed in double from dspark's own
 *              trunk hidden
 *   mask       z[MASK] = -1e6 and every other logit bitwise unchanged
 *   prefix     n_keep = k gives exactly the first k ids / logits / conf
 *   reuse      cached MASK layer-0 projections == recomputation (bitwise),
 *              and two identical rounds give identical bits
 *   greedy     ids == argmax of the returned logits; sampled ids ==
 *              ds_sample(z_k, p+k+1)
 *   layouts    dflash and legacy dspark files of the same weights agree
 *   head       the drafter's LM head is the target's memory
 *   contracts  bad files and bad calls are rejected with one clear line
 *              before any output; ds_dctx_truncate / append semantics.
 *   chain      the CPU backend's head chain splits the vocabulary over its
 *              threads: the winner it combines from the ranges is
 *              ds_argmax's (ties across ranges, NaN ranges, NaN but the
 *              mask, the mask) and the logits are z + W2 e with the mask, for 1..4
 *              threads. */
#include "drafter.h"
#include "drafter_internal.h"
#include "drafter_make.h"
#include "model_make.h"
#include "sampler.h"
#include "testutil.h"
#include "drafter_ref.h"

#include <math.h>

static char g_dir[256], g_target[320];
static ds_model *g_tm;
static int g_V, g_D;

/* ---- helpers --------------------------------------------------------------- */

static void pathf(char *buf, size_t n, const char *name) { snprintf(buf, n, "%s/%s", g_dir, name); }

typedef struct {
    const char *layout, *markov;
    int rank, conf, corr, gamma, n_layer;
    uint32_t type;
    long seed;
} mk_t;

/* write a drafter; returns 0 */
static int mkd(const char *file, mk_t m, char *path, size_t n) {
    ds_make_drafter_opts o;
    ds_make_drafter_defaults(&o);
    o.layout = m.layout ? m.layout : "dflash";
    o.markov = m.markov ? m.markov : "vanilla";
    o.rank = m.rank;
    o.confidence = m.conf;
    o.correction = m.corr;
    o.block_size = m.gamma ? m.gamma : 8;
    o.n_layer = m.n_layer ? m.n_layer : 2;
    o.type = m.type;
    o.seed = m.seed ? m.seed : 7;
    pathf(path, n, file);
    char err[DS_ERRLEN];
    int rc = ds_make_drafter(&o, g_tm, path, err, sizeof err);
    if (rc) printf("make-drafter %s: %s\n", file, err);
    return rc;
}

static ds_drafter *load(const char *path) {
    char err[DS_ERRLEN];
    ds_drafter *d = ds_drafter_load(path, g_tm, err, sizeof err);
    if (!d) printf("load %s: %s\n", path, err);
    return d;
}

static float *synth_feat(int rows, int width, float phase) {
    float *f = malloc((size_t)rows * width * sizeof(float));
    for (size_t i = 0; i < (size_t)rows * width; i++) f[i] = 2.0f * sinf(0.37f * (float)i + phase) + 0.5f * cosf(0.011f * (float)i);
    return f;
}

/* One round from scratch: context of `rows` rows, draft at p = rows. */
static int round_(ds_dctx *x, const float *feat, int rows, int32_t anchor, int n_keep, const ds_sampler *s,
                  int32_t *ids, float *conf, float *logits) {
    char err[DS_ERRLEN];
    if (ds_dctx_truncate(x, 0)) return -1;
    if (ds_dctx_append(x, feat, rows, 0, err, sizeof err)) { printf("append: %s\n", err); return -1; }
    ds_draft_opts o = { s, n_keep };
    if (ds_draft(x, anchor, rows, &o, ids, conf, logits, err, sizeof err)) { printf("draft: %s\n", err); return -1; }
    return 0;
}

static int all_finite(const float *x, size_t n) {
    for (size_t i = 0; i < n; i++) if (!isfinite(x[i])) return 0;
    return 1;
}

#define NCTX 6
#define ANCHOR 5

/* ---- tier 1 ------------------------------------------------------------------ */
static void test_tier1(const char *label, const char *path) {
    ds_drafter *d = load(path);
    CHECK(d != NULL, "%s: load", label);
    if (!d) return;
    const int G = ds_drafter_block_size(d), V = g_V, W = ds_drafter_n_taps(d) * g_D;
    char err[DS_ERRLEN];
    ds_dctx *x = ds_dctx_new(d, 64, NULL, err, sizeof err);
    CHECK(x != NULL, "%s: dctx: %s", label, err);
    float *feat = synth_feat(NCTX, W, 0.3f);
    size_t nl = (size_t)G * V;
    float *logits = malloc((nl + 16) * sizeof(float));
    for (size_t i = 0; i < nl + 16; i++) logits[i] = 12345.0f;
    int32_t ids[300];
    float conf[300];
    int ok = x && round_(x, feat, NCTX, ANCHOR, G, NULL, ids, conf, logits) == 0;
    CHECK(ok, "%s: draft", label);
    if (ok) {
        int guard = 1, ids_ok = 1, conf_ok = 1;
        for (int i = 0; i < 16; i++) guard &= logits[nl + i] == 12345.0f;
        for (int k = 0; k < G; k++) {
            ids_ok &= ids[k] >= 0 && ids[k] < V && ids[k] != ds_drafter_mask_id(d);
            conf_ok &= conf[k] > 0.0f && conf[k] < 1.0f;
        }
        CHECK(all_finite(logits, nl), "%s: non-finite logits", label);
        CHECK(guard, "%s: wrote past gamma*V logits", label);
        CHECK(ids_ok, "%s: ids out of range or MASK", label);
        CHECK(!ds_drafter_has_confidence(d) || conf_ok, "%s: confidence not in (0,1)", label);
        float mn = logits[0], mx = logits[0];
        for (size_t i = 0; i < nl; i++) {
            if (i % V == (size_t)ds_drafter_mask_id(d)) continue;
            if (logits[i] < mn) mn = logits[i];
            if (logits[i] > mx) mx = logits[i];
        }
        printf("  tier1 %s: %d x %d logits, min %.3f max %.3f, ids %d %d %d ...\n", label, G, V, mn, mx, ids[0], ids[1 % G], ids[2 % G]);
        PASS(label);
    }
    free(feat); free(logits);
    ds_dctx_free(x);
    ds_drafter_free(d);
}

/* ---- tier 2: reference through ref.bin ------------------------------------------ */
static double row_rel_err(const float *a, const float *b, int V) {
    double scale = 1.0, md = 0;
    for (int v = 0; v < V; v++) if (fabs(b[v]) > scale && b[v] > -1e5f) scale = fabs(b[v]);
    for (int v = 0; v < V; v++) { double e = fabs((double)a[v] - (double)b[v]); if (e > md) md = e; }
    return md / scale;
}

static void test_tier2(const char *label, const char *path, double tol) {
    ds_drafter *d = load(path);
    CHECK(d != NULL, "%s: load", label);
    if (!d) return;
    const int G = ds_drafter_block_size(d), V = g_V, W = ds_drafter_n_taps(d) * g_D;
    char err[DS_ERRLEN];
    ds_dctx *x = ds_dctx_new(d, 64, NULL, err, sizeof err);
    float *feat = synth_feat(NCTX, W, 1.1f);
    float *logits = malloc((size_t)G * V * sizeof(float)), conf[300];
    int32_t ids[300];
    int ok = x && round_(x, feat, NCTX, ANCHOR, G, NULL, ids, conf, logits) == 0;
    CHECK(ok, "%s: draft", label);

    dref R;
    ok = ok && dref_load(&R, path, g_target, err) == 0;
    CHECK(ok, "%s: reference load: %s", label, err);
    if (!ok) { free(feat); free(logits); ds_dctx_free(x); ds_drafter_free(d); return; }
    refbin b = { NCTX, W, G, V, malloc(NCTX * 4), malloc((size_t)NCTX * W * 4), malloc((size_t)G * 4), malloc((size_t)G * 4),
                 malloc((size_t)G * V * 4) };
    for (int i = 0; i < NCTX; i++) b.ctx_pos[i] = i;
    memcpy(b.ctx_feat, feat, (size_t)NCTX * W * 4);
    for (int i = 0; i < G; i++) { b.draft_ids[i] = i ? R.mask : ANCHOR; b.draft_pos[i] = NCTX + i; }
    double *rl = malloc((size_t)G * V * sizeof(double)), rc[300];
    int32_t rids[300];
    CHECK(dref_run(&R, b.n_ctx_rows, b.ctx_pos, b.ctx_feat, b.draft_ids, b.draft_pos, rl, rc, rids, NULL) == 0, "%s: ref run", label);
    for (size_t i = 0; i < (size_t)G * V; i++) b.logits[i] = (float)rl[i];
    char bin[400];
    snprintf(bin, sizeof bin, "%s/ref_%s.bin", g_dir, label);
    CHECK(refbin_write(bin, &b) == 0, "%s: write ref.bin", label);
    refbin rb;
    int rok = refbin_read(bin, &rb) == 0;
    CHECK(rok, "%s: read ref.bin back", label);
    if (rok) {
        CHECK(rb.n_ctx_rows == NCTX && rb.n_embd_cap == W && rb.block_size == G && rb.vocab == V, "%s: ref.bin header", label);
        CHECK(!memcmp(rb.ctx_feat, feat, (size_t)NCTX * W * 4) && !memcmp(rb.draft_ids, b.draft_ids, (size_t)G * 4) &&
              !memcmp(rb.draft_pos, b.draft_pos, (size_t)G * 4), "%s: ref.bin payload round trip", label);
        double worst = 0;
        int ids_eq = 1;
        double cerr = 0;
        for (int k = 0; k < G; k++) {
            double e = row_rel_err(logits + (size_t)k * V, rb.logits + (size_t)k * V, V);
            if (e > worst) worst = e;
            ids_eq &= ids[k] == rids[k];
            if (ds_drafter_has_confidence(d) && fabs(conf[k] - rc[k]) > cerr) cerr = fabs(conf[k] - rc[k]);
        }
        printf("  tier2 %s: max rel err %.3g (tol %.0e), conf max abs err %.3g, ids %s\n", label, worst, tol, cerr,
               ids_eq ? "equal" : "DIFFER");
        CHECK(worst <= tol, "%s: logits differ from the reference: rel err %.3g > %.0e", label, worst, tol);
        CHECK(ids_eq, "%s: greedy chain differs from the reference", label);
        CHECK(cerr <= tol * 10, "%s: confidence differs from the reference by %.3g", label, cerr);
        if (worst <= tol && ids_eq) PASS(label);
        refbin_free(&rb);
    }
    refbin_free(&b);
    free(rl);
    dref_free(&R);
    free(feat); free(logits);
    ds_dctx_free(x);
    ds_drafter_free(d);
}

/* ---- correction oracle from dspark's own trunk hidden ------------------------------ */
static void test_correction_oracle(const char *path) {
    ds_drafter *d = load(path);
    if (!d) { CHECK(0, "oracle: load"); return; }
    const int G = ds_drafter_block_size(d), V = g_V, D = g_D, W = ds_drafter_n_taps(d) * D;
    char err[DS_ERRLEN];
    ds_dctx *x = ds_dctx_new(d, 64, NULL, err, sizeof err);
    float *feat = synth_feat(NCTX, W, 2.0f);
    float *logits = malloc((size_t)G * V * 4), *hid = malloc((size_t)G * D * 4);
    int32_t ids[300];
    x->dbg_hidden = hid;
    int ok = round_(x, feat, NCTX, ANCHOR, G, NULL, ids, NULL, logits) == 0;
    dref R;
    ok = ok && dref_load(&R, path, g_target, err) == 0;
    CHECK(ok && R.corr_w > 0 && R.rank > 0, "oracle: setup");
    if (ok) {
        double *in = malloc((size_t)(2 * D + R.corr_w * 2) * 8), *g = malloc((size_t)R.corr_w * 8), *u = malloc((size_t)R.corr_w * 8);
        double *h = malloc((size_t)D * 8), *delta = malloc((size_t)D * 8), *z = malloc((size_t)V * 8), *bias = malloc((size_t)V * 8);
        double worst = 0, dmax = 0;
        int32_t prev = ANCHOR;
        for (int k = 0; k < G; k++) {
            for (int j = 0; j < D; j++) h[j] = hid[(size_t)k * D + j];
            ref_rms(h, R.chn, D, 1e-6, in);
            ref_rms(R.E.w + (size_t)prev * D, R.cen, D, 1e-6, in + D);
            ref_mv(&R.cg, in, g);
            ref_mv(&R.cu, in, u);
            for (int j = 0; j < R.corr_w; j++) g[j] = g[j] / (1 + exp(-g[j])) * u[j];
            ref_mv(&R.cd, g, delta);
            for (int j = 0; j < D; j++) { h[j] += delta[j]; if (fabs(delta[j]) > dmax) dmax = fabs(delta[j]); }
            ref_mv(&R.head, h, z);
            ref_mv(&R.w2, R.w1.w + (size_t)(k == 0 ? ANCHOR : R.mask) * R.rank, bias);
            for (int v = 0; v < V; v++) z[v] += bias[v];
            z[R.mask] = -1e6;
            float zf[300];
            for (int v = 0; v < V; v++) zf[v] = (float)z[v];
            double e = row_rel_err(logits + (size_t)k * V, zf, V);
            if (e > worst) worst = e;
            prev = ids[k];
        }
        printf("  correction oracle: max rel err %.3g, max |delta h| %.3g\n", worst, dmax);
        CHECK(dmax > 1e-3, "oracle: the correction head has no effect (|delta| %.3g)", dmax);
        CHECK(worst <= 1e-4, "oracle: correction differs from the scalar oracle: %.3g", worst);
        if (worst <= 1e-4 && dmax > 1e-3) PASS("correction oracle (scalar, from dspark's trunk hidden)");
        free(in); free(g); free(u); free(h); free(delta); free(z); free(bias);
        dref_free(&R);
    }
    free(feat); free(logits); free(hid);
    ds_dctx_free(x);
    ds_drafter_free(d);
}

/* ---- exactness properties ----------------------------------------------------------- */
static void test_exact(const char *label, const char *path) {
    ds_drafter *d = load(path);
    if (!d) { CHECK(0, "%s: load", label); return; }
    const int G = ds_drafter_block_size(d), V = g_V, W = ds_drafter_n_taps(d) * g_D;
    const int32_t mask = ds_drafter_mask_id(d);
    char err[DS_ERRLEN], name[160];
    ds_dctx *x = ds_dctx_new(d, 64, NULL, err, sizeof err);
    float *feat = synth_feat(NCTX, W, 0.7f);
    size_t nl = (size_t)G * V;
    float *L0 = malloc(nl * 4), *L1 = malloc(nl * 4), *U = malloc(nl * 4), c0[300], c1[300];
    int32_t i0[300], i1[300];

    /* mask suppression invariance */
    x->dbg_unmasked = U;
    int ok = round_(x, feat, NCTX, ANCHOR, G, NULL, i0, c0, L0) == 0;
    x->dbg_unmasked = NULL;
    int inv = ok;
    for (int k = 0; ok && k < G; k++) {
        const float *z = L0 + (size_t)k * V, *u = U + (size_t)k * V;
        inv &= z[mask] == -1e6f;
        inv &= !memcmp(z, u, (size_t)mask * 4) && !memcmp(z + mask + 1, u + mask + 1, (size_t)(V - mask - 1) * 4);
    }
    snprintf(name, sizeof name, "%s: mask suppression invariance (z[MASK]=-1e6, other logits bitwise equal)", label);
    CHECK(inv, "%s", name);
    if (inv) PASS(name);

    /* greedy ids == argmax of returned logits */
    int am = ok;
    for (int k = 0; ok && k < G; k++) am &= ds_argmax(L0 + (size_t)k * V, V) == i0[k];
    snprintf(name, sizeof name, "%s: greedy ids == argmax of returned logits", label);
    CHECK(am, "%s", name);
    if (am) PASS(name);

    /* two identical rounds */
    ok = ok && round_(x, feat, NCTX, ANCHOR, G, NULL, i1, c1, L1) == 0;
    int same = ok && !memcmp(L0, L1, nl * 4) && !memcmp(i0, i1, (size_t)G * 4) && !memcmp(c0, c1, (size_t)G * 4);
    snprintf(name, sizeof name, "%s: two identical rounds give identical bits", label);
    CHECK(same, "%s", name);
    if (same) PASS(name);

    /* MASK reuse == recomputation */
    x->no_mask_cache = 1;
    ok = ok && round_(x, feat, NCTX, ANCHOR, G, NULL, i1, c1, L1) == 0;
    x->no_mask_cache = 0;
    same = ok && !memcmp(L0, L1, nl * 4) && !memcmp(i0, i1, (size_t)G * 4) && !memcmp(c0, c1, (size_t)G * 4);
    snprintf(name, sizeof name, "%s: cached MASK projections == recomputation (bitwise)", label);
    CHECK(same, "%s", name);
    if (same) PASS(name);

    /* the backend's one-launch head chain == the ops one by one (on a
     * backend without it both rounds take the op path) */
    x->no_chain = 1;
    ok = ok && round_(x, feat, NCTX, ANCHOR, G, NULL, i1, c1, L1) == 0;
    x->no_chain = 0;
    same = ok && !memcmp(L0, L1, nl * 4) && !memcmp(i0, i1, (size_t)G * 4) && !memcmp(c0, c1, (size_t)G * 4);
    snprintf(name, sizeof name, "%s: head chain in one launch == op by op (bitwise%s)", label,
             d->be->i->draft_chain ? "" : "; this device has no fused chain");
    CHECK(same, "%s", name);
    if (same) PASS(name);

    /* prefix A/B */
    static const int keeps[] = { 1, 2, 3, 4, 6, 8 };
    int pre = ok, n_pre = 0;
    for (size_t i = 0; i < sizeof keeps / sizeof keeps[0]; i++) {
        int k = keeps[i];
        if (k > G) continue;
        for (size_t j = 0; j < nl; j++) L1[j] = 777.0f;
        ok = round_(x, feat, NCTX, ANCHOR, k, NULL, i1, c1, L1) == 0;
        int e = ok && !memcmp(L0, L1, (size_t)k * V * 4) && !memcmp(i0, i1, (size_t)k * 4) && !memcmp(c0, c1, (size_t)k * 4);
        e &= (size_t)k * V == nl || L1[(size_t)k * V] == 777.0f;
        if (!e) printf("  prefix mismatch at n_keep=%d\n", k);
        pre &= e;
        n_pre++;
    }
    snprintf(name, sizeof name, "%s: prefix A/B (%d keeps, ids/logits/confidence bitwise)", label, n_pre);
    CHECK(pre, "%s", name);
    if (pre) PASS(name);

    /* thread-count independence: a 2-thread pool gives the same bits */
    ds_exec *ex2 = d->be->i->exec_new(d->be, 2, err, sizeof err);
    ds_dctx *xp = ex2 ? ds_dctx_new(d, 64, ex2, err, sizeof err) : NULL;
    ok = xp && round_(xp, feat, NCTX, ANCHOR, G, NULL, i1, c1, L1) == 0;
    same = ok && !memcmp(L0, L1, nl * 4) && !memcmp(i0, i1, (size_t)G * 4);
    snprintf(name, sizeof name, "%s: 2-thread pool == inline (bitwise)", label);
    CHECK(same, "%s", name);
    if (same) PASS(name);
    ds_dctx_free(xp);
    d->be->i->exec_free(ex2);

    /* sampled: ids == ds_sample(z_k, V, p+k+1), prefix holds too */
    ds_sampler s = { 0.8f, 0, 1.0f, 42, 0.0f };
    ok = round_(x, feat, NCTX, ANCHOR, G, &s, i1, c1, L1) == 0;
    int sm = ok;
    for (int k = 0; ok && k < G; k++) sm &= ds_sample(&s, L1 + (size_t)k * V, V, NCTX + k + 1, NULL) == i1[k];
    int32_t i2[300];
    float *L2 = malloc(nl * 4);
    int kk = G > 3 ? 3 : G;
    ok = ok && round_(x, feat, NCTX, ANCHOR, kk, &s, i2, NULL, L2) == 0;
    sm &= ok && !memcmp(i1, i2, (size_t)kk * 4) && !memcmp(L1, L2, (size_t)kk * V * 4);
    snprintf(name, sizeof name, "%s: sampled ids == ds_sample(z_k, pos p+k+1), prefix exact", label);
    CHECK(sm, "%s", name);
    if (sm) PASS(name);
    free(L2);

    free(feat); free(L0); free(L1); free(U);
    ds_dctx_free(x);
    ds_drafter_free(d);
}

/* ---- both layouts of the same weights ------------------------------------------------ */
static void test_layouts(const char *label, const char *pa, const char *pb) {
    ds_drafter *a = load(pa), *b = load(pb);
    CHECK(a && b, "%s: load both layouts", label);
    if (a && b) {
        const int G = ds_drafter_block_size(a), V = g_V, W = ds_drafter_n_taps(a) * g_D;
        char err[DS_ERRLEN];
        ds_dctx *xa = ds_dctx_new(a, 32, NULL, err, sizeof err), *xb = ds_dctx_new(b, 32, NULL, err, sizeof err);
        float *feat = synth_feat(NCTX, W, 0.2f), *La = malloc((size_t)G * V * 4), *Lb = malloc((size_t)G * V * 4), ca[300], cb[300];
        int32_t ia[300], ib[300];
        int ok = round_(xa, feat, NCTX, ANCHOR, G, NULL, ia, ca, La) == 0 && round_(xb, feat, NCTX, ANCHOR, G, NULL, ib, cb, Lb) == 0;
        int same = ok && !memcmp(La, Lb, (size_t)G * V * 4) && !memcmp(ia, ib, (size_t)G * 4) && !memcmp(ca, cb, (size_t)G * 4);
        same &= ds_drafter_n_taps(a) == ds_drafter_n_taps(b) && !memcmp(ds_drafter_tap_layers(a), ds_drafter_tap_layers(b), (size_t)ds_drafter_n_taps(a) * sizeof(int));
        same &= ds_drafter_mask_id(a) == ds_drafter_mask_id(b) && ds_drafter_has_confidence(a) == ds_drafter_has_confidence(b);
        CHECK(same, "%s: dflash and dspark layouts disagree", label);
        CHECK(strstr(ds_drafter_describe(a), "layout=dflash") && strstr(ds_drafter_describe(b), "layout=dspark") &&
              strstr(ds_drafter_describe(b), "ignored"), "%s: describe", label);
        printf("  %s\n  %s\n", ds_drafter_describe(a), ds_drafter_describe(b));
        if (same) PASS(label);
        free(feat); free(La); free(Lb);
        ds_dctx_free(xa); ds_dctx_free(xb);
        /* head identity */
        int ident = ds_drafter_head(a) == &g_tm->output && ds_drafter_head(a)->data == g_tm->output.data &&
                    ds_drafter_head(b)->data == g_tm->output.data;
        CHECK(ident, "drafter head is not the target's output memory");
        if (ident) PASS("drafter LM head is the target's output (same memory, both layouts)");
    }
    ds_drafter_free(a);
    ds_drafter_free(b);
}

/* ---- negative contracts: files -------------------------------------------------------- */
typedef struct {
    const char *key;
    int kind;              /* 0 u32, 1 str, 2 u32 array */
    uint32_t u;
    const char *s;
    const uint32_t *arr;
    int n;
} kvset;

static int rewrite(const char *src, const char *dst, const kvset *sets, int n_sets, const char *drop,
                   const char *subst, const char *subst_from) {
    char err[DS_ERRLEN];
    gguf_ctx *g = gguf_open(src, err, sizeof err);
    if (!g) return -1;
    gguf_writer *w = gguf_writer_new();
    int rc = 0;
    for (uint64_t i = 0; i < gguf_n_kv(g); i++) {
        const gguf_kv *kv = gguf_kv_at(g, i);
        int skip = 0;
        for (int j = 0; j < n_sets; j++) skip |= gguf_str_eq(kv->key, sets[j].key);
        if (!skip) rc |= gguf_set_kv(w, kv);
    }
    for (int j = 0; j < n_sets; j++) {
        if (sets[j].kind == 0) rc |= gguf_set_u32(w, sets[j].key, sets[j].u);
        else if (sets[j].kind == 1) rc |= gguf_set_str(w, sets[j].key, sets[j].s);
        else rc |= gguf_set_arr(w, sets[j].key, GGUF_T_U32, sets[j].arr, (uint64_t)sets[j].n);
    }
    for (uint64_t i = 0; i < gguf_n_tensors(g); i++) {
        const gguf_tensor *t = gguf_tensor_at(g, i), *s = t;
        if (drop && !strcmp(t->name, drop)) continue;
        if (subst && !strcmp(t->name, subst)) s = gguf_find_tensor(g, subst_from);
        if (!s) { rc = -1; break; }
        rc |= gguf_add_tensor(w, t->name, s->type, s->n_dims, s->ne, s->data, s->nbytes);
    }
    if (!rc) rc = gguf_writer_write(w, dst, err, sizeof err);
    gguf_writer_free(w);
    gguf_close(g);
    return rc;
}

static void expect_reject(const char *label, const char *src, const kvset *sets, int n_sets, const char *drop,
                          const char *subst, const char *subst_from, const char *want) {
    char dst[400], err[DS_ERRLEN] = "";
    snprintf(dst, sizeof dst, "%s/bad.gguf", g_dir);
    if (rewrite(src, dst, sets, n_sets, drop, subst, subst_from)) { CHECK(0, "%s: could not write the bad file", label); return; }
    ds_drafter *d = ds_drafter_load(dst, g_tm, err, sizeof err);
    int ok = d == NULL && err[0] && !strchr(err, '\n') && strstr(err, want);
    CHECK(ok, "%s: expected a rejection mentioning '%s', got %s '%s'", label, want, d ? "success" : "error", err);
    if (ok) printf("PASS reject %s: %s\n", label, err);
    ds_drafter_free(d);
}

static void test_bad_files(const char *A, const char *Cl) {
    /* A: dflash, target layers HF 0,1,2 stored 1,2,3; target has 3 layers */
    static const uint32_t t_noninc[] = { 2, 1, 3 }, t_range[] = { 1, 2, 4 }, t_embd[] = { 0, 1, 2 }, t_two[] = { 1, 2 };
    kvset s;
    s = (kvset){ "dflash.target_layers", 2, 0, NULL, t_noninc, 3 };
    expect_reject("taps not increasing", A, &s, 1, NULL, NULL, NULL, "strictly increasing");
    s = (kvset){ "dflash.target_layers", 2, 0, NULL, t_range, 3 };
    expect_reject("tap out of range", A, &s, 1, NULL, NULL, NULL, "out of range");
    s = (kvset){ "dflash.target_layers", 2, 0, NULL, t_embd, 3 };
    expect_reject("tap = embedding output", A, &s, 1, NULL, NULL, NULL, "embedding");
    s = (kvset){ "dflash.target_layers", 2, 0, NULL, t_two, 2 };
    expect_reject("fc width != n_taps*d", A, &s, 1, NULL, NULL, NULL, "fc.weight");
    s = (kvset){ "dflash.block_size", 0, 0, NULL, NULL, 0 };
    expect_reject("block size 0", A, &s, 1, NULL, NULL, NULL, "block size");
    s = (kvset){ "tokenizer.ggml.mask_token_id", 0, (uint32_t)g_V, NULL, NULL, 0 };
    expect_reject("MASK id outside the vocabulary", A, &s, 1, NULL, NULL, NULL, "MASK");
    s = (kvset){ "dflash.sample_from_anchor", 1, 0, "false", NULL, 0 };
    expect_reject("sample_from_anchor false", A, &s, 1, NULL, NULL, NULL, "mask-filling drafters are not supported");
    s = (kvset){ "dflash.markov_head_type", 1, 0, "lstm", NULL, 0 };
    expect_reject("unknown markov type", A, &s, 1, NULL, NULL, NULL, "unknown Markov head type");
    s = (kvset){ "dflash.embedding_length", 0, 32, NULL, NULL, 0 };
    expect_reject("embedding_length != target n_embd", A, &s, 1, NULL, NULL, NULL, "embedding_length");
    s = (kvset){ "general.architecture", 1, 0, "llama", NULL, 0 };
    expect_reject("not a drafter architecture", A, &s, 1, NULL, NULL, NULL, "not a drafter");
    expect_reject("missing tensor", A, NULL, 0, "blk.1.ffn_down.weight", NULL, NULL, "missing tensor 'blk.1.ffn_down.weight'");
    expect_reject("attn_k shape", A, NULL, 0, NULL, "blk.0.attn_k.weight", "blk.0.attn_q.weight", "blk.0.attn_k.weight' has shape");
    expect_reject("markov_w2 shape", A, NULL, 0, NULL, "markov_w2.weight", "fc.weight", "markov_w2.weight' has shape");
    expect_reject("conf_proj shape", A, NULL, 0, NULL, "conf_proj.weight", "output_norm.weight", "conf_proj.weight' has shape");
    s = (kvset){ "dflash.markov_rank", 0, 5, NULL, NULL, 0 };
    expect_reject("markov_rank disagrees with markov_w1", A, &s, 1, NULL, NULL, NULL, "markov_rank");
    /* legacy (dspark) correction file */
    s = (kvset){ "dspark.dspark.markov_deploy_exposure", 0, 0, NULL, NULL, 0 };
    kvset sb = { "dspark.dspark.markov_deploy_exposure", 1, 0, "false", NULL, 0 };
    (void)s;
    expect_reject("legacy correction without deploy exposure", Cl, &sb, 1, NULL, NULL, NULL, "markov_deploy_exposure");
    expect_reject("legacy token_embd copy with a wrong shape", Cl, NULL, 0, NULL, "token_embd.weight", "dspark.markov_head_a.weight", "token_embd.weight' has shape");
    static const uint32_t t_leg_range[] = { 0, 1, 3 };
    s = (kvset){ "dspark.dspark.target_layers", 2, 0, NULL, t_leg_range, 3 };
    expect_reject("legacy tap out of range (HF ids)", Cl, &s, 1, NULL, NULL, NULL, "out of range");
    char err[DS_ERRLEN] = "";
    ds_drafter *d = ds_drafter_load("/nonexistent/drafter.gguf", g_tm, err, sizeof err);
    CHECK(!d && err[0], "missing file accepted");
}

/* ---- negative contracts: calls; truncate / append semantics ------------------------------ */
static void test_calls(const char *path) {
    ds_drafter *d = load(path);
    if (!d) { CHECK(0, "calls: load"); return; }
    const int G = ds_drafter_block_size(d), V = g_V, W = ds_drafter_n_taps(d) * g_D;
    char err[DS_ERRLEN];
    ds_dctx *bad = ds_dctx_new(d, 0, NULL, err, sizeof err);
    CHECK(!bad && strstr(err, "n_ctx"), "dctx_new n_ctx 0 accepted");
    ds_dctx *x = ds_dctx_new(d, 32, NULL, err, sizeof err);
    float *feat = synth_feat(2 * NCTX, W, 0.9f);
    size_t nl = (size_t)G * V;
    float *L = malloc(nl * 4), *L2 = malloc(nl * 4), c[300], c2[300];
    int32_t ids[300], ids2[300];
    CHECK(ds_dctx_append(x, feat, NCTX, 0, err, sizeof err) == 0, "append: %s", err);

    /* retained depth fixed at initialisation: another value is rejected
     * ("settings changed after initialisation"), before anything is written */
    {
        ds_dctx *y = ds_dctx_new(d, 32, NULL, err, sizeof err);
        CHECK(y && ds_dctx_append(y, feat, NCTX, 0, err, sizeof err) == 0, "append: %s", err);
        int keep = G > 1 ? G - 1 : 1;
        CHECK(ds_dctx_set_retained(y, 0, err, sizeof err) != 0 && strstr(err, "out of range"), "retained depth 0 accepted");
        CHECK(ds_dctx_set_retained(y, G + 1, err, sizeof err) != 0 && strstr(err, "out of range"), "retained depth > gamma accepted");
        CHECK(ds_dctx_set_retained(y, keep, err, sizeof err) == 0, "retained depth %d rejected: %s", keep, err);
        CHECK(ds_dctx_set_retained(y, keep, err, sizeof err) == 0, "setting the same retained depth again rejected");
        if (G > 1) {
            CHECK(ds_dctx_set_retained(y, G, err, sizeof err) != 0 && strstr(err, "settings changed after initialisation"),
                  "retained depth changed after initialisation accepted: '%s'", err);
            memset(ids, 0x5a, sizeof ids);
            ds_draft_opts full = { NULL, G };
            int rc = ds_draft(y, ANCHOR, NCTX, &full, ids, NULL, NULL, err, sizeof err);
            CHECK(rc == -1 && strstr(err, "settings changed after initialisation") && ((unsigned char *)ids)[0] == 0x5a,
                  "a full-block request on a runner fixed to %d drafts was accepted", keep);
        }
        ds_draft_opts ok_o = { NULL, keep };
        CHECK(ds_draft(y, ANCHOR, NCTX, &ok_o, ids, NULL, NULL, err, sizeof err) == 0, "draft at the retained depth: %s", err);
        printf("PASS retained depth fixed at initialisation (keep=%d, gamma=%d)\n", keep, G);
        ds_dctx_free(y);
    }

    /* rejected calls leave every output untouched */
    struct { const char *what; int32_t anchor; int p, n_keep; const char *want; } cases[] = {
        { "n_keep 0", ANCHOR, NCTX, 0, "n_keep" },
        { "n_keep > gamma", ANCHOR, NCTX, G + 1, "n_keep" },
        { "p < ds_dctx_len", ANCHOR, NCTX - 1, G, "context length" },
        { "p > ds_dctx_len", ANCHOR, NCTX + 1, G, "context length" },
        { "anchor < 0", -1, NCTX, G, "anchor" },
        { "anchor >= vocab", V, NCTX, G, "anchor" },
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        memset(L, 0x5a, nl * 4); memset(ids, 0x5a, sizeof ids); memset(c, 0x5a, sizeof c);
        err[0] = 0;
        ds_draft_opts o = { NULL, cases[i].n_keep };
        int rc = ds_draft(x, cases[i].anchor, cases[i].p, &o, ids, c, L, err, sizeof err);
        int untouched = 1;
        for (size_t j = 0; j < nl * 4; j++) untouched &= ((unsigned char *)L)[j] == 0x5a;
        for (size_t j = 0; j < sizeof ids; j++) untouched &= ((unsigned char *)ids)[j] == 0x5a;
        for (size_t j = 0; j < sizeof c; j++) untouched &= ((unsigned char *)c)[j] == 0x5a;
        int ok = rc == -1 && untouched && strstr(err, cases[i].want) && !strchr(err, '\n') && ds_dctx_len(x) == NCTX;
        CHECK(ok, "draft with %s: rc %d untouched %d err '%s'", cases[i].what, rc, untouched, err);
        if (ok) printf("PASS reject draft %s: %s\n", cases[i].what, err);
    }
    err[0] = 0;
    CHECK(ds_dctx_append(x, feat, 1, NCTX + 1, err, sizeof err) == -1 && strstr(err, "position"), "append at a gap accepted");
    CHECK(ds_dctx_append(x, feat, 1, NCTX - 1, err, sizeof err) == -1, "append overlapping accepted");
    CHECK(ds_dctx_append(x, feat, 40, NCTX, err, sizeof err) == -1 && strstr(err, "exceed"), "append beyond n_ctx accepted");
    CHECK(ds_dctx_len(x) == NCTX, "failed appends changed the length");
    CHECK(ds_dctx_append(x, feat, 0, NCTX, err, sizeof err) == 0 && ds_dctx_len(x) == NCTX, "empty append");

    /* truncate semantics */
    CHECK(ds_dctx_truncate(x, NCTX + 1) == -1 && ds_dctx_len(x) == NCTX, "truncate beyond the length accepted");
    CHECK(ds_dctx_truncate(x, -1) == -1 && ds_dctx_len(x) == NCTX, "truncate to -1 accepted");
    CHECK(ds_dctx_truncate(x, NCTX) == 0 && ds_dctx_len(x) == NCTX, "truncate to the length");

    /* reference: fresh context of 6 rows, draft at 6 */
    ds_draft_opts full = { NULL, G };
    CHECK(ds_draft(x, ANCHOR, NCTX, &full, ids, c, L, err, sizeof err) == 0, "draft: %s", err);
    CHECK(ds_dctx_len(x) == NCTX, "a draft changed the context length (block rows must not persist)");
    /* grow to 12, truncate back to 6: the same draft */
    CHECK(ds_dctx_append(x, feat + (size_t)NCTX * W, NCTX, NCTX, err, sizeof err) == 0, "append 6..11: %s", err);
    CHECK(ds_dctx_truncate(x, NCTX) == 0, "truncate to 6");
    CHECK(ds_draft(x, ANCHOR, NCTX, &full, ids2, c2, L2, err, sizeof err) == 0, "draft after truncate: %s", err);
    int same = !memcmp(L, L2, nl * 4) && !memcmp(ids, ids2, (size_t)G * 4) && !memcmp(c, c2, (size_t)G * 4);
    CHECK(same, "truncate(6) after growing to 12 does not restore the 6-row draft");
    if (same) PASS("ds_dctx_truncate restores the earlier context exactly");

    /* 6 rows + a draft (block rows written at 6..) + 6 more rows == 12 rows in one append */
    CHECK(ds_dctx_append(x, feat + (size_t)NCTX * W, NCTX, NCTX, err, sizeof err) == 0, "append: %s", err);
    CHECK(ds_draft(x, ANCHOR, 2 * NCTX, &full, ids, c, L, err, sizeof err) == 0, "draft at 12: %s", err);
    ds_dctx *y = ds_dctx_new(d, 32, NULL, err, sizeof err);
    CHECK(ds_dctx_append(y, feat, 2 * NCTX, 0, err, sizeof err) == 0, "append 12: %s", err);
    CHECK(ds_draft(y, ANCHOR, 2 * NCTX, &full, ids2, c2, L2, err, sizeof err) == 0, "draft: %s", err);
    same = !memcmp(L, L2, nl * 4) && !memcmp(ids, ids2, (size_t)G * 4) && !memcmp(c, c2, (size_t)G * 4);
    CHECK(same, "block rows leaked into the context, or appends in pieces differ from one append");
    if (same) PASS("block rows never become context; appends in pieces == one append (bitwise)");

    /* sanitizing: NaN -> 0, |x| > 65504 -> +-65504 */
    float *dirty = synth_feat(NCTX, W, 0.9f), *clean = synth_feat(NCTX, W, 0.9f);
    dirty[3] = NAN; clean[3] = 0.0f;
    dirty[W + 5] = INFINITY; clean[W + 5] = 65504.0f;
    dirty[2 * W + 7] = -1e30f; clean[2 * W + 7] = -65504.0f;
    dirty[3 * W + 1] = 70000.0f; clean[3 * W + 1] = 65504.0f;
    CHECK(round_(y, dirty, NCTX, ANCHOR, G, NULL, ids, c, L) == 0 && round_(y, clean, NCTX, ANCHOR, G, NULL, ids2, c2, L2) == 0, "sanitize rounds");
    same = !memcmp(L, L2, nl * 4) && !memcmp(ids, ids2, (size_t)G * 4) && all_finite(L, nl);
    CHECK(same, "feature sanitizing");
    if (same) PASS("features sanitized (NaN -> 0, |x| > 65504 -> +-65504)");
    free(dirty); free(clean);
    ds_dctx_free(y);

    free(feat); free(L); free(L2);
    ds_dctx_free(x);
    ds_drafter_free(d);
}

/* ---- with real target taps ------------------------------------------------------------- */
static void test_with_target(const char *path) {
    ds_drafter *d = load(path);
    if (!d) { CHECK(0, "target: load"); return; }
    char err[DS_ERRLEN];
    const int G = ds_drafter_block_size(d), V = g_V, W = ds_drafter_n_taps(d) * g_D, n = 10;
    ds_ctx *c = ds_ctx_new(g_tm, 128, 2, err, sizeof err);
    int ok = c && ds_set_taps(c, ds_drafter_tap_layers(d), ds_drafter_n_taps(d), err, sizeof err) == 0;
    int32_t prompt[10] = { 1, 17, 42, 99, 7, 250, 3, 64, 128, 200 };
    float *taps = malloc((size_t)n * W * 4), *lg = malloc((size_t)V * 4), *L = malloc((size_t)G * V * 4), conf[300];
    int32_t ids[300];
    ok = ok && ds_forward_batch(c, prompt, n, 0, DS_LOGITS_LAST, lg, taps, err, sizeof err) == 0;
    ds_dctx *x = ok ? ds_dctx_new(d, 128, ds_ctx_exec(c), err, sizeof err) : NULL;
    ok = ok && x && ds_dctx_append(x, taps, n, 0, err, sizeof err) == 0;
    int32_t anchor = (int32_t)ds_argmax(lg, V);
    ds_draft_opts o = { NULL, G };
    ok = ok && ds_draft(x, anchor, n, &o, ids, conf, L, err, sizeof err) == 0;
    int good = ok && all_finite(L, (size_t)G * V);
    for (int k = 0; good && k < G; k++) good &= ids[k] >= 0 && ids[k] < V;
    CHECK(good, "draft from real target taps: %s", err);
    if (good) {
        printf("  target taps: anchor %d -> drafts", anchor);
        for (int k = 0; k < G; k++) printf(" %d(%.2f)", ids[k], conf[k]);
        printf("\n");
        PASS("draft from real target taps (ds_forward_batch taps -> ds_dctx_append -> ds_draft)");
    }
    free(taps); free(lg); free(L);
    ds_dctx_free(x);
    ds_ctx_free(c);
    ds_drafter_free(d);
}

/* The CPU head chain with a vocabulary wide enough to be split (W2 = 0, so
 * z + W2 e is z itself): crafted logits whose argmax a wrong combination of
 * the threads' ranges would miss. */
static void test_chain_split(void) {
    enum { V = 4096, R = 32, D = 32, KEEP = 5 };
    char err[DS_ERRLEN];
    ds_backend *be = ds_backend_cpu_new(err, sizeof err);
    CHECK(be != NULL, "cpu backend: %s", err);
    if (!be) return;
    float *w1 = calloc((size_t)V * R, sizeof(float)), *h = calloc((size_t)KEEP * D, sizeof(float));
    ds_block_q8_0 *w2 = calloc((size_t)V, sizeof(ds_block_q8_0));   /* d = 0, quants 0 */
    float *z = malloc((size_t)KEEP * V * sizeof(float)), *want = malloc((size_t)KEEP * V * sizeof(float));
    float *bias = malloc((size_t)V * sizeof(float)), *in = malloc((size_t)(D + R) * sizeof(float));
    const ds_weight W1 = {.type = DS_TYPE_F32, .n_in = R, .n_out = V, .data = w1};
    const ds_weight W2 = {.type = DS_TYPE_Q8_0, .n_in = R, .n_out = V, .data = w2};
    for (int i = 0; i < V * R; i++) w1[i] = (float)((i * 37) % 11) - 5.0f;
    const int32_t mask = 3000;
    int bad = 0;
    for (int nt = 1; nt <= 4; nt++) {
        ds_exec *ex = be->i->exec_new(be, nt, err, sizeof err);
        if (!ex) { bad++; continue; }
        for (int k = 0; k < KEEP; k++)
            for (int i = 0; i < V; i++) z[(size_t)k * V + i] = (float)((i * 7919) % 1000) / 1000.0f;
        float *z0 = z, *z1 = z + V, *z2 = z + 2 * V, *z3 = z + 3 * V, *z4 = z + 4 * V;
        z0[3500] = 5.0f; z0[100] = 5.0f; z0[2047] = 5.0f;        /* a tie across ranges: 100 */
        for (int i = 0; i < V / 2 + 7; i++) z1[i] = NAN;         /* NaN ranges, then the max */
        z1[4000] = 2.0f;
        for (int i = 0; i < V; i++) z2[i] = NAN;                 /* all NaN but the mask */
        z3[mask] = 9.0f; z3[V - 1] = 3.0f;                       /* the mask's slot loses */
        z4[2048] = 4.0f; z4[2049] = 4.0f;                        /* a tie on a range edge */
        memcpy(want, z, (size_t)KEEP * V * sizeof(float));
        int32_t toks[KEEP + 1] = {7}, ref[KEEP + 1] = {7};
        for (int k = 0; k < KEEP; k++) {
            want[(size_t)k * V + mask] = -1e6f;
            ref[k + 1] = (int32_t)ds_argmax(want + (size_t)k * V, V);
        }
        const ds_draft_chain ch = {.n_keep = KEEP, .V = V, .D = D, .w1 = &W1, .w2 = &W2, .h = h, .z = z,
                                   .toks = toks, .mask_id = mask, .mask_logit = -1e6f, .bias = bias, .in = in};
        bad += be->i->draft_chain(ex, &ch) != 0;
        bad += memcmp(toks, ref, sizeof toks) != 0;
        bad += memcmp(z, want, (size_t)KEEP * V * sizeof(float)) != 0;
        bad += ref[1] != 100 || ref[2] != 4000 || ref[3] != mask || ref[4] != V - 1 || ref[5] != 2048;
        be->i->exec_free(ex);
    }
    CHECK(bad == 0, "cpu head chain over split ranges: %d mismatches", bad);
    if (bad == 0) PASS("cpu head chain over 1..4 threads: ids == ds_argmax (ties across ranges, NaN ranges, NaN but the mask, the mask), logits bitwise");
    free(w1); free(h); free(w2); free(z); free(want); free(bias); free(in);
    be->i->destroy(be);
}

static int file_eq(const char *a, const char *b) {
    FILE *fa = fopen(a, "rb"), *fb = fopen(b, "rb");
    int eq = fa && fb;
    while (eq) {
        int ca = fgetc(fa), cb = fgetc(fb);
        if (ca != cb) eq = 0;
        if (ca == EOF || cb == EOF) break;
    }
    if (fa) fclose(fa);
    if (fb) fclose(fb);
    return eq;
}

int main(void) {
    tu_tmpdir(g_dir, sizeof g_dir);
    char err[DS_ERRLEN];
    ds_make_model_opts mo;
    ds_make_model_defaults(&mo);
    mo.n_embd = 64; mo.n_layer = 3; mo.n_head = 4; mo.n_head_kv = 2; mo.n_ff = 128; mo.n_vocab = 300; mo.n_ctx = 256; mo.seed = 3;
    pathf(g_target, sizeof g_target, "target.gguf");
    if (ds_make_model(&mo, g_target, err, sizeof err)) { printf("FAIL make-model: %s\n", err); return 1; }
    g_tm = ds_model_load_on(g_target, tu_device(), err, sizeof err);
    if (!g_tm) { printf("FAIL load target: %s\n", err); return 1; }
    g_V = g_tm->hp.n_vocab;
    g_D = g_tm->hp.n_embd;

    char A[400], Al[400], C[400], Cl[400], Gd[400], Rn[400], N0[400], Q8[400], BF[400], F16[400], G7[400], A2[400], Cw[400];
    char Q8V[400], Q8N[400];
    int rc = 0;
    rc |= mkd("A.gguf", (mk_t){ "dflash", "vanilla", 32, 1, 0, 8, 2, DS_TYPE_F32, 7 }, A, sizeof A);
    rc |= mkd("A_legacy.gguf", (mk_t){ "dspark", "vanilla", 32, 1, 0, 8, 2, DS_TYPE_F32, 7 }, Al, sizeof Al);
    rc |= mkd("A_again.gguf", (mk_t){ "dflash", "vanilla", 32, 1, 0, 8, 2, DS_TYPE_F32, 7 }, A2, sizeof A2);
    rc |= mkd("C.gguf", (mk_t){ "dflash", "vanilla", 32, 1, 48, 8, 2, DS_TYPE_F32, 9 }, C, sizeof C);
    rc |= mkd("C_legacy.gguf", (mk_t){ "dspark", "vanilla", 32, 1, 48, 8, 2, DS_TYPE_F32, 9 }, Cl, sizeof Cl);
    rc |= mkd("C_norank.gguf", (mk_t){ "dflash", "vanilla", 0, 1, 40, 5, 1, DS_TYPE_F32, 10 }, Cw, sizeof Cw);
    rc |= mkd("gated.gguf", (mk_t){ "dflash", "gated", 24, 1, 0, 6, 2, DS_TYPE_F32, 11 }, Gd, sizeof Gd);
    rc |= mkd("rnn.gguf", (mk_t){ "dspark", "rnn", 16, 1, 0, 7, 2, DS_TYPE_F32, 12 }, Rn, sizeof Rn);
    rc |= mkd("nomarkov.gguf", (mk_t){ "dflash", "vanilla", 0, 1, 0, 4, 1, DS_TYPE_F32, 13 }, N0, sizeof N0);
    rc |= mkd("q8.gguf", (mk_t){ "dflash", "vanilla", 32, 1, 32, 7, 2, DS_TYPE_Q8_0, 14 }, Q8, sizeof Q8);
    /* Q8_0 vanilla / no-Markov with confidence: what a device's one-launch
     * head chain takes (test_exact compares it with the op-by-op path) */
    rc |= mkd("q8v.gguf", (mk_t){ "dflash", "vanilla", 32, 1, 0, 7, 2, DS_TYPE_Q8_0, 18 }, Q8V, sizeof Q8V);
    rc |= mkd("q8n.gguf", (mk_t){ "dflash", "vanilla", 0, 1, 0, 5, 1, DS_TYPE_Q8_0, 19 }, Q8N, sizeof Q8N);
    rc |= mkd("bf16.gguf", (mk_t){ "dflash", "rnn", 32, 1, 0, 7, 2, DS_TYPE_BF16, 15 }, BF, sizeof BF);
    rc |= mkd("f16.gguf", (mk_t){ "dspark", "gated", 32, 0, 0, 7, 2, DS_TYPE_F16, 16 }, F16, sizeof F16);
    rc |= mkd("g1.gguf", (mk_t){ "dflash", "vanilla", 8, 1, 0, 1, 1, DS_TYPE_F32, 17 }, G7, sizeof G7);
    CHECK(rc == 0, "make-drafter");
    if (rc) { tu_rmdir(g_dir); return tu_finish("test_drafter"); }
    CHECK(file_eq(A, A2), "make-drafter is not deterministic");
    CHECK(!file_eq(A, C), "different seeds gave the same file");
    PASS("make-drafter deterministic (same options -> same bytes)");

    test_tier1("tier1 dflash vanilla", A);
    test_tier1("tier1 legacy correction", Cl);
    test_tier1("tier1 q8_0 correction", Q8);
    test_tier1("tier1 bf16 rnn", BF);
    test_tier1("tier1 f16 gated no-confidence", F16);
    test_tier1("tier1 gamma=1", G7);

    test_tier2("vanilla", A, 1e-4);
    test_tier2("vanilla_legacy", Al, 1e-4);
    test_tier2("correction", C, 1e-4);
    test_tier2("correction_rank0", Cw, 1e-4);
    test_tier2("gated", Gd, 1e-4);
    test_tier2("rnn", Rn, 1e-4);
    test_tier2("no_markov", N0, 1e-4);
    test_tier2("gamma1", G7, 1e-4);
    /* reduced-precision weights against the same reference (which dequantizes
     * the weights exactly): F16/BF16 keep f32 activations, so the F32 bound
     * holds; the Q8_0 canonical matmul quantizes activations to Q8_0, hence
     * the looser bound there (argmax chain still checked exactly) */
    test_tier2("bf16_rnn", BF, 1e-4);
    test_tier2("f16_gated", F16, 1e-4);
    test_tier2("q8_0_correction", Q8, 5e-2);
    test_tier2("q8_0_vanilla", Q8V, 5e-2);
    test_tier2("q8_0_no_markov", Q8N, 5e-2);

    test_correction_oracle(C);
    test_chain_split();
    test_exact("vanilla", A);
    test_exact("correction", C);
    test_exact("rnn", Rn);
    test_exact("gated", Gd);
    test_exact("gamma1", G7);
    test_exact("q8_0 vanilla", Q8V);
    test_exact("q8_0 no-markov", Q8N);
    test_layouts("layouts dflash == dspark (vanilla)", A, Al);
    test_layouts("layouts dflash == dspark (correction)", C, Cl);
    test_bad_files(A, Cl);
    test_calls(A);
    test_with_target(C);

    /* a Llama target: NORMAL RoPE, no q/k norms in the drafter */
    {
        ds_model *qwen = g_tm;
        char qwen_path[320], L1[400];
        memcpy(qwen_path, g_target, sizeof qwen_path);
        mo.arch = "llama"; mo.n_layer = 2; mo.seed = 4;
        pathf(g_target, sizeof g_target, "target_llama.gguf");
        g_tm = ds_make_model(&mo, g_target, err, sizeof err) == 0 ? ds_model_load_on(g_target, tu_device(), err, sizeof err) : NULL;
        CHECK(g_tm != NULL, "llama target: %s", err);
        if (g_tm && mkd("llama_drafter.gguf", (mk_t){ "dflash", "vanilla", 16, 1, 24, 6, 2, DS_TYPE_F32, 21 }, L1, sizeof L1) == 0) {
            test_tier1("tier1 llama target", L1);
            test_tier2("llama_target", L1, 1e-4);
            test_exact("llama target", L1);
        }
        ds_model_free(g_tm);
        g_tm = qwen;
        memcpy(g_target, qwen_path, sizeof qwen_path);
    }

    ds_model_free(g_tm);
    tu_rmdir(g_dir);
    return tu_finish("test_drafter");
}
