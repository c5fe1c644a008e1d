/* outfile.c — safe outputs: refuse input == output, temp file + rename,
 * clean-up on failure and on termination signals (see outfile.h). */
#include "outfile.h"
#include "common.h"

#include <errno.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* ========================================================================
 * Same file?
 * ===================================================================== */

int ds_out_same_file(const char *out, const char *in) {
    struct stat so, si;
    if (!out || !in || strcmp(out, "-") == 0) return 0;
    if (stat(out, &so) != 0 || stat(in, &si) != 0) return 0;
    return so.st_dev == si.st_dev && so.st_ino == si.st_ino;
}

int ds_out_check_inputs(const char *out, const char *const *inputs, size_t n, char *err, size_t errlen) {
    for (size_t i = 0; i < n; i++) {
        if (!inputs[i] || !ds_out_same_file(out, inputs[i])) continue;
        if (strcmp(out, inputs[i]) == 0)
            ds_errf(err, errlen, "refusing to write '%s': it is an input of this command", out);
        else
            ds_errf(err, errlen, "refusing to write '%s': it is the same file as the input '%s'", out, inputs[i]);
        return -1;
    }
    return 0;
}

/* ========================================================================
 * Live temp files, reachable from a signal handler
 *
 * Why global: an async-signal handler has no argument to find its state
 * through. The table holds pointers to heap copies of the temp paths; a
 * slot is claimed and released with atomic exchanges, and the handler only
 * loads pointers and calls unlink(), both async-signal-safe.
 * ===================================================================== */

#define DS_OUT_SLOTS 32
static char *_Atomic g_tmp_paths[DS_OUT_SLOTS];
static atomic_int g_handlers_installed;

static void on_fatal_signal(int sig) {
    for (int i = 0; i < DS_OUT_SLOTS; i++) {
        char *p = atomic_load(&g_tmp_paths[i]);
        if (p) unlink(p);
    }
    signal(sig, SIG_DFL);   /* die of the same signal: the caller sees it */
    raise(sig);
}

static void install_handlers(void) {
    if (atomic_exchange(&g_handlers_installed, 1)) return;
    static const int sigs[] = { SIGINT, SIGTERM, SIGHUP };
    for (size_t i = 0; i < sizeof sigs / sizeof sigs[0]; i++) {
        struct sigaction old;
        if (sigaction(sigs[i], NULL, &old) != 0) continue;
        if (old.sa_handler != SIG_DFL) continue;   /* the embedding program owns it */
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_handler = on_fatal_signal;
        sigemptyset(&sa.sa_mask);
        sigaction(sigs[i], &sa, NULL);
    }
}

/* Returns the slot index, or -1 when the table is full (the file is then
 * still cleaned up on failure, only not on a signal). */
static int register_tmp(char *path) {
    install_handlers();
    for (int i = 0; i < DS_OUT_SLOTS; i++) {
        char *expect = NULL;
        if (atomic_compare_exchange_strong(&g_tmp_paths[i], &expect, path)) return i;
    }
    return -1;
}

static void unregister_tmp(int slot) {
    if (slot >= 0) atomic_store(&g_tmp_paths[slot], NULL);
}

/* ========================================================================
 * Open / commit / abort
 * ===================================================================== */

struct ds_outfile {
    FILE *f;
    char *path;      /* the target                                  */
    char *tmp;       /* temp file in the same directory, or NULL    */
    int slot;        /* signal-table slot of tmp, or -1             */
    int is_stdout;
};

static void out_free(ds_outfile *o) {
    free(o->path);
    free(o->tmp);
    free(o);
}

ds_outfile *ds_out_open(const char *path, char *err, size_t errlen) {
    if (!path || !*path) { ds_errf(err, errlen, "empty output path"); return NULL; }
    ds_outfile *o = calloc(1, sizeof *o);
    if (!o || !(o->path = strdup(path))) { free(o); ds_errf(err, errlen, "out of memory"); return NULL; }
    o->slot = -1;
    if (strcmp(path, "-") == 0) {
        o->f = stdout;
        o->is_stdout = 1;
        return o;
    }
    struct stat st;
    mode_t mode = 0644;
    if (stat(path, &st) == 0) {
        if (S_ISDIR(st.st_mode)) {
            ds_errf(err, errlen, "cannot write '%s': it is a directory", path);
            out_free(o);
            return NULL;
        }
        if (!S_ISREG(st.st_mode)) {
            /* a FIFO or a device: no rename possible, write straight in */
            o->f = fopen(path, "w");
            if (!o->f) {
                ds_errf(err, errlen, "cannot write '%s': %s", path, strerror(errno));
                out_free(o);
                return NULL;
            }
            return o;
        }
        mode = st.st_mode & 07777;   /* keep the replaced file's permissions */
    }
    size_t pl = strlen(path);
    o->tmp = malloc(pl + 16);
    if (!o->tmp) { ds_errf(err, errlen, "out of memory"); out_free(o); return NULL; }
    memcpy(o->tmp, path, pl);
    memcpy(o->tmp + pl, ".tmp.XXXXXX", 12);
    int fd = mkstemp(o->tmp);
    if (fd < 0) {
        ds_errf(err, errlen, "cannot create a temporary file next to '%s': %s", path, strerror(errno));
        out_free(o);
        return NULL;
    }
    o->slot = register_tmp(o->tmp);
    if (fchmod(fd, mode) != 0 || !(o->f = fdopen(fd, "wb"))) {
        ds_errf(err, errlen, "cannot write '%s': %s", o->tmp, strerror(errno));
        close(fd);
        ds_out_abort(o);
        return NULL;
    }
    return o;
}

FILE *ds_out_fp(ds_outfile *o) { return o ? o->f : NULL; }

const char *ds_out_tmp_path(const ds_outfile *o) {
    if (!o || o->is_stdout) return NULL;
    return o->tmp ? o->tmp : o->path;
}

int ds_out_commit(ds_outfile *o, char *err, size_t errlen) {
    if (!o) { ds_errf(err, errlen, "no output file"); return -1; }
    const char *shown = o->is_stdout ? "standard output" : o->path;
    int saved = 0;
    if (fflush(o->f) != 0) saved = errno ? errno : EIO;
    if (!saved && ferror(o->f)) saved = EIO;
    if (o->is_stdout) {
        clearerr(o->f);
        out_free(o);
        if (saved) { ds_errf(err, errlen, "writing %s failed: %s", shown, strerror(saved)); return -1; }
        return 0;
    }
    if (!saved && o->tmp && fsync(fileno(o->f)) != 0 && errno != EINVAL) saved = errno;
    if (fclose(o->f) != 0 && !saved) saved = errno ? errno : EIO;
    o->f = NULL;
    if (!saved && o->tmp && rename(o->tmp, o->path) != 0) saved = errno;
    if (saved) {
        ds_errf(err, errlen, "writing '%s' failed: %s", shown, strerror(saved));
        if (o->tmp) unlink(o->tmp);
    }
    unregister_tmp(o->slot);
    out_free(o);
    return saved ? -1 : 0;
}

void ds_out_abort(ds_outfile *o) {
    if (!o) return;
    if (o->f && !o->is_stdout) fclose(o->f);
    if (o->tmp) unlink(o->tmp);
    unregister_tmp(o->slot);
    out_free(o);
}

int ds_out_check_stdout(char *err, size_t errlen) {
    int saved = 0;
    if (fflush(stdout) != 0) saved = errno ? errno : EIO;
    if (!saved && ferror(stdout)) saved = EIO;
    if (saved) {
        clearerr(stdout);
        ds_errf(err, errlen, "writing standard output failed: %s", strerror(saved));
        return -1;
    }
    return 0;
}
