/* cmd_bench_profile.c — `dspark bench --profile`: where the time of one
 * decode step, one 8-row verify and one drafting round goes.
 *
 *   forward     the real forward, timed between its probe checkpoints (the
 *               diagnostics' hook fires right after each op, so the time
 *               from one checkpoint to the next is the op(s) in between):
 *               microseconds per family and per layer, decode vs verify(8),
 *               and the pool's hand-offs, inline runs and sleeps per step;
 *   kernels     each distinct matmul of the model alone at M = 1..16,
 *               canonical and fast: microseconds, int8/f32 multiply-adds per
 *               second and weight bytes per second, to set against
 *               build/bench/roofline's ceilings;
 *   draft       (with -md) one drafting round against one decode step, and
 *               the drafter's LM head as one M = gamma matmul.
 * Medians of --reps; everything on stdout as key=value lines and tables. */
#include "cli.h"
#include "drafter.h"
#include "model.h"
#include "sampler.h"
#include "dspark_diag.h"
#include "backend.h"
#include "layer.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

/* With one thread the profile reads the thread's CPU clock: on a shared,
 * loaded machine the wall clock of a millisecond-long step includes other
 * processes' time slices, its CPU time does not (it still includes their
 * cache pollution). With more threads the wall clock (the workers' time is
 * not the caller's). */
static double pf_now(int cpu) {
    if (!cpu) return cli_now();
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* ---- timing probe ------------------------------------------------------------- */
enum { PF_EMBED, PF_MM_QKV, PF_QKNORM, PF_ROPE, PF_KVWRITE, PF_ATTN, PF_MM_O, PF_RESID, PF_MM_GATEUP,
       PF_SWIGLU, PF_MM_DOWN, PF_MOE_ROUTER, PF_MOE_EXPERTS, PF_TAP, PF_LMHEAD, PF_OTHER, PF_COUNT };
static const char *k_pf_name[PF_COUNT] = {
    "embed+norm0", "matmul q,k,v", "rmsnorm q,k", "rope q,k", "kv write", "attention", "matmul o",
    "residual+norm", "matmul gate,up", "swiglu", "matmul down", "moe router+route", "moe experts",
    "taps", "lm head", "other"};
#define PF_MAX_LAYERS 256

typedef struct {
    int cpu;            /* pf_now's clock */
    double last;
    int64_t last_key;
    double fam[PF_COUNT];
    double layer[PF_MAX_LAYERS];
    int moe_layer;      /* the layer whose router was last reported (MoE) */
} pf_state;

static int pf_family(int cp, int sub) {
    switch (cp) {
    case DSD_CP_ATTN_NORM: return PF_EMBED;
    case DSD_CP_QKV:
        return sub == DSD_SUB_Q_PROJ ? PF_MM_QKV : sub == DSD_SUB_Q_NORM ? PF_QKNORM
             : sub == DSD_SUB_Q_ROPE ? PF_ROPE : PF_OTHER;
    case DSD_CP_KV_WRITE: return PF_KVWRITE;
    case DSD_CP_ATTN_HEADS: return PF_ATTN;
    case DSD_CP_ATTN_OUT_PROJ: return PF_MM_O;
    case DSD_CP_ATTN_RESIDUAL: case DSD_CP_LAYER_OUT: return PF_RESID;
    case DSD_CP_FFN_GATE_UP:
        return sub == DSD_SUB_FFN_GATE ? PF_MM_GATEUP : sub == DSD_SUB_MOE_LOGITS ? PF_MOE_ROUTER : PF_OTHER;
    case DSD_CP_FFN_ACT: return PF_SWIGLU;
    case DSD_CP_FFN_DOWN: return PF_MM_DOWN;
    case DSD_CP_TAP: return PF_TAP;
    case DSD_CP_LOGITS: return PF_LMHEAD;
    default: return PF_OTHER;
    }
}

/* The first call of a (layer, checkpoint, subobject) burst closes the
 * segment that ran since the previous burst; the burst's other rows and
 * heads cost nothing to the segment. */
static void pf_probe(void *user, int pos, int layer, int cp, int sub, unsigned fams, const float *data, size_t n) {
    (void)pos; (void)fams; (void)data; (void)n;
    pf_state *s = user;
    const int64_t key = ((int64_t)(layer + 2) << 40) | ((int64_t)cp << 32) | (uint32_t)sub;
    if (key == s->last_key) return;
    if (sub >= (int)DSD_SUB_HEAD_BASE && s->last_key >> 32 == key >> 32) return;   /* next head */
    const double t = pf_now(s->cpu), dt = t - s->last;
    s->last = t;
    s->last_key = key;
    /* a MoE layer's FFN_DOWN closes its experts and the combine */
    if (cp == DSD_CP_FFN_GATE_UP && sub == DSD_SUB_MOE_LOGITS) s->moe_layer = layer;
    const int f = cp == DSD_CP_FFN_DOWN && layer == s->moe_layer ? PF_MOE_EXPERTS : pf_family(cp, sub);
    s->fam[f] += dt;
    if (layer >= 0 && layer < PF_MAX_LAYERS) s->layer[layer] += dt;
}


void cmd_bench_profile(ds_ctx *c, const char *drafter_path, const int32_t *toks, int prefix, long reps, float *logits,
                       int round_only);

#define CHECK(x) do { if (x) cli_die("bench", "%s", err); } while (0)

/* ---- the forward, segment by segment ------------------------------------------- */
static void profile_forward(ds_ctx *c, const int32_t *toks, int prefix, long reps, float *logits, int cpu) {
    const ds_model *m = ds_ctx_model(c);
    ds_pool *pool = ds_exec_cpu_pool(ds_ctx_exec(c));
    const int L = m->hp.n_layer < PF_MAX_LAYERS ? m->hp.n_layer : PF_MAX_LAYERS;
    char err[DS_ERRLEN];
    double *fam[2][PF_COUNT], *lay[2][PF_MAX_LAYERS], *tot[2];
    double st[2][3] = {{0}};
    for (int k = 0; k < 2; k++) {
        tot[k] = calloc((size_t)reps, sizeof(double));
        for (int f = 0; f < PF_COUNT; f++) fam[k][f] = calloc((size_t)reps, sizeof(double));
        for (int l = 0; l < L; l++) lay[k][l] = calloc((size_t)reps, sizeof(double));
    }
    ds_kernel_set canon;
    ds_kernel_set_all(&canon, DS_CANONICAL);
    ds_ctx_set_kernels(c, &canon);
    pf_state s;
    const ds_probe pr = {.wants = NULL, .fn = pf_probe, .user = &s, .stage = NULL};
    ds_ctx_set_probe(c, &pr);
    for (long r = 0; r < reps; r++)
        for (int k = 0; k < 2; k++) {        /* 0 = decode step, 1 = verify(8); interleaved */
            CHECK(ds_kv_truncate(c, prefix));
            memset(&s, 0, sizeof s);
            s.moe_layer = -2;
            s.cpu = cpu;
            s.last_key = -1;
            ds_pool_stats_t p0, p1;
            ds_pool_stats(pool, &p0);
            const double t0 = pf_now(cpu);
            s.last = t0;
            if (k == 0) CHECK(ds_decode(c, toks[prefix], prefix, logits, NULL, err, sizeof err));
            else CHECK(ds_forward_batch(c, toks + prefix, 8, prefix, DS_LOGITS_ALL, logits, NULL, err, sizeof err));
            tot[k][r] = pf_now(cpu) - t0;
            ds_pool_stats(pool, &p1);
            st[k][0] += (double)(p1.jobs - p0.jobs) / (double)reps;
            st[k][1] += (double)(p1.inline_runs - p0.inline_runs) / (double)reps;
            st[k][2] += (double)(p1.sleeps - p0.sleeps) / (double)reps;
            for (int f = 0; f < PF_COUNT; f++) fam[k][f][r] = s.fam[f];
            for (int l = 0; l < L; l++) lay[k][l][r] = s.layer[l];
        }
    ds_ctx_set_probe(c, NULL);
    const double td = cli_median(tot[0], (int)reps), tv = cli_median(tot[1], (int)reps);
    printf("\n== profile: one decode step vs one 8-row canonical verify (medians of %ld, interleaved) ==\n", reps);
    printf("%-16s %12s %12s %10s\n", "family", "decode_us", "verify8_us", "ratio");
    for (int f = 0; f < PF_COUNT; f++) {
        const double a = cli_median(fam[0][f], (int)reps), b = cli_median(fam[1][f], (int)reps);
        if (a < 5e-8 && b < 5e-8) continue;
        printf("%-16s %12.1f %12.1f %10.2f\n", k_pf_name[f], a * 1e6, b * 1e6, a > 0 ? b / a : 0.0);
    }
    printf("%-16s %12.1f %12.1f %10.2f\n", "total", td * 1e6, tv * 1e6, tv / td);
    printf("%-16s %12s %12s\n", "layer", "decode_us", "verify8_us");
    for (int l = 0; l < L; l++)
        printf("%-16d %12.1f %12.1f\n", l, cli_median(lay[0][l], (int)reps) * 1e6, cli_median(lay[1][l], (int)reps) * 1e6);
    printf("pool per decode step: handoffs=%.1f inline=%.1f sleeps=%.2f | per verify(8): handoffs=%.1f inline=%.1f sleeps=%.2f\n",
           st[0][0], st[0][1], st[0][2], st[1][0], st[1][1], st[1][2]);
    for (int k = 0; k < 2; k++) {
        free(tot[k]);
        for (int f = 0; f < PF_COUNT; f++) free(fam[k][f]);
        for (int l = 0; l < L; l++) free(lay[k][l]);
    }
}

/* ---- each matmul alone ------------------------------------------------------------ */
static size_t weight_bytes(const ds_weight *w) {
    int ok;
    return (size_t)ds_row_bytes(w->type, (uint64_t)w->n_in, &ok) * (size_t)w->n_out;
}

static void profile_kernels(ds_ctx *c, long reps, int cpu) {
    const ds_model *m = ds_ctx_model(c);
    ds_pool *pool = ds_exec_cpu_pool(ds_ctx_exec(c));
    const ds_layer *L = &m->layers[0];
    const int moe = L->n_expert > 0;     /* MoE: the router and expert 0 stand for the FFN */
    const struct { const char *name; const ds_weight *w; int per_layer; } mm[8] = {
        {"q", &L->wq, 1}, {"k", &L->wk, 1}, {"v", &L->wv, 1}, {"o", &L->wo, 1},
        {moe ? "router" : "gate", moe ? &L->gate_inp : &L->w_gate, 1}, {moe ? "exp_up" : "up", moe ? &L->exp_up[0] : &L->w_up, 1},
        {moe ? "exp_down" : "down", moe ? &L->exp_down[0] : &L->w_down, 1}, {"lm_head", &m->output, 0}};
    static const int widths[] = {1, 2, 4, 7, 8, 16};
    const int NW = (int)(sizeof widths / sizeof widths[0]);
    int64_t kmax = 0, nmax = 0;
    for (int i = 0; i < 8; i++) {
        if (mm[i].w->n_in > kmax) kmax = mm[i].w->n_in;
        if (mm[i].w->n_out > nmax) nmax = mm[i].w->n_out;
    }
    float *x = malloc((size_t)16 * (size_t)kmax * sizeof(float)), *y = malloc((size_t)16 * (size_t)nmax * sizeof(float));
    double *t = malloc((size_t)reps * sizeof(double));
    if (!x || !y || !t) cli_die("bench", "out of memory");
    for (int64_t i = 0; i < 16 * kmax; i++) x[i] = (float)((i * 37) % 101) / 50.0f - 1.0f;
    printf("\n== profile: each matmul alone (threads=%d, medians of %ld; MAC/s and weight GB/s to set against build/bench/roofline) ==\n",
           ds_pool_threads(pool), reps);
    printf("%-8s %5s %6s %6s %9s %3s %11s %11s %9s %9s %9s\n", "weight", "type", "K", "N", "MB", "M", "canon_us",
           "fast_us", "c/fast", "canon_GMAC", "canon_GB/s");
    for (int i = 0; i < 8; i++) {
        const ds_weight *w = mm[i].w;
        const double mb = (double)weight_bytes(w) / 1e6;
        for (int wi = 0; wi < NW; wi++) {
            const int M = widths[wi];
            double tv[2];
            for (int v = 0; v < 2; v++) {
                ds_matmul((ds_variant)v, w, M, x, y, pool);       /* warm */
                for (long r = 0; r < reps; r++) {
                    const double t0 = pf_now(cpu);
                    for (int it = 0; it < 8; it++) ds_matmul((ds_variant)v, w, M, x, y, pool);
                    t[r] = (pf_now(cpu) - t0) / 8;
                }
                tv[v] = cli_median(t, (int)reps);
            }
            const double macs = (double)M * (double)w->n_in * (double)w->n_out;
            printf("%-8s %5s %6lld %6lld %9.3f %3d %11.1f %11.1f %9.2f %9.1f %9.1f\n", mm[i].name, ds_type_name(w->type),
                   (long long)w->n_in, (long long)w->n_out, mb, M, tv[0] * 1e6, tv[1] * 1e6, tv[0] / tv[1],
                   macs / tv[0] * 1e-9, mb * 1e-3 / tv[0]);
        }
    }
    size_t bytes = weight_bytes(&m->output);
    for (int l = 0; l < m->hp.n_layer; l++) {
        const ds_weight *w;
        for (int j = 0; (w = ds_layer_weight((ds_layer *)&m->layers[l], j)); j++) bytes += weight_bytes(w);
    }
    if (moe)
        printf("weight bytes in all (a MoE forward reads the experts its rows choose): %.2f MB as stored\n",
               (double)bytes / 1e6);
    else
        printf("weight bytes read per forward (any M): %.2f MB as stored (the VNNI tiles are the same size)\n",
               (double)bytes / 1e6);
    free(x); free(y); free(t);
}

/* ---- a speculative round, phase by phase ----------------------------------------------
 * What ds_spec_generate runs per round, at the same prefix, against one
 * decode step as plain generation runs it (ds_forward_select, decode path,
 * the token chosen on the device):
 *   draft    ds_draft of gamma slots with confidences (as spec.c asks);
 *   verify   ds_forward_select of gamma + 1 rows, every row selecting, taps kept;
 *   commit   KV truncate + the drafter's context append of `acc` rows (the
 *            accepted tokens plus the bonus; acc = 4 by default, about the
 *            shipped pair's mean accepted length);
 * each in microseconds, pool hand-offs (jobs given to the workers) and
 * inline runs, and the round as a multiple of a decode step: the mean
 * tokens per round speculation must beat to pay (break-even). Also the
 * drafter's LM head alone as one M = gamma matmul. */
static void profile_draft(ds_ctx *c, const char *drafter_path, const int32_t *toks, int prefix, long reps,
                          float *logits, int cpu) {
    char err[DS_ERRLEN];
    const ds_model *m = ds_ctx_model(c);
    ds_pool *pool = ds_exec_cpu_pool(ds_ctx_exec(c));
    ds_drafter *d = ds_drafter_load(drafter_path, m, err, sizeof err);
    if (!d) cli_die("bench", "%s: %s", drafter_path, err);
    const int G = ds_drafter_block_size(d), D = m->hp.n_embd, nt = ds_drafter_n_taps(d);
    const int acc = G < 4 ? G : 4;
    CHECK(ds_set_taps(c, ds_drafter_tap_layers(d), nt, err, sizeof err));
    ds_dctx *x = ds_dctx_new(d, ds_ctx_n_ctx(c), ds_ctx_exec(c), err, sizeof err);
    if (!x) cli_die("bench", "%s", err);
    ds_backend *be = m->be;
    const size_t T = (size_t)nt * (size_t)D;
    float *taps = malloc((size_t)prefix * T * sizeof(float));
    float *vtaps = be->i->alloc(be, (size_t)(G + 1) * T * sizeof(float));
    enum { PH_DEC, PH_DRAFT, PH_VER, PH_COMMIT, PH_HEAD, PH_N };
    static const char *ph_name[PH_N] = {"decode step", "draft", "verify", "commit", "drafter lm head"};
    double *t[PH_N], st[PH_N][2] = {{0}};
    for (int k = 0; k < PH_N; k++) t[k] = malloc((size_t)reps * sizeof(double));
    float *hx = calloc((size_t)G * (size_t)D, sizeof(float)), *hy = malloc((size_t)G * m->hp.n_vocab * sizeof(float));
    if (!taps || !vtaps || !hx || !hy) cli_die("bench", "out of memory");
    for (int k = 0; k < PH_N; k++) if (!t[k]) cli_die("bench", "out of memory");
    ds_kernel_set canon;
    ds_kernel_set_all(&canon, DS_CANONICAL);
    ds_ctx_set_kernels(c, &canon);
    CHECK(ds_kv_truncate(c, 0));
    CHECK(ds_forward_batch(c, toks, prefix, 0, DS_LOGITS_LAST, logits, taps, err, sizeof err));
    CHECK(ds_dctx_append(x, taps, prefix, 0, err, sizeof err));
    for (int i = 0; i < G * D; i++) hx[i] = (float)((i * 13) % 29) / 14.0f - 1.0f;
    const ds_sampler samp = {.temp = 0.0f, .top_k = 0, .top_p = 1.0f, .seed = 0};
    ds_draft_opts o = {.samp = &samp, .n_keep = G};
    int32_t ids[64], vtok[65], vsel[65], y1;
    float conf[64];
    for (long r = 0; r < reps; r++)
        for (int k = 0; k < PH_N; k++) {
            ds_pool_stats_t p0, p1;
            ds_pool_stats(pool, &p0);
            double t0 = pf_now(cpu);
            switch (k) {
            case PH_DEC: {
                CHECK(ds_kv_truncate(c, prefix));
                const ds_select_opts so = {1, DS_LOGITS_LAST, &samp, &y1, NULL, NULL, NULL, 0, NULL, 0};
                t0 = pf_now(cpu);
                CHECK(ds_forward_select(c, toks + prefix, 1, prefix, &so, err, sizeof err));
                break;
            }
            case PH_DRAFT:
                CHECK(ds_draft(x, toks[prefix], prefix, &o, ids, conf, NULL, err, sizeof err));
                break;
            case PH_VER: {
                CHECK(ds_kv_truncate(c, prefix));
                vtok[0] = toks[prefix];
                for (int i = 0; i < G; i++) vtok[i + 1] = ids[i];
                const ds_select_opts so = {0, DS_LOGITS_ALL, &samp, vsel, vtaps, NULL, NULL, 0, NULL, 0};
                t0 = pf_now(cpu);
                CHECK(ds_forward_select(c, vtok, G + 1, prefix, &so, err, sizeof err));
                break;
            }
            case PH_COMMIT:
                CHECK(ds_kv_truncate(c, prefix + acc));
                CHECK(ds_dctx_truncate(x, prefix));
                CHECK(ds_dctx_append_dev(x, vtaps, acc, prefix, err, sizeof err));
                break;
            case PH_HEAD:
                ds_matmul(DS_CANONICAL, ds_drafter_head(d), G, hx, hy, pool);
                break;
            }
            t[k][r] = pf_now(cpu) - t0;
            if (k == PH_COMMIT) CHECK(ds_dctx_truncate(x, prefix));   /* the next round drafts at prefix again */
            ds_pool_stats(pool, &p1);
            st[k][0] += (double)(p1.jobs - p0.jobs) / (double)reps;
            st[k][1] += (double)(p1.inline_runs - p0.inline_runs) / (double)reps;
        }
    double med[PH_N];
    for (int k = 0; k < PH_N; k++) med[k] = cli_median(t[k], (int)reps);
    printf("\n== profile: one speculative round (gamma=%d, verify %d rows, commit %d rows) vs one decode step (medians of %ld, interleaved) ==\n",
           G, G + 1, acc, reps);
    printf("drafter: %s\n", ds_drafter_describe(d));
    printf("%-16s %12s %10s %10s %10s\n", "phase", "us", "x decode", "handoffs", "inline");
    for (int k = 0; k < PH_N; k++)
        printf("%-16s %12.1f %10.2f %10.1f %10.1f\n", ph_name[k], med[k] * 1e6, med[k] / med[PH_DEC], st[k][0], st[k][1]);
    const double round = med[PH_DRAFT] + med[PH_VER] + med[PH_COMMIT];
    printf("decode_us=%.1f draft_round_us=%.1f draft_over_decode=%.2f verify_over_decode=%.2f round_over_decode=%.2f "
           "(break-even tokens per round) lm_head_M%d_us=%.1f (%.0f%% of the draft)\n",
           med[PH_DEC] * 1e6, med[PH_DRAFT] * 1e6, med[PH_DRAFT] / med[PH_DEC], med[PH_VER] / med[PH_DEC],
           round / med[PH_DEC], G, med[PH_HEAD] * 1e6, 100.0 * med[PH_HEAD] / med[PH_DRAFT]);
    free(taps); free(hx); free(hy);
    be->i->release(be, vtaps);
    for (int k = 0; k < PH_N; k++) free(t[k]);
    ds_dctx_free(x);
    ds_drafter_free(d);
    CHECK(ds_set_taps(c, NULL, 0, err, sizeof err));
}

/* Entry from cmd_bench (the context holds at least prefix + 16 positions). */
void cmd_bench_profile(ds_ctx *c, const char *drafter_path, const int32_t *toks, int prefix, long reps, float *logits,
                       int round_only) {
    char err[DS_ERRLEN];
    ds_pool *pool = ds_exec_cpu_pool(ds_ctx_exec(c));
    if (!pool) cli_die("bench", "--profile runs on the cpu device only");
    CHECK(ds_kv_truncate(c, 0));
    CHECK(ds_forward_batch(c, toks, prefix, 0, DS_LOGITS_LAST, logits, NULL, err, sizeof err));
    const int cpu = ds_pool_threads(pool) == 1;
    printf("clock=%s\n", cpu ? "thread-cpu (one thread: other processes' time slices excluded)" : "wall");
    if (!round_only) {
        profile_forward(c, toks, prefix, reps, logits, cpu);
        profile_kernels(c, reps, cpu);
    }
    if (drafter_path) profile_draft(c, drafter_path, toks, prefix, reps, logits, cpu);
}
