"""Score-first test-time adaptation: the only way a submission's `eval.py` hook ever sees validation tokens.

A submission may ship `eval.py` defining

    def adapt(model: torch.nn.Module, tokens: torch.Tensor) -> None

The scorer (scoring/evaluate.py) feeds the validation windows in order, in chunks of about
`EvalConfig.adapt_chunk_tokens` targets. For each chunk:

1. `before_chunk`: the model's parameters and buffers are snapshotted;
2. every window of the chunk is scored (no_grad, model.eval());
3. `after_chunk`: the snapshot is compared bit for bit (a model that changes its weights while it
   is being scored, for example by training inside forward, fails with AdaptationViolation); then
   the hook is called with a fresh int64 tensor that owns its storage and holds exactly the
   positions scored so far and not yet handed over (never a view into the validation array, so
   there is nothing beyond it to read). Its time counts on the eval clock.

Static check (`lint_hook_sources`): the hook runs in the scorer's process, where the validation
tokens are. Python has no in-process sandbox, so before the hook is imported, eval.py, model.py
and every module of the folder they import are read with `ast` and refused if they import
anything but an allow-list (torch, numpy, math, typing, ...; their own folder) or use a name or
attribute that reaches outside the objects handed to them (frames, gc, files, builtins tricks,
dunder attributes). This raises the bar and gives a clear verdict; it is not a proof against a
determined attacker (DESIGN.md: officials still review hooks, which are counted code).
"""

from __future__ import annotations

import ast
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from data.io import sha256_file
from scoring.loading import MODEL_FILE, import_file

EVAL_HOOK_FILE = "eval.py"
HOOK_NAME = "adapt"
ALLOWED_IMPORTS = frozenset(
    {"torch", "numpy", "math", "typing", "dataclasses", "collections", "functools", "itertools", "__future__", "einops"}
)
BANNED_NAMES = frozenset(
    {
        "gc", "inspect", "sys", "os", "io", "open", "eval", "exec", "compile", "__import__", "globals", "locals",
        "vars", "getattr", "setattr", "delattr", "breakpoint", "input", "memoryview", "importlib", "builtins",
        "__builtins__", "ctypes", "mmap", "pathlib", "subprocess", "pickle", "marshal", "shutil", "socket",
    }
)
ALLOWED_DUNDERS = frozenset({"__init__", "__call__", "__name__"})
BANNED_ATTR_PREFIXES = ("f_", "tb_", "gi_", "cr_", "ag_", "co_", "_getframe")
BANNED_ATTRS = frozenset({"untyped_storage", "storage", "data_ptr", "set_", "from_file", "load", "frombuffer"})

AdaptFn = Callable[[nn.Module, torch.Tensor], None]


class AdaptationViolation(ValueError):
    """The score-first protocol was broken (weights moved while scoring, or a hook failed the lint)."""


# ---- Static check ----


def _local_module(folder: Path, name: str) -> Path | None:
    top = name.split(".")[0]
    for p in (folder / f"{top}.py", folder / top / "__init__.py"):
        if p.is_file():
            return p
    return None


def lint_source(path: Path) -> tuple[list[str], list[Path]]:
    """(problems as 'file:line: message', local modules imported) of one file."""
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    except SyntaxError as e:
        return [f"{path.name}:{e.lineno}: does not parse ({e.msg})"], []
    problems: list[str] = []
    local: list[Path] = []
    for node in ast.walk(tree):
        where = f"{path.name}:{getattr(node, 'lineno', '?')}"
        if isinstance(node, ast.Import | ast.ImportFrom):
            if isinstance(node, ast.ImportFrom) and node.level:
                problems.append(f"{where}: relative imports are not allowed in adaptation code")
                continue
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
            for name in names:
                mod = _local_module(path.parent, name)
                if mod is not None:
                    local.append(mod)
                elif name.split(".")[0] not in ALLOWED_IMPORTS:
                    problems.append(f"{where}: imports {name!r}; adaptation code may import only {sorted(ALLOWED_IMPORTS)} and its own folder")
        elif isinstance(node, ast.Name) and node.id in BANNED_NAMES:
            problems.append(f"{where}: uses {node.id!r}, which reaches outside the tensors it is given")
        elif isinstance(node, ast.Attribute):
            a = node.attr
            if (a.startswith("__") and a not in ALLOWED_DUNDERS) or a.startswith(BANNED_ATTR_PREFIXES) or a in BANNED_ATTRS:
                problems.append(f"{where}: uses attribute {a!r}, which reaches outside the tensors it is given")
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.startswith("__") and node.value.endswith("__"):
            problems.append(f"{where}: names {node.value!r}; dunder names are not allowed in adaptation code")
    return problems, local


def lint_hook_sources(submission_dir: Path) -> list[str]:
    """Lint eval.py, model.py and every local module they import (transitively)."""
    todo = [p for p in (submission_dir / EVAL_HOOK_FILE, submission_dir / MODEL_FILE) if p.is_file()]
    seen: set[Path] = set()
    problems: list[str] = []
    while todo:
        p = todo.pop().resolve()
        if p in seen:
            continue
        seen.add(p)
        found, local = lint_source(p)
        problems += found
        todo += local
    return problems


# ---- The adapter ----


def load_hook(submission_dir: str | Path) -> tuple[AdaptFn, str] | None:
    """The folder's `eval.py` adapt function and the file's sha256, or None when there is no eval.py.

    Raises AdaptationViolation when the sources fail the static check, ValueError when eval.py
    defines no callable `adapt`.
    """
    folder = Path(submission_dir)
    path = folder / EVAL_HOOK_FILE
    if not path.is_file():
        return None
    problems = lint_hook_sources(folder)
    if problems:
        shown = "\n  ".join(problems[:10])
        raise AdaptationViolation(
            f"{path}: the adaptation hook failed the score-first static check ({len(problems)} problem(s)):\n  {shown}\n"
            "HINT: a hook may use only the model and the tokens it is given (see scoring/adapt.py)"
        )
    module = import_file(path, "pgolf_submission_eval")
    fn = getattr(module, HOOK_NAME, None)
    if not callable(fn):
        raise ValueError(f"{path} must define {HOOK_NAME}(model, tokens) -> None")
    return fn, sha256_file(path)


def _state_tensors(model: nn.Module) -> list[tuple[str, torch.Tensor]]:
    return [*model.named_parameters(), *model.named_buffers()]


@dataclass
class ScoreFirstAdapter:
    """Calls `hook` with each chunk's tokens after the chunk is scored; checks nothing moved meanwhile."""

    hook: AdaptFn
    hook_sha256: str = ""
    delivered: list[tuple[int, int]] = field(default_factory=list)
    """(first position, one past the last) of every span handed to the hook, in order."""
    _adapt_s: float = 0.0
    _snapshot: list[torch.Tensor] = field(default_factory=list)

    @property
    def adapt_time_s(self) -> float:
        return self._adapt_s

    def before_chunk(self, model: nn.Module, chunk: int) -> None:
        model.eval()
        self._snapshot = [t.detach().clone() for _, t in _state_tensors(model)]

    def after_chunk(self, model: nn.Module, chunk: int, scored_tokens: np.ndarray, first_position: int) -> None:
        tensors = _state_tensors(model)
        if len(tensors) != len(self._snapshot):
            raise AdaptationViolation(f"the model added or removed tensors while chunk {chunk} was being scored")
        for (name, t), old in zip(tensors, self._snapshot, strict=False):
            if t.shape != old.shape or not torch.equal(t.detach(), old):
                raise AdaptationViolation(
                    f"score-first violation: {name} changed while chunk {chunk} was being scored; "
                    "a model may adapt only in eval.py's adapt(), after a chunk is scored"
                )
        self._snapshot = []
        device = tensors[0][1].device if tensors else torch.device("cpu")
        chunk_t = torch.tensor(np.asarray(scored_tokens, dtype=np.int64), dtype=torch.int64, device=device)
        self.delivered.append((first_position, first_position + int(chunk_t.numel())))
        t0 = time.perf_counter()
        with torch.enable_grad():
            self.hook(model, chunk_t)
        if device.type == "cuda":
            torch.cuda.synchronize()
        self._adapt_s += time.perf_counter() - t0
        model.eval()

    def record(self, chunk_tokens: int) -> dict[str, Any]:
        return {
            "hook": EVAL_HOOK_FILE,
            "hook_sha256": self.hook_sha256,
            "protocol": "score-first",
            "chunk_tokens": chunk_tokens,
            "chunks": len(self.delivered),
            "tokens_delivered": sum(b - a for a, b in self.delivered),
            "adapt_time_s": self._adapt_s,
        }
