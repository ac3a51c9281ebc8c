"""Attacks on the records (chain, leaderboard, verify) by an entrant who controls only their own folder.

Each test is a forgery a competitor can make without touching the official's ledger or machines, and the
record it must not win."""

from __future__ import annotations

from harness.records.chain import Candidate, accept_in_order
from harness.records.reproduce import REPRODUCED


def _cand(key: str, date: str, losses: list[float], order: int) -> Candidate:
    return Candidate(key=key, name=key, date=date, order=order, folder=key, track="smoke", verdict=REPRODUCED,
                     why_verdict="", val_loss=losses, val_bpb=[x / 1.386 for x in losses], val_tokens=1000,
                     val_bytes=2000, tokenizer="t" * 64)  # fmt: skip


def test_a_backdated_submission_date_does_not_jump_the_official_order():
    """submission.json's `date` is the entrant's word; the order file (the PRs as they came in) is the
    official's. X came in after B and is 0.002 nats better than B: not a record. Dated before B, it met A's
    frontier instead, was accepted, and then B (the real record) was refused against X."""
    a = _cand("A", "2026-01-01", [5.00, 5.01, 5.02], order=0)
    b = _cand("B", "2026-01-03", [4.90, 4.91, 4.92], order=1)
    x = _cand("X", "2026-01-02", [4.898, 4.908, 4.918], order=2)  # opened last, dated before B
    rows = {r["entry_key"]: r for r in accept_in_order([a, b, x])}
    assert rows["B"]["accepted"] and rows["B"]["frontier_before"] == "A"
    assert rows["X"]["frontier_before"] == "B" and not rows["X"]["accepted"]
