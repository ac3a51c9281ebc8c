"""A phase's processes: found by the token in their environment, killed, reaped; tied to their parent.

A leaf of the isolation layer (it imports nothing of the project). Every process of a sandboxed
phase carries `TOKEN_ENV=<token>` in its environment from the start, so the supervisor finds them
all (a rank's grandchildren included, in a PID namespace or not) and kills what is left once the
phase ends. `kill_group_reaped` kills a group so that the CPU time of
every process in it is counted in ours (harness/run/load.py). `die_with_parent` is given to Popen as preexec_fn: when the harness itself dies (even by
SIGKILL), the kernel kills the phase's first process, and with it the PID namespace it leads.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import time
from collections.abc import Iterator

from isolation.sandbox import TOKEN_ENV

KILL_WAIT_S = 3.0
PR_SET_PDEATHSIG = 1


_PRCTL = ctypes.CDLL(None, use_errno=True).prctl  # bound before any fork: preexec_fn must not allocate


def die_with_parent() -> None:
    """preexec_fn: this child gets SIGKILL when the process that started it dies (prctl PR_SET_PDEATHSIG)."""
    _PRCTL(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def _proc_files(name: str) -> Iterator[tuple[int, bytes]]:
    """(pid, the bytes of /proc/PID/NAME) for every process whose file this process may read."""
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/{name}", "rb") as f:
                data = f.read()
        except OSError:  # gone, or not ours to read
            continue
        yield int(entry.name), data


def processes_with_token(token: str) -> list[int]:
    """PIDs whose initial environment holds TOKEN_ENV=token (readable for our own uid, or as root)."""
    needle = f"{TOKEN_ENV}={token}".encode()
    me = os.getpid()
    return [pid for pid, env in _proc_files("environ") if pid != me and needle in env.split(b"\0")]


def kill_token_processes(token: str) -> list[int]:
    """SIGKILL every process carrying the token; returns their PIDs."""
    pids = processes_with_token(token)
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    return pids


def reap_token_processes(token: str, wait_s: float) -> list[int]:
    """Processes of the phase still alive `wait_s` after it ended (a PID namespace's teardown is not instant): killed."""
    t_end = time.monotonic() + wait_s
    while processes_with_token(token) and time.monotonic() < t_end:
        time.sleep(0.05)
    return kill_token_processes(token)


def group_members(pgid: int) -> list[int]:
    """PIDs of process group `pgid`, its leader included (from /proc/PID/stat: state, ppid, pgrp after the name)."""
    found = []
    for pid, stat in _proc_files("stat"):
        fields = stat[stat.rfind(b")") + 2 :].split()  # the name may hold spaces and parentheses
        if len(fields) > 2 and int(fields[2]) == pgid:
            found.append(pid)
    return found


def kill_group_reaped(proc: subprocess.Popen, wait_s: float = KILL_WAIT_S) -> None:
    """SIGKILL a process group, its leader last, and reap the leader.

    One killpg kills the leader and its children at once: a child whose parent (`unshare --fork`, which
    waits on the model worker it forked) died first is handed to init, init reaps it, and its CPU time
    never reaches this process's getrusage(RUSAGE_CHILDREN). A score phase whose worker was killed at
    the eval deadline then read "1.96 of 2 cores busy with other processes" (a false CONTENDED). Killed
    first, the members are reaped by the leader, which then exits and is reaped here with their time.
    A leader that does not exit within `wait_s` of its members (it is the worker itself) is killed too.
    """
    if proc.poll() is None:
        others = [pid for pid in group_members(proc.pid) if pid != proc.pid]
        for pid in others:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        if others:
            try:
                proc.wait(timeout=wait_s)
            except subprocess.TimeoutExpired:
                pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # the leader, and whatever of the group is left
    except (ProcessLookupError, PermissionError):
        pass
    proc.wait()


def kill_session(proc: subprocess.Popen, first: signal.Signals = signal.SIGTERM) -> None:
    """Signal the session's group with `first` (a chance to stop cleanly), then kill what is left (kill_group_reaped)."""
    if first != signal.SIGKILL:
        try:
            os.killpg(proc.pid, first)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=KILL_WAIT_S)
            return
        except subprocess.TimeoutExpired:
            pass
    kill_group_reaped(proc)
