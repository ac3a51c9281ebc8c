"""The byte cap and the folder rules: which files of a submission count, what a folder may hold, and
the check bytes_code + bytes_model <= cap.

Counted code bytes (docs/RULES.md): every file in the submission folder except README.md,
submission.json, logs and results. Concretely excluded: those two names; any path with a part
that is hidden (starts with "."), `__pycache__`, `logs`, `results` or `runs`; files ending in
`.log`, `.pyc`. Everything else counts, byte for byte, including config files and tokenizers.
Each counted file costs its bytes and the bytes of its path (relative, as the file system holds it:
`counted_size`): the staged copy keeps every name and the scored code may list its folder, so a name is
information the model reads (9,998 empty files with 255-byte names carried 2.5 MB past a count of sizes).

The folder rules (`scan_folder`): judged with lstat alone, before any file is opened, so a folder's own
files cannot loosen them. Nothing is ever followed.
- Every entry the walk meets is a regular file or a folder: a symbolic link, FIFO, socket or device is
  refused (`illegal`), wherever it points.
- A regular file has one link (st_nlink == 1): a hard link is the same file as another path, maybe a
  validation shard outside the folder (`illegal`).
- No native extension module (`.so`): it would be imported in place of a checked source (`illegal`).
- No file is larger than the cap, and the counted files together (sizes and paths) are not either
  (`over_cap`), judged from st_size before a byte is read (a sparse 16 GB file is refused in milliseconds).
- At most MAX_DEPTH folders deep and MAX_ENTRIES entries (`illegal`).
- Uncounted folders (hidden, `__pycache__`, logs, results, runs) are skipped whole, never entered;
  uncounted files (README.md, submission.json, logs, bytecode) are skipped. The scan's `files` are the
  counted files, and only they are ever staged, hashed or read: so no `.pyc` is staged or imported.
Code shipped compressed (`CODE_BUNDLE`, docs/RULES.md): a submission may ship some or all of its files
as one xz-compressed tar archive, `code.tar.xz`, at the top of the folder (`tar -cJf code.tar.xz model.py
train.py`). The archive's bytes are what is counted; the harness expands it (`read_bundle`: regular files
only, each path relative, counted and under the folder rules, at most MAX_BUNDLE_EXPANDED_BYTES in all)
into every staged copy before anything is checked or imported. A member and a loose file of the same path
must be byte-identical (a staged folder, which holds both, stages again to itself), else the folder is
refused. `code_bytes` counts a file that is also a member of the archive as the archive's bytes only (the
archive holds the member's path too).
`read_counted` reads one of those files without following a link at any level, checks with fstat that
it is still the regular file of the size the scan saw, and reads at most that many bytes.
"""

from __future__ import annotations

import hashlib
import importlib.machinery
import io
import lzma
import os
import posixpath
import re
import stat
import tarfile
from dataclasses import dataclass
from pathlib import Path

from scoring.errors import SubmissionError
from scoring.statuses import Status

ARTIFACT_CAP_BYTES = 16_000_000
UNCOUNTED_NAMES = frozenset({"README.md", "submission.json"})
UNCOUNTED_DIRS = frozenset({"__pycache__", "logs", "results", "runs"})
UNCOUNTED_SUFFIXES = (".log", ".pyc")
EXTENSION_SUFFIXES = tuple(sorted({*importlib.machinery.EXTENSION_SUFFIXES, ".so", ".pyd"}))
"""Native extension modules: refused (Python would import one in place of a checked source)."""
MAX_DEPTH = 8
"""Most folders deep a file may sit (model.py is at depth 0, pkg/sub.py at depth 1)."""
MAX_ENTRIES = 10_000
"""Most entries (files and folders, skipped folders' contents not included) a folder may hold."""
MAX_FOLDER_BYTES = 1 << 30
"""The size bound of a scan given no cap: no count ever reads unbounded input."""
READ_CHUNK_BYTES = 1 << 20
CODE_BUNDLE = "code.tar.xz"
"""The one archive a submission may ship its code in (top level; xz-compressed tar; expanded when staged)."""
CODE_BUNDLE_FORMAT = "pgolf-code-bundle/1"
"""The bundle's rules, versioned: xz (any preset) around a POSIX/GNU/PAX tar of regular files."""
MAX_BUNDLE_EXPANDED_BYTES = 64 << 20
"""The most bytes a code bundle may expand to (its tar stream, headers included; its members' sizes too)."""
MAX_BUNDLE_XZ_MEMORY_BYTES = 128 << 20
"""The most memory the xz decoder may use (a stream can declare a dictionary of gigabytes)."""
BUNDLE_NAME_RE = re.compile(r"[A-Za-z0-9._+-]{1,255}")
"""One component of a member's path: no control character, space, separator or other script."""


class FolderRefused(SubmissionError):
    """A submission folder breaks a folder rule. `.status` is the run's verdict (illegal, over_cap, or
    error when it cannot be read), `.path` the offending path; the message is one line naming the path and the fix."""

    def __init__(self, status: Status, path: str | os.PathLike[str], message: str):
        self.status, self.path = status, str(path)
        super().__init__(f"{status}: {message}")


class ArtifactTooLarge(ValueError):
    """bytes_code + bytes_model exceeds the cap; the message has every number."""

    def __init__(self, bytes_code: int, bytes_model: int, cap_bytes: int):
        self.bytes_code, self.bytes_model, self.cap_bytes = bytes_code, bytes_model, cap_bytes
        total = bytes_code + bytes_model
        super().__init__(
            f"artifact over the cap: bytes_total {total:,} = bytes_code {bytes_code:,} + bytes_model "
            f"{bytes_model:,} exceeds cap_bytes {cap_bytes:,} by {total - cap_bytes:,} bytes"
        )


def counted_size(rel: str, size_bytes: int) -> int:
    """What one counted file costs against the cap: its bytes and its relative path's bytes (as the file system
    holds the name: os.fsencode). The name reaches the scored code as surely as the contents do."""
    return size_bytes + len(os.fsencode(rel))


def is_counted(rel: Path) -> bool:
    if rel.name in UNCOUNTED_NAMES or rel.name.endswith(UNCOUNTED_SUFFIXES):
        return False
    return not any(part.startswith(".") or part in UNCOUNTED_DIRS for part in rel.parts)


def _skipped_dir(name: str) -> bool:
    return name.startswith(".") or name in UNCOUNTED_DIRS


def _why_skipped(name: str) -> str:
    if name == "__pycache__" or name.endswith(".pyc"):
        return "bytecode: never staged or imported (the checked source is)"
    if name.startswith("."):
        return "hidden: not counted, never staged"
    return "not counted, never staged"


@dataclass(frozen=True)
class FolderFile:
    rel: str
    """Posix path relative to the folder."""
    size_bytes: int
    """st_size as lstat saw it: exactly this many bytes are read."""

    @property
    def counted_bytes(self) -> int:
        """Its bytes and its path's (`counted_size`)."""
        return counted_size(self.rel, self.size_bytes)


@dataclass(frozen=True)
class FolderScan:
    root: Path
    files: tuple[FolderFile, ...]
    """The counted files, sorted by path: what is staged, hashed and counted."""
    skipped: tuple[tuple[str, str], ...]
    """(path, why) of what is never staged: uncounted files and folders, bytecode."""
    cap_bytes: int

    @property
    def bytes_code(self) -> int:
        """The counted files' bytes and paths' bytes (what `code_bytes` counts without a code bundle)."""
        return sum(f.counted_bytes for f in self.files)


def _kind(mode: int) -> str:
    if stat.S_ISLNK(mode):
        return "symbolic link"
    if stat.S_ISFIFO(mode):
        return "FIFO (named pipe)"
    if stat.S_ISSOCK(mode):
        return "socket"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "device file"
    return "special file"


def _refuse_entry(path: Path, st: os.stat_result) -> FolderRefused:
    if stat.S_ISLNK(st.st_mode):
        try:
            target = os.readlink(path)
        except OSError:
            target = "?"
        return FolderRefused(
            Status.ILLEGAL,
            path,
            f"{path} is a symbolic link (to {target!r}); a submission folder holds regular files and folders "
            "only and never follows a link: replace it with a copy of what it points to",
        )
    return FolderRefused(
        Status.ILLEGAL,
        path,
        f"{path} is a {_kind(st.st_mode)}; a submission folder holds regular files and folders only: remove it",
    )


def scan_folder(root: str | os.PathLike[str], *, cap_bytes: int | None = None) -> FolderScan:
    """Walk `root` with lstat alone and apply the folder rules (module docstring); raises FolderRefused.

    `cap_bytes`: no file, and not the counted files together, may exceed it (default MAX_FOLDER_BYTES).
    """
    root = Path(root)
    if not root.is_dir():
        raise FileNotFoundError(f"submission folder not found: {root}")
    cap = MAX_FOLDER_BYTES if cap_bytes is None else int(cap_bytes)
    files: list[FolderFile] = []
    skipped: list[tuple[str, str]] = []
    entries = 0
    total = 0
    todo: list[tuple[Path, str, int]] = [(root, "", 0)]
    while todo:
        folder, prefix, depth = todo.pop()
        try:
            with os.scandir(folder) as it:
                listing = sorted(it, key=lambda e: e.name)
        except OSError as e:
            raise FolderRefused(
                Status.ERROR, folder, f"{folder} cannot be listed ({e.strerror}); make it a readable folder"
            ) from e
        for entry in listing:
            entries += 1
            if entries > MAX_ENTRIES:
                raise FolderRefused(
                    Status.ILLEGAL,
                    root,
                    f"{root} holds more than {MAX_ENTRIES:,} files and folders; remove what the submission "
                    "does not need (logs/, runs/ and hidden folders are skipped, not counted)",
                )
            rel = prefix + entry.name
            path = folder / entry.name
            try:
                st = entry.stat(follow_symlinks=False)
            except OSError as e:
                raise FolderRefused(
                    Status.ERROR, path, f"{path} vanished or cannot be read ({e.strerror}); run again"
                ) from e
            if stat.S_ISDIR(st.st_mode):
                if _skipped_dir(entry.name):
                    skipped.append((rel + "/", _why_skipped(entry.name)))
                elif depth + 1 > MAX_DEPTH:
                    raise FolderRefused(
                        Status.ILLEGAL,
                        path,
                        f"{path} is more than {MAX_DEPTH} folders deep; flatten the submission folder",
                    )
                else:
                    todo.append((path, rel + "/", depth + 1))
                continue
            if not stat.S_ISREG(st.st_mode):
                raise _refuse_entry(path, st)
            if st.st_nlink > 1:
                raise FolderRefused(
                    Status.ILLEGAL,
                    path,
                    f"{path} has {st.st_nlink} hard links: it is the same file as a path elsewhere (perhaps "
                    "outside the folder); replace it with a copy of its own (cp FILE FILE.tmp && mv FILE.tmp FILE)",
                )
            if entry.name.endswith(EXTENSION_SUFFIXES):
                raise FolderRefused(
                    Status.ILLEGAL,
                    path,
                    f"{path} is a native extension module: it would be imported in place of checked Python "
                    "source; remove it (submission code is Python source)",
                )
            if st.st_size > cap:
                raise FolderRefused(
                    Status.OVER_CAP,
                    path,
                    f"{path} is {st.st_size:,} bytes (its size, judged before reading it), over the cap of "
                    f"{cap:,} bytes; remove it or make it smaller",
                )
            if not is_counted(Path(rel)):
                skipped.append((rel, _why_skipped(entry.name)))
                continue
            total += counted_size(rel, st.st_size)
            if total > cap:
                raise FolderRefused(
                    Status.OVER_CAP,
                    root,
                    f"{root}: the counted files come to at least {total:,} bytes with their path names (at "
                    f"{rel}), over the cap of {cap:,} bytes before any model bytes; remove files (README.md, "
                    "submission.json and logs/ are not counted)",
                )
            files.append(FolderFile(rel, st.st_size))
    return FolderScan(root, tuple(sorted(files, key=lambda f: f.rel)), tuple(sorted(skipped)), cap)


def _open_no_follow(root: Path, rel: str) -> int:
    """Open root/rel read-only without following a link at any level below root: a component swapped for
    a link, or the file for a FIFO, since the scan fails to open or is seen by fstat."""
    parts = rel.split("/")
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for part in parts[:-1]:
            nxt = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
            os.close(fd)
            fd = nxt
        return os.open(parts[-1], os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=fd)
    finally:
        os.close(fd)


def read_counted(root: str | os.PathLike[str], f: FolderFile) -> bytes:
    """The bytes of a file the scan saw: never through a link, only a regular file of the size seen,
    at most `f.size_bytes` bytes. Raises FolderRefused when the file changed since the scan."""
    root = Path(root)
    path = root / f.rel
    changed = (
        f"{path} changed while it was being staged (%s); leave the submission folder alone while a run "
        "stages it, and run again"
    )
    try:
        fd = _open_no_follow(root, f.rel)
    except OSError as e:
        raise FolderRefused(
            Status.ILLEGAL, path, changed % f"cannot open it without following a link: {e.strerror}"
        ) from e
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise FolderRefused(Status.ILLEGAL, path, changed % f"it is now a {_kind(st.st_mode)}")
        if st.st_size != f.size_bytes or st.st_nlink > 1:
            raise FolderRefused(
                Status.ILLEGAL,
                path,
                changed
                % f"{st.st_size:,} bytes and {st.st_nlink} link(s), was {f.size_bytes:,} bytes and 1 link",
            )
        chunks: list[bytes] = []
        left = f.size_bytes
        while left > 0:
            chunk = os.read(fd, min(left, READ_CHUNK_BYTES))
            if not chunk:
                raise FolderRefused(Status.ILLEGAL, path, changed % "it ended early")
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def counted_files(submission_dir: str | os.PathLike[str], *, cap_bytes: int | None = None) -> dict[str, str]:
    """{relative posix path: sha256} of every counted file, sorted by path (the folder rules apply)."""
    scan = scan_folder(submission_dir, cap_bytes=cap_bytes)
    return {f.rel: hashlib.sha256(read_counted(scan.root, f)).hexdigest() for f in scan.files}


def read_bundle(data: bytes, where: str | os.PathLike[str]) -> list[tuple[str, bytes]]:
    """The members of a code bundle (`CODE_BUNDLE`): [(relative posix path, bytes)], sorted by path.

    Expands at most MAX_BUNDLE_EXPANDED_BYTES; accepts only regular files (folders are implied and
    skipped) whose paths are relative, normalised, counted, at most MAX_DEPTH deep, not native modules
    and not a bundle again. Anything else raises FolderRefused("illegal", where, ...), naming the fix.
    """
    fix = f"remake it with `tar -cJf {CODE_BUNDLE} FILE...` from inside the submission folder"

    def refuse(what: str) -> FolderRefused:
        return FolderRefused(Status.ILLEGAL, where, f"{where} {what}; {fix}")

    try:
        dec = lzma.LZMADecompressor(format=lzma.FORMAT_XZ, memlimit=MAX_BUNDLE_XZ_MEMORY_BYTES)
        raw = dec.decompress(data, max_length=MAX_BUNDLE_EXPANDED_BYTES + 1)
    except lzma.LZMAError as e:
        raise refuse(f"is not an xz stream ({e})") from e
    if len(raw) > MAX_BUNDLE_EXPANDED_BYTES:
        raise refuse(f"expands to more than {MAX_BUNDLE_EXPANDED_BYTES:,} bytes")
    if not dec.eof:
        raise refuse("is a truncated xz stream")
    if dec.unused_data:
        raise refuse(f"has {len(dec.unused_data):,} bytes after its xz stream")
    members: dict[str, bytes] = {}
    total = 0
    try:
        with tarfile.open(fileobj=io.BytesIO(raw), mode="r:") as tar:
            for info in tar:
                if len(members) >= MAX_ENTRIES:
                    raise refuse(f"holds more than {MAX_ENTRIES:,} files")
                name = info.name
                if info.isdir():
                    continue
                if info.type not in (tarfile.REGTYPE, tarfile.AREGTYPE) or info.sparse is not None:
                    raise refuse(
                        f"holds {name!r}, which is not a plain regular file (links, devices, sparse and "
                        "contiguous members are refused)"
                    )
                parts = name.split("/")
                if (
                    name.startswith("/")
                    or posixpath.normpath(name) != name
                    or any(p in ("", ".", "..") for p in parts)
                ):
                    raise refuse(f"holds {name!r}: a member's path must be relative and normalised")
                if len(name) > 1024 or any(
                    not BUNDLE_NAME_RE.fullmatch(p) for p in name.rstrip("/").split("/")
                ):
                    raise refuse(
                        f"holds {name[:80]!r}: a member's path is folders and a file named with letters, digits "
                        "and . _ + - only, each at most 255 characters"
                    )
                rel = Path(name)
                if not is_counted(rel) or parts[-1] == CODE_BUNDLE:
                    raise refuse(f"holds {name!r}, a path that is never counted or staged")
                if name.endswith(EXTENSION_SUFFIXES):
                    raise refuse(f"holds {name!r}, a native extension module")
                if len(parts) - 1 > MAX_DEPTH:
                    raise refuse(f"holds {name!r}, more than {MAX_DEPTH} folders deep")
                if name in members:
                    raise refuse(f"holds {name!r} twice")
                total += info.size
                if total > MAX_BUNDLE_EXPANDED_BYTES:
                    raise refuse(f"expands to more than {MAX_BUNDLE_EXPANDED_BYTES:,} bytes")
                f = tar.extractfile(info)
                if f is None:
                    raise refuse(f"holds {name!r}, which cannot be read")
                content = f.read(info.size + 1)
                if len(content) != info.size:
                    raise refuse(f"holds {name!r}, whose data is not the size its header says")
                members[name] = content
            end = tar.offset
    except tarfile.TarError as e:
        raise refuse(f"is not a tar archive inside its xz stream ({e})") from e
    if raw[end:].strip(b"\0"):
        raise refuse(
            f"has {len(raw) - end:,} bytes after its last member that are not the end-of-archive zeros "
            "(a header this reader stops at, or data appended)"
        )
    return sorted(members.items())


def same_as_member(root: Path, rel: str, size_bytes: int, member: bytes) -> bool:
    """A loose counted file is the twin of the bundle's member of its path: the same size and bytes (read
    without following a link). The one comparison staging (refuse a differing twin) and counting use."""
    return size_bytes == len(member) and read_counted(root, FolderFile(rel, size_bytes)) == member


def _bundle_members(root: Path) -> dict[str, bytes]:
    st = os.lstat(root / CODE_BUNDLE)
    data = read_counted(root, FolderFile(CODE_BUNDLE, st.st_size))
    return dict(read_bundle(data, root / CODE_BUNDLE))


def code_bytes(submission_dir: str | os.PathLike[str], files: dict[str, str] | None = None) -> int:
    """Bytes shipped: each counted file's size (lstat: a link is never followed, and refused) and its path's
    bytes (`counted_size`), a file that is byte for byte a member of the code bundle counted as the bundle's
    bytes only (its path is inside the bundle)."""
    root = Path(submission_dir)
    rels = [f.rel for f in scan_folder(root).files] if files is None else list(files)
    inside = _bundle_members(root) if CODE_BUNDLE in rels else {}
    total = 0
    for rel in rels:
        st = os.lstat(root / rel)
        if not stat.S_ISREG(st.st_mode):
            raise _refuse_entry(root / rel, st)
        member = inside.get(rel)
        if member is None or not same_as_member(root, rel, st.st_size, member):
            total += counted_size(rel, st.st_size)
    return total


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
