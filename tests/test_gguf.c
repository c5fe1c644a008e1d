/* test_gguf.c — GGUF reader/writer: round trip, malformed files, mutation fuzz.
 *
 * Every check prints "PASS name" or "FAIL name: why"; exit status is the
 * number of failures (capped). Loops over many inputs (every truncation
 * offset, 20000 mutations) print one line per loop, plus the first failure.
 * Temp files live in a mkdtemp directory removed at the end. */
#include "gguf.h"

#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <unistd.h>

typedef struct {
    int pass, fail;
} tally;

static void check(tally *t, int ok, const char *name, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void check(tally *t, int ok, const char *name, const char *fmt, ...) {
    if (ok) { t->pass++; printf("PASS %s\n", name); return; }
    t->fail++;
    printf("FAIL %s: ", name);
    va_list ap;
    va_start(ap, fmt);
    vprintf(fmt, ap);
    va_end(ap);
    printf("\n");
}

/* ======================================================================
 * Fixture: a file with every value type and every tensor type
 * ==================================================================== */

typedef struct {
    const char *name;
    uint32_t type, n_dims;
    uint64_t ne[4];
} tensor_spec;

static const tensor_spec k_tensors[] = {
    { "t.f32", DS_TYPE_F32, 1, { 7, 1, 1, 1 } },
    { "t.f16", DS_TYPE_F16, 2, { 5, 3, 1, 1 } },
    { "t.bf16", DS_TYPE_BF16, 3, { 2, 3, 4, 1 } },
    { "t.q8a", DS_TYPE_Q8_0, 4, { 64, 2, 1, 3 } },
    { "t.q8b", DS_TYPE_Q8_0, 1, { 32, 1, 1, 1 } },
};
#define N_TENSORS (sizeof k_tensors / sizeof k_tensors[0])

static uint64_t spec_bytes(const tensor_spec *s) {
    int ok;
    uint64_t b = ds_row_bytes(s->type, s->ne[0], &ok);
    for (uint32_t d = 1; d < s->n_dims; d++) b *= s->ne[d];
    return b;
}

/* deterministic tensor contents: byte j of tensor i */
static uint8_t tensor_byte(size_t i, uint64_t j) { return (uint8_t)(i * 31 + j * 7 + (j >> 8)); }

static const uint8_t  v_u8[]  = { 0, 1, 255 };
static const int8_t   v_i8[]  = { -128, 0, 127 };
static const uint16_t v_u16[] = { 0, 65535, 1234 };
static const int16_t  v_i16[] = { -32768, 32767, -1 };
static const uint32_t v_u32[] = { 0, 4294967295u, 42 };
static const int32_t  v_i32[] = { INT32_MIN, INT32_MAX, -7 };
static const float    v_f32[] = { 1.5f, -0.0f, 3.0e38f };
static const uint8_t  v_bool[] = { 1, 0, 1 };
static const uint64_t v_u64[] = { 0, UINT64_MAX, 9 };
static const int64_t  v_i64[] = { INT64_MIN, INT64_MAX, -9 };
static const double   v_f64[] = { 1e300, -2.5, 0.125 };
static const char *const v_strs[] = { "alpha", "", "g\xc3\xa9n\xc3\xa9ral" };

static int build_fixture(gguf_writer *w, uint32_t alignment) {
    int rc = 0;
    if (alignment) rc |= gguf_set_u32(w, "general.alignment", alignment);
    uint8_t u8 = 200; int8_t i8 = -100; uint16_t u16 = 60000; int16_t i16 = -30000;
    uint32_t u32 = 4000000000u; int32_t i32 = -2000000000; float f32 = 3.5f; uint8_t bl = 1;
    uint64_t u64 = (1ull << 63) + 5; int64_t i64 = -(1ll << 62); double f64 = 1e300;
    rc |= gguf_set_scalar(w, "s.u8", GGUF_T_U8, &u8);
    rc |= gguf_set_scalar(w, "s.i8", GGUF_T_I8, &i8);
    rc |= gguf_set_scalar(w, "s.u16", GGUF_T_U16, &u16);
    rc |= gguf_set_scalar(w, "s.i16", GGUF_T_I16, &i16);
    rc |= gguf_set_scalar(w, "s.u32", GGUF_T_U32, &u32);
    rc |= gguf_set_scalar(w, "s.i32", GGUF_T_I32, &i32);
    rc |= gguf_set_scalar(w, "s.f32", GGUF_T_F32, &f32);
    rc |= gguf_set_scalar(w, "s.bool", GGUF_T_BOOL, &bl);
    rc |= gguf_set_scalar(w, "s.u64", GGUF_T_U64, &u64);
    rc |= gguf_set_scalar(w, "s.i64", GGUF_T_I64, &i64);
    rc |= gguf_set_scalar(w, "s.f64", GGUF_T_F64, &f64);
    rc |= gguf_set_str(w, "s.str", "hello");
    rc |= gguf_set_str(w, "s.empty", "");
    rc |= gguf_set_str(w, "s.truestr", "true");
    rc |= gguf_set_u32(w, "h.u32", 7);
    rc |= gguf_set_i32(w, "h.i32", -7);
    rc |= gguf_set_u64(w, "h.u64", 77);
    rc |= gguf_set_f32(w, "h.f32", 0.25f);
    rc |= gguf_set_bool(w, "h.bool", 0);
    rc |= gguf_set_arr(w, "a.u8", GGUF_T_U8, v_u8, 3);
    rc |= gguf_set_arr(w, "a.i8", GGUF_T_I8, v_i8, 3);
    rc |= gguf_set_arr(w, "a.u16", GGUF_T_U16, v_u16, 3);
    rc |= gguf_set_arr(w, "a.i16", GGUF_T_I16, v_i16, 3);
    rc |= gguf_set_arr(w, "a.u32", GGUF_T_U32, v_u32, 3);
    rc |= gguf_set_arr(w, "a.i32", GGUF_T_I32, v_i32, 3);
    rc |= gguf_set_arr(w, "a.f32", GGUF_T_F32, v_f32, 3);
    rc |= gguf_set_arr(w, "a.bool", GGUF_T_BOOL, v_bool, 3);
    rc |= gguf_set_arr(w, "a.u64", GGUF_T_U64, v_u64, 3);
    rc |= gguf_set_arr(w, "a.i64", GGUF_T_I64, v_i64, 3);
    rc |= gguf_set_arr(w, "a.f64", GGUF_T_F64, v_f64, 3);
    rc |= gguf_set_arr_str(w, "a.str", v_strs, 3);
    rc |= gguf_set_arr(w, "a.empty", GGUF_T_U32, NULL, 0);
    rc |= gguf_set_arr_str(w, "a.emptystr", NULL, 0);
    rc |= gguf_set_u32(w, "dup.a", 1);   /* patched into duplicates later */
    rc |= gguf_set_u32(w, "dup.b", 2);
    for (size_t i = 0; i < N_TENSORS; i++) {
        uint64_t n = spec_bytes(&k_tensors[i]);
        uint8_t *d = malloc(n);
        for (uint64_t j = 0; j < n; j++) d[j] = tensor_byte(i, j);
        rc |= gguf_add_tensor(w, k_tensors[i].name, k_tensors[i].type, k_tensors[i].n_dims,
                              k_tensors[i].ne, d, n);
        free(d);
    }
    return rc;
}

static uint8_t *read_all(const char *path, size_t *size) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *b = malloc(n > 0 ? (size_t)n : 1);
    if (fread(b, 1, (size_t)n, f) != (size_t)n) { free(b); fclose(f); return NULL; }
    fclose(f);
    *size = (size_t)n;
    return b;
}

/* ======================================================================
 * Layout walker: independent minimal parser of a VALID file that records
 * where each field lives, so malformed variants can be built by patching.
 * ==================================================================== */

typedef struct { char key[64]; size_t key_len_off, type_off, value_off; } kv_loc;
typedef struct { char name[64]; size_t name_len_off, n_dims_off, ne_off, type_off, offset_off; } tensor_loc;
typedef struct {
    size_t kv_end, dir_end, data_off;
    size_t n_kv, n_t;
    kv_loc kv[64];
    tensor_loc t[16];
} layout;

static uint64_t ld64(const uint8_t *p) { uint64_t v; memcpy(&v, p, 8); return v; }
static uint32_t ld32(const uint8_t *p) { uint32_t v; memcpy(&v, p, 4); return v; }
static void st64(uint8_t *p, uint64_t v) { memcpy(p, &v, 8); }
static void st32(uint8_t *p, uint32_t v) { memcpy(p, &v, 4); }

static size_t skip_value(const uint8_t *b, size_t pos, uint32_t type) {
    static const size_t sz[] = { 1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8 };
    if (type == GGUF_T_STRING) return pos + 8 + ld64(b + pos);
    if (type == GGUF_T_ARRAY) {
        uint32_t et = ld32(b + pos);
        uint64_t n = ld64(b + pos + 4);
        pos += 12;
        for (uint64_t i = 0; i < n; i++) pos = skip_value(b, pos, et);
        return pos;
    }
    return pos + sz[type];
}

static void walk(const uint8_t *b, size_t size, uint64_t align, layout *L) {
    memset(L, 0, sizeof *L);
    uint64_t n_t = ld64(b + 8), n_kv = ld64(b + 16);
    size_t pos = 24;
    for (uint64_t i = 0; i < n_kv; i++) {
        kv_loc *k = &L->kv[L->n_kv++];
        uint64_t kl = ld64(b + pos);
        k->key_len_off = pos;
        memcpy(k->key, b + pos + 8, kl < 63 ? kl : 63);
        pos += 8 + kl;
        k->type_off = pos;
        k->value_off = pos + 4;
        pos = skip_value(b, pos + 4, ld32(b + pos));
    }
    L->kv_end = pos;
    for (uint64_t i = 0; i < n_t; i++) {
        tensor_loc *t = &L->t[L->n_t++];
        uint64_t nl = ld64(b + pos);
        t->name_len_off = pos;
        memcpy(t->name, b + pos + 8, nl < 63 ? nl : 63);
        pos += 8 + nl;
        t->n_dims_off = pos;
        uint32_t nd = ld32(b + pos);
        t->ne_off = pos + 4;
        pos += 4 + 8 * nd;
        t->type_off = pos;
        t->offset_off = pos + 4;
        pos += 12;
    }
    L->dir_end = pos;
    L->data_off = (pos + align - 1) / align * align;
    (void)size;
}

static const kv_loc *loc_kv(const layout *L, const char *key) {
    for (size_t i = 0; i < L->n_kv; i++) if (!strcmp(L->kv[i].key, key)) return &L->kv[i];
    return NULL;
}
static const tensor_loc *loc_t(const layout *L, const char *name) {
    for (size_t i = 0; i < L->n_t; i++) if (!strcmp(L->t[i].name, name)) return &L->t[i];
    return NULL;
}

/* ======================================================================
 * 1. Round trip
 * ==================================================================== */

static void test_roundtrip(tally *T, const char *dir) {
    char pa[512], pb[512], err[DS_ERRLEN];
    snprintf(pa, sizeof pa, "%s/a.gguf", dir);
    snprintf(pb, sizeof pb, "%s/b.gguf", dir);

    gguf_writer *w = gguf_writer_new();
    int rc = build_fixture(w, 0);
    check(T, rc == 0, "writer accepts fixture", "%s", gguf_writer_error(w));
    rc = gguf_writer_write(w, pa, err, sizeof err);
    check(T, rc == 0, "writer writes fixture", "%s", err);
    gguf_writer_free(w);

    gguf_ctx *g = gguf_open(pa, err, sizeof err);
    check(T, g != NULL, "reader opens fixture", "%s", err);
    if (!g) return;
    check(T, gguf_version(g) == 3 && gguf_alignment(g) == 32 && gguf_n_tensors(g) == N_TENSORS &&
             gguf_data_offset(g) % 32 == 0 && gguf_data_offset(g) <= gguf_file_size(g),
          "header fields", "version %u align %" PRIu64, gguf_version(g), gguf_alignment(g));

    /* scalars: exact type and value */
    const gguf_kv *kv;
    int ok = 1;
#define KV_IS(key, T_, field, val) \
    (kv = gguf_find_kv(g, key), ok &= kv && kv->type == (T_) && kv->v.field == (val))
    KV_IS("s.u8", GGUF_T_U8, u, 200);
    KV_IS("s.i8", GGUF_T_I8, i, -100);
    KV_IS("s.u16", GGUF_T_U16, u, 60000);
    KV_IS("s.i16", GGUF_T_I16, i, -30000);
    KV_IS("s.u32", GGUF_T_U32, u, 4000000000u);
    KV_IS("s.i32", GGUF_T_I32, i, -2000000000);
    KV_IS("s.f32", GGUF_T_F32, f, 3.5);
    KV_IS("s.bool", GGUF_T_BOOL, b, 1);
    KV_IS("s.u64", GGUF_T_U64, u, (1ull << 63) + 5);
    KV_IS("s.i64", GGUF_T_I64, i, -(1ll << 62));
    KV_IS("s.f64", GGUF_T_F64, f, 1e300);
#undef KV_IS
    check(T, ok, "scalar values of every type", "a scalar differs");

    gguf_str s;
    check(T, gguf_get_str(g, "s.str", &s) == 0 && gguf_str_eq(s, "hello"), "string value", "s.str");
    check(T, gguf_get_str(g, "s.empty", &s) == 0 && s.len == 0 && gguf_str_eq(s, ""), "empty string", "s.empty");

    /* getters: width conversion, range checks, absent vs wrong type */
    uint32_t u32; int32_t i32; uint64_t u64; float f; int b;
    check(T, gguf_get_u32(g, "s.u8", &u32) == 0 && u32 == 200, "get_u32 widens u8", "mismatch");
    check(T, gguf_get_u32(g, "s.i8", &u32) == -2, "get_u32 rejects negative", "mismatch");
    check(T, gguf_get_u32(g, "s.u64", &u32) == -2, "get_u32 rejects > 2^32", "mismatch");
    check(T, gguf_get_i32(g, "s.i8", &i32) == 0 && i32 == -100, "get_i32 widens i8", "mismatch");
    check(T, gguf_get_i32(g, "s.u32", &i32) == -2, "get_i32 rejects 4e9", "mismatch");
    check(T, gguf_get_i32(g, "s.i64", &i32) == -2, "get_i32 rejects -2^62", "mismatch");
    check(T, gguf_get_u64(g, "s.u64", &u64) == 0 && u64 == (1ull << 63) + 5, "get_u64", "mismatch");
    check(T, gguf_get_u32(g, "h.u32", &u32) == 0 && u32 == 7 && gguf_get_i32(g, "h.i32", &i32) == 0 &&
             i32 == -7 && gguf_get_u64(g, "h.u64", &u64) == 0 && u64 == 77, "helper setters", "mismatch");
    check(T, gguf_get_f32(g, "s.f64", &f) == 0 && isinf(f), "get_f32 narrows f64 (1e300 -> inf)", "mismatch");
    check(T, gguf_get_f32(g, "h.f32", &f) == 0 && f == 0.25f, "get_f32", "mismatch");
    check(T, gguf_get_f32(g, "s.str", &f) == -2, "get_f32 rejects string", "mismatch");
    check(T, gguf_get_bool(g, "s.bool", &b) == 0 && b == 1 && gguf_get_bool(g, "h.bool", &b) == 0 && b == 0,
          "get_bool", "mismatch");
    check(T, gguf_get_bool(g, "s.truestr", &b) == 0 && b == 1, "get_bool accepts \"true\"", "mismatch");
    check(T, gguf_get_bool(g, "s.str", &b) == -2, "get_bool rejects \"hello\"", "mismatch");
    check(T, gguf_get_u32(g, "no.such", &u32) == -1 && gguf_find_kv(g, "no.such") == NULL, "absent key -> -1", "mismatch");
    check(T, gguf_get_str(g, "s.u8", &s) == -2, "get_str wrong type -> -2", "mismatch");

    /* arrays of every element type */
    int64_t iv; float fv;
    ok = 1;
    for (int i = 0; i < 3; i++) {
        ok &= gguf_arr_i64(gguf_find_kv(g, "a.u8"), i, &iv) == 0 && iv == v_u8[i];
        ok &= gguf_arr_i64(gguf_find_kv(g, "a.i8"), i, &iv) == 0 && iv == v_i8[i];
        ok &= gguf_arr_i64(gguf_find_kv(g, "a.u16"), i, &iv) == 0 && iv == v_u16[i];
        ok &= gguf_arr_i64(gguf_find_kv(g, "a.i16"), i, &iv) == 0 && iv == v_i16[i];
        ok &= gguf_arr_i64(gguf_find_kv(g, "a.u32"), i, &iv) == 0 && iv == v_u32[i];
        ok &= gguf_arr_i64(gguf_find_kv(g, "a.i32"), i, &iv) == 0 && iv == v_i32[i];
        ok &= gguf_arr_i64(gguf_find_kv(g, "a.i64"), i, &iv) == 0 && iv == v_i64[i];
        ok &= gguf_arr_f32(gguf_find_kv(g, "a.f32"), i, &fv) == 0 &&
              memcmp(&fv, &v_f32[i], 4) == 0;
        ok &= gguf_arr_f32(gguf_find_kv(g, "a.f64"), i, &fv) == 0 && fv == (float)v_f64[i] ;
        ok &= gguf_arr_str(gguf_find_kv(g, "a.str"), i, &s) == 0 && gguf_str_eq(s, v_strs[i]);
    }
    kv = gguf_find_kv(g, "a.bool");
    ok &= kv && kv->arr_type == GGUF_T_BOOL && kv->arr_n == 3 && memcmp(kv->arr_data, v_bool, 3) == 0;
    kv = gguf_find_kv(g, "a.u64");
    ok &= kv && kv->arr_type == GGUF_T_U64 && memcmp(kv->arr_data, v_u64, sizeof v_u64) == 0;
    check(T, ok, "arrays of every element type", "an element differs");
    check(T, gguf_arr_i64(gguf_find_kv(g, "a.u64"), 1, &iv) == -1, "arr_i64 rejects u64 > INT64_MAX", "mismatch");
    check(T, gguf_arr_i64(gguf_find_kv(g, "a.u8"), 3, &iv) == -1 && gguf_arr_str(gguf_find_kv(g, "a.u8"), 0, &s) == -1 &&
             gguf_arr_f32(gguf_find_kv(g, "a.i32"), 0, &fv) == -1, "array accessors bounds/type checked", "mismatch");
    kv = gguf_find_kv(g, "a.empty");
    check(T, kv && kv->type == GGUF_T_ARRAY && kv->arr_type == GGUF_T_U32 && kv->arr_n == 0, "empty array", "mismatch");
    kv = gguf_find_kv(g, "a.emptystr");
    check(T, kv && kv->arr_type == GGUF_T_STRING && kv->arr_n == 0 && gguf_arr_str(kv, 0, &s) == -1,
          "empty string array", "mismatch");

    /* tensors: shape, type, bytes, alignment */
    ok = 1;
    for (size_t i = 0; i < N_TENSORS; i++) {
        const gguf_tensor *t = gguf_find_tensor(g, k_tensors[i].name);
        uint64_t n = spec_bytes(&k_tensors[i]);
        uint8_t *want = malloc(n);
        for (uint64_t j = 0; j < n; j++) want[j] = tensor_byte(i, j);
        ok &= t && t == gguf_tensor_at(g, i) && t->type == k_tensors[i].type &&
              t->n_dims == k_tensors[i].n_dims && !memcmp(t->ne, k_tensors[i].ne, sizeof t->ne) &&
              t->nbytes == n && t->offset % 32 == 0 && memcmp(t->data, want, n) == 0;
        free(want);
    }
    check(T, ok, "tensors F32/F16/BF16/Q8_0, 1..4 dims", "a tensor differs");
    check(T, gguf_tensor_nelements(gguf_find_tensor(g, "t.q8a")) == 64 * 2 * 3, "tensor nelements", "mismatch");
    check(T, gguf_find_tensor(g, "t.none") == NULL && gguf_tensor_at(g, N_TENSORS) == NULL &&
             gguf_kv_at(g, gguf_n_kv(g)) == NULL, "absent tensor / out of range index -> NULL", "mismatch");

    /* copy through the writer: identical bytes */
    w = gguf_writer_new();
    rc = gguf_copy_kv(w, g, NULL);
    for (uint64_t i = 0; i < gguf_n_tensors(g); i++) {
        const gguf_tensor *t = gguf_tensor_at(g, i);
        rc |= gguf_add_tensor(w, t->name, t->type, t->n_dims, t->ne, t->data, t->nbytes);
    }
    rc |= gguf_writer_write(w, pb, err, sizeof err);
    gguf_writer_free(w);
    size_t na = 0, nb = 0;
    uint8_t *ba = read_all(pa, &na), *bb = read_all(pb, &nb);
    check(T, rc == 0 && ba && bb && na == nb && memcmp(ba, bb, na) == 0,
          "write -> read -> copy -> write is byte identical", "rc %d sizes %zu %zu %s", rc, na, nb, err);
    free(bb);

    /* skip prefixes */
    w = gguf_writer_new();
    const char *const skip[] = { "a.", "s.", NULL };
    rc = gguf_copy_kv(w, g, skip);
    rc |= gguf_writer_write(w, pb, err, sizeof err);
    gguf_writer_free(w);
    gguf_ctx *g2 = gguf_open(pb, err, sizeof err);
    check(T, rc == 0 && g2 && gguf_n_kv(g2) == 7 && !gguf_find_kv(g2, "a.u8") && gguf_find_kv(g2, "h.u32"),
          "copy_kv honours skip prefixes", "%s", err);
    gguf_close(g2);

    /* open_mem over the same bytes agrees with open */
    g2 = gguf_open_mem(ba, na, err, sizeof err);
    check(T, g2 && gguf_n_kv(g2) == gguf_n_kv(g) &&
             (const uint8_t *)gguf_tensor_at(g2, 0)->data == ba + gguf_data_offset(g2),
          "open_mem matches open", "%s", err);
    gguf_close(g2);
    free(ba);
    gguf_close(g);

    /* non-default alignment */
    w = gguf_writer_new();
    rc = build_fixture(w, 256) | gguf_writer_write(w, pb, err, sizeof err);
    gguf_writer_free(w);
    g = gguf_open(pb, err, sizeof err);
    ok = rc == 0 && g && gguf_alignment(g) == 256 && gguf_data_offset(g) % 256 == 0;
    for (uint64_t i = 0; ok && i < gguf_n_tensors(g); i++) ok = gguf_tensor_at(g, i)->offset % 256 == 0;
    check(T, ok, "general.alignment 256 honoured", "%s", err);
    gguf_close(g);
}

/* ======================================================================
 * Writer errors
 * ==================================================================== */

static void test_writer_errors(tally *T, const char *dir) {
    char path[512], err[DS_ERRLEN];
    snprintf(path, sizeof path, "%s/w.gguf", dir);
    float data[64] = { 0 };
    uint64_t ne1[1] = { 4 }, ne33[1] = { 33 };

    gguf_writer *w = gguf_writer_new();
    check(T, gguf_set_u32(w, "k", 1) == 0 && gguf_set_str(w, "k", "x") == -1 &&
             strstr(gguf_writer_error(w), "duplicate key"), "writer rejects duplicate key", "%s", gguf_writer_error(w));
    int rc = gguf_writer_write(w, path, err, sizeof err);
    check(T, rc == -1 && strstr(err, "earlier call failed") && access(path, F_OK) != 0,
          "writer error is sticky, no file written", "%s", err);
    gguf_writer_free(w);

    w = gguf_writer_new();
    check(T, gguf_add_tensor(w, "t", DS_TYPE_F32, 1, ne1, data, 16) == 0 &&
             gguf_add_tensor(w, "t", DS_TYPE_F32, 1, ne1, data, 16) == -1 &&
             strstr(gguf_writer_error(w), "duplicate tensor"), "writer rejects duplicate tensor", "%s", gguf_writer_error(w));
    gguf_writer_free(w);

    static const struct { const char *name, *kw; } cases[] = {
        { "writer rejects alignment 48", "power of two" },
        { "writer rejects non-u32 alignment", "must be u32" },
        { "writer rejects wrong nbytes", "nbytes" },
        { "writer rejects Q8_0 ne[0]=33", "multiple" },
        { "writer rejects type Q2_K", "unsupported" },
        { "writer rejects nested array", "arrays of arrays" },
        { "writer rejects string array via set_arr", "gguf_set_arr_str" },
    };
    for (int i = 0; i < (int)(sizeof cases / sizeof cases[0]); i++) {
        w = gguf_writer_new();
        switch (i) {
        case 0: rc = gguf_set_u32(w, "general.alignment", 48); break;
        case 1: rc = gguf_set_u64(w, "general.alignment", 64); break;
        case 2: rc = gguf_add_tensor(w, "x", DS_TYPE_F32, 1, ne1, data, 12); break;
        case 3: rc = gguf_add_tensor(w, "y", DS_TYPE_Q8_0, 1, ne33, data, 34); break;
        case 4: rc = gguf_add_tensor(w, "z", 10, 1, ne1, data, 16); break;     /* Q2_K: not supported */
        case 5: rc = gguf_set_arr(w, "n", GGUF_T_ARRAY, data, 1); break;
        default: rc = gguf_set_arr(w, "n", GGUF_T_STRING, data, 1); break;
        }
        const char *e = gguf_writer_error(w);
        check(T, rc == -1 && strstr(e, cases[i].kw) && !strchr(e, '\n'), cases[i].name, "%s", e);
        gguf_writer_free(w);
    }

    snprintf(path, sizeof path, "%s/no/such/dir/x.gguf", dir);
    w = gguf_writer_new();
    rc = gguf_writer_write(w, path, err, sizeof err);
    check(T, rc == -1 && strstr(err, "gguf writer") && !strchr(err, '\n'), "writer reports unwritable path", "%s", err);
    gguf_writer_free(w);
}

/* ======================================================================
 * 2. Malformed files
 * ==================================================================== */

/* Expect failure with a one-line error containing kw (NULL: any). */
static int expect_fail(const uint8_t *src, size_t n, const char *kw, char *err, size_t errlen) {
    uint8_t *copy = malloc(n ? n : 1);   /* exact-size copy so ASan sees over-reads */
    memcpy(copy, src, n);
    err[0] = '\0';
    gguf_ctx *g = gguf_open_mem(copy, n, err, errlen);
    int ok = g == NULL && err[0] && !strchr(err, '\n') && (!kw || strstr(err, kw));
    if (g) snprintf(err, errlen, "(opened successfully)");
    gguf_close(g);
    free(copy);
    return ok;
}

static void test_truncations(tally *T, const uint8_t *buf, size_t size, const layout *L) {
    struct { const char *name; size_t lo, hi; } sec[] = {
        { "truncate in header", 0, 24 },
        { "truncate in kv section", 24, L->kv_end },
        { "truncate in tensor directory", L->kv_end, L->dir_end },
        { "truncate in padding", L->dir_end, L->data_off },
        { "truncate in data section", L->data_off, size },
    };
    char err[DS_ERRLEN], name[128];
    for (size_t s = 0; s < sizeof sec / sizeof sec[0]; s++) {
        size_t bad = SIZE_MAX;
        char first[DS_ERRLEN] = "";
        for (size_t n = sec[s].lo; n < sec[s].hi; n++) {
            if (!expect_fail(buf, n, "truncated", err, sizeof err) && bad == SIZE_MAX) {
                bad = n;
                snprintf(first, sizeof first, "%s", err);
            }
        }
        snprintf(name, sizeof name, "%s (%zu offsets)", sec[s].name, sec[s].hi - sec[s].lo);
        check(T, bad == SIZE_MAX && sec[s].hi > sec[s].lo, name, "at length %zu: %s", bad, first);
    }
    expect_fail(buf, L->kv_end + 3, NULL, err, sizeof err);
    printf("     sample: %s\n", err);
}

typedef struct {
    const char *name, *kw;
    size_t off;
    int width;        /* 4 or 8; 1 = byte */
    uint64_t value;
} patch;

/* GGUF version 2 is version 3's little-endian layout: the same file with
 * version 2 in its header opens with every key and tensor in place. */
static void test_version2(tally *T, const uint8_t *buf, size_t size) {
    char err[DS_ERRLEN] = "";
    uint8_t *m = malloc(size);
    memcpy(m, buf, size);
    st32(m + 4, 2);
    gguf_ctx *g2 = gguf_open_mem(m, size, err, sizeof err);
    gguf_ctx *g3 = gguf_open_mem(buf, size, err, sizeof err);
    int ok = g2 && g3 && gguf_version(g2) == 2 && gguf_n_tensors(g2) == gguf_n_tensors(g3) &&
             gguf_n_kv(g2) == gguf_n_kv(g3);
    for (uint64_t i = 0; ok && i < gguf_n_tensors(g3); i++) {
        const gguf_tensor *a = gguf_tensor_at(g2, i), *b = gguf_tensor_at(g3, i);
        ok = a->nbytes == b->nbytes && a->offset == b->offset && !memcmp(a->data, b->data, a->nbytes);
    }
    check(T, ok, "GGUF version 2 opens as version 3", "%s", g2 ? "contents differ" : err);
    gguf_close(g2);
    gguf_close(g3);
    free(m);
}

static void test_patches(tally *T, const uint8_t *buf, size_t size, const layout *L) {
    const kv_loc *str = loc_kv(L, "s.str"), *arr = loc_kv(L, "a.u32"), *sarr = loc_kv(L, "a.str");
    const kv_loc *bl = loc_kv(L, "s.bool"), *dupb = loc_kv(L, "dup.b");
    const tensor_loc *tf = loc_t(L, "t.f32"), *th = loc_t(L, "t.f16"), *tq = loc_t(L, "t.q8b");
    if (!str || !arr || !sarr || !bl || !dupb || !tf || !th || !tq) {
        check(T, 0, "layout walker", "fixture field missing");
        return;
    }
    uint64_t tf_off = ld64(buf + tf->offset_off);
    const patch P[] = {
        { "bad magic", "magic", 0, 1, 'X' },
        { "bad version 1", "version 1", 4, 4, 1 },
        { "bad version 4", "version 4", 4, 4, 4 },
        { "big-endian version 2", "big-endian", 4, 4, 0x02000000u },
        { "big-endian version", "big-endian", 4, 4, 0x03000000u },
        { "absurd n_tensors 2^60", "n_tensors", 8, 8, 1ull << 60 },
        { "absurd n_tensors 2^64-1", "n_tensors", 8, 8, UINT64_MAX },
        { "absurd n_kv 2^60", "n_kv", 16, 8, 1ull << 60 },
        { "absurd n_kv 2^64-1", "n_kv", 16, 8, UINT64_MAX },
        { "absurd key length", "key", L->kv[0].key_len_off, 8, 1ull << 60 },
        { "absurd string value length", "string value", str->value_off, 8, 1ull << 60 },
        { "string length 2^64-1", "string value", str->value_off, 8, UINT64_MAX },
        { "absurd array count", "array of", arr->value_off + 4, 8, 1ull << 60 },
        { "array count overflows", "array of", arr->value_off + 4, 8, UINT64_MAX / 2 },
        { "absurd string array count", "strings", sarr->value_off + 4, 8, 1ull << 61 },
        { "absurd array string length", "array string", sarr->value_off + 12, 8, 1ull << 60 },
        { "unknown value type", "unknown value type 13", str->type_off, 4, 13 },
        { "unknown array element type", "unknown array element type", arr->value_off, 4, 99 },
        { "arrays of arrays", "arrays of arrays", arr->value_off, 4, GGUF_T_ARRAY },
        { "bool value 2", "bool", bl->value_off, 1, 2 },
        { "key with NUL byte", "NUL", dupb->key_len_off + 8, 1, 0 },
        { "duplicate key", "duplicate key 'dup.a'", dupb->key_len_off + 8 + 4, 1, 'a' },
        { "empty key", "empty key", dupb->key_len_off, 8, 0 },
        { "absurd tensor name length", "name length", tf->name_len_off, 8, 1ull << 60 },
        { "tensor name length 300", "exceeds 255", tf->name_len_off, 8, 300 },
        { "duplicate tensor name", "duplicate tensor name", tq->name_len_off + 8 + 4, 1, 'a' },
        { "n_dims 5", "n_dims 5", tf->n_dims_off, 4, 5 },
        { "n_dims 0", "n_dims 0", tf->n_dims_off, 4, 0 },
        { "n_dims 2^32-1", "n_dims", tf->n_dims_off, 4, UINT32_MAX },
        { "zero dim", "is zero", th->ne_off + 8, 8, 0 },
        { "ne[0] = 2^63 (int64 overflow)", "overflow", tf->ne_off, 8, 1ull << 63 },
        { "ne[0] = 2^62 F32 row overflows", "overflow", tf->ne_off, 8, 1ull << 62 },
        { "ne product overflows", "overflow", th->ne_off + 8, 8, (1ull << 63) - 1 },
        { "Q8_0 ne[0] not a block multiple", "multiple", tq->ne_off, 8, 33 },
        { "tensor type Q2_K", "unsupported tensor type 10 (Q2_K)", tf->type_off, 4, 10 },
        { "tensor type 1000", "unsupported", tf->type_off, 4, 1000 },
        { "misaligned tensor offset", "not aligned", tf->offset_off, 8, tf_off + 4 },
        { "tensor offset past EOF", "truncated in data section", tf->offset_off, 8, 1ull << 40 },
        { "tensor offset overflows", "overflow", tf->offset_off, 8, UINT64_MAX - 31 },
    };
    char err[DS_ERRLEN], name[160];
    uint8_t *m = malloc(size);
    for (size_t i = 0; i < sizeof P / sizeof P[0]; i++) {
        memcpy(m, buf, size);
        if (P[i].width == 1) m[P[i].off] = (uint8_t)P[i].value;
        else if (P[i].width == 4) st32(m + P[i].off, (uint32_t)P[i].value);
        else st64(m + P[i].off, P[i].value);
        int ok = expect_fail(m, size, P[i].kw, err, sizeof err);
        snprintf(name, sizeof name, "malformed: %s", P[i].name);
        check(T, ok, name, "want '%s', got: %s", P[i].kw, err);
        if (ok) printf("     -> %s\n", err);   /* the message a user would see */
    }
    free(m);
}

/* general.alignment problems need a fixture that carries the key. */
static void test_alignment_patches(tally *T, const char *dir) {
    char path[512], err[DS_ERRLEN];
    snprintf(path, sizeof path, "%s/align.gguf", dir);
    gguf_writer *w = gguf_writer_new();
    int rc = build_fixture(w, 64) | gguf_writer_write(w, path, err, sizeof err);
    gguf_writer_free(w);
    size_t size = 0;
    uint8_t *buf = read_all(path, &size);
    if (rc || !buf) { check(T, 0, "alignment fixture", "%s", err); free(buf); return; }
    layout L;
    walk(buf, size, 64, &L);
    const kv_loc *a = loc_kv(&L, "general.alignment");
    struct { const char *name, *kw; size_t off; uint32_t v; } P[] = {
        { "alignment 48", "power of two", a->value_off, 48 },
        { "alignment 0", "power of two", a->value_off, 0 },
        { "alignment as i32", "must be u32", a->type_off, GGUF_T_I32 },
    };
    for (size_t i = 0; i < 3; i++) {
        uint8_t *m = malloc(size);
        memcpy(m, buf, size);
        st32(m + P[i].off, P[i].v);
        char name[128];
        snprintf(name, sizeof name, "malformed: %s", P[i].name);
        int ok = expect_fail(m, size, P[i].kw, err, sizeof err);
        check(T, ok, name, "got: %s", err);
        free(m);
    }
    /* a valid 64-aligned file truncated anywhere still fails */
    size_t bad = SIZE_MAX;
    for (size_t n = 0; n < size && bad == SIZE_MAX; n++)
        if (!expect_fail(buf, n, "truncated", err, sizeof err)) bad = n;
    check(T, bad == SIZE_MAX, "alignment-64 file: every truncation fails", "length %zu: %s", bad, err);
    free(buf);
}

static void test_open_errors(tally *T, const char *dir) {
    char path[512], err[DS_ERRLEN];
    snprintf(path, sizeof path, "%s/missing.gguf", dir);
    gguf_ctx *g = gguf_open(path, err, sizeof err);
    check(T, !g && strstr(err, "cannot open"), "open missing file", "%s", err);
    g = gguf_open(dir, err, sizeof err);
    check(T, !g && strstr(err, "not a regular file"), "open a directory", "%s", err);
    snprintf(path, sizeof path, "%s/empty.gguf", dir);
    FILE *f = fopen(path, "wb");
    if (f) fclose(f);
    g = gguf_open(path, err, sizeof err);
    check(T, !g && strstr(err, "truncated in header"), "open empty file", "%s", err);
    g = gguf_open_mem(NULL, 0, err, sizeof err);
    check(T, !g && strstr(err, "truncated"), "open_mem empty buffer", "%s", err);
}

/* ======================================================================
 * 3. Mutation fuzz
 * ==================================================================== */

static uint64_t rng_next(uint64_t *s) {   /* xorshift64*: deterministic */
    *s ^= *s >> 12; *s ^= *s << 25; *s ^= *s >> 27;
    return *s * 2685821657736338717ull;
}

static void test_fuzz(tally *T, const uint8_t *buf, size_t size, const layout *L, int iters) {
    static const uint64_t interesting[] = {
        0, 1, 2, 3, 4, 5, 8, 13, 31, 32, 33, 255, 256, 0x7fffffff, 0x80000000u, 0xffffffffu,
        1ull << 32, 1ull << 60, 1ull << 62, 1ull << 63, (1ull << 63) - 1, UINT64_MAX, UINT64_MAX - 31,
    };
    uint64_t seed = 0x9e3779b97f4a7c15ull;
    int opened = 0, bad = 0, max_len = 0;
    char err[DS_ERRLEN], why[DS_ERRLEN] = "";
    uint8_t *m = malloc(size);
    for (int it = 0; it < iters; it++) {
        memcpy(m, buf, size);
        size_t n = size;
        int nmut = 1 + (int)(rng_next(&seed) % 3);
        for (int k = 0; k < nmut; k++) {
            /* Mutations land in the metadata most of the time: that is
             * where the parser's decisions are. */
            size_t span = rng_next(&seed) % 5 ? L->data_off : n;
            size_t off = (size_t)(rng_next(&seed) % (span ? span : 1));
            switch (rng_next(&seed) % 4) {
            case 0: m[off] ^= (uint8_t)(1u << (rng_next(&seed) % 8)); break;
            case 1: m[off] = (uint8_t)rng_next(&seed); break;
            case 2: if (off + 8 <= n) st64(m + off, interesting[rng_next(&seed) % (sizeof interesting / 8)]); break;
            case 3: if (off + 4 <= n) st32(m + off, (uint32_t)interesting[rng_next(&seed) % (sizeof interesting / 8)]); break;
            }
        }
        if (rng_next(&seed) % 8 == 0) n = (size_t)(rng_next(&seed) % (n + 1));
        uint8_t *copy = malloc(n ? n : 1);   /* exact size: ASan catches over-reads */
        memcpy(copy, m, n);
        err[0] = '\0';
        gguf_ctx *g = gguf_open_mem(copy, n, err, sizeof err);
        if (!g) {
            if (!err[0] || strchr(err, '\n')) { bad++; snprintf(why, sizeof why, "iter %d: bad error '%.200s'", it, err); }
            if ((int)strlen(err) > max_len) max_len = (int)strlen(err);
        } else {
            opened++;
            for (uint64_t i = 0; i < gguf_n_tensors(g); i++) {
                const gguf_tensor *t = gguf_tensor_at(g, i);
                const uint8_t *d = t->data;
                if (d < copy || d > copy + n || t->nbytes > (uint64_t)(copy + n - d)) {
                    bad++;
                    snprintf(why, sizeof why, "iter %d: tensor %" PRIu64 " outside buffer", it, i);
                }
            }
            /* touch every value through the accessors */
            for (uint64_t i = 0; i < gguf_n_kv(g); i++) {
                const gguf_kv *kv = gguf_kv_at(g, i);
                gguf_str s; int64_t iv; float fv;
                uint64_t lim = kv->arr_n < 64 ? kv->arr_n : 64;
                for (uint64_t j = 0; j < lim; j++) {
                    if (gguf_arr_str(kv, j, &s) == 0 && s.len && (s.ptr < (const char *)copy ||
                                                                  s.ptr + s.len > (const char *)copy + n)) bad++;
                    gguf_arr_i64(kv, j, &iv);
                    gguf_arr_f32(kv, j, &fv);
                }
            }
        }
        gguf_close(g);
        free(copy);
    }
    free(m);
    char name[128];
    snprintf(name, sizeof name, "fuzz %d mutations (%d opened, longest error %d chars)", iters, opened, max_len);
    check(T, bad == 0, name, "%d problems; %s", bad, why);
}

/* ======================================================================
 * main
 * ==================================================================== */

static void remove_dir(const char *dir) {
    static const char *const files[] = { "a.gguf", "b.gguf", "w.gguf", "align.gguf", "empty.gguf" };
    char path[512];
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        snprintf(path, sizeof path, "%s/%s", dir, files[i]);
        unlink(path);
    }
    rmdir(dir);
}

int main(int argc, char **argv) {
    tally T = { 0, 0 };
    char dir[] = "/tmp/test_gguf.XXXXXX";
    if (!mkdtemp(dir)) { printf("FAIL mkdtemp\n"); return 1; }
    int iters = argc > 1 ? atoi(argv[1]) : 20000;

    test_roundtrip(&T, dir);
    test_writer_errors(&T, dir);
    test_open_errors(&T, dir);

    char pa[512];
    snprintf(pa, sizeof pa, "%s/a.gguf", dir);
    size_t size = 0;
    uint8_t *buf = read_all(pa, &size);
    if (buf) {
        layout L;
        walk(buf, size, 32, &L);
        test_truncations(&T, buf, size, &L);
        test_patches(&T, buf, size, &L);
        test_version2(&T, buf, size);
        test_alignment_patches(&T, dir);
        test_fuzz(&T, buf, size, &L, iters);
        free(buf);
    } else {
        check(&T, 0, "fixture readable", "cannot read %s", pa);
    }
    {   /* I32 is a hash layer's table only: the writer takes it for that name
         * and refuses it for a weight's (the reader applies the same rule) */
        gguf_writer *w = gguf_writer_new();
        const uint64_t ne[2] = {2, 3};
        const int32_t tab[6] = {0, 1, 1, 2, 2, 0};
        const int ok_table = gguf_add_tensor(w, "blk.0.ffn_gate_tid2eid.weight", DS_TYPE_I32, 2, ne, tab, sizeof tab) == 0;
        gguf_writer_free(w);
        w = gguf_writer_new();
        const int no_weight = gguf_add_tensor(w, "blk.0.attn_q.weight", DS_TYPE_I32, 2, ne, tab, sizeof tab) != 0;
        gguf_writer_free(w);
        check(&T, ok_table && no_weight, "i32_table_only", "I32: the table %s, a weight %s", ok_table ? "taken" : "REFUSED",
              no_weight ? "refused" : "TAKEN");
    }
    remove_dir(dir);
    printf("%d passed, %d failed\n", T.pass, T.fail);
    return T.fail ? 1 : 0;
}
