/* model_make.h — deterministic random-weight target models (make-model). */
#ifndef DSPARK_MODEL_MAKE_H
#define DSPARK_MODEL_MAKE_H

#include "common.h"

typedef struct {
    const char *arch;          /* "qwen3", "qwen3moe", "qwen35", "deepseek4" or "llama"    */
    uint32_t    type;          /* weight type of the 2-D tensors              */
    long n_embd, n_layer, n_head, n_head_kv, head_dim /* 0 = n_embd/n_head */, n_ff, n_vocab, n_ctx, seed;
    float rope_base, norm_eps;
    /* qwen3moe: experts per layer, used per token, each expert's FFN width
     * (n_ff is then the feed_forward_length key, unused by the forward) */
    long n_expert, n_expert_used, n_ff_exp;
    /* > 0: a shared expert of this width in every layer (qwen35moe's FFN:
     * ffn_gate_inp_shexp, ffn_{gate,up,down}_shexp). llama.cpp's qwen3moe
     * loader has no shared expert and refuses such a file (extra tensors);
     * dspark loads it, to test that FFN on the qwen3moe trunk. */
    long n_ff_shexp;
    /* qwen35 (hybrid): the gated delta net layers' conv width, head width
     * (ssm.state_size), key heads (group_count) and value heads
     * (time_step_rank); every full_attn_interval-th layer is full
     * attention; n_rot: RoPE'd dims of an attention head (0: head_dim / 4) */
    long ssm_d_conv, ssm_d_state, ssm_n_group, ssm_dt_rank, full_attn_interval, n_rot;
    /* deepseek4 (0: the defaults make-model documents): the low-rank Q's
     * rank, output groups and their rank, hyper-connection streams and
     * Sinkhorn iterations, the sliding window (head_dim 0: 512; n_rot 0: 64;
     * the experts as qwen3moe's, with one shared expert of n_ff_exp) */
    long q_lora, o_groups, o_lora, hc, hc_iters, n_swa;
    /* deepseek4: the first n_hash layers route by token id (hash_layer_count,
     * ffn_gate_tid2eid: each token's n_expert_used distinct experts) */
    long n_hash;
    /* deepseek4: swiglu_clamp_exp (0: none) — the experts' and the shared
     * expert's SwiGLU inputs clamped as llama.cpp's ggml_swiglu_clamp */
    float swiglu_clamp;
    /* rope.scaling yarn with this factor (0: none) and
     * original_context_length (0: n_ctx) — deepseek4: llama.cpp scales the
     * compressed layers' RoPE by it; qwen3 / llama: the whole RoPE */
    float rope_yarn;
    long  rope_orig_ctx;
    /* qwen3 / llama: rope.scaling linear with this factor (0: none; --rope-yarn
     * above gives them yarn); llama: rope_freqs (nonzero) writes Llama 3.1's
     * llama3 frequency factors, rope_freqs.weight */
    float rope_linear;
    int   rope_freqs;
    /* qwen3 / llama: an untied output.weight as qwen3moe's (varied greedy
     * text; a tied head of this random model repeats one token) */
    int   untied_output;
    /* deepseek4: attention.compress_ratios, one per layer (0, 4 or 128; NULL:
     * all 0), n_comp entries; the lightning indexer's heads, key length and
     * top-k (0: 4, head_dim, 64 — the keys are written in every file) */
    const int *comp_ratios;
    long n_comp, n_ih, ihd, i_top_k;
} ds_make_model_opts;

void ds_make_model_defaults(ds_make_model_opts *o);
/* Write the model to `out`. 0, or -1 with one error line. */
int  ds_make_model(const ds_make_model_opts *o, const char *out, char *err, size_t errlen);

#endif
