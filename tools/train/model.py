"""PyTorch Qwen3 target and DSpark drafter (tools/train).

Target (HF Qwen3 semantics): RMSNorm (eps 1e-6, computed in float32, weight * normed), QK-norm
per head (RMSNorm over head_dim, before RoPE), GQA (query head h uses kv head h // (H/Hkv)),
NEOX / rotate_half RoPE (pair i with i + hd/2, theta 10000, inv_freq = 1/theta^(2i/hd) computed in
float32, angle = pos * inv_freq in float32), SwiGLU MLP, tied embeddings, no biases,
attention scale 1/sqrt(head_dim).

Drafter (dspark-spec.md sections 1-3): see class Drafter.
"""
import json
import math
import os
import struct

import torch
import torch.nn as nn
import torch.nn.functional as F

TARGET_CFG = dict(vocab_size=8192, hidden_size=384, num_hidden_layers=8, num_attention_heads=6,
                  num_key_value_heads=2, head_dim=64, intermediate_size=1024,
                  max_position_embeddings=512, rms_norm_eps=1e-6, rope_theta=10000.0)

HAS_SDPA = hasattr(F, 'scaled_dot_product_attention')
USE_SDPA = True  # set False for the float32 reference computations (explicit softmax math)


class RMSNorm(nn.Module):
    def __init__(self, n, eps=1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(n))
        self.eps = eps

    def forward(self, x):
        dt = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dt)


def rope_cos_sin(pos, hd, theta):
    """pos: int tensor [...]; returns cos, sin [..., hd] float32."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, hd, 2, dtype=torch.int64, device=pos.device).float() / hd))
    ang = pos.float()[..., None] * inv_freq
    emb = torch.cat([ang, ang], dim=-1)
    return emb.cos(), emb.sin()


def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat([-x[..., h:], x[..., :h]], dim=-1)


def apply_rope(x, cos, sin):
    # x [B, H, T, hd]; cos/sin [B or 1, 1, T, hd]
    return x * cos + rotate_half(x) * sin


def attend(q, k, v, mask=None, causal=False):
    """q [B,H,T,hd], k/v [B,Hkv,S,hd]; mask bool [B or 1, 1, T, S] (True = attend)."""
    H, Hkv = q.shape[1], k.shape[1]
    if Hkv != H:
        k = k.repeat_interleave(H // Hkv, dim=1)
        v = v.repeat_interleave(H // Hkv, dim=1)
    if USE_SDPA and HAS_SDPA:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal and mask is None)
    scale = 1.0 / math.sqrt(q.shape[-1])
    s = torch.matmul(q, k.transpose(-1, -2)) * scale
    if causal and mask is None:
        T, S = q.shape[2], k.shape[2]
        mask = torch.ones(T, S, dtype=torch.bool, device=q.device).tril(S - T)
    if mask is not None:
        s = s.masked_fill(~mask, float('-inf'))
    p = torch.softmax(s.float(), dim=-1).to(v.dtype)
    return torch.matmul(p, v)


class Attention(nn.Module):
    def __init__(self, c):
        super().__init__()
        d, H, Hkv, hd = c['hidden_size'], c['num_attention_heads'], c['num_key_value_heads'], c['head_dim']
        self.H, self.Hkv, self.hd = H, Hkv, hd
        self.q_proj = nn.Linear(d, H * hd, bias=False)
        self.k_proj = nn.Linear(d, Hkv * hd, bias=False)
        self.v_proj = nn.Linear(d, Hkv * hd, bias=False)
        self.o_proj = nn.Linear(H * hd, d, bias=False)
        self.q_norm = RMSNorm(hd, c['rms_norm_eps'])
        self.k_norm = RMSNorm(hd, c['rms_norm_eps'])

    def kv(self, x, cos, sin):
        B, T, _ = x.shape
        k = self.k_norm(self.k_proj(x).view(B, T, self.Hkv, self.hd)).transpose(1, 2)
        v = self.v_proj(x).view(B, T, self.Hkv, self.hd).transpose(1, 2)
        k = apply_rope(k, cos, sin)
        return k, v

    def q(self, x, cos, sin):
        B, T, _ = x.shape
        q = self.q_norm(self.q_proj(x).view(B, T, self.H, self.hd)).transpose(1, 2)
        return apply_rope(q, cos, sin)

    def forward(self, x, cos, sin, mask=None, causal=True, cache=None, cache_pos=None,
                ctx_kv=None):
        """cache: (K, V) preallocated [B,Hkv,Tmax,hd]; rows cache_pos..cache_pos+T-1 are written
        and attention runs over rows 0..cache_pos+T-1. ctx_kv: (k, v) prepended (drafter)."""
        B, T, _ = x.shape
        q = self.q(x, cos, sin)
        k, v = self.kv(x, cos, sin)
        if cache is not None:
            K, V = cache
            K[:, :, cache_pos:cache_pos + T] = k.to(K.dtype)
            V[:, :, cache_pos:cache_pos + T] = v.to(V.dtype)
            k, v = K[:, :, :cache_pos + T], V[:, :, :cache_pos + T]
        if ctx_kv is not None:
            k = torch.cat([ctx_kv[0].to(k.dtype), k], dim=2)
            v = torch.cat([ctx_kv[1].to(v.dtype), v], dim=2)
        o = attend(q, k.to(q.dtype), v.to(q.dtype), mask=mask, causal=causal)
        return self.o_proj(o.transpose(1, 2).reshape(B, T, self.H * self.hd))


class MLP(nn.Module):
    def __init__(self, c):
        super().__init__()
        d, f = c['hidden_size'], c['intermediate_size']
        self.gate_proj = nn.Linear(d, f, bias=False)
        self.up_proj = nn.Linear(d, f, bias=False)
        self.down_proj = nn.Linear(f, d, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Layer(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.input_layernorm = RMSNorm(c['hidden_size'], c['rms_norm_eps'])
        self.self_attn = Attention(c)
        self.post_attention_layernorm = RMSNorm(c['hidden_size'], c['rms_norm_eps'])
        self.mlp = MLP(c)

    def forward(self, x, cos, sin, **kw):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, **kw)
        return x + self.mlp(self.post_attention_layernorm(x))


class Qwen3(nn.Module):
    def __init__(self, c=TARGET_CFG):
        super().__init__()
        self.c = dict(c)
        self.embed_tokens = nn.Embedding(c['vocab_size'], c['hidden_size'])
        self.layers = nn.ModuleList([Layer(c) for _ in range(c['num_hidden_layers'])])
        self.norm = RMSNorm(c['hidden_size'], c['rms_norm_eps'])
        self.apply(self._init)

    @staticmethod
    def _init(m):
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, std=0.02)

    def forward(self, ids, pos0=0, taps=None, caches=None, return_logits=True):
        """ids [B,T]. taps: list of HF layer ids whose raw residual output is returned.
        caches: list of (K,V) per layer (generation); pos0 = absolute position of ids[:,0]."""
        B, T = ids.shape
        pos = torch.arange(pos0, pos0 + T, device=ids.device)
        cos, sin = rope_cos_sin(pos, self.c['head_dim'], self.c['rope_theta'])
        cos, sin = cos[None, None], sin[None, None]
        x = self.embed_tokens(ids)
        feats = []
        for i, layer in enumerate(self.layers):
            if caches is not None:
                # NOTE: never use is_causal with a KV cache: SDPA's is_causal is top-left aligned, so
                # a 1-row query would only see key 0.  One new row attends to every cached row.
                x = layer(x, cos, sin, causal=False, cache=caches[i], cache_pos=pos0,
                          mask=(None if T == 1 else
                                torch.ones(T, pos0 + T, dtype=torch.bool, device=ids.device).tril(pos0)))
            else:
                x = layer(x, cos, sin, causal=True)
            if taps is not None and i in taps:
                feats.append(x)
        h = self.norm(x)
        logits = F.linear(h, self.embed_tokens.weight) if return_logits else None
        if taps is not None:
            return logits, torch.cat(feats, dim=-1)
        return logits

    def new_caches(self, B, Tmax, dtype, device):
        c = self.c
        return [(torch.zeros(B, c['num_key_value_heads'], Tmax, c['head_dim'], dtype=dtype, device=device),
                 torch.zeros(B, c['num_key_value_heads'], Tmax, c['head_dim'], dtype=dtype, device=device))
                for _ in range(c['num_hidden_layers'])]

    @torch.no_grad()
    def generate_greedy(self, prompts, n_new, cache_dtype=torch.float32):
        """prompts [B,P] (equal lengths); returns [B, P+n_new] greedy (argmax ties -> lowest id)."""
        B, P = prompts.shape
        caches = self.new_caches(B, P + n_new, cache_dtype, prompts.device)
        logits = self.forward(prompts, 0, caches=caches)
        out = [prompts]
        nxt = logits[:, -1].float().argmax(-1, keepdim=True)
        for t in range(n_new):
            out.append(nxt)
            if t == n_new - 1:
                break
            logits = self.forward(nxt, P + t, caches=caches)
            nxt = logits[:, -1].float().argmax(-1, keepdim=True)
        return torch.cat(out, dim=1)


class Drafter(nn.Module):
    """DSpark block drafter (anchor-first, gamma rows), vanilla Markov head, confidence head.

    ctx_t  = hidden_norm(fc(feat_t))                       feat_t = concat of tapped target layers
    block  = E[[anchor, MASK x (gamma-1)]] at positions p..p+gamma-1
    layers: Qwen3 layers; context rows only feed k_proj/v_proj (+ k_norm, RoPE at their position)
    h      = norm(x);  U = E^T h (target's tied LM head, frozen)
    z_k    = U_k + W2 W1[prev_k]    (prev_0 = anchor, prev_k = token of slot k-1)
    conf_k = sigmoid(w . [h_k ; W1[prev_k]] + b)
    """

    def __init__(self, c, target_layer_ids, gamma, mask_id, rank):
        super().__init__()
        self.c = dict(c)
        d = c['hidden_size']
        self.tl = list(target_layer_ids)
        self.gamma, self.mask_id, self.rank = gamma, mask_id, rank
        self.fc = nn.Linear(len(self.tl) * d, d, bias=False)
        self.hidden_norm = RMSNorm(d, c['rms_norm_eps'])
        self.layers = nn.ModuleList([Layer(c) for _ in range(c['num_hidden_layers'])])
        self.norm = RMSNorm(d, c['rms_norm_eps'])
        self.markov_w1 = nn.Embedding(c['vocab_size'], rank)
        self.markov_w2 = nn.Linear(rank, c['vocab_size'], bias=False)
        self.conf = nn.Linear(d + rank, 1, bias=True)
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.normal_(m.weight, std=0.02)
        nn.init.normal_(self.markov_w1.weight, std=1.0)
        nn.init.zeros_(self.markov_w2.weight)
        nn.init.zeros_(self.conf.bias)

    def backbone(self, feat, ctx_pos, blk_ids, blk_pos, mask):
        """feat [B,S,m*d] (context rows), ctx_pos [S], blk_ids [B,R], blk_pos [B,R] absolute,
        mask bool [B,1,R,S+R]. Returns post-norm h [B,R,d]."""
        hd, theta = self.c['head_dim'], self.c['rope_theta']
        ctx = self.hidden_norm(self.fc(feat))
        ccos, csin = rope_cos_sin(ctx_pos, hd, theta)
        ccos, csin = ccos[None, None], csin[None, None]
        bcos, bsin = rope_cos_sin(blk_pos, hd, theta)
        bcos, bsin = bcos[:, None], bsin[:, None]
        x = self.embed(blk_ids)
        for layer in self.layers:
            ckv = layer.self_attn.kv(ctx, ccos, csin)
            x = layer(x, bcos, bsin, mask=mask, causal=False, ctx_kv=ckv)
        return self.norm(x)

    def embed(self, ids):
        return F.embedding(ids, self.embed_weight)

    def lm_head(self, h):
        return F.linear(h, self.embed_weight)

    def markov_bias(self, prev):
        return self.markov_w2(self.markov_w1(prev))

    def confidence_logit(self, h, prev):
        return self.conf(torch.cat([h, self.markov_w1(prev).to(h.dtype)], dim=-1)).squeeze(-1)


# ------------------------------------------------------------------ export helpers

def round_f16_(module):
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(p.half().float())


def write_safetensors(path, tensors, dtype=torch.float16):
    """tensors: dict name -> tensor; stored as F16 (exact after round_f16_)."""
    import numpy as np
    names = sorted(tensors)
    header = {'__metadata__': {'format': 'pt'}}
    blobs = []
    off = 0
    for n in names:
        t = tensors[n].detach().to('cpu', dtype).contiguous()
        b = t.numpy().tobytes() if dtype != torch.bfloat16 else t.view(torch.int16).numpy().tobytes()
        assert t.to(torch.float32).equal(tensors[n].detach().cpu().float()), 'not exactly representable: ' + n
        header[n] = {'dtype': {torch.float16: 'F16', torch.float32: 'F32'}[dtype],
                     'shape': list(t.shape), 'data_offsets': [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    hj = json.dumps(header, separators=(',', ':')).encode()
    hj += b' ' * ((8 - len(hj) % 8) % 8)
    with open(path, 'wb') as fh:
        fh.write(struct.pack('<Q', len(hj)))
        fh.write(hj)
        for b in blobs:
            fh.write(b)
    return off


def save_sharded(out_dir, tensors, max_shard_bytes=12 << 20):
    os.makedirs(out_dir, exist_ok=True)
    names = sorted(tensors)
    shards, cur, size = [], [], 0
    for n in names:
        nb = tensors[n].numel() * 2
        if cur and size + nb > max_shard_bytes:
            shards.append(cur)
            cur, size = [], 0
        cur.append(n)
        size += nb
    shards.append(cur)
    if len(shards) == 1:
        write_safetensors(os.path.join(out_dir, 'model.safetensors'), tensors)
        return ['model.safetensors']
    total = 0
    wmap = {}
    files = []
    for i, sh in enumerate(shards):
        fn = 'model-%05d-of-%05d.safetensors' % (i + 1, len(shards))
        total += write_safetensors(os.path.join(out_dir, fn), {n: tensors[n] for n in sh})
        for n in sh:
            wmap[n] = fn
        files.append(fn)
    with open(os.path.join(out_dir, 'model.safetensors.index.json'), 'w') as fh:
        json.dump({'metadata': {'total_size': total}, 'weight_map': wmap}, fh, indent=2, sort_keys=True)
    return files


def layer_hf_tensors(t, p, L):
    """Add one Qwen3 decoder layer's HF tensors under prefix p (shared by the
    target's and the drafter's exporters)."""
    t[p + 'input_layernorm.weight'] = L.input_layernorm.weight
    t[p + 'post_attention_layernorm.weight'] = L.post_attention_layernorm.weight
    for n in ('q_proj', 'k_proj', 'v_proj', 'o_proj'):
        t[p + 'self_attn.%s.weight' % n] = getattr(L.self_attn, n).weight
    t[p + 'self_attn.q_norm.weight'] = L.self_attn.q_norm.weight
    t[p + 'self_attn.k_norm.weight'] = L.self_attn.k_norm.weight
    for n in ('gate_proj', 'up_proj', 'down_proj'):
        t[p + 'mlp.%s.weight' % n] = getattr(L.mlp, n).weight
    return t


def target_hf_tensors(m):
    t = {'model.embed_tokens.weight': m.embed_tokens.weight, 'model.norm.weight': m.norm.weight}
    for i, L in enumerate(m.layers):
        layer_hf_tensors(t, 'model.layers.%d.' % i, L)
    return t


def load_target_hf(m, d):
    """Load HF-layout safetensors (F16/F32) written by save_sharded into a Qwen3 module."""
    import numpy as np
    files = [f for f in os.listdir(d) if f.endswith('.safetensors')]
    sd = {}
    for f in files:
        with open(os.path.join(d, f), 'rb') as fh:
            n = struct.unpack('<Q', fh.read(8))[0]
            hdr = json.loads(fh.read(n))
            data = fh.read()
        for k, v in hdr.items():
            if k == '__metadata__':
                continue
            a, b = v['data_offsets']
            dt = {'F16': np.float16, 'F32': np.float32}[v['dtype']]
            sd[k] = torch.from_numpy(np.frombuffer(data[a:b], dtype=dt).reshape(v['shape']).astype(np.float32))
    names = target_hf_tensors(m)
    assert set(names) == set(sd), (set(names) ^ set(sd))
    with torch.no_grad():
        for k, p in names.items():
            p.copy_(sd[k])
    return m


def target_config_json(c, dtype='float16'):
    return {
        'architectures': ['Qwen3ForCausalLM'], 'model_type': 'qwen3',
        'vocab_size': c['vocab_size'], 'hidden_size': c['hidden_size'],
        'intermediate_size': c['intermediate_size'], 'num_hidden_layers': c['num_hidden_layers'],
        'num_attention_heads': c['num_attention_heads'], 'num_key_value_heads': c['num_key_value_heads'],
        'head_dim': c['head_dim'], 'max_position_embeddings': c['max_position_embeddings'],
        'rms_norm_eps': c['rms_norm_eps'], 'rope_theta': c['rope_theta'], 'hidden_act': 'silu',
        'attention_bias': False, 'attention_dropout': 0.0, 'tie_word_embeddings': True,
        'torch_dtype': dtype, 'use_sliding_window': False, 'sliding_window': None,
        'max_window_layers': c['num_hidden_layers'], 'bos_token_id': 8190, 'eos_token_id': 8190,
        'initializer_range': 0.02, 'rope_scaling': None, 'use_cache': True,
    }
