/* sampler.h — token selection as a deterministic function of the logits.
 *
 * temp == 0: greedy argmax (ties to the lowest id).
 * temp  > 0: Gumbel-max. The token at absolute position `pos` is
 *     argmax_i ( processed_logit_i / temp + g_i ),  g_i = -log(-log(u_i)),
 * with u_i from a counter-based RNG (Philox-4x32-10) keyed on (seed, pos, i).
 * Tokens removed by top-k / top-p / min-p get -inf. Processing order (HF's):
 * divide by temp, keep the top_k largest (ties: lower id first), then keep
 * the smallest set of most probable tokens (sorted by probability, ties by
 * lower id) whose softmax mass reaches top_p, then keep the tokens with
 * exp(x_i - x_max) >= min_p (x = logit / temp; the best token always stays). NaN logits count as -inf. Because the noise depends only
 * on (seed, pos, i), plain decoding and speculative decoding draw the same
 * token from the same logits: speculative sampling then emits the same bytes
 * as plain sampling for the same seed, and a drafter that uses the same
 * noise on its own logits (Gumbel coupling) proposes the target's sample
 * whenever its distribution is close. */
#ifndef DSPARK_SAMPLER_H
#define DSPARK_SAMPLER_H

#include <stdint.h>

typedef struct {
    float    temp;      /* 0 = greedy                                  */
    int      top_k;     /* 0 = off                                     */
    float    top_p;     /* 1 = off; (0, 1]                             */
    uint64_t seed;
    float    min_p;     /* 0 = off; [0, 1]: keep tokens whose probability
                           (after temp, top-k, top-p) is >= min_p times the
                           most probable token's                        */
} ds_sampler;

/* ---- per-row host logits processors ----------------------------------------
 * The hook behind presence / frequency penalties, logit_bias, a grammar mask
 * and logprob capture. A processor sees every row that chooses a token,
 * exactly as plain decoding would see it, and rewrites its logits before
 * ds_sample:
 *   apply(user, pos, extra, n_extra, logits, V)
 *       the row that chooses the token at absolute position pos. Its history
 *       is the sequence's committed tokens (each told to accept, in order)
 *       followed by extra[0..n_extra): nothing on a plain decode row or the
 *       prefill's last row; the drafts d_1..d_i on row i of a speculative
 *       verify (row 0 is the anchor's, n_extra = 0). Rows after a rejected
 *       draft are computed and discarded: the processor must not let them
 *       change what later rows see (keep committed state in accept only).
 *       Returns 0, or -1 (out of memory, a grammar that allows no token):
 *       the generation then fails.
 *   selected(user, pos, token)            (may be NULL)
 *       the token this row chose, right after apply and before the next
 *       row's apply (a capture of the row, e.g. its logprobs, can be
 *       completed here); discarded rows get it too.
 *   accept(user, pos, token)
 *       token is committed at pos (emitted, in order: the same calls in plain
 *       and speculative decoding).
 * The logits a processor sees are the canonical row's bits, so a processor
 * that is a pure function of (pos, history, logits) keeps speculative ==
 * plain. With a processor, selection runs on the host (a device downloads
 * the selected rows). */
typedef struct ds_lproc {
    int  (*apply)(void *user, int64_t pos, const int32_t *extra, int n_extra, float *logits, int V);
    void (*selected)(void *user, int64_t pos, int32_t token);
    void (*accept)(void *user, int64_t pos, int32_t token);
    void  *user;
} ds_lproc;

/* scratch: at least 2*V floats (top-k/top-p sorting) or NULL to allocate
 * internally. Returns the chosen token id, or -1 on allocation failure. */
int32_t ds_sample(const ds_sampler *s, const float *logits, int V, int64_t pos, float *scratch);

/* The uniform (0,1) draw for (seed, pos, i) — exposed for tests.
 * key = (seed lo32, seed hi32); counter = (pos lo32, pos hi32, i >> 1, 0);
 * one Philox block gives two draws: even i uses output words (0, 1), odd i
 * words (2, 3); u = (top 53 bits of (w_hi << 32 | w_lo) + 0.5) * 2^-53. */
double ds_philox_uniform(uint64_t seed, int64_t pos, uint32_t i);

/* The raw Philox-4x32-10 block function (Random123 layout): for KAT tests. */
void ds_philox4x32_10(const uint32_t ctr[4], const uint32_t key[2], uint32_t out[4]);

#endif
