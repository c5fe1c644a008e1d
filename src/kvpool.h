/* kvpool.h — the KV cache as a pool of pages, and the sequences that own
 * them (docs/ENGINE.md).
 *
 * A page holds P consecutive positions of one sequence: for every group (0:
 * the target's layers, 1: the drafter's context layers) and every layer of
 * it, P rows of K and then P rows of V, page after page in one device
 * buffer (page-major, so that a page is one contiguous copy for
 * copy-on-write, snapshots and files). A sequence is a page table: position
 * j lives in page table[j / P], row j % P. Kernels read K/V through the
 * table (backend.h, ds_rows); the arithmetic walks positions, never pages,
 * so a sequence's bits do not depend on where its pages are.
 *
 * Host bookkeeping per page: a reference count (a page is shared by the
 * sequences whose tables hold it; fork shares, writes copy first), and for
 * the exact prefix cache a hash of its token ids chained through its
 * parent page, the ids themselves, the parent's (id, generation) and which
 * groups hold valid rows. A page with no reference and a hash is cached:
 * it sits in an LRU list and is evicted only when no free page is left.
 * Allocation takes the lowest free page id, so on the CPU (memory committed
 * on first touch) resident memory follows what is in use. */
#ifndef DSPARK_KVPOOL_H
#define DSPARK_KVPOOL_H

#include "backend.h"

#define DS_KV_GROUPS 2         /* 0: target, 1: drafter context rows                          */

typedef struct ds_kvpool ds_kvpool;

typedef struct {
    int n_groups;              /* 1 or 2                                                     */
    int n_layer[DS_KV_GROUPS]; /* layers of each group                                       */
    int row[DS_KV_GROUPS];     /* floats per position per layer (n_kv_head * head_dim)       */
    int n_pages;               /* the pool's limit                                           */
} ds_kvpool_shape;

/* Bytes one page takes on the device. */
size_t ds_kvpool_page_bytes(const ds_kvpool_shape *s);
/* A pool of s->n_pages pages on be. NULL with one line when the shape is
 * bad or the memory cannot be had. */
ds_kvpool *ds_kvpool_new(ds_backend *be, const ds_kvpool_shape *s, char *err, size_t errlen);
void       ds_kvpool_free(ds_kvpool *p);

/* Device pointers of (group, layer)'s K and V rows in page 0: page q, row r
 * is at ptr + q * ds_kvpool_page_stride + r * row. */
float  *ds_kvpool_k(const ds_kvpool *p, int group, int layer);
float  *ds_kvpool_v(const ds_kvpool *p, int group, int layer);
int64_t ds_kvpool_page_stride(const ds_kvpool *p);   /* floats */
float  *ds_kvpool_page_base(const ds_kvpool *p, int page);   /* page's first float (device) */
int     ds_kvpool_n_pages(const ds_kvpool *p);
int     ds_kvpool_n_free(const ds_kvpool *p);        /* free + evictable cached pages */
int     ds_kvpool_n_cached(const ds_kvpool *p);      /* pages with a hash (in use or not) */
const ds_kvpool_shape *ds_kvpool_shape_of(const ds_kvpool *p);

/* Low-level page handling (sequences below use these). */
int  ds_kvpool_alloc(ds_kvpool *p);                  /* ref 1; -1 when none is left */
void ds_kvpool_ref(ds_kvpool *p, int page);
void ds_kvpool_unref(ds_kvpool *p, int page);
int  ds_kvpool_refs(const ds_kvpool *p, int page);
/* Page dst := page src (every group), on ex's stream. */
void ds_kvpool_copy(ds_kvpool *p, ds_exec *ex, int dst, int src);

/* ---- sequences ---------------------------------------------------------- */
typedef struct {
    int      max_pages;        /* table capacity: positions [0, max_pages * P)             */
    int      n_pages;          /* pages in the table                                        */
    int32_t *table;            /* host [max_pages]                                          */
    int      n_past;           /* target rows valid: positions [0, n_past)                 */
    int      n_dctx;           /* drafter context rows valid (group 1)                      */
    int32_t *tokens;           /* host [max_pages * P]: the token at each position, when known */
    int      n_tokens;         /* tokens[0, n_tokens) are the sequence's ids                */
    int      n_hashed;         /* leading full pages whose chain hash is in hash[]          */
    uint64_t *hash;            /* host [max_pages]: chain hash of each hashed page          */
    int      dirty_lo, dirty_hi; /* table entries changed since the device copy: [lo, hi)   */
} ds_seq;

/* An empty sequence able to hold max_pos positions. 0, or -1 with err. */
int  ds_seq_init(ds_seq *s, int max_pos, char *err, size_t errlen);
/* Releases every page it holds and its host arrays. */
void ds_seq_release(ds_seq *s, ds_kvpool *p);
/* Drops every page (the sequence becomes empty; its arrays stay). */
void ds_seq_clear(ds_seq *s, ds_kvpool *p);
/* Makes positions [p0, p1) writable: pages allocated where the table ends,
 * a page shared with another sequence or published in the prefix cache
 * replaced by a private copy (copy-on-write, queued on ex). 0, or -1 when
 * the pool has no page left (nothing is changed then) or p1 exceeds the
 * table (err says which). */
int  ds_seq_prepare(ds_seq *s, ds_kvpool *p, ds_exec *ex, int p0, int p1, char *err, size_t errlen);
/* dst := a copy of src's first n positions sharing its pages (references,
 * no copy: the first write to a shared page copies it). dst must be empty.
 * 0, or -1 with err. */
int  ds_seq_fork(ds_seq *dst, const ds_seq *src, ds_kvpool *p, int n, char *err, size_t errlen);
/* Pages past position n_keep released (positions >= n_keep become
 * unwritten). n_past / n_dctx are clipped to n_keep. */
void ds_seq_trim(ds_seq *s, ds_kvpool *p, int n_keep);

/* ---- reads and snapshots (diagnostics) --------------------------------------
 * Host copies of positions [pos0, pos0 + n) of group g, every layer: k, v
 * each [n_layer][n][row] (synchronises). */
void ds_seq_read(const ds_seq *s, ds_kvpool *p, ds_exec *ex, int g, int pos0, int n, float *k, float *v);
/* A device copy of the pages holding a sequence's first n positions (every
 * group), restored later into the same positions (diverge's S0). */
typedef struct ds_kv_snap {
    ds_backend *be;
    int    n, n_pages;
    float *data;                 /* device: n_pages pages                          */
} ds_kv_snap;
int  ds_seq_snapshot(const ds_seq *s, ds_kvpool *p, ds_exec *ex, int n, ds_kv_snap *out);
/* Positions [0, snap->n) of s := the snapshot's (pages made writable first).
 * 0, or -1 when out of pages. */
int  ds_seq_restore(ds_seq *s, ds_kvpool *p, ds_exec *ex, const ds_kv_snap *snap);
void ds_kv_snap_free(ds_kv_snap *s);

/* ---- the exact prefix cache ------------------------------------------------
 * Publish: every full page of s whose positions are all committed (target
 * rows, and drafter rows too when need_groups has bit 1) and whose ids are
 * known gets its chain hash and is entered in the cache (it stays s's page;
 * from now on a write into it copies it first). Lookup: the longest run of
 * leading full pages of ids[0, n) found in the cache — equal ids and an
 * identical parent chain, never only an equal hash — whose groups include
 * need_groups, at most max_pages of them; they are appended to the (empty)
 * sequence d by reference. Returns the positions reused. */
void ds_prefix_publish(ds_kvpool *p, ds_seq *s, unsigned groups_valid);
int  ds_prefix_lookup(ds_kvpool *p, ds_seq *d, const int32_t *ids, int n, unsigned need_groups, int max_pages);

#endif
