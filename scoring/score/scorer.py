"""Score an artifact: the fresh-process scorer behind `pgolf score` and the run's score phase.

It is given only the artifact, the submission's model code and a validation dataset folder.
Before any submission code is imported, it records its own tools for the guard and statically
checks the scored code (scoring/codecheck.py); it checks the code against the artifact's recorded
hashes (before importing a custom codec.py or model.py), decodes the artifact with its codec, builds
and loads the model (strict), and only then
reads the validation tokens; it runs the legality probes (scoring/score/probes.py; a
failure fails the score), audits the tokenizer's byte table on the scored documents when the
dataset's tokenizer is not a known official one (scoring/score/audit.py), and evaluates it
(scoring/score/evaluate.py), score-first with the folder's eval.py hook when there is one
(scoring/score/adapt.py; the probes run again after the last adaptation). The record (format
"pg-score", version 1) has val_loss, val_bpb, val_tokens, val_bytes, the mode, stride, dtype,
device and thread count, the probe, audit, adaptation and code-check records, and the hashes of
what was scored.
"""

from __future__ import annotations

import os
import platform
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from data.io import sha256_file
from data.manifest import MANIFEST_NAME, load_manifest
from data.shards import read_split
from data.tokenizer import Tokenizer, load_tokenizer
from scoring.artifact.format import artifact_codec, decode_state, read_artifact
from scoring.codecheck import require_clean_code, scored_files
from scoring.score.adapt import ScoreFirstAdapter, load_hook
from scoring.score.audit import KNOWN_TOKENIZER_SHA256, audit_token_stream
from scoring.score.bpb import METRIC_VERSION, metric_table
from scoring.score.confine import confine_scorer, private_workdir
from scoring.score.evaluate import EvalConfig, eval_tokens, evaluate, tune_cpu_allocator
from scoring.score.guard import ToolGuard, Watched
from scoring.score.loading import load_model
from scoring.score.probes import ProbeConfig, ProbeFailure, run_probes

SCORE_FORMAT = "pg-score"
SCORE_FORMAT_VERSION = 1


def scorer_tools() -> Watched:
    """The modules and classes the scorer computes with: the tool guard's watch list."""
    import builtins
    import math

    import torch.nn.functional as F

    from data import tokenizer
    from scoring.score import adapt, bpb, evaluate, probes

    torch.ops.aten._log_softmax  # noqa: B018 (materialize the lazily created op the loss uses)
    return [
        ("builtins", builtins),
        ("math", math),
        ("numpy", np),
        ("torch", torch),
        ("torch.Tensor", torch.Tensor),
        ("torch.nn.functional", F),
        ("torch.ops.aten", torch.ops.aten),
        ("scoring.score.evaluate", evaluate),
        ("scoring.score.bpb", bpb),
        ("scoring.score.probes", probes),
        ("scoring.score.adapt", adapt),
        ("data.tokenizer", tokenizer),
        ("BpbSums", bpb.BpbSums),
        ("ByteTable", tokenizer.ByteTable),
        ("LossWorkspace", evaluate.LossWorkspace),
        ("ScoreFirstAdapter", adapt.ScoreFirstAdapter),
    ]


def score_artifact(
    artifact_path: str | os.PathLike[str],
    submission_dir: str | os.PathLike[str],
    data_dir: str | os.PathLike[str],
    cfg: EvalConfig,
    device: str = "cpu",
    threads: int = 0,
    *,
    confine: bool = False,
    write_dirs: Iterable[str | os.PathLike[str]] = (),
    protect: Iterable[str | os.PathLike[str]] = (),
) -> dict[str, Any]:
    """Score one artifact (see the module docstring). With `confine`, the process restricts itself with
    Landlock before the first forward pass (scoring/score/confine.py: irreversible, so only for a process
    that scores once, as `pgolf score` does): reads outside the dataset (`data_dir` and `protect`),
    writes beneath `write_dirs` and a private temp folder only."""
    t_start = time.perf_counter()
    if threads:
        torch.set_num_threads(threads)
    dev = torch.device(device)
    allocator = tune_cpu_allocator() if dev.type == "cpu" else "torch caching allocator"
    guard = ToolGuard(scorer_tools())  # before any submission code is imported
    require_clean_code(submission_dir)
    workdir = private_workdir() if confine else None  # before the model is built: TMPDIR and compile caches
    artifact = read_artifact(artifact_path)
    state = decode_state(artifact, artifact_codec(artifact, submission_dir))
    model = load_model(artifact, state, submission_dir, dev)
    hook = load_hook(submission_dir)
    guard("while the model was built", full=True)
    manifest = load_manifest(data_dir)
    tokenizer = load_tokenizer(manifest.tokenizer_path)
    table = tokenizer.byte_table()
    tokens = read_split(data_dir, "val")
    tokenizer_sha256 = sha256_file(manifest.tokenizer_path)
    artifact_sha256, manifest_sha256 = sha256_file(artifact_path), sha256_file(Path(data_dir) / MANIFEST_NAME)
    confinement: dict[str, Any] = {
        "applied": False,
        "reason": "not asked (--no-confine, or scored in-process)",
    }
    if workdir is not None:  # everything is read: from here on, the dataset is out of reach
        confinement = confine_scorer(
            code_dir=Path(submission_dir),
            protected=[Path(data_dir), manifest.root, *map(Path, protect)],
            write_dirs=list(map(Path, write_dirs)),
            device=dev.type,
            workdir=workdir,
        )
    audit = tokenizer_audit(tokenizer, tokenizer_sha256, eval_tokens(tokens, cfg))
    probe_cfg = ProbeConfig(seq_len=cfg.seq_len, dtype=cfg.dtype)
    probes = run_probes(model, tokens, table.vocab_size, probe_cfg, dev, guard)
    guard(
        "during the probes", full=True
    )  # their own arithmetic (differences, maxima) runs between forward passes
    adapter = ScoreFirstAdapter(hook[0], hook[1]) if hook else None
    result = evaluate(model, tokens, table, cfg, dev, bos_id=tokenizer.bos_id, adapter=adapter, guard=guard)
    if adapter is not None:
        probes["after_adaptation"] = run_probes(model, tokens, table.vocab_size, probe_cfg, dev, guard)
    guard("by the end of scoring", full=True)
    sums = result.sums
    return {
        "format": SCORE_FORMAT,
        "format_version": SCORE_FORMAT_VERSION,
        "metric_version": METRIC_VERSION,
        "metrics": metric_table(),
        "val_loss": sums.val_loss,
        "val_bpb": sums.val_bpb,
        "byte_perplexity": sums.byte_perplexity,
        "val_loss_sum_nats": sums.loss_nats,
        "val_tokens": sums.tokens,
        "val_bytes": sums.bytes,
        "val_tokens_available": int(tokens.size),
        "eval_subset_max_tokens": cfg.max_tokens,
        "eval_mode": cfg.mode,
        "eval_dtype": cfg.dtype,
        "eval_seq_len": cfg.seq_len,
        "eval_stride": cfg.resolved_stride,
        "eval_batch_seqs": cfg.batch_seqs,
        "eval_windows": result.windows,
        "eval_time_s": result.eval_time_s,
        "probes": probes,
        "tokenizer_audit": audit,
        "adaptation": adapter.record(cfg.adapt_chunk_tokens) if adapter is not None else None,
        "code_check": {"static": "passed", "files": scored_files(submission_dir), **guard.record()},
        "confinement": confinement,
        "score_wall_s": time.perf_counter() - t_start,
        "device": dev.type,
        "device_name": torch.cuda.get_device_name(dev)
        if dev.type == "cuda"
        else platform.processor() or platform.machine(),
        "threads": torch.get_num_threads(),
        "allocator": allocator,
        "submission_files_seen": sorted(
            p.relative_to(submission_dir).as_posix() for p in Path(submission_dir).rglob("*") if p.is_file()
        ),
        "artifact_sha256": artifact_sha256,
        "codec": artifact.header["codec"],
        "data_manifest_sha256": manifest_sha256,
        "tokenizer_sha256": tokenizer_sha256,
        "torch": torch.__version__,
    }


def tokenizer_audit(tokenizer: Tokenizer, tokenizer_sha256: str, tokens: np.ndarray) -> dict[str, Any]:
    """Audit the byte table on the scored documents unless the tokenizer is a known official one.

    byte260's table is exact by construction (one byte per byte piece) and is not audited either.
    A failed audit fails the score (ProbeFailure, with the first mismatching document).
    """
    if tokenizer_sha256 in KNOWN_TOKENIZER_SHA256 or tokenizer.kind == "byte260":
        return {
            "ran": False,
            "reason": f"known tokenizer ({tokenizer.kind}, sha256 {tokenizer_sha256[:12]}…)",
        }
    report = audit_token_stream(tokenizer, tokens)
    if not report.passed:
        raise ProbeFailure(f"the dataset's tokenizer failed the byte-table audit:\n{report.summary()}")
    return {"ran": True, "reason": "tokenizer brought by the dataset/submission", **report.as_dict()}
