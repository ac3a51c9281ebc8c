"""The sealed train phase: staged, sandboxed, launched through torchrun, supervised, collected.

`run_train_phase` stages what training may see in a fresh folder (a view of the dataset holding the
training shards alone, a copy of the submission, the spec), plans the sandbox (isolation/sandbox.py:
the original dataset folder and every validation shard end up outside it), checks the plan by
trying to read a validation shard from inside it, then runs

    [unshare --mount --pid --fork --mount-proc --kill-child [--net] --]   (root, one node)
    python -m isolation.sandbox enter POLICY --                               (Landlock, capabilities)
    torchrun ... -m harness.train.rank SPEC                                      (harness/run/launch.py)

under `supervise` (harness/run/launch.py), whose ClockServer keeps the clock that counts and is the
only way to the training shards: they are outside the sandbox's rules (of the view, only its manifest
is readable), and a rank gets them as read-only descriptors over the wire when it asks for its first
batch. The state is handed over the same way and moved out of the ranks' reach. Other outputs are
moved to the run folder only as regular files; the log, the policy and the run folder itself stay
out of the sandbox's reach. A phase that ends on time can still be `over_budget`: when a rank took a
batch or ticked after the stop reading. The returned record is what result.json keeps as
phases.train: its times are the supervisor's; what train.json (the rank) says never replaces them.

`run_sealed_pack` runs `pgolf pack` for a submission's own codec.py the same way: its encode() is
training-side code, so it gets the sandbox and what is left of train_s + grace_s on the clock.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import secrets
import shutil
import signal
import site
import stat
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from data.io import open_regular, remove_tree, temp_folder
from data.loader import train_shard_paths
from data.manifest import MANIFEST_NAME, Manifest, dataset_locations, load_manifest, make_split_view
from harness.config import LaunchConfig
from harness.run.clock_server import ClockServer
from harness.run.launch import (
    CODEC_CLOCK_MARKER,
    LEFTOVER_WAIT_S,
    pack_command,
    pump_output,
    supervise,
    torchrun_command,
)
from harness.run.staging import stage_folder
from harness.train.budget import BudgetConfig
from harness.train.rank import (
    METRICS_FILE,
    RANK_REPORT_FIELDS,
    SPEC_FORMAT,
    SPEC_FORMAT_VERSION,
    STATE_FILE,
    TRAIN_RECORD,
    RankReport,
)
from isolation.monitor import parse_attempts
from isolation.processes import die_with_parent, kill_session, reap_token_processes
from isolation.sandbox import TOKEN_ENV, WARNING_PREFIX, SandboxPlan, parse_layers, plan_sandbox
from isolation.world import PageCacheReset
from scoring.statuses import Status
from scoring.worker.env import names, sandbox_env
from scoring.worker.process import OOM_MARKERS, kernel_oom_kills, oom_killed_since

PACK_STARTUP_S = 30.0
PROJECT_ROOT = Path(__file__).resolve().parents[2]
STAGE_IGNORE = ("*.pgolf", "*.safetensors")
"""Counted files training is not given (caches, .git, runs/ and bytecode are never staged: harness/run/staging.py)."""
OUTPUT_FILES = (TRAIN_RECORD, METRICS_FILE)
"""What the ranks leave in their output folder; the state is not among them: the supervisor takes it at the handover."""


def compile_cache_dir(out: Path, sandbox: str = "auto") -> Path:
    """torch.compile / Triton / CUDA caches: the phase's own (OUT/compile) unless $PGOLF_COMPILE_CACHE names one
    and the sandbox is not "required".

    A cache kept between runs is writable from every run's sandbox: a channel from one run to the next (and
    from anything else that writes there; what it holds is code the next run executes), so it is opt-in, and
    never on a record track (sandbox "required"), where nothing is shared between runs. Compiling happens in
    the off-clock warm-up, so a cold cache costs wall time, not budget.
    """
    shared = os.environ.get("PGOLF_COMPILE_CACHE")
    return Path(shared) if shared and sandbox != "required" else out / "compile"


def worker_import_path(env: dict[str, str], cwd: Path) -> list[str]:
    """sys.path as the ranks' interpreter will have it, with their environment (no '' entry)."""
    r = subprocess.run(
        [sys.executable, "-c", "import json, sys; print(json.dumps(sys.path[1:]))"],
        capture_output=True,
        text=True,
        env=env,
        cwd=cwd,
        timeout=60,
        check=True,
    )
    return [p for p in json.loads(r.stdout) if p]


def data_identity_of(manifest: Manifest, shard_names: list[str]) -> str:
    """sha256 over the training shards a run reads (name and sha256, in order) and the tokenizer's vocabulary size
    and file hash: equal on two nodes exactly when they would train on the same tokens."""
    by_name = {s.name: s.sha256 for s in manifest.shards}
    parts = [f"{n}:{by_name.get(n, '?')}" for n in shard_names]
    tok = manifest.raw.get("tokenizer", {})
    parts.append(f"vocab:{manifest.vocab_size}:{tok.get('sha256', '')}")
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()


def phase_env(
    base: dict[str, str], out: Path, token: str, threads: int, sandbox: str = "auto"
) -> dict[str, str]:
    """The training processes' environment: the allow-list of scoring/worker/env.py (nothing else of `base`,
    the official's: no keys, no tokens, no hint of where the data lives); caches and temp files in OUT."""
    cache = compile_cache_dir(out, sandbox)
    extra = [
        p
        for p in base.get("PYTHONPATH", "").split(os.pathsep)
        if p and os.path.realpath(p) != str(PROJECT_ROOT)
    ]
    env = sandbox_env(
        base,
        pythonpath=[str(PROJECT_ROOT), *extra],
        home=out / "home",
        tmp=out / "tmp",
        cache=out / "cache",
        compile_cache=cache,
        threads=threads,
        extra={"PYTHONUSERBASE": site.getuserbase(), TOKEN_ENV: token},
    )
    for d in ("home", "tmp", "cache"):
        (out / d).mkdir(parents=True, exist_ok=True)
    for d in ("inductor", "triton", "nv"):
        (cache / d).mkdir(parents=True, exist_ok=True)
    return env


def _collect(out: Path, run_dir: Path) -> None:
    """Move the phase's outputs into the run folder: regular files only (never a link a rank planted)."""
    names = [*OUTPUT_FILES, *(p.name for p in out.glob("train_error_rank*.txt"))]
    for name in names:
        src = out / name
        try:
            st = os.lstat(src)
        except OSError:
            continue
        if stat.S_ISREG(st.st_mode):
            shutil.move(str(src), str(run_dir / name))


def take_handed_state(handed: Path, run_dir: Path, sha256: str | None) -> bool:
    """Move the state the supervisor took at the handover into the run folder; whether it did.

    Only a state the supervisor hashed (`sha256`, its record's `state_sha256`) and still a regular file: a
    symbolic link a rank raced into the handover once stood there, and `is_file()` followed it, so the pack
    read whatever host file it named (weights trained off the clock, in an uncounted file)."""
    try:
        st = os.lstat(handed)
    except OSError:
        return False
    if sha256 is None or not stat.S_ISREG(st.st_mode):
        return False
    shutil.move(str(handed), str(run_dir / STATE_FILE))
    return True


def rank_failures(log_text: str) -> list[dict[str, Any]]:
    """Which ranks torchrun saw fail, and how (its failure summary: rank, exit code or signal)."""
    found: dict[int, dict[str, Any]] = {}
    for m in re.finditer(r"rank\s*:\s*(\d+) \(local_rank: (\d+)\)\s*\n\s*exitcode\s*:\s*(-?\d+)", log_text):
        rank, code = int(m.group(1)), int(m.group(3))
        sig = signal.Signals(-code).name if code < 0 and -code in signal.valid_signals() else None
        found[rank] = {"rank": rank, "local_rank": int(m.group(2)), "exitcode": code, "signal": sig}
    return [found[r] for r in sorted(found)]


def _probe(
    plan: SandboxPlan, policy: Path, env: dict[str, str], paths: dict[str, Path], cwd: Path
) -> tuple[dict[str, str], list[str]]:
    """Try to read each path from inside the sandbox: the check that the plan holds on this machine.

    Returns what each read got and the warnings of layers the kernel refused.
    """
    cmd = plan.wrap([sys.executable, "-m", "isolation.sandbox", "probe", *map(str, paths.values())], policy)
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=cwd, timeout=60, check=False)
    warnings = [
        line[len(WARNING_PREFIX) :] for line in r.stderr.splitlines() if line.startswith(WARNING_PREFIX)
    ]
    try:
        got = json.loads(r.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return {k: f"probe failed: {r.stderr.strip()[-300:]}" for k in paths}, warnings
    return {k: got.get(str(p), "?") for k, p in paths.items()}, warnings


# ---- What a rank says (never believed, only recorded) ----

RANK_REPORT_NOT_KEPT = frozenset({"api_version", "status", "world_size", "predicted_stop"})
"""RankReport fields the train phase's record leaves out: the harness records its own api_version, decides the
status and knows the world size from the launch; predicted_stop stays in the rank's train.json."""
RANK_RECORD_FIELDS = tuple(k for k in RANK_REPORT_FIELDS if k not in RANK_REPORT_NOT_KEPT)
"""The keys of a rank's train.json the harness keeps (their types: RANK_REPORT_FIELDS); anything else is dropped."""
RANK_RECORD_MAX_BYTES = 1 << 20


def read_rank_record(path: Path) -> dict[str, Any]:
    """A rank's train.json, checked: known keys of the right type, finite numbers, a bounded size.

    The file is written inside the sandbox by a process that ran submitted code, so it is hostile
    input: what it says is recorded as the rank's report (steps, tokens), never used for time, and a
    malformed file is the run's error, never the harness's crash.
    """
    try:
        st = os.lstat(path)
    except OSError:
        raise ValueError("training exited 0 but wrote no train.json") from None
    if not stat.S_ISREG(st.st_mode) or st.st_size > RANK_RECORD_MAX_BYTES:
        raise ValueError(f"train.json is not a regular file of at most {RANK_RECORD_MAX_BYTES:,} bytes")
    try:
        raw = json.loads(path.read_bytes(), parse_constant=lambda c: math.nan)
    except (ValueError, UnicodeDecodeError, RecursionError) as e:  # deep nesting: RecursionError
        raise ValueError(f"train.json is not valid JSON: {e}") from None
    report = RankReport.from_json(raw)  # the types, finite numbers, the role; unknown keys dropped
    return {k: v for k, v in report.to_json().items() if k in RANK_RECORD_FIELDS}


def stop_tolerance_s(budget: BudgetConfig) -> float:
    """Seconds past train_s a run may take to finish its last step and hand over its state: 2 % of the
    budget, at least 5 s, at most the grace period. Beyond it the run trained on the grace: over_budget.

    The supervisor cannot see a rank's steps (nothing a rank says is believed), so this bounds the last
    step's overshoot: a step longer than this that straddles the budget counts as training past it."""
    return min(max(5.0, 0.02 * budget.train_s), budget.grace_s) if math.isfinite(budget.train_s) else math.inf


def run_train_phase(
    *,
    submission_dir: Path,
    data_root: Path,
    run_dir: Path,
    stage_root: Path,
    model_config: dict[str, Any],
    hparams: dict[str, Any],
    seed: int,
    budget: BudgetConfig,
    launch: LaunchConfig,
    device: str,
    train_shards: int = 0,
    save_state: bool = True,
    base_env: dict[str, str] | None = None,
    gptq: dict[str, Any] | None = None,
    private: Sequence[Path] = (),
) -> dict[str, Any]:
    """Stage, sandbox, launch and supervise the train phase; returns its record (also the phase's status).
    `gptq`: the GPTQ pack step's config and codec (harness/train/gptq.py), run by rank 0 on the clock. `private`:
    more folders out of every broad read rule (a ledger kept elsewhere)."""
    stage = stage_root / "train-phase"
    out = stage / "out"
    out.mkdir(parents=True)
    train_view = make_split_view(data_root, stage / "data", "train")
    staged_sub = stage / "submission"
    stage_folder(submission_dir, staged_sub, exclude=STAGE_IGNORE)  # the folder rules: harness/run/staging.py
    manifest = load_manifest(data_root)
    val_shards = manifest.shard_paths("val")
    # the supervisor's end of the wire; at the handover it moves the state here, out of the ranks' reach
    handed_state = stage / f"handed-{STATE_FILE}"
    shards = train_shard_paths(train_view, train_shards or None)
    wire = ClockServer(
        shards=shards,
        local_ranks=launch.nproc_per_node,
        nodes=launch.nnodes,
        warmup_max_s=budget.warmup_max_s,
        state_src=out / STATE_FILE,
        state_dest=handed_state,
    )
    (stage / "spec.json").touch()  # a rule needs the file to exist; written below, once the plan is known
    token = secrets.token_hex(8)
    env = phase_env(
        base_env if base_env is not None else dict(os.environ),
        out,
        token,
        launch.threads_per_rank(),
        launch.sandbox,
    )
    plan = plan_sandbox(
        mode=launch.sandbox,
        network=launch.network,
        device=device,
        multi_node=launch.nnodes > 1,
        project_root=PROJECT_ROOT,
        read_paths=[train_view / MANIFEST_NAME, staged_sub, stage / "spec.json"],  # shards: over the wire
        write_paths=[out, compile_cache_dir(out, launch.sandbox)],
        protected=[data_root, *val_shards],
        # another dataset holds the validation text too; the folder of this run's own holds the other runs (their
        # trained states) and, by default, the ledger
        private=[stage_root, run_dir.parent, *private, *dataset_locations()],
        import_path=worker_import_path(env, out),
        extra_read=[p for p in launch.sandbox_read_paths.split(os.pathsep) if p],
        allow_missing=parse_layers(launch.allow_missing_layers),
        phase="train phase",
        memory_limit_bytes=launch.memory_limit_per_process_bytes(device),
        sockets=[wire.path.parent],
    )
    if "net" in plan.namespaces:
        env.update(GLOO_SOCKET_IFNAME="lo", NCCL_SOCKET_IFNAME="lo")
    policy = run_dir / "sandbox_policy.json"
    spec = {
        "format": SPEC_FORMAT,
        "format_version": SPEC_FORMAT_VERSION,
        "submission_dir": str(staged_sub),
        "wire": wire.address(),
        "vocab_size": manifest.vocab_size,
        # what this node trains on (the shards' hashes, in stream order, and the tokenizer's): the ranks of
        # several nodes compare it before the first step (harness/train/rank.py agree_on_data)
        "data_identity": data_identity_of(manifest, [p.name for p in shards]),
        "out_dir": str(out),
        "model_config": model_config,
        "hparams": hparams,
        "seed": seed,
        "budget_s": budget.train_s,
        "warmup_max_s": budget.warmup_max_s,
        "device": device,
        "threads": launch.threads_per_rank(),
        "save_state": save_state,
        "gptq": gptq,
        "monitor_rules": [{"path": r.path, "access": r.access} for r in plan.rules]
        if plan.mode != "off"
        else None,
    }
    (stage / "spec.json").write_text(json.dumps(spec, indent=1), encoding="utf-8")
    isolation: dict[str, Any] = {**plan.describe(), "environment": names(env)}  # names, never values
    if plan.mode != "off":
        probes = (
            {
                "validation_shard": val_shards[0],
                "dataset_manifest": data_root / "manifest.json",
                "train_view_manifest": train_view / "manifest.json",
            }
            if val_shards
            else {}
        )
        isolation["probe"], refused = _probe(plan, policy, env, probes, out) if probes else ({}, [])
        isolation["warnings"] += refused
        isolation["verified"] = (
            bool(probes)
            and isolation["probe"].get("train_view_manifest") == "read"
            and all(  # in a world of its own a protected path does not even exist
                v == "PermissionError" or (v == "FileNotFoundError" and plan.world is not None)
                for k, v in isolation["probe"].items()
                if k != "train_view_manifest"
            )
        )
        if not isolation["verified"]:
            isolation["warnings"].append(
                f"the sandbox did not hold on this machine (probe: {isolation['probe']})"
            )
        if launch.sandbox == "required" and not isolation["verified"]:
            raise RuntimeError(
                f"launch.sandbox = 'required' but the sandbox did not hold: {isolation['probe']}"
            )
    else:
        isolation["verified"] = False
    log_path = run_dir / "train.log"
    print(
        f"[train] {launch.nnodes}x{launch.nproc_per_node} rank(s) on {device}, budget {budget.train_s:.0f} s, "
        f"sandbox: {'landlock' if plan.landlock else 'no landlock'}"
        f"{', ' + '+'.join(plan.namespaces) + ' namespaces' if plan.namespaces else ''}"
        f", verified {isolation['verified']}",
        flush=True,
    )
    if plan.world is not None:  # nothing a model worker of an earlier run left in the page cache
        cache = PageCacheReset.open(roots=[r.path for r in plan.rules if r.access == "ro"])
        cache.reset()
        isolation["page_cache"] = cache.describe()
        cache.close()
    oom_kills = kernel_oom_kills()  # the kernel's count before: a rank's SIGKILL is its only if it rose
    outcome = supervise(
        plan.wrap(torchrun_command(launch, stage / "spec.json"), policy),
        out,
        budget,
        log_path,
        env,
        token,
        leftover_wait_s=LEFTOVER_WAIT_S if "pid" in plan.namespaces else 0.0,
        wire=wire,
    )
    _collect(out, run_dir)
    take_handed_state(handed_state, run_dir, outcome.clock.get("state_sha256"))
    remove_tree(stage)  # the ranks wrote in it: however deep
    log_text = log_path.read_text(encoding="utf-8", errors="replace") if log_path.is_file() else ""
    attempts = parse_attempts(log_text)
    isolation["attempts"] = attempts
    isolation["attempts_from_submission"] = sum(1 for a in attempts if a.get("submission_frame"))
    record: dict[str, Any] = {
        "status": outcome.status,
        "wall_s": outcome.wall_s,
        "detail": outcome.detail,
        "returncode": outcome.returncode,
        "startup_s": outcome.startup_s,
        "train_time_s": outcome.train_time_s,  # the supervisor's clock; the rank's is rank_reported_train_s
        "off_clock_s": outcome.off_clock_s,
        "clock_to_exit_s": outcome.clock_to_exit_s,
        "off_clock_accepted_s": outcome.off_clock_s,
        "clock": outcome.clock,
        **wire.data_record(),
        "world_size": launch.nnodes * launch.nproc_per_node,
        "leftover_processes_killed": len(outcome.leftover_pids),
        "process_token": token,
        "launch": {
            "nproc_per_node": launch.nproc_per_node,
            "nnodes": launch.nnodes,
            "rdzv_endpoint": launch.rdzv_endpoint,
            "device": device,
            "threads_per_rank": launch.threads_per_rank(),
        },
        "isolation": isolation,
        "machine_load": outcome.load,  # the supervisor's readings (harness/run/load.py), not the rank's
    }
    train_json = run_dir / TRAIN_RECORD
    if outcome.status == Status.OK:
        try:
            worker = read_rank_record(train_json)
        except ValueError as e:
            record.update(status=Status.ERROR, detail=str(e))
            worker = {}
        # the role is the launch's, never the rank's word: one node means this node packs and scores
        worker["role"] = "main" if launch.nnodes == 1 else worker.get("role", "main")
        record.update({k: v for k, v in worker.items() if k not in record})  # never replaces a measured field
        tolerance_s = stop_tolerance_s(budget)
        if record["status"] != Status.OK:
            pass
        elif outcome.train_time_s is not None and outcome.train_time_s > budget.train_s + tolerance_s:
            record.update(
                status=Status.OVER_BUDGET,
                detail=(
                    f"trained {outcome.train_time_s:.1f} s by the supervisor's clock: past budget.train_s = "
                    f"{budget.train_s:g} s + {tolerance_s:.1f} s to finish the last step (the grace period is for "
                    "stopping, not for training)"
                ),
            )
        elif worker.get("ticks_after_stop") or worker.get("batches_after_stop"):
            record.update(
                status=Status.OVER_BUDGET,
                detail=(
                    f"kept training after the clock said stop ({worker.get('batches_after_stop')} batches, "
                    f"{worker.get('ticks_after_stop')} ticks after the stop reading)"
                ),
            )
        elif worker["role"] == "main" and save_state and not (run_dir / STATE_FILE).is_file():
            record.update(status=Status.ERROR, detail="training wrote no state")
    if record["status"] != Status.OK:
        record["errors"] = {
            p.name: p.read_text(errors="replace")[-4000:]
            for p in sorted(run_dir.glob("train_error_rank*.txt"))
        }
        record["rank_failures"] = rank_failures(log_text)
        killed = [f"rank {f['rank']} killed by {f['signal']}" for f in record["rank_failures"] if f["signal"]]
        record["kernel_oom_kill"] = oom_killed_since(oom_kills)
        if killed and outcome.status == Status.ERROR:
            by = (
                ""
                if record["kernel_oom_kill"]
                else " (not by the kernel's OOM killer: its count did not rise)"
            )
            record["detail"] = f"{outcome.detail}: {', '.join(killed)}{by}"
        if record["status"] == Status.ERROR and ran_out_of_memory(record):
            limit = plan.memory_limit_bytes
            record.update(
                status=Status.OUT_OF_MEMORY,
                detail=f"training ran out of memory ({record['detail']}); each process of the phase may use "
                + (
                    f"{limit:,} bytes of address space (launch.memory_limit_bytes)"
                    if limit
                    else "the machine's memory"
                ),
            )
    return record


def ran_out_of_memory(record: dict[str, Any]) -> bool:
    """A failed train phase whose ranks failed for want of memory: an allocation refused (the address-space
    limit, or the machine's), or a rank killed by SIGKILL while the kernel's OOM kill count rose
    (`kernel_oom_kill`, the supervisor's reading of /proc/vmstat). A rank that SIGKILLs itself is an error:
    the signal alone does not say who sent it. The rank's own text only picks between two failures; it can
    never make a run ok."""
    texts = list(record.get("errors", {}).values())
    if any(marker in text for text in texts for marker in (*OOM_MARKERS, "MemoryError")):
        return True
    # SIGKILL with no rank reporting an exception (torchrun may SIGKILL the others after one failed)
    killed = any(f.get("signal") == "SIGKILL" for f in record.get("rank_failures", []))
    return not texts and killed and record.get("kernel_oom_kill") is True


# ---- A submission's codec: encoded on the clock, in the sandbox ----


def take_bytes(src: Path, dest: Path, max_bytes: int) -> bool:
    """Copy the regular file `src` (never through a link, nor a FIFO) to `dest` as bytes alone, into a new file of
    this process's own, and remove `src`; False (nothing taken) when `src` is no regular file. A file over
    `max_bytes` (the cap: it is never scored, its size is its verdict) is renamed instead, never copied (a sparse
    terabyte would fill the disk).

    What the sealed pack wrote is taken so, never renamed: a rename kept all a codec's process set on the file
    beside its bytes, its user xattrs (about 3 kB on ext4, 26 MB measured on tmpfs for an empty file, unbounded on
    XFS), its mode and times, and the scorer's workers read the artifact in place: bytes no cap counted."""
    with open_regular(src) as opened:
        if opened is None:
            return False
        fd, st = opened
        if st.st_size > max_bytes:
            os.replace(src, dest)
            return True
        tmp = dest.with_name(f".{dest.name}.{secrets.token_hex(4)}.taking")
        try:
            with os.fdopen(os.dup(fd), "rb") as fin, open(tmp, "xb") as fout:
                shutil.copyfileobj(fin, fout, 1 << 20)
            os.replace(tmp, dest)
        finally:
            tmp.unlink(missing_ok=True)
    src.unlink(missing_ok=True)
    return True


def run_sealed_pack(
    *,
    run_dir: Path,
    submission_dir: Path,
    data_root: Path,
    budget: BudgetConfig,
    launch: LaunchConfig,
    train_time_s: float,
    cap_bytes: int,
    log_path: Path,
    base_env: dict[str, str] | None = None,
    private: Sequence[Path] = (),
) -> tuple[int | None, dict[str, Any]]:
    """`pgolf pack --codec submission`, sandboxed like training, killed when the training budget (+ grace) runs out.

    The submission's encode() is training-side code: it sees the trained state (and whatever else train()
    returned in it: real training tokens, say) and its own folder, never the dataset, and its seconds count on
    the clock: train_time_s + encode_time_s must stay within train_s + the stop tolerance
    (stop_tolerance_s), else over_budget; the process is killed at train_s + grace_s (plus PACK_STARTUP_S for
    its imports).
    Returns (exit status, record); the artifact and pack.json land in `run_dir` as the plain pack's do.
    """
    with temp_folder("pgolf-pack-") as stage:
        out = stage / "out"
        out.mkdir()
        shutil.copy2(run_dir / STATE_FILE, stage / STATE_FILE)
        manifest = load_manifest(data_root)
        token = secrets.token_hex(8)
        env = phase_env(
            base_env if base_env is not None else dict(os.environ),
            out,
            token,
            launch.threads_per_rank(),
            launch.sandbox,
        )
        plan = plan_sandbox(
            mode=launch.sandbox,
            network=launch.network,
            device="cpu",
            multi_node=False,
            project_root=PROJECT_ROOT,
            read_paths=[stage / STATE_FILE, submission_dir],
            write_paths=[out],
            protected=[data_root, *manifest.shard_paths("val")],
            private=[stage, run_dir.parent, *private, *dataset_locations()],  # as the train phase's
            import_path=worker_import_path(env, out),
            extra_read=[p for p in launch.sandbox_read_paths.split(os.pathsep) if p],
            allow_missing=parse_layers(launch.allow_missing_layers),
            phase="sealed pack",
            memory_limit_bytes=launch.memory_limit_per_process_bytes("cpu"),
        )
        cmd = pack_command(
            stage / STATE_FILE, submission_dir, out / "artifact.pgolf", codec="submission", cap_bytes=cap_bytes,
            json_out=out / "pack.json",
        )  # fmt: skip
        allowed_s = max(budget.train_s + budget.grace_s - train_time_s, 0.0)
        print(f"[pack] the submission's codec, sandboxed, {allowed_s:.1f} s left on the clock", flush=True)
        t0 = time.monotonic()
        proc = subprocess.Popen(
            plan.wrap(cmd, run_dir / "pack_sandbox_policy.json"),
            stdout=subprocess.PIPE,  # the codec's output goes through a pipe this process owns
            preexec_fn=die_with_parent,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            env=env,
            cwd=out,
        )
        codec_start: list[float] = []  # when the pack's own line before codec.py came through the pipe
        pump = pump_output(proc, log_path, marker=CODEC_CLOCK_MARKER, seen=codec_start)
        try:
            proc.wait(timeout=allowed_s + PACK_STARTUP_S)
            killed = False
        except subprocess.TimeoutExpired:
            kill_session(proc, signal.SIGKILL)
            killed = True
        # what the pack left behind is killed as it exits, before its output is drained or its folder read, and
        # the encode's clock ends once the last of it is gone: a detached grandchild holding the output pipe
        # otherwise lived until the pipe closed or 5 s went by, off the clock, and rewrote the artifact
        leftovers = reap_token_processes(token, LEFTOVER_WAIT_S if "pid" in plan.namespaces else 0.0)
        t_exit = time.monotonic()
        pump.join(timeout=5)
        for name in ("artifact.pgolf", "pack.json"):
            take_bytes(out / name, run_dir / name, cap_bytes)
    # the encode's clock: from the line the pack printed before importing codec.py to the process's exit, both
    # this process's readings (without the line: from the launch); what pack.json says is recorded, not used
    clock_s = t_exit - (codec_start[0] if codec_start else t0)
    record: dict[str, Any] = {
        "status": Status.OK,
        "wall_s": t_exit - t0,
        "allowed_s": allowed_s,
        "encode_clock_s": clock_s,
        "encode_clock_from": "the pack's line before codec.py"
        if codec_start
        else "the launch (no line seen)",
        "leftover_processes_killed": len(leftovers),
        "isolation": {**plan.describe(), "environment": names(env)},  # names, never values
    }
    if killed:
        record.update(
            status=Status.OVER_BUDGET,
            detail=f"the codec's encode ran past the training budget + grace ({allowed_s:.1f} s left)",
        )
        return None, record
    reported = None
    if (run_dir / "pack.json").is_file():
        try:
            pack = json.loads((run_dir / "pack.json").read_text(encoding="utf-8"))
            reported = str(pack.get("encode_time_s"))[:40] if isinstance(pack, dict) else None
        except (ValueError, UnicodeDecodeError, RecursionError):  # deep nesting: RecursionError
            pack = None  # the pipeline's PackRecord check names the fault
        if isinstance(pack, dict):
            pack["artifact"] = str(run_dir / "artifact.pgolf")
            (run_dir / "pack.json").write_text(
                json.dumps(pack, indent=2, sort_keys=True) + "\n", encoding="utf-8"
            )
    # the clock holds whether or not the pack wrote its record: a codec that ran long and wrote none was once
    # `error` (no record) where its time made it `over_budget`
    record["encode_time_s"] = clock_s
    record["reported_encode_time_s"] = reported  # the pack process's own figure: beside submitted code
    record["train_plus_encode_s"] = train_time_s + clock_s
    # the encode is training-side code on the clock, handed whatever the state carries (real training
    # tokens in a buffer its decode gives back as zeros): it ends within the training budget and the stop
    # tolerance, as the last step does; the grace is for stopping, never for training or encoding
    limit_s = budget.train_s + stop_tolerance_s(budget)
    record["limit_s"] = limit_s
    if record["train_plus_encode_s"] > limit_s:
        record.update(
            status=Status.OVER_BUDGET,
            detail=(
                f"training + the codec's encode took {record['train_plus_encode_s']:.1f} s by the harness's "
                f"clock ({train_time_s:.1f} s + {clock_s:.1f} s): past train_s = {budget.train_s:g} s + "
                f"{stop_tolerance_s(budget):.1f} s of stop tolerance (the grace period is for stopping, not "
                f"for encoding; the pack record said encode_time_s {reported})"
            ),
        )
    return proc.returncode, record
