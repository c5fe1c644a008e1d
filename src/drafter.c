/* drafter.c — loading and validating a DSpark drafter GGUF against its
 * target (spec §4.1 mainline `dflash` layout, §4.2 PrismML legacy `dspark`
 * layout). The forward pass lives in drafter_forward.c.
 *
 * Conventions decided here:
 *  - Tap ids are kept as HF ids (output of decoder layer L, 0-based), which
 *    is what ds_set_taps wants. The dflash layout stores L+1 (llama.cpp's
 *    layer-input convention); we subtract 1. A stored value equal to the
 *    target's n_layer ("pre-final-norm hidden") therefore maps to HF id
 *    n_layer-1, the raw residual leaving the last layer, which is exactly
 *    that hidden. A stored 0 (HF -1, the embedding output) is rejected:
 *    dspark's taps are layer outputs.
 *  - token_embd / output are always the TARGET's (same memory). A legacy
 *    file's own copies are shape-checked and ignored (describe() says so).
 *  - q/k norms are optional as a pair (Qwen3 trunks have them, Llama trunks
 *    do not); RoPE is NEOX for a qwen3 target and NORMAL for a llama target
 *    (convert permutes a Llama drafter's q/k rows exactly like the target's).
 *  - A correction head implies PrismML's graph-corrected order (spec §2.5),
 *    which is defined for a vanilla Markov head only (or none). */
#include "drafter_internal.h"

#include <stdlib.h>

const char *ds_markov_type_name(int t) {
    switch (t) {
    case DS_MARKOV_VANILLA: return "vanilla";
    case DS_MARKOV_GATED: return "gated";
    case DS_MARKOV_RNN: return "rnn";
    default: return "none";
    }
}

/* ---- metadata helpers --------------------------------------------------- */

/* u32-ish integer: 0 ok, 1 absent, -1 error (written). */
static int kv_u32(const gguf_ctx *g, const char *key, int req, uint32_t lo, uint32_t hi, uint32_t *out,
                  char *err, size_t errlen) {
    uint64_t v;
    int rc = gguf_get_u64(g, key, &v);
    if (rc == -1) {
        if (req) { ds_errf(err, errlen, "drafter: missing metadata key '%s'", key); return -1; }
        return 1;
    }
    if (rc != 0) { ds_errf(err, errlen, "drafter: metadata key '%s' has the wrong type (want an unsigned integer)", key); return -1; }
    if (v < lo || v > hi) {
        ds_errf(err, errlen, "drafter: metadata key '%s' = %llu is out of range [%u, %u]", key, (unsigned long long)v, lo, hi);
        return -1;
    }
    *out = (uint32_t)v;
    return 0;
}

static int kv_bool(const gguf_ctx *g, const char *key, int *out, char *err, size_t errlen) {
    int rc = gguf_get_bool(g, key, out);
    if (rc == -1) return 1;
    if (rc != 0) { ds_errf(err, errlen, "drafter: metadata key '%s' has the wrong type (want a bool or \"true\"/\"false\")", key); return -1; }
    return 0;
}

static int kv_f32(const gguf_ctx *g, const char *key, float *out, char *err, size_t errlen) {
    int rc = gguf_get_f32(g, key, out);
    if (rc == -1) return 1;
    if (rc != 0) { ds_errf(err, errlen, "drafter: metadata key '%s' has the wrong type (want f32)", key); return -1; }
    return 0;
}

/* ---- tensor helpers ------------------------------------------------------ */

static void shape_str(const gguf_tensor *t, char *buf, size_t n) {
    buf[0] = 0;
    for (uint32_t i = 0; i < t->n_dims; i++) {
        size_t l = strlen(buf);
        snprintf(buf + l, n - l, "%s%llu", i ? ", " : "", (unsigned long long)t->ne[i]);
    }
}

/* Tensor `name` with ggml shape {ne0} (ne1 == 0) or {ne0, ne1}; a trailing
 * dimension of 1 may be omitted or present. */
static const gguf_tensor *want(const gguf_ctx *g, const char *name, int64_t ne0, int64_t ne1, char *err, size_t errlen) {
    const gguf_tensor *t = gguf_find_tensor(g, name);
    if (!t) { ds_errf(err, errlen, "drafter: missing tensor '%s'", name); return NULL; }
    int ok;
    if (ne1 == 0) ok = (t->n_dims == 1 || (t->n_dims == 2 && t->ne[1] == 1)) && (int64_t)t->ne[0] == ne0;
    else if (ne1 == 1) ok = (t->n_dims == 1 || t->n_dims == 2) && (int64_t)t->ne[0] == ne0 && (t->n_dims == 1 || t->ne[1] == 1);
    else ok = t->n_dims == 2 && (int64_t)t->ne[0] == ne0 && (int64_t)t->ne[1] == ne1;
    if (!ok) {
        char got[96], wantb[64];
        shape_str(t, got, sizeof got);
        if (ne1) snprintf(wantb, sizeof wantb, "%lld, %lld", (long long)ne0, (long long)ne1);
        else snprintf(wantb, sizeof wantb, "%lld", (long long)ne0);
        ds_errf(err, errlen, "drafter: tensor '%s' has shape [%s], expected [%s]", name, got, wantb);
        return NULL;
    }
    if (t->type == DS_TYPE_Q8_0 && ne0 % DS_QK8_0) {
        ds_errf(err, errlen, "drafter: tensor '%s' is Q8_0 but its row length %lld is not a multiple of 32", name, (long long)ne0);
        return NULL;
    }
    return t;
}

static int load_w(const gguf_ctx *g, const char *name, int64_t n_in, int64_t n_out, ds_weight *w, char *err, size_t errlen) {
    const gguf_tensor *t = want(g, name, n_in, n_out == 1 ? 1 : n_out, err, errlen);
    if (!t) return -1;
    w->type = t->type; w->n_in = n_in; w->n_out = n_out; w->data = t->data;
    return 0;
}

/* 1-D tensor of n values converted to f32 into the arena. */
static int load_vec(const gguf_ctx *g, const char *name, int64_t n, float **cur, const float **out, char *err, size_t errlen) {
    const gguf_tensor *t = want(g, name, n, 0, err, errlen);
    if (!t) return -1;
    ds_row_to_f32(t->type, t->data, n, *cur);
    *out = *cur;
    *cur += n;
    return 0;
}

/* ---- layout name tables ---------------------------------------------------- */
typedef struct {
    const char *P;          /* hyper-parameter prefix  */
    const char *fc, *hidden_norm, *w1, *w2, *gate_w, *gate_b, *joint_w, *joint_b, *conf_w, *conf_b;
    const char *corr_prefix; /* + "correction_hidden_norm.weight" etc */
} names_t;

static const names_t k_names[2] = {
    { "dflash.", "fc.weight", "enc.output_norm.weight", "markov_w1.weight", "markov_w2.weight",
      "markov_gate.weight", "markov_gate.bias", "markov_joint.weight", "markov_joint.bias",
      "conf_proj.weight", "conf_proj.bias", "" },
    { "dspark.", "dspark.fc.weight", "dspark.hidden_norm.weight", "dspark.markov_head_a.weight", "dspark.markov_head_b.weight",
      "dspark.markov_gate.weight", "dspark.markov_gate.bias", "dspark.markov_joint.weight", "dspark.markov_joint.bias",
      "dspark.confidence_head.weight", "dspark.confidence_head.bias", "dspark." },
};

static int check_same_vocab(const gguf_ctx *g, const ds_model *target, int V, char *err, size_t errlen) {
    const gguf_ctx *tg = target->gguf;
    uint64_t vs;
    const char *vkeys[] = { "dflash.vocab_size", "dspark.vocab_size" };
    for (int i = 0; i < 2; i++)
        if (gguf_get_u64(g, vkeys[i], &vs) == 0 && vs != (uint64_t)V) {
            ds_errf(err, errlen, "drafter: %s is %llu but the target's vocabulary has %d tokens (a drafter for another model?)",
                    vkeys[i], (unsigned long long)vs, V);
            return -1;
        }
    const gguf_kv *tk = gguf_find_kv(g, "tokenizer.ggml.tokens");
    if (!tk) return 0;                                   /* shares the target's */
    gguf_str dm, tm;
    if (gguf_get_str(g, "tokenizer.ggml.model", &dm) == 0 && gguf_str_eq(dm, "none")) return 0;
    const gguf_kv *ttk = tg ? gguf_find_kv(tg, "tokenizer.ggml.tokens") : NULL;
    if (tk->type != GGUF_T_ARRAY || tk->arr_type != GGUF_T_STRING) {
        ds_errf(err, errlen, "drafter: tokenizer.ggml.tokens is not a string array");
        return -1;
    }
    if (!ttk) return tk->arr_n > (uint64_t)V ? (ds_errf(err, errlen, "drafter: its tokenizer has %llu tokens but the target's vocabulary has %d",
                                                        (unsigned long long)tk->arr_n, V), -1) : 0;
    if (gguf_get_str(g, "tokenizer.ggml.model", &dm) == 0 && gguf_get_str(tg, "tokenizer.ggml.model", &tm) == 0 &&
        (dm.len != tm.len || memcmp(dm.ptr, tm.ptr, (size_t)dm.len))) {
        ds_errf(err, errlen, "drafter: its tokenizer model '%.*s' differs from the target's '%.*s' (a drafter for another model?)",
                (int)(dm.len > 32 ? 32 : dm.len), dm.ptr, (int)(tm.len > 32 ? 32 : tm.len), tm.ptr);
        return -1;
    }
    if (tk->arr_n != ttk->arr_n) {
        ds_errf(err, errlen, "drafter: its tokenizer has %llu tokens, the target's %llu (a drafter for another model?)",
                (unsigned long long)tk->arr_n, (unsigned long long)ttk->arr_n);
        return -1;
    }
    for (uint64_t i = 0; i < tk->arr_n; i++) {
        gguf_str a, b;
        if (gguf_arr_str(tk, i, &a) || gguf_arr_str(ttk, i, &b) || a.len != b.len || memcmp(a.ptr, b.ptr, (size_t)a.len)) {
            ds_errf(err, errlen, "drafter: token %llu differs from the target's tokenizer (a drafter for another model?)",
                    (unsigned long long)i);
            return -1;
        }
    }
    return 0;
}

static int parse_markov_type(const gguf_ctx *g, const char *key, int *type, int *found, char *err, size_t errlen) {
    gguf_str s;
    int rc = gguf_get_str(g, key, &s);
    if (rc == -1) return 0;
    if (rc != 0) { ds_errf(err, errlen, "drafter: metadata key '%s' has the wrong type (want a string)", key); return -1; }
    *found = 1;
    if (gguf_str_eq(s, "vanilla")) *type = DS_MARKOV_VANILLA;
    else if (gguf_str_eq(s, "gated")) *type = DS_MARKOV_GATED;
    else if (gguf_str_eq(s, "rnn")) *type = DS_MARKOV_RNN;
    else {
        ds_errf(err, errlen, "drafter: unknown Markov head type '%.*s' in '%s' (supported: vanilla, gated, rnn)",
                (int)(s.len > 32 ? 32 : s.len), s.ptr, key);
        return -1;
    }
    return 0;
}

/* Every weight the drafter owns (the target's embedding and head are the
 * target's, prepared with it), with how the engine reads it. ws / use hold
 * at least N_DWEIGHTS(d) entries. */
#define N_DWEIGHTS(d) (7 * (size_t)(d)->n_layer + 16)
static int drafter_weights(ds_drafter *d, ds_weight **ws, int *use) {
    int n = 0;
#define ADD(w, u) do { ws[n] = (w); if (use) use[n] = (u); n++; } while (0)
    ADD(&d->fc, DS_USE_MATMUL);
    for (int l = 0; l < d->n_layer && d->layers; l++) {
        ds_layer *L = &d->layers[l];
        ADD(&L->wq, DS_USE_MATMUL); ADD(&L->wk, DS_USE_MATMUL); ADD(&L->wv, DS_USE_MATMUL);
        ADD(&L->wo, DS_USE_MATMUL); ADD(&L->w_gate, DS_USE_MATMUL); ADD(&L->w_up, DS_USE_MATMUL);
        ADD(&L->w_down, DS_USE_MATMUL);
    }
    if (d->rank > 0) {
        ADD(&d->w1, DS_USE_LOOKUP);
        ADD(&d->w2, DS_USE_MATMUL);
        if (d->markov == DS_MARKOV_GATED) ADD(&d->mgate, DS_USE_MATMUL);
        if (d->markov == DS_MARKOV_RNN) ADD(&d->mjoint, DS_USE_MATMUL);
    }
    if (d->has_conf) ADD(&d->conf_w, DS_USE_MATMUL);
    if (d->has_corr) {
        ADD(&d->corr_gate, DS_USE_MATMUL); ADD(&d->corr_up, DS_USE_MATMUL); ADD(&d->corr_down, DS_USE_MATMUL);
    }
#undef ADD
    return n;
}

/* Prepare the drafter's weights on the target's device and make its f32
 * vectors device constants; the norm pointers the layer ops read are
 * rebased onto them. (Biases read by the host-side heads stay host.) */
static int prepare_on_device(ds_drafter *d, char *err, size_t errlen) {
    ds_backend *be = d->be = d->target->be;
    ds_weight **ws = malloc(N_DWEIGHTS(d) * sizeof *ws);
    int *use = malloc(N_DWEIGHTS(d) * sizeof *use);
    if (!ws || !use) { free(ws); free(use); ds_errf(err, errlen, "drafter: out of memory"); return -1; }
    int n = drafter_weights(d, ws, use);
    d->prepared = 1;
    int bad = 0;
    for (int i = 0; i < n && !bad; i++) bad = be->i->prepare_weight(be, ws[i], use[i], err, errlen);
    free(ws);
    free(use);
    if (bad) return -1;
    char e2[DS_ERRLEN];
    ds_exec *ex = be->i->exec_new(be, 1, e2, sizeof e2);
    if (!ex) { ds_errf(err, errlen, "drafter: %s", e2); return -1; }
    d->arena_dev = ds_backend_const(be, ex, d->arena, d->arena_n * sizeof(float));
    int rc = d->arena_dev && !be->i->sync(ex, e2, sizeof e2) ? 0 : -1;
    be->i->exec_free(ex);
    if (rc) { ds_errf(err, errlen, "drafter: out of %s memory for its vectors", be->i->name); return -1; }
#define REBASE(p) ((p) = (p) ? d->arena_dev + ((p) - d->arena) : NULL)
    REBASE(d->hidden_norm); REBASE(d->output_norm); REBASE(d->corr_hn); REBASE(d->corr_en);
    for (int l = 0; l < d->n_layer; l++) {
        ds_layer *L = &d->layers[l];
        REBASE(L->attn_norm); REBASE(L->ffn_norm); REBASE(L->q_norm); REBASE(L->k_norm);
    }
#undef REBASE
    return 0;
}

ds_drafter *ds_drafter_load(const char *path, const ds_model *target, char *err, size_t errlen) {
    char e2[DS_ERRLEN];
    if (!target) { ds_errf(err, errlen, "drafter: no target model given"); return NULL; }
    gguf_ctx *g = gguf_open(path, e2, sizeof e2);
    if (!g) { ds_errf(err, errlen, "%s", e2); return NULL; }
    ds_drafter *d = calloc(1, sizeof *d);
    if (!d) { gguf_close(g); ds_errf(err, errlen, "drafter: out of memory"); return NULL; }
    d->g = g;
    d->target = target;
    const ds_hparams *thp = &target->hp;
    char key[160];

    /* ---- architecture ---- */
    gguf_str archs;
    if (gguf_get_str(g, "general.architecture", &archs) != 0) {
        ds_errf(err, errlen, "drafter: missing metadata key 'general.architecture'");
        goto fail;
    }
    if (gguf_str_eq(archs, "dflash")) d->layout = DS_DLAYOUT_DFLASH;
    else if (gguf_str_eq(archs, "dspark")) d->layout = DS_DLAYOUT_DSPARK;
    else {
        ds_errf(err, errlen, "drafter: architecture '%.*s' is not a drafter (supported: dflash, dspark)",
                (int)(archs.len > 64 ? 64 : archs.len), archs.ptr);
        goto fail;
    }
    const names_t *N = &k_names[d->layout];
    const int dflash = d->layout == DS_DLAYOUT_DFLASH;
    /* drafter-specific key prefix: dflash.<k> or dspark.dspark.<k> */
    const char *DP = dflash ? "dflash." : "dspark.dspark.";
#define HK(s) (snprintf(key, sizeof key, "%s%s", N->P, s), key)
#define DK(s) (snprintf(key, sizeof key, "%s%s", DP, s), key)

    /* ---- trunk hyper-parameters (defaults: the target's) ---- */
    uint32_t u;
    int rc;
    if (kv_u32(g, HK("block_count"), 1, 1, 4096, &u, err, errlen)) goto fail;
    d->n_layer = (int)u;
    if (kv_u32(g, HK("embedding_length"), 1, 1, 1u << 20, &u, err, errlen)) goto fail;
    d->d = (int)u;
    if (d->d != thp->n_embd) {
        ds_errf(err, errlen, "drafter: embedding_length %d differs from the target's n_embd %d (the embedding and LM head are shared)",
                d->d, thp->n_embd);
        goto fail;
    }
    d->n_head = thp->n_head; d->n_head_kv = thp->n_head_kv; d->head_dim = thp->head_dim; d->n_ff = thp->n_ff;
    d->rope_base = thp->rope_base; d->eps = thp->norm_eps;
    if ((rc = kv_u32(g, HK("attention.head_count"), 0, 1, 4096, &u, err, errlen)) < 0) goto fail;
    if (rc == 0) { d->n_head = (int)u; d->n_head_kv = (int)u; d->head_dim = d->d / d->n_head; }
    if ((rc = kv_u32(g, HK("attention.head_count_kv"), 0, 1, 4096, &u, err, errlen)) < 0) goto fail;
    if (rc == 0) d->n_head_kv = (int)u;
    if ((rc = kv_u32(g, HK("attention.key_length"), 0, 2, 8192, &u, err, errlen)) < 0) goto fail;
    if (rc == 0) d->head_dim = (int)u;
    if ((rc = kv_u32(g, HK("attention.value_length"), 0, 2, 8192, &u, err, errlen)) < 0) goto fail;
    if (rc == 0 && (int)u != d->head_dim) {
        ds_errf(err, errlen, "drafter: value_length %u differs from key_length %d", u, d->head_dim);
        goto fail;
    }
    if ((rc = kv_u32(g, HK("feed_forward_length"), 0, 1, 1u << 22, &u, err, errlen)) < 0) goto fail;
    if (rc == 0) d->n_ff = (int)u;
    if (kv_f32(g, HK("rope.freq_base"), &d->rope_base, err, errlen) < 0) goto fail;
    if (kv_f32(g, HK("attention.layer_norm_rms_epsilon"), &d->eps, err, errlen) < 0) goto fail;
    if (d->n_head < 1 || d->n_head_kv < 1 || d->n_head % d->n_head_kv || d->head_dim < 2 || d->head_dim % 2) {
        ds_errf(err, errlen, "drafter: bad attention shape (head_count %d, head_count_kv %d, key_length %d): heads must divide and key_length be even",
                d->n_head, d->n_head_kv, d->head_dim);
        goto fail;
    }
    if (!(d->eps > 0.0f && d->eps < 1.0f) || !(d->rope_base > 1.0f && d->rope_base < 1e12f)) {
        ds_errf(err, errlen, "drafter: rms epsilon %g or rope freq_base %g out of range", d->eps, d->rope_base);
        goto fail;
    }
    d->rope_mode = thp->arch == DS_ARCH_LLAMA ? DS_ROPE_NORMAL : DS_ROPE_NEOX;
    if ((rc = kv_u32(g, DK("target_hidden_size"), 0, 1, 1u << 20, &u, err, errlen)) < 0) goto fail;
    if (rc == 0 && (int)u != thp->n_embd) {
        ds_errf(err, errlen, "drafter: target_hidden_size %u differs from the target's n_embd %d", u, thp->n_embd);
        goto fail;
    }
    d->V = thp->n_vocab;
    /* a tokenizer of its own must be the target's: same model, same token
     * list byte for byte (the drafter proposes ids the target reads as its
     * own tokens; a different vocabulary would draft nonsense), and a
     * vocabulary size, where stated, must be the target's. Checked before
     * any shape, so the refusal names the real cause. */
    if (check_same_vocab(g, target, d->V, err, errlen)) goto fail;

    /* ---- drafter keys ---- */
    if (kv_u32(g, DK("block_size"), 1, 0, 1u << 30, &u, err, errlen)) goto fail;
    if (u < 1 || u > 256) {
        ds_errf(err, errlen, "drafter: block size %u is out of range [1, 256]", u);
        goto fail;
    }
    d->gamma = (int)u;

    if (dflash) {
        int b;
        if ((rc = kv_bool(g, "dflash.sample_from_anchor", &b, err, errlen)) < 0) goto fail;
        if (rc == 0 && !b) {
            ds_errf(err, errlen, "drafter: dflash.sample_from_anchor is false: mask-filling drafters are not supported (anchor-first DSpark only)");
            goto fail;
        }
        if ((rc = kv_bool(g, "dflash.attention.causal", &b, err, errlen)) < 0) goto fail;
        if (rc == 0 && b) {
            ds_errf(err, errlen, "drafter: dflash.attention.causal is true: causal drafters are not supported (the DSpark block is non-causal)");
            goto fail;
        }
    }
    /* mask id */
    {
        const char *mk = dflash ? "tokenizer.ggml.mask_token_id" : "dspark.dspark.mask_token_id";
        if (kv_u32(g, mk, 1, 0, UINT32_MAX, &u, err, errlen)) goto fail;
        if ((int64_t)u >= d->V) {
            ds_errf(err, errlen, "drafter: MASK token id %u is outside the vocabulary [0, %d)", u, d->V);
            goto fail;
        }
        d->mask_id = (int32_t)u;
    }
    /* taps */
    {
        const char *tk = dflash ? "dflash.target_layers" : "dspark.dspark.target_layers";
        const gguf_kv *kv = gguf_find_kv(g, tk);
        if (!kv) { ds_errf(err, errlen, "drafter: missing metadata key '%s'", tk); goto fail; }
        if (kv->type != GGUF_T_ARRAY || kv->arr_type == GGUF_T_STRING || kv->arr_type == GGUF_T_ARRAY ||
            kv->arr_type == GGUF_T_F32 || kv->arr_type == GGUF_T_F64 || kv->arr_type == GGUF_T_BOOL) {
            ds_errf(err, errlen, "drafter: metadata key '%s' must be an integer array", tk);
            goto fail;
        }
        if (kv->arr_n < 1 || kv->arr_n > DS_MAX_TAPS) {
            ds_errf(err, errlen, "drafter: %s has %llu entries (need 1..%d)", tk, (unsigned long long)kv->arr_n, DS_MAX_TAPS);
            goto fail;
        }
        d->n_taps = (int)kv->arr_n;
        for (int i = 0; i < d->n_taps; i++) {
            int64_t v;
            if (gguf_arr_i64(kv, (uint64_t)i, &v)) { ds_errf(err, errlen, "drafter: cannot read %s[%d]", tk, i); goto fail; }
            int64_t hf = dflash ? v - 1 : v;
            if (hf == -1) {
                ds_errf(err, errlen, "drafter: tap %d is the embedding output (HF id -1%s), which dspark cannot tap (taps are layer outputs)",
                        i, dflash ? ", stored 0" : "");
                goto fail;
            }
            if (hf < 0 || hf >= thp->n_layer) {
                ds_errf(err, errlen, "drafter: tap layer %lld (HF id%s) is out of range [0, %d) for the target",
                        (long long)hf, dflash ? ", stored value - 1" : "", thp->n_layer);
                goto fail;
            }
            if (i > 0 && hf <= d->taps[i - 1]) {
                ds_errf(err, errlen, "drafter: tap layers must be strictly increasing (%lld after %d)", (long long)hf, d->taps[i - 1]);
                goto fail;
            }
            d->taps[i] = (int)hf;
        }
    }

    /* ---- Markov head: type, rank ---- */
    int mtype = DS_MARKOV_VANILLA, mtype_found = 0;
    if (parse_markov_type(g, DK("markov_head_type"), &mtype, &mtype_found, err, errlen)) goto fail;
    if (!mtype_found && !dflash && parse_markov_type(g, "dspark.markov_head_type", &mtype, &mtype_found, err, errlen)) goto fail;
    uint32_t rank_key = 0;
    int have_rank_key;
    if ((have_rank_key = kv_u32(g, DK("markov_rank"), 0, 0, 1u << 20, &rank_key, err, errlen)) < 0) goto fail;
    have_rank_key = have_rank_key == 0;
    const gguf_tensor *tw1 = gguf_find_tensor(g, N->w1);
    if (tw1) {
        if (tw1->n_dims != 2) { ds_errf(err, errlen, "drafter: tensor '%s' must be 2-D [rank, n_vocab]", N->w1); goto fail; }
        d->rank = (int)(tw1->ne[0] > (1u << 20) ? 0 : tw1->ne[0]);
        if (d->rank < 1) { ds_errf(err, errlen, "drafter: tensor '%s' has a bad rank %llu", N->w1, (unsigned long long)tw1->ne[0]); goto fail; }
        if (have_rank_key && (int)rank_key != d->rank) {
            ds_errf(err, errlen, "drafter: markov_rank %u disagrees with '%s' rank %d", rank_key, N->w1, d->rank);
            goto fail;
        }
    } else if (have_rank_key && rank_key > 0) {
        ds_errf(err, errlen, "drafter: markov_rank is %u but tensor '%s' is missing", rank_key, N->w1);
        goto fail;
    }
    d->markov = d->rank ? mtype : DS_MARKOV_NONE;
    const int r = d->rank, D = d->d;

    /* ---- confidence head ---- */
    {
        int key_conf, key_wm, have_conf_key, have_wm_key;
        const char *ck = dflash ? "dflash.has_confidence_head" : "dspark.dspark.confidence_head";
        if ((have_conf_key = kv_bool(g, ck, &key_conf, err, errlen)) < 0) goto fail;
        if ((have_wm_key = kv_bool(g, DK("confidence_head_with_markov"), &key_wm, err, errlen)) < 0) goto fail;
        const gguf_tensor *tc = gguf_find_tensor(g, N->conf_w);
        if (have_conf_key == 0) d->has_conf = key_conf;
        else d->has_conf = tc != NULL;
        if (d->has_conf && !tc) {
            ds_errf(err, errlen, "drafter: %s says a confidence head exists but tensor '%s' is missing", ck, N->conf_w);
            goto fail;
        }
        if (d->has_conf) {
            d->conf_with_markov = r > 0 && (int64_t)tc->ne[0] == D + r;
            if (have_wm_key == 0 && key_wm && r == 0) {
                ds_errf(err, errlen, "drafter: confidence_head_with_markov is set but the drafter has no Markov head");
                goto fail;
            }
            if (have_wm_key == 0) d->conf_with_markov = key_wm && r > 0;
            int64_t in = D + (d->conf_with_markov ? r : 0);
            if (load_w(g, N->conf_w, in, 1, &d->conf_w, err, errlen)) goto fail;
        }
    }

    /* ---- correction head ---- */
    {
        char cn[5][160];
        static const char *parts[5] = { "correction_hidden_norm.weight", "correction_embed_norm.weight",
                                        "correction_gate.weight", "correction_up.weight", "correction_down.weight" };
        for (int i = 0; i < 5; i++) snprintf(cn[i], sizeof cn[i], "%s%s", N->corr_prefix, parts[i]);
        int key_corr, have_corr_key;
        if ((have_corr_key = kv_bool(g, DK("hidden_correction"), &key_corr, err, errlen)) < 0) goto fail;
        const gguf_tensor *tg = gguf_find_tensor(g, cn[2]);
        d->has_corr = have_corr_key == 0 ? key_corr : tg != NULL;
        int key_dep, have_dep_key;
        if ((have_dep_key = kv_bool(g, DK("markov_deploy_exposure"), &key_dep, err, errlen)) < 0) goto fail;
        if (have_dep_key == 0 && key_dep != d->has_corr) {
            ds_errf(err, errlen, "drafter: markov_deploy_exposure=%s but hidden_correction=%s (the graph-corrected drafter needs both or neither)",
                    key_dep ? "true" : "false", d->has_corr ? "true" : "false");
            goto fail;
        }
        if (d->has_corr) {
            if (!tg) { ds_errf(err, errlen, "drafter: hidden_correction is set but tensor '%s' is missing", cn[2]); goto fail; }
            uint32_t w = 0;
            int have_w;
            if ((have_w = kv_u32(g, DK("correction_size"), 0, 0, 1u << 22, &w, err, errlen)) < 0) goto fail;
            if (have_w != 0 || w == 0) {
                if (!dflash && have_w != 0) { ds_errf(err, errlen, "drafter: missing metadata key 'dspark.dspark.correction_size' (required with hidden_correction)"); goto fail; }
                w = (uint32_t)(tg->n_dims == 2 && tg->ne[1] <= (1u << 22) ? tg->ne[1] : 0);
            }
            if (w < 1) { ds_errf(err, errlen, "drafter: correction width must be >= 1"); goto fail; }
            d->corr_w = (int)w;
            if (r > 0 && d->markov != DS_MARKOV_VANILLA) {
                ds_errf(err, errlen, "drafter: a correction head needs a vanilla Markov head (graph-corrected order), got '%s'",
                        ds_markov_type_name(d->markov));
                goto fail;
            }
        }
    }

    /* ---- counts against the file before the arena is sized by them ---- */
    if ((uint64_t)d->n_layer * 9 > gguf_n_tensors(g)) {
        ds_errf(err, errlen, "drafter: block_count %d needs at least %llu tensors, the file has %llu", d->n_layer,
                (unsigned long long)d->n_layer * 9, (unsigned long long)gguf_n_tensors(g));
        goto fail;
    }

    /* ---- arena for f32 vectors ---- */
    size_t n_arena = 2u * (size_t)D + (size_t)d->n_layer * (2u * (size_t)D + 2u * (size_t)d->head_dim) +
                     4u * (size_t)r + 2u * (size_t)D + 16;
    d->arena = malloc(n_arena * sizeof(float));
    d->layers = calloc((size_t)d->n_layer, sizeof(ds_layer));
    d->arena_n = n_arena;
    if (!d->arena || !d->layers) { ds_errf(err, errlen, "drafter: out of memory"); goto fail; }
    float *cur = d->arena;

    /* ---- trunk tensors ---- */
    {
        const gguf_tensor *tf = gguf_find_tensor(g, N->fc);
        if (!tf) { ds_errf(err, errlen, "drafter: missing tensor '%s'", N->fc); goto fail; }
        if (tf->n_dims != 2 || (int64_t)tf->ne[0] != (int64_t)d->n_taps * D || (int64_t)tf->ne[1] != D) {
            char got[96];
            shape_str(tf, got, sizeof got);
            ds_errf(err, errlen, "drafter: tensor '%s' has shape [%s], expected [%lld, %d] (n_taps %d x n_embd %d -> n_embd)",
                    N->fc, got, (long long)d->n_taps * D, D, d->n_taps, D);
            goto fail;
        }
        if (load_w(g, N->fc, (int64_t)d->n_taps * D, D, &d->fc, err, errlen)) goto fail;
    }
    if (load_vec(g, N->hidden_norm, D, &cur, &d->hidden_norm, err, errlen) ||
        load_vec(g, "output_norm.weight", D, &cur, &d->output_norm, err, errlen))
        goto fail;
    const int hd = d->head_dim, qd = d->n_head * hd, kvd = d->n_head_kv * hd;
    int have_qk = -1;
    for (int l = 0; l < d->n_layer; l++) {
        ds_layer *L = &d->layers[l];
        char n[96];
#define NAME(s) (snprintf(n, sizeof n, "blk.%d." s ".weight", l), n)
        if (load_vec(g, NAME("attn_norm"), D, &cur, &L->attn_norm, err, errlen) ||
            load_vec(g, NAME("ffn_norm"), D, &cur, &L->ffn_norm, err, errlen) ||
            load_w(g, NAME("attn_q"), D, qd, &L->wq, err, errlen) ||
            load_w(g, NAME("attn_k"), D, kvd, &L->wk, err, errlen) ||
            load_w(g, NAME("attn_v"), D, kvd, &L->wv, err, errlen) ||
            load_w(g, NAME("attn_output"), qd, D, &L->wo, err, errlen) ||
            load_w(g, NAME("ffn_gate"), D, d->n_ff, &L->w_gate, err, errlen) ||
            load_w(g, NAME("ffn_up"), D, d->n_ff, &L->w_up, err, errlen) ||
            load_w(g, NAME("ffn_down"), d->n_ff, D, &L->w_down, err, errlen))
            goto fail;
        int hq = gguf_find_tensor(g, NAME("attn_q_norm")) != NULL;
        int hk = gguf_find_tensor(g, NAME("attn_k_norm")) != NULL;
        if (hq != hk || (have_qk >= 0 && have_qk != hq)) {
            ds_errf(err, errlen, "drafter: attn_q_norm / attn_k_norm must be present in every layer or in none (layer %d)", l);
            goto fail;
        }
        have_qk = hq;
        if (hq && (load_vec(g, NAME("attn_q_norm"), hd, &cur, &L->q_norm, err, errlen) ||
                   load_vec(g, NAME("attn_k_norm"), hd, &cur, &L->k_norm, err, errlen)))
            goto fail;
#undef NAME
    }

    /* ---- Markov tensors ---- */
    if (r > 0) {
        if (load_w(g, N->w1, r, d->V, &d->w1, err, errlen) ||
            load_w(g, N->w2, r, d->V, &d->w2, err, errlen))
            goto fail;
        if (d->markov == DS_MARKOV_GATED) {
            if (load_w(g, N->gate_w, (int64_t)D + r, r, &d->mgate, err, errlen) ||
                load_vec(g, N->gate_b, r, &cur, &d->mgate_b, err, errlen))
                goto fail;
        } else if (d->markov == DS_MARKOV_RNN) {
            if (load_w(g, N->joint_w, 2 * (int64_t)r + D, 3 * (int64_t)r, &d->mjoint, err, errlen) ||
                load_vec(g, N->joint_b, 3 * (int64_t)r, &cur, &d->mjoint_b, err, errlen))
                goto fail;
        }
    }
    if (d->has_conf) {
        d->conf_b = 0.0f;
        if (gguf_find_tensor(g, N->conf_b)) {
            const float *b;
            if (load_vec(g, N->conf_b, 1, &cur, &b, err, errlen)) goto fail;
            d->conf_b = b[0];
        }
    }
    if (d->has_corr) {
        char n[160];
        const int w = d->corr_w;
#define CN(s) (snprintf(n, sizeof n, "%s%s", N->corr_prefix, s), n)
        if (load_vec(g, CN("correction_hidden_norm.weight"), D, &cur, &d->corr_hn, err, errlen) ||
            load_vec(g, CN("correction_embed_norm.weight"), D, &cur, &d->corr_en, err, errlen) ||
            load_w(g, CN("correction_gate.weight"), 2 * (int64_t)D, w, &d->corr_gate, err, errlen) ||
            load_w(g, CN("correction_up.weight"), 2 * (int64_t)D, w, &d->corr_up, err, errlen) ||
            load_w(g, CN("correction_down.weight"), w, D, &d->corr_down, err, errlen))
            goto fail;
#undef CN
    }

    /* ---- shared embedding / head: the target's ---- */
    if (target->tok_embd.n_in != D || target->output.n_in != D || target->output.n_out != d->V) {
        ds_errf(err, errlen, "drafter: the target's embedding/output shapes do not match n_embd %d, n_vocab %d", D, d->V);
        goto fail;
    }
    {
        const gguf_tensor *t;
        if ((t = gguf_find_tensor(g, "token_embd.weight"))) {
            if (!want(g, "token_embd.weight", D, d->V, err, errlen)) goto fail;
            d->file_has_embd = 1;
        }
        if ((t = gguf_find_tensor(g, "output.weight"))) {
            if (!want(g, "output.weight", D, d->V, err, errlen)) goto fail;
            d->file_has_output = 1;
        }
        (void)t;
    }
    d->embd = &target->tok_embd;
    d->head = &target->output;
    if (prepare_on_device(d, err, errlen)) goto fail;
#undef HK
#undef DK

    /* ---- describe ---- */
    {
        char taps[128] = "";
        for (int i = 0; i < d->n_taps; i++) {
            size_t l = strlen(taps);
            snprintf(taps + l, sizeof taps - l, "%s%d", i ? "," : "", d->taps[i]);
        }
        const char *ignored = d->file_has_embd && d->file_has_output ? " file_embd_output=ignored(target_used)"
                            : d->file_has_embd ? " file_embd=ignored(target_used)"
                            : d->file_has_output ? " file_output=ignored(target_used)" : "";
        snprintf(d->desc, sizeof d->desc,
                 "layout=%s block_size=%d n_layer=%d n_embd=%d n_head=%d n_head_kv=%d head_dim=%d n_ff=%d taps=%s mask_id=%d "
                 "markov=%s rank=%d confidence=%s correction=%d qk_norm=%s rope=%s weight_type=%s head=target_shared%s",
                 dflash ? "dflash" : "dspark", d->gamma, d->n_layer, D, d->n_head, d->n_head_kv, hd, d->n_ff, taps,
                 d->mask_id, ds_markov_type_name(d->markov), r,
                 d->has_conf ? (d->conf_with_markov ? "with_markov" : "hidden_only") : "off", d->has_corr ? d->corr_w : 0,
                 have_qk ? "yes" : "no", d->rope_mode == DS_ROPE_NEOX ? "neox" : "normal",
                 ds_type_name(d->layers[0].wq.type), ignored);
    }
    return d;
fail:
    ds_drafter_free(d);
    return NULL;
}

void ds_drafter_free(ds_drafter *d) {
    if (!d) return;
    if (d->be && d->prepared) {
        ds_weight **ws = malloc(N_DWEIGHTS(d) * sizeof *ws);
        int n = ws ? drafter_weights(d, ws, NULL) : 0;   /* CPU: extra only */
        for (int i = 0; i < n; i++) d->be->i->release_weight(d->be, ws[i]);
        free(ws);
        ds_backend_const_free(d->be, d->arena_dev, d->arena);
    }
    free(d->layers);
    free(d->arena);
    gguf_close(d->g);
    free(d);
}

int ds_drafter_block_size(const ds_drafter *d) { return d->gamma; }
int ds_drafter_n_taps(const ds_drafter *d) { return d->n_taps; }
void ds_drafter_kv_shape(const ds_drafter *d, int *n_layer, int *row) {
    *n_layer = d->n_layer;
    *row = d->n_head_kv * d->head_dim;
}
const int *ds_drafter_tap_layers(const ds_drafter *d) { return d->taps; }
int ds_drafter_has_confidence(const ds_drafter *d) { return d->has_conf; }
int32_t ds_drafter_mask_id(const ds_drafter *d) { return d->mask_id; }
const char *ds_drafter_describe(const ds_drafter *d) { return d->desc; }
const ds_weight *ds_drafter_head(const ds_drafter *d) { return d->head; }
