/* tokenizer_bpe.c — gpt2-style byte-level BPE: merging by rank, and the
 * small deterministic trainer behind ds_tokenizer_build_bpe (`dspark
 * make-model`). The pre-tokenizer is tokenizer_pre.c. */
#include "tokenizer_internal.h"

#include <stdlib.h>

/* ======================================================================
 * BPE merging of one pre-token
 *
 * Symbols start as the one-byte tokens and form a doubly linked list; every
 * adjacent pair that has a merge rule sits in a min-heap keyed by (rank,
 * left position), which is the order the reference applies merges in. Heap
 * entries go stale when a neighbour merges; they are recognised on pop by
 * re-checking the ids at that position. O(n log n) per pre-token.
 * ====================================================================== */

/* off/len: the symbol's bytes in the piece (raw mode's byte fallback) */
typedef struct { int32_t id, prev, next, off, len; } bpe_sym;
typedef struct { int32_t rank, left, lid, rid; } bpe_cand;

typedef struct {
    const ds_tokenizer *t;
    ds_i32vec *out;
    bpe_sym *sym;
    size_t sym_cap;
    bpe_cand *heap;
    size_t heap_n, heap_cap;
    char *mapped;                  /* llama3 whole-piece lookup */
    size_t mapped_cap;
    uint32_t byte_to_cp[256];
    /* per-call memo of pre-token -> ids: text repeats its words, and a
     * lookup is much cheaper than a merge. Value = offset into cache_ids,
     * where [count, id...] is stored. Bounded in entries and piece length. */
    ds_strmap cache;
    ds_i32vec cache_ids;
    int raw;                       /* t->raw: symbols are characters          */
} bpe_session;

#define BPE_CACHE_MAX_PIECE   64
#define BPE_CACHE_MAX_ENTRIES 65536

static int cand_less(const bpe_cand *x, const bpe_cand *y) {
    return x->rank < y->rank || (x->rank == y->rank && x->left < y->left);
}

static int heap_push(bpe_session *s, bpe_cand c) {
    if (s->heap_n == s->heap_cap) {
        size_t nc = s->heap_cap ? s->heap_cap * 2 : 64;
        bpe_cand *nh = realloc(s->heap, nc * sizeof *nh);
        if (!nh) return -1;
        s->heap = nh;
        s->heap_cap = nc;
    }
    size_t i = s->heap_n++;
    while (i > 0) {
        size_t parent = (i - 1) / 2;
        if (!cand_less(&c, &s->heap[parent])) break;
        s->heap[i] = s->heap[parent];
        i = parent;
    }
    s->heap[i] = c;
    return 0;
}

static bpe_cand heap_pop(bpe_session *s) {
    bpe_cand top = s->heap[0], last = s->heap[--s->heap_n];
    size_t i = 0, n = s->heap_n;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= n) break;
        if (c + 1 < n && cand_less(&s->heap[c + 1], &s->heap[c])) c++;
        if (!cand_less(&s->heap[c], &last)) break;
        s->heap[i] = s->heap[c];
        i = c;
    }
    if (n) s->heap[i] = last;
    return top;
}

/* Queue the pair starting at symbol `left` if a merge rule covers it. */
static int try_queue_pair(bpe_session *s, int32_t left) {
    if (left < 0) return 0;
    int32_t right = s->sym[left].next;
    if (right < 0 || s->sym[left].id < 0 || s->sym[right].id < 0) return 0;   /* no token: never merges */
    int64_t v;
    if (!ds_u64map_find(&s->t->merges, ds_pair_key(s->sym[left].id, s->sym[right].id), &v)) return 0;
    return heap_push(s, (bpe_cand){ (int32_t)(v >> 32), left, s->sym[left].id, s->sym[right].id });
}

static int bpe_merge_piece(bpe_session *s, const char *piece, size_t n);

static int bpe_piece(void *ctx, const char *piece, size_t n) {
    bpe_session *s = ctx;
    if (n == 1 && !s->raw) {
        int32_t id = s->t->byte_token[(uint8_t)piece[0]];
        if (id >= 0) return ds_i32vec_push(s->out, id);
        /* a byte the vocabulary has no token for: an invalid UTF-8 byte (a
         * one-byte piece >= 0x80 is one) becomes U+FFFD, as llama.cpp reads
         * every invalid byte; any other is dropped, as llama.cpp drops a
         * symbol it cannot find */
        return (uint8_t)piece[0] >= 0x80 ? bpe_piece(ctx, "\xef\xbf\xbd", 3) : 0;
    }
    int cacheable = n <= BPE_CACHE_MAX_PIECE;
    if (cacheable) {
        int32_t off = ds_strmap_find(&s->cache, piece, n);
        if (off >= 0) {
            for (int32_t k = 1; k <= s->cache_ids.v[off]; k++)
                if (ds_i32vec_push(s->out, s->cache_ids.v[off + k])) return -1;
            return 0;
        }
    }
    size_t start = s->out->n;
    if (bpe_merge_piece(s, piece, n)) return -1;
    if (cacheable && s->cache.n < BPE_CACHE_MAX_ENTRIES && s->cache_ids.n < INT32_MAX / 2) {
        int32_t off = (int32_t)s->cache_ids.n;
        if (ds_i32vec_push(&s->cache_ids, (int32_t)(s->out->n - start))) return -1;
        for (size_t k = start; k < s->out->n; k++)
            if (ds_i32vec_push(&s->cache_ids, s->out->v[k])) return -1;
        if (ds_strmap_put(&s->cache, piece, n, off) < 0) return -1;
    }
    return 0;
}

static int bpe_merge_piece(bpe_session *s, const char *piece, size_t n) {
    const ds_tokenizer *t = s->t;
    const uint8_t *u = (const uint8_t *)piece;
    if (n > INT32_MAX / 2) return -1;

    if (t->ignore_merges) {
        /* llama3 (tokenizer.json "ignore_merges"): a pre-token that is itself
         * in the vocabulary is emitted whole */
        if (s->mapped_cap < n * 2) {
            char *nm = realloc(s->mapped, n * 2);
            if (!nm) return -1;
            s->mapped = nm;
            s->mapped_cap = n * 2;
        }
        size_t ml = 0;
        for (size_t i = 0; i < n; i++) ml += ds_utf8_encode(s->byte_to_cp[u[i]], s->mapped + ml);
        int32_t id = ds_strmap_find(&t->vocab, s->mapped, ml);
        if (id >= 0) return ds_i32vec_push(s->out, id);
    }

    if (s->sym_cap < n) {
        bpe_sym *ns = realloc(s->sym, n * sizeof *ns);
        if (!ns) return -1;
        s->sym = ns;
        s->sym_cap = n;
    }
    size_t ns = 0;
    if (s->raw) {
        /* gemma4: a piece of newlines only that is a token is emitted whole */
        size_t nl = 0;
        while (t->gemma4 && nl < n && piece[nl] == '\n') nl++;
        if (t->gemma4 && nl == n) {
            int32_t id = ds_strmap_find(&t->vocab, piece, n);
            if (id >= 0) return ds_i32vec_push(s->out, id);
        }
        /* one symbol per character (an invalid byte is one of its own),
         * -1 when the vocabulary lacks it: it never merges and falls back
         * to byte tokens below */
        for (size_t i = 0; i < n; ns++) {
            size_t l = ds_utf8_valid_len(u + i, n - i);
            if (!l) l = 1;
            s->sym[ns] = (bpe_sym){ ds_strmap_find(&t->vocab, piece + i, l), (int32_t)ns - 1, (int32_t)ns + 1,
                                    (int32_t)i, (int32_t)l };
            i += l;
        }
        s->sym[ns - 1].next = -1;
    } else {
        for (; ns < n; ns++)
            s->sym[ns] = (bpe_sym){ t->byte_token[u[ns]], (int32_t)ns - 1, ns + 1 < n ? (int32_t)ns + 1 : -1,
                                    (int32_t)ns, 1 };
    }
    s->heap_n = 0;
    for (size_t i = 0; i + 1 < ns; i++)
        if (try_queue_pair(s, (int32_t)i)) return -1;

    while (s->heap_n) {
        bpe_cand c = heap_pop(s);
        bpe_sym *l = &s->sym[c.left];
        if (l->id != c.lid || l->next < 0 || s->sym[l->next].id != c.rid) continue;   /* stale */
        int64_t v;
        ds_u64map_find(&t->merges, ds_pair_key(c.lid, c.rid), &v);
        int32_t right = l->next;
        l->id = (int32_t)(v & 0xffffffff);
        l->len += s->sym[right].len;
        l->next = s->sym[right].next;
        if (l->next >= 0) s->sym[l->next].prev = c.left;
        s->sym[right].id = -1;
        if (try_queue_pair(s, l->prev) || try_queue_pair(s, c.left)) return -1;
    }
    for (int32_t i = 0; i >= 0; i = s->sym[i].next) {
        if (s->sym[i].id >= 0) {
            if (ds_i32vec_push(s->out, s->sym[i].id)) return -1;
        } else if (s->raw) {
            /* llama.cpp: a character without a token becomes its <0xNN>
             * byte tokens, each dropped when the vocabulary lacks it */
            for (int32_t k = 0; k < s->sym[i].len; k++) {
                int32_t b = t->byte_token[u[s->sym[i].off + k]];
                if (b >= 0 && ds_i32vec_push(s->out, b)) return -1;
            }
        }
    }
    return 0;
}

/* Pre-tokenize text and BPE every piece, in one session (scratch, memo). */
static int bpe_run(const ds_tokenizer *t, const char *text, size_t len, int raw, ds_i32vec *out,
                   char *err, size_t errlen) {
    bpe_session s = { .t = t, .out = out, .raw = raw };
    if (t->ignore_merges) ds_gpt2_byte_alphabet(s.byte_to_cp);
    if (err && errlen) err[0] = 0;
    int rc = ds_pretok_split(&t->pretok, text, len, bpe_piece, &s, err, errlen);
    if (rc && err && errlen && !strcmp(err, "pre-tokenizer callback failed"))
        ds_errf(err, errlen, "out of memory while tokenizing");
    free(s.sym); free(s.heap); free(s.mapped); free(s.cache_ids.v);
    ds_strmap_free(&s.cache);
    return rc;
}

int ds_bpe_encode(const ds_tokenizer *t, const char *text, size_t len, ds_i32vec *out,
                  char *err, size_t errlen) {
    return bpe_run(t, text, len, 0, out, err, errlen);
}

/* BPE over raw UTF-8 (sarvam-moe, gemma4): every space becomes U+2581
 * first, as llama.cpp's escape_whitespaces does, then the pieces merge by
 * character (bpe_merge_piece in raw mode). Invalid UTF-8 is kept byte by
 * byte (its byte tokens), where llama.cpp reads U+FFFD in its place. */
int ds_rawbpe_encode(const ds_tokenizer *t, const char *text, size_t len, ds_i32vec *out,
                     char *err, size_t errlen) {
    size_t n_sp = 0;
    for (size_t i = 0; i < len; i++) n_sp += text[i] == ' ';
    if (len > (SIZE_MAX - 1) / 3) { ds_errf(err, errlen, "text too long"); return -1; }
    char *esc = malloc(len + 2 * n_sp + 1);
    if (!esc) { ds_errf(err, errlen, "out of memory while tokenizing"); return -1; }
    size_t m = 0;
    for (size_t i = 0; i < len; i++) {
        if (text[i] == ' ') { memcpy(esc + m, "\xe2\x96\x81", 3); m += 3; }
        else esc[m++] = text[i];
    }
    int rc = bpe_run(t, esc, m, 1, out, err, errlen);
    free(esc);
    return rc;
}

/* ======================================================================
 * BPE trainer
 *
 * Classic most-frequent-pair BPE over the distinct pre-tokens of the text
 * (qwen2 pattern), each weighted by its frequency. Pair counts are kept
 * incrementally: merging pair P only revisits the words that contain P (each
 * pair keeps the list of words it was seen in), and the best pair comes from
 * a lazy max-heap whose stale entries are skipped on pop. Ties are broken by
 * the smallest (left id, right id), so the result depends on the text only.
 * ====================================================================== */

typedef struct { int64_t count; int32_t a, b; } pair_entry;

typedef struct {
    /* pairs, indexed by the value stored in pair_index */
    ds_u64map  pair_index;
    int64_t   *count;
    int64_t   *touch_old;        /* count before this merge step              */
    uint32_t  *touch_stamp;
    int32_t   *pa, *pb;
    ds_i32vec *words_of;         /* words the pair was seen in (may be stale) */
    size_t     n_pairs, cap_pairs;
    pair_entry *heap;
    size_t     heap_n, heap_cap;
    int32_t   *touched;          /* pairs touched this step                   */
    size_t     n_touched, cap_touched;
    uint32_t   stamp;
} trainer;

static int pe_better(const pair_entry *x, const pair_entry *y) {
    if (x->count != y->count) return x->count > y->count;
    if (x->a != y->a) return x->a < y->a;
    return x->b < y->b;
}

static int tr_heap_push(trainer *tr, pair_entry e) {
    if (tr->heap_n == tr->heap_cap) {
        size_t nc = tr->heap_cap ? tr->heap_cap * 2 : 4096;
        pair_entry *nh = realloc(tr->heap, nc * sizeof *nh);
        if (!nh) return -1;
        tr->heap = nh;
        tr->heap_cap = nc;
    }
    size_t i = tr->heap_n++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!pe_better(&e, &tr->heap[p])) break;
        tr->heap[i] = tr->heap[p];
        i = p;
    }
    tr->heap[i] = e;
    return 0;
}

static pair_entry tr_heap_pop(trainer *tr) {
    pair_entry top = tr->heap[0], last = tr->heap[--tr->heap_n];
    size_t i = 0, n = tr->heap_n;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= n) break;
        if (c + 1 < n && pe_better(&tr->heap[c + 1], &tr->heap[c])) c++;
        if (!pe_better(&tr->heap[c], &last)) break;
        tr->heap[i] = tr->heap[c];
        i = c;
    }
    if (n) tr->heap[i] = last;
    return top;
}

/* Index of pair (a, b), created with count 0 if new; -1 out of memory. */
static int32_t tr_pair(trainer *tr, int32_t a, int32_t b) {
    int64_t *slot = ds_u64map_slot(&tr->pair_index, ds_pair_key(a, b), -1);
    if (!slot) return -1;
    if (*slot >= 0) return (int32_t)*slot;
    if (tr->n_pairs == tr->cap_pairs) {
        size_t nc = tr->cap_pairs ? tr->cap_pairs * 2 : 4096;
        int64_t *c = realloc(tr->count, nc * sizeof *c);
        if (!c) return -1;
        tr->count = c;
        int64_t *o = realloc(tr->touch_old, nc * sizeof *o);
        if (!o) return -1;
        tr->touch_old = o;
        uint32_t *st = realloc(tr->touch_stamp, nc * sizeof *st);
        if (!st) return -1;
        tr->touch_stamp = st;
        int32_t *x = realloc(tr->pa, nc * sizeof *x);
        if (!x) return -1;
        tr->pa = x;
        x = realloc(tr->pb, nc * sizeof *x);
        if (!x) return -1;
        tr->pb = x;
        ds_i32vec *w = realloc(tr->words_of, nc * sizeof *w);
        if (!w) return -1;
        tr->words_of = w;
        tr->cap_pairs = nc;
    }
    size_t p = tr->n_pairs++;
    tr->count[p] = 0;
    tr->touch_stamp[p] = 0;
    tr->pa[p] = a;
    tr->pb[p] = b;
    tr->words_of[p] = (ds_i32vec){0};
    *slot = (int64_t)p;
    return (int32_t)p;
}

/* Add delta to pair (a, b)'s count, remembering its count before the step. */
static int tr_adjust(trainer *tr, int32_t a, int32_t b, int64_t delta) {
    int32_t p = tr_pair(tr, a, b);
    if (p < 0) return -1;
    if (tr->touch_stamp[p] != tr->stamp) {
        tr->touch_stamp[p] = tr->stamp;
        tr->touch_old[p] = tr->count[p];
        if (tr->n_touched == tr->cap_touched) {
            size_t nc = tr->cap_touched ? tr->cap_touched * 2 : 1024;
            int32_t *nt = realloc(tr->touched, nc * sizeof *nt);
            if (!nt) return -1;
            tr->touched = nt;
            tr->cap_touched = nc;
        }
        tr->touched[tr->n_touched++] = p;
    }
    tr->count[p] += delta;
    return p;
}

static void trainer_free(trainer *tr) {
    for (size_t p = 0; p < tr->n_pairs; p++) free(tr->words_of[p].v);
    ds_u64map_free(&tr->pair_index);
    free(tr->count); free(tr->touch_old); free(tr->touch_stamp); free(tr->pa); free(tr->pb);
    free(tr->words_of); free(tr->heap); free(tr->touched);
}

/* distinct pre-tokens of the training text with their frequencies */
typedef struct {
    ds_strmap words;
    int64_t  *freq;
    size_t    cap;
} word_counter;

static int count_word(void *ctx, const char *piece, size_t n) {
    word_counter *wc = ctx;
    int32_t w = ds_strmap_find(&wc->words, piece, n);
    if (w >= 0) { wc->freq[w]++; return 0; }
    w = (int32_t)wc->words.n;
    if ((size_t)w == wc->cap) {
        size_t nc = wc->cap ? wc->cap * 2 : 1024;
        int64_t *nf = realloc(wc->freq, nc * sizeof *nf);
        if (!nf) return -1;
        wc->freq = nf;
        wc->cap = nc;
    }
    if (ds_strmap_put(&wc->words, piece, n, w) < 0) return -1;
    wc->freq[w] = 1;
    return 0;
}

void ds_bpe_vocab_free(ds_bpe_vocab *v) {
    if (v->tokens)
        for (int32_t i = 0; i < v->n_vocab; i++) free(v->tokens[i]);
    for (size_t i = 0; v->merges && i < v->n_merges; i++) free(v->merges[i]);
    free(v->tokens); free(v->types); free(v->merges);
    memset(v, 0, sizeof *v);
}

/* byte string -> NUL-terminated text in the GPT-2 byte alphabet */
static char *to_alphabet(const uint32_t *b2cp, const char *bytes, size_t n) {
    char *s = malloc(n * 2 + 1);
    if (!s) return NULL;
    size_t k = 0;
    for (size_t i = 0; i < n; i++) k += ds_utf8_encode(b2cp[(uint8_t)bytes[i]], s + k);
    s[k] = 0;
    return s;
}

int ds_bpe_train(const char *text, size_t len, int32_t n_vocab, ds_bpe_vocab *out,
                 char *err, size_t errlen) {
    memset(out, 0, sizeof *out);
    if (n_vocab < 258 || n_vocab > (1 << 24)) {
        ds_errf(err, errlen, "BPE vocabulary size %d out of range (258 .. %d: 256 bytes + 2 special)",
                n_vocab, 1 << 24);
        return -1;
    }
    int rc = -1;
    ds_pretok pre;
    word_counter wc = {0};
    trainer tr = {0};
    ds_strmap tok_bytes = {0};      /* raw bytes of token id i = entry i */
    int32_t *sym = NULL;
    size_t *wstart = NULL, *wlen = NULL;
    int32_t *merge_a = NULL, *merge_b = NULL;
    uint32_t *word_stamp = NULL;
    char *cat = NULL;
    size_t n_merges = 0, merges_cap = 0;
    const int32_t target = n_vocab - 2;

    if (ds_pretok_init(&pre, DS_PRE_QWEN2, err, errlen)) return -1;
    if (err && errlen) err[0] = 0;
    if (ds_pretok_split(&pre, text, len, count_word, &wc, err, errlen)) goto oom;

    /* byte tokens 0..255 are the bytes themselves */
    for (int b = 0; b < 256; b++) {
        char c = (char)b;
        if (ds_strmap_put(&tok_bytes, &c, 1, b) < 0) goto oom;
    }

    /* every word as a run of symbols in one flat array */
    size_t n_words = wc.words.n, total = 0;
    wstart = malloc((n_words + 1) * sizeof *wstart);
    wlen = malloc((n_words + 1) * sizeof *wlen);
    word_stamp = calloc(n_words + 1, sizeof *word_stamp);
    if (!wstart || !wlen || !word_stamp) goto oom;
    for (size_t w = 0; w < n_words; w++) total += wc.words.key_len[w];
    sym = malloc((total + 1) * sizeof *sym);
    if (!sym) goto oom;
    total = 0;
    for (size_t w = 0; w < n_words; w++) {
        size_t kl;
        const char *k = ds_strmap_key(&wc.words, (uint32_t)w, &kl);
        wstart[w] = total;
        wlen[w] = kl;
        for (size_t i = 0; i < kl; i++) sym[total++] = (uint8_t)k[i];
    }

    /* initial pair counts */
    tr.stamp = 1;
    for (size_t w = 0; w < n_words; w++) {
        const int32_t *s = sym + wstart[w];
        for (size_t i = 0; i + 1 < wlen[w]; i++) {
            int32_t p = tr_adjust(&tr, s[i], s[i + 1], wc.freq[w]);
            if (p < 0) goto oom;
            ds_i32vec *wl = &tr.words_of[p];
            if ((!wl->n || wl->v[wl->n - 1] != (int32_t)w) && ds_i32vec_push(wl, (int32_t)w)) goto oom;
        }
    }
    for (size_t p = 0; p < tr.n_pairs; p++)
        if (tr.count[p] > 0 && tr_heap_push(&tr, (pair_entry){ tr.count[p], tr.pa[p], tr.pb[p] })) goto oom;

    int32_t n_tokens = 256;
    while (n_tokens < target && tr.heap_n) {
        pair_entry best = tr_heap_pop(&tr);
        int64_t pidx;
        ds_u64map_find(&tr.pair_index, ds_pair_key(best.a, best.b), &pidx);
        int32_t p = (int32_t)pidx;
        if (tr.count[p] != best.count || best.count <= 0) continue;   /* stale entry */

        /* the merged token: reuse an existing one with the same bytes (two
         * different pairs can spell the same string), else a new id */
        size_t la, lb;
        const char *ta = ds_strmap_key(&tok_bytes, (uint32_t)best.a, &la);
        const char *tb = ds_strmap_key(&tok_bytes, (uint32_t)best.b, &lb);
        char *nc = realloc(cat, la + lb);
        if (!nc) goto oom;
        cat = nc;
        memcpy(cat, ta, la);
        memcpy(cat + la, tb, lb);
        int32_t new_id = ds_strmap_find(&tok_bytes, cat, la + lb);
        if (new_id < 0) {
            new_id = n_tokens++;
            if (ds_strmap_put(&tok_bytes, cat, la + lb, new_id) != new_id) goto oom;
        }
        /* merges can outnumber new tokens (a reused id adds a rule only) */
        if (n_merges == merges_cap) {
            size_t nc = merges_cap ? merges_cap * 2 : 1024;
            int32_t *na = realloc(merge_a, nc * sizeof *na);
            if (!na) goto oom;
            merge_a = na;
            int32_t *nb = realloc(merge_b, nc * sizeof *nb);
            if (!nb) goto oom;
            merge_b = nb;
            merges_cap = nc;
        }
        merge_a[n_merges] = best.a;
        merge_b[n_merges] = best.b;
        n_merges++;

        /* apply the merge to every word that has the pair */
        tr.stamp++;
        tr.n_touched = 0;
        for (size_t k = 0; k < tr.words_of[p].n; k++) {
            int32_t w = tr.words_of[p].v[k];
            if (word_stamp[w] == tr.stamp) continue;
            word_stamp[w] = tr.stamp;
            int32_t *s = sym + wstart[w];
            size_t n = wlen[w], has = 0;
            for (size_t i = 0; i + 1 < n && !has; i++) has = s[i] == best.a && s[i + 1] == best.b;
            if (!has) continue;
            int64_t f = wc.freq[w];
            for (size_t i = 0; i + 1 < n; i++)
                if (tr_adjust(&tr, s[i], s[i + 1], -f) < 0) goto oom;
            size_t m = 0;
            for (size_t i = 0; i < n;) {
                if (i + 1 < n && s[i] == best.a && s[i + 1] == best.b) { s[m++] = new_id; i += 2; }
                else s[m++] = s[i++];
            }
            wlen[w] = n = m;
            for (size_t i = 0; i + 1 < n; i++) {
                int32_t q = tr_adjust(&tr, s[i], s[i + 1], f);
                if (q < 0) goto oom;
                ds_i32vec *wl = &tr.words_of[q];
                if ((s[i] == new_id || s[i + 1] == new_id) && (!wl->n || wl->v[wl->n - 1] != w) &&
                    ds_i32vec_push(wl, w))
                    goto oom;
            }
        }
        for (size_t k = 0; k < tr.n_touched; k++) {
            int32_t q = tr.touched[k];
            if (tr.count[q] > 0 && tr.count[q] != tr.touch_old[q] &&
                tr_heap_push(&tr, (pair_entry){ tr.count[q], tr.pa[q], tr.pb[q] }))
                goto oom;
        }
    }

    /* emit the vocabulary */
    uint32_t b2cp[256];
    ds_gpt2_byte_alphabet(b2cp);
    out->n_vocab = n_vocab;
    out->tokens = calloc((size_t)n_vocab, sizeof *out->tokens);
    out->types = malloc((size_t)n_vocab * sizeof *out->types);
    out->merges = calloc(n_merges ? n_merges : 1, sizeof *out->merges);
    if (!out->tokens || !out->types || !out->merges) goto oom;
    for (int32_t i = 0; i < n_tokens; i++) {
        size_t bl;
        const char *b = ds_strmap_key(&tok_bytes, (uint32_t)i, &bl);
        if (!(out->tokens[i] = to_alphabet(b2cp, b, bl))) goto oom;
        out->types[i] = DS_TOKTYPE_NORMAL;
    }
    /* a text too small to learn target-256 merges leaves unused slots */
    for (int32_t i = n_tokens; i < target; i++) {
        char buf[32];
        snprintf(buf, sizeof buf, "<|unused_%d|>", i - n_tokens);
        if (!(out->tokens[i] = strdup(buf))) goto oom;
        out->types[i] = DS_TOKTYPE_UNUSED;
    }
    out->eot_id = target;
    out->mask_id = target + 1;
    if (!(out->tokens[target] = strdup("<|endoftext|>")) || !(out->tokens[target + 1] = strdup("<|mask|>")))
        goto oom;
    out->types[target] = out->types[target + 1] = DS_TOKTYPE_CONTROL;
    for (size_t r = 0; r < n_merges; r++) {
        size_t la, lb;
        const char *ta = ds_strmap_key(&tok_bytes, (uint32_t)merge_a[r], &la);
        const char *tb = ds_strmap_key(&tok_bytes, (uint32_t)merge_b[r], &lb);
        char *m = malloc((la + lb) * 2 + 2);
        if (!m) goto oom;
        size_t k = 0;
        for (size_t i = 0; i < la; i++) k += ds_utf8_encode(b2cp[(uint8_t)ta[i]], m + k);
        m[k++] = ' ';
        for (size_t i = 0; i < lb; i++) k += ds_utf8_encode(b2cp[(uint8_t)tb[i]], m + k);
        m[k] = 0;
        out->merges[r] = m;
        out->n_merges = r + 1;
    }
    rc = 0;
    goto done;
oom:
    if (!err || !errlen || !err[0] || !strcmp(err, "pre-tokenizer callback failed"))
        ds_errf(err, errlen, "out of memory training the BPE vocabulary");
    ds_bpe_vocab_free(out);
done:
    ds_pretok_free(&pre);
    ds_strmap_free(&wc.words);
    free(wc.freq);
    trainer_free(&tr);
    ds_strmap_free(&tok_bytes);
    free(sym); free(wstart); free(wlen); free(word_stamp); free(merge_a); free(merge_b); free(cat);
    return rc;
}

int ds_bpe_vocab_spec(const ds_bpe_vocab *v, ds_tok_spec *s, ds_tok_str **tok_strs, ds_tok_str **merge_strs) {
    *tok_strs = malloc((size_t)v->n_vocab * sizeof **tok_strs);
    *merge_strs = malloc((v->n_merges ? v->n_merges : 1) * sizeof **merge_strs);
    if (!*tok_strs || !*merge_strs) {
        free(*tok_strs); free(*merge_strs);
        *tok_strs = *merge_strs = NULL;
        return -1;
    }
    for (int32_t i = 0; i < v->n_vocab; i++) (*tok_strs)[i] = (ds_tok_str){ v->tokens[i], strlen(v->tokens[i]) };
    for (size_t i = 0; i < v->n_merges; i++) (*merge_strs)[i] = (ds_tok_str){ v->merges[i], strlen(v->merges[i]) };
    ds_tok_spec_init(s);
    s->model = "gpt2";
    s->pre = "qwen2";
    s->n_vocab = v->n_vocab;
    s->tokens = *tok_strs;
    s->types = v->types;
    s->merges = *merge_strs;
    s->n_merges = v->n_merges;
    s->bos = s->eos = v->eot_id;
    s->mask = v->mask_id;
    s->add_bos = 0;
    return 0;
}

int ds_tokenizer_build_bpe_padded(gguf_writer *w, const char *text, size_t len, int32_t n_vocab,
                                  int32_t n_total, char *err, size_t errlen) {
    ds_bpe_vocab v;
    if (ds_bpe_train(text, len, n_vocab, &v, err, errlen)) return -1;
    /* llama.cpp requires one token per embedding row: rows past the learned
     * vocabulary get unused placeholder tokens (never produced by encode) */
    const int32_t n_out = n_total > v.n_vocab ? n_total : v.n_vocab;
    char **toks = malloc((size_t)n_out * sizeof *toks);
    int32_t *types = malloc((size_t)n_out * sizeof *types);
    int rc = !toks || !types;
    for (int32_t i = 0; !rc && i < n_out; i++) {
        if (i < v.n_vocab) {
            toks[i] = v.tokens[i];
            types[i] = v.types[i];
        } else {
            char buf[40];
            snprintf(buf, sizeof buf, "<|unused_pad_%d|>", i - v.n_vocab);
            toks[i] = strdup(buf);
            types[i] = DS_TOKTYPE_UNUSED;
            if (!toks[i]) { rc = 1; for (int32_t k = v.n_vocab; k < i; k++) free(toks[k]); }
        }
    }
    if (rc) {
        free(toks); free(types);
        ds_bpe_vocab_free(&v);
        ds_errf(err, errlen, "out of memory padding the vocabulary");
        return -1;
    }
    rc |= gguf_set_str(w, "tokenizer.ggml.model", "gpt2");
    rc |= gguf_set_str(w, "tokenizer.ggml.pre", "qwen2");
    rc |= gguf_set_arr_str(w, "tokenizer.ggml.tokens", (const char *const *)toks, (uint64_t)n_out);
    rc |= gguf_set_arr(w, "tokenizer.ggml.token_type", GGUF_T_I32, types, (uint64_t)n_out);
    rc |= gguf_set_arr_str(w, "tokenizer.ggml.merges", (const char *const *)v.merges, (uint64_t)v.n_merges);
    rc |= gguf_set_u32(w, "tokenizer.ggml.bos_token_id", (uint32_t)v.eot_id);
    rc |= gguf_set_u32(w, "tokenizer.ggml.eos_token_id", (uint32_t)v.eot_id);
    rc |= gguf_set_u32(w, "tokenizer.ggml.mask_token_id", (uint32_t)v.mask_id);
    rc |= gguf_set_bool(w, "tokenizer.ggml.add_bos_token", 0);
    if (rc) {
        const char *we = gguf_writer_error(w);
        ds_errf(err, errlen, "writing tokenizer keys: %s", we && we[0] ? we : "gguf writer error");
    }
    for (int32_t i = v.n_vocab; i < n_out; i++) free(toks[i]);
    free(toks); free(types);
    ds_bpe_vocab_free(&v);
    return rc ? -1 : 0;
}

int ds_tokenizer_build_bpe(gguf_writer *w, const char *text, size_t len, int32_t n_vocab,
                           char *err, size_t errlen) {
    return ds_tokenizer_build_bpe_padded(w, text, len, n_vocab, n_vocab, err, errlen);
}
