"""`pgolf verify RUN_DIR... --executor local|slurm`: one job per result through submitit, the verdicts
gathered into the ledger on the submitting side; a tampered result ends failed, a forged job report
is refused.

The Slurm test runs against a real single-node Slurm (Debian's slurmctld, slurmd and munge), which
scripts/slurm_single_node.sh configures and starts; it skips, with the script's reason, where that
cannot happen (not root, packages missing, a foreign slurm.conf). Run folders are made cheaply: one
pack + score of a tiny model (tests/unit/scoring/test_eval_support.py: make_run), copied.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO
from tests.unit.scoring.test_eval_support import make_run, write_submission

SCRIPT = REPO / "scripts" / "slurm_single_node.sh"
SLURM_DIR = Path(os.environ.get("PGOLF_SLURM_DIR", "/var/tmp/pgolf-slurm"))


@pytest.fixture(scope="module")
def one_run(tmp_path_factory, tiny_dataset) -> Path:
    root = tmp_path_factory.mktemp("verify_exec")
    folder = write_submission(root / "sub")
    run = root / "made" / "r0"
    make_run(run, folder, tiny_dataset)
    return run


def run_folders(one_run: Path, where: Path, n: int, tamper: int | None) -> list[Path]:
    """n copies of one run folder (each a result to verify); the `tamper`-th has its val_bpb edited."""
    out = []
    for i in range(n):
        d = where / f"r{i}"
        shutil.copytree(one_run, d)
        if i == tamper:
            res = json.loads((d / "result.json").read_text())
            res["val_bpb"] -= 0.01
            (d / "result.json").write_text(json.dumps(res))
        out.append(d)
    return out


def pgolf_verify(folders: list[Path], *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "harness.cli", "verify", *map(str, folders), *args],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=env,
        timeout=900,
        check=False,
    )


def ledger_verdicts(ledger: Path) -> dict[str, dict]:
    lines = [json.loads(x) for x in ledger.read_text().splitlines()]
    return {Path(r["run_dir"]).name: r for r in lines if r["format"] == "pg-verification"}


def check_outcome(proc, folders, ledger, kind):
    assert proc.returncode == 1, proc.stdout + proc.stderr  # one of them failed
    verdicts = ledger_verdicts(ledger)
    n = len(folders)  # the last one is the tampered one
    assert {k: v["status"] for k, v in verdicts.items()} == {
        f"r{i}": "verified" if i < n - 1 else "failed" for i in range(n)
    }
    for name, rec in verdicts.items():
        assert rec["executor"]["kind"] == kind and rec["executor"]["job_id"]
        written = json.loads((ledger.parent / name / "result.json").read_text())
        assert written["verification"] == rec["status"]
        assert json.loads((ledger.parent / name / "verification.json").read_text()) == rec
    diffs = [d["name"] for d in verdicts[f"r{n - 1}"]["differences"]]
    assert diffs == ["re-score val_bpb (tolerance 1e-06)"], diffs  # the job's re-score caught the edit
    assert f"{n - 1} of {n} verified, 1 failed" in proc.stdout
    assert "DIFF re-score val_bpb" in proc.stdout
    for f in folders:
        assert f"verify {f}: " in proc.stdout
    return verdicts


@pytest.mark.long
@pytest.mark.slow
def test_local_executor_verifies_each_and_fails_the_tampered_one(one_run, tmp_path):
    folders = run_folders(one_run, tmp_path / "runs", 2, tamper=1)
    ledger = tmp_path / "runs" / "ledger.jsonl"
    proc = pgolf_verify(folders, "--executor", "local", "--ledger", str(ledger))
    verdicts = check_outcome(proc, folders, ledger, "local")
    assert all(v["executor"]["state"] == "FINISHED" for v in verdicts.values())
    assert "submitted local job" in proc.stderr and "verify (local)" in proc.stderr  # the progress


@pytest.mark.long  # a real Slurm, like the file's other tests
def test_a_forged_job_report_is_a_failed_verdict(one_run, tmp_path):
    """The job says "verified" for a result whose val_bpb was edited: the submitting side refuses it."""
    from harness.records.executors import ExecutorConfig, Item, JobResources, finish
    from harness.records.verify import VerifyConfig, read_result, result_digest

    (run,) = run_folders(one_run, tmp_path / "runs", 1, tamper=0)
    result_path, run_dir, result = read_result(run)
    honest = json.loads((one_run / "result.json").read_text())
    from harness.records.verify import verify_result

    forged = verify_result(one_run, write=False)  # the untouched twin's verified record...
    forged.update(result_sha256=result_digest(result), run_dir=str(run_dir))  # ...passed off as this one's
    assert forged["status"] == "verified" and honest["val_bpb"] != result["val_bpb"]
    (run_dir / "verification.json").write_text(json.dumps(forged))

    class ForgingJob:
        job_id = "4242"
        state = "COMPLETED"

        def result(self):
            return json.dumps(forged)

    item = Item(
        path=str(run),
        result_path=result_path,
        run_dir=run_dir,
        digest=result_digest(result),
        resources=JobResources(cpus=1, gpus=0, time_min=30, mem_gb=None),
        job=ForgingJob(),
    )
    ledger = tmp_path / "runs" / "ledger.jsonl"
    rec = finish(item, ExecutorConfig(kind="slurm"), VerifyConfig(), None, None, ledger)
    assert rec["status"] == "failed"
    (diff,) = rec["differences"]
    assert diff["name"] == "verification job"
    assert "slurm job 4242 (COMPLETED)" in diff["actual"]
    assert "re-score checks do not follow from the re-score's numbers: re-score val_bpb" in diff["actual"]
    assert ledger_verdicts(ledger)["r0"]["status"] == "failed"
    assert json.loads((run_dir / "result.json").read_text())["verification"] == "failed"


def finish_with(job, run: Path, ledger: Path, digest: str | None = None) -> dict:
    from harness.records.executors import ExecutorConfig, Item, JobResources, finish
    from harness.records.verify import VerifyConfig, read_result, result_digest

    result_path, run_dir, result = read_result(run)
    item = Item(
        path=str(run),
        result_path=result_path,
        run_dir=run_dir,
        digest=digest or result_digest(result),
        resources=JobResources(cpus=1, gpus=0, time_min=30, mem_gb=None),
        job=job,
    )
    return finish(item, ExecutorConfig(kind="slurm"), VerifyConfig(), None, None, ledger)


def test_a_job_that_died_is_no_verdict_and_a_result_edited_meanwhile_is_a_failed_one(one_run, tmp_path):
    from submitit.core.utils import UncompletedJobError

    r0, r1 = run_folders(one_run, tmp_path / "runs", 2, tamper=None)
    ledger = tmp_path / "runs" / "ledger.jsonl"

    class DeadJob:
        job_id = "77"
        state = "TIMEOUT"

        def result(self):
            raise UncompletedJobError("Job 77 (task: 0) has not produced any output (state: TIMEOUT)")

    before = (r0 / "result.json").read_text()
    rec = finish_with(DeadJob(), r0, ledger)  # a harness failure, not the entry's: error, nothing written
    assert rec["status"] == "error" and rec["executor"]["state"] == "TIMEOUT"
    assert rec["detail"].startswith("slurm job 77 (TIMEOUT) ended without a record: Job 77")
    assert (r0 / "result.json").read_text() == before and "Job 77" in (r0 / "verify_error.log").read_text()

    class HonestJob:
        job_id = "78"
        state = "COMPLETED"

        def result(self):
            raise AssertionError("never read: the result changed first")

    rec = finish_with(HonestJob(), r1, ledger, digest="0" * 64)  # the digest when it was submitted
    assert rec["differences"][-1]["actual"].endswith("result.json changed while its verification ran")
    assert {k: v["status"] for k, v in ledger_verdicts(ledger).items()} == {"r1": "failed"}


@pytest.fixture(scope="module")
def slurm() -> dict[str, str]:
    """A running single-node Slurm (started here when it is not already up); the env to submit from."""
    if not SCRIPT.is_file() or shutil.which("bash") is None:
        pytest.skip("scripts/slurm_single_node.sh or bash missing")
    env = dict(os.environ, PATH=f"{SLURM_DIR / 'bin'}:{os.environ.get('PATH', '')}")
    status = subprocess.run(["bash", str(SCRIPT), "status"], capture_output=True, text=True, check=False)
    started_here = status.returncode != 0
    if started_here:
        proc = subprocess.run(
            ["bash", str(SCRIPT), "start"], capture_output=True, text=True, timeout=300, check=False
        )
        if proc.returncode == 3:
            pytest.skip(proc.stderr.strip().splitlines()[-1])
        assert proc.returncode == 0, proc.stdout + proc.stderr
    yield env
    if started_here:
        subprocess.run(["bash", str(SCRIPT), "stop"], capture_output=True, check=False)


@pytest.mark.long
@pytest.mark.slow
def test_slurm_executor_verifies_each_on_its_own_job(one_run, tmp_path, slurm):
    # the jobs read and write these folders from the node: a path every job can see (it is one node)
    folders = run_folders(one_run, tmp_path / "runs", 3, tamper=2)
    ledger = tmp_path / "runs" / "ledger.jsonl"
    proc = pgolf_verify(
        folders, "--executor", "slurm", "--ledger", str(ledger), "--time-min", "20", env=slurm
    )
    verdicts = check_outcome(proc, folders, ledger, "slurm")
    ids = [v["executor"]["job_id"] for v in verdicts.values()]
    assert all(v["executor"]["resources"]["cpus"] == 1 for v in verdicts.values())
    sacct = subprocess.run(
        ["sacct", "-o", "JobID,JobName,State", "--parsable2", "--noheader", *[f"-j{i}" for i in ids]],
        capture_output=True,
        text=True,
        env=slurm,
        check=True,
    )
    states = {line.split("|")[0]: line.split("|")[1:] for line in sacct.stdout.splitlines()}
    # every job ran to completion: the failed verdict is the re-score's, not the job's
    assert {i: states[i] for i in ids} == {i: ["pgolf-verify", "COMPLETED"] for i in ids}, sacct.stdout
    assert all(v["executor"]["state"] == "COMPLETED" for v in verdicts.values())
    for i in ids:
        assert f"submitted slurm job {i}" in proc.stderr
