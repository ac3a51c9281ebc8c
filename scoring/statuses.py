"""Every status a run can end with and every verification state: the names, in one leaf module.

Both sides import it (the scorer writes a verdict, the orchestrator and the records tools read and
write them), so it imports nothing of the project. docs/RULES.md ("Statuses") has the table of each
status and what decides it; tests/unit/test_statuses.py holds the code to that table: every status
literal the code can write is one of these, and every one of these has its row.
"""

from __future__ import annotations

OK = "ok"
ERROR = "error"
ILLEGAL = "illegal"
OVER_BUDGET = "over_budget"
OVER_EVAL_BUDGET = "over_eval_budget"
OUT_OF_MEMORY = "out_of_memory"
OVER_CAP = "over_cap"
INVALID_DATA = "invalid_data"
INTERRUPTED = "interrupted"

STATUSES: tuple[str, ...] = (
    OK,
    ERROR,
    ILLEGAL,
    OVER_BUDGET,
    OVER_EVAL_BUDGET,
    OUT_OF_MEMORY,
    OVER_CAP,
    INVALID_DATA,
    INTERRUPTED,
)
"""Every status of a result (result.json `status`), a phase's record or the scorer's record."""
SCORED: frozenset[str] = frozenset({OK})
"""The statuses whose result carries a score (val_bpb, val_loss) that verify can re-derive; only these rank."""
RESOURCE: frozenset[str] = frozenset({OVER_BUDGET, OVER_EVAL_BUDGET, OUT_OF_MEMORY})
"""Verdicts on the resources an entry took: decided from what the supervisor or the scorer measured,
never from what a submission's process says (a probe worker's failure is never one: illegal)."""

UNVERIFIED = "unverified"
VERIFIED = "verified"
FAILED = "failed"
VERIFICATION_STATES: tuple[str, ...] = (UNVERIFIED, VERIFIED, FAILED)
"""A result's `verification`: only `pgolf verify` sets verified or failed."""
VERIFY_ERROR = ERROR
"""A verification the harness could not carry out (its own failure, a job that died): never a verdict on the
entry; it is printed and logged, and result.json, verification.json and the ledger keep the earlier verdict."""


def require_status(status: object, what: str = "status") -> str:
    """`status` when it is one of STATUSES; ValueError naming it otherwise."""
    if status not in STATUSES:
        raise ValueError(f"{what} {str(status)[:80]!r} is not one of {', '.join(STATUSES)}")
    return str(status)
