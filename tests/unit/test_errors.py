"""scoring/errors.py: the domain errors as one hierarchy, the command lines' exit codes, and "did you mean".

A user error (bad input) prints one line and exits 2; a programming error (TypeError, KeyError, ...) is a
bug and keeps its traceback: before the hierarchy, both command lines caught TypeError as a user error.
"""

from __future__ import annotations

import argparse

import pytest

from harness.config import load_config
from scoring.errors import (
    USER_EXIT_CODE,
    ArtifactError,
    ConfigError,
    DataError,
    PgolfError,
    SubmissionError,
    close_match,
    did_you_mean,
    exit_code_of,
)
from tests.conftest import BASELINE


def test_the_hierarchy_and_its_exit_codes():
    for cls in (ConfigError, DataError, SubmissionError, ArtifactError):
        assert issubclass(cls, PgolfError) and issubclass(cls, ValueError)
        assert exit_code_of(cls("x")) == USER_EXIT_CODE == 2
    assert exit_code_of(ValueError("x")) == 2  # the plain ValueError of data/ and harness/train/: still input
    assert exit_code_of(FileNotFoundError("x")) == 2 and exit_code_of(FileExistsError("x")) == 2
    for bug in (TypeError("x"), KeyError("x"), AttributeError("x"), RuntimeError("x"), OSError("x")):
        assert exit_code_of(bug) is None


def test_the_domain_errors_are_the_hierarchys(tmp_path):
    from scoring.artifact.cap import FolderRefused
    from scoring.artifact.format import ArtifactError as FormatArtifactError
    from scoring.artifact.format import read_artifact
    from scoring.codecheck import CodeCheckFailure
    from scoring.tracks import get_track

    assert FormatArtifactError is ArtifactError
    assert issubclass(FolderRefused, SubmissionError) and issubclass(CodeCheckFailure, SubmissionError)
    (tmp_path / "a.bin").write_bytes(b"not an artifact")
    with pytest.raises(ArtifactError):
        read_artifact(tmp_path / "a.bin")
    with pytest.raises(ConfigError, match="unknown key 'train.matrix_lrr'"):
        load_config(BASELINE, "cpu-smoke", ["train.matrix_lrr=0.1"])
    with pytest.raises(ConfigError, match="unknown track 'nope'"):
        get_track("nope")
    from harness.submission import validate_metadata
    from scoring.score.audit import cmd_audit_tokenizer

    (tmp_path / "docs.jsonl").write_text("")
    args = argparse.Namespace(model="byte260", docs=str(tmp_path / "docs.jsonl"), field="text", max_docs=0)
    with pytest.raises(DataError, match="docs.jsonl holds no documents with a 'text' field"):
        cmd_audit_tokenizer(args)

    with pytest.raises(SubmissionError, match="submission.json: expected a JSON object"):
        validate_metadata([], "submission.json")


@pytest.mark.parametrize("cli", ["harness.cli", "scoring.score.cli"])
def test_a_user_error_is_one_line_and_a_bug_keeps_its_traceback(cli, capsys):
    import importlib

    run_command = importlib.import_module(cli).run_command

    def raising(exc):
        def func(_args):
            raise exc

        return argparse.Namespace(func=func, command="x")

    assert run_command(raising(ConfigError("config.toml: run.seed = -1 must be >= 0"))) == 2
    assert capsys.readouterr().err == "error: config.toml: run.seed = -1 must be >= 0\n"
    assert run_command(raising(ValueError("a plain one"))) == 2
    with pytest.raises(TypeError, match="unsupported operand"):  # exit 2 and one line before: a bug hidden
        run_command(raising(TypeError("unsupported operand")))
    with pytest.raises(KeyError):
        run_command(raising(KeyError("status")))
    assert capsys.readouterr().err == "error: a plain one\n"


def test_close_match_is_a_typo_never_a_guess():
    assert close_match("warmup_step", ["warmup_steps", "warmdown_iters"]) == "warmup_steps"
    assert close_match("zzz", ["warmup_steps", "matrix_lr"]) is None
    assert did_you_mean("modle", ["model", "train"]) == " (did you mean model?)"
    assert did_you_mean("qqqq", ["model", "train"]) == ""


@pytest.mark.parametrize(
    "overrides, preset, message",
    [
        (
            ["train.matrix_lrr=0.1"],
            "cpu-smoke",
            "unknown key 'train.matrix_lrr' (did you mean train.matrix_lr?)",
        ),
        (
            ["model.matrix_lr=0.1"],
            "cpu-smoke",
            "unknown key 'model.matrix_lr' (did you mean train.matrix_lr?)",
        ),
        (
            ["budgte.train_s=1"],
            "cpu-smoke",
            "unknown section 'budgte' in 'budgte.train_s' (did you mean budget?)",
        ),
        (["run.track='10min_16m'"], "cpu-smoke", "is not a track (did you mean 10min_16mb?)"),
        ([], "cpu-smok", "no preset 'cpu-smok' (did you mean cpu-smoke?)"),
    ],
)
def test_unknown_names_in_a_config_get_the_close_match(overrides, preset, message):
    with pytest.raises(ConfigError) as e:
        load_config(BASELINE, preset, overrides)
    assert message in str(e.value)


def test_no_hint_where_nothing_is_close(tmp_path):
    with pytest.raises(ConfigError) as e:
        load_config(BASELINE, "cpu-smoke", ["train.qqqqqq=1"])
    assert "unknown key 'train.qqqqqq'; keys of [train] are: " in str(e.value) and "did you mean" not in str(
        e.value
    )
    (tmp_path / "config.toml").write_text("[modle]\nx = 1\n")
    with pytest.raises(ConfigError, match=r"unknown table\(s\) \['modle'\] \(did you mean model\?\)"):
        load_config(tmp_path)


def test_a_mistyped_command_gets_the_close_match(capsys):
    from harness.cli import main

    with pytest.raises(SystemExit) as e:
        main(["scroe", "x.bin"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and "invalid choice: 'scroe' (did you mean score?)" in err
    with pytest.raises(SystemExit):
        main(["qqqqq"])
    assert "did you mean" not in capsys.readouterr().err
