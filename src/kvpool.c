/* kvpool.c — the page pool, sequences' page tables and the exact prefix
 * cache (kvpool.h, docs/ENGINE.md). Host bookkeeping only: the pages'
 * memory belongs to the backend and is touched here solely by the
 * copy-on-write copies queued on an execution context. */
#include "kvpool.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct ds_kvpool {
    ds_backend     *be;
    ds_kvpool_shape shape;
    int64_t  page_stride;              /* floats per page                              */
    int64_t  off[DS_KV_GROUPS][2];     /* floats into a page: group g's layer-0 K and V are at off[g][0/1]; layer l adds l * 2 * P * row */
    float   *base;                     /* device: n_pages * page_stride floats          */
    size_t   bytes;
    /* per page */
    int32_t  *ref;
    uint32_t *gen;                     /* bumped whenever the page's contents are given up */
    uint64_t *hash;                    /* 0: not in the cache                            */
    int32_t  *par;                     /* parent page in the chain (-1: the first page)  */
    uint32_t *par_gen;
    uint8_t  *groups;                  /* which groups' rows the cached page holds (bits) */
    int32_t  *ids;                     /* [n_pages][P]: the cached page's token ids      */
    int32_t  *lru_prev, *lru_next;     /* cached pages with no reference, oldest first   */
    int32_t   lru_head, lru_tail;
    int       n_lru, n_cached;
    /* free pages: a min-heap of ids, so the lowest id is used first */
    int32_t  *heap;
    int       n_heap;
    /* the cache's map: open addressing over page ids, keyed by hash */
    int32_t  *map;                     /* -1: empty                                      */
    uint32_t  map_mask;
};

/* ========================================================================
 * Shape and memory
 * ===================================================================== */

static int shape_ok(const ds_kvpool_shape *s) {
    if (!s || s->n_groups < 1 || s->n_groups > DS_KV_GROUPS || s->n_pages < 1 || s->n_pages > (1 << 26)) return 0;
    for (int g = 0; g < s->n_groups; g++)
        if (s->n_layer[g] < 1 || s->n_layer[g] > 4096 || s->row[g] < 1 || s->row[g] > (1 << 20)) return 0;
    return 1;
}

static int64_t stride_of(const ds_kvpool_shape *s) {
    int64_t n = 0;
    for (int g = 0; g < s->n_groups; g++) n += (int64_t)s->n_layer[g] * 2 * DS_KV_PAGE * s->row[g];
    return n;
}

size_t ds_kvpool_page_bytes(const ds_kvpool_shape *s) {
    return shape_ok(s) ? (size_t)stride_of(s) * sizeof(float) : 0;
}

/* ========================================================================
 * Free pages: a binary min-heap
 * ===================================================================== */

static void heap_push(ds_kvpool *p, int32_t v) {
    int i = p->n_heap++;
    while (i > 0) {
        const int up = (i - 1) / 2;
        if (p->heap[up] <= v) break;
        p->heap[i] = p->heap[up];
        i = up;
    }
    p->heap[i] = v;
}

static int32_t heap_pop(ds_kvpool *p) {
    const int32_t top = p->heap[0], v = p->heap[--p->n_heap];
    int i = 0;
    for (;;) {
        int c = 2 * i + 1;
        if (c >= p->n_heap) break;
        if (c + 1 < p->n_heap && p->heap[c + 1] < p->heap[c]) c++;
        if (p->heap[c] >= v) break;
        p->heap[i] = p->heap[c];
        i = c;
    }
    if (p->n_heap) p->heap[i] = v;
    return top;
}

/* ========================================================================
 * The cache map and the LRU list of unreferenced cached pages
 * ===================================================================== */

static void map_insert(ds_kvpool *p, int32_t page) {
    uint32_t i = (uint32_t)p->hash[page] & p->map_mask;
    while (p->map[i] >= 0) i = (i + 1) & p->map_mask;
    p->map[i] = page;
}

/* Backward-shift deletion: no tombstones, probes stay short. */
static void map_remove(ds_kvpool *p, int32_t page) {
    uint32_t i = (uint32_t)p->hash[page] & p->map_mask;
    while (p->map[i] != page) {
        if (p->map[i] < 0) return;
        i = (i + 1) & p->map_mask;
    }
    uint32_t j = i;
    for (;;) {
        p->map[i] = -1;
        for (;;) {
            j = (j + 1) & p->map_mask;
            if (p->map[j] < 0) return;
            const uint32_t home = (uint32_t)p->hash[p->map[j]] & p->map_mask;
            /* j's entry may move to i when its home is not in (i, j] */
            if (i <= j ? (home <= i || home > j) : (home <= i && home > j)) break;
        }
        p->map[i] = p->map[j];
        i = j;
    }
}

static void lru_unlink(ds_kvpool *p, int32_t page) {
    const int32_t a = p->lru_prev[page], b = p->lru_next[page];
    if (a >= 0) p->lru_next[a] = b; else p->lru_head = b;
    if (b >= 0) p->lru_prev[b] = a; else p->lru_tail = a;
    p->lru_prev[page] = p->lru_next[page] = -1;
    p->n_lru--;
}

static void lru_append(ds_kvpool *p, int32_t page) {
    p->lru_prev[page] = p->lru_tail;
    p->lru_next[page] = -1;
    if (p->lru_tail >= 0) p->lru_next[p->lru_tail] = page; else p->lru_head = page;
    p->lru_tail = page;
    p->n_lru++;
}

/* The page leaves the cache: its contents are no longer promised to anyone. */
static void uncache(ds_kvpool *p, int32_t page) {
    if (!p->hash[page]) return;
    map_remove(p, page);
    p->hash[page] = 0;
    p->gen[page]++;
    p->n_cached--;
}

/* ========================================================================
 * The pool
 * ===================================================================== */

/* The host memory the kernel says a process could still have, in bytes
 * (/proc/meminfo MemAvailable); 0 when it cannot be read. A host pool is
 * committed page by page as it is written, so one larger than this would
 * not fail here but be killed later, mid-generation: it is refused now. */
static uint64_t mem_available(void) { return ds_host_mem_available(); }

ds_kvpool *ds_kvpool_new(ds_backend *be, const ds_kvpool_shape *s, char *err, size_t errlen) {
    if (!shape_ok(s)) {
        ds_errf(err, errlen, "KV pool: bad shape (%d groups, %d pages)", s ? s->n_groups : 0, s ? s->n_pages : 0);
        return NULL;
    }
    const int64_t stride = stride_of(s);
    if ((uint64_t)stride > SIZE_MAX / sizeof(float) / (uint64_t)s->n_pages) {
        ds_errf(err, errlen, "KV pool: %d pages of %lld floats overflow", s->n_pages, (long long)stride);
        return NULL;
    }
    const uint64_t bytes = (uint64_t)stride * sizeof(float) * (uint64_t)s->n_pages, avail = be->i->host_memory ? mem_available() : 0;
    if (avail && bytes > avail) {
        ds_errf(err, errlen, "KV pool: %d pages of %zu KiB (%.0f MiB) exceed the %.0f MiB of memory available: use a smaller context or fewer sequences",
                s->n_pages, ((size_t)stride * sizeof(float)) >> 10, (double)bytes / 1048576.0, (double)avail / 1048576.0);
        return NULL;
    }
    ds_kvpool *p = calloc(1, sizeof *p);
    if (!p) { ds_errf(err, errlen, "KV pool: out of memory"); return NULL; }
    p->be = be;
    p->shape = *s;
    p->page_stride = stride;
    int64_t o = 0;
    for (int g = 0; g < s->n_groups; g++) {
        p->off[g][0] = o;
        p->off[g][1] = o + (int64_t)DS_KV_PAGE * s->row[g];
        o += (int64_t)s->n_layer[g] * 2 * DS_KV_PAGE * s->row[g];
    }
    const size_t n = (size_t)s->n_pages;
    uint32_t mcap = 16;
    while (mcap < 2 * n) mcap *= 2;
    p->map_mask = mcap - 1;
    p->ref = calloc(n, sizeof *p->ref);
    p->gen = calloc(n, sizeof *p->gen);
    p->hash = calloc(n, sizeof *p->hash);
    p->par = malloc(n * sizeof *p->par);
    p->par_gen = calloc(n, sizeof *p->par_gen);
    p->groups = calloc(n, 1);
    p->ids = malloc(n * DS_KV_PAGE * sizeof *p->ids);
    p->lru_prev = malloc(n * sizeof(int32_t));
    p->lru_next = malloc(n * sizeof(int32_t));
    p->heap = malloc(n * sizeof(int32_t));
    p->map = malloc((size_t)mcap * sizeof(int32_t));
    p->bytes = n * (size_t)stride * sizeof(float);
    /* pages are never read before they are written (a row attends only
     * positions its sequence wrote), so the memory needs no clearing: the
     * backend's pool allocation leaves it uncommitted until first touch */
    p->base = p->ref && p->gen && p->hash && p->par && p->par_gen && p->groups && p->ids && p->lru_prev &&
              p->lru_next && p->heap && p->map
                  ? (be->i->alloc_pool ? be->i->alloc_pool(be, p->bytes) : be->i->alloc(be, p->bytes))
                  : NULL;
    if (!p->base) {
        ds_errf(err, errlen, "KV pool: out of %s memory for %d pages of %zu KiB (%.1f MiB)", be->i->name,
                s->n_pages, ((size_t)stride * sizeof(float)) >> 10, (double)p->bytes / 1048576.0);
        ds_kvpool_free(p);
        return NULL;
    }
    for (size_t i = 0; i < n; i++) {
        p->par[i] = -1;
        p->lru_prev[i] = p->lru_next[i] = -1;
        p->heap[i] = (int32_t)i;       /* 0, 1, 2, ...: already a min-heap */
    }
    p->n_heap = (int)n;
    memset(p->map, 0xff, (size_t)mcap * sizeof(int32_t));
    p->lru_head = p->lru_tail = -1;
    return p;
}

void ds_kvpool_free(ds_kvpool *p) {
    if (!p) return;
    if (p->base) {
        if (p->be->i->release_pool) p->be->i->release_pool(p->be, p->base, p->bytes);
        else p->be->i->release(p->be, p->base);
    }
    free(p->ref); free(p->gen); free(p->hash); free(p->par); free(p->par_gen); free(p->groups);
    free(p->ids); free(p->lru_prev); free(p->lru_next); free(p->heap); free(p->map);
    free(p);
}

float *ds_kvpool_k(const ds_kvpool *p, int g, int l) {
    return p->base + p->off[g][0] + (int64_t)l * 2 * DS_KV_PAGE * p->shape.row[g];
}
float *ds_kvpool_v(const ds_kvpool *p, int g, int l) {
    return p->base + p->off[g][1] + (int64_t)l * 2 * DS_KV_PAGE * p->shape.row[g];
}
int64_t ds_kvpool_page_stride(const ds_kvpool *p) { return p->page_stride; }
float *ds_kvpool_page_base(const ds_kvpool *p, int page) { return p->base + (int64_t)page * p->page_stride; }
int ds_kvpool_n_pages(const ds_kvpool *p) { return p->shape.n_pages; }
int ds_kvpool_n_free(const ds_kvpool *p) { return p->n_heap + p->n_lru; }
int ds_kvpool_n_cached(const ds_kvpool *p) { return p->n_cached; }
const ds_kvpool_shape *ds_kvpool_shape_of(const ds_kvpool *p) { return &p->shape; }

int ds_kvpool_alloc(ds_kvpool *p) {
    int32_t page;
    if (p->n_heap) page = heap_pop(p);
    else if (p->n_lru) {             /* evict the least recently used cached page */
        page = p->lru_head;
        lru_unlink(p, page);
        uncache(p, page);
    } else
        return -1;
    p->ref[page] = 1;
    return page;
}

void ds_kvpool_ref(ds_kvpool *p, int page) {
    if (p->ref[page]++ == 0 && p->hash[page]) lru_unlink(p, page);
}

void ds_kvpool_unref(ds_kvpool *p, int page) {
    if (--p->ref[page] > 0) return;
    if (p->hash[page]) lru_append(p, page);   /* kept for a later hit */
    else {
        p->gen[page]++;
        heap_push(p, page);
    }
}

int ds_kvpool_refs(const ds_kvpool *p, int page) { return p->ref[page]; }

void ds_kvpool_copy(ds_kvpool *p, ds_exec *ex, int dst, int src) {
    p->be->i->copy(ex, p->base + (int64_t)dst * p->page_stride, p->base + (int64_t)src * p->page_stride,
                   (size_t)p->page_stride * sizeof(float));
}

/* ========================================================================
 * Sequences
 * ===================================================================== */

int ds_seq_init(ds_seq *s, int max_pos, char *err, size_t errlen) {
    memset(s, 0, sizeof *s);
    if (max_pos < 1 || max_pos > (1 << 26)) {
        ds_errf(err, errlen, "sequence: %d positions is out of range", max_pos);
        return -1;
    }
    s->max_pages = (max_pos + DS_KV_PAGE - 1) / DS_KV_PAGE;
    s->table = malloc((size_t)s->max_pages * sizeof *s->table);
    s->tokens = malloc((size_t)s->max_pages * DS_KV_PAGE * sizeof *s->tokens);
    s->hash = malloc((size_t)s->max_pages * sizeof *s->hash);
    if (!s->table || !s->tokens || !s->hash) {
        free(s->table); free(s->tokens); free(s->hash);
        memset(s, 0, sizeof *s);
        ds_errf(err, errlen, "sequence: out of memory");
        return -1;
    }
    return 0;
}

static void mark_dirty(ds_seq *s, int i) {
    if (s->dirty_lo >= s->dirty_hi) { s->dirty_lo = i; s->dirty_hi = i + 1; return; }
    if (i < s->dirty_lo) s->dirty_lo = i;
    if (i + 1 > s->dirty_hi) s->dirty_hi = i + 1;
}

void ds_seq_trim(ds_seq *s, ds_kvpool *p, int n_keep) {
    if (n_keep < 0) n_keep = 0;
    const int keep_pages = (n_keep + DS_KV_PAGE - 1) / DS_KV_PAGE;
    while (s->n_pages > keep_pages) ds_kvpool_unref(p, s->table[--s->n_pages]);
    if (s->n_past > n_keep) s->n_past = n_keep;
    if (s->n_dctx > n_keep) s->n_dctx = n_keep;
    if (s->n_tokens > n_keep) s->n_tokens = n_keep;
    if (s->n_hashed > s->n_pages) s->n_hashed = s->n_pages;
}

void ds_seq_clear(ds_seq *s, ds_kvpool *p) {
    if (s->table) ds_seq_trim(s, p, 0);
    s->n_hashed = 0;
}

void ds_seq_release(ds_seq *s, ds_kvpool *p) {
    if (!s->table) return;
    ds_seq_clear(s, p);
    free(s->table); free(s->tokens); free(s->hash);
    memset(s, 0, sizeof *s);
}

int ds_seq_prepare(ds_seq *s, ds_kvpool *p, ds_exec *ex, int p0, int p1, char *err, size_t errlen) {
    if (p0 < 0 || p1 < p0 || p1 > s->max_pages * DS_KV_PAGE) {
        ds_errf(err, errlen, "sequence: positions %d..%d exceed its capacity of %d", p0, p1 - 1,
                s->max_pages * DS_KV_PAGE);
        return -1;
    }
    if (p1 == p0) return 0;
    const int i0 = p0 / DS_KV_PAGE, i1 = (p1 - 1) / DS_KV_PAGE;
    /* count first, so that running out changes nothing */
    int need = 0;
    for (int i = i0; i <= i1; i++)
        need += i >= s->n_pages || p->ref[s->table[i]] > 1 || p->hash[s->table[i]] != 0;
    if (need > ds_kvpool_n_free(p)) {
        ds_errf(err, errlen, "KV pool: %d free pages, %d needed (positions %d..%d)", ds_kvpool_n_free(p), need, p0,
                p1 - 1);
        return -1;
    }
    for (int i = i0; i <= i1; i++) {
        if (i >= s->n_pages) {
            while (s->n_pages <= i) {   /* a gap (i0 past the end) gets pages too */
                s->table[s->n_pages] = ds_kvpool_alloc(p);
                mark_dirty(s, s->n_pages);
                s->n_pages++;
            }
            continue;
        }
        const int32_t old = s->table[i];
        if (p->ref[old] > 1 || p->hash[old]) {
            /* copy-on-write: the rows below p0 in this page are the
             * sequence's and must survive; the rest are about to be written */
            const int32_t np = ds_kvpool_alloc(p);
            if (p0 > i * DS_KV_PAGE) ds_kvpool_copy(p, ex, np, old);
            ds_kvpool_unref(p, old);
            s->table[i] = np;
            mark_dirty(s, i);
            if (s->n_hashed > i) s->n_hashed = i;
        }
    }
    return 0;
}

int ds_seq_fork(ds_seq *dst, const ds_seq *src, ds_kvpool *p, int n, char *err, size_t errlen) {
    if (dst->n_pages) { ds_errf(err, errlen, "fork: the destination sequence is not empty"); return -1; }
    if (n < 0 || n > src->n_past) { ds_errf(err, errlen, "fork: %d positions, the source holds %d", n, src->n_past); return -1; }
    if (dst->max_pages < (n + DS_KV_PAGE - 1) / DS_KV_PAGE) {
        ds_errf(err, errlen, "fork: %d positions exceed the destination's capacity", n);
        return -1;
    }
    const int np = (n + DS_KV_PAGE - 1) / DS_KV_PAGE;
    for (int i = 0; i < np; i++) {
        dst->table[i] = src->table[i];
        ds_kvpool_ref(p, src->table[i]);
        mark_dirty(dst, i);
    }
    dst->n_pages = np;
    dst->n_past = n;
    dst->n_dctx = src->n_dctx < n ? src->n_dctx : n;
    dst->n_tokens = src->n_tokens < n ? src->n_tokens : n;
    memcpy(dst->tokens, src->tokens, (size_t)dst->n_tokens * sizeof *dst->tokens);
    dst->n_hashed = src->n_hashed < n / DS_KV_PAGE ? src->n_hashed : n / DS_KV_PAGE;
    memcpy(dst->hash, src->hash, (size_t)dst->n_hashed * sizeof *dst->hash);
    return 0;
}

/* ========================================================================
 * Reads and snapshots
 * ===================================================================== */

void ds_seq_read(const ds_seq *s, ds_kvpool *p, ds_exec *ex, int g, int pos0, int n, float *k, float *v) {
    const size_t row = (size_t)p->shape.row[g], rb = row * sizeof(float);
    for (int l = 0; l < p->shape.n_layer[g]; l++) {
        const float *kb = ds_kvpool_k(p, g, l), *vb = ds_kvpool_v(p, g, l);
        for (int j = 0; j < n; j++) {
            const int pos = pos0 + j;
            const int64_t at = (int64_t)s->table[pos / DS_KV_PAGE] * p->page_stride + (int64_t)(pos % DS_KV_PAGE) * (int64_t)row;
            p->be->i->download(ex, k + ((size_t)l * n + j) * row, kb + at, rb);
            p->be->i->download(ex, v + ((size_t)l * n + j) * row, vb + at, rb);
        }
    }
}

int ds_seq_snapshot(const ds_seq *s, ds_kvpool *p, ds_exec *ex, int n, ds_kv_snap *out) {
    memset(out, 0, sizeof *out);
    const int np = (n + DS_KV_PAGE - 1) / DS_KV_PAGE;
    if (n < 0 || np > s->n_pages) return -1;
    out->be = p->be;
    out->n = n;
    out->n_pages = np;
    if (!np) return 0;
    out->data = p->be->i->alloc(p->be, (size_t)np * (size_t)p->page_stride * sizeof(float));
    if (!out->data) { memset(out, 0, sizeof *out); return -1; }
    for (int i = 0; i < np; i++)
        p->be->i->copy(ex, out->data + (int64_t)i * p->page_stride, p->base + (int64_t)s->table[i] * p->page_stride,
                       (size_t)p->page_stride * sizeof(float));
    return 0;
}

int ds_seq_restore(ds_seq *s, ds_kvpool *p, ds_exec *ex, const ds_kv_snap *snap) {
    char e[8];
    if (ds_seq_prepare(s, p, ex, 0, snap->n, e, sizeof e)) return -1;
    for (int i = 0; i < snap->n_pages; i++)
        p->be->i->copy(ex, p->base + (int64_t)s->table[i] * p->page_stride, snap->data + (int64_t)i * p->page_stride,
                       (size_t)p->page_stride * sizeof(float));
    return 0;
}

void ds_kv_snap_free(ds_kv_snap *s) {
    if (s->data) s->be->i->release(s->be, s->data);
    memset(s, 0, sizeof *s);
}

/* ========================================================================
 * The exact prefix cache
 * ===================================================================== */

/* The chain hash of one page's ids after its parent's: a 64-bit mix
 * (splitmix64's finalizer over each id). Never 0 (0 means "not cached").
 * Equal hashes are only candidates: a hit also compares the ids and the
 * parent's identity. */
static uint64_t chain_hash(uint64_t parent, const int32_t *ids) {
    uint64_t h = parent ^ 0x9e3779b97f4a7c15ull;
    for (int i = 0; i < DS_KV_PAGE; i++) {
        h += (uint64_t)(uint32_t)ids[i] + 0x9e3779b97f4a7c15ull;
        h = (h ^ (h >> 30)) * 0xbf58476d1ce4e5b9ull;
        h = (h ^ (h >> 27)) * 0x94d049bb133111ebull;
        h ^= h >> 31;
    }
    return h ? h : 1;
}

void ds_prefix_publish(ds_kvpool *p, ds_seq *s, unsigned groups) {
    int lim = s->n_past < s->n_tokens ? s->n_past : s->n_tokens;
    if ((groups & 2u) && s->n_dctx < lim) lim = s->n_dctx;
    const int full = lim / DS_KV_PAGE;
    for (int i = s->n_hashed; i < full && i < s->n_pages; i++) {
        const int32_t page = s->table[i];
        const uint64_t parent = i ? s->hash[i - 1] : 0;
        const uint64_t h = chain_hash(parent, s->tokens + (size_t)i * DS_KV_PAGE);
        s->hash[i] = h;
        s->n_hashed = i + 1;
        if (p->hash[page]) continue;            /* came from the cache: already there */
        p->hash[page] = h;
        p->par[page] = i ? s->table[i - 1] : -1;
        p->par_gen[page] = i ? p->gen[s->table[i - 1]] : 0;
        p->groups[page] = (uint8_t)(groups | 1u);
        memcpy(p->ids + (size_t)page * DS_KV_PAGE, s->tokens + (size_t)i * DS_KV_PAGE, DS_KV_PAGE * sizeof(int32_t));
        map_insert(p, page);
        p->n_cached++;
    }
}

int ds_prefix_lookup(ds_kvpool *p, ds_seq *d, const int32_t *ids, int n, unsigned need, int max_pages) {
    if (d->n_pages || n < DS_KV_PAGE) return 0;
    int full = n / DS_KV_PAGE;
    if (full > max_pages) full = max_pages;
    if (full > d->max_pages) full = d->max_pages;
    uint64_t parent = 0;
    int32_t prev = -1;
    int hit = 0;
    for (int i = 0; i < full; i++) {
        const int32_t *pid = ids + (size_t)i * DS_KV_PAGE;
        const uint64_t h = chain_hash(parent, pid);
        int32_t found = -1;
        for (uint32_t k = (uint32_t)h & p->map_mask; p->map[k] >= 0; k = (k + 1) & p->map_mask) {
            const int32_t c = p->map[k];
            if (p->hash[c] == h && p->par[c] == prev && (prev < 0 || p->par_gen[c] == p->gen[prev]) &&
                (p->groups[c] & need) == need &&
                !memcmp(p->ids + (size_t)c * DS_KV_PAGE, pid, DS_KV_PAGE * sizeof(int32_t))) {
                found = c;
                break;
            }
        }
        if (found < 0) break;
        ds_kvpool_ref(p, found);
        d->table[i] = found;
        d->hash[i] = h;
        mark_dirty(d, i);
        parent = h;
        prev = found;
        hit = i + 1;
    }
    d->n_pages = d->n_hashed = hit;
    d->n_past = d->n_tokens = hit * DS_KV_PAGE;
    d->n_dctx = (need & 2u) ? d->n_past : 0;
    memcpy(d->tokens, ids, (size_t)d->n_tokens * sizeof *ids);
    return d->n_past;
}
