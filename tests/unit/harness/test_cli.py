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


def test_help_and_version_import_no_command_module():
    """`pgolf --help`, `--version` and a mistyped command answer from SUMMARIES: no torch, no scipy, no
    command module (they took 5.5-13 s on a busy 2-core machine when --help imported every command)."""
    import json
    import subprocess
    import sys

    from harness.cli import COMMANDS, SUMMARIES

    assert list(SUMMARIES) == list(COMMANDS)
    code = (
        "import contextlib, io, json, sys\n"
        "from harness.cli import main\n"
        "out = {}\n"
        "for argv in (['--help'], ['--version'], ['rnu', 'x'], []):\n"
        "    buf, err = io.StringIO(), io.StringIO()\n"
        "    with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(err):\n"
        "        try:\n"
        "            main(argv)\n"
        "        except SystemExit as e:\n"
        "            out[' '.join(argv)] = [e.code, buf.getvalue(), err.getvalue()]\n"
        "heavy = sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'scipy', 'numpy'))\n"
        "mods = sorted({m for m in sys.modules if m.startswith(('harness.', 'scoring.', 'data.'))})\n"
        "print(json.dumps({'out': out, 'heavy': heavy, 'mods': mods}))\n"
    )
    r = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=120, check=True
    )
    got = json.loads(r.stdout)
    assert got["heavy"] == [] and got["mods"] == ["harness.cli"], got
    out = got["out"]
    assert out["--help"][0] == 0 and all(name in out["--help"][1] for name in COMMANDS)
    assert out["--version"][0] == 0 and out["--version"][1].startswith("pgolf 0.")
    assert out["rnu x"][0] == 2 and "invalid choice: 'rnu'" in out["rnu x"][2]
    assert out[""][0] == 2 and "required: COMMAND" in out[""][2]
