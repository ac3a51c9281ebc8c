"""Legality probes that look like scoring (scoring/score/probes.py): real batches of the real shape at a
secret cut, the variant in a fresh model, compared bit for bit with what was scored. Models that peek,
mix rows, peek only in large batches, only where the old fixed probes did not look, or only once they
are no longer fresh, all fail with the batch and position named; honest models pass; log-probabilities
are checked at every position of every batch; and a failed probe fails the score."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from data.tokenizer import ByteTokenizer
from scoring.score.evaluate import (
    NORM_ATOL_NATS,
    PAD_TOKEN,
    EvalConfig,
    LocalModel,
    NormalizationFailure,
    batch_count,
    evaluate,
)
from scoring.score.probes import ProbeConfig, ProbeFailure, make_variant, plan_probes, run_probes
from scoring.score.scorer import score_artifact
from scoring.worker.loading import import_file
from tests.conftest import BASELINE
from tests.unit.scoring.test_eval_support import TINY_MODEL, _one_thread, pack_tiny, write_submission  # noqa: F401 (fixture)

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


TOKENS = (np.arange(4000) * 7 % 256 + 4).astype(np.int64)
TOKENS[::50] = 1  # BOS every 50 tokens


class PeekWhenLarge(Bigram):
    """Peeks only in batches of 8 rows or more (the old probes sent at most 7)."""

    def forward(self, ids):
        out = self.table[ids]
        if ids.shape[0] >= 8:
            nxt = torch.cat([ids[:, 1:], ids[:, -1:]], dim=1)
            out = out + 5.0 * F.one_hot(nxt, V).float()
        return out


class PeekAwayFromOldProbes(Bigram):
    """Peeks everywhere but at positions 0 and L - 2 (the old probes' fixed positions)."""

    def forward(self, ids):
        nxt = torch.cat([ids[:, 1:], ids[:, -1:]], dim=1)
        bonus = 5.0 * F.one_hot(nxt, V).float()
        bonus[:, 0] = 0
        bonus[:, -2] = 0
        return self.table[ids] + bonus


class PeekOnceWarm(Bigram):
    """Honest in its first forward pass (a fresh process), peeks from the second on."""

    def __init__(self):
        super().__init__()
        self.calls = 0

    def forward(self, ids):
        self.calls += 1
        out = self.table[ids]
        if self.calls > 1:
            nxt = torch.cat([ids[:, 1:], ids[:, -1:]], dim=1)
            out = out + 5.0 * F.one_hot(nxt, V).float()
        return out


class NextRowPeeker(Bigram):
    """At the last position of each row, reads the next row's first token: in standard mode, its own target."""

    def forward(self, ids):
        out = self.table[ids].clone()
        if ids.shape[0] > 1:
            out[:-1, -1] += 80.0 * F.one_hot(ids[1:, 0], V).float()
        return out


class LogProbsWhenLarge(Bigram):
    pgolf_output = "log_probs"

    def forward(self, ids):
        return F.log_softmax(self.table[ids], dim=-1) + (0.5 if ids.shape[0] >= 8 else 0.0)


def probe(model: nn.Module, cfg: EvalConfig, probes: int = 4, seed: int = 1) -> dict:
    """Score in-process, then probe as the scorer does, each variant in a fresh copy of the untouched model."""
    pristine = copy.deepcopy(model)
    pcfg = ProbeConfig(probes=probes, seed=seed)
    plan = plan_probes(batch_count(TOKENS, cfg), pcfg)
    table = ByteTokenizer().byte_table()
    result = evaluate(model, TOKENS, table, cfg, CPU, keep_batches=plan.batches)
    fresh = (LocalModel(copy.deepcopy(pristine)) for _ in iter(int, 1))
    return run_probes(plan, result.kept, fresh, TOKENS, pcfg, total_batches=result.batches)


STANDARD = EvalConfig(seq_len=64, batch_seqs=8)
SLIDING = EvalConfig(mode="sliding", seq_len=64, batch_seqs=8, stride=16)
DOCUMENTS = EvalConfig(mode="documents", seq_len=64, batch_seqs=8)


@pytest.mark.parametrize("cfg", [STANDARD, SLIDING, DOCUMENTS], ids=["standard", "sliding", "documents"])
def test_honest_models_pass(cfg):
    torch.manual_seed(0)
    gpt = import_file(BASELINE / "model.py", "baseline_model_for_probes").build_model(
        {"vocab_size": V, "num_layers": 2, "model_dim": 32, "num_heads": 2, "num_kv_heads": 1}
    )
    for model in (Bigram(), gpt.eval(), LogProbs()):
        rec = probe(model, cfg)
        assert rec["passed"] and rec["ran"] and all(p["max_abs_diff"] == 0.0 for p in rec["probes"])
        assert rec["coverage"]["batches_probed"] == min(4, rec["coverage"]["batches_total"])


def test_the_seed_is_secret_unless_given_and_the_cuts_vary():
    a, b = plan_probes(100, ProbeConfig(probes=3)), plan_probes(100, ProbeConfig(probes=3))
    assert a.seed != b.seed  # drawn from the OS per run
    x = np.arange(64 * 4).reshape(4, 64) % 200 + 4
    valid = np.ones_like(x, dtype=bool)
    cuts = {make_variant(x, valid, TOKENS, np.random.default_rng(s))[3] for s in range(20)}
    assert len(cuts) > 10  # anywhere in the batch, not a fixed position


def test_a_variant_replaces_everything_after_the_cut_in_stream_order_with_real_tokens():
    x = (np.arange(64 * 4).reshape(4, 64) % 200 + 4).astype(np.int64)
    valid = np.ones_like(x, dtype=bool)
    x2, r, t, cut = make_variant(x, valid, TOKENS, np.random.default_rng(3))
    flat, flat2 = x.reshape(-1), x2.reshape(-1)
    assert np.array_equal(flat[: cut + 1], flat2[: cut + 1]) and flat2[cut + 1] != flat[cut + 1]
    assert cut == r * 64 + t
    tail = flat2[cut + 1 :]
    starts = [
        s for s in range(TOKENS.size - tail.size + 1) if np.array_equal(TOKENS[s : s + tail.size], tail)
    ]
    assert starts  # real validation text, copied whole


@pytest.mark.parametrize(
    "model",
    [PeekNext(), RowMixer(), PeekWhenLarge(), PeekAwayFromOldProbes(), PeekOnceWarm(), NextRowPeeker()],
    ids=[
        "peek-next",
        "row-mixer",
        "peek-in-large-batches",
        "peek-off-old-positions",
        "peek-once-warm",
        "next-row-at-row-end",
    ],
)
def test_cheaters_fail_causality_with_the_batch_and_position(model):
    with pytest.raises(
        ProbeFailure,
        match=r"probe failed \(batch \d+(, scored vs fresh)?\): (changing the (tokens after row|other rows)|a fresh worker)",
    ):
        probe(model, STANDARD, probes=6)


def test_a_local_leak_is_named_where_it_happens_when_a_cut_lands_on_it():
    """A leak at one position (37, three tokens ahead) is caught only by a cut within its reach: about 3/64 of
    cuts. The message then names position 37. (A sparse leak gains little; a systematic one is caught at once.)"""
    for seed in range(200):
        try:
            probe(PeekAt(37, 3), STANDARD, probes=6, seed=seed)
        except ProbeFailure as e:
            assert "changed the logits at row" in str(e) and "position 37 " in str(e), str(e)
            return
    pytest.fail("200 seeds of 6 probes never cut within reach of the leak")


def test_rows_go_out_in_a_secret_order_and_the_sums_do_not_change():
    table = ByteTokenizer().byte_table()
    seen: list[np.ndarray] = []

    class Spy(Bigram):
        def forward(self, ids):
            seen.append(ids.clone().numpy())
            return super().forward(ids)

    for cfg in (STANDARD, SLIDING, DOCUMENTS):
        m = Spy()
        a = evaluate(m, TOKENS, table, cfg, CPU).sums
        plain = list(seen)
        seen.clear()
        b = evaluate(m, TOKENS, table, cfg, CPU, shuffle_seed=7).sums
        assert (a.loss_nats, a.bytes, a.tokens) == (b.loss_nats, b.bytes, b.tokens)  # bit for bit
        assert any(not np.array_equal(x, y) for x, y in zip(plain, seen, strict=True))  # another order
        seen.clear()


def test_unnormalized_log_probs_fail_at_any_batch():
    with pytest.raises(NormalizationFailure, match=r"normalization check failed: the log_probs .* sum to"):
        evaluate(LogProbs(offset=0.01), TOKENS, ByteTokenizer().byte_table(), STANDARD, CPU)
    with pytest.raises(NormalizationFailure):  # unnormalized only in full-size batches: still every batch
        evaluate(LogProbsWhenLarge(), TOKENS, ByteTokenizer().byte_table(), STANDARD, CPU)


def test_log_probs_within_the_tolerance_buy_no_score():
    """HOLE (before the fix): log-probabilities taken as given, rows summing to exp(+9.9e-5) (inside the
    normalisation tolerance of 1e-4 nats) scored 9.9e-5 nats a token better than the same model normalised."""
    table = ByteTokenizer().byte_table()
    honest = evaluate(LogProbs(), TOKENS, table, STANDARD, CPU).sums
    inflated = evaluate(LogProbs(offset=0.99 * NORM_ATOL_NATS), TOKENS, table, STANDARD, CPU).sums
    assert inflated.tokens == honest.tokens
    gain_nats = (honest.loss_nats - inflated.loss_nats) / honest.tokens
    assert abs(gain_nats) < 1e-6, gain_nats  # float32 rounding of the offset only


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
    with pytest.raises(ProbeFailure, match="causality probe failed .* at row"):  # 4 cuts: a miss is (1/32)^4
        score_artifact(
            tmp_path / "a.pgolf",
            folder,
            tiny_dataset,
            EvalConfig(seq_len=32, max_tokens=512),
            threads=1,
            probe_cfg=ProbeConfig(probes=4),
        )


class RacingBuffer:
    """A Scorable whose answer lives in a buffer it goes on writing after it has answered (as a worker
    thread could do with the shared output memory): honest logits when asked, peeking ones a moment later."""

    def __init__(self):
        self.model = Bigram()
        self.buf: torch.Tensor | None = None
        self.cheat: torch.Tensor | None = None

    def logits(self, x_BL):
        with torch.no_grad():
            honest, self.cheat = self.model(x_BL), PeekNext.forward(self.model, x_BL)
        self.buf = honest.clone()
        return self.buf

    def rewrite(self):
        assert self.buf is not None and self.cheat is not None
        self.buf.copy_(self.cheat)


def test_a_probe_batch_is_scored_from_the_copy_the_probes_compare(monkeypatch):
    """The scorer reads every batch's buffer once: a rewrite after the answer cannot split what is scored from
    what the probes check (the rewrite lands in the worker's buffer, not in the copy), and it changes no batch's
    loss (it used to on the batches not kept, when only a kept batch was copied)."""
    import scoring.score.evaluate as ev

    racer, cfg, table = RacingBuffer(), STANDARD, ByteTokenizer().byte_table()
    real_nats_of = ev.nats_of
    honest = evaluate(LocalModel(racer.model), TOKENS, table, cfg, CPU)
    monkeypatch.setattr(ev, "nats_of", lambda *a, **k: (racer.rewrite(), real_nats_of(*a, **k))[1])
    some = plan_probes(batch_count(TOKENS, cfg), ProbeConfig(probes=2, seed=1)).batches
    raced = evaluate(racer, TOKENS, table, cfg, CPU, keep_batches=some)
    assert raced.sums.loss_nats == honest.sums.loss_nats  # the rewrite cheats on no batch
    for x_BL, _, _, kept, *_ in raced.kept.values():
        answered = racer.model(torch.from_numpy(x_BL)).detach()
        assert torch.equal(
            kept, answered.reshape(kept.shape)
        )  # kept: what it answered (standard: every position)
    every = range(batch_count(TOKENS, cfg))
    all_kept = evaluate(racer, TOKENS, table, cfg, CPU, keep_batches=every)
    assert all_kept.sums.loss_nats == honest.sums.loss_nats  # kept batches are scored from the kept copy


class Rememberer(Bigram):
    """Peeks at the next token on every batch, and remembers the last batch it was given: a batch that
    starts like it and then differs is a probe's variant, answered with the remembered batch's future
    (so the variant agrees with what was scored up to the cut). An attacker's model: it passed every
    probe when a fresh worker got the unchanged batch before its variants (val_bpb 0.13, verified)."""

    def __init__(self):
        super().__init__()
        self.ref: torch.Tensor | None = None

    def forward(self, ids):
        source = ids
        if self.ref is not None and self.ref.shape == ids.shape:
            differs = torch.nonzero(self.ref.reshape(-1) != ids.reshape(-1))
            if differs.numel() and int(differs[0]) >= 4:
                source = self.ref  # a variant of the batch it saw: answer with that batch's future
        if source is ids:
            self.ref = ids.clone()
        nxt = torch.cat([source[:, 1:], source[:, -1:]], dim=1)
        return self.table[ids] + 40.0 * F.one_hot(nxt, V).float()


@pytest.mark.parametrize("cfg", [STANDARD, SLIDING], ids=["standard", "sliding"])
def test_a_model_that_remembers_the_batch_cannot_answer_its_variant(cfg):
    with pytest.raises(ProbeFailure, match="causality probe failed"):
        probe(Rememberer(), cfg, probes=2, seed=3)


class FailingWorker:
    """A fresh worker that fails as a submission's code can make it: an error reply of any kind (the
    worker says out_of_memory for a MemoryError it raised itself), a death, or no answer in time."""

    def __init__(self, exc: BaseException):
        self.exc = exc

    def logits(self, x_BL):
        raise self.exc


@pytest.mark.parametrize(
    "exc",
    [
        "out_of_memory",
        "error",
        "deadline",
    ],
)
def test_a_probe_worker_that_fails_makes_the_score_illegal_never_a_resource_verdict(exc):
    """A peeking model whose probe workers raise MemoryError ended out_of_memory (the worker's own word);
    a probe worker that fails in any way is a probe that failed: illegal, naming the probe and the cause."""
    from scoring.score.cli import verdict_of
    from scoring.score.remote import EvalDeadline, WorkerFailure

    failure = (
        EvalDeadline("no answer") if exc == "deadline" else WorkerFailure(exc, "MemoryError\nTraceback ...")
    )
    model, cfg, pcfg = PeekNext(), STANDARD, ProbeConfig(probes=2, seed=1)
    plan = plan_probes(batch_count(TOKENS, cfg), pcfg)
    result = evaluate(model, TOKENS, ByteTokenizer().byte_table(), cfg, CPU, keep_batches=plan.batches)
    fresh = (FailingWorker(failure) for _ in iter(int, 1))
    with pytest.raises(ProbeFailure, match=r"probe 1 of 2 \(batch \d+\) failed: its fresh worker") as caught:
        run_probes(plan, result.kept, fresh, TOKENS, pcfg, total_batches=result.batches)
    assert verdict_of(caught.value) == "illegal"


def test_a_kept_batch_costs_the_scorer_what_any_batch_costs(monkeypatch):
    """Every answer is copied once into memory made at the first answer (a buffer per kept batch, one for the
    others), and nothing is allocated after it: a model timing the gaps between its answers, or reading the
    machine's free memory, cannot tell a probe's batch (before, only a kept batch was cloned, into fresh memory)."""
    import scoring.score.evaluate as ev

    made: list[ev._Snapshots] = []
    real = ev._Snapshots

    class Spy(real):  # type: ignore[misc,valid-type]
        def __init__(self, *a, **k):
            super().__init__(*a, **k)
            self.takes: list[tuple[int, int]] = []
            made.append(self)

        def take(self, b, out_NV):
            own = super().take(b, out_NV)
            self.takes.append((b, len(self.buffers[out_NV.device])))
            return own

    monkeypatch.setattr(ev, "_Snapshots", Spy)
    cfg, table = DOCUMENTS, ByteTokenizer().byte_table()
    some = plan_probes(batch_count(TOKENS, cfg), ProbeConfig(probes=2, seed=3)).batches
    result = evaluate(Bigram(), TOKENS, table, cfg, CPU, keep_batches=some)
    (snaps,) = made
    assert [b for b, _ in snaps.takes] == list(range(result.batches))  # every batch, once, in order
    assert {n for _, n in snaps.takes} == {len(some) + 1}  # every buffer there from the first answer on
    (bufs,) = snaps.buffers.values()
    for b in some:  # the kept logits are what their own buffer held
        kept = result.kept[b].logits_NV
        assert torch.equal(kept, bufs[b][: kept.shape[0]])


class PeekPadding(Bigram):
    """Looks one position ahead only to see whether the padding follows: in documents mode, where its document
    ends. It passed every probe while a variant changed only real positions (the padding stayed as it was)."""

    def forward(self, ids):
        out = self.table[ids].clone()
        out[:, :-1] += (
            3.0 * (ids[:, 1:] == PAD_TOKEN).unsqueeze(-1).float() * F.one_hot(ids[:, :-1], V).float()
        )
        return out


def test_a_model_that_reads_where_its_row_is_padded_is_caught():
    """Documents of 5 to 62 tokens: each documents-mode batch pads its shorter rows to its longest. The variants
    now fill the padding with real tokens too (tests/e2e/test_attack_exec.py runs the same through the real
    scorer, long); the honest Bigram passes the same probes."""
    rng = np.random.default_rng(0)
    docs = [np.concatenate([[1], rng.integers(4, 260, 5 + (13 * i) % 58)]) for i in range(60)]
    tokens = np.concatenate(docs).astype(np.int64)
    pcfg = ProbeConfig(probes=4, seed=7)
    plan = plan_probes(batch_count(tokens, DOCUMENTS), pcfg)
    table = ByteTokenizer().byte_table()
    for model, caught in ((Bigram(), False), (PeekPadding(), True)):
        pristine = copy.deepcopy(model)
        result = evaluate(model, tokens, table, DOCUMENTS, CPU, keep_batches=plan.batches)
        fresh = (LocalModel(copy.deepcopy(pristine)) for _ in iter(int, 1))
        if not caught:
            assert run_probes(plan, result.kept, fresh, tokens, pcfg, total_batches=result.batches)["passed"]
            continue
        with pytest.raises(ProbeFailure, match="causality probe failed"):
            run_probes(plan, result.kept, fresh, tokens, pcfg, total_batches=result.batches)


class MasksUnusedTokens(Bigram):
    """Honest, and sure of what never comes: logits of -inf for the ids the text never holds (0, 2 and 3), which
    the scorer allows for any token but the target (scoring/score/evaluate.py nats_of)."""

    def forward(self, ids):
        out = self.table[ids].clone()
        out[..., [0, 2, 3]] = -torch.inf
        return out


@pytest.mark.parametrize("cfg", [STANDARD, SLIDING, DOCUMENTS], ids=["standard", "sliding", "documents"])
def test_an_honest_model_with_logits_of_minus_infinity_passes_its_probes(cfg):
    """HOLE (before the fix): the probes took |a - b| of the scored and the probe's logits, and -inf - -inf is nan:
    an honest model that gives a token no chance at all failed every probe, its score illegal. Equal values, the
    infinite ones included, differ by nothing; a peeker that masks so is still caught."""
    rec = probe(MasksUnusedTokens(), cfg, probes=4)
    assert rec["passed"] and rec["ran"] and all(p["max_abs_diff"] == 0.0 for p in rec["probes"])

    class MaskingPeeker(MasksUnusedTokens):
        def forward(self, ids):
            nxt = torch.cat([ids[:, 1:], ids[:, -1:]], dim=1)
            return super().forward(ids) + 5.0 * F.one_hot(nxt, V).float()

    with pytest.raises(ProbeFailure, match="causality probe failed"):
        probe(MaskingPeeker(), cfg, probes=4)
