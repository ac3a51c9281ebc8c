"""The CPU mixture-of-experts baseline's model: the naive baseline's GPT with a top-k MoE for the MLP.

Readable in one sitting. Shapes are end-of-line comments: B batch, T sequence, C model width,
H heads, K kv heads, D head dim, V vocabulary, N tokens (B x T), E experts.

The trunk is the naive baseline's (baselines/naive_baseline/model.py): tied embedding, RMSNorm,
GQA attention with RoPE and q/k RMSNorm, U-Net skips, residual mix, logit softcap 30. The MLP of
every block is a mixture of `num_experts` squared-ReLU experts (hidden width expert_mult x C):
- a router (a bias-free linear, C -> E) gives each token softmax probabilities; the token goes to
  its `top_k` most probable experts, whose outputs are summed with those probabilities
  renormalised over the chosen k. No capacity limit: no token is dropped, so a token's output
  depends on that token alone (what the scorer's causality probes require).
- while training, only the chosen experts run on each token (gather, compute, index_add), and
  the block keeps the load-balancing loss E x sum_e f_e x P_e (f_e: share of the token-expert
  assignments sent to e, P_e: mean router probability of e; 1.0 when balanced) and the shares f_e,
  which train.py adds to the loss and logs (router collapse shows as one share near 1).
- in eval mode (scoring, generation) every expert runs on every token and the unchosen get weight
  zero: the same function, computed with shapes that do not depend on the routing, so the logits
  at a position are bit-identical whatever the other tokens of the batch are (the probes compare
  them bit for bit; a gathered batch's matmul shape would change with the routing).
- each expert's weights are their own 2-D parameters (experts.E.fc.weight, experts.E.proj.weight),
  so the int8 codec gives every expert its own per-row scales (a stacked 3-D tensor gets one).
- the optional generation contract (submissions/README.md, "Generation"):
  forward_cached(input_ids [B, L], cache, start) -> (logits [B, L, V], None, cache): a KV cache of
  post-RoPE keys and values per block; positions >= start in the cache are dropped.

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
    rope_base=10000.0,
    qk_gain_init=1.5,
    logit_softcap=30.0,
    tied_embed_init_std=0.005,
    num_experts=4,
    top_k=2,
    expert_mult=1,
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


class MoE(nn.Module):
    def __init__(self, dim, num_experts, top_k, expert_mult):
        super().__init__()
        if not 1 <= top_k <= num_experts:
            raise ValueError(f"top_k must be between 1 and num_experts {num_experts}, got {top_k}")
        self.top_k = top_k
        self.router = CastedLinear(dim, num_experts)
        self.experts = nn.ModuleList(MLP(dim, expert_mult) for _ in range(num_experts))
        self.balance_loss = None  # set by a training forward: E x sum_e f_e x P_e
        self.share = None  # set by a training forward: (E,) share of assignments per expert

    def forward(self, x):  # (B, T, C) -> (B, T, C)
        B, T, C = x.shape
        flat = x.reshape(B * T, C)  # (N, C)
        probs = torch.softmax(self.router(flat).float(), dim=-1)  # (N, E)
        top_p, top_i = probs.topk(self.top_k, dim=-1)  # (N, k)
        top_w = (top_p / top_p.sum(-1, keepdim=True)).to(x.dtype)  # (N, k)
        E = len(self.experts)
        if not self.training:  # every expert on every token: shapes independent of the routing
            w = torch.zeros(B * T, E, dtype=x.dtype, device=x.device).scatter(1, top_i, top_w)  # (N, E)
            out = torch.zeros_like(flat)
            for e, expert in enumerate(self.experts):
                out = out + w[:, e : e + 1] * expert(flat)
            return out.view(B, T, C)
        out = torch.zeros_like(flat)
        counts = torch.zeros(E, device=x.device)
        for e, expert in enumerate(self.experts):
            tok, slot = (top_i == e).nonzero(as_tuple=True)  # the tokens that chose e, and in which slot
            counts[e] = tok.numel()
            if tok.numel():
                out = out.index_add(0, tok, expert(flat[tok]) * top_w[tok, slot, None])
        share = counts / (B * T * self.top_k)
        self.balance_loss = E * (share * probs.mean(0)).sum()
        self.share = share.detach()
        return out.view(B, T, C)


class Block(nn.Module):
    def __init__(self, dim, num_heads, num_kv_heads, rope_base, qk_gain_init, num_experts, top_k, expert_mult):
        super().__init__()
        self.attn = Attention(dim, num_heads, num_kv_heads, rope_base, qk_gain_init)
        self.mlp = MoE(dim, num_experts, top_k, expert_mult)
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
    def __init__(self, vocab_size, num_layers, model_dim, num_heads, num_kv_heads, rope_base, qk_gain_init,
                 logit_softcap, tied_embed_init_std, num_experts, top_k, expert_mult):
        super().__init__()
        if logit_softcap <= 0:
            raise ValueError(f"logit_softcap must be positive, got {logit_softcap}")
        self.logit_softcap = logit_softcap
        self.tok_emb = nn.Embedding(vocab_size, model_dim)
        nn.init.normal_(self.tok_emb.weight, mean=0.0, std=tied_embed_init_std)
        self.num_encoder = num_layers // 2
        self.num_decoder = num_layers - self.num_encoder
        self.skip_weights = nn.Parameter(torch.ones(min(self.num_encoder, self.num_decoder), model_dim))
        self.blocks = nn.ModuleList(
            Block(model_dim, num_heads, num_kv_heads, rope_base, qk_gain_init, num_experts, top_k, expert_mult)
            for _ in range(num_layers)
        )

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

    def forward(self, input_ids):  # (B, T) -> (B, T, V)
        h, _ = self.hidden(input_ids)
        return self.output(h)

    def forward_cached(self, input_ids, cache, start):  # the generation contract (module docstring)
        if (cache is None) != (start == 0):
            raise ValueError(f"forward_cached: start {start} needs a cache (and start 0 none)")
        h, cache = self.hidden(input_ids, cache, start)
        return self.output(h), None, cache


def build_model(config):
    unknown = set(config) - set(DEFAULTS)
    if unknown:
        raise ValueError(f"unknown model config keys {sorted(unknown)}; known: {sorted(DEFAULTS)}")
    return GPT(**{**DEFAULTS, **config})
