/* bench_gemv.cu — the Q8_0 canonical GEMVs for M = 1..16 (decode, verify,
 * small batches) on the 8B shapes: validate and time, one command on a GPU
 * (`make CUDA=1 BUILD=... bench-gemv`; about a minute on an H200).
 *
 * It includes matmul_q8_0.cu (and the tensor-core file it calls) and drives
 * their launchers on a bare execution context: old = q8v_kernel (what
 * DSPARK_CUDA_OFF=gemv runs; at M = 16 the 16-row tensor-core tile), new =
 * q8w_kernel's default configuration (q8w_dispatch), the warp-streamed
 * tensor-core GEMV (qt_kernel: its default, dsc_q8_stream, and four other
 * stage sizes / ring depths), one more q8w configuration. For each shape
 * N x K (q/o, k/v, gate/up, down, LM head) and M = 1, 2, 4, 8, 16:
 *   - every kernel's outputs bitwise equal to old's (memcmp of all M x N),
 *     and old's rows 0, 1, N/2, N-2, N-1 equal to a host evaluation of the
 *     definition (acc = +0; acc = fmaf((float)D, d * e, acc) per block in
 *     order): one PASS/FAIL line per shape and M;
 *   - times: medians of REPS CUDA-event timings per kernel, the kernels
 *     interleaved (rotating order), L2 flushed (a 256 MiB memset) before each,
 *     launched without programmatic dependent launch (each alone);
 *     GB/s = bytes read (weights + scales + activations) / time, and its %
 *     of the device-to-device copy bandwidth measured first (bytes read +
 *     written, as KINDS.md counts it).
 * Weights and activations are random bytes and random fp16-valued scales,
 * made on the device. Two more shapes check the K and N tails (bits only).
 * `bench_gemv --check`: the checks without the timings (for compute-sanitizer).
 * `bench_gemv --tiles`: the tensor-core tiles at prefill sizes instead (bench_tiles).
 * Ends with "bench_gemv: N PASS, N FAIL". */
#include "kernels/cuda/matmul_q8_0.cu"
#include "kernels/cuda/matmul_q8_0_mma.cu"

#include <algorithm>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <vector>

/* the rest of the backend, which these files call: only launch errors matter here */
#define BENCH_NAME "bench_gemv"
#include "bench_common.cuh"
void *dsc_scratch(ds_exec *ex, int s, size_t bytes) { (void)ex; (void)s; (void)bytes; return NULL; }

#define REPS 25

__global__ void bg_fill_q(int8_t *q, size_t n, uint32_t seed) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        q[i] = (int8_t)((int)(bench_hash(i, seed) % 255u) - 127);   /* -127 .. 127 */
}
/* fp16-valued scales of both signs around 2^-7 .. 2^-4 (their exact f32) */
__global__ void bg_fill_d(float *d, size_t n, uint32_t seed) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        const uint32_t h = bench_hash(i, seed);
        d[i] = dsc_fp16_to_f32((h & 0x8000u) | (0x2000u + (h >> 16) % 0x0c00u));
    }
}

typedef ds_exec ex_t;
typedef void (*bg_fn)(ds_exec *ex, const dsc_weight *w, int M, const int8_t *xq, const float *xd, float *y);
static const q8v_epi bg_none = {};
static void bg_old(ds_exec *ex, const dsc_weight *w, int M, const int8_t *xq, const float *xd, float *y) {
    q8v_dispatch(ex, 1, &w, M, xq, xd, NULL, NULL, NULL, &y, bg_none);
}
static void bg_new(ds_exec *ex, const dsc_weight *w, int M, const int8_t *xq, const float *xd, float *y) {
    q8w_dispatch(ex, 1, &w, M, xq, xd, &y);
}
template <bool M16, int KC, int D>
static void bg_qt(ex_t *ex, const dsc_weight *w, int M, const int8_t *xq, const float *xd, float *y) {
    dsc_q8_stream_cfg<M16, KC, D>(ex, 1, &w, M, xq, xd, &y);
}
static void bg_stream(ex_t *ex, const dsc_weight *w, int M, const int8_t *xq, const float *xd, float *y) {
    dsc_q8_stream(ex, 1, &w, M, xq, xd, &y);
}
static void bg_t16(ex_t *ex, const dsc_weight *w, int M, const int8_t *xq, const float *xd, float *y) {
    dsc_q8_mma(ex, 16, 1, &w, M, xq, xd, &y);
}
template <int MT, int R, int U, int MINB, bool FB>
static void bg_cfg(ex_t *ex, const dsc_weight *w, int M, const int8_t *xq, const float *xd, float *y) {
    q8w_launch<MT, R, U, MINB, FB>(ex, 1, &w, M, xq, xd, &y);
}

struct bg_kernel {
    const char *name;
    bg_fn fn;
};
#define BG_NK 8
/* per M: old (q8v; at M = 16 the 16-row tensor-core tile), new (the
 * default: q8w for M <= 2), the warp-streamed tensor-core GEMV's default
 * ("qt", stages of 8 blocks, 4 slots) and its other configurations "qt
 * KC/D" (blocks per stage, ring slots), one more q8w configuration
 * "q8w MT/R/U/MINB" (f: a whole block per lane) */
static void bg_kernels(int M, bg_kernel k[BG_NK]) {
    const bool m16 = M > 8;
    k[0] = m16 ? bg_kernel{"tiles 16", bg_t16} : bg_kernel{"old q8v", bg_old};
    k[1] = m16 ? bg_kernel{"tiles 16'", bg_t16} : bg_kernel{"new q8w", bg_new};
    k[2] = {"qt", bg_stream};
    k[3] = m16 ? bg_kernel{"qt 4/12", bg_qt<true, 4, 12>} : bg_kernel{"qt 4/12", bg_qt<false, 4, 12>};
    k[4] = m16 ? bg_kernel{"qt 8/6", bg_qt<true, 8, 6>} : bg_kernel{"qt 8/6", bg_qt<false, 8, 6>};
    k[5] = m16 ? bg_kernel{"qt 2/16", bg_qt<true, 2, 16>} : bg_kernel{"qt 2/16", bg_qt<false, 2, 16>};
    k[6] = m16 ? bg_kernel{"qt 4/8", bg_qt<true, 4, 8>} : bg_kernel{"qt 4/8", bg_qt<false, 4, 8>};
    switch (M) {
    case 1: k[7] = {"q8w 1/1/8/6", bg_cfg<1, 1, 8, 6, false>}; break;
    case 2: k[7] = {"q8w 2/2/2/6f", bg_cfg<2, 2, 2, 6, true>}; break;
    case 4: k[7] = {"q8w 4/2/4/4f", bg_cfg<4, 2, 4, 4, true>}; break;
    case 8: k[7] = {"q8w 8/2/4/4f", bg_cfg<8, 2, 4, 4, true>}; break;
    default: k[7] = {"qt 8/4 m16", bg_qt<true, 8, 4>}; break;
    }
}

/* the definition on the host, output (m, n) */
static float bg_host(const int8_t *wrow, const float *wsrow, const int8_t *xrow, const float *xdrow, int64_t K) {
    float acc = 0.0f;
    for (int64_t b = 0; b < K / 32; b++) {
        int32_t D = 0;
        for (int k = 0; k < 32; k++) D += (int32_t)wrow[b * 32 + k] * (int32_t)xrow[b * 32 + k];
        const float p = wsrow[b] * xdrow[b];           /* -ffp-contract=off: one rounded product */
        acc = fmaf((float)D, p, acc);
    }
    return acc;
}



/* one timing of fn, L2 flushed first (a memset of the flush buffer), ms */
static float bg_time(ds_exec *ex, void *flush, size_t fbytes, cudaEvent_t e0, cudaEvent_t e1, int rep, bg_fn fn,
                     const dsc_weight *w, int M, const int8_t *xq, const float *xd, float *y) {
    CK(cudaMemsetAsync(flush, rep & 0xff, fbytes, ex->st));
    CK(cudaEventRecord(e0, ex->st));
    fn(ex, w, M, xq, xd, y);
    CK(cudaEventRecord(e1, ex->st));
    CK(cudaEventSynchronize(e1));
    float ms;
    CK(cudaEventElapsedTime(&ms, e0, e1));
    return ms;
}

/* an N x K Q8_0 weight of random quants and fp16-valued scales on the device */
static dsc_weight bg_weight(int64_t N, int64_t K, uint32_t seed_q, uint32_t seed_d) {
    dsc_weight w;
    memset(&w, 0, sizeof w);
    w.type = DS_TYPE_Q8_0;
    w.n_in = K;
    w.n_out = N;
    CK(cudaMalloc(&w.data, (size_t)(N * K)));
    CK(cudaMalloc(&w.scale, (size_t)(N * (K / 32)) * 4));
    bg_fill_q<<<4096, 256>>>((int8_t *)w.data, (size_t)(N * K), seed_q);
    bg_fill_d<<<1024, 256>>>(w.scale, (size_t)(N * (K / 32)), seed_d);
    return w;
}
static void bg_weight_free(dsc_weight *w) {
    CK(cudaFree(w->data));
    CK(cudaFree(w->scale));
}

/* ---- --tiles: the tensor-core tiles at prefill sizes ----------------------------------
 * qm_kernel's 128 x 128 tile (what M >= 128 runs: the first, "default", is
 * QM_T128's KS/ST; the second what ran before session 33) with other stage sizes and
 * pipeline depths (KS blocks per stage / ST stages) and the 128 x 64 tile,
 * at M = 512 and 2048 on the 8B shapes: every variant memcmp == the default,
 * the default == the host definition on 5 weight rows x 4 activation rows,
 * then medians of REPS timings (L2 flushed) as TMAC/s. */
template <int WN, int WM, int MI, int NJ, int KS, int ST>
static void bt_qm(ex_t *ex, const dsc_weight *w, int M, const int8_t *xq, const float *xd, float *y) {
    qm_launch<WN, WM, MI, NJ, KS, ST>(ex, 1, &w, M, xq, xd, &y);
}
template <int WN, int WM, int MI, int NJ, int KS, int ST>
static cudaError_t bt_init(void) {
    return cudaFuncSetAttribute(qm_kernel<WN, WM, MI, NJ, KS, ST>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                qm_cfg<WN, WM, MI, NJ, KS, ST>::SMEM);
}
#define BT_VARIANTS(X) X(2, 4, 4, 4, 8, 2) X(2, 4, 4, 4, 4, 3) X(2, 4, 4, 4, 4, 4) X(2, 4, 4, 4, 4, 5) X(2, 4, 4, 4, 2, 6) \
                       X(2, 4, 4, 4, 6, 3) X(2, 4, 4, 4, 10, 2) X(4, 2, 2, 4, 4, 3) X(4, 2, 2, 4, 4, 4)
static int bench_tiles(ds_exec *ex, void *flush, size_t fbytes, cudaEvent_t e0, cudaEvent_t e1) {
    struct bt { const char *name; bg_fn fn; };
    std::vector<bt> ks;
#define BT_ADD(a, b_, c, d, e, f)                                                                     \
    {                                                                                                  \
        cudaError_t e_ = bt_init<a, b_, c, d, e, f>();                                                 \
        if (e_ != cudaSuccess) { fprintf(stderr, "bench_gemv: %s\n", cudaGetErrorString(e_)); return 2; } \
    }                                                                                                  \
    ks.push_back({#a "x" #b_ " " #c "x" #d " ks" #e " st" #f, bt_qm<a, b_, c, d, e, f>});
    BT_VARIANTS(BT_ADD)
#undef BT_ADD
    struct shape { const char *name; int64_t N, K; };
    const shape shapes[] = {{"q/o", 4096, 4096}, {"gate/up", 24576, 4096}, {"down", 4096, 12288}, {"tail", 200, 4160}};
    const int Ms[] = {512, 2048, 77};
    int n_pass = 0, n_fail = 0;
    for (const shape &sh : shapes)
        for (int M : Ms) {
            if ((M == 77) != (sh.N == 200)) continue;
            const int64_t N = sh.N, K = sh.K, nb = K / 32;
            dsc_weight w = bg_weight(N, K, 5u + (uint32_t)N, 7u + (uint32_t)N);
            int8_t *xq;
            float *xd;
            CK(cudaMalloc(&xq, (size_t)(M * K)));
            CK(cudaMalloc(&xd, (size_t)(M * nb) * 4));
            bg_fill_q<<<1024, 256>>>(xq, (size_t)(M * K), 9u + (uint32_t)M);
            bg_fill_d<<<256, 256>>>(xd, (size_t)(M * nb), 13u + (uint32_t)M);
            CK(cudaGetLastError());
            const size_t ny = (size_t)M * N;
            std::vector<float *> y(ks.size());
            for (auto &p : y) CK(cudaMalloc(&p, ny * 4));
            for (size_t k = 0; k < ks.size(); k++) {
                CK(cudaMemset(y[k], 0xff, ny * 4));
                ks[k].fn(ex, &w, M, xq, xd, y[k]);
            }
            CK(cudaDeviceSynchronize());
            if (ex->err) { printf("FAIL launch: %s\n", ex->errmsg); return 1; }
            std::vector<float> ref(ny), got(ny);
            CK(cudaMemcpy(ref.data(), y[0], ny * 4, cudaMemcpyDeviceToHost));
            bool ok = true;
            char why[200] = "";
            std::vector<bool> same(ks.size(), true);
            for (size_t k = 1; k < ks.size(); k++) {
                CK(cudaMemcpy(got.data(), y[k], ny * 4, cudaMemcpyDeviceToHost));
                same[k] = !memcmp(got.data(), ref.data(), ny * 4);
                if (!same[k] && ok) { ok = false; snprintf(why, sizeof why, ": %s != default", ks[k].name); }
            }
            const int64_t rows[5] = {0, 1, N / 2, N - 2, N - 1};
            const int ms[4] = {0, 1, M / 2, M - 1};
            std::vector<int8_t> hw(K), hx(K);
            std::vector<float> hs(nb), hxd(nb);
            for (int r = 0; r < 5 && ok; r++)
                for (int m = 0; m < 4 && ok; m++) {
                    CK(cudaMemcpy(hw.data(), (int8_t *)w.data + rows[r] * K, (size_t)K, cudaMemcpyDeviceToHost));
                    CK(cudaMemcpy(hs.data(), w.scale + rows[r] * nb, (size_t)nb * 4, cudaMemcpyDeviceToHost));
                    CK(cudaMemcpy(hx.data(), xq + (int64_t)ms[m] * K, (size_t)K, cudaMemcpyDeviceToHost));
                    CK(cudaMemcpy(hxd.data(), xd + (int64_t)ms[m] * nb, (size_t)nb * 4, cudaMemcpyDeviceToHost));
                    const float h = bg_host(hw.data(), hs.data(), hx.data(), hxd.data(), K);
                    if (memcmp(&h, &ref[(size_t)ms[m] * N + rows[r]], 4)) {
                        ok = false;
                        snprintf(why, sizeof why, ": default != the host definition at m=%d n=%lld", ms[m], (long long)rows[r]);
                    }
                }
            std::vector<std::vector<float>> ts(ks.size());
            for (int rep = 0; rep < 9; rep++)
                for (size_t kk = 0; kk < ks.size(); kk++) {
                    const size_t k = (kk + rep) % ks.size();
                    const float t = bg_time(ex, flush, fbytes, e0, e1, rep, ks[k].fn, &w, M, xq, xd, y[k]);
                    if (rep >= 2) ts[k].push_back(t);
                }
            const double mac = (double)M * N * K;
            for (size_t k = 0; k < ks.size(); k++) {
                const double t = bench_median(ts[k]);
                printf("  tiles %-8s N=%-6lld K=%-5lld M=%-5d %-22s %8.4f ms %6.1f TMAC/s  %.2fx default  bits==default %s\n",
                       sh.name, (long long)N, (long long)K, M, ks[k].name, t, mac / (t * 1e-3) / 1e12,
                       t / bench_median(ts[0]), same[k] ? "yes" : "NO");
            }
            printf("%s tiles %s M=%d: %zu variants == default (memcmp), default == host definition (20 outputs)%s\n",
                   ok ? "PASS" : "FAIL", sh.name, M, ks.size() - 1, why);
            (ok ? n_pass : n_fail)++;
            for (auto &p : y) CK(cudaFree(p));
            bg_weight_free(&w);
            CK(cudaFree(xq));
            CK(cudaFree(xd));
        }
    printf("bench_gemv --tiles: %d PASS, %d FAIL\n", n_pass, n_fail);
    return n_fail ? 1 : 0;
}

int main(int argc, char **argv) {
    /* --check: the bit checks only (for compute-sanitizer: memcheck, racecheck) */
    const bool check_only = argc > 1 && !strcmp(argv[1], "--check");
    /* a bare execution context: no programmatic dependent launch (each kernel
     * timed alone), nothing else switched */
    static dsc_backend b;
    static ds_backend be;
    cudaDeviceProp prop;
    cudaEvent_t e0, e1;
    ds_exec *ex = bench_exec(&b, &be, &prop, &e0, &e1);
    if (!ex) return 2;
    CK(dsc_q8_mma_init());
    printf("bench_gemv: %s, %d SMs, L2 %d MiB; medians of %d, L2 flushed before each; q8w MT/R/U/MINB\n", prop.name,
           prop.multiProcessorCount, prop.l2CacheSize >> 20, REPS);

    /* the copy bandwidth: 1 GiB device to device, bytes read + written */
    const size_t cbytes = (size_t)1 << 30, fbytes = (size_t)256 << 20;
    void *ca, *cb, *flush;
    CK(cudaMalloc(&ca, cbytes));
    CK(cudaMalloc(&cb, cbytes));
    CK(cudaMalloc(&flush, fbytes));
    CK(cudaMemset(ca, 1, cbytes));
    std::vector<float> ct;
    for (int r = 0; r < 7; r++) {
        CK(cudaEventRecord(e0, ex->st));
        CK(cudaMemcpyAsync(cb, ca, cbytes, cudaMemcpyDeviceToDevice, ex->st));
        CK(cudaEventRecord(e1, ex->st));
        CK(cudaEventSynchronize(e1));
        float ms;
        CK(cudaEventElapsedTime(&ms, e0, e1));
        if (r >= 2) ct.push_back(ms);
    }
    const double copy_gbs = 2.0 * (double)cbytes / (bench_median(ct) * 1e-3) / 1e9;
    printf("copy bandwidth (cudaMemcpy D2D, 1 GiB, read + written): %.0f GB/s\n", copy_gbs);
    if (argc > 1 && !strcmp(argv[1], "--tiles")) return bench_tiles(ex, flush, fbytes, e0, e1);
    CK(cudaFree(ca));
    CK(cudaFree(cb));

    struct shape { const char *name; int64_t N, K; int per_layer; };
    const shape shapes[] = {
        {"q/o", 4096, 4096, 2}, {"k/v", 1024, 4096, 2}, {"gate/up", 12288, 4096, 2},
        {"down", 4096, 12288, 1}, {"lm head", 151936, 4096, 0},
        /* q, k and v as the layer launches them (one set, matmul_multi): times only */
        {"qkv", 6144, 4096, -1},
        /* tails (bits only; not in the step): a last segment of 2 blocks, N
         * odd; one partial segment of 3 blocks */
        {"tail", 129, 4160, -1}, {"short", 4501, 96, -1},
    };
    const int ns = (int)(sizeof shapes / sizeof shapes[0]);
    const int Ms[5] = {1, 2, 4, 8, 16};
    double t_old[8][5], t_new[8][5], t_best[8][5];
    int n_pass = 0, n_fail = 0;
    int8_t *xq;
    float *xd;
    CK(cudaMalloc(&xq, (size_t)16 * 12288));
    CK(cudaMalloc(&xd, (size_t)16 * 12288 / 32 * 4));
    for (int si = 0; si < ns; si++) {
        const shape &sh = shapes[si];
        const int64_t N = sh.N, K = sh.K, nb = K / 32;
        dsc_weight w = bg_weight(N, K, 11u + (uint32_t)si, 23u + (uint32_t)si);
        bg_fill_q<<<256, 256>>>(xq, (size_t)(16 * K), 37u + (uint32_t)si);
        bg_fill_d<<<64, 256>>>(xd, (size_t)(16 * nb), 41u + (uint32_t)si);
        CK(cudaGetLastError());
        CK(cudaDeviceSynchronize());
        /* the host copies the definition check needs */
        const int64_t rows[5] = {0, 1, N / 2, N - 2, N - 1};
        std::vector<int8_t> hw(5 * K), hx(16 * K);
        std::vector<float> hs(5 * nb), hxd(16 * nb);
        for (int r = 0; r < 5; r++) {
            CK(cudaMemcpy(hw.data() + r * K, (int8_t *)w.data + rows[r] * K, (size_t)K, cudaMemcpyDeviceToHost));
            CK(cudaMemcpy(hs.data() + r * nb, w.scale + rows[r] * nb, (size_t)nb * 4, cudaMemcpyDeviceToHost));
        }
        CK(cudaMemcpy(hx.data(), xq, (size_t)(16 * K), cudaMemcpyDeviceToHost));
        CK(cudaMemcpy(hxd.data(), xd, (size_t)(16 * nb) * 4, cudaMemcpyDeviceToHost));
        float *y[BG_NK];
        for (int k = 0; k < BG_NK; k++) CK(cudaMalloc(&y[k], (size_t)(16 * N) * 4));
        std::vector<float> href(16 * N), hy(16 * N);
        for (int mi = 0; mi < 5; mi++) {
            const int M = Ms[mi];
            bg_kernel ks[BG_NK];
            bg_kernels(M, ks);
            /* validate: one run each, outputs pre-set to a NaN pattern */
            bool ok = true;
            char why[256] = "";
            for (int k = 0; k < BG_NK; k++) {
                CK(cudaMemset(y[k], 0xff, (size_t)(16 * N) * 4));
                ks[k].fn(ex, &w, M, xq, xd, y[k]);
            }
            CK(cudaDeviceSynchronize());
            if (ex->err) {
                printf("FAIL launch: %s\n", ex->errmsg);
                return 1;
            }
            CK(cudaMemcpy(href.data(), y[0], (size_t)(M * N) * 4, cudaMemcpyDeviceToHost));
            bool same[BG_NK];
            same[0] = true;
            for (int k = 1; k < BG_NK; k++) {
                CK(cudaMemcpy(hy.data(), y[k], (size_t)(M * N) * 4, cudaMemcpyDeviceToHost));
                same[k] = !memcmp(hy.data(), href.data(), (size_t)(M * N) * 4);
                if (!same[k] && ok) {
                    ok = false;
                    for (int64_t e = 0; e < M * N; e++)
                        if (memcmp(&hy[e], &href[e], 4)) {
                            snprintf(why, sizeof why, "%s != old at m=%lld n=%lld (%.9g vs %.9g)", ks[k].name,
                                     (long long)(e / N), (long long)(e % N), hy[e], href[e]);
                            break;
                        }
                }
            }
            for (int r = 0; r < 5 && ok; r++)
                for (int m = 0; m < M && ok; m++) {
                    const float h = bg_host(hw.data() + r * K, hs.data() + r * nb, hx.data() + m * K,
                                            hxd.data() + m * nb, K);
                    if (memcmp(&h, &href[m * N + rows[r]], 4)) {
                        ok = false;
                        snprintf(why, sizeof why, "old != the host definition at m=%d n=%lld (%.9g vs %.9g)", m,
                                 (long long)rows[r], href[m * N + rows[r]], h);
                    }
                }
            /* time: interleaved, rotating order */
            std::vector<float> ts[BG_NK];
            for (int rep = 0; rep < (check_only ? 0 : REPS + 2); rep++)
                for (int kk = 0; kk < BG_NK; kk++) {
                    const int k = (kk + rep) % BG_NK;
                    const float ms = bg_time(ex, flush, fbytes, e0, e1, rep, ks[k].fn, &w, M, xq, xd, y[k]);
                    if (rep >= 2) ts[k].push_back(ms);
                }
            const double bytes = (double)(N * K + N * nb * 4 + M * K + M * nb * 4 + M * N * 4);
            double best = 1e30;
            int bk = 1;
            for (int k = 0; k < BG_NK && !check_only; k++) {
                const double ms = bench_median(ts[k]), gbs = bytes / (ms * 1e-3) / 1e9;
                printf("  %-8s N=%-6lld K=%-5lld M=%d  %-13s %8.4f ms %6.0f GB/s %5.1f%% of copy  %.2fx old  bits==old %s\n",
                       sh.name, (long long)N, (long long)K, M, ks[k].name, ms, gbs, 100.0 * gbs / copy_gbs,
                       ms / bench_median(ts[0]), same[k] ? "yes" : "NO");
                if (k >= 1 && same[k] && ms < best) { best = ms; bk = k; }
            }
            t_old[si][mi] = bench_median(ts[0]);
            t_new[si][mi] = bench_median(ts[1]);
            t_best[si][mi] = best;
            printf("%s %-8s N=%-6lld K=%-5lld M=%d: %d kernels == old (memcmp, %lld outputs), old == host definition (5 rows)%s%s;"
                   " new %.2fx old, best %s\n",
                   ok ? "PASS" : "FAIL", sh.name, (long long)N, (long long)K, M, BG_NK - 1, (long long)(M * N),
                   ok ? "" : ": ", why,
                   check_only ? 0.0 : t_new[si][mi] / t_old[si][mi], ks[bk].name);
            if (ok) n_pass++;
            else n_fail++;
        }
        for (int k = 0; k < BG_NK; k++) CK(cudaFree(y[k]));
        bg_weight_free(&w);
    }
    /* one 8B step's matmuls from the shapes (36 layers: q, o, k, v, gate, up,
     * down; the LM head), per M: old, new, best q8w configuration per shape */
    if (check_only) {
        printf("bench_gemv: %d PASS, %d FAIL\n", n_pass, n_fail);
        return n_fail ? 1 : 0;
    }
    printf("\n8B Q8_0 step, matmuls only (best: the fastest bit-exact q8w configuration per shape) (36 x (2 q/o + 2 k/v + 2 gate/up + down) + LM head), L2 cold:\n");
    double s1[3] = {0, 0, 0};
    for (int mi = 0; mi < 5; mi++) {
        double s[3] = {0, 0, 0};
        for (int si = 0; si < ns; si++) {
            if (shapes[si].per_layer < 0) continue;
            const double f = shapes[si].per_layer ? 36.0 * shapes[si].per_layer : 1.0;
            s[0] += f * t_old[si][mi];
            s[1] += f * t_new[si][mi];
            s[2] += f * t_best[si][mi];
        }
        if (mi == 0) for (int i = 0; i < 3; i++) s1[i] = s[i];
        printf("  M=%d  old %.3f ms (%.0f tok/s, %.2fx M=1)  new %.3f ms (%.0f tok/s, %.2fx M=1)  best %.3f ms (%.2fx M=1)\n",
               Ms[mi], s[0], 1e3 / s[0], s[0] / s1[0], s[1], 1e3 / s[1], s[1] / s1[1], s[2], s[2] / s1[2]);
    }
    printf("bench_gemv: %d PASS, %d FAIL\n", n_pass, n_fail);
    CK(cudaFree(flush));
    CK(cudaFree(xq));
    CK(cudaFree(xd));
    CK(cudaStreamDestroy(ex->st));
    free(ex);
    return n_fail ? 1 : 0;
}
