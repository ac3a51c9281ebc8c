"""Attacks on what tracking (harness/run/tracking.py) does with what an entry controls: the [log] names
its config.toml may set, its submission name (a wandb tag), and the ranks' metrics file."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import types

import pytest

from harness.config import LogConfig, load_config
from harness.run import tracking
from harness.run.launch import last_metrics, progress_line
from harness.run.tracking import (
    WANDB_MAX_LINES,
    WANDB_MAX_NAMES,
    Tracker,
    finish_tracking,
    parse_metrics_line,
    read_metrics,
)
from harness.run.train_phase import read_rank_record
from harness.train.budget import BudgetConfig
from harness.train.rank import TRAIN_FORMAT, TRAIN_FORMAT_VERSION
from tests.unit.harness.test_tracking import wandb_env, wandb_records  # noqa: F401 - a fixture

# ---- the names a submission may set: wandb refuses some, and then the official's run is not tracked ----


@pytest.mark.parametrize(
    "table, match",
    [
        ('project = "x/y"', r"log.project = 'x/y' must be 1 to 128 letters, digits, spaces or '_.-'"),
        ('project = "a\\u001b[2Jb"', r"log.project = 'a\\x1b\[2Jb' must be 1 to 128"),
        (f'project = "{"p" * 129}"', r"log.project = 'p{128}' must be 1 to 128"),
        ('run_name = "a\\nb"', r"log.run_name = 'a\\nb' must be at most 128 characters and no control"),
        (f'run_name = "{"n" * 129}"', r"log.run_name = 'n{128}' must be at most 128"),
    ],
)
def test_a_submission_cannot_name_a_project_or_run_wandb_refuses(tmp_path, table, match):
    (tmp_path / "config.toml").write_text(f'[run]\ntrack = "smoke"\n[log]\n{table}\n')
    with pytest.raises(ValueError, match=match):
        load_config(tmp_path)
    (tmp_path / "config.toml").write_text('[run]\ntrack = "smoke"\n[log]\nproject = "golf-2 v.1"\n')
    assert load_config(tmp_path).section("log").project == "golf-2 v.1"
    assert LogConfig(run_name="seed 1 · ünïcode").run_name == "seed 1 · ünïcode"


def test_a_long_submission_name_as_a_tag_still_tracks_the_run(wandb_env):  # noqa: F811
    run_dir = wandb_env / "run"
    run_dir.mkdir()
    name = "n" * 80  # NAME_MAX_CHARS: what the pipeline passes as a tag; wandb takes at most 64
    tracker = Tracker(LogConfig(wandb="offline"), run_dir, tags=["smoke", name])
    tracker.start()
    note = finish_tracking(tracker, run_dir, {"status": "ok"})
    assert tracker.tracked, note
    assert tracker.tags == ["smoke", "n" * 64]


# ---- the metrics file: what reaches the official's wandb account is bounded ----


class FakeRun:
    id, dir, url = "fake", "", ""

    def __init__(self) -> None:
        self.steps: list[int] = []
        self.names: set[str] = set()
        self.config_sent: dict = {}
        self.config = types.SimpleNamespace(update=lambda d, **k: self.config_sent.update(d))
        self.summary: dict = {}

    def log(self, row: dict, step: int) -> None:
        self.steps.append(step)
        self.names |= row.keys()

    def finish(self) -> None:
        pass


@pytest.fixture
def fake_wandb(monkeypatch):
    runs: list[FakeRun] = []

    def init(**kwargs):
        runs.append(FakeRun())
        return runs[-1]

    monkeypatch.setitem(sys.modules, "wandb", types.SimpleNamespace(init=init, Settings=lambda **k: None))
    return runs


def _track(tmp_path, lines: list[str], *, between=None) -> tuple[Tracker, str]:
    metrics = tmp_path / "metrics.jsonl"
    tracker = Tracker(LogConfig(wandb="offline"), tmp_path)
    tracker.start()
    deadline = time.monotonic() + 10
    while not tracker.tracked and time.monotonic() < deadline:
        time.sleep(0.01)
    tracker.follow(metrics, poll_s=0.02)
    with open(metrics, "a") as f:
        f.writelines(lines)
        f.flush()
        if between is not None:
            time.sleep(0.2)  # the tail reads these, then later polls find nothing new
            f.writelines(between)
            f.flush()
            time.sleep(0.2)
    return tracker, finish_tracking(tracker, tmp_path, {"status": "ok"})


def test_a_flood_of_metric_names_stops_at_the_cap(tmp_path, fake_wandb):
    # 300 lines of 32 new names each: 9,600 names (a 64 MiB file holds ~10^6)
    lines = [
        json.dumps({"step": i, **{f"m{i}_{j}_{'x' * 40}": 1.0 for j in range(32)}}) + "\n" for i in range(300)
    ]
    tracker, note = _track(tmp_path, lines)
    [run] = fake_wandb
    assert len(run.names) == WANDB_MAX_NAMES == 256 and run.steps == list(range(8))
    assert tracker.logged == 8 and tracker.skipped == 292
    assert "8 metric line(s) logged, 292 skipped (wandb gets no more than 256 metric names)" in note
    assert json.loads((tmp_path / "tracking.json").read_text())["metric_lines_skipped"] == 292


def test_a_flood_of_steps_stops_at_the_cap(tmp_path, fake_wandb):
    lines = [f'{{"step":{i},"a":1}}\n' for i in range(WANDB_MAX_LINES + 5)]
    tracker, note = _track(tmp_path, lines)
    [run] = fake_wandb
    assert len(run.steps) == WANDB_MAX_LINES == 100_000 and run.steps[-1] == 99_999
    assert tracker.skipped == 5 and "(wandb gets no more than 100000 lines)" in note


def test_lines_wandb_refused_stay_counted_as_skipped(tmp_path, fake_wandb):
    # a step back is skipped when logged; a later poll of the file must not forget it
    tracker, note = _track(tmp_path, ['{"step": 5, "a": 1}\n', '{"step": 3, "a": 1}\n'], between=[])
    [run] = fake_wandb
    assert run.steps == [5] and tracker.skipped == 1 and "1 metric line(s) logged, 1 skipped" in note
    assert json.loads((tmp_path / "tracking.json").read_text())["metric_lines_skipped"] == 1


def test_an_entrys_tables_cannot_flood_the_wandb_config_or_push_out_the_receipt(tmp_path, fake_wandb):
    # [train] is the entry's: any number of keys, any length (bounded only by the 16 MB cap)
    train = {f"k{i}": i for i in range(5000)}
    train["big"] = "x" * 10_000_000
    train["list"] = list(range(100_000))
    train["K" * 10_000] = 1
    result = {
        "status": "ok",
        "config": {"train": train, "model": {"d": 1}, "run": {"track": "smoke"}},
        # a folder of 3,000 small counted files: as many code_files keys
        "provenance": {
            "artifact_sha256": "ab" * 32,
            "code_files": {f"f{i}.py": "cd" * 32 for i in range(3000)},
        },
        "run_dir": "/runs/x",
        "submission": {"name": "n"},
    }
    tracker = Tracker(LogConfig(wandb="offline"), tmp_path)
    tracker.start()
    finish_tracking(tracker, tmp_path, result)
    [run] = fake_wandb
    sent = run.config_sent
    harness_keys = ["provenance/artifact_sha256", "run_dir", "submission/name", "config/run/track"]
    assert len(sent) == 1000 + len(harness_keys) + 1 and sent["config_keys_dropped"] == 3000 + 5004 - 1000
    assert [sent[k] for k in harness_keys] == ["ab" * 32, "/runs/x", "n", "smoke"]
    assert max(len(k) for k in sent) <= 200 and len(json.dumps(sent)) < 200_000


def test_the_printed_tracking_line_cannot_carry_terminal_escapes(wandb_env):  # noqa: F811
    # the run folder is named after the submission's folder: `runs/NAME-preset-stamp`
    run_dir = wandb_env / "sub\x1b]0;pwned\x07\x1b[2J-default-1"
    run_dir.mkdir()
    tracker = Tracker(LogConfig(wandb="offline"), run_dir)
    tracker.start()
    note = finish_tracking(tracker, run_dir, {"status": "ok"})
    assert tracker.tracked and note.startswith("wandb: offline, run ")
    assert "\x1b" not in note and "\x07" not in note and "sub\\x1b]0;pwned\\x07\\x1b[2J-default-1" in note


def test_an_integer_no_float_holds_is_a_skipped_line_not_the_end_of_the_metrics(tmp_path, fake_wandb):
    huge = b'{"step": 2, "train_loss": 1' + b"0" * 400 + b"}"
    assert parse_metrics_line(huge) is None
    path = tmp_path / "m.jsonl"
    path.write_bytes(b'{"step": 1, "train_loss": 3.0}\n' + huge + b'\n{"step": 3, "train_loss": 2.0}\n')
    records, skipped, refused = read_metrics(path)  # the plot's reader: it raised, the plot was not drawn
    assert [r["step"] for r in records] == [1, 3] and skipped == 1 and refused == ""
    tracker, note = _track(tmp_path, [path.read_text()])  # the tail thread stopped following at that line
    assert fake_wandb[0].steps == [1, 3] and "2 metric line(s) logged, 1 skipped" in note


def test_a_burst_of_lines_at_the_end_cannot_keep_the_result_out_of_wandb(tmp_path, fake_wandb, monkeypatch):
    # logging is slow (an online run: ~0.2 ms a line measured offline here, more online); a burst written
    # as training ends held the lock past finish's wait, and the summary (val_bpb, status) was never sent
    monkeypatch.setattr(FakeRun, "log", lambda self, row, step: (time.sleep(0.002), self.steps.append(step)))
    monkeypatch.setattr(tracking, "FINISH_FLUSH_S", 0.5, raising=False)
    metrics = tmp_path / "metrics.jsonl"
    tracker = Tracker(LogConfig(wandb="offline"), tmp_path)
    tracker.start()
    tracker.follow(metrics, poll_s=0.05)
    time.sleep(0.2)
    metrics.write_text("".join(f'{{"step":{i},"a":1}}\n' for i in range(30_000)))  # 60 s of logging
    time.sleep(0.2)
    t0 = time.monotonic()
    note = finish_tracking(tracker, tmp_path, {"status": "ok", "val_bpb": 1.25})
    [run] = fake_wandb
    assert time.monotonic() - t0 < 5 and run.summary == {"status": "ok", "val_bpb": 1.25}
    assert tracker.logged + tracker.skipped == 30_000 and tracker.skipped > 20_000
    assert "(wandb gets no lines still pending 0.5 s after the run ended)" in note


# ---- the supervisor's progress line reads the same file while training runs ----


def test_a_hostile_last_metrics_line_cannot_end_the_supervisors_loop(tmp_path):
    # the progress line (non-terminal runs, every 30 s) read it; OverflowError ended supervise(): the run
    # was killed and recorded "the harness failed"
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 7, "train_loss": 1' + "0" * 400 + "}\n")
    budget = BudgetConfig(train_s=600.0)
    line = progress_line(100.0, 0.0, 10.0, 0.0, 0.0, budget, last_metrics(path))
    assert line == "[train] 90 s of 600 s on the clock, step 7"
    path.write_text('{"step": 1' + "0" * 400 + ', "train_loss": 2.5}\n')
    line = progress_line(100.0, 0.0, 10.0, 0.0, 0.0, budget, last_metrics(path))
    assert line == "[train] 90 s of 600 s on the clock"
    line = progress_line(100.0, 0.0, 10.0, 0.0, 0.0, budget, {"step": 8, "train_loss": 2})
    assert line == "[train] 90 s of 600 s on the clock, step 8, train_loss 2.0000"


# ---- train.json: the rank's counts reach the result, the card, wandb and `pgolf reproduce` ----


def test_a_rank_count_no_float_holds_is_refused_at_the_rank_record(tmp_path):
    # steps = 10**400 was kept: `pgolf reproduce` compared it (rel * abs(steps)) and died of OverflowError
    path = tmp_path / "train.json"
    base = {
        "format": TRAIN_FORMAT,
        "format_version": TRAIN_FORMAT_VERSION,
        "steps": 10,
        "tokens_seen": 2**63 - 1,
    }
    path.write_text(json.dumps(base))
    assert read_rank_record(path)["tokens_seen"] == 2**63 - 1
    path.write_text(json.dumps({**base, "steps": 10**400}))
    with pytest.raises(
        ValueError,
        match=r"^train.json field 'steps' = 1000000000000000000000000000000000000000\.\.\. \(401 digits\) is not below 2\*\*63$",
    ):
        read_rank_record(path)
    path.write_text(json.dumps({**base, "tokens_seen": 2**63}))
    with pytest.raises(
        ValueError, match=r"^train.json field 'tokens_seen' = 9223372036854775808 is not below 2\*\*63$"
    ):
        read_rank_record(path)


# ---- the current folder: wandb reads its wandb/settings before init's own arguments ----


def test_an_entrys_wandb_settings_never_choose_the_server_or_account(wandb_env, monkeypatch):  # noqa: F811
    # `cd entry && pgolf run . --wandb online`: the entry's wandb/settings set base_url (where wandb sends the
    # official's API key) and entity; measured with wandb 0.31 offline: run.entity 'evil', base_url the file's
    entry = wandb_env / "entry"
    (entry / "wandb").mkdir(parents=True)
    (entry / "wandb" / "settings").write_text(
        "[default]\nentity = evil\nbase_url = http://127.0.0.1:9/collect\n"
    )
    monkeypatch.chdir(entry)
    run_dir = wandb_env / "run"
    run_dir.mkdir()
    tracker = Tracker(LogConfig(wandb="offline"), run_dir, untrusted=entry)
    tracker.start()
    note = finish_tracking(tracker, run_dir, {"status": "ok"})
    assert not tracker.tracked and not (run_dir / "wandb").exists()
    assert note.startswith(f"wandb: not started: {entry / 'wandb' / 'settings'} is the submission's")
    assert json.loads((run_dir / "tracking.json").read_text())["tracked"] is False
    # run from the folder that holds the entries, an entry named `wandb` with a file `settings` is the same
    named = wandb_env / "entries" / "wandb"
    named.mkdir(parents=True)
    (named / "settings").write_text("[default]\nbase_url = http://127.0.0.1:9/collect\n")
    monkeypatch.chdir(named.parent)
    tracker = Tracker(LogConfig(wandb="offline"), run_dir, untrusted=named)
    tracker.start()
    assert not tracker.active and "wandb/settings is the submission's" in tracker.note
    # ... and so is it beside another entry run from that folder: the sibling is an entry (its submission.json)
    (named / "submission.json").write_text("{}")
    (named.parent / "foo").mkdir()
    tracker = Tracker(LogConfig(wandb="offline"), run_dir, untrusted=named.parent / "foo")
    tracker.start()
    assert not tracker.active and "wandb/settings is" in tracker.note
    # the official's own folder (outside the entry) is the official's to configure
    monkeypatch.chdir(wandb_env)
    (wandb_env / "wandb").mkdir()
    (wandb_env / "wandb" / "settings").write_text("[default]\nentity = mine\n")
    other = wandb_env / "run2"
    other.mkdir()
    tracker = Tracker(LogConfig(wandb="offline"), other, untrusted=entry)
    tracker.start()
    finish_tracking(tracker, other, {"status": "ok"})
    assert tracker.tracked  # (which entity: wandb reads the file once a process, at its first init)


def test_the_current_folders_git_is_not_the_runs_record(wandb_env, monkeypatch):  # noqa: F811
    # run from an entry's own git checkout, wandb ran `git config --get remote.origin.url` and `git rev-parse
    # --verify HEAD` in it (GIT_TRACE) and recorded the entry's remote and commit as the run's code
    entry = wandb_env / "entry"
    entry.mkdir()
    git = ["git", "-C", str(entry), "-c", "user.email=a@b", "-c", "user.name=a"]
    subprocess.run([*git, "init", "-q"], check=True)
    (entry / "train.py").write_text("x = 1\n")
    subprocess.run([*git, "add", "train.py"], check=True)
    subprocess.run([*git, "commit", "-qm", "x"], check=True)
    subprocess.run([*git, "remote", "add", "origin", "https://example.invalid/evil/leak.git"], check=True)
    monkeypatch.chdir(entry)
    run_dir = wandb_env / "run"
    run_dir.mkdir()
    tracker = Tracker(LogConfig(wandb="offline"), run_dir)
    tracker.start()
    finish_tracking(tracker, run_dir, {"status": "ok"})
    assert tracker.tracked
    [log] = (run_dir / "wandb").glob("offline-run-*/run-*.wandb")
    run = next(r.run for r in wandb_records(log) if r.WhichOneof("record_type") == "run")
    assert (run.git.remote_url, run.git.commit) == ("", "")


def test_a_removed_current_folder_never_stops_the_run_before_its_record(tmp_path, monkeypatch, fake_wandb):
    gone = tmp_path / "gone"
    gone.mkdir()
    monkeypatch.chdir(gone)
    gone.rmdir()
    tracker = Tracker(LogConfig(wandb="offline"), tmp_path, untrusted=tmp_path / "entry")
    tracker.start()  # outside the pipeline's try: an exception here left the run without a result record
    finish_tracking(tracker, tmp_path, {"status": "ok"})
    assert tracker.tracked


# ---- config.toml: what the run writes first (config.json) must be JSON ----


@pytest.mark.parametrize(
    "body",
    [
        "[train]\nx = 1979-05-27T07:32:00Z",
        "[model]\nd = [1, 07:32:00]",
        "[train]\nz = {a = 1979-05-27}",
    ],
)
def test_a_toml_date_is_refused_before_the_run_folder_exists(tmp_path, body):
    # accepted, it reached write_json_atomic(RUN_DIR/config.json) outside the pipeline's try: TypeError, a run
    # folder and no result record, no ledger line
    (tmp_path / "config.toml").write_text(f'[run]\ntrack = "smoke"\n{body}\n')
    with pytest.raises(
        ValueError, match=r"a TOML date or time has no JSON type \(records are JSON\); write it as"
    ):
        load_config(tmp_path)
