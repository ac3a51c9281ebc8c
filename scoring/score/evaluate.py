"""Evaluation: run a model over validation tokens and sum per-token losses and bytes exactly.

Shapes in this file use suffixes: B batch, L sequence length, V vocabulary, N selected targets.

Every mode is a *window plan* (scoring/score/windows.py): a list of windows (start s, length n, first
scored offset f) in target order. A window feeds x = tokens[s : s+n] and scores the targets y = tokens[s+1 : s+n+1]
at offsets f..n-1; the plan is built so that each target of the mode is scored exactly once.

- standard (the reference's): the validation tokens concatenated (each document BOS + its tokens),
  cut to `usable = ((N - 1) // L) * L` targets, split into non-overlapping windows of L. Every
  target is scored once, with the context of its own window only; the tail short of L is dropped (under a
  cut by documents it is a last, shorter window: each document is scored to its end, windows.py whole_documents).
- sliding: windows of L tokens every `stride` S tokens. The first window scores its L targets,
  every later one its last S (the last window ends at the last token and scores what is left), so
  every target 1..N-1 is scored exactly once, with at least L - S tokens of context once past
  the first window. Context crosses documents, as in standard mode.
- documents: no context crosses a BOS. Each document (from its BOS to the next BOS, which is its
  last target: the prediction that it ends, from its own tokens) is planned on its own with the
  sliding rule (stride S, default L: non-overlapping). Every target 1..N-1 is scored exactly once, as
  in sliding mode; only the context differs. (Before, the BOS targets were left out: the entrant's
  choice of mode dropped the hardest targets, which carry no bytes, from the sum.)

Windows are batched: `batch_seqs` windows of L tokens per forward, in plan order (a chunk's last batch may
have fewer), a shorter window right-padded with token 0 to L, which a causal model never sees (the causality
probe in scoring/score/probes.py checks exactly that). The scorer asks for the model's logits at the scored
positions only: each row from its first scored offset, but never past L - stride (a sliding window's first
L - stride positions are context, their logits never cross), to L; it keeps the positions it scores and
discards the rest (a padded row's tail). A batch's shape and its ranges tell a model nothing of where a row
ends: documents mode once sorted its windows by length, cut each batch to its longest row and asked each row
up to its own length, and a model read where each document ends (its last target, the BOS that ends it) from
them, in a way no probe's variant changes (tests/unit/scoring/test_window_shapes.py). The scorer checks the answer's shape and finiteness, and
computes log-softmax and the loss itself in float64 (float64 sums); a model never reports its own loss.
float64 makes the analytic goldens exact: uniform logits over 256 byte pieces score 8.0 bpb. A model that sets
`pgolf_output = "log_probs"` returns log-probabilities instead; each position's must sum to one within
NORM_ATOL_NATS (`check_normalized`), and the scorer normalises them exactly itself (`nats_of`). The byte count of the target at position t is
`table.target_bytes(t, x_t, y_t)`: the dataset's canonical count of that token (data/canonical.py), or,
for a dataset built without one, the tokenizer's byte table (docs/RULES.md, "Exact byte accounting").

Score-first adaptation (scoring/worker/adapt.py): with an adapter, the plan is cut into chunks of about
`adapt_chunk_tokens` targets, in order; a chunk is scored completely (the adapter checks that no
weight moved meanwhile), and only then are its tokens handed to the adapter: positions after the
previous chunk up to the chunk's last target (its targets). The eval clock
(`eval_time_s`) covers scoring and adaptation.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from tqdm import tqdm

from data.canonical import TargetBytes
from data.tokenizer import BOS_ID
from scoring.score.bpb import BpbSums
from scoring.score.eval_config import EvalConfig
from scoring.score.windows import WindowPlan, eval_tokens, plan_windows, standard_targets
from scoring.worker.loading import output_kind
from scoring.worker.wire import BadAnswer, scored_positions, select_scored

PAD_TOKEN = 0

ScoredCallback = Callable[[np.ndarray, torch.Tensor, np.ndarray], None]
"""on_scored(target_positions, nats, bytes): one call per batch, for tests and audits."""
NORM_ATOL_NATS = 1e-4
"""Largest |logsumexp| of returned log-probabilities at any position, in nats (the normalization check)."""


class RuleViolation(ValueError):
    """The model broke a scoring rule (peeking, unnormalized output, adapting before scoring): the entry is illegal."""


class NormalizationFailure(RuleViolation):
    """Log-probabilities that do not sum to one at some position."""


class Scorable(Protocol):
    """What the evaluator and the probes call: a model in a worker process (scoring/score/remote.py's
    WorkerModel) or in this one (LocalModel, for tests and in-process tools)."""

    @property
    def output_kind(self) -> str:
        """ "logits" or "log_probs" (harness.api.MODEL_OUTPUTS)."""
        ...

    def logits(self, x_BL: torch.Tensor) -> torch.Tensor:
        """[B, L, V] output for the token ids x_BL (possibly a view valid until the next call)."""
        ...

    # Optional: scored_logits(x_BL, ranges_B2) -> [N, V], the output at each row's positions [from, to) only,
    # row by row (what the evaluation asks for: a worker then ships only those). A Scorable without it
    # answers `logits` and the scorer selects the same positions (model_scored_logits).


class LocalModel:
    """An nn.Module in this process, behind the Scorable interface (tests, benches, in-process tools).

    The scorer never uses it: submitted code runs only in the model worker."""

    def __init__(self, module: nn.Module, dtype: str = "float32"):
        self.module = module
        self.dtype = dtype
        self.output_kind = output_kind(module)

    def logits(self, x_BL: torch.Tensor) -> torch.Tensor:
        on = self.dtype == "bfloat16"
        with torch.autocast(device_type=x_BL.device.type, dtype=torch.bfloat16, enabled=on):
            return self.module(x_BL)

    def scored_logits(self, x_BL: torch.Tensor, ranges_B2: np.ndarray) -> torch.Tensor:
        out = self.logits(x_BL)
        if not isinstance(out, torch.Tensor) or out.ndim != 3:  # check_scored refuses it, by its shape
            return out
        return select_scored(out, ranges_B2)


def as_scorable(model: nn.Module | Scorable, dtype: str) -> Scorable:
    return LocalModel(model, dtype) if isinstance(model, nn.Module) else model


class KeptBatch(NamedTuple):
    """A probe batch as it was scored: its inputs, real positions, scored ranges and the scorer's copy of the
    logits at the scored positions (the probes ask as the batch was asked, `ask_B2`, and compare those)."""

    x_BL: np.ndarray
    valid_BL: np.ndarray
    ranges_B2: np.ndarray
    """int64 [B, 2]: row b's scored positions are ranges_B2[b, 0] .. ranges_B2[b, 1] - 1."""
    logits_NV: torch.Tensor
    """float32 [N, V]: the scored positions, row by row."""
    group: tuple[tuple[np.ndarray, np.ndarray, np.ndarray], ...] = ()
    """With a worker pool: (x_BL, valid_BL, ask_B2) of every batch the pool's workers held at the same time
    as this one, in worker order (this one included, at `slot`): a probe gives a fresh pool all of them."""
    slot: int = 0
    """The worker of the pool (its rank) that scored this batch."""
    ask_B2: np.ndarray | None = None
    """int64 [B, 2]: the ranges the model was asked for (`asked_ranges`); None: ranges_B2."""


@dataclass(frozen=True)
class EvalResult:
    sums: BpbSums
    windows: int
    eval_time_s: float
    """Wall clock of scoring plus adaptation (the eval budget's clock)."""
    adapt_time_s: float = 0.0
    """Seconds spent inside the adaptation hook (included in eval_time_s)."""
    chunks: int = 1
    batches: int = 0
    """Forward passes made."""
    kept: dict[int, KeptBatch] = field(default_factory=dict)
    """Batch index -> the batch and its scored logits, for the batches asked for in keep_batches."""
    kept_chunks: dict[int, int] = field(default_factory=dict)
    """Batch index -> the adaptation chunk it was scored in (0 without adaptation)."""


class ChunkAdapter(Protocol):
    """What evaluate() needs from a score-first adapter (scoring/worker/adapt.py implements it)."""

    # `model` is the one evaluate() was given: an nn.Module for an in-process adapter
    # (scoring/worker/adapt.py), the WorkerModel itself for the worker's (scoring/score/remote.py).
    def before_chunk(self, model: Any, chunk: int) -> None: ...

    def after_chunk(self, model: Any, chunk: int, scored_tokens: np.ndarray, first_position: int) -> None: ...

    @property
    def adapt_time_s(self) -> float: ...


# ---- The loss ----


def model_logits(
    model: nn.Module | Scorable, x_BL: torch.Tensor, vocab_size: int, dtype: str
) -> torch.Tensor:
    """The model's output for x_BL, checked to be a [B, L, V >= vocab_size] tensor."""
    logits_BLV = as_scorable(model, dtype).logits(x_BL)
    if not isinstance(logits_BLV, torch.Tensor):
        raise BadAnswer(
            f"model forward returned {type(logits_BLV).__name__}; it must return logits [batch, seq, vocab]"
        )
    B, L = x_BL.shape
    if logits_BLV.ndim != 3 or logits_BLV.shape[:2] != (B, L) or logits_BLV.shape[2] < vocab_size:
        raise BadAnswer(
            f"model returned logits of shape {tuple(logits_BLV.shape)}; expected ({B}, {L}, V) with V >= {vocab_size}"
        )
    return logits_BLV


def model_scored_logits(
    model: nn.Module | Scorable, x_BL: torch.Tensor, ranges_B2: np.ndarray, vocab_size: int, dtype: str
) -> torch.Tensor:
    """The model's output at each row's scored positions [from, to), row by row, checked to be [N, V >= vocab_size].

    A Scorable with `scored_logits` (a worker: only these positions cross) is asked for them; one without is
    asked for every position and the same positions are selected here. Either way the loss is the scorer's."""
    scorable = as_scorable(model, dtype)
    ask = getattr(scorable, "scored_logits", None)
    if ask is None:
        return select_scored(model_logits(scorable, x_BL, vocab_size, dtype), ranges_B2)
    return check_scored(ask(x_BL, ranges_B2), ranges_B2, vocab_size)


def check_scored(out_NV: Any, ranges_B2: np.ndarray, vocab_size: int) -> torch.Tensor:
    """An answer at the scored positions, checked to be a [N, V >= vocab_size] tensor."""
    N = int((ranges_B2[:, 1] - ranges_B2[:, 0]).sum())
    if not isinstance(out_NV, torch.Tensor):
        raise BadAnswer(
            f"model forward returned {type(out_NV).__name__}; it must return logits [batch, seq, vocab]"
        )
    if out_NV.ndim != 2 or out_NV.shape[0] != N or out_NV.shape[1] < vocab_size:
        raise BadAnswer(
            f"model returned logits of shape {tuple(out_NV.shape)} at the scored positions; expected ({N}, V) "
            f"with V >= {vocab_size}"
        )
    return out_NV


class LossWorkspace:
    """A reused float64 buffer for the loss, so that no (N, V) float64 tensor is allocated per batch.

    Allocating a fresh (N, V) float64 tensor per batch costs more than the log-softmax itself on CPU
    (its pages are faulted in anew each time: about 70 ms against 11 ms for 4096 x 1024 on 2 cores).
    Rows go through in blocks of at most 64 MiB: few enough operations that a loaded machine does not
    stall on thread barriers (thousands of small blocks did: 3x slower under load), bounded memory
    for large vocabularies. The log-softmax runs in place in that buffer (ATen's row kernel reads a
    row before writing it): one buffer instead of two, less memory traffic. The numbers are
    bit-identical to F.log_softmax(x.double()) (tests/unit/scoring/test_evaluate_loss.py).
    """

    BLOCK_BYTES = 64 << 20

    def __init__(self) -> None:
        self._buf: torch.Tensor | None = None

    def rows(self, n: int, v: int) -> int:
        return max(1, min(n, self.BLOCK_BYTES // (8 * v)))

    def get(self, n: int, v: int, device: torch.device) -> torch.Tensor:
        b = self._buf
        if b is None or b.shape[1] != v or b.shape[0] < n or b.device != device:
            with torch.inference_mode(
                False
            ):  # a plain tensor: writable under inference_mode and no_grad alike
                b = self._buf = torch.empty((n, v), dtype=torch.float64, device=device)
        return b[:n]


def _target_logp_f64(out_NV: torch.Tensor, y_N: torch.Tensor, ws: LossWorkspace | None) -> torch.Tensor:
    """log_softmax(out_NV.double())[i, y_N[i]] for every row i, in float64."""
    if ws is None:
        return F.log_softmax(out_NV.double(), dim=-1).gather(-1, y_N.unsqueeze(-1)).squeeze(-1)
    N, V = out_NV.shape
    step = ws.rows(N, V)
    res = torch.empty((N, 1), dtype=torch.float64, device=out_NV.device)
    for i in range(0, N, step):
        n = min(step, N - i)
        x = ws.get(n, V, out_NV.device)
        x.copy_(out_NV[i : i + n])
        torch.ops.aten._log_softmax.out(x, -1, False, out=x)
        torch.gather(x, -1, y_N[i : i + n].unsqueeze(-1), out=res[i : i + n])
    return res.squeeze(-1)


def nats_of(
    out_NV: torch.Tensor, y_N: torch.Tensor, output: str = "logits", ws: LossWorkspace | None = None
) -> torch.Tensor:
    """-log p(y) per row in float64: the scorer's own log-softmax of what the model returned, logits or
    log-probabilities. Log-probabilities must sum to one within NORM_ATOL_NATS (`check_normalized`), and are
    then normalised exactly: taken as given, rows summing to exp(+1e-4) were 1e-4 nats a token of free score.

    nan or +inf anywhere is refused (either makes the row's log-softmax nan, so checking the gathered
    values finds it without another pass over the logits). -inf is allowed for tokens other than the
    target (probability zero, for logits and log-probabilities alike), never at the target.
    """
    if output == "logits":
        nats = -_target_logp_f64(out_NV, y_N, ws)
    else:
        logp_NV = out_NV.double()
        if bool(torch.isnan(logp_NV).any()) or bool((logp_NV == math.inf).any()):
            raise BadAnswer("model returned non-finite log-probabilities (nan or +inf)")
        lse_N = check_normalized(logp_NV)
        nats = lse_N - logp_NV.gather(-1, y_N.unsqueeze(-1)).squeeze(-1)
    if not bool(torch.isfinite(nats).all()):
        bad = nats[~torch.isfinite(nats)][0]
        what = (
            "non-finite logits (nan or inf)"
            if torch.isnan(bad)
            else "a target probability of zero (infinite loss)"
        )
        raise BadAnswer(f"model returned {what}")
    return nats


def check_normalized(logp_NV: torch.Tensor) -> torch.Tensor:
    """Every row of returned log-probabilities must sum to one (|logsumexp| <= NORM_ATOL_NATS), at every position;
    returns each row's logsumexp."""
    lse_N = torch.logsumexp(logp_NV, dim=-1)
    bad = lse_N.abs() > NORM_ATOL_NATS
    if bool(bad.any()):
        i = int(torch.nonzero(bad)[0])
        raise NormalizationFailure(
            f"normalization check failed: the log_probs returned at a scored position sum to "
            f"exp({float(lse_N[i]):.6g}) = {float(torch.exp(lse_N[i])):.6g}, not 1 (tolerance {NORM_ATOL_NATS:g} nats); "
            "a model returning log-probabilities must return a normalized distribution at every position"
        )
    return lse_N


def token_nats(
    model: nn.Module,
    x_BL: torch.Tensor,
    y_BL: torch.Tensor,
    vocab_size: int,
    dtype: str,
    output: str = "logits",
) -> torch.Tensor:
    """Per-token negative log-likelihood (nats, float64, shape B×L) from the model's logits."""
    logits_BLV = model_logits(model, x_BL, vocab_size, dtype)
    B, L, V = logits_BLV.shape
    return nats_of(logits_BLV.reshape(B * L, V), y_BL.reshape(-1), output).reshape(B, L)


# ---- The loop ----


def _batches(plan: WindowPlan, idx: np.ndarray, cfg: EvalConfig) -> list[np.ndarray]:
    """Window indices grouped into forward passes of batch_seqs windows, in plan order. Never by length: a batch
    packed by its windows' lengths, or cut to its longest, tells a model where its rows end (module docstring)."""
    return [idx[i : i + cfg.batch_seqs] for i in range(0, idx.size, cfg.batch_seqs)]


def asked_ranges(score_from: np.ndarray, seq_len: int, stride: int | None) -> np.ndarray:
    """int64 [B, 2]: what each row is asked for, [first, seq_len): its whole length (a shorter window's padded
    tail too), from its first scored offset but never past seq_len - stride (a document's last window, which
    starts scoring later than its others, looks like any other). So a row's range says only whether it is the
    first window of its text (first 0), which its own first token (a document's BOS) says too, and nothing of
    where it, or its document, ends."""
    first = np.minimum(score_from, seq_len - (stride or seq_len))
    return np.stack([first, np.full_like(first, seq_len)], axis=1).astype(np.int64)


def select_asked(
    out_NV: torch.Tensor, ask_B2: np.ndarray, ranges_B2: np.ndarray, seq_len: int
) -> torch.Tensor:
    """An answer at the asked positions (`ask_B2`, row by row) cut to the scored ones (`ranges_B2`, each inside its
    row's asked range): those the scorer scores and the probes compare."""
    if np.array_equal(ask_B2, ranges_B2):
        return out_NV
    idx = np.searchsorted(scored_positions(ask_B2, seq_len), scored_positions(ranges_B2, seq_len))
    return out_NV.index_select(0, torch.from_numpy(idx).to(out_NV.device))


@dataclass
class _Batch:
    """One forward pass's rows as the scorer builds them (before the model is asked)."""

    perm: np.ndarray | None
    n: int
    offs: np.ndarray
    valid_BL: np.ndarray
    pos_BL: np.ndarray
    x_BL: np.ndarray
    y_BL: np.ndarray
    scored_BL: np.ndarray
    ranges_B2: np.ndarray
    ask_B2: np.ndarray
    """What the model is asked for, row by row (asked_ranges): never where a row ends."""

    def scored(self, out_NV: torch.Tensor) -> torch.Tensor:
        """The answer at the asked positions cut to the scored ones."""
        return select_asked(out_NV, self.ask_B2, self.ranges_B2, self.n)


def _prepare_batch(
    toks: np.ndarray, plan: WindowPlan, w: np.ndarray, shuffle: np.random.Generator | None, cfg: EvalConfig
) -> _Batch:
    perm = shuffle.permutation(w.size) if shuffle is not None else None
    if perm is not None:  # rows in a secret order: the next window of the text is not the next row
        w = w[perm]
    starts, lengths, score_from = plan.starts[w], plan.lengths[w], plan.score_from[w]
    n = cfg.seq_len  # every row padded to seq_len: the batch's length is never its longest row's
    assert int(lengths.max()) <= n, "a window longer than seq_len"
    offs = np.arange(n, dtype=np.int64)
    valid_BL = offs[None, :] < lengths[:, None]
    pos_BL = starts[:, None] + offs[None, :]
    x_BL = np.where(valid_BL, toks[np.where(valid_BL, pos_BL, 0)], PAD_TOKEN).astype(np.int64)
    y_BL = np.where(valid_BL, toks[np.where(valid_BL, pos_BL + 1, 0)], PAD_TOKEN).astype(np.int64)
    scored_BL = valid_BL & (offs[None, :] >= score_from[:, None])
    # the scored positions (row b: score_from .. length - 1, the same rows of scored_BL); the model is asked for
    # ask_B2, which holds them and says nothing of where a row ends
    ranges_B2 = np.stack([score_from, lengths], axis=1).astype(np.int64)
    ask_B2 = asked_ranges(score_from, n, cfg.resolved_stride)
    return _Batch(perm, n, offs, valid_BL, pos_BL, x_BL, y_BL, scored_BL, ranges_B2, ask_B2)


def _score_batch(
    model: nn.Module | Scorable,
    toks: np.ndarray,
    plan: WindowPlan,
    w: np.ndarray,
    table: TargetBytes,
    cfg: EvalConfig,
    device: torch.device,
    output: str,
    sums: BpbSums,
    on_scored: ScoredCallback | None,
    ws: LossWorkspace,
    keep: dict[int, KeptBatch | None] | None,
    batch_index: int,
    snaps: _Snapshots,
    shuffle: np.random.Generator | None = None,
) -> None:
    bt = _prepare_batch(toks, plan, w, shuffle, cfg)
    x_dev = torch.from_numpy(bt.x_BL).to(device)
    out_NV = bt.scored(model_scored_logits(model, x_dev, bt.ask_B2, table.vocab_size, cfg.dtype))
    _finish_batch(bt, out_NV, table, device, output, sums, on_scored, ws, keep, batch_index, snaps)


class _Snapshots:
    """Where the scorer reads every batch's answer into, once: memory made at a device's first answer, before it
    could matter, a buffer of its own for each batch the probes keep and one for every other batch, each of the
    largest batch's size and written through (so its pages are there).

    Every batch then costs the scorer the same: one copy into memory that is already there, and no allocation. A
    kept batch used to cost a copy and fresh memory more, and a model timing the gap between its answers (or
    reading the machine's free memory) could tell which batches the probes would look at, and after the last of
    them peek unseen. And what is scored is always that copy, never memory a worker may still write."""

    def __init__(self, kept: Iterable[int], rows: int):
        self.kept = frozenset(kept)
        self.rows = rows
        self.buffers: dict[torch.device, dict[int | None, torch.Tensor]] = {}

    def take(self, b: int, out_NV: torch.Tensor) -> torch.Tensor:
        """Batch b's answer, copied into its buffer (a view of its first rows)."""
        bufs = self.buffers.get(out_NV.device)
        if bufs is None:
            shape, dev = (self.rows, out_NV.shape[1]), out_NV.device
            bufs = {
                k: torch.zeros(shape, dtype=torch.float32, device=dev) for k in (None, *sorted(self.kept))
            }
            self.buffers[out_NV.device] = bufs
        own = bufs[b if b in self.kept else None][: out_NV.shape[0]]
        if own.shape != out_NV.shape:  # the buffers are as wide as the first answer
            raise BadAnswer(
                f"model returned {out_NV.shape[1]} logits a position in batch {b}, after {own.shape[1]} in the first "
                "batch; a model must return the same number of logits at every position of every batch"
            )
        own.copy_(out_NV.detach())
        return own


def _largest_batch(plan: WindowPlan, per_chunk: Sequence[Sequence[np.ndarray]]) -> int:
    """The most positions a batch scores (its answer's rows), over every chunk's batches."""
    scored = plan.lengths - plan.score_from
    return max((int(scored[w].sum()) for batches in per_chunk for w in batches), default=0)


def _finish_batch(
    bt: _Batch,
    out_NV: torch.Tensor,
    table: TargetBytes,
    device: torch.device,
    output: str,
    sums: BpbSums,
    on_scored: ScoredCallback | None,
    ws: LossWorkspace,
    keep: dict[int, KeptBatch | None] | None,
    batch_index: int,
    snaps: _Snapshots,
) -> None:
    """The scorer's loss on a batch's answer at its scored positions, summed in plan order."""
    perm, n, offs, valid_BL, pos_BL = bt.perm, bt.n, bt.offs, bt.valid_BL, bt.pos_BL
    x_BL, y_BL, scored_BL, ranges_B2 = bt.x_BL, bt.y_BL, bt.scored_BL, bt.ranges_B2
    # every batch read once into the scorer's memory, the same way (_Snapshots), and that copy scored: a worker
    # that rewrote its buffer after answering (a thread racing the scorer) changes nothing, and a probe batch
    # costs what any batch costs
    out_NV = snaps.take(batch_index, out_NV)
    if keep is not None and batch_index in keep:
        keep[batch_index] = KeptBatch(x_BL, valid_BL, ranges_B2, out_NV, ask_B2=bt.ask_B2)
    if scored_BL.all():
        y_N, x_N, pos_N = y_BL.reshape(-1), x_BL.reshape(-1), pos_BL.reshape(-1) + 1
    else:
        y_N, x_N, pos_N = y_BL[scored_BL], x_BL[scored_BL], pos_BL[scored_BL] + 1
    nats_N = nats_of(out_NV, torch.from_numpy(y_N).to(device), output, ws)
    if (
        perm is not None
    ):  # back to plan order before summing: the sums are bit-identical to an unshuffled batch
        rows_BL = np.broadcast_to(perm[:, None] * n + offs[None, :], scored_BL.shape)
        order = np.argsort(rows_BL[scored_BL], kind="stable")
        nats_N = nats_N[torch.from_numpy(order).to(nats_N.device)]
        y_N, x_N, pos_N = y_N[order], x_N[order], pos_N[order]
    nbytes_N = table.target_bytes(pos_N, x_N, y_N)
    sums.add(nats_N, nbytes_N)
    if on_scored is not None:
        on_scored(pos_N, nats_N.detach().cpu(), nbytes_N)


def _chunks(plan: WindowPlan, chunk_tokens: int | None) -> list[np.ndarray]:
    """Consecutive window groups of about chunk_tokens targets (one group without adaptation)."""
    idx = np.arange(plan.num_windows, dtype=np.int64)
    if chunk_tokens is None or idx.size == 0:
        return [idx]
    before = np.cumsum(plan.lengths - plan.score_from) - (plan.lengths - plan.score_from)
    group = before // chunk_tokens
    cuts = np.flatnonzero(np.diff(group)) + 1
    return np.split(idx, cuts)


def evaluate(
    model: nn.Module | Scorable,
    tokens: np.ndarray,
    table: TargetBytes,
    cfg: EvalConfig,
    device: torch.device,
    *,
    bos_id: int = BOS_ID,
    adapter: ChunkAdapter | None = None,
    on_scored: ScoredCallback | None = None,
    keep_batches: Iterable[int] = (),
    shuffle_seed: int | None = None,
) -> EvalResult:
    """Score `model` on validation `tokens` in `cfg.mode`, optionally adapting score-first.

    With `adapter`, windows are scored chunk by chunk in target order, and after a chunk is scored
    completely the adapter receives a fresh copy of exactly the target tokens scored in it. The
    forward passes run under no_grad then (tensors made in inference mode cannot be used to adapt).
    `keep_batches`: indices (in scoring order) of batches whose inputs and logits the result keeps
    (`EvalResult.kept`: the probes compare fresh workers against them). `shuffle_seed`: send each
    batch's rows in an order drawn from this seed (the scorer's secret), so that a model cannot find the
    continuation of a row in the next one; the sums are the same to the bit.
    """
    t0 = time.perf_counter()
    toks = np.ascontiguousarray(eval_tokens(tokens, cfg))
    plan = plan_windows(toks, cfg, bos_id)
    if plan.num_windows == 0:
        raise ValueError(f"no targets to score in {cfg.mode} mode ({toks.size} tokens)")
    output = output_kind(model)
    sums = BpbSums()
    chunks = _chunks(plan, cfg.adapt_chunk_tokens if adapter is not None else None)
    grad_off = torch.no_grad if adapter is not None else torch.inference_mode
    ws = LossWorkspace()
    keep: dict[int, KeptBatch | None] = dict.fromkeys(keep_batches)
    # planned once: the snapshots' size, then the loop
    per_chunk = [_batches(plan, idx, cfg) for idx in chunks]
    snaps = _Snapshots(keep, _largest_batch(plan, per_chunk))
    shuffle = np.random.default_rng([shuffle_seed, 2]) if shuffle_seed is not None else None
    kept_chunks: dict[int, int] = {}
    # several workers (scoring/score/remote.py WorkerPool: one per device) score the batches in turn
    pool: list[Any] = list(getattr(model, "workers", ()) or ())
    pooled: Any = model if len(pool) > 1 else None
    loss_devices = pooled.loss_devices(device) if pooled is not None else []
    wss = [LossWorkspace() for _ in pool]  # one per device: a buffer is never moved between GPUs
    b = 0
    scored_upto = 0  # every target at a position <= scored_upto has been scored
    with tqdm(total=plan.num_windows, desc="score", unit="win", disable=None, leave=False) as bar:
        for c, idx in enumerate(chunks):
            if adapter is not None:
                adapter.before_chunk(model, c)
            with grad_off():
                batches = per_chunk[c]
                if len(pool) > 1:  # one batch per worker at a time, answers taken and scored in batch order
                    for g in range(0, len(batches), len(pool)):
                        group = [
                            _prepare_batch(toks, plan, w, shuffle, cfg) for w in batches[g : g + len(pool)]
                        ]
                        outs = pooled.scored_group(
                            [bt.x_BL for bt in group], [bt.ask_B2 for bt in group], device
                        )
                        for slot, (out, bt) in enumerate(zip(outs, group, strict=True)):
                            out_NV = bt.scored(check_scored(out, bt.ask_B2, table.vocab_size))
                            dev_k = loss_devices[slot]  # on CUDA the worker's own GPU: the same kernels, bits
                            _finish_batch(
                                bt, out_NV, table, dev_k, output, sums, on_scored, wss[slot], keep, b, snaps
                            )
                            if b in keep:
                                kept_chunks[b] = c
                                held = tuple((q.x_BL, q.valid_BL, q.ask_B2) for q in group)
                                keep[b] = keep[b]._replace(group=held, slot=slot)  # type: ignore[union-attr]
                            b += 1
                            bar.update(int(bt.x_BL.shape[0]))
                    batches = []
                for w in batches:
                    _score_batch(
                        model,
                        toks,
                        plan,
                        w,
                        table,
                        cfg,
                        device,
                        output,
                        sums,
                        on_scored,
                        ws,
                        keep,
                        b,
                        snaps,
                        shuffle,
                    )
                    if b in keep:
                        kept_chunks[b] = c
                    b += 1
                    bar.update(int(w.size))
            first = int(plan.starts[idx[0]] + plan.score_from[idx[0]] + 1)
            last = int(plan.starts[idx[-1]] + plan.lengths[idx[-1]])
            assert first > scored_upto, "chunks must follow each other in target order"
            if adapter is not None:
                # Positions scored_upto+1 .. last: this chunk's targets.
                adapter.after_chunk(model, c, toks[scored_upto + 1 : last + 1].copy(), scored_upto + 1)
            scored_upto = last
    if device.type == "cuda":
        torch.cuda.synchronize()
    adapt_s = adapter.adapt_time_s if adapter is not None else 0.0
    kept = {k: v._replace(logits_NV=v.logits_NV.cpu()) for k, v in keep.items() if v is not None}
    return EvalResult(
        sums, plan.num_windows, time.perf_counter() - t0, adapt_s, len(chunks), b, kept, kept_chunks
    )


def batch_count(tokens: np.ndarray, cfg: EvalConfig, bos_id: int = BOS_ID, adapting: bool = False) -> int:
    """How many forward passes evaluate() will make (the probes choose among them in advance)."""
    toks = eval_tokens(tokens, cfg)
    plan = plan_windows(toks, cfg, bos_id)
    chunks = _chunks(plan, cfg.adapt_chunk_tokens if adapting else None)
    return sum(len(_batches(plan, idx, cfg)) for idx in chunks)


def unigram_bpb(
    counts: np.ndarray, tokens: np.ndarray, table: TargetBytes, seq_len: int, max_tokens: int | None = None
) -> float:
    """bpb of a unigram model (add-1/2 smoothed training counts) on the standard-mode targets: context for a score."""
    toks, _ = standard_targets(tokens, seq_len, max_tokens)
    counts = np.asarray(counts, dtype=np.float64)
    if counts.size < table.vocab_size:
        counts = np.pad(counts, (0, table.vocab_size - counts.size))
    logp = np.log(counts + 0.5) - math.log(float(counts.sum() + 0.5 * counts.size))
    prev, tgt = toks[:-1].astype(np.int64), toks[1:].astype(np.int64)
    nats = float(-logp[tgt].sum())
    nbytes = int(table.target_bytes(np.arange(1, toks.size, dtype=np.int64), prev, tgt).sum())
    return nats / (math.log(2.0) * nbytes)
