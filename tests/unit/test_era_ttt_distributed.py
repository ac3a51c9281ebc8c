"""The era baselines' test-time training over a group of workers (baselines/*_era/eval.py, scoring/worker/group.py).

Each worker of the group trains on its share of every batch's sequences and the gradients are summed over the
group: every worker ends with the same weights, bit for bit, and those are one worker's weights up to the order
of the sums. Checked on CPU with two gloo processes and a tiny int6_era model, against one process.
"""

from __future__ import annotations

import importlib.util
import os

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from tests.conftest import REPO
from tests.unit.test_int6_late_qat import TINY

ERAS = ("int6_era", "sp8192_era")
TTT = dict(ttt_seq_len=16, ttt_batch_seqs=3, ttt_epochs=2, ttt_chunks=4, ttt_lr=0.05)


def _load(era: str, name: str):
    spec = importlib.util.spec_from_file_location(f"{era}_{name}", REPO / "baselines" / era / f"{name}.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _adapted(era: str) -> list[torch.Tensor]:
    """int6_era's tiny model (both eras' hooks train any model with the ttt_* settings) after two chunks."""
    torch.manual_seed(0)
    model = _load("int6_era", "model").build_model({**TINY, **TTT})
    hook = _load(era, "eval")
    g = torch.Generator().manual_seed(1)
    for _ in range(2):  # 7 sequences a chunk: batches of 3, 3 and 1 rows; a worker gets none of the last
        hook.adapt(model, torch.randint(0, TINY["vocab_size"], (7 * 16 + 1,), generator=g))
    return [p.detach().clone() for p in model.parameters()]


class _SideModel(torch.nn.Module):
    """A model with a parameter (`side`) used in the first chunk and not after it: one worker's SGD skips a
    parameter without a gradient, so its momentum does not move it in the second chunk."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = torch.nn.Embedding(TINY["vocab_size"], 8)
        self.out = torch.nn.Linear(8, TINY["vocab_size"])
        self.side = torch.nn.Parameter(torch.zeros(TINY["vocab_size"]))
        self.ttt = {**TTT, "ttt_momentum": 0.9, "ttt_grad_clip": 0.0}
        self.ttt_optimizer = None
        self.ttt_chunks_done = 0

    def forward(self, x):
        h = self.out(self.emb(x))
        return h + self.side if self.ttt_chunks_done == 0 else h


def _side_adapted(era: str) -> dict[str, torch.Tensor]:
    torch.manual_seed(0)
    model, hook = _SideModel(), _load(era, "eval")
    g = torch.Generator().manual_seed(1)
    for _ in range(2):
        hook.adapt(model, torch.randint(0, TINY["vocab_size"], (7 * 16 + 1,), generator=g))
    return {name: p.detach().clone() for name, p in model.named_parameters()}


def _rank(rank: int, world: int, port: int, era: str, out: str, side: bool = False) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        torch.save((_side_adapted if side else _adapted)(era), os.path.join(out, f"{rank}.pt"))
    finally:
        dist.destroy_process_group()


def test_the_eras_hooks_are_one_code():
    """sp8192_era's hook is int6_era's, docstring aside (so the group test below runs on int6_era's alone)."""
    import ast

    def body(era: str) -> str:
        tree = ast.parse((REPO / "baselines" / era / "eval.py").read_text())
        tree.body = [n for n in tree.body if not isinstance(n, ast.Expr)]  # the module docstring
        return ast.dump(tree)

    assert body("int6_era") == body("sp8192_era")


def _group_of_two(tmp_path, era: str, side: bool = False) -> list:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.start_processes(
        _rank, args=(2, port, era, str(tmp_path), side), nprocs=2, join=True, start_method="spawn"
    )
    return [torch.load(tmp_path / f"{r}.pt") for r in (0, 1)]


@pytest.mark.parametrize("era", [ERAS[0], pytest.param(ERAS[1], marks=pytest.mark.long)])
def test_a_group_trains_as_one_worker(tmp_path, era):
    r0, r1 = _group_of_two(tmp_path, era)
    torch.set_num_threads(1)
    alone = _adapted(era)
    assert all(torch.equal(a, b) for a, b in zip(r0, r1, strict=True))  # the group's workers agree exactly
    moved = max(float((a - b).abs().max()) for a, b in zip(alone, _initial(), strict=True))
    assert moved > 1e-3  # the hook trained
    worst = max(float((a - b).abs().max()) for a, b in zip(r0, alone, strict=True))
    assert worst < 1e-5 * max(moved, 1.0)  # one worker's steps, up to the order of the sums


def _initial() -> list[torch.Tensor]:
    torch.manual_seed(0)
    return [p.detach().clone() for p in _load("int6_era", "model").build_model({**TINY, **TTT}).parameters()]


def test_a_parameter_without_gradient_is_left_alone_as_by_one_worker(tmp_path):
    """`side` has gradients in the first chunk only. One worker's SGD then skips it; a group that handed it a
    summed zero gradient would let the momentum move it (the hook sends which parameters had one)."""
    r0, r1 = _group_of_two(tmp_path, "int6_era", side=True)
    torch.set_num_threads(1)
    alone = _side_adapted("int6_era")
    assert float(alone["side"].abs().max()) > 1e-3  # `side` trained in the first chunk
    for mine in (r0, r1):  # (without the count, `side` moved 0.042 more in the group: its momentum)
        diffs = {n: float((mine[n] - alone[n]).abs().max()) for n in alone}
        assert max(diffs.values()) < 1e-6, diffs
