"""Attacks on `pgolf queue` by an entrant whose folder is one of many it runs: the queue's state (its ledger), its
job folders and what its own, unsandboxed process reads. The queue runs here in this process on an inline
executor (`Inline`: each job's function called at submit time) with training replaced by a record that names
the run folder it was given, so a test of the queue's bookkeeping costs no run."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from harness.records import queue
from harness.records.executors import ExecutorConfig
from harness.records.reproduce import RUN_FORMAT, load_entry
from scoring.statuses import Status

TINY = Path(__file__).resolve().parents[2] / "fixtures" / "submissions" / "tiny_lm"


class Handle:
    def __init__(self, job_id: int, value: str) -> None:
        self.job_id, self._value, self.state = job_id, value, "FINISHED"

    def done(self) -> bool:
        return True

    def result(self) -> str:
        return self._value

    def cancel(self, check: bool = False) -> None:
        pass


class Inline:
    """submitit's executor interface, each job run at once in this process."""

    def __init__(self) -> None:
        self.n = 0

    def update_parameters(self, **_: Any) -> None:
        pass

    def submit(self, fn: Any, arg: str) -> Handle:
        self.n += 1
        return Handle(1000 + self.n, fn(arg))


def fake_seed(task: dict[str, Any]) -> dict[str, Any]:
    """What reproduce_seed returns for a run that trained to 1.5 bits/byte, a little off by its seed (two seeds
    with one score are one run: reproduce.py same_runs); a run folder already used is the pipeline's refusal
    (harness/run/pipeline.py: a non-empty run folder is never written into again)."""
    run_dir = Path(task["run_dir"])
    rec = {"format": RUN_FORMAT, "format_version": 1, "entry_key": task["entry_key"],
           "entry_digest": task["entry_digest"], "seed": task["seed"], "run_dir": str(run_dir), "track": "smoke",
           "job_id": task.get("job_id"), "started_unix_s": 0.0, "ended_unix_s": 1.0, "job_wall_s": 1.0}  # fmt: skip
    if run_dir.exists():
        return {
            **rec,
            "status": Status.ERROR,
            "detail": "not run: run folder already exists",
            "harness_failed": True,
        }
    run_dir.mkdir(parents=True)
    off = task["seed"] * 1e-12  # seeds below 2**31: under 0.0022, and two seeds never one score
    return {**rec, "status": Status.OK, "val_bpb": 1.5 + off, "val_loss": 1.0 + off}


@pytest.fixture
def run_inline(monkeypatch):
    from harness.commands import preflight

    real_checks = preflight.run_checks
    monkeypatch.setattr(queue, "_executor", lambda ecfg, folder: Inline())
    monkeypatch.setattr(queue, "reproduce_seed", fake_seed)
    monkeypatch.setattr(preflight, "run_checks", lambda root, preset, sandbox: [])

    def run(root: Path, out: Path, seeds: int | None = 2) -> dict[str, Any]:
        qcfg = queue.QueueConfig(root=root, out=out, ledger=out / "ledger.jsonl", seeds=seeds)
        return queue.run_queue(qcfg, ExecutorConfig(kind="local", max_parallel=1, poll_s=0.001))

    run.real_checks = real_checks  # type: ignore[attr-defined]
    return run


def entry(dest: Path, **meta: Any) -> Path:
    shutil.copytree(TINY, dest, ignore=shutil.ignore_patterns("__pycache__"))
    m = json.loads((dest / "submission.json").read_text())
    m.update({"claimed": {"val_bpb": 1.5}, **meta})
    (dest / "submission.json").write_text(json.dumps(m))
    return dest


def ledger(out: Path, fmt: str) -> list[dict[str, Any]]:
    return [r for r in map(json.loads, (out / "ledger.jsonl").read_text().splitlines()) if r["format"] == fmt]


def test_a_copy_of_another_entry_neither_shares_its_run_folders_nor_overwrites_its_verdict(
    run_inline, tmp_path
):
    """An entrant submits a byte-for-byte copy of a rival's folder. Same bytes were one digest: one entry key, so
    the copy's jobs were given the rival's run folders (its run refused there: 'already exists'), and the copy's
    `could_not_run` verdict, decided last, was the digest's latest, the one `pgolf chain` reads: the rival's
    reproduced entry left the chain (measured with real runs: chain 0 records, summary could_not_run 2)."""
    root = tmp_path / "entries"
    victim = entry(root / "2026-02-01_victim", name="victim")
    shutil.copytree(victim, root / "2026-02-09_copycat")
    summary = run_inline(root, tmp_path / "q")
    runs = ledger(tmp_path / "q", RUN_FORMAT)
    assert len(runs) == 4 and len({r["run_dir"] for r in runs}) == 4
    assert all(r["status"] == Status.OK for r in runs)
    verdicts = {Path(r["entry_dir"]).name: r["verdict"] for r in ledger(tmp_path / "q", "pg-reproduction")}
    assert verdicts == {"2026-02-01_victim": "reproduced", "2026-02-09_copycat": "reproduced"}
    assert summary["verdicts"]["reproduced"] == 2
    a, b = load_entry(victim), load_entry(root / "2026-02-09_copycat")
    assert a.digest != b.digest and a.key != b.key
    assert load_entry(victim).digest == a.digest  # stable: a resumed queue finds it in its ledger


def test_a_huge_initial_state_is_not_read_into_the_triage_process(monkeypatch, tmp_path):
    """The triage's estimate read the confined build's state file and packed it twice in the queue's own process:
    a model of 125 M zero parameters (a 0.5 GB state; int8_zlib packs it to 154 KB, so the check passed) took the
    official's `pgolf check` to 6.1 GB resident and 40 s; the child may fill 3/4 of the machine, so a state of a
    few GB kills the queue. Over the bound the estimate is skipped (a warning; the run's pack decides)."""
    from harness.commands import preflight
    from scoring.artifact import pack

    monkeypatch.setattr(preflight, "STATE_ESTIMATE_MAX_BYTES", 10_000, raising=False)
    read: list[str] = []
    real = pack.read_state
    monkeypatch.setattr(pack, "read_state", lambda p: read.append(str(p)) or real(p))
    checks = {c.name: c for c in preflight.run_checks(entry(tmp_path / "e"), None)}
    assert checks["model"].status == "ok"
    art = checks["artifact"]
    assert art.status == "warn" and read == []
    assert art.detail.startswith("not estimated: the initial state is ") and "over the 10,000" in art.detail
    assert art.facts["bytes_state"] > 10_000


PLANTED: list[str] = []


def _planted_ran(marker: str) -> tuple[str, str]:
    PLANTED.append(marker)
    return ("success", "{}")


class Planted:
    """A result pickle an entrant commits: unpickled, it runs `_planted_ran` (any callable) in the reader."""

    def __reduce__(self) -> tuple[Any, tuple[str]]:
        return (_planted_ran, ("ran in the official's process",))


def test_a_result_pickle_planted_beside_a_submitted_run_is_never_unpickled(monkeypatch, tmp_path):
    """`pgolf verify RUN --executor local|slurm` put submitit's folder at RUN/../.verify-jobs: for a run folder
    an entrant submitted (the `verified` evidence), inside their folder. A pickle committed there at
    JOB_ID/JOB_ID_0_result.pkl is unpickled by the official's process: on Slurm as soon as the job is submitted
    (done() is that file existing), locally when the job ends without a result of its own. Measured: 3,000 planted
    pickles over the next PIDs, the local job killed (as an out-of-memory kill would), and the entrant's payload ran
    as root in `pgolf verify` ("RCE in pid 18133 uid 0"). Each invocation now makes a fresh, empty jobs folder."""
    import pickle

    import submitit

    import harness.records.executors as ex
    from harness.records.verify import VerifyConfig

    run = tmp_path / "entry" / "runs" / "seed-1"
    run.mkdir(parents=True)
    planted = run.parent / ".verify-jobs"
    folders: list[Path] = []

    def make_executor(ecfg: ExecutorConfig, folder: Path) -> Any:
        folders.append(folder)
        return submitit.LocalExecutor(folder=folder / "%j")

    def submit(executor: Any, ecfg: ExecutorConfig, item: Any, task: dict[str, Any]) -> Any:
        executor.update_parameters(timeout_min=1)
        job = executor.submit(ex.os._exit, 9)  # the job dies without writing its result
        job._results_timeout_s = 0
        # where the entrant committed it (a PID guessed: the demo above covers 3,000 of them)
        (planted / job.job_id).mkdir(parents=True, exist_ok=True)
        (planted / job.job_id / f"{job.job_id}_0_result.pkl").write_bytes(pickle.dumps(Planted()))
        return job

    def finish(item: Any, *_: Any) -> dict[str, Any]:
        got, why = ex.job_outcome(item.job)
        return {"executor": {"job_id": item.job.job_id, "state": "DONE"}, "status": "error" if why else "?",
                "differences": [why]}  # fmt: skip

    monkeypatch.setattr(ex, "read_result", lambda p: (run / "result.json", run, {"phases": {"score": {}}}))
    monkeypatch.setattr(ex, "resolve_inputs", lambda *a: (None, None))
    monkeypatch.setattr(ex, "result_digest", lambda r: "d" * 64)
    monkeypatch.setattr(ex, "make_executor", make_executor)
    monkeypatch.setattr(ex, "submit", submit)
    monkeypatch.setattr(ex, "finish", finish)
    PLANTED.clear()
    (got,) = ex.run_verifications(
        [str(run)],
        submission=None,
        data=None,
        vcfg=VerifyConfig(),
        ecfg=ExecutorConfig(kind="local", poll_s=0.05),
        ledger=None,
    )
    assert PLANTED == []
    assert got["status"] == "error" and "has not produced any output" in got["differences"][0]
    (folder,) = folders
    assert folder.parent == planted and folder.name.startswith("20")


@pytest.mark.parametrize(
    ("field", "value"), [("val_tokens", 10**4000), ("val_bytes", 10**4000), ("val_bpb", 1.7e308)]
)
def test_a_claim_of_a_4000_digit_count_is_that_entrys_verdict_not_the_queues_end(
    run_inline, tmp_path, field, value
):
    """A claimed result whose val_tokens (or val_bytes) is a 4,001-digit integer (JSON allows it; Python parses up
    to 4,300 digits) reached `val_loss * val_tokens` in compare_claim: OverflowError in the queue's own process
    at that entry's verdict, every later entry undecided, and the same crash on every resumption (the entry's
    runs are in the ledger, so its verdict is decided again first). A count over 10**18 is now no claim's; so is
    a number over 1e15 (two claims of 1.7e308 bits per byte overflowed their mean, math.fsum, the same way)."""
    root = tmp_path / "entries"
    bad = entry(root / "2026-02-01_huge", name="huge")
    claim = {"format": "pg-result", "status": "ok", "track": "smoke", "val_bpb": 1.5, "val_loss": 1.0,
             "val_tokens": 100, "val_bytes": 96, field: value}  # fmt: skip
    for seed in (7, 8):
        (bad / "results" / f"seed-{seed}").mkdir(parents=True)
        (bad / "results" / f"seed-{seed}" / "result.json").write_text(json.dumps({**claim, "seed": seed}))
    entry(root / "2026-02-02_next", name="next")
    summary = run_inline(root, tmp_path / "q", seeds=None)  # the claimed seeds (7, 8), or 3 fresh ones
    verdicts = {Path(r["entry_dir"]).name: r for r in ledger(tmp_path / "q", "pg-reproduction")}
    assert set(verdicts) == {"2026-02-01_huge", "2026-02-02_next"}
    huge = verdicts["2026-02-01_huge"]
    if field == "val_bpb":  # no claimed result left: submission.json's claimed mean, fresh seeds
        assert huge["claimed"] == [] and huge["claimed_mean_bpb"] == 1.5 and len(huge["seeds"]) == 3
    else:
        assert huge["seeds"] == [7, 8] and [c[field] for c in huge["claimed"]] == [None, None]
    assert summary["verdicts"]["pending"] == 0


def test_scored_code_nested_past_the_parser_is_a_lint_failure_not_the_queues_end(
    run_inline, monkeypatch, tmp_path
):
    """A scored helper (util.py, linted like model.py) of `X = 1+1+...` (200,000 terms, 400 KB) made ast.parse
    raise RecursionError, which no check caught: `pgolf check` was a traceback and `pgolf queue` stopped at that
    entry's triage, every later entry untriaged, the same on every resumption (a triage that crashed is not in
    the ledger). It is now the entry's lint FAIL; any other exception of the checks is that entry's triage FAIL;
    and the same in model.py (parsed first by check_submission) is a one-line refusal of the folder."""
    from harness.commands import preflight
    from harness.submission import check_submission
    from scoring.codecheck import lint_scored_code
    from scoring.errors import SubmissionError

    real = run_inline.real_checks
    root = tmp_path / "entries"
    deep = entry(root / "2026-02-01_deep", name="deep")
    (deep / "util.py").write_text("X = 1" + "+1" * 200_000 + "\n")
    assert lint_scored_code(deep) == ["util.py:?: does not parse (nested too deeply for Python's parser)"]
    with (tmp_path / "model.py").open("w") as f:
        f.write((deep / "model.py").read_text() + "\nX = 1" + "+1" * 200_000 + "\n")
    shutil.copytree(deep, tmp_path / "deep_model")
    shutil.copy(tmp_path / "model.py", tmp_path / "deep_model" / "model.py")
    with pytest.raises(
        SubmissionError, match=r"model.py: does not parse \(nested too deeply for Python's parser\)"
    ):
        check_submission(tmp_path / "deep_model")
    entry(root / "2026-02-02_crash", name="crash")
    entry(root / "2026-02-03_next", name="next")

    def checks(root: Path, preset: Any, sandbox: str) -> list[Any]:
        if root.name.endswith("_crash"):
            raise RecursionError("maximum recursion depth exceeded")
        return real(root, preset) if root.name.endswith("_deep") else []

    monkeypatch.setattr(preflight, "run_checks", checks)
    run_inline(root, tmp_path / "q")
    verdicts = {Path(r["entry_dir"]).name: r for r in ledger(tmp_path / "q", "pg-reproduction")}
    assert {k: v["verdict"] for k, v in verdicts.items()} == {
        "2026-02-01_deep": "not_reproduced", "2026-02-02_crash": "not_reproduced", "2026-02-03_next": "reproduced"
    }  # fmt: skip
    assert [d["name"] for d in verdicts["2026-02-01_deep"]["differences"]] == ["triage lint"]
    (crash,) = verdicts["2026-02-02_crash"]["differences"]
    assert (
        crash["actual"]
        == "FAIL: the checks failed on this folder: RecursionError: maximum recursion depth exceeded"
    )


def test_an_entry_ground_to_anothers_key_does_not_get_its_run_folders(run_inline, monkeypatch, tmp_path):
    """The run folders are OUT/KEY/seed-S-aN and the key is the name and 48 bits of the digest: an entrant who
    copies a rival's name and claimed seeds and grinds submission.json until the digests share 12 hex digits
    (2^48 SHA-256, hours on one GPU) had the rival's run folders, so the rival's run was refused there
    (`could_not_run`) or the two shared one. Simulated here by a key without the digest."""
    from harness.records.reproduce import Entry

    monkeypatch.setattr(Entry, "key", property(lambda self: "same-key"))
    root = tmp_path / "entries"
    for folder, blurb in (("2026-02-01_rival", "mine"), ("2026-02-09_grinder", "nonce 1234567")):
        e = entry(root / folder, name="same", blurb=blurb)
        for seed in (7, 8):
            claim = {"format": "pg-result", "status": "ok", "track": "smoke", "val_bpb": 1.5, "seed": seed}
            (e / "results" / f"seed-{seed}").mkdir(parents=True)
            (e / "results" / f"seed-{seed}" / "result.json").write_text(json.dumps(claim))
    run_inline(root, tmp_path / "q", seeds=None)  # the claimed seeds, the same for both
    runs = ledger(tmp_path / "q", RUN_FORMAT)
    assert len(runs) == 4 and len({r["run_dir"] for r in runs}) == 4
    assert all(r["status"] == Status.OK for r in runs)
    assert [r["verdict"] for r in ledger(tmp_path / "q", "pg-reproduction")] == ["reproduced", "reproduced"]


def test_a_seed_salt_where_the_sandbox_reads_is_refused(monkeypatch, tmp_path):
    """The salt makes fresh seeds no entrant can compute, but the sandboxed training reads the system folders
    (/etc, /opt, ...) and the Python installation: a salt kept at /opt/.../seed-salt (mode 644; any mode where
    the sandbox runs as the official's uid, as it does without root) was read by an entrant's train.py in a
    `pgolf run` (its train.log printed it), and from then on every later entry's fresh seeds are theirs to
    compute and grind submission.json for. Such a path, or a link to one, is refused in one line."""
    from harness.records import reproduce as rp
    from isolation import landlock

    opt = tmp_path / "opt"
    (opt / "pgolf").mkdir(parents=True)
    (opt / "pgolf" / "seed-salt").write_text("official secret\n")
    (tmp_path / "home").mkdir()
    (tmp_path / "home" / "link").symlink_to(opt / "pgolf" / "seed-salt")
    (tmp_path / "home" / "seed-salt").write_text("official secret\n")
    (tmp_path / "home" / "seed-salt").chmod(0o600)
    monkeypatch.setattr(landlock, "SYSTEM_READ_ROOTS", (*landlock.SYSTEM_READ_ROOTS, str(opt)))
    for where in (opt / "pgolf" / "seed-salt", tmp_path / "home" / "link"):
        with pytest.raises(ValueError, match=f"lies beneath {opt}, which every sandboxed phase reads"):
            rp.read_seed_salt(str(where))
    with pytest.raises(ValueError, match="lies beneath /etc"):
        rp.read_seed_salt("/etc/hostname")
    assert rp.read_seed_salt(str(tmp_path / "home" / "seed-salt")) == "official secret"


def test_an_entry_whose_verdict_crashes_the_harness_never_stops_the_batch(run_inline, monkeypatch, tmp_path):
    """Two such crashes were found (a 4,000-digit claimed count, claims of 1.7e308): each stopped the queue at that
    entry's verdict, every entry after it undecided, on every resumption. Whatever the next one is, it is now that
    entry's `could_not_run` line, and the batch goes on."""
    from harness.records import reproduce as rp

    real = rp.verdict_of

    def verdict_of(entry: Any, *a: Any) -> dict[str, Any]:
        if entry.meta["name"] == "crash":
            raise OverflowError("intermediate overflow in fsum")
        return real(entry, *a)

    monkeypatch.setattr(queue, "verdict_of", verdict_of)
    root = tmp_path / "entries"
    entry(root / "2026-02-01_crash", name="crash")
    entry(root / "2026-02-02_next", name="next")
    summary = run_inline(root, tmp_path / "q")
    verdicts = {r["submission"]["name"]: r for r in ledger(tmp_path / "q", "pg-reproduction")}
    assert {k: v["verdict"] for k, v in verdicts.items()} == {"crash": "could_not_run", "next": "reproduced"}
    (diff,) = verdicts["crash"]["differences"]
    assert diff["actual"] == "the harness failed deciding it: OverflowError: intermediate overflow in fsum"
    assert len(verdicts["crash"]["seeds"]) == 2 and summary["verdicts"]["pending"] == 0
    run_inline(root, tmp_path / "q")  # resumed under the same flags: both verdicts reused, none decided again
    assert len(ledger(tmp_path / "q", "pg-reproduction")) == 2


def test_a_job_result_of_another_entry_is_not_this_entrys_run(run_inline, monkeypatch, tmp_path):
    """The queue took any pg-repro-run record submitit handed back as the run of the job it asked for: a result
    file left by another job of the same id (local ids are PIDs, recycled; a jobs folder reused on resumption) made
    one entry's seed the other's numbers. A record of another entry, seed or run folder is now a job that ended
    without one (run again on resumption)."""
    other = {"entry_digest": "0" * 64, "seed": 1, "run_dir": "/elsewhere/seed-1-a1"}

    def stale(task: dict[str, Any]) -> dict[str, Any]:
        return {**fake_seed(task), **other, "val_bpb": 0.5}  # a far better run, of someone else

    monkeypatch.setattr(queue, "reproduce_seed", stale)
    root = tmp_path / "entries"
    entry(root / "2026-02-01_mine", name="mine", claimed={"val_bpb": 0.5})
    summary = run_inline(root, tmp_path / "q")
    (verdict,) = ledger(tmp_path / "q", "pg-reproduction")
    assert verdict["verdict"] == "could_not_run" and summary["jobs_failed"] == 2
    failed = [r for r in ledger(tmp_path / "q", RUN_FORMAT) if r.get("job_failed")]
    assert len(failed) == 2 and all("of another job" in r["detail"] for r in failed)


def test_a_folder_named_as_an_earlier_entry_does_not_take_its_place_in_the_order(tmp_path):
    """The order file names entry folders, and an entrant names their folder. One named as an entry already in the
    ledger and the order file (merged since, its folder gone from this batch), with a backdated date, took that
    entry's place: it was compared first, set the frontier, and the genuine later record was refused against it.
    An order line now names the entry first decided under that name; a later one of the same name is unlisted."""
    from harness.records.chain import build_chain

    def rec(key: str, digest: str, folder: str, date: str, losses: list[float]) -> dict[str, Any]:
        runs = [{"seed": i, "status": "ok", "val_loss": x, "val_bpb": x / 1.386, "val_tokens": 1000,
                 "val_bytes": 2000, "tokenizer_sha256": "t" * 64} for i, x in enumerate(losses)]  # fmt: skip
        return {"format": "pg-reproduction", "format_version": 1, "entry_key": key, "entry_digest": digest,
                "entry_dir": f"/batch-{digest}/{folder}", "submission": {"name": key, "date": date},
                "track": "smoke", "verdict": "reproduced", "reproduced": runs, "differences": [], "seeds": [0, 1, 2],
                "fresh_seeds": {"chosen": "claimed"}}  # fmt: skip

    ledger_path = tmp_path / "ledger.jsonl"
    ledger_path.write_text("".join(json.dumps(x) + "\n" for x in (
        rec("alpha", "1", "2026-03-01_alpha", "2026-03-01", [5.0, 5.01, 5.02]),
        rec("beta", "2", "2026-03-05_beta", "2026-03-05", [4.0, 4.01, 4.02]),  # the real record after alpha
        rec("squatter", "3", "2026-03-01_alpha", "2026-01-01", [4.5, 4.51, 4.52]),  # a later PR, alpha's name
    )))  # fmt: skip
    order = {"2026-03-01_alpha": 0, "2026-03-05_beta": 1}
    chain = build_chain(ledger_path, track=None, rule="practised", order=order)
    assert [r["entry_key"] for r in chain["rows"]] == [
        "alpha",
        "beta",
        "squatter",
    ]  # was squatter, alpha, beta
    assert chain["records"] == ["alpha", "beta"]


def test_a_jobs_folder_linked_where_sandboxed_code_writes_is_refused(tmp_path):
    """`.verify-jobs` committed as a link beside a submitted run put submitit's folder wherever the entrant chose:
    /dev/shm, which a re-score's sandboxed model worker may write where no mount namespace is (several nodes, no
    root), so its code could write the result pickle this process unpickles. A linked or /dev/shm jobs folder
    is refused in one line."""
    from harness.records.executors import fresh_jobs_folder

    runs = tmp_path / "entry" / "runs"
    runs.mkdir(parents=True)
    (runs / ".verify-jobs").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(
        ValueError, match=r"\.verify-jobs: a symbolic link to .*elsewhere; submitit's folder must be"
    ):
        fresh_jobs_folder(runs / ".verify-jobs")
    with pytest.raises(
        ValueError, match="jobs folder /dev/shm/pgolf-jobs: /dev/shm/pgolf-jobs; submitit's folder"
    ):
        fresh_jobs_folder(Path("/dev/shm/pgolf-jobs"))
    assert not (tmp_path / "elsewhere").exists() and not Path("/dev/shm/pgolf-jobs").exists()
    fresh = fresh_jobs_folder(runs / "jobs")
    assert fresh.parent == runs / "jobs" and list(fresh.iterdir()) == []


def test_a_ledger_or_jobs_folder_the_sandbox_reads_is_refused(run_inline, monkeypatch, tmp_path):
    """OUT (the runs, the results ledger) is hidden from every phase, but a `--ledger` or `--jobs-folder` elsewhere
    was not: beneath /opt (a sandbox read root) every entrant's training could read the queue's ledger (every other
    entry's runs and verdicts as they land) and the jobs' logs. Both are refused in one line."""
    from isolation import landlock

    opt = tmp_path / "opt"
    monkeypatch.setattr(landlock, "SYSTEM_READ_ROOTS", (*landlock.SYSTEM_READ_ROOTS, str(opt)))
    root = tmp_path / "entries"
    entry(root / "2026-02-01_a", name="a")
    qcfg = queue.QueueConfig(root=root, out=tmp_path / "q", ledger=opt / "pgolf" / "ledger.jsonl")
    with pytest.raises(
        ValueError, match=f"--ledger {opt}/pgolf/ledger.jsonl: lies beneath {opt}, which every"
    ):
        queue.run_queue(qcfg, ExecutorConfig(kind="local", poll_s=0.01))
    qcfg = queue.QueueConfig(root=root, out=tmp_path / "q", ledger=tmp_path / "q" / "ledger.jsonl")
    with pytest.raises(
        ValueError, match=f"jobs folder {opt}/jobs: lies beneath {opt}, which every sandboxed"
    ):
        queue.run_queue(qcfg, ExecutorConfig(kind="local", poll_s=0.01, folder=opt / "jobs"))
    assert not opt.exists()


def test_a_folder_name_with_a_newline_is_no_entry_and_an_order_file_lists_each_once(tmp_path):
    """`ls entries > order` (one name a line) prints a folder named "x\\n2026-03-09_mine" as two lines: the
    entrant's second folder then appeared in the official's order where the first was. A name with a control
    character is skipped (one line), and an order file that lists a name twice is refused (read_order kept the
    last position silently)."""
    from harness.records.chain import read_order

    root = tmp_path / "entries"
    entry(root / "x\n2026-03-09_mine", name="sneaky")
    entry(root / "2026-03-01_fine", name="fine")
    paths, skipped = queue.list_entries(root)
    assert [p.name for p in paths] == ["2026-03-01_fine"]
    assert skipped == [
        f"skip {root}/x\\n2026-03-09_mine: its name holds a control character (a newline, ...); rename it"
    ]
    order = tmp_path / "order"
    order.write_text("x\n2026-03-09_mine\n2026-03-01_fine\n2026-03-09_mine\n")
    with pytest.raises(ValueError, match=r"'2026-03-09_mine' is listed twice; list each entry once"):
        read_order(str(order))


def _queue(root: Path, out: Path, **kw: Any) -> dict[str, Any]:
    qcfg = queue.QueueConfig(root=root, out=out, ledger=out / "ledger.jsonl", seeds=2, **kw)
    return queue.run_queue(qcfg, ExecutorConfig(kind="local", max_parallel=1, poll_s=0.001))


def test_a_verdict_decided_under_looser_flags_is_not_reused_under_stricter_ones(run_inline, tmp_path):
    """The queue resumed from its ledger took any verdict of the entry's digest whose seeds had runs as done, under
    whatever flags decided it: a claim of 1.0 against runs of 1.5 bits/byte, reproduced under `--k 100 --floor-bpb
    1`, stayed `reproduced` when the queue ran again under the defaults ("done ... (from the ledger)"), and that
    latest verdict is the one the chain reads. A verdict is reused only under the tolerance, seeds and run flags
    it was decided with; the runs are reused (they were made under the same flags), the verdict decided again."""
    from harness.records.reproduce import Tolerance

    root = tmp_path / "entries"
    entry(root / "2026-02-01_lucky", name="lucky", claimed={"val_bpb": 1.0})
    out = tmp_path / "q"
    _queue(root, out, tol=Tolerance(k=100.0, floor_bpb=1.0))
    assert [v["verdict"] for v in ledger(out, "pg-reproduction")] == ["reproduced"]
    _queue(root, out)  # the defaults
    verdicts = ledger(out, "pg-reproduction")
    assert [v["verdict"] for v in verdicts] == ["reproduced", "not_reproduced"]
    assert verdicts[-1]["tolerance"]["k"] == 3.0
    assert len(ledger(out, RUN_FORMAT)) == 2  # the two seeds' runs, not run again
    _queue(root, out)  # the same flags again: the verdict is reused
    assert len(ledger(out, "pg-reproduction")) == 2


def test_runs_made_under_other_overrides_are_not_reused(run_inline, tmp_path):
    """The runs were the state by (entry digest, seed) alone: runs trained under one `--set` (or preset, or data)
    were taken, with their verdict, for a queue run under another. A run is reused only under the flags it ran
    with; a run record that does not name them (older ledgers) is run again."""
    root = tmp_path / "entries"
    entry(root / "2026-02-01_e", name="e")
    out = tmp_path / "q"
    _queue(root, out, overrides=["train.lr=0.5"])
    first = ledger(out, RUN_FORMAT)
    assert len(first) == 2 and all(r["run_flags"]["set"] == ["train.lr=0.5"] for r in first)
    _queue(root, out)
    runs = ledger(out, RUN_FORMAT)
    assert len(runs) == 4 and [r["run_flags"]["set"] for r in runs[2:]] == [[], []]
    assert len({r["run_dir"] for r in runs}) == 4  # new attempt folders
    assert len(ledger(out, "pg-reproduction")) == 2
    _queue(root, out)
    assert len(ledger(out, RUN_FORMAT)) == 4 and len(ledger(out, "pg-reproduction")) == 2


def test_a_triage_under_a_looser_sandbox_is_not_reused_under_a_required_one(
    run_inline, monkeypatch, tmp_path
):
    """Triage was cached by digest: an entry that passed `--sandbox auto` (the model build unconfined where no
    sandbox answers) was not triaged again under `--sandbox required`."""
    from harness.commands import preflight

    seen: list[str] = []

    def checks(root: Path, preset: Any, sandbox: str) -> list[Any]:
        seen.append(sandbox)
        return []

    monkeypatch.setattr(preflight, "run_checks", checks)
    root = tmp_path / "entries"
    entry(root / "2026-02-01_e", name="e")
    out = tmp_path / "q"
    _queue(root, out, sandbox="auto")
    _queue(root, out, sandbox="required")
    _queue(root, out, sandbox="required")
    assert seen == ["auto", "required"]
