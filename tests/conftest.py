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
