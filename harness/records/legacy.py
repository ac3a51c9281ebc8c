"""`pgolf verify-legacy RECORD_DIR --artifact FILE`: score an entry of the reference challenge as it was made.

A reference entry is one training script (`train_gpt.py`: its Hyperparameters read environment
variables, `class GPT(nn.Module)` whose forward returns the mean loss, training in `main()` under
`if __name__ == "__main__"`) and the artifact its own serializer wrote.

Where each part runs:
- **This process (the scorer) runs none of the record's code.** It reads the script as text: a
  self-extracting script (`exec(lzma.decompress(base64.b85decode("...")))`, or `exec(open(...))` of a
  sibling file) is decoded here, as data; the Hyperparameters are read statically (each field written
  as a literal or `int/float/bool/str(os.environ.get("NAME", default))`, with `.strip()`/`.lower()`
  and module-level constants, takes its default, never the verifier's environment, unless
  `--hparam NAME=VALUE` (field or environment name) overrides it); GPT's keyword arguments come from
  the script's own `GPT(...)` call (`args.X` -> field X), else from GPT's parameter names; and the
  evaluation settings are the script's own (`eval_seq_len` or `train_seq_len`; a sliding stride
  `eval_stride`). It holds the validation tokens and byte tables, builds the windows, computes the
  float64 loss, runs the probes (fresh workers) and writes the record, exactly as the normal scorer.
- **The record's code runs only in the model worker** (scoring/worker/legacy.py, the worker's
  "legacy" build mode), confined like any submission's: Landlock reads of the script, the artifact
  and the Python installation only, its own PID/mount/network namespaces, no capabilities, seccomp,
  an address-space limit. There the script's imports and definitions (never its top level or
  main()) are executed, the artifact is decompressed (zlib, zstd, lzma, brotli; byte-shuffle undone)
  and read with `torch.load(weights_only=True)`, dequantized (int8_clean_per_row_v1 with the
  reference's numerics; the later int6/GPTQ {w, m} layouts with the record's own dequantizer), and
  the record's `forward_logits` (or its loss forward, with cross_entropy recorded) gives logits.
- **Refusals, not tracebacks**: a script that needs what this machine lacks is refused before any
  worker starts, with one line naming it: a module imported unconditionally and used by the model
  that is not installed ("needs flash_attn_interface (FlashAttention 3, CUDA only)"), syntax of a
  newer Python ("needs Python >= 3.12"), an artifact layout no loader knows.
- **Bytes**, as the reference counts them: the script file's bytes as shipped (compressed, for a
  self-extracting one) plus the artifact file's size.

Measured on records of openai/parameter-golf (records/track_10min_16mb), CPU, Python 3.11. A scratch
driver (kept outside the repository) built each record's model at a small shape (2 layers, model and
embedding dim 256, 4 heads / 2 KV heads, MLP 3x, vocab 1024, seq 128; random weights, seed 0, zero-init
projections drawn N(0, 0.02)), so that tensors above the records' 65,536-element keep-float limit are
really quantized; wrote the artifact with the record's own quantizer and compressor calls (GPTQ
records: the record's own collect_hessians on 2 batches of the dataset's training tokens; the
03-25/03-29/03-31 `mixed_quantize_int6` ran without Hessians, its hessians=None path); ran the
record's own decompress + dequantize and its own `eval_val` in float32; then `pgolf verify-legacy
--mode standard --max-tokens 3072 --fallback flash_attn_interface --hparam ...` on the same artifact
and tokens (FineWeb, official sp1024 tokenizer, 4 validation docs, `pgolf data build`). Records that
import flash_attn_interface ran with the same SDPA stand-in on both sides.

| record | layout (the record's own serializer) | quantized tensors | result | bpb verify-legacy | bpb record's own eval_val | delta |
| --- | --- | --- | --- | --- | --- | --- |
| 2026-03-17_NaiveBaseline | int8_clean_per_row_v1 + zlib-9 | 5 | loads, probes pass | 3.99895353 | 3.99895359 | -5.9e-08 |
| 2026-03-18_LongContextSeq2048 | int8_clean_per_row_v1 + zlib-9 | 5 | loads, probes pass | 3.99895353 | 3.99895359 | -5.9e-08 |
| 2026-03-19_MixedQuant_Int6Int8_SlidingWindow | int8_clean_per_row_v1 + zlib-9 | 5 | loads, probes pass | 3.99891038 | 3.99891041 | -2.5e-08 |
| 2026-03-19_SlidingWindowEval | int8_clean_per_row_v1 + zlib-9 | 5 | loads, probes pass | 3.99895353 | 3.99895359 | -5.9e-08 |
| 2026-03-20_10L_Int5MLP_MuonWD04_SWA50 | int6 mixed {w,m} ['attn', 'bigram', 'mlp'] + zstd-22 | 12 | loads, probes pass | 3.99917071 | 3.99917071 | +1.3e-09 |
| 2026-03-21_11L_XSA4_EMA_PartialRoPE_LateQAT_1.1248 | int6 mixed {w,m} ['attn', 'mlp'] + zstd-22 | 5 | loads, probes pass | 4.00053690 | 4.00053677 | +1.3e-07 |
| 2026-03-22_11L_EMA_GPTQ-lite_warmdown3500_QAT015_1.1233 | int6 mixed {w,m} ['attn', 'mlp'] + zstd-22 | 6 | loads, probes pass | 3.99939717 | 3.99939736 | -1.9e-07 |
| 2026-03-23_LeakyReLU_LegalTTT_ParallelMuon | int6 mixed {w,m} ['attn', 'mlp'] banked + lzma-6 | 6 | loads, probes pass | 3.99738824 | 3.99738811 | +1.3e-07 |
| 2026-03-25_ValCalib_GPTQ_XSA_BigramHash3072 | int6 mixed {w,m} ['attn', 'mlp'] banked + lzma-9 | 6 | loads, probes pass | 3.99738824 | 3.99738811 | +1.3e-07 |
| 2026-03-29_Loader_FullGPTQ_XSA11_BigramHash2816 | int6 mixed {w,m} ['attn', 'mlp'] banked + lzma-6 | 6 | loads, probes pass | 3.99738824 | 3.99738811 | +1.3e-07 |
| 2026-03-31_ParallelResiduals_MiniDepthRecurrence | int6 mixed {w,m} ['attn', 'mlp'] banked + byte-shuffle + brotli-11 | 6 | loads, probes pass | 3.99738655 | 3.99738646 | +9.1e-08 |
| 2026-04-01_Vocab4096_MLPMult4_WD085 | GPTQ gptq_mixed_quantize_int6 {w,m} (4 Hessians) + byte-shuffle + brotli-11 (record's _compress) | 8 | loads, probes pass | 4.00448222 | 4.00448239 | -1.8e-07 |
| 2026-04-03_MuonEqR_DepthRecurrence_WD090_AllInt6 | | | refused: needs Python >= 3.12 (line 574 uses the f-string syntax of PEP 701; this is Python 3.11) | | | |
| 2026-04-04_SP4096_DepthRecurrence_ParallelResid_MuonEqR | GPTQ gptq_mixed_quantize_int6 {w,m} (4 Hessians) + byte-shuffle + brotli-11 (record's _compress) | 8 | loads, probes pass | 4.00437024 | 4.00437044 | -2.0e-07 |
| 2026-04-05_SP8192_GPTQ-Embeddings_SDClip_Loop45x2 | GPTQ gptq_mixed_quantize {w,m} (5 Hessians) + byte-shuffle + brotli-11 (record's _compress) | 5 | loads, probes pass | 3.99848608 | 3.99848607 | +3.1e-09 |
| 2026-04-06_SP8192_HessianSDClip_ProgressiveRecurrence | GPTQ gptq_mixed_quantize {w,m} (5 Hessians) + byte-shuffle + brotli-11 (record's _compress) | 5 | loads, probes pass | 3.99848608 | 3.99848607 | +3.1e-09 |
| 2026-04-09_SP8192_3LayerRecur_ParResid_QK525_LegalTTT | | | refused: needs Python >= 3.12 (line 266 uses the f-string syntax of PEP 701; this is Python 3.11) | | | |
| 2026-04-10_VarLenAttn | | | refused: needs triton (Triton kernels, CUDA only), which this machine does not have | | | |
| 2026-04-29_SmearGateBOSFix_3Seed_1.06141 | | | refused: needs triton (Triton kernels, CUDA only), which this machine does not have | | | |

The 04-04 and 04-05 scripts are self-extracting (lzma + base85) and 04-06's is an exec() of its
sibling train_gpt_decode.py: all decoded here as data. Without `--fallback flash_attn_interface`, every record from 2026-03-20 that imports FlashAttention 3
is refused in one line (exit 2) naming it and the flag. Not done: the record's score-first TTT is not
replayed (`ttt_applied` false in the record); the records' sliding evaluation starts windows at
multiples of the stride while the harness aligns its last window to the end of the tokens (the same
targets, different context for the tail), so the comparison above is in standard mode; records that
need triton or Python 3.12 syntax are refused, not run.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import importlib.util
import json
import lzma
import re
import sys
import tempfile
import time
from base64 import b85decode
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from data.io import read_json, sha256_file, write_json_atomic
from data.manifest import load_manifest
from data.shards import read_split
from data.tokenizer import load_tokenizer
from scoring.artifact.cap import ARTIFACT_CAP_BYTES
from scoring.score.eval_config import EVAL_DTYPES, EVAL_MODES
from scoring.score.evaluate import (
    EvalConfig,
    batch_count,
    eval_tokens,
    evaluate,
)
from scoring.score.probes import PROBE_WORKERS_PER_PROBE, ProbeConfig, plan_probes, run_probes
from scoring.score.remote import (
    WorkerConfig,
    WorkerFailure,
    WorkerModel,
    start_worker,
)
from scoring.worker.child import default_memory_limit_bytes
from scoring.worker.legacy import FALLBACKS, LEGACY_QUANT_FORMAT, LegacyError

__all__ = ["LEGACY_QUANT_FORMAT", "LegacyError", "score_legacy"]

LEGACY_SCORE_FORMAT = "pg-legacy-score"
LEGACY_SCORE_VERSION = 2
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
_EXC_LINE = re.compile(r"^([A-Za-z_][\w.]*(?:Error|Exception|Failure|Violation|Denied)): ")
TRAINING_ONLY = {"main", "train", "train_model"}
"""Functions whose use of a missing module does not matter to scoring."""


# ---- The script as shipped, decoded as data ----


def _parse(source: str, script: Path) -> ast.Module:
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


def _self_extracting(tree: ast.Module, script: Path) -> tuple[str, str] | None:
    """(source, how) when the script's only work is exec() of a decoded payload or of a sibling file."""
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
        raw = b85decode(data)
        if "FORMAT_RAW" in kw.get("format", ""):
            text = lzma.decompress(raw, format=lzma.FORMAT_RAW, filters=[{"id": lzma.FILTER_LZMA2}])
        else:
            text = lzma.decompress(raw)
        return text.decode("utf-8"), "self-extracting (lzma + base85)"
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
            sibling = script.with_name(script.name.replace(old, new))
            if sibling.is_file():
                return sibling.read_text(encoding="utf-8"), f"exec of {sibling.name}"
    return None


def script_source(script: Path) -> tuple[str, list[str]]:
    """The script's Python source, decoding self-extracting wrappers (as data: nothing is executed)."""
    source = script.read_text(encoding="utf-8")
    packaging: list[str] = []
    for _ in range(3):
        found = _self_extracting(_parse(source, script), script)
        if found is None:
            break
        source, how = found
        packaging.append(how)
    return source, packaging


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
        except (_Unresolved, ValueError, SyntaxError, TypeError):
            continue
        out[name] = value
    return out


def read_hyperparameters(script: Path, overrides: dict[str, str]) -> dict[str, Any]:
    """The script's Hyperparameters, statically (self-extracting scripts decoded first)."""
    source, _ = script_source(script)
    return hyperparameters_of(_parse(source, script), script, overrides)


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
            elif isinstance(v, ast.Constant):
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


def eval_settings(hp: dict[str, Any]) -> dict[str, Any]:
    """The record's own evaluation settings: window length and sliding stride."""
    seq_len = int(hp.get("eval_seq_len") or hp.get("train_seq_len") or 1024)
    stride = int(hp.get("eval_stride") or 0)
    return {
        "seq_len": seq_len,
        "mode": "sliding" if 0 < stride < seq_len else "standard",
        "stride": stride if 0 < stride < seq_len else None,
        "ttt": bool(hp.get("ttt_enabled", False)),
    }


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


def _compressor(artifact: Path) -> str:
    head = artifact.read_bytes()[:6]
    if head[:4] == b"\x28\xb5\x2f\xfd":
        return "zstd"
    if head[:6] == b"\xfd7zXZ\x00":
        return "lzma"
    return "zlib" if head[:1] == b"\x78" else "other (brotli or raw lzma)"


def _worker_error(e: WorkerFailure) -> LegacyError:
    """One clear message from the worker's report: its exception's own lines, not the traceback."""
    lines = str(e).strip().splitlines()
    starts = [i for i, ln in enumerate(lines) if _EXC_LINE.match(ln)]
    text = " ".join(ln.strip() for ln in lines[starts[-1] :]) if starts else (lines or ["no message"])[-1]
    text = _EXC_LINE.sub(lambda m: f"{m.group(1).rsplit('.', 1)[-1]}: ", text, count=1)
    return LegacyError(f"the record's model failed in the model worker ({e.kind}): {text[:800]}")


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
    sandbox: str = "auto",
    probe_cfg: ProbeConfig | None = None,
    fallbacks: tuple[str, ...] = (),
) -> dict[str, Any]:
    """Score a record's artifact with the record's model built in a confined worker; the "pg-legacy-score" record."""
    t0 = time.perf_counter()
    record_dir, artifact, data_dir = Path(record_dir), Path(artifact), Path(data_dir)
    if not artifact.is_file():
        raise FileNotFoundError(f"artifact not found: {artifact}")
    script_path = find_script(record_dir, script)
    source, packaging = script_source(script_path)
    tree = _parse(source, script_path)
    refuse_missing(tree, script_path, fallbacks)
    hp = hyperparameters_of(tree, script_path, hparams or {})
    kwargs, call_exprs, call_locals = gpt_call(tree, script_path, hp)
    settings = eval_settings(hp)
    cfg = cfg or EvalConfig(seq_len=settings["seq_len"], mode=settings["mode"], stride=settings["stride"])
    pcfg = probe_cfg or ProbeConfig()
    manifest = load_manifest(data_dir)
    tokenizer = load_tokenizer(manifest.tokenizer_path)
    table = tokenizer.byte_table()
    dev_name = device if device != "cpu" else "cpu"
    with tempfile.TemporaryDirectory(prefix="pgolf-legacy-") as tmp:
        run_script = script_path
        if packaging:  # the decoded source, for the worker to read
            run_script = Path(tmp) / SCRIPT_NAME
            run_script.write_text(source, encoding="utf-8")
        wcfg = WorkerConfig(
            code_dir=run_script,
            artifact=artifact,
            device=dev_name,
            dtype=cfg.dtype,
            threads=torch.get_num_threads(),
            vocab_size=table.vocab_size,
            max_tokens_per_batch=cfg.batch_seqs * cfg.seq_len,
            sandbox=sandbox,
            protected=(data_dir, manifest.root),
            memory_limit_bytes=default_memory_limit_bytes() if device == "cpu" else 0,
            legacy={
                "script": str(run_script),
                "gpt_kwargs": kwargs,
                "gpt_call": call_exprs,
                "gpt_locals": call_locals,
                "fallbacks": list(fallbacks),
                "hyperparameters": {k: v for k, v in hp.items() if isinstance(v, int | float | str | bool)},
            },
        )
        workers: list[WorkerModel] = []
        try:
            main = start_worker(wcfg)
            workers.append(main)
            main.start()  # builds while this process reads the data; probe workers wait idle
            probe_workers = [
                start_worker(dataclasses.replace(wcfg, role="probe"))
                for _ in range(pcfg.probes * PROBE_WORKERS_PER_PROBE)
            ]
            workers += probe_workers
            tokens = read_split(data_dir, "val")
            main.wait_ready()
            dev = torch.device(device)
            plan = plan_probes(batch_count(tokens, cfg, tokenizer.bos_id), pcfg)
            res = evaluate(
                main,
                tokens,
                table,
                cfg,
                dev,
                bos_id=tokenizer.bos_id,
                keep_batches=plan.batches,
                shuffle_seed=plan.seed,
            )
            for w in probe_workers:
                w.start()

            def fresh() -> Iterator[WorkerModel]:
                for w in probe_workers:
                    w.wait_ready()
                    yield w

            probes = run_probes(
                plan, res.kept, fresh(), eval_tokens(tokens, cfg), pcfg, total_batches=res.batches
            )
            isolation = main.describe()
        except WorkerFailure as e:
            raise _worker_error(e) from e
        finally:
            for w in workers:
                w.close()
    code_bytes = len(script_path.read_text(encoding="utf-8").encode("utf-8"))  # as the reference counts
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
        "record_eval_settings": settings,
        "ttt_applied": False,
        "bytes_code": code_bytes,
        "bytes_model": model_bytes,
        "cap_bytes": cap_bytes,
        "within_cap": code_bytes + model_bytes <= cap_bytes,
        "probes": probes,
        "script": str(script_path),
        "script_packaging": packaging or ["plain"],
        "script_sha256": sha256_file(script_path),
        "artifact_sha256": sha256_file(artifact),
        "artifact_compressor": _compressor(artifact),
        "artifact_loader": "in the model worker: decompress + torch.load(weights_only=True)",
        "worker": isolation,
        "hyperparameters": hp,
        "gpt_kwargs": kwargs,
        "gpt_call_in_worker": call_exprs,
        "fallbacks": list(fallbacks),
        "claimed": {
            k: claimed[k]
            for k in ("val_loss", "val_bpb", "bytes_total")
            if isinstance(claimed.get(k), int | float)
        },
        "claimed_minus_scored": {
            k: claimed[k] - scored[k] for k in scored if isinstance(claimed.get(k), int | float)
        },
        "data_dir": str(data_dir),
        "device": device,
        "score_wall_s": time.perf_counter() - t0,
    }


def cmd_verify_legacy(args: argparse.Namespace) -> int:
    overrides = {}
    for item in args.hparam:
        k, sep, v = item.partition("=")
        if not sep:
            raise ValueError(f"--hparam {item!r}: expected NAME=VALUE, e.g. --hparam NUM_LAYERS=10")
        overrides[k.strip()] = v.strip()
    settings = eval_settings(read_hyperparameters(find_script(Path(args.record), args.script), overrides))
    mode = args.mode or settings["mode"]
    cfg = EvalConfig(
        mode=mode,
        seq_len=args.seq_len or settings["seq_len"],
        batch_seqs=args.batch_seqs,
        max_tokens=args.max_tokens or None,
        dtype=args.dtype,
        stride=args.stride or (settings["stride"] if mode == "sliding" else None),
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
        fallbacks=tuple(args.fallback),
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
    print("  scored in a confined model worker; probes passed in fresh workers")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "verify-legacy",
        help="score a reference-format record (its training script + the artifact its serializer wrote) with the trusted scorer",
    )
    p.add_argument(
        "record", help="the record folder (train_gpt.py, optional submission.json with the claimed numbers)"
    )
    p.add_argument(
        "--artifact",
        required=True,
        help="the artifact the record's serializer wrote (e.g. final_model.int8.ptz)",
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
    p.add_argument(
        "--mode",
        default="",
        choices=("", *EVAL_MODES),
        help="default: the script's own (sliding if it sets eval_stride)",
    )
    p.add_argument(
        "--seq-len", type=int, default=0, help="window length (0: the script's eval_seq_len or train_seq_len)"
    )
    p.add_argument("--stride", type=int, default=0)
    p.add_argument("--batch-seqs", type=int, default=32)
    p.add_argument(
        "--max-tokens", type=int, default=0, help="score only the first N validation tokens (0: all)"
    )
    p.add_argument("--dtype", default="float32", choices=EVAL_DTYPES)
    p.add_argument("--device", default="cpu")
    p.add_argument("--cap-bytes", type=int, default=ARTIFACT_CAP_BYTES)
    p.add_argument(
        "--fallback",
        action="append",
        default=[],
        choices=sorted(FALLBACKS),
        help="run a record that needs this CUDA-only module with a PyTorch stand-in (recorded)",
    )
    p.add_argument("--json", action="store_true")
    p.add_argument("--json-out", help="also write the record to this file")
    p.set_defaults(func=cmd_verify_legacy)
