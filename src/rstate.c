/* rstate.c — the per-sequence ring of recurrent states (rstate.h). */
#include "rstate.h"

#include <stdlib.h>

int ds_rstate_init(ds_rstate *r, ds_backend *be, int n_slot, int ring, int n_rec, size_t conv_n, size_t ssm_n,
                   int m_max, char *err, size_t errlen) {
    memset(r, 0, sizeof *r);
    if (n_slot < 1 || ring < 2 || ring > 4096 || n_rec < 1 || m_max < 1) {
        ds_errf(err, errlen, "recurrent state: bad shape (%d slots, ring %d, %d layers)", n_slot, ring, n_rec);
        return -1;
    }
    const size_t state_n = (size_t)n_rec * (conv_n + ssm_n);
    const size_t total = state_n * (size_t)ring * (size_t)n_slot;
    if (state_n == 0 || total / (size_t)n_slot / (size_t)ring != state_n || total > SIZE_MAX / sizeof(float) / 2) {
        ds_errf(err, errlen, "recurrent state: %d slots x %d states x %zu floats is out of range", n_slot, ring, state_n);
        return -1;
    }
    r->be = be;
    r->n_slot = n_slot;
    r->ring = ring;
    r->n_rec = n_rec;
    r->conv_n = conv_n;
    r->ssm_n = ssm_n;
    r->state_n = state_n;
    r->m_max = m_max;
    r->mem = be->i->alloc(be, total * sizeof(float));
    r->pos = calloc((size_t)n_slot, sizeof(int));
    r->lo = calloc((size_t)n_slot, sizeof(int));
    r->ptrs = calloc(2 * (size_t)m_max, sizeof(float *));
    if (!r->mem || !r->pos || !r->lo || !r->ptrs) {
        ds_errf(err, errlen, "recurrent state: out of %s memory for %zu MiB (%d sequences x %d states)", be->i->name,
                (total * sizeof(float)) >> 20, n_slot, ring);
        ds_rstate_free(r);
        return -1;
    }
    return 0;
}

void ds_rstate_free(ds_rstate *r) {
    if (r->mem) r->be->i->release(r->be, r->mem);
    free(r->pos);
    free(r->lo);
    free(r->ptrs);
    memset(r, 0, sizeof *r);
}

int ds_rstate_has(const ds_rstate *r, int s, int n) {
    if (n == 0) return 1;
    return n <= r->pos[s] && n - 1 >= r->lo[s];
}

int ds_rstate_rewind(ds_rstate *r, int s, int n, char *err, size_t errlen) {
    if (n == r->pos[s]) return 0;
    if (!ds_rstate_has(r, s, n)) {
        if (r->pos[s] > 0)
            ds_errf(err, errlen, "recurrent state: position %d of sequence %d is gone (held: after %d..%d; the last %d are kept)",
                    n, s, r->lo[s] + 1, r->pos[s], r->ring);
        else
            ds_errf(err, errlen, "recurrent state: sequence %d holds no state, not the one after %d positions", s, n);
        return -1;
    }
    r->pos[s] = n;
    if (n == 0) r->lo[s] = 0;
    return 0;
}

void ds_rstate_reset(ds_rstate *r, int s) { r->pos[s] = r->lo[s] = 0; }

void ds_rstate_commit(ds_rstate *r, int s, int p0, int p1) {
    /* kept: [max(p0, p1 - ring + 1), p1]; of the older ones, those less
     * than ring before p1 were not overwritten (rstate.h) */
    const int oldest = p1 - r->ring + 1;
    int lo = p0 == 0 ? 0 : r->lo[s];
    if (lo < oldest) lo = oldest;
    r->lo[s] = lo;
    r->pos[s] = p1 + 1;
}

int ds_rstate_copy(ds_rstate *r, ds_exec *ex, int dst, int src, int n, char *err, size_t errlen) {
    if (!ds_rstate_has(r, src, n)) {
        ds_errf(err, errlen, "recurrent state: sequence %d does not hold the state after %d positions", src, n);
        return -1;
    }
    ds_rstate_reset(r, dst);
    if (n == 0) return 0;
    r->be->i->copy(ex, ds_rstate_at(r, dst, n - 1, 0), ds_rstate_at(r, src, n - 1, 0), r->state_n * sizeof(float));
    r->pos[dst] = n;
    r->lo[dst] = n - 1;
    return 0;
}

int ds_rstate_save(const ds_rstate *r, ds_exec *ex, int s, ds_rstate_snap *out) {
    const size_t n = (size_t)r->ring * r->state_n;
    out->data = malloc(n * sizeof(float));
    if (!out->data) return -1;
    r->be->i->download(ex, out->data, ds_rstate_at(r, s, 0, 0), n * sizeof(float));
    out->n = n;
    out->pos = r->pos[s];
    out->lo = r->lo[s];
    return 0;
}

void ds_rstate_load(ds_rstate *r, ds_exec *ex, int s, const ds_rstate_snap *snap) {
    r->be->i->upload(ex, ds_rstate_at(r, s, 0, 0), snap->data, snap->n * sizeof(float));
    r->pos[s] = snap->pos;
    r->lo[s] = snap->lo;
}

void ds_rstate_snap_free(ds_rstate_snap *snap) {
    free(snap->data);
    memset(snap, 0, sizeof *snap);
}
