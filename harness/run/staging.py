"""Staging submission code: the one way the harness inspects and copies a submission folder.

Every copy of submission code the harness makes goes through `stage_folder`: the training stage
(harness/run/train_phase.py), the copy that is packed, counted and kept in RUN_DIR/code, the scored
code without train.py (`stage_model_code`: the score phase and `pgolf verify`). A submission's own
files cannot loosen the rules, because they are judged by lstat before anything is opened:

- the folder rules of scoring/artifact/cap.py (`scan_folder`): regular files and folders only (no
  symbolic link, FIFO, socket or device), no hard link (st_nlink > 1), no native extension module,
  each file and the counted files together (sizes and path names) within the cap by st_size, depth and
  entry count bounded,
  uncounted folders (hidden, __pycache__, logs, results, runs) and files (README.md,
  submission.json, *.log, *.pyc) skipped: what is staged is exactly the counted files, so no bytecode
  is ever staged and nothing stale can be imported in place of a checked source;
- a code bundle (`code.tar.xz`, scoring/artifact/cap.py `read_bundle`) is expanded into the copy, its
  members under the same rules; the bundle's bytes are what is counted (`code_bytes`);
- every `.py` source is strict UTF-8 with no coding declaration but utf-8 (scoring/codecheck.py
  `source_encoding_problem`): otherwise Python would run other code than the static check reads.

A file is copied by opening it with O_RDONLY|O_NOFOLLOW|O_NONBLOCK (each folder on its path too),
checking with fstat that it is still the regular file of the size the scan saw, and reading at most
that many bytes; the copy is written with O_EXCL|O_NOFOLLOW into a folder that did not exist. So what
was staged is what gets counted, hashed, checked and run: `StagingRecord.files` has the sha256 of the
bytes written. A refusal raises FolderRefused (a ValueError) whose `.status` is the run's verdict
("illegal", "over_cap", or "error" when the folder cannot be read) and whose message is one line
naming the path and the fix.
"""

from __future__ import annotations

import fnmatch
import hashlib
import os
import shutil
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.api import TRAIN_FILE
from scoring.artifact.cap import (
    CODE_BUNDLE,
    FolderFile,
    FolderRefused,
    FolderScan,
    read_bundle,
    read_counted,
    same_as_member,
    scan_folder,
)
from scoring.codecheck import source_encoding_problem
from scoring.statuses import Status

__all__ = [
    "FolderRefused",
    "StagingRecord",
    "folder_verdict",
    "inspect_folder",
    "stage_folder",
    "stage_model_code",
]

MODEL_CODE_EXCLUDE = (TRAIN_FILE, CODE_BUNDLE)
"""What the scorer never gets of the staged code: the training code (top-level train.py), nor the code
bundle that may hold it (its other members are expanded into the scorer's copy)."""


@dataclass(frozen=True)
class StagingRecord:
    source: str
    dest: str
    files: dict[str, str]
    """{relative path: sha256} of every file written, sorted: exactly the bytes staged."""
    bytes_code: int
    """Bytes written (the staged files' contents; the cap counts paths too: scoring/artifact/cap.py code_bytes)."""
    skipped: dict[str, str]
    """{relative path: why} of what was not staged: uncounted files and folders, bytecode, exclusions."""

    def as_dict(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "dest": self.dest,
            "files": dict(self.files),
            "bytes_code": self.bytes_code,
            "skipped": dict(self.skipped),
        }


def _check_source(root: Path, f: FolderFile, data: bytes) -> None:
    if f.rel.endswith(".py"):
        bad = source_encoding_problem(data)
        if bad is not None:
            raise FolderRefused(Status.ILLEGAL, root / f.rel, f"{root / f.rel} (line {bad[0]}) {bad[1]}")


def inspect_folder(root: str | os.PathLike[str], *, cap_bytes: int | None = None) -> FolderScan:
    """Apply every folder rule to `root` without copying anything; raises FolderRefused.

    Only the stat rules are judged before a byte is read; then each `.py` source (at most its size seen,
    never through a link) is checked for its encoding.
    """
    scan = scan_folder(root, cap_bytes=cap_bytes)
    names = {f.rel for f in scan.files}
    for f in scan.files:
        if f.rel.endswith(".py") or f.rel == CODE_BUNDLE:  # each source's encoding; the bundle's members
            names.update(rel for rel, _ in _expand(scan, f, read_counted(scan.root, f)))
    _check_paths(scan.root, names)
    return scan


def _check_paths(root: Path, names: set[str]) -> None:
    """No path is both a file and a folder (a bundle member `pkg/x.py` beside a file `pkg`)."""
    for rel in sorted(names):
        parts = rel.split("/")
        for i in range(1, len(parts)):
            if "/".join(parts[:i]) in names:
                raise FolderRefused(
                    Status.ILLEGAL,
                    root / rel,
                    f"{root / rel} needs {'/'.join(parts[:i])!r} to be a folder, but it is a file (in "
                    f"{CODE_BUNDLE} or beside it); rename one of them",
                )


def _expand(scan: FolderScan, f: FolderFile, data: bytes) -> list[tuple[str, bytes]]:
    """[(relative path, bytes)] a counted file stands for in a staged copy, each source checked: itself,
    or for the code bundle its members (and itself). A member must equal a loose file of its path."""
    if f.rel != CODE_BUNDLE:
        _check_source(scan.root, f, data)
        return [(f.rel, data)]
    where = scan.root / CODE_BUNDLE
    members = read_bundle(data, where)
    loose = {g.rel: g for g in scan.files}
    for rel, content in members:
        if rel in loose and not same_as_member(scan.root, rel, loose[rel].size_bytes, content):
            raise FolderRefused(
                Status.ILLEGAL,
                scan.root / rel,
                f"{scan.root / rel} is also in {where} with other bytes; keep one copy (in the bundle or "
                "beside it)",
            )
        _check_source(scan.root, FolderFile(rel, len(content)), content)
    return [*members, (f.rel, data)]


def folder_verdict(root: str | os.PathLike[str], *, cap_bytes: int | None = None) -> dict[str, Any]:
    """inspect_folder as a record for result.json: status "ok" (with what will be staged and skipped) or the
    refusal's status and one-line detail. Never raises for a folder rule."""
    t0 = time.perf_counter()
    try:
        scan = inspect_folder(root, cap_bytes=cap_bytes)
    except FolderRefused as e:
        return {"status": e.status, "path": e.path, "detail": str(e), "time_s": time.perf_counter() - t0}
    return {
        "status": Status.OK,
        "files": [f.rel for f in scan.files],
        "bytes_code": scan.bytes_code,
        "skipped": dict(scan.skipped),
        "cap_bytes": scan.cap_bytes,
        "time_s": time.perf_counter() - t0,
    }


def _excluded(rel: str, patterns: Iterable[str]) -> bool:
    return any(fnmatch.fnmatchcase(rel, p) for p in patterns)


def _write_new(path: Path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
    finally:
        os.close(fd)


def stage_folder(
    src: str | os.PathLike[str],
    dest: str | os.PathLike[str],
    *,
    cap_bytes: int | None = None,
    exclude: Iterable[str] = (),
) -> StagingRecord:
    """Copy the counted files of `src` into the new folder `dest`, every folder rule applied first.

    `exclude`: fnmatch patterns on the relative posix path ("train.py" is the top-level one only) of
    counted files not to stage. `dest` must not exist; it is made only once every file was read and
    checked, so a refused folder leaves nothing staged. Raises FolderRefused.
    """
    patterns = tuple(exclude)
    scan = scan_folder(src, cap_bytes=cap_bytes)
    skipped = dict(scan.skipped)
    staged: list[tuple[str, bytes]] = []
    expanded: dict[str, bytes] = {}
    for f in scan.files:  # every byte read and checked (at most the cap in all) before anything is written
        if f.rel in expanded:
            continue  # a loose file equal to its bundle member: staged once
        for rel, data in _expand(scan, f, read_counted(scan.root, f)):
            expanded[rel] = data
    _check_paths(scan.root, set(expanded))
    for rel, data in sorted(expanded.items()):
        if _excluded(rel, patterns):
            skipped[rel] = "excluded by the stage (not for this process)"
            continue
        staged.append((rel, data))
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=False)
    try:
        for rel, data in staged:
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            _write_new(dest / rel, data)
    except BaseException:
        shutil.rmtree(dest, ignore_errors=True)
        raise
    files = {rel: hashlib.sha256(data).hexdigest() for rel, data in staged}
    total = sum(len(data) for _, data in staged)
    return StagingRecord(str(scan.root), str(dest), files, total, dict(sorted(skipped.items())))


def stage_model_code(
    submission_dir: str | os.PathLike[str], dest: str | os.PathLike[str], *, cap_bytes: int | None = None
) -> Path:
    """Stage the folder without its training code: what the scorer may see. Returns `dest`."""
    stage_folder(submission_dir, dest, cap_bytes=cap_bytes, exclude=MODEL_CODE_EXCLUDE)
    return Path(dest)
