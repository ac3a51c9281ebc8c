"""[budget]: the seconds a run may take, on the harness's clock (harness/train/clock.py keeps it).

Its own module, torch-free, so that the config (harness/config.py) loads without torch: a typo in a
run's config is refused before any heavy import.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True, kw_only=True, slots=True)
class BudgetConfig:
    train_s: float = 600.0
    """Training budget on the harness's clock, seconds (inf: untimed)."""
    grace_s: float = 30.0
    """After train_s + grace_s the training processes are killed and the run is over_budget."""
    startup_s: float = 300.0
    """Allowance before the clock starts (imports, process-group setup)."""
    warmup_max_s: float = 180.0
    """Most seconds of ctx.clock.warmup() (compile on synthetic tokens) left off the clock; the rest counts."""

    def __post_init__(self) -> None:
        for name in ("train_s", "grace_s", "startup_s"):
            v = getattr(self, name)
            if not v > 0:
                raise ValueError(f"budget.{name} must be positive, got {v}")
        if not self.warmup_max_s >= 0 or not math.isfinite(self.warmup_max_s):
            raise ValueError(f"budget.warmup_max_s must be a finite number >= 0, got {self.warmup_max_s}")
