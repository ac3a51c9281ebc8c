"""`pgolf bench score` (or `python -m scoring bench score`): scorer tokens/s against a plain evaluation loop.

    pgolf bench score [--submission DIR] [--model-config JSON] [--data DIR] [--seq-len 256] [--batch-seqs 32]
                      [--max-tokens 65536] [--repeats 3] [--rounds 5]

Both run the same model (built from the submission's model.py, random weights: speed does not
depend on them; by default the CPU track baseline's shape, 4 x 192, seq_len 256, batch 32) over the same standard-mode windows of the same validation tokens, with the same
batch and thread count. The plain loop is what anyone would write: `torch.no_grad()`, logits =
model(x), `F.cross_entropy(logits.float(), y, reduction="sum")`, in a plain Python process. The
scorer is scoring/score/evaluate.py (float64 log-softmax, shape and finiteness checks, exact byte counts,
the tool guard after every forward pass)
in a process set up as the scorer sets itself up (`tune_cpu_allocator`). Each measuring process
warms up once and times `--repeats` passes (its best counts). `--rounds` pairs of fresh processes run
one after the other, order alternating (the machine's load moves): each pair gives a ratio (scorer /
plain tokens/s; >= 1.0: the scorer is no slower), and the median over the rounds is the headline.
A last process runs both, alternating, with the allocator tuned for both: that ratio isolates the
loop itself (the scorer's float64 loss is its only extra work). The probes' time is printed apart (once per score).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from data.manifest import load_manifest
from data.shards import read_split
from data.tokenizer import load_tokenizer
from scoring.score.evaluate import EvalConfig, evaluate, standard_targets, tune_cpu_allocator
from scoring.score.guard import ToolGuard
from scoring.score.loading import build_model
from scoring.score.probes import ProbeConfig, run_probes
from scoring.score.scorer import scorer_tools

REPO = Path(__file__).resolve().parents[2]
DEFAULT_SUBMISSION = REPO / "baselines" / "naive_baseline"
# The CPU track's baseline shape (preset `cpu` of baselines/naive_baseline/config.toml: model, eval.seq_len,
# eval.batch_seqs; tests/unit/test_bench_score.py keeps them equal): the model that track scores.
DEFAULT_MODEL_CONFIG = {"num_layers": 4, "model_dim": 192, "num_heads": 4, "num_kv_heads": 2}
DEFAULT_SEQ_LEN, DEFAULT_BATCH_SEQS = 256, 32


def plain_loop(
    model: nn.Module,
    tokens: np.ndarray,
    seq_len: int,
    batch_seqs: int,
    max_tokens: int | None,
    device: torch.device,
) -> tuple[float, int]:
    """(Σ nats, tokens) the way a plain evaluation loop computes it, over the standard windows."""
    toks, windows = standard_targets(tokens, seq_len, max_tokens)
    all_t = torch.from_numpy(toks.astype(np.int64))
    total, n = 0.0, 0
    with torch.no_grad():
        for w0 in range(0, windows, batch_seqs):
            w1 = min(w0 + batch_seqs, windows)
            chunk = all_t[w0 * seq_len : w1 * seq_len + 1].to(device)
            x, y = chunk[:-1].reshape(-1, seq_len), chunk[1:].reshape(-1, seq_len)
            logits = model(x)
            total += float(
                F.cross_entropy(logits.reshape(-1, logits.size(-1)).float(), y.reshape(-1), reduction="sum")
            )
            n += y.numel()
    return total, n


def _setup(spec: dict[str, Any]) -> tuple[nn.Module, np.ndarray, Any, torch.device]:
    if spec["threads"]:
        torch.set_num_threads(spec["threads"])
    dev = torch.device(spec["device"])
    manifest = load_manifest(spec["data"])
    table = load_tokenizer(manifest.tokenizer_path).byte_table()
    tokens = read_split(spec["data"], "val")
    torch.manual_seed(0)
    model = (
        build_model(spec["submission"], {"vocab_size": table.vocab_size, **spec["model_config"]})
        .to(dev)
        .eval()
    )
    return model, tokens, table, dev


def worker(spec: dict[str, Any]) -> dict[str, Any]:
    """One measuring process: "plain" (a plain process), "scorer" (the scorer's process setup), or
    "both" (alternating in one process whose allocator is tuned as the scorer's is)."""
    kind = spec["kind"]
    if kind in ("scorer", "both"):
        tune_cpu_allocator()
    guard = ToolGuard(scorer_tools())  # as the scorer takes it: before the model code is imported
    model, tokens, table, dev = _setup(spec)
    L, B, max_tokens = spec["seq_len"], spec["batch_seqs"], spec["max_tokens"]
    cfg = EvalConfig(seq_len=L, batch_seqs=B, max_tokens=max_tokens)
    runs = {
        "scorer": lambda: evaluate(model, tokens, table, cfg, dev, guard=guard),
        "plain": lambda: plain_loop(model, tokens, L, B, max_tokens, dev),
    }
    kinds = ["scorer", "plain"] if kind == "both" else [kind]
    out: dict[str, Any] = {
        "threads": torch.get_num_threads(),
        "params": sum(p.numel() for p in model.parameters()),
    }
    for k in kinds:
        runs[k]()  # warm-up
    times: dict[str, list[float]] = {k: [] for k in kinds}
    for _ in range(spec["repeats"]):
        for k in kinds:
            t0 = time.perf_counter()
            r = runs[k]()
            times[k].append(time.perf_counter() - t0)
            if k == "scorer":
                out["tokens"], out["val_loss_scorer"] = r.sums.tokens, r.sums.val_loss
            else:
                out["val_loss_plain"] = r[0] / r[1]
    out.update({f"{k}_s": min(v) for k, v in times.items()})
    if (
        kind == "both"
    ):  # each repeat ran both back to back: the median of the paired ratios resists load swings
        out["paired_ratio_median"] = statistics.median(
            p / s for p, s in zip(times["plain"], times["scorer"], strict=True)
        )
    if kind == "scorer":
        t0 = time.perf_counter()
        run_probes(model, tokens, table.vocab_size, ProbeConfig(seq_len=L), dev)
        out["probes_s"] = time.perf_counter() - t0
    return out


def _spawn(spec: dict[str, Any]) -> dict[str, Any]:
    proc = subprocess.run(
        [sys.executable, "-m", "harness.bench.score", json.dumps(spec)],
        capture_output=True,
        text=True,
        check=False,
        env={**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")},
    )
    if proc.returncode != 0:
        raise ValueError(f"bench worker {spec['kind']} failed:\n{proc.stderr[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def run_bench(
    submission: Path,
    model_config: dict[str, Any],
    data_dir: Path,
    *,
    seq_len: int,
    batch_seqs: int,
    max_tokens: int | None,
    repeats: int,
    rounds: int,
    device: str,
    threads: int,
) -> dict[str, Any]:
    """`rounds` pairs of fresh plain and scorer processes (order alternating), then one process running both.

    Each round's ratio compares two processes started one after the other, so a slow spell of the
    machine (this one's load moves by more than 10 % within a minute) weighs on both; the headline
    is the median of the rounds' ratios. The best time of each kind over all rounds is kept too.
    """
    spec = {
        "submission": str(submission),
        "model_config": model_config,
        "data": str(data_dir),
        "seq_len": seq_len,
        "batch_seqs": batch_seqs,
        "max_tokens": max_tokens,
        "repeats": repeats,
        "device": device,
        "threads": threads,
    }
    plain, scorer = [], []
    for r in range(rounds):
        for kind in ("plain", "scorer") if r % 2 == 0 else ("scorer", "plain"):
            (plain if kind == "plain" else scorer).append(_spawn({**spec, "kind": kind}))
    both = _spawn({**spec, "kind": "both"})
    round_ratios = [p["plain_s"] / s["scorer_s"] for p, s in zip(plain, scorer, strict=True)]
    p, s = min(plain, key=lambda o: o["plain_s"]), min(scorer, key=lambda o: o["scorer_s"])
    n = s["tokens"]
    return {
        "format": "pg-bench-score",
        "format_version": 2,
        "device": device,
        "threads": s["threads"],
        "submission": str(submission),
        "model_config": model_config,
        "params": s["params"],
        "seq_len": seq_len,
        "batch_seqs": batch_seqs,
        "tokens": n,
        "repeats": repeats,
        "rounds": rounds,
        "allocator": "the scorer's process: " + tune_cpu_allocator.__doc__.split(".")[0],
        "plain_s": p["plain_s"],
        "scorer_s": s["scorer_s"],
        "plain_tokens_per_s": n / p["plain_s"],
        "scorer_tokens_per_s": n / s["scorer_s"],
        "ratio": statistics.median(round_ratios),
        "round_ratios": round_ratios,
        "best_ratio": p["plain_s"] / s["scorer_s"],
        "same_process_plain_s": both["plain_s"],
        "same_process_scorer_s": both["scorer_s"],
        "same_process_ratio": both["plain_s"] / both["scorer_s"],
        "same_process_paired_ratio_median": both["paired_ratio_median"],
        "probes_s": s["probes_s"],
        "val_loss_scorer": s["val_loss_scorer"],
        "val_loss_plain": p["val_loss_plain"],
    }


def cmd_bench_score(args: argparse.Namespace) -> int:
    from data.embedded import ensure_embedded_dataset

    data_dir = Path(args.data) if args.data else ensure_embedded_dataset()
    cfg = json.loads(args.model_config) if args.model_config else dict(DEFAULT_MODEL_CONFIG)
    rec = run_bench(
        Path(args.submission),
        cfg,
        data_dir,
        seq_len=args.seq_len,
        batch_seqs=args.batch_seqs,
        max_tokens=args.max_tokens or None,
        repeats=args.repeats,
        rounds=args.rounds,
        device=args.device,
        threads=args.threads,
    )
    if args.json:
        print(json.dumps(rec, sort_keys=True))
        return 0
    print(
        f"bench score: {rec['params']:,} params, {rec['tokens']:,} tokens, seq_len {rec['seq_len']}, batch {rec['batch_seqs']}, "
        f"{rec['threads']} thread(s) on {rec['device']}, best of {rec['repeats']}"
    )
    print(
        f"  plain loop  {rec['plain_tokens_per_s']:>12,.0f} tokens/s  ({rec['plain_s']:.3f} s)  val_loss {rec['val_loss_plain']:.6f}"
    )
    print(
        f"  scorer      {rec['scorer_tokens_per_s']:>12,.0f} tokens/s  ({rec['scorer_s']:.3f} s)  val_loss {rec['val_loss_scorer']:.6f}"
    )
    rounds = ", ".join(f"{r:.3f}" for r in rec["round_ratios"])
    print(
        f"  ratio scorer/plain = {rec['ratio']:.3f}  (median of {rec['rounds']} rounds: {rounds}; best against best "
        f"{rec['best_ratio']:.3f}; probes, once per score: {rec['probes_s']:.3f} s)"
    )
    print(
        f"  same process, allocator tuned for both: plain {rec['same_process_plain_s']:.3f} s, scorer "
        f"{rec['same_process_scorer_s']:.3f} s, ratio {rec['same_process_ratio']:.3f} "
        f"(median of paired runs {rec['same_process_paired_ratio_median']:.3f})"
    )
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("score", help="scorer tokens/s vs a plain evaluation loop on the same model and data")
    p.add_argument(
        "--submission", default=str(DEFAULT_SUBMISSION), help="folder whose model.py builds the model"
    )
    p.add_argument(
        "--model-config", help=f"JSON for build_model (default: {json.dumps(DEFAULT_MODEL_CONFIG)})"
    )
    p.add_argument("--data", help="dataset folder (default: the embedded corpus)")
    p.add_argument("--seq-len", type=int, default=DEFAULT_SEQ_LEN)
    p.add_argument("--batch-seqs", type=int, default=DEFAULT_BATCH_SEQS)
    p.add_argument("--max-tokens", type=int, default=65_536, help="validation tokens to score (0: all)")
    p.add_argument("--repeats", type=int, default=3, help="timed passes per process (best counts)")
    p.add_argument(
        "--rounds",
        type=int,
        default=5,
        help="pairs of fresh plain and scorer processes, order alternated (median ratio counts)",
    )
    p.add_argument("--device", default="cpu")
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_bench_score)


if __name__ == "__main__":
    print(json.dumps(worker(json.loads(sys.argv[1]))))
