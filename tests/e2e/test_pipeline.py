"""End to end on CPU: pgolf run (train → pack → score → report) with the baseline's tiny preset.

Also: the scorer is deterministic (two `pgolf score` runs give bit-identical val_bpb), training is
deterministic for a fixed seed, and a failing submission is recorded as an error, never scored.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from scoring.artifact.format import read_artifact
from tests.conftest import BASELINE, REPO
from tests.golden.regen import GOLDEN_ARGS, PINNED_NUMERICS_ENV, golden_lines, shards_identity


def pgolf(*args: str, check: bool = True, cwd: Path | None = None) -> subprocess.CompletedProcess:
    """`pgolf ARGS` with the golden run's pinned kernels (every number this file compares is exact)."""
    env = {**os.environ, **PINNED_NUMERICS_ENV}
    if cwd is not None:  # run from elsewhere: the project must stay importable
        env["PYTHONPATH"] = str(REPO) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    r = subprocess.run(
        [sys.executable, "-m", "harness.cli", *args],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
        cwd=cwd,
    )
    if check:
        assert r.returncode == 0, f"pgolf {' '.join(args)} failed:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    return r


# The golden run's command (tests/golden/regen.py): a step count, not the clock, ends it (30 steps at a
# constant LR), so two runs with one seed agree step for step; one run serves every test of this file.
GOLDEN = REPO / "tests" / "golden" / "tiny_run.txt"
STEPS = 30


@pytest.fixture(scope="module")
def tiny_run(sp_dataset, tmp_path_factory):
    out = tmp_path_factory.mktemp("runs") / "tiny"
    r = pgolf("run", str(BASELINE), *GOLDEN_ARGS, "--data", str(sp_dataset), "--out", str(out))
    return out, r.stdout


def test_golden_tiny_run_is_reproduced_exactly(tiny_run, sp_dataset) -> None:
    """Per-step losses, val_bpb and the artifact's sha256, exactly (tests/golden/tiny_run.txt). It pins the
    whole pipeline's behaviour, so a restructure that changes no numerics keeps it."""
    expected = [
        line for line in GOLDEN.read_text(encoding="utf-8").splitlines() if line and not line.startswith("#")
    ]
    have, want = shards_identity(sp_dataset), expected[0].split()[1]
    if have != want:
        pytest.skip(
            f"the embedded corpus differs on this Python ({sys.version.split()[0]}): shards {have[:12]} != golden {want[:12]}"
        )
    got = golden_lines(tiny_run[0])
    diff = [
        f"line {i}: golden {a!r} != run {b!r}"
        for i, (a, b) in enumerate(zip(expected, got, strict=False))
        if a != b
    ]
    assert len(got) == len(expected) and not diff, (
        "\n".join(diff[:10]) or f"{len(got)} lines != {len(expected)}"
    )


def test_run_produces_a_complete_result(tiny_run, sp_dataset):
    out, stdout = tiny_run
    res = json.loads((out / "result.json").read_text())
    assert res["format"] == "pg-result" and res["format_version"] == 1
    assert res["status"] == "ok" and res["verification"] == "unverified"
    assert res["within_cap"] is True
    assert (
        res["bytes_total"]
        == res["bytes_code"] + res["bytes_model"]
        == res["bytes_code"] + (out / "artifact.pgolf").stat().st_size
    )
    for key in ("val_loss", "val_bpb", "unigram_bpb", "train_time_s", "eval_time_s"):
        assert isinstance(res[key], float) and res[key] > 0, key
    assert res["steps"] == STEPS and res["tokens_seen"] == STEPS * 1024
    assert res["val_tokens"] == 4096 and res["eval_mode"] == "standard"
    assert set(res["provenance"]["code_files"]) == {"config.toml", "model.py", "train.py"}
    assert res["provenance"]["libraries"]["torch"]
    assert (out.parent / "ledger.jsonl").read_text().count("\n") == 1
    assert "val_bpb" in stdout and "within_cap True" in stdout
    # the scorer never saw train.py: the score phase ran on a staged copy without it
    seen = json.loads((out / "score.json").read_text())["submission_files_seen"]
    assert "model.py" in seen and "train.py" not in seen


def test_score_twice_is_bit_identical(tiny_run, sp_dataset):
    out, _ = tiny_run
    args = [
        "score",
        str(out / "artifact.pgolf"),
        "--submission",
        str(BASELINE),
        "--data",
        str(sp_dataset),
        "--seq-len",
        "64",
        "--batch-seqs",
        "16",
        "--max-tokens",
        "4096",
        "--threads",
        str(os.cpu_count()),
        "--json",
    ]
    # a second scoring, in other processes (fresh workers, other probe batches' workers), agrees bit for bit
    # with the pipeline's own score phase
    a = json.loads(pgolf(*args).stdout)
    first = json.loads((out / "score.json").read_text())
    assert a["val_bpb"] == first["val_bpb"] and a["val_loss_sum_nats"] == first["val_loss_sum_nats"]
    assert a["val_bpb"] == json.loads((out / "result.json").read_text())["val_bpb"]


@pytest.mark.long  # a second whole run; code bundles: tests/unit/scoring/test_code_bundle.py
def test_same_seed_same_losses_and_code_shipped_compressed_changes_only_bytes_code(
    tiny_run, sp_dataset, tmp_path
):
    """The second run ships the baseline's code as code.tar.xz (docs/RULES.md): training, the weights and the
    score are the same; only the bytes counted for code change, to the archive's; and it verifies."""
    out, _ = tiny_run
    bundled = tmp_path / "bundled"
    bundled.mkdir()
    shutil.copy(BASELINE / "config.toml", bundled)
    shutil.copy(BASELINE / "submission.json", bundled)  # not counted
    with tarfile.open(
        bundled / "code.tar.xz", "w:xz", preset=9
    ) as tar:  # tar -cJf code.tar.xz model.py train.py
        for name in ("model.py", "train.py"):
            tar.add(BASELINE / name, arcname=name)
    again = tmp_path / "again"
    pgolf("run", str(bundled), *GOLDEN_ARGS, "--data", str(sp_dataset), "--out", str(again))
    losses = [
        [json.loads(line)["train_loss"] for line in (d / "metrics.jsonl").read_text().splitlines()]
        for d in (out, again)
    ]
    assert len(losses[0]) == STEPS
    assert losses[0] == losses[1]
    # the packed weights are byte-identical; the header binds other code files
    a, b = (read_artifact(d / "artifact.pgolf") for d in (out, again))
    assert a.payload == b.payload
    assert set(b.header["code_files"]) == {"code.tar.xz", "config.toml", "model.py", "train.py"}
    assert {k: v for k, v in b.header["code_files"].items() if k != "code.tar.xz"} == a.header["code_files"]
    first, second = (json.loads((d / "result.json").read_text()) for d in (out, again))
    assert second["val_bpb"] == first["val_bpb"]
    shipped = sum((bundled / f).stat().st_size + len(f) for f in ("code.tar.xz", "config.toml"))
    assert second["bytes_code"] == shipped < first["bytes_code"]
    r = pgolf("verify", str(again), "--submission", str(bundled), check=False)
    assert r.returncode == 0, r.stdout + r.stderr


@pytest.mark.long  # a whole re-score; verify itself: tests/unit/harness/test_verify.py
def test_verify_a_run_folder_alone(tiny_run, tmp_path):
    """The run keeps the packed code in RUN_DIR/code, so verification needs nothing else. The path is relative,
    as docs/OFFICIALS.md writes it (`pgolf verify runs/X` failed the re-score and wrote `failed`: the model
    worker runs in a folder of its own, where the relative artifact path named nothing)."""
    out, _ = tiny_run
    copy = tmp_path / "copy" / "tiny"
    shutil.copytree(out, copy)
    r = pgolf("verify", "copy/tiny", check=False, cwd=tmp_path)
    assert r.returncode == 0 and f"verify {copy}: VERIFIED" in r.stdout, r.stdout + r.stderr
    assert json.loads((copy / "result.json").read_text())["verification"] == "verified"


def test_failing_submission_is_an_error_not_a_score(tmp_path, tiny_dataset):
    sub = tmp_path / "broken"
    shutil.copytree(BASELINE, sub)
    (sub / "train.py").write_text("def train(ctx):\n    raise RuntimeError('boom at step 0')\n")
    r = pgolf(
        "run",
        str(sub),
        "--preset",
        "tiny",
        "--data",
        str(tiny_dataset),
        "--out",
        str(tmp_path / "run"),
        check=False,
    )
    assert r.returncode == 1
    res = json.loads((tmp_path / "run" / "result.json").read_text())
    assert res["status"] == "error" and res["val_bpb"] is None
    assert "boom at step 0" in res["phases"]["train"]["errors"]["train_error_rank0.txt"]


def test_model_code_the_scorer_would_refuse_is_illegal_before_training(tmp_path, tiny_dataset):
    sub = tmp_path / "peeks"
    shutil.copytree(BASELINE, sub)
    with open(sub / "model.py", "a") as f:
        f.write("\nimport numpy as np\nVAL = np.fromfile('/data/fineweb_val_000000.bin', dtype=np.uint16)\n")
    r = pgolf(
        "run",
        str(sub),
        "--preset",
        "tiny",
        "--data",
        str(tiny_dataset),
        "--out",
        str(tmp_path / "run"),
        check=False,
    )
    assert r.returncode == 1 and "code check failed" in r.stderr and "attribute 'fromfile'" in r.stderr, (
        r.stderr
    )
    res = json.loads((tmp_path / "run" / "result.json").read_text())
    assert res["status"] == "illegal" and res["val_bpb"] is None and "train" not in res["phases"]
    assert any("fromfile" in p for p in res["phases"]["code_check"]["problems"])


def test_bad_user_input_is_one_clear_line(tmp_path):
    r = pgolf(
        "run",
        str(BASELINE),
        "--preset",
        "tiny",
        "--set",
        "train.lr=0.1",
        "--out",
        str(tmp_path / "r"),
        check=False,
    )
    assert r.returncode == 2
    assert "unknown key 'train.lr'" in r.stderr and "Traceback" not in r.stderr
    r = pgolf(
        "score",
        str(tmp_path / "missing.pgolf"),
        "--submission",
        str(BASELINE),
        "--data",
        str(tmp_path),
        check=False,
    )
    assert r.returncode == 2 and "Traceback" not in r.stderr


@pytest.mark.long
def test_sample_runs_the_packed_model(tiny_run, sp_dataset):
    out, _ = tiny_run
    args = [
        "sample",
        str(out / "artifact.pgolf"),
        "--submission",
        str(BASELINE),
        "--data",
        str(sp_dataset),
        "--prompt",
        "The module",
        "--tokens",
        "8",
        "--temperature",
        "0",
        "--context",
        "64",
    ]
    a, b = pgolf(*args).stdout, pgolf(*args).stdout
    assert "[8 tokens in" in a and "tokens/s" in a
    assert a.splitlines()[0] == b.splitlines()[0]  # greedy decoding is deterministic
    assert a.startswith("The module")
