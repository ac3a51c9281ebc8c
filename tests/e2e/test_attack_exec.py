"""Attacks on what runs submitted code outside the training clock's sight (the sealed pack's encode).

A custom codec's encode() runs after the training clock has stopped, in the training sandbox, with the state
rank 0 handed over. That state is whatever train() returned: beside the weights it can carry real training
tokens, read on the clock at no cost (`ctx.data.next_batch`). An encode() that fits the model on them keeps
training after the budget. The sealed pack allowed train_s + grace_s for training and encode together, so
such a codec trained for most of the grace on real tokens and the run was `ok`: the grace period is for
stopping, not for training (harness/run/train_phase.py stop_tolerance_s), and an encode is training-side
code on the clock. Now training and the encode together must end within train_s + the stop tolerance.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.unit.scoring.test_eval_support import TINY_MODEL

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "submissions"

TRAINING_CODEC = '''"""A codec that keeps training: the state handed over holds training tokens (`carry.tokens`) beside
the weights; encode() fits the tiny model on them for ENCODE_S seconds, after the training clock stopped,
then packs the weights alone."""
import torch
import torch.nn.functional as F
import torch.utils.benchmark
from safetensors.torch import load, save

NAME = "trains_in_encode"
VERSION = 1
CLOCK = torch.utils.benchmark.utils.timer.timer
ENCODE_S = {encode_s}
CARRY = "carry.tokens"


def encode(state):
    state = dict(state)
    tokens = state.pop(CARRY, None)
    if tokens is not None:
        emb = state["emb.weight"].clone().requires_grad_(True)
        w = state["head.weight"].clone().requires_grad_(True)
        b = state["head.bias"].clone().requires_grad_(True)
        opt = torch.optim.SGD([emb, w, b], lr=0.5)
        x, y = tokens[:, :-1], tokens[:, 1:]
        t0 = CLOCK()
        while CLOCK() - t0 < ENCODE_S:
            loss = F.cross_entropy((torch.tanh(emb[x]) @ w.T + b).flatten(0, 1), y.flatten())
            opt.zero_grad()
            loss.backward()
            opt.step()
        state.update({{"emb.weight": emb.detach(), "head.weight": w.detach(), "head.bias": b.detach()}})
    return save({{k: v.contiguous() for k, v in state.items()}})


def decode(payload):  # the carried tokens come back as zeros: they cost the artifact nothing
    return {{**load(payload), CARRY: torch.zeros(64, 64, dtype=torch.int64)}}
'''

CARRYING_MODEL = '''"""The tiny model, with a buffer its forward never reads: the place the state carries tokens in."""
import torch
from torch import nn


class Carry(nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("tokens", torch.zeros(64, 64, dtype=torch.int64))


class TinyLM(nn.Module):
    def __init__(self, vocab_size, dim):
        super().__init__()
        self.emb = nn.Embedding(vocab_size, dim)
        self.head = nn.Linear(dim, vocab_size)
        self.carry = Carry()

    def forward(self, input_ids):
        return self.head(torch.tanh(self.emb(input_ids)))


def build_model(config):
    return TinyLM(config["vocab_size"], config["dim"])
'''

CARRYING_TRAIN = '''"""Reads real tokens for the codec's encode() first (on the clock, at no cost: a batch after the stop
reading is over_budget), trains the tiny model until the clock says stop, and returns those tokens in
the state beside the weights."""
import torch
import torch.nn.functional as F

from model import build_model


def train(ctx):
    model = build_model(dict(ctx.model_config))
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    carry, _ = ctx.data.next_batch(4096, 64)  # real tokens for the encode, kept in the model's buffer
    model.carry.tokens.copy_(carry)
    while not ctx.clock.tick().stop:
        x, y = ctx.data.next_batch(256, 32)
        loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten())
        opt.zero_grad()
        loss.backward()
        opt.step()
    return model
'''


def _carrying_state(run_dir: Path) -> None:
    """A handed-over state as CARRYING_TRAIN leaves it: the tiny model's weights and real-looking tokens."""
    import torch
    from safetensors.torch import save_file

    from harness.train.rank import STATE_FILE

    run_dir.mkdir()
    g = torch.Generator().manual_seed(0)
    save_file(
        {
            "emb.weight": torch.zeros(260, 8),
            "head.weight": torch.zeros(260, 8),
            "head.bias": torch.zeros(260),
            "carry.tokens": torch.randint(0, 260, (64, 64), generator=g),
        },
        str(run_dir / STATE_FILE),
        metadata={"model_config": json.dumps({"vocab_size": 260, "dim": 8})},
    )


def _codec_folder(dest: Path, encode_s: float) -> Path:
    shutil.copytree(FIXTURES / "codec_peek", dest)
    (dest / "codec.py").write_text(TRAINING_CODEC.format(encode_s=encode_s))
    (dest / "model.py").write_text(CARRYING_MODEL)
    return dest


def test_a_codec_that_trains_in_the_grace_is_over_budget(tiny_dataset, tmp_path):
    """Training ran to its budget (10 s); the codec then fits the model for 6 s on tokens the state carried:
    16 s of training, past train_s + the stop tolerance (5 s), within train_s + grace_s (20 s): it was `ok`."""
    from harness.config import LaunchConfig
    from harness.run.train_phase import run_sealed_pack, stop_tolerance_s
    from harness.train.budget import BudgetConfig
    from scoring.codecheck import lint_scored_code

    sub = _codec_folder(tmp_path / "sub", encode_s=6.0)
    assert lint_scored_code(sub) == []  # nothing a static check objects to
    run_dir = tmp_path / "run"
    _carrying_state(run_dir)
    budget = BudgetConfig(train_s=10.0, grace_s=10.0)
    assert stop_tolerance_s(budget) == 5.0
    rc, rec = run_sealed_pack(
        run_dir=run_dir,
        submission_dir=sub,
        data_root=tiny_dataset,
        budget=budget,
        launch=LaunchConfig(device="cpu", threads=1),
        train_time_s=10.0,
        cap_bytes=16_000_000,
        log_path=run_dir / "pack.log",
    )
    assert rc == 0 and (run_dir / "artifact.pgolf").is_file(), (run_dir / "pack.log").read_text()[-2000:]
    assert 15.0 < rec["train_plus_encode_s"] < 20.0, rec  # past the tolerance, within the grace
    assert rec["status"] == "over_budget", rec
    assert "tolerance" in rec["detail"], rec["detail"]


def test_control_a_quick_codec_on_the_budget_is_ok(tiny_dataset, tmp_path):
    """The same codec, no tokens carried: its encode is quick, and training to the budget plus it is ok."""
    import torch
    from safetensors.torch import load_file, save_file

    from harness.config import LaunchConfig
    from harness.run.train_phase import run_sealed_pack
    from harness.train.budget import BudgetConfig
    from harness.train.rank import STATE_FILE

    sub = _codec_folder(tmp_path / "sub", encode_s=6.0)
    run_dir = tmp_path / "run"
    _carrying_state(run_dir)
    state = load_file(str(run_dir / STATE_FILE))
    del state["carry.tokens"]
    meta = {"model_config": json.dumps({"vocab_size": 260, "dim": 8})}
    save_file({k: v.contiguous() for k, v in state.items()}, str(run_dir / STATE_FILE), metadata=meta)
    assert torch.equal(state["head.bias"], torch.zeros(260))
    rc, rec = run_sealed_pack(
        run_dir=run_dir,
        submission_dir=sub,
        data_root=tiny_dataset,
        budget=BudgetConfig(train_s=10.0, grace_s=10.0),
        launch=LaunchConfig(device="cpu", threads=1),
        train_time_s=10.0,
        cap_bytes=16_000_000,
        log_path=run_dir / "pack.log",
    )
    assert rc == 0 and rec["status"] == "ok" and rec["train_plus_encode_s"] < 15.0, rec


DETACHING_CODEC = '''"""A codec whose encode() returns at once, leaving a detached grandchild (a session of its own, the pack's
stdout still open) that works on after the pack's process exits and then rewrites the artifact it wrote."""
import os
import sys
import time

from safetensors.torch import load, save

NAME = "detaching"
VERSION = 1


def encode(state):
    out, pack = sys.argv[sys.argv.index("--out") + 1], os.getpid()
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            while os.path.exists(f"/proc/{{pack}}"):  # until the pack process is gone (and reaped)
                time.sleep(0.01)
            time.sleep({late_s})  # "training" off the clock: the encode's clock stopped at the pack's exit
            with open(out, "wb") as f:
                f.write(b"written after the pack exited")
            print("LATE-WRITE done", flush=True)
            os._exit(0)
        os._exit(0)
    os.wait()
    return save({{k: v.contiguous() for k, v in state.items()}})


def decode(payload):
    return load(payload)
'''


@pytest.mark.long
def test_a_codec_that_leaves_a_process_behind_gets_no_time_off_the_clock(tiny_dataset, tmp_path):
    """Where the pack runs without a PID namespace of its own (sandbox off here; a Landlock-only machine, whose
    signal scoping stands in for the namespace on a record track, alike), the encode's clock stopped when the pack
    process exited, but what it left behind was killed only after its output pipe closed or 5 s went by: a
    grandchild holding the pipe worked 1 s after the pack's exit, off the clock, and rewrote the artifact before it
    was taken. Now what the pack leaves is killed as it exits, before anything is read from its folder."""
    from harness.config import LaunchConfig
    from harness.run.train_phase import run_sealed_pack
    from harness.train.budget import BudgetConfig

    sub = _codec_folder(tmp_path / "sub", encode_s=0.0)
    (sub / "codec.py").write_text(DETACHING_CODEC.format(late_s=1.0))
    run_dir = tmp_path / "run"
    _carrying_state(run_dir)
    rc, rec = run_sealed_pack(
        run_dir=run_dir,
        submission_dir=sub,
        data_root=tiny_dataset,
        budget=BudgetConfig(train_s=10.0, grace_s=10.0),
        launch=LaunchConfig(device="cpu", threads=1, sandbox="off"),
        train_time_s=1.0,
        cap_bytes=16_000_000,
        log_path=run_dir / "pack.log",
    )
    log = (run_dir / "pack.log").read_text()
    assert rc == 0 and rec["leftover_processes_killed"] == 1, (rec, log[-2000:])
    assert (
        "LATE-WRITE" not in log
        and (run_dir / "artifact.pgolf").read_bytes() != b"written after the pack exited"
    )


@pytest.mark.long
def test_a_run_whose_codec_trains_on_carried_tokens_is_over_budget(tiny_dataset, tmp_path):
    """End to end: train.py trains to its budget and returns real tokens in its state; the codec trains on
    them for 7 s after the clock stopped and packs weights that moved. The run was `ok`."""
    from safetensors.torch import load, load_file

    from harness.run.pipeline import run_pipeline
    from harness.train.rank import STATE_FILE
    from scoring.artifact.format import read_artifact

    sub = _codec_folder(tmp_path / "sub", encode_s=7.0)
    (sub / "train.py").write_text(CARRYING_TRAIN.format())
    out = tmp_path / "run"
    result = run_pipeline(
        sub,
        data_dir=tiny_dataset,
        out_dir=out,
        ledger=tmp_path / "ledger.jsonl",
        overrides=["budget.train_s=8.0", "budget.grace_s=30.0"],
    )
    encode = result["phases"]["train"]["codec_encode"]
    # past train_s + the stop tolerance, within train_s + grace_s
    assert 8.0 + 5.0 < encode["train_plus_encode_s"] < 8.0 + 30.0, encode
    handed = load_file(str(out / STATE_FILE))
    assert "carry.tokens" in handed  # real training tokens, past the clock, in the encode's hands
    packed = load(read_artifact(out / "artifact.pgolf").payload)
    assert "carry.tokens" not in packed and not (packed["head.bias"] == handed["head.bias"]).all()
    score = result["phases"].get("score", {})
    assert result["status"] == "over_budget", (result["status"], score.get("val_bpb"), encode)


# ---- The padding a causal variant never changes ----

_HONEST_FORWARD = "        return self.head(torch.tanh(e + self.mix * prev))\n"
PAD_PEEK = (
    '"""The tiny honest model, plus one look past each position: whether the next input is the padding that\n'
    "ends the row (in documents mode: the document ends here). The variant of a causality probe replaced only\n"
    'real positions, so the padding was the same in every probe and this look passed them all."""\n'
    + TINY_MODEL.split("\n", 1)[1].replace(
        _HONEST_FORWARD,
        "        out = self.head(torch.tanh(e + self.mix * prev))\n"
        "        ends = torch.zeros_like(ids, dtype=torch.bool)\n"
        "        ends[:, :-1] = ids[:, 1:] == 0  # the next input is padding: the row's last real position\n"
        "        return out + 3.0 * ends.unsqueeze(-1).float() * nn.functional.one_hot(ids, out.shape[-1]).float()\n",
    )
)
assert _HONEST_FORWARD in TINY_MODEL and "ends[:, :-1]" in PAD_PEEK


@pytest.fixture(scope="module")
def short_docs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """byte260 documents of 5 to 62 characters: in documents mode each is one window of its own length, and
    every batch pads its shorter rows."""
    from data.build import build_dataset
    from data.embedded import embedded_documents

    docs = embedded_documents()[:80]
    texts = [d[: 5 + (13 * i) % 58] for i, d in enumerate(docs)]
    return build_dataset(texts, tmp_path_factory.mktemp("short_docs"), val_docs=40, tokenizer="byte260")


@pytest.mark.long  # the real scorer's path (35 s); tests/unit/scoring/test_probes.py proves it in-process
def test_a_model_that_reads_where_its_row_is_padded_is_caught(short_docs, tmp_path):
    """Documents mode pads each batch's short rows with token 0 after their end; a model that looks one
    position ahead only to see whether padding follows knows where its document ends. The causality variant
    changed only real positions, so the padding, the future it reads, was the same in the probe: it passed
    every probe (while evaluate.py says a causal model never sees the padding, "the causality probe ...
    checks exactly that"). Now a variant fills every padded position with real tokens too."""
    from scoring.codecheck import lint_scored_code
    from scoring.score.evaluate import EvalConfig
    from scoring.score.probes import ProbeConfig, ProbeFailure
    from scoring.score.scorer import score_artifact
    from tests.e2e.test_worker_boundary import pack_clean
    from tests.unit.scoring.test_eval_support import write_submission

    folder = write_submission(tmp_path / "sub", model_src=PAD_PEEK)
    assert lint_scored_code(folder) == []
    pack_clean(folder, tmp_path / "a.pgolf")
    ev = EvalConfig(mode="documents", seq_len=64, batch_seqs=8, dtype="float32")
    with pytest.raises(ProbeFailure, match="causality probe failed"):
        score_artifact(
            tmp_path / "a.pgolf", folder, short_docs, ev, threads=1, probe_cfg=ProbeConfig(probes=4, seed=7)
        )


@pytest.mark.long  # the real scorer's path (35 s); tests/unit/scoring/test_probes.py proves it in-process
def test_control_the_honest_model_passes_the_same_probes(short_docs, tmp_path):
    from scoring.score.evaluate import EvalConfig
    from scoring.score.probes import ProbeConfig
    from scoring.score.scorer import score_artifact
    from tests.e2e.test_worker_boundary import pack_clean
    from tests.unit.scoring.test_eval_support import write_submission

    folder = write_submission(tmp_path / "sub")
    pack_clean(folder, tmp_path / "a.pgolf")
    ev = EvalConfig(mode="documents", seq_len=64, batch_seqs=8, dtype="float32")
    record = score_artifact(
        tmp_path / "a.pgolf", folder, short_docs, ev, threads=1, probe_cfg=ProbeConfig(probes=4, seed=7)
    )
    assert record["probes"]["passed"] and record["probes"]["coverage"]["batches_probed"] == 4


XATTR_CODEC = '''"""A codec that carries bytes past the cap in the artifact's extended attributes: the pack writes the artifact
after encode() returns, and an exit hook of the pack's process (its own folder is writable, and neither Landlock
nor the seccomp filter governs xattrs) tags the file with them. A rename keeps a file's xattrs, and a model worker
reads them (os.getxattr on the artifact's path, which its spec names): on tmpfs or XFS, megabytes no cap counted."""
import atexit
import os
import sys

from safetensors.torch import load, save

NAME = "xattrs"
VERSION = 1


def _tag():
    out = sys.argv[sys.argv.index("--out") + 1]
    try:
        os.setxattr(out, "user.pgolf.weights", b"w" * 1000)
        print("XATTR set", flush=True)
    except OSError as e:
        print(f"XATTR refused: {{e}}", flush=True)


def encode(state):
    atexit.register(_tag)
    return save({{k: v.contiguous() for k, v in state.items()}})


def decode(payload):
    return load(payload)
'''


@pytest.mark.long
@pytest.mark.parametrize("sandbox", ["off", "auto"])
def test_a_codec_that_tags_its_artifact_with_xattrs_ships_none_of_them(tiny_dataset, tmp_path, sandbox):
    """HOLE (before the fix): the sealed pack's artifact was taken by a rename (shutil.move), which keeps what the
    codec's process set on the file beside its bytes: user xattrs (on ext4 about 3 kB, on tmpfs 26 MB measured for a
    0-byte file, on XFS unbounded), its mode and times. The scorer's workers read the artifact in place, so a model
    could load weights no cap counted. Now the harness takes the artifact's bytes alone into a file of its own."""
    import os

    from harness.config import LaunchConfig
    from harness.run.train_phase import run_sealed_pack
    from harness.train.budget import BudgetConfig

    sub = _codec_folder(tmp_path / "sub", encode_s=0.0)
    (sub / "codec.py").write_text(XATTR_CODEC.format())
    run_dir = tmp_path / "run"
    _carrying_state(run_dir)
    rc, rec = run_sealed_pack(
        run_dir=run_dir,
        submission_dir=sub,
        data_root=tiny_dataset,
        budget=BudgetConfig(train_s=10.0, grace_s=10.0),
        launch=LaunchConfig(device="cpu", threads=1, sandbox=sandbox),
        train_time_s=1.0,
        cap_bytes=16_000_000,
        log_path=run_dir / "pack.log",
    )
    log = (run_dir / "pack.log").read_text()
    assert rc == 0 and rec["status"] == "ok", (rec, log[-2000:])
    assert "XATTR set" in log, log[-2000:]  # the codec did tag the file it wrote
    artifact = run_dir / "artifact.pgolf"
    assert [a for a in os.listxattr(artifact) if a.startswith("user.")] == []
    assert (run_dir / "pack.json").is_file() and os.listxattr(run_dir / "pack.json") == []
