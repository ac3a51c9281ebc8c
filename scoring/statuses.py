"""Every status a run can end with and every verification state: the names, in one leaf module.

Both sides import it (the scorer writes a verdict, the orchestrator and the records tools read and
write them), so it imports nothing of the project. docs/RULES.md ("Statuses") has the table of each
status and what decides it; tests/unit/test_statuses.py holds the code to that table: every status
the code can write (a `Status.X`, or a string literal where a module may not import this one: harness/train/)
is one of these, and every one of these has its row. SCORED and RESOURCE are the sets code tests
membership in; nothing spells them out again.
"""

from __future__ import annotations

from enum import StrEnum


class Status(StrEnum):
    """How a run, a phase or a score ended. A StrEnum: each member is its string ("ok" == Status.OK), so a
    record that holds one is written byte for byte as before, and a status read back from JSON (a plain
    str) compares, hashes and tests membership the same."""

    OK = "ok"
    ERROR = "error"
    ILLEGAL = "illegal"
    OVER_BUDGET = "over_budget"
    OVER_EVAL_BUDGET = "over_eval_budget"
    OUT_OF_MEMORY = "out_of_memory"
    OVER_CAP = "over_cap"
    INVALID_DATA = "invalid_data"
    INTERRUPTED = "interrupted"

    def __repr__(self) -> str:  # a message that shows a status with !r reads as it did for the string
        return repr(self.value)


class Verification(StrEnum):
    """A result's `verification`: only `pgolf verify` sets verified or failed."""

    UNVERIFIED = "unverified"
    VERIFIED = "verified"
    FAILED = "failed"

    def __repr__(self) -> str:
        return repr(self.value)


OK = Status.OK
ERROR = Status.ERROR
ILLEGAL = Status.ILLEGAL
OVER_BUDGET = Status.OVER_BUDGET
OVER_EVAL_BUDGET = Status.OVER_EVAL_BUDGET
OUT_OF_MEMORY = Status.OUT_OF_MEMORY
OVER_CAP = Status.OVER_CAP
INVALID_DATA = Status.INVALID_DATA
INTERRUPTED = Status.INTERRUPTED

STATUSES: tuple[str, ...] = tuple(Status)
"""Every status of a result (result.json `status`), a phase's record or the scorer's record."""
SCORED: frozenset[str] = frozenset({Status.OK})
"""The statuses whose result carries a score (val_bpb, val_loss) that verify can re-derive; only these rank."""
RESOURCE: frozenset[str] = frozenset({Status.OVER_BUDGET, Status.OVER_EVAL_BUDGET, Status.OUT_OF_MEMORY})
"""Verdicts on the resources an entry took: decided from what the supervisor or the scorer measured,
never from what a submission's process says (a probe worker's failure is never one: illegal)."""

UNVERIFIED = Verification.UNVERIFIED
VERIFIED = Verification.VERIFIED
FAILED = Verification.FAILED
VERIFICATION_STATES: tuple[str, ...] = tuple(Verification)
"""A result's `verification`: only `pgolf verify` sets verified or failed."""
VERIFY_ERROR = Status.ERROR
"""A verification the harness could not carry out (its own failure, a job that died): never a verdict on the
entry; it is printed and logged, and result.json, verification.json and the ledger keep the earlier verdict."""


def require_status(status: object, what: str = "status") -> Status:
    """`status` as a Status when it is one of STATUSES; ValueError naming it otherwise."""
    if not isinstance(status, str) or status not in STATUSES:
        raise ValueError(f"{what} {str(status)[:80]!r} is not one of {', '.join(STATUSES)}")
    return Status(status)
