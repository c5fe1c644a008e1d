/* rstate.c — per-sequence recurrent states: two buffers and a log of the
 * last run's inputs (rstate.h). The replay itself runs the gdn kernels and
 * lives with the layer (layer_hybrid.c ds_gdn_replay). */
#include "rstate.h"

#include <stdlib.h>

int ds_rstate_init(ds_rstate *r, ds_backend *be, int n_slot, int cap, int n_rec, size_t conv_n, size_t ssm_n,
                   size_t log_row, int m_max, char *err, size_t errlen) {
    memset(r, 0, sizeof *r);
    if (n_slot < 1 || cap < 1 || cap > 4096 || n_rec < 1 || m_max < 1 || log_row < 1) {
        ds_errf(err, errlen, "recurrent state: bad shape (%d slots, %d logged rows, %d layers)", n_slot, cap, n_rec);
        return -1;
    }
    const size_t state_n = (size_t)n_rec * (conv_n + ssm_n);
    const size_t total = state_n * 2 * (size_t)n_slot;
    const size_t log_n = (size_t)n_slot * (size_t)n_rec * (size_t)cap * log_row;
    if (state_n == 0 || total / 2 / (size_t)n_slot != state_n || total > SIZE_MAX / sizeof(float) / 4 ||
        log_n / log_row / (size_t)cap / (size_t)n_rec != (size_t)n_slot || log_n > SIZE_MAX / sizeof(float) / 4) {
        ds_errf(err, errlen, "recurrent state: %d slots x %zu floats is out of range", n_slot, state_n);
        return -1;
    }
    r->be = be;
    r->n_slot = n_slot;
    r->cap = cap;
    r->n_rec = n_rec;
    r->conv_n = conv_n;
    r->ssm_n = ssm_n;
    r->state_n = state_n;
    r->log_row = log_row;
    r->m_max = m_max;
    r->mem = be->i->alloc(be, total * sizeof(float));
    r->log = be->i->alloc(be, log_n * sizeof(float));
    r->cur = calloc((size_t)n_slot, sizeof(int));
    r->pos = calloc((size_t)n_slot, sizeof(int));
    r->base = calloc((size_t)n_slot, sizeof(int));
    r->n_log = calloc((size_t)n_slot, sizeof(int));
    r->var = calloc((size_t)n_slot, 1);
    r->ptrs = calloc(2 * (size_t)m_max, sizeof(float *));
    if (!r->mem || !r->log || !r->cur || !r->pos || !r->base || !r->n_log || !r->var || !r->ptrs) {
        ds_errf(err, errlen, "recurrent state: out of %s memory for %zu MiB (%d sequences)", be->i->name,
                ((total + log_n) * sizeof(float)) >> 20, n_slot);
        ds_rstate_free(r);
        return -1;
    }
    return 0;
}

void ds_rstate_free(ds_rstate *r) {
    if (r->mem) r->be->i->release(r->be, r->mem);
    if (r->log) r->be->i->release(r->be, r->log);
    free(r->cur);
    free(r->pos);
    free(r->base);
    free(r->n_log);
    free(r->var);
    free(r->ptrs);
    memset(r, 0, sizeof *r);
}

int ds_rstate_has(const ds_rstate *r, int s, int n) {
    if (n == 0 || n == r->pos[s]) return 1;
    if (r->pos[s] == 0 || n < r->base[s] || n > r->pos[s]) return 0;
    return n == r->base[s] || n - r->base[s] <= r->n_log[s];   /* the checkpoint, or replayable */
}

void ds_rstate_reset(ds_rstate *r, int s) {
    r->pos[s] = r->base[s] = 0;
    r->n_log[s] = -1;
}

void ds_rstate_commit(ds_rstate *r, int s, int p0, int p1, int v) {
    const int n = p1 - p0 + 1;
    r->cur[s] = !r->cur[s];
    r->base[s] = p0;
    r->n_log[s] = n <= r->cap ? n : -1;
    r->var[s] = (uint8_t)v;
    r->pos[s] = p1 + 1;
}

int ds_rstate_copy(ds_rstate *r, ds_exec *ex, int dst, int src, int n, char *err, size_t errlen) {
    ds_rstate_reset(r, dst);
    if (n == 0) return 0;
    int b;
    if (n == r->pos[src]) b = r->cur[src];
    else if (n == r->base[src] && r->pos[src] > 0) b = !r->cur[src];
    else {
        ds_errf(err, errlen, "recurrent state: sequence %d holds the state after %d positions (checkpoint %d), not %d",
                src, r->pos[src], r->base[src], n);
        return -1;
    }
    r->be->i->copy(ex, ds_rstate_buf(r, dst, r->cur[dst], 0), ds_rstate_buf(r, src, b, 0), r->state_n * sizeof(float));
    r->pos[dst] = r->base[dst] = n;
    r->n_log[dst] = 0;
    return 0;
}

/* ---- snapshots: both buffers then the log ------------------------------- */
int ds_rstate_save(const ds_rstate *r, ds_exec *ex, int s, ds_rstate_snap *out) {
    const size_t sn = 2 * r->state_n, ln = (size_t)r->n_rec * (size_t)r->cap * r->log_row;
    out->data = malloc((sn + ln) * sizeof(float));
    if (!out->data) return -1;
    r->be->i->download(ex, out->data, ds_rstate_buf(r, s, 0, 0), sn * sizeof(float));
    r->be->i->download(ex, out->data + sn, ds_rstate_log(r, s, 0, 0), ln * sizeof(float));
    out->n = sn + ln;
    out->cur = r->cur[s];
    out->pos = r->pos[s];
    out->base = r->base[s];
    out->n_log = r->n_log[s];
    out->var = r->var[s];
    return 0;
}

void ds_rstate_load(ds_rstate *r, ds_exec *ex, int s, const ds_rstate_snap *snap) {
    const size_t sn = 2 * r->state_n;
    r->be->i->upload(ex, ds_rstate_buf(r, s, 0, 0), snap->data, sn * sizeof(float));
    r->be->i->upload(ex, ds_rstate_log(r, s, 0, 0), snap->data + sn, (snap->n - sn) * sizeof(float));
    r->cur[s] = snap->cur;
    r->pos[s] = snap->pos;
    r->base[s] = snap->base;
    r->n_log[s] = snap->n_log;
    r->var[s] = (uint8_t)snap->var;
}

void ds_rstate_snap_free(ds_rstate_snap *snap) {
    free(snap->data);
    memset(snap, 0, sizeof *snap);
}
