/* generate.c — plain generation (prefill, then one decode per token), greedy
 * or sampled with ds_sampler. */
#include "generate.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* A prompt must be non-empty and leave room for one new token. */
static int prompt_fits(const ds_ctx *c, int n_prompt, char *err, size_t errlen) {
    if (n_prompt < 1) { ds_errf(err, errlen, "prefill: the prompt is empty"); return -1; }
    if (n_prompt >= ds_ctx_n_ctx(c)) {
        ds_errf(err, errlen, "prefill: the prompt has %d tokens but the context holds %d (need room for at least one new token)",
                n_prompt, ds_ctx_n_ctx(c));
        return -1;
    }
    return 0;
}

int ds_prefill(ds_ctx *c, const int32_t *prompt, int n_prompt, ds_prefill_mode mode, float *logits,
               float *taps, char *err, size_t errlen) {
    if (prompt_fits(c, n_prompt, err, errlen)) return -1;
    ds_kv_truncate(c, 0);
    if (mode == DS_PREFILL_BATCH)
        return ds_forward_batch(c, prompt, n_prompt, 0, DS_LOGITS_LAST, logits, taps, err, errlen);
    size_t tap_row = (size_t)ds_ctx_n_taps(c) * ds_ctx_model(c)->hp.n_embd;
    for (int i = 0; i < n_prompt; i++)
        if (ds_decode(c, prompt[i], i, i == n_prompt - 1 ? logits : NULL, taps ? taps + i * tap_row : NULL, err, errlen))
            return -1;
    return 0;
}

int ds_generate_greedy(ds_ctx *c, const int32_t *prompt, int n_prompt, const ds_gen_opts *o,
                       int32_t *out, ds_gen_stats *st, char *err, size_t errlen) {
    return ds_generate(c, prompt, n_prompt, o, NULL, out, st, err, errlen);
}

int ds_gen_cancelled(const ds_gen_hooks *h) { return h && h->cancelled && h->cancelled(h->user); }

/* Plain generation selects on the device like the speculative loop
 * (ds_forward_select: the backend's argmax / sample op, only the id comes
 * back), so that on any backend plain and speculative output are decided by
 * the same selection code. On the CPU the op is ds_sample itself. With a
 * cancel hook the batched prefill runs in chunks of m_max rows (the
 * forward's own internal chunks, so the same bits) and polls it between
 * them. 1 = cancelled (nothing chosen). */
static int select_prefill(ds_ctx *c, const int32_t *prompt, int n_prompt, ds_prefill_mode mode,
                          const ds_sampler *samp, const ds_gen_hooks *h, int32_t *first, char *err, size_t errlen) {
    if (prompt_fits(c, n_prompt, err, errlen)) return -1;
    ds_kv_truncate(c, 0);
    const ds_lproc *lp = h ? h->lp : NULL;
    const int step = mode == DS_PREFILL_DECODE ? 1 : h && h->cancelled ? ds_ctx_m_max(c) : n_prompt;
    for (int off = 0; off < n_prompt; off += step) {
        if (ds_gen_cancelled(h)) return 1;
        const int m = n_prompt - off < step ? n_prompt - off : step;
        const int last = off + m == n_prompt;
        const ds_select_opts so = {mode == DS_PREFILL_DECODE, last ? DS_LOGITS_LAST : DS_LOGITS_NONE, samp, first, NULL, NULL, NULL, 0,
                                   NULL, 0};
        if (ds_forward_select_lp(c, prompt + off, m, off, &so, lp, NULL, 0, err, errlen)) return -1;
    }
    return 0;
}

int ds_generate(ds_ctx *c, const int32_t *prompt, int n_prompt, const ds_gen_opts *o,
                const ds_sampler *samp, int32_t *out, ds_gen_stats *st, char *err, size_t errlen) {
    return ds_generate_ex(c, prompt, n_prompt, o, samp, NULL, out, st, err, errlen);
}

int ds_generate_ex(ds_ctx *c, const int32_t *prompt, int n_prompt, const ds_gen_opts *o, const ds_sampler *samp,
                   const ds_gen_hooks *h, int32_t *out, ds_gen_stats *st, char *err, size_t errlen) {
    memset(st, 0, sizeof *st);
    st->n_prompt = n_prompt;
    st->stop = "length";
    const ds_lproc *lp = h ? h->lp : NULL;
    double t0 = now_s();
    int32_t tok = -1;
    const int pr = select_prefill(c, prompt, n_prompt, o->prefill, samp, h, &tok, err, errlen);
    if (pr < 0) return -1;
    double t1 = now_s();
    st->t_prefill = t1 - t0;
    if (pr) { st->stop = "cancel"; return 0; }
    int pos = n_prompt;
    for (int i = 0; i < o->n_predict; i++) {
        if (o->stop_at_eog && ds_ctx_model(c)->tok && ds_tokenizer_is_eog(ds_ctx_model(c)->tok, tok)) { st->stop = "eog"; break; }
        out[st->n_gen++] = tok;
        if (lp && lp->accept) lp->accept(lp->user, pos, tok);
        if (o->on_token) o->on_token(o->user, tok);
        if (i + 1 == o->n_predict) break;
        if (pos >= ds_ctx_n_ctx(c)) { st->stop = "context"; break; }
        if (ds_gen_cancelled(h)) { st->stop = "cancel"; break; }
        int32_t next = -1;
        const ds_select_opts so = {1, DS_LOGITS_LAST, samp, &next, NULL, NULL, NULL, 0, NULL, 0};
        if (ds_forward_select_lp(c, &tok, 1, pos, &so, lp, NULL, 0, err, errlen)) return -1;
        tok = next;
        pos++;
    }
    st->t_decode = now_s() - t1;
    return 0;
}
