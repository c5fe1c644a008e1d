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

#endif
