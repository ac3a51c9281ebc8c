"""The CPU multi-token-prediction baseline's training loop: the naive baseline's, plus an auxiliary
loss from the multi-token-prediction heads (model.py).

Loss per micro-step: cross-entropy of the next token + mtp_loss_weight x the mean over heads j of
the cross-entropy of head j's guess of the token j + 1 further on (positions whose target lies
beyond the sequence are left out). The heads are trained, and always built here; the returned state
holds them only when the model config says keep_mtp_heads (for drafting), so by default the packed,
scored model is the naive baseline's shape and costs no extra bytes. The heads' share of each step
is logged: `mtp_ms` (the heads' forward and loss) against `step_ms`, every log line.

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
import time
from types import SimpleNamespace

import torch
import torch.nn.functional as F

from harness.api import TrainContext

from model import CastedLinear, build_model

CONTROL_PATTERNS = ("attn_scale", "mlp_scale", "resid_mix", "q_gain", "skip_weight")


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

    keep_heads = bool(ctx.model_config.get("keep_mtp_heads", False))
    model = build_model({**ctx.model_config, "keep_mtp_heads": True}).to(d.device)  # heads trained either way
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

    named = list(model.blocks.named_parameters()) + list(model.mtp_heads.named_parameters())
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
    n_mtp = sum(p.numel() for p in model.mtp_heads.parameters())
    ctx.log.info(f"mtp_heads:{len(model.mtp_heads)} mtp_params:{n_mtp} kept_in_artifact:{keep_heads}")
    ctx.log.info(f"model_params:{n_params} world_size:{d.world_size} grad_accum_steps:{accum} micro_tokens:{micro_tokens}")

    def loss_of(logits, h, y):  # (total loss, next-token loss, the heads' mean loss); h: the trunk's (B, T, C)
        main = F.cross_entropy(logits.float().view(-1, logits.size(-1)), y.view(-1))
        if not len(model.mtp_heads):
            return main, main, main.new_zeros(())
        t0 = time.perf_counter()  # the heads' forward and loss (their backward is not timed separately)
        heads = model.mtp_logits(h[:, : -1])  # head j at t guesses x[t + 1 + j] = y[t + j]
        aux = sum(F.cross_entropy(g[:, : g.size(1) + 1 - j].float().reshape(-1, g.size(-1)), y[:, j:].reshape(-1))
                  for j, g in enumerate(heads, start=1)) / len(heads)
        if cuda:
            torch.cuda.synchronize()
        timing["mtp_s"] += time.perf_counter() - t0
        return main + hp.mtp_loss_weight * aux, main, aux

    timing = {"mtp_s": 0.0}
    if max(1, len(model.mtp_heads)) >= hp.train_seq_len:
        raise ValueError(f"mtp_heads {len(model.mtp_heads)} must be below train_seq_len {hp.train_seq_len}")

    def make_step(mode):  # a warm-up step: on CUDA a whole one (to compile); on CPU one micro-batch (the trial)
        amp, micro_steps = (True, accum) if cuda else (mode == "bfloat16", 1)

        def step(x, y):
            for micro in range(micro_steps):
                if d.distributed:
                    ddp.require_backward_grad_sync = micro == micro_steps - 1
                with torch.autocast(device_type=d.device.type, dtype=torch.bfloat16, enabled=amp):
                    logits, h = ddp(x, mtp=True)
                    loss = loss_of(logits, h, y)[0]
                (loss / micro_steps).backward()
            for opt in optimizers:
                opt.step()
                opt.zero_grad(set_to_none=True)

        return step

    wargs = dict(modules=[model], optimizers=optimizers, batch_tokens=micro_tokens, seq_len=hp.train_seq_len,
                 vocab_size=ctx.vocab_size)
    if not cuda:  # off the clock: float32 or (where native, faster) bfloat16, eager
        mode = ctx.cpu.choose(hp.cpu_mode, make_step, repeats=hp.cpu_trial_repeats, compiled=False, **wargs)
    else:
        mode = "cuda_bfloat16"
        if hp.compile and hp.warmup_steps > 0:
            # compile (and autotune) on synthetic tokens, off the clock; the harness restores and verifies the
            # weights, optimizer state and RNGs afterwards, so this cannot train (harness.api BudgetClock.warmup)
            warm = ctx.clock.warmup(make_step(mode), steps=hp.warmup_steps, **wargs)
            ctx.log.info(f"warmup_steps:{warm.steps} off_clock:{warm.off_clock_s:.1f}s verified:{warm.verified}")
    amp = cuda or mode == "bfloat16"  # bfloat16 autocast
    timing["mtp_s"] = 0.0  # the warm-up's and the trial's steps are not training

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
        mtp_sum = torch.zeros((), device=d.device)
        t_step = time.perf_counter()
        for micro in range(accum):
            x, y = ctx.data.next_batch(micro_tokens, hp.train_seq_len)
            if d.distributed:
                ddp.require_backward_grad_sync = micro == accum - 1
            with torch.autocast(device_type=d.device.type, dtype=torch.bfloat16, enabled=amp):
                logits, h = ddp(x, mtp=True)
                loss, main, aux = loss_of(logits, h, y)
            (loss / accum).backward()
            loss_sum += main.detach()
            mtp_sum += aux.detach()
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
        timing["step_s"] = timing.get("step_s", 0.0) + time.perf_counter() - t_step
        if step < 10 or (step + 1) % hp.train_log_every == 0:
            train_loss, mtp_loss = loss_sum.item() / accum, mtp_sum.item() / accum
            step_ms, mtp_ms = 1e3 * timing["step_s"] / (step + 1), 1e3 * timing["mtp_s"] / (step + 1)
            ctx.log.info(f"step:{step + 1} train_loss:{train_loss:.4f} mtp_loss:{mtp_loss:.4f} lr_scale:{scale:.3f} "
                         f"elapsed:{reading.elapsed_s:.1f}s step_ms:{step_ms:.1f} mtp_fwd_ms:{mtp_ms:.1f}")
            ctx.log.metrics(step + 1, train_loss=train_loss, mtp_loss=mtp_loss, lr_scale=scale,
                            elapsed_s=reading.elapsed_s, step_ms=step_ms, mtp_fwd_ms=mtp_ms)
    state = model.state_dict()
    return state if keep_heads else {k: v for k, v in state.items() if not k.startswith("mtp_heads.")}
