/* round_min.c — the phases of one speculative round on the CPU, each the
 * MINIMUM over N repetitions (a shared machine's preemptions and cache
 * storms only ever add time, so the minimum is the steadiest estimate it
 * gives; `dspark bench --profile-round` reports medians instead):
 *   decode   one decode step as plain generation runs it (select on device);
 *   draft    ds_draft of gamma slots with confidences (as spec.c asks);
 *   verify   the selecting forward of gamma + 1 rows, taps kept;
 *   commit   the drafter's context append of 4 rows (about the shipped
 *            pair's tokens per round).
 * Prints one key=value line with the round (draft + verify + commit) in
 * decode steps: the tokens per round speculation needs to break even.
 *
 *   build/bench/round_min TARGET.gguf DRAFTER.gguf THREADS [REPS=200]
 *
 * It uses the library's internal API only (no CLI), so the same source
 * links against an older build's libdspark.a for an A/B of the kernels
 * (bench/results/cpu2-ab.txt). */
#include "backend.h"
#include "drafter.h"
#include "model.h"

#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

#define PREFIX 64
#define CK(x) do { if (x) { fprintf(stderr, "round_min: %s\n", err); goto out; } } while (0)

int main(int argc, char **argv) {
    if (argc < 4) {
        fprintf(stderr, "usage: round_min TARGET.gguf DRAFTER.gguf THREADS [REPS]\n");
        return 2;
    }
    char err[512] = "";
    const int nt = atoi(argv[3]), reps = argc > 4 ? atoi(argv[4]) : 200;
    int rc = 1;
    ds_model *m = NULL;
    ds_ctx *c = NULL;
    ds_drafter *d = NULL;
    ds_dctx *x = NULL;
    float *taps = NULL, *vt = NULL;
    if (nt < 1 || reps < 1) { fprintf(stderr, "round_min: THREADS and REPS must be >= 1\n"); return 2; }
    m = ds_model_load(argv[1], err, sizeof err);
    if (!m) { fprintf(stderr, "round_min: %s\n", err); return 1; }
    c = ds_ctx_new(m, 256, nt, err, sizeof err);
    if (!c) { fprintf(stderr, "round_min: %s\n", err); goto out; }
    d = ds_drafter_load(argv[2], m, err, sizeof err);
    if (!d) { fprintf(stderr, "round_min: %s\n", err); goto out; }
    const int G = ds_drafter_block_size(d), D = m->hp.n_embd, ntp = ds_drafter_n_taps(d), V = m->hp.n_vocab;
    if (G > 63) { fprintf(stderr, "round_min: block size %d > 63\n", G); goto out; }
    CK(ds_set_taps(c, ds_drafter_tap_layers(d), ntp, err, sizeof err));
    x = ds_dctx_new(d, 256, ds_ctx_exec(c), err, sizeof err);
    if (!x) { fprintf(stderr, "round_min: %s\n", err); goto out; }
    int32_t toks[PREFIX + 1];
    for (int i = 0; i <= PREFIX; i++) toks[i] = (int32_t)((i * 7919 + 13) % V);   /* fixed pseudo-text */
    ds_backend *be = m->be;
    taps = malloc((size_t)PREFIX * ntp * D * sizeof(float));
    vt = be->i->alloc(be, (size_t)(G + 1) * ntp * D * sizeof(float));
    if (!taps || !vt) { fprintf(stderr, "round_min: out of memory\n"); goto out; }
    int32_t ids[64], vtok[64], vsel[64], y1;
    float conf[64];
    const ds_sampler samp = {0};
    CK(ds_kv_truncate(c, 0));
    CK(ds_forward_batch(c, toks, PREFIX, 0, DS_LOGITS_NONE, NULL, taps, err, sizeof err));
    CK(ds_dctx_append(x, taps, PREFIX, 0, err, sizeof err));
    const ds_draft_opts o = {&samp, G};
    double best[4] = {1e9, 1e9, 1e9, 1e9};
    for (int r = 0; r < reps; r++) {
        double t0, t;
        CK(ds_kv_truncate(c, PREFIX));
        const ds_select_opts so1 = {1, DS_LOGITS_LAST, &samp, &y1, NULL, NULL, NULL, 0, NULL, 0};
        t0 = now();
        CK(ds_forward_select(c, toks + PREFIX, 1, PREFIX, &so1, err, sizeof err));
        if ((t = now() - t0) < best[0]) best[0] = t;
        t0 = now();
        CK(ds_draft(x, toks[PREFIX], PREFIX, &o, ids, conf, NULL, err, sizeof err));
        if ((t = now() - t0) < best[1]) best[1] = t;
        CK(ds_kv_truncate(c, PREFIX));
        vtok[0] = toks[PREFIX];
        for (int i = 0; i < G; i++) vtok[i + 1] = ids[i];
        const ds_select_opts sov = {0, DS_LOGITS_ALL, &samp, vsel, vt, NULL, NULL, 0, NULL, 0};
        t0 = now();
        CK(ds_forward_select(c, vtok, G + 1, PREFIX, &sov, err, sizeof err));
        if ((t = now() - t0) < best[2]) best[2] = t;
        CK(ds_kv_truncate(c, PREFIX + 4));
        CK(ds_dctx_truncate(x, PREFIX));
        t0 = now();
        CK(ds_dctx_append_dev(x, vt, 4, PREFIX, err, sizeof err));
        if ((t = now() - t0) < best[3]) best[3] = t;
        CK(ds_dctx_truncate(x, PREFIX));
    }
    printf("threads=%d decode_us=%.1f draft_us=%.1f verify%d_us=%.1f commit4_us=%.1f draft/dec=%.3f verify/dec=%.3f "
           "round/dec=%.3f\n", nt, best[0] * 1e6, best[1] * 1e6, G + 1, best[2] * 1e6, best[3] * 1e6,
           best[1] / best[0], best[2] / best[0], (best[1] + best[2] + best[3]) / best[0]);
    rc = 0;
out:
    if (vt) m->be->i->release(m->be, vt);
    free(taps);
    ds_dctx_free(x);
    ds_drafter_free(d);
    ds_ctx_free(c);
    ds_model_free(m);
    return rc;
}
