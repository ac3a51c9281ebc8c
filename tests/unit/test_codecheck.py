"""Code that runs inside the scorer: the static check refuses it before import, the tool guard catches
what the static check cannot see (scoring/codecheck.py)."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import torch

from scoring.codecheck import CodeCheckFailure, lint_scored_code
from scoring.score.guard import ToolGuard
from scoring.score.scorer import score_artifact, scorer_tools
from tests.conftest import REPO
from tests.unit.test_eval_support import FAST_EVAL, TINY_MODEL, _one_thread, pack_tiny, write_submission  # noqa: F401 (fixture)

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
    pack_tiny(write_submission(tmp_path / "clean"), tmp_path / "a.pgolf")
    (tmp_path / "clean" / "model.py").write_text((folder / "model.py").read_text())
    before = torch.get_num_threads()
    with pytest.raises(CodeCheckFailure, match=r"(?s)code check failed: .*imports 'os'"):
        score_artifact(tmp_path / "a.pgolf", tmp_path / "clean", tiny_dataset, FAST_EVAL, threads=1)
    assert torch.get_num_threads() == before  # model.py never ran


def test_the_guard_names_a_replaced_removed_or_added_tool(monkeypatch):
    guard = ToolGuard(scorer_tools())
    guard("at rest")
    monkeypatch.setattr(torch, "gather", lambda *a, **k: None)
    with pytest.raises(CodeCheckFailure, match=r"torch\.gather was replaced during a test"):
        guard("during a test")
    monkeypatch.undo()
    monkeypatch.delattr(np, "where")
    with pytest.raises(CodeCheckFailure, match=r"numpy\.where was removed"):
        guard()
    monkeypatch.undo()
    monkeypatch.setattr(torch.Tensor, "double", lambda self: self, raising=False)  # shadows TensorBase.double
    with pytest.raises(CodeCheckFailure, match=r"torch\.Tensor gained 'double'"):
        guard()
    monkeypatch.undo()
    guard("after undo")
    assert guard.record()["checks"] == 5


SNEAKY = TINY_MODEL.replace(
    "    def forward(self, ids):\n",
    "    def forward(self, ids):\n        t = torch\n        t.isfinite = lambda x: torch.ones_like(x, dtype=torch.bool)\n",
)


def test_a_model_that_patches_the_scorer_through_an_alias_fails_at_its_first_forward(tmp_path, tiny_dataset):
    folder = write_submission(tmp_path / "sneaky", model_src=SNEAKY)
    assert lint_scored_code(folder) == []  # the alias hides it from the static check ...
    pack_tiny(folder, tmp_path / "a.pgolf")
    original = torch.isfinite
    try:
        with pytest.raises(CodeCheckFailure, match=r"torch\.isfinite was replaced during a forward pass"):
            score_artifact(
                tmp_path / "a.pgolf", folder, tiny_dataset, FAST_EVAL, threads=1
            )  # ... not from the guard
    finally:
        torch.isfinite = original


def test_a_clean_score_records_its_code_check(tmp_path, tiny_dataset):
    folder = write_submission(tmp_path / "ok")
    pack_tiny(folder, tmp_path / "a.pgolf")
    rec = score_artifact(tmp_path / "a.pgolf", folder, tiny_dataset, FAST_EVAL, threads=1)
    cc = rec["code_check"]
    assert cc["static"] == "passed" and cc["files"] == ["model.py"] and "torch" in cc["watched"]
    assert (
        cc["checks"] >= 2 + 3 + rec["eval_windows"] // FAST_EVAL.batch_seqs
    )  # build, end, 3 probe forwards, every batch


def test_the_score_command_says_code_check_failed(tmp_path, tiny_dataset):
    """The run pipeline reads this phrase to call the entry illegal rather than crashed."""
    folder = write_submission(tmp_path / "m")
    pack_tiny(folder, tmp_path / "a.pgolf")
    (folder / "model.py").write_text(TINY_MODEL + "import gc\n")
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
    assert proc.returncode == 2 and "code check failed" in proc.stderr and "imports 'gc'" in proc.stderr, (
        proc.stderr
    )


def test_torch_compile_in_model_code_is_not_a_false_alarm():
    """torch.compile replaces torch.manual_seed and patches nn.Module as it loads: torch's own doing."""
    guard = ToolGuard(scorer_tools())
    m = torch.compile(torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.GELU()), backend="eager")
    with torch.inference_mode():
        m(torch.randn(2, 4))
    guard("after torch.compile")


def test_the_guard_sees_a_function_mode_left_active():
    """A suspended generator can keep a TorchFunctionMode entered past the model's forward: it would see every
    torch call of the scorer, the targets included."""
    from torch.overrides import TorchFunctionMode

    class Spy(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    def held(mode):
        with mode:
            yield

    guard = ToolGuard(scorer_tools())
    gen = held(Spy())
    next(gen)
    try:
        with pytest.raises(CodeCheckFailure, match="mode was left active"):
            guard("during a forward pass")
    finally:
        gen.close()
    guard("after it ended")


@pytest.mark.filterwarnings(
    "ignore:Warning only once for all operators"
)  # torch warns of the override: the point here
@pytest.mark.parametrize(("op", "full"), [("neg", False), ("gather", True)])
def test_the_guard_sees_a_kernel_replaced_through_torch_library(op, full):
    guard = ToolGuard(scorer_tools())
    lib = torch.library.Library("aten", "IMPL")
    try:
        lib.impl(op, lambda *a, **k: None, "CPU")
        with pytest.raises(CodeCheckFailure, match=rf"the kernels of aten::{op} were replaced"):
            guard("during a forward pass", full=full)
    finally:
        lib._destroy()
    guard("after the library was destroyed", full=True)  # and the kernel is torch's own again
    assert torch.equal(-torch.ones(2), torch.full((2,), -1.0))
