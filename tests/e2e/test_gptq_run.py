"""GPTQ as a pack step, end to end (harness/train/gptq.py): the naive baseline's tiny run with
`pack.gptq_batches` set trains, runs GPTQ in rank 0 on the clock, packs with int6_zlib9 and scores.

What it shows: the step ran where the contract says (the rank's record names the matrices and the
tokens it read), the submission saw the reserve come off its budget, and the artifact holds GPTQ's
integers exactly (the unpacked artifact equals the handed-over state, matrix for matrix).
Marked `long` (python -m pytest -m long), like the era baselines' tiny runs.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file

from scoring.artifact.codecs import get_codec
from scoring.artifact.format import read_artifact
from tests.conftest import REPO

GPTQ = [
    "--set", 'pack.codec="int6_zlib9"', "--set", "pack.gptq_batches=2", "--set", "pack.gptq_batch_tokens=512",
    "--set", "pack.gptq_seq_len=64", "--set", "pack.gptq_reserve_s=60", "--set", "pack.gptq_block_size=16",
]  # fmt: skip


@pytest.mark.long  # 39 s: the default suite keeps under 10 minutes; tests/unit/harness/test_gptq.py covers the step
@pytest.mark.slow
def test_gptq_runs_on_the_clock_and_its_integers_reach_the_artifact(tmp_path, sp_dataset):
    r = subprocess.run(
        [sys.executable, "-m", "harness.cli", "run", str(REPO / "baselines" / "naive_baseline"), "--preset", "tiny",
         "--data", str(sp_dataset), "--out", str(tmp_path), "--set", "budget.train_s=300",
         "--set", "train.iterations=4", "--set", "launch.threads=1", "--set", "budget.warmup_max_s=0", *GPTQ],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert r.returncode == 0, f"{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    result = json.loads((tmp_path / "result.json").read_text())
    assert result["status"] == "ok" and result["steps"] == 4 and 0 < result["val_bpb"] < 20, result
    rank = json.loads((tmp_path / "train.json").read_text())
    gptq = rank["gptq"]
    assert gptq["batches"] == 2 and gptq["tokens_read"] == 1024 and gptq["rows_rerounded_by_codec"] == 0
    # c_q, attn.proj, mlp.fc, mlp.proj of both blocks (CastedLinear, >= 4,096 elements; c_k and c_v are
    # 32 x 64, fp16 by the codec); the tied embedding is read by no nn.Linear: the codec rounds it
    assert len(gptq["matrices"]) == 2 * 4 and gptq["left_to_codec"] == ["tok_emb.weight"], gptq
    log = (tmp_path / "train.log").read_text()
    assert "gptq: 8 matrices from 2 training batches (1,024 tokens)" in log
    assert gptq["submission_budget_s"] == 240.0  # ctx.clock.budget_s: 300 s less the 60 s reserve
    state = load_file(str(tmp_path / "state.safetensors"))
    art = read_artifact(tmp_path / "artifact.pgolf")
    assert art.header["codec"]["name"] == "int6_zlib9"
    unpacked = get_codec("int6_zlib9").decode(art.payload)
    for name in gptq["matrices"]:
        assert torch.equal(unpacked[name], state[name]), name
