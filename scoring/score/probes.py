"""Legality probes that look like scoring: a peeking model cannot tell a probe from a scored batch.

    plan_probes(num_batches, cfg) -> ProbePlan       which scored batches get probed (a secret seed)
    run_probes(plan, kept, fresh, tokens, cfg)       -> record (raises ProbeFailure)

Causality, the way the scorer checks it:
- The batches probed are real scoring batches of the real shape, chosen in advance among all the
  forward passes of the evaluation with a seed drawn per run from the operating system (recorded
  only after the run). The scorer keeps its own copy of the logits it scored for them (`kept`).
- For each, a cut (row r, position t) is drawn among the batch's scored positions, and a variant of
  the batch replaces everything after it in stream order (the rest of row r and every later row)
  with real validation tokens from elsewhere, and every padded position too (the future of every row:
  a model that read where its row ends passed when the padding stayed): the variant is as ordinary as
  any other batch.
- The variant goes to a fresh model worker, a new process from the same artifact that has seen no
  data (`fresh`): its first forward pass, like the main worker's first. Its logits at every
  scored position up to the cut (every earlier row's, row r's up to t) must equal those the main worker
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

Replays are bounded (score-first adaptation): both fresh workers of a probe replay the main worker's
chunks before the batch's, so a probe on a late batch costs about two adaptations. Which probes run is
counted in chunks, never in seconds: the replays of all probes together get PROBE_REPLAY_PASSES passes over
the adaptation's chunks (`bound_replays`), whatever the number of probes. The batches are still drawn before
the evaluation from the whole range with the secret seed; after it, in the secret order of the probes, a
probe whose replays would pass what is left of the chunks is skipped (never replaced: the main worker is
gone, and nothing was kept for another batch), and the record says so (`replay_bound`). The first probe of
the order, drawn from the whole range, always fits (its replays are at most two passes): late batches are
probed as often as any when one probe is asked for, and at least as one of them when several are. Counted
in seconds (the main worker's, per chunk), a model that spent its adaptation time in the first chunk made
every later probe cost two whole passes: only the first probe of the order ran, and a model peeking on a
fraction f of its batches was caught with probability f instead of about 1 - (1 - f)^2. The time the probe
workers get for the replays (`replay_seconds`) is then the seconds the chosen probes' replays are estimated
at by the main worker's clock, and never less than two passes of its adaptation, as before.

Only the scored positions' logits cross from a worker (every batch asks for them the same way, a
probe's with the ranges of the batch it varies), so the comparisons run on those: a position that is
not scored has no logits that count. The comparison runs on plain tensors the scorer copied out of the
shared buffers itself. A
ProbeFailure names the batch, the cut and the first position whose logits differ, with the size.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from scoring.score.evaluate import (
    KeptBatch,
    RuleViolation,
    Scorable,
    check_scored,
    model_scored_logits,
    select_asked,
)
from scoring.score.pool import WorkerPool
from scoring.score.remote import EvalDeadline, WorkerFailure
from scoring.worker.wire import BadAnswer, scored_positions

PROBE_VERSION = 9
"""9: equal logits are equal, infinite ones too (-inf - -inf is nan: an honest model failed); an answer the
scorer refuses (its shape, its width) fails the probe; 8: the replays bounded in chunks, never seconds (`replay_bound.counted_in`); 7: a variant fills every padded position with real tokens too; 6: replays bounded (`replay_bound`, probes skipped past it); 5: logits compared at the scored positions
only (the only ones that cross), the cut drawn among them."""
PROBE_WORKERS_PER_PROBE = 2
"""Fresh workers a probe takes: one for the causality variant (then the unchanged batch), one for the
row-isolation variant; neither has seen the batch before its variant."""
PROBE_REPLAY_PASSES = PROBE_WORKERS_PER_PROBE
"""The replays of all probes together take at most this many passes of the main worker's whole adaptation:
one probe on the last batch (each of its workers replays every chunk before it) always fits."""


def replay_allowance(chunk_replay_s: Sequence[float]) -> float:
    """PROBE_REPLAY_PASSES x the main worker's adaptation time (`chunk_replay_s`: its seconds per chunk,
    chunk_begin and adapt, by the scorer's clock): the least time the probes' replays get (`replay_seconds`)."""
    return PROBE_REPLAY_PASSES * float(sum(chunk_replay_s))


def replay_cost_s(chunk: int, chunk_replay_s: Sequence[float]) -> float:
    """The estimated replays of a probe on a batch of `chunk`: each fresh worker replays chunks 0 .. chunk-1."""
    return PROBE_WORKERS_PER_PROBE * float(sum(chunk_replay_s[:chunk]))


@dataclass(frozen=True, slots=True)
class ReplayBound:
    """Which probes of the secret order run, counted in chunk replays (module docstring)."""

    run: list[int]
    skipped: list[dict[str, Any]]
    chunks: int
    """The adaptation's chunks: the probes' replays together replay at most PROBE_REPLAY_PASSES x this many."""
    replayed_chunks: int
    estimate_s: float
    """The run probes' replays by the main worker's seconds per chunk."""
    allowance_s: float
    """The seconds the probe workers get for the replays: the estimate, never less than replay_allowance."""

    def record(self) -> dict[str, Any]:
        return {
            "bounded": True,
            "counted_in": "chunk replays (never seconds: a model's own timing cannot choose the probes that run)",
            "passes": PROBE_REPLAY_PASSES,
            "allowance_chunks": PROBE_REPLAY_PASSES * self.chunks,
            "replayed_chunks": self.replayed_chunks,
            "allowance_s": self.allowance_s,
            "measured_by": "the main worker's time per adaptation chunk (chunk_begin + adapt), scorer's clock",
            "estimate_s": self.estimate_s,
            "skipped": self.skipped,
            "reduced": bool(self.skipped),
        }


def bound_replays(
    order: Sequence[int], kept_chunks: dict[int, int], chunk_replay_s: Sequence[float]
) -> ReplayBound:
    """In `order`, each probe runs if its replays (PROBE_WORKERS_PER_PROBE x the chunks before its batch's) fit in
    what is left of PROBE_REPLAY_PASSES passes over the chunks; one that does not is skipped and the next ones are
    still tried. The seconds per chunk only price what was chosen."""
    chunks = len(chunk_replay_s)
    left = PROBE_REPLAY_PASSES * chunks
    run: list[int] = []
    skipped: list[dict[str, Any]] = []
    estimate_s = 0.0
    for b in order:
        chunk = kept_chunks.get(b, 0)
        cost, cost_s = PROBE_WORKERS_PER_PROBE * chunk, replay_cost_s(chunk, chunk_replay_s)
        if cost <= left:
            run.append(b)
            left -= cost
            estimate_s += cost_s
        else:
            skipped.append({"batch": b, "adaptation_chunks": chunk, "replay_estimate_s": cost_s})
    return ReplayBound(
        run=run,
        skipped=skipped,
        chunks=chunks,
        replayed_chunks=PROBE_REPLAY_PASSES * chunks - left,
        estimate_s=estimate_s,
        allowance_s=max(estimate_s, replay_allowance(chunk_replay_s)),
    )


def probe_order(plan: ProbePlan) -> list[int]:
    """The planned batches in the probes' secret order (run_probes draws it first from the same generator)."""
    return _ordered(plan, np.random.default_rng([plan.seed, 1]))


def _ordered(plan: ProbePlan, rng: np.random.Generator) -> list[int]:
    return [plan.batches[i] for i in rng.permutation(len(plan.batches))]


def replay_seconds(plan: ProbePlan, kept_chunks: dict[int, int], chunk_replay_s: Sequence[float]) -> float:
    """The seconds the probe workers get for the replays of the probes that will run (ReplayBound.allowance_s):
    the scorer sets their deadline from it before any probe worker runs."""
    if not plan.batches or not chunk_replay_s:
        return replay_allowance(chunk_replay_s)
    return bound_replays(probe_order(plan), kept_chunks, chunk_replay_s).allowance_s


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
    x_BL: np.ndarray,
    valid_BL: np.ndarray,
    tokens: np.ndarray,
    rng: np.random.Generator,
    scored_BL: np.ndarray | None = None,
) -> tuple[np.ndarray, int, int, int]:
    """(variant, r, t, cut): every real position after (r, t) in stream order replaced by real tokens from elsewhere.

    `cut` is the flat index of (r, t) among the batch's real positions (row-major order); (r, t) is a scored
    position (`scored_BL`, default every real one): only those cross, so only those are compared.
    """
    flat = np.flatnonzero(valid_BL.reshape(-1))  # real positions, stream order
    if flat.size < 2:
        raise ValueError("a probe batch needs at least two real positions")
    # Anywhere but the batch's last real position: a cut inside a row changes the row's own future, a cut at
    # a row's end changes every later row (the scorer sends rows in a secret order, so a row's text does not
    # continue in the next row; a model that looks across rows is caught either way).
    where = np.arange(flat.size - 1)  # indices into flat
    if scored_BL is not None:
        where = where[scored_BL.reshape(-1)[flat[:-1]]]
        if where.size == 0:
            raise ValueError("a probe batch needs a scored position before its last real one")
    cut = int(where[int(rng.integers(0, where.size))])
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
    _fill_padding(x2, valid_BL, tokens, rng)
    r, t = divmod(int(flat[cut]), x_BL.shape[1])
    return x2.reshape(x_BL.shape), r, t, cut


def _fill_padding(
    x_flat: np.ndarray, valid_BL: np.ndarray, tokens: np.ndarray, rng: np.random.Generator
) -> None:
    """Every padded position (after a row's end: the future of every row) made real tokens from elsewhere, in
    place. A causal model never sees the padding; one that reads it (where its row, its document, ends) would
    otherwise find it the same in every variant and pass."""
    pad = np.flatnonzero(~valid_BL.reshape(-1))
    if pad.size:
        s = int(rng.integers(0, max(1, tokens.size - pad.size)))
        fill = np.asarray(tokens[s : s + pad.size], dtype=np.int64)
        x_flat[pad[: fill.size]] = fill


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
    others = valid_BL.copy()
    if 0 <= r < x_BL.shape[0]:
        others[r] = True  # row r exactly as scored, its padding included; every other row's padding filled
    flat = x2.reshape(-1)
    _fill_padding(flat, others, tokens, rng)
    return flat.reshape(x_BL.shape)


def _abs_diff(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """|a - b|, 0 where the two are the same value: equal infinities (-inf - -inf is nan, and an honest model that
    gives a token no chance at all, a logit of -inf, failed every probe) or both nan."""
    same = (a == b) | (torch.isnan(a) & torch.isnan(b))
    return torch.where(same, torch.zeros_like(a), (a - b).abs())


def _compare_row(
    base_NV: torch.Tensor, other_NV: torch.Tensor, pos_N: np.ndarray, L: int, r: int, atol: float, what: str
) -> float:
    """Row r's logits (at its scored positions; `pos_N`: their flat indices) must not depend on the other rows."""
    if tuple(other_NV.shape) != tuple(base_NV.shape):
        raise ProbeFailure(
            f"row-independence probe failed ({what}): logits of shape {tuple(other_NV.shape)}, not "
            f"{tuple(base_NV.shape)}; a model must answer a probe as it answers scoring"
        )
    rows = np.flatnonzero(pos_N // L == r)
    idx = torch.from_numpy(rows)
    d = _abs_diff(base_NV[idx], other_NV[idx]).amax(-1)
    bad = torch.isnan(d) | (d > atol)
    if bool(bad.any()):
        t = int(pos_N[rows[int(torch.nonzero(bad)[0])]] % L)
        raise ProbeFailure(
            f"row-independence probe failed ({what}): changing the other rows of the batch changed the logits at "
            f"row {r} position {t} (max |Δlogit| = {float(d[bad].max()):.3g} > {atol:g}); rows of a batch must not see each other"
        )
    return float(d.max()) if d.numel() else 0.0


def _compare(
    base_NV: torch.Tensor,
    other_NV: torch.Tensor,
    pos_N: np.ndarray,
    L: int,
    upto: int,
    atol: float,
    what: str,
    kind: str = "variant",
) -> tuple[float, int]:
    """Max |Δlogit| over the scored positions (`pos_N`: flat indices, row by row) at or before the flat index
    `upto` (stream order); ProbeFailure beyond `atol`."""
    if tuple(other_NV.shape) != tuple(base_NV.shape):
        raise ProbeFailure(
            f"causality probe failed ({what}): logits of shape {tuple(other_NV.shape)}, not {tuple(base_NV.shape)}"
        )
    rows = np.flatnonzero(pos_N <= upto)
    idx = torch.from_numpy(rows)
    d = _abs_diff(base_NV[idx], other_NV[idx]).amax(-1)  # (P,)
    bad = torch.isnan(d) | (d > atol)
    if bool(bad.any()):
        i = int(torch.nonzero(bad)[0])
        r, t = divmod(int(pos_N[rows[i]]), L)
        cr, ct = divmod(upto, L)
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
    return float(d.max()) if d.numel() else 0.0, int(rows.size)


def logits_of(worker: Scorable, x: np.ndarray, ranges_B2: np.ndarray, vocab_size: int) -> torch.Tensor:
    """A fresh worker's logits at the scored positions, asked for as the scored batch's were (same ranges)."""
    return _own_copy(model_scored_logits(worker, torch.from_numpy(x), ranges_B2, vocab_size, "float32"))


def _own_copy(logits: torch.Tensor) -> torch.Tensor:
    """Float32 logits on the CPU in memory of their own (never a view of a worker's shared buffer)."""
    return logits.detach().float().cpu().clone()


Replay = Callable[[Scorable, int], None]
"""replay(worker, c): hand a fresh worker the score-first adaptation of chunks 0 .. c-1, as the main one had it."""


@torch.inference_mode()
def run_probes(
    plan: ProbePlan,
    kept: dict[int, KeptBatch],
    fresh: Iterator[Scorable],
    tokens: np.ndarray,
    cfg: ProbeConfig,
    *,
    replay: Replay | None = None,
    kept_chunks: dict[int, int] | None = None,
    total_batches: int = 0,
    chunk_replay_s: Sequence[float] | None = None,
) -> dict[str, Any]:
    """Probe each planned batch (see the module docstring); `fresh` yields PROBE_WORKERS_PER_PROBE fresh
    models per probe.

    First fresh worker (after `replay` of the adaptation chunks before the batch's, when the entry
    adapts): the causality variant must agree with the main worker's scored logits up to the cut; then
    the unchanged batch must give them everywhere, bit for bit (a model that behaves one way when scored
    and another when probed fails here). Second fresh worker: the row-isolation variant on its kept row.

    With `replay` and `chunk_replay_s` (the main worker's seconds per adaptation chunk), the replays are bounded
    (module docstring: `bound_replays`); the record's `replay_bound` says what was
    skipped. Without `chunk_replay_s` they are not bounded (recorded so).
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
    order = _ordered(plan, rng)  # the order of the probes comes from the secret seed
    bound: dict[str, Any] | None = None
    if replay is not None:
        bound = {"bounded": False, "why": "no time per chunk was measured"}
        if chunk_replay_s is not None:
            chosen = bound_replays(order, kept_chunks or {}, chunk_replay_s)
            order, bound = chosen.run, chosen.record()
    for i, b in enumerate(order):
        if b not in kept:
            raise RuntimeError(f"probe batch {b} was not kept by the evaluation")
        try:
            results.append(_probe_batch(b, kept[b], fresh, tokens, cfg, rng, replay, kept_chunks))
        except (WorkerFailure, EvalDeadline, BadAnswer) as e:
            # A probe worker runs the scored model on a batch of the real shape: one that fails, dies, does not
            # answer or answers what the scorer refuses behaves otherwise than the model that was scored. Never a
            # resource verdict nor the scorer's failure (a peeking model could pick out_of_memory, or "a harness
            # failure", over illegal by making its probe workers fail so).
            kind = (
                e.kind
                if isinstance(e, WorkerFailure)
                else "an answer the scorer refuses"
                if isinstance(e, BadAnswer)
                else "no answer before its deadline"
            )
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
        "coverage": {
            "batches_probed": len(results),
            "batches_total": total_batches,
            "batches_skipped": len(bound["skipped"]) if bound and bound["bounded"] else 0,
        },
        "replay_bound": bound,
        "probe_time_s": time.perf_counter() - t0,
    }


def _probe_batch(
    b: int,
    kept_b: KeptBatch,
    fresh: Iterator[Scorable],
    tokens: np.ndarray,
    cfg: ProbeConfig,
    rng: np.random.Generator,
    replay: Replay | None,
    kept_chunks: dict[int, int] | None,
) -> dict[str, Any]:
    """One probe of batch `b` in PROBE_WORKERS_PER_PROBE fresh workers (see run_probes); its record."""
    x_BL, valid_BL, ranges_B2, scored_NV = kept_b.x_BL, kept_b.valid_BL, kept_b.ranges_B2, kept_b.logits_NV
    L = x_BL.shape[1]
    pos_N = scored_positions(ranges_B2, L)
    scored_BL = np.zeros(x_BL.size, dtype=bool)
    scored_BL[pos_N] = True
    x2_BL, r, t, cut = make_variant(x_BL, valid_BL, tokens, rng, scored_BL.reshape(x_BL.shape))
    iso_BL = isolate_row(x_BL, valid_BL, r, tokens, rng)
    # the batches the other workers of a pool held at the same time, their real positions replaced: a worker
    # of a group (its workers may talk, scoring/worker/group.py) must not use what the others hold
    elsewhere = [isolate_row(x, valid, -1, tokens, rng) for x, valid, _ in kept_b.group]
    V = int(scored_NV.shape[1])
    chunk = (kept_chunks or {}).get(b, 0)
    ask_B2 = kept_b.ask_B2 if kept_b.ask_B2 is not None else ranges_B2

    def ask(unit: Scorable, x: np.ndarray, peers: list[np.ndarray] | None) -> torch.Tensor:
        """The unit's logits for `x` at the batch's scored positions, asked for as the batch was (`ask_B2`); a pool
        gets every batch of the group at once (`peers`: the others' inputs, None: as they were), so a probe looks
        like the scoring it repeats."""
        if not isinstance(unit, WorkerPool) or not kept_b.group:
            return select_asked(logits_of(unit, x, ask_B2, V), ask_B2, ranges_B2, L)
        xs = [g[0] for g in kept_b.group] if peers is None else list(peers)
        xs[kept_b.slot] = x
        outs = unit.scored_group(xs, [g[2] for g in kept_b.group])
        return select_asked(_own_copy(check_scored(outs[kept_b.slot], ask_B2, V)), ask_B2, ranges_B2, L)

    # one worker at a time, in this order: the causal one (variant, then the unchanged batch) is done
    # and closed before the row-isolation one, which holds row r whole, runs any submitted code (`fresh`
    # closes the previous worker and empties the page cache before it starts the next): a worker that
    # ran first could otherwise leave the original's future for the variant's (an attacker's live
    # channel between the two workers of a pair, passed half of the time when the order was drawn)
    causal = next(fresh)
    replay_s = 0.0
    if replay is not None and chunk:
        t0 = time.perf_counter()
        replay(causal, chunk)
        replay_s += time.perf_counter() - t0
    upto = r * L + t
    diff, compared = _compare(
        scored_NV, ask(causal, x2_BL, elsewhere), pos_N, L, upto, cfg.atol, f"batch {b}"
    )
    same, _ = _compare(
        scored_NV,
        ask(causal, x_BL, None),
        pos_N,
        L,
        x_BL.size,
        cfg.atol,
        f"batch {b}, scored vs fresh",
        "fresh",
    )
    isolated = next(fresh)
    if replay is not None and chunk:
        t0 = time.perf_counter()
        replay(isolated, chunk)
        replay_s += time.perf_counter() - t0
    iso_logits = ask(isolated, iso_BL, elsewhere)
    row_diff = _compare_row(scored_NV, iso_logits, pos_N, L, r, cfg.atol, f"batch {b}")
    return {
        "batch": b,
        "row": r,
        "position": t,
        "adaptation_chunks_replayed": chunk if replay is not None else 0,
        "replay_time_s": replay_s,
        "positions_compared": compared,
        "max_abs_diff": max(same, diff, row_diff),
    }
