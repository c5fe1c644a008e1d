#!/bin/sh
# tests/cuda/tp_cli.sh — tensor parallelism on one device through the CLI
# (issue 25, docs/TP.md): `--device cuda --tp N` runs N ranks on the GPU with
# the dev communicator (the collectives as the backend's device-to-device
# copies and add op, no host round trip), and its bytes are the one-device
# bytes. tests/cuda/run.sh runs it (`make test-cuda`); DSPARK_DEVICE picks
# the device (cuda when unset), so it dry-runs on the CPU with the same
# communicator:
#   DSPARK_DEVICE=cpu DSPARK_TP_COMM=dev BUILD=build sh tests/cuda/tp_cli.sh
# Checks (each on $DEV, --tp 2 against --tp 1 = the plain one-device path):
#   - generate: plain greedy (Q8_0), speculative greedy (the shipped pair),
#     seeded T=0.8 (F16), plain and speculative: stdout byte for byte;
#   - --dump-logits (raw f32) of the shipped Q8_0 and F16 targets identical;
#   - -v says tp=2 ranks=<dev>:0x2 comm=dev;
#   - a 4-KV-head model (F16 and Q8_0): logits at --tp 1, 2, 4 identical, and
#     --fast tp_reduce (the row-parallel all-reduce) at --tp 2 NOT identical on
#     F16 (the counter-test);
#   - perplexity --tp 2 == --tp 1 to the printed digit;
#   - diverge --tp 2 (Pass A one rank, Pass B two): FIRST_DIVERGENCE NONE; with
#     --fast tp_reduce the first divergence at layer 0's o_proj;
#   - bench --tp 2 prints its tp line (the collectives a decode step issues),
#     reported with the decode rate at --tp 1 and 2 (INFO, not a check).
# Prints PASS/FAIL lines; exit status 1 on any FAIL.
set -u
B=${BUILD:-build}
D=$B/dspark
DEV=${DSPARK_DEVICE:-cuda}
Q8=models/dspark-tiny-q8_0.gguf; F16=models/dspark-tiny-f16.gguf; DR=models/dspark-tiny-drafter-f16.gguf
P="It is a truth universally acknowledged, that"
PR="The river was quiet in the morning, and the boats waited by the old stone bridge."
T=$(mktemp -d); trap 'rm -rf "$T"' EXIT
fail=0
ok()  { echo "PASS $1"; }
bad() { echo "FAIL $1"; fail=1; }
for f in "$Q8" "$F16" "$DR"; do [ -f "$f" ] || { echo "FAIL $f missing (make models)"; exit 1; }; done

same() {   # DESC CMD...: CMD's stdout at --tp 2 == at --tp 1 (non-empty)
    desc=$1; shift
    "$@" --tp 1 >"$T/a" 2>"$T/ea" || { bad "$desc --tp 1: exit $? ($(tail -n 1 "$T/ea"))"; return; }
    "$@" --tp 2 >"$T/b" 2>"$T/eb" || { bad "$desc --tp 2: exit $? ($(tail -n 1 "$T/eb"))"; return; }
    [ -s "$T/a" ] && cmp -s "$T/a" "$T/b" && ok "$DEV $desc: --tp 2 == --tp 1 ($(wc -c <"$T/a") bytes)" \
        || bad "$DEV $desc: --tp 2 differs from --tp 1"
}
same "plain greedy Q8_0"      "$D" generate --device "$DEV" -m "$Q8" -p "$P" -n 48 -t 2
same "spec greedy Q8_0"       "$D" generate --device "$DEV" -m "$Q8" -md "$DR" -p "$P" -n 48 -t 2
same "plain T=0.8 F16"        "$D" generate --device "$DEV" -m "$F16" -p "$P" -n 48 -t 2 --temp 0.8 --seed 7
same "spec T=0.8 F16"         "$D" generate --device "$DEV" -m "$F16" -md "$DR" -p "$P" -n 48 -t 1 --temp 0.8 --seed 7
same "perplexity Q8_0"        sh -c 'xz -dc data/val.txt.xz 2>/dev/null | head -c 40000 >"$1/val.txt";
    shift; "$@" | cut -d" " -f1-5' _ "$T" "$D" perplexity --device "$DEV" -m "$Q8" -f "$T/val.txt" -c 128 --chunks 3 -t 2
for m in "$Q8" "$F16"; do
    for n in 1 2; do
        "$D" generate --device "$DEV" -m "$m" -p "$P" -n 4 -t 2 --tp $n --dump-logits "$T/s$n" >/dev/null 2>"$T/e" \
            || bad "dump-logits $m --tp $n: $(tail -n 1 "$T/e")"
    done
    [ -s "$T/s1" ] && cmp -s "$T/s1" "$T/s2" && ok "$DEV $(basename "$m"): raw logits --tp 2 == --tp 1" || bad "$DEV $(basename "$m"): logits differ"
done
v=$("$D" generate --device "$DEV" -m "$Q8" -p "$P" -n 2 -t 1 --tp 2 -v 2>&1 >/dev/null | grep '^tp=')
[ "$v" = "tp=2 ranks=$DEV:0x2 comm=dev" ] && ok "-v: $v" || bad "-v: '$v' (want tp=2 ranks=$DEV:0x2 comm=dev)"

# --- 4 KV heads: --tp 1, 2, 4 ---------------------------------------------------
for ty in f16 q8_0; do
    "$D" make-model -o "$T/m4$ty.gguf" --type $ty --n-embd 256 --n-layer 3 --n-head 8 --n-head-kv 4 --head-dim 32 --n-ff 512 \
        --n-vocab 400 --seed 5 >/dev/null 2>&1 || { bad "make-model $ty"; continue; }
    for n in 1 2 4; do
        "$D" generate --device "$DEV" -m "$T/m4$ty.gguf" -p "$PR" -n 6 -t 2 --tp $n --dump-logits "$T/l$n" >/dev/null 2>"$T/e" \
            || bad "4 KV heads $ty --tp $n: $(tail -n 1 "$T/e")"
    done
    cmp -s "$T/l1" "$T/l2" && cmp -s "$T/l1" "$T/l4" && [ -s "$T/l1" ] && ok "$DEV 4 KV heads $ty: logits at --tp 1, 2, 4 identical" \
        || bad "$DEV 4 KV heads $ty: logits differ across --tp"
    if [ $ty = f16 ]; then
        "$D" generate --device "$DEV" -m "$T/m4$ty.gguf" -p "$PR" -n 6 -t 2 --tp 2 --fast tp_reduce --dump-logits "$T/f2" >/dev/null 2>&1 \
            || bad "fast tp_reduce --tp 2"
        [ -s "$T/f2" ] && ! cmp -s "$T/l1" "$T/f2" && ok "$DEV 4 KV heads f16: --fast tp_reduce --tp 2 moves logits (the counter-test)" \
            || bad "$DEV --fast tp_reduce --tp 2 gave the canonical logits (counter-test blind)"
    fi
done

# --- diverge: Pass A one rank, Pass B two ------------------------------------------
"$D" diverge --device "$DEV" -m "$F16" -p "$PR" --block-greedy 8 -t 2 --tp 2 >"$T/d" 2>&1
grep -q '^FIRST_DIVERGENCE NONE compared_objects=' "$T/d" && grep -q 'missing_in_a=0 missing_in_b=0' "$T/d" \
    && ok "$DEV diverge --tp 2: NONE, every checkpoint object on both sides" || { bad "$DEV diverge --tp 2"; tail -n 20 "$T/d"; }
"$D" diverge --device "$DEV" -m "$F16" -p "$PR" --block-greedy 8 -t 2 --tp 2 --fast tp_reduce >"$T/df" 2>&1
grep -q '^FIRST_DIVERGENCE row=0 layer=0 checkpoint=cp5_attn_out_proj ' "$T/df" \
    && ok "$DEV diverge --tp 2 --fast tp_reduce: found at o_proj" || { bad "$DEV fast tp_reduce not found at o_proj"; tail -n 20 "$T/df"; }

# --- bench: what a decode step costs at --tp 2 on one device (INFO) -----------------
for n in 1 2; do
    "$D" bench --device "$DEV" -m "$Q8" --reps 3 --tp $n >"$T/b$n" 2>&1 || bad "bench --tp $n: $(tail -n 1 "$T/b$n")"
done
grep -q "^tp=2 ranks=$DEV:0x2 comm=dev " "$T/b2" && ok "bench --tp 2: $(grep '^tp=' "$T/b2" | cut -c1-60)..." || bad "bench --tp 2 tp line"
echo "INFO bench --tp 1: $(grep '^decode:' "$T/b1")"
echo "INFO bench --tp 2: $(grep '^decode:' "$T/b2")"
exit $fail
