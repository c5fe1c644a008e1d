#!/bin/sh
# cli_golden.sh — the seam's rule: "not one bit changes". sha256 of generate
# output on the shipped pair (plain and -md, greedy and seeded T=0.8, a few
# prompts, Q8_0 and F16 targets) and of the raw logits of a batched prefill
# plus greedy decode steps (--dump-logits), against hashes recorded with the
# engine before the backend seam (tests/data/golden.sha256). A kernel change
# that moves a single bit of these outputs fails here.
#
#   GOLDEN_RECORD=1 sh tests/cli_golden.sh   rewrites the hash file (only for
#                                            a deliberate, documented change)
#   GOLDEN_ONLY="key ..." sh tests/cli_golden.sh   computes only those outputs
#                                            and compares them with their lines
#                                            (tests/cli_aarch64.sh: qemu is slow)
BUILD=${BUILD:-build}
D="$BUILD/dspark"
T=$(mktemp -d); trap 'rm -rf "$T"' EXIT
Q8=models/dspark-tiny-q8_0.gguf; F16=models/dspark-tiny-f16.gguf; DR=models/dspark-tiny-drafter-f16.gguf
DEV=${DSPARK_DEVICE:-cpu}
fail=0
want() { [ -z "$GOLDEN_ONLY" ] && return 0; case " $GOLDEN_ONLY " in *" $1 "*) return 0;; esac; return 1; }
out="$T/hashes"
: >"$out"
i=0
for p in "It is a truth universally acknowledged, that" "The river" "In the beginning"; do
    i=$((i+1))
    for tgt in q8 f16; do
        [ $tgt = q8 ] && M=$Q8 || M=$F16
        if want plain_greedy_${tgt}_p$i; then
            "$D" generate --device "$DEV" -m "$M" -p "$p" -n 48 -t 2 2>/dev/null >"$T/o" || { echo "FAIL generate plain $tgt p$i"; fail=1; }
            echo "$(sha256sum <"$T/o" | cut -c1-64) plain_greedy_${tgt}_p$i" >>"$out"
        fi
        if want spec_greedy_${tgt}_p$i; then
            "$D" generate --device "$DEV" -m "$M" -md "$DR" -p "$p" -n 48 -t 2 2>/dev/null >"$T/o" || { echo "FAIL generate spec $tgt p$i"; fail=1; }
            echo "$(sha256sum <"$T/o" | cut -c1-64) spec_greedy_${tgt}_p$i" >>"$out"
        fi
        if want plain_t08_${tgt}_p$i; then
            "$D" generate --device "$DEV" -m "$M" -p "$p" -n 48 -t 2 --temp 0.8 --seed 7 2>/dev/null >"$T/o" || { echo "FAIL generate plain T $tgt p$i"; fail=1; }
            echo "$(sha256sum <"$T/o" | cut -c1-64) plain_t08_${tgt}_p$i" >>"$out"
        fi
        if want spec_t08_${tgt}_p$i; then
            "$D" generate --device "$DEV" -m "$M" -md "$DR" -p "$p" -n 48 -t 1 --temp 0.8 --seed 7 2>/dev/null >"$T/o" || { echo "FAIL generate spec T $tgt p$i"; fail=1; }
            echo "$(sha256sum <"$T/o" | cut -c1-64) spec_t08_${tgt}_p$i" >>"$out"
        fi
        if want logits_${tgt}_p$i; then
            "$D" generate --device "$DEV" -m "$M" -p "$p" -n 4 -t 2 --dump-logits "$T/l" >/dev/null 2>&1 || { echo "FAIL dump-logits $tgt p$i"; fail=1; }
            echo "$(sha256sum <"$T/l" | cut -c1-64) logits_${tgt}_p$i" >>"$out"
        fi
    done
done
if [ -n "$GOLDEN_RECORD" ]; then
    cp "$out" tests/data/golden.sha256; echo "recorded $(wc -l <"$out") hashes"; exit 0
fi
exp=tests/data/golden.sha256
if [ -n "$GOLDEN_ONLY" ]; then
    exp="$T/expected"
    while read -r h k; do want "$k" && echo "$h $k"; done <tests/data/golden.sha256 >"$exp"
fi
if [ -s "$out" ] && diff "$exp" "$out" >"$T/diff"; then
    echo "PASS golden: $(wc -l <"$out") outputs bit-identical to the recorded engine"
else
    echo "FAIL golden: outputs differ from tests/data/golden.sha256:"; cat "$T/diff"; fail=1
fi
exit $fail
