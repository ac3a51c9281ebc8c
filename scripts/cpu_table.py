"""The CPU-track table: one row per run folder, from the run's own result.json (pg-result).

    python scripts/cpu_table.py RUN_DIR... [--load-log FILE] [--write README.md]

Columns: the submission, its track and status, training steps, training seconds (the supervisor's
clock), training tokens/s (tokens seen / training seconds), val_bpb, bytes_total, the cores other
processes kept busy during the run's train and score phases (its result's `machine_load`), and, with
`--load-log`, the machine's mean 1-minute load average over the run (a file of lines
`UNIX_SECONDS LOAD1 LOAD5 LOAD15`, e.g. written every 10 s by a loop reading /proc/loadavg): on a
shared machine that number says how far the tokens/s of a run are the machine's.

With `--write FILE` the table replaces what lies between the lines `<!-- cpu-table:begin -->`
and `<!-- cpu-table:end -->` of FILE (baselines/README.md), so the table is always the command's output.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

BEGIN, END = "<!-- cpu-table:begin -->", "<!-- cpu-table:end -->"
COLUMNS = (
    "run",
    "submission",
    "track",
    "status",
    "steps",
    "train s",
    "train tokens/s",
    "val_bpb",
    "bytes_total",
    "load (1-min avg)",
    "others' cores train / score",
)


def read_result(run_dir: Path) -> dict[str, Any]:
    path = run_dir / "result.json"
    try:
        obj = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ValueError(f"{path}: no result.json; pass run folders written by `pgolf run`") from None
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not JSON ({e}); pass run folders written by `pgolf run`") from None
    if not isinstance(obj, dict) or obj.get("format") != "pg-result":
        raise ValueError(f"{path}: not a pg-result record; pass run folders written by `pgolf run`")
    return obj


def read_load_log(path: Path) -> list[tuple[float, float]]:
    samples = []
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        parts = line.split()
        if not parts:
            continue
        try:
            samples.append((float(parts[0]), float(parts[1])))
        except (IndexError, ValueError):
            raise ValueError(f"{path}:{n}: expected 'UNIX_SECONDS LOAD1 ...', got {line!r}") from None
    return samples


def mean_load(result: dict[str, Any], samples: list[tuple[float, float]]) -> float | None:
    """Mean 1-minute load over the run: from its end (created_unix_s) back over its pipeline time."""
    end = result.get("created_unix_s")
    span = (result.get("phase_times_s") or {}).get("pipeline")
    if not isinstance(end, int | float) or not isinstance(span, int | float):
        return None
    inside = [load for t, load in samples if end - span <= t <= end]
    return sum(inside) / len(inside) if inside else None


def _num(value: Any, fmt: str) -> str:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return "-"
    return format(value, fmt)


def row(run_dir: Path, result: dict[str, Any], samples: list[tuple[float, float]] | None) -> list[str]:
    steps, tokens, train_s = result.get("steps"), result.get("tokens_seen"), result.get("train_time_s")
    rate = (
        tokens / train_s
        if isinstance(tokens, int) and isinstance(train_s, int | float) and train_s > 0
        else None
    )
    load = mean_load(result, samples) if samples is not None else None
    return [
        run_dir.name,
        str((result.get("submission") or {}).get("name", "-")),
        str(result.get("track", "-")),
        str(result.get("status", "-")),
        _num(steps, ","),
        _num(train_s, ".1f"),
        _num(rate, ",.0f"),
        _num(result.get("val_bpb"), ".4f"),
        _num(result.get("bytes_total"), ","),
        _num(load, ".1f") if samples is not None else "not logged",
        _others(result),
    ]


def _others(result: dict[str, Any]) -> str:
    """The run's own record of other processes' CPU use (harness/run/load.py), per phase: the measure of
    whether its tokens/s are the machine's."""
    phases = result.get("machine_load") or {}
    cells = [_num((phases.get(p) or {}).get("others_cores"), ".2f") for p in ("train", "score")]
    return " / ".join(cells)


def table(run_dirs: list[Path], load_log: Path | None = None) -> str:
    samples = read_load_log(load_log) if load_log else None
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + " --- |" * len(COLUMNS)]
    for d in run_dirs:
        lines.append("| " + " | ".join(row(d, read_result(d), samples)) + " |")
    return "\n".join(lines) + "\n"


def write_between_markers(path: Path, text: str) -> None:
    doc = path.read_text(encoding="utf-8")
    if doc.count(BEGIN) != 1 or doc.count(END) != 1 or doc.index(BEGIN) > doc.index(END):
        raise ValueError(f"{path}: needs exactly one line {BEGIN} followed by one line {END}")
    head, rest = doc.split(BEGIN)
    _, tail = rest.split(END)
    path.write_text(f"{head}{BEGIN}\n{text}{END}{tail}", encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="cpu_table.py", description=__doc__.split("\n\n")[0])
    p.add_argument("runs", nargs="+", type=Path, help="run folders (each with result.json)")
    p.add_argument("--load-log", type=Path, help="lines 'UNIX_SECONDS LOAD1 ...' sampled during the runs")
    p.add_argument("--write", type=Path, help="replace the table between the cpu-table markers of this file")
    args = p.parse_args(argv)
    try:
        text = table(args.runs, args.load_log)
        if args.write:
            write_between_markers(args.write, text)
    except (ValueError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(text, end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
