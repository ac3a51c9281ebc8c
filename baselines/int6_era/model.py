"""The int6 era's model: the 11x512 GPT of the 2026-03-23 record (LeakyReLU^2, legal TTT, 1.1194 bpb).

Readable in one sitting. Shapes are end-of-line comments: B batch, T sequence, C model width,
H heads, K kv heads, D head dim, V vocabulary.

What it adds to the naive baseline's 9x512 GPT (baselines/naive_baseline/model.py):
- 11 blocks, MLP 3x with LeakyReLU(0.5) squared (negative pre-activations keep a gradient);
- BigramHash: a 1536-row table indexed by a hash of (previous token, token), projected to C and
  added to the token embedding (scale 0.05, zero-initialised);
- SmearGate: each position mixes in a learned share of the previous position's embedding;
- partial RoPE: only the first 16 of the 64 head dims are rotated;
- LN scale: block i's normalised inputs are multiplied by 1/sqrt(i + 1);
- XSA on the last 4 blocks: the attention output loses its component along the token's own value;
- value embeddings (VE128): a shared 128-wide token table, projected to the kv width and added to
  the values of blocks 9 and 10, each with its own scale;
- a final RMSNorm before the tied output head; orthogonal init of the matrices, output
  projections zero-initialised (the record scales them by 1/sqrt(2L) after zeroing: still zero).
The record stores its matrices in four 3-D "banks" for a batched Muon; here each block owns its
nn.Linear weights (same maths, per-matrix Newton-Schulz in train.py).

Contract: build_model(config) -> nn.Module; forward(input_ids [B, T]) -> logits [B, T, V].
torch only. The test-time-training settings (ttt_*) are read by eval.py from the model.
"""

import math

import torch
import torch.nn.functional as F
from torch import nn

DEFAULTS = dict(
    vocab_size=1024,
    num_layers=11,
    model_dim=512,
    num_heads=8,
    num_kv_heads=4,
    mlp_mult=3.0,
    rope_base=10000.0,
    rope_dims=16,
    rope_train_seq_len=1024,  # the record's rotary assumes 1,024: its 2,048-token sequences get the NTK-rescaled base
    qk_gain_init=1.5,
    logit_softcap=30.0,
    tied_embed_init_std=0.005,
    leaky_slope=0.5,
    bigram_vocab_size=1536,
    bigram_dim=128,
    xsa_last_n=4,
    ln_scale=True,
    ve_dim=128,
    ve_layers="9,10",
    # score-first test-time training (eval.py): SGD + momentum on each chunk after it is scored
    ttt_lr=0.002,
    ttt_momentum=0.9,
    ttt_epochs=3,
    ttt_seq_len=2048,
    ttt_batch_seqs=32,
    ttt_grad_clip=1.0,
    ttt_chunks=1893,  # chunks the cosine LR decay spans (the record: 1,893 chunks of 32,768 tokens)
)


def rms_norm(x):
    return F.rms_norm(x, (x.size(-1),))


class CastedLinear(nn.Linear):
    """Bias-free linear, float32 weight cast to the activations' dtype. With late QAT on (train.py), the
    forward sees the weight rounded to the int6 grid (straight-through gradient), as the record.

    Two switches, one meaning: `qat` (a Python flag, eager CPU training) or `qat_mix` (a 0-dim tensor buffer,
    0.0 or 1.0, given by train.py to a compiled model: the graph reads it, so switching QAT on is a fill, not a
    recompile on the clock; with 0.0 the weight is exactly the plain one, w + 0 * delta = w)."""

    qat = False

    def __init__(self, fan_in, fan_out, zero_init=False):
        super().__init__(fan_in, fan_out, bias=False)
        self.zero_init = zero_init
        self.register_buffer("qat_mix", None, persistent=False)  # never in the state (train.py sets it)

    def forward(self, x):
        w = self.weight.to(x.dtype)
        if self.training and (self.qat or self.qat_mix is not None):
            with torch.no_grad():
                w32 = self.weight.float()
                scale = (w32.abs().amax(dim=1) / 31.0).clamp_min(1.0 / 31.0)
                w_q = (torch.clamp(torch.round(w32 / scale[:, None]), -32, 31) * scale[:, None]).to(x.dtype)
            delta = (w_q - w).detach()
            w = w + (delta if self.qat_mix is None else self.qat_mix.to(x.dtype) * delta)
        return F.linear(x, w)


class Rotary(nn.Module):
    """RoPE on the first `rope_dims` dims of each head (partial RoPE). Sequences longer than `train_len`
    use the record's NTK rescaling: base * (T / train_len) ** (R / (R - 2))."""

    def __init__(self, rope_dims, base, train_len):
        super().__init__()
        self.rope_dims, self.base, self.train_len = rope_dims, base, train_len
        self._cache = None  # (T, device, cos, sin)

    def forward(self, T, device, dtype):
        if self._cache is None or self._cache[0] != T or self._cache[1] != device:
            R = self.rope_dims
            base = self.base * (T / self.train_len) ** (R / (R - 2)) if T > self.train_len else self.base
            inv_freq = 1.0 / (base ** (torch.arange(0, R, 2, dtype=torch.float32, device=device) / R))
            freqs = torch.outer(torch.arange(T, device=device, dtype=torch.float32), inv_freq)
            self._cache = (T, device, freqs.cos()[None, None], freqs.sin()[None, None])  # (1, 1, T, R/2)
        return self._cache[2].to(dtype), self._cache[3].to(dtype)


def apply_rotary(x, cos, sin, rope_dims):  # x: (B, H, T, D); rotates x[..., :rope_dims]
    rot, rest = x[..., :rope_dims], x[..., rope_dims:]
    half = rope_dims // 2
    x1, x2 = rot[..., :half], rot[..., half:]
    return torch.cat((x1 * cos + x2 * sin, x2 * cos - x1 * sin, rest), dim=-1)


class Attention(nn.Module):
    def __init__(self, dim, num_heads, num_kv_heads, rope_base, rope_dims, rope_train_len, qk_gain_init, xsa):
        super().__init__()
        if dim % num_heads or num_heads % num_kv_heads:
            raise ValueError(f"model_dim {dim} must divide by num_heads {num_heads}, and num_heads by num_kv_heads {num_kv_heads}")
        self.num_heads, self.num_kv_heads, self.xsa = num_heads, num_kv_heads, xsa
        self.head_dim = dim // num_heads
        self.rope_dims = min(rope_dims, self.head_dim) if rope_dims > 0 else self.head_dim
        if self.rope_dims % 2:
            raise ValueError(f"rope_dims {self.rope_dims} must be even")
        kv_dim = num_kv_heads * self.head_dim
        self.c_q = CastedLinear(dim, dim)
        self.c_k = CastedLinear(dim, kv_dim)
        self.c_v = CastedLinear(dim, kv_dim)
        self.proj = CastedLinear(dim, dim, zero_init=True)
        self.q_gain = nn.Parameter(torch.full((num_heads,), qk_gain_init, dtype=torch.float32))
        self.rotary = Rotary(self.rope_dims, rope_base, rope_train_len)

    def forward(self, x, v_embed=None):
        B, T, C = x.shape
        q = self.c_q(x).view(B, T, self.num_heads, self.head_dim).transpose(1, 2)  # (B, H, T, D)
        k = self.c_k(x).view(B, T, self.num_kv_heads, self.head_dim).transpose(1, 2)  # (B, K, T, D)
        v = self.c_v(x)  # (B, T, K*D)
        if v_embed is not None:
            v = v + v_embed
        v = v.view(B, T, self.num_kv_heads, self.head_dim).transpose(1, 2)  # (B, K, T, D)
        q, k = rms_norm(q), rms_norm(k)
        cos, sin = self.rotary(T, x.device, q.dtype)
        q, k = apply_rotary(q, cos, sin, self.rope_dims), apply_rotary(k, cos, sin, self.rope_dims)
        q = q * self.q_gain.to(q.dtype)[None, :, None, None]
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=self.num_kv_heads != self.num_heads)
        if self.xsa:  # remove each head's component along its own (normalised) value vector
            group = self.num_heads // self.num_kv_heads
            yg = y.view(B, self.num_kv_heads, group, T, self.head_dim)
            vn = F.normalize(v, dim=-1).unsqueeze(2)  # (B, K, 1, T, D)
            y = (yg - (yg * vn).sum(-1, keepdim=True) * vn).view(B, self.num_heads, T, self.head_dim)
        return self.proj(y.transpose(1, 2).reshape(B, T, C))  # (B, T, C)


class MLP(nn.Module):
    def __init__(self, dim, mlp_mult, leaky_slope):
        super().__init__()
        hidden = int(mlp_mult * dim)
        self.fc = CastedLinear(dim, hidden)
        self.proj = CastedLinear(hidden, dim, zero_init=True)
        self.leaky_slope = leaky_slope

    def forward(self, x):
        return self.proj(F.leaky_relu(self.fc(x), negative_slope=self.leaky_slope).square())


class Block(nn.Module):
    def __init__(self, dim, num_heads, num_kv_heads, mlp_mult, rope_base, rope_dims, rope_train_len, qk_gain_init, leaky_slope,
                 xsa, ln_factor):
        super().__init__()
        self.attn = Attention(dim, num_heads, num_kv_heads, rope_base, rope_dims, rope_train_len, qk_gain_init, xsa)
        self.mlp = MLP(dim, mlp_mult, leaky_slope)
        self.attn_scale = nn.Parameter(torch.ones(dim))
        self.mlp_scale = nn.Parameter(torch.ones(dim))
        self.resid_mix = nn.Parameter(torch.stack((torch.ones(dim), torch.zeros(dim))))  # (2, C)
        self.ln_factor = ln_factor

    def forward(self, x, x0, v_embed=None):  # x, x0: (B, T, C)
        mix = self.resid_mix.to(x.dtype)
        x = mix[0] * x + mix[1] * x0
        x = x + self.attn_scale.to(x.dtype) * self.attn(rms_norm(x) * self.ln_factor, v_embed)
        return x + self.mlp_scale.to(x.dtype) * self.mlp(rms_norm(x) * self.ln_factor)


class BigramHash(nn.Module):
    """An embedding of hash(previous token, token) into `rows` rows (row rows-1 for position 0)."""

    def __init__(self, rows, dim, model_dim):
        super().__init__()
        self.rows = rows
        self.embed = nn.Embedding(rows, dim)
        self.proj = CastedLinear(dim, model_dim, zero_init=True)
        self.scale = nn.Parameter(torch.tensor(0.05))

    def forward(self, ids):  # (B, T) -> (B, T, C)
        t = ids.to(torch.int32)
        h = torch.full_like(t, self.rows - 1)
        h[:, 1:] = torch.bitwise_xor(36313 * t[:, 1:], 27191 * t[:, :-1]) % (self.rows - 1)
        return self.proj(self.embed(h.long())) * self.scale.to(torch.float32)


class SmearGate(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.gate = nn.Parameter(torch.zeros(dim))

    def forward(self, x):  # (B, T, C)
        g = torch.sigmoid(self.gate.to(x.dtype))
        prev = torch.cat((torch.zeros_like(x[:, :1]), x[:, :-1]), dim=1)
        return (1 - g) * x + g * prev


class GPT(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        if cfg["logit_softcap"] <= 0:
            raise ValueError(f"logit_softcap must be positive, got {cfg['logit_softcap']}")
        L, C = cfg["num_layers"], cfg["model_dim"]
        self.logit_softcap = cfg["logit_softcap"]
        self.ttt = {k: v for k, v in cfg.items() if k.startswith("ttt_")}  # read by eval.py
        self.ttt_optimizer = None  # eval.py's SGD, made on its first chunk
        self.ttt_chunks_done = 0
        self.tok_emb = nn.Embedding(cfg["vocab_size"], C)
        self.bigram = BigramHash(cfg["bigram_vocab_size"], cfg["bigram_dim"], C) if cfg["bigram_vocab_size"] > 0 else None
        self.smear = SmearGate(C)
        self.num_encoder = L // 2
        self.num_decoder = L - self.num_encoder
        self.skip_weights = nn.Parameter(torch.ones(min(self.num_encoder, self.num_decoder), C))
        self.blocks = nn.ModuleList(
            Block(C, cfg["num_heads"], cfg["num_kv_heads"], cfg["mlp_mult"], cfg["rope_base"], cfg["rope_dims"],
                  cfg["rope_train_seq_len"], cfg["qk_gain_init"], cfg["leaky_slope"], i >= L - cfg["xsa_last_n"],
                  1.0 / math.sqrt(i + 1) if cfg["ln_scale"] else 1.0)
            for i in range(L)
        )
        self.ve_layers = [int(s) for s in str(cfg["ve_layers"]).split(",") if s.strip() and int(s) < L]
        kv_dim = cfg["num_kv_heads"] * (C // cfg["num_heads"])
        if self.ve_layers:
            self.ve_embed = nn.Embedding(cfg["vocab_size"], cfg["ve_dim"])
            self.ve_proj = CastedLinear(cfg["ve_dim"], kv_dim, zero_init=True)
            self.ve_scale = nn.Parameter(torch.tensor(0.1))
            self.ve_layer_scales = nn.Parameter(torch.ones(len(self.ve_layers)))
        self._init_weights(cfg)

    def _init_weights(self, cfg):
        nn.init.normal_(self.tok_emb.weight, mean=0.0, std=cfg["tied_embed_init_std"])
        if self.ve_layers:
            nn.init.normal_(self.ve_embed.weight, std=0.01)
        if self.bigram is not None:
            nn.init.zeros_(self.bigram.embed.weight)
        for m in self.modules():
            if isinstance(m, CastedLinear):
                if m.zero_init:
                    nn.init.zeros_(m.weight)
                elif min(m.weight.shape) >= 64:
                    nn.init.orthogonal_(m.weight)

    def forward(self, input_ids):  # (B, T) -> (B, T, V)
        x = self.tok_emb(input_ids)  # (B, T, C)
        if self.bigram is not None:
            x = x + self.bigram(input_ids).to(x.dtype)
        x = self.smear(rms_norm(x))
        x0 = x
        ve = self.ve_proj(self.ve_embed(input_ids)) * self.ve_scale.to(x.dtype) if self.ve_layers else None  # (B, T, K*D)

        def v_embed(i):
            return ve * self.ve_layer_scales[self.ve_layers.index(i)].to(x.dtype) if i in self.ve_layers else None

        skips = []
        for i in range(self.num_encoder):
            x = self.blocks[i](x, x0, v_embed(i))
            skips.append(x)
        for j in range(self.num_decoder):
            i = self.num_encoder + j
            if skips:
                x = x + self.skip_weights[j].to(x.dtype) * skips.pop()
            x = self.blocks[i](x, x0, v_embed(i))
        logits = F.linear(rms_norm(x), self.tok_emb.weight.to(x.dtype))  # (B, T, V)
        return self.logit_softcap * torch.tanh(logits / self.logit_softcap)


def build_model(config):
    unknown = set(config) - set(DEFAULTS)
    if unknown:
        raise ValueError(f"unknown model config keys {sorted(unknown)}; known: {sorted(DEFAULTS)}")
    return GPT({**DEFAULTS, **config})
