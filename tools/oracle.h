/* oracle.h — `dspark generate --oracle-accept SPEC`: the oracle-acceptance
 * benchmark. The drafter network runs every round for its real cost, but
 * its proposals are replaced (ds_spec_opts.draft_override) by the plain
 * run's own continuation, correct for exactly as many slots as a recorded
 * acceptance pattern says, so that a random drafter of a model's real shape
 * (make-drafter) times a whole speculative round — draft, verify, accept,
 * commit, transfers — at a chosen acceptance. Device-agnostic: it touches
 * token ids only. SPEC:
 *   FILE     a recorded pattern, replayed round by round (cycled): the
 *            --dump-block output of a real speculative run (its lines'
 *            accepted=A) or one integer per line ('#' comments allowed);
 *   rate:R   each drafted slot right with probability R in [0, 1],
 *            independently (a hash of position and slot: deterministic). */
#ifndef DSPARK_ORACLE_H
#define DSPARK_ORACLE_H

#include <stddef.h>
#include <stdint.h>

typedef struct {
    /* the pattern */
    int     *counts;        /* replay: accepted drafts of each recorded round */
    int      n_counts;
    double   rate;          /* rate mode when counts == NULL                  */
    char     label[96];     /* "replay:FILE" or "rate:R", for the stats line  */
    /* the reference continuation (the plain run): token of position
     * n_prompt + j is ref[j], j < n_ref; past it, eos when the plain run
     * stopped at an end-of-generation token, else 0 */
    const int32_t *ref;
    int      n_ref, n_prompt, n_vocab;
    int32_t  after_end;
    /* state */
    long     round;         /* drafting rounds so far                         */
    long     planned;       /* drafts the pattern asked to be right, in total */
} ds_oracle;

/* Parse SPEC (reads FILE). 0, or -1 with one error line; ds_oracle_free
 * releases what it holds either way. */
int ds_oracle_parse(ds_oracle *o, const char *spec, char *err, size_t errlen);
void ds_oracle_free(ds_oracle *o);
/* The ds_spec_opts.draft_override hook (user = the ds_oracle). */
void ds_oracle_draft(void *user, int p, int32_t anchor, int n, int32_t *ids, float *conf);
/* The pattern's mean accepted drafts per round (rate mode: for a block of
 * n_draft slots). */
double ds_oracle_mean(const ds_oracle *o, int n_draft);

#endif
