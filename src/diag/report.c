/* report.c — diff of two captures, first-divergence report, table, JSON, SVG
 * heatmap, the probe non-perturbation gate and the identity chain.
 *
 * The diff walks both captures in canonical (row, layer, checkpoint,
 * subobject) order as a sorted merge, so "first divergence" is simply the
 * first diverged object met: for batched-vs-sequential runs that is the
 * earliest point where the two state trajectories part. Output formats are
 * line-oriented key=value so logs can be grepped and diffed across runs. */
#include "dspark_diag.h"
#include "diag/diag_json.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---------------------------------------------------------------------
 * small formatting helpers (the header promises no dependency on the rest
 * of dspark, so these stay local)
 * ------------------------------------------------------------------- */
/* %.17g with a fixed spelling of non-finite values */
static const char *fmt_double(char buf[40], double d) {
    uint64_t u; memcpy(&u, &d, 8);
    if ((u & 0x7fffffffffffffffull) > 0x7ff0000000000000ull) return "nan";
    if ((u & 0x7fffffffffffffffull) == 0x7ff0000000000000ull) return (u >> 63) ? "-inf" : "inf";
    snprintf(buf, 40, "%.17g", d);
    return buf;
}
static void xml_str(FILE *f, const char *s) {
    for (; *s; s++) {
        switch (*s) {
        case '<': fputs("&lt;", f); break;
        case '>': fputs("&gt;", f); break;
        case '&': fputs("&amp;", f); break;
        case '"': fputs("&quot;", f); break;
        case '\'': fputs("&apos;", f); break;
        default: fputc(*s, f);
        }
    }
}

/* =====================================================================
 * diff
 * =================================================================== */
void dsd_report_free(dsd_report *r) {
    if (!r) return;
    free(r->objects);
    memset(r, 0, sizeof *r);
    r->first = -1;
}

int dsd_diff(const dsd_capture *A, const dsd_capture *B, dsd_report *out) {
    if (!out) return DSD_ERR_ARG;
    memset(out, 0, sizeof *out);
    out->first = -1;
    out->max_row = -1;
    out->max_layer = -1;
    if (!A || !B) return DSD_ERR_ARG;
    if (!dsd_capture_finalized(A) || !dsd_capture_finalized(B)) return DSD_ERR_STATE;

    dsd_capture_stats sa, sb;
    dsd_capture_get_stats(A, &sa);
    dsd_capture_get_stats(B, &sb);
    out->errors_a = sa.errors;
    out->errors_b = sb.errors;

    size_t na = dsd_capture_count(A), nb = dsd_capture_count(B);
    size_t cap = na < nb ? na : nb;
    /* one object table and one percentile scratch for the whole diff, sized
     * by upper bounds, so the per-object comparisons never allocate */
    out->objects = calloc(cap ? cap : 1, sizeof *out->objects);
    if (!out->objects) return DSD_ERR_NOMEM;
    size_t maxn = 0;
    for (size_t i = 0; i < na; i++) {
        size_t n = 0;
        dsd_capture_at(A, i, NULL, NULL, &n);
        if (n > maxn) maxn = n;
    }
    double *scratch = maxn ? malloc(maxn * sizeof *scratch) : NULL;   /* NULL: compare mallocs */

    size_t i = 0, j = 0;
    while (i < na || j < nb) {
        dsd_key ka, kb;
        const float *da = NULL, *db = NULL;
        size_t la = 0, lb = 0;
        if (i < na) dsd_capture_at(A, i, &ka, &da, &la);
        if (j < nb) dsd_capture_at(B, j, &kb, &db, &lb);
        int c = i >= na ? 1 : j >= nb ? -1 : dsd_key_cmp(&ka, &kb);
        if (c < 0) { out->missing_in_b++; i++; continue; }
        if (c > 0) { out->missing_in_a++; j++; continue; }

        dsd_object_result *o = &out->objects[out->n_objects];
        o->key = ka;
        o->n_a = la;
        o->n_b = lb;
        size_t n = la < lb ? la : lb;
        /* zero-length objects may carry a NULL data pointer; compare wants
         * non-NULL, and an empty comparison is exact by definition */
        static const float empty[1] = { 0 };
        dsd_compare_ex(n ? da : empty, n ? db : empty, n, &o->m, scratch, maxn);
        o->diverged = !o->m.bit_exact || la != lb;
        if (la != lb) out->size_mismatches++;
        if (o->diverged) {
            out->diverged_objects++;
            if (out->first < 0) out->first = (int64_t)out->n_objects;
        } else {
            out->bit_exact_objects++;
        }
        if (ka.row > out->max_row) out->max_row = ka.row;
        if (ka.layer > out->max_layer) out->max_layer = ka.layer;
        out->n_objects++;
        i++; j++;
    }
    out->compared_objects = out->n_objects;
    free(scratch);
    return DSD_OK;
}

const dsd_object_result *dsd_report_first(const dsd_report *r) {
    return r && r->first >= 0 && (size_t)r->first < r->n_objects ? &r->objects[r->first] : NULL;
}

int dsd_report_identical(const dsd_report *r) {
    return r && r->first < 0 && r->compared_objects > 0 && !r->missing_in_a && !r->missing_in_b &&
           !r->errors_a && !r->errors_b;
}

/* =====================================================================
 * text report and table
 * =================================================================== */
int dsd_report_print(FILE *f, const dsd_report *r) {
    if (!f || !r) return DSD_ERR_ARG;
    const dsd_object_result *o = dsd_report_first(r);
    if (o) {
        char sb[DSD_NAME_MAX];
        fprintf(f, "FIRST_DIVERGENCE row=%d layer=%d checkpoint=%s subobject=%s compared_objects=%zu\n",
                o->key.row, o->key.layer, dsd_cp_name(o->key.cp), dsd_sub_name(o->key.sub, sb),
                r->compared_objects);
        dsd_metrics_print_kv(f, "METRICS", &o->m);
        if (o->n_a != o->n_b) fprintf(f, " size_a=%zu size_b=%zu", o->n_a, o->n_b);
        fputc('\n', f);
    } else {
        fprintf(f, "FIRST_DIVERGENCE NONE compared_objects=%zu\n", r->compared_objects);
    }
    fprintf(f, "DIFF_SUMMARY compared_objects=%zu bit_exact_objects=%zu diverged_objects=%zu "
               "missing_in_a=%zu missing_in_b=%zu size_mismatches=%zu capture_errors_a=%llu "
               "capture_errors_b=%llu\n",
            r->compared_objects, r->bit_exact_objects, r->diverged_objects, r->missing_in_a,
            r->missing_in_b, r->size_mismatches, (unsigned long long)r->errors_a,
            (unsigned long long)r->errors_b);
    return ferror(f) ? DSD_ERR_IO : DSD_OK;
}

int dsd_report_print_table(FILE *f, const dsd_report *r, int only_diverged) {
    if (!f || !r) return DSD_ERR_ARG;
    fprintf(f, "# %5s %5s %-18s %-12s %9s %10s %12s %-24s %-24s\n", "row", "layer", "checkpoint",
            "subobject", "bit_exact", "mismatch", "max_ulp", "max_abs", "rel_l2");
    for (size_t i = 0; i < r->n_objects; i++) {
        const dsd_object_result *o = &r->objects[i];
        if (only_diverged && !o->diverged) continue;
        char sb[DSD_NAME_MAX], b1[40], b2[40];
        fprintf(f, "  %5d %5d %-18s %-12s %9d %10zu %12llu %-24s %-24s%s\n", o->key.row, o->key.layer,
                dsd_cp_name(o->key.cp), dsd_sub_name(o->key.sub, sb), !o->diverged, o->m.mismatch_count,
                (unsigned long long)o->m.max_ulp, fmt_double(b1, o->m.max_abs),
                fmt_double(b2, o->m.rel_l2),
                (int64_t)i == r->first ? " <- FIRST_DIVERGENCE" : o->n_a != o->n_b ? " (size mismatch)" : "");
    }
    return ferror(f) ? DSD_ERR_IO : DSD_OK;
}

/* =====================================================================
 * JSON
 * =================================================================== */
static cJSON *json_object(const dsd_object_result *o) {
    char sb[DSD_NAME_MAX];
    cJSON *j = cJSON_CreateObject();
    if (!j) return NULL;
    cJSON_AddNumberToObject(j, "row", o->key.row);
    cJSON_AddNumberToObject(j, "layer", o->key.layer);
    cJSON_AddStringToObject(j, "checkpoint", dsd_cp_name(o->key.cp));
    cJSON_AddStringToObject(j, "subobject", dsd_sub_name(o->key.sub, sb));
    cJSON_AddNumberToObject(j, "n_a", (double)o->n_a);
    cJSON_AddNumberToObject(j, "n_b", (double)o->n_b);
    cJSON_AddBoolToObject(j, "diverged", o->diverged);
    cJSON_AddItemToObject(j, "metrics", dsd_metrics_cjson(&o->m));
    return j;
}

cJSON *dsd_report_cjson(const dsd_report *r) {
    cJSON *j = cJSON_CreateObject();
    if (!j) return NULL;
    const dsd_object_result *first = dsd_report_first(r);
    if (first) cJSON_AddItemToObject(j, "first_divergence", json_object(first));
    else cJSON_AddNullToObject(j, "first_divergence");
    cJSON_AddNumberToObject(j, "compared_objects", (double)r->compared_objects);
    cJSON_AddNumberToObject(j, "bit_exact_objects", (double)r->bit_exact_objects);
    cJSON_AddNumberToObject(j, "diverged_objects", (double)r->diverged_objects);
    cJSON_AddNumberToObject(j, "missing_in_a", (double)r->missing_in_a);
    cJSON_AddNumberToObject(j, "missing_in_b", (double)r->missing_in_b);
    cJSON_AddNumberToObject(j, "size_mismatches", (double)r->size_mismatches);
    cJSON_AddNumberToObject(j, "capture_errors_a", (double)r->errors_a);
    cJSON_AddNumberToObject(j, "capture_errors_b", (double)r->errors_b);
    cJSON *objs = cJSON_AddArrayToObject(j, "objects");
    for (size_t i = 0; objs && i < r->n_objects; i++) cJSON_AddItemToArray(objs, json_object(&r->objects[i]));
    return j;
}

int dsd_report_json(FILE *f, const dsd_report *r) {
    if (!f || !r) return DSD_ERR_ARG;
    cJSON *j = dsd_report_cjson(r);
    int rc = dsd_cjson_write(f, j);
    cJSON_Delete(j);
    return rc;
}

/* =====================================================================
 * SVG heatmap
 * =================================================================== */
#define SVG_SCALE_MAX 24.0   /* log2(ULP+1) at the top colour: fixed, so two
                                heatmaps are comparable by eye */
#define SVG_CELL_W 46
#define SVG_CELL_H 18
#define SVG_LEFT   84
#define SVG_TOP    170
#define SVG_NCOL   (DSD_CP_COUNT - 1)      /* checkpoints 1..14 */

typedef struct {
    size_t   objects, diverged;
    int      undefined;    /* NaN mismatch or size mismatch: no ULP number  */
    uint64_t max_ulp;
} svg_cell;

/* viridis, reversed so small errors are light and large ones dark */
static void palette(double t, char out[8]) {
    static const double stops[5][3] = {
        {253, 231, 37}, {94, 201, 98}, {33, 145, 140}, {59, 82, 139}, {68, 1, 84},
    };
    if (!(t > 0.0)) t = 0.0;
    if (t > 1.0) t = 1.0;
    double x = t * 4.0;
    int k = (int)x;
    if (k > 3) k = 3;
    double u = x - k;
    int rgb[3];
    for (int c = 0; c < 3; c++) rgb[c] = (int)(stops[k][c] + (stops[k + 1][c] - stops[k][c]) * u + 0.5);
    snprintf(out, 8, "#%02x%02x%02x", rgb[0], rgb[1], rgb[2]);
}
static double ulp_level(uint64_t ulp) { return log2((double)ulp + 1.0); }

int dsd_report_svg(FILE *f, const dsd_report *r, int32_t row) {
    if (!f || !r) return DSD_ERR_ARG;
    int nlayers = r->max_layer + 1;
    int has_post = 0;
    for (size_t i = 0; i < r->n_objects; i++)
        if (r->objects[i].key.layer < 0) has_post = 1;
    int nrows = nlayers + has_post;
    if (nrows < 1) nrows = 1;
    svg_cell *cells = calloc((size_t)nrows * SVG_NCOL, sizeof *cells);
    if (!cells) return DSD_ERR_NOMEM;

    /* aggregate: max over subobjects (and over rows for DSD_ALL_ROWS) */
    for (size_t i = 0; i < r->n_objects; i++) {
        const dsd_object_result *o = &r->objects[i];
        if (row != DSD_ALL_ROWS && o->key.row != row) continue;
        if (o->key.cp < 1 || o->key.cp >= DSD_CP_COUNT) continue;
        int y = o->key.layer < 0 ? nlayers : o->key.layer;
        svg_cell *c = &cells[(size_t)y * SVG_NCOL + (o->key.cp - 1)];
        c->objects++;
        if (!o->diverged) continue;
        c->diverged++;
        if (o->m.metrics_undefined || o->n_a != o->n_b) c->undefined = 1;
        if (o->m.max_ulp > c->max_ulp) c->max_ulp = o->m.max_ulp;
    }
    const dsd_object_result *first = dsd_report_first(r);
    int fx = -1, fy = -1;
    if (first && (row == DSD_ALL_ROWS || first->key.row == row)) {
        fx = (int)first->key.cp - 1;
        fy = first->key.layer < 0 ? nlayers : first->key.layer;
    }

    int grid_w = SVG_NCOL * SVG_CELL_W, grid_h = nrows * SVG_CELL_H;
    int legend_x = SVG_LEFT + grid_w + 30;
    int width = legend_x + 230;
    int height = SVG_TOP + grid_h + 40;
    if (height < SVG_TOP + 330) height = SVG_TOP + 330;   /* room for the legend */

    fprintf(f, "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
               "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" "
               "viewBox=\"0 0 %d %d\" font-family=\"monospace\" font-size=\"11\">\n",
            width, height, width, height);
    fprintf(f, "<rect x=\"0\" y=\"0\" width=\"%d\" height=\"%d\" fill=\"#ffffff\"/>\n", width, height);

    /* title: what is shown and where the first divergence is */
    char title[256], sb[DSD_NAME_MAX];
    if (row == DSD_ALL_ROWS) snprintf(title, sizeof title, "dspark first-divergence heatmap: max over rows 0..%d", r->max_row);
    else snprintf(title, sizeof title, "dspark first-divergence heatmap: row %d", row);
    fprintf(f, "<text x=\"10\" y=\"20\" font-size=\"15\" font-weight=\"bold\">");
    xml_str(f, title);
    fputs("</text>\n", f);
    char sub[256];
    if (first)
        snprintf(sub, sizeof sub, "FIRST_DIVERGENCE row=%d layer=%d checkpoint=%s subobject=%s compared_objects=%zu",
                 first->key.row, first->key.layer, dsd_cp_name(first->key.cp),
                 dsd_sub_name(first->key.sub, sb), r->compared_objects);
    else
        snprintf(sub, sizeof sub, "FIRST_DIVERGENCE NONE compared_objects=%zu", r->compared_objects);
    fprintf(f, "<text x=\"10\" y=\"38\">");
    xml_str(f, sub);
    fputs("</text>\n", f);

    /* axis labels: checkpoint names rotated above the columns, layers left */
    fprintf(f, "<text x=\"%d\" y=\"%d\" font-weight=\"bold\">checkpoint</text>\n", SVG_LEFT, 58);
    for (int x = 0; x < SVG_NCOL; x++) {
        int cx = SVG_LEFT + x * SVG_CELL_W + SVG_CELL_W / 2;
        fprintf(f, "<text x=\"%d\" y=\"%d\" transform=\"rotate(-55 %d %d)\">", cx, SVG_TOP - 6, cx, SVG_TOP - 6);
        xml_str(f, dsd_cp_name((uint32_t)x + 1));
        fputs("</text>\n", f);
    }
    fprintf(f, "<text x=\"10\" y=\"%d\" font-weight=\"bold\">layer</text>\n", SVG_TOP - 6);
    for (int y = 0; y < nrows; y++) {
        int cy = SVG_TOP + y * SVG_CELL_H + SVG_CELL_H - 5;
        if (y < nlayers) fprintf(f, "<text x=\"10\" y=\"%d\">layer %d</text>\n", cy, y);
        else fprintf(f, "<text x=\"10\" y=\"%d\">post</text>\n", cy);
    }

    /* cells */
    for (int y = 0; y < nrows; y++) {
        for (int x = 0; x < SVG_NCOL; x++) {
            const svg_cell *c = &cells[(size_t)y * SVG_NCOL + x];
            char fill[8];
            const char *stroke = "#ffffff";
            if (!c->objects) { strcpy(fill, "#ffffff"); stroke = "#e0e0e0"; }
            else if (!c->diverged) strcpy(fill, "#bdbdbd");
            else if (c->undefined) strcpy(fill, "#000000");
            else palette(ulp_level(c->max_ulp) / SVG_SCALE_MAX, fill);
            int px = SVG_LEFT + x * SVG_CELL_W, py = SVG_TOP + y * SVG_CELL_H;
            fprintf(f, "<rect x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" fill=\"%s\" stroke=\"%s\">",
                    px, py, SVG_CELL_W, SVG_CELL_H, fill, stroke);
            char tip[256];
            char layer_s[24];
            if (y < nlayers) snprintf(layer_s, sizeof layer_s, "layer %d", y);
            else snprintf(layer_s, sizeof layer_s, "post");
            snprintf(tip, sizeof tip, "%s %s: objects=%zu diverged=%zu max_ulp=%llu%s", layer_s,
                     dsd_cp_name((uint32_t)x + 1), c->objects, c->diverged,
                     (unsigned long long)c->max_ulp, c->undefined ? " (NaN or size mismatch)" : "");
            fputs("<title>", f);
            xml_str(f, tip);
            fputs("</title></rect>\n", f);
        }
    }
    if (fx >= 0 && fy >= 0 && fy < nrows)
        fprintf(f, "<rect x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" fill=\"none\" stroke=\"#ff0000\" "
                   "stroke-width=\"3\"><title>first divergence</title></rect>\n",
                SVG_LEFT + fx * SVG_CELL_W, SVG_TOP + fy * SVG_CELL_H, SVG_CELL_W, SVG_CELL_H);

    /* legend: fixed scale so heatmaps from different runs compare by eye */
    int ly = SVG_TOP;
    fprintf(f, "<text x=\"%d\" y=\"%d\" font-weight=\"bold\">colour = log2(max ULP + 1)</text>\n", legend_x, ly - 6);
    static const int levels[] = { 1, 4, 8, 12, 16, 20, 24 };
    for (size_t k = 0; k < sizeof levels / sizeof levels[0]; k++) {
        char fill[8];
        palette(levels[k] / SVG_SCALE_MAX, fill);
        int yy = ly + (int)k * 20;
        unsigned long long ulp = (1ull << levels[k]) - 1;
        fprintf(f, "<rect x=\"%d\" y=\"%d\" width=\"28\" height=\"16\" fill=\"%s\"/>"
                   "<text x=\"%d\" y=\"%d\">%2d  (%s%llu ULP)</text>\n",
                legend_x, yy, fill, legend_x + 36, yy + 12, levels[k],
                levels[k] == 24 ? ">=" : "", ulp);
    }
    int yy = ly + 7 * 20 + 8;
    fprintf(f, "<rect x=\"%d\" y=\"%d\" width=\"28\" height=\"16\" fill=\"#bdbdbd\"/>"
               "<text x=\"%d\" y=\"%d\">bit-exact</text>\n", legend_x, yy, legend_x + 36, yy + 12);
    yy += 20;
    fprintf(f, "<rect x=\"%d\" y=\"%d\" width=\"28\" height=\"16\" fill=\"#000000\"/>"
               "<text x=\"%d\" y=\"%d\">NaN / size mismatch</text>\n", legend_x, yy, legend_x + 36, yy + 12);
    yy += 20;
    fprintf(f, "<rect x=\"%d\" y=\"%d\" width=\"28\" height=\"16\" fill=\"#ffffff\" stroke=\"#e0e0e0\"/>"
               "<text x=\"%d\" y=\"%d\">not captured</text>\n", legend_x, yy, legend_x + 36, yy + 12);
    yy += 20;
    fprintf(f, "<rect x=\"%d\" y=\"%d\" width=\"28\" height=\"16\" fill=\"none\" stroke=\"#ff0000\" stroke-width=\"3\"/>"
               "<text x=\"%d\" y=\"%d\">first divergence</text>\n", legend_x, yy, legend_x + 36, yy + 12);
    fputs("</svg>\n", f);
    free(cells);
    return ferror(f) ? DSD_ERR_IO : DSD_OK;
}

/* =====================================================================
 * gate and chain
 * =================================================================== */
int dsd_gate_print(FILE *f, int control_pass, int probe_pass) {
    int ok = control_pass && probe_pass;
    if (f) {
        fprintf(f, "GATE_CONTROL A0_vs_A1 %s\n", control_pass ? "PASS" : "FAIL");
        fprintf(f, "GATE_PROBE A0_vs_A2 %s\n", probe_pass ? "PASS" : "FAIL");
        fprintf(f, "GATE_RESULT %s\n", ok ? "PASS" : "FAIL");
    }
    return ok;
}

static const char *const CHAIN_NAMES[DSD_CHAIN_COUNT] = {
    "operator_identity", "future_visible_state_identity", "logit_identity",
    "greedy_token_identity", "byte_identity",
};
const char *dsd_chain_name(dsd_chain c) {
    return (unsigned)c < DSD_CHAIN_COUNT ? CHAIN_NAMES[c] : "chain?";
}

dsd_chain dsd_cp_chain(uint32_t cp) {
    switch (cp) {
    case DSD_CP_KV_WRITE: case DSD_CP_TAP: return DSD_CHAIN_STATE;
    case DSD_CP_LOGITS: return DSD_CHAIN_LOGITS;
    default: return DSD_CHAIN_OPERATOR;
    }
}

int dsd_chain_print(FILE *f, const int status[DSD_CHAIN_COUNT]) {
    int first = DSD_CHAIN_COUNT;
    if (!status) return first;
    for (int c = 0; c < DSD_CHAIN_COUNT; c++)
        if (status[c] == 0 && first == DSD_CHAIN_COUNT) first = c;
    if (f) {
        fputs("CHAIN", f);
        for (int c = 0; c < DSD_CHAIN_COUNT; c++)
            fprintf(f, " %s=%s", CHAIN_NAMES[c], status[c] > 0 ? "PASS" : status[c] == 0 ? "FAIL" : "UNTESTED");
        fprintf(f, " first_break=%s\n", first < DSD_CHAIN_COUNT ? CHAIN_NAMES[first] : "NONE");
    }
    return first;
}
