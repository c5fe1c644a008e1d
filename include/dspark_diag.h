/* dspark_diag.h — model-independent first-divergence diagnostics.
 *
 * A small embeddable C11 API (standard C only, no other dspark header) for
 * proving that two executions of the same forward pass — e.g. a batched
 * verifier (A) and one-token sequential decode (B) — produce the same bits,
 * and for locating the earliest point where they part when they do not.
 *
 *   comparator   dsd_compare()       raw-bit equality of two float arrays plus
 *                                    every numeric metric of the difference
 *   capture      dsd_capture_*()     a preallocated arena of checkpoint copies
 *                                    keyed (row, layer, checkpoint, subobject)
 *   diff/report  dsd_diff(), dsd_report_*()
 *                                    canonical-order diff of two captures, the
 *                                    FIRST_DIVERGENCE line, a table, JSON, SVG
 *   gate/chain   dsd_gate_print(), dsd_chain_*()
 *                                    probe non-perturbation gate and the
 *                                    operator -> ... -> byte identity chain
 *
 * Conventions: functions that can fail return an int status, DSD_OK (0) on
 * success, a negative DSD_ERR_* on error, DSD_SKIPPED (1) when a capture hook
 * declined to store by design (disarmed or filtered). No global state: every
 * object is owned by its caller, so several engines/threads can each use their
 * own capture. A single dsd_capture is not thread-safe.
 *
 * "actual" is side A (the path under test, e.g. batched verify); "expected" is
 * side B (the reference, e.g. sequential decode). Signs of deltas are a - e.
 */
#ifndef DSPARK_DIAG_H
#define DSPARK_DIAG_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ======================================================================
 * Status codes
 * ==================================================================== */
enum {
    DSD_OK               = 0,
    DSD_SKIPPED          = 1,   /* hook declined: capture off or key filtered */
    DSD_ERR_ARG          = -1,  /* NULL pointer, bad checkpoint/subobject/row */
    DSD_ERR_ARENA_FULL   = -2,  /* object would not fit; nothing was written */
    DSD_ERR_ENTRIES_FULL = -3,  /* max_entries reached; nothing was written   */
    DSD_ERR_DUPLICATE    = -4,  /* key already captured; nothing was written  */
    DSD_ERR_NOT_FOUND    = -5,  /* dsd_capture_find: no such key              */
    DSD_ERR_STATE        = -6,  /* capture not finalized (iteration / diff)   */
    DSD_ERR_NOMEM        = -7,  /* allocation failed (diff/report only)       */
    DSD_ERR_IO           = -8,  /* write to FILE* failed                      */
};
/* Static string for a status code ("ok", "arena_full", ...). */
const char *dsd_strerror(int status);

/* ======================================================================
 * 1. Comparator
 * ==================================================================== */

/* Metrics of actual[] against expected[]. Equality is decided on raw bits
 * only: two NaNs with the same payload are equal, +0 and -0 are not.
 *
 * Numeric statistics (abs/rel/ulp, rms/mean, percentiles, rel_l2, cosine)
 * exclude every element where either side is NaN; such mismatches are counted
 * in nan_mismatches and set metrics_undefined. Definitions:
 *   abs   = |a - e| in double; +inf when exactly one side is infinite or the
 *           infinities have opposite signs
 *   rel   = abs / max(|a|, |e|); 0 when both are zero (+0 vs -0); +inf when an
 *           infinity is involved
 *   ulp   = |key(a) - key(e)| with key() the sign-ordered total order of the
 *           bit patterns (-inf < ... < -0 < +0 < ... < +inf), so +0 vs -0 is
 *           1 ULP, subnormals count one step each, distances across zero add
 *           up (-min_subnormal vs +min_subnormal = 3: -min_sub, -0, +0,
 *           +min_sub), and max finite vs inf is 1. ulp == 0 iff bits equal.
 *   rms_abs, mean_abs   over all non-NaN elements (exact elements count 0)
 *   p50/p95/p99_abs     nearest-rank percentiles of abs over the non-NaN
 *                       mismatching elements (exact: sorts a copy)
 *   rel_l2  = ||a - e|| / ||e||  (double; 0 if both are 0, +inf if only e is)
 *   cosine  = <a,e> / (||a|| ||e||) (double; 1 if both norms are 0, 0 if one)
 *   delta_pos / delta_neg  mismatches with a > e / a < e in the total order
 *   delta_zero             mismatches with no numeric delta: +0 vs -0 and
 *                          every NaN-involved mismatch
 *   (delta_pos + delta_neg + delta_zero == mismatch_count) */
typedef struct dsd_metrics {
    int      valid;               /* 1 iff actual and expected are non-NULL  */
    int      bit_exact;           /* 1 iff valid and every element's bits agree */
    int      metrics_undefined;   /* 1 iff some mismatch involved a NaN      */
    int      percentiles_valid;   /* 0 iff percentile scratch was unavailable */
    size_t   n;                   /* elements compared                       */
    size_t   mismatch_count;
    double   mismatch_fraction;   /* mismatch_count / n (0 when n == 0)      */
    int64_t  first_mismatch;      /* index of the first mismatch, or -1      */
    float    first_actual, first_expected;
    uint32_t first_actual_bits, first_expected_bits;
    int      first_diff_bit;      /* highest differing bit of the first
                                     mismatch (31 = sign, 30..23 exponent,
                                     22..0 mantissa), or -1                  */
    size_t   nan_mismatches;
    double   max_abs, max_rel;
    uint64_t max_ulp;
    int64_t  max_ulp_index;       /* element with the largest ULP distance, -1 */
    double   rms_abs, mean_abs;
    double   p50_abs, p95_abs, p99_abs;
    double   rel_l2, cosine;
    size_t   delta_pos, delta_neg, delta_zero;
} dsd_metrics;

/* Compare n floats. Percentile scratch is malloc'd (n_mismatch doubles,
 * freed before return); if that fails, percentiles_valid = 0 and every other
 * metric is still exact. Returns DSD_OK, or DSD_ERR_ARG (m->valid = 0) when
 * a pointer is NULL (m itself may not be NULL). */
int dsd_compare(const float *actual, const float *expected, size_t n, dsd_metrics *m);

/* Same, with caller scratch for the percentiles: used when scratch_len >=
 * the number of mismatches (n is always enough), else falls back to malloc.
 * Lets a hot diff loop reuse one buffer. */
int dsd_compare_ex(const float *actual, const float *expected, size_t n, dsd_metrics *m,
                   double *scratch, size_t scratch_len);

/* One line of key=value pairs (no trailing newline), prefix first (may be
 * NULL), e.g. "METRICS elements=1024 mismatch_count=823 ...". Doubles are
 * %.17g (round-trip exact), bits 0x%08x; non-finite values print nan/inf. */
int dsd_metrics_print_kv(FILE *f, const char *prefix, const dsd_metrics *m);
/* One JSON object (no trailing newline); non-finite numbers are null. */
int dsd_metrics_json(FILE *f, const dsd_metrics *m);

/* ======================================================================
 * 2. Checkpoints and subobjects
 * ==================================================================== */

/* Checkpoints of a transformer layer, in execution order; the number after
 * "cp" in each name is the enum value. Post-stack checkpoints use
 * layer = DSD_LAYER_POST; a tap uses the tapped layer (or DSD_LAYER_POST for
 * the concatenated drafter context). */
typedef enum dsd_cp {
    DSD_CP_NONE          = 0,
    DSD_CP_ATTN_NORM     = 1,   /* cp1_attn_norm       normalized attention input   */
    DSD_CP_QKV           = 2,   /* cp2_qkv             q/k/v proj, q/k norm, q/k rope */
    DSD_CP_KV_WRITE      = 3,   /* cp3_kv_write        k/v cache rows as committed  */
    DSD_CP_ATTN_HEADS    = 4,   /* cp4_attn_heads      raw attention output per head */
    DSD_CP_ATTN_OUT_PROJ = 5,   /* cp5_attn_out_proj   output projection            */
    DSD_CP_ATTN_RESIDUAL = 6,   /* cp6_attn_residual   hidden + attention           */
    DSD_CP_FFN_NORM      = 7,   /* cp7_ffn_norm                                     */
    DSD_CP_FFN_GATE_UP   = 8,   /* cp8_ffn_gate_up     ffn_gate / ffn_up            */
    DSD_CP_FFN_ACT       = 9,   /* cp9_ffn_act         act(gate) * up               */
    DSD_CP_FFN_DOWN      = 10,  /* cp10_ffn_down                                    */
    DSD_CP_LAYER_OUT     = 11,  /* cp11_layer_out      residual stream after layer  */
    DSD_CP_FINAL_NORM    = 12,  /* final_norm          (layer = DSD_LAYER_POST)     */
    DSD_CP_LOGITS        = 13,  /* logits              (layer = DSD_LAYER_POST)     */
    DSD_CP_TAP           = 14,  /* tap                 hidden features for drafter  */
    DSD_CP_COUNT         = 15
} dsd_cp;

#define DSD_LAYER_POST (-1)      /* after the layer stack; sorts after every layer */
#define DSD_CP_MASK_ALL 0xffffffffu
#define DSD_CP_BIT(cp) (1u << (unsigned)(cp))

/* Subobjects within a checkpoint; ordered by value inside a checkpoint.
 * Per-head objects are DSD_SUB_HEAD(h) ("head_<h>"). */
enum {
    DSD_SUB_ALL = 0,            /* "all": the checkpoint's whole tensor          */
    DSD_SUB_Q_PROJ, DSD_SUB_K_PROJ, DSD_SUB_V_PROJ,
    DSD_SUB_Q_NORM, DSD_SUB_K_NORM,
    DSD_SUB_Q_ROPE, DSD_SUB_K_ROPE,
    DSD_SUB_K_CACHE_ROW, DSD_SUB_V_CACHE_ROW,
    DSD_SUB_FFN_GATE, DSD_SUB_FFN_UP,
    DSD_SUB_MOE_LOGITS,         /* "moe_logits": a MoE layer's router logits (cp8)  */
    DSD_SUB_MOE_ROUTE,          /* "moe_route": its k weights, then the k expert
                                   ids as floats, in rank order (cp8)           */
    DSD_SUB_GDN_CONV,           /* "gdn_conv": a gated delta net layer's conv
                                   output, q|k|v after SiLU (cp4)               */
    DSD_SUB_GDN_OUT,            /* "gdn_out": its recurrence output (cp4)        */
    /* deepseek4, the seed's sites: */
    DSD_SUB_QA,                 /* "qa": the low-rank Q's first projection (cp2)  */
    DSD_SUB_KV,                 /* "kv": the KV projection (cp2)                 */
    DSD_SUB_QB,                 /* "qb": the low-rank Q's second projection (cp2) */
    DSD_SUB_HC_PRE,             /* "hc_pre": a sub-block's mixed input (cp1, cp7) */
    DSD_SUB_HC_ATTN,            /* "after_attn_hc": the streams after the
                                   attention's HC tail (cp6)                      */
    DSD_SUB_NAMED_COUNT,
    DSD_SUB_HEAD_BASE = 0x10000,
    DSD_SUB_HEAD_MAX  = 0xffff  /* heads 0..65535                               */
};
#define DSD_SUB_HEAD(h) ((uint32_t)DSD_SUB_HEAD_BASE + (uint32_t)(h))
#define DSD_NAME_MAX 32          /* buffer size for dsd_sub_name              */

/* "cp1_attn_norm", ..., "final_norm", "logits", "tap"; "cp?" if invalid. */
const char *dsd_cp_name(uint32_t cp);
/* Parse a checkpoint name ("cp4_attn_heads", or just "cp4"); -1 if unknown. */
int dsd_cp_parse(const char *name);
/* "q_proj", ..., or "head_<h>" formatted into buf (DSD_NAME_MAX bytes);
 * returns a static string or buf; "sub?" if invalid. */
const char *dsd_sub_name(uint32_t sub, char buf[DSD_NAME_MAX]);
/* 1 if sub is a named subobject or a head index. */
int dsd_sub_valid(uint32_t sub);

/* Key of one captured object. Canonical order: row, then layer (with
 * DSD_LAYER_POST after every real layer), then checkpoint, then subobject —
 * so for a batched-vs-sequential experiment the smallest differing key is the
 * earliest divergence. */
typedef struct dsd_key {
    int32_t  row;     /* >= 0: row within the verify batch / decode step      */
    int32_t  layer;   /* >= 0, or DSD_LAYER_POST                              */
    uint32_t cp;      /* dsd_cp                                               */
    uint32_t sub;     /* DSD_SUB_* or DSD_SUB_HEAD(h)                          */
} dsd_key;
int dsd_key_cmp(const dsd_key *a, const dsd_key *b);   /* <0, 0, >0 */

/* ======================================================================
 * 3. Capture arena
 * ==================================================================== */
typedef enum dsd_cap_mode {
    DSD_CAP_OFF   = 0,  /* hooks disarmed: put returns DSD_SKIPPED at once     */
    DSD_CAP_HOOKS = 1,  /* hooks armed, validated and counted, nothing copied:
                           the A1 control of the non-perturbation gate         */
    DSD_CAP_COPY  = 2   /* full copies into the arena                          */
} dsd_cap_mode;

/* Bound memory by capturing only part of the pass. Ranges are inclusive;
 * the layer range applies to layers >= 0 (post-stack objects are selected by
 * cp_mask alone); cp_mask has bit DSD_CP_BIT(cp) set for wanted checkpoints. */
typedef struct dsd_filter {
    int32_t  row_lo, row_hi;
    int32_t  layer_lo, layer_hi;
    uint32_t cp_mask;
} dsd_filter;
dsd_filter dsd_filter_all(void);   /* everything */

typedef struct dsd_capture_stats {
    size_t   entries, max_entries;
    size_t   arena_bytes, arena_used_bytes;
    uint64_t hook_calls;   /* puts seen while armed (HOOKS or COPY)            */
    uint64_t stored;       /* objects copied                                   */
    uint64_t skipped;      /* puts filtered out while armed                    */
    uint64_t errors;       /* puts rejected (duplicate, full, bad argument)    */
    int      first_error;  /* status of the first rejected put, or DSD_OK      */
    dsd_key  first_error_key;
} dsd_capture_stats;

typedef struct dsd_capture dsd_capture;

/* Preallocates (and pre-faults) an arena of arena_bytes and an entry table of
 * max_entries plus its hash; nothing is allocated afterwards. Starts in
 * DSD_CAP_OFF with dsd_filter_all(). NULL on allocation failure. */
dsd_capture *dsd_capture_new(size_t arena_bytes, size_t max_entries);
void dsd_capture_free(dsd_capture *cap);
void dsd_capture_arm(dsd_capture *cap, dsd_cap_mode mode);
dsd_cap_mode dsd_capture_mode(const dsd_capture *cap);
int  dsd_capture_set_filter(dsd_capture *cap, const dsd_filter *f);  /* NULL = all */
/* 1 iff a put with this key would copy now (armed COPY and inside the filter):
 * lets a hook skip a device->host transfer it would throw away. */
int  dsd_capture_wants(const dsd_capture *cap, int32_t row, int32_t layer, uint32_t cp);

/* Copy n floats (raw bits, memcpy) under the key. No allocation. Returns
 * DSD_OK (stored, or accepted without copy in HOOKS mode), DSD_SKIPPED (off or
 * filtered), or an error: DSD_ERR_ARG, DSD_ERR_DUPLICATE, DSD_ERR_ENTRIES_FULL,
 * DSD_ERR_ARENA_FULL — on error nothing is written and the error is also
 * recorded in the stats, so a hook that ignores the status cannot make a
 * diff silently report NONE (see dsd_report.errors_a/b). */
int  dsd_capture_put(dsd_capture *cap, int32_t row, int32_t layer, uint32_t cp, uint32_t sub,
                     const float *data, size_t n);
/* Look up an object (works before and after finalize). */
int  dsd_capture_find(const dsd_capture *cap, int32_t row, int32_t layer, uint32_t cp, uint32_t sub,
                      const float **data, size_t *n);

/* Sort the entries into canonical order (O(k log k), no allocation). Needed
 * before iteration and dsd_diff; a later put un-finalizes. */
void   dsd_capture_finalize(dsd_capture *cap);
int    dsd_capture_finalized(const dsd_capture *cap);
size_t dsd_capture_count(const dsd_capture *cap);
/* i-th object in canonical order; DSD_ERR_STATE if not finalized. */
int    dsd_capture_at(const dsd_capture *cap, size_t i, dsd_key *key, const float **data, size_t *n);
/* Drop every object and zero the counters; keeps the arena, mode and filter. */
void   dsd_capture_reset(dsd_capture *cap);
void   dsd_capture_get_stats(const dsd_capture *cap, dsd_capture_stats *st);

/* ======================================================================
 * 4. Diff and report
 * ==================================================================== */
typedef struct dsd_object_result {
    dsd_key     key;
    size_t      n_a, n_b;        /* element counts; differing counts are a
                                    divergence (metrics over min(n_a, n_b))  */
    int         diverged;        /* !bit_exact || n_a != n_b                 */
    dsd_metrics m;
} dsd_object_result;

typedef struct dsd_report {
    dsd_object_result *objects;  /* compared objects, canonical order        */
    size_t   n_objects;          /* == compared_objects                      */
    size_t   compared_objects;
    size_t   bit_exact_objects;
    size_t   diverged_objects;
    size_t   missing_in_a;       /* keys only in B                           */
    size_t   missing_in_b;       /* keys only in A                           */
    size_t   size_mismatches;    /* keys in both with different element counts */
    int64_t  first;              /* index into objects of the first divergence, -1 */
    uint64_t errors_a, errors_b; /* rejected puts recorded by each capture   */
    int32_t  max_row, max_layer; /* largest row / real layer seen (-1 if none) */
} dsd_report;

/* Compare every key present in both finalized captures, A = actual,
 * B = expected. Returns DSD_OK, DSD_ERR_STATE (not finalized), DSD_ERR_NOMEM
 * or DSD_ERR_ARG. out is zeroed first; free it with dsd_report_free. */
int  dsd_diff(const dsd_capture *A, const dsd_capture *B, dsd_report *out);
void dsd_report_free(dsd_report *r);
/* First divergence, or NULL. */
const dsd_object_result *dsd_report_first(const dsd_report *r);
/* 1 iff something was compared, nothing diverged, no key is missing on
 * either side and neither capture rejected a put: the one-bit verdict a gate
 * should use (FIRST_DIVERGENCE NONE alone can hide a capture that dropped
 * objects). */
int dsd_report_identical(const dsd_report *r);

/* Exactly:
 *   FIRST_DIVERGENCE row=3 layer=2 checkpoint=cp4_attn_heads subobject=head_5 compared_objects=N
 *   METRICS elements=... (every comparator metric)
 * or
 *   FIRST_DIVERGENCE NONE compared_objects=N
 * followed by
 *   DIFF_SUMMARY compared_objects=N bit_exact_objects=N diverged_objects=N missing_in_a=N
 *                missing_in_b=N size_mismatches=N capture_errors_a=N capture_errors_b=N */
int dsd_report_print(FILE *f, const dsd_report *r);
/* One line per object (or only diverged ones): row layer checkpoint subobject
 * bit_exact mismatch max_ulp max_abs rel_l2; the first divergence is marked. */
int dsd_report_print_table(FILE *f, const dsd_report *r, int only_diverged);
/* The whole report as one JSON document (strings escaped, non-finite = null). */
int dsd_report_json(FILE *f, const dsd_report *r);
/* SVG heatmap, layers (y) x checkpoints (x), for one row or, with
 * row = DSD_ALL_ROWS, the max over rows. Cell = max over subobjects of
 * log2(max_ulp + 1) on a fixed 0..24 scale; grey = bit-exact, white = not
 * captured, black = NaN mismatch; first divergence outlined. */
#define DSD_ALL_ROWS (-1)
int dsd_report_svg(FILE *f, const dsd_report *r, int32_t row);

/* ======================================================================
 * 5. Gate and identity chain
 * ==================================================================== */

/* Probe non-perturbation gate: A0 = no hooks, A1 = DSD_CAP_HOOKS,
 * A2 = DSD_CAP_COPY; each compared on the pass's observable outputs.
 * Prints exactly
 *   GATE_CONTROL A0_vs_A1 PASS|FAIL
 *   GATE_PROBE A0_vs_A2 PASS|FAIL
 *   GATE_RESULT PASS|FAIL
 * and returns 1 iff both passed. */
int dsd_gate_print(FILE *f, int control_pass, int probe_pass);

/* The diagnostic chain; output-level tests see only its end. */
typedef enum dsd_chain {
    DSD_CHAIN_OPERATOR = 0,      /* operator_identity                */
    DSD_CHAIN_STATE,             /* future_visible_state_identity    */
    DSD_CHAIN_LOGITS,            /* logit_identity                   */
    DSD_CHAIN_GREEDY_TOKEN,      /* greedy_token_identity            */
    DSD_CHAIN_BYTES,             /* byte_identity                    */
    DSD_CHAIN_COUNT
} dsd_chain;
const char *dsd_chain_name(dsd_chain c);
/* Link a checkpoint belongs to: kv_write and taps are future-visible state,
 * logits are logits, everything else is an operator output. */
dsd_chain dsd_cp_chain(uint32_t cp);
/* "CHAIN operator_identity=PASS future_visible_state_identity=FAIL ...
 *  first_break=future_visible_state_identity" (status: 1 PASS, 0 FAIL,
 * < 0 UNTESTED; first_break=NONE if nothing failed). Returns the first failed
 * link or DSD_CHAIN_COUNT. */
int dsd_chain_print(FILE *f, const int status[DSD_CHAIN_COUNT]);

#ifdef __cplusplus
}
#endif
#endif /* DSPARK_DIAG_H */
