"""One loopback-only network namespace for a group of sandboxes that must talk to each other, and no one else.

A distributed adaptation hook (scoring/worker/group.py) runs in several model workers, each its own sandbox,
that all-reduce gradients over torch.distributed. Each sandbox otherwise gets a network namespace of its own
(isolation/sandbox.py), where the others cannot be reached. A `SharedNet` is a small trusted process that
makes a fresh network namespace (`unshare --net`), brings its loopback up and waits; each sandbox of the
group enters it (`nsenter --net=/proc/self/fd/N`, N a descriptor of the namespace this process opened while the
holder was known to be alive: isolation/sandbox.py SandboxPlan.join_net) before making its other
namespaces. The group's workers then reach each other on 127.0.0.1 and nothing else: not the host's
loopback, not another group's. The namespace ends with its last process: the holder and the workers it was
made for (the holder exits when this side closes its stdin, or dies with this process).

Needs what the sandbox's own network namespace needs (root and util-linux `unshare`); where the machine
gives none, the group meets on the host's loopback, as the phase's network already is (recorded).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from isolation.processes import die_with_parent

_HOLD = (
    "import sys\n"
    "from isolation.landlock import loopback_up\n"
    "loopback_up()\n"
    "print('up', flush=True)\n"
    "sys.stdin.read()\n"
)


class SharedNetFailure(RuntimeError):
    """The namespace could not be made (the machine refused `unshare --net`)."""


class SharedNet:
    """A loopback-only network namespace held open for a group's sandboxes (see the module docstring)."""

    def __init__(self, project_root: Path):
        unshare = shutil.which("unshare")
        if unshare is None:
            raise SharedNetFailure("util-linux `unshare` is not installed: apt-get install util-linux")
        self.proc = subprocess.Popen(
            [unshare, "--net", "--", sys.executable, "-P", "-B", "-c", _HOLD],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            cwd=project_root,
            env={"PYTHONPATH": str(project_root), "PATH": "/usr/bin:/bin"},
            preexec_fn=die_with_parent,
        )
        line = self.proc.stdout.readline() if self.proc.stdout else b""
        if line.strip() != b"up":
            err = self.proc.stderr.read().decode(errors="replace")[-500:] if self.proc.stderr else ""
            self.close()
            raise SharedNetFailure(f"`unshare --net` could not make a shared namespace: {err.strip()}")
        # opened now, while the holder is alive and said it is up: the descriptor names this namespace for good
        self.fd = os.open(f"/proc/{self.proc.pid}/ns/net", os.O_RDONLY | os.O_CLOEXEC)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def close(self) -> None:
        """Let the holder go (the namespace ends once the group's sandboxes have ended too)."""
        fd, self.fd = getattr(self, "fd", -1), -1
        if fd >= 0:
            os.close(fd)
        if self.proc.poll() is None:
            try:
                if self.proc.stdin:
                    self.proc.stdin.close()
                self.proc.wait(timeout=5)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait()
        for stream in (self.proc.stdout, self.proc.stderr):
            if stream:
                stream.close()
