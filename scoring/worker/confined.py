"""Starting a confined process that runs submitted code: what the model worker and the one-shot children share.

The one-shot children run submitted code outside scoring: a custom codec's decode
(scoring/worker/decode.py, for `pgolf unpack`), `pgolf generate`'s model (scoring/worker/generate.py,
started by harness/commands/generate.py) and `pgolf check`'s model build (scoring/worker/build_check.py, started
by harness/commands/preflight.py). Each runs `python -P -B -m MODULE SPEC_JSON` (its entry point:
scoring/worker/child.py) in the model worker's sandbox (isolation/sandbox.py with seccomp: it may read
its code, the paths it is given and the Python installation, and write only its private temp folder),
with the worker's environment (`worker_env`: an allow-list, scoring/worker/env.py; caches in the temp
folder), in a session of its own so that its whole process group can be killed. Its stdout and stderr
are drained by a thread, the last bytes kept for an error message. The long-lived scoring worker is
scoring/score/remote.py's WorkerModel, planned and started with the same pieces (WORKER_ISOLATION,
worker_env, OutputTail).
"""

from __future__ import annotations

import collections
import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from data.manifest import dataset_locations
from isolation.processes import kill_group_reaped
from isolation.sandbox import SandboxPlan, plan_sandbox
from scoring.worker.child import error_line
from scoring.worker.env import WORKER_CUBLAS_WORKSPACE, WORKER_MKL_CBWR, sandbox_env

PROJECT_ROOT = Path(__file__).resolve().parents[2]
OUTPUT_KEEP_BYTES = 64 << 10
PRIVATE_DIRS = ("home", "cache/inductor", "cache/triton", "cache/nv")
"""Made inside the process's temp folder: HOME and the compile caches point there."""

WORKER_ISOLATION: dict[str, Any] = {"network": "auto", "multi_node": False, "seccomp": True}
"""How every process that runs submitted scored code is planned (isolation.sandbox.plan_sandbox arguments):
the model worker, the confined one-shot processes, and what `pgolf run` checks the machine offers."""


def worker_env(tmp: Path, threads: int) -> dict[str, str]:
    """The environment of a model worker or a confined child whose private folder is `tmp`: the allow-list
    of scoring/worker/env.py (nothing else of the official's), the project on the import path, HOME and the
    caches inside `tmp`, OMP_NUM_THREADS when `threads` > 0, a fixed cuBLAS workspace (deterministic matmuls),
    and MKL's strict reproducibility unless the official chose an MKL_CBWR (scoring/worker/env.py)."""
    env = sandbox_env(
        os.environ,
        pythonpath=[str(PROJECT_ROOT)],
        home=tmp / "home",
        tmp=tmp,
        cache=tmp / "cache",
        threads=threads,
        extra={"CUBLAS_WORKSPACE_CONFIG": WORKER_CUBLAS_WORKSPACE},
    )
    env.setdefault("MKL_CBWR", WORKER_MKL_CBWR)
    return env


@dataclass
class OutputTail:
    """Drains a process's stdout+stderr; keeps the last OUTPUT_KEEP_BYTES."""

    chunks: collections.deque[bytes] = field(default_factory=collections.deque)
    size: int = 0

    def drain(self, pipe: Any) -> None:
        for chunk in iter(lambda: pipe.read1(65536), b""):
            self.chunks.append(chunk)
            self.size += len(chunk)
            while self.size > OUTPUT_KEEP_BYTES and len(self.chunks) > 1:
                self.size -= len(self.chunks.popleft())

    def text(self) -> str:
        return b"".join(self.chunks).decode("utf-8", "replace")[-OUTPUT_KEEP_BYTES:]


def confined_import_path() -> list[str]:
    """The import folders a process under `worker_env` will have, for its read rules: this process's sys.path
    less what the official's own environment put there: its PYTHONPATH entries and its user site (the
    process gets PYTHONPATH of the project alone and a HOME of its own, so it imports from neither). A rule
    for one (PYTHONPATH=. run from the home folder) let a codec or a model read ~/.ssh and ~/.cache/huggingface."""
    import site

    theirs = {os.path.realpath(p) for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p} | {
        os.path.realpath(site.getusersitepackages())
    }
    return [p for p in sys.path[1:] if p and os.path.realpath(p) not in theirs]


def plan_confined(tmp: Path, read_paths: Iterable[Path], *, sandbox: str = "auto") -> SandboxPlan:
    """Make the temp folder's private folders and plan the sandbox: read `read_paths`, write `tmp`."""
    for d in PRIVATE_DIRS:
        (tmp / d).mkdir(parents=True, exist_ok=True)
    return plan_sandbox(
        mode=sandbox,
        device="cpu",
        project_root=PROJECT_ROOT,
        read_paths=list(read_paths),
        write_paths=[tmp],
        protected=(),
        private=dataset_locations(),
        import_path=confined_import_path(),
        **WORKER_ISOLATION,
    )


class ConfinedChild:
    """`python -P -B -m module SPEC_JSON` under `plan`; `wait` ends it one way or the other."""

    def __init__(
        self,
        plan: SandboxPlan,
        module: str,
        spec: dict[str, Any],
        tmp: Path,
        policy: Path,
        *,
        threads: int = 0,
        pass_fds: tuple[int, ...] = (),
    ) -> None:
        # -P: no working folder on sys.path (what it writes cannot shadow an import); -B: no bytecode
        cmd = [sys.executable, "-P", "-B", "-m", module, json.dumps(spec)]
        self.proc = subprocess.Popen(
            plan.wrap(cmd, policy),  # the policy file lies outside the process's own folder
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            pass_fds=pass_fds,
            env=worker_env(tmp, threads),
            cwd=tmp / "home",
            start_new_session=True,
        )
        self.output = OutputTail()
        self._drain = threading.Thread(target=self.output.drain, args=(self.proc.stdout,), daemon=True)
        self._drain.start()
        self._closed = False

    def wait(self, timeout_s: float) -> int | None:
        """Its exit status, or None when it ran past `timeout_s`; either way its group is gone after."""
        try:
            return self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return None
        finally:
            self.close()

    def error_line(self) -> str:
        """What it said of its failure (scoring/worker/child.py error_line); call after `wait`."""
        return error_line(self.output.text())

    def close(self) -> None:
        """Kill what is left of its group (once), stop draining."""
        if self._closed:
            return
        self._closed = True
        kill_group_reaped(self.proc)
        self._drain.join(timeout=2)
        # A process that left the group (setsid; only where no PID namespace ends it) may still hold the
        # output pipe: closing it under the draining thread would wait for that process's exit (a transform's
        # daemon stalled the build 60 s so). The thread is a daemon; the pipe closes when the holder exits.
        if self.proc.stdout is not None and not self._drain.is_alive():
            self.proc.stdout.close()
