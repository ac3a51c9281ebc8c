"""`pgolf new` (harness/commands/scaffold.py): the folder it writes is the baseline's code and presets with a fresh,
valid submission.json; it never overwrites; the default folder is where a pull request wants it."""

from __future__ import annotations

import datetime as dt
import json
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from harness.commands.scaffold import (
    AUTHOR_PLACEHOLDER,
    BLURB_PLACEHOLDER,
    GITHUB_PLACEHOLDER,
    default_out,
    git_author,
    new_submission,
)
from harness.config import load_config
from harness.submission import check_submission
from scoring.artifact.cap import counted_files
from tests.conftest import BASELINE, REPO

TODAY = dt.date(2027, 3, 4)


def test_new_copies_the_baseline_and_writes_valid_metadata(tmp_path: Path) -> None:
    dest = new_submission("my_entry", out=tmp_path / "e", today=TODAY, author="Ada L", cwd=tmp_path)
    meta = check_submission(dest)  # the schema the run validates
    assert meta == {
        "schema_version": 1,
        "name": "my_entry",
        "author": "Ada L",
        "github_id": GITHUB_PLACEHOLDER,
        "date": "2027-03-04",
        "track": "10min_16mb",
        "data_variant": "sp1024",
        "blurb": BLURB_PLACEHOLDER,
        "builds_on": "baselines/naive_baseline",
    }
    # the counted files are the baseline's, byte for byte, but config.toml's comments
    assert set(counted_files(dest)) == set(counted_files(BASELINE))
    for rel in counted_files(BASELINE):
        if rel != "config.toml":
            assert (dest / rel).read_bytes() == (BASELINE / rel).read_bytes(), rel
    # every preset kept: the same TOML data and the same resolved config
    base_toml = tomllib.loads((BASELINE / "config.toml").read_text())
    assert tomllib.loads((dest / "config.toml").read_text()) == base_toml
    for preset in base_toml["presets"]:
        assert load_config(dest, preset).tables == load_config(BASELINE, preset).tables, preset
    assert "baselines/naive_baseline" not in (dest / "config.toml").read_text()
    assert (dest / "README.md").read_text().startswith("# my_entry\n")


def test_new_refuses_to_overwrite(tmp_path: Path) -> None:
    existing = tmp_path / "taken"
    existing.mkdir()
    (existing / "keep.txt").write_text("mine")
    with pytest.raises(FileExistsError, match="already exists"):
        new_submission("x", out=existing, today=TODAY, author="A", cwd=tmp_path)
    assert [p.name for p in existing.iterdir()] == ["keep.txt"]
    (tmp_path / "a_file").write_text("mine")
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")
    for name in ("a_file", "dangling"):
        with pytest.raises(FileExistsError):
            new_submission("x", out=tmp_path / name, today=TODAY, author="A", cwd=tmp_path)
    assert (tmp_path / "a_file").read_text() == "mine"
    assert not (tmp_path / "nowhere").exists()


def test_cli_refusal_is_one_line_and_exit_2(tmp_path: Path) -> None:
    (tmp_path / "submissions" / f"{dt.date.today().isoformat()}_dup").mkdir(parents=True)
    proc = subprocess.run(
        [sys.executable, "-m", "harness.cli", "new", "dup"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)},
        timeout=120,
    )
    assert proc.returncode == 2, proc.stderr
    assert proc.stdout == ""
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "already exists" in lines[0] and "never overwrites" in lines[0]


@pytest.mark.parametrize("name", ["", "My", "a-b", "../up", "a/b", "a b", "_x", "x" * 49, "é"])
def test_bad_names_are_refused_before_anything_is_written(tmp_path: Path, name: str) -> None:
    with pytest.raises(ValueError, match="NAME"):
        new_submission(name, today=TODAY, author="A", cwd=tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_unknown_baseline(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="naive_baseline"):
        new_submission("x", baseline="no_such", today=TODAY, author="A", cwd=tmp_path)


def test_from_a_folder_path_and_builds_on(tmp_path: Path) -> None:
    first = new_submission("one", out=tmp_path / "one", today=TODAY, author="A", cwd=tmp_path)
    second = new_submission(
        "two", baseline=str(first), out=tmp_path / "two", today=TODAY, author="A", cwd=tmp_path
    )
    assert json.loads((second / "submission.json").read_text())["builds_on"] == str(first)
    assert (second / "model.py").read_bytes() == (BASELINE / "model.py").read_bytes()


def test_default_folder(tmp_path: Path) -> None:
    assert default_out("e", TODAY, tmp_path) == tmp_path / "2027-03-04_e"
    (tmp_path / "submissions").mkdir()
    assert default_out("e", TODAY, tmp_path) == tmp_path / "submissions" / "2027-03-04_e"
    dest = new_submission("e", today=TODAY, author="A", cwd=tmp_path)
    assert dest == tmp_path / "submissions" / "2027-03-04_e"
    assert "pgolf run submissions/2027-03-04_e --preset cpu-smoke" in (dest / "config.toml").read_text()


def test_author_from_git_config_else_placeholder(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "GIT_CONFIG_NOSYSTEM": "1"}
    subprocess.run(["git", "init", "-q"], cwd=repo, check=True, env=env)
    subprocess.run(["git", "config", "user.name", "Grace H"], cwd=repo, check=True, env=env)
    assert git_author(repo) == "Grace H"
    dest = new_submission("g", out=tmp_path / "g", today=TODAY, cwd=repo)
    assert json.loads((dest / "submission.json").read_text())["author"] == "Grace H"
    bare = tmp_path / "bare"
    bare.mkdir()
    monkey_env = {"HOME": str(bare), "GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": str(bare / "none")}
    with pytest.MonkeyPatch.context() as mp:
        for k, v in monkey_env.items():
            mp.setenv(k, v)
        dest = new_submission("h", out=tmp_path / "h", today=TODAY, cwd=bare)
    assert json.loads((dest / "submission.json").read_text())["author"] == AUTHOR_PLACEHOLDER


def test_the_suggested_first_run_uses_a_preset_the_baseline_has(tmp_path: Path, capsys) -> None:
    """cpu_mtp has presets cpu and tiny, no cpu-smoke: the next-step line and the README name tiny."""
    import argparse

    from harness.commands.scaffold import cmd_new, first_preset

    assert first_preset(BASELINE) == "cpu-smoke"
    assert first_preset(REPO / "baselines" / "cpu_mtp") == "tiny"
    assert first_preset(tmp_path) is None  # no config.toml: no preset to suggest
    out = tmp_path / "m"
    cmd_new(argparse.Namespace(name="m", from_baseline="cpu_mtp", out=str(out)))
    said = capsys.readouterr().out
    assert f"next: pgolf check {out} --preset tiny && pgolf run {out} --preset tiny" in said, said
    assert "cpu-smoke" not in said and "cpu-smoke" not in (out / "README.md").read_text()
    assert f"pgolf run {out} --preset tiny" in (out / "README.md").read_text()
