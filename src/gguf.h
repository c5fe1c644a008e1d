/* gguf.h — GGUF v3 reader (mmap, every offset bounds-checked) and writer.
 *
 * Conventions are llama.cpp's: little-endian, header "GGUF" u32 version=3 (2 read too),
 * u64 n_tensors, u64 n_kv, then the key/value section, the tensor directory,
 * padding to general.alignment (default 32) and the data section. Tensor
 * offsets are relative to the data section and must be aligned.
 *
 * The reader never trusts the file: every count, length, offset and size is
 * checked against the file size with overflow-safe arithmetic before use, and
 * any problem becomes one error line naming the section and the value. */
#ifndef DSPARK_GGUF_H
#define DSPARK_GGUF_H

#include "common.h"

typedef enum {
    GGUF_T_U8 = 0, GGUF_T_I8 = 1, GGUF_T_U16 = 2, GGUF_T_I16 = 3,
    GGUF_T_U32 = 4, GGUF_T_I32 = 5, GGUF_T_F32 = 6, GGUF_T_BOOL = 7,
    GGUF_T_STRING = 8, GGUF_T_ARRAY = 9, GGUF_T_U64 = 10, GGUF_T_I64 = 11,
    GGUF_T_F64 = 12, GGUF_T_COUNT
} gguf_vtype;

#define GGUF_MAX_DIMS 4
#define GGUF_DEFAULT_ALIGNMENT 32

typedef struct {
    const char *ptr;   /* NOT NUL-terminated in the file; use len */
    uint64_t len;
} gguf_str;

typedef struct {
    gguf_str  key;
    gguf_vtype type;
    /* scalar payload (for non-array, non-string types), widened */
    union { uint64_t u; int64_t i; double f; int b; } v;
    gguf_str  str;          /* type == STRING                                  */
    gguf_vtype arr_type;    /* type == ARRAY: element type                     */
    uint64_t  arr_n;        /* type == ARRAY: number of elements               */
    const uint8_t *arr_data;/* type == ARRAY of fixed-size elements: raw LE data
                               in the mapping; for string arrays use
                               gguf_arr_str()                                  */
} gguf_kv;

typedef struct {
    char      name[256];    /* NUL-terminated copy (names longer are rejected) */
    uint32_t  n_dims;
    uint64_t  ne[GGUF_MAX_DIMS]; /* ggml order: ne[0] = innermost (row length) */
    uint32_t  type;         /* ds_type                                          */
    uint64_t  offset;       /* relative to the data section                     */
    uint64_t  nbytes;       /* computed from type and ne                        */
    const void *data;       /* pointer into the mapping                         */
} gguf_tensor;

typedef struct gguf_ctx gguf_ctx;

/* Open and validate a file. NULL on error, with one line in err. */
gguf_ctx *gguf_open(const char *path, char *err, size_t errlen);
/* Same, over a caller-owned memory buffer (used by the fuzzer). */
gguf_ctx *gguf_open_mem(const void *buf, size_t size, char *err, size_t errlen);
void gguf_close(gguf_ctx *g);

uint32_t gguf_version(const gguf_ctx *g);
uint64_t gguf_alignment(const gguf_ctx *g);
uint64_t gguf_data_offset(const gguf_ctx *g);   /* absolute file offset of the data section */
uint64_t gguf_file_size(const gguf_ctx *g);

uint64_t gguf_n_kv(const gguf_ctx *g);
const gguf_kv *gguf_kv_at(const gguf_ctx *g, uint64_t i);
const gguf_kv *gguf_find_kv(const gguf_ctx *g, const char *key); /* NULL if absent */

/* Typed getters: 0 on success, -1 if absent, -2 if present with an
 * incompatible type (integers convert between widths when the value fits). */
int gguf_get_u32(const gguf_ctx *g, const char *key, uint32_t *out);
int gguf_get_i32(const gguf_ctx *g, const char *key, int32_t *out);
int gguf_get_f32(const gguf_ctx *g, const char *key, float *out);    /* F32, F64 (narrowed) or any integer */
int gguf_get_bool(const gguf_ctx *g, const char *key, int *out);   /* also accepts string "true"/"false" */
int gguf_get_str(const gguf_ctx *g, const char *key, gguf_str *out);
/* Added: any non-negative integer value (all integer widths). */
int gguf_get_u64(const gguf_ctx *g, const char *key, uint64_t *out);
/* Added: "u8", "string", ...; "unknown" for out-of-range ids. */
const char *gguf_vtype_name(uint32_t t);
/* Array element access (bounds-checked; returns -1 if out of range or wrong type). */
int gguf_arr_str(const gguf_kv *kv, uint64_t i, gguf_str *out);
int gguf_arr_i64(const gguf_kv *kv, uint64_t i, int64_t *out);     /* any integer element type */
int gguf_arr_f32(const gguf_kv *kv, uint64_t i, float *out);       /* F32 or F64 elements      */

uint64_t gguf_n_tensors(const gguf_ctx *g);
const gguf_tensor *gguf_tensor_at(const gguf_ctx *g, uint64_t i);
const gguf_tensor *gguf_find_tensor(const gguf_ctx *g, const char *name); /* NULL if absent */
uint64_t gguf_tensor_nelements(const gguf_tensor *t);

/* 1 if s equals the NUL-terminated c string */
int gguf_str_eq(gguf_str s, const char *c);

/* ---- writer -------------------------------------------------------------
 * Collects key/values and tensors in insertion order, then writes the whole
 * file at once. Tensor data is copied at add time, so callers may free their
 * buffers. Keys must be unique, tensor names too (duplicate = error). */
typedef struct gguf_writer gguf_writer;

gguf_writer *gguf_writer_new(void);
void gguf_writer_free(gguf_writer *w);
int gguf_set_u32(gguf_writer *w, const char *key, uint32_t v);
int gguf_set_i32(gguf_writer *w, const char *key, int32_t v);
int gguf_set_u64(gguf_writer *w, const char *key, uint64_t v);
int gguf_set_f32(gguf_writer *w, const char *key, float v);
int gguf_set_bool(gguf_writer *w, const char *key, int v);
int gguf_set_str(gguf_writer *w, const char *key, const char *v);
/* generic scalar / array setters for every GGUF type (used by tests and convert).
 * gguf_set_scalar: v points to the type's C value (uint8_t .. double; BOOL is
 * one uint8_t), or for STRING v is the NUL-terminated string itself.
 * gguf_set_arr: elem_type is a fixed-size type (not STRING/ARRAY); data holds
 * n host (little-endian) elements, BOOL elements must be 0 or 1. */
int gguf_set_scalar(gguf_writer *w, const char *key, gguf_vtype type, const void *v);
int gguf_set_arr(gguf_writer *w, const char *key, gguf_vtype elem_type, const void *data, uint64_t n);
int gguf_set_arr_str(gguf_writer *w, const char *key, const char *const *strs, uint64_t n);
/* Copy every key/value of another file except those whose key starts with
 * any of the NULL-terminated skip prefixes (used to copy a tokenizer).
 * tokenizer.ggml.pre = "gpt2" (what older dspark files hold) is written as
 * llama.cpp's name "gpt-2"; both mean the same pre-tokenizer to dspark. */
int gguf_copy_kv(gguf_writer *w, const gguf_ctx *src, const char *const *skip_prefixes);
/* llama.cpp's LLAMA_FTYPE code for a file whose weights are mostly of ds
 * type t (F32 0, F16 1, Q4_0 2, Q4_1 3, Q8_0 7, Q5_0 8, Q5_1 9, Q4_K 14
 * (Q4_K_S), Q5_K 16 (Q5_K_S), Q6_K 18, BF16 32). general.file_type is
 * written with these codes; readers accept any value (older dspark files
 * hold the ggml tensor type there, e.g. 8 for Q8_0 — it is informational). */
uint32_t gguf_llama_ftype(uint32_t t);
#define GGUF_LLAMA_FTYPE_Q4_K_M 15
#define GGUF_LLAMA_FTYPE_Q5_K_M 17
#define GGUF_QUANTIZATION_VERSION 2   /* general.quantization_version (ggml's GGML_QNT_VERSION) */
/* Added: a string value with explicit length (may contain NUL bytes). */
int gguf_set_str_n(gguf_writer *w, const char *key, const char *v, uint64_t len);
/* Added: copy one key/value, byte-exact, from an OPEN reader (kv must come
 * from gguf_kv_at/gguf_find_kv of a live gguf_ctx). */
int gguf_set_kv(gguf_writer *w, const gguf_kv *kv);
/* ne in ggml order. data must hold exactly the bytes for (type, ne). */
int gguf_add_tensor(gguf_writer *w, const char *name, uint32_t type, uint32_t n_dims,
                    const uint64_t *ne, const void *data, uint64_t nbytes);
int gguf_writer_write(gguf_writer *w, const char *path, char *err, size_t errlen);
/* The same body into an open stream (flushed; not closed): for callers that
 * manage the output themselves (convert validates before renaming). */
int gguf_writer_write_fp(gguf_writer *w, FILE *f, char *err, size_t errlen);
/* Last error of a setter / add call (setters return -1 and record it).
 * Errors are sticky: once a setter or add call failed, gguf_writer_write
 * refuses to write (so an ignored return value cannot yield a file that is
 * silently missing a key). general.alignment, if set, must be a u32 power of
 * two; it is the alignment of the data section and of every tensor. The file
 * is written to a temp file in the same directory and renamed over path. */
const char *gguf_writer_error(const gguf_writer *w);

#endif
