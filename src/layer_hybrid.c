/* layer_hybrid.c — the recurrent mixer of qwen35's gated delta net layers.
 *
 *   xn ─ ssm_qkv / ssm_z / ssm_alpha / ssm_beta   (one shared-input launch)
 *   qkv ─ causal conv + SiLU  (gdn family; the conv window from the state)
 *   q, k L2 norms, gates, recurrence              (gdn family; the state)
 *   out ─ per-head RMSNorm(ssm_norm) ─ * silu(z)  (rmsnorm, swiglu families)
 *   ─ ssm_out ─> a->o                             (the layer's residual follows)
 *
 * The conv and the recurrence run per sequence: the rows of one forward are
 * runs of consecutive positions of one sequence each (engine.h), and a run
 * starts from the state its sequence holds after the position before it.
 * Each row's state is kept in the sequence's ring when the row is among the
 * run's last `ring` rows (rstate.h), so a verify block's rows can be rolled
 * back to any of them. Why the bits are a row's own: the projections are
 * canonical matmuls, the gdn family's canonical call is decode's arithmetic
 * position after position (the state after row t is decode's after the
 * same tokens), and the norm and gate are row-wise families. */
#include "layer.h"
#include "rstate.h"
#include "dspark_diag.h"

#define FAM(f) (1u << (f))

static int wants(const ds_probe *pr, int layer, int cp) {
    return pr && pr->fn && (!pr->wants || pr->wants(pr->user, layer, cp));
}

void ds_layer_gdn_mixer(ds_exec *ex, const ds_layer *L, const ds_layer_shape *s, const uint8_t var[DS_FAM_COUNT],
                        int M, int pos0, ds_acts *a, const ds_probe *pr, int l) {
    const ds_backend_i *b = ex->be->i;
    const ds_gdn_shape *g = &s->gdn;
    const size_t C = (size_t)g->conv_dim, Hv = (size_t)g->n_v_head, S = (size_t)g->head_dim, vd = Hv * S;
    const size_t m = (size_t)M;
    /* scratch: X (conv input) | XC (conv output) | Z | AL | BE | O | N */
    float *X = a->rec, *XC = X + m * C, *Z = XC + m * C, *AL = Z + m * vd, *BE = AL + m * Hv;
    float *O = BE + m * Hv, *N = O + m * vd;
    const ds_variant vg = (ds_variant)var[DS_FAM_GDN];

    const ds_weight *const w4[4] = {&L->ssm_qkv, &L->ssm_z, &L->ssm_alpha, &L->ssm_beta};
    float *const y4[4] = {X, Z, AL, BE};
    ds_layer_mm_shared(ex, var, 4, w4, M, a->xn, y4);
    const unsigned f_proj = FAM(ds_matmul_family(L->ssm_qkv.type)) | FAM(ds_matmul_family(L->ssm_z.type)) |
                            FAM(ds_matmul_family(L->ssm_alpha.type)) | FAM(ds_matmul_family(L->ssm_beta.type));
    if (wants(pr, l, DSD_CP_QKV)) {
        ds_probe_rows(ex, pr, M, pos0, l, DSD_CP_QKV, DSD_SUB_Q_PROJ, FAM(ds_matmul_family(L->ssm_qkv.type)), X, C, C);
        ds_probe_rows(ex, pr, M, pos0, l, DSD_CP_QKV, DSD_SUB_K_PROJ, FAM(ds_matmul_family(L->ssm_z.type)), Z, vd, vd);
    }

    /* per run of one sequence's rows: the conv, then the recurrence, from
     * the sequence's current state into its other buffer (rstate.h), the
     * run's inputs logged for a rollback when it is a verify-sized run
     * (positions and sequences are read on the host: host-memory backends
     * only) */
    ds_rstate *rs = a->rs;
    const int32_t *pos = a->pos, *seq = a->rows ? a->rows->seq : NULL;
    for (int r0 = 0; r0 < M;) {
        const int sq = seq ? seq[r0] : 0;
        int r1 = r0 + 1;
        while (r1 < M && (seq ? seq[r1] : 0) == sq) r1++;
        const int n = r1 - r0, p0 = pos[r0];
        const float *in = p0 > 0 ? ds_rstate_cur(rs, sq, L->rec_idx) : NULL;
        float *nx = ds_rstate_next(rs, sq, L->rec_idx);
        float **conv_out = rs->ptrs, **ssm_out = rs->ptrs + rs->m_max;
        for (int t = 0; t < n; t++) conv_out[t] = ssm_out[t] = NULL;
        conv_out[n - 1] = nx;
        ssm_out[n - 1] = nx + rs->conv_n;
        if (n <= rs->cap)
            for (int t = 0; t < n; t++) {
                float *lg = ds_rstate_log(rs, sq, L->rec_idx, t);
                b->copy(ex, lg, X + (size_t)(r0 + t) * C, C * sizeof(float));
                b->copy(ex, lg + C, AL + (size_t)(r0 + t) * Hv, Hv * sizeof(float));
                b->copy(ex, lg + C + Hv, BE + (size_t)(r0 + t) * Hv, Hv * sizeof(float));
            }
        b->gdn_conv(ex, vg, g, n, X + (size_t)r0 * C, L->conv_w, in, conv_out, XC + (size_t)r0 * C);
        b->gdn_recur(ex, vg, g, n, XC + (size_t)r0 * C, AL + (size_t)r0 * Hv, BE + (size_t)r0 * Hv, L->dt_bias,
                     L->ssm_a, in ? in + rs->conv_n : NULL, ssm_out, O + (size_t)r0 * vd);
        r0 = r1;
    }
    /* the conv output is reported after the recurrence has normalised q and
     * k in place: it is the recurrence's input, exactly what it read */
    if (wants(pr, l, DSD_CP_ATTN_HEADS)) {
        ds_probe_rows(ex, pr, M, pos0, l, DSD_CP_ATTN_HEADS, DSD_SUB_GDN_CONV, FAM(DS_FAM_GDN) | f_proj, XC, C, C);
        ds_probe_rows(ex, pr, M, pos0, l, DSD_CP_ATTN_HEADS, DSD_SUB_GDN_OUT, FAM(DS_FAM_GDN), O, vd, vd);
    }
    /* gated norm: RMSNorm per head, then times silu(z) (SwiGLU's form) */
    b->rmsnorm(ex, (ds_variant)var[DS_FAM_RMSNORM], M * (int)Hv, (int)S, O, L->ssm_norm, s->eps, N);
    b->swiglu(ex, (ds_variant)var[DS_FAM_SWIGLU], M, (int)vd, Z, N, O);
    b->matmul(ex, (ds_variant)var[ds_matmul_family(L->ssm_out.type)], &L->ssm_out, M, O, a->o);
    if (wants(pr, l, DSD_CP_ATTN_OUT_PROJ))
        ds_probe_rows(ex, pr, M, pos0, l, DSD_CP_ATTN_OUT_PROJ, DSD_SUB_ALL, FAM(ds_matmul_family(L->ssm_out.type)),
                      a->o, (size_t)s->d, (size_t)s->d);
}

/* ========================================================================
 * Rollback: the state after n positions from the checkpoint and the log
 * ======================================================================== */

int ds_gdn_rewind(ds_exec *ex, const ds_layer *layers, int n_layer, const ds_layer_shape *s, ds_acts *a, int sq, int n,
                  char *err, size_t errlen) {
    ds_rstate *rs = a->rs;
    if (n == rs->pos[sq]) return 0;
    if (!ds_rstate_has(rs, sq, n)) {
        if (rs->pos[sq] > 0)
            ds_errf(err, errlen, "recurrent state: sequence %d holds the state after %d positions and can go back to %d%s, not %d",
                    sq, rs->pos[sq], rs->base[sq], rs->n_log[sq] > 0 ? " or replay up from there" : "", n);
        else
            ds_errf(err, errlen, "recurrent state: sequence %d holds no state, not the one after %d positions", sq, n);
        return -1;
    }
    if (n == 0) { ds_rstate_reset(rs, sq); return 0; }
    if (n == rs->base[sq]) {             /* the checkpoint itself */
        rs->cur[sq] = !rs->cur[sq];
        rs->pos[sq] = n;
        rs->n_log[sq] = 0;
        return 0;
    }
    /* replay rows [base, n) from the checkpoint into the current buffer with
     * the variant the run used: canonical rows are decode's rows */
    const ds_backend_i *b = ex->be->i;
    const ds_gdn_shape *g = &s->gdn;
    const size_t C = (size_t)g->conv_dim, Hv = (size_t)g->n_v_head;
    const int k = n - rs->base[sq], ck = !rs->cur[sq];
    const ds_variant vg = (ds_variant)rs->var[sq];
    float *X = a->rec, *XC = X + (size_t)k * C, *AL = XC + (size_t)k * C, *BE = AL + (size_t)k * Hv, *O = BE + (size_t)k * Hv;
    float **conv_out = rs->ptrs, **ssm_out = rs->ptrs + rs->m_max;
    for (int l = 0; l < n_layer; l++) {
        const ds_layer *L = &layers[l];
        if (!L->recur) continue;
        for (int t = 0; t < k; t++) {
            const float *lg = ds_rstate_log(rs, sq, L->rec_idx, t);
            b->copy(ex, X + (size_t)t * C, lg, C * sizeof(float));
            b->copy(ex, AL + (size_t)t * Hv, lg + C, Hv * sizeof(float));
            b->copy(ex, BE + (size_t)t * Hv, lg + C + Hv, Hv * sizeof(float));
            conv_out[t] = ssm_out[t] = NULL;
        }
        const float *in = rs->base[sq] > 0 ? ds_rstate_buf(rs, sq, ck, L->rec_idx) : NULL;
        float *cur = ds_rstate_cur(rs, sq, L->rec_idx);
        conv_out[k - 1] = cur;
        ssm_out[k - 1] = cur + rs->conv_n;
        b->gdn_conv(ex, vg, g, k, X, L->conv_w, in, conv_out, XC);
        b->gdn_recur(ex, vg, g, k, XC, AL, BE, L->dt_bias, L->ssm_a, in ? in + rs->conv_n : NULL, ssm_out, O);
    }
    rs->pos[sq] = n;
    rs->n_log[sq] = k;
    return 0;
}
