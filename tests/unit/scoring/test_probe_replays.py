"""Probe replays bounded by the probes' allowance (scoring/score/probes.py bound_replays, replay_allowance).

With score-first adaptation both fresh workers of a probe replay the main worker's chunks before the probed
batch: unbounded, a probe on a late batch cost about two adaptations, and several cost several. Now the replays
of all probes together get two passes over the adaptation's chunks, counted in chunks (a model's own timing
never chooses which probes run); in the secret order, a probe that would not fit is skipped and recorded. A tiny in-process model, a fake adaptation
whose per-chunk seconds the test sets (no sleeping), and fresh copies of the model as the probe workers.
"""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from data.tokenizer import ByteTokenizer
from scoring.score.evaluate import EvalConfig, LocalModel, batch_count, evaluate
from scoring.score.probes import (
    PROBE_REPLAY_PASSES,
    PROBE_VERSION,
    ProbeConfig,
    ProbePlan,
    plan_probes,
    probe_order,
    replay_allowance,
    replay_seconds,
    run_probes,
)
from scoring.score.scorer import PROBE_SLACK_S, probe_allowance
from tests.unit.scoring.test_probes import TOKENS, Bigram

CPU = torch.device("cpu")
CFG = EvalConfig(seq_len=64, batch_seqs=2, max_tokens=2048, adapt_chunk_tokens=256)  # 8 chunks of 2 batches


class FakeAdaptation:
    """A score-first adapter that changes nothing and reports `seconds[c]` for chunk c (the main worker's
    measured time per chunk, as remote.py's WorkerModel.chunk_replay_s)."""

    def __init__(self, seconds: list[float]):
        self.seconds = seconds
        self.chunk_replay_s: list[float] = []

    def before_chunk(self, model, chunk):
        pass

    def after_chunk(self, model, chunk, scored_tokens, first_position):
        self.chunk_replay_s.append(self.seconds[chunk])

    @property
    def adapt_time_s(self):
        return float(sum(self.chunk_replay_s))


def _probe(plan: ProbePlan, seconds: list[float]) -> tuple[dict, list[int]]:
    """Score with the fake adaptation, then probe; (the record, the chunks each replay was asked for)."""
    model, adapter = Bigram(), FakeAdaptation(seconds)
    pristine = copy.deepcopy(model)
    table = ByteTokenizer().byte_table()
    result = evaluate(model, TOKENS, table, CFG, CPU, adapter=adapter, keep_batches=plan.batches)
    assert result.chunks == len(seconds)
    replayed: list[int] = []
    fresh = (LocalModel(copy.deepcopy(pristine)) for _ in iter(int, 1))
    rec = run_probes(
        plan,
        result.kept,
        fresh,
        TOKENS,
        ProbeConfig(probes=len(plan.batches), seed=plan.seed),
        replay=lambda worker, chunk: replayed.append(chunk),
        kept_chunks=result.kept_chunks,
        total_batches=result.batches,
        chunk_replay_s=adapter.chunk_replay_s,
    )
    return rec, replayed


def test_the_replay_allowance_is_two_adaptations_whatever_the_number_of_probes():
    seconds = [1.0] * 8
    assert replay_allowance(seconds) == PROBE_REPLAY_PASSES * 8.0 == 16.0
    replay_s = replay_allowance(seconds)
    one = probe_allowance(10.0, 100.0, 16, 2, adapt_s=8.0, replay_s=replay_s)
    eight = probe_allowance(10.0, 100.0, 16, 16, adapt_s=8.0, replay_s=replay_s)
    per_forward = (100.0 - 8.0) / 16
    assert one == PROBE_SLACK_S + 2 * (10.0 + 2 * per_forward) + 16.0
    assert eight - one == 14 * (10.0 + 2 * per_forward)  # more probes: more builds, not more replays
    # eight workers scored side by side: one batch took eight times the scoring time per batch (the attacker's
    # finding: a probe's forward was allowed an eighth of what it takes)
    pooled = probe_allowance(10.0, 100.0, 16, 2, adapt_s=8.0, replay_s=replay_s, parallel=8)
    assert pooled - one == 2 * 2 * 7 * per_forward


def test_a_probe_on_the_last_batch_always_fits_and_replays_every_earlier_chunk():
    last = batch_count(TOKENS, CFG, adapting=True) - 1
    rec, replayed = _probe(ProbePlan(seed=7, batches=(last,)), [3.0] * 8)
    assert rec["version"] == PROBE_VERSION == 9
    assert [p["batch"] for p in rec["probes"]] == [last] and replayed == [7, 7]  # both workers, chunks 0..6
    bound = rec["replay_bound"]
    assert bound["bounded"] and not bound["reduced"] and bound["skipped"] == []
    assert bound["estimate_s"] == 2 * 7 * 3.0 <= bound["allowance_s"] == 2 * 8 * 3.0
    assert (bound["replayed_chunks"], bound["allowance_chunks"]) == (14, 16)


def test_probes_past_the_allowance_are_skipped_in_the_secret_order_and_recorded():
    seconds = [1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 9.0]  # two passes: 16 chunk replays
    n = batch_count(TOKENS, CFG, adapting=True)
    batches = (n - 2, n - 1, 13, 12, 1)  # chunk 7, 7, 6, 6, 0: 14, 14, 12, 12 and 0 chunk replays
    seed = 11
    order = [batches[i] for i in np.random.default_rng([seed, 1]).permutation(len(batches))]
    assert order == probe_order(ProbePlan(seed=seed, batches=batches))
    rec, replayed = _probe(ProbePlan(seed=seed, batches=batches), seconds)
    bound = rec["replay_bound"]
    ran = [p["batch"] for p in rec["probes"]]
    assert ran[0] == order[0]  # the first of the secret order always runs
    assert ran == [b for b in order if b not in {s["batch"] for s in bound["skipped"]}]
    late = [b for b in order if b != 1]
    assert ran == sorted([late[0], 1], key=order.index)  # no two late ones fit, the first chunk's always does
    assert bound["reduced"] and len(bound["skipped"]) == 3
    assert bound["estimate_s"] == (2 * 6.0 if late[0] in (12, 13) else 2 * 7.0)
    assert all(s["replay_estimate_s"] in (12.0, 14.0) for s in bound["skipped"])
    assert rec["coverage"] == {"batches_probed": 2, "batches_total": n, "batches_skipped": 3}
    assert replayed == [c for b in ran if b // 2 for c in [b // 2] * 2]  # chunk 0's replays nothing


def test_a_model_that_spends_its_adaptation_time_first_cannot_choose_the_probes_that_run():
    """Counted in seconds, a first chunk of 50 s made every later probe cost two whole passes: only the first
    probe of the order ran, and a model that peeks on a fraction f of its batches was caught with probability
    f, not about 2f. Counted in chunks both run, and the probe workers get the time their replays take."""
    seconds = [50.0] + [0.1] * 7
    plan = ProbePlan(seed=3, batches=(2, 5))  # chunks 1 and 2: 2 and 4 chunk replays of 16
    rec, replayed = _probe(plan, seconds)
    bound = rec["replay_bound"]
    assert [p["batch"] for p in rec["probes"]] == probe_order(plan) and not bound["reduced"]
    assert sorted(replayed) == [1, 1, 2, 2]
    estimate = 2 * 50.0 + 2 * (50.0 + 0.1)
    assert bound["estimate_s"] == pytest.approx(estimate) and bound["allowance_s"] == bound["estimate_s"]
    assert bound["allowance_s"] > replay_allowance(seconds)  # more than two passes of seconds: what they take
    kept_chunks = {2: 1, 5: 2}
    assert replay_seconds(plan, kept_chunks, seconds) == bound["allowance_s"]
    assert replay_seconds(ProbePlan(seed=3, batches=(0,)), {0: 0}, seconds) == replay_allowance(seconds)


def test_replays_that_fit_are_all_run_and_the_batches_stay_drawn_from_the_whole_range():
    rec, _ = _probe(ProbePlan(seed=5, batches=(0, 3, 6)), [0.1] * 7 + [5.0])  # 0 + 2 + 6 of 16 chunk replays
    assert not rec["replay_bound"]["reduced"] and len(rec["probes"]) == 3
    # over many secret seeds, every batch (the last included) is the first probe of some run: none is out of reach
    n = batch_count(TOKENS, CFG, adapting=True)
    firsts = set()
    for seed in range(400):
        p = plan_probes(n, ProbeConfig(probes=2, seed=seed))
        firsts.add(p.batches[int(np.random.default_rng([seed, 1]).permutation(2)[0])])
    assert firsts == set(range(n))


@pytest.mark.parametrize("chunk_replay_s", [None])
def test_without_a_time_per_chunk_the_replays_are_recorded_as_not_bounded(chunk_replay_s):
    model = Bigram()
    plan = ProbePlan(seed=3, batches=(4,))
    result = evaluate(
        model,
        TOKENS,
        ByteTokenizer().byte_table(),
        CFG,
        CPU,
        adapter=FakeAdaptation([0.0] * 8),
        keep_batches=plan.batches,
    )
    fresh = (LocalModel(copy.deepcopy(model)) for _ in iter(int, 1))
    rec = run_probes(plan, result.kept, fresh, TOKENS, ProbeConfig(probes=1, seed=3), replay=lambda w, c: None,
                     kept_chunks=result.kept_chunks, chunk_replay_s=chunk_replay_s)  # fmt: skip
    assert rec["replay_bound"] == {"bounded": False, "why": "no time per chunk was measured"}
