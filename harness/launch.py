"""Launching the train phase through torchrun, and supervising it against the budget.

The supervisor starts `torchrun ... -m harness.worker SPEC` in its own process group (session), so
that one signal reaches every rank. It waits: first up to `startup_s` for rank 0's clock marker,
then until clock start + train_s + grace_s. Past either deadline it sends SIGTERM to the group,
then SIGKILL after a few seconds, and the phase is reported `over_budget`. A non-zero exit (a rank
crashed, or a submission raised) is reported `error` with each rank's recorded traceback.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from harness.budget import CLOCK_MARKER, BudgetConfig

DEVICES = ("auto", "cpu", "cuda")
KILL_WAIT_S = 5.0
POLL_S = 0.2


@dataclass(frozen=True, kw_only=True, slots=True)
class LaunchConfig:
    nproc_per_node: int = 1
    """Ranks per node (GPUs per node on CUDA)."""
    nnodes: int = 1
    rdzv_endpoint: str = ""
    """host:port of the rendezvous for several nodes (torchrun's c10d rendezvous); empty: standalone."""
    device: str = "auto"
    """cpu, cuda, or auto (cuda when available)."""
    threads: int = 0
    """torch intra-op threads per rank; 0: the machine's cores divided among its ranks."""

    def __post_init__(self) -> None:
        if self.device not in DEVICES:
            raise ValueError(f"launch.device must be one of {DEVICES}, got {self.device!r}")
        if self.nproc_per_node < 1 or self.nnodes < 1:
            raise ValueError(f"launch.nproc_per_node and launch.nnodes must be >= 1, got {self.nproc_per_node}, {self.nnodes}")
        if self.nnodes > 1 and not self.rdzv_endpoint:
            raise ValueError("launch.nnodes > 1 needs launch.rdzv_endpoint = 'HOST:PORT'")
        if self.threads < 0:
            raise ValueError(f"launch.threads must be >= 0, got {self.threads}")

    def resolved_device(self) -> str:
        if self.device == "auto":
            return "cuda" if torch.cuda.is_available() else "cpu"
        if self.device == "cuda" and not torch.cuda.is_available():
            raise ValueError(
                "launch.device = 'cuda' but this machine has no CUDA device. "
                "HINT: use a CPU preset (--preset cpu-smoke) or --set launch.device='cpu'"
            )
        return self.device

    def threads_per_rank(self) -> int:
        return self.threads or max(1, (os.cpu_count() or 1) // self.nproc_per_node)


def torchrun_command(cfg: LaunchConfig, spec_path: Path) -> list[str]:
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={cfg.nproc_per_node}"]
    if cfg.nnodes == 1 and not cfg.rdzv_endpoint:
        cmd.append("--standalone")
    else:
        cmd += [f"--nnodes={cfg.nnodes}", "--rdzv-backend=c10d", f"--rdzv-endpoint={cfg.rdzv_endpoint}"]
    return [*cmd, "--max-restarts=0", "-m", "harness.worker", str(spec_path)]


@dataclass(frozen=True)
class PhaseOutcome:
    status: str
    """ok, error, or over_budget."""
    returncode: int | None
    wall_s: float
    detail: str = ""


def _kill_group(proc: subprocess.Popen) -> None:
    for sig, wait in ((signal.SIGTERM, KILL_WAIT_S), (signal.SIGKILL, KILL_WAIT_S)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


def supervise(cmd: list[str], run_dir: Path, budget: BudgetConfig, log_path: Path, env: dict[str, str]) -> PhaseOutcome:
    """Run `cmd` in its own session, enforce the deadlines, tee its output to `log_path`."""
    marker = run_dir / CLOCK_MARKER
    marker.unlink(missing_ok=True)
    t_launch = time.time()
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, env=env)
        deadline = t_launch + budget.startup_s
        reason = "the training clock never started within budget.startup_s"
        while proc.poll() is None:
            if marker.is_file():
                try:
                    start = json.loads(marker.read_text())["clock_start_unix_s"]
                    deadline = start + budget.train_s + budget.grace_s
                    reason = f"training ran past budget.train_s + budget.grace_s = {budget.train_s + budget.grace_s:.1f} s"
                except (ValueError, KeyError):
                    pass
            if time.time() > deadline:
                _kill_group(proc)
                return PhaseOutcome("over_budget", proc.returncode, time.time() - t_launch, reason)
            time.sleep(POLL_S)
    wall = time.time() - t_launch
    _kill_group(proc)  # leftovers of a rank that forked
    if proc.returncode != 0:
        return PhaseOutcome("error", proc.returncode, wall, f"torchrun exited with status {proc.returncode}")
    return PhaseOutcome("ok", 0, wall)
