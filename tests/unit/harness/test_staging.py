"""Hostile submission folders against the folder rules (harness/run/staging.py, scoring/artifact/cap.py):
each gets its specific verdict and a one-line message naming the path and the fix, never a traceback,
a hang or a copy of what the folder points at."""

from __future__ import annotations

import importlib.util
import os
import py_compile
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from harness.run.staging import (
    FolderRefused,
    folder_verdict,
    inspect_folder,
    stage_folder,
    stage_model_code,
)
from scoring.artifact import cap
from scoring.artifact.cap import counted_files, read_counted, scan_folder
from scoring.codecheck import lint_scored_code
from tests.conftest import BASELINE

CAP = 16_000_000
MODEL = 'X = "honest"\n\n\ndef build_model(config):\n    return None\n'


@pytest.fixture
def sub(tmp_path: Path) -> Path:
    folder = tmp_path / "sub"
    folder.mkdir()
    (folder / "model.py").write_text(MODEL)
    (folder / "train.py").write_text("def train(ctx):\n    pass\n")
    (folder / "config.toml").write_text("[model]\n")
    (folder / "submission.json").write_text("{}")
    (folder / "README.md").write_text("not counted\n")
    return folder


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """A file outside the submission folder (a validation shard, say)."""
    p = tmp_path / "elsewhere" / "fineweb_val_000000.bin"
    p.parent.mkdir()
    p.write_bytes(b"\x00\x01" * 512)
    return p


def refused(folder: Path, status: str, *needles: str, cap_bytes: int = CAP) -> FolderRefused:
    """Inspect and stage `folder`: both must refuse with `status`, a message holding `needles`, one line,
    and nothing may be staged (the destination is not even made)."""
    with pytest.raises(FolderRefused) as e:
        inspect_folder(folder, cap_bytes=cap_bytes)
    assert e.value.status == status, e.value
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith(f"{status}: "), msg
    for n in needles:
        assert n in msg, msg
    dest = folder.parent / "staged"
    with pytest.raises(FolderRefused) as again:
        stage_folder(folder, dest, cap_bytes=cap_bytes)
    assert again.value.status == status
    assert not dest.exists()  # a refused folder leaves nothing staged
    verdict = folder_verdict(folder, cap_bytes=cap_bytes)
    assert verdict["status"] == status and verdict["detail"] == msg
    return e.value


# ---- links and special files: refused by lstat, never followed or opened ----


def test_a_fifo_is_refused_without_blocking(sub):
    os.mkfifo(sub / "helper.py")
    t0 = time.perf_counter()
    e = refused(sub, "illegal", f"{sub / 'helper.py'} is a FIFO", "remove it")
    assert time.perf_counter() - t0 < 5 and e.path == str(sub / "helper.py")


def test_a_socket_is_refused(sub):
    s = socket.socket(socket.AF_UNIX)
    try:
        s.bind(str(sub / "s.sock"))
        refused(sub, "illegal", "is a socket")
    finally:
        s.close()


def test_a_symlink_to_a_file_outside_is_refused(sub, outside):
    (sub / "tokenizer.bin").symlink_to(outside)
    refused(
        sub,
        "illegal",
        f"{sub / 'tokenizer.bin'} is a symbolic link (to '{outside}')",
        "replace it with a copy",
    )


def test_a_symlink_loop_is_refused(sub):
    (sub / "a.py").symlink_to(sub / "b.py")
    (sub / "b.py").symlink_to(sub / "a.py")
    refused(sub, "illegal", "is a symbolic link")


def test_a_symlink_to_a_folder_is_refused(sub, outside):
    (sub / "data").symlink_to(outside.parent, target_is_directory=True)
    refused(sub, "illegal", f"{sub / 'data'} is a symbolic link")


def test_a_link_inside_a_sub_folder_is_refused(sub, outside):
    (sub / "pkg").mkdir()
    (sub / "pkg" / "shard.bin").symlink_to(outside)
    refused(sub, "illegal", f"{sub / 'pkg' / 'shard.bin'} is a symbolic link")


def test_a_hard_link_to_a_file_outside_is_refused(sub, outside):
    os.link(outside, sub / "val.bin")
    refused(sub, "illegal", f"{sub / 'val.bin'} has 2 hard links", "copy of its own")


def test_a_native_extension_module_is_refused(sub):
    (sub / "einops.so").write_bytes(b"\x7fELF")
    refused(sub, "illegal", "native extension module")


# ---- sizes: judged from st_size before anything is read ----


def test_a_sparse_16_gb_file_is_refused_at_once_and_nothing_is_copied(sub):
    big = sub / "weights.bin"
    with open(big, "wb"):
        pass
    os.truncate(big, 16 * 2**30)
    t0 = time.perf_counter()
    refused(sub, "over_cap", f"{big} is 17,179,869,184 bytes", "over the cap of 16,000,000 bytes")
    assert time.perf_counter() - t0 < 2.0  # refused from its size: never read, never copied


def test_counted_files_over_the_cap_together_are_refused(sub):
    for i in range(3):
        (sub / f"part{i}.bin").write_bytes(b"x" * 400)
    refused(
        sub, "over_cap", "the counted files come to at least", "over the cap of 1,000 bytes", cap_bytes=1000
    )


def test_an_uncounted_file_is_never_counted_but_still_bounded(sub):
    (sub / "README.md").write_bytes(b"x" * 2000)
    refused(sub, "over_cap", "README.md is 2,000 bytes", cap_bytes=1000)


def test_depth_and_entry_count_are_bounded(sub, monkeypatch):
    deep = sub.joinpath(*[f"d{i}" for i in range(cap.MAX_DEPTH + 1)])
    deep.mkdir(parents=True)
    refused(sub, "illegal", "folders deep", "flatten")
    shutil.rmtree(sub / "d0")
    monkeypatch.setattr(cap, "MAX_ENTRIES", 4)
    refused(sub, "illegal", "more than 4 files and folders")


# ---- bytecode: never staged, so it cannot run in place of the checked source ----


def _import_in_fresh_python(folder: Path, module: str, attr: str) -> subprocess.CompletedProcess:
    code = f"import sys; sys.path.insert(0, {str(folder)!r}); import {module} as m; print(getattr(m, {attr!r}, 'real'))"
    return subprocess.run(
        [sys.executable, "-B", "-c", code], capture_output=True, text=True, timeout=60, check=False
    )


def _pyc(source: str, cfile: Path, tmp_path: Path) -> None:
    src = tmp_path / "pyc_src" / "m.py"
    src.parent.mkdir(exist_ok=True)
    src.write_text(source)
    cfile.parent.mkdir(parents=True, exist_ok=True)
    py_compile.compile(
        str(src),
        cfile=str(cfile),
        doraise=True,
        invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH,
    )


def test_a_stale_pycache_pyc_is_not_staged(sub, tmp_path):
    cached = Path(importlib.util.cache_from_source(str(sub / "model.py")))
    _pyc('X = "evil"\n', cached, tmp_path)
    assert _import_in_fresh_python(sub, "model", "X").stdout.strip() == "evil"  # the attack, in place
    record = stage_folder(sub, tmp_path / "staged", cap_bytes=CAP)
    assert "__pycache__/" in record.skipped and "bytecode" in record.skipped["__pycache__/"]
    assert not (tmp_path / "staged" / "__pycache__").exists()
    assert _import_in_fresh_python(tmp_path / "staged", "model", "X").stdout.strip() == "honest"


def test_a_sourceless_pyc_imported_by_model_py_fails_to_import_after_staging(sub, tmp_path):
    (sub / "model.py").write_text("import helper\n\nX = helper.X\n")
    _pyc('X = "unchecked"\n', sub / "helper.pyc", tmp_path)
    assert _import_in_fresh_python(sub, "model", "X").stdout.strip() == "unchecked"
    record = stage_folder(sub, tmp_path / "staged", cap_bytes=CAP)
    assert record.skipped["helper.pyc"].startswith("bytecode")
    r = _import_in_fresh_python(tmp_path / "staged", "model", "X")
    assert r.returncode != 0 and "No module named 'helper'" in r.stderr


def test_an_einops_pyc_cannot_shadow_an_allowed_import(sub, tmp_path):
    _pyc('X = "shadow"\n', sub / "einops.pyc", tmp_path)
    assert _import_in_fresh_python(sub, "einops", "X").stdout.strip() == "shadow"
    record = stage_folder(sub, tmp_path / "staged", cap_bytes=CAP)
    assert "einops.pyc" in record.skipped and "einops.pyc" not in record.files
    assert "shadow" not in _import_in_fresh_python(tmp_path / "staged", "einops", "X").stdout


# ---- sources: strict UTF-8, no foreign coding declaration ----


def test_a_utf7_source_is_refused(sub):
    # Python would decode "+AAo-" as a newline: the comment hides a statement from a UTF-8 reader
    (sub / "model.py").write_bytes(b"# coding: utf-7\n" + MODEL.encode() + b"# +AAo-X = 'evil'\n")
    refused(
        sub,
        "illegal",
        f"{sub / 'model.py'} (line 1) declares the source coding 'utf-7'",
        "save the file as UTF-8",
    )
    assert any("model.py:1: declares the source coding 'utf-7'" in p for p in lint_scored_code(sub))


def test_a_non_utf8_source_is_refused(sub):
    (sub / "pkg").mkdir()
    (sub / "pkg" / "sub.py").write_bytes(b"# caf\xe9\nX = 1\n")
    refused(sub, "illegal", f"{sub / 'pkg' / 'sub.py'} (line 1) is not valid UTF-8 (byte 0xe9")
    assert any(p.startswith("pkg/sub.py:1: is not valid UTF-8") for p in lint_scored_code(sub))


def test_a_utf8_coding_declaration_is_fine(sub, tmp_path):
    (sub / "model.py").write_text("# -*- coding: utf-8 -*-\n" + MODEL)
    assert stage_folder(sub, tmp_path / "staged").files.keys() == {"config.toml", "model.py", "train.py"}


# ---- the static check reads every .py file but train.py ----


def test_a_sub_module_no_entry_file_imports_is_linted(sub):
    (sub / "pkg").mkdir()
    (sub / "pkg" / "__init__.py").write_text("")
    (sub / "pkg" / "sub.py").write_text("import os\n\nP = os.environ\n")
    problems = lint_scored_code(sub)
    assert any(p.startswith("pkg/sub.py:1: imports 'os'") for p in problems), problems


# ---- what is staged is what is counted ----


def test_staging_copies_the_counted_files_exactly(sub, tmp_path):
    (sub / "logs").mkdir()
    (sub / "logs" / "run.txt").write_text("x")
    (sub / ".git").mkdir()
    (sub / "pkg").mkdir()
    (sub / "pkg" / "layers.py").write_text("Y = 2\n")
    record = stage_folder(sub, tmp_path / "staged", cap_bytes=CAP)
    assert record.files == counted_files(sub) == counted_files(tmp_path / "staged")
    assert record.bytes_code == sum((sub / rel).stat().st_size for rel in record.files)
    assert set(record.skipped) == {".git/", "logs/", "README.md", "submission.json"}
    model_code = stage_model_code(sub, tmp_path / "model_code")
    assert sorted(p.relative_to(model_code).as_posix() for p in model_code.rglob("*") if p.is_file()) == [
        "config.toml",
        "model.py",
        "pkg/layers.py",
    ]


def test_the_baseline_stages_to_its_counted_files(tmp_path):
    """The golden run's artifact hashes the counted files: staging the baseline must not change them."""
    record = stage_folder(BASELINE, tmp_path / "staged", cap_bytes=CAP)
    assert record.files == counted_files(BASELINE) == counted_files(tmp_path / "staged")
    assert set(record.files) == {"config.toml", "model.py", "train.py"}


def test_a_file_swapped_after_the_scan_is_refused(sub):
    """No TOCTOU: the copy opens without following links and checks the file is still what the scan saw."""
    scan = scan_folder(sub, cap_bytes=CAP)
    (model,) = [f for f in scan.files if f.rel == "model.py"]
    (sub / "model.py").unlink()
    os.mkfifo(sub / "model.py")
    with pytest.raises(FolderRefused, match=r"changed while it was being staged \(it is now a FIFO"):
        read_counted(sub, model)
    (sub / "model.py").unlink()
    (sub / "model.py").write_text(MODEL + "# grown\n")
    with pytest.raises(FolderRefused, match="changed while it was being staged"):
        read_counted(sub, model)
    (sub / "model.py").unlink()
    (sub / "model.py").symlink_to(sub / "train.py")
    with pytest.raises(FolderRefused, match="without following a link"):
        read_counted(sub, model)


def test_counted_files_never_follows_a_link(sub, outside):
    (sub / "big.bin").symlink_to(outside)
    with pytest.raises(FolderRefused, match="symbolic link"):
        counted_files(sub)


def test_the_verdict_of_a_clean_folder_lists_what_is_skipped(sub, tmp_path):
    os.makedirs(sub / "__pycache__")
    v = folder_verdict(sub, cap_bytes=CAP)
    assert v["status"] == "ok" and v["files"] == ["config.toml", "model.py", "train.py"]
    assert set(v["skipped"]) == {"README.md", "__pycache__/", "submission.json"}
    (tmp_path / "exists").mkdir()
    with pytest.raises(FileExistsError):  # staging never writes into a folder that exists
        stage_folder(sub, tmp_path / "exists")
