/* outfile.h — the one way dspark writes a file.
 *
 * Every command that writes (generate --dump-block, diverge --json/--svg,
 * bench --json, quantize, convert, make-model, make-drafter; the GGUF writer
 * underneath the last four) goes through this module, so the rules hold
 * everywhere at once:
 *
 *   - an output that is the same file as an input (same st_dev/st_ino after
 *     following symlinks) is refused before anything is opened: writing it
 *     would truncate the very mapping we read from;
 *   - a regular-file output is written to a fresh temp file in the same
 *     directory (mkstemp: a pre-existing OUT.tmp of the user's is never
 *     touched) and renamed over the target only when every write, the flush
 *     and the close succeeded; on failure, and on SIGINT/SIGTERM/SIGHUP, the
 *     temp file is removed and the target is left as it was;
 *   - "-" is stdout; a path that exists and is not a regular file (a FIFO,
 *     /dev/null, /dev/full) is written directly; in both cases every error,
 *     including the final flush, is reported.
 *
 * The signal clean-up needs the only process-global state in dspark outside
 * the SIMD level: a small table of live temp paths that an async-signal
 * handler can reach (a handler has no other way to find them). */
#ifndef DSPARK_OUTFILE_H
#define DSPARK_OUTFILE_H

#include <stddef.h>
#include <stdio.h>

typedef struct ds_outfile ds_outfile;

/* 1 if out and in both exist and are the same file (device and inode,
 * through symlinks); 0 otherwise (including when either does not exist). */
int ds_out_same_file(const char *out, const char *in);

/* 0 if out is none of the n inputs (NULL entries are skipped); else -1 with
 * "refusing to write OUT: it is the input IN" in err. */
int ds_out_check_inputs(const char *out, const char *const *inputs, size_t n, char *err, size_t errlen);

/* Open path for writing as described above. NULL with one line in err. */
ds_outfile *ds_out_open(const char *path, char *err, size_t errlen);
FILE *ds_out_fp(ds_outfile *o);
/* Where the bytes are going now: the temp file (or the target itself when it
 * is written directly; NULL for stdout). Lets a caller re-read and validate
 * what it wrote before ds_out_commit makes it visible. */
const char *ds_out_tmp_path(const ds_outfile *o);
/* Flush, check, close and rename into place; frees o. 0 on success, -1 with
 * one line in err (the temp file is removed, the target untouched). */
int ds_out_commit(ds_outfile *o, char *err, size_t errlen);
/* Give up: close, remove the temp file, free o. NULL is a no-op. */
void ds_out_abort(ds_outfile *o);

/* Flush stdout and report a lost write (ENOSPC, EPIPE, EIO...): 0 if every
 * byte written to stdout so far reached the kernel, else -1 with err. */
int ds_out_check_stdout(char *err, size_t errlen);

#endif
