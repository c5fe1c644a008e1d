/* test_diverge.c — the first-divergence experiment on a real forward pass:
 * the non-perturbation gate passes; all-canonical kernels give
 * FIRST_DIVERGENCE NONE with every object compared; forcing one family fast
 * makes the experiment report a first divergence at a checkpoint that
 * family produces (so the check can fail); the isolated A/B agrees. */
#include "testutil.h"
#include "diverge.h"
#include "model_make.h"

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
            /* a device may refuse a weight type it has no kernels for (the
             * kquant types on CUDA): that is a refusal, not a wrong answer */
            CHECK(strcmp(tu_device(), "cpu") && strstr(err, "not supported"), "ab: %s", err);
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

    ds_ctx_free(c);
    ds_model_free(m);
    tu_rmdir(dir);
    return tu_finish("test_diverge");
}
