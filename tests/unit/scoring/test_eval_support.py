"""Helpers shared by the scorer's tests (submission folders, packed artifacts, run folders), and their own check.

    write_submission(folder, ...)     a tiny submission folder (model.py, train.py, config.toml, submission.json)
    make_run(run_dir, folder, data)   pack + score in-process + a pg-result record as harness/run/result.py writes it

The run folder has the files `pgolf verify` reads: artifact.pgolf, result.json, score.json,
pack.json and train_spec.json (naming the submission folder), and its result is appended to the ledger.
"""

from __future__ import annotations

import copy
import json
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from data.io import sha256_file, write_json_atomic
from data.manifest import MANIFEST_NAME, load_manifest
from harness.records.verify import append_ledger
from scoring.artifact.cap import ARTIFACT_CAP_BYTES
from scoring.artifact.pack import pack_state
from scoring.score.evaluate import EvalConfig
from scoring.score.remote import WorkerConfig
from scoring.score.scorer import score_artifact
from scoring.worker.loading import build_model

TINY_MODEL = '''"""A tiny causal model for scorer tests: each position mixes its embedding with the previous one."""
import torch
from torch import nn


class Tiny(nn.Module):
    def __init__(self, vocab_size, dim):
        super().__init__()
        self.emb = nn.Embedding(vocab_size, dim)
        self.mix = nn.Parameter(torch.full((dim,), 0.5))
        self.head = nn.Linear(dim, vocab_size, bias=False)

    def forward(self, ids):
        e = self.emb(ids)
        prev = torch.cat([torch.zeros_like(e[:, :1]), e[:, :-1]], dim=1)
        return self.head(torch.tanh(e + self.mix * prev))


def build_model(config):
    return Tiny(config.get("vocab_size", 260), config.get("dim", 16))
'''
TINY_CONFIG = {"vocab_size": 260, "dim": 16}
FAST_EVAL = EvalConfig(seq_len=32, batch_seqs=8, max_tokens=2048)


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """Scorer tests use one thread: the shared 2-core machines run other suites at the same time."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def write_submission(
    folder: Path,
    *,
    model_src: str = TINY_MODEL,
    eval_src: str | None = None,
    name: str = "tiny",
    date: str = "2026-11-01",
    builds_on: str | None = None,
    track: str = "smoke",
) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "model.py").write_text(model_src)
    (folder / "train.py").write_text(
        '"""Not run by these tests."""\n\n\ndef train(ctx):\n    raise NotImplementedError\n'
    )
    (folder / "config.toml").write_text("[model]\nvocab_size = 260\ndim = 16\n")
    meta = {
        "schema_version": 1,
        "name": name,
        "author": "tests",
        "github_id": "tests",
        "date": date,
        "track": track,
        "data_variant": "byte260",
        "blurb": "a scorer test entry",
    }
    if builds_on:
        meta["builds_on"] = builds_on
    (folder / "submission.json").write_text(json.dumps(meta))
    if eval_src is not None:
        (folder / "eval.py").write_text(eval_src)
    return folder


def tiny_worker_config(folder: Path, artifact: Path, **kw: Any) -> WorkerConfig:
    """A model worker for a pack_tiny artifact: one thread, TINY_CONFIG's vocabulary, batches of up to 4 x 32."""
    return WorkerConfig(
        code_dir=folder,
        artifact=artifact,
        threads=1,
        vocab_size=TINY_CONFIG["vocab_size"],
        max_tokens_per_batch=4 * 32,
        **kw,
    )


def pack_tiny(folder: Path, out: Path, seed: int = 0, model_config: dict | None = None) -> dict[str, Any]:
    config = dict(model_config or TINY_CONFIG)
    torch.manual_seed(seed)
    model = build_model(folder, config)
    return pack_state(
        model.state_dict(),
        folder,
        out,
        codec_name="int8_zlib",
        model_config=config,
        cap_bytes=ARTIFACT_CAP_BYTES,
    )


_SCORES: dict[tuple[str, ...], dict[str, Any]] = {}
"""make_run's scores in this test process, by what decides them: the suite's verify tests each start from
the same packed entry, and a sealed score takes 10-20 s on 2 cores. Whatever a test then checks (verify's
re-score, the probes) still runs for real."""


def _score_once(artifact: Path, folder: Path, data_dir: Path, cfg: EvalConfig) -> dict[str, Any]:
    code = sorted((f.name, sha256_file(f)) for f in folder.iterdir() if f.is_file())
    key = (sha256_file(artifact), repr(code), str(Path(data_dir).resolve()), repr(cfg))
    if key not in _SCORES:
        _SCORES[key] = score_artifact(artifact, folder, data_dir, cfg, threads=1)
    return copy.deepcopy(_SCORES[key])


def make_run(
    run_dir: Path,
    folder: Path,
    data_dir: Path,
    *,
    seed: int = 0,
    cfg: EvalConfig = FAST_EVAL,
    ledger: Path | None = None,
    track: str = "smoke",
) -> dict[str, Any]:
    """A run folder as the pipeline leaves it (training replaced by a seeded random init)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    artifact = run_dir / "artifact.pgolf"
    pack = pack_tiny(folder, artifact, seed)
    write_json_atomic(run_dir / "pack.json", pack)
    score = _score_once(artifact, folder, data_dir, cfg)
    write_json_atomic(run_dir / "score.json", score)
    write_json_atomic(run_dir / "train_spec.json", {"submission_dir": str(folder)})
    meta = json.loads((folder / "submission.json").read_text())
    manifest = load_manifest(data_dir)
    result = {
        "format": "pg-result",
        "format_version": 1,
        "status": "ok",
        "verification": "unverified",
        "submission": {
            k: meta.get(k)
            for k in ("name", "author", "github_id", "date", "track", "data_variant", "builds_on")
        },
        "track": track,
        "preset": "tiny",
        "seed": seed,
        "created_unix_s": time.time(),
        "run_dir": str(run_dir),
        "val_loss": score["val_loss"],
        "val_bpb": score["val_bpb"],
        "val_tokens": score["val_tokens"],
        "val_bytes": score["val_bytes"],
        "eval_mode": score["eval_mode"],
        "eval_dtype": score["eval_dtype"],
        "eval_time_s": score["eval_time_s"],
        "bytes_code": pack["bytes_code"],
        "bytes_model": pack["bytes_model"],
        "bytes_total": pack["bytes_total"],
        "cap_bytes": pack["cap_bytes"],
        "within_cap": pack["within_cap"],
        "phases": {"pack": pack, "score": score},
        "config": {"eval": {"batch_seqs": cfg.batch_seqs}},
        "provenance": {
            "code_files": pack["code_files"],
            "artifact_sha256": pack["artifact_sha256"],
            "data_manifest_sha256": sha256_file(Path(data_dir) / MANIFEST_NAME),
            "tokenizer_sha256": sha256_file(manifest.tokenizer_path),
            "data_dir": str(data_dir),
        },
    }
    write_json_atomic(run_dir / "result.json", result)
    if ledger is not None:
        append_ledger(ledger, result)
    return result


@pytest.mark.long
def test_make_run_writes_a_scored_consistent_result(tmp_path, tiny_dataset):
    folder = write_submission(tmp_path / "sub")
    res = make_run(tmp_path / "runs" / "r0", folder, tiny_dataset)
    assert (
        res["bytes_total"] == res["bytes_code"] + (tmp_path / "runs" / "r0" / "artifact.pgolf").stat().st_size
    )
    score = res["phases"]["score"]
    assert score["probes"]["passed"] is True
    assert score["tokenizer_audit"]["ran"] is False  # byte260 is exact by construction
    assert score["adaptation"] is None
    assert res["val_tokens"] == 2048 and 3.0 < res["val_bpb"] < 12.0
