/* drafter.h — the DSpark block drafter (spec: ../shared/reference/dspark-spec.md
 * §1-§3): target-feature taps -> fc -> hidden_norm -> per-layer K/V injected
 * into the drafter's own KV cache ("context rows"), a block
 * [anchor, MASK x (gamma-1)] run non-causally over context + block, final
 * norm, the TARGET's LM head (shared memory, never copied), a Markov head
 * (vanilla / gated / rnn), a confidence head, and an optional correction
 * head. Loads mainline llama.cpp `dflash` files and PrismML legacy
 * `dspark.dspark.*` files. */
#ifndef DSPARK_DRAFTER_H
#define DSPARK_DRAFTER_H

#include "model.h"
#include "sampler.h"

typedef struct ds_drafter ds_drafter;
typedef struct ds_dctx ds_dctx;

/* Load and validate against the target (shared embedding/head, d, vocab,
 * tap ids in range and increasing, fc width = n_taps*d, block size >= 1,
 * MASK id inside the vocabulary, every tensor's shape). One error line. */
ds_drafter *ds_drafter_load(const char *path, const ds_model *target, char *err, size_t errlen);
void        ds_drafter_free(ds_drafter *d);

int         ds_drafter_block_size(const ds_drafter *d);     /* gamma                      */
int         ds_drafter_n_taps(const ds_drafter *d);
/* Its KV cache's shape: layers, and floats per position per layer. */
void        ds_drafter_kv_shape(const ds_drafter *d, int *n_layer, int *row);
const int  *ds_drafter_tap_layers(const ds_drafter *d);     /* HF ids for ds_set_taps     */
int         ds_drafter_has_confidence(const ds_drafter *d);
int32_t     ds_drafter_mask_id(const ds_drafter *d);
const char *ds_drafter_describe(const ds_drafter *d);       /* one key=value line         */
/* The LM head weight the drafter uses (== the target's output, same memory). */
const ds_weight *ds_drafter_head(const ds_drafter *d);

/* Runtime state: the drafter KV cache (context rows only; block rows are
 * never persisted). Runs on the target context's execution context
 * (ds_ctx_exec), on the target's device; NULL: a single-threaded one of
 * its own. */
ds_dctx *ds_dctx_new(const ds_drafter *d, int n_ctx, ds_exec *ex, char *err, size_t errlen);
void     ds_dctx_free(ds_dctx *x);
/* A drafter context whose rows live in group `group` of another pool (the
 * batch engine's, engine.h): no pool or sequence of its own. Before each
 * use ds_dctx_bind points it at one sequence of that pool (its page table,
 * which must span n_ctx + gamma positions; len = the sequence's n_dctx, and
 * appends and truncates keep n_dctx up to date). The scratch, the MASK
 * cache and the recorded launch sequences are the context's, so one shared
 * context serves every sequence of an engine in turn: a sequence's rows and
 * drafts are bit for bit what a context of its own would give. */
ds_dctx *ds_dctx_new_shared(const ds_drafter *d, int n_ctx, ds_exec *ex, ds_kvpool *pool, int group, int n_seq,
                            char *err, size_t errlen);
int      ds_dctx_bind(ds_dctx *x, ds_seq *s, char *err, size_t errlen);
/* A shared context's rows for many sequences at once: n device tap rows,
 * row m written at rows->pos[m] of sequence rows->seq[m] (the engine's
 * device rows and page tables, pages already taken). Bit for bit the rows
 * ds_dctx_append gives each sequence alone; no n_dctx is changed (the
 * caller's). */
int      ds_dctx_append_rows(ds_dctx *x, const float *taps_dev, int n, const ds_rows *rows, char *err, size_t errlen);
/* Drafting rounds of many sequences of a shared context in one pass: one
 * block forward over every sequence's gamma rows (row k*n + i is slot k of
 * sequence i: the anchors first, then the MASK rows slot by slot), the LM
 * head over each slot's rows, then each sequence's Markov chain. Sequence
 * i's ids are bit for bit what ds_draft gives it alone (a row's arithmetic
 * is its own; which rows share a weight read never changes a bit). q[] is
 * sorted by n_keep, largest first, so the sequences still drafting at slot
 * k are a prefix; n <= ds_dctx_many_max. The sequences' pages for the block
 * rows [p, p + gamma) must be taken and tables (the engine's rows: their
 * tables, pitch, page stride) up to date. *ids_dev: the ids on the device,
 * slot-major: slot j of sequence i at [j * n + i]; valid until the next
 * round. Queued, not waited for. */
typedef struct {
    int32_t seq;                  /* its row of tables->tables               */
    int32_t p;                    /* the anchor's position (its n_dctx)      */
    int32_t anchor;
    int     n_keep;               /* 1..gamma                                */
    const ds_sampler *samp;       /* NULL: greedy                            */
} ds_draft_seq;
int      ds_dctx_many_max(const ds_dctx *x);
int      ds_draft_many(ds_dctx *x, int n, const ds_draft_seq *q, const ds_rows *tables, const int32_t **ids_dev,
                       char *err, size_t errlen);
int      ds_dctx_len(const ds_dctx *x);                     /* context rows held          */
int      ds_dctx_truncate(ds_dctx *x, int n_pos);
/* Fix the retained depth (drafts kept per round, 1..gamma) for the rest of
 * this context's life. A later call with another value fails with "settings
 * changed after initialisation", and ds_draft then rejects any other n_keep
 * before writing anything: a runner set up for k drafts can never hand out a
 * block of another length. Unset (the default), every n_keep is allowed. */
int      ds_dctx_set_retained(ds_dctx *x, int n_keep, char *err, size_t errlen);
/* Append context rows for positions pos0..pos0+n-1 (pos0 == current length)
 * from target taps, n rows of n_taps*d floats. */
int      ds_dctx_append(ds_dctx *x, const float *taps, int n, int pos0, char *err, size_t errlen);
/* The same from rows already on the drafter's device (e.g. the taps a
 * ds_forward_select left in a buffer of the target's backend): they never
 * visit the host. Bitwise the same context rows as ds_dctx_append. */
int      ds_dctx_append_dev(ds_dctx *x, const float *taps_dev, int n, int pos0, char *err, size_t errlen);

/* One drafting round: block [anchor, MASK...] at positions p..p+gamma-1
 * (p == ds_dctx_len), always the full trained gamma rows. Selects n_keep
 * (1..gamma) draft tokens left to right through the Markov chain: slot k
 * gives the token for position p+k+1, chosen with ds_sample(samp, z_k, V,
 * p+k+1). Outputs (any may be NULL): ids[n_keep], confidence[n_keep]
 * (sigmoid per slot, conditional on the earlier slots), logits[n_keep*V]
 * (the corrected z_k). Keeping k drafts yields exactly the first k of the
 * full block's outputs (the block always runs all gamma rows). */
typedef struct {
    const ds_sampler *samp;
    int   n_keep;
} ds_draft_opts;
int ds_draft(ds_dctx *x, int32_t anchor, int p, const ds_draft_opts *o, int32_t *ids, float *confidence,
             float *logits, char *err, size_t errlen);
/* The same round queued on the drafter's execution context and not waited
 * for: *ids_dev is the device address of the n_keep ids (valid until the
 * next round), for a verify on the same context to read in stream order
 * (ds_select_opts.draft_dev). No confidences. Greedy or seeded alike. */
int ds_draft_queue(ds_dctx *x, int32_t anchor, int p, const ds_draft_opts *o, const int32_t **ids_dev,
                   char *err, size_t errlen);
/* The device rows of the round last queued, for a verify that reads all
 * its inputs there (ds_select_opts.rows_dev): positions p..p+gamma at
 * rows[0..gamma] and tokens [anchor, d_1..d_n_keep] at rows[*pitch + 0..];
 * rows[*pitch + 1] is the queue's *ids_dev. Valid until the next round;
 * NULL when a block of more than 63 rows leaves no room for them. */
const int32_t *ds_dctx_rows_dev(const ds_dctx *x, int *pitch);
/* 1 when x was made for drafter d, n_ctx rows and execution context ex,
 * and n_keep drafts a round may be retained (a later generation can then
 * truncate it to 0 and go on with it). */
int ds_dctx_reusable(const ds_dctx *x, const ds_drafter *d, int n_ctx, int n_keep, const ds_exec *ex);

#endif
