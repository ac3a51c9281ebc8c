"""The record-script reader: a reference-challenge record's `train_gpt.py`, read as text (nothing of it runs here).

A reference entry is one training script (its Hyperparameters read environment variables, `class
GPT(nn.Module)` whose forward returns the mean loss, training in `main()` under `if __name__ ==
"__main__"`) and the artifact its own serializer wrote. The scorer's side (scoring/score/legacy.py)
reads the script with this module and sends what it read to the model worker's legacy build mode
(scoring/worker/legacy.py, beside this file), where the record's code runs, confined:

- a self-extracting script (`exec(lzma.decompress(base64.b85decode("...")))`, or `exec(open(...))` of
  a sibling file) is decoded as data;
- the Hyperparameters are read statically (each field written as a literal or
  `int/float/bool/str(os.environ.get("NAME", default))`, with `.strip()`/`.lower()` and module-level
  constants, takes its default, never the verifier's environment, unless an override `NAME=VALUE`
  (field or environment name) is given);
- GPT's keyword arguments come from the script's own `GPT(...)` call (`args.X` -> field X), else from
  GPT's parameter names; expressions it cannot read are left for the worker, with the local
  assignments they read;
- the evaluation settings are the script's own (`eval_seq_len` or `train_seq_len`; a sliding stride
  `eval_stride`);
- a script that needs what this machine lacks is refused in one line (LegacyError) before any worker
  starts: a module imported unconditionally and used by the model that is not installed, syntax of a
  newer Python; so is one it cannot read as data (a payload that does not decode or expands past
  SOURCE_MAX_BYTES; a file that is not regular, over that bound, not UTF-8 or a link out of the record's
  folder; a source of over SOURCE_MAX_TOKENS tokens, whose tree would hold gigabytes of the scorer; an
  expression nested past the recursion limit; window settings that are not whole numbers).

It imports nothing of the scorer (scoring/score/): the worker side's rule (tests/unit/test_architecture.py).
"""

from __future__ import annotations

import ast
import importlib.util
import lzma
import math
import stat
import sys
from base64 import b85decode
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from scoring.codecheck import source_tokens_problem
from scoring.worker.legacy import FALLBACKS, LegacyError

SCRIPT_NAME = "train_gpt.py"
_CASTS = {"int": int, "float": float, "bool": bool, "str": str}
_STR_METHODS = {"strip", "lower", "upper"}
MISSING_HINTS = {
    "flash_attn_interface": "FlashAttention 3, CUDA only",
    "flash_attn": "FlashAttention 2, CUDA only",
    "triton": "Triton kernels, CUDA only",
    "zstandard": "pip install zstandard",
    "brotli": "pip install brotli",
    "sentencepiece": "pip install sentencepiece",
}
"""What a missing module is, for the refusal's message."""
TRAINING_ONLY = {"main", "train", "train_model"}
"""Functions whose use of a missing module does not matter to scoring."""
SOURCE_MAX_BYTES = 64 << 20
"""Most bytes a self-extracting payload may decompress to (a record's script is ~100 KB): a bomb is refused, not held."""
JSON_SCALARS = (bool, int, float, str, type(None))
"""What a value read statically may be: the worker's spec is JSON (bytes, complex, Ellipsis are left unread)."""


# ---- The script as shipped, decoded as data ----


def _refuse_too_many_tokens(source: str, script: Path) -> None:
    """A LegacyError for a source too large to parse here (scoring/codecheck.py SOURCE_MAX_TOKENS)."""
    problem = source_tokens_problem(source)
    if problem is not None:
        raise LegacyError(f"{script}: {problem}; not read")


def parse_script(source: str, script: Path) -> ast.Module:
    """The source's syntax tree; a LegacyError naming the line where it needs a newer Python, or for a
    source too large to parse here (SOURCE_MAX_TOKENS)."""
    _refuse_too_many_tokens(source, script)
    try:
        return ast.parse(source, filename=str(script))
    except SyntaxError as e:
        if sys.version_info < (3, 12) and "f-string" in str(e.msg):
            raise LegacyError(
                f"{script}: needs Python >= 3.12 (line {e.lineno} uses the f-string syntax of PEP 701; "
                f"this is Python {sys.version_info.major}.{sys.version_info.minor})"
            ) from e
        raise LegacyError(f"{script} does not parse: {e}") from e


def _const_str(node: ast.AST) -> str | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, str | bytes):
        return node.value.decode() if isinstance(node.value, bytes) else node.value
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        a, b = _const_str(node.left), _const_str(node.right)
        return None if a is None or b is None else a + b
    return None


def _self_extracting(tree: ast.Module, script: Path) -> tuple[str, str, tuple[str, int] | None] | None:
    """(source, how, (the sibling file's name, its bytes) or None) when the script's only work is exec() of a
    decoded payload or of a sibling file."""
    execs = [
        s.value
        for s in tree.body
        if isinstance(s, ast.Expr)
        and isinstance(s.value, ast.Call)
        and isinstance(s.value.func, ast.Name)
        and s.value.func.id == "exec"
    ]
    others = [s for s in tree.body if not isinstance(s, ast.Import | ast.ImportFrom | ast.Assign | ast.Expr)]
    if len(execs) != 1 or others or len(execs[0].args) != 1:
        return None
    arg = execs[0].args[0]
    payload = next(
        (
            n
            for n in ast.walk(arg)
            if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "b85decode"
        ),
        None,
    )
    if payload is not None and payload.args and (data := _const_str(payload.args[0])) is not None:
        outer = arg if isinstance(arg, ast.Call) else None
        kw = {k.arg: ast.unparse(k.value) for k in outer.keywords} if outer else {}
        source = _decode_payload(data, "FORMAT_RAW" in kw.get("format", ""), script)
        return source, "self-extracting (lzma + base85)", None
    # exec(open(__file__.replace("train_gpt.py", "X.py")).read())
    rep = next(
        (
            n
            for n in ast.walk(arg)
            if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "replace"
        ),
        None,
    )
    if (
        isinstance(rep, ast.Call)
        and isinstance(rep.func, ast.Attribute)
        and len(rep.args) == 2
        and ast.unparse(rep.func.value) == "__file__"
    ):
        old, new = _const_str(rep.args[0]), _const_str(rep.args[1])
        if old and new and old in script.name:
            name = script.name.replace(old, new)
            if "/" in name or "\\" in name or name in (".", ".."):
                raise LegacyError(f"{script}: exec()s {name!r}, not a file beside it; only a sibling is read")
            sibling = script.with_name(name)
            if sibling.is_file():
                text, nbytes = _read_shipped(sibling)
                return text, f"exec of {sibling.name}", (sibling.name, nbytes)
    return None


def _decode_payload(data: str, raw_format: bool, script: Path) -> str:
    """A base85 + lzma payload's text, at most SOURCE_MAX_BYTES of it; LegacyError (one line) for anything else."""
    try:
        raw = b85decode(data)
        if raw_format:
            dec = lzma.LZMADecompressor(format=lzma.FORMAT_RAW, filters=[{"id": lzma.FILTER_LZMA2}])
        else:
            dec = lzma.LZMADecompressor()
        out = dec.decompress(raw, max_length=SOURCE_MAX_BYTES + 1)
        if len(out) > SOURCE_MAX_BYTES:
            raise LegacyError(
                f"{script}: its self-extracting payload decompresses to over {SOURCE_MAX_BYTES:,} bytes; "
                "not a record's script"
            )
        if not dec.eof:
            raise lzma.LZMAError("the compressed data ends before its end-of-stream marker")
        return out.decode("utf-8")
    except (ValueError, lzma.LZMAError) as e:  # base85, lzma or utf-8 (a UnicodeDecodeError is a ValueError)
        raise LegacyError(f"{script}: its self-extracting payload does not decode ({e})") from None


def _read_shipped(path: Path) -> tuple[str, int]:
    """A script file's text (newlines read as Python reads a source file) and its bytes as shipped, from one
    read, so what is counted is what was decoded: a regular file of at most SOURCE_MAX_BYTES, in UTF-8, inside
    the record's folder (a link is followed only within it); else a LegacyError (a FIFO would block the
    scorer, /dev/zero would fill its memory, a link out would hand the worker a file of the verifier's it may
    not read itself)."""
    if not path.resolve().is_relative_to(path.parent.resolve()):
        raise LegacyError(
            f"{path} links outside the record's folder (to {path.resolve()}); not a record's script"
        )
    if not _readable_script(path):
        raise LegacyError(
            f"{path} is not a regular file of at most {SOURCE_MAX_BYTES:,} bytes; not a record's script"
        )
    with path.open("rb") as f:
        raw = f.read(SOURCE_MAX_BYTES + 1)
    if len(raw) > SOURCE_MAX_BYTES:  # it grew since its stat
        raise LegacyError(f"{path} is over {SOURCE_MAX_BYTES:,} bytes; not a record's script")
    try:
        return raw.decode("utf-8").replace("\r\n", "\n").replace("\r", "\n"), len(raw)
    except UnicodeDecodeError as e:
        raise LegacyError(f"{path} is not UTF-8 text ({e.reason} at byte {e.start})") from None


def script_source(script: Path) -> tuple[str, list[str]]:
    """The script's Python source, decoding self-extracting wrappers (as data: nothing is executed)."""
    source, packaging, _ = _decoded(script)
    return source, packaging


def _decoded(script: Path) -> tuple[str, list[str], dict[str, int]]:
    """script_source's (source, packaging) and the bytes as shipped of every file the source was read from
    (the script, and each sibling a stub exec()s: its name -> bytes)."""
    source, nbytes = _read_shipped(script)
    files = {script.name: nbytes}
    packaging: list[str] = []
    for _ in range(3):
        found = _self_extracting(parse_script(source, script), script)
        if found is None:
            break
        source, how, sibling = found
        packaging.append(how)
        if sibling is not None:
            files[sibling[0]] = sibling[1]
    return source, packaging, files


def missing_modules(tree: ast.Module) -> list[str]:
    """Modules imported unconditionally at the top level, used outside main(), and not installed here."""
    used_outside: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name in TRAINING_ONLY:
            continue
        if not isinstance(node, ast.Import | ast.ImportFrom):
            used_outside |= {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}
            used_outside |= {
                n.value.id
                for n in ast.walk(node)
                if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name)
            }
    missing = []
    for node in tree.body:
        if isinstance(node, ast.Import):
            pairs = [(a.name, (a.asname or a.name).split(".")[0]) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            pairs = [(node.module, a.asname or a.name) for a in node.names]
        else:
            continue
        for module, bound in pairs:
            top = module.split(".")[0]
            if bound in used_outside and top not in missing and not _installed(top):
                missing.append(top)
    return missing


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ValueError:  # in sys.modules without a spec: present
        return True


def refuse_missing(tree: ast.Module, script: Path, fallbacks: tuple[str, ...] = ()) -> None:
    missing = [m for m in missing_modules(tree) if m not in fallbacks]
    if missing:
        needs = ", ".join(f"{m} ({MISSING_HINTS[m]})" if m in MISSING_HINTS else m for m in missing)
        hint = "".join(
            f"; --fallback {m} runs it on PyTorch's scaled_dot_product_attention instead (recorded)"
            for m in missing
            if m in FALLBACKS
        )
        raise LegacyError(f"{script}: needs {needs}, which this machine does not have{hint}")


# ---- Hyperparameters and GPT(...), statically ----


class _Unresolved(Exception):  # noqa: N818 - control flow inside this module only
    pass


def _static(node: ast.expr, overrides: dict[str, str], consts: dict[str, Any]) -> Any:
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.Name) and node.id in consts:
        return consts[node.id]
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return -_static(node.operand, overrides, consts)
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id in _CASTS
        and len(node.args) == 1
    ):
        value = _static(node.args[0], overrides, consts)
        if node.func.id == "bool" and isinstance(value, str):
            value = int(value)
        return _CASTS[node.func.id](value)
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr in _STR_METHODS
        and not node.args
    ):
        value = _static(node.func.value, overrides, consts)
        if isinstance(value, str):
            return getattr(value, node.func.attr)()
    if isinstance(node, ast.Call) and ast.unparse(node.func) == "os.environ.get" and len(node.args) == 2:
        name = _static(node.args[0], overrides, consts)
        return overrides[name] if name in overrides else _static(node.args[1], overrides, consts)
    raise _Unresolved(ast.unparse(node))


def _constants(tree: ast.Module) -> dict[str, Any]:
    consts: dict[str, Any] = {}
    for s in tree.body:
        if (
            isinstance(s, ast.Assign)
            and len(s.targets) == 1
            and isinstance(s.targets[0], ast.Name)
            and isinstance(s.value, ast.Constant)
        ):
            consts[s.targets[0].id] = s.value.value
    return consts


def _field_assigns(cls: ast.ClassDef) -> Iterator[tuple[str, ast.expr]]:
    for s in cls.body:
        if isinstance(s, ast.Assign) and len(s.targets) == 1 and isinstance(s.targets[0], ast.Name):
            yield s.targets[0].id, s.value
        elif isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name) and s.value is not None:
            yield s.target.id, s.value


def hyperparameters_of(tree: ast.Module, script: Path, overrides: dict[str, str]) -> dict[str, Any]:
    """Field defaults of `class Hyperparameters` (overridden by field or env-var name), statically."""
    cls = next((n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Hyperparameters"), None)
    if cls is None:
        raise LegacyError(
            f"{script} defines no class Hyperparameters; is it a reference-style record script?"
        )
    consts = _constants(tree)
    out: dict[str, Any] = {}
    for name, value_node in _field_assigns(cls):
        env = _env_names(value_node)
        ov = {**overrides, **({e: overrides[name] for e in env} if name in overrides else {})}
        try:
            value = _static(value_node, ov, consts)
            if name in overrides and not env:  # a plain literal field, overridden by its own name
                value = type(value)(ast.literal_eval(overrides[name]))
        except (_Unresolved, ValueError, SyntaxError, TypeError, OverflowError):
            continue
        if isinstance(value, JSON_SCALARS):
            out[name] = value
    return out


def read_hyperparameters(script: Path, overrides: dict[str, str]) -> dict[str, Any]:
    """The script's Hyperparameters, statically (self-extracting scripts decoded first)."""
    try:
        source, _ = script_source(script)
        return hyperparameters_of(parse_script(source, script), script, overrides)
    except RecursionError:
        raise _too_deep(script) from None


def _too_deep(script: Path) -> LegacyError:
    return LegacyError(
        f"{script}: an expression nests too deeply to be read as data (Python's recursion limit); "
        "not a record's script"
    )


def _env_names(node: ast.expr) -> list[str]:
    return [
        c.args[0].value
        for c in ast.walk(node)
        if isinstance(c, ast.Call)
        and ast.unparse(c.func) == "os.environ.get"
        and c.args
        and isinstance(c.args[0], ast.Constant)
        and isinstance(c.args[0].value, str)
    ]


def _gpt_params(tree: ast.Module, script: Path) -> list[tuple[str, bool]]:
    """(name, has a default) of GPT.__init__'s parameters, from the source."""
    cls = next((n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "GPT"), None)
    init = (
        next((n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "__init__"), None)
        if cls is not None
        else None
    )
    if init is None:
        raise LegacyError(f"{script} defines no class GPT with an __init__; is it a reference-style record?")
    a = init.args
    positional = [*a.posonlyargs, *a.args][1:]
    defaults = len(a.defaults)
    out = [(p.arg, i >= len(positional) - defaults) for i, p in enumerate(positional)]
    out += [(p.arg, d is not None) for p, d in zip(a.kwonlyargs, a.kw_defaults, strict=True)]
    return out


def _call_locals(tree: ast.Module, call: ast.Call, exprs: dict[str, str]) -> list[tuple[str, str]]:
    """The local assignments (`name = expr` in the function around the GPT(...) call, before it) that
    the call's expressions read, transitively, in source order."""
    fn = next(
        (f for f in ast.walk(tree) if isinstance(f, ast.FunctionDef) and any(n is call for n in ast.walk(f))),
        None,
    )
    if fn is None:
        return []
    last: dict[str, ast.Assign] = {}
    for n in ast.walk(fn):
        if (
            isinstance(n, ast.Assign)
            and len(n.targets) == 1
            and isinstance(n.targets[0], ast.Name)
            and n.lineno < call.lineno
            and n.targets[0].id != "args"  # the hyperparameters: the worker's own namespace
            and not (isinstance(n.value, ast.Call) and ast.unparse(n.value.func) == "Hyperparameters")
            and (n.targets[0].id not in last or last[n.targets[0].id].lineno < n.lineno)
        ):
            last[n.targets[0].id] = n
    needed: dict[str, ast.Assign] = {}
    todo = [m.id for e in exprs.values() for m in ast.walk(ast.parse(e)) if isinstance(m, ast.Name)]
    while todo:
        name = todo.pop()
        if name in last and name not in needed:
            needed[name] = last[name]
            todo += [m.id for m in ast.walk(last[name].value) if isinstance(m, ast.Name)]
    return [(k, ast.unparse(a.value)) for k, a in sorted(needed.items(), key=lambda kv: kv[1].lineno)]


def gpt_call(
    tree: ast.Module, script: Path, hp: dict[str, Any]
) -> tuple[dict[str, Any], dict[str, str], list[tuple[str, str]]]:
    """GPT's keyword arguments read statically, the script's own GPT(...) expressions left for the
    worker (evaluated there with `args` = the hyperparameters), and the local assignments before the
    call that those expressions read (evaluated there first, in order)."""
    call = next(
        (
            n
            for n in ast.walk(tree)
            if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == "GPT"
        ),
        None,
    )
    kw: dict[str, Any] = {}
    exprs: dict[str, str] = {}
    params = _gpt_params(tree, script)
    if call is not None:
        for (name, _), a in zip(params, call.args, strict=False):
            if isinstance(a, ast.Name):  # GPT(h): the hyperparameters object itself
                exprs[name] = "args"
            else:
                raise LegacyError(f"{script}: GPT(...) is called with {ast.unparse(a)!r}; pass --hparam")
        for k in call.keywords:
            if k.arg is None:
                continue
            v = k.value
            if isinstance(v, ast.Attribute) and isinstance(v.value, ast.Name) and v.attr in hp:
                kw[k.arg] = hp[v.attr]
            elif isinstance(v, ast.Constant) and isinstance(v.value, JSON_SCALARS):
                kw[k.arg] = v.value
            else:
                exprs[k.arg] = ast.unparse(v)
    for name, has_default in params:
        if name not in kw and name not in exprs and name in hp:
            kw[name] = hp[name]
        if name not in kw and name not in exprs and not has_default:
            raise LegacyError(
                f"cannot tell GPT's argument {name!r} from the script; pass --hparam {name}=VALUE"
            )
    return kw, exprs, (_call_locals(tree, call, exprs) if call is not None and exprs else [])


def _count(hp: dict[str, Any], *names: str) -> int:
    """The first of `names` the script sets (truthy) as a whole number >= 0; 0 when none is set."""
    for name in names:
        value = hp.get(name)
        if not value:
            continue
        if (
            isinstance(value, bool)
            or not isinstance(value, int | float)
            or not math.isfinite(value)
            or value != int(value)
            or value < 0
        ):
            raise LegacyError(
                f"the record's Hyperparameters.{name} = {value!r} is not a whole number >= 0; "
                f"pass --hparam {name}=N (or --seq-len/--stride)"
            )
        return int(value)
    return 0


def eval_settings(hp: dict[str, Any]) -> dict[str, Any]:
    """The record's own evaluation settings: window length and sliding stride (LegacyError for a value
    that is not a whole number)."""
    seq_len = _count(hp, "eval_seq_len", "train_seq_len") or 1024
    stride = _count(hp, "eval_stride")
    return {
        "seq_len": seq_len,
        "mode": "sliding" if 0 < stride < seq_len else "standard",
        "stride": stride if 0 < stride < seq_len else None,
        "ttt": bool(hp.get("ttt_enabled", False)),
    }


def _readable_script(path: Path) -> bool:
    try:
        st = path.stat()
    except OSError:
        return False
    return stat.S_ISREG(st.st_mode) and st.st_size <= SOURCE_MAX_BYTES


def find_script(record_dir: Path, script: str | None) -> Path:
    if script:
        return record_dir / script
    if (record_dir / SCRIPT_NAME).is_file():
        return record_dir / SCRIPT_NAME
    found = [
        p
        for p in sorted(record_dir.glob("*.py"))
        if _readable_script(p) and "class GPT" in p.read_text(encoding="utf-8", errors="replace")
    ]
    if len(found) != 1:
        raise FileNotFoundError(
            f"{record_dir}: expected {SCRIPT_NAME} (or one .py defining class GPT); pass --script NAME"
        )
    return found[0]


@dataclass(frozen=True)
class RecordScript:
    """What the reader took from a record's script: all the scorer sends the worker's legacy build mode."""

    path: Path
    """The script as shipped."""
    code_files: dict[str, int]
    """Every file the scored code was read from, as shipped (the script; a sibling a stub exec()s), name ->
    bytes: their sum is the record's code bytes (the reference counts the script's bytes, and all of a
    record's code lives in it)."""
    source: str
    """The Python source, self-extracting wrappers decoded."""
    packaging: list[str]
    """How it was packed, outermost first (empty: plain)."""
    hyperparameters: dict[str, Any]
    gpt_kwargs: dict[str, Any]
    gpt_call: dict[str, str]
    """GPT(...)'s expressions left for the worker (evaluated there with `args` = the hyperparameters)."""
    gpt_locals: list[tuple[str, str]]
    eval_settings: dict[str, Any]


def read_record_script(
    record_dir: Path, script: str | None, overrides: dict[str, str], fallbacks: tuple[str, ...] = ()
) -> RecordScript:
    """Find, decode and read a record's script; LegacyError (one line) for one this machine cannot run."""
    path = find_script(record_dir, script)
    try:
        source, packaging, code_files = _decoded(path)
        tree = parse_script(source, path)
        refuse_missing(tree, path, fallbacks)
        hp = hyperparameters_of(tree, path, overrides)
        kwargs, exprs, local_assigns = gpt_call(tree, path, hp)
    except RecursionError:
        raise _too_deep(path) from None
    return RecordScript(
        path=path,
        code_files=code_files,
        source=source,
        packaging=packaging,
        hyperparameters=hp,
        gpt_kwargs=kwargs,
        gpt_call=exprs,
        gpt_locals=local_assigns,
        eval_settings=eval_settings(hp),
    )
