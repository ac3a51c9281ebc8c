"""Attacks on the adaptation group (scoring/score/pool.py, scoring/worker/group.py, isolation/shared_net.py).

A competitor's model.py / eval.py (each passes the static lint, scoring/codecheck.py) uses the group's
torch.distributed channel or its shared network namespace to score better than it honestly would, or to
reach past the group. Each test says whether the attack is caught; 2 CPU workers (gloo), as
tests/unit/scoring/test_worker_group.py.
"""

from __future__ import annotations

import dataclasses
import datetime
from contextlib import ExitStack

import numpy as np
import pytest
import torch
import torch.distributed as dist

from scoring.codecheck import lint_scored_code
from scoring.score.evaluate import batch_count, evaluate
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
from tests.unit.scoring.test_worker_group import NO_OP_HOOK, TABLE, _full_groups_config

CPU = torch.device("cpu")

RANDOM_TOKENS = np.random.default_rng(7).integers(4, 260, 4000).astype(np.int64)
RANDOM_TOKENS[::50] = 1  # BOS every 50 tokens, as TOKENS
"""Text with no repeats: what a k-gram matches in it is the very same place of the text (TOKENS repeats every
256 tokens, so "real tokens from elsewhere" would carry the same k-grams and continuations)."""

_HONEST_FORWARD = "        return self.head(torch.tanh(e + self.mix * prev))"

_KGRAMS = '''

K = 4


def _keys(ids):
    """The k-gram ending at each position as one int64 (-1: too early, or a pad / -7 filler in it)."""
    rows, length = ids.shape
    keys = torch.full((rows, length), -1, dtype=torch.int64)
    if length >= K:
        acc = torch.zeros((rows, length - K + 1), dtype=torch.int64)
        ok = torch.ones((rows, length - K + 1), dtype=torch.bool)
        for i in range(K):
            part = ids[:, i : length - K + 1 + i]
            acc = acc * 1000 + part
            ok = ok & (part > 0)
        keys[:, K - 1 :] = torch.where(ok, acc, torch.full_like(acc, -1))
    return keys


def _boost(out, ids, text):
    """+30 on the token that follows the same k-gram in `text` (rows of token ids): a future peek if `text`
    holds what comes next."""
    if text.numel() == 0 or text.shape[1] < 2:
        return out
    tk = _keys(text)[:, :-1].reshape(-1)
    tn = text[:, 1:].reshape(-1)
    own = _keys(ids).reshape(-1)
    match = (own[:, None] == tk[None, :]) & (own[:, None] >= 0) & (tn[None, :] > 0)
    has = match.any(1)
    if not bool(has.any()):
        return out
    nxt = tn[match.to(torch.int64).argmax(1)]
    flat = torch.zeros(out.shape[0] * out.shape[1], out.shape[2], dtype=out.dtype)
    rows = torch.nonzero(has).reshape(-1)
    flat[rows, nxt[rows]] = 30.0
    return out + flat.view(out.shape)


def _gather(ids):
    """Every worker's batch (rows padded with -7 to one shape), in rank order."""
    world = torch.distributed.get_world_size()
    shape = torch.tensor(list(ids.shape), dtype=torch.int64)
    shapes = [torch.zeros_like(shape) for _ in range(world)]
    torch.distributed.all_gather(shapes, shape)
    rows = int(max(int(s[0]) for s in shapes))
    cols = int(max(int(s[1]) for s in shapes))
    padded = torch.full((rows, cols), -7, dtype=torch.int64)
    padded[: ids.shape[0], : ids.shape[1]] = ids
    held = [torch.zeros_like(padded) for _ in range(world)]
    torch.distributed.all_gather(held, padded)
    return held
'''

NGRAM_PEEK_MODEL = (TINY_MODEL.replace("from torch import nn\n", "from torch import nn\n" + _KGRAMS)).replace(
    _HONEST_FORWARD,
    """        out = self.head(torch.tanh(e + self.mix * prev))
        if torch.distributed.is_initialized():
            held = _gather(ids)
            me = torch.distributed.get_rank()
            peers = torch.cat([h for k, h in enumerate(held) if k != me])
            # a probe's variant gives the others "real tokens from elsewhere": no k-gram of this batch in them,
            # so the model peeks only while scoring (the others then hold the next windows of the same text)
            own = _keys(ids)
            theirs = _keys(peers)
            scoring = bool(torch.isin(own[own >= 0], theirs[theirs >= 0]).any())
            if scoring:
                out = _boost(out, ids, peers)
        return out""",
)
"""Worker 0 holds batch 2g, worker 1 batch 2g+1 (the next windows): worker 0 finds each of its positions'
k-gram in worker 1's rows and puts +30 on the token that follows, a real future peek, only when the others'
batches continue its own text (so never in a probe's variant, whose other batches are text from elsewhere)."""

CACHE_MODEL = (
    (TINY_MODEL.replace("from torch import nn\n", "from torch import nn\n" + _KGRAMS))
    .replace(
        _HONEST_FORWARD,
        """        out = self.head(torch.tanh(e + self.mix * prev))
        if torch.distributed.is_initialized():
            held = torch.cat(_gather(ids))
            if self.seen.numel():  # only what the group held before this batch: text already scored
                out = _boost(out, ids, self.seen)
            cols = max(self.seen.shape[1], held.shape[1]) if self.seen.numel() else held.shape[1]
            old = torch.full((self.seen.shape[0], cols), -7, dtype=torch.int64)
            old[:, : self.seen.shape[1]] = self.seen
            new = torch.full((held.shape[0], cols), -7, dtype=torch.int64)
            new[:, : held.shape[1]] = held
            self.seen = torch.cat([old, new])
        return out""",
    )
    .replace(
        "        self.head = nn.Linear(dim, vocab_size, bias=False)\n",
        "        self.head = nn.Linear(dim, vocab_size, bias=False)\n"
        "        self.seen = torch.zeros((0, 0), dtype=torch.int64)\n",
    )
)
"""A cache model over the group: every batch any worker held is kept, and a later batch's positions whose
k-gram was seen before get +30 on what followed it. Only past (scored) text, but outside the window and
before the chunk's adaptation, and a worker's cache holds the other workers' batches too (TOKENS repeats
every 256 tokens: the cache predicts most of it)."""


def _entry(tmp_path, model_src, eval_src=NO_OP_HOOK, name="sub"):
    folder = write_submission(tmp_path / name, model_src=model_src, eval_src=eval_src)
    assert lint_scored_code(folder) == []  # a real entry: the static lint passes it
    pack_tiny(folder, tmp_path / f"{name}.pgolf")
    return tiny_worker_config(folder, tmp_path / f"{name}.pgolf", adapt=True)


def _nats(model, tokens, cfg, **kw):
    res = evaluate(model, tokens, TABLE, cfg, CPU, **kw)
    return res.sums.loss_nats, res


def _score_and_probe(tmp_path, model_src, tokens, *, seed, probes=1):
    """(honest nats (one worker: no group), the group's nats, the probe record or the ProbeFailure)."""
    cfg = _entry(tmp_path, model_src)
    eval_cfg = _full_groups_config()
    plan = plan_probes(batch_count(tokens, eval_cfg, adapting=True), ProbeConfig(probes=probes, seed=seed))
    with ExitStack() as stack:
        one = start_pool(cfg, ["cpu"], grouped=True, stack=stack)  # a group of one: no channel, honest
        pool = start_pool(cfg, ["cpu", "cpu"], grouped=True, stack=stack)
        one.wait_ready()
        pool.wait_ready()
        honest, _ = _nats(one, tokens, eval_cfg, adapter=one, shuffle_seed=4)
        one.close()
        grouped, res = _nats(pool, tokens, eval_cfg, adapter=pool, keep_batches=plan.batches, shuffle_seed=4)
        pool.close()

        def fresh():
            while True:
                unit = start_pool(cfg, ["cpu", "cpu"], grouped=True, stack=stack)
                unit.wait_ready()
                yield unit
                unit.close()

        try:
            outcome = run_probes(plan, res.kept, fresh(), tokens, ProbeConfig(probes=probes, seed=seed))
        except ProbeFailure as e:
            outcome = e
    return honest, grouped, outcome, plan, res


@pytest.mark.long
def test_a_future_peek_over_the_group_that_hides_from_probes_is_caught(tmp_path):
    """Worker 0 reads worker 1's batch (the next windows) and peeks at the future only when the other batches
    continue its own text. It scores far better than honest; the probe's variant gives the others text from
    elsewhere, the model stops peeking, and its logits differ from the scored ones: caught."""
    honest, grouped, outcome, plan, res = _score_and_probe(tmp_path, NGRAM_PEEK_MODEL, RANDOM_TOKENS, seed=11)
    assert grouped < honest - 50.0  # a real gain: the scored logits used the future
    assert res.kept[plan.batches[0]].slot == 0  # the batch probed is one that peeked
    assert isinstance(outcome, ProbeFailure), outcome
    assert "causality probe failed" in str(outcome) or "row-independence" in str(outcome)


@pytest.mark.long  # a second peeking model caught the same way as the one above (9 s of the suite's 10 min)
def test_a_cache_of_what_the_group_held_before_is_caught(tmp_path):
    """A cache over every batch the group's workers held before (past text, beyond the window, before the
    chunk's adaptation): a large gain on repeating text; the fresh group has no such past and answers
    otherwise: caught."""
    honest, grouped, outcome, _, _ = _score_and_probe(tmp_path, CACHE_MODEL, TOKENS, seed=11)
    assert grouped < honest - 50.0
    assert isinstance(outcome, ProbeFailure), outcome


# ---- reaching past the group: the host's loopback, another group --------------------------------------------

REACH_HOOK = '''"""Rank 0 serves a store on the group's loopback; rank 1 must reach it; neither may reach HOST_PORT or OTHER_PORT."""
import torch.distributed as dist
from torch.distributed.constants import default_pg_timeout

HOST_PORT = {host_port}
OTHER_PORT = {other_port}
SERVE = {serve}
SHORT = default_pg_timeout / default_pg_timeout.total_seconds()  # 1 s (no datetime: not allowed)
kept = []


def _reach(port):
    try:
        store = dist.TCPStore("127.0.0.1", port, None, False, timeout=SHORT)
    except Exception:  # noqa: BLE001 - unreachable
        return None
    try:
        return store.get("secret").decode()
    except Exception:  # noqa: BLE001
        return "connected"


def adapt(model, tokens):
    rank = dist.get_rank()
    if rank == 0 and SERVE and not kept:  # this group's own store, on a port the other group will try
        store = dist.TCPStore("127.0.0.1", OTHER_PORT, None, True, timeout=SHORT, wait_for_workers=False)
        store.set("secret", "{name}")
        kept.append(store)
    dist.barrier()
    if rank == 1 and SERVE and _reach(OTHER_PORT) != "{name}":
        raise RuntimeError("NO PEER: rank 1 could not reach its own group")
    got = _reach(HOST_PORT)
    if got is not None:
        raise RuntimeError("REACHED THE HOST: " + got)
    if not SERVE:
        got = _reach(OTHER_PORT)
        if got is not None:
            raise RuntimeError("REACHED ANOTHER GROUP: " + got)
    dist.barrier()
'''


def _adapt_once(pool):
    pool.before_chunk(None, 0)
    pool.after_chunk(None, 0, np.arange(4, 68, dtype=np.int64), 0)


@pytest.mark.long
def test_a_group_reaches_its_own_workers_and_neither_the_host_nor_another_group(tmp_path):
    """The host's loopback (a store this process serves) and another group's store (same port, its own
    namespace) stay out of reach, while the group's own workers meet (the control: rank 1 reads rank 0's)."""
    host = dist.TCPStore(
        "127.0.0.1", 0, None, True, timeout=datetime.timedelta(seconds=5), wait_for_workers=False
    )
    host.set("secret", "host")
    port = 29611
    fmt = {"host_port": host.port, "other_port": port}
    serving = _entry(tmp_path, TINY_MODEL, REACH_HOOK.format(**fmt, serve=True, name="A"), name="a")
    trying = _entry(tmp_path, TINY_MODEL, REACH_HOOK.format(**fmt, serve=False, name="B"), name="b")
    with ExitStack() as stack:
        a = start_pool(serving, ["cpu", "cpu"], grouped=True, stack=stack)
        b = start_pool(trying, ["cpu", "cpu"], grouped=True, stack=stack)
        if a.net is None:
            pytest.skip("no network namespaces here: the group meets on the host's loopback (recorded)")
        a.wait_ready()
        b.wait_ready()
        _adapt_once(a)  # A's store is up (its hook keeps it) and its rank 1 reached it
        _adapt_once(b)  # B reaches neither the host nor A


@pytest.mark.long
def test_control_without_namespaces_a_group_reaches_the_host(tmp_path):
    """The control: with the group on the host's loopback (no namespace of its own), the same hook reaches the
    host's store, so the test above can fail."""
    host = dist.TCPStore(
        "127.0.0.1", 0, None, True, timeout=datetime.timedelta(seconds=5), wait_for_workers=False
    )
    host.set("secret", "host")
    cfg = _entry(
        tmp_path, TINY_MODEL, REACH_HOOK.format(host_port=host.port, other_port=29612, serve=True, name="A")
    )
    cfg = dataclasses.replace(cfg, sandbox="off")
    with ExitStack() as stack:
        pool = start_pool(cfg, ["cpu", "cpu"], grouped=True, stack=stack)
        assert pool.net is None
        pool.wait_ready()
        with pytest.raises(WorkerFailure, match="REACHED THE HOST"):
            _adapt_once(pool)
