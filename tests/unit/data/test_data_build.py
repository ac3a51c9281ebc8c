"""`pgolf data build` on real FineWeb text with the official sp1024 tokenizer, and byte260 round trips.

The sp1024 build is of the whole of ../shared/data/fineweb/sample.jsonl (2,648 documents, 17.8 MB;
its first 500 documents validation, 1,000,000-token shards so documents cross shard boundaries),
tokenized by 2 worker processes; every document is then compared with BOS + the tokenizer's own
encoding of its text. Tests needing ../shared/data skip with the reason when it is absent.
"""

from __future__ import annotations

import shutil

import numpy as np
import pytest

from data.build import EncodeBatch, build_dataset, encode_ordered, read_jsonl_texts, selection_sha256
from data.cli import main as data_main
from data.io import read_json
from data.shards import HEADER_BYTES, read_split, shard_name
from data.sources import source_from_path
from data.tokenizer import (
    BOS_ID,
    BYTE260_OFFSET,
    SentencePieceTokenizer,
    load_tokenizer,
    train_sentencepiece,
    write_byte260,
)
from data.verify import verify_dataset
from tests.conftest import SAMPLE_JSONL, SP1024, require_shared
from tests.fixtures.texts import prose_documents

SAMPLE_VAL_DOCS = 500


def split_docs(tokens: np.ndarray, bos_id: int) -> list[np.ndarray]:
    """Documents of a BOS-delimited stream (each without its BOS)."""
    starts = np.flatnonzero(tokens == bos_id)
    assert starts.size and starts[0] == 0, "a split must start with BOS"
    return np.split(tokens, starts[1:])


@pytest.fixture(scope="module")
def sample_texts() -> list[str]:
    require_shared(SAMPLE_JSONL, SP1024)
    return read_jsonl_texts(SAMPLE_JSONL)


@pytest.fixture(scope="module")
def sp_build(tmp_path_factory, sample_texts):
    src = source_from_path(SAMPLE_JSONL)
    out = tmp_path_factory.mktemp("sp1024") / "ds"
    return build_dataset(
        src,
        out,
        val_docs=SAMPLE_VAL_DOCS,
        tokenizer=SP1024,
        shard_tokens=1_000_000,
        workers=2,
        source=src.describe(),
    )


def test_every_document_is_bos_plus_its_own_encoding(sp_build, sample_texts):
    m = read_json(sp_build / "manifest.json")
    tok = SentencePieceTokenizer(sp_build / m["tokenizer"]["file"])
    assert m["tokenizer"]["sha256"] == "4f5e8adb109c66b4886963bc75a7befd73bda36d27fd7102df8e9e66503b0e2a"
    got = split_docs(read_split(sp_build, "val"), tok.bos_id) + split_docs(
        read_split(sp_build, "train"), tok.bos_id
    )
    assert len(got) == len(sample_texts) == m["selection"]["docs"]
    want = tok.sp.encode(sample_texts, out_type=int)  # the tokenizer's own encoding, one list per document
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        assert g[0] == BOS_ID and g[1:].tolist() == w, f"document {i} differs"
    assert sum(e["docs"] for e in m["shards"]) == len(sample_texts)
    assert sum(1 for e in m["shards"] if e["split"] == "train") >= 5  # documents do cross shard boundaries


def test_validation_and_training_documents_are_disjoint(sp_build, sample_texts):
    m = read_json(sp_build / "manifest.json")
    assert m["docs"] == {"val": SAMPLE_VAL_DOCS, "train": len(sample_texts) - SAMPLE_VAL_DOCS}
    assert m["selection_sha256"] == selection_sha256(sample_texts)
    val = {d.tobytes() for d in split_docs(read_split(sp_build, "val"), BOS_ID)}
    train = {d.tobytes() for d in split_docs(read_split(sp_build, "train"), BOS_ID)}
    assert len(val) == SAMPLE_VAL_DOCS and not val & train
    assert not set(sample_texts[:SAMPLE_VAL_DOCS]) & set(sample_texts[SAMPLE_VAL_DOCS:])
    counts = np.bincount(read_split(sp_build, "train"), minlength=1024)
    assert counts.tolist() == m["train_unigram_counts"]


def test_verify_passes_and_catches_a_flipped_byte(sp_build, tmp_path, capsys):
    assert data_main(["verify", str(sp_build)]) == 0
    copy = shutil.copytree(sp_build, tmp_path / "copy")
    target = copy / shard_name("train", 3)
    b = bytearray(target.read_bytes())
    b[HEADER_BYTES + 777] ^= 0x40
    target.write_bytes(bytes(b))
    capsys.readouterr()
    assert data_main(["verify", str(copy)]) == 1
    out = capsys.readouterr().out
    assert "fineweb_train_000003.bin: sha256" in out and "1 problem(s)" in out


def test_byte260_round_trip_gives_back_the_utf8_documents_exactly(tmp_path, sample_texts):
    out = build_dataset(
        sample_texts, tmp_path / "b260", val_docs=100, tokenizer="byte260", shard_tokens=3_000_000, workers=2
    )
    docs = split_docs(read_split(out, "val"), BOS_ID) + split_docs(read_split(out, "train"), BOS_ID)
    assert len(docs) == len(sample_texts)
    for d, text in zip(docs, sample_texts, strict=True):
        assert (d[1:] - BYTE260_OFFSET).astype(np.uint8).tobytes() == text.encode("utf-8")
    assert verify_dataset(out).ok


def test_byte260_round_trip_hermetic(tmp_path):
    """The same without ../shared/data, on CPython help topics plus hostile text."""
    texts = prose_documents(40, 5000) + ["", "\x00nul", "\u00e9\u6f22\U0001f600\r\n\t", "  x  "]
    out = build_dataset(texts, tmp_path / "b", val_docs=5, tokenizer="byte260", shard_tokens=7_000, workers=2)
    docs = split_docs(read_split(out, "val"), BOS_ID) + split_docs(read_split(out, "train"), BOS_ID)
    assert [(d[1:] - BYTE260_OFFSET).astype(np.uint8).tobytes().decode("utf-8") for d in docs] == texts


def test_parallel_encoding_is_identical_to_sequential(tmp_path):
    """The worker pool returns batches in submission order with the same tokens as one process."""
    texts = prose_documents(60, 3000)
    tok_path = tmp_path / "byte260.json"
    write_byte260(tok_path)

    def run(workers: int) -> list[tuple[str, list[int], list[int]]]:
        batches = (EncodeBatch("train", texts[i : i + 7], 0) for i in range(0, len(texts), 7))
        return [
            (b.texts[0], flat.tolist(), lens.tolist())
            for b, flat, lens in encode_ordered(tok_path, batches, workers)
        ]

    assert run(1) == run(2)
    a = build_dataset(texts, tmp_path / "a", val_docs=6, tokenizer="byte260", shard_tokens=20_000, workers=1)
    b = build_dataset(texts, tmp_path / "b", val_docs=6, tokenizer="byte260", shard_tokens=20_000, workers=2)
    assert (a / "manifest.json").read_bytes() == (b / "manifest.json").read_bytes()


def test_trains_a_tokenizer_of_any_vocab_size_on_training_documents(tmp_path):
    texts = prose_documents(50, 4000)
    out = build_dataset(texts, tmp_path / "v", val_docs=5, vocab_size=400, shard_tokens=50_000, workers=1)
    m = read_json(out / "manifest.json")
    assert m["tokenizer"]["trained_here"] and m["tokenizer"]["vocab_size"] == 400
    tok = load_tokenizer(out / m["tokenizer"]["file"])
    got = split_docs(read_split(out, "train"), tok.bos_id)
    assert [g[1:].tolist() for g in got] == tok.encode(texts[5:])


def test_a_trained_tokenizer_is_the_same_file_in_any_folder_and_thread_count(tmp_path):
    # The trainer spec once recorded SentencePiece's temporary model_prefix path and the thread count:
    # every build's tokenizer differed by those bytes though its pieces and scores were the same.
    texts = prose_documents(40, 3000)
    one = train_sentencepiece(texts, 400, tmp_path / "a" / "t.model", num_threads=1)
    two = train_sentencepiece(texts, 400, tmp_path / "elsewhere" / "t.model", num_threads=2)
    assert one.read_bytes() == two.read_bytes()
    assert b"elsewhere" not in two.read_bytes() and str(tmp_path).encode() not in one.read_bytes()
    a = build_dataset(texts, tmp_path / "x", val_docs=4, vocab_size=400, shard_tokens=50_000, workers=1)
    b = build_dataset(texts, tmp_path / "y", val_docs=4, vocab_size=400, shard_tokens=50_000, workers=2)
    assert (a / "manifest.json").read_bytes() == (b / "manifest.json").read_bytes()


def test_user_errors_are_clear(tmp_path):
    texts = [f"a b c {i}" for i in range(5)]  # distinct: a copy of a validation document is refused
    with pytest.raises(ValueError, match="between 1 and 4"):
        build_dataset(texts, tmp_path / "x", val_docs=5, tokenizer="byte260")
    with pytest.raises(ValueError, match="no training documents left"):
        build_dataset(iter(texts), tmp_path / "y", val_docs=5, tokenizer="byte260", workers=1)
    assert not list((tmp_path / "y").glob("fineweb_*.bin"))
    with pytest.raises(ValueError, match="reads the documents twice"):
        build_dataset(iter(texts), tmp_path / "z", val_docs=1, vocab_size=300)
    build_dataset(texts, tmp_path / "w", val_docs=1, tokenizer="byte260", workers=1)
    with pytest.raises(FileExistsError, match="--overwrite"):
        build_dataset(texts, tmp_path / "w", val_docs=1, tokenizer="byte260", workers=1)
    build_dataset(texts, tmp_path / "w", val_docs=2, tokenizer="byte260", workers=1, overwrite=True)
    assert read_json(tmp_path / "w" / "manifest.json")["docs"] == {"val": 2, "train": 3}


def test_cli_build_from_a_text_folder(tmp_path, capsys):
    folder = tmp_path / "txt"
    folder.mkdir()
    for i, d in enumerate(prose_documents(8)):
        (folder / f"{i:03d}.txt").write_text(d[:1000], encoding="utf-8")
    rc = data_main(
        [
            "build",
            "--docs",
            str(folder),
            "--tokenizer",
            "byte260",
            "--val-docs",
            "2",
            "--out",
            str(tmp_path / "o"),
            "--workers",
            "1",
        ]
    )
    assert rc == 0 and "2 val docs" in capsys.readouterr().out
    assert (
        data_main(["build", "--docs", str(folder), "--tokenizer", "byte260", "--out", str(tmp_path / "o2")])
        == 2
    )
    assert "8 documents and --val-docs is 50000: no training documents left" in capsys.readouterr().err
