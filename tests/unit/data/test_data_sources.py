"""Document sources: jsonl, parquet, text and the `datasets` streaming path give the same documents in
the same order; bad inputs are named. Hermetic: the documents are CPython help topics."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from data.build import build_dataset, selection_sha256
from data.io import read_json
from data.sources import DocumentSource, source_from_path
from tests.fixtures.texts import prose_documents

N_DOCS = 24


@pytest.fixture(scope="module")
def docs() -> list[str]:
    out = prose_documents(N_DOCS, 3000)
    out[3] = "paragraph one\n\nparagraph two, with a blank line between\n\n\u00e9\u6f22\U0001f600"
    return out


@pytest.fixture(scope="module")
def files(tmp_path_factory, docs):
    root = tmp_path_factory.mktemp("sources")
    jl = root / "docs.jsonl"
    jl.write_text(
        "".join(json.dumps({"text": d, "id": i}) + "\n" for i, d in enumerate(docs)), encoding="utf-8"
    )
    pdir = root / "parquet"
    pdir.mkdir()
    half = len(docs) // 2  # two files: order is sorted file name, then row
    pq.write_table(pa.table({"text": docs[:half]}), pdir / "part-000.parquet", row_group_size=5)
    pq.write_table(pa.table({"text": docs[half:]}), pdir / "part-001.parquet", row_group_size=5)
    tdir = root / "text"
    tdir.mkdir()
    for i, d in enumerate(docs):
        (tdir / f"doc_{i:04d}.txt").write_bytes(d.encode("utf-8"))
    return {"jsonl": jl, "parquet": pdir, "text": tdir, "one_parquet": pdir / "part-000.parquet"}


@pytest.mark.parametrize("kind", ["jsonl", "parquet", "text"])
def test_local_sources_yield_the_documents_in_order(files, docs, kind):
    src = source_from_path(files[kind])
    assert src.kind == kind
    assert list(src) == docs
    assert list(src) == docs  # re-iterable: a second pass gives the same
    assert list(source_from_path(files[kind], max_docs=5)) == docs[:5]


def test_a_text_file_is_one_document_blank_lines_included(files, docs):
    assert list(source_from_path(files["text"] / "doc_0003.txt")) == [docs[3]]


def test_hf_datasets_streaming_path_reads_the_same_documents(files, docs):
    """The hub code path (datasets.load_dataset(..., streaming=True)), fed a local file."""
    pytest.importorskip("datasets")
    for builder, data_files in (("json", files["jsonl"]), ("parquet", files["one_parquet"])):
        src = DocumentSource(kind="hf", path=builder, data_files=str(data_files), max_docs=7)
        want = docs[:7]
        assert list(src) == want
        assert src.describe()["dataset"] == builder


def test_hf_source_that_cannot_be_opened_is_named(tmp_path):
    pytest.importorskip("datasets")
    src = DocumentSource(kind="hf", path="json", data_files=str(tmp_path / "absent.jsonl"))
    with pytest.raises(FileNotFoundError, match=r"cannot open dataset 'json' .*HINT"):
        list(src)


def test_builds_from_every_source_record_the_same_selection(tmp_path, files, docs):
    shas = set()
    for kind in ("jsonl", "parquet", "text"):
        src = source_from_path(files[kind])
        out = build_dataset(
            src,
            tmp_path / kind,
            val_docs=4,
            tokenizer="byte260",
            shard_tokens=10_000,
            workers=1,
            source=src.describe(),
        )
        m = read_json(out / "manifest.json")
        assert m["source"]["kind"] == kind and m["selection"]["docs"] == len(docs)
        shas.add(m["selection_sha256"])
    assert shas == {selection_sha256(docs)}


def test_bad_inputs_are_named(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "ok"}\n{"body": "no text"}\n', encoding="utf-8")
    with pytest.raises(ValueError, match=r"bad\.jsonl:2: .*'text'"):
        list(source_from_path(bad))
    with pytest.raises(ValueError, match=r"bad\.jsonl:1: .*'txt' is"):
        bad.write_text('{"txt": 5}\n', encoding="utf-8")
        list(source_from_path(bad, field="txt"))
    with pytest.raises(ValueError, match="unknown document file type"):
        (tmp_path / "x.csv").write_text("a", encoding="utf-8")
        source_from_path(tmp_path / "x.csv")
    with pytest.raises(FileNotFoundError, match="nope.jsonl"):
        source_from_path(tmp_path / "nope.jsonl")
    pq.write_table(pa.table({"body": ["x"]}), tmp_path / "p.parquet")
    with pytest.raises(ValueError, match="no column 'text'"):
        list(source_from_path(tmp_path / "p.parquet"))
