/* safetensors.c — see safetensors.h. */
#include "safetensors.h"

#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define ST_MAX_HEADER (100u * 1024u * 1024u)   /* the format's own limit */

static const struct { const char *name; size_t size; } st_dtypes[DS_ST_DTYPE_COUNT] = {
    [DS_ST_F32] = {"F32", 4},   [DS_ST_F16] = {"F16", 2},   [DS_ST_BF16] = {"BF16", 2},
    [DS_ST_F64] = {"F64", 8},   [DS_ST_I64] = {"I64", 8},   [DS_ST_I32] = {"I32", 4},
    [DS_ST_I16] = {"I16", 2},   [DS_ST_I8] = {"I8", 1},     [DS_ST_U64] = {"U64", 8},
    [DS_ST_U32] = {"U32", 4},   [DS_ST_U16] = {"U16", 2},   [DS_ST_U8] = {"U8", 1},
    [DS_ST_BOOL] = {"BOOL", 1}, [DS_ST_F8_E4M3] = {"F8_E4M3", 1}, [DS_ST_F8_E5M2] = {"F8_E5M2", 1},
};

const char *ds_st_dtype_name(ds_st_dtype t) {
    return (unsigned)t < DS_ST_DTYPE_COUNT ? st_dtypes[t].name : "unknown";
}
size_t ds_st_dtype_size(ds_st_dtype t) {
    return (unsigned)t < DS_ST_DTYPE_COUNT ? st_dtypes[t].size : 0;
}

void ds_st_shape_str(const uint64_t *shape, uint32_t n_dims, char *buf, size_t n) {
    size_t off = 0;
    if (!n) return;
    buf[0] = 0;
    off += (size_t)snprintf(buf + off, n - off, "[");
    for (uint32_t i = 0; i < n_dims && off < n; i++)
        off += (size_t)snprintf(buf + off, n - off, "%s%llu", i ? ", " : "",
                                (unsigned long long)shape[i]);
    if (off < n) snprintf(buf + off, n - off, "]");
}

/* ---- one file ------------------------------------------------------------ */
struct ds_st_file {
    void         *map;       /* NULL for ds_st_open_mem                     */
    size_t        map_size;
    const uint8_t *buf;
    size_t        size;
    char         *path;
    ds_st_tensor *t;
    size_t        n;
};

void ds_st_close(ds_st_file *f) {
    if (!f) return;
    for (size_t i = 0; i < f->n; i++) free(f->t[i].name);
    free(f->t);
    if (f->map) munmap(f->map, f->map_size);
    free(f->path);
    free(f);
}

/* A JSON number that is a non-negative integer below 2^53 (exact in a double). */
static int json_u64(const cJSON *j, uint64_t *out) {
    if (!cJSON_IsNumber(j)) return -1;
    double d = j->valuedouble;
    if (!(d >= 0) || d > 9007199254740992.0 || d != (double)(uint64_t)d) return -1;
    *out = (uint64_t)d;
    return 0;
}

static int span_cmp(const void *x, const void *y) {
    const uint64_t *a = x, *b = y;
    if (a[0] != b[0]) return a[0] < b[0] ? -1 : 1;
    return (a[1] > b[1]) - (a[1] < b[1]);
}

static int parse_header(ds_st_file *f, char *err, size_t errlen) {
    const char *L = f->path;
    if (f->size < 8) {
        ds_errf(err, errlen, "%s: file is %zu bytes, too small for the 8-byte safetensors header length", L, f->size);
        return -1;
    }
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = (hlen << 8) | f->buf[i];
    if (hlen == 0 || hlen > f->size - 8) {
        ds_errf(err, errlen, "%s: truncated safetensors header: header length %llu exceeds the %zu bytes after the length field",
                L, (unsigned long long)hlen, f->size - 8);
        return -1;
    }
    if (hlen > ST_MAX_HEADER) {
        ds_errf(err, errlen, "%s: safetensors header length %llu exceeds the 100 MiB limit", L, (unsigned long long)hlen);
        return -1;
    }
    const char *hdr = (const char *)f->buf + 8;
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(hdr, (size_t)hlen, &end, 0);
    if (!root) {
        size_t pos = end && end >= hdr ? (size_t)(end - hdr) : 0;
        ds_errf(err, errlen, "%s: invalid safetensors header JSON near byte %zu of the header", L, pos);
        return -1;
    }
    int rc = -1;
    uint64_t (*spans)[2] = NULL;     /* [begin, end) per tensor, for the tiling check */
    uint64_t data_size = f->size - 8 - hlen;
    const uint8_t *data = f->buf + 8 + hlen;
    if (!cJSON_IsObject(root)) {
        ds_errf(err, errlen, "%s: safetensors header is not a JSON object", L);
        goto out;
    }
    size_t cnt = 0;
    for (cJSON *e = root->child; e; e = e->next) cnt++;
    f->t = calloc(cnt ? cnt : 1, sizeof *f->t);
    spans = calloc(cnt ? cnt : 1, sizeof *spans);
    if (!f->t || !spans) { ds_errf(err, errlen, "%s: out of memory", L); goto out; }
    for (cJSON *e = root->child; e; e = e->next) {
        const char *name = e->string ? e->string : "";
        if (!strcmp(name, "__metadata__")) continue;
        if (!cJSON_IsObject(e)) {
            ds_errf(err, errlen, "%s: header entry '%s' is not an object", L, name);
            goto out;
        }
        const cJSON *jd = cJSON_GetObjectItemCaseSensitive(e, "dtype");
        const cJSON *js = cJSON_GetObjectItemCaseSensitive(e, "shape");
        const cJSON *jo = cJSON_GetObjectItemCaseSensitive(e, "data_offsets");
        if (!cJSON_IsString(jd) || !cJSON_IsArray(js) || !cJSON_IsArray(jo)) {
            ds_errf(err, errlen, "%s: tensor '%s' lacks a string 'dtype', an array 'shape' or an array 'data_offsets'", L, name);
            goto out;
        }
        ds_st_tensor *t = &f->t[f->n];
        int dt = -1;
        for (int k = 0; k < DS_ST_DTYPE_COUNT; k++)
            if (!strcmp(jd->valuestring, st_dtypes[k].name)) { dt = k; break; }
        if (dt < 0) {
            ds_errf(err, errlen, "%s: tensor '%s' has unknown dtype '%.32s'", L, name, jd->valuestring);
            goto out;
        }
        t->dtype = (ds_st_dtype)dt;
        int nd = cJSON_GetArraySize(js);
        if (nd > DS_ST_MAX_DIMS) {
            ds_errf(err, errlen, "%s: tensor '%s' has %d dimensions (max %d)", L, name, nd, DS_ST_MAX_DIMS);
            goto out;
        }
        t->n_dims = (uint32_t)nd;
        uint64_t ne = 1;
        int i = 0;
        for (const cJSON *d = js->child; d; d = d->next, i++) {
            if (json_u64(d, &t->shape[i])) {
                ds_errf(err, errlen, "%s: tensor '%s': shape[%d] is not a non-negative integer", L, name, i);
                goto out;
            }
            if (ds_mul_ovf(ne, t->shape[i], &ne)) {
                ds_errf(err, errlen, "%s: tensor '%s': element count overflows", L, name);
                goto out;
            }
        }
        t->n_elements = ne;
        uint64_t nbytes;
        if (ds_mul_ovf(ne, st_dtypes[dt].size, &nbytes)) {
            ds_errf(err, errlen, "%s: tensor '%s': byte size overflows", L, name);
            goto out;
        }
        uint64_t b, en;
        if (cJSON_GetArraySize(jo) != 2 || json_u64(jo->child, &b) || json_u64(jo->child->next, &en)) {
            ds_errf(err, errlen, "%s: tensor '%s': data_offsets must be two non-negative integers", L, name);
            goto out;
        }
        if (b > en || en > data_size) {
            ds_errf(err, errlen, "%s: tensor '%s': data_offsets [%llu, %llu] out of range (data section is %llu bytes)",
                    L, name, (unsigned long long)b, (unsigned long long)en, (unsigned long long)data_size);
            goto out;
        }
        if (en - b != nbytes) {
            char sh[160];
            ds_st_shape_str(t->shape, t->n_dims, sh, sizeof sh);
            ds_errf(err, errlen, "%s: tensor '%s': data_offsets [%llu, %llu] span %llu bytes, but shape %s of %s needs %llu",
                    L, name, (unsigned long long)b, (unsigned long long)en, (unsigned long long)(en - b),
                    sh, st_dtypes[dt].name, (unsigned long long)nbytes);
            goto out;
        }
        t->nbytes = nbytes;
        spans[f->n][0] = b;
        spans[f->n][1] = en;
        t->data = data + b;
        t->file = f->path;
        t->name = strdup(name);
        if (!t->name) { ds_errf(err, errlen, "%s: out of memory", L); goto out; }
        f->n++;
    }
    /* The format's own rule (the reference implementation enforces it): the
     * tensors tile the data section exactly, no overlap, no hole, nothing
     * after the last one. A header length one byte off, or two tensors
     * sharing bytes, breaks the tiling and would otherwise convert into
     * silently shifted or aliased weights. */
    qsort(spans, f->n, sizeof *spans, span_cmp);
    uint64_t at = 0;
    for (size_t k = 0; k < f->n; k++) {
        if (spans[k][0] != at) {
            ds_errf(err, errlen, "%s: tensor data %s at byte %llu of the data section (expected the next tensor at %llu): "
                    "tensors overlap or leave a hole, or the header length is wrong", L,
                    spans[k][0] < at ? "overlaps" : "has a hole", (unsigned long long)spans[k][0], (unsigned long long)at);
            goto out;
        }
        at = spans[k][1];
    }
    if (at != data_size) {
        ds_errf(err, errlen, "%s: the tensors cover %llu bytes but the data section is %llu bytes "
                "(wrong header length, or trailing bytes)", L, (unsigned long long)at, (unsigned long long)data_size);
        goto out;
    }
    rc = 0;
out:
    free(spans);
    cJSON_Delete(root);
    return rc;
}

ds_st_file *ds_st_open_mem(const void *buf, size_t size, const char *label, char *err, size_t errlen) {
    ds_st_file *f = calloc(1, sizeof *f);
    if (!f) { ds_errf(err, errlen, "out of memory"); return NULL; }
    f->buf = buf;
    f->size = size;
    f->path = strdup(label ? label : "<memory>");
    if (!f->path || parse_header(f, err, errlen)) { ds_st_close(f); return NULL; }
    return f;
}

ds_st_file *ds_st_open(const char *path, char *err, size_t errlen) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        ds_errf(err, errlen, "%s: cannot open: %s", path, strerror(errno));
        return NULL;
    }
    struct stat st;
    if (fstat(fd, &st) || !S_ISREG(st.st_mode)) {
        ds_errf(err, errlen, "%s: not a regular file", path);
        close(fd);
        return NULL;
    }
    ds_st_file *f = calloc(1, sizeof *f);
    if (!f) { close(fd); ds_errf(err, errlen, "out of memory"); return NULL; }
    f->path = strdup(path);
    f->size = (size_t)st.st_size;
    if (!f->path) { close(fd); ds_st_close(f); ds_errf(err, errlen, "out of memory"); return NULL; }
    if (f->size > 0) {
        void *m = mmap(NULL, f->size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (m == MAP_FAILED) {
            ds_errf(err, errlen, "%s: mmap failed: %s", path, strerror(errno));
            close(fd);
            ds_st_close(f);
            return NULL;
        }
        f->map = m;
        f->map_size = f->size;
        f->buf = m;
    } else {
        f->buf = (const uint8_t *)"";
    }
    close(fd);
    if (parse_header(f, err, errlen)) { ds_st_close(f); return NULL; }
    return f;
}

size_t ds_st_n_tensors(const ds_st_file *f) { return f->n; }
const ds_st_tensor *ds_st_tensor_at(const ds_st_file *f, size_t i) { return i < f->n ? &f->t[i] : NULL; }
const ds_st_tensor *ds_st_find(const ds_st_file *f, const char *name) {
    for (size_t i = 0; i < f->n; i++)
        if (!strcmp(f->t[i].name, name)) return &f->t[i];
    return NULL;
}

/* ---- conversion to f32 ---------------------------------------------------- */
int ds_st_read_f32(const ds_st_tensor *t, uint64_t first, uint64_t n, float *out) {
    const uint8_t *p = t->data;
    switch (t->dtype) {
    case DS_ST_F32:
        p += first * 4;
        for (uint64_t i = 0; i < n; i++, p += 4)
            out[i] = ds_bits_f32((uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24);
        return 0;
    case DS_ST_F16:
        p += first * 2;
        for (uint64_t i = 0; i < n; i++, p += 2) out[i] = ds_fp16_to_f32((uint16_t)(p[0] | p[1] << 8));
        return 0;
    case DS_ST_BF16:
        p += first * 2;
        for (uint64_t i = 0; i < n; i++, p += 2) out[i] = ds_bf16_to_f32((uint16_t)(p[0] | p[1] << 8));
        return 0;
    case DS_ST_F64:
        p += first * 8;
        for (uint64_t i = 0; i < n; i++, p += 8) {
            uint64_t u = 0;
            for (int k = 7; k >= 0; k--) u = (u << 8) | p[k];
            double d;
            memcpy(&d, &u, 8);
            out[i] = (float)d;
        }
        return 0;
    default:
        return -1;
    }
}

/* ---- a checkpoint directory ------------------------------------------------ */
struct ds_st_set {
    ds_st_file   **files;
    size_t         n_files;
    const ds_st_tensor **t;   /* sorted by name */
    size_t         n;
};

void ds_st_set_close(ds_st_set *s) {
    if (!s) return;
    for (size_t i = 0; i < s->n_files; i++) ds_st_close(s->files[i]);
    free(s->files);
    free(s->t);
    free(s);
}
size_t ds_st_set_count(const ds_st_set *s) { return s->n; }
size_t ds_st_set_n_files(const ds_st_set *s) { return s->n_files; }
const ds_st_tensor *ds_st_set_at(const ds_st_set *s, size_t i) { return i < s->n ? s->t[i] : NULL; }

static int cmp_tensor_ptr(const void *a, const void *b) {
    return strcmp((*(const ds_st_tensor *const *)a)->name, (*(const ds_st_tensor *const *)b)->name);
}
static int cmp_key_tensor(const void *k, const void *b) {
    return strcmp((const char *)k, (*(const ds_st_tensor *const *)b)->name);
}
const ds_st_tensor *ds_st_set_find(const ds_st_set *s, const char *name) {
    const ds_st_tensor *const *r = bsearch(name, s->t, s->n, sizeof *s->t, cmp_key_tensor);
    return r ? *r : NULL;
}

static char *path_join(const char *dir, const char *name) {
    size_t a = strlen(dir), b = strlen(name);
    char *p = malloc(a + b + 2);
    if (!p) return NULL;
    memcpy(p, dir, a);
    size_t o = a;
    if (a && dir[a - 1] != '/') p[o++] = '/';
    memcpy(p + o, name, b + 1);
    return p;
}

/* Read a whole small file (JSON) into a NUL-terminated buffer. */
static char *slurp(const char *path, size_t *len, char *err, size_t errlen) {
    FILE *fp = fopen(path, "rb");
    if (!fp) { ds_errf(err, errlen, "%s: cannot open: %s", path, strerror(errno)); return NULL; }
    size_t cap = 4096, n = 0;
    char *b = malloc(cap);
    while (b) {
        if (n + 1 >= cap) {
            if (cap > ((size_t)1 << 30)) { free(b); b = NULL; ds_errf(err, errlen, "%s: file too large", path); fclose(fp); return NULL; }
            char *nb = realloc(b, cap * 2);
            if (!nb) { free(b); b = NULL; break; }
            b = nb;
            cap *= 2;
        }
        size_t r = fread(b + n, 1, cap - 1 - n, fp);
        n += r;
        if (r == 0) break;
    }
    int bad = ferror(fp);
    fclose(fp);
    if (!b) { ds_errf(err, errlen, "%s: out of memory", path); return NULL; }
    if (bad) { free(b); ds_errf(err, errlen, "%s: read error", path); return NULL; }
    b[n] = 0;
    *len = n;
    return b;
}

static int add_file(ds_st_set *s, const char *path, char *err, size_t errlen) {
    ds_st_file **nf = realloc(s->files, (s->n_files + 1) * sizeof *nf);
    if (!nf) { ds_errf(err, errlen, "out of memory"); return -1; }
    s->files = nf;
    ds_st_file *f = ds_st_open(path, err, errlen);
    if (!f) return -1;
    s->files[s->n_files++] = f;
    return 0;
}

static int has_suffix(const char *s, const char *suf) {
    size_t a = strlen(s), b = strlen(suf);
    return a >= b && !strcmp(s + a - b, suf);
}

/* JSON parse error with line/column (declared in convert too; kept local). */
static void json_errpos(const char *buf, size_t len, const char *end, size_t *byte, int *line, int *col) {
    size_t pos = end && end >= buf && (size_t)(end - buf) <= len ? (size_t)(end - buf) : 0;
    int l = 1, c = 1;
    for (size_t i = 0; i < pos; i++) {
        if (buf[i] == '\n') { l++; c = 1; } else c++;
    }
    *byte = pos; *line = l; *col = c;
}

static int open_index(ds_st_set *s, const char *dir, const char *ipath, char *err, size_t errlen) {
    size_t len;
    char *txt = slurp(ipath, &len, err, errlen);
    if (!txt) return -1;
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(txt, len, &end, 0);
    int rc = -1;
    if (!root) {
        size_t b; int l, c;
        json_errpos(txt, len, end, &b, &l, &c);
        ds_errf(err, errlen, "%s: invalid JSON at byte %zu (line %d, column %d)", ipath, b, l, c);
        free(txt);
        return -1;
    }
    const cJSON *wm = cJSON_GetObjectItemCaseSensitive(root, "weight_map");
    if (!cJSON_IsObject(wm)) {
        ds_errf(err, errlen, "%s: missing object 'weight_map'", ipath);
        goto out;
    }
    /* distinct shard names, in first-seen order */
    for (const cJSON *e = wm->child; e; e = e->next) {
        if (!cJSON_IsString(e) || !e->valuestring[0]) {
            ds_errf(err, errlen, "%s: weight_map entry '%s' is not a file name", ipath, e->string ? e->string : "");
            goto out;
        }
        const char *fn = e->valuestring;
        if (strchr(fn, '/') || !strcmp(fn, "..") || !strcmp(fn, ".")) {
            ds_errf(err, errlen, "%s: weight_map shard name '%s' must be a plain file name in the directory", ipath, fn);
            goto out;
        }
        int seen = 0;
        for (const cJSON *p = wm->child; p != e; p = p->next)
            if (!strcmp(p->valuestring, fn)) { seen = 1; break; }
        if (seen) continue;
        char *path = path_join(dir, fn);
        if (!path) { ds_errf(err, errlen, "out of memory"); goto out; }
        if (access(path, F_OK)) {
            ds_errf(err, errlen, "shard '%s' listed in %s is missing (%s)", fn, ipath, strerror(errno));
            free(path);
            goto out;
        }
        int r = add_file(s, path, err, errlen);
        free(path);
        if (r) goto out;
    }
    /* every indexed tensor must be in its shard, and every shard tensor indexed */
    for (const cJSON *e = wm->child; e; e = e->next) {
        const char *name = e->string ? e->string : "";
        ds_st_file *f = NULL;
        for (size_t i = 0; i < s->n_files; i++) {
            const char *base = strrchr(s->files[i]->path, '/');
            base = base ? base + 1 : s->files[i]->path;
            if (!strcmp(base, e->valuestring)) { f = s->files[i]; break; }
        }
        if (!f || !ds_st_find(f, name)) {
            ds_errf(err, errlen, "tensor '%s' is listed in %s under '%s' but that shard does not contain it",
                    name, ipath, e->valuestring);
            goto out;
        }
    }
    for (size_t i = 0; i < s->n_files; i++) {
        const char *base = strrchr(s->files[i]->path, '/');
        base = base ? base + 1 : s->files[i]->path;
        for (size_t k = 0; k < s->files[i]->n; k++) {
            const cJSON *m = cJSON_GetObjectItemCaseSensitive(wm, s->files[i]->t[k].name);
            if (!m || strcmp(m->valuestring, base)) {
                ds_errf(err, errlen, "tensor '%s' in shard '%s' is not mapped to that shard by %s",
                        s->files[i]->t[k].name, base, ipath);
                goto out;
            }
        }
    }
    rc = 0;
out:
    cJSON_Delete(root);
    free(txt);
    return rc;
}

ds_st_set *ds_st_open_dir(const char *dir, char *err, size_t errlen) {
    ds_st_set *s = calloc(1, sizeof *s);
    if (!s) { ds_errf(err, errlen, "out of memory"); return NULL; }
    char *ipath = path_join(dir, "model.safetensors.index.json");
    char *spath = path_join(dir, "model.safetensors");
    int rc = -1;
    if (!ipath || !spath) { ds_errf(err, errlen, "out of memory"); goto out; }
    if (!access(ipath, F_OK)) {
        rc = open_index(s, dir, ipath, err, errlen);
    } else if (!access(spath, F_OK)) {
        rc = add_file(s, spath, err, errlen);
    } else {
        DIR *d = opendir(dir);
        if (!d) { ds_errf(err, errlen, "%s: cannot open directory: %s", dir, strerror(errno)); goto out; }
        char *only = NULL;
        int count = 0;
        for (struct dirent *de; (de = readdir(d));) {
            if (!has_suffix(de->d_name, ".safetensors")) continue;
            if (++count == 1) only = strdup(de->d_name);
        }
        closedir(d);
        if (count != 1) {
            free(only);
            if (count == 0)
                ds_errf(err, errlen, "%s: no model.safetensors, model.safetensors.index.json or *.safetensors file", dir);
            else
                ds_errf(err, errlen, "%s: %d *.safetensors files but no model.safetensors.index.json to order them", dir, count);
            goto out;
        }
        char *p = only ? path_join(dir, only) : NULL;
        free(only);
        if (!p) { ds_errf(err, errlen, "out of memory"); goto out; }
        rc = add_file(s, p, err, errlen);
        free(p);
    }
    if (rc) goto out;
    rc = -1;
    size_t total = 0;
    for (size_t i = 0; i < s->n_files; i++) total += s->files[i]->n;
    s->t = malloc((total ? total : 1) * sizeof *s->t);
    if (!s->t) { ds_errf(err, errlen, "out of memory"); goto out; }
    for (size_t i = 0; i < s->n_files; i++)
        for (size_t k = 0; k < s->files[i]->n; k++) s->t[s->n++] = &s->files[i]->t[k];
    qsort(s->t, s->n, sizeof *s->t, cmp_tensor_ptr);
    for (size_t i = 1; i < s->n; i++)
        if (!strcmp(s->t[i - 1]->name, s->t[i]->name)) {
            ds_errf(err, errlen, "tensor '%s' appears twice (%s and %s)", s->t[i]->name, s->t[i - 1]->file, s->t[i]->file);
            goto out;
        }
    rc = 0;
out:
    free(ipath);
    free(spath);
    if (rc) { ds_st_set_close(s); return NULL; }
    return s;
}
