"""Small file helpers shared by every phase: atomic writes, hashing, JSON records.

Nothing here knows about tokens or models. A result is never half-written: every writer goes to a
temporary file in the destination folder and is renamed into place.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO

HASH_CHUNK_BYTES = 1 << 20


def sha256_file(path: str | os.PathLike[str]) -> str:
    """Hex sha256 of a file's bytes, read in 1 MiB chunks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(HASH_CHUNK_BYTES):
            h.update(chunk)
    return h.hexdigest()


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@contextlib.contextmanager
def atomic_writer(path: str | os.PathLike[str]) -> Iterator[BinaryIO]:
    """Open a binary temp file beside `path`; on success fsync and rename it onto `path`.

    On any exception the temp file is removed and `path` is left as it was.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def write_bytes_atomic(path: str | os.PathLike[str], data: bytes) -> None:
    with atomic_writer(path) as f:
        f.write(data)


def write_json_atomic(path: str | os.PathLike[str], obj: Any) -> None:
    """Write `obj` as pretty JSON (sorted keys, trailing newline) atomically."""
    text = json.dumps(obj, indent=2, sort_keys=True, allow_nan=False) + "\n"
    write_bytes_atomic(path, text.encode("utf-8"))


def read_regular(path: Path, max_bytes: int | None = None) -> bytes:
    """The bytes of a file another process wrote or an entrant made: opened without following a link (OSError on
    one) and without blocking (a FIFO), refused unless a regular file (ValueError), and one larger than `max_bytes`
    refused by its size, unread; the read is bounded too, should the file grow after its size was taken."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ValueError(f"{path.name} is not a regular file")
        if max_bytes is not None and st.st_size > max_bytes:
            raise ValueError(f"{path.name} is {st.st_size:,} bytes, more than the {max_bytes:,} allowed")
        chunks, size = [], 0
        while chunk := os.read(fd, 1 << 22 if max_bytes is None else min(1 << 22, max_bytes + 1 - size)):
            chunks.append(chunk)
            size += len(chunk)
            if max_bytes is not None and size > max_bytes:
                raise ValueError(f"{path.name} holds more than the {max_bytes:,} bytes allowed")
        return b"".join(chunks)
    finally:
        os.close(fd)


def read_json(path: str | os.PathLike[str], *, what: str = "JSON file") -> Any:
    """Read a JSON file, turning a missing or malformed file into a clear error."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{what} not found: {path}")
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, RecursionError) as e:
        # malformed JSON, bytes not UTF-8, an integer of over 4300 digits (ValueError); deep nesting (RecursionError)
        raise ValueError(
            f"{what} {path} is not valid JSON ({e}); re-create it with the command that wrote it"
        ) from e
