/* test_model_load.c — the model loader rejects bad files with one clear line:
 * unknown architecture, missing hyper-parameters, missing tensors, shape and
 * type mismatches, inconsistent heads. Each bad file is derived from a valid
 * make-model file by copying it through the GGUF writer with one change. */
#include "testutil.h"
#include "gguf.h"
#include "model.h"
#include "model_make.h"

typedef struct {
    const char *skip_key;      /* metadata key to drop (NULL: none)         */
    const char *set_arch;      /* replace general.architecture              */
    const char *drop_tensor;   /* tensor to leave out                       */
    const char *reshape;       /* tensor whose ne[1] gets +1 row           */
    const char *set_u32_key;   /* set a u32 key to a value                  */
    uint32_t    set_u32_val;
    const char *set_u32_key2;  /* and a second one                          */
    uint32_t    set_u32_val2;
    const char *poke_i32;      /* an I32 tensor whose first entry becomes poke_val */
    int32_t     poke_val;
    const char *set_str_key;   /* set a string key                          */
    const char *set_str_val;
    const char *set_f32_key;   /* set an f32 key                            */
    float       set_f32_val;
    /* add a 1-D rope_freqs.weight: add_ff_n values of add_ff_val (entry 0:
     * add_ff_first), stored as add_ff_type (0 with add_ff_n 0: none) */
    int         add_ff_n;
    uint32_t    add_ff_type;
    float       add_ff_val, add_ff_first;
} mutation;

static int derive(const char *src, const char *dst, const mutation *mu) {
    char err[DS_ERRLEN];
    gguf_ctx *g = gguf_open(src, err, sizeof err);
    if (!g) return -1;
    gguf_writer *w = gguf_writer_new();
    const char *skip[8] = { NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL };
    int ns = 0;
    if (mu->skip_key) skip[ns++] = mu->skip_key;
    if (mu->set_arch) skip[ns++] = "general.architecture";
    if (mu->set_u32_key) skip[ns++] = mu->set_u32_key;
    if (mu->set_u32_key2) skip[ns++] = mu->set_u32_key2;
    if (mu->set_str_key) skip[ns++] = mu->set_str_key;
    if (mu->set_f32_key) skip[ns++] = mu->set_f32_key;
    gguf_copy_kv(w, g, skip);
    if (mu->set_str_key) gguf_set_str(w, mu->set_str_key, mu->set_str_val);
    if (mu->set_f32_key) gguf_set_f32(w, mu->set_f32_key, mu->set_f32_val);
    if (mu->set_arch) gguf_set_str(w, "general.architecture", mu->set_arch);
    if (mu->set_u32_key) gguf_set_u32(w, mu->set_u32_key, mu->set_u32_val);
    if (mu->set_u32_key2) gguf_set_u32(w, mu->set_u32_key2, mu->set_u32_val2);
    for (uint64_t i = 0; i < gguf_n_tensors(g); i++) {
        const gguf_tensor *t = gguf_tensor_at(g, i);
        if (mu->drop_tensor && !strcmp(t->name, mu->drop_tensor)) continue;
        if (mu->reshape && !strcmp(t->name, mu->reshape)) {
            uint64_t ne[4] = { t->ne[0], t->ne[1] + 1, 1, 1 };
            int ok;
            uint64_t rb = ds_row_bytes(t->type, ne[0], &ok);
            void *buf = calloc(1, rb * ne[1]);
            memcpy(buf, t->data, t->nbytes);
            gguf_add_tensor(w, t->name, t->type, t->n_dims, ne, buf, rb * ne[1]);
            free(buf);
            continue;
        }
        if (mu->poke_i32 && !strcmp(t->name, mu->poke_i32)) {
            void *buf = malloc(t->nbytes);
            memcpy(buf, t->data, t->nbytes);
            memcpy(buf, &mu->poke_val, sizeof mu->poke_val);
            gguf_add_tensor(w, t->name, t->type, t->n_dims, t->ne, buf, t->nbytes);
            free(buf);
            continue;
        }
        gguf_add_tensor(w, t->name, t->type, t->n_dims, t->ne, t->data, t->nbytes);
    }
    if (mu->add_ff_n > 0) {
        float v[1024];
        uint16_t h[1024];
        for (int i = 0; i < mu->add_ff_n && i < 1024; i++) v[i] = i ? mu->add_ff_val : mu->add_ff_first;
        const uint64_t ne[1] = { (uint64_t)mu->add_ff_n };
        if (mu->add_ff_type == DS_TYPE_F16) {
            for (int i = 0; i < mu->add_ff_n && i < 1024; i++) h[i] = 0x3c00;   /* 1.0 */
            gguf_add_tensor(w, "rope_freqs.weight", DS_TYPE_F16, 1, ne, h, (uint64_t)mu->add_ff_n * 2);
        } else {
            gguf_add_tensor(w, "rope_freqs.weight", DS_TYPE_F32, 1, ne, v, (uint64_t)mu->add_ff_n * 4);
        }
    }
    int rc = gguf_writer_write(w, dst, err, sizeof err);
    gguf_writer_free(w);
    gguf_close(g);
    return rc;
}

static void expect_fail(const char *dir, const char *src, const char *name, const mutation *mu, const char *keyword) {
    char dst[512], err[DS_ERRLEN] = "";
    snprintf(dst, sizeof dst, "%s/%s.gguf", dir, name);
    if (derive(src, dst, mu)) { CHECK(0, "%s: could not derive the bad file", name); return; }
    ds_model *m = ds_model_load(dst, err, sizeof err);
    int ok = m == NULL && strstr(err, keyword) && !strchr(err, '\n');
    CHECK(ok, "%s: expected an error containing '%s', got %s '%s'", name, keyword, m ? "a model" : "error", err);
    printf("%s %s: %s\n", ok ? "PASS" : "FAIL", name, err);
    ds_model_free(m);
}

int main(void) {
    char dir[256], src[512], err[DS_ERRLEN];
    tu_tmpdir(dir, sizeof dir);
    snprintf(src, sizeof src, "%s/good.gguf", dir);
    ds_make_model_opts o;
    ds_make_model_defaults(&o);
    o.n_embd = 64; o.n_layer = 2; o.n_head = 4; o.n_head_kv = 2; o.n_ff = 128; o.n_vocab = 300;
    CHECK(ds_make_model(&o, src, err, sizeof err) == 0, "make: %s", err);
    ds_model *m = ds_model_load(src, err, sizeof err);
    CHECK(m != NULL, "good model fails to load: %s", err);
    CHECK(m && m->output_tied && m->output.data == m->tok_embd.data, "tied output must share token_embd's memory");
    ds_model_free(m);

    mutation mu;
#define MU(...) (mu = (mutation){ __VA_ARGS__ }, &mu)
    expect_fail(dir, src, "unknown_arch", MU(.set_arch = "gpt-neox"), "unknown architecture");
    expect_fail(dir, src, "no_arch", MU(.skip_key = "general.architecture"), "general.architecture");
    expect_fail(dir, src, "no_block_count", MU(.skip_key = "qwen3.block_count"), "block_count");
    expect_fail(dir, src, "missing_tensor", MU(.drop_tensor = "blk.1.ffn_up.weight"), "missing tensor 'blk.1.ffn_up.weight'");
    expect_fail(dir, src, "missing_qnorm", MU(.drop_tensor = "blk.0.attn_q_norm.weight"), "attn_q_norm");
    expect_fail(dir, src, "missing_embd", MU(.drop_tensor = "token_embd.weight"), "token_embd");
    expect_fail(dir, src, "shape_mismatch", MU(.reshape = "blk.0.attn_k.weight"), "has shape");
    expect_fail(dir, src, "heads_not_multiple", MU(.set_u32_key = "qwen3.attention.head_count_kv", .set_u32_val = 3), "multiple");
    expect_fail(dir, src, "zero_layers", MU(.set_u32_key = "qwen3.block_count", .set_u32_val = 0), "positive");
    expect_fail(dir, src, "huge_embd", MU(.set_u32_key = "qwen3.embedding_length", .set_u32_val = 0xfffffff0u), "out of range");
    expect_fail(dir, src, "extra_layers", MU(.set_u32_key = "qwen3.block_count", .set_u32_val = 3), "block_count 3 needs");
    /* validate before allocating: a huge count is refused against the file
     * (no multi-GB arena first), a head product must not overflow an int */
    expect_fail(dir, src, "huge_block_count", MU(.set_u32_key = "qwen3.block_count", .set_u32_val = 1u << 30),
                "block_count 1073741824 needs");
    expect_fail(dir, src, "head_product_overflow", MU(.set_u32_key = "qwen3.attention.key_length", .set_u32_val = 1u << 30,
                                                      .set_u32_key2 = "qwen3.attention.value_length", .set_u32_val2 = 1u << 30),
                "out of range");
    /* rope scaling (qwen3 / llama: the whole RoPE): linear and yarn load
     * with llama.cpp's constants; an unknown type (longrope) is one line;
     * rope_freqs.weight is llama's, F32 of head_dim/2 finite values > 0 */
    {
        char ok_f[512];
        const float nan = 0.0f / 0.0f, inf = 1.0f / 0.0f;
        snprintf(ok_f, sizeof ok_f, "%s/yarn_ok.gguf", dir);
        CHECK(derive(src, ok_f, MU(.set_str_key = "qwen3.rope.scaling.type", .set_str_val = "yarn",
                                   .set_f32_key = "qwen3.rope.scaling.factor", .set_f32_val = 4.0f)) == 0, "derive yarn");
        m = ds_model_load(ok_f, err, sizeof err);
        const ds_rope_yarn *y = m ? &m->hp.rope_yarn : NULL;
        /* ramp over n_ctx 2048 orig, head_dim 16, base 10000: ggml_rope_yarn_corr_dims */
        float dims[2];
        ds_rope_yarn_dims(16, m ? m->hp.n_ctx_train : 0, 10000.0f, 32.0f, 1.0f, dims);
        CHECK(m && m->hp.rope_scaled && y->freq_scale == 0.25f && y->ext_factor == 1.0f && y->lo == dims[0] &&
              y->hi == dims[1] && y->mscale > 1.13f && y->mscale < 1.14f && !y->freq_factors,
              "qwen3 yarn file: %s (scaled %d, freq_scale %g, ext %g, mscale %g)", m ? "loaded" : err, m ? m->hp.rope_scaled : -1,
              y ? (double)y->freq_scale : 0.0, y ? (double)y->ext_factor : 0.0, y ? (double)y->mscale : 0.0);
        printf("%s qwen3_yarn loads: freq_scale 0.25, ramp %g..%g, mscale %.6f\n", m ? "PASS" : "FAIL", (double)dims[0],
               (double)dims[1], y ? (double)y->mscale : 0.0);
        ds_model_free(m);
        CHECK(derive(src, ok_f, MU(.set_str_key = "qwen3.rope.scaling.type", .set_str_val = "linear",
                                   .set_f32_key = "qwen3.rope.scaling.factor", .set_f32_val = 2.0f)) == 0, "derive linear");
        m = ds_model_load(ok_f, err, sizeof err);
        y = m ? &m->hp.rope_yarn : NULL;
        CHECK(m && m->hp.rope_scaled && y->freq_scale == 0.5f && y->ext_factor == 0.0f && y->mscale == 1.0f,
              "qwen3 linear file: %s", m ? "wrong constants" : err);
        ds_model_free(m);
        /* type "none" with a factor, and the plain file: unscaled */
        CHECK(derive(src, ok_f, MU(.set_str_key = "qwen3.rope.scaling.type", .set_str_val = "none",
                                   .set_f32_key = "qwen3.rope.scaling.factor", .set_f32_val = 2.0f)) == 0, "derive none");
        m = ds_model_load(ok_f, err, sizeof err);
        CHECK(m && !m->hp.rope_scaled, "qwen3 'none' file: %s", m ? "scaled" : err);
        ds_model_free(m);
        m = ds_model_load(src, err, sizeof err);
        CHECK(m && !m->hp.rope_scaled, "the plain file is scaled");
        ds_model_free(m);
        printf("PASS qwen3 linear / none / plain rope scaling constants\n");
        expect_fail(dir, src, "qwen3_rope_freqs", MU(.add_ff_n = 8, .add_ff_val = 2.0f, .add_ff_first = 1.0f),
                    "frequency factors are a llama tensor");

        char lsrc[512];
        snprintf(lsrc, sizeof lsrc, "%s/llama.gguf", dir);
        ds_make_model_opts q = o;
        q.arch = "llama";
        CHECK(ds_make_model(&q, lsrc, err, sizeof err) == 0, "make llama: %s", err);
        CHECK(derive(lsrc, ok_f, MU(.add_ff_n = 8, .add_ff_val = 8.0f, .add_ff_first = 1.0f)) == 0, "derive llama ff");
        m = ds_model_load(ok_f, err, sizeof err);
        y = m ? &m->hp.rope_yarn : NULL;
        CHECK(m && m->hp.rope_scaled && y->freq_factors == m->hp.rope_ff && m->hp.rope_ff[0] == 1.0f &&
              m->hp.rope_ff[7] == 8.0f && y->freq_scale == 1.0f && y->ext_factor == 0.0f && y->mscale == 1.0f,
              "llama rope_freqs file: %s", m ? "wrong factors" : err);
        printf("%s llama rope_freqs loads (8 factors, no scaling)\n", m ? "PASS" : "FAIL");
        ds_model_free(m);
        expect_fail(dir, lsrc, "rope_freqs_f16", MU(.add_ff_n = 8, .add_ff_type = DS_TYPE_F16), "must be F32 of 8 values");
        expect_fail(dir, lsrc, "rope_freqs_short", MU(.add_ff_n = 7, .add_ff_val = 1.0f, .add_ff_first = 1.0f),
                    "must be F32 of 8 values");
        expect_fail(dir, lsrc, "rope_freqs_long", MU(.add_ff_n = 16, .add_ff_val = 1.0f, .add_ff_first = 1.0f),
                    "must be F32 of 8 values");
        expect_fail(dir, lsrc, "rope_freqs_zero", MU(.add_ff_n = 8, .add_ff_val = 1.0f, .add_ff_first = 0.0f),
                    "rope_freqs.weight[0] = 0");
        expect_fail(dir, lsrc, "rope_freqs_negative", MU(.add_ff_n = 8, .add_ff_val = -2.0f, .add_ff_first = 1.0f),
                    "rope_freqs.weight[1] = -2");
        expect_fail(dir, lsrc, "rope_freqs_nan", MU(.add_ff_n = 8, .add_ff_val = nan, .add_ff_first = 1.0f),
                    "must be finite and > 0");
        expect_fail(dir, lsrc, "rope_freqs_inf", MU(.add_ff_n = 8, .add_ff_val = 1.0f, .add_ff_first = inf),
                    "must be finite and > 0");
        expect_fail(dir, lsrc, "llama_longrope", MU(.set_str_key = "llama.rope.scaling.type", .set_str_val = "longrope",
                                                    .set_f32_key = "llama.rope.scaling.factor", .set_f32_val = 4.0f),
                    "'longrope' is not supported");
        expect_fail(dir, lsrc, "attn_factor_negative", MU(.set_f32_key = "llama.rope.scaling.attn_factor", .set_f32_val = -1.0f),
                    "attn_factor");
    }
    expect_fail(dir, src, "rope_scaling_unknown", MU(.set_str_key = "qwen3.rope.scaling.type", .set_str_val = "longrope"),
                "is not supported");
    /* file bytes in an error are sanitised: one line, no escape sequence */
    expect_fail(dir, src, "arch_control_bytes", MU(.set_arch = "qw\n\x1b[31men"), "unknown architecture 'qw??[31men'");

    /* deepseek4's hash layers: the expert table is I32 [k, n_vocab], every
     * entry an expert; a good file loads, each broken one is one line */
    {
        char ds4[512];
        snprintf(ds4, sizeof ds4, "%s/ds4-hash.gguf", dir);
        ds_make_model_opts q;
        ds_make_model_defaults(&q);
        q.arch = "deepseek4"; q.type = DS_TYPE_F32;
        q.n_embd = 64; q.n_layer = 2; q.n_head = 4; q.head_dim = 64; q.n_rot = 16; q.q_lora = 32; q.o_lora = 16;
        q.n_expert = 8; q.n_expert_used = 2; q.n_ff_exp = 32; q.n_vocab = 300; q.n_hash = 1; q.seed = 3;
        CHECK(ds_make_model(&q, ds4, err, sizeof err) == 0, "make deepseek4 with a hash layer: %s", err);
        m = ds_model_load(ds4, err, sizeof err);
        CHECK(m && m->layers[0].tid2eid && !m->layers[1].tid2eid, "deepseek4 hash layer: %s", m ? "table not where expected" : err);
        if (m) printf("PASS deepseek4 hash layer loads (layer 0 routes by token id, layer 1 selects)\n");
        /* the route reads the table: a copy of it gives the same logits, a
         * table sending token 7 to other experts gives other logits */
        if (m && m->layers[0].tid2eid) {
            const int V = m->hp.n_vocab, k = 2, tok = 7;
            int32_t *copy = malloc((size_t)V * k * sizeof *copy), *other = malloc((size_t)V * k * sizeof *other);
            float *l0 = malloc((size_t)V * sizeof *l0), *l1 = malloc((size_t)V * sizeof *l1), *l2 = malloc((size_t)V * sizeof *l2);
            memcpy(copy, m->layers[0].tid2eid, (size_t)V * k * sizeof *copy);
            memcpy(other, copy, (size_t)V * k * sizeof *other);
            for (int j = 0; j < k; j++) other[tok * k + j] = (copy[tok * k + j] + 1 + j) % 8;
            if (other[tok * k] == other[tok * k + 1]) other[tok * k + 1] = (other[tok * k + 1] + 1) % 8;
            const int32_t *orig = m->layers[0].tid2eid;
            float *outs[3] = {l0, l1, l2};
            const int32_t *tabs[3] = {orig, copy, other};
            int ran = 1;
            for (int i = 0; i < 3 && ran; i++) {
                m->layers[0].tid2eid = tabs[i];
                ds_ctx *hc = ds_ctx_new(m, 16, 1, err, sizeof err);
                ran = hc && ds_decode(hc, tok, 0, outs[i], NULL, err, sizeof err) == 0;
                ds_ctx_free(hc);
            }
            m->layers[0].tid2eid = orig;
            const int same = ran && !memcmp(l0, l1, (size_t)V * sizeof *l0), moved = ran && memcmp(l0, l2, (size_t)V * sizeof *l0) != 0;
            CHECK(same && moved, "hash layer: a copy of the table %s the logits, another table %s them (%s)", same ? "keeps" : "CHANGES",
                  moved ? "changes" : "DOES NOT change", ran ? "ran" : err);
            if (same && moved) printf("PASS deepseek4 hash route reads the table (copy: same logits; token %d's experts moved: other logits)\n", tok);
            free(copy); free(other); free(l0); free(l1); free(l2);
        }
        ds_model_free(m);
        q.n_hash = 3;
        CHECK(ds_make_model(&q, ds4, err, sizeof err) != 0 && strstr(err, "hash layers"), "make-model took 3 hash layers of 2");
        q.n_hash = 1;
        CHECK(ds_make_model(&q, ds4, err, sizeof err) == 0, "make deepseek4 again: %s", err);
        expect_fail(dir, ds4, "hash_expert_out_of_range", MU(.poke_i32 = "blk.0.ffn_gate_tid2eid.weight", .poke_val = 8),
                    "outside [0, 8)");
        expect_fail(dir, ds4, "hash_expert_negative", MU(.poke_i32 = "blk.0.ffn_gate_tid2eid.weight", .poke_val = -1),
                    "outside [0, 8)");
        expect_fail(dir, ds4, "hash_table_missing", MU(.drop_tensor = "blk.0.ffn_gate_tid2eid.weight"),
                    "missing tensor 'blk.0.ffn_gate_tid2eid.weight'");
        expect_fail(dir, ds4, "hash_table_shape", MU(.reshape = "blk.0.ffn_gate_tid2eid.weight"), "must be I32 [2, 300]");
        expect_fail(dir, ds4, "ds4_rope_freqs", MU(.add_ff_n = 16, .add_ff_val = 1.0f, .add_ff_first = 1.0f),
                    "frequency factors are a llama tensor");
        expect_fail(dir, ds4, "hash_layer_count_high", MU(.set_u32_key = "deepseek4.hash_layer_count", .set_u32_val = 3),
                    "exceeds the 2 trunk layers");
    }

    /* taps validation keeps the previous list on error */
    m = ds_model_load(src, err, sizeof err);
    ds_ctx *c = m ? ds_ctx_new(m, 32, 1, err, sizeof err) : NULL;
    if (c) {
        int good[2] = { 0, 1 }, bad_order[2] = { 1, 0 }, bad_range[1] = { 2 };
        CHECK(ds_set_taps(c, good, 2, err, sizeof err) == 0, "valid taps rejected: %s", err);
        CHECK(ds_set_taps(c, bad_order, 2, err, sizeof err) != 0 && strstr(err, "increasing"), "non-increasing taps accepted");
        CHECK(ds_set_taps(c, bad_range, 1, err, sizeof err) != 0 && strstr(err, "range"), "out-of-range tap accepted");
        CHECK(ds_ctx_n_taps(c) == 2 && ds_ctx_tap_layers(c)[0] == 0 && ds_ctx_tap_layers(c)[1] == 1, "invalid tap list changed the previous one");
        CHECK(ds_ctx_new(m, 100000, 1, err, sizeof err) == NULL && strstr(err, "-c"), "n_ctx beyond the model's context accepted");
        int32_t bad_tok = 100000;
        CHECK(ds_decode(c, bad_tok, 0, NULL, NULL, err, sizeof err) != 0 && strstr(err, "token id"), "out-of-range token accepted");
        CHECK(ds_decode(c, 1, 5, NULL, NULL, err, sizeof err) != 0 && strstr(err, "position"), "position beyond n_past accepted");
        printf("PASS taps and run-argument validation\n");
    }
    ds_ctx_free(c);
    ds_model_free(m);
    tu_rmdir(dir);
    return tu_finish("test_model_load");
}
