/* device.c — the device names this build knows (see device.h). The names
 * are the backend registry's (backend.c); this only answers "known?" so the
 * CLI can refuse an unknown --device before loading anything. */
#include "device.h"
#include "backend.h"

#include <string.h>

/* One list of names: the registry's (ds_backend_names, comma-separated). */
int ds_device_known(const char *name) {
    if (!name || !*name || strchr(name, ',')) return 0;
    const size_t n = strlen(name);
    for (const char *p = ds_backend_names(); *p;) {
        const char *e = strchr(p, ',');
        const size_t l = e ? (size_t)(e - p) : strlen(p);
        if (l == n && !strncmp(p, name, n)) return 1;
        if (!e) break;
        p = e + 1;
    }
    return 0;
}

const char *ds_device_list(void) { return ds_backend_names(); }
