"""The layers of docs/ARCHITECTURE.md, checked by reading every import of every module.

    layer              may import (of the project)
    isolation          nothing                       (kernel isolation: a leaf)
    data               nothing                       (shards, tokenizers, manifests)
    harness.api        nothing                       (the submission contract: a leaf)
    scoring            data, isolation, harness.api  (never the rest of harness: no training code)
    scoring.worker     as scoring, but nothing of scoring.score (the processes that run submitted code
                       load no scorer: what both sides share lives in scoring/worker/)
    harness            everything above
    harness.train      harness.api, harness.train, data, isolation, scoring.artifact.codecs
                       (a rank loads no scorer, no records: only the codecs' math, for the GPTQ pack step)
    harness.records    imported by no sealed process: not by scoring, not by harness.train

A submission folder imports only harness.api and its own files; model.py is torch only.
Imports inside functions count too (the AST is walked whole), so a lazy import cannot hide an edge.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.conftest import REPO

PACKAGES = ("harness", "scoring", "data", "isolation")
LAYERS: dict[str, frozenset[str]] = {
    "isolation": frozenset(),
    "data": frozenset(),
    "harness.api": frozenset(),
    "scoring": frozenset({"scoring", "data", "isolation", "harness.api"}),
    "harness.train": frozenset(
        {"harness.api", "harness.train", "data", "isolation", "scoring.artifact.codecs"}
    ),
    "harness": frozenset({"harness", "scoring", "data", "isolation"}),
}
"""Module prefix -> the project modules (by prefix) it may import; the longest matching prefix rules."""
NEVER: tuple[tuple[tuple[str, ...], str, str], ...] = (
    (("scoring", "harness.train"), "harness.records", "records are never loaded by a sealed process"),
    (
        ("scoring.worker",),
        "scoring.score",
        "the worker side (processes that run submitted code) loads no scorer",
    ),
)
"""(importing layers, imported prefix, why): edges no layer of the first may have, whatever LAYERS allows."""


def imports_of(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module)
            found.update(f"{node.module}.{a.name}" for a in node.names)  # `from harness import records`
        elif isinstance(node, ast.ImportFrom) and node.level > 0:
            found.add("." * node.level + (node.module or ""))
    return found


def module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _within(mod: str, prefix: str) -> bool:
    return mod == prefix or mod.startswith(prefix + ".")


def layer_of(mod: str) -> str:
    return max((p for p in LAYERS if _within(mod, p)), key=len)


def project_modules() -> dict[str, set[str]]:
    """Every module of the project -> the project modules it imports."""
    out = {}
    for pkg in PACKAGES:
        for f in sorted((REPO / pkg).rglob("*.py")):
            out[module_name(f)] = {
                m for m in imports_of(f) if m.split(".")[0] in PACKAGES or m.startswith(".")
            }
    return out


def violations(mods: dict[str, set[str]]) -> list[str]:
    bad = []
    for mod, imported in mods.items():
        allowed = LAYERS[layer_of(mod)] | {layer_of(mod)}  # a layer may import itself
        for imp in sorted(imported):
            if imp.startswith("."):
                bad.append(f"{mod}: relative import {imp!r}")
            elif not any(_within(imp, a) for a in allowed):
                others = sorted(allowed - {layer_of(mod)})
                bad.append(
                    f"{mod} imports {imp}: layer {layer_of(mod)} may import only {others or 'nothing of the project'}"
                )
            else:
                bad += [
                    f"{mod} imports {imp}: {why}"
                    for importers, banned, why in NEVER
                    if _within(imp, banned) and any(_within(mod, m) for m in importers)
                ]
    return bad


def test_every_module_respects_its_layer():
    bad = violations(project_modules())
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize(
    ("mod", "imports", "why"),
    [
        ("scoring.score.scorer", {"harness.records.result"}, "layer scoring may import only"),
        ("scoring.artifact.pack", {"harness.run.pipeline"}, "layer scoring may import only"),
        ("harness.train.rank", {"scoring.score.evaluate"}, "layer harness.train may import only"),
        ("harness.train.gptq", {"scoring.worker.loading"}, "layer harness.train may import only"),
        ("harness.train.gptq", {"scoring.artifact.cap"}, "layer harness.train may import only"),
        ("data.loader", {"scoring.tracks"}, "nothing of the project"),
        ("isolation.sandbox", {"harness.api"}, "nothing of the project"),
        ("harness.api", {"harness.config"}, "nothing of the project"),
        ("scoring.codecheck", {".loading"}, "relative import"),
        ("scoring.worker.process", {"scoring.score.evaluate"}, "the worker side"),
        ("scoring.worker.confined", {"scoring.score.remote"}, "the worker side"),
    ],
)
def test_the_checker_catches_each_kind_of_violation(mod, imports, why):
    assert any(why in v for v in violations({mod: imports})), violations({mod: imports})


def test_the_worker_side_may_import_the_rest_of_scoring_and_the_scorer_may_import_it():
    assert not violations(
        {
            "scoring.worker.process": {"scoring.artifact.format", "scoring.codecheck", "scoring.worker.wire"},
            "scoring.score.remote": {"scoring.worker.confined"},
            "harness.run.train_phase": {"scoring.worker.env"},
        }
    )


def test_the_checker_sees_imports_inside_functions(tmp_path):
    src = tmp_path / "x.py"
    src.write_text("def f():\n    from harness.records import verify\n    import scoring.artifact.cap\n")
    assert {"harness.records", "harness.records.verify", "scoring.artifact.cap"} <= imports_of(src)


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
            if top in PACKAGES:
                assert _within(mod, "harness.api"), (
                    f"{f.relative_to(REPO)} imports {mod}: a submission may import harness.api only"
                )
            if f.name == "model.py":
                assert top in {"torch", "math", "dataclasses", "typing", "__future__"} | own, (
                    f"{f.relative_to(REPO)} imports {mod}: model.py is torch only (the model worker loads it without a harness)"
                )
