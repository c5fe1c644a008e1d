#!/bin/sh
# Runs every test binary in $BUILD/tests and every tests/cli_*.sh script.
# Prints one line per test and the closing "N passed, N failed" line.
# Under DSPARK_SAN=1 only the suites marked san-safe run (tests/SAN_SUITES),
# so the sanitizer pass stays inside the time budget.
BUILD=${BUILD:-build}
pass=0; fail=0; failed=""
run_one() {
    name=$1; shift
    start=$(date +%s)
    if "$@" > "$BUILD/tests/$name.log" 2>&1; then
        pass=$((pass+1)); printf 'PASS %-32s %ss\n' "$name" $(( $(date +%s) - start ))
    else
        fail=$((fail+1)); failed="$failed $name"
        printf 'FAIL %-32s (log: %s)\n' "$name" "$BUILD/tests/$name.log"
        # the checks that failed first (a long log's tail may not hold them), then the tail
        grep -E '^ *FAIL' "$BUILD/tests/$name.log" | head -n 10 | sed 's/^/    failed: /'
        tail -n 20 "$BUILD/tests/$name.log" | sed 's/^/    /'
    fi
}
mkdir -p "$BUILD/tests"
for t in "$BUILD"/tests/test_*; do
    [ -x "$t" ] || continue
    case "$t" in *.log) continue;; esac
    name=$(basename "$t")
    if [ -n "$DSPARK_SAN" ] && ! grep -qx "$name" tests/SAN_SUITES 2>/dev/null; then continue; fi
    run_one "$name" "$t"
done
for s in tests/cli_*.sh; do
    [ -f "$s" ] || continue
    name=$(basename "$s" .sh)
    if [ -n "$DSPARK_SAN" ] && ! grep -qx "$name" tests/SAN_SUITES 2>/dev/null; then continue; fi
    run_one "$name" env BUILD="$BUILD" sh "$s"
done
[ -n "$DSPARK_SAN" ] && printf "sanitizers: "
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
