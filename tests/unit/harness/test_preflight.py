"""`pgolf check`'s pure parts (harness/commands/preflight.py): the vocabulary of a data variant, the dense state
of the size estimate, and a check that needs no model process (the config and schema failures, exit 1;
usage errors, exit 2). The checks that build a model in the confined child: tests/e2e/test_new_then_check.py."""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

import pytest
import torch

from harness.commands.preflight import (
    EXIT_FAILED,
    EXIT_USAGE,
    cmd_check,
    dense_state,
    run_checks,
    vocab_of_variant,
)
from harness.run.staging import stage_folder
from tests.conftest import BASELINE


def test_vocab_of_variant() -> None:
    assert vocab_of_variant("sp1024") == 1024
    assert vocab_of_variant("sp8192") == 8192
    assert vocab_of_variant("byte260") == 260


def test_dense_state_replaces_floats_only_deterministically() -> None:
    state = {
        "w": torch.zeros(3, 4),
        "h": torch.ones(5, dtype=torch.float16),
        "step": torch.tensor([7], dtype=torch.int64),
    }
    a, b = dense_state(state), dense_state(state)
    assert a.keys() == state.keys()
    for k in state:
        assert a[k].shape == state[k].shape and a[k].dtype == state[k].dtype
        assert torch.equal(a[k], b[k])
    assert torch.equal(a["step"], state["step"])
    assert a["w"].std() > 0.5 and a["h"].float().std() > 0.5  # N(0, 1), not the constants


def _folder(tmp_path: Path) -> Path:
    dest = tmp_path / "entry"
    stage_folder(BASELINE, dest)
    shutil.copy(BASELINE / "submission.json", dest / "submission.json")
    return dest


def test_bad_preset_key_fails_config_and_skips_the_model(tmp_path: Path) -> None:
    d = _folder(tmp_path)
    cfg = (d / "config.toml").read_text().replace("model.num_layers = 2", "model.num_layerz = 2")
    (d / "config.toml").write_text(cfg)
    checks = {c.name: c for c in run_checks(d, "tiny")}
    assert checks["submission"].status == "ok"
    assert checks["config"].status == "FAIL"
    assert "unknown key 'model.num_layerz'" in checks["config"].detail
    assert "[presets.tiny]" in checks["config"].detail
    assert checks["config"].fix
    assert checks["folder"].status == "ok" and checks["lint"].status == "ok"
    assert checks["model"].status == checks["artifact"].status == "skip"


def test_bad_submission_json_fails_the_schema_check(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    d = _folder(tmp_path)
    meta = json.loads((d / "submission.json").read_text())
    del meta["blurb"]
    meta["date"] = "yesterday"
    (d / "submission.json").write_text(json.dumps(meta))
    args = argparse.Namespace(submission=str(d), preset="tiny", set=[], json=True, sandbox="auto", data=None)
    assert cmd_check(args) == EXIT_FAILED
    out = json.loads(capsys.readouterr().out)
    assert out["format"] == "pg-check" and out["ok"] is False
    by_name = {c["name"]: c for c in out["checks"]}
    assert by_name["submission"]["status"] == "FAIL"
    assert "'blurb' is required" in by_name["submission"]["detail"]
    assert by_name["config"]["status"] == "ok"  # still checked: one run shows every independent problem
    assert by_name["model"]["status"] == "skip" and "submission" in by_name["model"]["detail"]


def test_a_scored_file_that_breaks_the_lint_is_named(tmp_path: Path) -> None:
    d = _folder(tmp_path)
    (d / "model.py").write_text((d / "model.py").read_text() + "\nimport os\n")
    checks = {c.name: c for c in run_checks(d, "tiny")}
    assert (
        checks["lint"].status == "FAIL"
        and "model.py" in checks["lint"].detail
        and "os" in checks["lint"].detail
    )
    assert checks["model"].status == "skip"


def test_a_symlink_fails_the_folder_check(tmp_path: Path) -> None:
    d = _folder(tmp_path)
    (d / "data.bin").symlink_to("/etc/hostname")
    checks = {c.name: c for c in run_checks(d, "tiny")}
    assert checks["folder"].status == "FAIL" and "symbolic link" in checks["folder"].detail
    assert checks["model"].status == "skip"


def test_usage_errors_exit_2(tmp_path: Path) -> None:
    from harness.cli import main

    assert main(["check", str(tmp_path / "missing")]) == EXIT_USAGE
    assert main(["check", str(BASELINE), "--set", "no_equals_sign"]) == EXIT_USAGE


def _rewriting_report(tmp_path: Path, report: dict[str, object]) -> Path:
    """The baseline, whose model.py (past the lint: a string annotation) rewrites the child's report.json at exit."""
    from tests.unit.harness.test_sample_unpack_sandbox import smuggling

    d = _folder(tmp_path)
    text = json.dumps(report).replace("\\", "\\\\")
    expr = (
        "__import__('atexit').register(lambda: open(__import__('json').loads(__import__('sys').argv[-1])['out']"
        f" + '/report.json', 'w').write({text!r}))"
    )
    src = (d / "model.py").read_text().replace("import torch\n", "import typing\n\nimport torch\n", 1)
    (d / "model.py").write_text(src + smuggling(expr) + "\n\nsmuggle()\n")
    return d


@pytest.mark.parametrize(
    ("field", "value", "why"),
    [
        (
            "input",
            "\x1b[2J\x1b[H\x1b]0;pwned\x07ok    everything",
            "input is not the [2, 32] batch it was given",
        ),
        ("params", "\x1b[31m1", "params is not a count"),
        ("shape", [2, 32, 10**9], "shape [2, 32, 1000000000] is not [2, 32, V] with 1024 <= V <= 2048"),
        ("output", "\x1b[2K", "output is not one of"),
    ],
)
def test_a_report_the_submitted_code_rewrote_is_one_line_never_printed(
    tmp_path: Path, field, value, why
) -> None:
    """The model's exit handler rewrites the child's report: its fields were printed raw on the model line (an
    ESC sequence cleared the official's terminal, set its title, wrote "ok" lines of its own)."""
    report = {"params": 1, "input": [2, 32], "shape": [2, 32, 1024], "output": "logits", field: value}
    checks = {c.name: c for c in run_checks(_rewriting_report(tmp_path, report), "tiny")}
    assert checks["lint"].status == "ok"
    model = checks["model"]
    assert model.status == "FAIL" and "\x1b" not in model.line()
    assert model.detail.startswith(f"the confined build wrote a report that is not its build's: {why}")
