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
     * the state after the run's first position - 1 (positions and
     * sequences are read on the host: host-memory backends only) */
    ds_rstate *rs = a->rs;
    const int32_t *pos = a->pos, *seq = a->rows ? a->rows->seq : NULL;
    for (int r0 = 0; r0 < M;) {
        const int sq = seq ? seq[r0] : 0;
        int r1 = r0 + 1;
        while (r1 < M && (seq ? seq[r1] : 0) == sq) r1++;
        const int n = r1 - r0, p0 = pos[r0], p1 = pos[r1 - 1];
        const float *in = p0 > 0 ? ds_rstate_at(rs, sq, p0 - 1, L->rec_idx) : NULL;
        float **conv_out = rs->ptrs, **ssm_out = rs->ptrs + rs->m_max;
        for (int t = 0; t < n; t++) {
            float *st = ds_rstate_keeps(rs, p0 + t, p1) ? ds_rstate_at(rs, sq, p0 + t, L->rec_idx) : NULL;
            conv_out[t] = st;
            ssm_out[t] = st ? st + rs->conv_n : NULL;
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
