"""The CPU multi-token-prediction baseline's model: the naive baseline's GPT plus MTP heads.

Readable in one sitting. Shapes are end-of-line comments: B batch, T sequence, C model width,
H heads, K kv heads, D head dim, V vocabulary, J multi-token heads.

The trunk is the naive baseline's (baselines/naive_baseline/model.py), unchanged: tied embedding,
RMSNorm, GQA attention with RoPE and q/k RMSNorm, squared-ReLU MLP, U-Net skips, residual mix,
logit softcap 30. What this file adds:
- multi-token-prediction heads: head j (j = 1..mtp_heads) maps the trunk's last hidden state at
  position t to a guess of the token at t + 1 + j (the ordinary output predicts t + 1). Each is a
  residual squared-ReLU MLP (width C, output projection zero-initialised, so it starts as the
  next-token predictor) followed by the shared tied output. Training uses them as an auxiliary loss
  (train.py); the packed model keeps them only when `keep_mtp_heads` is true (for drafting in
  `pgolf generate --speculative`), so by default they cost no bytes.
- the optional generation contract (submissions/README.md, "Generation"):
  forward_cached(input_ids [B, L], cache, start) -> (logits [B, L, V], drafts [B, L, J, V] or None, cache),
  a KV cache of post-RoPE keys and values per block; positions >= start in the cache are dropped,
  which is how `pgolf generate` undoes rejected drafts.

Contract: build_model(config) -> nn.Module; forward(input_ids [B, T]) -> logits [B, T, V].
torch only: the scorer imports this file in a process that has no harness.
"""

import torch
import torch.nn.functional as F
from torch import nn

DEFAULTS = dict(
    vocab_size=1024,
    num_layers=9,
    model_dim=512,
    num_heads=8,
    num_kv_heads=4,
    mlp_mult=2,
    rope_base=10000.0,
    qk_gain_init=1.5,
    logit_softcap=30.0,
    tied_embed_init_std=0.005,
    mtp_heads=2,
    keep_mtp_heads=False,
)


def rms_norm(x):
    return F.rms_norm(x, (x.size(-1),))


class CastedLinear(nn.Linear):
    """A bias-free linear whose float32 weight is cast to the activations' dtype at matmul time."""

    def __init__(self, fan_in, fan_out, zero_init=False):
        super().__init__(fan_in, fan_out, bias=False)
        if zero_init:
            nn.init.zeros_(self.weight)

    def forward(self, x):
        return F.linear(x, self.weight.to(x.dtype))


class Rotary(nn.Module):
    def __init__(self, head_dim, base):
        super().__init__()
        inv_freq = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    def forward(self, start, T, device, dtype):  # cos, sin for positions start .. start + T - 1
        pos = torch.arange(start, start + T, device=device, dtype=torch.float32)
        freqs = torch.outer(pos, self.inv_freq.to(device))
        return freqs.cos()[None, None].to(dtype), freqs.sin()[None, None].to(dtype)  # (1, 1, T, D/2)


def apply_rotary(x, cos, sin):  # x: (B, H, T, D)
    half = x.size(-1) // 2
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat((x1 * cos + x2 * sin, x2 * cos - x1 * sin), dim=-1)


class Attention(nn.Module):
    def __init__(self, dim, num_heads, num_kv_heads, rope_base, qk_gain_init):
        super().__init__()
        if dim % num_heads or num_heads % num_kv_heads:
            raise ValueError(f"model_dim {dim} must divide by num_heads {num_heads}, and num_heads by num_kv_heads {num_kv_heads}")
        self.num_heads, self.num_kv_heads = num_heads, num_kv_heads
        self.head_dim = dim // num_heads
        if self.head_dim % 2:
            raise ValueError(f"head_dim {self.head_dim} must be even for RoPE")
        kv_dim = num_kv_heads * self.head_dim
        self.c_q = CastedLinear(dim, dim)
        self.c_k = CastedLinear(dim, kv_dim)
        self.c_v = CastedLinear(dim, kv_dim)
        self.proj = CastedLinear(dim, dim, zero_init=True)
        self.q_gain = nn.Parameter(torch.full((num_heads,), qk_gain_init, dtype=torch.float32))
        self.rotary = Rotary(self.head_dim, rope_base)

    def forward(self, x, kv=None, start=0):  # kv: this block's cached (k, v), (B, K, >=start, D) each
        B, T, C = x.shape
        q = self.c_q(x).view(B, T, self.num_heads, self.head_dim).transpose(1, 2)  # (B, H, T, D)
        k = self.c_k(x).view(B, T, self.num_kv_heads, self.head_dim).transpose(1, 2)  # (B, K, T, D)
        v = self.c_v(x).view(B, T, self.num_kv_heads, self.head_dim).transpose(1, 2)  # (B, K, T, D)
        q, k = rms_norm(q), rms_norm(k)
        cos, sin = self.rotary(start, T, x.device, q.dtype)
        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        q = q * self.q_gain.to(q.dtype)[None, :, None, None]
        gqa = self.num_kv_heads != self.num_heads
        if kv is None and start == 0:  # training and scoring: plain causal attention
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa)
        else:  # generation: the new positions attend to the cache and causally to each other
            if start:
                k = torch.cat((kv[0][:, :, :start], k), dim=2)  # (B, K, start + T, D)
                v = torch.cat((kv[1][:, :, :start], v), dim=2)
            S = k.size(2)
            mask = torch.arange(S, device=x.device)[None, :] <= torch.arange(start, start + T, device=x.device)[:, None]
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=gqa)
        out = self.proj(y.transpose(1, 2).reshape(B, T, C))  # (B, T, C)
        return out, (k, v)


class MLP(nn.Module):
    def __init__(self, dim, mlp_mult):
        super().__init__()
        self.fc = CastedLinear(dim, mlp_mult * dim)
        self.proj = CastedLinear(mlp_mult * dim, dim, zero_init=True)

    def forward(self, x):
        return self.proj(torch.relu(self.fc(x)).square())


class Block(nn.Module):
    def __init__(self, dim, num_heads, num_kv_heads, mlp_mult, rope_base, qk_gain_init):
        super().__init__()
        self.attn = Attention(dim, num_heads, num_kv_heads, rope_base, qk_gain_init)
        self.mlp = MLP(dim, mlp_mult)
        self.attn_scale = nn.Parameter(torch.ones(dim))
        self.mlp_scale = nn.Parameter(torch.ones(dim))
        self.resid_mix = nn.Parameter(torch.stack((torch.ones(dim), torch.zeros(dim))))  # (2, C)

    def forward(self, x, x0, kv=None, start=0):  # x, x0: (B, T, C)
        mix = self.resid_mix.to(x.dtype)
        x = mix[0] * x + mix[1] * x0
        a, kv = self.attn(rms_norm(x), kv, start)
        x = x + self.attn_scale.to(x.dtype) * a
        return x + self.mlp_scale.to(x.dtype) * self.mlp(rms_norm(x)), kv


class GPT(nn.Module):
    def __init__(self, vocab_size, num_layers, model_dim, num_heads, num_kv_heads, mlp_mult, rope_base,
                 qk_gain_init, logit_softcap, tied_embed_init_std, mtp_heads, keep_mtp_heads):
        super().__init__()
        if logit_softcap <= 0:
            raise ValueError(f"logit_softcap must be positive, got {logit_softcap}")
        if mtp_heads < 0:
            raise ValueError(f"mtp_heads must be >= 0, got {mtp_heads}")
        self.logit_softcap = logit_softcap
        self.tok_emb = nn.Embedding(vocab_size, model_dim)
        nn.init.normal_(self.tok_emb.weight, mean=0.0, std=tied_embed_init_std)
        self.num_encoder = num_layers // 2
        self.num_decoder = num_layers - self.num_encoder
        self.skip_weights = nn.Parameter(torch.ones(min(self.num_encoder, self.num_decoder), model_dim))
        self.blocks = nn.ModuleList(
            Block(model_dim, num_heads, num_kv_heads, mlp_mult, rope_base, qk_gain_init) for _ in range(num_layers)
        )
        # built only when they are to be trained or kept: a scored model without them has no such tensors
        self.mtp_heads = nn.ModuleList(MLP(model_dim, 1) for _ in range(mtp_heads if keep_mtp_heads else 0))

    def hidden(self, input_ids, cache=None, start=0):  # (B, T) -> (B, T, C), new cache
        x = rms_norm(self.tok_emb(input_ids))  # (B, T, C)
        x0 = x
        skips, new_cache = [], []
        for i, block in enumerate(self.blocks):
            if i >= self.num_encoder and skips:
                x = x + self.skip_weights[i - self.num_encoder].to(x.dtype) * skips.pop()
            x, kv = block(x, x0, None if cache is None else cache[i], start)
            new_cache.append(kv)
            if i < self.num_encoder:
                skips.append(x)
        return x, new_cache

    def output(self, h):  # (..., C) -> (..., V): tied head, soft-capped
        logits = F.linear(rms_norm(h), self.tok_emb.weight.to(h.dtype))
        return self.logit_softcap * torch.tanh(logits / self.logit_softcap)

    def mtp_logits(self, h):  # (B, T, C) -> J tensors (B, T, V): head j guesses the token at t + 1 + j
        return [self.output(h + head(rms_norm(h))) for head in self.mtp_heads]

    def forward(self, input_ids, mtp=False):  # (B, T) -> (B, T, V); with mtp (training), also the trunk's (B, T, C)
        h, _ = self.hidden(input_ids)
        logits = self.output(h)
        return (logits, h) if mtp else logits

    def forward_cached(self, input_ids, cache, start):  # the generation contract (module docstring)
        if (cache is None) != (start == 0):
            raise ValueError(f"forward_cached: start {start} needs a cache (and start 0 none)")
        h, cache = self.hidden(input_ids, cache, start)
        drafts = torch.stack(self.mtp_logits(h), dim=2) if len(self.mtp_heads) else None  # (B, T, J, V)
        return self.output(h), drafts, cache


def build_model(config):
    unknown = set(config) - set(DEFAULTS)
    if unknown:
        raise ValueError(f"unknown model config keys {sorted(unknown)}; known: {sorted(DEFAULTS)}")
    return GPT(**{**DEFAULTS, **config})
