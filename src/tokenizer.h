/* tokenizer.h — tokenizers read from GGUF metadata (llama.cpp keys).
 *
 *   tokenizer.ggml.model = "gpt2"   byte-level BPE: tokens + merges, the
 *                                   pre-tokenizer regex sequence chosen by
 *                                   tokenizer.ggml.pre (llama.cpp's names),
 *                                   run with PCRE2.
 *   tokenizer.ggml.model = "llama"  SentencePiece-style: tokens + scores,
 *                                   byte fallback tokens <0xNN>.
 * Special tokens: tokenizer.ggml.bos_token_id / eos_token_id /
 * padding_token_id / mask_token_id, token_type (3 = control). */
#ifndef DSPARK_TOKENIZER_H
#define DSPARK_TOKENIZER_H

#include "common.h"
#include "gguf.h"

typedef struct ds_tokenizer ds_tokenizer;

/* NULL on error (missing/invalid keys) with one line in err. Keeps no
 * pointer into g after returning (safe to gguf_close afterwards). */
ds_tokenizer *ds_tokenizer_load(const gguf_ctx *g, char *err, size_t errlen);
void ds_tokenizer_free(ds_tokenizer *t);

int32_t ds_tokenizer_n_vocab(const ds_tokenizer *t);
int32_t ds_tokenizer_bos(const ds_tokenizer *t);   /* -1 if none */
int32_t ds_tokenizer_eos(const ds_tokenizer *t);   /* -1 if none */
/* 1 if id ends generation (eos, or eot/eom tokens when the file names them) */
int     ds_tokenizer_is_eog(const ds_tokenizer *t, int32_t id);
const char *ds_tokenizer_model(const ds_tokenizer *t);  /* "gpt2" | "llama" */

/* Text -> ids. *out is malloc'd (free() it). add_bos prepends BOS when the
 * vocabulary has one. Invalid UTF-8 is handled byte-wise (never an error in
 * gpt2 mode; byte fallback in llama mode). Returns 0 or -1 with err.
 * Control / user-defined / unknown tokens written literally in the text
 * ("<|endoftext|>") become their ids (llama.cpp parse_special); see
 * ds_tokenize_ex to turn that off. A tokenizer is read-only after loading:
 * concurrent calls on one ds_tokenizer are safe. */
int ds_tokenize(const ds_tokenizer *t, const char *text, size_t len, int add_bos,
                int32_t **out, size_t *n_out, char *err, size_t errlen);

/* The raw bytes a token stands for (byte-level decoded for gpt2, '▁' -> ' '
 * and <0xNN> -> byte for llama). Control tokens give 0 bytes. Returns the
 * byte count, which may exceed cap (then only cap bytes were written); -1 if
 * id is out of range. Detokenizing = concatenating these bytes. */
int ds_token_to_bytes(const ds_tokenizer *t, int32_t id, char *buf, size_t cap);

/* ---- additions (beyond the original contract) ---- */

/* ds_tokenize with explicit special-token parsing. parse_special = 1 (what
 * ds_tokenize does) matches control / user-defined / unknown tokens that
 * appear literally in text ("<|endoftext|>") as their ids; 0 matches only
 * user-defined ones (llama.cpp does too; they decode to their own text) and
 * treats the rest as plain text, which makes detokenize(tokenize(s)) == s
 * hold for gpt2 for every byte string (control tokens decode to 0 bytes). */
int ds_tokenize_ex(const ds_tokenizer *t, const char *text, size_t len, int add_bos, int parse_special,
                   int32_t **out, size_t *n_out, char *err, size_t errlen);
int32_t ds_tokenizer_mask(const ds_tokenizer *t);   /* -1 if none (tokenizer.ggml.mask_token_id) */
int32_t ds_tokenizer_pad(const ds_tokenizer *t);    /* -1 if none */
/* tokenizer.ggml.add_bos_token (llama default 1, gpt2 default 0): what a
 * caller should pass as add_bos when it has no opinion. */
int     ds_tokenizer_add_bos_default(const ds_tokenizer *t);
/* llama.cpp token type of id (1 normal, 2 unknown, 3 control, 4 user
 * defined, 5 unused, 6 byte); -1 if id is out of range. */
int     ds_tokenizer_token_type(const ds_tokenizer *t, int32_t id);
/* Id of the token whose vocabulary text (byte-level alphabet for gpt2, with
 * '▁' for llama) is exactly text; -1 if none. */
int32_t ds_tokenizer_find(const ds_tokenizer *t, const char *text, size_t len);

/* Build a byte-level BPE vocabulary (gpt2 model, "default"/"qwen2"
 * pre-tokenizer) of exactly n_vocab tokens (>= 256 + n_special) from training
 * text, deterministically, and write its tokenizer.ggml.* keys into w. Used
 * by `dspark make-model`. Special tokens appended at the end:
 * <|endoftext|> (bos = eos) and <|mask|> (tokenizer.ggml.mask_token_id). */
int ds_tokenizer_build_bpe(gguf_writer *w, const char *text, size_t len, int32_t n_vocab,
                           char *err, size_t errlen);
/* The same, with the token list padded to n_total entries (n_total >
 * n_vocab: "<|unused_pad_N|>" tokens of type UNUSED), so that the list has
 * one token per embedding row as llama.cpp requires. */
int ds_tokenizer_build_bpe_padded(gguf_writer *w, const char *text, size_t len, int32_t n_vocab,
                                  int32_t n_total, char *err, size_t errlen);

#endif
