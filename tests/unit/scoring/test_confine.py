"""The scorer's self-confinement (scoring/score/confine.py): once it has read the validation data, nothing
in its process can open the dataset again; it can still import, read the submission's code and write
its result. Landlock is irreversible, so every confined check runs in a fresh process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from isolation.landlock import landlock_abi
from scoring.score.confine import plan_rules
from scoring.score.probes import ProbeConfig
from tests.conftest import REPO
from tests.unit.scoring.test_eval_support import FAST_EVAL, _one_thread, pack_tiny, write_submission  # noqa: F401 (fixture)
from tests.waiting import wait_until

needs_landlock = pytest.mark.skipif(
    landlock_abi() == 0, reason="this kernel has no Landlock: the scorer runs unconfined here"
)

PROBE = r"""
import json, sys, tempfile
from pathlib import Path
from scoring.score.confine import confine_scorer, private_workdir

data, code, out = map(Path, sys.argv[1:4])
workdir = private_workdir()
shard = next(data.glob("fineweb_val_*.bin"))
rec = confine_scorer(code_dir=code, protected=[data], write_dirs=[out], device="cpu", workdir=workdir)

def attempt(fn):
    try:
        fn()
        return "ok"
    except OSError as e:
        return type(e).__name__

print(json.dumps({"confinement": rec, "work": str(workdir[0]), **{
    "read a validation shard": attempt(lambda: open(shard, "rb").read(8)),
    "list the dataset": attempt(lambda: list(data.iterdir())),
    "read it through /proc/self/root": attempt(lambda: open("/proc/self/root" + str(shard), "rb").read(8)),
    "read the submission's code": attempt(lambda: (code / "model.py").read_text()),
    "write the result": attempt(lambda: (out / "score.json").write_text("{}")),
    "write beside the result folder": attempt(lambda: (out.parent / "evil.txt").write_text("x")),
    "write to its temp folder": attempt(lambda: (Path(tempfile.gettempdir()) / "t").write_text("x")),
    "import a module not yet loaded": attempt(lambda: __import__("decimal")),
}}))
"""


@needs_landlock
def test_a_confined_scorer_cannot_open_the_dataset_but_can_do_its_job(tmp_path, tiny_dataset):
    code = write_submission(tmp_path / "code")
    out = tmp_path / "out"
    out.mkdir()
    proc = subprocess.run(
        [sys.executable, "-c", PROBE, str(tiny_dataset), str(code), str(out)],
        capture_output=True,
        text=True,
        cwd=REPO,
        check=False,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got.pop("confinement")["applied"] is True
    work = Path(got.pop("work"))
    assert got == {
        "read a validation shard": "PermissionError",
        "list the dataset": "PermissionError",
        "read it through /proc/self/root": "PermissionError",
        "read the submission's code": "ok",
        "write the result": "ok",
        "write beside the result folder": "PermissionError",
        "write to its temp folder": "ok",
        "import a module not yet loaded": "ok",
    }
    assert not (tmp_path / "evil.txt").exists()
    # the reaper removes the private temp folder once the scorer has ended
    wait_until(lambda: not work.exists(), 60, f"the reaper to remove {work}")


def test_plan_carves_a_dataset_out_of_a_readable_folder_and_refuses_overlaps(tmp_path):
    data = (
        REPO / "data" / "pytest-dataset-inside-the-package"
    )  # a dataset built inside the project's data/ package
    data.mkdir()
    try:
        rules, prot, _ = plan_rules(
            code_dir=tmp_path,
            protected=[data],
            write_dirs=[tmp_path / "out"],
            device="cpu",
            system_tmp="/tmp",
        )
        paths = {r.path for r in rules if r.access == "ro"}
        assert (
            str(REPO / "data") not in paths
            and str(REPO / "data" / "shards.py") in paths
            and prot == [str(data)]
        )
        assert not any(p == str(data) or p.startswith(str(data) + "/") for p in paths)
        with pytest.raises(ValueError, match="overlaps the protected"):
            plan_rules(
                code_dir=tmp_path,
                protected=[tmp_path / "ds"],
                write_dirs=[tmp_path],
                device="cpu",
                system_tmp="/tmp",
            )
        with pytest.raises(ValueError, match="keep code and data apart"):
            plan_rules(
                code_dir=tmp_path / "ds" / "code",
                protected=[tmp_path / "ds"],
                write_dirs=[],
                device="cpu",
                system_tmp="/tmp",
            )
    finally:
        data.rmdir()


def _score_cli(artifact: Path, folder: Path, data: Path, out: Path, *extra: str) -> dict:
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "scoring",
            "score",
            str(artifact),
            "--submission",
            str(folder),
            "--data",
            str(data),
            "--seq-len",
            str(FAST_EVAL.seq_len),
            "--batch-seqs",
            str(FAST_EVAL.batch_seqs),
            "--max-tokens",
            str(FAST_EVAL.max_tokens),
            "--threads",
            "1",
            "--json-out",
            str(out),
            *extra,
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(out.read_text())


@pytest.mark.long
def test_the_score_command_confines_itself_and_scores_the_same(tmp_path, tiny_dataset):
    from scoring.score.scorer import score_artifact

    folder = write_submission(tmp_path / "m")
    pack_tiny(folder, tmp_path / "a.pgolf")
    (tmp_path / "o1").mkdir()
    (tmp_path / "o2").mkdir()
    # the confinement is what is compared, not the probes (tests/unit/scoring/test_probes.py): none, so
    # that three scorings cost three workers, not fifteen
    no_probes = ("--probes", "0")
    confined = _score_cli(
        tmp_path / "a.pgolf", folder, tiny_dataset, tmp_path / "o1" / "score.json", *no_probes
    )
    free = _score_cli(
        tmp_path / "a.pgolf", folder, tiny_dataset, tmp_path / "o2" / "score.json", "--no-confine", *no_probes
    )
    in_process = score_artifact(
        tmp_path / "a.pgolf", folder, tiny_dataset, FAST_EVAL, threads=1, probe_cfg=ProbeConfig(probes=0)
    )
    assert confined["val_loss_sum_nats"] == free["val_loss_sum_nats"] == in_process["val_loss_sum_nats"]
    assert free["confinement"]["applied"] is False and in_process["confinement"]["applied"] is False
    assert confined["confinement"]["applied"] is (landlock_abi() > 0)
    if landlock_abi():
        assert confined["confinement"]["protected"] == [str(tiny_dataset.resolve())]
        assert str((tmp_path / "o1").resolve()) in confined["confinement"]["writable"]
