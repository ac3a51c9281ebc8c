"""`pgolf queue DIR_OF_ENTRIES`: triage a folder of entries in seconds each, then reproduce them as jobs.

    pgolf queue DIR [--executor local|slurm] [--max-parallel K] [--out WORK] [--ledger FILE] [--data DIR]
                [--seeds N] [--preset P] [--partition P] [--cpus N] [--gpus N] [--mem-gb G] [--time-min M]
                [--order FILE] [--sandbox auto|required]

1. Entries: every folder directly under DIR that holds a submission.json (a competition repository's
   records and open pull requests, checked out side by side); anything else is one line and skipped.
2. Triage, static and in seconds: the entry and its claim read (`reproduce.load_entry`), then every check
   of `pgolf check` (harness/commands/preflight.py: submission.json, config, folder rules, the scored-code lint, a
   confined model build, the artifact estimate). A failed check is the entry's verdict, `not_reproduced`,
   naming the check; nothing of it is trained.
3. Jobs: one per (entry, seed), `reproduce.reproduce_seed` through submitit: LocalExecutor (a process on
   this machine; at most K at once) or SlurmExecutor (one job array per resource shape, `%K` at once).
   Resources come from the track (`track_resources`): GPUs from its hardware (8 on `8xH100 SXM`, none on
   CPU), CPUs 8 per GPU or the whole node's on a CPU track, time = start-up + warm-up + training budget +
   grace + eval budget + the scorer's start-up + 10 minutes; flags override each.
4. The ledger is the state (append-only JSON lines, one writer per line under a lock): `pg-triage`,
   `pg-queue-job` (submitted: job id, entry, seed, run folder), `pg-repro-run` (written by the job itself
   when its run ends, so a queue killed meanwhile loses nothing), `pg-reproduction` (the entry's verdict)
   and `pg-queue-summary`. Run again with the same arguments, the queue skips every (entry, seed) with a
   run record and every entry with a verdict; a job that ended without one (died, cancelled, timed out) is
   run again, into a new attempt folder. Each is reused only under the flags it was made with (a run: the
   preset, --data, --set; a triage: --preset, --sandbox; a verdict: those and the tolerance, seeds and salt):
   under others the seed is run, the entry triaged, or its verdict decided again. SIGINT or SIGTERM cancels
   the jobs in flight and exits 130.
5. One broken entry never stops the batch: every failure is that entry's line and verdict. Progress: one
   line per job submitted and ended, one per verdict; then a summary (per-verdict counts, triage rate,
   GPU- and CPU-hours, the queue's overhead per job) and the accepted chain (harness/records/chain.py).

`--executor slurm` where no Slurm answers is one line saying how to get one (exit 2), never a traceback.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from data.io import read_regular
from harness.records.executors import INCOMPLETE_STATES, ExecutorConfig, JobResources, fresh_jobs_folder
from harness.records.reproduce import (
    COULD_NOT_RUN,
    NOT_REPRODUCED,
    REPRO_FORMAT,
    REPRO_FORMAT_VERSION,
    RUN_FORMAT,
    VERDICTS,
    Entry,
    Tolerance,
    describe,
    fresh_seeds_record,
    load_entry,
    read_seed_salt,
    reproduce_seed,
    sandbox_readable,
    verdict_of,
)
from harness.records.verify import append_ledger
from harness.run.text import visible
from harness.submission import SUBMISSION_JSON_MAX_BYTES
from scoring.statuses import Status
from scoring.tracks import TRACKS, Track

TRIAGE_FORMAT = "pg-triage"
JOB_FORMAT = "pg-queue-job"
SUMMARY_FORMAT = "pg-queue-summary"
FORMAT_VERSION = 1
CPUS_PER_GPU = 8
ARRAY_MAX = 1000
"""Jobs per Slurm array at most (Slurm's default MaxArraySize is 1001); a larger batch is several arrays."""
SCORER_STARTUP_S = 300.0
MARGIN_MIN = 10
UNTIMED_MIN = 360
NO_SLURM = (
    "--executor slurm: no Slurm answers on this machine ({why}); submit from a login node of a Slurm "
    "cluster, or start a single-node one (root: apt-get install -y slurmctld slurmd munge slurm-client && "
    "scripts/slurm_single_node.sh start, then export PATH=/var/tmp/pgolf-slurm/bin:$PATH), "
    "or use --executor local"
)


def gpus_of(track: Track) -> int:
    """GPUs a job of this track needs, from its hardware string: '8xH100 SXM' -> 8; CPU or any -> 0."""
    m = re.match(r"\s*(\d+)\s*x\s*[A-Za-z]", track.hardware)
    return int(m.group(1)) if m else 0


def track_resources(track: Track, ecfg: ExecutorConfig) -> JobResources:
    gpus = ecfg.gpus if ecfg.gpus is not None else gpus_of(track)
    cpus = ecfg.cpus or (CPUS_PER_GPU * gpus if gpus else max(1, os.cpu_count() or 1))
    budgets = (track.startup_s, track.warmup_max_s, track.train_budget_s, track.grace_s, track.eval_budget_s)
    if ecfg.time_min is not None:
        time_min = ecfg.time_min
    elif all(math.isfinite(b) for b in budgets):
        time_min = math.ceil((sum(budgets) + SCORER_STARTUP_S) / 60) + MARGIN_MIN
    else:
        time_min = UNTIMED_MIN
    return JobResources(cpus=cpus, gpus=gpus, time_min=time_min, mem_gb=ecfg.mem_gb)


def slurm_problem() -> str | None:
    """Why Slurm cannot take jobs here (None: it can)."""
    for b in ("sbatch", "sinfo", "sacct", "scancel"):
        if shutil.which(b) is None:
            return f"{b} not found on PATH"
    try:
        p = subprocess.run(
            ["sinfo", "-h", "-o", "%t"], capture_output=True, text=True, timeout=20, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"sinfo failed: {e}"
    if p.returncode != 0:
        return f"sinfo exited {p.returncode}: {(p.stderr or p.stdout).strip()[-200:]}"
    if not any(s.startswith(("idle", "mix", "alloc")) for s in p.stdout.split()):
        return f"no node takes jobs (sinfo: {p.stdout.strip()[:100] or 'none'})"
    return None


# ---- The job (runs on the allocation) ----


def _job_id() -> str | None:
    try:
        import submitit

        return str(submitit.JobEnvironment().job_id)
    except Exception:  # noqa: BLE001 - outside a submitit job
        return os.environ.get("SLURM_JOB_ID")


def queue_job(task_json: str) -> str:
    """One seed of one entry: train, pack, score (reproduce_seed); append its pg-repro-run record to the
    ledger from here (the state survives the queue being killed); return it as JSON."""
    task = json.loads(task_json)
    task["job_id"] = _job_id()
    rec = reproduce_seed(task)
    rec["run_flags"] = task.get("run_flags")  # what the run was made under: reused only under the same
    append_ledger(Path(task["queue_ledger"]), rec)
    return json.dumps(rec, sort_keys=True)


# ---- The state, read from the ledger ----


def flags_key(flags: Any) -> str:
    """A record's flags (a run's `run_flags`, a triage's `flags`) as a key; a record without them (an older
    ledger's) keys as "null", which no flags of this queue are."""
    return json.dumps(flags, sort_keys=True)


@dataclass
class State:
    triage: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    """(entry digest, flags_key of the triage's flags) -> its triage record."""
    runs: dict[tuple[str, int, str], dict[str, Any]] = field(default_factory=dict)
    """(entry digest, seed, flags_key of its run_flags) -> its finished run record (a job that died is not one).
    A run made under other flags (--set, --data, the preset) is another run: never reused for these."""
    attempts: Counter[tuple[str, int]] = field(default_factory=Counter)
    verdicts: dict[str, dict[str, Any]] = field(default_factory=dict)


def read_state(ledger: Path) -> State:
    st = State()
    if not ledger.is_file():
        return st
    for line in ledger.read_text(encoding="utf-8").splitlines():
        try:
            r = json.loads(line)
        except json.JSONDecodeError:
            continue  # a torn last line of a killed writer: that record was never written
        fmt = r.get("format") if isinstance(r, dict) else None
        if fmt == TRIAGE_FORMAT:
            st.triage[(r["entry_digest"], flags_key(r.get("flags")))] = r
        elif fmt == JOB_FORMAT:
            st.attempts[(r["entry_digest"], int(r["seed"]))] += 1
        elif fmt == RUN_FORMAT and not r.get("job_failed"):
            st.runs.setdefault((r["entry_digest"], int(r["seed"]), flags_key(r.get("run_flags"))), r)
        elif fmt == REPRO_FORMAT:
            st.verdicts[r["entry_digest"]] = r
    return st


# ---- Triage ----


def folder_digest(root: Path) -> str:
    """A digest for a folder that is no readable entry (its submission.json's bytes and its name)."""
    h = hashlib.sha256(root.name.encode())
    p = root / "submission.json"
    if p.is_file() and not p.is_symlink():
        with p.open("rb") as f:
            h.update(f.read(1 << 20))  # bounded: a huge (sparse) file is not read whole
    return h.hexdigest()


def raw_meta(root: Path) -> dict[str, Any]:
    """The text fields of a submission.json that did not pass its schema, for the board's row (best effort)."""
    try:  # never through a link (another entry's or the official's JSON), never a huge file read whole
        meta = json.loads(read_regular(root / "submission.json", SUBMISSION_JSON_MAX_BYTES))
    except (OSError, ValueError, RecursionError):  # deep nesting: RecursionError
        return {}
    if not isinstance(meta, dict):
        return {}
    return {k: v[:200] for k, v in meta.items() if k in ("name", "date", "track") and isinstance(v, str)}


def refused_record(
    root: Path, digest: str, key: str, track: str, meta: dict[str, Any], why: list[tuple[str, str]]
):
    diffs = [{"name": f"triage {n}", "ok": False, "expected": "passes", "actual": d} for n, d in why]
    return {
        "format": REPRO_FORMAT,
        "format_version": REPRO_FORMAT_VERSION,
        "verdict": NOT_REPRODUCED,
        "entry_key": key,
        "entry_digest": digest,
        "entry_dir": str(root),
        "submission": {k: meta.get(k) for k in ("name", "author", "github_id", "date", "track")},
        "track": track,
        "preset": None,
        "seeds": [],
        "claimed": [],
        "reproduced": [],
        "stats": {},
        "checks": diffs,
        "differences": diffs,
        "decided_unix_s": time.time(),
    }


def triage(
    root: Path, preset: str | None, sandbox: str, st: State, ledger: Path
) -> tuple[Entry | None, dict[str, Any]]:
    """(the entry, or None when it failed triage; its triage record). A failure writes its verdict too."""
    t0 = time.perf_counter()
    try:
        entry = load_entry(root, preset)
    except Exception as e:  # noqa: BLE001 - a hostile or broken folder is that entry's line, never the batch's
        digest = folder_digest(root)
        why = f"{type(e).__name__}: {e}"[:400]
        safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in root.name[:60])  # as Entry.key
        key = f"{safe}-{digest[:12]}"
        rec: dict[str, Any] = {"format": TRIAGE_FORMAT, "format_version": FORMAT_VERSION, "entry_digest": digest,
               "entry_key": key, "entry_dir": str(root), "ok": False,
               "failed": [["entry", why]], "time_s": time.perf_counter() - t0}  # fmt: skip
        if digest not in st.verdicts:
            append_ledger(ledger, rec)
            meta = raw_meta(root)
            verdict = refused_record(root, digest, key, str(meta.get("track", "?")), meta, [("entry", why)])
            append_ledger(ledger, verdict)
            st.verdicts[digest] = verdict
        else:
            rec["cached"] = True  # refused before, and its verdict is in the ledger
        return None, rec
    # what triage's verdict depends on beyond the folder: one passed under --sandbox auto (the build unconfined
    # where no sandbox answers) is triaged again under required
    flags = {"preset": preset, "sandbox": sandbox}
    cached = st.triage.get((entry.digest, flags_key(flags)))
    if cached is not None:
        return (entry if cached["ok"] else None), {**cached, "cached": True}
    from harness.commands.preflight import CHECK_SKIPPED, PASSING, Check, run_checks

    try:
        checks = run_checks(root, entry.preset, sandbox=sandbox)
    except Exception as e:  # noqa: BLE001 - the checks' own failure on a hostile folder is that entry's FAIL
        checks = [Check("triage", "FAIL", f"the checks failed on this folder: {type(e).__name__}: {e}"[:400])]
    not_passing = [c for c in checks if c.status not in PASSING]
    causes = [
        c for c in not_passing if c.status != CHECK_SKIPPED
    ] or not_passing  # a skip follows from a FAIL
    failed = [[c.name, f"{c.status}: {c.detail}"[:400]] for c in causes]
    rec = {"format": TRIAGE_FORMAT, "format_version": FORMAT_VERSION, "entry_digest": entry.digest,
           "entry_key": entry.key, "entry_dir": str(root), "ok": not failed, "failed": failed,
           "checks": [[c.name, c.status] for c in checks], "flags": flags,
           "time_s": time.perf_counter() - t0}  # fmt: skip
    append_ledger(ledger, rec)
    st.triage[(entry.digest, flags_key(flags))] = rec
    if failed:
        verdict = refused_record(root, entry.digest, entry.key, entry.track, entry.meta,
                                 [(n, d) for n, d in failed])  # fmt: skip
        append_ledger(ledger, verdict)
        st.verdicts[entry.digest] = verdict
        return None, rec
    return entry, rec


# ---- Jobs ----


@dataclass
class Job:
    entry: Entry
    seed: int
    run_dir: Path
    resources: JobResources
    task: dict[str, Any]
    handle: Any = None
    submitted_unix_s: float = 0.0


def _executor(ecfg: ExecutorConfig, folder: Path) -> Any:
    import submitit

    if ecfg.kind == "slurm":
        return submitit.SlurmExecutor(folder=folder / "%j")
    return submitit.LocalExecutor(folder=folder / "%j")


def _params(ecfg: ExecutorConfig, r: JobResources, k: int, n: int) -> dict[str, Any]:
    if ecfg.kind != "slurm":
        return {"timeout_min": r.time_min, "gpus_per_node": r.gpus}
    params: dict[str, Any] = {"job_name": "pgolf-reproduce", "time": r.time_min, "cpus_per_task": r.cpus,
                              "ntasks_per_node": 1, "nodes": 1, "array_parallelism": k or n}  # fmt: skip
    if ecfg.partition:
        params["partition"] = ecfg.partition
    if r.gpus:
        params["gpus_per_node"] = r.gpus
    if r.mem_gb is not None:
        params["mem"] = f"{max(1, math.ceil(r.mem_gb * 1024))}M"
    return params


def submit_jobs(executor: Any, ecfg: ExecutorConfig, jobs: list[Job], k: int, ledger: Path) -> None:
    """Submit jobs sharing one resource shape: a job array on Slurm (at most k at once), else one by one."""
    if not jobs:
        return
    from submitit.core.utils import FailedJobError

    executor.update_parameters(**_params(ecfg, jobs[0].resources, k, len(jobs)))
    try:
        if ecfg.kind == "slurm" and len(jobs) > 1:
            handles = executor.map_array(queue_job, [json.dumps(j.task, sort_keys=True) for j in jobs])
        else:
            handles = [executor.submit(queue_job, json.dumps(j.task, sort_keys=True)) for j in jobs]
    except FailedJobError as e:
        said = " / ".join(x.strip() for x in str(e).strip().splitlines()[-2:])
        raise ValueError(
            f"the scheduler refused the jobs ({_params(ecfg, jobs[0].resources, k, len(jobs))}): {said[-400:]}; "
            "check --partition, --cpus, --gpus, --time-min and --mem-gb"
        ) from e
    now = time.time()
    for j, h in zip(jobs, handles, strict=True):
        j.handle, j.submitted_unix_s = h, now
        append_ledger(ledger, {"format": JOB_FORMAT, "format_version": FORMAT_VERSION, "job_id": str(h.job_id),
                               "executor": ecfg.kind, "entry_key": j.entry.key, "entry_digest": j.entry.digest,
                               "seed": j.seed, "run_dir": str(j.run_dir), "resources": asdict(j.resources),
                               "submitted_unix_s": now})  # fmt: skip
        print(
            f"submitted {ecfg.kind} job {h.job_id}: {j.entry.key} seed {j.seed}", file=sys.stderr, flush=True
        )


def _state(h: Any) -> str:
    try:
        return str(h.state)
    except Exception as e:  # noqa: BLE001
        return f"UNKNOWN ({e})"


def job_record(j: Job, ecfg: ExecutorConfig) -> dict[str, Any]:
    """The run record of an ended job: what it returned, else one saying it ended without one."""
    from submitit.core.utils import FailedJobError, UncompletedJobError

    try:
        rec = json.loads(j.handle.result())
        if not isinstance(rec, dict) or rec.get("format") != RUN_FORMAT:
            raise ValueError("not a pg-repro-run record")
        if [rec.get(k) for k in ("entry_digest", "seed", "run_dir")] != [
            j.entry.digest,
            j.seed,
            str(j.run_dir),
        ]:
            # a result file of another job (a reused jobs folder, a recycled local job id): never this seed's run
            raise ValueError("a pg-repro-run record of another job (its entry, seed or run folder differ)")
    except (FailedJobError, UncompletedJobError, OSError, EOFError, ValueError) as e:
        rec = {"format": RUN_FORMAT, "format_version": FORMAT_VERSION, "entry_key": j.entry.key,
               "entry_digest": j.entry.digest, "seed": j.seed, "run_dir": str(j.run_dir),
               "job_id": str(j.handle.job_id), "status": Status.ERROR, "job_failed": True, "harness_failed": True,
               "detail": f"{ecfg.kind} job {j.handle.job_id} ({_state(j.handle)}) ended without a record: "
                         f"{str(e).strip()[-300:]}"}  # fmt: skip
    state = _state(j.handle)
    if ecfg.kind == "slurm" and state.split(" ")[0] in INCOMPLETE_STATES and not rec.get("job_failed"):
        state = f"{state.split(' ')[0]} (the scheduler's word; the job's result is written)"
    rec["job_state"] = state
    rec["submitted_unix_s"] = j.submitted_unix_s
    rec["seen_unix_s"] = time.time()
    return rec


def ended(h: Any) -> bool:
    """A job is over when submitit says so: its result file is written, or the scheduler says it ended."""
    return bool(h.done())


# ---- The queue ----


@dataclass(kw_only=True)
class QueueConfig:
    root: Path
    out: Path
    ledger: Path
    data: str | None = None
    preset: str | None = None
    seeds: int | None = None
    seed_salt: str | None = None
    """The official's secret for fresh seeds (harness/records/reproduce.py, "Chosen seeds"); pass it again on resumption."""
    sandbox: str = "auto"
    order: str | None = None
    overrides: list[str] = field(default_factory=list)
    tol: Tolerance = field(default_factory=Tolerance)

    def seeds_of(self, entry: Entry) -> list[int]:
        return entry.seeds(self.seeds, self.seed_salt)

    def run_flags(self, entry: Entry) -> dict[str, Any]:
        """What a run of the entry is made under, beyond its folder and seed: a run is reused only under these."""
        return {"preset": entry.preset, "data": self.data, "set": list(self.overrides)}

    def run_key(self, entry: Entry, seed: int) -> tuple[str, int, str]:
        return (entry.digest, seed, flags_key(self.run_flags(entry)))

    def decided_under(self, entry: Entry) -> dict[str, Any]:
        """What an entry's verdict depends on beyond its runs' numbers; a verdict is reused only under the same."""
        return {
            "tolerance": asdict(self.tol),
            "seeds": self.seeds_of(entry),
            "fresh_seeds": fresh_seeds_record(entry, self.seeds, self.seed_salt),
            "run_flags": self.run_flags(entry),
        }

    def has_runs(self, st: State, entry: Entry) -> bool:
        return all(self.run_key(entry, s) in st.runs for s in self.seeds_of(entry))

    def current_verdict(self, st: State, entry: Entry) -> dict[str, Any] | None:
        """The entry's verdict in the ledger when it was decided under these flags (a verdict under a looser
        tolerance, other seeds or other runs is decided again), else None."""
        v = st.verdicts.get(entry.digest)
        if v is None or not self.has_runs(st, entry):
            return None
        under = json.loads(json.dumps(self.decided_under(entry)))  # as the ledger holds it
        return v if all(v.get(k) == x for k, x in under.items()) else None


class Interrupted(Exception):
    pass


def _on_signal(signum: int, _frame: Any) -> None:
    raise Interrupted(signal.Signals(signum).name)


def list_entries(root: Path) -> tuple[list[Path], list[str]]:
    if not root.is_dir():
        raise FileNotFoundError(f"{root}: no such folder; pass a folder of entry folders")
    entries, skipped = [], []
    for p in sorted(root.iterdir()):
        if p.name.startswith(".") or p.is_symlink() or not p.is_dir():
            continue
        if not p.name.isprintable():
            # a newline in a name makes two lines of `ls > order` (the official's order file): one naming another folder
            skipped.append(
                f"skip {visible(p, 300)}: its name holds a control character (a newline, ...); rename it"
            )
        elif (p / "submission.json").is_file():
            entries.append(p.absolute())
        else:
            skipped.append(f"skip {visible(p, 300)}: not an entry (no submission.json)")
    return entries, skipped


def decide(entry: Entry, st: State, qcfg: QueueConfig, ledger: Path) -> dict[str, Any]:
    runs = [st.runs[k] for s in qcfg.seeds_of(entry) if (k := qcfg.run_key(entry, s)) in st.runs]
    try:
        rec = verdict_of(entry, runs, qcfg.tol, fresh_seeds_record(entry, qcfg.seeds, qcfg.seed_salt))
    except Exception as e:  # noqa: BLE001 - one entry's verdict never stops the batch (nor every resumption)
        diff = {"name": "verdict", "ok": False, "expected": "decided",
                "actual": f"the harness failed deciding it: {type(e).__name__}: {e}"[:400]}  # fmt: skip
        rec = refused_record(entry.root, entry.digest, entry.key, entry.track, entry.meta, [])
        rec.update(verdict=COULD_NOT_RUN, checks=[diff], differences=[diff], seeds=[r["seed"] for r in runs],
                   tolerance=asdict(qcfg.tol), fresh_seeds=fresh_seeds_record(entry, qcfg.seeds, qcfg.seed_salt))  # fmt: skip
    # with its tolerance, seeds and fresh_seeds: what it was decided under (QueueConfig.current_verdict)
    rec["run_flags"] = qcfg.run_flags(entry)
    append_ledger(ledger, rec)
    st.verdicts[entry.digest] = rec
    print(describe(rec), flush=True)
    return rec


def run_queue(qcfg: QueueConfig, ecfg: ExecutorConfig) -> dict[str, Any]:
    if ecfg.kind == "slurm":
        problem = slurm_problem()
        if problem:
            raise ValueError(NO_SLURM.format(why=problem))
    elif ecfg.kind != "local":
        raise ValueError(f"--executor {ecfg.kind!r}: the queue runs jobs on 'local' or 'slurm'")
    t_start = time.time()
    from harness.records.chain import read_order

    read_order(qcfg.order)  # a bad order file is one line now, not after the batch ran
    ledger = qcfg.ledger
    seen = sandbox_readable(ledger)
    if seen is not None:  # OUT is hidden from every phase; a ledger elsewhere is not
        raise ValueError(
            f"--ledger {ledger}: lies beneath {seen}, which every sandboxed training process may read (every "
            "entry's runs and verdicts); keep it in OUT or a folder of its own"
        )
    ledger.parent.mkdir(parents=True, exist_ok=True)
    st = read_state(ledger)
    paths, skipped = list_entries(qcfg.root)
    for line in skipped:
        print(line, flush=True)
    # 1. triage
    t0 = time.perf_counter()
    entries: list[Entry] = []
    triaged_fresh = 0
    digest_of: dict[Path, str] = {}
    for p in paths:
        entry, rec = triage(p, qcfg.preset, qcfg.sandbox, st, ledger)
        digest_of[p] = rec["entry_digest"]
        triaged_fresh += not rec.get("cached")
        mark = "ok  " if rec["ok"] else "FAIL"
        why = "" if rec["ok"] else f": {visible('; '.join(f'{n} {d}' for n, d in rec['failed']), 300)}"
        cached = " (from the ledger)" if rec.get("cached") else f" ({rec['time_s']:.1f} s)"
        print(f"triage {mark} {visible(rec['entry_key'], 80)}{cached}{why}", flush=True)
        if entry is not None:
            entries.append(entry)
    triage_s = time.perf_counter() - t0
    # 2. jobs
    todo: list[Job] = []
    skipped_jobs = 0
    runs_of: dict[str, str] = {}  # a folder of runs under OUT -> the digest whose runs it holds
    for e in entries:
        # the key holds 48 bits of the digest: an entry ground to share another's name and key (2^48 hashes, hours
        # on a GPU) and claimed seeds was given its run folders, where one of the two runs was refused
        runs_name = e.key if runs_of.setdefault(e.key, e.digest) == e.digest else f"{e.key}-{e.digest}"
        if (done := qcfg.current_verdict(st, e)) is not None:
            print(f"done {e.key}: {done['verdict']} (from the ledger)", flush=True)
            skipped_jobs += len(qcfg.seeds_of(e))
            continue
        track = TRACKS.get(e.track)
        if track is None:  # triage refuses an unknown track; a guard
            continue
        res = track_resources(track, ecfg)
        for s in qcfg.seeds_of(e):
            if qcfg.run_key(e, s) in st.runs:
                skipped_jobs += 1
                print(
                    f"done {e.key} seed {s}: job {st.runs[qcfg.run_key(e, s)].get('job_id')} (from the ledger)"
                )
                continue
            attempt = st.attempts[(e.digest, s)] + 1
            run_dir = qcfg.out / runs_name / f"seed-{s}-a{attempt}"
            task = {"entry_dir": str(e.root), "entry_digest": e.digest, "entry_key": e.key, "seed": s,
                    "preset": e.preset, "data": qcfg.data, "run_dir": str(run_dir),
                    "ledger": str(qcfg.out / "results.jsonl"), "queue_ledger": str(ledger),
                    "set": list(qcfg.overrides), "run_flags": qcfg.run_flags(e)}  # fmt: skip
            todo.append(Job(entry=e, seed=s, run_dir=run_dir, resources=res, task=task))
    for e in entries:  # every seed already run (a queue killed before it decided): decide now
        if qcfg.current_verdict(st, e) is None and not any(j.entry is e for j in todo):
            decide(e, st, qcfg, ledger)
    executor = _executor(ecfg, fresh_jobs_folder(ecfg.folder or qcfg.out / ".jobs")) if todo else None
    k = ecfg.max_parallel or (0 if ecfg.kind == "slurm" else max(1, (os.cpu_count() or 1) // max(
        [j.resources.cpus for j in todo] or [1])))  # fmt: skip
    in_flight: list[Job] = []
    waiting = list(todo)
    session_runs: list[dict[str, Any]] = []
    old = {s: signal.signal(s, _on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
    interrupted = None
    try:
        if ecfg.kind == "slurm":  # arrays, one per resource shape; Slurm keeps at most k of each running
            shapes: dict[JobResources, list[Job]] = {}
            for j in waiting:
                shapes.setdefault(j.resources, []).append(j)
            for group in shapes.values():
                for i in range(0, len(group), ARRAY_MAX):  # Slurm's default MaxArraySize is 1001
                    submit_jobs(executor, ecfg, group[i : i + ARRAY_MAX], k, ledger)
                in_flight += group
            waiting = []
        while waiting or in_flight:
            while waiting and len(in_flight) < k:
                j = waiting.pop(0)
                submit_jobs(executor, ecfg, [j], k, ledger)
                in_flight.append(j)
            for j in [j for j in in_flight if ended(j.handle)]:
                in_flight.remove(j)
                rec = job_record(j, ecfg)
                if rec.get("job_failed"):
                    append_ledger(ledger, rec)  # the job wrote nothing: say so (a restart runs it again)
                session_runs.append(rec)
                st.runs[qcfg.run_key(j.entry, j.seed)] = rec
                bpb = rec.get("val_bpb")
                print(f"job {j.handle.job_id} {rec['job_state']}: {j.entry.key} seed {j.seed} {rec.get('status')}"
                      + (f" val_bpb {bpb:.6f}" if isinstance(bpb, float) else f" ({rec.get('detail')})")
                      + f" [{len(session_runs)}/{len(todo)}]", file=sys.stderr, flush=True)  # fmt: skip
                e = j.entry
                if qcfg.has_runs(st, e):
                    decide(e, st, qcfg, ledger)
            if in_flight:
                time.sleep(ecfg.poll_s)
    except Interrupted as e:
        interrupted = str(e)
    finally:
        for s, h in old.items():
            signal.signal(s, h)
        if interrupted is not None or in_flight or waiting:
            for j in in_flight:
                j.handle.cancel(check=False)
    summary = summarize(
        qcfg, st, digest_of, session_runs, todo, skipped_jobs, triage_s, triaged_fresh, t_start, ecfg
    )
    summary["interrupted"] = interrupted
    append_ledger(ledger, summary)
    print_summary(summary)
    if interrupted:
        print(f"interrupted ({interrupted}): {len(in_flight)} job(s) in flight cancelled; run the same command "
              "again to resume (finished jobs are not run again)", file=sys.stderr)  # fmt: skip
        raise SystemExit(130)
    from harness.records.chain import build_chain, lines, markdown

    chain = build_chain(ledger, track=None, rule=None, order=read_order(qcfg.order))
    (qcfg.out / "chain.md").write_text(markdown(chain), encoding="utf-8")
    print("\n".join(lines(chain)))
    return summary


def summarize(
    qcfg: QueueConfig,
    st: State,
    digest_of: dict[Path, str],
    session_runs: list[dict[str, Any]],
    todo: list[Job],
    skipped_jobs: int,
    triage_s: float,
    triaged_fresh: int,
    t_start: float,
    ecfg: ExecutorConfig,
) -> dict[str, Any]:
    counts: Counter[str] = Counter()
    for d in digest_of.values():
        v = st.verdicts.get(d)
        counts[v["verdict"] if v else "pending"] += 1
    done = [r for r in session_runs if not r.get("job_failed")]
    res = {str(j.handle.job_id): j.resources for j in todo if j.handle is not None}
    gpu_h = sum(
        (r.get("job_wall_s") or 0) * res[str(r["job_id"])].gpus for r in done if str(r.get("job_id")) in res
    )
    cpu_h = sum(
        (r.get("job_wall_s") or 0) * res[str(r["job_id"])].cpus for r in done if str(r.get("job_id")) in res
    )
    in_job = [r["job_wall_s"] - r["pipeline_s"] for r in done if r.get("pipeline_s") and r.get("job_wall_s")]
    start = [r["started_unix_s"] - r["submitted_unix_s"] for r in done if r.get("started_unix_s")]
    seen = [r["seen_unix_s"] - r["ended_unix_s"] for r in done if r.get("ended_unix_s")]
    med = lambda xs: statistics.median(xs) if xs else None  # noqa: E731
    return {
        "format": SUMMARY_FORMAT,
        "format_version": FORMAT_VERSION,
        "root": str(qcfg.root),
        "executor": ecfg.kind,
        "entries": len(digest_of),
        "verdicts": {v: counts.get(v, 0) for v in (*VERDICTS, "pending")},
        "triage_s": triage_s,
        "triaged_fresh": triaged_fresh,
        "triage_entries_per_s": triaged_fresh / triage_s if triaged_fresh and triage_s > 0 else None,
        "jobs_run": len(session_runs),
        "jobs_failed": len(session_runs) - len(done),
        "jobs_skipped_from_ledger": skipped_jobs,
        "job_ids": [str(r.get("job_id")) for r in session_runs],
        "job_states": {str(r.get("job_id")): r.get("job_state") for r in session_runs},
        "gpu_hours": gpu_h / 3600,
        "cpu_hours": cpu_h / 3600,
        "overhead_in_job_s_median": med(in_job),
        "start_latency_s_median": med(start),
        "start_latency_s_min": min(start) if start else None,
        "end_latency_s_median": med(seen),
        "wall_s": time.time() - t_start,
    }


def print_summary(s: dict[str, Any]) -> None:
    def f(v: Any, spec: str = ".2f") -> str:
        return "-" if v is None else format(v, spec)

    print(
        f"queue {s['root']}: {s['entries']} entries; "
        + ", ".join(f"{k} {v}" for k, v in s["verdicts"].items())
        + f"\n  triage: {s['triaged_fresh']} in {s['triage_s']:.1f} s ({f(s['triage_entries_per_s'])} entries/s)"
        + f"\n  jobs: {s['jobs_run']} run ({s['jobs_failed']} ended without a record), "
        f"{s['jobs_skipped_from_ledger']} skipped (finished, from the ledger); {f(s['gpu_hours'], '.3f')} GPU-hours, "
        f"{f(s['cpu_hours'], '.3f')} CPU-hours"
        + f"\n  overhead per job: start latency median {f(s['start_latency_s_median'])} s (min "
        f"{f(s['start_latency_s_min'])} s; includes waiting for a slot), in-job {f(s['overhead_in_job_s_median'])} s, "
        f"seen after its end {f(s['end_latency_s_median'])} s; wall {s['wall_s']:.0f} s",
        flush=True,
    )


def cmd_queue(args: argparse.Namespace) -> int:
    root = Path(args.entries).absolute()
    out = Path(args.out).absolute() if args.out else root.parent / f"{root.name}-queue"
    qcfg = QueueConfig(
        root=root,
        out=out,
        ledger=Path(args.ledger).absolute() if args.ledger else out / "ledger.jsonl",
        data=str(Path(args.data).absolute()) if args.data else None,
        preset=args.preset,
        seeds=args.seeds,
        seed_salt=read_seed_salt(args.seed_salt_file),
        sandbox=args.sandbox,
        order=args.order,
        overrides=args.set,
        tol=Tolerance(k=args.k, floor_bpb=args.floor_bpb),
    )
    if args.seeds is not None and args.seeds < 1:
        raise ValueError(f"--seeds must be at least 1, got {args.seeds}")
    ecfg = ExecutorConfig(
        kind=args.executor,
        folder=Path(args.jobs_folder).absolute() if args.jobs_folder else None,
        partition=args.partition,
        time_min=args.time_min,
        cpus=args.cpus,
        gpus=args.gpus,
        mem_gb=args.mem_gb,
        max_parallel=args.max_parallel,
        poll_s=args.poll_s,
    )
    s = run_queue(qcfg, ecfg)
    return 0 if not s["jobs_failed"] and not s["verdicts"].get(COULD_NOT_RUN) else 3


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "queue", help="triage a folder of entries, then reproduce each as jobs (local or Slurm)"
    )
    p.add_argument("entries", help="a folder of entry folders (each with a submission.json)")
    p.add_argument("--executor", choices=("local", "slurm"), default="local")
    p.add_argument(
        "--max-parallel", type=int, default=0, help="K jobs at once (0: the node's CPUs / a job's)"
    )
    p.add_argument("--out", help="runs, job folders and the ledger (default: DIR-queue beside DIR)")
    p.add_argument("--ledger", help="the queue's ledger, its state (default: OUT/ledger.jsonl)")
    p.add_argument(
        "--jobs-folder",
        help="submitit's folder, shared with the nodes; each invocation makes a new one in it (default: OUT/.jobs)",
    )
    p.add_argument(
        "--data", help="dataset folder (default: the embedded corpus; a record track needs its own)"
    )
    p.add_argument("--preset", help="preset for every entry (default: the one each entry's claims name)")
    p.add_argument("--seeds", type=int, help="N fresh seeds per entry instead of the claimed ones")
    p.add_argument(
        "--seed-salt-file",
        metavar="FILE",
        help="a file holding the official's secret for fresh seeds (the same on resumption; recorded by its sha256)",
    )
    p.add_argument(
        "--set", action="append", default=[], metavar="SECTION.KEY=VALUE", help="official's override"
    )
    p.add_argument(
        "--sandbox", choices=("auto", "required"), default="auto", help="triage's model build sandbox"
    )
    p.add_argument("--order", help="file of entry folder names in submission order (before any date)")
    p.add_argument("--partition", help="slurm partition")
    p.add_argument("--time-min", type=int, help="job time limit in minutes (default: from the track)")
    p.add_argument("--cpus", type=int, help="CPUs per job (default: 8 per GPU, or the node's on a CPU track)")
    p.add_argument("--gpus", type=int, help="GPUs per job (default: the track's hardware)")
    p.add_argument("--mem-gb", type=float, help="memory per job in GB (default: the partition's)")
    p.add_argument("--poll-s", type=float, default=2.0, help="seconds between looks at the jobs")
    p.add_argument(
        "--k", type=float, default=Tolerance().k, help="standard errors allowed on the val_bpb mean"
    )
    p.add_argument("--floor-bpb", type=float, default=Tolerance().floor_bpb, help="bits/byte always allowed")
    p.set_defaults(func=cmd_queue)
