"""The scorer for a record of the reference challenge: `score_legacy(record_dir, artifact, data_dir)`.

The record's script is read as text here (scoring/worker/legacy_script.py); its code runs only in the
model worker's legacy build mode (scoring/worker/legacy.py), confined like any submission's. The
rest is the normal scorer's core (scoring/score/scorer.py score_core): the same workers, windows,
float64 loss and probes in fresh workers, one at a time. Two things differ, both the reference's:
bpb divides by the tokenizer's byte table (what the record's own eval_val counts), and the bytes are
the script file's as shipped (compressed, for a self-extracting one; with the file beside it that a stub
exec()s, whose code is the one scored) plus the artifact file's size.
The record is "pg-legacy-score". `pgolf verify-legacy` (harness/records/legacy.py) is its command.
"""

from __future__ import annotations

import re
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from data.io import read_json, sha256_file
from data.manifest import load_manifest
from data.tokenizer import load_tokenizer
from scoring.artifact.cap import ARTIFACT_CAP_BYTES
from scoring.score.evaluate import EvalConfig
from scoring.score.probes import ProbeConfig
from scoring.score.remote import WorkerConfig, WorkerFailure
from scoring.score.scorer import score_core, scoring_device
from scoring.worker.child import default_memory_limit_bytes
from scoring.worker.legacy import LegacyError
from scoring.worker.legacy_script import SCRIPT_NAME, read_record_script

LEGACY_SCORE_FORMAT = "pg-legacy-score"
LEGACY_SCORE_VERSION = 2
_EXC_LINE = re.compile(r"^([A-Za-z_][\w.]*(?:Error|Exception|Failure|Violation|Denied)): ")


def _compressor(artifact: Path) -> str:
    head = artifact.read_bytes()[:6]
    if head[:4] == b"\x28\xb5\x2f\xfd":
        return "zstd"
    if head[:6] == b"\xfd7zXZ\x00":
        return "lzma"
    return "zlib" if head[:1] == b"\x78" else "other (brotli or raw lzma)"


def _worker_error(e: WorkerFailure) -> LegacyError:
    """One clear message from the worker's report: its exception's own lines, not the traceback, printable."""
    lines = str(e).strip().splitlines()
    starts = [i for i, ln in enumerate(lines) if _EXC_LINE.match(ln)]
    text = " ".join(ln.strip() for ln in lines[starts[-1] :]) if starts else (lines or ["no message"])[-1]
    text = _EXC_LINE.sub(lambda m: f"{m.group(1).rsplit('.', 1)[-1]}: ", text, count=1)
    text = "".join(c if c.isprintable() else "?" for c in text)  # the record's own words: no terminal control
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
    rs = read_record_script(record_dir, script, hparams or {}, fallbacks)
    settings = rs.eval_settings
    cfg = cfg or EvalConfig(seq_len=settings["seq_len"], mode=settings["mode"], stride=settings["stride"])
    dev = scoring_device(device)
    manifest = load_manifest(data_dir)
    tokenizer = load_tokenizer(manifest.tokenizer_path)
    with tempfile.TemporaryDirectory(prefix="pgolf-legacy-") as tmp:
        run_script = rs.path
        if rs.packaging:  # the decoded source, for the worker to read
            run_script = Path(tmp) / SCRIPT_NAME
            run_script.write_text(rs.source, encoding="utf-8")
        wcfg = WorkerConfig(
            code_dir=run_script,
            artifact=artifact,
            device=device,
            dtype=cfg.dtype,
            threads=torch.get_num_threads(),
            vocab_size=tokenizer.byte_table().vocab_size,
            max_tokens_per_batch=cfg.batch_seqs * cfg.seq_len,
            sandbox=sandbox,
            protected=(data_dir, manifest.root),
            memory_limit_bytes=default_memory_limit_bytes() if dev.type == "cpu" else 0,
            legacy={
                "script": str(run_script),
                "gpt_kwargs": rs.gpt_kwargs,
                "gpt_call": rs.gpt_call,
                "gpt_locals": rs.gpt_locals,
                "fallbacks": list(fallbacks),
                "hyperparameters": {
                    k: v for k, v in rs.hyperparameters.items() if isinstance(v, int | float | str | bool)
                },
            },
        )
        try:
            core = score_core(
                wcfg, data_dir, manifest, tokenizer, cfg, dev, probe_cfg=probe_cfg, bytes_from="byte_table"
            )
        except WorkerFailure as e:
            raise _worker_error(e) from e
    res = core.result
    code_bytes = sum(rs.code_files.values())  # the files the scored code came from, as shipped
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
        "code_files": rs.code_files,
        "bytes_model": model_bytes,
        "cap_bytes": cap_bytes,
        "within_cap": code_bytes + model_bytes <= cap_bytes,
        "probes": core.probes,
        "tokenizer_audit": core.audit,
        "script": str(rs.path),
        "script_packaging": rs.packaging or ["plain"],
        "script_sha256": sha256_file(rs.path),
        "artifact_sha256": core.artifact_sha256,
        "artifact_compressor": _compressor(artifact),
        "artifact_loader": "in the model worker: decompress + torch.load(weights_only=True)",
        "worker": core.workers[0],
        "hyperparameters": rs.hyperparameters,
        "gpt_kwargs": rs.gpt_kwargs,
        "gpt_call_in_worker": rs.gpt_call,
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
