/* tokenizer.c — common parts of the tokenizers: hash maps, UTF-8 helpers,
 * the GPT-2 byte alphabet, construction from an in-memory spec, the GGUF
 * loader, special-token partitioning and the public API.
 *
 * The model-specific encoders live in tokenizer_bpe.c (gpt2) and
 * tokenizer_spm.c (llama). A ds_tokenizer is immutable after construction;
 * ds_tokenize keeps its scratch on the caller's stack/heap, so one tokenizer
 * may serve many threads. */
#include "tokenizer_internal.h"

#include <stdlib.h>
#include <limits.h>

/* ======================================================================
 * growable int32 vector
 * ====================================================================== */

int ds_i32vec_push(ds_i32vec *a, int32_t x) {
    if (a->n == a->cap) {
        size_t nc = a->cap ? a->cap * 2 : 64;
        int32_t *nv = realloc(a->v, nc * sizeof *nv);
        if (!nv) return -1;
        a->v = nv;
        a->cap = nc;
    }
    a->v[a->n++] = x;
    return 0;
}

/* ======================================================================
 * string -> int32 map (open addressing, linear probing)
 * ====================================================================== */

static uint64_t hash_bytes(const char *s, size_t len) {
    /* FNV-1a, then a final avalanche so the low bits (the slot) mix well */
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < len; i++) { h ^= (uint8_t)s[i]; h *= 1099511628211ull; }
    h ^= h >> 33; h *= 0xff51afd7ed558ccdull; h ^= h >> 33;
    return h;
}

void ds_strmap_free(ds_strmap *m) {
    free(m->slot); free(m->hash); free(m->key_off); free(m->key_len); free(m->val); free(m->arena);
    memset(m, 0, sizeof *m);
}

int32_t ds_strmap_find(const ds_strmap *m, const char *s, size_t len) {
    if (!m->cap) return -1;
    uint64_t h = hash_bytes(s, len);
    for (uint32_t i = (uint32_t)h & (m->cap - 1);; i = (i + 1) & (m->cap - 1)) {
        uint32_t e = m->slot[i];
        if (!e) return -1;
        e--;
        if (m->hash[e] == h && m->key_len[e] == len && !memcmp(m->arena + m->key_off[e], s, len))
            return m->val[e];
    }
}

static int strmap_grow_slots(ds_strmap *m) {
    uint32_t nc = m->cap ? m->cap * 2 : 256;
    uint32_t *ns = calloc(nc, sizeof *ns);
    if (!ns) return -1;
    for (uint32_t e = 0; e < m->n; e++) {
        uint32_t i = (uint32_t)m->hash[e] & (nc - 1);
        while (ns[i]) i = (i + 1) & (nc - 1);
        ns[i] = e + 1;
    }
    free(m->slot);
    m->slot = ns;
    m->cap = nc;
    return 0;
}

static int strmap_grow_entries(ds_strmap *m) {
    uint32_t nc = m->entry_cap ? m->entry_cap * 2 : 256;
    uint64_t *h = realloc(m->hash, nc * sizeof *h);
    if (!h) return -1;
    m->hash = h;
    size_t *o = realloc(m->key_off, nc * sizeof *o);
    if (!o) return -1;
    m->key_off = o;
    uint32_t *l = realloc(m->key_len, nc * sizeof *l);
    if (!l) return -1;
    m->key_len = l;
    int32_t *v = realloc(m->val, nc * sizeof *v);
    if (!v) return -1;
    m->val = v;
    m->entry_cap = nc;
    return 0;
}

int64_t ds_strmap_put(ds_strmap *m, const char *s, size_t len, int32_t val) {
    if (len > UINT32_MAX || m->n >= (UINT32_MAX >> 2)) return -1;
    /* keep the load factor at or below 1/2 */
    if ((uint64_t)(m->n + 1) * 2 > m->cap && strmap_grow_slots(m)) return -1;
    uint64_t h = hash_bytes(s, len);
    uint32_t i = (uint32_t)h & (m->cap - 1);
    for (;; i = (i + 1) & (m->cap - 1)) {
        uint32_t e = m->slot[i];
        if (!e) break;
        e--;
        if (m->hash[e] == h && m->key_len[e] == len && !memcmp(m->arena + m->key_off[e], s, len)) {
            m->val[e] = val;
            return e;
        }
    }
    if (m->n == m->entry_cap && strmap_grow_entries(m)) return -1;
    if (m->arena_len + len + 1 > m->arena_cap) {
        size_t nc = m->arena_cap ? m->arena_cap : 4096;
        while (m->arena_len + len + 1 > nc) nc *= 2;
        char *na = realloc(m->arena, nc);
        if (!na) return -1;
        m->arena = na;
        m->arena_cap = nc;
    }
    memcpy(m->arena + m->arena_len, s, len);
    m->arena[m->arena_len + len] = 0;   /* keys stay NUL-terminated for debugging */
    uint32_t e = m->n++;
    m->hash[e] = h;
    m->key_off[e] = m->arena_len;
    m->key_len[e] = (uint32_t)len;
    m->val[e] = val;
    m->arena_len += len + 1;
    m->slot[i] = e + 1;
    return e;
}

/* ======================================================================
 * uint64 -> int64 map
 * ====================================================================== */

static uint64_t hash_u64(uint64_t x) {
    x ^= x >> 33; x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33; x *= 0xc4ceb9fe1a85ec53ull;
    x ^= x >> 33;
    return x;
}

void ds_u64map_free(ds_u64map *m) {
    free(m->slot);
    memset(m, 0, sizeof *m);
}

int ds_u64map_find(const ds_u64map *m, uint64_t key, int64_t *val) {
    if (!m->cap) return 0;
    for (size_t i = hash_u64(key) & (m->cap - 1);; i = (i + 1) & (m->cap - 1)) {
        const ds_u64map_slot_t *e = &m->slot[i];
        if (e->key == key) { *val = e->val; return 1; }
        if (e->key == DS_U64MAP_EMPTY) return 0;
    }
}

static int u64map_grow(ds_u64map *m) {
    size_t nc = m->cap ? m->cap * 2 : 1024;
    ds_u64map_slot_t *ns = malloc(nc * sizeof *ns);
    if (!ns) return -1;
    for (size_t i = 0; i < nc; i++) ns[i].key = DS_U64MAP_EMPTY;
    for (size_t j = 0; j < m->cap; j++) {
        if (m->slot[j].key == DS_U64MAP_EMPTY) continue;
        size_t i = hash_u64(m->slot[j].key) & (nc - 1);
        while (ns[i].key != DS_U64MAP_EMPTY) i = (i + 1) & (nc - 1);
        ns[i] = m->slot[j];
    }
    free(m->slot);
    m->slot = ns;
    m->cap = nc;
    return 0;
}

int64_t *ds_u64map_slot(ds_u64map *m, uint64_t key, int64_t init) {
    if (key == DS_U64MAP_EMPTY) return NULL;
    if ((m->n + 1) * 2 > m->cap && u64map_grow(m)) return NULL;
    size_t i = hash_u64(key) & (m->cap - 1);
    for (; m->slot[i].key != DS_U64MAP_EMPTY; i = (i + 1) & (m->cap - 1))
        if (m->slot[i].key == key) return &m->slot[i].val;
    m->slot[i].key = key;
    m->slot[i].val = init;
    m->n++;
    return &m->slot[i].val;
}

int ds_u64map_put(ds_u64map *m, uint64_t key, int64_t val) {
    int64_t *p = ds_u64map_slot(m, key, val);
    if (!p) return -1;
    *p = val;
    return 0;
}

/* ======================================================================
 * UTF-8
 * ====================================================================== */

size_t ds_utf8_valid_len(const uint8_t *s, size_t n) {
    if (n == 0) return 0;
    uint8_t c = s[0];
    if (c < 0x80) return 1;
#define CONT(k) ((s[k] & 0xc0) == 0x80)
    if (c >= 0xc2 && c <= 0xdf) return (n >= 2 && CONT(1)) ? 2 : 0;
    if (c >= 0xe0 && c <= 0xef) {
        if (n < 3 || !CONT(1) || !CONT(2)) return 0;
        if (c == 0xe0 && s[1] < 0xa0) return 0;              /* overlong    */
        if (c == 0xed && s[1] > 0x9f) return 0;              /* surrogates  */
        return 3;
    }
    if (c >= 0xf0 && c <= 0xf4) {
        if (n < 4 || !CONT(1) || !CONT(2) || !CONT(3)) return 0;
        if (c == 0xf0 && s[1] < 0x90) return 0;              /* overlong    */
        if (c == 0xf4 && s[1] > 0x8f) return 0;              /* > U+10FFFF  */
        return 4;
    }
#undef CONT
    return 0;   /* continuation byte, 0xc0/0xc1, 0xf5..0xff */
}

size_t ds_utf8_decode(const uint8_t *s, uint32_t *cp) {
    if (s[0] < 0x80) { *cp = s[0]; return 1; }
    if (s[0] < 0xe0) { *cp = ((uint32_t)(s[0] & 0x1f) << 6) | (s[1] & 0x3f); return 2; }
    if (s[0] < 0xf0) {
        *cp = ((uint32_t)(s[0] & 0x0f) << 12) | ((uint32_t)(s[1] & 0x3f) << 6) | (s[2] & 0x3f);
        return 3;
    }
    *cp = ((uint32_t)(s[0] & 0x07) << 18) | ((uint32_t)(s[1] & 0x3f) << 12) |
          ((uint32_t)(s[2] & 0x3f) << 6) | (s[3] & 0x3f);
    return 4;
}

size_t ds_utf8_encode(uint32_t cp, char *out) {
    uint8_t *o = (uint8_t *)out;
    if (cp < 0x80) { o[0] = (uint8_t)cp; return 1; }
    if (cp < 0x800) { o[0] = (uint8_t)(0xc0 | (cp >> 6)); o[1] = (uint8_t)(0x80 | (cp & 0x3f)); return 2; }
    if (cp < 0x10000) {
        o[0] = (uint8_t)(0xe0 | (cp >> 12)); o[1] = (uint8_t)(0x80 | ((cp >> 6) & 0x3f));
        o[2] = (uint8_t)(0x80 | (cp & 0x3f));
        return 3;
    }
    o[0] = (uint8_t)(0xf0 | (cp >> 18)); o[1] = (uint8_t)(0x80 | ((cp >> 12) & 0x3f));
    o[2] = (uint8_t)(0x80 | ((cp >> 6) & 0x3f)); o[3] = (uint8_t)(0x80 | (cp & 0x3f));
    return 4;
}

/* ======================================================================
 * GPT-2 byte alphabet
 * ====================================================================== */

static int gpt2_byte_is_printable(unsigned b) {
    return (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
}

void ds_gpt2_byte_alphabet(uint32_t byte_to_cp[256]) {
    uint32_t next = 256;
    for (unsigned b = 0; b < 256; b++)
        byte_to_cp[b] = gpt2_byte_is_printable(b) ? b : next++;
}

int ds_gpt2_cp_to_byte(uint32_t cp) {
    if (cp < 256) return gpt2_byte_is_printable(cp) ? (int)cp : -1;
    if (cp >= 256 + 68) return -1;
    /* the (cp - 256)-th non-printable byte, in byte order */
    uint32_t k = cp - 256;
    for (unsigned b = 0; b < 256; b++)
        if (!gpt2_byte_is_printable(b) && k-- == 0) return (int)b;
    return -1;
}

/* ======================================================================
 * construction from a spec
 * ====================================================================== */

void ds_tok_spec_init(ds_tok_spec *s) {
    memset(s, 0, sizeof *s);
    s->bos = s->eos = s->pad = s->mask = s->unk = s->eot = s->eom = -1;
    s->add_space_prefix = 1;
}

void ds_tokenizer_free(ds_tokenizer *t) {
    if (!t) return;
    free(t->type); free(t->score); free(t->text_off); free(t->text_len);
    free(t->bytes); free(t->bytes_off); free(t->special_ids);
    ds_strmap_free(&t->vocab);
    ds_u64map_free(&t->merges);
    ds_pretok_free(&t->pretok);
    free(t);
}

/* "<0xNN>": a byte token's text */
static int is_hex_byte_token(const char *s, size_t len) {
    if (len != 6 || memcmp(s, "<0x", 3) || s[5] != '>') return 0;
    for (int i = 3; i < 5; i++) {
        char c = s[i];
        if (!((c >= '0' && c <= '9') || (c >= 'A' && c <= 'F') || (c >= 'a' && c <= 'f'))) return 0;
    }
    return 1;
}

/* Bytes of one token for ds_token_to_bytes, appended to buf (capacity is
 * ensured by the caller: a token never decodes to more bytes than its text). */
static size_t decode_token_bytes(const ds_tokenizer *t, int32_t id, char *out) {
    size_t len;
    const uint8_t *s = (const uint8_t *)ds_tok_text(t, id, &len);
    int type = t->type[id];
    if (type == DS_TOKTYPE_CONTROL || type == DS_TOKTYPE_UNUSED) return 0;
    if (type == DS_TOKTYPE_USER_DEFINED || type == DS_TOKTYPE_UNKNOWN) {
        memcpy(out, s, len);      /* added tokens are stored as plain text */
        return len;
    }
    size_t n = 0;
    /* raw UTF-8 BPE (sarvam-moe, gemma4) writes its tokens as SentencePiece
     * does: U+2581 for spaces, <0xNN> byte tokens */
    if (t->kind == DS_TOK_LLAMA || t->raw) {
        if (type == DS_TOKTYPE_BYTE || (t->raw && is_hex_byte_token((const char *)s, len))) {
            out[0] = (char)strtoul((const char *)s + 3, NULL, 16);
            return 1;
        }
        for (size_t i = 0; i < len;) {      /* '▁' (e2 96 81) -> ' ' */
            if (i + 3 <= len && s[i] == 0xe2 && s[i + 1] == 0x96 && s[i + 2] == 0x81) {
                out[n++] = ' ';
                i += 3;
            } else {
                out[n++] = (char)s[i++];
            }
        }
        return n;
    }
    /* gpt2: each alphabet code point is one byte; anything else (not
     * produced by byte-level BPE, but possible in odd vocabularies) is kept
     * as its UTF-8 text */
    for (size_t i = 0; i < len;) {
        size_t l = ds_utf8_valid_len(s + i, len - i);
        uint32_t cp;
        int b;
        if (l && ds_utf8_decode(s + i, &cp) && (b = ds_gpt2_cp_to_byte(cp)) >= 0) {
            out[n++] = (char)b;
            i += l;
        } else {
            if (!l) l = 1;
            memcpy(out + n, s + i, l);
            n += l;
            i += l;
        }
    }
    return n;
}

typedef struct { uint8_t first; uint32_t len; int32_t id; } special_sort_item;

static int special_cmp(const void *a, const void *b) {
    const special_sort_item *x = a, *y = b;
    if (x->first != y->first) return x->first < y->first ? -1 : 1;
    if (x->len != y->len) return x->len > y->len ? -1 : 1;   /* longest first */
    return x->id < y->id ? -1 : (x->id > y->id);
}

/* Tokens matched literally in text: control, user-defined and unknown ones
 * with non-empty text (llama.cpp's parse_special set). */
static int build_special_index(ds_tokenizer *t) {
    size_t n = 0;
    for (int32_t i = 0; i < t->n_vocab; i++) {
        int ty = t->type[i];
        if ((ty == DS_TOKTYPE_CONTROL || ty == DS_TOKTYPE_USER_DEFINED || ty == DS_TOKTYPE_UNKNOWN) &&
            t->text_len[i] > 0)
            n++;
    }
    special_sort_item *items = malloc((n ? n : 1) * sizeof *items);
    t->special_ids = malloc((n ? n : 1) * sizeof *t->special_ids);
    if (!items || !t->special_ids) { free(items); return -1; }
    size_t k = 0;
    for (int32_t i = 0; i < t->n_vocab; i++) {
        int ty = t->type[i];
        size_t len;
        const char *s = ds_tok_text(t, i, &len);
        if ((ty == DS_TOKTYPE_CONTROL || ty == DS_TOKTYPE_USER_DEFINED || ty == DS_TOKTYPE_UNKNOWN) && len > 0)
            items[k++] = (special_sort_item){ (uint8_t)s[0], (uint32_t)len, i };
    }
    qsort(items, n, sizeof *items, special_cmp);
    memset(t->special_first, 0, sizeof t->special_first);
    t->n_user = 0;
    for (size_t i = 0; i < n; i++) {
        t->special_ids[i] = items[i].id;
        t->n_user += t->type[items[i].id] == DS_TOKTYPE_USER_DEFINED;
        t->special_first[items[i].first + 1]++;
    }
    for (int b = 0; b < 256; b++) t->special_first[b + 1] += t->special_first[b];
    t->n_special = n;
    free(items);
    return 0;
}

static int check_special_id(int32_t id, const char *key, int32_t n_vocab, char *err, size_t errlen) {
    if (id < -1 || id >= n_vocab) {
        ds_errf(err, errlen, "tokenizer.ggml.%s = %d is out of range (n_vocab %d)", key, id, n_vocab);
        return -1;
    }
    return 0;
}

/* gpt2 merges "left right" -> (left id, right id) -> rank << 32 | result id. */
static int build_merges(ds_tokenizer *t, const ds_tok_spec *s, char *err, size_t errlen) {
    if (s->n_merges > INT32_MAX) {
        ds_errf(err, errlen, "tokenizer.ggml.merges has too many entries (%zu)", s->n_merges);
        return -1;
    }
    char *cat = NULL;
    size_t cat_cap = 0;
    for (size_t r = 0; r < s->n_merges; r++) {
        const char *m = s->merges[r].ptr;
        size_t len = s->merges[r].len;
        /* the separator is the first space after position 0, as in llama.cpp
         * (byte-level tokens never contain a space; this also tolerates a
         * left part that starts with one) */
        const char *sp = len > 1 ? memchr(m + 1, ' ', len - 1) : NULL;
        if (!sp) {
            ds_errf(err, errlen, "tokenizer.ggml.merges[%zu] = '%.*s' is not of the form 'left right'",
                    r, (int)(len > 64 ? 64 : len), m);
            free(cat);
            return -1;
        }
        size_t llen = (size_t)(sp - m), rlen = len - llen - 1;
        int32_t a = ds_strmap_find(&t->vocab, m, llen);
        int32_t b = ds_strmap_find(&t->vocab, sp + 1, rlen);
        if (llen + rlen > cat_cap) {
            cat_cap = (llen + rlen) * 2;
            char *nc = realloc(cat, cat_cap);
            if (!nc) { free(cat); ds_errf(err, errlen, "out of memory"); return -1; }
            cat = nc;
        }
        memcpy(cat, m, llen);
        memcpy(cat + llen, sp + 1, rlen);
        int32_t c = ds_strmap_find(&t->vocab, cat, llen + rlen);
        /* A merge naming a token the vocabulary lacks can never fire on ids;
         * it is skipped rather than rejected, like an unreachable rule. */
        if (a < 0 || b < 0 || c < 0) continue;
        int64_t old;
        if (ds_u64map_find(&t->merges, ds_pair_key(a, b), &old)) continue;   /* first rank wins */
        if (ds_u64map_put(&t->merges, ds_pair_key(a, b), ((int64_t)r << 32) | (uint32_t)c)) {
            free(cat);
            ds_errf(err, errlen, "out of memory");
            return -1;
        }
    }
    free(cat);
    return 0;
}

ds_tokenizer *ds_tokenizer_from_spec(const ds_tok_spec *s, char *err, size_t errlen) {
    ds_tok_kind kind;
    if (!s->model) { ds_errf(err, errlen, "missing tokenizer.ggml.model"); return NULL; }
    /* gemma4's own model is BPE over raw UTF-8 with the gemma4 pre-tokenizer,
     * whatever tokenizer.ggml.pre says (llama.cpp) */
    int model_gemma4 = !strcmp(s->model, "gemma4");
    const char *pre_name = model_gemma4 ? "gemma4" : s->pre;
    if (!strcmp(s->model, "gpt2") || model_gemma4) kind = DS_TOK_GPT2;
    else if (!strcmp(s->model, "llama")) kind = DS_TOK_LLAMA;
    else {
        ds_errf(err, errlen, "unsupported tokenizer.ggml.model '%.64s' (supported: gpt2, llama, gemma4)", s->model);
        return NULL;
    }
    ds_pre_kind pre = DS_PRE_GPT2;
    int ignore_merges = 0;
    if (kind == DS_TOK_GPT2) {
        int r = ds_pre_lookup(pre_name, &pre, &ignore_merges, NULL);
        if (r == -2) {
            ds_errf(err, errlen, "tokenizer.ggml.pre '%.64s' is not supported (llama.cpp splits it at whitespace "
                    "into raw UTF-8 pieces; dspark has no such tokenizer)", s->pre);
            return NULL;
        }
        if (r) {
            ds_errf(err, errlen, "unsupported tokenizer.ggml.pre '%.64s' (not a pre-tokenizer llama.cpp knows)",
                    s->pre);
            return NULL;
        }
    }
    int32_t n = s->n_vocab;
    if (n <= 0 || !s->tokens) { ds_errf(err, errlen, "tokenizer.ggml.tokens is empty"); return NULL; }
    if (check_special_id(s->bos, "bos_token_id", n, err, errlen) ||
        check_special_id(s->eos, "eos_token_id", n, err, errlen) ||
        check_special_id(s->pad, "padding_token_id", n, err, errlen) ||
        check_special_id(s->mask, "mask_token_id", n, err, errlen) ||
        check_special_id(s->unk, "unknown_token_id", n, err, errlen) ||
        check_special_id(s->eot, "eot_token_id", n, err, errlen) ||
        check_special_id(s->eom, "eom_token_id", n, err, errlen))
        return NULL;

    ds_tokenizer *t = calloc(1, sizeof *t);
    if (!t) { ds_errf(err, errlen, "out of memory"); return NULL; }
    t->kind = kind;
    snprintf(t->model, sizeof t->model, "%s", model_gemma4 ? "gemma4" : kind == DS_TOK_GPT2 ? "gpt2" : "llama");
    snprintf(t->pre, sizeof t->pre, "%.31s", pre_name ? pre_name : "");
    t->raw = kind == DS_TOK_GPT2 && ds_pre_is_raw(pre_name);
    t->gemma4 = t->raw && strcmp(pre_name, "sarvam-moe");     /* llama.cpp's GEMMA4 pre type */
    t->n_vocab = n;
    t->bos = s->bos; t->eos = s->eos; t->pad = s->pad; t->mask = s->mask;
    t->unk = s->unk; t->eot = s->eot; t->eom = s->eom;
    t->add_bos = s->add_bos;
    t->add_space_prefix = s->add_space_prefix;
    t->ignore_merges = kind == DS_TOK_GPT2 && ignore_merges;

    t->type = malloc((size_t)n * sizeof *t->type);
    t->score = malloc((size_t)n * sizeof *t->score);
    t->text_off = malloc((size_t)n * sizeof *t->text_off);
    t->text_len = malloc((size_t)n * sizeof *t->text_len);
    t->bytes_off = malloc(((size_t)n + 1) * sizeof *t->bytes_off);
    if (!t->type || !t->score || !t->text_off || !t->text_len || !t->bytes_off) goto oom;

    size_t total_text = 0;
    for (int32_t i = 0; i < n; i++) {
        int32_t ty = s->types ? s->types[i] : DS_TOKTYPE_NORMAL;
        if (ty < DS_TOKTYPE_UNDEFINED || ty > DS_TOKTYPE_BYTE) {
            ds_errf(err, errlen, "tokenizer.ggml.token_type[%d] = %d is not a token type (0..6)", i, ty);
            goto fail;
        }
        if (s->tokens[i].len > UINT32_MAX / 4) {
            ds_errf(err, errlen, "tokenizer.ggml.tokens[%d] is too long (%zu bytes)", i, s->tokens[i].len);
            goto fail;
        }
        if (ty == DS_TOKTYPE_BYTE && (kind == DS_TOK_LLAMA || t->raw) &&
            !is_hex_byte_token(s->tokens[i].ptr, s->tokens[i].len)) {
            ds_errf(err, errlen, "tokenizer.ggml.tokens[%d] = '%.*s' has type byte but is not <0xNN>", i,
                    (int)(s->tokens[i].len > 32 ? 32 : s->tokens[i].len), s->tokens[i].ptr);
            goto fail;
        }
        t->type[i] = ty;
        t->score[i] = s->scores ? s->scores[i] : 0.0f;
        int64_t e = ds_strmap_put(&t->vocab, s->tokens[i].ptr, s->tokens[i].len, i);
        if (e < 0) goto oom;
        t->text_off[i] = t->vocab.key_off[e];
        t->text_len[i] = (uint32_t)s->tokens[i].len;
        total_text += s->tokens[i].len;
    }

    /* decoded bytes of every token, computed once */
    t->bytes = malloc(total_text + 1);
    if (!t->bytes) goto oom;
    size_t off = 0;
    for (int32_t i = 0; i < n; i++) {
        t->bytes_off[i] = off;
        off += decode_token_bytes(t, i, t->bytes + off);
    }
    t->bytes_off[n] = off;

    for (int b = 0; b < 256; b++) t->byte_token[b] = -1;
    if (t->raw) {
        /* the byte fallback looks the tokens up by text, as llama.cpp does */
        for (int b = 0; b < 256; b++) {
            char hx[8];
            snprintf(hx, sizeof hx, "<0x%02X>", b);
            t->byte_token[b] = ds_strmap_find(&t->vocab, hx, 6);
        }
        if (build_merges(t, s, err, errlen)) goto fail;
        if (ds_pretok_init(&t->pretok, pre, err, errlen)) goto fail;
    } else if (kind == DS_TOK_GPT2) {
        /* A byte may lack a token: gpt-neox style vocabularies have none for
         * the bytes that never occur in valid UTF-8 (0xc0, 0xc1, 0xf5..0xff).
         * Such a byte is encoded as U+FFFD (ds_bpe_encode), which llama.cpp
         * puts in place of every invalid byte; the replacement must then be
         * encodable. */
        uint32_t b2cp[256];
        ds_gpt2_byte_alphabet(b2cp);
        int missing = -1;
        for (int b = 0; b < 256; b++) {
            char u[4];
            size_t ul = ds_utf8_encode(b2cp[b], u);
            t->byte_token[b] = ds_strmap_find(&t->vocab, u, ul);
            if (t->byte_token[b] < 0 && missing < 0) missing = b;
        }
        if (missing >= 0 && (t->byte_token[0xef] < 0 || t->byte_token[0xbf] < 0 || t->byte_token[0xbd] < 0)) {
            ds_errf(err, errlen, "gpt2 vocabulary has no token for byte 0x%02x (U+%04X), nor for the bytes of "
                    "U+FFFD to stand in for it", missing, (unsigned)b2cp[missing]);
            goto fail;
        }
        if (build_merges(t, s, err, errlen)) goto fail;
        if (ds_pretok_init(&t->pretok, pre, err, errlen)) goto fail;
    } else {
        for (int32_t i = 0; i < n; i++) {
            if (t->type[i] != DS_TOKTYPE_BYTE) continue;
            size_t len;
            const char *txt = ds_tok_text(t, i, &len);
            int b = (int)strtoul(txt + 3, NULL, 16);
            if (t->byte_token[b] < 0) t->byte_token[b] = i;
        }
    }
    if (build_special_index(t)) goto oom;
    return t;
oom:
    ds_errf(err, errlen, "out of memory building the tokenizer");
fail:
    ds_tokenizer_free(t);
    return NULL;
}

/* ======================================================================
 * GGUF loader
 * ====================================================================== */

#define TK "tokenizer.ggml."

/* Optional token id key: absent leaves *out unchanged. */
static int load_id(const gguf_ctx *g, const char *key, int32_t *out, char *err, size_t errlen) {
    uint32_t v;
    int r = gguf_get_u32(g, key, &v);
    if (r == -1) return 0;
    if (r != 0) { ds_errf(err, errlen, "%s is not an unsigned 32-bit integer", key); return -1; }
    if (v > INT32_MAX) { ds_errf(err, errlen, "%s = %u is out of range", key, v); return -1; }
    *out = (int32_t)v;
    return 0;
}

static int load_bool(const gguf_ctx *g, const char *key, int *out, char *err, size_t errlen) {
    int v;
    int r = gguf_get_bool(g, key, &v);
    if (r == -1) return 0;
    if (r != 0) { ds_errf(err, errlen, "%s is not a bool", key); return -1; }
    *out = v != 0;
    return 0;
}

/* A string key copied into buf; 1 if present, 0 absent, -1 error. */
static int load_str(const gguf_ctx *g, const char *key, char *buf, size_t cap, char *err, size_t errlen) {
    gguf_str s;
    int r = gguf_get_str(g, key, &s);
    if (r == -1) return 0;
    if (r != 0) { ds_errf(err, errlen, "%s is not a string", key); return -1; }
    if (s.len >= cap) {
        ds_errf(err, errlen, "%s = '%.*s...' is too long", key, 32, s.ptr);
        return -1;
    }
    memcpy(buf, s.ptr, s.len);
    buf[s.len] = 0;
    return 1;
}

/* An array key of the given element class; NULL with *present = 0 if absent. */
static const gguf_kv *load_array(const gguf_ctx *g, const char *key, int want_string, int *present,
                                 char *err, size_t errlen) {
    const gguf_kv *kv = gguf_find_kv(g, key);
    *present = kv != NULL;
    if (!kv) return NULL;
    int ok = kv->type == GGUF_T_ARRAY;
    if (ok && want_string) ok = kv->arr_type == GGUF_T_STRING;
    if (ok && !want_string) ok = kv->arr_type != GGUF_T_STRING && kv->arr_type != GGUF_T_ARRAY;
    if (!ok) {
        ds_errf(err, errlen, "%s is not an array of %s", key, want_string ? "strings" : "numbers");
        *present = -1;
        return NULL;
    }
    return kv;
}

ds_tokenizer *ds_tokenizer_load(const gguf_ctx *g, char *err, size_t errlen) {
    char model[32], pre[64];
    int present;
    int r = load_str(g, TK "model", model, sizeof model, err, errlen);
    if (r < 0) return NULL;
    if (r == 0) { ds_errf(err, errlen, "missing " TK "model"); return NULL; }
    if (strcmp(model, "gpt2") && strcmp(model, "llama") && strcmp(model, "gemma4")) {
        ds_errf(err, errlen, "unsupported " TK "model '%s' (supported: gpt2, llama, gemma4)", model);
        return NULL;
    }
    int is_gpt2 = strcmp(model, "llama") != 0;       /* gpt2, gemma4: BPE with merges */
    int model_gemma4 = !strcmp(model, "gemma4");
    r = load_str(g, TK "pre", pre, sizeof pre, err, errlen);
    if (r < 0) return NULL;

    ds_tok_spec spec;
    ds_tok_spec_init(&spec);
    spec.model = model;
    spec.pre = r ? pre : NULL;
    if (!is_gpt2) { spec.bos = 1; spec.eos = 2; spec.unk = 0; spec.add_bos = 1; }  /* llama.cpp SPM defaults */
    if (is_gpt2) {
        /* llama.cpp's defaults for a file without the keys: bos = eos = 11
         * (GPT-2's id; glm4 / chatglm-bpe: no bos), and add_bos_token true
         * for the llama3 names, tekken and chameleon */
        spec.bos = spec.pre && (!strcmp(spec.pre, "glm4") || !strcmp(spec.pre, "chatglm-bpe")) ? -1 : 11;
        spec.eos = 11;
        if (model_gemma4) spec.bos = spec.eos = -1;   /* gemma4's model: no default ids */
        ds_pre_kind k;
        int ab = 0;
        if (ds_pre_lookup(spec.pre, &k, NULL, &ab) == 0) spec.add_bos = ab;
    }

    ds_tok_str *toks = NULL, *merges = NULL;
    float *scores = NULL;
    int32_t *types = NULL;
    ds_tokenizer *t = NULL;

    const gguf_kv *kt = load_array(g, TK "tokens", 1, &present, err, errlen);
    if (present < 0) return NULL;
    if (!kt) { ds_errf(err, errlen, "missing " TK "tokens"); return NULL; }
    if (kt->arr_n == 0 || kt->arr_n > INT32_MAX - 1) {
        ds_errf(err, errlen, TK "tokens has %llu entries", (unsigned long long)kt->arr_n);
        return NULL;
    }
    int32_t n = (int32_t)kt->arr_n;
    spec.n_vocab = n;
    if (spec.bos >= n) spec.bos = -1;
    if (spec.eos >= n) spec.eos = -1;
    if (spec.unk >= n) spec.unk = -1;

    toks = malloc((size_t)n * sizeof *toks);
    if (!toks) goto oom;
    for (int32_t i = 0; i < n; i++) {
        gguf_str s;
        if (gguf_arr_str(kt, (uint64_t)i, &s)) {
            ds_errf(err, errlen, "cannot read " TK "tokens[%d]", i);
            goto done;
        }
        toks[i] = (ds_tok_str){ s.ptr, (size_t)s.len };
    }
    spec.tokens = toks;

    const gguf_kv *ks = load_array(g, TK "scores", 0, &present, err, errlen);
    if (present < 0) goto done;
    if (ks) {
        if (ks->arr_n != (uint64_t)n) {
            ds_errf(err, errlen, TK "scores has %llu entries but " TK "tokens has %d",
                    (unsigned long long)ks->arr_n, n);
            goto done;
        }
        if (!(scores = malloc((size_t)n * sizeof *scores))) goto oom;
        for (int32_t i = 0; i < n; i++)
            if (gguf_arr_f32(ks, (uint64_t)i, &scores[i])) {
                ds_errf(err, errlen, TK "scores[%d] is not a float", i);
                goto done;
            }
        spec.scores = scores;
    }

    const gguf_kv *ky = load_array(g, TK "token_type", 0, &present, err, errlen);
    if (present < 0) goto done;
    if (ky) {
        if (ky->arr_n != (uint64_t)n) {
            ds_errf(err, errlen, TK "token_type has %llu entries but " TK "tokens has %d",
                    (unsigned long long)ky->arr_n, n);
            goto done;
        }
        if (!(types = malloc((size_t)n * sizeof *types))) goto oom;
        for (int32_t i = 0; i < n; i++) {
            int64_t v;
            if (gguf_arr_i64(ky, (uint64_t)i, &v) || v < INT32_MIN || v > INT32_MAX) {
                ds_errf(err, errlen, TK "token_type[%d] is not a 32-bit integer", i);
                goto done;
            }
            types[i] = (int32_t)v;
        }
        spec.types = types;
    }

    if (is_gpt2) {
        const gguf_kv *km = load_array(g, TK "merges", 1, &present, err, errlen);
        if (present < 0) goto done;
        /* llama.cpp loads kimi-k2 without merges (every character its own token) */
        int merges_optional = spec.pre && !strcmp(spec.pre, "kimi-k2");
        if (!km && !merges_optional) {
            ds_errf(err, errlen, "missing " TK "merges (required for model gpt2)");
            goto done;
        }
        if (km && km->arr_n > INT32_MAX) {
            ds_errf(err, errlen, TK "merges has %llu entries", (unsigned long long)km->arr_n);
            goto done;
        }
        uint64_t n_merges = km ? km->arr_n : 0;
        if (!(merges = malloc((n_merges ? n_merges : 1) * sizeof *merges))) goto oom;
        for (uint64_t i = 0; i < n_merges; i++) {
            gguf_str s;
            if (gguf_arr_str(km, i, &s)) {
                ds_errf(err, errlen, "cannot read " TK "merges[%llu]", (unsigned long long)i);
                goto done;
            }
            merges[i] = (ds_tok_str){ s.ptr, (size_t)s.len };
        }
        spec.merges = merges;
        spec.n_merges = (size_t)n_merges;
    }

    if (load_id(g, TK "bos_token_id", &spec.bos, err, errlen) ||
        load_id(g, TK "eos_token_id", &spec.eos, err, errlen) ||
        load_id(g, TK "padding_token_id", &spec.pad, err, errlen) ||
        load_id(g, TK "mask_token_id", &spec.mask, err, errlen) ||
        load_id(g, TK "unknown_token_id", &spec.unk, err, errlen) ||
        load_id(g, TK "eot_token_id", &spec.eot, err, errlen) ||
        load_id(g, TK "eom_token_id", &spec.eom, err, errlen) ||
        load_bool(g, TK "add_bos_token", &spec.add_bos, err, errlen) ||
        load_bool(g, TK "add_space_prefix", &spec.add_space_prefix, err, errlen))
        goto done;
    /* llama.cpp turns add_bos_token on for its gemma4 pre type, whatever the
     * file says */
    if (model_gemma4 || (is_gpt2 && spec.pre && (!strcmp(spec.pre, "gemma4") ||
                                                 !strcmp(spec.pre, "granite-embed-multi-311m"))))
        spec.add_bos = 1;

    t = ds_tokenizer_from_spec(&spec, err, errlen);
    goto done;
oom:
    ds_errf(err, errlen, "out of memory loading the tokenizer");
done:
    free(toks); free(merges); free(scores); free(types);
    return t;
}

/* ======================================================================
 * public API
 * ====================================================================== */

int32_t ds_tokenizer_n_vocab(const ds_tokenizer *t) { return t->n_vocab; }
int32_t ds_tokenizer_bos(const ds_tokenizer *t) { return t->bos; }
int32_t ds_tokenizer_eos(const ds_tokenizer *t) { return t->eos; }
int32_t ds_tokenizer_mask(const ds_tokenizer *t) { return t->mask; }
int32_t ds_tokenizer_pad(const ds_tokenizer *t) { return t->pad; }
int     ds_tokenizer_add_bos_default(const ds_tokenizer *t) { return t->add_bos; }
const char *ds_tokenizer_model(const ds_tokenizer *t) { return t->model; }

int ds_tokenizer_is_eog(const ds_tokenizer *t, int32_t id) {
    return id >= 0 && (id == t->eos || id == t->eot || id == t->eom);
}

int ds_tokenizer_token_type(const ds_tokenizer *t, int32_t id) {
    return (id < 0 || id >= t->n_vocab) ? -1 : t->type[id];
}

int32_t ds_tokenizer_find(const ds_tokenizer *t, const char *text, size_t len) {
    return ds_strmap_find(&t->vocab, text, len);
}

int ds_token_to_bytes(const ds_tokenizer *t, int32_t id, char *buf, size_t cap) {
    if (id < 0 || id >= t->n_vocab) return -1;
    size_t n = t->bytes_off[id + 1] - t->bytes_off[id];
    if (buf && cap) memcpy(buf, t->bytes + t->bytes_off[id], n < cap ? n : cap);
    return n > INT_MAX ? INT_MAX : (int)n;
}

/* Encode one fragment of plain text with the model's encoder. */
static int encode_fragment(const ds_tokenizer *t, const char *s, size_t len, int after_special,
                           ds_i32vec *out, char *err, size_t errlen) {
    if (t->raw) return ds_rawbpe_encode(t, s, len, out, err, errlen);
    if (t->kind == DS_TOK_GPT2) return ds_bpe_encode(t, s, len, out, err, errlen);
    /* llama.cpp SPM: the space prefix goes before the first fragment and
     * before every fragment that follows a special token */
    return ds_spm_encode(t, s, len, t->add_space_prefix && after_special, out, err, errlen);
}

/* Longest special token starting at s (n bytes left), or -1. Without
 * parse_special only user-defined tokens count: llama.cpp (as Hugging Face
 * tokenizers) splits them out before everything else in either mode, and
 * skips control and unknown ones. */
static int32_t match_special(const ds_tokenizer *t, const char *s, size_t n, int parse_special, size_t *mlen) {
    uint8_t b = (uint8_t)s[0];
    for (uint32_t k = t->special_first[b]; k < t->special_first[b + 1]; k++) {
        int32_t id = t->special_ids[k];
        if (!parse_special && t->type[id] != DS_TOKTYPE_USER_DEFINED) continue;
        size_t len;
        const char *txt = ds_tok_text(t, id, &len);
        if (len <= n && !memcmp(txt, s, len)) { *mlen = len; return id; }
    }
    return -1;
}

int ds_tokenize_ex(const ds_tokenizer *t, const char *text, size_t len, int add_bos, int parse_special,
                   int32_t **out, size_t *n_out, char *err, size_t errlen) {
    ds_i32vec v = {0};
    *out = NULL;
    *n_out = 0;
    if (!text && len) { ds_errf(err, errlen, "ds_tokenize: NULL text"); return -1; }
    if (add_bos && t->bos >= 0 && ds_i32vec_push(&v, t->bos)) goto oom;

    /* Partition into plain-text fragments and special tokens. At each byte
     * the longest special token starting there wins (llama.cpp instead takes
     * specials longest-first over the whole text; the two differ only when
     * special texts overlap each other). */
    size_t frag = 0, pos = 0;
    int after_special = 1;
    while ((parse_special ? t->n_special : t->n_user) && pos < len) {
        size_t mlen;
        int32_t id = match_special(t, text + pos, len - pos, parse_special, &mlen);
        if (id < 0) { pos++; continue; }
        if (pos > frag) {
            if (encode_fragment(t, text + frag, pos - frag, after_special, &v, err, errlen)) goto fail;
        }
        if (ds_i32vec_push(&v, id)) goto oom;
        pos += mlen;
        frag = pos;
        after_special = 1;
    }
    if (len > frag && encode_fragment(t, text + frag, len - frag, after_special, &v, err, errlen)) goto fail;

    if (!v.v && !(v.v = malloc(sizeof *v.v))) goto oom;   /* never hand back NULL on success */
    *out = v.v;
    *n_out = v.n;
    return 0;
oom:
    ds_errf(err, errlen, "out of memory while tokenizing");
fail:
    free(v.v);
    return -1;
}

int ds_tokenize(const ds_tokenizer *t, const char *text, size_t len, int add_bos,
                int32_t **out, size_t *n_out, char *err, size_t errlen) {
    return ds_tokenize_ex(t, text, len, add_bos, 1, out, n_out, err, errlen);
}
