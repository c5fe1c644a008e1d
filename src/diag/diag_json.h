/* diag_json.h — the diagnostics' JSON as cJSON trees (private to dspark:
 * the public dspark_diag.h stays free of cJSON). dsd_metrics_json and
 * dsd_report_json print these; `dspark diverge --json` embeds them next to
 * the gate and identity-chain results. Non-finite numbers become null. */
#ifndef DSPARK_DIAG_JSON_H
#define DSPARK_DIAG_JSON_H

#include "dspark_diag.h"
#include <cjson/cJSON.h>

cJSON *dsd_metrics_cjson(const dsd_metrics *m);
cJSON *dsd_report_cjson(const dsd_report *r);
/* Print tree unformatted + '\n' to f; frees nothing. DSD_OK or DSD_ERR_IO. */
int dsd_cjson_write(FILE *f, const cJSON *tree);

#endif
