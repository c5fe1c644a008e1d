/* threadpool.c — a fixed pool of persistent pthreads for data-parallel loops.
 *
 * One pattern only: ds_pool_for(n, grain, fn) cuts [0, n) into at most
 * n_threads contiguous chunks of at least `grain` items, the calling thread
 * and the workers claim chunks one at a time until none is left, and the
 * call returns when every chunk is done. The split is a pure function of
 * (n, grain, n_threads) and each item is processed by exactly one fn call —
 * which items share a call, or which thread runs it, never matters to the
 * kernels, because they only split independent outputs.
 *
 * ==== Hand-off =================================================================
 * A decode step issues hundreds of short ds_pool_for calls (tens of
 * microseconds each), so waking sleeping threads through the kernel every
 * time would dominate. The pool therefore spins first and sleeps second:
 *   start:  the caller writes the job, stores the `ticket` (release: the
 *           job's chunk count and next unclaimed chunk), bumps `gen` and
 *           broadcasts cv_go under the mutex; workers spin on `gen` for a
 *           while, then sleep on cv_go (checking `gen` under the mutex, so a
 *           wake-up can never be lost).
 *   claim:  a thread takes chunk i by a compare-and-swap of the ticket from
 *           next = i to i + 1 (acquire: it then sees the job the ticket was
 *           published with). The caller claims too, so a worker that is not
 *           running (a shared machine, more threads than free cores) costs
 *           its chunk's time on the caller, not a time slice of waiting.
 *   finish: each finished chunk increments `done`; the caller spins until it
 *           reaches the chunk count, then sleeps on cv_done; the thread that
 *           finishes the last chunk signals cv_done under the mutex.
 * A job's fields are read only after a successful claim, and the caller
 * does not return (nor write the next job) while a claimed chunk is
 * unfinished, so a late worker never sees a half-written job: it finds the
 * ticket exhausted, or claims a chunk of the newer job whole. */
#include "threadpool.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#define DS_POOL_SCRATCH 4
#define DS_POOL_MAX_THREADS 512
#define DS_POOL_SPIN 8192       /* polls before sleeping (~0.1-2 ms)                */
#define DS_POOL_SPIN_PURE 1024  /* of which pure pause; the rest also yield the CPU  */

typedef struct {
    struct ds_pool *pool;
    int id;
} ds_worker;

struct ds_pool {
    int n_threads;
    pthread_t *threads;
    ds_worker *workers;
    int n_started;

    pthread_mutex_t mu;
    pthread_cond_t cv_go, cv_done;
    atomic_uint_fast64_t gen;       /* job generation; bumped to start a job  */
    /* (job number << 20) | (chunks << 10) | next unclaimed chunk             */
    atomic_uint_fast64_t ticket;
    atomic_int done;                /* chunks of the current job finished     */
    atomic_int stop;
    atomic_int busy;                /* a job is in flight                     */

    /* the current job; written by the caller before `gen` is bumped */
    ds_range_fn fn;
    ds_range_idx_fn fn_idx;         /* set instead of fn by ds_pool_for_idx   */
    void *arg;
    int64_t n;
    int chunks;

    struct { void *p; size_t cap; } scratch[DS_POOL_SCRATCH];

    /* reserved scratch (ds_pool_reserve): one region per thread + a shared one */
    unsigned char *thr_mem;
    size_t thr_bytes;               /* per thread, a multiple of 64           */
    void *shared;
    size_t shared_bytes;

    /* counters (ds_pool_stats); jobs/inline/allocs are the caller's, sleeps atomic */
    uint64_t n_jobs, n_inline, n_allocs;
    atomic_uint_fast64_t n_sleeps;
};

/* Poll number s of a spin: pause, and after the first few hundred also give
 * the core away — with more threads than free cores (a loaded machine, or
 * -t above the core count) a pure spin would burn the time slice the
 * thread we are waiting for needs. */
static inline void cpu_relax(int s) {
    if (s >= DS_POOL_SPIN_PURE) {
        sched_yield();
        return;
    }
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

/* Chunk t of c over [0, n): [n*t/c, n*(t+1)/c). With c <= n/grain every
 * chunk holds at least `grain` items. */
static inline void run_chunk(struct ds_pool *p, int t) {
    int64_t b = p->n * t / p->chunks, e = p->n * (t + 1) / p->chunks;
    if (e <= b) return;
    if (p->fn_idx) p->fn_idx(p->arg, b, e, t);
    else p->fn(p->arg, b, e);
}

#define TK_BITS 10
#define TK_MASK ((1u << TK_BITS) - 1)
/* Claim the next chunk of the published job: its index, or -1 when none is
 * left. *nch: the job's chunk count. */
static inline int claim(struct ds_pool *p, int *nch) {
    uint_fast64_t t = atomic_load_explicit(&p->ticket, memory_order_acquire);
    for (;;) {
        const int next = (int)(t & TK_MASK), ch = (int)((t >> TK_BITS) & TK_MASK);
        if (next >= ch) return -1;
        if (atomic_compare_exchange_weak_explicit(&p->ticket, &t, t + 1, memory_order_acq_rel,
                                                  memory_order_acquire)) {
            *nch = ch;
            return next;
        }
    }
}
/* Run chunks until none is left; the thread that finishes the job's last
 * chunk wakes a sleeping caller (worker = 1; the caller itself need not). */
static void run_claims(struct ds_pool *p, int worker) {
    int ch = 0, i;
    while ((i = claim(p, &ch)) >= 0) {
        run_chunk(p, i);
        if (atomic_fetch_add_explicit(&p->done, 1, memory_order_acq_rel) + 1 == ch && worker) {
            pthread_mutex_lock(&p->mu);
            pthread_cond_signal(&p->cv_done);
            pthread_mutex_unlock(&p->mu);
        }
    }
}

static void *worker_main(void *vp) {
    ds_worker *w = vp;
    struct ds_pool *p = w->pool;
    uint64_t seen = 0;
    for (;;) {
        uint64_t g = atomic_load_explicit(&p->gen, memory_order_acquire);
        for (int s = 0; g == seen && s < DS_POOL_SPIN; s++) {
            cpu_relax(s);
            g = atomic_load_explicit(&p->gen, memory_order_acquire);
        }
        if (g == seen) {
            atomic_fetch_add_explicit(&p->n_sleeps, 1, memory_order_relaxed);
            pthread_mutex_lock(&p->mu);
            while ((g = atomic_load_explicit(&p->gen, memory_order_acquire)) == seen)
                pthread_cond_wait(&p->cv_go, &p->mu);
            pthread_mutex_unlock(&p->mu);
        }
        seen = g;
        if (atomic_load_explicit(&p->stop, memory_order_acquire)) break;
        run_claims(p, 1);
    }
    return NULL;
}

/* Bump the generation and wake everyone (job fields already written). */
static void publish(struct ds_pool *p) {
    pthread_mutex_lock(&p->mu);
    atomic_store_explicit(&p->done, 0, memory_order_relaxed);
    const uint_fast64_t job = (atomic_load_explicit(&p->ticket, memory_order_relaxed) >> (2 * TK_BITS)) + 1;
    atomic_store_explicit(&p->ticket, (job << (2 * TK_BITS)) | ((uint_fast64_t)p->chunks << TK_BITS),
                          memory_order_release);
    atomic_fetch_add_explicit(&p->gen, 1, memory_order_release);
    pthread_cond_broadcast(&p->cv_go);
    pthread_mutex_unlock(&p->mu);
}

static void shutdown_workers(struct ds_pool *p) {
    if (p->n_started == 0) return;
    atomic_store_explicit(&p->stop, 1, memory_order_release);
    pthread_mutex_lock(&p->mu);
    atomic_fetch_add_explicit(&p->gen, 1, memory_order_release);
    pthread_cond_broadcast(&p->cv_go);
    pthread_mutex_unlock(&p->mu);
    for (int i = 0; i < p->n_started; i++) pthread_join(p->threads[i], NULL);
    p->n_started = 0;
}

/* ==========================================================================
 * public API
 * ========================================================================== */
ds_pool *ds_pool_new(int n_threads) {
    if (n_threads < 1) n_threads = 1;
    if (n_threads > DS_POOL_MAX_THREADS) n_threads = DS_POOL_MAX_THREADS;
    struct ds_pool *p = calloc(1, sizeof *p);
    if (!p) return NULL;
    p->n_threads = n_threads;
    atomic_init(&p->gen, 0);
    atomic_init(&p->ticket, 0);
    atomic_init(&p->done, 0);
    atomic_init(&p->stop, 0);
    atomic_init(&p->busy, 0);
    atomic_init(&p->n_sleeps, 0);
    if (pthread_mutex_init(&p->mu, NULL)) { free(p); return NULL; }
    if (pthread_cond_init(&p->cv_go, NULL)) goto fail_mu;
    if (pthread_cond_init(&p->cv_done, NULL)) goto fail_go;
    if (n_threads > 1) {
        p->threads = calloc((size_t)n_threads - 1, sizeof *p->threads);
        p->workers = calloc((size_t)n_threads - 1, sizeof *p->workers);
        if (!p->threads || !p->workers) goto fail_all;
        for (int i = 0; i < n_threads - 1; i++) {
            p->workers[i].pool = p;
            p->workers[i].id = i + 1;
            if (pthread_create(&p->threads[i], NULL, worker_main, &p->workers[i])) goto fail_all;
            p->n_started++;
        }
    }
    return p;
fail_all:
    shutdown_workers(p);
    free(p->threads);
    free(p->workers);
    pthread_cond_destroy(&p->cv_done);
fail_go:
    pthread_cond_destroy(&p->cv_go);
fail_mu:
    pthread_mutex_destroy(&p->mu);
    free(p);
    return NULL;
}

void ds_pool_free(ds_pool *p) {
    if (!p) return;
    shutdown_workers(p);
    free(p->threads);
    free(p->workers);
    pthread_cond_destroy(&p->cv_done);
    pthread_cond_destroy(&p->cv_go);
    pthread_mutex_destroy(&p->mu);
    for (int s = 0; s < DS_POOL_SCRATCH; s++) free(p->scratch[s].p);
    free(p->thr_mem);
    free(p->shared);
    free(p);
}

int ds_pool_threads(const ds_pool *p) { return p ? p->n_threads : 1; }

/* The one job runner behind ds_pool_for and ds_pool_for_idx (exactly one
 * of fn / fn_idx set). */
static void pool_run(ds_pool *p, int64_t n, int64_t grain, ds_range_fn fn, ds_range_idx_fn fn_idx,
                     void *arg) {
    if (n <= 0) return;
    if (grain < 1) grain = 1;
    int64_t c = n / grain;
    if (c < 1) c = 1;
    if (!p || c == 1 || p->n_threads == 1) {
        if (p) p->n_inline++;
        if (fn_idx) fn_idx(arg, 0, n, 0);
        else fn(arg, 0, n);
        return;
    }
    if (c > p->n_threads) c = p->n_threads;
    /* A ds_pool_for from inside a callback (or from a second thread while a
     * job runs) cannot use the workers: run it inline instead of deadlocking. */
    if (atomic_exchange_explicit(&p->busy, 1, memory_order_acquire)) {
        if (fn_idx) fn_idx(arg, 0, n, 0);
        else fn(arg, 0, n);
        return;
    }
    p->n_jobs++;
    p->fn = fn;
    p->fn_idx = fn_idx;
    p->arg = arg;
    p->n = n;
    p->chunks = (int)c;
    publish(p);
    run_claims(p, 0);
    int done = 0;
    for (int s = 0; s < DS_POOL_SPIN; s++) {
        if (atomic_load_explicit(&p->done, memory_order_acquire) == (int)c) { done = 1; break; }
        cpu_relax(s);
    }
    if (!done) {
        atomic_fetch_add_explicit(&p->n_sleeps, 1, memory_order_relaxed);
        pthread_mutex_lock(&p->mu);
        while (atomic_load_explicit(&p->done, memory_order_acquire) != (int)c)
            pthread_cond_wait(&p->cv_done, &p->mu);
        pthread_mutex_unlock(&p->mu);
    }
    atomic_store_explicit(&p->busy, 0, memory_order_release);
}

void ds_pool_for(ds_pool *p, int64_t n, int64_t grain, ds_range_fn fn, void *arg) {
    pool_run(p, n, grain, fn, NULL, arg);
}

void ds_pool_for_idx(ds_pool *p, int64_t n, int64_t grain, ds_range_idx_fn fn, void *arg) {
    pool_run(p, n, grain, NULL, fn, arg);
}

void *ds_pool_scratch(ds_pool *p, int slot, size_t bytes) {
    if (!p || slot < 0 || slot >= DS_POOL_SCRATCH) return NULL;
    if (bytes == 0) bytes = 1;
    if (bytes > p->scratch[slot].cap || !p->scratch[slot].p) {
        if (bytes > SIZE_MAX - 63) return NULL;
        size_t cap = (bytes + 63) & ~(size_t)63;
        void *np = aligned_alloc(64, cap);
        if (!np) return NULL;
        p->n_allocs++;
        free(p->scratch[slot].p);
        p->scratch[slot].p = np;
        p->scratch[slot].cap = cap;
    }
    return p->scratch[slot].p;
}

/* ---- reserved scratch ------------------------------------------------------
 * Thread t's region is thr_mem + t * thr_bytes. A nested (inline) ds_pool_for
 * from inside a callback runs as chunk 0 on the calling thread, which may be
 * a worker: kernels never nest, so that never shares a region in practice. */
int ds_pool_reserve(ds_pool *p, size_t per_thread, size_t shared) {
    if (!p) return 0;
    if (per_thread <= p->thr_bytes && shared <= p->shared_bytes) return 0;
    /* never free regions a running job may be using (a second caller) */
    if (atomic_load_explicit(&p->busy, memory_order_acquire)) return -1;
    if (per_thread > p->thr_bytes) {
        if (per_thread > (SIZE_MAX - 63) / (size_t)p->n_threads) return -1;
        size_t each = (per_thread + 63) & ~(size_t)63;
        unsigned char *m = aligned_alloc(64, each * (size_t)p->n_threads);
        if (!m) return -1;
        p->n_allocs++;
        free(p->thr_mem);
        p->thr_mem = m;
        p->thr_bytes = each;
    }
    if (shared > p->shared_bytes) {
        if (shared > SIZE_MAX - 63) return -1;
        size_t cap = (shared + 63) & ~(size_t)63;
        void *m = aligned_alloc(64, cap);
        if (!m) return -1;
        p->n_allocs++;
        free(p->shared);
        p->shared = m;
        p->shared_bytes = cap;
    }
    return 0;
}

void *ds_pool_thread_scratch(ds_pool *p, int chunk, size_t *bytes) {
    if (!p || !p->thr_mem || chunk < 0 || chunk >= p->n_threads) {
        *bytes = 0;
        return NULL;
    }
    *bytes = p->thr_bytes;
    return p->thr_mem + (size_t)chunk * p->thr_bytes;
}

void *ds_pool_shared_scratch(ds_pool *p, size_t bytes) {
    return p && p->shared && bytes <= p->shared_bytes ? p->shared : NULL;
}

void ds_pool_stats(ds_pool *p, ds_pool_stats_t *out) {
    if (!p) {
        *out = (ds_pool_stats_t){0};
        return;
    }
    out->jobs = p->n_jobs;
    out->inline_runs = p->n_inline;
    out->sleeps = (uint64_t)atomic_load_explicit(&p->n_sleeps, memory_order_relaxed);
    out->scratch_allocs = p->n_allocs;
}
