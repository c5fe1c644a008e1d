/* backend.h — the seam between the engine and the devices that run it.
 *
 * The engine (model.c, drafter_forward.c, layer.c, spec.c, diverge.c) never
 * touches activation, KV or weight memory directly: it holds pointers that
 * belong to a backend and asks the backend to run operator families on them.
 * A backend is one function table (ds_backend_i) plus its private state, in
 * the spirit of ggml's ggml_backend_i but much smaller: dspark runs one
 * dense transformer shape, so the table is a list of operator families, not
 * a graph compiler.
 *
 *   who owns what                      host (engine)        backend (device)
 *   ---------------------------------  -------------------  -----------------
 *   weights (mmap of the GGUF)         ds_weight.data       ds_weight.extra
 *   norm vectors (f32)                 model arena          ds_model.f32_dev
 *   KV cache                           page tables, lengths ds_kvpool pages
 *   activations, logits, taps          -                    ds_exec scratch
 *   token ids, positions               per call             uploaded per call
 *   kernel choice (ds_kernel_set)      per context          per call argument
 *
 * Pointers handed to the ops are device pointers: on the CPU they are plain
 * host pointers (host_memory = 1), on CUDA they are cudaMalloc'd. Weights are
 * prepared once at load (prepare_weight: the CPU repacks Q8_0 for the VNNI
 * tile; CUDA uploads), never per call.
 *
 * Every op is asynchronous with respect to the host on a device backend:
 * results are visible to the host only after download() (which
 * synchronises). The CPU runs everything inline.
 *
 * The exactness contract is per backend and per family: the canonical
 * variant's per-row arithmetic is the decode variant's (decode is canonical
 * at M = 1); the fast variant may differ. See kernels/kernels.h for the
 * families and the argument conventions (identical here).
 *
 * How to add a backend: docs/ARCHITECTURE.md, "Adding a backend". */
#ifndef DSPARK_BACKEND_H
#define DSPARK_BACKEND_H

#include "common.h"
#include "kernels/kernels.h"
#include "sampler.h"

typedef struct ds_backend ds_backend;   /* one device: table + private state   */
typedef enum { DS_GATE_SIGMOID = 0, DS_GATE_SIGMOID_MUL = 1, DS_GATE_RNN = 2 } ds_gate_kind;
typedef struct ds_exec    ds_exec;      /* an execution context on it          */

enum { DS_USE_MATMUL = 1, DS_USE_LOOKUP = 2 };   /* prepare_weight's `use` */

/* ---- the rows of one forward, as the KV kernels see them -----------------
 * Every array is device memory, filled per call (the engine uploads them
 * with the ids), so a recorded launch sequence replays for any rows. The KV
 * cache is a pool of pages (kvpool.h): position j of row m's sequence is
 * row j % page of page tables[seq[m] * max_pages + j / page]; a layer's
 * rows of page q start at its page-0 pointer + q * page_stride floats. A
 * row's K/V are written at its own position; it attends [0, n_vis[m]). */
#define DS_KV_PAGE 16            /* positions per page: 4 pages per 64-position attention chunk */
typedef struct ds_rows {
    const int32_t *pos;          /* [M] each row's position                                  */
    const int32_t *seq;          /* [M] its sequence (the row of tables); NULL: all 0        */
    const int32_t *n_vis;        /* [M] it attends positions [0, n_vis); NULL: pos + 1       */
    const int32_t *tables;       /* [n_seq][max_pages] page ids                              */
    int            max_pages;    /* tables' pitch                                            */
    int            page;         /* positions per page (16: kvpool.h)                        */
    int64_t        page_stride;  /* floats between consecutive pages, in every layer        */
    int            vis_max;      /* host: >= every row's n_vis in this call; 0 = not known   */
    /* The call's sequence runs, where the caller gives them (the engine, for
     * a chunk with a run of at least DS_ROWS_RUN_MIN rows that it does not
     * record): run i is rows [runs[2i], runs[2i] + runs[2i + 1]) of one
     * sequence, the runs in row order covering [0, M). A backend may group a
     * long run's rows into tiles that share their sequence's K/V (CUDA: the
     * attention tile path), which moves no bit. NULL / 0: not given. */
    const int32_t *runs;         /* [n_runs][2], device                                      */
    const int32_t *runs_host;    /* [n_runs][2], the same in host memory                    */
    int            n_runs;
} ds_rows;
#define DS_ROWS_RUN_MIN 64
/* A call whose vis_max is at most DS_ROWS_SHORT has only short rows: a
 * backend may leave out work that only long rows need (CUDA: the split-KV
 * pass), which moves no bit — so a recorded graph's key must say which
 * kind of call it recorded (model.c's graph_key). */
#define DS_ROWS_SHORT 128

/* Floats from a layer's page-0 rows to the row of position pos of
 * sequence seq (the host-side twin of what the kernels compute; row =
 * floats per position). tables: a host copy. */
static inline int64_t ds_rows_at(const ds_rows *r, const int32_t *tables, int seq, int pos, int row) {
    return (int64_t)tables[(int64_t)seq * r->max_pages + pos / r->page] * r->page_stride +
           (int64_t)(pos % r->page) * row;
}

/* ---- the function table ------------------------------------------------ */
#define DS_CHAIN_SEQ_MAX 16      /* sequences in one head-chain launch (ds_draft_chain.n_seq) */
/* The drafter's sequential head chain (drafter_forward.c), for a backend
 * that runs it in one launch. Greedy only; per slot k = 0..n_keep-1 with
 * prev = toks[k], exactly the ops the engine would issue one by one:
 *   if w2:   e = embed(w1, prev);  z_k = add(z_k, matmul(CANONICAL, w2, e))
 *   always:  z_k[mask_id] = mask_logit
 *   if conf: in = [h_k; e if conf_with_markov];
 *            conf_logit[0] = matmul(CANONICAL, conf_w, in);
 *            conf[k] = gate(SIGMOID, conf_logit[0], conf_b[0])
 *   always:  toks[k + 1] = argmax(z_k)
 * All pointers are device memory; z holds the LM head's logits on entry. */
typedef struct {
    int n_keep, V, D;
    const ds_weight *w1, *w2;          /* the vanilla Markov head, or both NULL  */
    const ds_weight *conf_w;           /* the confidence head, or NULL            */
    int conf_with_markov;
    const float *h;                    /* [n_keep][D]                             */
    float *z;                          /* [n_keep][V]                             */
    int32_t *toks;                     /* [n_keep + 1]                            */
    int32_t mask_id;
    float mask_logit;
    const float *conf_b;               /* [1]                                     */
    float *conf_logit;                 /* [1]                                     */
    float *conf;                       /* [n_keep]                                */
    float *bias;                       /* [V] scratch: W2 e (the engine's bias)   */
    float *in;                         /* [D + rank] scratch: the conf input      */
    /* rows of h and z, and ids of toks, from one slot to the next (0 or 1:
     * adjacent). A batched round (ds_draft_many) lays many sequences' slots
     * out slot-major: stride = its number of sequences. A backend whose
     * chain has no strides returns 1 for stride > 1. */
    int stride;
    /* n_seq > 1: that many sequences' chains in one launch — sequence i's
     * rows at h + i * D, z + i * V, ids at toks + i (its slots stride rows
     * apart), keeping keep[i] drafts (non-increasing in i; n_keep =
     * keep[0]); no confidence. Each sequence's values are its own chain's.
     * A backend without it returns 1 (the engine then runs them one by one). */
    int n_seq;
    int keep[DS_CHAIN_SEQ_MAX];
} ds_draft_chain;

/* A matmul with its neighbours in one launch (matmul_res):
 *   in = x, or with up: h = swiglu(vsw, x, up) (written), in = h
 *   y = matmul(vmm, W, in)                                   (written)
 *   res += y; xnorm = rmsnorm(vnorm, res, norm_w, eps)        (residual(vres, vnorm))
 * bit for bit those calls. */
typedef struct {
    ds_variant vmm, vres, vnorm, vsw;
    const ds_weight *W;
    int M;
    const float *x, *up;
    float *h, *y;
    float *res;
    const float *norm_w;
    float eps;
    float *xnorm;
} ds_matmul_res;

typedef struct ds_backend_i {
    const char *name;                    /* "cpu", "cuda": the --device name    */
    int host_memory;                     /* 1: buffers are host memory          */

    void (*destroy)(ds_backend *be);
    /* One line for logs: what this device is (key=value pairs). */
    void (*describe)(ds_backend *be, char *buf, size_t n);

    /* execution contexts: CPU = thread pool + scratch; CUDA = stream +
     * scratch. n_threads is the CPU's -t (a device backend may ignore it). */
    ds_exec *(*exec_new)(ds_backend *be, int n_threads, char *err, size_t errlen);
    void     (*exec_free)(ds_exec *ex);
    /* Wait for everything queued on ex. 0, or -1 with err (a device fault). */
    int      (*sync)(ds_exec *ex, char *err, size_t errlen);

    /* buffers: device memory, 64-byte aligned; NULL when out of memory */
    void *(*alloc)(ds_backend *be, size_t bytes);
    void  (*release)(ds_backend *be, void *p);
    void  (*upload)(ds_exec *ex, void *dst, const void *src, size_t bytes);   /* host -> dev */
    void  (*download)(ds_exec *ex, void *dst, const void *src, size_t bytes); /* dev -> host, syncs */
    void  (*copy)(ds_exec *ex, void *dst, const void *src, size_t bytes);     /* dev -> dev */

    /* weights: a backend-private layout made once at load (w->extra), and
     * its release. `use` (DS_USE_* bits) says how the engine reads it: the
     * CPU repacks only matmul weights, a device uploads both. Returns 0, or
     * -1 with err. */
    int   (*prepare_weight)(ds_backend *be, ds_weight *w, int use, char *err, size_t errlen);
    void  (*release_weight)(ds_backend *be, ds_weight *w);

    /* ---- operator families (kernels.h has the argument conventions) --- */
    void (*matmul)(ds_exec *ex, ds_variant v, const ds_weight *W, int M, const float *x, float *y);
    /* Rows m = 0..M-1 (their positions, page tables and visible lengths in
     * *r, device memory); the KV rows of this call are already written. Row
     * m attends positions [0, r->n_vis[m]) of its own sequence, read
     * through its page table: kc / vc are the layer's page-0 rows. */
    void (*attention)(ds_exec *ex, ds_variant v, const ds_attn_shape *s, int M, const ds_rows *r,
                      const float *q, const float *kc, const float *vc, float *out);
    void (*rmsnorm)(ds_exec *ex, ds_variant v, int rows, int n, const float *x, const float *w,
                    float eps, float *y);
    void (*rope)(ds_exec *ex, ds_variant v, int rows, int n_heads, int head_dim, const int *pos,
                 float freq_base, ds_rope_mode mode, float *x);
    void (*swiglu)(ds_exec *ex, ds_variant v, int rows, int n, const float *gate, const float *up,
                   float *out);
    void (*residual)(ds_exec *ex, ds_variant vres, ds_variant vnorm, int rows, int n, float *x,
                     const float *y, const float *w, float eps, float *xnorm);

    /* Write M rows of K and V (row floats each) of one layer at the rows'
     * positions r->pos[m] of their sequences, through the page tables (kc,
     * vc: the layer's page-0 rows). Everything comes from the device, so a
     * recorded graph replays for any rows. */
    void (*kv_write)(ds_exec *ex, float *kc, float *vc, int row, int M, const ds_rows *r,
                     const float *k, const float *v);

    /* ---- lookups and small ops ---------------------------------------- */
    /* out[m] = row ids[m] of E converted to f32 (ids: device int32). */
    void (*embed)(ds_exec *ex, const ds_weight *E, int M, const int32_t *ids, float *out);
    /* out[r] = argmax of row r (n floats), ties to the lowest index, NaN
     * never wins (out: device int32). */
    void (*argmax)(ds_exec *ex, int rows, int64_t n, const float *x, int32_t *out);
    /* The drafter's feature sanitisation (spec §1.2) of rows x n floats:
     * dst = src with NaN -> 0, |x| > lim -> +-lim (src == dst: in place). */
    void (*sanitize)(ds_exec *ex, int rows, int64_t n, const float *src, float *dst, float lim);

    /* ---- optional: recorded launch sequences (CUDA graphs) -------------
     * NULL on backends that run ops directly. graph_begin(ex, key): 1 when
     * a sequence recorded under `key` was launched instead (the caller then
     * issues nothing and calls graph_end), 0 when the caller should issue
     * its ops (they are recorded, then launched by graph_end). Every op
     * argument inside must be identical between replays: positions and ids
     * travel through device buffers, never as host values. -1 on error. */
    int (*graph_begin)(ds_exec *ex, uint64_t key, char *err, size_t errlen);
    int (*graph_end)(ds_exec *ex, char *err, size_t errlen);

    /* ---- optional: scratch reserved up front ----------------------------
     * Called once per context at creation with the largest shapes its
     * forward will use (rows per call, weight n_in, head_dim, attended
     * positions), so that no family call allocates afterwards. Grow-only:
     * a target and a drafter context sharing one ds_exec each reserve.
     * NULL on backends whose families need none. 0, or -1 with err. */
    int (*reserve)(ds_exec *ex, int m_max, int64_t k_max, int hd_max, int64_t n_pos, char *err,
                   size_t errlen);

    /* ---- optional: weights sharing their input in one launch ---------------
     * NULL: n matmul calls. y[i] = W[i] x for n <= 4 weights of one type and
     * n_in on the same x — bit for bit the n matmul calls (q/k/v, gate/up). */
    void (*matmul_multi)(ds_exec *ex, ds_variant v, int n, const ds_weight *const W[], int M,
                         const float *x, float *const y[]);

    /* ---- the drafter's heads and token selection on the device ---------
     * Appended after the optional hooks so that older positional initialisers
     * of this table still compile (the fields below are then NULL). A
     * backend without them cannot run a drafter (ds_dctx_new says so) and
     * its token selection falls back to downloading the logits
     * (ds_backend_select). The arithmetic is spelled out per op: the CPU
     * implements it with exactly these float operations, in this order. */
    /* y[i] = a[i] + b[i] for i < n (y may alias a or b). */
    void (*add)(ds_exec *ex, int64_t n, const float *a, const float *b, float *y);
    /* x[i] = v for i < n (MASK suppression, a zeroed state). */
    void (*fill)(ds_exec *ex, int64_t n, float *x, float v);
    /* Elementwise gates over n outputs, sigmoid(t) = 1 / (1 + exp(-t)) with
     * the backend's exp (the CPU: libm expf and tanhf):
     *   DS_GATE_SIGMOID      y[j] = sigmoid(a[j] + b[j])                 (confidence)
     *   DS_GATE_SIGMOID_MUL  y[j] = sigmoid(a[j] + b[j]) * e[j]          (gated Markov)
     *   DS_GATE_RNN          a, b hold 3n: g = sigmoid(a[j] + b[j]),
     *                        c = tanh(a[n+j] + b[n+j]),
     *                        s[j] = g * s[j] + (1 - g) * c,
     *                        y[j] = tanh(a[2n+j] + b[2n+j])               (rnn Markov) */
    void (*gate)(ds_exec *ex, ds_gate_kind kind, int n, const float *a, const float *b,
                 const float *e, float *s, float *y);
    /* Seeded selection: out[r] = ds_sample(smp, row r of x (n floats), n,
     * pos0 + r) for r < rows (sampler.h: Gumbel-max with Philox-4x32-10
     * keyed on (seed, position, id); temp 0 is argmax, the argmax op's
     * answer). scratch: a device buffer of 2n floats the backend may use.
     * Returns 0, or -1 when this backend cannot run this sampler
     * configuration (e.g. top-k / top-p / min-p on a device); nothing is written
     * then and the caller selects on the host. */
    int  (*sample)(ds_exec *ex, const ds_sampler *smp, int rows, int n, const float *x,
                   int64_t pos0, float *scratch, int32_t *out);

    /* ---- optional: the attention prologue in one launch -----------------
     * NULL: the separate calls. Bit for bit, for M rows at positions r->pos[]:
     *   rmsnorm(CANONICAL, M * n_head,    head_dim, q, q_norm, eps, q)   if q_norm
     *   rmsnorm(CANONICAL, M * n_head_kv, head_dim, k, k_norm, eps, k)   if k_norm
     *   rope(CANONICAL, M, n_head, ...q); rope(CANONICAL, M, n_head_kv, ...k)
     *   kv_write(kc, vc, n_head_kv * head_dim, M, r, k, v)
     * n_head may be 0 (q unused: the drafter's context rows). Only for the
     * canonical variants of both families; launch-bound decode steps are
     * why it exists (five launches per layer become one). */
    void (*qk_norm_rope_kv)(ds_exec *ex, int M, int n_head, int n_head_kv, int head_dim,
                            const ds_rows *r, float freq_base, ds_rope_mode mode,
                            const float *q_norm, const float *k_norm, float eps, float *q,
                            float *k, const float *v, float *kc, float *vc);

    /* ---- optional: the drafter's head chain in one launch ----------------
     * NULL, or returns 1 when this backend declines this configuration
     * (types, sizes): the engine then issues the ops one by one. 0 when the
     * chain was issued: bit for bit the ops above (ds_draft_chain). A
     * speculative round's sequential part is ~10 tiny launches per slot. */
    int (*draft_chain)(ds_exec *ex, const ds_draft_chain *c);

    /* ---- optional: SwiGLU feeding a matmul in one launch ------------------
     * h = swiglu(vsw, gate, up); y = matmul(vmm, W, h), bit for bit those two
     * calls (h is written too). Returns 1 when declined (the caller makes
     * the two calls), 0 when issued. */
    int (*swiglu_matmul)(ds_exec *ex, ds_variant vsw, ds_variant vmm, const ds_weight *W, int M,
                         const float *gate, const float *up, float *h, float *y);

    /* ---- optional: a matmul, its residual and the next norm in one launch
     * (ds_matmul_res above). Returns 1 when declined (the caller makes the
     * separate calls), 0 when issued. The residual epilogue after o_proj
     * and after down_proj is two launches per layer. */
    int (*matmul_res)(ds_exec *ex, const ds_matmul_res *a);

    /* ---- optional: forget one recorded launch sequence --------------------
     * With graph_begin: drop what was recorded under key (after the stream
     * has finished it), so that buffers it names may be freed and their
     * addresses reused. A no-op for an unknown key. */
    void (*graph_drop)(ds_exec *ex, uint64_t key);

    /* ---- optional: a strided device-to-device copy in one op ---------------
     * rows rows of width bytes, dst rows dpitch bytes apart, src rows spitch
     * apart. NULL: ds_backend_copy2d issues one copy per row. (A verify's
     * taps were one copy per row and tap layer: 24 graph nodes of ~2 us
     * each on the shipped pair, a sixth of the pass.) */
    void (*copy2d)(ds_exec *ex, void *dst, size_t dpitch, const void *src, size_t spitch, size_t width,
                   size_t rows);

    /* ---- optional: a download collected later ------------------------------
     * download_start queues the copy of `bytes` from src (device) to dst
     * (host) and returns at once; download_finish waits for that copy and
     * what was queued before it — not for work queued after it — and then
     * dst holds the bytes: 0, or -1 with err (a device fault). One started
     * download per context at a time; a sync() or download() in between
     * completes it. NULL on backends whose downloads are immediate. (The
     * speculative loop queues the drafter's context rows behind a verify's
     * download and runs them while the host decides what was accepted.) */
    void (*download_start)(ds_exec *ex, void *dst, const void *src, size_t bytes);
    int  (*download_finish)(ds_exec *ex, char *err, size_t errlen);

    /* ---- optional: several device-to-device copies in one op ----------------
     * n (<= DS_COPY_N_MAX) independent copies, bytes[i] from src[i] to
     * dst[i] (no copy's destination overlaps another's source). NULL:
     * ds_backend_copy_n issues them one by one. (A draft round restores
     * four buffers' MASK rows: four graph nodes of ~2 us each.) */
    void (*copy_n)(ds_exec *ex, int n, void *const dst[], const void *const src[], const size_t bytes[]);

    /* ---- optional: memory that need not be initialised (the KV pool) --------
     * NULL: alloc / release. The pool's pages are written before they are
     * read, so a backend may leave the memory uncommitted until first touch
     * (the CPU: an mmap reservation; a 64k-position context then costs only
     * the pages in use, not gigabytes zeroed up front). */
    void *(*alloc_pool)(ds_backend *be, size_t bytes);
    void  (*release_pool)(ds_backend *be, void *p, size_t bytes);

    /* ---- optional: mixture of experts (qwen3moe's FFN, layer.c) -----------
     * NULL: the backend cannot run MoE models (the loader refuses them).
     * The grouping by expert (layer.c) runs on the host over the route's
     * ids: read in place on a host-memory backend, downloaded once per MoE
     * layer (a synchronisation) on a device.
     * moe_route: the moe_route family (kernels.h ds_moe_route) on device
     *   buffers: logits [M][n_expert] -> ids [M][k] (int32), w [M][k];
     *   n_expert <= DS_MOE_MAX_EXPERT.
     * moe_combine: the weighted sum of a row's k expert outputs, in rank
     *   order (the order moe_route selected them), never in an order that
     *   depends on the batch: for r < M, i < n,
     *     out[r][i] = w[r][0] * y[slot[r][0]][i];
     *     out[r][i] = out[r][i] + w[r][j] * y[slot[r][j]][i]   for j = 1..k-1
     *   (one multiply and one add per term, no fused multiply-add). y: the
     *   experts' down projections, one row per (row, rank) assignment, at
     *   the slots the caller grouped them into (slot: device int32 [M][k]).
     *   With a shared expert (qwen35moe's FFN; sh != NULL), then
     *     s = ds_sigmoidf(sh_gate[r]); out[r][i] = out[r][i] + sh[r][i] * s
     *   (sh: [M][n], sh_gate: [M], llama.cpp's order: the gated shared
     *   output added to the experts' sum); sh_gate NULL (deepseek4's
     *   ungated shared expert): out[r][i] = out[r][i] + sh[r][i].
     *   slot NULL: the identity, slot[r][j] = r * k + j (the outputs in
     *   assignment order, as matmul_id below writes them). */
    void (*moe_route)(ds_exec *ex, ds_variant v, int M, int n_expert, int k, int norm, const float *logits,
                      int32_t *ids, float *w);
    void (*moe_combine)(ds_exec *ex, int M, int k, int n, const int32_t *slot, const float *w, const float *y,
                        const float *sh_gate, const float *sh, float *out);

    /* ---- optional: the gated delta net (qwen35's recurrent layers) ---------
     * NULL: the backend cannot run qwen35 (the loader refuses it). The gdn
     * family (kernels.h ds_gdn_conv / ds_gdn_recur) on this device's
     * buffers; state_in and the per-row state_out pointers address the
     * sequence's recurrent state ring (rstate.h), which the layer finds on
     * the host — host-memory backends only.
     * sigmoid_mul: x[i] = x[i] * ds_sigmoidf(g[i]) (the gated attention of
     * qwen35's full-attention layers; elementwise, no variants). */
    void (*gdn_conv)(ds_exec *ex, ds_variant v, const ds_gdn_shape *s, int M, const float *x, const float *w,
                     const float *state_in, float *const *state_out, float *out);
    void (*gdn_recur)(ds_exec *ex, ds_variant v, const ds_gdn_shape *s, int M, float *qkv, float *alpha, float *beta,
                      const float *dt_bias, const float *A, const float *state_in, float *const *state_out, float *out);
    void (*sigmoid_mul)(ds_exec *ex, int64_t n, float *x, const float *g);

    /* ---- optional: deepseek4 (layer_ds4.c) ----------------------------------
     * NULL: the backend cannot run deepseek4 (the loader refuses it; the
     * CUDA backend has no kernels for these families yet). The attn_sinks,
     * hc_pre and hc_post families (kernels.h ds_attn_sinks / ds_hc_pre /
     * ds_hc_post) on this device's buffers, and the route with a gating
     * function (ds_moe_route_ex: sqrtsoftplus, the selection bias, hash
     * layers' fixed experts; the moe_route family). */
    void (*attn_sinks)(ds_exec *ex, ds_variant v, const ds_attn_shape *s, int M, const ds_rows *r, int window,
                       const ds_attn_extra *x,
                       const float *sinks, const float *q, const float *kc, const float *vc, float *out);
    void (*hc_pre)(ds_exec *ex, ds_variant v, int rows, int hc, int d, int n_mix, const float *x, const float *mix,
                   const float *scale, const float *base, float eps, int iters, float *y, float *post, float *comb);
    void (*hc_post)(ds_exec *ex, ds_variant v, int rows, int hc, int d, const float *f, const float *res,
                    const float *post, const float *comb, float *out);
    void (*moe_route_ex)(ds_exec *ex, ds_variant v, int M, int n_expert, int k, const ds_moe_gating *g,
                         const float *logits, int32_t *ids, float *w);
    /* the ds4_compress family (kernels.h ds_ds4_compress): deepseek4's
     * compressed layers; NULL: the loader refuses a file that has one */
    void (*ds4_compress)(ds_exec *ex, ds_variant v, int rows, int n, int hd, const float *const *kv,
                         const float *const *sc, float *out);
    /* the ds4_indexer family (kernels.h ds_ds4_indexer): CSA layers; NULL:
     * the loader refuses them */
    void (*ds4_indexer)(ds_exec *ex, ds_variant v, int rows, int n_ih, int ihd, const float *iq, const float *w,
                        const int32_t *n_blk, ds_ds4_key_fn key, const void *u, int top_k, int32_t *sel, int32_t *n_sel,
                        float *score);

    /* ---- optional: rows per internal chunk ---------------------------------
     * How many rows a context or engine forward runs at once when a prompt
     * is longer (its activation, logits and taps buffers are sized to it).
     * NULL: DS_CHUNK_ROWS_DEFAULT. A chunk's size never moves a bit (prefill
     * is chunk-invariant: tested with chunks of 1, 7, 64 and 512 rows); it
     * only decides how wide the matmuls of a long prompt run — which on a
     * GPU is the difference between tensor-core tiles at ~90 TMAC/s
     * (M = 512) and ~20 (M = 64). */
    int (*chunk_rows)(ds_backend *be);

    /* ---- optional: memory still to be had -----------------------------------
     * Bytes this backend's buffers could still take (host: the kernel's
     * MemAvailable; a GPU: its free memory), or 0 when unknown. NULL: unknown.
     * What sizes a server's default number of sequences (api_engine.c). */
    uint64_t (*mem_free)(ds_backend *be);

    /* ---- optional: the MoE grouping's gather in one launch --------------------
     * For every assignment i < M * k (row i / k, rank i % k):
     *   X[slot[i]][0..n) = x[i / k][0..n)
     * slot: device int32 [M][k] (a permutation of 0 .. M*k-1, layer.c's
     * grouping by expert). A copy: it moves bits, computes none. NULL: the
     * layer issues one copy per assignment (the CPU, where a copy is a
     * memcpy; on a GPU a prefill chunk's 512 x 8 copies would be 4096
     * stream ops a layer). */
    void (*moe_gather)(ds_exec *ex, int M, int k, int n, const int32_t *slot, const float *x, float *X);

    /* ---- optional: a matmul per MoE assignment, its expert read on the device
     * What lets a MoE layer run without reading the route's ids on the host
     * (layer.c ds_layer_moe_ffn): no download, so no synchronisation, and the
     * layer can be recorded (model.c, engine.c). NULL: the layer groups the
     * assignments on the host.
     * moe_id_prepare: once at load, after prepare_weight of W[0..n_exp) (one
     *   layer's experts of one projection: one type, one shape). 0 when
     *   matmul_id takes this array (a device builds its table of the experts'
     *   buffers here, released with W[0]'s release_weight), 1 when it
     *   declines it (no such kernel for the type or shape: the layer keeps the
     *   host grouping), -1 with err.
     * matmul_id: for each of n (<= 2) prepared arrays W[w] and each assignment
     *   i < A (A a multiple of xk):
     *     e = ids[i] (device int32; one outside [0, n_exp) reads as 0)
     *     y[w][i] = matmul(DS_CANONICAL, &W[w][e], 1, x + (i / xk) * n_in)
     *   rows of n_in floats in, n_out out. Bit for bit that one-row canonical
     *   matmul — which is row i's row of the host path's grouped matmul of any
     *   M (a canonical row is M-invariant). Canonical only (the layer takes
     *   it only where the experts' families run canonical); x and y 16-byte
     *   aligned. */
    int  (*moe_id_prepare)(ds_backend *be, ds_weight *W, int n_exp, char *err, size_t errlen);
    void (*matmul_id)(ds_exec *ex, int n, const ds_weight *const W[], int n_exp, int A, const int32_t *ids, int xk,
                      const float *x, float *const y[]);
    /* RoPE with rope scaling (kernels.h ds_rope_yarn: deepseek4's
     * compressed layers under rope.scaling YaRN / linear); NULL where the
     * backend has none (the loader refuses such files there) */
    void (*rope_ext)(ds_exec *ex, ds_variant v, int rows, int n_heads, int head_dim, const int *pos,
                     float freq_base, ds_rope_mode mode, const ds_rope_yarn *yarn, float *x);
    /* Whether a path whose kernels exist but have not yet run on this kind
     * of device is switched on (names: "ropeext" rope scaling, "tp" tensor
     * parallel ranks); NULL: every path is proven on this backend. */
    int (*path_on)(ds_backend *be, const char *name);
} ds_backend_i;
#define DS_CHUNK_ROWS_DEFAULT 64
/* The backend's chunk rows (chunk_rows above, or the default). */
int ds_backend_chunk_rows(ds_backend *be);
/* path_on above: 1 where the backend has none (the CPU's paths are proven). */
int ds_backend_path_on(ds_backend *be, const char *name);
/* mem_free above, or 0 (unknown). */
uint64_t ds_backend_mem_free(ds_backend *be);
/* /proc/meminfo's MemAvailable in bytes, 0 when it cannot be read (the CPU
 * backend's mem_free, and the KV pool's check of a host pool's size). */
uint64_t ds_host_mem_available(void);
#define DS_COPY_N_MAX 4

struct ds_backend {
    const ds_backend_i *i;
    void *priv;
};

/* Every backend's execution context starts with this header: the engine
 * reads only ->be. A backend in another language (the CUDA C++ files)
 * defines its own `struct ds_exec` with the same first member and sets
 * DS_EXEC_DEFINED before including this header. */
#ifndef DS_EXEC_DEFINED
struct ds_exec {
    ds_backend *be;
};
#endif

/* ---- the registry --------------------------------------------------------
 * "cpu" always; "cuda" when built with CUDA (make CUDA=1). An unknown or
 * unavailable name, no GPU, or a driver mismatch -> NULL with one line. */
ds_backend *ds_backend_new(const char *name, char *err, size_t errlen);
void        ds_backend_free(ds_backend *be);
/* The device names this build has, comma-separated ("cpu" or "cpu,cuda"). */
const char *ds_backend_names(void);

/* The CPU backend's pieces that CPU-only code (tests, family A/B) uses. */
ds_backend *ds_backend_cpu_new(char *err, size_t errlen);
ds_pool    *ds_exec_cpu_pool(ds_exec *ex);       /* NULL for other backends */
#ifdef DS_HAVE_CUDA
/* In the module libdspark-cuda.so (ds_backend_new("cuda") loads it; code
 * linked with the module, as the CUDA tests are, may call it directly).
 * ds_cuda_module_abi: the module's version and sizeof(ds_backend_i), which
 * the loader checks against its own. */
ds_backend *ds_backend_cuda_new(char *err, size_t errlen);
const char *ds_cuda_module_abi(size_t *table_size);
#endif

/* ---- token selection ------------------------------------------------------
 * out[r] (device int32) = the token row r of x (rows x n device floats)
 * selects at position pos0 + r: argmax when smp is NULL or its temperature
 * is not > 0 (ds_sample's rule), else the backend's sample op; where that
 * op is missing or declines the configuration, the rows are downloaded,
 * ds_sample runs on the host and the ids are uploaded (the only place the
 * engine moves logits for selection). scratch: device, 2n floats. Returns 0,
 * or -1 with err (out of host memory in the fallback). */
int ds_backend_select(ds_exec *ex, const ds_sampler *smp, int rows, int n, const float *x, int64_t pos0,
                      float *scratch, int32_t *out, char *err, size_t errlen);
/* ds_backend_select through a per-row logits processor (sampler.h
 * ds_lproc, required): the rows are selected on the host, row
 * r with the extra history extra[0..base + r). scratch is not needed. */
int ds_backend_select_lp(ds_exec *ex, const ds_sampler *smp, const ds_lproc *lp, const int32_t *extra, int base,
                         int rows, int n, const float *x, int64_t pos0, int32_t *out, char *err, size_t errlen);
/* 1 when the backend has every op the drafter's heads need. */
int ds_backend_has_heads(const ds_backend *be);
/* The table's copy_n, or one copy each on a backend without it. */
void ds_backend_copy_n(ds_exec *ex, int n, void *const dst[], const void *const src[], const size_t bytes[]);
/* The table's copy2d, or one copy per row on a backend without it. */
void ds_backend_copy2d(ds_exec *ex, void *dst, size_t dpitch, const void *src, size_t spitch, size_t width,
                       size_t rows);

/* ---- constants on the device ---------------------------------------------
 * A device copy of host data that never changes (norm vectors, the RoPE
 * table): on host-memory backends the host pointer itself, else a new
 * buffer. Release with ds_backend_const_free. NULL when out of memory. */
void *ds_backend_const(ds_backend *be, ds_exec *ex, const void *host, size_t bytes);
void  ds_backend_const_free(ds_backend *be, void *dev, const void *host);

#endif
