"""Evaluation modes against a brute-force reference: every target scored exactly once, with exactly
the context its mode promises, and the same per-token loss.

The brute force is a per-target loop: for target j it computes the context start from the mode's
definition (written out again here, independently of scoring/score/evaluate.py's window plans), runs the
model on tokens[start:j] alone and takes -log_softmax of the last row. `CausalCounts` has logits
that are small multiples of 1/2 (exact in float32), so the scorer, which batches and pads windows,
must agree with the brute force bit for bit; a real transformer agrees to float rounding.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from data.build import build_dataset
from data.shards import read_split
from data.tokenizer import BOS_ID, ByteTokenizer
from scoring.score.evaluate import EvalConfig, evaluate
from scoring.score.windows import eval_tokens, plan_windows
from tests.conftest import BASELINE

V = 260


class CausalCounts(nn.Module):
    """logits[b, t, v] = count of v in x[b, :t+1] + 1/2 [v == x[b, t]] + 1/2 [v ≡ t (mod 7)]."""

    def forward(self, ids):
        oh = F.one_hot(ids, V).float()  # (B, T, V)
        t = torch.arange(ids.shape[1])[:, None]
        phase = ((torch.arange(V)[None, :] % 7) == (t % 7)).float()  # (T, V)
        return oh.cumsum(1) + 0.5 * oh + 0.5 * phase[None]


@pytest.fixture(scope="module")
def docs_tokens(tmp_path_factory) -> np.ndarray:
    """Validation documents of many lengths: empty, 1 byte, shorter and longer than the windows."""
    texts = [
        "",
        "a",
        "tiny doc",
        "x" * 15,
        "Grüße aus Köln, " * 4,
        "The quick brown fox jumps over the lazy dog. " * 3,
        "ok",
        "seventeen chars!!",
        "ünïcödé " * 9,
    ]
    ds = build_dataset(
        texts + ["some training text"] * 3,
        tmp_path_factory.mktemp("modes"),
        val_docs=len(texts),
        tokenizer="byte260",
    )
    return read_split(ds, "val").astype(np.int64)


def ctx_start(j: int, seg_begin: int, seg_end: int, L: int, S: int) -> int:
    """Where target j's context starts under the sliding rule on tokens[seg_begin:seg_end]."""
    T, rel = seg_end - seg_begin - 1, j - seg_begin
    if T <= L or rel <= L:
        return seg_begin
    k = math.ceil((rel - L) / S)
    return seg_begin + min(L + k * S, T) - L


def brute_force(model: nn.Module, toks: np.ndarray, mode: str, L: int, S: int, max_tokens: int | None):
    """{target position: (nats, bytes)} by the per-target definition of each mode."""
    if max_tokens is not None:
        toks = toks[: max_tokens + 1]
    N = toks.size
    table = ByteTokenizer().byte_table()
    if mode == "standard":
        targets = [(j, ((j - 1) // L) * L) for j in range(1, ((N - 1) // L) * L + 1)]
    elif mode == "sliding":
        targets = [(j, ctx_start(j, 0, N, L, S)) for j in range(1, N)]
    else:
        bos = [p for p in range(N) if toks[p] == BOS_ID]
        begins = bos if bos and bos[0] == 0 else [0, *bos]
        ends = [*(b + 1 for b in begins[1:]), N]  # a document's last target is the next BOS
        targets = [
            (j, ctx_start(j, a, b, L, S)) for a, b in zip(begins, ends, strict=False) for j in range(a + 1, b)
        ]
    out = {}
    with torch.no_grad():
        for j, s in targets:
            assert j - s <= L and s < j
            x = torch.from_numpy(toks[s:j])[None]
            logp = F.log_softmax(model(x)[0, -1].double(), dim=-1)
            out[j] = (float(-logp[toks[j]]), int(table.token_bytes(toks[j - 1 : j], toks[j : j + 1])[0]))
    return out


def scored(model, toks, cfg):
    seen: dict[int, tuple[float, int]] = {}

    def on_scored(pos, nats, nbytes):
        for p, n, b in zip(pos.tolist(), nats.tolist(), nbytes.tolist(), strict=False):
            assert p not in seen, f"target {p} scored twice"
            seen[p] = (n, b)

    res = evaluate(model, toks, ByteTokenizer().byte_table(), cfg, torch.device("cpu"), on_scored=on_scored)
    return res, seen


CASES = [
    ("standard", 16, None, None),
    ("standard", 7, None, 100),
    ("sliding", 16, 4, None),
    ("sliding", 16, 16, None),
    ("sliding", 9, 1, 120),
    ("sliding", 32, None, None),
    ("documents", 16, 16, None),
    ("documents", 16, 5, None),
    ("documents", 8, 3, 150),
    ("documents", 64, None, None),
]


@pytest.mark.parametrize("mode,L,S,max_tokens", CASES)
def test_mode_equals_brute_force_exactly(docs_tokens, mode, L, S, max_tokens):
    cfg = EvalConfig(mode=mode, seq_len=L, stride=S, batch_seqs=3, max_tokens=max_tokens)
    res, got = scored(CausalCounts(), docs_tokens, cfg)
    want = brute_force(CausalCounts(), docs_tokens, mode, L, cfg.resolved_stride or L, max_tokens)
    assert sorted(got) == sorted(want)  # the same targets, each once
    assert got == want  # bit-identical nats and identical bytes per target
    assert res.sums.tokens == len(want)
    assert res.sums.bytes == sum(b for _, b in want.values())
    assert res.sums.loss_nats == pytest.approx(sum(n for n, _ in want.values()), rel=1e-12)


def test_targets_of_each_mode(docs_tokens):
    """sliding and documents score every target 1..N-1 (BOS tokens included); standard drops the tail."""
    N = docs_tokens.size
    bos = set(np.flatnonzero(docs_tokens == BOS_ID).tolist())
    sl = plan_windows(docs_tokens, EvalConfig(mode="sliding", seq_len=16, stride=5)).target_positions()
    assert sl.tolist() == list(range(1, N))
    dc = plan_windows(docs_tokens, EvalConfig(mode="documents", seq_len=16, stride=5)).target_positions()
    assert dc.tolist() == list(range(1, N)) and bos - {0} <= set(dc.tolist())
    st = plan_windows(docs_tokens[: (N - 1) // 16 * 16 + 1], EvalConfig(seq_len=16)).target_positions()
    assert st.tolist() == list(range(1, (N - 1) // 16 * 16 + 1))


def test_documents_mode_never_crosses_a_bos(docs_tokens):
    plan = plan_windows(docs_tokens, EvalConfig(mode="documents", seq_len=16, stride=7))
    for s, n in zip(plan.starts.tolist(), plan.lengths.tolist(), strict=False):
        inputs = docs_tokens[s : s + n]  # the last target may be the next document's BOS, never an input
        assert BOS_ID not in inputs[1:].tolist(), f"window at {s} crosses a document boundary"


@pytest.mark.parametrize("mode", ["standard", "sliding", "documents"])
def test_transformer_matches_brute_force(docs_tokens, mode):
    """The naive baseline's GPT, randomly initialised: the same targets and bytes, nats to float rounding."""
    from scoring.worker.loading import import_file

    torch.manual_seed(0)
    gpt = (
        import_file(BASELINE / "model.py", "baseline_model_for_modes")
        .build_model({"vocab_size": V, "num_layers": 2, "model_dim": 32, "num_heads": 2, "num_kv_heads": 1})
        .eval()
    )
    with torch.no_grad():
        for p in gpt.parameters():
            p.add_(torch.randn_like(p) * 0.05)  # move off the zero-initialised projections
    cfg = EvalConfig(
        mode=mode, seq_len=16, stride=None if mode == "standard" else 6, batch_seqs=4, max_tokens=200
    )
    _, got = scored(gpt, docs_tokens, cfg)
    want = brute_force(gpt, docs_tokens, mode, 16, 6, 200)
    assert sorted(got) == sorted(want)
    for j in want:
        assert got[j][1] == want[j][1]
        assert got[j][0] == pytest.approx(want[j][0], abs=2e-5)


def test_batching_does_not_change_the_result(docs_tokens):
    model = CausalCounts()
    a = evaluate(
        model,
        docs_tokens,
        ByteTokenizer().byte_table(),
        EvalConfig(mode="documents", seq_len=16, batch_seqs=1),
        torch.device("cpu"),
    )
    b = evaluate(
        model,
        docs_tokens,
        ByteTokenizer().byte_table(),
        EvalConfig(mode="documents", seq_len=16, batch_seqs=64),
        torch.device("cpu"),
    )
    assert (a.sums.tokens, a.sums.bytes) == (b.sums.tokens, b.sums.bytes)
    assert a.sums.loss_nats == pytest.approx(b.sums.loss_nats, rel=1e-13)


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"mode": "standard", "stride": 4}, "sliding and documents"),
        ({"mode": "sliding", "seq_len": 8, "stride": 9}, "stride must be in"),
        ({"mode": "sliding", "stride": 0}, "stride must be in"),
        ({"mode": "windows"}, "eval mode must be one of"),
        ({"adapt_chunk_tokens": 0}, "adapt_chunk_tokens"),
    ],
)
def test_config_errors_name_the_field(kwargs, match):
    with pytest.raises(ValueError, match=match):
        EvalConfig(**kwargs)


def test_default_strides():
    assert EvalConfig(mode="sliding", seq_len=64).resolved_stride == 32
    assert EvalConfig(mode="documents", seq_len=64).resolved_stride == 64
    assert EvalConfig(seq_len=64).resolved_stride is None


def test_a_cut_by_documents_ends_at_a_documents_start_and_refuses_another_cut():
    from scoring.score.windows import documents_cut, resolve_documents

    tokens = np.array([BOS_ID, 5, 6, BOS_ID, 7, BOS_ID, 8, 9, 10, BOS_ID, 11], dtype=np.int64)
    assert [documents_cut(tokens, d) for d in (1, 2, 3, 4, 9)] == [3, 5, 9, None, None]
    cfg = resolve_documents(EvalConfig(seq_len=2, mode="sliding", max_docs=3), tokens)
    assert (cfg.max_tokens, cfg.max_docs) == (9, 3)
    # the targets scored are every token of documents 0..2 after the first, and document 3's BOS: the end of 2
    assert plan_windows(eval_tokens(tokens, cfg), cfg).target_positions().tolist() == list(range(1, 10))
    assert resolve_documents(EvalConfig(seq_len=2), tokens) == EvalConfig(seq_len=2)
    with pytest.raises(ValueError, match="the first 3 documents end at 9; give one of the two"):
        resolve_documents(EvalConfig(seq_len=2, max_docs=3, max_tokens=8), tokens)
    with pytest.raises(ValueError, match="do not start with BOS"):
        documents_cut(tokens[1:], 2)


@pytest.mark.parametrize("seq_len", [16, 37, 150, 200])
def test_a_cut_by_documents_is_scored_to_its_end_in_standard_mode_whatever_the_seq_len(docs_tokens, seq_len):
    """HOLE (before the fix): standard mode dropped its last partial window, cut by documents too. eval.seq_len is
    the entry's and has no bound, so one between half the cut and the cut scored exactly its first seq_len targets:
    any prefix of the CPU track's 1,700 documents the entry liked (its easiest, found on the public split), the
    choice the cut by documents was made to take away. Every target of the cut is now scored in every mode."""
    from scoring.score.record import unscored_targets_problem
    from scoring.score.windows import resolve_documents

    cfg = resolve_documents(EvalConfig(seq_len=seq_len, max_docs=8), docs_tokens)
    cut = int(cfg.max_tokens or 0)
    assert (
        cut == 262
    )  # the ninth document's BOS: a seq_len of 150 or 200 is one window, 150 or 200 targets before
    res, seen = scored(CausalCounts(), docs_tokens, cfg)
    assert sorted(seen) == list(range(1, cut + 1)) and res.sums.tokens == cut
    score = {"val_tokens_available": int(docs_tokens.size), "eval_subset_max_tokens": cut, "eval_seq_len": seq_len,
             "eval_mode": "standard", "eval_subset_docs": 8}  # fmt: skip
    assert unscored_targets_problem({**score, "val_tokens": cut}) is None
    assert unscored_targets_problem({**score, "val_tokens": cut - 1}) == (
        f"scored {cut - 1:,} of the {cut:,} targets its tokens hold ('standard' mode): 1 left out, and only "
        f"standard mode's last partial window (under {seq_len:,}) may be"
    )


def test_a_cut_by_documents_scores_the_same_text_whatever_the_tokenizer(tmp_path):
    """The CPU record track scores a subset. Cut by tokens, it fell elsewhere in the text for each tokenizer
    (byte260 covered 3 sample documents where sp8192 covered 26), so an entry's tokenizer chose which documents
    counted; cut by documents, every tokenizer's scored targets cover the same canonical bytes."""
    from data.canonical import read_val_bytes
    from scoring.score.windows import resolve_documents
    from tests.conftest import SP1024, SP8192
    from tests.fixtures.texts import prose_documents

    if not (SP1024.is_file() and SP8192.is_file()):
        pytest.skip(f"needs the official tokenizers at {SP1024.parent} (../shared/data)")
    texts = prose_documents(12, 3000)
    covered = {}
    for tok in (SP1024, SP8192):  # both count the sp1024 canonical text, as a record track's datasets must
        ds = build_dataset(texts, tmp_path / tok.stem, val_docs=6, tokenizer=str(tok), progress=False)
        tokens = read_split(ds, "val")
        counts = read_val_bytes(ds / "val_bytes.bin").token_bytes
        # every target of the tokens read is scored, in every mode, under a cut by documents (windows.py
        # whole_documents); sliding here
        cfg = resolve_documents(EvalConfig(seq_len=16, mode="sliding", max_docs=4), tokens)
        targets = plan_windows(eval_tokens(tokens, cfg), cfg).target_positions()
        covered[tok.stem] = (int(counts[targets].sum()), int(cfg.max_tokens or 0))
        by_tokens = plan_windows(
            eval_tokens(tokens, EvalConfig(seq_len=16, mode="sliding", max_tokens=1500)), cfg
        )
        covered[tok.stem] += (int(counts[by_tokens.target_positions()].sum()),)
    (bytes_1024, tokens_1024, cut_1024), (bytes_8192, tokens_8192, cut_8192) = covered.values()
    assert (
        bytes_1024 == bytes_8192 > 0 and tokens_1024 > tokens_8192
    )  # the same four documents, in other tokens
    assert cut_8192 > cut_1024  # cut by tokens, sp8192 was scored on more text than sp1024
