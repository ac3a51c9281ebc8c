"""Launching the train phase through torchrun, and supervising it against the budget.

`torchrun_command` makes the command for N ranks per node and M nodes (and `pack_command` the pack's):

    python -m torch.distributed.run --nproc-per-node=N --nnodes=M --rdzv-backend=c10d
        --rdzv-endpoint=HOST:PORT --rdzv-id=ID [--local-addr=127.0.0.1] --max-restarts=0 -m harness.train.rank SPEC

(one node: the endpoint 127.0.0.1:0, an address, never a name: see torchrun_command)

(NCCL with one GPU per rank on CUDA, gloo on CPU: harness/train/rank.py). `supervise` runs a command
(wrapped in the sandbox by harness/run/train_phase.py) in its own session, outside the sandbox, and
keeps the clock that counts: nothing a rank says about time is believed.

The clock itself is the supervisor's end of the wire: `ClockServer`, harness/run/clock_server.py.
train_time_s = end - start - off-clock credit, in the supervisor's seconds. The process is killed at
launch + startup_s if the clock never starts, else at start + credit + train_s + grace_s: past
either deadline the phase is `over_budget`. torchrun puts each rank in a session of its own, so a
group signal does not reach the ranks: the PID namespace (root, one node) makes the kernel kill every
process left once torchrun dies, and in any case the supervisor kills every process carrying the
phase's token in its environment. A rank that dies takes the phase to `error` (torchrun stops the
others). Several nodes: each node's supervisor keeps its own clock for its own ranks; the record that
counts is the node of global rank 0's.
"""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tqdm import tqdm

from data.io import open_regular
from harness.config import LaunchConfig
from harness.run.clock_server import ClockServer
from harness.run.load import load_between, read_load
from harness.train.budget import BudgetConfig
from isolation.processes import (
    die_with_parent,
    kill_session,
    reap_token_processes,
)
from scoring.statuses import Status

MONITOR_INTERVAL_S = 1.0
PROGRESS_EVERY_S = 30.0
"""Where the progress bar is off (output not a terminal: a log, CI), one `[train]` line this often."""
METRICS_TAIL_BYTES = 4096
LEFTOVER_WAIT_S = 2.0
POLL_S = 0.5


def torchrun_command(cfg: LaunchConfig, spec_path: Path) -> list[str]:
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={cfg.nproc_per_node}"]
    if cfg.nnodes == 1 and not cfg.rdzv_endpoint:
        # the ranks meet on loopback, by address: inside the sandbox's network namespace only 127.0.0.1 exists;
        # torchrun's default address for rank 0 is the host's FQDN, and its --standalone rendezvous is at the name
        # localhost, and a world's /etc/hosts is the image's (in a container an empty file, the runtime's bound
        # over it: isolation/world.py NO_SUBMOUNTS), where no name resolves and the rendezvous waited out its
        # timeout. Port 0: the agent's store takes a free port, as --standalone's does.
        cmd += [
            "--nnodes=1",
            "--rdzv-backend=c10d",
            "--rdzv-endpoint=127.0.0.1:0",
            f"--rdzv-id={uuid.uuid4().hex}",
            "--local-addr=127.0.0.1",
        ]
    else:
        cmd += [
            f"--nnodes={cfg.nnodes}",
            "--rdzv-backend=c10d",
            f"--rdzv-endpoint={cfg.rdzv_endpoint}",
            f"--rdzv-id={cfg.rdzv_id}",
        ]
    # the agent wakes every monitor interval (a store round trip on c10d): once a second keeps it off the
    # ranks' cores on small machines, and a dead rank is still noticed within a second
    return [
        *cmd,
        "--max-restarts=0",
        f"--monitor-interval={MONITOR_INTERVAL_S}",
        "-m",
        "harness.train.rank",
        str(spec_path),
    ]


def pack_command(
    state: Path, code_dir: Path, out: Path, *, codec: str, cap_bytes: int, json_out: Path
) -> list[str]:
    """The `pgolf pack` process's command line: the one builder, for the plain pack and the sealed one."""
    return [
        sys.executable, "-m", "harness.cli", "pack", str(state), "--submission", str(code_dir), "--out", str(out),
        "--codec", codec, "--cap-bytes", str(cap_bytes), "--json-out", str(json_out),
    ]  # fmt: skip


CODEC_CLOCK_MARKER = b"[pgolf pack] the submission's codec starts now (on the clock)"
"""`pgolf pack --codec submission` prints this line before it imports codec.py: the sealed pack's clock
starts when the orchestrator reads it (harness/run/train_phase.py run_sealed_pack), never by a time the
process reports."""


LOG_LIMIT_BYTES = 64 << 20
"""At most this much of a phase's output is kept in its log; the rest is counted and dropped."""


def pump_output(
    proc: subprocess.Popen,
    log_path: Path,
    limit_bytes: int = LOG_LIMIT_BYTES,
    *,
    marker: bytes = b"",
    seen: list[float] | None = None,
) -> threading.Thread:
    """Copy `proc`'s stdout pipe into `log_path` from a thread of this (trusted) process.

    The untrusted processes write into a pipe only: they cannot truncate, rewrite or fill the log
    beyond `limit_bytes` (a rank holding the log file as its stdout could ftruncate it).
    `marker`: when these bytes first come through, this process's time.monotonic() is appended to `seen`
    (a clock started by the harness's own line, printed before any submitted code runs).
    """

    def run() -> None:
        kept = dropped = 0
        tail = b""
        with open(log_path, "ab") as log:
            for chunk in iter(lambda: proc.stdout.read1(65536), b""):  # type: ignore[union-attr]
                if marker and seen is not None and not seen:
                    if marker in tail + chunk:
                        seen.append(time.monotonic())
                    tail = (tail + chunk)[-len(marker) :]
                if kept + len(chunk) <= limit_bytes:
                    log.write(chunk)
                    log.flush()
                    kept += len(chunk)
                else:
                    dropped += len(chunk)
            if dropped:
                log.write(
                    f"\n[pgolf] {dropped:,} more bytes of output dropped (log limit {limit_bytes:,})\n".encode()
                )

    t = threading.Thread(target=run, name="phase-output", daemon=True)
    t.start()
    return t


def _pidfd(pid: int) -> int | None:
    """A descriptor that becomes readable when `pid` exits (Linux >= 5.3), so the supervisor wakes at once."""
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):
        return None


@dataclass(frozen=True)
class PhaseOutcome:
    status: str
    """ok, error, or over_budget."""
    returncode: int | None
    wall_s: float
    detail: str = ""
    startup_s: float | None = None
    """Launch to clock start (the supervisor's observation)."""
    train_time_s: float | None = None
    """Clock start to the clock's end (the state's handover, else every rank's done, else the exit), less
    the off-clock credit: the supervisor's figure, the one a result records."""
    clock_to_exit_s: float | None = None
    """Clock start to the end of the phase, less the off-clock credit."""
    off_clock_s: float = 0.0
    """Off-clock warm-up the supervisor credited (at most budget.warmup_max_s)."""
    clock: dict[str, Any] = field(default_factory=dict)
    """How the supervisor's clock ran: why the credit, what ended the clock, refused requests, the state's sha256."""
    leftover_pids: list[int] = field(default_factory=list)
    load: dict[str, Any] = field(default_factory=dict)
    """The machine's load over the phase (harness/run/load.py): other processes' CPU use, contended."""


def last_metrics(path: Path) -> dict[str, Any] | None:
    """The last whole line of rank 0's metrics.jsonl (its word: shown as progress, never a figure of the record).

    The ranks can write the file while this reads it: opened without following a link and without blocking, and
    read only if it is a regular file (a FIFO put there blocked the supervisor in open(), deadline and all)."""
    try:
        with open_regular(path) as opened:
            if opened is None:
                return None
            fd, st = opened
            os.lseek(fd, max(st.st_size - METRICS_TAIL_BYTES, 0), os.SEEK_SET)
            tail = os.read(fd, METRICS_TAIL_BYTES).decode("utf-8", errors="replace")
    except OSError:
        return None
    for line in reversed(tail.splitlines()[1:] if len(tail) == METRICS_TAIL_BYTES else tail.splitlines()):
        try:
            rec = json.loads(line)
        except (ValueError, RecursionError):  # deep nesting raises RecursionError
            continue
        if isinstance(rec, dict):
            return rec
    return None


def progress_line(
    now: float, t_launch: float, start: float | None, warmup_s: float, off_s: float, budget: BudgetConfig,
    metrics: dict[str, Any] | None,
) -> str:  # fmt: skip
    """One `[train]` progress line: starting up, in the warm-up (the CPU start-up trial, compiling), or training."""
    if start is None:
        return f"[train] starting up: {now - t_launch:.0f} s of budget.startup_s {budget.startup_s:.0f} s"
    if warmup_s > 0:
        return (
            f"[train] warm-up (start-up trial, compile; off the clock): {warmup_s:.0f} s of at most "
            f"{budget.warmup_max_s:.0f} s"
        )
    clock_s = max(now - start - off_s, 0.0)
    of = f" of {budget.train_s:.0f} s" if math.isfinite(budget.train_s) else ""
    line = f"[train] {clock_s:.0f} s{of} on the clock"
    step, loss = (metrics or {}).get("step"), (metrics or {}).get("train_loss")
    # the rank's word: an integer of hundreds of digits raised OverflowError here and ended the supervisor's loop
    if isinstance(step, int) and not isinstance(step, bool) and 0 <= step < 2**63:
        line += f", step {step}"
        if isinstance(loss, int | float) and not isinstance(loss, bool) and _finite(loss):
            line += f", train_loss {loss:.4f}"
    return line


def _finite(x: int | float) -> bool:
    """Whether a JSON number is a finite float (an int no float holds is not)."""
    try:
        return math.isfinite(x)
    except OverflowError:
        return False


def supervise(
    cmd: list[str],
    out_dir: Path,
    budget: BudgetConfig,
    log_path: Path,
    env: dict[str, str],
    token: str,
    leftover_wait_s: float = 0.0,
    *,
    wire: ClockServer,
) -> PhaseOutcome:
    """Run `cmd` in its own session, serve its ranks' wire, enforce the deadlines, append its output to `log_path`.

    `leftover_wait_s`: how long the phase's processes may take to vanish by themselves after it ends
    (a PID namespace's teardown) before they are killed and counted as leftovers.
    """
    wire.open()
    pidfd: int | None = None
    proc: subprocess.Popen[bytes] | None = None
    load_start = read_load()  # two readings, at the ends: nothing on the measured path
    try:
        t_launch = time.monotonic()
        timed = math.isfinite(budget.train_s)
        bar = tqdm(
            total=round(budget.train_s) if timed else None,
            desc="train",
            unit="s",
            disable=None,
            leave=False,
            bar_format="{desc}: {percentage:3.0f}%|{bar}| {n:.0f}/{total:.0f} s of the budget"
            if timed
            else None,
        )
        with bar:
            proc = subprocess.Popen(
                cmd,
                stdout=subprocess.PIPE,  # a pipe the supervisor owns: no rank holds the log file itself
                preexec_fn=die_with_parent,  # the harness killed: the phase dies with it
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                env=env,
                cwd=out_dir,
            )
            pump = pump_output(proc, log_path)
            pidfd = _pidfd(proc.pid)
            if pidfd is not None:
                wire.watch(pidfd)
            status, detail = Status.OK, ""
            next_note = t_launch + PROGRESS_EVERY_S
            while proc.poll() is None:
                now = time.monotonic()
                warming = 0.0 if wire.credit()[0] else wire.warmup_running_s(now)
                start, off = wire.start, wire.credit()[0] or warming
                if start is not None:  # progress on the supervisor's clock
                    bar.n = min(max(now - start - off, 0.0), budget.train_s) if timed else now - start - off
                    bar.refresh()
                if bar.disable and now >= next_note:  # no bar (not a terminal): a line now and then
                    metrics = last_metrics(out_dir / "metrics.jsonl") if start is not None else None
                    print(progress_line(now, t_launch, start, warming, off, budget, metrics), flush=True)
                    next_note = now + PROGRESS_EVERY_S
                deadline = (
                    t_launch + budget.startup_s
                    if start is None
                    else start + off + budget.train_s + budget.grace_s
                )
                if now > deadline:
                    status = Status.OVER_BUDGET
                    detail = (
                        "the training clock never started within budget.startup_s"
                        if start is None
                        else f"training ran past budget.train_s + budget.grace_s = {budget.train_s + budget.grace_s:.1f} s"
                    )
                    kill_session(proc, signal.SIGKILL)  # the grace period was the chance to stop cleanly
                    break
                wire.serve(min(POLL_S, deadline - now + 0.01))
        t_end = time.monotonic()
        kill_session(proc)  # the session's leftovers
        pump.join(timeout=5)
        leftovers = reap_token_processes(token, leftover_wait_s)
        load = load_between(load_start, read_load())
        state_problem = wire.verify_state()  # every process of the phase is gone: no writer is left
    except BaseException:  # Ctrl-C, or the supervisor's own failure: the phase never outlives its supervision
        if proc is not None:
            kill_session(proc, signal.SIGKILL)
        reap_token_processes(token, leftover_wait_s)
        raise
    finally:
        if pidfd is not None:
            os.close(pidfd)
        wire.close()
    if status == Status.OK and proc.returncode != 0:
        status, detail = Status.ERROR, f"torchrun exited with status {proc.returncode}"
    if state_problem and status != Status.OVER_BUDGET:
        status, detail = Status.ERROR, state_problem
    start = wire.start
    off, why = wire.credit()
    end, ended_by = wire.end(t_end)
    if status == Status.OK and start is not None and end - start - off > budget.train_s + budget.grace_s:
        status = Status.OVER_BUDGET  # it ended between two checks of the deadline
        detail = (
            f"training ran past budget.train_s + budget.grace_s = {budget.train_s + budget.grace_s:.1f} s"
        )
    return PhaseOutcome(
        status,
        proc.returncode,
        t_end - t_launch,
        detail,
        startup_s=None if start is None else start - t_launch,
        train_time_s=None if start is None else end - start - off,
        clock_to_exit_s=None if start is None else t_end - start - off,
        off_clock_s=off,
        clock={
            "measured_by": "supervisor",
            "off_clock_detail": why,
            "ended_by": ended_by,
            "first_data_after_start_s": None
            if start is None or wire.first_data is None
            else wire.first_data - start,
            "requests_refused": dict(wire.refused),
            "state_sha256": wire.state_sha256,
            "state_problem": state_problem or None,
        },
        leftover_pids=leftovers,
        load=load,
    )
