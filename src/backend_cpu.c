/* backend_cpu.c — the CPU implementation of the backend table: today's
 * kernels (src/kernels/cpu/) on host memory, a thread pool per execution
 * context. Buffers are host memory, so upload/download/copy are memcpy and
 * the engine's device pointers are plain pointers. */
#include "backend.h"
#include "kernels/dsmath.h"

#include <math.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

typedef struct {
    ds_exec  base;                /* first member: the engine sees ds_exec   */
    ds_pool *pool;
    /* canonical RoPE's cos/sin per position (ds_rope_cached), made by
     * reserve for n_pos positions of up to rope_hd_max; claimed by the first
     * (freq_base, head_dim, scaling) that uses it, others compute directly */
    float         *rope_tab;
    unsigned char *rope_done;
    int64_t        rope_npos;
    int            rope_hd_max, rope_hd, rope_claimed, rope_scaled;
    float          rope_base;
    ds_rope_yarn   rope_yarn;     /* the claimant's scaling (rope_scaled) */
} cpu_exec;

static ds_pool *pool_of(ds_exec *ex) { return ((cpu_exec *)ex)->pool; }

ds_pool *ds_exec_cpu_pool(ds_exec *ex) {
    return ex && ex->be->i->host_memory && !strcmp(ex->be->i->name, "cpu") ? pool_of(ex) : NULL;
}

/* ---- lifetime, execution contexts, buffers ----------------------------- */

static void cpu_destroy(ds_backend *be) { free(be); }
static void cpu_describe(ds_backend *be, char *buf, size_t n) {
    snprintf(buf, n, "simd=%s", ds_simd_path());
}

static ds_exec *cpu_exec_new(ds_backend *be, int n_threads, char *err, size_t errlen) {
    if (n_threads < 1 || n_threads > 256) {
        ds_errf(err, errlen, "cpu: -t %d is out of range (1..256)", n_threads);
        return NULL;
    }
    cpu_exec *x = calloc(1, sizeof *x);
    if (!x || !(x->pool = ds_pool_new(n_threads))) {
        free(x);
        ds_errf(err, errlen, "cpu: out of memory for %d threads", n_threads);
        return NULL;
    }
    x->base.be = be;
    return &x->base;
}

static void cpu_exec_free(ds_exec *ex) {
    if (!ex) return;
    ds_pool_free(pool_of(ex));
    free(((cpu_exec *)ex)->rope_tab);
    free(((cpu_exec *)ex)->rope_done);
    free(ex);
}

static int cpu_sync(ds_exec *ex, char *err, size_t errlen) { return 0; }

static void *cpu_alloc(ds_backend *be, size_t bytes) {
    if (bytes > SIZE_MAX - 63) return NULL;
    void *p = aligned_alloc(64, (bytes + 63) & ~(size_t)63);
    if (p) memset(p, 0, bytes);
    return p;
}
static void cpu_release(ds_backend *be, void *p) { free(p); }
/* The KV pool: an anonymous mapping, committed page by page as it is first
 * written (no zeroing pass, no resident memory for positions never used). */
static void *cpu_alloc_pool(ds_backend *be, size_t bytes) {
    if (!bytes) return NULL;
    void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    return p == MAP_FAILED ? NULL : p;
}
static void cpu_release_pool(ds_backend *be, void *p, size_t bytes) { if (p) munmap(p, bytes); }
static void cpu_memcpy(ds_exec *ex, void *dst, const void *src, size_t bytes) {
    if (dst != src && bytes) memcpy(dst, src, bytes);
}

/* ---- weights: matmul weights pre-packed for the level's tile (ds_weight_pack) ---- */

/* Pack in place of, not beside, the original: once a weight is packed
 * nothing in the forward reads its original bytes (the matmuls read the
 * packed tiles, the embedding lookup of a tied head reads them too:
 * cpu_embed), so its pages are handed back to the kernel. MADV_PAGEOUT
 * keeps the contents either way (a file-backed mapping re-reads them from
 * the file, anonymous memory is swapped), so a later reader (a tool, a
 * non-VNNI path) still sees the same bytes; it only costs a page fault.
 * Only whole pages inside [p, p + bytes); failures are ignored (RSS only). */
static void release_original(const void *p, size_t bytes) {
#ifdef MADV_PAGEOUT
    const uintptr_t pg = (uintptr_t)sysconf(_SC_PAGESIZE);
    uintptr_t a = ((uintptr_t)p + pg - 1) & ~(pg - 1), e = ((uintptr_t)p + bytes) & ~(pg - 1);
    if (pg > 1 && e > a) (void)madvise((void *)a, e - a, MADV_PAGEOUT);
#else
    (void)p; (void)bytes;
#endif
}

static int cpu_prepare_weight(ds_backend *be, ds_weight *w, int use, char *err, size_t errlen) {
    w->extra = NULL;
    if (!(use & DS_USE_MATMUL)) return 0;
    const size_t b = ds_weight_pack_bytes(w);
    if (!b) return 0;                         /* no packed layout for it here */
    /* A weight of 2 MiB and more on transparent huge pages: decode streams
     * it from memory once per token, and the hardware prefetchers stop at
     * every 4 KiB page boundary (and each page costs a TLB walk). */
    /* Only the whole huge pages inside the weight are advised, so a weight a
     * little over 2 MiB does not commit a mostly empty huge page. */
    const size_t huge = (size_t)2 << 20;
    void *p = NULL;
    if (posix_memalign(&p, b >= huge ? huge : 64, (b + 63) & ~(size_t)63)) p = NULL;
    if (!p) { ds_errf(err, errlen, "cpu: out of memory packing weights (%zu bytes)", b); return -1; }
#ifdef MADV_HUGEPAGE
    if (b >= huge) (void)madvise(p, b & ~(huge - 1), MADV_HUGEPAGE);   /* a hint: failure is harmless */
#endif
    if (ds_weight_pack(w, p)) { free(p); return 0; }
    w->extra = p;
    int ok;
    release_original(w->data, (size_t)w->n_out * (size_t)ds_row_bytes(w->type, (uint64_t)w->n_in, &ok));
    return 0;
}
static void cpu_release_weight(ds_backend *be, ds_weight *w) {
    free((void *)w->extra);
    w->extra = NULL;
}

/* ---- families ------------------------------------------------------------ */

static void cpu_matmul(ds_exec *ex, ds_variant v, const ds_weight *W, int M, const float *x, float *y) {
    ds_matmul(v, W, M, x, y, pool_of(ex));
}
static void cpu_matmul_multi(ds_exec *ex, ds_variant v, int n, const ds_weight *const W[], int M,
                             const float *x, float *const y[]) {
    ds_matmul_multi(v, n, W, M, x, y, pool_of(ex));
}
static void cpu_attention(ds_exec *ex, ds_variant v, const ds_attn_shape *s, int M, const ds_rows *r,
                          const float *q, const float *kc, const float *vc, float *out) {
    const ds_attn_rows ar = { r->n_vis, r->pos, r->seq, r->tables, r->max_pages, r->page, r->page_stride };
    ds_attention_rows(v, s, M, &ar, q, kc, vc, out, pool_of(ex));
}
static void cpu_rmsnorm(ds_exec *ex, ds_variant v, int rows, int n, const float *x, const float *w,
                        float eps, float *y) {
    ds_rmsnorm(v, rows, n, x, w, eps, y, pool_of(ex));
}
/* Whether (freq_base, head_dim, scaling) owns the RoPE table: the first
 * caller claims it; the key compares the values' bits (and the factors'
 * address: one model's tensor), so a table is never reused across scalings. */
static int cpu_rope_table(cpu_exec *c, int head_dim, float freq_base, const ds_rope_yarn *y) {
    if (!c->rope_tab || head_dim > c->rope_hd_max) return 0;
    if (!c->rope_claimed) {
        c->rope_claimed = 1;
        c->rope_hd = head_dim;
        c->rope_base = freq_base;
        c->rope_scaled = y != NULL;
        if (y) c->rope_yarn = *y;
    }
    if (c->rope_hd != head_dim || memcmp(&c->rope_base, &freq_base, sizeof freq_base) || c->rope_scaled != (y != NULL))
        return 0;
    if (!y) return 1;
    const ds_rope_yarn *o = &c->rope_yarn;
    return !memcmp(&o->freq_scale, &y->freq_scale, sizeof(float)) && !memcmp(&o->ext_factor, &y->ext_factor, sizeof(float)) &&
           !memcmp(&o->lo, &y->lo, sizeof(float)) && !memcmp(&o->hi, &y->hi, sizeof(float)) &&
           !memcmp(&o->mscale, &y->mscale, sizeof(float)) && o->freq_factors == y->freq_factors;
}

static void cpu_rope_ext(ds_exec *ex, ds_variant v, int rows, int n_heads, int head_dim, const int *pos,
                         float freq_base, ds_rope_mode mode, const ds_rope_yarn *yarn, float *x) {
    cpu_exec *c = (cpu_exec *)ex;
    if (v != DS_FAST && cpu_rope_table(c, head_dim, freq_base, yarn)) {
        ds_rope_cached_ext(rows, n_heads, head_dim, pos, freq_base, mode, yarn, x, c->rope_tab, c->rope_done,
                           c->rope_npos, c->pool);
        return;
    }
    ds_rope_ext(v, rows, n_heads, head_dim, pos, freq_base, mode, yarn, x, c->pool);
}

static void cpu_rope(ds_exec *ex, ds_variant v, int rows, int n_heads, int head_dim, const int *pos,
                     float freq_base, ds_rope_mode mode, float *x) {
    cpu_rope_ext(ex, v, rows, n_heads, head_dim, pos, freq_base, mode, NULL, x);
}
static void cpu_swiglu(ds_exec *ex, ds_variant v, int rows, int n, const float *gate, const float *up,
                       float *out) {
    ds_swiglu(v, rows, n, gate, up, out, pool_of(ex));
}
static void cpu_residual(ds_exec *ex, ds_variant vres, ds_variant vnorm, int rows, int n, float *x,
                         const float *y, const float *w, float eps, float *xnorm) {
    ds_residual(vres, vnorm, rows, n, x, y, w, eps, xnorm, pool_of(ex));
}
static void cpu_kv_write(ds_exec *ex, float *kc, float *vc, int row, int M, const ds_rows *r,
                         const float *k, const float *v) {
    /* row by row at its position; consecutive positions of one page in one copy */
    for (int m = 0; m < M;) {
        const int seq = r->seq ? r->seq[m] : 0, p0 = r->pos[m];
        int n = 1;
        while (m + n < M && r->pos[m + n] == p0 + n && (p0 + n) % r->page && (r->seq ? r->seq[m + n] : 0) == seq) n++;
        const int64_t at = ds_rows_at(r, r->tables, seq, p0, row);
        memcpy(kc + at, k + (size_t)m * row, (size_t)n * row * sizeof(float));
        memcpy(vc + at, v + (size_t)m * row, (size_t)n * row * sizeof(float));
        m += n;
    }
}

/* ---- lookups and small ops ---------------------------------------------- */

static void cpu_embed(ds_exec *ex, const ds_weight *E, int M, const int32_t *ids, float *out) {
    if (ds_weight_is_packed(E)) {   /* packed (tied head): read the tiles */
        for (int r = 0; r < M; r++) ds_weight_packed_row(E, ids[r], out + (size_t)r * E->n_in);
        return;
    }
    int ok;
    const size_t rb = (size_t)ds_row_bytes(E->type, (uint64_t)E->n_in, &ok);   /* validated at load */
    for (int r = 0; r < M; r++)
        ds_row_to_f32(E->type, (const uint8_t *)E->data + (size_t)ids[r] * rb, E->n_in,
                      out + (size_t)r * E->n_in);
}
static void cpu_argmax(ds_exec *ex, int rows, int64_t n, const float *x, int32_t *out) {
    for (int r = 0; r < rows; r++) out[r] = (int32_t)ds_argmax(x + (size_t)r * n, n);
}
static void cpu_sanitize(ds_exec *ex, int rows, int64_t n, const float *src, float *dst, float lim) {
    const int64_t total = (int64_t)rows * n;
    for (int64_t i = 0; i < total; i++) {
        float v = src[i];
        if (v != v) v = 0.0f;
        else if (v > lim) v = lim;
        else if (v < -lim) v = -lim;
        dst[i] = v;
    }
}

/* ---- scratch: the pool's per-thread and shared regions (kernels.h) ------- */
static int cpu_reserve(ds_exec *ex, int m_max, int64_t k_max, int hd_max, int64_t n_pos, char *err,
                       size_t errlen) {
    const size_t thr = ds_kernels_thread_scratch(k_max, hd_max, n_pos);
    const size_t shared = ds_kernels_shared_scratch(m_max, k_max);
    if (ds_pool_reserve(pool_of(ex), thr, shared)) {
        ds_errf(err, errlen, "cpu: out of memory reserving kernel scratch (%zu bytes per thread, %zu shared)",
                thr, shared);
        return -1;
    }
    /* the RoPE table: grow-only like the scratch (a larger reservation
     * starts it again; filled rows are only a cache) */
    cpu_exec *c = (cpu_exec *)ex;
    if (hd_max >= 2 && n_pos > 0 && n_pos <= (1 << 24) && (n_pos > c->rope_npos || hd_max > c->rope_hd_max)) {
        const int64_t np = n_pos > c->rope_npos ? n_pos : c->rope_npos;
        const int hm = hd_max > c->rope_hd_max ? hd_max : c->rope_hd_max;
        float *tab = malloc((size_t)np * (size_t)hm * sizeof *tab);
        unsigned char *done = calloc((size_t)np, 1);
        if (!tab || !done) {
            free(tab);
            free(done);
            return 0;                               /* optional: RoPE computes directly */
        }
        free(c->rope_tab);
        free(c->rope_done);
        c->rope_tab = tab;
        c->rope_done = done;
        c->rope_npos = np;
        c->rope_hd_max = hm;
        c->rope_claimed = 0;
    }
    return 0;
}

/* ---- the drafter's heads and token selection ------------------------------
 * These are the host loops drafter_forward.c ran before the heads moved
 * behind the table, expression for expression (-ffp-contract=off keeps every
 * product and sum separately rounded). The gates' sigmoid and tanh are the
 * project-owned ds_sigmoidf / ds_tanhf (kernels/dsmath.h), the same functions
 * the CUDA heads call, so a drafter's gates give the same bits on every host
 * and device (they were libm's expf / tanhf until issue 22's item 6). */

static void cpu_add(ds_exec *ex, int64_t n, const float *a, const float *b, float *y) {
    for (int64_t i = 0; i < n; i++) y[i] = a[i] + b[i];
}
static void cpu_fill(ds_exec *ex, int64_t n, float *x, float v) {
    for (int64_t i = 0; i < n; i++) x[i] = v;
}
static void cpu_gate(ds_exec *ex, ds_gate_kind kind, int n, const float *a, const float *b, const float *e,
                     float *s, float *y) {
    switch (kind) {
    case DS_GATE_SIGMOID:
        for (int j = 0; j < n; j++) y[j] = ds_sigmoidf(a[j] + b[j]);
        break;
    case DS_GATE_SIGMOID_MUL:
        for (int j = 0; j < n; j++) y[j] = ds_sigmoidf(a[j] + b[j]) * e[j];
        break;
    case DS_GATE_RNN:
        for (int j = 0; j < n; j++) {
            float g = ds_sigmoidf(a[j] + b[j]);
            float c = ds_tanhf(a[n + j] + b[n + j]);
            s[j] = g * s[j] + (1.0f - g) * c;
            y[j] = ds_tanhf(a[2 * n + j] + b[2 * n + j]);
        }
        break;
    }
}
/* The sampler itself (sampler.c): the host and the CPU "device" are one. */
static int cpu_sample(ds_exec *ex, const ds_sampler *smp, int rows, int n, const float *x, int64_t pos0,
                      float *scratch, int32_t *out) {
    for (int r = 0; r < rows; r++) {
        int32_t t = ds_sample(smp, x + (size_t)r * n, n, pos0 + r, scratch);
        out[r] = t >= 0 ? t : (int32_t)ds_argmax(x + (size_t)r * n, n);   /* t < 0 only without scratch */
    }
    return 0;
}

/* ---- the drafter's head chain (backend.h: ds_draft_chain) ----------------
 * Per slot the engine's ops run one after the other on the calling thread:
 * W2 e over the whole vocabulary (K = rank: the matmul's small-K rule keeps
 * it off the workers), the bias add, the mask, the argmax — a quarter of a
 * drafting round on two threads, with the worker idle. Here W2 e is one
 * ds_matmul_epi job per slot and its epilogue does the rest for the
 * thread's own columns while they are hot: z += bias, the mask, and the
 * argmax of the range; the ranges' winners are then combined in column
 * order. Same bits: W2 e is ds_matmul's (canonical) output, the add is
 * cpu_add's z + bias per element, and the combined winner is ds_argmax's —
 * the scan keeps the first element numerically equal to the maximum of the
 * non-NaN values, and so does "the first range whose winner is strictly
 * larger than every earlier range's" when each range's winner is its own
 * first such element (ds_argmax of the range; a range of NaNs has none). */
#define CPU_CHAIN_MAX_CHUNKS 256             /* = cpu_exec_new's thread limit */
typedef struct {
    float *z;
    const float *bias;
    int32_t mask_id;
    float mask_logit;
    int64_t best[CPU_CHAIN_MAX_CHUNKS];      /* -1: no range / all NaN      */
    float best_v[CPU_CHAIN_MAX_CHUNKS];
} chain_slot;

static void chain_epi(void *arg, int64_t n0, int64_t n1, int chunk) {
    chain_slot *c = arg;
    float *z = c->z;
    for (int64_t i = n0; i < n1; i++) z[i] = z[i] + c->bias[i];
    if (c->mask_id >= n0 && c->mask_id < n1) z[c->mask_id] = c->mask_logit;
    const int64_t i = n0 + ds_argmax(z + n0, n1 - n0);
    c->best[chunk] = z[i] == z[i] ? i : -1;  /* ds_argmax gives 0 for all-NaN */
    c->best_v[chunk] = z[i];
}

static int cpu_draft_chain(ds_exec *ex, const ds_draft_chain *c) {
    const int r = c->w2 ? (int)c->w2->n_in : 0;
    if (c->n_seq > 1) return 1;              /* one sequence per call: the engine loops */
    if (!c->bias || !c->in || (!c->w1) != (!c->w2) || (c->w2 && (c->w2->n_out != c->V || c->w1->n_in != r)))
        return 1;
    ds_pool *pool = pool_of(ex);
    chain_slot st = {.bias = c->bias, .mask_id = c->mask_id, .mask_logit = c->mask_logit};
    float *e = c->in + c->D;                 /* in = [h_k; e]: e lands in place */
    const size_t sd = c->stride > 1 ? (size_t)c->stride : 1;
    for (int k = 0; k < c->n_keep; k++) {
        const float *hk = c->h + (size_t)k * sd * c->D;
        st.z = c->z + (size_t)k * sd * c->V;
        int32_t tok;
        if (c->w2) {
            cpu_embed(ex, c->w1, 1, c->toks + (size_t)k * sd, e);
            for (int t = 0; t < CPU_CHAIN_MAX_CHUNKS; t++) st.best[t] = -1;
            ds_matmul_epi(DS_CANONICAL, c->w2, 1, e, c->bias, pool, chain_epi, &st);
            int64_t b = -1;
            float bv = 0.0f;
            for (int t = 0; t < CPU_CHAIN_MAX_CHUNKS; t++)
                if (st.best[t] >= 0 && (b < 0 || st.best_v[t] > bv)) {
                    b = st.best[t];
                    bv = st.best_v[t];
                }
            tok = (int32_t)(b < 0 ? 0 : b);
        } else {
            st.z[c->mask_id] = c->mask_logit;
            tok = (int32_t)ds_argmax(st.z, c->V);
        }
        if (c->conf_w) {
            memcpy(c->in, hk, (size_t)c->D * sizeof(float));   /* e already follows it */
            cpu_matmul(ex, DS_CANONICAL, c->conf_w, 1, c->in, c->conf_logit);
            cpu_gate(ex, DS_GATE_SIGMOID, 1, c->conf_logit, c->conf_b, NULL, NULL, c->conf + k);
        }
        c->toks[(size_t)(k + 1) * sd] = tok;
    }
    return 0;
}

/* ---- mixture of experts ------------------------------------------------- */

/* The route is k * n_expert compares a row: inline, on the caller's thread
 * (its scratch on the stack, n_expert <= DS_MOE_MAX_EXPERT). */
static void cpu_moe_route(ds_exec *ex, ds_variant v, int M, int n_expert, int k, int norm, const float *logits,
                          int32_t *ids, float *w) {
    (void)ex;
    float scratch[DS_MOE_MAX_EXPERT];
    if (n_expert > DS_MOE_MAX_EXPERT) return;   /* the loader refuses such files */
    (void)ds_moe_route(v, M, n_expert, k, norm, logits, scratch, ids, w);
}

/* Rank order, one multiply and one add per term (backend.h; the loop is
 * kernels/cpu/moe_route.c ds_moe_combine). Inline: M * k * n flops against
 * the experts' M * k * 3 * n * n_ff. */
static void cpu_moe_combine(ds_exec *ex, int M, int k, int n, const int32_t *slot, const float *w, const float *y,
                            const float *sh_gate, const float *sh, float *out) {
    (void)ex;
    ds_moe_combine(M, k, n, slot, w, y, sh_gate, sh, out);
}

/* backend.h matmul_id, the reference: every assignment is the one-row
 * canonical matmul of its expert (decode's call), one after another, each
 * over the whole pool. Any type: the CPU's matmul takes them all. A host
 * layer still groups (layer.c: there is no synchronisation to save); this
 * runs where a test poses as a device (tests/test_moe_device.c). */
static int cpu_moe_id_prepare(ds_backend *be, ds_weight *W, int n_exp, char *err, size_t errlen) {
    (void)be; (void)W; (void)n_exp; (void)err; (void)errlen;
    return 0;
}
static void cpu_matmul_id(ds_exec *ex, int n, const ds_weight *const W[], int n_exp, int A, const int32_t *ids, int xk,
                          const float *x, float *const y[]) {
    if (n < 1 || n_exp < 1 || A < 1 || xk < 1) return;
    for (int w = 0; w < n; w++)
        for (int i = 0; i < A; i++) {
            const int e = ids[i] >= 0 && ids[i] < n_exp ? ids[i] : 0;
            const ds_weight *We = &W[w][e];
            cpu_matmul(ex, DS_CANONICAL, We, 1, x + (size_t)(i / xk) * (size_t)We->n_in, y[w] + (size_t)i * (size_t)We->n_out);
        }
}

/* ---- the gated delta net (qwen35) ---------------------------------------- */
static void cpu_gdn_conv(ds_exec *ex, ds_variant v, const ds_gdn_shape *s, int M, const float *x, const float *w,
                         const float *state_in, float *const *state_out, float *out) {
    ds_gdn_conv(v, s, M, x, w, state_in, state_out, out, ds_exec_cpu_pool(ex));
}

static void cpu_gdn_recur(ds_exec *ex, ds_variant v, const ds_gdn_shape *s, int M, float *qkv, float *alpha, float *beta,
                          const float *dt_bias, const float *A, const float *state_in, float *const *state_out, float *out) {
    (void)ds_gdn_recur(v, s, M, qkv, alpha, beta, dt_bias, A, state_in, state_out, out, ds_exec_cpu_pool(ex));
}

static void cpu_sigmoid_mul(ds_exec *ex, int64_t n, float *x, const float *g) {
    ds_sigmoid_mul(n, x, g, ds_exec_cpu_pool(ex));
}

/* ---- deepseek4 --------------------------------------------------------- */
static void cpu_attn_sinks(ds_exec *ex, ds_variant v, const ds_attn_shape *s, int M, const ds_rows *r, int window,
                           const ds_attn_extra *x,
                           const float *sinks, const float *q, const float *kc, const float *vc, float *out) {
    const ds_attn_rows ar = { r->n_vis, r->pos, r->seq, r->tables, r->max_pages, r->page, r->page_stride };
    (void)ds_attn_sinks(v, s, M, &ar, window, x, sinks, q, kc, vc, out, pool_of(ex));
}
static void cpu_hc_pre(ds_exec *ex, ds_variant v, int rows, int hc, int d, int n_mix, const float *x, const float *mix,
                       const float *scale, const float *base, float eps, int iters, float *y, float *post, float *comb) {
    (void)ds_hc_pre(v, rows, hc, d, n_mix, x, mix, scale, base, eps, iters, y, post, comb, pool_of(ex));
}
static void cpu_hc_post(ds_exec *ex, ds_variant v, int rows, int hc, int d, const float *f, const float *res,
                        const float *post, const float *comb, float *out) {
    (void)ds_hc_post(v, rows, hc, d, f, res, post, comb, out, pool_of(ex));
}
static void cpu_ds4_compress(ds_exec *ex, ds_variant v, int rows, int n, int hd, const float *const *kv,
                             const float *const *sc, float *out) {
    (void)ds_ds4_compress(v, rows, n, hd, kv, sc, out, pool_of(ex));
}
static void cpu_ds4_indexer(ds_exec *ex, ds_variant v, int rows, int n_ih, int ihd, const float *iq, const float *w,
                            const int32_t *n_blk, ds_ds4_key_fn key, const void *u, int top_k, int32_t *sel,
                            int32_t *n_sel, float *score) {
    (void)ds_ds4_indexer(v, rows, n_ih, ihd, iq, w, n_blk, key, u, top_k, sel, n_sel, score, pool_of(ex));
}
static void cpu_moe_route_ex(ds_exec *ex, ds_variant v, int M, int n_expert, int k, const ds_moe_gating *g,
                             const float *logits, int32_t *ids, float *w) {
    (void)ex;
    float scratch[2 * DS_MOE_MAX_EXPERT];
    if (n_expert > DS_MOE_MAX_EXPERT) return;   /* the loader refuses such files */
    (void)ds_moe_route_ex(v, M, n_expert, k, g, logits, scratch, ids, w);
}

static uint64_t cpu_mem_free(ds_backend *be) {
    (void)be;
    return ds_host_mem_available();
}

static const ds_backend_i cpu_i = {
    .name = "cpu",
    .host_memory = 1,
    .mem_free = cpu_mem_free,
    .destroy = cpu_destroy,
    .describe = cpu_describe,
    .exec_new = cpu_exec_new,
    .exec_free = cpu_exec_free,
    .sync = cpu_sync,
    .alloc = cpu_alloc,
    .release = cpu_release,
    .upload = cpu_memcpy,
    .download = cpu_memcpy,
    .copy = cpu_memcpy,
    .prepare_weight = cpu_prepare_weight,
    .release_weight = cpu_release_weight,
    .matmul = cpu_matmul,
    .matmul_multi = cpu_matmul_multi,
    .attention = cpu_attention,
    .rmsnorm = cpu_rmsnorm,
    .rope = cpu_rope,
    .swiglu = cpu_swiglu,
    .residual = cpu_residual,
    .kv_write = cpu_kv_write,
    .embed = cpu_embed,
    .argmax = cpu_argmax,
    .sanitize = cpu_sanitize,
    .graph_begin = NULL,
    .graph_end = NULL,
    .reserve = cpu_reserve,
    .add = cpu_add,
    .fill = cpu_fill,
    .gate = cpu_gate,
    .sample = cpu_sample,
    .draft_chain = cpu_draft_chain,
    .alloc_pool = cpu_alloc_pool,
    .release_pool = cpu_release_pool,
    .moe_route = cpu_moe_route,
    .moe_combine = cpu_moe_combine,
    .gdn_conv = cpu_gdn_conv,
    .gdn_recur = cpu_gdn_recur,
    .sigmoid_mul = cpu_sigmoid_mul,
    .attn_sinks = cpu_attn_sinks,
    .hc_pre = cpu_hc_pre,
    .hc_post = cpu_hc_post,
    .moe_route_ex = cpu_moe_route_ex,
    .ds4_compress = cpu_ds4_compress,
    .ds4_indexer = cpu_ds4_indexer,
    .moe_id_prepare = cpu_moe_id_prepare,
    .matmul_id = cpu_matmul_id,
    .rope_ext = cpu_rope_ext,
};

ds_backend *ds_backend_cpu_new(char *err, size_t errlen) {
    ds_backend *be = calloc(1, sizeof *be);
    if (!be) { ds_errf(err, errlen, "cpu: out of memory"); return NULL; }
    be->i = &cpu_i;
    return be;
}
