/* device.c — the device names this build knows (see device.h). The names
 * are the backend registry's (backend.c); this only answers "known?" so the
 * CLI can refuse an unknown --device before loading anything. */
#include "device.h"
#include "backend.h"

#include <string.h>

int ds_device_known(const char *name) {
    if (!name) return 0;
    if (strcmp(name, "cpu") == 0) return 1;
#ifdef DS_HAVE_CUDA
    if (strcmp(name, "cuda") == 0) return 1;
#endif
    return 0;
}

const char *ds_device_list(void) { return ds_backend_names(); }
