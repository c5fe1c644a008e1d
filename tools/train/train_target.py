#!/usr/bin/env python3
"""Train the Qwen3 target, round to F16, export HF dir + reference files.

python3 tools/train/train_target.py --out work_train/target_hf --refs data [--smoke]
"""
import argparse
import json
import math
import os
import struct
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import numpy as np
import torch
import torch.nn.functional as F

import model as M
from common import log, seed_all, load_u16, exact_fp32, device, autocast

REF_PROMPTS = [(100, 12), (3000, 25), (9000, 40)]  # (offset into val ids, length)
REF_LAST = 4


@torch.no_grad()
def val_loss_bf16(m, val, seq, dev, max_windows=400):
    n = min(max_windows, (len(val) - 1) // seq)
    x = torch.from_numpy(val[:n * seq + 1]).to(dev)
    tot, cnt = 0.0, 0
    for i in range(0, n, 64):
        j = min(n, i + 64)
        xb = torch.stack([x[k * seq:(k + 1) * seq + 1] for k in range(i, j)])
        with autocast(dev):
            lg = m(xb[:, :-1])
        l = F.cross_entropy(lg.float().reshape(-1, lg.shape[-1]), xb[:, 1:].reshape(-1), reduction='sum')
        tot += l.item()
        cnt += xb[:, 1:].numel()
    return tot / cnt


@torch.no_grad()
def ppl_protocol(m, val, dev, ctx=256, chunks=32):
    """dspark perplexity -c 256 --chunks 32: windows ids[i*ctx:(i+1)*ctx], score 1..ctx-1. fp32."""
    n = min(chunks, len(val) // ctx)
    x = torch.from_numpy(val[:n * ctx]).to(dev).view(n, ctx)
    nll = []
    for i in range(n):
        lg = m(x[i:i + 1]).float()[0]
        nll.append(F.cross_entropy(lg[:-1], x[i, 1:], reduction='none').double())
    nll = torch.cat(nll)
    return math.exp(nll.mean().item()), nll.numel(), n


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument('--train', default='data/train_ids.u16.xz')
    ap.add_argument('--val', default='data/val_ids.u16.xz')
    ap.add_argument('--out', default='work_train/target_hf')
    ap.add_argument('--refs', default='work_train/refs')
    ap.add_argument('--seq', type=int, default=256)
    ap.add_argument('--batch', type=int, default=256)
    ap.add_argument('--lr', type=float, default=2e-3)
    ap.add_argument('--min-lr-frac', type=float, default=0.1)
    ap.add_argument('--wd', type=float, default=0.1)
    ap.add_argument('--warmup', type=int, default=100)
    ap.add_argument('--max-steps', type=int, default=2000)
    ap.add_argument('--time-budget', type=float, default=300.0, help='seconds of training')
    ap.add_argument('--seed', type=int, default=1234)
    ap.add_argument('--smoke', action='store_true')
    a = ap.parse_args()
    dev = device()
    if a.smoke:
        a.max_steps, a.warmup, a.batch, a.time_budget = 6, 2, 8, 60
    seed_all(a.seed)
    tr = load_u16(a.train)
    va = load_u16(a.val)
    log('train tokens %d, val tokens %d, device %s, torch %s' % (len(tr), len(va), dev, torch.__version__))
    cfg = dict(M.TARGET_CFG)
    m = M.Qwen3(cfg).to(dev)
    nparam = sum(p.numel() for p in m.parameters())
    log('params %d' % nparam)
    decay = [p for n, p in m.named_parameters() if p.dim() >= 2]
    nodecay = [p for n, p in m.named_parameters() if p.dim() < 2]
    kw = dict(fused=True) if dev.type == 'cuda' else {}
    opt = torch.optim.AdamW([{'params': decay, 'weight_decay': a.wd}, {'params': nodecay, 'weight_decay': 0.0}],
                            lr=a.lr, betas=(0.9, 0.95), eps=1e-8, **kw)
    trg = torch.from_numpy(tr).to(dev)
    g = torch.Generator(device=dev)
    g.manual_seed(a.seed)
    total = a.max_steps
    t_start = time.time()
    t_meas = None
    step = 0
    losses = []
    while step < total:
        if step == a.warmup + 10 and dev.type == 'cuda':
            torch.cuda.synchronize()
            t_meas = time.time()
        if step == a.warmup + 40 and dev.type == 'cuda':
            torch.cuda.synchronize()
            dt = (time.time() - t_meas) / 30
            el = time.time() - t_start
            total = min(a.max_steps, int(step + (a.time_budget - el) / dt))
            log('step time %.1f ms -> total steps %d (%.1fM tokens, %.2f epochs)' % (
                dt * 1e3, total, total * a.batch * a.seq / 1e6, total * a.batch * a.seq / len(tr)))
        if step < a.warmup:
            lr = a.lr * (step + 1) / a.warmup
        else:
            pr = (step - a.warmup) / max(1, total - a.warmup)
            lr = a.lr * (a.min_lr_frac + (1 - a.min_lr_frac) * 0.5 * (1 + math.cos(math.pi * min(1.0, pr))))
        for gr in opt.param_groups:
            gr['lr'] = lr
        st = torch.randint(0, len(tr) - a.seq - 1, (a.batch,), device=dev, generator=g)
        idx = st[:, None] + torch.arange(a.seq + 1, device=dev)[None]
        xb = trg[idx]
        with autocast(dev):
            lg = m(xb[:, :-1])
        loss = F.cross_entropy(lg.float().view(-1, lg.shape[-1]), xb[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(m.parameters(), 1.0)
        opt.step()
        step += 1
        if step % 100 == 0 or step == total or a.smoke:
            losses.append((step, loss.item()))
            log('step %5d/%d loss %.4f lr %.2e' % (step, total, losses[-1][1], lr))
        if step % 500 == 0 and not a.smoke:
            m.eval()
            log('step %5d val loss (bf16) %.4f' % (step, val_loss_bf16(m, va, a.seq, dev, 200)))
            m.train()
        if time.time() - t_start > a.time_budget * 1.15:
            log('time budget exceeded, stopping at step %d' % step)
            break
    train_time = time.time() - t_start
    m.eval()
    vl = val_loss_bf16(m, va, a.seq, dev, 8 if a.smoke else 400)
    log('val loss (bf16 autocast, before f16 rounding) %.4f' % vl)

    # ---- round to f16, fp32 reference numbers
    M.round_f16_(m)
    exact_fp32()
    M.USE_SDPA = False
    with torch.no_grad():
        # fp32 val loss over the same windows
        n = 8 if a.smoke else 400
        x = torch.from_numpy(va[:n * a.seq + 1]).to(dev)
        tot = cnt = 0
        for i in range(0, n, 32):
            j = min(n, i + 32)
            xb = torch.stack([x[k * a.seq:(k + 1) * a.seq + 1] for k in range(i, j)])
            lg = m(xb[:, :-1]).float()
            tot += F.cross_entropy(lg.reshape(-1, lg.shape[-1]), xb[:, 1:].reshape(-1), reduction='sum').item()
            cnt += xb[:, 1:].numel()
        vl32 = tot / cnt
    log('val loss (fp32, f16-rounded weights, %d windows of %d) %.4f' % (n, a.seq, vl32))
    ppl, nscored, nwin = ppl_protocol(m, va, dev, chunks=2 if a.smoke else 32)
    log('perplexity protocol: %d windows x 256, %d scored tokens, ppl %.6g' % (nwin, nscored, ppl))

    os.makedirs(a.refs, exist_ok=True)
    with open(os.path.join(a.refs, 'ref_ppl.txt'), 'w') as fh:
        fh.write('# PyTorch fp32 perplexity of the F16-rounded target on data/val.txt\n')
        fh.write('# protocol: tokenize data/val.txt (no BOS), windows ids[i*256:(i+1)*256] for i < 32,\n')
        fh.write('# score tokens 1..255 of each window given their in-window prefix, ppl = exp(mean NLL)\n')
        fh.write('# = dspark perplexity -f data/val.txt -c 256 --chunks 32\n')
        fh.write('windows %d\nscored_tokens %d\nmean_nll %.9f\nppl %.6g\n' % (nwin, nscored, math.log(ppl), ppl))
    with torch.no_grad(), open(os.path.join(a.refs, 'ref_target_logits.bin'), 'wb') as fh:
        V = cfg['vocab_size']
        fh.write(b'DSRL' + struct.pack('<IIII', 1, len(REF_PROMPTS), V, REF_LAST))
        for off, ln in REF_PROMPTS:
            ids = va[off:off + ln]
            lg = m(torch.from_numpy(ids).to(dev)[None]).float()[0, -REF_LAST:].cpu().numpy()
            fh.write(struct.pack('<I', ln))
            fh.write(ids.astype('<u4').tobytes())
            fh.write(lg.astype('<f4').tobytes())
            log('ref prompt off=%d len=%d argmax(last)=%d' % (off, ln, int(lg[-1].argmax())))
    files = M.save_sharded(a.out, M.target_hf_tensors(m))
    with open(os.path.join(a.out, 'config.json'), 'w') as fh:
        json.dump(M.target_config_json(cfg), fh, indent=2)
    info = dict(params=nparam, steps=step, batch=a.batch, seq=a.seq, lr=a.lr, seed=a.seed,
                train_time_s=round(train_time, 1), tokens_seen=step * a.batch * a.seq,
                val_loss_bf16=vl, val_loss_fp32_f16weights=vl32, ppl=ppl, losses=losses,
                torch=torch.__version__, device=str(torch.cuda.get_device_name(0) if dev.type == 'cuda' else 'cpu'))
    with open(os.path.join(a.refs, 'target_train_info.json'), 'w') as fh:
        json.dump(info, fh, indent=1)
    log('exported %s: %s' % (a.out, files))


if __name__ == '__main__':
    main()
