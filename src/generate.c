/* generate.c — plain generation (prefill, then one decode per token), greedy
 * or sampled with ds_sampler. */
#include "generate.h"

#include <stdlib.h>
#include <time.h>

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int ds_prefill(ds_ctx *c, const int32_t *prompt, int n_prompt, ds_prefill_mode mode, float *logits,
               float *taps, char *err, size_t errlen) {
    if (n_prompt < 1) { ds_errf(err, errlen, "prefill: the prompt is empty"); return -1; }
    if (n_prompt >= ds_ctx_n_ctx(c)) {
        ds_errf(err, errlen, "prefill: the prompt has %d tokens but the context holds %d (need room for at least one new token)",
                n_prompt, ds_ctx_n_ctx(c));
        return -1;
    }
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

int ds_generate(ds_ctx *c, const int32_t *prompt, int n_prompt, const ds_gen_opts *o,
                const ds_sampler *samp, int32_t *out, ds_gen_stats *st, char *err, size_t errlen) {
    const int V = ds_ctx_model(c)->hp.n_vocab;
    const int greedy = !samp || !(samp->temp > 0.0f);
    float *logits = malloc((size_t)V * sizeof(float) * (greedy ? 1 : 3));   /* + 2V sampler scratch */
    if (!logits) { ds_errf(err, errlen, "generate: out of memory"); return -1; }
    memset(st, 0, sizeof *st);
    st->n_prompt = n_prompt;
    st->stop = "length";
    double t0 = now_s();
    if (ds_prefill(c, prompt, n_prompt, o->prefill, logits, NULL, err, errlen)) { free(logits); return -1; }
    double t1 = now_s();
    st->t_prefill = t1 - t0;
    int pos = n_prompt;
    for (int i = 0; i < o->n_predict; i++) {
        int32_t tok = greedy ? (int32_t)ds_argmax(logits, V) : ds_sample(samp, logits, V, pos, logits + V);
        if (o->stop_at_eog && ds_ctx_model(c)->tok && ds_tokenizer_is_eog(ds_ctx_model(c)->tok, tok)) { st->stop = "eog"; break; }
        out[st->n_gen++] = tok;
        if (o->on_token) o->on_token(o->user, tok);
        if (i + 1 == o->n_predict) break;
        if (pos >= ds_ctx_n_ctx(c)) { st->stop = "context"; break; }
        if (ds_decode(c, tok, pos, logits, NULL, err, errlen)) { free(logits); return -1; }
        pos++;
    }
    st->t_decode = now_s() - t1;
    free(logits);
    return 0;
}
