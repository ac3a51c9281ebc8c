"""Tracks: the rules a result is held to (budgets, cap, data, hardware, significance).

A track fixes the train and eval budgets, the byte cap, the data variant, the hardware it is
meant for and the significance rule for new records; and every rule that decides how strictly an
entry is judged: the grace before a late run is killed, the startup and warm-up allowances, the
scored validation subset and the sandbox requirement. A run may use less training time than its
track allows, never more. On a record track none of these can be changed by a submission's config
or an official's `--set` (harness/config.py applies them); an unranked track's rules may be
loosened, and what was loosened is recorded with the run. Tracks change only with a version bump
and a line in docs (change history).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from scoring.artifact.cap import ARTIFACT_CAP_BYTES


@dataclass(frozen=True, kw_only=True, slots=True)
class Track:
    name: str
    train_budget_s: float
    """Wall-clock training budget in seconds (inf: untimed)."""
    eval_budget_s: float
    """Wall-clock evaluation budget in seconds (inf: untimed)."""
    cap_bytes: int
    data_variant: str
    hardware: str
    record: bool
    """Whether results on this track compete for records (and need significance)."""
    margin_nats: float = 0.005
    p_value: float = 0.01
    eval_max_tokens: int | None = None
    """Validation subset scored on this track (None: the full split). The config key eval.max_tokens."""
    grace_s: float = 30.0
    """Seconds past the training budget before the training processes are killed (budget.grace_s)."""
    startup_s: float = 300.0
    """Allowance before the clock starts: imports, process-group setup (budget.startup_s)."""
    warmup_max_s: float = 180.0
    """Most seconds of off-clock compile warm-up accepted (budget.warmup_max_s)."""
    sandbox: str = "auto"
    """launch.sandbox: "required" (refuse to train unless the Landlock sandbox holds) or "auto"
    (every isolation layer the machine offers, each missing one recorded)."""
    network: str = "auto"
    """launch.network: "auto" (one node, as root: loopback only) or "host"."""
    version: int = 1

    def __post_init__(self) -> None:
        if self.sandbox not in ("auto", "required") or self.network not in ("auto", "host"):
            raise ValueError(
                f"track {self.name}: sandbox must be 'auto' or 'required' and network 'auto' or 'host', "
                f"got {self.sandbox!r}, {self.network!r}"
            )
        if self.eval_max_tokens is not None and self.eval_max_tokens <= 0:
            raise ValueError(f"track {self.name}: eval_max_tokens must be None or positive")


TRACKS: dict[str, Track] = {
    t.name: t
    for t in (
        Track(
            name="10min_16mb",
            train_budget_s=600.0,
            eval_budget_s=600.0,
            cap_bytes=ARTIFACT_CAP_BYTES,
            data_variant="sp1024",
            hardware="8xH100 SXM",
            record=True,
            sandbox="required",
        ),
        Track(
            name="non_record_16mb",
            train_budget_s=math.inf,
            eval_budget_s=math.inf,
            cap_bytes=ARTIFACT_CAP_BYTES,
            data_variant="sp1024",
            hardware="any",
            record=False,
        ),
        Track(
            # The CPU track: the whole pipeline on CPU. Scoring covers the first 2,097,152 validation
            # tokens (2,048 windows of 1,024), about 1/30 of the split, so that it fits the eval budget.
            name="cpu_10min_16mb",
            train_budget_s=600.0,
            eval_budget_s=600.0,
            cap_bytes=ARTIFACT_CAP_BYTES,
            data_variant="sp1024",
            hardware="CPU",
            record=True,
            eval_max_tokens=2_097_152,
            grace_s=60.0,  # a CPU step is slow: a rank may need longer to reach its next tick and return
            sandbox="required",
        ),
        Track(
            name="smoke",
            train_budget_s=600.0,
            eval_budget_s=600.0,
            cap_bytes=ARTIFACT_CAP_BYTES,
            data_variant="any",
            hardware="any",
            record=False,
        ),
    )
}


def get_track(name: str) -> Track:
    if name not in TRACKS:
        raise ValueError(f"unknown track {name!r}; known tracks: {', '.join(TRACKS)}")
    return TRACKS[name]
