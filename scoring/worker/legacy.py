"""The model worker's "legacy" build mode: a reference-challenge record's own model, built in the worker.

A record of the reference challenge is one training script (`train_gpt.py`: `class GPT(nn.Module)`
whose forward returns the mean loss, training in `main()`) and the artifact its own serializer wrote.
Its code is submitted code, so it runs here, in the confined model worker (scoring/worker/process.py,
spec key "legacy"), never in the scorer that holds the validation tokens. The scorer's side
(scoring/score/legacy.py, with the reader beside this file: scoring/worker/legacy_script.py) reads
the script statically (hyperparameters, GPT's arguments, the evaluation settings) and sends them in
the spec:

    "legacy": {"script": PATH, "gpt_kwargs": {...}, "gpt_call": {NAME: EXPR}, "hyperparameters": {...}}

What runs here, in order:
- **Definitions only**: the script is parsed with `ast` and only its imports (each on its own; one
  that fails is skipped), function and class definitions (decorators and annotations removed) and
  assignments whose value calls nothing are executed. A class-level assignment that calls something
  is dropped, and so is every later one of that class that reads a dropped name. Nothing at module
  level is called and main() never runs.
- **The artifact**, as the record's serializer wrote it: the compressor is told by its magic bytes
  (zlib, zstd, xz/lzma, else brotli), a `BSHF` byte-shuffle header is undone, and the container is
  read with `torch.load(weights_only=True)` (tensors, dicts, lists, strings and numbers only). The
  layout is then dequantized: `int8_clean_per_row_v1` with the reference's numerics (this module);
  the later int6/GPTQ layouts ({"w", "m"}: quantized tensors and their per-tensor metadata) by the
  record's own `dequantize_mixed`/`dequantize_mixed_int6` (record code, so here), with its
  `_unbank_state_dict`/`_rebank_state_dict` where it keeps banked weights.
- **Logits**: the record's `forward_logits(input_ids)` when GPT has one; else its forward runs with the
  input as dummy targets while `cross_entropy` is replaced by a recorder, and the logits the model
  passed to it are returned (exactly one call, with the targets given, so the rows are in order).
"""

from __future__ import annotations

import ast
import builtins
import contextlib
import importlib.machinery
import io
import lzma
import pickle
import types
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

LEGACY_QUANT_FORMAT = "int8_clean_per_row_v1"
SHUFFLE_MAGIC = b"BSHF"
ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
XZ_MAGIC = b"\xfd7zXZ\x00"


class LegacyError(ValueError):
    """A reference-format record or artifact cannot be loaded; the message says why and what to do."""


StateDict = dict[str, torch.Tensor]


# ---- The artifact: compressor, byte shuffle, container ----


def _zstd(raw: bytes) -> bytes:
    try:
        import zstandard
    except ImportError as e:
        raise LegacyError("the artifact is zstd-compressed: needs zstandard (pip install zstandard)") from e
    return zstandard.ZstdDecompressor().decompressobj().decompress(raw)


def _brotli(raw: bytes) -> bytes:
    try:
        import brotli  # type: ignore[import-untyped]
    except ImportError as e:
        raise LegacyError(
            "the artifact is not zlib, zstd or lzma; brotli is the one left: needs brotli (pip install brotli)"
        ) from e
    return bytes(brotli.decompress(raw))


def decompress(raw: bytes, path: Path) -> tuple[bytes, str]:
    """The artifact's payload and the name of its compressor (told by magic bytes; brotli has none)."""
    try:
        if raw[:4] == ZSTD_MAGIC:
            return _zstd(raw), "zstd"
        if raw[:6] == XZ_MAGIC:
            return lzma.decompress(raw), "lzma (xz)"
        if raw[:1] == b"\x78":
            with contextlib.suppress(zlib.error):
                return zlib.decompress(raw), "zlib"
        if raw[:1] == b"\x5d":
            with contextlib.suppress(lzma.LZMAError):
                return lzma.decompress(raw, format=lzma.FORMAT_ALONE), "lzma (alone)"
        return _brotli(raw), "brotli"
    except LegacyError:
        raise
    except Exception as e:  # noqa: BLE001 - any decoder failure is a malformed artifact
        raise LegacyError(
            f"{path}: not a zlib, zstd, lzma or brotli stream the records wrote ({type(e).__name__}: {e})"
        ) from e


def _unplane(payload: np.ndarray, stride: int) -> bytes:
    out = np.empty_like(payload)
    pos = 0
    for s in range(stride):
        count = len(range(s, payload.size, stride))
        out[s::stride] = payload[pos : pos + count]
        pos += count
    return out.tobytes()


def byte_unshuffle(data: bytes) -> bytes:
    """Undo the records' byte shuffle: b"BSHF", the stride (2 bytes little-endian in the March records,
    1 byte in the April ones), then the byte planes. The variant is the one whose result is a torch
    zip container (b"PK\x03\x04"); else the 2-byte one."""
    if data[:4] != SHUFFLE_MAGIC:
        return data
    if len(data) >= 5 and data[4] >= 2:
        one = _unplane(np.frombuffer(data, dtype=np.uint8, offset=5), data[4])
        if one[:4] == b"PK\x03\x04":
            return one
    if len(data) >= 5 and data[4] < 2 and (len(data) < 6 or data[5:9] == b"PK\x03\x04"):
        return data[5:]  # the April writer's stride < 2: no shuffle
    stride = int.from_bytes(data[4:6], "little")
    if len(data) < 6 or stride < 1:
        raise LegacyError(f"a byte-shuffle header that is truncated or has stride {stride}")
    return _unplane(np.frombuffer(data, dtype=np.uint8, offset=6), stride)


def read_container(path: str | Path) -> tuple[Any, str]:
    """Decompress, unshuffle and unpickle with weights_only=True; (object, "compressor[+ byte-shuffle]")."""
    path = Path(path)
    if not path.is_file():
        raise LegacyError(f"artifact not found: {path}")
    raw, compressor = decompress(path.read_bytes(), path)
    if raw[:4] == SHUFFLE_MAGIC:
        raw, compressor = byte_unshuffle(raw), compressor + " + byte-shuffle"
    try:
        obj = torch.load(io.BytesIO(raw), map_location="cpu", weights_only=True)
    except (pickle.UnpicklingError, RuntimeError, EOFError) as e:
        raise LegacyError(
            f"{path}: refused by the restricted unpickler (weights_only=True): it holds something other than tensors, "
            f"dicts, lists, strings and numbers ({str(e).splitlines()[0][:200]})"
        ) from e
    return obj, compressor


def _tensor_dict(obj: dict, key: str, path: Path) -> dict[str, torch.Tensor]:
    d = obj.get(key, {})
    if not isinstance(d, dict) or not all(
        isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in d.items()
    ):
        raise LegacyError(f"{path}: {key!r} must map tensor names to tensors")
    return d


def dequantize_int8_clean(obj: dict, path: Path) -> StateDict:
    """The `int8_clean_per_row_v1` layout, with the reference's numerics."""
    quantized, scales = _tensor_dict(obj, "quantized", path), _tensor_dict(obj, "scales", path)
    passthrough = _tensor_dict(obj, "passthrough", path)
    dtypes, qmeta = obj.get("dtypes", {}), obj.get("qmeta", {})
    orig = obj.get("passthrough_orig_dtypes", {})
    out: StateDict = {}
    for name, q in quantized.items():
        if name not in scales or name not in dtypes:
            raise LegacyError(f"{path}: quantized tensor {name!r} has no scale or dtype")
        dtype = getattr(torch, str(dtypes[name]), None)
        if not isinstance(dtype, torch.dtype) or q.dtype != torch.int8:
            raise LegacyError(
                f"{path}: tensor {name!r}: dtype {dtypes[name]!r} / storage {q.dtype} is not int8 of a torch dtype"
            )
        s = scales[name]
        if (qmeta.get(name) or {}).get("scheme") == "per_row" or s.ndim > 0:
            s32 = s.to(torch.float32)
            out[name] = (q.float() * s32.view(q.shape[0], *([1] * (q.ndim - 1)))).to(dtype).contiguous()
        else:
            out[name] = (q.float() * float(s.item())).to(dtype).contiguous()
    for name, t in passthrough.items():
        t = t.detach().cpu().contiguous()
        if isinstance(orig.get(name), str):
            dt = getattr(torch, orig[name], None)
            if not isinstance(dt, torch.dtype):
                raise LegacyError(f"{path}: passthrough {name!r} names unknown dtype {orig[name]!r}")
            t = t.to(dt).contiguous()
        out[name] = t
    return out


def load_legacy_artifact(path: str | Path) -> StateDict:
    """An `int8_clean_per_row_v1` artifact, dequantized here (no record code needed)."""
    path = Path(path)
    obj, _ = read_container(path)
    if not isinstance(obj, dict) or obj.get("__quant_format__") != LEGACY_QUANT_FORMAT:
        fmt = obj.get("__quant_format__") if isinstance(obj, dict) else type(obj).__name__
        raise LegacyError(f"{path}: quant format {fmt!r}; this loader reads {LEGACY_QUANT_FORMAT!r}")
    return dequantize_int8_clean(obj, path)


def record_state(
    path: Path, ns: dict[str, Any], template: StateDict, num_layers: int | None
) -> tuple[StateDict, str]:
    """The artifact's state dict for the record's model: (state, layout description)."""
    obj, compressor = read_container(path)
    if isinstance(obj, dict) and obj.get("__quant_format__") == LEGACY_QUANT_FORMAT:
        return dequantize_int8_clean(obj, path), f"{LEGACY_QUANT_FORMAT} + {compressor}"
    if isinstance(obj, dict) and "quantized" in obj and callable(ns.get("dequantize_state_dict_int8")):
        fmt = obj.get("__quant_format__", "?")
        return ns["dequantize_state_dict_int8"](
            obj
        ), f"{fmt} (record's dequantize_state_dict_int8) + {compressor}"
    if isinstance(obj, dict) and {"w", "m"} <= set(obj):
        fn_name = next(
            (n for n in ("dequantize_mixed_int6", "dequantize_mixed") if callable(ns.get(n))), None
        )
        if fn_name is None:
            raise LegacyError(
                f"{path}: a mixed-quantization artifact ('w', 'm') but the script defines no dequantize_mixed"
            )
        banked = callable(ns.get("_unbank_state_dict")) and callable(ns.get("_rebank_state_dict"))
        if banked:
            flat = ns["_unbank_state_dict"](template, num_layers)
            state = ns["_rebank_state_dict"](ns[fn_name](obj["w"], obj["m"], flat), num_layers, template)
        else:
            state = ns[fn_name](obj["w"], obj["m"], template)
        return (
            state,
            f"mixed int6/int8 {{w, m}} (record's {fn_name}{', banked' if banked else ''}) + {compressor}",
        )
    keys = sorted(obj)[:8] if isinstance(obj, dict) else type(obj).__name__
    raise LegacyError(f"{path}: an artifact layout this verifier does not know (top-level keys {keys})")


# ---- The script: definitions only ----


def _calls(node: ast.AST) -> bool:
    return any(isinstance(n, ast.Call | ast.Await | ast.Yield | ast.YieldFrom) for n in ast.walk(node))


def _names(node: ast.AST) -> set[str]:
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}


class _StripDecorations(ast.NodeTransformer):
    """Remove decorators and annotations (both run code at definition time)."""

    def _fn(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> ast.AST:
        node.decorator_list, node.returns = [], None
        for a in [
            *node.args.posonlyargs,
            *node.args.args,
            *node.args.kwonlyargs,
            node.args.vararg,
            node.args.kwarg,
        ]:
            if a is not None:
                a.annotation = None
        return node  # bodies run only when called; nested definitions stay as written

    visit_FunctionDef = _fn
    visit_AsyncFunctionDef = _fn


def _targets(s: ast.Assign | ast.AnnAssign) -> set[str]:
    targets = s.targets if isinstance(s, ast.Assign) else [s.target]
    return set().union(*(_names(t) for t in targets))


def _class_body(stmt: ast.ClassDef, skipped: list[str]) -> list[ast.stmt]:
    body: list[ast.stmt] = []
    dropped: set[str] = set()
    for s in stmt.body:
        if isinstance(s, ast.FunctionDef | ast.AsyncFunctionDef):
            kept = safe_definition(s, skipped)
            if kept is not None:
                body.append(kept)
        elif isinstance(s, ast.Assign | ast.AnnAssign):
            value = s.value
            if value is not None and (_calls(value) or _names(value) & dropped):
                why = "calls something" if _calls(value) else "reads a dropped field"
                skipped.append(f"line {s.lineno}: {stmt.name}.{ast.unparse(s).split('=')[0].strip()} ({why})")
                dropped |= _targets(s)
            else:
                body.append(s)
        elif isinstance(s, ast.Expr | ast.Pass) and not _calls(s):
            body.append(s)
    return body or [ast.Pass()]


def safe_definition(stmt: ast.stmt, skipped: list[str]) -> ast.stmt | None:
    """The statement as it may run (decorations stripped), or None (and a line in `skipped`)."""
    where = f"line {stmt.lineno}"
    if isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef):
        if any(
            _calls(d) for d in [*stmt.args.defaults, *[d for d in stmt.args.kw_defaults if d is not None]]
        ):
            skipped.append(f"{where}: def {stmt.name} (a default argument calls something)")
            return None
        return _StripDecorations().visit(stmt)
    if isinstance(stmt, ast.ClassDef):
        if stmt.decorator_list or stmt.keywords or any(_calls(b) for b in stmt.bases):
            skipped.append(f"{where}: class {stmt.name} (decorated, or its bases call something)")
            return None
        stmt.body = _class_body(stmt, skipped)
        return stmt
    if isinstance(stmt, ast.Assign | ast.AnnAssign):
        if (
            stmt.value is None
            or _calls(stmt.value)
            or isinstance(stmt, ast.AnnAssign)
            and _calls(stmt.annotation)
        ):
            skipped.append(f"{where}: {ast.unparse(stmt)[:70]} (calls something)")
            return None
        return stmt
    if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant):
        return stmt  # docstring
    skipped.append(f"{where}: {ast.unparse(stmt).splitlines()[0][:70]} (not a definition)")
    return None


def exec_definitions(script: Path) -> tuple[dict[str, Any], list[str]]:
    """Execute only the script's imports and definitions; returns (namespace, skipped statements).

    Record code: call this in the model worker (or in a test), never in a process holding data."""
    try:
        tree = ast.parse(script.read_text(encoding="utf-8"), filename=str(script))
    except SyntaxError as e:
        raise LegacyError(f"{script} does not parse: {e}") from e
    ns: dict[str, Any] = {
        "__name__": "pgolf_legacy_record",
        "__file__": str(script),
        "__builtins__": builtins,
    }
    skipped: list[str] = []

    def run(stmts: list[ast.stmt]) -> bool:
        ok = True
        for stmt in stmts:
            if isinstance(stmt, ast.Import | ast.ImportFrom):
                try:
                    exec(compile(ast.Module([stmt], []), str(script), "exec"), ns)
                except ImportError as e:
                    skipped.append(f"line {stmt.lineno}: {ast.unparse(stmt)} ({e})")
                    ok = False
            elif isinstance(stmt, ast.Try):
                if not run(stmt.body) and stmt.handlers:
                    run(stmt.handlers[0].body)
            else:
                safe = safe_definition(stmt, skipped)
                if safe is not None:
                    exec(compile(ast.fix_missing_locations(ast.Module([safe], [])), str(script), "exec"), ns)
        return ok

    run(tree.body)
    return ns, skipped


# ---- Logits from a model that returns its loss ----


@contextlib.contextmanager
def captured_cross_entropy(ns: dict[str, Any]) -> Iterator[list[tuple[torch.Tensor, torch.Tensor]]]:
    """Replace cross_entropy (in torch and in the script's namespace) by a recorder of its inputs."""
    calls: list[tuple[torch.Tensor, torch.Tensor]] = []
    original = F.cross_entropy

    def recorder(input: torch.Tensor, target: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:  # noqa: A002
        calls.append((input, target))
        return input.new_zeros(())

    names = [k for k, v in ns.items() if v is original]
    F.cross_entropy = recorder
    for k in names:
        ns[k] = recorder
    try:
        yield calls
    finally:
        F.cross_entropy = original
        for k in names:
            ns[k] = original


class LogitsFromLoss(nn.Module):
    """forward(input_ids [B, T]) -> the logits [B, T, V] the wrapped GPT passed to its cross_entropy."""

    def __init__(self, gpt: nn.Module, ns: dict[str, Any]):
        super().__init__()
        self.gpt = gpt
        self._ns = ns

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        B, T = input_ids.shape
        with captured_cross_entropy(self._ns) as calls:
            self.gpt(input_ids, input_ids)
        if len(calls) != 1:
            raise LegacyError(
                f"the record's GPT.forward called cross_entropy {len(calls)} times; the wrapper needs exactly one"
            )
        logits, target = calls[0]
        if target.numel() != B * T or not torch.equal(target.reshape(-1), input_ids.reshape(-1)):
            raise LegacyError(
                "the record's GPT.forward passed cross_entropy targets other than the ones given; cannot align logits"
            )
        if logits.ndim == 2 and logits.shape[0] == B * T:
            return logits.reshape(B, T, -1)
        if logits.ndim == 3 and logits.shape[:2] == (B, T):
            return logits
        raise LegacyError(
            f"cross_entropy received logits of shape {tuple(logits.shape)}; expected ({B * T}, V) or ({B}, {T}, V)"
        )


class ForwardLogits(nn.Module):
    """forward(input_ids) -> the record's own `GPT.forward_logits(input_ids)` (its sliding-window path)."""

    def __init__(self, gpt: nn.Module):
        super().__init__()
        self.gpt = gpt

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.gpt.forward_logits(input_ids)  # type: ignore[operator]


# ---- Stand-ins for CUDA-only modules (opt-in, recorded) ----


def _flash_attn_sdpa(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    causal: bool = False,
    softmax_scale: float | None = None,
    **_: Any,
) -> torch.Tensor:
    """flash_attn_interface.flash_attn_func's contract ([B, T, H, D] in and out, grouped K/V heads) on
    PyTorch's scaled_dot_product_attention."""
    qt, kt, vt = (t.transpose(1, 2) for t in (q, k, v))
    y = F.scaled_dot_product_attention(
        qt, kt, vt, is_causal=causal, scale=softmax_scale, enable_gqa=kt.size(1) != qt.size(1)
    )
    return y.transpose(1, 2)


FALLBACKS: dict[str, dict[str, Any]] = {
    "flash_attn_interface": {"flash_attn_func": _flash_attn_sdpa},
}
"""Modules a record may be run without, when the official asks (`--fallback NAME`): name -> contents."""


def install_fallbacks(names: list[str]) -> None:
    import sys

    for name in names:
        if name not in FALLBACKS:
            raise LegacyError(f"no fallback for {name!r}; known: {sorted(FALLBACKS)}")
        mod = types.ModuleType(name)
        mod.__spec__ = importlib.machinery.ModuleSpec(name, None)
        mod.__dict__.update(FALLBACKS[name])
        sys.modules[name] = mod


# ---- The worker's build ----


def gpt_arguments(spec: dict[str, Any], ns: dict[str, Any]) -> dict[str, Any]:
    """GPT's keyword arguments: the scorer's static ones, then the script's own GPT(...) expressions it
    could not resolve, evaluated here with `args` = the hyperparameters, after main()'s local
    assignments that they read (in source order)."""
    kwargs = dict(spec.get("gpt_kwargs") or {})
    env = {**ns, "args": types.SimpleNamespace(**(spec.get("hyperparameters") or {}))}
    try:
        for name, expr in spec.get("gpt_locals") or []:
            env[name] = eval(compile(ast.parse(expr, mode="eval"), "<main() local>", "eval"), env)
        for name, expr in (spec.get("gpt_call") or {}).items():
            if name not in kwargs:
                kwargs[name] = eval(compile(ast.parse(expr, mode="eval"), "<GPT call>", "eval"), env)
    except AttributeError as e:
        raise LegacyError(
            f"GPT's arguments need a hyperparameter that could not be read statically ({e}); "
            "pass it with --hparam NAME=VALUE"
        ) from e
    return kwargs


def build_legacy(
    spec: dict[str, Any], artifact: Path, device: torch.device
) -> tuple[nn.Module, dict[str, Any]]:
    """The record's model with the artifact's weights, wrapped to return logits; and what was done."""
    script = Path(spec["script"])
    install_fallbacks(list(spec.get("fallbacks") or []))
    ns, skipped = exec_definitions(script)
    gpt_cls = ns.get("GPT")
    if not isinstance(gpt_cls, type) or not issubclass(gpt_cls, nn.Module):
        raise LegacyError(
            f"{script} defines no class GPT(nn.Module) among its definitions (skipped: {skipped[:5]})"
        )
    kwargs = gpt_arguments(spec, ns)
    gpt = gpt_cls(**kwargs)
    template = {k: v.detach().cpu() for k, v in gpt.state_dict().items()}
    state, layout = record_state(artifact, ns, template, kwargs.get("num_layers"))
    try:
        gpt.load_state_dict(state, strict=True)
    except RuntimeError as e:
        raise LegacyError(
            f"the artifact does not fit GPT({kwargs}) (set the run's settings with --hparam NAME=VALUE): {e}"
        ) from e
    gpt = gpt.float().to(device).eval()
    model: nn.Module = (
        ForwardLogits(gpt) if callable(getattr(gpt, "forward_logits", None)) else LogitsFromLoss(gpt, ns)
    )
    return model, {"layout": layout, "skipped": skipped, "gpt_kwargs": kwargs}
