"""End to end: `pgolf new` then `pgolf check` (harness/commands/scaffold.py, harness/commands/preflight.py) as a user runs
them, in processes: the scaffold passes every check; a forward of the wrong shape fails the model check
(built in the confined child), and a codec whose payload is over the cap fails the artifact check, each
with exit status 1 and the right line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO

PADDING_CODEC = '''"""A codec that pads its payload past the cap (a test of pgolf check)."""
from safetensors.torch import load, save

NAME = "padded"
VERSION = 1
PAD_BYTES = 16_000_001


def encode(state):
    return save(state) + bytes(PAD_BYTES)


def decode(payload):
    return load(payload[: len(payload) - PAD_BYTES])
'''


def _pgolf(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "PG_DATA_DIR"}
    env["PYTHONPATH"] = str(REPO)
    return subprocess.run(
        [sys.executable, "-m", "harness.cli", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )


def _checks(proc: subprocess.CompletedProcess[str]) -> dict[str, dict]:
    out = json.loads(proc.stdout)
    assert out["format"] == "pg-check" and out["format_version"] == 1
    return {c["name"]: c for c in out["checks"]}


@pytest.mark.slow
@pytest.mark.long
def test_new_then_check_passes_and_broken_folders_fail_the_right_check(tmp_path: Path) -> None:
    (tmp_path / "submissions").mkdir()
    made = _pgolf("new", "probe", "--out", "entry", cwd=tmp_path)
    assert made.returncode == 0, made.stderr
    entry = tmp_path / "entry"

    ok = _pgolf("check", "entry", "--preset", "tiny", "--json", cwd=tmp_path)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    checks = _checks(ok)
    assert list(checks) == ["submission", "config", "folder", "lint", "model", "artifact"]
    assert checks["submission"]["status"] == "warn"  # the placeholders pgolf new leaves are named
    assert "github_id, blurb" in checks["submission"]["detail"]
    assert all(c["status"] == "ok" for c in list(checks.values())[1:]), ok.stdout
    assert "forward [2, 32] int64 -> logits [2, 32, 1024]" in checks["model"]["detail"]
    art = checks["artifact"]
    assert art["bytes_total"] == art["bytes_code"] + art["bytes_model"]
    assert art["bytes_code"] == sum(
        (entry / f).stat().st_size + len(f) for f in ("model.py", "train.py", "config.toml")
    )  # each file's bytes and its name's; README.md and submission.json are not counted
    assert 0 < art["bytes_model"] < art["bytes_model_dense"] < art["cap_bytes"] == 16_000_000

    # a forward that drops the last position: the model check, from the confined child, names the shape
    model = (entry / "model.py").read_text()
    (entry / "model.py").write_text(
        model.replace("def build_model(", "def _build(", 1)
        + (
            "\n\nclass _Chop(nn.Module):\n"
            "    def __init__(self, inner):\n        super().__init__()\n        self.inner = inner\n\n"
            "    def forward(self, x):\n        return self.inner(x)[:, :-1]\n\n\n"
            "def build_model(config):\n    return _Chop(_build(config))\n"
        )
    )
    bad = _pgolf("check", "entry", "--preset", "tiny", cwd=tmp_path)  # the text a person reads
    assert bad.returncode == 1, bad.stdout + bad.stderr
    lines = bad.stdout.splitlines()
    assert [ln.split()[:2] for ln in lines if not ln.startswith(" ")][:6] == [
        ["warn", "submission"], ["ok", "config"], ["ok", "folder"], ["ok", "lint"], ["FAIL", "model"],
        ["skip", "artifact"],
    ]  # fmt: skip
    model_line = next(ln for ln in lines if ln.startswith("FAIL  model"))
    assert "returned shape [2, 31, 1024]; expected [2, 32, V]" in model_line
    assert lines[lines.index(model_line) + 1].strip().startswith("fix: fix model.py")
    assert lines[-1].startswith("2 of 6 checks did not pass")
    (entry / "model.py").write_text(model)

    # a codec whose payload alone is over the cap: the artifact check fails with the bytes
    (entry / "codec.py").write_text(PADDING_CODEC)
    over = _pgolf(
        "check", "entry", "--preset", "tiny", "--set", "pack.codec='submission'", "--json", cwd=tmp_path
    )
    assert over.returncode == 1, over.stdout + over.stderr
    art = _checks(over)["artifact"]
    assert art["status"] == "FAIL" and "over the cap by" in art["detail"] and art["fix"]
    assert art["bytes_model"] > 16_000_001 and art["bytes_total"] > art["cap_bytes"]
