#!/usr/bin/env python3
"""Distil a DSpark block drafter from the trained target (self-distillation on greedy text).

python3 tools/train/train_drafter.py --target work_train/target_hf --out work_train/drafter_hf \
    --refs work_train/refs [--smoke]

Stages: (1) distillation data: greedy continuations by the target (bf16 autocast, KV cache) of
deterministic training-split prompts; (2) training with many anchors per sequence in one pass
(dense mask: block b sees context rows < anchor_b and its own gamma rows); (3) F16 rounding, fp32
acceptance measurement on held-out validation prompts, reference block file, HF export.
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

TAPS = [1, 4, 6]
GAMMA = 7
RANK = 32
N_DRAFT_LAYERS = 2


def block_inputs(seq, anchors, mask_id, gamma, S_ctx):
    """seq [B,S] ids, anchors [B,NA] positions. Returns blk_ids [B,NA*g], blk_pos [B,NA*g],
    mask [B,1,NA*g,S_ctx+NA*g] (True = attend)."""
    B, NA = anchors.shape
    dev = seq.device
    k = torch.arange(gamma, device=dev)
    blk_pos = (anchors[:, :, None] + k).reshape(B, NA * gamma)
    blk_ids = torch.full((B, NA, gamma), mask_id, dtype=torch.long, device=dev)
    blk_ids[:, :, 0] = torch.gather(seq, 1, anchors)
    blk_ids = blk_ids.reshape(B, NA * gamma)
    ctx_ok = torch.arange(S_ctx, device=dev)[None, None, :] < anchors[:, :, None]  # [B,NA,S]
    ctx_ok = ctx_ok[:, :, None, :].expand(B, NA, gamma, S_ctx).reshape(B, NA * gamma, S_ctx)
    bid = torch.arange(NA, device=dev).repeat_interleave(gamma)
    same = (bid[:, None] == bid[None, :])[None].expand(B, -1, -1)
    mask = torch.cat([ctx_ok, same], dim=2)[:, None]
    return blk_ids, blk_pos, mask


def drafter_forward(dr, feats, seq, anchors):
    B, S = seq.shape
    blk_ids, blk_pos, mask = block_inputs(seq, anchors, dr.mask_id, dr.gamma, S)
    h = dr.backbone(feats, torch.arange(S, device=seq.device), blk_ids, blk_pos, mask)
    return h


def greedy_chain(dr, U, anchor_ids):
    """U [..., g, V] base logits, anchor_ids [...]. Greedy Markov chain (argmax ties -> lowest id).
    Returns chain ids [..., g], corrected logits z [..., g, V], prev ids [..., g]."""
    g = U.shape[-2]
    prev = anchor_ids
    ids, zs, prevs = [], [], []
    for k in range(g):
        z = U[..., k, :] + dr.markov_bias(prev).to(U.dtype)
        d = z.argmax(-1)
        prevs.append(prev)
        ids.append(d)
        zs.append(z)
        prev = d
    return torch.stack(ids, -1), torch.stack(zs, -2), torch.stack(prevs, -1)


def drafter_hf_tensors(dr):
    t = {'fc.weight': dr.fc.weight, 'hidden_norm.weight': dr.hidden_norm.weight, 'norm.weight': dr.norm.weight,
         'markov_head.markov_w1.weight': dr.markov_w1.weight, 'markov_head.markov_w2.weight': dr.markov_w2.weight,
         'confidence_head.proj.weight': dr.conf.weight, 'confidence_head.proj.bias': dr.conf.bias}
    for i, L in enumerate(dr.layers):
        M.layer_hf_tensors(t, 'layers.%d.' % i, L)
    return t


def drafter_config(cfg, mask_id):
    c = M.target_config_json(cfg)
    c.update({'architectures': ['DSparkDraftModel'], 'num_hidden_layers': N_DRAFT_LAYERS,
              'max_window_layers': N_DRAFT_LAYERS, 'layer_types': ['full_attention'] * N_DRAFT_LAYERS,
              'tie_word_embeddings': False, 'block_size': GAMMA, 'target_layer_ids': TAPS,
              'num_target_layers': cfg['num_hidden_layers'], 'target_hidden_size': cfg['hidden_size'],
              'mask_token_id': mask_id, 'markov_rank': RANK, 'markov_head_type': 'vanilla',
              'use_confidence_head': True, 'confidence_head_with_markov': True,
              'sample_from_anchor': True, 'loss_decay_gamma': 4.0})
    return c


@torch.no_grad()
def measure_acceptance(tgt, dr, prompts, n_new, dev, gamma=GAMMA, bs=16):
    """fp32: greedy target continuation, drafts at every anchor, simulate greedy rounds."""
    seqs = tgt.generate_greedy(prompts, n_new, cache_dtype=torch.float32)
    B, S = seqs.shape
    P = prompts.shape[1]
    acc_total = rounds = 0
    slot_hits = np.zeros(gamma)
    slot_tries = np.zeros(gamma)
    conf_sum = np.zeros(gamma)
    per_seq = []
    for i in range(0, B, bs):
        sq = seqs[i:i + bs]
        b = sq.shape[0]
        _, feats = tgt(sq, taps=TAPS, return_logits=False)
        anchors = torch.arange(P, S - gamma, device=dev)[None].expand(b, -1).contiguous()
        NA = anchors.shape[1]
        h = drafter_forward(dr, feats, sq, anchors)
        U = dr.lm_head(h).view(b, NA, gamma, -1)
        anc = torch.gather(sq, 1, anchors)
        chain, z, prev = greedy_chain(dr, U, anc)
        conf = torch.sigmoid(dr.confidence_logit(h.view(b, NA, gamma, -1), prev))
        lab = torch.stack([torch.gather(sq, 1, anchors + k + 1) for k in range(gamma)], -1)
        match = (chain == lab).cpu().numpy()
        confn = conf.cpu().numpy()
        for s in range(b):
            p = P
            acc_s = r_s = 0
            while p + gamma <= S - 1:
                j = p - P
                a = 0
                while a < gamma and match[s, j, a]:
                    a += 1
                for k in range(min(a + 1, gamma)):
                    slot_tries[k] += 1
                    slot_hits[k] += k < a
                    conf_sum[k] += confn[s, j, k]
                acc_s += a + 1
                r_s += 1
                p += a + 1
            acc_total += acc_s
            rounds += r_s
            per_seq.append(acc_s / max(1, r_s))
    return dict(mean_accept_len=acc_total / max(1, rounds), rounds=rounds, n_prompts=B,
                slot_accept_rate=(slot_hits / np.maximum(1, slot_tries)).round(4).tolist(),
                slot_mean_conf=(conf_sum / np.maximum(1, slot_tries)).round(4).tolist(),
                per_seq_min=float(np.min(per_seq)), per_seq_max=float(np.max(per_seq))), seqs


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument('--target', default='work_train/target_hf')
    ap.add_argument('--train', default='data/train_ids.u16.xz')
    ap.add_argument('--val', default='data/val_ids.u16.xz')
    ap.add_argument('--out', default='work_train/drafter_hf')
    ap.add_argument('--refs', default='work_train/refs')
    ap.add_argument('--n-prompts', type=int, default=32768)
    ap.add_argument('--prompt-len', type=int, default=48)
    ap.add_argument('--gen', type=int, default=128)
    ap.add_argument('--gen-batch', type=int, default=8192)
    ap.add_argument('--batch', type=int, default=192)
    ap.add_argument('--anchors', type=int, default=24)
    ap.add_argument('--anchor-min', type=int, default=16)
    ap.add_argument('--lr', type=float, default=1.5e-3)
    ap.add_argument('--warmup', type=int, default=100)
    ap.add_argument('--max-steps', type=int, default=8000)
    ap.add_argument('--time-budget', type=float, default=300.0)
    ap.add_argument('--eval-prompts', type=int, default=64)
    ap.add_argument('--seed', type=int, default=4321)
    ap.add_argument('--smoke', action='store_true')
    a = ap.parse_args()
    dev = device()
    if a.smoke:
        a.n_prompts, a.gen, a.gen_batch, a.batch, a.anchors = 16, 24, 16, 4, 4
        a.max_steps, a.warmup, a.eval_prompts = 4, 2, 2
    seed_all(a.seed)
    cfg = dict(M.TARGET_CFG)
    tgt = M.load_target_hf(M.Qwen3(cfg), a.target).to(dev).eval()
    for p in tgt.parameters():
        p.requires_grad_(False)
    tr = load_u16(a.train)
    va = load_u16(a.val)
    V = cfg['vocab_size']
    mask_id = V - 1
    log('target loaded; train tokens %d; device %s' % (len(tr), dev))

    # ---- (0) check: KV-cached greedy generation == argmax of a full forward (fp32, SDPA path)
    with torch.no_grad():
        chk = tgt.generate_greedy(torch.from_numpy(np.stack([tr[o:o + 32] for o in (0, 1000, 50000, 90000)])).to(dev), 24)
        ref = tgt(chk[:, :-1]).float().argmax(-1)[:, 31:]
        agree = (ref == chk[:, 32:]).float().mean().item()
        log('cached-generation check: agreement with full forward %.4f' % agree)
        assert agree > 0.95, 'KV-cached generation disagrees with the full forward'

    # ---- (1) distillation data
    t0 = time.time()
    rs = np.random.RandomState(a.seed)
    offs = rs.randint(0, len(tr) - a.prompt_len, size=a.n_prompts)
    prompts = torch.from_numpy(np.stack([tr[o:o + a.prompt_len] for o in offs])).to(dev)
    seqs = []
    for i in range(0, a.n_prompts, a.gen_batch):
        with autocast(dev):
            seqs.append(tgt.generate_greedy(prompts[i:i + a.gen_batch], a.gen,
                                            cache_dtype=torch.bfloat16 if dev.type == 'cuda' else torch.float32))
    data = torch.cat(seqs)
    N, S = data.shape
    gen_time = time.time() - t0
    log('distillation data %s in %.1fs; sample: %r' % (tuple(data.shape), gen_time, data[0, a.prompt_len:a.prompt_len + 24].tolist()))

    # ---- (2) training
    dcfg = dict(cfg)
    dcfg['num_hidden_layers'] = N_DRAFT_LAYERS
    dr = M.Drafter(dcfg, TAPS, GAMMA, mask_id, RANK).to(dev)
    dr.embed_weight = tgt.embed_tokens.weight.detach()
    nparam = sum(p.numel() for p in dr.parameters())
    log('drafter params %d (plus the shared frozen embedding/LM head)' % nparam)
    decay = [p for n, p in dr.named_parameters() if p.dim() >= 2]
    nodecay = [p for n, p in dr.named_parameters() if p.dim() < 2]
    kw = dict(fused=True) if dev.type == 'cuda' else {}
    opt = torch.optim.AdamW([{'params': decay, 'weight_decay': 0.01}, {'params': nodecay, 'weight_decay': 0.0}],
                            lr=a.lr, betas=(0.9, 0.95), **kw)
    wk = torch.exp(-torch.arange(GAMMA, device=dev, dtype=torch.float32) / 4.0)
    g = torch.Generator(device=dev)
    g.manual_seed(a.seed)
    total = a.max_steps
    t_start = time.time()
    step = 0
    hist = []
    n_hi = S - GAMMA - 1  # anchors p in [anchor_min, S-8]
    while step < total:
        if step == a.warmup + 10 and dev.type == 'cuda':
            torch.cuda.synchronize()
            t_meas = time.time()
        if step == a.warmup + 40 and dev.type == 'cuda':
            torch.cuda.synchronize()
            dt = (time.time() - t_meas) / 30
            total = min(a.max_steps, int(step + (a.time_budget - (time.time() - t_start)) / dt))
            log('step time %.1f ms -> total steps %d' % (dt * 1e3, total))
        if step < a.warmup:
            lr = a.lr * (step + 1) / a.warmup
        else:
            pr = (step - a.warmup) / max(1, total - a.warmup)
            lr = a.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, pr))))
        for gr in opt.param_groups:
            gr['lr'] = lr
        bi = torch.randint(0, N, (a.batch,), device=dev, generator=g)
        sq = data[bi]
        B = sq.shape[0]
        r = torch.rand(B, n_hi - a.anchor_min + 1, device=dev, generator=g)
        anchors = (r.argsort(dim=1)[:, :a.anchors] + a.anchor_min).sort(dim=1).values
        with torch.no_grad(), autocast(dev):
            tl, feats = tgt(sq, taps=TAPS)
        kk = torch.arange(GAMMA, device=dev)
        rows = (anchors[:, :, None] + kk).reshape(B, -1)                  # target rows p+k
        lab = torch.gather(sq, 1, rows + 1)                                 # tokens p+k+1
        anc = torch.gather(sq, 1, anchors)
        prev = torch.cat([anc[:, :, None], lab.view(B, -1, GAMMA)[:, :, :-1]], dim=2).reshape(B, -1)
        with torch.no_grad():
            pt = torch.softmax(torch.gather(tl, 1, rows[:, :, None].expand(-1, -1, V)).float(), -1)
        with autocast(dev):
            h = drafter_forward(dr, feats.float(), sq, anchors)
            U = dr.lm_head(h)
            z = U.float() + dr.markov_bias(prev).float()
            cl = dr.confidence_logit(h.detach(), prev).float()
        lq = torch.log_softmax(z, -1)
        ce = F.nll_loss(lq.view(-1, V), lab.reshape(-1), reduction='none').view(B, -1)
        tv = 0.5 * (lq.exp() - pt).abs().sum(-1)
        cstar = (1.0 - tv).detach().clamp(0, 1)
        bce = F.binary_cross_entropy_with_logits(cl, cstar, reduction='none')
        w = wk.repeat(a.anchors)[None].expand(B, -1)
        loss = ((0.1 * ce + 0.9 * tv + 1.0 * bce) * w).sum() / w.sum()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(dr.parameters(), 1.0)
        opt.step()
        step += 1
        if step % 100 == 0 or step == total or a.smoke:
            with torch.no_grad():
                hit = (z.argmax(-1) == pt.argmax(-1)).float().view(B, -1, GAMMA).mean((0, 1))
            hist.append(dict(step=step, loss=loss.item(), ce=ce.mean().item(), tv=tv.mean().item(),
                             bce=bce.mean().item(), top1_match=[round(x, 3) for x in hit.tolist()]))
            log('step %5d/%d loss %.4f ce %.3f tv %.3f bce %.4f lr %.2e top1/slot %s' % (
                step, total, hist[-1]['loss'], hist[-1]['ce'], hist[-1]['tv'], hist[-1]['bce'], lr,
                hist[-1]['top1_match']))
        if time.time() - t_start > a.time_budget * 1.15:
            log('time budget exceeded at step %d' % step)
            break
    train_time = time.time() - t_start
    del data

    # ---- (3) f16 rounding, fp32 evaluation, references, export
    dr.eval()
    M.round_f16_(dr)
    exact_fp32()
    M.USE_SDPA = False
    rs = np.random.RandomState(a.seed + 1)
    voffs = rs.randint(0, len(va) - a.prompt_len, size=a.eval_prompts)
    vprompts = torch.from_numpy(np.stack([va[o:o + a.prompt_len] for o in voffs])).to(dev)
    t1 = time.time()
    res, vseqs = measure_acceptance(tgt, dr, vprompts, a.gen, dev)
    res['eval_time_s'] = round(time.time() - t1, 1)
    log('ACCEPTANCE (greedy, gamma=%d, incl. bonus, fp32, %d val prompts x %d new tokens): %.4f  %s' % (
        GAMMA, a.eval_prompts, a.gen, res['mean_accept_len'], json.dumps(res)))

    os.makedirs(a.refs, exist_ok=True)
    cases = [(0, a.prompt_len), (1 % vseqs.shape[0], a.prompt_len + 13)]
    with torch.no_grad(), open(os.path.join(a.refs, 'ref_drafter_block.bin'), 'wb') as fh:
        dfeat = len(TAPS) * cfg['hidden_size']
        fh.write(b'DSRD' + struct.pack('<IIIIIII', 1, len(cases), V, dfeat, GAMMA, mask_id, RANK))
        for si, p in cases:
            ids = vseqs[si, :p + 1]
            _, feats = tgt(ids[None, :p], taps=TAPS, return_logits=False)
            anchors = torch.tensor([[p]], device=dev)
            full = torch.cat([ids[None, :p], torch.zeros(1, 1, dtype=torch.long, device=dev) + ids[p]], 1)
            # context rows are positions 0..p-1 (features of the committed tokens), block rows p..p+6
            blk_ids, blk_pos, mask = block_inputs(full, anchors, mask_id, GAMMA, p)
            h = dr.backbone(feats, torch.arange(p, device=dev), blk_ids, blk_pos, mask)[0]
            U = dr.lm_head(h)
            chain, z, prev = greedy_chain(dr, U, ids[p])
            conf = torch.sigmoid(dr.confidence_logit(h, prev))
            fh.write(struct.pack('<I', p))
            fh.write(ids.cpu().numpy().astype('<u4').tobytes())
            fh.write(feats[0].float().cpu().numpy().astype('<f4').tobytes())
            fh.write(U.float().cpu().numpy().astype('<f4').tobytes())
            fh.write(chain.cpu().numpy().astype('<u4').tobytes())
            fh.write(z.float().cpu().numpy().astype('<f4').tobytes())
            fh.write(conf.float().cpu().numpy().astype('<f4').tobytes())
            log('ref case seq %d p=%d anchor=%d chain=%s target-next=%s conf=%s' % (
                si, p, int(ids[p]), chain.tolist(), vseqs[si, p + 1:p + 1 + GAMMA].tolist(),
                [round(x, 3) for x in conf.tolist()]))
    files = M.save_sharded(a.out, drafter_hf_tensors(dr))
    with open(os.path.join(a.out, 'config.json'), 'w') as fh:
        json.dump(drafter_config(cfg, mask_id), fh, indent=2)
    info = dict(drafter_params=nparam, steps=step, batch=a.batch, anchors_per_seq=a.anchors, lr=a.lr,
                seed=a.seed, n_prompts=a.n_prompts, prompt_len=a.prompt_len, gen=a.gen,
                gen_time_s=round(gen_time, 1), train_time_s=round(train_time, 1), acceptance=res, hist=hist,
                torch=torch.__version__)
    with open(os.path.join(a.refs, 'drafter_train_info.json'), 'w') as fh:
        json.dump(info, fh, indent=1)
    log('exported %s: %s' % (a.out, files))


if __name__ == '__main__':
    main()
