"""The naive baseline's model: the reference 9x512 GPT of the parameter-golf challenge.

Readable in one sitting. Shapes are end-of-line comments: B batch, T sequence, C model width,
H heads, K kv heads, D head dim, V vocabulary.

- token embedding tied with the output head (init std 0.005), RMSNorm on the embedding
- blocks: residual mixed with the first layer's output (learned `resid_mix`), attention with
  GQA, RMSNorm on q and k, RoPE (base 10000), a learned per-head query gain (init 1.5), then a
  squared-ReLU MLP (2x); each branch scaled by a learned vector; output projections zero-initialised
- U-Net skips: the first half of the blocks store their outputs, the second half adds them back
  in reverse order, each scaled by a learned vector
- logits soft-capped: 30 * tanh(logits / 30)

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
        self._cache = None  # (T, device, cos, sin)

    def forward(self, T, device, dtype):
        if self._cache is None or self._cache[0] != T or self._cache[1] != device:
            freqs = torch.outer(torch.arange(T, device=device, dtype=torch.float32), self.inv_freq.to(device))
            self._cache = (T, device, freqs.cos()[None, None], freqs.sin()[None, None])  # (1, 1, T, D/2)
        return self._cache[2].to(dtype), self._cache[3].to(dtype)


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

    def forward(self, x):
        B, T, C = x.shape
        q = self.c_q(x).view(B, T, self.num_heads, self.head_dim).transpose(1, 2)  # (B, H, T, D)
        k = self.c_k(x).view(B, T, self.num_kv_heads, self.head_dim).transpose(1, 2)  # (B, K, T, D)
        v = self.c_v(x).view(B, T, self.num_kv_heads, self.head_dim).transpose(1, 2)  # (B, K, T, D)
        q, k = rms_norm(q), rms_norm(k)
        cos, sin = self.rotary(T, x.device, q.dtype)
        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        q = q * self.q_gain.to(q.dtype)[None, :, None, None]
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=self.num_kv_heads != self.num_heads)
        return self.proj(y.transpose(1, 2).reshape(B, T, C))  # (B, T, C)


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

    def forward(self, x, x0):  # x, x0: (B, T, C)
        mix = self.resid_mix.to(x.dtype)
        x = mix[0] * x + mix[1] * x0
        x = x + self.attn_scale.to(x.dtype) * self.attn(rms_norm(x))
        return x + self.mlp_scale.to(x.dtype) * self.mlp(rms_norm(x))


class GPT(nn.Module):
    def __init__(self, vocab_size, num_layers, model_dim, num_heads, num_kv_heads, mlp_mult, rope_base,
                 qk_gain_init, logit_softcap, tied_embed_init_std):
        super().__init__()
        if logit_softcap <= 0:
            raise ValueError(f"logit_softcap must be positive, got {logit_softcap}")
        self.logit_softcap = logit_softcap
        self.tok_emb = nn.Embedding(vocab_size, model_dim)
        self.num_encoder = num_layers // 2
        self.num_decoder = num_layers - self.num_encoder
        self.skip_weights = nn.Parameter(torch.ones(min(self.num_encoder, self.num_decoder), model_dim))
        self.blocks = nn.ModuleList(
            Block(model_dim, num_heads, num_kv_heads, mlp_mult, rope_base, qk_gain_init) for _ in range(num_layers)
        )
        # drawn after the blocks are built, as the reference does: the same seed gives the same initial weights
        nn.init.normal_(self.tok_emb.weight, mean=0.0, std=tied_embed_init_std)

    def forward(self, input_ids):  # (B, T) -> (B, T, V)
        x = rms_norm(self.tok_emb(input_ids))  # (B, T, C)
        x0 = x
        skips = []
        for block in self.blocks[: self.num_encoder]:
            x = block(x, x0)
            skips.append(x)
        for i, block in enumerate(self.blocks[self.num_encoder :]):
            if skips:
                x = x + self.skip_weights[i].to(x.dtype) * skips.pop()
            x = block(x, x0)
        logits = F.linear(rms_norm(x), self.tok_emb.weight.to(x.dtype))  # (B, T, V)
        return self.logit_softcap * torch.tanh(logits / self.logit_softcap)


def build_model(config):
    unknown = set(config) - set(DEFAULTS)
    if unknown:
        raise ValueError(f"unknown model config keys {sorted(unknown)}; known: {sorted(DEFAULTS)}")
    return GPT(**{**DEFAULTS, **config})
