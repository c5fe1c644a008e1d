/* gguf.c — GGUF v3 reader (mmap or caller buffer) and writer.
 *
 * Reader: the file is untrusted input. Every count, length, offset and size
 * goes through the cursor's bounds check (overflow-safe) before a byte is
 * read, and arrays that grow with file-supplied counts grow with what has
 * actually been parsed, so a corrupt count costs at most memory proportional
 * to the bytes really present. Errors are one line: "gguf: <section>
 * (<item>): <problem>" or "gguf: truncated in <section> (...)".
 *
 * Writer: key/values are serialised into their on-disk payload at set time
 * (so a write is a straight copy), tensors are copied, and the file appears
 * atomically through a temp file + rename.
 *
 * The host must be little-endian: raw array/tensor bytes are used in place. */
#include "gguf.h"
#include "outfile.h"

#include <errno.h>
#include <fcntl.h>
#include <float.h>
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

_Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
               "gguf.c uses little-endian file bytes in place");

/* ======================================================================
 * Shared tables
 * ==================================================================== */

/* Bytes of one scalar of type t in the file; 0 for STRING/ARRAY/unknown. */
static uint64_t vtype_size(uint32_t t) {
    switch (t) {
    case GGUF_T_U8: case GGUF_T_I8: case GGUF_T_BOOL: return 1;
    case GGUF_T_U16: case GGUF_T_I16: return 2;
    case GGUF_T_U32: case GGUF_T_I32: case GGUF_T_F32: return 4;
    case GGUF_T_U64: case GGUF_T_I64: case GGUF_T_F64: return 8;
    default: return 0;
    }
}

static int vtype_is_unsigned(uint32_t t) {
    return t == GGUF_T_U8 || t == GGUF_T_U16 || t == GGUF_T_U32 || t == GGUF_T_U64;
}
static int vtype_is_signed(uint32_t t) {
    return t == GGUF_T_I8 || t == GGUF_T_I16 || t == GGUF_T_I32 || t == GGUF_T_I64;
}

const char *gguf_vtype_name(uint32_t t) {
    static const char *const names[GGUF_T_COUNT] = {
        "u8", "i8", "u16", "i16", "u32", "i32", "f32", "bool",
        "string", "array", "u64", "i64", "f64",
    };
    return t < GGUF_T_COUNT ? names[t] : "unknown";
}

/* ggml type names, only to make "unsupported tensor type" errors readable. */
static const char *ggml_type_name(uint32_t t) {
    static const char *const names[] = {
        "F32", "F16", "Q4_0", "Q4_1", "Q4_2", "Q4_3", "Q5_0", "Q5_1", "Q8_0", "Q8_1",
        "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "Q8_K", "IQ2_XXS", "IQ2_XS", "IQ3_XXS",
        "IQ1_S", "IQ4_NL", "IQ3_S", "IQ2_S", "IQ4_XS", "I8", "I16", "I32", "I64", "F64",
        "IQ1_M", "BF16",
    };
    return t < sizeof names / sizeof names[0] ? names[t] : "unknown";
}

static int is_pow2(uint64_t x) { return x && !(x & (x - 1)); }

/* Round x up to a multiple of align (a power of two); 1 on overflow. */
static int align_up_ovf(uint64_t x, uint64_t align, uint64_t *out) {
    uint64_t t;
    if (ds_add_ovf(x, align - 1, &t)) return 1;
    *out = t & ~(align - 1);
    return 0;
}

/* Grow *p (elements of elem bytes) so that index `need_n - 1` is valid.
 * Capacity doubles, so growth tracks what was parsed, never a file count. */
static int grow(void **p, uint64_t *cap, uint64_t need_n, size_t elem) {
    if (need_n <= *cap) return 0;
    uint64_t nc = *cap ? *cap : 16, bytes;
    while (nc < need_n) nc *= 2;
    if (ds_mul_ovf(nc, elem, &bytes) || bytes > SIZE_MAX) return -1;
    void *q = realloc(*p, (size_t)bytes);
    if (!q) return -1;
    *p = q;
    *cap = nc;
    return 0;
}

/* Copy a file string into a printable, bounded form for error messages:
 * no control bytes (the error must stay one line), no quotes. */
static void printable(char *dst, size_t dstlen, const char *s, uint64_t len) {
    size_t o = 0, max = dstlen > 4 ? dstlen - 4 : 0;
    uint64_t i;
    for (i = 0; i < len && o < max; i++) {
        unsigned char ch = (unsigned char)s[i];
        dst[o++] = (ch < 0x20 || ch >= 0x7f || ch == '\'') ? '?' : (char)ch;
    }
    if (i < len && dstlen >= 4) { memcpy(dst + o, "...", 3); o += 3; }
    if (dstlen) dst[o < dstlen ? o : dstlen - 1] = '\0';
}

/* ======================================================================
 * Reader: context and cursor
 * ==================================================================== */

struct gguf_ctx {
    const uint8_t *base;
    uint64_t size;
    void *map;              /* our mmap, or NULL for gguf_open_mem            */
    size_t map_len;
    uint32_t version;
    uint64_t alignment;
    uint64_t data_offset;
    uint64_t n_kv, kv_cap;
    gguf_kv *kvs;
    gguf_kv **kv_sorted;    /* by key, for bsearch and duplicate detection    */
    uint64_t n_tensors, tensor_cap;
    gguf_tensor *tensors;
    gguf_tensor **tensor_sorted;
};

typedef struct {
    const uint8_t *base;
    uint64_t size, pos;     /* invariant: pos <= size                          */
    const char *section;    /* "header", "kv section", "tensor directory", ... */
    char item[192];         /* "kv 3 'general.name'", or ""                    */
    char *err;
    size_t errlen;
} cursor;

/* "gguf: <section> (<item>): <message>" */
static void fail(cursor *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void fail(cursor *c, const char *fmt, ...) {
    char msg[320];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (c->item[0]) ds_errf(c->err, c->errlen, "gguf: %s (%s): %s", c->section, c->item, msg);
    else ds_errf(c->err, c->errlen, "gguf: %s: %s", c->section, msg);
}

/* Bounds check: n more bytes must exist at pos. `what` names the field. */
static int need(cursor *c, uint64_t n, const char *what) {
    if (n <= c->size - c->pos) return 0;
    ds_errf(c->err, c->errlen,
            "gguf: truncated in %s (%s%s%s: need %" PRIu64 " bytes at offset %" PRIu64
            ", file is %" PRIu64 " bytes)",
            c->section, c->item, c->item[0] ? ": " : "", what, n, c->pos, c->size);
    return -1;
}

static int rd_bytes(cursor *c, uint64_t n, const char *what, const uint8_t **out) {
    if (need(c, n, what)) return -1;
    *out = c->base + c->pos;
    c->pos += n;
    return 0;
}
static int rd_u32(cursor *c, const char *what, uint32_t *out) {
    const uint8_t *p;
    if (rd_bytes(c, 4, what, &p)) return -1;
    memcpy(out, p, 4);
    return 0;
}
static int rd_u64(cursor *c, const char *what, uint64_t *out) {
    const uint8_t *p;
    if (rd_bytes(c, 8, what, &p)) return -1;
    memcpy(out, p, 8);
    return 0;
}
static int rd_str(cursor *c, const char *what, gguf_str *out) {
    uint64_t len;
    const uint8_t *p;
    if (rd_u64(c, what, &len)) return -1;
    if (rd_bytes(c, len, what, &p)) return -1;
    out->ptr = (const char *)p;
    out->len = len;
    return 0;
}

static uint64_t remaining(const cursor *c) { return c->size - c->pos; }

/* ======================================================================
 * Reader: key/value section
 * ==================================================================== */

/* Smallest possible encodings, used to reject absurd counts before any
 * allocation: a kv is key length (8) + type (4) + a 1-byte value; a tensor
 * entry is name length (8) + 1 name byte + n_dims (4) + one ne (8) + type (4)
 * + offset (8). */
#define GGUF_MIN_KV_BYTES     13u
#define GGUF_MIN_TENSOR_BYTES 33u

/* Decode one scalar (already bounds-checked) into the widened union. */
static int decode_scalar(cursor *c, uint32_t type, const uint8_t *p, gguf_kv *kv) {
    switch (type) {
    case GGUF_T_U8:  kv->v.u = p[0]; break;
    case GGUF_T_I8:  kv->v.i = (int8_t)p[0]; break;
    case GGUF_T_U16: { uint16_t x; memcpy(&x, p, 2); kv->v.u = x; break; }
    case GGUF_T_I16: { int16_t x;  memcpy(&x, p, 2); kv->v.i = x; break; }
    case GGUF_T_U32: { uint32_t x; memcpy(&x, p, 4); kv->v.u = x; break; }
    case GGUF_T_I32: { int32_t x;  memcpy(&x, p, 4); kv->v.i = x; break; }
    case GGUF_T_U64: { uint64_t x; memcpy(&x, p, 8); kv->v.u = x; break; }
    case GGUF_T_I64: { int64_t x;  memcpy(&x, p, 8); kv->v.i = x; break; }
    case GGUF_T_F32: { float x;    memcpy(&x, p, 4); kv->v.f = x; break; }
    case GGUF_T_F64: { double x;   memcpy(&x, p, 8); kv->v.f = x; break; }
    case GGUF_T_BOOL:
        /* Strict: anything but 0/1 is corruption, and keeps copies exact. */
        if (p[0] > 1) { fail(c, "bool value %u is not 0 or 1", p[0]); return -1; }
        kv->v.b = p[0];
        break;
    default: return -1;
    }
    return 0;
}

static int parse_array(cursor *c, gguf_kv *kv) {
    uint32_t et;
    uint64_t n;
    if (rd_u32(c, "array element type", &et)) return -1;
    if (et == GGUF_T_ARRAY) { fail(c, "arrays of arrays are not supported"); return -1; }
    if (et >= GGUF_T_COUNT) { fail(c, "unknown array element type %" PRIu32, et); return -1; }
    if (rd_u64(c, "array count", &n)) return -1;
    kv->arr_type = (gguf_vtype)et;

    if (et == GGUF_T_STRING) {
        /* every string costs at least its 8-byte length */
        uint64_t min_bytes;
        if (ds_mul_ovf(n, 8, &min_bytes) || min_bytes > remaining(c)) {
            fail(c, "array of %" PRIu64 " strings cannot fit in the %" PRIu64
                 " bytes left (file is %" PRIu64 " bytes; truncated or corrupt)",
                 n, remaining(c), c->size);
            return -1;
        }
        /* kv->type is already ARRAY/STRING, so gguf_close frees what we
         * attach here even if a later element fails. */
        gguf_str *strs = NULL;
        uint64_t cap = 0;
        for (uint64_t i = 0; i < n; i++) {
            if (grow((void **)&strs, &cap, i + 1, sizeof *strs)) {
                kv->arr_data = (const uint8_t *)strs;
                fail(c, "out of memory reading string array element %" PRIu64, i);
                return -1;
            }
            kv->arr_data = (const uint8_t *)strs;
            if (rd_str(c, "array string", &strs[i])) return -1;
        }
        kv->arr_n = n;
        return 0;
    }

    uint64_t es = vtype_size(et), bytes;
    if (ds_mul_ovf(n, es, &bytes) || bytes > remaining(c)) {
        fail(c, "array of %" PRIu64 " %s elements cannot fit in the %" PRIu64
             " bytes left (file is %" PRIu64 " bytes; truncated or corrupt)",
             n, gguf_vtype_name(et), remaining(c), c->size);
        return -1;
    }
    const uint8_t *p;
    if (rd_bytes(c, bytes, "array data", &p)) return -1;
    if (et == GGUF_T_BOOL) {
        for (uint64_t i = 0; i < n; i++)
            if (p[i] > 1) { fail(c, "bool array element %" PRIu64 " is %u, not 0 or 1", i, p[i]); return -1; }
    }
    kv->arr_data = p;
    kv->arr_n = n;
    return 0;
}

static int parse_kv(cursor *c, uint64_t idx, gguf_kv *kv) {
    snprintf(c->item, sizeof c->item, "kv %" PRIu64, idx);
    if (rd_str(c, "key", &kv->key)) return -1;
    char shown[96];
    printable(shown, sizeof shown, kv->key.ptr, kv->key.len);
    snprintf(c->item, sizeof c->item, "kv %" PRIu64 " '%s'", idx, shown);
    if (kv->key.len == 0) { fail(c, "empty key"); return -1; }
    if (memchr(kv->key.ptr, 0, kv->key.len)) { fail(c, "key contains a NUL byte"); return -1; }

    uint32_t type;
    if (rd_u32(c, "value type", &type)) return -1;
    if (type >= GGUF_T_COUNT) { fail(c, "unknown value type %" PRIu32, type); return -1; }
    kv->type = (gguf_vtype)type;
    if (type == GGUF_T_STRING) return rd_str(c, "string value", &kv->str);
    if (type == GGUF_T_ARRAY) return parse_array(c, kv);
    const uint8_t *p;
    if (rd_bytes(c, vtype_size(type), "scalar value", &p)) return -1;
    return decode_scalar(c, type, p, kv);
}

static int cmp_str(gguf_str a, gguf_str b) {
    uint64_t m = a.len < b.len ? a.len : b.len;
    int r = m ? memcmp(a.ptr, b.ptr, (size_t)m) : 0;
    if (r) return r;
    return a.len < b.len ? -1 : a.len > b.len;
}
static int cmp_kv_ptr(const void *a, const void *b) {
    return cmp_str((*(gguf_kv *const *)a)->key, (*(gguf_kv *const *)b)->key);
}
static int cmp_tensor_ptr(const void *a, const void *b) {
    return strcmp((*(gguf_tensor *const *)a)->name, (*(gguf_tensor *const *)b)->name);
}

/* Sort keys for lookup; adjacent equal keys are duplicates. O(n log n) so a
 * file with many keys cannot make validation quadratic. */
static int index_kvs(gguf_ctx *g, cursor *c) {
    if (g->n_kv == 0) return 0;
    g->kv_sorted = malloc((size_t)g->n_kv * sizeof *g->kv_sorted);
    if (!g->kv_sorted) { fail(c, "out of memory indexing %" PRIu64 " keys", g->n_kv); return -1; }
    for (uint64_t i = 0; i < g->n_kv; i++) g->kv_sorted[i] = &g->kvs[i];
    qsort(g->kv_sorted, (size_t)g->n_kv, sizeof *g->kv_sorted, cmp_kv_ptr);
    for (uint64_t i = 1; i < g->n_kv; i++) {
        if (cmp_kv_ptr(&g->kv_sorted[i - 1], &g->kv_sorted[i]) == 0) {
            char shown[96];
            gguf_str k = g->kv_sorted[i]->key;
            printable(shown, sizeof shown, k.ptr, k.len);
            c->item[0] = '\0';
            fail(c, "duplicate key '%s'", shown);
            return -1;
        }
    }
    return 0;
}

static int read_alignment(gguf_ctx *g, cursor *c) {
    g->alignment = GGUF_DEFAULT_ALIGNMENT;
    const gguf_kv *kv = gguf_find_kv(g, "general.alignment");
    if (!kv) return 0;
    snprintf(c->item, sizeof c->item, "general.alignment");
    if (kv->type != GGUF_T_U32) {
        fail(c, "must be u32, found %s", gguf_vtype_name(kv->type));
        return -1;
    }
    if (!is_pow2(kv->v.u)) {
        fail(c, "alignment %" PRIu64 " is not a nonzero power of two", kv->v.u);
        return -1;
    }
    g->alignment = kv->v.u;
    return 0;
}

/* ======================================================================
 * Reader: tensor directory and data section
 * ==================================================================== */

static int parse_tensor_info(cursor *c, uint64_t idx, gguf_tensor *t) {
    snprintf(c->item, sizeof c->item, "tensor %" PRIu64, idx);
    uint64_t len;
    const uint8_t *p;
    if (rd_u64(c, "name length", &len)) return -1;
    if (len == 0) { fail(c, "empty tensor name"); return -1; }
    if (len > sizeof t->name - 1) {
        fail(c, "tensor name length %" PRIu64 " exceeds %zu bytes", len, sizeof t->name - 1);
        return -1;
    }
    if (rd_bytes(c, len, "name", &p)) return -1;
    if (memchr(p, 0, (size_t)len)) { fail(c, "tensor name contains a NUL byte"); return -1; }
    memcpy(t->name, p, (size_t)len);
    t->name[len] = '\0';
    char shown[96];
    printable(shown, sizeof shown, t->name, len);
    snprintf(c->item, sizeof c->item, "tensor %" PRIu64 " '%s'", idx, shown);

    if (rd_u32(c, "n_dims", &t->n_dims)) return -1;
    if (t->n_dims < 1 || t->n_dims > GGUF_MAX_DIMS) {
        fail(c, "n_dims %" PRIu32 " is out of range 1..%d", t->n_dims, GGUF_MAX_DIMS);
        return -1;
    }
    for (uint32_t d = 0; d < t->n_dims; d++) {
        if (rd_u64(c, "ne", &t->ne[d])) return -1;
        if (t->ne[d] == 0) { fail(c, "ne[%" PRIu32 "] is zero", d); return -1; }
        if (t->ne[d] > (uint64_t)INT64_MAX) {
            fail(c, "ne[%" PRIu32 "] = %" PRIu64 " overflows int64", d, t->ne[d]);
            return -1;
        }
    }
    for (uint32_t d = t->n_dims; d < GGUF_MAX_DIMS; d++) t->ne[d] = 1;
    if (rd_u32(c, "type", &t->type)) return -1;
    if (!ds_type_valid(t->type) && !(t->type == DS_TYPE_I32 && ds_type_i32_table(t->name))) {
        fail(c, "unsupported tensor type %" PRIu32 " (%s); dspark supports F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K "
             "(and I32 for a hash layer's expert table)", t->type, ggml_type_name(t->type));
        return -1;
    }
    if (rd_u64(c, "offset", &t->offset)) return -1;

    int ok;
    uint64_t bytes = ds_row_bytes(t->type, t->ne[0], &ok);
    if (!ok) {
        if (t->ne[0] % ds_type_block_elems(t->type))
            fail(c, "ne[0] = %" PRIu64 " is not a multiple of the %s block size %" PRIu64,
                 t->ne[0], ds_type_name(t->type), ds_type_block_elems(t->type));
        else
            fail(c, "row size of ne[0] = %" PRIu64 " overflows", t->ne[0]);
        return -1;
    }
    uint64_t nel = t->ne[0];
    for (uint32_t d = 1; d < t->n_dims; d++) {
        if (ds_mul_ovf(bytes, t->ne[d], &bytes) || ds_mul_ovf(nel, t->ne[d], &nel) ||
            nel > (uint64_t)INT64_MAX) {
            fail(c, "tensor size overflows at ne[%" PRIu32 "] = %" PRIu64, d, t->ne[d]);
            return -1;
        }
    }
    t->nbytes = bytes;
    return 0;
}

static int index_tensors(gguf_ctx *g, cursor *c) {
    if (g->n_tensors == 0) return 0;
    g->tensor_sorted = malloc((size_t)g->n_tensors * sizeof *g->tensor_sorted);
    if (!g->tensor_sorted) { fail(c, "out of memory indexing tensors"); return -1; }
    for (uint64_t i = 0; i < g->n_tensors; i++) g->tensor_sorted[i] = &g->tensors[i];
    qsort(g->tensor_sorted, (size_t)g->n_tensors, sizeof *g->tensor_sorted, cmp_tensor_ptr);
    for (uint64_t i = 1; i < g->n_tensors; i++) {
        if (strcmp(g->tensor_sorted[i - 1]->name, g->tensor_sorted[i]->name) == 0) {
            char shown[96];
            printable(shown, sizeof shown, g->tensor_sorted[i]->name, strlen(g->tensor_sorted[i]->name));
            c->item[0] = '\0';
            fail(c, "duplicate tensor name '%s'", shown);
            return -1;
        }
    }
    return 0;
}

/* Place every tensor in the data section: aligned, inside the file. */
static int place_tensors(gguf_ctx *g, cursor *c) {
    c->section = "padding";
    c->item[0] = '\0';
    if (align_up_ovf(c->pos, g->alignment, &g->data_offset)) {
        fail(c, "data section offset overflows");
        return -1;
    }
    /* A file without tensors may legitimately end before the padding. */
    if (g->n_tensors > 0 && g->data_offset > g->size) {
        ds_errf(c->err, c->errlen,
                "gguf: truncated in padding (data section starts at offset %" PRIu64
                " with alignment %" PRIu64 ", file is %" PRIu64 " bytes)",
                g->data_offset, g->alignment, g->size);
        return -1;
    }
    c->section = "data section";
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        gguf_tensor *t = &g->tensors[i];
        char shown[96];
        printable(shown, sizeof shown, t->name, strlen(t->name));
        snprintf(c->item, sizeof c->item, "tensor %" PRIu64 " '%s'", i, shown);
        if (t->offset % g->alignment) {
            fail(c, "offset %" PRIu64 " is not aligned to %" PRIu64 " (general.alignment)",
                 t->offset, g->alignment);
            return -1;
        }
        /* Writers (llama.cpp, gguf-py, ours) pad after every tensor, and
         * llama.cpp's reader insists on it, so the padded extent must be in
         * the file: a file cut inside the trailing padding is truncated. */
        uint64_t start, padded, end;
        if (ds_add_ovf(g->data_offset, t->offset, &start) ||
            align_up_ovf(t->nbytes, g->alignment, &padded) || ds_add_ovf(start, padded, &end)) {
            fail(c, "offset %" PRIu64 " + %" PRIu64 " bytes overflows", t->offset, t->nbytes);
            return -1;
        }
        if (end > g->size) {
            ds_errf(c->err, c->errlen,
                    "gguf: truncated in data section (%s: need %" PRIu64 " bytes (%" PRIu64
                    " padded) at offset %" PRIu64 ", file is %" PRIu64 " bytes)",
                    c->item, t->nbytes, padded, start, g->size);
            return -1;
        }
        t->data = g->base + start;
        /* The kernels read F32/F16/BF16 elements and Q8_0's fp16 scale as
         * naturally aligned loads: a file whose general.alignment lets a
         * tensor start off that boundary is refused here, once, instead of
         * faulting (or being undefined) in every kernel. */
        uint64_t nat = t->type == DS_TYPE_F32 ? 4 : 2;
        if ((uintptr_t)t->data % nat) {
            fail(c, "data at file offset %" PRIu64 " is not %" PRIu64 "-byte aligned, which %s tensors need "
                 "(general.alignment %" PRIu64 " is too small)", start, nat, ds_type_name(t->type), g->alignment);
            return -1;
        }
    }
    return 0;
}

/* ======================================================================
 * Reader: entry points
 * ==================================================================== */

static gguf_ctx *parse(gguf_ctx *g, char *err, size_t errlen) {
    cursor c = { .base = g->base, .size = g->size, .pos = 0, .section = "header",
                 .err = err, .errlen = errlen };
    c.item[0] = '\0';
    const uint8_t *magic;
    uint64_t n_tensors, n_kv;

    if (rd_bytes(&c, 4, "magic", &magic)) goto fail;
    if (memcmp(magic, "GGUF", 4) != 0) {
        char shown[8];
        printable(shown, sizeof shown, (const char *)magic, 4);
        fail(&c, "bad magic '%s' (not a GGUF file)", shown);
        goto fail;
    }
    if (rd_u32(&c, "version", &g->version)) goto fail;
    /* Version 2 (64-bit counts and lengths) is version 3's layout: 3 only
     * added big-endian files, which announce themselves by a byte-swapped
     * version. Version 1 had 32-bit counts and is refused, as ggml does. */
    if (g->version != 3 && g->version != 2) {
        if (g->version == 0x03000000u || g->version == 0x02000000u)
            fail(&c, "unsupported version (big-endian GGUF files are not supported)");
        else fail(&c, "unsupported version %" PRIu32 " (GGUF versions 2 and 3 are supported)", g->version);
        goto fail;
    }
    if (rd_u64(&c, "n_tensors", &n_tensors)) goto fail;
    if (rd_u64(&c, "n_kv", &n_kv)) goto fail;

    /* Absurd counts fail here, before any allocation. */
    uint64_t min_t, min_kv, min_all;
    int ovf_t = ds_mul_ovf(n_tensors, GGUF_MIN_TENSOR_BYTES, &min_t);
    int ovf_kv = ds_mul_ovf(n_kv, GGUF_MIN_KV_BYTES, &min_kv);
    if (ovf_t || min_t > remaining(&c)) {
        fail(&c, "n_tensors = %" PRIu64 " is impossible: %" PRIu64 " bytes remain after the header"
             " and each tensor entry needs at least %u (truncated or corrupt)",
             n_tensors, remaining(&c), GGUF_MIN_TENSOR_BYTES);
        goto fail;
    }
    if (ovf_kv || min_kv > remaining(&c) || ds_add_ovf(min_t, min_kv, &min_all) ||
        min_all > remaining(&c)) {
        fail(&c, "n_kv = %" PRIu64 " is impossible: %" PRIu64 " bytes remain after the header"
             " and each key/value needs at least %u (truncated or corrupt)",
             n_kv, remaining(&c), GGUF_MIN_KV_BYTES);
        goto fail;
    }

    c.section = "kv section";
    for (uint64_t i = 0; i < n_kv; i++) {
        if (grow((void **)&g->kvs, &g->kv_cap, i + 1, sizeof *g->kvs)) {
            fail(&c, "out of memory at kv %" PRIu64, i);
            goto fail;
        }
        memset(&g->kvs[i], 0, sizeof g->kvs[i]);
        g->n_kv = i + 1;   /* counted before parsing so close frees partial state */
        if (parse_kv(&c, i, &g->kvs[i])) goto fail;
    }
    c.item[0] = '\0';
    if (index_kvs(g, &c)) goto fail;
    if (read_alignment(g, &c)) goto fail;

    c.section = "tensor directory";
    c.item[0] = '\0';
    if (ds_mul_ovf(n_tensors, GGUF_MIN_TENSOR_BYTES, &min_t) || min_t > remaining(&c)) {
        ds_errf(err, errlen, "gguf: truncated in tensor directory (n_tensors = %" PRIu64
                " needs at least %" PRIu64 " bytes at offset %" PRIu64 ", file is %" PRIu64 " bytes)",
                n_tensors, min_t, c.pos, c.size);
        goto fail;
    }
    for (uint64_t i = 0; i < n_tensors; i++) {
        if (grow((void **)&g->tensors, &g->tensor_cap, i + 1, sizeof *g->tensors)) {
            fail(&c, "out of memory at tensor %" PRIu64, i);
            goto fail;
        }
        memset(&g->tensors[i], 0, sizeof g->tensors[i]);
        g->n_tensors = i + 1;
        if (parse_tensor_info(&c, i, &g->tensors[i])) goto fail;
    }
    c.item[0] = '\0';
    if (index_tensors(g, &c)) goto fail;
    if (place_tensors(g, &c)) goto fail;
    return g;

fail:
    if (err && errlen && !err[0]) ds_errf(err, errlen, "gguf: invalid file");
    gguf_close(g);
    return NULL;
}

gguf_ctx *gguf_open_mem(const void *buf, size_t size, char *err, size_t errlen) {
    if (err && errlen) err[0] = '\0';
    if (!buf && size) { ds_errf(err, errlen, "gguf: NULL buffer of %zu bytes", size); return NULL; }
    gguf_ctx *g = calloc(1, sizeof *g);
    if (!g) { ds_errf(err, errlen, "gguf: out of memory"); return NULL; }
    g->base = buf ? buf : (const uint8_t *)"";
    g->size = size;
    return parse(g, err, errlen);
}

gguf_ctx *gguf_open(const char *path, char *err, size_t errlen) {
    if (err && errlen) err[0] = '\0';
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) { ds_errf(err, errlen, "gguf: cannot open '%s': %s", path, strerror(errno)); return NULL; }
    struct stat st;
    if (fstat(fd, &st) != 0) {
        ds_errf(err, errlen, "gguf: cannot stat '%s': %s", path, strerror(errno));
        close(fd);
        return NULL;
    }
    if (!S_ISREG(st.st_mode)) {
        ds_errf(err, errlen, "gguf: '%s' is not a regular file", path);
        close(fd);
        return NULL;
    }
    if ((uint64_t)st.st_size > SIZE_MAX) {
        ds_errf(err, errlen, "gguf: '%s' is too large to map", path);
        close(fd);
        return NULL;
    }
    gguf_ctx *g = calloc(1, sizeof *g);
    if (!g) { close(fd); ds_errf(err, errlen, "gguf: out of memory"); return NULL; }
    g->size = (uint64_t)st.st_size;
    g->base = (const uint8_t *)"";    /* an empty file cannot be mapped */
    if (st.st_size > 0) {
        void *m = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (m == MAP_FAILED) {
            ds_errf(err, errlen, "gguf: cannot mmap '%s': %s", path, strerror(errno));
            close(fd);
            free(g);
            return NULL;
        }
        g->map = m;
        g->map_len = (size_t)st.st_size;
        g->base = m;
    }
    close(fd);   /* the mapping keeps the file alive */
    return parse(g, err, errlen);
}

void gguf_close(gguf_ctx *g) {
    if (!g) return;
    for (uint64_t i = 0; i < g->n_kv; i++)
        if (g->kvs[i].type == GGUF_T_ARRAY && g->kvs[i].arr_type == GGUF_T_STRING)
            free((void *)g->kvs[i].arr_data);   /* our gguf_str table */
    free(g->kvs);
    free(g->kv_sorted);
    free(g->tensors);
    free(g->tensor_sorted);
    if (g->map) munmap(g->map, g->map_len);
    free(g);
}

/* ======================================================================
 * Reader: accessors and typed getters
 * ==================================================================== */

uint32_t gguf_version(const gguf_ctx *g) { return g->version; }
uint64_t gguf_alignment(const gguf_ctx *g) { return g->alignment; }
uint64_t gguf_data_offset(const gguf_ctx *g) { return g->data_offset; }
uint64_t gguf_file_size(const gguf_ctx *g) { return g->size; }
uint64_t gguf_n_kv(const gguf_ctx *g) { return g->n_kv; }
uint64_t gguf_n_tensors(const gguf_ctx *g) { return g->n_tensors; }

const gguf_kv *gguf_kv_at(const gguf_ctx *g, uint64_t i) { return i < g->n_kv ? &g->kvs[i] : NULL; }
const gguf_tensor *gguf_tensor_at(const gguf_ctx *g, uint64_t i) {
    return i < g->n_tensors ? &g->tensors[i] : NULL;
}

int gguf_str_eq(gguf_str s, const char *c) {
    size_t n = strlen(c);
    return s.len == n && (n == 0 || memcmp(s.ptr, c, n) == 0);
}

const gguf_kv *gguf_find_kv(const gguf_ctx *g, const char *key) {
    if (!g->kv_sorted || !key) return NULL;
    gguf_kv probe;
    memset(&probe, 0, sizeof probe);
    probe.key.ptr = key;
    probe.key.len = strlen(key);
    const gguf_kv *pp = &probe;
    gguf_kv **hit = bsearch(&pp, g->kv_sorted, (size_t)g->n_kv, sizeof *g->kv_sorted, cmp_kv_ptr);
    return hit ? *hit : NULL;
}

const gguf_tensor *gguf_find_tensor(const gguf_ctx *g, const char *name) {
    if (!g->tensor_sorted || !name) return NULL;
    gguf_tensor probe;
    size_t n = strlen(name);
    if (n >= sizeof probe.name) return NULL;
    memcpy(probe.name, name, n + 1);
    const gguf_tensor *pp = &probe;
    gguf_tensor **hit = bsearch(&pp, g->tensor_sorted, (size_t)g->n_tensors,
                                sizeof *g->tensor_sorted, cmp_tensor_ptr);
    return hit ? *hit : NULL;
}

uint64_t gguf_tensor_nelements(const gguf_tensor *t) {
    uint64_t n = 1;
    for (uint32_t d = 0; d < t->n_dims && d < GGUF_MAX_DIMS; d++) n *= t->ne[d];
    return n;   /* cannot overflow for tensors from the reader: checked at open */
}

/* Integer value of an integer-typed scalar kv as (is_negative, magnitude
 * pieces). Returns 0 if kv is not an integer type. */
static int kv_int(const gguf_kv *kv, int *neg, uint64_t *u, int64_t *i) {
    if (vtype_is_unsigned(kv->type)) { *neg = 0; *u = kv->v.u; *i = 0; return 1; }
    if (vtype_is_signed(kv->type)) { *neg = kv->v.i < 0; *i = kv->v.i; *u = *neg ? 0 : (uint64_t)kv->v.i; return 1; }
    return 0;
}

int gguf_get_u64(const gguf_ctx *g, const char *key, uint64_t *out) {
    const gguf_kv *kv = gguf_find_kv(g, key);
    int neg; uint64_t u; int64_t i;
    if (!kv) return -1;
    if (!kv_int(kv, &neg, &u, &i) || neg) return -2;
    *out = u;
    return 0;
}

int gguf_get_u32(const gguf_ctx *g, const char *key, uint32_t *out) {
    uint64_t u;
    int r = gguf_get_u64(g, key, &u);
    if (r) return r;
    if (u > UINT32_MAX) return -2;
    *out = (uint32_t)u;
    return 0;
}

int gguf_get_i32(const gguf_ctx *g, const char *key, int32_t *out) {
    const gguf_kv *kv = gguf_find_kv(g, key);
    int neg; uint64_t u; int64_t i;
    if (!kv) return -1;
    if (!kv_int(kv, &neg, &u, &i)) return -2;
    if (neg) {
        if (i < INT32_MIN) return -2;
        *out = (int32_t)i;
    } else {
        if (u > INT32_MAX) return -2;
        *out = (int32_t)u;
    }
    return 0;
}

/* double -> float without the undefined behaviour of an out-of-range cast */
static float narrow_f64(double d) {
    if (d > FLT_MAX) return INFINITY;
    if (d < -FLT_MAX) return -INFINITY;
    return (float)d;
}

int gguf_get_f32(const gguf_ctx *g, const char *key, float *out) {
    const gguf_kv *kv = gguf_find_kv(g, key);
    if (!kv) return -1;
    if (kv->type == GGUF_T_F32 || kv->type == GGUF_T_F64) { *out = narrow_f64(kv->v.f); return 0; }
    /* integers are accepted too: some converters store e.g. rope bases as ints */
    if (vtype_is_unsigned(kv->type)) { *out = (float)kv->v.u; return 0; }
    if (vtype_is_signed(kv->type)) { *out = (float)kv->v.i; return 0; }
    return -2;
}

int gguf_get_bool(const gguf_ctx *g, const char *key, int *out) {
    const gguf_kv *kv = gguf_find_kv(g, key);
    if (!kv) return -1;
    if (kv->type == GGUF_T_BOOL) { *out = kv->v.b != 0; return 0; }
    if (kv->type == GGUF_T_STRING) {
        if (gguf_str_eq(kv->str, "true")) { *out = 1; return 0; }
        if (gguf_str_eq(kv->str, "false")) { *out = 0; return 0; }
    }
    return -2;
}

int gguf_get_str(const gguf_ctx *g, const char *key, gguf_str *out) {
    const gguf_kv *kv = gguf_find_kv(g, key);
    if (!kv) return -1;
    if (kv->type != GGUF_T_STRING) return -2;
    *out = kv->str;
    return 0;
}

int gguf_arr_str(const gguf_kv *kv, uint64_t i, gguf_str *out) {
    if (!kv || kv->type != GGUF_T_ARRAY || kv->arr_type != GGUF_T_STRING || i >= kv->arr_n) return -1;
    *out = ((const gguf_str *)(const void *)kv->arr_data)[i];
    return 0;
}

int gguf_arr_i64(const gguf_kv *kv, uint64_t i, int64_t *out) {
    if (!kv || kv->type != GGUF_T_ARRAY || i >= kv->arr_n) return -1;
    uint32_t t = kv->arr_type;
    if (!vtype_is_signed(t) && !vtype_is_unsigned(t)) return -1;
    const uint8_t *p = kv->arr_data + i * vtype_size(t);
    switch (t) {
    case GGUF_T_U8:  *out = p[0]; return 0;
    case GGUF_T_I8:  *out = (int8_t)p[0]; return 0;
    case GGUF_T_U16: { uint16_t x; memcpy(&x, p, 2); *out = x; return 0; }
    case GGUF_T_I16: { int16_t x;  memcpy(&x, p, 2); *out = x; return 0; }
    case GGUF_T_U32: { uint32_t x; memcpy(&x, p, 4); *out = x; return 0; }
    case GGUF_T_I32: { int32_t x;  memcpy(&x, p, 4); *out = x; return 0; }
    case GGUF_T_I64: { int64_t x;  memcpy(&x, p, 8); *out = x; return 0; }
    case GGUF_T_U64: {
        uint64_t x;
        memcpy(&x, p, 8);
        if (x > (uint64_t)INT64_MAX) return -1;   /* out of range for int64 */
        *out = (int64_t)x;
        return 0;
    }
    default: return -1;
    }
}

int gguf_arr_f32(const gguf_kv *kv, uint64_t i, float *out) {
    if (!kv || kv->type != GGUF_T_ARRAY || i >= kv->arr_n) return -1;
    if (kv->arr_type == GGUF_T_F32) { memcpy(out, kv->arr_data + i * 4, 4); return 0; }
    if (kv->arr_type == GGUF_T_F64) {
        double d;
        memcpy(&d, kv->arr_data + i * 8, 8);
        *out = narrow_f64(d);
        return 0;
    }
    return -1;
}

/* ======================================================================
 * Writer
 * ==================================================================== */

typedef struct {
    uint8_t *p;
    size_t len, cap;
    int oom;
} bytebuf;

static void bb_put(bytebuf *b, const void *src, size_t n) {
    if (b->oom || n == 0) return;
    if (n > SIZE_MAX - b->len) { b->oom = 1; return; }
    if (b->len + n > b->cap) {
        size_t nc = b->cap ? b->cap : 64;
        while (nc < b->len + n) {
            if (nc > SIZE_MAX / 2) { nc = b->len + n; break; }
            nc *= 2;
        }
        uint8_t *q = realloc(b->p, nc);
        if (!q) { b->oom = 1; return; }
        b->p = q;
        b->cap = nc;
    }
    memcpy(b->p + b->len, src, n);
    b->len += n;
}
static void bb_u32(bytebuf *b, uint32_t v) { bb_put(b, &v, 4); }
static void bb_u64(bytebuf *b, uint64_t v) { bb_put(b, &v, 8); }
static void bb_str(bytebuf *b, const char *s, uint64_t len) {
    bb_u64(b, len);
    if (len > SIZE_MAX) { b->oom = 1; return; }
    bb_put(b, s, (size_t)len);
}

typedef struct {
    char *key;
    uint32_t type;
    uint8_t *payload;   /* exact on-disk bytes following the type field */
    size_t payload_len;
} wkv;

typedef struct {
    char name[256];
    uint32_t type, n_dims;
    uint64_t ne[GGUF_MAX_DIMS];
    uint8_t *data;
    uint64_t nbytes;
} wtensor;

struct gguf_writer {
    wkv *kvs;
    uint64_t n_kv, kv_cap;
    wtensor *tensors;
    uint64_t n_tensors, tensor_cap;
    char err[DS_ERRLEN];
    int failed;         /* sticky: a failed setter makes gguf_writer_write fail */
};

static int wfail(gguf_writer *w, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int wfail(gguf_writer *w, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(w->err, sizeof w->err, fmt, ap);
    va_end(ap);
    w->failed = 1;
    return -1;
}

gguf_writer *gguf_writer_new(void) { return calloc(1, sizeof(gguf_writer)); }

void gguf_writer_free(gguf_writer *w) {
    if (!w) return;
    for (uint64_t i = 0; i < w->n_kv; i++) { free(w->kvs[i].key); free(w->kvs[i].payload); }
    for (uint64_t i = 0; i < w->n_tensors; i++) free(w->tensors[i].data);
    free(w->kvs);
    free(w->tensors);
    free(w);
}

const char *gguf_writer_error(const gguf_writer *w) { return w->err; }

static const wkv *writer_find_kv(const gguf_writer *w, const char *key) {
    for (uint64_t i = 0; i < w->n_kv; i++)
        if (strcmp(w->kvs[i].key, key) == 0) return &w->kvs[i];
    return NULL;
}

/* Validate the key, then take ownership of the serialised payload. */
static int add_kv(gguf_writer *w, const char *key, uint32_t type, bytebuf *payload) {
    char shown[96];
    if (!key || !key[0]) { free(payload->p); return wfail(w, "gguf writer: empty key"); }
    printable(shown, sizeof shown, key, strlen(key));
    if (payload->oom) { free(payload->p); return wfail(w, "gguf writer: out of memory for key '%s'", shown); }
    if (writer_find_kv(w, key)) { free(payload->p); return wfail(w, "gguf writer: duplicate key '%s'", shown); }
    if (strcmp(key, "general.alignment") == 0) {
        uint32_t a = 0;
        if (type != GGUF_T_U32) {
            free(payload->p);
            return wfail(w, "gguf writer: general.alignment must be u32, got %s", gguf_vtype_name(type));
        }
        memcpy(&a, payload->p, 4);
        if (!is_pow2(a)) {
            free(payload->p);
            return wfail(w, "gguf writer: general.alignment %" PRIu32 " is not a nonzero power of two", a);
        }
    }
    char *k = strdup(key);
    if (!k || grow((void **)&w->kvs, &w->kv_cap, w->n_kv + 1, sizeof *w->kvs)) {
        free(k);
        free(payload->p);
        return wfail(w, "gguf writer: out of memory for key '%s'", shown);
    }
    w->kvs[w->n_kv++] = (wkv){ .key = k, .type = type, .payload = payload->p, .payload_len = payload->len };
    return 0;
}

int gguf_set_scalar(gguf_writer *w, const char *key, gguf_vtype type, const void *v) {
    bytebuf b = {0};
    if (type == GGUF_T_STRING) {
        if (!v) return wfail(w, "gguf writer: NULL string for key '%s'", key ? key : "");
        bb_str(&b, v, strlen(v));
        return add_kv(w, key, type, &b);
    }
    uint64_t sz = vtype_size(type);
    if (sz == 0) return wfail(w, "gguf writer: gguf_set_scalar: type %s is not a scalar", gguf_vtype_name(type));
    if (!v) return wfail(w, "gguf writer: NULL value for key '%s'", key ? key : "");
    if (type == GGUF_T_BOOL) {
        uint8_t one = *(const uint8_t *)v != 0;   /* normalise to the 0/1 the reader demands */
        bb_put(&b, &one, 1);
    } else {
        bb_put(&b, v, (size_t)sz);
    }
    return add_kv(w, key, type, &b);
}

int gguf_set_u32(gguf_writer *w, const char *key, uint32_t v) { return gguf_set_scalar(w, key, GGUF_T_U32, &v); }
int gguf_set_i32(gguf_writer *w, const char *key, int32_t v) { return gguf_set_scalar(w, key, GGUF_T_I32, &v); }
int gguf_set_u64(gguf_writer *w, const char *key, uint64_t v) { return gguf_set_scalar(w, key, GGUF_T_U64, &v); }
int gguf_set_f32(gguf_writer *w, const char *key, float v) { return gguf_set_scalar(w, key, GGUF_T_F32, &v); }
int gguf_set_bool(gguf_writer *w, const char *key, int v) {
    uint8_t b = v != 0;
    return gguf_set_scalar(w, key, GGUF_T_BOOL, &b);
}
int gguf_set_str(gguf_writer *w, const char *key, const char *v) { return gguf_set_scalar(w, key, GGUF_T_STRING, v); }

int gguf_set_str_n(gguf_writer *w, const char *key, const char *v, uint64_t len) {
    if (!v && len) return wfail(w, "gguf writer: NULL string for key '%s'", key ? key : "");
    bytebuf b = {0};
    bb_str(&b, v ? v : "", len);
    return add_kv(w, key, GGUF_T_STRING, &b);
}

int gguf_set_arr(gguf_writer *w, const char *key, gguf_vtype elem_type, const void *data, uint64_t n) {
    if (elem_type == GGUF_T_STRING) return wfail(w, "gguf writer: use gguf_set_arr_str for string arrays");
    if (elem_type == GGUF_T_ARRAY) return wfail(w, "gguf writer: arrays of arrays are not supported");
    uint64_t es = vtype_size(elem_type), bytes;
    if (es == 0) return wfail(w, "gguf writer: unknown array element type %u", (unsigned)elem_type);
    if (ds_mul_ovf(n, es, &bytes) || bytes > SIZE_MAX) return wfail(w, "gguf writer: array of %" PRIu64 " elements is too large", n);
    if (!data && n) return wfail(w, "gguf writer: NULL data for array key '%s'", key ? key : "");
    if (elem_type == GGUF_T_BOOL) {
        for (uint64_t i = 0; i < n; i++)
            if (((const uint8_t *)data)[i] > 1)
                return wfail(w, "gguf writer: bool array element %" PRIu64 " is not 0 or 1", i);
    }
    bytebuf b = {0};
    bb_u32(&b, elem_type);
    bb_u64(&b, n);
    bb_put(&b, data, (size_t)bytes);
    return add_kv(w, key, GGUF_T_ARRAY, &b);
}

int gguf_set_arr_str(gguf_writer *w, const char *key, const char *const *strs, uint64_t n) {
    if (!strs && n) return wfail(w, "gguf writer: NULL string array for key '%s'", key ? key : "");
    bytebuf b = {0};
    bb_u32(&b, GGUF_T_STRING);
    bb_u64(&b, n);
    for (uint64_t i = 0; i < n; i++) {
        if (!strs[i]) { free(b.p); return wfail(w, "gguf writer: NULL string at index %" PRIu64, i); }
        bb_str(&b, strs[i], strlen(strs[i]));
    }
    return add_kv(w, key, GGUF_T_ARRAY, &b);
}

int gguf_set_kv(gguf_writer *w, const gguf_kv *kv) {
    char key[4096];
    if (!kv || kv->key.len == 0 || kv->key.len >= sizeof key)
        return wfail(w, "gguf writer: gguf_set_kv: key missing or longer than %zu bytes", sizeof key - 1);
    memcpy(key, kv->key.ptr, (size_t)kv->key.len);
    key[kv->key.len] = '\0';
    bytebuf b = {0};
    if (kv->type == GGUF_T_STRING) {
        bb_str(&b, kv->str.ptr, kv->str.len);
    } else if (kv->type == GGUF_T_ARRAY) {
        bb_u32(&b, kv->arr_type);
        bb_u64(&b, kv->arr_n);
        if (kv->arr_type == GGUF_T_STRING) {
            for (uint64_t i = 0; i < kv->arr_n; i++) {
                gguf_str s = { "", 0 };
                gguf_arr_str(kv, i, &s);
                bb_str(&b, s.ptr, s.len);
            }
        } else {
            bb_put(&b, kv->arr_data, (size_t)(kv->arr_n * vtype_size(kv->arr_type)));
        }
    } else {
        /* The reader's kv points into the mapping, where the raw value sits
         * right after the key and its u32 type: copy those bytes so NaN
         * payloads and widths survive exactly. */
        uint64_t sz = vtype_size(kv->type);
        if (sz == 0) return wfail(w, "gguf writer: gguf_set_kv: unknown value type %u", (unsigned)kv->type);
        bb_put(&b, (const uint8_t *)kv->key.ptr + kv->key.len + 4, (size_t)sz);
    }
    return add_kv(w, key, kv->type, &b);
}

int gguf_copy_kv(gguf_writer *w, const gguf_ctx *src, const char *const *skip_prefixes) {
    for (uint64_t i = 0; i < src->n_kv; i++) {
        const gguf_kv *kv = &src->kvs[i];
        int skip = 0;
        for (const char *const *p = skip_prefixes; p && *p && !skip; p++) {
            size_t pl = strlen(*p);
            skip = kv->key.len >= pl && memcmp(kv->key.ptr, *p, pl) == 0;
        }
        if (skip) continue;
        if (gguf_str_eq(kv->key, "tokenizer.ggml.pre") && kv->type == GGUF_T_STRING &&
            gguf_str_eq(kv->str, "gpt2")) {
            if (gguf_set_str(w, "tokenizer.ggml.pre", "gpt-2")) return -1;   /* llama.cpp's name */
        } else if (gguf_set_kv(w, kv)) {
            return -1;
        }
    }
    return 0;
}

uint32_t gguf_llama_ftype(uint32_t t) {
    switch (t) {
    case DS_TYPE_F32: return 0;
    case DS_TYPE_F16: return 1;
    case DS_TYPE_Q4_0: return 2;
    case DS_TYPE_Q4_1: return 3;
    case DS_TYPE_Q8_0: return 7;
    case DS_TYPE_Q5_0: return 8;
    case DS_TYPE_Q5_1: return 9;
    case DS_TYPE_Q4_K: return 14;
    case DS_TYPE_Q5_K: return 16;
    case DS_TYPE_Q6_K: return 18;
    case DS_TYPE_BF16: return 32;
    default: return 1;
    }
}

int gguf_add_tensor(gguf_writer *w, const char *name, uint32_t type, uint32_t n_dims,
                    const uint64_t *ne, const void *data, uint64_t nbytes) {
    char shown[96];
    if (!name || !name[0]) return wfail(w, "gguf writer: empty tensor name");
    size_t nl = strlen(name);
    printable(shown, sizeof shown, name, nl);
    if (nl > 255) return wfail(w, "gguf writer: tensor name '%s' is longer than 255 bytes", shown);
    if (!ds_type_valid(type) && !(type == DS_TYPE_I32 && ds_type_i32_table(name)))
        return wfail(w, "gguf writer: tensor '%s': unsupported tensor type %" PRIu32, shown, type);
    if (n_dims < 1 || n_dims > GGUF_MAX_DIMS || !ne)
        return wfail(w, "gguf writer: tensor '%s': n_dims %" PRIu32 " is out of range 1..%d", shown, n_dims, GGUF_MAX_DIMS);
    int ok;
    uint64_t bytes = ds_row_bytes(type, ne[0], &ok);
    if (!ok || ne[0] == 0 || ne[0] > (uint64_t)INT64_MAX)
        return wfail(w, "gguf writer: tensor '%s': ne[0] = %" PRIu64 " is zero, not a multiple of the %s block or too large",
                     shown, ne[0], ds_type_name(type));
    uint64_t nel = ne[0];
    for (uint32_t d = 1; d < n_dims; d++) {
        if (ne[d] == 0) return wfail(w, "gguf writer: tensor '%s': ne[%" PRIu32 "] is zero", shown, d);
        if (ds_mul_ovf(bytes, ne[d], &bytes) || ds_mul_ovf(nel, ne[d], &nel) || nel > (uint64_t)INT64_MAX)
            return wfail(w, "gguf writer: tensor '%s': size overflows", shown);
    }
    if (bytes != nbytes)
        return wfail(w, "gguf writer: tensor '%s': nbytes %" PRIu64 " does not match %" PRIu64 " for %s shape",
                     shown, nbytes, bytes, ds_type_name(type));
    if (!data) return wfail(w, "gguf writer: tensor '%s': NULL data", shown);
    if (bytes > SIZE_MAX) return wfail(w, "gguf writer: tensor '%s': too large", shown);
    for (uint64_t i = 0; i < w->n_tensors; i++)
        if (strcmp(w->tensors[i].name, name) == 0)
            return wfail(w, "gguf writer: duplicate tensor name '%s'", shown);
    uint8_t *copy = malloc((size_t)bytes);
    if (!copy || grow((void **)&w->tensors, &w->tensor_cap, w->n_tensors + 1, sizeof *w->tensors)) {
        free(copy);
        return wfail(w, "gguf writer: out of memory for tensor '%s'", shown);
    }
    memcpy(copy, data, (size_t)bytes);
    wtensor *t = &w->tensors[w->n_tensors++];
    memset(t, 0, sizeof *t);
    memcpy(t->name, name, nl + 1);
    t->type = type;
    t->n_dims = n_dims;
    for (uint32_t d = 0; d < GGUF_MAX_DIMS; d++) t->ne[d] = d < n_dims ? ne[d] : 1;
    t->data = copy;
    t->nbytes = bytes;
    return 0;
}

/* ---- writing the file --------------------------------------------------- */

static int put(FILE *f, const void *p, size_t n) { return n == 0 || fwrite(p, 1, n, f) == n ? 0 : -1; }
static int put_u32(FILE *f, uint32_t v) { return put(f, &v, 4); }
static int put_u64(FILE *f, uint64_t v) { return put(f, &v, 8); }
static int put_zeros(FILE *f, uint64_t n) {
    static const uint8_t zeros[256];   /* read-only: not mutable state */
    while (n) {
        size_t k = n < sizeof zeros ? (size_t)n : sizeof zeros;
        if (put(f, zeros, k)) return -1;
        n -= k;
    }
    return 0;
}

static int write_body(const gguf_writer *w, FILE *f, uint64_t align) {
    uint64_t pos = 0, pad;
    if (put(f, "GGUF", 4) || put_u32(f, 3) || put_u64(f, w->n_tensors) || put_u64(f, w->n_kv)) return -1;
    pos = 24;
    for (uint64_t i = 0; i < w->n_kv; i++) {
        const wkv *kv = &w->kvs[i];
        size_t kl = strlen(kv->key);
        if (put_u64(f, kl) || put(f, kv->key, kl) || put_u32(f, kv->type) ||
            put(f, kv->payload, kv->payload_len)) return -1;
        pos += 8 + kl + 4 + kv->payload_len;
    }
    uint64_t off = 0;   /* running offset inside the data section */
    for (uint64_t i = 0; i < w->n_tensors; i++) {
        const wtensor *t = &w->tensors[i];
        size_t nl = strlen(t->name);
        if (put_u64(f, nl) || put(f, t->name, nl) || put_u32(f, t->n_dims)) return -1;
        for (uint32_t d = 0; d < t->n_dims; d++) if (put_u64(f, t->ne[d])) return -1;
        if (put_u32(f, t->type) || put_u64(f, off)) return -1;
        pos += 8 + nl + 4 + 8ull * t->n_dims + 4 + 8;
        if (align_up_ovf(off + t->nbytes, align, &off)) return -1;
    }
    if (align_up_ovf(pos, align, &pad) || put_zeros(f, pad - pos)) return -1;
    for (uint64_t i = 0; i < w->n_tensors; i++) {
        const wtensor *t = &w->tensors[i];
        uint64_t end;
        if (put(f, t->data, (size_t)t->nbytes)) return -1;
        if (align_up_ovf(t->nbytes, align, &end) || put_zeros(f, end - t->nbytes)) return -1;
    }
    return 0;
}

int gguf_writer_write(gguf_writer *w, const char *path, char *err, size_t errlen) {
    if (w->failed) {
        ds_errf(err, errlen, "gguf writer: not writing '%s' because an earlier call failed: %s", path, w->err);
        return -1;
    }
    /* temp file + rename, clean-up on failure and on signals: outfile.c */
    char e2[DS_ERRLEN];
    ds_outfile *o = ds_out_open(path, e2, sizeof e2);
    if (!o) { ds_errf(err, errlen, "gguf writer: %s", e2); return -1; }
    if (gguf_writer_write_fp(w, ds_out_fp(o), err, errlen)) { ds_out_abort(o); return -1; }
    if (ds_out_commit(o, e2, sizeof e2)) { ds_errf(err, errlen, "gguf writer: %s", e2); return -1; }
    return 0;
}

int gguf_writer_write_fp(gguf_writer *w, FILE *f, char *err, size_t errlen) {
    if (w->failed) {
        ds_errf(err, errlen, "gguf writer: not writing because an earlier call failed: %s", w->err);
        return -1;
    }
    uint64_t align = GGUF_DEFAULT_ALIGNMENT;
    const wkv *ak = writer_find_kv(w, "general.alignment");
    if (ak) { uint32_t a; memcpy(&a, ak->payload, 4); align = a; }   /* validated at set time */
    errno = 0;
    if (write_body(w, f, align) != 0 || fflush(f) != 0) {
        ds_errf(err, errlen, "gguf writer: write failed: %s", strerror(errno ? errno : EIO));
        return -1;
    }
    return 0;
}
