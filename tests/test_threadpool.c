/* test_threadpool.c — ds_pool_for chunking, scratch memory, lifecycle.
 *
 *   chunking   every index in [0, n) is visited exactly once, chunks are
 *              contiguous and respect the grain, for n = 0, 1, 7, 1000 and
 *              1..4 threads (and a NULL pool)
 *   parallel   with several threads the chunks really run on several threads
 *   scratch    4 slots, 64-byte aligned, grow on demand, contents kept
 *              while the size does not grow
 *   lifecycle  create/use/free 100 times (ASan checks for leaks) */
#include "threadpool.h"

#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static int n_pass, n_fail;
#define CHECK(cond, ...)                                                                   \
    do {                                                                                   \
        if (cond) { n_pass++; } else {                                                     \
            n_fail++; printf("FAIL %s:%d: ", __FILE__, __LINE__); printf(__VA_ARGS__);     \
            printf("\n");                                                                  \
        }                                                                                  \
    } while (0)

typedef struct {
    atomic_int *hits;        /* per index                                  */
    atomic_int calls;
    atomic_int small_chunks; /* chunks shorter than the grain (n >= grain) */
    int64_t grain, n;
    atomic_int distinct;     /* set when a call ran off the calling thread */
    pthread_t caller;
} visit_ctx;

static void visit(void *arg, int64_t b, int64_t e) {
    visit_ctx *c = arg;
    atomic_fetch_add(&c->calls, 1);
    if (c->n >= c->grain && e - b < c->grain) atomic_fetch_add(&c->small_chunks, 1);
    if (!pthread_equal(pthread_self(), c->caller)) atomic_store(&c->distinct, 1);
    for (int64_t i = b; i < e; i++) atomic_fetch_add(&c->hits[i], 1);
}

static void test_chunking(void) {
    static const int64_t ns[] = {0, 1, 7, 1000};
    static const int64_t grains[] = {1, 3, 100};
    int bad = 0;
    for (int th = 0; th <= 4; th++) {                /* 0 = NULL pool */
        ds_pool *p = th ? ds_pool_new(th) : NULL;
        CHECK(th == 0 || p, "ds_pool_new(%d)", th);
        CHECK(ds_pool_threads(p) == (th ? th : 1), "ds_pool_threads");
        for (int ni = 0; ni < 4; ni++)
            for (int gi = 0; gi < 3; gi++)
                for (int rep = 0; rep < 3; rep++) {
                    int64_t n = ns[ni];
                    visit_ctx c = {.grain = grains[gi], .n = n, .caller = pthread_self()};
                    c.hits = calloc((size_t)n + 1, sizeof *c.hits);
                    atomic_init(&c.calls, 0);
                    atomic_init(&c.small_chunks, 0);
                    atomic_init(&c.distinct, 0);
                    ds_pool_for(p, n, grains[gi], visit, &c);
                    for (int64_t i = 0; i < n; i++) bad += atomic_load(&c.hits[i]) != 1;
                    int calls = atomic_load(&c.calls);
                    int maxc = th ? th : 1;
                    bad += calls > maxc || (n > 0 && calls < 1) || (n == 0 && calls != 0);
                    bad += atomic_load(&c.small_chunks) != 0;
                    /* enough work for every thread: all of them are used */
                    if (th > 1 && n / grains[gi] >= th) bad += calls != th;
                    free(c.hits);
                }
        ds_pool_free(p);
    }
    CHECK(bad == 0, "chunking: %d violations", bad);
    printf("%s ds_pool_for: each index once, contiguous grain-respecting chunks, "
           "n=0,1,7,1000 threads NULL,1..4\n", bad ? "FAIL" : "PASS");
}

/* Work that blocks until another thread has joined proves real parallelism
 * (bounded wait so a broken pool fails instead of hanging). */
typedef struct { atomic_int arrived; atomic_int ok; } meet_ctx;
static void meet(void *arg, int64_t b, int64_t e) {
    meet_ctx *m = arg;
    atomic_fetch_add(&m->arrived, 1);
    for (long spin = 0; spin < 2000000000L; spin++)
        if (atomic_load(&m->arrived) >= 2) { atomic_store(&m->ok, 1); return; }
}
static void test_parallel(void) {
    ds_pool *p = ds_pool_new(2);
    meet_ctx m;
    atomic_init(&m.arrived, 0);
    atomic_init(&m.ok, 0);
    ds_pool_for(p, 2, 1, meet, &m);
    CHECK(atomic_load(&m.ok) == 1 && atomic_load(&m.arrived) == 2, "two chunks ran concurrently");
    ds_pool_free(p);
    printf("%s two chunks run concurrently on a 2-thread pool\n", atomic_load(&m.ok) ? "PASS" : "FAIL");
}

static void test_scratch(void) {
    ds_pool *p = ds_pool_new(2);
    int ok = 1;
    for (int s = 0; s < 4; s++) {
        unsigned char *a = ds_pool_scratch(p, s, 100);
        ok &= a && ((uintptr_t)a & 63) == 0;
        if (!a) continue;
        memset(a, 0xA0 + s, 100);
        unsigned char *b = ds_pool_scratch(p, s, 64);          /* smaller: same buffer */
        ok &= b == a && b[99] == 0xA0 + s;
        unsigned char *c = ds_pool_scratch(p, s, 1 << 20);     /* grows */
        ok &= c && ((uintptr_t)c & 63) == 0;
        if (c) memset(c, 1, 1 << 20);
    }
    /* slots are independent */
    unsigned char *s0 = ds_pool_scratch(p, 0, 16), *s1 = ds_pool_scratch(p, 1, 16);
    ok &= s0 && s1 && s0 != s1;
    ok &= ds_pool_scratch(p, 4, 16) == NULL && ds_pool_scratch(p, -1, 16) == NULL;
    ok &= ds_pool_scratch(NULL, 0, 16) == NULL;
    ds_pool_free(p);
    CHECK(ok, "scratch");
    printf("%s ds_pool_scratch: 4 aligned slots, growth, reuse\n", ok ? "PASS" : "FAIL");
}

static void sum_range(void *arg, int64_t b, int64_t e) {
    atomic_llong *s = arg;
    long long t = 0;
    for (int64_t i = b; i < e; i++) t += i;
    atomic_fetch_add(s, t);
}
static void test_lifecycle(void) {
    int ok = 1;
    for (int i = 0; i < 100; i++) {
        ds_pool *p = ds_pool_new(1 + i % 4);
        if (!p) { ok = 0; break; }
        if (i % 3) ds_pool_scratch(p, i % 4, (size_t)(i + 1) * 1000);
        atomic_llong s;
        atomic_init(&s, 0);
        for (int r = 0; r < i % 5; r++) ds_pool_for(p, 1000, 10, sum_range, &s);
        ok &= atomic_load(&s) == (long long)(i % 5) * 499500;
        ds_pool_free(p);
    }
    ds_pool_free(NULL);
    CHECK(ok, "lifecycle");
    printf("%s create/use/free 100 pools\n", ok ? "PASS" : "FAIL");
}

/* Many back-to-back jobs: the spin/sleep hand-off never loses a wake-up. */
static void test_many_jobs(void) {
    ds_pool *p = ds_pool_new(3);
    atomic_llong s;
    atomic_init(&s, 0);
    for (int r = 0; r < 20000; r++) ds_pool_for(p, 30, 1, sum_range, &s);
    /* and after the workers have given up spinning and gone to sleep */
    for (int r = 0; r < 20; r++) {
        struct timespec ts = {0, 3000000};
        nanosleep(&ts, NULL);
        ds_pool_for(p, 30, 1, sum_range, &s);
    }
    CHECK(atomic_load(&s) == 20020LL * 435, "20020 jobs");
    ds_pool_free(p);
    printf("%s 20000 back-to-back jobs and 20 after sleeps on 3 threads\n",
           atomic_load(&s) == 20020LL * 435 ? "PASS" : "FAIL");
}

/* ds_pool_for from inside a callback runs inline instead of deadlocking. */
typedef struct { ds_pool *p; atomic_llong s; } nest_ctx;
static void nested(void *arg, int64_t b, int64_t e) {
    nest_ctx *c = arg;
    for (int64_t i = b; i < e; i++) ds_pool_for(c->p, 10, 1, sum_range, &c->s);
}
static void test_nested(void) {
    nest_ctx c;
    c.p = ds_pool_new(3);
    atomic_init(&c.s, 0);
    ds_pool_for(c.p, 6, 1, nested, &c);
    CHECK(atomic_load(&c.s) == 6 * 45, "nested ds_pool_for");
    ds_pool_free(c.p);
    printf("%s nested ds_pool_for runs inline\n", atomic_load(&c.s) == 6 * 45 ? "PASS" : "FAIL");
}

/* A worker that is not running (on a shared machine: descheduled; here:
 * held in a signal handler) does not stall a job: the caller claims its
 * chunk and the job returns while the worker is still held. With the static
 * split (worker t runs chunk t) the job waits for the release. */
typedef struct {
    pthread_t caller, other;
    atomic_int arrived, hold, in_handler, ran_other;
} steal_ctx;
static void find_worker(void *arg, int64_t b, int64_t e) {
    steal_ctx *s = arg;
    (void)b; (void)e;
    if (!pthread_equal(pthread_self(), s->caller)) s->other = pthread_self();
    atomic_fetch_add(&s->arrived, 1);
    for (long spin = 0; spin < 2000000000L && atomic_load(&s->arrived) < 2; spin++) {}
}
static void hold_handler(int sig, siginfo_t *si, void *uc) {
    steal_ctx *s = si->si_value.sival_ptr;
    (void)sig; (void)uc;
    atomic_store(&s->in_handler, 1);
    while (atomic_load(&s->hold)) {
        struct timespec ts = {0, 1000000};
        nanosleep(&ts, NULL);
    }
}
static void count_other(void *arg, int64_t b, int64_t e) {
    steal_ctx *s = arg;
    (void)b; (void)e;
    if (!pthread_equal(pthread_self(), s->caller)) atomic_fetch_add(&s->ran_other, 1);
}
static void *releaser(void *arg) {
    steal_ctx *s = arg;
    struct timespec ts = {2, 0};
    nanosleep(&ts, NULL);
    atomic_store(&s->hold, 0);
    return NULL;
}
static void test_steal(void) {
    ds_pool *p = ds_pool_new(2);
    steal_ctx s = {.caller = pthread_self()};
    atomic_init(&s.arrived, 0);
    atomic_init(&s.hold, 1);
    atomic_init(&s.in_handler, 0);
    atomic_init(&s.ran_other, 0);
    ds_pool_for(p, 2, 1, find_worker, &s);            /* both threads take part: the worker's id */
    int ok = atomic_load(&s.arrived) == 2 && !pthread_equal(s.other, s.caller);
    struct sigaction sa = {0}, old;
    sa.sa_sigaction = hold_handler;
    sa.sa_flags = SA_SIGINFO;
    sigemptyset(&sa.sa_mask);
    pthread_t rel;
    int held_at_return = 0;
    if (ok && sigaction(SIGUSR1, &sa, &old) == 0) {
        ok = pthread_sigqueue(s.other, SIGUSR1, (union sigval){.sival_ptr = &s}) == 0;
        for (long spin = 0; ok && spin < 2000000000L && !atomic_load(&s.in_handler); spin++) {}
        ok = ok && atomic_load(&s.in_handler) && pthread_create(&rel, NULL, releaser, &s) == 0;
        if (ok) {
            ds_pool_for(p, 2, 1, count_other, &s);
            held_at_return = atomic_load(&s.hold);
            pthread_join(rel, NULL);
        }
        atomic_store(&s.hold, 0);
        ds_pool_free(p);                                 /* the worker is released: joins */
        sigaction(SIGUSR1, &old, NULL);
    } else {
        ds_pool_free(p);
    }
    ok = ok && held_at_return && atomic_load(&s.ran_other) == 0;
    CHECK(ok, "a job waited for a held worker (held at return %d, chunks on the worker %d)",
          held_at_return, atomic_load(&s.ran_other));
    printf("%s a held worker does not stall a job: the caller claims its chunk\n", ok ? "PASS" : "FAIL");
}

int main(void) {
    test_chunking();
    test_parallel();
    test_steal();
    test_scratch();
    test_lifecycle();
    test_many_jobs();
    test_nested();
    printf("%d checks passed, %d failed\n", n_pass, n_fail);
    return n_fail ? 1 : 0;
}
