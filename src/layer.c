/* layer.c — one decoder layer over M rows, on any backend.
 *
 *   xn ─ q/k/v proj ─ QK-norm ─ RoPE ─ KV write ─ attention ─ o proj
 *    x += o ; xn = ffn_norm(x)                  (residual epilogue)
 *   xn ─ gate/up ─ SwiGLU ─ down
 *    x += down ; xn = next_norm(x)              (residual epilogue)
 *
 * The target runs it causally over prompt and verify rows; the drafter runs
 * it non-causally over its block. Every family's variant comes from var[],
 * so decode (all canonical, M = 1) and a canonical batch execute the same
 * per-row instruction sequences — the exactness contract by construction. */
#include "layer.h"
#include "dspark_diag.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#define FAM(f) (1u << (f))

/* Hands the arena's pending rows to fn() in enqueue order from the host
 * copy, and empties the arena. */
static void arena_deliver(const ds_probe *pr) {
    ds_probe_arena *a = pr->arena;
    for (size_t i = 0; i < a->n_rec; i++) {
        const ds_probe_rec *r = &a->rec[i];
        pr->fn(pr->user, r->pos, r->layer, r->cp, r->sub, r->fams, a->host + r->off, r->n);
    }
    a->used = a->n_rec = 0;
}

void ds_probe_rows(ds_exec *ex, const ds_probe *pr, int M, int pos0, int layer, int cp, int sub,
                   unsigned fams, const float *base, size_t stride, size_t n) {
    const ds_backend_i *b = ex->be->i;
    ds_probe_arena *a = pr->arena;
    if (a && M > 0) {
        const size_t need = (size_t)M * n;
        /* Full: deliver what is pending first (a mid-pass download; the
         * owner's sizing makes it rare), so that no row is lost or
         * reordered. A device fault in that download stays noted on ex for
         * the forward's own synchronisation to report. */
        if ((need > a->cap - a->used || (size_t)M > a->rec_cap - a->n_rec) && a->n_rec) {
            b->download(ex, a->host, a->dev, a->used * sizeof(float));
            a->downloads++;
            a->early++;
            arena_deliver(pr);
        }
        if (need <= a->cap - a->used && (size_t)M <= a->rec_cap - a->n_rec) {
            /* Enqueued on the forward's stream: the copy reads the rows
             * before any later kernel can overwrite them, and the host waits
             * for nothing until ds_probe_flush. */
            float *dst = a->dev + a->used;
            if (stride == n) b->copy(ex, dst, base, need * sizeof(float));
            else ds_backend_copy2d(ex, dst, n * sizeof(float), base, stride * sizeof(float), n * sizeof(float), (size_t)M);
            for (int r = 0; r < M; r++)
                a->rec[a->n_rec++] = (ds_probe_rec){ pos0 + r, layer, cp, sub, fams, a->used + (size_t)r * n, n };
            a->used += need;
            return;
        }
        /* one checkpoint wider than the whole arena: reported row by row */
    }
    for (int r = 0; r < M; r++) {
        const float *row = base + (size_t)r * stride;
        if (!b->host_memory) {
            b->download(ex, pr->stage, row, n * sizeof(float));
            row = pr->stage;
        }
        pr->fn(pr->user, pos0 + r, layer, cp, sub, fams, row, n);
    }
}

int ds_probe_arena_init(ds_probe_arena *a, ds_backend *be, size_t floats, size_t rows, char *err,
                        size_t errlen) {
    memset(a, 0, sizeof *a);
    if (!be || floats == 0 || rows == 0 || floats > SIZE_MAX / 2 / sizeof(float) ||
        rows > SIZE_MAX / 2 / sizeof(ds_probe_rec)) {
        ds_errf(err, errlen, "probe arena: bad size (%zu floats, %zu rows)", floats, rows);
        return -1;
    }
    a->be = be;
    a->host = malloc(floats * sizeof(float));
    a->rec = malloc(rows * sizeof(ds_probe_rec));
    a->dev = a->host && a->rec ? be->i->alloc(be, floats * sizeof(float)) : NULL;
    if (!a->dev) {
        ds_errf(err, errlen, "probe arena: out of memory for %zu MiB on %s",
                (floats * sizeof(float)) >> 20, be->i->name);
        ds_probe_arena_free(a);
        return -1;
    }
    a->cap = floats;
    a->rec_cap = rows;
    return 0;
}

void ds_probe_arena_free(ds_probe_arena *a) {
    if (a->dev) a->be->i->release(a->be, a->dev);
    free(a->host);
    free(a->rec);
    memset(a, 0, sizeof *a);
}

int ds_probe_flush(ds_exec *ex, const ds_probe *pr, char *err, size_t errlen) {
    ds_probe_arena *a = pr ? pr->arena : NULL;
    if (!a || !a->n_rec) return 0;
    const ds_backend_i *b = ex->be->i;
    /* one download after the stream has run the whole pass; the sync turns
     * a device fault into an error instead of rows of garbage */
    b->download(ex, a->host, a->dev, a->used * sizeof(float));
    a->downloads++;
    if (b->sync(ex, err, errlen)) {
        a->used = a->n_rec = 0;
        return -1;
    }
    arena_deliver(pr);
    return 0;
}

static int wants(const ds_probe *pr, int layer, int cp) {
    return pr && pr->fn && (!pr->wants || pr->wants(pr->user, layer, cp));
}

/* Weights sharing their input (q/k/v, gate/up) as one launch when the
 * backend has matmul_multi and they run one variant (one type); else one by
 * one. Either way the same bits. */
static void mm_shared(ds_exec *ex, const uint8_t var[DS_FAM_COUNT], int n, const ds_weight *const W[],
                      int M, const float *x, float *const y[]) {
    const ds_backend_i *b = ex->be->i;
    const int fam = ds_matmul_family(W[0]->type);
    int one = b->matmul_multi != NULL;
    for (int i = 1; one && i < n; i++) one = ds_matmul_family(W[i]->type) == fam;
    if (one) {
        b->matmul_multi(ex, (ds_variant)var[fam], n, W, M, x, y);
        return;
    }
    for (int i = 0; i < n; i++) b->matmul(ex, (ds_variant)var[ds_matmul_family(W[i]->type)], W[i], M, x, y[i]);
}

/* ========================================================================
 * Mixture of experts (qwen3moe): router -> moe_route -> experts -> combine
 * ======================================================================== */

ds_weight *ds_layer_weight(ds_layer *L, int i) {
    if (i < 0) return NULL;
    if (L->ds4) {     /* deepseek4: its attention and hyper-connection weights, the output groups */
        ds_weight *const att[6] = {&L->wq_a, &L->wq_b, &L->wkv, &L->wo_b, &L->hc_attn_fn, &L->hc_ffn_fn};
        if (i < 6) return att[i];
        i -= 6;
        if (i < L->n_groups) return &L->wo_a[i];
        i -= L->n_groups;
        if (L->comp_ratio) {   /* a compressed layer's compressor */
            if (i < 2) return i ? &L->comp_gate : &L->comp_kv;
            i -= 2;
        }
        if (L->comp_ratio == 4) {   /* and a CSA layer's indexer */
            ds_weight *const ix[4] = {&L->idx_proj, &L->idx_q_b, &L->idx_kv, &L->idx_gate};
            if (i < 4) return ix[i];
            i -= 4;
        }
    } else if (L->recur) {   /* a gated delta net layer has its mixer's weights instead of q/k/v/o */
        ds_weight *const rec[5] = {&L->ssm_qkv, &L->ssm_z, &L->ssm_alpha, &L->ssm_beta, &L->ssm_out};
        if (i < 5) return rec[i];
        i -= 5;
    } else {
        ds_weight *const att[4] = {&L->wq, &L->wk, &L->wv, &L->wo};
        if (i < 4) return att[i];
        i -= 4;
    }
    if (L->n_expert <= 0) {
        ds_weight *const ffn[3] = {&L->w_gate, &L->w_up, &L->w_down};
        return i < 3 ? ffn[i] : NULL;
    }
    if (i == 0) return &L->gate_inp;
    i -= 1;
    if (!L->exp_gate) return NULL;
    if (i >= 3 * L->n_expert) {
        ds_weight *const sh[4] = {&L->sh_gate_inp, &L->sh_gate, &L->sh_up, &L->sh_down};
        i -= 3 * L->n_expert;
        if (L->has_shexp == 2) i++;   /* ungated (deepseek4): no sh_gate_inp */
        return L->has_shexp && i < 4 ? sh[i] : NULL;
    }
    ds_weight *const e[3] = {L->exp_gate, L->exp_up, L->exp_down};
    return &e[i % 3][i / 3];
}

/* Scratch layout, floats from a->moe (m rows, E experts, k used, n_ff_exp f,
 * n_ff_shexp fs):
 *   logits [m][E] | w [m][k] | ids [m][k] | slot [m][k] | probe [m][2k] |
 *   X [m k][d] | G [m k][f] | U [m k][f] | H [m k][f] | Y [m k][d] |
 *   shared expert: gate logit [m] | G, U, H [m][fs] | out [m][d]
 * ids and slot hold int32 (same size as a float; only ever read as int32). */
size_t ds_moe_scratch_floats(int m_max, int n_expert, int k, int d, int n_ff_exp, int n_ff_shexp) {
    if (n_expert <= 0) return 0;
    const size_t m = (size_t)m_max, mk = m * (size_t)k;
    const size_t sh = n_ff_shexp > 0 ? m + 3 * m * (size_t)n_ff_shexp + m * (size_t)d : 0;
    return m * (size_t)n_expert + 3 * mk + 2 * mk + 2 * mk * (size_t)d + 3 * mk * (size_t)n_ff_exp + sh;
}

/* Host staging layout (ds_acts.moe_host, device backends):
 *   ids [m k] | slot [m k] | probe [m][2k] | w [m k]   (int32 / float words) */
size_t ds_moe_host_words(int m_max, int k) {
    return 5 * (size_t)m_max * (size_t)k;
}

/* ---- the device-side expert path ---------------------------------------------
 * Where the backend has matmul_id for all three expert arrays (L->exp_id),
 * every expert family runs canonical (matmul_id is canonical only; SwiGLU's
 * canonical rows are the grouped call's rows whatever the row count) and
 * the route is the softmax one (deepseek4's gating, its hash layers and
 * its SwiGLU clamp run on host memory only), the assignments are computed
 * one by one, each reading its expert on the device: gate and up of
 * assignment i = r k + j from row r of xn, SwiGLU over the M k rows, down
 * of row i, then moe_combine with the identity slots. Each assignment is
 * the one-row canonical matmul of its expert, which is exactly its row of
 * the grouped call (canonical rows are M-invariant): the same bits, no
 * host read of the ids.
 *
 * Why at most DS_MOE_ID_MAX = 64 assignments: the path reads an expert's
 * weights once per assignment, the grouping once per distinct expert (the
 * CUDA kernels run one row group of every assignment side by side, so a
 * repeated expert's rows mostly come from L2 — still reads, instructions and
 * L2 bandwidth per assignment). With
 * 128 experts and 8 used (the 30B-A3B shape), 64 assignments (8 rows:
 * decode with 7 drafts, a verify of 8) of independently routed rows hit
 * ~50 distinct experts: ~14 extra expert reads (~70 MB a layer at Q8_0,
 * ~15 us at 4.8 TB/s), about what the grouping's stream synchronisation
 * and the lost graph replay cost a layer (an estimate from the bytes, not a
 * measurement: bench/moe_cuda.sh AB=1 times both paths); at 16 rows (128
 * assignments, ~81 distinct) the extra reads are ~3x that. Decode (8 assignments of 8
 * distinct experts) re-reads nothing. The rows of a real model's verify
 * block share experts more often than independent routes do, which moves
 * the break-even up, not down. */
int ds_layer_moe_on_device(const ds_backend *be, const ds_layer *L, const uint8_t var[DS_FAM_COUNT], int M) {
    if (L->n_expert <= 0) return 1;
    const ds_backend_i *b = be->i;
    if (!L->exp_id || !b->matmul_id || b->host_memory || L->moe_func != DS_MOE_SOFTMAX || L->swiglu_limit > 0.0f)
        return 0;
    if (M < 1 || (int64_t)M * L->n_expert_used > DS_MOE_ID_MAX) return 0;
    /* the path's rows sit in the gather scratch's place, X [M k][d] (d = the
     * down projection's n_out), with up to 12 floats of alignment padding */
    if ((int64_t)M * L->n_expert_used * L->exp_down[0].n_out < 16) return 0;
    return var[ds_matmul_family(L->exp_gate[0].type)] == DS_CANONICAL &&
           var[ds_matmul_family(L->exp_up[0].type)] == DS_CANONICAL &&
           var[ds_matmul_family(L->exp_down[0].type)] == DS_CANONICAL && var[DS_FAM_SWIGLU] == DS_CANONICAL;
}

int ds_layers_moe_on_device(const ds_backend *be, const ds_layer *layers, int n_layer, const uint8_t var[DS_FAM_COUNT],
                            int M) {
    for (int l = 0; l < n_layer; l++)
        if (!ds_layer_moe_on_device(be, &layers[l], var, M)) return 0;
    return 1;
}

/* p rounded up to 16 bytes (the scratch is 64-byte aligned) */
static float *align16f(float *p) {
    return (float *)(((uintptr_t)p + 15) & ~(uintptr_t)15);
}
static size_t round4(size_t n) { return (n + 3) & ~(size_t)3; }

/* The FFN of a MoE layer over M rows of a->xn, into a->o.
 *
 * Why a row's bits are its own: the router is a matmul (a family: row r's
 * logits are decode's), the route is the moe_route family (a row's experts
 * and weights are a function of its logits alone), and each expert's three
 * matmuls run over the rows that chose it, grouped into one call per
 * expert — the grouping decides which rows share a weight read, while a
 * canonical matmul's row is the decode row whatever the other rows are.
 * The combine sums a row's k outputs in rank order (backend.h
 * moe_combine), never in an order set by which other rows chose which
 * expert. So decode (M = 1: k calls of one row each) and any batch give the
 * same bits, and the grouping is free to change.
 *
 * The grouping itself (a counting sort of the assignments by expert) runs
 * on the host over the route's ids: on a host-memory backend they are read
 * in place; a device backend's are downloaded once per MoE layer (M * k
 * int32, a synchronisation of the stream — which is also why model.c
 * records no CUDA graph for such a forward: a download cannot be
 * captured), the slots go back up with one upload and the rows are gathered
 * by one moe_gather launch where the backend has it. Small calls (decode,
 * short verify blocks: ds_layer_moe_on_device) skip all of that on a
 * device: the device-side path above, the same bits, nothing read on the
 * host. */
void ds_layer_moe_ffn(ds_exec *ex, const ds_layer *L, const ds_layer_shape *s, const uint8_t var[DS_FAM_COUNT], int M,
                      int pos0, ds_acts *a, const ds_probe *pr, int l) {
    const ds_backend_i *b = ex->be->i;
    const int E = L->n_expert, k = L->n_expert_used, d = s->d, f = (int)L->exp_gate[0].n_out;
    const size_t mk = (size_t)M * (size_t)k;
    float *logits = a->moe, *w = logits + (size_t)M * E;
    int32_t *ids = (int32_t *)(w + mk), *slot = ids + mk;
    float *probe = (float *)(slot + mk);
    float *X = probe + 2 * mk, *G = X + mk * d, *U = G + mk * f, *H = U + mk * f, *Y = H + mk * f;
    const ds_variant vrt = (ds_variant)var[DS_FAM_MOE_ROUTE], vsw = (ds_variant)var[DS_FAM_SWIGLU];

    b->matmul(ex, (ds_variant)var[ds_matmul_family(L->gate_inp.type)], &L->gate_inp, M, a->xn, logits);
    if (L->moe_func != DS_MOE_SOFTMAX) {   /* deepseek4: sqrtsoftplus, the selection bias, the scale */
        /* a hash layer: each row's experts are its token's row of tid2eid
         * (gathered into the probe scratch, free until the route is done;
         * deepseek4 runs on host memory, so the ids are host rows) */
        int32_t *fixed = NULL;
        if (L->tid2eid) {
            const int32_t *tok = a->pos + a->ids_off;
            fixed = (int32_t *)(void *)probe;
            for (int r = 0; r < M; r++) memcpy(fixed + (size_t)r * k, L->tid2eid + (size_t)tok[r] * k, (size_t)k * sizeof(int32_t));
        }
        const ds_moe_gating gt = {L->moe_func, L->moe_norm, L->moe_scale, fixed ? NULL : L->exp_probs_b, fixed};
        b->moe_route_ex(ex, vrt, M, E, k, &gt, logits, ids, w);
    } else {
        b->moe_route(ex, vrt, M, E, k, L->moe_norm, logits, ids, w);
    }
    unsigned fam_exp = FAM(DS_FAM_SWIGLU) | FAM(DS_FAM_MOE_ROUTE);
    const int32_t *slot_dev = slot;
    float *Yc = Y;                    /* the experts' outputs moe_combine reads */
    if (!wants(pr, l, DSD_CP_FFN_GATE_UP) && ds_layer_moe_on_device(ex->be, L, var, M)) {
        /* the device-side path (above): its rows in X's place (unused here),
         * 16-byte aligned for the kernels; they end before Y's end (at most
         * 12 floats of padding against X's mk d >= 16: ds_layer_moe_on_device),
         * so the shared expert's scratch below is where it always is */
        float *Gi = align16f(X), *Ui = Gi + round4(mk * f), *Hi = Ui + round4(mk * f), *Yi = Hi + round4(mk * f);
        const int one = L->exp_gate[0].type == L->exp_up[0].type;
        if (one) {
            const ds_weight *const w2[2] = {L->exp_gate, L->exp_up};
            float *const y2[2] = {Gi, Ui};
            b->matmul_id(ex, 2, w2, E, (int)mk, ids, k, a->xn, y2);
        } else {
            const ds_weight *const wg[1] = {L->exp_gate}, *const wu[1] = {L->exp_up};
            float *const yg[1] = {Gi}, *const yu[1] = {Ui};
            b->matmul_id(ex, 1, wg, E, (int)mk, ids, k, a->xn, yg);
            b->matmul_id(ex, 1, wu, E, (int)mk, ids, k, a->xn, yu);
        }
        b->swiglu(ex, vsw, (int)mk, f, Gi, Ui, Hi);
        const ds_weight *const wd[1] = {L->exp_down};
        float *const yd[1] = {Yi};
        b->matmul_id(ex, 1, wd, E, (int)mk, ids, 1, Hi, yd);
        fam_exp |= FAM(ds_matmul_family(L->exp_gate[0].type)) | FAM(ds_matmul_family(L->exp_up[0].type)) |
                   FAM(ds_matmul_family(L->exp_down[0].type));
        slot_dev = NULL;              /* moe_combine: the identity */
        Yc = Yi;
        goto shared;
    }
    /* the ids (and, for a probe, the weights) where the host reads them:
     * in place, or downloaded into the staging (one synchronisation) */
    const int host = b->host_memory;
    int32_t *ids_h = ids, *slot_h = slot;
    float *probe_h = probe, *w_h = w;
    if (!host) {
        ids_h = a->moe_host;
        slot_h = ids_h + mk;
        probe_h = (float *)(slot_h + mk);
        w_h = probe_h + 2 * mk;
        b->download(ex, ids_h, ids, mk * sizeof(int32_t));
        /* a device fault leaves the staging as it was (it is reported by
         * the forward's own synchronisation): never index past the experts */
        for (size_t i = 0; i < mk; i++)
            if (ids_h[i] < 0 || ids_h[i] >= E) ids_h[i] = 0;
    }
    if (wants(pr, l, DSD_CP_FFN_GATE_UP)) {
        ds_probe_rows(ex, pr, M, pos0, l, DSD_CP_FFN_GATE_UP, DSD_SUB_MOE_LOGITS,
                      FAM(ds_matmul_family(L->gate_inp.type)), logits, (size_t)E, (size_t)E);
        if (!host) b->download(ex, w_h, w, mk * sizeof(float));
        for (int r = 0; r < M; r++)
            for (int j = 0; j < k; j++) {
                probe_h[(size_t)r * 2 * k + j] = w_h[(size_t)r * k + j];
                probe_h[(size_t)r * 2 * k + k + j] = (float)ids_h[(size_t)r * k + j];
            }
        if (!host) b->upload(ex, probe, probe_h, 2 * mk * sizeof(float));
        ds_probe_rows(ex, pr, M, pos0, l, DSD_CP_FFN_GATE_UP, DSD_SUB_MOE_ROUTE,
                      FAM(DS_FAM_MOE_ROUTE) | FAM(ds_matmul_family(L->gate_inp.type)), probe, 2 * (size_t)k,
                      2 * (size_t)k);
    }

    /* group the assignments by expert (rows in order within an expert) */
    int start[DS_MOE_MAX_EXPERT + 1], fill[DS_MOE_MAX_EXPERT];
    for (int e = 0; e <= E; e++) start[e] = 0;
    for (size_t i = 0; i < mk; i++) start[ids_h[i] + 1]++;
    for (int e = 0; e < E; e++) {
        start[e + 1] += start[e];
        fill[e] = 0;
    }
    for (int r = 0; r < M; r++)
        for (int j = 0; j < k; j++) {
            const size_t i = (size_t)r * k + (size_t)j;
            const int e = ids_h[i], sl = start[e] + fill[e]++;
            slot_h[i] = sl;
            if (!b->moe_gather) b->copy(ex, X + (size_t)sl * d, a->xn + (size_t)r * d, (size_t)d * sizeof(float));
        }
    if (!host) b->upload(ex, slot, slot_h, mk * sizeof(int32_t));
    if (b->moe_gather) b->moe_gather(ex, M, k, d, slot, a->xn, X);
    /* each used expert once, over its rows */
    for (int e = 0; e < E; e++) {
        const int n = start[e + 1] - start[e];
        if (!n) continue;
        const size_t s0 = (size_t)start[e];
        const ds_weight *const w2[2] = {&L->exp_gate[e], &L->exp_up[e]};
        float *const y2[2] = {G + s0 * f, U + s0 * f};
        mm_shared(ex, var, 2, w2, n, X + s0 * d, y2);
        /* deepseek4's clamp on the SwiGLU inputs (host memory: the loader
         * runs deepseek4 on host-memory backends only) */
        if (L->swiglu_limit > 0.0f && b->host_memory) ds_swiglu_limit((int64_t)n * f, L->swiglu_limit, G + s0 * f, U + s0 * f);
        b->swiglu(ex, vsw, n, f, G + s0 * f, U + s0 * f, H + s0 * f);
        b->matmul(ex, (ds_variant)var[ds_matmul_family(L->exp_down[e].type)], &L->exp_down[e], n, H + s0 * f,
                  Y + s0 * d);
        fam_exp |= FAM(ds_matmul_family(L->exp_gate[e].type)) | FAM(ds_matmul_family(L->exp_up[e].type)) |
                   FAM(ds_matmul_family(L->exp_down[e].type));
    }
shared:;
    /* the shared expert (every row, one dense SwiGLU) and its gate logit */
    float *SG = NULL, *SO = NULL;
    if (L->has_shexp) {
        const int fs = (int)L->sh_gate.n_out;
        SG = Y + mk * d;
        float *SGt = SG + M, *SU = SGt + (size_t)M * fs, *SH = SU + (size_t)M * fs;
        SO = SH + (size_t)M * fs;
        const ds_weight *const w2[2] = {&L->sh_gate, &L->sh_up};
        float *const y2[2] = {SGt, SU};
        mm_shared(ex, var, 2, w2, M, a->xn, y2);
        if (L->swiglu_limit_sh > 0.0f && b->host_memory) ds_swiglu_limit((int64_t)M * fs, L->swiglu_limit_sh, SGt, SU);
        b->swiglu(ex, vsw, M, fs, SGt, SU, SH);
        b->matmul(ex, (ds_variant)var[ds_matmul_family(L->sh_down.type)], &L->sh_down, M, SH, SO);
        fam_exp |= FAM(ds_matmul_family(L->sh_gate.type)) | FAM(ds_matmul_family(L->sh_up.type)) |
                   FAM(ds_matmul_family(L->sh_down.type));
        if (L->has_shexp == 2) {
            SG = NULL;                    /* deepseek4: the shared expert is ungated */
        } else {
            b->matmul(ex, (ds_variant)var[ds_matmul_family(L->sh_gate_inp.type)], &L->sh_gate_inp, M, a->xn, SG);
            fam_exp |= FAM(ds_matmul_family(L->sh_gate_inp.type));
        }
    }
    b->moe_combine(ex, M, k, d, slot_dev, w, Yc, SG, SO, a->o);
    if (wants(pr, l, DSD_CP_FFN_DOWN))
        ds_probe_rows(ex, pr, M, pos0, l, DSD_CP_FFN_DOWN, DSD_SUB_ALL, fam_exp, a->o, d, d);
}

/* RoPE on the first n_rot dims of each head (qwen35: a quarter of them):
 * gathered into tmp as heads of n_rot, rotated as such (theta_i = pos *
 * base^(-2i/n_rot), llama.cpp's n_dims), and put back. */
/* The layer's RoPE: plain, or with the model's scaling / frequency factors
 * (s->rope_yarn) through rope_ext. */
static void rope_rows(ds_exec *ex, ds_variant v, const ds_layer_shape *s, int M, int heads, int hd, const int *pos,
                      float *x) {
    if (s->rope_yarn) ex->be->i->rope_ext(ex, v, M, heads, hd, pos, s->rope_base, s->rope_mode, s->rope_yarn, x);
    else ex->be->i->rope(ex, v, M, heads, hd, pos, s->rope_base, s->rope_mode, x);
}

static void rope_partial(ds_exec *ex, ds_variant v, const ds_layer_shape *s, int M, int heads, int n_rot,
                         const int *pos, float *x, float *tmp) {
    const size_t hb = (size_t)s->head_dim * sizeof(float), rb = (size_t)n_rot * sizeof(float);
    ds_backend_copy2d(ex, tmp, rb, x, hb, rb, (size_t)M * heads);
    rope_rows(ex, v, s, M, heads, n_rot, pos, tmp);
    ds_backend_copy2d(ex, x, hb, tmp, rb, rb, (size_t)M * heads);
}

size_t ds_hybrid_scratch_floats(int m_max, const ds_layer_shape *s) {
    const size_t m = (size_t)m_max, qd = (size_t)s->n_head * s->head_dim;
    const ds_gdn_shape *g = &s->gdn;
    const size_t vd = (size_t)g->n_v_head * g->head_dim;
    const size_t rec = m * (2 * (size_t)g->conv_dim + 3 * vd + 2 * (size_t)g->n_v_head);
    const size_t att = m * 3 * qd;    /* q|gate, gate; the RoPE staging reuses the first (q is copied out) */
    return rec > att ? rec : att;
}

void ds_layer_mm_shared(ds_exec *ex, const uint8_t var[DS_FAM_COUNT], int n, const ds_weight *const W[], int M,
                        const float *x, float *const y[]) {
    mm_shared(ex, var, n, W, M, x, y);
}

void ds_layer_forward(ds_exec *ex, const ds_layer *L, const ds_layer_shape *s,
                      const float *next_norm, const uint8_t var[DS_FAM_COUNT], int M, int pos0,
                      int qkv_ready, float *kc, float *vc, ds_acts *a, const ds_probe *pr, int l) {
    const ds_backend_i *b = ex->be->i;
    const int d = s->d, hd = s->head_dim, H = s->n_head, Hkv = s->n_head_kv;
    const size_t qd = (size_t)H * hd, kvd = (size_t)Hkv * hd, ff = (size_t)s->n_ff;
    const float eps = s->eps;
    const ds_variant vnorm = (ds_variant)var[DS_FAM_RMSNORM], vrope = (ds_variant)var[DS_FAM_ROPE];
    const ds_variant vres = (ds_variant)var[DS_FAM_RESIDUAL];
#define MM(w, x, y) b->matmul(ex, (ds_variant)var[ds_matmul_family((w)->type)], (w), M, (x), (y))
#define MMF(w) FAM(ds_matmul_family((w)->type))
    const unsigned f_qkv = MMF(&L->wq) | MMF(&L->wk) | MMF(&L->wv);

    if (wants(pr, l, DSD_CP_ATTN_NORM))
        ds_probe_rows(ex, pr, M, pos0, l, DSD_CP_ATTN_NORM, DSD_SUB_ALL,
                      FAM(DS_FAM_RMSNORM) | (l > 0 ? FAM(DS_FAM_RESIDUAL) : 0), a->xn, d, d);

    int fused_o = 0;
    if (L->recur) {   /* qwen35's gated delta net: its mixer replaces the attention */
        ds_layer_gdn_mixer(ex, L, s, var, M, pos0, a, pr, l);
        goto mixed;
    }
    /* --- attention: projections, QK-norm, RoPE ---------------------------- */
    /* qwen35's gated attention: wq gives each head's query and gate side by
     * side; the queries go to a->q, the gates to the hybrid scratch */
    float *qgate = L->q_gate ? a->rec + (size_t)M * 2 * qd : NULL;
    if (!qkv_ready) {
        const ds_weight *const w3[3] = {&L->wq, &L->wk, &L->wv};
        float *const y3[3] = {L->q_gate ? a->rec : a->q, a->k, a->v};
        mm_shared(ex, var, 3, w3, M, a->xn, y3);
        if (L->q_gate) {
            const size_t hb = (size_t)hd * sizeof(float);
            ds_backend_copy2d(ex, a->q, hb, a->rec, 2 * hb, hb, (size_t)M * H);
            ds_backend_copy2d(ex, qgate, hb, a->rec + hd, 2 * hb, hb, (size_t)M * H);
        }
    }
    const int p_qkv = wants(pr, l, DSD_CP_QKV);
    if (p_qkv) {
        ds_probe_rows(ex, pr, M, pos0, l, DSD_CP_QKV, DSD_SUB_Q_PROJ, MMF(&L->wq), a->q, qd, qd);
        ds_probe_rows(ex, pr, M, pos0, l, DSD_CP_QKV, DSD_SUB_K_PROJ, MMF(&L->wk), a->k, kvd, kvd);
        ds_probe_rows(ex, pr, M, pos0, l, DSD_CP_QKV, DSD_SUB_V_PROJ, MMF(&L->wv), a->v, kvd, kvd);
    }
    /* Canonical norm and RoPE with nothing to observe in between: the
     * backend's one-launch prologue when it has one (same bits). */
    const int n_rot = s->n_rot > 0 && s->n_rot < hd ? s->n_rot : hd;
    /* (the fused prologue takes plain RoPE only: a scaled RoPE runs the
     * separate steps, rope_ext's bits) */
    const int fuse = b->qk_norm_rope_kv && vnorm == DS_CANONICAL && vrope == DS_CANONICAL && !p_qkv && n_rot == hd &&
                     !s->rope_yarn;
    const int norm = L->q_norm && !qkv_ready;
    if (fuse) {
        b->qk_norm_rope_kv(ex, M, H, Hkv, hd, a->rows, s->rope_base, s->rope_mode,
                           norm ? L->q_norm : NULL, norm ? L->k_norm : NULL, eps, a->q, a->k, a->v,
                           kc, vc);
    } else {
        if (norm) {
            /* per-head RMSNorm: rows = tokens x heads, in place */
            b->rmsnorm(ex, vnorm, M * H, hd, a->q, L->q_norm, eps, a->q);
            b->rmsnorm(ex, vnorm, M * Hkv, hd, a->k, L->k_norm, eps, a->k);
        }
        if (L->q_norm && p_qkv) {
            ds_probe_rows(ex, pr, M, pos0, l, DSD_CP_QKV, DSD_SUB_Q_NORM, FAM(DS_FAM_RMSNORM), a->q, qd, qd);
            ds_probe_rows(ex, pr, M, pos0, l, DSD_CP_QKV, DSD_SUB_K_NORM, FAM(DS_FAM_RMSNORM), a->k, kvd, kvd);
        }
        if (n_rot == hd) {
            rope_rows(ex, vrope, s, M, H, hd, a->pos, a->q);
            rope_rows(ex, vrope, s, M, Hkv, hd, a->pos, a->k);
        } else {
            rope_partial(ex, vrope, s, M, H, n_rot, a->pos, a->q, a->rec);
            rope_partial(ex, vrope, s, M, Hkv, n_rot, a->pos, a->k, a->rec);
        }
        if (p_qkv) {
            ds_probe_rows(ex, pr, M, pos0, l, DSD_CP_QKV, DSD_SUB_Q_ROPE, FAM(DS_FAM_ROPE), a->q, qd, qd);
            ds_probe_rows(ex, pr, M, pos0, l, DSD_CP_QKV, DSD_SUB_K_ROPE, FAM(DS_FAM_ROPE), a->k, kvd, kvd);
        }
        /* this call's K/V rows first, then attend */
        b->kv_write(ex, kc, vc, (int)kvd, M, a->rows, a->k, a->v);
    }
    if (wants(pr, l, DSD_CP_KV_WRITE)) {
        /* the cache rows themselves, read back from their slots (one row at a
         * time: consecutive positions need not be adjacent in the pool) */
        const unsigned f = FAM(DS_FAM_ROPE) | FAM(DS_FAM_RMSNORM) | f_qkv;
        const ds_rows *rw = a->rows;
        for (int kv = 0; kv < 2; kv++)           /* every K row, then every V row */
            for (int r = 0; r < M; r++) {
                const float *row = (kv ? a->v : a->k) + (size_t)r * kvd;
                if (a->tables_host)
                    row = (kv ? vc : kc) + ds_rows_at(rw, a->tables_host, 0, pos0 + r, (int)kvd);
                ds_probe_rows(ex, pr, 1, pos0 + r, l, DSD_CP_KV_WRITE, kv ? DSD_SUB_V_CACHE_ROW : DSD_SUB_K_CACHE_ROW,
                              f, row, kvd, kvd);
            }
    }
    ds_attn_shape as = { H, Hkv, hd, (int)kvd, 1.0f / sqrtf((float)hd) };
    b->attention(ex, (ds_variant)var[DS_FAM_ATTENTION], &as, M, a->rows, a->q, kc, vc, a->att);
    if (L->q_gate) b->sigmoid_mul(ex, (int64_t)M * (int64_t)qd, a->att, qgate);
    if (wants(pr, l, DSD_CP_ATTN_HEADS))
        for (int r = 0; r < M; r++)
            for (int h = 0; h < H; h++)
                ds_probe_rows(ex, pr, 1, pos0 + r, l, DSD_CP_ATTN_HEADS, (int)DSD_SUB_HEAD(h),
                              FAM(DS_FAM_ATTENTION), a->att + ((size_t)r * H + h) * hd, hd, hd);

    /* o_proj with the residual epilogue and the FFN norm in one launch where
     * the backend can (o, x and xn are all written: the probes below read
     * the same rows either way) */
    const ds_matmul_res ro = {(ds_variant)var[ds_matmul_family(L->wo.type)], vres, vnorm, DS_CANONICAL,
                              &L->wo, M, a->att, NULL, NULL, a->o, a->x, L->ffn_norm, eps, a->xn};
    fused_o = L->ffn_norm && b->matmul_res && b->matmul_res(ex, &ro) == 0;
    if (!fused_o) MM(&L->wo, a->att, a->o);
    if (wants(pr, l, DSD_CP_ATTN_OUT_PROJ))
        ds_probe_rows(ex, pr, M, pos0, l, DSD_CP_ATTN_OUT_PROJ, DSD_SUB_ALL, MMF(&L->wo), a->o, d, d);
mixed:

    /* --- residual epilogue + FFN norm --------------------------------------- */
    if (!fused_o) b->residual(ex, vres, vnorm, M, d, a->x, a->o, L->ffn_norm, eps, a->xn);
    if (wants(pr, l, DSD_CP_ATTN_RESIDUAL))
        ds_probe_rows(ex, pr, M, pos0, l, DSD_CP_ATTN_RESIDUAL, DSD_SUB_ALL, FAM(DS_FAM_RESIDUAL), a->x, d, d);
    if (wants(pr, l, DSD_CP_FFN_NORM))
        ds_probe_rows(ex, pr, M, pos0, l, DSD_CP_FFN_NORM, DSD_SUB_ALL,
                      FAM(DS_FAM_RESIDUAL) | FAM(DS_FAM_RMSNORM), a->xn, d, d);

    /* --- mixture of experts: its own FFN, then the residual epilogue ----------- */
    if (L->n_expert > 0) {
        ds_layer_moe_ffn(ex, L, s, var, M, pos0, a, pr, l);
        b->residual(ex, vres, vnorm, M, d, a->x, a->o, next_norm, eps, a->xn);
        if (wants(pr, l, DSD_CP_LAYER_OUT))
            ds_probe_rows(ex, pr, M, pos0, l, DSD_CP_LAYER_OUT, DSD_SUB_ALL, FAM(DS_FAM_RESIDUAL), a->x, d, d);
        return;
    }

    /* --- SwiGLU FFN ------------------------------------------------------------ */
    {
        const ds_weight *const w2[2] = {&L->w_gate, &L->w_up};
        float *const y2[2] = {a->gate, a->up};
        mm_shared(ex, var, 2, w2, M, a->xn, y2);
    }
    if (wants(pr, l, DSD_CP_FFN_GATE_UP)) {
        ds_probe_rows(ex, pr, M, pos0, l, DSD_CP_FFN_GATE_UP, DSD_SUB_FFN_GATE, MMF(&L->w_gate), a->gate, ff, ff);
        ds_probe_rows(ex, pr, M, pos0, l, DSD_CP_FFN_GATE_UP, DSD_SUB_FFN_UP, MMF(&L->w_up), a->up, ff, ff);
    }
    /* SwiGLU and the down projection: one launch where the backend can
     * (it still writes h, so the probe below reads the same rows) */
    const ds_variant vsw = (ds_variant)var[DS_FAM_SWIGLU];
    const ds_variant vdown = (ds_variant)var[ds_matmul_family(L->w_down.type)];
    /* all of SwiGLU, down, the residual and the next norm in one launch;
     * else SwiGLU inside down; else each alone */
    const ds_matmul_res rd = {vdown, vres, vnorm, vsw, &L->w_down, M, a->gate, a->up, a->h, a->o, a->x,
                              next_norm, eps, a->xn};
    const int fused_all = next_norm && b->matmul_res && b->matmul_res(ex, &rd) == 0;
    const int fused_down = fused_all ||
        (b->swiglu_matmul && b->swiglu_matmul(ex, vsw, vdown, &L->w_down, M, a->gate, a->up, a->h, a->o) == 0);
    if (!fused_down) b->swiglu(ex, vsw, M, (int)ff, a->gate, a->up, a->h);
    if (wants(pr, l, DSD_CP_FFN_ACT))
        ds_probe_rows(ex, pr, M, pos0, l, DSD_CP_FFN_ACT, DSD_SUB_ALL, FAM(DS_FAM_SWIGLU), a->h, ff, ff);
    if (!fused_down) MM(&L->w_down, a->h, a->o);
    if (wants(pr, l, DSD_CP_FFN_DOWN))
        ds_probe_rows(ex, pr, M, pos0, l, DSD_CP_FFN_DOWN, DSD_SUB_ALL, MMF(&L->w_down), a->o, d, d);

    /* residual, fused with the next norm (the next layer's attn_norm, or the
     * final output_norm after the last layer) */
    if (!fused_all) b->residual(ex, vres, vnorm, M, d, a->x, a->o, next_norm, eps, a->xn);
    if (wants(pr, l, DSD_CP_LAYER_OUT))
        ds_probe_rows(ex, pr, M, pos0, l, DSD_CP_LAYER_OUT, DSD_SUB_ALL, FAM(DS_FAM_RESIDUAL), a->x, d, d);
#undef MM
#undef MMF
}
