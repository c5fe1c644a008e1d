#!/bin/sh
# `make install PREFIX=tmp`, then examples/simple.c built against the
# installed library with `pkg-config --cflags --libs dspark` only, run on the
# shipped pair: its text equals `dspark generate`'s (speculative and plain).
# Also: the soname, the pkg-config version == `dspark --version`, and that
# the library exports the public API only (no ds_* engine internals).
set -u
B=${BUILD:-build}
T=$(mktemp -d); trap 'rm -rf "$T"' EXIT
fail=0
ok()  { echo "PASS $1"; }
bad() { echo "FAIL $1"; fail=1; }
TGT=models/dspark-tiny-q8_0.gguf
[ -f "$TGT" ] || TGT=models/dspark-tiny-f16.gguf
DR=models/dspark-tiny-drafter-f16.gguf
P=$T/prefix

# the build tree's own CUDA setting (a CPU-only tree on a machine with nvcc must not
# grow a CUDA module here: cli_serve then expects the binary to know it)
CU=0
[ -f "$B/libdspark-cuda.so" ] && CU=1
make --no-print-directory BUILD="$B" CUDA=$CU install PREFIX="$P" > "$T/install.log" 2>&1 || { cat "$T/install.log"; echo "FAIL make install"; exit 1; }
for f in bin/dspark lib/libdspark.so lib/libdspark.so.0 include/dspark.h include/dspark_diag.h lib/pkgconfig/dspark.pc; do
    [ -e "$P/$f" ] || bad "installed $f"
done
readelf -d "$P/lib/libdspark.so" | grep -q 'SONAME.*\[libdspark\.so\.0\]' && ok soname || bad soname
ver=$("$P/bin/dspark" --version)
pcver=$(PKG_CONFIG_PATH="$P/lib/pkgconfig" pkg-config --modversion dspark)
[ "$ver" = "dspark $pcver" ] && ok "version $pcver" || bad "version: '$ver' vs pkg-config '$pcver'"
leaked=$(nm -D --defined-only "$P/lib/libdspark.so" | awk '{print $3}' | grep -v '^dspark_\|^dsd_\|^DSPARK_' | head -3)
[ -z "$leaked" ] && ok exports_public_api_only || bad "exports internals: $leaked"

FLAGS=$(PKG_CONFIG_PATH="$P/lib/pkgconfig" pkg-config --cflags --libs dspark) || bad pkg-config
cc -std=c11 -Wall -Wextra -Werror examples/simple.c $FLAGS -o "$T/simple" && ok example_builds_with_pkg_config || { bad example_builds; exit 1; }
for dr in "$DR" -; do
    LD_LIBRARY_PATH="$P/lib" "$T/simple" "$TGT" "$dr" "The river" 48 > "$T/ex.txt" 2> "$T/ex.err" || { cat "$T/ex.err"; bad "example runs ($dr)"; continue; }
    if [ "$dr" = - ]; then "$B/dspark" generate -m "$TGT" -p "The river" -n 48 > "$T/cli.txt" 2>/dev/null
    else "$B/dspark" generate -m "$TGT" -md "$DR" -p "The river" -n 48 > "$T/cli.txt" 2>/dev/null; fi
    cmp -s "$T/ex.txt" "$T/cli.txt" && grep -q "n_gen=48" "$T/ex.err" && ok "example_equals_generate drafter=$dr" \
        || bad "example_equals_generate drafter=$dr"
done
[ "$fail" -eq 0 ]
