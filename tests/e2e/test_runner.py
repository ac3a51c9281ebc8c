"""The train phase end to end on CPU: torchrun ranks under the harness's clock, sandbox and supervisor.

Fixture submissions (tests/fixtures/submissions/) on a tiny byte260 dataset:
- a 2-rank gloo run reproduces the 1-rank loss curve with the same global batch, step for step
  (and the 1-rank run uses an off-clock warm-up, which must not change the curve either);
- two "nodes" on this machine, joined through torchrun's c10d rendezvous, reproduce it too;
- a submission that ignores the stop reading and SIGTERM is killed at budget + grace, over_budget,
  its detached grandchild included; one that trains past the stop reading but returns within the
  grace period is over_budget too;
- a submission that SIGKILLs one of its ranks is an error naming that rank, with nothing left behind.
"""

from __future__ import annotations

import hashlib
import json
import socket
import threading
from pathlib import Path
from typing import Any

import pytest

from harness.config import load_config
from harness.run.launch import POLL_S
from harness.run.train_phase import run_train_phase
from isolation.landlock import landlock_abi
from isolation.processes import processes_with_token

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "submissions"
LOSS_RTOL = 1e-5


def train_phase(fixture: str, data: Path, tmp: Path, *overrides: str) -> tuple[dict[str, Any], Path]:
    sub = FIXTURES / fixture
    cfg = load_config(sub, None, list(overrides))
    run_dir, stage = tmp / "run", tmp / "stage"
    run_dir.mkdir(parents=True)
    stage.mkdir()
    rec = run_train_phase(
        submission_dir=sub,
        data_root=data,
        run_dir=run_dir,
        stage_root=stage,
        model_config=cfg.model,
        hparams=cfg.train,
        seed=cfg.tables["run"]["seed"],
        budget=cfg.section("budget"),
        launch=cfg.section("launch"),
        device="cpu",
    )
    return rec, run_dir


def losses(run_dir: Path) -> list[float]:
    return [json.loads(line)["train_loss"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def assert_same_curve(a: list[float], b: list[float]) -> None:
    assert len(a) == len(b) == 12
    worst = max(abs(x - y) / abs(y) for x, y in zip(a, b, strict=True))
    assert worst <= LOSS_RTOL, f"loss curves differ by up to {worst:.2e} (relative): {a} vs {b}"


@pytest.fixture(scope="module")
def one_rank(tiny_dataset, tmp_path_factory):
    return train_phase("tiny_lm", tiny_dataset, tmp_path_factory.mktemp("one"), "train.warmup_steps=3")


def test_one_rank_run_records_the_phase(one_rank):
    rec, run_dir = one_rank
    assert rec["status"] == "ok", rec
    assert rec["steps"] == 12 and rec["tokens_seen"] == 12 * 2 * 256 and rec["world_size"] == 1
    assert rec["rank_reported_warmup"]["verified"] and rec["off_clock_s"] > 0
    assert rec["off_clock_accepted_s"] == rec["off_clock_s"]
    assert (
        rec["ticks_after_stop"] == 0
        and rec["batches_after_stop"] == 0
        and rec["leftover_processes_killed"] == 0
    )
    assert (
        rec["startup_s"] > 0
        and (run_dir / "state.safetensors").is_file()
        and (run_dir / "train.json").is_file()
    )
    # the supervisor's clock: its train_time_s ends at the state's handover; the rank's own readings
    # (same origin, same credit up to a message's latency) are kept, clearly named, and never larger
    clock = rec["clock"]
    assert clock["measured_by"] == "supervisor" and clock["ended_by"] == "state_handover"
    assert clock["state_sha256"] == hashlib.sha256((run_dir / "state.safetensors").read_bytes()).hexdigest()
    assert rec["rank_reported_train_s"] <= rec["train_time_s"] < rec["rank_reported_train_s"] + 1.0
    assert abs(rec["rank_reported_off_clock_s"] - rec["off_clock_s"]) < 0.05
    assert (
        rec["train_shards_used"] == len(rec["train_shard_names"]) >= 1 and rec["train_tokens_available"] > 0
    )


def test_two_gloo_ranks_give_the_one_rank_loss_curve(one_rank, tiny_dataset, tmp_path):
    rec, run_dir = train_phase("tiny_lm", tiny_dataset, tmp_path, "launch.nproc_per_node=2")
    assert rec["status"] == "ok", rec
    assert (
        rec["world_size"] == 2
        and rec["backend"] == "gloo"
        and rec["tokens_seen"] == one_rank[0]["tokens_seen"]
    )
    assert_same_curve(losses(run_dir), losses(one_rank[1]))


def two_nodes(
    datasets: list[Path], tmp_path: Path, fixture: str = "tiny_lm", *overrides: str
) -> list[tuple[dict[str, Any], Path]]:
    """Two `pgolf run` train phases of `fixture` on this machine, one per node, meeting through a c10d
    rendezvous on loopback; node i stages datasets[i]. Their (record, run folder) in node order."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    results: dict[int, tuple[dict[str, Any], Path]] = {}

    def node(i: int) -> None:
        results[i] = train_phase(
            fixture,
            datasets[i],
            tmp_path / f"node{i}",
            "launch.nnodes=2",
            f"launch.rdzv_endpoint='127.0.0.1:{port}'",
            f"launch.rdzv_id='test{port}'",
            *overrides,
        )

    threads = [threading.Thread(target=node, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    return [results[i] for i in range(2)]


@pytest.mark.long
def test_two_nodes_through_the_rendezvous_give_the_same_curve(one_rank, tiny_dataset, tmp_path):
    results = two_nodes([tiny_dataset, tiny_dataset], tmp_path)
    recs = [r for r, _ in results]
    assert all(r["status"] == "ok" for r in recs), recs
    assert sorted(r["role"] for r in recs) == ["main", "secondary_node"] and all(
        r["world_size"] == 2 for r in recs
    )
    assert all(
        r["isolation"]["landlock"] == (landlock_abi() > 0) and not r["isolation"]["namespaces"] for r in recs
    )
    main_dir = next(d for r, d in results if r["role"] == "main")
    assert_same_curve(losses(main_dir), losses(one_rank[1]))


def test_two_nodes_with_different_data_both_stop_before_training(tiny_dataset, tmp_path):
    """Each node's supervisor stages its own dataset: a node holding other documents is found by the ranks'
    comparison of their data identities before the clock starts, and both nodes end in error, naming it."""
    from data.build import build_dataset
    from data.embedded import embedded_documents

    other = build_dataset(
        [d[:4000] for d in embedded_documents()[40:80]], tmp_path / "other_ds", val_docs=4,
        tokenizer="byte260", shard_tokens=50_000,
    )  # fmt: skip
    recs = [r for r, _ in two_nodes([tiny_dataset, other], tmp_path)]
    assert all(r["status"] == "error" and not r.get("steps") for r in recs), recs
    errors = [e for r in recs for e in (r.get("errors") or {}).values()]
    assert errors and all("the nodes' training data differ: rank 1 on " in e for e in errors), recs


def test_ignoring_the_stop_is_killed_at_budget_plus_grace(tiny_dataset, tmp_path):
    rec, run_dir = train_phase("ignore_stop", tiny_dataset, tmp_path)
    deadline = 2.0 + 2.0  # the fixture's budget.train_s + budget.grace_s
    assert rec["status"] == "over_budget" and "grace_s" in rec["detail"]
    assert deadline <= rec["clock_to_exit_s"] <= deadline + 2 * POLL_S + 1.0, rec["clock_to_exit_s"]
    assert not (run_dir / "state.safetensors").exists()
    assert (
        processes_with_token(rec["process_token"]) == []
    )  # the SIGTERM-proof rank and its detached grandchild


def test_training_past_the_stop_reading_is_over_budget_even_within_grace(tiny_dataset, tmp_path):
    rec, _ = train_phase(
        "tiny_lm",
        tiny_dataset,
        tmp_path,
        "budget.train_s=0.3",
        "train.steps=100000",
        "train.steps_after_stop=2",
    )
    assert rec["status"] == "over_budget" and "after the clock said stop" in rec["detail"], rec
    assert rec["batches_after_stop"] == 2 * 2 and rec["ticks_after_stop"] == 2  # 2 micro-batches per step


def test_a_rank_that_kills_itself_fails_the_run_and_leaves_nothing(tiny_dataset, tmp_path):
    rec, _ = train_phase(
        "kill_rank", tiny_dataset, tmp_path, "launch.sandbox='off'"
    )  # no PID namespace: the token finds leftovers
    assert rec["status"] == "error" and "rank 1 killed by SIGKILL" in rec["detail"], rec
    assert any(f["rank"] == 1 and f["signal"] == "SIGKILL" for f in rec["rank_failures"])
    assert rec["isolation"]["mode"] == "off" and rec["isolation"]["warnings"]
    assert processes_with_token(rec["process_token"]) == []
