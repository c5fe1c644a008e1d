/* threadpool.h — a fixed pthread pool for data-parallel loops.
 *
 * The only parallel pattern dspark uses is "split independent outputs": every
 * output element is computed by exactly the same instruction sequence no
 * matter which thread runs it or how many threads exist, so results are
 * bitwise independent of -t. The pool never splits a reduction. */
#ifndef DSPARK_THREADPOOL_H
#define DSPARK_THREADPOOL_H

#include <stddef.h>
#include <stdint.h>

typedef struct ds_pool ds_pool;

/* fn processes items [begin, end) of a loop; arg is the caller's context. */
typedef void (*ds_range_fn)(void *arg, int64_t begin, int64_t end);

ds_pool *ds_pool_new(int n_threads);   /* n_threads >= 1; 1 = run inline   */
void     ds_pool_free(ds_pool *p);
int      ds_pool_threads(const ds_pool *p);
/* Run fn over [0, n) in chunks of at least `grain` items, in parallel, and
 * return when all are done. A NULL pool runs inline. */
void     ds_pool_for(ds_pool *p, int64_t n, int64_t grain, ds_range_fn fn, void *arg);
/* Per-pool scratch memory, 64-byte aligned, grown on demand and owned by the
 * pool (so steady-state forwards do not allocate). Valid until the next call
 * with a larger size. Slot s (0..3) lets a kernel hold several buffers. NULL
 * on allocation failure. Not for use inside ds_pool_for callbacks. */
void    *ds_pool_scratch(ds_pool *p, int slot, size_t bytes);

/* ---- scratch reserved up front (no allocation in the forward) -------------
 * ds_pool_reserve: make sure every thread has a private region of at least
 * per_thread bytes and the pool one shared region of at least shared bytes
 * (64-byte aligned, owned by the pool; grow-only, so several users — the
 * target and the drafter context on one pool — each reserve what they need).
 * Call it at context creation, outside any job. 0, or -1 if out of memory
 * (the earlier regions are kept).
 * ds_pool_for_idx: ds_pool_for whose callback also gets its chunk index
 * (0 .. chunks-1, at most n_threads chunks, in item order; an inline run is
 * chunk 0). Each chunk runs once, on whichever thread claims it, so
 * ds_pool_thread_scratch(p, chunk, &bytes) is a region no other running
 * chunk uses. It and
 * ds_pool_shared_scratch never allocate: NULL (and bytes 0) when nothing (or
 * not enough, for the shared one) is reserved, or p is NULL.
 * ds_pool_stats: counters for profiles and the zero-allocation test. */
typedef void (*ds_range_idx_fn)(void *arg, int64_t begin, int64_t end, int chunk);
int   ds_pool_reserve(ds_pool *p, size_t per_thread, size_t shared);
void  ds_pool_for_idx(ds_pool *p, int64_t n, int64_t grain, ds_range_idx_fn fn, void *arg);
void *ds_pool_thread_scratch(ds_pool *p, int chunk, size_t *bytes);
void *ds_pool_shared_scratch(ds_pool *p, size_t bytes);

typedef struct {
    uint64_t jobs;        /* ds_pool_for calls handed to the workers             */
    uint64_t inline_runs; /* calls run on the caller alone (one chunk / 1 thread) */
    uint64_t sleeps;      /* times a worker or the caller blocked in the kernel   */
    uint64_t scratch_allocs; /* allocations by ds_pool_scratch growth + reserve  */
} ds_pool_stats_t;
void ds_pool_stats(ds_pool *p, ds_pool_stats_t *out);

#endif
