"""Sealed phases: a training process cannot read the validation shards, and its attempts are reported.

The hostile fixture `peek_val` is told the real validation shard paths (as if it had guessed them),
walks the folders around its training data and the default dataset cache, and reads every process's
command line for a `--data` folder; then it trains as usual. With Landlock
(Linux >= 5.13) every such read must fail and the result must list the attempts; without it the
test checks only that the run degrades with a recorded warning, and still reports the attempts.
The train phase's record checked here is what result.json holds as phases.train (harness/run/pipeline.py).
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import pytest

from harness.config import load_config
from harness.run.train_phase import run_train_phase
from isolation.landlock import landlock_abi
from isolation.sandbox import probe_machine
from tests.conftest import is_own_install

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "submissions"

_CAPS = probe_machine()
REFUSED = "FileNotFoundError" if (_CAPS.root and _CAPS.namespaces and _CAPS.overlay) else "PermissionError"
"""What a protected path gives a sandboxed read: in a world of its own it does not exist at all; without
one, Landlock refuses it."""


@pytest.fixture(scope="module")
def peek_run(tiny_dataset, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("iso")
    val = sorted(tiny_dataset.glob("fineweb_val_*.bin"))
    told = os.pathsep.join([*map(str, val), str(tiny_dataset / "manifest.json")])
    cfg = load_config(FIXTURES / "peek_val", None, [f"train.peek_paths={told!r}"])
    (tmp / "run").mkdir()
    rec = run_train_phase(
        submission_dir=FIXTURES / "peek_val",
        data_root=tiny_dataset,
        run_dir=tmp / "run",
        stage_root=tmp,
        model_config=cfg.model,
        hparams=cfg.train,
        seed=1,
        budget=cfg.section("budget"),
        launch=cfg.section("launch"),
        device="cpu",
    )
    peek = next(
        json.loads(line[5:])
        for line in (tmp / "run/train.log").read_text().splitlines()
        if line.startswith("PEEK ")
    )
    return rec, peek, val, tmp


def test_nothing_else_in_the_temp_folder_is_reachable(peek_run):
    rec, _, _, tmp = peek_run
    temp = os.path.realpath(tempfile.gettempdir())
    roots = [*rec["isolation"]["read_roots"], *rec["isolation"]["write_roots"]]
    stray = [
        r
        for r in roots
        if (r == temp or r.startswith(temp + "/"))
        and not r.startswith(str(tmp / "train-phase") + "/")
        and not is_own_install(r)
    ]
    assert not stray, (
        f"rules reach other things in the temp folder (other runs stage their data there): {stray}"
    )


def test_the_run_completes_and_records_its_isolation(peek_run):
    rec, _, val, _ = peek_run
    iso = rec["isolation"]
    assert rec["status"] == "ok" and rec["steps"] == 3
    assert str(val[0].parent) in iso["protected"]
    if landlock_abi() == 0:
        assert not iso["landlock"] and any("Landlock" in w for w in iso["warnings"])
    else:
        assert iso["landlock"] and iso["verified"]
        assert iso["probe"] == {
            "validation_shard": REFUSED,
            "dataset_manifest": REFUSED,
            "train_view_manifest": "read",
        }


@pytest.mark.skipif(landlock_abi() == 0, reason="this kernel has no Landlock: nothing can deny the reads")
def test_no_validation_shard_could_be_read(peek_run):
    _, peek, val, _ = peek_run
    assert set(peek["told"]) == {*map(str, val), str(val[0].parent / "manifest.json")}
    assert all(v == REFUSED for v in peek["told"].values()), peek["told"]
    assert not any(v.startswith("read") for v in [*peek["walked"].values(), *peek["cmdline"].values()]), peek


def test_the_attempts_are_reported_with_the_submission_line(peek_run):
    rec, _, val, _ = peek_run
    attempts = rec["isolation"]["attempts"]  # what result.json records as phases.train.isolation.attempts
    by_path = {a["path"]: a for a in attempts}
    assert str(val[0]) in by_path and by_path[str(val[0])]["event"] == "open"
    assert by_path[str(val[0])]["submission_frame"].startswith("train.py:")
    assert rec["isolation"]["attempts_from_submission"] >= len(val) + 1
    assert any(
        a["event"] == "os.scandir" and a["submission_frame"] for a in attempts
    )  # the walk around its data


def _trained_run(tmp_path: Path) -> Path:
    """A run folder holding the trained state a codec_peek pack reads (the fixture's tiny model, zeros)."""
    import torch
    from safetensors.torch import save_file

    from harness.train.rank import STATE_FILE

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    save_file(
        {
            "emb.weight": torch.zeros(260, 8),
            "head.weight": torch.zeros(260, 8),
            "head.bias": torch.zeros(260),
        },
        str(run_dir / STATE_FILE),
        metadata={"model_config": json.dumps({"vocab_size": 260, "dim": 8})},
    )
    return run_dir


def test_a_custom_codec_encodes_sandboxed_and_on_the_clock(tiny_dataset, tmp_path):
    import shutil

    from harness.config import LaunchConfig
    from harness.run.train_phase import run_sealed_pack
    from harness.train.budget import BudgetConfig

    sub = tmp_path / "codec_peek"
    shutil.copytree(FIXTURES / "codec_peek", sub)
    val = sorted(tiny_dataset.glob("fineweb_val_*.bin"))
    (sub / "peek.txt").write_text("\n".join(map(str, val)))
    (sub / "sleep_s.txt").write_text("0.5")
    run_dir = _trained_run(tmp_path)
    budget = BudgetConfig(train_s=10.0, grace_s=1.0)
    rc, rec = run_sealed_pack(
        run_dir=run_dir,
        submission_dir=sub,
        data_root=tiny_dataset,
        budget=budget,
        launch=LaunchConfig(device="cpu"),
        train_time_s=10.8,
        cap_bytes=16_000_000,
        log_path=run_dir / "pack.log",
    )
    log = (run_dir / "pack.log").read_text()
    peek = json.loads(next(line[11:] for line in log.splitlines() if line.startswith("CODEC-PEEK ")))
    if landlock_abi():
        assert set(peek.values()) == {REFUSED}, peek
    assert rc == 0 and rec["encode_time_s"] >= 0.5 and (run_dir / "artifact.pgolf").is_file()
    assert (
        rec["status"] == "over_budget" and rec["train_plus_encode_s"] > 11.0
    )  # 10.8 s of training + 0.5 s of encode


def test_a_slow_codec_that_forges_its_pack_record_is_over_budget_and_illegal(tiny_dataset, tmp_path):
    """A codec slept past the time left and rewrote pack.json as its process exited (encode_time_s 0.01,
    bytes_model 2000, within the cap): the record's time was believed (ok), its bytes too. Now the time is the
    orchestrator's, from the pack's own line before codec.py to the exit, and every byte figure is measured
    from the file on disk and the staged code: the record is compared, and a disagreement names both."""
    import shutil

    from harness.config import LaunchConfig
    from harness.run.pipeline import measure_pack
    from harness.run.train_phase import run_sealed_pack
    from harness.train.budget import BudgetConfig

    sub = tmp_path / "codec_forge"
    shutil.copytree(FIXTURES / "codec_peek", sub)
    (sub / "sleep_s.txt").write_text("2.0")
    (sub / "forge.txt").write_text("yes")
    run_dir = _trained_run(tmp_path)

    def sealed_pack() -> tuple[int | None, dict]:  # 1.5 s left: the 2 s sleep is past it
        return run_sealed_pack(
            run_dir=run_dir,
            submission_dir=sub,
            data_root=tiny_dataset,
            budget=BudgetConfig(train_s=10.0, grace_s=1.0),
            launch=LaunchConfig(device="cpu"),
            train_time_s=9.5,
            cap_bytes=16_000_000,
            log_path=run_dir / "pack.log",
        )

    rc, rec = sealed_pack()  # the forged record says 0.01 s
    assert rc == 0 and rec["reported_encode_time_s"] == "0.01", rec
    assert rec["encode_clock_from"] == "the pack's line before codec.py"
    assert rec["encode_time_s"] >= 2.0 and rec["status"] == "over_budget", rec
    assert "0.01" in rec["detail"] and "by the harness's clock" in rec["detail"]
    pack = json.loads((run_dir / "pack.json").read_text())
    assert pack["bytes_model"] == 2000 and pack["within_cap"] is True  # what it claims

    # the same slow codec deleting its record instead: the clock was checked only beside a pack.json, so the
    # run ended `error` (the pack wrote no record) where its time made it over_budget
    (sub / "forge.txt").unlink()
    (sub / "suppress.txt").write_text("yes")
    (run_dir / "pack.json").unlink()
    rc, rec = sealed_pack()
    assert not (run_dir / "pack.json").exists() and rec["reported_encode_time_s"] is None
    assert rec["encode_time_s"] >= 2.0 and rec["status"] == "over_budget", rec
    measured, disagree = measure_pack(pack, run_dir / "artifact.pgolf", sub, 16_000_000)
    assert measured["bytes_model"] == (run_dir / "artifact.pgolf").stat().st_size != 2000
    assert any(d.startswith("bytes_model 2000 in the record, ") for d in disagree), disagree
