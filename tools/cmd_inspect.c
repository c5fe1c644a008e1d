/* cmd_inspect.c — `dspark inspect FILE`: metadata and tensor table. */
#include "cli.h"
#include "gguf.h"

#include <inttypes.h>
#include <string.h>

static const char *vtype_name(gguf_vtype t) {
    static const char *n[] = { "u8", "i8", "u16", "i16", "u32", "i32", "f32", "bool", "str", "arr", "u64", "i64", "f64" };
    return (unsigned)t < GGUF_T_COUNT ? n[t] : "?";
}

static void print_str(gguf_str s, size_t max) {
    size_t n = s.len < max ? s.len : max;
    putchar('"');
    for (size_t i = 0; i < n; i++) {
        unsigned char ch = (unsigned char)s.ptr[i];
        if (ch == '"' || ch == '\\') printf("\\%c", ch);
        else if (ch < 0x20) printf("\\x%02x", ch);
        else putchar(ch);
    }
    putchar('"');
    if (s.len > max) printf("...");
}

int cmd_inspect(int argc, char **argv) {
    const char *path = NULL;
    int full = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help")) { printf("usage: dspark inspect FILE.gguf [--full]\n"); return 0; }
        else if (!strcmp(argv[i], "--full")) full = 1;
        else if (argv[i][0] == '-') cli_die("inspect", "unknown flag '%s'", argv[i]);
        else if (!path) path = argv[i];
        else cli_die("inspect", "more than one file given ('%s')", argv[i]);
    }
    if (!path) cli_die("inspect", "no file given (usage: dspark inspect FILE.gguf)");
    char err[DS_ERRLEN];
    gguf_ctx *g = gguf_open(path, err, sizeof err);
    if (!g) cli_die("inspect", "%s: %s", path, err);
    printf("file=%s version=%u alignment=%" PRIu64 " data_offset=%" PRIu64 " size=%" PRIu64 " n_kv=%" PRIu64 " n_tensors=%" PRIu64 "\n",
           path, gguf_version(g), gguf_alignment(g), gguf_data_offset(g), gguf_file_size(g), gguf_n_kv(g), gguf_n_tensors(g));
    printf("\n# metadata\n");
    for (uint64_t i = 0; i < gguf_n_kv(g); i++) {
        const gguf_kv *kv = gguf_kv_at(g, i);
        printf("%-48.*s %-4s ", (int)kv->key.len, kv->key.ptr, vtype_name(kv->type));
        switch (kv->type) {
        case GGUF_T_STRING: print_str(kv->str, 120); break;
        case GGUF_T_F32: case GGUF_T_F64: printf("%g", kv->v.f); break;
        case GGUF_T_BOOL: printf("%s", kv->v.b ? "true" : "false"); break;
        case GGUF_T_I8: case GGUF_T_I16: case GGUF_T_I32: case GGUF_T_I64: printf("%" PRId64, kv->v.i); break;
        case GGUF_T_ARRAY: {
            uint64_t show = full ? kv->arr_n : (kv->arr_n < 8 ? kv->arr_n : 8);
            printf("[%s x %" PRIu64 "] ", vtype_name(kv->arr_type), kv->arr_n);
            for (uint64_t j = 0; j < show; j++) {
                if (j) printf(", ");
                gguf_str s; int64_t iv; float fv;
                if (kv->arr_type == GGUF_T_STRING && gguf_arr_str(kv, j, &s) == 0) print_str(s, 40);
                else if ((kv->arr_type == GGUF_T_F32 || kv->arr_type == GGUF_T_F64) && gguf_arr_f32(kv, j, &fv) == 0) printf("%g", fv);
                else if (gguf_arr_i64(kv, j, &iv) == 0) printf("%" PRId64, iv);
                else printf("?");
            }
            if (show < kv->arr_n) printf(", ...");
            break;
        }
        default: printf("%" PRIu64, kv->v.u); break;
        }
        putchar('\n');
    }
    printf("\n# tensors\n%-40s %-5s %-24s %12s %12s\n", "name", "type", "shape (ggml ne)", "offset", "bytes");
    for (uint64_t i = 0; i < gguf_n_tensors(g); i++) {
        const gguf_tensor *t = gguf_tensor_at(g, i);
        char shape[64] = "";
        for (uint32_t d = 0; d < t->n_dims; d++) {
            size_t l = strlen(shape);
            snprintf(shape + l, sizeof shape - l, "%s%" PRIu64, d ? " x " : "", t->ne[d]);
        }
        printf("%-40s %-5s %-24s %12" PRIu64 " %12" PRIu64 "\n", t->name, ds_type_name(t->type), shape, t->offset, t->nbytes);
    }
    gguf_close(g);
    return 0;
}
