"""The result record (format "pg-result", version 1), the results ledger, and the human card.

A result joins the phases' records and adds a provenance receipt: sha256 of the counted code
files, the artifact, the data manifest and the tokenizer; library versions; hardware; git commit.
Its `verification` starts as "unverified"; only `pgolf verify` changes it.
"""

from __future__ import annotations

import fcntl
import json
import math
import os
import time
from pathlib import Path
from typing import Any

from data.io import sha256_file, write_json_atomic
from data.manifest import MANIFEST_NAME, Manifest
from data.shards import read_split
from data.tokenizer import load_tokenizer
from harness.api import API_VERSION
from harness.config import ResolvedConfig
from harness.records.provenance import git_commit, hardware, library_versions
from scoring.score.evaluate import unigram_bpb
from scoring.tracks import Track

RESULT_FORMAT = "pg-result"
RESULT_FORMAT_VERSION = 1


def _unigram(manifest: Manifest, score: dict[str, Any]) -> float | None:
    counts = manifest.raw.get("train_unigram_counts")
    if not counts:
        return None
    table = load_tokenizer(manifest.tokenizer_path).byte_table()
    tokens = read_split(manifest.root, "val")
    return unigram_bpb(counts, tokens, table, score["eval_seq_len"], score.get("eval_subset_max_tokens"))


def build_result(
    run_dir: Path,
    cfg: ResolvedConfig,
    meta: dict[str, Any],
    track: Track,
    phases: dict[str, Any],
    manifest: Manifest,
    *,
    status: str,
    pipeline_s: float,
) -> dict[str, Any]:
    train, pack, score = phases.get("train", {}), phases.get("pack", {}), phases.get("score", {})
    scored = status in ("ok", "over_eval_budget") and "val_bpb" in score
    result: dict[str, Any] = {
        "format": RESULT_FORMAT,
        "format_version": RESULT_FORMAT_VERSION,
        "api_version": API_VERSION,
        "status": status,
        "verification": "unverified",
        "submission": {
            k: meta.get(k)
            for k in ("name", "author", "github_id", "date", "track", "data_variant", "builds_on")
        },
        "track": track.name,
        "preset": cfg.preset,
        "seed": cfg.tables["run"]["seed"],
        "created_unix_s": time.time(),
        "run_dir": str(run_dir),
        # ---- the numbers ----
        "val_loss": score.get("val_loss") if scored else None,
        "val_bpb": score.get("val_bpb") if scored else None,
        "val_tokens": score.get("val_tokens"),
        "val_bytes": score.get("val_bytes"),
        "eval_mode": score.get("eval_mode"),
        "eval_dtype": score.get("eval_dtype"),
        "eval_time_s": score.get("eval_time_s"),
        "unigram_bpb": _unigram(manifest, score) if scored else None,
        "bytes_code": pack.get("bytes_code"),
        "bytes_model": pack.get("bytes_model"),
        "bytes_total": pack.get("bytes_total"),
        "cap_bytes": track.cap_bytes,
        "within_cap": pack.get("within_cap"),
        "train_time_s": train.get("train_time_s"),
        "steps": train.get("steps"),
        "tokens_seen": train.get("tokens_seen"),
        "train_shards_used": train.get("train_shards_used"),
        "world_size": train.get("world_size"),
        "phase_times_s": {
            "data": phases.get("data", {}).get("time_s"),
            "train_wall": train.get("wall_s"),
            "pack_encode": pack.get("encode_time_s"),
            "score_wall": score.get("score_wall_s"),
            "pipeline": pipeline_s,
        },
        "phases": phases,
        "config": cfg.tables,
        # ---- provenance receipt ----
        "provenance": {
            "code_files": pack.get("code_files"),
            "artifact_sha256": pack.get("artifact_sha256"),
            "data_manifest_sha256": sha256_file(manifest.root / MANIFEST_NAME),
            "tokenizer_sha256": sha256_file(manifest.tokenizer_path),
            "data_dir": str(manifest.root),
            "libraries": library_versions(),
            "hardware": hardware(),
            "harness_commit": git_commit(Path(__file__).resolve().parent),
        },
    }
    return result


def finite_json(value: Any) -> Any:
    """`value` with every non-finite float replaced by its name ("inf", "-inf", "nan"): valid strict JSON."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {str(k): finite_json(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [finite_json(v) for v in value]
    return value


def write_result(run_dir: Path, result: dict[str, Any], ledger: Path) -> None:
    """result.json, and one line appended to the ledger.

    The line goes out in a single write(2) under an exclusive lock, so concurrent runs never interleave
    and a process killed mid-append leaves either the whole line or none of it (a buffered text file
    may split a long line into several writes). Non-finite numbers are written as strings.
    """
    result = finite_json(result)
    write_json_atomic(run_dir / "result.json", result)
    ledger.parent.mkdir(parents=True, exist_ok=True)
    data = (json.dumps(result, sort_keys=True, allow_nan=False) + "\n").encode()
    fd = os.open(ledger, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        view = memoryview(data)
        while view:  # a regular file takes it whole; the loop only guards against a short write
            view = view[os.write(fd, view) :]
    finally:
        os.close(fd)  # releases the lock


def minimal_result(
    run_dir: Path, cfg: ResolvedConfig, meta: dict[str, Any], track: Track, *, status: str, detail: str
) -> dict[str, Any]:
    """A result when the full one cannot be built: the status, the detail, who and where."""
    return {
        "format": RESULT_FORMAT,
        "format_version": RESULT_FORMAT_VERSION,
        "api_version": API_VERSION,
        "status": status,
        "detail": detail,
        "verification": "unverified",
        "submission": {k: meta.get(k) for k in ("name", "author", "github_id", "date", "track")},
        "track": track.name,
        "preset": cfg.preset,
        "created_unix_s": time.time(),
        "run_dir": str(run_dir),
        "val_bpb": None,
        "val_loss": None,
    }


def _fmt(v: Any, spec: str) -> str:
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return "-"
    return format(v, spec)


def card(result: dict[str, Any]) -> str:
    r = result
    name = r["submission"].get("name") or "?"
    lines = [
        "",
        f"┌─ pgolf result: {name} ({r['track']}, preset {r['preset']}, seed {r['seed']})",
        f"│ status        {r['status']}  ({r['verification']})",
        f"│ val_bpb       {_fmt(r['val_bpb'], '.4f')} bits/byte   val_loss {_fmt(r['val_loss'], '.4f')} nats/token",
        f"│ unigram_bpb   {_fmt(r['unigram_bpb'], '.4f')} bits/byte (context: a unigram model of the training tokens)",
        f"│ scored        {_fmt(r['val_tokens'], ',')} tokens / {_fmt(r['val_bytes'], ',')} bytes, "
        f"{r['eval_mode'] or '-'} mode, {r['eval_dtype'] or '-'}, {_fmt(r['eval_time_s'], '.1f')} s",
        f"│ bytes_total   {_fmt(r['bytes_total'], ',')} = code {_fmt(r['bytes_code'], ',')} + model {_fmt(r['bytes_model'], ',')}"
        f"  (cap {r['cap_bytes']:,}, within_cap {r['within_cap']})",
        f"│ training      {_fmt(r['train_time_s'], '.1f')} s, {_fmt(r['steps'], ',')} steps, {_fmt(r['tokens_seen'], ',')} tokens,"
        f" {r['world_size'] or '-'} rank(s)",
        f"│ hardware      {r['provenance']['hardware']['cpu']}"
        + (
            f", {r['provenance']['hardware']['cuda_devices']}"
            if r["provenance"]["hardware"]["cuda_devices"]
            else ""
        ),
        f"└─ {r['run_dir']}/result.json",
    ]
    return "\n".join(lines)


def print_card(result: dict[str, Any]) -> None:
    if "phases" not in result:  # a minimal result (harness/records/result.py minimal_result)
        print(
            f"\n── pgolf result: {result['status']}: {result.get('detail', '')}\n└─ {result['run_dir']}/result.json",
            flush=True,
        )
        return
    print(card(result), flush=True)
