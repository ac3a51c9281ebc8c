"""The byte table against real text: for every document, the table's byte count equals the UTF-8
length of the text the tokens spell (the tokenizer's own decode of them)."""

from __future__ import annotations

import json

import pytest

from data.tokenizer import BOS_ID, ByteTokenizer, SentencePieceTokenizer
from tests.conftest import SAMPLE_JSONL, SP1024, SP8192, require_shared


def _docs() -> list[str]:
    with open(SAMPLE_JSONL, encoding="utf-8") as f:
        return [json.loads(line)["text"] for line in f if line.strip()]


@pytest.mark.parametrize("model", [SP1024, SP8192], ids=["sp1024", "sp8192"])
def test_byte_table_counts_equal_utf8_length_document_by_document(model):
    require_shared(model, SAMPLE_JSONL)
    tok = SentencePieceTokenizer(model)
    table = tok.byte_table()
    docs = _docs()
    encoded = tok.encode(docs)
    mismatches = []
    for i, ids in enumerate(encoded):
        spelled = tok.decode(ids).encode("utf-8")
        counted = table.count_bytes(ids, prev_id=BOS_ID)
        if counted != len(spelled):
            mismatches.append((i, counted, len(spelled)))
    assert len(docs) == 2648
    assert mismatches == [], f"first mismatches (doc, table, utf8): {mismatches[:5]}"


def test_sp1024_table_facts():
    require_shared(SP1024)
    tok = SentencePieceTokenizer(SP1024)
    t = tok.byte_table()
    assert t.vocab_size == 1024
    assert t.is_boundary[:4].all() and not t.is_boundary[4:].any()
    assert (t.base_bytes[4:260] == 1).all() and not t.has_leading_space[4:260].any()
    the = tok.sp.piece_to_id("\u2581the")
    assert t.base_bytes[the] == 3 and t.has_leading_space[the]
    # after BOS the leading space is not a byte; after a normal piece it is
    assert t.count_bytes([the], prev_id=BOS_ID) == 3
    assert t.count_bytes([the, the]) == 3 + 4


def test_byte260_table_round_trip():
    tok = ByteTokenizer()
    text = "plain ascii, Ünïcödé, 漢字, emoji 🙂"
    ids = tok.encode([text])[0]
    assert tok.decode(ids) == text
    assert tok.byte_table().count_bytes(ids) == len(text.encode("utf-8"))
