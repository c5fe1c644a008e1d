/* bench_util.h — the clock and the median sort the bench/ programs share. */
#ifndef DSPARK_BENCH_UTIL_H
#define DSPARK_BENCH_UTIL_H

#include <time.h>

static inline double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}
/* qsort comparator for doubles, ascending (medians) */
static inline int cmp_d(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

#endif
