/* test_kq_lanes.cu — the kquant GPU kernels' integer and layout logic on the
 * HOST, no GPU needed (built with nvcc; `make test-kq-lanes`).
 *
 * matmul_kq.cu's per-lane functions (kq_load, kq_lane_ints, the Q8_K
 * quantizer's kq8k_lane_max / kq8k_combine / kq8k_q), its weight repacking
 * (kq_repack_row) and its embed dequantization (kq_embed_value) are
 * __host__ __device__; this file includes matmul_kq.cu and drives them
 * exactly as the kernels do — 8 lanes per super-block, their integers
 * summed, then the canonical f32 chain in super-block order; 32 lanes and
 * an xor butterfly for the quantizer — against the CPU's canonical
 * ds_matmul, ds_quantize_row_q8_k and ds_row_to_f32, memcmp. What it cannot
 * check is what only a GPU does (the launch geometry, the real shuffles and
 * loads): tests/cuda/test_cuda_ops.c checks those on a GPU.
 * Ends with "test_kq_lanes: N checks passed, N failed". */
#include "kernels/cuda/matmul_kq.cu"

#include <math.h>
#include <stdio.h>

#include "../testutil.h"

extern "C" {
#include "kernels/kernels.h"
void ds_quantize_row_q8_k(const float *x, int64_t K, int8_t *q, float *d, int16_t *bsums);
}

/* matmul_kq.cu's references into the rest of the backend: never called here */
void dsc_note(ds_exec *ex, cudaError_t e, const char *what) { (void)ex; (void)e; (void)what; }
void dsc_launched(ds_exec *ex, cudaError_t e, const char *what) { (void)ex; (void)e; (void)what; }
void *dsc_scratch(ds_exec *ex, int s, size_t bytes) { (void)ex; (void)s; (void)bytes; return NULL; }
void dsc_matmul_q8_0(ds_exec *ex, ds_variant v, const dsc_weight *w, int M, const float *x, float *y) {
    (void)ex; (void)v; (void)w; (void)M; (void)x; (void)y;
}

/* the device layout of a whole weight, on the host */
struct host_w {
    uint8_t *q;
    float *f;
    size_t qrow, frow;
};
static host_w repack(uint32_t t, const uint8_t *wd, int64_t N, int64_t K) {
    int ok;
    const size_t rb = (size_t)ds_row_bytes(t, (uint64_t)K, &ok);
    const bool kt = kq_is_ktype(t);
    const size_t nb = kt ? (size_t)K / DS_QK_K : (size_t)K / 32;
    host_w h;
    h.qrow = kt ? nb * (size_t)kq_dev_block_bytes(t) : (size_t)K;
    h.frow = kt ? nb * (size_t)kq_dev_nf(t) : nb;
    h.q = (uint8_t *)malloc(h.qrow * (size_t)N + 1);
    h.f = (float *)malloc(h.frow * (size_t)N * sizeof(float) + 4);
    for (int64_t n = 0; n < N; n++) kq_repack_row(t, wd + (size_t)n * rb, K, h.q + (size_t)n * h.qrow, h.f + (size_t)n * h.frow);
    return h;
}

/* kqv_kernel's canonical computation of y[m][n], lane by lane */
template <int TYPE>
static float emulate(const host_w &h, int64_t n, int64_t nb, const int8_t *xq, const float *xd) {
    const int BB = kq_dev_block_bytes(TYPE), NF = kq_dev_nf(TYPE);
    float acc = 0.0f;
    for (int64_t b = 0; b < nb; b++) {
        int I = 0, Mn = 0;
        float d = 0, dm = 0;
        for (int s = 0; s < 8; s++) {
            kq_wlane w;
            kq_load<TYPE>(h.q + (size_t)n * h.qrow + (size_t)b * BB, h.f + (size_t)n * h.frow + (size_t)b * NF, s, w);
            int Ii, Mi;
            kq_lane_ints<TYPE>(w, xq + b * DS_QK_K, s, Ii, Mi);
            I += Ii;
            Mn += Mi;
            d = w.d;
            dm = w.dm;
        }
        acc = fmaf((float)I, d * xd[b], acc);
        if (TYPE != DS_TYPE_Q6_K) acc = fmaf(-(float)Mn, dm * xd[b], acc);
    }
    return acc != acc ? ds_bits_f32(KQ_QNAN_BITS) : acc;
}

/* kq8k_quantize's warp on one super-block: 32 lanes, the xor butterfly
 * (every lane reads its partner's value from before the step) */
static void emulate_q8k(const float *x, int8_t *q, float *d, int *lanes_agree) {
    float am[32], oam[32];
    int id[32], oid[32];
    for (int l = 0; l < 32; l++) kq8k_lane_max(x + 8 * l, l, am[l], id[l]);
    for (int o = 16; o >= 1; o /= 2) {
        memcpy(oam, am, sizeof am);
        memcpy(oid, id, sizeof id);
        for (int l = 0; l < 32; l++) kq8k_combine(oam[l ^ o], oid[l ^ o], am[l], id[l]);
    }
    *lanes_agree = 1;
    for (int l = 1; l < 32; l++) *lanes_agree &= !memcmp(&am[l], &am[0], 4) && id[l] == id[0];
    if (am[0] == 0.0f) {
        memset(q, 0, DS_QK_K);
        *d = 0.0f;
        return;
    }
    const float iscale = kq_fdiv(-127.0f, x[id[0]]);
    for (int j = 0; j < DS_QK_K; j++) q[j] = (int8_t)kq8k_q(iscale, x[j]);
    *d = kq_fdiv(1.0f, iscale);
}

static uint64_t rng = 0x1234abcdull;
static float urand(void) { return ds_uniform_pm1(&rng); }

static void check_matmul(uint32_t t, const char *label, const uint8_t *wd, int64_t N, int64_t K, const float *x, int M) {
    const int64_t nb = K / DS_QK_K;
    host_w h = repack(t, wd, N, K);
    int8_t *xq = (int8_t *)malloc((size_t)(M * K));
    float *xd = (float *)malloc((size_t)(M * nb) * 4 + 4);
    int16_t *bs = (int16_t *)malloc((size_t)(M * nb) * 32 + 2);
    for (int m = 0; m < M; m++) ds_quantize_row_q8_k(x + m * K, K, xq + m * K, xd + m * nb, bs + m * nb * 16);
    float *ycpu = (float *)malloc((size_t)(M * N) * 4), *yem = (float *)malloc((size_t)(M * N) * 4);
    ds_weight W = {};
    W.type = t; W.n_in = K; W.n_out = N; W.data = (void *)wd;
    ds_matmul(DS_CANONICAL, &W, M, x, ycpu, NULL);
    for (int m = 0; m < M; m++)
        for (int64_t n = 0; n < N; n++) {
            float v = 0;
            if (t == DS_TYPE_Q4_K) v = emulate<DS_TYPE_Q4_K>(h, n, nb, xq + m * K, xd + m * nb);
            else if (t == DS_TYPE_Q5_K) v = emulate<DS_TYPE_Q5_K>(h, n, nb, xq + m * K, xd + m * nb);
            else v = emulate<DS_TYPE_Q6_K>(h, n, nb, xq + m * K, xd + m * nb);
            yem[m * N + n] = v;
        }
    const int same = !memcmp(ycpu, yem, (size_t)(M * N) * 4);
    CHECK(same, "%s %s N=%lld K=%lld: lane emulation != CPU canonical", ds_type_name(t), label, (long long)N, (long long)K);
    if (!same)
        for (int64_t e = 0; e < M * N; e++)
            if (memcmp(&ycpu[e], &yem[e], 4)) {
                printf("INFO first mismatch m=%lld n=%lld emul=%.9g cpu=%.9g\n", (long long)(e / N), (long long)(e % N), yem[e], ycpu[e]);
                break;
            }
    printf("%s %-7s N=%-4lld K=%-5lld lanes == CPU canonical: %s\n", ds_type_name(t), label, (long long)N, (long long)K, same ? "yes" : "NO");
    free(h.q); free(h.f); free(xq); free(xd); free(bs); free(ycpu); free(yem);
}

static void check_embed(uint32_t t, const uint8_t *wd, int64_t N, int64_t K) {
    int ok;
    const size_t rb = (size_t)ds_row_bytes(t, (uint64_t)K, &ok);
    host_w h = repack(t, wd, N, K);
    float *ref = (float *)malloc((size_t)K * 4);
    int same = 1;
    for (int64_t n = 0; n < N; n++) {
        ds_row_to_f32(t, wd + (size_t)n * rb, K, ref);
        for (int64_t k = 0; k < K; k++) {
            const float v = kq_embed_value(t, h.q, h.f, K, n, k);
            if (memcmp(&v, &ref[k], 4) && !(v != v && ref[k] != ref[k])) same = 0;   /* NaN payloads aside */
        }
    }
    CHECK(same, "%s embed N=%lld K=%lld != ds_row_to_f32", ds_type_name(t), (long long)N, (long long)K);
    printf("%s embed   N=%-4lld K=%-5lld == ds_row_to_f32: %s\n", ds_type_name(t), (long long)N, (long long)K, same ? "yes" : "NO");
    free(h.q); free(h.f); free(ref);
}

/* random bytes with the fp16 scales of some blocks set to extremes */
static uint8_t *raw_blocks(uint32_t t, int64_t N, int64_t K) {
    int ok;
    const size_t rb = (size_t)ds_row_bytes(t, (uint64_t)K, &ok), bb = (size_t)ds_type_block_bytes(t);
    const int64_t nb = K / (int64_t)ds_type_block_elems(t);
    uint8_t *wd = (uint8_t *)malloc(rb * (size_t)N);
    for (size_t k = 0; k < rb * (size_t)N; k++) wd[k] = (uint8_t)(ds_splitmix64(&rng) >> 56);
    const size_t od = t == DS_TYPE_Q6_K ? offsetof(ds_block_q6_K, d) : 0;   /* K types and Q4_0/Q5_0: d first */
    const size_t om = t == DS_TYPE_Q4_K || t == DS_TYPE_Q5_K ? 2 : 0;
    const uint16_t ext[8] = {0x7c00, 0xfc00, 0x7e00, 0x7c01, 0x0001, 0x7bff, 0xfbff, 0};
    for (int64_t n = 0; n < N; n++)
        for (int64_t b = 0; b < nb; b++) {
            uint8_t *blk = wd + (size_t)n * rb + (size_t)b * bb;
            uint16_t dv = ds_f32_to_fp16(urand() * 0.02f), mv = ds_f32_to_fp16(urand() * 0.02f);
            if (n < 8 && b == 0) dv = ext[n];
            if (n >= 8 && n < 16 && b == nb - 1) mv = ext[n - 8];
            memcpy(blk + od, &dv, 2);
            if (om) memcpy(blk + om, &mv, 2);
        }
    return wd;
}

static void check_q8k(void) {
    const int R = 12;
    float x[DS_QK_K];
    int same = 1, agree = 1;
    for (int r = 0; r < R; r++) {
        for (int k = 0; k < DS_QK_K; k++) x[k] = ds_uniform_pm1(&rng) * (r == 1 ? 1e-40f : 3.0f);
        switch (r) {
        case 2: memset(x, 0, sizeof x); x[200] = -0.0f; break;           /* zero block */
        case 3: x[17] = -9.0f; x[230] = 9.0f; x[100] = -9.0f; break;     /* tie: the first */
        case 4: x[5] = NAN; x[6] = 8.0f; break;                          /* NaN never wins */
        case 5: x[77] = INFINITY; break;                                 /* iscale -0, d -inf */
        case 6: for (int k = 0; k < DS_QK_K; k++) x[k] = NAN; break;     /* all NaN: zero block */
        case 7: for (int k = 0; k < DS_QK_K; k++) x[k] = (float)(k % 7) - 3.0f; break;   /* ties of .5 */
        case 8: x[255] = 1e30f; break;
        case 9: x[0] = -3.5f; x[31] = 3.5f; x[32] = 3.5f; break;          /* ties across lanes */
        case 10: for (int k = 0; k < DS_QK_K; k++) x[k] = k == 128 ? 1.0f : 0.0f; break;
        default: break;
        }
        int8_t qc[DS_QK_K], qe[DS_QK_K];
        float dc, de;
        int16_t bs[16];
        int ag;
        ds_quantize_row_q8_k(x, DS_QK_K, qc, &dc, bs);
        emulate_q8k(x, qe, &de, &ag);
        agree &= ag;
        if (memcmp(qc, qe, sizeof qc) || memcmp(&dc, &de, 4)) {
            same = 0;
            printf("INFO q8_k row %d: d cpu %.9g emul %.9g\n", r, dc, de);
        }
    }
    CHECK(same && agree, "Q8_K quantizer warp emulation != ds_quantize_row_q8_k (lanes agree: %d)", agree);
    printf("Q8_K quantizer (warp butterfly, %d rows incl. zero / NaN / inf / ties / subnormal) == CPU: %s\n", R,
           same && agree ? "yes" : "NO");
}

int main(void) {
    check_q8k();
    const uint32_t types[3] = {DS_TYPE_Q4_K, DS_TYPE_Q5_K, DS_TYPE_Q6_K};
    const int64_t Ks[3] = {256, 1024, 2560};
    const int M = 9;
    for (int ti = 0; ti < 3; ti++)
        for (int ki = 0; ki < 3; ki++) {
            const uint32_t t = types[ti];
            const int64_t K = Ks[ki], N = 19;
            int ok;
            const size_t rb = (size_t)ds_row_bytes(t, (uint64_t)K, &ok);
            float *wf = (float *)malloc((size_t)(N * K) * 4), *x = (float *)malloc((size_t)(M * K) * 4);
            for (int64_t k = 0; k < N * K; k++) wf[k] = urand();
            for (int64_t k = 0; k < M * K; k++) x[k] = urand() * 2.0f;
            for (int64_t k = 0; k < K; k += 7) x[1 * K + k] *= 100.0f;
            for (int64_t k = 0; k < 256; k++) x[2 * K + k] = 0.0f;
            x[3 * K + 10] = -50.0f; x[3 * K + 20] = 50.0f;
            x[4 * K + 3] = NAN;
            for (int64_t k = 0; k < 32; k++) x[5 * K + k] = 1e-40f * (float)(k - 16);
            uint8_t *wd = (uint8_t *)malloc(rb * (size_t)N);
            ds_f32_to_type(t, wf, N * K, wd);
            check_matmul(t, "random", wd, N, K, x, M);
            check_embed(t, wd, N, K);
            free(wd);
            wd = raw_blocks(t, N, K);
            check_matmul(t, "blocks", wd, N, K, x, M);
            check_embed(t, wd, N, K);
            free(wd); free(wf); free(x);
        }
    /* Q4_0 / Q5_0: the Q8_0 layout's embed (the matmul is matmul_q8_0.cu's) */
    const uint32_t leg[2] = {DS_TYPE_Q4_0, DS_TYPE_Q5_0};
    for (int i = 0; i < 2; i++) {
        const int64_t N = 7, K = 96;
        float *wf = (float *)malloc((size_t)(N * K) * 4);
        for (int64_t k = 0; k < N * K; k++) wf[k] = urand();
        int ok;
        uint8_t *wd = (uint8_t *)malloc((size_t)ds_row_bytes(leg[i], (uint64_t)K, &ok) * (size_t)N);
        ds_f32_to_type(leg[i], wf, N * K, wd);
        check_embed(leg[i], wd, N, K);
        free(wd);
        wd = raw_blocks(leg[i], N, K);
        check_embed(leg[i], wd, N, K);
        free(wd); free(wf);
    }
    return tu_finish("test_kq_lanes");
}
