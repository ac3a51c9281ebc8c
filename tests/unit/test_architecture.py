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

No cycles, over the same graph: no module imports itself through others, and no sub-package (a module
one level below its top package: harness.run, harness.cli, scoring.worker) imports itself through others;
two sub-packages importing each other are the shortest such cycle. Print the cycles:
    python -m tests.unit.test_architecture
"""

from __future__ import annotations

import ast
from collections.abc import Mapping, Set
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


def module_graph(mods: Mapping[str, Set[str]]) -> dict[str, set[str]]:
    """Each module -> the project modules it imports, each import named by the longest module it is in
    (`from harness.run.launch import pack_command` -> harness.run.launch); relative imports are left
    out (they are a violation of their own)."""

    def resolve(name: str) -> str | None:
        parts = name.split(".")
        return next((m for i in range(len(parts), 0, -1) if (m := ".".join(parts[:i])) in mods), None)

    return {m: {r for i in imported if (r := resolve(i)) not in (None, m)} for m, imported in mods.items()}


def subpackage(mod: str) -> str:
    return ".".join(mod.split(".")[:2])


def subpackage_graph(graph: Mapping[str, Set[str]]) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {subpackage(m): set() for m in graph}
    for m, imported in graph.items():
        out[subpackage(m)] |= {subpackage(i) for i in imported} - {subpackage(m)}
    return out


def _shortest_way_round(graph: Mapping[str, Set[str]], start: str) -> list[str]:
    """start -> ... -> start, the fewest edges (breadth first); start is on a cycle."""
    parent = {start: start}
    queue = [start]
    for v in queue:  # the queue grows while it is read: breadth first
        for w in sorted(graph[v]):
            if w == start:
                path = [v]
                while path[-1] != start:
                    path.append(parent[path[-1]])
                return [*reversed(path), start]
            if w not in parent:
                parent[w] = v
                queue.append(w)
    raise AssertionError(f"{start} is on no cycle")


def cycles(graph: Mapping[str, Set[str]]) -> list[list[str]]:
    """One cycle (a -> b -> ... -> a) through each group of nodes that reach one another (Tarjan's
    strongly connected components, each shown by the shortest way round from its first node); []
    when the graph has none."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    groups: list[set[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:  # v is the root of a group: everything above it on the stack
            group = set(stack[stack.index(v) :])
            del stack[stack.index(v) :]
            if len(group) > 1:
                groups.append(group)

    for v in sorted(graph):
        if v not in index:
            visit(v)
    inside = {v: {w for w in graph[v] if w in g} for g in groups for v in g}
    return sorted(_shortest_way_round(inside, min(g)) for g in groups)


def cycle_report(mods: Mapping[str, Set[str]]) -> list[str]:
    """One line per module cycle, per pair of sub-packages that import each other, and per longer cycle
    of sub-packages (one whose packages hold no such pair), each with the imports that close it."""
    graph = module_graph(mods)
    packages = subpackage_graph(graph)

    def why(a: str, b: str) -> str:
        return next(
            f"{m} imports {i}"
            for m in sorted(graph)
            if subpackage(m) == a
            for i in sorted(graph[m])
            if subpackage(i) == b
        )

    lines = [f"module cycle: {' -> '.join(c)}" for c in cycles(graph)]
    pairs = sorted((a, b) for a in packages for b in packages[a] if a < b and a in packages[b])
    lines += [f"sub-packages import each other: {a} <-> {b} ({why(a, b)}; {why(b, a)})" for a, b in pairs]
    paired = {p for pair in pairs for p in pair}
    lines += [
        f"sub-package cycle: {' -> '.join(c)} ({'; '.join(why(a, b) for a, b in zip(c, c[1:], strict=False))})"
        for c in cycles(packages)
        if not paired & set(c)
    ]
    return lines


def test_no_import_cycles_between_modules_or_sub_packages():
    found = cycle_report(project_modules())
    assert not found, "\n".join(found)


def test_the_cycle_check_catches_a_cycle_and_names_it():
    mods: dict[str, set[str]] = {
        "harness.run.pipeline": {"harness.cli.pack_command", "data.io"},  # a name in a module: that module
        "harness.cli": {"harness.run.pipeline", "harness.config"},
        "harness.config": set(),
        "data.io": set(),
    }
    assert cycle_report(mods) == [
        "module cycle: harness.cli -> harness.run.pipeline -> harness.cli",
        "sub-packages import each other: harness.cli <-> harness.run "
        "(harness.cli imports harness.run.pipeline; harness.run.pipeline imports harness.cli)",
    ]
    mods["harness.cli"] = {"harness.config"}  # the way back gone: nothing left to report
    assert cycle_report(mods) == []


def test_the_cycle_check_sees_sub_packages_that_import_each_other_through_different_modules():
    """No module cycle (a.x -> b.y, b.z -> a.w), but harness.a and harness.b import each other; and a
    three-package ring is caught by its shortest way round."""
    two_way = {
        "harness.a.x": {"harness.b.y"},
        "harness.b.y": set(),
        "harness.b.z": {"harness.a.w"},
        "harness.a.w": set(),
    }
    assert cycle_report(two_way) == [
        "sub-packages import each other: harness.a <-> harness.b (harness.a.x imports harness.b.y; harness.b.z imports harness.a.w)"
    ]
    ring = {"scoring.a.m": {"scoring.b.m"}, "scoring.b.m": set(), "scoring.b.n": {"scoring.c"}, "scoring.c": {"scoring.a"},
            "scoring.a": set()}  # fmt: skip
    assert cycles(subpackage_graph(module_graph(ring))) == [
        ["scoring.a", "scoring.b", "scoring.c", "scoring.a"]
    ]
    assert cycles(module_graph(ring)) == []
    assert cycle_report(ring) == [
        "sub-package cycle: scoring.a -> scoring.b -> scoring.c -> scoring.a "
        "(scoring.a.m imports scoring.b.m; scoring.b.n imports scoring.c; scoring.c imports scoring.a)"
    ]


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


if __name__ == "__main__":
    print("\n".join(cycle_report(project_modules())) or "no import cycles")
