/* cmd_quantize.c — `dspark quantize IN.gguf OUT.gguf TYPE|MIX|copy`:
 * re-encode the 2-D weights of a GGUF file (llama.cpp's llama-quantize
 * habit). Every metadata key is copied (with llama.cpp's names and codes:
 * tokenizer.ggml.pre "gpt-2", general.file_type as LLAMA_FTYPE,
 * general.quantization_version = 2); 1-D tensors (norms) stay as they are;
 * 2-D tensors and 3-D expert stacks (ffn_*_exps) are converted to f32
 * exactly and re-encoded; a MoE router (ffn_gate_inp) keeps its type.
 *
 *   f32|f16|bf16|q8_0      every 2-D weight to TYPE (a row length that is not
 *                          a multiple of the block keeps its type). Makes the
 *                          shipped Q8_0 target from the F16 one at build time.
 *   q4_0 .. q6_k           every 2-D weight to TYPE, and, as llama-quantize
 *                          does, the output matrix (the token embedding when
 *                          tied) to Q6_K.
 *   q4_k_m / q5_k_m        llama-quantize's mixes (llama-quant.cpp,
 *                          llama_tensor_get_type): Q4_K / Q5_K, with Q6_K for
 *                          the output matrix and for attn_v and ffn_down in
 *                          the layers use_more_bits picks (i < n/8,
 *                          i >= 7n/8, (i - n/8) % 3 == 2).
 *   copy                   every tensor's type and bytes unchanged: only
 *                          the metadata is rewritten (the re-ship path).
 * K types need rows that are a multiple of 256; like llama-quantize, other
 * rows fall back: Q4_K -> Q5_0, Q5_K -> Q5_1, Q6_K -> Q8_0. */
#include "cli.h"
#include "gguf.h"
#include "outfile.h"

#include <stdlib.h>
#include <string.h>

#define USAGE "usage: dspark quantize IN.gguf OUT.gguf " DS_TYPE_NAMES "|q4_k_m|q5_k_m|copy\n"

enum { MIX_NONE = 0, MIX_Q4_K_M, MIX_Q5_K_M, MIX_COPY };

static int more_bits(int i, int n) { return i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2; }

/* llama-quantize's fallback for rows that are not a multiple of the block */
static uint32_t fallback(uint32_t to, uint64_t ne0, uint32_t orig) {
    if (ne0 % ds_type_block_elems(to) == 0) return to;
    uint32_t f = to == DS_TYPE_Q4_K ? DS_TYPE_Q5_0 : to == DS_TYPE_Q5_K ? DS_TYPE_Q5_1
               : to == DS_TYPE_Q6_K ? DS_TYPE_Q8_0 : orig;
    return ne0 % ds_type_block_elems(f) ? orig : f;
}

static int has_tensor(const gguf_ctx *g, const char *name) { return gguf_find_tensor(g, name) != NULL; }

int cmd_quantize(int argc, char **argv) {
    const char *C = "quantize";
    const char *in = NULL, *out = NULL, *tname = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help")) {
            printf(USAGE
                   "  f32|f16|bf16|q8_0  every 2-D weight to TYPE (rows not a multiple of the block keep theirs)\n"
                   "  q4_0..q6_k         every 2-D weight to TYPE, the output matrix (token_embd when tied) Q6_K,\n"
                   "                     as llama-quantize does\n"
                   "  q4_k_m, q5_k_m     llama-quantize's mixes: Q4_K / Q5_K, Q6_K for the output matrix and for\n"
                   "                     attn_v and ffn_down of the layers llama.cpp's use_more_bits picks\n"
                   "  copy               tensors unchanged, metadata rewritten with llama.cpp's names and codes\n"
                   "  K-type rows that are not a multiple of 256 fall back as in llama-quantize:\n"
                   "  Q4_K -> Q5_0, Q5_K -> Q5_1, Q6_K -> Q8_0. Norms (1-D) are never re-encoded.\n");
            return 0;
        }
        if (argv[i][0] == '-') cli_die(C, "unknown flag '%s'", argv[i]);
        if (!in) in = argv[i];
        else if (!out) out = argv[i];
        else if (!tname) tname = argv[i];
        else cli_die(C, "too many arguments ('%s')", argv[i]);
    }
    if (!tname) cli_die(C, "%s", USAGE);
    int mix = MIX_NONE;
    uint32_t type, ftype;
    if (!strcmp(tname, "q4_k_m")) { mix = MIX_Q4_K_M; type = DS_TYPE_Q4_K; ftype = GGUF_LLAMA_FTYPE_Q4_K_M; }
    else if (!strcmp(tname, "q5_k_m")) { mix = MIX_Q5_K_M; type = DS_TYPE_Q5_K; ftype = GGUF_LLAMA_FTYPE_Q5_K_M; }
    else if (!strcmp(tname, "copy")) { mix = MIX_COPY; type = 0; ftype = 0; }
    else {
        const int t = ds_type_from_name(tname);
        if (t < 0) cli_die(C, "type must be one of " DS_TYPE_NAMES ", q4_k_m, q5_k_m or copy, got '%s'", tname);
        type = (uint32_t)t;
        ftype = gguf_llama_ftype(type);
    }
    char err[DS_ERRLEN];
    /* writing over the input would truncate the mapping being read */
    if (ds_out_check_inputs(out, &in, 1, err, sizeof err)) cli_die(C, "%s", err);
    gguf_ctx *g = gguf_open(in, err, sizeof err);
    if (!g) cli_die(C, "%s: %s", in, err);
    if (mix == MIX_COPY) {                       /* keep the file's own code, in llama.cpp's numbering */
        uint32_t ft = 1;
        if (gguf_get_u32(g, "general.file_type", &ft) == 0 && ft == DS_TYPE_Q8_0) ft = gguf_llama_ftype(ft);
        ftype = ft;                              /* older dspark files wrote the ggml type: 8 = Q8_0 */
    }
    gguf_writer *w = gguf_writer_new();
    const char *skip[] = { "general.file_type", "general.quantization_version", NULL };
    if (!w || gguf_copy_kv(w, g, skip)) cli_die(C, "copying metadata failed");
    gguf_set_u32(w, "general.quantization_version", GGUF_QUANTIZATION_VERSION);
    gguf_set_u32(w, "general.file_type", ftype);
    const int has_output = has_tensor(g, "output.weight");
    int n_attn_v = 0, i_attn_v = 0, i_ffn_down = 0;
    uint32_t n_layer = 0;
    {
        gguf_str arch;
        char key[96];
        if (gguf_get_str(g, "general.architecture", &arch) == 0 && arch.len < 64) {
            snprintf(key, sizeof key, "%.*s.block_count", (int)arch.len, arch.ptr);
            gguf_get_u32(g, key, &n_layer);
        }
    }
    for (uint64_t i = 0; i < gguf_n_tensors(g); i++)
        if (strstr(gguf_tensor_at(g, i)->name, "attn_v.weight")) n_attn_v++;
    size_t converted = 0;
    for (uint64_t i = 0; i < gguf_n_tensors(g); i++) {
        const gguf_tensor *t = gguf_tensor_at(g, i);
        const uint64_t n = gguf_tensor_nelements(t), ne0 = t->ne[0];
        uint32_t to = type;
        /* 2-D weights and llama.cpp's 3-D expert stacks (rows of rows); a
         * MoE router (ffn_gate_inp) stays as it is, as llama-quantize leaves it */
        if (mix == MIX_COPY || (t->n_dims != 2 && t->n_dims != 3) || strstr(t->name, "ffn_gate_inp") ||
            t->type == DS_TYPE_I32) {                  /* an integer table (a hash layer's experts): as it is */
            to = t->type;
        } else if (ds_type_is_kq(type) || mix) {
            const int is_out = !strcmp(t->name, "output.weight") || (!has_output && !strcmp(t->name, "token_embd.weight"));
            if (is_out) to = DS_TYPE_Q6_K;
            else if (mix && strstr(t->name, "attn_v.weight")) {
                if (more_bits(i_attn_v, n_attn_v)) to = DS_TYPE_Q6_K;
                i_attn_v++;
            } else if (mix && strstr(t->name, "ffn_down")) {
                if (more_bits(i_ffn_down, (int)n_layer)) to = DS_TYPE_Q6_K;
                i_ffn_down++;
            }
            to = fallback(to, ne0, t->type);
        } else if (ne0 % ds_type_block_elems(to)) {
            to = t->type;                              /* e.g. Q8_0 with ne0 % 32 != 0 */
        }
        if (to == t->type) {
            if (gguf_add_tensor(w, t->name, t->type, t->n_dims, t->ne, t->data, t->nbytes)) cli_die(C, "%s", gguf_writer_error(w));
            continue;
        }
        int ok;
        const uint64_t rb = ds_row_bytes(to, ne0, &ok);
        float *f = malloc(n * sizeof(float));
        const uint64_t rows = t->ne[1] * (t->n_dims == 3 ? t->ne[2] : 1);
        void *q = malloc(rb * rows);
        if (!ok || !f || !q) cli_die(C, "out of memory converting '%s'", t->name);
        ds_row_to_f32(t->type, t->data, (int64_t)n, f);
        ds_f32_to_type(to, f, (int64_t)n, q);
        if (gguf_add_tensor(w, t->name, to, t->n_dims, t->ne, q, rb * rows)) cli_die(C, "%s", gguf_writer_error(w));
        free(f); free(q);
        converted++;
    }
    int rc = gguf_writer_write(w, out, err, sizeof err);
    gguf_writer_free(w);
    gguf_close(g);
    if (rc) cli_die(C, "%s", err);
    fprintf(stderr, "quantize: wrote %s: %zu tensors re-encoded (%s, file_type=%u)\n", out, converted, tname, ftype);
    return 0;
}
