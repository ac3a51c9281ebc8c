"""bpb's bytes counted from the documents (data/canonical.py, data/build.py's proof): the official sp1024's
counts equal the reference byte table at every position, every tokenizer of the same documents divides by
the same bytes, a subset counts what it scores, a build whose tokenizer loses text is refused naming the
document and offset, and counts changed after the build are refused by the scorer's loader."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from data.build import TokenizerProofError, build_dataset, encode_documents
from data.canonical import (
    VAL_BYTES_NAME,
    CanonicalBytes,
    CanonicalBytesError,
    load_canonical_bytes,
    read_val_bytes,
    write_val_bytes,
)
from data.io import sha256_file
from data.manifest import MANIFEST_NAME, load_manifest
from data.proof import TRANSFORMS, sp1024_canonical
from data.shards import read_split
from data.tokenizer import BOS_ID, load_tokenizer
from scoring.score.evaluate import EvalConfig, evaluate
from scoring.tracks import FINEWEB_VAL, SP1024_SHA256, DocumentSet, dataset_problem
from tests.conftest import SAMPLE_JSONL, SP1024, SP8192, require_shared
from tests.fixtures.texts import prose_documents


def sample_docs(n: int) -> list[str]:
    require_shared(SAMPLE_JSONL)
    with open(SAMPLE_JSONL, encoding="utf-8") as f:
        return [json.loads(line)["text"] for _, line in zip(range(n), f, strict=False)]


def counts_of(ds: Path) -> CanonicalBytes:
    m = load_manifest(ds)
    c = load_canonical_bytes(ds, m.raw, read_split(ds, "val"), m.vocab_size, m.bos_id)
    assert c is not None
    return c


class Uniform(nn.Module):
    """The same logits everywhere: its nats per target are ln V, whatever the text."""

    def __init__(self, vocab_size: int):
        super().__init__()
        self.vocab_size = vocab_size
        self.dummy = nn.Parameter(torch.zeros(1))

    def forward(self, ids):
        return torch.zeros((*ids.shape, self.vocab_size)) + 0 * self.dummy


# ---- the official tokenizers: nothing changes, and everything agrees ----


@pytest.fixture(scope="module")
def docs() -> list[str]:
    return sample_docs(90)


@pytest.fixture(scope="module")
def built(docs: list[str], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    require_shared(SP1024, SP8192)
    root = tmp_path_factory.mktemp("canonical")
    kw = {"val_docs": 12, "shard_tokens": 40_000, "workers": 2}
    return {
        "sp1024": build_dataset(docs, root / "sp1024", tokenizer=SP1024, **kw),
        "sp8192": build_dataset(docs, root / "sp8192", tokenizer=SP8192, **kw),
        "byte260": build_dataset(docs, root / "byte260", tokenizer="byte260", canonical="sp1024", **kw),
        "case": build_dataset(docs, root / "case", vocab_size=600, transform="case", **kw),
    }


def test_sp1024_tokens_are_unchanged_and_its_counts_are_the_reference_table(docs, built):
    """The official sp1024 tokenizes the canonical text to exactly the tokens of the raw document (its own
    normaliser is the canonical text), and the count at every validation position equals the reference's byte
    table there (base bytes + a leading space unless after BOS), so every sp1024 score is what it was."""
    ds = built["sp1024"]
    tok = load_tokenizer(ds / load_manifest(ds).raw["tokenizer"]["file"])
    raw_flat, _ = encode_documents(tok, docs[:12])
    val = read_split(ds, "val")
    assert np.array_equal(val, raw_flat)
    c = counts_of(ds)
    table = tok.byte_table()
    assert np.array_equal(
        c.counts[1:], table.token_bytes(val[:-1].astype(np.int64), val[1:].astype(np.int64))
    )
    assert c.counts[0] == 0


def test_every_tokenizer_of_the_same_documents_divides_by_the_same_bytes(docs, built):
    """sp1024, sp8192, byte260 on the sp1024 canonical text and a case-transformed vocabulary trained here:
    each dataset's counts sum to the UTF-8 bytes of the canonical texts (computed here, independently), and a
    scored pass over every target divides by exactly that; bpb of a uniform model is then
    Σ ln V / (ln 2 · bytes) to 1e-12."""
    want = sum(len(t.encode("utf-8")) for t in sp1024_canonical(docs[:12]))
    for name, ds in built.items():
        c = counts_of(ds)
        assert int(c.counts.sum()) == want, name
        m = load_manifest(ds)
        assert m.raw["canonical"]["val_bytes"]["total_bytes"] == want
        toks = read_split(ds, "val")
        cfg = EvalConfig(mode="sliding", seq_len=256, batch_seqs=16, stride=224)
        res = evaluate(Uniform(m.vocab_size), toks, c, cfg, torch.device("cpu"))
        assert res.sums.bytes == want, name  # sliding scores every target from position 1 on
        expect_bpb = (toks.size - 1) * math.log(m.vocab_size) / (math.log(2) * want)
        assert abs(res.sums.val_bpb - expect_bpb) < 1e-12, name
    assert load_manifest(built["case"]).raw["canonical"]["transform"] == "case"


def test_a_subset_counts_exactly_the_bytes_its_scored_tokens_cover(built):
    ds = built["sp8192"]
    c, toks, V = counts_of(ds), read_split(ds, "val"), load_manifest(ds).vocab_size
    for cfg, covered in (
        (EvalConfig(mode="sliding", seq_len=128, batch_seqs=8, stride=32, max_tokens=3_000), slice(1, 3_001)),
        (EvalConfig(mode="standard", seq_len=128, batch_seqs=8, max_tokens=3_000), slice(1, 23 * 128 + 1)),
    ):
        res = evaluate(Uniform(V), toks, c, cfg, torch.device("cpu"))
        assert res.sums.bytes == int(c.counts[covered].sum())


# ---- the build refuses what loses text ----


class DropsQ:
    """A hostile "reversible" transform: it drops every 'q' and cannot put it back."""

    name = "drops_q"
    markers: tuple[str, ...] = ()

    def encode_text(self, text: str) -> str:
        return text.replace("q", "")

    def decode_text(self, text: str) -> str:
        return text


def test_a_transform_that_loses_a_character_refuses_the_build_with_document_and_offset(tmp_path, monkeypatch):
    texts = prose_documents(12, 2000)
    texts[3] = "The quiet one"  # the first document with a 'q' is validation document 3, the 'q' at byte 4
    for i in range(3):
        texts[i] = texts[i].replace("q", "k")
    monkeypatch.setitem(TRANSFORMS, "drops_q", DropsQ)
    with pytest.raises(TokenizerProofError) as e:
        build_dataset(texts, tmp_path / "d", val_docs=5, tokenizer="byte260", transform="drops_q", workers=1)
    msg = str(e.value)
    assert "\n" not in msg
    assert "val document 3 (source index)" in msg and "at byte 4" in msg
    assert "b'The quiet one'" in msg and "b'The uiet one'" in msg
    assert not list((tmp_path / "d").glob("fineweb_*")) and not (tmp_path / "d" / MANIFEST_NAME).exists()
    assert not (tmp_path / "d" / VAL_BYTES_NAME).exists()


def test_a_tokenizer_without_byte_fallback_refuses_the_build(tmp_path):
    """A SentencePiece trained without byte fallback turns an unseen character into <unk>: decoding gives
    U+2047 instead, and the build names the training document and the offset (training documents are proved
    too)."""
    spm = pytest.importorskip("sentencepiece")
    texts = prose_documents(40, 3000)
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(texts),
        model_prefix=str(tmp_path / "nofb"),
        model_type="bpe",
        vocab_size=300,
        byte_fallback=False,
        character_coverage=1.0,
        normalization_rule_name="nmt_nfkc",
        add_dummy_prefix=False,
        pad_id=0,
        bos_id=1,
        eos_id=2,
        unk_id=3,
        minloglevel=2,
    )
    texts[20] = "plain text then \u4e16 here"
    with pytest.raises(TokenizerProofError, match=r"train document 20 \(source index\).*at byte 16"):
        build_dataset(texts, tmp_path / "d", val_docs=5, tokenizer=tmp_path / "nofb.model", workers=1)


# ---- counts that do not belong to the data are refused when loaded ----


@pytest.fixture()
def small(tmp_path: Path) -> Path:
    texts = prose_documents(20, 1500)
    return build_dataset(texts, tmp_path / "s", val_docs=6, tokenizer="byte260", workers=1)


def _rewrite(ds: Path, token_bytes: np.ndarray, doc_bytes: np.ndarray, *, fix_manifest: bool) -> None:
    write_val_bytes(ds / VAL_BYTES_NAME, token_bytes, doc_bytes)
    if fix_manifest:  # as one who can also edit the manifest would
        m = json.loads((ds / MANIFEST_NAME).read_text())
        m["canonical"]["val_bytes"]["sha256"] = sha256_file(ds / VAL_BYTES_NAME)
        (ds / MANIFEST_NAME).write_text(json.dumps(m))


@pytest.mark.parametrize(
    "tamper,match",
    [
        ("one_more_byte", "sha256 differs from the manifest's"),
        ("moved_between_documents", "tokens count"),
        ("bos_counted", "BOS of document 2 is counted as text"),
        ("truncated", "byte counts for"),
    ],
)
def test_counts_changed_after_the_build_are_refused(small, tamper, match):
    vb = read_val_bytes(small / VAL_BYTES_NAME)
    tb, db = vb.token_bytes.copy(), vb.doc_bytes.copy()
    toks = read_split(small, "val")
    bos = np.flatnonzero(toks == BOS_ID)
    if tamper == "one_more_byte":
        tb[5] += 1
        _rewrite(small, tb, db, fix_manifest=False)
    elif tamper == "moved_between_documents":
        tb[bos[1] + 1] += 1
        tb[bos[1] - 1] -= 1
        _rewrite(small, tb, db, fix_manifest=True)
    elif tamper == "bos_counted":
        tb[bos[2]] = 1
        tb[bos[2] + 1] -= 1
        _rewrite(small, tb, db, fix_manifest=True)
    else:
        _rewrite(small, tb[:-1], db, fix_manifest=True)
    with pytest.raises(CanonicalBytesError, match=match):
        counts_of(small)


def test_a_dataset_without_counts_is_scored_with_the_table_and_the_view_carries_them(small, tmp_path):
    from data.manifest import make_split_view

    view = make_split_view(small, tmp_path / "view", "val")
    assert (view / VAL_BYTES_NAME).is_file() and np.array_equal(
        counts_of(view).counts, counts_of(small).counts
    )
    assert not (make_split_view(small, tmp_path / "tv", "train") / VAL_BYTES_NAME).exists()
    old = tmp_path / "old"
    shutil.copytree(small, old)
    m = json.loads((old / MANIFEST_NAME).read_text())
    del m["canonical"]
    m["format_version"] = 2
    (old / MANIFEST_NAME).write_text(json.dumps(m))
    ml = load_manifest(old)
    assert load_canonical_bytes(old, ml.raw, read_split(old, "val"), ml.vocab_size, ml.bos_id) is None


# ---- a record track's documents ----


def _identity(**kw):
    base = {
        "canonical": "sp1024",
        "val_docs": 50_000,
        "val_text_sha256": "ab" * 32,
        "tokenizer_sha256": SP1024_SHA256,
        "val_tokens": 62_021_633,
        "val_only_pieces": 0,
    }
    return {**base, **kw}


@pytest.mark.parametrize(
    "change,says",
    [
        ({"canonical": None}, "no canonical byte counts"),
        ({"canonical": "raw"}, "canonical text is 'raw'"),
        ({"val_docs": 400}, "has 400 documents"),
        ({"val_tokens": 62_021_632 - 1024}, "the challenge's logs give 62,021,632"),
        ({"val_only_pieces": 65}, "65 pieces of 4 bytes or more that the validation split uses"),
        ({"val_only_pieces": None}, "records no count of the pieces its validation split alone uses"),
    ],
)
def test_a_dataset_that_is_not_the_official_split_is_named(change, says):
    assert dataset_problem(FINEWEB_VAL, _identity()) is None
    problem = dataset_problem(FINEWEB_VAL, _identity(**change))
    assert problem is not None and says in problem


def test_a_pinned_text_hash_is_compared():
    pinned = DocumentSet(name="pinned", docs=50_000, canonical="sp1024", text_sha256="cd" * 32)
    assert dataset_problem(pinned, _identity(val_text_sha256="cd" * 32)) is None
    problem = dataset_problem(pinned, _identity())
    assert problem is not None and "hash to abababababababab" in problem


def test_the_built_split_is_named_by_what_differs(built):
    from harness.run.datacheck import data_identity, official_data_problem
    from scoring.tracks import TRACKS

    for ds in built.values():
        problem = official_data_problem(TRACKS["cpu_10min_16mb"], data_identity(load_manifest(ds)))
        assert problem is not None and "has 12 documents; the official validation split" in problem
        assert official_data_problem(TRACKS["smoke"], data_identity(load_manifest(ds))) is None


def test_shards_built_elsewhere_are_proved_against_their_documents(small, tmp_path):
    """`pgolf data prove`: a folder without counts (as downloaded) gets the very counts its build would have
    written, from its validation documents; documents out of order are refused, naming the first that differs."""
    from data.build import prove_dataset

    texts = prose_documents(20, 1500)
    want = read_val_bytes(small / VAL_BYTES_NAME)
    m = json.loads((small / MANIFEST_NAME).read_text())
    for name in ("canonical", "split_sha256"):
        del m[name]
    m["format_version"] = 1
    (small / MANIFEST_NAME).write_text(json.dumps(m))
    (small / VAL_BYTES_NAME).unlink()
    with pytest.raises(TokenizerProofError, match="validation document 1 tokenizes to other tokens"):
        prove_dataset(small, [texts[0], texts[2], texts[1], *texts[3:]], workers=1)
    assert not (small / VAL_BYTES_NAME).exists()
    block = prove_dataset(small, texts, workers=1)
    got = read_val_bytes(small / VAL_BYTES_NAME)
    assert np.array_equal(got.token_bytes, want.token_bytes) and np.array_equal(got.doc_bytes, want.doc_bytes)
    assert block["text"] == "raw" and load_manifest(small).format_version == 3
    assert np.array_equal(counts_of(small).counts, want.token_bytes.astype(np.int64))


def test_documents_beyond_the_shards_are_refused_in_one_line(small):
    """More documents than the shards hold (their tokens run past the end of the validation split): named,
    not an IndexError."""
    from data.build import prove_dataset

    texts = prose_documents(20, 1500)
    m = json.loads((small / MANIFEST_NAME).read_text())
    m["docs"]["val"] = 7  # one more than the shards hold
    (small / MANIFEST_NAME).write_text(json.dumps(m))
    with pytest.raises(TokenizerProofError, match="validation document 6 tokenizes to other tokens"):
        prove_dataset(small, texts, workers=1)
