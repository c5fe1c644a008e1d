/* bench_common.cuh — what the standalone CUDA benchmarks (bench_gemv.cu,
 * bench_attn.cu) share: the two backend functions every kernel file calls
 * (only launch errors matter there), a fatal-error check, a counter-based
 * hash for inputs made on the device, and the median of timings. Define
 * BENCH_NAME before including it. */
#ifndef DSPARK_BENCH_COMMON_CUH
#define DSPARK_BENCH_COMMON_CUH

#include <algorithm>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <vector>

void dsc_note(ds_exec *ex, cudaError_t e, const char *what) {
    if (e != cudaSuccess && !ex->err) {
        ex->err = 1;
        snprintf(ex->errmsg, sizeof ex->errmsg, "%s: %s", what, cudaGetErrorString(e));
    }
}
void dsc_launched(ds_exec *ex, cudaError_t e, const char *what) {
    ex->n_ops++;
    dsc_note(ex, e, what);
}

#define CK(x)                                                                                              \
    do {                                                                                                   \
        cudaError_t e_ = (x);                                                                              \
        if (e_ != cudaSuccess) {                                                                           \
            fprintf(stderr, BENCH_NAME ": %s: %s (line %d)\n", #x, cudaGetErrorString(e_), __LINE__);      \
            exit(2);                                                                                       \
        }                                                                                                  \
    } while (0)

__device__ __host__ inline uint32_t bench_hash(uint64_t i, uint32_t seed) {
    uint64_t z = i * 0x9E3779B97F4A7C15ull + seed * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return (uint32_t)(z ^ (z >> 31));
}

static double bench_median(std::vector<float> v) {
    std::sort(v.begin(), v.end());
    return v.empty() ? 0.0 : v[v.size() / 2];
}

/* The GPU's properties, a bare execution context on it (b, be: the
 * caller's, zeroed here; no programmatic dependent launch: each kernel
 * timed alone) and two timing events, or NULL with one line when there is
 * no GPU. */
static ds_exec *bench_exec(dsc_backend *b, ds_backend *be, cudaDeviceProp *prop, cudaEvent_t *e0, cudaEvent_t *e1) {
    int ndev = 0;
    if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
        printf(BENCH_NAME ": no CUDA GPU\n");
        return NULL;
    }
    CK(cudaGetDeviceProperties(prop, 0));
    CK(cudaSetDevice(0));
    memset(b, 0, sizeof *b);
    memset(be, 0, sizeof *be);
    b->n_sm = prop->multiProcessorCount;
    b->off = DSC_OFF_PDL;
    be->priv = b;
    ds_exec *ex = (ds_exec *)calloc(1, sizeof(ds_exec));
    if (!ex) exit(2);
    ex->be = be;
    CK(cudaStreamCreate(&ex->st));
    CK(cudaEventCreate(e0));
    CK(cudaEventCreate(e1));
    return ex;
}

#endif
