"""Attacks on the data and byte-accounting rules, as a competitor would make them (docs/RULES.md "bpb's bytes",
"No validation document in training", "A tokenizer's proof"). Each test is one attack: it asserts that the
harness refuses or flags it, with a control where the honest case must still pass."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from data.build import build_dataset
from data.canonical import (
    VAL_BYTES_NAME,
    CanonicalBytesError,
    load_canonical_bytes,
    read_val_bytes,
    write_val_bytes,
)
from data.io import sha256_file
from data.manifest import MANIFEST_NAME, load_manifest
from data.shards import read_split
from data.verify import verify_dataset
from tests.fixtures.texts import prose_documents

# ---- val_bytes.bin: counts inflated consistently, the manifest's sha256 and totals fixed ----


@pytest.fixture()
def small(tmp_path: Path) -> Path:
    return build_dataset(
        prose_documents(20, 1500), tmp_path / "s", val_docs=6, tokenizer="byte260", workers=1
    )


def _inflate_counts(ds: Path, extra: int) -> None:
    """Every validation token but the BOS counts `extra` bytes more, every document's total to match, and the
    manifest's sha256 and totals are rewritten: every internal check of the file still holds."""
    vb = read_val_bytes(ds / VAL_BYTES_NAME)
    toks = read_split(ds, "val")
    tb = vb.token_bytes.astype(np.int64).copy()
    text = toks != load_manifest(ds).bos_id
    tb[text] += extra
    starts = np.flatnonzero(~text)
    db = np.add.reduceat(tb, starts)
    write_val_bytes(ds / VAL_BYTES_NAME, tb, db)
    m = json.loads((ds / MANIFEST_NAME).read_text())
    block = m["canonical"]
    block["val_bytes"]["sha256"] = sha256_file(ds / VAL_BYTES_NAME)
    block["val_bytes"]["total_bytes"] = int(db.sum())
    block["canonical_bytes"]["val"] = int(db.sum())
    (ds / MANIFEST_NAME).write_text(json.dumps(m))


def _counts(ds: Path) -> np.ndarray:
    m = load_manifest(ds)
    c = load_canonical_bytes(ds, m.raw, read_split(ds, "val"), m.vocab_size, m.bos_id)
    assert c is not None
    return c.counts


def test_control_an_honest_dataset_verifies_and_loads(small):
    assert verify_dataset(small).ok
    assert int(_counts(small).sum()) == load_manifest(small).raw["canonical"]["val_bytes"]["total_bytes"]


def test_counts_inflated_with_the_manifest_rewritten_are_refused(small):
    """HOLE (before the fix): doubling every token's count (and each document's total), with the manifest's
    sha256 rewritten, passed `pgolf data verify` and the scorer's loader: bpb divided by twice the bytes."""
    honest = int(_counts(small).sum())
    _inflate_counts(small, 1)
    report = verify_dataset(small)
    assert not report.ok, "pgolf data verify passed byte counts that are not what the tokens spell"
    assert any("spell" in p for p in report.problems()), report.problems()
    with pytest.raises(CanonicalBytesError, match="spell"):
        assert int(_counts(small).sum()) == 2 * honest  # what the scorer divided by, had it loaded
