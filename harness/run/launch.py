"""Launching the train phase through torchrun, and supervising it against the budget.

`torchrun_command` makes the command for N ranks per node and M nodes:

    python -m torch.distributed.run --nproc-per-node=N (--standalone | --nnodes=M --rdzv-backend=c10d
        --rdzv-endpoint=HOST:PORT --rdzv-id=ID) --max-restarts=0 -m harness.train.rank SPEC

(NCCL with one GPU per rank on CUDA, gloo on CPU: harness/train/rank.py). `supervise` runs a command
(wrapped in the sandbox by harness/run/train_phase.py) in its own session. It waits up to `startup_s`
for the clock marker, then until clock start + off-clock warm-up (trusted up to warmup_max_s) +
train_s + grace_s; past either deadline it SIGKILLs the session and the phase is `over_budget`.
The marker lives where training writes, so only its first reading fixes the start, and later ones
may only add warm-up credit. torchrun puts each rank in a session of its own, so a group signal
does not reach the ranks: the PID namespace (root, one node) makes the kernel kill every process
left once torchrun dies, and in any case the supervisor kills every process carrying the phase's
token in its environment. A rank that dies takes the phase to `error` (torchrun stops the others).
"""

from __future__ import annotations

import json
import math
import os
import signal
import stat
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
from tqdm import tqdm

from harness.train.clock import CLOCK_MARKER, BudgetConfig
from isolation.sandbox import TOKEN_ENV

DEVICES = ("auto", "cpu", "cuda")
KILL_WAIT_S = 3.0
MONITOR_INTERVAL_S = 1.0
LEFTOVER_WAIT_S = 2.0
POLL_S = 0.5


@dataclass(frozen=True, kw_only=True, slots=True)
class LaunchConfig:
    nproc_per_node: int = 1
    """Ranks per node (GPUs per node on CUDA; one GPU per rank)."""
    nnodes: int = 1
    rdzv_endpoint: str = ""
    """host:port of torchrun's c10d rendezvous for several nodes; empty: one standalone node."""
    rdzv_id: str = "pgolf"
    """The job's id at the rendezvous: the same on every node."""
    device: str = "auto"
    """cpu, cuda, or auto (cuda when available)."""
    threads: int = 0
    """torch intra-op threads per rank; 0: the machine's cores divided among its ranks."""
    sandbox: str = "auto"
    """auto: every isolation layer the machine offers (recorded); required: refuse to train without Landlock; off."""
    network: str = "auto"
    """auto: on one node and as root, a network namespace with loopback only; host: the machine's network."""
    sandbox_read_paths: str = ""
    """Extra folders training may read (os.pathsep-separated), e.g. a GPU driver's libraries outside /usr and /opt."""

    def __post_init__(self) -> None:
        if self.device not in DEVICES:
            raise ValueError(f"launch.device must be one of {DEVICES}, got {self.device!r}")
        if self.nproc_per_node < 1 or self.nnodes < 1:
            raise ValueError(
                f"launch.nproc_per_node and launch.nnodes must be >= 1, got {self.nproc_per_node}, {self.nnodes}"
            )
        if self.nnodes > 1 and not self.rdzv_endpoint:
            raise ValueError(
                "launch.nnodes > 1 needs launch.rdzv_endpoint = 'HOST:PORT' (the same on every node)"
            )
        if self.rdzv_endpoint and ":" not in self.rdzv_endpoint:
            raise ValueError(f"launch.rdzv_endpoint must be HOST:PORT, got {self.rdzv_endpoint!r}")
        if self.threads < 0:
            raise ValueError(f"launch.threads must be >= 0, got {self.threads}")
        if self.sandbox not in ("auto", "off", "required"):
            raise ValueError(f"launch.sandbox must be 'auto', 'required' or 'off', got {self.sandbox!r}")
        if self.network not in ("auto", "host"):
            raise ValueError(f"launch.network must be 'auto' or 'host', got {self.network!r}")

    def resolved_device(self) -> str:
        if self.device == "auto":
            return "cuda" if torch.cuda.is_available() else "cpu"
        if self.device == "cuda" and not torch.cuda.is_available():
            raise ValueError(
                "launch.device = 'cuda' but this machine has no CUDA device. "
                "HINT: use a CPU preset (--preset cpu-smoke) or --set launch.device='cpu'"
            )
        if self.device == "cuda" and self.nproc_per_node > torch.cuda.device_count():
            raise ValueError(
                f"launch.nproc_per_node = {self.nproc_per_node} but this node has {torch.cuda.device_count()} GPU(s). "
                f"HINT: --nproc {torch.cuda.device_count()} (gradient accumulation keeps the global batch)"
            )
        return self.device

    def threads_per_rank(self) -> int:
        return self.threads or max(1, (os.cpu_count() or 1) // self.nproc_per_node)


def torchrun_command(cfg: LaunchConfig, spec_path: Path) -> list[str]:
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={cfg.nproc_per_node}"]
    if cfg.nnodes == 1 and not cfg.rdzv_endpoint:
        cmd.append("--standalone")
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


# ---- Supervising ----


@dataclass(frozen=True)
class PhaseOutcome:
    status: str
    """ok, error, or over_budget."""
    returncode: int | None
    wall_s: float
    detail: str = ""
    startup_s: float | None = None
    """Launch to clock start (the supervisor's observation)."""
    clock_to_exit_s: float | None = None
    """Clock start to the end of the phase, less the accepted off-clock time."""
    off_clock_s: float = 0.0
    """Off-clock warm-up the supervisor accepted (at most budget.warmup_max_s)."""
    leftover_pids: list[int] = field(default_factory=list)


def _read_marker(path: Path) -> dict[str, float] | None:
    """The clock marker, if it is a small regular file holding valid numbers (it lives where training writes)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size > 4096:
            return None
        m = json.loads(os.read(fd, 4096))
        return {"start": float(m["clock_start_unix_s"]), "off": float(m.get("off_clock_s", 0.0))}
    except (OSError, ValueError, KeyError, TypeError):
        return None
    finally:
        os.close(fd)


def processes_with_token(token: str) -> list[int]:
    """PIDs whose initial environment holds TOKEN_ENV=token (readable for our own uid, or as root)."""
    needle = f"{TOKEN_ENV}={token}".encode()
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry.name}/environ", "rb") as f:
                if needle in f.read().split(b"\0"):
                    found.append(int(entry.name))
        except OSError:
            continue
    return found


def kill_token_processes(token: str) -> list[int]:
    """SIGKILL every process carrying the token; returns their PIDs."""
    pids = processes_with_token(token)
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    return pids


def kill_session(proc: subprocess.Popen, first: signal.Signals = signal.SIGTERM) -> None:
    for sig in dict.fromkeys((first, signal.SIGKILL)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=KILL_WAIT_S)
            return
        except subprocess.TimeoutExpired:
            continue


def reap_token_processes(token: str, wait_s: float) -> list[int]:
    """Processes of the phase still alive `wait_s` after it ended (a PID namespace's teardown is not instant): killed."""
    t_end = time.monotonic() + wait_s
    while processes_with_token(token) and time.monotonic() < t_end:
        time.sleep(0.05)
    return kill_token_processes(token)


def supervise(
    cmd: list[str],
    out_dir: Path,
    budget: BudgetConfig,
    log_path: Path,
    env: dict[str, str],
    token: str,
    leftover_wait_s: float = 0.0,
) -> PhaseOutcome:
    """Run `cmd` in its own session, enforce the deadlines, append its output to `log_path`.

    `leftover_wait_s`: how long the phase's processes may take to vanish by themselves after it ends
    (a PID namespace's teardown) before they are killed and counted as leftovers.
    """
    marker = out_dir / CLOCK_MARKER
    t_launch = time.time()
    start: float | None = None
    off = 0.0
    last_stat: tuple[int, int] | None = None

    def observe(now: float) -> None:
        nonlocal start, off, last_stat
        try:
            st = os.lstat(marker)
        except OSError:
            return
        if (st.st_mtime_ns, st.st_size) == last_stat:
            return
        last_stat = (st.st_mtime_ns, st.st_size)
        m = _read_marker(marker)
        if m is None:
            return
        if start is None:  # the first reading fixes the start; later ones may only add warm-up credit
            start = min(max(m["start"], t_launch), now)
        off = max(off, min(m["off"], budget.warmup_max_s))

    timed = math.isfinite(budget.train_s)
    bar = tqdm(
        total=round(budget.train_s) if timed else None,
        desc="train",
        unit="s",
        disable=None,
        leave=False,
        bar_format="{desc}: {percentage:3.0f}%|{bar}| {n:.0f}/{total:.0f} s of the budget" if timed else None,
    )
    with open(log_path, "ab") as log, bar:
        proc = subprocess.Popen(
            cmd,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            env=env,
            cwd=out_dir,
        )
        status, detail = "ok", ""
        while proc.poll() is None:
            now = time.time()
            observe(now)
            if start is not None:  # progress on the harness's clock (the supervisor's view of it)
                bar.n = min(max(now - start - off, 0.0), budget.train_s) if timed else now - start - off
                bar.refresh()
            deadline = (
                t_launch + budget.startup_s
                if start is None
                else start + off + budget.train_s + budget.grace_s
            )
            if now > deadline:
                status = "over_budget"
                detail = (
                    "the training clock never started within budget.startup_s"
                    if start is None
                    else f"training ran past budget.train_s + budget.grace_s = {budget.train_s + budget.grace_s:.1f} s"
                )
                kill_session(proc, signal.SIGKILL)  # the grace period was the chance to stop cleanly
                break
            time.sleep(POLL_S)
    t_end = time.time()
    observe(t_end)
    kill_session(proc)  # the session's leftovers
    leftovers = reap_token_processes(token, leftover_wait_s)
    if status == "ok" and proc.returncode != 0:
        status, detail = "error", f"torchrun exited with status {proc.returncode}"
    return PhaseOutcome(
        status,
        proc.returncode,
        t_end - t_launch,
        detail,
        startup_s=None if start is None else start - t_launch,
        clock_to_exit_s=None if start is None else t_end - start - off,
        off_clock_s=off,
        leftover_pids=leftovers,
    )
