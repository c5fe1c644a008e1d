#!/usr/bin/env python3
"""make_oracle.py -- the test data of tests/test_tok_oracle.c: token ids from
llama.cpp's own llama-tokenize, made once and kept here, so CI needs no llama.cpp.

  make_oracle.py train                    writes extra.inp, base.txt, base_raw.txt
  make_oracle.py expect LLAMA_TOKENIZE TEST_BIN   writes expected.txt

The texts: llama.cpp's tokenizer test texts (../ggml-vocab-gpt-2.gguf.inp, the
same 46 in every .inp) and extra.inp (below: chat markup with special tokens,
Han / kana / Hangul / Thai / Khmer, long digit runs, upper-case contractions,
non-ASCII spaces, combining marks, emoji, code).

base.txt is a byte-level BPE vocabulary (make_fixture.py's format, plus
`special ID TYPE` lines) learnt here from those texts WITHOUT any
pre-tokenization, so that its merges cross word, digit and script boundaries:
a pre-tokenizer that splits one place differently gives other ids.

`expect` asks TEST_BIN (build/tests/test_tok_oracle) to write each case's GGUF
(`--gguf VARIANT PRE OUT`: the vocabulary as a vocab-only llama file) and runs
llama-tokenize on it for every text, with special-token parsing (its default)
and without (--no-parse-special), BOS as the file and llama.cpp's per-name
defaults decide. A case whose ids equal an earlier case's is written as a
reference to it. Cases: the base vocabulary under every tokenizer.ggml.pre
name dspark accepts (and none), and the variants neox (no token for the bytes
0xc0, 0xc1, 0xf5..0xff, as gpt-neox's vocabulary), v2 (GGUF version 2),
addbos (tokenizer.ggml.add_bos_token = true), nobos (no bos/eos keys:
llama.cpp's defaults), nomerges (kimi-k2 without tokenizer.ggml.merges), and
base_raw.txt's BPE over raw UTF-8 (raw: model gpt2 with sarvam-moe, gemma4,
granite-embed-multi-311m; gemma4: tokenizer.ggml.model = gemma4)."""
import os, subprocess, sys, tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, '..'))
from make_fixture import byte_alphabet  # noqa: E402  (GPT-2's byte-level alphabet)
SEP = b'\n__ggml_vocab_test__\n'

EXTRA = [
    "<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\nHi there!<|endoftext|>",
    "user-defined without parsing: <think>ok</think>, control: <|im_start|>x<|im_end|>",
    "Kimi: 你好世界，我是Kimi。日本語のテキストと한국어 텍스트. 𠀀𪜀 々〆 豈 ⺀",
    "Numbers: 1234567890 12 123 1234 0.5 3,141,592 ١٢٣٤٥ １２３４ ½²³ 99999999999",
    "a1234567 b12 c123456 7777777x88",
    "ไทย ภาษา ខ្មែរ မြန်မာ ລາວ ꩠꩡ",
    "CAPS'S It's WE'LL they'Re I'M don'T 'tis o'clock",
    "Tabs\tand\u3000ideographic\u00a0nbsp\u2009thin  double   triple\n\n\n",
    "x=1;y+=2**3; if(a<=b){return c|d^e~f;} // ``code`` $var @dec #tag",
    "caf\u00e9 na\u00efve r\u00e9sum\u00e9 e\u0301 a\u0308 \u00c5ngstr\u00f6m",
    "emoji 🦙🚀😁 😶‍🌫️ 👨‍👩‍👧",
    "IMGIMGABZ <sentinel:12> chameleon",
    "    indented\n        more\r\n\r\nwindows\r\n",
    "$100 + 50% = ~€150 ^_^ | `tick` «quotes» „low“",
    "Ελληνικά Русский текст עברית العربية हिन्दी",
    "Hello world, hello World, HELLO WORLD, hello_world, helloWorld",
    "  leading spaces and trailing spaces   ",
    "ǅungla ǈubljana ǋ ʰʲʷ ﬁ ﬂ Ⅻ",
    "<|endoftext|><|endoftext|> double special",
    "Ο\u0085next-line\u2028line-sep\u2029para-sep\u1680ogham",
]


SPECIALS = [('<|endoftext|>', 3), ('<|im_start|>', 3), ('<|im_end|>', 3), ('<think>', 4), ('</think>', 4)]
SPECIAL_TEXTS = {t for t, _ in SPECIALS}


def texts():
    base = open(os.path.join(HERE, '..', 'ggml-vocab-gpt-2.gguf.inp'), 'rb').read().split(SEP)
    extra = open(os.path.join(HERE, 'extra.inp'), 'rb').read().split(SEP)
    return base + extra


def apply_merge(seqs, a, b, nid):
    """every adjacent (a, b) in seqs becomes nid, left to right"""
    for k, s in enumerate(seqs):
        out, i = [], 0
        while i < len(s):
            if i + 1 < len(s) and s[i] == a and s[i + 1] == b:
                out.append(nid); i += 2
            else:
                out.append(s[i]); i += 1
        seqs[k] = out


def train(n_merges=1000):
    open(os.path.join(HERE, 'extra.inp'), 'wb').write(SEP.join(t.encode() for t in EXTRA))
    b2u = byte_alphabet()
    toks = [b2u[b] for b in range(256)]
    ids = {t: i for i, t in enumerate(toks)}
    seqs = [[ids[b2u[b]] for b in t] for t in texts()]
    merges = []
    for _ in range(n_merges):
        counts = {}
        for s in seqs:
            for a, b in zip(s, s[1:]):
                counts[(a, b)] = counts.get((a, b), 0) + 1
        if not counts:
            break
        for p in [p for p in counts if toks[p[0]] + toks[p[1]] in SPECIAL_TEXTS]:
            del counts[p]          # the special tokens' texts stay theirs alone
        if not counts:
            break
        (a, b), c = min(counts.items(), key=lambda kv: (-kv[1], kv[0]))
        new = toks[a] + toks[b]
        if new not in ids:
            ids[new] = len(toks); toks.append(new)
        merges.append((toks[a], toks[b]))
        apply_merge(seqs, a, b, ids[new])
    specials = SPECIALS
    with open(os.path.join(HERE, 'base.txt'), 'w') as f:
        f.write('# made by make_oracle.py train: byte-level BPE learnt from the test texts, no pre-tokenization\n')
        f.write('n_vocab %d\n' % (len(toks) + len(specials)))
        for i, t in enumerate(toks):
            f.write('tok %d 1 %s\n' % (i, t.encode().hex()))
        for j, (t, ty) in enumerate(specials):
            f.write('tok %d %d %s\n' % (len(toks) + j, ty, t.encode().hex()))
        f.write('bos %d\neos %d\n' % (len(toks), len(toks)))
        for a, b in merges:
            f.write('merge %s %s\n' % (a.encode().hex(), b.encode().hex()))


def train_raw(n_merges=600):
    """base_raw.txt: BPE over raw UTF-8 as sarvam-moe and gemma4 use it --
    spaces written U+2581, one symbol per character, <0xNN> byte tokens for
    the characters the vocabulary lacks (those seen only once are left out,
    so that the fallback is exercised); learnt per line, as llama.cpp splits
    these texts at newlines before merging."""
    seqs, count = [], {}
    for t in texts():
        for line in t.decode().replace(' ', '\u2581').split('\n'):
            seqs.append(list(line))
            for ch in line:
                count[ch] = count.get(ch, 0) + 1
    toks = ['<0x%02X>' % b for b in range(256)] + sorted(ch for ch, c in count.items() if c >= 2) + ['\n', '\n\n']
    types = [6] * 256 + [1] * (len(toks) - 256)
    ids = {t: i for i, t in enumerate(toks)}
    seqs = [[ids.get(ch, -1) for ch in s] for s in seqs]
    merges = []
    for _ in range(n_merges):
        counts = {}
        for s in seqs:
            for a, b in zip(s, s[1:]):
                if a >= 0 and b >= 0:
                    counts[(a, b)] = counts.get((a, b), 0) + 1
        for p in [p for p in counts if toks[p[0]] + toks[p[1]] in SPECIAL_TEXTS]:
            del counts[p]
        if not counts:
            break
        (a, b), c = min(counts.items(), key=lambda kv: (-kv[1], kv[0]))
        new = toks[a] + toks[b]
        if new not in ids:
            ids[new] = len(toks); toks.append(new); types.append(1)
        merges.append((toks[a], toks[b]))
        apply_merge(seqs, a, b, ids[new])
    with open(os.path.join(HERE, 'base_raw.txt'), 'w') as f:
        f.write('# made by make_oracle.py train: BPE over raw UTF-8 (U+2581 for spaces, <0xNN> fallback)\n')
        f.write('n_vocab %d\n' % (len(toks) + len(SPECIALS)))
        for i, t in enumerate(toks):
            f.write('tok %d %d %s\n' % (i, types[i], t.encode().hex()))
        for j, (t, ty) in enumerate(SPECIALS):
            f.write('tok %d %d %s\n' % (len(toks) + j, ty, t.encode().hex()))
        f.write('bos %d\neos %d\n' % (len(toks), len(toks)))
        for a, b in merges:
            f.write('merge %s %s\n' % (a.encode().hex(), b.encode().hex()))


def expect(tokenize, test_bin):
    names = subprocess.run([test_bin, '--names'], check=True, capture_output=True, text=True).stdout.split()
    # 'gpt2' is dspark's own older spelling of 'gpt-2' (llama.cpp refuses it)
    cases = [('base', n) for n in names if n != 'gpt2'] + [('base', '-'), ('neox', 'gpt-2'), ('v2', 'deepseek-v3'),
                                             ('addbos', 'qwen2'), ('nobos', 'llama-bpe'), ('nomerges', 'kimi-k2'),
                                             ('raw', 'sarvam-moe'), ('raw', 'gemma4'),
                                             ('raw', 'granite-embed-multi-311m'), ('gemma4', '-')]
    tx = texts()
    seen = {}
    out = ['# llama-tokenize (llama.cpp de3ff81, /work/peer/avx2) ids, made by make_oracle.py expect',
           'texts %d' % len(tx)]
    with tempfile.TemporaryDirectory() as tmp:
        tf = os.path.join(tmp, 'text')
        for variant, pre in cases:
            g = os.path.join(tmp, 'v.gguf')
            subprocess.run([test_bin, '--gguf', variant, pre, g], check=True)
            for mode in ('special', 'plain'):
                lines = []
                for t in tx:
                    open(tf, 'wb').write(t)
                    cmd = [tokenize, '-m', g, '-f', tf, '--ids', '--no-escape', '--log-disable']
                    if mode == 'plain':
                        cmd.append('--no-parse-special')
                    r = subprocess.run(cmd, capture_output=True, text=True)
                    if r.returncode:
                        sys.exit('llama-tokenize failed on %s %s: %s' % (variant, pre, r.stderr[-500:]))
                    ids = r.stdout.strip().strip('[]').replace(',', ' ').split()
                    lines.append(' '.join(ids) if ids else '-')
                key = '\n'.join(lines)
                label = '%s %s %s' % (variant, pre, mode)
                if key in seen:
                    out.append('case %s = %s' % (label, seen[key]))
                else:
                    seen[key] = label
                    out.append('case %s' % label)
                    out.extend(lines)
                print(label, file=sys.stderr)
    open(os.path.join(HERE, 'expected.txt'), 'w').write('\n'.join(out) + '\n')


if __name__ == '__main__':
    if sys.argv[1:2] == ['train']:
        train()
        train_raw()
    elif sys.argv[1:2] == ['expect'] and len(sys.argv) == 4:
        expect(sys.argv[2], sys.argv[3])
    else:
        sys.exit(__doc__)
