"""End to end: `pgolf run` on a hostile submission folder (the baseline's tiny preset, copied, plus one
hostile entry) ends with a verdict in result.json and the ledger, before training, never a traceback or
a hang (harness/run/staging.py)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import BASELINE


def _fifo(sub: Path, data: Path) -> None:
    os.mkfifo(sub / "helper.py")


def _link_to_a_validation_shard(sub: Path, data: Path) -> None:
    (sub / "tokens.bin").symlink_to(sorted(data.glob("fineweb_val_*.bin"))[0])


def _sparse_16_gb(sub: Path, data: Path) -> None:
    with open(sub / "weights.bin", "wb"):
        pass
    os.truncate(sub / "weights.bin", 16 * 2**30)


HOSTILE = {
    "fifo": (_fifo, "illegal", "helper.py is a FIFO"),
    "symlink to a validation shard": (
        _link_to_a_validation_shard,
        "illegal",
        "tokens.bin is a symbolic link",
    ),
    "sparse 16 GB file": (_sparse_16_gb, "over_cap", "weights.bin is 17,179,869,184 bytes"),
}


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_a_hostile_folder_gets_a_verdict_not_a_traceback(tmp_path, tiny_dataset, name):
    plant, status, why = HOSTILE[name]
    sub = tmp_path / "hostile"
    shutil.copytree(BASELINE, sub, ignore=shutil.ignore_patterns("__pycache__"))
    plant(sub, tiny_dataset)
    out = tmp_path / "runs" / "run"
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "harness.cli",
            "run",
            str(sub),
            "--preset",
            "tiny",
            "--data",
            str(tiny_dataset),
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stdout[-2000:] + r.stderr[-2000:]
    assert "folder refused" in r.stderr and why in r.stderr, r.stderr
    res = json.loads((out / "result.json").read_text())
    assert res["status"] == status and res["val_bpb"] is None
    assert res["phases"]["folder"]["status"] == status and why in res["phases"]["folder"]["detail"]
    assert "train" not in res["phases"] and "pack" not in res["phases"]
    (line,) = (out.parent / "ledger.jsonl").read_text().splitlines()
    assert json.loads(line)["status"] == status
