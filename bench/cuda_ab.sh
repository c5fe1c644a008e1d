#!/bin/sh
# cuda_ab.sh — what each launch-saving path of the CUDA backend is worth, on
# the GPU, measured as an interleaved A/B in one run: `dspark bench` (decode
# ms/token and the 8-row canonical verify) with the default paths, then with
# each switched off alone through DSPARK_CUDA_OFF, or, written +NAME, an
# opt-in path switched on through DSPARK_CUDA_ON (same bits in every
# configuration: test_cuda_ops and test_drafter compare them), ROUNDS rounds,
# configurations interleaved inside each round. Medians and ratios to "all on".
#   MODEL=models/dspark-tiny-q8_0.gguf ROUNDS=3 PREFIX=128 PREFILL=64 CONFIGS="none swiglu fq ..."
set -eu
B=${BUILD:-build}
D=$B/dspark
MODEL=${MODEL:-models/dspark-tiny-q8_0.gguf}
ROUNDS=${ROUNDS:-3}
PREFILL=${PREFILL:-64}
PREFIX=${PREFIX:-128}
CONFIGS=${CONFIGS:-"none +epilogue swiglu fq multi prologue wide split pinned"}
$D devices --require cuda >/dev/null || { echo "cuda_ab.sh: no usable CUDA device" >&2; exit 2; }
T=$(mktemp -d); trap 'rm -rf "$T"' EXIT
r=1
while [ "$r" -le "$ROUNDS" ]; do
    for c in $CONFIGS; do
        off=$c; on=; [ "$c" = none ] && off=
        case $c in +*) on=${c#+}; off= ;; esac
        DSPARK_CUDA_OFF=$off DSPARK_CUDA_ON=$on $D bench -m "$MODEL" --device cuda --reps 7 --prefix "$PREFIX" --decode 64 --prefill-len "$PREFILL" \
            > "$T/$c.$r" 2>&1 || { echo "cuda_ab.sh: bench failed ($c)" >&2; cat "$T/$c.$r" >&2; exit 1; }
    done
    r=$((r + 1))
done
med() { sort -n | awk '{v[NR]=$1} END {print (NR % 2) ? v[(NR+1)/2] : (v[NR/2] + v[NR/2+1]) / 2}'; }
echo "model=$MODEL prefix=$PREFIX prefill=$PREFILL rounds=$ROUNDS (interleaved; NAME = that path switched off alone, +NAME = switched on)"
printf '%-10s %10s %10s %12s %12s %14s %12s\n' config decode_ms verify8_ms decode/dflt verify8/dflt prefill_tok_s prefill/dflt
for c in $CONFIGS; do
    dm=$(cat "$T/$c".* | awk '/^decode:/{print $2}' | med)
    vm=$(cat "$T/$c".* | awk '$1 == 8 {print $2}' | med)
    pm=$(cat "$T/$c".* | awk '/^prefill/{print $2}' | med)
    [ "$c" = none ] && { d0=$dm; v0=$vm; p0=$pm; }
    printf '%-10s %10.4f %10.4f %12.3f %12.3f %14.1f %12.3f\n' "$c" "$dm" "$vm" "$(awk "BEGIN{print $dm / $d0}")" \
        "$(awk "BEGIN{print $vm / $v0}")" "$pm" "$(awk "BEGIN{print $pm / $p0}")"
done
