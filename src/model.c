/* model.c — Qwen3 / Llama target: loading, KV cache, decode and batched
 * forward. Read top to bottom: load -> context -> forward -> public entry
 * points -> state snapshots.
 *
 * One forward function serves both paths. ds_decode() runs it with M=1 and
 * every family forced to its decode kernel (= canonical at M=1);
 * ds_forward_batch() runs it with the context's kernel set. So with an
 * all-canonical set the two paths execute the very same per-row instruction
 * sequences, and the bits agree by construction rather than by luck. */
#include "model.h"
#include "dspark_diag.h"
#include "tp.h"
#include "kernels/dsmath.h"

#include <math.h>
#include <stdlib.h>

/* ========================================================================
 * Loading
 * ===================================================================== */

const char *ds_arch_name(ds_arch a) {
    return a == DS_ARCH_LLAMA ? "llama" : a == DS_ARCH_QWEN3MOE ? "qwen3moe" : a == DS_ARCH_QWEN35 ? "qwen35"
         : a == DS_ARCH_DEEPSEEK4 ? "deepseek4" : "qwen3";
}

ds_layer_shape ds_hp_layer_shape(const ds_hparams *hp) {
    const int S = hp->ssm_d_state, Hk = hp->ssm_n_group, Hv = hp->ssm_dt_rank;
    return (ds_layer_shape){
        .d = hp->n_embd, .n_head = hp->n_head, .n_head_kv = hp->n_head_kv, .head_dim = hp->head_dim,
        .n_ff = hp->n_ff, .eps = hp->norm_eps, .rope_base = hp->rope_base, .rope_mode = ds_arch_rope(hp->arch),
        .n_rot = hp->n_rot, .rope_yarn = hp->rope_scaled ? &hp->rope_yarn : NULL,
        .gdn = {.n_k_head = Hk, .n_v_head = Hv, .head_dim = S, .d_conv = hp->ssm_d_conv,
                .conv_dim = (2 * Hk + Hv) * S, .eps = hp->norm_eps},
        .hc = hp->hc, .hc_iters = hp->hc_iters, .q_lora = hp->q_lora, .o_groups = hp->o_groups, .o_lora = hp->o_lora,
        .n_swa = hp->n_swa, .hc_eps = hp->hc_eps, .comp_rope_base = hp->comp_rope_base,
        .comp_yarn = hp->comp_yarn_on ? &hp->comp_yarn : NULL, .kv_row = ds_hp_kv_row(hp),
        .idx_heads = hp->idx_heads, .idx_dim = hp->idx_dim, .idx_top_k = hp->idx_top_k,
    };
}

int64_t ds_hp_k_max(const ds_hparams *hp) {
    const int64_t qd = (int64_t)hp->n_head * hp->head_dim;
    const int64_t c[6] = {hp->n_embd, hp->n_ff, qd, ds_hp_stream(hp), hp->q_lora, (int64_t)hp->o_groups * hp->o_lora};
    int64_t k = 0;
    for (int i = 0; i < 6; i++) if (c[i] > k) k = c[i];
    return k;
}

size_t ds_hp_hybrid_scratch(const ds_hparams *hp, int m_max) {
    const ds_layer_shape s = ds_hp_layer_shape(hp);
    if (hp->arch == DS_ARCH_DEEPSEEK4) return ds_ds4_scratch_floats(m_max, &s);
    if (hp->arch != DS_ARCH_QWEN35) return 0;
    return ds_hybrid_scratch_floats(m_max, &s);
}

int ds_hp_rstate_init(const ds_hparams *hp, ds_rstate *r, ds_backend *be, int n_slot, int cap, int m_max,
                      char *err, size_t errlen) {
    memset(r, 0, sizeof *r);
    if (hp->n_rec <= 0) return 0;
    const ds_layer_shape s = ds_hp_layer_shape(hp);
    const size_t conv_n = (size_t)(s.gdn.d_conv - 1) * (size_t)s.gdn.conv_dim;
    const size_t ssm_n = (size_t)s.gdn.n_v_head * (size_t)s.gdn.head_dim * (size_t)s.gdn.head_dim;
    const size_t log_row = (size_t)s.gdn.conv_dim + 2 * (size_t)s.gdn.n_v_head;
    return ds_rstate_init(r, be, n_slot, cap < m_max ? cap : m_max, hp->n_rec, conv_n, ssm_n, log_row, m_max, err, errlen);
}

int ds_model_rs_rewind(const ds_model *m, ds_exec *ex, ds_acts *a, int seq, int n, char *err, size_t errlen) {
    if (!a->rs) return 0;
    const ds_layer_shape s = ds_hp_layer_shape(&m->hp);
    return ds_gdn_rewind(ex, m->layers, m->hp.n_layer, &s, a, seq, n, err, errlen);
}

size_t ds_hp_moe_scratch(const ds_hparams *hp, int m_max) {
    return ds_moe_scratch_floats(m_max, hp->n_expert, hp->n_expert_used, hp->n_embd, hp->n_ff_exp, hp->n_ff_shexp);
}

static int get_u32_req(const gguf_ctx *g, const char *arch, const char *suffix, int *out,
                       char *err, size_t errlen) {
    char key[128];
    snprintf(key, sizeof key, "%s.%s", arch, suffix);
    uint32_t v;
    int rc = gguf_get_u32(g, key, &v);
    if (rc == -1) { ds_errf(err, errlen, "model: missing metadata key '%s'", key); return -1; }
    if (rc != 0) { ds_errf(err, errlen, "model: metadata key '%s' has the wrong type (want an unsigned integer)", key); return -1; }
    if (v > (1u << 30)) { ds_errf(err, errlen, "model: metadata key '%s' = %u is out of range", key, v); return -1; }
    *out = (int)v;
    return 0;
}

static int get_f32_opt(const gguf_ctx *g, const char *arch, const char *suffix, float *out,
                       char *err, size_t errlen) {
    char key[128];
    snprintf(key, sizeof key, "%s.%s", arch, suffix);
    int rc = gguf_get_f32(g, key, out);
    if (rc == -2) { ds_errf(err, errlen, "model: metadata key '%s' has the wrong type (want f32)", key); return -1; }
    return 0;
}

/* rope.scaling: type (none / linear / yarn; absent: none), factor (<= 1:
 * none) and original_context_length (absent: context_length). *type is 0
 * for none, 1 linear, 2 yarn. */
static int get_rope_scaling(const gguf_ctx *g, const char *arch, int n_ctx_train, int *type, float *factor,
                            int *orig, char *err, size_t errlen) {
    char key[128];
    *type = 0;
    *factor = 0.0f;
    *orig = n_ctx_train;
    snprintf(key, sizeof key, "%s.rope.scaling.type", arch);
    gguf_str t = {NULL, 0};
    const int rc = gguf_find_kv(g, key) ? gguf_get_str(g, key, &t) : -1;
    if (rc == -2 || (rc == 0 && !t.ptr)) { ds_errf(err, errlen, "model: metadata key '%s' has the wrong type (want a string)", key); return -1; }
    if (get_f32_opt(g, arch, "rope.scaling.factor", factor, err, errlen)) return -1;
    snprintf(key, sizeof key, "%s.rope.scaling.original_context_length", arch);
    if (gguf_find_kv(g, key) && get_u32_req(g, arch, "rope.scaling.original_context_length", orig, err, errlen)) return -1;
    if (rc == 0 && !(t.len == 4 && !memcmp(t.ptr, "none", 4))) {
        if (t.len == 6 && !memcmp(t.ptr, "linear", 6)) *type = 1;
        else if (t.len == 4 && !memcmp(t.ptr, "yarn", 4)) *type = 2;
        else {
            ds_errf(err, errlen, "model: rope.scaling.type '%.*s' is not supported (none, linear, yarn)",
                    (int)(t.len > 32 ? 32 : t.len), t.ptr);
            return -1;
        }
    }
    if (*type && !(*factor > 1.0f && *factor < 1e6f)) *type = 0;      /* factor <= 1 or absent: no scaling */
    if (*type == 2 && (*orig < 1 || *orig > (1 << 26))) {
        ds_errf(err, errlen, "model: yarn rope scaling needs rope.scaling.original_context_length (or context_length) in 1..%d, got %d",
                1 << 26, *orig);
        return -1;
    }
    return 0;
}

/* The RoPE scaling of the dense architectures (qwen3, qwen3moe, qwen35,
 * llama), as llama.cpp's loader and context set it up for them:
 *   rope.scaling.type none / linear / yarn (absent with a factor: linear,
 *   llama.cpp's default; anything else, e.g. longrope, refused), factor F:
 *   freq_scale = 1 / F; yarn: ext_factor 1, the ramp over beta_fast 32 ..
 *   beta_slow 1 (llama.cpp reads no beta keys for these architectures) on
 *   original_context_length (or context_length), and rope_yarn's magnitude
 *   (1 + 0.1 ln F) times the context's yarn_attn_factor, get_mscale(F) /
 *   (1 + 0.1 ln F); rope.scaling.attn_factor multiplies the magnitude.
 *   rope_freqs.weight (llama only, as in llama.cpp: Llama 3.1's llama3
 *   factors): F32, n_rot / 2 values, each finite and > 0, dividing pair i's
 *   angle before the scaling.
 * Plain RoPE (no factors, no scaling, attn_factor 1) leaves rope_scaled 0:
 * the unscaled kernels and their bits. */
static int load_rope_scaling(const gguf_ctx *g, ds_model *m, const char *arch, char *err, size_t errlen) {
    ds_hparams *hp = &m->hp;
    char key[128];
    int st, orig;
    float factor;
    if (get_rope_scaling(g, arch, hp->n_ctx_train, &st, &factor, &orig, err, errlen)) return -1;
    snprintf(key, sizeof key, "%s.rope.scaling.type", arch);
    if (!gguf_find_kv(g, key) && factor > 1.0f && factor < 1e6f) st = 1;      /* llama.cpp: absent type is linear */
    float attn = 1.0f;
    if (get_f32_opt(g, arch, "rope.scaling.attn_factor", &attn, err, errlen)) return -1;
    if (!(attn > 0.0f && attn < 1e6f)) {
        ds_errf(err, errlen, "model: rope.scaling.attn_factor %g is out of range (0, 1e6)", (double)attn);
        return -1;
    }
    const int n_rot = hp->n_rot > 0 && hp->n_rot < hp->head_dim ? hp->n_rot : hp->head_dim;
    const gguf_tensor *t = gguf_find_tensor(g, "rope_freqs.weight");
    if (t && hp->arch != DS_ARCH_LLAMA) {
        ds_errf(err, errlen, "model: %s file with a rope_freqs.weight tensor: frequency factors are a llama tensor "
                "(llama.cpp does not apply them to %s either)", arch, arch);
        return -1;
    }
    if (t) {
        const int n = n_rot / 2;
        if (t->type != DS_TYPE_F32 || t->n_dims != 1 || (int64_t)t->ne[0] != n || n > DS_ROPE_FF_MAX) {
            ds_errf(err, errlen, "model: rope_freqs.weight must be F32 of %d values (rope dims / 2), got %s with %llu values in %u dims",
                    n, ds_type_name(t->type), (unsigned long long)gguf_tensor_nelements(t), t->n_dims);
            return -1;
        }
        memcpy(hp->rope_ff, t->data, (size_t)n * sizeof(float));
        for (int i = 0; i < n; i++) {
            const float v = hp->rope_ff[i];
            if (!(v > 0.0f && v - v == 0.0f)) {
                ds_errf(err, errlen, "model: rope_freqs.weight[%d] = %g: frequency factors must be finite and > 0", i, (double)v);
                return -1;
            }
        }
    }
    hp->rope_scaled = st != 0 || t != NULL || attn != 1.0f;
    if (!hp->rope_scaled) return 0;
    if (!m->be->i->rope_ext) {
        ds_errf(err, errlen, "model: rope scaling needs the rope_ext kernel, which the %s device lacks (use --device cpu)",
                m->be->i->name);
        return -1;
    }
    if (!ds_backend_path_on(m->be, "ropeext")) {
        ds_errf(err, errlen, "model: rope scaling on %s has not run on a GPU yet (DSPARK_CUDA_ON=ropeext to try it; --device cpu)",
                m->be->i->name);
        return -1;
    }
    ds_rope_yarn *y = &hp->rope_yarn;
    *y = (ds_rope_yarn){.freq_scale = 1.0f, .mscale = attn, .freq_factors = t ? hp->rope_ff : NULL};
    if (st) y->freq_scale = 1.0f / factor;
    if (st == 2) {
        float dims[2];
        ds_rope_yarn_dims(n_rot, orig, hp->rope_base, 32.0f, 1.0f, dims);
        y->ext_factor = 1.0f;
        y->lo = dims[0];
        y->hi = dims[1];
        /* llama.cpp's float sequence: factor back from freq_scale, its log,
         * get_mscale, the cancellation, attn_factor, then rope_yarn's own */
        const float f = 1.0f / y->freq_scale, lf = (float)ds_log((double)f), mag = 1.0f + 0.1f * lf;
        float a = 0.1f * lf + 1.0f;
        a = a * (1.0f / mag);
        a = a * attn;
        y->mscale = a * mag;
    }
    return 0;
}

/* Look up a tensor and check its type and ggml shape {ne0, ne1} (ne1 = 0
 * means 1-D). */
static const gguf_tensor *want_tensor(const gguf_ctx *g, const char *name, int64_t ne0, int64_t ne1,
                                      char *err, size_t errlen) {
    const gguf_tensor *t = gguf_find_tensor(g, name);
    if (!t) { ds_errf(err, errlen, "model: missing tensor '%s'", name); return NULL; }
    uint32_t want_dims = ne1 ? 2 : 1;
    int ok = t->n_dims == want_dims && (int64_t)t->ne[0] == ne0 && (ne1 == 0 || (int64_t)t->ne[1] == ne1);
    if (!ok) {
        char got[96] = "", want[64];
        for (uint32_t i = 0; i < t->n_dims; i++) {
            size_t l = strlen(got);
            snprintf(got + l, sizeof got - l, "%s%llu", i ? ", " : "", (unsigned long long)t->ne[i]);
        }
        if (ne1) snprintf(want, sizeof want, "%lld, %lld", (long long)ne0, (long long)ne1);
        else snprintf(want, sizeof want, "%lld", (long long)ne0);
        ds_errf(err, errlen, "model: tensor '%s' has shape [%s], expected [%s]", name, got, want);
        return NULL;
    }
    return t;
}

/* A 3-D tensor {ne0, ne1, ne2} of llama.cpp's stacked experts, as ne2
 * weights of [ne1][ne0] each (views: no copy). */
static int load_experts(const gguf_ctx *g, const char *name, int64_t n_in, int64_t n_out, int n_exp, ds_weight *w,
                        char *err, size_t errlen) {
    const gguf_tensor *t = gguf_find_tensor(g, name);
    if (!t) { ds_errf(err, errlen, "model: missing tensor '%s'", name); return -1; }
    if (t->n_dims != 3 || (int64_t)t->ne[0] != n_in || (int64_t)t->ne[1] != n_out || (int64_t)t->ne[2] != n_exp) {
        ds_errf(err, errlen, "model: tensor '%s' has shape [%llu, %llu, %llu] (%u dims), expected [%lld, %lld, %d]", name,
                (unsigned long long)t->ne[0], (unsigned long long)(t->n_dims > 1 ? t->ne[1] : 0),
                (unsigned long long)(t->n_dims > 2 ? t->ne[2] : 0), t->n_dims, (long long)n_in, (long long)n_out, n_exp);
        return -1;
    }
    if (n_in % (int64_t)ds_type_block_elems(t->type)) {
        ds_errf(err, errlen, "model: tensor '%s' is %s but its row length %lld is not a multiple of %d", name,
                ds_type_name(t->type), (long long)n_in, (int)ds_type_block_elems(t->type));
        return -1;
    }
    int ok;
    const uint64_t rb = ds_row_bytes(t->type, (uint64_t)n_in, &ok);
    for (int e = 0; e < n_exp; e++)
        w[e] = (ds_weight){t->type, n_in, n_out, (const unsigned char *)t->data + (size_t)e * (size_t)n_out * rb, NULL};
    return 0;
}

static int load_weight(const gguf_ctx *g, const char *name, int64_t n_in, int64_t n_out, ds_weight *w,
                       char *err, size_t errlen) {
    const gguf_tensor *t = want_tensor(g, name, n_in, n_out, err, errlen);
    if (!t) return -1;
    if (n_in % (int64_t)ds_type_block_elems(t->type)) {
        ds_errf(err, errlen, "model: tensor '%s' is %s but its row length %lld is not a multiple of %d", name,
                ds_type_name(t->type), (long long)n_in, (int)ds_type_block_elems(t->type));
        return -1;
    }
    w->type = t->type; w->n_in = n_in; w->n_out = n_out; w->data = t->data;
    return 0;
}

/* Norm weights are tiny; convert whatever type they are stored in to f32
 * once, into the model's arena. */
static int load_norm(const gguf_ctx *g, const char *name, int64_t n, float **cursor, const float **out,
                     char *err, size_t errlen) {
    const gguf_tensor *t = want_tensor(g, name, n, 0, err, errlen);
    if (!t) return -1;
    if (n % (int64_t)ds_type_block_elems(t->type)) {
        ds_errf(err, errlen, "model: tensor '%s' is %s with a length not a multiple of its block", name, ds_type_name(t->type));
        return -1;
    }
    ds_row_to_f32(t->type, t->data, n, *cursor);
    *out = *cursor;
    *cursor += n;
    return 0;
}

/* Hand every weight to the backend once: matmul weights (the layers' seven
 * and the LM head) and the embedding table (row lookups). A tied head is
 * prepared once and shared. Then the f32 norm vectors become device
 * constants (the CPU keeps the host arena), and every norm pointer is
 * rebased onto them. */
static int prepare_weights(ds_model *m, char *err, size_t errlen) {
    ds_backend *be = m->be;
    const int nl = m->hp.n_layer;
    m->weights_prepared = 1;          /* release_weight takes unprepared ones */
    for (int l = 0; l < nl; l++) {
        ds_weight *w;
        for (int i = 0; (w = ds_layer_weight(&m->layers[l], i)); i++)
            if (be->i->prepare_weight(be, w, DS_USE_MATMUL, err, errlen)) return -1;
        /* a MoE layer's three expert arrays for matmul_id (one array is one
         * 3-D tensor of the file: one type, one shape), where the backend
         * takes all three (layer.c ds_layer_moe_on_device) */
        ds_layer *L = &m->layers[l];
        L->exp_id = 0;
        if (L->n_expert > 0 && L->exp_gate && be->i->moe_id_prepare && be->i->matmul_id) {
            int took = 1;
            ds_weight *const arr[3] = {L->exp_gate, L->exp_up, L->exp_down};
            for (int j = 0; j < 3; j++) {
                const int rc = be->i->moe_id_prepare(be, arr[j], L->n_expert, err, errlen);
                if (rc < 0) return -1;
                took = took && rc == 0;
            }
            L->exp_id = took;
        }
    }
    if (be->i->prepare_weight(be, &m->output, DS_USE_MATMUL | (m->output_tied ? DS_USE_LOOKUP : 0), err, errlen))
        return -1;
    if (m->hc_head_fn.data && be->i->prepare_weight(be, &m->hc_head_fn, DS_USE_MATMUL, err, errlen)) return -1;
    if (m->output_tied) m->tok_embd.extra = m->output.extra;
    else if (be->i->prepare_weight(be, &m->tok_embd, DS_USE_LOOKUP, err, errlen)) return -1;

    char e2[DS_ERRLEN];
    ds_exec *ex = be->i->exec_new(be, 1, e2, sizeof e2);
    if (!ex) { ds_errf(err, errlen, "%s", e2); return -1; }
    m->f32_dev = ds_backend_const(be, ex, m->f32_arena, m->f32_n * sizeof(float));
    int rc = m->f32_dev && !be->i->sync(ex, e2, sizeof e2) ? 0 : -1;
    be->i->exec_free(ex);
    if (rc) { ds_errf(err, errlen, "model: out of %s memory for the norm vectors", be->i->name); return -1; }
#define REBASE(p) ((p) = (p) ? m->f32_dev + ((p) - m->f32_arena) : NULL)
    REBASE(m->output_norm);
    for (int l = 0; l < nl; l++) {
        ds_layer *L = &m->layers[l];
        REBASE(L->attn_norm); REBASE(L->ffn_norm); REBASE(L->q_norm); REBASE(L->k_norm);
        REBASE(L->conv_w); REBASE(L->dt_bias); REBASE(L->ssm_a); REBASE(L->ssm_norm);
        REBASE(L->q_a_norm); REBASE(L->kv_norm); REBASE(L->sinks); REBASE(L->hc_attn_base); REBASE(L->hc_attn_scale);
        REBASE(L->hc_ffn_base); REBASE(L->hc_ffn_scale); REBASE(L->exp_probs_b);
    }
    REBASE(m->hc_head_base); REBASE(m->hc_head_scale);
#undef REBASE
    return 0;
}

/* ========================================================================
 * qwen35 (Qwen3.5 / 3.6 dense): gated delta net layers between full-attention
 * layers, llama.cpp's keys and tensor names
 * ===================================================================== */

/* The recurrence's sizes, which layers are recurrent, the partial RoPE and
 * the MTP blocks llama.cpp counts in block_count (skipped: dspark drafts with
 * its own drafters). */
static int load_qwen35_hparams(const gguf_ctx *g, ds_model *m, const char *arch, char *err, size_t errlen) {
    ds_hparams *hp = &m->hp;
    int d_inner = 0;
    char key[128];
    if (get_u32_req(g, arch, "ssm.conv_kernel", &hp->ssm_d_conv, err, errlen) ||
        get_u32_req(g, arch, "ssm.inner_size", &d_inner, err, errlen) ||
        get_u32_req(g, arch, "ssm.state_size", &hp->ssm_d_state, err, errlen) ||
        get_u32_req(g, arch, "ssm.time_step_rank", &hp->ssm_dt_rank, err, errlen) ||
        get_u32_req(g, arch, "ssm.group_count", &hp->ssm_n_group, err, errlen))
        return -1;
    const int S = hp->ssm_d_state, Hk = hp->ssm_n_group, Hv = hp->ssm_dt_rank;
    if (hp->ssm_d_conv < 2 || hp->ssm_d_conv > DS_GDN_MAX_CONV || S < 1 || S > DS_GDN_MAX_HEAD || Hk < 1 ||
        Hv < Hk || Hv % Hk || Hv > 4096 || d_inner != Hv * S) {
        ds_errf(err, errlen, "model: qwen35 ssm sizes out of range (conv_kernel=%d in 2..%d, state_size=%d in 1..%d, "
                "group_count=%d, time_step_rank=%d a multiple of it, inner_size=%d = time_step_rank x state_size)",
                hp->ssm_d_conv, DS_GDN_MAX_CONV, S, DS_GDN_MAX_HEAD, Hk, Hv, d_inner);
        return -1;
    }
    snprintf(key, sizeof key, "%s.rope.dimension_count", arch);
    if (gguf_find_kv(g, key) && get_u32_req(g, arch, "rope.dimension_count", &hp->n_rot, err, errlen)) return -1;
    if (hp->n_rot < 2 || hp->n_rot > hp->head_dim || hp->n_rot % 2) {
        ds_errf(err, errlen, "model: rope.dimension_count %d must be even and in 2..%d", hp->n_rot, hp->head_dim);
        return -1;
    }
    int nextn = 0;
    snprintf(key, sizeof key, "%s.nextn_predict_layers", arch);
    if (gguf_find_kv(g, key) && get_u32_req(g, arch, "nextn_predict_layers", &nextn, err, errlen)) return -1;
    const int n_all = hp->n_layer;
    if (nextn >= n_all) {
        ds_errf(err, errlen, "model: nextn_predict_layers %d leaves no trunk of block_count %d", nextn, n_all);
        return -1;
    }
    hp->n_layer = n_all - nextn;
    /* attention.recurrent_layers (one flag a block) or every
     * full_attention_interval-th layer full attention (llama.cpp's rule) */
    snprintf(key, sizeof key, "%s.attention.recurrent_layers", arch);
    const gguf_kv *rk = gguf_find_kv(g, key);
    int interval = 4;
    if (!rk) {
        snprintf(key, sizeof key, "%s.full_attention_interval", arch);
        if (gguf_find_kv(g, key) && get_u32_req(g, arch, "full_attention_interval", &interval, err, errlen)) return -1;
        if (interval < 1) { ds_errf(err, errlen, "model: full_attention_interval must be >= 1"); return -1; }
    } else if (rk->type != GGUF_T_ARRAY || rk->arr_n != (uint64_t)n_all) {
        ds_errf(err, errlen, "model: '%s' must be an array of %d flags", key, n_all);
        return -1;
    }
    if ((uint64_t)n_all * 9 > gguf_n_tensors(g)) {
        ds_errf(err, errlen, "model: block_count %d needs at least %lld tensors, the file has %llu", n_all,
                (long long)n_all * 9, (unsigned long long)gguf_n_tensors(g));
        return -1;
    }
    m->layers = calloc((size_t)hp->n_layer, sizeof(ds_layer));
    if (!m->layers) { ds_errf(err, errlen, "model: out of memory"); return -1; }
    hp->n_rec = 0;
    for (int l = 0; l < hp->n_layer; l++) {
        int64_t f = (l + 1) % interval != 0;
        if (rk) {
            if (rk->arr_type == GGUF_T_BOOL) f = rk->arr_data[l] != 0;
            else if (gguf_arr_i64(rk, (uint64_t)l, &f)) {
                ds_errf(err, errlen, "model: '%s' must hold integer or bool flags", key);
                return -1;
            }
        }
        m->layers[l].recur = f != 0;
        if (f) m->layers[l].rec_idx = hp->n_rec++;
    }
    if (hp->n_rec == hp->n_layer) {
        ds_errf(err, errlen, "model: qwen35 with no full-attention layer (every one of %d layers recurrent)", hp->n_layer);
        return -1;
    }
    if (!m->be->i->gdn_conv || !m->be->i->gdn_recur || !m->be->i->sigmoid_mul || !m->be->i->host_memory) {
        ds_errf(err, errlen, "model: qwen35 is a hybrid recurrent model and the %s device has no gated delta net kernels yet "
                "(use --device cpu)", m->be->i->name);
        return -1;
    }
    return 0;
}

/* One block: the norms, the mixer (a gated delta net's or the gated
 * attention's), the SwiGLU FFN. li counts the recurrent layers. */
static int load_qwen35_layer(const gguf_ctx *g, ds_model *m, int l, int *li, float **cur, char *err, size_t errlen) {
    const ds_hparams *hp = &m->hp;
    ds_layer *L = &m->layers[l];
    const int d = hp->n_embd, hd = hp->head_dim, qd = hp->n_head * hd, kvd = hp->n_head_kv * hd;
    const ds_layer_shape sh = ds_hp_layer_shape(hp);
    const int C = sh.gdn.conv_dim, Hv = sh.gdn.n_v_head, S = sh.gdn.head_dim, vd = Hv * S, K = sh.gdn.d_conv;
    char n[96];
#define NAME(s) (snprintf(n, sizeof n, "blk.%d." s, l), n)
    if (load_norm(g, NAME("attn_norm.weight"), d, cur, &L->attn_norm, err, errlen) ||
        load_norm(g, NAME("post_attention_norm.weight"), d, cur, &L->ffn_norm, err, errlen) ||
        load_weight(g, NAME("ffn_gate.weight"), d, hp->n_ff, &L->w_gate, err, errlen) ||
        load_weight(g, NAME("ffn_up.weight"), d, hp->n_ff, &L->w_up, err, errlen) ||
        load_weight(g, NAME("ffn_down.weight"), hp->n_ff, d, &L->w_down, err, errlen))
        return -1;
    if (!L->recur) {
        L->q_gate = 1;
        return load_weight(g, NAME("attn_q.weight"), d, 2 * qd, &L->wq, err, errlen) ||
               load_weight(g, NAME("attn_k.weight"), d, kvd, &L->wk, err, errlen) ||
               load_weight(g, NAME("attn_v.weight"), d, kvd, &L->wv, err, errlen) ||
               load_weight(g, NAME("attn_output.weight"), qd, d, &L->wo, err, errlen) ||
               load_norm(g, NAME("attn_q_norm.weight"), hd, cur, &L->q_norm, err, errlen) ||
               load_norm(g, NAME("attn_k_norm.weight"), hd, cur, &L->k_norm, err, errlen) ? -1 : 0;
    }
    L->rec_idx = (*li)++;
    if (load_weight(g, NAME("attn_qkv.weight"), d, C, &L->ssm_qkv, err, errlen) ||
        load_weight(g, NAME("attn_gate.weight"), d, vd, &L->ssm_z, err, errlen) ||
        load_weight(g, NAME("ssm_alpha.weight"), d, Hv, &L->ssm_alpha, err, errlen) ||
        load_weight(g, NAME("ssm_beta.weight"), d, Hv, &L->ssm_beta, err, errlen) ||
        load_weight(g, NAME("ssm_out.weight"), vd, d, &L->ssm_out, err, errlen) ||
        load_norm(g, NAME("ssm_dt.bias"), Hv, cur, &L->dt_bias, err, errlen) ||
        load_norm(g, NAME("ssm_a"), Hv, cur, &L->ssm_a, err, errlen) ||
        load_norm(g, NAME("ssm_norm.weight"), S, cur, &L->ssm_norm, err, errlen))
        return -1;
    /* the conv kernel {d_conv, conv_dim}: conv_dim rows of d_conv taps */
    const gguf_tensor *t = want_tensor(g, NAME("ssm_conv1d.weight"), K, C, err, errlen);
    if (!t) return -1;
    if (t->type != DS_TYPE_F32 && t->type != DS_TYPE_F16 && t->type != DS_TYPE_BF16) {
        ds_errf(err, errlen, "model: tensor '%s' is %s (want F32, F16 or BF16)", n, ds_type_name(t->type));
        return -1;
    }
    ds_row_to_f32(t->type, t->data, (int64_t)K * C, *cur);
    L->conv_w = *cur;
    *cur += (size_t)K * C;
#undef NAME
    return 0;
}

/* ========================================================================
 * deepseek4 (DeepSeek V4): llama.cpp's keys and tensor names. dspark runs
 * its raw attention layers (attention.compress_ratios 0) and its
 * hash-routed layers (hash_layer_count: experts from ffn_gate_tid2eid by
 * token id), its compressed layers and the SwiGLU clamp
 * (swiglu_clamp_exp / _shexp, one value or one per layer); the rest is
 * refused with one line each.
 * ===================================================================== */

/* Layer l's value of a per-layer f32 key that llama.cpp reads with
 * get_key_or_arr: one number for every layer, or an array of one per
 * layer (checked at load: ds4_limits_ok). */
static float ds4_layer_f32(const gguf_kv *kv, int l) {
    float f = 0.0f;
    if (!kv) return 0.0f;
    if (kv->type != GGUF_T_ARRAY) return kv->type == GGUF_T_F32 || kv->type == GGUF_T_F64 ? (float)kv->v.f : 0.0f;
    return gguf_arr_f32(kv, (uint64_t)l, &f) ? 0.0f : f;
}

static int ds4_limits_ok(const gguf_kv *kv, const char *key, int n_all, char *err, size_t errlen) {
    if (!kv) return 0;
    if (kv->type == GGUF_T_ARRAY) {
        float f;
        if (kv->arr_n != (uint64_t)n_all || (n_all > 0 && gguf_arr_f32(kv, 0, &f))) {
            ds_errf(err, errlen, "model: '%s' must be one f32 or an array of %d f32 (one per layer)", key, n_all);
            return -1;
        }
    } else if (kv->type != GGUF_T_F32 && kv->type != GGUF_T_F64) {
        ds_errf(err, errlen, "model: metadata key '%s' has the wrong type (want f32)", key);
        return -1;
    }
    for (int l = 0; l < n_all; l++) {
        const float f = ds4_layer_f32(kv, l);
        if (!(f >= 0.0f) || f > 1e30f) {
            ds_errf(err, errlen, "model: '%s' of layer %d is %g (a SwiGLU limit is >= 0 and finite)", key, l, (double)f);
            return -1;
        }
    }
    return 0;
}
static int get_f32_req(const gguf_ctx *g, const char *arch, const char *suffix, float *out, char *err, size_t errlen) {
    char key[128];
    snprintf(key, sizeof key, "%s.%s", arch, suffix);
    if (!gguf_find_kv(g, key)) { ds_errf(err, errlen, "model: missing metadata key '%s'", key); return -1; }
    return get_f32_opt(g, arch, suffix, out, err, errlen);
}

/* A hash layer's expert table: I32 [n_vocab][k] (llama.cpp's {k, n_vocab}),
 * every entry an expert index. Read in place (deepseek4 runs on host
 * memory only). */
static int load_tid2eid(const gguf_ctx *g, const char *name, int k, int n_vocab, int n_expert, const int32_t **out,
                        char *err, size_t errlen) {
    const gguf_tensor *t = gguf_find_tensor(g, name);
    if (!t) { ds_errf(err, errlen, "model: missing tensor '%s' (a hash layer's expert table)", name); return -1; }
    if (t->type != DS_TYPE_I32 || t->n_dims != 2 || t->ne[0] != (uint64_t)k || t->ne[1] != (uint64_t)n_vocab) {
        ds_errf(err, errlen, "model: tensor '%s' must be I32 [%d, %d] (expert_used_count, vocabulary); it is %s with %llu x %llu",
                name, k, n_vocab, ds_type_name(t->type), (unsigned long long)t->ne[0],
                (unsigned long long)(t->n_dims > 1 ? t->ne[1] : 1));
        return -1;
    }
    const uint8_t *p = t->data;
    for (int64_t i = 0; i < (int64_t)k * n_vocab; i++) {
        int32_t e;
        memcpy(&e, p + 4 * i, 4);
        if (e < 0 || e >= n_expert) {
            ds_errf(err, errlen, "model: tensor '%s': entry %lld (token %lld) is expert %d, outside [0, %d)", name,
                    (long long)i, (long long)(i / k), e, n_expert);
            return -1;
        }
    }
    if ((uintptr_t)p % 4) { ds_errf(err, errlen, "model: tensor '%s' is not 4-byte aligned", name); return -1; }
    *out = (const int32_t *)(const void *)p;
    return 0;
}

/* A compressor's ape {w, r}: r rows of w floats, F32 / F16 / BF16, into the arena. */
static int load_ape(const gguf_ctx *g, const char *name, int w, int r, float **cur, const float **out, char *err,
                    size_t errlen) {
    const gguf_tensor *t = want_tensor(g, name, w, r, err, errlen);
    if (!t) return -1;
    if (t->type != DS_TYPE_F32 && t->type != DS_TYPE_F16 && t->type != DS_TYPE_BF16) {
        ds_errf(err, errlen, "model: tensor '%s' is %s (want F32, F16 or BF16)", name, ds_type_name(t->type));
        return -1;
    }
    ds_row_to_f32(t->type, t->data, (int64_t)w * r, *cur);
    *out = *cur;
    *cur += (size_t)w * (size_t)r;
    return 0;
}

static int load_ds4(const gguf_ctx *g, ds_model *m, const char *arch, char *err, size_t errlen) {
    ds_hparams *hp = &m->hp;
    char key[128];
    int n_all = 0, n_shared = 0, gating = 0, nextn = 0, n_hash = 0;
    if (get_u32_req(g, arch, "block_count", &n_all, err, errlen) ||
        get_u32_req(g, arch, "embedding_length", &hp->n_embd, err, errlen) ||
        get_u32_req(g, arch, "attention.head_count", &hp->n_head, err, errlen) ||
        get_u32_req(g, arch, "attention.head_count_kv", &hp->n_head_kv, err, errlen) ||
        get_u32_req(g, arch, "attention.key_length", &hp->head_dim, err, errlen) ||
        get_u32_req(g, arch, "rope.dimension_count", &hp->n_rot, err, errlen) ||
        get_u32_req(g, arch, "attention.q_lora_rank", &hp->q_lora, err, errlen) ||
        get_u32_req(g, arch, "attention.sliding_window", &hp->n_swa, err, errlen) ||
        get_u32_req(g, arch, "attention.output_group_count", &hp->o_groups, err, errlen) ||
        get_u32_req(g, arch, "attention.output_lora_rank", &hp->o_lora, err, errlen) ||
        get_u32_req(g, arch, "expert_count", &hp->n_expert, err, errlen) ||
        get_u32_req(g, arch, "expert_used_count", &hp->n_expert_used, err, errlen) ||
        get_u32_req(g, arch, "expert_feed_forward_length", &hp->n_ff_exp, err, errlen) ||
        get_u32_req(g, arch, "expert_shared_count", &n_shared, err, errlen) ||
        get_u32_req(g, arch, "expert_gating_func", &gating, err, errlen) ||
        get_f32_req(g, arch, "expert_weights_scale", &hp->moe_scale, err, errlen) ||
        get_u32_req(g, arch, "hyper_connection.count", &hp->hc, err, errlen) ||
        get_u32_req(g, arch, "hyper_connection.sinkhorn_iterations", &hp->hc_iters, err, errlen) ||
        get_f32_req(g, arch, "hyper_connection.epsilon", &hp->hc_eps, err, errlen))
        return -1;
    snprintf(key, sizeof key, "%s.expert_weights_norm", arch);
    if (gguf_get_bool(g, key, &hp->moe_norm)) { ds_errf(err, errlen, "model: missing bool metadata key '%s'", key); return -1; }
    snprintf(key, sizeof key, "%s.hash_layer_count", arch);
    if (gguf_find_kv(g, key) && get_u32_req(g, arch, "hash_layer_count", &n_hash, err, errlen)) return -1;
    snprintf(key, sizeof key, "%s.nextn_predict_layers", arch);
    if (gguf_find_kv(g, key) && get_u32_req(g, arch, "nextn_predict_layers", &nextn, err, errlen)) return -1;
    /* the SwiGLU clamp: the shared expert's defaults to the experts' (llama.cpp) */
    snprintf(key, sizeof key, "%s.swiglu_clamp_exp", arch);
    const gguf_kv *ck = gguf_find_kv(g, key);
    if (ds4_limits_ok(ck, key, n_all, err, errlen)) return -1;
    snprintf(key, sizeof key, "%s.swiglu_clamp_shexp", arch);
    const gguf_kv *cks = gguf_find_kv(g, key);
    if (ds4_limits_ok(cks, key, n_all, err, errlen)) return -1;
    if (!cks) cks = ck;
    if (gating != 4) {
        ds_errf(err, errlen, "model: deepseek4 expects expert_gating_func 4 (sqrtsoftplus), got %d", gating);
        return -1;
    }
    if (nextn < 0 || nextn >= n_all) {
        ds_errf(err, errlen, "model: nextn_predict_layers %d leaves no trunk of block_count %d", nextn, n_all);
        return -1;
    }
    hp->n_layer = n_all - nextn;
    if (n_hash < 0 || n_hash > hp->n_layer) {
        ds_errf(err, errlen, "model: hash_layer_count %d exceeds the %d trunk layers", n_hash, hp->n_layer);
        return -1;
    }
    snprintf(key, sizeof key, "%s.attention.compress_ratios", arch);
    const gguf_kv *cr = gguf_find_kv(g, key);
    if (!cr || cr->type != GGUF_T_ARRAY || cr->arr_n < (uint64_t)n_all) {
        ds_errf(err, errlen, "model: deepseek4 needs '%s', an array of %d ratios", key, n_all);
        return -1;
    }
    /* ratio 128 (HCA) runs on a backend with the ds4_compress family; ratio
     * 4 (CSA, the lightning indexer) is refused with one line */
    int64_t n_ape = 0;
    for (int l = 0; l < hp->n_layer; l++) {
        int64_t r = 0;
        if (gguf_arr_i64(cr, (uint64_t)l, &r)) { ds_errf(err, errlen, "model: '%s' must hold integers", key); return -1; }
        if (r != 0 && r != 4 && r != 128) {
            ds_errf(err, errlen, "model: deepseek4 layer %d has compress ratio %lld (llama.cpp knows 0, 4 and 128)", l,
                    (long long)r);
            return -1;
        }
        if (r && (!m->be->i->ds4_compress || !m->be->i->ds4_indexer)) {
            ds_errf(err, errlen, "model: deepseek4 layer %d is a compressed attention layer (ratio %lld) and the %s "
                    "device has no ds4_compress / ds4_indexer kernels (use --device cpu)", l, (long long)r,
                    m->be->i->name);
            return -1;
        }
        if (r) { hp->n_comp++; n_ape += r; }
        if (r == 4) hp->n_csa++;
    }
    int vlen = hp->head_dim;
    snprintf(key, sizeof key, "%s.attention.value_length", arch);
    if (gguf_find_kv(g, key) && get_u32_req(g, arch, "attention.value_length", &vlen, err, errlen)) return -1;
    hp->rope_base = 10000.0f;
    hp->norm_eps = 1e-6f;
    if (get_f32_opt(g, arch, "rope.freq_base", &hp->rope_base, err, errlen) ||
        get_f32_opt(g, arch, "attention.layer_norm_rms_epsilon", &hp->norm_eps, err, errlen))
        return -1;
    hp->comp_rope_base = hp->rope_base;
    if (hp->n_csa && (get_u32_req(g, arch, "attention.indexer.head_count", &hp->idx_heads, err, errlen) ||
                      get_u32_req(g, arch, "attention.indexer.key_length", &hp->idx_dim, err, errlen) ||
                      get_u32_req(g, arch, "attention.indexer.top_k", &hp->idx_top_k, err, errlen)))
        return -1;
    if (hp->n_csa && (hp->idx_heads < 1 || hp->idx_heads > 1024 || hp->idx_dim < hp->n_rot || hp->idx_dim % 2 ||
                      hp->idx_dim > DS_ATTN_SINKS_MAX_HD || hp->idx_top_k < 1 || hp->idx_top_k > (1 << 20))) {
        ds_errf(err, errlen, "model: deepseek4 indexer out of range (head_count=%d in 1..1024, key_length=%d even, "
                ">= rope dims, <= %d, top_k=%d in 1..%d)", hp->idx_heads, hp->idx_dim, DS_ATTN_SINKS_MAX_HD,
                hp->idx_top_k, 1 << 20);
        return -1;
    }
    if (hp->n_comp && get_f32_req(g, arch, "attention.compress_rope_freq_base", &hp->comp_rope_base, err, errlen))
        return -1;
    if (hp->n_comp && !(hp->comp_rope_base > 1.0f && hp->comp_rope_base < 1e12f)) {
        ds_errf(err, errlen, "model: deepseek4 compress_rope_freq_base %g is out of range", (double)hp->comp_rope_base);
        return -1;
    }
    hp->n_ctx_train = 0;
    snprintf(key, sizeof key, "%s.context_length", arch);
    if (gguf_find_kv(g, key) && get_u32_req(g, arch, "context_length", &hp->n_ctx_train, err, errlen)) return -1;
    /* rope scaling on the compressed layers, as llama.cpp's deepseek4 graph
     * applies it (raw layers keep plain RoPE): freq_scale = 1 / factor; YaRN
     * with ext_factor 1, the ramp over beta_fast 32 .. beta_slow 1 (llama.cpp's
     * defaults: deepseek4 files carry no beta keys), and the attention factor
     * 1 / (1 + 0.1 ln factor) that rope_yarn's own magnitude factor cancels */
    {
        int st, orig;
        float factor;
        if (get_rope_scaling(g, arch, hp->n_ctx_train, &st, &factor, &orig, err, errlen)) return -1;
        hp->comp_yarn_on = st != 0 && hp->n_comp > 0;
        if (hp->comp_yarn_on && !m->be->i->rope_ext) {
            ds_errf(err, errlen, "model: deepseek4 rope scaling needs the rope_ext kernel, which the %s device lacks (use --device cpu)",
                    m->be->i->name);
            return -1;
        }
        if (hp->comp_yarn_on) {
            ds_rope_yarn *y = &hp->comp_yarn;
            y->freq_scale = 1.0f / factor;
            y->ext_factor = st == 2 ? 1.0f : 0.0f;
            y->lo = y->hi = 0.0f;
            y->mscale = 1.0f;
            y->freq_factors = NULL;                 /* deepseek4 carries no rope_freqs */
            if (st == 2) {
                float dims[2];
                ds_rope_yarn_dims(hp->n_rot, orig, hp->comp_rope_base, 32.0f, 1.0f, dims);
                y->lo = dims[0];
                y->hi = dims[1];
                const float m = 1.0f + 0.1f * (float)ds_log(1.0 / (double)y->freq_scale);
                y->mscale = (1.0f / m) * m;
            }
        }
    }
    const int d = hp->n_embd, hd = hp->head_dim, H = hp->n_head, E = hp->n_expert, k = hp->n_expert_used;
    if (d < 1 || hp->n_layer < 1 || H < 1 || hp->n_head_kv != 1 || hd < 2 || hd > DS_ATTN_SINKS_MAX_HD || vlen != hd ||
        hp->n_rot < 2 || hp->n_rot > hd || hp->n_rot % 2 || hp->q_lora < 1 || hp->o_groups < 1 || H % hp->o_groups ||
        hp->o_lora < 1 || hp->hc < 1 || hp->hc > DS_HC_MAX || hp->hc_iters < 1 || hp->hc_iters > 100 || E < 1 ||
        E > DS_MOE_MAX_EXPERT || k < 1 || k > E || hp->n_ff_exp < 1 || n_shared < 1 || n_shared > 64 ||
        !(hp->norm_eps > 0.0f && hp->norm_eps < 1.0f) || !(hp->rope_base > 1.0f && hp->rope_base < 1e12f) ||
        !(hp->hc_eps >= 0.0f && hp->hc_eps < 1.0f) || (int64_t)H * hd > (1 << 24)) {
        ds_errf(err, errlen, "model: deepseek4 hyper-parameters out of range (head_count_kv=%d must be 1, key_length=%d "
                "= value_length=%d <= %d, rope dims=%d even <= key_length, q_lora_rank=%d, output groups=%d dividing "
                "head_count=%d, hyper-connections=%d in 1..%d, experts %d/%d <= %d, shared experts=%d)",
                hp->n_head_kv, hd, vlen, DS_ATTN_SINKS_MAX_HD, hp->n_rot, hp->q_lora, hp->o_groups, H, hp->hc,
                DS_HC_MAX, k, E, DS_MOE_MAX_EXPERT, n_shared);
        return -1;
    }
    hp->n_ff_shexp = hp->n_ff_exp * n_shared;
    hp->n_ff = hp->n_ff_exp > hp->n_ff_shexp ? hp->n_ff_exp : hp->n_ff_shexp;
    const ds_backend_i *bi = m->be->i;
    if (!bi->attn_sinks || !bi->hc_pre || !bi->hc_post || !bi->moe_route_ex || !bi->moe_combine || !bi->host_memory) {
        ds_errf(err, errlen, "model: deepseek4 needs the attn_sinks, hc_pre and hc_post families and the %s device has "
                "no kernels for them yet (use --device cpu)", bi->name);
        return -1;
    }
    if ((uint64_t)hp->n_layer * 20 > gguf_n_tensors(g)) {
        ds_errf(err, errlen, "model: block_count %d needs at least %lld tensors, the file has %llu", hp->n_layer,
                (long long)hp->n_layer * 20, (unsigned long long)gguf_n_tensors(g));
        return -1;
    }
    const gguf_tensor *te = gguf_find_tensor(g, "token_embd.weight");
    if (!te || te->n_dims != 2 || te->ne[1] < 1 || te->ne[1] > (1u << 24)) {
        ds_errf(err, errlen, "model: tensor 'token_embd.weight' must be 2-D [n_embd, n_vocab]");
        return -1;
    }
    hp->n_vocab = (int)te->ne[1];
    const int hc = hp->hc, mixn = (2 + hc) * hc, qd = H * hd, gd = qd / hp->o_groups, G = hp->o_groups;
    const int fs = hp->n_ff_shexp, fe = hp->n_ff_exp;
    if (load_weight(g, "token_embd.weight", d, hp->n_vocab, &m->tok_embd, err, errlen) ||
        load_weight(g, "output.weight", d, hp->n_vocab, &m->output, err, errlen) ||
        load_weight(g, "output_hc_fn.weight", hc * d, hc, &m->hc_head_fn, err, errlen))
        return -1;
    const size_t n_norm = (size_t)d + (size_t)hc + 1 +
        (size_t)hp->n_layer * (2 * (size_t)d + (size_t)hp->q_lora + (size_t)hd + (size_t)H + 2 * ((size_t)mixn + 3) + (size_t)E) +
        (size_t)n_ape * 2 * (size_t)hd + (size_t)hp->n_comp * (size_t)hd +
        (size_t)hp->n_csa * (8 * (size_t)hp->idx_dim + (size_t)hp->idx_dim);
    /* a compressed layer's KV row (layer_ds4.c): K, its compressed row and
     * (CSA) the indexer's state [kv | score] and compressed key in the K
     * region, the compressor state [kv | score] (c hd each) in the V region */
    hp->kv_row = hp->n_csa ? (2 * hd + 5 * hp->idx_dim > 4 * hd ? 2 * hd + 5 * hp->idx_dim : 4 * hd)
                 : hp->n_comp ? 2 * hd : 0;
    m->f32_arena = malloc(n_norm * sizeof(float));
    m->f32_n = n_norm;
    m->layers = calloc((size_t)hp->n_layer, sizeof(ds_layer));
    m->experts = calloc((size_t)hp->n_layer * 3 * (size_t)E, sizeof(ds_weight));
    m->views = calloc((size_t)hp->n_layer * (size_t)G, sizeof(ds_weight));
    if (!m->f32_arena || !m->layers || !m->experts || !m->views) { ds_errf(err, errlen, "model: out of memory"); return -1; }
    float *cur = m->f32_arena;
    if (load_norm(g, "output_norm.weight", d, &cur, &m->output_norm, err, errlen) ||
        load_norm(g, "output_hc_base.weight", hc, &cur, &m->hc_head_base, err, errlen) ||
        load_norm(g, "output_hc_scale.weight", 1, &cur, &m->hc_head_scale, err, errlen))
        return -1;
    for (int l = 0; l < hp->n_layer; l++) {
        ds_layer *L = &m->layers[l];
        char n[96];
#define NAME(s) (snprintf(n, sizeof n, "blk.%d." s, l), n)
        L->ds4 = 1;
        L->n_groups = G;
        L->wo_a = m->views + (size_t)l * G;
        L->n_expert = E;
        L->n_expert_used = k;
        L->moe_norm = hp->moe_norm;
        L->moe_func = DS_MOE_SQRT_SOFTPLUS;
        L->moe_scale = hp->moe_scale;
        L->has_shexp = 2;
        L->exp_gate = m->experts + (size_t)l * 3 * E;
        L->exp_up = L->exp_gate + E;
        L->exp_down = L->exp_up + E;
        if (load_norm(g, NAME("attn_norm.weight"), d, &cur, &L->attn_norm, err, errlen) ||
            load_norm(g, NAME("ffn_norm.weight"), d, &cur, &L->ffn_norm, err, errlen) ||
            load_norm(g, NAME("attn_q_a_norm.weight"), hp->q_lora, &cur, &L->q_a_norm, err, errlen) ||
            load_norm(g, NAME("attn_kv_a_norm.weight"), hd, &cur, &L->kv_norm, err, errlen) ||
            load_norm(g, NAME("attn_sinks.weight"), H, &cur, &L->sinks, err, errlen) ||
            load_norm(g, NAME("hc_attn_base.weight"), mixn, &cur, &L->hc_attn_base, err, errlen) ||
            load_norm(g, NAME("hc_attn_scale.weight"), 3, &cur, &L->hc_attn_scale, err, errlen) ||
            load_norm(g, NAME("hc_ffn_base.weight"), mixn, &cur, &L->hc_ffn_base, err, errlen) ||
            load_norm(g, NAME("hc_ffn_scale.weight"), 3, &cur, &L->hc_ffn_scale, err, errlen) ||
            load_norm(g, NAME("exp_probs_b.bias"), E, &cur, &L->exp_probs_b, err, errlen) ||
            load_weight(g, NAME("attn_q_a.weight"), d, hp->q_lora, &L->wq_a, err, errlen) ||
            load_weight(g, NAME("attn_q_b.weight"), hp->q_lora, qd, &L->wq_b, err, errlen) ||
            load_weight(g, NAME("attn_kv.weight"), d, hd, &L->wkv, err, errlen) ||
            load_experts(g, NAME("attn_output_a.weight"), gd, hp->o_lora, G, L->wo_a, err, errlen) ||
            load_weight(g, NAME("attn_output_b.weight"), G * hp->o_lora, d, &L->wo_b, err, errlen) ||
            load_weight(g, NAME("hc_attn_fn.weight"), hc * d, mixn, &L->hc_attn_fn, err, errlen) ||
            load_weight(g, NAME("hc_ffn_fn.weight"), hc * d, mixn, &L->hc_ffn_fn, err, errlen) ||
            load_weight(g, NAME("ffn_gate_inp.weight"), d, E, &L->gate_inp, err, errlen) ||
            load_experts(g, NAME("ffn_gate_exps.weight"), d, fe, E, L->exp_gate, err, errlen) ||
            load_experts(g, NAME("ffn_up_exps.weight"), d, fe, E, L->exp_up, err, errlen) ||
            load_experts(g, NAME("ffn_down_exps.weight"), fe, d, E, L->exp_down, err, errlen) ||
            load_weight(g, NAME("ffn_gate_shexp.weight"), d, fs, &L->sh_gate, err, errlen) ||
            load_weight(g, NAME("ffn_up_shexp.weight"), d, fs, &L->sh_up, err, errlen) ||
            load_weight(g, NAME("ffn_down_shexp.weight"), fs, d, &L->sh_down, err, errlen))
            return -1;
        if (l < n_hash && load_tid2eid(g, NAME("ffn_gate_tid2eid.weight"), k, hp->n_vocab, E, &L->tid2eid, err, errlen))
            return -1;
        int64_t r = 0;
        (void)gguf_arr_i64(cr, (uint64_t)l, &r);   /* read above */
        L->comp_ratio = (int)r;
        /* llama.cpp clamps only a limit above 1e-6 */
        L->swiglu_limit = ds4_layer_f32(ck, l) > 1e-6f ? ds4_layer_f32(ck, l) : 0.0f;
        L->swiglu_limit_sh = ds4_layer_f32(cks, l) > 1e-6f ? ds4_layer_f32(cks, l) : 0.0f;
        const int c = r == 4 ? 2 : 1, ihd = hp->idx_dim;
        if (r && (load_ape(g, NAME("attn_compressor_ape.weight"), c * hd, (int)r, &cur, &L->comp_ape, err, errlen) ||
                  load_weight(g, NAME("attn_compressor_kv.weight"), d, c * hd, &L->comp_kv, err, errlen) ||
                  load_weight(g, NAME("attn_compressor_gate.weight"), d, c * hd, &L->comp_gate, err, errlen) ||
                  load_norm(g, NAME("attn_compressor_norm.weight"), hd, &cur, &L->comp_norm, err, errlen)))
            return -1;
        if (r == 4 && (load_ape(g, NAME("indexer_compressor_ape.weight"), 2 * ihd, 4, &cur, &L->idx_ape, err, errlen) ||
                       load_weight(g, NAME("indexer.proj.weight"), d, hp->idx_heads, &L->idx_proj, err, errlen) ||
                       load_weight(g, NAME("indexer.attn_q_b.weight"), hp->q_lora, hp->idx_heads * ihd, &L->idx_q_b,
                                   err, errlen) ||
                       load_weight(g, NAME("indexer_compressor_kv.weight"), d, 2 * ihd, &L->idx_kv, err, errlen) ||
                       load_weight(g, NAME("indexer_compressor_gate.weight"), d, 2 * ihd, &L->idx_gate, err, errlen) ||
                       load_norm(g, NAME("indexer_compressor_norm.weight"), ihd, &cur, &L->idx_norm, err, errlen)))
            return -1;
#undef NAME
    }
    return 0;
}

ds_model *ds_model_load(const char *path, char *err, size_t errlen) {
    return ds_model_load_on(path, "cpu", err, errlen);
}

ds_model *ds_model_load_on(const char *path, const char *device, char *err, size_t errlen) {
    char e2[DS_ERRLEN];
    ds_backend *be = ds_backend_new(device, err, errlen);
    if (!be) return NULL;
    gguf_ctx *g = gguf_open(path, e2, sizeof e2);
    if (!g) { ds_backend_free(be); ds_errf(err, errlen, "%s", e2); return NULL; }
    ds_model *m = calloc(1, sizeof *m);
    if (!m) { gguf_close(g); ds_backend_free(be); ds_errf(err, errlen, "model: out of memory"); return NULL; }
    m->gguf = g;
    m->be = be;
    ds_hparams *hp = &m->hp;

    gguf_str archs;
    if (gguf_get_str(g, "general.architecture", &archs) != 0) {
        ds_errf(err, errlen, "model: missing metadata key 'general.architecture'");
        goto fail;
    }
    const char *arch;
    if (gguf_str_eq(archs, "qwen3")) { hp->arch = DS_ARCH_QWEN3; arch = "qwen3"; }
    else if (gguf_str_eq(archs, "llama")) { hp->arch = DS_ARCH_LLAMA; arch = "llama"; }
    else if (gguf_str_eq(archs, "qwen3moe")) { hp->arch = DS_ARCH_QWEN3MOE; arch = "qwen3moe"; }
    else if (gguf_str_eq(archs, "qwen35")) { hp->arch = DS_ARCH_QWEN35; arch = "qwen35"; }
    else if (gguf_str_eq(archs, "deepseek4")) { hp->arch = DS_ARCH_DEEPSEEK4; arch = "deepseek4"; }
    else {
        ds_errf(err, errlen, "model: unknown architecture '%.*s' (supported: qwen3, qwen3moe, qwen35, deepseek4, llama)",
                (int)(archs.len > 64 ? 64 : archs.len), archs.ptr);
        goto fail;
    }
    if (hp->arch == DS_ARCH_DEEPSEEK4) {
        if (gguf_find_tensor(g, "rope_freqs.weight")) {   /* not applied there: refused, not ignored */
            ds_errf(err, errlen, "model: deepseek4 file with a rope_freqs.weight tensor: frequency factors are a llama "
                    "tensor (llama.cpp does not apply them to deepseek4 either)");
            goto fail;
        }
        if (load_ds4(g, m, arch, err, errlen)) goto fail;
        goto loaded;
    }
    const int moe = hp->arch == DS_ARCH_QWEN3MOE;
    char key[128];
    snprintf(key, sizeof key, "%s.feed_forward_length", arch);
    if (get_u32_req(g, arch, "block_count", &hp->n_layer, err, errlen) ||
        get_u32_req(g, arch, "embedding_length", &hp->n_embd, err, errlen) ||
        ((!moe || gguf_find_kv(g, key)) && get_u32_req(g, arch, "feed_forward_length", &hp->n_ff, err, errlen)) ||
        get_u32_req(g, arch, "attention.head_count", &hp->n_head, err, errlen))
        goto fail;
    if (moe) {
        /* llama.cpp's keys; without expert_feed_forward_length an expert is
         * feed_forward_length / expert_used_count wide (its rule) */
        if (get_u32_req(g, arch, "expert_count", &hp->n_expert, err, errlen) ||
            get_u32_req(g, arch, "expert_used_count", &hp->n_expert_used, err, errlen))
            goto fail;
        if (hp->n_expert < 1 || hp->n_expert > DS_MOE_MAX_EXPERT || hp->n_expert_used < 1 ||
            hp->n_expert_used > hp->n_expert) {
            ds_errf(err, errlen, "model: expert_count %d / expert_used_count %d out of range (1 <= used <= count <= %d)",
                    hp->n_expert, hp->n_expert_used, DS_MOE_MAX_EXPERT);
            goto fail;
        }
        snprintf(key, sizeof key, "%s.expert_feed_forward_length", arch);
        if (gguf_find_kv(g, key)) {
            if (get_u32_req(g, arch, "expert_feed_forward_length", &hp->n_ff_exp, err, errlen)) goto fail;
        } else {
            hp->n_ff_exp = hp->n_ff / hp->n_expert_used;
        }
        if (hp->n_ff_exp < 1) {
            ds_errf(err, errlen, "model: qwen3moe needs expert_feed_forward_length (or feed_forward_length) > 0");
            goto fail;
        }
        /* a shared expert (qwen35moe's FFN): its tensors in block 0 say so;
         * its width is expert_shared_feed_forward_length, else n_ff
         * (llama.cpp's rule) */
        if (gguf_find_tensor(g, "blk.0.ffn_up_shexp.weight")) {
            hp->n_ff_shexp = hp->n_ff;
            snprintf(key, sizeof key, "%s.expert_shared_feed_forward_length", arch);
            if (gguf_find_kv(g, key) && get_u32_req(g, arch, "expert_shared_feed_forward_length", &hp->n_ff_shexp, err, errlen))
                goto fail;
            if (hp->n_ff_shexp < 1) {
                ds_errf(err, errlen, "model: the shared expert needs a width > 0 (expert_shared_feed_forward_length)");
                goto fail;
            }
        }
        /* n_ff is the widest FFN any buffer is sized for */
        if (hp->n_ff < hp->n_ff_exp) hp->n_ff = hp->n_ff_exp;
        if (hp->n_ff < hp->n_ff_shexp) hp->n_ff = hp->n_ff_shexp;
        if (!m->be->i->moe_route || !m->be->i->moe_combine) {
            ds_errf(err, errlen, "model: %s is a mixture-of-experts model and the %s device has no MoE kernels "
                    "(use --device cpu)", arch, m->be->i->name);
            goto fail;
        }
    }
    hp->n_head_kv = hp->n_head;
    snprintf(key, sizeof key, "%s.attention.head_count_kv", arch);
    if (gguf_find_kv(g, key) && get_u32_req(g, arch, "attention.head_count_kv", &hp->n_head_kv, err, errlen)) goto fail;
    hp->head_dim = hp->n_head ? hp->n_embd / hp->n_head : 0;
    snprintf(key, sizeof key, "%s.attention.key_length", arch);
    if (gguf_find_kv(g, key) && get_u32_req(g, arch, "attention.key_length", &hp->head_dim, err, errlen)) goto fail;
    int vlen = hp->head_dim;
    snprintf(key, sizeof key, "%s.attention.value_length", arch);
    if (gguf_find_kv(g, key) && get_u32_req(g, arch, "attention.value_length", &vlen, err, errlen)) goto fail;
    hp->n_ctx_train = 0;
    snprintf(key, sizeof key, "%s.context_length", arch);
    if (gguf_find_kv(g, key) && get_u32_req(g, arch, "context_length", &hp->n_ctx_train, err, errlen)) goto fail;
    hp->rope_base = 10000.0f;
    hp->norm_eps = 1e-6f;
    if (get_f32_opt(g, arch, "rope.freq_base", &hp->rope_base, err, errlen) ||
        get_f32_opt(g, arch, "attention.layer_norm_rms_epsilon", &hp->norm_eps, err, errlen))
        goto fail;

    if (hp->n_layer < 1 || hp->n_embd < 1 || hp->n_ff < 1 || hp->n_head < 1 || hp->n_head_kv < 1 || hp->head_dim < 2) {
        ds_errf(err, errlen, "model: hyper-parameters must be positive (block_count=%d embedding_length=%d feed_forward_length=%d head_count=%d head_count_kv=%d key_length=%d)",
                hp->n_layer, hp->n_embd, hp->n_ff, hp->n_head, hp->n_head_kv, hp->head_dim);
        goto fail;
    }
    if (hp->n_head % hp->n_head_kv) {
        ds_errf(err, errlen, "model: head_count %d is not a multiple of head_count_kv %d", hp->n_head, hp->n_head_kv);
        goto fail;
    }
    if (vlen != hp->head_dim || hp->head_dim % 2) {
        ds_errf(err, errlen, "model: key_length %d and value_length %d must be equal and even", hp->head_dim, vlen);
        goto fail;
    }
    if (!(hp->norm_eps > 0.0f && hp->norm_eps < 1.0f) || !(hp->rope_base > 1.0f && hp->rope_base < 1e12f)) {
        ds_errf(err, errlen, "model: rms epsilon %g or rope freq_base %g out of range", hp->norm_eps, hp->rope_base);
        goto fail;
    }

    hp->n_rot = hp->head_dim;
    if (hp->arch == DS_ARCH_QWEN35 && load_qwen35_hparams(g, m, arch, err, errlen)) goto fail;
    if (load_rope_scaling(g, m, arch, err, errlen)) goto fail;

    /* counts against the file before anything is sized by them: each layer
     * needs at least 9 tensors, and the head products must fit an int */
    if ((uint64_t)hp->n_layer * 9 > gguf_n_tensors(g)) {
        ds_errf(err, errlen, "model: block_count %d needs at least %lld tensors, the file has %llu", hp->n_layer,
                (long long)hp->n_layer * 9, (unsigned long long)gguf_n_tensors(g));
        goto fail;
    }
    if ((int64_t)hp->n_head * hp->head_dim > (1 << 30)) {
        ds_errf(err, errlen, "model: head_count %d x key_length %d is out of range", hp->n_head, hp->head_dim);
        goto fail;
    }

    /* vocabulary width from the embedding table */
    const gguf_tensor *te = gguf_find_tensor(g, "token_embd.weight");
    if (!te) { ds_errf(err, errlen, "model: missing tensor 'token_embd.weight'"); goto fail; }
    if (te->n_dims != 2 || te->ne[1] < 1 || te->ne[1] > (1u << 24)) {
        ds_errf(err, errlen, "model: tensor 'token_embd.weight' must be 2-D [n_embd, n_vocab]");
        goto fail;
    }
    hp->n_vocab = (int)te->ne[1];

    int d = hp->n_embd, hd = hp->head_dim, qd = hp->n_head * hd, kvd = hp->n_head_kv * hd;
    if (load_weight(g, "token_embd.weight", d, hp->n_vocab, &m->tok_embd, err, errlen)) goto fail;
    if (gguf_find_tensor(g, "output.weight")) {
        if (load_weight(g, "output.weight", d, hp->n_vocab, &m->output, err, errlen)) goto fail;
    } else {
        m->output = m->tok_embd;     /* tied: the same memory, no copy */
        m->output_tied = 1;
    }

    size_t n_norm = (size_t)d + (size_t)hp->n_layer * (2 * (size_t)d + 2 * (size_t)hd);
    if (hp->n_rec > 0) {   /* a recurrent layer's conv kernel, dt bias, A and norm */
        const ds_layer_shape sh = ds_hp_layer_shape(hp);
        n_norm += (size_t)hp->n_rec * ((size_t)sh.gdn.conv_dim * (size_t)sh.gdn.d_conv + 2 * (size_t)sh.gdn.n_v_head +
                                      (size_t)sh.gdn.head_dim);
    }
    m->f32_arena = malloc(n_norm * sizeof(float));
    m->f32_n = n_norm;
    if (!m->layers) m->layers = calloc((size_t)hp->n_layer, sizeof(ds_layer));   /* qwen35: already made */
    if (moe) m->experts = calloc((size_t)hp->n_layer * 3 * (size_t)hp->n_expert, sizeof(ds_weight));
    if (!m->f32_arena || !m->layers || (moe && !m->experts)) { ds_errf(err, errlen, "model: out of memory"); goto fail; }
    float *cur = m->f32_arena;
    if (load_norm(g, "output_norm.weight", d, &cur, &m->output_norm, err, errlen)) goto fail;

    for (int l = 0, li = 0; l < hp->n_layer; l++) {
        ds_layer *L = &m->layers[l];
        if (hp->arch == DS_ARCH_QWEN35) {
            if (load_qwen35_layer(g, m, l, &li, &cur, err, errlen)) goto fail;
            continue;
        }
        char n[96];
#define NAME(s) (snprintf(n, sizeof n, "blk.%d." s ".weight", l), n)
        if (load_norm(g, NAME("attn_norm"), d, &cur, &L->attn_norm, err, errlen) ||
            load_norm(g, NAME("ffn_norm"), d, &cur, &L->ffn_norm, err, errlen) ||
            load_weight(g, NAME("attn_q"), d, qd, &L->wq, err, errlen) ||
            load_weight(g, NAME("attn_k"), d, kvd, &L->wk, err, errlen) ||
            load_weight(g, NAME("attn_v"), d, kvd, &L->wv, err, errlen) ||
            load_weight(g, NAME("attn_output"), qd, d, &L->wo, err, errlen))
            goto fail;
        if (moe) {
            const int E = hp->n_expert, f = hp->n_ff_exp;
            L->n_expert = E;
            L->n_expert_used = hp->n_expert_used;
            L->moe_norm = 1;                 /* qwen3moe renormalises the k weights (llama.cpp: norm_w) */
            L->exp_gate = m->experts + (size_t)l * 3 * E;
            L->exp_up = L->exp_gate + E;
            L->exp_down = L->exp_up + E;
            if (load_weight(g, NAME("ffn_gate_inp"), d, E, &L->gate_inp, err, errlen) ||
                load_experts(g, NAME("ffn_gate_exps"), d, f, E, L->exp_gate, err, errlen) ||
                load_experts(g, NAME("ffn_up_exps"), d, f, E, L->exp_up, err, errlen) ||
                load_experts(g, NAME("ffn_down_exps"), f, d, E, L->exp_down, err, errlen))
                goto fail;
            if (hp->n_ff_shexp > 0) {
                const int fs = hp->n_ff_shexp;
                L->has_shexp = 1;
                /* its gate is llama.cpp's 1-D [n_embd]: a weight of one output */
                const gguf_tensor *tg = want_tensor(g, NAME("ffn_gate_inp_shexp"), d, 0, err, errlen);
                if (!tg) goto fail;
                if (tg->type != DS_TYPE_F32 && tg->type != DS_TYPE_F16 && tg->type != DS_TYPE_BF16) {
                    ds_errf(err, errlen, "model: tensor '%s' is %s (want F32, F16 or BF16)", n, ds_type_name(tg->type));
                    goto fail;
                }
                L->sh_gate_inp = (ds_weight){tg->type, d, 1, tg->data, NULL};
                if (load_weight(g, NAME("ffn_gate_shexp"), d, fs, &L->sh_gate, err, errlen) ||
                    load_weight(g, NAME("ffn_up_shexp"), d, fs, &L->sh_up, err, errlen) ||
                    load_weight(g, NAME("ffn_down_shexp"), fs, d, &L->sh_down, err, errlen))
                    goto fail;
            }
        } else if (load_weight(g, NAME("ffn_gate"), d, hp->n_ff, &L->w_gate, err, errlen) ||
                   load_weight(g, NAME("ffn_up"), d, hp->n_ff, &L->w_up, err, errlen) ||
                   load_weight(g, NAME("ffn_down"), hp->n_ff, d, &L->w_down, err, errlen)) {
            goto fail;
        }
        if (ds_arch_qk_norm(hp->arch)) {
            if (load_norm(g, NAME("attn_q_norm"), hd, &cur, &L->q_norm, err, errlen) ||
                load_norm(g, NAME("attn_k_norm"), hd, &cur, &L->k_norm, err, errlen))
                goto fail;
        }
#undef NAME
    }
loaded:
    m->weight_type = m->layers[0].ds4 ? m->layers[0].wq_a.type : m->layers[0].recur ? m->layers[0].ssm_qkv.type : m->layers[0].wq.type;
    if (prepare_weights(m, err, errlen)) goto fail;
    for (uint64_t i = 0; i < gguf_n_tensors(g); i++) m->n_params += gguf_tensor_nelements(gguf_tensor_at(g, i));

    if (gguf_find_kv(g, "tokenizer.ggml.model")) {
        m->tok = ds_tokenizer_load(g, e2, sizeof e2);
        if (!m->tok) { ds_errf(err, errlen, "%s", e2); goto fail; }
        if (ds_tokenizer_n_vocab(m->tok) > hp->n_vocab) {
            ds_errf(err, errlen, "model: tokenizer has %d tokens but token_embd has only %d rows",
                    ds_tokenizer_n_vocab(m->tok), hp->n_vocab);
            goto fail;
        }
    }
    return m;
fail:
    ds_model_free(m);
    return NULL;
}

void ds_model_free(ds_model *m) {
    if (!m) return;
    ds_backend *be = m->be;
    if (be && m->weights_prepared) {
        for (int l = 0; l < m->hp.n_layer && m->layers; l++) {
            ds_weight *w;
            for (int i = 0; (w = ds_layer_weight(&m->layers[l], i)); i++) be->i->release_weight(be, w);
        }
        be->i->release_weight(be, &m->output);
        if (!m->output_tied) be->i->release_weight(be, &m->tok_embd);
        if (m->hc_head_fn.data) be->i->release_weight(be, &m->hc_head_fn);
    }
    if (be) ds_backend_const_free(be, m->f32_dev, m->f32_arena);
    ds_tokenizer_free(m->tok);
    free(m->layers);
    free(m->experts);
    free(m->views);
    free(m->f32_arena);
    gguf_close(m->gguf);
    ds_backend_free(be);
    free(m);
}

int ds_hp_kv_layers(const ds_hparams *hp) { return hp->n_layer - hp->n_rec; }

size_t ds_kv_row_bytes(const ds_model *m) {
    return 2u * (size_t)ds_hp_kv_layers(&m->hp) * (size_t)ds_hp_kv_row(&m->hp) * sizeof(float);
}


/* ========================================================================
 * Context: execution context, KV cache, device activations, taps
 * ===================================================================== */


struct ds_ctx {
    const ds_model *m;
    ds_backend *be;              /* the model's                                */
    ds_exec    *ex;              /* pool + scratch / stream + scratch          */
    int         n_ctx;           /* KV cache capacity in positions            */
    int         n_past;          /* valid KV rows: positions [0, n_past)      */
    int         m_max;           /* rows per internal batch chunk             */
    ds_kernel_set ks;            /* batched-path kernel choice per family     */
    ds_kvpool  *pool;            /* the KV cache: pages (kvpool.h)             */
    ds_seq      seq;             /* the one sequence: its page table          */
    int32_t    *tables;          /* device copy of seq.table                  */
    ds_rows     rows;            /* what the KV kernels read (backend.h)      */
    int         tap_layers[DS_MAX_TAPS];
    int         n_taps;
    ds_acts     a;               /* device activations, m_max rows            */
    int        *pos;             /* device positions [m_max], then the ids      */
    int32_t    *ids;             /* device token ids [m_max] (= pos + m_max)    */
    float      *logits;          /* device [m_max][V] (device backends)       */
    float      *taps;            /* device [m_max][n_taps*d] (device backends)*/
    int        *pos_host;        /* host staging: positions [m_max], ids [m_max] */
    float      *sel_logits;      /* device [m_max][V]: logits rows selected on the device */
    float      *sel_scratch;     /* device [2V]: the sample op's scratch      */
    int32_t    *sel_ids;         /* device [m_max]: selected ids (= ids + m_max) */
    int32_t    *sel_host;        /* host [2 m_max]: a queued draft's ids and the selections */
    /* a deferred selection (ds_select_opts.defer): where its ids go */
    int         pend;            /* 0 none, 1 ids only, 2 draft ids + ids     */
    int32_t    *pend_ids, *pend_draft;
    int         pend_rows, pend_n;
    ds_probe    probe;           /* .fn == NULL: none                         */
    float      *stage;           /* host staging for probes: widest row       */
    ds_rstate   rs;              /* hybrid models: the recurrent states (one slot) */
    ds_tp      *tp;              /* --tp N > 1: the ranks that run the forward (tp.h);
                                    their pools hold the KV rows, on this
                                    sequence's page ids, and c->pool stays unused */
    unsigned    tp_gen;          /* ranks made so far (graph_key: a launch sequence
                                    recorded on other ranks' buffers never replays) */
};

/* Rows of a run a context can roll back into (rstate.h): a verify block of
 * up to DS_CTX_RS_ROWS - 1 drafts. */
#define DS_CTX_RS_ROWS 17

static void ctx_release(ds_ctx *c) {
    ds_backend *be = c->be;
    float *bufs[] = {c->a.x, c->a.xn, c->a.q, c->a.k, c->a.v, c->a.att, c->a.o, c->a.gate, c->a.up,
                     c->a.h, c->a.moe, c->a.rec, c->logits, c->taps, c->sel_logits, c->sel_scratch};
    if (c->rs.mem) ds_rstate_free(&c->rs);
    ds_tp_free(c->tp);
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        if (bufs[i]) be->i->release(be, bufs[i]);
    if (c->pos) be->i->release(be, c->pos);      /* c->ids lies in the same buffer */
    if (c->tables) be->i->release(be, c->tables);
    if (c->pool) ds_seq_release(&c->seq, c->pool);
    ds_kvpool_free(c->pool);
    if (c->ex) be->i->exec_free(c->ex);
    free(c->pos_host);
    free(c->sel_host);
    free(c->stage);
    free(c->a.moe_host);
}

/* Pages for positions [p0, p1) of the sequence, and the device copy of its
 * table brought up to date (queued before the forward that reads it). */
static int ctx_prepare(ds_ctx *c, int p0, int p1, char *err, size_t errlen) {
    if (ds_seq_prepare(&c->seq, c->pool, c->ex, p0, p1, err, errlen)) return -1;
    ds_seq *s = &c->seq;
    if (s->dirty_hi > s->dirty_lo) {
        c->be->i->upload(c->ex, c->tables + s->dirty_lo, s->table + s->dirty_lo,
                         (size_t)(s->dirty_hi - s->dirty_lo) * sizeof(int32_t));
        s->dirty_lo = s->dirty_hi = 0;
    }
    return 0;
}

ds_ctx *ds_ctx_new(const ds_model *m, int n_ctx, int n_threads, char *err, size_t errlen) {
    const ds_hparams *hp = &m->hp;
    if (n_ctx < 1 || (hp->n_ctx_train > 0 && n_ctx > hp->n_ctx_train) || n_ctx > (1 << 24)) {
        ds_errf(err, errlen, "context: -c %d is out of range (1..%d)", n_ctx,
                hp->n_ctx_train > 0 ? hp->n_ctx_train : (1 << 24));
        return NULL;
    }
    if (n_threads < 1 || n_threads > 256) {
        ds_errf(err, errlen, "context: -t %d is out of range (1..256)", n_threads);
        return NULL;
    }
    ds_ctx *c = calloc(1, sizeof *c);
    if (!c) { ds_errf(err, errlen, "context: out of memory"); return NULL; }
    c->m = m;
    c->be = m->be;
    c->n_ctx = n_ctx;
    c->m_max = ds_backend_chunk_rows(c->be);   /* 64 on the CPU, 512 on CUDA */
    ds_kernel_set_all(&c->ks, DS_CANONICAL);
    char e2[DS_ERRLEN];
    c->ex = c->be->i->exec_new(c->be, n_threads, e2, sizeof e2);
    if (!c->ex) { ds_errf(err, errlen, "context: %s", e2); free(c); return NULL; }
    const size_t kvd = (size_t)hp->n_head_kv * hp->head_dim, qd = (size_t)hp->n_head * hp->head_dim;
    const size_t M = (size_t)c->m_max, d = (size_t)hp->n_embd, ff = (size_t)hp->n_ff, V = (size_t)hp->n_vocab;
    /* the KV cache: pages for n_ctx positions, committed as they are used */
    const ds_kvpool_shape ps = {.n_groups = 1, .n_layer = {ds_hp_kv_layers(hp)}, .row = {ds_hp_kv_row(hp)},
                                .n_pages = (n_ctx + DS_KV_PAGE - 1) / DS_KV_PAGE};
    c->pool = ds_kvpool_new(c->be, &ps, e2, sizeof e2);
    if (!c->pool || ds_seq_init(&c->seq, n_ctx, e2, sizeof e2)) {
        ds_errf(err, errlen, "context: %s", e2);
        ctx_release(c);
        free(c);
        return NULL;
    }
    ds_backend *be = c->be;
    c->tables = be->i->alloc(be, (size_t)c->seq.max_pages * sizeof(int32_t));
#define DEV(n) be->i->alloc(be, (n) * sizeof(float))
    c->a.x = DEV(M * (size_t)ds_hp_stream(hp)); c->a.xn = DEV(M * d); c->a.o = DEV(M * d);
    c->a.q = DEV(M * qd); c->a.att = DEV(M * qd); c->a.k = DEV(M * kvd); c->a.v = DEV(M * kvd);
    c->a.gate = DEV(M * ff); c->a.up = DEV(M * ff); c->a.h = DEV(M * ff);
    const size_t moe_n = ds_hp_moe_scratch(hp, c->m_max);
    if (moe_n) c->a.moe = DEV(moe_n);
    /* a device's MoE layers group on the host: their staging (zeroed: the
     * grouping never reads an id that is not an expert) */
    const int moe_h = moe_n && !be->i->host_memory;
    if (moe_h) c->a.moe_host = calloc(ds_moe_host_words(c->m_max, hp->n_expert_used), sizeof(int32_t));
    const size_t rec_n = ds_hp_hybrid_scratch(hp, c->m_max);   /* hybrid layers' scratch (layer.c) */
    if (rec_n) c->a.rec = DEV(rec_n);
#undef DEV
    if (ds_hp_rstate_init(hp, &c->rs, be, 1, DS_CTX_RS_ROWS, c->m_max, e2, sizeof e2)) {
        ds_errf(err, errlen, "context: %s", e2);
        ctx_release(c);
        free(c);
        return NULL;
    }
    if (c->rs.mem) c->a.rs = &c->rs;
    /* positions, ids, selected ids in one buffer: a call uploads the first
     * two at once, and a verify of a queued draft downloads the draft's ids
     * (ids[1..]) and the selections as one range */
    c->pos = be->i->alloc(be, 3 * M * sizeof(int32_t));
    c->ids = c->pos ? (int32_t *)c->pos + M : NULL;
    c->sel_ids = c->pos ? (int32_t *)c->pos + 2 * M : NULL;
    c->a.pos = c->pos;
    c->a.ids_off = (int)M;
    c->pos_host = malloc(2 * M * sizeof(int32_t));
    size_t widest = V > ff ? V : ff;
    if (qd > widest) widest = qd;
    if (d > widest) widest = d;
    if ((size_t)ds_hp_stream(hp) > widest) widest = (size_t)ds_hp_stream(hp);
    if ((size_t)hp->q_lora > widest) widest = (size_t)hp->q_lora;
    if ((size_t)hp->n_expert > widest) widest = (size_t)hp->n_expert;
    c->stage = malloc(widest * sizeof(float));
    /* selection on the device (ds_forward_select): device backends select
     * from c->logits; host ones need a logits buffer of their own */
    if (be->i->host_memory) c->sel_logits = be->i->alloc(be, M * V * sizeof(float));
    c->sel_scratch = be->i->alloc(be, 2 * V * sizeof(float));
    c->sel_host = malloc(2 * M * sizeof(int32_t));
    c->rows = (ds_rows){.pos = c->pos, .tables = c->tables, .max_pages = c->seq.max_pages,
                        .page = DS_KV_PAGE, .page_stride = ds_kvpool_page_stride(c->pool)};
    c->a.rows = &c->rows;
    int ok = c->tables && c->a.x && c->a.xn && c->a.o && c->a.q && c->a.att && c->a.k && c->a.v && c->a.gate &&
             c->a.up && c->a.h && (c->a.moe || !moe_n) && (c->a.moe_host || !moe_h) && (c->a.rec || !rec_n) && c->pos && c->ids && c->pos_host && c->sel_host && c->stage &&
             (c->sel_logits || !be->i->host_memory) && c->sel_scratch && c->sel_ids;
    if (ok && !be->i->host_memory) {   /* logits and taps stay on the device until asked */
        c->logits = be->i->alloc(be, M * V * sizeof(float));
        c->taps = be->i->alloc(be, M * DS_MAX_TAPS * d * sizeof(float));
        ok = c->logits && c->taps;
    }
    /* One sequence owns the whole pool: its table is filled now and uploaded
     * once (memory is still committed only where rows are written), so no
     * forward ever uploads a table entry. */
    if (ok && ctx_prepare(c, 0, n_ctx, e2, sizeof e2)) ok = 0;
    if (!ok) {
        ds_errf(err, errlen, "context: out of %s memory for n_ctx=%d", be->i->name, n_ctx);
        ctx_release(c);
        free(c);
        return NULL;
    }
    /* the families' scratch, once: no allocation in any later forward
     * (weights' n_in: d for q/k/v/gate/up and the head, qd for o, ff for down) */
    const int64_t k_max = ds_hp_k_max(hp);
    if (be->i->reserve && be->i->reserve(c->ex, c->m_max, k_max, hp->head_dim, n_ctx, e2, sizeof e2)) {
        ds_errf(err, errlen, "context: %s", e2);
        ctx_release(c);
        free(c);
        return NULL;
    }
    return c;
}

void ds_ctx_free(ds_ctx *c) {
    if (!c) return;
    ctx_release(c);
    free(c);
}

int ds_set_taps(ds_ctx *c, const int *layers, int n, char *err, size_t errlen) {
    if (n < 0 || n > DS_MAX_TAPS) {
        ds_errf(err, errlen, "taps: %d layers requested, at most %d", n, DS_MAX_TAPS);
        return -1;
    }
    for (int i = 0; i < n; i++) {
        if (layers[i] < 0 || layers[i] >= c->m->hp.n_layer) {
            ds_errf(err, errlen, "taps: layer %d is out of range [0, %d)", layers[i], c->m->hp.n_layer);
            return -1;
        }
        if (i > 0 && layers[i] <= layers[i - 1]) {
            ds_errf(err, errlen, "taps: layer ids must be strictly increasing (%d after %d)", layers[i], layers[i - 1]);
            return -1;
        }
    }
    for (int i = 0; i < n; i++) c->tap_layers[i] = layers[i];
    c->n_taps = n;
    return 0;
}

int ds_ctx_set_tp(ds_ctx *c, int n, char *err, size_t errlen) {
    if (c->n_past > 0) {
        ds_errf(err, errlen, "--tp: the context already holds %d positions (set it before the first forward)", c->n_past);
        return -1;
    }
    if (ds_tp_check(c->m, n, err, errlen)) return -1;
    /* DSPARK_TP_COMM=cpu|dev picks the communicator (unset: cpu on host
     * memory, dev on a device); dev on the CPU runs the GPU's path there */
    const char *comm = getenv("DSPARK_TP_COMM");
    if (comm && *comm && strcmp(comm, "cpu") && strcmp(comm, "dev")) {
        ds_errf(err, errlen, "DSPARK_TP_COMM=%s is neither cpu nor dev", comm);
        return -1;
    }
    ds_tp *t = NULL;
    if (n > 1 && !(t = ds_tp_new(c->m, c->ex, n, comm, ds_kvpool_n_pages(c->pool), c->m_max, err, errlen))) return -1;
    ds_tp_free(c->tp);
    c->tp = t;
    if (t) c->tp_gen++;
    return 0;
}

void ds_ctx_tp_describe(const ds_ctx *c, char *buf, size_t n) {
    if (c->tp) ds_tp_describe(c->tp, buf, n);
    else snprintf(buf, n, "ranks=%s:0x1 comm=none", c->be->i->name);
}

int ds_ctx_tp(const ds_ctx *c) { return c->tp ? ds_tp_ranks(c->tp) : 1; }

void ds_ctx_tp_stats(const ds_ctx *c, long *gathers, long *reduces, double *bytes) {
    const ds_tp_stats s = c->tp ? ds_tp_get_stats(c->tp) : (ds_tp_stats){0, 0, 0.0};
    *gathers = s.gathers;
    *reduces = s.reduces;
    *bytes = s.bytes;
}

int ds_kv_truncate(ds_ctx *c, int n_pos) {
    if (n_pos < 0 || n_pos > c->n_past) return -1;
    /* a hybrid model rolls its recurrent state back too: to a state it kept */
    char e[DS_ERRLEN];
    if (c->rs.mem && ds_model_rs_rewind(c->m, c->ex, &c->a, 0, n_pos, e, sizeof e)) return -1;
    c->n_past = c->seq.n_past = n_pos;
    return 0;
}


/* ========================================================================
 * The forward pass
 * ===================================================================== */

/* deepseek4: the embedding copied into every stream, the layers, the
 * output head's mix and norm into a->xn. A tap is the mean of the streams
 * leaving the layer ((x_0 + x_1 + ...) * (1 / hc), llama.cpp's layer
 * features), made in a->xn, which the next layer recomputes. */
static void ds4_forward(const ds_model *m, ds_exec *ex, ds_acts *a, ds_kvpool *pool, const uint8_t var[DS_FAM_COUNT],
                        int M, int pos0, const int *tap_layers, int n_taps, float *taps, size_t taps_stride,
                        const ds_probe *pr) {
    const ds_hparams *hp = &m->hp;
    const int d = hp->n_embd, hc = hp->hc;
    const size_t rb = (size_t)d * sizeof(float);
    const ds_layer_shape shape = ds_hp_layer_shape(hp);
    ex->be->i->embed(ex, &m->tok_embd, M, a->pos + a->ids_off, a->xn);
    for (int h = 0; h < hc; h++) ds_backend_copy2d(ex, a->x + (size_t)h * d, (size_t)hc * rb, a->xn, rb, rb, (size_t)M);
    int tap_i = 0;
    for (int l = 0; l < hp->n_layer; l++) {
        ds_layer_ds4_forward(ex, &m->layers[l], &shape, var, M, pos0, ds_kvpool_k(pool, 0, l), ds_kvpool_v(pool, 0, l), a,
                             pr, l);
        if (tap_i < n_taps && tap_layers[tap_i] == l) {
            const float inv = 1.0f / (float)hc;
            for (int r = 0; r < M; r++) {
                const float *x = a->x + (size_t)r * hc * d;
                float *t = a->xn + (size_t)r * d;
                for (int i = 0; i < d; i++) {
                    float acc = x[i];
                    for (int h = 1; h < hc; h++) acc = acc + x[(size_t)h * d + i];
                    t[i] = acc * inv;
                }
            }
            if (taps)
                ds_backend_copy2d(ex, taps + (size_t)tap_i * d, taps_stride * sizeof(float), a->xn, rb, rb, (size_t)M);
            if (pr && (!pr->wants || pr->wants(pr->user, l, DSD_CP_TAP)))
                ds_probe_rows(ex, pr, M, pos0, l, DSD_CP_TAP, DSD_SUB_ALL, 1u << DS_FAM_HC_POST, a->xn, d, d);
            tap_i++;
        }
    }
    ds_ds4_head(ex, &m->hc_head_fn, m->hc_head_base, m->hc_head_scale, m->output_norm, &shape, var, M, a);
    if (pr && (!pr->wants || pr->wants(pr->user, DSD_LAYER_POST, DSD_CP_FINAL_NORM)))
        ds_probe_rows(ex, pr, M, pos0, DSD_LAYER_POST, DSD_CP_FINAL_NORM, DSD_SUB_ALL,
                      (1u << DS_FAM_HC_PRE) | (1u << DS_FAM_RMSNORM), a->xn, d, d);
}

void ds_model_forward(const ds_model *m, ds_exec *ex, ds_acts *a, ds_kvpool *pool, const uint8_t var[DS_FAM_COUNT],
                      int M, int pos0, const int *tap_layers, int n_taps, float *taps, size_t taps_stride,
                      const ds_probe *pr) {
    const ds_hparams *hp = &m->hp;
    const ds_backend_i *b = ex->be->i;
    const int d = hp->n_embd;
    const ds_layer_shape shape = ds_hp_layer_shape(hp);
    const int32_t *ids = a->pos + a->ids_off;

    if (hp->arch == DS_ARCH_DEEPSEEK4) {
        ds4_forward(m, ex, a, pool, var, M, pos0, tap_layers, n_taps, taps, taps_stride, pr);
        return;
    }
    b->embed(ex, &m->tok_embd, M, ids, a->x);
    /* the first sub-block's norm has no residual epilogue in front of it */
    b->rmsnorm(ex, (ds_variant)var[DS_FAM_RMSNORM], M, d, a->x, m->layers[0].attn_norm, hp->norm_eps, a->xn);

    int tap_i = 0;
    for (int l = 0, kv = 0; l < hp->n_layer; l++) {
        const float *next_norm = l + 1 < hp->n_layer ? m->layers[l + 1].attn_norm : m->output_norm;
        /* the pool holds K/V for the attention layers only (a hybrid
         * model's recurrent layers keep their state in a->rs) */
        const int recur = m->layers[l].recur;
        ds_layer_forward(ex, &m->layers[l], &shape, next_norm, var, M, pos0, 0, recur ? NULL : ds_kvpool_k(pool, 0, kv),
                         recur ? NULL : ds_kvpool_v(pool, 0, kv), a, pr, l);
        kv += !recur;
        /* taps: the raw residual stream leaving layer l */
        if (tap_i < n_taps && tap_layers[tap_i] == l) {
            if (taps)   /* row r's tap tap_i: one strided copy for the M rows */
                ds_backend_copy2d(ex, taps + (size_t)tap_i * d, taps_stride * sizeof(float), a->x,
                                  (size_t)d * sizeof(float), (size_t)d * sizeof(float), (size_t)M);
            if (pr && (!pr->wants || pr->wants(pr->user, l, DSD_CP_TAP)))
                ds_probe_rows(ex, pr, M, pos0, l, DSD_CP_TAP, DSD_SUB_ALL, 1u << DS_FAM_RESIDUAL, a->x, d, d);
            tap_i++;
        }
    }
    if (pr && (!pr->wants || pr->wants(pr->user, DSD_LAYER_POST, DSD_CP_FINAL_NORM)))
        ds_probe_rows(ex, pr, M, pos0, DSD_LAYER_POST, DSD_CP_FINAL_NORM, DSD_SUB_ALL,
                      (1u << DS_FAM_RESIDUAL) | (1u << DS_FAM_RMSNORM), a->xn, d, d);
}

void ds_model_logits(const ds_model *m, ds_exec *ex, const ds_acts *a, const uint8_t var[DS_FAM_COUNT], int r0,
                     int rows, int pos0, float *out, const ds_probe *pr) {
    const ds_weight *W = &m->output;
    ex->be->i->matmul(ex, (ds_variant)var[ds_matmul_family(W->type)], W, rows, a->xn + (size_t)r0 * m->hp.n_embd, out);
    if (pr && pr->fn && (!pr->wants || pr->wants(pr->user, DSD_LAYER_POST, DSD_CP_LOGITS)))
        ds_probe_rows(ex, pr, rows, pos0 + r0, DSD_LAYER_POST, DSD_CP_LOGITS, DSD_SUB_ALL,
                      1u << ds_matmul_family(W->type), out, (size_t)m->hp.n_vocab, (size_t)m->hp.n_vocab);
}

/* Rows pos0..pos0+M-1 (M <= m_max) of the context's sequence, inputs
 * already on the device: the model's forward on the context's buffers. */
static void forward_chunk(ds_ctx *c, const uint8_t var[DS_FAM_COUNT], int M, int pos0, float *taps,
                          size_t taps_stride) {
    if (c->tp) {   /* the ranks */
        ds_tp_forward(c->tp, &c->a, var, M, pos0, c->tap_layers, c->n_taps, taps, taps_stride,
                      c->probe.fn ? &c->probe : NULL);
        return;
    }
    ds_model_forward(c->m, c->ex, &c->a, c->pool, var, M, pos0, c->tap_layers, c->n_taps, taps, taps_stride,
                     c->probe.fn ? &c->probe : NULL);
}

static int check_run(const ds_ctx *c, const int32_t *tokens, int M, int n_host, int pos0, char *err,
                     size_t errlen) {
    if (M < 1) { ds_errf(err, errlen, "forward: batch of %d tokens (need at least 1)", M); return -1; }
    if (pos0 < 0 || pos0 > c->n_past) {
        ds_errf(err, errlen, "forward: position %d is not in [0, n_past=%d]", pos0, c->n_past);
        return -1;
    }
    if ((int64_t)pos0 + M > c->n_ctx) {
        ds_errf(err, errlen, "forward: positions %d..%d exceed the context size %d", pos0, pos0 + M - 1, c->n_ctx);
        return -1;
    }
    for (int i = 0; i < n_host; i++)
        if (tokens[i] < 0 || tokens[i] >= c->m->hp.n_vocab) {
            ds_errf(err, errlen, "forward: token id %d is out of range [0, %d)", tokens[i], c->m->hp.n_vocab);
            return -1;
        }
    return 0;
}

/* Logits of `rows` rows of a.xn from row r0 of the chunk into `out` (device
 * or host by backend). */
static void logits_rows(ds_ctx *c, const uint8_t var[DS_FAM_COUNT], int r0, int rows, int pos0,
                        float *out) {
    ds_model_logits(c->m, c->ex, &c->a, var, r0, rows, pos0, out, c->probe.fn ? &c->probe : NULL);
}

/* Selection on the device (ds_forward_select): which rows, how, where the
 * ids go on the host, and an optional device destination for the taps. */
typedef struct {
    const ds_sampler *samp;
    int32_t *ids;
    float   *taps_dev;
    const int32_t *draft_dev;   /* rows 1..M-1's tokens on the device, or NULL */
    int32_t *draft_host;
    int      defer;
    const int32_t *rows_dev;    /* with draft_dev: positions, then tokens at +pitch */
    int      rows_pitch;
    const ds_lproc *lp;         /* host logits processor (ds_forward_select_lp), or NULL */
    const int32_t  *lp_extra;   /* row i of an ALL selection: extra history lp_extra[0..lp_n + i) */
    int             lp_n;
} sel_args;

/* The key a recorded launch sequence is filed under: everything that
 * changes which ops run or with which arguments (FNV-1a over the shape,
 * the variants, the logits rows and the tap list). */
static uint64_t graph_key(const ds_ctx *c, const uint8_t var[DS_FAM_COUNT], int n, int r0, int rows,
                          int with_taps) {   /* with_taps: bit 0 taps, bit 1 the greedy selection,
                                                bit 2 the queued draft, bit 3 short rows only */
    uint64_t h = 1469598103934665603ull;
#define MIX(v) (h = (h ^ (uint64_t)(uint32_t)(v)) * 1099511628211ull)
    MIX(n); MIX(r0); MIX(rows); MIX(with_taps); MIX(c->n_taps);
    for (int i = 0; i < c->n_taps; i++) MIX(c->tap_layers[i]);
    for (int f = 0; f < DS_FAM_COUNT; f++) MIX(var[f]);
    if (c->tp) { MIX(ds_tp_ranks(c->tp)); MIX(c->tp_gen); }   /* the ranks' buffers (plain keys unchanged) */
#undef MIX
    return h;
}

/* Whether this context's forwards of n rows with var may be recorded as
 * launch sequences (CUDA graphs): not when probed (the probes copy and
 * download per row), and for a mixture-of-experts model only where every
 * MoE layer runs its experts on the device (layer.c
 * ds_layer_moe_on_device: decode, short verify blocks); otherwise its
 * layers download the route's ids to group the rows on the host, a
 * synchronisation per MoE layer, which no recording may hold. */
static int ctx_records(const ds_ctx *c, const uint8_t var[DS_FAM_COUNT], int n) {
    if (!c->be->i->graph_begin || c->probe.fn) return 0;
    return !c->m->hp.n_expert || ds_layers_moe_on_device(c->be, c->m->layers, c->m->hp.n_layer, var, n);
}

/* A selection downloaded into sel_host (run's pend fields): the ids where
 * the caller wants them, and nothing pending any more. */
static void sel_unpack(ds_ctx *c) {
    const int skip = c->pend == 2 ? c->m_max - 1 : 0;
    if (c->pend == 2) memcpy(c->pend_draft, c->sel_host, (size_t)(c->pend_n - 1) * sizeof(int32_t));
    memcpy(c->pend_ids, c->sel_host + skip, (size_t)c->pend_rows * sizeof(int32_t));
    c->pend = 0;
}

/* A queued draft's rows into the context's buffers, device to device: its
 * ids (rows 1..n-1), or with rows_dev the positions and all n tokens as
 * one two-row copy (c->ids sits m_max ints after c->pos). */
static void tail_copy(ds_ctx *c, const sel_args *sel, int n) {
    const ds_backend_i *b = c->be->i;
    if (sel->rows_dev)
        ds_backend_copy2d(c->ex, c->pos, (size_t)c->m_max * sizeof(int32_t), sel->rows_dev,
                          (size_t)sel->rows_pitch * sizeof(int32_t), (size_t)n * sizeof(int32_t), 2);
    else
        b->copy(c->ex, c->ids + 1, sel->draft_dev, (size_t)(n - 1) * sizeof(int32_t));
}

static int run(ds_ctx *c, int decode, const int32_t *tokens, int M, int pos0, int logits_mode,
               float *logits, float *taps, const sel_args *sel, char *err, size_t errlen) {
    const int tail_dev = sel && sel->draft_dev;
    if (c->pend) { ds_errf(err, errlen, "forward: a deferred selection was never collected"); return -1; }
    if (check_run(c, tokens, M, tail_dev ? 1 : M, pos0, err, errlen)) return -1;
    /* a hybrid model's rows start from the recurrent state after pos0 - 1:
     * one it kept, or the forward is refused before anything runs */
    if (c->rs.mem && ds_model_rs_rewind(c->m, c->ex, &c->a, 0, pos0, err, errlen)) return -1;
    if (tail_dev && M > c->m_max) {
        ds_errf(err, errlen, "select: %d rows with device tokens exceed one batch of %d", M, c->m_max);
        return -1;
    }
    const ds_backend_i *b = c->be->i;
    const int host = b->host_memory;
    const size_t V = (size_t)c->m->hp.n_vocab, taps_stride = (size_t)c->n_taps * c->m->hp.n_embd;
    uint8_t var[DS_FAM_COUNT];
    for (int f = 0; f < DS_FAM_COUNT; f++) var[f] = decode ? DS_CANONICAL : c->ks.v[f];
    for (int done = 0; done < M;) {
        const int n = M - done < c->m_max ? M - done : c->m_max;
        const int p0 = pos0 + done;
        /* the chunk's pages (new ones as the sequence grows; a page shared
         * with a snapshot's restore is copied first) */
        if (ctx_prepare(c, p0, p0 + n, err, errlen)) return -1;
        c->a.tables_host = c->probe.fn ? c->seq.table : NULL;
        /* positions and ids in one upload (the ids sit m_max ints after the
         * positions); a queued draft's ids device to device after it; a
         * queued round's rows (rows_dev: positions and every token already
         * on the device) no upload at all */
        const int rows_dev = tail_dev && sel->rows_dev;
        /* the rows' longest prefix, where the host knows the positions (a
         * queued round's are on the device only) */
        c->rows.vis_max = rows_dev ? 0 : p0 + n;
        if (!rows_dev) {
            for (int r = 0; r < n; r++) c->pos_host[r] = p0 + r;
            int32_t *ids_host = (int32_t *)c->pos_host + c->m_max;
            memcpy(ids_host, tokens + done, (size_t)(tail_dev ? 1 : n) * sizeof(int32_t));
            b->upload(c->ex, c->pos, c->pos_host, (size_t)(c->m_max + (tail_dev ? 1 : n)) * sizeof(int32_t));
        }
        /* a queued draft's ids: device to device, inside the recording when
         * there is one (its address is part of the key) */
        const int tail_rec = tail_dev && ctx_records(c, var, n);
        if (tail_dev && !tail_rec) tail_copy(c, sel, n);
        /* taps and logits: to the caller's host buffers on host-memory
         * backends; else to the context's device buffers, fixed per context
         * so that a recorded launch sequence is the same for every call of
         * one shape (the selecting path then copies the taps on, device to
         * device, outside the recording) */
        float *taps_dst;
        if (sel) taps_dst = !sel->taps_dev ? NULL : host ? sel->taps_dev + (size_t)done * taps_stride : c->taps;
        else taps_dst = !taps ? NULL : host ? taps + (size_t)done * taps_stride : c->taps;
        float *lg = NULL;
        int r0 = 0, rows = 0;
        if (logits_mode == DS_LOGITS_ALL) { lg = sel ? NULL : logits + (size_t)done * V; rows = n; }
        else if (logits_mode == DS_LOGITS_LAST && done + n == M) { lg = sel ? NULL : logits; r0 = n - 1; rows = 1; }
        float *lg_dst = sel ? (c->logits ? c->logits : c->sel_logits) : host ? lg : c->logits;
        /* A backend that records launch sequences (CUDA graphs) replays the
         * one recorded for this shape: every argument below is the same for
         * every call with the same key (positions and ids are in device
         * buffers). Probed passes and MoE forwards that read the route on
         * the host are never recorded (ctx_records). */
        int replayed = 0;
        const int graphs = ctx_records(c, var, n);
        /* greedy selection (argmax: no position, no seed) is part of the
         * recording; a seeded one takes the position by value and stays out */
        const int sel_rec = graphs && sel && rows && !sel->lp && (!sel->samp || !(sel->samp->temp > 0.0f));
        if (graphs) {
            const int short_rows = c->rows.vis_max > 0 && c->rows.vis_max <= DS_ROWS_SHORT;
            uint64_t key = graph_key(c, var, n, r0, rows,
                                     (taps_dst != NULL) | (sel_rec << 1) | (tail_rec << 2) | (short_rows << 3));
            if (tail_rec) key ^= (uint64_t)(uintptr_t)sel->draft_dev * 0x9e3779b97f4a7c15ull;
            if (tail_rec && rows_dev)
                key ^= ((uint64_t)(uintptr_t)sel->rows_dev + (uint64_t)sel->rows_pitch) * 0xc2b2ae3d27d4eb4full;
            if ((replayed = b->graph_begin(c->ex, key, err, errlen)) < 0) return -1;
        }
        if (!replayed) {
            if (tail_rec) tail_copy(c, sel, n);
            forward_chunk(c, var, n, p0, taps_dst, taps_stride);
            if (c->tp && ds_tp_error(c->tp, err, errlen)) {
                if (graphs) (void)b->graph_end(c->ex, NULL, 0);   /* close the recording, as below */
                return -1;
            }
            if (rows) logits_rows(c, var, r0, rows, p0, lg_dst);
            if (sel_rec && ds_backend_select(c->ex, NULL, rows, (int)V, lg_dst, (int64_t)p0 + r0 + 1, c->sel_scratch,
                                             c->sel_ids, err, errlen)) {
                (void)b->graph_end(c->ex, NULL, 0);
                return -1;
            }
        }
        if (graphs && b->graph_end(c->ex, err, errlen)) return -1;
        if (c->rs.mem) ds_rstate_commit(&c->rs, 0, p0, p0 + n - 1, var[DS_FAM_GDN]);
        if (sel) {
            if (!host && sel->taps_dev && !(sel->taps_dev == c->taps && done == 0 && n == M))
                b->copy(c->ex, sel->taps_dev + (size_t)done * taps_stride, c->taps,
                        (size_t)n * taps_stride * sizeof(float));
            /* the logits stay on the device; the token each row selects
             * (keyed on the position it is chosen for, row position + 1)
             * comes back */
            if (rows) {
                int32_t *dst = sel->ids + (logits_mode == DS_LOGITS_ALL ? done : 0);
                if (!sel_rec && (sel->lp ? ds_backend_select_lp(c->ex, sel->samp, sel->lp, sel->lp_extra,
                                                                sel->lp_n + (logits_mode == DS_LOGITS_ALL ? done : 0), rows, (int)V,
                                                                lg_dst, (int64_t)p0 + r0 + 1, c->sel_ids, err, errlen)
                                         : ds_backend_select(c->ex, sel->samp, rows, (int)V, lg_dst, (int64_t)p0 + r0 + 1,
                                                             c->sel_scratch, c->sel_ids, err, errlen)))
                    return -1;
                const int defer = sel->defer && b->download_start && n == M;
                if (tail_dev || defer) {
                    /* into sel_host, unpacked by sel_unpack: with a queued
                     * draft, its ids (ids[1..n)) and the selections as one
                     * range; deferred, once ds_forward_collect has waited */
                    c->pend = tail_dev ? 2 : 1;
                    c->pend_ids = dst;
                    c->pend_draft = sel->draft_host;
                    c->pend_rows = rows;
                    c->pend_n = n;
                    const int32_t *src = tail_dev ? c->ids + 1 : c->sel_ids;
                    const size_t bytes = (size_t)(tail_dev ? c->m_max - 1 + rows : rows) * sizeof(int32_t);
                    if (defer) {
                        b->download_start(c->ex, c->sel_host, src, bytes);
                        done += n;
                        continue;
                    }
                    b->download(c->ex, c->sel_host, src, bytes);
                    sel_unpack(c);
                } else {
                    b->download(c->ex, dst, c->sel_ids, (size_t)rows * sizeof(int32_t));
                }
            } else if (tail_dev) {
                b->download(c->ex, sel->draft_host, c->ids + 1, (size_t)(n - 1) * sizeof(int32_t));
            }
            if (!host && b->sync(c->ex, err, errlen)) return -1;
        } else if (!host) {   /* one synchronising download per chunk */
            if (rows) b->download(c->ex, lg, c->logits, (size_t)rows * V * sizeof(float));
            if (taps)
                b->download(c->ex, taps + (size_t)done * taps_stride, c->taps,
                            (size_t)n * taps_stride * sizeof(float));
            if (b->sync(c->ex, err, errlen)) return -1;
        }
        done += n;
    }
    c->n_past = c->seq.n_past = pos0 + M;
    return 0;
}

int ds_decode(ds_ctx *c, int32_t token, int pos, float *logits, float *taps, char *err, size_t errlen) {
    return run(c, 1, &token, 1, pos, logits ? DS_LOGITS_LAST : DS_LOGITS_NONE, logits, taps, NULL, err, errlen);
}

/* ds_forward_select and ds_forward_select_lp: the options checked once. */
static int select_run(ds_ctx *c, const int32_t *tokens, int M, int pos0, const ds_select_opts *o, const ds_lproc *lp,
                      const int32_t *extra, int n_extra, char *err, size_t errlen) {
    if (!o) { ds_errf(err, errlen, "select: no options given"); return -1; }
    if (o->rows != DS_LOGITS_NONE && o->rows != DS_LOGITS_LAST && o->rows != DS_LOGITS_ALL) {
        ds_errf(err, errlen, "select: rows mode %d is not NONE, LAST or ALL", o->rows);
        return -1;
    }
    if (o->rows != DS_LOGITS_NONE && !o->ids) { ds_errf(err, errlen, "select: ids requested but no buffer given"); return -1; }
    if (o->decode && M != 1) { ds_errf(err, errlen, "select: the decode path takes one token, not %d", M); return -1; }
    if (o->draft_dev && !o->draft_host) { ds_errf(err, errlen, "select: device tokens given but no host buffer for them"); return -1; }
    if (o->rows_dev && (!o->draft_dev || o->rows_pitch < M)) {
        ds_errf(err, errlen, "select: device rows need a queued draft and a pitch of at least %d rows (%s, pitch %d)", M,
                o->draft_dev ? "draft given" : "no draft", o->rows_pitch);
        return -1;
    }
    if (lp && (o->draft_dev || o->defer)) {
        ds_errf(err, errlen, "select: a logits processor needs the drafts on the host (no queued draft, no deferred ids)");
        return -1;
    }
    if (lp && (n_extra < 0 || (!extra && (n_extra > 0 || (o->rows == DS_LOGITS_ALL && M > 1))))) {
        ds_errf(err, errlen, "select: a logits processor on %d rows needs their extra tokens (%d given)", M, n_extra);
        return -1;
    }
    const sel_args sel = {o->samp, o->ids, o->taps_dev, o->draft_dev, o->draft_host, o->defer, o->rows_dev, o->rows_pitch,
                          lp, extra, n_extra};
    return run(c, o->decode, tokens, M, pos0, o->rows, NULL, NULL, &sel, err, errlen);
}

int ds_forward_select(ds_ctx *c, const int32_t *tokens, int M, int pos0, const ds_select_opts *o,
                      char *err, size_t errlen) {
    return select_run(c, tokens, M, pos0, o, NULL, NULL, 0, err, errlen);
}

int ds_forward_select_lp(ds_ctx *c, const int32_t *tokens, int M, int pos0, const ds_select_opts *o, const ds_lproc *lp,
                         const int32_t *extra, int n_extra, char *err, size_t errlen) {
    return select_run(c, tokens, M, pos0, o, lp, extra, n_extra, err, errlen);
}

int ds_forward_collect(ds_ctx *c, char *err, size_t errlen) {
    if (!c->pend) return 0;
    char e2[DS_ERRLEN];
    if (c->be->i->download_finish(c->ex, e2, sizeof e2)) {
        c->pend = 0;
        ds_errf(err, errlen, "select: %s", e2);
        return -1;
    }
    sel_unpack(c);
    return 0;
}

int ds_forward_batch(ds_ctx *c, const int32_t *tokens, int M, int pos0, int logits_mode, float *logits,
                     float *taps, char *err, size_t errlen) {
    if (logits_mode != DS_LOGITS_NONE && !logits) {
        ds_errf(err, errlen, "forward: logits requested but no buffer given");
        return -1;
    }
    return run(c, 0, tokens, M, pos0, logits_mode, logits, taps, NULL, err, errlen);
}

/* ========================================================================
 * State snapshots (on the device) and KV reads
 * ===================================================================== */

int ds_state_save(ds_ctx *c, ds_state *s) {
    s->n_past = c->n_past;
    memset(&s->rs, 0, sizeof s->rs);
    memset(&s->snap, 0, sizeof s->snap);
    memset(s->tp, 0, sizeof s->tp);
    if (c->rs.mem && ds_rstate_save(&c->rs, c->ex, 0, &s->rs)) return -1;
    if (ds_seq_snapshot(&c->seq, c->pool, c->ex, c->n_past, &s->snap)) return -1;
    /* --tp: each rank's rows too (c->pool's snapshot is still taken: it
     * marks the state as saved, and its restore keeps the table in step) */
    if (c->tp && ds_tp_snapshot(c->tp, &c->seq, c->n_past, s->tp)) {
        ds_kv_snap_free(&s->snap);
        return -1;
    }
    return 0;
}

int ds_state_restore(ds_ctx *c, const ds_state *s) {
    char e[DS_ERRLEN];
    if (c->tp && !s->tp[0].be && s->n_past > 0) return -1;   /* saved without the ranks */
    if (s->n_past > c->n_ctx || ds_seq_restore(&c->seq, c->pool, c->ex, &s->snap) ||
        ctx_prepare(c, 0, 0, e, sizeof e))
        return -1;
    if (c->rs.mem) {
        if (!s->rs.data || s->rs.n != 2 * c->rs.state_n + (size_t)c->rs.n_rec * (size_t)c->rs.cap * c->rs.log_row) return -1;
        ds_rstate_load(&c->rs, c->ex, 0, &s->rs);
    }
    if (c->tp) ds_tp_restore(c->tp, &c->seq, s->tp);
    c->n_past = c->seq.n_past = s->n_past;
    return 0;
}

void ds_state_free(ds_state *s) {
    for (int r = 0; r < DS_STATE_TP_MAX; r++) ds_kv_snap_free(&s->tp[r]);
    ds_kv_snap_free(&s->snap);
    ds_rstate_snap_free(&s->rs);
}

void ds_ctx_read_kv(ds_ctx *c, int pos0, int n, float *k, float *v) {
    if (c->tp) {
        ds_tp_read_kv(c->tp, &c->seq, pos0, n, k, v);
        return;
    }
    ds_seq_read(&c->seq, c->pool, c->ex, 0, pos0, n, k, v);
}

/* ========================================================================
 * Accessors (the context is opaque to callers)
 * ===================================================================== */

const ds_model *ds_ctx_model(const ds_ctx *c) { return c->m; }
ds_exec *ds_ctx_exec(ds_ctx *c) { return c->ex; }
int  ds_ctx_n_ctx(const ds_ctx *c) { return c->n_ctx; }
int  ds_ctx_n_past(const ds_ctx *c) { return c->n_past; }
int  ds_ctx_m_max(const ds_ctx *c) { return c->m_max; }
float *ds_ctx_taps_dev(ds_ctx *c) { return c->be->i->host_memory ? NULL : c->taps; }
int  ds_ctx_n_taps(const ds_ctx *c) { return c->n_taps; }
void ds_ctx_set_kernels(ds_ctx *c, const ds_kernel_set *ks) { c->ks = *ks; }
void ds_ctx_get_kernels(const ds_ctx *c, ds_kernel_set *ks) { *ks = c->ks; }
void ds_ctx_set_probe(ds_ctx *c, const ds_probe *p) {
    if (p) {
        c->probe = *p;
        c->probe.stage = c->stage;
    } else {
        memset(&c->probe, 0, sizeof c->probe);
    }
}
void ds_ctx_set_variant(ds_ctx *c, ds_variant v) { ds_kernel_set_all(&c->ks, v); }
const int *ds_ctx_tap_layers(const ds_ctx *c) { return c->tap_layers; }
