"""Tokenizer audit: real tokenizers pass document by document; a byte table that over-counts (a
planted bug) is caught, naming the first document and token; the CLI prints the first mismatches."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from data.build import read_jsonl_texts
from data.tokenizer import BOS_ID, SPACE_MARK, ByteTable, ByteTokenizer, SentencePieceTokenizer
from scoring.score.audit import audit_texts, audit_token_stream, split_documents
from tests.conftest import REPO, SAMPLE_JSONL, SP1024, SP8192, require_shared

TEXTS = [
    "Plain ASCII text.",
    "Grüße aus Köln — naïve café ☕ 你好",
    "",
    "tabs\tand  double  spaces\nnew line",
    "x" * 40,
]


class SpaceBytesCounted(SentencePieceTokenizer):
    """Planted bug: the leading "▁" is counted as its own UTF-8 bytes (3) instead of as one space."""

    def byte_table(self) -> ByteTable:
        t = super().byte_table()
        base = t.base_bytes.copy()
        for i in range(self.vocab_size):
            if (
                not t.is_boundary[i]
                and not self.sp.is_byte(i)
                and self.sp.id_to_piece(i).startswith(SPACE_MARK)
            ):
                base[i] = len(self.sp.id_to_piece(i).encode("utf-8"))
        return ByteTable(base, np.zeros_like(t.has_leading_space), t.is_boundary)


class ByteFallbackAsPiece(SentencePieceTokenizer):
    """Planted bug: byte-fallback pieces counted as the length of their name "<0xAB>" (6 bytes)."""

    def byte_table(self) -> ByteTable:
        t = super().byte_table()
        base = t.base_bytes.copy()
        for i in range(self.vocab_size):
            if self.sp.is_byte(i):
                base[i] = len(self.sp.id_to_piece(i))
        return ByteTable(base, t.has_leading_space, t.is_boundary)


class ByteTokenizerOverCounting(ByteTokenizer):
    """Planted bug on byte260: the byte 0x20 (space) counted twice."""

    def byte_table(self) -> ByteTable:
        t = super().byte_table()
        base = t.base_bytes.copy()
        base[4 + 0x20] = 2
        return ByteTable(base, t.has_leading_space, t.is_boundary)


def test_byte260_passes_and_a_planted_over_count_is_caught():
    assert audit_texts(ByteTokenizer(), TEXTS).passed
    rep = audit_texts(ByteTokenizerOverCounting(), TEXTS)
    assert not rep.passed and rep.mismatched_docs == 3  # the three documents with a space
    first = rep.first[0]
    assert (first.doc, first.token_index, first.token_id) == (
        0,
        5,
        4 + 0x20,
    )  # "Plain| |ASCII": the 6th token
    assert (first.table_bytes, first.spelled_bytes) == (2, 1)
    assert "document 0" in first.describe() and "Plain ASCII" in first.describe()


@pytest.mark.parametrize("model", [SP1024, SP8192], ids=["sp1024", "sp8192"])
def test_real_tokenizers_pass_on_real_documents(model):
    require_shared(model, SAMPLE_JSONL)
    docs = read_jsonl_texts(SAMPLE_JSONL)[:150]
    rep = audit_texts(SentencePieceTokenizer(model), docs + TEXTS)
    assert rep.passed, rep.summary()
    assert rep.decode_checked_docs > 100 and rep.table_bytes == rep.spelled_bytes > 500_000


@pytest.mark.parametrize(
    "bug,piece_check",
    [
        (SpaceBytesCounted, lambda p: p.startswith(SPACE_MARK)),
        (ByteFallbackAsPiece, lambda p: p.startswith("<0x")),
    ],
)
def test_planted_sentencepiece_bugs_are_caught_with_document_and_token(bug, piece_check):
    require_shared(SP1024)
    tok = bug(SP1024)
    rep = audit_texts(tok, TEXTS)
    assert not rep.passed
    m = rep.first[0]
    assert m.table_bytes > m.spelled_bytes  # over-counted: bpb would look better than it is
    assert piece_check(m.piece), m.describe()
    ids = tok.encode([TEXTS[m.doc]])[0]
    assert ids[m.token_index] == m.token_id
    good = SentencePieceTokenizer(SP1024).byte_table()
    prev = np.array([BOS_ID, *ids[:-1]])
    assert np.array_equal(
        good.token_bytes(prev, np.array(ids))[: m.token_index],
        tok.byte_table().token_bytes(prev, np.array(ids))[: m.token_index],
    )


def test_audit_of_a_token_stream_splits_documents_at_bos():
    tok = ByteTokenizerOverCounting()
    stream = np.concatenate([[BOS_ID, *ids] for ids in ByteTokenizer().encode(["ab", "c d", "ef"])])
    assert [d.tolist() for d in split_documents(stream, BOS_ID)] == [[101, 102], [103, 36, 104], [105, 106]]
    rep = audit_token_stream(tok, stream)
    assert (
        rep.docs == 3 and rep.mismatched_docs == 1 and rep.first[0].doc == 1 and rep.first[0].token_index == 1
    )


def test_cli_passes_on_a_good_tokenizer_and_prints_json(tmp_path):
    docs = tmp_path / "docs.jsonl"
    docs.write_text("".join(json.dumps({"text": t}) + "\n" for t in TEXTS))
    tok = tmp_path / "byte260.json"
    tok.write_text('{"kind": "byte260"}')
    r = subprocess.run(
        [sys.executable, "-m", "harness.cli", "audit-tokenizer", str(tok), "--docs", str(docs), "--json"],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
        check=False,
    )
    assert r.returncode == 0, r.stderr
    rec = json.loads(r.stdout)
    assert rec["passed"] and rec["docs"] == len(TEXTS) and rec["format"] == "pg-tokenizer-proof"
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "harness.cli",
            "audit-tokenizer",
            str(tmp_path / "nope.model"),
            "--docs",
            str(docs),
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
        check=False,
    )
    assert r.returncode == 2 and "tokenizer model not found" in r.stderr


@pytest.mark.long
def test_the_scorer_audits_a_tokenizer_brought_with_the_data(tmp_path, monkeypatch):
    """A dataset with canonical byte counts (manifest v3) is scored on them: a byte table that over-counts
    changes nothing, and no audit is needed. A dataset without them, tokenized with a tokenizer that is not
    the official one, is audited on the scored documents with every score; a planted over-count then fails
    the score, naming the document."""
    require_shared(SP8192, SAMPLE_JSONL)
    import scoring.score.scorer as score_mod
    from data.build import build_dataset
    from scoring.score.evaluate import EvalConfig
    from scoring.score.probes import ProbeConfig
    from tests.unit.scoring.test_eval_support import pack_tiny, write_submission

    docs = read_jsonl_texts(SAMPLE_JSONL)[:6]
    ds = build_dataset(docs, tmp_path / "ds", val_docs=3, tokenizer=str(SP8192), workers=1)
    folder = write_submission(tmp_path / "sub")
    pack_tiny(folder, tmp_path / "a.pgolf", model_config={"vocab_size": 8192, "dim": 8})
    cfg = EvalConfig(seq_len=64, max_tokens=2048)

    def score(**kw):
        return score_mod.score_artifact(tmp_path / "a.pgolf", folder, ds, cfg, threads=1, **kw)

    honest = score(probe_cfg=ProbeConfig(probes=0))
    assert honest["denominator"]["source"] == "canonical" and honest["tokenizer_audit"]["ran"] is False
    with monkeypatch.context() as m:
        m.setattr(score_mod, "load_tokenizer", lambda path: SpaceBytesCounted(path))
        planted = score(probe_cfg=ProbeConfig(probes=0))
    assert planted["val_bytes"] == honest["val_bytes"] and planted["val_bpb"] == honest["val_bpb"]

    manifest = json.loads((ds / "manifest.json").read_text())  # as built before manifest version 3
    del manifest["canonical"]
    (ds / "manifest.json").write_text(json.dumps(manifest))
    rec = score(probe_cfg=ProbeConfig(probes=0))
    assert rec["denominator"]["source"] == "piece_table" and rec["val_bytes"] == honest["val_bytes"]
    assert rec["tokenizer_audit"]["ran"] is True and rec["tokenizer_audit"]["passed"] is True
    assert rec["tokenizer_audit"]["docs"] >= 1 and rec["tokenizer_audit"]["tokens"] > 1000
    monkeypatch.setattr(score_mod, "load_tokenizer", lambda path: SpaceBytesCounted(path))
    with pytest.raises(
        score_mod.ProbeFailure, match=r"failed the byte-table audit[\s\S]*document 0: the byte table counts"
    ):
        score(probe_cfg=ProbeConfig(probes=0))
