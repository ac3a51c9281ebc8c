"""A tokenizer's proof (data/proof.py): the honest tokenizers pass on real documents; each
hostile one is refused in one line naming the first failing document and the byte offset; a declared
reversible transform (the reference case transform) passes, a broken one is refused."""

from __future__ import annotations

import itertools
import json
import unicodedata
import zlib
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest

from data.proof import (
    CaseTransform,
    TransformedTokenizer,
    prove_tokenizer,
    sp1024_canonical,
)
from data.tokenizer import SPACE_MARK, ByteTable, ByteTokenizer, SentencePieceTokenizer
from harness.cli import main as pgolf
from tests.conftest import SAMPLE_JSONL, SP1024, SP8192, require_shared


def sample_docs(n: int, chars: int | None = None) -> list[str]:
    """The first n documents of sample.jsonl (never the holdout), cut to `chars` characters."""
    require_shared(SAMPLE_JSONL)
    with open(SAMPLE_JSONL, encoding="utf-8") as f:
        docs = [json.loads(line)["text"] for line in itertools.islice(f, n)]
    return docs if chars is None else [d[:chars] for d in docs]


def sp_piece(tok: SentencePieceTokenizer, piece: str) -> int:
    i = tok.sp.piece_to_id(piece)
    assert tok.sp.id_to_piece(i) == piece
    return int(i)


@pytest.fixture(scope="module")
def case_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The official sp1024 with the case transform's two markers added as user-defined pieces."""
    require_shared(SP1024)
    pb = pytest.importorskip("sentencepiece.sentencepiece_model_pb2", reason="needs protobuf to edit a model")
    m = pb.ModelProto()
    m.ParseFromString(SP1024.read_bytes())
    for mk in CaseTransform.markers:
        p = m.pieces.add()
        p.piece, p.type, p.score = mk, pb.ModelProto.SentencePiece.USER_DEFINED, 0.0
    out = tmp_path_factory.mktemp("case") / "sp1024_case.model"
    out.write_bytes(m.SerializeToString())
    return out


# ---- the honest ones ----


@pytest.mark.parametrize("model", [SP1024, SP8192, "byte260"], ids=["sp1024", "sp8192", "byte260"])
def test_honest_tokenizers_pass_on_sample_documents(model):
    docs = sample_docs(40)
    if model == "byte260":
        tok, canonical = ByteTokenizer(), "raw"
    else:
        require_shared(model)
        tok, canonical = SentencePieceTokenizer(model), "sp1024"
    rep = prove_tokenizer(tok, docs)
    assert rep.passed, rep.summary()
    assert rep.canonical == canonical and rep.docs == 40 and rep.attribution_checked_docs == 40
    assert rep.table_bytes == rep.canonical_bytes > 100_000
    assert rep.summary().startswith("tokenizer proof PASSED") and "tokens/s" in rep.summary()


def test_the_sp1024_canonical_is_what_the_official_sp1024_gives_back():
    require_shared(SP1024)
    docs = [*sample_docs(40), "▁lead\r\n\ttabs\u3000ideographic  ﬁ １２ Ａ \ufeff\u200b end  "]
    sp = SentencePieceTokenizer(SP1024).sp
    assert sp1024_canonical(docs) == [sp.normalize(d).replace(SPACE_MARK, " ") for d in docs]
    assert sp1024_canonical(docs) == [sp.decode(ids) for ids in sp.encode(docs)]


def test_the_sp1024_canonical_is_the_official_table_for_every_character():
    """HOLE (before the fix): the canonical text came from the installed sentencepiece's built-in nmt_nfkc, which
    in 0.2 maps U+061C (to a space) and U+A7F1 (to S) where the official sp1024's table, an older one, keeps them.
    A document holding either was then not what the official sp1024 makes of it (the challenge's shards could not
    be proved), and its canonical bytes depended on the installed version. Every character from U+0020 to
    U+2FFFF, between two letters, against the official model's own normaliser."""
    require_shared(SP1024)
    sp = SentencePieceTokenizer(SP1024).sp
    texts = [f"a{chr(c)}b" for c in range(0x20, 0x30000) if not 0xD800 <= c < 0xE000]
    texts += ["x\ua7f1\u0301y", "Arabic \u061c mark"]
    official = [t.replace(SPACE_MARK, " ") for t in sp.normalize(texts)]
    differ = [(t, c, o) for t, c, o in zip(texts, sp1024_canonical(texts), official, strict=True) if c != o]
    assert not differ, f"{len(differ)} texts differ, the first {differ[:3]}"


# ---- hostile tokenizers ----


class ByteFallbackCountedAsThree(SentencePieceTokenizer):
    """The 0.9485 record's bug: each byte-fallback piece counted as 3 bytes instead of 1."""

    def byte_table(self) -> ByteTable:
        t = super().byte_table()
        base = t.base_bytes.copy()
        base[[i for i in range(self.vocab_size) if self.sp.is_byte(i)]] = 3
        return ByteTable(base, t.has_leading_space, t.is_boundary)


class StandaloneSpaceCountedAsNothing(SentencePieceTokenizer):
    """A table builder with no case for the standalone "▁": stripped to "", it spells nothing."""

    def byte_table(self) -> ByteTable:
        t = super().byte_table()
        space = t.has_leading_space.copy()
        space[sp_piece(self, SPACE_MARK)] = False
        return ByteTable(t.base_bytes, space, t.is_boundary)


class LeadingSpaceNeverCounted(SentencePieceTokenizer):
    """A table for a tokenizer whose spaces are implied: every leading "▁" dropped (about 20 % short)."""

    def byte_table(self) -> ByteTable:
        t = super().byte_table()
        return ByteTable(t.base_bytes, np.zeros_like(t.has_leading_space), t.is_boundary)


class ClaimsMoreThanTheText(SentencePieceTokenizer):
    """A piece table that says "▁the" is 6 bytes."""

    def byte_table(self) -> ByteTable:
        t = super().byte_table()
        base = t.base_bytes.copy()
        base[sp_piece(self, SPACE_MARK + "the")] += 2
        return ByteTable(base, t.has_leading_space, t.is_boundary)


class MovesAByte(SentencePieceTokenizer):
    """Right totals, wrong tokens: one byte moved from "nd" to "▁the"."""

    def byte_table(self) -> ByteTable:
        t = super().byte_table()
        base = t.base_bytes.copy()
        base[sp_piece(self, SPACE_MARK + "the")] += 1
        base[sp_piece(self, "nd")] -= 1
        return ByteTable(base, t.has_leading_space, t.is_boundary)


@pytest.mark.parametrize(
    "bug,doc,offset,delta",
    [
        (ByteFallbackCountedAsThree, "café au lait", 3, "+4"),  # é: two byte pieces, 3 each
        (StandaloneSpaceCountedAsNothing, "we paid 12 dollars", 7, "-1"),  # "▁" "1" "2"
        (LeadingSpaceNeverCounted, "we paid", 2, "-1"),  # "▁p"
        (ClaimsMoreThanTheText, "in the end", 2, "+2"),
    ],
    ids=["byte-fallback-as-3", "standalone-space", "leading-space", "over-claim"],
)
def test_a_miscounting_byte_table_is_refused_with_document_and_offset(bug, doc, offset, delta):
    require_shared(SP1024)
    rep = prove_tokenizer(bug(SP1024), ["plain", doc, "words"])
    assert not rep.passed and rep.failed_docs == 1, rep.summary()
    f = rep.first
    assert f is not None and (f.doc, f.kind, f.offset) == (1, "count", offset), f.line()
    line = rep.summary()
    assert "\n" not in line and "document 1: the byte table counts" in line
    assert f"({delta}); first departure at byte {offset}," in line


def test_byte_fallback_as_three_and_implied_spaces_on_real_documents():
    """On sample documents: the record's bug over-counts; implied spaces under-count by about a fifth."""
    require_shared(SP1024)
    docs = sample_docs(40)
    rep = prove_tokenizer(ByteFallbackCountedAsThree(SP1024), docs)
    assert not rep.passed and rep.first is not None and rep.table_bytes > rep.canonical_bytes
    assert rep.first.offset is not None and rep.first.kind == "count"
    under = prove_tokenizer(LeadingSpaceNeverCounted(SP1024), docs)
    assert under.failed_docs == 40 and under.first is not None and under.first.doc == 0
    short = 1 - under.table_bytes / under.canonical_bytes
    assert 0.12 < short < 0.22, short


def test_a_table_that_moves_bytes_between_tokens_is_refused_though_the_total_is_right():
    require_shared(SP1024)
    rep = prove_tokenizer(MovesAByte(SP1024), ["plain", "in the end"])
    f = rep.first
    assert f is not None and (f.doc, f.kind, f.offset) == (1, "attribution", 2), rep.summary()
    assert rep.table_bytes == rep.canonical_bytes


class NFKCBeforeEncoding:
    """A lossy wrapper: byte260 that applies NFKC before encoding (ﬁ -> fi, ５ -> 5)."""

    kind = "byte260-nfkc"

    def __init__(self) -> None:
        self.inner = ByteTokenizer()
        self.vocab_size, self.bos_id = self.inner.vocab_size, self.inner.bos_id

    def encode(self, texts):
        return self.inner.encode([unicodedata.normalize("NFKC", t) for t in texts])

    def decode(self, ids):
        return self.inner.decode(ids)

    def byte_table(self):
        return self.inner.byte_table()


def test_a_lossy_unicode_normalisation_is_refused_where_the_canonical_text_keeps_the_character():
    rep = prove_tokenizer(NFKCBeforeEncoding(), ["plain\nwords", "the ﬁrst ５ items"])
    f = rep.first
    assert rep.canonical == "raw" and rep.failed_docs == 1
    assert f is not None and (f.doc, f.kind, f.offset) == (1, "decode", 4), rep.summary()
    assert r"canonical b'the \xef\xac\x81rst \xef\xbc\x95 items' vs decoded b'the first 5 items'" in f.line()


# ---- a declared reversible transform ----

TRICKY = [
    "ÀÉÎ Straße ẞ İstanbul ǅ Ⅸ ＡＢＣ É Ⱥ ΣΊΣΥΦΟΣ KELVIN \u212a",
    "literal markers \ue000A and \ue001 and \ue100 stay",
    "Line one.\n\nLine  Two\tend ",
]


def test_the_case_transform_round_trips_any_text():
    t = CaseTransform()
    for s in [*TRICKY, *(sample_docs(20) if SAMPLE_JSONL.is_file() else [])]:
        assert t.decode_text(t.encode_text(s)) == s
    assert t.encode_text("Hi") == "\ue000hi"


def test_the_case_transform_passes_on_sample_documents(case_model):
    docs = [*sample_docs(60), *TRICKY]
    tok = SentencePieceTokenizer(case_model)
    rep = prove_tokenizer(tok, docs, transform=CaseTransform())
    assert rep.passed, rep.summary()
    assert rep.canonical == "sp1024" and rep.transform == "case" and rep.attribution_checked_docs == len(docs)
    plain = prove_tokenizer(SentencePieceTokenizer(SP1024), docs)
    assert rep.canonical_bytes == rep.table_bytes == plain.canonical_bytes  # the canonical text's bytes


class CountsEncodes(SentencePieceTokenizer):
    """An honest tokenizer that counts the texts it is asked to encode."""

    encoded_texts = 0

    def encode(self, texts):
        self.encoded_texts += len(texts)
        return super().encode(texts)


class BatchCase:
    """The case transform as a batch transform run one split at a time (what a confined one looks like)."""

    name, markers, sha256 = "case", CaseTransform.markers, None

    def encode_texts(self, texts):
        return [CaseTransform().encode_text(t) for t in texts]

    def decode_texts(self, texts):
        return [CaseTransform().decode_text(t) for t in texts]

    @contextmanager
    def for_split(self, split):
        yield self


def test_a_batch_transform_is_proved_with_one_tokenization_of_each_document(case_model):
    # The audit of a submitted transform once tokenized each batch twice (to learn its decodings first).
    docs = sample_docs(30)
    tok = CountsEncodes(case_model)
    rep = prove_tokenizer(tok, docs, transform=BatchCase())
    assert rep.passed, rep.summary()
    # and canonical `auto`'s probe text, and each marker once (that it is one piece)
    assert tok.encoded_texts == len(docs) + 1 + len(CaseTransform.markers)
    assert rep.as_dict() | {"seconds": 0, "encode_seconds": 0, "tokens_per_s": 0} == prove_tokenizer(
        SentencePieceTokenizer(case_model), docs, transform=CaseTransform()
    ).as_dict() | {"seconds": 0, "encode_seconds": 0, "tokens_per_s": 0}


class DropsAMarker(CaseTransform):
    """Broken: the first upper-case marker of each text is lost."""

    def encode_text(self, text: str) -> str:
        return super().encode_text(text).replace(self.UPPER, "", 1)


def test_a_case_transform_that_drops_a_marker_is_refused_with_the_offset(case_model):
    docs = ["all lower case here", "then One Upper", *sample_docs(20)]
    rep = prove_tokenizer(SentencePieceTokenizer(case_model), docs, transform=DropsAMarker())
    f = rep.first
    assert f is not None and (f.doc, f.kind, f.offset) == (1, "decode", 5), rep.summary()
    assert "canonical b'then One Upper' vs decoded b'then one Upper'" in f.line()


def test_a_transform_whose_markers_are_not_pieces_is_refused():
    require_shared(SP1024)
    with pytest.raises(ValueError, match=r"marker U\+E000 is 3 tokens .* user-defined symbol"):
        prove_tokenizer(SentencePieceTokenizer(SP1024), ["x"], transform=CaseTransform())


class DropsOneCharInAThousand:
    """A transformed tokenizer whose decode loses the middle character of about 1 document in 1,000."""

    def __init__(self, inner, salt: int):
        self.inner, self.salt = inner, salt
        self.kind, self.vocab_size, self.bos_id = inner.kind, inner.vocab_size, inner.bos_id

    @staticmethod
    def hit(salt: int, text: str) -> bool:
        return zlib.crc32(f"{salt}:{text}".encode()) % 1000 == 0

    def drop(self, text: str) -> str:
        return text[: len(text) // 2] + text[len(text) // 2 + 1 :] if self.hit(self.salt, text) else text

    def encode(self, texts):
        return self.inner.encode(texts)

    def decode(self, ids):
        return self.drop(self.inner.decode(ids))

    def byte_table(self):
        return self.inner.byte_table()


def test_a_decode_that_drops_one_character_in_a_thousand_documents_is_refused(case_model):
    docs = sample_docs(1000, chars=300)
    canon = sp1024_canonical(docs)
    salt, hits = next(
        (s, h)
        for s in range(1000)
        if (h := [i for i, c in enumerate(canon) if DropsOneCharInAThousand.hit(s, c)])
    )
    tok = DropsOneCharInAThousand(
        TransformedTokenizer(SentencePieceTokenizer(case_model), CaseTransform()), salt
    )
    rep = prove_tokenizer(tok, docs, canonical="sp1024")
    c = canon[hits[0]].encode()
    d = tok.drop(canon[hits[0]]).encode()
    offset = next(i for i in range(len(c)) if i >= len(d) or c[i] != d[i])
    f = rep.first
    assert rep.docs == 1000 and rep.failed_docs == len(hits), rep.summary()
    assert f is not None and (f.doc, f.kind, f.offset) == (hits[0], "decode", offset), rep.summary()


# ---- the command line ----


def test_cli_refuses_in_one_line_and_passes_with_the_right_canonical(tmp_path, capsys, case_model):
    docs = tmp_path / "docs.jsonl"
    docs.write_text("".join(json.dumps({"text": t}) + "\n" for t in ["one line", "two\nlines", "Three Up"]))
    assert pgolf(["audit-tokenizer", str(SP1024), "--docs", str(docs), "--canonical", "raw"]) == 1
    out = capsys.readouterr().out
    assert out.count("\n") == 1 and "document 1: decoding differs from the canonical text at byte 3" in out
    assert pgolf(["audit-tokenizer", str(SP1024), "--docs", str(docs)]) == 0
    assert "PASSED (canonical sp1024" in capsys.readouterr().out
    assert (
        pgolf(["audit-tokenizer", str(case_model), "--docs", str(docs), "--transform", "case", "--json"]) == 0
    )
    rec = json.loads(capsys.readouterr().out)
    assert rec["passed"] and rec["transform"] == "case" and rec["format"] == "pg-tokenizer-proof"
    assert rec["tokens_per_s"] > 0 and rec["canonical_bytes"] == rec["table_bytes"] == 25
    assert pgolf(["audit-tokenizer", str(SP1024), "--docs", str(docs), "--transform", "case"]) == 2
    assert "not one piece" in capsys.readouterr().err
    assert pgolf(["audit-tokenizer", str(SP1024), "--docs", str(docs), "--transform", "cases"]) == 2
    assert "--transform 'cases': expected none, case or a FILE.py" in capsys.readouterr().err


def test_a_tokenizer_trained_here_gives_back_the_official_table_s_text(tmp_path):
    """A tokenizer the build trains (`--vocab-size`) carries the official nmt_nfkc table, not the installed
    sentencepiece's newer one: its decoding of a document holding U+061C and U+A7F1 is the canonical text, which
    keeps them, so the build's proof holds."""
    from data.build import build_dataset
    from data.manifest import load_manifest

    require_shared(SAMPLE_JSONL)
    docs = ["Arabic \u061c mark and x\ua7f1y here. " * 20, *sample_docs(30)]
    ds = build_dataset(docs, tmp_path / "d", val_docs=5, vocab_size=400, workers=1, canonical="sp1024")
    sp = SentencePieceTokenizer(load_manifest(ds).tokenizer_path).sp
    assert sp.decode(sp.encode(docs[0])) == sp1024_canonical(docs[:1])[0] and "\u061c" in sp.decode(
        sp.encode(docs[0])
    )
