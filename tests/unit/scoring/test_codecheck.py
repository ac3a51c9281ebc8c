"""The static check of scored code (scoring/codecheck.py): a friendly early verdict before anything is
imported. It is not the boundary (the model worker's process is: tests/e2e/test_worker_boundary.py), so
what it cannot see, such as a monkeypatch through an alias, is shown here to change nothing in the scorer."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from scoring.codecheck import CodeCheckFailure, lint_scored_code
from scoring.score.probes import ProbeConfig
from scoring.score.scorer import score_artifact
from tests.conftest import REPO
from tests.unit.scoring.test_eval_support import (  # noqa: F401 (fixture)
    FAST_EVAL,
    TINY_MODEL,
    _one_thread,
    pack_tiny,
    write_submission,
)

FIXTURES = REPO / "tests" / "fixtures" / "submissions"

# (what the model file adds, the rule it must be refused by)
HOSTILE_MODELS = {
    "reads a file": ("V = open('/data/fineweb_val_000000.bin', 'rb').read()\n", "uses 'open'"),
    "numpy fromfile": (
        "import numpy as np\nV = np.fromfile('/v.bin', dtype=np.uint16)\n",
        "attribute 'fromfile'",
    ),
    "numpy memmap": ("import numpy\nV = numpy.memmap('/v.bin')\n", "attribute 'memmap'"),
    "from-import of a file reader": ("from numpy import fromfile\n", "imports 'fromfile'"),
    "torch.load": ("X = torch.load('/v.pt')\n", "attribute 'load'"),
    "os": ("import os\nP = os.environ\n", "imports 'os'"),
    "frames": ("import sys\nF0 = sys._getframe(0)\n", "uses 'sys'"),
    "gc": ("import gc\n", "imports 'gc'"),
    "dunder": ("G = build_model.__globals__\n", "attribute '__globals__'"),
    "monkeypatch torch": ("torch.gather = lambda *a, **k: None\n", "assigns to 'torch.gather'"),
    "monkeypatch F": (
        "import torch.nn.functional as F\nF.log_softmax = None\n",
        "assigns to 'F.log_softmax'",
    ),
    "monkeypatch a class": ("nn.Module.__call__ = None\n", "assigns to 'nn.Module.__call__'"),
    "getattr": ("X = getattr(torch, 'gather')\n", "uses 'getattr'"),
    "helper module": ("from helper import peek\n", "helper.py:1: imports 'os'"),
    "private back door": (
        "F = torch.serialization._open_file_like('/v.bin', 'rb')\n",
        "private attribute '_open_file_like'",
    ),
    "private module": ("from torch._dynamo import eval_frame\n", "private module 'torch._dynamo'"),
    "datapipes": (
        "P = torch.utils.data.datapipes.iter.FileOpener(['/v.bin'], mode='b')\n",
        "attribute 'datapipes'",
    ),
    "a shell": ("R = torch.utils.collect_env.run('cat /v.bin')\n", "attribute 'collect_env'"),
    "numpy writes": (
        "import numpy as np\nnp.savetxt('score.json', [], header='{}')\n",
        "attribute 'savetxt'",
    ),
    "exit early": ("raise SystemExit(0)\n", "uses 'SystemExit'"),
    "kernel registry": ("import torch.library\n", "imports 'torch.library'"),
    "function modes": ("M = torch.overrides.TorchFunctionMode\n", "attribute 'TorchFunctionMode'"),
    "private name": ("from torch.serialization import _open_file_like\n", "imports '_open_file_like'"),
}


@pytest.mark.parametrize("name", sorted(HOSTILE_MODELS))
def test_hostile_model_code_is_refused_by_the_static_check(tmp_path, name):
    extra, why = HOSTILE_MODELS[name]
    folder = write_submission(tmp_path / "m", model_src=TINY_MODEL + extra)
    (folder / "helper.py").write_text("import os\n\ndef peek():\n    return os.listdir('/')\n")
    problems = lint_scored_code(folder)
    assert any(why in p for p in problems), problems


def test_the_baseline_and_honest_fixtures_pass():
    assert lint_scored_code(REPO / "baselines" / "naive_baseline") == []
    for name in (
        "tiny_lm",
        "peek_val",
        "ignore_stop",
        "kill_rank",
    ):  # their hostility is in train.py, which the scorer never gets
        assert lint_scored_code(FIXTURES / name) == [], name


def test_a_codec_may_decode_bytes_but_not_open_files(tmp_path):
    folder = write_submission(tmp_path / "c")
    good = (
        "import io\nimport json\nimport zlib\nimport torch\nfrom safetensors.torch import load, save\n\n"
        "def decode(payload):\n    return load(zlib.decompress(payload))\n\n"
        "def raw(payload):\n    return torch.frombuffer(bytearray(payload), dtype=torch.uint8)\n"
    )
    (folder / "codec.py").write_text(good)
    assert lint_scored_code(folder) == []
    (folder / "codec.py").write_text(
        good + "import lzma\nX = lzma.LZMAFile('/v.bin')\nY = io.FileIO('/v.bin')\n"
    )
    problems = lint_scored_code(folder)
    assert any("'LZMAFile'" in p for p in problems) and any("'FileIO'" in p for p in problems), problems
    assert any(
        "time" in p for p in lint_scored_code(FIXTURES / "codec_peek")
    )  # the hostile codec fixture: time, pathlib, open


def test_model_code_may_not_use_codec_allowances(tmp_path):
    folder = write_submission(
        tmp_path / "m", model_src=TINY_MODEL + "import zlib\nX = torch.frombuffer(b'ab', dtype=torch.uint8)\n"
    )
    problems = lint_scored_code(folder)
    assert any("imports 'zlib'" in p for p in problems) and any("'frombuffer'" in p for p in problems), (
        problems
    )


def test_the_static_check_runs_before_the_model_is_imported(tmp_path, tiny_dataset):
    folder = write_submission(tmp_path / "m", model_src=TINY_MODEL + "torch.set_num_threads(3)\nimport os\n")
    pack_tiny(folder, tmp_path / "a.pgolf")  # imports model.py here, in the test (it sets 3 threads) ...
    torch.set_num_threads(1)
    before = torch.get_num_threads()
    with pytest.raises(CodeCheckFailure, match=r"(?s)code check failed: .*imports 'os'"):
        score_artifact(tmp_path / "a.pgolf", folder, tiny_dataset, FAST_EVAL, threads=1)
    assert torch.get_num_threads() == before  # ... the scorer never imports it


NO_PROBES = ProbeConfig(probes=0)
"""What these tests compare is the code check, not the probes (tests/unit/scoring/test_probes.py)."""

SNEAKY = TINY_MODEL.replace(
    "    def forward(self, ids):\n",
    "    def forward(self, ids):\n        t = torch\n        t.isfinite = lambda x: torch.ones_like(x, dtype=torch.bool)\n",
)


def test_a_model_that_patches_torch_through_an_alias_changes_nothing_in_the_scorer(tmp_path, tiny_dataset):
    """The alias hides the patch from the static check; the patch runs in the worker's process, and the
    scorer's own torch.isfinite (which checks the logits) is untouched: same score as the honest model."""
    folder = write_submission(tmp_path / "sneaky", model_src=SNEAKY)
    assert lint_scored_code(folder) == []
    pack_tiny(folder, tmp_path / "a.pgolf")
    honest = write_submission(tmp_path / "honest")
    pack_tiny(honest, tmp_path / "b.pgolf")
    original = torch.isfinite
    a = score_artifact(tmp_path / "a.pgolf", folder, tiny_dataset, FAST_EVAL, threads=1, probe_cfg=NO_PROBES)
    b = score_artifact(tmp_path / "b.pgolf", honest, tiny_dataset, FAST_EVAL, threads=1, probe_cfg=NO_PROBES)
    assert torch.isfinite is original and a["val_bpb"] == b["val_bpb"]


def test_a_clean_score_records_its_code_check(tmp_path, tiny_dataset):
    """(Scored on its first validation document: a cut by documents, resolved by the scorer and recorded.)"""
    import dataclasses

    import numpy as np

    from data.shards import read_split
    from data.tokenizer import BOS_ID

    folder = write_submission(tmp_path / "ok")
    pack_tiny(folder, tmp_path / "a.pgolf")
    first_doc = dataclasses.replace(FAST_EVAL, max_tokens=None, max_docs=1)
    rec = score_artifact(
        tmp_path / "a.pgolf", folder, tiny_dataset, first_doc, threads=1, probe_cfg=NO_PROBES
    )
    second_doc_at = int(np.flatnonzero(read_split(tiny_dataset, "val") == BOS_ID)[1])
    assert (rec["eval_subset_docs"], rec["eval_subset_max_tokens"]) == (1, second_doc_at)
    # standard mode, and yet every target to the cut: its last window is a partial one (windows.py whole_documents)
    assert rec["val_tokens"] == second_doc_at and rec["eval_windows"] == -(-second_doc_at // 32)
    cc = rec["code_check"]
    assert cc["static"] == "passed" and cc["files"] == ["model.py"] and "model.py" in cc["code_files_checked"]
    assert "static lint" in rec["enforcement"]["allowed imports, no files or monkeypatching in scored code"]


def test_the_score_command_says_code_check_failed(tmp_path, tiny_dataset):
    """A failed check is a verdict (illegal, exit status 3), named on one line, not a crash."""
    folder = write_submission(tmp_path / "m", model_src=TINY_MODEL + "import gc\n")
    pack_tiny(folder, tmp_path / "a.pgolf")
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "scoring",
            "score",
            str(tmp_path / "a.pgolf"),
            "--submission",
            str(folder),
            "--data",
            str(tiny_dataset),
            "--seq-len",
            "32",
            "--max-tokens",
            "512",
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
        check=False,
    )
    assert proc.returncode == 3 and "code check failed" in proc.stderr and "imports 'gc'" in proc.stderr, (
        proc.stderr
    )


# ---- which files: every .py file of the folder but train.py (sub-packages included), read as staged ----


def test_every_py_file_but_train_py_is_checked(tmp_path):
    folder = write_submission(tmp_path / "m")
    (folder / "pkg" / "deep").mkdir(parents=True)
    (folder / "pkg" / "__init__.py").write_text("")
    (folder / "pkg" / "deep" / "sub.py").write_text("import os\n")  # imported by no entry file
    (folder / "trainutil.py").write_text("import time\n")  # a training helper: the scorer gets it too
    (folder / "train.py").write_text("import os\nimport time\n\n\ndef train(ctx):\n    pass\n")
    (folder / "__pycache__").mkdir()
    (folder / "__pycache__" / "junk.py").write_text("import os\n")  # never staged: never checked
    problems = lint_scored_code(folder)
    assert sorted(p.split(":")[0] for p in problems) == ["pkg/deep/sub.py", "trainutil.py"], problems


def test_a_module_only_the_codec_imports_gets_the_codec_rules(tmp_path):
    folder = write_submission(tmp_path / "c")
    (folder / "codec.py").write_text("from packing import cz\nimport helpers.bits\n")
    (folder / "packing").mkdir()
    (folder / "packing" / "cz.py").write_text("import zlib\n")
    (folder / "helpers").mkdir()
    (folder / "helpers" / "bits.py").write_text("import struct\n")
    assert lint_scored_code(folder) == []
    (folder / "model.py").write_text(TINY_MODEL + "from packing import cz\n")  # now model code runs it too
    assert any(p.startswith("packing/cz.py:1: imports 'zlib'") for p in lint_scored_code(folder))


def test_scored_code_may_not_import_train_py(tmp_path):
    folder = write_submission(tmp_path / "m", model_src=TINY_MODEL + "from train import train\n")
    assert any("the scorer never gets train.py" in p for p in lint_scored_code(folder))


@pytest.mark.parametrize(
    ("source", "why"),
    [
        (b"# coding: utf-7\nX = 1\n", "model.py:1: declares the source coding 'utf-7'"),
        (
            b"#!/usr/bin/env python\n# -*- coding: latin-1 -*-\nX = 1\n",
            "model.py:2: declares the source coding 'latin-1'",
        ),
        (b"X = '\xff'\n", "model.py:1: is not valid UTF-8 (byte 0xff at offset 5)"),
    ],
)
def test_a_source_python_would_decode_otherwise_is_refused(tmp_path, source, why):
    folder = write_submission(tmp_path / "m")
    (folder / "model.py").write_bytes(source)
    assert any(why in p for p in lint_scored_code(folder)), lint_scored_code(folder)


def test_a_folder_the_folder_rules_refuse_is_one_problem(tmp_path):
    folder = write_submission(tmp_path / "m")
    (folder / "helper.py").symlink_to(tmp_path / "elsewhere.py")
    (problem,) = lint_scored_code(folder)
    assert problem.startswith("illegal: ") and "helper.py is a symbolic link" in problem


def test_a_model_py_of_too_many_tokens_is_refused_unparsed(tmp_path):
    """HOLE (before the fix): the lint and `check_submission` parsed every counted source in the trusted process;
    ast.parse holds 400-650 bytes a token, so a 14 MB model.py of `0,` (within the cap) held 6.6 GB of the scorer
    for 74 s. A source of over SOURCE_MAX_TOKENS tokens is now refused, counted without a tree; under
    RLIMIT_AS of 1 GiB above what the process holds, a 14 MB source would have run out."""
    weights = "W = [" + "0," * 260_000 + "]\n"
    folder = write_submission(tmp_path / "big", model_src=TINY_MODEL + weights)
    script = f"""
import resource, sys
sys.path.insert(0, {str(REPO)!r})
from harness.submission import check_submission
from scoring.codecheck import lint_scored_code
from scoring.errors import SubmissionError
rss = int(open("/proc/self/statm").read().split()[0]) * resource.getpagesize()
resource.setrlimit(resource.RLIMIT_AS, (rss + (1 << 30), rss + (1 << 30)))
print(lint_scored_code({str(folder)!r}))
try:
    check_submission({str(folder)!r})
except SubmissionError as e:
    print("refused:", e)
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    lint, refused = done.stdout.splitlines()
    assert "model.py:?: its source holds over 500,000 Python tokens" in lint, lint
    assert (
        refused.startswith("refused:") and "model.py: its source holds over 500,000 Python tokens" in refused
    )
