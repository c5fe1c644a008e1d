#!/bin/sh
# cli_pretok.sh — dspark's pre-tokenizers split text exactly as llama.cpp's.
#
# The reference is llama.cpp's own splitter: src/unicode.cpp and
# src/unicode-data.cpp from the peer source tarball (../shared/peers, SKIP when
# absent or without g++) built with tests/tools/ref_split.cpp. Each of
# dspark's 29 regex sequences (test_vocab --patterns) is given to both, and
# both split the same texts: llama.cpp's test texts (tests/data/vocab/*.inp)
# and 400 random strings drawn from letters of several scripts, combining
# marks, digits, punctuation, symbols, emoji and every kind of whitespace.
# Every piece must match; the first difference is printed.
BUILD=${BUILD:-build}
fail=0
TB=""
for c in ../shared/peers /work/shared/peers; do
    for f in "$c"/llama.cpp-*-src.tar.xz; do [ -f "$f" ] && { TB=$f; break 2; }; done
done
if [ -z "$TB" ] || ! command -v g++ >/dev/null 2>&1 || ! command -v python3 >/dev/null 2>&1; then
    echo "SKIP llama.cpp's splitter (no peer source tarball, g++ or python3)"
    exit 0
fi
T=$(mktemp -d "${TMPDIR:-/tmp}/dspark-pretok-XXXXXX")
trap 'rm -rf "$T"' EXIT INT TERM
u=$(tar tJf "$TB" | grep -m1 'src/unicode\.cpp$')
pfx=${u%src/unicode.cpp}
if [ -z "$u" ] || ! tar xJf "$TB" -C "$T" "${pfx}src/unicode.cpp" "${pfx}src/unicode.h" "${pfx}src/unicode-data.cpp" \
        "${pfx}src/unicode-data.h" 2>"$T/tar.err"; then
    echo "FAIL extracting llama.cpp's unicode sources: $(head -c 200 "$T/tar.err")"; exit 1
fi
S="$T/${pfx}src"
if ! g++ -O1 -std=c++17 -I"$S" tests/tools/ref_split.cpp "$S/unicode.cpp" "$S/unicode-data.cpp" \
        -o "$T/ref_split" 2>"$T/cc.err"; then
    echo "FAIL building the reference splitter: $(head -c 300 "$T/cc.err")"; exit 1
fi
echo "PASS built llama.cpp's splitter ($(basename "$TB"))"

# the texts: llama.cpp's test texts, then random ones (seeded)
python3 - "$T/texts" tests/data/vocab/ggml-vocab-gpt-2.gguf.inp <<'PY'
import random, sys
out, inp = sys.argv[1], sys.argv[2]
texts = open(inp, 'rb').read().split(b'\n__ggml_vocab_test__\n')
pools = [
    "abcxyzABCXYZ", "0123456789", " ", "  \t", "\n\r", ".,;:!?'\"()[]{}<>-_/\\@#$%^&*+=|~`",
    "'s 't 're 've 'm 'll 'd 'S 'LL", "éüßøñÅÆœ", "\u0301\u0308\u0327", "абвгдЖЗИЙ", "αβγδΩΣ",
    "你好世界中文字", "こんにちはカタカナ", "한국어가나다", "ﾊﾟｰｽ", "½²³¼", "€£¥₹©®™", "…。，、！？：；“”‘’—",
    "\u00a0\u2009\u3000\u2028\u0085\u1680\u202f\u205f", "🦙🚀😁😶‍🌫️", "\u200b\u200d\ufeff", "١٢٣٤", "ⅠⅡⅢ",
    "กขฃ", "हिन्दी", "IMGIMGABZ<sentinel:12>", "    ", "ǅǈǋ", "ʰʲʷ",
    "𠀀𪜀々〆豈⺀㐀", "ក្ខက်가", "1234567890", "１２３", "'S'RE'Ll",
]
rnd = random.Random(26)
for _ in range(400):
    s = ''.join(rnd.choice(rnd.choice(pools)) for _ in range(rnd.randint(1, 40)))
    texts.append(s.encode())
open(out, 'wb').write(b'\0'.join(texts))
PY
n_texts=$(python3 -c "import sys;print(open(sys.argv[1],'rb').read().count(b'\0')+1)" "$T/texts")
names="gpt-2 llama-bpe qwen2 default qwen35 deepseek-llm deepseek-coder deepseek-v3 falcon starcoder jais-2
spark2_5 youtu poro-chat viking tekken chameleon gpt-4o granite-embed-multi-97m bailingmoe seed-coder
ufakzeka laguna exaone-moe minicpm5 kimi-k2 afmoe tiny_aya superbpe"
n=0
for name in $names; do
    n=$((n+1))
    "$BUILD/tests/test_vocab" --patterns "$name" >"$T/pat" || { echo "FAIL patterns of $name"; fail=1; continue; }
    "$T/ref_split" "$T/pat" <"$T/texts" >"$T/ref" 2>"$T/ref.err" || { echo "FAIL llama.cpp's splitter on $name: $(head -c 200 "$T/ref.err")"; fail=1; continue; }
    "$BUILD/tests/test_vocab" --split "$name" <"$T/texts" >"$T/ds" 2>"$T/ds.err" || { echo "FAIL dspark's splitter on $name: $(head -c 200 "$T/ds.err")"; fail=1; continue; }
    if cmp -s "$T/ref" "$T/ds"; then
        echo "PASS pre-tokenizer $name: $n_texts texts split as llama.cpp splits them"
    else
        line=$(cmp "$T/ref" "$T/ds" | sed -n 's/.* line \([0-9]*\)$/\1/p')
        diffs=$(python3 -c "import sys;a=open(sys.argv[1]).read().split('\n');b=open(sys.argv[2]).read().split('\n');print(sum(x!=y for x,y in zip(a,b)))" "$T/ref" "$T/ds")
        echo "FAIL pre-tokenizer $name: $diffs of $n_texts texts differ; first, text $line:"
        echo "    llama.cpp: $(sed -n "${line}p" "$T/ref" | head -c 400)"
        echo "    dspark:    $(sed -n "${line}p" "$T/ds" | head -c 400)"
        fail=1
    fi
done
# counter-test: the comparison sees a wrong sequence (qwen2's splits against
# llama.cpp's qwen35, which keeps combining marks with their letters)
"$BUILD/tests/test_vocab" --patterns qwen35 >"$T/pat"
"$T/ref_split" "$T/pat" <"$T/texts" >"$T/ref"
"$BUILD/tests/test_vocab" --split qwen2 <"$T/texts" >"$T/ds"
if cmp -s "$T/ref" "$T/ds"; then echo "FAIL counter-test: qwen2's splits pass for qwen35's"; fail=1
else echo "PASS counter-test: qwen2's splits differ from llama.cpp's qwen35 splits"; fi
exit $fail
