/* test_kvpool.c — the KV page pool (kvpool.h): allocation, reference
 * counts, copy-on-write, fork, trim, the exact prefix cache with its LRU
 * eviction and parent-chain checks, an accounting audit over 10k random
 * create / fork / grow / trim / free cycles, and attention through shuffled
 * pages of several sequences, bit for bit each sequence alone. */
#include "kvpool.h"
#include "testutil.h"

#include <math.h>

static uint64_t rs = 0x1234567;
static uint32_t rnd32(void) {
    rs ^= rs << 13; rs ^= rs >> 7; rs ^= rs << 17;
    return (uint32_t)rs;
}

/* ---- pages: lowest first, exhaustion, references ------------------------ */
static void test_pages(ds_backend *be) {
    char err[DS_ERRLEN];
    const ds_kvpool_shape sh = {.n_groups = 2, .n_layer = {3, 1}, .row = {8, 4}, .n_pages = 6};
    ds_kvpool *p = ds_kvpool_new(be, &sh, err, sizeof err);
    CHECK(p != NULL, "pool: %s", err);
    if (!p) return;
    CHECK(ds_kvpool_page_stride(p) == (3 * 2 * 16 * 8 + 1 * 2 * 16 * 4), "page stride %lld", (long long)ds_kvpool_page_stride(p));
    CHECK(ds_kvpool_k(p, 1, 0) - ds_kvpool_k(p, 0, 0) == 3 * 2 * 16 * 8, "group 1 starts after group 0");
    CHECK(ds_kvpool_v(p, 0, 2) - ds_kvpool_k(p, 0, 2) == 16 * 8, "V rows follow the K rows of a layer");
    int a = ds_kvpool_alloc(p), b = ds_kvpool_alloc(p), c = ds_kvpool_alloc(p);
    CHECK(a == 0 && b == 1 && c == 2, "lowest ids first (%d %d %d)", a, b, c);
    ds_kvpool_unref(p, b);
    CHECK(ds_kvpool_alloc(p) == 1, "a freed page is the lowest again");
    int got = 0;
    while (ds_kvpool_alloc(p) >= 0) got++;
    CHECK(got == 3 && ds_kvpool_n_free(p) == 0, "exhaustion after %d more (free %d)", got, ds_kvpool_n_free(p));
    ds_kvpool_ref(p, a);
    ds_kvpool_unref(p, a);
    CHECK(ds_kvpool_refs(p, a) == 1 && ds_kvpool_n_free(p) == 0, "a shared page stays while referenced");
    ds_kvpool_free(p);
    /* impossible shapes: one line, no pool */
    const ds_kvpool_shape bad = {.n_groups = 3, .n_layer = {1}, .row = {1}, .n_pages = 1};
    CHECK(!ds_kvpool_new(be, &bad, err, sizeof err) && strstr(err, "bad shape"), "bad shape refused: %s", err);
    const ds_kvpool_shape huge = {.n_groups = 1, .n_layer = {4096}, .row = {1 << 20}, .n_pages = 1 << 26};
    CHECK(!ds_kvpool_new(be, &huge, err, sizeof err), "an impossible size is refused: %s", err);
    PASS("pages: lowest id first, exhaustion, references, bad shapes refused");
}

/* ---- sequences: prepare, fork, copy-on-write, trim -------------------- */
static void fill_rows(ds_kvpool *p, const ds_seq *s, int p0, int p1, float base) {
    const int row = ds_kvpool_shape_of(p)->row[0];
    float *k = ds_kvpool_k(p, 0, 0);
    for (int j = p0; j < p1; j++)
        for (int i = 0; i < row; i++)
            k[(int64_t)s->table[j / DS_KV_PAGE] * ds_kvpool_page_stride(p) + (int64_t)(j % DS_KV_PAGE) * row + i] =
                base + (float)j + (float)i / 100.0f;
}
static int rows_are(ds_kvpool *p, const ds_seq *s, int p0, int p1, float base) {
    const int row = ds_kvpool_shape_of(p)->row[0];
    const float *k = ds_kvpool_k(p, 0, 0);
    for (int j = p0; j < p1; j++)
        for (int i = 0; i < row; i++)
            if (k[(int64_t)s->table[j / DS_KV_PAGE] * ds_kvpool_page_stride(p) + (int64_t)(j % DS_KV_PAGE) * row + i] !=
                base + (float)j + (float)i / 100.0f)
                return 0;
    return 1;
}

static void test_seqs(ds_backend *be, ds_exec *ex) {
    char err[DS_ERRLEN];
    const ds_kvpool_shape sh = {.n_groups = 1, .n_layer = {1}, .row = {4}, .n_pages = 5};
    ds_kvpool *p = ds_kvpool_new(be, &sh, err, sizeof err);
    ds_seq a, b;
    CHECK(p && !ds_seq_init(&a, 80, err, sizeof err) && !ds_seq_init(&b, 80, err, sizeof err), "init: %s", err);
    CHECK(!ds_seq_prepare(&a, p, ex, 0, 40, err, sizeof err) && a.n_pages == 3, "prepare 40 positions: %d pages", a.n_pages);
    fill_rows(p, &a, 0, 40, 0.0f);
    a.n_past = 40;
    CHECK(!ds_seq_fork(&b, &a, p, 36, err, sizeof err) && b.n_pages == 3 && b.n_past == 36, "fork: %s", err);
    CHECK(ds_kvpool_refs(p, a.table[2]) == 2 && b.table[2] == a.table[2], "forked pages are shared");
    /* b writes position 36 (page 2, shared): copy-on-write keeps 32..35 */
    const int32_t before = b.table[2];
    CHECK(!ds_seq_prepare(&b, p, ex, 36, 40, err, sizeof err), "prepare after fork: %s", err);
    CHECK(b.table[2] != before && ds_kvpool_refs(p, before) == 1 && ds_kvpool_refs(p, b.table[2]) == 1,
          "the shared page was copied (old %d new %d)", before, b.table[2]);
    CHECK(rows_are(p, &b, 0, 36, 0.0f), "the copy holds the rows below the write");
    fill_rows(p, &b, 36, 40, 1000.0f);
    CHECK(rows_are(p, &a, 0, 40, 0.0f) && rows_are(p, &b, 36, 40, 1000.0f), "a's rows untouched by b's writes");
    CHECK(b.table[0] == a.table[0] && b.table[1] == a.table[1], "untouched pages stay shared");
    /* running out changes nothing */
    const int np = a.n_pages, nfree = ds_kvpool_n_free(p);
    CHECK(ds_seq_prepare(&a, p, ex, 40, 80 + 1, err, sizeof err) == -1 && strstr(err, "capacity"), "past the capacity: %s", err);
    CHECK(ds_seq_prepare(&a, p, ex, 40, 80, err, sizeof err) == -1 && strstr(err, "free pages") && a.n_pages == np &&
              ds_kvpool_n_free(p) == nfree,
          "out of pages: refused, nothing changed (%s)", err);
    ds_seq_trim(&a, p, 17);
    CHECK(a.n_pages == 2 && a.n_past == 17, "trim to 17: %d pages", a.n_pages);
    ds_seq_release(&a, p);
    ds_seq_release(&b, p);
    CHECK(ds_kvpool_n_free(p) == 5, "every page back (%d)", ds_kvpool_n_free(p));
    ds_kvpool_free(p);
    PASS("sequences: prepare, fork shares, copy-on-write keeps the rows below, trim, release");
}

/* ---- the prefix cache ------------------------------------------------------ */
static void test_prefix(ds_backend *be, ds_exec *ex) {
    char err[DS_ERRLEN];
    const ds_kvpool_shape sh = {.n_groups = 2, .n_layer = {1, 1}, .row = {4, 4}, .n_pages = 6};
    ds_kvpool *p = ds_kvpool_new(be, &sh, err, sizeof err);
    ds_seq a, b, c;
    ds_seq_init(&a, 96, err, sizeof err);
    ds_seq_init(&b, 96, err, sizeof err);
    ds_seq_init(&c, 96, err, sizeof err);
    int32_t ids[64];
    for (int i = 0; i < 64; i++) ids[i] = 100 + i;
    ds_seq_prepare(&a, p, ex, 0, 50, err, sizeof err);
    memcpy(a.tokens, ids, 50 * sizeof(int32_t));
    a.n_tokens = a.n_past = 50;
    a.n_dctx = 40;
    ds_prefix_publish(p, &a, 1u);                  /* target rows only: 3 full pages */
    CHECK(a.n_hashed == 3 && ds_kvpool_n_cached(p) == 3, "published %d pages (cached %d)", a.n_hashed, ds_kvpool_n_cached(p));
    /* an equal prefix hits the same pages; the last token stays outside */
    int hit = ds_prefix_lookup(p, &b, ids, 48, 1u, (48 - 1) / DS_KV_PAGE);
    CHECK(hit == 32 && b.table[0] == a.table[0] && b.table[1] == a.table[1] && ds_kvpool_refs(p, a.table[0]) == 2,
          "hit %d positions on a's pages", hit);
    /* a speculating sequence needs the drafter rows too: none were published */
    hit = ds_prefix_lookup(p, &c, ids, 48, 3u, 8);
    CHECK(hit == 0, "a hit needs the drafter group when asked (%d)", hit);
    ds_seq_clear(&c, p);
    /* a different id in the second page: the hit ends after the first */
    int32_t alt[64];
    memcpy(alt, ids, sizeof alt);
    alt[20] = 7;
    hit = ds_prefix_lookup(p, &c, alt, 64, 1u, 8);
    CHECK(hit == 16 && c.table[0] == a.table[0], "the hit ends at the first different page (%d)", hit);
    ds_seq_clear(&c, p);
    /* a write into a published page copies it (the cache keeps its bytes) */
    const int32_t cached = b.table[1];
    CHECK(!ds_seq_prepare(&b, p, ex, 20, 21, err, sizeof err) && b.table[1] != cached, "writing a cached page copies it");
    /* everyone gone: the cached pages stay, evictable, until pages run out */
    ds_seq_release(&b, p);
    ds_seq_clear(&a, p);
    CHECK(ds_kvpool_n_free(p) == 6 && ds_kvpool_n_cached(p) == 3, "free %d (cached %d kept)", ds_kvpool_n_free(p),
          ds_kvpool_n_cached(p));
    hit = ds_prefix_lookup(p, &c, ids, 64, 1u, 8);
    CHECK(hit == 48, "a later sequence hits the kept pages (%d)", hit);
    ds_seq_clear(&c, p);
    /* pages run out: the least recently used cached page goes first — a
     * sequence releases its pages last to first, so a chain loses its tail
     * before its head and the shorter prefix stays reachable */
    ds_seq_prepare(&a, p, ex, 0, 16 * 4, err, sizeof err);   /* 3 free + 1 evicted */
    CHECK(ds_kvpool_n_cached(p) == 2, "one cached page evicted (%d left)", ds_kvpool_n_cached(p));
    hit = ds_prefix_lookup(p, &c, ids, 64, 1u, 8);
    CHECK(hit == 32, "the chain's tail went first: %d positions still hit", hit);
    ds_seq_release(&c, p);
    ds_seq_release(&a, p);
    ds_seq_init(&c, 96, err, sizeof err);
    /* a chain whose head is evicted while its children are cached (the head
     * used last): the children are unreachable — a hit needs the parent's
     * identity, not only an equal hash */
    hit = ds_prefix_lookup(p, &c, ids, 64, 1u, 8);
    const int32_t head = c.table[0], mid = c.table[1];
    ds_seq_clear(&c, p);                                    /* LRU: mid, head (tail-first release) */
    ds_kvpool_ref(p, mid);
    ds_kvpool_unref(p, mid);                                /* LRU: head, mid */
    ds_seq_init(&a, 96, err, sizeof err);
    ds_seq_prepare(&a, p, ex, 0, 16 * 5, err, sizeof err);  /* 4 free + 1 evicted: the head */
    CHECK(ds_kvpool_n_cached(p) == 1 && hit == 32, "the head evicted, its child cached (%d cached)", ds_kvpool_n_cached(p));
    ds_seq_trim(&a, p, 0);
    hit = ds_prefix_lookup(p, &c, ids, 64, 1u, 8);
    CHECK(hit == 0, "nothing after an evicted head is reachable (%d)", hit);
    (void)head;
    ds_seq_release(&a, p);
    ds_seq_release(&c, p);
    ds_kvpool_free(p);
    PASS("prefix cache: exact hits, ids and groups checked, copy on write, LRU eviction, broken chains unreachable");
}

/* ---- accounting under random use -------------------------------------------- */
static void test_audit(ds_backend *be, ds_exec *ex) {
    char err[DS_ERRLEN];
    enum { NS = 6, CAP = 160 };
    const ds_kvpool_shape sh = {.n_groups = 1, .n_layer = {1}, .row = {2}, .n_pages = 24};
    ds_kvpool *p = ds_kvpool_new(be, &sh, err, sizeof err);
    ds_seq s[NS];
    for (int i = 0; i < NS; i++) ds_seq_init(&s[i], CAP, err, sizeof err);
    int bad = 0, refused = 0, hits = 0;
    for (int it = 0; it < 10000; it++) {
        ds_seq *q = &s[rnd32() % NS];
        switch (rnd32() % 8) {
        case 0: case 1: case 6: case 7: {   /* grow, with ids from a small alphabet (prefix sharing) */
            const int n = q->n_past + 1 + (int)(rnd32() % 20);
            if (n > CAP) break;
            if (ds_seq_prepare(q, p, ex, q->n_past, n, err, sizeof err)) { refused++; break; }
            for (int j = q->n_past; j < n; j++) q->tokens[j] = (j % 7 == 3 ? (int32_t)(rnd32() % 2) : (int32_t)j);
            q->n_past = q->n_tokens = n;
            ds_prefix_publish(p, q, 1u);
            break;
        }
        case 2: ds_seq_trim(q, p, (int)(rnd32() % (q->n_past + 1))); break;
        case 3: ds_seq_clear(q, p); break;
        case 4: {                 /* fork from another sequence */
            ds_seq *src = &s[rnd32() % NS];
            if (src == q) break;
            ds_seq_clear(q, p);
            ds_seq_fork(q, src, p, (int)(rnd32() % (src->n_past + 1)), err, sizeof err);
            break;
        }
        case 5: {                 /* a prefix lookup into an empty sequence */
            int32_t ids[CAP];
            for (int j = 0; j < CAP; j++) ids[j] = (j % 7 == 3 ? (int32_t)(rnd32() % 2) : (int32_t)j);
            ds_seq_clear(q, p);
            hits += ds_prefix_lookup(p, q, ids, 1 + (int)(rnd32() % CAP), 1u, 9) > 0;
            break;
        }
        }
        /* the audit: every reference is a table entry, every page counted once */
        long refs = 0, entries = 0, in_use = 0;
        for (int g = 0; g < sh.n_pages; g++) {
            refs += ds_kvpool_refs(p, g);
            in_use += ds_kvpool_refs(p, g) > 0;
        }
        for (int i = 0; i < NS; i++) entries += s[i].n_pages;
        if (refs != entries || in_use + ds_kvpool_n_free(p) != sh.n_pages) {
            if (++bad <= 3) printf("INFO   audit at %d: refs %ld entries %ld in use %ld free %d\n", it, refs, entries, in_use,
                                   ds_kvpool_n_free(p));
        }
    }
    CHECK(bad == 0, "accounting broke in %d of 10000 steps", bad);
    CHECK(refused > 0 && hits > 0, "the run exercised exhaustion (%d) and hits (%d)", refused, hits);
    for (int i = 0; i < NS; i++) ds_seq_release(&s[i], p);
    CHECK(ds_kvpool_n_free(p) == sh.n_pages, "everything back after release");
    ds_kvpool_free(p);
    printf("PASS audit: 10000 random grow/trim/clear/fork/lookup steps, refs == table entries, %d refusals, %d hits\n", refused, hits);
}

/* ---- attention through shuffled pages: each row == its sequence alone --------- */
static void test_paged_attention(void) {
    enum { NS = 3, MR = 24, NPG = 40 };
    const int hd = 64, nh = 4, nkv = 2, row = nkv * hd;
    const int len[NS] = {150, 70, 200};
    const ds_attn_shape s = {nh, nkv, hd, row, 0.125f};
    const int64_t pst = (int64_t)2 * DS_KV_PAGE * row;
    float *pool = malloc((size_t)NPG * pst * sizeof(float));
    for (int64_t i = 0; i < NPG * pst; i++) pool[i] = (float)((int)(rnd32() % 2001) - 1000) / 700.0f;
    int32_t tab[NS][16];
    int perm[NPG];
    for (int i = 0; i < NPG; i++) perm[i] = i;
    for (int i = NPG - 1; i > 0; i--) { const int j = (int)(rnd32() % (unsigned)(i + 1)), x = perm[i]; perm[i] = perm[j]; perm[j] = x; }
    float *kc[NS], *vc[NS];
    int used = 0;
    for (int q = 0; q < NS; q++) {
        const int np = (len[q] + 15) / 16;
        kc[q] = malloc((size_t)np * 16 * row * sizeof(float));
        vc[q] = malloc((size_t)np * 16 * row * sizeof(float));
        for (int i = 0; i < 16; i++) tab[q][i] = i < np ? perm[used + i] : -1;
        for (int j = 0; j < np * 16; j++)
            for (int i = 0; i < row; i++) {
                const float kv = (float)((int)(rnd32() % 2001) - 1000) / 500.0f, vv = (float)((int)(rnd32() % 2001) - 1000) / 300.0f;
                kc[q][(size_t)j * row + i] = kv;
                vc[q][(size_t)j * row + i] = vv;
                pool[tab[q][j / 16] * pst + (int64_t)(j % 16) * row + i] = kv;
                pool[tab[q][j / 16] * pst + (int64_t)(16 + j % 16) * row + i] = vv;
            }
        used += np;
    }
    int seq[MR], pos[MR], nvis[MR];
    for (int m = 0; m < MR; m++) {
        seq[m] = m < 6 ? 0 : m < 9 ? 1 : m < 17 ? 2 : m < 20 ? 0 : 1;   /* runs: 0 1 2 0 1 */
        const int k = m < 6 ? m : m < 9 ? m - 6 : m < 17 ? m - 9 : m < 20 ? m - 11 : m - 17;
        pos[m] = len[seq[m]] - 12 + k;
        nvis[m] = seq[m] == 2 ? len[2] : pos[m] + 1;                        /* sequence 2: non-causal */
    }
    const size_t hrow = (size_t)nh * hd;
    float *q = malloc(MR * hrow * sizeof(float)), *ref = malloc(MR * hrow * sizeof(float)), *got = malloc(MR * hrow * sizeof(float));
    for (size_t i = 0; i < MR * hrow; i++) q[i] = (float)((int)(rnd32() % 2001) - 1000) / 400.0f;
    for (int m = 0; m < MR; m++) {       /* each row alone on its contiguous cache (decode) */
        const int c = seq[m] == 2;
        ds_attention(DS_CANONICAL, &s, 1, c ? 0 : pos[m], !c, len[seq[m]], q + m * hrow, kc[seq[m]], vc[seq[m]],
                     ref + m * hrow, NULL);
    }
    int ok = 1;
    for (int ti = 0; ti < 2; ti++) {
        ds_pool *tp = ti ? ds_pool_new(2) : NULL;
        const ds_attn_rows r = {nvis, pos, seq, &tab[0][0], 16, DS_KV_PAGE, pst};
        ds_attention_rows(DS_CANONICAL, &s, MR, &r, q, pool, pool + (int64_t)16 * row, got, tp);
        ok &= !memcmp(got, ref, MR * hrow * sizeof(float));
        ds_pool_free(tp);
    }
    CHECK(ok, "paged attention over three sequences != each row alone");
    /* the fast variant reads the right rows too (its own bits: close, not equal) */
    const ds_attn_rows r = {nvis, pos, seq, &tab[0][0], 16, DS_KV_PAGE, pst};
    ds_attention_rows(DS_FAST, &s, MR, &r, q, pool, pool + (int64_t)16 * row, got, NULL);
    double num = 0, den = 0;
    int differ = 0;
    for (size_t i = 0; i < MR * hrow; i++) {
        num += ((double)got[i] - ref[i]) * ((double)got[i] - ref[i]);
        den += (double)ref[i] * ref[i];
        differ |= got[i] != ref[i];
    }
    CHECK(sqrt(num / den) < 1e-4 && differ, "fast paged attention: rel err %g, differs %d", sqrt(num / den), differ);
    for (int i = 0; i < NS; i++) { free(kc[i]); free(vc[i]); }
    free(pool); free(q); free(ref); free(got);
    if (ok) PASS("paged attention: three sequences on shuffled pages, runs interleaved, causal and not, 1 and 2 threads == each row alone (fast: close, different bits)");
}

int main(void) {
    char err[DS_ERRLEN];
    ds_backend *be = ds_backend_cpu_new(err, sizeof err);
    ds_exec *ex = be ? be->i->exec_new(be, 1, err, sizeof err) : NULL;
    if (!ex) { printf("FAIL backend: %s\n", err); return 1; }
    test_pages(be);
    test_seqs(be, ex);
    test_prefix(be, ex);
    test_audit(be, ex);
    test_paged_attention();
    be->i->exec_free(ex);
    ds_backend_free(be);
    return tu_finish("test_kvpool");
}
