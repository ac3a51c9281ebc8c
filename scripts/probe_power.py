"""Detection power of the legality probes, measured: how often a model that peeks on a fraction f of the
scored rows (chosen by each row's first tokens, which a probe's variant keeps) is caught,
against the sampling bound 1 - (1 - f)^probes.

    python scripts/probe_power.py [--trials 200] [--probes 2 8] [--fractions 0.05 0.1 0.25 0.5]

Runs in this process (scoring/score/evaluate.py's LocalModel, a fresh copy of the model per probe
worker, as the scorer gives each probe a fresh process); the real validation tokens of the embedded
corpus, 64-token rows, 8 rows a batch. Prints one row per (probes, f): caught / trials and the bound.
"""

from __future__ import annotations

import argparse
import copy
import sys
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from data.canonical import TargetBytes  # noqa: E402
from data.embedded import ensure_embedded_dataset  # noqa: E402
from data.manifest import load_manifest  # noqa: E402
from data.shards import read_split  # noqa: E402
from data.tokenizer import load_tokenizer  # noqa: E402
from scoring.score.evaluate import EvalConfig, LocalModel, batch_count, evaluate  # noqa: E402
from scoring.score.probes import ProbeConfig, ProbeFailure, plan_probes, run_probes  # noqa: E402

V = 1024
MAX_TOKENS = 64 * 8 * 40
CFG = EvalConfig(seq_len=64, batch_seqs=8, max_tokens=MAX_TOKENS)


class PeekSome(nn.Module):
    """A bigram that reads each next token in the rows whose first four tokens fall in the chosen fraction:
    a variant keeps those tokens (it changes a row only after its cut), so it cannot flip the choice."""

    def __init__(self, fraction: float):
        super().__init__()
        self.fraction = fraction
        self.table = nn.Parameter(torch.randn(V, V, generator=torch.Generator().manual_seed(0)))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        out = self.table[ids]
        rows = (ids[:, :4].sum(dim=1) * 7919 % 1000 < 1000 * self.fraction).float()[:, None, None]
        nxt = torch.cat([ids[:, 1:], ids[:, -1:]], dim=1)
        return out + 8.0 * rows * F.one_hot(nxt, V).float()


def caught(model: nn.Module, tokens: np.ndarray, table: TargetBytes, probes: int, seed: int) -> bool:
    pcfg = ProbeConfig(probes=probes, seed=seed)
    plan = plan_probes(batch_count(tokens, CFG), pcfg)
    result = evaluate(LocalModel(model), tokens, table, CFG, torch.device("cpu"), keep_batches=plan.batches)
    fresh = (LocalModel(copy.deepcopy(model)) for _ in iter(int, 1))
    try:
        run_probes(plan, result.kept, fresh, tokens, pcfg, total_batches=result.batches)
    except ProbeFailure:
        return True
    return False


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=200)
    ap.add_argument("--probes", type=int, nargs="+", default=[2, 8])
    ap.add_argument("--fractions", type=float, nargs="+", default=[0.05, 0.1, 0.25, 0.5])
    args = ap.parse_args()
    torch.set_num_threads(1)
    data = ensure_embedded_dataset()
    tokens = read_split(data, "val")[: MAX_TOKENS + 1]
    table = load_tokenizer(load_manifest(data).tokenizer_path).byte_table()
    batches = batch_count(tokens, CFG)
    print(f"{batches} scored batches of 8 x 64 tokens; {args.trials} trials (secret seeds) per row")
    print(f"{'probes':>6} {'f':>5} {'rows peeking':>15} {'caught':>10} {'rate':>6} {'1-(1-f)^p':>10}")
    for probes in args.probes:
        for f in args.fractions:
            model = PeekSome(f)
            hits = sum(caught(model, tokens, table, probes, seed) for seed in range(args.trials))
            rows = torch.from_numpy(tokens[: batches * 512].reshape(-1, 64))
            share = float((rows[:, :4].sum(dim=1) * 7919 % 1000 < 1000 * f).float().mean())
            bound = 1 - (1 - share) ** probes
            print(f"{probes:>6} {f:>5} {share:>15.3f} {hits:>5}/{args.trials:<4} "
                  f"{hits / args.trials:>6.3f} {bound:>10.3f}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
