/* test_harden.c — the small guarantees issue 14 asks for, one class each:
 *   safe outputs (src/outfile.c): output == input refused (hard link,
 *     symlink), temp file + rename, a pre-existing OUT.tmp never consumed,
 *     nothing left behind on abort or on SIGTERM, lost writes reported
 *     (/dev/full, stdout);
 *   error lines are one line without control bytes (ds_errf);
 *   DSPARK_SIMD values are parsed strictly; device names known per build;
 *   tokens are written whole, however long (tools/cli.c). */
#include "testutil.h"
#include "common.h"
#include "device.h"
#include "gguf.h"
#include "kernels/cpu/simd.h"
#include "kernels/kernels.h"
#include "outfile.h"
#include "tokenizer.h"

#include "../tools/cli.c"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>

static int count_entries(const char *dir) {
    DIR *d = opendir(dir);
    int n = 0;
    for (struct dirent *e; d && (e = readdir(d));)
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) n++;
    if (d) closedir(d);
    return n;
}

static char *slurp(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    char *b = calloc(1, 4096);
    size_t n = fread(b, 1, 4095, f);
    b[n] = 0;
    fclose(f);
    return b;
}

static void put(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    if (f) { fputs(text, f); fclose(f); }
}

static void test_outfile(const char *dir) {
    char out[512], tmp_user[600], lnk[512], hard[512], err[DS_ERRLEN];
    snprintf(out, sizeof out, "%s/out.json", dir);
    snprintf(tmp_user, sizeof tmp_user, "%s.tmp", out);
    put(tmp_user, "the user's own file");

    /* write + commit; the user's OUT.tmp survives */
    ds_outfile *o = ds_out_open(out, err, sizeof err);
    CHECK(o != NULL, "open: %s", err);
    if (o) {
        fputs("{\"a\":1}\n", ds_out_fp(o));
        CHECK(access(out, F_OK) != 0, "the target must not exist before commit");
        CHECK(ds_out_commit(o, err, sizeof err) == 0, "commit: %s", err);
    }
    char *s = slurp(out);
    CHECK(s && !strcmp(s, "{\"a\":1}\n"), "committed content");
    free(s);
    s = slurp(tmp_user);
    CHECK(s && !strcmp(s, "the user's own file"), "a pre-existing OUT.tmp was consumed");
    free(s);
    CHECK(count_entries(dir) == 2, "leftover files after commit (%d entries)", count_entries(dir));

    /* abort keeps the old target and leaves no temp */
    o = ds_out_open(out, err, sizeof err);
    if (o) { fputs("half", ds_out_fp(o)); ds_out_abort(o); }
    s = slurp(out);
    CHECK(s && !strcmp(s, "{\"a\":1}\n"), "abort changed the target");
    free(s);
    CHECK(count_entries(dir) == 2, "leftover files after abort");

    /* output == input, through a symlink and a hard link */
    snprintf(lnk, sizeof lnk, "%s/link.json", dir);
    snprintf(hard, sizeof hard, "%s/hard.json", dir);
    CHECK(symlink(out, lnk) == 0 && link(out, hard) == 0, "links");
    const char *ins[] = { NULL, out };
    CHECK(ds_out_check_inputs(lnk, ins, 2, err, sizeof err) != 0 && strstr(err, "same file"), "symlink accepted");
    CHECK(ds_out_check_inputs(hard, ins, 2, err, sizeof err) != 0 && !strchr(err, '\n'), "hard link accepted");
    CHECK(ds_out_check_inputs(out, ins, 2, err, sizeof err) != 0 && strstr(err, "input"), "same path accepted");
    char fresh[512];
    snprintf(fresh, sizeof fresh, "%s/new.json", dir);
    CHECK(ds_out_check_inputs(fresh, ins, 2, err, sizeof err) == 0, "a new file refused: %s", err);
    CHECK(ds_out_check_inputs("-", ins, 2, err, sizeof err) == 0, "stdout refused");
    unlink(lnk); unlink(hard);

    /* a directory is not an output */
    CHECK(ds_out_open(dir, err, sizeof err) == NULL && strstr(err, "directory"), "directory accepted");

    /* lost writes are errors: a device written directly, and stdout */
    if (access("/dev/full", W_OK) == 0) {
        o = ds_out_open("/dev/full", err, sizeof err);
        CHECK(o != NULL, "/dev/full open: %s", err);
        if (o) {
            fputs("lost", ds_out_fp(o));
            CHECK(ds_out_commit(o, err, sizeof err) != 0 && strstr(err, "No space"), "/dev/full write not reported: %s", err);
        }
        fflush(stdout);
        int saved = dup(1), full = open("/dev/full", O_WRONLY);
        if (saved >= 0 && full >= 0 && dup2(full, 1) >= 0) {
            fputs("lost\n", stdout);
            int rc = ds_out_check_stdout(err, sizeof err);
            dup2(saved, 1);
            CHECK(rc != 0 && strstr(err, "standard output"), "lost stdout write not reported");
        }
        if (full >= 0) close(full);
        if (saved >= 0) close(saved);
    }

    /* SIGTERM while writing: the temp file goes, the target stays as it was */
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        ds_outfile *c = ds_out_open(out, err, sizeof err);
        if (!c) _exit(3);
        fputs("partial", ds_out_fp(c));
        fflush(ds_out_fp(c));
        raise(SIGTERM);
        _exit(4);
    }
    int st = 0;
    waitpid(pid, &st, 0);
    CHECK(WIFSIGNALED(st) && WTERMSIG(st) == SIGTERM, "child did not die of SIGTERM (status %d)", st);
    CHECK(count_entries(dir) == 2, "SIGTERM left %d entries (a temp file behind?)", count_entries(dir));
    s = slurp(out);
    CHECK(s && !strcmp(s, "{\"a\":1}\n"), "SIGTERM changed the target");
    free(s);
    PASS("outfile");
}

static void test_sanitize(void) {
    char err[64];
    ds_errf(err, sizeof err, "arch '%s'", "a\nb\x1b[31mc\x7f\xc2\x9b" "d \xc3\xa9");
    CHECK(!strcmp(err, "arch 'a?b?[31mc???d \xc3\xa9'"), "sanitised: '%s'", err);
    PASS("sanitize");
}

static void test_simd_device(void) {
    int cap;
    char err[DS_ERRLEN];
    CHECK(ds_simd_parse(NULL, &cap, err, sizeof err) == 0 && cap == DS_LVL_COUNT, "unset");
    CHECK(ds_simd_parse("portable", &cap, err, sizeof err) == 0 && cap == DS_LVL_PORTABLE, "portable");
#if defined(__aarch64__)
    /* AArch64 builds know their own levels and refuse the x86 names */
    CHECK(ds_simd_parse("neon", &cap, err, sizeof err) == 0 && cap == DS_LVL_NEON, "neon");
    CHECK(ds_simd_parse("dotprod", &cap, err, sizeof err) == 0 && cap == DS_LVL_DOTPROD, "dotprod");
    CHECK(ds_simd_parse("i8mm", &cap, err, sizeof err) == 0 && cap == DS_LVL_I8MM, "i8mm");
    CHECK(ds_simd_parse("avx2", &cap, err, sizeof err) != 0 && strstr(err, "neon") && strstr(err, "i8mm"),
          "avx2 accepted on AArch64");
    /* the matmul level is I8MM only where ds_simd_level() is DOTPROD */
    CHECK(DS_LVL_BASE(ds_simd_mm_level()) == ds_simd_level(), "mm level %d vs level %d", ds_simd_mm_level(),
          ds_simd_level());
    CHECK(!ds_simd_level_ok(DS_LVL_I8MM) || ds_simd_level_ok(DS_LVL_DOTPROD), "i8mm without dotprod");
#else
    CHECK(ds_simd_parse("avx2", &cap, err, sizeof err) == 0 && cap == DS_LVL_AVX2, "avx2");
    CHECK(ds_simd_parse("avx512", &cap, err, sizeof err) == 0 && cap == DS_LVL_AVX512, "avx512");
    CHECK(ds_simd_parse("avxvnni", &cap, err, sizeof err) == 0 && cap == DS_LVL_AVXVNNI, "avxvnni");
    CHECK(ds_simd_parse("neon", &cap, err, sizeof err) != 0 && strstr(err, "avx2") && strstr(err, "avxvnni"),
          "neon accepted on x86");
    CHECK(ds_simd_parse("i8mm", &cap, err, sizeof err) != 0 && strstr(err, "'i8mm'") && strstr(err, "avx512"),
          "i8mm accepted on x86");
    CHECK(!ds_simd_level_ok(DS_LVL_I8MM) && !ds_simd_level_ok(DS_LVL_DOTPROD), "an AArch64 level runs on x86");
    /* the matmul level is AVXVNNI only where ds_simd_level() is AVX2 */
    CHECK(DS_LVL_BASE(ds_simd_mm_level()) == ds_simd_level(), "mm level %d vs level %d", ds_simd_mm_level(),
          ds_simd_level());
#endif
    CHECK(ds_simd_parse("AVX2", &cap, err, sizeof err) != 0 && strstr(err, "AVX2"), "AVX2 accepted");
    CHECK(ds_simd_parse("sse", &cap, err, sizeof err) != 0, "sse accepted");
    CHECK(ds_device_known("cpu") && !ds_device_known("gpu") && !ds_device_known(NULL) && !ds_device_known("CPU"), "devices");
#ifndef DS_HAVE_CUDA
    CHECK(!ds_device_known("cuda"), "cuda known without DS_HAVE_CUDA");
#endif
    PASS("simd_device");
}

/* A SentencePiece vocabulary with one 1000-byte token. */
static void test_long_token(const char *dir) {
    char path[512], err[DS_ERRLEN];
    snprintf(path, sizeof path, "%s/tok.gguf", dir);
    char *longtok = malloc(1001);
    memset(longtok, 'x', 1000);
    longtok[1000] = 0;
    const char *toks[] = { "<unk>", "<s>", "</s>", "a", longtok };
    gguf_writer *w = gguf_writer_new();
    gguf_set_str(w, "tokenizer.ggml.model", "llama");
    gguf_set_arr_str(w, "tokenizer.ggml.tokens", toks, 5);
    CHECK(gguf_writer_write(w, path, err, sizeof err) == 0, "write: %s", err);
    gguf_writer_free(w);
    gguf_ctx *g = gguf_open(path, err, sizeof err);
    ds_tokenizer *t = g ? ds_tokenizer_load(g, err, sizeof err) : NULL;
    CHECK(t != NULL, "tokenizer: %s", err);
    if (t) {
        char out[512];
        snprintf(out, sizeof out, "%s/text.bin", dir);
        FILE *f = fopen(out, "wb");
        CHECK(cli_write_token(f, t, 4) == 0 && cli_write_token(f, t, 3) == 0, "write token");
        long n = ftell(f);
        fclose(f);
        CHECK(n == 1001, "a 1000-byte token written as %ld bytes", n);
        char *buf = NULL;
        size_t len = 0, cap = 0;
        CHECK(cli_append_token(&buf, &len, &cap, t, 3) == 0 && cli_append_token(&buf, &len, &cap, t, 4) == 0, "append");
        CHECK(len == 1001 && buf[0] == 'a' && buf[1000] == 'x', "appended %zu bytes", len);
        free(buf);
        unlink(out);
        ds_tokenizer_free(t);
    }
    gguf_close(g);
    unlink(path);
    free(longtok);
    PASS("long_token");
}

/* general.alignment 1 lets tensors start anywhere: the reader refuses data
 * the kernels would load misaligned, and the row converter reads any
 * address (memcpy loads; UBSan in test-san would flag a cast load). */
static void test_alignment(const char *dir) {
    char path[512], err[DS_ERRLEN];
    snprintf(path, sizeof path, "%s/align1.gguf", dir);
    gguf_writer *w = gguf_writer_new();
    gguf_set_u32(w, "general.alignment", 1);
    gguf_set_str(w, "x", "abc");
    uint16_t h[3] = { 0x3c00, 0x4000, 0x4200 };       /* 1, 2, 3 in fp16 */
    float f[2] = { 1.0f, 2.0f };
    uint64_t ne3[1] = { 3 }, ne2[1] = { 2 };
    gguf_add_tensor(w, "a", DS_TYPE_F16, 1, ne3, h, sizeof h);
    gguf_add_tensor(w, "b", DS_TYPE_F32, 1, ne2, f, sizeof f);
    CHECK(gguf_writer_write(w, path, err, sizeof err) == 0, "write: %s", err);
    gguf_writer_free(w);
    gguf_ctx *g = gguf_open(path, err, sizeof err);
    CHECK(g == NULL && strstr(err, "aligned") && !strchr(err, '\n'), "misaligned tensor data accepted: %s", g ? "(opened)" : err);
    gguf_close(g);
    unlink(path);

    unsigned char buf[1 + 3 * 2 + 1 + sizeof(ds_block_q8_0)];
    memcpy(buf + 1, h, sizeof h);                      /* odd address */
    float out[32];
    ds_row_to_f32(DS_TYPE_F16, buf + 1, 3, out);
    CHECK(out[0] == 1.0f && out[1] == 2.0f && out[2] == 3.0f, "misaligned f16 row");
    ds_block_q8_0 blk = { 0x3c00, { 0 } };
    blk.qs[5] = 7;
    memcpy(buf + 1, &blk, sizeof blk);
    ds_row_to_f32(DS_TYPE_Q8_0, buf + 1, 32, out);
    CHECK(out[5] == 7.0f && out[0] == 0.0f, "misaligned q8_0 row");
    PASS("alignment");
}

int main(void) {
    char dir[256];
    tu_tmpdir(dir, sizeof dir);
    char sub[300];
    snprintf(sub, sizeof sub, "%s/out", dir);
    mkdir(sub, 0755);
    test_outfile(sub);
    test_sanitize();
    test_simd_device();
    test_long_token(dir);
    test_alignment(dir);
    tu_rmdir(dir);
    return tu_finish("test_harden");
}
