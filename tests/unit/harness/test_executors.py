"""Verification executors without a scheduler: per-result resources, the options' validation, and
`accept_report`, which decides whether a job's report may be a verdict (a job must not forge one).

The runs through submitit's LocalExecutor and a real Slurm are in tests/e2e/test_verify_slurm.py."""

from __future__ import annotations

import copy
import json
from dataclasses import asdict
from pathlib import Path

import pytest

from harness.records.executors import (
    ExecutorConfig,
    Expected,
    JobResources,
    accept_report,
    resources_for,
)
from harness.records.verify import Check, VerifyConfig, score_checks, verification_record

SCORE = {
    "device": "cpu",
    "threads": 2,
    "val_tokens": 4096,
    "val_bytes": 4321,
    "eval_mode": "standard",
    "eval_seq_len": 64,
    "eval_windows": 64,
}
RESULT = {
    "format": "pg-result",
    "status": "ok",
    "track": "smoke",
    "val_loss": 2.5,
    "val_bpb": 1.25,
    "phases": {"score": SCORE},
}
RECEIPT = [
    Check("artifact sha256 (receipt)", True, "ab" * 32, "ab" * 32),
    Check("bytes_total = bytes_code + bytes_model", True, 1000, 1000),
]


def test_resources_follow_the_result_and_the_track_and_flags_override():
    cpu = resources_for(RESULT, VerifyConfig(), ExecutorConfig(kind="slurm"))
    assert cpu == JobResources(cpus=2, gpus=0, time_min=2 * 10 + 10, mem_gb=None)  # smoke: 600 s eval
    gpu_result = copy.deepcopy(RESULT)
    gpu_result["phases"]["score"].update(device="cuda:0", threads=0)
    gpu_result["track"] = "non_record_16mb"  # untimed: 6 hours
    assert resources_for(gpu_result, VerifyConfig(), ExecutorConfig(kind="slurm")) == JobResources(
        cpus=1, gpus=1, time_min=360, mem_gb=None
    )
    # --device cpu re-scores a CUDA result on CPU: no GPU asked for
    assert resources_for(gpu_result, VerifyConfig(device="cpu"), ExecutorConfig(kind="slurm")).gpus == 0
    # scored by eight workers (one per GPU, a group with its adaptation): the re-score takes as many
    gpu_result["phases"]["score"]["scoring_workers"] = 8
    assert resources_for(gpu_result, VerifyConfig(), ExecutorConfig(kind="slurm")).gpus == 8
    assert resources_for(gpu_result, VerifyConfig(scoring_workers=2), ExecutorConfig(kind="slurm")).gpus == 2
    flags = ExecutorConfig(kind="slurm", cpus=8, gpus=2, time_min=5, mem_gb=3.5)
    assert resources_for(RESULT, VerifyConfig(threads=1), flags) == JobResources(
        cpus=8, gpus=2, time_min=5, mem_gb=3.5
    )


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"kind": "kubernetes"}, "not one of inline, local, slurm"),
        ({"cpus": 0}, "--cpus must be at least 1"),
        ({"time_min": 0}, "--time-min must be at least 1"),
        ({"gpus": -1}, "--gpus must be >= 0"),
        ({"mem_gb": 0.0}, "--mem-gb must be positive"),
        ({"max_parallel": -2}, "--max-parallel"),
    ],
)
def test_bad_options_are_user_errors(kwargs, message):
    with pytest.raises(ValueError, match=message):
        ExecutorConfig(**kwargs)


def genuine(measured_bpb: float = 1.25, measured_loss: float = 2.5) -> tuple[str, dict, Expected]:
    """A report as verify_job makes it, and what the submitting side expects."""
    cfg = VerifyConfig()
    new = dict(SCORE, val_loss=measured_loss, val_bpb=measured_bpb, probes={"passed": True})
    checks = [*RECEIPT, *score_checks(RESULT, new, "", cfg)]
    record = verification_record(RESULT, Path("/runs/r0"), None, None, cfg, checks, wall_s=1.0)
    text = json.dumps(record, sort_keys=True)
    expect = Expected(
        run_dir="/runs/r0",
        result_sha256=record["result_sha256"],
        tol_bpb=cfg.tol_bpb,
        receipt=json.loads(json.dumps([asdict(c) for c in RECEIPT])),
        score_names=(
            frozenset(c.name for c in score_checks(RESULT, None, "", cfg)),
            frozenset(c.name for c in checks[len(RECEIPT) :]),
        ),
        result=RESULT,
        cfg=cfg,
    )
    return text, json.loads(text), expect


def test_a_genuine_report_is_accepted_verified_or_failed():
    text, written, expect = genuine()
    assert written["status"] == "verified"
    assert accept_report(text, written, expect) == []
    text, written, expect = genuine(measured_bpb=1.3)  # a real mismatch, reported honestly
    assert written["status"] == "failed"
    assert accept_report(text, written, expect) == []


def forge(edit) -> list[str]:
    """Start from a genuine failing report, apply `edit` to the record, report it as the job would."""
    _, record, expect = genuine(measured_bpb=1.3)
    edit(record)
    return accept_report(json.dumps(record), record, expect)


def _flip_to_verified(r):
    r["status"] = "verified"


def _drop_differences(r):
    r["status"], r["differences"] = "verified", []
    for c in r["checks"]:
        c["ok"] = True


def _claim_the_recorded_number(r):  # the expected value changed to what was measured
    r["status"], r["differences"] = "verified", []
    for c in r["checks"]:
        if c["name"].startswith("re-score val_bpb"):
            c["expected"], c["ok"] = c["actual"], True


def _loosen_the_tolerance(r):
    r["tol_bpb"] = 1.0


def _drop_the_rescore(r):
    r["checks"] = [c for c in r["checks"] if not c["name"].startswith("re-score")]
    r["status"], r["differences"] = "verified", []


def _other_result(r):
    r["result_sha256"] = "0" * 64


def _forged_receipt(r):
    r["checks"][0]["actual"] = "cd" * 32


def _extra_field(r):
    r["signed_by"] = "the job"


@pytest.mark.parametrize(
    ("edit", "problem"),
    [
        (_flip_to_verified, "does not follow from its checks"),
        (_drop_differences, "do not follow from the re-score's numbers: re-score val_bpb"),
        (_claim_the_recorded_number, "do not follow from the re-score's numbers: re-score val_bpb"),
        (_loosen_the_tolerance, "tol_bpb 1.0, expected 1e-06"),
        (_drop_the_rescore, "are not the set the harness makes"),
        (_other_result, "result_sha256"),
        (_forged_receipt, "receipt checks disagree with the ones recomputed here: artifact sha256"),
        (_extra_field, "['signed_by'] added or missing"),
    ],
)
def test_a_forged_report_is_refused_and_says_why(edit, problem):
    problems = forge(edit)
    assert problems and any(problem in p for p in problems), problems


def test_report_and_written_record_must_agree_and_be_json_text():
    text, written, expect = genuine()
    assert accept_report(json.loads(text), written, expect) == [
        "the job returned dict, not the record's JSON text"
    ]
    assert accept_report("{not json", written, expect)[0].startswith("the job's record is not JSON")
    assert accept_report(text, None, expect) == ["the job's record and the verification.json it wrote differ"]
    other = dict(written, verify_wall_s=99.0)
    assert accept_report(text, other, expect) == [
        "the job's record and the verification.json it wrote differ"
    ]


def test_a_reported_rescore_failure_cannot_pass():
    cfg = VerifyConfig()
    _, record, expect = genuine()
    failed = [asdict(c) for c in score_checks(RESULT, None, "scorer crashed", cfg)]
    failed[0]["ok"] = True
    record["checks"] = record["checks"][: len(RECEIPT)] + failed
    record["differences"] = []
    assert "a failed re-score reported as passed" in accept_report(json.dumps(record), record, expect)


@pytest.mark.parametrize("status", ["over_budget", "error", "over_cap", "illegal"])
def test_a_report_on_a_result_without_a_score_is_accepted_not_a_crash(status):
    """An over_budget (or any unscored) result has no phases.score: its one re-score check is "result has a
    score" (failed), and the submitting side accepts that report without recomputing a re-score it never had
    (it raised KeyError: 'score' and stopped the batch)."""
    from harness.records.executors import expected_for

    cfg = VerifyConfig()
    result = {"format": "pg-result", "status": status, "track": "smoke", "phases": {"train": {}}}
    checks = [*RECEIPT, Check("result has a score", False, "a scored result", f"status {status!r}")]
    record = verification_record(result, Path("/runs/r1"), None, None, cfg, checks, wall_s=1.0)
    text = json.dumps(record, sort_keys=True)
    expect = expected_for(result, Path("/runs/r1"), None, None, cfg)
    expect = Expected(**{**expect.__dict__, "receipt": json.loads(json.dumps([asdict(c) for c in RECEIPT]))})
    assert accept_report(text, json.loads(text), expect) == []
    forged = json.loads(text)
    forged["checks"][-1]["ok"] = True
    forged["status"], forged["differences"] = "verified", []
    assert "a failed re-score reported as passed" in accept_report(json.dumps(forged), forged, expect)


def test_local_gpu_jobs_never_share_a_gpu(monkeypatch, tmp_path):
    """submitit's LocalExecutor gives every job CUDA_VISIBLE_DEVICES=0..n-1 of its gpus_per_node: on an 8-GPU node,
    the local jobs (as many at once as CPUs allow) each re-scored with 8 workers on the same 8 GPUs, their eval
    clocks sharing them (over_eval_budget verdicts that say nothing of the entry). Each local GPU job now gets GPUs
    of its own (`visible_gpus`), and waits for them while other jobs hold them."""
    import harness.records.executors as ex

    results = {f"r{i}": copy.deepcopy(RESULT) for i in range(3)}
    for r in results.values():
        r["phases"]["score"] = {**SCORE, "device": "cuda", "scoring_workers": 4}
    monkeypatch.setattr(ex, "read_result", lambda p: (tmp_path / p / "result.json", tmp_path / p, results[p]))
    monkeypatch.setattr(ex, "resolve_inputs", lambda *a: (None, None))
    monkeypatch.setattr(ex, "local_gpus", lambda: list(range(8)))
    monkeypatch.setattr(ex.os, "cpu_count", lambda: 64)
    running: dict[str, tuple[int, ...]] = {}
    events: list[tuple[str, tuple[int, ...]]] = []

    class Job:
        def __init__(self, name, gpus):
            self.job_id, self.gpus, self.polls = name, gpus, 0

    class Executor:
        params: dict = {}

        def update_parameters(self, **kw):
            self.params = kw

        def submit(self, fn, task_json):
            gpus = tuple(self.params.get("visible_gpus", range(self.params["gpus_per_node"])))
            for other in running.values():
                assert not set(other) & set(gpus), f"GPUs {gpus} shared with a running job's {other}"
            name = json.loads(task_json)["run_dir"]
            running[name] = gpus
            events.append((name, gpus))
            return Job(name, gpus)

    def ended(item, ecfg):
        item.job.polls += 1
        if item.job.polls < 2:
            return False
        running.pop(item.job.job_id, None)
        return True

    monkeypatch.setattr(ex, "make_executor", lambda ecfg, folder: Executor())
    monkeypatch.setattr(ex, "ended", ended)
    monkeypatch.setattr(ex, "job_state", lambda job: "RUNNING")
    monkeypatch.setattr(
        ex,
        "finish",
        lambda item, *a: {
            "executor": {"job_id": item.job.job_id, "state": "DONE"},
            "status": "verified",
            "differences": [],
        },
    )
    got = ex.run_verifications(
        list(results),
        submission=None,
        data=None,
        vcfg=VerifyConfig(),
        ecfg=ExecutorConfig(kind="local", poll_s=0.001, folder=tmp_path / "jobs"),
        ledger=None,
    )
    assert [r["status"] for r in got] == ["verified"] * 3
    assert [len(g) for _, g in events] == [4, 4, 4] and events[0][1] != events[1][1]
