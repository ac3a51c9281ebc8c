"""The typed records (pg-pack, pg-score, pg-train, pg-result): round trips, and refusals naming the field."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
import torch

from harness.run.result import ResultRecord
from harness.train.rank import RankReport
from scoring.artifact.pack import PackRecord, pack_state
from scoring.score.record import ScoreFailure, ScoreRecord, read_score_record


def pack_json() -> dict[str, Any]:
    return PackRecord(
        codec={"name": "int8_zlib", "version": 1},
        artifact="/tmp/a.pgolf",
        artifact_sha256="ab" * 32,
        code_files={"model.py": "cd" * 32},
        encode_time_s=0.25,
        num_tensors=2,
        num_params=10,
        bytes_code=100,
        bytes_model=900,
        bytes_total=1000,
        cap_bytes=16_000_000,
        within_cap=True,
    ).to_json()


def score_json() -> dict[str, Any]:
    return ScoreRecord(
        metric_version=1,
        metrics={"val_bpb": {"unit": "bits/byte"}},
        val_loss=2.5,
        val_bpb=1.25,
        byte_perplexity=2.4,
        val_loss_sum_nats=250.0,
        val_tokens=100,
        val_bytes=200,
        val_tokens_available=1000,
        eval_subset_max_tokens=None,
        eval_mode="standard",
        eval_dtype="float32",
        eval_seq_len=64,
        eval_stride=None,
        eval_batch_seqs=4,
        eval_windows=2,
        eval_batches=1,
        eval_time_s=0.5,
        eval_budget_s=None,
        probes={"passed": True},
        rows_shuffled=True,
        tokenizer_audit={"ok": True},
        adaptation=None,
        code_check={"static": "passed"},
        workers=[{"role": "main"}],
        worker_forwards=3,
        enforcement={"rule": "layer"},
        confinement={"applied": False},
        score_wall_s=1.5,
        device="cpu",
        device_name="x86_64",
        threads=2,
        allocator="glibc",
        submission_files_seen=["model.py"],
        artifact_sha256="ab" * 32,
        codec={"name": "int8_zlib", "version": 1},
        data_manifest_sha256="ef" * 32,
        tokenizer_sha256="01" * 32,
        torch="2.0",
    ).to_json()


def rank_json() -> dict[str, Any]:
    return RankReport(
        api_version=1,
        role="main",
        status="ok",
        rank_reported_train_s=1.5,
        rank_reported_off_clock_s=0.1,
        rank_reported_warmup=None,
        rank_setup_s=0.2,
        rank_save_s=0.05,
        steps=30,
        stopped_by_clock=False,
        ticks_after_stop=0,
        batches_after_stop=0,
        tokens_seen=3000,
        world_size=1,
        backend="gloo",
        device="cpu",
        threads_per_rank=2,
        process={"NoNewPrivs": "1"},
    ).to_json()


def result_json() -> dict[str, Any]:
    return ResultRecord(
        status="ok",
        submission={"name": "x"},
        track="tiny",
        preset="tiny",
        seed=0,
        created_unix_s=1.0,
        run_dir="/tmp/run",
        val_loss=2.5,
        val_bpb=1.25,
        bytes_code=100,
        bytes_model=900,
        bytes_total=1000,
        cap_bytes=16_000_000,
        within_cap=True,
        phases={"pack": pack_json()},
        config={},
        provenance={},
    ).to_json()


RECORDS = [
    (PackRecord, pack_json, "encode_time_s"),
    (ScoreRecord, score_json, "val_bpb"),
    (RankReport, rank_json, "rank_reported_train_s"),
    (ResultRecord, result_json, "val_bpb"),
]


@pytest.mark.parametrize(("cls", "make", "measured"), RECORDS)
def test_round_trip(cls, make, measured):
    d = make()
    r = cls.from_json(d)
    assert cls.from_json(r.to_json()) == r and r.to_json() == d
    assert cls.from_json(json.loads(json.dumps(d))) == r  # through the JSON on disk


@pytest.mark.parametrize(("cls", "make", "measured"), RECORDS)
@pytest.mark.parametrize(("key", "value"), [("format", "pg-other"), ("format_version", 99)])
def test_a_wrong_format_or_version_is_refused(cls, make, measured, key, value):
    with pytest.raises(ValueError, match=key):
        cls.from_json({**make(), key: value})


@pytest.mark.parametrize(("cls", "make", "measured"), RECORDS)
def test_a_wrong_type_is_refused(cls, make, measured):
    with pytest.raises(ValueError, match=measured):
        cls.from_json({**make(), measured: "1.0"})
    with pytest.raises(ValueError, match="not a JSON object"):
        cls.from_json([make()])


@pytest.mark.parametrize(("cls", "make", "measured"), RECORDS)
def test_a_nan_in_a_measured_field_is_refused(cls, make, measured):
    for bad in (math.nan, math.inf):
        with pytest.raises(ValueError, match=measured):
            cls.from_json({**make(), measured: bad})


@pytest.mark.parametrize("make", [pack_json, result_json])
def test_bytes_total_must_be_code_plus_model(make):
    with pytest.raises(ValueError, match="bytes_total"):
        (PackRecord if make is pack_json else ResultRecord).from_json({**make(), "bytes_total": 999})


def test_a_bool_is_not_an_int():
    with pytest.raises(ValueError, match="num_tensors"):
        PackRecord.from_json({**pack_json(), "num_tensors": True})


def test_pack_state_returns_the_record(tmp_path):
    sub = tmp_path / "sub"
    sub.mkdir()
    (sub / "model.py").write_text("def build_model(config):\n    pass\n")
    state = {"w": torch.ones(4, 4)}
    d = pack_state(state, sub, tmp_path / "a.pgolf", codec_name="int8_zlib", model_config={}, cap_bytes=10**9)
    rec = PackRecord.from_json(d)
    assert rec.to_json() == d and rec.bytes_total == (tmp_path / "a.pgolf").stat().st_size + rec.bytes_code
    assert list(d) == [
        "format", "format_version", "api_version", "codec", "artifact", "artifact_sha256", "code_files",
        "encode_time_s", "num_tensors", "num_params", "bytes_code", "bytes_model", "bytes_total",
        "cap_bytes", "within_cap",
    ]  # fmt: skip


def test_the_score_failure_record():
    f = ScoreFailure(status="illegal", detail="peeked")
    assert f.to_json() == {
        "format": "pg-score", "format_version": 2, "status": "illegal", "detail": "peeked", "origin": "submission"
    }  # fmt: skip
    assert read_score_record(f.to_json()) == f
    old = {k: v for k, v in f.to_json().items() if k != "origin"}  # a record from before `origin`
    assert read_score_record(old) == f
    with pytest.raises(ValueError, match="origin"):
        read_score_record({**f.to_json(), "origin": "the moon"})
    assert isinstance(read_score_record(score_json()), ScoreRecord)
    with pytest.raises(ValueError, match="detail"):
        read_score_record({**f.to_json(), "detail": None})
    with pytest.raises(ValueError, match="val_loss"):
        read_score_record({k: v for k, v in score_json().items() if k != "val_loss"})


def test_the_rank_report_drops_unknown_keys_and_checks_the_role():
    r = RankReport.from_json({**rank_json(), "train_time_s": 0.01, "val_bpb": 0.1})
    assert "train_time_s" not in r.to_json() and r == RankReport.from_json(rank_json())
    with pytest.raises(ValueError, match="role"):
        RankReport.from_json({**rank_json(), "role": "supervisor"})
    with pytest.raises(ValueError, match="steps"):
        RankReport.from_json({**rank_json(), "steps": -1})
    with pytest.raises(ValueError, match="non-finite"):
        RankReport.from_json({**rank_json(), "process": {"x": math.nan}})
    partial = RankReport.from_json({"format": "pg-train", "format_version": 4, "steps": 4})
    assert partial.steps == 4 and partial.tokens_seen is None


def test_a_minimal_result_round_trips_without_the_full_fields():
    d = ResultRecord(
        status="error",
        detail="boom",
        submission={},
        track="tiny",
        preset=None,
        created_unix_s=1.0,
        run_dir="/r",
    ).to_json()
    assert set(d) == {
        "format", "format_version", "api_version", "status", "detail", "verification", "submission",
        "track", "preset", "created_unix_s", "run_dir", "val_bpb", "val_loss",
    }  # fmt: skip
    assert ResultRecord.from_json(d).to_json() == d


def test_the_rank_report_schema_is_derived_from_its_dataclass():
    from dataclasses import fields

    from harness.run.train_phase import RANK_RECORD_FIELDS, RANK_REPORT_NOT_KEPT
    from harness.train.rank import RANK_REPORT_FIELDS

    names = [f.name for f in fields(RankReport)]
    assert list(RANK_REPORT_FIELDS) == names[2:] and names[:2] == ["format", "format_version"]
    assert RANK_REPORT_FIELDS["steps"] is int and RANK_REPORT_FIELDS["role"] is str
    assert (
        RANK_REPORT_FIELDS["rank_setup_s"] == (int, float) and RANK_REPORT_FIELDS["train_shard_names"] is list
    )
    assert RANK_REPORT_FIELDS["gptq"] == RANK_REPORT_FIELDS["rank_reported_warmup"] == (dict, type(None))
    assert RANK_RECORD_FIELDS == tuple(k for k in names[2:] if k not in RANK_REPORT_NOT_KEPT)
    assert RankReport.from_json({**rank_json(), "gptq": None, "rank_setup_s": 1}).rank_setup_s == 1
    with pytest.raises(ValueError, match=r"field 'steps' = None is not"):
        RankReport.from_json({**rank_json(), "steps": None})
    with pytest.raises(ValueError, match=r"field 'rank_save_s' = 0.5s is not"):
        RankReport.from_json({**rank_json(), "rank_save_s": "0.5s"})
