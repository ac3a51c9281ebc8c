"""The CPU mixture-of-experts baseline's training loop: the naive baseline's, plus the routers'
load-balancing loss (model.py's MoE), with the share of tokens per expert logged.

Loss per micro-step: cross-entropy + balance_loss_weight x the mean over blocks of E x sum_e f_e x P_e
(1.0 when the routing is balanced). Every log line prints `balance` and, per block, the share of
token-expert assignments each expert got (`share L0:0.26/0.24/...`); metrics get the largest share
per block (`share_max_L0`...): balanced, every share is 1/E; a router that collapses onto top_k
experts shows their shares near 1/top_k and the others' near 0.
The routers' weights are trained by Adam (with the vectors), not Muon.

train(ctx) follows the harness contract (harness/api.py): tokens come from ctx.data, the clock
from ctx.clock (one tick per step; every rank stops on the same step), and the trained model is
returned for the harness to pack and score.

Optimisers (the reference's):
- Muon (lr 0.04, Nesterov momentum warmed 0.85 -> 0.95 over 500 steps, 5 Newton-Schulz steps) on
  the 2-D matrices inside the blocks; each rank orthogonalises a share of them, then one
  all-reduce exchanges the updates;
- Adam (beta 0.9/0.95, eps 1e-8) on the tied embedding (lr 0.05) and on vectors/scalars (lr 0.04).
LR warmdown: linear to zero over the last `warmdown_iters` steps' worth of wall-clock, estimated
from the mean step time so far (the budget, not a step count, ends training).
"""

import math
from types import SimpleNamespace

import torch
import torch.nn.functional as F

from harness.api import TrainContext

from model import CastedLinear, build_model

CONTROL_PATTERNS = ("attn_scale", "mlp_scale", "resid_mix", "q_gain", "skip_weight", "router")


def newton_schulz5(G, steps, eps=1e-7):
    """Approximately orthogonalise G (quintic Newton-Schulz, in bfloat16 on GPU)."""
    a, b, c = 3.4445, -4.7750, 2.0315
    X = G.bfloat16() if G.is_cuda else G.float()
    X = X / (X.norm() + eps)
    transposed = G.size(0) > G.size(1)
    if transposed:
        X = X.T
    for _ in range(steps):
        A = X @ X.T
        X = a * X + (b * A + c * A @ A) @ X
    return X.T if transposed else X


class Muon(torch.optim.Optimizer):
    def __init__(self, params, lr, momentum, backend_steps, rank=0, world_size=1, all_reduce=None):
        super().__init__(params, dict(lr=lr, momentum=momentum, backend_steps=backend_steps))
        self.rank, self.world_size, self.all_reduce = rank, world_size, all_reduce

    @torch.no_grad()
    def step(self):
        for group in self.param_groups:
            params = group["params"]
            if not params:
                continue
            # bfloat16 on GPU as the reference exchanges them; float32 on CPU, where bf16 matmuls are slow
            dtype = torch.bfloat16 if params[0].is_cuda else torch.float32
            flat = torch.zeros(sum(p.numel() for p in params), device=params[0].device, dtype=dtype)
            offset = 0
            for i, p in enumerate(params):
                if i % self.world_size == self.rank and p.grad is not None:
                    buf = self.state[p].setdefault("momentum_buffer", torch.zeros_like(p.grad))
                    buf.mul_(group["momentum"]).add_(p.grad)
                    g = newton_schulz5(p.grad.add(buf, alpha=group["momentum"]), group["backend_steps"])
                    g = g * max(1.0, g.size(0) / g.size(1)) ** 0.5
                    flat[offset : offset + p.numel()] = g.reshape(-1).to(dtype)
                offset += p.numel()
            if self.world_size > 1:
                self.all_reduce(flat, "sum")
            offset = 0
            for p in params:
                p.add_(flat[offset : offset + p.numel()].view_as(p).to(p.dtype), alpha=-group["lr"])
                offset += p.numel()


def train(ctx: TrainContext):
    hp = SimpleNamespace(**ctx.hparams)  # config.toml [train], the one set of defaults
    d = ctx.dist
    cuda = d.device.type == "cuda"
    accum = hp.grad_accum_steps or max(1, 8 // d.world_size)
    micro_tokens = hp.train_batch_tokens // (d.world_size * accum)
    if micro_tokens * d.world_size * accum != hp.train_batch_tokens or micro_tokens % hp.train_seq_len:
        raise ValueError(
            f"train_batch_tokens {hp.train_batch_tokens} must split into {d.world_size} ranks x {accum} micro-steps "
            f"of whole {hp.train_seq_len}-token sequences"
        )
    if ctx.model_config.get("vocab_size", 1024) < ctx.vocab_size:
        raise ValueError(f"model vocab_size {ctx.model_config.get('vocab_size')} < tokenizer vocab {ctx.vocab_size}")

    model = build_model(dict(ctx.model_config)).to(d.device)
    if cuda:  # the reference's precision: bf16 body, fp32 linear weights and control/low-dim params
        model.bfloat16()
        for m in model.modules():
            if isinstance(m, CastedLinear):
                m.float()
        for name, p in model.named_parameters():
            if p.ndim < 2 or any(k in name for k in CONTROL_PATTERNS):
                p.data = p.data.float()
    fwd = torch.compile(model, dynamic=False) if (cuda and hp.compile) else model
    ddp = d.ddp(fwd, broadcast_buffers=False) if d.distributed else fwd

    named = list(model.blocks.named_parameters())
    matrices = [p for n, p in named if p.ndim == 2 and not any(k in n for k in CONTROL_PATTERNS)]
    scalars = [p for n, p in named if p.ndim < 2 or any(k in n for k in CONTROL_PATTERNS)] + [model.skip_weights]
    adam = dict(betas=(hp.beta1, hp.beta2), eps=hp.adam_eps, fused=cuda)
    opt_tok = torch.optim.Adam([{"params": [model.tok_emb.weight], "lr": hp.tied_embed_lr, "base_lr": hp.tied_embed_lr}], **adam)
    opt_scalar = torch.optim.Adam([{"params": scalars, "lr": hp.scalar_lr, "base_lr": hp.scalar_lr}], **adam)
    opt_muon = Muon(matrices, hp.matrix_lr, hp.muon_momentum, hp.muon_backend_steps, d.rank, d.world_size, d.all_reduce)
    for g in opt_muon.param_groups:
        g["base_lr"] = hp.matrix_lr
    optimizers = [opt_tok, opt_muon, opt_scalar]
    n_params = sum(p.numel() for p in model.parameters())
    ctx.log.info(f"model_params:{n_params} world_size:{d.world_size} grad_accum_steps:{accum} micro_tokens:{micro_tokens}")

    moes = [block.mlp for block in model.blocks]

    def loss_of(logits, y):  # (total loss, cross-entropy, mean balance loss)
        ce = F.cross_entropy(logits.float().view(-1, logits.size(-1)), y.view(-1))
        balance = sum(m.balance_loss for m in moes) / len(moes)
        return ce + hp.balance_loss_weight * balance, ce, balance

    def make_step(mode):  # a warm-up step: on CUDA a whole one (to compile); on CPU one micro-batch (the trial)
        amp, micro_steps = (True, accum) if cuda else (mode == "bfloat16", 1)

        def step(x, y):
            for micro in range(micro_steps):
                if d.distributed:
                    ddp.require_backward_grad_sync = micro == micro_steps - 1
                with torch.autocast(device_type=d.device.type, dtype=torch.bfloat16, enabled=amp):
                    loss = loss_of(ddp(x), y)[0]
                (loss / micro_steps).backward()
            for opt in optimizers:
                opt.step()
                opt.zero_grad(set_to_none=True)

        return step

    wargs = dict(modules=[model], optimizers=optimizers, batch_tokens=micro_tokens, seq_len=hp.train_seq_len,
                 vocab_size=ctx.vocab_size)
    if not cuda:  # off the clock: float32 or (where native, faster) bfloat16, eager: the routing's shapes vary
        mode = ctx.cpu.choose(hp.cpu_mode, make_step, repeats=hp.cpu_trial_repeats, compiled=False, **wargs)
    else:
        mode = "cuda_bfloat16"
        if hp.compile and hp.warmup_steps > 0:
            # compile (and autotune) on synthetic tokens, off the clock; the harness restores and verifies the
            # weights, optimizer state and RNGs afterwards, so this cannot train (harness.api BudgetClock.warmup)
            warm = ctx.clock.warmup(make_step(mode), steps=hp.warmup_steps, **wargs)
            ctx.log.info(f"warmup_steps:{warm.steps} off_clock:{warm.off_clock_s:.1f}s verified:{warm.verified}")
    amp = cuda or mode == "bfloat16"  # bfloat16 autocast

    def lr_scale(step, elapsed_s):
        if hp.warmdown_iters <= 0:
            return 1.0
        if not math.isfinite(ctx.clock.budget_s):
            start = max(hp.iterations - hp.warmdown_iters, 0)
            return max((hp.iterations - step) / hp.warmdown_iters, 0.0) if step >= start else 1.0
        warmdown_s = hp.warmdown_iters * elapsed_s / max(step, 1)
        remaining_s = max(ctx.clock.budget_s - elapsed_s, 0.0)
        return remaining_s / max(warmdown_s, 1e-9) if remaining_s <= warmdown_s else 1.0

    model.train()
    for step in range(hp.iterations):
        reading = ctx.clock.tick()
        if reading.stop:
            ctx.log.info(f"stopping: budget spent at step {step} ({reading.elapsed_s:.1f} s)")
            break
        scale = lr_scale(step, reading.elapsed_s)
        loss_sum = torch.zeros((), device=d.device)
        balance_sum = torch.zeros((), device=d.device)
        shares = torch.zeros(len(moes), len(moes[0].experts), device=d.device)  # (blocks, E)
        for micro in range(accum):
            x, y = ctx.data.next_batch(micro_tokens, hp.train_seq_len)
            if d.distributed:
                ddp.require_backward_grad_sync = micro == accum - 1
            with torch.autocast(device_type=d.device.type, dtype=torch.bfloat16, enabled=amp):
                loss, ce, balance = loss_of(ddp(x), y)
            (loss / accum).backward()
            loss_sum += ce.detach()
            balance_sum += balance.detach()
            shares += torch.stack([m.share for m in moes]) / accum
        frac = min(step / hp.muon_momentum_warmup_steps, 1.0) if hp.muon_momentum_warmup_steps > 0 else 1.0
        for g in opt_muon.param_groups:
            g["momentum"] = (1 - frac) * hp.muon_momentum_warmup_start + frac * hp.muon_momentum
        for opt in optimizers:
            for g in opt.param_groups:
                g["lr"] = g["base_lr"] * scale
        if hp.grad_clip_norm > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), hp.grad_clip_norm)
        for opt in optimizers:
            opt.step()
            opt.zero_grad(set_to_none=True)
        if step < 10 or (step + 1) % hp.train_log_every == 0:
            train_loss, balance = loss_sum.item() / accum, balance_sum.item() / accum
            share_text = " ".join(f"L{i}:" + "/".join(f"{v:.2f}" for v in row.tolist()) for i, row in enumerate(shares))
            ctx.log.info(f"step:{step + 1} train_loss:{train_loss:.4f} balance:{balance:.3f} lr_scale:{scale:.3f} "
                         f"elapsed:{reading.elapsed_s:.1f}s share {share_text}")
            share_max = {f"share_max_L{i}": float(row.max()) for i, row in enumerate(shares)}
            ctx.log.metrics(step + 1, train_loss=train_loss, balance_loss=balance, lr_scale=scale,
                            elapsed_s=reading.elapsed_s, **share_max)
    return model
