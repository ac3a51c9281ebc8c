"""A dataset against the submission (harness/run/datacheck.py): `pgolf run` refuses a model that cannot
embed the dataset's tokens before the run folder exists, a bad --data leaves no folder either, and
`pgolf check DIR --data DATA` says the same in its `data` line."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from data.manifest import load_manifest
from harness.commands.preflight import run_checks
from harness.run.datacheck import REFUSE, WARN, dataset_findings
from harness.run.pipeline import run_pipeline
from scoring.tracks import get_track
from tests.conftest import REPO

TINY_LM = REPO / "tests" / "fixtures" / "submissions" / "tiny_lm"  # vocab_size 260, track smoke


def test_findings_for_each_way_the_data_does_not_fit(tiny_dataset: Path) -> None:
    manifest = load_manifest(tiny_dataset)  # byte260: 260 tokens
    assert dataset_findings({"vocab_size": 260}, "byte260", get_track("smoke"), manifest) == []
    small = dataset_findings({"vocab_size": 200}, None, None, manifest)
    assert [(w, lvl) for w, lvl, _ in small] == [("vocabulary", REFUSE)]
    assert "tokens 200..259 cannot be embedded" in small[0][2] and "--set model.vocab_size=260" in small[0][2]
    big = dataset_findings({"vocab_size": 1024}, "sp1024", get_track("cpu_10min_16mb"), manifest)
    assert [(w, lvl) for w, lvl, _ in big] == [("vocabulary", WARN), ("variant", WARN), ("track", REFUSE)]
    assert "764 output rows are never a target" in big[0][2]
    assert "declares data_variant 'sp1024' (1024 tokens), the dataset has 260" in big[1][2]


def test_run_refuses_a_model_too_small_for_the_data_and_leaves_no_folder(
    tiny_dataset: Path, tmp_path: Path
) -> None:
    run_dir = tmp_path / "runs" / "r"
    with pytest.raises(
        ValueError, match=r"--data refused \(vocabulary\): .* vocabulary of 260 tokens .* vocab_size is 100"
    ):
        run_pipeline(TINY_LM, data_dir=tiny_dataset, out_dir=run_dir, overrides=["model.vocab_size=100"])
    assert not run_dir.exists()


def test_a_bad_data_folder_is_one_line_and_leaves_no_folder(tmp_path: Path) -> None:
    run_dir = tmp_path / "runs" / "r"
    r = subprocess.run(
        [sys.executable, "-m", "harness.cli", "run", str(TINY_LM), "--data", str(tmp_path / "nowhere"),
         "--out", str(run_dir)],
        cwd=REPO, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert r.stderr.strip().splitlines() == [
        f"error: no manifest.json in {tmp_path / 'nowhere'}: not a dataset folder. "
        "HINT: build one with `pgolf data build` or download one with `pgolf data download`."
    ]
    assert not run_dir.exists() and not (tmp_path / "runs").exists()


def test_check_with_data_fails_the_data_line_and_skips_the_model(tiny_dataset: Path, tmp_path: Path) -> None:
    folder = tmp_path / "entry"
    shutil.copytree(TINY_LM, folder)
    checks = {
        c.name: c for c in run_checks(folder, overrides=["model.vocab_size=100"], data_dir=tiny_dataset)
    }
    assert checks["data"].status == "FAIL" and "vocabulary: the dataset" in checks["data"].detail
    assert checks["data"].facts["vocab_size"] == 260
    assert checks["model"].status == "skip" and "data" in checks["model"].detail
    fits = [c for c in run_checks(folder, data_dir=tiny_dataset) if c.name == "data"]
    assert fits[0].status == "ok" and "vocabulary 260" in fits[0].detail, fits[0].line()
