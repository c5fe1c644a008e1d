/* device.c — the device names this build knows (see device.h). */
#include "device.h"

#include <string.h>

int ds_device_known(const char *name) {
    if (!name) return 0;
    if (strcmp(name, "cpu") == 0) return 1;
#ifdef DS_HAVE_CUDA
    if (strcmp(name, "cuda") == 0) return 1;
#endif
    return 0;
}

const char *ds_device_list(void) {
#ifdef DS_HAVE_CUDA
    return "cpu, cuda";
#else
    return "cpu";
#endif
}
