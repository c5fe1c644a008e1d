/* tokenizer_internal.h — shared internals of the tokenizer files.
 *
 *   tokenizer.c      hash maps, UTF-8 helpers, the GPT-2 byte<->unicode map,
 *                    construction from a ds_tok_spec, the GGUF loader,
 *                    special-token partitioning and the public API
 *   tokenizer_pre.c  the pre-tokenizers (tokenizer.ggml.pre): regex sequences, PCRE2
 *   tokenizer_bpe.c  byte-level BPE merging, the trainer
 *   tokenizer_spm.c  SentencePiece-style merge-by-score tokenization
 *
 * Nothing here is global mutable state: every table lives in the tokenizer
 * object (read-only after construction) or in per-call scratch buffers, so one
 * ds_tokenizer may be used from many threads at once. */
#ifndef DSPARK_TOKENIZER_INTERNAL_H
#define DSPARK_TOKENIZER_INTERNAL_H

#include "tokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

/* ---- llama.cpp token types (tokenizer.ggml.token_type) ---- */
enum {
    DS_TOKTYPE_UNDEFINED    = 0,
    DS_TOKTYPE_NORMAL       = 1,
    DS_TOKTYPE_UNKNOWN      = 2,
    DS_TOKTYPE_CONTROL      = 3,
    DS_TOKTYPE_USER_DEFINED = 4,
    DS_TOKTYPE_UNUSED       = 5,
    DS_TOKTYPE_BYTE         = 6,
};

typedef enum { DS_TOK_GPT2 = 1, DS_TOK_LLAMA = 2 } ds_tok_kind;

/* Pre-tokenizer regex sequences (tokenizer.ggml.pre); one per distinct
 * sequence llama.cpp has, several names may share one (tokenizer_pre.c). */
typedef enum {
    DS_PRE_GPT2 = 0, DS_PRE_LLAMA3 = 1, DS_PRE_QWEN2 = 2, DS_PRE_DEFAULT, DS_PRE_QWEN35,
    DS_PRE_DEEPSEEK_LLM, DS_PRE_DEEPSEEK_CODER, DS_PRE_DEEPSEEK3, DS_PRE_FALCON, DS_PRE_STARCODER,
    DS_PRE_JAIS2, DS_PRE_SPARK2_5, DS_PRE_YOUTU, DS_PRE_PORO, DS_PRE_VIKING, DS_PRE_TEKKEN,
    DS_PRE_CHAMELEON, DS_PRE_GPT4O, DS_PRE_GRANITE_EMB_MULTI, DS_PRE_BAILINGMOE, DS_PRE_SEED_CODER,
    DS_PRE_UFAKZEKA, DS_PRE_LAGUNA, DS_PRE_EXAONE_MOE, DS_PRE_MINICPM5, DS_PRE_KIMI_K2, DS_PRE_AFMOE,
    DS_PRE_TINY_AYA, DS_PRE_SUPERBPE, DS_PRE_NEWLINES,
    DS_PRE_COUNT
} ds_pre_kind;

/* ---- growable int32 vector (output ids, scratch) ---- */
typedef struct {
    int32_t *v;
    size_t n, cap;
} ds_i32vec;
int ds_i32vec_push(ds_i32vec *a, int32_t x);          /* 0, or -1 out of memory */

/* ---- string -> int32 map; keys are copied into the map's own arena ---- */
typedef struct {
    uint32_t *slot;        /* 0 = empty, else entry index + 1               */
    uint32_t  cap;         /* power of two                                   */
    uint32_t  n;           /* entries                                        */
    uint64_t *hash;        /* per entry                                      */
    size_t   *key_off;     /* per entry: offset into arena                   */
    uint32_t *key_len;
    int32_t  *val;
    uint32_t  entry_cap;
    char     *arena;
    size_t    arena_len, arena_cap;
} ds_strmap;
void    ds_strmap_free(ds_strmap *m);
int32_t ds_strmap_find(const ds_strmap *m, const char *s, size_t len);    /* -1 if absent */
/* Insert, or overwrite the value of an existing key. Returns the entry index
 * (>= 0), or -1 out of memory. */
int64_t ds_strmap_put(ds_strmap *m, const char *s, size_t len, int32_t val);
/* Key of entry i (entries are numbered in first-insertion order). */
static inline const char *ds_strmap_key(const ds_strmap *m, uint32_t i, size_t *len) {
    *len = m->key_len[i];
    return m->arena + m->key_off[i];
}

/* ---- uint64 -> int64 map (merge pairs, trainer pair counts) ----
 * Key and value share a slot so a lookup touches one cache line; the key
 * UINT64_MAX marks an empty slot and cannot be stored (pair keys never are:
 * token ids are below INT32_MAX). */
#define DS_U64MAP_EMPTY UINT64_MAX
typedef struct { uint64_t key; int64_t val; } ds_u64map_slot_t;
typedef struct {
    ds_u64map_slot_t *slot;
    size_t    cap, n;      /* cap is a power of two                          */
} ds_u64map;
void ds_u64map_free(ds_u64map *m);
int  ds_u64map_find(const ds_u64map *m, uint64_t key, int64_t *val);  /* 1 found, 0 not */
int  ds_u64map_put(ds_u64map *m, uint64_t key, int64_t val);          /* 0, -1 OOM      */
/* Pointer to the value slot, inserting `init` first when absent (NULL when
 * out of memory or key == DS_U64MAP_EMPTY). */
int64_t *ds_u64map_slot(ds_u64map *m, uint64_t key, int64_t init);

static inline uint64_t ds_pair_key(int32_t a, int32_t b) {
    return ((uint64_t)(uint32_t)a << 32) | (uint32_t)b;
}

/* ---- UTF-8 ---- */
/* Length (1..4) of the well-formed UTF-8 sequence at s (n bytes available), or
 * 0 if s does not start one. "Well-formed" is Unicode's definition, the same
 * PCRE2 checks: no overlongs, no surrogates, nothing above U+10FFFF. */
size_t ds_utf8_valid_len(const uint8_t *s, size_t n);
/* Decode one well-formed sequence (caller checked it); returns its length. */
size_t ds_utf8_decode(const uint8_t *s, uint32_t *cp);
/* Encode cp (< 0x110000) into out (4 bytes room); returns the length. */
size_t ds_utf8_encode(uint32_t cp, char *out);

/* ---- GPT-2 byte-level alphabet ----
 * Byte b is written as the code point byte_to_cp[b]: printable Latin-1 bytes
 * (33..126, 161..172, 174..255) stand for themselves, the other 68 bytes map
 * in order to U+0100..U+0143, so every token is printable text. */
void ds_gpt2_byte_alphabet(uint32_t byte_to_cp[256]);
/* Inverse: byte for code point cp, or -1 if cp is not in the alphabet. */
int  ds_gpt2_cp_to_byte(uint32_t cp);

/* ---- pre-tokenizer (PCRE2; tokenizer_pre.c) ---- */
#define DS_PRETOK_MAX 6                 /* regexes in the longest sequence  */
typedef struct {
    pcre2_code *re[DS_PRETOK_MAX];
    int n_re;
    uint8_t digit_groups[DS_PRETOK_MAX]; /* 1: re[k] finds \p{N} runs for afmoe's digit groups */
    int jit;               /* 1 if every regex is JIT-compiled               */
    ds_pre_kind kind;
} ds_pretok;
/* The sequence for a tokenizer.ggml.pre name (NULL = no key = llama.cpp's
 * "default"), with llama.cpp's per-name ignore_merges and add_bos default
 * (either pointer may be NULL). 0; -1 a name llama.cpp does not know; -2 a
 * name it knows whose splitting dspark does not implement. */
int  ds_pre_lookup(const char *name, ds_pre_kind *kind, int *ignore_merges, int *add_bos);
int  ds_pre_kind_from_name(const char *name, ds_pre_kind *out);   /* 0 or -1 */
/* 1 for the names llama.cpp runs as BPE over raw UTF-8 (escaped spaces, no
 * byte-level alphabet): sarvam-moe, gemma4, granite-embed-multi-311m. */
int  ds_pre_is_raw(const char *name);
/* The names ds_pre_lookup accepts (up to cap written); returns the count. */
size_t ds_pre_names(const char **names, size_t cap);
/* The kind's regexes as llama.cpp writes them, NULL-terminated. */
const char *const *ds_pre_patterns(ds_pre_kind kind);
int  ds_pretok_init(ds_pretok *p, ds_pre_kind kind, char *err, size_t errlen);
void ds_pretok_free(ds_pretok *p);
/* Split text into pre-tokens, calling emit(ctx, piece, len) for each, in
 * order; the pieces concatenate to the input exactly.
 *
 * Invalid UTF-8 never fails: the text is cut into maximal well-formed runs,
 * the regexes run on each run separately (so a run's end is end-of-subject
 * for look-aheads), and every byte that is not part of a well-formed sequence
 * becomes a pre-token of its own. Returns 0, or -1 with err (PCRE2 resource
 * errors, or a non-zero return of emit). */
typedef int (*ds_pretok_emit)(void *ctx, const char *piece, size_t len);
int  ds_pretok_split(const ds_pretok *p, const char *text, size_t len,
                     ds_pretok_emit emit, void *ctx, char *err, size_t errlen);

/* ---- the tokenizer object ---- */
struct ds_tokenizer {
    ds_tok_kind kind;
    char        model[8];          /* "gpt2" | "llama" | "gemma4"                  */
    char        pre[32];           /* tokenizer.ggml.pre as given ("" if absent)   */
    int32_t     n_vocab;

    int32_t    *type;              /* DS_TOKTYPE_* per token                        */
    float      *score;             /* per token (0 when the file has none)          */
    /* token text as stored in the vocabulary (byte-level alphabet for gpt2,
     * '▁' for spaces in llama): entry i of `vocab` has id i's text. */
    ds_strmap   vocab;             /* text -> id (last id wins on duplicates)       */
    size_t     *text_off;          /* per id, into vocab.arena (n_vocab entries)    */
    uint32_t   *text_len;
    /* raw bytes each token stands for (what ds_token_to_bytes returns) */
    char       *bytes;
    size_t     *bytes_off;         /* n_vocab + 1 offsets                          */

    int32_t     byte_token[256];   /* gpt2: id of the one-byte token; llama: <0xNN> */

    /* gpt2: merge pair (left id, right id) -> rank << 32 | result id */
    ds_u64map   merges;
    ds_pretok   pretok;
    int         ignore_merges;     /* llama3: whole pre-token found in vocab wins   */
    /* BPE over raw UTF-8 (sarvam-moe, gemma4, granite-embed-multi-311m):
     * spaces written U+2581, one symbol per character, a character without a
     * token falls back to its <0xNN> byte tokens; gemma4: a run of newlines
     * that is itself a token is emitted whole */
    int         raw;
    int         gemma4;

    int32_t     bos, eos, pad, mask, unk, eot, eom;   /* -1 = none                  */
    int         add_bos;           /* tokenizer.ggml.add_bos_token                   */
    int         add_space_prefix;  /* llama: tokenizer.ggml.add_space_prefix         */

    /* tokens matched literally in text when parsing specials (control,
     * user-defined, unknown), grouped by first byte, longest first */
    int32_t    *special_ids;
    size_t      n_special;
    size_t      n_user;            /* of them, user-defined (matched in either mode) */
    uint32_t    special_first[257];/* bucket b = special_ids[first[b] .. first[b+1]) */
};

static inline const char *ds_tok_text(const ds_tokenizer *t, int32_t id, size_t *len) {
    *len = t->text_len[id];
    return t->vocab.arena + t->text_off[id];
}

/* ---- in-memory construction (the loader and the tests use this) ---- */
typedef struct {
    const char *ptr;
    size_t len;
} ds_tok_str;

typedef struct {
    const char       *model;      /* "gpt2" | "llama"                               */
    const char       *pre;        /* tokenizer.ggml.pre; NULL = default             */
    int32_t           n_vocab;
    const ds_tok_str *tokens;     /* n_vocab                                        */
    const float      *scores;     /* n_vocab or NULL (all 0)                        */
    const int32_t    *types;      /* n_vocab or NULL (all normal)                   */
    const ds_tok_str *merges;     /* gpt2: "left right" each                        */
    size_t            n_merges;
    int32_t bos, eos, pad, mask, unk, eot, eom;     /* -1 = none; checked < n_vocab  */
    int               add_bos;
    int               add_space_prefix;
} ds_tok_spec;

/* A spec with every special id -1, add_bos 0, add_space_prefix 1. */
void ds_tok_spec_init(ds_tok_spec *s);
/* Build a tokenizer from a spec; everything is copied. NULL with err. */
ds_tokenizer *ds_tokenizer_from_spec(const ds_tok_spec *s, char *err, size_t errlen);

/* ---- per-model encoders of one text fragment (no specials inside) ---- */
/* gpt2 (tokenizer_bpe.c): pre-tokenize, then BPE each piece. */
int ds_bpe_encode(const ds_tokenizer *t, const char *text, size_t len, ds_i32vec *out,
                  char *err, size_t errlen);
/* gpt2 / gemma4 over raw UTF-8 (t->raw; tokenizer_bpe.c): spaces to U+2581,
 * pre-tokenize (newline runs apart), BPE each piece by character. */
int ds_rawbpe_encode(const ds_tokenizer *t, const char *text, size_t len, ds_i32vec *out,
                     char *err, size_t errlen);
/* llama (tokenizer_spm.c): escape spaces (prefixing '▁' when space_prefix),
 * then merge by score, falling back to byte tokens. */
int ds_spm_encode(const ds_tokenizer *t, const char *text, size_t len, int space_prefix,
                  ds_i32vec *out, char *err, size_t errlen);

/* ---- BPE trainer (tokenizer_bpe.c) ---- */
typedef struct {
    int32_t  n_vocab;
    char   **tokens;       /* byte-level alphabet text, NUL-terminated        */
    int32_t *types;
    char   **merges;       /* "left right"                                     */
    size_t   n_merges;
    int32_t  eot_id, mask_id;
} ds_bpe_vocab;
/* Learn a vocabulary of exactly n_vocab tokens (see ds_tokenizer_build_bpe). */
int  ds_bpe_train(const char *text, size_t len, int32_t n_vocab, ds_bpe_vocab *out,
                  char *err, size_t errlen);
void ds_bpe_vocab_free(ds_bpe_vocab *v);
/* Fill a spec pointing into v (valid while v and the returned arrays live);
 * *tok_strs and *merge_strs are malloc'd and must be freed by the caller. */
int  ds_bpe_vocab_spec(const ds_bpe_vocab *v, ds_tok_spec *s, ds_tok_str **tok_strs,
                       ds_tok_str **merge_strs);

#endif
