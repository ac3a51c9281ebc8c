"""Shared, hermetic fixtures: tiny datasets built in-process, the reference data when present.

No network. Tests that need ../shared/data skip with a reason when it is absent.
"""

from __future__ import annotations

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = (REPO.parent / "shared" / "data").resolve()
SP1024 = SHARED_DATA / "tokenizers" / "fineweb_1024_bpe.model"
SP8192 = SHARED_DATA / "tokenizers" / "fineweb_8192_bpe.model"
SAMPLE_JSONL = SHARED_DATA / "fineweb" / "sample.jsonl"
BASELINE = REPO / "baselines" / "naive_baseline"


def is_own_install(path: str) -> bool:
    """The project's own checkout or its Python environment: readable by design, wherever they live
    (a CI clone may sit inside the temp folder)."""
    import os
    import sys

    own = [os.path.realpath(REPO), os.path.realpath(sys.prefix)]
    return any(path == o or path.startswith(o + "/") for o in own)


def require_shared(*paths: Path) -> None:
    missing = [str(p) for p in paths if not p.is_file()]
    if missing:
        pytest.skip(
            f"reference data not present (expected beside the repo at ../shared/data): {', '.join(missing)}"
        )


@pytest.fixture(scope="session")
def tiny_dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """byte260 dataset of 40 embedded documents (the first 4 are validation)."""
    from data.build import build_dataset
    from data.embedded import embedded_documents

    out = tmp_path_factory.mktemp("tiny_ds")
    docs = [d[:4000] for d in embedded_documents()[:40]]
    return build_dataset(docs, out, val_docs=4, tokenizer="byte260", shard_tokens=50_000)


@pytest.fixture(scope="session")
def sp_dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A vocab-1024 SentencePiece dataset of the embedded corpus (what the baseline's presets expect)."""
    from data.embedded import ensure_embedded_dataset

    return ensure_embedded_dataset(tmp_path_factory.mktemp("embedded"))


CHEAP_SHARED_FIXTURES = frozenset({"_one_thread"})
"""Module-scoped fixtures that cost nothing to make twice (a thread count), so they group no file."""


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Two workers take tests one by one (`--dist loadgroup` in pyproject.toml), so the long files spread
    over both cores; a file whose tests share a module- or class-scoped fixture (a trained run, a built
    dataset) stays on one worker as a group, so that fixture is made once."""
    for item in items:
        info = getattr(item, "_fixtureinfo", None)
        if info is None:
            continue
        shared = any(
            d.scope in ("module", "class")
            for name, defs in info.name2fixturedefs.items()
            if name not in CHEAP_SHARED_FIXTURES
            for d in defs
        )
        if shared:
            item.add_marker(pytest.mark.xdist_group(item.nodeid.split("::", 1)[0]))
