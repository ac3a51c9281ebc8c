"""`pgolf reproduce` and `pgolf queue` end to end on tiny entries (tests/fixtures/entries.py): an honest
entry, one whose claim was edited, one whose submission.json is broken, one that fails the code check and
one that hunts for the validation data. The queue runs on the local executor, is killed (SIGTERM) after its
first job ends and restarted: the finished job is not run again (its job id is in the ledger once), and
every entry ends with its verdict. A real single-node Slurm runs the same queue when it can start here.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import REPO
from tests.e2e.test_verify_slurm import slurm  # noqa: F401 - the fixture: a running single-node Slurm
from tests.fixtures.entries import make_entries

SEEDS = (1, 2)


@pytest.fixture(scope="module")
def entries(tmp_path_factory, tiny_dataset) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("queue")
    make_entries(root / "entries", tiny_dataset, root / "work", honest={"a": 1}, seeds=SEEDS)
    return root / "entries", tiny_dataset


def pgolf(*args: str, env: dict | None = None, timeout: float = 1200) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "harness.cli", *args], capture_output=True, text=True, cwd=REPO,
                          env=env, timeout=timeout, check=False)  # fmt: skip


def ledger_lines(ledger: Path, fmt: str) -> list[dict]:
    return [r for r in map(json.loads, ledger.read_text().splitlines()) if r.get("format") == fmt]


def verdicts(ledger: Path) -> dict[str, dict]:
    return {Path(r["entry_dir"]).name.split("_", 1)[1]: r for r in ledger_lines(ledger, "pg-reproduction")}


EXPECTED = {"honest_a0": "reproduced", "edited": "not_reproduced", "broken": "not_reproduced",
            "lint": "not_reproduced", "peeker": "not_reproduced"}  # fmt: skip


def check_verdicts(ledger: Path) -> dict[str, dict]:
    v = verdicts(ledger)
    assert {k: r["verdict"] for k, r in v.items()} == EXPECTED
    assert [d["name"] for d in v["broken"]["differences"]] == ["triage entry"]
    assert v["broken"]["submission"]["date"] == "2026-03-02"  # read from the JSON that failed its schema
    assert "author" in v["broken"]["differences"][0]["actual"]
    assert [d["name"] for d in v["lint"]["differences"]] == ["triage lint"]
    names = {d["name"] for d in v["edited"]["differences"]}
    assert {"seed 1 steps (within 10%)", "seed 1 train_time_s (within 50% + 5 s, budget 600)"} <= names
    assert any(n.startswith("seed 1 val_bpb") for n in names)
    peek = {d["name"]: d["actual"] for d in v["peeker"]["differences"]}
    assert peek["seed 1 run"] == "error: train: torchrun exited with status 1"
    train_log = Path(v["peeker"]["reproduced"][0]["run_dir"]) / "train.log"
    assert "RuntimeError: the validation shards are out of reach" in train_log.read_text()  # its hunt failed
    assert peek["seed 1 claim ran this folder's code"] == "differs in ['train.py']"
    return v


@pytest.mark.long
@pytest.mark.slow
def test_reproduce_names_what_an_edited_claim_changed(entries, tmp_path):
    root, data = entries
    r = pgolf("reproduce", str(root / "2026-03-01_edited"), "--data", str(data), "--out", str(tmp_path / "r"))
    assert r.returncode == 1, r.stdout + r.stderr
    head = r.stdout.splitlines()[0]
    assert "NOT REPRODUCED; claimed mean" in head and "seeds [1, 2]" in head
    assert "DIFF seed 1 steps (within 10%): result says 400, found " in r.stdout
    assert "DIFF seed 1 train_time_s (within 50% + 5 s, budget 600): result says 30.0, found" in r.stdout
    assert "DIFF seed 1 val_bpb (within" in r.stdout and "result says 2.0, found" in r.stdout
    assert "ok   seed 2 val_bpb" in r.stdout  # the untouched seed reproduces exactly
    (rec,) = ledger_lines(tmp_path / "r" / "ledger.jsonl", "pg-reproduction")
    assert rec["verdict"] == "not_reproduced" and rec["format_version"] == 1


@pytest.mark.long
@pytest.mark.slow
def test_queue_killed_after_a_job_resumes_without_rerunning_it(entries, tmp_path):
    root, data = entries
    out, ledger = tmp_path / "q", tmp_path / "q" / "ledger.jsonl"
    args = ["-m", "harness.cli", "queue", str(root), "--executor", "local", "--max-parallel", "1", "--data",
            str(data), "--out", str(out), "--poll-s", "0.5"]  # fmt: skip
    proc = subprocess.Popen([sys.executable, *args], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)  # fmt: skip
    deadline = time.monotonic() + 900
    while time.monotonic() < deadline and proc.poll() is None:
        if ledger.is_file() and ledger_lines(ledger, "pg-repro-run"):
            break
        time.sleep(0.5)
    assert proc.poll() is None, proc.communicate()
    proc.send_signal(signal.SIGTERM)
    _, err1 = proc.communicate(timeout=120)
    assert proc.returncode == 130, err1
    assert "interrupted (SIGTERM)" in err1 and "run the same command again to resume" in err1
    (first,) = ledger_lines(ledger, "pg-repro-run")
    submitted_before = ledger_lines(ledger, "pg-queue-job")
    assert first["status"] == "ok" and first["job_id"] in {j["job_id"] for j in submitted_before}

    r = subprocess.run(
        [sys.executable, *args], cwd=REPO, capture_output=True, text=True, timeout=1200, check=False
    )
    assert r.returncode == 0, r.stdout + r.stderr
    jobs = ledger_lines(ledger, "pg-queue-job")
    again = jobs[len(submitted_before) :]
    key = (first["entry_digest"], first["seed"])
    assert key not in {(j["entry_digest"], j["seed"]) for j in again}  # the finished job was not run again
    assert (
        f"done {first['entry_key']} seed {first['seed']}: job {first['job_id']} (from the ledger)" in r.stdout
    )
    runs = ledger_lines(ledger, "pg-repro-run")
    assert [x["job_id"] for x in runs].count(first["job_id"]) == 1
    assert (
        len({(x["entry_digest"], x["seed"]) for x in runs}) == len(runs) == 6
    )  # 3 entries x 2 seeds, once each
    check_verdicts(ledger)
    (s1, s2) = ledger_lines(ledger, "pg-queue-summary")
    assert s1["interrupted"] == "SIGTERM" and s2["interrupted"] is None
    assert s2["verdicts"] == {"reproduced": 1, "not_reproduced": 4, "could_not_run": 0, "pending": 0}
    assert (
        s2["jobs_skipped_from_ledger"] >= 1 and s2["gpu_hours"] == 0.0 and s2["triage_entries_per_s"] is None
    )
    assert "record chain (1): honest_a0-" in r.stdout  # the only reproduced entry sets the frontier
    assert "triage ok   honest_a0-" in r.stdout and "(from the ledger)" in r.stdout


def test_slurm_asked_where_none_is_one_line(tmp_path):
    (tmp_path / "entries").mkdir()
    env = dict(os.environ, PATH=str(Path(sys.executable).parent))  # python, no sbatch
    r = pgolf("queue", str(tmp_path / "entries"), "--executor", "slurm", env=env, timeout=60)
    assert r.returncode == 2 and r.stdout == ""
    (line,) = r.stderr.strip().splitlines()
    assert line.startswith(
        "error: --executor slurm: no Slurm answers on this machine (sbatch not found on PATH)"
    )
    assert "scripts/slurm_single_node.sh start" in line and "--executor local" in line


@pytest.mark.long
@pytest.mark.slow
def test_queue_on_a_real_single_node_slurm(entries, tmp_path, slurm):  # noqa: F811
    root, data = entries
    out = tmp_path / "qs"
    r = pgolf("queue", str(root), "--executor", "slurm", "--cpus", "1", "--time-min", "20", "--data", str(data),
              "--out", str(out), env=slurm)  # fmt: skip
    assert r.returncode == 0, r.stdout + r.stderr
    ledger = out / "ledger.jsonl"
    check_verdicts(ledger)
    ids = [j["job_id"] for j in ledger_lines(ledger, "pg-queue-job")]
    assert len(ids) == 6 and all("_" in i for i in ids)  # one job array: ARRAYID_TASK
    (summary,) = ledger_lines(ledger, "pg-queue-summary")
    assert sorted(summary["job_states"]) == sorted(ids)
    # sacct over the completion log names an array by its first id only; the states the queue saw instead
    assert all(
        st == "COMPLETED" or st.endswith("the job's result is written)")
        for st in summary["job_states"].values()
    )
    assert "submitted slurm job " in r.stderr and summary["executor"] == "slurm"


@pytest.mark.long
@pytest.mark.slow
def test_a_train_py_that_fixes_its_own_seed_is_not_reproduced_on_fresh_seeds(tiny_dataset, tmp_path):
    """The seed-lottery entry, really trained: tiny_lm whose train() first calls torch.manual_seed(1337) (the best
    of many tried at home). Two fresh seeds under the official's salt train the same weights, so the same artifact,
    and the verdict names the pair instead of reading one run as two samples."""
    import shutil

    from tests.fixtures.entries import TINY, set_meta

    entry = tmp_path / "entries" / "2026-04-01_lottery"
    shutil.copytree(TINY, entry, ignore=shutil.ignore_patterns("__pycache__"))
    train = entry / "train.py"
    text = train.read_text(encoding="utf-8")
    train.write_text(text.replace("    hp = Hparams(**ctx.hparams)\n",
                                  "    torch.manual_seed(1337)\n    hp = Hparams(**ctx.hparams)\n", 1))  # fmt: skip
    assert "torch.manual_seed(1337)" in train.read_text(encoding="utf-8")
    set_meta(entry, claimed={"val_bpb": 3.0})
    salt = Path.home() / f".pgolf-test-salt-{os.getpid()}"
    salt.write_text("official secret\n")
    salt.chmod(0o600)
    try:
        r = pgolf("reproduce", str(entry), "--seeds", "2", "--seed-salt-file", str(salt), "--data",
                  str(tiny_dataset), "--out", str(tmp_path / "r"), "--json")  # fmt: skip
    finally:
        salt.unlink()
    assert r.returncode == 1, r.stdout + r.stderr
    rec = json.loads(r.stdout)
    a, b = rec["seeds"]
    runs = rec["reproduced"]
    assert [x["status"] for x in runs] == ["ok", "ok"] and a != b
    assert (
        runs[0]["artifact_sha256"] == runs[1]["artifact_sha256"]
        and runs[0]["val_loss"] == runs[1]["val_loss"]
    )
    same = [d for d in rec["differences"] if d["name"] == f"seeds {a} and {b} gave different runs"]
    assert same and same[0]["actual"].startswith(
        "the same artifact (sha256): the seed did not reach the run ("
    )
