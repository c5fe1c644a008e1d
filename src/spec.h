/* spec.h — the speculative loop (dspark-spec.md §5.4) for one sequence:
 * a DSpark block drafter proposes, the target verifies the block in ONE
 * ds_forward_batch, the longest prefix that matches the target's own
 * samples is accepted plus one bonus token, and the verifier's KV rows are
 * committed directly (or replayed through ds_decode).
 *
 * Tokens are chosen with ds_sample (sampler.h): greedy, or Gumbel-max with
 * noise keyed on (seed, absolute position, token id). A draft token is
 * accepted iff it equals the target's sample at that position, so with
 * canonical kernels and direct commit the output is byte-identical to plain
 * generation (ds_generate) with the same sampler. With fast kernels the
 * verifier's bits differ from decode's and the output may differ; replay
 * commit re-decodes the accepted tokens, re-checks every acceptance on the
 * decode logits and takes the decode sample on a mismatch ("fixup"), so
 * replay output equals plain generation with ANY kernel set. */
#ifndef DSPARK_SPEC_H
#define DSPARK_SPEC_H

#include "drafter.h"
#include "generate.h"
#include "model.h"
#include "sampler.h"

#define DS_SPEC_MAX_GAMMA 64        /* largest block size the loop handles   */

typedef enum { DS_COMMIT_DIRECT = 0, DS_COMMIT_REPLAY = 1 } ds_commit_mode;

/* How many of the drafted tokens are verified each round (ell):
 *   NONE   ell = draft_max;
 *   PMIN   confidence truncation: the first slot k with c_k < p_min stops
 *          the draft (ell = k - 1, possibly 0);
 *   TABLE  single-stream cost-table scheduler (paper Alg. 1 with one
 *          stream): a_j = prod_{i<=j} c_i; ell maximises
 *          (1 + sum_{j<=ell} a_j) * SPS(1 + ell), scanning ell = 1.. and
 *          stopping at the first non-improvement. SPS(B) = 1/seconds per
 *          verify pass of width B. When p_min > 0 the p_min truncation caps
 *          the scan first.
 *   AUTO   cost-aware and measured, for this machine and this stream: before
 *          each round, from the verify seconds per pass of every width (the
 *          SPS table as the prior, then the loop's own verify timings, a
 *          line a + b (w - 1) fitted over the widths), the drafting round's
 *          and the commit's measured seconds, and the acceptance rate of
 *          each depth measured on this stream (decayed counts: the chance
 *          that draft j is accepted once drafts 1..j-1 were), ell maximises
 *          the round's expected tokens per second, (1 + sum_{j<=ell} prod_{i<=j}
 *          q_i) / (draft + commit + verify(ell + 1)). When no ell beats a
 *          plain step (one-row verify + commit) the round does not draft
 *          at all (ell = 0, the drafter only takes the row in), so
 *          speculation is never much slower than plain decoding; plain runs
 *          are probed with a full-width round after 8, 16, .. 64 plain steps,
 *          and every 8th speculative round verifies the full width to keep
 *          the deep acceptance counts fresh. Needs the SPS table, not a
 *          confidence head. Output bytes: the same as every mode (the
 *          choice of ell never changes what is accepted, only how much).
 * PMIN and TABLE need a drafter with a confidence head. */
typedef enum { DS_SCHED_NONE = 0, DS_SCHED_PMIN = 1, DS_SCHED_TABLE = 2, DS_SCHED_AUTO = 3 } ds_sched_mode;

/* One round as seen by an observer (diagnostics, --dump-block). */
typedef struct {
    int            round;           /* 0-based                                        */
    int            p;               /* anchor position                                */
    int32_t        anchor;
    int            n_draft;         /* drafts computed (draft_max; 0 when the round    */
    const int32_t *ids;             /*   could verify nothing and skipped the drafter) */
    const float   *conf;            /* n_draft confidences or NULL (no head)          */
    int            ell;             /* drafts verified                                */
    int            accepted;        /* a (after replay fix-ups)                       */
    int32_t        bonus;
} ds_spec_round;

typedef struct {
    int             n_predict;      /* max new tokens (>= 1)                          */
    ds_prefill_mode prefill;        /* batched prefill or token by token              */
    int             stop_at_eog;    /* stop at the tokenizer's end-of-generation      */
    ds_sampler      samp;           /* temp 0 = greedy; the drafter uses it too       */
    int             draft_max;      /* drafts kept per round, 1..gamma; 0 = gamma     */
    ds_sched_mode   sched;
    float           p_min;          /* PMIN threshold (and TABLE cap when > 0)        */
    const double   *sps_sec;        /* TABLE, AUTO: sps_sec[w-1] = seconds per pass   */
    int             n_sps;          /*   of width w, for w = 1..n_sps (>= draft_max+1) */
    ds_commit_mode  commit;
    void          (*on_token)(void *user, int32_t token);   /* may be NULL            */
    void           *user;
    void          (*on_round)(void *round_user, const ds_spec_round *r); /* may be  */
    void           *round_user;     /* NULL; called after each round's commit, before */
                                    /* that round's tokens are emitted                */
    /* Testing / diagnostics only (NULL in normal use): called after ds_draft
     * with the n drafted ids and confidences (conf NULL without a head); it
     * may overwrite them, e.g. an oracle proposing known continuations so
     * that long accepts, accepted EOGs and full-block commits are exercised
     * on random weights. The drafter's own state is unaffected. */
    void          (*draft_override)(void *user, int p, int32_t anchor, int n, int32_t *ids, float *conf);
    void           *override_user;
    /* 1: every round waits for its drafts before queueing the verify (two
     * synchronisations a round), so that draft_s and verify_s time the two
     * apart. 0 (default): when the verify width does not depend on the
     * drafts (no scheduler, no hook reading them), the verify is queued
     * behind the draft on the device and reads its ids there; the host
     * waits once per round and t_draft is only the queueing. Same tokens. */
    int             draft_wait;
    /* NULL (default): the drafter context lives for this call. Else the
     * caller keeps it between generations: *keep (NULL at first) is reused
     * when it fits this target context, drafter and draft_max (its recorded
     * launch sequences and MASK cache are then made already) and holds the
     * drafter context after a successful call. The caller frees it with
     * ds_dctx_free before the drafter and the target context. */
    ds_dctx       **keep;
    /* NULL, or the generation's hooks (generate.h ds_gen_hooks): a logits
     * processor sees the verify's rows with the drafts before them as extra
     * history (row i: d_1..d_i) and every emitted token once, as in plain
     * decoding (rounds are then never queued: the host needs the drafts);
     * the cancel poll runs between prefill chunks and before each round. */
    const ds_gen_hooks *hooks;
} ds_spec_opts;

/* Defaults: n_predict 128, batched prefill, stop at EOG, greedy, draft_max =
 * gamma, no scheduler, direct commit. */
void ds_spec_opts_default(ds_spec_opts *o);

typedef struct {
    int    n_prompt, n_gen;
    int    gamma, draft_max;
    int    rounds;                  /* verify passes after the prefill              */
    long   drafted;                 /* sum of ell (tokens sent to verification)     */
    long   accepted;                /* sum of a (draft tokens accepted)             */
    long   emitted_in_rounds;       /* tokens emitted by rounds (accepted + bonus, after stop truncation) */
    double mean_accepted_len;       /* (accepted + rounds) / rounds: a+1 incl. bonus */
    long   accept_hist[DS_SPEC_MAX_GAMMA];     /* [k-1]: rounds that accepted slot k */
    long   len_hist[DS_SPEC_MAX_GAMMA + 1];    /* [a]: rounds that accepted exactly a */
    long   width_hist[DS_SPEC_MAX_GAMMA + 1];  /* [ell]: rounds that verified ell drafts */
    long   plain_rounds;            /* AUTO: rounds that did not draft (a plain step) */
    int    auto_first_plain;        /* AUTO: the first plain round (when plain_rounds > 0) */
    double auto_pred_spec_tok_s;    /* AUTO: at the last plain decision, the best ell's */
    double auto_pred_plain_tok_s;   /*   predicted tok/s and a plain step's            */
    long   replay_fixups;           /* REPLAY: acceptances overturned by decode logits */
    long   queued_rounds;           /* rounds whose verify was queued behind the draft */
    long   ahead_rounds;            /* ... and whose drafter context rows ran while the
                                       host waited for the verify (spec.c: ahead) */
    double t_prefill;               /* target prefill + drafter context rows + first sample */
    double t_draft, t_verify, t_accept, t_commit, t_total;   /* seconds; accept = sampling */
    double tok_s;                   /* (n_gen - 1) / (t_total - t_prefill): like plain's
                                       decode_tok_s (the first token comes from the prefill) */
    const char *stop;               /* "length", "eog", "context", "cancel"         */
} ds_spec_stats;

/* Speculative generation for one sequence from an empty target context.
 * Each round drafts draft_max tokens (the drafter always runs its full
 * gamma-row block), the scheduler picks ell, and ell is then clamped by the
 * context (p + ell < n_ctx) and by the remaining budget (ell <= n_predict -
 * n_gen - 1); a round whose clamp is 0 verifies the anchor alone.
 * The target's tap list is set to the drafter's tap layers (ds_set_taps) and
 * left that way. The drafter KV cache is created and freed inside (n_ctx of
 * the target plus gamma). out must hold o->n_predict tokens. Never writes a
 * target KV row at or past target->n_ctx: each round's verify width is
 * clamped so p + ell < n_ctx, and generation stops ("context") once the next
 * anchor's position reaches n_ctx — exactly where plain generation stops.
 * When it stops, the target's KV rows (and the drafter's context rows) are
 * cut to what plain decoding leaves at that token: every emitted token but
 * the last decoded (the last too when an end-of-generation token stopped
 * it), so a stop inside an accepted block leaves plain's state.
 * Returns 0, or -1 with one error line. */
int ds_spec_generate(ds_ctx *target, const ds_drafter *d, const int32_t *prompt, int n_prompt,
                     const ds_spec_opts *o, int32_t *out, ds_spec_stats *st, char *err, size_t errlen);

/* Measure seconds per ds_forward_batch pass at widths 1..max_width on the
 * target (median of `reps` timed runs after one warm-up, at positions
 * 0..w-1 of an emptied context, logits ALL + the current taps, as verify
 * does). Leaves the context empty (n_past 0). sec[w-1] receives the value. */
int ds_spec_measure_sps(ds_ctx *target, int max_width, int reps, double *sec, char *err, size_t errlen);

/* Read an SPS table file: lines "width seconds_per_pass" ('#' comments and
 * blank lines allowed); every width 1..max_width must be present, values
 * positive and finite. 0, or -1 with one error line naming the file/line. */
int ds_spec_load_sps(const char *path, int max_width, double *sec, char *err, size_t errlen);

/* The scheduler alone (exposed for tests): the ell chosen from confidences
 * conf[0..n) for the given mode; sps_sec as in ds_spec_opts. */
int ds_spec_choose_len(ds_sched_mode mode, const float *conf, int n, float p_min, const double *sps_sec,
                       int n_sps);

/* "direct" / "replay", "none" / "pmin" / "table" / "auto" */
const char *ds_commit_name(ds_commit_mode m);
const char *ds_sched_name(ds_sched_mode m);

#endif
