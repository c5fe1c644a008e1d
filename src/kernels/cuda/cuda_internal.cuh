/* cuda_internal.cuh — what the CUDA backend (src/backend_cuda.cu) and its
 * operator families (src/kernels/cuda/<family>.cu) share. Private to them.
 *
 * ==== Floating point on the device ===================================================
 * Built with -fmad=false -prec-div=true -prec-sqrt=true -ftz=false and no
 * fast-math (Makefile): a * b + c is a rounded product and a rounded sum, as
 * on the CPU under -ffp-contract=off, division and square root are correctly
 * rounded, subnormals are kept. Canonical kernels still spell their
 * arithmetic with the _rn intrinsics (__fmaf_rn, __fadd_rn, __fmul_rn,
 * __fdiv_rn, __fsqrt_rn) so that their IEEE sequence is visible in the
 * source and independent of any flag. */
#ifndef DSPARK_CUDA_INTERNAL_CUH
#define DSPARK_CUDA_INTERNAL_CUH

#include <cuda_runtime.h>
#include <cublas_v2.h>
#include <stdint.h>

extern "C" {
/* This backend's execution context is its own `struct ds_exec` (below),
 * whose first member is the engine-visible `be` (backend.h). */
#define DS_EXEC_DEFINED 1
#include "backend.h"
#include "backend_cuda.h"
}
#include "kernels/dsmath.h"

/* ---- the backend's private state ------------------------------------------------ */
#define DSC_MAX_ROPE 8          /* RoPE tables kept (distinct freq_base x head_dim)   */
#define DSC_ROPE_POS DS_CUDA_ROPE_POS  /* positions a RoPE table covers (rope.cu says why) */
#define DSC_MAX_GRAPHS 128      /* recorded launch sequences per execution context   */
#define DSC_CHAIN_KEEP 64       /* the head chain's slots at most (heads.cu)          */
#define DSC_CHAIN_BLOCKS 128    /* ... and its blocks: counters, then each slot's block maxima */
#define DSC_CHAIN_BYTES (16 + (size_t)DSC_CHAIN_KEEP * DSC_CHAIN_BLOCKS * (sizeof(float) + sizeof(long long)))

typedef struct {
    uint32_t fbits;             /* freq_base's bits                                    */
    int      head_dim;
    int      scaled;            /* built with rope scaling y (else plain RoPE)         */
    ds_rope_yarn y;             /* the scaling (y.freq_factors: the host's, the key)   */
    float   *cs;                /* device: [DSC_ROPE_POS][head_dim/2] cos, then sin      */
    float   *inv_freq;          /* device: [head_dim/2], for positions past the table  */
    float   *ff;                /* device: [head_dim/2] frequency factors, or NULL     */
} dsc_rope_table;

typedef struct {
    int            device;
    int            n_sm;
    dsc_rope_table rope[DSC_MAX_ROPE];
    int            n_rope;
    cudaStream_t   aux;         /* uploads of tables, outside any capture            */
    unsigned       off;         /* DSC_OFF_* bits from $DSPARK_CUDA_OFF (A/B only)    */
    int            q8_layout;   /* a weight in the Q8_0 layout was prepared (Q8_0, Q4_0, Q5_0) */
    int            trace;       /* $DSPARK_CUDA_TRACE=1: the stream timeline (dsc_trace)  */
    int            mma_bm;      /* $DSPARK_CUDA_MMA: forced tensor-core tile height, 0 = chosen */
    int            stream_all;  /* DSPARK_CUDA_ON=stream: the Q8_0 warp-streamed tensor-core GEMV at every M <= 16 */
    int            tile_all;    /* DSPARK_CUDA_ON=tile: attention's tile path for every one-sequence call */
} dsc_backend;

/* The stream's timeline as the GPU saw it ($DSPARK_CUDA_TRACE=1): an event
 * before and after every stream op issued outside a recording (a graph
 * replay, a copy, a kernel launched on its own), read back at each
 * synchronisation. busy = the op's own time; gap = the time the GPU sat idle
 * before it because the host had not issued it yet (after a wait: the
 * host's turnaround). Summed per op label, printed when the context is
 * freed. A measuring aid: events cost ~1 us of stream time each. */
#define DSC_TRACE_OPS 1024
#define DSC_TRACE_LABELS 160
typedef struct {
    cudaEvent_t beg[DSC_TRACE_OPS], end[DSC_TRACE_OPS], carry;
    int         label[DSC_TRACE_OPS];
    int         n, have_carry, inside;
    char        name[DSC_TRACE_LABELS][40];
    int         n_names;
    long        count[DSC_TRACE_LABELS];
    double      busy_ms[DSC_TRACE_LABELS], gap_ms[DSC_TRACE_LABELS];
    long        dropped, syncs;
} dsc_trace;

/* Launch-saving paths that can be switched off for an A/B measurement
 * (bench/cuda_ab.sh): DSPARK_CUDA_OFF=swiglu,fq,pinned,chain,prologue,multi,
 * wide,q8x,staged,pdl,narrow,copyk,moeid,... switch paths off, DSPARK_CUDA_ON=epilogue switches the
 * one that is off by default on (it measured slower). Read once when the
 * backend starts (an unknown name refuses to start); every path gives the
 * same bits. */
enum {
    DSC_OFF_SWIGLU = 1u << 0,    /* SwiGLU inside the down projection          */
    DSC_OFF_FQ = 1u << 1,        /* Q8_0 activations quantized inside the kernel */
    DSC_OFF_PINNED = 1u << 2,    /* pinned staging of small transfers          */
    DSC_OFF_CHAIN = 1u << 3,     /* the drafter's head chain in one launch     */
    DSC_OFF_PROLOGUE = 1u << 4,  /* QK-norm + RoPE + KV write in one launch    */
    DSC_OFF_MULTI = 1u << 5,     /* q/k/v and gate/up in one launch            */
    DSC_OFF_EPILOGUE = 1u << 6,  /* residual + norm inside the matmul          */
    DSC_OFF_WIDE = 1u << 7,      /* attention: all warps on one chunk (<= 16)  */
    DSC_OFF_Q8X = 1u << 8,       /* activations quantized by their producer    */
    DSC_OFF_STAGED = 1u << 9,    /* dense canonical GEMV through shared memory */
    DSC_OFF_PDL = 1u << 10,      /* programmatic dependent launch (dsc_launch)  */
    DSC_OFF_NARROW = 1u << 11,   /* Q8_0 GEMV: a row per warp on small grids    */
    DSC_OFF_COPYK = 1u << 12,    /* recorded copies as kernels, not memcpy nodes */
    DSC_OFF_SPREAD = 1u << 13,   /* Q8_0 GEMV, short rows, M > 1: lanes share pairs */
    DSC_OFF_MMA = 1u << 14,      /* Q8_0 canonical on the tensor cores (M > 8)  */
    DSC_OFF_STREAM = 1u << 15,   /* Q8_0 warp-streamed tensor-core GEMV (M <= 16) */
    DSC_OFF_SPLIT = 1u << 16,    /* attention: chunks of long rows over many blocks */
    DSC_OFF_CHUNK = 1u << 17,    /* prompts in 512-row chunks (else 64)          */
    DSC_OFF_GEMV = 1u << 18,     /* Q8_0 canonical M <= 8: the warp-streamed GEMV (else q8v) */
    DSC_OFF_TILE = 1u << 19,     /* attention: the prefill tile path (att_tile)  */
    DSC_OFF_RUNS = 1u << 20,     /* attention: the tile path for rows of several sequences (opt-in until run on a GPU) */
    DSC_OFF_ROPEEXT = 1u << 22,  /* rope scaling (rope_ext; opt-in until run on a GPU): off = such files refused */
    DSC_OFF_TP    = 1u << 23,    /* --tp N ranks on the device (opt-in until run on a GPU): off = refused */
    DSC_OFF_MOEID = 1u << 21,    /* MoE experts by id on the device (matmul_id; opt-in until run on a GPU): off = the host grouping */
};

/* A prepared weight (ds_weight.extra): device copies, Q8_0 split into a quant
 * matrix with 16-byte aligned rows and f32 scales (the exact values of the
 * fp16 scales), so that every load is aligned and no conversion of a scale
 * is repeated. F32 / F16 / BF16 rows are stored as in the file. */
typedef struct {
    uint32_t type;
    int64_t  n_in, n_out;
    void    *data;              /* F32/F16/BF16: n_out rows; Q8_0: int8 [n_out][n_in]  */
    float   *scale;             /* Q8_0: [n_out][n_in / 32]                             */
    /* matmul_id (moe.cu): on the first expert of an array that
     * moe_id_prepare took, the device table of the array's buffers —
     * [id_n] data pointers, then (Q8_0) [id_n] scale pointers; else NULL */
    void   **id_tab;
    int      id_n;
} dsc_weight;

/* Where a prepared weight keeps its dsc_weight. backend.h names the slot
 * ds_weight.extra; until the seam adds that field to kernels.h, the CUDA
 * backend uses the `packed` slot (a weight is prepared for one backend
 * only; the CPU kernels never see a CUDA-prepared weight). One line to
 * change when `extra` exists. */
#define DSC_WEIGHT_SLOT extra
static inline const dsc_weight *dsc_w(const ds_weight *W) {
    return (const dsc_weight *)W->DSC_WEIGHT_SLOT;
}

/* Scratch slots of an execution context (grown, never shrunk; see backend_cuda.cu). */
enum { DSC_SLOT_Q8_ACT = 0, DSC_SLOT_HALF_X, DSC_SLOT_ATT_PART, DSC_SLOT_COUNT };
#define DSC_MAX_RETIRED 32

/* The Q8_0 copy of an activation buffer, made by the kernel that wrote the
 * buffer (rmsnorm / residual+norm, SwiGLU, attention: dsc_q8x_*), for the
 * Q8_0 canonical matmuls that read it next. Quantizing is a function of the
 * floats alone (dsc_q8_block), so the copy is the bytes the matmul's own
 * quantization would make: the bits cannot move, only a launch is saved.
 * Valid while nothing else has run on the stream since (seq == n_ops): every
 * launch, copy and recording bumps n_ops, the matmuls that use the copy
 * carry it forward, and so does moe_route (it writes neither the rows nor
 * the copy: moe.cu), for the experts' matmul_id on the router's rows. */
typedef struct {
    const float  *x;            /* the float rows it was made from [M][K]       */
    int           M;
    int64_t       K;
    const int8_t *q;            /* [M][K] quants (DSC_SLOT_Q8_ACT)              */
    const float  *d;            /* [M][K / 32] block scales                     */
    uint64_t      seq;          /* ex->n_ops right after the producer's launch  */
} dsc_q8x;

struct ds_exec {
    ds_backend    *be;            /* first: the engine-visible header        */
    cudaStream_t   st;
    cublasHandle_t blas;
    void          *blas_ws;
    void          *slot[DSC_SLOT_COUNT];
    size_t         slot_bytes[DSC_SLOT_COUNT];
    void          *retired[DSC_MAX_RETIRED];   /* buffers a recorded graph may still use */
    int            n_retired;
    /* graphs */
    uint64_t        gkey[DSC_MAX_GRAPHS];
    cudaGraphExec_t gexec[DSC_MAX_GRAPHS];
    int             n_graphs;
    uint64_t        guse[DSC_MAX_GRAPHS];      /* when each was last launched (gclock) */
    uint64_t        gclock;
    int             capturing;                 /* 1: recording for key cap_key     */
    uint64_t        cap_key;
    /* pinned host staging for small uploads / downloads (the ids and
     * positions of every step): filled from pin_off, reset whenever the
     * stream has been synchronised (every copy out of it is done) */
    unsigned char *pinned;
    size_t         pin_off;
    unsigned      *count;         /* device: matmul_res's completion count (0 at rest) */
    unsigned      *chain_sync;    /* device: the head chain's barrier and partials (heads.cu) */
    uint64_t       n_ops;         /* launches, copies and recordings so far (dsc_note) */
    dsc_q8x        q8x;
    unsigned long long q8x_hits;  /* matmuls that used a producer's copy        */
    unsigned long long tile_runs; /* attention calls of several sequences' runs on the tile path */
    /* a started download (download_start): its pinned slice, the caller's
     * buffer, and the event after the copy */
    cudaEvent_t    dl_ev;
    unsigned char *dl_pin;
    void          *dl_dst;
    size_t         dl_bytes;
    int            dl_pending;
    dsc_trace     *trace;         /* NULL unless $DSPARK_CUDA_TRACE=1            */
    int            gnodes[DSC_MAX_GRAPHS];     /* kernels per recorded graph (trace labels) */
    /* the first error since the last sync (sticky) */
    int            err;
    char           errmsg[256];
};

static inline dsc_backend *dsc_be(const ds_exec *ex) { return (dsc_backend *)ex->be->priv; }

/* Record the first error of a launch or API call; later ops keep running on
 * a best-effort basis and sync() reports it. */
void dsc_note(ds_exec *ex, cudaError_t e, const char *what);
void dsc_launched(ds_exec *ex, cudaError_t e, const char *what);
#define DSC_LAUNCHED(ex, what) dsc_launched((ex), cudaGetLastError(), (what))
/* Scratch of at least `bytes` in slot s (NULL + error when out of memory). */
void *dsc_scratch(ds_exec *ex, int s, size_t bytes);
/* The RoPE table for (freq_base, head_dim), built on first use (rope.cu). */
const dsc_rope_table *dsc_rope_get(ds_exec *ex, float freq_base, int head_dim, const ds_rope_yarn *yarn);

/* The Q8_0 weights of one launch (matmul_q8_0.cu, matmul_q8_0_mma.cu): up to
 * 4 sharing K and the quantized input (q/k/v, gate/up: matmul_multi). Row
 * group / tile r belongs to weight i when blk0[i] <= r < blk0[i + 1]; which
 * launch computes a row never changes its chain. */
#define DSC_Q8_MAXW 4
struct dsc_q8_set {
    const int8_t *wq[DSC_Q8_MAXW];
    const float  *wd[DSC_Q8_MAXW];
    float        *y[DSC_Q8_MAXW];
    int64_t       N[DSC_Q8_MAXW];
    unsigned      blk0[DSC_Q8_MAXW + 1];
};

/* dsc_q8x (matmul_q8_0.cu): where a producer of M rows of K writes their
 * Q8_0 copy (q, d), or 0 when none is wanted (no Q8_0-layout weights, K not
 * whole blocks, switched off, out of memory); then, after its launch,
 * publish. */
int dsc_q8x_reserve(ds_exec *ex, int M, int64_t K, int8_t **q, float **d);
void dsc_q8x_publish(ds_exec *ex, const float *x, int M, int64_t K, const int8_t *q, const float *d);

/* ---- programmatic dependent launch ------------------------------------------------
 * A decode step is a chain of short kernels, each waiting for the one before
 * it: at small shapes the gaps between them (launch, ramp-up, drain) are much
 * of the step. dsc_launch starts a kernel with programmatic stream
 * serialization (Hopper): its blocks may be scheduled while the previous
 * kernel still runs, and every such kernel calls dsc_pdl_wait() — which
 * returns once the previous grid has completed and its memory is visible —
 * before it touches anything another kernel writes. Only weights (never
 * written after the upload) may be read before the wait: the Q8_0 and dense
 * GEMVs issue their first weight loads there, which then stream in during
 * the previous kernel's tail. dsc_pdl_trigger() lets the next kernel be
 * scheduled as soon as every block of this one has started. The bits cannot
 * change: every value is still computed from the same completed inputs.
 * Kernels launched the ordinary way wait for full completion, as before;
 * the wait is a no-op in a kernel launched without the attribute. */
__device__ __forceinline__ void dsc_pdl_wait(void) { asm volatile("griddepcontrol.wait;" ::: "memory"); }
__device__ __forceinline__ void dsc_pdl_trigger(void) { asm volatile("griddepcontrol.launch_dependents;" :::); }

/* ---- the KV pool's pages (backend.h ds_rows, kvpool.h) --------------------
 * The kernels take the page size as DS_KV_PAGE (16: shifts, not divisions);
 * the entry points refuse another. Row m's page table, the positions it
 * attends, and where position pos of its sequence is (floats from the
 * layer's page-0 rows; row = floats per position). */
static_assert(DS_KV_PAGE == 16, "the CUDA kernels address pages of 16 positions");
__device__ __forceinline__ const int32_t *dsc_kv_table(const ds_rows &r, int m) {
    return r.tables + (int64_t)(r.seq ? r.seq[m] : 0) * r.max_pages;
}
__device__ __forceinline__ int dsc_kv_nvis(const ds_rows &r, int m) { return r.n_vis ? r.n_vis[m] : r.pos[m] + 1; }
__device__ __forceinline__ int64_t dsc_kv_at(const int32_t *tab, int64_t page_stride, int pos, int64_t row) {
    return (int64_t)__ldg(tab + (pos >> 4)) * page_stride + (int64_t)(pos & 15) * row;
}

template <typename... KArgs, typename... Args>
static inline void dsc_launch(ds_exec *ex, const char *what, void (*kernel)(KArgs...), dim3 grid, dim3 block,
                              size_t smem, Args... args) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = ex->st;
    cudaLaunchAttribute at[1];
    at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    at[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = at;
    cfg.numAttrs = (dsc_be(ex)->off & DSC_OFF_PDL) ? 0 : 1;
    dsc_launched(ex, cudaLaunchKernelEx(&cfg, kernel, ((KArgs)args)...), what);
}

/* ---- tensor-core and async-copy wrappers (matmul_q8_0_mma.cu, matmul_kq.cu) ---------- */
__device__ __forceinline__ unsigned qm_smem_addr(const void *p) {
    return (unsigned)__cvta_generic_to_shared(p);
}
/* 16 bytes global -> shared, asynchronously; bytes = 0 zero-fills (src is
 * still a valid address) */
__device__ __forceinline__ void qm_cp16(void *dst, const void *src, int bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(qm_smem_addr(dst)), "l"(src), "r"(bytes)
                 : "memory");
}
__device__ __forceinline__ void qm_cp4(void *dst, const void *src, int bytes) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;" ::"r"(qm_smem_addr(dst)), "l"(src), "r"(bytes)
                 : "memory");
}
__device__ __forceinline__ void qm_commit(void) { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void qm_wait(void) { asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory"); }

__device__ __forceinline__ void qm_ldsm4(unsigned addr, uint32_t &r0, uint32_t &r1, uint32_t &r2, uint32_t &r3) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
                 : "r"(addr));
}
/* d = C + A x B over one 32-byte block, s8 x s8 -> s32 (exact integers) */
__device__ __forceinline__ void qm_mma(int32_t d[4], const uint32_t a[4], uint32_t b0, uint32_t b1, int32_t c) {
    asm volatile("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
                 "{%10, %11, %12, %13};"
                 : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1), "r"(c), "r"(c), "r"(c), "r"(c));
}
/* d = C + A x B over 16 bytes of k, s8 x s8 -> s32 (m16n8k16; exact integers):
 * A {row g, row g + 8} bytes 4t..4t+3, B bytes 4t..4t+3 of column g */
__device__ __forceinline__ void qm_mma16(int32_t d[4], uint32_t a0, uint32_t a1, uint32_t b0, const int32_t c[4]) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.s32.s8.s8.s32 {%0, %1, %2, %3}, {%4, %5}, {%6}, {%7, %8, %9, %10};"
                 : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3])
                 : "r"(a0), "r"(a1), "r"(b0), "r"(c[0]), "r"(c[1]), "r"(c[2]), "r"(c[3]));
}
/* d = C + A x B over 32 bytes of k with an accumulator of four values */
__device__ __forceinline__ void qm_mma_acc(int32_t d[4], const uint32_t a[4], uint32_t b0, uint32_t b1, const int32_t c[4]) {
    asm volatile("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
                 "{%10, %11, %12, %13};"
                 : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1), "r"(c[0]), "r"(c[1]), "r"(c[2]), "r"(c[3]));
}

/* ---- exact conversions (the same formulas as common.h) ---------------------------- */
__device__ __forceinline__ float dsc_fp16_to_f32(uint32_t h) {
    const uint32_t sign = (h & 0x8000u) << 16, em = h & 0x7fffu;
    if (em >= 0x7c00u) return __uint_as_float(sign | 0x7f800000u | ((em & 0x3ffu) << 13));
    if (em < 0x0400u) {                                   /* zero / subnormal: man * 2^-24 */
        const float v = __fmul_rn((float)em, 5.9604644775390625e-08f);
        return sign ? -v : v;
    }
    return __uint_as_float(sign | ((em + 0x1c000u) << 13));   /* rebias 15 -> 127 */
}
__device__ __forceinline__ float dsc_bf16_to_f32(uint32_t h) { return __uint_as_float(h << 16); }
__device__ __forceinline__ uint16_t dsc_f32_to_fp16(float f) {
    const uint32_t x = __float_as_uint(f), sign = (x >> 16) & 0x8000u, ax = x & 0x7fffffffu;
    if (ax >= 0x7f800000u) return (uint16_t)(sign | 0x7c00u | (ax > 0x7f800000u ? 0x200u : 0u));
    if (ax >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u);
    if (ax < 0x38800000u) {
        if (ax < 0x33000000u) return (uint16_t)sign;
        const uint32_t e = ax >> 23, m = (ax & 0x7fffffu) | 0x800000u, shift = 126 - e;
        uint32_t q = m >> shift;
        const uint32_t rem = m & ((1u << shift) - 1), half = 1u << (shift - 1);
        if (rem > half || (rem == half && (q & 1))) q++;
        return (uint16_t)(sign | q);
    }
    const uint32_t e = (ax >> 23) - 112, m = ax & 0x7fffffu;
    uint32_t q = (e << 10) | (m >> 13);
    const uint32_t rem = m & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (q & 1))) q++;
    return (uint16_t)(sign | q);
}

/* Q8_0 quantization of one 32-element activation block (ds_quantize_row_q8_0
 * scalar form), the C loop literally: the 32 int8 quants to dst
 * (two 16-byte stores), the block scale returned as f32 (the fp16 value,
 * exact). */
__device__ __forceinline__ float dsc_q8_block(const float *xb, uint4 *dst) {
    float amax = 0.0f;
    for (int j = 0; j < 32; j++) {
        const float v = fabsf(xb[j]);
        amax = amax > v ? amax : v;
    }
    const float d = __fdiv_rn(amax, 127.0f);
    const float id = d != 0.0f ? __fdiv_rn(1.0f, d) : 0.0f;
    const uint16_t d16 = dsc_f32_to_fp16(d);
    uint32_t packed[8];
#pragma unroll
    for (int w = 0; w < 8; w++) {
        uint32_t word = 0;
#pragma unroll
        for (int k = 0; k < 4; k++) {
            float v = __fmul_rn(xb[4 * w + k], id);
            v = v != v ? 0.0f : v > 127.0f ? 127.0f : v < -128.0f ? -128.0f : v;
            const int32_t t = __float2int_rz(v);
            const float r = __fsub_rn(v, (float)t);
            const int32_t qv = t + (r >= 0.5f) - (r <= -0.5f);
            word |= (uint32_t)(qv & 0xff) << (8 * k);
        }
        packed[w] = word;
    }
    dst[0] = make_uint4(packed[0], packed[1], packed[2], packed[3]);
    dst[1] = make_uint4(packed[4], packed[5], packed[6], packed[7]);
    return dsc_fp16_to_f32(d16);
}

/* The same block quantized by a warp, lane j holding element j: the same
 * operations per element as dsc_q8_block. Only the block's absolute
 * maximum is found in parallel, and it must equal the scalar fold
 * amax = amax > v ? amax : v from +0 — which is the plain maximum, except
 * that a NaN makes the fold restart: it ends on v31 when v31 is NaN, else
 * it is the maximum of the elements after the last NaN. Lane j writes
 * dst[j]; every lane gets the block scale (the fp16 value as f32). */
__device__ __forceinline__ float dsc_q8_block_warp(float x, int lane, int8_t *dst) {
    const float a = fabsf(x);
    const unsigned nan = __ballot_sync(0xffffffffu, a != a);
    float amax;
    if (nan >> 31) {
        amax = __shfl_sync(0xffffffffu, a, 31);
    } else {
        const int last = nan ? 31 - __clz(nan) : -1;
        amax = lane > last ? a : 0.0f;
#pragma unroll
        for (int o = 16; o >= 1; o /= 2) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    }
    const float d = __fdiv_rn(amax, 127.0f);
    const float id = d != 0.0f ? __fdiv_rn(1.0f, d) : 0.0f;
    float v = __fmul_rn(x, id);
    v = v != v ? 0.0f : v > 127.0f ? 127.0f : v < -128.0f ? -128.0f : v;
    const int32_t t = __float2int_rz(v);
    const float r = __fsub_rn(v, (float)t);
    dst[lane] = (int8_t)(t + (r >= 0.5f) - (r <= -0.5f));
    return dsc_fp16_to_f32(dsc_f32_to_fp16(d));
}

/* SwiGLU's canonical element (swiglu.cu): silu(g) * u with one IEEE
 * division, the project-owned exp and one product. */
__device__ __forceinline__ float dsc_swiglu_canonical(float g, float u) {
    const float silu = __fdiv_rn(g, __fadd_rn(1.0f, ds_expf(-g)));
    return __fmul_rn(silu, u);
}

/* The exact int32 dot of two 32-byte int8 blocks (two 16-byte words each):
 * integers, so the order of the dp4a steps cannot matter. */
/* a lane's uint4 from lane src (every lane of the warp must call it) */
__device__ __forceinline__ uint4 dsc_shfl_u4(uint4 v, int src) {
    return make_uint4(__shfl_sync(0xffffffffu, v.x, src), __shfl_sync(0xffffffffu, v.y, src),
                      __shfl_sync(0xffffffffu, v.z, src), __shfl_sync(0xffffffffu, v.w, src));
}

__device__ __forceinline__ int dsc_dot_q8(uint4 w0, uint4 w1, uint4 x0, uint4 x1) {
    int D = 0;
    D = __dp4a((int)w0.x, (int)x0.x, D);
    D = __dp4a((int)w0.y, (int)x0.y, D);
    D = __dp4a((int)w0.z, (int)x0.z, D);
    D = __dp4a((int)w0.w, (int)x0.w, D);
    D = __dp4a((int)w1.x, (int)x1.x, D);
    D = __dp4a((int)w1.y, (int)x1.y, D);
    D = __dp4a((int)w1.z, (int)x1.z, D);
    D = __dp4a((int)w1.w, (int)x1.w, D);
    return D;
}

/* Element k of row id of a lookup table (embed): exact conversions; Q8_0 is
 * d * q, one rounding-free product. */
__device__ __forceinline__ float dsc_embed_elem(uint32_t type, const void *data, const float *scale,
                                               int64_t n_in, int64_t id, int64_t k) {
    switch (type) {
    case DS_TYPE_F32: return ((const float *)data)[id * n_in + k];
    case DS_TYPE_F16: return dsc_fp16_to_f32(((const unsigned short *)data)[id * n_in + k]);
    case DS_TYPE_BF16: return dsc_bf16_to_f32(((const unsigned short *)data)[id * n_in + k]);
    default: return __fmul_rn(scale[id * (n_in / 32) + k / 32], (float)((const int8_t *)data)[id * n_in + k]);
    }
}

/* argmax's combine: the larger value, on equal values the lower index (the
 * left-to-right scan's answer in any order); bi < 0 means none yet. */
__device__ __forceinline__ void dsc_arg_pick(float &bv, int64_t &bi, float v, int64_t i) {
    if (i < 0) return;
    if (bi < 0 || v > bv || (v == bv && i < bi)) { bv = v; bi = i; }
}

/* Hopper: ask L2 to fetch [p, p + bytes) ahead of the loads (bytes: a
 * multiple of 16, p 16-byte aligned). A hint: no result, no ordering. */
__device__ __forceinline__ void dsc_prefetch_l2(const void *p, uint32_t bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    if (bytes) asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(p), "r"(bytes) : "memory");
#else
    (void)p; (void)bytes;
#endif
}

/* The canonical RMSNorm scale of one row (n floats at xr), computed by the 32
 * lanes of one warp, all of which get it: lanes 0..15 are the 16 lanes of the
 * CPU's ds_sumsq16 (element i in lane i mod 16, the n % 16 tail in its own
 * lanes, acc = acc + x*x rounded twice), the tree 8-4-2-1 through shuffles,
 * then mean = sum / n and 1 / sqrt(mean + eps), IEEE division and square
 * root. rmsnorm.cu's kernels and the fused QK-norm (rope.cu) share it. */
__device__ __forceinline__ float dsc_rms_scale_canonical(const float *xr, int n, float eps, int lane) {
    float a = 0.0f;
    if (lane < 16) {
        int i = 0;
#pragma unroll 8
        for (; i + 16 <= n; i += 16) {
            const float v = xr[i + lane];
            a = __fadd_rn(a, __fmul_rn(v, v));
        }
        if (i + lane < n) {
            const float v = xr[i + lane];
            a = __fadd_rn(a, __fmul_rn(v, v));
        }
    }
#pragma unroll
    for (int s = 8; s >= 1; s /= 2) a = __fadd_rn(a, __shfl_down_sync(0xffffffffu, a, s, 16));
    const float sum = __shfl_sync(0xffffffffu, a, 0);
    const float mean = __fdiv_rn(sum, (float)n);
    return __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(mean, eps)));
}

static inline unsigned dsc_blocks(int64_t n, int per) { return (unsigned)((n + per - 1) / per); }

/* ---- the families (src/kernels/cuda/<family>.cu) ------------------------------------ */
void dsc_matmul(ds_exec *ex, ds_variant v, const ds_weight *W, int M, const float *x, float *y);
void dsc_matmul_dense(ds_exec *ex, ds_variant v, const dsc_weight *w, int M, const float *x, float *y);
void dsc_matmul_q8_0(ds_exec *ex, ds_variant v, const dsc_weight *w, int M, const float *x, float *y);
cudaError_t dsc_matmul_q8_0_init(void);
/* matmul_q8_0_mma.cu: Q8_0 canonical on the tensor cores (the same bits as
 * the GEMV for every M). dsc_q8_mma_bm: the tile height it would use for
 * these weights and M, 0 = run the GEMV; dsc_q8_mma: launch it on the
 * quantized rows. */
int dsc_q8_mma_bm(ds_exec *ex, int n, const dsc_weight *const w[], int M);
void dsc_q8_mma(ds_exec *ex, int bm, int n, const dsc_weight *const w[], int M, const int8_t *xq,
                const float *xd, float *const y[]);
/* ... and the warp-streamed tensor-core GEMV for M <= 16 (decode, verify, small batches) */
int dsc_q8_stream_ok(ds_exec *ex, int n, const dsc_weight *const w[], int M);
void dsc_q8_stream(ds_exec *ex, int n, const dsc_weight *const w[], int M, const int8_t *xq, const float *xd,
                   float *const y[]);
cudaError_t dsc_q8_mma_init(void);
cudaError_t dsc_matmul_dense_init(void);
int dsc_matmul_q8_0_fused(ds_exec *ex, const dsc_weight *w, int M, const float *x, const float *up,
                          float *h, float *y, float *res, const float *nw, float eps, float *xn);
int dsc_matmul_res(ds_exec *ex, const ds_matmul_res *a);
int dsc_swiglu_matmul(ds_exec *ex, ds_variant vsw, ds_variant vmm, const ds_weight *W, int M,
                      const float *gate, const float *up, float *h, float *y);
int dsc_matmul_q8_0_multi(ds_exec *ex, ds_variant v, int n, const dsc_weight *const w[], int M,
                          const float *x, float *const y[]);
void dsc_matmul_multi(ds_exec *ex, ds_variant v, int n, const ds_weight *const W[], int M,
                      const float *x, float *const y[]);
void dsc_qk_norm_rope_kv(ds_exec *ex, int M, int n_head, int n_head_kv, int head_dim,
                         const ds_rows *r, float freq_base, ds_rope_mode mode, const float *q_norm,
                         const float *k_norm, float eps, float *q, float *k, const float *v,
                         float *kc, float *vc);
/* matmul_kq.cu: the kquant types on the GPU (Q4_K, Q5_K, Q6_K; Q4_0 and Q5_0 in
 * the Q8_0 layout). dsc_kq_supported: 1 if prepare_weight may upload type t;
 * dsc_kq_upload: allocates d->data / d->scale and fills them (the caller frees
 * both on failure); dsc_embed_kq: embedding rows of such a weight. */
int dsc_kq_supported(uint32_t t);
cudaError_t dsc_kq_upload(const ds_weight *w, dsc_weight *d);
void dsc_matmul_kq(ds_exec *ex, ds_variant v, const dsc_weight *w, int M, const float *x, float *y);
void dsc_embed_kq(ds_exec *ex, const dsc_weight *w, int M, const int32_t *ids, float *out);
cudaError_t dsc_kq_mma_init(void);     /* the K types' tensor-core batches: shared memory limits */
void dsc_attention(ds_exec *ex, ds_variant v, const ds_attn_shape *s, int M, const ds_rows *r,
                   const float *q, const float *kc, const float *vc, float *out);
cudaError_t dsc_attention_init(void);  /* the split-KV kernel's shared memory limit */
void dsc_rmsnorm(ds_exec *ex, ds_variant v, int rows, int n, const float *x, const float *w,
                 float eps, float *y);
void dsc_rope(ds_exec *ex, ds_variant v, int rows, int n_heads, int head_dim, const int *pos,
              float freq_base, ds_rope_mode mode, float *x);
void dsc_rope_ext(ds_exec *ex, ds_variant v, int rows, int n_heads, int head_dim, const int *pos,
                  float freq_base, ds_rope_mode mode, const ds_rope_yarn *yarn, float *x);
void dsc_swiglu(ds_exec *ex, ds_variant v, int rows, int n, const float *gate, const float *up,
                float *out);
int dsc_rmsnorm_staged(ds_exec *ex, int rows, int n, float *x, const float *add, const float *w,
                       float eps, float *y);
void dsc_residual(ds_exec *ex, ds_variant vres, ds_variant vnorm, int rows, int n, float *x,
                  const float *y, const float *w, float eps, float *xnorm);
void dsc_argmax(ds_exec *ex, int rows, int64_t n, const float *x, int32_t *out);
void dsc_embed(ds_exec *ex, const ds_weight *E, int M, const int32_t *ids, float *out);
void dsc_sanitize(ds_exec *ex, int rows, int64_t n, const float *src, float *dst, float lim);
void dsc_kv_write(ds_exec *ex, float *kc, float *vc, int row, int M, const ds_rows *r,
                  const float *k, const float *v);
/* moe.cu: the mixture of experts (backend.h moe_route / moe_combine / moe_gather) */
void dsc_moe_route(ds_exec *ex, ds_variant v, int M, int n_expert, int k, int norm, const float *logits,
                   int32_t *ids, float *w);
void dsc_moe_combine(ds_exec *ex, int M, int k, int n, const int32_t *slot, const float *w, const float *y,
                     const float *sh_gate, const float *sh, float *out);
void dsc_moe_gather(ds_exec *ex, int M, int k, int n, const int32_t *slot, const float *x, float *X);
/* ... and the experts by id (backend.h moe_id_prepare / matmul_id): moe.cu
 * checks and dispatches, the kernels are the family files' decode GEMVs */
int dsc_moe_id_prepare(ds_backend *be, ds_weight *W, int n_exp, char *err, size_t errlen);
void dsc_matmul_id(ds_exec *ex, int n, const ds_weight *const W[], int n_exp, int A, const int32_t *ids, int xk,
                   const float *x, float *const y[]);
void dsc_matmul_id_q8_0(ds_exec *ex, int n, const dsc_weight *const w0[], int n_exp, int A, const int32_t *ids, int xk,
                        const float *x, float *const y[]);
void dsc_matmul_id_dense(ds_exec *ex, const dsc_weight *w0, int n_exp, int A, const int32_t *ids, int xk,
                         const float *x, float *y);

#endif
