"""What a batch's shape and scored ranges tell a model: nothing of where its rows end (scoring/score/evaluate.py).

HOLE (before the fix): documents mode sorted its windows by length and cut each batch to its longest row, and
asked each row for its logits at [first scored position, the row's length). The last target of a document's
last window is the BOS that ends it, the prediction documents mode scores "from its own tokens". A model read
where every document ends from the ranges its worker is sent (the row's length; a long document's last window by
its first scored position), or, from model.py alone, from the batch's length: the rows as long as the batch end
at its last position. Both are the same in a probe's variants (a probe asks as the scored batch was asked), so
the probes passed. On 2,648 sample.jsonl documents in sp1024 tokens, the batch's length alone gave away 18 % of
the documents' ends (seq_len 1024, batch_seqs 1) to 54 % (4096, 1), the ranges every one; a bigram pays 5.66
nats for each (tests/unit/harness/test_attack_records.py): about 0.002 bpb on the official split's documents.

Now every batch reaches the model as batch_seqs windows (fewer only at the end of a chunk) of seq_len tokens, in
plan order, and every row is asked for [0 or seq_len - stride, seq_len): the range says whether the row is the
first window of its text, which its own first token says too, and nothing of where it ends. What a scored
position's logits may depend on is its own row's tokens up to it, which the probes check.
"""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from data.tokenizer import BOS_ID, ByteTokenizer
from scoring.score.evaluate import EvalConfig, LocalModel, batch_count, evaluate
from scoring.score.probes import ProbeConfig, plan_probes, run_probes
from scoring.worker.wire import select_scored
from tests.unit.scoring.test_probes import Bigram

CPU = torch.device("cpu")
SEQ = 64
_rng = np.random.default_rng(3)
# documents shorter than a window (most), and a few longer than one (several windows each, the last ending at the
# document's end)
_DOCS = [np.concatenate([[BOS_ID], _rng.integers(4, 260, n)]) for n in [*range(5, 62, 3), 150, 90, 200, 7, 9]]
TOKENS = np.concatenate([*_DOCS, [BOS_ID]]).astype(np.int64)
MODES = {
    "documents": EvalConfig(mode="documents", seq_len=SEQ, batch_seqs=4),
    "documents_stride": EvalConfig(mode="documents", seq_len=SEQ, batch_seqs=4, stride=16),
    "sliding": EvalConfig(mode="sliding", seq_len=SEQ, batch_seqs=4, stride=16),
    "standard": EvalConfig(seq_len=SEQ, batch_seqs=4),
    "standard_whole_documents": EvalConfig(
        seq_len=SEQ, batch_seqs=4, max_tokens=int(TOKENS.size) - 1, max_docs=99
    ),
}
END_BONUS = 30.0


class EndFromShape(Bigram):
    """model.py alone: a batch shorter than seq_len was cut to its longest rows, which end at its last position,
    with the BOS that ends their document as the target there."""

    def forward(self, ids):
        out = self.table[ids].clone()
        if ids.shape[1] < SEQ:
            out[:, -1, BOS_ID] += END_BONUS
        return out


class EndFromRanges:
    """A worker's view: every row's range ends where the row does (a document's end when shorter than seq_len),
    and a long document's last window starts scoring later than its others."""

    output_kind = "logits"

    def __init__(self, stride: int):
        self.inner = LocalModel(Bigram())
        self.stride = stride

    def scored_logits(self, x_BL, ranges_B2):
        out = self.inner.logits(x_BL).clone()
        L = x_BL.shape[1]
        for b, (first, end) in enumerate(ranges_B2.tolist()):
            if end < L or first not in (0, L - self.stride):
                out[b, end - 1, BOS_ID] += END_BONUS
        return select_scored(out, ranges_B2)


class Spy:
    """Records the shape and the ranges of every batch it is asked for."""

    output_kind = "logits"

    def __init__(self):
        self.inner = LocalModel(Bigram())
        self.asked: list[tuple[tuple[int, int], np.ndarray]] = []

    def scored_logits(self, x_BL, ranges_B2):
        self.asked.append((tuple(x_BL.shape), np.array(ranges_B2)))
        return select_scored(self.inner.logits(x_BL), ranges_B2)


def _loss(model, cfg: EvalConfig) -> float:
    return evaluate(model, TOKENS, ByteTokenizer().byte_table(), cfg, CPU, shuffle_seed=1).sums.loss_nats


@pytest.mark.parametrize("mode", list(MODES))
def test_every_batch_is_seq_len_long_and_no_range_says_where_a_row_ends(mode):
    cfg = MODES[mode]
    spy = Spy()
    evaluate(spy, TOKENS, ByteTokenizer().byte_table(), cfg, CPU, shuffle_seed=1)
    stride = cfg.resolved_stride or SEQ
    assert spy.asked
    for i, (shape, ranges) in enumerate(spy.asked):
        last = i == len(spy.asked) - 1
        assert shape[1] == SEQ, (mode, i, shape)
        assert shape[0] == cfg.batch_seqs or last, (mode, i, shape)
        assert (ranges[:, 1] == SEQ).all(), (mode, i, ranges)
        assert set(ranges[:, 0].tolist()) <= {0, SEQ - stride}, (mode, i, ranges)


@pytest.mark.parametrize("mode", ["documents", "documents_stride"])
def test_a_model_that_reads_where_documents_end_from_the_batch_gains_nothing_and_passes_its_probes(mode):
    cfg = MODES[mode]
    honest = _loss(LocalModel(Bigram()), cfg)
    stride = cfg.resolved_stride or SEQ
    for cheat in (LocalModel(EndFromShape()), EndFromRanges(stride)):
        assert _loss(cheat, cfg) >= honest, (mode, type(cheat).__name__)
    # what the cheat reads is the same in a probe's variants: the probes cannot be the defence
    pcfg = ProbeConfig(probes=4, seed=2)
    plan = plan_probes(batch_count(TOKENS, cfg), pcfg)
    model = EndFromShape()
    pristine = copy.deepcopy(model)
    result = evaluate(model, TOKENS, ByteTokenizer().byte_table(), cfg, CPU, keep_batches=plan.batches)
    fresh = (LocalModel(copy.deepcopy(pristine)) for _ in iter(int, 1))
    assert run_probes(plan, result.kept, fresh, TOKENS, pcfg, total_batches=result.batches)["passed"]
