"""Legality probes that look like scoring: a peeking model cannot tell a probe from a scored batch.

    plan_probes(num_batches, cfg) -> ProbePlan       which scored batches get probed (a secret seed)
    run_probes(plan, kept, fresh, tokens, cfg)       -> record (raises ProbeFailure)

Causality, the way the scorer checks it:
- The batches probed are real scoring batches of the real shape, chosen in advance among all the
  forward passes of the evaluation with a seed drawn per run from the operating system (recorded
  only after the run). The scorer keeps its own copy of the logits it scored for them (`kept`).
- For each, a cut (row r, position t) is drawn among the batch's real positions, and a variant of
  the batch replaces everything after it in stream order (the rest of row r and every later row)
  with real validation tokens from elsewhere: the variant is as ordinary as any other batch.
- The variant goes to a fresh model worker, a new process from the same artifact that has seen no
  data (`fresh`): its first forward pass, like the main worker's first. Its logits at every
  position up to the cut (every earlier row whole, row r up to t) must equal those the main worker
  returned when the batch was scored, bit for bit in float32 (`atol`, default 0). A model that
  peeks at a later token, mixes rows, or behaves differently in the run that is scored than in a
  fresh process, fails. Only then does that worker get the unchanged batch, whose logits must equal
  the scored ones everywhere (with score-first adaptation, after replaying the main worker's chunks).
- A second fresh worker, which has seen neither, gets the row-isolation variant: row r whole, every
  other row replaced with real tokens from elsewhere; row r's logits must not move (rows of a batch
  never see each other; the scorer also sends rows in a secret order).
- No worker ever sees a batch before a variant of it (PROBE_WORKERS_PER_PROBE fresh workers a probe):
  a model that remembers what it was given could otherwise answer a variant with the original's
  future, peek on every batch and pass every probe (found by an attacker: val_bpb 0.13, verified).
- Coverage is sampled: a model that peeks on a fraction f of batches (chosen by the batch's content)
  is caught with probability about 1 - (1 - f)^probes; the record gives the batches probed and the
  total, and `--probes` raises the count (an official verifying a suspicious entry).
- Normalization is not sampled: returned log-probabilities are checked at every position of every
  batch (scoring/score/evaluate.py, check_normalized); logits are normalized by the scorer itself.

The comparison runs on plain tensors the scorer copied out of the shared buffers itself. A
ProbeFailure names the batch, the cut and the first position whose logits differ, with the size.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from scoring.score.evaluate import RuleViolation, Scorable
from scoring.score.remote import EvalDeadline, WorkerFailure

PROBE_VERSION = 4
PROBE_WORKERS_PER_PROBE = 2
"""Fresh workers a probe takes: one for the causality variant (then the unchanged batch), one for the
row-isolation variant; neither has seen the batch before its variant."""


class ProbeFailure(RuleViolation):
    """A legality probe failed; the message names the probe and the position."""


@dataclass(frozen=True, kw_only=True, slots=True)
class ProbeConfig:
    probes: int = 2
    """Probes, each a real batch and a cut, its variants in PROBE_WORKERS_PER_PROBE fresh workers (0: none,
    recorded as not run)."""
    seed: int | None = None
    """Seed of the batches, cuts and replacement tokens; None: drawn from the OS per run (secret until the end)."""
    atol: float = 0.0
    """Largest allowed |Δlogit| at unchanged positions; 0: bit for bit (same kernels, same shapes, same threads)."""

    def __post_init__(self) -> None:
        if self.probes < 0:
            raise ValueError(f"probes must be >= 0, got {self.probes}")
        if self.atol < 0:
            raise ValueError(f"probe atol must be >= 0, got {self.atol}")


@dataclass(frozen=True)
class ProbePlan:
    seed: int
    batches: tuple[int, ...]
    """Indices (in scoring order) of the batches to keep and probe."""


def plan_probes(num_batches: int, cfg: ProbeConfig) -> ProbePlan:
    seed = cfg.seed if cfg.seed is not None else secrets.randbits(63)
    rng = np.random.default_rng(seed)
    k = cfg.probes if num_batches else 0  # a batch may be probed twice (two cuts) when there are few
    batches = (
        tuple(sorted(int(b) for b in rng.choice(num_batches, size=k, replace=num_batches < k))) if k else ()
    )
    return ProbePlan(seed, batches)


def make_variant(
    x_BL: np.ndarray, valid_BL: np.ndarray, tokens: np.ndarray, rng: np.random.Generator
) -> tuple[np.ndarray, int, int, int]:
    """(variant, r, t, cut): every real position after (r, t) in stream order replaced by real tokens from elsewhere.

    `cut` is the flat index of (r, t) among the batch's real positions (row-major order).
    """
    flat = np.flatnonzero(valid_BL.reshape(-1))  # real positions, stream order
    if flat.size < 2:
        raise ValueError("a probe batch needs at least two real positions")
    # Anywhere but the batch's last real position: a cut inside a row changes the row's own future, a cut at
    # a row's end changes every later row (the scorer sends rows in a secret order, so a row's text does not
    # continue in the next row; a model that looks across rows is caught either way).
    cut = int(rng.integers(0, flat.size - 1))
    after = flat[cut + 1 :]
    x2 = x_BL.copy().reshape(-1)
    m = after.size
    for _ in range(16):  # real text from elsewhere, whose first token differs from the original's
        s = int(rng.integers(0, max(1, tokens.size - m)))
        fill = np.asarray(tokens[s : s + m], dtype=np.int64)
        if fill.size == m and fill[0] != x2[after[0]]:
            break
    else:
        fill = np.roll(np.asarray(x2[after]), 1)
        fill[0] = (fill[0] + 1) % max(int(x_BL.max()) + 1, 2)
    x2[after] = fill
    r, t = divmod(int(flat[cut]), x_BL.shape[1])
    return x2.reshape(x_BL.shape), r, t, cut


def isolate_row(
    x_BL: np.ndarray, valid_BL: np.ndarray, r: int, tokens: np.ndarray, rng: np.random.Generator
) -> np.ndarray:
    """Row r unchanged, every other row's real positions replaced by real tokens from elsewhere."""
    x2 = x_BL.copy()
    for i in range(x_BL.shape[0]):
        if i == r:
            continue
        m = int(valid_BL[i].sum())
        s = int(rng.integers(0, max(1, tokens.size - m)))
        fill = np.asarray(tokens[s : s + m], dtype=np.int64)
        x2[i, : fill.size] = fill
    return x2


def _compare_row(
    base_BLV: torch.Tensor, other_BLV: torch.Tensor, valid_BL: np.ndarray, r: int, atol: float, what: str
) -> float:
    """Row r's logits must not depend on the other rows of its batch."""
    n = int(valid_BL[r].sum())
    a, b = base_BLV[r, :n], other_BLV[r, :n]
    d = torch.where(torch.isnan(a) & torch.isnan(b), torch.zeros_like(a), (a - b).abs()).amax(-1)
    bad = torch.isnan(d) | (d > atol)
    if bool(bad.any()):
        t = int(torch.nonzero(bad)[0])
        raise ProbeFailure(
            f"row-independence probe failed ({what}): changing the other rows of the batch changed the logits at "
            f"row {r} position {t} (max |Δlogit| = {float(d[t]):.3g} > {atol:g}); rows of a batch must not see each other"
        )
    return float(d.max()) if d.numel() else 0.0


def _compare(
    base_BLV: torch.Tensor,
    other_BLV: torch.Tensor,
    valid_BL: np.ndarray,
    cut: int,
    atol: float,
    what: str,
    kind: str = "variant",
) -> tuple[float, int]:
    """Max |Δlogit| over the real positions up to `cut` (stream order); ProbeFailure beyond `atol`."""
    flat = np.flatnonzero(valid_BL.reshape(-1))[: cut + 1]
    B, L, V = base_BLV.shape
    if tuple(other_BLV.shape) != (B, L, V):
        raise ProbeFailure(
            f"causality probe failed ({what}): logits of shape {tuple(other_BLV.shape)}, not {(B, L, V)}"
        )
    idx = torch.from_numpy(flat)
    a, b = base_BLV.reshape(B * L, V)[idx], other_BLV.reshape(B * L, V)[idx]
    same_nan = torch.isnan(a) & torch.isnan(b)
    d = torch.where(same_nan, torch.zeros_like(a), (a - b).abs()).amax(-1)  # (P,)
    bad = torch.isnan(d) | (d > atol)
    if bool(bad.any()):
        i = int(torch.nonzero(bad)[0])
        r, t = divmod(int(flat[i]), L)
        cr, ct = divmod(int(flat[-1]), L)
        if kind == "fresh":
            raise ProbeFailure(
                f"consistency probe failed ({what}): a fresh worker given the same batch returned other logits at "
                f"row {r} position {t} (max |Δlogit| = {float(d[i]):.3g} > {atol:g}); a model must compute the same "
                "logits for the same input whether it is scored or probed"
            )
        raise ProbeFailure(
            f"causality probe failed ({what}): changing the tokens after row {cr} position {ct} changed the logits "
            f"at row {r} position {t} (max |Δlogit| = {float(d[i]):.3g} > {atol:g}); a model may use only the tokens "
            "at or before the position it predicts, in its own row"
        )
    return float(d.max()) if d.numel() else 0.0, int(flat.size)


def logits_of(worker: Scorable, x: np.ndarray) -> torch.Tensor:
    return worker.logits(torch.from_numpy(x)).detach().float().cpu().clone()


Replay = Callable[[Scorable, int], None]
"""replay(worker, c): hand a fresh worker the score-first adaptation of chunks 0 .. c-1, as the main one had it."""


@torch.inference_mode()
def run_probes(
    plan: ProbePlan,
    kept: dict[int, tuple[np.ndarray, np.ndarray, torch.Tensor]],
    fresh: Iterator[Scorable],
    tokens: np.ndarray,
    cfg: ProbeConfig,
    *,
    replay: Replay | None = None,
    kept_chunks: dict[int, int] | None = None,
    total_batches: int = 0,
) -> dict[str, Any]:
    """Probe each planned batch (see the module docstring); `fresh` yields PROBE_WORKERS_PER_PROBE fresh
    models per probe.

    First fresh worker (after `replay` of the adaptation chunks before the batch's, when the entry
    adapts): the causality variant must agree with the main worker's scored logits up to the cut; then
    the unchanged batch must give them everywhere, bit for bit (a model that behaves one way when scored
    and another when probed fails here). Second fresh worker: the row-isolation variant on its kept row.
    """
    t0 = time.perf_counter()
    if not plan.batches:
        return {
            "version": PROBE_VERSION,
            "passed": True,
            "ran": False,
            "reason": "no probes asked (probes = 0)",
        }
    rng = np.random.default_rng([plan.seed, 1])
    results = []
    # the order of the probes comes from the secret seed
    order = [plan.batches[i] for i in rng.permutation(len(plan.batches))]
    for i, b in enumerate(order):
        if b not in kept:
            raise RuntimeError(f"probe batch {b} was not kept by the evaluation")
        try:
            results.append(_probe_batch(b, kept[b], fresh, tokens, cfg, rng, replay, kept_chunks))
        except (WorkerFailure, EvalDeadline) as e:
            # A probe worker runs the scored model on a batch of the real shape: one that fails, dies or does
            # not answer behaves otherwise than the model that was scored. Never a resource verdict (a peeking
            # model could pick out_of_memory over illegal by making its probe workers fail).
            kind = e.kind if isinstance(e, WorkerFailure) else "no answer before its deadline"
            first = next((line for line in str(e).splitlines() if line.strip()), "")
            raise ProbeFailure(
                f"probe {i + 1} of {len(order)} (batch {b}) failed: its fresh worker did not answer as the "
                f"scored model did ({kind}: {first[:300]}); a model must answer a probe as it answers scoring"
            ) from e
    return {
        "version": PROBE_VERSION,
        "passed": True,
        "ran": True,
        "seed": plan.seed,
        "atol": cfg.atol,
        "base": "the main worker's scored logits; each variant goes to a fresh worker that has not seen the batch, "
        "which then reproduces the unchanged batch"
        + (", after replaying the adaptation" if replay is not None else ""),
        "workers_per_probe": PROBE_WORKERS_PER_PROBE,
        "probes": results,
        "coverage": {"batches_probed": len(results), "batches_total": total_batches},
        "probe_time_s": time.perf_counter() - t0,
    }


def _probe_batch(
    b: int,
    kept_b: tuple[np.ndarray, np.ndarray, torch.Tensor],
    fresh: Iterator[Scorable],
    tokens: np.ndarray,
    cfg: ProbeConfig,
    rng: np.random.Generator,
    replay: Replay | None,
    kept_chunks: dict[int, int] | None,
) -> dict[str, Any]:
    """One probe of batch `b` in PROBE_WORKERS_PER_PROBE fresh workers (see run_probes); its record."""
    x_BL, valid_BL, scored_BLV = kept_b
    x2_BL, r, t, cut = make_variant(x_BL, valid_BL, tokens, rng)
    iso_BL = isolate_row(x_BL, valid_BL, r, tokens, rng)
    chunk = (kept_chunks or {}).get(b, 0)
    # one worker at a time, in this order: the causal one (variant, then the unchanged batch) is done
    # and closed before the row-isolation one, which holds row r whole, runs any submitted code (`fresh`
    # closes the previous worker and empties the page cache before it starts the next): a worker that
    # ran first could otherwise leave the original's future for the variant's (an attacker's live
    # channel between the two workers of a pair, passed half of the time when the order was drawn)
    causal = next(fresh)
    if replay is not None and chunk:
        replay(causal, chunk)
    diff, compared = _compare(scored_BLV, logits_of(causal, x2_BL), valid_BL, cut, cfg.atol, f"batch {b}")
    last = int(np.flatnonzero(valid_BL.reshape(-1)).size) - 1
    same, _ = _compare(
        scored_BLV,
        logits_of(causal, x_BL),
        valid_BL,
        last,
        cfg.atol,
        f"batch {b}, scored vs fresh",
        "fresh",
    )
    isolated = next(fresh)
    if replay is not None and chunk:
        replay(isolated, chunk)
    iso_logits = logits_of(isolated, iso_BL)
    row_diff = _compare_row(scored_BLV, iso_logits, valid_BL, r, cfg.atol, f"batch {b}")
    return {
        "batch": b,
        "row": r,
        "position": t,
        "adaptation_chunks_replayed": chunk if replay is not None else 0,
        "positions_compared": compared,
        "max_abs_diff": max(same, diff, row_diff),
    }
