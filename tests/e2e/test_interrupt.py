"""Ctrl-C (SIGINT) or SIGTERM (`kill`, a scheduler's limit) in the middle of `pgolf run`: the phase's processes
go, result.json says `interrupted` and names the signal, the ledger has its line, stderr has one line for it,
not a traceback, and the exit status is 128 + the signal's number."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from isolation.processes import processes_with_token
from tests.conftest import REPO
from tests.e2e.test_hostile_runs import _phase_token
from tests.waiting import wait_until

TINY_LM = REPO / "tests" / "fixtures" / "submissions" / "tiny_lm"


@pytest.mark.parametrize(
    ("signum", "how"),
    [(signal.SIGINT, "SIGINT (Ctrl-C)"), pytest.param(signal.SIGTERM, "SIGTERM", marks=pytest.mark.long)],
    ids=["ctrl-c", "sigterm"],
)  # SIGTERM takes Ctrl-C's path once its handler has run: with the long set
def test_a_stop_mid_training_ends_the_run_interrupted_with_a_record(
    tiny_dataset, tmp_path: Path, signum: signal.Signals, how: str
) -> None:
    folder = tmp_path / "entry"
    shutil.copytree(TINY_LM, folder)
    src = (folder / "train.py").read_text()
    assert "    step_sleep_s: float = 0.0" in src
    (folder / "train.py").write_text(
        src.replace("    step_sleep_s: float = 0.0", "    step_sleep_s: float = 0.5")
    )
    run_dir, ledger = tmp_path / "run", tmp_path / "ledger.jsonl"
    proc = subprocess.Popen(
        [sys.executable, "-m", "harness.cli", "run", str(folder), "--data", str(tiny_dataset), "--out",
         str(run_dir), "--ledger", str(ledger), "--set", "train.steps=100000", "--set", "budget.train_s=300"],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=_sigint_as_a_terminal_has_it,
    )  # fmt: skip
    try:
        token = wait_until(lambda: proc.poll() is None and _phase_token(proc.pid), 180, "the train phase")
        # training under way: the rank has ticked (the log's lines come from rank 0 once it trains)
        log = run_dir / "train.log"
        wait_until(lambda: log.is_file() and log.stat().st_size > 0, 120, "the rank's first log line")
        os.kill(proc.pid, signum)  # what a terminal's Ctrl-C or a scheduler sends (phases: own sessions)
        out, err = _communicate_or_explain(proc, token, timeout_s=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 128 + signum, (proc.returncode, err[-2000:])
    assert "Traceback" not in err, err[-3000:]
    said = [line for line in err.splitlines() if line.startswith("interrupted:")]
    assert said == [f"interrupted: the run stopped during the train phase; record in {run_dir.resolve()}"], (
        err
    )
    result = json.loads((run_dir / "result.json").read_text())
    assert result["status"] == "interrupted" and result["val_bpb"] is None
    assert result["detail"] == f"interrupted: stopped by {how} during the train phase"
    lines = [json.loads(line) for line in ledger.read_text().splitlines()]
    assert len(lines) == 1 and lines[0]["status"] == "interrupted"
    assert "status        interrupted" in out  # the card
    assert processes_with_token(token) == [], "a training process outlived the interrupt"


def _sigint_as_a_terminal_has_it() -> None:
    """SIGINT at its default in the run, as under a terminal. A suite started in the background (`cmd &` from a
    script: the shell sets SIGINT to ignored, and exec keeps an ignored signal ignored) would otherwise hand the
    run an ignored SIGINT, which Python then never turns into KeyboardInterrupt: the run rightly goes on, and
    this test hung on every busy-machine run started that way (stop 20's and 2026-12-02's)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _communicate_or_explain(proc: subprocess.Popen[str], token: str, timeout_s: float) -> tuple[str, str]:
    """The run's output once it ends; when it has not ended `timeout_s` after the signal, a failure that says
    where it waits: every thread's stack (harness/cli.py dumps them on SIGUSR1) and the phase's processes left."""
    try:
        return proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.kill(proc.pid, signal.SIGUSR1)
        try:
            _, err = proc.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            _, err = proc.communicate()
        pytest.fail(
            f"the run had not ended {timeout_s:.0f} s after the signal; processes of the phase left: "
            f"{processes_with_token(token)}; its stderr (stacks last):\n{err[-8000:]}"
        )
