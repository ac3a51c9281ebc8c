"""Tracks: the rules a result is held to (budgets, cap, data, hardware, significance).

A track fixes the train and eval budgets, the byte cap, the data variant, the hardware it is
meant for and the significance rule for new records. A run may use less time than its track
allows, never more. Tracks change only with a version bump and a line in docs (change history).
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
    """Validation subset scored on this track (None: the full split)."""
    version: int = 1


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
