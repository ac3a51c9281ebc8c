"""What each sealed process actually loads, asked of a fresh interpreter (sys.modules after its imports).

The architecture test reads import statements; this one runs them, so a dependency pulled in by a
library or an `__init__` cannot slip past it. Run by hand to see the whole list:
    python -m tests.unit.test_import_closure scorer|rank|worker
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.conftest import REPO

WORKER_MODULES = sorted(
    f"scoring.worker.{p.stem}"
    for p in (REPO / "scoring" / "worker").glob("*.py")
    if p.stem not in ("__main__", "__init__")
)
"""Every module of the worker side: the model worker (`scoring.worker.process`, what `python -m scoring.worker`
runs) and every other confined child's entry (decode, generate, build_check), with what they load later."""

ENTRY_POINTS: dict[str, str | list[str]] = {
    "scorer": "scoring.score.cli",  # what `python -m scoring score` imports before it parses its arguments
    "rank": "harness.train.rank",  # what torchrun runs in each rank, inside the training sandbox
    "worker": ["scoring.worker", *WORKER_MODULES],  # __main__ left out: importing it starts a worker
}


def loaded_modules(entry: str | list[str]) -> list[str]:
    entries = [entry] if isinstance(entry, str) else entry
    code = (
        f"import importlib, json, sys; [importlib.import_module(m) for m in {entries!r}]; "
        "print(json.dumps(sorted(sys.modules)))"
    )
    r = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=120, check=True
    )
    return json.loads(r.stdout)


def project(mods: list[str]) -> list[str]:
    return [m for m in mods if m.split(".")[0] in ("harness", "scoring", "data", "isolation")]


def test_the_scorer_loads_no_records_training_or_scipy():
    mods = loaded_modules(ENTRY_POINTS["scorer"])
    own = project(mods)
    harness = [m for m in own if m.startswith("harness")]
    assert set(harness) <= {"harness", "harness.api"}, harness
    assert not [m for m in mods if m == "scipy" or m.startswith("scipy.")], "the scorer process imports scipy"
    assert not [m for m in mods if m == "wandb" or m.startswith("wandb.")]
    assert (
        "scoring.score.scorer" in own and "scoring.score.evaluate" in own
    )  # the check sees the real closure


def test_a_rank_loads_no_scorer_and_no_records():
    own = project(loaded_modules(ENTRY_POINTS["rank"]))
    assert not [m for m in own if m.startswith("scoring")], own
    assert not [m for m in own if m.startswith(("harness.records", "harness.run", "harness.bench"))], own
    assert "harness.train.clock" in own and "harness.train.rank" in own


def test_the_worker_side_loads_no_scorer_no_training_and_no_records():
    mods = loaded_modules(ENTRY_POINTS["worker"])
    own = project(mods)
    assert not [m for m in own if m.startswith("scoring.score")], own
    assert set(m for m in own if m.startswith("harness")) <= {"harness", "harness.api"}, own
    assert not [m for m in mods if m == "wandb" or m.startswith("wandb.")]
    assert {"scoring.worker.process", "scoring.worker.generate", "scoring.worker.build_check"} <= set(own)


if __name__ == "__main__":
    which = sys.argv[1] if len(sys.argv) > 1 else "scorer"
    if which not in ENTRY_POINTS:
        pytest.exit(f"choose one of {sorted(ENTRY_POINTS)}")
    mods = loaded_modules(ENTRY_POINTS[which])
    print(f"{which} ({ENTRY_POINTS[which]}): {len(mods)} modules, of the project:")
    print("\n".join(f"  {m}" for m in project(mods)))


def test_the_config_and_the_contract_load_without_torch():
    """harness.config (every section's settings) and harness.api (the contract) import no torch and no numpy:
    a config typo is refused before the heavy imports (issue 24: 4.4 s on a busy machine, now well under one)."""
    for entry in ("harness.config", "harness.api", "harness.submission"):
        mods = loaded_modules(entry)
        heavy = [m for m in mods if m.split(".")[0] in ("torch", "numpy", "scipy")]
        assert not heavy, f"{entry} loads {heavy[:5]}"


@pytest.mark.parametrize(
    ("override", "said"),
    [
        ("trian.lr=1", "unknown section 'trian' in 'trian.lr' (did you mean train?)"),
        ("pack.codec='int6_zstd'", "pack.codec = 'int6_zstd' is not a codec; allowed: int8_zlib"),
        ("pack.codec='int6_zstd22:mlp=int5'", "takes no role table (only mixed_* codecs do)"),
        ("pack.codec='mixed_zstd22:mlp=int9'", "mlp='int9' is not a scheme"),
    ],
    ids=["key", "codec-name", "codec-table-on-int6", "codec-scheme"],
)
def test_a_mistyped_run_is_refused_before_torch_loads(override: str, said: str):
    code = (
        "import sys; from harness.cli import main; "
        f"rc = main(['run', 'baselines/naive_baseline', '--set', {override!r}]); "
        "print(rc, 'torch' in sys.modules)"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert r.stdout.split() == ["2", "False"], r.stdout + r.stderr
    assert said in r.stderr, r.stderr


def test_the_torch_free_codec_names_are_the_codecs_built():
    """scoring/artifact/codec_names.py (what the config checks) names exactly the codecs scoring/artifact/codecs
    builds, and its grammar accepts exactly the specs the codecs parse."""
    from scoring.artifact.codec_names import BUILTIN_NAMES, COMPRESSOR_NAMES, check_codec_spec
    from scoring.artifact.codecs import CODECS, get_codec
    from scoring.artifact.codecs.compress import COMPRESSORS

    assert tuple(COMPRESSORS) == COMPRESSOR_NAMES
    assert set(CODECS) == BUILTIN_NAMES
    for spec in ("mixed_lzma9:mlp=int5,attention=keep", "mixed_zlib9_shuffle:small=keep", "int5_brotli11"):
        check_codec_spec(spec)
        assert get_codec(spec).name == spec.partition(":")[0]
    for bad in ("int6_zstd22:mlp=int5", "int4_zlib9", "mixed_zlib9:small=int8", "int8_zlib:mlp=int5"):
        with pytest.raises(ValueError):
            check_codec_spec(bad)
        with pytest.raises(ValueError):
            get_codec(bad)
