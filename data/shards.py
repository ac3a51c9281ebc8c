"""Token shards: the reference / llm.c binary format.

Layout (little-endian): a header of 256 int32 — [0] magic 20240520, [1] version 1, [2] token count,
the rest zero — followed by `count` uint16 tokens. The file size must be exactly
1024 + 2 * count bytes. Names: `fineweb_train_NNNNNN.bin` and `fineweb_val_NNNNNN.bin`.

    write_shard(path, tokens)   atomic write
    read_shard(path)            validated, memory-mapped uint16 array (no copy)
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import numpy as np

from data.io import atomic_writer

SHARD_MAGIC = 20240520
SHARD_VERSION = 1
HEADER_INTS = 256
HEADER_BYTES = HEADER_INTS * 4
TOKEN_DTYPE = np.dtype("<u2")
MAX_TOKEN_ID = 65_535
SPLITS = ("train", "val")
_NAME_RE = re.compile(r"^fineweb_(train|val)_(\d{6})\.bin$")


class ShardError(ValueError):
    """A shard file is malformed; the message names the file and how to fix it."""


def shard_name(split: str, index: int) -> str:
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    return f"fineweb_{split}_{index:06d}.bin"


def parse_shard_name(name: str) -> tuple[str, int] | None:
    """`fineweb_val_000003.bin` -> ("val", 3); None for other names."""
    m = _NAME_RE.match(name)
    return (m.group(1), int(m.group(2))) if m else None


def list_shards(directory: str | os.PathLike[str], split: str) -> list[Path]:
    """Shards of one split in a folder, in index order."""
    directory = Path(directory)
    found = [(parse_shard_name(p.name), p) for p in directory.glob(f"fineweb_{split}_*.bin")]
    return [p for key, p in sorted((k, p) for k, p in found if k is not None)]


def write_shard(path: str | os.PathLike[str], tokens: np.ndarray) -> int:
    """Write `tokens` (any integer array with values in [0, 65535]) as one shard; returns the byte size."""
    tokens = np.asarray(tokens)
    if tokens.ndim != 1:
        raise ValueError(f"tokens must be 1-D, got shape {tokens.shape}")
    if tokens.size and (int(tokens.min()) < 0 or int(tokens.max()) > MAX_TOKEN_ID):
        raise ValueError(
            f"token ids must fit uint16 [0, {MAX_TOKEN_ID}] for {path}; "
            f"got range [{int(tokens.min())}, {int(tokens.max())}]"
        )
    if tokens.size >= 2**31:
        raise ValueError(f"a shard holds at most 2^31-1 tokens, got {tokens.size}; use smaller shards")
    header = np.zeros(HEADER_INTS, dtype="<i4")
    header[0], header[1], header[2] = SHARD_MAGIC, SHARD_VERSION, tokens.size
    with atomic_writer(path) as f:
        f.write(header.tobytes())
        f.write(tokens.astype(TOKEN_DTYPE, copy=False).tobytes())
    return HEADER_BYTES + 2 * tokens.size


def read_header(path: str | os.PathLike[str]) -> int:
    """Validate a shard's header and size; return its token count."""
    path = Path(path)
    hint = "HINT: re-create it with `pgolf data build` or re-download it with `pgolf data download`."
    if not path.is_file():
        raise FileNotFoundError(f"shard not found: {path}")
    size = path.stat().st_size
    if size < HEADER_BYTES:
        raise ShardError(f"shard {path} is {size} bytes, shorter than its {HEADER_BYTES}-byte header. {hint}")
    header = np.fromfile(path, dtype="<i4", count=HEADER_INTS)
    if int(header[0]) != SHARD_MAGIC:
        raise ShardError(
            f"shard {path} has magic {int(header[0])}, expected {SHARD_MAGIC}: not a token shard. {hint}"
        )
    if int(header[1]) != SHARD_VERSION:
        raise ShardError(
            f"shard {path} has version {int(header[1])}; this harness reads version {SHARD_VERSION}. {hint}"
        )
    count = int(header[2])
    expected = HEADER_BYTES + 2 * count
    if count < 0 or size != expected:
        raise ShardError(
            f"shard {path} declares {count} tokens, so it should be {expected} bytes, but it is {size} bytes "
            f"(truncated or corrupt). {hint}"
        )
    return count


def read_shard(path: str | os.PathLike[str]) -> np.ndarray:
    """Validated, read-only memory map of a shard's tokens (uint16)."""
    count = read_header(path)
    if count == 0:
        return np.zeros(0, dtype=TOKEN_DTYPE)
    return np.memmap(path, dtype=TOKEN_DTYPE, mode="r", offset=HEADER_BYTES, shape=(count,))


def read_split(directory: str | os.PathLike[str], split: str) -> np.ndarray:
    """All tokens of one split concatenated in shard order (a copy; for validation-sized data)."""
    paths = list_shards(directory, split)
    if not paths:
        raise FileNotFoundError(
            f"no {split} shards (fineweb_{split}_NNNNNN.bin) in {directory}; "
            "build a dataset with `pgolf data build` or pass the right --data folder"
        )
    return np.concatenate([np.asarray(read_shard(p)) for p in paths])
