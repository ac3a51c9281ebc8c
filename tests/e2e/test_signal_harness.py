"""Submitted training code cannot stop `pgolf run` with SIGTERM to get `interrupted` instead of its status.

SIGTERM to `pgolf run` ends the run `interrupted` (harness/run/signals.py). The fixture
tests/fixtures/submissions/signal_harness has its rank walk its own ancestors and SIGTERM the first
that is `python -m harness.cli run`. Confined, it must not reach it: the PID namespace gives it no
ancestor (parent 1), and where there is none Landlock's signal scoping (ABI >= 6) refuses the kill.
The control shows the same walker does stop an unconfined `harness.cli run` above it.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO

FIXTURE = REPO / "tests" / "fixtures" / "submissions" / "signal_harness"

CONTROL_PARENT = """
import signal, subprocess, sys
got = []
signal.signal(signal.SIGTERM, lambda *_: got.append("SIGTERM"))
child = "import importlib.util as u, sys; s = u.spec_from_file_location('t', sys.argv[1]); " \\
    "m = u.module_from_spec(s); sys.modules['model'] = type(sys)('model'); " \\
    "sys.modules['model'].build_model = None; s.loader.exec_module(m); print(m.stop_the_harness())"
out = subprocess.run([sys.executable, "-c", child, sys.argv[3]], capture_output=True, text=True)
print(out.stdout.strip(), got)
"""


def test_the_walker_stops_an_unconfined_harness_above_it():
    """The control: run as `python - harness.cli run TRAIN_PY` (so its command line matches), it is signalled."""
    assert importlib.util.find_spec("harness.api") is not None
    r = subprocess.run(
        [sys.executable, "-", "harness.cli", "run", str(FIXTURE / "train.py")],
        input=CONTROL_PARENT, capture_output=True, text=True, cwd=REPO, timeout=120,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert "SIGTERM sent" in r.stdout and r.stdout.strip().endswith("['SIGTERM']"), r.stdout


@pytest.mark.long  # a whole run; the walker's control stays in the default run
def test_a_rank_cannot_sigterm_pgolf_run(tiny_dataset, tmp_path: Path) -> None:
    run_dir, ledger = tmp_path / "run", tmp_path / "ledger.jsonl"
    r = subprocess.run(
        [sys.executable, "-m", "harness.cli", "run", str(FIXTURE), "--data", str(tiny_dataset), "--out",
         str(run_dir), "--ledger", str(ledger)],
        capture_output=True, text=True, cwd=REPO, timeout=600,
    )  # fmt: skip
    log = (run_dir / "train.log").read_text()
    said = [ln for ln in log.splitlines() if "SIGNAL-HARNESS" in ln]
    assert said and "SIGTERM sent" not in said[0], said
    assert r.returncode == 0, (r.returncode, r.stderr[-2000:])
    result = json.loads((run_dir / "result.json").read_text())
    assert result["status"] == "ok" and result["val_bpb"] is not None, result.get("detail")
    assert [json.loads(line)["status"] for line in ledger.read_text().splitlines()] == ["ok"]
