#!/bin/sh
# gemv_ab.sh — the device check of the warp-streamed Q8_0 GEMV (q8w_kernel)
# in one command, after `make CUDA=1 BUILD=$BUILD all models`:
#   1. tests/cuda/bench_gemv: old (q8v) vs new (q8w) and its configurations on
#      the 8B shapes at M = 1, 2, 4, 8: memcmp + the host definition, times;
#   2. test_cuda_ops three ways: default (q8w), DSPARK_CUDA_OFF=gemv (q8v, the
#      A/B's other side), DSPARK_CUDA_OFF=fq (the short rows too through q8w);
#   3. with the 8B Q8_0 make-model file present (MODELS_DIR, or MAKE8B=1 to
#      make it, ~8 GB): dspark bench decode + forward_batch ratios, default
#      and DSPARK_CUDA_OFF=gemv, interleaved twice;
#   SAN=1: bench_gemv --check under compute-sanitizer memcheck and racecheck.
# Logs under $OUT (default /tmp/out). Exit status: 1 if any check failed.
set -u
B=${BUILD:-build-gemv}
O=${OUT:-/tmp/out}
MD=${MODELS_DIR:-/tmp/dspark-models}
mkdir -p "$O"
rc=0
echo "== bench_gemv"
"$B"/tests/cuda/bench_gemv > "$O/bench-gemv.txt" 2>&1 || rc=1
grep -E "^(PASS|FAIL)|^copy|^bench_gemv|M=[1-8]  (old|new)|^8B" "$O/bench-gemv.txt"
for cfg in "" gemv fq; do
    echo "== test_cuda_ops DSPARK_CUDA_OFF=$cfg"
    DSPARK_CUDA_OFF=$cfg "$B"/tests/cuda/test_cuda_ops > "$O/ops-off-${cfg:-none}.log" 2>&1 || rc=1
    grep -E "^FAIL" "$O/ops-off-${cfg:-none}.log" | head -20
    tail -1 "$O/ops-off-${cfg:-none}.log"
done
if [ "${SAN:-0}" = 1 ]; then      # optional: the bit checks under compute-sanitizer (slow)
    for tool in memcheck racecheck; do
        echo "== compute-sanitizer --tool $tool bench_gemv --check"
        compute-sanitizer --tool $tool --error-exitcode 3 "$B"/tests/cuda/bench_gemv --check > "$O/san-$tool.txt" 2>&1 || rc=1
        tail -2 "$O/san-$tool.txt"
    done
fi
f=$MD/8b-q8_0.gguf
if [ ! -f "$f" ] && [ "${MAKE8B:-0}" = 1 ]; then
    mkdir -p "$MD"
    "$B"/dspark make-model -o "$f" --type q8_0 --n-embd 4096 --n-layer 36 --n-head 32 --n-head-kv 8 \
        --head-dim 128 --n-ff 12288 --n-vocab 151936 --n-ctx 40960 --seed 1 >/dev/null || rc=1
fi
if [ -f "$f" ]; then
    for i in 1 2; do
        for cfg in "" gemv; do
            echo "== 8b q8_0 DSPARK_CUDA_OFF=$cfg (run $i)"
            DSPARK_CUDA_OFF=$cfg "$B"/dspark bench -m "$f" --device cuda --reps 5 --prefix 64 --decode 64 \
                --prefill-len 512 > "$O/8b-off-${cfg:-none}-$i.txt" 2>&1 || rc=1
            grep -E "^decode:|^M  |^[0-9]+ +[0-9]" "$O/8b-off-${cfg:-none}-$i.txt"
        done
    done
else
    echo "== no $f: the 8B decode A/B skipped (MAKE8B=1 makes it)"
fi
exit $rc
