"""`wait_until`: poll a condition until it holds or a deadline passes, instead of a fixed sleep.

A sleep long enough for a loaded 2-core machine is a waste on an idle one, and one short enough for an
idle machine fails under load; a poll with a generous deadline is both fast and patient."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_until(
    condition: Callable[[], T],
    timeout_s: float,
    what: str,
    *,
    poll_s: float = 0.05,
    now: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> T:
    """The first truthy value of `condition()`; AssertionError naming `what` once `timeout_s` has passed."""
    deadline = now() + timeout_s
    while True:
        value = condition()
        if value:
            return value
        if now() >= deadline:
            raise AssertionError(f"timed out after {timeout_s:g} s waiting for {what}")
        sleep(poll_s)
