"""The dependency direction of DESIGN.md, checked by reading every import.

harness -> scoring -> data;  data imports nothing of the project;  scoring never imports harness.
harness/api.py imports no other harness module.
A submission folder imports only harness.api and its own files (and torch / stdlib / numpy).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.conftest import REPO

PROJECT = ("harness", "scoring", "data")
ALLOWED = {"data": set(), "scoring": {"data"}, "harness": {"scoring", "data"}}


def imports_of(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module)
        elif isinstance(node, ast.ImportFrom) and node.level > 0:
            found.add("." * node.level + (node.module or ""))
    return found


def package_files(pkg: str) -> list[Path]:
    return sorted((REPO / pkg).rglob("*.py"))


@pytest.mark.parametrize("pkg", PROJECT)
def test_packages_import_in_one_direction(pkg):
    bad = []
    for f in package_files(pkg):
        for mod in imports_of(f):
            top = mod.split(".")[0]
            if mod.startswith("."):
                bad.append((f.relative_to(REPO), mod, "relative import"))
            elif top in PROJECT and top != pkg and top not in ALLOWED[pkg]:
                bad.append(
                    (
                        f.relative_to(REPO),
                        mod,
                        f"{pkg} may import only {sorted(ALLOWED[pkg]) or 'nothing of the project'}",
                    )
                )
    assert not bad, bad


def test_api_module_imports_no_other_harness_module():
    mods = imports_of(REPO / "harness" / "api.py")
    assert not [m for m in mods if m.split(".")[0] in PROJECT], mods


def _submission_dirs() -> list[Path]:
    return [
        p.parent
        for p in sorted(REPO.glob("baselines/*/train.py")) + sorted(REPO.glob("submissions/*/train.py"))
    ]


@pytest.mark.parametrize("folder", _submission_dirs(), ids=lambda p: p.name)
def test_submissions_import_only_the_api_and_their_own_files(folder):
    own = {p.stem for p in folder.glob("*.py")}
    for f in folder.glob("*.py"):
        for mod in imports_of(f):
            top = mod.split(".")[0]
            if top in PROJECT:
                assert mod == "harness.api", (
                    f"{f.relative_to(REPO)} imports {mod}: a submission may import harness.api only"
                )
            if f.name == "model.py":
                assert top in {"torch", "math", "dataclasses", "typing", "__future__"} | own, (
                    f"{f.relative_to(REPO)} imports {mod}: model.py is torch only (the scorer loads it without a harness)"
                )


def test_the_checker_catches_a_violation(tmp_path):
    bad = tmp_path / "x.py"
    bad.write_text("from harness.run.pipeline import run_pipeline\nimport scoring.artifact.cap\n")
    assert {"harness.run.pipeline", "scoring.artifact.cap"} <= imports_of(bad)
