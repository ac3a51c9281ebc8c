"""The train phase's progress lines where no bar is drawn (harness/run/launch.py progress_line,
last_metrics): starting up, in the warm-up (the CPU start-up trial), and on the clock with rank 0's
last step. Times are passed in: nothing waits."""

from __future__ import annotations

import json
from pathlib import Path

from harness.run.launch import METRICS_TAIL_BYTES, last_metrics, progress_line
from harness.train.budget import BudgetConfig

BUDGET = BudgetConfig(train_s=600.0, startup_s=300.0, warmup_max_s=180.0)


def test_each_stage_has_its_line() -> None:
    assert progress_line(130.0, 100.0, None, 0.0, 0.0, BUDGET, None) == (
        "[train] starting up: 30 s of budget.startup_s 300 s"
    )
    assert progress_line(200.0, 100.0, 110.0, 75.4, 75.4, BUDGET, None) == (
        "[train] warm-up (start-up trial, compile; off the clock): 75 s of at most 180 s"
    )
    line = progress_line(400.0, 100.0, 110.0, 0.0, 90.0, BUDGET, {"step": 12, "train_loss": 5.43219})
    assert line == "[train] 200 s of 600 s on the clock, step 12, train_loss 5.4322"
    untimed = BudgetConfig(train_s=float("inf"))
    assert progress_line(400.0, 100.0, 110.0, 0.0, 90.0, untimed, {"step": True, "train_loss": "x"}) == (
        "[train] 200 s on the clock"  # a rank's odd values are not shown
    )


def test_last_metrics_reads_the_last_whole_line(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    assert last_metrics(path) is None
    lines = [json.dumps({"step": i, "train_loss": 6.0 - i / 100, "pad": "x" * 50}) for i in range(1, 200)]
    path.write_text("\n".join(lines) + '\n{"step": 200, "trai', encoding="utf-8")  # a line being written
    assert path.stat().st_size > METRICS_TAIL_BYTES
    assert last_metrics(path) == json.loads(lines[-1])


def test_a_long_phase_prints_progress_and_is_killed_at_its_timeout(
    tmp_path: Path, monkeypatch, capsys
) -> None:
    """The child waits for the file the progress callback writes: it ends only if a progress line was printed."""
    import sys

    from harness.run import pipeline

    monkeypatch.setattr(pipeline, "PROGRESS_EVERY_S", 0.05)
    flag = tmp_path / "progressed"
    child = f"import os, time\nwhile not os.path.exists({str(flag)!r}):\n    time.sleep(0.01)\n"

    def progress(elapsed_s: float) -> str:
        flag.touch()
        return f"[score] {elapsed_s:.0f} s"

    rc = pipeline._run_phase("score", [sys.executable, "-c", child], tmp_path / "log", progress=progress)
    assert rc == 0 and "[score] 0 s" in capsys.readouterr().out
    forever = [sys.executable, "-c", "import time\nwhile True:\n    time.sleep(1)"]
    assert (
        pipeline._run_phase("score", forever, tmp_path / "log", timeout_s=0.2) is None
    )  # killed, not waited
    assert pipeline.score_progress(630.0)(60.4) == "[score] 60 s; 570 s of the eval budget left"
