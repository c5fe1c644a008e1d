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

# golden_check FILE HASHES DESC: with GOLDEN_RECORD set, copy the HASHES
# just computed into FILE; else they must equal FILE's line for line.
golden_check() {
    if [ -n "${GOLDEN_RECORD:-}" ]; then
        cp "$2" "$1"; echo "recorded $(wc -l <"$2") hashes"
    elif diff "$1" "$2" >"$T/golden.diff"; then
        echo "PASS golden: $(wc -l <"$2") $3 outputs bit-identical to $1"
    else
        echo "FAIL golden: $3 outputs differ from $1:"; cat "$T/golden.diff"; fail=1
    fi
}

# spec_widths LABEL MODEL DRAFTER GREEDY SEEDED PROMPT: speculative decoding
# at draft widths 6, 3, 1 prints GREEDY's text greedy and SEEDED's with
# --temp 0.8 --seed 7 (48 tokens, 2 threads, what the plain runs used).
spec_widths() {
    for dm in 6 3 1; do
        $D generate -m "$2" -md "$3" --draft-max $dm -p "$6" -n 48 -t 2 >"$T/sw.g" 2>"$T/sw.err" \
            && cmp -s "$4" "$T/sw.g" && echo "PASS spec greedy == plain ($1, draft-max $dm, $(grep -o 'mean_accepted_len=[0-9.]*' "$T/sw.err"))" \
            || { echo "FAIL spec greedy != plain ($1, draft-max $dm): $(head -c 300 "$T/sw.err")"; fail=1; }
        $D generate -m "$2" -md "$3" --draft-max $dm -p "$6" -n 48 -t 2 --temp 0.8 --seed 7 >"$T/sw.s" 2>/dev/null \
            && cmp -s "$5" "$T/sw.s" && echo "PASS spec seeded == plain ($1, draft-max $dm)" \
            || { echo "FAIL spec seeded != plain ($1, draft-max $dm)"; fail=1; }
    done
}
