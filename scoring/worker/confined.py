"""One-shot confined processes for submitted code outside scoring: a custom codec's decode
(scoring/worker/decode.py), `pgolf generate` (harness/generate.py) and `pgolf check`'s model build
(harness/preflight.py).

Each runs `python -P -B -m MODULE SPEC_JSON` in the model worker's sandbox (isolation/sandbox.py with
seccomp: it may read its code, the paths it is given and the Python installation, and write only its
private temp folder), with the worker's environment (no dataset locations; caches in the temp folder),
in a session of its own so that its whole process group can be killed. Its stdout and stderr are
drained by a thread, the last bytes kept for an error message. The long-lived scoring worker is
scoring/score/remote.py's WorkerModel, planned the same way.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from isolation.processes import kill_group_reaped
from isolation.sandbox import SandboxPlan, plan_sandbox
from scoring.score.remote import PROJECT_ROOT, WORKER_ISOLATION, _env, _OutputTail

PRIVATE_DIRS = ("home", "cache/inductor", "cache/triton", "cache/nv")
"""Made inside the process's temp folder: HOME and the compile caches point there."""


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
        import_path=[p for p in sys.path[1:] if p],
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
            env=_env(tmp, threads),
            cwd=tmp / "home",
            start_new_session=True,
        )
        self.output = _OutputTail()
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

    def close(self) -> None:
        """Kill what is left of its group (once), stop draining."""
        if self._closed:
            return
        self._closed = True
        kill_group_reaped(self.proc)
        self._drain.join(timeout=2)
        if self.proc.stdout is not None:
            self.proc.stdout.close()
