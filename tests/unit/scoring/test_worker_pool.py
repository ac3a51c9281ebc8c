"""Windows sharded over several model workers (scoring/score/remote.py WorkerPool, one per device on a GPU
node): batch i of each group goes to worker i, all compute at once, and the scorer takes and scores the
answers in batch order, so the score is the same to the bit as with one worker; with score-first
adaptation every worker gets every chunk, all at once. Tested with 2 CPU workers."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from data.tokenizer import ByteTokenizer
from scoring.score.evaluate import EvalConfig, evaluate
from scoring.score.pool import WorkerPool
from scoring.score.remote import WorkerConfig, start_worker
from tests.unit.scoring.test_eval_support import (
    TINY_CONFIG,
    _one_thread,  # noqa: F401 (fixture)
    pack_tiny,
    tiny_worker_config,
    write_submission,
)
from tests.unit.scoring.test_probes import TOKENS

CPU = torch.device("cpu")
V = TINY_CONFIG["vocab_size"]
HOOK = '''"""Score-first hook: a deterministic nudge of the mix from the chunk's tokens."""
import torch


def adapt(model, tokens):
    with torch.no_grad():
        model.mix.add_(tokens.float().mean() * 1e-3)
'''


def _workers(tmp_path, folder, k, **kw):
    pack_tiny(folder, tmp_path / "a.pgolf")
    ws = [start_worker(tiny_worker_config(folder, tmp_path / "a.pgolf", **kw)) for _ in range(k)]
    for w in ws:
        w.wait_ready()
    return ws


def _sums(model, cfg, **kw):
    res = evaluate(model, TOKENS, ByteTokenizer().byte_table(), cfg, CPU, **kw)
    return (res.sums.loss_nats, res.sums.bytes, res.sums.tokens), res


def test_two_workers_score_the_same_bits_as_one(tmp_path):
    workers = _workers(tmp_path, write_submission(tmp_path / "sub"), 2)
    try:
        pool = WorkerPool(workers)
        for cfg in (
            EvalConfig(seq_len=32, batch_seqs=4, max_tokens=2000),
            EvalConfig(mode="sliding", seq_len=32, batch_seqs=4, stride=8, max_tokens=2000),
            EvalConfig(mode="documents", seq_len=32, batch_seqs=4, max_tokens=2000),
        ):
            f0, f1 = workers[0].forwards, workers[1].forwards
            sharded, res = _sums(pool, cfg, shuffle_seed=3, keep_batches=(0, 3))
            assert workers[0].forwards > f0 and workers[1].forwards > f1  # both computed
            single, res1 = _sums(workers[0], cfg, shuffle_seed=3, keep_batches=(0, 3))
            assert sharded == single, cfg.mode  # bit for bit
            assert res.batches == res1.batches
            for k in (0, 3):  # the probes' copies are the same too
                assert torch.equal(res.kept[k].logits_NV, res1.kept[k].logits_NV)
    finally:
        for w in workers:
            w.close()


@pytest.mark.long
def test_two_adapting_workers_score_the_same_bits_as_one(tmp_path):
    folder = write_submission(tmp_path / "sub", eval_src=HOOK)
    cfg = EvalConfig(
        mode="sliding", seq_len=32, batch_seqs=4, stride=16, max_tokens=1500, adapt_chunk_tokens=256
    )
    workers = _workers(tmp_path, folder, 3, adapt=True)
    try:
        pool = WorkerPool(workers[:2])
        sharded, res = _sums(pool, cfg, adapter=pool)
        single, res1 = _sums(workers[2], cfg, adapter=workers[2])
        assert res.chunks == res1.chunks > 3
        assert sharded == single  # both pool workers adapted exactly as the single one did
        assert workers[0].delivered == workers[1].delivered == workers[2].delivered
        assert np.all([w.forwards > 0 for w in workers])
    finally:
        for w in workers:
            w.close()


def score_with_workers(tmp_path, dataset, cfg: EvalConfig, eval_src: str | None = None) -> list[dict]:
    """The tiny entry scored whole (score_artifact, one probe) with one scoring worker, then two."""
    from scoring.score.probes import ProbeConfig
    from scoring.score.scorer import score_artifact

    folder = write_submission(tmp_path / "sub", eval_src=eval_src)
    pack_tiny(folder, tmp_path / "a.pgolf")
    return [
        score_artifact(
            tmp_path / "a.pgolf",
            folder,
            dataset,
            cfg,
            threads=1,
            probe_cfg=ProbeConfig(probes=1, seed=5),
            scoring_workers=k,
        )
        for k in (1, 2)
    ]


@pytest.mark.long  # a whole scored run: minutes of the default suite's 10 on 2 cores
def test_score_artifact_with_two_scoring_workers_scores_the_same_bits(tmp_path, tiny_dataset):
    cfg = EvalConfig(mode="sliding", seq_len=32, batch_seqs=4, stride=8, max_tokens=1024)
    one, two = score_with_workers(tmp_path, tiny_dataset, cfg)
    assert two["val_loss_sum_nats"] == one["val_loss_sum_nats"] and two["val_bytes"] == one["val_bytes"]
    assert two["val_bpb"] == one["val_bpb"] and two["probes"]["passed"]
    assert two["worker_forwards"] == one["worker_forwards"] == one["eval_batches"]
    assert len(two["workers"]) == len(one["workers"]) + 1  # the shard's isolation recorded too
    assert (one["scoring_workers"], two["scoring_workers"]) == (1, 2)  # what a re-score takes (pgolf verify)


def test_on_cuda_each_answer_is_scored_on_its_workers_gpu():
    """The scorer's loss beside each worker (its own GPU's link and kernels), on CPU all in this process."""
    from types import SimpleNamespace

    from scoring.score.pool import WorkerPool

    stubs = [SimpleNamespace(cfg=SimpleNamespace(device=f"cuda:{k}")) for k in range(3)]
    pool = WorkerPool(stubs)  # type: ignore[arg-type]
    assert pool.loss_devices(torch.device("cuda:0")) == [torch.device(f"cuda:{k}") for k in range(3)]
    assert pool.loss_devices(CPU) == [CPU] * 3


def test_a_group_without_a_namespace_holds_its_port_until_it_starts(monkeypatch):
    """A probe group's port on the host's loopback is chosen minutes before the group meets: held by a bound socket
    until it starts, no other socket (the main group's, made meanwhile) can take it, so an honest entry's probe
    group always meets (before, a clash failed the probe: illegal)."""
    import socket
    from contextlib import ExitStack
    from types import SimpleNamespace

    import scoring.score.pool as pool_mod

    started: list[int] = []

    def stub(cfg):
        def start():
            with socket.socket() as s:  # rank 0 binds the port when it is told to build: free by then
                s.bind(("127.0.0.1", cfg.group.port))
            started.append(cfg.group.rank)

        return SimpleNamespace(cfg=cfg, start=start, close=lambda: None)

    monkeypatch.setattr(pool_mod, "start_worker", stub)
    cfg = WorkerConfig(
        code_dir=Path("."), artifact=Path("a"), vocab_size=4, max_tokens_per_batch=8, sandbox="off"
    )
    with ExitStack() as stack:
        pool = pool_mod.start_pool(cfg, ["cpu", "cpu"], grouped=True, stack=stack, net=False)
        port = pool.workers[0].cfg.group.port
        with socket.socket() as other, pytest.raises(OSError):  # held meanwhile
            other.bind(("127.0.0.1", port))
        pool.start()
        assert started == [0, 1] and pool.port_hold is None


def test_a_cuda_pool_splits_the_cores_between_its_workers(monkeypatch):
    """Eight GPU workers each asking for every core ran eight times as many CPU threads as cores (a K-worker
    re-score, oversubscribed); a CPU pool keeps the scorer's count, which its probes compute with too."""
    from contextlib import ExitStack
    from types import SimpleNamespace

    import scoring.score.pool as pool_mod

    gpus = [f"cuda:{k}" for k in range(8)]
    assert pool_mod.worker_threads(96, gpus) == 12
    assert pool_mod.worker_threads(4, gpus) == 1  # never none
    assert pool_mod.worker_threads(96, ["cuda:0"]) == 96  # one worker: all of them
    assert pool_mod.worker_threads(2, ["cpu", "cpu"]) == 2  # bits on CPU may depend on the count
    assert pool_mod.worker_threads(0, gpus) == 0  # 0: the worker's default, as before

    seen: list[int] = []
    monkeypatch.setattr(
        pool_mod,
        "start_worker",
        lambda cfg: seen.append(cfg.threads) or SimpleNamespace(cfg=cfg, close=lambda: None),
    )
    cfg = WorkerConfig(
        code_dir=Path("."),
        artifact=Path("a"),
        vocab_size=4,
        max_tokens_per_batch=8,
        sandbox="off",
        threads=16,
    )
    with ExitStack() as stack:
        pool_mod.start_pool(cfg, gpus[:4], grouped=False, stack=stack)
    assert seen == [4] * 4
