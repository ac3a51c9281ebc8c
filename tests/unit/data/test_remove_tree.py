"""data.io.remove_tree: a folder a sandboxed process wrote goes whole, however deep, and no link is followed."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest

from data.io import remove_tree, temp_folder


def _deep(root: Path, levels: int) -> None:
    fd = os.open(root, os.O_RDONLY)
    for _ in range(levels):
        os.mkdir("d", dir_fd=fd)
        os.close(os.open("f", os.O_CREAT | os.O_WRONLY, dir_fd=fd))
        deeper = os.open("d", os.O_RDONLY, dir_fd=fd)
        os.close(fd)
        fd = deeper
    os.close(fd)


def test_a_folder_deeper_than_the_recursion_limit_goes_whole(tmp_path):
    levels = (
        sys.getrecursionlimit() + 200
    )  # a path of 2,400 bytes and more: past what rmtree recursed through
    (tmp_path / "control").mkdir()
    _deep(tmp_path / "control", levels)
    if sys.version_info < (3, 12):  # the control: the rmtree this project's Python has recurses
        with pytest.raises(RecursionError):
            shutil.rmtree(tmp_path / "control", ignore_errors=True)
    remove_tree(tmp_path / "control")
    assert not (tmp_path / "control").exists()


def test_no_link_is_followed_and_every_kind_of_entry_goes(tmp_path):
    kept = tmp_path / "kept"
    kept.mkdir()
    (kept / "x").write_text("not the worker's")
    tree = tmp_path / "tree"
    for i in range(50):
        (tree / f"w{i}" / "inner").mkdir(parents=True)
        (tree / f"w{i}" / "inner" / "f").write_text("y")
    (tree / "to-folder").symlink_to(kept)
    (tree / "w0" / "inner" / "to-file").symlink_to(kept / "x")
    os.mkfifo(tree / "fifo")
    remove_tree(tree)
    assert not tree.exists() and (kept / "x").read_text() == "not the worker's"
    remove_tree(tmp_path / "missing")  # nothing there: nothing raised
    (tmp_path / "link").symlink_to(kept)
    remove_tree(tmp_path / "link")  # a link given as the folder: left, and what it names too
    assert (kept / "x").exists()


def test_a_temp_folder_goes_however_deep_it_grew():
    with temp_folder("pgolf-test-") as path:
        _deep(path, sys.getrecursionlimit() + 200)
    assert not path.exists()
