/* roofline.c — this machine's ceilings for the small-M kernels, measured:
 *   int8   VPDPBUSD multiply-adds per second (zmm and ymm), the Q8_0 kernels' unit;
 *   f32    FMA multiply-adds per second (zmm), the F16/F32 kernels' unit;
 *   read   bandwidth of a streaming sum over an L2-sized, an L3-sized and a
 *          DRAM-sized buffer;
 * each for 1 and 2 threads (every thread runs the same loop on its own data;
 * the rate is the total). Medians of REPS runs; one key=value line per figure.
 *
 *   build/bench/roofline [reps]
 *
 * Why these: a decode step of the shipped Q8_0 target streams ~19 MB of
 * packed weights (L3-resident on a 32 MB L3) and does 15.7M int8 MACs; an
 * 8-row verify does 8x the MACs over the same bytes. Dividing the profile's
 * times by these ceilings says which of the two a step is bound by
 * (`dspark bench --profile` prints both). */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#if defined(__x86_64__)
static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

#include <immintrin.h>
#define TGT __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma")))
#define ITERS 2000000L

/* 12 independent accumulator chains: enough to cover latency x throughput. */
TGT static double k_vnni512(void *unused) {
    (void)unused;
    __m512i a[12], w = _mm512_set1_epi8(3), x = _mm512_set1_epi8(5);
    for (int i = 0; i < 12; i++) a[i] = _mm512_set1_epi32(i);
    for (long it = 0; it < ITERS; it++) {
        for (int i = 0; i < 12; i++) a[i] = _mm512_dpbusd_epi32(a[i], w, x);
        __asm__ volatile("" : "+v"(w), "+v"(x));
    }
    int32_t s = 0;
    for (int i = 0; i < 12; i++) s += _mm512_reduce_add_epi32(a[i]);
    __asm__ volatile("" ::"r"(s));
    return (double)ITERS * 12 * 64;
}
TGT static double k_vnni256(void *unused) {
    (void)unused;
    __m256i a[12], w = _mm256_set1_epi8(3), x = _mm256_set1_epi8(5);
    for (int i = 0; i < 12; i++) a[i] = _mm256_set1_epi32(i);
    for (long it = 0; it < ITERS; it++) {
        for (int i = 0; i < 12; i++) a[i] = _mm256_dpbusd_epi32(a[i], w, x);
        __asm__ volatile("" : "+v"(w), "+v"(x));
    }
    int32_t s = 0;
    for (int i = 0; i < 12; i++) {
        int32_t o[8];
        _mm256_storeu_si256((__m256i *)o, a[i]);
        for (int j = 0; j < 8; j++) s += o[j];
    }
    __asm__ volatile("" ::"r"(s));
    return (double)ITERS * 12 * 32;
}
TGT static double k_fma512(void *unused) {
    (void)unused;
    __m512 a[12], w = _mm512_set1_ps(1.0f), x = _mm512_set1_ps(1e-7f);
    for (int i = 0; i < 12; i++) a[i] = _mm512_set1_ps((float)i);
    for (long it = 0; it < ITERS; it++) {
        for (int i = 0; i < 12; i++) a[i] = _mm512_fmadd_ps(a[i], w, x);
        __asm__ volatile("" : "+v"(w), "+v"(x));
    }
    float s = 0;
    for (int i = 0; i < 12; i++) s += _mm512_reduce_add_ps(a[i]);
    __asm__ volatile("" ::"x"(s));
    return (double)ITERS * 12 * 16;
}

typedef struct { const char *buf; size_t bytes; int passes; } rd_arg;
TGT static double k_read(void *vp) {
    const rd_arg *r = vp;
    __m512i s0 = _mm512_setzero_si512(), s1 = s0, s2 = s0, s3 = s0;
    for (int p = 0; p < r->passes; p++)
        for (size_t o = 0; o < r->bytes; o += 256) {
            s0 = _mm512_add_epi32(s0, _mm512_load_si512(r->buf + o));
            s1 = _mm512_add_epi32(s1, _mm512_load_si512(r->buf + o + 64));
            s2 = _mm512_add_epi32(s2, _mm512_load_si512(r->buf + o + 128));
            s3 = _mm512_add_epi32(s3, _mm512_load_si512(r->buf + o + 192));
        }
    int32_t s = _mm512_reduce_add_epi32(_mm512_add_epi32(_mm512_add_epi32(s0, s1), _mm512_add_epi32(s2, s3)));
    __asm__ volatile("" ::"r"(s));
    return (double)r->bytes * r->passes;
}

typedef struct { double (*fn)(void *); void *arg; double work; } th_job;
static void *th_main(void *vp) {
    th_job *j = vp;
    j->work = j->fn(j->arg);
    return NULL;
}
/* Work units per second over n threads (each with its own arg). */
static double rate(int n, double (*fn)(void *), void **args) {
    pthread_t t[2];
    th_job j[2];
    double t0 = now();
    for (int i = 0; i < n; i++) {
        j[i] = (th_job){fn, args[i], 0};
        if (pthread_create(&t[i], NULL, th_main, &j[i])) { fprintf(stderr, "roofline: pthread_create failed\n"); exit(2); }
    }
    double w = 0;
    for (int i = 0; i < n; i++) { pthread_join(t[i], NULL); w += j[i].work; }
    return w / (now() - t0);
}
static double median_rate(int reps, int n, double (*fn)(void *), void **args) {
    double v[64];
    if (reps > 64) reps = 64;
    for (int r = 0; r < reps; r++) v[r] = rate(n, fn, args);
    qsort(v, (size_t)reps, sizeof v[0], cmp_d);
    return v[reps / 2];
}

int main(int argc, char **argv) {
    int reps = argc > 1 ? atoi(argv[1]) : 5;
    if (reps < 1 || reps > 64) { fprintf(stderr, "roofline: reps must be in 1..64\n"); return 2; }
    __builtin_cpu_init();
    if (!__builtin_cpu_supports("avx512vnni")) { printf("roofline: no AVX512-VNNI on this CPU, nothing measured\n"); return 0; }
    void *none[2] = {NULL, NULL};
    for (int n = 1; n <= 2; n++) {
        printf("threads=%d int8_vnni_zmm_gmac_s=%.1f int8_vnni_ymm_gmac_s=%.1f f32_fma_zmm_gflop2_s=%.1f\n", n,
               median_rate(reps, n, k_vnni512, none) * 1e-9, median_rate(reps, n, k_vnni256, none) * 1e-9,
               median_rate(reps, n, k_fma512, none) * 1e-9);
    }
    static const struct { const char *name; size_t bytes; int passes; } lv[3] = {
        {"l2_512k", 512u << 10, 400}, {"l3_8m", 8u << 20, 25}, {"dram_512m", 512u << 20, 1}};
    for (int n = 1; n <= 2; n++) {
        printf("threads=%d", n);
        for (int l = 0; l < 3; l++) {
            rd_arg ra[2];
            void *args[2];
            char *bufs[2] = {NULL, NULL};
            for (int i = 0; i < n; i++) {
                bufs[i] = aligned_alloc(64, lv[l].bytes);
                if (!bufs[i]) { fprintf(stderr, "roofline: out of memory\n"); return 2; }
                memset(bufs[i], 1, lv[l].bytes);
                ra[i] = (rd_arg){bufs[i], lv[l].bytes, lv[l].passes};
                args[i] = &ra[i];
            }
            printf(" read_%s_gb_s=%.1f", lv[l].name, median_rate(reps, n, k_read, args) * 1e-9);
            for (int i = 0; i < n; i++) free(bufs[i]);
        }
        printf("\n");
    }
    return 0;
}
#else
int main(void) {
    printf("roofline: x86-64 only, nothing measured\n");
    return 0;
}
#endif
