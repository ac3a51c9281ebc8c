"""The official's environment does not reach a submission: one `pgolf run` with secrets planted in it.

The official's shell holds a WANDB_API_KEY and a made-up OFFICIAL_TOKEN (values no other variable
shares). The submission (the honest `tiny_lm` fixture, copied) looks for them: its train.py prints
every value of its environment that holds the planted marker and the names of the variables it was
given; its model.py reads the environment past the static lint (a string annotation that typing
evaluates) and, in the model worker, raises an error holding whatever it found, the path an attacker
used to carry a key into result.json and the public ledger line. Every sandboxed process's
environment is an allow-list (scoring/worker/env.py): the run is ok, the marker is in no file of the
run folder and not in the ledger, and of the official's variables the ranks got only allow-listed ones.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil

from harness.run.pipeline import run_pipeline
from scoring.codecheck import lint_scored_code
from scoring.worker.env import ALLOWED
from tests.conftest import REPO

TINY_LM = REPO / "tests" / "fixtures" / "submissions" / "tiny_lm"
MARKER = "pgolf-planted-secret-"

TRAIN_TAIL = f'''

_train = train


def train(ctx):  # noqa: F811 - looks for the official's secrets first
    import json
    import os

    found = sorted(f"{{k}}={{v}}" for k, v in os.environ.items() if "{MARKER}" in v)
    print("env-check: " + json.dumps({{"found": found, "names": sorted(os.environ)}}), flush=True)
    return _train(ctx)
'''

MODEL_TAIL = f'''

import typing


def _smuggled(x: "__import__('os').environ"):
    pass


_ENV = typing.get_type_hints(_smuggled)["x"]
_build = build_model


def build_model(config):  # noqa: F811 - in the model worker, says what it found
    found = sorted(k + "=" + v for k, v in dict(_ENV).items() if "{MARKER}" in v)
    if found and "LOCAL_RANK" not in _ENV:
        raise ValueError("the official's environment: " + "; ".join(found))
    return _build(config)
'''


def test_no_secret_of_the_official_reaches_the_run_or_its_records(tiny_dataset, tmp_path, monkeypatch):
    planted = {
        "WANDB_API_KEY": MARKER + secrets.token_hex(8),
        "OFFICIAL_TOKEN": MARKER + "official-" + secrets.token_hex(8),
    }
    for name, value in planted.items():
        monkeypatch.setenv(name, value)
    folder = tmp_path / "entry"
    shutil.copytree(TINY_LM, folder)
    (folder / "train.py").write_text((folder / "train.py").read_text() + TRAIN_TAIL)
    (folder / "model.py").write_text((folder / "model.py").read_text() + MODEL_TAIL)
    assert lint_scored_code(folder) == []  # the model's reading of the environment is not the lint's to stop

    run_dir, ledger = tmp_path / "run", tmp_path / "ledger.jsonl"
    returned = run_pipeline(folder, data_dir=tiny_dataset, out_dir=run_dir, ledger=ledger, overrides=[])
    result = json.loads((run_dir / "result.json").read_text(encoding="utf-8"))

    written = {p: p.read_bytes() for p in [ledger, *run_dir.rglob("*")] if p.is_file()}
    for name, value in planted.items():
        leaks = [str(p.relative_to(tmp_path)) for p, data in written.items() if value.encode() in data]
        assert not leaks, f"{name}'s value was written to {leaks}"  # (the marker alone is in the code itself)
    assert returned["status"] == result["status"] == "ok", result.get("detail")

    log = (run_dir / "train.log").read_text(encoding="utf-8")
    check = json.loads(next(ln for ln in log.splitlines() if ln.startswith("env-check: "))[11:])
    assert check["found"] == []  # the rank was not given them
    official = set(os.environ)
    assert set(check["names"]) & official <= ALLOWED, sorted(set(check["names"]) & official - ALLOWED)
    # the records name what each process was given, never a value
    recorded = [result["phases"]["train"]["isolation"]["environment"]]
    recorded += [w["isolation"]["environment"] for w in result["phases"]["score"]["workers"]]
    assert all(set(names) <= ALLOWED for names in recorded), recorded
