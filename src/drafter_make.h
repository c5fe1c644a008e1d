/* drafter_make.h — deterministic random-weight DSpark drafter GGUF files
 * (`dspark make-drafter`, tests, benchmarks). The drafter's trunk shape is
 * the target's (n_embd, heads, head_dim, n_ff, rope, eps), as in DeepSpec's
 * draft config; the embedding and LM head are the target's and are not
 * written (the legacy layout carries a copy of token_embd, as PrismML's
 * files do, which the loader checks and ignores). Same options and target
 * -> same bytes; the same seed gives the same weights in both layouts. */
#ifndef DSPARK_DRAFTER_MAKE_H
#define DSPARK_DRAFTER_MAKE_H

#include "model.h"

typedef struct {
    const char *layout;        /* "dflash" (mainline) or "dspark" (legacy)        */
    int      n_layer;          /* drafter layers                                  */
    int      block_size;       /* gamma                                           */
    int      n_taps;           /* 0 = default spread over the target's layers     */
    int      taps[DS_MAX_TAPS];/* HF ids (layer outputs), strictly increasing     */
    const char *markov;        /* "vanilla" | "gated" | "rnn"                     */
    int      rank;             /* Markov rank r; 0 = no Markov head               */
    int      confidence;       /* 1 = confidence head (with Markov when r > 0)    */
    int      correction;       /* correction head width; 0 = none                 */
    int32_t  mask_id;          /* -1 = n_vocab - 1                                */
    uint32_t type;             /* 2-D weights (ds_type); norms/biases are F32     */
    long     seed;
} ds_make_drafter_opts;

void ds_make_drafter_defaults(ds_make_drafter_opts *o);
/* Default taps for a target of n_layer layers: min(5, n_layer) ids spread
 * evenly, (i+1)*n_layer/(n+1) for small spreads, always strictly increasing. */
int  ds_make_drafter_default_taps(int n_layer_target, int *taps);
/* Write the drafter for `target` to `out`. 0, or -1 with one error line. */
int  ds_make_drafter(const ds_make_drafter_opts *o, const ds_model *target, const char *out, char *err, size_t errlen);

#endif
