"""The budget clock. It is the harness's: a submission reads it, never sets it.

- The clock starts when train(ctx) is called (process-group setup and imports are before it, under
  the separate `startup_s` allowance).
- `tick()` is one collective per step: each rank reads its own elapsed time (after synchronising
  its device), the ranks all-reduce (elapsed, over-budget flag) with MAX, and all get the same
  reading. So every rank stops at the same step, and LR schedules driven by elapsed time agree.
- The supervising process (harness/launch.py) kills the whole process group at budget + grace;
  rank 0 writes a marker file when the clock starts so the supervisor knows when that is.
"""

from __future__ import annotations

import json
import math
import os
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist

from harness.api import ClockReading, DistInfo

CLOCK_MARKER = "clock_start.json"


@dataclass(frozen=True, kw_only=True, slots=True)
class BudgetConfig:
    train_s: float = 600.0
    """Training budget on the harness's clock, seconds (inf: untimed)."""
    grace_s: float = 30.0
    """After train_s + grace_s the training processes are killed and the run is over_budget."""
    startup_s: float = 300.0
    """Allowance before the clock starts (imports, process-group setup, building the model)."""

    def __post_init__(self) -> None:
        for name in ("train_s", "grace_s", "startup_s"):
            v = getattr(self, name)
            if not v > 0:
                raise ValueError(f"budget.{name} must be positive, got {v}")


class HarnessClock:
    """Implements harness.api.BudgetClock."""

    def __init__(self, budget_s: float, dist_info: DistInfo, marker_dir: Path | None = None):
        self.budget_s = float(budget_s)
        self._dist = dist_info
        self._marker_dir = marker_dir
        self._t0: float | None = None
        self._paused_s = 0.0
        self.steps = 0
        self.last = ClockReading(0.0, self.budget_s, False)

    def start(self) -> None:
        self._sync()
        self._t0 = time.perf_counter()
        if self._dist.is_main and self._marker_dir is not None:
            tmp = self._marker_dir / f".{CLOCK_MARKER}.tmp"
            tmp.write_text(json.dumps({"clock_start_unix_s": time.time(), "budget_s": self.budget_s}))
            os.replace(tmp, self._marker_dir / CLOCK_MARKER)

    def _sync(self) -> None:
        if self._dist.device.type == "cuda":
            torch.cuda.synchronize(self._dist.device)

    def elapsed_s(self) -> float:
        if self._t0 is None:
            return 0.0
        return time.perf_counter() - self._t0 - self._paused_s

    def tick(self) -> ClockReading:
        self._sync()
        elapsed = self.elapsed_s()
        over = 1.0 if elapsed >= self.budget_s else 0.0
        if self._dist.distributed:
            t = torch.tensor([elapsed, over], dtype=torch.float64)
            if self._dist.backend == "nccl":
                t = t.to(self._dist.device)
            dist.all_reduce(t, op=dist.ReduceOp.MAX)
            elapsed, over = float(t[0]), float(t[1])
        stop = over > 0
        if not stop:
            self.steps += 1
        remaining = max(self.budget_s - elapsed, 0.0) if math.isfinite(self.budget_s) else math.inf
        self.last = ClockReading(elapsed, remaining, stop)
        return self.last
