/* test_diverge.c — the first-divergence experiment on a real forward pass:
 * the non-perturbation gate passes; all-canonical kernels give
 * FIRST_DIVERGENCE NONE with every object compared; forcing one family fast
 * makes the experiment report a first divergence at a checkpoint that
 * family produces (so the check can fail); the isolated A/B agrees. */
#include "testutil.h"
#include "diverge.h"
#include "model_make.h"

/* Everything one diverge run reports, as bytes: the gate, the chain, the
 * token row, the report's lines, per-object table and JSON, and the family
 * attribution map. Two capture paths must give the same bytes. */
static char *result_bytes(const ds_diverge_result *r, size_t *len) {
    char *buf = NULL;
    FILE *f = open_memstream(&buf, len);
    if (!f) return NULL;
    fprintf(f, "gate %d %d token_row %d chain", r->gate_control, r->gate_probe, r->first_token_mismatch_row);
    for (int i = 0; i < DSD_CHAIN_COUNT; i++) fprintf(f, " %d", r->chain[i]);
    fputc('\n', f);
    dsd_report_print(f, &r->report);
    dsd_report_print_table(f, &r->report, 0);
    dsd_report_json(f, &r->report);
    fwrite(r->fam_map, sizeof(unsigned), (size_t)(r->fam_layers + 1) * DSD_CP_COUNT * (DSD_SUB_NAMED_COUNT + 1), f);
    fclose(f);
    return buf;
}

/* A probe that stores every row it is handed into a capture, rows relative
 * to the block's first position. */
typedef struct { dsd_capture *cap; int pos0; } put_ctx;
static void put_row(void *user, int pos, int layer, int cp, int sub, unsigned fams, const float *data, size_t n) {
    put_ctx *p = user;
    (void)dsd_capture_put(p->cap, pos - p->pos0, layer, (uint32_t)cp, (uint32_t)sub, data, n);
}

static ds_model *make(const char *dir, uint32_t type) {
    char path[512], err[DS_ERRLEN];
    snprintf(path, sizeof path, "%s/m%u.gguf", dir, type);
    ds_make_model_opts o;
    ds_make_model_defaults(&o);
    o.type = type;
    o.n_embd = 128; o.n_layer = 3; o.n_head = 4; o.n_head_kv = 2; o.n_ff = 256; o.n_vocab = 400; o.seed = 11;
    if (ds_make_model(&o, path, err, sizeof err)) { printf("FAIL make: %s\n", err); exit(1); }
    ds_model *m = ds_model_load_on(path, tu_device(), err, sizeof err);
    if (!m) { printf("FAIL load: %s\n", err); exit(1); }
    return m;
}

int main(void) {
    char dir[256], err[DS_ERRLEN];
    tu_tmpdir(dir, sizeof dir);
    ds_model *m = make(dir, DS_TYPE_Q8_0);
    ds_ctx *c = ds_ctx_new(m, 256, 2, err, sizeof err);
    int taps[2] = { 0, 1 };
    ds_set_taps(c, taps, 2, err, sizeof err);
    int32_t prompt[100], block[8];
    for (int i = 0; i < 100; i++) prompt[i] = (int32_t)((i * 37 + 5) % 399);
    for (int i = 0; i < 8; i++) block[i] = (int32_t)((i * 91 + 3) % 399);

    /* 1. all canonical: gate passes, nothing diverges */
    ds_diverge_opts o = { prompt, 100, block, 8, { { 0 } } };
    ds_kernel_set_all(&o.ks, DS_CANONICAL);
    ds_diverge_result r;
    CHECK(ds_diverge_run(c, &o, &r, err, sizeof err) == 0, "diverge: %s", err);
    CHECK(r.gate_control && r.gate_probe, "non-perturbation gate failed");
    CHECK(dsd_report_identical(&r.report), "canonical kernels diverged (first=%lld)", (long long)r.report.first);
    CHECK(r.report.compared_objects > 8 * 3 * 10, "too few objects compared: %zu", r.report.compared_objects);
    for (int i = 0; i < DSD_CHAIN_COUNT; i++) CHECK(r.chain[i] == 1, "chain link %d not PASS", i);
    printf("%s canonical FIRST_DIVERGENCE NONE compared_objects=%zu\n", dsd_report_identical(&r.report) ? "PASS" : "FAIL", r.report.compared_objects);
    ds_diverge_result_free(&r);
    CHECK(ds_ctx_n_past(c) == 0 || ds_ctx_n_past(c) == 100, "n_past not restored");

    /* 2. one family fast at a time: the experiment finds a divergence at a
     * checkpoint that family produces, and the isolated A/B proves it */
    const int fams[] = { DS_FAM_MATMUL_Q8_0, DS_FAM_ATTENTION, DS_FAM_RMSNORM, DS_FAM_SWIGLU, DS_FAM_ROPE, DS_FAM_RESIDUAL };
    for (size_t i = 0; i < sizeof fams / sizeof fams[0]; i++) {
        int f = fams[i];
        ds_kernel_set_all(&o.ks, DS_CANONICAL);
        o.ks.v[f] = DS_FAST;
        CHECK(ds_diverge_run(c, &o, &r, err, sizeof err) == 0, "diverge: %s", err);
        CHECK(r.gate_control && r.gate_probe, "gate failed with %s fast", ds_family_name(f));
        const dsd_object_result *first = dsd_report_first(&r.report);
        ds_family_ab ab;
        CHECK(ds_family_ab_run(m, ds_ctx_exec(c), f, DS_FAST, 16, &ab, err, sizeof err) == 0, "ab: %s", err);
        if (f == DS_FAM_MATMUL_Q8_0 || f == DS_FAM_ATTENTION) {
            CHECK(first != NULL, "%s fast: no divergence found (the check cannot fail)", ds_family_name(f));
            CHECK(ab.proven_different, "%s fast: isolated A/B found no difference", ds_family_name(f));
        }
        if (first) {
            unsigned fm = ds_families_for_checkpoint(&r, first->key.layer, first->key.cp, first->key.sub);
            CHECK(fm & (1u << f), "%s fast: first divergence at %s is not attributed to it", ds_family_name(f), dsd_cp_name(first->key.cp));
            char sb[DSD_NAME_MAX];
            printf("PASS family=%s fast first_divergence row=%d layer=%d checkpoint=%s subobject=%s isolated_ab=%s\n",
                   ds_family_name(f), first->key.row, first->key.layer, dsd_cp_name(first->key.cp),
                   dsd_sub_name(first->key.sub, sb), ab.proven_different ? "PROVEN_DIFFERENT" : "IDENTICAL");
        } else {
            printf("PASS family=%s fast: no divergence on this block (isolated_ab=%s)\n", ds_family_name(f),
                   ab.proven_different ? "PROVEN_DIFFERENT" : "IDENTICAL");
        }
        ds_diverge_result_free(&r);
    }

    /* 3. canonical families are IDENTICAL in the isolated A/B too */
    int n_ab = 0;
    for (int f = 0; f < DS_FAM_COUNT; f++) {
        ds_family_ab ab;
        if (ds_family_ab_run(m, ds_ctx_exec(c), f, DS_CANONICAL, 16, &ab, err, sizeof err) != 0) {
            /* a device may refuse a weight type or a family it has no
             * kernels for (Q4_1/Q5_1 and moe_route on CUDA): that is a
             * refusal, not a wrong answer */
            CHECK(strcmp(tu_device(), "cpu") && (strstr(err, "not supported") || strstr(err, "has no")), "ab: %s", err);
            printf("SKIP family=%s on %s: %s\n", ds_family_name(f), tu_device(), err);
            continue;
        }
        n_ab++;
        CHECK(!ab.proven_different, "canonical %s differs from decode in the isolated A/B", ds_family_name(f));
    }
    printf("PASS isolated A/B: every canonical family IDENTICAL to decode for M=1..16 (%d families on %s)\n", n_ab, tu_device());

    /* 4. cross-configuration mode: the same model file on the CPU against
     * this context (on DSPARK_DEVICE: the GPU under make test-cuda, else a
     * second CPU context with another thread count). Canonical batched on
     * both sides must agree bit for bit — the CUDA canonical kernels are
     * written to the CPU's arithmetic — and a fast Q8_0 matmul on side B
     * must be found and attributed. */
    {
        char path[512];
        snprintf(path, sizeof path, "%s/m%u.gguf", dir, (unsigned)DS_TYPE_Q8_0);
        const char *dev = "cpu";
        ds_model *m2 = ds_model_load_on(path, dev, err, sizeof err);
        CHECK(m2 != NULL, "load on %s: %s", dev, err);
        ds_ctx *c2 = m2 ? ds_ctx_new(m2, 256, 1, err, sizeof err) : NULL;
        CHECK(c2 != NULL, "ctx on %s: %s", dev, err);
        if (c2) {
            ds_set_taps(c2, taps, 2, err, sizeof err);
            ds_kernel_set kb;
            ds_kernel_set_all(&o.ks, DS_CANONICAL);
            ds_kernel_set_all(&kb, DS_CANONICAL);
            CHECK(ds_diverge_cross(c, c2, &o, &kb, &r, err, sizeof err) == 0, "cross: %s", err);
            const dsd_object_result *first = dsd_report_first(&r.report);
            CHECK(first == NULL, "%s canonical vs cpu canonical diverged at %s", tu_device(), first ? dsd_cp_name(first->key.cp) : "");
            printf("%s cross %s(canonical,batched) vs cpu(canonical,batched): first_divergence=%s compared_objects=%zu\n",
                   first == NULL ? "PASS" : "FAIL", tu_device(), first ? dsd_cp_name(first->key.cp) : "NONE",
                   r.report.compared_objects);
            ds_diverge_result_free(&r);
            kb.v[DS_FAM_MATMUL_Q8_0] = DS_FAST;
            CHECK(ds_diverge_cross(c, c2, &o, &kb, &r, err, sizeof err) == 0, "cross: %s", err);
            first = dsd_report_first(&r.report);
            CHECK(first != NULL, "a fast Q8_0 matmul on side B was not found");
            if (first) {
                unsigned fm = ds_families_for_checkpoint(&r, first->key.layer, first->key.cp, first->key.sub);
                CHECK(fm & (1u << DS_FAM_MATMUL_Q8_0), "cross: first divergence at %s not attributed to matmul_q8_0", dsd_cp_name(first->key.cp));
                printf("PASS cross vs %s(fast matmul_q8_0): first_divergence layer=%d checkpoint=%s\n", dev, first->key.layer,
                       dsd_cp_name(first->key.cp));
            }
            ds_diverge_result_free(&r);
        }
        ds_ctx_free(c2);
        ds_model_free(m2);
    }

    /* 5. the capture paths: same-stream copies into a preallocated arena
     * downloaded once per pass (ARENA: the default on a device; on the CPU a
     * host buffer filled by the backend's copy, so CI runs the GPU's capture
     * logic) and rows reported one at a time (DIRECT: the CPU's default; on
     * a device one download per row) give the same bytes in every output,
     * all-canonical and with a fast family */
    {
        const int fast[] = { -1, DS_FAM_MATMUL_Q8_0, DS_FAM_ATTENTION };
        for (size_t i = 0; i < sizeof fast / sizeof fast[0]; i++) {
            ds_kernel_set_all(&o.ks, DS_CANONICAL);
            if (fast[i] >= 0) o.ks.v[fast[i]] = DS_FAST;
            const char *name = fast[i] >= 0 ? ds_family_name(fast[i]) : "all_canonical";
            ds_diverge_result rd, ra;
            CHECK(ds_diverge_run_path(c, &o, DS_CAPTURE_DIRECT, &rd, err, sizeof err) == 0, "direct: %s", err);
            CHECK(ds_diverge_run_path(c, &o, DS_CAPTURE_ARENA, &ra, err, sizeof err) == 0, "arena: %s", err);
            size_t nd = 0, na = 0;
            char *bd = result_bytes(&rd, &nd), *ba = result_bytes(&ra, &na);
            const int same = bd && ba && nd == na && !memcmp(bd, ba, nd);
            CHECK(same, "%s: the arena's report differs from the direct path's (%zu vs %zu bytes)", name, na, nd);
            CHECK(!rd.capture_arena && rd.capture_downloads == 0, "%s: the direct path used an arena", name);
            CHECK(ra.capture_arena && ra.capture_downloads == 3 && ra.capture_early == 0,
                  "%s: arena downloads=%ld early=%ld (want 3 = one per probed pass, 0 early)", name,
                  ra.capture_downloads, ra.capture_early);
            CHECK(ra.report.compared_objects > 8 * 3 * 10, "%s: too few objects compared: %zu", name, ra.report.compared_objects);
            const dsd_object_result *first = dsd_report_first(&ra.report);
            printf("%s capture_paths %s on %s: arena == direct (%zu report bytes), arena downloads=%ld (one per probed pass), "
                   "compared_objects=%zu first_divergence=%s\n",
                   same && ra.capture_downloads == 3 ? "PASS" : "FAIL", name, tu_device(), na, ra.capture_downloads,
                   ra.report.compared_objects, first ? dsd_cp_name(first->key.cp) : "NONE");
            free(bd); free(ba);
            ds_diverge_result_free(&rd);
            ds_diverge_result_free(&ra);
        }
        /* AUTO: the arena on a device, the rows themselves on the CPU */
        ds_kernel_set_all(&o.ks, DS_CANONICAL);
        CHECK(ds_diverge_run(c, &o, &r, err, sizeof err) == 0, "diverge: %s", err);
        const int host = ds_ctx_exec(c)->be->i->host_memory;
        CHECK(r.capture_arena == !host, "AUTO on %s: capture_arena=%d", tu_device(), r.capture_arena);
        printf("%s capture_paths AUTO on %s takes the %s path\n", r.capture_arena == !host ? "PASS" : "FAIL", tu_device(),
               r.capture_arena ? "arena" : "direct");
        ds_diverge_result_free(&r);
    }

    /* 6. the arena itself, on this context's device: one block forward
     * (canonical, from a prefilled S0) captured three ways —
     *   big:     an arena sized by ds_diverge_arena_size: one download;
     *   small:   an arena narrower than the block's logits and a few rows
     *            deep, so it flushes early many times and reports the
     *            logits row by row; it must still capture the same bytes;
     *   planted: the big arena with one bit of one element flipped in the
     *            arena's own (device) memory before the flush: the diff must
     *            name exactly that object and element, 1 ULP, 1 mismatch. */
    {
        ds_exec *ex = ds_ctx_exec(c);
        ds_backend *be = ex->be;
        const int V = m->hp.n_vocab, M = 8, P = 100;
        size_t floats, rows;
        ds_diverge_arena_size(c, M, &floats, &rows);
        dsd_capture *cap[3] = { 0 };
        for (int k = 0; k < 3; k++) {
            cap[k] = dsd_capture_new(floats * sizeof(float) + 4096, rows + 16);
            CHECK(cap[k] != NULL, "capture: out of memory");
            if (cap[k]) dsd_capture_arm(cap[k], DSD_CAP_COPY);
        }
        float *logits = malloc((size_t)M * V * sizeof(float));
        ds_kernel_set ks;
        ds_kernel_set_all(&ks, DS_CANONICAL);
        ds_ctx_set_kernels(c, &ks);
        ds_state s0 = { 0 };
        CHECK(ds_kv_truncate(c, 0) == 0 && ds_forward_batch(c, prompt, P, 0, DS_LOGITS_NONE, NULL, NULL, err, sizeof err) == 0,
              "prefill: %s", err);
        CHECK(ds_state_save(c, &s0) == 0, "S0: out of memory");
        dsd_key planted = { 0 };
        int64_t planted_idx = -1;
        long downloads[3] = { 0 }, early[3] = { 0 };
        for (int k = 0; k < 3 && cap[0] && cap[1] && cap[2] && logits; k++) {
            ds_probe_arena ar;
            /* small: holds any 8-row layer object but not the 8 logits rows,
             * and 20 rows deep */
            const size_t af = k == 1 ? (size_t)M * V - 200 : floats, arows = k == 1 ? 2 * (size_t)M + 4 : rows;
            if (ds_probe_arena_init(&ar, be, af, arows, err, sizeof err)) { CHECK(0, "arena: %s", err); break; }
            put_ctx pc = { cap[k], P };
            const ds_probe pr = { .wants = NULL, .fn = put_row, .user = &pc, .arena = &ar };
            ds_ctx_set_probe(c, &pr);
            CHECK(ds_forward_batch(c, block, M, P, DS_LOGITS_ALL, logits, NULL, err, sizeof err) == 0, "forward: %s", err);
            if (k == 2 && ar.n_rec) {
                const ds_probe_rec *victim = &ar.rec[ar.n_rec / 2];
                const size_t idx = victim->n / 3;
                float v;
                uint32_t u;
                be->i->download(ex, &v, ar.dev + victim->off + idx, sizeof v);
                memcpy(&u, &v, sizeof u);
                u ^= 1u;                          /* the lowest mantissa bit: 1 ULP */
                memcpy(&v, &u, sizeof v);
                be->i->upload(ex, ar.dev + victim->off + idx, &v, sizeof v);
                planted = (dsd_key){ victim->pos - P, victim->layer, (uint32_t)victim->cp, (uint32_t)victim->sub };
                planted_idx = (int64_t)idx;
            }
            CHECK(ds_probe_flush(ex, &pr, err, sizeof err) == 0, "flush: %s", err);
            ds_ctx_set_probe(c, NULL);
            downloads[k] = ar.downloads;
            early[k] = ar.early;
            ds_probe_arena_free(&ar);
            ds_state_restore(c, &s0);
            dsd_capture_finalize(cap[k]);
        }
        CHECK(downloads[0] == 1 && early[0] == 0, "big arena: downloads=%ld early=%ld (want 1, 0)", downloads[0], early[0]);
        CHECK(early[1] > 10, "small arena: only %ld early flushes", early[1]);
        dsd_report rs = { 0 }, rp = { 0 };
        if (cap[0] && cap[1] && cap[2]) {
            CHECK(dsd_diff(cap[1], cap[0], &rs) == DSD_OK, "diff small");
            CHECK(dsd_report_identical(&rs) && rs.compared_objects == dsd_capture_count(cap[0]) &&
                  rs.compared_objects > (size_t)M * 3 * 20,
                  "small arena: not the big arena's capture (compared %zu of %zu, diverged %zu, errors %llu)",
                  rs.compared_objects, dsd_capture_count(cap[0]), rs.diverged_objects, (unsigned long long)rs.errors_a);
            printf("%s arena_small on %s: %ld early flushes + row-by-row logits capture the same %zu objects as one download\n",
                   dsd_report_identical(&rs) ? "PASS" : "FAIL", tu_device(), early[1], rs.compared_objects);
            CHECK(dsd_diff(cap[2], cap[0], &rp) == DSD_OK, "diff planted");
            const dsd_object_result *f = dsd_report_first(&rp);
            const int caught = f && !dsd_key_cmp(&f->key, &planted) && rp.diverged_objects == 1 && f->m.mismatch_count == 1 &&
                               f->m.first_mismatch == planted_idx && f->m.max_ulp == 1 && f->m.first_diff_bit == 0;
            char sb[DSD_NAME_MAX];
            CHECK(caught, "planted flip at row=%d layer=%d %s %s [%lld] not caught exactly (diverged %zu)", planted.row,
                  planted.layer, dsd_cp_name(planted.cp), dsd_sub_name(planted.sub, sb), (long long)planted_idx,
                  rp.diverged_objects);
            printf("%s planted_flip on %s: one bit flipped in the capture arena at row=%d layer=%d checkpoint=%s subobject=%s "
                   "element=%lld -> first_divergence there, mismatches=1 max_ulp=1, %zu other objects identical\n",
                   caught ? "PASS" : "FAIL", tu_device(), planted.row, planted.layer, dsd_cp_name(planted.cp),
                   dsd_sub_name(planted.sub, sb), (long long)planted_idx, rp.compared_objects - rp.diverged_objects);
        }
        dsd_report_free(&rs);
        dsd_report_free(&rp);
        ds_state_free(&s0);
        for (int k = 0; k < 3; k++) dsd_capture_free(cap[k]);
        free(logits);
    }

    ds_ctx_free(c);
    ds_model_free(m);
    tu_rmdir(dir);
    return tu_finish("test_diverge");
}
