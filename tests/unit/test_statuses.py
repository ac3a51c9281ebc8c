"""Every status the code can write is in docs/RULES.md's status table, and the table has nothing else.

The code's statuses are read from its source (the AST, as tests/unit/test_architecture.py reads imports):
every string literal or `Status.X` / `Verification.X` member in a status position of harness/ and scoring/
(a `status=` argument or parameter default, a dict's "status" value, an assignment to or a comparison with a
`status`, a WorkerFailure's or FolderRefused's status). Each must be one of scoring/statuses.py's names; a
new status is a row of the table first. A result refuses any other.
"""

from __future__ import annotations

import ast
import re

import pytest

from scoring import statuses
from scoring.statuses import STATUSES, VERIFICATION_STATES, VERIFY_ERROR, Status, Verification
from tests.conftest import REPO

RULES = REPO / "docs" / "RULES.md"
ENUMS = {"Status": Status, "Verification": Verification}
NAMES = {n: v for n, v in vars(statuses).items() if n.isupper() and isinstance(v, Status | Verification)}
"""scoring/statuses.py's module-level names of a member (OK, VERIFIED, VERIFY_ERROR, ...)."""
CONSTRUCTORS = ("WorkerFailure", "FolderRefused", "require_status")
"""Calls whose first argument is a status."""


def _literals(node: ast.AST):
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        yield node.value
    elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in ENUMS:
        members = ENUMS[node.value.id].__members__
        yield members[node.attr].value if node.attr in members else f"{node.value.id}.{node.attr}"
    elif isinstance(node, ast.Name) and node.id in NAMES:
        yield NAMES[node.id].value
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
    """(file, line, literal) of every string literal or member in a status position of harness/ and scoring/."""
    found = []
    for f in sorted([*(REPO / "harness").rglob("*.py"), *(REPO / "scoring").rglob("*.py")]):
        rel = str(f.relative_to(REPO))
        found += [(rel, line, lit) for line, lit in statuses_in(ast.parse(f.read_text(encoding="utf-8")))]
    return found


def statuses_in(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, status) of every status position of one module: a literal's text, a member's value, or
    "Status.NAME" for a member Status does not have."""
    found = []
    for n in ast.walk(tree):
        values: list[ast.AST] = []
        if isinstance(n, ast.Call):
            values += [kw.value for kw in n.keywords if kw.arg == "status"]
            name = n.func.id if isinstance(n.func, ast.Name) else getattr(n.func, "attr", "")
            if name in CONSTRUCTORS and n.args:
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
        elif isinstance(n, ast.AnnAssign) and _is_status(n.target) and n.value is not None:
            values.append(n.value)
        elif isinstance(n, ast.Compare) and any(_is_status(e) for e in (n.left, *n.comparators)):
            values += [n.left, *n.comparators]
        elif isinstance(n, ast.arguments):  # a `status` parameter's default
            pos = [*n.posonlyargs, *n.args]
            pairs = [*zip(pos[len(pos) - len(n.defaults) :], n.defaults, strict=True)]
            pairs += [(a, d) for a, d in zip(n.kwonlyargs, n.kw_defaults, strict=True) if d is not None]
            values += [d for a, d in pairs if a.arg == "status"]
        found += [(getattr(v, "lineno", 0), lit) for v in values for lit in _literals(v)]
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


def test_the_scan_reads_literals_members_and_names_in_every_status_position():
    src = (
        "from scoring.statuses import OK, Status\n"
        "f(status=Status.OK)\n"
        "d = {'status': Status.NOPE}\n"
        "if r.status == OK or x.get('status') != 'illegal':\n    pass\n"
        "status = Status.ERROR if a else Status.OVER_CAP\n"
        "def g(status: str = 'passed'): ...\n"
        "raise FolderRefused(Status.OVER_CAP, p, 'm')\n"
        "r.status: str = Status.INTERRUPTED\n"
        "h(kind=Status.OK, state='ok')\n"  # not status positions
    )
    assert sorted(statuses_in(ast.parse(src))) == [
        (2, "ok"),
        (3, "Status.NOPE"),
        (4, "illegal"),
        (4, "ok"),
        (6, "error"),
        (6, "over_cap"),
        (7, "passed"),
        (8, "over_cap"),
        (9, "interrupted"),
    ]


def test_the_status_type_is_its_strings():
    import json

    from scoring.statuses import OK, SCORED, require_status

    assert [s.value for s in Status] == list(STATUSES) and OK is Status.OK == "ok"
    assert json.dumps({"status": Status.OVER_EVAL_BUDGET}) == '{"status": "over_eval_budget"}'
    assert f"{Status.ERROR} {Status.ERROR!r}" == "error 'error'" and "ok" in SCORED and Status.OK in SCORED
    assert require_status("illegal") is Status.ILLEGAL
    for bad in ("passed", None, 1, ["ok"]):
        with pytest.raises(ValueError, match="is not one of ok, error"):
            require_status(bad)
    assert [v.value for v in Verification] == list(VERIFICATION_STATES)


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
