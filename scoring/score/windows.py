"""Window plans: which targets each window scores, and with what context (scoring/score/evaluate.py's
module docstring gives the rules of each mode).

A window plan is a list of windows (start s, length n, first scored offset f) in target order: a window
feeds x = tokens[s : s+n] and scores the targets y = tokens[s+1 : s+n+1] at offsets f..n-1; the plan is
built so that each target of the mode is scored exactly once. Pure numpy: no model, no loss, no torch.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from data.tokenizer import BOS_ID
from scoring.score.eval_config import EvalConfig


class WindowRules(Protocol):
    """What a plan reads of the eval config (scoring/score/evaluate.py EvalConfig)."""

    @property
    def mode(self) -> str: ...
    @property
    def seq_len(self) -> int: ...
    @property
    def max_tokens(self) -> int | None: ...
    @property
    def max_docs(self) -> int | None: ...
    @property
    def resolved_stride(self) -> int | None: ...


@dataclass(frozen=True)
class WindowPlan:
    """Windows in target order: x = tokens[s : s+n], scored targets at window offsets f..n-1."""

    starts: np.ndarray  # int64 (W,)
    lengths: np.ndarray  # int64 (W,)
    score_from: np.ndarray  # int64 (W,)

    @property
    def num_windows(self) -> int:
        return int(self.starts.size)

    @property
    def num_targets(self) -> int:
        return int((self.lengths - self.score_from).sum())

    def target_positions(self) -> np.ndarray:
        """Every scored target's index into the token array, in plan order (for tests and audits)."""
        parts = [
            np.arange(s + 1 + f, s + 1 + n, dtype=np.int64)
            for s, n, f in zip(self.starts, self.lengths, self.score_from, strict=False)
        ]
        return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)


def _empty_plan() -> WindowPlan:
    z = np.zeros(0, dtype=np.int64)
    return WindowPlan(z, z, z)


def segment_plan(begin: int, end: int, seq_len: int, stride: int) -> WindowPlan:
    """Sliding windows over tokens[begin:end]: targets begin+1 .. end-1, each scored once."""
    T = end - begin - 1
    if T <= 0:
        return _empty_plan()
    if T <= seq_len:
        return WindowPlan(np.array([begin], np.int64), np.array([T], np.int64), np.zeros(1, np.int64))
    ends = np.append(
        np.arange(seq_len, T, stride, dtype=np.int64), T
    )  # last target (relative) of each window
    counts = np.diff(ends, prepend=0)
    lengths = np.full(ends.size, seq_len, dtype=np.int64)
    return WindowPlan(begin + ends - seq_len, lengths, seq_len - counts)


def _concat(plans: list[WindowPlan]) -> WindowPlan:
    if not plans:
        return _empty_plan()
    return WindowPlan(
        *(np.concatenate([getattr(p, k) for p in plans]) for k in ("starts", "lengths", "score_from"))
    )


def standard_targets(
    tokens: np.ndarray, seq_len: int, max_tokens: int | None = None
) -> tuple[np.ndarray, int]:
    """Validation tokens cut to the standard windows: (tokens[: usable + 1], number of windows)."""
    if max_tokens is not None:
        tokens = tokens[: max_tokens + 1]
    windows = (tokens.size - 1) // seq_len
    if windows <= 0:
        raise ValueError(
            f"validation split has {tokens.size} tokens: too short for one window of seq_len={seq_len}"
        )
    return tokens[: windows * seq_len + 1], windows


def documents_cut(tokens: np.ndarray, docs: int, bos_id: int = BOS_ID) -> int | None:
    """max_tokens for the first `docs` documents of `tokens` (each starts with BOS), each scored to its end: the
    position of document `docs`'s BOS, whose target is the prediction that document `docs - 1` ends. None when
    the split holds no more than `docs` documents (the whole split). ValueError for a split that does not start
    with BOS: its documents cannot be counted."""
    if tokens.size == 0 or int(tokens[0]) != bos_id:
        raise ValueError("the validation tokens do not start with BOS: their documents cannot be counted")
    starts = np.flatnonzero(tokens == bos_id)
    return int(starts[docs]) if starts.size > docs else None


def resolve_documents(cfg: EvalConfig, tokens: np.ndarray, bos_id: int = BOS_ID) -> EvalConfig:
    """`cfg` with a cut by documents (max_docs) resolved to max_tokens on these tokens; `cfg` itself without one.
    ValueError when a max_tokens given with it is another cut."""
    if cfg.max_docs is None:
        return cfg
    cut = documents_cut(tokens, cfg.max_docs, bos_id)
    if cfg.max_tokens is not None and cfg.max_tokens != cut:
        raise ValueError(
            f"max_tokens = {cfg.max_tokens} with max_docs = {cfg.max_docs}: the first {cfg.max_docs} documents end at "
            f"{cut}; give one of the two"
        )
    return dataclasses.replace(cfg, max_tokens=cut)


def whole_documents(cfg: WindowRules) -> bool:
    """Whether `cfg` cuts its subset by documents (EvalConfig.max_docs), each scored to its end: standard mode
    then scores its last partial window too. Dropping it let an entry's eval.seq_len choose the text scored: a
    seq_len between half the cut and the cut scored exactly its first seq_len tokens, any prefix it liked."""
    return cfg.max_docs is not None


def eval_tokens(tokens: np.ndarray, cfg: WindowRules) -> np.ndarray:
    """The tokens a mode may read: the first max_tokens + 1 (standard mode also drops the tail, but for a cut
    by documents)."""
    if cfg.mode == "standard" and not whole_documents(cfg):
        return standard_targets(tokens, cfg.seq_len, cfg.max_tokens)[0]
    out = tokens if cfg.max_tokens is None else tokens[: cfg.max_tokens + 1]
    if out.size < 2:
        raise ValueError(f"validation split has {out.size} tokens: nothing to score")
    return out


def plan_windows(tokens: np.ndarray, cfg: WindowRules, bos_id: int = BOS_ID) -> WindowPlan:
    """The window plan of `cfg.mode` over `tokens` (already cut by eval_tokens)."""
    L, N = cfg.seq_len, int(tokens.size)
    if cfg.mode == "standard":
        W = (N - 1) // L
        # a cut by documents scores its last partial window too (whole_documents), with the context it holds
        rest = N - 1 - W * L if whole_documents(cfg) else 0
        lengths = np.append(np.full(W, L, np.int64), [rest] if rest else [])
        return WindowPlan(
            np.arange(lengths.size, dtype=np.int64) * L,
            lengths.astype(np.int64),
            np.zeros(lengths.size, np.int64),
        )
    S = cfg.resolved_stride
    assert S is not None
    if cfg.mode == "sliding":
        return segment_plan(0, N, L, S)
    starts = np.flatnonzero(np.asarray(tokens) == bos_id)
    if starts.size == 0 or starts[0] != 0:
        starts = np.concatenate([[0], starts])  # a subset may begin inside a document
    # a document's segment ends at the next BOS inclusive: that BOS is a target (the prediction that the
    # document ends, from its own tokens), never an input, as in every other mode
    ends = np.append(starts[1:] + 1, N)
    return _concat(
        [segment_plan(int(a), int(b), L, S) for a, b in zip(starts, ends, strict=False) if b - a > 1]
    )
