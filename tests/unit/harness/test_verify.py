"""`pgolf verify`: an untouched result is verified; one flipped artifact byte, a changed code file or an
edited number fails, with the difference printed. Only verify sets the verification status."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from harness.records.verify import VerifyConfig, result_digest, verify_result
from tests.conftest import REPO
from tests.unit.scoring.test_eval_support import _one_thread, make_run, write_submission  # noqa: F401 (fixture)


@pytest.fixture()
def run(tmp_path, tiny_dataset):
    folder = write_submission(tmp_path / "sub")
    ledger = tmp_path / "runs" / "ledger.jsonl"
    result = make_run(tmp_path / "runs" / "r1", folder, tiny_dataset, ledger=ledger)
    return tmp_path / "runs" / "r1", folder, ledger, result


def test_untouched_result_is_verified_and_recorded(run):
    run_dir, _, ledger, result = run
    assert result["phases"]["score"]["scoring_workers"] == 1  # what a re-score takes
    rec = verify_result(run_dir)
    assert rec["status"] == "verified", rec["differences"]
    names = {c["name"] for c in rec["checks"]}
    assert {
        "artifact sha256 (receipt)",
        "code model.py sha256",
        "data manifest sha256",
        "tokenizer sha256",
        "re-score val_bpb (tolerance 1e-06)",
        "re-score probes passed",
    } <= names
    written = json.loads((run_dir / "result.json").read_text())
    assert written["verification"] == "verified"
    assert result_digest(written) == result_digest(result) == rec["result_sha256"]  # the ledger line's key
    lines = [json.loads(x) for x in ledger.read_text().splitlines()]
    assert [x["format"] for x in lines] == ["pg-result", "pg-verification"]
    assert lines[1]["result_sha256"] == result_digest(lines[0])


def test_one_flipped_artifact_byte_fails_with_the_differences_printed(run):
    run_dir, *_ = run
    artifact = run_dir / "artifact.pgolf"
    data = bytearray(artifact.read_bytes())
    data[len(data) // 2] ^= 0x01
    artifact.write_bytes(bytes(data))
    proc = subprocess.run(
        [sys.executable, "-m", "harness.cli", "verify", str(run_dir)],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 1, proc.stderr
    assert "FAILED" in proc.stdout
    assert "DIFF artifact sha256 (receipt)" in proc.stdout
    assert "DIFF re-score in a fresh process" in proc.stdout and "payload does not match" in proc.stdout
    assert json.loads((run_dir / "result.json").read_text())["verification"] == "failed"


def test_changed_code_and_edited_numbers_fail(run, tiny_dataset):
    run_dir, folder, _, _ = run
    (folder / "model.py").write_text((folder / "model.py").read_text() + "\n# edited after packing\n")
    rec = verify_result(run_dir, cfg=VerifyConfig(), write=False)
    diffs = {d["name"] for d in rec["differences"]}
    assert "code model.py sha256" in diffs and "bytes_code" in diffs
    assert rec["status"] == "failed"


@pytest.mark.long
def test_an_edited_score_fails_the_rescore(run):
    run_dir, *_ = run
    res = json.loads((run_dir / "result.json").read_text())
    res["val_bpb"] -= 0.01
    (run_dir / "result.json").write_text(json.dumps(res))
    rec = verify_result(run_dir, write=False)
    diff = next(d for d in rec["differences"] if d["name"].startswith("re-score val_bpb"))
    assert diff["expected"] == pytest.approx(diff["actual"] - 0.01)


def test_missing_inputs_are_differences_or_clear_errors(run, tmp_path):
    run_dir, *_ = run
    res = json.loads((run_dir / "result.json").read_text())
    res["provenance"]["data_dir"] = str(tmp_path / "moved-away")
    (run_dir / "result.json").write_text(json.dumps(res))
    rec = verify_result(run_dir, write=False)
    assert rec["status"] == "failed"
    assert "data folder" in {d["name"] for d in rec["differences"]}
    with pytest.raises(FileNotFoundError, match="--submission"):
        verify_result(run_dir, submission=tmp_path / "nowhere")
    with pytest.raises(FileNotFoundError, match="no result"):
        verify_result(tmp_path / "empty")


def test_a_harness_failure_is_error_keeping_the_verdict_and_a_batch_takes_any_folder(run):
    """A harness failure in verify (here: a device this machine lacks) wrote `failed` over a good result. Now
    it is `error`, one line, its output in verify_error.log, and result.json and the ledger keep the earlier
    verdict; a batch takes a folder without a result and an over_budget result, one line each, with relative
    paths (the relative `pgolf verify runs/X` of a good result: tests/e2e/test_pipeline.py)."""
    import shutil

    from harness.records.verify import Check, commit_verdict, verification_record

    run_dir, _, ledger, result = run
    earlier = verification_record(
        result, run_dir, None, None, VerifyConfig(), [Check("c", True, 1, 1)], wall_s=0.0
    )
    commit_verdict(
        run_dir / "result.json", json.loads((run_dir / "result.json").read_text()), earlier, ledger
    )
    root = run_dir.parent.parent  # the runs' parent: commands name runs/r1
    (root / "runs" / "empty").mkdir()
    over = root / "runs" / "over"
    shutil.copytree(run_dir, over)
    res = json.loads((over / "result.json").read_text())
    res.update(status="over_budget", val_bpb=None, val_loss=None)
    res["phases"].pop("score")
    (over / "result.json").write_text(json.dumps(res))
    proc = subprocess.run(
        [sys.executable, "-m", "harness.cli", "verify", "runs/r1", "runs/empty", "runs/over", "--device", "cuda"],
        capture_output=True, text=True, cwd=root, timeout=300, check=False,
        env={**__import__("os").environ, "PYTHONPATH": str(REPO)},
    )  # fmt: skip
    out = proc.stdout
    assert proc.returncode == 1, out + proc.stderr  # runs/over failed (no score); nothing crashed
    assert f"verify {run_dir}: ERROR (the harness could not verify it: the re-score failed (input):" in out, (
        out
    )
    assert "no CUDA device" in out and "the earlier verdict stands (verified)" in out
    assert f"verify {root / 'runs' / 'empty'}: ERROR (the harness could not verify it: no result at" in out
    assert f"verify {over}: FAILED" in out and "DIFF result has a score" in out
    assert "0 of 3 verified, 1 failed, 2 not verified" in out
    assert json.loads((run_dir / "result.json").read_text())["verification"] == "verified"
    verdicts = [json.loads(x) for x in ledger.read_text().splitlines() if '"pg-verification"' in x]
    assert [v["status"] for v in verdicts if v["run_dir"] == str(run_dir)] == ["verified"]
    assert "no CUDA device" in (run_dir / "verify_error.log").read_text()


def test_the_rescore_takes_as_many_scoring_workers_as_the_score_had(tmp_path):
    """A group's bits depend on its size (score-first adaptation over K workers): verify re-scores with the K the
    score record names (the scorer records it: test_untouched_result_is_verified_and_recorded), one for a record
    from before the count, or the official's --scoring-workers."""
    from harness.records.verify import rescore_request
    from tests.unit.harness.test_isolation_required import RESCORED as score

    result = {"track": "smoke", "phases": {"score": {**score, "scoring_workers": 8}}}

    def request(res, cfg=None):
        p = tmp_path
        return rescore_request(res, p / "a.pgolf", p, p, p / "o.json", p, cfg or VerifyConfig())

    assert request(result).scoring_workers == 8
    argv = request(result).to_argv()
    assert argv[argv.index("--scoring-workers") + 1] == "8"
    assert request(result, VerifyConfig(scoring_workers=2)).scoring_workers == 2
    # the submitter's file: never more than a node's 8 on its word, nor a crash
    for hostile, k in ((1000, 8), ("8", 1), (True, 1), (-3, 1), (None, 1)):
        result["phases"]["score"]["scoring_workers"] = hostile
        assert request(result).scoring_workers == k
    assert request(result, VerifyConfig(scoring_workers=16)).scoring_workers == 16  # the official's word
    del result["phases"]["score"]["scoring_workers"]
    assert request(result).scoring_workers == 1
    with pytest.raises(ValueError, match="--scoring-workers must be >= 1"):
        VerifyConfig(scoring_workers=0)
