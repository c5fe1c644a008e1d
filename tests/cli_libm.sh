#!/bin/sh
# cli_libm.sh — output bits do not depend on the C library (issue 24 item 4,
# issue 22 item 6). With tests/libm/libm_shim.so preloaded, libm's
# sinf/cosf/sincosf/powf/expf/tanhf/exp/log (and their relatives) return a
# result one ulp off; the golden outputs (tests/cli_golden.sh: generated text,
# plain and speculative, greedy and seeded, and raw logits) must still be
# bit-identical to tests/data/golden.sha256, because every function in the
# arithmetic is project-owned (src/kernels/dsmath.h).
#
# Counter-test first: libm_probe prints libm's bits on fixed arguments, and
# every line must change under the shim, so the shim is known to be in effect
# in a dynamically linked program like dspark.
BUILD=${BUILD:-build}
SHIM="$BUILD/tests/libm/libm_shim.so"; PROBE="$BUILD/tests/libm/libm_probe"
[ -f "$SHIM" ] && [ -x "$PROBE" ] || { echo "FAIL libm: $SHIM or $PROBE not built (make BUILD=$BUILD)"; exit 1; }
SHIM=$(cd "$(dirname "$SHIM")" && pwd)/$(basename "$SHIM")
T=$(mktemp -d); trap 'rm -rf "$T"' EXIT
fail=0
"$PROBE" >"$T/plain" || { echo "FAIL libm_probe"; exit 1; }
LD_PRELOAD="$SHIM" "$PROBE" >"$T/shim" || { echo "FAIL libm_probe under the shim"; exit 1; }
n=$(wc -l <"$T/plain")
same=$(paste -d'|' "$T/plain" "$T/shim" | awk -F'|' '$1 == $2' | wc -l)
if [ "$n" -ge 8 ] && [ "$same" -eq 0 ]; then
    echo "PASS libm_shim_moves_libm: $n of $n libm results moved by the shim"
else
    echo "FAIL libm_shim_moves_libm: $same of $n libm results unchanged under the shim"; fail=1
fi
# dspark must not link a libm function the shim would not see (a static
# copy would escape the test): it imports none of the moved names at all
if command -v nm >/dev/null 2>&1; then
    imp=$(nm -D "$BUILD/dspark" 2>/dev/null | awk '$1 == "U" { sub(/@.*/, "", $2); print $2 }' |
          grep -xE 'sinf|cosf|sincosf|powf|expf|tanhf|logf|exp2f|log2f|expm1f|log1pf|sin|cos|sincos|exp|log|pow|tanh|exp2' | tr '\n' ' ')
    if [ -z "$imp" ]; then echo "PASS libm_no_imports: dspark imports none of the moved functions"
    else echo "FAIL libm_no_imports: dspark imports $imp"; fail=1; fi
fi
if LD_PRELOAD="$SHIM" BUILD="$BUILD" sh tests/cli_golden.sh >"$T/golden" 2>&1; then
    echo "PASS libm_golden_under_shim: $(grep -c . tests/data/golden.sha256) golden outputs unchanged with libm moved by one ulp"
else
    echo "FAIL libm_golden_under_shim:"; cat "$T/golden"; fail=1
fi
exit $fail
