"""A stop from outside ends a run as Ctrl-C does: with its record.

SIGINT (Ctrl-C) raises KeyboardInterrupt in Python's main thread. SIGTERM (`kill`, a scheduler's time limit
or preemption: Slurm sends it before SIGKILL) would end the process at once, with no result.json and no
ledger line; inside `stop_signals_interrupt()` it raises `Terminated`, a KeyboardInterrupt, so the same
paths end the run: the phase's process group is killed, the record says `interrupted`, naming the signal,
and the exit status is 128 + the signal's number.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType


class Terminated(KeyboardInterrupt):
    """SIGTERM arrived: the run stops as after Ctrl-C."""

    signum = signal.SIGTERM


def how_stopped(e: BaseException) -> tuple[str, int]:
    """(the words for the record, the signal's number) of an interrupt."""
    if isinstance(e, Terminated):
        return "SIGTERM", int(signal.SIGTERM)
    return "SIGINT (Ctrl-C)", int(signal.SIGINT)


def _raise_terminated(signum: int, frame: FrameType | None) -> None:
    raise Terminated()


@contextmanager
def stop_signals_interrupt() -> Iterator[None]:
    """SIGTERM raises Terminated while inside (main thread only: elsewhere signals cannot be handled)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


@contextmanager
def stop_signals_ignored() -> Iterator[None]:
    """While the record is written, a second Ctrl-C or SIGTERM cannot cut it short (main thread only)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {s: signal.signal(s, signal.SIG_IGN) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
