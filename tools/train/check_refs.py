#!/usr/bin/env python3
"""Re-derive the reference files from the exported HF dirs (PyTorch, fp32, CPU is fine).

python3 tools/train/check_refs.py --target work_train/target_hf --drafter work_train/drafter_hf \
    --refs data

Reads data/ref_target_logits.bin and data/ref_drafter_block.bin (layouts in tools/train/README.md),
recomputes every number from the safetensors and prints the max abs differences. Also serves as
an executable description of the two binary layouts.
"""
import argparse
import json
import os
import struct
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import numpy as np
import torch

import model as M
from common import exact_fp32


def read_target_refs(path):
    b = open(path, 'rb').read()
    assert b[:4] == b'DSRL'
    ver, n, V, last = struct.unpack_from('<IIII', b, 4)
    off = 20
    out = []
    for _ in range(n):
        (ln,) = struct.unpack_from('<I', b, off)
        off += 4
        ids = np.frombuffer(b, '<u4', ln, off).astype(np.int64)
        off += 4 * ln
        lg = np.frombuffer(b, '<f4', last * V, off).reshape(last, V)
        off += 4 * last * V
        out.append((ids, lg))
    assert off == len(b)
    return V, last, out


def read_drafter_refs(path):
    b = open(path, 'rb').read()
    assert b[:4] == b'DSRD'
    ver, n, V, dfeat, g, mask_id, rank = struct.unpack_from('<7I', b, 4)
    off = 32
    cases = []
    for _ in range(n):
        (p,) = struct.unpack_from('<I', b, off)
        off += 4

        def take(dt, cnt, shape):
            nonlocal off
            a = np.frombuffer(b, dt, cnt, off).reshape(shape)
            off += 4 * cnt
            return a
        ids = take('<u4', p + 1, (p + 1,)).astype(np.int64)
        feat = take('<f4', p * dfeat, (p, dfeat))
        U = take('<f4', g * V, (g, V))
        chain = take('<u4', g, (g,)).astype(np.int64)
        z = take('<f4', g * V, (g, V))
        conf = take('<f4', g, (g,))
        cases.append(dict(p=p, ids=ids, feat=feat, U=U, chain=chain, z=z, conf=conf))
    assert off == len(b)
    return dict(V=V, dfeat=dfeat, gamma=g, mask_id=mask_id, rank=rank, cases=cases)


def load_st_dir(d):
    sd = {}
    for f in sorted(os.listdir(d)):
        if not f.endswith('.safetensors'):
            continue
        raw = open(os.path.join(d, f), 'rb').read()
        (n,) = struct.unpack_from('<Q', raw, 0)
        hdr = json.loads(raw[8:8 + n])
        base = 8 + n
        for k, v in hdr.items():
            if k == '__metadata__':
                continue
            a, e = v['data_offsets']
            dt = {'F16': np.float16, 'F32': np.float32}[v['dtype']]
            sd[k] = torch.from_numpy(np.frombuffer(raw[base + a:base + e], dt).reshape(v['shape']).astype(np.float32))
    return sd


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument('--target', default='work_train/target_hf')
    ap.add_argument('--drafter', default='work_train/drafter_hf')
    ap.add_argument('--refs', default='data')
    a = ap.parse_args()
    exact_fp32()
    M.USE_SDPA = False
    cfg = dict(M.TARGET_CFG)
    tgt = M.load_target_hf(M.Qwen3(cfg), a.target).eval()
    V, last, prompts = read_target_refs(os.path.join(a.refs, 'ref_target_logits.bin'))
    with torch.no_grad():
        for ids, lg in prompts:
            out = tgt(torch.from_numpy(ids)[None])[0, -last:].numpy()
            print('target prompt len %2d: max|dlogit| %.3g  argmax %s' % (
                len(ids), np.abs(out - lg).max(), lg.argmax(-1).tolist()))
    if not os.path.isdir(a.drafter):
        return
    dc = json.load(open(os.path.join(a.drafter, 'config.json')))
    dcfg = dict(cfg)
    dcfg['num_hidden_layers'] = dc['num_hidden_layers']
    dr = M.Drafter(dcfg, dc['target_layer_ids'], dc['block_size'], dc['mask_token_id'], dc['markov_rank']).eval()
    sd = load_st_dir(a.drafter)
    import train_drafter as TD
    names = TD.drafter_hf_tensors(dr)
    assert set(names) == set(sd), set(names) ^ set(sd)
    with torch.no_grad():
        for k, p in names.items():
            p.copy_(sd[k])
    dr.embed_weight = tgt.embed_tokens.weight.detach()
    R = read_drafter_refs(os.path.join(a.refs, 'ref_drafter_block.bin'))
    with torch.no_grad():
        for c in R['cases']:
            p = c['p']
            ids = torch.from_numpy(c['ids'])
            _, feats = tgt(ids[None, :p], taps=dc['target_layer_ids'], return_logits=False)
            anchors = torch.tensor([[p]])
            blk_ids, blk_pos, mask = TD.block_inputs(ids[None], anchors, dr.mask_id, dr.gamma, p)
            h = dr.backbone(feats, torch.arange(p), blk_ids, blk_pos, mask)[0]
            U = dr.lm_head(h)
            chain, z, prev = TD.greedy_chain(dr, U, ids[p])
            conf = torch.sigmoid(dr.confidence_logit(h, prev))
            print('drafter case p=%d: max|dfeat| %.3g max|dU| %.3g max|dz| %.3g max|dconf| %.3g chain %s (ref %s)' % (
                p, np.abs(feats[0].numpy() - c['feat']).max(), np.abs(U.numpy() - c['U']).max(),
                np.abs(z.numpy() - c['z']).max(), np.abs(conf.numpy() - c['conf']).max(),
                chain.tolist(), c['chain'].tolist()))


if __name__ == '__main__':
    main()
