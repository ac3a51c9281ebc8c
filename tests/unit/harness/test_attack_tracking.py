"""Attacks on what tracking (harness/run/tracking.py) does with what an entry controls: the [log] names
its config.toml may set, its submission name (a wandb tag), and the ranks' metrics file."""

from __future__ import annotations

import pytest

from harness.config import LogConfig, load_config
from harness.run.tracking import Tracker, finish_tracking
from tests.unit.harness.test_tracking import wandb_env  # noqa: F401 - a fixture

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
