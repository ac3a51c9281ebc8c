"""Bits per byte, from float64 sums. The metric table every result prints.

    val_loss = Σ nats / Σ tokens                      (nats per token)
    val_bpb  = Σ nats / (ln 2 · Σ bytes)              (bits per byte)
    2 ** val_bpb == byte perplexity == exp(Σ nats / Σ bytes)

Sums are float64 and order-independent up to float64 rounding; the per-token losses come from
the scorer's own log-softmax of the model's logits, never from the model. Any change to this math
bumps METRIC_VERSION and regenerates tests/golden/.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

METRIC_VERSION = 1


@dataclass(frozen=True)
class MetricSpec:
    name: str
    unit: str
    higher_is_better: bool
    version: int
    alias: str | None = None


METRICS: dict[str, MetricSpec] = {
    "val_loss": MetricSpec("val_loss", "nats/token", False, METRIC_VERSION),
    "val_bpb": MetricSpec("val_bpb", "bits/byte", False, METRIC_VERSION, alias="bits_per_byte"),
}


def metric_table() -> dict[str, dict[str, object]]:
    """The metric registry as plain JSON (recorded in every score record)."""
    return {
        k: {"unit": m.unit, "higher_is_better": m.higher_is_better, "version": m.version, "alias": m.alias}
        for k, m in METRICS.items()
    }


@dataclass
class BpbSums:
    """Running float64 sums over scored tokens."""

    loss_nats: float = 0.0
    tokens: int = 0
    bytes: int = 0

    def add(self, token_nats: torch.Tensor, token_bytes: np.ndarray | torch.Tensor) -> None:
        """Add one batch: per-token losses (nats, any float dtype) and per-token byte counts."""
        self.loss_nats += float(token_nats.detach().to(torch.float64).sum().item())
        self.tokens += int(token_nats.numel())
        self.bytes += int(token_bytes.sum())

    def merge(self, other: BpbSums) -> BpbSums:
        return BpbSums(self.loss_nats + other.loss_nats, self.tokens + other.tokens, self.bytes + other.bytes)

    @property
    def val_loss(self) -> float:
        if self.tokens == 0:
            raise ValueError("no tokens were scored")
        return self.loss_nats / self.tokens

    @property
    def val_bpb(self) -> float:
        if self.bytes == 0:
            raise ValueError("the scored tokens spell zero bytes; bits per byte is undefined")
        return self.loss_nats / (math.log(2.0) * self.bytes)

    @property
    def byte_perplexity(self) -> float:
        return math.exp(self.loss_nats / self.bytes)
