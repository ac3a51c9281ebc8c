"""Score-first adaptation over a group of model workers (scoring/score/pool.py, scoring/worker/group.py).

The workers of a group share a torch.distributed process group (gloo here, NCCL on GPUs), so a hook can split
each chunk's training over them and all-reduce, as the records' test-time training did on 8 GPUs. The same
channel would let a worker read the batch another one holds while it is scored, a later window's text: the
probes run a probed batch's whole group again in a fresh group, the other workers' batches replaced by real
tokens from elsewhere, and a model that used them is caught. Tested with 2 CPU workers.
"""

from __future__ import annotations

from contextlib import ExitStack

import numpy as np
import pytest
import torch

from data.tokenizer import ByteTokenizer
from scoring.score.evaluate import EvalConfig, batch_count, eval_tokens, evaluate
from scoring.score.pool import start_pool
from scoring.score.probes import ProbeConfig, ProbeFailure, plan_probes, run_probes
from scoring.score.remote import WorkerFailure
from tests.unit.scoring.test_eval_support import (
    TINY_MODEL,
    _one_thread,  # noqa: F401 (fixture)
    pack_tiny,
    tiny_worker_config,
    write_submission,
)
from tests.unit.scoring.test_probes import TOKENS

CPU = torch.device("cpu")
TABLE = ByteTokenizer().byte_table()

DISTRIBUTED_HOOK = '''"""Each worker sums its share of the chunk; the group adds the shares: the same nudge as one worker's."""
import torch
import torch.distributed as dist


def adapt(model, tokens):
    world = dist.get_world_size() if dist.is_initialized() else 1
    rank = dist.get_rank() if world > 1 else 0
    total = tokens[rank::world].double().sum()
    if world > 1:
        dist.all_reduce(total)
    with torch.no_grad():
        model.mix.add_(float(total) / tokens.numel() * 1e-3)
'''

NEEDS_GROUP_HOOK = DISTRIBUTED_HOOK.replace(
    "def adapt(model, tokens):\n",
    "def adapt(model, tokens):\n    if not dist.is_initialized():\n        raise RuntimeError('no group')\n",
)

NO_OP_HOOK = '"""Adapts nothing."""\n\n\ndef adapt(model, tokens):\n    return None\n'

PEEKING_MODEL = TINY_MODEL.replace(
    "        return self.head(torch.tanh(e + self.mix * prev))",
    """        out = self.head(torch.tanh(e + self.mix * prev))
        if torch.distributed.is_initialized():  # what the other workers of the group hold now
            held = [torch.zeros_like(ids) for _ in range(torch.distributed.get_world_size())]
            torch.distributed.all_gather(held, ids)
            others = sum(int(h.sum()) for k, h in enumerate(held) if k != torch.distributed.get_rank())
            out = out + 1e-3 * (others % 7)
        return out""",
)

ADAPTING = EvalConfig(
    mode="sliding", seq_len=32, batch_seqs=4, stride=16, max_tokens=1500, adapt_chunk_tokens=256
)


def _sums(model, cfg, **kw):
    res = evaluate(model, TOKENS, TABLE, cfg, CPU, **kw)
    return (res.sums.loss_nats, res.sums.bytes, res.sums.tokens), res


def _entry(tmp_path, **kw):
    folder = write_submission(tmp_path / "sub", **kw)
    pack_tiny(folder, tmp_path / "a.pgolf")
    return tiny_worker_config(folder, tmp_path / "a.pgolf", adapt=True)


def _fresh(cfg, stack):
    """Fresh groups of two, one at a time, as the scorer hands them to the probes."""
    while True:
        unit = start_pool(cfg, ["cpu", "cpu"], grouped=True, stack=stack)
        unit.wait_ready()
        yield unit
        unit.close()


def test_a_group_all_reduces_in_its_hook_scores_as_one_worker_and_passes_its_probes(tmp_path):
    cfg = _entry(tmp_path, eval_src=DISTRIBUTED_HOOK)
    plan = plan_probes(batch_count(TOKENS, ADAPTING, adapting=True), ProbeConfig(probes=1, seed=3))
    with ExitStack() as stack:
        group = start_pool(cfg, ["cpu", "cpu"], grouped=True, stack=stack)
        one = start_pool(cfg, ["cpu"], grouped=True, stack=stack)  # a group of one is no group
        group.wait_ready()
        one.wait_ready()
        assert [w.facts["group"]["rank"] for w in group.workers] == [0, 1]
        assert one.workers[0].facts["group"] is None
        assert group.workers[0].plan.describe()["network_namespace_shared"] == (group.net is not None)
        grouped, res = _sums(group, ADAPTING, adapter=group, keep_batches=plan.batches, shuffle_seed=2)
        single, res1 = _sums(one, ADAPTING, adapter=one)
        assert res.chunks == res1.chunks > 3
        assert grouped == single  # each adds its share, the group the whole: exactly one worker's nudge
        group.close()
        one.close()
        toks, delivered = eval_tokens(TOKENS, ADAPTING), group.workers[0].delivered

        def replay(unit, chunk):  # as the scorer replays: the fresh group all-reduces in its hook too
            for k, (first, end) in enumerate(delivered[:chunk]):
                unit.before_chunk(None, k)
                unit.after_chunk(None, k, np.ascontiguousarray(toks[first:end]), first)

        rec = run_probes(
            plan, res.kept, _fresh(cfg, stack), toks, ProbeConfig(probes=1, seed=3), replay=replay,
            kept_chunks=res.kept_chunks,
        )  # fmt: skip
        assert rec["passed"] and rec["probes"][0]["adaptation_chunks_replayed"] > 0
        assert rec["probes"][0]["max_abs_diff"] == 0.0


def test_without_a_group_the_hook_has_no_process_group(tmp_path):
    """The control: the same pool ungrouped gives the hook nothing to all-reduce in (so the test above can fail)."""
    cfg = _entry(tmp_path, eval_src=NEEDS_GROUP_HOOK)
    with ExitStack() as stack:
        pool = start_pool(cfg, ["cpu", "cpu"], grouped=False, stack=stack)
        pool.wait_ready()
        with pytest.raises(WorkerFailure, match="no group"):
            _sums(pool, ADAPTING, adapter=pool)


def _full_groups_config() -> EvalConfig:
    """One chunk whose batches fill every group of two (a peeking model's all_gather then never waits alone)."""
    for n in range(1200, 2000, 8):
        cfg = EvalConfig(
            mode="sliding", seq_len=32, batch_seqs=4, stride=16, max_tokens=n, adapt_chunk_tokens=10**6
        )
        windows = int(np.ceil((n - 32) / 16)) + 1
        if batch_count(TOKENS, cfg, adapting=True) % 2 == 0 and windows % 8 == 0:
            return cfg
    raise AssertionError("no size fills the groups")


@pytest.fixture(scope="module")
def peeking_scored(tmp_path_factory):
    """The peeking model scored by a group of two (one chunk, every group full), its probe batch kept."""
    tmp = tmp_path_factory.mktemp("peek")
    cfg = _entry(tmp, model_src=PEEKING_MODEL, eval_src=NO_OP_HOOK)
    eval_cfg = _full_groups_config()
    plan = plan_probes(batch_count(TOKENS, eval_cfg, adapting=True), ProbeConfig(probes=1, seed=11))
    with ExitStack() as stack:
        pool = start_pool(cfg, ["cpu", "cpu"], grouped=True, stack=stack)
        pool.wait_ready()
        _, res = _sums(pool, eval_cfg, adapter=pool, keep_batches=plan.batches, shuffle_seed=4)
    assert all(len(k.group) == 2 for k in res.kept.values())
    return cfg, plan, res.kept


def _probe_peeking(peeking_scored) -> dict:
    cfg, plan, kept = peeking_scored
    with ExitStack() as stack:
        return run_probes(plan, kept, _fresh(cfg, stack), TOKENS, ProbeConfig(probes=1, seed=11))


@pytest.mark.long
def test_probes_of_a_group_catch_a_model_that_reads_the_other_workers_batches(peeking_scored):
    with pytest.raises(ProbeFailure, match="causality probe failed"):
        _probe_peeking(peeking_scored)


@pytest.mark.long  # run by hand for every change to the probes' group (8 s of the suite's 10 minutes)
def test_control_with_the_other_batches_as_they_were_the_peeking_model_passes(peeking_scored, monkeypatch):
    """What catches it is that the other workers hold other text in the probe (so the test above can fail)."""
    import scoring.score.probes as probes

    real = probes.isolate_row
    monkeypatch.setattr(
        probes,
        "isolate_row",
        lambda x, valid, r, toks, rng: x.copy() if r < 0 else real(x, valid, r, toks, rng),
    )
    assert _probe_peeking(peeking_scored)["passed"]


@pytest.mark.long  # a whole scored run, twice (about 20 s on 2 cores): the suite's 10 minutes are nearly spent
def test_score_artifact_with_a_group_of_two_scores_the_same_bits_and_probes_in_groups(tmp_path, tiny_dataset):
    """The whole scorer: two grouped workers and their probes in fresh groups give one worker's score."""
    from tests.unit.scoring.test_worker_pool import score_with_workers

    cfg = EvalConfig(
        mode="sliding", seq_len=32, batch_seqs=4, stride=16, max_tokens=1024, adapt_chunk_tokens=256
    )
    one, two = score_with_workers(tmp_path, tiny_dataset, cfg, eval_src=DISTRIBUTED_HOOK)
    assert two["status"] == "ok" and two["probes"]["passed"] and two["probes"]["ran"]
    assert two["val_loss_sum_nats"] == one["val_loss_sum_nats"] and two["val_bpb"] == one["val_bpb"]
    assert "group" not in one["adaptation"]
    assert two["adaptation"]["group"]["world_size"] == 2
    assert two["probes"]["probes"][0]["adaptation_chunks_replayed"] >= 0


def test_a_group_whose_worker_fails_to_build_fails_at_once(tmp_path):
    """Rank 1 cannot build; rank 0 would wait for it in the rendezvous (minutes): the pool answers rank 1's
    failure as soon as it comes."""
    import dataclasses
    import time

    from scoring.score.pool import WorkerPool
    from scoring.score.remote import WorkerGroup, start_worker

    cfg = _entry(tmp_path, eval_src=DISTRIBUTED_HOOK)
    broken = dataclasses.replace(cfg, artifact=tmp_path / "missing.pgolf")
    ranks = [
        dataclasses.replace(c, group=WorkerGroup(rank=k, world_size=2, port=1))
        for k, c in enumerate((cfg, broken))
    ]
    pool = WorkerPool([start_worker(c) for c in ranks])
    t0 = time.monotonic()
    try:
        with pytest.raises(WorkerFailure):
            pool.wait_ready()
        assert time.monotonic() - t0 < 60
    finally:
        pool.close()


RANK_ONE_FAILS_HOOK = '''"""Rank 1 runs out of memory before the all-reduce; rank 0 waits for it there."""
import torch
import torch.distributed as dist


def adapt(model, tokens):
    if dist.get_rank() == 1:
        raise MemoryError("rank one ran out of memory")
    dist.all_reduce(torch.ones(1))
'''


def test_a_hook_that_fails_in_one_worker_is_named_by_that_worker(tmp_path):
    """The pool waits for every worker's reply at once: rank 1's own failure is the verdict, not rank 0's broken
    collective (waited for in order, rank 0 came first: on NCCL it would block until the watchdog)."""
    from scoring.statuses import Status

    cfg = _entry(tmp_path, eval_src=RANK_ONE_FAILS_HOOK)
    with ExitStack() as stack:
        pool = start_pool(cfg, ["cpu", "cpu"], grouped=True, stack=stack)
        pool.wait_ready()
        with pytest.raises(WorkerFailure) as failed:
            _sums(pool, ADAPTING, adapter=pool)
        assert failed.value.kind == Status.OUT_OF_MEMORY and "rank one" in str(failed.value)


def test_cuda_without_an_index_is_the_current_gpu_named(monkeypatch):
    """`--device cuda` (what the pipeline passes) becomes cuda:N: every worker's device has an index, which
    torch.cuda.set_device and NCCL's device_id need (a group's rank 0 failed at build before)."""
    from scoring.score.scorer import scoring_device

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    assert scoring_device("cuda") == torch.device("cuda:0")
    assert scoring_device("cuda:1") == torch.device("cuda:1")
