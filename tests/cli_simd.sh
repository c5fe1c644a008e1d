#!/bin/sh
# One SIMD dispatch (issue 8 item 7): DSPARK_SIMD caps the level every SIMD
# choice uses, `-v` reports it, and the bits do not depend on it: generate
# (plain, speculative, sampled) and the diverge report are byte-identical
# under portable, avx2, avxvnni and avx512 (a cap above the CPU's level runs
# the CPU's level; avxvnni on a CPU without AVX-VNNI runs avx2), and the
# ops/attention unit tests pass on each level.
set -u
B=${BUILD:-build}; D=$B/dspark
T=$(mktemp -d); trap 'rm -rf "$T"' EXIT
fail=0
M=models/dspark-tiny-q8_0.gguf; DR=models/dspark-tiny-drafter-f16.gguf
P="It is a truth universally acknowledged, that"
for lv in portable avx2 avxvnni avx512; do
    e="env DSPARK_SIMD=$lv"
    { $e $D generate -m $M -p "$P" -n 24 -v 2>"$T/v.$lv" &&
      $e $D generate -m $M -md $DR -p "$P" -n 24 &&
      $e $D generate -m $M -md $DR -p "$P" -n 24 --temp 0.8 -s 7 &&
      $e $D diverge -m $M -md $DR -p "$P" --kernels fast | grep -v '^TIMING\|^DIVERGE'; } >"$T/out.$lv" 2>/dev/null \
        || { echo "FAIL DSPARK_SIMD=$lv run"; fail=1; }
    got=$(sed -n 's/.* simd=\([a-z0-9]*\) .*/\1/p' "$T/v.$lv" | head -n 1)
    case "$lv:$got" in
        portable:portable|avx2:avx2|avx2:portable|avxvnni:avxvnni|avxvnni:avx2|avxvnni:portable|avx512:*)
            echo "PASS DSPARK_SIMD=$lv runs simd=$got";;
        *) echo "FAIL DSPARK_SIMD=$lv but -v says simd=$got"; fail=1;;
    esac
done
for lv in avx2 avxvnni avx512; do
    cmp -s "$T/out.portable" "$T/out.$lv" && echo "PASS outputs identical: portable vs $lv" \
        || { echo "FAIL outputs differ between portable and $lv"; fail=1; }
done
# Past two attention chunk boundaries (64, 128): the raw logits of 140
# greedy decode steps and a speculative run (the drafter's non-causal rows)
# are the same bits on every level (AVX-512 scores and exps 16 keys at a
# time, the other levels one key at a time).
# (AVX-512 scores and exps 16 keys at a time, AVX2 8, portable one.)
for lv in portable avx2 avxvnni avx512; do
    DSPARK_SIMD=$lv $D generate -m $M -p "$P" -n 140 --dump-logits "$T/lg.$lv" >/dev/null 2>&1 &&
    DSPARK_SIMD=$lv $D generate -m $M -md $DR -p "$P" -n 140 >"$T/long.$lv" 2>/dev/null \
        || { echo "FAIL DSPARK_SIMD=$lv long run"; fail=1; }
done
for lv in avx2 avxvnni avx512; do
    cmp -s "$T/lg.portable" "$T/lg.$lv" && cmp -s "$T/long.portable" "$T/long.$lv" \
        && echo "PASS 140-step logits and speculative text identical: portable vs $lv" \
        || { echo "FAIL 140-step logits or speculative text differ between portable and $lv"; fail=1; }
done
if [ -z "${DSPARK_SAN:-}" ]; then
    # the process-level paths (activation quantizers, attention, SwiGLU) of
    # each level against the references in the unit tests
    for lv in portable avx2 avxvnni; do
        for t in test_ops test_matmul; do
            DSPARK_SIMD=$lv "$B/tests/$t" >"$T/$t.$lv" 2>&1 && echo "PASS $t under DSPARK_SIMD=$lv" \
                || { echo "FAIL $t under DSPARK_SIMD=$lv"; tail -n 5 "$T/$t.$lv"; fail=1; }
        done
    done
fi
exit $fail
