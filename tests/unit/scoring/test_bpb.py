"""Scoring goldens: analytic values, the bpb/perplexity invariant, and an oracle loop.

Regenerate nothing: every expected number here is derived in the test's docstrings, not recorded.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch import nn

from data.build import build_dataset
from data.shards import read_split
from data.tokenizer import BOS_ID, BYTE260_OFFSET, ByteTokenizer, SentencePieceTokenizer
from scoring.score.bpb import BpbSums
from scoring.score.evaluate import EvalConfig, evaluate
from tests.conftest import SP1024, require_shared


class UniformOverBytes(nn.Module):
    """Logits 0 on the 256 byte pieces (ids first..first+255), -1e4 elsewhere: uniform over bytes."""

    def __init__(self, vocab_size: int, first: int = BYTE260_OFFSET):
        super().__init__()
        self.vocab_size, self.first = vocab_size, first
        self.dummy = nn.Parameter(torch.zeros(1))

    def forward(self, ids):
        out = torch.full((*ids.shape, self.vocab_size), -1e4)
        out[..., self.first : self.first + 256] = 0.0
        return out + 0 * self.dummy


class RandomBigram(nn.Module):
    def __init__(self, vocab_size: int, seed: int = 0):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.table = nn.Parameter(torch.randn(vocab_size, vocab_size, generator=g) * 2)

    def forward(self, ids):
        return self.table[ids]


def test_uniform_over_byte260_pieces_is_exactly_8_bpb(tmp_path):
    """One validation document of multi-byte UTF-8 text: every target is a byte piece with
    p = 1/256, so Σ nats = N ln 256 and Σ bytes = N: bpb = ln 256 / ln 2 = 8 exactly."""
    text = "Grüße, 世界! byte-level text ✓ " * 20
    ds = build_dataset([text, "train doc"], tmp_path / "ds", val_docs=1, tokenizer="byte260")
    tokens = read_split(ds, "val")
    table = ByteTokenizer().byte_table()
    res = evaluate(
        UniformOverBytes(260), tokens, table, EvalConfig(seq_len=32, batch_seqs=4), torch.device("cpu")
    )
    assert res.sums.val_bpb == 8.0
    assert res.sums.val_loss == math.log(256)
    assert res.sums.bytes == res.sums.tokens == ((tokens.size - 1) // 32) * 32
    assert 2**res.sums.val_bpb == pytest.approx(res.sums.byte_perplexity, rel=1e-12) == 256


def test_uniform_over_sp1024_byte_pieces_is_exactly_8_bpb():
    """sp1024 has byte-fallback pieces at ids 4..259: a stream of byte pieces only (what byte
    fallback produces for text outside the vocabulary) scores exactly 8.0 under the uniform model."""
    require_shared(SP1024)
    tok = SentencePieceTokenizer(SP1024)
    raw = "naïve café ☕".encode() * 30
    tokens = np.concatenate([[BOS_ID], np.frombuffer(raw, dtype=np.uint8).astype(np.int64) + 4])
    assert all(tok.sp.is_byte(int(i)) for i in tokens[1:])
    res = evaluate(
        UniformOverBytes(1024, 4), tokens, tok.byte_table(), EvalConfig(seq_len=16), torch.device("cpu")
    )
    assert res.sums.val_bpb == 8.0


def _oracle(
    model: nn.Module, tokens: np.ndarray, seq_len: int, pieces: list[str], boundary: set[int]
) -> tuple[float, int]:
    """Naive per-token loop: float64 log-softmax of each window, bytes from the piece strings."""
    windows = (tokens.size - 1) // seq_len
    nats, nbytes = 0.0, 0
    for w in range(windows):
        x = torch.from_numpy(tokens[w * seq_len : (w + 1) * seq_len].astype(np.int64))
        logits = model(x[None])[0].double()
        for t in range(seq_len):
            y, prev = int(tokens[w * seq_len + t + 1]), int(x[t])
            nats += float(-(logits[t] - torch.logsumexp(logits[t], 0))[y])
            piece = pieces[y]
            if y in boundary:
                continue
            if piece.startswith("<0x") and piece.endswith(">"):
                nbytes += 1
            elif piece.startswith("\u2581"):
                nbytes += len(piece[1:].encode()) + (prev not in boundary)
            else:
                nbytes += len(piece.encode())
    return nats, nbytes


def test_scorer_matches_oracle_and_is_batch_invariant():
    require_shared(SP1024)
    tok = SentencePieceTokenizer(SP1024)
    docs = [
        "The quick brown fox jumps over the lazy dog.",
        "  Numbers 12345 and  spaces\tand ✓ unicode ☕",
        "x" * 50,
    ]
    ids = [[BOS_ID, *d] for d in tok.encode(docs)]
    tokens = np.concatenate(ids).astype(np.int64)
    model = RandomBigram(1024)
    pieces = [tok.sp.id_to_piece(i) for i in range(1024)]
    boundary = {i for i in range(1024) if tok.sp.is_control(i) or tok.sp.is_unknown(i) or tok.sp.is_unused(i)}
    with torch.no_grad():
        nats, nbytes = _oracle(model, tokens, 16, pieces, boundary)
    table = tok.byte_table()
    results = [
        evaluate(model, tokens, table, EvalConfig(seq_len=16, batch_seqs=b), torch.device("cpu")).sums
        for b in (1, 3, 64)
    ]
    for s in results:
        assert s.bytes == nbytes
        assert s.loss_nats == pytest.approx(nats, rel=1e-12)
        assert s.val_bpb == pytest.approx(nats / (math.log(2) * nbytes), rel=1e-12)
        assert 2**s.val_bpb == pytest.approx(s.byte_perplexity, rel=1e-12)


def test_sums_merge_is_order_independent():
    g = torch.Generator().manual_seed(1)
    parts = [
        (torch.rand(50, generator=g, dtype=torch.float64) * 5, np.random.default_rng(i).integers(0, 4, 50))
        for i in range(6)
    ]
    fwd, rev = BpbSums(), BpbSums()
    for n, b in parts:
        fwd.add(n, b)
    for n, b in reversed(parts):
        rev.add(n, b)
    assert fwd.tokens == rev.tokens and fwd.bytes == rev.bytes
    assert fwd.val_bpb == pytest.approx(rev.val_bpb, rel=1e-13)


def test_model_output_is_checked():
    tokens = np.arange(100) % 260
    table = ByteTokenizer().byte_table()

    class Bad(nn.Module):
        def __init__(self, out):
            super().__init__()
            self.out = out

        def forward(self, ids):
            return self.out(ids)

    cfg = EvalConfig(seq_len=8)
    with pytest.raises(ValueError, match="shape"):
        evaluate(Bad(lambda ids: torch.zeros(*ids.shape, 10)), tokens, table, cfg, torch.device("cpu"))
    with pytest.raises(ValueError, match="non-finite"):
        evaluate(
            Bad(lambda ids: torch.full((*ids.shape, 260), float("nan"))),
            tokens,
            table,
            cfg,
            torch.device("cpu"),
        )
    with pytest.raises(ValueError, match="logits"):
        evaluate(Bad(lambda ids: torch.tensor(1.0)), tokens, table, cfg, torch.device("cpu"))
