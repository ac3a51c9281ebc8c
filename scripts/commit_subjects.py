"""Commit subjects under 72 characters, the detail in the body (issue 25's habits).

    python scripts/commit_subjects.py --message-file .git/COMMIT_EDITMSG   a commit-msg hook (pre-commit)
    python scripts/commit_subjects.py [--since REV]                        every commit after REV (CI; default:
                                                                            the rule's start, SINCE)

Exit 1 with one line per long subject, naming the commit and its length; 0 when every subject fits.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

SUBJECT_MAX_CHARS = 72
SINCE = "fcc39e80941db3ae76855b5429c651ff9f33c556"
"""The last commit before the rule holds (a helper branch merged on the day it came in had one of 77):
older subjects are history and stay as they are."""


def long_subjects(subjects: dict[str, str]) -> list[str]:
    """One line per subject (commit or file -> subject) longer than SUBJECT_MAX_CHARS."""
    return [
        f"{where}: subject of {len(s)} characters (at most {SUBJECT_MAX_CHARS}; put the detail in the body): {s[:80]}"
        for where, s in subjects.items()
        if len(s) > SUBJECT_MAX_CHARS
    ]


def subjects_since(rev: str) -> dict[str, str] | None:
    """Commit -> subject of every commit after `rev`; None when `rev` is not in this clone (a shallow one)."""
    known = subprocess.run(["git", "cat-file", "-e", f"{rev}^{{commit}}"], capture_output=True, check=False)
    if known.returncode != 0:
        return None
    out = subprocess.run(
        ["git", "log", "--format=%h%x00%s", f"{rev}..HEAD"], capture_output=True, text=True, check=True
    ).stdout
    return dict(line.split("\0", 1) for line in out.splitlines() if line)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    g = p.add_mutually_exclusive_group()
    g.add_argument("--message-file", type=Path, help="a commit message (the commit-msg hook's argument)")
    g.add_argument(
        "--since",
        metavar="REV",
        default=SINCE,
        help=f"check every commit after REV (default: the rule's start, {SINCE[:7]})",
    )
    args = p.parse_args(argv)
    if args.message_file is not None:
        lines = [
            x for x in args.message_file.read_text(encoding="utf-8").splitlines() if not x.startswith("#")
        ]
        subjects = {str(args.message_file): lines[0] if lines else ""}
    else:
        found = subjects_since(args.since)
        if found is None:
            print(f"commit subjects: {args.since[:12]} is not in this clone (shallow?): not checked")
            return 0
        subjects = found
    bad = long_subjects(subjects)
    for line in bad:
        print(line, file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
