"""`pgolf verify-legacy`: a reference-format record (one training script + its int8/zlib artifact) is
scored by the trusted scorer while the record's code runs only in a confined model worker (never the
script's top level or training), its artifact is loaded without arbitrary unpickling, and its bytes
are counted as the reference counts them.

The record is tests/fixtures/legacy/tiny_record; the artifact is made here with the script's own
export function (random weights)."""

from __future__ import annotations

import io
import os
import pickle
import subprocess
import sys
import zlib

import numpy as np
import pytest
import torch

from data.shards import read_split
from scoring.artifact.codecs.int8_zlib import Int8Zlib
from scoring.score.evaluate import EvalConfig
from scoring.score.legacy import score_legacy
from scoring.worker.legacy import LegacyError, exec_definitions, load_legacy_artifact
from scoring.worker.legacy_script import gpt_call, read_hyperparameters, script_source
from tests.conftest import REPO
from tests.unit.scoring.test_eval_support import _one_thread  # noqa: F401 (fixture)

RECORD = REPO / "tests" / "fixtures" / "legacy" / "tiny_record"
SCRIPT = RECORD / "train_gpt.py"
CFG = EvalConfig(seq_len=32, batch_seqs=8, max_tokens=1024)


@pytest.fixture()
def sentinel(tmp_path, monkeypatch):
    path = tmp_path / "sentinel"
    monkeypatch.setenv("PG_LEGACY_SENTINEL", str(path))
    return path


def static_kwargs(script=SCRIPT, overrides=None):
    import ast

    return gpt_call(
        ast.parse(script_source(script)[0]), script, read_hyperparameters(script, overrides or {})
    )[0]


def make_artifact(path, overrides=None, seed=0):
    ns, _ = exec_definitions(SCRIPT)  # the record's code, in the test process (never in the scorer)
    kwargs = static_kwargs(SCRIPT, overrides)
    torch.manual_seed(seed)
    gpt = ns["GPT"](**kwargs)
    path.write_bytes(ns["export_int8"](gpt.state_dict()))  # the record's own export
    return gpt.state_dict(), ns


@pytest.mark.long
def test_a_record_is_scored_without_running_its_script(tmp_path, tiny_dataset, sentinel):
    state, ns = make_artifact(tmp_path / "final_model.int8.ptz")
    rec = score_legacy(RECORD, tmp_path / "final_model.int8.ptz", tiny_dataset, cfg=CFG)
    assert not sentinel.exists(), "the script's top level ran"
    assert rec["worker"]["role"] == "main" and rec["worker"]["reported"]["NoNewPrivs"] == "1"
    _, skipped_list = exec_definitions(SCRIPT)  # what the worker executes, seen here in a test
    skipped = "\n".join(skipped_list)
    assert "PG_LEGACY_SENTINEL" in skipped and "PG_LEGACY_COMPILE" in skipped and "__name__" in skipped
    assert "CONTROL_TENSOR_NAME_PATTERNS" in skipped and "flash_attn_interface" in skipped
    assert (
        ns["flash_attn_func"] is None and "SignSGD" in ns
    )  # the except branch ran; decorated methods are kept
    assert rec["bytes_code"] == SCRIPT.stat().st_size and rec["code_files"] == {
        "train_gpt.py": rec["bytes_code"]
    }
    assert rec["bytes_model"] == (tmp_path / "final_model.int8.ptz").stat().st_size
    assert rec["bytes_total"] == rec["bytes_code"] + rec["bytes_model"] and rec["within_cap"]
    assert rec["probes"]["passed"] and rec["artifact_compressor"] == "zlib"
    assert rec["gpt_kwargs"]["model_dim"] == 136 and rec["gpt_kwargs"]["tie_embeddings"] is True
    assert set(rec["claimed_minus_scored"]) == {"val_loss", "val_bpb", "bytes_total"}
    # The record's own loss (its forward returns the mean cross-entropy), window by window, agrees.
    gpt = ns["GPT"](**rec["gpt_kwargs"])
    gpt.load_state_dict(load_legacy_artifact(tmp_path / "final_model.int8.ptz"))
    toks = torch.from_numpy(read_split(tiny_dataset, "val")[: 1024 + 1].astype(np.int64))
    with torch.no_grad():
        own = float(gpt(toks[:-1].reshape(-1, 32), toks[1:].reshape(-1, 32)))
    assert rec["val_loss"] == pytest.approx(own, abs=1e-5)


def test_the_loader_dequantizes_as_the_reference_layout_says(tmp_path):
    state, _ = make_artifact(tmp_path / "a.ptz")
    loaded = load_legacy_artifact(tmp_path / "a.ptz")
    ours = Int8Zlib().decode(Int8Zlib().encode(state))  # the harness's canonical codec: the same numerics
    assert loaded.keys() == state.keys() == ours.keys()
    quantized = [k for k in state if state[k].numel() > 65_536]
    assert quantized, "the fixture must exercise per-row int8"
    for k in state:
        assert torch.equal(loaded[k], ours[k]), k
        assert loaded[k].dtype == state[k].dtype and loaded[k].shape == state[k].shape


class Evil:
    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (os.system, (f"touch {self.path}",))


def test_an_artifact_that_would_run_code_is_refused(tmp_path):
    buf = io.BytesIO()
    torch.save(
        {
            "__quant_format__": "int8_clean_per_row_v1",
            "quantized": {},
            "scales": {},
            "dtypes": {},
            "passthrough": {"x": torch.zeros(2)},
            "payload": Evil(tmp_path / "pwned"),
        },
        buf,
    )
    (tmp_path / "evil.ptz").write_bytes(zlib.compress(buf.getvalue()))
    with pytest.raises(LegacyError, match="refused by the restricted unpickler"):
        load_legacy_artifact(tmp_path / "evil.ptz")
    assert not (tmp_path / "pwned").exists()


@pytest.mark.filterwarnings("ignore:Detected pickle protocol")
def test_malformed_artifacts_are_named(tmp_path):
    (tmp_path / "raw.ptz").write_bytes(b"not compressed")
    with pytest.raises(LegacyError, match="not a zlib, zstd, lzma or brotli stream"):
        load_legacy_artifact(tmp_path / "raw.ptz")
    buf = io.BytesIO()
    torch.save({"__quant_format__": "int6_v9", "quantized": {}}, buf)
    (tmp_path / "fmt.ptz").write_bytes(zlib.compress(buf.getvalue()))
    with pytest.raises(LegacyError, match="quant format 'int6_v9'"):
        load_legacy_artifact(tmp_path / "fmt.ptz")
    (tmp_path / "plain.ptz").write_bytes(zlib.compress(pickle.dumps([1, 2, 3])))
    with pytest.raises(LegacyError):
        load_legacy_artifact(tmp_path / "plain.ptz")


@pytest.mark.long  # a whole scored run: minutes of the default suite's 10 on 2 cores
def test_settings_the_run_made_by_env_var_come_in_with_hparam(tmp_path, tiny_dataset, sentinel):
    make_artifact(tmp_path / "a.ptz", overrides={"NUM_LAYERS": "3"})
    with pytest.raises(LegacyError, match="--hparam"):
        score_legacy(RECORD, tmp_path / "a.ptz", tiny_dataset, cfg=CFG)
    for key in ("NUM_LAYERS", "num_layers"):  # the env var's name or the field's
        rec = score_legacy(RECORD, tmp_path / "a.ptz", tiny_dataset, cfg=CFG, hparams={key: "3"})
        assert rec["gpt_kwargs"]["num_layers"] == 3 and rec["hyperparameters"]["num_layers"] == 3


@pytest.mark.long  # a second whole legacy score; the first: test_a_record_is_scored_without_running_its_script
def test_cli(tmp_path, tiny_dataset, sentinel):
    make_artifact(tmp_path / "final_model.int8.ptz")
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "harness.cli",
            "verify-legacy",
            str(RECORD),
            "--artifact",
            str(tmp_path / "final_model.int8.ptz"),
            "--data",
            str(tiny_dataset),
            "--max-tokens",
            "512",
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=300,
        check=False,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert r.returncode == 0, r.stderr
    assert "val_bpb" in r.stdout and "claimed val_bpb 7.2 vs scored" in r.stdout and "bytes_total" in r.stdout
    assert "seq_len 32" in r.stdout  # the script's own TRAIN_SEQ_LEN
    assert not sentinel.exists()


@pytest.mark.long  # a whole scored run (~12 s)
def test_the_code_a_stub_execs_from_a_sibling_counts_against_the_cap(tmp_path, tiny_dataset, sentinel):
    """A record's script may be `exec(open(__file__.replace(...)).read())` of a file beside it: the model that
    is scored is that file's. Before the fix only the 75-byte stub was counted, so a record could carry its
    code (or weights written as Python literals) in the sibling past the cap, and verify-legacy said
    within_cap. The bytes are every file the scored code came from, as shipped."""
    make_artifact(tmp_path / "a.ptz")
    rec_dir = tmp_path / "rec"
    rec_dir.mkdir()
    sibling = rec_dir / "model_def.py"
    sibling.write_bytes(SCRIPT.read_bytes() + b"\nWEIGHTS = '" + b"7" * 200_000 + b"'\n")
    stub = b'exec(open(__file__.replace("train_gpt.py", "model_def.py")).read())\n'
    (rec_dir / "train_gpt.py").write_bytes(stub)
    cap = len(stub) + 100_000 + (tmp_path / "a.ptz").stat().st_size
    rec = score_legacy(rec_dir, tmp_path / "a.ptz", tiny_dataset, cfg=CFG, cap_bytes=cap)
    assert rec["script_packaging"] == ["exec of model_def.py"]
    assert rec["bytes_code"] == len(stub) + sibling.stat().st_size
    assert rec["bytes_total"] == rec["bytes_code"] + rec["bytes_model"]
    assert not rec["within_cap"]
