"""Score an artifact: the fresh-process scorer behind `pgolf score` and the run's score phase.

It is given only the artifact, the submission's model code and a validation dataset folder.
It reads the artifact, decodes it with its codec, checks the code against the artifact's recorded
hashes, builds and loads the model (strict), and evaluates it (scoring/evaluate.py). The record
(format "pg-score", version 1) has val_loss, val_bpb, val_tokens, val_bytes, the mode, dtype,
device and thread count, and the hashes of what was scored.
"""

from __future__ import annotations

import os
import platform
import time
from pathlib import Path
from typing import Any

import torch

from data.io import sha256_file
from data.manifest import MANIFEST_NAME, load_manifest
from data.shards import read_split
from data.tokenizer import load_tokenizer
from scoring.artifact import decode_state, read_artifact
from scoring.bpb import METRIC_VERSION, metric_table
from scoring.codecs import CODECS, get_codec
from scoring.evaluate import EvalConfig, evaluate
from scoring.loading import load_model

SCORE_FORMAT = "pg-score"
SCORE_FORMAT_VERSION = 1


def score_artifact(
    artifact_path: str | os.PathLike[str],
    submission_dir: str | os.PathLike[str],
    data_dir: str | os.PathLike[str],
    cfg: EvalConfig,
    device: str = "cpu",
    threads: int = 0,
) -> dict[str, Any]:
    t_start = time.perf_counter()
    if threads:
        torch.set_num_threads(threads)
    dev = torch.device(device)
    manifest = load_manifest(data_dir)
    tokenizer = load_tokenizer(manifest.tokenizer_path)
    table = tokenizer.byte_table()
    tokens = read_split(data_dir, "val")
    artifact = read_artifact(artifact_path)
    codec_name = artifact.codec_name if artifact.codec_name in CODECS else "submission"
    state = decode_state(artifact, get_codec(codec_name, submission_dir))
    model = load_model(artifact, state, submission_dir, dev)
    result = evaluate(model, tokens, table, cfg, dev)
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
        "eval_windows": result.windows,
        "eval_time_s": result.eval_time_s,
        "score_wall_s": time.perf_counter() - t_start,
        "device": dev.type,
        "device_name": torch.cuda.get_device_name(dev) if dev.type == "cuda" else platform.processor() or platform.machine(),
        "threads": torch.get_num_threads(),
        "submission_files_seen": sorted(p.relative_to(submission_dir).as_posix() for p in Path(submission_dir).rglob("*") if p.is_file()),
        "artifact_sha256": sha256_file(artifact_path),
        "codec": artifact.header["codec"],
        "data_manifest_sha256": sha256_file(Path(data_dir) / MANIFEST_NAME),
        "tokenizer_sha256": sha256_file(manifest.tokenizer_path),
        "torch": torch.__version__,
    }
