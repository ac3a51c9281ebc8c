"""Legality probes, run with every score: causality and normalization. A failed probe fails the score.

    run_probes(model, tokens, vocab_size, cfg, device) -> record (raises ProbeFailure)

- causality: a window of L tokens is scored once as it is (base), then in one batch of variants,
  each with every token after a sampled position t replaced by a different random token. No
  logit at or before t may change (beyond `atol`). Row 0 of the variant batch is the unchanged
  window, so a model that mixes batch rows (in standard mode the next row *is* the future) fails
  too. Windows: the first validation window and one random validation window; positions: 0,
  L - 2 and random ones in between (seeded, recorded).
- normalization: for a model that returns log-probabilities itself (`pgolf_output =
  "log_probs"`), logsumexp over the vocabulary must be 0 (|.| <= `norm_atol_nats`) at every
  sampled position. For logits, the scorer normalizes them itself (float64 log-softmax); the probe
  checks that path the same way, so the record always says what was checked.

A ProbeFailure names the probe, the window, the position t whose future was changed and the first
position p <= t whose logits moved, with the size of the change.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from scoring.score.evaluate import Guard, model_logits, output_kind

PROBE_VERSION = 1


class ProbeFailure(ValueError):
    """A legality probe failed; the message names the probe and the position."""


@dataclass(frozen=True, kw_only=True, slots=True)
class ProbeConfig:
    seq_len: int = 1024
    """Probe window length (the eval's L)."""
    positions: int = 6
    """Positions t sampled per window (0 and L - 2 always among them)."""
    seed: int = 0
    """Seed of the sampled positions, windows and replacement tokens (recorded)."""
    dtype: str = "float32"
    """Forward dtype, as in the eval."""
    atol: float | None = None
    """Largest allowed |Δlogit| before t; None: 1e-4 in float32, 5e-2 under bfloat16 autocast."""
    norm_atol_nats: float = 1e-4
    """Largest allowed |logsumexp| of returned log-probabilities, in nats."""

    def __post_init__(self) -> None:
        if self.seq_len < 2:
            raise ValueError(f"probe seq_len must be at least 2, got {self.seq_len}")
        if self.positions < 1:
            raise ValueError(f"probe positions must be at least 1, got {self.positions}")
        if self.norm_atol_nats <= 0 or (self.atol is not None and self.atol < 0):
            raise ValueError(
                f"probe tolerances must be positive, got atol={self.atol}, norm_atol_nats={self.norm_atol_nats}"
            )

    @property
    def resolved_atol(self) -> float:
        if self.atol is not None:
            return self.atol
        return 5e-2 if self.dtype == "bfloat16" else 1e-4


def _positions(L: int, k: int, g: torch.Generator) -> list[int]:
    """0, L - 2 and k - 2 more distinct positions in between (t < L - 1: something must follow t)."""
    perm = torch.randperm(L - 1, generator=g).tolist()
    return sorted({0, L - 2} | set(perm[: max(0, k - 2)]))


def causality_probe(
    model: nn.Module,
    window: torch.Tensor,
    vocab_size: int,
    cfg: ProbeConfig,
    g: torch.Generator,
    name: str,
    guard: Guard | None = None,
) -> dict[str, Any]:
    """Check one window (1-D, L tokens, on the model's device). Raises ProbeFailure."""
    L = int(window.numel())
    positions = _positions(L, cfg.positions, g)
    base = model_logits(model, window[None], vocab_size, cfg.dtype, guard).float()[0]  # (L, V)
    variants = [window.clone()]
    for t in positions:
        v = window.clone()
        shift = torch.randint(1, vocab_size, (L - t - 1,), generator=g).to(window.device)
        v[t + 1 :] = (window[t + 1 :] + shift) % vocab_size  # every later token differs
        variants.append(v)
    out = model_logits(model, torch.stack(variants), vocab_size, cfg.dtype, guard).float()  # (K+1, L, V)
    atol = cfg.resolved_atol
    worst = 0.0
    row0 = (out[0] - base).abs().amax(-1)  # (L,)
    if torch.isnan(row0).any() or bool((row0 > atol).any()):
        p = int(torch.nonzero(torch.isnan(row0) | (row0 > atol))[0])
        raise ProbeFailure(
            f"causality probe failed ({name}): the logits of an unchanged row changed at position {p} "
            f"(max |Δlogit| = {float(row0[p]):.3g} > {atol:g}) when other rows of the batch changed: "
            "rows of a batch must not see each other (in standard mode the next row is the future)"
        )
    worst = max(worst, float(row0.max()))
    for k, t in enumerate(positions, start=1):
        d = (out[k, : t + 1] - base[: t + 1]).abs().amax(-1)  # (t+1,)
        bad = torch.isnan(d) | (d > atol)
        if bool(bad.any()):
            p = int(torch.nonzero(bad)[0])
            raise ProbeFailure(
                f"causality probe failed ({name}): changing the tokens after position {t} changed the logits at "
                f"position {p} (max |Δlogit| = {float(d[p]):.3g} > {atol:g}); a model may use only tokens at or "
                "before the position it predicts from"
            )
        worst = max(worst, float(d.max()))
    return {"window": name, "positions": positions, "max_abs_diff": worst}


def normalization_probe(
    model: nn.Module,
    window: torch.Tensor,
    vocab_size: int,
    cfg: ProbeConfig,
    positions: list[int],
    guard: Guard | None = None,
) -> dict[str, Any]:
    """logsumexp of the distribution the scorer uses must be 0 at each sampled position."""
    kind = output_kind(model)
    out = model_logits(model, window[None], vocab_size, cfg.dtype, guard)[0].double()  # (L, V)
    logp = F.log_softmax(out, dim=-1) if kind == "logits" else out
    lse = torch.logsumexp(logp[positions], dim=-1)  # (P,)
    err = lse.abs()
    bad = torch.isnan(err) | (err > cfg.norm_atol_nats)
    if bool(bad.any()):
        i = int(torch.nonzero(bad)[0])
        raise ProbeFailure(
            f"normalization probe failed: the {kind} returned at position {positions[i]} sum to "
            f"exp({float(lse[i]):.6g}) = {float(torch.exp(lse[i])):.6g}, not 1 (tolerance {cfg.norm_atol_nats:g} nats); "
            "a model returning log-probabilities must return a normalized distribution"
        )
    return {"applies_to": kind, "positions": positions, "max_abs_logsumexp_nats": float(err.max())}


@torch.inference_mode()
def run_probes(
    model: nn.Module,
    tokens: np.ndarray,
    vocab_size: int,
    cfg: ProbeConfig,
    device: torch.device,
    guard: Guard | None = None,
) -> dict[str, Any]:
    """Causality on two validation windows, normalization on the first; returns the probe record."""
    if tokens.size < cfg.seq_len:
        raise ValueError(
            f"probes need a window of {cfg.seq_len} tokens; the validation split has {tokens.size}"
        )
    g = torch.Generator().manual_seed(cfg.seed)
    L = cfg.seq_len
    r = int(torch.randint(0, max(1, tokens.size - L + 1), (1,), generator=g))
    windows = {"first window": 0, f"window at token {r}": r}
    was_training = model.training
    model.eval()
    try:
        causal = []
        for name, s in windows.items():
            w = torch.from_numpy(np.asarray(tokens[s : s + L]).astype(np.int64)).to(device)
            causal.append(causality_probe(model, w, vocab_size, cfg, g, name, guard))
        first = torch.from_numpy(np.asarray(tokens[:L]).astype(np.int64)).to(device)
        norm = normalization_probe(model, first, vocab_size, cfg, causal[0]["positions"], guard)
    finally:
        model.train(was_training)
    return {
        "version": PROBE_VERSION,
        "passed": True,
        "seed": cfg.seed,
        "seq_len": L,
        "atol": cfg.resolved_atol,
        "causality": causal,
        "normalization": norm,
    }
