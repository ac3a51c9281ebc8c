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


@contextlib.contextmanager
def open_regular(path: str | os.PathLike[str]) -> Iterator[tuple[int, os.stat_result] | None]:
    """(descriptor, fstat) of a file another process wrote or an entrant made, opened without following a link and
    without blocking (a FIFO), closed on leaving; None when it cannot be opened so or is no regular file."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        yield None
        return
    try:
        st = os.fstat(fd)
        yield (fd, st) if stat.S_ISREG(st.st_mode) else None
    finally:
        os.close(fd)


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


_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def _open_folder(name: str | os.PathLike[str], dir_fd: int | None = None) -> int:
    """A folder to empty, made the owner's to change (a process that ran as this user may have locked it: 000)."""
    try:
        fd = os.open(name, _DIR_FLAGS, dir_fd=dir_fd)
    except PermissionError:
        os.chmod(name, stat.S_IRWXU, dir_fd=dir_fd)
        fd = os.open(name, _DIR_FLAGS, dir_fd=dir_fd)
    with contextlib.suppress(OSError):
        os.fchmod(fd, stat.S_IRWXU)
    return fd


def _empty_but_folders(fd: int) -> list[str]:
    """Unlink every entry of the open folder that is not a folder; the names of its folders."""
    folders = []
    try:
        with os.scandir(fd) as entries:
            for entry in entries:
                try:
                    if entry.is_dir(follow_symlinks=False):
                        folders.append(entry.name)
                    else:
                        os.unlink(entry.name, dir_fd=fd)
                except OSError:
                    continue
    except OSError:
        pass
    return folders


def remove_tree(path: str | os.PathLike[str]) -> None:
    """Remove a folder a sandboxed process wrote, however deep; never raises (what cannot go stays).

    shutil.rmtree of Python 3.11 calls itself once per level, so a folder 3,000 levels deep (a model worker
    made one in its own temp folder) raised RecursionError, which ignore_errors does not cover, out of the
    scorer's close of that worker. This walks down and back up holding one folder open at a time, by
    descriptor (no path grows with the depth), never through a link, and stops if a folder it climbs back to
    is not the one it came down from."""
    try:
        fd = _open_folder(path)
    except OSError:
        return
    # (name in the parent, the parent's (device, inode), the parent's folders still to remove)
    above: list[tuple[str, tuple[int, int], list[str]]] = []
    pending = _empty_but_folders(fd)
    try:
        while True:
            if pending:
                name = pending.pop()
                try:
                    child = _open_folder(name, dir_fd=fd)
                except OSError:
                    continue
                st = os.fstat(fd)
                above.append((name, (st.st_dev, st.st_ino), pending))
                os.close(fd)
                fd = child
                pending = _empty_but_folders(fd)
                continue
            if not above:
                break
            name, parent_id, pending = above.pop()
            parent = os.open("..", _DIR_FLAGS, dir_fd=fd)
            os.close(fd)
            fd = parent
            st = os.fstat(fd)
            if (st.st_dev, st.st_ino) != parent_id:
                return  # moved while it was walked: nothing more is removed
            with contextlib.suppress(OSError):
                os.rmdir(name, dir_fd=fd)
    except OSError:
        return
    finally:
        os.close(fd)
    with contextlib.suppress(OSError):
        os.rmdir(path)


@contextlib.contextmanager
def temp_folder(prefix: str) -> Iterator[Path]:
    """A fresh temp folder for a sandboxed phase to write in, removed with `remove_tree` however deep it grew
    (tempfile.TemporaryDirectory's cleanup is shutil.rmtree: RecursionError on a deep one)."""
    path = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        yield path
    finally:
        remove_tree(path)
