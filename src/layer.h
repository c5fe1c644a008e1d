/* layer.h — one transformer layer, shared by the target (model.c) and the
 * drafter trunk (drafter_forward.c), written once against the backend
 * table. Both call ds_layer_forward; neither touches activation memory. */
#ifndef DSPARK_LAYER_H
#define DSPARK_LAYER_H

#include "backend.h"

/* A Qwen3 / Llama decoder layer's weights. Norm vectors are f32 device
 * pointers; q_norm / k_norm are NULL when the layer has no QK-norm. */
typedef struct {
    const float *attn_norm, *q_norm, *k_norm, *ffn_norm;
    ds_weight wq, wk, wv, wo, w_gate, w_up, w_down;
    /* Mixture of experts (qwen3moe): n_expert > 0 replaces w_gate / w_up /
     * w_down by a router (gate_inp, [n_expert][d]) and n_expert SwiGLU
     * experts, each a view of one slice of llama.cpp's 3-D ffn_*_exps
     * tensors (exp_gate[e], exp_up[e]: [n_ff_exp][d]; exp_down[e]:
     * [d][n_ff_exp]). Each row runs its n_expert_used best experts; their
     * outputs are summed with the route's weights in rank order. */
    int n_expert, n_expert_used, moe_norm;
    ds_weight gate_inp;
    ds_weight *exp_gate, *exp_up, *exp_down;
    /* 1 when the backend's moe_id_prepare took all three expert arrays
     * (model.c, at load): the layer may then run them with matmul_id,
     * without the host reading the route (ds_layer_moe_on_device) */
    int exp_id;
    /* The shared expert (qwen35moe's FFN; has_shexp = 0: none): a SwiGLU
     * every row runs (sh_gate / sh_up: [n_ff_shexp][d], sh_down:
     * [d][n_ff_shexp]) whose output is scaled by sigmoid(sh_gate_inp . x)
     * (sh_gate_inp: llama.cpp's 1-D ffn_gate_inp_shexp, one output). */
    int has_shexp;
    ds_weight sh_gate_inp, sh_gate, sh_up, sh_down;
    /* qwen35 (hybrid): recur = 1 for a gated delta net layer, whose mixer
     * (layer_hybrid.c) replaces the attention: ssm_qkv ([conv_dim][d], the
     * conv's input), ssm_z ([n_v_head * head][d], the output gate),
     * ssm_alpha / ssm_beta ([n_v_head][d]), ssm_out ([d][n_v_head * head]);
     * f32 vectors conv_w ([conv_dim][d_conv]), dt_bias, ssm_a ([n_v_head])
     * and ssm_norm ([head]); rec_idx: its index among the recurrent layers.
     * A full-attention layer of such a model has q_gate = 1: wq projects
     * [n_head][2 * head_dim] (each head's query, then its gate), and the
     * attention output is multiplied by sigmoid(gate) before wo. */
    int recur, q_gate, rec_idx;
    ds_weight ssm_qkv, ssm_z, ssm_alpha, ssm_beta, ssm_out;
    const float *conv_w, *dt_bias, *ssm_a, *ssm_norm;
    /* deepseek4 (layer_ds4.c): ds4 = 1. Low-rank Q (wq_a [q_lora][d], its
     * norm q_a_norm, wq_b [n_head x head_dim][q_lora], then a per-head
     * RMSNorm without weight), the one KV head (wkv [head_dim][d], kv_norm;
     * its row is K and V), sinks [n_head], the output groups (wo_a:
     * n_groups views [o_lora][n_head x head_dim / n_groups], wo_b
     * [d][n_groups x o_lora]), the hyper-connection mixes of both sub-blocks
     * (hc_*_fn [(2 + hc) hc][hc x d], base [(2 + hc) hc], scale [3]), and
     * the MoE's sqrtsoftplus route (moe_func, its selection bias
     * exp_probs_b [n_expert], moe_scale) with an ungated shared expert
     * (has_shexp = 2). A hash layer (the first hash_layer_count) takes its
     * experts from tid2eid [n_vocab][n_expert_used] by the row's token id
     * instead of selecting them (the weights are still the router's). */
    int ds4, n_groups, moe_func;
    float moe_scale;
    /* deepseek4: swiglu_clamp_exp / swiglu_clamp_shexp of this layer (0:
     * none): the experts' (and the shared expert's) SwiGLU inputs clamped
     * first, gate to at most the limit, up to [-limit, limit]
     * (ds_swiglu_limit; llama.cpp's ggml_swiglu_clamp) */
    float swiglu_limit, swiglu_limit_sh;
    /* deepseek4 compressed attention (docs/DS4-COMPRESSED.md): comp_ratio
     * (attention.compress_ratios: 0 raw, 128 HCA), the compressor comp_kv /
     * comp_gate ([c hd][d]), comp_ape [r][c hd] (row p % r added to the
     * gate) and comp_norm [hd] (the compressed row's RMSNorm); c = 1 */
    int comp_ratio;
    ds_weight comp_kv, comp_gate;
    const float *comp_ape, *comp_norm;
    /* CSA (comp_ratio 4; then c = 2): the lightning indexer — idx_proj
     * [n_ih][d], idx_q_b [n_ih ihd][q_lora], its compressor idx_kv /
     * idx_gate [2 ihd][d], idx_ape [4][2 ihd], idx_norm [ihd] */
    ds_weight idx_proj, idx_q_b, idx_kv, idx_gate;
    const float *idx_ape, *idx_norm;
    ds_weight wq_a, wq_b, wkv, wo_b, hc_attn_fn, hc_ffn_fn;
    ds_weight *wo_a;
    const float *q_a_norm, *kv_norm, *sinks, *hc_attn_base, *hc_attn_scale, *hc_ffn_base, *hc_ffn_scale, *exp_probs_b;
    const int32_t *tid2eid;          /* host; NULL: not a hash layer            */
} ds_layer;

/* The layer's matmul weights one by one (i = 0, 1, ...; NULL past the
 * last): q, k, v, o, then gate, up, down or the router and every expert's
 * gate, up, down. For preparing, releasing and reporting them. */
ds_weight *ds_layer_weight(ds_layer *L, int i);

/* Floats of the MoE scratch (ds_acts.moe) for m_max rows: router logits,
 * the route, and one row per (row, rank) assignment of the experts' inputs,
 * gate / up / SwiGLU and outputs. 0 for a dense layer (n_expert == 0). */
size_t ds_moe_scratch_floats(int m_max, int n_expert, int k, int d, int n_ff_exp, int n_ff_shexp);
/* 32-bit words of the host staging a device backend's MoE layer needs
 * (ds_acts.moe_host) for m_max rows, k experts a row: the route's ids, the
 * slots, and the route's probe rows. */
size_t ds_moe_host_words(int m_max, int k);

typedef struct {
    int   d, n_head, n_head_kv, head_dim, n_ff;
    float eps, rope_base;
    ds_rope_mode rope_mode;
    int   n_rot;                     /* RoPE'd dims per head (0: head_dim; qwen35: partial) */
    const ds_rope_yarn *rope_yarn;   /* the RoPE's scaling / frequency factors, or NULL (plain) */
    ds_gdn_shape gdn;                /* qwen35's recurrent layers (unused otherwise)        */
    /* deepseek4 (unused otherwise): hyper-connection streams, Sinkhorn
     * iterations and epsilon; q_lora; output groups; sliding window */
    int   hc, hc_iters, q_lora, o_groups, o_lora, n_swa;
    float hc_eps;
    /* deepseek4 compressed layers: their RoPE base
     * (attention.compress_rope_freq_base) and the KV pool's floats per
     * position (head_dim, wider when a layer keeps compressor state) */
    float comp_rope_base;
    const ds_rope_yarn *comp_yarn;   /* their rope scaling, or NULL */
    int   kv_row;
    int   idx_heads, idx_dim, idx_top_k;   /* the lightning indexer (CSA layers) */
} ds_layer_shape;

/* Floats of the hybrid layers' scratch (ds_acts.rec) for m_max rows: the
 * recurrent mixer's conv input / output, gate, alpha, beta, core output and
 * norm, or a gated attention layer's q|gate projection, gate and the
 * partial-RoPE staging, whichever is wider. */
size_t ds_hybrid_scratch_floats(int m_max, const ds_layer_shape *s);


/* Device activations for up to m_max rows. x: the residual stream; xn: its
 * normed copy (the layer's input on entry, the next norm's output on exit). */
struct ds_rstate;
typedef struct ds_acts {
    float *x, *xn, *q, *k, *v, *att, *o, *gate, *up, *h;
    float *moe;                      /* MoE layers: ds_moe_scratch_floats, else NULL */
    int32_t *moe_host;               /* MoE layers on a device backend: host staging,
                                        ds_moe_host_words (the grouping reads the ids
                                        there); NULL on host-memory backends          */
    float *rec;                      /* hybrid models: ds_hybrid_scratch_floats, else NULL */
    struct ds_rstate *rs;            /* hybrid models: the sequences' recurrent states */
    const int *pos;                  /* device: positions of the rows (== rows->pos) */
    int ids_off;                     /* the rows' token ids are at pos + ids_off     */
    const ds_rows *rows;             /* the rows' positions, KV slots, visibility    */
    const int32_t *tables_host;      /* probes: host copy of the page table of the
                                        (one) sequence whose rows these are, or NULL */
} ds_acts;

/* ---- probes: the diagnostics' capture hook --------------------------------
 * wants(): asked once per (layer, checkpoint) before anything is copied, so
 * a backend moves only what is wanted. fn() receives host rows, with the
 * family bits (1 << ds_family) of the kernels that produced the checkpoint.
 * pos is the row's absolute position, layer -1 (DSD_LAYER_POST) for
 * non-layer objects; checkpoint / subobject are dsd_checkpoint /
 * dsd_subobject values.
 *
 * How rows reach fn(), by probe and backend:
 *   - host-memory backend, no arena: fn() gets the activation row itself,
 *     at once (the CPU's path);
 *   - an arena (ds_probe_arena): every row is enqueued as a copy into the
 *     arena's buffer on the forward's own stream (device to device on a
 *     GPU: no host round trip, no synchronisation inside the layer loop);
 *     ds_probe_flush later downloads the arena once and calls fn() for the
 *     rows in the order they were enqueued — the same calls, with the same
 *     bytes, as the direct path;
 *   - device backend, no arena: each row is downloaded into `stage` and
 *     reported at once (one synchronising download per row: the simple
 *     path, kept as the reference the arena is tested against). */
typedef struct ds_probe_arena ds_probe_arena;
typedef struct ds_probe {
    int  (*wants)(void *user, int layer, int checkpoint);
    void (*fn)(void *user, int pos, int layer, int checkpoint, int subobject, unsigned families,
               const float *data, size_t n);
    void  *user;
    float *stage;                    /* host staging, >= m_max * widest row    */
    ds_probe_arena *arena;           /* NULL: report each row at once          */
} ds_probe;

/* Report M rows of one checkpoint (device rows `stride` floats apart, n
 * floats each) when the probe wants it. pos0: position of row 0. */
void ds_probe_rows(ds_exec *ex, const ds_probe *pr, int M, int pos0, int layer, int cp, int sub,
                   unsigned fams, const float *base, size_t stride, size_t n);

/* ---- the capture arena: same-stream snapshots, compared after the stream --
 * A backend buffer of `cap` floats and a host list of the rows enqueued
 * into it. Sized by its owner for one probed pass (what the probe wants of
 * every row); should a pass enqueue more, ds_probe_rows flushes early (one
 * more download, never a lost or reordered row). */
typedef struct {
    int      pos, layer, cp, sub;
    unsigned fams;
    size_t   off, n;                 /* floats into the arena                  */
} ds_probe_rec;

struct ds_probe_arena {
    ds_backend   *be;
    float        *dev;               /* backend buffer [cap]                   */
    float        *host;              /* where a flush lands [cap]              */
    ds_probe_rec *rec;               /* [rec_cap], in enqueue order            */
    size_t cap, used, rec_cap, n_rec;
    long   downloads;                /* flushes that moved data (statistics)   */
    long   early;                    /* of which forced by a full arena        */
};

/* floats: row capacity in floats; rows: how many rows (records). Both > 0.
 * 0, or -1 with err (nothing allocated then). */
int  ds_probe_arena_init(ds_probe_arena *a, ds_backend *be, size_t floats, size_t rows, char *err,
                         size_t errlen);
void ds_probe_arena_free(ds_probe_arena *a);
/* Waits for the stream, downloads the used part of the arena once and calls
 * pr->fn for every pending row in enqueue order; the arena is then empty.
 * No-op without an arena or pending rows. 0, or -1 with err when the
 * device reports a fault (the pending rows are dropped, fn is not called). */
int  ds_probe_flush(ds_exec *ex, const ds_probe *pr, char *err, size_t errlen);

/* Weights sharing their input as one launch where the backend can (q/k/v,
 * gate/up, the recurrent mixer's four projections): bit for bit the n
 * separate matmuls. */
void ds_layer_mm_shared(ds_exec *ex, const uint8_t var[DS_FAM_COUNT], int n, const ds_weight *const W[], int M,
                        const float *x, float *const y[]);

/* The recurrent mixer of a gated delta net layer (layer_hybrid.c): from
 * a->xn (the attention norm's output) into a->o, the recurrent states of
 * the rows' sequences read and kept in a->rs (rstate.h). */
void ds_layer_gdn_mixer(ds_exec *ex, const ds_layer *L, const ds_layer_shape *s, const uint8_t var[DS_FAM_COUNT],
                        int M, int pos0, ds_acts *a, const ds_probe *pr, int l);

/* A hybrid model's recurrent state of sequence sq rolled back to the one
 * after n positions (rstate.h): the checkpoint, or replayed from it through
 * the logged rows with the gdn kernels (a->rec is the scratch). 0, or -1
 * with one line when that state cannot be had (it was never kept). */
int ds_gdn_rewind(ds_exec *ex, const ds_layer *layers, int n_layer, const ds_layer_shape *s, ds_acts *a, int sq, int n,
                  char *err, size_t errlen);

/* The FFN of a MoE layer over M rows of a->xn into a->o (layer.c): router,
 * route (softmax, or L->moe_func's gating), the experts grouped by expert,
 * the shared expert, the combine in rank order. */
void ds_layer_moe_ffn(ds_exec *ex, const ds_layer *L, const ds_layer_shape *s, const uint8_t var[DS_FAM_COUNT], int M,
                      int pos0, ds_acts *a, const ds_probe *pr, int l);

/* Assignments (rows x experts used) at most for the device-side expert
 * path (layer.c says why 64). */
#define DS_MOE_ID_MAX 64
/* 1 when ds_layer_moe_ffn runs layer L over M rows with var without reading
 * the route's ids on the host (matmul_id: no download, so no
 * synchronisation, so the forward can be recorded) — probes aside, which
 * keep the host path. A dense layer: 1 (nothing to read). */
int ds_layer_moe_on_device(const ds_backend *be, const ds_layer *L, const uint8_t var[DS_FAM_COUNT], int M);
/* ... for every layer of a model (n_layer of them) */
int ds_layers_moe_on_device(const ds_backend *be, const ds_layer *layers, int n_layer,
                            const uint8_t var[DS_FAM_COUNT], int M);

/* Floats of a deepseek4 layer's scratch (ds_acts.rec) for m_max rows
 * (layer_ds4.c). */
size_t ds_ds4_scratch_floats(int m_max, const ds_layer_shape *s);

/* One deepseek4 layer over M rows (layer_ds4.c): a->x holds the rows'
 * hc streams ([M][hc][d]) and is updated in place (attention sub-block,
 * then the MoE sub-block, each between hc_pre and hc_post); the KV row
 * (K = V) goes to kc and vc. */
void ds_layer_ds4_forward(ds_exec *ex, const ds_layer *L, const ds_layer_shape *s, const uint8_t var[DS_FAM_COUNT],
                          int M, int pos0, float *kc, float *vc, ds_acts *a, const ds_probe *pr, int layer);
/* The output head's hyper-connection mix and the final norm (layer_ds4.c):
 * a->x's streams -> a->xn = output_norm(sum_h pre[h] x[h]). */
void ds_ds4_head(ds_exec *ex, const ds_weight *fn, const float *base, const float *scale, const float *out_norm,
                 const ds_layer_shape *s, const uint8_t var[DS_FAM_COUNT], int M, ds_acts *a);

/* Run one layer over M rows (a->rows: their positions, KV slots and what
 * each attends, on the device; probes report row r at position pos0 + r).
 * Expects a->xn = attn_norm(x) unless qkv_ready, in which case a->q/k/v
 * already hold the pre-RoPE projections (after QK-norm). Writes the rows'
 * K/V into their slots of kc/vc (the layer's page-0 rows of the KV pool)
 * before attending. Leaves x += attn + ffn, and xn = rmsnorm(x, next_norm).
 * var[f] is each family's variant. */
void ds_layer_forward(ds_exec *ex, const ds_layer *L, const ds_layer_shape *s,
                      const float *next_norm, const uint8_t var[DS_FAM_COUNT], int M, int pos0,
                      int qkv_ready, float *kc, float *vc, ds_acts *a, const ds_probe *pr, int layer);

#endif
