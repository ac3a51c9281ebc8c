"""`pgolf new NAME`: a new submission folder, copied from a baseline, that runs as it is.

    pgolf new NAME [--from BASELINE] [--out DIR]

Where it goes: `--out DIR` if given; otherwise `submissions/YYYY-MM-DD_NAME` (today's date, the
folder name an entry has in a pull request, submissions/README.md) when the current folder has a
`submissions/` folder (a clone of the repository), else `./YYYY-MM-DD_NAME`. An existing path is
never touched: the command refuses (exit 2, one line).

What it writes: the baseline's counted files (model.py, train.py, config.toml with every preset,
any codec.py or local module), copied through the harness's own staging (harness/run/staging.py:
lstat rules, no links, no bytecode), then a fresh submission.json (schema_version 1: name, today's
date, author from `git config user.name` or a placeholder, the baseline's track and data variant,
`builds_on` naming the baseline, a placeholder blurb) and a short README.md. The comment lines of
config.toml that name the baseline's path are pointed at the new folder.

BASELINE is a folder name under the harness's baselines/ (default naive_baseline) or a path to any
submission folder.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import re
import subprocess
from pathlib import Path
from typing import Any

from harness.api import CONFIG_FILE, README_FILE, SUBMISSION_JSON

PROJECT_ROOT = Path(__file__).resolve().parents[2]
BASELINES_DIR = PROJECT_ROOT / "baselines"
DEFAULT_BASELINE = "naive_baseline"
SUBMISSIONS_DIR = "submissions"
NAME_RE = re.compile(r"[a-z0-9][a-z0-9_]{0,47}")
"""An entry's short name: lower-case letters, digits and underscores, at most 48 characters."""
AUTHOR_PLACEHOLDER = "YOUR NAME"
GITHUB_PLACEHOLDER = "your-github-id"
BLURB_PLACEHOLDER = "One sentence: what this entry changes from its baseline, and why."
PLACEHOLDERS = frozenset({AUTHOR_PLACEHOLDER, GITHUB_PLACEHOLDER, BLURB_PLACEHOLDER})
"""Values `pgolf new` writes for a person to replace; `pgolf check` names any left."""


def resolve_baseline(spec: str) -> Path:
    """A baseline name under baselines/, or a path to a submission folder."""
    path = Path(spec)
    if path.is_dir():
        return path
    named = BASELINES_DIR / spec
    if "/" not in spec and named.is_dir():
        return named
    known = (
        ", ".join(sorted(p.name for p in BASELINES_DIR.iterdir() if p.is_dir()))
        if BASELINES_DIR.is_dir()
        else ""
    )
    raise FileNotFoundError(
        f"--from {spec}: no such folder and no baseline of that name; baselines: {known or '(none)'}, or give a path"
    )


def default_out(name: str, today: dt.date, cwd: Path) -> Path:
    """submissions/YYYY-MM-DD_NAME inside a clone (a submissions/ folder here), else ./YYYY-MM-DD_NAME."""
    folder = f"{today.isoformat()}_{name}"
    return cwd / SUBMISSIONS_DIR / folder if (cwd / SUBMISSIONS_DIR).is_dir() else cwd / folder


def git_author(cwd: Path) -> str | None:
    """`git config user.name`, or None where git or the setting is missing."""
    try:
        out = subprocess.run(
            ["git", "config", "user.name"], cwd=cwd, capture_output=True, text=True, timeout=5, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    name = out.stdout.strip()
    return name or None


def _label(baseline: Path) -> str:
    """How submission.json's builds_on names the baseline: baselines/NAME for the harness's own, else the path."""
    try:
        return baseline.resolve().relative_to(PROJECT_ROOT).as_posix()
    except ValueError:
        return str(baseline)


def new_submission(
    name: str,
    *,
    baseline: str = DEFAULT_BASELINE,
    out: str | Path | None = None,
    today: dt.date | None = None,
    author: str | None = None,
    cwd: Path | None = None,
) -> Path:
    """Write the folder (module docstring); returns its path. Raises FileExistsError, ValueError, FileNotFoundError."""
    from data.io import read_json
    from harness.run.staging import stage_folder
    from harness.submission import validate_metadata

    if not NAME_RE.fullmatch(name):
        raise ValueError(
            f"NAME {name!r}: use lower-case letters, digits and underscores (at most 48, e.g. my_entry); "
            "it becomes the folder YYYY-MM-DD_NAME and submission.json's name"
        )
    cwd = Path.cwd() if cwd is None else cwd
    today = dt.date.today() if today is None else today
    src = resolve_baseline(baseline)
    dest = Path(out) if out is not None else default_out(name, today, cwd)
    if dest.exists() or dest.is_symlink():
        raise FileExistsError(
            f"{dest} already exists: pgolf new never overwrites; pick another NAME or --out"
        )
    base_meta: dict[str, Any] = read_json(src / SUBMISSION_JSON, what="the baseline's submission metadata")
    base_meta = validate_metadata(base_meta, str(src / SUBMISSION_JSON))
    stage_folder(src, dest)  # the counted files only, every folder rule applied; dest made last
    label = _label(src)
    meta = {
        "schema_version": 1,
        "name": name,
        "author": author or git_author(cwd) or AUTHOR_PLACEHOLDER,
        "github_id": GITHUB_PLACEHOLDER,
        "date": today.isoformat(),
        "track": base_meta["track"],
        "data_variant": base_meta["data_variant"],
        "blurb": BLURB_PLACEHOLDER,
        "builds_on": label,
    }
    (dest / SUBMISSION_JSON).write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")
    config = dest / CONFIG_FILE
    if config.is_file():
        lines = config.read_text(encoding="utf-8").splitlines(keepends=True)
        shown = dest.as_posix() if out is not None else dest.relative_to(cwd).as_posix()
        config.write_text(
            "".join(ln.replace(label, shown) if ln.lstrip().startswith("#") else ln for ln in lines),
            encoding="utf-8",
        )
    (dest / README_FILE).write_text(_readme(name, label, dest, cwd), encoding="utf-8")
    return dest


FIRST_PRESETS = ("cpu-smoke", "tiny", "cpu")
"""The preset a new folder's first run suggests: the first of these its config.toml has."""


def first_preset(folder: Path) -> str | None:
    """The preset to suggest for a first CPU run of `folder` (None: it has none of FIRST_PRESETS)."""
    import tomllib

    try:
        presets = tomllib.loads((folder / CONFIG_FILE).read_text(encoding="utf-8")).get("presets") or {}
    except (OSError, ValueError):
        return None
    return next((p for p in FIRST_PRESETS if p in presets), None)


def _preset_flag(preset: str | None) -> str:
    return f" --preset {preset}" if preset else ""


def _readme(name: str, label: str, dest: Path, cwd: Path) -> str:
    try:
        shown = dest.relative_to(cwd).as_posix()
    except ValueError:
        shown = str(dest)
    preset = first_preset(dest)
    flag = _preset_flag(preset)
    took = (
        "about 2.5 minutes on 2 CPU cores" if preset == "cpu-smoke" else "a CPU run of the baseline's preset"
    )
    return (
        f"# {name}\n\n"
        f"Builds on `{label}`. Say here what this entry changes and why (not counted against the cap).\n\n"
        "```bash\n"
        f"pgolf check {shown}{flag}     # seconds: schema, config, lint, model shape, bytes\n"
        f"pgolf run {shown}{flag}       # {took}\n"
        "```\n\n"
        "The guide from here to an official run and a pull request: docs/SUBMITTING.md.\n"
    )


def cmd_new(args: argparse.Namespace) -> int:
    dest = new_submission(args.name, baseline=args.from_baseline, out=args.out)
    try:
        shown = dest.relative_to(Path.cwd()).as_posix()
    except ValueError:
        shown = str(dest)
    print(f"wrote {shown} (from {args.from_baseline}); fill author, github_id and blurb in {SUBMISSION_JSON}")
    flag = _preset_flag(first_preset(dest))
    print(f"next: pgolf check {shown}{flag} && pgolf run {shown}{flag}")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "new",
        help="write a new submission folder from a baseline (runs as it is)",
        description=(
            "Copies a baseline's code, config.toml and presets into a new folder and writes its "
            "submission.json (name, today's date, author from git config user.name, builds_on). "
            "Default folder: submissions/YYYY-MM-DD_NAME in a clone of the repository, else ./YYYY-MM-DD_NAME."
        ),
        epilog="exit status: 0 written; 2 usage error (bad NAME, unknown baseline, the folder exists)",
    )
    p.add_argument("name", help="short name: lower-case letters, digits, underscores")
    p.add_argument(
        "--from",
        dest="from_baseline",
        default=DEFAULT_BASELINE,
        metavar="BASELINE",
        help=f"a baseline under baselines/ or a folder path (default {DEFAULT_BASELINE})",
    )
    p.add_argument("--out", help="the folder to write (must not exist)")
    p.set_defaults(func=cmd_new)
