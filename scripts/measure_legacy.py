"""`pgolf verify-legacy` against each reference record's own evaluation, at a small shape, on CPU.

    python scripts/measure_legacy.py --repo /path/to/parameter-golf[.git] \\
        --docs ../shared/data/fineweb/sample.jsonl --tokenizer ../shared/data/tokenizers/fineweb_1024_bpe.model \\
        --record 2026-03-17_NaiveBaseline --record 2026-03-20_10L_Int5MLP_MuonWD04_SWA50 \\
        [--out DIR] [--max-tokens 3072] [--json PATH] [--markdown PATH]

For each record of `records/track_10min_16mb` (read from the repository with `git show`, a bare git
folder or a checkout; nothing of it is copied into this project):

1. the record's script is read as verify-legacy reads it (scoring/worker/legacy_script.py); a script
   this machine cannot run is a "refused" row with verify-legacy's own one-line reason;
2. its model is built in THIS process (the driver, which holds no secret: it runs the record's
   module's top level, never main(); verify-legacy's worker runs its definitions only) at the
   small shape SMALL_SHAPE (2 layers, model dim 256, 4 heads / 2 KV heads, MLP 3x, vocab 1024, seq 128),
   random weights from seed 0, every all-zero matrix (the records' zero-init projections) drawn
   N(0, 0.02) in parameter order, so that tensors above the keep-float limits are really quantized;
3. the artifact is written with the record's own quantizer and compressor calls, as its main() makes
   them (WRITERS: int8_clean_per_row_v1 + zlib-9; int6 mixed {w, m} with the categories and the
   compressor main() names); the records' banked, GPTQ (Hessian) and byte-shuffle layouts are not
   written by this driver (a "not measured" row);
4. the record's own decompress + dequantize and its own `eval_val` run in float32 on the first
   --max-tokens validation tokens (its autocast asks for CUDA: on CPU it does nothing);
5. `pgolf verify-legacy --mode standard --max-tokens N --hparam ...` (with `--fallback
   flash_attn_interface` where the script imports it; the driver installs the same stand-in) scores
   the same artifact on the same tokens, in its own process.

The dataset is built once with `pgolf data build` (the first 4 documents of --docs are validation).
Each row: the layout, how many tensors were quantized, the result, both bpb and their difference.
"""

from __future__ import annotations

import argparse
import ast
import inspect
import io
import json
import lzma
import math
import os
import re
import subprocess
import sys
import tempfile
import types
import zlib
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

from data.shards import read_split  # noqa: E402
from scoring.worker.legacy import LegacyError, gpt_arguments, install_fallbacks  # noqa: E402
from scoring.worker.legacy_script import RecordScript, read_record_script  # noqa: E402

TRACK = "records/track_10min_16mb"
SMALL_SHAPE = {
    "NUM_LAYERS": "2",
    "MODEL_DIM": "256",
    "NUM_HEADS": "4",
    "NUM_KV_HEADS": "2",
    "MLP_MULT": "3",
    "VOCAB_SIZE": "1024",
    "TRAIN_SEQ_LEN": "128",
    "EVAL_SEQ_LEN": "128",
    "VAL_BATCH_SIZE": "8192",
}
"""The shape every record is built at (environment names; a record reads those it defines). VAL_BATCH_SIZE
is the record's eval_val's: 8 sequences of 128 a batch over its 8 micro-batches per step (float32 sums of
a batch's mean loss differ in the 8th digit with the batch: all 24 sequences in one gave 3.99895277 for
2026-03-17_NaiveBaseline, 4 to 16 a batch 3.99895359)."""
VAL_DOCS = 4
SEED = 0
ZERO_INIT_STD = 0.02
MEASUREMENT_VERSION = 1


@dataclass
class Row:
    record: str
    layout: str = ""
    quantized_tensors: int | None = None
    result: str = ""
    bpb_verify_legacy: float | None = None
    bpb_record_eval_val: float | None = None
    delta: float | None = None
    artifact_bytes: int | None = None

    def markdown(self) -> str:
        def num(x: float | None, fmt: str) -> str:
            return "" if x is None else format(x, fmt)

        cells = [
            self.record,
            self.layout,
            "" if self.quantized_tensors is None else str(self.quantized_tensors),
            self.result,
            num(self.bpb_verify_legacy, ".8f"),
            num(self.bpb_record_eval_val, ".8f"),
            num(self.delta, "+.1e"),
        ]
        return "| " + " | ".join(cells) + " |"


# ---- The reference repository, read with git ----


def git(repo: Path, *args: str) -> bytes:
    flag = "--git-dir" if (repo / "HEAD").is_file() and not (repo / ".git").exists() else "-C"
    return subprocess.run(["git", flag, str(repo), *args], capture_output=True, check=True).stdout


def extract_record(repo: Path, name: str, out: Path) -> Path:
    """The record's folder, file by file, from the repository's HEAD (into `out`, outside this project)."""
    prefix = f"{TRACK}/{name}/"
    files = git(repo, "ls-tree", "-r", "--name-only", "HEAD", prefix).decode().splitlines()
    if not files:
        raise SystemExit(f"--record {name}: no folder {prefix} at the repository's HEAD")
    folder = out / "records" / name
    for f in files:
        dest = folder / f[len(prefix) :]
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_bytes(git(repo, "show", f"HEAD:{f}"))
    return folder


# ---- The record's own model, quantizer and compressor ----


def main_source(source: str) -> str:
    tree = ast.parse(source)
    fn = next((n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "main"), None)
    return ast.get_source_segment(source, fn) or "" if fn is not None else ""


def compressor_of(main_src: str) -> tuple[str, Callable[[bytes], bytes], Callable[[bytes], bytes]]:
    """The compressor main() writes the artifact with: (label, compress, decompress)."""
    if m := re.search(r"ZstdCompressor\(level=(\d+)\)", main_src):
        import zstandard

        level = int(m.group(1))
        return (
            f"zstd-{level}",
            zstandard.ZstdCompressor(level=level).compress,
            zstandard.ZstdDecompressor().decompress,
        )
    if m := re.search(r"lzma\.compress\([^)]*preset=(\d+)", main_src):
        preset = int(m.group(1))
        return f"lzma-{preset}", lambda b: lzma.compress(b, preset=preset), lzma.decompress
    return "zlib-9", lambda b: zlib.compress(b, 9), zlib.decompress


def _saved(obj: Any) -> bytes:
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


def _loaded(raw: bytes) -> Any:
    return torch.load(io.BytesIO(raw), map_location="cpu")


def write_int8(ns: dict[str, Any], state: dict[str, torch.Tensor], main_src: str) -> tuple[str, int, bytes]:
    obj, _ = ns["quantize_state_dict_int8"](state)
    return "int8_clean_per_row_v1 + zlib-9", len(obj["quantized"]), zlib.compress(_saved(obj), level=9)


def read_int8(ns: dict[str, Any], blob: bytes, template: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    result: dict[str, torch.Tensor] = ns["dequantize_state_dict_int8"](_loaded(zlib.decompress(blob)))
    return result


def _int6_categories(main_src: str) -> set[str]:
    m = re.search(r"mixed_quantize_int6\(\s*\w+\s*,\s*(\{[^}]*\})", main_src)
    if m is None:
        raise LegacyError("main() calls mixed_quantize_int6 with categories this driver cannot read")
    cats: set[str] = ast.literal_eval(m.group(1))
    return cats


def write_int6(ns: dict[str, Any], state: dict[str, torch.Tensor], main_src: str) -> tuple[str, int, bytes]:
    cats = _int6_categories(main_src)
    result, meta = ns["mixed_quantize_int6"](state, cats)
    label, compress, _ = compressor_of(main_src)
    n = sum(isinstance(v, dict) for v in meta.values())
    return f"int6 mixed {{w,m}} {sorted(cats)} + {label}", n, compress(_saved({"w": result, "m": meta}))


WRITERS: dict[str, Callable[[dict[str, Any], dict[str, torch.Tensor], str], tuple[str, int, bytes]]] = {
    "quantize_state_dict_int8": write_int8,
    "mixed_quantize_int6": write_int6,
}
"""The record's own quantizer (by the name main() calls) -> the writer that uses it as main() does."""
UNSUPPORTED = ("_rebank_state_dict", "gptq_mixed_quantize_int6", "gptq_mixed_quantize", "collect_hessians")
"""Definitions that mark a layout this driver does not write (banked weights, GPTQ with Hessians)."""


def small_model(ns: dict[str, Any], rs: RecordScript) -> torch.nn.Module:
    """The record's GPT at the small shape: seed 0, then every all-zero matrix drawn N(0, 0.02)."""
    spec = {
        "gpt_kwargs": rs.gpt_kwargs,
        "gpt_call": rs.gpt_call,
        "gpt_locals": rs.gpt_locals,
        "hyperparameters": {
            k: v for k, v in rs.hyperparameters.items() if isinstance(v, int | float | str | bool)
        },
    }
    torch.manual_seed(SEED)
    model: torch.nn.Module = ns["GPT"](**gpt_arguments(spec, ns))
    with torch.no_grad():
        for p in model.parameters():
            if p.ndim >= 2 and p.is_floating_point() and not p.any():
                p.normal_(0.0, ZERO_INIT_STD)
    return model.float()


def record_eval_val(
    ns: dict[str, Any], rs: RecordScript, model: torch.nn.Module, val: torch.Tensor, tokenizer: Path
) -> float:
    """The record's own eval_val (one rank, its 8 micro-batches per step), float32 on CPU; its bpb."""
    import sentencepiece as spm

    sp = spm.SentencePieceProcessor(model_file=str(tokenizer))
    vocab = int(rs.hyperparameters["vocab_size"])
    base, space, boundary = ns["build_sentencepiece_luts"](sp, vocab, torch.device("cpu"))
    given = {
        "args": types.SimpleNamespace(**rs.hyperparameters),
        "model": model,
        "rank": 0,
        "world_size": 1,
        "device": torch.device("cpu"),
        "grad_accum_steps": 8,
        "val_tokens": val,
        "base_bytes_lut": base,
        "has_leading_space_lut": space,
        "is_boundary_token_lut": boundary,
    }
    params = inspect.signature(ns["eval_val"]).parameters
    missing = [p for p, v in params.items() if p not in given and v.default is inspect.Parameter.empty]
    if missing:
        raise LegacyError(f"the record's eval_val takes {missing}, which this driver does not know")
    _, bpb = ns["eval_val"](**{p: given[p] for p in params if p in given})
    return float(bpb)


def record_module(script: Path) -> dict[str, Any]:
    """The record's module as its own run has it, main() not called: its top level runs here (module-level
    settings such as the quantizer's keep-float patterns are computed there), with SMALL_SHAPE in the
    environment. The driver's process holds no secret; the scorer never does this (verify-legacy's worker
    runs definitions only: scoring/worker/legacy.py)."""
    os.environ.update(SMALL_SHAPE)
    ns: dict[str, Any] = {"__name__": "pgolf_measured_record", "__file__": str(script)}
    exec(compile(script.read_text(encoding="utf-8"), str(script), "exec"), ns)  # noqa: S102 - the record's own code
    return ns


# ---- One record ----


def verify_legacy(
    record: Path, artifact: Path, data: Path, max_tokens: int, fallbacks: list[str]
) -> dict[str, Any]:
    argv = [sys.executable, "-m", "harness.cli", "verify-legacy", str(record), "--artifact", str(artifact)]
    argv += ["--data", str(data), "--mode", "standard", "--max-tokens", str(max_tokens), "--json"]
    for k, v in SMALL_SHAPE.items():
        argv += ["--hparam", f"{k}={v}"]
    for f in fallbacks:
        argv += ["--fallback", f]
    proc = subprocess.run(argv, capture_output=True, text=True, cwd=REPO_ROOT, check=False)
    if proc.returncode != 0:
        lines = (proc.stderr or proc.stdout).strip().splitlines()
        return {"refused": lines[-1] if lines else f"exit status {proc.returncode}"}
    rec: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return rec


def measure_record(repo: Path, name: str, data: Path, tokenizer: Path, out: Path, max_tokens: int) -> Row:
    row = Row(record=name)
    folder = extract_record(repo, name, out)
    try:
        rs = read_record_script(folder, None, dict(SMALL_SHAPE), ("flash_attn_interface",))
    except LegacyError as e:
        row.result = f"refused: {str(e).split(': ', 1)[-1]}"
        return row
    fallbacks = ["flash_attn_interface"] if "flash_attn_interface" in rs.source else []
    install_fallbacks(fallbacks)
    decoded = out / "decoded" / name / "train_gpt.py"
    decoded.parent.mkdir(parents=True, exist_ok=True)
    decoded.write_text(rs.source, encoding="utf-8")
    ns = record_module(decoded)
    main_src = main_source(rs.source)
    if any(n in ns for n in UNSUPPORTED):
        row.result = "not measured: a banked or GPTQ layout, which this driver does not write"
        return row
    quantizer = next((q for q in WRITERS if f"{q}(" in main_src), None)
    if quantizer is None:
        row.result = "not measured: main() calls no quantizer this driver knows"
        return row
    model = small_model(ns, rs)
    state = {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}
    row.layout, row.quantized_tensors, blob = WRITERS[quantizer](ns, state, main_src)
    artifact = out / "artifacts" / f"{name}.ptz"
    artifact.parent.mkdir(parents=True, exist_ok=True)
    artifact.write_bytes(blob)
    row.artifact_bytes = len(blob)
    # the record's own decompress + dequantize, into a fresh model of the same shape
    if quantizer == "quantize_state_dict_int8":
        restored = read_int8(ns, blob, state)
    else:
        w_m = _loaded(compressor_of(main_src)[2](blob))
        restored = ns["dequantize_mixed_int6"](w_m["w"], w_m["m"], state)
    own = small_model(ns, rs)
    own.load_state_dict(restored, strict=True)
    val = torch.from_numpy(read_split(data, "val")[: max_tokens + 1].astype(np.int64))
    row.bpb_record_eval_val = record_eval_val(ns, rs, own.eval(), val, tokenizer)
    rec = verify_legacy(folder, artifact, data, max_tokens, fallbacks)
    if "refused" in rec:
        row.result = f"verify-legacy failed: {rec['refused']}"
        return row
    row.bpb_verify_legacy = float(rec["val_bpb"])
    row.result = "loads, probes pass" if rec["probes"].get("passed") else "loads, probes FAILED"
    row.delta = row.bpb_verify_legacy - row.bpb_record_eval_val
    return row


def build_data(docs: Path, tokenizer: Path, out: Path, max_docs: int) -> Path:
    data = out / "data"
    if not (data / "manifest.json").is_file():
        argv = [sys.executable, "-m", "harness.cli", "data", "build", "--docs", str(docs)]
        argv += ["--tokenizer", str(tokenizer), "--val-docs", str(VAL_DOCS), "--max-docs", str(max_docs)]
        argv += ["--out", str(data), "--workers", "1"]
        subprocess.run(argv, check=True, cwd=REPO_ROOT)
    return data


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repo", type=Path, required=True, help="the reference repository (bare or checkout)")
    ap.add_argument(
        "--docs", type=Path, required=True, help="a .jsonl of documents (the first 4: validation)"
    )
    ap.add_argument("--tokenizer", type=Path, required=True, help="the official sp1024 .model")
    ap.add_argument("--record", action="append", required=True, help="a record folder's name (repeatable)")
    ap.add_argument("--max-tokens", type=int, default=3072)
    ap.add_argument(
        "--max-docs", type=int, default=64, help="documents in the dataset (training ones unused)"
    )
    ap.add_argument("--out", type=Path, help="working folder (default: a fresh temp folder)")
    ap.add_argument("--json", type=Path, help="write the rows here (format pg-legacy-measurements)")
    ap.add_argument("--markdown", type=Path, help="write the table here")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    out = args.out or Path(tempfile.mkdtemp(prefix="pgolf-measure-legacy-"))
    data = build_data(args.docs, args.tokenizer, out, args.max_docs)
    rows = []
    for name in args.record:
        row = measure_record(args.repo, name, data, args.tokenizer, out, args.max_tokens)
        print(row.markdown(), flush=True)
        rows.append(row)
    header = (
        "| record | layout (the record's own serializer) | quantized tensors | result "
        "| bpb verify-legacy | bpb record's own eval_val | delta |\n| --- | --- | --- | --- | --- | --- | --- |"
    )
    table = header + "\n" + "\n".join(r.markdown() for r in rows) + "\n"
    if args.markdown:
        args.markdown.write_text(table, encoding="utf-8")
    if args.json:
        doc = {
            "format": "pg-legacy-measurements",
            "format_version": MEASUREMENT_VERSION,
            "shape": SMALL_SHAPE,
            "seed": SEED,
            "max_tokens": args.max_tokens,
            "torch": torch.__version__,
            "rows": [asdict(r) for r in rows],
        }
        args.json.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    bad = [r for r in rows if r.delta is not None and not math.isfinite(r.delta)]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
