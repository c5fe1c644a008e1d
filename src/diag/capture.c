/* capture.c — preallocated checkpoint arena for first-divergence diagnostics.
 *
 * A capture hook runs inside the forward pass, so it must not perturb it:
 * no allocation, no locks, no I/O, bounded work. Everything (arena, entry
 * table, duplicate-detection hash) is allocated once in dsd_capture_new; a
 * put is a hash probe plus a memcpy. Ordering is deferred to finalize (one
 * qsort), because insertion order depends on how the engine schedules rows
 * and layers while the report must not. */
#include "dspark_diag.h"

#include <stdlib.h>
#include <string.h>

/* =====================================================================
 * names, keys, status strings
 * =================================================================== */
static const char *const CP_NAMES[DSD_CP_COUNT] = {
    [DSD_CP_NONE]          = "cp0_none",
    [DSD_CP_ATTN_NORM]     = "cp1_attn_norm",
    [DSD_CP_QKV]           = "cp2_qkv",
    [DSD_CP_KV_WRITE]      = "cp3_kv_write",
    [DSD_CP_ATTN_HEADS]    = "cp4_attn_heads",
    [DSD_CP_ATTN_OUT_PROJ] = "cp5_attn_out_proj",
    [DSD_CP_ATTN_RESIDUAL] = "cp6_attn_residual",
    [DSD_CP_FFN_NORM]      = "cp7_ffn_norm",
    [DSD_CP_FFN_GATE_UP]   = "cp8_ffn_gate_up",
    [DSD_CP_FFN_ACT]       = "cp9_ffn_act",
    [DSD_CP_FFN_DOWN]      = "cp10_ffn_down",
    [DSD_CP_LAYER_OUT]     = "cp11_layer_out",
    [DSD_CP_FINAL_NORM]    = "final_norm",
    [DSD_CP_LOGITS]        = "logits",
    [DSD_CP_TAP]           = "tap",
};
static const char *const SUB_NAMES[DSD_SUB_NAMED_COUNT] = {
    [DSD_SUB_ALL] = "all",
    [DSD_SUB_Q_PROJ] = "q_proj", [DSD_SUB_K_PROJ] = "k_proj", [DSD_SUB_V_PROJ] = "v_proj",
    [DSD_SUB_Q_NORM] = "q_norm", [DSD_SUB_K_NORM] = "k_norm",
    [DSD_SUB_Q_ROPE] = "q_rope", [DSD_SUB_K_ROPE] = "k_rope",
    [DSD_SUB_K_CACHE_ROW] = "k_cache_row", [DSD_SUB_V_CACHE_ROW] = "v_cache_row",
    [DSD_SUB_FFN_GATE] = "ffn_gate", [DSD_SUB_FFN_UP] = "ffn_up",
    [DSD_SUB_MOE_LOGITS] = "moe_logits", [DSD_SUB_MOE_ROUTE] = "moe_route", [DSD_SUB_GDN_CONV] = "gdn_conv", [DSD_SUB_GDN_OUT] = "gdn_out",
    [DSD_SUB_QA] = "qa", [DSD_SUB_KV] = "kv", [DSD_SUB_QB] = "qb", [DSD_SUB_HC_PRE] = "hc_pre",
    [DSD_SUB_HC_ATTN] = "after_attn_hc",
};

static int cp_valid(uint32_t cp) { return cp > DSD_CP_NONE && cp < DSD_CP_COUNT; }

const char *dsd_cp_name(uint32_t cp) { return cp_valid(cp) ? CP_NAMES[cp] : "cp?"; }

int dsd_cp_parse(const char *name) {
    if (!name) return -1;
    for (uint32_t cp = 1; cp < DSD_CP_COUNT; cp++) {
        const char *full = CP_NAMES[cp];
        if (strcmp(name, full) == 0) return (int)cp;
        /* short form "cp4" matches "cp4_attn_heads" (but "cp1" not "cp10_...") */
        size_t l = strlen(name);
        if (l >= 3 && strncmp(full, name, l) == 0 && full[l] == '_' && name[0] == 'c') return (int)cp;
    }
    return -1;
}

int dsd_sub_valid(uint32_t sub) {
    return sub < DSD_SUB_NAMED_COUNT ||
           (sub >= DSD_SUB_HEAD_BASE && sub <= (uint32_t)DSD_SUB_HEAD_BASE + DSD_SUB_HEAD_MAX);
}

const char *dsd_sub_name(uint32_t sub, char buf[DSD_NAME_MAX]) {
    if (sub < DSD_SUB_NAMED_COUNT) return SUB_NAMES[sub];
    if (dsd_sub_valid(sub) && buf) {
        snprintf(buf, DSD_NAME_MAX, "head_%u", sub - (uint32_t)DSD_SUB_HEAD_BASE);
        return buf;
    }
    return "sub?";
}

/* Post-stack objects (final norm, logits, drafter context) are computed after
 * every layer, so they sort after the last real layer: map -1 to INT64_MAX. */
static inline int64_t layer_rank(int32_t layer) { return layer < 0 ? INT64_MAX : (int64_t)layer; }

/* Within a checkpoint, subobjects in dataflow order: deepseek4's sites
 * come before what is computed from them (hc_pre's mixed input before its
 * norm; QA, KV, QB before the RoPE'd q / k); the others by number. */
static int64_t sub_rank(uint32_t sub) {
    switch (sub) {
    case DSD_SUB_HC_PRE: case DSD_SUB_QA: return -3;
    case DSD_SUB_KV: return -2;
    case DSD_SUB_QB: return -1;
    default: return (int64_t)sub;
    }
}

int dsd_key_cmp(const dsd_key *a, const dsd_key *b) {
    if (a->row != b->row) return a->row < b->row ? -1 : 1;
    int64_t la = layer_rank(a->layer), lb = layer_rank(b->layer);
    if (la != lb) return la < lb ? -1 : 1;
    if (a->cp != b->cp) return a->cp < b->cp ? -1 : 1;
    if (a->sub != b->sub) return sub_rank(a->sub) < sub_rank(b->sub) ? -1 : 1;
    return 0;
}

const char *dsd_strerror(int status) {
    switch (status) {
    case DSD_OK: return "ok";
    case DSD_SKIPPED: return "skipped";
    case DSD_ERR_ARG: return "invalid_argument";
    case DSD_ERR_ARENA_FULL: return "arena_full";
    case DSD_ERR_ENTRIES_FULL: return "entries_full";
    case DSD_ERR_DUPLICATE: return "duplicate_key";
    case DSD_ERR_NOT_FOUND: return "not_found";
    case DSD_ERR_STATE: return "not_finalized";
    case DSD_ERR_NOMEM: return "out_of_memory";
    case DSD_ERR_IO: return "io_error";
    default: return "unknown_status";
    }
}

dsd_filter dsd_filter_all(void) {
    dsd_filter f = { 0, INT32_MAX, 0, INT32_MAX, DSD_CP_MASK_ALL };
    return f;
}

/* =====================================================================
 * the arena
 * =================================================================== */
typedef struct {
    dsd_key key;
    size_t  off;      /* in floats from the arena start */
    size_t  n;
} entry;

struct dsd_capture {
    dsd_cap_mode mode;
    dsd_filter   filter;
    float       *arena;
    size_t       arena_cap, arena_used;     /* floats */
    size_t       arena_bytes;
    entry       *entries;
    size_t       max_entries, n_entries;
    uint32_t    *hash;                      /* entry index + 1; 0 = empty */
    size_t       hash_mask;
    int          finalized;
    dsd_capture_stats st;                   /* counters only; sizes filled on read */
};

static inline uint64_t key_hash(const dsd_key *k) {
    /* splitmix64 finalizer over the packed key: cheap and well mixed */
    uint64_t x = ((uint64_t)(uint32_t)k->row << 32) ^ (uint32_t)k->layer;
    x ^= ((uint64_t)k->cp << 48) ^ ((uint64_t)k->sub * 0x9e3779b97f4a7c15ull);
    x ^= x >> 30; x *= 0xbf58476d1ce4e5b9ull;
    x ^= x >> 27; x *= 0x94d049bb133111ebull;
    x ^= x >> 31;
    return x;
}
static inline int key_eq(const dsd_key *a, const dsd_key *b) {
    return a->row == b->row && a->layer == b->layer && a->cp == b->cp && a->sub == b->sub;
}

/* slot holding key, or the empty slot where it would go */
static size_t hash_probe(const dsd_capture *c, const dsd_key *k) {
    size_t i = (size_t)key_hash(k) & c->hash_mask;
    while (c->hash[i] && !key_eq(&c->entries[c->hash[i] - 1].key, k)) i = (i + 1) & c->hash_mask;
    return i;
}

dsd_capture *dsd_capture_new(size_t arena_bytes, size_t max_entries) {
    if (max_entries >= UINT32_MAX / 4) return NULL;     /* hash stores 32-bit indices */
    dsd_capture *c = calloc(1, sizeof *c);
    if (!c) return NULL;
    /* load factor <= 1/2 keeps linear probing short for every put */
    size_t hsize = 16;
    while (hsize < 2 * max_entries) hsize *= 2;
    c->arena_cap = arena_bytes / sizeof(float);
    c->arena_bytes = c->arena_cap * sizeof(float);
    c->arena = malloc(c->arena_cap ? c->arena_cap * sizeof(float) : 1);
    c->entries = malloc((max_entries ? max_entries : 1) * sizeof *c->entries);
    c->hash = calloc(hsize, sizeof *c->hash);
    if (!c->arena || !c->entries || !c->hash) { dsd_capture_free(c); return NULL; }
    /* pre-fault the pages now so the first copies in a hook do not take
     * page faults inside the pass being measured */
    memset(c->arena, 0, c->arena_cap * sizeof(float));
    c->hash_mask = hsize - 1;
    c->max_entries = max_entries;
    c->mode = DSD_CAP_OFF;
    c->filter = dsd_filter_all();
    c->finalized = 1;                                   /* empty is sorted */
    c->st.first_error = DSD_OK;
    return c;
}

void dsd_capture_free(dsd_capture *c) {
    if (!c) return;
    free(c->arena);
    free(c->entries);
    free(c->hash);
    free(c);
}

void dsd_capture_arm(dsd_capture *c, dsd_cap_mode mode) {
    if (c && (mode == DSD_CAP_OFF || mode == DSD_CAP_HOOKS || mode == DSD_CAP_COPY)) c->mode = mode;
}
dsd_cap_mode dsd_capture_mode(const dsd_capture *c) { return c ? c->mode : DSD_CAP_OFF; }

int dsd_capture_set_filter(dsd_capture *c, const dsd_filter *f) {
    if (!c) return DSD_ERR_ARG;
    c->filter = f ? *f : dsd_filter_all();
    return DSD_OK;
}

static int in_filter(const dsd_filter *f, int32_t row, int32_t layer, uint32_t cp) {
    if (row < f->row_lo || row > f->row_hi) return 0;
    if (layer >= 0 && (layer < f->layer_lo || layer > f->layer_hi)) return 0;
    return cp < 32 && (f->cp_mask & DSD_CP_BIT(cp)) != 0;
}

int dsd_capture_wants(const dsd_capture *c, int32_t row, int32_t layer, uint32_t cp) {
    return c && c->mode == DSD_CAP_COPY && in_filter(&c->filter, row, layer, cp);
}

static int reject(dsd_capture *c, int status, const dsd_key *k) {
    if (c->st.errors++ == 0) { c->st.first_error = status; c->st.first_error_key = *k; }
    return status;
}

int dsd_capture_put(dsd_capture *c, int32_t row, int32_t layer, uint32_t cp, uint32_t sub,
                    const float *data, size_t n) {
    if (!c) return DSD_ERR_ARG;
    if (c->mode == DSD_CAP_OFF) return DSD_SKIPPED;
    dsd_key k = { row, layer, cp, sub };
    c->st.hook_calls++;
    /* validate in every armed mode so HOOKS (A1) runs the same checks as COPY (A2) */
    if (row < 0 || layer < DSD_LAYER_POST || !cp_valid(cp) || !dsd_sub_valid(sub) || (!data && n))
        return reject(c, DSD_ERR_ARG, &k);
    if (!in_filter(&c->filter, row, layer, cp)) { c->st.skipped++; return DSD_SKIPPED; }
    if (c->mode == DSD_CAP_HOOKS) return DSD_OK;

    /* every check happens before the first write: a rejected put leaves the
     * arena and table exactly as they were */
    size_t slot = hash_probe(c, &k);
    if (c->hash[slot]) return reject(c, DSD_ERR_DUPLICATE, &k);
    if (c->n_entries >= c->max_entries) return reject(c, DSD_ERR_ENTRIES_FULL, &k);
    if (n > c->arena_cap - c->arena_used) return reject(c, DSD_ERR_ARENA_FULL, &k);

    entry *e = &c->entries[c->n_entries];
    e->key = k;
    e->off = c->arena_used;
    e->n = n;
    if (n) memcpy(c->arena + c->arena_used, data, n * sizeof(float));   /* raw bits */
    c->arena_used += n;
    c->hash[slot] = (uint32_t)(++c->n_entries);
    c->st.stored++;
    c->finalized = 0;
    return DSD_OK;
}

int dsd_capture_find(const dsd_capture *c, int32_t row, int32_t layer, uint32_t cp, uint32_t sub,
                     const float **data, size_t *n) {
    if (!c) return DSD_ERR_ARG;
    dsd_key k = { row, layer, cp, sub };
    size_t slot = hash_probe(c, &k);
    if (!c->hash[slot]) return DSD_ERR_NOT_FOUND;
    const entry *e = &c->entries[c->hash[slot] - 1];
    if (data) *data = c->arena + e->off;
    if (n) *n = e->n;
    return DSD_OK;
}

static int entry_cmp(const void *a, const void *b) {
    return dsd_key_cmp(&((const entry *)a)->key, &((const entry *)b)->key);
}

void dsd_capture_finalize(dsd_capture *c) {
    if (!c || c->finalized) return;
    /* sort the entries themselves (keys are unique, so the order is total)
     * and rebuild the hash, whose slots hold entry indices */
    qsort(c->entries, c->n_entries, sizeof *c->entries, entry_cmp);
    memset(c->hash, 0, (c->hash_mask + 1) * sizeof *c->hash);
    for (size_t i = 0; i < c->n_entries; i++)
        c->hash[hash_probe(c, &c->entries[i].key)] = (uint32_t)(i + 1);
    c->finalized = 1;
}

int dsd_capture_finalized(const dsd_capture *c) { return c && c->finalized; }
size_t dsd_capture_count(const dsd_capture *c) { return c ? c->n_entries : 0; }

int dsd_capture_at(const dsd_capture *c, size_t i, dsd_key *key, const float **data, size_t *n) {
    if (!c || i >= c->n_entries) return DSD_ERR_ARG;
    if (!c->finalized) return DSD_ERR_STATE;
    const entry *e = &c->entries[i];
    if (key) *key = e->key;
    if (data) *data = c->arena + e->off;
    if (n) *n = e->n;
    return DSD_OK;
}

void dsd_capture_reset(dsd_capture *c) {
    if (!c) return;
    memset(c->hash, 0, (c->hash_mask + 1) * sizeof *c->hash);
    c->n_entries = 0;
    c->arena_used = 0;
    c->finalized = 1;
    memset(&c->st, 0, sizeof c->st);
    c->st.first_error = DSD_OK;
}

void dsd_capture_get_stats(const dsd_capture *c, dsd_capture_stats *st) {
    if (!st) return;
    memset(st, 0, sizeof *st);
    if (!c) return;
    *st = c->st;
    st->entries = c->n_entries;
    st->max_entries = c->max_entries;
    st->arena_bytes = c->arena_bytes;
    st->arena_used_bytes = c->arena_used * sizeof(float);
}
