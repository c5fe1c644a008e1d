/* cmd_devices.c — `dspark devices`: every device this build has, started
 * once to say whether it works here (a CUDA build on a machine without a
 * GPU says why not). `--require NAME` exits 2 unless NAME can start: the
 * probe `make test-cuda` uses. */
#include "cli.h"
#include "backend.h"

#include <stdlib.h>
#include <string.h>

int cmd_devices(int argc, char **argv) {
    const char *C = "devices", *require = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            printf("usage: dspark devices [--require NAME]\n"
                   "  lists the devices of this build (%s), one key=value line each;\n"
                   "  --require NAME: exit 2 unless NAME starts here\n", ds_backend_names());
            return 0;
        } else if (!strcmp(argv[i], "--require")) require = cli_value(C, argc, argv, &i);
        else cli_die(C, "unknown option '%s' (try --help)", argv[i]);
    }
    char names[64];
    snprintf(names, sizeof names, "%s", ds_backend_names());
    int found = 0, ok_required = 0;
    for (char *save = NULL, *n = strtok_r(names, ",", &save); n; n = strtok_r(NULL, ",", &save)) {
        char err[DS_ERRLEN], desc[256] = "";
        ds_backend *be = ds_backend_new(n, err, sizeof err);
        if (be) {
            if (be->i->describe) be->i->describe(be, desc, sizeof desc);
            printf("device=%s status=ok %s\n", n, desc);
            ds_backend_free(be);
        } else {
            printf("device=%s status=unavailable reason=\"%s\"\n", n, err);
        }
        if (require && !strcmp(require, n)) { found = 1; ok_required = be != NULL; }
    }
    if (fflush(stdout) != 0) cli_die(C, "write error on standard output");
    if (require && !found) cli_die(C, "this build has no device '%s' (it has: %s)", require, ds_backend_names());
    if (require && !ok_required) cli_die(C, "device '%s' cannot start here", require);
    return 0;
}
