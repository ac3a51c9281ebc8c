"""The test suite's figures, measured: count, time, the slowest files; written to docs/FIGURES.md.

    python scripts/suite_figures.py [--out docs/FIGURES.md] [-- PYTEST_ARGS ...]
    python scripts/suite_figures.py --from-junit FILE --wall-s S --load "L1 L5 L15"   a run made elsewhere
                                    (e.g. .ci/run with PYTEST_ADDOPTS=--junitxml=FILE), summarized

Runs the README's test command (`python -m pytest -q`, the default run; `-m long` after `--` for the long
set) with a JUnit report, and writes what it measured: passed / skipped / failed, the wall time, the
machine (CPU model, AVX-512 or AVX2, cores, load before the run) and the ten files that took longest
(their tests' summed seconds, across both workers). Figures that change live in that file, made by this
command, not in the README's prose.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import platform
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path

FIGURES_FORMAT_VERSION = 1
REPO = Path(__file__).resolve().parents[1]


def cpu_facts() -> str:
    model, flags = platform.processor() or "unknown CPU", set()
    try:
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8").splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
            elif line.startswith("flags"):
                flags = set(line.split(":", 1)[1].split())
    except OSError:
        pass
    isa = "AVX-512" if "avx512f" in flags else ("AVX2" if "avx2" in flags else "neither AVX2 nor AVX-512")
    bf16 = " with BF16" if "avx512_bf16" in flags else ""
    return f"{model}, {isa}{bf16}, {os.cpu_count()} cores"


def summarize(junit: Path) -> tuple[Counter[str], dict[str, float]]:
    """(outcome -> count, file -> summed seconds) from a JUnit XML report."""
    outcomes: Counter[str] = Counter()
    per_file: dict[str, float] = {}
    for case in ET.parse(junit).getroot().iter("testcase"):
        kinds = {child.tag for child in case}
        outcome = next((k for k in ("failure", "error", "skipped") if k in kinds), "passed")
        outcomes[outcome] += 1
        name = case.get("classname", "").replace(".", "/") + ".py"
        per_file[name] = per_file.get(name, 0.0) + float(case.get("time", 0.0))
    return outcomes, per_file


def render(
    outcomes: Counter[str], per_file: dict[str, float], wall_s: float, args: list[str], load: str
) -> str:
    today = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    counts = ", ".join(f"{outcomes[k]} {k}" for k in ("passed", "skipped", "failure", "error") if outcomes[k])
    rows = sorted(per_file.items(), key=lambda kv: -kv[1])[:10]
    lines = [
        "# The suite's figures",
        "",
        f"<!-- format pg-figures v{FIGURES_FORMAT_VERSION}; made by `python scripts/suite_figures.py`: do not edit -->",
        "",
        f"- command: `python -m pytest -q{(' ' + ' '.join(args)) if args else ''}`",
        f"- measured: {today}, Python {platform.python_version()}",
        f"- machine: {cpu_facts()}; load average before the run {load}",
        f"- tests: {counts}",
        f"- wall time: {wall_s:.1f} s ({wall_s / 60:.1f} minutes)",
        "",
        "| file | seconds (its tests, summed) |",
        "| --- | ---: |",
        *(f"| {name} | {secs:.1f} |" for name, secs in rows),
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=REPO / "docs" / "FIGURES.md")
    p.add_argument("pytest_args", nargs="*", help="after `--`: more pytest arguments (e.g. -m long)")
    p.add_argument("--from-junit", type=Path, help="summarize this JUnit report instead of running pytest")
    p.add_argument("--wall-s", type=float, help="with --from-junit: the run's measured wall time")
    p.add_argument("--load", help="with --from-junit: the load average before that run")
    args = p.parse_args(argv)
    if args.from_junit is not None:
        if args.wall_s is None or args.load is None:
            p.error("--from-junit needs --wall-s and --load (what that run measured)")
        outcomes, per_file = summarize(args.from_junit)
        args.out.write_text(
            render(outcomes, per_file, args.wall_s, args.pytest_args, args.load), encoding="utf-8"
        )
        print(f"suite_figures: wrote {args.out} from {args.from_junit}")
        return 0
    load = "{:.2f} {:.2f} {:.2f}".format(*os.getloadavg())
    with tempfile.TemporaryDirectory() as tmp:
        junit = Path(tmp) / "junit.xml"
        t0 = time.perf_counter()
        proc = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", f"--junitxml={junit}", *args.pytest_args],
            cwd=REPO,
            check=False,
        )
        wall_s = time.perf_counter() - t0
        if not junit.exists():
            print(
                f"suite_figures: pytest wrote no report (exit {proc.returncode}); nothing written",
                file=sys.stderr,
            )
            return proc.returncode or 1
        outcomes, per_file = summarize(junit)
    args.out.write_text(render(outcomes, per_file, wall_s, args.pytest_args, load), encoding="utf-8")
    print(f"suite_figures: wrote {args.out} ({wall_s:.1f} s)")
    return proc.returncode


if __name__ == "__main__":
    sys.exit(main())
