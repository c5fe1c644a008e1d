/* convert.h — Hugging Face safetensors checkpoint (+ config.json) -> GGUF,
 * the library half of `dspark convert`.
 *
 * Inputs: a directory with config.json and either model.safetensors, one
 * *.safetensors file, or shards listed by model.safetensors.index.json.
 * Source dtypes F32, F16 and BF16 are accepted.
 *
 * Targets (config "model_type"/"architectures": qwen3 -> arch "qwen3",
 * llama -> arch "llama") and DSpark drafters in DeepSpec's layout (config
 * carries block_size / target_layer_ids / mask_token_id / markov_rank ...)
 * are supported. Drafters are written either in llama.cpp mainline's
 * "dflash" layout (default) or PrismML's legacy "dspark" layout; the full
 * mapping tables are at the top of convert.c.
 *
 * Every expected tensor must be present with exactly the expected shape;
 * missing, mis-shaped and unknown tensors are errors that name the tensor
 * (shapes are printed in HF/PyTorch order, e.g. [out, in]).
 *
 * Type policy: 1-D tensors (norms, biases) and single-row matrices
 * (the confidence head) stay F32; other 2-D weights get opts.type. Q8_0
 * needs the row length (ne[0] = HF in-features) to be a multiple of 32; a
 * tensor that is not is written as F16 and a log line says so.
 *
 * The output is written to OUT.tmp and renamed over OUT on success, so a
 * failed conversion never leaves a partial file behind. */
#ifndef DSPARK_CONVERT_H
#define DSPARK_CONVERT_H

#include <stdio.h>
#include "common.h"

typedef enum { DS_CONV_KIND_AUTO = 0, DS_CONV_KIND_TARGET, DS_CONV_KIND_DRAFTER } ds_conv_kind;
typedef enum { DS_CONV_LAYOUT_DEFAULT = 0, DS_CONV_LAYOUT_DFLASH, DS_CONV_LAYOUT_DSPARK } ds_conv_layout;

typedef struct {
    const char    *in_dir;          /* required                                     */
    const char    *out_path;        /* required                                     */
    uint32_t       type;            /* DS_TYPE_F32/F16/BF16/Q8_0 for 2-D weights    */
    ds_conv_kind   kind;            /* AUTO: drafter iff config has block_size or
                                       target_layer_ids, or fc.weight exists        */
    ds_conv_layout layout;          /* drafters only; DEFAULT = dflash              */
    const char    *tokenizer_from;  /* GGUF whose tokenizer.* keys are copied; NULL:
                                       IN/tokenizer.gguf if present (required for
                                       targets, optional for drafters)              */
    const char    *name;            /* general.name; NULL: from config/dir name     */
    FILE          *log;             /* progress / notes, one line each; NULL = quiet */
} ds_convert_opts;

void ds_convert_opts_init(ds_convert_opts *o);   /* F16, AUTO, DEFAULT, rest NULL */

/* 0 on success; -1 with one error line in err (no "dspark convert:" prefix). */
int ds_convert(const ds_convert_opts *o, char *err, size_t errlen);

#endif
