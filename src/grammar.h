/* grammar.h — grammar-constrained decoding: a context-free grammar (a GBNF
 * subset, llama.cpp's notation) compiled once per model, and a per-
 * generation matcher that turns "what may the text be next" into a mask over
 * the vocabulary.
 *
 * Grammar text:
 *   name ::= alternatives          one rule; `root` is where matching starts
 *   a b c                          a sequence          x | y    alternatives
 *   "text"                         a literal (escapes \n \r \t \\ \" \xHH
 *                                  \uHHHH \UHHHHHHHH; UTF-8 inside)
 *   [a-z0-9_] [^"\\]               a character class (code points; ^ negates)
 *   .                              any character
 *   ( ... )                        a group
 *   x* x+ x? x{m} x{m,} x{m,n}     repetition (n <= 10000)
 *   # ...                          a comment to the end of the line
 * A rule ends where the next `name ::=` begins. Left recursion is refused
 * (it cannot be matched left to right); everything else is a grammar.
 *
 * Matching is over code points of well-formed UTF-8 (a token may end inside
 * a character: the matcher keeps the pending bytes), with the grammar's
 * positions as a set of stacks (llama.cpp's model, here hash-consed: equal
 * stacks, sets and states are one id each, so a state's token mask and its
 * byte transitions are computed once and reused). A state is a pure
 * function of the grammar and the bytes consumed, so every row that has the
 * same history gets the same mask: a speculative verify row is masked
 * exactly as the plain decode row of that position.
 *
 * Tokens: a token is allowed in a state iff its bytes can be consumed from
 * it; tokens with no bytes (control tokens) are never allowed, except the
 * end-of-generation tokens, which are allowed exactly where the grammar can
 * end. The vocabulary's byte trie is part of the compiled grammar. */
#ifndef DSPARK_GRAMMAR_H
#define DSPARK_GRAMMAR_H

#include <stddef.h>
#include <stdint.h>

#include "tokenizer.h"

typedef struct ds_grammar ds_grammar;   /* read-only after compiling: share it */
typedef struct ds_gmatch ds_gmatch;     /* one generation's matcher            */

/* Compile grammar text for the tokenizer's vocabulary. NULL with one error
 * line (where, and what is wrong) on failure. */
ds_grammar *ds_grammar_new(const char *text, size_t len, const ds_tokenizer *tok, char *err, size_t errlen);
void        ds_grammar_free(ds_grammar *g);
int         ds_grammar_n_rules(const ds_grammar *g);

/* A matcher at the grammar's start. NULL on out of memory. */
ds_gmatch *ds_gmatch_new(const ds_grammar *g);
void       ds_gmatch_free(ds_gmatch *m);

/* States are ids >= 0; DS_GSTATE_DEAD: no continuation matches. */
#define DS_GSTATE_DEAD (-1)
int ds_gmatch_start(ds_gmatch *m);
/* The state after bytes from state s (DS_GSTATE_DEAD when they cannot be
 * matched), or -2 when the matcher ran out of memory or the grammar's stack
 * grew past its depth limit (ds_gmatch_error says which). */
int ds_gmatch_bytes(ds_gmatch *m, int s, const char *bytes, size_t n);
/* The state after token t (its bytes; an end-of-generation token leaves the
 * state as it is). */
int ds_gmatch_token(ds_gmatch *m, int s, int32_t t);
/* 1 when the grammar can end in state s (no character pending). */
int ds_gmatch_can_end(const ds_gmatch *m, int s);
/* 1 when state s can end and no character may follow. */
int ds_gmatch_complete(const ds_gmatch *m, int s);
/* Set logits[t] = -inf for every token not allowed in state s. Returns the
 * number of allowed tokens (0: none, the caller decides), or -1 on error. */
int ds_gmatch_mask(ds_gmatch *m, int s, float *logits, int V);
/* 1 when token t is allowed in state s (the mask's rule, for one token). */
int ds_gmatch_allowed(ds_gmatch *m, int s, int32_t t);
/* The last error ("" when none). */
const char *ds_gmatch_error(const ds_gmatch *m);

/* The JSON grammar behind response_format json_object (an object at the
 * top, RFC 8259 values inside, bounded whitespace between tokens). */
extern const char ds_grammar_json_object[];

#endif
