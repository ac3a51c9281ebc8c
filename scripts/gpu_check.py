"""GPU check: the naive baseline through the harness and in a bare loop, side by side, in one command.

    python scripts/gpu_check.py                          # one GPU, official preset, 60 s per side (~6 min)
    python scripts/gpu_check.py --train-s 30             # shorter
    python scripts/gpu_check.py --device cpu --shape tiny --train-s 5   # the CPU path of this script

Uses the machine's preinstalled PyTorch and the project's own code only (no downloads; the sandbox,
the worker and the bench need no package beyond torch and numpy; safetensors is not needed: the
state is not saved). It writes a synthetic dataset (uniform random token ids < 1024, one training
shard: the content does not matter for speed), then runs the same train() twice:
1. harness: the real train phase (harness/run/train_phase.py: staging, sandbox, torchrun, worker, clock that
   syncs the GPU and reads time every step), official preset on one GPU (gradient accumulation 8
   keeps the 524,288-token global batch), torch.compile warm-up off the clock;
2. bare: `python -m harness.bench.runner bare` (same train(), a clock that only reads time, no torchrun,
   no sandbox), the same config and warm-up.
For each it prints steps, mean step time, tokens/s and MFU, then the harness/bare tokens/s ratio.
MFU = tokens/s x (6N + 12 L d T) FLOPs per token (N parameters, the tied head counted once; L layers,
width d, sequence T; attention counted as non-causal) / the GPU's dense bf16 peak (table below;
"-" for an unknown GPU). If the sandboxed harness run fails, it is rerun with launch.sandbox='off'
and both outcomes are printed, so a sandbox problem on a new machine shows up as such.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

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
from harness.bench.runner import run_bare, run_harness  # noqa: E402
from harness.config import load_config  # noqa: E402

BASELINE = REPO / "baselines" / "naive_baseline"
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
SYNTH_VOCAB = 1024


def synthetic_dataset(root: Path, train_tokens: int) -> Path:
    rng = np.random.default_rng(0)
    root.mkdir(parents=True, exist_ok=True)
    (root / "synthetic_tokenizer.json").write_text(
        json.dumps({"kind": "synthetic", "vocab_size": SYNTH_VOCAB})
    )
    shards = []
    for split, n in (("train", train_tokens), ("val", 65_536)):
        path = root / shard_name(split, 0)
        write_shard(path, rng.integers(0, SYNTH_VOCAB, n, dtype=np.uint16))
        shards.append(shard_entry(path, split, docs=1))
    write_manifest(
        root,
        {
            "tokenizer": {
                "file": "synthetic_tokenizer.json",
                "kind": "synthetic",
                "vocab_size": SYNTH_VOCAB,
                "bos_id": 0,
            },
            "docs": {"train": 1, "val": 1},
            "shards": shards,
            "source": {"kind": "synthetic uniform tokens (scripts/gpu_check.py)"},
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
    sys.path.insert(0, str(BASELINE))
    from model import build_model  # the baseline's model.py

    return sum(p.numel() for p in build_model(dict(model_config)).parameters())


def row(name: str, rec: dict, fpt: float, peak: float | None) -> tuple[str, float]:
    tps = rec["tokens_seen"] / rec["train_time_s"]
    mfu = f"{100 * tps * fpt / peak:5.1f}%" if peak else "    -"
    step_ms = 1000 * rec["train_time_s"] / max(rec["steps"], 1)
    off = rec.get("off_clock_s") or 0.0
    return (
        f"  {name:22s} {rec['steps']:6d} steps  {rec['train_time_s']:7.1f} s  step {step_ms:8.1f} ms  "
        f"{tps:13,.0f} tokens/s  MFU {mfu}  (warm-up off the clock {off:.1f} s)"
    ), tps


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--train-s", type=float, default=60.0, help="training budget of each side, seconds (default 60)"
    )
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    ap.add_argument(
        "--shape", choices=("official", "tiny", "cpu-smoke"), default="official", help="the baseline's preset"
    )
    ap.add_argument(
        "--set", action="append", default=[], metavar="SECTION.KEY=VALUE", help="override one config key"
    )
    args = ap.parse_args(argv)
    t_start = time.time()
    # one GPU (gradient accumulation keeps the global batch); a launch that hangs is cut at 120 s, not 300
    overrides = [
        "launch.nproc_per_node=1",
        f"launch.device={args.device!r}",
        "budget.startup_s=120.0",
        *args.set,
    ]
    cfg = load_config(BASELINE, args.shape, overrides)
    launch = cfg.section("launch")
    device = launch.resolved_device()
    name, peak = peak_flops(device)
    seq = int(cfg.train["train_seq_len"])
    fpt = flops_per_token(cfg.model, count_params(cfg.model), seq)
    import torch

    print(
        f"gpu_check: {name}, torch {torch.__version__}, preset {args.shape} on 1 {device} "
        f"(global batch {cfg.train['train_batch_tokens']:,} tokens, seq {seq}), {args.train_s:.0f} s per side, "
        f"{fpt / 1e9:.2f} GFLOP/token, peak {peak / 1e12 if peak else float('nan'):.0f} TFLOP/s bf16",
        flush=True,
    )
    with tempfile.TemporaryDirectory(prefix="pgolf-gpu-check-") as tmp:
        data = synthetic_dataset(Path(tmp) / "data", 50_000_000 if device == "cuda" else 2_000_000)
        results, tps = {}, {}
        for side in ("harness", "bare"):
            wd = Path(tmp) / side
            try:
                if side == "harness":
                    results[side] = run_harness(
                        submission=BASELINE,
                        data_root=data,
                        cfg=cfg,
                        budget_s=args.train_s,
                        device=device,
                        workdir=wd,
                    )
                else:
                    results[side] = run_bare(
                        submission=BASELINE,
                        data_root=data,
                        cfg=cfg,
                        budget_s=args.train_s,
                        threads=launch.threads_per_rank(),
                        device=device,
                        workdir=wd,
                    )
            except RuntimeError as e:
                print(f"  {side} run FAILED: {str(e)[:2000]}", flush=True)
                if side != "harness":
                    return 1
                off_cfg = load_config(BASELINE, args.shape, [*overrides, "launch.sandbox='off'"])
                results[side] = run_harness(
                    submission=BASELINE,
                    data_root=data,
                    cfg=off_cfg,
                    budget_s=args.train_s,
                    device=device,
                    workdir=Path(tmp) / "harness-nosandbox",
                )
                print(
                    "  (harness rerun with launch.sandbox='off': the sandbox is what failed on this machine)",
                    flush=True,
                )
            line, tps[side] = row(side, results[side], fpt, peak)
            print(line, flush=True)
        iso = results["harness"].get("isolation", {})
        print(
            f"  sandbox: landlock {iso.get('landlock')}, namespaces {iso.get('namespaces')}, verified {iso.get('verified')}, "
            f"warnings {iso.get('warnings')}"
        )
    print(
        f"harness/bare tokens/s ratio: {tps['harness'] / tps['bare']:.4f}   (total {time.time() - t_start:.0f} s)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
