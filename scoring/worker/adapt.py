"""Score-first test-time adaptation: the only way a submission's `eval.py` hook ever sees validation tokens.

A submission may ship `eval.py` defining

    def adapt(model: torch.nn.Module, tokens: torch.Tensor) -> None

The scorer (scoring/score/evaluate.py) feeds the validation windows in order, in chunks of about
`EvalConfig.adapt_chunk_tokens` targets. For each chunk:

1. `before_chunk`: the model's parameters and buffers are snapshotted;
2. every window of the chunk is scored (no_grad, model.eval());
3. `after_chunk`: the snapshot is compared bit for bit (a model that changes its weights while it
   is being scored, for example by training inside forward, fails with AdaptationViolation); then
   the hook is called with a fresh int64 tensor that owns its storage and holds exactly the
   positions scored so far and not yet handed over (never a view into the validation array, so
   there is nothing beyond it to read). Its time counts on the eval clock.

The adapter runs in the model worker (scoring/worker/process.py), never in the scorer: the worker
gets each chunk's tokens from the scorer only after the scorer has recorded the chunk's scores, so
the protocol holds whatever the hook does. The weight check above is the worker's own early,
friendly error for a model that trains inside forward; the probes are what catch a model whose
scored logits depend on what it should not see.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from data.io import sha256_file
from harness.api import EVAL_HOOK_FILE, EVAL_HOOK_NAME, AdaptFn
from scoring.codecheck import require_clean_code
from scoring.worker.loading import import_file

HOOK_NAME = EVAL_HOOK_NAME


class AdaptationViolation(ValueError):
    """The score-first protocol was broken: weights moved while a chunk was being scored."""


# ---- The adapter ----


def load_hook(submission_dir: str | Path) -> tuple[AdaptFn, str] | None:
    """The folder's `eval.py` adapt function and the file's sha256, or None when there is no eval.py.

    Raises CodeCheckFailure when the folder's scored code fails the static check
    (scoring/codecheck.py), ValueError when eval.py defines no callable `adapt`.
    """
    folder = Path(submission_dir)
    path = folder / EVAL_HOOK_FILE
    if not path.is_file():
        return None
    require_clean_code(folder)
    module = import_file(path, "pgolf_submission_eval")
    fn = getattr(module, HOOK_NAME, None)
    if not callable(fn):
        raise ValueError(f"{path} must define {HOOK_NAME}(model, tokens) -> None")
    return fn, sha256_file(path)


def _state_tensors(model: nn.Module) -> list[tuple[str, torch.Tensor]]:
    return [*model.named_parameters(), *model.named_buffers()]


@dataclass
class ScoreFirstAdapter:
    """Calls `hook` with each chunk's tokens after the chunk is scored; checks nothing moved meanwhile."""

    hook: AdaptFn
    hook_sha256: str = ""
    autocast_bf16: bool = False
    """Run the hook under bfloat16 autocast, as the scoring forward runs (eval dtype bfloat16)."""
    delivered: list[tuple[int, int]] = field(default_factory=list)
    """(first position, one past the last) of every span handed to the hook, in order."""
    _adapt_s: float = 0.0
    _snapshot: list[torch.Tensor] = field(default_factory=list)

    @property
    def adapt_time_s(self) -> float:
        return self._adapt_s

    def before_chunk(self, model: nn.Module, chunk: int) -> None:
        model.eval()
        self._snapshot = [t.detach().clone() for _, t in _state_tensors(model)]

    def after_chunk(
        self, model: nn.Module, chunk: int, scored_tokens: np.ndarray, first_position: int
    ) -> None:
        tensors = _state_tensors(model)
        if len(tensors) != len(self._snapshot):
            raise AdaptationViolation(
                f"the model added or removed tensors while chunk {chunk} was being scored"
            )
        for (name, t), old in zip(tensors, self._snapshot, strict=False):
            if t.shape != old.shape or not torch.equal(t.detach(), old):
                raise AdaptationViolation(
                    f"score-first violation: {name} changed while chunk {chunk} was being scored; "
                    "a model may adapt only in eval.py's adapt(), after a chunk is scored"
                )
        self._snapshot = []
        device = tensors[0][1].device if tensors else torch.device("cpu")
        chunk_t = torch.tensor(np.asarray(scored_tokens, dtype=np.int64), dtype=torch.int64, device=device)
        self.delivered.append((first_position, first_position + int(chunk_t.numel())))
        t0 = time.perf_counter()
        with (
            torch.enable_grad(),
            torch.autocast(device.type, dtype=torch.bfloat16, enabled=self.autocast_bf16),
        ):
            self.hook(model, chunk_t)
        if device.type == "cuda":
            torch.cuda.synchronize()
        self._adapt_s += time.perf_counter() - t0
        model.eval()

    def record(self, chunk_tokens: int) -> dict[str, Any]:
        return {
            "hook": EVAL_HOOK_FILE,
            "hook_sha256": self.hook_sha256,
            "protocol": "score-first",
            "chunk_tokens": chunk_tokens,
            "chunks": len(self.delivered),
            "tokens_delivered": sum(b - a for a, b in self.delivered),
            "adapt_time_s": self._adapt_s,
        }
