"""`pgolf bench reference`: the naive baseline through the harness against the reference script, on CPU.

    pgolf bench reference --reference PATH/train_gpt.py [--preset cpu-bench] [--train-s 40] [--rounds 2]
        [--ref-settings float32,float32_compile,bfloat16,bfloat16_compile] [--data DIR] [--set K=V ...]

Same shape, data, seed and thread count on both sides; rounds interleave the sides (each round: the
harness, then every reference setting, the order reversed on odd rounds). Figures are steady-state
training tokens/s (from the 2nd logged step to the last: start-up, compilation and the first step
left out on both sides) and are printed, never asserted.

- harness: `run_train_phase` (staging, sandbox, torchrun, the supervisor's clock) on the preset: on
  CPU the baseline's start-up trial chooses its step mode (harness/train/cpu.py);
- reference: the script given by --reference (openai/parameter-golf's train_gpt.py, checked out outside
  this repository: it is read, never copied into it), written to a temporary folder with CPU
  adaptations, each of which must match exactly once or the bench refuses:
  device cpu instead of cuda; torch.cuda.synchronize / max_memory_* stubs; no nvidia-smi call;
  autocast on the CPU, enabled only in a bfloat16 setting; the model cast to bfloat16 only in one
  (float32 otherwise, Muon's Newton-Schulz likewise); torch.compile an identity unless the setting
  compiles; no validation and no serialization (the script exits when training ends).
  Its configuration comes from its environment variables (the preset's shape), its own clock from
  its log lines (`step:N/... train_time:Tms`), with TRAIN_LOG_EVERY=1.
The reference's best setting is the one with the highest median tokens/s; the ratio printed is the
harness's median over the reference's best median, and per round.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

REF_SETTINGS = ("float32", "float32_compile", "bfloat16", "bfloat16_compile")
PROLOGUE = """
import os as _pg_os
import torch as _pg_torch
_pg_torch.cuda.synchronize = lambda *a, **k: None
_pg_torch.cuda.max_memory_allocated = lambda *a, **k: 0
_pg_torch.cuda.max_memory_reserved = lambda *a, **k: 0
_PG_BF16 = _pg_os.environ.get("PGOLF_REF_BF16") == "1"
_PG_DTYPE = _pg_torch.bfloat16 if _PG_BF16 else _pg_torch.float32
if _pg_os.environ.get("PGOLF_REF_COMPILE") != "1":
    _pg_torch.compile = lambda fn=None, *a, **k: fn if fn is not None else (lambda f: f)
"""
PATCHES: tuple[tuple[str, str, int], ...] = (
    (
        '    if not torch.cuda.is_available():\n        raise RuntimeError("CUDA is required")\n'
        '    device = torch.device("cuda", local_rank)\n    torch.cuda.set_device(device)\n',
        '    device = torch.device("cpu")\n',
        1,
    ),
    ('subprocess.run(["nvidia-smi"]', 'subprocess.run(["true"]', 1),
    (
        'torch.autocast(device_type="cuda", dtype=torch.bfloat16, enabled=True)',
        'torch.autocast(device_type="cpu", dtype=torch.bfloat16, enabled=_PG_BF16)',
        3,
    ),
    (").to(device).bfloat16()", ").to(device).to(_PG_DTYPE)", 1),
    ("    X = G.bfloat16()", "    X = G.to(_PG_DTYPE)", 1),
    ("device=params[0].device, dtype=torch.bfloat16)", "device=params[0].device, dtype=_PG_DTYPE)", 1),
    ("        should_validate = last_step or (", "        should_validate = (", 1),
    ("        if last_step:\n", "        if last_step:\n            raise SystemExit(0)\n", 1),
)
STEP_LINE = re.compile(r"^step:(\d+)/\d+ train_loss:\S+ train_time:(\d+)ms")


def patched_reference(source: str) -> str:
    """The reference script with the CPU adaptations (ValueError when one does not match as expected)."""
    for old, new, count in PATCHES:
        found = source.count(old)
        if found != count:
            raise ValueError(
                f"the reference script has {found} occurrence(s) of {old[:60]!r}, expected {count}: "
                "not the train_gpt.py this bench adapts (openai/parameter-golf's root script)"
            )
        source = source.replace(old, new)
    head, sep, rest = source.partition("from __future__ import annotations\n")
    return head + sep + PROLOGUE + rest if sep else PROLOGUE + source


def steady_from_log(text: str, tokens_per_step: int, from_step: int = 2) -> tuple[float | None, int]:
    """(steady tokens/s from the `from_step`-th logged step to the last, steps) from the reference's log."""
    rows = [(int(m[1]), float(m[2]) / 1000) for m in map(STEP_LINE.match, text.splitlines()) if m]
    rows = [r for r in rows if r[0] >= from_step]
    steps = rows[-1][0] if rows else 0
    if len(rows) < 2 or rows[-1][1] <= rows[0][1]:
        return None, steps
    return (rows[-1][0] - rows[0][0]) * tokens_per_step / (rows[-1][1] - rows[0][1]), steps


def run_reference(
    script: Path,
    *,
    setting: str,
    cfg: Any,
    data_root: Path,
    tokenizer: Path,
    budget_s: float,
    threads: int,
    workdir: Path,
) -> dict[str, Any]:
    workdir.mkdir(parents=True, exist_ok=True)
    m, t = cfg.model, cfg.train
    env = dict(os.environ)
    env.update(
        PGOLF_REF_BF16="1" if setting.startswith("bfloat16") else "0",
        PGOLF_REF_COMPILE="1" if setting.endswith("_compile") else "0",
        OMP_NUM_THREADS=str(threads),
        DATA_PATH=str(data_root),
        TOKENIZER_PATH=str(tokenizer),
        RUN_ID=f"bench-{setting}",
        SEED=str(cfg.tables["run"]["seed"]),
        VOCAB_SIZE=str(m.get("vocab_size", 1024)),
        NUM_LAYERS=str(m["num_layers"]),
        MODEL_DIM=str(m["model_dim"]),
        NUM_HEADS=str(m.get("num_heads", 8)),
        NUM_KV_HEADS=str(m.get("num_kv_heads", 4)),
        MLP_MULT=str(m.get("mlp_mult", 2)),
        TRAIN_BATCH_TOKENS=str(t["train_batch_tokens"]),
        TRAIN_SEQ_LEN=str(t["train_seq_len"]),
        ITERATIONS="1000000",
        MAX_WALLCLOCK_SECONDS=str(budget_s),
        WARMDOWN_ITERS=str(t.get("warmdown_iters", 20)),
        WARMUP_STEPS="2" if setting.endswith("_compile") else "0",
        VAL_LOSS_EVERY="0",
        TRAIN_LOG_EVERY="1",
        # its own compile cache, cold like the harness's sandboxed run (whose temp folder is private): a
        # shared cache can hold another run's half-written kernel and would favour whichever ran second
        TORCHINDUCTOR_CACHE_DIR=str(workdir / "inductor_cache"),
    )
    script_copy = workdir / "train_gpt_cpu.py"
    script_copy.write_text(patched_reference(script.read_text(encoding="utf-8")), encoding="utf-8")
    r = subprocess.run(
        [sys.executable, str(script_copy)], cwd=workdir, capture_output=True, text=True, env=env, check=False
    )
    if r.returncode != 0:
        lines = [ln for ln in (r.stdout + r.stderr).splitlines() if ln.strip()]
        raise RuntimeError(f"exit status {r.returncode}: {lines[-1] if lines else 'no output'}")
    steady, steps = steady_from_log(r.stdout, int(t["train_batch_tokens"]))
    return {"steady": steady, "steps": steps}


def cmd_reference(args: argparse.Namespace) -> int:
    from data.embedded import ensure_embedded_dataset
    from data.manifest import load_manifest
    from harness.bench.runner import BASELINE, run_harness, steady_tokens_per_s
    from harness.config import load_config
    from harness.run.load import load_between, read_load

    script = Path(args.reference).resolve()
    if not script.is_file():
        raise FileNotFoundError(f"--reference {script}: no such file (openai/parameter-golf's train_gpt.py)")
    settings = [s for s in args.ref_settings.split(",") if s]
    bad = [s for s in settings if s not in REF_SETTINGS]
    if bad or not settings:
        raise ValueError(
            f"--ref-settings {args.ref_settings!r}: each must be one of {', '.join(REF_SETTINGS)}"
        )
    submission = Path(args.submission).resolve() if args.submission else BASELINE
    cfg = load_config(submission, args.preset, args.set)
    launch = cfg.section("launch")
    if launch.nproc_per_node != 1 or launch.resolved_device() != "cpu":
        raise ValueError(
            "pgolf bench reference compares one CPU rank: use a one-rank CPU preset (e.g. cpu-bench)"
        )
    data_root = Path(args.data).resolve() if args.data else ensure_embedded_dataset()
    manifest = load_manifest(data_root)
    threads = launch.threads_per_rank()
    tokens_per_step = int(cfg.train["train_batch_tokens"])
    load0 = read_load()
    print(
        f"bench reference: {submission.name} preset {args.preset} against {script}; {threads} thread(s), "
        f"budget {args.train_s:.0f} s, {args.rounds} round(s); load average {os.getloadavg()[0]:.2f}",
        flush=True,
    )
    rows: dict[str, list[float]] = {"harness": [], **{s: [] for s in settings}}
    with tempfile.TemporaryDirectory(prefix="pgolf-bench-ref-") as tmp:
        for i in range(args.rounds):
            order = ["harness", *settings]
            if i % 2:
                order.reverse()
            for side in order:
                wd = Path(tmp) / f"{side}{i}"
                if side == "harness":
                    rec = run_harness(
                        submission=submission,
                        data_root=data_root,
                        cfg=cfg,
                        budget_s=args.train_s,
                        device="cpu",
                        workdir=wd,
                    )
                    steady = steady_tokens_per_s(Path(rec["metrics"]), tokens_per_step)
                    mode = (rec.get("cpu") or {}).get("chosen", "?")
                    extra = f"mode {mode}"
                else:
                    try:
                        rec = run_reference(
                            script,
                            setting=side,
                            cfg=cfg,
                            data_root=data_root,
                            tokenizer=manifest.tokenizer_path,
                            budget_s=args.train_s,
                            threads=threads,
                            workdir=wd,
                        )
                    except RuntimeError as e:  # one setting failing leaves the others measured
                        print(f"  round {i + 1} {side:17s} FAILED ({e})", flush=True)
                        continue
                    steady, extra = rec["steady"], "reference"
                if steady:
                    rows[side].append(steady)
                print(
                    f"  round {i + 1} {side:17s} {rec['steps']:5d} steps  steady {steady or float('nan'):9,.0f} tokens/s  ({extra})",
                    flush=True,
                )
    load = load_between(load0, read_load())
    med = {k: statistics.median(v) for k, v in rows.items() if v}
    if "harness" not in med or len(med) < 2:
        print("not enough steady measurements for a ratio")
        return 1
    best = max((k for k in med if k != "harness"), key=lambda k: med[k])
    for k, v in med.items():
        print(f"median steady tokens/s  {k:17s} {v:9,.0f}")
    per_round = [h / r for h, r in zip(rows["harness"], rows[best], strict=False)]
    print(f"reference's best setting here: {best}")
    print(f"per-round ratios harness/reference-best: {' '.join(f'{r:.3f}' for r in per_round)}")
    print(
        f"machine load over the bench: {load.get('others_cores')} cores busy with other processes of {load['cores']} "
        f"(load average {load['loadavg_1m_start']} -> {load['loadavg_1m_end']}); contended {load.get('contended')}"
    )
    print(f"harness/reference-best steady tokens/s ratio: {med['harness'] / med[best]:.4f}")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "reference", help="the naive baseline through the harness vs the reference script on CPU"
    )
    p.add_argument(
        "--reference",
        required=True,
        help="openai/parameter-golf's train_gpt.py (a checkout outside this repo)",
    )
    p.add_argument("--submission", help="submission folder (default: the naive baseline)")
    p.add_argument(
        "--preset", default="cpu-bench", help="preset (default cpu-bench: the reference's small CPU shape)"
    )
    p.add_argument(
        "--train-s", type=float, default=40.0, help="training budget of each run, seconds (default 40)"
    )
    p.add_argument("--rounds", type=int, default=2, help="rounds, alternating the order (default 2)")
    p.add_argument(
        "--ref-settings",
        default=",".join(REF_SETTINGS),
        help="the reference's settings to run, comma-separated (default: all four)",
    )
    p.add_argument("--data", help="dataset folder (default: the embedded corpus)")
    p.add_argument(
        "--set", action="append", default=[], metavar="SECTION.KEY=VALUE", help="override one config key"
    )
    p.set_defaults(func=cmd_reference)
