"""Hostile runs end in their specific verdict, with result.json and a ledger that parses.

Submissions built in tmp_path from the honest `tiny_lm` fixture, each changed in one way an attacker
tried: a train.py that forges its own record (steps, role, a NaN), one that ignores the clock and trains
into the grace period, a record-track run on the embedded corpus (whose validation text ships with
Python); and the harness itself: two runs appending to one ledger at once, and the harness killed
with SIGKILL in the middle of training (nothing left running, the ledger still parses).
"""

from __future__ import annotations

import json
import multiprocessing
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from harness.run.pipeline import run_pipeline
from harness.run.result import write_result
from isolation.processes import processes_with_token
from tests.conftest import REPO
from tests.waiting import wait_until

TINY_LM = REPO / "tests" / "fixtures" / "submissions" / "tiny_lm"


def hostile(tmp_path: Path, train_tail: str = "", replace: tuple[str, str] | None = None) -> Path:
    folder = tmp_path / "entry"
    shutil.copytree(TINY_LM, folder)
    src = (folder / "train.py").read_text()
    if replace:
        assert replace[0] in src
        src = src.replace(*replace)
    (folder / "train.py").write_text(src + train_tail)
    return folder


def run(
    folder: Path, data: Path, tmp_path: Path, *overrides: str
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    run_dir, ledger = tmp_path / "run", tmp_path / "ledger.jsonl"
    returned = run_pipeline(folder, data_dir=data, out_dir=run_dir, ledger=ledger, overrides=list(overrides))
    result = json.loads((run_dir / "result.json").read_text())
    lines = [json.loads(line) for line in ledger.read_text().splitlines()]
    assert lines[-1]["status"] == result["status"] == returned["status"]
    return result, lines


FORGE = """

_train = train


def train(ctx):  # noqa: F811 - forges the rank's own record on the way out
    import sys

    m = sys.modules["__main__"]
    write = m._write_json
    m._write_json = lambda path, record: write(path, {**record, **FORGED})
    return _train(ctx)
"""


@pytest.mark.long
def test_a_forged_rank_record_changes_nothing(tiny_dataset, tmp_path):
    """A forged role cannot skip the result, and the rank's own claims of time, score and status are
    dropped (one run for both: the forgeries are independent fields of the one record)."""
    folder = hostile(
        tmp_path,
        FORGE + 'FORGED = {"role": "secondary_node", "rank_reported_train_s": 0.001, "train_time_s": 0.01,'
        ' "val_bpb": 0.1, "status": "ok"}\n',
    )
    result, _ = run(folder, tiny_dataset, tmp_path)
    train = result["phases"]["train"]
    assert result["status"] == "ok" and train["role"] == "main"  # one node: the launch says main
    assert result["val_bpb"] is not None and result["val_bpb"] > 1.0
    assert result["train_time_s"] > 0.01 and train["train_time_s"] > 0.01


def test_a_nan_in_the_rank_record_is_an_error_with_a_result(tiny_dataset, tmp_path):
    folder = hostile(tmp_path, FORGE + 'FORGED = {"steps": float("nan")}\n')
    result, lines = run(folder, tiny_dataset, tmp_path)
    assert result["status"] == "error" and "steps" in result["phases"]["train"]["detail"]
    assert lines[-1]["val_bpb"] is None


@pytest.mark.long
def test_training_into_the_grace_without_ticking_is_over_budget(tiny_dataset, tmp_path):
    """The clock is never consulted: the entry trains on its own timer until just before the kill."""
    loop = (
        "    for i in range(hp.steps):\n        if ctx.clock.tick().stop:",
        "    import time\n    t0 = time.monotonic()\n    for i in range(10**9):\n"
        "        if time.monotonic() - t0 > 8.0:\n            break\n        if False:",
    )
    folder = hostile(tmp_path, replace=loop)
    result, _ = run(folder, tiny_dataset, tmp_path, "budget.train_s=2.0", "budget.grace_s=15.0")
    train = result["phases"]["train"]
    assert result["status"] == "over_budget" and "the grace period is for stopping" in train["detail"], train
    assert result["val_bpb"] is None


def test_a_record_track_refuses_the_embedded_corpus(sp_dataset, tmp_path):
    folder = tmp_path / "entry"
    shutil.copytree(REPO / "baselines" / "naive_baseline", folder)
    result, _ = run(folder, sp_dataset, tmp_path, "run.track='cpu_10min_16mb'", "launch.device='cpu'",
                    "launch.nproc_per_node=1")  # fmt: skip
    assert result["status"] == "invalid_data" and "embedded corpus" in result["phases"]["data"]["problem"]
    assert "train" not in result["phases"]  # refused before training


def _append(ledger: str, tag: int, n: int) -> None:
    run_dir = Path(ledger).parent / f"r{tag}"
    run_dir.mkdir(exist_ok=True)
    for i in range(n):
        write_result(
            run_dir,
            {"status": "ok", "tag": tag, "i": i, "pad": "x" * 30_000, "v": float("nan")},
            Path(ledger),
        )


def test_two_runs_appending_to_one_ledger_never_interleave(tmp_path):
    ledger = tmp_path / "ledger.jsonl"
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=_append, args=(str(ledger), t, 60)) for t in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
    lines = [json.loads(line) for line in ledger.read_text().splitlines()]  # every line whole, strict JSON
    assert len(lines) == 120 and {(r["tag"], r["i"]) for r in lines} == {
        (t, i) for t in range(2) for i in range(60)
    }
    assert lines[0]["v"] == "nan"  # non-finite numbers are written as strings


def test_the_harness_killed_mid_run_leaves_nothing_running_and_a_ledger_that_parses(tiny_dataset, tmp_path):
    ledger = tmp_path / "ledger.jsonl"
    ledger.write_text(json.dumps({"status": "ok", "earlier": True}) + "\n")
    folder = hostile(tmp_path, replace=("    step_sleep_s: float = 0.0", "    step_sleep_s: float = 1.0"))
    proc = subprocess.Popen(
        [sys.executable, "-m", "harness.cli", "run", str(folder), "--data", str(tiny_dataset), "--out",
         str(tmp_path / "run"), "--ledger", str(ledger), "--set", "train.steps=1000"],
        cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    token_of = wait_until(lambda: proc.poll() is None and _phase_token(proc.pid), 120, "the training phase")
    log = tmp_path / "run" / "train.log"  # training under way: rank 0 has logged (each step sleeps 1 s)
    wait_until(lambda: log.is_file() and log.stat().st_size > 0, 120, "the rank's first log line")
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    # the kernel delivers the parent-death signals; a PID namespace tears down
    wait_until(
        lambda: processes_with_token(token_of) == [], 60, "the phase's processes to end with the harness"
    )
    assert [json.loads(line) for line in ledger.read_text().splitlines()] == [
        {"status": "ok", "earlier": True}
    ]
    assert not (tmp_path / "run" / "result.json").exists()  # killed: no result, and nothing half-written


def _phase_token(harness_pid: int) -> str | None:
    """The PGOLF_PHASE_TOKEN of the harness's training phase, from its children's environment."""
    from isolation.sandbox import TOKEN_ENV

    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            env = Path(f"/proc/{entry.name}/environ").read_bytes().split(b"\0")
            stat = Path(f"/proc/{entry.name}/stat").read_text().split()
        except OSError:
            continue
        if int(stat[3]) == harness_pid:
            for kv in env:
                if kv.startswith(f"{TOKEN_ENV}=".encode()):
                    return kv.split(b"=", 1)[1].decode()
    return None


@pytest.mark.parametrize(
    ("meta", "why"),
    [(None, "submission.json"), ("{not json", "submission.json"), ('{"name": 3}', "name")],
    ids=["missing", "malformed", "wrong-type"],
)
def test_a_missing_or_malformed_submission_json_is_one_line_before_anything_runs(tmp_path, meta, why):
    folder = hostile(tmp_path)
    if meta is None:
        (folder / "submission.json").unlink()
    else:
        (folder / "submission.json").write_text(meta)
    r = subprocess.run([sys.executable, "-m", "harness.cli", "run", str(folder), "--out", str(tmp_path / "run")],
                       cwd=REPO, capture_output=True, text=True, timeout=120, check=False)  # fmt: skip
    assert r.returncode == 2 and why in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert not (tmp_path / "run").exists()


GREEDY = """

_train = train


def train(ctx):  # noqa: F811 - takes 3 GB of memory, each byte touched, before training
    import torch

    hoard = torch.ones(3 * 1024**3, dtype=torch.uint8)
    return _train(ctx) if hoard.sum() > 0 else None
"""


def test_training_past_its_memory_limit_is_out_of_memory(tiny_dataset, tmp_path):
    """Each process of the train phase gets an address-space limit (launch.memory_limit_bytes, command line
    only): an allocation past it fails in the rank, and the run ends out_of_memory, not a machine in trouble."""
    folder = hostile(tmp_path, GREEDY)
    result, lines = run(folder, tiny_dataset, tmp_path, "launch.memory_limit_bytes=2_500_000_000")
    train = result["phases"]["train"]
    assert result["status"] == lines[-1]["status"] == "out_of_memory", train
    assert "2,500,000,000 bytes of address space" in train["detail"]
    assert train["isolation"]["memory_limit_bytes_per_process"] == 2_500_000_000


TERMINAL = """

_quiet_train = train


def train(ctx):  # noqa: F811 - writes to the official's terminal; the forged record below fails the phase
    import sys

    state = _quiet_train(ctx)
    sys.stdout.write("\\x1b]52;c;cm0gLXJmIH4K\\x07")  # OSC 52: the official's clipboard
    sys.stdout.write("\\x1b[2A\\x1b[2K\\x1b]0;pgolf: ok\\x07\\rstatus ok, val_bpb 0.5012\\n")  # the card rewritten
    sys.stdout.flush()
    return state
"""


@pytest.mark.long  # a whole tiny run: 30 s on 2 cores (the fast one: test_text_as_data.py)
def test_a_rank_s_output_reaches_the_official_s_terminal_as_text(tiny_dataset, tmp_path, capfd):
    """A failed training phase shows the last lines of its log (the ranks' own output) under the card: each
    control character shown as an escape, so no rank moves the cursor over the verdict, sets the official's
    clipboard (OSC 52) or the window's title."""
    folder = hostile(tmp_path, FORGE + 'FORGED = {"steps": float("nan")}\n' + TERMINAL)
    result, _ = run(folder, tiny_dataset, tmp_path)
    out, err = capfd.readouterr()
    assert result["status"] == "error"
    assert "last lines of" in err and "status ok, val_bpb 0.5012" in err  # the lines are shown, as text
    assert "\x1b" not in out + err and "\x07" not in out + err
    assert "\\x1b]52;c;" in err
