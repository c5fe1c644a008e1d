/* test_tile_emu.cc — attention's prefill tile kernel (att_tile,
 * src/kernels/cuda/attention_tile.cuh) run on the host, no GPU: the same
 * kernel source compiled as C++ against a small shim, each of a block's 256
 * threads a fiber (ucontext), __syncthreads a round in which every thread
 * runs to its next barrier, __shfl_xor_sync an exchange through a slot per
 * thread between two barriers (the kernel shuffles only where all threads
 * do), cp.async an immediate copy (zero-filled where asked), the _rn
 * intrinsics plain IEEE operations (-ffp-contract=off). Every output row,
 * memcmp against the CPU's canonical rows (ds_attention_rows on the same
 * paged pool): head_dim 64 and 128; GQA 1, 3, 4, 8 (3: tiles that end
 * inside a row); M = 1, 64, 65, 130 from p0 = 0, 63, 100, 200; causal and
 * non-causal, a row that sees nothing; K/V on shuffled pages; an inf in a
 * V row that the rows before it must not let in.
 * What this cannot see: the GPU's scheduling (async copies in flight,
 * bank conflicts, real warps) — tests/cuda/test_cuda_ops.c's
 * test_attention_tile runs the kernel itself on a GPU. Built with the CUDA
 * section of the Makefile (`make CUDA=1 test-tile-emu`), runs on any host.
 * A mismatch prints its first (row, head, column) and both values; ends
 * with "test_tile_emu: N passed, N failed". */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <ucontext.h>
#include <algorithm>
#include <vector>

extern "C" {
#include "backend.h"
}
#include "kernels/dsmath.h"

/* ---- the shim: what the kernel source needs of CUDA ------------------------------ */
#define __global__
#define __device__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __shared__
#define __align__(n) __attribute__((aligned(n)))
#define ATT_CHUNK DS_ATTN_CHUNK
using std::max;
using std::min;
struct alignas(16) float4 { float x, y, z, w; };
static inline float4 make_float4(float x, float y, float z, float w) { return float4{x, y, z, w}; }
static inline float __fadd_rn(float a, float b) { return a + b; }
static inline float __fsub_rn(float a, float b) { return a - b; }
static inline float __fmul_rn(float a, float b) { return a * b; }
static inline float __fdiv_rn(float a, float b) { return a / b; }
template <typename X> static inline X __ldg(const X *p) { return *p; }

enum { EMU_T = 256, EMU_STACK = 256 << 10 };
struct emu_dim { unsigned x; };
static struct {
    ucontext_t main, th[EMU_T];
    std::vector<char> stack;
    int cur, done[EMU_T], at_bar[EMU_T];
    float slot[EMU_T];
    unsigned block;
    void (*body)(void);
} emu;
static inline emu_dim emu_tid(void) { return emu_dim{(unsigned)emu.cur}; }
#define threadIdx emu_tid()
#define blockIdx (emu_dim{emu.block})
static void __syncthreads(void) {
    emu.at_bar[emu.cur] = 1;
    swapcontext(&emu.th[emu.cur], &emu.main);
}
static float __shfl_xor_sync(unsigned mask, float v, int o) {
    (void)mask;
    const int t = emu.cur;
    emu.slot[t] = v;
    __syncthreads();
    const float r = emu.slot[(t & ~31) | ((t & 31) ^ o)];
    __syncthreads();
    return r;
}
static inline void qm_cp16(void *dst, const void *src, int bytes) {
    memcpy(dst, src, (size_t)bytes);
    memset((char *)dst + bytes, 0, (size_t)(16 - bytes));
}
static inline void qm_commit(void) {}
template <int N> static inline void qm_wait(void) {}
static inline void dsc_pdl_wait(void) {}
static inline void dsc_pdl_trigger(void) {}
static inline int dsc_kv_nvis(const ds_rows &r, int m) { return r.n_vis ? r.n_vis[m] : r.pos[m] + 1; }
static inline int64_t dsc_kv_at(const int32_t *tab, int64_t page_stride, int pos, int64_t row) {
    return (int64_t)__ldg(tab + (pos >> 4)) * page_stride + (int64_t)(pos & 15) * row;
}
static float dsc_q8_block_warp(float, int, int8_t *) {   /* the emulation passes no Q8_0 copy */
    fprintf(stderr, "test_tile_emu: dsc_q8_block_warp is not emulated\n");
    abort();
}
alignas(16) static float att_tsm[(4 * 64 * 132 + 128 * 68 + 64 * 68 + 128) + 64];

#include "kernels/cuda/attention_tile.cuh"

/* ---- the block scheduler --------------------------------------------------------- */
static void emu_entry(void) {
    emu.body();
    emu.done[emu.cur] = 1;
}
/* run one block: every thread to its next barrier, round after round; a
 * round in which some threads finish and others wait is a divergent
 * barrier (the kernel's bug, reported) */
/* thread t's context, in a function of its own: no local of the caller
 * lives across getcontext (which GCC's -Wclobbered, on under -O1 and the
 * sanitizers, would flag) */
static __attribute__((noinline)) void emu_thread_init(int t) {
    emu.done[t] = emu.at_bar[t] = 0;
    getcontext(&emu.th[t]);
    emu.th[t].uc_stack.ss_sp = emu.stack.data() + (size_t)t * EMU_STACK;
    emu.th[t].uc_stack.ss_size = EMU_STACK;
    emu.th[t].uc_link = &emu.main;
    makecontext(&emu.th[t], emu_entry, 0);
}

static int emu_block(void) {
    for (int t = 0; t < EMU_T; t++) emu_thread_init(t);
    for (;;) {
        int n_done = 0, n_bar = 0;
        for (int t = 0; t < EMU_T; t++) {
            if (emu.done[t]) { n_done++; continue; }
            emu.at_bar[t] = 0;
            emu.cur = t;
            swapcontext(&emu.main, &emu.th[t]);
            if (emu.done[t]) n_done++;
            else n_bar += emu.at_bar[t];
        }
        if (n_done == EMU_T) return 0;
        if (n_done) {
            printf("FAIL block %u: %d threads finished while %d wait at a barrier\n", emu.block, n_done, n_bar);
            return -1;
        }
    }
}

static struct {
    int hd, nh, nkv, M;
    int64_t st;
    float scale;
    ds_rows rw;
    const float *q, *k, *v;
    float *out;
    const int32_t *runs;
    int n_runs;
} ka;
template <int HD> static void emu_body(void) {
    att_tile<HD>(ka.nh, ka.nkv, ka.st, ka.scale, ka.M, ka.rw, ka.q, ka.k, ka.v, ka.out, NULL, NULL, ka.runs, ka.n_runs);
}

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static float urand(float a) {
    rng ^= rng << 13; rng ^= rng >> 7; rng ^= rng << 17;
    return a * ((float)(rng >> 40) / 8388608.0f - 1.0f);
}

static int n_pass, n_fail;

/* M rows from p0 of one sequence on a shuffled paged pool; causal, or every
 * row seeing [0, p0 + M) with row M / 2 seeing nothing. inf_v: V of position
 * p0 + M / 2 is +inf in one column, so the rows before it must not let it in
 * (a key past a row's prefix is skipped, never multiplied by 0); NaN outputs
 * of the rows that see it match any NaN. */
static void emu_case(int hd, int nh, int nkv, int M, int p0, int causal, int inf_v = 0) {
    const int row = nkv * hd, L = p0 + M, np = (L + 15) / 16 + 1, npg = np + 3;
    const int64_t pst = (int64_t)2 * 16 * row;            /* a page: 16 K rows, then 16 V rows */
    std::vector<float> pool((size_t)npg * pst), q((size_t)M * nh * hd), out((size_t)M * nh * hd, NAN),
        cpu((size_t)M * nh * hd);
    for (auto &x : pool) x = urand(1.0f);
    for (auto &x : q) x = urand(3.0f);
    std::vector<int32_t> tab(np), pos(M), nv(M);
    for (int i = 0; i < np; i++) tab[i] = (int32_t)((i * 7 + 3) % npg);   /* 7 and npg coprime below */
    if (inf_v) {
        const int j = p0 + M / 2;
        pool[(size_t)tab[j / 16] * pst + (size_t)(16 + j % 16) * row + 5] = INFINITY;
    }
    for (int m = 0; m < M; m++) {
        pos[m] = p0 + m;
        nv[m] = causal ? p0 + m + 1 : m == M / 2 ? 0 : L;
    }
    ka.hd = hd; ka.nh = nh; ka.nkv = nkv; ka.M = M; ka.st = row; ka.scale = 1.0f / sqrtf((float)hd);
    ka.rw = ds_rows{};
    ka.rw.pos = pos.data();
    ka.rw.n_vis = causal ? NULL : nv.data();
    ka.rw.tables = tab.data();
    ka.rw.max_pages = np;
    ka.rw.page = 16;
    ka.rw.page_stride = pst;
    ka.q = q.data(); ka.k = pool.data(); ka.v = pool.data() + 16 * row; ka.out = out.data();
    ka.runs = NULL; ka.n_runs = 0;
    emu.body = hd == 64 ? emu_body<64> : emu_body<128>;
    const int tiles = (M * (nh / nkv) + 63) / 64 * nkv;
    int ok = 1;
    for (int b = 0; b < tiles && ok; b++) {
        emu.block = (unsigned)b;
        if (emu_block()) ok = 0;
    }
    const ds_attn_shape s = {nh, nkv, hd, row, ka.scale};
    const ds_attn_rows ar = {nv.data(), NULL, NULL, tab.data(), np, 16, pst};
    if (causal) for (int m = 0; m < M; m++) nv[m] = p0 + m + 1;
    ds_attention_rows(DS_CANONICAL, &s, M, &ar, q.data(), pool.data(), pool.data() + 16 * row, cpu.data(), NULL);
    for (size_t k = 0; ok && k < out.size(); k++)
        if (memcmp(&out[k], &cpu[k], 4) && !(out[k] != out[k] && cpu[k] != cpu[k])) {
            printf("  hd=%d %d/%d M=%d p0=%d %s: first mismatch row %d head %d col %d: tile %.9g vs CPU %.9g\n", hd, nh,
                   nkv, M, p0, causal ? "causal" : "non-causal", (int)(k / ((size_t)nh * hd)), (int)(k / hd % nh),
                   (int)(k % hd), out[k], cpu[k]);
            ok = 0;
        }
    if (ok) n_pass++;
    else {
        n_fail++;
        printf("FAIL hd=%d %d/%d heads M=%d p0=%d %s\n", hd, nh, nkv, M, p0, causal ? "causal" : "non-causal");
    }
}

/* Rows of several sequences in one call (ds_rows.runs, the batch engine's
 * prompt chunks): runs of the given lengths, sequence i's rows from p0s[i],
 * each sequence on its own shuffled pages of one pool (its own row of the
 * tables). The kernel runs the tiles of the runs of >= ATT_TILE_ROWS rows
 * (the other rows are the split path's: left NaN here and checked to be
 * untouched); those rows memcmp the CPU's canonical rows of their own
 * sequence. */
static void emu_case_runs(int hd, int nh, int nkv, const std::vector<int> &lens, const std::vector<int> &p0s) {
    const int row = nkv * hd, ns = (int)lens.size(), G = nh / nkv;
    int M = 0, Lmax = 0;
    for (int i = 0; i < ns; i++) {
        M += lens[i];
        Lmax = std::max(Lmax, p0s[i] + lens[i]);
    }
    const int np = (Lmax + 15) / 16 + 1, npg = ns * np + 5;
    const int64_t pst = (int64_t)2 * 16 * row;
    std::vector<float> pool((size_t)npg * pst), q((size_t)M * nh * hd), out((size_t)M * nh * hd, NAN),
        cpu((size_t)M * nh * hd);
    for (auto &x : pool) x = urand(1.0f);
    for (auto &x : q) x = urand(3.0f);
    std::vector<int32_t> tab((size_t)ns * np), pos(M), seq(M), nv(M), runs(2 * ns);
    for (int i = 0; i < ns * np; i++) tab[i] = (int32_t)((i * 7 + 3) % npg);   /* distinct: 7 and npg coprime */
    int m = 0;
    for (int i = 0; i < ns; i++) {
        runs[2 * i] = m;
        runs[2 * i + 1] = lens[i];
        for (int k = 0; k < lens[i]; k++, m++) {
            pos[m] = p0s[i] + k;
            seq[m] = i;
            nv[m] = pos[m] + 1;
        }
    }
    ka.hd = hd; ka.nh = nh; ka.nkv = nkv; ka.M = M; ka.st = row; ka.scale = 1.0f / sqrtf((float)hd);
    ka.rw = ds_rows{};
    ka.rw.pos = pos.data();
    ka.rw.seq = seq.data();
    ka.rw.tables = tab.data();
    ka.rw.max_pages = np;
    ka.rw.page = 16;
    ka.rw.page_stride = pst;
    ka.q = q.data(); ka.k = pool.data(); ka.v = pool.data() + 16 * row; ka.out = out.data();
    ka.runs = runs.data(); ka.n_runs = ns;
    emu.body = hd == 64 ? emu_body<64> : emu_body<128>;
    int tiles = 0;
    for (int i = 0; i < ns; i++)
        if (lens[i] >= ATT_TILE_ROWS) tiles += (lens[i] * G + 63) / 64;
    tiles *= nkv;
    int ok = 1;
    for (int b = 0; b < tiles && ok; b++) {
        emu.block = (unsigned)b;
        if (emu_block()) ok = 0;
    }
    const ds_attn_shape s = {nh, nkv, hd, row, ka.scale};
    const ds_attn_rows ar = {nv.data(), NULL, seq.data(), tab.data(), np, 16, pst};
    ds_attention_rows(DS_CANONICAL, &s, M, &ar, q.data(), pool.data(), pool.data() + 16 * row, cpu.data(), NULL);
    for (size_t k = 0; ok && k < out.size(); k++) {
        const int r = (int)(k / ((size_t)nh * hd)), sq = seq[r];
        const int tiled = lens[sq] >= ATT_TILE_ROWS;
        const int bad = tiled ? memcmp(&out[k], &cpu[k], 4) != 0 : out[k] == out[k];
        if (bad) {
            printf("  hd=%d %d/%d runs of %d sequences: first mismatch row %d (sequence %d, %s) head %d col %d: tile %.9g vs CPU %.9g\n",
                   hd, nh, nkv, ns, r, sq, tiled ? "tiled" : "not tiled: must stay untouched", (int)(k / hd % nh),
                   (int)(k % hd), out[k], cpu[k]);
            ok = 0;
        }
    }
    if (ok) n_pass++;
    else {
        n_fail++;
        printf("FAIL hd=%d %d/%d heads, runs of %d sequences\n", hd, nh, nkv, ns);
    }
}

int main(void) {
    emu.stack.resize((size_t)EMU_T * EMU_STACK);
    static const struct { int hd, nh, nkv; } shapes[] = {{64, 2, 2}, {128, 8, 2}, {128, 8, 1}, {64, 6, 2}};
    static const int Ms[] = {1, 64, 65, 130}, p0s[] = {0, 63, 100, 200};
    for (auto &sh : shapes) {
        const int f0 = n_fail;
        for (int M : Ms)
            for (int p0 : p0s) emu_case(sh.hd, sh.nh, sh.nkv, M, p0, 1);
        emu_case(sh.hd, sh.nh, sh.nkv, 65, 100, 0);
        emu_case(sh.hd, sh.nh, sh.nkv, 130, 0, 0);
        emu_case(sh.hd, sh.nh, sh.nkv, 130, 40, 1, 1);
        emu_case_runs(sh.hd, sh.nh, sh.nkv, {1, 70, 8, 130, 64}, {40, 0, 100, 17, 200});
        emu_case_runs(sh.hd, sh.nh, sh.nkv, {64, 3, 65}, {0, 5, 130});
        printf("test_tile_emu hd=%-3d %d/%d heads: att_tile == CPU canonical on every row (one sequence and runs of several): %s\n", sh.hd, sh.nh, sh.nkv,
               n_fail == f0 ? "yes" : "NO");
    }
    printf("test_tile_emu: %d passed, %d failed\n", n_pass, n_fail);
    return n_fail ? 1 : 0;
}
