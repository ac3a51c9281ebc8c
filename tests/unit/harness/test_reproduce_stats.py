"""`pgolf reproduce`'s verdict statistics (harness/records/reproduce.py): exact cases, no training."""

from __future__ import annotations

import hashlib
import math
from pathlib import Path

import pytest

from harness.records.reproduce import (
    COULD_NOT_RUN,
    NOT_REPRODUCED,
    REPRODUCED,
    Claim,
    Entry,
    Tolerance,
    mean_test,
    verdict_of,
)

TOL = Tolerance()
CODE = {"model.py": "a" * 64, "train.py": "b" * 64}


def test_mean_test_two_seeds_a_side_exact():
    t = mean_test([3.0, 3.2], [3.1, 3.3], TOL)
    se = math.sqrt(0.02) / math.sqrt(2)  # the reproduced seeds' standard error: s_r / sqrt(n_r) = 0.1
    assert t["mean_claimed"] == pytest.approx(3.1) and t["mean_reproduced"] == pytest.approx(3.2)
    assert t["stderr_reproduced"] == pytest.approx(se, rel=1e-12) and se == pytest.approx(0.1)
    assert t["bound"] == pytest.approx(3 * se + 0.003, rel=1e-12)
    assert t["diff"] == pytest.approx(-0.1) and t["ok"] is True
    assert t["welch_p_two_sided"] == pytest.approx(0.5528, abs=1e-4)  # t = -0.7071, df = 2


def test_a_deterministic_rerun_is_held_to_the_floor():
    assert mean_test([2.5], [2.5, 2.5], TOL)["ok"] is True
    assert mean_test([2.5], [2.5, 2.5], TOL)["welch_p_two_sided"] is None  # no spread: no test
    assert mean_test([2.5029], [2.5], TOL)["ok"] is True
    assert mean_test([2.5031], [2.5], TOL)["ok"] is False
    assert mean_test([2.5031], [2.5], Tolerance(floor_bpb=0.004))["ok"] is True


def test_the_reported_1_1502_against_a_rerun_of_1_18638_is_not_reproduced():
    t = mean_test([1.1502, 1.1502, 1.1502], [1.18638, 1.18590, 1.18701], TOL)
    assert t["ok"] is False and abs(t["diff"]) > 0.035 and t["bound"] < 0.005


@pytest.mark.parametrize("bad", [{"k": -1.0}, {"floor_bpb": math.nan}, {"rel_steps": math.inf}])
def test_tolerances_must_be_finite_and_non_negative(bad):
    with pytest.raises(ValueError, match="must be a finite number >= 0"):
        Tolerance(**bad)


def claim(seed: int, loss: float, **kw) -> Claim:
    fields = {"source": f"results/seed-{seed}/result.json", "seed": seed, "preset": None, "track": "smoke",
              "val_bpb": loss * 1000 / (2000 * math.log(2.0)), "val_loss": loss, "val_tokens": 1000,
              "val_bytes": 2000, "steps": 20, "train_time_s": 3.0, "bytes_total": 10_000, "code_files": CODE}  # fmt: skip
    fields.update(kw)
    return Claim(**fields)


def run(seed: int, loss: float, **kw) -> dict:
    r = {"seed": seed, "status": "ok", "val_loss": loss, "val_bpb": loss * 1000 / (2000 * math.log(2.0)),
         "val_tokens": 1000, "val_bytes": 2000, "steps": 20, "train_time_s": 4.0, "bytes_total": 10_050,
         "track": "smoke"}  # fmt: skip
    r.update(kw)
    return r


def entry(*claims: Claim) -> Entry:
    meta = {"name": "e", "author": "a", "github_id": "g", "date": "2026-01-01", "track": "smoke"}
    return Entry(root=Path("/x/e"), meta=meta, claims=claims, claimed_mean_bpb=None, preset=None,
                 digest="d" * 64, code_files=CODE)  # fmt: skip


def test_an_honest_claim_is_reproduced():
    rec = verdict_of(entry(claim(1, 4.0), claim(2, 4.1)), [run(1, 4.0), run(2, 4.1)], TOL)
    assert rec["verdict"] == REPRODUCED and rec["differences"] == []
    assert rec["stats"]["diff"] == 0.0 and rec["seeds"] == [1, 2]
    assert {c["name"] for c in rec["checks"]} >= {
        "seed 1 steps (within 10%)",
        "seed 2 claim ran this folder's code",
    }


def test_an_edited_claim_names_steps_time_and_val_bpb():
    edited = claim(1, 4.0, steps=400, train_time_s=30.0, val_bpb=2.0)
    rec = verdict_of(entry(edited, claim(2, 4.1)), [run(1, 4.0), run(2, 4.1)], TOL)
    assert rec["verdict"] == NOT_REPRODUCED
    names = [d["name"] for d in rec["differences"]]
    assert names == [
        "val_bpb mean (claimed within reproduced ± 3·SE + 0.003)",
        "seed 1 claimed val_bpb follows from its val_loss",
        "seed 1 val_bpb (within 0.156021)",
        "seed 1 steps (within 10%)",
        "seed 1 train_time_s (within 50% + 5 s, budget 600)",
    ], names
    steps = next(d for d in rec["differences"] if d["name"].startswith("seed 1 steps"))
    assert (steps["expected"], steps["actual"]) == (400, 20)


def test_a_time_over_the_track_budget_differs_even_when_near_the_rerun():
    rec = verdict_of(entry(claim(1, 4.0, train_time_s=601.0)), [run(1, 4.0, train_time_s=600.5)], TOL)
    assert [d["name"] for d in rec["differences"]] == ["seed 1 train_time_s (within 50% + 5 s, budget 600)"]


def test_other_code_and_a_run_that_raised():
    other = claim(1, 4.0, code_files={**CODE, "model.py": "f" * 64})
    rec = verdict_of(
        entry(other, claim(2, 4.1)), [run(1, 4.0), run(2, 4.1, status="error", detail="boom")], TOL
    )
    assert rec["verdict"] == NOT_REPRODUCED
    by_name = {d["name"]: d for d in rec["differences"]}
    assert by_name["seed 1 claim ran this folder's code"]["actual"] == "differs in ['model.py']"
    assert by_name["seed 2 run"]["actual"] == "error: boom"


def test_the_harness_failing_is_could_not_run_not_a_verdict_on_the_entry():
    failed = run(2, 4.1, status="job_failed", harness_failed=True, detail="slurm job 7 (TIMEOUT)")
    rec = verdict_of(entry(claim(1, 4.0), claim(2, 4.1)), [run(1, 4.0), failed], TOL)
    assert rec["verdict"] == COULD_NOT_RUN
    assert verdict_of(entry(claim(1, 4.0)), [], TOL)["verdict"] == COULD_NOT_RUN
    assert (
        verdict_of(entry(claim(1, 4.0)), [run(1, 4.0, status="invalid_data")], TOL)["verdict"]
        == COULD_NOT_RUN
    )


def test_a_claimed_mean_alone_with_fresh_seeds():
    e = Entry(root=Path("/x/e"), meta={"track": "smoke", "name": "e"}, claims=(), claimed_mean_bpb=2.9,
              preset=None, digest="0123abcd" + "0" * 56, code_files=CODE)  # fmt: skip
    each = [int(hashlib.sha256(f"{e.digest}\0{i}".encode()).hexdigest()[:16], 16) % 2**31 for i in range(3)]
    assert e.seeds(None) == each  # each drawn on its own from the digest
    rec = verdict_of(e, [run(s, 4.0) for s in e.seeds(None)], TOL)
    assert rec["verdict"] == NOT_REPRODUCED and rec["stats"]["mean_claimed"] == 2.9
    loss = 2.9 * 2 * math.log(2.0)
    assert (
        verdict_of(e, [run(s, loss + i * 1e-6) for i, s in enumerate(e.seeds(2))], TOL)["verdict"]
        == REPRODUCED
    )
