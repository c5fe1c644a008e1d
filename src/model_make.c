/* model_make.c — deterministic random-weight Qwen3 / Llama GGUF files with a
 * small byte-level BPE tokenizer trained on built-in text. Same options ->
 * same bytes. Used by `dspark make-model`, tests (every weight type) and
 * benchmarks (a fixed parameter count). */
#include "model_make.h"
#include "gguf.h"
#include "tokenizer.h"
#include "kernels/kernels.h"
#include "kernels/dsmath.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* Training text for the tokenizer: plain prose written for dspark. */
static const char k_text[] =
    "The speculative decoder drafts a block of tokens, and the target model checks them all at once. "
    "When the draft agrees with the target, several tokens are committed for the price of one pass. "
    "When it does not, the first disagreement is replaced by the target's own choice, and the loop goes on. "
    "A careful engine must give the same text whether it decodes one token at a time or verifies a block. "
    "That promise is only as good as the arithmetic underneath it: the order in which numbers are added, "
    "the way a matrix is split between threads, and the rounding of every intermediate value. "
    "If the batched kernel adds in a different order than the single-row kernel, the last bits differ, "
    "a near tie between two words can flip, and from then on the two stories never meet again. "
    "So every operator here has a canonical batched form whose rows are computed exactly as decode computes them. "
    "The diagnostics capture named checkpoints in both passes and report the first place where the bits part. "
    "In the morning the river was quiet, and the boats waited by the old stone bridge. "
    "She opened the window, looked at the hills, and said that the weather would turn before noon. "
    "He counted the coins twice, wrote the number in the book, and closed it with a sigh. "
    "Numbers such as 3, 14, 159, 2653 and 58979 appear in tables; dates like 1811-10-30 appear in letters. "
    "def forward(self, x):\n    h = self.norm(x)\n    return x + self.mlp(h)\n\n"
    "for i in range(10):\n    print(i * i)\n\n"
    "Questions? Answers! Lists: apples, pears, plums; and quotes \"like this\" or 'like that'.\n";

typedef struct {
    gguf_writer *w;
    uint64_t r;                 /* ds_splitmix64 state */
    uint32_t type;
    int failed;
} builder;

/* A 2-D weight [n_out][n_in] with uniform values of the given scale, stored
 * in the requested type (norms and 1-D tensors stay F32). */
static void add_matrix(builder *b, const char *name, int64_t n_in, int64_t n_out, float scale, uint32_t type) {
    size_t n = (size_t)n_in * (size_t)n_out;
    float *f = malloc(n * sizeof(float));
    if (!f) { b->failed = 1; return; }
    for (size_t i = 0; i < n; i++) f[i] = ds_uniform_pm1(&b->r) * scale;
    int ok;
    uint64_t rb = ds_row_bytes(type, (uint64_t)n_in, &ok);
    void *data = ok ? malloc(rb * (uint64_t)n_out) : NULL;
    if (!data) { free(f); b->failed = 1; return; }
    ds_f32_to_type(type, f, (int64_t)n, data);
    uint64_t ne[2] = { (uint64_t)n_in, (uint64_t)n_out };
    if (gguf_add_tensor(b->w, name, type, 2, ne, data, rb * (uint64_t)n_out)) b->failed = 1;
    free(data);
    free(f);
}

/* A 3-D stack of n_exp [n_out][n_in] matrices (llama.cpp's ffn_*_exps),
 * each row quantized as a row of a 2-D weight would be. */
static void add_experts(builder *b, const char *name, int64_t n_in, int64_t n_out, int64_t n_exp, float scale,
                        uint32_t type) {
    size_t n = (size_t)n_in * (size_t)n_out * (size_t)n_exp;
    float *f = malloc(n * sizeof(float));
    int ok;
    uint64_t rb = ds_row_bytes(type, (uint64_t)n_in, &ok);
    void *data = f && ok ? malloc(rb * (uint64_t)n_out * (uint64_t)n_exp) : NULL;
    if (!data) { free(f); b->failed = 1; return; }
    for (size_t i = 0; i < n; i++) f[i] = ds_uniform_pm1(&b->r) * scale;
    for (int64_t r = 0; r < n_out * n_exp; r++)
        ds_f32_to_type(type, f + (size_t)r * (size_t)n_in, n_in, (unsigned char *)data + (size_t)r * rb);
    uint64_t ne[3] = { (uint64_t)n_in, (uint64_t)n_out, (uint64_t)n_exp };
    if (gguf_add_tensor(b->w, name, type, 3, ne, data, rb * (uint64_t)n_out * (uint64_t)n_exp)) b->failed = 1;
    free(data);
    free(f);
}

static void add_norm(builder *b, const char *name, int64_t n) {
    float *f = malloc((size_t)n * sizeof(float));
    if (!f) { b->failed = 1; return; }
    for (int64_t i = 0; i < n; i++) f[i] = 1.0f + 0.1f * ds_uniform_pm1(&b->r);
    uint64_t ne[1] = { (uint64_t)n };
    if (gguf_add_tensor(b->w, name, DS_TYPE_F32, 1, ne, f, (uint64_t)n * 4)) b->failed = 1;
    free(f);
}

/* One qwen35 block in llama.cpp's names: a gated delta net (recur) or a
 * gated full-attention mixer, then the SwiGLU FFN. */
static void add_hybrid_layer(builder *b, long l, int recur, long d, long nh, long nkv, long hd, long ff, long K, long S,
                             long Hv, long C) {
    char n[96];
#define NM(s) (snprintf(n, sizeof n, "blk.%ld." s, l), n)
    const float sd = sqrtf(3.0f / (float)d);
    const uint32_t t = b->type;
    add_norm(b, NM("attn_norm.weight"), d);
    add_norm(b, NM("post_attention_norm.weight"), d);
    if (recur) {
        const long vd = Hv * S;
        add_matrix(b, NM("attn_qkv.weight"), d, C, sd, t);
        add_matrix(b, NM("attn_gate.weight"), d, vd, sd, t);
        add_matrix(b, NM("ssm_alpha.weight"), d, Hv, sd, t);
        add_matrix(b, NM("ssm_beta.weight"), d, Hv, sd, t);
        add_matrix(b, NM("ssm_out.weight"), vd, d, sqrtf(3.0f / (float)vd) * 0.5f, t);
        add_matrix(b, NM("ssm_conv1d.weight"), K, C, sqrtf(3.0f / (float)K), DS_TYPE_F32);
        /* dt bias around 0, A = -exp(A_log) in [-1.5, -0.5]: decays of a few
         * positions to a few hundred, as a trained model has */
        float *v = malloc((size_t)(Hv > S ? Hv : S) * sizeof(float));
        if (!v) { b->failed = 1; return; }
        const uint64_t ne[1] = {(uint64_t)Hv}, ns[1] = {(uint64_t)S};
        for (long i = 0; i < Hv; i++) v[i] = 0.5f * ds_uniform_pm1(&b->r);
        if (gguf_add_tensor(b->w, NM("ssm_dt.bias"), DS_TYPE_F32, 1, ne, v, (uint64_t)Hv * 4)) b->failed = 1;
        for (long i = 0; i < Hv; i++) v[i] = -1.0f + 0.5f * ds_uniform_pm1(&b->r);
        if (gguf_add_tensor(b->w, NM("ssm_a"), DS_TYPE_F32, 1, ne, v, (uint64_t)Hv * 4)) b->failed = 1;
        for (long i = 0; i < S; i++) v[i] = 1.0f + 0.1f * ds_uniform_pm1(&b->r);
        if (gguf_add_tensor(b->w, NM("ssm_norm.weight"), DS_TYPE_F32, 1, ns, v, (uint64_t)S * 4)) b->failed = 1;
        free(v);
    } else {
        const long qd = nh * hd, kvd = nkv * hd;
        add_matrix(b, NM("attn_q.weight"), d, 2 * qd, sd, t);
        add_matrix(b, NM("attn_k.weight"), d, kvd, sd, t);
        add_matrix(b, NM("attn_v.weight"), d, kvd, sd, t);
        add_norm(b, NM("attn_q_norm.weight"), hd);
        add_norm(b, NM("attn_k_norm.weight"), hd);
        add_matrix(b, NM("attn_output.weight"), qd, d, sqrtf(3.0f / (float)qd) * 0.5f, t);
    }
    add_matrix(b, NM("ffn_gate.weight"), d, ff, sd, t);
    add_matrix(b, NM("ffn_up.weight"), d, ff, sd, t);
    add_matrix(b, NM("ffn_down.weight"), ff, d, sqrtf(3.0f / (float)ff) * 0.5f, t);
#undef NM
}

static void add_vec(builder *b, const char *name, int64_t n, float center, float spread) {
    float *f = malloc((size_t)n * sizeof(float));
    if (!f) { b->failed = 1; return; }
    for (int64_t i = 0; i < n; i++) f[i] = center + spread * ds_uniform_pm1(&b->r);
    const uint64_t ne[1] = {(uint64_t)n};
    if (gguf_add_tensor(b->w, name, DS_TYPE_F32, 1, ne, f, (uint64_t)n * 4)) b->failed = 1;
    free(f);
}

/* A hash layer's table: token v's k distinct experts (a seeded shuffle's
 * first k), I32 [n_vocab][k] as llama.cpp's {k, n_vocab}. */
static void add_tid2eid(builder *b, const char *name, long V, long k, long E) {
    int32_t *t = malloc((size_t)V * (size_t)k * sizeof(int32_t)), *perm = malloc((size_t)E * sizeof(int32_t));
    if (!t || !perm) { free(t); free(perm); b->failed = 1; return; }
    for (long v = 0; v < V; v++) {
        for (long e = 0; e < E; e++) perm[e] = (int32_t)e;
        for (long j = 0; j < k; j++) {           /* partial Fisher-Yates: the first k */
            const long r = j + (long)(ds_splitmix64(&b->r) % (uint64_t)(E - j));
            const int32_t x = perm[j]; perm[j] = perm[r]; perm[r] = x;
            t[v * k + j] = perm[j];
        }
    }
    const uint64_t ne[2] = {(uint64_t)k, (uint64_t)V};
    if (gguf_add_tensor(b->w, name, DS_TYPE_I32, 2, ne, t, (uint64_t)V * (uint64_t)k * 4)) b->failed = 1;
    free(t); free(perm);
}

/* deepseek4 in llama.cpp's keys and names (src/models/deepseek4.cpp): raw
 * attention layers, or per layer a compressed one (attention.compress_ratios
 * 128: the compressor's kv, gate, ape and norm; 4: those twice as wide plus
 * the lightning indexer's six tensors; docs/DS4-COMPRESSED.md), the first n_hash layers
 * hash-routed, no SwiGLU clamp, one shared expert; hc_*_fn, the router and
 * the 1-D vectors F32. */
static int make_ds4(const ds_make_model_opts *o, const char *out, char *err, size_t errlen) {
    const long d = o->n_embd, nl = o->n_layer, H = o->n_head, V = o->n_vocab;
    const long hd = o->head_dim ? o->head_dim : 512, nrot = o->n_rot ? o->n_rot : (hd < 64 ? hd : 64);
    const long ql = o->q_lora ? o->q_lora : d / 2, G = o->o_groups ? o->o_groups : 2, ol = o->o_lora ? o->o_lora : 64;
    const long hc = o->hc ? o->hc : 4, it = o->hc_iters ? o->hc_iters : 20, swa = o->n_swa ? o->n_swa : 128;
    const long E = o->n_expert, k = o->n_expert_used, fe = o->n_ff_exp, mixn = (2 + hc) * hc, qd = H * hd;
    const long nih = o->n_ih ? o->n_ih : 4, ihd = o->ihd ? o->ihd : hd, itk = o->i_top_k ? o->i_top_k : 64;
    const uint32_t t = o->type;
    const long blk = (long)ds_type_block_elems(t);
    if (d < 1 || nl < 1 || H < 1 || V < 260 || hd < 2 || hd > 1024 || hd % 2 || nrot < 2 || nrot > hd || nrot % 2 ||
        ql < 1 || G < 1 || H % G || ol < 1 || hc < 1 || hc > 16 || E < 1 || E > 1024 || k < 1 || k > E || fe < 1 ||
        o->n_hash < 0 || o->n_hash > nl || nih < 1 || ihd < 2 || ihd > 1024 || ihd % 2 || nrot > ihd || itk < 1) {
        ds_errf(err, errlen, "make-model: deepseek4 needs head dim 2..1024 even, rope dims even <= head dim, output "
                "groups dividing n_head, 1..16 hyper-connections, 1 <= experts used <= experts <= 1024 and at most "
                "n_layer hash layers, indexer heads >= 1, an even indexer dim 2..1024 >= rope dims, top-k >= 1");
        return -1;
    }
    if (o->comp_ratios && o->n_comp != nl) {
        ds_errf(err, errlen, "make-model: --compress-ratios has %ld entries, --n-layer is %ld (one ratio per layer)",
                o->n_comp, nl);
        return -1;
    }
    for (long l = 0; o->comp_ratios && l < nl; l++)
        if (o->comp_ratios[l] != 0 && o->comp_ratios[l] != 4 && o->comp_ratios[l] != 128) {
            ds_errf(err, errlen, "make-model: compress ratio %d of layer %ld is not 0, 4 or 128", o->comp_ratios[l], l);
            return -1;
        }
    if (blk > 1 && (d % blk || ql % blk || (qd / G) % blk || (G * ol) % blk || fe % blk)) {
        ds_errf(err, errlen, "make-model: %s needs n_embd, the q rank, n_head*head_dim/groups, groups*o_lora and the "
                "expert width to be multiples of %ld", ds_type_name(t), blk);
        return -1;
    }
    builder b = { gguf_writer_new(), (uint64_t)o->seed * 0x2545F4914F6CDD1Dull + 1, t, 0 };
    if (!b.w) { ds_errf(err, errlen, "make-model: out of memory"); return -1; }
    gguf_set_str(b.w, "general.architecture", "deepseek4");
    gguf_set_str(b.w, "general.name", "dspark-random");
#define K4(s) "deepseek4." s
    gguf_set_u32(b.w, K4("block_count"), (uint32_t)nl);
    gguf_set_u32(b.w, K4("context_length"), (uint32_t)o->n_ctx);
    gguf_set_u32(b.w, K4("embedding_length"), (uint32_t)d);
    gguf_set_u32(b.w, K4("feed_forward_length"), (uint32_t)fe);
    gguf_set_u32(b.w, K4("attention.head_count"), (uint32_t)H);
    gguf_set_u32(b.w, K4("attention.head_count_kv"), 1);
    gguf_set_u32(b.w, K4("attention.key_length"), (uint32_t)hd);
    gguf_set_u32(b.w, K4("attention.value_length"), (uint32_t)hd);
    gguf_set_u32(b.w, K4("rope.dimension_count"), (uint32_t)nrot);
    gguf_set_f32(b.w, K4("rope.freq_base"), o->rope_base);
    gguf_set_f32(b.w, K4("attention.layer_norm_rms_epsilon"), o->norm_eps);
    gguf_set_u32(b.w, K4("vocab_size"), (uint32_t)V);
    gguf_set_u32(b.w, K4("attention.q_lora_rank"), (uint32_t)ql);
    gguf_set_u32(b.w, K4("attention.sliding_window"), (uint32_t)swa);
    gguf_set_u32(b.w, K4("attention.output_group_count"), (uint32_t)G);
    gguf_set_u32(b.w, K4("attention.output_lora_rank"), (uint32_t)ol);
    gguf_set_f32(b.w, K4("attention.compress_rope_freq_base"), 160000.0f);
    gguf_set_u32(b.w, K4("attention.indexer.head_count"), (uint32_t)nih);
    gguf_set_u32(b.w, K4("attention.indexer.key_length"), (uint32_t)ihd);
    gguf_set_u32(b.w, K4("attention.indexer.top_k"), (uint32_t)itk);
    int32_t *ratios = calloc((size_t)nl, sizeof(int32_t));
    if (!ratios) { gguf_writer_free(b.w); ds_errf(err, errlen, "make-model: out of memory"); return -1; }
    for (long l = 0; o->comp_ratios && l < nl; l++) ratios[l] = o->comp_ratios[l];
    gguf_set_arr(b.w, K4("attention.compress_ratios"), GGUF_T_I32, ratios, (uint64_t)nl);
    free(ratios);
    gguf_set_u32(b.w, K4("expert_count"), (uint32_t)E);
    gguf_set_u32(b.w, K4("expert_used_count"), (uint32_t)k);
    gguf_set_u32(b.w, K4("expert_feed_forward_length"), (uint32_t)fe);
    gguf_set_u32(b.w, K4("expert_shared_count"), 1);
    gguf_set_f32(b.w, K4("expert_weights_scale"), 1.5f);
    gguf_set_bool(b.w, K4("expert_weights_norm"), 1);
    gguf_set_u32(b.w, K4("expert_gating_func"), 4);
    gguf_set_f32(b.w, K4("swiglu_clamp_exp"), o->swiglu_clamp);
    if (o->rope_yarn > 0.0f) {
        gguf_set_str(b.w, K4("rope.scaling.type"), "yarn");
        gguf_set_f32(b.w, K4("rope.scaling.factor"), o->rope_yarn);
        gguf_set_u32(b.w, K4("rope.scaling.original_context_length"),
                     (uint32_t)(o->rope_orig_ctx > 0 ? o->rope_orig_ctx : o->n_ctx));
    }
    gguf_set_u32(b.w, K4("hyper_connection.count"), (uint32_t)hc);
    gguf_set_u32(b.w, K4("hyper_connection.sinkhorn_iterations"), (uint32_t)it);
    gguf_set_f32(b.w, K4("hyper_connection.epsilon"), 1e-6f);
    gguf_set_u32(b.w, K4("hash_layer_count"), (uint32_t)o->n_hash);
#undef K4
    gguf_set_u32(b.w, "general.file_type", gguf_llama_ftype(t));
    gguf_set_u32(b.w, "general.quantization_version", GGUF_QUANTIZATION_VERSION);
    if (ds_tokenizer_build_bpe_padded(b.w, k_text, sizeof k_text - 1, (int32_t)(V < 1024 ? V : 1024), (int32_t)V, err,
                                      errlen)) {
        gguf_writer_free(b.w);
        return -1;
    }
    const float sd = sqrtf(3.0f / (float)d), shc = sqrtf(3.0f / (float)(hc * d));
    add_matrix(&b, "token_embd.weight", d, V, 1.0f, t);
    add_norm(&b, "output_norm.weight", d);
    add_matrix(&b, "output.weight", d, V, sd * 3.0f, t);
    add_matrix(&b, "output_hc_fn.weight", hc * d, hc, shc, DS_TYPE_F32);
    add_vec(&b, "output_hc_base.weight", hc, 0.0f, 0.5f);
    add_vec(&b, "output_hc_scale.weight", 1, 1.0f, 0.1f);
    for (long l = 0; l < nl && !b.failed; l++) {
        char n[96];
#define NM(s) (snprintf(n, sizeof n, "blk.%ld." s, l), n)
        add_norm(&b, NM("attn_norm.weight"), d);
        add_vec(&b, NM("attn_sinks.weight"), H, 0.0f, 1.0f);
        add_matrix(&b, NM("attn_q_a.weight"), d, ql, sd, t);
        add_norm(&b, NM("attn_q_a_norm.weight"), ql);
        add_matrix(&b, NM("attn_q_b.weight"), ql, qd, sqrtf(3.0f / (float)ql), t);
        add_matrix(&b, NM("attn_kv.weight"), d, hd, sd, t);
        add_norm(&b, NM("attn_kv_a_norm.weight"), hd);
        add_experts(&b, NM("attn_output_a.weight"), qd / G, ol, G, sqrtf(3.0f / (float)(qd / G)), t);
        add_matrix(&b, NM("attn_output_b.weight"), G * ol, d, sqrtf(3.0f / (float)(G * ol)) * 0.5f, t);
        add_matrix(&b, NM("hc_attn_fn.weight"), hc * d, mixn, shc, DS_TYPE_F32);
        add_vec(&b, NM("hc_attn_base.weight"), mixn, 0.0f, 0.5f);
        add_vec(&b, NM("hc_attn_scale.weight"), 3, 1.0f, 0.1f);
        add_matrix(&b, NM("hc_ffn_fn.weight"), hc * d, mixn, shc, DS_TYPE_F32);
        add_vec(&b, NM("hc_ffn_base.weight"), mixn, 0.0f, 0.5f);
        add_vec(&b, NM("hc_ffn_scale.weight"), 3, 1.0f, 0.1f);
        add_norm(&b, NM("ffn_norm.weight"), d);
        add_matrix(&b, NM("ffn_gate_inp.weight"), d, E, sd * 2.0f, DS_TYPE_F32);
        add_vec(&b, NM("exp_probs_b.bias"), E, 0.0f, 0.1f);
        add_experts(&b, NM("ffn_gate_exps.weight"), d, fe, E, sd, t);
        add_experts(&b, NM("ffn_up_exps.weight"), d, fe, E, sd, t);
        add_experts(&b, NM("ffn_down_exps.weight"), fe, d, E, sqrtf(3.0f / (float)fe) * 0.5f, t);
        add_matrix(&b, NM("ffn_gate_shexp.weight"), d, fe, sd, t);
        add_matrix(&b, NM("ffn_up_shexp.weight"), d, fe, sd, t);
        add_matrix(&b, NM("ffn_down_shexp.weight"), fe, d, sqrtf(3.0f / (float)fe) * 0.5f, t);
        if (l < o->n_hash) add_tid2eid(&b, NM("ffn_gate_tid2eid.weight"), V, k, E);
        const long r = o->comp_ratios ? o->comp_ratios[l] : 0, c = r == 4 ? 2 : 1;
        if (r) {   /* the compressor: scores spread enough that the pooling is no plain mean */
            add_matrix(&b, NM("attn_compressor_kv.weight"), d, c * hd, sd, t);
            add_matrix(&b, NM("attn_compressor_gate.weight"), d, c * hd, sd * 2.0f, t);
            add_matrix(&b, NM("attn_compressor_ape.weight"), c * hd, r, 1.0f, DS_TYPE_F32);
            add_norm(&b, NM("attn_compressor_norm.weight"), hd);
        }
        if (r == 4) {   /* the lightning indexer */
            add_matrix(&b, NM("indexer.proj.weight"), d, nih, sd, t);
            add_matrix(&b, NM("indexer.attn_q_b.weight"), ql, nih * ihd, sqrtf(3.0f / (float)ql), t);
            add_matrix(&b, NM("indexer_compressor_kv.weight"), d, 2 * ihd, sd, t);
            add_matrix(&b, NM("indexer_compressor_gate.weight"), d, 2 * ihd, sd * 2.0f, t);
            add_matrix(&b, NM("indexer_compressor_ape.weight"), 2 * ihd, 4, 1.0f, DS_TYPE_F32);
            add_norm(&b, NM("indexer_compressor_norm.weight"), ihd);
        }
#undef NM
    }
    if (b.failed) {
        const char *we = gguf_writer_error(b.w);
        ds_errf(err, errlen, "make-model: building the model failed: %s", we ? we : "out of memory");
        gguf_writer_free(b.w);
        return -1;
    }
    const int rc = gguf_writer_write(b.w, out, err, errlen);
    gguf_writer_free(b.w);
    return rc ? -1 : 0;
}

int ds_make_model(const ds_make_model_opts *o, const char *out, char *err, size_t errlen) {
    const char *arch = o->arch;
    if (!strcmp(arch, "deepseek4")) return make_ds4(o, out, err, errlen);
    const uint32_t type = o->type;
    const long n_embd = o->n_embd, n_layer = o->n_layer, n_head = o->n_head, n_head_kv = o->n_head_kv,
               n_ff = o->n_ff, n_vocab = o->n_vocab, n_ctx = o->n_ctx, seed = o->seed;
    const long head_dim = o->head_dim ? o->head_dim : o->n_embd / o->n_head;
    const float rope_base = o->rope_base, eps = o->norm_eps;
    if (strcmp(arch, "qwen3") && strcmp(arch, "llama") && strcmp(arch, "qwen3moe") && strcmp(arch, "qwen35")) {
        ds_errf(err, errlen, "make-model: arch must be qwen3, qwen3moe, qwen35, deepseek4 or llama, got '%s'", arch);
        return -1;
    }
    const int moe = !strcmp(arch, "qwen3moe"), hyb = !strcmp(arch, "qwen35");
    const long S = o->ssm_d_state, Hk = o->ssm_n_group, Hv = o->ssm_dt_rank, K = o->ssm_d_conv;
    const long C = (2 * Hk + Hv) * S, vd = Hv * S, ival = o->full_attn_interval;
    const long n_rot = o->n_rot ? o->n_rot : ((o->head_dim ? o->head_dim : o->n_embd / o->n_head) / 4) & ~1L;
    if (hyb && (K < 2 || K > 16 || S < 1 || S > 512 || Hk < 1 || Hv < Hk || Hv % Hk || ival < 1 || n_rot < 2)) {
        ds_errf(err, errlen, "make-model: qwen35 needs conv width 2..16, state size 1..512, value heads a multiple of "
                "key heads, full-attention interval >= 1 and a rope dimension >= 2");
        return -1;
    }
    const long n_exp = o->n_expert, n_used = o->n_expert_used, n_ff_exp = o->n_ff_exp;
    if (moe && (n_exp < 1 || n_exp > 1024 || n_used < 1 || n_used > n_exp || n_ff_exp < 1)) {
        ds_errf(err, errlen, "make-model: qwen3moe needs 1 <= experts used (%ld) <= experts (%ld) <= 1024 and an "
                "expert FFN width >= 1 (%ld)", n_used, n_exp, n_ff_exp);
        return -1;
    }
    if (n_embd < 1 || n_layer < 1 || n_head < 1 || n_head_kv < 1 || n_ff < 1 || n_vocab < 260 || head_dim < 2) {
        ds_errf(err, errlen, "make-model: every dimension must be positive (and n_vocab >= 260)");
        return -1;
    }
    if (head_dim % 2) { ds_errf(err, errlen, "make-model: head dim %ld must be even", head_dim); return -1; }
    if (n_head % n_head_kv) { ds_errf(err, errlen, "make-model: n_head %ld must be a multiple of n_head_kv %ld", n_head, n_head_kv); return -1; }
    const long blk = (long)ds_type_block_elems(type);
    const long n_ff_sh = moe ? o->n_ff_shexp : 0;
    if (n_ff_sh < 0) { ds_errf(err, errlen, "make-model: the shared expert width %ld is negative", n_ff_sh); return -1; }
    if (hyb && (n_rot > head_dim || n_rot % 2)) { ds_errf(err, errlen, "make-model: rope dimension %ld must be even and <= head dim %ld", n_rot, head_dim); return -1; }
    if (blk > 1 && (n_embd % blk || n_ff % blk || (n_head * head_dim) % blk || (moe && (n_ff_exp % blk || n_ff_sh % blk)) ||
                    (hyb && vd % blk))) {
        ds_errf(err, errlen, "make-model: %s needs n_embd, n_ff%s and n_head*head_dim to be multiples of %ld",
                ds_type_name(type), moe ? ", the expert FFN width" : "", blk);
        return -1;
    }
    builder b = { gguf_writer_new(), (uint64_t)seed * 0x2545F4914F6CDD1Dull + 1, type, 0 };
    if (!b.w) { ds_errf(err, errlen, "make-model: out of memory"); return -1; };
    char key[128];
#define KEY(s) (snprintf(key, sizeof key, "%s." s, arch), key)
    gguf_set_str(b.w, "general.architecture", arch);
    gguf_set_str(b.w, "general.name", "dspark-random");
    gguf_set_u32(b.w, KEY("block_count"), (uint32_t)n_layer);
    gguf_set_u32(b.w, KEY("context_length"), (uint32_t)n_ctx);
    gguf_set_u32(b.w, KEY("embedding_length"), (uint32_t)n_embd);
    gguf_set_u32(b.w, KEY("feed_forward_length"), (uint32_t)n_ff);
    gguf_set_u32(b.w, KEY("attention.head_count"), (uint32_t)n_head);
    gguf_set_u32(b.w, KEY("attention.head_count_kv"), (uint32_t)n_head_kv);
    gguf_set_u32(b.w, KEY("attention.key_length"), (uint32_t)head_dim);
    gguf_set_u32(b.w, KEY("attention.value_length"), (uint32_t)head_dim);
    gguf_set_f32(b.w, KEY("rope.freq_base"), rope_base);
    gguf_set_f32(b.w, KEY("attention.layer_norm_rms_epsilon"), eps);
    gguf_set_u32(b.w, KEY("vocab_size"), (uint32_t)n_vocab);
    if (moe) {
        gguf_set_u32(b.w, KEY("expert_count"), (uint32_t)n_exp);
        gguf_set_u32(b.w, KEY("expert_used_count"), (uint32_t)n_used);
        gguf_set_u32(b.w, KEY("expert_feed_forward_length"), (uint32_t)n_ff_exp);
        if (n_ff_sh > 0) gguf_set_u32(b.w, KEY("expert_shared_feed_forward_length"), (uint32_t)n_ff_sh);
    }
    if (hyb) {   /* llama.cpp's qwen35 keys */
        gguf_set_u32(b.w, KEY("ssm.conv_kernel"), (uint32_t)K);
        gguf_set_u32(b.w, KEY("ssm.inner_size"), (uint32_t)vd);
        gguf_set_u32(b.w, KEY("ssm.state_size"), (uint32_t)S);
        gguf_set_u32(b.w, KEY("ssm.time_step_rank"), (uint32_t)Hv);
        gguf_set_u32(b.w, KEY("ssm.group_count"), (uint32_t)Hk);
        gguf_set_u32(b.w, KEY("full_attention_interval"), (uint32_t)ival);
        gguf_set_u32(b.w, KEY("rope.dimension_count"), (uint32_t)n_rot);
        const int32_t sections[4] = {(int32_t)(n_rot / 2 - 2 * (n_rot / 8)), (int32_t)(n_rot / 8), (int32_t)(n_rot / 8), 0};
        gguf_set_arr(b.w, KEY("rope.dimension_sections"), GGUF_T_I32, sections, 4);
    }
    if (o->rope_yarn > 0.0f || o->rope_linear > 0.0f) {   /* rope.scaling as convert_hf_to_gguf writes it */
        gguf_set_str(b.w, KEY("rope.scaling.type"), o->rope_yarn > 0.0f ? "yarn" : "linear");
        gguf_set_f32(b.w, KEY("rope.scaling.factor"), o->rope_yarn > 0.0f ? o->rope_yarn : o->rope_linear);
        if (o->rope_yarn > 0.0f)
            gguf_set_u32(b.w, KEY("rope.scaling.original_context_length"),
                         (uint32_t)(o->rope_orig_ctx > 0 ? o->rope_orig_ctx : o->n_ctx));
    }
#undef KEY
    gguf_set_u32(b.w, "general.file_type", gguf_llama_ftype(type));     /* llama.cpp's code */
    gguf_set_u32(b.w, "general.quantization_version", GGUF_QUANTIZATION_VERSION);
    if (ds_tokenizer_build_bpe_padded(b.w, k_text, sizeof k_text - 1, (int32_t)(n_vocab < 1024 ? n_vocab : 1024),
                                      (int32_t)n_vocab, err, errlen)) {
        gguf_writer_free(b.w);
        return -1;
    }

    /* Scales keep activations O(1) through the random network so that
     * generations are varied rather than collapsing to one token. */
    const long qd = n_head * head_dim, kvd = n_head_kv * head_dim;
    uint32_t emb_type = type;
    add_matrix(&b, "token_embd.weight", n_embd, n_vocab, 1.0f, emb_type);
    add_norm(&b, "output_norm.weight", n_embd);
    /* qwen3moe: an untied head scaled to logits of a few units, so that
     * greedy text follows the context and sampling has choices (a tied head
     * of the O(1) embedding rows gives logits of tens: one token wins
     * everywhere, and a MoE test would see few routes) */
    if (moe || hyb || o->untied_output)
        add_matrix(&b, "output.weight", n_embd, n_vocab, sqrtf(3.0f / (float)n_embd) * 3.0f, type);
    for (long l = 0; l < n_layer && !b.failed; l++) {
        char n[96];
#define NAME(s) (snprintf(n, sizeof n, "blk.%ld." s ".weight", l), n)
        if (hyb) {
            add_hybrid_layer(&b, l, (l + 1) % ival != 0, n_embd, n_head, n_head_kv, head_dim, n_ff, K, S, Hv, C);
            continue;
        }
        add_norm(&b, NAME("attn_norm"), n_embd);
        add_matrix(&b, NAME("attn_q"), n_embd, qd, sqrtf(3.0f / (float)n_embd), type);
        add_matrix(&b, NAME("attn_k"), n_embd, kvd, sqrtf(3.0f / (float)n_embd), type);
        add_matrix(&b, NAME("attn_v"), n_embd, kvd, sqrtf(3.0f / (float)n_embd), type);
        if (strcmp(arch, "llama")) {
            add_norm(&b, NAME("attn_q_norm"), head_dim);
            add_norm(&b, NAME("attn_k_norm"), head_dim);
        }
        add_matrix(&b, NAME("attn_output"), qd, n_embd, sqrtf(3.0f / (float)qd) * 0.5f, type);
        add_norm(&b, NAME("ffn_norm"), n_embd);
        if (moe) {
            /* the router stays F32, as llama.cpp's quantizer leaves it; its
             * scale spreads the logits over a few units so that rows choose
             * different experts */
            add_matrix(&b, NAME("ffn_gate_inp"), n_embd, n_exp, sqrtf(3.0f / (float)n_embd) * 2.0f, DS_TYPE_F32);
            add_experts(&b, NAME("ffn_gate_exps"), n_embd, n_ff_exp, n_exp, sqrtf(3.0f / (float)n_embd), type);
            add_experts(&b, NAME("ffn_up_exps"), n_embd, n_ff_exp, n_exp, sqrtf(3.0f / (float)n_embd), type);
            add_experts(&b, NAME("ffn_down_exps"), n_ff_exp, n_embd, n_exp, sqrtf(3.0f / (float)n_ff_exp) * 0.5f, type);
            if (n_ff_sh > 0) {
                /* the shared expert's gate: one output, a 1-D F32 vector as in llama.cpp's files */
                float *gv = malloc((size_t)n_embd * sizeof(float));
                if (!gv) { b.failed = 1; break; }
                for (long i = 0; i < n_embd; i++) gv[i] = ds_uniform_pm1(&b.r) * sqrtf(3.0f / (float)n_embd);
                const uint64_t ne1[1] = { (uint64_t)n_embd };
                if (gguf_add_tensor(b.w, NAME("ffn_gate_inp_shexp"), DS_TYPE_F32, 1, ne1, gv, (uint64_t)n_embd * 4)) b.failed = 1;
                free(gv);
                add_matrix(&b, NAME("ffn_gate_shexp"), n_embd, n_ff_sh, sqrtf(3.0f / (float)n_embd), type);
                add_matrix(&b, NAME("ffn_up_shexp"), n_embd, n_ff_sh, sqrtf(3.0f / (float)n_embd), type);
                add_matrix(&b, NAME("ffn_down_shexp"), n_ff_sh, n_embd, sqrtf(3.0f / (float)n_ff_sh) * 0.5f, type);
            }
            continue;
        }
        add_matrix(&b, NAME("ffn_gate"), n_embd, n_ff, sqrtf(3.0f / (float)n_embd), type);
        add_matrix(&b, NAME("ffn_up"), n_embd, n_ff, sqrtf(3.0f / (float)n_embd), type);
        add_matrix(&b, NAME("ffn_down"), n_ff, n_embd, sqrtf(3.0f / (float)n_ff) * 0.5f, type);
#undef NAME
    }
    if (o->rope_freqs && !b.failed) {
        /* Llama 3.1's rope_freqs.weight as convert_hf_to_gguf computes it for
         * rope_type llama3 (factor 8, low_freq_factor 1, high_freq_factor 4,
         * original_max_position_embeddings 8192): a pair whose wavelength
         * 2 pi / freq is under 8192 / 4 keeps 1, one over 8192 / 1 gets the
         * factor, the band between a smooth blend; one F32 per pair. No
         * random draw: the other tensors are those of the same file without
         * it. */
        const double factor = 8.0, lo_f = 1.0, hi_f = 4.0, orig = 8192.0, pi2 = 6.283185307179586;
        float ff[DS_ROPE_FF_MAX];
        const long n = head_dim / 2;
        if (n > DS_ROPE_FF_MAX) {
            ds_errf(err, errlen, "make-model: --rope-freqs needs head dim <= %d", 2 * DS_ROPE_FF_MAX);
            gguf_writer_free(b.w);
            return -1;
        }
        for (long i = 0; i < n; i++) {
            const double freq = 1.0 / (double)ds_powf(rope_base, (float)(2 * i) / (float)head_dim);
            const double wl = pi2 / freq;
            double v;
            if (wl < orig / hi_f) v = 1.0;
            else if (wl > orig / lo_f) v = factor;
            else {
                const double sm = (orig / wl - lo_f) / (hi_f - lo_f);
                v = 1.0 / ((1.0 - sm) / factor + sm);
            }
            ff[i] = (float)v;
        }
        const uint64_t ne[1] = { (uint64_t)n };
        if (gguf_add_tensor(b.w, "rope_freqs.weight", DS_TYPE_F32, 1, ne, ff, (uint64_t)n * 4)) b.failed = 1;
    }
    if (b.failed) {
        const char *we = gguf_writer_error(b.w);
        ds_errf(err, errlen, "make-model: building the model failed: %s", we ? we : "out of memory");
        gguf_writer_free(b.w);
        return -1;
    }
    int rc = gguf_writer_write(b.w, out, err, errlen);
    gguf_writer_free(b.w);
    if (rc) return -1;
    return 0;
}

void ds_make_model_defaults(ds_make_model_opts *o) {
    memset(o, 0, sizeof *o);
    o->arch = "qwen3";
    o->type = DS_TYPE_F32;
    o->n_embd = 256; o->n_layer = 4; o->n_head = 4; o->n_head_kv = 2; o->head_dim = 0;
    o->n_ff = 768; o->n_vocab = 512; o->n_ctx = 2048; o->seed = 1;
    o->rope_base = 10000.0f; o->norm_eps = 1e-6f;
    o->n_expert = 8; o->n_expert_used = 2; o->n_ff_exp = 128; o->n_ff_shexp = 0;
    o->ssm_d_conv = 4; o->ssm_d_state = 32; o->ssm_n_group = 2; o->ssm_dt_rank = 4; o->full_attn_interval = 4;
    o->n_rot = 0;
}
