/* backend.c — the backend registry and what every backend shares: device
 * constants and the KV cache object, built on the table's buffer ops. */
#include "backend.h"

#include <stdlib.h>

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

ds_backend *ds_backend_new(const char *name, char *err, size_t errlen) {
    if (!name || !strcmp(name, "cpu")) return ds_backend_cpu_new(err, errlen);
#ifdef DS_HAVE_CUDA
    if (!strcmp(name, "cuda")) return ds_backend_cuda_new(err, errlen);
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
    float *h = malloc(((size_t)rows + 2) * (size_t)n * sizeof(float));
    int32_t *ids = malloc((size_t)rows * sizeof(int32_t));
    if (!h || !ids) {
        free(h); free(ids);
        ds_errf(err, errlen, "select: out of host memory for %d rows of %d logits", rows, n);
        return -1;
    }
    b->download(ex, h, x, (size_t)rows * n * sizeof(float));
    float *sc = h + (size_t)rows * n;
    for (int r = 0; r < rows; r++) {
        int32_t t = ds_sample(smp, h + (size_t)r * n, n, pos0 + r, sc);
        ids[r] = t >= 0 ? t : (int32_t)ds_argmax(h + (size_t)r * n, n);
    }
    b->upload(ex, out, ids, (size_t)rows * sizeof(int32_t));
    int rc = b->sync(ex, err, errlen);
    free(h); free(ids);
    return rc;
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
