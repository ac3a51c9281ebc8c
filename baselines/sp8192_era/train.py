"""The sp8192 era's training loop (the 2026-04-09 record): MuonEq-R, AdamW, EMA, depth recurrence on at 35 %, GPTQ on the clock.

train(ctx) follows the harness contract (harness/api.py). The record's procedure:
- MuonEq-R: Muon whose Nesterov update is row-normalised before Newton-Schulz (lr 0.022, momentum
  0.92 -> 0.99 over 1500 steps, 5 steps, decoupled weight decay 0.095) on every block matrix;
  AdamW on the tied embedding (lr 0.03, wd 0.085) and on vectors and scalars (lr 0.02, wd 0.02);
- gradient clipping at norm 0.3; 786,432-token batches of 2,048-token sequences;
- the schedule runs on the fraction of the budget spent, frac = elapsed / (budget - gptq_reserve_s -
  encode_reserve_s; the codec's encode runs on the harness's clock, the record's after it):
  the LR decays linearly to 0 over the last 72 % (warmdown_frac), and the depth recurrence
  (model.py) is switched on once frac reaches 0.35 (enable_looping_at);
- EMA of the weights (decay 0.9965, float32), loaded into the model when training ends;
- GPTQ with SDClip, inside the budget: training stops gptq_reserve_s (12 s) early, Hessians
  H = sum X^T X of every quantised linear's inputs (and of the tied head's inputs for the
  embedding) are collected over gptq_calibration_batches training batches, and each matrix is
  quantised column by column, most-used input first, in blocks of 128, each column's rounding
  error spread over the columns not yet quantised (damping 1 % of the mean diagonal). Scales are
  SDClip (k * row std / qmax: k 12.85, int6 for matrices; k 20, int8 for the embedding). The
  weights handed over are exactly q * s; codec.py stores them bit for bit (brotli-11, byte shuffle).

On CPU the step mode is float32 or bfloat16 autocast (`cpu_mode`; "auto" times the eager modes off
the clock in the harness's start-up trial and keeps the faster). No torch.compile on CPU.
"""

import contextlib
import math
from types import SimpleNamespace

import torch
import torch.nn.functional as F
from codec import EMBEDDING, MATRIX, SMALL_NUMEL, sdclip_scale

from harness.api import TrainContext

from model import CastedLinear, build_model

CONTROL_PATTERNS = ("attn_scale", "mlp_scale", "resid_mix", "q_gain", "skip_weight", "skip_gates")


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
    """Nesterov momentum, rows normalised (MuonEq-R), orthogonalised update, decoupled weight decay p *= 1 - lr * wd."""

    def __init__(self, params, lr, momentum, backend_steps, weight_decay, row_normalize, rank=0, world_size=1,
                 all_reduce=None):
        super().__init__(params, dict(lr=lr, momentum=momentum, backend_steps=backend_steps, weight_decay=weight_decay))
        self.row_normalize = row_normalize
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
                    g = p.grad.add(buf, alpha=group["momentum"])
                    if self.row_normalize:
                        g = g / g.float().norm(dim=-1, keepdim=True).clamp_min(1e-7).to(g.dtype)
                    g = newton_schulz5(g, group["backend_steps"], bf16=self.bf16)
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
    fwd = torch.compile(model, dynamic=False) if cuda and hp.compile else model
    ddp = d.ddp(fwd, broadcast_buffers=False) if d.distributed else fwd

    named = list(model.named_parameters())
    matrices = [p for n, p in named if n.startswith("blocks.") and p.ndim == 2 and not any(k in n for k in CONTROL_PATTERNS)]
    taken = {id(p) for p in matrices} | {id(model.tok_emb.weight)}
    scalars = [p for _, p in named if id(p) not in taken]
    adamw = dict(betas=(hp.beta1, hp.beta2), eps=hp.adam_eps, fused=cuda)
    opt_tok = torch.optim.AdamW([{"params": [model.tok_emb.weight], "lr": hp.tied_embed_lr, "base_lr": hp.tied_embed_lr}],
                                weight_decay=hp.embed_wd, **adamw)
    opt_scalar = torch.optim.AdamW([{"params": scalars, "lr": hp.scalar_lr, "base_lr": hp.scalar_lr}],
                                   weight_decay=hp.adam_wd, **adamw)
    opt_muon = Muon(matrices, hp.matrix_lr, hp.muon_momentum, hp.muon_backend_steps, hp.muon_wd, hp.muon_row_normalize,
                    d.rank, d.world_size, d.all_reduce)
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

        def warm_step(x, y):  # on CUDA alternates the recurrence off and on, so that both forms are compiled
            opt_muon.bf16 = ns_bf16
            model.looping_active = not model.looping_active if cuda else False
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
    model.looping_active = False

    # the codec's encode runs on the clock after the state is handed over (train_time + encode <= budget + grace)
    train_s = ctx.clock.budget_s - (hp.gptq_reserve_s if hp.gptq_calibration_batches > 0 else 0.0) - hp.encode_reserve_s

    def training_frac(step, elapsed_s):
        return elapsed_s / max(train_s, 1e-9) if math.isfinite(train_s) else step / max(hp.iterations, 1)

    def lr_scale(frac):
        if hp.warmdown_frac > 0 and frac >= 1.0 - hp.warmdown_frac:
            return max((1.0 - frac) / hp.warmdown_frac, 0.0)
        return 1.0

    ema = {n: t.detach().float().clone() for n, t in model.state_dict().items()} if hp.ema_decay > 0 else None
    model.train()
    step, last_s, step_s = 0, 0.0, 0.0
    for step in range(hp.iterations):
        reading = ctx.clock.tick()
        step_s, last_s = reading.elapsed_s - last_s, reading.elapsed_s  # the last step's time (the same on every rank)
        frac = training_frac(step, reading.elapsed_s + step_s)  # a step that would end past the training time is not started
        if reading.stop or frac >= 1.0:  # the GPTQ reserve starts here: the clock still runs, batches may be read
            ctx.log.info(f"stopping: training time spent at step {step} ({reading.elapsed_s:.1f} s, last step {step_s:.1f} s)")
            break
        frac = training_frac(step, reading.elapsed_s)
        scale = lr_scale(frac)
        if not model.looping_active and frac >= hp.enable_looping_at:
            model.looping_active = True
            ctx.log.info(f"layer_loop: on at step {step} (frac {frac:.3f}): encoder {model.looped[0]} decoder {model.looped[1]}")
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
    model.looping_active = True
    if ema is not None:
        state = model.state_dict()
        model.load_state_dict({n: t.to(state[n].dtype) for n, t in ema.items()})
        ctx.log.info(f"ema: the EMA of the weights (decay {hp.ema_decay})")
    model.float()  # q * s is exact in float32 (not in bfloat16)
    if hp.gptq_calibration_batches > 0:
        t0 = ctx.clock.elapsed_s()
        hessians = collect_hessians(model, ctx, micro_tokens, hp.train_seq_len, hp.gptq_calibration_batches, amp)
        with torch.no_grad():
            for name, p in model.named_parameters():
                if name in hessians:
                    qmax, sigmas = EMBEDDING if name == "tok_emb.weight" else MATRIX
                    p.copy_(gptq(p.data.float().cpu(), hessians[name].cpu(), qmax, sigmas, hp.gptq_block_size).to(p.device))
        ctx.log.info(f"gptq: {len(hessians)} matrices from {hp.gptq_calibration_batches} training batches in "
                     f"{ctx.clock.elapsed_s() - t0:.1f} s (training clock at {ctx.clock.elapsed_s():.1f} s)")
    return model


def collect_hessians(model, ctx, micro_tokens, seq_len, batches, amp):
    """H = sum over training batches of X^T X, X the inputs of each quantised linear (and the tied head's)."""
    hessians, hooks = {}, []

    def hook_for(name, use_output):
        def hook(module, inputs, output):
            x = (output if use_output else inputs[0]).detach().float().reshape(-1, output.size(-1) if use_output else inputs[0].size(-1))
            if name not in hessians:
                hessians[name] = torch.zeros(x.size(1), x.size(1), device=x.device)
            hessians[name].addmm_(x.T, x)

        return hook

    for mname, m in model.named_modules():
        if isinstance(m, CastedLinear) and m.weight.numel() > SMALL_NUMEL:
            hooks.append(m.register_forward_hook(hook_for(mname + ".weight", False)))
    hooks.append(model.final_norm.register_forward_hook(hook_for("tok_emb.weight", True)))
    model.eval()
    with torch.no_grad():
        for _ in range(batches):
            x, _ = ctx.data.next_batch(micro_tokens, seq_len)
            with torch.autocast(device_type=x.device.type, dtype=amp) if amp is not None else contextlib.nullcontext():
                model(x)
    for h in hooks:
        h.remove()
    return {n: h / batches for n, h in hessians.items()}


def gptq(w, H, qmax, sigmas, block_size):
    """GPTQ of w (rows, cols) on its SDClip grid: returns q * s (float32), q integer in [-qmax, qmax], s float16 per row."""
    rows, cols = w.shape
    H = H.clone()
    dead = torch.diag(H) == 0
    H[dead, dead] = 1.0
    H.diagonal().add_(0.01 * H.diagonal().mean())
    perm = torch.argsort(torch.diag(H), descending=True)  # the most-used inputs first
    inv = torch.argsort(perm)
    W = w[:, perm].clone()
    W[:, dead[perm]] = 0
    H = H[perm][:, perm]
    Hinv = torch.linalg.cholesky(torch.cholesky_inverse(torch.linalg.cholesky(H)), upper=True)
    s = torch.from_numpy(sdclip_scale(w.numpy(), qmax, sigmas)).float()  # (rows,)
    Q = torch.zeros(rows, cols)
    for i1 in range(0, cols, block_size):
        i2 = min(i1 + block_size, cols)
        Wb, Hb = W[:, i1:i2].clone(), Hinv[i1:i2, i1:i2]
        Err = torch.zeros(rows, i2 - i1)
        for j in range(i2 - i1):
            q = torch.clamp(torch.round(Wb[:, j] / s), -qmax, qmax)
            Q[:, i1 + j] = q
            err = (Wb[:, j] - q * s) / Hb[j, j]
            Err[:, j] = err
            Wb[:, j:] -= err[:, None] * Hb[j, j:][None, :]
        if i2 < cols:
            W[:, i2:] -= Err @ Hinv[i1:i2, i2:]
    return Q[:, inv] * s[:, None]
