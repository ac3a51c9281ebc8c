"""Only the scored positions cross from a model worker to the scorer (scoring/worker/wire.py, forward).

Before, a worker wrote a batch's whole [B, L, V] float32 logits into shared memory and the scorer selected
the scored positions itself: a sliding window of L with stride S shipped L / S times what was scored. Now
every forward carries each row's scored range and the worker answers [N, V]. What must hold:
- the score is the same to the bit (standard, sliding, documents), in-process and through a real worker,
  against the old path (a Scorable that answers every position, the scorer selecting);
- the bytes read out of the worker are exactly those of the positions asked for: the scored ones and a shorter
  row's padded tail (every row is asked up to seq_len: tests/unit/scoring/test_window_shapes.py); the sliding
  context does not cross;
- a worker's answer of another size, or ranges outside the window, are refused with one line;
- the probes, now comparing scored positions only, still catch a model that peeks in sliding mode.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from data.tokenizer import ByteTokenizer
from scoring.score.evaluate import EvalConfig, LocalModel, evaluate
from scoring.score.remote import start_worker
from scoring.worker.wire import Reply, check_ranges, scored_positions, select_scored
from tests.unit.scoring.test_eval_support import (  # noqa: F401
    TINY_CONFIG,
    _one_thread,
    pack_tiny,
    tiny_worker_config,
    write_submission,
)
from tests.unit.scoring.test_probes import SLIDING, STANDARD, TOKENS, Bigram, PeekNext, probe

CPU = torch.device("cpu")
MODES = {
    "standard": EvalConfig(seq_len=32, batch_seqs=4, max_tokens=1500),
    "sliding": EvalConfig(mode="sliding", seq_len=32, batch_seqs=4, stride=8, max_tokens=1500),
    "documents": EvalConfig(mode="documents", seq_len=32, batch_seqs=4, stride=8, max_tokens=1500),
}


class EveryPosition:
    """The old path: a Scorable that answers [B, L, V] at every position (no scored_logits); the scorer selects."""

    def __init__(self, inner):
        self.inner = inner
        self.output_kind = inner.output_kind
        self.bytes_read = 0

    def logits(self, x_BL):
        out = self.inner.logits(x_BL)
        self.bytes_read += out.numel() * 4
        return out


class Asked:
    """Counts the positions a Scorable is asked for (rows x the width of their range)."""

    def __init__(self, inner):
        self.inner = inner
        self.output_kind = inner.output_kind
        self.positions = 0

    def scored_logits(self, x_BL, ranges_B2):
        self.positions += int((ranges_B2[:, 1] - ranges_B2[:, 0]).sum())
        return self.inner.scored_logits(x_BL, ranges_B2)


def _sums(model, cfg):
    s = evaluate(model, TOKENS, ByteTokenizer().byte_table(), cfg, CPU, shuffle_seed=5).sums
    return s.loss_nats, s.bytes, s.tokens


@pytest.mark.parametrize("mode", list(MODES))
def test_scored_positions_only_give_the_same_bits_in_process(mode):
    cfg = MODES[mode]
    model = LocalModel(Bigram())
    assert _sums(model, cfg) == _sums(EveryPosition(model), cfg)


def test_a_real_worker_ships_only_the_scored_positions_and_scores_the_same_bits(tmp_path):
    folder = write_submission(tmp_path / "sub")
    pack_tiny(folder, tmp_path / "a.pgolf")
    V = TINY_CONFIG["vocab_size"]
    worker = start_worker(tiny_worker_config(folder, tmp_path / "a.pgolf"))
    try:
        worker.wait_ready()
        for mode, cfg in MODES.items():
            old = EveryPosition(worker)
            before = worker.bytes_read
            old_sums = _sums(old, cfg)
            full_bytes = worker.bytes_read - before
            before = worker.bytes_read
            asked = Asked(worker)
            new_sums = _sums(asked, cfg)
            new_bytes = worker.bytes_read - before
            assert new_sums == old_sums, mode  # bit for bit
            assert full_bytes == old.bytes_read  # the old path: every position of every window crossed
            assert new_bytes == asked.positions * V * 4, mode  # exactly the positions asked for
            if mode != "documents":  # documents mode: the shorter rows' padded tails cross too
                assert asked.positions < 1.1 * new_sums[2], mode  # about the scored targets' logits alone
            if mode == "sliding":  # windows of 32 every 8: about 4x fewer bytes
                assert full_bytes > 3.5 * new_bytes, (full_bytes, new_bytes)
            if mode == "standard":
                assert full_bytes == new_bytes  # every position is scored: nothing to save
    finally:
        worker.close()


def test_select_scored_is_the_mask_of_the_ranges_row_by_row():
    out = torch.arange(3 * 5 * 2, dtype=torch.float32).view(3, 5, 2)
    ranges = np.array([[0, 5], [3, 5], [1, 2]], dtype=np.int64)
    mask = torch.tensor([[1, 1, 1, 1, 1], [0, 0, 0, 1, 1], [0, 1, 0, 0, 0]], dtype=torch.bool)
    assert torch.equal(select_scored(out, ranges), out[mask])
    assert scored_positions(ranges, 5).tolist() == [0, 1, 2, 3, 4, 8, 9, 11]
    same = np.array([[2, 5]] * 3, dtype=np.int64)  # one range for every row: a slice
    assert torch.equal(select_scored(out, same), out[:, 2:].reshape(-1, 2))


@pytest.mark.parametrize("bad", [[[0, 6]], [[3, 2]], [[-1, 2]]])
def test_ranges_outside_the_window_are_refused(bad):
    with pytest.raises(ValueError, match=r"scored ranges outside \[0, 5\]"):
        check_ranges(np.array(bad), 1, 5)


def test_an_answer_of_another_size_is_refused():
    ok = Reply.parse({"reply": "ok", "shape": [24, 260]})
    assert ok.shape(24, 260, 1284) == (24, 260)
    with pytest.raises(ValueError, match=r"shape \(24, 260\) at the scored positions; expected \(96, V\)"):
        ok.shape(96, 260, 1284)  # a worker answering every position of a sliding batch
    with pytest.raises(ValueError, match="with 261 <= V <= 1284"):
        ok.shape(24, 261, 1284)  # fewer logits per position than the vocabulary
    from scoring.worker.wire import ProtocolError

    with pytest.raises(ProtocolError, match=r"without an \[N, V\] shape"):
        Reply.parse({"reply": "ok", "shape": [4, 6, 260]}).shape(24, 260, 1284)  # the old [B, L, V]


@pytest.mark.parametrize("cfg", [SLIDING, STANDARD], ids=["sliding", "standard"])
def test_probes_on_scored_positions_still_catch_a_peeker(cfg):
    from scoring.score.probes import ProbeFailure

    with pytest.raises(ProbeFailure, match="probe failed"):
        probe(PeekNext(), cfg, probes=4)
    rec = probe(Bigram(), cfg, probes=4)
    assert rec["passed"] and all(p["positions_compared"] > 0 for p in rec["probes"])
