"""Every model worker computes as every other one would (the probes compare their answers bit for bit):
deterministic algorithms on, a fixed cuBLAS workspace in its environment, and eval.py's adaptation hook
under the same autocast as the scoring forward (scoring/worker/process.py, env.py, adapt.py)."""

from __future__ import annotations

import numpy as np
import torch

from scoring.score.remote import WorkerConfig, start_worker
from scoring.worker.adapt import ScoreFirstAdapter
from scoring.worker.env import WORKER_CUBLAS_WORKSPACE
from tests.unit.scoring.test_eval_support import (
    TINY_CONFIG,
    TINY_MODEL,
    _one_thread,  # noqa: F401 (fixture)
    pack_tiny,
    write_submission,
)  # noqa: F401

V = TINY_CONFIG["vocab_size"]
# +5 on every logit when the worker runs with deterministic algorithms: the answer shows the setting
TELLS_DETERMINISM = TINY_MODEL.replace(
    "return self.head(torch.tanh(e + self.mix * prev))",
    "return self.head(torch.tanh(e + self.mix * prev)) + 5.0 * float(torch.are_deterministic_algorithms_enabled())",
)
# the hook zeroes the head when it runs without bfloat16 autocast (every logit then exactly 0), sets it to 1
# when it runs under it (every logit the sum of the position's features: not 0)
AUTOCAST_HOOK = '''"""Score-first hook for the autocast test."""
import torch


def adapt(model, tokens):
    on = torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu") == torch.bfloat16
    with torch.no_grad():
        model.head.weight.fill_(1.0 if on else 0.0)
'''


def _worker(tmp_path, folder, **kw):
    pack_tiny(folder, tmp_path / "a.pgolf")
    return start_worker(
        WorkerConfig(
            code_dir=folder,
            artifact=tmp_path / "a.pgolf",
            threads=1,
            vocab_size=V,
            max_tokens_per_batch=64,
            **kw,
        )
    )


def test_a_worker_runs_deterministic_with_a_fixed_cublas_workspace(tmp_path):
    worker = _worker(tmp_path, write_submission(tmp_path / "sub", model_src=TELLS_DETERMINISM))
    try:
        worker.wait_ready()
        assert (
            worker.env["CUBLAS_WORKSPACE_CONFIG"] == WORKER_CUBLAS_WORKSPACE == ":4096:8"
        )  # the scorer set it
        assert (
            "CUBLAS_WORKSPACE_CONFIG" in worker.describe()["isolation"]["environment"]
        )  # and records its name
        x = torch.randint(0, V, (2, 16), generator=torch.Generator().manual_seed(0))
        out = worker.logits(x)
        plain = worker.logits(x)  # the same bits twice
        assert torch.equal(out, plain)
        assert not torch.are_deterministic_algorithms_enabled()  # this test process: off
        from scoring.worker.loading import build_model

        torch.manual_seed(0)
        local = build_model(tmp_path / "sub", dict(TINY_CONFIG))  # the packed weights (seed 0), here: no +5
        with torch.no_grad():
            delta = out - local(x)
        assert torch.allclose(delta, torch.full_like(delta, 5.0), atol=0.05)  # int8 weights: close, not equal
    finally:
        worker.close()


def test_the_hook_runs_under_the_scoring_autocast_in_the_worker(tmp_path):
    folder = write_submission(tmp_path / "sub", eval_src=AUTOCAST_HOOK)
    worker = _worker(tmp_path, folder, adapt=True, dtype="bfloat16")
    try:
        worker.wait_ready()
        x = torch.randint(0, V, (2, 16), generator=torch.Generator().manual_seed(0))
        worker.before_chunk(None, 0)
        before = worker.logits(x)
        worker.after_chunk(None, 0, np.arange(4, 20, dtype=np.int64), 1)
        worker.before_chunk(None, 1)
        after = worker.logits(x)
    finally:
        worker.close()
    worker2 = _worker(tmp_path / "w2", folder, adapt=True, dtype="float32")  # the same hook, float32 scoring
    try:
        worker2.wait_ready()
        worker2.before_chunk(None, 0)
        worker2.logits(x)
        worker2.after_chunk(None, 0, np.arange(4, 20, dtype=np.int64), 1)
        worker2.before_chunk(None, 1)
        float32_after = worker2.logits(x)
    finally:
        worker2.close()
    assert before.abs().max() > 0
    assert after.abs().max() > 0  # the hook saw the scoring forward's autocast (without it: exactly 0)
    assert float32_after.abs().max() == 0  # float32 scoring: no autocast for the hook either


def test_the_in_process_adapter_autocasts_only_when_asked():
    seen: list[tuple[bool, torch.dtype]] = []

    def hook(model, tokens):
        seen.append((torch.is_autocast_enabled("cpu"), torch.get_autocast_dtype("cpu")))

    model = torch.nn.Linear(2, 2)
    for on in (True, False):
        a = ScoreFirstAdapter(hook, autocast_bf16=on)
        a.before_chunk(model, 0)
        a.after_chunk(model, 0, np.arange(3), 1)
    assert seen[0] == (True, torch.bfloat16) and seen[1][0] is False
