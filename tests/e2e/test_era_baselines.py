"""The era baselines (baselines/int6_era, baselines/sp8192_era): their tiny preset end to end, and the sp8192 codec.

A step count ends the tiny runs (as tests/e2e/test_cpu_baselines.py does: a loaded machine must not
turn a test into over_budget). Each run trains, packs, scores `ok` with its score-first TTT hook
called on every chunk, and shows what the era is about:
- int6_era: packed with int6_lzma9 (every block matrix int6, embeddings int8), EMA and late QAT logged;
- sp8192_era: the recurrence switched on, GPTQ run inside the budget, the folder's codec.py keeping
  the GPTQ'd weights bit for bit (the trained state equals the unpacked artifact exactly).
The codec tests are fast: a row already on a float16-scaled integer grid comes back exactly, any
other row within half a step of its SDClip grid.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from safetensors.torch import load_file

from scoring.artifact.format import read_artifact
from tests.conftest import REPO

# one torch thread: on a loaded 2-core machine two threads wait on each other at every op
STEPS = ["--set", "budget.train_s=300", "--set", "train.iterations=6", "--set", "train.train_log_every=3"]
STEPS += ["--set", "launch.threads=1"]


def run(folder: str, out: Path, data: Path, *extra: str) -> dict:
    r = subprocess.run(
        [sys.executable, "-m", "harness.cli", "run", str(REPO / "baselines" / folder), "--preset", "tiny",
         "--data", str(data), "--out", str(out), *STEPS, *extra],
        capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert r.returncode == 0, f"{folder} failed:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    result = json.loads((out / "result.json").read_text())
    assert result["status"] == "ok" and result["steps"] == 6 and 0 < result["val_bpb"] < 20, result
    return result


def assert_ttt_ran(out: Path) -> None:
    """eval.py was called score-first on every chunk (2,048 scored tokens in chunks of 1,024: the tiny preset)."""
    a = json.loads((out / "score.json").read_text())["adaptation"]
    assert a["hook"] == "eval.py" and a["protocol"] == "score-first", a
    assert a["chunks"] == 2 and a["tokens_delivered"] >= 2000 and a["adapt_time_s"] > 0, a


@pytest.mark.long
@pytest.mark.slow
def test_int6_era_tiny_trains_packs_int6_and_scores_with_ttt(tmp_path, sp_dataset):
    run("int6_era", tmp_path, sp_dataset, "--set", "train.warmdown_iters=0")
    log = (tmp_path / "train.log").read_text()
    assert "ema: packed the EMA" in log
    header = read_artifact(tmp_path / "artifact.pgolf").header
    assert header["codec"]["name"] == "int6_lzma9"
    assert_ttt_ran(tmp_path)


@pytest.mark.long
@pytest.mark.slow
def test_sp8192_era_tiny_loops_runs_gptq_and_packs_it_exactly(tmp_path, sp_dataset):
    run("sp8192_era", tmp_path, sp_dataset, "--set", "train.enable_looping_at=0.0")
    log = (tmp_path / "train.log").read_text()
    assert "layer_loop: on at step 0" in log and "gptq: " in log
    assert read_artifact(tmp_path / "artifact.pgolf").header["codec"]["name"] == "sp8192_gptq_brotli11"
    state = load_file(tmp_path / "state.safetensors")
    codec = load_codec()
    back = codec.decode(codec.encode(state))
    gptqd = [n for n in state if codec.quantized(state[n])]
    assert gptqd and all(torch.equal(back[n], state[n]) for n in gptqd)  # GPTQ's q * s kept bit for bit
    assert_ttt_ran(tmp_path)


def load_codec():
    path = REPO / "baselines" / "sp8192_era" / "codec.py"
    spec = importlib.util.spec_from_file_location("sp8192_era_codec", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@settings(max_examples=10, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), qmax=st.sampled_from([31, 127]), scale_exp=st.integers(-16, 0),
       rows=st.integers(1, 40), cols=st.integers(65, 200))  # fmt: skip
def test_sp8192_codec_keeps_rows_on_a_grid_exactly(seed, qmax, scale_exp, rows, cols):
    codec = load_codec()
    g = torch.Generator().manual_seed(seed)
    q = torch.randint(
        -qmax // 3, qmax // 3 + 1, (rows, cols), generator=g
    )  # a wide SDClip grid: |q| well below qmax
    q[0] = 0  # an all-zero row
    s = ((torch.rand(rows, generator=g) + 0.5) * 2.0**scale_exp).to(torch.float16)
    w = q.float() * s.float()[:, None]
    name = "tok_emb.weight" if qmax == 127 else "blocks.0.mlp.fc.weight"
    state = {name: w, "blocks.0.attn_scale": torch.randn(cols, generator=g), "step": torch.tensor([3, 4])}
    back = codec.decode(codec.encode(state))
    assert list(back) == list(state)
    assert (
        torch.equal(back[name], w)
        if w.numel() > codec.SMALL_NUMEL
        else torch.equal(back[name], w.half().float())
    )
    assert torch.equal(back["blocks.0.attn_scale"], state["blocks.0.attn_scale"].half().float())
    assert torch.equal(back["step"], state["step"])


def test_sp8192_codec_rounds_other_rows_on_their_sdclip_grid():
    codec = load_codec()
    w = torch.randn(64, 128, generator=torch.Generator().manual_seed(0)) * 0.02
    back = codec.decode(codec.encode({"blocks.0.mlp.proj.weight": w}))["blocks.0.mlp.proj.weight"]
    step = torch.from_numpy(codec.sdclip_scale(w.numpy(), *codec.MATRIX)).float()  # 12.85 std / 31
    assert torch.all((back - w).abs() <= step[:, None] / 2 + 1e-9)
    assert not torch.equal(back, w)


def test_sp8192_codec_refuses_a_foreign_payload():
    import brotli

    codec = load_codec()
    from safetensors.torch import save

    with pytest.raises(ValueError, match="pg-sp8192-gptq"):
        layout = torch.tensor(list(b'{"format":"other","version":1}'), dtype=torch.uint8)
        codec.decode(brotli.compress(codec.shuffle2(save({"layout": layout}))))
