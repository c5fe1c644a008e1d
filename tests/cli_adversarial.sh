#!/bin/sh
# The small defects an adversarial pass found (issue 23, item 4), each as a
# class:
#   a lost write to stdout is one line and exit status 2 for every command
#     and every way out of one (--help and --version included, and commands
#     that exit() after their report);
#   seeds: `generate -s` takes any integer modulo 2^64, as the server does,
#     so every server answer replays (-1 is 2^64 - 1; junk is refused);
#   a command whose machine-readable output is stdout (diverge --json -)
#     writes its text report to stderr: the output parses;
#   JSON text from outside (config.json for convert, HTTP bodies for serve,
#     src/json_text.c) is one value with only whitespace around it: control
#     bytes before it and bytes after it are refused alike.
set -u
B=${BUILD:-build}
D=$B/dspark
TGT=models/dspark-tiny-q8_0.gguf
[ -f "$TGT" ] || TGT=models/dspark-tiny-f16.gguf
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
fail=0
. tests/lib_cli.sh   # expect_err

# ---- a lost write to stdout: exit 2, one line ------------------------------------------
full() {   # full DESC CMD...: stdout to /dev/full
    desc=$1; shift
    "$@" > /dev/full 2> "$T/err"; rc=$?
    if [ $rc -eq 2 ] && [ "$(wc -l < "$T/err")" -eq 1 ] && grep -qi "standard output" "$T/err"; then
        echo "PASS stdout_full $desc: $(cat "$T/err")"
    else
        echo "FAIL stdout_full $desc: rc=$rc stderr: $(head -c 300 "$T/err")"; fail=1
    fi
}
full "--version" $D --version
full "--help" $D --help
full "inspect" $D inspect "$TGT"
full "diverge --help (exit from inside)" $D diverge --help
full "families --help (exit from inside)" $D families --help
full "diverge" $D diverge -m "$TGT" -p "The river" --tokens 10,20 -t 1
full "generate" $D generate -m "$TGT" -p "The river" -n 4 -t 1
full "devices" $D devices

# ---- seeds: any integer, modulo 2^64 ---------------------------------------------------------
gen() { $D generate -m "$TGT" -p "It is a truth" -n 12 --temp 1 -t 1 -s "$1" 2>/dev/null; }
a=$(gen -1); b=$(gen 18446744073709551615); c=$(gen 9007199254740992); d=$(gen -9007199254740992); e=$(gen 0)
if [ -n "$a" ] && [ "$a" = "$b" ] && [ -n "$c" ] && [ -n "$d" ] && [ "$a" != "$e" ]; then echo "PASS seed_full_range (-1 == 2^64-1, +-2^53 taken)"
else echo "FAIL seed_full_range: '$a' '$b' '$c' '$d'"; fail=1; fi
expect_err "seed not an integer"  "expects an integer" $D generate -m "$TGT" -p x -s 1.5
expect_err "seed junk"            "expects an integer" $D generate -m "$TGT" -p x -s 12abc
expect_err "seed above 2^64-1"    "expects an integer" $D generate -m "$TGT" -p x -s 18446744073709551616
expect_err "seed with a plus"     "expects an integer" $D generate -m "$TGT" -p x -s +5

# ---- diverge --json -: the JSON alone on stdout, the report on stderr ------------------------
$D diverge -m "$TGT" -p "The river" --tokens 10,20 -t 1 --json - > "$T/d.json" 2> "$T/d.txt"; rc=$?
if [ $rc -eq 0 ] && python3 -c "import json,sys; json.load(open(sys.argv[1]))" "$T/d.json" && grep -q '^DIVERGE' "$T/d.txt"; then
    echo "PASS diverge_json_stdout_parses (report on stderr)"
else echo "FAIL diverge_json_stdout_parses rc=$rc: $(head -c 200 "$T/d.json")"; fail=1; fi
expect_err "diverge --json - --svg -" "same file" $D diverge -m "$TGT" -p "The river" --tokens 10,20 --json - --svg -

# ---- JSON text: one value, whitespace only around it ------------------------------------------
mkdir -p "$T/hf"
printf '{"architectures": ["Qwen3ForCausalLM"]} trailing' > "$T/hf/config.json"
expect_err "convert config.json trailing bytes" "after the JSON value" $D convert --in "$T/hf" --out "$T/o.gguf"
printf '\001{"architectures": ["Qwen3ForCausalLM"]}' > "$T/hf/config.json"
expect_err "convert config.json control byte before" "control byte" $D convert --in "$T/hf" --out "$T/o.gguf"
printf '{"architectures": ["Qwen3\\u0000ForCausalLM"]}' > "$T/hf/config.json"
expect_err "convert config.json NUL in a string" "U+0000" $D convert --in "$T/hf" --out "$T/o.gguf"
[ "$fail" -eq 0 ]
