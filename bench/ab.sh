#!/bin/sh
# ab.sh OLD_DSPARK NEW_DSPARK — two builds side by side on the shipped pair,
# interleaved (old, new, old, new, ...) so that the shared CPU's drift hits
# both alike: plain decode tok/s, speculative tok/s (canonical + direct),
# and `dspark bench`'s decode ms and 8-row canonical verify ms on the Q8_0
# target. Prints medians, new/old ratios and the spread (max/min) of each.
set -eu
A=$1; B=$2
REPS=${REPS:-7}
Q8=models/dspark-tiny-q8_0.gguf; DR=models/dspark-tiny-drafter-f16.gguf
P="It is a truth universally acknowledged, that"
T=$(mktemp -d); trap 'rm -rf "$T"' EXIT
for i in $(seq "$REPS"); do
    for side in a b; do
        [ $side = a ] && D=$A || D=$B
        "$D" generate -m $Q8 -p "$P" -n 128 -t 2 2>&1 >/dev/null | sed -n 's/.*decode_tok_s=\([0-9.]*\).*/\1/p' >>"$T/plain_$side"
        "$D" generate -m $Q8 -md $DR -p "$P" -n 128 -t 2 2>&1 >/dev/null | sed -n 's/.*tok_s=\([0-9.]*\)$/\1/p' >>"$T/spec_$side"
        "$D" bench -m $Q8 -t 2 --reps 5 --prefix 64 --decode 32 --prefill-len 64 >"$T/b" 2>&1
        sed -n 's/^decode[^0-9]*\([0-9.]*\) ms.*/\1/p' "$T/b" | head -1 >>"$T/dec_$side"
        awk '$1=="8"{print $2}' "$T/b" | head -1 >>"$T/ver_$side"
    done
done
med() { sort -g "$1" | awk '{a[NR]=$1} END{if(NR==0){print "nan"; exit} print (NR%2)?a[(NR+1)/2]:(a[NR/2]+a[NR/2+1])/2}'; }
spread() { sort -g "$1" | awk 'NR==1{lo=$1} {hi=$1} END{if(NR==0||lo==0){print "nan"; exit} printf "%.2f", hi/lo}'; }
printf '%-26s %12s %12s %9s %13s\n' metric old new new/old 'spread(o,n)'
for k in plain spec dec ver; do
    case $k in plain) n="plain decode tok/s";; spec) n="spec canon+direct tok/s";; dec) n="bench decode ms";; ver) n="bench verify(8) canon ms";; esac
    a=$(med "$T/${k}_a"); b=$(med "$T/${k}_b")
    printf '%-26s %12s %12s %9s %6s,%6s\n' "$n" "$a" "$b" "$(awk -v a="$a" -v b="$b" 'BEGIN{printf (a>0)?"%.3f":"nan", b/a}')" "$(spread "$T/${k}_a")" "$(spread "$T/${k}_b")"
done
