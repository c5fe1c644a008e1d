/* safetensors.h — reader for Hugging Face safetensors checkpoints, used by
 * `dspark convert`.
 *
 * File format: u64 little-endian N, then N bytes of JSON header, then the
 * data section. The header maps tensor names to
 *   {"dtype": "F32", "shape": [d0, d1, ...], "data_offsets": [begin, end]}
 * with offsets relative to the data section; the "__metadata__" entry is
 * ignored. Shapes are in PyTorch order (shape[0] outermost, row-major).
 *
 * Nothing in the file is trusted: the header length is checked against the
 * file size, every shape and offset is checked with overflow-safe arithmetic,
 * end - begin must equal prod(shape) * sizeof(dtype), and end must lie inside
 * the data section. The JSON is parsed with cJSON; a parse error reports the
 * byte position inside the header.
 *
 * A checkpoint directory is either a single model.safetensors (or exactly
 * one *.safetensors file), or shards listed by model.safetensors.index.json
 * ("weight_map": {tensor: shard file}). ds_st_open_dir opens either and
 * exposes one flat, name-sorted tensor list. */
#ifndef DSPARK_SAFETENSORS_H
#define DSPARK_SAFETENSORS_H

#include "common.h"

#define DS_ST_MAX_DIMS 8

typedef enum {
    DS_ST_F32, DS_ST_F16, DS_ST_BF16, DS_ST_F64,
    DS_ST_I64, DS_ST_I32, DS_ST_I16, DS_ST_I8,
    DS_ST_U64, DS_ST_U32, DS_ST_U16, DS_ST_U8,
    DS_ST_BOOL, DS_ST_F8_E4M3, DS_ST_F8_E5M2,
    DS_ST_DTYPE_COUNT
} ds_st_dtype;

const char *ds_st_dtype_name(ds_st_dtype t);
size_t ds_st_dtype_size(ds_st_dtype t);

typedef struct {
    char       *name;                 /* NUL-terminated, owned by the file/set */
    ds_st_dtype dtype;
    uint32_t    n_dims;
    uint64_t    shape[DS_ST_MAX_DIMS];/* PyTorch order                         */
    uint64_t    n_elements;
    uint64_t    nbytes;
    const void *data;                 /* into the mapping; may be unaligned    */
    const char *file;                 /* path of the file that holds it        */
} ds_st_tensor;

/* ---- one file ---------------------------------------------------------- */
typedef struct ds_st_file ds_st_file;

ds_st_file *ds_st_open(const char *path, char *err, size_t errlen);
/* Parse a caller-owned buffer (kept referenced; not copied). `label` names
 * it in errors. */
ds_st_file *ds_st_open_mem(const void *buf, size_t size, const char *label,
                           char *err, size_t errlen);
void ds_st_close(ds_st_file *f);
size_t ds_st_n_tensors(const ds_st_file *f);
const ds_st_tensor *ds_st_tensor_at(const ds_st_file *f, size_t i);
const ds_st_tensor *ds_st_find(const ds_st_file *f, const char *name);

/* ---- a checkpoint directory (single file or sharded) -------------------- */
typedef struct ds_st_set ds_st_set;

ds_st_set *ds_st_open_dir(const char *dir, char *err, size_t errlen);
void ds_st_set_close(ds_st_set *s);
size_t ds_st_set_count(const ds_st_set *s);
const ds_st_tensor *ds_st_set_at(const ds_st_set *s, size_t i);   /* name-sorted */
const ds_st_tensor *ds_st_set_find(const ds_st_set *s, const char *name);
size_t ds_st_set_n_files(const ds_st_set *s);

/* Convert n elements of a float tensor (F32/F16/BF16/F64) starting at
 * element `first` to f32. Returns -1 for a non-float dtype. */
int ds_st_read_f32(const ds_st_tensor *t, uint64_t first, uint64_t n, float *out);

/* "[2560, 12800]" */
void ds_st_shape_str(const uint64_t *shape, uint32_t n_dims, char *buf, size_t n);

#endif
