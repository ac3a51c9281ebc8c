"""[eval] / `pgolf score`'s settings: the mode, window, batch, subset and dtype (scoring/score/evaluate.py
runs them). Its own module, torch-free, so that the config (harness/config.py) loads without torch.
"""

from __future__ import annotations

from dataclasses import dataclass

EVAL_MODES = ("standard", "sliding", "documents")
EVAL_DTYPES = ("float32", "bfloat16")


@dataclass(frozen=True, kw_only=True, slots=True)
class EvalConfig:
    mode: str = "standard"
    """Which targets are scored with which context (see module docstring)."""
    seq_len: int = 1024
    """Window length L in tokens."""
    batch_seqs: int = 32
    """Windows per forward pass; changes speed, never the result beyond float rounding."""
    max_tokens: int | None = None
    """Score only the first this-many validation tokens (a subset of the split)."""
    max_docs: int | None = None
    """Score only the first this-many validation documents, each to its end (the CPU record track's subset: the
    same text whatever the tokenizer). The scorer resolves it to max_tokens on the tokens it reads
    (scoring/score/windows.py documents_cut); None: no cut by documents."""
    dtype: str = "float32"
    """Compute dtype of the forward pass: float32, or bfloat16 autocast (GPU)."""
    stride: int | None = None
    """sliding/documents: targets scored per window after a segment's first; None: L // 2 for
    sliding, L for documents. Must be None in standard mode."""
    adapt_chunk_tokens: int = 32_768
    """Score-first adaptation: about this many targets are scored before the hook sees them."""

    def __post_init__(self) -> None:
        if self.mode not in EVAL_MODES:
            raise ValueError(f"eval mode must be one of {EVAL_MODES}, got {self.mode!r}")
        if self.seq_len <= 0 or self.batch_seqs <= 0:
            raise ValueError(
                f"seq_len and batch_seqs must be positive, got {self.seq_len}, {self.batch_seqs}"
            )
        if self.max_tokens is not None and self.max_tokens <= self.seq_len:
            raise ValueError(f"max_tokens must exceed seq_len ({self.seq_len}), got {self.max_tokens}")
        if self.max_docs is not None and self.max_docs <= 0:
            raise ValueError(f"max_docs must be None or positive, got {self.max_docs}")
        if self.dtype not in EVAL_DTYPES:
            raise ValueError(f"eval dtype must be one of {EVAL_DTYPES}, got {self.dtype!r}")
        if self.stride is not None:
            if self.mode == "standard":
                raise ValueError(
                    f"stride={self.stride} applies to the sliding and documents modes only; drop it or pick --mode sliding"
                )
            if not 1 <= self.stride <= self.seq_len:
                raise ValueError(f"stride must be in [1, seq_len={self.seq_len}], got {self.stride}")
        if self.adapt_chunk_tokens <= 0:
            raise ValueError(f"adapt_chunk_tokens must be positive, got {self.adapt_chunk_tokens}")

    @property
    def resolved_stride(self) -> int | None:
        """The stride the plan uses (None in standard mode)."""
        if self.mode == "standard":
            return None
        if self.stride is not None:
            return self.stride
        return max(1, self.seq_len // 2) if self.mode == "sliding" else self.seq_len
