"""The train phase: staged, sandboxed, launched through torchrun, supervised against the budget.

`run_train_phase` stages what training may see in a fresh folder (a view of the dataset holding the
training shards alone, a copy of the submission, the spec), plans the sandbox (harness/sandbox.py:
the original dataset folder and every validation shard end up outside it), checks the plan by
trying to read a validation shard from inside it, then runs

    [unshare --mount --pid --fork --mount-proc --kill-child [--net] --]   (root only)
    python -m harness.sandbox enter POLICY --                               (Landlock, capabilities)
    python -m torch.distributed.run --nproc-per-node=N (--standalone | --nnodes=M --rdzv-backend=c10d
        --rdzv-endpoint=HOST:PORT --rdzv-id=ID) -m harness.worker SPEC

in its own session. `supervise` waits up to `startup_s` for the clock marker, then until clock start
+ off-clock warm-up (trusted up to warmup_max_s) + train_s + grace_s; past either deadline it sends
SIGTERM to the session, SIGKILL a few seconds later, and the phase is `over_budget`. torchrun puts
each rank in a session of its own, so a group signal does not reach the ranks: the PID namespace
(root) makes the kernel kill every process left once torchrun dies, and without it the supervisor
kills every process carrying the phase's token in its environment. A rank that dies takes the
phase to `error` (torchrun stops the others). Outputs are moved to the run folder only as regular
files; the log, the policy and the run folder itself stay out of the sandbox's reach. A phase that
ends on time can still be `over_budget`: when a rank took a batch or ticked after the stop reading.

`run_sealed_pack` runs `pgolf pack` for a submission's own codec.py the same way: its encode() is
training-side code, so it gets the sandbox and what is left of train_s + grace_s on the clock.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import signal
import site
import stat
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from data.manifest import load_manifest, make_split_view
from harness.budget import CLOCK_MARKER, BudgetConfig
from harness.sandbox import (
    TOKEN_ENV,
    SandboxPlan,
    kill_token_processes,
    parse_attempts,
    plan_sandbox,
    processes_with_token,
)
from harness.worker import METRICS_FILE, SPEC_FORMAT, SPEC_FORMAT_VERSION, STATE_FILE, TRAIN_RECORD

DEVICES = ("auto", "cpu", "cuda")
KILL_WAIT_S = 3.0
MONITOR_INTERVAL_S = 1.0
LEFTOVER_WAIT_S = 2.0
PACK_STARTUP_S = 30.0
POLL_S = 0.5
PROJECT_ROOT = Path(__file__).resolve().parents[1]
STAGE_IGNORE = ("__pycache__", "runs", ".git", "*.pgolf", "*.safetensors")
SCRUBBED_ENV = ("PG_DATA_DIR", "PGOLF_DATA", "HF_HOME", "HF_DATASETS_CACHE")
OUTPUT_FILES = (STATE_FILE, TRAIN_RECORD, METRICS_FILE, CLOCK_MARKER)


@dataclass(frozen=True, kw_only=True, slots=True)
class LaunchConfig:
    nproc_per_node: int = 1
    """Ranks per node (GPUs per node on CUDA; one GPU per rank)."""
    nnodes: int = 1
    rdzv_endpoint: str = ""
    """host:port of torchrun's c10d rendezvous for several nodes; empty: one standalone node."""
    rdzv_id: str = "pgolf"
    """The job's id at the rendezvous: the same on every node."""
    device: str = "auto"
    """cpu, cuda, or auto (cuda when available)."""
    threads: int = 0
    """torch intra-op threads per rank; 0: the machine's cores divided among its ranks."""
    sandbox: str = "auto"
    """auto: every isolation layer the machine offers (recorded); required: refuse to train without Landlock; off."""
    network: str = "auto"
    """auto: on one node and as root, a network namespace with loopback only; host: the machine's network."""
    sandbox_read_paths: str = ""
    """Extra folders training may read (os.pathsep-separated), e.g. a GPU driver's libraries outside /usr and /opt."""

    def __post_init__(self) -> None:
        if self.device not in DEVICES:
            raise ValueError(f"launch.device must be one of {DEVICES}, got {self.device!r}")
        if self.nproc_per_node < 1 or self.nnodes < 1:
            raise ValueError(f"launch.nproc_per_node and launch.nnodes must be >= 1, got {self.nproc_per_node}, {self.nnodes}")
        if self.nnodes > 1 and not self.rdzv_endpoint:
            raise ValueError("launch.nnodes > 1 needs launch.rdzv_endpoint = 'HOST:PORT' (the same on every node)")
        if self.rdzv_endpoint and ":" not in self.rdzv_endpoint:
            raise ValueError(f"launch.rdzv_endpoint must be HOST:PORT, got {self.rdzv_endpoint!r}")
        if self.threads < 0:
            raise ValueError(f"launch.threads must be >= 0, got {self.threads}")
        if self.sandbox not in ("auto", "off", "required"):
            raise ValueError(f"launch.sandbox must be 'auto', 'required' or 'off', got {self.sandbox!r}")
        if self.network not in ("auto", "host"):
            raise ValueError(f"launch.network must be 'auto' or 'host', got {self.network!r}")

    def resolved_device(self) -> str:
        if self.device == "auto":
            return "cuda" if torch.cuda.is_available() else "cpu"
        if self.device == "cuda" and not torch.cuda.is_available():
            raise ValueError(
                "launch.device = 'cuda' but this machine has no CUDA device. "
                "HINT: use a CPU preset (--preset cpu-smoke) or --set launch.device='cpu'"
            )
        if self.device == "cuda" and self.nproc_per_node > torch.cuda.device_count():
            raise ValueError(
                f"launch.nproc_per_node = {self.nproc_per_node} but this node has {torch.cuda.device_count()} GPU(s). "
                f"HINT: --nproc {torch.cuda.device_count()} (gradient accumulation keeps the global batch)"
            )
        return self.device

    def threads_per_rank(self) -> int:
        return self.threads or max(1, (os.cpu_count() or 1) // self.nproc_per_node)


def torchrun_command(cfg: LaunchConfig, spec_path: Path) -> list[str]:
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={cfg.nproc_per_node}"]
    if cfg.nnodes == 1 and not cfg.rdzv_endpoint:
        cmd.append("--standalone")
    else:
        cmd += [f"--nnodes={cfg.nnodes}", "--rdzv-backend=c10d", f"--rdzv-endpoint={cfg.rdzv_endpoint}", f"--rdzv-id={cfg.rdzv_id}"]
    # the agent wakes every monitor interval (a store round trip on c10d): once a second keeps it off the
    # ranks' cores on small machines, and a dead rank is still noticed within a second
    return [*cmd, "--max-restarts=0", f"--monitor-interval={MONITOR_INTERVAL_S}", "-m", "harness.worker", str(spec_path)]


# ---- Supervising ----


@dataclass(frozen=True)
class PhaseOutcome:
    status: str
    """ok, error, or over_budget."""
    returncode: int | None
    wall_s: float
    detail: str = ""
    startup_s: float | None = None
    """Launch to clock start (the supervisor's observation)."""
    clock_to_exit_s: float | None = None
    """Clock start to the end of the phase, less the accepted off-clock time."""
    off_clock_s: float = 0.0
    """Off-clock warm-up the supervisor accepted (at most budget.warmup_max_s)."""
    leftover_pids: list[int] = field(default_factory=list)


def _read_marker(path: Path) -> dict[str, float] | None:
    """The clock marker, if it is a small regular file holding valid numbers (it lives where training writes)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size > 4096:
            return None
        m = json.loads(os.read(fd, 4096))
        return {"start": float(m["clock_start_unix_s"]), "off": float(m.get("off_clock_s", 0.0))}
    except (OSError, ValueError, KeyError, TypeError):
        return None
    finally:
        os.close(fd)


def _kill_session(proc: subprocess.Popen, first: signal.Signals = signal.SIGTERM) -> None:
    for sig in dict.fromkeys((first, signal.SIGKILL)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=KILL_WAIT_S)
            return
        except subprocess.TimeoutExpired:
            continue


def reap_token_processes(token: str, wait_s: float) -> list[int]:
    """Processes of the phase still alive `wait_s` after it ended (a PID namespace's teardown is not instant): killed."""
    t_end = time.monotonic() + wait_s
    while processes_with_token(token) and time.monotonic() < t_end:
        time.sleep(0.05)
    return kill_token_processes(token)


def supervise(
    cmd: list[str], out_dir: Path, budget: BudgetConfig, log_path: Path, env: dict[str, str], token: str,
    leftover_wait_s: float = 0.0,
) -> PhaseOutcome:
    """Run `cmd` in its own session, enforce the deadlines, append its output to `log_path`.

    `leftover_wait_s`: how long the phase's processes may take to vanish by themselves after it ends
    (a PID namespace's teardown) before they are killed and counted as leftovers.
    """
    marker = out_dir / CLOCK_MARKER
    t_launch = time.time()
    start: float | None = None
    off = 0.0
    last_stat: tuple[int, int] | None = None

    def observe(now: float) -> None:
        nonlocal start, off, last_stat
        try:
            st = os.lstat(marker)
        except OSError:
            return
        if (st.st_mtime_ns, st.st_size) == last_stat:
            return
        last_stat = (st.st_mtime_ns, st.st_size)
        m = _read_marker(marker)
        if m is None:
            return
        if start is None:  # the first reading fixes the start; later ones may only add warm-up credit
            start = min(max(m["start"], t_launch), now)
        off = max(off, min(m["off"], budget.warmup_max_s))

    with open(log_path, "ab") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True, env=env, cwd=out_dir)
        status, detail = "ok", ""
        while proc.poll() is None:
            now = time.time()
            observe(now)
            deadline = t_launch + budget.startup_s if start is None else start + off + budget.train_s + budget.grace_s
            if now > deadline:
                status = "over_budget"
                detail = ("the training clock never started within budget.startup_s" if start is None else
                          f"training ran past budget.train_s + budget.grace_s = {budget.train_s + budget.grace_s:.1f} s")
                _kill_session(proc, signal.SIGKILL)  # the grace period was the chance to stop cleanly
                break
            time.sleep(POLL_S)
    t_end = time.time()
    observe(t_end)
    _kill_session(proc)  # the session's leftovers
    leftovers = reap_token_processes(token, leftover_wait_s)
    if status == "ok" and proc.returncode != 0:
        status, detail = "error", f"torchrun exited with status {proc.returncode}"
    return PhaseOutcome(
        status, proc.returncode, t_end - t_launch, detail,
        startup_s=None if start is None else start - t_launch,
        clock_to_exit_s=None if start is None else t_end - start - off,
        off_clock_s=off, leftover_pids=leftovers,
    )


# ---- The sealed train phase ----


def compile_cache_dir(out: Path) -> Path:
    """torch.compile / Triton / CUDA caches: the phase's own (OUT/compile) unless $PGOLF_COMPILE_CACHE names one.

    A cache kept between runs is writable from every run's sandbox: a channel from one run to the next
    (and from anything else that writes there), so it is opt-in. Compiling happens in the off-clock
    warm-up, so a cold cache costs wall time, not budget.
    """
    return Path(os.environ["PGOLF_COMPILE_CACHE"]) if os.environ.get("PGOLF_COMPILE_CACHE") else out / "compile"


def phase_env(base: dict[str, str], out: Path, plan: SandboxPlan, token: str, threads: int) -> dict[str, str]:
    """The training processes' environment: no hint of where the data lives; caches and temp files in OUT."""
    env = {k: v for k, v in base.items() if k not in SCRUBBED_ENV}
    cache = compile_cache_dir(out)
    extra = [p for p in base.get("PYTHONPATH", "").split(os.pathsep) if p and os.path.realpath(p) != str(PROJECT_ROOT)]
    env.update(
        PYTHONPATH=os.pathsep.join([str(PROJECT_ROOT), *extra]), PYTHONDONTWRITEBYTECODE="1", PYTHONUSERBASE=site.getuserbase(),
        HOME=str(out / "home"), TMPDIR=str(out / "tmp"), XDG_CACHE_HOME=str(out / "cache"),
        TORCHINDUCTOR_CACHE_DIR=str(cache / "inductor"), TRITON_CACHE_DIR=str(cache / "triton"),
        CUDA_CACHE_PATH=str(cache / "nv"), OMP_NUM_THREADS=str(threads), **{TOKEN_ENV: token},
    )
    if "net" in plan.namespaces:
        env.update(GLOO_SOCKET_IFNAME="lo", NCCL_SOCKET_IFNAME="lo")
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


def rank_failures(log_text: str) -> list[dict[str, Any]]:
    """Which ranks torchrun saw fail, and how (its failure summary: rank, exit code or signal)."""
    found: dict[int, dict[str, Any]] = {}
    for m in re.finditer(r"rank\s*:\s*(\d+) \(local_rank: (\d+)\)\s*\n\s*exitcode\s*:\s*(-?\d+)", log_text):
        rank, code = int(m.group(1)), int(m.group(3))
        sig = signal.Signals(-code).name if code < 0 and -code in signal.valid_signals() else None
        found[rank] = {"rank": rank, "local_rank": int(m.group(2)), "exitcode": code, "signal": sig}
    return [found[r] for r in sorted(found)]


def _probe(plan: SandboxPlan, policy: Path, env: dict[str, str], paths: dict[str, Path], cwd: Path) -> dict[str, str]:
    """Try to read each path from inside the sandbox: the check that the plan holds on this machine."""
    cmd = plan.wrap([sys.executable, "-m", "harness.sandbox", "probe", *map(str, paths.values())], policy)
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=cwd, timeout=60, check=False)
    try:
        got = json.loads(r.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return {k: f"probe failed: {r.stderr.strip()[-300:]}" for k in paths}
    return {k: got.get(str(p), "?") for k, p in paths.items()}


def run_train_phase(
    *, submission_dir: Path, data_root: Path, run_dir: Path, stage_root: Path, model_config: dict[str, Any],
    hparams: dict[str, Any], seed: int, budget: BudgetConfig, launch: LaunchConfig, device: str, train_shards: int = 0,
    save_state: bool = True, base_env: dict[str, str] | None = None,
) -> dict[str, Any]:
    """Stage, sandbox, launch and supervise the train phase; returns its record (also the phase's status)."""
    stage = stage_root / "train-phase"
    out = stage / "out"
    out.mkdir(parents=True)
    train_view = make_split_view(data_root, stage / "data", "train")
    staged_sub = stage / "submission"
    shutil.copytree(submission_dir, staged_sub, symlinks=True, ignore=shutil.ignore_patterns(*STAGE_IGNORE))
    manifest = load_manifest(data_root)
    val_shards = manifest.shard_paths("val")
    compile_cache_dir(out).mkdir(parents=True, exist_ok=True)
    (stage / "spec.json").touch()  # a rule needs the file to exist; written below, once the plan is known
    plan = plan_sandbox(
        mode=launch.sandbox, network=launch.network, device=device, multi_node=launch.nnodes > 1, project_root=PROJECT_ROOT,
        read_paths=[train_view, staged_sub, stage / "spec.json"], write_paths=[out, compile_cache_dir(out)],
        protected=[data_root, *val_shards], extra_read=[p for p in launch.sandbox_read_paths.split(os.pathsep) if p],
    )
    token = secrets.token_hex(8)
    env = phase_env(base_env if base_env is not None else dict(os.environ), out, plan, token, launch.threads_per_rank())
    policy = run_dir / "sandbox_policy.json"
    spec = {
        "format": SPEC_FORMAT, "format_version": SPEC_FORMAT_VERSION, "submission_dir": str(staged_sub),
        "data_dir": str(train_view), "out_dir": str(out), "model_config": model_config, "hparams": hparams, "seed": seed,
        "budget_s": budget.train_s, "warmup_max_s": budget.warmup_max_s, "device": device,
        "threads": launch.threads_per_rank(), "train_shards": train_shards, "save_state": save_state,
        "monitor_rules": [{"path": r.path, "access": r.access} for r in plan.rules] if plan.mode != "off" else None,
    }
    (stage / "spec.json").write_text(json.dumps(spec, indent=1), encoding="utf-8")
    isolation: dict[str, Any] = plan.describe()
    if plan.mode != "off":
        probes = {"validation_shard": val_shards[0], "dataset_manifest": data_root / "manifest.json",
                  "train_view_manifest": train_view / "manifest.json"} if val_shards else {}
        isolation["probe"] = _probe(plan, policy, env, probes, out) if probes else {}
        isolation["verified"] = bool(probes) and isolation["probe"].get("train_view_manifest") == "read" and all(
            v == "PermissionError" for k, v in isolation["probe"].items() if k != "train_view_manifest")
        if launch.sandbox == "required" and not isolation["verified"]:
            raise RuntimeError(f"launch.sandbox = 'required' but the sandbox did not hold: {isolation['probe']}")
    else:
        isolation["verified"] = False
    log_path = run_dir / "train.log"
    print(f"[train] {launch.nnodes}x{launch.nproc_per_node} rank(s) on {device}, budget {budget.train_s:.0f} s, "
          f"sandbox: {'landlock' if plan.landlock else 'no landlock'}"
          f"{', ' + '+'.join(plan.namespaces) + ' namespaces' if plan.namespaces else ''}"
          f", verified {isolation['verified']}", flush=True)
    outcome = supervise(plan.wrap(torchrun_command(launch, stage / "spec.json"), policy), out, budget, log_path, env, token,
                        leftover_wait_s=LEFTOVER_WAIT_S if "pid" in plan.namespaces else 0.0)
    _collect(out, run_dir)
    shutil.rmtree(stage, ignore_errors=True)
    log_text = log_path.read_text(encoding="utf-8", errors="replace") if log_path.is_file() else ""
    attempts = parse_attempts(log_text)
    isolation["attempts"] = attempts
    isolation["attempts_from_submission"] = sum(1 for a in attempts if a.get("submission_frame"))
    record: dict[str, Any] = {
        "status": outcome.status, "wall_s": outcome.wall_s, "detail": outcome.detail, "returncode": outcome.returncode,
        "startup_s": outcome.startup_s, "clock_to_exit_s": outcome.clock_to_exit_s,
        "off_clock_accepted_s": outcome.off_clock_s, "leftover_processes_killed": len(outcome.leftover_pids),
        "process_token": token,
        "launch": {"nproc_per_node": launch.nproc_per_node, "nnodes": launch.nnodes, "rdzv_endpoint": launch.rdzv_endpoint,
                   "device": device, "threads_per_rank": launch.threads_per_rank()},
        "isolation": isolation,
    }
    train_json = run_dir / TRAIN_RECORD
    if outcome.status == "ok":
        if not train_json.is_file():
            record.update(status="error", detail="training exited 0 but wrote no train.json")
        else:
            worker = json.loads(train_json.read_text(encoding="utf-8"))
            record.update({k: v for k, v in worker.items() if k not in ("status", "format", "format_version")})
            if worker.get("ticks_after_stop") or worker.get("batches_after_stop"):
                record.update(status="over_budget", detail=(
                    f"kept training after the clock said stop ({worker.get('batches_after_stop')} batches, "
                    f"{worker.get('ticks_after_stop')} ticks after the stop reading)"))
            elif worker.get("role") == "main" and save_state and not (run_dir / STATE_FILE).is_file():
                record.update(status="error", detail="training wrote no state")
    if record["status"] != "ok":
        record["errors"] = {p.name: p.read_text(errors="replace")[-4000:] for p in sorted(run_dir.glob("train_error_rank*.txt"))}
        record["rank_failures"] = rank_failures(log_text)
        killed = [f"rank {f['rank']} killed by {f['signal']}" for f in record["rank_failures"] if f["signal"]]
        if killed and outcome.status == "error":
            record["detail"] = f"{outcome.detail}: {', '.join(killed)}"
    return record


# ---- A submission's codec: encoded on the clock, in the sandbox ----


def run_sealed_pack(
    *, run_dir: Path, submission_dir: Path, data_root: Path, budget: BudgetConfig, launch: LaunchConfig, train_time_s: float,
    cap_bytes: int, log_path: Path, base_env: dict[str, str] | None = None,
) -> tuple[int | None, dict[str, Any]]:
    """`pgolf pack --codec submission`, sandboxed like training, killed when the training budget (+ grace) runs out.

    The submission's encode() is training-side code: it sees the trained state and its own folder,
    never the dataset, and its seconds count on the clock: train_time_s + encode_time_s must stay
    within train_s + grace_s (the process gets that much, plus PACK_STARTUP_S for its imports).
    Returns (exit status, record); the artifact and pack.json land in `run_dir` as the plain pack's do.
    """
    with tempfile.TemporaryDirectory(prefix="pgolf-pack-") as tmp:
        stage = Path(tmp)
        out = stage / "out"
        out.mkdir()
        shutil.copy2(run_dir / STATE_FILE, stage / STATE_FILE)
        manifest = load_manifest(data_root)
        plan = plan_sandbox(
            mode=launch.sandbox, network=launch.network, device="cpu", multi_node=False, project_root=PROJECT_ROOT,
            read_paths=[stage / STATE_FILE, submission_dir], write_paths=[out], protected=[data_root, *manifest.shard_paths("val")],
            extra_read=[p for p in launch.sandbox_read_paths.split(os.pathsep) if p],
        )
        token = secrets.token_hex(8)
        env = phase_env(base_env if base_env is not None else dict(os.environ), out, plan, token, launch.threads_per_rank())
        cmd = [sys.executable, "-m", "harness.cli", "pack", str(stage / STATE_FILE), "--submission", str(submission_dir),
               "--out", str(out / "artifact.pgolf"), "--codec", "submission", "--cap-bytes", str(cap_bytes),
               "--json-out", str(out / "pack.json")]
        allowed_s = max(budget.train_s + budget.grace_s - train_time_s, 0.0)
        print(f"[pack] the submission's codec, sandboxed, {allowed_s:.1f} s left on the clock", flush=True)
        t0 = time.time()
        with open(log_path, "ab") as log:
            proc = subprocess.Popen(plan.wrap(cmd, run_dir / "pack_sandbox_policy.json"), stdout=log, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, start_new_session=True, env=env, cwd=out)
            try:
                proc.wait(timeout=allowed_s + PACK_STARTUP_S)
                killed = False
            except subprocess.TimeoutExpired:
                _kill_session(proc, signal.SIGKILL)
                killed = True
        leftovers = reap_token_processes(token, LEFTOVER_WAIT_S if "pid" in plan.namespaces else 0.0)
        for name in ("artifact.pgolf", "pack.json"):
            if (out / name).is_file() and not (out / name).is_symlink():
                shutil.move(str(out / name), str(run_dir / name))
    record: dict[str, Any] = {"status": "ok", "wall_s": time.time() - t0, "allowed_s": allowed_s,
                              "leftover_processes_killed": len(leftovers), "isolation": plan.describe()}
    if killed:
        record.update(status="over_budget", detail=f"the codec's encode ran past the training budget + grace ({allowed_s:.1f} s left)")
    elif (run_dir / "pack.json").is_file():
        pack = json.loads((run_dir / "pack.json").read_text(encoding="utf-8"))
        pack["artifact"] = str(run_dir / "artifact.pgolf")
        (run_dir / "pack.json").write_text(json.dumps(pack, indent=2, sort_keys=True) + "\n", encoding="utf-8")
        record["encode_time_s"] = pack.get("encode_time_s")
        record["train_plus_encode_s"] = train_time_s + float(pack.get("encode_time_s") or 0.0)
        if record["train_plus_encode_s"] > budget.train_s + budget.grace_s:
            record.update(status="over_budget", detail="training + the codec's encode took longer than train_s + grace_s")
    return (None if killed else proc.returncode), record
