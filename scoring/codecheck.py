"""The static lint of scored code: a fast, friendly early verdict, not the security boundary.

Scored code (`model.py`, `eval.py`, `codec.py`) runs only in the confined model worker
(scoring/worker/): that process and the kernel are what keep it from the validation data
(docs/ARCHITECTURE.md). This lint runs before training (`pgolf run`) and again in the scorer, so
that code which breaks the contract's rules fails in seconds with every problem named:

Static check (`lint_scored_code`), before anything is imported: every `.py` file of the folder but
   the top-level train.py (sub-packages included, imported by an entry file or not: the simplest
   honest rule, since the scorer gets them all; training-only helpers belong in train.py) is read
   as the folder rules of scoring/artifact/cap.py allow (no link followed; uncounted folders such as
   __pycache__ skipped), must be strict UTF-8 with no coding declaration but utf-8 (a `# coding: utf-7`
   line would make Python read other code than the check reads), and is refused if it
   - import anything but an allow-list (docs/RULES.md: model.py is torch only; plus harmless standard
     modules, numpy and einops; a codec also the compressors and byte packers it needs),
   - use a name that reaches outside the objects handed to them (frames, gc, files, builtins
     tricks, `getattr` and friends, `sys`, `os`, ...),
   - use or import a banned attribute: dunders, frame and traceback attributes, raw storage
     access, the functions that read files (`torch.load`, `numpy.fromfile`, `memmap`, ...), and
     any private attribute (`_x`) but a class's own (`self._x`): torch's internals are back doors,
   - assign to an attribute of an imported module or class (`torch.gather = ...`,
     `F.log_softmax = ...`): monkeypatching what the scorer calls,
   - import train.py, which the scorer never gets.
   codec.py and the modules only it imports get the codec's allowances; every other file the model's rules.
A failure is a verdict on the entry ("code check failed"; the run is `illegal`), not a crash. A
deny-list over Python cannot be complete (a string that a library evaluates, say): what it misses,
the worker's confinement holds (tests/e2e/test_worker_boundary.py).
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from harness.api import (
    CODEC_FILE,
    CODEC_IMPORTS,
    EVAL_HOOK_FILE,
    MODEL_FILE,
    SCORED_FILES,
    SCORED_IMPORTS,
    TRAIN_FILE,
)
from scoring.artifact.cap import FolderRefused, read_counted, scan_folder
from scoring.errors import SubmissionError

ENTRY_FILES = SCORED_FILES
"""The files the scorer imports (the static check reads every .py file but train.py; these decide the codec's rules)."""

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


class CodeCheckFailure(SubmissionError):
    """Submission code running in the scorer broke a rule (static check or tool guard)."""


# ---- 1. Static check ----


@dataclass(frozen=True)
class _Rules:
    imports: frozenset[str]
    banned_attrs: frozenset[str]


MODEL_RULES = _Rules(ALLOWED_IMPORTS, BANNED_ATTRS)
CODEC_RULES = _Rules(ALLOWED_IMPORTS | CODEC_EXTRA_IMPORTS, BANNED_ATTRS - CODEC_ALLOWED_ATTRS)


CODING_COOKIE = re.compile(rb"^[ \t\f]*#.*?coding[:=][ \t]*([-\w.]+)")
"""PEP 263: a coding declaration in the first two lines changes how Python decodes the file."""
UTF8_NAMES = frozenset({"utf-8", "utf8"})


def source_encoding_problem(data: bytes) -> tuple[int, str] | None:
    """(line, message) when a Python source is not strict UTF-8 or declares another coding; else None."""
    for lineno, line in enumerate(data.split(b"\n")[:2], start=1):
        m = CODING_COOKIE.match(line)
        if m and m.group(1).decode("ascii", "replace").lower().replace("_", "-") not in UTF8_NAMES:
            name = m.group(1).decode("ascii", "replace")
            return lineno, (
                f"declares the source coding {name!r}, so Python would decode other code than the check reads; "
                "remove the coding line and save the file as UTF-8"
            )
    try:
        data.decode("utf-8", errors="strict")
    except UnicodeDecodeError as e:
        lineno = data.count(b"\n", 0, e.start) + 1
        return lineno, (
            f"is not valid UTF-8 (byte 0x{data[e.start]:02x} at offset {e.start}); save the file as UTF-8"
        )
    return None


SOURCE_MAX_TOKENS = 500_000
"""Most tokens a Python source may hold to be parsed by a trusted process (the lint, `pgolf check`, a reference
record's script): ast.parse holds some 400 to 650 bytes a token, so a 14 MB model.py of small literals, within
the cap, held 6.6 GB of the scorer for 74 s. A model's code is some thousands of tokens, a reference record's
script some 40,000; weights belong in the artifact. A source of fewer characters is parsed without counting."""


def source_tokens_problem(source: str | bytes) -> str | None:
    """Why `source` is not parsed here (over SOURCE_MAX_TOKENS tokens, counted without building a tree, or not
    tokenizable past that many characters); None when it may be."""
    if len(source) <= SOURCE_MAX_TOKENS:
        return None
    try:
        if isinstance(source, bytes):
            tokens = tokenize.tokenize(io.BytesIO(source).readline)
        else:
            tokens = tokenize.generate_tokens(io.StringIO(source).readline)
        for n, _ in enumerate(tokens, 1):
            if n > SOURCE_MAX_TOKENS:
                return (
                    f"its source holds over {SOURCE_MAX_TOKENS:,} Python tokens, more than any model's code "
                    "(parsing it would hold gigabytes); ship weights and tables in the artifact, not as literals"
                )
    except (tokenize.TokenError, SyntaxError) as e:
        return f"does not tokenize ({e})"
    return None


def _module_files(name: str, names: tuple[str, ...], sources: Mapping[str, object]) -> list[str]:
    """The folder's files an import of `name` (and, for `from name import a, b`, of name.a, name.b) loads."""
    found: list[str] = []
    parts = name.split(".") if name else []
    dotted = [parts[:i] for i in range(1, len(parts) + 1)] + [[*parts, n] for n in names if parts]
    for mod in dotted:
        base = "/".join(mod)
        found += [rel for rel in (f"{base}.py", f"{base}/__init__.py") if rel in sources]
    return found


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


def lint_tree(rel: str, tree: ast.Module, rules: _Rules, local_tops: frozenset[str]) -> list[str]:
    """Problems of one parsed file as 'path:line: message'; `local_tops`: the folder's top-level module names."""
    problems: list[str] = []
    imported: set[str] = set()  # names bound by imports: their attributes must not be assigned
    for node in ast.walk(tree):
        where = f"{rel}:{getattr(node, 'lineno', '?')}"
        if isinstance(node, ast.Import | ast.ImportFrom):
            if isinstance(node, ast.ImportFrom) and node.level:
                problems.append(f"{where}: relative imports are not allowed in scored code")
                continue
            imported |= {(a.asname or a.name).split(".")[0] for a in node.names}
            mods = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
            for name in mods:
                if name.split(".")[0] == TRAIN_FILE.removesuffix(".py"):
                    problems.append(
                        f"{where}: imports {name!r}; the scorer never gets {TRAIN_FILE}: move what scored code "
                        "needs into a module of its own"
                    )
                elif name.split(".")[0] in local_tops:
                    pass  # the folder's own module: linted in its turn
                elif name.split(".")[0] not in rules.imports:
                    problems.append(
                        f"{where}: imports {name!r}; scored code may import only {sorted(rules.imports)} and its own folder"
                    )
            if isinstance(node, ast.ImportFrom):
                problems += [
                    f"{where}: imports {a.name!r}, which reaches outside the tensors it is given"
                    for a in node.names
                    if _bad_attr(a.name, rules) or a.name.startswith("_") or a.name in BANNED_NAMES
                ]  # `from torch.serialization import os as x`: a banned module under an alias
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
                        f"{rel}:{sub.lineno}: assigns to {ast.unparse(sub)!r}, an attribute of an imported "
                        "module or class (monkeypatching what the scorer uses)"
                    )
    return problems


def lint_scored_code(submission_dir: str | Path) -> list[str]:
    """Lint every .py file of the folder but the top-level train.py (module docstring: the rules).

    codec.py, and a module that only codec.py imports (transitively), get the codec's rules; every
    other file the model's. A folder the folder rules refuse gives that refusal as its one problem.
    """
    folder = Path(submission_dir)
    try:
        scan = scan_folder(folder)
    except FolderRefused as e:
        return [str(e)]
    py = [f for f in scan.files if f.rel.endswith(".py")]
    local_tops = frozenset(f.rel.split("/")[0].removesuffix(".py") for f in py)
    problems: list[str] = []
    trees: dict[str, ast.Module] = {}
    for f in py:
        if f.rel == TRAIN_FILE:
            continue
        try:
            data = read_counted(folder, f)
        except FolderRefused as e:
            problems.append(str(e))
            continue
        bad = source_encoding_problem(data)
        if bad is not None:
            problems.append(f"{f.rel}:{bad[0]}: {bad[1]}")
            continue
        too_big = source_tokens_problem(data)
        if too_big is not None:
            problems.append(f"{f.rel}:?: {too_big}")
            continue
        try:
            trees[f.rel] = ast.parse(data, filename=f.rel)  # bytes: decoded exactly as an import would
        except (SyntaxError, ValueError) as e:
            problems.append(
                f"{f.rel}:{getattr(e, 'lineno', None) or '?'}: does not parse ({getattr(e, 'msg', e)})"
            )
        except (RecursionError, MemoryError):
            # `1+1+...` 3,000 terms deep, or 100,000 unary minuses: the parser's own limits, raised as these
            problems.append(f"{f.rel}:?: does not parse (nested too deeply for Python's parser)")
    codec_only = _reached(trees, [CODEC_FILE]) - _reached(trees, [MODEL_FILE, EVAL_HOOK_FILE])
    for rel, tree in trees.items():
        rules = CODEC_RULES if rel in codec_only else MODEL_RULES
        problems += [p for p in lint_tree(rel, tree, rules, local_tops) if p not in problems]
    return problems


def _reached(trees: dict[str, ast.Module], entries: list[str]) -> set[str]:
    """The folder's files the entries import, transitively (themselves included)."""
    seen: set[str] = set()
    todo = [e for e in entries if e in trees]
    while todo:
        rel = todo.pop()
        if rel in seen:
            continue
        seen.add(rel)
        for node in ast.walk(trees[rel]):
            if isinstance(node, ast.Import):
                for a in node.names:
                    todo += _module_files(a.name, (), trees)
            elif isinstance(node, ast.ImportFrom) and not node.level:
                todo += _module_files(node.module or "", tuple(a.name for a in node.names), trees)
    return seen


def require_clean_code(submission_dir: str | Path) -> None:
    """Raise CodeCheckFailure listing the problems when the scored code fails the static check."""
    problems = lint_scored_code(submission_dir)
    if problems:
        shown = "\n  ".join(problems[:12])
        more = f"\n  ... and {len(problems) - 12} more" if len(problems) > 12 else ""
        raise CodeCheckFailure(
            f"code check failed: {Path(submission_dir)}'s scored code (every .py file but {TRAIN_FILE}: {MODEL_FILE}, "
            f"{EVAL_HOOK_FILE}, {CODEC_FILE} and their modules) broke {len(problems)} rule(s):\n  {shown}{more}\n"
            "HINT: code that runs in the scorer may use only the tensors it is given and the allowed imports "
            "(see scoring/codecheck.py and submissions/README.md)"
        )


def scored_files(submission_dir: str | Path) -> list[str]:
    """The entry files of the static check that this folder has."""
    return [f for f in ENTRY_FILES if (Path(submission_dir) / f).is_file()]
