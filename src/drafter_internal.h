/* drafter_internal.h — the DSpark drafter's structures, shared by
 * drafter.c (load + validation) and drafter_forward.c (context injection,
 * block forward, heads). Tests include it for their debug hooks; nothing
 * else should. */
#ifndef DSPARK_DRAFTER_INTERNAL_H
#define DSPARK_DRAFTER_INTERNAL_H

#include "drafter.h"
#include "layer.h"

typedef enum { DS_MARKOV_NONE = 0, DS_MARKOV_VANILLA, DS_MARKOV_GATED, DS_MARKOV_RNN } ds_markov_type;
typedef enum { DS_DLAYOUT_DFLASH = 0, DS_DLAYOUT_DSPARK = 1 } ds_drafter_layout;

const char *ds_markov_type_name(int t);

/* A drafter layer is a ds_layer (layer.h; q_norm == k_norm == NULL for a
 * Llama trunk without QK-norm) and runs through ds_layer_forward. */

struct ds_drafter {
    gguf_ctx       *g;              /* owns the mapping the weights point into   */
    const ds_model *target;         /* borrowed: embedding + LM head             */
    ds_backend     *be;             /* the target's: weights prepared on it      */
    int             prepared;
    int   layout;                   /* ds_drafter_layout                         */
    int   n_layer, d, n_head, n_head_kv, head_dim, n_ff, V;
    float rope_base, eps;
    ds_rope_mode rope_mode;
    int   gamma;                    /* block size                                */
    int   n_taps;
    int   taps[DS_MAX_TAPS];        /* HF ids (layer outputs)                    */
    int32_t mask_id;

    ds_weight    fc;                /* {n_taps*d, d}                             */
    const float *hidden_norm;       /* enc.output_norm / dspark.hidden_norm      */
    const float *output_norm;
    ds_layer    *layers;

    int          markov;            /* ds_markov_type                            */
    int          rank;              /* r; 0 = no Markov head                     */
    ds_weight    w1, w2;            /* {r, V} each; W1 is a lookup table         */
    ds_weight    mgate;             /* gated: {d+r, r}                           */
    const float *mgate_b;           /* gated: [r]                                */
    ds_weight    mjoint;            /* rnn: {2r+d, 3r}                           */
    const float *mjoint_b;          /* rnn: [3r]                                 */

    int          has_conf, conf_with_markov;
    ds_weight    conf_w;            /* {d(+r), 1}                                */
    float        conf_b;

    int          has_corr, corr_w;  /* correction head and its width            */
    const float *corr_hn, *corr_en; /* [d] each                                  */
    ds_weight    corr_gate, corr_up;/* {2d, w}                                   */
    ds_weight    corr_down;         /* {w, d}                                    */

    const ds_weight *embd;          /* == &target->tok_embd                      */
    const ds_weight *head;          /* == &target->output (same memory)          */
    int   file_has_embd, file_has_output; /* legacy copies found (and ignored)   */

    float *arena;                   /* norms and biases converted to f32         */
    size_t arena_n;                 /* its length in floats                      */
    float *arena_dev;               /* device copy (== arena on the CPU)         */
    char   desc[640];
};

#define DS_DRAFT_CHUNK 64           /* context rows per internal append chunk    */
#define DS_DRAFT_MANY_MAX 16        /* sequences one batched drafting pass takes:
                                       its logits are 16 * gamma * V floats     */
#define DS_DCTX_MAX_GRAPHS 32       /* recorded launch sequences a context tracks */

struct ds_dctx {
    const ds_drafter *d;
    ds_exec *ex;                    /* the target context's (shared)             */
    int      own_ex;                /* 1: made by ds_dctx_new (none was given)   */
    /* keys of the launch sequences this context recorded on a shared
     * execution context: they name its device buffers, so they are dropped
     * when the context goes (a later context at the same address must not
     * replay them) */
    uint64_t gkeys[DS_DCTX_MAX_GRAPHS];
    int      n_gkeys;
    int   n_ctx;                    /* context rows capacity                     */
    int   cap;                      /* cache rows = n_ctx + gamma (block rows)   */
    int   len;                      /* context rows held                         */
    int   retained;                 /* fixed n_keep (ds_dctx_set_retained), 0 = any */
    ds_kvpool *pool;                /* the context rows' and block rows' K/V     */
    int      group;                 /* their group in it (0 own, 1 the engine's) */
    int      shared;                /* 1: pool and seq are the batch engine's    */
    ds_seq   own_seq;               /* own pool: the one sequence's page table   */
    ds_seq  *seq;                   /* the bound sequence (&own_seq, or the      */
                                    /*   engine's: ds_dctx_bind)                  */
    int32_t *tables;                /* device copy of seq->table                 */
    ds_rows crows;                  /* context rows: causal view, never attended */
    ds_rows brows;                  /* block rows: every row sees [0, p + gamma) */
    int   rows;                     /* scratch rows = max(chunk, n_many * gamma) */
    /* many sequences' rounds at once (ds_draft_many, shared contexts): up
     * to n_many sequences; their rows' nvis | pos | seq (n_many * gamma
     * each) and the chain's ids, slot-major ((gamma + 1) * n_many), in one
     * device buffer filled by one upload from mhost */
    int      n_many;
    int32_t *mbuf;
    int32_t *mhost;
    /* scratch */
    float *feat;                    /* [rows][n_taps*d] sanitized taps           */
    float *x, *xn, *o;              /* [rows][d]; xn: the heads' hidden rows too */
    float *q, *att;                 /* [rows][H*hd]                              */
    float *k, *v;                   /* [rows][Hkv*hd]                            */
    float *gate, *up, *hff;         /* [rows][n_ff]                              */
    float *z;                       /* [gamma][V] logits                         */
    float *bias;                    /* [V] Markov bias                           */
    float *samp_scratch;            /* [2V]                                      */
    float *vec;                     /* [max(2r+d, 2d, d+r) + 3r + ...] small     */
    float *cw;                      /* correction: [2w]                          */
    float *hc;                      /* correction: [d] corrected hidden          */
    float *state;                   /* rnn state [r]                             */
    float *conf;                    /* [gamma] confidences (device)              */
    float *scal;                    /* [2]: the confidence logit, conf_b (device) */
    int   *pos;                     /* [rows] device positions, then toks below;
                                       nvis = pos - rows: the block rows' visible
                                       lengths (p + gamma), uploaded with them  */
    int   *nvis;
    int   *pos_host;                /* [rows + 1] host staging (+ the anchor)    */
    /* what the device's pos[] holds: pos_p0 + i at pos[i] for i < pos_n
     * (every write to it is an upload from this side, so the host knows);
     * a context append at positions already there uploads nothing */
    int   pos_p0, pos_n;
    /* The Markov chain's ids on the device: toks[0] = the anchor (uploaded),
     * toks[k+1] = the token slot k chose (written by the argmax / sample op,
     * read by slot k+1's W1 / embedding lookups: no host round trip), and
     * toks[gamma+1] = the MASK id (constant). */
    int32_t *toks;                  /* [gamma + 2] device (= pos + rows: a round's
                                       positions and anchor go up in one upload) */
    /* MASK-row reuse (n_many * (G-1) copies: every sequence's MASK rows of a
     * batched round restore with one copy per buffer): layer-0 projections of E[MASK] (post q/k-norm, pre-RoPE),
     * and for the graph-corrected mode the constant Markov bias of MASK. The
     * MASK row is a function of constant weights only, so the cache is built
     * once in ds_dctx_new and reused every round. */
    float *mask_x, *mask_q, *mask_k, *mask_v;   /* [G-1][d], [G-1][H*hd], [G-1][Hkv*hd] x2 */
    float *mask_bias;               /* [V] (correction mode with a Markov head)  */
    /* test hooks (drafter_internal.h only) */
    int    no_mask_cache;           /* 1: recompute MASK rows every round        */
    int    no_chain;                /* 1: the head chain op by op, never fused   */
    float *dbg_unmasked;            /* if set: [n_keep][V] logits before z[MASK]=-1e6 */
    float *dbg_hidden;              /* if set: [gamma][d] post-output_norm h     */
};

#endif
