/* device.h — which compute devices this build can run on.
 *
 * The device is chosen by name on the command line (--device NAME, default
 * "cpu"). This answers "does this build know NAME?" before anything is
 * loaded; ds_model_load_on(path, NAME) then starts that backend (backend.c),
 * which may still fail with one line (no GPU, driver mismatch). */
#ifndef DSPARK_DEVICE_H
#define DSPARK_DEVICE_H

#include <stddef.h>

/* 1 for "cpu"; 1 for "cuda" only in a build compiled with -DDS_HAVE_CUDA;
 * 0 for anything else (including NULL). */
int ds_device_known(const char *name);

/* The device names this build has, comma-separated ("cpu" or "cpu,cuda"). */
const char *ds_device_list(void);

#endif
