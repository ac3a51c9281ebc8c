"""Hostile submissions against the supervisor's clock (harness/run/clock_server.py ClockServer), through `pgolf run`.

Nothing a rank reports about time is believed, and no training token reaches a rank while the clock
is stopped (fixtures in tests/fixtures/submissions/):
- `fake_clock` slows every clock in its process threefold: its own readings say ~0.8 s, the result's
  train_time_s is the supervisor's, close to the wall time it really trained;
- `warmup_cheat` (inside) asks for real batches inside the off-clock warm-up through ctx.data, past
  the gate through the loader, and by path: it gets none, and the warm-up stays off the clock;
- `warmup_cheat` (before) takes a real batch first and trains a second model on it during the
  "warm-up": none of that warm-up is off the clock;
- `warmup_cheat` (other_node), on two nodes: the other node's rank takes a real batch and broadcasts it to
  rank 0 inside the warm-up: the node of rank 0 handed out no data, but none of that warm-up is off the clock
  (each node's supervisor sees only its own ranks' requests);
- `read_shards` opens the training shards by path at import: PermissionError (with Landlock), or
  FileNotFoundError in a world of its own (isolation/world.py), where they do not exist at all.
Each run writes result.json and its ledger line, whatever the status.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from harness.run.pipeline import run_pipeline
from isolation.landlock import landlock_abi
from tests.e2e.test_isolation import REFUSED  # the protected path does not exist in a world
from tests.e2e.test_runner import two_nodes

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "submissions"


def pgolf_run(fixture: str, data: Path, tmp: Path, *overrides: str) -> tuple[dict[str, Any], Path]:
    """`pgolf run` in-process; returns result.json as written, after checking the ledger holds it."""
    run_dir, ledger = tmp / "run", tmp / "ledger.jsonl"
    returned = run_pipeline(
        FIXTURES / fixture, data_dir=data, out_dir=run_dir, ledger=ledger, overrides=list(overrides)
    )
    result = json.loads((run_dir / "result.json").read_text(encoding="utf-8"))
    lines = [json.loads(line) for line in ledger.read_text(encoding="utf-8").splitlines()]
    assert len(lines) == 1 and lines[0]["status"] == result["status"] == returned["status"]
    return result, run_dir


def log_line(run_dir: Path, prefix: str) -> dict[str, Any]:
    text = (run_dir / "train.log").read_text(encoding="utf-8")
    return json.loads(next(line[len(prefix) :] for line in text.splitlines() if line.startswith(prefix)))


@pytest.mark.long
def test_a_slowed_clock_in_the_rank_does_not_change_the_recorded_time(tiny_dataset, tmp_path):
    result, run_dir = pgolf_run("fake_clock", tiny_dataset, tmp_path)
    train = result["phases"]["train"]
    assert result["status"] == "ok", train.get("detail")
    # the rank believed its 0.8 s budget was spent; it really trained about three times as long
    # (a ratio, not an absolute figure: on a loaded machine both grow)
    assert result["train_time_s"] == train["train_time_s"] >= 2.0 * train["rank_reported_train_s"]
    # the supervisor's figure is the wall time between the clock's start and the state's handover
    assert train["train_time_s"] <= train["wall_s"] - train["startup_s"]
    assert train["clock"]["ended_by"] == "state_handover" and train["off_clock_s"] == 0.0


def test_no_real_tokens_reach_a_warmup(tiny_dataset, tmp_path):
    result, run_dir = pgolf_run("warmup_cheat", tiny_dataset, tmp_path, "train.cheat='inside'")
    train = result["phases"]["train"]
    assert result["status"] == "ok", train.get("detail")
    cheat = log_line(run_dir, "CHEAT ")
    assert cheat["gate"].startswith("RuntimeError: ctx.data is closed during ctx.clock.warmup()"), cheat
    assert cheat["loader"].startswith("WireError: the supervisor refused 'data'"), cheat
    assert "closed during ctx.clock.warmup()" in cheat["loader"]
    if landlock_abi():
        assert cheat["path"].startswith(REFUSED), cheat
    assert train["clock"]["requests_refused"] == {"training data is closed during ctx.clock.warmup()": 1}
    # nothing leaked, so the warm-up (3 steps of 0.1 s) stays off the clock
    assert 0.3 <= train["off_clock_s"] < 2.0 and train["clock"]["first_data_after_start_s"] > 0.3


@pytest.mark.long
def test_a_warmup_after_real_data_is_all_on_the_clock(tiny_dataset, tmp_path):
    result, run_dir = pgolf_run("warmup_cheat", tiny_dataset, tmp_path, "train.cheat='before'")
    train = result["phases"]["train"]
    assert result["status"] == "ok", train.get("detail")
    assert log_line(run_dir, "WARMUP ")["off_clock_s"] == 0.0  # what the supervisor answered the rank
    assert train["off_clock_s"] == 0.0 and "received training data" in train["clock"]["off_clock_detail"]
    assert result["train_time_s"] >= 0.5  # the 5 shadow-training steps of 0.1 s count


@pytest.mark.long
def test_a_warmup_fed_by_another_node_is_all_on_the_clock(tiny_dataset, tmp_path):
    """Each node's supervisor sees only its own ranks' data requests: rank 0's node handed out no data
    before the warm-up ended, yet the other node's real batch reached rank 0 inside it over the process
    group. On several nodes no warm-up is off the clock. (Before: rank 0's node credited the whole
    warm-up, 0.5 s of training on real tokens off the clock, and the run was ok.)"""
    results = two_nodes([tiny_dataset, tiny_dataset], tmp_path, "warmup_cheat", "train.cheat='other_node'")
    (main, main_dir), (other, _) = sorted(results, key=lambda r: r[0]["role"] != "main")
    assert main["role"] == "main" and other["role"] == "secondary_node", results
    assert main["status"] == other["status"] == "ok", (main.get("detail"), other.get("detail"))
    cheat = log_line(main_dir, "CHEAT ")
    assert cheat["rank"] == 0 and cheat["max_token"] > 0  # real tokens reached rank 0 inside the warm-up
    assert main["clock"]["first_data_after_start_s"] > main["rank_reported_warmup"]["steps"] * 0.1
    assert main["off_clock_s"] == 0.0 and "several nodes" in main["clock"]["off_clock_detail"], main["clock"]
    assert main["train_time_s"] >= 0.5  # the 5 steps of 0.1 s on the other node's tokens count


@pytest.mark.skipif(landlock_abi() == 0, reason="this kernel has no Landlock: nothing can deny the read")
def test_reading_the_training_shards_by_path_is_refused(tiny_dataset, tmp_path):
    result, run_dir = pgolf_run("read_shards", tiny_dataset, tmp_path)
    train = result["phases"]["train"]
    assert result["status"] == "error" and result["val_bpb"] is None
    error = train["errors"]["train_error_rank0.txt"]
    assert REFUSED in error and "fineweb_train_" in error, error
    attempt = next(a for a in train["isolation"]["attempts"] if "fineweb_train_" in a["path"])
    assert attempt["submission_frame"].startswith("train.py:")
