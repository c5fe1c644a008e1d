/* tokenizer_spm.c — llama (SentencePiece-style) tokenization.
 *
 * The text is escaped (' ' -> U+2581 '▁', with one '▁' prefixed when asked),
 * cut into characters, and then the adjacent pair whose concatenation is a
 * vocabulary token with the highest score is merged, repeatedly, until no
 * pair forms a token (ties: leftmost pair first). A final symbol that is not
 * a token falls back to its bytes as <0xNN> tokens (or the unknown token).
 *
 * Invalid UTF-8: every byte that does not start a well-formed sequence is a
 * symbol of its own, so it ends up as a byte token without swallowing the
 * valid characters after it. (llama.cpp instead takes the sequence length
 * the lead byte announces, which can glue following ASCII bytes into one
 * byte-fallback symbol; both round-trip, they differ only in that case.) */
#include "tokenizer_internal.h"

#include <stdlib.h>

typedef struct { int32_t prev, next; size_t start, n; } spm_sym;   /* n == 0: merged away */
typedef struct { float score; int32_t left; size_t size; } spm_cand;

typedef struct {
    const ds_tokenizer *t;
    const char *text;
    spm_sym *sym;
    spm_cand *heap;
    size_t heap_n, heap_cap;
} spm_session;

/* Tokens plain text may merge into: not control / unknown / unused / byte
 * tokens, whose text is a name rather than the characters it spells. */
static int spm_mergeable(int type) {
    return type == DS_TOKTYPE_NORMAL || type == DS_TOKTYPE_UNDEFINED || type == DS_TOKTYPE_USER_DEFINED;
}

static int32_t spm_lookup(const ds_tokenizer *t, const char *s, size_t n) {
    int32_t id = ds_strmap_find(&t->vocab, s, n);
    return (id >= 0 && spm_mergeable(t->type[id])) ? id : -1;
}

/* higher score first; equal scores: leftmost first */
static int spm_before(const spm_cand *x, const spm_cand *y) {
    return x->score > y->score || (x->score == y->score && x->left < y->left);
}

static int spm_push(spm_session *s, spm_cand c) {
    if (s->heap_n == s->heap_cap) {
        size_t nc = s->heap_cap ? s->heap_cap * 2 : 64;
        spm_cand *nh = realloc(s->heap, nc * sizeof *nh);
        if (!nh) return -1;
        s->heap = nh;
        s->heap_cap = nc;
    }
    size_t i = s->heap_n++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!spm_before(&c, &s->heap[p])) break;
        s->heap[i] = s->heap[p];
        i = p;
    }
    s->heap[i] = c;
    return 0;
}

static spm_cand spm_pop(spm_session *s) {
    spm_cand top = s->heap[0], last = s->heap[--s->heap_n];
    size_t i = 0, n = s->heap_n;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= n) break;
        if (c + 1 < n && spm_before(&s->heap[c + 1], &s->heap[c])) c++;
        if (!spm_before(&s->heap[c], &last)) break;
        s->heap[i] = s->heap[c];
        i = c;
    }
    if (n) s->heap[i] = last;
    return top;
}

/* Queue the pair (left, left->next) if its concatenation is a token. */
static int spm_try_pair(spm_session *s, int32_t left) {
    if (left < 0 || s->sym[left].next < 0) return 0;
    const spm_sym *l = &s->sym[left], *r = &s->sym[l->next];
    size_t size = l->n + r->n;
    int32_t id = spm_lookup(s->t, s->text + l->start, size);
    if (id < 0) return 0;
    return spm_push(s, (spm_cand){ s->t->score[id], left, size });
}

static int spm_emit_bytes(const ds_tokenizer *t, const uint8_t *b, size_t n, ds_i32vec *out,
                          char *err, size_t errlen) {
    for (size_t i = 0; i < n; i++) {
        int32_t id = t->byte_token[b[i]] >= 0 ? t->byte_token[b[i]] : t->unk;
        if (id < 0) {
            ds_errf(err, errlen, "llama vocabulary has no byte token <0x%02X> and no unknown token", b[i]);
            return -1;
        }
        if (ds_i32vec_push(out, id)) { ds_errf(err, errlen, "out of memory while tokenizing"); return -1; }
    }
    return 0;
}

int ds_spm_encode(const ds_tokenizer *t, const char *text, size_t len, int space_prefix,
                  ds_i32vec *out, char *err, size_t errlen) {
    static const char SPACE_MARK[3] = { (char)0xe2, (char)0x96, (char)0x81 };   /* U+2581 */
    if (len > (SIZE_MAX - 3) / 3 || len > INT32_MAX / 4) {
        ds_errf(err, errlen, "text too long to tokenize (%zu bytes)", len);
        return -1;
    }
    spm_session s = { .t = t };
    int rc = -1;
    char *esc = malloc(len * 3 + 3);
    if (!esc) goto oom;
    size_t n = 0;
    if (space_prefix) { memcpy(esc, SPACE_MARK, 3); n = 3; }
    for (size_t i = 0; i < len; i++) {
        if (text[i] == ' ') { memcpy(esc + n, SPACE_MARK, 3); n += 3; }
        else esc[n++] = text[i];
    }
    s.text = esc;

    /* one symbol per character (or per invalid byte) */
    s.sym = malloc((n ? n : 1) * sizeof *s.sym);
    if (!s.sym) goto oom;
    int32_t n_sym = 0;
    for (size_t i = 0; i < n;) {
        size_t l = ds_utf8_valid_len((const uint8_t *)esc + i, n - i);
        if (!l) l = 1;
        s.sym[n_sym] = (spm_sym){ n_sym - 1, -1, i, l };
        if (n_sym > 0) s.sym[n_sym - 1].next = n_sym;
        n_sym++;
        i += l;
    }
    for (int32_t i = 0; i + 1 < n_sym; i++)
        if (spm_try_pair(&s, i)) goto oom;

    while (s.heap_n) {
        spm_cand c = spm_pop(&s);
        spm_sym *l = &s.sym[c.left];
        if (l->n == 0 || l->next < 0) continue;
        spm_sym *r = &s.sym[l->next];
        if (r->n == 0 || l->n + r->n != c.size) continue;     /* stale: a neighbour changed */
        l->n += r->n;
        r->n = 0;
        l->next = r->next;
        if (l->next >= 0) s.sym[l->next].prev = c.left;
        if (spm_try_pair(&s, l->prev) || spm_try_pair(&s, c.left)) goto oom;
    }

    for (int32_t i = n_sym ? 0 : -1; i >= 0; i = s.sym[i].next) {
        const spm_sym *y = &s.sym[i];
        int32_t id = spm_lookup(t, esc + y->start, y->n);
        if (id >= 0) {
            if (ds_i32vec_push(out, id)) goto oom;
        } else if (spm_emit_bytes(t, (const uint8_t *)esc + y->start, y->n, out, err, errlen)) {
            goto done;
        }
    }
    rc = 0;
    goto done;
oom:
    ds_errf(err, errlen, "out of memory while tokenizing");
done:
    free(esc); free(s.sym); free(s.heap);
    return rc;
}
