"""Several nodes train on the same tokens or none starts: each node's supervisor stages its own dataset, so the
ranks compare the data identity their specs carry (the training shards' hashes in stream order and the
tokenizer's) before the first step (harness/train/rank.py agree_on_data; issue 22's multi-node launcher)."""

from __future__ import annotations

import os
import socket

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from data.manifest import load_manifest
from harness.api import DistInfo
from harness.run.train_phase import data_identity_of
from harness.train.rank import agree_on_data, data_mismatch


def test_a_rank_with_other_data_is_named() -> None:
    assert data_mismatch([("a" * 64, "n0"), ("a" * 64, "n0"), ("a" * 64, "n1")]) is None
    msg = data_mismatch([("a" * 64, "n0"), ("a" * 64, "n0"), ("b" * 64, "n1"), ("b" * 64, "n1")])
    assert msg is not None and msg.startswith(
        "the nodes' training data differ: rank 2 on n1 (bbbbbbbbbbbb), "
    )
    assert "rank 3 on n1" in msg and "against rank 0 on n0 (aaaaaaaaaaaa)" in msg and "HINT" in msg


def test_the_identity_is_the_shards_in_order_and_the_tokenizer(tiny_dataset) -> None:
    m = load_manifest(tiny_dataset)
    names = [s.name for s in m.shards if s.split == "train"]
    one = data_identity_of(m, names)
    assert one == data_identity_of(m, list(names)) and len(one) == 64
    assert data_identity_of(m, names[:1] + ["fineweb_train_999999.bin"]) != one  # another shard
    other = type(m)(root=m.root, raw={**m.raw, "tokenizer": {**m.raw["tokenizer"], "sha256": "0" * 64}})
    assert data_identity_of(other, names) != one  # another tokenizer file


def _rank(rank: int, world: int, port: int, identities: list[str], out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    info = DistInfo(rank=rank, world_size=world, local_rank=rank, device=torch.device("cpu"), backend="gloo")
    try:
        agree_on_data(info, identities[rank])
        verdict = "agreed"
    except ValueError as e:
        verdict = str(e)
    with open(f"{out}/rank{rank}.txt", "w", encoding="utf-8") as f:
        f.write(verdict)
    dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.parametrize("same", [True, False], ids=["same-data", "one-node-differs"])
def test_ranks_on_gloo_agree_or_all_stop(tmp_path, same: bool) -> None:
    ids = ["a" * 64, "a" * 64] if same else ["a" * 64, "c" * 64]
    mp.spawn(_rank, args=(2, _free_port(), ids, str(tmp_path)), nprocs=2, join=True)
    got = [(tmp_path / f"rank{r}.txt").read_text(encoding="utf-8") for r in range(2)]
    if same:
        assert got == ["agreed", "agreed"]
    else:  # both ranks stop, with the same message naming rank 1
        assert got[0] == got[1] and got[0].startswith("the nodes' training data differ: rank 1 on ")
