"""harness/run/tracking.py: the [log] table, the checked reader of the ranks' metrics file, and
wandb run offline for real (WANDB_MODE=offline, every wandb folder in tmp), its files read back.

The offline run's transaction log (RUN_DIR/wandb/offline-run-*/run-*.wandb) is read with a small
reader of its record framing (LevelDB log blocks: 7-byte header "W&B" magic, 32 KiB blocks, each
record a crc32 + length + type header), the records parsed with wandb's own protobuf schema
(wandb.proto.wandb_internal_pb2.Record), so the test sees what `wandb sync` would upload.
"""

from __future__ import annotations

import json
import os
import struct
import sys
import time
import zlib
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from harness.config import LogConfig, load_config
from harness.run.tracking import (
    METRICS_LINE_MAX_BYTES,
    MetricsReader,
    Tracker,
    finish_tracking,
    parse_metrics_line,
    read_metrics,
)
from tests.conftest import BASELINE

# ---- [log]: validated like the other tables; the mode is the runner's, the name may be the entry's ----


def test_log_table_defaults_to_disabled_and_refuses_bad_values():
    assert load_config(BASELINE, "tiny").section("log") == LogConfig()
    assert LogConfig().wandb == "disabled"
    with pytest.raises(
        ValueError, match=r"log.wandb = 'cloud' is not a mode; allowed: disabled, offline, online"
    ):
        LogConfig(wandb="cloud")
    with pytest.raises(ValueError, match="log.init_timeout_s = 0"):
        LogConfig(init_timeout_s=0)


def test_log_keys_through_set_and_the_file(tmp_path):
    cfg = load_config(BASELINE, "tiny", ["log.wandb='offline'", "log.project='golf'"])
    assert cfg.section("log") == LogConfig(wandb="offline", project="golf")
    with pytest.raises(
        ValueError,
        match=r"--set log.wandbb=1: unknown key 'log.wandbb' \(did you mean log.wandb\?\); keys of \[log\] are",
    ):
        load_config(BASELINE, "tiny", ["log.wandbb=1"])
    with pytest.raises(ValueError, match="log.wandb = 'x' is not a mode"):
        load_config(BASELINE, "tiny", ["log.wandb='x'"])
    (tmp_path / "config.toml").write_text('[run]\ntrack = "smoke"\n[log]\nproject = "mine"\n')
    assert load_config(tmp_path).section("log").project == "mine"  # naming: the entry's to choose
    (tmp_path / "config.toml").write_text('[run]\ntrack = "smoke"\n[log]\nwandb = "online"\n')
    with pytest.raises(ValueError, match="log.wandb is not a submission's to set"):
        load_config(tmp_path)  # whether (and where) a run is tracked: the runner's


# ---- the metrics file: hostile input ----


def test_metrics_lines_are_checked():
    assert parse_metrics_line(b'{"step": 3, "train_loss": 2.5, "lr_scale": 1}') == {
        "step": 3,
        "train_loss": 2.5,
        "lr_scale": 1.0,
    }
    for bad in (
        b"not json",
        b"[1, 2]",
        b'{"train_loss": 1.0}',  # no step
        b'{"step": -1, "x": 1}',
        b'{"step": true, "x": 1}',
        b'{"step": 1.5, "x": 1}',
        b'{"step": 1, "x": NaN}',
        b'{"step": 1, "x": Infinity}',
        b'{"step": 1, "x": "1"}',
        b'{"step": 1, "x": true}',
        b'{"step": 1, "bad key": 1}',
        b'{"step": 1, "x": {"y": 1}}',
        b'{"step": 1, ' + b", ".join(b'"k%d": 1' % i for i in range(40)) + b"}",
        b'{"step": 1, "x": 1, "pad": 0' + b" " * METRICS_LINE_MAX_BYTES + b"}",
    ):
        assert parse_metrics_line(bad) is None, bad


@given(st.lists(st.binary(max_size=80), max_size=20))
def test_any_bytes_never_crash_the_reader(chunks):
    for c in chunks:
        rec = parse_metrics_line(c)
        assert rec is None or isinstance(rec["step"], int)


def test_reader_follows_a_growing_file_and_a_moved_one(tmp_path):
    path = tmp_path / "metrics.jsonl"
    reader = MetricsReader(path)
    assert reader.poll() == [] and not reader.refused  # not there yet: wait for it
    with open(path, "a") as f:
        f.write('{"step": 1, "train_loss": 5.0}\n{"step": 2, "train_lo')
    assert [r["step"] for r in reader.poll()] == [1]  # the half-written line waits
    with open(path, "a") as f:
        f.write('ss": 4.0}\ngarbage\n')
    assert reader.poll() == [{"step": 2, "train_loss": 4.0}] and reader.skipped == 1
    moved = tmp_path / "moved.jsonl"
    path.rename(moved)  # what the train phase does at its end
    with open(moved, "a") as f:
        f.write('{"step": 3, "train_loss": 3.0}')
    assert reader.poll() == [] and reader.poll(final=True) == [{"step": 3, "train_loss": 3.0}]
    reader.close()


def test_reader_refuses_links_and_fifos_and_stops_at_its_cap(tmp_path):
    secret = tmp_path / "secret.txt"
    secret.write_text('{"step": 1, "x": 1}\n')
    (tmp_path / "link.jsonl").symlink_to(secret)
    records, skipped, refused = read_metrics(tmp_path / "link.jsonl")
    assert records == [] and "link.jsonl" in refused
    os.mkfifo(tmp_path / "fifo.jsonl")
    t0 = time.monotonic()
    records, _, refused = read_metrics(tmp_path / "fifo.jsonl")  # must not block on a FIFO with no writer
    assert records == [] and refused == "fifo.jsonl is not a regular file" and time.monotonic() - t0 < 2
    big = tmp_path / "big.jsonl"
    big.write_text("".join(f'{{"step": {i}, "x": 1}}\n' for i in range(1000)))
    reader = MetricsReader(big, max_bytes=1000)
    assert len(reader.poll()) < 100 and reader.skipped == 1  # the rest is not read (counted once)
    assert reader.poll() == [] and reader.skipped == 1
    reader.close()


# ---- wandb ----


def test_disabled_does_nothing(tmp_path):
    tracker = Tracker(LogConfig(), tmp_path)
    tracker.start()
    tracker.follow(tmp_path / "metrics.jsonl")
    assert finish_tracking(tracker, tmp_path, {"status": "ok"}) == "wandb: disabled"
    assert list(tmp_path.iterdir()) == []


def test_the_environment_kill_switch_wins(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "disabled")
    tracker = Tracker(LogConfig(wandb="online"), tmp_path)
    assert not tracker.active and "WANDB_MODE=disabled" in tracker.note


def wandb_records(run_file: Path) -> list:
    """Every record of a .wandb transaction log, parsed with wandb's protobuf schema."""
    from wandb.proto import wandb_internal_pb2 as pb

    data = run_file.read_bytes()
    assert data[:4] == b":W&B" and struct.unpack("<H", data[4:6])[0] == 0xBEE1
    block, pos, out, part = 32 * 1024, 7, [], b""
    while pos < len(data):
        left = block - pos % block
        if left < 7:  # a block's tail too short for a header is padding
            pos += left
            continue
        crc, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        if crc == length == kind == 0:
            pos += left
            continue
        chunk = data[pos + 7 : pos + 7 + length]
        assert zlib.crc32(bytes([kind]) + chunk) & 0xFFFFFFFF == crc, f"bad crc at {pos}"
        pos += 7 + length
        part = chunk if kind in (1, 2) else part + chunk
        if kind in (1, 4):  # FULL or LAST: a whole record
            rec = pb.Record()
            rec.ParseFromString(part)
            out.append(rec)
    return out


@pytest.fixture
def wandb_env(tmp_path, monkeypatch):
    pytest.importorskip("wandb", reason="wandb is in the [dev] extra: pip install -e '.[dev]'")
    for name in ("DIR", "CONFIG_DIR", "CACHE_DIR", "DATA_DIR", "ARTIFACT_DIR"):
        monkeypatch.setenv(f"WANDB_{name}", str(tmp_path / f"wandb_{name.lower()}"))
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    return tmp_path


def test_offline_run_writes_the_metrics_and_the_records(wandb_env):
    run_dir = wandb_env / "run"
    run_dir.mkdir()
    metrics = wandb_env / "out" / "metrics.jsonl"  # where the ranks write, outside the run folder
    metrics.parent.mkdir()
    tracker = Tracker(LogConfig(wandb="offline", project="pgolf-test"), run_dir, tags=["smoke", "tiny"])
    tracker.start()
    tracker.follow(metrics, poll_s=0.05)
    with open(metrics, "a") as f:
        for step in range(1, 6):
            f.write(json.dumps({"step": step, "train_loss": 6.0 - step, "lr_scale": step / 5}) + "\n")
            f.flush()
            time.sleep(0.02)
        deadline = time.monotonic() + 20
        while tracker.logged < 5 and time.monotonic() < deadline:  # live: logged while the file is open
            time.sleep(0.05)
        assert tracker.logged == 5
        f.write('{"step": 6, "val_bpb": 0.01}\n')  # the rank's word: logged under rank/, never as the score
        f.write("not a metrics line\n")
    result = {
        "status": "ok",
        "val_bpb": 2.4650,
        "val_loss": 4.2024,
        "bytes_total": 1_005_720,
        "bytes_code": 20_338,
        "bytes_model": 985_382,
        "track": "smoke",
        "config": {"train": {"matrix_lr": 0.04}},
        "submission": {"name": "naive_baseline"},
        "provenance": {"code_files": {"train.py": "ab" * 32}, "artifact_sha256": "cd" * 32},
    }
    note = finish_tracking(tracker, run_dir, result)
    assert note.startswith("wandb: offline, run ") and "6 metric line(s) logged, 1 skipped" in note
    record = json.loads((run_dir / "tracking.json").read_text())
    assert record["format"] == "pg-tracking" and record["tracked"] and record["metric_lines_logged"] == 6

    [folder] = (run_dir / "wandb").glob("offline-run-*")  # the run's own folder holds it
    [log] = folder.glob("run-*.wandb")
    recs = wandb_records(log)
    kinds = [r.WhichOneof("record_type") for r in recs]
    assert kinds[0] == "header" and "run" in kinds and kinds[-1] == "exit"
    history = []
    for r in recs:
        if r.WhichOneof("record_type") == "history":
            history.append(
                {"/".join(i.nested_key) or i.key: json.loads(i.value_json) for i in r.history.item}
            )
    assert [h["_step"] for h in history] == [1, 2, 3, 4, 5, 6]
    assert [h.get("rank/train_loss") for h in history[:5]] == [5.0, 4.0, 3.0, 2.0, 1.0]
    assert history[5]["rank/val_bpb"] == 0.01 and "val_bpb" not in history[5]
    summary: dict = {}
    for r in recs:
        if r.WhichOneof("record_type") == "summary":
            for u in r.summary.update:
                summary["/".join(u.nested_key) or u.key] = json.loads(u.value_json)
    assert summary["val_bpb"] == 2.4650 and summary["status"] == "ok" and summary["bytes_total"] == 1_005_720
    config: dict = {}
    for r in recs:
        if r.WhichOneof("record_type") in ("run", "config"):
            cfg = r.run.config if r.WhichOneof("record_type") == "run" else r.config
            for u in cfg.update:
                config["/".join(u.nested_key) or u.key] = json.loads(u.value_json)
    assert config["config/train/matrix_lr"] == 0.04
    assert "code_files/train.py" in config and "provenance/artifact_sha256" in config
    run = next(r.run for r in recs if r.WhichOneof("record_type") == "run")
    assert run.project == "pgolf-test" and run.display_name == "run" and list(run.tags) == ["smoke", "tiny"]


def test_an_unreachable_service_is_bounded_and_never_fails_the_run(wandb_env, monkeypatch):
    """Online with a key and nothing listening: init gives up within log.init_timeout_s (+ slack)."""
    monkeypatch.setenv("WANDB_MODE", "online")
    monkeypatch.setenv("WANDB_BASE_URL", "http://127.0.0.1:9")  # the discard port: connection refused
    monkeypatch.setenv("WANDB_API_KEY", "0" * 40)
    run_dir = wandb_env / "run"
    run_dir.mkdir()
    t0 = time.monotonic()
    tracker = Tracker(LogConfig(wandb="online", init_timeout_s=3.0), run_dir)
    tracker.start()
    tracker.follow(wandb_env / "metrics.jsonl", poll_s=0.05)
    note = finish_tracking(tracker, run_dir, {"status": "ok", "val_bpb": 1.0})
    elapsed = time.monotonic() - t0
    assert elapsed < 3.0 + 10.0 + 2.0, elapsed
    assert "this run is not tracked" in note, note
    assert not json.loads((run_dir / "tracking.json").read_text())["tracked"]


def test_without_wandb_installed_the_run_goes_on(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)  # `import wandb` raises ImportError
    tracker = Tracker(LogConfig(wandb="offline"), tmp_path)
    tracker.start()
    note = finish_tracking(tracker, tmp_path, {"status": "ok"})
    assert note == "wandb: offline requested but wandb is not installed (pip install wandb); not tracked"
    assert not json.loads((tmp_path / "tracking.json").read_text())["tracked"]
