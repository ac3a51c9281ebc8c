"""GPU check: each baseline trained, packed, scored with probes and verified on a GPU, beside its record's speed.

    python scripts/gpu_check.py --data DIR                 # one GPU, the `one-gpu` presets (~10 min)
    python scripts/gpu_check.py --data DIR --train-s 30 --baselines naive_baseline
    python scripts/gpu_check.py --device cpu --train-s 5   # the CPU path of this script (`tiny` presets)

What an official runs on a GPU host before the first real run, in one command of about 10 minutes
(measured on one H200: the naive baseline's whole check takes about 4 minutes for its 60 s of training,
int6_era's more, its compile warm-up alone 166 s before the single-graph late QAT; a part that would end
past --max-total-s is skipped, said in one line). It uses the machine's PyTorch and the project's own code; DIR is a dataset made by `pgolf data
build` (any documents, tokenized by the official sp1024 for the naive and int6 baselines, sp8192 for
sp8192_era: pass --data once per vocabulary); without --data, the embedded corpus (vocabulary 1,024).

1. The host: kernel, Python and `pgolf check --machine`'s report (which isolation guarantee holds by which
   mechanism). A host that lacks a layer is said in one line; the runs go on with every layer that holds.
2. Each baseline (default naive_baseline and int6_era) as `pgolf run` runs it (harness/run/pipeline.py,
   in this process; every phase its own sandboxed process): its `one-gpu` preset trains --train-s seconds
   on the supervisor's clock (its compile warm-up off the clock, late QAT's graph compiled in it), is
   packed by its own codec, scored on the first --eval-tokens validation tokens by the scorer and a
   confined model worker, with the probes in fresh workers, then verified (`pgolf verify`: every hash and a
   re-score in a fresh process). The runs are on the unranked track `smoke` (CHECK_TRACK): the data is not
   the official documents. A run that ends `error` is rerun once with launch.sandbox='off' (one line
   each), so a sandbox problem on a new host shows up as one; `--set run.track=...` or an isolation key
   is the official's and then nothing is changed.
3. bare (right after the naive baseline's run): `python -m harness.bench.runner bare` runs the naive
   baseline's same train() with the same config for --bare-s seconds, a clock that only reads time, no
   torchrun, no sandbox: the steady ms/step through the harness over the bare one is the harness's cost
   per step.
4. group (on a node: two GPUs or more, --group-workers K, default every GPU up to 8): each adapting baseline's
   artifact (an eval.py hook: int6_era, sp8192_era) re-scored by K scoring workers through `pgolf verify`'s
   re-score, as `pgolf run` scores on a node. They form a group (NCCL between their sandboxes, in the group's own
   network namespace) and train each chunk together. One line: val_bpb beside the one-worker score (the sums run
   in another order), the adaptation's ms per chunk both ways, the scoring time, and the crossing with the
   scorer's path for each worker's buffer (pinned or pageable). These are the figures the 8-GPU estimate in
   docs/OFFICIALS.md lacks. One GPU cannot host a group: NCCL refuses two ranks on one GPU.

Two tables end the output. The first puts each run's steady ms/step (between the 2nd and the last logged
step; every step is logged) beside its record's own: the record ran 8 GPUs with the same global batch,
so one GPU doing 8 gradient-accumulation micro-steps should take about 8x the record's ms/step (a little
less: no all-reduce, and Muon's Newton-Schulz, sharded over 8 ranks there, runs once). The records'
figures are constants (RECORDS), read from their logs, which are not on a GPU machine; sp8192_era's two
phases (depth recurrence from 35 % of the budget) are compared separately. The second table is each
run's pipeline: status, val_bpb on the subset, steps, seconds on the clock, warm-up off it, pack, score
(probes included), the probes' verdict, bytes, verify's verdict and seconds. Any failure is one line and
the rest still runs; a part whose estimate would end past --max-total-s is skipped. Overrides, printed
at start: every step logged (`train.train_log_every=1`), 6 compile warm-up steps (20 in the presets),
sp8192_era's GPTQ off (its reserve would shorten a short run); a baseline whose train.py keeps part of
its budget back for its encode (sp8192_era: 70 s) gets that on top of --train-s, so it trains --train-s. MFU (naive baseline only) = tokens/s x
(6N + 12 L d T) FLOPs per token / the GPU's dense bf16 peak. On CPU the `tiny` presets run: their
figures test this script and say nothing about the records (printed as such, no ratio).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import re
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
try:  # harness.config reaches scoring/, which shows progress bars with tqdm: a stand-in if the machine lacks it
    import tqdm  # noqa: F401
except ImportError:
    import types

    sys.modules["tqdm"] = types.SimpleNamespace(tqdm=lambda it=None, *a, **k: it)  # type: ignore[assignment]


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
"""Compile warm-up steps for the check (the presets' 20: the graphs compile in the first ones)."""
ISOLATION_KEYS = ("run.track", "launch.sandbox", "launch.allow_missing_layers")
"""Keys that are the official's: set by --set, the check changes none of them."""


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


def qat_switch(train_log: str, rows: Sequence[dict[str, Any]]) -> str | None:
    """int6_era's late QAT: the step it switched on at, that step's time and the median step's. A recompile on the
    clock would show as a step many times the median (train.py compiles the QAT graph in its warm-up)."""
    m = re.search(r"late_qat: on at step (\d+)", train_log)
    if m is None:
        return None
    at = int(m.group(1))
    # metrics row s+1 holds the clock at the start of step index s (see steady_step_ms)
    clock = {int(r["step"]): float(r["elapsed_s"]) for r in rows if "elapsed_s" in r}
    steps = [clock[s + 1] - clock[s] for s in sorted(clock) if s + 1 in clock]
    took = clock[at + 2] - clock[at + 1] if at + 2 in clock and at + 1 in clock else None
    median = sorted(steps)[len(steps) // 2] if steps else None
    return f"late QAT on at step {at}: that step took {fmt_ms(None if took is None else 1000 * took)} ms, the median step {fmt_ms(None if median is None else 1000 * median)} ms"


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

OVERHEAD_S = {"naive_baseline": 170.0, "int6_era": 330.0, "sp8192_era": 360.0, "bare": 75.0}
"""Seconds of each part beyond its training budget on one GPU, from the first H200 run (2026-12-04): the naive
baseline's start-up 8 s, compile warm-up 69 s off the clock, pack 15 s, score 57 s (probes 40 s), verify about
25 s; int6_era's warm-up alone took 166 s (two graphs: late QAT's too), then its int6 pack, sliding windows
with test-time training and verify (not all measured: the run was cut in its pack); sp8192_era not run yet."""
CPU_OVERHEAD_S = 60.0
EVAL_TOKENS_CUDA = 262_144
"""The validation subset each GPU run scores (eval.max_tokens): 256 windows of the naive baseline's 1,024."""
CHECK_TRACK = "smoke"
"""The track the check's runs are on: unranked, because its data is not the official documents (a record
track refuses any other dataset as invalid_data); `--set run.track=...` is the official's choice."""


def overrides_for(name: str, device: str) -> list[str]:
    """The check's speed overrides of one baseline's preset (see the module docstring)."""
    out = [
        "launch.nproc_per_node=1",
        f"launch.device={device!r}",
        "budget.startup_s=180.0",
        "train.train_log_every=1",
        f"train.warmup_steps={WARMUP_STEPS}",
    ]
    if name == "sp8192_era":
        out.append("train.gptq_calibration_batches=0")
        if device == "cpu":
            out.append(
                "model.vocab_size=8192"
            )  # the tiny preset's 1024, back to the record's (the sp8192 data path)
    return out


def run_overrides(train_s: float, eval_tokens: int | None, user_set: Sequence[str]) -> list[str]:
    """The check's run settings: its budget, its scored subset and its (unranked) track, unless the official set
    the track or any isolation key."""
    out = [f"budget.train_s={float(train_s)!r}"]
    if eval_tokens:
        out.append(f"eval.max_tokens={int(eval_tokens)}")
    if not track_overrides_blocked(user_set):
        out.append(f"run.track={CHECK_TRACK!r}")
    return out


def isolation_note(missing: Sequence[str]) -> str:
    """One line: what this host lacks, and what the check does about it."""
    from isolation.sandbox import KERNEL_LAYERS

    lacks = "; ".join(f"{m} ({KERNEL_LAYERS[m]})" for m in missing)
    return (
        f"  isolation: this host lacks {lacks}; a record track would refuse to train here; the check's runs are on "
        f"the unranked track {CHECK_TRACK} with every layer that holds (sandbox 'auto'), each missing one recorded"
    )


def track_overrides_blocked(user_set: Sequence[str]) -> bool:
    """Whether the official set the track or a key about isolation (then the check changes none of them)."""
    return any(s.split("=", 1)[0].strip() in ISOLATION_KEYS for s in user_set)


def estimate_s(
    names: Sequence[str],
    train_s: float,
    device: str,
    bare_s: float | None = None,
    reserves: dict[str, float] | None = None,
) -> float:
    """Seconds the whole check is expected to take: each baseline's budget (--train-s plus what its train.py keeps
    back, `reserves`: reserved_s) plus its guessed overhead, and the bare loop (naive baseline only)."""
    bare = [bare_s if bare_s is not None else train_s] if NAIVE in names else []
    budget = {n: train_s + (reserves or {}).get(n, 0.0) for n in names}
    if device != "cuda":
        return 10.0 + sum(budget[n] + CPU_OVERHEAD_S for n in names) + sum(b + CPU_OVERHEAD_S for b in bare)
    return 10.0 + sum(budget[n] + OVERHEAD_S[n] for n in names) + sum(b + OVERHEAD_S["bare"] for b in bare)


def reserved_s(train: dict[str, Any]) -> float:
    """Seconds of its budget a baseline's train.py keeps off training for work on the clock after it (sp8192_era: its
    GPTQ when on, and its codec's encode, about a minute of brotli-11 whatever the training time)."""
    gptq = (
        float(train.get("gptq_reserve_s") or 0.0)
        if int(train.get("gptq_calibration_batches") or 0) > 0
        else 0.0
    )
    return gptq + float(train.get("encode_reserve_s") or 0.0)


def baseline_reserve_s(bname: str, preset: str, device: str, user_set: Sequence[str]) -> float:
    """reserved_s of a baseline's preset with the check's overrides and the official's --set; 0 when the official set
    the budget (then it is theirs) or the config does not load (the run says why)."""
    from harness.config import load_config

    if any(s.split("=", 1)[0].strip() == "budget.train_s" for s in user_set):
        return 0.0
    try:
        cfg = load_config(BASELINES_DIR / bname, preset, [*overrides_for(bname, device), *user_set])
    except Exception:  # noqa: BLE001 - the run loads it again and reports its error as one line
        return 0.0
    return reserved_s(cfg.train)


# ---------------------------------------------------------------------------------------------------
# Running.


def dataset_vocab(root: Path) -> int:
    from data.manifest import load_manifest

    return load_manifest(root).vocab_size


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


@dataclass
class Outcome:
    """One baseline's whole check: the pipeline's result and verify's verdict, as the table shows them."""

    name: str
    status: str = "skipped"
    detail: str = ""
    val_bpb: float | None = None
    val_tokens: int = 0
    steps: int = 0
    train_s: float | None = None
    off_clock_s: float | None = None
    pack_s: float | None = None
    score_s: float | None = None
    probes: str = "-"
    bytes_total: int | None = None
    verify: str = "-"
    verify_s: float | None = None
    wall_s: float | None = None
    sandbox: str = ""
    crossing: str = "-"
    """How the logits crossed (scorer/worker path: pinned or pageable) and at what rate over the scoring time."""


def outcome_of(name: str, result: dict[str, Any], wall_s: float) -> Outcome:
    """The table's figures from a run's result.json (any status: a failed run shows how far it got)."""
    phases = result.get("phases", {})
    train, score = phases.get("train", {}), phases.get("score", {})
    times = result.get("phase_times_s", {})
    probes = score.get("probes") or {}
    iso = train.get("isolation") or {}
    cross, scoring_s = score.get("crossing") or {}, (score.get("eval_clock") or {}).get("scoring_time_s")
    detail = next(
        (str(p.get("detail")) for p in phases.values() if isinstance(p, dict) and p.get("detail")), ""
    )
    return Outcome(
        name=name,
        status=str(result.get("status")),
        detail=detail,
        val_bpb=result.get("val_bpb"),
        val_tokens=int(result.get("val_tokens") or 0),
        steps=int(result.get("steps") or train.get("steps") or 0),
        train_s=result.get("train_time_s"),
        off_clock_s=train.get("off_clock_s"),
        pack_s=times.get("pack_wall"),
        score_s=times.get("score_wall"),
        probes=("passed" if probes.get("passed") else "FAILED") if probes.get("ran") else "-",
        bytes_total=result.get("bytes_total"),
        wall_s=wall_s,
        crossing=crossing_line(cross, scoring_s, int(result.get("val_tokens") or 0)),
        sandbox=(
            f"landlock {iso.get('landlock')}, namespaces {iso.get('namespaces')}, verified {iso.get('verified')}, "
            f"guarantees {iso.get('guarantees')}, warnings {iso.get('warnings')}"
            if iso
            else ""
        ),
    )


def crossing_line(cross: dict[str, Any], scoring_s: float | None, tokens: int) -> str:
    """`scorer/worker` path, GB/s of logits over the scoring time, scored tokens/s: the figure the 8-GPU estimate
    needs (docs/OFFICIALS.md), read from the score record."""
    if not cross or not scoring_s:
        return "-"
    gbps = float(cross.get("logits_bytes") or 0) / scoring_s / 1e9
    return (
        f"{cross.get('scorer')}/{cross.get('worker')} {gbps:.2f} GB/s {tokens / scoring_s / 1e3:,.0f} k tok/s"
    )


def run_and_verify(
    name: str,
    *,
    preset: str,
    data_root: Path,
    overrides: list[str],
    run_dir: Path,
    ledger: Path,
    verify: bool,
) -> Outcome:
    """`pgolf run` (train, pack, score with probes) then `pgolf verify`, in this process as the CLI does them."""
    from harness.records.verify import verify_result
    from harness.run.pipeline import run_pipeline

    t0 = time.time()
    result = run_pipeline(
        BASELINES_DIR / name,
        preset=preset,
        data_dir=data_root,
        out_dir=run_dir,
        overrides=overrides,
        ledger=ledger,
    )
    got = outcome_of(name, result, time.time() - t0)
    if verify and got.status == "ok":
        rec = verify_result(run_dir, ledger=ledger)
        got.verify, got.verify_s = str(rec.get("status")), rec.get("verify_wall_s")
        if rec.get("status") != "verified":
            diffs = rec.get("differences") or [{"name": rec.get("detail") or rec.get("status")}]
            got.detail = "verify: " + "; ".join(
                f"{d.get('name')} {d.get('expected', '')} != {d.get('actual', '')}".strip() for d in diffs[:3]
            )
    return got


GROUP_OVERHEAD_S = 120.0
"""Seconds a group re-score takes beyond the run's own scoring time: K workers' start (each imports torch and starts
CUDA), the group's rendezvous, and its probes in fresh groups (a guess: not yet run on a node)."""


def group_workers_default(device: str) -> int:
    """The group part's size on this machine: every GPU (at most 8, a node) when there are two or more; else none
    (NCCL refuses two ranks on one GPU)."""
    if device != "cuda":
        return 0
    import torch

    n = min(torch.cuda.device_count(), 8)
    return n if n >= 2 else 0


def group_rescore(run_dir: Path, workers: int, timeout_s: float) -> dict[str, Any]:
    """The run's artifact scored again, its windows sharded over `workers` model workers, as `pgolf run` scores on a
    node: with the entry's adaptation hook they form a group (NCCL on CUDA, in their shared network namespace;
    scoring/worker/group.py), each worker's logits crossing to the scorer over its own GPU's link. Through
    `pgolf verify`'s re-score (a fresh scorer process, the run's own settings and probes). Returns the score record;
    ValueError with the re-score's own line when it failed."""
    from harness.records.verify import VerifyConfig, read_result, rescore, resolve_inputs

    _, run_dir, result = read_result(run_dir)
    code_dir, data_dir = resolve_inputs(run_dir, result, None, None)
    if code_dir is None or data_dir is None:
        raise ValueError(f"{run_dir}: the run kept no code or names no dataset to re-score with")
    record, tail = rescore(
        result, run_dir, code_dir, data_dir, VerifyConfig(scoring_workers=workers, timeout_s=timeout_s)
    )
    if record is None:
        raise ValueError(tail)
    return record


def group_line(one: dict[str, Any], group: dict[str, Any]) -> str:
    """What the group re-score measured beside the run's own score (one worker): val_bpb and its difference (the
    group's sums run in another order), the adaptation's time per chunk, the scoring time and the crossing with
    this side's path for each worker's buffer."""
    k = int(group.get("scoring_workers") or 1)
    ad, ad1 = group.get("adaptation") or {}, one.get("adaptation") or {}
    t, t1 = (
        (group.get("eval_clock") or {}).get("scoring_time_s"),
        (one.get("eval_clock") or {}).get("scoring_time_s"),
    )
    cross = group.get("crossing") or {}
    paths = ",".join(str(p) for p in cross.get("scorer_by_worker") or []) or "-"
    per_chunk = [
        f"{1000 * float(a['adapt_time_s']) / max(int(a['chunks']), 1):,.0f}" if a.get("chunks") else "-"
        for a in (ad1, ad)
    ]
    return (
        f"{k} workers{' (a group: ' + str((ad.get('group') or {}).get('network')) + ')' if ad.get('group') else ''}: "
        f"val_bpb {group['val_bpb']:.6f} (one worker {one['val_bpb']:.6f}, difference "
        f"{group['val_bpb'] - one['val_bpb']:+.2e}); probes {'passed' if (group.get('probes') or {}).get('passed') else 'FAILED'}; "
        f"adaptation ms/chunk {per_chunk[1]} (one worker {per_chunk[0]}); scoring {fmt(t)} s (one worker {fmt(t1)} s); "
        f"crossing {crossing_line(cross, t, int(group.get('val_tokens') or 0))}, scorer side by worker {paths}"
    )


def fmt(v: float | None, spec: str = ".1f") -> str:
    return "-" if v is None else format(v, spec)


def pipeline_table(outcomes: Sequence[Outcome]) -> str:
    """The second table: each baseline's whole run (train on the clock, pack, score with probes, verify)."""
    head = (
        f"{'baseline':22s} {'status':13s} {'val_bpb':>8s} {'scored':>8s} {'steps':>6s} {'train s':>8s} "
        f"{'warm-up s':>9s} {'pack s':>7s} {'score s':>8s} {'probes':>7s} {'bytes_total':>12s} {'verify':>9s} "
        f"{'verify s':>8s} {'wall s':>7s}"
    )
    lines = [head, "-" * len(head)]
    for o in outcomes:
        lines.append(
            f"{o.name:22s} {o.status:13s} {fmt(o.val_bpb, '.4f'):>8s} {o.val_tokens:8d} {o.steps:6d} "
            f"{fmt(o.train_s):>8s} {fmt(o.off_clock_s):>9s} {fmt(o.pack_s):>7s} {fmt(o.score_s):>8s} "
            f"{o.probes:>7s} {'-' if o.bytes_total is None else f'{o.bytes_total:,}':>12s} {o.verify:>9s} "
            f"{fmt(o.verify_s):>8s} {fmt(o.wall_s, '.0f'):>7s}"
        )
    return "\n".join(line.rstrip() for line in lines)


def machine_lines() -> list[str]:
    """The host's facts, first in the output: kernel, Python, the isolation report of `pgolf check --machine`."""
    import platform

    import isolation.sandbox as sandbox

    out = [f"  host: Linux {platform.release()}, Python {platform.python_version()}, {os.cpu_count()} CPUs"]
    try:
        out += ["  " + line for line in sandbox.machine_report(sandbox.probe_machine())]
    except Exception as e:  # noqa: BLE001 - a report that cannot be made is one line, never the end of the check
        out.append(f"  machine report failed: {one_line(e)}")
    return out


def group_part(
    label: str,
    run_dir: Path,
    k: int,
    score_s: float | None,
    t_start: float,
    max_total_s: float,
    out: dict[str, str],
) -> None:
    """The group part of one adapting run (group_rescore): one line, FAILED or SKIPPED with the reason."""
    from harness.records.verify import read_result

    need = 2 * (score_s or 60.0) + GROUP_OVERHEAD_S
    if time.time() - t_start + need > max_total_s:
        out[label] = f"SKIPPED: its estimate ({need:.0f} s) would end past --max-total-s {max_total_s:.0f} s"
    else:
        print(f"== {label}: its artifact re-scored by {k} scoring workers", flush=True)
        t0 = time.time()
        try:
            one = read_result(run_dir)[2]["phases"]["score"]
            out[label] = group_line(one, group_rescore(run_dir, k, timeout_s=max(need, 600.0))) + (
                f"; {time.time() - t0:.0f} s in all"
            )
        except Exception as e:  # noqa: BLE001 - the group's failure is one line, the rest of the check goes on
            out[label] = f"FAILED: {one_line(e)}"
    print(f"  {label}: group: {out[label]}", flush=True)


@dataclass
class CheckState:
    """What the parts of one check share: its settings, and the figures each part adds."""

    args: argparse.Namespace
    t_start: float
    preset: str
    eval_tokens: int | None
    group_k: int
    peak: float | None
    tmp: Path
    datasets: dict[int, Path]
    rows: list[Row] = field(default_factory=list)
    outcomes: list[Outcome] = field(default_factory=list)
    steady: dict[str, float] = field(default_factory=dict)
    """Label -> steady ms/step."""
    tps: dict[str, float] = field(default_factory=dict)
    """Label -> training tokens/s on the clock."""
    groups: dict[str, str] = field(default_factory=dict)
    """Label -> the group part's line."""

    def fits(self, seconds: float) -> bool:
        return time.time() - self.t_start + seconds <= self.args.max_total_s


def run_part(st: CheckState, bname: str, side: str) -> None:
    """One part of the plan: a baseline's harness run (train, pack, score, verify; the group part on a node) or the
    naive baseline's bare loop, then its record rows. Any failure is one line; the next part still runs."""
    from harness.bench.runner import run_bare
    from harness.config import load_config

    args = st.args
    label = bname if side == "harness" else f"{bname} (bare)"
    # a train.py that keeps part of its budget back for work on the clock after training (sp8192_era: 70 s for its
    # encode) gets it on top: it trains --train-s, and its encode ends within the budget as a record's must
    budget_s = (
        args.train_s + baseline_reserve_s(bname, st.preset, args.device, args.set)
        if side == "harness"
        else args.bare_s
    )
    overhead = OVERHEAD_S[bname if side == "harness" else "bare"] if args.device == "cuda" else CPU_OVERHEAD_S
    sub, wd = BASELINES_DIR / bname, st.tmp / f"{bname}-{side}"
    if not st.fits(budget_s + overhead):
        print(
            f"  {label}: SKIPPED: its estimate would end past --max-total-s {args.max_total_s:.0f} s",
            flush=True,
        )
        st.rows.append(Row(label, "skipped"))
        st.outcomes.append(Outcome(label, "skipped", "no time left"))
        return
    print(f"== {label}: {'train, pack, score, verify' if side == 'harness' else 'bare loop'}", flush=True)
    status, cfg = "failed", None
    try:
        base = [
            *overrides_for(bname, args.device),
            *run_overrides(budget_s, st.eval_tokens, args.set),
            *args.set,
        ]
        cfg = load_config(sub, st.preset, base)
        vocab = int(cfg.model["vocab_size"])
        if vocab not in st.datasets:
            raise ValueError(
                f"no dataset of vocabulary {vocab:,}: pass one with --data (pgolf data build --tokenizer ...)"
            )
        if side == "harness":
            got, wd = harness_run(st, bname, label, cfg, base, wd, budget_s + overhead)
            status = "ok" if got.status == "ok" and got.verify in ("verified", "-") else "failed"
            if st.group_k >= 2 and got.status == "ok" and (sub / "eval.py").is_file():
                group_part(label, wd, st.group_k, got.score_s, st.t_start, args.max_total_s, st.groups)
            if got.train_s and got.steps:
                st.tps[label] = cfg.train["train_batch_tokens"] * got.steps / got.train_s
        else:
            res = run_bare(
                submission=sub,
                data_root=st.datasets[vocab],
                cfg=cfg,
                budget_s=budget_s,
                threads=cfg.section("launch").threads_per_rank(),
                device=args.device,
                workdir=wd,
                confined=False,  # a baseline of the project's: the bare loop, no sandbox
            )
            st.tps[label] = res["tokens_seen"] / max(res["train_time_s"], 1e-9)
            status = "ok"
    except Exception as e:  # noqa: BLE001 - one baseline's failure must not stop the others
        print(f"  {label}: FAILED: {one_line(e)}", flush=True)
        if side == "harness":
            st.outcomes.append(Outcome(label, "failed", one_line(e)))
    report_rows(st, bname, label, status, wd, cfg)


def harness_run(
    st: CheckState, bname: str, label: str, cfg: Any, base: list[str], wd: Path, need_s: float
) -> tuple[Outcome, Path]:
    """`pgolf run` and `pgolf verify` of one baseline; a run that ends `error` in the sandbox is rerun once without
    it (time permitting), so a sandbox problem on this host shows as the difference. (outcome, its run folder)"""
    args = st.args
    attempt = functools.partial(
        run_and_verify,
        bname,
        preset=st.preset,
        data_root=st.datasets[int(cfg.model["vocab_size"])],
        ledger=st.tmp / "ledger.jsonl",
        verify=not args.no_verify,
    )
    got = attempt(overrides=base, run_dir=wd)
    if (
        got.status == "error"
        and cfg.section("launch").sandbox != "off"
        and not track_overrides_blocked(args.set)
    ):
        print(f"  {label}: FAILED with the sandbox: {got.detail[:400]}", flush=True)
        if st.fits(need_s):
            wd = st.tmp / f"{bname}-harness-nosandbox"
            got = attempt(overrides=[*base, "launch.sandbox='off'"], run_dir=wd)
            got.name = f"{label} (no sandbox)"
            print(
                f"  {label}: rerun with launch.sandbox='off': {got.status} (a sandbox problem on this "
                "machine shows up as a difference between the two)",
                flush=True,
            )
    st.outcomes.append(got)
    if got.status != "ok" or got.verify not in ("verified", "-"):
        print(f"  {label}: FAILED: {got.status}: {got.detail[:400]}", flush=True)
    if got.sandbox:
        print(f"  {label}: sandbox: {got.sandbox}", flush=True)
    print(f"  {label}: crossing: {got.crossing}", flush=True)
    return got, wd


def report_rows(st: CheckState, bname: str, label: str, status: str, wd: Path, cfg: Any) -> None:
    """A part's rows beside its record (also from a failed run's metrics, if it logged steps), and its lines."""
    log = wd / "train.log"
    log_text = log.read_text(errors="replace") if log.is_file() else ""
    metrics = read_metrics(wd / "metrics.jsonl")
    qat = qat_switch(log_text, metrics)
    if qat:
        print(f"  {label}: {qat}", flush=True)
    got_rows = record_rows(bname, status, metrics, loop_step_of(log_text))
    got_rows[0] = replace(got_rows[0], name=label)
    st.rows.extend(got_rows)
    if got_rows[0].measured_ms is not None:
        st.steady[label] = got_rows[0].measured_ms
    if bname == NAIVE and label in st.tps and st.peak and cfg is not None:
        fpt = flops_per_token(cfg.model, count_params(cfg.model), int(cfg.train["train_seq_len"]))
        print(
            f"  {label}: {st.tps[label]:,.0f} tokens/s on the clock, MFU {100 * st.tps[label] * fpt / st.peak:.1f}%"
        )
    print(
        f"  {label}: {fmt_ms(got_rows[0].measured_ms)} ms/step over {got_rows[0].steps} steps; record "
        f"{got_rows[0].record_ms:.2f} ms x {got_rows[0].gpus} GPUs = {fmt_ms(got_rows[0].expected_ms)} ms "
        f"expected; {time.time() - st.t_start:.0f} s since the start",
        flush=True,
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--train-s",
        type=float,
        default=60.0,
        help="training budget of each baseline's run, seconds (default 60)",
    )
    ap.add_argument(
        "--bare-s", type=float, default=30.0, help="training budget of the bare loop, seconds (default 30)"
    )
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    ap.add_argument(
        "--baselines",
        default="naive_baseline,int6_era",
        help=f"comma-separated baselines/ folders with a record in RECORDS (default naive_baseline,int6_era; "
        f"known: {', '.join(RECORDS)})",
    )
    ap.add_argument(
        "--data",
        type=Path,
        action="append",
        default=[],
        help="a dataset folder (pgolf data build); repeat for several vocabularies: each baseline takes the one whose "
        "vocabulary its model has (default: the embedded corpus, vocabulary 1,024)",
    )
    ap.add_argument(
        "--eval-tokens",
        type=int,
        default=None,
        help=f"validation tokens each run scores (eval.max_tokens; default {EVAL_TOKENS_CUDA:,} on cuda, the preset's "
        "on cpu)",
    )
    ap.add_argument("--no-verify", action="store_true", help="skip `pgolf verify` of each scored run")
    ap.add_argument(
        "--group-workers",
        type=int,
        default=None,
        help="re-score each adapting baseline's artifact with this many scoring workers, a group (default: every "
        "GPU when there are two or more, at most 8; 0: no group part)",
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
        help="skip a part whose estimate would end past this many seconds from the start (default 570: inside a "
        "10-minute slot)",
    )
    ap.add_argument(
        "--workdir", type=Path, default=None, help="keep the runs' folders here (default: a temp dir)"
    )
    ap.add_argument("--json-out", type=Path, default=None, help="write every figure as JSON here too")
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
    eval_tokens = (
        args.eval_tokens
        if args.eval_tokens is not None
        else (EVAL_TOKENS_CUDA if args.device == "cuda" else None)
    )
    t_start = time.time()

    import torch

    import isolation.sandbox as sandbox
    from data.embedded import ensure_embedded_dataset

    if args.device == "cuda" and not torch.cuda.is_available():
        print(
            "gpu_check: --device cuda but torch sees no GPU; use --device cpu for the CPU path",
            file=sys.stderr,
        )
        return 2
    name, peak = peak_flops(args.device)
    reserves = {n: baseline_reserve_s(n, preset, args.device, args.set) for n in names}
    est = estimate_s(names, args.train_s, args.device, args.bare_s, reserves)
    print(
        f"gpu_check: {name}, torch {torch.__version__}, preset {preset} on 1 {args.device}, {args.train_s:.0f} s of "
        f"training per baseline, then pack, score ({eval_tokens or 'the preset'} tokens, with probes) and verify; "
        f"baselines {', '.join(names)}{f' + the naive bare loop ({args.bare_s:.0f} s)' if NAIVE in names else ''}; "
        f"estimated total {est / 60:.1f} min (cut at {args.max_total_s:.0f} s)",
        flush=True,
    )
    for line in machine_lines():
        print(line, flush=True)
    print(
        f"  overrides: {' '.join(overrides_for('', args.device)[2:])} "
        f"{' '.join(run_overrides(args.train_s, eval_tokens, args.set))}; "
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
    group_k = args.group_workers if args.group_workers is not None else group_workers_default(args.device)
    if group_k < 2:
        print(
            "  group: none (a group needs two or more GPUs: NCCL refuses two ranks on one; --group-workers K)",
            flush=True,
        )
    with tempfile.TemporaryDirectory(prefix="pgolf-gpu-check-") as tmp_s:
        tmp = (args.workdir or Path(tmp_s)).resolve()
        tmp.mkdir(parents=True, exist_ok=True)
        datasets: dict[int, Path] = {}
        for root in args.data:
            try:
                datasets.setdefault(dataset_vocab(root.resolve()), root.resolve())
            except (OSError, ValueError, KeyError) as e:
                print(f"  --data {root}: not a dataset ({one_line(e)}); left out", flush=True)
        if not args.data:
            datasets[1024] = ensure_embedded_dataset()
        print(
            "  data: " + ", ".join(f"vocabulary {v:,}: {p}" for v, p in sorted(datasets.items())), flush=True
        )
        # the bare loop right after the naive baseline's run: the harness's cost per step is a figure the check
        # must give, and an era's run (minutes of compile) may not fit after it
        plan = [(n, "harness") for n in names]
        if NAIVE in names:
            plan.insert(names.index(NAIVE) + 1, (NAIVE, "bare"))
        st = CheckState(args, t_start, preset, eval_tokens, group_k, peak, tmp, datasets)
        for bname, side in plan:
            run_part(st, bname, side)
    print()
    print(table(st.rows, comparable))
    print()
    print(pipeline_table(st.outcomes))
    ratio = None
    if st.steady.get(NAIVE) and st.steady.get(f"{NAIVE} (bare)"):
        ratio = st.steady[NAIVE] / st.steady[f"{NAIVE} (bare)"]
        print(
            f"naive_baseline harness / bare steady ms/step: {ratio:.4f} (1.0: the harness costs nothing per step)"
        )
    total = time.time() - t_start
    print(f"total {total:.0f} s (estimated {est:.0f} s)")
    if args.json_out:
        args.json_out.write_text(
            json.dumps(
                {
                    "format": "pg-gpu-check",
                    "format_version": 1,
                    "device": name,
                    "preset": preset,
                    "records": [asdict(r) for r in st.rows],
                    "runs": [asdict(o) for o in st.outcomes],
                    "harness_over_bare": ratio,
                    "groups": st.groups,
                    "tokens_per_s": st.tps,
                    "total_s": total,
                },
                indent=1,
            )
        )
    ok = (
        all(r.status in ("ok", "skipped") for r in st.rows)
        and all(o.status in ("ok", "skipped") and o.verify in ("verified", "-") for o in st.outcomes)
        and not any(line.startswith("FAILED") for line in st.groups.values())
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
