"""The byte cap: which files of a submission count, and the check bytes_code + bytes_model <= cap.

Counted code bytes (DESIGN.md): every file in the submission folder except README.md,
submission.json, logs and results. Concretely excluded: those two names; any path with a part
that is hidden (starts with "."), `__pycache__`, `logs`, `results` or `runs`; files ending in
`.log`, `.pyc`. Everything else counts, byte for byte, including config files and tokenizers.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from data.io import sha256_file

ARTIFACT_CAP_BYTES = 16_000_000
UNCOUNTED_NAMES = frozenset({"README.md", "submission.json"})
UNCOUNTED_DIRS = frozenset({"__pycache__", "logs", "results", "runs"})
UNCOUNTED_SUFFIXES = (".log", ".pyc")


class ArtifactTooLarge(ValueError):
    """bytes_code + bytes_model exceeds the cap; the message has every number."""

    def __init__(self, bytes_code: int, bytes_model: int, cap_bytes: int):
        self.bytes_code, self.bytes_model, self.cap_bytes = bytes_code, bytes_model, cap_bytes
        total = bytes_code + bytes_model
        super().__init__(
            f"artifact over the cap: bytes_total {total:,} = bytes_code {bytes_code:,} + bytes_model "
            f"{bytes_model:,} exceeds cap_bytes {cap_bytes:,} by {total - cap_bytes:,} bytes"
        )


def is_counted(rel: Path) -> bool:
    if rel.name in UNCOUNTED_NAMES or rel.name.endswith(UNCOUNTED_SUFFIXES):
        return False
    return not any(part.startswith(".") or part in UNCOUNTED_DIRS for part in rel.parts)


def counted_files(submission_dir: str | os.PathLike[str]) -> dict[str, str]:
    """{relative posix path: sha256} of every counted file, sorted by path."""
    root = Path(submission_dir)
    if not root.is_dir():
        raise FileNotFoundError(f"submission folder not found: {root}")
    out = {}
    for p in sorted(root.rglob("*")):
        rel = p.relative_to(root)
        if p.is_file() and is_counted(rel):
            out[rel.as_posix()] = sha256_file(p)
    return out


def code_bytes(submission_dir: str | os.PathLike[str], files: dict[str, str] | None = None) -> int:
    root = Path(submission_dir)
    files = counted_files(root) if files is None else files
    return sum((root / rel).stat().st_size for rel in files)


@dataclass(frozen=True)
class CapCheck:
    bytes_code: int
    bytes_model: int
    cap_bytes: int

    @property
    def bytes_total(self) -> int:
        return self.bytes_code + self.bytes_model

    @property
    def within_cap(self) -> bool:
        return self.bytes_total <= self.cap_bytes

    def enforce(self) -> None:
        if not self.within_cap:
            raise ArtifactTooLarge(self.bytes_code, self.bytes_model, self.cap_bytes)

    def as_dict(self) -> dict[str, int | bool]:
        return {
            "bytes_code": self.bytes_code,
            "bytes_model": self.bytes_model,
            "bytes_total": self.bytes_total,
            "cap_bytes": self.cap_bytes,
            "within_cap": self.within_cap,
        }
