"""The sp8192 era's model: the GPT of the 2026-04-09 record (SP8192, 3-layer recurrence, parallel residuals, 1.0810 bpb).

Readable in one sitting. Shapes are end-of-line comments: B batch, T sequence, C model width,
H heads, K kv heads, D head dim, V vocabulary.

11 physical blocks of 512, 8 heads / 4 kv heads, on the sp8192 tokenizer (V = 8192, tied embeddings):
- MLP 4x with LeakyReLU(0.5) squared; partial RoPE (16 of 64 head dims); block i's normalised
  inputs scaled by 1/sqrt(i + 1); XSA on every block (the attention output loses its component
  along the token's own value); learned per-head query gain, initialised at 5.25;
- depth recurrence: blocks 3-5 run three times, so the forward visits 17 blocks:
  encoder [0 1 2 3 4 5 3 4], decoder [5 3 4 5 6 7 8 9 10]. Training starts without the loop
  (`looping_active` False: encoder 0-4, decoder 5-10) and turns it on at 35 % of the budget
  (train.py); a built model has it on, as the scorer needs;
- parallel residuals from block 7: attention and MLP both read the block's input (GPT-J style);
- U-Net skips with sigmoid gates: decoder step j mixes x with the j-th last encoder output as
  lerp(w_j * skip, x, sigmoid(g_j)) (g initialised at 0);
- a final RMSNorm before the tied head, logits soft-capped at 30; orthogonal init of the matrices,
  output projections zero-initialised.

Contract: build_model(config) -> nn.Module; forward(input_ids [B, T]) -> logits [B, T, V].
torch only. The test-time-training settings (ttt_*) are read by eval.py from the model.
"""

import math

import torch
import torch.nn.functional as F
from torch import nn

DEFAULTS = dict(
    vocab_size=8192,
    num_layers=11,
    model_dim=512,
    num_heads=8,
    num_kv_heads=4,
    mlp_mult=4.0,
    rope_base=10000.0,
    rope_dims=16,
    rope_train_seq_len=2048,  # longer sequences get the NTK-rescaled base (as the record)
    qk_gain_init=5.25,
    logit_softcap=30.0,
    tied_embed_init_std=0.005,
    leaky_slope=0.5,
    xsa_last_n=11,
    ln_scale=True,
    num_loops=2,  # extra passes over blocks loop_start..loop_end
    loop_start=3,
    loop_end=5,
    parallel_residual_start=7,  # -1: none
    skip_gates=True,
    # score-first test-time training (eval.py): SGD + momentum on each chunk after it is scored
    ttt_lr=0.005,
    ttt_momentum=0.9,
    ttt_epochs=3,
    ttt_seq_len=2048,
    ttt_batch_seqs=32,
    ttt_grad_clip=1.0,
    ttt_chunks=1238,  # chunks the cosine LR decay spans (the official split in sp8192 tokens / 32,768)
)


def rms_norm(x):
    return F.rms_norm(x, (x.size(-1),))


class RMSNorm(nn.Module):
    """The final norm as a module, so that GPTQ (train.py) can read the tied head's inputs with a hook."""

    def forward(self, x):
        return rms_norm(x)


class CastedLinear(nn.Linear):
    """Bias-free linear whose float32 weight is cast to the activations' dtype at matmul time."""

    def __init__(self, fan_in, fan_out, zero_init=False):
        super().__init__(fan_in, fan_out, bias=False)
        self.zero_init = zero_init

    def forward(self, x):
        return F.linear(x, self.weight.to(x.dtype))


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

    def forward(self, x):
        B, T, C = x.shape
        q = self.c_q(x).view(B, T, self.num_heads, self.head_dim).transpose(1, 2)  # (B, H, T, D)
        k = self.c_k(x).view(B, T, self.num_kv_heads, self.head_dim).transpose(1, 2)  # (B, K, T, D)
        v = self.c_v(x).view(B, T, self.num_kv_heads, self.head_dim).transpose(1, 2)  # (B, K, T, D)
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
                 xsa, ln_factor, parallel):
        super().__init__()
        self.attn = Attention(dim, num_heads, num_kv_heads, rope_base, rope_dims, rope_train_len, qk_gain_init, xsa)
        self.mlp = MLP(dim, mlp_mult, leaky_slope)
        self.attn_scale = nn.Parameter(torch.ones(dim))
        self.mlp_scale = nn.Parameter(torch.ones(dim))
        self.resid_mix = nn.Parameter(torch.stack((torch.ones(dim), torch.zeros(dim))))  # (2, C)
        self.ln_factor, self.parallel = ln_factor, parallel

    def forward(self, x, x0):  # x, x0: (B, T, C)
        mix = self.resid_mix.to(x.dtype)
        x = mix[0] * x + mix[1] * x0
        a = self.attn_scale.to(x.dtype) * self.attn(rms_norm(x) * self.ln_factor)
        if self.parallel:  # attention and MLP both read the block's input
            return x + a + self.mlp_scale.to(x.dtype) * self.mlp(rms_norm(x) * self.ln_factor)
        x = x + a
        return x + self.mlp_scale.to(x.dtype) * self.mlp(rms_norm(x) * self.ln_factor)


class GPT(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        if cfg["logit_softcap"] <= 0:
            raise ValueError(f"logit_softcap must be positive, got {cfg['logit_softcap']}")
        L, C = cfg["num_layers"], cfg["model_dim"]
        if cfg["num_loops"] > 0 and not 0 <= cfg["loop_start"] <= cfg["loop_end"] < L:
            raise ValueError(f"loop_start {cfg['loop_start']} .. loop_end {cfg['loop_end']} must be blocks of 0..{L - 1}")
        self.logit_softcap = cfg["logit_softcap"]
        self.ttt = {k: v for k, v in cfg.items() if k.startswith("ttt_")}  # read by eval.py
        self.ttt_optimizer = None  # eval.py's SGD, made on its first chunk
        self.ttt_chunks_done = 0
        self.tok_emb = nn.Embedding(cfg["vocab_size"], C)
        par = cfg["parallel_residual_start"]
        self.blocks = nn.ModuleList(
            Block(C, cfg["num_heads"], cfg["num_kv_heads"], cfg["mlp_mult"], cfg["rope_base"], cfg["rope_dims"],
                  cfg["rope_train_seq_len"], cfg["qk_gain_init"], cfg["leaky_slope"], i >= L - cfg["xsa_last_n"],
                  1.0 / math.sqrt(i + 1) if cfg["ln_scale"] else 1.0, 0 <= par <= i)
            for i in range(L)
        )
        # the block order with the loop on (the first half encoder, the rest decoder) and without it
        order = list(range(cfg["loop_start"]))
        order += list(range(cfg["loop_start"], cfg["loop_end"] + 1)) * (cfg["num_loops"] + 1) if cfg["num_loops"] > 0 else []
        order += list(range(cfg["loop_end"] + 1 if cfg["num_loops"] > 0 else cfg["loop_start"], L))
        self.looped = (order[: len(order) // 2], order[len(order) // 2 :])
        self.plain = (list(range(L // 2)), list(range(L // 2, L)))
        self.looping_active = True
        self.final_norm = RMSNorm()
        n_skips = min(len(self.looped[0]), len(self.looped[1]))
        self.skip_weights = nn.Parameter(torch.ones(n_skips, C))
        self.skip_gates = nn.Parameter(torch.zeros(n_skips, C)) if cfg["skip_gates"] else None
        nn.init.normal_(self.tok_emb.weight, mean=0.0, std=cfg["tied_embed_init_std"])
        for m in self.modules():
            if isinstance(m, CastedLinear):
                if m.zero_init:
                    nn.init.zeros_(m.weight)
                elif min(m.weight.shape) >= 64:
                    nn.init.orthogonal_(m.weight)

    def forward(self, input_ids):  # (B, T) -> (B, T, V)
        x = rms_norm(self.tok_emb(input_ids))  # (B, T, C)
        x0 = x
        encoder, decoder = self.looped if self.looping_active else self.plain
        skips = []
        for i in encoder:
            x = self.blocks[i](x, x0)
            skips.append(x)
        for j, i in enumerate(decoder):
            if j < self.skip_weights.size(0) and skips:
                skip = self.skip_weights[j].to(x.dtype) * skips.pop()
                if self.skip_gates is not None:
                    x = torch.lerp(skip, x, torch.sigmoid(self.skip_gates[j].to(x.dtype)))
                else:
                    x = x + skip
            x = self.blocks[i](x, x0)
        logits = F.linear(self.final_norm(x), self.tok_emb.weight.to(x.dtype))  # (B, T, V)
        return self.logit_softcap * torch.tanh(logits / self.logit_softcap)


def build_model(config):
    unknown = set(config) - set(DEFAULTS)
    if unknown:
        raise ValueError(f"unknown model config keys {sorted(unknown)}; known: {sorted(DEFAULTS)}")
    return GPT({**DEFAULTS, **config})
