/* bench_attn.cu — canonical prefill attention on the 8B shape (32 query
 * heads, 8 kv heads, head_dim 128): the tile path (att_tile) against today's
 * split-KV path (att_split + att_canonical's fold) and against fast, causal
 * rows of one sequence; validate, then time. One command on a GPU
 * (`make CUDA=1 BUILD=... bench-attn`; about a minute on an H200).
 *
 * It includes attention.cu and drives dsc_attention on a bare execution
 * context (no programmatic dependent launch), switching paths with the
 * backend's own bits: tile = DSPARK_CUDA_ON=tile, split = DSPARK_CUDA_OFF=tile,
 * fast = the DS_FAST variant. For each (M rows from p0): M = 512 from 0 and
 * from 3584 (a 4096-token prompt's last 512-row chunk), 2048 and 4096 from 0,
 * 256 from 3840 and 512 from 16384:
 *   - PASS/FAIL: the tile's M x 32 x 128 outputs memcmp-equal to split's, and
 *     its Q8_0 copy for the o projection (quants and scales) equal to split's;
 *     8 sampled rows equal to the CPU's canonical rows (ds_attention_rows,
 *     libdspark.a); fast differs (the counter-test). A mismatch prints its
 *     first (row, head, column) and both values;
 *   - times: medians of REPS CUDA-event timings per path, the paths
 *     interleaved (rotating order), K/V left in L2 as a prefill finds them
 *     (just written); us and the tile's speed-up over split.
 * `bench_attn --check`: the checks without the timings; `--small`: the checks
 * at M = 130 from 100 and M = 64 from 0 only (compute-sanitizer's racecheck
 * and memcheck: tests/cuda/sanitize.sh, program attn).
 * Ends with "bench_attn: N PASS, N FAIL". */
#include "kernels/cuda/attention.cu"

#include <algorithm>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <vector>

/* ---- the rest of the backend that attention.cu calls --------------------------- */
#define BENCH_NAME "bench_attn"
#include "bench_common.cuh"
void *dsc_scratch(ds_exec *ex, int s, size_t bytes) {
    if (ex->slot_bytes[s] < bytes) {
        if (ex->slot[s]) cudaFree(ex->slot[s]);
        ex->slot[s] = NULL;
        ex->slot_bytes[s] = 0;
        if (cudaMalloc(&ex->slot[s], bytes) != cudaSuccess) {
            dsc_note(ex, cudaErrorMemoryAllocation, "bench_attn scratch");
            return NULL;
        }
        ex->slot_bytes[s] = bytes;
    }
    return ex->slot[s];
}
/* the o projection's Q8_0 copy goes where the bench says (ba_oq / ba_od) */
static int8_t *ba_oq;
static float *ba_od;
int dsc_q8x_reserve(ds_exec *ex, int M, int64_t K, int8_t **q, float **d) {
    (void)ex; (void)M; (void)K;
    *q = ba_oq;
    *d = ba_od;
    return ba_oq != NULL;
}
void dsc_q8x_publish(ds_exec *ex, const float *x, int M, int64_t K, const int8_t *q, const float *d) {
    (void)ex; (void)x; (void)M; (void)K; (void)q; (void)d;
}

#define REPS 15

/* uniform in [-a, a) on a 2^-23 grid */
__global__ void ba_fill(float *x, size_t n, uint32_t seed, float a) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        x[i] = __fmul_rn(a, __fsub_rn(__fmul_rn((float)(bench_hash(i, seed) >> 8), 1.0f / 8388608.0f), 1.0f));
}


/* the first differing float of a and b (n of them), as (row, head, column) */
static bool ba_same(const char *what, const float *a, const float *b, size_t n, int nh, int hd, int row0) {
    for (size_t k = 0; k < n; k++)
        if (memcmp(&a[k], &b[k], 4)) {
            printf("  %s: first mismatch row %d head %d col %d: %.9g vs %.9g\n", what,
                   row0 + (int)(k / ((size_t)nh * hd)), (int)(k / hd % nh), (int)(k % hd), a[k], b[k]);
            return false;
        }
    return true;
}

enum { BA_TILE, BA_SPLIT, BA_FAST, BA_N };
static const char *const ba_name[BA_N] = {"tile", "split", "fast"};

int main(int argc, char **argv) {
    const bool small = argc > 1 && !strcmp(argv[1], "--small"), check_only = small || (argc > 1 && !strcmp(argv[1], "--check"));
    static dsc_backend b;
    static ds_backend be;
    cudaDeviceProp prop;
    cudaEvent_t e0, e1;
    ds_exec *ex = bench_exec(&b, &be, &prop, &e0, &e1);
    if (!ex) return 2;
    CK(dsc_attention_init());

    const int nh = 32, nkv = 8, hd = 128, row = nkv * hd;
    const int64_t K = (int64_t)nh * hd;
    ds_attn_shape s = {nh, nkv, hd, row, 1.0f / sqrtf((float)hd)};
    struct ba_case { int M, p0; };
    /* a prompt in 512-row chunks (from 0, its last chunk at 4096), whole
     * prompts in one call, and where the host's choice (tiles filling half
     * the SMs) is least sure: 256 rows at the end of 4096, 512 rows after
     * 16k positions */
    static const ba_case big[] = {{512, 0}, {512, 3584}, {2048, 0}, {4096, 0}, {256, 3840}, {512, 16384}},
                         tiny[] = {{130, 100}, {64, 0}};
    const std::vector<ba_case> cases = small ? std::vector<ba_case>(tiny, tiny + 2) : std::vector<ba_case>(big, big + 6);
    const int CAP = 16896, MMAX = 4096;
    printf("bench_attn: %s, %d SMs; 32/8 heads, head_dim 128, causal, one sequence; medians of %d, paths interleaved\n",
           prop.name, prop.multiProcessorCount, REPS);

    float *dk, *dv, *dq, *dout[BA_N];
    int8_t *doq[BA_N];
    float *dod[BA_N];
    int32_t *dpos, *dtab;
    CK(cudaMalloc(&dk, (size_t)CAP * row * 4));
    CK(cudaMalloc(&dv, (size_t)CAP * row * 4));
    CK(cudaMalloc(&dq, (size_t)MMAX * K * 4));
    for (int p = 0; p < BA_N; p++) {
        CK(cudaMalloc(&dout[p], (size_t)MMAX * K * 4));
        CK(cudaMalloc(&doq[p], (size_t)MMAX * K));
        CK(cudaMalloc(&dod[p], (size_t)MMAX * (K / 32) * 4));
    }
    CK(cudaMalloc(&dpos, MMAX * sizeof(int32_t)));
    CK(cudaMalloc(&dtab, CAP / DS_KV_PAGE * sizeof(int32_t)));
    ba_fill<<<1024, 256>>>(dk, (size_t)CAP * row, 1, 1.0f);
    ba_fill<<<1024, 256>>>(dv, (size_t)CAP * row, 2, 1.0f);
    ba_fill<<<1024, 256>>>(dq, (size_t)MMAX * K, 3, 3.0f);
    std::vector<int32_t> tab(CAP / DS_KV_PAGE);
    for (int i = 0; i < CAP / DS_KV_PAGE; i++) tab[i] = i;
    CK(cudaMemcpy(dtab, tab.data(), tab.size() * sizeof(int32_t), cudaMemcpyHostToDevice));
    std::vector<float> hk((size_t)CAP * row), hv((size_t)CAP * row), hq((size_t)MMAX * K);
    CK(cudaDeviceSynchronize());
    CK(cudaMemcpy(hk.data(), dk, hk.size() * 4, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(hv.data(), dv, hv.size() * 4, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(hq.data(), dq, hq.size() * 4, cudaMemcpyDeviceToHost));

    int n_pass = 0, n_fail = 0;
    for (const ba_case &c : cases) {
        const int M = c.M, p0 = c.p0;
        std::vector<int32_t> pos(M);
        for (int m = 0; m < M; m++) pos[m] = p0 + m;
        CK(cudaMemcpy(dpos, pos.data(), M * sizeof(int32_t), cudaMemcpyHostToDevice));
        ds_rows rw = {};
        rw.pos = dpos;
        rw.tables = dtab;
        rw.max_pages = CAP / DS_KV_PAGE;
        rw.page = DS_KV_PAGE;
        rw.page_stride = (int64_t)DS_KV_PAGE * row;
        rw.vis_max = p0 + M;
        const float *qc = dq + (int64_t)0;   /* rows 0..M-1 of the query buffer */
        auto run = [&](int p) {
            b.off = DSC_OFF_PDL | (p == BA_SPLIT ? DSC_OFF_TILE : 0);
            b.tile_all = p == BA_TILE;
            ba_oq = doq[p];
            ba_od = dod[p];
            dsc_attention(ex, p == BA_FAST ? DS_FAST : DS_CANONICAL, &s, M, &rw, qc, dk, dv, dout[p]);
        };
        for (int p = 0; p < BA_N; p++) run(p);
        CK(cudaStreamSynchronize(ex->st));
        if (ex->err) {
            printf("FAIL M=%d p0=%d: %s\n", M, p0, ex->errmsg);
            n_fail++;
            ex->err = 0;
            continue;
        }
        const size_t no = (size_t)M * K;
        std::vector<float> out[BA_N], od[BA_N];
        std::vector<int8_t> oq[BA_N];
        for (int p = 0; p < BA_N; p++) {
            out[p].resize(no);
            CK(cudaMemcpy(out[p].data(), dout[p], no * 4, cudaMemcpyDeviceToHost));
            oq[p].resize(no);
            od[p].resize(no / 32);
            CK(cudaMemcpy(oq[p].data(), doq[p], no, cudaMemcpyDeviceToHost));
            CK(cudaMemcpy(od[p].data(), dod[p], no / 32 * 4, cudaMemcpyDeviceToHost));
        }
        char what[128];
        snprintf(what, sizeof what, "M=%d p0=%d tile vs split", M, p0);
        const bool eq = ba_same(what, out[BA_TILE].data(), out[BA_SPLIT].data(), no, nh, hd, 0);
        const bool eq_q8 = !memcmp(oq[BA_TILE].data(), oq[BA_SPLIT].data(), no) &&
                           !memcmp(od[BA_TILE].data(), od[BA_SPLIT].data(), no / 32 * 4);
        /* sampled rows against the CPU's canonical definition */
        bool eq_cpu = true;
        const int sm[] = {0, 1, 63, 64, M / 2, M - 65, M - 2, M - 1};
        std::vector<float> cpu(K);
        for (int m0 : sm) {
            const int m = (m0 % M + M) % M;
            const int32_t nv1 = p0 + m + 1;
            const ds_attn_rows ar = {&nv1, NULL, NULL, NULL, 0, 0, 0};
            ds_attention_rows(DS_CANONICAL, &s, 1, &ar, hq.data() + (size_t)m * K, hk.data(), hv.data(), cpu.data(), NULL);
            snprintf(what, sizeof what, "M=%d p0=%d tile vs CPU", M, p0);
            if (eq_cpu && !ba_same(what, out[BA_TILE].data() + (size_t)m * K, cpu.data(), K, nh, hd, m)) eq_cpu = false;
        }
        const bool fast_diff = memcmp(out[BA_FAST].data(), out[BA_TILE].data(), no * 4) != 0;
        const bool ok = eq && eq_q8 && eq_cpu && fast_diff;
        (ok ? n_pass : n_fail)++;
        printf("%s M=%-4d p0=%-4d tile == split (outputs): %s  Q8_0 copy: %s  == CPU (8 rows): %s  fast differs: %s\n",
               ok ? "PASS" : "FAIL", M, p0, eq ? "yes" : "NO", eq_q8 ? "yes" : "NO", eq_cpu ? "yes" : "NO",
               fast_diff ? "yes" : "NO");
        if (check_only) continue;
        std::vector<float> t[BA_N];
        for (int r = 0; r < REPS + 2; r++)
            for (int k = 0; k < BA_N; k++) {
                const int p = (r + k) % BA_N;
                CK(cudaEventRecord(e0, ex->st));
                run(p);
                CK(cudaEventRecord(e1, ex->st));
                CK(cudaEventSynchronize(e1));
                float ms;
                CK(cudaEventElapsedTime(&ms, e0, e1));
                if (r >= 2) t[p].push_back(ms);
            }
        const double us[BA_N] = {bench_median(t[0]) * 1e3, bench_median(t[1]) * 1e3, bench_median(t[2]) * 1e3};
        /* useful work: every (query, visible key) pair, q.k and p.v, head_dim MACs each */
        double pairs = 0;
        for (int m = 0; m < M; m++) pairs += (double)(p0 + m + 1);
        const double gmac = pairs * nh * hd * 2 / 1e9;
        printf("time M=%-4d p0=%-4d", M, p0);
        for (int p = 0; p < BA_N; p++) printf("  %s %9.1f us (%6.0f GMAC/s)", ba_name[p], us[p], gmac / (us[p] * 1e-6));
        printf("  split/tile %.2fx  tile/fast %.2fx\n", us[BA_SPLIT] / us[BA_TILE], us[BA_TILE] / us[BA_FAST]);
    }
    printf("bench_attn: %d PASS, %d FAIL\n", n_pass, n_fail);
    return n_fail ? 1 : 0;
}
