#!/usr/bin/env python3
"""Deduplicate paragraphs and split the corpus into train / validation (stdlib only).

Input : the decompressed corpus files (default work_train/corpus/*.txt, i.e. the pinned copy in
        /work/shared/data/corpus/*.xz after `xz -d` and a SHA256SUMS.txt check).
Output: work_train/train.txt, work_train/val.txt, data/corpus_manifest.md

Rules (deterministic, no randomness):
  * files are processed in sorted file-name order;
  * a paragraph is a maximal run of lines separated by one or more blank lines (a line holding
    only spaces/tabs counts as blank): re.split(r'\\n(?:[ \\t]*\\n)+', text); each paragraph is
    stripped of leading/trailing '\\n' and dropped if it is only whitespace;
  * exact-duplicate paragraphs are dropped globally (first occurrence in file order kept);
  * key = sha256(utf-8 paragraph); a paragraph goes to validation iff
    int.from_bytes(key[:8], 'big') % 100 == 0 (1 %), else to train;
  * train.txt: train paragraphs in corpus order, each followed by "\\n\\n";
  * val.txt: validation paragraphs ordered by key (a deterministic shuffle mixing the sources),
    each followed by "\\n\\n".
"""
import argparse
import glob
import hashlib
import os
import re
import sys

PARA_SPLIT = re.compile(r'\n(?:[ \t]*\n)+')


def paragraphs(text):
    for p in PARA_SPLIT.split(text):
        p = p.strip('\n')
        if p.strip():
            yield p


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument('--corpus', default='work_train/corpus')
    ap.add_argument('--out-dir', default='work_train')
    ap.add_argument('--manifest', default='data/corpus_manifest.md')
    ap.add_argument('--val-mod', type=int, default=100)
    ap.add_argument('--smoke', action='store_true', help='only the first 200 kB of each file')
    a = ap.parse_args()

    files = sorted(glob.glob(os.path.join(a.corpus, '*.txt')))
    if not files:
        sys.exit('no corpus files in %s' % a.corpus)
    seen = set()
    train, val = [], []
    rows = []
    for f in files:
        with open(f, encoding='utf-8') as fh:
            text = fh.read()
        if a.smoke:
            text = text[:200000]
        n_par = n_dup = 0
        tb = vb = 0
        for p in paragraphs(text):
            n_par += 1
            b = p.encode('utf-8')
            key = hashlib.sha256(b).digest()
            if key in seen:
                n_dup += 1
                continue
            seen.add(key)
            if int.from_bytes(key[:8], 'big') % a.val_mod == 0:
                val.append((key, p))
                vb += len(b) + 2
            else:
                train.append(p)
                tb += len(b) + 2
        rows.append((os.path.basename(f), len(text.encode('utf-8')), n_par, n_dup, tb, vb))
        print('%-16s bytes=%9d paragraphs=%7d duplicates=%6d train_bytes=%9d val_bytes=%7d'
              % rows[-1], flush=True)
    val.sort(key=lambda kv: kv[0])
    os.makedirs(a.out_dir, exist_ok=True)
    with open(os.path.join(a.out_dir, 'train.txt'), 'w', encoding='utf-8', newline='') as fh:
        for p in train:
            fh.write(p)
            fh.write('\n\n')
    with open(os.path.join(a.out_dir, 'val.txt'), 'w', encoding='utf-8', newline='') as fh:
        for _, p in val:
            fh.write(p)
            fh.write('\n\n')
    if a.smoke:
        return
    with open(a.manifest, 'w', encoding='utf-8') as fh:
        fh.write('# Corpus manifest (written by tools/corpus/split.py)\n\n')
        fh.write('Input: the pinned corpus `*.txt.xz` (kept outside the repository; packages, versions and '
                 'licences in models/README.md; tools/corpus/build_corpus.py rebuilds it), decompressed and '
                 'checked against its SHA256SUMS.txt.\n'
                 'Paragraphs split on blank lines, exact duplicates dropped globally, '
                 'validation = sha256(paragraph)[:8] (big-endian) % 100 == 0.\n\n')
        fh.write('| source | bytes | paragraphs | duplicates dropped | train bytes | validation bytes |\n')
        fh.write('|---|---|---|---|---|---|\n')
        T = [0] * 5
        for r in rows:
            fh.write('| %s | %d | %d | %d | %d | %d |\n' % r)
            for i in range(5):
                T[i] += r[i + 1]
        fh.write('| **total** | %d | %d | %d | %d | %d |\n' % tuple(T))
    print('train paragraphs %d, val paragraphs %d' % (len(train), len(val)))


if __name__ == '__main__':
    main()
