"""The machine's load over a phase (training, scoring): was the run alone on its CPUs?

A CPU run is only as fair as the machine is quiet: with one other busy process on 2 cores the
cpu-smoke run made 8 steps in 60 s instead of 140 (OpenMP threads wait on each other). So each phase
records what else ran beside it, from two readings, at its start and its end, off the measured path
(nothing runs during the phase):

- /proc/stat's first line: the CPU time every process of the machine spent (user, nice, system, irq,
  softirq) and what the hypervisor took (steal), in clock ticks;
- getrusage(RUSAGE_SELF) + getrusage(RUSAGE_CHILDREN): this process's and its reaped children's CPU
  time (the phase's processes, once they are waited for);
- /proc/loadavg (1-minute) at both ends, for context.

others_cores = (machine busy - own) / wall: the mean number of cores other processes kept busy. A
phase is `contended` when that is at least CONTENDED_CORES, or the hypervisor stole as much. Where
/proc is not readable (not Linux) the record says so and nothing is marked.
"""

from __future__ import annotations

import os
import resource
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

LOAD_FORMAT = "pg-load"
LOAD_FORMAT_VERSION = 1
CONTENDED_CORES = 0.25
"""Other processes' mean CPU use, in cores, from which a phase is marked contended (a quarter core: on 2
cores, one OpenMP thread of two waiting a quarter of the time)."""


@dataclass(frozen=True)
class LoadReading:
    t_s: float
    busy_s: float | None
    """The machine's busy CPU seconds since boot (all processes), None where /proc/stat is unreadable."""
    steal_s: float | None
    own_s: float
    """This process's and its reaped children's CPU seconds."""
    loadavg_1m: float | None


def _proc_stat(text: str | None = None) -> tuple[float, float] | None:
    """(busy, steal) CPU seconds of the whole machine from /proc/stat's `cpu` line."""
    try:
        text = text if text is not None else Path("/proc/stat").read_text()
        fields = text.splitlines()[0].split()
        if fields[0] != "cpu":
            return None
        ticks = [int(v) for v in fields[1:]]
    except (OSError, IndexError, ValueError):
        return None
    hz = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    user, nice, system = ticks[0], ticks[1], ticks[2]
    irq, softirq = (ticks[5], ticks[6]) if len(ticks) > 6 else (0, 0)
    steal = ticks[7] if len(ticks) > 7 else 0
    return (user + nice + system + irq + softirq) / hz, steal / hz


def _loadavg() -> float | None:
    try:
        return float(Path("/proc/loadavg").read_text().split()[0])
    except (OSError, IndexError, ValueError):
        return None


def read_load() -> LoadReading:
    stat = _proc_stat()
    own = 0.0
    for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN):
        r = resource.getrusage(who)
        own += r.ru_utime + r.ru_stime
    return LoadReading(
        t_s=time.monotonic(),
        busy_s=None if stat is None else stat[0],
        steal_s=None if stat is None else stat[1],
        own_s=own,
        loadavg_1m=_loadavg(),
    )


def cpu_count() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def load_between(start: LoadReading, end: LoadReading, cores: int | None = None) -> dict[str, Any]:
    """The phase's load record ("pg-load"): mean cores busy with other processes, own, stolen; contended."""
    wall = max(end.t_s - start.t_s, 1e-9)
    cores = cores or cpu_count()
    own = max(end.own_s - start.own_s, 0.0) / wall
    rec: dict[str, Any] = {
        "format": LOAD_FORMAT,
        "format_version": LOAD_FORMAT_VERSION,
        "wall_s": round(wall, 3),
        "cores": cores,
        "own_cores": round(own, 3),
        "loadavg_1m_start": start.loadavg_1m,
        "loadavg_1m_end": end.loadavg_1m,
    }
    if start.busy_s is None or end.busy_s is None or start.steal_s is None or end.steal_s is None:
        rec.update(others_cores=None, steal_cores=None, contended=None, how="no /proc/stat: not measured")
        return rec
    busy = max(end.busy_s - start.busy_s, 0.0) / wall
    others = max(busy - own, 0.0)
    steal = max(end.steal_s - start.steal_s, 0.0) / wall
    rec.update(
        machine_busy_cores=round(busy, 3),
        others_cores=round(others, 3),
        steal_cores=round(steal, 3),
        contended=others >= CONTENDED_CORES or steal >= CONTENDED_CORES,
        how="/proc/stat busy time less this process's and its children's (getrusage), per second of the phase",
    )
    return rec


def describe(load: dict[str, Any] | None) -> str:
    """One phrase for the card: '0.05 of 2 cores busy with other processes (load 1.2 -> 1.4)'."""
    if not load:
        return "not measured"
    if load.get("others_cores") is None:
        return "not measured (no /proc/stat)"
    la0, la1 = load.get("loadavg_1m_start"), load.get("loadavg_1m_end")
    avg = f", load average {la0:.1f} -> {la1:.1f}" if la0 is not None and la1 is not None else ""
    steal = f", {load['steal_cores']:.2f} stolen" if load.get("steal_cores") else ""
    return f"{load['others_cores']:.2f} of {load['cores']} cores busy with other processes{steal}{avg}"


# ---- Thread counts from the measured load ----

THREADS_PROBE_S = 0.5
"""The window over which the load is measured before training chooses its thread count (off the clock)."""


def measure_load(
    window_s: float = THREADS_PROBE_S,
    *,
    read: Callable[[], LoadReading] = read_load,
    wait: Callable[[float], None] = time.sleep,
    cores: int | None = None,
) -> dict[str, Any]:
    """The machine's load over a short window of doing nothing (this process idle): what others use now."""
    start = read()
    wait(window_s)
    return load_between(start, read(), cores)


def choose_threads(load: dict[str, Any], ranks: int) -> dict[str, Any]:
    """Torch threads per rank from the cores other processes leave free ("pg-threads" record).

    free = cores - others_cores (the cores of this process's affinity less what other processes kept busy
    over the window), rounded to the nearest whole core, shared among the node's ranks, at least 1 each.
    OpenMP's threads wait for each other at every parallel region: with 2 threads on 2 cores and one core
    held by another process, the cpu-smoke run made 18 steps; with 1 thread, 5x more."""
    cores = int(load.get("cores") or cpu_count())
    others = load.get("others_cores")
    free = float(cores) if others is None else max(cores - float(others), 0.0)
    threads = max(1, min(int(free + 0.5), cores) // max(ranks, 1))
    if others is None:
        why = f"{cores} cores, load not measured: the cores divided among {ranks} rank(s)"
    else:
        why = (
            f"{cores} cores less {float(others):.2f} busy with other processes over {load.get('wall_s', 0):.1f} s "
            f"= {free:.2f} free, divided among {ranks} rank(s)"
        )
    return {
        "format": "pg-threads",
        "format_version": 1,
        "threads_per_rank": threads,
        "chosen_by": "load",
        "why": why,
        "load": load,
    }


def threads_set(threads: int) -> dict[str, Any]:
    """The record when launch.threads was given (nothing measured)."""
    return {
        "format": "pg-threads",
        "format_version": 1,
        "threads_per_rank": threads,
        "chosen_by": "launch.threads",
        "why": "set by launch.threads",
    }


def describe_threads(rec: dict[str, Any] | None) -> str:
    """One phrase for the card: '1 per rank, chosen from the load (2 cores less 1.01 busy ...)'."""
    if not rec:
        return "not recorded"
    n = rec.get("threads_per_rank")
    if rec.get("chosen_by") == "launch.threads":
        return f"{n} per rank (launch.threads)"
    return f"{n} per rank, chosen from the load ({rec.get('why')}); --set launch.threads=N fixes it"
