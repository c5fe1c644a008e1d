/* backend_cuda.cu — the CUDA implementation of the backend table (backend.h).
 *
 *   device state    one GPU (device 0 of what CUDA_VISIBLE_DEVICES shows),
 *                   the RoPE tables (rope.cu), an auxiliary stream for
 *                   uploads that must not be recorded into a graph.
 *   ds_exec         a non-blocking stream, a cuBLAS handle with its own
 *                   workspace (so cuBLAS allocates nothing while a graph is
 *                   recorded), scratch slots, recorded graphs.
 *   buffers         cudaMalloc (no managed memory); upload / copy are
 *                   asynchronous on the exec's stream, download synchronises.
 *   weights         uploaded once (prepare_weight): F32 / F16 / BF16 rows as
 *                   in the file; Q8_0 split into an int8 quant matrix with
 *                   16-byte aligned rows and the f32 values of the scales.
 *   families        src/kernels/cuda/<family>.cu, decode / canonical / fast
 *                   side by side, mirroring src/kernels/cpu/.
 *   graphs          graph_begin(key): replay the graph recorded under key,
 *                   or record the caller's ops (relaxed capture) and launch
 *                   them at graph_end. Every kernel reads positions and ids
 *                   from device buffers and sizes its grid independently of
 *                   the prefix, so a graph is valid at any position.
 *
 * Errors: a failing launch or API call is remembered (the first one) and
 * reported by the next sync() / graph_end(); the ops themselves return
 * nothing, as on the CPU. A backend and its execution contexts are used from
 * one host thread at a time. */
#include "kernels/cuda/cuda_internal.cuh"
#include "kernels/cuda/heads.cuh"

#include <stdio.h>
#include <stdlib.h>

/* ==========================================================================
 * errors and scratch
 * ========================================================================== */
static void dsc_trace_end_only(ds_exec *ex, const char *what);
void dsc_note(ds_exec *ex, cudaError_t e, const char *what) {
    ex->n_ops++;                      /* called after every launch and copy: dsc_q8x */
    if (e == cudaSuccess || ex->err) return;
    ex->err = 1;
    snprintf(ex->errmsg, sizeof ex->errmsg, "cuda: %s: %s", what, cudaGetErrorString(e));
}
/* After a kernel launch: dsc_note, and the timeline's mark outside a recording. */
void dsc_launched(ds_exec *ex, cudaError_t e, const char *what) {
    dsc_note(ex, e, what);
    if (ex->trace && !ex->capturing && !ex->trace->inside) dsc_trace_end_only(ex, what);
}

/* ==========================================================================
 * the stream timeline (DSPARK_CUDA_TRACE=1; dsc_trace in cuda_internal.cuh)
 * ========================================================================== */
static int dsc_trace_label(dsc_trace *t, const char *what) {
    for (int i = 0; i < t->n_names; i++)
        if (!strcmp(t->name[i], what)) return i;
    if (t->n_names == DSC_TRACE_LABELS) return DSC_TRACE_LABELS - 1;   /* the last one collects the rest */
    snprintf(t->name[t->n_names], sizeof t->name[0], "%s", t->n_names == DSC_TRACE_LABELS - 1 ? "other" : what);
    return t->n_names++;
}
/* Before an op: its begin event. -1 when not traced (off, recording, full). */
static int dsc_trace_begin(ds_exec *ex) {
    dsc_trace *t = ex->trace;
    if (!t || ex->capturing) return -1;
    if (t->n == DSC_TRACE_OPS) { t->dropped++; return -1; }
    cudaEventRecord(t->beg[t->n], ex->st);
    t->inside = 1;
    return t->n;
}
static void dsc_trace_end(ds_exec *ex, int i, const char *what) {
    dsc_trace *t = ex->trace;
    if (!t || i < 0) return;
    t->inside = 0;
    cudaEventRecord(t->end[i], ex->st);
    t->label[i] = dsc_trace_label(t, what);
    t->n = i + 1;
}
/* A kernel launched on its own (no begin event): its time counts from the
 * previous op's end, its gap as busy. */
static void dsc_trace_end_only(ds_exec *ex, const char *what) {
    dsc_trace *t = ex->trace;
    if (t->n == DSC_TRACE_OPS) { t->dropped++; return; }
    cudaEventRecord(t->end[t->n], ex->st);
    t->label[t->n] = -1 - dsc_trace_label(t, what);
    t->n++;
}
/* Fold the recorded ops whose end has passed into the sums (after a
 * synchronisation: all of them; after waiting on one event: those before
 * it), keeping the rest for the next time. */
static void dsc_trace_flush(ds_exec *ex) {
    dsc_trace *t = ex->trace;
    if (!t || !t->n) return;
    t->syncs++;
    int done = 0;
    while (done < t->n && cudaEventQuery(t->end[done]) == cudaSuccess) done++;
    for (int i = 0; i < done; i++) {
        const cudaEvent_t prev = i ? t->end[i - 1] : t->carry;
        const int have_prev = i || t->have_carry;
        float busy = 0.0f, gap = 0.0f;
        int l = t->label[i];
        if (l < 0) {                              /* end-only: from the previous end */
            l = -1 - l;
            if (have_prev) cudaEventElapsedTime(&busy, prev, t->end[i]);
        } else {
            cudaEventElapsedTime(&busy, t->beg[i], t->end[i]);
            if (have_prev) cudaEventElapsedTime(&gap, prev, t->beg[i]);
        }
        t->count[l]++;
        t->busy_ms[l] += busy;
        t->gap_ms[l] += gap;
    }
    if (done) {
        const cudaEvent_t c = t->carry;           /* the last folded end carries over */
        t->carry = t->end[done - 1];
        t->end[done - 1] = c;
        t->have_carry = 1;
        for (int i = done; i < t->n; i++) {       /* the pending ones to the front */
            cudaEvent_t b = t->beg[i - done], e = t->end[i - done];
            t->beg[i - done] = t->beg[i]; t->end[i - done] = t->end[i]; t->label[i - done] = t->label[i];
            t->beg[i] = b; t->end[i] = e;
        }
        t->n -= done;
    }
    (void)cudaGetLastError();
}
static void dsc_trace_new(ds_exec *ex) {
    dsc_trace *t = (dsc_trace *)calloc(1, sizeof *t);
    if (!t) return;
    cudaError_t e = cudaEventCreate(&t->carry);
    for (int i = 0; e == cudaSuccess && i < DSC_TRACE_OPS; i++) {
        e = cudaEventCreate(&t->beg[i]);
        if (e == cudaSuccess) e = cudaEventCreate(&t->end[i]);
    }
    if (e != cudaSuccess) {                       /* no timeline, nothing else lost */
        (void)cudaGetLastError();
        fprintf(stderr, "cuda_trace: cannot create events: %s\n", cudaGetErrorString(e));
        free(t);
        return;
    }
    ex->trace = t;
}
static void dsc_trace_free(ds_exec *ex) {
    dsc_trace *t = ex->trace;
    if (!t) return;
    double busy = 0.0, gap = 0.0;
    long ops = 0;
    for (int l = 0; l < t->n_names; l++) { busy += t->busy_ms[l]; gap += t->gap_ms[l]; ops += t->count[l]; }
    if (ops) {
        fprintf(stderr, "cuda_trace: ops=%ld syncs=%ld busy_ms=%.3f gap_ms=%.3f dropped=%ld\n", ops, t->syncs, busy, gap,
                t->dropped);
        for (int l = 0; l < t->n_names; l++)
            if (t->count[l])
                fprintf(stderr, "cuda_trace: op=\"%s\" n=%ld busy_ms=%.3f gap_ms=%.3f busy_us_each=%.2f gap_us_each=%.2f\n",
                        t->name[l], t->count[l], t->busy_ms[l], t->gap_ms[l], 1e3 * t->busy_ms[l] / t->count[l],
                        1e3 * t->gap_ms[l] / t->count[l]);
    }
    cudaEventDestroy(t->carry);
    for (int i = 0; i < DSC_TRACE_OPS; i++) { cudaEventDestroy(t->beg[i]); cudaEventDestroy(t->end[i]); }
    free(t);
    ex->trace = NULL;
}

/* Grown, never shrunk. A buffer that a recorded graph may still read is
 * retired (freed with the exec) instead of freed. Growth doubles, so a
 * context retires only a handful over its life. */
void *dsc_scratch(ds_exec *ex, int s, size_t bytes) {
    if (bytes <= ex->slot_bytes[s]) return ex->slot[s];
    size_t want = ex->slot_bytes[s] * 2 > bytes ? ex->slot_bytes[s] * 2 : bytes;
    want = (want + 255) & ~(size_t)255;
    void *p = NULL;
    const cudaError_t e = cudaMalloc(&p, want);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        dsc_note(ex, e, "scratch");
        return NULL;
    }
    if (ex->slot[s]) {
        if (ex->n_graphs == 0 && !ex->capturing) {
            cudaStreamSynchronize(ex->st);
            cudaFree(ex->slot[s]);
        } else if (ex->n_retired < DSC_MAX_RETIRED) {
            ex->retired[ex->n_retired++] = ex->slot[s];
        } else {
            cudaFree(p);
            dsc_note(ex, cudaErrorMemoryAllocation, "scratch grew too often under recorded graphs");
            return NULL;
        }
    }
    ex->slot[s] = p;
    ex->slot_bytes[s] = want;
    return p;
}

/* ==========================================================================
 * execution contexts
 * ========================================================================== */
#define DSC_BLAS_WS (32u << 20)
#define DSC_PIN_BYTES (256u << 10)   /* pinned staging: ids, positions, selected tokens */

static void dsc_exec_free(ds_exec *ex);

static ds_exec *dsc_exec_new(ds_backend *be, int n_threads, char *err, size_t errlen) {
    (void)n_threads;
    ds_exec *ex = (ds_exec *)calloc(1, sizeof *ex);
    if (!ex) { ds_errf(err, errlen, "cuda: out of host memory"); return NULL; }
    ex->be = be;
    cudaError_t e = cudaStreamCreateWithFlags(&ex->st, cudaStreamNonBlocking);
    if (e == cudaSuccess) e = cudaEventCreateWithFlags(&ex->dl_ev, cudaEventDisableTiming);
    if (e == cudaSuccess) e = cudaMalloc(&ex->blas_ws, DSC_BLAS_WS);
    if (e == cudaSuccess) e = cudaMalloc((void **)&ex->count, sizeof(unsigned));
    if (e == cudaSuccess) e = cudaMemsetAsync(ex->count, 0, sizeof(unsigned), ex->st);
    if (e == cudaSuccess) e = cudaMalloc((void **)&ex->chain_sync, DSC_CHAIN_BYTES);
    if (e == cudaSuccess) e = cudaMemsetAsync(ex->chain_sync, 0, DSC_CHAIN_BYTES, ex->st);
    if (e != cudaSuccess) {
        ds_errf(err, errlen, "cuda: cannot create an execution context: %s", cudaGetErrorString(e));
        (void)cudaGetLastError();
        dsc_exec_free(ex);
        return NULL;
    }
    if (dsc_be(ex)->trace) dsc_trace_new(ex);
    /* optional: without it transfers go through pageable memory */
    if (cudaMallocHost((void **)&ex->pinned, DSC_PIN_BYTES) != cudaSuccess) {
        (void)cudaGetLastError();
        ex->pinned = NULL;
    }
    cublasStatus_t s = cublasCreate(&ex->blas);
    if (s == CUBLAS_STATUS_SUCCESS) s = cublasSetStream(ex->blas, ex->st);
    if (s == CUBLAS_STATUS_SUCCESS) s = cublasSetWorkspace(ex->blas, ex->blas_ws, DSC_BLAS_WS);
    if (s != CUBLAS_STATUS_SUCCESS) {
        ds_errf(err, errlen, "cuda: cannot initialise cuBLAS (status %d)", (int)s);
        dsc_exec_free(ex);
        return NULL;
    }
    return ex;
}

static void dsc_exec_free(ds_exec *ex) {
    if (!ex) return;
    if (ex->st && cudaStreamSynchronize(ex->st) == cudaSuccess) dsc_trace_flush(ex);
    if (ex->dl_ev) cudaEventDestroy(ex->dl_ev);
    dsc_trace_free(ex);
    for (int i = 0; i < ex->n_graphs; i++) cudaGraphExecDestroy(ex->gexec[i]);
    for (int s = 0; s < DSC_SLOT_COUNT; s++) cudaFree(ex->slot[s]);
    for (int i = 0; i < ex->n_retired; i++) cudaFree(ex->retired[i]);
    if (ex->pinned) cudaFreeHost(ex->pinned);
    cudaFree(ex->count);
    cudaFree(ex->chain_sync);
    if (ex->blas) cublasDestroy(ex->blas);
    cudaFree(ex->blas_ws);
    if (ex->st) cudaStreamDestroy(ex->st);
    free(ex);
}

/* A started download whose copy is complete (the stream or its event has
 * been waited for): its bytes out of the pinned slice, before the slice can
 * be reused. */
static void dsc_dl_deliver(ds_exec *ex) {
    if (!ex->dl_pending) return;
    if (ex->dl_pin) memcpy(ex->dl_dst, ex->dl_pin, ex->dl_bytes);
    ex->dl_pending = 0;
}
/* The first error since the last report, as the op's result (and cleared). */
static int dsc_report(ds_exec *ex, char *err, size_t errlen) {
    if (!ex->err) return 0;
    ds_errf(err, errlen, "%s", ex->errmsg);
    ex->err = 0;
    ex->errmsg[0] = 0;
    return -1;
}
static int dsc_sync(ds_exec *ex, char *err, size_t errlen) {
    const cudaError_t e = cudaStreamSynchronize(ex->st);
    if (e == cudaSuccess) dsc_dl_deliver(ex);
    ex->pin_off = 0;
    if (e == cudaSuccess) dsc_trace_flush(ex);
    dsc_note(ex, e, "device fault");
    return dsc_report(ex, err, errlen);
}

void *ds_exec_cuda_stream(ds_exec *ex) { return (void *)ex->st; }
unsigned long long ds_exec_cuda_q8x_hits(ds_exec *ex) { return ex->q8x_hits; }
unsigned long long ds_exec_cuda_tile_runs(ds_exec *ex) { return ex->tile_runs; }

/* ==========================================================================
 * buffers
 * ========================================================================== */
static void *dsc_alloc(ds_backend *be, size_t bytes) {
    (void)be;
    void *p = NULL;
    if (cudaMalloc(&p, bytes ? bytes : 1) != cudaSuccess) {
        (void)cudaGetLastError();
        return NULL;
    }
    return p;
}
static void dsc_release(ds_backend *be, void *p) {
    (void)be;
    if (p) cudaFree(p);
}
/* Host <-> device copies are not recordable (a graph would re-read the host
 * buffer at replay): the engine uploads ids and positions before
 * graph_begin and downloads after graph_end. */
/* Small transfers go through the exec's pinned staging (a pageable copy
 * costs the driver its own staging and, downwards, a blocking call):
 * uploads take the next free slice, which no later upload reuses before the
 * stream has been synchronised; downloads land in a slice and are copied
 * out after the synchronisation they need anyway. */
static unsigned char *dsc_pin(ds_exec *ex, size_t bytes) {
    if (!ex->pinned || bytes > DSC_PIN_BYTES || (dsc_be(ex)->off & DSC_OFF_PINNED)) return NULL;
    if (bytes > DSC_PIN_BYTES - ex->pin_off) {
        /* full: a loop that waits only on started downloads never resets
         * the staging, so wrap once every copy out of it is done */
        if (ex->capturing || cudaStreamSynchronize(ex->st) != cudaSuccess) return NULL;
        dsc_dl_deliver(ex);
        ex->pin_off = 0;
    }
    unsigned char *p = ex->pinned + ex->pin_off;
    ex->pin_off += (bytes + 63) & ~(size_t)63;
    if (ex->pin_off > DSC_PIN_BYTES) ex->pin_off = DSC_PIN_BYTES;
    return p;
}
static void dsc_upload(ds_exec *ex, void *dst, const void *src, size_t bytes) {
    if (!bytes) return;
    if (ex->capturing) { dsc_note(ex, cudaErrorStreamCaptureUnsupported, "upload inside a recorded graph"); return; }
    unsigned char *p = dsc_pin(ex, bytes);
    if (p) memcpy(p, src, bytes);
    const int ti = dsc_trace_begin(ex);
    dsc_note(ex, cudaMemcpyAsync(dst, p ? (const void *)p : src, bytes, cudaMemcpyHostToDevice, ex->st), "upload");
    dsc_trace_end(ex, ti, "upload");
}
static void dsc_download(ds_exec *ex, void *dst, const void *src, size_t bytes) {
    if (!bytes) return;
    if (ex->capturing) { dsc_note(ex, cudaErrorStreamCaptureUnsupported, "download inside a recorded graph"); return; }
    unsigned char *p = dsc_pin(ex, bytes);
    const int ti = dsc_trace_begin(ex);
    dsc_note(ex, cudaMemcpyAsync(p ? (void *)p : dst, src, bytes, cudaMemcpyDeviceToHost, ex->st), "download");
    dsc_trace_end(ex, ti, "download");
    const cudaError_t e = cudaStreamSynchronize(ex->st);
    dsc_note(ex, e, "download");
    if (e == cudaSuccess) { dsc_trace_flush(ex); dsc_dl_deliver(ex); }
    if (p && e == cudaSuccess) memcpy(dst, p, bytes);
    ex->pin_off = 0;
}
/* download_start / download_finish (backend.h): the copy goes into a pinned
 * slice and an event marks its end; finish waits for that event only. */
static void dsc_download_start(ds_exec *ex, void *dst, const void *src, size_t bytes) {
    if (ex->capturing) { dsc_note(ex, cudaErrorStreamCaptureUnsupported, "download inside a recorded graph"); return; }
    if (ex->dl_pending) {                          /* one at a time: finish the earlier one */
        dsc_note(ex, cudaEventSynchronize(ex->dl_ev), "download");
        dsc_dl_deliver(ex);
    }
    unsigned char *p = bytes ? dsc_pin(ex, bytes) : NULL;
    const int ti = dsc_trace_begin(ex);
    if (bytes) dsc_note(ex, cudaMemcpyAsync(p ? (void *)p : dst, src, bytes, cudaMemcpyDeviceToHost, ex->st), "download");
    dsc_trace_end(ex, ti, "download (started)");
    dsc_note(ex, cudaEventRecord(ex->dl_ev, ex->st), "download");
    ex->dl_pin = p;
    ex->dl_dst = dst;
    ex->dl_bytes = bytes;
    ex->dl_pending = 1;
}
static int dsc_download_finish(ds_exec *ex, char *err, size_t errlen) {
    if (ex->dl_pending) {
        /* a pageable destination (no pinned slice) makes the copy itself
         * synchronous; either way the event has passed once this returns */
        dsc_note(ex, cudaEventSynchronize(ex->dl_ev), "download");
        if (!ex->err) dsc_dl_deliver(ex);
        ex->dl_pending = 0;
        dsc_trace_flush(ex);
    }
    return dsc_report(ex, err, errlen);
}
/* Copies recorded into a graph run as kernels instead of memcpy nodes: the
 * stream timeline measured a graph's small memcpy node at 0.7-4 us, a kernel
 * node can start by programmatic dependent launch like its neighbours.
 * 16-byte units when both ends and the length allow, else 4-byte, else
 * bytes. Outside a recording (snapshots, restores) cudaMemcpyAsync stays.
 * DSPARK_CUDA_OFF=copyk: memcpy nodes everywhere. A copy moves bits. */
#define DSC_COPYK_MAX (4u << 20)
template <typename T>
__global__ void copyk_1d(T *__restrict__ d, const T *__restrict__ s, size_t n) {
    dsc_pdl_wait();
    dsc_pdl_trigger();
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) d[i] = s[i];
}
template <typename T>
__global__ void copyk_2d(T *__restrict__ d, size_t dp, const T *__restrict__ s, size_t sp, size_t w, size_t rows) {
    dsc_pdl_wait();
    dsc_pdl_trigger();
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < w * rows; i += (size_t)gridDim.x * blockDim.x)
        d[(i / w) * dp + i % w] = s[(i / w) * sp + i % w];
}
static bool dsc_copyk_ok(ds_exec *ex, size_t bytes) {
    return ex->capturing && bytes <= DSC_COPYK_MAX && !(dsc_be(ex)->off & DSC_OFF_COPYK);
}
template <typename T>
static void dsc_copyk_2d(ds_exec *ex, void *dst, size_t dpitch, const void *src, size_t spitch, size_t width,
                         size_t rows) {
    const size_t n = width / sizeof(T) * rows;
    const unsigned grid = (unsigned)((n + 255) / 256 < 1024 ? (n + 255) / 256 : 1024);
    if (rows == 1)
        dsc_launch(ex, "copy", copyk_1d<T>, dim3(grid), dim3(256), 0, (T *)dst, (const T *)src, n);
    else
        dsc_launch(ex, "copy2d", copyk_2d<T>, dim3(grid), dim3(256), 0, (T *)dst, dpitch / sizeof(T), (const T *)src,
                   spitch / sizeof(T), width / sizeof(T), rows);
}
/* 1 when issued as a kernel (recording, small, the unit divides everything) */
static int dsc_copyk(ds_exec *ex, void *dst, size_t dpitch, const void *src, size_t spitch, size_t width, size_t rows) {
    if (!dsc_copyk_ok(ex, width * rows)) return 0;
    const uintptr_t all = (uintptr_t)dst | (uintptr_t)src | width | (rows > 1 ? (dpitch | spitch) : 0);
    if (!(all % 16)) dsc_copyk_2d<uint4>(ex, dst, dpitch, src, spitch, width, rows);
    else if (!(all % 4)) dsc_copyk_2d<uint32_t>(ex, dst, dpitch, src, spitch, width, rows);
    else dsc_copyk_2d<unsigned char>(ex, dst, dpitch, src, spitch, width, rows);
    return 1;
}
/* copy_n: up to DS_COPY_N_MAX copies as one kernel (recording, 16-byte
 * units everywhere), else one copy each */
struct copyk_set {
    uint4 *d[DS_COPY_N_MAX];
    const uint4 *s[DS_COPY_N_MAX];
    size_t end[DS_COPY_N_MAX];        /* cumulative lengths (units) */
};
__global__ void copyk_n(const copyk_set c, int n) {
    dsc_pdl_wait();
    dsc_pdl_trigger();
    const size_t total = c.end[n - 1];
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (size_t)gridDim.x * blockDim.x) {
        int k = 0;
        while (i >= c.end[k]) k++;
        const size_t j = i - (k ? c.end[k - 1] : 0);
        c.d[k][j] = c.s[k][j];
    }
}
static void dsc_copy(ds_exec *ex, void *dst, const void *src, size_t bytes);
static void dsc_copy_n(ds_exec *ex, int n, void *const dst[], const void *const src[], const size_t bytes[]) {
    copyk_set c;
    memset(&c, 0, sizeof c);
    size_t total = 0;
    uintptr_t all = 0;
    for (int i = 0; i < n; i++) {
        all |= (uintptr_t)dst[i] | (uintptr_t)src[i] | bytes[i];
        total += bytes[i];
        c.d[i] = (uint4 *)dst[i];
        c.s[i] = (const uint4 *)src[i];
        c.end[i] = total / 16;
    }
    if (n < 1 || n > DS_COPY_N_MAX || all % 16 || !total || !dsc_copyk_ok(ex, total)) {
        for (int i = 0; i < n; i++) dsc_copy(ex, dst[i], src[i], bytes[i]);
        return;
    }
    const size_t units = total / 16;
    const unsigned grid = (unsigned)((units + 255) / 256 < 1024 ? (units + 255) / 256 : 1024);
    dsc_launch(ex, "copy_n", copyk_n, dim3(grid), dim3(256), 0, c, n);
}
static void dsc_copy2d(ds_exec *ex, void *dst, size_t dpitch, const void *src, size_t spitch, size_t width,
                       size_t rows) {
    if (!width || !rows) return;
    if (dsc_copyk(ex, dst, dpitch, src, spitch, width, rows)) return;
    const int ti = dsc_trace_begin(ex);
    dsc_note(ex, cudaMemcpy2DAsync(dst, dpitch, src, spitch, width, rows, cudaMemcpyDeviceToDevice, ex->st), "copy2d");
    dsc_trace_end(ex, ti, "copy2d");
}
static void dsc_copy(ds_exec *ex, void *dst, const void *src, size_t bytes) {
    if (!bytes) return;
    if (dsc_copyk(ex, dst, bytes, src, bytes, bytes, 1)) return;
    const int ti = dsc_trace_begin(ex);
    dsc_note(ex, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, ex->st), "copy");
    dsc_trace_end(ex, ti, "copy");
}

/* ==========================================================================
 * weights
 * ========================================================================== */
static void dsc_release_weight(ds_backend *be, ds_weight *w) {
    (void)be;
    dsc_weight *d = (dsc_weight *)dsc_w(w);
    if (!d) return;
    cudaFree(d->data);
    cudaFree(d->scale);
    cudaFree(d->id_tab);
    free(d);
    w->DSC_WEIGHT_SLOT = NULL;
}

#define DSC_STAGE_BYTES (64u << 20)   /* host staging for the Q8_0 split */

static int dsc_prepare_weight(ds_backend *be, ds_weight *w, int use, char *err, size_t errlen) {
    if (dsc_w(w)) return 0;
    int ok = 0;
    const uint64_t rb = ds_row_bytes(w->type, (uint64_t)w->n_in, &ok);
    if (ds_type_is_kq(w->type) && !dsc_kq_supported(w->type)) {   /* matmul_kq.cu lists them */
        ds_errf(err, errlen, "cuda: %s weights are not supported on the CUDA backend yet (use the CPU)",
                ds_type_name(w->type));
        return -1;
    }
    if (!ds_type_valid(w->type) || !ok || w->n_in < 0 || w->n_out < 0 || !w->data) {
        ds_errf(err, errlen, "cuda: cannot upload a %s weight of %lld x %lld", ds_type_name(w->type),
                (long long)w->n_out, (long long)w->n_in);
        return -1;
    }
    dsc_weight *d = (dsc_weight *)calloc(1, sizeof *d);
    if (!d) { ds_errf(err, errlen, "cuda: out of host memory"); return -1; }
    d->type = w->type;
    d->n_in = w->n_in;
    d->n_out = w->n_out;
    const size_t N = (size_t)w->n_out, K = (size_t)w->n_in;
    cudaError_t e = cudaSuccess;
    if (ds_type_is_kq(w->type)) {
        e = dsc_kq_upload(w, d);        /* repacked for matmul_kq.cu */
    } else if (w->type != DS_TYPE_Q8_0) {
        const size_t bytes = (size_t)rb * N;
        e = cudaMalloc(&d->data, bytes ? bytes : 1);
        if (e == cudaSuccess && bytes) e = cudaMemcpy(d->data, w->data, bytes, cudaMemcpyHostToDevice);
    } else {
        const size_t nb = K / DS_QK8_0;
        const bool empty = N == 0 || K == 0;
        e = cudaMalloc(&d->data, empty ? 1 : N * K);
        if (e == cudaSuccess) e = cudaMalloc((void **)&d->scale, empty ? 1 : N * nb * sizeof(float));
        /* rows in slabs through a host staging buffer: quants then scales */
        const size_t per_row = K + nb * sizeof(float);
        size_t rows = per_row ? DSC_STAGE_BYTES / per_row : N;
        if (rows < 1) rows = 1;
        if (rows > N) rows = N;
        unsigned char *stage = e == cudaSuccess && !empty ? (unsigned char *)malloc(rows * per_row) : NULL;
        if (e == cudaSuccess && !empty && !stage) e = cudaErrorMemoryAllocation;
        for (size_t r0 = 0; e == cudaSuccess && !empty && r0 < N; r0 += rows) {
            const size_t nr = N - r0 < rows ? N - r0 : rows;
            int8_t *q = (int8_t *)stage;
            float *s = (float *)(stage + nr * K);
            for (size_t r = 0; r < nr; r++) {
                const ds_block_q8_0 *blk = (const ds_block_q8_0 *)((const char *)w->data + (r0 + r) * rb);
                for (size_t b = 0; b < nb; b++) {
                    memcpy(q + r * K + b * DS_QK8_0, blk[b].qs, DS_QK8_0);
                    s[r * nb + b] = ds_fp16_to_f32(blk[b].d);
                }
            }
            e = cudaMemcpy((int8_t *)d->data + r0 * K, q, nr * K, cudaMemcpyHostToDevice);
            if (e == cudaSuccess)
                e = cudaMemcpy(d->scale + r0 * nb, s, nr * nb * sizeof(float), cudaMemcpyHostToDevice);
        }
        free(stage);
    }
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        cudaFree(d->data);
        cudaFree(d->scale);
        free(d);
        if (e == cudaErrorMemoryAllocation)
            ds_errf(err, errlen, "cuda: out of GPU memory uploading a %lld x %lld %s weight",
                    (long long)w->n_out, (long long)w->n_in, ds_type_name(w->type));
        else
            ds_errf(err, errlen, "cuda: weight upload failed: %s", cudaGetErrorString(e));
        return -1;
    }
    w->DSC_WEIGHT_SLOT = d;
    /* Q8_0, and Q4_0 / Q5_0 in its layout: their canonical matmuls read
     * Q8_0 activations, which producers then make (dsc_q8x) */
    if ((use & DS_USE_MATMUL) &&
        (w->type == DS_TYPE_Q8_0 || w->type == DS_TYPE_Q4_0 || w->type == DS_TYPE_Q5_0))
        ((dsc_backend *)be->priv)->q8_layout = 1;
    return 0;
}

/* ==========================================================================
 * recorded launch sequences
 * ========================================================================== */
/* recording i goes; the last one takes its place */
static void graph_remove(ds_exec *ex, int i) {
    cudaGraphExecDestroy(ex->gexec[i]);
    ex->n_graphs--;
    ex->gkey[i] = ex->gkey[ex->n_graphs];
    ex->gnodes[i] = ex->gnodes[ex->n_graphs];
    ex->gexec[i] = ex->gexec[ex->n_graphs];
    ex->guse[i] = ex->guse[ex->n_graphs];
}

static int dsc_graph_begin(ds_exec *ex, uint64_t key, char *err, size_t errlen) {
    ex->n_ops++;                      /* a replay writes buffers behind the host's back */
    if (ex->capturing) {
        ds_errf(err, errlen, "cuda: graph_begin inside a recording");
        return -1;
    }
    for (int i = 0; i < ex->n_graphs; i++)
        if (ex->gkey[i] == key) {
            ex->guse[i] = ++ex->gclock;
            const int ti = dsc_trace_begin(ex);
            const cudaError_t e = cudaGraphLaunch(ex->gexec[i], ex->st);
            if (ti >= 0) {
                char lb[40];
                snprintf(lb, sizeof lb, "graph of %d kernels", ex->gnodes[i]);
                dsc_trace_end(ex, ti, lb);
            }
            if (e != cudaSuccess) {
                ds_errf(err, errlen, "cuda: graph launch failed: %s", cudaGetErrorString(e));
                return -1;
            }
            return 1;
        }
    if (ex->n_graphs == DSC_MAX_GRAPHS) {
        /* full: the least recently launched recording goes (an executable
         * graph still in flight is freed when it completes; its buffers
         * are the context's, so nothing it reads goes away) */
        int lru = 0;
        for (int i = 1; i < ex->n_graphs; i++)
            if (ex->guse[i] < ex->guse[lru]) lru = i;
        graph_remove(ex, lru);
    }
    const cudaError_t e = cudaStreamBeginCapture(ex->st, cudaStreamCaptureModeRelaxed);
    if (e != cudaSuccess) {
        ds_errf(err, errlen, "cuda: cannot record a graph: %s", cudaGetErrorString(e));
        return -1;
    }
    ex->capturing = 1;
    ex->cap_key = key;
    return 0;
}

static int dsc_graph_end(ds_exec *ex, char *err, size_t errlen) {
    ex->n_ops++;
    if (!ex->capturing) return 0;                      /* replayed, or ran directly */
    cudaGraph_t g = NULL;
    cudaError_t e = cudaStreamEndCapture(ex->st, &g);
    ex->capturing = 0;
    if (e == cudaSuccess && ex->err) e = cudaErrorUnknown;
    cudaGraphExec_t gx = NULL;
    size_t nodes = 0;
    if (e == cudaSuccess) e = cudaGraphGetNodes(g, NULL, &nodes);
    if (e == cudaSuccess) e = cudaGraphInstantiate(&gx, g, 0);
    if (g) cudaGraphDestroy(g);
    const int ti = e == cudaSuccess ? dsc_trace_begin(ex) : -1;
    if (e == cudaSuccess) e = cudaGraphLaunch(gx, ex->st);
    dsc_trace_end(ex, ti, "graph (first launch)");
    if (e != cudaSuccess) {
        if (ex->err) ds_errf(err, errlen, "%s", ex->errmsg);
        else ds_errf(err, errlen, "cuda: recording a graph failed: %s", cudaGetErrorString(e));
        ex->err = 0;
        if (gx) cudaGraphExecDestroy(gx);
        (void)cudaGetLastError();
        return -1;
    }
    ex->gkey[ex->n_graphs] = ex->cap_key;
    ex->guse[ex->n_graphs] = ++ex->gclock;
    ex->gnodes[ex->n_graphs] = (int)nodes;
    ex->gexec[ex->n_graphs++] = gx;
    return 0;
}

static void dsc_graph_drop(ds_exec *ex, uint64_t key) {
    for (int i = 0; i < ex->n_graphs; i++)
        if (ex->gkey[i] == key) {
            dsc_note(ex, cudaStreamSynchronize(ex->st), "graph drop");
            graph_remove(ex, i);
            return;
        }
}

/* ==========================================================================
 * the table
 * ========================================================================== */
static void dsc_destroy(ds_backend *be) {
    if (!be) return;
    dsc_backend *b = (dsc_backend *)be->priv;
    if (b) {
        for (int i = 0; i < b->n_rope; i++) {
            cudaFree(b->rope[i].cs);
            cudaFree(b->rope[i].inv_freq);
            cudaFree(b->rope[i].ff);
        }
        if (b->aux) cudaStreamDestroy(b->aux);
        free(b);
    }
    free(be);
}

static void dsc_describe(ds_backend *be, char *buf, size_t n) {
    const dsc_backend *b = (const dsc_backend *)be->priv;
    cudaDeviceProp p;
    size_t free_b = 0, total_b = 0;
    if (cudaGetDeviceProperties(&p, b->device) != cudaSuccess) { snprintf(buf, n, "gpu=unknown"); return; }
    cudaMemGetInfo(&free_b, &total_b);
    snprintf(buf, n, "gpu=\"%s\" sm=%d.%d sms=%d mem_total_mib=%zu mem_free_mib=%zu", p.name, p.major, p.minor,
             p.multiProcessorCount, total_b >> 20, free_b >> 20);
}

/* A prompt runs in chunks of 512 rows here: the Q8_0 / K-quant tensor-core
 * tiles reach their rate from a few hundred rows on (8B shapes: ~90 TMAC/s
 * at M = 512, 11-44 at M = 64), and 512 rows of activations, logits and taps
 * are small beside the weights. DSPARK_CUDA_OFF=chunk keeps the default 64
 * (A/B; no bit moves: prefill is chunk-invariant). */
/* the device's free memory: what sizes a server's default --parallel */
static uint64_t dsc_mem_free(ds_backend *be) {
    size_t free_b = 0, total_b = 0;
    (void)be;
    if (cudaMemGetInfo(&free_b, &total_b) != cudaSuccess) return 0;
    return (uint64_t)free_b;
}

static int dsc_chunk_rows(ds_backend *be) {
    return (((dsc_backend *)be->priv)->off & DSC_OFF_CHUNK) ? DS_CHUNK_ROWS_DEFAULT : 512;
}

/* the paths written but not yet run on a GPU, switched on by DSPARK_CUDA_ON */
static int dsc_path_on(ds_backend *be, const char *name) {
    const dsc_backend *b = (const dsc_backend *)be->priv;
    if (!strcmp(name, "ropeext")) return !(b->off & DSC_OFF_ROPEEXT);
    if (!strcmp(name, "tp")) return !(b->off & DSC_OFF_TP);
    return 1;
}

static const ds_backend_i dsc_iface = {
    /* name */ "cuda",
    /* host_memory */ 0,
    dsc_destroy,
    dsc_describe,
    dsc_exec_new,
    dsc_exec_free,
    dsc_sync,
    dsc_alloc,
    dsc_release,
    dsc_upload,
    dsc_download,
    dsc_copy,
    dsc_prepare_weight,
    dsc_release_weight,
    dsc_matmul,
    dsc_attention,
    dsc_rmsnorm,
    dsc_rope,
    dsc_swiglu,
    dsc_residual,
    dsc_kv_write,
    dsc_embed,
    dsc_argmax,
    dsc_sanitize,
    dsc_graph_begin,
    dsc_graph_end,
    /* reserve */ NULL,
    dsc_matmul_multi,
    dsc_add,
    dsc_fill,
    dsc_gate,
    dsc_sample,
    dsc_qk_norm_rope_kv,
    dsc_draft_chain,
    dsc_swiglu_matmul,
    dsc_matmul_res,
    dsc_graph_drop,
    dsc_copy2d,
    dsc_download_start,
    dsc_download_finish,
    dsc_copy_n,
    /* alloc_pool */ NULL,          /* cudaMalloc: device memory is not zeroed anyway */
    /* release_pool */ NULL,
    dsc_moe_route,                  /* moe.cu: softmax MoE (qwen3moe / qwen35moe's FFN) */
    dsc_moe_combine,
    /* gdn_conv */ NULL,            /* no gated delta net kernels yet: the loader refuses qwen35 here */
    /* gdn_recur */ NULL,
    /* sigmoid_mul */ NULL,
    /* attn_sinks */ NULL,          /* no deepseek4 kernels yet: the loader refuses deepseek4 here */
    /* hc_pre */ NULL,
    /* hc_post */ NULL,
    /* moe_route_ex */ NULL,         /* deepseek4's gated route: refused here with the rest of deepseek4 */
    /* ds4_compress */ NULL,        /* no compressed-attention kernels: the loader refuses those layers here */
    /* ds4_indexer */ NULL,
    dsc_chunk_rows,
    dsc_mem_free,
    dsc_moe_gather,
    dsc_moe_id_prepare,             /* moe.cu: the experts by id, no host read of the route */
    dsc_matmul_id,
    dsc_rope_ext,                   /* rope.cu: rope scaling / frequency factors (qwen3, llama) */
    dsc_path_on,
};

/* $DSPARK_CUDA_OFF / $DSPARK_CUDA_ON: comma-separated names of launch-saving
 * paths to leave out / put in (A/B measurements; the bits never move). An
 * unknown name is an error: a mistyped switch would otherwise measure the
 * default against itself. Returns -1 (and the message) on one. */
static int dsc_parse_off(const char *var, unsigned *off, char *err, size_t errlen) {
    static const struct { const char *name; unsigned bit; } names[] = {
        {"swiglu", DSC_OFF_SWIGLU}, {"fq", DSC_OFF_FQ}, {"pinned", DSC_OFF_PINNED},
        {"chain", DSC_OFF_CHAIN}, {"prologue", DSC_OFF_PROLOGUE}, {"multi", DSC_OFF_MULTI},
        {"epilogue", DSC_OFF_EPILOGUE}, {"wide", DSC_OFF_WIDE}, {"q8x", DSC_OFF_Q8X},
        {"staged", DSC_OFF_STAGED}, {"pdl", DSC_OFF_PDL}, {"narrow", DSC_OFF_NARROW}, {"copyk", DSC_OFF_COPYK},
        {"spread", DSC_OFF_SPREAD}, {"mma", DSC_OFF_MMA}, {"stream", DSC_OFF_STREAM},
        {"split", DSC_OFF_SPLIT}, {"chunk", DSC_OFF_CHUNK}, {"gemv", DSC_OFF_GEMV}, {"tile", DSC_OFF_TILE},
        {"runs", DSC_OFF_RUNS}, {"moeid", DSC_OFF_MOEID},
        {"ropeext", DSC_OFF_ROPEEXT}, {"tp", DSC_OFF_TP},
    };
    *off = 0;
    const char *v = getenv(var);
    for (const char *p = v; p && *p;) {
        const char *e = strchr(p, ',');
        const size_t n = e ? (size_t)(e - p) : strlen(p);
        bool known = n == 0;                        /* empty items (",,") are nothing */
        for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
            if (strlen(names[i].name) == n && !strncmp(p, names[i].name, n)) {
                *off |= names[i].bit;
                known = true;
            }
        if (!known) {
            ds_errf(err, errlen,
                    "cuda: %s: unknown path '%.*s' (known: swiglu fq pinned chain prologue multi epilogue wide q8x staged pdl narrow copyk spread mma stream split chunk gemv tile runs moeid ropeext tp)",
                    var, (int)(n > 32 ? 32 : n), p);
            return -1;
        }
        p = e ? e + 1 : p + n;
    }
    return 0;
}

/* The module's identity, checked by the loader (backend.c): the version it
 * was built with and the size of the table it fills. */
extern "C" const char *ds_cuda_module_abi(size_t *table_size) {
    *table_size = sizeof(ds_backend_i);
    return DSPARK_VERSION_STRING;
}

/* One clear line for each way a GPU can be missing. */
extern "C" ds_backend *ds_backend_cuda_new(char *err, size_t errlen) {
    unsigned off = 0, on = 0;                       /* first: a bad switch is the user's error */
    if (dsc_parse_off("DSPARK_CUDA_OFF", &off, err, errlen) || dsc_parse_off("DSPARK_CUDA_ON", &on, err, errlen))
        return NULL;
    const char *tr = getenv("DSPARK_CUDA_TRACE");
    if (tr && *tr && strcmp(tr, "0") && strcmp(tr, "1")) {   /* a typo would silently trace nothing */
        ds_errf(err, errlen, "cuda: DSPARK_CUDA_TRACE: '%.32s' is neither 0 nor 1", tr);
        return NULL;
    }
    /* the tensor-core Q8_0 tile height, forced (an A/B aid; unset = chosen per call) */
    const char *mt = getenv("DSPARK_CUDA_MMA");
    int mma_bm = 0;
    if (mt && *mt) {
        mma_bm = !strcmp(mt, "16") ? 16 : !strcmp(mt, "32") ? 32 : !strcmp(mt, "64") ? 64 : !strcmp(mt, "128") ? 128 : -1;
        if (mma_bm < 0) {
            ds_errf(err, errlen, "cuda: DSPARK_CUDA_MMA: '%.32s' is none of 16, 32, 64, 128", mt);
            return NULL;
        }
    }
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e == cudaErrorInsufficientDriver) {
        int rt = 0, drv = 0;
        cudaRuntimeGetVersion(&rt);
        cudaDriverGetVersion(&drv);
        if (drv == 0) {
            ds_errf(err, errlen, "cuda: no NVIDIA driver found (no GPU on this machine?)");
            return NULL;
        }
        ds_errf(err, errlen,
                "cuda: the NVIDIA driver (CUDA %d.%d) is older than this build's CUDA runtime (%d.%d)",
                drv / 1000, drv % 1000 / 10, rt / 1000, rt % 1000 / 10);
        return NULL;
    }
    if (e == cudaErrorNoDevice || (e == cudaSuccess && n == 0)) {
        ds_errf(err, errlen, "cuda: no CUDA GPU found");
        return NULL;
    }
    if (e != cudaSuccess) {
        ds_errf(err, errlen, "cuda: cannot initialise CUDA: %s", cudaGetErrorString(e));
        return NULL;
    }
    cudaDeviceProp p;
    e = cudaGetDeviceProperties(&p, 0);
    if (e == cudaSuccess && p.major < 9) {
        ds_errf(err, errlen, "cuda: %s is compute capability %d.%d; this build runs on 9.0 (Hopper) or newer",
                p.name, p.major, p.minor);
        return NULL;
    }
    if (e == cudaSuccess) e = cudaSetDevice(0);
    if (e == cudaSuccess) e = cudaFree(0);                  /* create the context now */
    dsc_backend *b = (dsc_backend *)calloc(1, sizeof *b);
    ds_backend *be = (ds_backend *)calloc(1, sizeof *be);
    if (e == cudaSuccess && (!b || !be)) e = cudaErrorMemoryAllocation;
    if (e == cudaSuccess) e = cudaStreamCreateWithFlags(&b->aux, cudaStreamNonBlocking);
    if (e == cudaSuccess) e = dsc_matmul_q8_0_init();
    if (e == cudaSuccess) e = dsc_q8_mma_init();
    if (e == cudaSuccess) e = dsc_kq_mma_init();
    if (e == cudaSuccess) e = dsc_matmul_dense_init();
    if (e == cudaSuccess) e = dsc_attention_init();
    if (e != cudaSuccess) {
        ds_errf(err, errlen, "cuda: cannot start the GPU: %s", cudaGetErrorString(e));
        if (b && b->aux) cudaStreamDestroy(b->aux);
        free(b);
        free(be);
        return NULL;
    }
    b->device = 0;
    b->n_sm = p.multiProcessorCount;
    /* measured slower on the H200 (bench/cuda_ab.sh): the residual
     * epilogue's last block runs serially behind the whole grid (tiny
     * decode 1.20x, 8B decode ~1.2x slower), so it is opt-in; so is the
     * Q8_0 GEMV's lane sharing on short rows (run s18: canonical+direct
     * 2.35x plain with it, 2.47x without, interleaved) */
    /* DSPARK_CUDA_ON=stream puts the warp-streamed tensor-core GEMV at
     * every M <= 16, not only where it measured faster (dsc_q8_stream_ok) */
    b->stream_all = (on & DSC_OFF_STREAM) != 0;
    b->tile_all = (on & DSC_OFF_TILE) != 0;
    /* the MoE experts by id (moe.cu, DSPARK_CUDA_ON=moeid) are opt-in
     * until a benchmark has shown them no slower than the host grouping:
     * make test-cuda has run them (session 37, an H100: the same bits),
     * bench/moe_cuda.sh AB=1 has not yet. The tile path for several
     * sequences' runs (att_tile_runs) is on: the same run, 4 x 2000-token
     * prompts in one forward 1915 -> 919 ms (bench/results/cuda-s37-runs-h100.txt) */
    /* rope scaling (rope.cu's scaled tables) and --tp ranks on the device
     * (tp.c's dev communicator) were written in session 37, whose GPU ran
     * only before they landed: opt-in (DSPARK_CUDA_ON=ropeext,tp) until make
     * test-cuda has run cli_rope and tp_cli on one */
    b->off = (off | DSC_OFF_EPILOGUE | DSC_OFF_SPREAD | DSC_OFF_MOEID | DSC_OFF_ROPEEXT | DSC_OFF_TP) & ~on;
    b->trace = tr && !strcmp(tr, "1");
    b->mma_bm = mma_bm;
    be->i = &dsc_iface;
    be->priv = b;
    return be;
}
