/* spec.c — the speculative loop (dspark-spec.md §5.4), the single-stream
 * verify-length scheduler (§3.2 / §3.3) and the SPS table helpers. */
#include "spec.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

const char *ds_commit_name(ds_commit_mode m) { return m == DS_COMMIT_REPLAY ? "replay" : "direct"; }
const char *ds_sched_name(ds_sched_mode m) {
    return m == DS_SCHED_PMIN ? "pmin" : m == DS_SCHED_TABLE ? "table" : m == DS_SCHED_AUTO ? "auto" : "none";
}

void ds_spec_opts_default(ds_spec_opts *o) {
    memset(o, 0, sizeof *o);
    o->n_predict = 128;
    o->prefill = DS_PREFILL_BATCH;
    o->stop_at_eog = 1;
    o->samp.temp = 0.0f;
    o->samp.top_k = 0;
    o->samp.top_p = 1.0f;
    o->draft_max = 0;
    o->sched = DS_SCHED_NONE;
    o->commit = DS_COMMIT_DIRECT;
}

/* ---- scheduler ------------------------------------------------------------ */
int ds_spec_choose_len(ds_sched_mode mode, const float *conf, int n, float p_min, const double *sps_sec,
                       int n_sps) {
    if (n <= 0) return 0;
    if (mode == DS_SCHED_NONE || !conf) return n;
    int cap = n;
    if (mode == DS_SCHED_PMIN || p_min > 0.0f)
        for (int k = 0; k < n; k++)
            if (!(conf[k] >= p_min)) { cap = k; break; }   /* NaN confidence stops too */
    if (mode == DS_SCHED_PMIN) return cap;
    /* TABLE: Alg. 1 with one stream; Theta(ell) = (1 + sum_{j<=ell} a_j) * SPS(1+ell) */
    if (!sps_sec || n_sps < 1 || !(sps_sec[0] > 0.0)) return cap;
    double best = 1.0 / sps_sec[0], tau = 1.0, a = 1.0;
    int ell_best = 0;
    for (int ell = 1; ell <= cap && ell + 1 <= n_sps; ell++) {
        double c = conf[ell - 1];
        if (!(c > 0.0)) break;
        a *= c > 1.0 ? 1.0 : c;
        tau += a;
        if (!(sps_sec[ell] > 0.0)) break;
        double th = tau / sps_sec[ell];
        if (th > best) { best = th; ell_best = ell; }
        else break;                                   /* early stop: required for losslessness */
    }
    return ell_best;
}

/* ---- AUTO: the measured, cost-aware scheduler (spec.h) ---------------------
 * State of one generation. Seconds are exponential moving averages of the
 * loop's own wall-clock timings; a sample more than 3x the estimate is
 * clipped to 3x first, so one preempted round on a shared machine moves the
 * estimate a little, not 10x. Acceptance counts decay by AUTO_DECAY per
 * speculative round so that the estimate follows the text. */
#define AUTO_EMA 0.2            /* weight of a new timing                        */
#define AUTO_DECAY 0.97         /* per speculative round, on the depth counts    */
#define AUTO_WARM 3             /* first speculative rounds: full width          */
#define AUTO_FULL_EVERY 8       /* every 8th speculative round: full width       */
#define AUTO_GAP0 8             /* plain steps before a probing round ...        */
#define AUTO_GAP_MAX 64         /* ... doubling up to this                       */
typedef struct {
    int    W;                               /* widths 1..W                      */
    double v[DS_SPEC_MAX_GAMMA + 1];        /* seconds per verify pass, width w at v[w-1] */
    double nv[DS_SPEC_MAX_GAMMA + 1];       /* the weight of v[w-1] in the fit  */
    double draft_s, commit_s;               /* per speculative round; < 0: none yet */
    double n[DS_SPEC_MAX_GAMMA], k[DS_SPEC_MAX_GAMMA]; /* depth j at [j-1]: reached, accepted */
    int    spec_rounds, plain_run, gap;
    double pred_spec_tp, pred_plain_tp;     /* the last plain decision's estimates */
} auto_sched;

/* The start-up table seeds only the two ends of the line (a plain step and
 * the full width), with the weight of one observation each: measured at
 * start-up on a shared machine, single widths can be off by 2-3x (seen:
 * width 5 three times width 4), and a wrong interior point would bend every
 * decision; the loop's own timings then take over. */
static void auto_init(auto_sched *a, const double *sps, int W) {
    memset(a, 0, sizeof *a);
    a->W = W;
    for (int w = 0; w < W; w++) a->v[w] = sps[w];
    /* a one-row pass never costs more than a wider one: a start-up outlier
     * at width 1 (seen: 2.1 ms where widths 2..8 took 0.8-1.9) would price
     * plain steps out, and AUTO learns a width's cost only by running it,
     * so it would never take the plain step that corrects the estimate */
    for (int w = 1; w < W; w++)
        if (a->v[w] < a->v[0]) a->v[0] = a->v[w];
    a->nv[0] = a->nv[W - 1] = 1.0;
    a->draft_s = a->commit_s = -1.0;
    a->gap = AUTO_GAP0;
}

static void auto_ema(double *e, double x) {
    if (!(x >= 0.0) || !isfinite(x)) return;
    if (*e < 0.0) { *e = x; return; }
    if (x > 3.0 * *e) x = 3.0 * *e;
    *e += AUTO_EMA * (x - *e);
}

/* Verify seconds of width w from the line c0 + c1 (w - 1) fitted by least
 * squares over the widths' estimates, each weighted by how many timings it
 * rests on (decayed): one line through the few widths the loop runs, and
 * c1 >= 0 (a wider pass never costs less). */
static void auto_fit(const auto_sched *a, double *c0, double *c1) {
    double s0 = 0, sx = 0, sy = 0, sxx = 0, sxy = 0;
    for (int w = 0; w < a->W; w++) {
        const double n = a->nv[w];
        s0 += n; sx += n * w; sy += n * a->v[w]; sxx += n * w * w; sxy += n * w * a->v[w];
    }
    const double den = s0 * sxx - sx * sx;
    double b = den > 1e-12 ? (s0 * sxy - sx * sy) / den : 0.0;
    if (!(b >= 0)) b = 0;
    double c = s0 > 0 ? (sy - b * sx) / s0 : a->v[0];
    if (!(c > 0)) c = a->v[0] > 0 ? a->v[0] : 1e-9;
    *c0 = c;
    *c1 = b;
}

/* The round's plan: the ell to verify (0..cap), *draft = 0 for a plain step. */
static int auto_choose(auto_sched *a, int cap, int *draft) {
    *draft = 1;
    if (cap <= 0) { *draft = 0; return 0; }
    if (a->spec_rounds < AUTO_WARM || a->draft_s < 0 || a->commit_s < 0) return cap;
    if (a->plain_run > 0 && a->plain_run >= a->gap) {        /* probe a plain run */
        if (a->gap < AUTO_GAP_MAX) a->gap *= 2;
        return cap;
    }
    if (a->spec_rounds % AUTO_FULL_EVERY == 0 && a->plain_run == 0) return cap;
    double c0, c1;
    auto_fit(a, &c0, &c1);
    const double plain_tp = 1.0 / (c0 + a->commit_s);
    double best_tp = 0.0, tau = 1.0, prod = 1.0;
    int best = 0;
    for (int ell = 1; ell <= cap && ell < a->W; ell++) {
        /* prior: right two times in three, with the weight of three rounds */
        prod *= (a->k[ell - 1] + 2.0) / (a->n[ell - 1] + 3.0);
        tau += prod;
        const double tp = tau / (a->draft_s + a->commit_s + c0 + c1 * ell);
        if (tp > best_tp) { best_tp = tp; best = ell; }
    }
    if (best == 0 || best_tp < plain_tp) {
        a->pred_spec_tp = best_tp;
        a->pred_plain_tp = plain_tp;
        *draft = 0;
        return 0;
    }
    a->gap = AUTO_GAP0;                                       /* speculation pays again */
    return best;
}

/* After a round: its timings and, for a speculative one, the depths reached. */
static void auto_update(auto_sched *a, int drafted, int ell, int acc, double t_draft, double t_verify,
                        double t_commit) {
    if (ell + 1 <= a->W && t_verify >= 0.0 && isfinite(t_verify)) {
        double *v = &a->v[ell];
        if (t_verify > 3.0 * *v) t_verify = 3.0 * *v;
        /* the first timing of a width replaces its start-up value */
        if (a->nv[ell] < 1.0 && !(ell == 0 || ell == a->W - 1)) *v = t_verify;
        else *v += AUTO_EMA * (t_verify - *v);
        for (int w = 0; w < a->W; w++) a->nv[w] *= 0.98;
        a->nv[ell] += 1.0;
    }
    if (!drafted) { a->plain_run++; return; }
    a->plain_run = 0;
    a->spec_rounds++;
    auto_ema(&a->draft_s, t_draft);
    auto_ema(&a->commit_s, t_commit);
    for (int j = 0; j < a->W - 1 && j < DS_SPEC_MAX_GAMMA; j++) { a->n[j] *= AUTO_DECAY; a->k[j] *= AUTO_DECAY; }
    for (int j = 1; j <= ell && j - 1 <= acc; j++) {          /* draft j was reached */
        a->n[j - 1] += 1.0;
        if (j <= acc) a->k[j - 1] += 1.0;
    }
}

/* ---- SPS table ------------------------------------------------------------ */
int ds_spec_load_sps(const char *path, int max_width, double *sec, char *err, size_t errlen) {
    FILE *f = fopen(path, "r");
    if (!f) { ds_errf(err, errlen, "cannot open SPS table '%s': %s", path, strerror(errno)); return -1; }
    for (int w = 0; w < max_width; w++) sec[w] = 0.0;
    char line[512];
    int ln = 0;
    while (fgets(line, sizeof line, f)) {
        ln++;
        char *s = line;
        while (*s == ' ' || *s == '\t') s++;
        if (*s == '#' || *s == '\n' || *s == '\r' || *s == 0) continue;
        char *end;
        errno = 0;
        long w = strtol(s, &end, 10);
        if (errno || end == s || (*end != ' ' && *end != '\t')) {
            fclose(f);
            ds_errf(err, errlen, "SPS table '%s' line %d: expected 'width seconds_per_pass'", path, ln);
            return -1;
        }
        s = end;
        double v = strtod(s, &end);
        while (*end == ' ' || *end == '\t' || *end == '\r' || *end == '\n') end++;
        if (end == s || *end || !isfinite(v) || v <= 0.0) {
            fclose(f);
            ds_errf(err, errlen, "SPS table '%s' line %d: seconds per pass must be a positive number", path, ln);
            return -1;
        }
        if (w < 1) {
            fclose(f);
            ds_errf(err, errlen, "SPS table '%s' line %d: width %ld must be >= 1", path, ln, w);
            return -1;
        }
        if (w <= max_width) sec[w - 1] = v;
    }
    fclose(f);
    for (int w = 1; w <= max_width; w++)
        if (!(sec[w - 1] > 0.0)) {
            ds_errf(err, errlen, "SPS table '%s' has no entry for verify width %d (needs widths 1..%d)", path, w, max_width);
            return -1;
        }
    return 0;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int ds_spec_measure_sps(ds_ctx *c, int max_width, int reps, double *sec, char *err, size_t errlen) {
    if (max_width < 1 || max_width > ds_ctx_n_ctx(c)) {
        ds_errf(err, errlen, "SPS measurement: width %d does not fit the context (%d)", max_width, ds_ctx_n_ctx(c));
        return -1;
    }
    if (reps < 1) reps = 1;
    /* time what a round's verify runs: the selecting forward, taps kept on the device */
    ds_backend *be = ds_ctx_model(c)->be;
    const size_t V = (size_t)ds_ctx_model(c)->hp.n_vocab, T = (size_t)ds_ctx_n_taps(c) * ds_ctx_model(c)->hp.n_embd;
    float *tp = T ? be->i->alloc(be, (size_t)max_width * T * sizeof(float)) : NULL;
    int32_t *sel = malloc((size_t)max_width * sizeof(int32_t));
    int32_t *tok = malloc((size_t)max_width * sizeof(int32_t));
    double *t = malloc((size_t)reps * sizeof(double));
    int rc = -1;
    if ((T && !tp) || !sel || !tok || !t) { ds_errf(err, errlen, "SPS measurement: out of memory"); goto done; }
    for (int i = 0; i < max_width; i++) tok[i] = (int32_t)((i * 7 + 1) % (int)V);
    for (int w = 1; w <= max_width; w++) {
        for (int r = -1; r < reps; r++) {
            ds_kv_truncate(c, 0);
            double t0 = now_s();
            const ds_select_opts so = {0, DS_LOGITS_ALL, NULL, sel, tp, NULL, NULL, 0, NULL, 0};
            if (ds_forward_select(c, tok, w, 0, &so, err, errlen)) goto done;
            if (r >= 0) t[r] = now_s() - t0;
        }
        qsort(t, (size_t)reps, sizeof *t, cmp_double);
        sec[w - 1] = t[reps / 2];
    }
    rc = 0;
done:
    ds_kv_truncate(c, 0);
    if (tp) be->i->release(be, tp);
    free(sel); free(tok); free(t);
    return rc;
}

/* ---- the loop ------------------------------------------------------------- */

/* Prefill the target and the drafter context together, in chunks of whole
 * internal batches (a multiple of m_max rows) so that the target's bits equal
 * one ds_prefill call of the whole prompt with ANY kernel set, while the taps
 * buffer (device) holds one chunk instead of the whole prompt. The last row
 * selects the first token (*first) on the device. */
static int spec_prefill(ds_ctx *c, ds_dctx *dx, const int32_t *prompt, int n, ds_prefill_mode mode, int chunk,
                        const ds_sampler *samp, const ds_gen_hooks *h, int32_t *first, float *taps, char *err,
                        size_t errlen) {
    if (n < 1) { ds_errf(err, errlen, "prefill: the prompt is empty"); return -1; }
    if (n >= ds_ctx_n_ctx(c)) {
        ds_errf(err, errlen, "prefill: the prompt has %d tokens but the context holds %d (need room for at least one new token)",
                n, ds_ctx_n_ctx(c));
        return -1;
    }
    const size_t T = (size_t)ds_ctx_n_taps(c) * ds_ctx_model(c)->hp.n_embd;
    ds_kv_truncate(c, 0);
    for (int off = 0; off < n;) {
        int m = n - off < chunk ? n - off : chunk;
        const int last = off + m == n;
        /* the target's rows in steps (the forward's own m_max chunks with a
         * cancel poll between them, so the same bits; one pass without) */
        const int step = mode == DS_PREFILL_DECODE ? 1 : h && h->cancelled ? ds_ctx_m_max(c) : m;
        for (int i = 0; i < m; i += step) {
            if (ds_gen_cancelled(h)) return 1;
            const int k = m - i < step ? m - i : step;
            const ds_select_opts so = {mode == DS_PREFILL_DECODE, last && i + k == m ? DS_LOGITS_LAST : DS_LOGITS_NONE, samp,
                                       first, taps + (size_t)i * T, NULL, NULL, 0, NULL, 0};
            if (ds_forward_select_lp(c, prompt + off + i, k, off + i, &so, h ? h->lp : NULL, NULL, 0, err, errlen)) return -1;
        }
        if (ds_dctx_append_dev(dx, taps, m, off, err, errlen)) return -1;
        off += m;
    }
    return 0;
}
typedef struct {
    const ds_spec_opts *o;
    const ds_tokenizer *tok;
    const ds_lproc *lp;
    int32_t *out;
    ds_spec_stats *st;
} emitter;

/* Emit one token exactly as plain generation does: an EOG stops before it
 * is emitted; reaching n_predict stops after. 1 = stop. */
static int emit(emitter *e, int32_t t) {
    if (e->o->stop_at_eog && e->tok && ds_tokenizer_is_eog(e->tok, t)) { e->st->stop = "eog"; return 1; }
    if (e->lp && e->lp->accept) e->lp->accept(e->lp->user, (int64_t)e->st->n_prompt + e->st->n_gen, t);
    e->out[e->st->n_gen++] = t;
    if (e->o->on_token) e->o->on_token(e->o->user, t);
    if (e->st->n_gen >= e->o->n_predict) { e->st->stop = "length"; return 1; }
    return 0;
}

int ds_spec_generate(ds_ctx *c, const ds_drafter *d, const int32_t *prompt, int n_prompt,
                     const ds_spec_opts *o, int32_t *out, ds_spec_stats *st, char *err, size_t errlen) {
    memset(st, 0, sizeof *st);
    st->n_prompt = n_prompt;
    st->stop = "length";
    const int gamma = ds_drafter_block_size(d);
    if (o->n_predict < 1) { ds_errf(err, errlen, "spec: n_predict must be >= 1"); return -1; }
    if (gamma < 1 || gamma > DS_SPEC_MAX_GAMMA) {
        ds_errf(err, errlen, "spec: drafter block size %d is outside 1..%d", gamma, DS_SPEC_MAX_GAMMA);
        return -1;
    }
    const int draft_max = o->draft_max == 0 ? gamma : o->draft_max;
    if (draft_max < 1 || draft_max > gamma) {
        ds_errf(err, errlen, "spec: draft_max %d is outside 1..%d (n_max inconsistent with the drafter's block size)",
                o->draft_max, gamma);
        return -1;
    }
    const int has_conf = ds_drafter_has_confidence(d);
    /* the confidence head runs only when something reads it (pmin / table
     * scheduling, an override hook, the per-round report): with none of
     * those it would be a head per slot for nothing; the tokens never
     * depend on it */
    const int use_conf = has_conf && ((o->sched != DS_SCHED_NONE && o->sched != DS_SCHED_AUTO) ||
                                      o->draft_override || o->on_round);
    if (o->sched != DS_SCHED_NONE && o->sched != DS_SCHED_AUTO && !has_conf) {
        ds_errf(err, errlen, "spec: scheduler '%s' needs a drafter with a confidence head", ds_sched_name(o->sched));
        return -1;
    }
    if ((o->sched == DS_SCHED_TABLE || o->sched == DS_SCHED_AUTO) && (!o->sps_sec || o->n_sps < draft_max + 1)) {
        ds_errf(err, errlen, "spec: the %s scheduler needs seconds per pass for widths 1..%d",
                ds_sched_name(o->sched), draft_max + 1);
        return -1;
    }
    if (o->commit != DS_COMMIT_DIRECT && o->commit != DS_COMMIT_REPLAY) {
        ds_errf(err, errlen, "spec: unknown commit mode %d", (int)o->commit);
        return -1;
    }
    st->gamma = gamma;
    st->draft_max = draft_max;
    if (ds_set_taps(c, ds_drafter_tap_layers(d), ds_drafter_n_taps(d), err, errlen)) return -1;
    const size_t T = (size_t)ds_ctx_n_taps(c) * ds_ctx_model(c)->hp.n_embd;

    /* buffers: taps on the device (they go from the target's forward to the
     * drafter's context without visiting the host); ids and confidences on
     * the host (the only things a round moves) */
    ds_backend *be = ds_ctx_model(c)->be;
    const int mm = ds_ctx_m_max(c) > 0 ? ds_ctx_m_max(c) : 1;
    const int chunk = mm * (mm < 512 ? 512 / mm : 1);                 /* whole internal batches */
    float *ptaps = be->i->alloc(be, (size_t)chunk * T * sizeof(float) + 64);
    float *vtaps = be->i->alloc(be, (size_t)(gamma + 1) * T * sizeof(float) + 64);
    float *conf = malloc((size_t)gamma * sizeof(float));
    int32_t *ids = malloc((size_t)gamma * sizeof(int32_t));
    int32_t *vtok = malloc((size_t)(gamma + 1) * sizeof(int32_t));
    int32_t *vsel = malloc((size_t)(gamma + 1) * sizeof(int32_t));
    ds_dctx *dx = NULL;
    int rc = -1;
    if (!ptaps || !vtaps || !conf || !ids || !vtok || !vsel) { ds_errf(err, errlen, "spec: out of memory"); goto done; }
    /* the caller's kept drafter context (o->keep) when it fits: its
     * recorded launch sequences and MASK cache are made already (recording
     * one graph costs more host time than a round); else a new one */
    if (o->keep) {                               /* ours until the generation succeeds */
        dx = *o->keep;
        *o->keep = NULL;
    }
    if (dx && (!ds_dctx_reusable(dx, d, ds_ctx_n_ctx(c) + gamma, draft_max, ds_ctx_exec(c)) ||
               ds_dctx_truncate(dx, 0))) {
        ds_dctx_free(dx);
        dx = NULL;
    }
    if (!dx) dx = ds_dctx_new(d, ds_ctx_n_ctx(c) + gamma, ds_ctx_exec(c), err, errlen);
    if (!dx || ds_dctx_set_retained(dx, draft_max, err, errlen)) goto done;

    auto_sched as;
    if (o->sched == DS_SCHED_AUTO) auto_init(&as, o->sps_sec, draft_max + 1);
    const ds_gen_hooks *hk = o->hooks;
    const ds_lproc *lp = hk ? hk->lp : NULL;
    emitter em = { o, ds_ctx_model(c)->tok, lp, out, st };
    const ds_sampler *samp = &o->samp;
    double t0 = now_s();
    /* prefill: target (all prompt taps) -> drafter context rows -> first token */
    int32_t anchor = -1;
    const int pr = spec_prefill(c, dx, prompt, n_prompt, o->prefill, chunk, samp, hk, &anchor, ptaps, err, errlen);
    if (pr < 0) goto done;
    int p = n_prompt;
    double t1 = now_s();
    st->t_prefill = t1 - t0;
    if (pr) { st->stop = "cancel"; goto finish; }
    if (emit(&em, anchor)) goto finish;

    for (;;) {
        if (p >= ds_ctx_n_ctx(c)) { st->stop = "context"; break; }
        if (ds_gen_cancelled(hk)) { st->stop = "cancel"; break; }
        /* how many drafts may this round verify: block, context, budget.
         * A backend that records launch sequences replays one recording
         * per verify width, and a new width costs a recording (host time
         * far above a pass): the last rounds of a generation, whose budget
         * is below the block, verify the full block anyway and accept at
         * most the budget (the rows past it are computed, never kept).
         * Elsewhere the narrower pass is the cheaper one. */
        const int budget = o->n_predict - st->n_gen - 1;           /* tokens wanted after the next */
        int cap = draft_max;
        if (cap > ds_ctx_n_ctx(c) - 1 - p) cap = ds_ctx_n_ctx(c) - 1 - p;            /* p + ell < n_ctx      */
        if (!be->i->graph_begin && cap > budget) cap = budget;
        if (cap < 0) cap = 0;
        int ell = 0, n_draft = 0, want = cap, draft = cap > 0;
        if (o->sched == DS_SCHED_AUTO) want = auto_choose(&as, cap, &draft);
        /* queued: the verify's width is known before the draft (no
         * scheduler, nothing reads the drafts on the host before the
         * verify), so the verify follows the draft on the device and the
         * drafts come back with its selections (one wait per round) */
        const int32_t *ids_dev = NULL;
        const int queued = draft && !o->draft_wait && o->sched == DS_SCHED_NONE && !o->draft_override && !use_conf && !lp;
        double ta = now_s();
        if (queued) {
            ds_draft_opts dop = { samp, draft_max };
            if (ds_draft_queue(dx, anchor, p, &dop, &ids_dev, err, errlen)) goto done;
            n_draft = draft_max;
            ell = cap;
            st->queued_rounds++;
        } else if (draft) {
            ds_draft_opts dop = { samp, draft_max };
            if (ds_draft(dx, anchor, p, &dop, ids, use_conf ? conf : NULL, NULL, err, errlen)) goto done;
            n_draft = draft_max;
            if (o->draft_override) o->draft_override(o->override_user, p, anchor, n_draft, ids, use_conf ? conf : NULL);
            ell = o->sched == DS_SCHED_AUTO ? want
                : ds_spec_choose_len(o->sched, use_conf ? conf : NULL, draft_max, o->p_min, o->sps_sec, o->n_sps);
            if (ell > cap) ell = cap;
        }
        double tb = now_s();
        st->t_draft += tb - ta;

        /* verify [anchor, d_1..d_ell] at p..p+ell in ONE batched pass */
        vtok[0] = anchor;
        /* direct commit: the drafter's context reads the verify's taps where
         * the forward left them (nothing runs the target in between) */
        float *vt = o->commit == DS_COMMIT_DIRECT && ds_ctx_taps_dev(c) && ell + 1 <= ds_ctx_m_max(c) ? ds_ctx_taps_dev(c)
                                                                                                    : vtaps;
        /* ahead: on a backend whose downloads can be collected later, the
         * drafter's context rows for EVERY verified position are queued
         * behind the verify and run while the host waits for the ids and
         * accepts; only the accepted prefix is kept (ds_dctx_truncate). A
         * row's bits do not depend on how many rows share the pass
         * (canonical kernels), and the rejected rows' K/V lie where the next
         * block writes its own before reading. */
        const int ahead = queued && vt != vtaps && be->i->download_start;
        if (queued) {   /* the drafts stay on the device; they come back with the selections */
            /* with drafts, the verify's positions and tokens are the
             * drafter's device rows of this round: nothing to upload */
            int pitch = 0;
            const int32_t *rows = ell ? ds_dctx_rows_dev(dx, &pitch) : NULL;
            const ds_select_opts so = {0, DS_LOGITS_ALL, samp, vsel, vt, ell ? ids_dev : NULL, ids, ahead, rows, pitch};
            if (ds_forward_select(c, vtok, ell + 1, p, &so, err, errlen)) goto done;
            if (ahead) {
                if (ds_dctx_truncate(dx, p)) { ds_errf(err, errlen, "spec: drafter truncate to %d failed", p); goto done; }
                if (ds_dctx_append_dev(dx, vt, ell + 1, p, err, errlen)) goto done;
                if (ds_forward_collect(c, err, errlen)) goto done;
                st->ahead_rounds++;
            }
            for (int i = 0; i < ell; i++) vtok[i + 1] = ids[i];
        } else {   /* only the ell + 1 selected ids come back; logits and taps stay */
            for (int i = 0; i < ell; i++) vtok[i + 1] = ids[i];
            const ds_select_opts so = {0, DS_LOGITS_ALL, samp, vsel, vt, NULL, NULL, 0, NULL, 0};
            /* a processor sees row i with d_1..d_i after the committed tokens */
            if (ds_forward_select_lp(c, vtok, ell + 1, p, &so, lp, ids, 0, err, errlen)) goto done;
        }
        double tc = now_s();
        st->t_verify += tc - tb;

        /* accept: longest prefix with d_{i+1} == sample(row i, p+i+1); bonus */
        int a = 0;
        int32_t bonus = -1;
        for (; a <= ell; a++) {
            int32_t y = vsel[a];
            if (a == ell || y != ids[a]) { bonus = y; break; }
        }
        if (a > budget) {   /* a full block past the budget: its first rows only */
            a = budget;
            bonus = vsel[a];
        }
        double td = now_s();
        st->t_accept += td - tc;

        /* commit */
        if (o->commit == DS_COMMIT_DIRECT) {
            if (ds_kv_truncate(c, p + a + 1)) { ds_errf(err, errlen, "spec: KV truncate to %d failed", p + a + 1); goto done; }
        } else {
            if (ds_kv_truncate(c, p)) { ds_errf(err, errlen, "spec: KV truncate to %d failed", p); goto done; }
            int a2 = a;
            for (int j = 0; j <= a; j++) {
                int32_t y = -1;
                const ds_select_opts so = {1, DS_LOGITS_LAST, samp, &y, vtaps + (size_t)j * T, NULL, NULL, 0, NULL, 0};
                if (ds_forward_select_lp(c, &vtok[j], 1, p + j, &so, lp, ids, j, err, errlen)) goto done;
                if (j < a && y != ids[j]) { a2 = j; bonus = y; st->replay_fixups++; break; }
                if (j == a) {
                    if (y != bonus) st->replay_fixups++;
                    bonus = y;
                }
            }
            a = a2;
        }
        if (ahead) {   /* the rows are there: keep the accepted prefix */
            if (ds_dctx_truncate(dx, p + a + 1)) { ds_errf(err, errlen, "spec: drafter truncate to %d failed", p + a + 1); goto done; }
        } else {
            if (ds_dctx_truncate(dx, p)) { ds_errf(err, errlen, "spec: drafter truncate to %d failed", p); goto done; }
            if (ds_dctx_append_dev(dx, o->commit == DS_COMMIT_DIRECT ? vt : vtaps, a + 1, p, err, errlen)) goto done;
        }
        const double te = now_s();
        st->t_commit += te - td;
        if (o->sched == DS_SCHED_AUTO) auto_update(&as, n_draft > 0, ell, a, tb - ta, tc - tb, te - td);
        if (!n_draft && cap > 0) {
            /* the cost model's fallback, for the caller's one-line report */
            if (!st->plain_rounds) st->auto_first_plain = st->rounds;
            st->plain_rounds++;
            if (o->sched == DS_SCHED_AUTO) {
                st->auto_pred_spec_tok_s = as.pred_spec_tp;
                st->auto_pred_plain_tok_s = as.pred_plain_tp;
            }
        }

        if (o->on_round) {
            ds_spec_round r = { st->rounds, p, anchor, n_draft, ids, use_conf && n_draft ? conf : NULL, ell, a, bonus };
            o->on_round(o->round_user, &r);
        }
        /* stats */
        st->rounds++;
        st->drafted += ell;
        st->accepted += a;
        for (int k = 0; k < a; k++) st->accept_hist[k]++;
        st->len_hist[a]++;
        st->width_hist[ell]++;

        /* emit d_1..d_a then the bonus; an accepted EOG truncates the round */
        int stop = 0, before = st->n_gen;
        for (int k = 0; k < a && !stop; k++) stop = emit(&em, ids[k]);
        if (!stop) stop = emit(&em, bonus);
        st->emitted_in_rounds += st->n_gen - before;
        if (stop) break;
        p += a + 1;
        anchor = bonus;
    }
finish:
    {   /* plain decoding's state at the stopping token: every emitted token
         * decoded but the last (and that one too when an EOG stopped it) */
        const int keep = st->n_prompt + st->n_gen - (strcmp(st->stop, "eog") && st->n_gen > 0 ? 1 : 0);
        if (ds_ctx_n_past(c) > keep && ds_kv_truncate(c, keep)) { ds_errf(err, errlen, "spec: KV truncate to %d failed", keep); goto done; }
        if (ds_dctx_len(dx) > keep && ds_dctx_truncate(dx, keep)) { ds_errf(err, errlen, "spec: drafter truncate to %d failed", keep); goto done; }
    }
    st->t_total = now_s() - t0;
    st->mean_accepted_len = st->rounds ? (double)(st->accepted + st->rounds) / st->rounds : 0.0;
    {
        double tg = st->t_total - st->t_prefill;
        st->tok_s = tg > 0 && st->n_gen > 1 ? (st->n_gen - 1) / tg : 0.0;
    }
    rc = 0;
    if (o->keep) {                                 /* kept for the next generation */
        *o->keep = dx;
        dx = NULL;
    }
done:
    if (dx) ds_dctx_free(dx);                      /* a failed generation's: not kept */
    if (ptaps) be->i->release(be, ptaps);
    if (vtaps) be->i->release(be, vtaps);
    free(conf); free(ids); free(vtok); free(vsel);
    return rc;
}
