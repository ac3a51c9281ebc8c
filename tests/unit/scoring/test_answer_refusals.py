"""A model's answer the scorer refuses is the submission's failure; a probe worker's is a failed probe.

HOLE (before the fix): the scorer refused a malformed answer (another number of positions, fewer or more logits
per position than the scored batch had, another width from one batch to the next, non-finite logits) with a plain
ValueError, or met it as a RuntimeError in its own arithmetic (the row-isolation comparison of two widths, the copy
into a buffer of the first answer's width). Both are the scorer's own failures by `origin_of`: the run read "a
harness failure, not the entry's (scorer): the scorer failed (...)". A peeking model whose probe workers answer so
(a probe worker can tell it is one: it waited, idle, through the whole scoring) turned every caught probe from
`illegal` into a harness failure; run_probes already refused to let a failing probe worker choose a resource
verdict. Now each refusal is a BadAnswer (scoring/worker/wire.py): in the evaluation an error of the submission's,
in a probe a failed probe (illegal).
"""

from __future__ import annotations

import copy

import pytest
import torch

from data.tokenizer import ByteTokenizer
from scoring.score.cli import origin_of, verdict_of
from scoring.score.evaluate import LocalModel, batch_count, evaluate
from scoring.score.probes import ProbeConfig, ProbeFailure, plan_probes, run_probes
from scoring.worker.wire import BadAnswer, Reply
from tests.unit.scoring.test_probes import STANDARD, TOKENS, Bigram, V

CPU = torch.device("cpu")
TABLE = ByteTokenizer().byte_table()


class Misanswers:
    """A Bigram whose answers are malformed `how`, from its `after`-th forward pass on."""

    output_kind = "logits"

    def __init__(self, how: str, after: int = 0):
        self.inner = LocalModel(Bigram())
        self.how, self.after, self.calls = how, after, 0

    def scored_logits(self, x_BL, ranges_B2):
        out = self.inner.scored_logits(x_BL, ranges_B2)
        self.calls += 1
        if self.calls <= self.after:
            return out
        if self.how == "fewer_positions":
            return out[:-1]
        if self.how == "narrower":
            return out[:, :-1]
        if self.how == "wider":
            return torch.cat([out, torch.zeros_like(out[:, :1])], dim=1)
        if self.how == "nan":
            return torch.full_like(out, torch.nan)
        raise AssertionError(self.how)


@pytest.mark.parametrize("how", ["fewer_positions", "narrower", "wider", "nan"])
def test_a_malformed_answer_in_the_evaluation_is_the_submissions_error(how):
    # "narrower" from the vocabulary's 260 logits down to 259; "wider" only from the second batch on (the first
    # answer's width is the buffers')
    model = Misanswers("narrower" if how == "narrower" else how, after=1 if how == "wider" else 0)
    with pytest.raises(BadAnswer) as caught:
        evaluate(model, TOKENS, TABLE, STANDARD, CPU, shuffle_seed=1)
    assert verdict_of(caught.value) == "error" and origin_of(caught.value) == "submission"


def test_a_workers_reply_of_another_shape_is_a_bad_answer():
    with pytest.raises(BadAnswer):
        Reply.parse({"reply": "ok", "shape": [24, 260]}).shape(96, 260, 1284)


@pytest.mark.parametrize(
    "how,which",
    [
        ("fewer_positions", "causal"),
        ("narrower", "causal"),  # 259 logits a position: fewer than the scored batch's 260
        ("wider", "isolation"),
        ("narrower", "isolation"),
        ("nan", "isolation"),
    ],
)
def test_a_probe_worker_that_answers_otherwise_than_scoring_fails_its_probe(how, which):
    pcfg = ProbeConfig(probes=2, seed=1)
    plan = plan_probes(batch_count(TOKENS, STANDARD), pcfg)
    honest = Bigram()
    result = evaluate(
        LocalModel(copy.deepcopy(honest)), TOKENS, TABLE, STANDARD, CPU, keep_batches=plan.batches
    )

    def fresh():
        while True:
            yield Misanswers(how) if which == "causal" else LocalModel(copy.deepcopy(honest))
            yield Misanswers(how) if which == "isolation" else LocalModel(copy.deepcopy(honest))

    with pytest.raises(ProbeFailure, match="probe") as caught:
        run_probes(plan, result.kept, fresh(), TOKENS, pcfg, total_batches=result.batches)
    assert verdict_of(caught.value) == "illegal" and origin_of(caught.value) == "submission"


def test_control_the_honest_probe_workers_pass():
    pcfg = ProbeConfig(probes=2, seed=1)
    plan = plan_probes(batch_count(TOKENS, STANDARD), pcfg)
    honest = Bigram()
    result = evaluate(
        LocalModel(copy.deepcopy(honest)), TOKENS, TABLE, STANDARD, CPU, keep_batches=plan.batches
    )
    fresh = (LocalModel(copy.deepcopy(honest)) for _ in iter(int, 1))
    assert run_probes(plan, result.kept, fresh, TOKENS, pcfg, total_batches=result.batches)["passed"]
    assert V == 260


@pytest.mark.parametrize("constant", [b"NaN", b"Infinity", b"-Infinity"])
def test_a_workers_message_with_a_non_json_number_breaks_the_protocol(constant):
    """HOLE (before the fix): recv parsed NaN and Infinity (Python's json.loads takes them), so a worker whose model
    patched its `send` reported {"reply": "ready", "output": "logits", "memory": NaN}; the scorer kept what the
    worker said of itself (WorkerModel.facts, the record's `workers[].reported`) and, having scored, failed to write
    its record (json.dumps(allow_nan=False): `ValueError: Out of range float values`): no record, a traceback, and the
    run read "a harness failure (scorer)", whatever the probes found. The scorer never sends such a number (send:
    allow_nan=False): a message holding one is no message of the protocol, the worker's error (WorkerFailure)."""
    import json
    import socket

    from scoring.worker.wire import ProtocolError, recv

    raw = b'{"reply": "ready", "output": "logits", "memory": {"rss_bytes": ' + constant + b"}}"
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    with a, b:
        a.sendall(raw)
        with pytest.raises(ProtocolError, match="not JSON"):
            recv(b, timeout_s=5)
        a.sendall(b'{"reply": "ready", "output": "logits", "memory": {"rss_bytes": 1.5e300}}')
        msg = recv(b, timeout_s=5)  # control: a large finite number is one
    assert json.loads(json.dumps(msg, allow_nan=False)) == msg
    with pytest.raises(ValueError, match="Out of range"):  # what the record's writer (data.io) does with one
        json.dumps({"reported": json.loads(raw)}, allow_nan=False)
