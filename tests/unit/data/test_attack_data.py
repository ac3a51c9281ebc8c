"""Attacks on the data and byte-accounting rules, as a competitor would make them (docs/RULES.md "bpb's bytes",
"No validation document in training", "A tokenizer's proof"). Each test is one attack: it asserts that the
harness refuses or flags it, with a control where the honest case must still pass."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn

from data.build import build_dataset
from data.canonical import (
    VAL_BYTES_NAME,
    CanonicalBytesError,
    read_val_bytes,
    write_val_bytes,
)
from data.io import sha256_file
from data.manifest import MANIFEST_NAME, load_manifest
from data.proof import sp1024_canonical
from data.shards import read_split
from data.tokenizer import SPACE_MARK
from data.verify import verify_dataset
from scoring.score.evaluate import EvalConfig, evaluate
from tests.conftest import SAMPLE_JSONL, SP1024, require_shared
from tests.fixtures.texts import prose_documents
from tests.unit.data.test_canonical import counts_of as _canonical
from tests.unit.data.test_canonical import sample_docs

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
    return _canonical(ds).counts


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


# ---- a submitted tokenizer that memorises the validation text in its pieces ----


class NextId(nn.Module):
    """A "model" that knows nothing of text: it predicts that token id i is followed by id i + 1."""

    def __init__(self, vocab_size: int):
        super().__init__()
        self.vocab_size = vocab_size
        self.dummy = nn.Parameter(torch.zeros(1))

    def forward(self, ids):
        nxt = torch.remainder(ids + 1, self.vocab_size)
        return 30.0 * nn.functional.one_hot(nxt, self.vocab_size).float() + 0 * self.dummy


def _next_id_score(ds: Path) -> tuple[Any, np.ndarray, Any]:
    """The dataset's manifest, validation tokens and the score of a model that predicts id + 1 on them."""
    m = load_manifest(ds)
    toks = read_split(ds, "val")
    cfg = EvalConfig(mode="sliding", seq_len=64, batch_seqs=8, stride=64)
    return m, toks, evaluate(NextId(m.vocab_size), toks, _canonical(ds), cfg, torch.device("cpu"))


def _memorising_sp1024(canonical_val: list[str], out: Path, chunk: int) -> Path:
    """The official sp1024 plus one user-defined piece per `chunk` characters of the validation documents'
    canonical text, in order: consecutive ids along the validation stream. The tokenizer does not count
    toward the cap, so it can hold the whole validation text."""
    pb = pytest.importorskip("sentencepiece.sentencepiece_model_pb2", reason="needs protobuf to edit a model")
    m = pb.ModelProto()
    m.ParseFromString(SP1024.read_bytes())
    have = {p.piece for p in m.pieces}
    for text in canonical_val:
        s = text.replace(" ", SPACE_MARK)
        for i in range(0, len(s), chunk):
            if (piece := s[i : i + chunk]) not in have:
                have.add(piece)
                p = m.pieces.add()
                p.piece, p.type, p.score = piece, pb.ModelProto.SentencePiece.USER_DEFINED, 0.0
    out.write_bytes(m.SerializeToString())
    return out


def test_a_tokenizer_holding_the_validation_text_in_its_pieces_is_refused(tmp_path):
    """HOLE (before the fix): an entry's own tokenizer is held only to the proof, and its bytes do not count
    toward the cap. sp1024 plus user-defined pieces of 200 characters of the validation text each, with
    consecutive ids, passed the build's proof and `pgolf data verify`: 10 validation documents (99,885 bytes)
    became 506 tokens, 96 % of them the previous id + 1, and a model that predicts id + 1 scored 0.008
    bpb. A piece may spell at most 16 characters (SentencePiece's own bound; sp8192's longest is 16)."""
    require_shared(SP1024, SAMPLE_JSONL)
    docs = sample_docs(40)
    model = _memorising_sp1024(sp1024_canonical(docs[:10]), tmp_path / "memo.model", chunk=200)
    try:
        ds = build_dataset(docs, tmp_path / "d", val_docs=10, tokenizer=model, workers=1, canonical="sp1024")
    except ValueError as e:
        assert "16 characters" in str(e) and "\n" not in str(e)
        return
    m, toks, res = _next_id_score(ds)
    pytest.fail(
        f"built and verified ({verify_dataset(ds).ok}): {toks.size} validation tokens for "
        f"{res.sums.bytes:,} bytes, val_bpb {res.sums.val_bpb:.4f} from a model that predicts id + 1"
    )


def test_sixteen_character_pieces_of_the_validation_text_are_refused_on_a_record_track(tmp_path):
    """What the 16-character bound left: pieces of 16 characters of the validation text in id order still scored
    0.031 bpb on the documents they hold. The training split never uses them (on a record track it is the official
    text, which no entrant writes): the build counts the pieces the validation split alone uses, and a record track
    refuses more than VAL_ONLY_PIECES_MAX. The official sp1024 on the same documents: none of 4 bytes or more."""
    from harness.run.datacheck import data_identity
    from scoring.tracks import VAL_ONLY_PIECES_MAX, DocumentSet, dataset_problem

    require_shared(SP1024, SAMPLE_JSONL)
    docs = sample_docs(40)
    model = _memorising_sp1024(sp1024_canonical(docs[:10]), tmp_path / "memo.model", chunk=16)
    official = {"canonical": "sp1024", "docs": 10}
    for name, tok, many in (("memo", model, True), ("sp1024", SP1024, False)):
        ds = build_dataset(docs, tmp_path / name, val_docs=10, tokenizer=tok, workers=1, canonical="sp1024")
        pieces = load_manifest(ds).raw["pieces"]
        assert (pieces["val_only"] > VAL_ONLY_PIECES_MAX) == many and (many or pieces["val_only"] == 0), (
            pieces
        )
        problem = dataset_problem(DocumentSet(name="t", **official), data_identity(load_manifest(ds)))
        assert (problem is not None and "holds validation text" in problem) == many, problem
    assert verify_dataset(ds).ok  # the honest one's counts are the shards'
    raw = json.loads(
        (tmp_path / "memo" / MANIFEST_NAME).read_text()
    )  # a count edited, the training split's too
    raw["pieces"]["val_only"], raw["train_unigram_counts"][5] = 0, raw["train_unigram_counts"][5] + 1
    (tmp_path / "memo" / MANIFEST_NAME).write_text(json.dumps(raw))
    found = "\n".join(verify_dataset(tmp_path / "memo").problems())
    assert "pieces.val_only: the manifest says 0" in found and "train_unigram_counts" in found, found


def _ngram_memorising_sp1024(canonical: list[str], val_docs: int, out: Path) -> Path:
    """sp1024 plus, as user-defined pieces, runs of up to 6 words (16 characters at most) of the validation text
    that the training text also holds (a fresh one preferred at each place), in the order the validation tokens
    first use them; a piece the training tokens then never use (a longer piece took its place there) is dropped,
    until none is left. Every added piece is one the training split uses: the validation-only count is 0."""
    import re

    import sentencepiece as spm

    pb = pytest.importorskip("sentencepiece.sentencepiece_model_pb2", reason="needs protobuf to edit a model")
    base = pb.ModelProto()
    base.ParseFromString(SP1024.read_bytes())
    have = {p.piece for p in base.pieces}

    def words(t: str) -> list[str]:
        return [w.replace(" ", SPACE_MARK) for w in re.findall(r" ?[^ ]+| +", t)]

    grams = set()
    for t in canonical[val_docs:]:
        w = words(t)
        grams.update(
            g for n in range(1, 7) for i in range(len(w) - n + 1) if len(g := "".join(w[i : i + n])) <= 16
        )
    pieces, used = [], set()
    for t in canonical[:val_docs]:
        w, i = words(t), 0
        while i < len(w):
            opts = [n for n in range(6, 0, -1) if i + n <= len(w) and "".join(w[i : i + n]) in grams]
            n = ([n for n in opts if "".join(w[i : i + n]) not in used] or opts or [1])[0]
            g, i = "".join(w[i : i + n]), i + n
            if len(g) <= 16 and g not in have and g not in used:
                used.add(g)
                pieces.append(g)

    def write(ps: list[str]) -> spm.SentencePieceProcessor:
        m = pb.ModelProto()
        m.CopyFrom(base)
        for g in ps:
            p = m.pieces.add()
            p.piece, p.type, p.score = g, pb.ModelProto.SentencePiece.USER_DEFINED, 0.0
        out.write_bytes(m.SerializeToString())
        return spm.SentencePieceProcessor(model_file=str(out))

    while True:
        sp = write(pieces)
        size = sp.get_piece_size()
        train = np.bincount(np.concatenate(sp.encode(canonical[val_docs:])), minlength=size)
        first = dict.fromkeys(
            i for i in np.concatenate(sp.encode(canonical[:val_docs])).tolist() if i >= len(base.pieces)
        )
        kept = [sp.id_to_piece(i) for i in first if train[i] > 0]
        if len(kept) == len(first) == len(pieces):
            return out
        pieces = kept


def test_validation_ordered_pieces_the_training_text_also_holds_lose_their_order(tmp_path):
    """HOLE (before the build numbered an entry's pieces by their text): the validation-only count is evaded by pieces the training text also holds. sp1024 plus 6,697 pieces
    (runs of words of the validation text found in sample.jsonl's 2,638 other documents), ids in the order the
    validation tokens first use them: `pieces.val_only` 0, a record track's check passes, and 26 % of the
    validation tokens are the previous id + 1 (sp1024: 0.3 %). A unigram of the training counts mixed with
    "id + 1" at 0.2 scored 1.684 bpb on the 10 documents; the same pieces with their ids shuffled, 2.384 (0.70 bpb
    from the ids' order alone). The official training text (~8 B tokens) holds far more of the validation text's
    word runs than 17 MB. Here 600 training documents, to keep it short (val_only 0, 17 % id + 1)."""
    from harness.run.datacheck import data_identity
    from scoring.tracks import DocumentSet, dataset_problem

    require_shared(SP1024, SAMPLE_JSONL)
    docs = sample_docs(610)
    model = _ngram_memorising_sp1024(sp1024_canonical(docs), 10, tmp_path / "memo.model")
    ds = build_dataset(docs, tmp_path / "d", val_docs=10, tokenizer=model, workers=1, canonical="sp1024")
    toks = read_split(ds, "val").astype(np.int64)
    follows = float(np.mean(toks[1:] == toks[:-1] + 1))
    assert follows < 0.02, f"{follows:.1%} of the validation tokens are the previous id + 1"  # sp1024: 0.3 %
    m = load_manifest(ds)
    assert m.raw["tokenizer"]["piece_order"] == "text"
    identity = data_identity(m)
    assert dataset_problem(DocumentSet(name="t", canonical="sp1024", docs=10), identity) is None
    # a tokenizer whose order is its own (shards made elsewhere, then proved): a record track refuses it
    problem = dataset_problem(
        DocumentSet(name="t", canonical="sp1024", docs=10), {**identity, "piece_order": None}
    )
    assert problem is not None and "an order of the entry's own" in problem


def _denormalizing_sp1024(canonical_val: list[str], out: Path) -> tuple[Path, int]:
    """The official sp1024 with normalisation rules that turn each run of about 40 characters of the validation
    text into as many 3-byte CJK characters as it has UTF-8 bytes / 3 (consecutive code points along the validation
    text, each a user-defined piece), and denormalisation rules that turn them back after decoding. A piece spells
    one character of 3 bytes (under VAL_ONLY_MIN_BYTES), the text lives in rules no piece spells. Returns the model
    and the validation bytes the rules hold."""
    import io

    import sentencepiece as spm

    pb = pytest.importorskip("sentencepiece.sentencepiece_model_pb2", reason="needs protobuf to edit a model")
    rules: dict[str, str] = {}
    first = sym = 0x4E00
    for t in canonical_val:
        i = 0
        while i < len(t):
            j = min(i + 40, len(t))
            while j < len(t) and len(t[i:j].encode()) % 3:
                j += 1
            n = len(t[i:j].encode())
            if n % 3 or t[i:j] in rules:
                break
            rules[t[i:j]], sym, i = "".join(map(chr, range(sym, sym + n // 3))), sym + n // 3, j

    def tsv(pairs: dict[str, str], name: str) -> str:
        rows = ("\t".join(" ".join(f"{ord(c):X}" for c in s) for s in pair) + "\n" for pair in pairs.items())
        (out.parent / name).write_text("".join(rows))
        return str(out.parent / name)

    compiled = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(["abc def " * 10] * 50),
        model_writer=compiled,
        model_type="bpe",
        vocab_size=300,
        hard_vocab_limit=False,
        add_dummy_prefix=False,
        minloglevel=2,
        normalization_rule_tsv=tsv(rules, "norm.tsv"),
        denormalization_rule_tsv=tsv({v: k for k, v in rules.items()}, "denorm.tsv"),
    )
    spec = pb.ModelProto()
    spec.ParseFromString(compiled.getvalue())
    m = pb.ModelProto()
    m.ParseFromString(SP1024.read_bytes())
    # the rules under the official name: the text is already nmt_nfkc's canonical one
    m.normalizer_spec.precompiled_charsmap = spec.normalizer_spec.precompiled_charsmap
    m.denormalizer_spec.CopyFrom(spec.denormalizer_spec)
    for cp in range(first, sym):
        p = m.pieces.add()
        p.piece, p.type, p.score = chr(cp), pb.ModelProto.SentencePiece.USER_DEFINED, 0.0
    out.write_bytes(m.SerializeToString())
    return out, sum(len(k.encode()) for k in rules)


def test_a_tokenizer_holding_the_validation_text_in_its_denormaliser_is_refused(tmp_path, monkeypatch):
    """HOLE (before the fix): SentencePiece rewrites decoded text with the model's `denormalizer_spec`, rules of any
    length that no piece spells. sp1024 with normalisation rules turning runs of 40 characters of 10 validation
    documents into consecutive 3-byte CJK characters (user-defined pieces) and denormalisation rules turning them
    back passed every proof, `pgolf data verify` and a record track's check (`pieces.val_only` 0: each piece is 3
    bytes): 55,095 of the 55,237 validation bytes were in the rules, 18,450 validation tokens, 99.5 % of them the
    previous id + 1, and a model that predicts id + 1 scored 0.074 bpb. A tokenizer may have no denormaliser."""
    from data.proof import prove_tokenizer
    from data.tokenizer import SentencePieceTokenizer

    require_shared(SP1024, SAMPLE_JSONL)
    docs = sample_docs(41)[1:]
    model, hidden = _denormalizing_sp1024(sp1024_canonical(docs[:10]), tmp_path / "denorm.model")
    assert hidden > 55_000
    try:
        ds = build_dataset(docs, tmp_path / "d", val_docs=10, tokenizer=model, workers=1, canonical="sp1024")
    except ValueError as e:
        assert "denormalizer_spec" in str(e) and "\n" not in str(e), e
        with pytest.raises(ValueError, match="denormalizer_spec"):
            prove_tokenizer(SentencePieceTokenizer(model), docs, canonical="sp1024")
        # shards built without the check (elsewhere, or before it): the scorer's loader refuses their counts
        monkeypatch.setattr("data.build.refuse_denormalizer", lambda tok: None)
        ds = build_dataset(
            docs, tmp_path / "old", val_docs=10, tokenizer=model, workers=1, canonical="sp1024"
        )
        with pytest.raises(CanonicalBytesError, match="denormalizer_spec"):
            _canonical(ds)
        return
    m, toks, res = _next_id_score(ds)
    pytest.fail(
        f"built and verified ({verify_dataset(ds).ok}), val_only {m.raw['pieces']['val_only']}: {hidden:,} of "
        f"{res.sums.bytes:,} validation bytes in the rules, {toks.size} tokens, val_bpb {res.sums.val_bpb:.4f} from "
        "a model that predicts id + 1"
    )


@pytest.mark.parametrize("counts", ["absent", "empty", "one id", "all ones"])
def test_proving_shards_counts_the_training_split_itself(tmp_path, counts):
    """HOLE (before the fix): `pgolf data prove` (shards built or downloaded elsewhere) took the training split's
    counts from the manifest it was given, `train_unigram_counts`: absent, [] or one id, the validation-only count
    was 0, and all ones likewise, so the 16-character memorising tokenizer (thousands of such pieces) passed a
    record track's check with the manifest's word. The prove counts the training shards themselves."""
    from data.build import prove_dataset
    from harness.run.datacheck import data_identity
    from scoring.tracks import VAL_ONLY_PIECES_MAX, DocumentSet, dataset_problem

    require_shared(SP1024, SAMPLE_JSONL)
    docs = sample_docs(40)
    model = _memorising_sp1024(sp1024_canonical(docs[:10]), tmp_path / "memo.model", chunk=16)
    ds = build_dataset(docs, tmp_path / "d", val_docs=10, tokenizer=model, workers=1, canonical="sp1024")
    honest = load_manifest(ds).raw["pieces"]["val_only"]
    assert honest > VAL_ONLY_PIECES_MAX
    raw = json.loads((ds / MANIFEST_NAME).read_text())
    for name in ("canonical", "split_sha256", "pieces"):  # as a folder built elsewhere comes
        del raw[name]
    raw["format_version"] = 1
    vocab = len(raw["train_unigram_counts"])
    if counts == "absent":
        del raw["train_unigram_counts"]
    else:
        raw["train_unigram_counts"] = {"empty": [], "one id": [1], "all ones": [1] * vocab}[counts]
    (ds / MANIFEST_NAME).write_text(json.dumps(raw))
    (ds / VAL_BYTES_NAME).unlink()
    prove_dataset(ds, sp1024_canonical(docs[:10]), workers=1, canonical="sp1024")
    assert load_manifest(ds).raw["pieces"]["val_only"] == honest
    problem = dataset_problem(
        DocumentSet(name="t", canonical="sp1024", docs=10), data_identity(load_manifest(ds))
    )
    assert problem is not None and "holds validation text" in problem, problem


# ---- a validation document spread over training documents: the window check ----


def test_a_validation_document_split_over_training_documents_is_reported(tmp_path):
    """HOLE (before the fix): the window check (`pgolf data verify --against-docs`) reported a training
    document holding more than half of one validation document's windows; the same validation document cut in
    three, each third its own training document, held a third each, and nothing was reported (two halves
    usually pass too: the windows across the cut are lost). The build passes it too (neither half is a copy). The check now also counts, per
    validation document, its windows found anywhere in training."""
    docs = prose_documents(16, 1500)
    v, k = docs[2], len(docs[2]) // 5
    # five parts, each under the threshold (a quarter) of its windows: a third each was reported since 0.25
    parts = [
        v[:k],
        "An unrelated line.",
        v[k : 2 * k],
        "Another one.",
        v[2 * k : 3 * k],
        "A third.",
        v[3 * k : 4 * k],
    ]
    train = docs[4:10] + parts + ["A fourth.", v[4 * k :]] + docs[10:]
    ds = build_dataset(docs[:4] + train, tmp_path / "d", val_docs=4, tokenizer="byte260", workers=1)
    val_file = tmp_path / "val.jsonl"
    val_file.write_text("".join(json.dumps({"text": t}) + "\n" for t in docs[:4]), encoding="utf-8")
    report = verify_dataset(ds, against_docs=val_file, workers=1)
    assert not report.ok, (
        "a third of a validation document in each of three training documents was not reported"
    )
    hits = [o for o in report.disjoint.overlaps if o.val_doc == 2]
    assert hits and {o.val_doc for o in report.disjoint.overlaps} == {2}
    line = "\n".join(report.problems())
    assert "spread over training documents 6, 8, 10, 12, 14" in line, line


@pytest.mark.parametrize("mark", ["|", "\u200b", " "])
def test_a_validation_document_with_a_mark_every_40_characters_is_reported(tmp_path, mark):
    """HOLE (before the windows were of the skeleton): a validation document with a mark put in every 40
    characters is a training document the model learns the validation text from almost whole; neither the
    build's digests nor `verify --against-docs` (50-character windows of pg-norm/1 text) saw it."""
    docs = prose_documents(16, 1500)
    v = docs[2]
    marked = mark.join(v[i : i + 40] for i in range(0, len(v), 40))
    ds = build_dataset(
        docs[:4] + docs[4:10] + [marked] + docs[10:], tmp_path / "d", val_docs=4, tokenizer="byte260"
    )
    val_file = tmp_path / "val.jsonl"
    val_file.write_text("".join(json.dumps({"text": t}) + "\n" for t in docs[:4]), encoding="utf-8")
    report = verify_dataset(ds, against_docs=val_file, ngram_sample=1, workers=1)
    assert {o.val_doc for o in report.disjoint.overlaps} == {2}


# ---- the manifest's claims the record track reads: documents in the validation split ----


def test_a_manifest_claiming_more_validation_documents_than_the_shards_hold_is_refused(small):
    """HOLE (before the fix): the record track's check reads the manifest's `docs.val` (50,000 for the official
    split) and nothing else tied it to the validation shards the scorer reads: a manifest claiming more documents
    than its shards hold (a split of the easiest documents) passed the track's check and the scorer's loader;
    only `pgolf data verify` compared them."""
    from harness.run.datacheck import data_identity
    from scoring.tracks import DocumentSet, dataset_problem

    m = json.loads((small / MANIFEST_NAME).read_text())
    m["docs"]["val"] = 50
    (small / MANIFEST_NAME).write_text(json.dumps(m))
    track_docs = DocumentSet(name="t", docs=50, canonical=m["canonical"]["text"])
    assert dataset_problem(track_docs, data_identity(load_manifest(small))) is None  # the claim is read
    assert not verify_dataset(small).ok
    with pytest.raises(CanonicalBytesError, match="50"):
        _counts(small)
