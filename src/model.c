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

#include <math.h>
#include <stdlib.h>

/* ========================================================================
 * Loading
 * ===================================================================== */

const char *ds_arch_name(ds_arch a) { return a == DS_ARCH_LLAMA ? "llama" : "qwen3"; }

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

static int load_weight(const gguf_ctx *g, const char *name, int64_t n_in, int64_t n_out, ds_weight *w,
                       char *err, size_t errlen) {
    const gguf_tensor *t = want_tensor(g, name, n_in, n_out, err, errlen);
    if (!t) return -1;
    if (t->type == DS_TYPE_Q8_0 && n_in % DS_QK8_0) {
        ds_errf(err, errlen, "model: tensor '%s' is Q8_0 but its row length %lld is not a multiple of 32", name, (long long)n_in);
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
    if (t->type == DS_TYPE_Q8_0 && n % DS_QK8_0) {
        ds_errf(err, errlen, "model: tensor '%s' is Q8_0 with a length not a multiple of 32", name);
        return -1;
    }
    ds_row_to_f32(t->type, t->data, n, *cursor);
    *out = *cursor;
    *cursor += n;
    return 0;
}

/* Pre-repack every Q8_0 matrix the matmuls read (the layers' seven and the
 * output / LM head; a tied head is packed once, and the drafter reuses it
 * through &m->output) into one owned arena, when the canonical kernel would
 * otherwise repack them on every batched call (ds_q8_0_packed_bytes > 0 only
 * on AVX-512 with VNNI). Same bits as unpacked (kernels.h). Returns -1 only
 * when the arena cannot be allocated. */
static int pack_weights(ds_model *m) {
    const int nl = m->hp.n_layer;
    size_t total = 0;
    for (int pass = 0; pass < 2; pass++) {
        size_t off = 0;
        for (int i = 0; i < 7 * nl + 1; i++) {
            ds_layer *L = i < 7 * nl ? &m->layers[i / 7] : NULL;
            ds_weight *w = !L ? &m->output
                         : (ds_weight *[]){&L->wq, &L->wk, &L->wv, &L->wo, &L->w_gate, &L->w_up,
                                           &L->w_down}[i % 7];
            const size_t b = ds_q8_0_packed_bytes(w);
            if (!b) continue;
            if (pass == 1) {
                if (!ds_q8_0_pack(w, (char *)m->packed_arena + off))
                    w->packed = (char *)m->packed_arena + off;
            }
            off += (b + 63) & ~(size_t)63;
        }
        if (pass == 0) {
            if (!off) return 0;
            total = off;
            m->packed_arena = aligned_alloc(64, total);
            if (!m->packed_arena) return -1;
            m->packed_bytes = total;
        }
    }
    if (m->output_tied) m->tok_embd.packed = m->output.packed;
    return 0;
}

ds_model *ds_model_load(const char *path, char *err, size_t errlen) {
    char e2[DS_ERRLEN];
    gguf_ctx *g = gguf_open(path, e2, sizeof e2);
    if (!g) { ds_errf(err, errlen, "%s", e2); return NULL; }
    ds_model *m = calloc(1, sizeof *m);
    if (!m) { gguf_close(g); ds_errf(err, errlen, "model: out of memory"); return NULL; }
    m->gguf = g;
    ds_hparams *hp = &m->hp;

    gguf_str archs;
    if (gguf_get_str(g, "general.architecture", &archs) != 0) {
        ds_errf(err, errlen, "model: missing metadata key 'general.architecture'");
        goto fail;
    }
    const char *arch;
    if (gguf_str_eq(archs, "qwen3")) { hp->arch = DS_ARCH_QWEN3; arch = "qwen3"; }
    else if (gguf_str_eq(archs, "llama")) { hp->arch = DS_ARCH_LLAMA; arch = "llama"; }
    else {
        ds_errf(err, errlen, "model: unknown architecture '%.*s' (supported: qwen3, llama)",
                (int)(archs.len > 64 ? 64 : archs.len), archs.ptr);
        goto fail;
    }
    if (get_u32_req(g, arch, "block_count", &hp->n_layer, err, errlen) ||
        get_u32_req(g, arch, "embedding_length", &hp->n_embd, err, errlen) ||
        get_u32_req(g, arch, "feed_forward_length", &hp->n_ff, err, errlen) ||
        get_u32_req(g, arch, "attention.head_count", &hp->n_head, err, errlen))
        goto fail;
    hp->n_head_kv = hp->n_head;
    char key[128];
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
    m->f32_arena = malloc(n_norm * sizeof(float));
    m->layers = calloc((size_t)hp->n_layer, sizeof(ds_layer));
    if (!m->f32_arena || !m->layers) { ds_errf(err, errlen, "model: out of memory"); goto fail; }
    float *cur = m->f32_arena;
    if (load_norm(g, "output_norm.weight", d, &cur, &m->output_norm, err, errlen)) goto fail;

    for (int l = 0; l < hp->n_layer; l++) {
        ds_layer *L = &m->layers[l];
        char n[96];
#define NAME(s) (snprintf(n, sizeof n, "blk.%d." s ".weight", l), n)
        if (load_norm(g, NAME("attn_norm"), d, &cur, &L->attn_norm, err, errlen) ||
            load_norm(g, NAME("ffn_norm"), d, &cur, &L->ffn_norm, err, errlen) ||
            load_weight(g, NAME("attn_q"), d, qd, &L->wq, err, errlen) ||
            load_weight(g, NAME("attn_k"), d, kvd, &L->wk, err, errlen) ||
            load_weight(g, NAME("attn_v"), d, kvd, &L->wv, err, errlen) ||
            load_weight(g, NAME("attn_output"), qd, d, &L->wo, err, errlen) ||
            load_weight(g, NAME("ffn_gate"), d, hp->n_ff, &L->w_gate, err, errlen) ||
            load_weight(g, NAME("ffn_up"), d, hp->n_ff, &L->w_up, err, errlen) ||
            load_weight(g, NAME("ffn_down"), hp->n_ff, d, &L->w_down, err, errlen))
            goto fail;
        if (hp->arch == DS_ARCH_QWEN3) {
            if (load_norm(g, NAME("attn_q_norm"), hd, &cur, &L->attn_q_norm, err, errlen) ||
                load_norm(g, NAME("attn_k_norm"), hd, &cur, &L->attn_k_norm, err, errlen))
                goto fail;
        }
#undef NAME
    }
    m->weight_type = m->layers[0].wq.type;
    if (pack_weights(m)) { ds_errf(err, errlen, "model: out of memory packing Q8_0 weights"); goto fail; }
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
    free(m->packed_arena);
    ds_tokenizer_free(m->tok);
    free(m->layers);
    free(m->f32_arena);
    gguf_close(m->gguf);
    free(m);
}

size_t ds_kv_row_bytes(const ds_model *m) {
    return 2u * (size_t)m->hp.n_layer * (size_t)m->hp.n_head_kv * (size_t)m->hp.head_dim * sizeof(float);
}

/* ========================================================================
 * Context: KV cache, scratch, taps
 * ===================================================================== */

#define DS_M_MAX 64      /* rows per internal chunk: prefill goes 64 at a time */

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
    c->n_ctx = n_ctx;
    c->m_max = DS_M_MAX;
    ds_kernel_set_all(&c->ks, DS_CANONICAL);
    c->pool = ds_pool_new(n_threads);
    c->own_pool = 1;
    size_t kvd = (size_t)hp->n_head_kv * hp->head_dim, qd = (size_t)hp->n_head * hp->head_dim;
    size_t cache = (size_t)hp->n_layer * (size_t)n_ctx * kvd;
    size_t M = (size_t)c->m_max;
    c->k_cache = calloc(cache, sizeof(float));
    c->v_cache = calloc(cache, sizeof(float));
    c->x = malloc(M * hp->n_embd * sizeof(float));
    c->xn = malloc(M * hp->n_embd * sizeof(float));
    c->o = malloc(M * hp->n_embd * sizeof(float));
    c->q = malloc(M * qd * sizeof(float));
    c->att = malloc(M * qd * sizeof(float));
    c->k = malloc(M * kvd * sizeof(float));
    c->v = malloc(M * kvd * sizeof(float));
    c->gate = malloc(M * hp->n_ff * sizeof(float));
    c->up = malloc(M * hp->n_ff * sizeof(float));
    c->h = malloc(M * hp->n_ff * sizeof(float));
    c->pos = malloc(M * sizeof(int));
    if (!c->pool || !c->k_cache || !c->v_cache || !c->x || !c->xn || !c->o || !c->q || !c->att ||
        !c->k || !c->v || !c->gate || !c->up || !c->h || !c->pos) {
        ds_ctx_free(c);
        ds_errf(err, errlen, "context: out of memory for n_ctx=%d (KV cache %.1f MiB)", n_ctx,
                2.0 * cache * sizeof(float) / 1048576.0);
        return NULL;
    }
    return c;
}

void ds_ctx_free(ds_ctx *c) {
    if (!c) return;
    if (c->own_pool) ds_pool_free(c->pool);
    free(c->k_cache); free(c->v_cache);
    free(c->x); free(c->xn); free(c->o); free(c->q); free(c->att); free(c->k); free(c->v);
    free(c->gate); free(c->up); free(c->h); free(c->pos);
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

int ds_kv_truncate(ds_ctx *c, int n_pos) {
    if (n_pos < 0 || n_pos > c->n_past) return -1;
    c->n_past = n_pos;
    return 0;
}

/* ========================================================================
 * The forward pass
 * ===================================================================== */

/* Report rows of one checkpoint to the probe, if any. `stride` floats apart,
 * `n` floats each. */
static void probe_rows(const ds_ctx *c, int M, int layer, int cp, int sub, const float *base,
                       size_t stride, size_t n) {
    if (!c->probe) return;
    for (int r = 0; r < M; r++) c->probe(c->probe_user, c->pos[r], layer, cp, sub, base + (size_t)r * stride, n);
}
/* Per-head objects: one probe object per head (subobject = head index). */
static void probe_heads(const ds_ctx *c, int M, int layer, int cp, int n_heads, int hd, const float *base) {
    if (!c->probe) return;
    for (int r = 0; r < M; r++)
        for (int h = 0; h < n_heads; h++)
            c->probe(c->probe_user, c->pos[r], layer, cp, (int)DSD_SUB_HEAD(h),
                     base + ((size_t)r * n_heads + h) * hd, (size_t)hd);
}

/* Which variant a family runs: decode forces canonical (whose M=1 case IS
 * the decode kernel); the batched path follows the kernel set. */
#define VAR(fam) (decode ? DS_CANONICAL : (ds_variant)c->ks.v[(fam)])

static void matmul(const ds_ctx *c, int decode, const ds_weight *W, int M, const float *x, float *y) {
    if (decode) ds_matmul_decode(W, x, y, c->pool);
    else ds_matmul((ds_variant)c->ks.v[ds_matmul_family(W->type)], W, M, x, y, c->pool);
}

/* Rows pos0..pos0+M-1 (M <= m_max). Writes the KV rows, fills taps for the
 * chunk, and leaves the final-normed hidden state of every row in c->xn. */
static void forward_chunk(ds_ctx *c, int decode, const int32_t *tokens, int M, int pos0, float *taps,
                          int taps_stride) {
    const ds_model *m = c->m;
    const ds_hparams *hp = &m->hp;
    const int d = hp->n_embd, hd = hp->head_dim, H = hp->n_head, Hkv = hp->n_head_kv;
    const int qd = H * hd, kvd = Hkv * hd, ff = hp->n_ff;
    const float eps = hp->norm_eps;
    const ds_rope_mode rope_mode = hp->arch == DS_ARCH_QWEN3 ? DS_ROPE_NEOX : DS_ROPE_NORMAL;

    for (int r = 0; r < M; r++) c->pos[r] = pos0 + r;

    /* token embeddings */
    for (int r = 0; r < M; r++) {
        int ok;
        size_t rb = (size_t)ds_row_bytes(m->tok_embd.type, (uint64_t)d, &ok);   /* validated at load */
        ds_row_to_f32(m->tok_embd.type, (const uint8_t *)m->tok_embd.data + (size_t)tokens[r] * rb, d, c->x + (size_t)r * d);
    }
    
    /* the first sub-block's norm has no residual epilogue in front of it */
    ds_rmsnorm(VAR(DS_FAM_RMSNORM), M, d, c->x, m->layers[0].attn_norm, eps, c->xn, c->pool);

    int tap_i = 0;
    for (int l = 0; l < hp->n_layer; l++) {
        const ds_layer *L = &m->layers[l];
        probe_rows(c, M, l, DSD_CP_ATTN_NORM, DSD_SUB_ALL, c->xn, d, d);

        /* --- attention: projections, QK-norm, RoPE ------------------------ */
        matmul(c, decode, &L->wq, M, c->xn, c->q);
        matmul(c, decode, &L->wk, M, c->xn, c->k);
        matmul(c, decode, &L->wv, M, c->xn, c->v);
        probe_rows(c, M, l, DSD_CP_QKV, DSD_SUB_Q_PROJ, c->q, qd, qd);
        probe_rows(c, M, l, DSD_CP_QKV, DSD_SUB_K_PROJ, c->k, kvd, kvd);
        probe_rows(c, M, l, DSD_CP_QKV, DSD_SUB_V_PROJ, c->v, kvd, kvd);
        if (hp->arch == DS_ARCH_QWEN3) {
            /* per-head RMSNorm: rows = tokens x heads, in place */
            ds_rmsnorm(VAR(DS_FAM_RMSNORM), M * H, hd, c->q, L->attn_q_norm, eps, c->q, c->pool);
            ds_rmsnorm(VAR(DS_FAM_RMSNORM), M * Hkv, hd, c->k, L->attn_k_norm, eps, c->k, c->pool);
            probe_rows(c, M, l, DSD_CP_QKV, DSD_SUB_Q_NORM, c->q, qd, qd);
            probe_rows(c, M, l, DSD_CP_QKV, DSD_SUB_K_NORM, c->k, kvd, kvd);
        }
        ds_rope(VAR(DS_FAM_ROPE), M, H, hd, c->pos, hp->rope_base, rope_mode, c->q, c->pool);
        ds_rope(VAR(DS_FAM_ROPE), M, Hkv, hd, c->pos, hp->rope_base, rope_mode, c->k, c->pool);
        probe_rows(c, M, l, DSD_CP_QKV, DSD_SUB_Q_ROPE, c->q, qd, qd);
        probe_rows(c, M, l, DSD_CP_QKV, DSD_SUB_K_ROPE, c->k, kvd, kvd);

        /* --- write this chunk's K/V rows first, then attend --------------- */
        float *kc = c->k_cache + (size_t)l * c->n_ctx * kvd;
        float *vc = c->v_cache + (size_t)l * c->n_ctx * kvd;
        memcpy(kc + (size_t)pos0 * kvd, c->k, (size_t)M * kvd * sizeof(float));
        memcpy(vc + (size_t)pos0 * kvd, c->v, (size_t)M * kvd * sizeof(float));
        probe_rows(c, M, l, DSD_CP_KV_WRITE, DSD_SUB_K_CACHE_ROW, kc + (size_t)pos0 * kvd, kvd, kvd);
        probe_rows(c, M, l, DSD_CP_KV_WRITE, DSD_SUB_V_CACHE_ROW, vc + (size_t)pos0 * kvd, kvd, kvd);

        ds_attn_shape as = { H, Hkv, hd, kvd, 1.0f / sqrtf((float)hd) };
        ds_attention(VAR(DS_FAM_ATTENTION), &as, M, pos0, 1, pos0 + M, c->q, kc, vc, c->att, c->pool);
        probe_heads(c, M, l, DSD_CP_ATTN_HEADS, H, hd, c->att);

        matmul(c, decode, &L->wo, M, c->att, c->o);
        probe_rows(c, M, l, DSD_CP_ATTN_OUT_PROJ, DSD_SUB_ALL, c->o, d, d);

        /* --- residual epilogue + FFN norm ------------------------------- */
        ds_residual(VAR(DS_FAM_RESIDUAL), VAR(DS_FAM_RMSNORM), M, d, c->x, c->o, L->ffn_norm, eps, c->xn, c->pool);
        probe_rows(c, M, l, DSD_CP_ATTN_RESIDUAL, DSD_SUB_ALL, c->x, d, d);
        probe_rows(c, M, l, DSD_CP_FFN_NORM, DSD_SUB_ALL, c->xn, d, d);

        /* --- SwiGLU FFN --------------------------------------------------- */
        matmul(c, decode, &L->w_gate, M, c->xn, c->gate);
        matmul(c, decode, &L->w_up, M, c->xn, c->up);
        probe_rows(c, M, l, DSD_CP_FFN_GATE_UP, DSD_SUB_FFN_GATE, c->gate, ff, ff);
        probe_rows(c, M, l, DSD_CP_FFN_GATE_UP, DSD_SUB_FFN_UP, c->up, ff, ff);
        ds_swiglu(VAR(DS_FAM_SWIGLU), M, ff, c->gate, c->up, c->h, c->pool);
        probe_rows(c, M, l, DSD_CP_FFN_ACT, DSD_SUB_ALL, c->h, ff, ff);
        matmul(c, decode, &L->w_down, M, c->h, c->o);
        probe_rows(c, M, l, DSD_CP_FFN_DOWN, DSD_SUB_ALL, c->o, d, d);

        /* residual, fused with the next norm: the next layer's attn_norm, or
         * the final output_norm after the last layer */
        const float *next_norm = l + 1 < hp->n_layer ? m->layers[l + 1].attn_norm : m->output_norm;
        ds_residual(VAR(DS_FAM_RESIDUAL), VAR(DS_FAM_RMSNORM), M, d, c->x, c->o, next_norm, eps, c->xn, c->pool);
        probe_rows(c, M, l, DSD_CP_LAYER_OUT, DSD_SUB_ALL, c->x, d, d);

        /* taps: the raw residual stream leaving layer l */
        if (tap_i < c->n_taps && c->tap_layers[tap_i] == l) {
            if (taps)
                for (int r = 0; r < M; r++)
                    memcpy(taps + (size_t)r * taps_stride + (size_t)tap_i * d, c->x + (size_t)r * d, (size_t)d * sizeof(float));
            probe_rows(c, M, l, DSD_CP_TAP, DSD_SUB_ALL, c->x, d, d);
            tap_i++;
        }
    }
    probe_rows(c, M, DSD_LAYER_POST, DSD_CP_FINAL_NORM, DSD_SUB_ALL, c->xn, d, d);
}

static int check_run(const ds_ctx *c, const int32_t *tokens, int M, int pos0, char *err, size_t errlen) {
    if (M < 1) { ds_errf(err, errlen, "forward: batch of %d tokens (need at least 1)", M); return -1; }
    if (pos0 < 0 || pos0 > c->n_past) {
        ds_errf(err, errlen, "forward: position %d is not in [0, n_past=%d]", pos0, c->n_past);
        return -1;
    }
    if ((int64_t)pos0 + M > c->n_ctx) {
        ds_errf(err, errlen, "forward: positions %d..%d exceed the context size %d", pos0, pos0 + M - 1, c->n_ctx);
        return -1;
    }
    for (int i = 0; i < M; i++)
        if (tokens[i] < 0 || tokens[i] >= c->m->hp.n_vocab) {
            ds_errf(err, errlen, "forward: token id %d is out of range [0, %d)", tokens[i], c->m->hp.n_vocab);
            return -1;
        }
    return 0;
}

/* Logits for `rows` rows of c->xn starting at row r0 of the chunk. */
static void logits_rows(ds_ctx *c, int decode, int r0, int rows, float *out) {
    const ds_model *m = c->m;
    matmul(c, decode, &m->output, rows, c->xn + (size_t)r0 * m->hp.n_embd, out);
    if (c->probe)
        for (int r = 0; r < rows; r++)
            c->probe(c->probe_user, c->pos[r0 + r], DSD_LAYER_POST, DSD_CP_LOGITS, DSD_SUB_ALL,
                     out + (size_t)r * m->hp.n_vocab, (size_t)m->hp.n_vocab);
}

static int run(ds_ctx *c, int decode, const int32_t *tokens, int M, int pos0, int logits_mode,
               float *logits, float *taps, char *err, size_t errlen) {
    if (check_run(c, tokens, M, pos0, err, errlen)) return -1;
    const int V = c->m->hp.n_vocab, taps_stride = c->n_taps * c->m->hp.n_embd;
    for (int done = 0; done < M;) {
        int n = M - done < c->m_max ? M - done : c->m_max;
        forward_chunk(c, decode, tokens + done, n, pos0 + done, taps ? taps + (size_t)done * taps_stride : NULL, taps_stride);
        if (logits_mode == DS_LOGITS_ALL) logits_rows(c, decode, 0, n, logits + (size_t)done * V);
        else if (logits_mode == DS_LOGITS_LAST && done + n == M) logits_rows(c, decode, n - 1, 1, logits);
        done += n;
    }
    c->n_past = pos0 + M;
    return 0;
}

int ds_decode(ds_ctx *c, int32_t token, int pos, float *logits, float *taps, char *err, size_t errlen) {
    return run(c, 1, &token, 1, pos, logits ? DS_LOGITS_LAST : DS_LOGITS_NONE, logits, taps, err, errlen);
}

int ds_forward_batch(ds_ctx *c, const int32_t *tokens, int M, int pos0, int logits_mode, float *logits,
                     float *taps, char *err, size_t errlen) {
    if (logits_mode != DS_LOGITS_NONE && !logits) {
        ds_errf(err, errlen, "forward: logits requested but no buffer given");
        return -1;
    }
    return run(c, 0, tokens, M, pos0, logits_mode, logits, taps, err, errlen);
}

/* ========================================================================
 * State snapshots
 * ===================================================================== */

int ds_state_save(const ds_ctx *c, ds_state *s) {
    const ds_hparams *hp = &c->m->hp;
    size_t kvd = (size_t)hp->n_head_kv * hp->head_dim;
    s->n_past = c->n_past;
    s->n_floats = (size_t)hp->n_layer * (size_t)c->n_past * kvd;
    s->k = malloc(s->n_floats * sizeof(float) + 1);
    s->v = malloc(s->n_floats * sizeof(float) + 1);
    if (!s->k || !s->v) { free(s->k); free(s->v); s->k = s->v = NULL; return -1; }
    for (int l = 0; l < hp->n_layer; l++) {
        size_t src = (size_t)l * c->n_ctx * kvd, dst = (size_t)l * c->n_past * kvd;
        memcpy(s->k + dst, c->k_cache + src, (size_t)c->n_past * kvd * sizeof(float));
        memcpy(s->v + dst, c->v_cache + src, (size_t)c->n_past * kvd * sizeof(float));
    }
    return 0;
}

int ds_state_restore(ds_ctx *c, const ds_state *s) {
    const ds_hparams *hp = &c->m->hp;
    size_t kvd = (size_t)hp->n_head_kv * hp->head_dim;
    if (s->n_past > c->n_ctx) return -1;
    for (int l = 0; l < hp->n_layer; l++) {
        size_t dst = (size_t)l * c->n_ctx * kvd, src = (size_t)l * s->n_past * kvd;
        memcpy(c->k_cache + dst, s->k + src, (size_t)s->n_past * kvd * sizeof(float));
        memcpy(c->v_cache + dst, s->v + src, (size_t)s->n_past * kvd * sizeof(float));
    }
    c->n_past = s->n_past;
    return 0;
}

void ds_state_free(ds_state *s) {
    free(s->k); free(s->v);
    s->k = s->v = NULL;
}

/* ========================================================================
 * Context accessors (the opaque-context seam: callers outside model.c use
 * these instead of ds_ctx fields)
 * ===================================================================== */

void ds_ctx_set_kernels(ds_ctx *c, const ds_kernel_set *ks) { c->ks = *ks; }
void ds_ctx_get_kernels(const ds_ctx *c, ds_kernel_set *ks) { *ks = c->ks; }
int  ds_ctx_n_ctx(const ds_ctx *c) { return c->n_ctx; }
int  ds_ctx_n_past(const ds_ctx *c) { return c->n_past; }
int  ds_ctx_set_n_past(ds_ctx *c, int n_past) {
    if (n_past < 0 || n_past > c->n_ctx) return -1;
    c->n_past = n_past;
    return 0;
}
