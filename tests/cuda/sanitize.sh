#!/bin/sh
# tests/cuda/sanitize.sh — the CUDA backend under NVIDIA compute-sanitizer.
# Optional and slow (the tools instrument every kernel), so not part of
# `make test-cuda`; run it after `make test-cuda` has built everything:
#
#   BUILD=build sh tests/cuda/sanitize.sh                  both tools
#   BUILD=build sh tests/cuda/sanitize.sh racecheck        one tool
#   PROGS="generate diverge" BUILD=build sh tests/cuda/sanitize.sh
#
# Tools:
#   memcheck   out-of-bounds and misaligned device accesses, hardware
#              exceptions, CUDA API errors, device memory leaks (reported
#              for allocations still live when the CUDA context goes away)
#   racecheck  shared-memory hazards (the reductions of matmul, attention,
#              the norms, argmax and sampling)
# Programs (PROGS, all four by default):
#   ops        $BUILD/tests/cuda/test_cuda_ops: every family x variant x
#              type, recorded graphs
#   generate   a short speculative generate on the shipped pair: drafter
#              heads, verify graphs, token selection on the device
#   diverge    a short diverge: the capture arena's same-stream
#              device-to-device copies, S0 snapshot and restore
#   attn       $BUILD/tests/cuda/bench_attn --small: attention's prefill
#              tile (cp.async double buffer, shared-memory phases) against
#              the split-KV path on the 8B shape, a partial tile and chunk
#   moe        a short generate on a make-model qwen3moe (8 of 64 experts,
#              Q8_0): the route, the ids' download, the gather, the grouped
#              experts and the combine (kernels/cuda/moe.cu)
# A run counts as failed when the tool reports an error, when it prints no
# summary (it did not finish), or when the program itself fails — a crash
# under the tool can come with a clean summary, so the exit status is read
# too. Per run one line; per tool one summary line:
#   SANITIZE tool=memcheck runs=3 failed_runs=0 errors=0 PASS
# (racecheck adds warnings=N: hazards the tool rates as possible, not
# certain; listed in the logs, not counted as failures). Exit status 1 when
# a tool fails; 0 with a note when there is no GPU or no compute-sanitizer.
set -u
BUILD=${BUILD:-build}
D="$BUILD/dspark"
TQ=models/dspark-tiny-q8_0.gguf
DR=models/dspark-tiny-drafter-f16.gguf
P="It is a truth universally acknowledged, that"
PROGS=${PROGS:-ops generate diverge attn moe}
TOOLS=${*:-memcheck racecheck}

CS=${COMPUTE_SANITIZER:-}
if [ -z "$CS" ]; then
    for c in "$(command -v compute-sanitizer 2>/dev/null)" "${CUDA_HOME:-/usr/local/cuda}/bin/compute-sanitizer" \
             "${CUDA_HOME:-/usr/local/cuda}/compute-sanitizer/compute-sanitizer"; do
        [ -n "$c" ] && [ -x "$c" ] && { CS=$c; break; }
    done
fi
if ! "$D" devices --require cuda >/dev/null 2>&1; then
    echo "sanitize: no usable CUDA device here ($("$D" devices 2>&1 | grep cuda || echo "this build has no CUDA backend")); nothing to run"
    exit 0
fi
if [ -z "$CS" ]; then
    echo "sanitize: compute-sanitizer not found (PATH, \$CUDA_HOME/bin; or set COMPUTE_SANITIZER); nothing to run"
    exit 0
fi
for f in "$TQ" "$DR" "$BUILD/tests/cuda/test_cuda_ops"; do
    [ -e "$f" ] || { echo "sanitize: $f missing (make test-cuda builds it)"; exit 1; }
done
mkdir -p "$BUILD/tests"
"$CS" --version 2>&1 | tail -n 1

status=0
for tool in $TOOLS; do
    case $tool in
    memcheck)  opts="--tool memcheck --leak-check full" ;;
    racecheck) opts="--tool racecheck" ;;
    *) echo "sanitize: unknown tool '$tool' (memcheck, racecheck)"; exit 2 ;;
    esac
    runs=0; failed=0; errors=0; warnings=0
    for prog in $PROGS; do
        case $prog in
        ops)      set -- env DSPARK_TILE_TEST_SMALL=1 "$BUILD/tests/cuda/test_cuda_ops" ;;
        generate) set -- "$D" generate --device cuda -m "$TQ" -md "$DR" -p "$P" -n 24 ;;
        diverge)  set -- "$D" diverge --device cuda -m "$TQ" -p "$P" --block-greedy 4 --fast matmul_q8_0 ;;
        attn)     set -- "$BUILD/tests/cuda/bench_attn" --small ;;
        moe)      MOE="$BUILD/tests/sanitize_moe.gguf"
                  [ -f "$MOE" ] || "$D" make-model -o "$MOE" --arch qwen3moe --type q8_0 --n-embd 128 --n-layer 2 \
                      --n-head 4 --n-head-kv 2 --n-ff 256 --n-expert 64 --n-expert-used 8 --n-ff-exp 64 --n-vocab 400 \
                      --seed 7 >/dev/null 2>&1
                  set -- "$D" generate --device cuda -m "$MOE" -p "$P $P $P" -n 16 ;;
        *) echo "sanitize: unknown program '$prog' (ops, generate, diverge, attn, moe)"; exit 2 ;;
        esac
        log="$BUILD/tests/sanitize_${tool}_${prog}.log"
        start=$(date +%s)
        # shellcheck disable=SC2086  # opts is a list of flags
        "$CS" $opts --error-exitcode 86 --print-limit 50 "$@" >"$log" 2>&1
        rc=$?
        runs=$((runs+1))
        if [ "$tool" = racecheck ]; then
            sum=$(sed -n 's/.*RACECHECK SUMMARY: [0-9]* hazards\{0,1\} displayed (\([0-9]*\) errors\{0,1\}, \([0-9]*\) warnings\{0,1\}).*/\1 \2/p' "$log" | tail -n 1)
        else
            sum=$(sed -n 's/.*ERROR SUMMARY: \([0-9]*\) errors\{0,1\}.*/\1 0/p' "$log" | tail -n 1)
        fi
        e=${sum%% *}; w=${sum##* }
        if [ -z "$sum" ]; then
            verdict="FAIL (no summary: the tool did not finish)"; failed=$((failed+1))
        elif [ "$e" -ne 0 ]; then
            verdict="FAIL"; failed=$((failed+1))
        elif [ "$rc" -ne 0 ]; then
            verdict="FAIL (the program exited $rc)"; failed=$((failed+1))
        else verdict="PASS"; fi
        errors=$((errors+${e:-0})); warnings=$((warnings+${w:-0}))
        printf '%s %s %s errors=%s%s exit=%s %ss (log: %s)\n' "$verdict" "$tool" "$prog" "${e:-?}" \
            "$([ "$tool" = racecheck ] && echo " warnings=${w:-?}")" "$rc" $(( $(date +%s) - start )) "$log"
        case $verdict in FAIL*) grep '^=========' "$log" | head -n 30 | sed 's/^/    /' ;; esac
    done
    extra=""; [ "$tool" = racecheck ] && extra=" warnings=$warnings"
    if [ "$failed" -eq 0 ]; then v=PASS; else v=FAIL; status=1; fi
    echo "SANITIZE tool=$tool runs=$runs failed_runs=$failed errors=$errors$extra $v"
done
exit $status
