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

# plain_hashes OUT MODEL PROMPT: into OUT (emptied) the hashes of the model
# file, its plain greedy text ($T/g) and its seeded text ($T/s: --temp 0.8
# --seed 7), 48 tokens on 2 threads — what spec_widths and threads_equal
# compare with.
plain_hashes() {
    : >"$1"
    echo "$(sha256sum <"$2" | cut -c1-64) model_file" >>"$1"
    $D generate -m "$2" -p "$3" -n 48 -t 2 >"$T/g" 2>/dev/null || { echo "FAIL generate greedy ($2)"; fail=1; }
    echo "$(sha256sum <"$T/g" | cut -c1-64) plain_greedy" >>"$1"
    $D generate -m "$2" -p "$3" -n 48 -t 2 --temp 0.8 --seed 7 >"$T/s" 2>/dev/null || { echo "FAIL generate seeded ($2)"; fail=1; }
    echo "$(sha256sum <"$T/s" | cut -c1-64) plain_t08" >>"$1"
}

# threads_equal LABEL MODEL PROMPT: greedy text with -t 1 and -t 3 == $T/g
# (plain_hashes' -t 2 run).
threads_equal() {
    $D generate -m "$2" -p "$3" -n 48 -t 1 >"$T/g1" 2>/dev/null && $D generate -m "$2" -p "$3" -n 48 -t 3 >"$T/g3" 2>/dev/null \
        && cmp -s "$T/g" "$T/g1" && cmp -s "$T/g" "$T/g3" && [ -s "$T/g" ] && echo "PASS $1 greedy text equal with -t 1, 2, 3" \
        || { echo "FAIL thread count changes the $1 text"; fail=1; }
}

# llama_agrees LABEL MODEL GREEDY PROMPT: where llama.cpp is built
# ($LLAMA_BIN, default /work/peer/avx2/bin), its llama-completion loads
# MODEL and prints PROMPT + GREEDY's text (48 tokens, greedy); else SKIP.
llama_agrees() {
    LB=${LLAMA_BIN:-/work/peer/avx2/bin}
    if [ ! -x "$LB/llama-completion" ]; then echo "SKIP llama.cpp cross-check (no $LB/llama-completion)"; return; fi
    "$LB/llama-completion" -m "$2" -p "$4" -n 48 --temp 0 -no-cnv -t 1 --no-warmup >"$T/lc" 2>/dev/null
    if python3 -c '
import sys
lc = open(sys.argv[1], "rb").read(); g = open(sys.argv[2], "rb").read().rstrip(b"\n"); p = sys.argv[3].encode()
sys.exit(0 if len(g) > 0 and p + g in lc else 1)' "$T/lc" "$3" "$4"; then
        echo "PASS llama.cpp ($LB) loads dspark's $1 file: the same greedy text"
    else
        echo "FAIL llama.cpp's greedy text differs on $1"; fail=1
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
