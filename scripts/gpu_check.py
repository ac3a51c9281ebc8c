"""GPU check: does each baseline reproduce its record's speed, and what does the harness cost, in one command.

    python scripts/gpu_check.py                          # one GPU, the `one-gpu` presets, 30 s of training each (~6 min)
    python scripts/gpu_check.py --train-s 20 --baselines naive_baseline,int6_era
    python scripts/gpu_check.py --device cpu --train-s 5 # the CPU path of this script (`tiny` presets)

Uses the machine's preinstalled PyTorch and the project's own code only (no downloads; the sandbox,
the worker and the bench need no package beyond torch and numpy; the state is not saved). It writes
synthetic datasets (uniform random token ids < 1024, and < 8192 for a model of vocab 8192; one
training shard each: the content does not matter for speed), then:

1. each baseline (baselines/naive_baseline, int6_era, sp8192_era) runs its `one-gpu` preset through the
   harness (harness/run/train_phase.py: staging, sandbox, torchrun, worker, a clock that syncs the GPU and
   reads time every step) for --train-s seconds, its torch.compile warm-up off the clock. Its ms/step
   (steady: between the 2nd and the last logged step, every step logged) is printed beside its record's
   own: the record ran 8 GPUs with the same global batch, so one GPU doing 8 gradient-accumulation
   micro-steps should take about 8x the record's ms/step (a little less: one GPU has no all-reduce, and
   Muon's Newton-Schulz, sharded over 8 ranks in the record, is done once, not 8 times). The records'
   figures are constants below (RECORDS), read from their logs, which are not on a GPU machine;
2. bare: `python -m harness.bench.runner bare` runs the naive baseline's same train() with the same config,
   a clock that only reads time, no torchrun, no sandbox: the harness/bare tokens/s ratio is the harness's cost.

Overrides for the speed check, printed at start: every step logged (`train.train_log_every=1`, for the
steady figure; the harness syncs every step anyway), 6 compile warm-up steps (20 in the presets; the
graphs compile in the first ones), int6_era's late QAT off (a short budget is all warmdown, so QAT would
switch on at step 0 and recompile on the clock; the record ran it for its last 7 % of steps),
sp8192_era's GPTQ off (it is not step time, and its 12 s reserve would shorten a short run). sp8192_era's
depth recurrence switches on at 35 % of the budget, as in the record: its two phases are compared
separately (the record's figures per phase are derived from its log, see RECORDS).

A baseline whose run fails is reported in one line and the others go on; one table ends the output.
Isolation: the machine is probed first (isolation/sandbox.py). A record track (the `one-gpu` presets')
requires its guarantees (isolation/sandbox.py GUARANTEES); on a host that cannot give one, the check says
which layers it lacks in one line and runs each
preset on the unranked track UNRANKED_TRACK instead, with every layer that holds (sandbox 'auto', each
missing one recorded): the speed is measured, not refused. A harness run that fails under the sandbox
on an unranked track is rerun once with launch.sandbox='off' (one line each), so a sandbox problem on a
new machine shows up as such; the next run tries the sandbox again. `--set run.track=...`,
`launch.sandbox=...` or `launch.allow_missing_layers=...` are the official's: then nothing is changed. MFU (naive baseline only) = tokens/s x
(6N + 12 L d T) FLOPs per token / the GPU's dense bf16 peak. On CPU the `tiny` presets run: their figures
test this script and say nothing about the records (printed as such, no ratio).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
try:  # harness.config reaches scoring/, which shows progress bars with tqdm: a stand-in if the machine lacks it
    import tqdm  # noqa: F401
except ImportError:
    import types

    sys.modules["tqdm"] = types.SimpleNamespace(tqdm=lambda it=None, *a, **k: it)  # type: ignore[assignment]

from data.manifest import shard_entry, write_manifest  # noqa: E402
from data.shards import shard_name, write_shard  # noqa: E402

BASELINES_DIR = REPO / "baselines"
NAIVE = "naive_baseline"
PEAK_BF16_FLOPS = {
    "H100 PCIe": 756e12,
    "H100": 989e12,
    "H200": 989e12,
    "GH200": 989e12,
    "B200": 2250e12,
    "A100": 312e12,
    "L40S": 362e12,
    "A10G": 125e12,
    "L4": 121e12,
}
WARMUP_STEPS = 6
UNRANKED_TRACK = "non_record_16mb"
"""Where a preset of a record track runs on a host that lacks a kernel layer (scoring/tracks.py)."""
ISOLATION_KEYS = ("run.track", "launch.sandbox", "launch.allow_missing_layers")
"""Compile warm-up steps for the check (the presets' 20: the graphs compile in the first ones)."""


# ---------------------------------------------------------------------------------------------------
# The records' speed, from their own logs (openai/parameter-golf, records/track_10min_16mb/<record>/).


@dataclass(frozen=True)
class RecordSpeed:
    """One record's training speed as its log states it (8xH100 SXM, PyTorch 2.9.1, 600 s cap)."""

    record: str
    """Folder under records/track_10min_16mb/ of openai/parameter-golf."""
    log: str
    """The log file in it the figures come from."""
    line: str
    """The log line (verbatim) they come from."""
    gpus: int
    steps: int
    """Steps reached when the 600 s wall-clock cap stopped training."""
    train_ms: float
    """Training time at that step (the record's clock: compile warm-up and validation left out)."""
    step_ms: float
    """ms/step as logged (step_avg); train_ms / steps where the log prints none."""

    @property
    def one_gpu_ms(self) -> float:
        """The same global batch on one GPU: gpus x the record's ms/step."""
        return self.step_ms * self.gpus


@dataclass(frozen=True)
class LoopPhases:
    """sp8192_era's record: its depth recurrence switched on mid-run; ms/step of each phase from its log."""

    line: str
    """The cumulative tok/s line the pre-loop figure comes from (verbatim)."""
    at_step: int
    """That line's step (all before the recurrence)."""
    tokens_per_s: int
    loop_step: int
    """The step the recurrence switched on (`layer_loop:enabled step:N`)."""
    tokens_per_step: int

    def pre_ms(self) -> float:
        """ms/step before the recurrence: its cumulative tok/s at `at_step`."""
        return 1000.0 * self.tokens_per_step / self.tokens_per_s

    def loop_ms(self, rec: RecordSpeed) -> float:
        """ms/step with the recurrence: the rest of the training time over the rest of the steps
        (the steps between `at_step` and `loop_step` taken at the pre-loop pace)."""
        return (rec.train_ms - self.loop_step * self.pre_ms()) / (rec.steps - self.loop_step)


RECORDS: dict[str, RecordSpeed] = {
    "naive_baseline": RecordSpeed(
        record="2026-03-17_NaiveBaseline",
        log="train.log",
        line="step:13780/20000 val_loss:2.0606 val_bpb:1.2172 train_time:600038ms step_avg:43.54ms",
        gpus=8,  # `world_size:8 grad_accum_steps:1`
        steps=13780,
        train_ms=600038.0,
        step_ms=43.54,
    ),
    "int6_era": RecordSpeed(
        record="2026-03-23_LeakyReLU_LegalTTT_ParallelMuon",
        log="train_seed1337.log",
        line="step:7179/9000 val_loss:1.9214 val_bpb:1.1379 train_time:600128ms step_avg:83.59ms",
        gpus=8,  # `world_size:8 grad_accum_steps:1`
        steps=7179,
        train_ms=600128.0,
        step_ms=83.59,  # 83.43 at step 6,500, before late QAT switched on (step 6,662)
    ),
    "sp8192_era": RecordSpeed(
        record="2026-04-09_SP8192_3LayerRecur_ParResid_QK525_LegalTTT",
        log="train_seed42.log",
        line="stopping_early: wallclock_cap train_time: 588047ms step: 4550/20000",
        gpus=8,  # `world_size: 8`, grad_accum_steps 1
        steps=4550,
        train_ms=588047.0,  # 600 s less its 12 s GPTQ reserve
        step_ms=588047.0 / 4550,  # the log prints tok/s, not step_avg: 129.24 ms
    ),
}
SP8192_PHASES = LoopPhases(
    line="2000/20000 train_loss: 3.0686 train_time: 3.4m tok/s: 7710490",
    at_step=2000,
    tokens_per_s=7710490,
    loop_step=2018,  # `layer_loop:enabled step:2018 frac:0.350 ...`
    tokens_per_step=786432,
)
"""101.99 ms/step before the recurrence, 150.95 ms/step with it (the record's 129.24 mixes 2,018 and 2,532 steps)."""


def parse_record_log(text: str) -> dict[str, Any]:
    """The speed figures of a record's log (both formats: `step:N/M ... step_avg:Xms` and `N/M ... tok/s: X`).

    Returns world_size, steps and train_ms (from the `stopping_early` line), step_avg_ms (the last
    step_avg at that step, or None), tok_s ({step: cumulative tok/s}) and loop_step (or None)."""
    stop = re.search(r"stopping_early: wallclock_cap train_time:\s*(\d+)ms step:\s*(\d+)/\d+", text)
    world = re.search(r"world_size:\s*(\d+)", text)
    if stop is None or world is None:
        raise ValueError("not a record log: no `stopping_early: wallclock_cap` or no `world_size` line")
    steps = int(stop.group(2))
    avgs = {
        int(m.group(1)): float(m.group(2))
        for m in re.finditer(r"^step:(\d+)/\d+ .*step_avg:([\d.]+)ms", text, re.M)
    }
    loop = re.search(r"layer_loop:enabled step:(\d+)", text)
    return {
        "world_size": int(world.group(1)),
        "steps": steps,
        "train_ms": float(stop.group(1)),
        "step_avg_ms": avgs.get(steps),
        "tok_s": {
            int(m.group(1)): int(m.group(2))
            for m in re.finditer(
                r"^(\d+)/\d+ train_loss: [\d.]+ train_time: [\d.]+m tok/s: (\d+)", text, re.M
            )
        },
        "loop_step": int(loop.group(1)) if loop else None,
    }


# ---------------------------------------------------------------------------------------------------
# Measured figures and the table.


def steady_step_ms(
    rows: Sequence[dict[str, Any]], first: int, last: int | None = None
) -> tuple[float, int] | None:
    """(ms/step, steps) between logged steps `first` and `last` (the last logged one if None).

    A row's `elapsed_s` is the clock at the start of that step, so the difference between two rows
    is the time of the steps between them. None without two such rows."""
    sel = [r for r in rows if "elapsed_s" in r and r["step"] >= first and (last is None or r["step"] <= last)]
    if len(sel) < 2 or sel[-1]["step"] <= sel[0]["step"]:
        return None
    n = sel[-1]["step"] - sel[0]["step"]
    return 1000.0 * (sel[-1]["elapsed_s"] - sel[0]["elapsed_s"]) / n, n


def read_metrics(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        return []
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return sorted(rows, key=lambda r: r["step"])


def loop_step_of(train_log: str) -> int | None:
    """The step index sp8192_era's train.py switched the recurrence on at (`layer_loop: on at step N`)."""
    m = re.search(r"layer_loop: on at step (\d+)", train_log)
    return int(m.group(1)) if m else None


@dataclass(frozen=True)
class Row:
    """One line of the final table."""

    name: str
    status: str
    measured_ms: float | None = None
    steps: int = 0
    """Steps the measured figure spans."""
    record_ms: float | None = None
    gpus: int = 0
    expected_ms: float | None = None
    record_note: str = ""

    @property
    def ratio(self) -> float | None:
        if self.measured_ms is None or self.expected_ms is None:
            return None
        return self.measured_ms / self.expected_ms


def record_rows(name: str, status: str, rows: list[dict[str, Any]], loop_step: int | None) -> list[Row]:
    """The table rows of one baseline's harness run against its record (two more for sp8192_era's phases)."""
    rec = RECORDS[name]
    note = f"{rec.steps:,} steps in {rec.train_ms / 1000:.1f} s"
    whole = steady_step_ms(rows, 2)
    out = [
        Row(
            name,
            status,
            whole[0] if whole else None,
            whole[1] if whole else 0,
            rec.step_ms,
            rec.gpus,
            rec.one_gpu_ms,
            note,
        )
    ]
    if name == "sp8192_era":
        ph = SP8192_PHASES
        # metrics row L+1 holds the clock at the start of step index L, the first looped step
        cut = loop_step + 1 if loop_step is not None else None
        pre = steady_step_ms(rows, 2, cut) if cut is not None else whole
        loop = steady_step_ms(rows, cut) if cut is not None else None
        for label, got, ms, n_rec in (
            ("  no recurrence", pre, ph.pre_ms(), ph.loop_step),
            ("  recurrence", loop, ph.loop_ms(rec), rec.steps - ph.loop_step),
        ):
            out.append(
                Row(
                    label,
                    status,
                    got[0] if got else None,
                    got[1] if got else 0,
                    ms,
                    rec.gpus,
                    ms * rec.gpus,
                    f"{n_rec:,} steps (derived)",
                )
            )
        if pre and loop:  # the whole run's expectation at this run's own mix of the two phases
            mixed = (pre[1] * ph.pre_ms() + loop[1] * ph.loop_ms(rec)) * rec.gpus / (pre[1] + loop[1])
            out[0] = Row(
                name,
                status,
                out[0].measured_ms,
                out[0].steps,
                rec.step_ms,
                rec.gpus,
                mixed,
                note + "; expected at this run's mix",
            )
    return out


def fmt_ms(v: float | None) -> str:
    return "-" if v is None else f"{v:,.1f}"


def table(rows: Sequence[Row], comparable: bool) -> str:
    """The final table: record ms/step as logged x GPUs, the 1-GPU expectation, measured, ratio."""
    head = (
        f"{'baseline':22s} {'status':8s} {'record ms/step':>16s} {'1-GPU expected':>15s} "
        f"{'measured':>10s} {'ratio':>6s} {'steps':>6s}  record"
    )
    lines = [head, "-" * len(head)]
    for r in rows:
        rec = f"{r.record_ms:.2f} x{r.gpus}" if r.record_ms is not None else "-"
        ratio = f"{r.ratio:.3f}" if comparable and r.ratio is not None else "-"
        lines.append(
            f"{r.name:22s} {r.status:8s} {rec:>16s} {fmt_ms(r.expected_ms):>15s} "
            f"{fmt_ms(r.measured_ms):>10s} {ratio:>6s} {r.steps:6d}  {r.record_note}"
        )
    if not comparable:
        lines.append(
            "(CPU, `tiny` shapes: measured figures are NOT comparable with the records' (8xH100, full shape); no ratio)"
        )
    else:
        lines.append(
            "ratio = measured / (record ms/step x its GPUs); about 1 or a little under means the record's speed is reproduced "
            "(H100 SXM records; an H200 has the same bf16 peak and more memory bandwidth)"
        )
    return "\n".join(line.rstrip() for line in lines)


def one_line(err: BaseException, limit: int = 400) -> str:
    """An error as one line: its first line and the last non-empty line of what follows (a log's tail)."""
    lines = [s.strip() for s in str(err).splitlines() if s.strip()]
    if not lines:
        return type(err).__name__
    text = lines[0] if len(lines) == 1 else f"{lines[0]} ... {lines[-1]}"
    return text if len(text) <= limit else text[: limit - 3] + "..."


# ---------------------------------------------------------------------------------------------------
# Plan and estimate.

OVERHEAD_S = {"naive_baseline": 45.0, "int6_era": 60.0, "sp8192_era": 90.0, "bare": 40.0}
"""Guessed seconds of each run beyond its training budget on one H100-class GPU: start-up (staging, sandbox,
torchrun, imports) and the off-clock compile warm-up (sp8192_era compiles two graphs). Not measured yet."""
CPU_OVERHEAD_S = 25.0


def overrides_for(name: str, device: str) -> list[str]:
    """The check's overrides of one baseline's preset (see the module docstring)."""
    out = [
        "launch.nproc_per_node=1",
        f"launch.device={device!r}",
        "budget.startup_s=120.0",
        "train.train_log_every=1",
        f"train.warmup_steps={WARMUP_STEPS}",
    ]
    if name == "int6_era":
        out.append("train.late_qat_threshold=0.0")
    if name == "sp8192_era":
        out.append("train.gptq_calibration_batches=0")
        if device == "cpu":
            out.append(
                "model.vocab_size=8192"
            )  # the tiny preset's 1024, back to the record's (the sp8192 data path)
    return out


def isolation_note(missing: Sequence[str]) -> str:
    """One line: what this host lacks, and what the check does about it."""
    from isolation.sandbox import KERNEL_LAYERS

    lacks = "; ".join(f"{m} ({KERNEL_LAYERS[m]})" for m in missing)
    return (
        f"  isolation: this host lacks {lacks}; a record track would refuse to train here, so each record-track "
        f"preset runs on the unranked track {UNRANKED_TRACK} with every layer that holds (sandbox 'auto')"
    )


def track_overrides(cfg: Any, missing: Sequence[str], user_set: Sequence[str]) -> list[str]:
    """[run.track=UNRANKED_TRACK] when `cfg` is on a record track this host cannot isolate fully (and the
    official set nothing about isolation), else []."""
    from scoring.tracks import get_track

    if not missing or track_overrides_blocked(user_set):
        return []
    return [f"run.track={UNRANKED_TRACK!r}"] if get_track(cfg.tables["run"]["track"]).record else []


def track_overrides_blocked(user_set: Sequence[str]) -> bool:
    """Whether the official set a key about isolation (then the check changes none)."""
    return any(s.split("=", 1)[0].strip() in ISOLATION_KEYS for s in user_set)


def estimate_s(names: Sequence[str], train_s: float, device: str) -> float:
    runs = [*names, "bare"] if NAIVE in names else list(names)
    if device != "cuda":
        return 10.0 + len(runs) * (train_s + CPU_OVERHEAD_S)
    return 10.0 + sum(train_s + OVERHEAD_S[r] for r in runs)


# ---------------------------------------------------------------------------------------------------
# Running.


def synthetic_dataset(root: Path, train_tokens: int, vocab: int) -> Path:
    rng = np.random.default_rng(0)
    root.mkdir(parents=True, exist_ok=True)
    (root / "synthetic_tokenizer.json").write_text(json.dumps({"kind": "synthetic", "vocab_size": vocab}))
    shards = []
    for split, n in (("train", train_tokens), ("val", 65_536)):
        path = root / shard_name(split, 0)
        write_shard(path, rng.integers(0, vocab, n, dtype=np.uint16))
        shards.append(shard_entry(path, split, docs=1))
    write_manifest(
        root,
        {
            "tokenizer": {
                "file": "synthetic_tokenizer.json",
                "kind": "synthetic",
                "vocab_size": vocab,
                "bos_id": 0,
            },
            "docs": {"train": 1, "val": 1},
            "shards": shards,
            "source": {"kind": f"synthetic uniform tokens < {vocab} (scripts/gpu_check.py)"},
        },
    )
    return root


def flops_per_token(model_config: dict, n_params: int, seq_len: int) -> float:
    return 6 * n_params + 12 * model_config["num_layers"] * model_config["model_dim"] * seq_len


def peak_flops(device: str) -> tuple[str, float | None]:
    if device != "cuda":
        return "cpu", None
    import torch

    name = torch.cuda.get_device_name(0)
    for key in sorted(PEAK_BF16_FLOPS, key=len, reverse=True):
        if all(part in name for part in key.split()):
            return name, PEAK_BF16_FLOPS[key]
    return name, None


def count_params(model_config: dict) -> int:
    sys.path.insert(0, str(BASELINES_DIR / NAIVE))
    from model import build_model  # type: ignore[import-not-found]  # the naive baseline's model.py

    return sum(p.numel() for p in build_model(dict(model_config)).parameters())


def speed_line(name: str, rec: dict, fpt: float | None, peak: float | None) -> tuple[str, float]:
    tps = rec["tokens_seen"] / rec["train_time_s"]
    mfu = f"{100 * tps * fpt / peak:5.1f}%" if peak and fpt else "    -"
    step_ms = 1000 * rec["train_time_s"] / max(rec["steps"], 1)
    off = rec.get("off_clock_s") or 0.0
    return (
        f"  {name:22s} {rec['steps']:6d} steps  {rec['train_time_s']:7.1f} s  step {step_ms:8.1f} ms  "
        f"{tps:13,.0f} tokens/s  MFU {mfu}  (warm-up off the clock {off:.1f} s)"
    ), tps


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--train-s", type=float, default=30.0, help="training budget of each run, seconds (default 30)"
    )
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    ap.add_argument(
        "--baselines",
        default="naive_baseline,int6_era,sp8192_era",
        help="comma-separated baselines/ folders with a record in RECORDS (default all three)",
    )
    ap.add_argument(
        "--preset",
        "--shape",
        default=None,
        help="every baseline's preset (default one-gpu on cuda, tiny on cpu)",
    )
    ap.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="SECTION.KEY=VALUE",
        help="override one config key (every run)",
    )
    ap.add_argument(
        "--max-total-s",
        type=float,
        default=570.0,
        help="skip a run whose estimate would end past this many seconds from the start (default 570)",
    )
    ap.add_argument(
        "--workdir", type=Path, default=None, help="keep the runs' folders here (default: a temp dir)"
    )
    args = ap.parse_args(argv)
    names = [n.strip() for n in args.baselines.split(",") if n.strip()]
    unknown = [n for n in names if n not in RECORDS]
    if unknown or not names:
        print(
            f"gpu_check: unknown baseline(s) {unknown or names}: choose from {', '.join(RECORDS)}",
            file=sys.stderr,
        )
        return 2
    preset = args.preset or ("one-gpu" if args.device == "cuda" else "tiny")
    comparable = args.device == "cuda" and preset == "one-gpu"
    t_start = time.time()

    import torch

    import isolation.sandbox as sandbox
    from harness.bench.runner import run_bare, run_harness
    from harness.config import load_config
    from scoring.tracks import get_track

    if args.device == "cuda" and not torch.cuda.is_available():
        print(
            "gpu_check: --device cuda but torch sees no GPU; use --device cpu for the CPU path",
            file=sys.stderr,
        )
        return 2
    name, peak = peak_flops(args.device)
    est = estimate_s(names, args.train_s, args.device)
    print(
        f"gpu_check: {name}, torch {torch.__version__}, preset {preset} on 1 {args.device}, {args.train_s:.0f} s of "
        f"training per run; baselines {', '.join(names)}{' + the naive bare loop' if NAIVE in names else ''}; "
        f"estimated total {est / 60:.1f} min (cut at {args.max_total_s:.0f} s)",
        flush=True,
    )
    print(
        f"  overrides: {' '.join(overrides_for('', args.device)[3:])}; int6_era train.late_qat_threshold=0.0; "
        f"sp8192_era train.gptq_calibration_batches=0{' model.vocab_size=8192' if args.device == 'cpu' else ''}"
        f"{'; --set ' + ' '.join(args.set) if args.set else ''}",
        flush=True,
    )
    if not comparable:
        print(
            "  NOTE: not the one-gpu presets on a GPU: the figures below are NOT comparable with the records'",
            flush=True,
        )
    # the layers whose guarantees nothing else gives here (a missing signal scoping under a PID namespace is none)
    missing = sandbox.needed_layers(
        sandbox.missing_layers(sandbox.probe_machine(), network="auto", multi_node=False, seccomp=True), ()
    )
    if missing and not track_overrides_blocked(args.set):
        print(isolation_note(missing), flush=True)
    rows: list[Row] = []
    tps: dict[str, float] = {}
    iso: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="pgolf-gpu-check-") as tmp_s:
        tmp = args.workdir or Path(tmp_s)
        tmp.mkdir(parents=True, exist_ok=True)
        datasets: dict[int, Path] = {}
        train_tokens = 50_000_000 if args.device == "cuda" else 2_000_000
        plan = [(n, "harness") for n in names] + ([(NAIVE, "bare")] if NAIVE in names else [])
        for bname, side in plan:
            label = bname if side == "harness" else f"{bname} (bare)"
            key = side if side == "bare" else bname
            overhead = OVERHEAD_S[key] if args.device == "cuda" else CPU_OVERHEAD_S
            if time.time() - t_start + args.train_s + overhead > args.max_total_s:
                print(
                    f"  {label}: SKIPPED: its estimate would end past --max-total-s {args.max_total_s:.0f} s",
                    flush=True,
                )
                rows.append(Row(label, "skipped"))
                continue
            sub = BASELINES_DIR / bname
            wd = tmp / f"{bname}-{side}"
            try:
                base = [*overrides_for(bname, args.device), *args.set]
                cfg = load_config(sub, preset, base)
                unranked = track_overrides(cfg, missing, args.set)
                if unranked:
                    base = [*overrides_for(bname, args.device), *unranked, *args.set]
                    cfg = load_config(sub, preset, base)
                track = get_track(cfg.tables["run"]["track"])
                vocab = int(cfg.model["vocab_size"])
                if vocab not in datasets:
                    datasets[vocab] = synthetic_dataset(
                        tmp / f"data-{vocab}", train_tokens, min(vocab, 65_535)
                    )
                if side == "harness":
                    try:
                        res = run_harness(
                            submission=sub,
                            data_root=datasets[vocab],
                            cfg=cfg,
                            budget_s=args.train_s,
                            device=args.device,
                            workdir=wd,
                        )
                    except Exception as e:  # noqa: BLE001 - SandboxRefused is a ValueError, a failed run a RuntimeError
                        if (
                            track.record
                            or cfg.section("launch").sandbox == "off"
                            or track_overrides_blocked(args.set)
                        ):
                            raise  # a record track refuses sandbox 'off'; the official's own settings stand
                        print(f"  {label}: FAILED with the sandbox: {one_line(e)}", flush=True)
                        if time.time() - t_start + args.train_s + overhead > args.max_total_s:
                            raise RuntimeError("no time left for a rerun without the sandbox") from e
                        cfg = load_config(sub, preset, [*base, "launch.sandbox='off'"])
                        wd = tmp / f"{bname}-{side}-nosandbox"
                        res = run_harness(
                            submission=sub,
                            data_root=datasets[vocab],
                            cfg=cfg,
                            budget_s=args.train_s,
                            device=args.device,
                            workdir=wd,
                        )
                        print(
                            f"  {label}: rerun with launch.sandbox='off' ran: the sandbox is what failed on this "
                            "machine (the next run tries it again)",
                            flush=True,
                        )
                    if not iso:
                        iso = res.get("isolation", {})
                else:
                    res = run_bare(
                        submission=sub,
                        data_root=datasets[vocab],
                        cfg=cfg,
                        budget_s=args.train_s,
                        threads=cfg.section("launch").threads_per_rank(),
                        device=args.device,
                        workdir=wd,
                    )
                status = "ok"
            except Exception as e:  # noqa: BLE001 - one baseline's failure must not stop the others
                print(f"  {label}: FAILED: {one_line(e)}", flush=True)
                status, res = "failed", None
            fpt = None
            if bname == NAIVE and res is not None:
                fpt = flops_per_token(cfg.model, count_params(cfg.model), int(cfg.train["train_seq_len"]))
            if res is not None:
                line, tps[label] = speed_line(label, res, fpt, peak)
                print(line, flush=True)
            # the record rows, also from a failed run's metrics if it logged steps
            log = wd / "train.log"
            loop = loop_step_of(log.read_text(errors="replace")) if log.is_file() else None
            got = record_rows(bname, status, read_metrics(wd / "metrics.jsonl"), loop)
            got[0] = replace(got[0], name=label)
            rows.extend(got)
            print(
                f"  {label}: {fmt_ms(got[0].measured_ms)} ms/step over {got[0].steps} steps; record "
                f"{got[0].record_ms:.2f} ms x {got[0].gpus} GPUs = {fmt_ms(got[0].expected_ms)} ms expected",
                flush=True,
            )
    if iso:
        print(
            f"  sandbox: landlock {iso.get('landlock')}, namespaces {iso.get('namespaces')}, verified {iso.get('verified')}, "
            f"warnings {iso.get('warnings')}"
        )
    print()
    print(table(rows, comparable))
    if NAIVE in tps and tps.get(f"{NAIVE} (bare)"):
        print(f"naive_baseline harness/bare tokens/s ratio: {tps[NAIVE] / tps[f'{NAIVE} (bare)']:.4f}")
    print(f"total {time.time() - t_start:.0f} s (estimated {est:.0f} s)")
    return 0 if all(r.status == "ok" for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
