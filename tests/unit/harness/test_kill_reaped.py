"""A killed process group's CPU time is counted in ours (isolation/processes.py kill_group_reaped).

The machine-load record (harness/run/load.py) subtracts this process's and its reaped children's CPU
time from the machine's busy time. A model worker killed at the eval deadline runs under a parent that
waits on it (`unshare --fork`); one killpg killed both at once, init reaped the worker, and its CPU time
read as other processes' (int6_era's score phase: "1.96 of 2 cores busy with other processes").
"""

from __future__ import annotations

import os
import resource
import signal
import subprocess
import sys
import time

import pytest

from isolation.processes import group_members, kill_group_reaped, kill_session

# a parent that waits on a busy child, as `unshare --fork` waits on the model worker
PARENT = (
    "import subprocess, sys\n"
    "child = subprocess.Popen([sys.executable, '-c', 'while True: pass'])\n"
    "print(child.pid, flush=True)\n"
    "sys.exit(child.wait())\n"
)
BURN_S = 0.6


def _cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat", "rb") as f:
        fields = f.read().rsplit(b")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


def _children_cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def _burn_then_kill(kill) -> tuple[float, int]:
    """(CPU seconds that reached our RUSAGE_CHILDREN, the busy grandchild's pid) once `kill` ended the group."""
    before = _children_cpu_s()
    proc = subprocess.Popen(
        [sys.executable, "-c", PARENT], stdout=subprocess.PIPE, start_new_session=True, text=True
    )
    assert proc.stdout is not None
    child = int(proc.stdout.readline())
    t_end = time.monotonic() + 30
    while _cpu_s(child) < BURN_S:
        assert time.monotonic() < t_end, "the busy child never got 0.6 s of CPU"
        time.sleep(0.05)
    assert sorted(group_members(proc.pid)) == sorted([proc.pid, child])
    kill(proc)
    proc.stdout.close()
    return _children_cpu_s() - before, child


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="needs /proc (Linux)")
@pytest.mark.parametrize("kill", [kill_group_reaped, lambda p: kill_session(p, signal.SIGKILL)])
def test_the_killed_groups_cpu_time_is_counted_in_ours(kill) -> None:
    counted_s, child = _burn_then_kill(kill)
    assert counted_s >= BURN_S * 0.9, (
        f"only {counted_s:.2f} s of the grandchild's {BURN_S} s reached our rusage"
    )
    assert not os.path.exists(f"/proc/{child}"), "the grandchild was left running"


def test_a_leader_that_outlives_its_members_is_killed_too() -> None:
    """The leader is the worker itself (no `unshare` above it): killing its members does not end it."""
    proc = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import signal, time\nsignal.signal(signal.SIGCHLD, signal.SIG_IGN)\nprint('ready', flush=True)\n"
            "time.sleep(60)",
        ],
        start_new_session=True,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert (
        proc.stdout is not None and proc.stdout.readline() == "ready\n"
    )  # its handler is set: no fixed sleep
    proc.stdout.close()
    t0 = time.monotonic()
    kill_group_reaped(proc, wait_s=0.5)
    assert proc.returncode == -signal.SIGKILL and time.monotonic() - t0 < 5
