"""A model worker warms MKL's vector math on every thread before its first forward (scoring/worker/cpu_math.py).

The defect it fixes: a fresh process's first MKL VML call on its second thread now and then ran VML's
low-accuracy AVX2 code (tanh 5e-5 off), so a probe worker's first forward differed from the main worker's and
an honest model was marked `illegal` (about 1 run in 20 on a loaded 2-core machine). The race inside MKL cannot
be forced from here; these tests hold the contract that removes it: every op torch hands to VML is called
once alone and once over every thread, in both dtypes, in every model worker, before the artifact is decoded.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
import torch

from scoring.worker.cpu_math import VML_GRAIN, VML_OPS, warm_cpu_math


def test_the_warm_up_covers_every_op_torch_hands_to_mkl_vml():
    header = Path(torch.__file__).parent / "include" / "ATen" / "cpu" / "vml.h"
    if not header.is_file():
        pytest.skip(f"torch ships no {header} here")
    text = header.read_text(encoding="utf-8")
    # the live lines only: `// IMPLEMENT_VML_MKL(cosh, Cosh)` is switched off in torch itself
    ops = set(re.findall(r"^IMPLEMENT_VML_MKL\((\w+),\s*\w+\)", text, flags=re.MULTILINE))
    assert ops, "no IMPLEMENT_VML_MKL lines found: the header changed, look again at what torch sends to MKL"
    assert ops == set(VML_OPS)  # ATen's names are torch's (vtanh: torch.tanh)
    assert "cosh" not in VML_OPS and "tanh" in VML_OPS  # what the tanh fixture model failed on


def test_every_vml_op_runs_alone_then_over_every_thread(monkeypatch):
    calls: list[tuple[str, torch.dtype, int]] = []
    for name in VML_OPS:
        real = getattr(torch, name)

        def spy(x, _name=name, _real=real):
            calls.append((_name, x.dtype, x.numel()))
            return _real(x)

        monkeypatch.setattr(torch, name, spy)
    threads = torch.get_num_threads()
    record = warm_cpu_math()
    assert record["threads"] == threads and record["calls"] == 2 * (2 * len(VML_OPS) + 1)
    for dtype in (torch.float32, torch.float64):
        for name in VML_OPS:
            sizes = [n for op, dt, n in calls if op == name and dt == dtype]
            # first below the grain (this thread alone, the library's first use), then one chunk or more per thread
            assert sizes == [16, 2 * VML_GRAIN * threads], (name, dtype, sizes)


def test_the_warm_up_changes_no_later_number():
    x = torch.linspace(-3.0, 3.0, 3 * VML_GRAIN + 5)
    before = [getattr(torch, name)(x.clamp(-0.99, 0.99)) for name in ("tanh", "erfinv", "exp")]
    warm_cpu_math()
    after = [getattr(torch, name)(x.clamp(-0.99, 0.99)) for name in ("tanh", "erfinv", "exp")]
    assert all(torch.equal(a, b) for a, b in zip(before, after, strict=True))


def test_a_model_worker_warms_before_its_first_forward_on_its_own_threads(tmp_path):
    from scoring.score.remote import WorkerConfig, start_worker
    from tests.unit.scoring.test_eval_support import TINY_CONFIG, pack_tiny, write_submission

    folder = write_submission(tmp_path / "sub")
    pack_tiny(folder, tmp_path / "a.pgolf")
    worker = start_worker(
        WorkerConfig(
            code_dir=folder,
            artifact=tmp_path / "a.pgolf",
            threads=2,
            vocab_size=TINY_CONFIG["vocab_size"],
            max_tokens_per_batch=64,
        )
    )
    try:
        worker.wait_ready()  # the ready comes after the warm-up and the build: before any forward
        warmed = worker.facts["cpu_math_warmed"]
        assert warmed["threads"] == 2 and warmed["calls"] == 2 * (2 * len(VML_OPS) + 1), warmed
        x = torch.randint(0, TINY_CONFIG["vocab_size"], (4, 16), generator=torch.Generator().manual_seed(0))
        first, again = worker.logits(x), worker.logits(x)
        assert torch.equal(first, again)
        assert np.isfinite(first.numpy()).all()
    finally:
        worker.close()
