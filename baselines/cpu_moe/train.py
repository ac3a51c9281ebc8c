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
from dataclasses import dataclass, fields

import torch
import torch.nn.functional as F

from harness.api import TrainContext

from model import CastedLinear, build_model

CONTROL_PATTERNS = ("attn_scale", "mlp_scale", "resid_mix", "q_gain", "skip_weight", "router")


@dataclass(frozen=True)
class Hparams:
    train_batch_tokens: int = 524_288  # global tokens per optimizer step
    train_seq_len: int = 1024
    grad_accum_steps: int = 0  # 0: 8 // world_size, as the reference (the global batch stays fixed)
    iterations: int = 20_000  # upper bound; the clock ends training first
    warmdown_iters: int = 1200
    matrix_lr: float = 0.04
    scalar_lr: float = 0.04
    tied_embed_lr: float = 0.05
    muon_momentum: float = 0.95
    muon_momentum_warmup_start: float = 0.85
    muon_momentum_warmup_steps: int = 500
    muon_backend_steps: int = 5
    beta1: float = 0.9
    beta2: float = 0.95
    adam_eps: float = 1e-8
    grad_clip_norm: float = 0.0
    compile: bool = True  # torch.compile the model (CUDA only)
    cpu_mode: str = "auto"  # CPU: auto | float32 | bfloat16 (auto times both where bfloat16 is native; eager)
    cpu_trial_repeats: int = 2
    warmup_steps: int = 20  # compile warm-up on synthetic tokens, off the clock and undone (CUDA + compile only)
    train_log_every: int = 200
    balance_loss_weight: float = 0.01  # weight of the routers' load-balancing loss


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
    known = {f.name for f in fields(Hparams)}
    unknown = set(ctx.hparams) - known
    if unknown:
        raise ValueError(f"unknown [train] keys {sorted(unknown)}; known: {sorted(known)}")
    hp = Hparams(**ctx.hparams)
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

    if cuda and hp.compile and hp.warmup_steps > 0:
        # compile (and autotune) on synthetic tokens, off the clock; the harness restores and verifies the
        # weights, optimizer state and RNGs afterwards, so this cannot train (harness.api BudgetClock.warmup)
        def warm_step(x, y):
            for micro in range(accum):
                if d.distributed:
                    ddp.require_backward_grad_sync = micro == accum - 1
                with torch.autocast(device_type="cuda", dtype=torch.bfloat16):
                    loss = loss_of(ddp(x), y)[0]
                (loss / accum).backward()
            for opt in optimizers:
                opt.step()
                opt.zero_grad(set_to_none=True)

        report = ctx.clock.warmup(warm_step, modules=[model], optimizers=optimizers, steps=hp.warmup_steps,
                                  batch_tokens=micro_tokens, seq_len=hp.train_seq_len, vocab_size=ctx.vocab_size)
        ctx.log.info(f"warmup_steps:{report.steps} off_clock:{report.off_clock_s:.1f}s verified:{report.verified}")

    amp = cuda  # bfloat16 autocast: always on GPU; on CPU where the start-up trial found it faster
    if not cuda:
        # time float32 and (where native) bfloat16 eager steps off the clock, one micro-batch and the
        # optimizer step each (harness.api CpuTuning); keep the faster. No compile: the routing's shapes vary
        def cpu_step(bf16):
            def step(x, y):
                with torch.autocast(device_type="cpu", dtype=torch.bfloat16, enabled=bf16):
                    loss = loss_of(ddp(x), y)[0]
                loss.backward()
                for opt in optimizers:
                    opt.step()
                    opt.zero_grad(set_to_none=True)

            return step

        modes = [m for m in (ctx.cpu.modes(hp.cpu_mode) if ctx.cpu is not None else [hp.cpu_mode]) if "compile" not in m]
        mode = modes[0] if modes and modes[0] != "auto" else "float32"
        if ctx.cpu is not None and len(modes) > 1 and not d.distributed:
            trial = ctx.cpu.trial({m: cpu_step(m == "bfloat16") for m in modes}, repeats=hp.cpu_trial_repeats)
            ctx.clock.warmup(trial.step, steps=trial.steps, modules=[model], optimizers=optimizers,
                             batch_tokens=micro_tokens, seq_len=hp.train_seq_len, vocab_size=ctx.vocab_size)
            mode = trial.best()
        elif ctx.cpu is not None:
            ctx.cpu.record(chosen=mode, chosen_by="fixed by the preset (train.cpu_mode) or one mode offered")
        amp = mode == "bfloat16"
        ctx.log.info(f"cpu step mode: {mode}")

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
