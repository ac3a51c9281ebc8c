"""Evaluation: run a model over validation tokens and sum per-token losses and bytes exactly.

Shapes in this file use suffixes: B batch, L sequence length, V vocabulary.

Standard mode (the reference's): the validation shards' tokens are concatenated (each document
is BOS + its tokens), cut to `usable = ((N - 1) // L) * L` targets, and split into
non-overlapping windows: x = tokens[i*L : (i+1)*L], y = tokens[i*L+1 : (i+1)*L+1]. Every target
is scored once, with the context of its own window only.

The scorer takes the model's logits, checks their shape and finiteness, and computes
log-softmax and the loss itself in float64 (and float64 sums); a model never reports its own loss.
float64 makes the analytic goldens exact: uniform logits over 256 byte pieces score 8.0 bpb.
The byte count of target y_t is table.token_bytes(x_t, y_t) (DESIGN.md, exact byte accounting).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from tqdm import tqdm

from data.tokenizer import ByteTable
from scoring.bpb import BpbSums

EVAL_MODES = ("standard",)
EVAL_DTYPES = ("float32", "bfloat16")


@dataclass(frozen=True, kw_only=True, slots=True)
class EvalConfig:
    mode: str = "standard"
    """Which targets are scored with which context (see module docstring)."""
    seq_len: int = 1024
    """Window length L in tokens."""
    batch_seqs: int = 32
    """Windows per forward pass; changes speed, never the result beyond float rounding."""
    max_tokens: int | None = None
    """Score only the first this-many validation tokens (a documented subset for the CPU track)."""
    dtype: str = "float32"
    """Compute dtype of the forward pass: float32, or bfloat16 autocast (GPU)."""

    def __post_init__(self) -> None:
        if self.mode not in EVAL_MODES:
            raise ValueError(f"eval mode must be one of {EVAL_MODES}, got {self.mode!r}")
        if self.seq_len <= 0 or self.batch_seqs <= 0:
            raise ValueError(f"seq_len and batch_seqs must be positive, got {self.seq_len}, {self.batch_seqs}")
        if self.max_tokens is not None and self.max_tokens <= self.seq_len:
            raise ValueError(f"max_tokens must exceed seq_len ({self.seq_len}), got {self.max_tokens}")
        if self.dtype not in EVAL_DTYPES:
            raise ValueError(f"eval dtype must be one of {EVAL_DTYPES}, got {self.dtype!r}")


@dataclass(frozen=True)
class EvalResult:
    sums: BpbSums
    windows: int
    eval_time_s: float


def standard_targets(tokens: np.ndarray, seq_len: int, max_tokens: int | None = None) -> tuple[np.ndarray, int]:
    """Validation tokens cut to the standard windows: (tokens[: usable + 1], number of windows)."""
    if max_tokens is not None:
        tokens = tokens[: max_tokens + 1]
    windows = (tokens.size - 1) // seq_len
    if windows <= 0:
        raise ValueError(f"validation split has {tokens.size} tokens: too short for one window of seq_len={seq_len}")
    return tokens[: windows * seq_len + 1], windows


def token_nats(model: nn.Module, x_BL: torch.Tensor, y_BL: torch.Tensor, vocab_size: int, dtype: str) -> torch.Tensor:
    """Per-token negative log-likelihood (nats, float64, shape B×L) from the model's logits."""
    autocast = dtype == "bfloat16"
    with torch.autocast(device_type=x_BL.device.type, dtype=torch.bfloat16, enabled=autocast):
        logits_BLV = model(x_BL)
    if not isinstance(logits_BLV, torch.Tensor):
        raise ValueError(f"model forward returned {type(logits_BLV).__name__}; it must return logits [batch, seq, vocab]")
    B, L = x_BL.shape
    if logits_BLV.ndim != 3 or logits_BLV.shape[:2] != (B, L) or logits_BLV.shape[2] < vocab_size:
        raise ValueError(
            f"model returned logits of shape {tuple(logits_BLV.shape)}; expected ({B}, {L}, V) with V >= {vocab_size}"
        )
    logits_BLV = logits_BLV.double()
    if not torch.isfinite(logits_BLV).all():
        raise ValueError("model returned non-finite logits (nan or inf)")
    logp_BLV = F.log_softmax(logits_BLV, dim=-1)
    return -logp_BLV.gather(-1, y_BL.unsqueeze(-1)).squeeze(-1)


@torch.inference_mode()
def evaluate_standard(
    model: nn.Module, tokens: np.ndarray, table: ByteTable, cfg: EvalConfig, device: torch.device
) -> EvalResult:
    t0 = time.perf_counter()
    toks, windows = standard_targets(tokens, cfg.seq_len, cfg.max_tokens)
    L = cfg.seq_len
    sums = BpbSums()
    all_t = torch.from_numpy(toks.astype(np.int64))
    with tqdm(total=windows, desc="score", unit="win", disable=None, leave=False) as bar:
        for w0 in range(0, windows, cfg.batch_seqs):
            w1 = min(w0 + cfg.batch_seqs, windows)
            chunk = all_t[w0 * L : w1 * L + 1]
            x_BL = chunk[:-1].reshape(-1, L)
            y_BL = chunk[1:].reshape(-1, L)
            nats_BL = token_nats(model, x_BL.to(device), y_BL.to(device), table.vocab_size, cfg.dtype)
            nbytes = table.token_bytes(x_BL.numpy(), y_BL.numpy())
            sums.add(nats_BL, nbytes)
            bar.update(w1 - w0)
    if device.type == "cuda":
        torch.cuda.synchronize()
    return EvalResult(sums, windows, time.perf_counter() - t0)


def evaluate(model: nn.Module, tokens: np.ndarray, table: ByteTable, cfg: EvalConfig, device: torch.device) -> EvalResult:
    """Score `model` on validation `tokens` in `cfg.mode`."""
    if cfg.mode == "standard":
        return evaluate_standard(model, tokens, table, cfg, device)
    raise ValueError(f"unknown eval mode {cfg.mode!r}")


def unigram_bpb(counts: np.ndarray, tokens: np.ndarray, table: ByteTable, seq_len: int, max_tokens: int | None = None) -> float:
    """bpb of a unigram model (add-1/2 smoothed training counts) on the standard-mode targets: context for a score."""
    toks, _ = standard_targets(tokens, seq_len, max_tokens)
    counts = np.asarray(counts, dtype=np.float64)
    if counts.size < table.vocab_size:
        counts = np.pad(counts, (0, table.vocab_size - counts.size))
    logp = np.log(counts + 0.5) - math.log(float(counts.sum() + 0.5 * counts.size))
    prev, tgt = toks[:-1].astype(np.int64), toks[1:].astype(np.int64)
    nats = float(-logp[tgt].sum())
    nbytes = int(table.token_bytes(prev, tgt).sum())
    return nats / (math.log(2.0) * nbytes)
