"""End to end on CPU: the CPU-track baselines (baselines/cpu_mtp, baselines/cpu_moe) with their tiny preset.

A step count ends these runs (as tests/e2e/test_pipeline.py does: a loaded machine must not turn a
test into over_budget). Each run trains, packs, scores `ok`, and shows what the baseline is about:
- cpu_mtp: the multi-token heads are trained (their loss and the per-step overhead are logged) and
  left out of the artifact by default; with model.keep_mtp_heads they are packed.
- cpu_moe: every expert's weights are their own 2-D tensors in the artifact (each gets its own int8
  scales), the router's load-balancing loss and the share of tokens per expert are logged.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from scoring.artifact.format import read_artifact
from tests.conftest import REPO

# no warmdown: the wall-clock LR schedule would make two runs of one seed differ on a loaded machine
STEPS = ["--set", "budget.train_s=300", "--set", "train.iterations=6", "--set", "train.warmdown_iters=0"]
STEPS += ["--set", "train.train_log_every=3"]


def run(folder: str, out: Path, data: Path, *extra: str) -> dict:
    r = subprocess.run(
        [sys.executable, "-m", "harness.cli", "run", str(REPO / "baselines" / folder), "--preset", "tiny",
         "--data", str(data), "--out", str(out), *STEPS, *extra],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert r.returncode == 0, f"{folder} failed:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    result = json.loads((out / "result.json").read_text())
    assert result["status"] == "ok" and result["steps"] == 6 and 0 < result["val_bpb"] < 20
    return result


def metrics(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]


@pytest.mark.long
def test_cpu_mtp_trains_heads_and_packs_them_only_when_kept(tmp_path, sp_dataset):
    dropped = run("cpu_mtp", tmp_path / "dropped", sp_dataset)
    names = set(read_artifact(tmp_path / "dropped" / "artifact.pgolf").header["tensors"])
    assert names and not any(n.startswith("mtp_heads.") for n in names)
    last = metrics(tmp_path / "dropped")[-1]
    assert last["mtp_loss"] > 0 and 0 < last["mtp_fwd_ms"] < last["step_ms"]
    log = (tmp_path / "dropped" / "train.log").read_text()
    assert "mtp_heads:2 mtp_params:16384 kept_in_artifact:False" in log  # 2 heads x (fc, proj) of 64 x 64

    kept = run("cpu_mtp", tmp_path / "kept", sp_dataset, "--set", "model.keep_mtp_heads=True")
    kept_names = set(read_artifact(tmp_path / "kept" / "artifact.pgolf").header["tensors"])
    assert kept_names - names == {f"mtp_heads.{i}.{m}.weight" for i in (0, 1) for m in ("fc", "proj")}
    assert kept["bytes_model"] > dropped["bytes_model"]
    # the same training, and the heads are not scored: the same bits per byte
    assert kept["val_bpb"] == dropped["val_bpb"]


@pytest.mark.long
def test_cpu_moe_logs_expert_shares_and_packs_each_expert_apart(tmp_path, sp_dataset):
    run("cpu_moe", tmp_path / "moe", sp_dataset)
    header = read_artifact(tmp_path / "moe" / "artifact.pgolf").header["tensors"]
    experts = {n: t["shape"] for n, t in header.items() if ".mlp.experts." in n}
    assert len(experts) == 2 * 4 * 2  # 2 blocks x 4 experts x (fc, proj)
    assert all(len(shape) == 2 for shape in experts.values())
    last = metrics(tmp_path / "moe")[-1]
    # E x sum_e f_e P_e: 1 when balanced, up to E when collapsed onto one expert
    assert 0 < last["balance_loss"] < 4
    for block in (0, 1):
        assert 0.25 <= last[f"share_max_L{block}"] <= 0.5  # top-2 of 4: a share is at most 1/2
    assert "share L0:" in (tmp_path / "moe" / "train.log").read_text()
