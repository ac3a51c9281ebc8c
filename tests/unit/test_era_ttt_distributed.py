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


def _rank(rank: int, world: int, port: int, era: str, out: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        torch.save(_adapted(era), os.path.join(out, f"{rank}.pt"))
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


@pytest.mark.parametrize("era", [ERAS[0], pytest.param(ERAS[1], marks=pytest.mark.long)])
def test_a_group_trains_as_one_worker(tmp_path, era):
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.start_processes(_rank, args=(2, port, era, str(tmp_path)), nprocs=2, join=True, start_method="spawn")
    r0, r1 = (torch.load(tmp_path / f"{r}.pt") for r in (0, 1))
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
