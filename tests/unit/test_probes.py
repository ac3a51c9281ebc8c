"""Legality probes: a model that peeks at future tokens, or mixes batch rows, fails causality with the
position named; log-probabilities that do not sum to one fail normalization; honest models pass;
and a failed probe fails the score."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from data.tokenizer import ByteTokenizer
from scoring.score.evaluate import EvalConfig, evaluate
from scoring.score.loading import import_file
from scoring.score.probes import ProbeConfig, ProbeFailure, run_probes
from scoring.score.scorer import score_artifact
from tests.conftest import BASELINE
from tests.unit.test_eval_support import TINY_MODEL, _one_thread, pack_tiny, write_submission  # noqa: F401 (fixture)

V = 260
CPU = torch.device("cpu")


class Bigram(nn.Module):
    def __init__(self):
        super().__init__()
        self.table = nn.Parameter(torch.randn(V, V, generator=torch.Generator().manual_seed(0)))

    def forward(self, ids):
        return self.table[ids]


class PeekNext(Bigram):
    """Every position also sees the token after it: the classic off-by-one leak."""

    def forward(self, ids):
        nxt = torch.cat([ids[:, 1:], ids[:, -1:]], dim=1)
        return self.table[ids] + 5.0 * F.one_hot(nxt, V).float()


class PeekAt(Bigram):
    """Only position `at` peeks, `ahead` tokens ahead: a leak that a sampled probe may miss."""

    def __init__(self, at: int, ahead: int):
        super().__init__()
        self.at, self.ahead = at, ahead

    def forward(self, ids):
        out = self.table[ids].clone()
        if ids.shape[1] > self.at + self.ahead:
            out[:, self.at] += F.one_hot(ids[:, self.at + self.ahead], V).float()
        return out


class RowMixer(Bigram):
    """Adds the batch mean: in standard mode the next row of a batch is the future."""

    def forward(self, ids):
        out = self.table[ids]
        return out + 0.1 * out.mean(dim=0, keepdim=True)


class LogProbs(Bigram):
    pgolf_output = "log_probs"

    def __init__(self, offset: float = 0.0):
        super().__init__()
        self.offset = offset

    def forward(self, ids):
        return F.log_softmax(self.table[ids], dim=-1) + self.offset


TOKENS = (np.arange(600) * 7 % 256 + 4).astype(np.int64)
TOKENS[::50] = 1  # BOS every 50 tokens


def test_honest_models_pass():
    torch.manual_seed(0)
    gpt = import_file(BASELINE / "model.py", "baseline_model_for_probes").build_model(
        {"vocab_size": V, "num_layers": 2, "model_dim": 32, "num_heads": 2, "num_kv_heads": 1}
    )
    for model in (Bigram(), gpt.eval(), LogProbs()):
        rec = run_probes(model, TOKENS, V, ProbeConfig(seq_len=64), CPU)
        assert rec["passed"] and rec["causality"][0]["max_abs_diff"] <= rec["atol"]
        assert 0 in rec["causality"][0]["positions"] and 62 in rec["causality"][0]["positions"]
    assert rec["normalization"]["applies_to"] == "log_probs"


def test_peeking_model_fails_causality_with_the_position():
    with pytest.raises(
        ProbeFailure, match=r"changing the tokens after position 0 changed the logits at position 0"
    ):
        run_probes(PeekNext(), TOKENS, V, ProbeConfig(seq_len=64), CPU)


def test_a_local_leak_is_named_where_it_happens():
    """With every position sampled, a leak at position 37 only is reported at 37."""
    with pytest.raises(ProbeFailure, match=r"after position 37 changed the logits at position 37"):
        run_probes(PeekAt(37, 3), TOKENS, V, ProbeConfig(seq_len=64, positions=63), CPU)


def test_batch_row_mixing_fails():
    with pytest.raises(ProbeFailure, match="rows of a batch must not see each other"):
        run_probes(RowMixer(), TOKENS, V, ProbeConfig(seq_len=64), CPU)


def test_unnormalized_log_probs_fail_with_the_position():
    with pytest.raises(
        ProbeFailure, match=r"normalization probe failed: the log_probs returned at position 0 sum to"
    ):
        run_probes(LogProbs(offset=0.01), TOKENS, V, ProbeConfig(seq_len=64), CPU)


def test_log_probs_are_scored_as_given_and_match_logits():
    """A model returning normalized log-probabilities scores what the same model returning logits does."""
    table = ByteTokenizer().byte_table()
    cfg = EvalConfig(seq_len=32)
    a = evaluate(Bigram(), TOKENS, table, cfg, CPU).sums
    b = evaluate(LogProbs(), TOKENS, table, cfg, CPU).sums
    assert a.loss_nats == pytest.approx(b.loss_nats, rel=1e-6)


def test_a_failed_probe_fails_the_score(tmp_path, tiny_dataset):
    peek = TINY_MODEL.replace(
        "prev = torch.cat([torch.zeros_like(e[:, :1]), e[:, :-1]], dim=1)",
        "prev = torch.cat([e[:, 1:], torch.zeros_like(e[:, :1])], dim=1)  # the NEXT token",
    )
    folder = write_submission(tmp_path / "peek", model_src=peek)
    pack_tiny(folder, tmp_path / "a.pgolf")
    with pytest.raises(ProbeFailure, match="causality probe failed .* at position"):
        score_artifact(
            tmp_path / "a.pgolf", folder, tiny_dataset, EvalConfig(seq_len=32, max_tokens=512), threads=1
        )
