"""`pgolf bench runner`: the harness's overhead, as the ratio of training tokens/s through it to bare.

    pgolf bench runner [SUBMISSION] [--preset cpu-smoke] [--train-s 20] [--rounds 3] [--data DIR] [--set K=V ...]

Both sides run the same submission's train(ctx) (the naive baseline by default), with the same
config, seed, data, thread count and budget, one rank each:
- bare: `python -m harness.bench.runner bare SPEC` calls train(ctx) in a plain process, with a clock that
  only reads time.perf_counter() and the data loader itself: no torchrun, no supervisor, no monitor; no
  sandbox either for the project's own baselines, while any other submission's bare process is confined
  as a model worker is (below);
- harness: the real train phase (harness/run/train_phase.py): staging, sandbox, torchrun, worker, clock.
tokens/s = tokens trained / seconds on that side's clock when train() returned (the budget ends
both; the last step ends at the stop reading, so whole steps are timed). Steady tokens/s is taken
between the 2nd and the last logged step (metrics.jsonl), leaving out start-up. The rounds
alternate which side goes first; the ratio is of the medians. Figures are printed, never asserted.

A bare process runs submitted code, and `pgolf tune` (harness/commands/tune.py) runs one per trial, a command
an official may run on an entry: unless the code is one of the project's baselines (`confined=False`, the
GPU check and the bench's own default), the process runs in the model worker's sandbox (scoring/worker/
confined.py: its folder, the Python installation and the project's code to read, its trial folder to write,
namespaces, Landlock, seccomp, the allow-listed environment and the trial's own settings), and is handed the
training shards as read-only descriptors: nothing of the dataset's folder (the validation shards), nothing
of the official's environment or files. What it writes (metrics.jsonl, its stdout) is read back as a
hostile file is. The bench's in-process per-step timing imports a baseline's model.py only.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from data.io import read_regular
from harness.api import ClockReading, DistInfo, TrainContext, TrainingComplete, WarmupReport
from harness.train.clock import Snapshot
from harness.train.cpu import CpuTuner
from scoring.statuses import Status

BASELINE = Path(__file__).resolve().parents[2] / "baselines" / "naive_baseline"
BASELINES_DIR = BASELINE.parent
METRICS_MAX_BYTES = 64 << 20
"""The most of a bare process's metrics.jsonl read back (a line a step: a trial logs thousands, not millions)."""
BARE_ALLOWANCE_S = 900.0
"""A bare process is killed this long after its budget (start-up and a compilation off the clock included)."""


def is_baseline(submission: Path) -> bool:
    """The folder is one of the project's own baselines (code the project ships, not an entry's)."""
    return submission.resolve().parent == BASELINES_DIR.resolve()


class BareClock:
    """harness.api.BudgetClock with nothing but a perf_counter read per tick (one rank)."""

    def __init__(self, budget_s: float, device: torch.device, from_first_tick: bool = False):
        self.budget_s, self.device = budget_s, device
        self._t0 = time.perf_counter()
        self._off = 0.0
        self.steps = 0
        self.from_first_tick = from_first_tick
        """The budget counts from the first tick (pgolf tune: seconds of training, start-up left out)."""

    def elapsed_s(self) -> float:
        return time.perf_counter() - self._t0 - self._off

    def tick(self) -> ClockReading:
        if self.from_first_tick and not self.steps:
            self._t0, self._off = time.perf_counter(), 0.0
        e = (
            self.elapsed_s()
        )  # no device sync: a bare loop lets the CPU run ahead (the harness syncs every step)
        stop = e >= self.budget_s
        self.steps += not stop
        return ClockReading(e, max(self.budget_s - e, 0.0), stop)

    def warmup(
        self,
        step: Callable[[torch.Tensor, torch.Tensor], object],
        *,
        modules: Sequence[nn.Module],
        optimizers: Sequence[torch.optim.Optimizer] = (),
        steps: int,
        batch_tokens: int,
        seq_len: int,
        vocab_size: int,
    ) -> WarmupReport:
        t0 = time.perf_counter()
        snap = Snapshot(modules, optimizers, self.device.type == "cuda")
        gen = torch.Generator().manual_seed(0)
        for _ in range(steps):
            tok = torch.randint(0, vocab_size, (batch_tokens + 1,), generator=gen).to(self.device)
            step(tok[:-1].view(-1, seq_len), tok[1:].view(-1, seq_len))
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        snap.restore()
        self._off += time.perf_counter() - t0
        return WarmupReport(steps, time.perf_counter() - t0, snap.verify())


def bare_main(spec_path: str, inline: bool = False) -> int:
    """One bare run (a subprocess of the bench, of `pgolf tune` or of scripts/gpu_check.py). Prints one JSON
    line. `inline`: `spec_path` is the spec's JSON itself."""
    from data.loader import DistributedTokenLoader, ShardStream
    from data.manifest import load_manifest
    from harness.train.rank import RankLogger, state_of
    from harness.train.submitted import import_submission_file

    spec = json.loads(spec_path if inline else Path(spec_path).read_text(encoding="utf-8"))
    torch.set_num_threads(spec["threads"])
    if spec.get("interop_threads"):  # before any inter-op work (pgolf tune measures it)
        torch.set_num_interop_threads(spec["interop_threads"])
    device = torch.device("cuda", 0) if spec["device"] == "cuda" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
        torch.set_float32_matmul_precision("high")
    random.seed(spec["seed"])
    np.random.seed(spec["seed"])
    torch.manual_seed(spec["seed"])
    if "shards" in spec:  # confined: the training shards as descriptors, no dataset folder to read
        stream = ShardStream.from_descriptors([(n, int(c), int(fd)) for n, c, fd in spec["shards"]])
        loader = DistributedTokenLoader(stream, 0, 1, device, pin_memory=True)
        vocab_size = int(spec["vocab_size"])
    else:
        manifest = load_manifest(spec["data_dir"])
        loader = DistributedTokenLoader(manifest.shard_paths("train"), 0, 1, device, pin_memory=True)
        vocab_size = manifest.vocab_size
    out = Path(spec["out_dir"])
    clock = BareClock(spec["budget_s"], device, from_first_tick=spec.get("from_first_tick", False))
    log = RankLogger(True, out)
    cpu = CpuTuner(clock=clock, gpu=device.type == "cuda", log=log.info)
    ctx = TrainContext(
        hparams=spec["hparams"],
        model_config=spec["model_config"],
        data=loader,
        dist=DistInfo(rank=0, world_size=1, local_rank=0, device=device, backend="none"),
        clock=clock,
        log=log,
        seed=spec["seed"],
        vocab_size=vocab_size,
        submission_dir=Path(spec["submission_dir"]),
        scratch_dir=out,
        cpu=cpu,
    )
    clock._t0 = time.perf_counter()  # as the harness: the clock starts before the submission is imported
    train_fn = import_submission_file(
        Path(spec["submission_dir"]) / "train.py", "pgolf_submission_train"
    ).train
    try:
        result = train_fn(ctx)
    except TrainingComplete as done:
        result = done.result
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elapsed = clock.elapsed_s()
    state_of(result)
    print(
        json.dumps(
            {
                "train_time_s": elapsed,
                "tokens_seen": loader.tokens_consumed,
                "steps": clock.steps,
                "off_clock_s": clock._off,
                "cpu": cpu.report(),
            }
        ),
        flush=True,
    )
    return 0


def steady_tokens_per_s(metrics_path: Path, tokens_per_step: int, from_step: int = 2) -> float | None:
    """Tokens/s between the `from_step`-th and the last logged step (needs `elapsed_s` in the metrics).

    A step's logged `elapsed_s` is the clock at its start, so this leaves out start-up (imports, model
    build, the first step) and the last step."""
    try:  # the submission's file: no link followed, no FIFO waited on, bounded
        text = read_regular(metrics_path, METRICS_MAX_BYTES).decode("utf-8", errors="replace")
    except (OSError, ValueError):
        return None
    rows = []
    for line in text.splitlines():
        try:
            r = json.loads(line)
        except (ValueError, RecursionError):
            continue
        if (
            isinstance(r, dict)
            and all(
                isinstance(r.get(k), int | float) and not isinstance(r.get(k), bool)
                for k in ("step", "elapsed_s")
            )
            and r["step"] >= from_step
        ):
            rows.append(r)
    if len(rows) < 2 or rows[-1]["elapsed_s"] <= rows[0]["elapsed_s"]:
        return None
    return (
        (rows[-1]["step"] - rows[0]["step"])
        * tokens_per_step
        / (rows[-1]["elapsed_s"] - rows[0]["elapsed_s"])
    )


def run_bare(
    *,
    submission: Path,
    data_root: Path,
    cfg: Any,
    budget_s: float,
    threads: int,
    device: str,
    workdir: Path,
    env: dict[str, str] | None = None,
    interop_threads: int = 0,
    hparams: dict[str, Any] | None = None,
    from_first_tick: bool = False,
    confined: bool = True,
    sandbox: str = "auto",
) -> dict[str, Any]:
    """One bare process of `submission`'s train(ctx); its last stdout line (a JSON record) with "metrics" added.
    `env` is the process's environment (default this one's) unconfined; confined (the default: see the module
    docstring), the allow-listed one with `env`'s entries (a trial's settings: OMP_PROC_BIND, LD_PRELOAD) over
    it."""
    workdir.mkdir(parents=True, exist_ok=True)
    spec: dict[str, Any] = {
        "submission_dir": str(submission),
        "data_dir": str(data_root),
        "out_dir": str(workdir),
        "model_config": cfg.model,
        "hparams": hparams if hparams is not None else cfg.train,
        "seed": cfg.tables["run"]["seed"],
        "budget_s": budget_s,
        "threads": threads,
        "interop_threads": interop_threads,
        "from_first_tick": from_first_tick,
        "device": device,
    }
    if confined:
        return _run_bare_confined(spec, workdir, device, threads, env or {}, budget_s, sandbox)
    (workdir / "spec.json").write_text(json.dumps(spec))
    env = dict(env if env is not None else os.environ)
    env.update(OMP_NUM_THREADS=str(threads), PYTHONPATH=str(Path(__file__).resolve().parents[2]))
    r = subprocess.run(
        [sys.executable, "-m", "harness.bench.runner", "bare", str(workdir / "spec.json")],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    if r.returncode != 0:
        raise RuntimeError(f"the bare run failed:\n{r.stderr[-3000:]}")
    rec = json.loads(r.stdout.strip().splitlines()[-1])
    rec["metrics"] = str(workdir / "metrics.jsonl")
    return rec


def _run_bare_confined(
    spec: dict[str, Any],
    workdir: Path,
    device: str,
    threads: int,
    env: dict[str, str],
    budget_s: float,
    sandbox: str,
) -> dict[str, Any]:
    """run_bare in the model worker's sandbox: the training shards as descriptors, `workdir` its one write folder."""
    from data.manifest import dataset_locations, load_manifest
    from data.shards import read_header
    from isolation.processes import kill_group_reaped
    from isolation.sandbox import plan_sandbox
    from scoring.worker.confined import (
        PRIVATE_DIRS,
        PROJECT_ROOT,
        WORKER_ISOLATION,
        OutputTail,
        confined_import_path,
        worker_env,
    )

    manifest = load_manifest(spec.pop("data_dir"))
    for d in PRIVATE_DIRS:
        (workdir / d).mkdir(parents=True, exist_ok=True)
    submission = Path(spec["submission_dir"])
    plan = plan_sandbox(
        mode=sandbox,
        device=device,
        project_root=PROJECT_ROOT,
        read_paths=[submission],
        write_paths=[workdir],
        protected=(Path(manifest.root),),
        private=dataset_locations(),
        import_path=confined_import_path(),
        phase="bare training",
        **WORKER_ISOLATION,
    )
    fds: list[int] = []
    try:
        shards = []
        for path in manifest.shard_paths("train"):
            count = read_header(path)
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
            fds.append(fd)
            shards.append([path.name, count, fd])
        spec.update(shards=shards, vocab_size=manifest.vocab_size)
        full_env = worker_env(workdir, threads)
        full_env.update(env)  # the trial's own settings
        cmd = [sys.executable, "-P", "-B", "-m", "harness.bench.runner", "bare-json", json.dumps(spec)]
        policy = workdir.with_name(workdir.name + "-policy.json")  # outside the process's own folder
        proc = subprocess.Popen(
            plan.wrap(cmd, policy),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            pass_fds=tuple(fds),
            env=full_env,
            cwd=workdir / "home",
            start_new_session=True,
        )
    finally:
        for fd in fds:
            os.close(fd)
    output = OutputTail()
    drain = threading.Thread(target=output.drain, args=(proc.stdout,), daemon=True)
    drain.start()
    try:
        code: int | None = proc.wait(timeout=budget_s + BARE_ALLOWANCE_S)
    except subprocess.TimeoutExpired:
        code = None
    finally:
        kill_group_reaped(proc)
        drain.join(timeout=2)
    said = output.text()
    if code != 0:
        how = f"ran past {budget_s + BARE_ALLOWANCE_S:.0f} s" if code is None else f"exit status {code}"
        raise RuntimeError(f"the bare run failed ({how}, in its sandbox):\n{said[-3000:]}")
    rec: dict[str, Any] | None = None
    for line in reversed(said.splitlines()):
        try:
            found = json.loads(line)
        except (ValueError, RecursionError):
            continue
        if isinstance(found, dict) and all(
            isinstance(found.get(k), int | float) and not isinstance(found.get(k), bool)
            for k in ("train_time_s", "tokens_seen", "steps")
        ):
            rec = found
            break
    if rec is None:
        raise RuntimeError(f"the bare run printed no record (in its sandbox):\n{said[-3000:]}")
    rec["metrics"] = str(workdir / "metrics.jsonl")
    return rec


def run_harness(
    *, submission: Path, data_root: Path, cfg: Any, budget_s: float, device: str, workdir: Path
) -> dict[str, Any]:
    from harness.run.train_phase import run_train_phase

    workdir.mkdir(parents=True, exist_ok=True)
    budget = replace(cfg.section("budget"), train_s=budget_s)
    rec = run_train_phase(
        submission_dir=submission,
        data_root=data_root,
        run_dir=workdir,
        stage_root=workdir,
        model_config=cfg.model,
        hparams=cfg.train,
        seed=cfg.tables["run"]["seed"],
        budget=budget,
        launch=cfg.section("launch"),
        device=device,
        save_state=False,
    )
    if rec["status"] != Status.OK:
        raise RuntimeError(
            f"the harness run ended {rec['status']}: {rec.get('detail')}\n{(workdir / 'train.log').read_text()[-3000:]}"
        )
    rec["metrics"] = str(workdir / "metrics.jsonl")
    return rec


def per_step_cost_us(
    model_config: dict[str, Any], submission: Path, batch_tokens: int, seq_len: int, n: int = 20_000
) -> dict[str, float]:
    """The harness's own work per training step, timed in-process (what the end-to-end ratio cannot resolve).

    Harness side: HarnessClock.tick() + DataGate.next_batch() (over a stub stream) + the access
    monitor called once per audit event a training step raises (counted on one real forward/backward/
    Adam step of the submission's model). Bare side: BareClock.tick() + the stub stream.
    """
    import sys as _sys

    from harness.train.clock import DataGate, HarnessClock
    from harness.train.submitted import import_submission_file
    from isolation.monitor import AccessMonitor

    x = torch.zeros(batch_tokens // seq_len, seq_len, dtype=torch.long)

    class Stub:
        tokens_consumed = 0

        def next_batch(self, b: int, t: int) -> tuple[torch.Tensor, torch.Tensor]:
            return x, x

    model = import_submission_file(submission / "model.py", "pgolf_bench_model").build_model(
        dict(model_config)
    )
    opt = torch.optim.Adam(model.parameters(), lr=0.0)
    counting = [False, 0]

    def count(event: str, args: tuple[Any, ...]) -> None:
        if counting[0]:
            counting[1] += 1

    _sys.addaudithook(count)  # this process only trains this one step
    xs = x[:1]
    counting[0] = True
    model(xs).float().logsumexp(-1).mean().backward()
    opt.step()
    counting[0] = False
    events = counting[1]
    one = DistInfo(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"), backend="none")
    clock = HarnessClock(1e9, one)
    gate, stub = DataGate(Stub(), clock), Stub()
    mon = AccessMonitor(rank=0, read=["/"], listing=[], write=[], attribute_to="/nonexistent")
    clock.start()
    t0 = time.perf_counter()
    for _ in range(n):
        clock.tick()
        gate.next_batch(batch_tokens, seq_len)
        for _ in range(events):
            mon("builtins.id", (0,))
    harness_us = (time.perf_counter() - t0) / n * 1e6
    bare = BareClock(1e9, torch.device("cpu"))
    t0 = time.perf_counter()
    for _ in range(n):
        bare.tick()
        stub.next_batch(batch_tokens, seq_len)
    bare_us = (time.perf_counter() - t0) / n * 1e6
    return {"audit_events_per_step": float(events), "harness_us": harness_us, "bare_us": bare_us}


def cmd_runner(args: argparse.Namespace) -> int:
    from data.embedded import ensure_embedded_dataset
    from harness.config import load_config

    submission = Path(args.submission).resolve()
    cfg = load_config(submission, args.preset, args.set)
    launch = cfg.section("launch")
    if launch.nproc_per_node != 1 or launch.nnodes != 1:
        raise ValueError(
            "pgolf bench runner compares one rank with one bare process: use a one-rank preset (e.g. cpu-smoke)"
        )
    device = launch.resolved_device()
    data_root = Path(args.data).resolve() if args.data else ensure_embedded_dataset()
    threads = launch.threads_per_rank()
    tokens_per_step = int(cfg.train.get("train_batch_tokens", 0))
    print(
        f"bench runner: {submission.name} preset {args.preset}, {device}, {threads} thread(s), budget {args.train_s:.0f} s, "
        f"{args.rounds} round(s), load average {os.getloadavg()[0]:.2f}",
        flush=True,
    )
    rows: dict[str, list[tuple[float, float | None]]] = {"bare": [], "harness": []}
    with tempfile.TemporaryDirectory(prefix="pgolf-bench-") as tmp:
        for i in range(args.rounds):
            order = ("bare", "harness") if i % 2 == 0 else ("harness", "bare")
            for side in order:
                wd = Path(tmp) / f"{side}{i}"
                if side == "bare":
                    rec = run_bare(
                        submission=submission,
                        data_root=data_root,
                        cfg=cfg,
                        budget_s=args.train_s,
                        threads=threads,
                        device=device,
                        workdir=wd,
                        confined=not is_baseline(submission),
                    )
                else:
                    rec = run_harness(
                        submission=submission,
                        data_root=data_root,
                        cfg=cfg,
                        budget_s=args.train_s,
                        device=device,
                        workdir=wd,
                    )
                tps = rec["tokens_seen"] / rec["train_time_s"]
                steady = (
                    steady_tokens_per_s(Path(rec["metrics"]), tokens_per_step) if tokens_per_step else None
                )
                rows[side].append((tps, steady))
                print(
                    f"  round {i + 1} {side:8s} {rec['steps']:5d} steps  {rec['train_time_s']:7.2f} s  "
                    f"{tps:10,.0f} tokens/s  steady {steady or float('nan'):10,.0f} tokens/s  "
                    f"step {1000 * rec['train_time_s'] / max(rec['steps'], 1):7.1f} ms",
                    flush=True,
                )
    med = {s: statistics.median(t for t, _ in v) for s, v in rows.items()}
    pairs = [h[0] / b[0] for h, b in zip(rows["harness"], rows["bare"], strict=True)]
    print(f"median tokens/s: bare {med['bare']:,.0f}  harness {med['harness']:,.0f}")
    steady_b = [s for _, s in rows["bare"] if s]
    steady_h = [s for _, s in rows["harness"] if s]
    if steady_b and steady_h:
        print(
            f"steady-state ratio (medians, from the 2nd logged step): {statistics.median(steady_h) / statistics.median(steady_b):.4f}"
        )
    print(f"per-round ratios: {' '.join(f'{r:.4f}' for r in pairs)}  (median {statistics.median(pairs):.4f})")
    if tokens_per_step and not is_baseline(submission):
        print("per-step harness work, in-process: not timed (it imports the model.py of a baseline only)")
    elif tokens_per_step:
        cost = per_step_cost_us(cfg.model, submission, tokens_per_step, int(cfg.train["train_seq_len"]))
        step_us = 1e6 * tokens_per_step / med["bare"]
        print(
            f"per-step harness work, in-process: {cost['harness_us']:.1f} us (bare {cost['bare_us']:.1f} us; "
            f"{cost['audit_events_per_step']:.0f} audit events per step) = "
            f"{100 * (cost['harness_us'] - cost['bare_us']) / step_us:.4f}% of a {step_us / 1000:.0f} ms step"
        )
    print(f"harness/bare tokens/s ratio: {med['harness'] / med['bare']:.4f}")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("runner", help="harness vs bare training tokens/s (the harness's overhead)")
    p.add_argument(
        "submission", nargs="?", default=str(BASELINE), help="submission folder (default: the naive baseline)"
    )
    p.add_argument("--preset", default="cpu-smoke", help="preset (default cpu-smoke)")
    p.add_argument(
        "--train-s", type=float, default=20.0, help="training budget of each run, seconds (default 20)"
    )
    p.add_argument(
        "--rounds", type=int, default=3, help="bare/harness pairs, alternating which goes first (default 3)"
    )
    p.add_argument("--data", help="dataset folder (default: the embedded corpus)")
    p.add_argument(
        "--set", action="append", default=[], metavar="SECTION.KEY=VALUE", help="override one config key"
    )
    p.set_defaults(func=cmd_runner)


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "bare":
        sys.exit(bare_main(sys.argv[2]))
    if len(sys.argv) == 3 and sys.argv[1] == "bare-json":  # confined: the spec itself, no file to read
        sys.exit(bare_main(sys.argv[2], inline=True))
    sys.exit("usage: python -m harness.bench.runner bare SPEC.json  (started by `pgolf bench runner`)")
