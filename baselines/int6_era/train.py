"""The int6 era's training loop (the 2026-03-23 record): Muon with weight decay, AdamW, EMA, late QAT.

train(ctx) follows the harness contract (harness/api.py). What the record adds to the naive loop
(baselines/naive_baseline/train.py):
- Muon (lr 0.025, momentum 0.92 -> 0.99 over 1500 steps, Nesterov, 5 Newton-Schulz steps) with
  decoupled weight decay 0.04 on every block matrix; AdamW (wd 0.04) on the token, bigram and value
  embeddings (lr 0.035) and on vectors, scalars and the small projections (lr 0.025);
- gradient clipping at norm 0.3; 786,432-token batches of 2,048-token sequences;
- LR warmdown over the last 3,500 steps' worth of wall-clock (estimated from the mean step time);
- late QAT: once the LR scale falls below 0.15 the linears see their weights on the int6 grid
  (straight-through), so the packed int6 model is the one that was trained;
- EMA of the weights (decay 0.997, float32), loaded into the model at the end: the EMA is what is
  packed. (The record also keeps a tight SWA every 50 steps in the warmdown; its final model is the
  EMA, so the SWA is not reproduced.)
Packing is the harness's `int6_lzma9` codec (config.toml): per-row int6 with a per-row clip search,
int8 embeddings, fp16 small tensors, lzma-9. The record's "GPTQ-lite" is the same kind of search
(5 quantile clips per row, the least squared error wins); the codec searches 9 clips k * rms.

On CPU the step mode is float32 or bfloat16 autocast (`cpu_mode`; "auto" times the eager modes off
the clock in the harness's start-up trial and keeps the faster). No torch.compile on CPU.
"""

import contextlib
import math
from types import SimpleNamespace

import torch
import torch.nn.functional as F

from harness.api import TrainContext

from model import CastedLinear, build_model

CONTROL_PATTERNS = ("attn_scale", "mlp_scale", "resid_mix", "q_gain", "skip_weight")
EMBEDDINGS = ("tok_emb.weight", "bigram.embed.weight", "ve_embed.weight")


def newton_schulz5(G, steps, eps=1e-7, bf16=None):
    """Approximately orthogonalise G (quintic Newton-Schulz; bfloat16 on GPU and in CPU bfloat16 mode)."""
    a, b, c = 3.4445, -4.7750, 2.0315
    X = G.bfloat16() if (G.is_cuda if bf16 is None else bf16) else G.float()
    X = X / (X.norm() + eps)
    transposed = G.size(0) > G.size(1)
    if transposed:
        X = X.T
    for _ in range(steps):
        A = X @ X.T
        X = a * X + (b * A + c * A @ A) @ X
    return X.T if transposed else X


class Muon(torch.optim.Optimizer):
    """Nesterov momentum, orthogonalised update, decoupled weight decay p *= 1 - lr * wd."""

    def __init__(self, params, lr, momentum, backend_steps, weight_decay, rank=0, world_size=1, all_reduce=None):
        super().__init__(params, dict(lr=lr, momentum=momentum, backend_steps=backend_steps, weight_decay=weight_decay))
        self.rank, self.world_size, self.all_reduce = rank, world_size, all_reduce
        self.bf16 = None

    @torch.no_grad()
    def step(self):
        for group in self.param_groups:
            params = group["params"]
            if not params:
                continue
            dtype = torch.bfloat16 if params[0].is_cuda else torch.float32
            flat = torch.zeros(sum(p.numel() for p in params), device=params[0].device, dtype=dtype)
            offset = 0
            for i, p in enumerate(params):
                if i % self.world_size == self.rank and p.grad is not None:
                    buf = self.state[p].setdefault("momentum_buffer", torch.zeros_like(p.grad))
                    buf.mul_(group["momentum"]).add_(p.grad)
                    g = newton_schulz5(p.grad.add(buf, alpha=group["momentum"]), group["backend_steps"], bf16=self.bf16)
                    g = g * max(1.0, g.size(0) / g.size(1)) ** 0.5
                    flat[offset : offset + p.numel()] = g.reshape(-1).to(dtype)
                offset += p.numel()
            if self.world_size > 1:
                self.all_reduce(flat, "sum")
            offset = 0
            for p in params:
                if group["weight_decay"] > 0:
                    p.mul_(1.0 - group["lr"] * group["weight_decay"])
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
    if cuda:  # the record's precision: bf16 body, fp32 linear weights and control/low-dim params
        model.bfloat16()
        for m in model.modules():
            if isinstance(m, CastedLinear):
                m.float()
        for name, p in model.named_parameters():
            if p.ndim < 2 or any(k in name for k in CONTROL_PATTERNS):
                p.data = p.data.float()
    # compiled, late QAT is switched by a tensor the graph reads (one graph, compiled in the warm-up): flipping a
    # Python flag instead made Dynamo compile a second graph, on the clock or in a warm-up twice as long
    qat_mix = None
    if cuda and hp.compile and hp.late_qat_threshold > 0:
        qat_mix = torch.zeros((), device=d.device)
        for m in model.modules():
            if isinstance(m, CastedLinear):
                m.register_buffer("qat_mix", qat_mix, persistent=False)  # not in the state: the artifact is unchanged
    fwd = torch.compile(model, dynamic=False) if cuda and hp.compile else model
    ddp = d.ddp(fwd, broadcast_buffers=False) if d.distributed else fwd

    named = list(model.named_parameters())
    matrices = [p for n, p in named if n.startswith("blocks.") and p.ndim == 2 and not any(k in n for k in CONTROL_PATTERNS)]
    embeds = [p for n, p in named if n in EMBEDDINGS]
    taken = {id(p) for p in matrices + embeds}
    scalars = [p for _, p in named if id(p) not in taken]
    adamw = dict(betas=(hp.beta1, hp.beta2), eps=hp.adam_eps, weight_decay=hp.adam_wd, fused=cuda)
    opt_tok = torch.optim.AdamW([{"params": embeds, "lr": hp.tied_embed_lr, "base_lr": hp.tied_embed_lr}], **adamw)
    opt_scalar = torch.optim.AdamW([{"params": scalars, "lr": hp.scalar_lr, "base_lr": hp.scalar_lr}], **adamw)
    opt_muon = Muon(matrices, hp.matrix_lr, hp.muon_momentum, hp.muon_backend_steps, hp.muon_wd, d.rank, d.world_size,
                    d.all_reduce)
    for g in opt_muon.param_groups:
        g["base_lr"] = hp.matrix_lr
    optimizers = [opt_tok, opt_muon, opt_scalar]
    n_params = sum(p.numel() for p in model.parameters())
    ctx.log.info(f"model_params:{n_params} world_size:{d.world_size} grad_accum_steps:{accum} micro_tokens:{micro_tokens}")

    def autocast(amp):
        return torch.autocast(device_type=d.device.type, dtype=amp) if amp is not None else contextlib.nullcontext()

    def micro_step(x, y, amp, micro):
        if d.distributed:
            ddp.require_backward_grad_sync = micro == accum - 1
        with autocast(amp):
            logits = ddp(x)
        loss = F.cross_entropy(logits.float().view(-1, logits.size(-1)), y.view(-1))
        (loss / accum).backward()
        return loss.detach()

    def mode_setting(mode):  # (autocast dtype or None, Newton-Schulz in bfloat16; None: on GPU only)
        if cuda:
            return torch.bfloat16, None
        return (torch.bfloat16, True) if mode == "bfloat16" else (None, False)

    def make_step(mode):
        amp, ns_bf16 = mode_setting(mode)

        def warm_step(x, y):
            opt_muon.bf16 = ns_bf16
            for micro in range(accum):
                micro_step(x, y, amp, micro)
            for opt in optimizers:
                opt.step()
                opt.zero_grad(set_to_none=True)

        return warm_step

    wargs = dict(modules=[model], optimizers=optimizers, batch_tokens=micro_tokens, seq_len=hp.train_seq_len,
                 vocab_size=ctx.vocab_size)
    if not cuda:  # off the clock: float32 or (where native, faster) bfloat16, eager
        mode = ctx.cpu.choose(hp.cpu_mode, make_step, repeats=hp.cpu_trial_repeats, compiled=False, **wargs)
    else:
        mode = "cuda_bfloat16"
        if hp.compile and hp.warmup_steps > 0:
            warm = ctx.clock.warmup(make_step(mode), steps=hp.warmup_steps, **wargs)
            ctx.log.info(f"warmup_steps:{warm.steps} off_clock:{warm.off_clock_s:.1f}s verified:{warm.verified}")
    amp, ns_bf16 = mode_setting(mode)
    opt_muon.bf16 = ns_bf16

    def lr_scale(step, elapsed_s):
        if hp.warmdown_iters <= 0:
            return 1.0
        if not math.isfinite(ctx.clock.budget_s):
            start = max(hp.iterations - hp.warmdown_iters, 0)
            return max((hp.iterations - step) / hp.warmdown_iters, 0.0) if step >= start else 1.0
        warmdown_s = hp.warmdown_iters * elapsed_s / max(step, 1)
        remaining_s = max(ctx.clock.budget_s - elapsed_s, 0.0)
        return remaining_s / max(warmdown_s, 1e-9) if remaining_s <= warmdown_s else 1.0

    ema = {n: t.detach().float().clone() for n, t in model.state_dict().items()} if hp.ema_decay > 0 else None
    qat_on = False
    model.train()
    step, last_s, step_s = 0, 0.0, 0.0
    for step in range(hp.iterations):
        reading = ctx.clock.tick()
        step_s, last_s = reading.elapsed_s - last_s, reading.elapsed_s  # the last step's time (the same on every rank)
        if reading.stop or reading.elapsed_s + step_s > ctx.clock.budget_s:  # a step that would end past the budget is not started
            ctx.log.info(f"stopping: budget spent at step {step} ({reading.elapsed_s:.1f} s, last step {step_s:.1f} s)")
            break
        scale = lr_scale(step, reading.elapsed_s)
        if hp.late_qat_threshold > 0 and scale < hp.late_qat_threshold and not qat_on:
            qat_on = True
            if qat_mix is not None:
                qat_mix.fill_(1.0)
            else:
                for m in model.modules():
                    if isinstance(m, CastedLinear):
                        m.qat = True
            ctx.log.info(f"late_qat: on at step {step} (lr scale {scale:.3f})")
        loss_sum = torch.zeros((), device=d.device)
        for micro in range(accum):
            x, y = ctx.data.next_batch(micro_tokens, hp.train_seq_len)
            loss_sum += micro_step(x, y, amp, micro)
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
        if ema is not None:
            with torch.no_grad():
                for n, t in model.state_dict().items():
                    ema[n].mul_(hp.ema_decay).add_(t.detach().float(), alpha=1.0 - hp.ema_decay)
        if step < 10 or (step + 1) % hp.train_log_every == 0:
            train_loss = loss_sum.item() / accum
            ctx.log.info(f"step:{step + 1} train_loss:{train_loss:.4f} lr_scale:{scale:.3f} elapsed:{reading.elapsed_s:.1f}s")
            ctx.log.metrics(step + 1, train_loss=train_loss, lr_scale=scale, elapsed_s=reading.elapsed_s)
    for m in model.modules():
        if isinstance(m, CastedLinear):
            m.qat = False
    if ema is not None:
        state = model.state_dict()
        model.load_state_dict({n: t.to(state[n].dtype) for n, t in ema.items()})
        ctx.log.info(f"ema: packed the EMA of the weights (decay {hp.ema_decay})")
    return model
