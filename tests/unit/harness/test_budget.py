"""The budget clock (harness/train/clock.py) on one rank: readings, stop bookkeeping, the off-clock warm-up.

With a stand-in for the wire: the rank's readings take their origin and warm-up credit from the
supervisor's answers. The supervisor's side is tested in tests/unit/harness/test_launch.py; the collective
side (every rank stopping at the same step) end to end in tests/e2e/test_runner.py, where 2-rank gloo
runs reproduce the 1-rank loss curve step for step.
"""

from __future__ import annotations

import math
import random

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from harness.api import DistInfo
from harness.train.budget import BudgetConfig
from harness.train.clock import DataGate, HarnessClock, Snapshot

ONE = DistInfo(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"), backend="none")


class FakeTime:
    """An injected monotonic clock: time moves only when a test advances it (no sleeps, no load)."""

    def __init__(self, t_s: float = 1000.0):
        self.t_s = t_s

    def __call__(self) -> float:
        return self.t_s

    def advance(self, dt_s: float) -> None:
        self.t_s += dt_s


class FakeStream:
    tokens_consumed = 0

    def next_batch(self, batch_tokens, seq_len):
        return torch.zeros(batch_tokens // seq_len, seq_len, dtype=torch.long), torch.zeros(
            batch_tokens // seq_len, seq_len, dtype=torch.long
        )


def test_budget_config_validates():
    assert BudgetConfig().warmup_max_s == 180.0
    with pytest.raises(ValueError, match="budget.train_s"):
        BudgetConfig(train_s=0)
    with pytest.raises(ValueError, match="warmup_max_s"):
        BudgetConfig(warmup_max_s=math.inf)


class StubWire:
    """The supervisor's answers, as harness/train/wire.py's WireClient gives them."""

    def __init__(self, since_start_s: float = 0.0, credit_s: float = 0.0):
        self.since_start_s, self.credit_s = since_start_s, credit_s
        self.calls: list[str] = []

    def clock_start(self) -> float:
        self.calls.append("clock_start")
        return self.since_start_s

    def warmup_begin(self) -> None:
        self.calls.append("warmup_begin")

    def warmup_end(self) -> float:
        self.calls.append("warmup_end")
        return self.credit_s


def test_clock_reads_stops_and_counts():
    now = FakeTime()
    clock = HarnessClock(0.05, ONE, now=now)
    clock.start()
    r = clock.tick()
    assert not r.stop and r.remaining_s == 0.05 and clock.steps == 1
    now.advance(0.06)
    r = clock.tick()
    assert r.stop and r.remaining_s == 0.0 and clock.steps == 1 and clock.ticks_after_stop == 0
    assert clock.predicted_stop is None  # the budget was spent: not a predicted stop
    clock.tick()
    assert clock.ticks_after_stop == 1


def test_data_gate_counts_batches_after_the_stop_reading():
    now = FakeTime()
    clock = HarnessClock(0.0001, ONE, now=now)
    gate = DataGate(FakeStream(), clock)
    clock.start()
    now.advance(0.001)
    gate.next_batch(8, 4)
    assert gate.batches_after_stop == 0
    assert clock.tick().stop
    gate.next_batch(8, 4)
    assert gate.batches_after_stop == 1


def _model_and_opt():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Embedding(16, 8), nn.Linear(8, 16))
    model.register_buffer("counter", torch.zeros(1))
    opt = torch.optim.Adam(model.parameters(), lr=0.1)
    return model, opt


def test_warmup_trains_nothing_and_is_off_the_clock():
    model, opt = _model_and_opt()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    now = FakeTime()
    clock = HarnessClock(100.0, ONE, warmup_max_s=60.0, now=now)
    gate = DataGate(FakeStream(), clock)
    clock.start()
    rng = (torch.get_rng_state(), random.getstate(), np.random.get_state()[1].copy())
    calls = []

    def step(x, y):
        assert x.shape == (2, 4) and torch.equal(x[:, 1:], y[:, :-1]) and int(x.max()) < 16
        with pytest.raises(RuntimeError, match="closed during"):
            gate.next_batch(8, 4)
        loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten())
        loss.backward()
        opt.step()
        model.counter += 1
        torch.rand(3)  # consumes RNG: restored after
        random.random()
        np.random.rand()
        now.advance(0.1)
        calls.append(1)

    report = clock.warmup(
        step, modules=[model], optimizers=[opt], steps=3, batch_tokens=8, seq_len=4, vocab_size=16
    )
    assert len(calls) == 3 and report.verified and report.steps == 3
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert len(opt.state) == 0 and all(p.grad is None for p in model.parameters())
    assert torch.equal(torch.get_rng_state(), rng[0]) and random.getstate() == rng[1]
    assert np.array_equal(np.random.get_state()[1], rng[2])
    assert report.off_clock_s == pytest.approx(0.3) and clock.off_clock_s == report.off_clock_s
    assert clock.elapsed_s() == pytest.approx(0.0)  # the warm-up's time is not on the clock
    with pytest.raises(RuntimeError, match="once"):
        clock.warmup(step, modules=[model], steps=1, batch_tokens=8, seq_len=4, vocab_size=16)


def test_warmup_credit_is_capped_and_refused_after_a_tick():
    model, opt = _model_and_opt()
    now = FakeTime()
    clock = HarnessClock(100.0, ONE, warmup_max_s=0.01, now=now)
    clock.start()
    report = clock.warmup(
        lambda x, y: now.advance(0.05), modules=[model], steps=1, batch_tokens=8, seq_len=4, vocab_size=16
    )
    assert report.off_clock_s == 0.01
    assert clock.elapsed_s() == pytest.approx(0.04)  # the excess counts
    late = HarnessClock(100.0, ONE)
    late.start()
    late.tick()
    with pytest.raises(RuntimeError, match="before the first"):
        late.warmup(lambda x, y: None, modules=[model], steps=1, batch_tokens=8, seq_len=4, vocab_size=16)


def test_snapshot_restores_optimizer_state_in_place_and_detects_changes():
    model, opt = _model_and_opt()
    x = torch.randint(0, 16, (2, 4))
    F.cross_entropy(model(x).flatten(0, 1), x.flatten()).backward()
    opt.step()  # optimizer state now exists
    snap = Snapshot([model], [opt], cuda=False)
    exp_avg = next(iter(opt.state.values()))["exp_avg"]
    saved = exp_avg.clone()
    opt.param_groups[0]["lr"] = 5.0
    F.cross_entropy(model(x).flatten(0, 1), x.flatten()).backward()
    opt.step()
    snap.restore()
    assert snap.verify() and opt.param_groups[0]["lr"] == 0.1
    assert next(iter(opt.state.values()))["exp_avg"] is exp_avg and torch.equal(exp_avg, saved)
    with torch.no_grad():
        next(model.parameters()).add_(1e-3)
    assert not snap.verify()


def test_the_readings_take_the_supervisors_origin_and_credit():
    wire = StubWire(since_start_s=5.0)  # the node's clock started 5 s before this rank's
    now = FakeTime()
    clock = HarnessClock(100.0, ONE, wire, warmup_max_s=60.0, now=now)  # type: ignore[arg-type]
    clock.start()
    assert clock.tick().elapsed_s == 5.0
    late = HarnessClock(100.0, ONE, StubWire(credit_s=0.01), warmup_max_s=60.0, now=now)  # type: ignore[arg-type]
    late.start()
    model, _ = _model_and_opt()
    report = late.warmup(
        lambda x, y: now.advance(0.05), modules=[model], steps=2, batch_tokens=8, seq_len=4, vocab_size=16
    )
    assert report.off_clock_s == 0.01 and late.off_clock_s == 0.01  # the supervisor's say, not 0.1 s
    assert late.elapsed_s() == pytest.approx(0.09)


def test_warmup_after_a_batch_is_refused():
    wire = StubWire()
    clock = HarnessClock(100.0, ONE, wire)  # type: ignore[arg-type]
    gate = DataGate(FakeStream(), clock)
    clock.start()
    gate.next_batch(8, 4)
    model, _ = _model_and_opt()
    with pytest.raises(RuntimeError, match="before the first ctx.data.next_batch"):
        clock.warmup(lambda x, y: None, modules=[model], steps=1, batch_tokens=8, seq_len=4, vocab_size=16)
    assert wire.calls == ["clock_start"]  # the supervisor was not even asked


def test_the_clock_stops_before_a_step_that_would_end_past_the_budget():
    """Steps of 4 s on a 58 s budget: the tick at 56 s stops (56 + 4 > 58) instead of starting a step that
    would end at 60 s; without the prediction the run trains on to 60 s, 2 s past its budget."""
    now = FakeTime()
    clock = HarnessClock(58.0, ONE, now=now)
    clock.start()
    readings = []
    while not (r := clock.tick()).stop:
        readings.append(r.elapsed_s)
        now.advance(4.0)
    assert readings == [4.0 * i for i in range(14)]  # 0, 4, ..., 52: the step from 52 ends at 56
    assert r.elapsed_s == 56.0 and r.remaining_s == 2.0 and clock.steps == 14
    assert clock.step_s == 4.0
    assert clock.predicted_stop == {"elapsed_s": 56.0, "step_s": 4.0, "budget_s": 58.0}
    exact = HarnessClock(60.0, ONE, now=now)  # a step that ends on the budget exactly still runs
    exact.start()
    while not exact.tick().stop:
        now.advance(4.0)
    assert exact.steps == 15 and exact.predicted_stop is None and exact.last.elapsed_s == 60.0


def test_the_estimate_follows_the_last_step():
    """A slow step (the machine got busy) moves the stop earlier; one that fits still runs."""
    now = FakeTime()
    clock = HarnessClock(10.0, ONE, now=now)
    clock.start()
    assert not clock.tick().stop  # 0 s: no estimate yet
    now.advance(1.0)
    assert not clock.tick().stop  # 1 s, steps of 1 s
    now.advance(6.0)
    r = clock.tick()  # 7 s, the last step took 6 s: 7 + 6 > 10
    assert r.stop and clock.predicted_stop == {"elapsed_s": 7.0, "step_s": 6.0, "budget_s": 10.0}
    quick = HarnessClock(10.0, ONE, now=now)
    quick.start()
    quick.tick()
    now.advance(4.9)
    assert not quick.tick().stop  # 4.9 + 4.9 = 9.8 <= 10: the step fits
    now.advance(4.9)
    assert quick.tick().stop and quick.steps == 2


def test_an_untimed_clock_never_predicts_a_stop():
    now = FakeTime()
    clock = HarnessClock(math.inf, ONE, now=now)
    clock.start()
    for _ in range(3):
        assert not clock.tick().stop
        now.advance(1e6)
    assert clock.predicted_stop is None
