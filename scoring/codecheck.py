"""Checks on the submission code that runs inside the scorer: a static check before it is imported,
and a guard on the scorer's own tools while it runs.

The scorer imports `model.py` (and `codec.py` for a custom codec, `eval.py` for score-first
adaptation) into the process that holds the validation tokens and computes the loss. Python has
no in-process sandbox, so two layers make the rules mechanical:

1. Static check (`lint_scored_code`), before anything is imported: model.py, eval.py, codec.py and
   every module of the folder they import are read with `ast` and refused if they
   - import anything but an allow-list (DESIGN: "model.py: torch only"; plus harmless standard
     modules, numpy and einops; a codec also the compressors and byte packers it needs),
   - use a name that reaches outside the objects handed to them (frames, gc, files, builtins
     tricks, `getattr` and friends, `sys`, `os`, ...),
   - use or import a banned attribute: dunders, frame and traceback attributes, raw storage
     access, the functions that read files (`torch.load`, `numpy.fromfile`, `memmap`, ...), and
     any private attribute (`_x`) but a class's own (`self._x`): torch's internals are back doors,
   - assign to an attribute of an imported module or class (`torch.gather = ...`,
     `F.log_softmax = ...`): monkeypatching what the scorer calls.
2. Tool guard (`ToolGuard`), at run time: before the submission's code is imported, the scorer
   records the identity of every attribute of the modules and classes it computes with (builtins,
   math, numpy, torch, torch.Tensor, torch.nn.functional, the aten op it uses, and its own scoring
   modules; torch.compile in a model is fine: see SELF_PATCHED), the kernels registered for every
   aten operator, and the depth of torch's mode stacks. It checks them again after every forward
   pass and adaptation step (attributes, modes and the kernels it runs itself), and in full once the
   model is built and at the end; anything replaced, removed or (on a class) added, or a mode left
   active, fails the score, naming it.

Either failure is a verdict on the entry ("code check failed"; the run is `illegal`), not a crash.
This raises the bar and gives a clear verdict; it is not a proof against a determined attacker
(DESIGN.md: officials still review counted code).
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

from harness.api import CODEC_FILE, CODEC_IMPORTS, EVAL_HOOK_FILE, MODEL_FILE, SCORED_FILES, SCORED_IMPORTS

ENTRY_FILES = SCORED_FILES
"""Where the static check starts: the files the scorer imports."""

ALLOWED_IMPORTS = SCORED_IMPORTS
CODEC_EXTRA_IMPORTS = CODEC_IMPORTS
BANNED_NAMES = frozenset(
    {
        "gc",
        "inspect",
        "sys",
        "os",
        "io",
        "open",
        "eval",
        "exec",
        "compile",
        "__import__",
        "globals",
        "locals",
        "vars",
        "getattr",
        "setattr",
        "delattr",
        "breakpoint",
        "input",
        "memoryview",
        "importlib",
        "builtins",
        "__builtins__",
        "ctypes",
        "mmap",
        "pathlib",
        "subprocess",
        "pickle",
        "marshal",
        "shutil",
        "socket",
        "exit",
        "quit",
        "SystemExit",
        "BaseException",
    }
)
ALLOWED_DUNDERS = frozenset({"__init__", "__call__", "__name__", "__future__"})
BANNED_ATTR_PREFIXES = ("f_", "tb_", "gi_", "cr_", "ag_", "co_", "_getframe")
BANNED_ATTRS = frozenset(
    {
        # raw memory: a view past the tensor handed over
        "untyped_storage",
        "storage",
        "_storage",
        "data_ptr",
        "set_",
        "frombuffer",
        "from_dlpack",
        "ctypeslib",
        # files
        "load",
        "load_file",
        "safe_open",
        "from_file",
        "fromfile",
        "memmap",
        "open_memmap",
        "loadtxt",
        "genfromtxt",
        "fromregex",
        "DataSource",
        "open",
        "open_code",
        "FileIO",
        "LZMAFile",
        "BZ2File",
        "GzipFile",
        "load_library",
        "hub",
        "cpp_extension",
        "package",
        "tofile",
        "save",
        "savetxt",
        "savez",
        "savez_compressed",
        "datapipes",
        # running commands
        "collect_env",
        "system",
        "popen",
        "Popen",
        "run_command",
        # replacing what torch computes for everyone: kernels, modes
        "library",
        "py_impl",
        "TorchFunctionMode",
        "TorchDispatchMode",
        "set_default_device",
    }
)
CODEC_ALLOWED_ATTRS = frozenset({"load", "frombuffer", "save"})
"""A codec decodes a payload it is handed: safetensors.torch.load(bytes), torch.frombuffer(bytes)."""


class CodeCheckFailure(ValueError):
    """Submission code running in the scorer broke a rule (static check or tool guard)."""


# ---- 1. Static check ----


@dataclass(frozen=True)
class _Rules:
    imports: frozenset[str]
    banned_attrs: frozenset[str]


MODEL_RULES = _Rules(ALLOWED_IMPORTS, BANNED_ATTRS)
CODEC_RULES = _Rules(ALLOWED_IMPORTS | CODEC_EXTRA_IMPORTS, BANNED_ATTRS - CODEC_ALLOWED_ATTRS)


def _local_module(folder: Path, name: str) -> Path | None:
    top = name.split(".")[0]
    for p in (folder / f"{top}.py", folder / top / "__init__.py"):
        if p.is_file():
            return p
    return None


def _bad_attr(a: str, rules: _Rules) -> bool:
    return (
        (a.startswith("__") and a not in ALLOWED_DUNDERS)
        or a.startswith(BANNED_ATTR_PREFIXES)
        or a in rules.banned_attrs
    )


def _private_of_another(node: ast.Attribute) -> bool:
    """`x._name` where x is not `self`/`cls`: a private attribute of a library (torch.serialization._open_file_like,
    torch._dynamo, torch._C, ...), the back doors a list of banned names cannot close. A class's own privates stay fine."""
    if not node.attr.startswith("_") or node.attr.startswith("__"):
        return False
    base = node.value
    if isinstance(base, ast.Name) and base.id in ("self", "cls"):
        return False
    return not (isinstance(base, ast.Call) and isinstance(base.func, ast.Name) and base.func.id == "super")


def _root_name(node: ast.expr) -> str | None:
    while isinstance(node, ast.Attribute | ast.Subscript):
        node = node.value
    return node.id if isinstance(node, ast.Name) else None


def lint_source(path: Path, rules: _Rules = MODEL_RULES) -> tuple[list[str], list[Path]]:
    """(problems as 'file:line: message', local modules imported) of one file."""
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    except SyntaxError as e:
        return [f"{path.name}:{e.lineno}: does not parse ({e.msg})"], []
    problems: list[str] = []
    local: list[Path] = []
    imported: set[str] = set()  # names bound by imports: their attributes must not be assigned
    for node in ast.walk(tree):
        where = f"{path.name}:{getattr(node, 'lineno', '?')}"
        if isinstance(node, ast.Import | ast.ImportFrom):
            if isinstance(node, ast.ImportFrom) and node.level:
                problems.append(f"{where}: relative imports are not allowed in scored code")
                continue
            imported |= {(a.asname or a.name).split(".")[0] for a in node.names}
            mods = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
            for name in mods:
                mod = _local_module(path.parent, name)
                if mod is not None:
                    local.append(mod)
                elif name.split(".")[0] not in rules.imports:
                    problems.append(
                        f"{where}: imports {name!r}; scored code may import only {sorted(rules.imports)} and its own folder"
                    )
            if isinstance(node, ast.ImportFrom):
                problems += [
                    f"{where}: imports {a.name!r}, which reaches outside the tensors it is given"
                    for a in node.names
                    if _bad_attr(a.name, rules) or a.name.startswith("_")
                ]
            problems += [
                f"{where}: imports the private module {name!r}"
                for name in mods
                if name != "__future__" and any(part.startswith("_") for part in name.split("."))
            ]
            problems += [
                f"{where}: imports {name!r}, which reaches outside the tensors it is given"
                for name in mods
                if any(part in rules.banned_attrs or part in BANNED_NAMES for part in name.split(".")[1:])
            ]
        elif isinstance(node, ast.Name) and node.id in BANNED_NAMES:
            problems.append(f"{where}: uses {node.id!r}, which reaches outside the tensors it is given")
        elif isinstance(node, ast.Attribute) and _bad_attr(node.attr, rules):
            problems.append(
                f"{where}: uses attribute {node.attr!r}, which reaches outside the tensors it is given"
            )
        elif isinstance(node, ast.Attribute) and _private_of_another(node):
            problems.append(
                f"{where}: uses private attribute {node.attr!r} of {ast.unparse(node.value)!r}; scored code may "
                "use the private attributes of its own classes only (self._x)"
            )
        elif (
            isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and node.value.startswith("__")
            and node.value.endswith("__")
        ):
            problems.append(f"{where}: names {node.value!r}; dunder names are not allowed in scored code")
    for node in ast.walk(tree):  # second pass: every import is known now, wherever it sits
        targets: list[ast.expr] = []
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, ast.AugAssign | ast.AnnAssign):
            targets = [node.target]
        elif isinstance(node, ast.Delete):
            targets = node.targets
        for t in targets:
            for sub in ast.walk(t):
                if isinstance(sub, ast.Attribute) and _root_name(sub) in imported:
                    problems.append(
                        f"{path.name}:{sub.lineno}: assigns to {ast.unparse(sub)!r}, an attribute of an imported "
                        "module or class (monkeypatching what the scorer uses)"
                    )
    return problems, local


def lint_scored_code(submission_dir: str | Path) -> list[str]:
    """Lint model.py, eval.py and codec.py, and every local module they import (transitively).

    A module reached from codec.py alone gets the codec's rules; one reached from model.py or
    eval.py the stricter ones.
    """
    folder = Path(submission_dir)
    todo = [(folder / f, CODEC_RULES if f == CODEC_FILE else MODEL_RULES) for f in ENTRY_FILES]
    todo = [(p, r) for p, r in todo if p.is_file()][::-1]  # pop() takes model.py first
    seen: dict[Path, _Rules] = {}
    problems: list[str] = []
    while todo:
        p, rules = todo.pop()
        p = p.resolve()
        if p in seen and (seen[p] is MODEL_RULES or rules is CODEC_RULES):
            continue
        seen[p] = rules
        found, local = lint_source(p, rules)
        problems += [f for f in found if f not in problems]
        todo += [(m, rules) for m in local]
    return problems


def require_clean_code(submission_dir: str | Path) -> None:
    """Raise CodeCheckFailure listing the problems when the scored code fails the static check."""
    problems = lint_scored_code(submission_dir)
    if problems:
        shown = "\n  ".join(problems[:12])
        more = f"\n  ... and {len(problems) - 12} more" if len(problems) > 12 else ""
        raise CodeCheckFailure(
            f"code check failed: {Path(submission_dir)}'s scored code ({MODEL_FILE}, {EVAL_HOOK_FILE}, {CODEC_FILE} and what "
            f"they import) broke {len(problems)} rule(s):\n  {shown}{more}\n"
            "HINT: code that runs in the scorer may use only the tensors it is given and the allowed imports "
            "(see scoring/codecheck.py and submissions/README.md)"
        )


def scored_files(submission_dir: str | Path) -> list[str]:
    """The entry files of the static check that this folder has."""
    return [f for f in ENTRY_FILES if (Path(submission_dir) / f).is_file()]
