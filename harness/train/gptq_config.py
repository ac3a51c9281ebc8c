"""The GPTQ pack step's settings ([pack] gptq_*) and the codec it needs (harness/train/gptq.py runs the step).

Its own module, torch-free, so that the config (harness/config.py) loads without torch.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True, kw_only=True, slots=True)
class GptqConfig:
    """The [pack] keys of the step, each as pack.gptq_NAME (harness/config.py PackConfig mirrors these
    fields: their defaults are said here only); batches = 0 turns it off."""

    batches: int = 0
    """GPTQ as a pack step on the training clock: training batches read for the Hessians; 0: off. Needs a
    per-row integer codec (int5-int8, mixed_*)."""
    batch_tokens: int = 65536
    """Tokens a calibration batch (a multiple of seq_len)."""
    seq_len: int = 1024
    reserve_s: float = 30.0
    """Seconds of the training budget kept for the step: the submission's ctx.clock.budget_s is this much shorter."""
    block_size: int = 128
    """Columns rounded together before their error is spread over the rest."""

    def __post_init__(self) -> None:
        if self.batches < 0 or self.batch_tokens <= 0 or self.seq_len <= 0 or self.block_size <= 0:
            raise ValueError(
                "pack.gptq_batches must be >= 0 and pack.gptq_batch_tokens, gptq_seq_len, gptq_block_size > 0"
            )
        if self.batch_tokens % self.seq_len:
            raise ValueError(
                f"pack.gptq_batch_tokens ({self.batch_tokens}) must be a multiple of pack.gptq_seq_len ({self.seq_len})"
            )
        if not (math.isfinite(self.reserve_s) and self.reserve_s >= 0):
            raise ValueError(f"pack.gptq_reserve_s must be a finite number >= 0, got {self.reserve_s}")

    @property
    def enabled(self) -> bool:
        return self.batches > 0

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def integer_codec(codec_spec: str) -> Any:
    """The per-row integer codec (rowquant.RowQuantCodec) a pack.codec spec names, the only kind whose
    encoder keeps GPTQ's grid; ValueError (one line) for int8_zlib, a submission's codec.py or another."""
    from scoring.artifact.codecs import get_codec
    from scoring.artifact.codecs.rowquant import RowQuantCodec

    codec = None if codec_spec == "submission" else get_codec(codec_spec)
    if not isinstance(codec, RowQuantCodec):
        raise ValueError(
            f"GPTQ needs a per-row integer codec (int5-int8 or mixed_*, whose encoder keeps its grid); "
            f"pack.codec is {codec_spec!r}"
        )
    return codec
