#!/usr/bin/env python3
"""make_fixture.py VOCAB.gguf OUT.txt -- a small stand-in for a llama.cpp vocab GGUF.

llama.cpp's vocabulary files (models/ggml-vocab-NAME.gguf, megabytes each) come
with NAME.gguf.inp (test texts) and NAME.gguf.out (the ids llama.cpp expects).
For those texts only a few thousand tokens and merges can matter: a merge can
fire only if its result occurs in the byte-level text, a token can be produced
only if it does. The fixture keeps exactly those (every id in place, merges in
rank order), the byte tokens, and the tokens matched literally (user-defined,
control): BPE over the kept merges then makes the same ids as over all of them.
test_vocab rebuilds the tokenizer from it (other ids get unused placeholders).

Format, one record per line:  pre NAME | model gpt2 | n_vocab N |
tok ID TYPE HEX | merge HEX_LEFT HEX_RIGHT (rank order)."""
import struct, sys

def read_gguf(path):
    d = open(path, 'rb').read()
    assert d[:4] == b'GGUF'
    ver, nt, nkv = struct.unpack_from('<IQQ', d, 4)
    p = 24
    sizes = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
    fmt = {0: 'B', 1: 'b', 2: 'H', 3: 'h', 4: 'I', 5: 'i', 6: 'f', 7: 'B', 10: 'Q', 11: 'q', 12: 'd'}
    def rstr(p):
        n, = struct.unpack_from('<Q', d, p)
        return d[p + 8:p + 8 + n], p + 8 + n
    kv = {}
    for _ in range(nkv):
        k, p = rstr(p)
        t, = struct.unpack_from('<I', d, p); p += 4
        if t == 8:
            v, p = rstr(p)
        elif t == 9:
            et, n = struct.unpack_from('<IQ', d, p); p += 12
            v = []
            for _ in range(n):
                if et == 8:
                    s, p = rstr(p); v.append(s)
                else:
                    v.append(struct.unpack_from('<' + fmt[et], d, p)[0]); p += sizes[et]
        else:
            v = struct.unpack_from('<' + fmt[t], d, p)[0]; p += sizes[t]
        kv[k.decode()] = v
    return kv

def byte_alphabet():
    bs = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
    m, n = {}, 0
    for b in range(256):
        if b in bs:
            m[b] = chr(b)
        else:
            m[b] = chr(256 + n); n += 1
    return m

def main():
    kv = read_gguf(sys.argv[1])
    text = open(sys.argv[1] + '.inp', 'rb').read()
    assert kv['tokenizer.ggml.model'] == b'gpt2', 'fixtures are for byte-level BPE vocabularies'
    b2u = byte_alphabet()
    enc = ''.join(b2u[b] for b in text).encode()
    toks = kv['tokenizer.ggml.tokens']
    types = kv.get('tokenizer.ggml.token_type', [1] * len(toks))
    keep = set()
    byte_texts = {b2u[b].encode() for b in range(256)}
    for i, t in enumerate(toks):
        if types[i] in (3, 4) or t in byte_texts or t in enc:
            keep.add(i)
    merges = []
    for m in kv.get('tokenizer.ggml.merges', []):
        sp = m.find(b' ', 1)
        if sp < 0:
            continue
        if m[:sp] + m[sp + 1:] in enc:
            merges.append((m[:sp], m[sp + 1:]))
    with open(sys.argv[2], 'w') as f:
        f.write('# made by make_fixture.py from llama.cpp\'s %s (MIT licence)\n' % sys.argv[1].split('/')[-1])
        pre = kv.get('tokenizer.ggml.pre')
        if pre is not None:
            f.write('pre %s\n' % pre.decode())
        f.write('model gpt2\nn_vocab %d\n' % len(toks))
        for i in sorted(keep):
            f.write('tok %d %d %s\n' % (i, types[i], toks[i].hex()))
        for a, b in merges:
            f.write('merge %s %s\n' % (a.hex(), b.hex()))

if __name__ == '__main__':
    main()
