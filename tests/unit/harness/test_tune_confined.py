"""`pgolf tune` runs a submission's train(ctx) for each of its trials (harness/bench/runner.py run_bare): submitted
code, run on the official's machine by a command an official may well run on an entry (to find a preset for a
reproduction). Before the fix each trial was a plain process with the official's whole environment and every
file the account can reach: the entry's train.py wrote outside its folder, read the planted secret, and read the
dataset's validation shard. Now a trial runs in the model worker's sandbox (scoring/worker/confined.py), is given
the training shards as descriptors and nothing of the dataset's folder, and gets the allow-listed environment."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from data.shards import list_shards
from harness.bench.runner import BASELINE, run_bare, steady_tokens_per_s
from harness.config import load_config

HOSTILE = """
import os as _os
_said = []
for _what, _fn in [
    ("wrote", lambda: open({escape!r}, "w").write("out of the trial")),
    ("secret", lambda: _os.environ["PG_PLANTED_SECRET"]),
    ("val", lambda: open({val!r}, "rb").read(64).hex()),
    ("home", lambda: open({home!r}).read()),
    ("bind", lambda: _os.environ["OMP_PROC_BIND"]),
]:
    try:
        _said.append(f"{{_what}}={{_fn()}}")
    except Exception as _e:  # refused: the trial goes on
        _said.append(f"{{_what}} refused ({{type(_e).__name__}})")
"""


@pytest.mark.long  # one short trial of the tiny preset (~15 s on 2 busy cores)
def test_a_tune_trial_runs_the_entry_confined(tmp_path, sp_dataset, monkeypatch):
    monkeypatch.setenv("PG_PLANTED_SECRET", "hunter2")
    home_file = tmp_path / "officials_home_file"
    home_file.write_text("official's notes", encoding="utf-8")
    escape = tmp_path / "escaped"
    entry = tmp_path / "entry"
    shutil.copytree(BASELINE, entry)
    val = list_shards(sp_dataset, "val")[0]
    block = HOSTILE.format(escape=str(escape), val=str(val), home=str(home_file))
    train = entry / "train.py"
    text = train.read_text(encoding="utf-8")
    # after the module's imports, before train(): it runs when the trial imports train.py
    at = text.index("\ndef ")
    train.write_text(
        text[:at]
        + block
        + "\n_SAID = _said\n"
        + text[at:].replace(
            "    hp = ", "    (ctx.scratch_dir / 'said.txt').write_text(' '.join(_SAID))\n    hp = ", 1
        ),
        encoding="utf-8",
    )
    cfg = load_config(entry, "tiny", [])
    rec = run_bare(
        submission=entry, data_root=sp_dataset, cfg=cfg, budget_s=3.0, threads=1, device="cpu",
        workdir=tmp_path / "trial", hparams={**cfg.train, "train_log_every": 1}, from_first_tick=True,
        env={"OMP_PROC_BIND": "close"},
    )  # fmt: skip
    assert not escape.exists(), "the entry wrote outside its trial"
    said = (Path(rec["metrics"]).parent / "said.txt").read_text()
    assert "secret refused (KeyError)" in said and "hunter2" not in said
    assert "val refused" in said and "home refused" in said
    assert "bind=close" in said  # the trial's own setting reaches it
    assert steady_tokens_per_s(Path(rec["metrics"]), int(cfg.train["train_batch_tokens"])) is not None
