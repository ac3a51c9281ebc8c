"""`pgolf bench score` end to end on a tiny dataset: both loops score the same tokens to the same loss,
and the record's headline is the median of the rounds' paired ratios (speed itself is not asserted:
figures belong to the bench, not to timed tests)."""

from __future__ import annotations

import statistics

import numpy as np

from data.shards import read_split
from harness.bench.score import DEFAULT_SUBMISSION, run_bench


def test_bench_score_runs_both_loops_on_the_same_tokens(tiny_dataset):
    rec = run_bench(
        DEFAULT_SUBMISSION,
        {"num_layers": 1, "model_dim": 32, "num_heads": 2, "num_kv_heads": 1},
        tiny_dataset,
        seq_len=64,
        batch_seqs=4,
        max_tokens=1_000,
        repeats=1,
        rounds=3,
        device="cpu",
        threads=1,
    )
    assert rec["format"] == "pg-bench-score" and rec["format_version"] == 2
    val = read_split(tiny_dataset, "val")
    assert (
        rec["tokens"] == (min(val.size, 1_001) - 1) // 64 * 64
    )  # standard windows of the first 1,000 targets
    assert np.isclose(rec["val_loss_scorer"], rec["val_loss_plain"], rtol=1e-6, atol=0)
    assert len(rec["round_ratios"]) == 3 and rec["ratio"] == statistics.median(rec["round_ratios"])
    assert rec["best_ratio"] == rec["plain_s"] / rec["scorer_s"] and rec["threads"] == 1
    assert rec["scorer_tokens_per_s"] > 0 and rec["probes_s"] > 0


def test_bench_default_shape_is_the_cpu_track_preset():
    import tomllib

    from harness.bench.score import DEFAULT_BATCH_SEQS, DEFAULT_MODEL_CONFIG, DEFAULT_SEQ_LEN

    preset = tomllib.loads((DEFAULT_SUBMISSION / "config.toml").read_text())["presets"]["cpu"]
    assert preset["model"] == DEFAULT_MODEL_CONFIG
    assert (preset["eval"]["seq_len"], preset["eval"]["batch_seqs"]) == (DEFAULT_SEQ_LEN, DEFAULT_BATCH_SEQS)
