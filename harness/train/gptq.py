"""GPTQ, an optional pack step that runs in the training process, on the training clock (pack.gptq_batches).

The records quantised their matrices with GPTQ (Frantar et al., 2022): each weight row is rounded to its
integer grid one input column at a time, and the rounding error of each column is spread over the
columns not yet rounded, weighted by the inverse of H = E[x xᵀ], the Gram matrix of the layer's inputs.
The records' rule was that H may only be read from training batches, inside the 600 s. Here:

- the submission sees a budget `pack.gptq_reserve_s` shorter than the run's (ctx.clock.budget_s): its
  stop reading comes that much early, and the reserve is left for this step;
- when train(ctx) returns, rank 0 builds the scored model from model.py (build_model, as the scorer
  does), loads the returned state, and reads `pack.gptq_batches` training batches of
  `pack.gptq_batch_tokens` tokens (sequences of `pack.gptq_seq_len`) from the run's own token stream,
  after the submission's last batch. Forward hooks on every nn.Linear (and subclass) whose weight the
  codec quantises to integers sum xᵀx over the batch's tokens;
- each such matrix W (rows × cols) gets the codec's own per-row scale s (rowquant.quantize_rows on W as
  trained: the codec's clip rule), and GPTQ picks the integers q in [-qmax, qmax] column by column,
  the columns in order of decreasing H diagonal ("act order"), a damping of `DAMP` × mean(diag H) on the
  diagonal, inputs never seen (diag 0) zeroed, blocks of `pack.gptq_block_size` columns;
- the state handed over holds q * s in float32. The codec keeps a row already on a grid exactly (its
  grid candidates, rowquant.GRID_STEPS), so the artifact holds GPTQ's integers, not a re-rounding;
  a row whose largest |q| fell more than GRID_STEPS below qmax is re-rounded by the codec (counted in
  the record: rows_rerounded_by_codec).

All of it is on the clock: the supervisor stops it at the handover, and a step that runs past the budget
is over_budget like any training. It is the harness's code in the submission's process, so it is trusted
no more than the submission (it changes nothing the scorer checks); it is a convenience that makes the
records' packing one config line. Matrices with no Hessian (no nn.Linear reads them: a tied head, a
custom layer) are left to the codec's rounding, and the record (`gptq` in train.json) names them.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

from harness.api import MODEL_FILE, build_submission_model
from harness.train.gptq_config import GptqConfig, integer_codec
from harness.train.submitted import import_submission_file

DAMP = 0.01
"""Added to H's diagonal, times its mean: keeps the Cholesky factorisation defined."""


def gptq_quantize(
    w: torch.Tensor, h: torch.Tensor, s: torch.Tensor, qmax: int, block_size: int
) -> torch.Tensor:
    """Integers q (rows × cols, float32 holding integers in [-qmax, qmax]) for W ≈ q * s[:, None], by GPTQ.

    w: (rows, cols) float32; h: (cols, cols) the inputs' Gram matrix; s: (rows,) float32 per-row scales.
    """
    rows, cols = w.shape
    h = h.to(torch.float64).clone()
    dead = h.diagonal() == 0
    h[dead, dead] = 1.0
    h.diagonal().add_(DAMP * h.diagonal().mean())
    order = torch.argsort(h.diagonal(), descending=True, stable=True)
    back = torch.argsort(order)
    work = w.to(torch.float64)[:, order].clone()
    work[:, dead[order]] = 0.0
    h = h[order][:, order]
    # the upper Cholesky factor of H⁻¹: row j holds how column j's error spreads over the later columns
    u = torch.linalg.cholesky(torch.cholesky_inverse(torch.linalg.cholesky(h)), upper=True)
    scale = s.to(torch.float64)[:, None]
    q = torch.empty(rows, cols, dtype=torch.float64)
    for start in range(0, cols, block_size):
        end = min(start + block_size, cols)
        block = work[:, start:end].clone()
        errs = torch.empty(rows, end - start, dtype=torch.float64)
        for j in range(end - start):
            col = start + j
            qj = torch.clamp(torch.round(block[:, j : j + 1] / scale), -qmax, qmax)
            q[:, col : col + 1] = qj
            err = (block[:, j : j + 1] - qj * scale) / u[col, col]
            errs[:, j : j + 1] = err
            block[:, j + 1 :] -= err * u[col, col + 1 : end][None, :]
        work[:, end:] -= errs @ u[start:end, end:]
    return q[:, back].to(torch.float32)


def _linear_inputs(model: nn.Module, targets: set[str]) -> tuple[dict[str, torch.Tensor], list[Any]]:
    """Forward hooks summing xᵀx of the input of every nn.Linear whose weight is a target."""
    grams: dict[str, torch.Tensor] = {}
    hooks = []
    for mname, module in model.named_modules():
        key = f"{mname}.weight" if mname else "weight"
        if isinstance(module, nn.Linear) and key in targets:

            def hook(mod: nn.Module, inputs: tuple[torch.Tensor, ...], output: Any, key: str = key) -> None:
                x = inputs[0].detach().reshape(-1, inputs[0].shape[-1]).to(torch.float32)
                if key not in grams:
                    grams[key] = torch.zeros(x.shape[1], x.shape[1], dtype=torch.float32, device=x.device)
                grams[key].addmm_(x.T, x)

            hooks.append(module.register_forward_hook(hook))
    return grams, hooks


def apply_gptq(
    state: dict[str, torch.Tensor],
    *,
    model: nn.Module,
    codec_roles: Callable[[str, torch.Tensor], int | None],
    next_batch: Callable[[int, int], tuple[torch.Tensor, torch.Tensor]],
    cfg: GptqConfig,
    log: Callable[[str], None] = print,
) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """(the state with every matrix GPTQ could reach replaced by q * s in float32, the step's record).

    model: the scored model (build_model), on the training device; its weights are loaded from `state`.
    codec_roles(name, tensor): the codec's integer bits for that tensor, None where it is not quantised
    to integers. next_batch(tokens, seq_len): the run's training stream.
    """
    from scoring.artifact.codecs.rowquant import GRID_STEPS, quantize_rows

    t0 = time.perf_counter()
    bits = {n: b for n, t in state.items() if (b := codec_roles(n, t)) is not None}
    try:
        model.load_state_dict(state, strict=True)
    except RuntimeError as e:
        raise ValueError(
            f"GPTQ pack step (pack.gptq_batches): the state train() returned does not load into model.py's "
            f"build_model(config) as the scorer would load it: {e}"
        ) from e
    model.float().eval()
    grams, hooks = _linear_inputs(model, set(bits))
    tokens = 0
    try:
        with torch.no_grad():
            for _ in range(cfg.batches):
                x, _ = next_batch(cfg.batch_tokens, cfg.seq_len)
                model(x)
                tokens += x.numel()
    finally:
        for h in hooks:
            h.remove()
    t_read = time.perf_counter() - t0
    out = dict(state)
    rerounded = 0
    for name, h in grams.items():
        w = state[name].detach().to("cpu", torch.float32)
        _, s16 = quantize_rows(w, bits[name])  # the codec's own per-row scale, on W as trained
        s = s16.to(torch.float32)
        qmax = 2 ** (bits[name] - 1) - 1
        q = gptq_quantize(w, (h / max(tokens, 1)).cpu(), s, qmax, cfg.block_size)
        out[name] = (q * s[:, None]).contiguous()
        top = q.abs().amax(dim=1)
        rerounded += int(((top > 0) & (top < qmax - GRID_STEPS)).sum())  # past the codec's grid candidates
    record = {
        **cfg.to_json(),
        "matrices": sorted(grams),
        "left_to_codec": sorted(set(bits) - set(grams)),
        "tokens_read": tokens,
        "rows_rerounded_by_codec": rerounded,
        "read_s": t_read,
        "total_s": time.perf_counter() - t0,
    }
    log(
        f"gptq: {len(grams)} matrices from {cfg.batches} training batches ({tokens:,} tokens) in "
        f"{record['total_s']:.1f} s; {len(record['left_to_codec'])} integer tensors left to the codec's rounding"
    )
    return out, record


def codec_bits(codec_spec: str) -> Callable[[str, torch.Tensor], int | None]:
    """For a per-row integer codec spec (rowquant), name -> bits of the tensor's scheme (None: not integer)."""
    from scoring.artifact.codecs.rowquant import INT_SCHEMES, role_of

    table = integer_codec(codec_spec).role_table()

    def bits(name: str, t: torch.Tensor) -> int | None:
        return INT_SCHEMES.get(table[role_of(name, t)])

    return bits


def scored_model(submission_dir: Path, model_config: dict[str, Any], device: torch.device) -> nn.Module:
    """The model as the scorer builds it (model.py's build_model(config)), on `device`."""
    path = submission_dir / MODEL_FILE
    module = import_submission_file(path, "pgolf_submission_model_gptq")
    return build_submission_model(module, model_config, path).to(device)
