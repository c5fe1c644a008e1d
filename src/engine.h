/* engine.h — many sequences, one forward (docs/ENGINE.md).
 *
 * The engine owns a model's execution context, one KV page pool (group 0:
 * the target's layers; group 1: a drafter's context rows, when it has a
 * drafter) and a fixed number of sequence slots. A forward is a list of
 * rows of any of its sequences — prefill chunks, decode rows, verify
 * blocks, in any mix — and every row's result is bit for bit what its
 * sequence alone would get: with the canonical kernel set a row's
 * arithmetic depends on that row only (tests/test_engine.c proves it
 * against one sequence at a time, and shows --kernels fast breaking it).
 *
 * Rows of one sequence must be contiguous in the list and at consecutive
 * positions, the first at or below what the sequence holds (rows >= it are
 * overwritten). A row may ask for its logits (to the host), for the token
 * its sequence's sampler selects at the next position, or for nothing. */
#ifndef DSPARK_ENGINE_H
#define DSPARK_ENGINE_H

#include "model.h"
#include "kvpool.h"

typedef struct ds_engine ds_engine;
typedef struct ds_drafter ds_drafter;

typedef struct {
    int n_seq_max;              /* sequence slots (>= 1)                                  */
    int n_ctx;                  /* positions a sequence may hold                          */
    int n_pages;                /* pool pages; 0: enough for every slot's n_ctx            */
    int m_max;                  /* rows per internal forward chunk; 0: 64                  */
    int n_threads;              /* the CPU's -t                                            */
    const ds_drafter *drafter;  /* NULL: no drafter context rows (group 1)                 */
    int draft_pass;             /* sequences per drafting pass (1..16); 0: 16              */
    int no_graphs;              /* 1: never record a batch shape (A/B); 0: record repeated
                                   chunks without drafter rows; -1: with them too (A/B)    */
} ds_engine_params;

/* NULL with one line: a bad size, or memory the pool cannot have. */
ds_engine *ds_engine_new(const ds_model *m, const ds_engine_params *p, char *err, size_t errlen);
void       ds_engine_free(ds_engine *e);

const ds_model *ds_engine_model(const ds_engine *e);
ds_kvpool      *ds_engine_pool(ds_engine *e);
ds_exec        *ds_engine_exec(ds_engine *e);
int             ds_engine_n_ctx(const ds_engine *e);
int             ds_engine_m_max(const ds_engine *e);
void            ds_engine_set_kernels(ds_engine *e, const ds_kernel_set *ks);

/* ---- sequences ------------------------------------------------------------
 * Slots are small integers. new: -1 with err when every slot is taken.
 * fork: a new slot holding the first n positions of src, sharing its pages.
 * truncate: positions >= n dropped (n <= what it holds). free: the slot
 * and its pages released. */
int  ds_engine_seq_new(ds_engine *e, char *err, size_t errlen);
int  ds_engine_seq_fork(ds_engine *e, int src, int n, char *err, size_t errlen);
int  ds_engine_seq_truncate(ds_engine *e, int s, int n, char *err, size_t errlen);
void ds_engine_seq_free(ds_engine *e, int s);
int  ds_engine_seq_valid(const ds_engine *e, int s);
const ds_seq *ds_engine_seq(const ds_engine *e, int s);
int  ds_engine_n_seqs(const ds_engine *e);              /* slots in use */
int  ds_engine_seq_slots(const ds_engine *e);           /* slots in all */
/* The prefix cache for an empty sequence: the longest run of full pages of
 * ids[0, n) already in the pool, at most (n - 1) / P of them (the last
 * token is always computed, for its logits), reused by reference. need_dctx:
 * the drafter rows must be there too. Returns the positions reused. */
int  ds_engine_prefix_lookup(ds_engine *e, int s, const int32_t *ids, int n, int need_dctx);
/* Enter the sequence's fully committed pages into the prefix cache. */
void ds_engine_prefix_publish(ds_engine *e, int s);

/* A sequence's state to a file and back: its positions' token ids and every
 * layer's K/V rows (group 0), with the model's shape so that a file from
 * another model is refused. Written through outfile.c (temp file, rename).
 * load: a new slot holding the file's positions, or -1 with err (bad magic,
 * another shape, a size that does not add up, no slot or pages). */
int ds_engine_seq_save(ds_engine *e, int s, const char *path, char *err, size_t errlen);
int ds_engine_seq_load(ds_engine *e, const char *path, char *err, size_t errlen);

/* ---- one forward ------------------------------------------------------------ */
/* DS_ROW_DCTX: the row's taps become the sequence's drafter context row at
 * its position (group 1, on the device; engines with a drafter). A
 * sequence's DCTX rows are its first rows in the batch and start at or
 * below the drafter rows it holds (rows from there on are replaced). */
/* DS_ROW_DRAFTED: the row's token is not given (row.token is ignored): it
 * is draft k of its sequence's round queued by ds_engine_draft_queue, the
 * row at the anchor's position + 1 + k — read on the device, so drafting
 * and the verify need no host round trip; ds_fwd_out.tokens says which
 * token each such row had. */
enum { DS_ROW_LOGITS = 1, DS_ROW_SELECT = 2, DS_ROW_DCTX = 4, DS_ROW_DRAFTED = 8 };
typedef struct {
    int32_t seq, pos, token;
    uint8_t want;               /* DS_ROW_* bits, 0 = nothing                             */
    const ds_sampler *samp;     /* SELECT: the sequence's sampler (NULL: greedy)          */
} ds_row;

typedef struct {
    float   *logits;            /* host: n_vocab floats per LOGITS row, in row order, or NULL */
    int32_t *ids;               /* host [n]: the selected id of each SELECT row              */
    int32_t *tokens;            /* host [n] or NULL: the token of each DRAFTED row           */
} ds_fwd_out;

/* 0, or -1 with one line (nothing is run when the rows break a rule). */
int ds_engine_forward(ds_engine *e, const ds_row *rows, int n, ds_fwd_out *out, char *err, size_t errlen);

/* ---- drafting (engines with a drafter) -----------------------------------
 * One drafting round for each of n sequences: the block [anchor, MASK ...]
 * at the position the sequence holds (its n_past, which its drafter context
 * rows must equal), n_keep drafts chosen with samp (NULL: greedy) — bit for
 * bit ds_draft on a drafter context of its own with the same rows. ids:
 * n * gamma ints, sequence k's drafts at ids[k * gamma ..]. The block rows'
 * pages are taken (positions up to n_past + gamma - 1); nothing a sequence
 * holds changes. The rounds run in batched passes (ds_draft_many: one
 * block forward, one LM head and each sequence's head chain for up to
 * draft_pass sequences; on a backend that records launch sequences, one
 * recording per pass shape). 0, or -1 with one line. */
typedef struct {
    int32_t seq, anchor;
    int     n_keep;
    const ds_sampler *samp;
} ds_draft_req;
int ds_engine_draft(ds_engine *e, int n, const ds_draft_req *dr, int32_t *ids, char *err, size_t errlen);
/* The same rounds, their drafts left on the device for the next forward's
 * DS_ROW_DRAFTED rows (no download, no wait). A sequence's queued drafts
 * stay valid until its next round, a truncation below its anchor, or its
 * end. 0, or -1 with one line. */
int ds_engine_draft_queue(ds_engine *e, int n, const ds_draft_req *dr, char *err, size_t errlen);
const ds_drafter *ds_engine_drafter(const ds_engine *e);
/* Chunks the engine recorded as launch sequences and replayed (a backend
 * with graph_begin; 0 and 0 elsewhere or with no_graphs). */
void ds_engine_graph_counts(const ds_engine *e, long *recorded, long *replayed);

#endif
