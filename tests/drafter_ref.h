/* drafter_ref.h — an INDEPENDENT scalar double-precision reference of the
 * DSpark drafter forward (spec §1.2-§1.6, §2.1-§2.5, §3.1), for
 * tests/test_drafter.c. It uses no dspark kernels and none of the drafter's
 * code: tensors are read through gguf.h and dequantized here (F32, F16,
 * BF16, Q8_0), every sum is a double, attention is a plain two-pass softmax.
 *
 * It also reads and writes `ref.bin` in the layout of the llama.cpp DSpark
 * forward test (little-endian):
 *   int32 n_ctx_rows, int32 n_embd_cap, int32 block_size, int32 vocab_size
 *   int32 [n_ctx_rows]              ctx_pos
 *   f32   [n_ctx_rows * n_embd_cap] ctx_feat   (row-major)
 *   int32 [block_size]              draft_token_ids  ([anchor, MASK...])
 *   int32 [block_size]              draft_pos
 *   f32   [block_size * vocab_size] ref_logits (row-major)
 */
#ifndef DSPARK_DRAFTER_REF_H
#define DSPARK_DRAFTER_REF_H

#include "gguf.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- ref.bin ------------------------------------------------------------- */
typedef struct {
    int32_t n_ctx_rows, n_embd_cap, block_size, vocab;
    int32_t *ctx_pos;
    float   *ctx_feat;
    int32_t *draft_ids, *draft_pos;
    float   *logits;
} refbin;

static void refbin_free(refbin *b) {
    free(b->ctx_pos); free(b->ctx_feat); free(b->draft_ids); free(b->draft_pos); free(b->logits);
    memset(b, 0, sizeof *b);
}

static int refbin_write(const char *path, const refbin *b) {
    FILE *f = fopen(path, "wb");
    if (!f) return -1;
    int32_t hdr[4] = { b->n_ctx_rows, b->n_embd_cap, b->block_size, b->vocab };
    size_t nf = (size_t)b->n_ctx_rows * b->n_embd_cap, nl = (size_t)b->block_size * b->vocab;
    int ok = fwrite(hdr, 4, 4, f) == 4 &&
             fwrite(b->ctx_pos, 4, (size_t)b->n_ctx_rows, f) == (size_t)b->n_ctx_rows &&
             fwrite(b->ctx_feat, 4, nf, f) == nf &&
             fwrite(b->draft_ids, 4, (size_t)b->block_size, f) == (size_t)b->block_size &&
             fwrite(b->draft_pos, 4, (size_t)b->block_size, f) == (size_t)b->block_size &&
             fwrite(b->logits, 4, nl, f) == nl;
    return fclose(f) == 0 && ok ? 0 : -1;
}

static int refbin_read(const char *path, refbin *b) {
    memset(b, 0, sizeof *b);
    FILE *f = fopen(path, "rb");
    if (!f) return -1;
    int32_t hdr[4];
    if (fread(hdr, 4, 4, f) != 4 || hdr[0] < 0 || hdr[1] < 1 || hdr[2] < 1 || hdr[3] < 1 ||
        hdr[0] > (1 << 20) || hdr[1] > (1 << 20) || hdr[2] > 4096 || hdr[3] > (1 << 24)) { fclose(f); return -1; }
    b->n_ctx_rows = hdr[0]; b->n_embd_cap = hdr[1]; b->block_size = hdr[2]; b->vocab = hdr[3];
    size_t nf = (size_t)b->n_ctx_rows * b->n_embd_cap, nl = (size_t)b->block_size * b->vocab;
    b->ctx_pos = malloc((size_t)b->n_ctx_rows * 4 + 4);
    b->ctx_feat = malloc(nf * 4 + 4);
    b->draft_ids = malloc((size_t)b->block_size * 4);
    b->draft_pos = malloc((size_t)b->block_size * 4);
    b->logits = malloc(nl * 4);
    int ok = b->ctx_pos && b->ctx_feat && b->draft_ids && b->draft_pos && b->logits &&
             fread(b->ctx_pos, 4, (size_t)b->n_ctx_rows, f) == (size_t)b->n_ctx_rows &&
             fread(b->ctx_feat, 4, nf, f) == nf &&
             fread(b->draft_ids, 4, (size_t)b->block_size, f) == (size_t)b->block_size &&
             fread(b->draft_pos, 4, (size_t)b->block_size, f) == (size_t)b->block_size &&
             fread(b->logits, 4, nl, f) == nl;
    char extra;
    if (ok && fread(&extra, 1, 1, f) == 1) ok = 0;        /* trailing bytes */
    fclose(f);
    if (!ok) { refbin_free(b); return -1; }
    return 0;
}

/* ---- the reference drafter --------------------------------------------------- */
typedef struct { double *w; int64_t n_in, n_out; } rmat;   /* [n_out][n_in] */

typedef struct {
    double *an, *qn, *kn, *fn;
    rmat q, k, v, o, g, u, d;
} rlayer;

typedef struct {
    int V, D, H, Hkv, hd, ff, L, gamma, n_taps, rank, markov /* 0 none 1 vanilla 2 gated 3 rnn */;
    int has_conf, conf_wm, corr_w, neox;
    int32_t mask;
    double eps, rope_base, conf_b;
    rmat fc, E, head, w1, w2, mgate, mjoint, conf, cg, cu, cd;
    double *hidden_norm, *out_norm, *mgate_b, *mjoint_b, *chn, *cen;
    rlayer *layers;
} dref;

static double *ref_dequant(const gguf_tensor *t) {
    uint64_t n = 1;
    for (uint32_t i = 0; i < t->n_dims; i++) n *= t->ne[i];
    double *o = malloc((size_t)n * sizeof(double) + 8);
    if (!o) return NULL;
    const uint8_t *p = t->data;
    for (uint64_t i = 0; i < n; i++) {
        switch (t->type) {
        case 0: { float f; memcpy(&f, p + 4 * i, 4); o[i] = f; break; }
        case 1: { uint16_t h; memcpy(&h, p + 2 * i, 2); o[i] = ds_fp16_to_f32(h); break; }
        case 30: { uint16_t h; memcpy(&h, p + 2 * i, 2); o[i] = ds_bf16_to_f32(h); break; }
        case 8: {
            const uint8_t *blk = p + (i / 32) * 34;
            uint16_t dh; memcpy(&dh, blk, 2);
            o[i] = (double)ds_fp16_to_f32(dh) * (double)(int8_t)blk[2 + i % 32];
            break;
        }
        default: free(o); return NULL;
        }
    }
    return o;
}

static int ref_get(const gguf_ctx *g, const char *name, int opt, double **out, int64_t *ne0, int64_t *ne1, char *err) {
    const gguf_tensor *t = gguf_find_tensor(g, name);
    if (!t) {
        if (opt) { *out = NULL; return 0; }
        snprintf(err, 256, "ref: missing %s", name);
        return -1;
    }
    *out = ref_dequant(t);
    if (!*out) { snprintf(err, 256, "ref: cannot read %s", name); return -1; }
    if (ne0) *ne0 = (int64_t)t->ne[0];
    if (ne1) *ne1 = t->n_dims > 1 ? (int64_t)t->ne[1] : 1;
    return 0;
}
static int ref_mat(const gguf_ctx *g, const char *name, int opt, rmat *m, char *err) {
    return ref_get(g, name, opt, &m->w, &m->n_in, &m->n_out, err);
}

static uint32_t ref_u32(const gguf_ctx *g, const char *key, uint32_t dflt) {
    uint64_t v;
    return gguf_get_u64(g, key, &v) == 0 ? (uint32_t)v : dflt;
}
static double ref_f32(const gguf_ctx *g, const char *key, double dflt) {
    float v;
    return gguf_get_f32(g, key, &v) == 0 ? v : dflt;
}

static void dref_free(dref *R) {
    free(R->fc.w); free(R->E.w); if (R->head.w != R->E.w) free(R->head.w);
    free(R->w1.w); free(R->w2.w); free(R->mgate.w); free(R->mjoint.w); free(R->conf.w);
    free(R->cg.w); free(R->cu.w); free(R->cd.w);
    free(R->hidden_norm); free(R->out_norm); free(R->mgate_b); free(R->mjoint_b); free(R->chn); free(R->cen);
    for (int l = 0; R->layers && l < R->L; l++) {
        rlayer *y = &R->layers[l];
        free(y->an); free(y->qn); free(y->kn); free(y->fn);
        free(y->q.w); free(y->k.w); free(y->v.w); free(y->o.w); free(y->g.w); free(y->u.w); free(y->d.w);
    }
    free(R->layers);
    memset(R, 0, sizeof *R);
}

/* Load the drafter (either layout) and the target's embedding / head. */
static int dref_load(dref *R, const char *drafter_path, const char *target_path, char *err) {
    memset(R, 0, sizeof *R);
    char e2[512];
    gguf_ctx *tg = gguf_open(target_path, e2, sizeof e2);
    if (!tg) { snprintf(err, 256, "ref: %.200s", e2); return -1; }
    gguf_ctx *g = gguf_open(drafter_path, e2, sizeof e2);
    if (!g) { gguf_close(tg); snprintf(err, 256, "ref: %.200s", e2); return -1; }
    int rc = -1;
    gguf_str a;
    gguf_get_str(tg, "general.architecture", &a);
    R->neox = gguf_str_eq(a, "qwen3");
    gguf_get_str(g, "general.architecture", &a);
    int legacy = gguf_str_eq(a, "dspark");
    const char *P = legacy ? "dspark." : "dflash.";
    char k[160];
#define RK(s) (snprintf(k, sizeof k, "%s%s", P, s), k)
    R->L = (int)ref_u32(g, RK("block_count"), 0);
    R->D = (int)ref_u32(g, RK("embedding_length"), 0);
    R->H = (int)ref_u32(g, RK("attention.head_count"), 0);
    R->Hkv = (int)ref_u32(g, RK("attention.head_count_kv"), (uint32_t)R->H);
    R->hd = (int)ref_u32(g, RK("attention.key_length"), R->H ? (uint32_t)(R->D / R->H) : 0);
    R->ff = (int)ref_u32(g, RK("feed_forward_length"), 0);
    R->rope_base = ref_f32(g, RK("rope.freq_base"), 10000.0);
    R->eps = ref_f32(g, RK("attention.layer_norm_rms_epsilon"), 1e-6);
#undef RK
    R->gamma = (int)ref_u32(g, legacy ? "dspark.dspark.block_size" : "dflash.block_size", 0);
    R->mask = (int32_t)ref_u32(g, legacy ? "dspark.dspark.mask_token_id" : "tokenizer.ggml.mask_token_id", 0);
    gguf_str mt;
    R->markov = 1;
    if (gguf_get_str(g, legacy ? "dspark.markov_head_type" : "dflash.markov_head_type", &mt) == 0) {
        if (gguf_str_eq(mt, "gated")) R->markov = 2;
        else if (gguf_str_eq(mt, "rnn")) R->markov = 3;
    }
    /* shared embedding / head from the TARGET file */
    if (ref_mat(tg, "token_embd.weight", 0, &R->E, err)) goto done;
    if (gguf_find_tensor(tg, "output.weight")) { if (ref_mat(tg, "output.weight", 0, &R->head, err)) goto done; }
    else R->head = R->E;
    R->V = (int)R->E.n_out;
    /* drafter tensors */
    const char *fc = legacy ? "dspark.fc.weight" : "fc.weight";
    const char *hn = legacy ? "dspark.hidden_norm.weight" : "enc.output_norm.weight";
    if (ref_mat(g, fc, 0, &R->fc, err) || ref_get(g, hn, 0, &R->hidden_norm, NULL, NULL, err) ||
        ref_get(g, "output_norm.weight", 0, &R->out_norm, NULL, NULL, err))
        goto done;
    R->n_taps = (int)(R->fc.n_in / R->D);
    R->layers = calloc((size_t)R->L, sizeof(rlayer));
    if (!R->layers) goto done;
    for (int l = 0; l < R->L; l++) {
        rlayer *y = &R->layers[l];
        char n[96];
#define LN(s) (snprintf(n, sizeof n, "blk.%d.%s.weight", l, s), n)
        if (ref_get(g, LN("attn_norm"), 0, &y->an, NULL, NULL, err) || ref_get(g, LN("ffn_norm"), 0, &y->fn, NULL, NULL, err) ||
            ref_get(g, LN("attn_q_norm"), 1, &y->qn, NULL, NULL, err) || ref_get(g, LN("attn_k_norm"), 1, &y->kn, NULL, NULL, err) ||
            ref_mat(g, LN("attn_q"), 0, &y->q, err) || ref_mat(g, LN("attn_k"), 0, &y->k, err) ||
            ref_mat(g, LN("attn_v"), 0, &y->v, err) || ref_mat(g, LN("attn_output"), 0, &y->o, err) ||
            ref_mat(g, LN("ffn_gate"), 0, &y->g, err) || ref_mat(g, LN("ffn_up"), 0, &y->u, err) ||
            ref_mat(g, LN("ffn_down"), 0, &y->d, err))
            goto done;
#undef LN
    }
    if (ref_mat(g, legacy ? "dspark.markov_head_a.weight" : "markov_w1.weight", 1, &R->w1, err) ||
        ref_mat(g, legacy ? "dspark.markov_head_b.weight" : "markov_w2.weight", 1, &R->w2, err))
        goto done;
    R->rank = R->w1.w ? (int)R->w1.n_in : 0;
    if (!R->rank) R->markov = 0;
    if (R->markov == 2 && (ref_mat(g, legacy ? "dspark.markov_gate.weight" : "markov_gate.weight", 0, &R->mgate, err) ||
                           ref_get(g, legacy ? "dspark.markov_gate.bias" : "markov_gate.bias", 0, &R->mgate_b, NULL, NULL, err)))
        goto done;
    if (R->markov == 3 && (ref_mat(g, legacy ? "dspark.markov_joint.weight" : "markov_joint.weight", 0, &R->mjoint, err) ||
                           ref_get(g, legacy ? "dspark.markov_joint.bias" : "markov_joint.bias", 0, &R->mjoint_b, NULL, NULL, err)))
        goto done;
    if (ref_mat(g, legacy ? "dspark.confidence_head.weight" : "conf_proj.weight", 1, &R->conf, err)) goto done;
    R->has_conf = R->conf.w != NULL;
    R->conf_wm = R->has_conf && R->rank && R->conf.n_in == R->D + R->rank;
    {
        double *cb = NULL;
        if (ref_get(g, legacy ? "dspark.confidence_head.bias" : "conf_proj.bias", 1, &cb, NULL, NULL, err)) goto done;
        R->conf_b = cb ? cb[0] : 0.0;
        free(cb);
    }
    const char *cp = legacy ? "dspark." : "";
    char cn[160];
#define CNAME(s) (snprintf(cn, sizeof cn, "%s%s", cp, s), cn)
    if (ref_mat(g, CNAME("correction_gate.weight"), 1, &R->cg, err)) goto done;
    if (R->cg.w) {
        R->corr_w = (int)R->cg.n_out;
        if (ref_mat(g, CNAME("correction_up.weight"), 0, &R->cu, err) ||
            ref_mat(g, CNAME("correction_down.weight"), 0, &R->cd, err) ||
            ref_get(g, CNAME("correction_hidden_norm.weight"), 0, &R->chn, NULL, NULL, err) ||
            ref_get(g, CNAME("correction_embed_norm.weight"), 0, &R->cen, NULL, NULL, err))
            goto done;
    }
#undef CNAME
    rc = 0;
done:
    gguf_close(g);
    gguf_close(tg);
    if (rc) dref_free(R);
    return rc;
}

/* y[n_out] = W x */
static void ref_mv(const rmat *W, const double *x, double *y) {
    for (int64_t o = 0; o < W->n_out; o++) {
        const double *w = W->w + (size_t)o * W->n_in;
        double s = 0;
        for (int64_t i = 0; i < W->n_in; i++) s += w[i] * x[i];
        y[o] = s;
    }
}
static void ref_rms(const double *x, const double *w, int n, double eps, double *y) {
    double ss = 0;
    for (int i = 0; i < n; i++) ss += x[i] * x[i];
    double sc = 1.0 / sqrt(ss / n + eps);
    for (int i = 0; i < n; i++) y[i] = x[i] * sc * w[i];
}
static void ref_rope(double *x, int n_heads, int hd, int pos, double base, int neox) {
    for (int h = 0; h < n_heads; h++) {
        double *v = x + (size_t)h * hd;
        for (int i = 0; i < hd / 2; i++) {
            double th = pos * pow(base, -2.0 * i / hd), c = cos(th), s = sin(th);
            int a = neox ? i : 2 * i, b = neox ? i + hd / 2 : 2 * i + 1;
            double x0 = v[a], x1 = v[b];
            v[a] = x0 * c - x1 * s;
            v[b] = x0 * s + x1 * c;
        }
    }
}
static double ref_sig(double x) { return 1.0 / (1.0 + exp(-x)); }
static int32_t ref_argmax(const double *z, int n) {
    int32_t b = 0;
    for (int i = 1; i < n; i++) if (z[i] > z[b]) b = i;
    return b;
}

/* One drafting round, greedy: n_ctx context rows (features at positions
 * ctx_pos), block ids/positions. Outputs any of: logits [gamma][V] (after
 * z[MASK] = -1e6), conf [gamma], ids [gamma], hidden [gamma][D] (post
 * output_norm). Returns 0 or -1 (out of memory). */
static int dref_run(const dref *R, int n_ctx, const int32_t *ctx_pos, const float *ctx_feat,
                    const int32_t *blk_ids, const int32_t *blk_pos,
                    double *logits, double *conf, int32_t *ids, double *hidden) {
    const int D = R->D, G = R->gamma, H = R->H, Hkv = R->Hkv, hd = R->hd, V = R->V, r = R->rank;
    const int kvd = Hkv * hd, qd = H * hd, T = n_ctx + G, mfeat = R->n_taps * D;
    double *K = calloc((size_t)R->L * T * kvd, sizeof(double)), *Vc = calloc((size_t)R->L * T * kvd, sizeof(double));
    double *x = malloc((size_t)G * D * sizeof(double)), *a = malloc((size_t)(D > qd ? D : qd) * 2 * sizeof(double));
    double *feat = malloc((size_t)mfeat * sizeof(double)), *c = malloc((size_t)D * 2 * sizeof(double));
    double *q = malloc((size_t)G * qd * sizeof(double)), *o = malloc((size_t)qd * sizeof(double));
    double *sc = malloc((size_t)T * sizeof(double)), *t1 = malloc((size_t)(R->ff + R->corr_w + 4 * r + 3 * D + 16) * sizeof(double));
    double *t2 = malloc((size_t)(R->ff + R->corr_w + 4 * r + 3 * D + 16) * sizeof(double)), *z = malloc((size_t)V * sizeof(double));
    double *hbuf = malloc((size_t)G * D * sizeof(double)), *st = calloc((size_t)r + 1, sizeof(double));
    double *bias = malloc((size_t)V * sizeof(double)), *in = malloc((size_t)(2 * r + 2 * D + 4) * sizeof(double));
    int rc = -1;
    if (!K || !Vc || !x || !a || !feat || !c || !q || !o || !sc || !t1 || !t2 || !z || !hbuf || !st || !bias || !in) goto out;
    /* context rows */
    for (int t = 0; t < n_ctx; t++) {
        for (int i = 0; i < mfeat; i++) {
            double v = ctx_feat[(size_t)t * mfeat + i];
            if (v != v) v = 0; else if (v > 65504.0) v = 65504.0; else if (v < -65504.0) v = -65504.0;
            feat[i] = v;
        }
        ref_mv(&R->fc, feat, c);
        ref_rms(c, R->hidden_norm, D, R->eps, c + D);
        for (int l = 0; l < R->L; l++) {
            const rlayer *y = &R->layers[l];
            double *kr = K + ((size_t)l * T + t) * kvd, *vr = Vc + ((size_t)l * T + t) * kvd;
            ref_mv(&y->k, c + D, kr);
            ref_mv(&y->v, c + D, vr);
            if (y->kn) for (int h = 0; h < Hkv; h++) ref_rms(kr + h * hd, y->kn, hd, R->eps, kr + h * hd);
            ref_rope(kr, Hkv, hd, ctx_pos[t], R->rope_base, R->neox);
        }
    }
    /* block */
    for (int i = 0; i < G; i++) for (int j = 0; j < D; j++) x[(size_t)i * D + j] = R->E.w[(size_t)blk_ids[i] * D + j];
    for (int l = 0; l < R->L; l++) {
        const rlayer *y = &R->layers[l];
        for (int i = 0; i < G; i++) {
            ref_rms(x + (size_t)i * D, y->an, D, R->eps, a);
            double *qi = q + (size_t)i * qd, *kr = K + ((size_t)l * T + n_ctx + i) * kvd, *vr = Vc + ((size_t)l * T + n_ctx + i) * kvd;
            ref_mv(&y->q, a, qi);
            ref_mv(&y->k, a, kr);
            ref_mv(&y->v, a, vr);
            if (y->qn) for (int h = 0; h < H; h++) ref_rms(qi + h * hd, y->qn, hd, R->eps, qi + h * hd);
            if (y->kn) for (int h = 0; h < Hkv; h++) ref_rms(kr + h * hd, y->kn, hd, R->eps, kr + h * hd);
            ref_rope(qi, H, hd, blk_pos[i], R->rope_base, R->neox);
            ref_rope(kr, Hkv, hd, blk_pos[i], R->rope_base, R->neox);
        }
        for (int i = 0; i < G; i++) {
            /* non-causal attention over all context and block rows */
            for (int h = 0; h < H; h++) {
                int kh = h / (H / Hkv);
                const double *qh = q + (size_t)i * qd + h * hd;
                double mx = -INFINITY, den = 0;
                for (int t = 0; t < T; t++) {
                    const double *kt = K + ((size_t)l * T + t) * kvd + kh * hd;
                    double s = 0;
                    for (int e = 0; e < hd; e++) s += qh[e] * kt[e];
                    sc[t] = s / sqrt((double)hd);
                    if (sc[t] > mx) mx = sc[t];
                }
                for (int t = 0; t < T; t++) { sc[t] = exp(sc[t] - mx); den += sc[t]; }
                for (int e = 0; e < hd; e++) {
                    double s = 0;
                    for (int t = 0; t < T; t++) s += sc[t] * Vc[((size_t)l * T + t) * kvd + kh * hd + e];
                    o[h * hd + e] = s / den;
                }
            }
            ref_mv(&y->o, o, a);
            for (int j = 0; j < D; j++) hbuf[(size_t)i * D + j] = x[(size_t)i * D + j] + a[j];
        }
        for (int i = 0; i < G; i++) {
            double *xi = hbuf + (size_t)i * D;
            ref_rms(xi, y->fn, D, R->eps, a);
            ref_mv(&y->g, a, t1);
            ref_mv(&y->u, a, t2);
            for (int j = 0; j < R->ff; j++) t1[j] = t1[j] / (1.0 + exp(-t1[j])) * t2[j];
            ref_mv(&y->d, t1, t2);
            for (int j = 0; j < D; j++) x[(size_t)i * D + j] = xi[j] + t2[j];
        }
    }
    for (int i = 0; i < G; i++) ref_rms(x + (size_t)i * D, R->out_norm, D, R->eps, hbuf + (size_t)i * D);
    if (hidden) memcpy(hidden, hbuf, (size_t)G * D * sizeof(double));
    /* heads */
    int32_t prev = blk_ids[0];
    for (int k = 0; k < G; k++) {
        const double *h = hbuf + (size_t)k * D;
        const double *e = r ? R->w1.w + (size_t)prev * r : NULL;
        if (R->corr_w) {
            const int w = R->corr_w;
            ref_rms(h, R->chn, D, 1e-6, in);
            ref_rms(R->E.w + (size_t)prev * D, R->cen, D, 1e-6, in + D);
            ref_mv(&R->cg, in, t1);
            ref_mv(&R->cu, in, t2);
            for (int j = 0; j < w; j++) t1[j] = t1[j] / (1.0 + exp(-t1[j])) * t2[j];
            ref_mv(&R->cd, t1, t2);
            for (int j = 0; j < D; j++) c[j] = h[j] + t2[j];
            ref_mv(&R->head, c, z);
            if (r) {
                ref_mv(&R->w2, R->w1.w + (size_t)blk_ids[k] * r, bias);
                for (int v = 0; v < V; v++) z[v] += bias[v];
            }
        } else {
            ref_mv(&R->head, h, z);
            if (r) {
                const double *src = e;
                if (R->markov == 2) {
                    memcpy(in, h, (size_t)D * sizeof(double));
                    memcpy(in + D, e, (size_t)r * sizeof(double));
                    ref_mv(&R->mgate, in, t1);
                    for (int j = 0; j < r; j++) t2[j] = ref_sig(t1[j] + R->mgate_b[j]) * e[j];
                    src = t2;
                } else if (R->markov == 3) {
                    memcpy(in, st, (size_t)r * sizeof(double));
                    memcpy(in + r, e, (size_t)r * sizeof(double));
                    memcpy(in + 2 * r, h, (size_t)D * sizeof(double));
                    ref_mv(&R->mjoint, in, t1);
                    for (int j = 0; j < r; j++) {
                        double gt = ref_sig(t1[j] + R->mjoint_b[j]), cd = tanh(t1[r + j] + R->mjoint_b[r + j]);
                        st[j] = gt * st[j] + (1 - gt) * cd;
                        t2[j] = tanh(t1[2 * r + j] + R->mjoint_b[2 * r + j]);
                    }
                    src = t2;
                }
                ref_mv(&R->w2, src, bias);
                for (int v = 0; v < V; v++) z[v] += bias[v];
            }
        }
        z[R->mask] = -1e6;
        if (conf) {
            if (R->has_conf) {
                memcpy(in, h, (size_t)D * sizeof(double));
                if (R->conf_wm) memcpy(in + D, e, (size_t)r * sizeof(double));
                double lc;
                ref_mv(&R->conf, in, &lc);
                conf[k] = ref_sig(lc + R->conf_b);
            } else conf[k] = 1.0;
        }
        int32_t tok = ref_argmax(z, V);
        if (ids) ids[k] = tok;
        if (logits) memcpy(logits + (size_t)k * V, z, (size_t)V * sizeof(double));
        prev = tok;
    }
    rc = 0;
out:
    free(K); free(Vc); free(x); free(a); free(feat); free(c); free(q); free(o); free(sc); free(t1); free(t2);
    free(z); free(hbuf); free(st); free(bias); free(in);
    return rc;
}

#endif
