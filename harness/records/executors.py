"""Verification of many results on an executor: one job per result, each re-scored on its own allocation.

    pgolf verify RUN_DIR... --executor slurm [--partition P] [--time-min M] [--cpus N] [--gpus N] [--mem-gb G]
    pgolf verify RUN_DIR... --executor local [--max-parallel N]

`inline` (the default) verifies each folder in this process, one after another (harness/records/verify.py).
`local` and `slurm` share one path through `submitit`: its LocalExecutor (a process on this machine)
or its SlurmExecutor (one `sbatch` job per result; the job runs `python -m submitit.core._submit` with
this interpreter, so the nodes must see this virtual environment and the run folders at the same
paths: a shared filesystem). Each job runs the harness's own `verify_job` (`verify_result` without
writing, then RUN_DIR/verification.json) and returns the record as JSON text.

Resources per job (flags override each): CPUs = the threads the result was scored with (at least 1);
GPUs = the result's scoring workers when it was scored on CUDA (one per GPU: the re-score uses as many), else 0;
time = twice the track's eval budget plus 10 minutes (6 hours on an untimed track); memory = the
partition's default. Local GPU jobs each get GPUs of their own (submitit's `visible_gpus`) and wait while
other jobs hold them: two re-scores never share a GPU, nor its eval clock.

Trust. The verdict is decided on the submitting side, which alone writes result.json's verification
fields and the ledger (one writer, in submission order; `append_ledger`'s lock still guards against
another `pgolf` on the same ledger). A job's report is accepted only when (`accept_report`):
- submitit's result (a JSON text) and the verification.json the job wrote are the same record;
- it has exactly the fields a pg-verification record has, for this run folder, this result's digest
  (computed here before the job was submitted, and again before the verdict is written: a result
  edited meanwhile fails) and this tolerance;
- its status and differences follow from its checks;
- every receipt check (artifact, code and data hashes, byte counts: cheap) recomputed here agrees
  with the job's;
- its re-score checks are the set `score_checks` makes (or its one failure), and recomputing them
  here, from the result as read here and the re-score's measured numbers (each check's `actual`),
  gives the same checks: expectations, tolerances and ok flags are never taken from the job.
So a job can only contribute the re-score's measured numbers, computed by the harness's code on
the allocation. A report that is not accepted (it does not recompute) is a "failed" verdict whose
difference says what happened, with the job id and its scheduler state; a later `pgolf verify` that
succeeds supersedes it (the leaderboard reads the latest verification of a result). A job that ended
without a record (it failed, timed out, was cancelled, or the harness failed in it) gives no verdict: an
"error" line naming the job and its state, and result.json, verification.json and the ledger keep the
earlier verdict. A path that is no result is one "error" line of its own; the other paths are verified. The job's result pickle is written by the job process, never by submission code (the
re-score runs in the sealed scorer process, which may write only beneath its own output folder).

Jobs folder. submitit unpickles a job's result from `FOLDER/JOB_ID/JOB_ID_0_result.pkl` in this process (on
Slurm as soon as that file exists; locally once the job ended without writing its own). Each invocation
therefore makes a folder of its own under the one given (`fresh_jobs_folder`): a pickle an entrant committed
beside a run folder it submitted (`.verify-jobs/` is the default, beside the first run), or one a reused folder
kept from an earlier job of the same id (local ids are PIDs), is never where a job's result is looked for.
"""

from __future__ import annotations

import json
import math
import os
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from data.io import read_json, write_json_atomic
from harness.records.verify import (
    ARTIFACT_FILE,
    NOT_SCORED,
    VERIFY_FORMAT,
    VERIFY_FORMAT_VERSION,
    Check,
    HarnessFailure,
    VerifyConfig,
    commit_verdict,
    entry_checks,
    harness_error,
    is_scored,
    not_a_result,
    read_result,
    recorded_scoring_workers,
    resolve_inputs,
    result_digest,
    score_checks,
    verification_record,
    verify_result,
)
from scoring.statuses import FAILED, VERIFIED, VERIFY_ERROR
from scoring.tracks import TRACKS

EXECUTORS = ("inline", "local", "slurm")
RECORD_FIELDS = frozenset(
    (
        "format",
        "format_version",
        "status",
        "result_sha256",
        "run_dir",
        "verified_unix_s",
        "verify_wall_s",
        "code_dir",
        "data_dir",
        "tol_bpb",
        "differences",
        "checks",
    )
)
CHECK_FIELDS = frozenset(("name", "ok", "expected", "actual"))
RESCORE_FAILED = "re-score in a fresh process"
UNTIMED_JOB_MIN = 360
INCOMPLETE_STATES = frozenset(
    ("READY", "PENDING", "RUNNING", "UNKNOWN", "REQUEUED", "COMPLETING", "PREEMPTED", "CONFIGURING")
)
"""Slurm states of a job not yet over (submitit's list, and CONFIGURING)."""
FINAL_STATE_WAIT_S = 60.0
"""How long a finished job's result may wait for the scheduler to report the job's final state."""


@dataclass(frozen=True, kw_only=True, slots=True)
class ExecutorConfig:
    kind: str = "inline"
    """inline (this process), local (submitit's LocalExecutor) or slurm (submitit's SlurmExecutor)."""
    folder: Path | None = None
    """submitit's folder (job scripts, logs, result pickles; one subfolder per job id). Must be on a
    filesystem the nodes share. None: .verify-jobs/ beside the first run folder (hidden: `runs/*/` does not match it)."""
    partition: str | None = None
    """Slurm partition (None: the cluster's default)."""
    time_min: int | None = None
    """Job time limit in minutes (None: twice the track's eval budget plus 10 minutes)."""
    cpus: int | None = None
    """CPUs per job (None: the threads the result was scored with, at least 1)."""
    gpus: int | None = None
    """GPUs per job (None: the result's scoring workers when it was scored on CUDA, else 0)."""
    mem_gb: float | None = None
    """Memory per job in GB (None: the partition's default)."""
    max_parallel: int = 0
    """Jobs in flight at once (0: every job at once on slurm; CPU count / CPUs per job on local)."""
    poll_s: float = 2.0
    """Seconds between looks at the jobs."""

    def __post_init__(self) -> None:
        if self.kind not in EXECUTORS:
            raise ValueError(f"--executor {self.kind!r} is not one of {', '.join(EXECUTORS)}")
        for name in ("time_min", "cpus"):
            v = getattr(self, name)
            if v is not None and v < 1:
                raise ValueError(f"--{name.replace('_', '-')} must be at least 1, got {v}")
        if self.gpus is not None and self.gpus < 0:
            raise ValueError(f"--gpus must be >= 0, got {self.gpus}")
        if self.mem_gb is not None and not self.mem_gb > 0:
            raise ValueError(f"--mem-gb must be positive, got {self.mem_gb}")
        if self.max_parallel < 0 or not self.poll_s > 0:
            raise ValueError(
                f"--max-parallel must be >= 0 and poll_s positive, got {self.max_parallel}, {self.poll_s}"
            )


@dataclass(frozen=True, kw_only=True, slots=True)
class JobResources:
    cpus: int
    gpus: int
    time_min: int
    mem_gb: float | None


def resources_for(result: dict[str, Any], vcfg: VerifyConfig, ecfg: ExecutorConfig) -> JobResources:
    """One job's allocation: the result's own scoring device and threads, the track's eval budget."""
    score = (result.get("phases") or {}).get("score") or {}
    device = vcfg.device or str(score.get("device") or "cpu")
    threads = vcfg.threads or int(score.get("threads") or 1)
    track = TRACKS.get(str(result.get("track")))
    if ecfg.time_min is not None:
        time_min = ecfg.time_min
    elif track is not None and math.isfinite(track.eval_budget_s):
        time_min = math.ceil(2 * track.eval_budget_s / 60) + 10
    else:
        time_min = UNTIMED_JOB_MIN
    return JobResources(
        cpus=ecfg.cpus or max(1, threads),
        gpus=ecfg.gpus
        if ecfg.gpus is not None
        else (vcfg.scoring_workers or recorded_scoring_workers(result)) * int(device.startswith("cuda")),
        time_min=time_min,
        mem_gb=ecfg.mem_gb,
    )


# ---- The job (runs on the allocation) ----


def verify_job(task_json: str) -> str:
    """Verify one result with the harness's own code; write RUN_DIR/verification.json; return it as JSON.

    The task is plain JSON (run folder, inputs, tolerance): no object of the submitter's is needed.
    Nothing here writes result.json or the ledger: the submitting side does, after `accept_report`."""
    task = json.loads(task_json)
    cfg = VerifyConfig(
        tol_bpb=float(task["tol_bpb"]),
        device=task["device"],
        threads=int(task["threads"]),
        timeout_s=float(task["timeout_s"]),
        allow_missing_layers=tuple(task.get("allow_missing_layers", ())),
        scoring_workers=task.get("scoring_workers"),
    )
    record = verify_result(
        task["run_dir"], submission=task["submission"], data=task["data"], cfg=cfg, write=False
    )
    if record["status"] == VERIFY_ERROR:  # no verdict: the job fails, and verification.json stays as it was
        raise HarnessFailure(f"{record['detail']} (log: {record.get('log')})")
    write_json_atomic(Path(task["run_dir"]) / "verification.json", record)
    return json.dumps(record, sort_keys=True, allow_nan=False)


# ---- Accepting a report (the submitting side) ----


@dataclass(frozen=True)
class Expected:
    """What the submitting side knows of a result before and after its job."""

    run_dir: str
    result_sha256: str
    tol_bpb: float
    receipt: list[dict[str, Any]]
    """The receipt checks recomputed here (asdict of each Check, through JSON)."""
    score_names: tuple[frozenset[str], ...]
    """The sets of re-score check names a genuine report can carry."""
    result: dict[str, Any]
    """The result as read here (the re-score checks' expectations come from it)."""
    cfg: VerifyConfig


def expected_for(
    result: dict[str, Any],
    run_dir: Path,
    submission: str | os.PathLike[str] | None,
    data: str | os.PathLike[str] | None,
    vcfg: VerifyConfig,
) -> Expected:
    code_dir, data_dir = resolve_inputs(run_dir, result, submission, data)
    receipt = entry_checks(result, run_dir, code_dir, data_dir, data_given=data is not None)
    if not is_scored(result):
        names: tuple[frozenset[str], ...] = (frozenset({NOT_SCORED}),)
    elif code_dir is None or data_dir is None or not (run_dir / ARTIFACT_FILE).is_file():
        names = (frozenset(),)  # nothing to re-score, and a receipt check says why
    else:
        failed = score_checks(result, None, "", vcfg)
        scored_anew = score_checks(result, {}, "", vcfg)
        names = (frozenset(c.name for c in failed), frozenset(c.name for c in scored_anew))
    return Expected(
        run_dir=str(run_dir),
        result_sha256=result_digest(result),
        tol_bpb=vcfg.tol_bpb,
        receipt=json.loads(json.dumps([asdict(c) for c in receipt])),
        score_names=names,
        result=result,
        cfg=vcfg,
    )


def accept_report(reported: Any, written: Any, expect: Expected) -> list[str]:
    """Why a job's report cannot be taken as the verdict (empty: accept it). See the module docstring."""
    if not isinstance(reported, str):
        return [f"the job returned {type(reported).__name__}, not the record's JSON text"]
    try:
        record = json.loads(reported)
    except (ValueError, RecursionError) as e:  # deep nesting: RecursionError
        return [f"the job's record is not JSON: {e}"]
    if not isinstance(record, dict):
        return ["the job's record is not a JSON object"]
    if record != written:
        return ["the job's record and the verification.json it wrote differ"]
    problems = []
    if set(record) != RECORD_FIELDS:
        problems.append(f"fields {sorted(set(record) ^ RECORD_FIELDS)} added or missing")
        return problems
    if (record["format"], record["format_version"]) != (VERIFY_FORMAT, VERIFY_FORMAT_VERSION):
        problems.append(f"format {record['format']!r} v{record['format_version']!r}")
    for key, want in (
        ("run_dir", expect.run_dir),
        ("result_sha256", expect.result_sha256),
        ("tol_bpb", expect.tol_bpb),
    ):
        if record[key] != want:
            problems.append(f"{key} {record[key]!r}, expected {want!r}")
    checks = record["checks"]
    if not isinstance(checks, list) or not all(
        isinstance(c, dict)
        and set(c) == CHECK_FIELDS
        and isinstance(c["name"], str)
        and isinstance(c["ok"], bool)
        for c in checks
    ):
        return [*problems, "checks are not a list of {name, ok, expected, actual}"]
    status = VERIFIED if checks and all(c["ok"] for c in checks) else FAILED
    if record["status"] != status:
        problems.append(f"status {record['status']!r} does not follow from its checks ({status})")
    if record["differences"] != [c for c in checks if not c["ok"]]:
        problems.append("differences are not its failed checks")
    receipt_names = {c["name"] for c in expect.receipt}
    job_receipt = [c for c in checks if c["name"] in receipt_names]
    if job_receipt != expect.receipt:
        ours = {c["name"]: c for c in expect.receipt}
        bad = [c["name"] for c in job_receipt if ours.get(c["name"]) != c] or ["(checks missing)"]
        problems.append(f"receipt checks disagree with the ones recomputed here: {', '.join(bad)}")
    rescore = [c for c in checks if c["name"] not in receipt_names]
    names = frozenset(c["name"] for c in rescore)
    if len(names) != len(rescore) or names not in expect.score_names:
        problems.append(f"re-score checks {sorted(names)} are not the set the harness makes")
    elif any(c["ok"] for c in rescore if c["name"] in (RESCORE_FAILED, NOT_SCORED)):
        problems.append("a failed re-score reported as passed")
    elif rescore and not names & {RESCORE_FAILED, NOT_SCORED}:  # a result of any status: nothing re-scored
        # Only the re-score's measured numbers come from the job: the expectations (the result's
        # numbers) and every ok flag are recomputed here from them.
        recomputed = json.loads(
            json.dumps([asdict(c) for c in score_checks(expect.result, measured(rescore), "", expect.cfg)])
        )
        if recomputed != rescore:
            bad = [c["name"] for c in rescore if c not in recomputed]
            problems.append(f"re-score checks do not follow from the re-score's numbers: {', '.join(bad)}")
    return problems


def measured(rescore: list[dict[str, Any]]) -> dict[str, Any]:
    """The re-score's numbers as a score record has them, from its checks' `actual` values."""
    new: dict[str, Any] = {}
    for c in rescore:
        key = c["name"].removeprefix("re-score ").split(" (")[0]
        if key == "probes passed":
            new["probes"] = {"passed": c["actual"]}
        else:
            new[key] = c["actual"]
    return new


# ---- Submitting and gathering ----


@dataclass
class Item:
    """One result on its way through an executor."""

    path: str
    result_path: Path
    run_dir: Path
    digest: str
    resources: JobResources
    job: Any = None
    done_at: float | None = None
    record: dict[str, Any] | None = None
    gpus_held: tuple[int, ...] = ()
    """Local executor: the GPUs of this machine this job was given (no other local job has them meanwhile)."""


def make_executor(ecfg: ExecutorConfig, folder: Path) -> Any:
    import submitit

    if ecfg.kind == "slurm":
        return submitit.SlurmExecutor(folder=folder / "%j")
    return submitit.LocalExecutor(folder=folder / "%j")


def submit(executor: Any, ecfg: ExecutorConfig, item: Item, task: dict[str, Any]) -> Any:
    r = item.resources
    if ecfg.kind == "slurm":
        params: dict[str, Any] = {
            "job_name": "pgolf-verify",
            "time": r.time_min,
            "cpus_per_task": r.cpus,
            "ntasks_per_node": 1,
            "nodes": 1,
        }
        if ecfg.partition:
            params["partition"] = ecfg.partition
        if r.gpus:
            params["gpus_per_node"] = r.gpus
        if r.mem_gb is not None:
            params["mem"] = f"{max(1, math.ceil(r.mem_gb * 1024))}M"
    else:
        params = {"timeout_min": r.time_min, "gpus_per_node": r.gpus}
        if item.gpus_held:  # else submitit gives every local job GPUs 0 .. gpus-1: all of them the same ones
            params["visible_gpus"] = item.gpus_held
    executor.update_parameters(**params)
    from submitit.core.utils import FailedJobError

    try:
        return executor.submit(verify_job, json.dumps(task, sort_keys=True))
    except FailedJobError as e:  # sbatch refused it: a bad partition, more CPUs or GPUs than a node has
        said = " / ".join(line.strip() for line in str(e).strip().splitlines()[-2:])
        raise ValueError(
            f"the scheduler refused the job for {item.run_dir} ({params}): {said[-500:]}; "
            "check --partition, --cpus, --gpus, --time-min and --mem-gb"
        ) from e


def job_outcome(job: Any) -> tuple[Any, str | None]:
    """(what the job returned, None) or (None, why there is nothing)."""
    from submitit.core.utils import FailedJobError, UncompletedJobError

    try:
        return job.result(), None
    except (FailedJobError, UncompletedJobError) as e:
        return None, str(e).strip()[-1500:]
    except (OSError, EOFError, ValueError) as e:  # an unreadable or truncated result file
        return None, f"the job's result could not be read: {e}"


def job_state(job: Any) -> str:
    try:
        return str(job.state)
    except (OSError, RuntimeError) as e:
        return f"UNKNOWN ({e})"


def finish(
    item: Item,
    ecfg: ExecutorConfig,
    vcfg: VerifyConfig,
    submission: str | os.PathLike[str] | None,
    data: str | os.PathLike[str] | None,
    ledger: str | os.PathLike[str] | None,
) -> dict[str, Any]:
    """Read a finished job back, decide the verdict here, write it (result.json, verification.json, ledger)."""
    job = item.job
    state = job_state(job)
    t0 = time.perf_counter()
    result_path, run_dir, result = read_result(item.result_path)
    expect = expected_for(result, run_dir, submission, data, vcfg)
    reported: Any = None
    if expect.result_sha256 != item.digest:
        problems = ["result.json changed while its verification ran"]
    else:
        reported, why = job_outcome(job)
        try:
            written = read_json(item.run_dir / "verification.json", what="the job's verification.json")
        except (FileNotFoundError, ValueError):
            written = None  # missing or malformed: it cannot match the job's record
        if why is not None:  # it died, timed out, was cancelled, or the harness failed in it: no verdict
            record = harness_error(
                run_dir,
                f"{ecfg.kind} job {job.job_id} ({state}) ended without a record: {why}",
                why,
                time.perf_counter() - t0,
            )
            record["executor"] = {"kind": ecfg.kind, "job_id": str(job.job_id), "state": state,
                                  "resources": asdict(item.resources)}  # fmt: skip
            return record
        problems = accept_report(reported, written, expect)
    if problems:
        code_dir, data_dir = resolve_inputs(run_dir, result, submission, data)
        checks = entry_checks(result, run_dir, code_dir, data_dir, data_given=data is not None)
        checks.append(
            Check(
                "verification job",
                False,
                "a record computed by the harness's verify code",
                f"{ecfg.kind} job {job.job_id} ({state}): {'; '.join(problems)}",
            )
        )
        record = verification_record(
            result, run_dir, code_dir, data_dir, vcfg, checks, wall_s=time.perf_counter() - t0
        )
    else:
        record = json.loads(reported)
    record["executor"] = {
        "kind": ecfg.kind,
        "job_id": str(job.job_id),
        "state": state,
        "resources": asdict(item.resources),
    }
    commit_verdict(result_path, result, record, ledger)
    return record


def ended(item: Item, ecfg: ExecutorConfig) -> bool:
    """Whether a job is over: its result is written (or it ended without one) and the scheduler says
    so, or FINAL_STATE_WAIT_S have passed since the result appeared (the state is then recorded as
    the scheduler last gave it)."""
    job = item.job
    if not job.done():
        return False
    if ecfg.kind != "slurm":
        return True
    now = time.monotonic()
    if item.done_at is None:
        item.done_at = now
    if now - item.done_at > FINAL_STATE_WAIT_S:
        return True
    job.watcher.update()  # one sacct call for every job in flight
    return job_state(job).upper() not in INCOMPLETE_STATES


def local_gpus() -> list[int]:
    """This machine's GPUs as the local executor numbers them (CUDA_VISIBLE_DEVICES' own numbers where it names
    them; else every GPU torch counts)."""
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    if env is not None:
        try:
            return [int(x) for x in env.split(",") if x.strip()]
        except ValueError:  # UUIDs: submitit takes numbers only; the count below
            pass
    import torch

    return list(range(torch.cuda.device_count()))


def default_folder(ecfg: ExecutorConfig, first_run_dir: Path) -> Path:
    return ecfg.folder or first_run_dir.parent / ".verify-jobs"


def fresh_jobs_folder(base: Path) -> Path:
    """A new folder under `base`, made here and empty (the module docstring, "Jobs folder"): submitit's folder.
    ValueError for a `base` that is a link (committed beside a submitted run: `.verify-jobs -> /dev/shm/x`) or lies
    in /dev/shm, which a sandboxed phase without a mount namespace may write: a pickle written there is read here."""
    real = os.path.realpath(base)
    if base.is_symlink() or real == "/dev/shm" or real.startswith("/dev/shm/"):
        raise ValueError(
            f"jobs folder {base}: {'a symbolic link to ' if base.is_symlink() else ''}{real}; submitit's folder "
            "must be a real folder outside /dev/shm (sandboxed code may write there): pass --jobs-folder DIR"
        )
    from harness.records.reproduce import sandbox_readable

    seen = sandbox_readable(base)
    if seen is not None:  # its logs and pickles: every job's task and output, other entries' runs among them
        raise ValueError(
            f"jobs folder {base}: lies beneath {seen}, which every sandboxed phase may read (other jobs' tasks and "
            "logs); pass --jobs-folder DIR in a folder of its own"
        )
    base.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix=time.strftime("%Y%m%d-%H%M%S-"), dir=base))


def run_verifications(
    paths: Sequence[str],
    *,
    submission: str | os.PathLike[str] | None,
    data: str | os.PathLike[str] | None,
    vcfg: VerifyConfig,
    ecfg: ExecutorConfig,
    ledger: str | os.PathLike[str] | None,
) -> list[dict[str, Any]]:
    """Verify every result on the executor; the records in the order of `paths`.

    Every path is read before any job is submitted (a path that is not a result is a user error
    and nothing runs). Progress: a tqdm bar over finished jobs on stderr, the job states of the
    ones in flight as its postfix, and one line per finished job (job id, state, verdict)."""
    from tqdm import tqdm

    items: list[Item] = []
    not_results: dict[int, dict[str, Any]] = {}  # position -> the line of a path that is no result
    for i, p in enumerate(paths):
        try:
            result_path, run_dir, result = read_result(p)
        except (FileNotFoundError, ValueError) as e:
            not_results[i] = not_a_result(p, e)
            continue
        resolve_inputs(run_dir, result, submission, data)  # user errors (--submission, --data) now
        items.append(
            Item(
                path=str(p),
                result_path=result_path,
                run_dir=run_dir,
                digest=result_digest(result),
                resources=resources_for(result, vcfg, ecfg),
            )
        )
    if not items:
        return [not_results[i] for i in sorted(not_results)]
    folder = fresh_jobs_folder(default_folder(ecfg, items[0].run_dir))
    executor = make_executor(ecfg, folder)
    limit = ecfg.max_parallel
    if limit == 0 and ecfg.kind == "local":
        limit = max(1, (os.cpu_count() or 1) // max(i.resources.cpus for i in items))
    waiting = list(items)
    in_flight: list[Item] = []
    # local GPU jobs: each takes GPUs of its own and waits while others hold them (a re-score's eval clock must
    # not share its GPUs with another's)
    # (a job asking for more GPUs than the machine has is given none of them: its re-score says so)
    free_gpus = local_gpus() if ecfg.kind == "local" and any(i.resources.gpus for i in items) else []
    n_gpus = len(free_gpus)
    bar = tqdm(total=len(items), desc=f"verify ({ecfg.kind})", unit="job", file=sys.stderr)
    try:
        while waiting or in_flight:
            while waiting and (limit == 0 or len(in_flight) < limit):
                need = waiting[0].resources.gpus if waiting[0].resources.gpus <= n_gpus else 0
                if need > len(free_gpus):
                    break  # until a running job hands its GPUs back
                item = waiting.pop(0)
                item.gpus_held, free_gpus[:] = tuple(free_gpus[:need]), free_gpus[need:]
                task = {
                    "run_dir": str(item.run_dir),
                    "submission": str(submission) if submission is not None else None,
                    "data": str(data) if data is not None else None,
                    "tol_bpb": vcfg.tol_bpb,
                    "device": vcfg.device,
                    "threads": vcfg.threads,
                    "timeout_s": vcfg.timeout_s,
                    "allow_missing_layers": list(vcfg.allow_missing_layers),
                    "scoring_workers": vcfg.scoring_workers,
                }
                item.job = submit(executor, ecfg, item, task)
                in_flight.append(item)
                bar.write(f"submitted {ecfg.kind} job {item.job.job_id}: {item.run_dir}", file=sys.stderr)
            for item in [i for i in in_flight if ended(i, ecfg)]:
                in_flight.remove(item)
                free_gpus.extend(item.gpus_held)
                item.record = finish(item, ecfg, vcfg, submission, data, ledger)
                ex = item.record["executor"]
                bar.write(
                    f"job {ex['job_id']} {ex['state']}: {item.run_dir} {item.record['status'].upper()} "
                    f"({len(item.record['differences'])} difference(s))",
                    file=sys.stderr,
                )
                bar.update(1)
            states = Counter(job_state(i.job).split(" ")[0] for i in in_flight)
            postfix = " ".join(f"{s}={n}" for s, n in sorted(states.items())) + (
                f" WAITING={len(waiting)}" if waiting else ""
            )
            if postfix != bar.postfix:  # redraw when the states change (a log stays short)
                bar.set_postfix_str(postfix)
            if in_flight:
                time.sleep(ecfg.poll_s)
    finally:
        bar.close()
        for item in items:
            if item.job is not None and item.record is None:
                item.job.cancel(check=False)  # interrupted: leave nothing running on the cluster
    verified = iter(items)
    ordered = [not_results[i] if i in not_results else next(verified).record for i in range(len(paths))]
    return [r for r in ordered if r is not None]
