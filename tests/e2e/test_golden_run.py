"""The golden tiny run (tests/golden/tiny_run.txt): per-step losses, val_bpb and the artifact's sha256,
exactly. It pins the whole pipeline's behaviour, so a restructure that changes no numerics keeps it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import BASELINE, REPO
from tests.golden.regen import GOLDEN_ARGS, golden_lines, shards_identity

GOLDEN = REPO / "tests" / "golden" / "tiny_run.txt"


def test_golden_tiny_run_is_reproduced_exactly(sp_dataset: Path, tmp_path: Path) -> None:
    expected = [
        line for line in GOLDEN.read_text(encoding="utf-8").splitlines() if line and not line.startswith("#")
    ]
    have = shards_identity(sp_dataset)
    want = expected[0].split()[1]
    if have != want:
        pytest.skip(
            f"the embedded corpus differs on this Python ({sys.version.split()[0]}): shards {have[:12]} != golden {want[:12]}"
        )
    out = tmp_path / "run"
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "harness.cli",
            "run",
            str(BASELINE),
            *GOLDEN_ARGS,
            "--data",
            str(sp_dataset),
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    got = golden_lines(out)
    diff = [
        f"line {i}: golden {a!r} != run {b!r}"
        for i, (a, b) in enumerate(zip(expected, got, strict=False))
        if a != b
    ]
    assert len(got) == len(expected) and not diff, (
        "\n".join(diff[:10]) or f"{len(got)} lines != {len(expected)}"
    )
