/* backend.c — the backend registry and what every backend shares: device
 * constants and the KV cache object, built on the table's buffer ops. */
#include "backend.h"

#include <stdio.h>
#include <stdlib.h>
#ifdef DS_HAVE_CUDA
#include <dlfcn.h>
#include <unistd.h>
#endif

/* ========================================================================
 * Registry
 * ===================================================================== */

const char *ds_backend_names(void) {
#ifdef DS_HAVE_CUDA
    return "cpu,cuda";
#else
    return "cpu";
#endif
}

#ifdef DS_HAVE_CUDA
/* ---- the CUDA backend is a module: libdspark-cuda.so, loaded on first use --
 * so that the library and the CLI start with no CUDA library mapped when the
 * CPU is asked for, and on a machine without CUDA at all. Where it is looked
 * for: $DSPARK_CUDA_MODULE, next to the binary or library this code is in
 * (build/dspark -> build/, PREFIX/lib/libdspark.so -> PREFIX/lib/), its
 * ../lib, then the loader's own search path. The module was built from the
 * same sources as this code: its version and its table's size must match.
 * Once loaded it stays (RTLD_NODELETE), as the CUDA context it makes does. */
typedef ds_backend *(*cuda_new_fn)(char *err, size_t errlen);
typedef const char *(*cuda_abi_fn)(size_t *table_size);

static void *cuda_open(const char *path, char *tried, size_t tried_len) {
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE);
    if (!h) {
        const size_t used = strlen(tried);
        const char *why = dlerror();
        if (used + 8 < tried_len)
            snprintf(tried + used, tried_len - used, "%s%.300s (%.120s)", used ? "; " : "", path, why ? why : "not loadable");
    }
    return h;
}

static ds_backend *cuda_module_new(char *err, size_t errlen) {
    char tried[1024] = "", path[4096], self[4096] = "";
    void *h = NULL;
    const char *env = getenv("DSPARK_CUDA_MODULE");
    if (env && *env) h = cuda_open(env, tried, sizeof tried);
    else {
        Dl_info di;
        if (dladdr((void *)cuda_module_new, &di) && di.dli_fname && strchr(di.dli_fname, '/'))
            snprintf(self, sizeof self, "%s", di.dli_fname);
        else {
            ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
            self[n > 0 ? n : 0] = 0;
        }
        char *slash = strrchr(self, '/');
        if (slash) {
            *slash = 0;
            snprintf(path, sizeof path, "%s/libdspark-cuda.so", self);
            h = cuda_open(path, tried, sizeof tried);
            if (!h) {
                snprintf(path, sizeof path, "%s/../lib/libdspark-cuda.so", self);
                h = cuda_open(path, tried, sizeof tried);
            }
        }
        if (!h) h = cuda_open("libdspark-cuda.so", tried, sizeof tried);
    }
    if (!h) {
        ds_errf(err, errlen, "cuda: the CUDA module libdspark-cuda.so cannot be loaded (tried %s)", tried);
        return NULL;
    }
    cuda_new_fn fn = (cuda_new_fn)dlsym(h, "ds_backend_cuda_new");
    cuda_abi_fn abi = (cuda_abi_fn)dlsym(h, "ds_cuda_module_abi");
    size_t table = 0;
    const char *version = abi ? abi(&table) : NULL;
    if (!fn || !version || strcmp(version, DSPARK_VERSION_STRING) || table != sizeof(ds_backend_i)) {
        ds_errf(err, errlen, "cuda: the CUDA module is not this build's (version %s, table %zu bytes; this build: %s, %zu)",
                version ? version : "?", table, DSPARK_VERSION_STRING, sizeof(ds_backend_i));
        return NULL;
    }
    return fn(err, errlen);
}
#endif

ds_backend *ds_backend_new(const char *name, char *err, size_t errlen) {
    if (!name || !strcmp(name, "cpu")) return ds_backend_cpu_new(err, errlen);
#ifdef DS_HAVE_CUDA
    if (!strcmp(name, "cuda")) return cuda_module_new(err, errlen);
#endif
    char clean[64];   /* echo printable ASCII only: one line, no escapes */
    size_t j = 0;
    for (const char *p = name; *p && j + 1 < sizeof clean; p++)
        clean[j++] = (*p >= 0x20 && *p < 0x7f) ? *p : '?';
    clean[j] = 0;
    ds_errf(err, errlen, "unknown device '%s' (this build has: %s)", clean, ds_backend_names());
    return NULL;
}

void ds_backend_free(ds_backend *be) {
    if (be) be->i->destroy(be);
}

/* ========================================================================
 * Token selection and capabilities
 * ===================================================================== */

void ds_backend_copy2d(ds_exec *ex, void *dst, size_t dpitch, const void *src, size_t spitch, size_t width,
                       size_t rows) {
    const ds_backend_i *b = ex->be->i;
    if (!rows || !width) return;
    if (b->copy2d) { b->copy2d(ex, dst, dpitch, src, spitch, width, rows); return; }
    for (size_t r = 0; r < rows; r++)
        b->copy(ex, (char *)dst + r * dpitch, (const char *)src + r * spitch, width);
}

void ds_backend_copy_n(ds_exec *ex, int n, void *const dst[], const void *const src[], const size_t bytes[]) {
    const ds_backend_i *b = ex->be->i;
    if (b->copy_n && n > 1 && n <= DS_COPY_N_MAX) { b->copy_n(ex, n, dst, src, bytes); return; }
    for (int i = 0; i < n; i++)
        if (bytes[i]) b->copy(ex, dst[i], src[i], bytes[i]);
}

int ds_backend_has_heads(const ds_backend *be) {
    const ds_backend_i *b = be->i;
    return b->embed && b->argmax && b->add && b->fill && b->gate && b->sample;
}

/* Selection on the host: the rows downloaded (a host-memory backend's are
 * copied, so the caller's logits stay as they were), each row through the
 * logits processor when there is one, ds_sample, the ids uploaded. Row r
 * (of these rows) has the extra history extra[0..base + r). */
static int select_on_host(ds_exec *ex, const ds_sampler *smp, const ds_lproc *lp, const int32_t *extra, int base,
                          int rows, int n, const float *x, int64_t pos0, int32_t *out, char *err, size_t errlen) {
    const ds_backend_i *b = ex->be->i;
    float *h = malloc(((size_t)rows + 2) * (size_t)n * sizeof(float));
    int32_t *ids = malloc((size_t)rows * sizeof(int32_t));
    if (!h || !ids) {
        free(h); free(ids);
        ds_errf(err, errlen, "select: out of host memory for %d rows of %d logits", rows, n);
        return -1;
    }
    b->download(ex, h, x, (size_t)rows * n * sizeof(float));
    float *sc = h + (size_t)rows * n;
    int rc = 0;
    for (int r = 0; r < rows && !rc; r++) {
        float *row = h + (size_t)r * n;
        if (lp && lp->apply(lp->user, pos0 + r, extra, base + r, row, n)) {
            ds_errf(err, errlen, "select: the logits processor failed at position %lld", (long long)(pos0 + r));
            rc = -1;
            break;
        }
        int32_t t = ds_sample(smp, row, n, pos0 + r, sc);
        ids[r] = t >= 0 ? t : (int32_t)ds_argmax(row, n);
        if (lp && lp->selected) lp->selected(lp->user, pos0 + r, ids[r]);
    }
    if (!rc) {
        b->upload(ex, out, ids, (size_t)rows * sizeof(int32_t));
        rc = b->sync(ex, err, errlen);
    }
    free(h); free(ids);
    return rc;
}

int ds_backend_select(ds_exec *ex, const ds_sampler *smp, int rows, int n, const float *x, int64_t pos0,
                      float *scratch, int32_t *out, char *err, size_t errlen) {
    const ds_backend_i *b = ex->be->i;
    if (rows <= 0) return 0;
    if (!smp || !(smp->temp > 0.0f)) {               /* ds_sample's greedy rule */
        b->argmax(ex, rows, n, x, out);
        return 0;
    }
    if (b->sample && b->sample(ex, smp, rows, n, x, pos0, scratch, out) == 0) return 0;
    /* the device declined: select on the host from downloaded rows */
    return select_on_host(ex, smp, NULL, NULL, 0, rows, n, x, pos0, out, err, errlen);
}

int ds_backend_select_lp(ds_exec *ex, const ds_sampler *smp, const ds_lproc *lp, const int32_t *extra, int base,
                         int rows, int n, const float *x, int64_t pos0, int32_t *out, char *err, size_t errlen) {
    if (rows <= 0) return 0;
    if (!lp) { ds_errf(err, errlen, "select: no logits processor given"); return -1; }
    return select_on_host(ex, smp, lp, extra, base, rows, n, x, pos0, out, err, errlen);
}

/* ========================================================================
 * Constants on the device
 * ===================================================================== */

void *ds_backend_const(ds_backend *be, ds_exec *ex, const void *host, size_t bytes) {
    if (be->i->host_memory) return (void *)host;
    void *d = be->i->alloc(be, bytes ? bytes : 1);
    if (d && bytes) be->i->upload(ex, d, host, bytes);
    return d;
}

void ds_backend_const_free(ds_backend *be, void *dev, const void *host) {
    if (dev && dev != host) be->i->release(be, dev);
}

uint64_t ds_backend_mem_free(ds_backend *be) { return be->i->mem_free ? be->i->mem_free(be) : 0; }

uint64_t ds_host_mem_available(void) {
    FILE *f = fopen("/proc/meminfo", "r");
    if (!f) return 0;
    char line[256];
    unsigned long long kb = 0;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "MemAvailable: %llu kB", &kb) == 1) break;
    fclose(f);
    return (uint64_t)kb * 1024u;
}

int ds_backend_path_on(ds_backend *be, const char *name) {
    return !be->i->path_on || be->i->path_on(be, name);
}

int ds_backend_chunk_rows(ds_backend *be) {
    const int n = be->i->chunk_rows ? be->i->chunk_rows(be) : DS_CHUNK_ROWS_DEFAULT;
    return n >= 1 && n <= 8192 ? n : DS_CHUNK_ROWS_DEFAULT;
}
