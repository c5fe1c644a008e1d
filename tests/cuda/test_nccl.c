/* test_nccl.c — the NCCL communicator (src/comm_nccl.c, make CUDA=1 NCCL=1)
 * on this host's GPUs against the CPU fake (src/comm.c), for the lead to run
 * on a machine with GPUs: `make CUDA=1 NCCL=1 test-nccl`.
 *
 * With N = min(GPUs, DS_TP_MAX) ranks (N = 1 still runs NCCL end to end):
 *   1. all_gather of the activation shapes tensor parallelism moves (one
 *      decode row and an 8-row verify of the 8B shape: n_embd 4096, the
 *      heads' 4096, n_ff 14336, each split N ways) — byte for byte the
 *      fake's result on every rank (a copy is a copy on every transport);
 *   2. all_reduce_sum of integers (exact in f32 whatever the order) equal to
 *      the fake's; of general floats within a rounding of it (NCCL's ring
 *      and tree orders are its own: the reason the canonical layout never
 *      reduces), with the count of differing floats reported;
 *   3. the time of one all_gather per shape (median of 50, one stream
 *      synchronisation each): the collective's share of a TP decode step;
 *   4. refusals: more ranks than GPUs, one line.
 * Every mismatch prints the rank, the first index and both values. */
#include "comm.h"
#include "testutil.h"

#include <cuda_runtime.h>
#include <math.h>
#include <time.h>

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static int cmp_d(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

#define CU(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { \
    printf("FAIL %s:%d: %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); exit(1); } } while (0)

int main(void) {
    int ngpu = 0;
    if (cudaGetDeviceCount(&ngpu) != cudaSuccess || ngpu < 1) {
        printf("SKIP test_nccl: no GPU\n");
        return 0;
    }
    const int n = ngpu < DS_TP_MAX ? ngpu : DS_TP_MAX;
    char err[DS_ERRLEN];
    int dev[DS_TP_MAX];
    void *streams[DS_TP_MAX];
    for (int r = 0; r < n; r++) {
        dev[r] = r;
        CU(cudaSetDevice(r));
        cudaStream_t s;
        CU(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
        streams[r] = s;
    }
    ds_comm *nc = ds_comm_nccl_new(n, dev, streams, err, sizeof err);
    CHECK(nc != NULL, "ds_comm_nccl_new(%d): %s", n, err);
    if (!nc) return tu_finish("test_nccl");
    printf("ranks=%d (GPUs on this host: %d)\n", n, ngpu);

    /* the largest message: 8 rows of n_ff 14336 */
    const size_t max_total = 8 * 14336;
    ds_comm *fake = ds_comm_cpu_new(n, max_total, err, sizeof err);
    CHECK(fake != NULL, "cpu comm: %s", err);
    float *hs[DS_TP_MAX], *hr[DS_TP_MAX], *got = malloc(max_total * sizeof(float));
    float *ds[DS_TP_MAX], *dr[DS_TP_MAX];
    for (int r = 0; r < n; r++) {
        hs[r] = malloc(max_total * sizeof(float));
        hr[r] = malloc(max_total * sizeof(float));
        CU(cudaSetDevice(r));
        CU(cudaMalloc((void **)&ds[r], max_total * sizeof(float)));
        CU(cudaMalloc((void **)&dr[r], max_total * sizeof(float)));
    }
    ds_exec *ex[DS_TP_MAX] = {0};
    const struct { const char *what; int rows, width; } shp[] = {
        {"decode n_embd", 1, 4096}, {"decode n_ff", 1, 14336}, {"verify8 n_embd", 8, 4096}, {"verify8 n_ff", 8, 14336},
    };
    for (size_t k = 0; k < sizeof shp / sizeof shp[0]; k++) {
        if (shp[k].width % n) { printf("SKIP %s: %d does not split %d ways\n", shp[k].what, shp[k].width, n); continue; }
        const size_t cnt = (size_t)shp[k].rows * shp[k].width / n, total = cnt * n;
        /* 1. all_gather: bytes of every rank against the fake */
        uint64_t seed = 1234 + k;
        for (int r = 0; r < n; r++) {
            for (size_t i = 0; i < cnt; i++) {
                seed = seed * 6364136223846793005ull + 1442695040888963407ull;
                hs[r][i] = (float)(int32_t)(seed >> 40) * 1e-3f;
            }
            CU(cudaSetDevice(r));
            CU(cudaMemcpy(ds[r], hs[r], cnt * sizeof(float), cudaMemcpyHostToDevice));
        }
        const float *s_h[DS_TP_MAX], *s_d[DS_TP_MAX];
        for (int r = 0; r < n; r++) { s_h[r] = hs[r]; s_d[r] = ds[r]; }
        CHECK(fake->i->all_gather(fake, ex, s_h, hr, cnt, err, sizeof err) == 0, "fake: %s", err);
        CHECK(nc->i->all_gather(nc, ex, s_d, dr, cnt, err, sizeof err) == 0, "%s all_gather: %s", shp[k].what, err);
        int same = 1;
        for (int r = 0; r < n; r++) {
            CU(cudaSetDevice(r));
            CU(cudaStreamSynchronize((cudaStream_t)streams[r]));
            CU(cudaMemcpy(got, dr[r], total * sizeof(float), cudaMemcpyDeviceToHost));
            if (memcmp(got, hr[r], total * sizeof(float))) {
                size_t i = 0;
                while (i < total && !memcmp(got + i, hr[r] + i, sizeof(float))) i++;
                printf("  %s: rank %d first difference at %zu of %zu: nccl %.9g vs fake %.9g\n", shp[k].what, r, i, total,
                       got[i], hr[r][i]);
                same = 0;
            }
        }
        CHECK(same, "%s: all_gather differs from the fake", shp[k].what);
        /* 3. its time: one collective, then every stream waited for */
        double t[50];
        for (int it = 0; it < 50; it++) {
            const double t0 = now_s();
            (void)nc->i->all_gather(nc, ex, s_d, dr, cnt, err, sizeof err);
            for (int r = 0; r < n; r++) { CU(cudaSetDevice(r)); CU(cudaStreamSynchronize((cudaStream_t)streams[r])); }
            t[it] = now_s() - t0;
        }
        qsort(t, 50, sizeof t[0], cmp_d);
        printf("%s %s: all_gather of %zu floats a rank, bit-identical to the fake on %d ranks, median %.1f us\n",
               same ? "PASS" : "FAIL", shp[k].what, cnt, n, t[25] * 1e6);

        /* 2. all_reduce: integers are exact in any order; floats within a rounding */
        for (int pass = 0; pass < 2; pass++) {
            for (int r = 0; r < n; r++) {
                for (size_t i = 0; i < total; i++) {
                    seed = seed * 6364136223846793005ull + 1442695040888963407ull;
                    hs[r][i] = pass ? (float)(int32_t)(seed >> 40) * 1.37e-3f : (float)((int32_t)(seed >> 52) - 2048);
                }
                CU(cudaSetDevice(r));
                CU(cudaMemcpy(ds[r], hs[r], total * sizeof(float), cudaMemcpyHostToDevice));
            }
            CHECK(fake->i->all_reduce_sum(fake, ex, s_h, hr, total, err, sizeof err) == 0, "fake reduce: %s", err);
            CHECK(nc->i->all_reduce_sum(nc, ex, s_d, dr, total, err, sizeof err) == 0, "%s all_reduce: %s", shp[k].what, err);
            size_t nd = 0, first = 0;
            double worst = 0;
            for (int r = 0; r < n; r++) {
                CU(cudaSetDevice(r));
                CU(cudaStreamSynchronize((cudaStream_t)streams[r]));
                CU(cudaMemcpy(got, dr[r], total * sizeof(float), cudaMemcpyDeviceToHost));
                for (size_t i = 0; i < total; i++)
                    if (memcmp(got + i, hr[r] + i, sizeof(float))) {
                        if (!nd) first = i;
                        nd++;
                        const double rel = fabs((double)got[i] - hr[r][i]) / (fabs((double)hr[r][i]) + 1e-30);
                        if (rel > worst) worst = rel;
                    }
            }
            if (!pass) {
                CHECK(nd == 0, "%s: integer all_reduce differs from the fake in %zu floats (first %zu)", shp[k].what, nd, first);
            } else {
                CHECK(worst < 1e-5, "%s: float all_reduce off by a relative %.3g", shp[k].what, worst);
                printf("NOTE %s: float all_reduce: %zu of %zu floats differ from the fake's rank-order sum (worst relative %.3g)\n",
                       shp[k].what, nd, total * n, worst);
            }
        }
    }
    /* 4. more ranks than GPUs */
    if (n < DS_TP_MAX) {
        int d2[DS_TP_MAX];
        void *s2[DS_TP_MAX];
        for (int r = 0; r <= n; r++) { d2[r] = r; s2[r] = streams[r < n ? r : 0]; }
        ds_comm *bad = ds_comm_nccl_new(n + 1, d2, s2, err, sizeof err);
        CHECK(!bad && strstr(err, "GPU") && !strchr(err, '\n'), "--tp %d on %d GPUs: one line, got '%s'", n + 1, ngpu, err);
        if (bad) ds_comm_free(bad);
        else printf("PASS refusal: %s\n", err);
    }
    ds_comm_free(nc);
    ds_comm_free(fake);
    for (int r = 0; r < n; r++) {
        free(hs[r]);
        free(hr[r]);
        CU(cudaSetDevice(r));
        CU(cudaFree(ds[r]));
        CU(cudaFree(dr[r]));
        CU(cudaStreamDestroy((cudaStream_t)streams[r]));
    }
    free(got);
    return tu_finish("test_nccl");
}
