"""`pgolf bench score` end to end on a tiny shape: the plain loop and the real scorer (model worker,
shared memory, probes in fresh workers) score the same tokens to the same loss, the record's headline
is the median of the rounds' ratios, and the figures are printed (speed itself is not asserted:
figures belong to the bench, not to timed tests)."""

from __future__ import annotations

import json
import statistics

import numpy as np
import pytest

from data.shards import read_split
from harness.bench import score as bench
from harness.bench.score import DEFAULT_SUBMISSION

TINY = {"num_layers": 1, "model_dim": 32, "num_heads": 2, "num_kv_heads": 1}


@pytest.mark.long  # a benchmark's whole run
def test_bench_score_runs_the_plain_loop_and_the_scorer_on_the_same_tokens(tiny_dataset, monkeypatch, capsys):
    from harness.cli import main

    records = []
    real = bench.run_bench
    monkeypatch.setattr(bench, "run_bench", lambda *a, **k: records.append(real(*a, **k)) or records[-1])
    shape = [
        "--model-config",
        json.dumps(TINY),
        "--seq-len",
        "64",
        "--batch-seqs",
        "4",
        "--max-tokens",
        "1000",
    ]
    runs = ["--repeats", "1", "--rounds", "1", "--threads", "1", "--probes", "1", "--profile"]
    assert main(["bench", "score", "--data", str(tiny_dataset), *shape, *runs]) == 0
    out = capsys.readouterr().out
    (rec,) = records

    assert rec["format"] == "pg-bench-score" and rec["format_version"] == 3
    val = read_split(tiny_dataset, "val")
    assert (
        rec["tokens"] == (min(val.size, 1_001) - 1) // 64 * 64
    )  # standard windows of the first 1,000 targets
    assert np.isclose(rec["val_loss_scorer"], rec["val_loss_plain"], rtol=1e-6, atol=0)
    assert rec["round_leads"] == ["plain"] and rec["threads"] == 1
    assert len(rec["round_ratios"]) == 1 and rec["ratio"] == statistics.median(rec["round_ratios"])
    assert rec["best_ratio"] == rec["plain_s"] / rec["scorer_s"]
    assert all(len(p) == 2 for p in rec["plain_passes_s"] + rec["scorer_passes_s"])  # warm-up + 1 timed
    assert rec["cold_eval_s"] == [p[0] for p in rec["scorer_passes_s"]]
    assert rec["probes"] == 1 and all(s > 0 for s in rec["probes_s"])
    assert rec["probe_shares"] == [p / e for p, e in zip(rec["probes_s"], rec["cold_eval_s"], strict=True)]
    assert rec["sandbox"].startswith("auto")
    assert rec["profile"]["batches"] > 0 and rec["profile"]["ms"]["round_trip"] > 0

    assert out.startswith("bench score: ") and f"{rec['tokens']:,} tokens" in out
    figures = (
        "plain loop",
        "scorer",
        "ratio scorer/plain",
        "median of 1 rounds",
        "probes (1 fresh worker(s))",
    )
    assert all(f in out for f in figures), out
    assert "share" in out and "per batch (median of" in out


def test_bench_default_shape_is_the_cpu_track_preset():
    import tomllib

    from harness.bench.score import DEFAULT_BATCH_SEQS, DEFAULT_MODEL_CONFIG, DEFAULT_SEQ_LEN
    from scoring.score.probes import ProbeConfig

    preset = tomllib.loads((DEFAULT_SUBMISSION / "config.toml").read_text())["presets"]["cpu"]
    assert preset["model"] == DEFAULT_MODEL_CONFIG
    assert (preset["eval"]["seq_len"], preset["eval"]["batch_seqs"]) == (DEFAULT_SEQ_LEN, DEFAULT_BATCH_SEQS)
    assert bench.DEFAULT_PROBES == ProbeConfig().probes  # the bench probes as a score does


def test_an_entrys_model_is_not_run_unconfined_without_the_officials_word(tmp_path, tiny_dataset, capsys):
    """The bench builds the model in its own process (to pack it) and in a plain one beside the validation tokens:
    an entry's model.py ran there with the official's environment and files. A folder outside the project's
    baselines now needs --trust-submission; without it the command refuses before any of its code runs."""
    import shutil

    from harness.cli import main

    sentinel = tmp_path / "ran"
    entry = tmp_path / "entry"
    shutil.copytree(DEFAULT_SUBMISSION, entry)
    model = entry / "model.py"
    model.write_text(f"open({str(sentinel)!r}, 'w').write('ran')\n" + model.read_text(), encoding="utf-8")
    args = ["bench", "score", "--submission", str(entry), "--data", str(tiny_dataset), "--rounds", "1"]
    assert main([*args, "--model-config", json.dumps(TINY), "--repeats", "1", "--max-tokens", "500"]) == 2
    assert not sentinel.exists()
    err = capsys.readouterr().err
    assert "--trust-submission" in err and str(entry) in err and len(err.strip().splitlines()) == 1
