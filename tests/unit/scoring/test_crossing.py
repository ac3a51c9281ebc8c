"""The logits' crossing on CUDA: page-locked shared buffers where they can be registered, pageable otherwise.

No CUDA here: the registration is scoring/worker/pinning.py's seam (`registrar_for`), replaced by a fake that
succeeds or fails. What must hold:
- on CPU nothing is registered and the record says "pageable", reason "cpu" (the path of every score before);
- a buffer is registered at its mapping, registered again after every re-map (a grow), unregistered before
  it is unmapped; a nonzero return or an exception leaves it pageable, with the reason;
- the scores are the same to the bit on either path, and the scorer's answer is its own copy either way
  (a worker that rewrites the buffer after its reply changes nothing the scorer holds);
- the worker side writes the same bytes through a pinned buffer as through a pageable one.
"""

from __future__ import annotations

import json
import socket

import numpy as np
import pytest
import torch

from data.tokenizer import ByteTokenizer
from scoring.score.evaluate import EvalConfig, evaluate
from scoring.score.remote import start_worker
from scoring.worker import pinning
from scoring.worker.pinning import registrar_for, side_record
from scoring.worker.process import Worker
from scoring.worker.wire import SharedBuffer
from tests.unit.scoring.test_eval_support import (  # noqa: F401
    TINY_CONFIG,
    _one_thread,
    pack_tiny,
    tiny_worker_config,
    write_submission,
)
from tests.unit.scoring.test_probes import TOKENS, Bigram

CPU = torch.device("cpu")


class FakeRegistrar:
    """Registers nothing; answers `code` (0: success) or raises `raises`; remembers every call."""

    def __init__(self, code: int = 0, raises: BaseException | None = None):
        self.code, self.raises = code, raises
        self.calls: list[tuple[str, int, int]] = []
        self.live: dict[int, int] = {}

    def register(self, ptr: int, nbytes: int) -> int:
        self.calls.append(("register", ptr, nbytes))
        if self.raises is not None:
            raise self.raises
        if self.code == 0:
            assert ptr not in self.live, "registered twice"
            self.live[ptr] = nbytes
        return self.code

    def unregister(self, ptr: int) -> int:
        self.calls.append(("unregister", ptr, self.live.pop(ptr)))
        return 0


def test_on_cpu_nothing_is_registered_and_the_reason_is_cpu():
    assert registrar_for(CPU) is None
    buf = SharedBuffer.create("t", 64)
    try:
        assert not buf.pin(registrar_for(CPU))
        assert side_record({"logits": buf}) == {"logits": "pageable", "why": "cpu"}
    finally:
        buf.close()


def test_a_pinned_buffer_is_registered_again_after_a_grow_and_unregistered_before_unmapping():
    fake = FakeRegistrar()
    buf = SharedBuffer.create("t", 64)
    assert buf.pin(fake) and buf.pin_why == ""
    ((_, first, n1),) = fake.calls
    assert n1 == 64 and first == buf.array(np.uint8, 1).ctypes.data
    buf.grow(1 << 20)
    assert [c[0] for c in fake.calls] == ["register", "unregister", "register"]
    assert fake.calls[1] == ("unregister", first, 64) and fake.calls[2][2] == 1 << 20
    assert buf.pinned and len(fake.live) == 1
    buf.close()
    assert fake.calls[-1][0] == "unregister" and not fake.live  # nothing registered outlives the mapping


@pytest.mark.parametrize(
    ("fake", "why"),
    [
        (FakeRegistrar(code=2), r"cudaHostRegister of 64 bytes returned 2 \(RLIMIT_MEMLOCK "),
        (FakeRegistrar(raises=RuntimeError("no driver")), "raised RuntimeError: no driver"),
    ],
)
def test_a_failed_registration_leaves_that_buffer_pageable_with_its_reason(fake, why):
    buf = SharedBuffer.create("t", 64)
    try:
        assert not buf.pin(fake)
        rec = side_record({"logits": buf})
        assert rec["logits"] == "pageable"
        assert __import__("re").search(why, rec["why"]), rec
        buf.grow(128)  # still usable, still pageable; a failed registration is tried again at a re-map only
        buf.array(np.int64, 16)[:] = 7
    finally:
        buf.close()
    assert not any(c[0] == "unregister" for c in fake.calls)


def _in_process_worker(monkeypatch, registrar) -> tuple[Worker, SharedBuffer, SharedBuffer]:
    monkeypatch.setattr("scoring.worker.process.registrar_for", lambda device: registrar)
    inbuf, outbuf = SharedBuffer.create("in", 4 * 16 * 8 + 64), SharedBuffer.create("out", 4 * 16 * 1024 * 4)
    a, b = socket.socketpair()
    spec = {"sock_fd": b.detach(), "in_fd": inbuf.fd, "in_bytes": inbuf.nbytes, "out_fd": outbuf.fd}
    spec |= {"out_bytes": outbuf.nbytes, "device": "cpu", "dtype": "float32"}
    a.close()
    worker = Worker(json.loads(json.dumps(spec)))
    worker.model = Bigram()
    return worker, inbuf, outbuf


@pytest.mark.parametrize(
    "registrar", [None, FakeRegistrar(), FakeRegistrar(code=1)], ids=["cpu", "ok", "fail"]
)
def test_the_worker_writes_the_same_bytes_through_either_path(monkeypatch, registrar):
    worker, inbuf, outbuf = _in_process_worker(monkeypatch, registrar)
    try:
        x = (np.arange(4 * 16) * 5 % 250).astype(np.int64)
        inbuf.array(np.int64, 4 * 16 + 8)[:] = np.concatenate([x, np.tile([3, 16], 4)])
        N, V = worker.forward(4, 16)
        got = outbuf.array(np.float32, N * V).copy()
        want = Bigram()(torch.from_numpy(x).view(4, 16))[:, 3:].reshape(-1).detach().numpy()
        assert np.array_equal(got, want)
        rec = side_record({"logits": worker.outbuf, "tokens": worker.inbuf})
        expected = "pinned" if isinstance(registrar, FakeRegistrar) and registrar.code == 0 else "pageable"
        assert rec["logits"] == rec["tokens"] == expected
        assert (rec["why"] == "") == (expected == "pinned")
    finally:
        for buf in (worker.inbuf, worker.outbuf, inbuf, outbuf):
            buf.close()
        worker.sock.close()


def test_a_real_worker_scores_the_same_bits_pinned_or_pageable_and_records_each_path(tmp_path, monkeypatch):
    folder = write_submission(tmp_path / "sub")
    pack_tiny(folder, tmp_path / "a.pgolf")
    V = TINY_CONFIG["vocab_size"]
    cfg = EvalConfig(mode="sliding", seq_len=32, batch_seqs=4, stride=8, max_tokens=600)
    table = ByteTokenizer().byte_table()
    failing, ok = FakeRegistrar(code=3), FakeRegistrar()
    monkeypatch.setattr("scoring.score.remote.registrar_for", lambda device: failing)
    worker = start_worker(tiny_worker_config(folder, tmp_path / "a.pgolf"))
    try:
        worker.wait_ready()
        pageable = evaluate(worker, TOKENS, table, cfg, CPU, shuffle_seed=5).sums
        rec = worker.crossing_record()
        assert (rec["scorer"], rec["worker"]) == ("pageable", "pageable")  # the fake refused; a CPU worker
        assert rec["why"]["scorer"].startswith("cudaHostRegister of") and "returned 3" in rec["why"]["scorer"]
        assert rec["why"]["worker"] == "cpu" and rec["version"] == pinning.CROSSING_VERSION
        assert rec["logits_bytes"] == pageable.tokens * V * 4 and rec["tokens_bytes"] > 0

        assert worker.outbuf.pin(ok)  # from here on the scorer copies through the "page-locked" path
        pinned = evaluate(worker, TOKENS, table, cfg, CPU, shuffle_seed=5).sums
        assert (pinned.loss_nats, pinned.bytes, pinned.tokens) == (
            pageable.loss_nats,
            pageable.bytes,
            pageable.tokens,
        )
        assert (
            worker.crossing_record()["scorer"] == "pinned" and worker.crossing_record()["why"]["scorer"] == ""
        )
        assert worker.describe()["crossing"] == {"logits": "pinned", "why": ""}

        # the answer is the scorer's own copy: a worker rewriting the buffer after its reply changes nothing
        x = torch.from_numpy(TOKENS[:128].reshape(4, 32).copy())
        ranges = np.tile([0, 32], (4, 1)).astype(np.int64)
        got = worker.scored_logits(x, ranges)
        before = got.clone()
        worker.outbuf.array(np.float32, got.numel())[:] = 1e9
        assert torch.equal(got, before)
    finally:
        worker.close()
    assert not ok.live  # unregistered when the worker closed


@pytest.mark.parametrize(("device", "raised"), [("cuda:0", True), ("cuda", True), ("cpu", False)])
def test_a_cuda_model_worker_s_sandbox_raises_its_memlock_limit(tmp_path, device, raised):
    """Page-locking counts against RLIMIT_MEMLOCK: the worker's sandbox raises it for a CUDA worker (planned with
    the worker's own device, as remote.py WorkerModel plans it), while it still holds the capability."""
    from isolation.sandbox import MachineCaps, plan_sandbox
    from scoring.worker.confined import PROJECT_ROOT, WORKER_ISOLATION

    plan = plan_sandbox(
        mode="auto",
        device=device,
        project_root=PROJECT_ROOT,
        read_paths=[tmp_path],
        write_paths=[tmp_path],
        protected=(),
        caps=MachineCaps(landlock_abi=5, root=True, unshare=None),
        **WORKER_ISOLATION,
    )
    assert plan.policy()["memlock_unlimited"] is raised
