"""The closed CLI surface: every command and flag of `pgolf` is listed in tests/golden/cli.txt.

Adding a command or flag is a deliberate change: regenerate the golden with
    python -m tests.unit.harness.test_cli > tests/golden/cli.txt
and say why in the commit.
"""

from __future__ import annotations

import argparse

from harness.cli import build_parser
from tests.conftest import REPO

GOLDEN = REPO / "tests" / "golden" / "cli.txt"


def surface(parser: argparse.ArgumentParser, prefix: str = "pgolf") -> list[str]:
    lines = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in sorted(action.choices.items()):
                lines += surface(sub, f"{prefix} {name}")
        elif action.option_strings:
            if "--help" not in action.option_strings:
                lines.append(f"{prefix} {' '.join(sorted(action.option_strings))}")
        else:
            lines.append(f"{prefix} <{action.dest}>")
    return lines


def test_cli_surface_is_the_golden_one():
    want = [line for line in GOLDEN.read_text().splitlines() if line and not line.startswith("#")]
    assert surface(build_parser()) == want, (
        "the CLI changed: regenerate tests/golden/cli.txt (see this file's docstring)"
    )


if __name__ == "__main__":
    print(
        "# every command, positional and flag of pgolf; regenerate: python -m tests.unit.harness.test_cli > tests/golden/cli.txt"
    )
    print("\n".join(surface(build_parser())))
