/* cmd_quantize.c — `dspark quantize IN.gguf OUT.gguf TYPE`: re-encode the
 * 2-D weights of a GGUF file (llama.cpp's llama-quantize habit). Every
 * metadata key is copied; 1-D tensors (norms) stay as they are; 2-D
 * tensors are converted to f32 exactly and re-encoded to TYPE (a Q8_0
 * target whose row length is not a multiple of 32 keeps its type). Used to
 * make the shipped Q8_0 target from the committed F16 one at build time. */
#include "cli.h"
#include "gguf.h"
#include "outfile.h"

#include <stdlib.h>
#include <string.h>

int cmd_quantize(int argc, char **argv) {
    const char *C = "quantize";
    const char *in = NULL, *out = NULL, *tname = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help")) { printf("usage: dspark quantize IN.gguf OUT.gguf f32|f16|bf16|q8_0\n"); return 0; }
        if (argv[i][0] == '-') cli_die(C, "unknown flag '%s'", argv[i]);
        if (!in) in = argv[i];
        else if (!out) out = argv[i];
        else if (!tname) tname = argv[i];
        else cli_die(C, "too many arguments ('%s')", argv[i]);
    }
    if (!tname) cli_die(C, "usage: dspark quantize IN.gguf OUT.gguf f32|f16|bf16|q8_0");
    uint32_t type;
    if (!strcmp(tname, "f32")) type = DS_TYPE_F32;
    else if (!strcmp(tname, "f16")) type = DS_TYPE_F16;
    else if (!strcmp(tname, "bf16")) type = DS_TYPE_BF16;
    else if (!strcmp(tname, "q8_0")) type = DS_TYPE_Q8_0;
    else cli_die(C, "type must be f32, f16, bf16 or q8_0, got '%s'", tname);
    char err[DS_ERRLEN];
    /* writing over the input would truncate the mapping being read */
    if (ds_out_check_inputs(out, &in, 1, err, sizeof err)) cli_die(C, "%s", err);
    gguf_ctx *g = gguf_open(in, err, sizeof err);
    if (!g) cli_die(C, "%s: %s", in, err);
    gguf_writer *w = gguf_writer_new();
    const char *skip[] = { "general.file_type", NULL };
    if (!w || gguf_copy_kv(w, g, skip)) cli_die(C, "copying metadata failed");
    gguf_set_u32(w, "general.file_type", type);
    size_t converted = 0;
    for (uint64_t i = 0; i < gguf_n_tensors(g); i++) {
        const gguf_tensor *t = gguf_tensor_at(g, i);
        int ok = 0;
        uint64_t n = gguf_tensor_nelements(t), rb = 0;
        uint32_t to = type;
        if (t->n_dims != 2) to = t->type;
        else {
            rb = ds_row_bytes(to, t->ne[0], &ok);
            if (!ok) to = t->type;                       /* e.g. Q8_0 with ne0 % 32 != 0 */
        }
        if (to == t->type) {
            if (gguf_add_tensor(w, t->name, t->type, t->n_dims, t->ne, t->data, t->nbytes)) cli_die(C, "%s", gguf_writer_error(w));
            continue;
        }
        float *f = malloc(n * sizeof(float));
        void *q = malloc(rb * t->ne[1]);
        if (!f || !q) cli_die(C, "out of memory converting '%s'", t->name);
        ds_row_to_f32(t->type, t->data, (int64_t)n, f);
        ds_f32_to_type(to, f, (int64_t)n, q);
        if (gguf_add_tensor(w, t->name, to, 2, t->ne, q, rb * t->ne[1])) cli_die(C, "%s", gguf_writer_error(w));
        free(f); free(q);
        converted++;
    }
    int rc = gguf_writer_write(w, out, err, sizeof err);
    gguf_writer_free(w);
    gguf_close(g);
    if (rc) cli_die(C, "%s", err);
    fprintf(stderr, "quantize: wrote %s: %zu tensors re-encoded to %s\n", out, converted, ds_type_name(type));
    return 0;
}
