"""Every status the code can write is in docs/RULES.md's status table, and the table has nothing else.

The code's statuses are read from its source (the AST, as tests/unit/test_architecture.py reads imports):
every string literal in a status position of harness/ and scoring/ (a `status=` argument, a dict's
"status" value, an assignment to or a comparison with a `status`, a WorkerFailure's kind). Each must be one
of scoring/statuses.py's names; a new status is a row of the table first. A result refuses any other.
"""

from __future__ import annotations

import ast
import re

import pytest

from scoring.statuses import STATUSES, VERIFICATION_STATES, VERIFY_ERROR
from tests.conftest import REPO

RULES = REPO / "docs" / "RULES.md"


def _literals(node: ast.AST):
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        yield node.value
    elif isinstance(node, ast.IfExp):
        yield from _literals(node.body)
        yield from _literals(node.orelse)
    elif isinstance(node, ast.Tuple | ast.List | ast.Set):
        for e in node.elts:
            yield from _literals(e)


def _is_status(e: ast.AST) -> bool:
    if isinstance(e, ast.Name | ast.Attribute):
        return (e.id if isinstance(e, ast.Name) else e.attr) == "status"
    if isinstance(e, ast.Subscript):
        return isinstance(e.slice, ast.Constant) and e.slice.value == "status"
    if isinstance(e, ast.Call) and isinstance(e.func, ast.Attribute) and e.func.attr == "get" and e.args:
        return isinstance(e.args[0], ast.Constant) and e.args[0].value == "status"
    return False


def status_literals() -> list[tuple[str, int, str]]:
    """(file, line, literal) of every string literal in a status position of harness/ and scoring/."""
    found = []
    for f in sorted([*(REPO / "harness").rglob("*.py"), *(REPO / "scoring").rglob("*.py")]):
        rel = str(f.relative_to(REPO))
        for n in ast.walk(ast.parse(f.read_text(encoding="utf-8"))):
            values: list[ast.AST] = []
            if isinstance(n, ast.Call):
                values += [kw.value for kw in n.keywords if kw.arg == "status"]
                name = n.func.id if isinstance(n.func, ast.Name) else getattr(n.func, "attr", "")
                if name in ("WorkerFailure", "require_status") and n.args:
                    values.append(n.args[0])
            elif isinstance(n, ast.Dict):
                values += [
                    v
                    for k, v in zip(n.keys, n.values, strict=True)
                    if isinstance(k, ast.Constant) and k.value == "status"
                ]
            elif isinstance(n, ast.Assign):
                for t in n.targets:
                    if _is_status(t):
                        values.append(n.value)
                    elif isinstance(t, ast.Tuple) and isinstance(n.value, ast.Tuple):
                        values += [v for tt, v in zip(t.elts, n.value.elts, strict=False) if _is_status(tt)]
            elif isinstance(n, ast.Compare) and any(_is_status(e) for e in (n.left, *n.comparators)):
                values += [n.left, *n.comparators]
            found += [(rel, getattr(n, "lineno", 0), lit) for v in values for lit in _literals(v)]
    return found


def table_rows(heading_first_cell: str) -> list[str]:
    """The backticked first cells of the RULES.md 'Statuses' table whose header's first cell is given."""
    text = RULES.read_text(encoding="utf-8")
    section = text[text.index("## Statuses") :]
    section = section[: section.index("\n## ", 1)]
    rows, inside = [], False
    for line in section.splitlines():
        if line.startswith(f"| {heading_first_cell} |"):
            inside = True
            continue
        if inside and not line.startswith("|"):
            break
        m = re.match(r"\| `([a-z_]+)` \|", line)
        if inside and m:
            rows.append(m.group(1))
    return rows


def test_every_status_the_code_can_write_is_in_the_rules_table():
    found = status_literals()
    assert len(found) > 40, "the scan found too few status literals: it no longer reads the code"
    allowed = set(STATUSES) | set(VERIFICATION_STATES) | {VERIFY_ERROR}
    unknown = [f"{f}:{line}: {lit!r}" for f, line, lit in found if lit not in allowed]
    assert not unknown, "statuses outside docs/RULES.md's table:\n" + "\n".join(unknown)
    assert table_rows("status") == list(STATUSES)
    assert table_rows("verification") == [*VERIFICATION_STATES, VERIFY_ERROR]


def test_the_scorer_and_worker_verdicts_are_statuses():
    from scoring.score.cli import EXIT_CODES
    from scoring.worker.wire import ERROR_KINDS

    assert set(EXIT_CODES) <= set(STATUSES) and set(ERROR_KINDS) <= set(STATUSES)


def test_a_result_refuses_a_status_outside_the_table():
    from harness.run.result import ResultRecord

    kw = {"submission": {}, "track": "smoke", "preset": None, "created_unix_s": 1.0, "run_dir": "/r"}
    assert ResultRecord(status="ok", **kw).status == "ok"
    with pytest.raises(ValueError, match="result status 'passed' is not one of ok, error"):
        ResultRecord(status="passed", **kw)
    with pytest.raises(ValueError, match="result verification"):
        ResultRecord(status="ok", verification="trust me", **kw)
