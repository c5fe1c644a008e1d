#!/bin/sh
# CLI contract: every user error is one clear line on stderr and exit status
# 2; good invocations work and are deterministic across thread counts.
set -u
D=${BUILD:-build}/dspark
T=$(mktemp -d); trap 'rm -rf "$T"' EXIT
fail=0
. tests/lib_cli.sh   # expect_err
$D make-model -o "$T/m.gguf" --n-embd 64 --n-layer 2 --n-head 2 --n-head-kv 1 --n-ff 128 --n-vocab 300 --n-ctx 64 --type q8_0 \
    || { echo "FAIL make-model"; exit 1; }
expect_err "no command"            "no command"          $D
expect_err "unknown command"       "unknown command"  $D frobnicate
expect_err "missing model file"    "cannot open\|no such" $D generate -m "$T/nope.gguf" -p hi
expect_err "unknown flag"          "unknown flag"     $D generate -m "$T/m.gguf" -p hi --bogus
expect_err "-n 0"                  "-n 0"             $D generate -m "$T/m.gguf" -p hi -n 0
expect_err "-n not a number"       "integer"          $D generate -m "$T/m.gguf" -p hi -n ten
expect_err "flag without value"    "needs a value"    $D generate -m "$T/m.gguf" -p
expect_err "no prompt"             "no prompt"        $D generate -m "$T/m.gguf"
expect_err "negative temp"         "temp"             $D generate -m "$T/m.gguf" -p hi --temp -0.5
expect_err "bad kernel set"        "kernel"           $D generate -m "$T/m.gguf" -p hi --kernels turbo
expect_err "unknown family"        "unknown kernel family" $D generate -m "$T/m.gguf" -p hi --fast matmul_q4
expect_err "bad -t"                "out of range"     $D generate -m "$T/m.gguf" -p hi -t 0
long=$(printf 'word %.0s' $(seq 1 200))
expect_err "prompt longer than ctx" "context"         $D generate -m "$T/m.gguf" -p "$long" -c 32
head -c 1000 "$T/m.gguf" > "$T/trunc.gguf"
expect_err "truncated gguf"        "gguf"             $D generate -m "$T/trunc.gguf" -p hi
expect_err "inspect truncated"     "gguf"             $D inspect "$T/trunc.gguf"
printf 'not a gguf file at all, just text' > "$T/text.gguf"
expect_err "not a gguf"            "magic\|gguf"      $D generate -m "$T/text.gguf" -p hi
expect_err "make-model bad type"   "type"             $D make-model -o "$T/x.gguf" --type q3_k
expect_err "perplexity no file"    "no text file"     $D perplexity -m "$T/m.gguf"
printf 'The river runs to the sea.\n' | xz -c > "$T/t.txt.xz"
expect_err "perplexity on an xz file" "xz-compressed"  $D perplexity -m "$T/m.gguf" -f "$T/t.txt.xz"
printf 'The river runs to the sea.\n' | gzip -c > "$T/t.txt.gz"
expect_err "prompt file gzip"      "gzip-compressed"  $D generate -m "$T/m.gguf" -f "$T/t.txt.gz"
printf 'abc\000def' > "$T/nul.txt"
expect_err "prompt file with NUL"  "not text"         $D generate -m "$T/m.gguf" -f "$T/nul.txt"

# good runs: deterministic whatever the thread count
for t in 1 2 3; do
    $D generate -m "$T/m.gguf" -p "The river" -n 24 -t $t >"$T/gen$t" 2>/dev/null || { echo "FAIL generate -t $t"; fail=1; }
done
if cmp -s "$T/gen1" "$T/gen2" && cmp -s "$T/gen1" "$T/gen3"; then echo "PASS generate identical for -t 1,2,3"; else echo "FAIL generate differs across thread counts"; fail=1; fi
$D generate -m "$T/m.gguf" -p "The river" -n 24 --prefill decode >"$T/gend" 2>/dev/null
if cmp -s "$T/gen1" "$T/gend"; then echo "PASS batched prefill == decode prefill (canonical)"; else echo "FAIL batched prefill output differs from decode prefill"; fail=1; fi
$D inspect "$T/m.gguf" >"$T/insp" && grep -q "blk.0.attn_q.weight" "$T/insp" && echo "PASS inspect lists tensors" || { echo "FAIL inspect"; fail=1; }
exit $fail
