"""Records accepted in order (harness/records/chain.py): exact cases of the frontier and both rules."""

from __future__ import annotations

import json
from dataclasses import asdict
from typing import Any

import pytest
from scipy import stats

from harness.records.chain import Candidate, accept_in_order, build_chain, lines
from harness.records.reproduce import NOT_REPRODUCED, REPRODUCED


def cand(key: str, date: str, losses: list[float], verdict: str = REPRODUCED, order: int = 0) -> Candidate:
    return Candidate(key=key, name=key, date=date, order=order, folder=key, track="smoke", verdict=verdict,
                     why_verdict="seed 1 steps: claimed 400, found 20" if verdict != REPRODUCED else "",
                     val_loss=losses, val_bpb=[x / 1.386 for x in losses], val_tokens=1000, val_bytes=2000,
                     tokenizer="t" * 64)  # fmt: skip


A = cand("A", "2026-01-01", [5.00, 5.01, 5.02])
B = cand("B", "2026-01-03", [4.90, 4.91, 4.92])  # 0.1 nats better than A: a record under both rules
C = cand("C", "2026-01-05", [4.899, 4.895, 4.891])  # 0.015 better than B, p ~ 0.1: practised only
D = cand("D", "2026-01-02", [3.0, 3.1, 3.2], verdict=NOT_REPRODUCED)  # edited: never accepted
E = cand("E", "2026-01-04", [4.0, 4.01])  # two seeds


def p_of(new: list[float], old: list[float]) -> float:
    return float(
        stats.ttest_ind(old, [x + 0.005 for x in new], equal_var=False, alternative="greater").pvalue
    )


def test_challenge_rule_in_submission_order():
    rows = accept_in_order([C, E, B, D, A])  # given out of order: taken by date
    assert [r["entry_key"] for r in rows] == ["A", "D", "B", "E", "C"]
    assert [r["accepted"] for r in rows] == [True, False, True, True, False]
    by = {r["entry_key"]: r for r in rows}
    assert by["A"]["reason"] == "the first reproduced entry on smoke: it sets the frontier"
    assert by["D"]["reason"] == "verdict not_reproduced (seed 1 steps: claimed 400, found 20)"
    assert by["B"]["frontier_before"] == "A" and by["B"]["test"]["metric"] == "val_loss"
    assert by["B"]["test"]["p_value"] == pytest.approx(p_of(B.val_loss, A.val_loss), rel=1e-12)
    # E (two seeds, 0.9 nats better) is accepted under the challenge rule (2 seeds suffice) ...
    assert by["E"]["frontier_before"] == "B" and by["E"]["reason"].startswith("beats B by +0.905000 val_loss")
    # ... and C, submitted after E, is tested against E (the frontier at its time), not B
    assert by["C"]["frontier_before"] == "E" and by["C"]["reason"].startswith("against E: improvement -")


def test_practised_rule_needs_three_seeds_and_takes_p_below_a_quarter():
    rows = {r["entry_key"]: r for r in accept_in_order([A, B, C, D, E], rule_override="practised")}
    assert (
        rows["E"]["accepted"] is False and rows["E"]["reason"] == "2 seed(s); rule practised needs at least 3"
    )
    p = p_of(C.val_loss, B.val_loss)
    assert 0.01 < p < 0.25  # the case that separates the rules
    assert rows["C"]["accepted"] is True and rows["C"]["frontier_before"] == "B"
    assert rows["C"]["reason"] == f"beats B by +0.015000 val_loss > margin 0.005000 at p = {p:.3g} < 0.25"
    challenge = {r["entry_key"]: r for r in accept_in_order([A, B, C])}
    assert challenge["C"]["accepted"] is False
    assert challenge["C"]["reason"].endswith(f"p = {p:.3g}, not < 0.01")


def test_other_tokens_compare_in_bits_per_byte_with_the_margin_converted():
    other = cand("F", "2026-01-09", [4.0, 4.01, 4.02])
    other.tokenizer = "u" * 64
    rows = accept_in_order([A, other])
    t = rows[1]["test"]
    assert t["metric"] == "val_bpb" and t["margin"] == pytest.approx(0.005 * 1000 / 2000 / 0.6931471805599453)


def test_zero_spread_on_both_sides_is_not_accepted_and_says_why():
    flat_a, flat_b = cand("A", "2026-01-01", [5.0, 5.0]), cand("B", "2026-01-02", [4.0, 4.0])
    rows = accept_in_order([flat_a, flat_b])
    assert rows[1]["accepted"] is False and "variance is zero" in rows[1]["reason"]


def test_build_chain_reads_the_latest_verdict_per_entry_from_a_ledger(tmp_path):
    def rec(key: str, digest: str, date: str, verdict: str, losses: list[float]) -> dict:
        runs = [{"seed": i, "status": "ok", "val_loss": x, "val_bpb": x / 1.386, "val_tokens": 1000,
                 "val_bytes": 2000, "tokenizer_sha256": "t" * 64} for i, x in enumerate(losses)]  # fmt: skip
        return {"format": "pg-reproduction", "format_version": 1, "entry_key": key, "entry_digest": digest,
                "entry_dir": f"/e/{key}", "submission": {"name": key, "date": date}, "track": "smoke",
                "verdict": verdict, "reproduced": runs, "differences": [], "seeds": [0, 1, 2]}  # fmt: skip

    ledger = tmp_path / "ledger.jsonl"
    lines_in = [
        rec("A", "1", "2026-01-01", REPRODUCED, A.val_loss),
        rec("B", "2", "2026-01-02", "could_not_run", []),
        rec("B", "2", "2026-01-02", REPRODUCED, B.val_loss),  # a later verdict for the same digest wins
        {"format": "pg-result", "status": "ok"},
    ]
    ledger.write_text("".join(json.dumps(x) + "\n" for x in lines_in))
    chain = build_chain(ledger, track=None, rule=None, order={})
    assert chain["records"] == ["A", "B"] and chain["format"] == "pg-chain"
    text = lines(chain)
    assert text[-1] == "record chain (2): A -> B" and "ACCEPTED: beats A by +0.100000" in text[1]
    with pytest.raises(ValueError, match="--rule 'loose' is not one of challenge, practised"):
        build_chain(ledger, track=None, rule="loose", order={})


def test_a_track_whose_policy_takes_verified_results(tmp_path, monkeypatch):
    from harness.records import chain as chain_mod
    from harness.records.verify import result_digest

    monkeypatch.setitem(chain_mod.TRACK_POLICIES, "smoke", chain_mod.TrackPolicy(evidence="verified"))

    def result(name: str, seed: int, loss: float) -> dict:
        return {"format": "pg-result", "status": "ok", "within_cap": True, "track": "smoke", "preset": "tiny",
                "seed": seed, "val_loss": loss, "val_bpb": loss / 1.386, "val_tokens": 1000, "val_bytes": 2000,
                "submission": {"name": name, "author": "x", "github_id": "x", "date": "2026-01-0" + name[-1]},
                "provenance": {"code_files": {"model.py": name}, "tokenizer_sha256": "t"},
                "phases": {"command": {"overrides": []}}}  # fmt: skip

    rows = [result("e1", s, x) for s, x in ((1, 5.0), (2, 5.01))] + [
        result("e2", s, x) for s, x in ((1, 4.0), (2, 4.01))
    ]
    rows.append(result("e3", 1, 1.0))  # never verified: not a candidate at all
    lines_out = [json.dumps(r) for r in rows]
    lines_out += [
        json.dumps({"format": "pg-verification", "status": "verified", "result_sha256": result_digest(r)})
        for r in rows[:4]
    ]
    ledger = tmp_path / "ledger.jsonl"
    ledger.write_text("\n".join(lines_out) + "\n")
    chain = build_chain(ledger, track="smoke", rule=None, order={})
    assert [(r["name"], r["accepted"], r["evidence"]) for r in chain["rows"]] == [
        ("e1", True, "verified"),
        ("e2", True, "verified"),
    ]


def test_verified_evidence_counts_each_seed_no_better_than_its_re_score(tmp_path, monkeypatch):
    """HOLE (before the fix): the board ranks a verified seed at the worse of its own figure and its verification's
    re-score, but the chain's verified evidence counted the figure the result holds: e2's seeds, edited from 5.0
    to 4.0 and verified under --tol-bpb 1.5 (the re-scores said 5.0), beat e1 as a record."""
    from harness.records import chain as chain_mod
    from harness.records.verify import result_digest

    monkeypatch.setitem(chain_mod.TRACK_POLICIES, "smoke", chain_mod.TrackPolicy(evidence="verified"))

    def result(name: str, seed: int, loss: float) -> dict:
        return {"format": "pg-result", "status": "ok", "within_cap": True, "track": "smoke", "preset": "tiny",
                "seed": seed, "val_loss": loss, "val_bpb": loss / 1.386, "val_tokens": 1000, "val_bytes": 2000,
                "submission": {"name": name, "author": "x", "github_id": "x", "date": "2026-01-0" + name[-1]},
                "provenance": {"code_files": {"model.py": name}, "tokenizer_sha256": "t"},
                "phases": {"command": {"overrides": []}}}  # fmt: skip

    def verified(r: dict, again: float) -> dict:
        return {"format": "pg-verification", "status": "verified", "result_sha256": result_digest(r),
                "checks": [{"name": "re-score val_loss (tolerance 1.5)", "ok": True, "actual": again},
                           {"name": "re-score val_bpb (tolerance 1.5)", "ok": True, "actual": again / 1.386}]}  # fmt: skip

    honest = [result("e1", s, x) for s, x in ((1, 5.0), (2, 5.01))]
    edited = [result("e2", s, x) for s, x in ((1, 4.0), (2, 4.01))]
    lines_out = [json.dumps(r) for r in honest + edited]
    lines_out += [json.dumps(verified(r, r["val_loss"])) for r in honest]
    lines_out += [json.dumps(verified(r, r["val_loss"] + 1.0)) for r in edited]
    ledger = tmp_path / "ledger.jsonl"
    ledger.write_text("\n".join(lines_out) + "\n")
    chain = build_chain(ledger, track="smoke", rule=None, order={})
    assert [(r["name"], r["accepted"]) for r in chain["rows"]] == [("e1", True), ("e2", False)]


@pytest.mark.parametrize(
    ("over", "why"),
    [
        ({"phases": {"command": {"overrides": [], "loosened": [{"key": "eval.max_tokens"}]}}}, "loosened"),
        ({"phases": {"command": {"overrides": []}, "score": {"eval_subset_max_tokens": 4096}}}, "subset"),
        ({"bytes_total": 16_000_001}, "over the cap"),
        ({}, "a bare NaN in another line"),
    ],
)
def test_a_verified_result_scored_outside_its_tracks_rules_is_never_accepted(
    tmp_path, monkeypatch, over, why
):
    """The leaderboard ranks a verified result only when it scored under its track's rules; the chain, on a
    track whose evidence is `verified`, accepted one scored on a validation subset, under a loosened rule or
    with bytes over the cap (within_cap is the result's word) as the record, and a bare NaN in any line of
    the ledger stopped the chain (result_digest refuses it)."""
    from harness.records import chain as chain_mod
    from harness.records.verify import result_digest

    monkeypatch.setitem(chain_mod.TRACK_POLICIES, "smoke", chain_mod.TrackPolicy(evidence="verified"))

    def result(name: str, seed: int, loss: float, **more) -> dict:
        return {"format": "pg-result", "status": "ok", "within_cap": True, "track": "smoke", "preset": "tiny",
                "seed": seed, "val_loss": loss, "val_bpb": loss / 1.386, "val_tokens": 1000, "val_bytes": 2000,
                "bytes_total": 1000, "submission": {"name": name, "author": "x", "github_id": "x",
                "date": "2026-01-0" + name[-1]}, "provenance": {"code_files": {"model.py": name},
                "tokenizer_sha256": "t"}, "phases": {"command": {"overrides": []}}, **more}  # fmt: skip

    rows = [result("e1", s, x) for s, x in ((1, 5.0), (2, 5.01))]
    rows += [result("e2", s, x, **over) for s, x in ((1, 4.0), (2, 4.01))]
    lines_out = [json.dumps(r) for r in rows]
    if why.startswith("a bare NaN"):
        lines_out.append(json.dumps(result("e3", 1, 1.0)).replace("1.0,", "NaN,", 1))
    lines_out += [
        json.dumps({"format": "pg-verification", "status": "verified", "result_sha256": result_digest(r)})
        for r in rows
    ]
    ledger = tmp_path / "ledger.jsonl"
    ledger.write_text("\n".join(lines_out) + "\n")
    chain = build_chain(ledger, track="smoke", rule=None, order={})
    want = [("e1", True), ("e2", True)] if why.startswith("a bare NaN") else [("e1", True)]
    assert [(r["name"], r["accepted"]) for r in chain["rows"]] == want, why


@pytest.mark.parametrize("bad", ["nan", "inf", "-inf", "1.0e400", "text", None, [1.0], True])
def test_a_run_without_a_finite_score_sets_no_frontier_and_stops_no_chain(tmp_path, bad):
    """The ledger writes a non-finite number as a string ("nan"), and the chain read each ok run's score with
    float(): a reproduced entry with one such run set the frontier at a NaN mean, and every entry after it was
    refused ("p = nan, not < 0.01"); text there ended `pgolf chain` (and the queue's last step) in ValueError.
    Such a run is no sample: the entry is refused, naming it, and the next entry sets the frontier."""

    def rec(key: str, date: str, losses: list[Any]) -> dict:
        runs = [{"seed": i, "status": "ok", "val_loss": x, "val_bpb": x / 1.386 if isinstance(x, float) else x,
                 "val_tokens": 1000, "val_bytes": 2000, "tokenizer_sha256": "t" * 64}
                for i, x in enumerate(losses)]  # fmt: skip
        return {"format": "pg-reproduction", "format_version": 1, "entry_key": key, "entry_digest": key * 64,
                "entry_dir": f"/e/{key}", "submission": {"name": key, "date": date}, "track": "smoke",
                "verdict": REPRODUCED, "reproduced": runs, "differences": [], "seeds": [0, 1, 2]}  # fmt: skip

    ledger = tmp_path / "ledger.jsonl"
    text = json.dumps(rec("a", "2026-01-01", [5.0, 5.01, "BAD"])).replace('"BAD"', json.dumps(bad))
    text = text.replace('"1.0e400"', "1.0e400")  # a bare overflowing number, as json.loads reads it: inf
    ledger.write_text(text + "\n" + json.dumps(rec("b", "2026-01-02", A.val_loss)) + "\n")
    rows = build_chain(ledger, track=None, rule=None, order={})["rows"]
    assert [r["accepted"] for r in rows] == [False, True]
    assert rows[0]["reason"].startswith("seed 2: val_loss ") and "is not a finite score" in rows[0]["reason"]


def test_verified_evidence_counts_a_result_once_and_refuses_one_seed_twice(tmp_path, monkeypatch):
    """A track whose policy takes verified results grouped every verified ok line: a result line appended twice
    (a ledger merged from two machines) was two samples, and so were two runs of one seed (deterministic: one
    run). The same result is one sample, as on the leaderboard; one seed twice is refused."""
    from harness.records import chain as chain_mod
    from harness.records.verify import result_digest

    monkeypatch.setitem(chain_mod.TRACK_POLICIES, "smoke", chain_mod.TrackPolicy(evidence="verified"))

    def result(name: str, seed: int, loss: float, run: str = "") -> dict:
        return {"format": "pg-result", "status": "ok", "within_cap": True, "track": "smoke", "preset": "tiny",
                "seed": seed, "val_loss": loss, "val_bpb": loss / 1.386, "val_tokens": 1000, "val_bytes": 2000,
                "run_dir": f"/runs/{name}-{seed}{run}",
                "submission": {"name": name, "author": "x", "github_id": "x", "date": "2026-01-0" + name[-1]},
                "provenance": {"code_files": {"model.py": name}, "tokenizer_sha256": "t"},
                "phases": {"command": {"overrides": []}}}  # fmt: skip

    e1 = [result("e1", 1, 5.0), result("e1", 2, 5.01)]
    e2 = [result("e2", 1, 4.0), result("e2", 2, 4.01)]
    e3 = [result("e3", 1, 3.0), result("e3", 1, 3.0, run="-again")]  # one seed run twice
    lines_out = [json.dumps(r) for r in [*e1, *e2, e2[0], *e3]]  # e2's first line appended twice
    lines_out += [
        json.dumps({"format": "pg-verification", "status": "verified", "result_sha256": result_digest(r)})
        for r in [*e1, *e2, *e3]
    ]
    ledger = tmp_path / "ledger.jsonl"
    ledger.write_text("\n".join(lines_out) + "\n")
    rows = build_chain(ledger, track="smoke", rule=None, order={})["rows"]
    assert [(r["name"], r["n_seeds"], r["accepted"]) for r in rows] == [
        ("e1", 2, True),
        ("e2", 2, True),
        ("e3", 0, False),
    ]
    assert rows[2]["reason"].startswith("seeds 1 and 1 gave one run (one seed counted twice)")


def test_a_verdict_decided_under_a_looser_tolerance_than_its_tracks_is_refused(tmp_path):
    """The chain read the latest verdict of each entry whatever tolerance decided it: a queue run again with
    `--k 100 --floor-bpb 1` into the same ledger (the queue decides a verdict again under new flags) turned an
    entry not reproduced under the defaults into a record. Only a verdict under the track's tolerance or a
    stricter one counts."""
    from harness.records.reproduce import Tolerance

    def rec(key: str, date: str, losses: list[float], tol: dict | None) -> dict:
        runs = [{"seed": i, "status": "ok", "val_loss": x, "val_bpb": x / 1.386, "val_tokens": 1000,
                 "val_bytes": 2000, "tokenizer_sha256": "t" * 64} for i, x in enumerate(losses)]  # fmt: skip
        out = {"format": "pg-reproduction", "format_version": 1, "entry_key": key, "entry_digest": key * 64,
               "entry_dir": f"/e/{key}", "submission": {"name": key, "date": date}, "track": "smoke",
               "verdict": REPRODUCED, "reproduced": runs, "differences": [], "seeds": [0, 1, 2]}  # fmt: skip
        return out if tol is None else {**out, "tolerance": tol}

    default = asdict(Tolerance())
    ledger = tmp_path / "ledger.jsonl"
    recs = [
        rec("a", "2026-01-01", A.val_loss, default),
        rec("b", "2026-01-02", B.val_loss, {**default, "k": 100.0, "floor_bpb": 1.0}),
        rec("c", "2026-01-03", C.val_loss, {**default, "floor_bpb": 0.001}),  # stricter: counts
    ]
    ledger.write_text("".join(json.dumps(x) + "\n" for x in recs))
    rows = build_chain(ledger, track=None, rule=None, order={})["rows"]
    assert [r["accepted"] for r in rows] == [True, False, True]
    assert rows[1]["reason"] == (
        "decided under a looser tolerance than smoke's (k 100 > 3, floor_bpb 1 > 0.003): decide it again under "
        "the track's (pgolf queue without --k and --floor-bpb)"
    )


def test_runs_that_scored_other_tokens_are_not_one_sample_set(tmp_path):
    """The chain took the first ok run's tokenizer and counts for the whole entry and compared val_loss: a
    reproduction whose runs scored other tokens (a dataset changed in place between two queue runs, the same
    --data path) mixed nats per token of two validation sets in one side of the test. Refused, naming them."""

    def rec(key: str, date: str, losses: list[float], tokens: list[int]) -> dict:
        runs = [{"seed": i, "status": "ok", "val_loss": x, "val_bpb": x / 1.386, "val_tokens": n,
                 "val_bytes": 2000, "tokenizer_sha256": "t" * 64}
                for i, (x, n) in enumerate(zip(losses, tokens, strict=True))]  # fmt: skip
        return {"format": "pg-reproduction", "format_version": 1, "entry_key": key, "entry_digest": key * 64,
                "entry_dir": f"/e/{key}", "submission": {"name": key, "date": date}, "track": "smoke",
                "verdict": REPRODUCED, "reproduced": runs, "differences": [], "seeds": [0, 1, 2]}  # fmt: skip

    ledger = tmp_path / "ledger.jsonl"
    recs = [
        rec("a", "2026-01-01", A.val_loss, [1000] * 3),
        rec("b", "2026-01-02", B.val_loss, [1000, 1000, 900]),
    ]
    ledger.write_text("".join(json.dumps(x) + "\n" for x in recs))
    rows = build_chain(ledger, track=None, rule=None, order={})["rows"]
    assert [r["accepted"] for r in rows] == [True, False]
    assert (
        rows[1]["reason"] == "seeds 0 and 2 scored other tokens (tokenizer, val_tokens or val_bytes differ)"
    )
