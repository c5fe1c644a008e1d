#!/usr/bin/env python3
"""Byte-level BPE tokenizer, GPT-2 style (stdlib only, Python >= 3.8).

Vocabulary layout (V = 8192):
  id 0..255        byte tokens, id b = the single byte b (text = bytes_to_unicode()[b])
  id 256..8189     merges in rank order, id = 256 + rank (every merge creates a new, unique string)
  id 8190          "<|endoftext|>"  control (bos = eos)
  id 8191          "<|mask|>"       control (drafter MASK; GGUF tokenizer.ggml.mask_token_id)

Pre-tokenizer: GPT-2's regex
    's|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+
as PCRE2 runs it with PCRE2_UTF|PCRE2_UCP (tokenizer.ggml.pre = "gpt2").  Python's `re` has no
\\p{..}, so `pretokenize` is an exact emulation:
  1. every code point is classified ONCE (cached per distinct character) with unicodedata:
       letter      = general category L* (Lu Ll Lt Lm Lo)          -> \\p{L}
       number      = general category N* (Nd Nl No)                -> \\p{N}
       whitespace  = PCRE2 UCP \\s = \\p{Z} | \\h | \\v, i.e. U+0009..U+000D, U+0020, U+0085, U+00A0,
                     U+1680, U+180E, U+2000..U+200A, U+2028, U+2029, U+202F, U+205F, U+3000
                     (= Unicode White_Space plus U+180E, which PCRE2 lists in \\h)
       other       = everything else
  2. the text is mapped 1:1 (str.translate) to a "class string" over a tiny ASCII alphabet that
     keeps exactly the information the regex looks at: ASCII letters stay themselves (the
     contractions are case-sensitive ASCII), other letters -> 'x'; ASCII digits stay, other
     numbers -> '0'; U+0020 stays ' ' (the only char ` ?` accepts), other whitespace -> '\\n';
     the apostrophe stays "'", every other char -> '!'.
  3. the SAME regex with ASCII classes runs on the class string with Python's backtracking `re`
     (identical leftmost / ordered-alternation / greedy-with-backtracking semantics to PCRE2 for
     this pattern); the match spans are the pre-token spans of the original text.
  Differences from PCRE2 can only come from Unicode-version differences in the category tables
  (Python 3.11 = Unicode 14.0); the corpus holds no code point where that matters.

Encoding: standard GPT-2 `bpe()` per pre-token: start from the UTF-8 bytes, repeatedly take the
adjacent pair of lowest merge rank, merge ALL its non-overlapping occurrences left to right, until
no adjacent pair has a rank.  (Equivalent to llama.cpp's priority-queue form: ties between equal
pairs resolve leftmost-first.)  Special tokens are never produced from text.

Training: counts of pre-tokens over the training text; each step merges the pair with the highest
count (summed over word frequencies); ties -> the pair whose (left bytes, right bytes) is
lexicographically smallest.  A pair whose concatenation already exists as a token is never merged
(keeps token strings unique so id = 256 + rank).

CLI:
  bpe.py train  --in work_train/train.txt --out work_train/merges.txt [--vocab 8192] [--max-bytes N]
  bpe.py encode --merges work_train/merges.txt --in X.txt --out X.u16
  bpe.py gguf   --merges work_train/merges.txt --out work_train/tokenizer.gguf
"""
import argparse
import array
import collections
import heapq
import os
import re
import sys
import time
import unicodedata

VOCAB_SIZE = 8192
SPECIALS = ['<|endoftext|>', '<|mask|>']

PCRE2_SPACE = set([0x09, 0x0A, 0x0B, 0x0C, 0x0D, 0x20, 0x85, 0xA0, 0x1680, 0x180E, 0x2028,
                   0x2029, 0x202F, 0x205F, 0x3000] + list(range(0x2000, 0x200B)))

CLASS_RE = re.compile(r"'s|'t|'re|'ve|'m|'ll|'d| ?[A-Za-z]+| ?[0-9]+| ?[^\sA-Za-z0-9]+|\s+(?!\S)|\s+",
                      re.ASCII)


def bytes_to_unicode():
    bs = list(range(ord('!'), ord('~') + 1)) + list(range(ord('¡'), ord('¬') + 1)) + \
        list(range(ord('®'), ord('ÿ') + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, [chr(c) for c in cs]))


BYTE_ENC = bytes_to_unicode()


def char_class(c):
    o = ord(c)
    if o in PCRE2_SPACE:
        return ' ' if o == 0x20 else '\n'
    cat = unicodedata.category(c)
    if cat[0] == 'L':
        return c if (o < 128) else 'x'
    if cat[0] == 'N':
        return c if ('0' <= c <= '9') else '0'
    if c == "'":
        return "'"
    return '!'


_CLASS_CACHE = {}


def class_string(text):
    table = {}
    for c in set(text):
        o = ord(c)
        v = _CLASS_CACHE.get(o)
        if v is None:
            v = _CLASS_CACHE[o] = char_class(c)
        table[o] = v
    cs = text.translate(table)
    assert len(cs) == len(text)
    return cs


def pretokenize_iter(text):
    cs = class_string(text)
    for m in CLASS_RE.finditer(cs):
        yield text[m.start():m.end()]


def pretokenize(text):
    return list(pretokenize_iter(text))


# ---------------------------------------------------------------- training

def train(word_counts, n_merges, log=True):
    """word_counts: dict str -> count. Returns list of merges as (bytes_left, bytes_right)."""
    tok_bytes = [bytes([b]) for b in range(256)]
    existing = set(tok_bytes)
    words = []
    counts = []
    for w in sorted(word_counts):
        words.append(list(w.encode('utf-8')))
        counts.append(word_counts[w])
    pair_count = collections.defaultdict(int)
    pair_where = collections.defaultdict(set)
    for i, w in enumerate(words):
        c = counts[i]
        for j in range(len(w) - 1):
            p = (w[j], w[j + 1])
            pair_count[p] += c
            pair_where[p].add(i)
    heap = [(-c, tok_bytes[p[0]], tok_bytes[p[1]], p) for p, c in pair_count.items()]
    heapq.heapify(heap)
    merges = []
    t0 = time.time()
    while len(merges) < n_merges and heap:
        negc, lb, rb, p = heapq.heappop(heap)
        cur = pair_count.get(p, 0)
        if cur <= 0 or cur != -negc:
            continue  # stale
        nb = lb + rb
        if nb in existing:
            pair_count[p] = 0  # never merge (would duplicate a token string)
            continue
        new_id = len(tok_bytes)
        tok_bytes.append(nb)
        existing.add(nb)
        merges.append((lb, rb))
        a, b = p
        changed = collections.defaultdict(int)
        for i in sorted(pair_where.pop(p, ())):
            w = words[i]
            if len(w) < 2:
                continue
            # does the word still contain the pair?
            found = False
            for j in range(len(w) - 1):
                if w[j] == a and w[j + 1] == b:
                    found = True
                    break
            if not found:
                continue
            c = counts[i]
            for j in range(len(w) - 1):
                changed[(w[j], w[j + 1])] -= c
            nw = []
            j = 0
            L = len(w)
            while j < L:
                if j + 1 < L and w[j] == a and w[j + 1] == b:
                    nw.append(new_id)
                    j += 2
                else:
                    nw.append(w[j])
                    j += 1
            words[i] = nw
            for j in range(len(nw) - 1):
                q = (nw[j], nw[j + 1])
                changed[q] += c
                pair_where[q].add(i)
        for q, d in changed.items():
            if d == 0:
                continue
            nc = pair_count.get(q, 0) + d
            pair_count[q] = nc
            if q == p:
                continue
            if nc > 0:
                heapq.heappush(heap, (-nc, tok_bytes[q[0]], tok_bytes[q[1]], q))
        pair_count[p] = 0
        if log and (len(merges) % 500 == 0):
            print('  merges %d  count %d  %.1fs  last=%r' % (len(merges), -negc, time.time() - t0, nb),
                  flush=True)
    return merges


def to_unicode(b):
    return ''.join(BYTE_ENC[x] for x in b)


def save_merges(path, merges):
    with open(path, 'w', encoding='utf-8') as fh:
        fh.write('#version: dspark-bpe 1 (GPT-2 byte-unicode form)\n')
        for lb, rb in merges:
            fh.write('%s %s\n' % (to_unicode(lb), to_unicode(rb)))


def load_merges(path):
    dec = {v: k for k, v in BYTE_ENC.items()}
    merges = []
    with open(path, encoding='utf-8') as fh:
        for line in fh:
            if line.startswith('#version'):
                continue
            line = line.rstrip('\n')
            if not line:
                continue
            l, r = line.split(' ')
            merges.append((bytes(dec[c] for c in l), bytes(dec[c] for c in r)))
    return merges


class Tokenizer:
    def __init__(self, merges):
        self.merges = merges
        self.tok_bytes = [bytes([b]) for b in range(256)]
        self.id_of = {self.tok_bytes[b]: b for b in range(256)}
        self.ranks = {}
        for r, (lb, rb) in enumerate(merges):
            li, ri = self.id_of[lb], self.id_of[rb]
            nid = 256 + r
            self.tok_bytes.append(lb + rb)
            assert (lb + rb) not in self.id_of, 'duplicate token string'
            self.id_of[lb + rb] = nid
            self.ranks[(li, ri)] = r
        self.n_vocab = 256 + len(merges) + len(SPECIALS)
        self.eot_id = 256 + len(merges)
        self.mask_id = self.eot_id + 1
        self.cache = {}

    def bpe(self, word):
        ids = list(word.encode('utf-8'))
        ranks = self.ranks
        while len(ids) > 1:
            best = None
            br = None
            for j in range(len(ids) - 1):
                r = ranks.get((ids[j], ids[j + 1]))
                if r is not None and (br is None or r < br):
                    br = r
                    best = (ids[j], ids[j + 1])
            if best is None:
                break
            a, b = best
            nid = 256 + br
            out = []
            j = 0
            L = len(ids)
            while j < L:
                if j + 1 < L and ids[j] == a and ids[j + 1] == b:
                    out.append(nid)
                    j += 2
                else:
                    out.append(ids[j])
                    j += 1
            ids = out
        return ids

    def encode(self, text):
        out = array.array('H')
        cache = self.cache
        for pt in pretokenize_iter(text):
            ids = cache.get(pt)
            if ids is None:
                ids = cache[pt] = self.bpe(pt)
            out.extend(ids)
        return out

    def decode_bytes(self, ids):
        return b''.join(self.tok_bytes[i] if i < len(self.tok_bytes) else SPECIALS[i - len(self.tok_bytes)].encode()
                        for i in ids)

    def token_strings(self):
        return [to_unicode(b) for b in self.tok_bytes] + SPECIALS


def write_gguf(tok, path):
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import gguf_writer
    types = [1] * (256 + len(tok.merges)) + [3, 3]
    merges = ['%s %s' % (to_unicode(l), to_unicode(r)) for l, r in tok.merges]
    kv = [
        ('tokenizer.ggml.model', 'str', 'gpt2'),
        ('tokenizer.ggml.pre', 'str', 'gpt-2'),   # llama.cpp's name
        ('tokenizer.ggml.tokens', 'arr_str', tok.token_strings()),
        ('tokenizer.ggml.token_type', 'arr_i32', types),
        ('tokenizer.ggml.merges', 'arr_str', merges),
        ('tokenizer.ggml.bos_token_id', 'u32', tok.eot_id),
        ('tokenizer.ggml.eos_token_id', 'u32', tok.eot_id),
        ('tokenizer.ggml.mask_token_id', 'u32', tok.mask_id),
        ('tokenizer.ggml.add_bos_token', 'bool', False),
    ]
    gguf_writer.write_gguf(path, kv, [])


def main():
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest='cmd', required=True)
    t = sub.add_parser('train')
    t.add_argument('--in', dest='inp', required=True)
    t.add_argument('--out', required=True)
    t.add_argument('--vocab', type=int, default=VOCAB_SIZE)
    t.add_argument('--max-bytes', type=int, default=0, help='train on the first N chars only')
    t.add_argument('--smoke', action='store_true')
    e = sub.add_parser('encode')
    e.add_argument('--merges', required=True)
    e.add_argument('--in', dest='inp', required=True)
    e.add_argument('--out', required=True)
    g = sub.add_parser('gguf')
    g.add_argument('--merges', required=True)
    g.add_argument('--out', required=True)
    a = ap.parse_args()
    t0 = time.time()
    if a.cmd == 'train':
        with open(a.inp, encoding='utf-8') as fh:
            text = fh.read()
        if a.smoke:
            text = text[:300000]
            a.vocab = 512
        if a.max_bytes:
            text = text[:a.max_bytes]
        wc = collections.Counter(pretokenize_iter(text))
        print('pre-tokens: %d unique %d (%.1fs)' % (sum(wc.values()), len(wc), time.time() - t0), flush=True)
        merges = train(wc, a.vocab - 256 - len(SPECIALS))
        save_merges(a.out, merges)
        print('wrote %d merges to %s (%.1fs)' % (len(merges), a.out, time.time() - t0))
    elif a.cmd == 'encode':
        tok = Tokenizer(load_merges(a.merges))
        with open(a.inp, encoding='utf-8') as fh:
            text = fh.read()
        ids = tok.encode(text)
        assert tok.decode_bytes(ids) == text.encode('utf-8'), 'round trip failed'
        if sys.byteorder != 'little':
            ids.byteswap()
        with open(a.out, 'wb') as fh:
            ids.tofile(fh)
        print('%s: %d chars -> %d tokens (%.3f bytes/token) (%.1fs)' % (
            a.inp, len(text), len(ids), len(text.encode('utf-8')) / max(1, len(ids)), time.time() - t0))
    elif a.cmd == 'gguf':
        tok = Tokenizer(load_merges(a.merges))
        write_gguf(tok, a.out)
        print('wrote', a.out, 'n_vocab', tok.n_vocab)


if __name__ == '__main__':
    main()
