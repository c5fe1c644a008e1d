/* lproc.c — the standard logits-processor chain (lproc.h): logprob capture,
 * logit_bias, presence / frequency penalties and the grammar mask, behind
 * one ds_lproc.
 *
 * State. Committed tokens arrive through accept (in order, once each): the
 * penalty counts and the grammar's committed state advance there and only
 * there. A row's drafts (its extra history) are applied on top for that row
 * and undone, so rows that are computed and then discarded (after a
 * rejected draft) leave nothing behind. Captures are kept per position in a
 * ring longer than any verify block: a discarded row's capture is
 * overwritten when its position is computed again. */
#include "lproc.h"
#include "common.h"
#include "kernels/dsmath.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define RING 80                      /* > DS_SPEC_MAX_GAMMA + 1 rows a round */

typedef struct {
    int64_t pos;                     /* -1: empty                            */
    int32_t chosen;                  /* -1 until selected                    */
    float   logprob;
    int     n_top;
    int32_t top_id[DS_LPROC_TOP_MAX];
    float   top_lp[DS_LPROC_TOP_MAX];
} capture;

struct ds_lchain {
    ds_lproc   proc;
    int        V;
    float      presence, frequency;
    int32_t   *bias_id;
    float     *bias;
    int        n_bias;
    /* penalties: counts of generated tokens, and the distinct ones in order */
    int32_t   *count;
    int32_t   *seen;
    int        n_seen, n_seen_committed;
    /* grammar */
    ds_gmatch *gm;
    int        gstate;
    /* capture */
    int        capture, top_n;
    float     *raw;                  /* the row being selected, before step 2 */
    double     lse;
    int64_t    raw_pos;
    capture    ring[RING];
    char       err[200];
};

const char *ds_lchain_error(const ds_lchain *c) { return c->err; }

static void set_error(ds_lchain *c, const char *msg) {
    if (!c->err[0]) snprintf(c->err, sizeof c->err, "%s", msg);
}

/* ---- 1. capture ----------------------------------------------------------- */

/* log-softmax normalizer and the top_n of row x (NaN counts as -inf) */
static void capture_row(ds_lchain *c, int64_t pos, const float *x) {
    const int V = c->V;
    float m = -INFINITY;
    for (int i = 0; i < V; i++)
        if (x[i] > m) m = x[i];                      /* NaN compares false */
    double z = 0.0;
    if (m > -INFINITY)
        for (int i = 0; i < V; i++)
            if (x[i] > -INFINITY) z += ds_exp((double)x[i] - (double)m);
    c->lse = m > -INFINITY ? (double)m + ds_log(z) : 0.0;
    memcpy(c->raw, x, (size_t)V * sizeof *x);
    c->raw_pos = pos;
    capture *e = &c->ring[pos % RING];
    e->pos = pos;
    e->chosen = -1;
    e->n_top = 0;
    for (int i = 0; i < V && c->top_n > 0; i++) {
        const float v = x[i];
        if (!(v > -INFINITY)) continue;
        /* insertion into the sorted top list: larger first, then lower id */
        if (e->n_top == c->top_n && !(v > c->raw[e->top_id[e->n_top - 1]])) continue;
        int k = e->n_top < c->top_n ? e->n_top++ : e->n_top - 1;
        while (k > 0 && v > c->raw[e->top_id[k - 1]]) {
            e->top_id[k] = e->top_id[k - 1];
            k--;
        }
        e->top_id[k] = i;
    }
    for (int k = 0; k < e->n_top; k++) e->top_lp[k] = (float)((double)x[e->top_id[k]] - c->lse);
}

static float logprob_of(const ds_lchain *c, int32_t t) {
    const float v = c->raw[t];
    if (!(v > -INFINITY)) return -9999.0f;          /* OpenAI's floor for the impossible */
    double lp = (double)v - c->lse;
    return lp < -9999.0 ? -9999.0f : (float)lp;
}

/* ---- the processor ----------------------------------------------------------- */

static void add_seen(ds_lchain *c, int32_t t) {
    if (c->count[t]++ == 0) c->seen[c->n_seen++] = t;
}

static int lc_apply(void *user, int64_t pos, const int32_t *extra, int n_extra, float *x, int V) {
    ds_lchain *c = user;
    if (c->err[0]) return -1;
    if (V != c->V) { set_error(c, "logits processor: vocabulary size mismatch"); return -1; }
    for (int i = 0; i < n_extra; i++)
        if (extra[i] < 0 || extra[i] >= V) { set_error(c, "logits processor: a draft token is outside the vocabulary"); return -1; }
    if (c->capture) capture_row(c, pos, x);
    /* 2. logit_bias */
    for (int i = 0; i < c->n_bias; i++) x[c->bias_id[i]] = x[c->bias_id[i]] + c->bias[i];
    /* 3. penalties over committed + this row's drafts */
    if (c->presence != 0.0f || c->frequency != 0.0f) {
        for (int i = 0; i < n_extra; i++) add_seen(c, extra[i]);
        for (int k = 0; k < c->n_seen; k++) {
            const int32_t t = c->seen[k];
            const float pen = (float)c->count[t] * c->frequency + c->presence;
            x[t] = x[t] - pen;
        }
        for (int i = n_extra - 1; i >= 0; i--) c->count[extra[i]]--;
        c->n_seen = c->n_seen_committed;
    }
    /* 4. grammar */
    if (c->gm) {
        int st = c->gstate;
        for (int i = 0; i < n_extra && st >= 0; i++) st = ds_gmatch_token(c->gm, st, extra[i]);
        if (st == -2) { set_error(c, ds_gmatch_error(c->gm)); return -1; }
        /* a dead state: a draft the grammar refuses; this row is discarded
         * whatever it selects (the target could not have chosen that draft) */
        if (st >= 0) {
            int allowed = ds_gmatch_mask(c->gm, st, x, V);
            if (allowed < 0) { set_error(c, ds_gmatch_error(c->gm)); return -1; }
            if (allowed == 0 && n_extra == 0) {
                set_error(c, ds_gmatch_complete(c->gm, st)
                                 ? "grammar: the text is complete but the model has no end-of-generation token to end it"
                                 : "grammar: no token of the vocabulary can continue the text");
                return -1;
            }
        }
    }
    return 0;
}

static void lc_selected(void *user, int64_t pos, int32_t token) {
    ds_lchain *c = user;
    if (!c->capture || c->raw_pos != pos || token < 0 || token >= c->V) return;
    capture *e = &c->ring[pos % RING];
    e->chosen = token;
    e->logprob = logprob_of(c, token);
}

static void lc_accept(void *user, int64_t pos, int32_t token) {
    ds_lchain *c = user;
    (void)pos;
    if (token < 0 || token >= c->V) return;
    if (c->presence != 0.0f || c->frequency != 0.0f) {
        add_seen(c, token);
        c->n_seen_committed = c->n_seen;
    }
    if (c->gm && c->gstate >= 0) {
        c->gstate = ds_gmatch_token(c->gm, c->gstate, token);
        if (c->gstate == -2) set_error(c, ds_gmatch_error(c->gm));
    }
}

ds_lchain *ds_lchain_new(const ds_lchain_cfg *cfg, int V, char *err, size_t errlen) {
    if (V < 1 || cfg->n_bias < 0 || cfg->top_n < 0 || cfg->top_n > DS_LPROC_TOP_MAX) {
        ds_errf(err, errlen, "logits processor: bad configuration");
        return NULL;
    }
    for (int i = 0; i < cfg->n_bias; i++)
        if (cfg->bias_id[i] < 0 || cfg->bias_id[i] >= V) {
            ds_errf(err, errlen, "logit_bias: token %d is outside the vocabulary [0, %d)", cfg->bias_id[i], V);
            return NULL;
        }
    ds_lchain *c = calloc(1, sizeof *c);
    if (!c) { ds_errf(err, errlen, "logits processor: out of memory"); return NULL; }
    c->V = V;
    c->presence = cfg->presence;
    c->frequency = cfg->frequency;
    c->capture = cfg->capture || cfg->top_n > 0;
    c->top_n = cfg->top_n;
    c->raw_pos = -1;
    for (int i = 0; i < RING; i++) c->ring[i].pos = -1;
    int ok = 1;
    if (cfg->n_bias) {
        c->bias_id = malloc((size_t)cfg->n_bias * sizeof *c->bias_id);
        c->bias = malloc((size_t)cfg->n_bias * sizeof *c->bias);
        ok = c->bias_id && c->bias;
        if (ok) {
            memcpy(c->bias_id, cfg->bias_id, (size_t)cfg->n_bias * sizeof *c->bias_id);
            memcpy(c->bias, cfg->bias, (size_t)cfg->n_bias * sizeof *c->bias);
            c->n_bias = cfg->n_bias;
        }
    }
    if (ok && (c->presence != 0.0f || c->frequency != 0.0f)) {
        c->count = calloc((size_t)V, sizeof *c->count);
        c->seen = malloc((size_t)V * sizeof *c->seen);
        ok = c->count && c->seen;
    }
    if (ok && c->capture) ok = (c->raw = malloc((size_t)V * sizeof *c->raw)) != NULL;
    if (ok && cfg->grammar) {
        ok = (c->gm = ds_gmatch_new(cfg->grammar)) != NULL;
        if (ok) c->gstate = ds_gmatch_start(c->gm);
    }
    if (!ok) {
        ds_errf(err, errlen, "logits processor: out of memory");
        ds_lchain_free(c);
        return NULL;
    }
    c->proc.apply = lc_apply;
    c->proc.selected = lc_selected;
    c->proc.accept = lc_accept;
    c->proc.user = c;
    return c;
}

void ds_lchain_free(ds_lchain *c) {
    if (!c) return;
    free(c->bias_id); free(c->bias); free(c->count); free(c->seen); free(c->raw);
    ds_gmatch_free(c->gm);
    free(c);
}

const ds_lproc *ds_lchain_proc(ds_lchain *c) { return &c->proc; }

int ds_lchain_captured(const ds_lchain *c, int64_t pos, float *logprob, int *n_top, const int32_t **top_id,
                       const float **top_lp) {
    if (!c->capture || pos < 0) return 0;
    const capture *e = &c->ring[pos % RING];
    if (e->pos != pos || e->chosen < 0) return 0;
    *logprob = e->logprob;
    *n_top = e->n_top;
    *top_id = e->top_id;
    *top_lp = e->top_lp;
    return 1;
}

int ds_lchain_grammar_complete(const ds_lchain *c) { return c->gm && c->gstate >= 0 && ds_gmatch_complete(c->gm, c->gstate); }
