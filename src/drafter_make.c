/* drafter_make.c — deterministic random DSpark drafter GGUF writer (see
 * drafter_make.h). Weights are drawn in one fixed order whatever the layout,
 * so `--layout dflash` and `--layout dspark` with the same seed hold the same
 * numbers under different names and keys (tests compare their outputs). */
#include "drafter_make.h"
#include "drafter_internal.h"
#include "gguf.h"
#include "kernels/kernels.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    gguf_writer *w;
    uint64_t r;                 /* ds_splitmix64 state */
    int failed;
} mk_builder;

/* [n_out][n_in] uniform(-scale, scale) in `type`; a Q8_0 request for a row
 * length that is not a multiple of 32 is stored as F32 instead. */
static void mk_matrix(mk_builder *b, const char *name, int64_t n_in, int64_t n_out, float scale, uint32_t type) {
    if (b->failed) return;
    if (type == DS_TYPE_Q8_0 && n_in % DS_QK8_0) type = DS_TYPE_F32;
    size_t n = (size_t)n_in * (size_t)n_out;
    float *f = malloc(n * sizeof(float));
    int ok;
    uint64_t rb = ds_row_bytes(type, (uint64_t)n_in, &ok);
    void *data = ok && f ? malloc(rb * (uint64_t)n_out) : NULL;
    if (!data) { free(f); b->failed = 1; return; }
    for (size_t i = 0; i < n; i++) f[i] = ds_uniform_pm1(&b->r) * scale;
    ds_f32_to_type(type, f, (int64_t)n, data);
    uint64_t ne[2] = { (uint64_t)n_in, (uint64_t)n_out };
    if (gguf_add_tensor(b->w, name, type, 2, ne, data, rb * (uint64_t)n_out)) b->failed = 1;
    free(data);
    free(f);
}

/* 1-D F32: base + uniform(-scale, scale) */
static void mk_vec(mk_builder *b, const char *name, int64_t n, float base, float scale) {
    if (b->failed) return;
    float *f = malloc((size_t)n * sizeof(float));
    if (!f) { b->failed = 1; return; }
    for (int64_t i = 0; i < n; i++) f[i] = base + scale * ds_uniform_pm1(&b->r);
    uint64_t ne[1] = { (uint64_t)n };
    if (gguf_add_tensor(b->w, name, DS_TYPE_F32, 1, ne, f, (uint64_t)n * 4)) b->failed = 1;
    free(f);
}

void ds_make_drafter_defaults(ds_make_drafter_opts *o) {
    memset(o, 0, sizeof *o);
    o->layout = "dflash";
    o->n_layer = 1;
    o->block_size = 7;
    o->n_taps = 0;
    o->markov = "vanilla";
    o->rank = 32;
    o->confidence = 1;
    o->correction = 0;
    o->mask_id = -1;
    o->type = DS_TYPE_F32;
    o->seed = 1;
}

int ds_make_drafter_default_taps(int n_layer_target, int *taps) {
    if (n_layer_target < 1) return 0;
    int n = n_layer_target < 5 ? n_layer_target : 5;
    for (int i = 0; i < n; i++) taps[i] = (int)((int64_t)(i + 1) * n_layer_target / (n + 1));
    return n;
}

int ds_make_drafter(const ds_make_drafter_opts *o, const ds_model *target, const char *out, char *err, size_t errlen) {
    const char *C = "make-drafter";
    if (!target) { ds_errf(err, errlen, "%s: no target model", C); return -1; }
    const ds_hparams *hp = &target->hp;
    int dspark;
    if (!o->layout || !strcmp(o->layout, "dflash")) dspark = 0;
    else if (!strcmp(o->layout, "dspark")) dspark = 1;
    else { ds_errf(err, errlen, "%s: layout must be dflash or dspark, got '%s'", C, o->layout); return -1; }
    if (o->n_layer < 1 || o->n_layer > 256) { ds_errf(err, errlen, "%s: n_layer %d is out of range [1, 256]", C, o->n_layer); return -1; }
    if (o->block_size < 1 || o->block_size > 256) { ds_errf(err, errlen, "%s: block size %d is out of range [1, 256]", C, o->block_size); return -1; }
    int markov;
    const char *mname = o->markov ? o->markov : "vanilla";
    if (!strcmp(mname, "vanilla")) markov = DS_MARKOV_VANILLA;
    else if (!strcmp(mname, "gated")) markov = DS_MARKOV_GATED;
    else if (!strcmp(mname, "rnn")) markov = DS_MARKOV_RNN;
    else { ds_errf(err, errlen, "%s: Markov head type must be vanilla, gated or rnn, got '%s'", C, mname); return -1; }
    const int r = o->rank;
    if (r < 0 || r > 65536) { ds_errf(err, errlen, "%s: rank %d is out of range [0, 65536]", C, r); return -1; }
    if (o->correction < 0 || o->correction > (1 << 20)) { ds_errf(err, errlen, "%s: correction width %d is out of range", C, o->correction); return -1; }
    if (o->correction && r > 0 && markov != DS_MARKOV_VANILLA) {
        ds_errf(err, errlen, "%s: a correction head needs a vanilla Markov head (or --rank 0), got '%s'", C, mname);
        return -1;
    }
    if (!ds_type_valid(o->type)) { ds_errf(err, errlen, "%s: unsupported weight type %u", C, o->type); return -1; }
    int taps[DS_MAX_TAPS], n_taps = o->n_taps;
    if (n_taps == 0) n_taps = ds_make_drafter_default_taps(hp->n_layer, taps);
    else {
        if (n_taps < 0 || n_taps > DS_MAX_TAPS) { ds_errf(err, errlen, "%s: %d tap layers (need 1..%d)", C, n_taps, DS_MAX_TAPS); return -1; }
        for (int i = 0; i < n_taps; i++) {
            taps[i] = o->taps[i];
            if (taps[i] < 0 || taps[i] >= hp->n_layer) {
                ds_errf(err, errlen, "%s: tap layer %d is out of range [0, %d) for the target", C, taps[i], hp->n_layer);
                return -1;
            }
            if (i > 0 && taps[i] <= taps[i - 1]) {
                ds_errf(err, errlen, "%s: tap layers must be strictly increasing (%d after %d)", C, taps[i], taps[i - 1]);
                return -1;
            }
        }
    }
    const int32_t mask_id = o->mask_id < 0 ? hp->n_vocab - 1 : o->mask_id;
    if (mask_id >= hp->n_vocab) { ds_errf(err, errlen, "%s: MASK id %d is outside the vocabulary [0, %d)", C, mask_id, hp->n_vocab); return -1; }
    const int64_t D = hp->n_embd, hd = hp->head_dim, qd = (int64_t)hp->n_head * hd, kvd = (int64_t)hp->n_head_kv * hd;
    const int64_t V = hp->n_vocab, ff = hp->n_ff, w = o->correction;
    const uint32_t type = o->type;
    if (type == DS_TYPE_Q8_0 && (D % 32 || ff % 32 || qd % 32)) {
        ds_errf(err, errlen, "%s: q8_0 needs the target's n_embd, n_ff and n_head*head_dim to be multiples of 32", C);
        return -1;
    }
    const int conf = o->confidence ? 1 : 0, conf_wm = conf && r > 0;

    mk_builder b = { gguf_writer_new(), (uint64_t)o->seed * 0x9E3779B97F4A7C15ull + 0xD5A7C0FFEEull, 0 };
    if (!b.w) { ds_errf(err, errlen, "%s: out of memory", C); return -1; }
    gguf_writer *W = b.w;
    char key[160];
    const char *P = dspark ? "dspark." : "dflash.";     /* hyper-parameters  */
    const char *DP = dspark ? "dspark.dspark." : "dflash."; /* drafter keys */
#define HK(s) (snprintf(key, sizeof key, "%s%s", P, s), key)
#define DK(s) (snprintf(key, sizeof key, "%s%s", DP, s), key)
    int kr = 0;
    kr |= gguf_set_str(W, "general.architecture", dspark ? "dspark" : "dflash");
    kr |= gguf_set_str(W, "general.name", "dspark-random-drafter");
    kr |= gguf_set_u32(W, HK("block_count"), (uint32_t)o->n_layer);
    kr |= gguf_set_u32(W, HK("context_length"), (uint32_t)hp->n_ctx_train);
    kr |= gguf_set_u32(W, HK("embedding_length"), (uint32_t)D);
    kr |= gguf_set_u32(W, HK("feed_forward_length"), (uint32_t)ff);
    kr |= gguf_set_u32(W, HK("attention.head_count"), (uint32_t)hp->n_head);
    kr |= gguf_set_u32(W, HK("attention.head_count_kv"), (uint32_t)hp->n_head_kv);
    kr |= gguf_set_u32(W, HK("attention.key_length"), (uint32_t)hd);
    kr |= gguf_set_u32(W, HK("attention.value_length"), (uint32_t)hd);
    kr |= gguf_set_f32(W, HK("rope.freq_base"), hp->rope_base);
    kr |= gguf_set_f32(W, HK("attention.layer_norm_rms_epsilon"), hp->norm_eps);
    kr |= gguf_set_u32(W, "general.file_type", gguf_llama_ftype(type));
    kr |= gguf_set_u32(W, "general.quantization_version", GGUF_QUANTIZATION_VERSION);
    uint32_t tl[DS_MAX_TAPS];
    for (int i = 0; i < n_taps; i++) tl[i] = (uint32_t)(taps[i] + (dspark ? 0 : 1));
    kr |= gguf_set_u32(W, DK("block_size"), (uint32_t)o->block_size);
    kr |= gguf_set_arr(W, DK("target_layers"), GGUF_T_U32, tl, (uint64_t)n_taps);
    kr |= gguf_set_u32(W, DK("target_hidden_size"), (uint32_t)D);
    kr |= gguf_set_u32(W, DK("markov_rank"), (uint32_t)r);
    kr |= gguf_set_bool(W, DK("confidence_head_with_markov"), conf_wm);
    if (!dspark) {
        kr |= gguf_set_str(W, "dflash.sample_from_anchor", "true");
        kr |= gguf_set_bool(W, "dflash.has_confidence_head", conf);
        kr |= gguf_set_bool(W, "dflash.attention.causal", 0);
        if (r > 0) kr |= gguf_set_str(W, "dflash.markov_head_type", mname);
        if (w) {
            kr |= gguf_set_bool(W, "dflash.hidden_correction", 1);
            kr |= gguf_set_u32(W, "dflash.correction_size", (uint32_t)w);
        }
        /* the target's tokenizer, as mainline converters copy it */
        const gguf_ctx *tg = target->gguf;
        for (uint64_t i = 0; tg && i < gguf_n_kv(tg); i++) {
            const gguf_kv *kv = gguf_kv_at(tg, i);
            if (kv->key.len > 10 && !memcmp(kv->key.ptr, "tokenizer.", 10) &&
                !gguf_str_eq(kv->key, "tokenizer.ggml.mask_token_id"))
                kr |= gguf_set_kv(W, kv);
        }
        kr |= gguf_set_u32(W, "tokenizer.ggml.mask_token_id", (uint32_t)mask_id);
    } else {
        kr |= gguf_set_u32(W, "dspark.dspark.mask_token_id", (uint32_t)mask_id);
        kr |= gguf_set_bool(W, "dspark.dspark.confidence_head", conf);
        kr |= gguf_set_bool(W, "dspark.dspark.hidden_correction", w > 0);
        kr |= gguf_set_bool(W, "dspark.dspark.markov_deploy_exposure", w > 0);
        kr |= gguf_set_u32(W, "dspark.dspark.correction_size", (uint32_t)w);
        if (r > 0) kr |= gguf_set_str(W, "dspark.markov_head_type", mname);
        kr |= gguf_set_str(W, "tokenizer.ggml.model", "none");
        kr |= gguf_set_u32(W, "dspark.vocab_size", (uint32_t)V);
    }
#undef HK
#undef DK
    if (kr) b.failed = 1;

    /* ---- tensors, in one layout-independent draw order ---- */
    char n[160];
#define T(dfl, dsp) (dspark ? (dsp) : (dfl))
    mk_matrix(&b, T("fc.weight", "dspark.fc.weight"), (int64_t)n_taps * D, D, sqrtf(3.0f / (float)(n_taps * D)), type);
    mk_vec(&b, T("enc.output_norm.weight", "dspark.hidden_norm.weight"), D, 1.0f, 0.1f);
    mk_vec(&b, "output_norm.weight", D, 1.0f, 0.1f);
    const int qk_norm = ds_arch_qk_norm(hp->arch);
    for (int l = 0; l < o->n_layer && !b.failed; l++) {
#define NAME(s) (snprintf(n, sizeof n, "blk.%d." s ".weight", l), n)
        mk_vec(&b, NAME("attn_norm"), D, 1.0f, 0.1f);
        mk_matrix(&b, NAME("attn_q"), D, qd, sqrtf(3.0f / (float)D), type);
        mk_matrix(&b, NAME("attn_k"), D, kvd, sqrtf(3.0f / (float)D), type);
        mk_matrix(&b, NAME("attn_v"), D, kvd, sqrtf(3.0f / (float)D), type);
        if (qk_norm) {
            mk_vec(&b, NAME("attn_q_norm"), hd, 1.0f, 0.1f);
            mk_vec(&b, NAME("attn_k_norm"), hd, 1.0f, 0.1f);
        }
        mk_matrix(&b, NAME("attn_output"), qd, D, sqrtf(3.0f / (float)qd) * 0.5f, type);
        mk_vec(&b, NAME("ffn_norm"), D, 1.0f, 0.1f);
        mk_matrix(&b, NAME("ffn_gate"), D, ff, sqrtf(3.0f / (float)D), type);
        mk_matrix(&b, NAME("ffn_up"), D, ff, sqrtf(3.0f / (float)D), type);
        mk_matrix(&b, NAME("ffn_down"), ff, D, sqrtf(3.0f / (float)ff) * 0.5f, type);
#undef NAME
    }
    if (r > 0) {
        mk_matrix(&b, T("markov_w1.weight", "dspark.markov_head_a.weight"), r, V, 1.0f, type);
        mk_matrix(&b, T("markov_w2.weight", "dspark.markov_head_b.weight"), r, V, sqrtf(3.0f / (float)r), type);
        if (markov == DS_MARKOV_GATED) {
            mk_matrix(&b, T("markov_gate.weight", "dspark.markov_gate.weight"), D + r, r, sqrtf(3.0f / (float)(D + r)), type);
            mk_vec(&b, T("markov_gate.bias", "dspark.markov_gate.bias"), r, 0.0f, 0.5f);
        } else if (markov == DS_MARKOV_RNN) {
            mk_matrix(&b, T("markov_joint.weight", "dspark.markov_joint.weight"), 2 * (int64_t)r + D, 3 * (int64_t)r,
                      sqrtf(3.0f / (float)(2 * r + D)), type);
            mk_vec(&b, T("markov_joint.bias", "dspark.markov_joint.bias"), 3 * (int64_t)r, 0.0f, 0.5f);
        }
    }
    if (conf) {
        int64_t in = D + (conf_wm ? r : 0);
        mk_matrix(&b, T("conf_proj.weight", "dspark.confidence_head.weight"), in, 1, sqrtf(3.0f / (float)in), DS_TYPE_F32);
        mk_vec(&b, T("conf_proj.bias", "dspark.confidence_head.bias"), 1, 0.0f, 0.5f);
    }
    if (w > 0) {
        mk_vec(&b, T("correction_hidden_norm.weight", "dspark.correction_hidden_norm.weight"), D, 1.0f, 0.1f);
        mk_vec(&b, T("correction_embed_norm.weight", "dspark.correction_embed_norm.weight"), D, 1.0f, 0.1f);
        mk_matrix(&b, T("correction_gate.weight", "dspark.correction_gate.weight"), 2 * D, w, sqrtf(3.0f / (float)(2 * D)), type);
        mk_matrix(&b, T("correction_up.weight", "dspark.correction_up.weight"), 2 * D, w, sqrtf(3.0f / (float)(2 * D)), type);
        mk_matrix(&b, T("correction_down.weight", "dspark.correction_down.weight"), w, D, sqrtf(3.0f / (float)w) * 0.5f, type);
    }
#undef T
    /* the legacy layout carries a copy of the embedding (the loader checks
     * its shape and uses the target's memory anyway) */
    if (dspark && !b.failed) {
        const ds_weight *te = &target->tok_embd;
        int ok;
        uint64_t rb = ds_row_bytes(te->type, (uint64_t)te->n_in, &ok);
        uint64_t ne[2] = { (uint64_t)te->n_in, (uint64_t)te->n_out };
        if (!ok || gguf_add_tensor(W, "token_embd.weight", te->type, 2, ne, te->data, rb * (uint64_t)te->n_out)) b.failed = 1;
    }
    if (b.failed) {
        const char *we = gguf_writer_error(W);
        ds_errf(err, errlen, "%s: building the drafter failed: %s", C, we ? we : "out of memory");
        gguf_writer_free(W);
        return -1;
    }
    int rc = gguf_writer_write(W, out, err, errlen);
    gguf_writer_free(W);
    return rc ? -1 : 0;
}
