"""Bytes crossing from a model worker to the scorer per scored token, and the scorer's tokens/s, on two paths.

    python scripts/bench_transfer.py                      # the naive (V 1024, L 1024) and sp8192 (V 8192, L 2048) shapes
    python scripts/bench_transfer.py --shapes int6        # the int6 era's (V 1024, L 2048)
    python scripts/bench_transfer.py --max-tokens 16384 --threads 2 --json

- every position (the path before scored-positions-only transfer): the worker answers [B, L, V] float32 at
  every position of every window, the scorer selects the scored ones (a Scorable with `logits` only);
- scored only (the path now): each forward carries the rows' scored ranges and the worker answers [N, V].

For each shape and mode (standard; sliding with --stride, 64 as the records ran it) it prints:
- planned: bytes per scored token over a split of --val-tokens (default: the sp1024 validation split's
  62,021,632 targets as the reference logs count them; sp8192 about 40.5 M) from the window plan alone,
  and the total per evaluation;
- measured: a real confined worker (a one-layer stand-in model of the shape's vocabulary; what crosses
  does not depend on the weights) scoring the first --max-tokens of a random token stream on both paths:
  bytes read out of the worker per scored token (WorkerModel.bytes_read), tokens/s of the evaluation,
  and whether the two paths' sums are equal to the bit.

Timings on a shared machine move by 10 % or more; the bytes are exact. Nothing here is a test.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

STAND_IN = '''"""A stand-in causal model for the transfer bench: an embedding, a mix with the previous position, a head."""
import torch
from torch import nn


class StandIn(nn.Module):
    def __init__(self, vocab_size, dim):
        super().__init__()
        self.emb = nn.Embedding(vocab_size, dim)
        self.head = nn.Linear(dim, vocab_size, bias=False)

    def forward(self, ids):
        e = self.emb(ids)
        prev = torch.cat([torch.zeros_like(e[:, :1]), e[:, :-1]], dim=1)
        return self.head(torch.tanh(e + 0.5 * prev))


def build_model(config):
    return StandIn(config["vocab_size"], config.get("dim", 32))
'''

SHAPES = {
    "naive": (1024, 1024, 62_021_632),
    "int6": (1024, 2048, 62_021_632),
    "sp8192": (8192, 2048, 40_540_160),
}
"""name -> (vocab V, seq_len L, validation targets of the full split)."""


class EveryPosition:
    """The path before: `logits` only, so the worker answers every position and the scorer selects."""

    def __init__(self, inner: Any):
        self.inner = inner
        self.output_kind = inner.output_kind

    def logits(self, x_BL: torch.Tensor) -> torch.Tensor:
        return self.inner.logits(x_BL)


def planned(V: int, L: int, n_tokens: int, mode: str, stride: int) -> dict[str, float]:
    from scoring.score.evaluate import EvalConfig
    from scoring.score.windows import plan_windows

    cfg = EvalConfig(mode=mode, seq_len=L, stride=None if mode == "standard" else stride)
    toks = np.zeros(n_tokens + 1, dtype=np.int64) + 5  # no BOS: the plan depends on the count only
    plan = plan_windows(toks[: (n_tokens // L) * L + 1] if mode == "standard" else toks, cfg)
    targets = plan.num_targets
    before = float(plan.lengths.sum()) * V * 4
    after = float(targets) * V * 4
    return {
        "targets": targets,
        "before_bytes_per_token": before / targets,
        "after_bytes_per_token": after / targets,
        "before_total_bytes": before,
        "after_total_bytes": after,
    }


def measured(
    V: int, L: int, mode: str, stride: int, max_tokens: int, batch_seqs: int, threads: int, work: Path
) -> dict[str, Any]:
    from data.tokenizer import ByteTable
    from scoring.artifact.cap import ARTIFACT_CAP_BYTES
    from scoring.artifact.pack import pack_state
    from scoring.score.evaluate import EvalConfig, evaluate
    from scoring.score.remote import WorkerConfig, start_worker
    from scoring.worker.loading import build_model

    code = work / f"code{V}"
    if not code.is_dir():
        code.mkdir(parents=True)
        (code / "model.py").write_text(STAND_IN)
    art = work / f"a{V}.pgolf"
    if not art.is_file():
        torch.manual_seed(0)
        config = {"vocab_size": V, "dim": 32}
        model = build_model(code, config)
        pack_state(
            model.state_dict(),
            code,
            art,
            codec_name="int8_zlib",
            model_config=config,
            cap_bytes=ARTIFACT_CAP_BYTES,
        )
    table = ByteTable(np.ones(V, np.int16), np.zeros(V, np.bool_), np.zeros(V, np.bool_))
    tokens = np.random.default_rng(0).integers(4, V, size=max_tokens + 1, dtype=np.int64)
    cfg = EvalConfig(
        mode=mode,
        seq_len=L,
        batch_seqs=batch_seqs,
        max_tokens=max_tokens,
        stride=None if mode == "standard" else stride,
    )
    worker = start_worker(
        WorkerConfig(
            code_dir=code, artifact=art, threads=threads, vocab_size=V, max_tokens_per_batch=batch_seqs * L
        )
    )
    out: dict[str, Any] = {}
    try:
        worker.wait_ready()
        sums = {}
        for name, scorable in (("before", EveryPosition(worker)), ("after", worker)):
            for rep in range(2):  # a warm-up pass, then the one reported
                b0, t0 = worker.bytes_read, time.perf_counter()
                with torch.inference_mode():
                    res = evaluate(scorable, tokens, table, cfg, torch.device("cpu"))
                dt = time.perf_counter() - t0
                if rep:
                    n = res.sums.tokens
                    out[name] = {
                        "bytes_per_token": (worker.bytes_read - b0) / n,
                        "tokens_per_s": n / dt,
                        "scored_tokens": n,
                    }
                    sums[name] = (res.sums.loss_nats, res.sums.bytes, res.sums.tokens)
        out["bit_identical"] = sums["before"] == sums["after"]
    finally:
        worker.close()
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shapes", default="naive,sp8192", help=f"comma list of {', '.join(SHAPES)}")
    p.add_argument("--stride", type=int, default=64, help="sliding stride (the records': 64)")
    p.add_argument("--max-tokens", type=int, default=16_384, help="tokens scored by the measured runs")
    p.add_argument("--batch-seqs", type=int, default=4)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    rows = []
    with tempfile.TemporaryDirectory(prefix="pgolf-bench-transfer-") as tmp:
        for shape in args.shapes.split(","):
            if shape not in SHAPES:
                raise SystemExit(f"--shapes: unknown shape {shape!r}; known: {', '.join(SHAPES)}")
            V, L, n_val = SHAPES[shape]
            for mode in ("standard", "sliding"):
                row = {
                    "shape": shape,
                    "V": V,
                    "L": L,
                    "mode": mode,
                    "stride": args.stride if mode != "standard" else None,
                }
                row["planned"] = planned(V, L, n_val, mode, args.stride)
                row["measured"] = measured(
                    V, L, mode, args.stride, args.max_tokens, args.batch_seqs, args.threads, Path(tmp)
                )
                rows.append(row)
                if not args.json:
                    pl, me = row["planned"], row["measured"]
                    print(
                        f"{shape:7s} V={V:5d} L={L:5d} {mode:8s}"
                        + (f" S={args.stride}" if mode != "standard" else "     ")
                        + f" | planned B/token {pl['before_bytes_per_token']:>10,.0f} -> {pl['after_bytes_per_token']:>7,.0f}"
                        f"  full split {pl['before_total_bytes'] / 1e12:7.2f} TB -> {pl['after_total_bytes'] / 1e12:6.3f} TB"
                        f" | measured B/token {me['before']['bytes_per_token']:>10,.0f} -> {me['after']['bytes_per_token']:>7,.0f}"
                        f"  tokens/s {me['before']['tokens_per_s']:>8,.0f} -> {me['after']['tokens_per_s']:>8,.0f}"
                        f"  bit-identical {me['bit_identical']}",
                        flush=True,
                    )
    if args.json:
        print(json.dumps({"format": "pg-bench-transfer", "format_version": 1, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
