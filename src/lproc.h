/* lproc.h — the standard chain of per-row logits processors (sampler.h
 * ds_lproc) behind the OpenAI / llama-server request fields, in this order
 * on each row that chooses a token:
 *
 *   1. capture    the row's log-probabilities: log-softmax of the raw logits
 *                 (before everything below, temperature and truncation: the
 *                 model's distribution, vLLM's raw_logprobs), in double; the
 *                 chosen token's and the top_n most probable (ties: lower id)
 *   2. logit_bias logits[id] += bias (a bias of -inf bans the token)
 *   3. penalties  OpenAI's: logits[t] -= count_t * frequency
 *                 + (count_t > 0) * presence, count_t = how often t was
 *                 generated so far (committed tokens plus the row's drafts;
 *                 the prompt does not count)
 *   4. grammar    tokens the grammar does not allow in the row's state get
 *                 -inf (grammar.h)
 *
 * Every step is a function of (the row's logits, its position, its history),
 * so a speculative verify row is processed exactly as the plain decode row
 * of that position. Float steps are one IEEE operation each, in the order
 * written (bias add, then one subtraction of the penalty); the capture's
 * exp and log are dsmath.h's (ds_exp, ds_log: one fixed sequence of IEEE
 * operations, not libm's), so the reported numbers are the same bits with
 * every C library too, and they never reach a logit. */
#ifndef DSPARK_LPROC_H
#define DSPARK_LPROC_H

#include <stdint.h>

#include "grammar.h"
#include "sampler.h"

#define DS_LPROC_TOP_MAX 20

typedef struct {
    float            presence, frequency;   /* 0 = off                           */
    const int32_t   *bias_id;               /* n_bias pairs (copied)             */
    const float     *bias;
    int              n_bias;
    const ds_grammar *grammar;              /* NULL = none (must outlive the chain) */
    int              capture;               /* 1: the chosen token's logprob ...  */
    int              top_n;                 /* ... and the top_n (0..20)          */
} ds_lchain_cfg;

typedef struct ds_lchain ds_lchain;

/* NULL with one error line (out of memory, a bad config). V: vocabulary size. */
ds_lchain *ds_lchain_new(const ds_lchain_cfg *cfg, int V, char *err, size_t errlen);
void       ds_lchain_free(ds_lchain *c);
/* The processor to hand to the generation (valid while the chain lives). */
const ds_lproc *ds_lchain_proc(ds_lchain *c);

/* What was captured for the token committed at pos (after its accept):
 * 1 with *logprob and the top list (ids and logprobs, most probable first),
 * 0 when nothing was (capture off, or pos not captured). */
int ds_lchain_captured(const ds_lchain *c, int64_t pos, float *logprob, int *n_top, const int32_t **top_id,
                       const float **top_lp);
/* 1 when the grammar has matched a complete text and no character may
 * follow (0 without a grammar). */
int ds_lchain_grammar_complete(const ds_lchain *c);
/* The error of a failed apply ("" when none). */
const char *ds_lchain_error(const ds_lchain *c);

#endif
