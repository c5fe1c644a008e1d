/* api_internal.h — what api.c shares with api_engine.c (not exported: the
 * library's map keeps ds_* local). */
#ifndef DSPARK_API_INTERNAL_H
#define DSPARK_API_INTERNAL_H

#include "dspark.h"
#include "drafter.h"
#include "lproc.h"
#include "model.h"

const ds_model *ds_api_model(const dspark_model *dm);
const ds_drafter *ds_api_drafter(const dspark_model *dm);
void ds_api_set_err(dspark_error *e, dspark_status code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* The request's parameters checked against the model (use_spec: the
 * speculative ones too). */
dspark_status ds_api_check_params(const dspark_model *dm, const dspark_gen_params *p, int use_spec, dspark_error *err);
/* The chain of logits processors a request asks for: NULL with *rc OK when
 * it asks for none, NULL with *rc and err on failure. */
ds_lchain *ds_api_make_chain(const dspark_model *dm, const dspark_gen_params *p, dspark_status *rc, dspark_error *err);

#endif
