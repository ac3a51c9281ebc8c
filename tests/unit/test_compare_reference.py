"""scripts/compare_reference.py, its pure parts: the reference's run-time adaptations, its environment,
the baseline's overrides, the per-step loss as the baseline logs it, and the tensor comparison."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest
import torch

from tests.conftest import REPO

_spec = importlib.util.spec_from_file_location("compare_reference", REPO / "scripts" / "compare_reference.py")
assert _spec is not None and _spec.loader is not None
cr = importlib.util.module_from_spec(_spec)
sys.modules["compare_reference"] = cr  # dataclasses look their module up by name
_spec.loader.exec_module(cr)

# The lines of the reference's main() that the CPU adaptation replaces, as the 2026-03-17 script has them.
REFERENCE_MAIN = """\
def main() -> None:
    grad_scale = 1.0 / grad_accum_steps
    if not torch.cuda.is_available():
        raise RuntimeError("CUDA is required")
    device = torch.device("cuda", local_rank)
    torch.cuda.set_device(device)
    if distributed:
"""


def test_cpu_substitution_replaces_the_cuda_guard_and_device_with_cpu() -> None:
    out = cr.substitute(REFERENCE_MAIN, [cr.CPU_DEVICE])
    assert out == (
        "def main() -> None:\n    grad_scale = 1.0 / grad_accum_steps\n"
        '    device = torch.device("cpu")\n    if distributed:\n'
    )


@pytest.mark.parametrize("copies", [0, 2])
def test_a_substitution_that_does_not_match_exactly_once_is_refused(copies: int) -> None:
    with pytest.raises(cr.UserError, match=rf"has {copies} occurrences .*CUDA device -> CPU"):
        cr.substitute(REFERENCE_MAIN * copies, [cr.CPU_DEVICE])


def test_precision_reference_adapts_only_the_device() -> None:
    assert [w for w, _, _ in cr.reference_substitutions("reference")] == ["CUDA device -> CPU"]
    assert [w for w, _, _ in cr.reference_substitutions("float32")] == [
        "CUDA device -> CPU",
        "model stays float32",
        "Newton-Schulz in float32",
        "Muon update buffer in float32",
    ]


def test_the_adaptations_match_the_reference_script_when_it_is_here() -> None:
    """Against the real script (a checkout named by PGOLF_REFERENCE_SCRIPT); skipped without it."""
    import os

    path = Path(os.environ.get("PGOLF_REFERENCE_SCRIPT", "")).expanduser()
    if not path.is_file():
        pytest.skip(f"no reference train_gpt.py at {path} (set PGOLF_REFERENCE_SCRIPT)")
    source = path.read_text(encoding="utf-8")
    out = cr.substitute(source, cr.reference_substitutions("float32"))
    assert "bfloat16()" not in out.split("def main")[1].split("compiled_model")[0]
    assert "CUDA is required" not in out


def test_reference_env_sets_the_shape_and_turns_off_warmup_warmdown_and_the_wallclock(tmp_path: Path) -> None:
    shape = cr.Shape(layers=3, dim=96, heads=3, kv_heads=1, seq_len=64, batch_tokens=1024, steps=7, seed=5)
    env = cr.reference_env(shape, tmp_path / "d", tmp_path / "t.model")
    assert env["NUM_LAYERS"] == "3" and env["MODEL_DIM"] == "96" and env["NUM_HEADS"] == "3"
    assert env["NUM_KV_HEADS"] == "1" and env["TRAIN_SEQ_LEN"] == "64" and env["TRAIN_BATCH_TOKENS"] == "1024"
    assert env["ITERATIONS"] == "7" and env["SEED"] == "5"
    assert env["WARMUP_STEPS"] == env["WARMDOWN_ITERS"] == env["MAX_WALLCLOCK_SECONDS"] == "0"
    assert env["DATA_PATH"] == str(tmp_path / "d") and env["TOKENIZER_PATH"] == str(tmp_path / "t.model")


def test_baseline_sets_are_python_literals_the_config_parser_reads() -> None:
    from harness.config import parse_override

    sets = dict(parse_override(s) for s in cr.baseline_sets(cr.Shape(), threads=1))
    assert sets["train.compile"] is False
    assert sets["train.grad_accum_steps"] == 8 and sets["train.warmdown_iters"] == 0
    assert sets["budget.train_s"] == 3600.0 and sets["launch.threads"] == 1


@pytest.mark.parametrize(
    ("shape", "message"),
    [
        (cr.Shape(batch_tokens=1000), "8 micro-batches"),
        (cr.Shape(batch_tokens=8 * 100, seq_len=128), "8 micro-batches"),
        (cr.Shape(dim=130), "even head size"),
        (cr.Shape(heads=4, kv_heads=3), "even head size"),
        (cr.Shape(steps=0), "at least 1"),
    ],
)
def test_bad_shapes_are_user_errors(shape: object, message: str) -> None:
    with pytest.raises(cr.UserError, match=message):
        shape.check()  # type: ignore[attr-defined]


def test_step_losses_sum_in_float32_then_divide_as_the_baseline_logs() -> None:
    micro = [6.9, 7.1, 6.95, 7.05, 1.0e-8, 3.0, 2.0, 1.0]
    total = torch.zeros(())
    for v in micro:
        total += torch.tensor(v)
    (got,) = cr.step_losses(micro, 8)
    assert got == total.item() / 8
    assert got != sum(micro) / 8  # a float64 sum is not what either side logs
    with pytest.raises(ValueError, match="not a whole number"):
        cr.step_losses(micro[:5], 8)


def test_compare_states_reports_bits_dtype_and_max_difference() -> None:
    a = {
        "w": torch.tensor([1.0, 2.0]),
        "b": torch.tensor([1.0, 2.0]),
        "c": torch.tensor([3.0]),
        "only_a": torch.zeros(1),
    }
    b = {
        "w": torch.tensor([1.0, 2.0]),
        "b": torch.tensor([1.0, 2.0], dtype=torch.bfloat16),
        "c": torch.tensor([3.0 + 2**-20]),
        "only_b": torch.zeros(1),
    }
    diffs, only_a, only_b = cr.compare_states(a, b)
    by = {d.name: d for d in diffs}
    assert by["w"].identical and by["w"].max_abs_diff == 0.0
    assert not by["b"].identical and by["b"].max_abs_diff == 0.0  # same values, other dtype
    assert not by["c"].identical and by["c"].max_abs_diff == 2**-20
    assert only_a == ["only_a"] and only_b == ["only_b"]
    shape_diff, _, _ = cr.compare_states({"x": torch.zeros(2)}, {"x": torch.zeros(3)})
    assert not shape_diff[0].identical and shape_diff[0].max_abs_diff == float("inf")


def _finished_run(tmp_path: Path, sets: list[str], seed: int) -> Path:
    from harness.config import parse_override

    tables: dict[str, dict[str, object]] = {"run": {"seed": seed}}
    for key, value in (parse_override(s) for s in sets):
        section, _, name = key.partition(".")
        tables.setdefault(section, {})[name] = value
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.json").write_text(json.dumps({"format": "pg-config", "tables": tables}))
    for name in ("metrics.jsonl", "state.safetensors", "artifact.pgolf"):
        (run / name).write_bytes(b"")
    return run


def test_a_finished_baseline_run_is_reused_only_with_the_same_settings(tmp_path: Path) -> None:
    shape = cr.Shape(steps=12)
    sets = cr.baseline_sets(shape, threads=1)
    run = _finished_run(tmp_path, sets, shape.seed)
    cr.check_baseline_run(run, shape, sets)  # the same settings: accepted
    with pytest.raises(cr.UserError, match=r"train.iterations is 12, this comparison needs 30"):
        cr.check_baseline_run(run, cr.Shape(steps=30), cr.baseline_sets(cr.Shape(steps=30), threads=1))
    with pytest.raises(cr.UserError, match=r"run.seed is 1337, this comparison needs 7"):
        cr.check_baseline_run(run, cr.Shape(steps=12, seed=7), sets)
    (run / "state.safetensors").unlink()
    with pytest.raises(cr.UserError, match="no state.safetensors"):
        cr.check_baseline_run(run, shape, sets)
