#!/bin/sh
# Mean accepted length per round (accepted drafts + the bonus token) of the
# shipped drafter on held-out prompts: 64 prompts cut from the validation
# split (data/val.txt.xz, never trained on), greedy, gamma = 7, 128 new
# tokens each, canonical kernels, direct commit. Also checks that every
# speculative output equals the plain greedy output.
#   TARGET, DRAFTER, N (128), PROMPTS (64), THREADS (2)
set -eu
B=${BUILD:-build}
D=$B/dspark
TARGET=${TARGET:-models/dspark-tiny-q8_0.gguf}
DRAFTER=${DRAFTER:-models/dspark-tiny-drafter-f16.gguf}
N=${N:-128}
PROMPTS=${PROMPTS:-64}
THREADS=${THREADS:-2}
T=$(mktemp -d); trap 'rm -rf "$T"' EXIT
# prompts: 64 validation paragraphs of at least 200 bytes, first 200 bytes
# cut back to the last space (deterministic)
xz -dc data/val.txt.xz | python3 -c '
import sys
text = sys.stdin.read()
paras = [p.strip() for p in text.split("\n\n") if len(p.strip()) >= 200]
step = max(1, len(paras) // int(sys.argv[1]))
for p in paras[::step][:int(sys.argv[1])]:
    cut = p[:200]
    cut = cut[:cut.rfind(" ")] if " " in cut else cut
    print(cut.replace("\n", " "))
' "$PROMPTS" > "$T/prompts"
rounds=0; accepted=0; same=0; n=0
while IFS= read -r p; do
    n=$((n+1))
    $D generate -m "$TARGET" -md "$DRAFTER" -p "$p" -n "$N" -t "$THREADS" >"$T/spec" 2>"$T/stats"
    $D generate -m "$TARGET" -p "$p" -n "$N" -t "$THREADS" >"$T/plain" 2>/dev/null
    cmp -s "$T/spec" "$T/plain" && same=$((same+1))
    r=$(tr ' ' '\n' <"$T/stats" | sed -n 's/^rounds=//p')
    a=$(tr ' ' '\n' <"$T/stats" | sed -n 's/^accepted=//p')
    rounds=$((rounds+r)); accepted=$((accepted+a))
done < "$T/prompts"
python3 -c "import sys; r,a=int(sys.argv[1]),int(sys.argv[2]); print('acceptance prompts=%s rounds=%d accepted=%d mean_accepted_len=%.3f (incl. bonus) spec_equals_plain=%s/%s' % (sys.argv[3], r, a, (a+r)/r, sys.argv[4], sys.argv[3]))" "$rounds" "$accepted" "$n" "$same"
