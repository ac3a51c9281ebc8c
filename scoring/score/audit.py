"""Tokenizer audit: does the byte table count, document by document, the bytes the tokens spell?

The `pgolf audit-tokenizer` command runs the tokenizer's proof (data/proof.py), which
uses this module's speller to locate a miscount; the scorer runs `audit_token_stream` on the
validation tokens when the dataset's tokenizer is not a known official one.

bpb divides by the table's byte count (data/tokenizer.py, docs/RULES.md "Exact byte accounting"); a
table that over-counts makes every score look better. The audit spells each document's tokens
independently of the table, from the tokenizer's own pieces:

- control / unknown / unused pieces spell nothing (no bytes);
- a byte-fallback piece `<0xAB>` spells the one raw byte 0xAB;
- any other piece spells its UTF-8 text with every "▁" read as a space, except that the leading
  "▁" of a document's first token spells nothing (SentencePiece's decode drops it there).

and compares, per document and per token, with table.token_bytes (the first token of a document
follows its BOS). As a check on the speller itself, for documents whose spelled bytes are valid
UTF-8 and hold no boundary piece, the spelled bytes must equal the tokenizer's own
decode(ids); any difference is reported too. A document whose counts differ is reported with its
index, the first token where table and spelling part, the token's id and piece, and the start of
its text. `audit_token_stream` audits a validation token stream (documents split at BOS): the
scorer runs it when the dataset's tokenizer is not a known official one.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from data.proof import speller_for
from data.tokenizer import (
    BOS_ID,
    ByteTable,
    ByteTokenizer,
    Tokenizer,
)
from scoring.errors import DataError

AUDIT_FORMAT = "pg-tokenizer-audit"
AUDIT_FORMAT_VERSION = 1
# sha256 of tokenizer files whose byte tables are audited once and trusted (the official sp1024).
KNOWN_TOKENIZER_SHA256 = frozenset({"4f5e8adb109c66b4886963bc75a7befd73bda36d27fd7102df8e9e66503b0e2a"})


@dataclass(frozen=True)
class Mismatch:
    doc: int
    token_index: int
    token_id: int
    piece: str
    table_bytes: int
    spelled_bytes: int
    doc_table_bytes: int
    doc_spelled_bytes: int
    snippet: str

    def describe(self) -> str:
        return (
            f"document {self.doc}: the byte table counts {self.doc_table_bytes:,} bytes, the tokens spell "
            f"{self.doc_spelled_bytes:,}; first difference at token {self.token_index} (id {self.token_id}, piece "
            f"{self.piece!r}): table {self.table_bytes}, spelled {self.spelled_bytes}. Text: {self.snippet!r}"
        )


@dataclass
class AuditReport:
    docs: int = 0
    tokens: int = 0
    table_bytes: int = 0
    spelled_bytes: int = 0
    mismatched_docs: int = 0
    decode_checked_docs: int = 0
    decode_disagreements: int = 0
    first: list[Mismatch] = field(default_factory=list)
    first_decode: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return self.mismatched_docs == 0 and self.decode_disagreements == 0

    def as_dict(self) -> dict[str, Any]:
        return {
            "format": AUDIT_FORMAT,
            "format_version": AUDIT_FORMAT_VERSION,
            "passed": self.passed,
            "docs": self.docs,
            "tokens": self.tokens,
            "table_bytes": self.table_bytes,
            "spelled_bytes": self.spelled_bytes,
            "mismatched_docs": self.mismatched_docs,
            "decode_checked_docs": self.decode_checked_docs,
            "decode_disagreements": self.decode_disagreements,
            "first_mismatches": [m.describe() for m in self.first],
            "first_decode_disagreements": self.first_decode,
        }

    def summary(self) -> str:
        head = (
            f"tokenizer audit {'PASSED' if self.passed else 'FAILED'}: {self.docs:,} documents, {self.tokens:,} tokens; "
            f"table {self.table_bytes:,} bytes vs spelled {self.spelled_bytes:,}; {self.mismatched_docs} document(s) differ; "
            f"decode cross-check on {self.decode_checked_docs} document(s): {self.decode_disagreements} disagreement(s)"
        )
        return "\n".join(
            [head, *("  " + m.describe() for m in self.first), *("  " + d for d in self.first_decode)]
        )


def audit_documents(
    tok: Tokenizer,
    docs: Iterable[Sequence[int] | np.ndarray],
    texts: Sequence[str] | None = None,
    *,
    table: ByteTable | None = None,
    show: int = 5,
    decode_check_docs: int | None = None,
    first_doc: int = 0,
) -> AuditReport:
    """Audit documents given as token ids (without their BOS). `table` defaults to tok.byte_table()."""
    table = tok.byte_table() if table is None else table
    sp = speller_for(tok)
    boundary = table.is_boundary
    rep = AuditReport()
    for k, doc in enumerate(docs):
        ids = np.asarray(doc, dtype=np.int64)
        d = first_doc + k
        prev = np.concatenate([[BOS_ID], ids[:-1]]).astype(np.int64)
        t_b = table.token_bytes(prev, ids) if ids.size else np.zeros(0, np.int64)
        s_b = sp.token_lengths(ids)
        rep.docs += 1
        rep.tokens += int(ids.size)
        rep.table_bytes += int(t_b.sum())
        rep.spelled_bytes += int(s_b.sum())
        if int(t_b.sum()) != int(s_b.sum()) or not np.array_equal(t_b, s_b):
            rep.mismatched_docs += 1
            if len(rep.first) < show:
                i = int(np.flatnonzero(t_b != s_b)[0])
                text = texts[k] if texts is not None else sp.spell(ids).decode("utf-8", errors="replace")
                rep.first.append(
                    Mismatch(
                        d,
                        i,
                        int(ids[i]),
                        sp.pieces[int(ids[i])],
                        int(t_b[i]),
                        int(s_b[i]),
                        int(t_b.sum()),
                        int(s_b.sum()),
                        text[:80],
                    )
                )
        if sp.decode is not None and (
            decode_check_docs is None or rep.decode_checked_docs < decode_check_docs
        ):
            spelled = sp.spell(ids)
            if ids.size and not boundary[ids].any() and _is_utf8(spelled):
                rep.decode_checked_docs += 1
                decoded = sp.decode(ids)
                if decoded != spelled:
                    rep.decode_disagreements += 1
                    if len(rep.first_decode) < show:
                        j = next(
                            (n for n, (a, b) in enumerate(zip(spelled, decoded, strict=False)) if a != b),
                            min(len(spelled), len(decoded)),
                        )
                        rep.first_decode.append(
                            f"document {d}: the audit's spelling and the tokenizer's decode part at byte {j} "
                            f"({spelled[j : j + 20]!r} vs {decoded[j : j + 20]!r}); the audit cannot vouch for this tokenizer"
                        )
    return rep


def _is_utf8(b: bytes) -> bool:
    try:
        b.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def audit_texts(
    tok: Tokenizer, texts: Sequence[str], *, table: ByteTable | None = None, show: int = 5
) -> AuditReport:
    """Encode each text with the tokenizer and audit the result."""
    ids: list[list[int]] = []
    for i in range(0, len(texts), 256):
        ids += tok.encode(list(texts[i : i + 256]))
    return audit_documents(tok, ids, texts, table=table, show=show)


def split_documents(tokens: np.ndarray, bos_id: int) -> list[np.ndarray]:
    """A token stream cut at BOS: each document's tokens without its BOS (a leading partial one kept)."""
    tokens = np.asarray(tokens)
    starts = np.flatnonzero(tokens == bos_id)
    pieces = np.split(tokens, starts)
    return [p[1:] if p.size and p[0] == bos_id else p for p in pieces if p.size]


def audit_token_stream(
    tok: Tokenizer,
    tokens: np.ndarray,
    *,
    table: ByteTable | None = None,
    show: int = 5,
    decode_check_docs: int = 200,
) -> AuditReport:
    """Audit a validation token stream, document by document (documents split at BOS)."""
    return audit_documents(
        tok,
        split_documents(tokens, tok.bos_id),
        None,
        table=table,
        show=show,
        decode_check_docs=decode_check_docs,
    )


# ---- CLI ----


def cmd_audit_tokenizer(args: argparse.Namespace) -> int:
    """The tokenizer's proof on the documents given (data/proof.py)."""
    from data.build import read_jsonl_texts
    from data.cli import resolve_transform
    from data.proof import prove_tokenizer
    from data.tokenizer import load_tokenizer

    tok = ByteTokenizer() if args.model == "byte260" else load_tokenizer(args.model)
    texts = read_jsonl_texts(args.docs, field=args.field)
    if args.max_docs:
        texts = texts[: args.max_docs]
    if not texts:
        raise DataError(f"{args.docs} holds no documents with a {args.field!r} field")
    from scoring.worker.transform import ConfinedTransforms

    transform = resolve_transform(args.transform, ConfinedTransforms)  # none, a built-in, or FILE.py confined
    rep = prove_tokenizer(tok, texts, canonical=args.canonical, transform=transform)
    if args.json:
        print(json.dumps(rep.as_dict(), sort_keys=True))
    else:
        print(rep.summary())
    return 0 if rep.passed else 1


def register(sub: argparse._SubParsersAction) -> None:
    from data.proof import CANONICALS, TRANSFORMS

    p = sub.add_parser(
        "audit-tokenizer",
        help="prove, document by document, that decoding gives back the canonical text and that the "
        "byte table counts its bytes",
    )
    p.add_argument("model", help="tokenizer: a SentencePiece .model, a byte260.json, or 'byte260'")
    p.add_argument("--docs", required=True, help="documents: a .jsonl file with a text field")
    p.add_argument("--field", default="text", help="JSON field holding the text (default: text)")
    p.add_argument("--max-docs", type=int, default=0, help="prove on the first N documents only (0: all)")
    p.add_argument(
        "--canonical",
        choices=("auto", *CANONICALS),
        default="auto",
        help="the text decoding must give back: sp1024 (the document as the official sp1024 normalises "
        "it), raw (the document as given); auto: sp1024 when the tokenizer normalises as sp1024 does",
    )
    p.add_argument(
        "--transform",
        metavar="none|" + "|".join(TRANSFORMS) + "|FILE.py",
        default="none",
        help="a reversible text transform declared as part of the tokenizer (case: CaseOps markers; FILE.py: a "
        "submitted transform.py, run confined)",
    )
    p.add_argument("--json", action="store_true", help="print the proof's record as one JSON object")
    p.set_defaults(func=cmd_audit_tokenizer)
