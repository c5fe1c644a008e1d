/* test_models.c — the shipped models against PyTorch (a real
 * cross-implementation check) and the exactness contract on real weights.
 *
 *   1. tokenizer: dspark's C tokenizer gives exactly the trainer's ids on the
 *      whole validation split (data/val.txt.xz vs data/val_ids.u16.xz);
 *   2. target: logits for fixed prompts equal PyTorch's reference
 *      (data/ref_target_logits.bin) within rtol 1e-4, F32 math on the F16
 *      weights;
 *   3. drafter: fed PyTorch's tap features, the block's corrected logits,
 *      greedy chain and confidences equal data/ref_drafter_block.bin; and
 *      dspark's own taps equal PyTorch's features;
 *   4. canonical property on the trained weights (F16 and the Q8_0 made by
 *      quantize): batched rows == decode rows, memcmp, M = 1..8;
 *   5. the first-divergence experiment on the shipped pair: canonical gives
 *      FIRST_DIVERGENCE NONE; fast matmul finds a divergence.
 * Needs models/dspark-tiny-f16.gguf, models/dspark-tiny-q8_0.gguf (make
 * models) and xz. */
#include "testutil.h"
#include "diverge.h"
#include "drafter.h"
#include "drafter_internal.h"
#include "model.h"

#include <math.h>

#define TARGET_F16 "models/dspark-tiny-f16.gguf"
#define TARGET_Q8  "models/dspark-tiny-q8_0.gguf"
#define DRAFTER    "models/dspark-tiny-drafter-f16.gguf"

static unsigned char *slurp_cmd(const char *cmd, size_t *len) {
    FILE *f = popen(cmd, "r");
    if (!f) return NULL;
    size_t cap = 1 << 20, n = 0;
    unsigned char *b = malloc(cap);
    for (size_t r; b && (r = fread(b + n, 1, cap - n, f)) > 0;) {
        n += r;
        if (n == cap) { cap *= 2; b = realloc(b, cap); }
    }
    pclose(f);
    *len = n;
    return b;
}
static unsigned char *slurp(const char *path, size_t *len) {
    char cmd[512];
    snprintf(cmd, sizeof cmd, "cat '%s'", path);
    return slurp_cmd(cmd, len);
}
static uint32_t rd32(const unsigned char **p) { uint32_t v; memcpy(&v, *p, 4); *p += 4; return v; }

/* max |a-b| / max(|b|) over a row: the relative error of a logit row */
static double row_rel(const float *a, const float *b, int n, int skip) {
    double md = 0, mb = 0;
    for (int i = 0; i < n; i++) {
        if (i == skip) continue;
        double d = fabs((double)a[i] - (double)b[i]);
        if (d > md) md = d;
        if (fabs((double)b[i]) > mb) mb = fabs((double)b[i]);
    }
    return mb > 0 ? md / mb : md;
}

static void test_tokenizer(const ds_model *m) {
    size_t tl, il;
    unsigned char *text = slurp_cmd("xz -dc data/val.txt.xz", &tl);
    unsigned char *ids = slurp_cmd("xz -dc data/val_ids.u16.xz", &il);
    CHECK(text && ids && tl > 0 && il > 0, "cannot read the validation split");
    if (!text || !ids) return;
    int32_t *toks = NULL;
    size_t n = 0;
    char err[DS_ERRLEN];
    CHECK(ds_tokenize_ex(m->tok, (const char *)text, tl, 0, 0, &toks, &n, err, sizeof err) == 0, "tokenize: %s", err);
    size_t want = il / 2, first_bad = (size_t)-1;
    for (size_t i = 0; i < n && i < want; i++) {
        uint16_t v;
        memcpy(&v, ids + 2 * i, 2);
        if ((int32_t)v != toks[i]) { first_bad = i; break; }
    }
    int ok = n == want && first_bad == (size_t)-1;
    CHECK(ok, "validation split: dspark %zu tokens vs trainer %zu, first difference at %zd", n, want, (ssize_t)first_bad);
    printf("%s tokenizer_agreement validation_bytes=%zu tokens=%zu\n", ok ? "PASS" : "FAIL", tl, n);
    free(toks); free(text); free(ids);
}

static void test_target_logits(const ds_model *m) {
    size_t len;
    unsigned char *buf = slurp("data/ref_target_logits.bin", &len);
    CHECK(buf && len > 20 && !memcmp(buf, "DSRL", 4), "bad data/ref_target_logits.bin");
    if (!buf) return;
    const unsigned char *p = buf + 4;
    uint32_t ver = rd32(&p), np = rd32(&p), V = rd32(&p), nl = rd32(&p);
    CHECK(ver == 1 && V == (uint32_t)m->hp.n_vocab, "reference header mismatch");
    char err[DS_ERRLEN];
    ds_ctx *c = ds_ctx_new(m, 128, 2, err, sizeof err);
    double worst = 0;
    for (uint32_t k = 0; k < np; k++) {
        uint32_t n = rd32(&p);
        int32_t ids[128];
        for (uint32_t i = 0; i < n; i++) ids[i] = (int32_t)rd32(&p);
        const float *ref = (const float *)p;
        p += (size_t)nl * V * 4;
        float *lg = malloc((size_t)n * V * sizeof(float));
        ds_kv_truncate(c, 0);
        CHECK(ds_forward_batch(c, ids, (int)n, 0, DS_LOGITS_ALL, lg, NULL, err, sizeof err) == 0, "forward: %s", err);
        for (uint32_t r = 0; r < nl; r++) {
            float refrow[8192];
            memcpy(refrow, ref + (size_t)r * V, V * sizeof(float));
            double rel = row_rel(lg + (size_t)(n - nl + r) * V, refrow, (int)V, -1);
            if (rel > worst) worst = rel;
            CHECK(ds_argmax(lg + (size_t)(n - nl + r) * V, V) == ds_argmax(refrow, V), "prompt %u row %u: argmax differs", k, r);
        }
        free(lg);
    }
    CHECK(worst <= 1e-4, "target logits: max relative error %.3g > 1e-4", worst);
    printf("%s target_logits_vs_pytorch prompts=%u rows=%u max_rel_err=%.3g (tol 1e-4)\n", worst <= 1e-4 ? "PASS" : "FAIL", np, np * nl, worst);
    ds_ctx_free(c);
    free(buf);
}

static void test_drafter_block(const ds_model *m) {
    size_t len;
    unsigned char *buf = slurp("data/ref_drafter_block.bin", &len);
    CHECK(buf && len > 32 && !memcmp(buf, "DSRD", 4), "bad data/ref_drafter_block.bin");
    if (!buf) return;
    char err[DS_ERRLEN];
    ds_drafter *d = ds_drafter_load(DRAFTER, m, err, sizeof err);
    CHECK(d != NULL, "drafter: %s", err);
    if (!d) { free(buf); return; }
    CHECK(ds_drafter_head(d)->data == m->output.data, "the drafter's LM head is not the target's memory");
    const unsigned char *p = buf + 4;
    uint32_t ver = rd32(&p), nc = rd32(&p), V = rd32(&p), df = rd32(&p), gamma = rd32(&p), mask = rd32(&p);
    (void)rd32(&p);
    CHECK(ver == 1 && (int)gamma == ds_drafter_block_size(d) && (int32_t)mask == ds_drafter_mask_id(d), "reference header mismatch");
    ds_ctx *c = ds_ctx_new(m, 256, 2, err, sizeof err);
    CHECK(ds_set_taps(c, ds_drafter_tap_layers(d), ds_drafter_n_taps(d), err, sizeof err) == 0, "taps: %s", err);
    double worst_z = 0, worst_conf = 0, worst_tap = 0;
    int chain_ok = 1;
    for (uint32_t k = 0; k < nc; k++) {
        uint32_t pp = rd32(&p);
        int32_t ids[256];
        for (uint32_t i = 0; i <= pp; i++) ids[i] = (int32_t)rd32(&p);
        const float *feat = (const float *)p; p += (size_t)pp * df * 4;
        p += (size_t)gamma * V * 4;                               /* U: not exposed; z covers it */
        uint32_t chain[16];
        for (uint32_t i = 0; i < gamma; i++) chain[i] = rd32(&p);
        const float *z = (const float *)p; p += (size_t)gamma * V * 4;
        const float *conf = (const float *)p; p += (size_t)gamma * 4;

        /* dspark's own taps vs PyTorch's features */
        float *taps = malloc((size_t)pp * df * sizeof(float));
        ds_kv_truncate(c, 0);
        CHECK(ds_forward_batch(c, ids, (int)pp, 0, DS_LOGITS_NONE, NULL, taps, err, sizeof err) == 0, "forward: %s", err);
        for (uint32_t r = 0; r < pp; r++) {
            double rel = row_rel(taps + (size_t)r * df, feat + (size_t)r * df, (int)df, -1);
            if (rel > worst_tap) worst_tap = rel;
        }
        free(taps);

        /* the drafter on PyTorch's features */
        ds_dctx *x = ds_dctx_new(d, 256, ds_ctx_exec(c), err, sizeof err);
        float *fe = malloc((size_t)pp * df * sizeof(float));
        memcpy(fe, feat, (size_t)pp * df * sizeof(float));
        CHECK(ds_dctx_append(x, fe, (int)pp, 0, err, sizeof err) == 0, "append: %s", err);
        int32_t got[16];
        float gconf[16];
        float *gz = malloc((size_t)gamma * V * sizeof(float));
        ds_draft_opts o = { NULL, (int)gamma };
        CHECK(ds_draft(x, ids[pp], (int)pp, &o, got, gconf, gz, err, sizeof err) == 0, "draft: %s", err);
        for (uint32_t s = 0; s < gamma; s++) {
            float zr[8192];
            memcpy(zr, z + (size_t)s * V, V * sizeof(float));
            double rel = row_rel(gz + (size_t)s * V, zr, (int)V, (int)mask);   /* dspark suppresses MASK */
            if (rel > worst_z) worst_z = rel;
            if ((uint32_t)got[s] != chain[s]) chain_ok = 0;
            double dc = fabs((double)gconf[s] - (double)conf[s]);
            if (dc > worst_conf) worst_conf = dc;
        }
        free(gz); free(fe);
        ds_dctx_free(x);
    }
    CHECK(worst_tap <= 1e-4, "taps vs PyTorch features: %.3g > 1e-4", worst_tap);
    CHECK(worst_z <= 1e-4, "drafter block logits: %.3g > 1e-4", worst_z);
    CHECK(chain_ok, "drafter greedy chain differs from PyTorch's");
    CHECK(worst_conf <= 1e-4, "confidence differs by %.3g", worst_conf);
    printf("%s drafter_block_vs_pytorch cases=%u taps_rel=%.3g z_rel=%.3g chain=%s conf_abs=%.3g (tol 1e-4)\n",
           worst_tap <= 1e-4 && worst_z <= 1e-4 && chain_ok && worst_conf <= 1e-4 ? "PASS" : "FAIL",
           nc, worst_tap, worst_z, chain_ok ? "identical" : "DIFFERENT", worst_conf);
    ds_ctx_free(c);
    ds_drafter_free(d);
    free(buf);
}

/* 4 + 5: exactness on trained weights */
static void test_exactness(const char *path) {
    char err[DS_ERRLEN];
    ds_model *m = ds_model_load_on(path, tu_device(), err, sizeof err);
    CHECK(m != NULL, "%s: %s", path, err);
    if (!m) return;
    ds_ctx *c = ds_ctx_new(m, 256, 2, err, sizeof err);
    int32_t prompt[100], block[8];
    for (int i = 0; i < 100; i++) prompt[i] = (int32_t)((i * 977 + 31) % 8000);
    for (int i = 0; i < 8; i++) block[i] = (int32_t)((i * 211 + 7) % 8000);
    const int V = m->hp.n_vocab;
    float *a = malloc((size_t)8 * V * sizeof(float)), *b = malloc((size_t)8 * V * sizeof(float));
    int bad = 0;
    for (int M = 1; M <= 8; M++) {
        ds_kv_truncate(c, 0);
        ds_forward_batch(c, prompt, 100, 0, DS_LOGITS_NONE, NULL, NULL, err, sizeof err);
        ds_forward_batch(c, block, M, 100, DS_LOGITS_ALL, a, NULL, err, sizeof err);
        ds_kv_truncate(c, 100);
        for (int r = 0; r < M; r++) ds_decode(c, block[r], 100 + r, b + (size_t)r * V, NULL, err, sizeof err);
        if (memcmp(a, b, (size_t)M * V * sizeof(float))) bad++;
    }
    CHECK(bad == 0, "%s: canonical batched logits differ from decode for %d widths", path, bad);
    printf("%s canonical_property_trained model=%s widths=1..8\n", bad ? "FAIL" : "PASS", path);

    ds_diverge_opts o = { prompt, 100, block, 8, { { 0 } } };
    ds_kernel_set_all(&o.ks, DS_CANONICAL);
    ds_diverge_result r;
    CHECK(ds_diverge_run(c, &o, &r, err, sizeof err) == 0, "diverge: %s", err);
    int none = r.gate_control && r.gate_probe && dsd_report_identical(&r.report);
    CHECK(none, "%s: canonical diverge did not report NONE", path);
    printf("%s diverge_canonical model=%s FIRST_DIVERGENCE NONE compared_objects=%zu\n", none ? "PASS" : "FAIL", path, r.report.compared_objects);
    ds_diverge_result_free(&r);
    ds_kernel_set_all(&o.ks, DS_CANONICAL);
    o.ks.v[ds_matmul_family(m->weight_type)] = DS_FAST;
    CHECK(ds_diverge_run(c, &o, &r, err, sizeof err) == 0, "diverge: %s", err);
    const dsd_object_result *first = dsd_report_first(&r.report);
    CHECK(first != NULL, "%s: fast matmul produced no divergence (the check cannot fail)", path);
    if (first) printf("PASS diverge_fast_%s model=%s first_divergence row=%d layer=%d checkpoint=%s\n",
                      ds_family_name(ds_matmul_family(m->weight_type)), path, first->key.row, first->key.layer, dsd_cp_name(first->key.cp));
    ds_diverge_result_free(&r);
    free(a); free(b);
    ds_ctx_free(c);
    ds_model_free(m);
}

int main(void) {
    char err[DS_ERRLEN];
    ds_model *m = ds_model_load_on(TARGET_F16, tu_device(), err, sizeof err);
    if (!m) { printf("FAIL %s: %s (run `make models`)\n", TARGET_F16, err); return 1; }
    test_tokenizer(m);
    test_target_logits(m);
    test_drafter_block(m);
    ds_model_free(m);
    test_exactness(TARGET_F16);
    test_exactness(TARGET_Q8);
    return tu_finish("test_models");
}
