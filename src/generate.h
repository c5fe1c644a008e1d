/* generate.h — plain generation on the target (greedy, or seeded Gumbel-max
 * sampling via ds_sampler): the reference every speculative run is compared
 * against byte for byte. */
#ifndef DSPARK_GENERATE_H
#define DSPARK_GENERATE_H

#include "model.h"
#include "sampler.h"

typedef enum { DS_PREFILL_BATCH = 0, DS_PREFILL_DECODE = 1 } ds_prefill_mode;

typedef struct {
    int             n_predict;       /* max new tokens (>= 1)                  */
    ds_prefill_mode prefill;         /* batched prefill or token-by-token      */
    int             stop_at_eog;     /* stop at the tokenizer's end-of-generation */
    /* called for each new token as soon as it is chosen (may be NULL) */
    void          (*on_token)(void *user, int32_t token);
    void           *user;
} ds_gen_opts;

typedef struct {
    int    n_prompt, n_gen;
    double t_prefill, t_decode;      /* seconds                                */
    const char *stop;                /* "length", "eog", "context", "cancel"   */
} ds_gen_stats;

/* Prefill the prompt at position 0 of an empty context, then greedy-decode.
 * out must hold n_predict tokens. Returns 0 or -1 with err. */
int ds_generate_greedy(ds_ctx *c, const int32_t *prompt, int n_prompt, const ds_gen_opts *o,
                       int32_t *out, ds_gen_stats *st, char *err, size_t errlen);

/* Plain generation with a sampler (NULL or temp 0 = greedy, identical to
 * ds_generate_greedy). The token at absolute position q is
 * ds_sample(samp, logits_of(q-1), V, q). The sampler is an argument rather
 * than a ds_gen_opts field so positional initialisers of ds_gen_opts keep
 * compiling under -Wextra -Werror (-Wmissing-field-initializers). */
int ds_generate(ds_ctx *c, const int32_t *prompt, int n_prompt, const ds_gen_opts *o,
                const ds_sampler *samp, int32_t *out, ds_gen_stats *st, char *err, size_t errlen);

/* Optional hooks of a generation (plain here, speculative through
 * ds_spec_opts.hooks), for servers and the library's API:
 *   lp         per-row host logits processor (sampler.h ds_lproc): every row
 *              that chooses a token goes through lp->apply, every emitted
 *              token through lp->accept (before on_token);
 *   cancelled  polled before the prefill, between its chunks (m_max rows,
 *              so a cancel reaches inside a long prompt) and before each
 *              decode step; nonzero ends the generation there with stop
 *              "cancel" and the tokens emitted so far.
 * NULL hooks (ds_generate) is the same code with neither. */
typedef struct {
    const ds_lproc *lp;
    int           (*cancelled)(void *user);
    void           *user;
} ds_gen_hooks;

int ds_generate_ex(ds_ctx *c, const int32_t *prompt, int n_prompt, const ds_gen_opts *o, const ds_sampler *samp,
                   const ds_gen_hooks *h, int32_t *out, ds_gen_stats *st, char *err, size_t errlen);

/* 1 when the hooks say the generation is cancelled (NULL hooks: never). */
int ds_gen_cancelled(const ds_gen_hooks *h);

/* Prefill helper shared with the speculative loop: runs the prompt through
 * forward_batch (or decode row by row) and leaves the last row's logits in
 * `logits`; taps of every prompt row go to `taps` when non-NULL. */
int ds_prefill(ds_ctx *c, const int32_t *prompt, int n_prompt, ds_prefill_mode mode, float *logits,
               float *taps, char *err, size_t errlen);

#endif
