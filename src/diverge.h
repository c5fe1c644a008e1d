/* diverge.h — the batched-vs-sequential experiments behind `dspark diverge`,
 * `dspark families` and `dspark sweep` (seed 000's method, made complete):
 *
 *   same true S0 (canonical prefill of a prompt)
 *   -> Pass A: ds_forward_batch of a forced block with the kernel set under
 *      test, every checkpoint copied into a preallocated capture arena
 *   -> restore the full S0 (KV rows and n_past)
 *   -> Pass B: the same token ids forced through ds_decode (never re-derived
 *      by argmax), captured the same way
 *   -> raw-bit comparison of every object, earliest divergence in canonical
 *      (row, layer, checkpoint, subobject) order.
 * The non-perturbation gate runs Pass A three times — no probe (A0), hooks
 * armed without copies (A1), full copies (A2) — and requires the
 * future-visible state (KV rows, taps) and logits to be bitwise identical. */
#ifndef DSPARK_DIVERGE_H
#define DSPARK_DIVERGE_H

#include "model.h"
#include "dspark_diag.h"

typedef struct {
    const int32_t *prompt;   int n_prompt;   /* S0 = canonical prefill        */
    const int32_t *block;    int M;          /* forced tokens at n_prompt..   */
    ds_kernel_set  ks;                       /* batched kernels under test    */
} ds_diverge_opts;

typedef struct {
    int        gate_control, gate_probe;     /* 1 = PASS                      */
    dsd_report report;                       /* A = batched, B = decode       */
    int        chain[DSD_CHAIN_COUNT];       /* 1 PASS, 0 FAIL, -1 untested   */
    int        first_token_mismatch_row;     /* greedy argmax A vs B, -1 none */
    double     t_batch, t_decode;            /* seconds, unprobed passes      */
    /* which families produced each checkpoint, as the forward pass reported
     * them to the probe (ds_families_for_checkpoint reads it) */
    unsigned  *fam_map;
    int        fam_layers;
    /* how the probed passes reached the host: 1 when through capture arenas
     * (ds_probe_arena), with the arenas' downloads (one per probed pass:
     * 3, A1 A2 B) and how many of them a full arena forced mid-pass */
    int        capture_arena;
    long       capture_downloads, capture_early;
} ds_diverge_result;

/* How Pass A's and Pass B's checkpoints travel to the host captures:
 *   AUTO    a device backend: same-stream device-to-device copies into a
 *           preallocated arena, downloaded once per pass; a host-memory
 *           backend (the CPU): the rows themselves, at once;
 *   ARENA   the arena on every backend (on the CPU, a host buffer filled
 *           by the backend's copy: the tests' way to run the GPU's capture
 *           logic under CI);
 *   DIRECT  no arena (on a device, one synchronising download per row: the
 *           reference the arena is tested against).
 * Every path gives the same report, byte for byte. */
typedef enum { DS_CAPTURE_AUTO = 0, DS_CAPTURE_ARENA = 1, DS_CAPTURE_DIRECT = 2 } ds_capture_path;

/* Arena capacity for one probed pass of M rows on c (every checkpoint, the
 * logits and the context's taps): floats and rows (records). */
void ds_diverge_arena_size(const ds_ctx *c, int M, size_t *floats, size_t *rows);

/* Runs the gate and the experiment. The context's n_past and kernel set are
 * restored afterwards. 0, or -1 with err. Free the result with
 * ds_diverge_result_free. */
int  ds_diverge_run(ds_ctx *c, const ds_diverge_opts *o, ds_diverge_result *r, char *err, size_t errlen);
/* The same with the capture path chosen (ds_diverge_run is AUTO). */
int  ds_diverge_run_path(ds_ctx *c, const ds_diverge_opts *o, ds_capture_path path, ds_diverge_result *r,
                         char *err, size_t errlen);
void ds_diverge_result_free(ds_diverge_result *r);

/* The same experiment between any two execution configurations: Pass A =
 * the batched block on ca with o->ks (gate included), Pass B = the same ids
 * on cb — through sequential decode when ksb is NULL, else batched with
 * *ksb. ca and cb may be contexts of the same model file loaded on two
 * devices (CPU vs CUDA): the report then names the first object where the
 * two backends part. Both contexts' n_past and kernel sets are restored. */
int  ds_diverge_cross(ds_ctx *ca, ds_ctx *cb, const ds_diverge_opts *o, const ds_kernel_set *ksb,
                      ds_diverge_result *r, char *err, size_t errlen);

/* ---- isolated same-input A/B of one family -------------------------------
 * The family's decode kernel (canonical at M=1, row by row) against the
 * given batched variant on identical inputs at the model's shapes, on the
 * device of `ex` (a context's, ds_ctx_exec: the model's device), for
 * M = 1..m_max. Matmul families use a weight of that type from the model
 * when it has one, else a deterministic synthetic one (synthetic = 1). */
typedef struct {
    int         family;
    ds_variant  variant;
    int         proven_different;            /* some bit differed             */
    int         differing_widths;            /* how many M in 1..m_max         */
    int         synthetic;
    dsd_metrics worst;                       /* metrics of the worst width     */
} ds_family_ab;
/* 1 when the model runs the family: a matmul family for a weight of its
 * type, moe_route for a mixture-of-experts model, the others always. The
 * diagnostics (families, sweep) test only these. */
int ds_model_uses_family(const ds_model *m, int fam);
int ds_family_ab_run(const ds_model *m, ds_exec *ex, int family, ds_variant v, int m_max,
                     ds_family_ab *out, char *err, size_t errlen);

/* Families whose kernels produced a checkpoint in that run (the attribution
 * used by the sweep), as reported by the forward pass with each probed
 * object: bitmask of (1 << family), 0 if the checkpoint was not seen. */
unsigned ds_families_for_checkpoint(const ds_diverge_result *r, int layer, uint32_t cp, uint32_t sub);

#endif
