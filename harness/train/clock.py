"""The budget clock as a rank sees it: readings, the stop step, the off-clock warm-up. Not the record.

The clock that counts is the supervisor's (`ClockServer`, harness/run/clock_server.py): it timestamps the
wire messages (harness/train/wire.py) this clock sends, on receipt, with its own clock, and the
result's train_time_s is its figure. This side gives the submission its readings, from the same
origin, so an honest rank's readings agree with the supervisor's to within a message's latency:

- The clock starts, on every rank at once (after a barrier), just before the submission's train.py
  is imported: each rank sends `clock_start` and sets its origin from the reply (seconds since the
  node's clock started). Process-group setup and the harness's own imports come before it, under the
  separate `startup_s` allowance.
- `tick()` is one collective per step: each rank reads its own elapsed time (after synchronising its
  device), the ranks all-reduce (elapsed, over-budget flag) with MAX into a preallocated buffer, and
  all get the same reading. So every rank stops at the same step, and LR schedules driven by elapsed
  time agree. There is no other per-step work, and no message. The stop comes before a step that
  would end past the budget, if it took as long as the last one (the time between the last two
  ticks): on a busy machine a 5 s step begun at 58 s of 60 used to end the run over budget.
- `warmup(...)` is the only time off the clock: once, before the first tick and the first batch, on
  synthetic tokens; the named modules, optimizers and RNGs are snapshotted before and restored after,
  then verified bit-identical. Its bounds are sent as `warmup_begin`/`warmup_end`; the supervisor
  says how much is off the clock (at most `warmup_max_s`, nothing if data reached a rank first), and
  the ranks take the least of their answers. While it runs the supervisor hands out no data.
- `DataGate` wraps the token stream: closed during warm-up (the friendly refusal; the supervisor's
  is the one that holds), and counts batches taken after the stop reading.

Without a wire (unit tests, `pgolf bench runner`'s in-process timing) the clock times itself.
"""

from __future__ import annotations

import copy
import math
import random
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

from harness.api import ClockReading, DistInfo, WarmupReport
from harness.train.wire import WireClient


class DataGate:
    """Wraps the token stream: closed during warm-up, and counts batches taken after the stop reading."""

    def __init__(self, stream: Any, clock: HarnessClock):
        self._loader, self._clock = stream, clock
        self.batches_after_stop = 0

    def next_batch(self, batch_tokens: int, seq_len: int) -> tuple[torch.Tensor, torch.Tensor]:
        clock = self._clock
        if clock.in_warmup:
            raise RuntimeError(
                "ctx.data is closed during ctx.clock.warmup(): train on the synthetic batch it passes"
            )
        clock.data_taken = True
        if clock.last.stop:
            self.batches_after_stop += 1
        return self._loader.next_batch(batch_tokens, seq_len)

    @property
    def tokens_consumed(self) -> int:
        return self._loader.tokens_consumed


class HarnessClock:
    """Implements harness.api.BudgetClock. `wire`: the rank's connection to its supervisor (None: self-timed)."""

    def __init__(
        self,
        budget_s: float,
        dist_info: DistInfo,
        wire: WireClient | None = None,
        warmup_max_s: float = 0.0,
        *,
        now: Callable[[], float] | None = None,
    ):
        self.budget_s = float(budget_s)
        # injectable for tests; by default time.monotonic looked up at each reading, as before (what the rank
        # reads is the rank's word either way: the supervisor's own clock is the record's)
        self._now: Callable[[], float] = now if now is not None else (lambda: time.monotonic())
        self._last_tick_s: float | None = None
        self.step_s: float | None = None
        """The last step's duration (between the last two ticks, this rank's clock): the next step's estimate."""
        self.predicted_stop: dict[str, float] | None = None
        """Set at a stop made before the budget was spent: the elapsed time and the step estimate that made it."""
        self.warmup_max_s = float(warmup_max_s)
        self._dist = dist_info
        self._wire = wire
        self._t0: float | None = None
        self.off_clock_s = 0.0
        self.steps = 0
        self.ticks_after_stop = 0
        self.in_warmup = False
        self.data_taken = False
        self.warmup_report: WarmupReport | None = None
        self.last = ClockReading(0.0, self.budget_s, False)
        self._cuda = dist_info.device.type == "cuda"
        self._cpu = torch.zeros(2, dtype=torch.float64)
        self._np = self._cpu.numpy()
        self._dev = self._cpu.to(dist_info.device) if dist_info.backend == "nccl" else self._cpu

    # ---- the clock ----

    def start(self) -> None:
        if self._dist.distributed:
            dist.barrier()
        self.sync()
        since = self._wire.clock_start() if self._wire is not None else 0.0
        self._t0 = self._now() - since

    def sync(self) -> None:
        if self._cuda:
            torch.cuda.synchronize(self._dist.device)

    def elapsed_s(self) -> float:
        if self._t0 is None:
            return 0.0
        return self._now() - self._t0 - self.off_clock_s

    def tick(self) -> ClockReading:
        self.sync()
        elapsed = self.elapsed_s()
        if self._last_tick_s is not None:
            self.step_s = max(elapsed - self._last_tick_s, 0.0)
        self._last_tick_s = elapsed
        # stop once the budget is spent, or before a step that would end past it (as long as the last one)
        ahead = self.step_s or 0.0
        over = 1.0 if elapsed >= self.budget_s or elapsed + ahead > self.budget_s else 0.0
        if self._dist.distributed:
            self._np[0], self._np[1] = elapsed, over
            if self._dev is not self._cpu:
                self._dev.copy_(self._cpu)
                dist.all_reduce(self._dev, op=dist.ReduceOp.MAX)
                self._cpu.copy_(self._dev)
            else:
                dist.all_reduce(self._cpu, op=dist.ReduceOp.MAX)
            elapsed, over = float(self._np[0]), float(self._np[1])
        stop = over > 0
        if stop and not self.last.stop and elapsed < self.budget_s:
            self.predicted_stop = {
                "elapsed_s": round(elapsed, 3),
                "step_s": round(ahead, 3),
                "budget_s": self.budget_s,
            }
        if self.last.stop:
            self.ticks_after_stop += 1
        elif not stop:
            self.steps += 1
        remaining = max(self.budget_s - elapsed, 0.0) if math.isfinite(self.budget_s) else math.inf
        self.last = ClockReading(elapsed, remaining, stop)
        return self.last

    # ---- the off-clock warm-up ----

    def warmup(
        self,
        step: Callable[[torch.Tensor, torch.Tensor], object],
        *,
        modules: Sequence[nn.Module],
        optimizers: Sequence[torch.optim.Optimizer] = (),
        steps: int,
        batch_tokens: int,
        seq_len: int,
        vocab_size: int,
    ) -> WarmupReport:
        if self._t0 is None or self.steps or self.last.stop or self.ticks_after_stop:
            raise RuntimeError("ctx.clock.warmup() must come before the first ctx.clock.tick()")
        if self.data_taken:
            raise RuntimeError(
                "ctx.clock.warmup() must come before the first ctx.data.next_batch(): "
                "once a rank holds training data nothing is off the clock"
            )
        if self.warmup_report is not None:
            raise RuntimeError("ctx.clock.warmup() may be called once per run")
        if steps < 0 or batch_tokens <= 0 or batch_tokens % seq_len:
            raise ValueError(
                f"warmup: steps >= 0 and batch_tokens a multiple of seq_len, got {steps}, {batch_tokens}, {seq_len}"
            )
        if self._dist.distributed:  # begin together: the supervisor credits only time all ranks spend in it
            dist.barrier()
        self.sync()
        t0 = self._now()
        if self._wire is not None:
            self._wire.warmup_begin()
        snap = Snapshot(modules, optimizers, self._cuda)
        gen = torch.Generator().manual_seed(0)
        self.in_warmup = True
        try:
            for _ in range(steps):
                tok = torch.randint(0, vocab_size, (batch_tokens + 1,), generator=gen).to(self._dist.device)
                step(tok[:-1].view(-1, seq_len), tok[1:].view(-1, seq_len))
            self.sync()
        finally:
            self.in_warmup = False
            snap.restore()
            verified = snap.verify()
            credit = (
                self._wire.warmup_end()
                if self._wire is not None
                else min(self._now() - t0, self.warmup_max_s)
            )
        if not verified:
            raise RuntimeError(
                "warm-up left the weights or optimizer state changed after restoring them; refusing to continue"
            )
        off = torch.tensor([credit], dtype=torch.float64)
        if self._dist.distributed:  # the least generous rank's credit: all ranks agree
            dev = off.to(self._dist.device) if self._dist.backend == "nccl" else off
            dist.all_reduce(dev, op=dist.ReduceOp.MIN)
            off = dev.cpu()
        self.off_clock_s += float(off[0])
        self.warmup_report = WarmupReport(steps=steps, off_clock_s=float(off[0]), verified=verified)
        return self.warmup_report


class Snapshot:
    """A bitwise copy of modules' parameters/buffers/grads, optimizers' state and hyperparameters, and the RNGs."""

    def __init__(self, modules: Sequence[nn.Module], optimizers: Sequence[torch.optim.Optimizer], cuda: bool):
        self.tensors: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]] = []
        seen: set[int] = set()
        for m in modules:
            for t in [*m.parameters(), *m.buffers()]:
                if id(t) not in seen:
                    seen.add(id(t))
                    g = t.grad.detach().clone() if t.grad is not None else None
                    self.tensors.append((t, t.detach().clone(), g))
        self.optimizers = [
            (
                o,
                _clone_state(o.state),
                [_clone({k: v for k, v in g.items() if k != "params"}) for g in o.param_groups],
            )
            for o in optimizers
        ]
        self.cuda = cuda
        self.rng = (
            torch.get_rng_state(),
            torch.cuda.get_rng_state_all() if cuda else None,
            random.getstate(),
            np.random.get_state(),
        )

    def restore(self) -> None:
        with torch.no_grad():
            for t, saved, grad in self.tensors:
                t.copy_(saved)
                t.grad = None if grad is None else grad.clone()
            for opt, state, groups in self.optimizers:
                for p in [p for p in opt.state if p not in state]:
                    del opt.state[p]
                for p, saved_state in state.items():
                    cur = opt.state[p]
                    for k in [k for k in cur if k not in saved_state]:
                        del cur[k]
                    for k, v in saved_state.items():
                        if (
                            isinstance(v, torch.Tensor)
                            and isinstance(cur.get(k), torch.Tensor)
                            and cur[k].shape == v.shape
                            and cur[k].dtype == v.dtype
                        ):
                            cur[k].copy_(v)
                        else:
                            cur[k] = _clone(v)
                for g, saved_g in zip(opt.param_groups, groups, strict=True):
                    g.update(_clone(saved_g))
        torch.set_rng_state(self.rng[0])
        if self.rng[1] is not None:
            torch.cuda.set_rng_state_all(self.rng[1])
        random.setstate(self.rng[2])
        np.random.set_state(self.rng[3])

    def verify(self) -> bool:
        for t, saved, _ in self.tensors:
            if not _bitwise_equal(t.detach(), saved):
                return False
        for opt, state, _ in self.optimizers:
            if set(opt.state) != set(state):
                return False
            for p, saved_state in state.items():
                cur = opt.state[p]
                if set(cur) != set(saved_state):
                    return False
                for k, v in saved_state.items():
                    if isinstance(v, torch.Tensor) and not (
                        isinstance(cur[k], torch.Tensor) and _bitwise_equal(cur[k], v)
                    ):
                        return False
        return True


def _clone(v: Any) -> Any:
    if isinstance(v, torch.Tensor):
        return v.detach().clone()
    if isinstance(v, dict):
        return {k: _clone(x) for k, x in v.items()}
    return copy.deepcopy(v)


def _clone_state(state: Any) -> dict[Any, dict[str, Any]]:
    return {p: _clone(dict(s)) for p, s in state.items()}


def _bitwise_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if a.is_floating_point() or a.is_complex():
        return torch.equal(
            a.reshape(-1).contiguous().view(torch.uint8), b.reshape(-1).contiguous().view(torch.uint8)
        )
    return torch.equal(a, b)
