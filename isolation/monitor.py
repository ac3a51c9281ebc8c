"""Reporting what training tried to reach outside the sandbox: an audit hook in every rank.

The worker (harness/train/rank.py) installs `monitor_from_rules(...)` with `sys.addaudithook` before it
imports the submission. Each access the sandbox's rules do not allow becomes one line
`[pgolf-sandbox] {json}` on the phase's log; `parse_attempts` reads them back for the result.
Cost: one dict lookup per audit event (a training step raises a few dozen).
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Sequence
from types import FrameType
from typing import Any

from isolation.landlock import is_beneath

MONITOR_PREFIX = "[pgolf-sandbox] "
MONITOR_MAX_LINES = 50
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
_PATH_EVENTS = {
    "open": 0,
    "os.listdir": 0,
    "os.scandir": 0,
    "os.chdir": 0,
    "os.mkdir": 0,
    "os.remove": 0,
    "os.rmdir": 0,
    "os.rename": 1,
    "os.link": 0,
    "os.symlink": 1,
    "os.truncate": 0,
    "os.chmod": 0,
    "os.chown": 0,
    "glob.glob": 0,
}
_WRITE_EVENTS = {
    "os.mkdir",
    "os.remove",
    "os.rmdir",
    "os.rename",
    "os.link",
    "os.symlink",
    "os.truncate",
    "os.chmod",
    "os.chown",
}


class AccessMonitor:
    """A `sys.addaudithook` hook that reports file accesses the sandbox's rules do not allow.

    Landlock refuses such an access; this hook says who tried: each attempt becomes one line
    `[pgolf-sandbox] {json}` on stderr (the phase's log, which the process cannot rewrite), naming the
    event, the path, and the submission's frame that made it (file:line), if any. Audit hooks cannot
    be removed, but they see only what Python's own functions do in this process: opens made from C
    code (numpy's fromfile, ctypes) or by a child process are refused by Landlock without being
    reported here.
    """

    def __init__(
        self,
        *,
        rank: int,
        read: Sequence[str],
        listing: Sequence[str],
        write: Sequence[str],
        attribute_to: str,
    ):
        self.rank = rank
        self.read, self.listing, self.write = tuple(read), tuple(listing), tuple(write)
        self.attribute_to = attribute_to.rstrip("/") + "/"
        self.attempts = 0
        self._busy = False

    def allowed(self, path: str, event: str, writing: bool) -> bool:
        real = os.path.realpath(path)
        if writing:
            return any(is_beneath(real, r) for r in self.write)
        if event in ("os.listdir", "os.scandir", "os.chdir", "glob.glob"):
            return any(is_beneath(real, r) for r in (*self.listing, *self.read))
        return any(is_beneath(real, r) for r in self.read)

    def __call__(self, event: str, args: tuple[Any, ...]) -> None:
        idx = _PATH_EVENTS.get(event)
        if idx is None or self._busy:
            return
        self._busy = True
        try:
            path = args[idx] if len(args) > idx else None
            if path is None and event in ("os.listdir", "os.scandir"):
                path = "."
            if isinstance(path, bytes):
                path = os.fsdecode(path)
            if not isinstance(path, str):
                return  # a file descriptor: checked when it was opened
            writing = event in _WRITE_EVENTS
            if event == "open":
                mode, flags = (args[1] if len(args) > 1 else None), (args[2] if len(args) > 2 else 0)
                writing = (isinstance(mode, str) and any(c in mode for c in "wax+")) or bool(
                    (flags or 0) & _WRITE_FLAGS
                )
            if self.allowed(path, event, writing):
                return
            self.attempts += 1
            if self.attempts > MONITOR_MAX_LINES:
                return
            caller = sys._getframe(1)
            frame: FrameType | None = caller
            where = None
            inner = f"{caller.f_code.co_filename}:{caller.f_lineno}"
            while frame is not None:
                if frame.f_code.co_filename.startswith(self.attribute_to):
                    where = f"{frame.f_code.co_filename[len(self.attribute_to) :]}:{frame.f_lineno}"
                    break
                frame = frame.f_back
            line = {
                "rank": self.rank,
                "event": event,
                "path": os.path.abspath(path),
                "write": writing,
                "submission_frame": where,
                "frame": inner,
            }
            os.write(2, (MONITOR_PREFIX + json.dumps(line) + "\n").encode())
        except Exception:  # noqa: BLE001 - a reporting hook must never break the process it watches
            pass
        finally:
            self._busy = False


def monitor_from_rules(rules: Sequence[dict[str, str]], rank: int, attribute_to: str) -> AccessMonitor:
    by = {
        k: [r["path"] for r in rules if r["access"] in kinds]
        for k, kinds in (("read", ("ro", "rw", "dev")), ("listing", ("list",)), ("write", ("rw", "dev")))
    }
    return AccessMonitor(
        rank=rank, read=by["read"], listing=by["listing"], write=by["write"], attribute_to=attribute_to
    )


def parse_attempts(log_text: str) -> list[dict[str, Any]]:
    """The attempts reported in a phase log (lines a process wrote later cannot remove earlier ones)."""
    out = []
    for line in log_text.splitlines():
        if line.startswith(MONITOR_PREFIX):
            try:
                out.append(json.loads(line[len(MONITOR_PREFIX) :]))
            except (ValueError, RecursionError):  # deep nesting: RecursionError
                continue
    return out
