"""`pgolf verify-legacy RECORD_DIR --artifact FILE`: score an entry of the reference challenge as it was made.

A reference entry is one training script (`train_gpt.py`: its Hyperparameters read environment
variables, `class GPT(nn.Module)` with `forward(input_ids, target_ids) -> mean loss`, training in
`main()` under `if __name__ == "__main__"`) and the int8 + zlib artifact it wrote, layout
`int8_clean_per_row_v1`: zlib(torch.save({"__quant_format__", "quantized", "scales", "dtypes",
"passthrough", optional "qmeta", "passthrough_orig_dtypes"})).

How each part is made safe and trustworthy:
- **Artifact**: zlib-decompressed and read with `torch.load(..., weights_only=True)`, PyTorch's
  restricted unpickler, which rebuilds only tensors, dicts, lists, strings and numbers and refuses
  any other global (no arbitrary code runs). The layout is then checked and dequantized with the
  reference's numerics (per-row scales broadcast over rows, per-tensor scales, fp16 passthrough
  restored to its recorded dtype).
- **Model**: the script is parsed with `ast` and only definitions are executed: imports (each on
  its own; one that fails is skipped), function and class definitions with their decorators and
  annotations removed, and assignments whose value calls nothing. Every other top-level statement
  (calls, `if __name__ ...`, loops) is skipped and listed; a class-level assignment that calls
  something is dropped from its class. So nothing at module level is called, and main() never runs.
- **Hyperparameters** are read statically from the `Hyperparameters` class: each field written as
  a literal or `int/float/bool/str(os.environ.get("NAME", default))` takes its default (never the
  verifier's environment), unless `--hparam NAME=VALUE` (field or environment name) overrides it.
  GPT's keyword arguments are taken from the script's own `GPT(...)` call (`args.X` → field X),
  else matched to GPT's parameter names.
- **Scoring**: the script's GPT computes its loss itself; the scorer needs logits. The wrapper
  calls GPT.forward with the input as dummy targets while `torch.nn.functional.cross_entropy` is
  replaced by a recorder, and takes the logits the model passed to it (checking that exactly one
  call was made and that its targets are the ones given, so the rows are in order). This uses the
  record's own forward, including its soft-cap and head, and works for any forward that ends in
  cross_entropy. The trusted scorer (scoring/score/evaluate.py) then computes the loss, with the probes.
- **Bytes**, as the reference counts them: the script's text as UTF-8 (`len(code.encode())`) plus
  the artifact file's size.
"""

from __future__ import annotations

import argparse
import ast
import builtins
import contextlib
import inspect
import io
import json
import pickle
import time
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from data.io import read_json, sha256_file, write_json_atomic
from data.manifest import load_manifest
from data.shards import read_split
from data.tokenizer import load_tokenizer
from scoring.artifact.cap import ARTIFACT_CAP_BYTES
from scoring.artifact.codecs import StateDict
from scoring.score.evaluate import (
    EVAL_DTYPES,
    EVAL_MODES,
    EvalConfig,
    LocalModel,
    batch_count,
    eval_tokens,
    evaluate,
    tune_cpu_allocator,
)
from scoring.score.probes import ProbeConfig, plan_probes, run_probes

LEGACY_QUANT_FORMAT = "int8_clean_per_row_v1"
LEGACY_SCORE_FORMAT = "pg-legacy-score"
LEGACY_SCORE_VERSION = 1
SCRIPT_NAME = "train_gpt.py"
_CASTS = {"int": int, "float": float, "bool": bool, "str": str}


class LegacyError(ValueError):
    """A reference-format record or artifact cannot be loaded; the message says why and what to do."""


# ---- The artifact ----


def _tensor_dict(obj: dict, key: str, path: Path) -> dict[str, torch.Tensor]:
    d = obj.get(key, {})
    if not isinstance(d, dict) or not all(
        isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in d.items()
    ):
        raise LegacyError(f"{path}: {key!r} must map tensor names to tensors")
    return d


def load_legacy_artifact(path: str | Path) -> StateDict:
    """Decompress, unpickle with weights_only=True, check the layout, dequantize (reference numerics)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"artifact not found: {path}")
    try:
        raw = zlib.decompress(path.read_bytes())
    except zlib.error as e:
        raise LegacyError(
            f"{path} is not zlib-compressed ({e}); expected the reference's final_model.int8.ptz"
        ) from e
    try:
        obj = torch.load(io.BytesIO(raw), map_location="cpu", weights_only=True)
    except (pickle.UnpicklingError, RuntimeError, EOFError) as e:
        raise LegacyError(
            f"{path}: refused by the restricted unpickler (weights_only=True): it holds something other than tensors, "
            f"dicts, lists, strings and numbers ({str(e).splitlines()[0][:200]})"
        ) from e
    if not isinstance(obj, dict) or obj.get("__quant_format__") != LEGACY_QUANT_FORMAT:
        fmt = obj.get("__quant_format__") if isinstance(obj, dict) else type(obj).__name__
        raise LegacyError(f"{path}: quant format {fmt!r}; this loader reads {LEGACY_QUANT_FORMAT!r}")
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


# ---- The script: definitions only ----


def _calls(node: ast.AST) -> bool:
    return any(isinstance(n, ast.Call | ast.Await | ast.Yield | ast.YieldFrom) for n in ast.walk(node))


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


def _safe_def(stmt: ast.stmt, skipped: list[str]) -> ast.stmt | None:
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
        body = []
        for s in stmt.body:
            if isinstance(s, ast.FunctionDef | ast.AsyncFunctionDef):
                body.append(_safe_def(s, skipped))
            elif isinstance(s, ast.Assign | ast.AnnAssign) and s.value is not None and _calls(s.value):
                skipped.append(
                    f"line {s.lineno}: {stmt.name}.{ast.unparse(s).split('=')[0].strip()} (calls something)"
                )
            elif isinstance(s, ast.Expr | ast.Pass | ast.Assign | ast.AnnAssign):
                body.append(s if not (isinstance(s, ast.Expr) and _calls(s)) else None)
        stmt.body = [s for s in body if s is not None] or [ast.Pass()]
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
    """Execute only the script's imports and definitions; returns (namespace, skipped statements)."""
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
                safe = _safe_def(stmt, skipped)
                if safe is not None:
                    exec(compile(ast.fix_missing_locations(ast.Module([safe], [])), str(script), "exec"), ns)
        return ok

    run(tree.body)
    return ns, skipped


# ---- Hyperparameters and GPT(...) ----


class _Unresolved(Exception):  # noqa: N818 - control flow inside this module only
    pass


def _static(node: ast.expr, overrides: dict[str, str]) -> Any:
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return -_static(node.operand, overrides)
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id in _CASTS
        and len(node.args) == 1
    ):
        value = _static(node.args[0], overrides)
        if node.func.id == "bool" and isinstance(value, str):
            value = int(value)
        return _CASTS[node.func.id](value)
    if isinstance(node, ast.Call) and ast.unparse(node.func) == "os.environ.get" and len(node.args) == 2:
        name = _static(node.args[0], overrides)
        return overrides[name] if name in overrides else _static(node.args[1], overrides)
    raise _Unresolved(ast.unparse(node))


def read_hyperparameters(script: Path, overrides: dict[str, str]) -> dict[str, Any]:
    """Field defaults of `class Hyperparameters` (overridden by field or env-var name), statically."""
    tree = ast.parse(script.read_text(encoding="utf-8"))
    cls = next((n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Hyperparameters"), None)
    if cls is None:
        raise LegacyError(
            f"{script} defines no class Hyperparameters; is it a reference-style record script?"
        )
    out: dict[str, Any] = {}
    for s in cls.body:
        if isinstance(s, ast.Assign) and len(s.targets) == 1 and isinstance(s.targets[0], ast.Name):
            name = s.targets[0].id
            env = _env_names(s.value)
            ov = {**overrides, **({e: overrides[name] for e in env} if name in overrides else {})}
            try:
                value = _static(s.value, ov)
                if name in overrides and not env:  # a plain literal field, overridden by its own name
                    value = type(value)(ast.literal_eval(overrides[name]))
            except (_Unresolved, ValueError, SyntaxError):
                continue
            out[name] = value
    return out


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


def gpt_kwargs(script: Path, gpt_cls: type[nn.Module], hp: dict[str, Any]) -> dict[str, Any]:
    """GPT's keyword arguments: from the script's GPT(...) call, else GPT's parameter names."""
    tree = ast.parse(script.read_text(encoding="utf-8"))
    call = next(
        (
            n
            for n in ast.walk(tree)
            if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == "GPT"
        ),
        None,
    )
    params = [p for p in inspect.signature(gpt_cls.__init__).parameters.values() if p.name != "self"]
    kw: dict[str, Any] = {}
    if call is not None and not call.args:
        for k in call.keywords:
            v = k.value
            if isinstance(v, ast.Attribute) and isinstance(v.value, ast.Name) and v.attr in hp:
                kw[str(k.arg)] = hp[v.attr]
            elif isinstance(v, ast.Constant):
                kw[str(k.arg)] = v.value
    for p in params:
        if p.name not in kw and p.name in hp:
            kw[p.name] = hp[p.name]
        if p.name not in kw and p.default is inspect.Parameter.empty:
            raise LegacyError(
                f"cannot tell GPT's argument {p.name!r} from the script; pass --hparam {p.name}=VALUE"
            )
    return kw


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


# ---- Scoring ----


def find_script(record_dir: Path, script: str | None) -> Path:
    if script:
        return record_dir / script
    if (record_dir / SCRIPT_NAME).is_file():
        return record_dir / SCRIPT_NAME
    found = [
        p
        for p in sorted(record_dir.glob("*.py"))
        if "class GPT" in p.read_text(encoding="utf-8", errors="replace")
    ]
    if len(found) != 1:
        raise FileNotFoundError(
            f"{record_dir}: expected {SCRIPT_NAME} (or one .py defining class GPT); pass --script NAME"
        )
    return found[0]


def score_legacy(
    record_dir: str | Path,
    artifact: str | Path,
    data_dir: str | Path,
    *,
    cfg: EvalConfig | None = None,
    hparams: dict[str, str] | None = None,
    script: str | None = None,
    device: str = "cpu",
    cap_bytes: int = ARTIFACT_CAP_BYTES,
) -> dict[str, Any]:
    """Build the record's model from its script, load its artifact, score it; the "pg-legacy-score" record."""
    t0 = time.perf_counter()
    record_dir, artifact = Path(record_dir), Path(artifact)
    script_path = find_script(record_dir, script)
    hp = read_hyperparameters(script_path, hparams or {})
    ns, skipped = exec_definitions(script_path)
    gpt_cls = ns.get("GPT")
    if not isinstance(gpt_cls, type) or not issubclass(gpt_cls, nn.Module):
        raise LegacyError(
            f"{script_path} defines no class GPT(nn.Module) among its definitions (skipped: {skipped[:5]})"
        )
    kwargs = gpt_kwargs(script_path, gpt_cls, hp)
    state = load_legacy_artifact(artifact)
    dev = torch.device(device)
    if dev.type == "cpu":
        tune_cpu_allocator()
    gpt = gpt_cls(**kwargs)
    try:
        gpt.load_state_dict(state, strict=True)
    except RuntimeError as e:
        raise LegacyError(
            f"the artifact does not fit GPT({kwargs}) (set the run's settings with --hparam NAME=VALUE): {e}"
        ) from e
    model = LogitsFromLoss(gpt.float().to(dev).eval(), ns)
    cfg = cfg or EvalConfig(seq_len=int(hp.get("train_seq_len", 1024)))
    manifest = load_manifest(data_dir)
    tokenizer = load_tokenizer(manifest.tokenizer_path)
    table = tokenizer.byte_table()
    tokens = read_split(data_dir, "val")
    pcfg = ProbeConfig()
    plan = plan_probes(batch_count(tokens, cfg, tokenizer.bos_id), pcfg)
    res = evaluate(model, tokens, table, cfg, dev, bos_id=tokenizer.bos_id, keep_batches=plan.batches)

    def fresh_models() -> Iterator[LocalModel]:  # a new model from the artifact for each probe forward
        while True:
            m = gpt_cls(**kwargs)
            m.load_state_dict(state, strict=True)
            yield LocalModel(LogitsFromLoss(m.float().to(dev).eval(), ns), cfg.dtype)

    probes = run_probes(
        plan, res.kept, fresh_models(), eval_tokens(tokens, cfg), pcfg, total_batches=res.batches
    )
    code_bytes = len(script_path.read_text(encoding="utf-8").encode("utf-8"))
    model_bytes = artifact.stat().st_size
    claimed = (
        read_json(record_dir / "submission.json", what="record metadata")
        if (record_dir / "submission.json").is_file()
        else {}
    )
    scored = {
        "val_loss": res.sums.val_loss,
        "val_bpb": res.sums.val_bpb,
        "bytes_total": code_bytes + model_bytes,
    }
    return {
        "format": LEGACY_SCORE_FORMAT,
        "format_version": LEGACY_SCORE_VERSION,
        **scored,
        "val_tokens": res.sums.tokens,
        "val_bytes": res.sums.bytes,
        "eval_mode": cfg.mode,
        "eval_seq_len": cfg.seq_len,
        "eval_stride": cfg.resolved_stride,
        "eval_dtype": cfg.dtype,
        "eval_subset_max_tokens": cfg.max_tokens,
        "eval_windows": res.windows,
        "eval_time_s": res.eval_time_s,
        "bytes_code": code_bytes,
        "bytes_model": model_bytes,
        "cap_bytes": cap_bytes,
        "within_cap": code_bytes + model_bytes <= cap_bytes,
        "probes": probes,
        "script": str(script_path),
        "script_sha256": sha256_file(script_path),
        "artifact_sha256": sha256_file(artifact),
        "artifact_loader": "zlib + torch.load(weights_only=True)",
        "hyperparameters": hp,
        "gpt_kwargs": kwargs,
        "skipped_statements": skipped,
        "claimed": {
            k: claimed[k]
            for k in ("val_loss", "val_bpb", "bytes_total")
            if isinstance(claimed.get(k), int | float)
        },
        "claimed_minus_scored": {
            k: claimed[k] - scored[k] for k in scored if isinstance(claimed.get(k), int | float)
        },
        "data_dir": str(data_dir),
        "device": dev.type,
        "score_wall_s": time.perf_counter() - t0,
    }


def cmd_verify_legacy(args: argparse.Namespace) -> int:
    overrides = {}
    for item in args.hparam:
        k, sep, v = item.partition("=")
        if not sep:
            raise ValueError(f"--hparam {item!r}: expected NAME=VALUE, e.g. --hparam NUM_LAYERS=10")
        overrides[k.strip()] = v.strip()
    seq_len = args.seq_len or int(
        read_hyperparameters(find_script(Path(args.record), args.script), overrides).get(
            "train_seq_len", 1024
        )
    )
    cfg = EvalConfig(
        mode=args.mode,
        seq_len=seq_len,
        batch_seqs=args.batch_seqs,
        max_tokens=args.max_tokens or None,
        dtype=args.dtype,
        stride=args.stride or None,
    )
    rec = score_legacy(
        args.record,
        args.artifact,
        args.data,
        cfg=cfg,
        hparams=overrides,
        script=args.script,
        device=args.device,
        cap_bytes=args.cap_bytes,
    )
    if args.json_out:
        write_json_atomic(args.json_out, rec)
    if args.json:
        print(json.dumps(rec, sort_keys=True))
        return 0
    print(
        f"legacy record {args.record}: val_loss {rec['val_loss']:.6f} nats/token  val_bpb {rec['val_bpb']:.6f} bits/byte "
        f"({rec['val_tokens']:,} tokens, {rec['eval_mode']}, seq_len {rec['eval_seq_len']})"
    )
    print(
        f"  bytes_total {rec['bytes_total']:,} = script {rec['bytes_code']:,} + artifact {rec['bytes_model']:,} "
        f"(cap {rec['cap_bytes']:,}, within_cap {rec['within_cap']})"
    )
    for k, d in rec["claimed_minus_scored"].items():
        print(f"  claimed {k} {rec['claimed'][k]} vs scored {rec[k]:.6f} (claimed - scored = {d:+.6g})")
    print(f"  probes passed; {len(rec['skipped_statements'])} top-level statement(s) not executed")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "verify-legacy",
        help="score a reference-format record (train_gpt.py + int8/zlib artifact) with the trusted scorer",
    )
    p.add_argument(
        "record", help="the record folder (train_gpt.py, optional submission.json with the claimed numbers)"
    )
    p.add_argument(
        "--artifact", required=True, help="the record's int8_clean_per_row_v1 artifact (final_model.int8.ptz)"
    )
    p.add_argument(
        "--data", required=True, help="dataset folder with the validation shards and the tokenizer"
    )
    p.add_argument("--script", help=f"the training script's name (default: {SCRIPT_NAME})")
    p.add_argument(
        "--hparam",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a Hyperparameters value the run set by env var",
    )
    p.add_argument("--mode", default="standard", choices=EVAL_MODES)
    p.add_argument("--seq-len", type=int, default=0, help="window length (0: the script's train_seq_len)")
    p.add_argument("--stride", type=int, default=0)
    p.add_argument("--batch-seqs", type=int, default=32)
    p.add_argument(
        "--max-tokens", type=int, default=0, help="score only the first N validation tokens (0: all)"
    )
    p.add_argument("--dtype", default="float32", choices=EVAL_DTYPES)
    p.add_argument("--device", default="cpu")
    p.add_argument("--cap-bytes", type=int, default=ARTIFACT_CAP_BYTES)
    p.add_argument("--json", action="store_true")
    p.add_argument("--json-out", help="also write the record to this file")
    p.set_defaults(func=cmd_verify_legacy)
