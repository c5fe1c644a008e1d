# lib_cli.sh — shared by the tests/cli_*.sh scripts (sourced, not run).
# expect_err DESC KEYWORD CMD...: CMD must fail with exit status 2 and exactly
# one stderr line containing KEYWORD (case-insensitive). Uses $T (a temp dir)
# and sets fail=1 on a mismatch.
expect_err() {
    desc=$1; kw=$2; shift 2
    "$@" >"$T/out" 2>"$T/err"; rc=$?
    lines=$(wc -l <"$T/err")
    if [ "$rc" -ne 2 ] || [ "$lines" -ne 1 ] || ! grep -qi -- "$kw" "$T/err"; then
        echo "FAIL $desc: rc=$rc lines=$lines stderr: $(head -c 300 "$T/err")"; fail=1
    else echo "PASS $desc: $(cat "$T/err")"; fi
}
