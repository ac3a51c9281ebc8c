"""A tokenizer's proof: every document decodes to its canonical text, and the byte table counts it.

    pgolf audit-tokenizer MODEL --docs FILE [--canonical auto|sp1024|raw] [--transform none|case]

bpb divides by the bytes the byte table attributes to the scored tokens (data/tokenizer.py); a table
that over-counts makes every score look better, a tokenizer that loses text is scored on less than
the text. The proof, document by document, on every document given (docs/RULES.md, "A tokenizer's
proof"), with `ids = tok.encode(transform.encode_text(canonical(doc)))`, what the build tokenizes:

(a) `transform.decode_text(tok.decode(ids))` equals `canonical(doc)`, compared as UTF-8 bytes;
(b) `table.count_bytes(ids)` (the per-token attribution the windows use, the document after its BOS)
    equals the UTF-8 byte count of `canonical(doc)`;
(c) where the harness can spell the tokenizer's pieces itself (SentencePiece, byte260, either under a
    declared transform), each token's count equals the bytes its piece spells: a table that moves
    bytes between the tokens of a document is refused even when the document's total is right.

The canonical text is a stated choice (`CANONICALS`): `sp1024` is the document as the official sp1024
normalises it (its own nmt_nfkc table, data/tokenizer.py official_nmt_nfkc: NFKC, newlines and runs of
whitespace to one space, no leading or trailing space), so every sp1024 and sp8192 score is what it was; `raw` is the
document exactly as given (byte260 and any tokenizer that keeps the text whole). `auto` takes
`sp1024` when the tokenizer's own round trip of `AUTO_PROBE` is that probe's sp1024 canonical text,
`raw` otherwise; the report names the canonical it proved.

A reversible text transform (`TextTransform`, the reference `CaseTransform`) is a declared part of a
tokenizer: its markers are pieces of their own that spell no canonical byte (the table counts them 0),
and the proof checks the text after `decode_text` and the bytes of the canonical text, not those of
the transformed text. A failure is one line: the first failing document's index, the byte offset of
the first difference and the bytes around it on both sides (or the two byte counts).
"""

from __future__ import annotations

import re
import time
import unicodedata
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from data.official import VAL_ONLY_MIN_BYTES
from data.tokenizer import (
    BYTE260_OFFSET,
    SPACE_MARK,
    ByteTable,
    ByteTokenizer,
    SentencePieceTokenizer,
    Tokenizer,
    official_nmt_nfkc,
)

PROOF_FORMAT = "pg-tokenizer-proof"
PROOF_FORMAT_VERSION = 1
CANONICALS = ("sp1024", "raw")
# Newlines, a run of spaces, a tab, a fullwidth letter and digits, a ligature: the sp1024 normaliser
# changes each of them, a tokenizer that keeps the text whole changes none.
AUTO_PROBE = "Ａ ﬁ １２\n\n  tab\there  end"
AROUND = 16  # bytes shown on each side of a first difference

# ---- the canonical text ----

_sp1024_normalizer: Any = None


def sp1024_canonical(texts: list[str]) -> list[str]:
    """The documents as the official sp1024 normalises them (what its decode gives back)."""
    global _sp1024_normalizer
    if _sp1024_normalizer is None:
        # The official sp1024's normalizer_spec: its nmt_nfkc table, no dummy prefix (docs/RULES.md).
        _sp1024_normalizer = official_nmt_nfkc()
    if not texts:
        return []
    return [t.replace(SPACE_MARK, " ") for t in _sp1024_normalizer.normalize(texts)]


CANONICAL_DESCRIPTIONS = {
    "sp1024": "the document as the official sp1024 normalises it (nmt_nfkc: NFKC, newlines and runs of whitespace "
    "to one space, no leading or trailing space)",
    "raw": "the document exactly as given",
}


def canonical_description(name: str) -> str:
    return CANONICAL_DESCRIPTIONS[name]


def raw_canonical(texts: list[str]) -> list[str]:
    """The documents exactly as given."""
    return list(texts)


def canonical_function(name: str) -> Callable[[list[str]], list[str]]:
    if name == "sp1024":
        return sp1024_canonical
    if name == "raw":
        return raw_canonical
    raise ValueError(f"unknown canonical text {name!r}: expected auto or one of {', '.join(CANONICALS)}")


def choose_canonical(tok: Tokenizer, transform: BatchTransform | None = None) -> str:
    """`auto`: sp1024 when the tokenizer's round trip of the probe (through `transform`, when one is
    declared) is the probe's sp1024 canonical text, raw otherwise."""
    fed = [AUTO_PROBE] if transform is None else transform.encode_texts([AUTO_PROBE])
    back = tok.decode(tok.encode(fed)[0])
    if transform is not None:
        back = transform.decode_texts([back])[0]
    return "sp1024" if back == sp1024_canonical([AUTO_PROBE])[0] else "raw"


# ---- reversible text transforms ----


class TextTransform(Protocol):
    """A reversible transform applied before encoding and undone after decoding.

    `markers` are the characters the transform adds; each must be one piece of the tokenizer (a
    user-defined symbol), which the byte table counts as 0 bytes: the canonical bytes are counted by
    the pieces of the text itself, so the transform may change characters only for ones of the same
    UTF-8 length.
    """

    name: str
    markers: tuple[str, ...]

    def encode_text(self, text: str) -> str: ...

    def decode_text(self, text: str) -> str: ...


class _CaseTable(dict[int, str]):
    """str.translate table of CaseTransform, filled on first sight of each character."""

    def __missing__(self, cp: int) -> str:
        ch = chr(cp)
        out = ch
        if ch in CaseTransform.markers:
            out = CaseTransform.ESCAPE + chr(cp + CaseTransform.SHIFT)
        else:
            lo = ch.lower()
            if (
                len(lo) == 1
                and lo != ch
                and lo.upper() == ch
                and len(lo.encode("utf-8")) == len(ch.encode("utf-8"))
                and unicodedata.normalize("NFKC", ch) == ch
                and unicodedata.normalize("NFKC", lo) == lo
            ):
                out = CaseTransform.UPPER + lo
        self[cp] = out
        return out


class CaseTransform:
    """The reference transform ("CaseOps"): lower-case text, a marker before each upper-case letter.

    UPPER (U+E000) says the next character is the upper case of the one written; a letter is lowered
    only when that round trip is exact, keeps its UTF-8 length and is NFKC-stable (so the sp1024
    normaliser cannot change it), else it is left as it is. A literal U+E000 or U+E001 in the text is
    written ESCAPE (U+E001) + the character 0x100 above it, which the tokenizer spells with its 3 bytes.
    """

    name = "case"
    UPPER = "\ue000"
    ESCAPE = "\ue001"
    SHIFT = 0x100
    markers: tuple[str, ...] = (UPPER, ESCAPE)
    _decode_re = re.compile("[\ue000\ue001].?", re.S)

    def __init__(self) -> None:
        self._table = _CaseTable()

    def encode_text(self, text: str) -> str:
        return text.translate(self._table)

    def decode_text(self, text: str) -> str:
        return self._decode_re.sub(self._undo, text)

    def _undo(self, m: re.Match[str]) -> str:
        s = m.group(0)
        if len(s) == 2 and s[0] == self.UPPER and len(s[1].upper()) == 1:
            return s[1].upper()
        if len(s) == 2 and s[0] == self.ESCAPE and chr(ord(s[1]) - self.SHIFT) in self.markers:
            return chr(ord(s[1]) - self.SHIFT)
        return s  # not a marker's work: left for the proof to show


TRANSFORMS: dict[str, Callable[[], TextTransform]] = {"case": CaseTransform}


class BatchTransform(Protocol):
    """One split's transform, a batch at a time (a confined child's, or a built-in one run here)."""

    def encode_texts(self, texts: list[str]) -> list[str]: ...

    def decode_texts(self, texts: list[str]) -> list[str]: ...


class SplitTransforms(Protocol):
    """A declared transform that is run one split at a time (`for_split("val"|"train")`): a submitted
    transform.py runs in a confined child per split (scoring/worker/transform.py), never two alive together,
    so that what it sees of one split cannot reach the other. `sha256` is the transform file's."""

    name: str
    markers: tuple[str, ...]
    sha256: str | None

    def for_split(self, split: str) -> AbstractContextManager[BatchTransform]: ...


class DeclaredTransform:
    """A TextTransform that only declares (name, markers): what TransformedTokenizer needs of a batch
    transform for its marker check and byte table; its texts go through a BatchTransform instead."""

    def __init__(self, name: str, markers: tuple[str, ...]):
        self.name, self.markers = name, tuple(markers)

    def encode_text(self, text: str) -> str:
        raise RuntimeError(f"the {self.name} transform runs a batch at a time (for_split)")

    def decode_text(self, text: str) -> str:
        raise RuntimeError(f"the {self.name} transform runs a batch at a time (for_split)")


class InProcessBatch:
    """A TextTransform run here, a batch at a time: a built-in transform (the harness's own code) takes the
    same path through the encoder and the proof as a confined one."""

    def __init__(self, transform: TextTransform):
        self.transform = transform

    def encode_texts(self, texts: list[str]) -> list[str]:
        return [self.transform.encode_text(t) for t in texts]

    def decode_texts(self, texts: list[str]) -> list[str]:
        return [self.transform.decode_text(t) for t in texts]


class InProcessTransforms:
    """A TextTransform as SplitTransforms: every split's batch transform is the same InProcessBatch (the
    harness's own or a test's code: nothing of one split to keep from the other)."""

    sha256: str | None = None

    def __init__(self, transform: TextTransform):
        self.name, self.markers = transform.name, tuple(transform.markers)
        self._batch = InProcessBatch(transform)

    @contextmanager
    def for_split(self, split: str) -> Iterator[BatchTransform]:
        yield self._batch


def split_transforms(transform: str | TextTransform | SplitTransforms | None) -> SplitTransforms | None:
    """Any declared transform as SplitTransforms: a built-in's name, a TextTransform (run here), or a
    SplitTransforms already (a submitted transform.py, run confined)."""
    if transform is None:
        return None
    if isinstance(transform, str):
        if transform not in TRANSFORMS:
            raise ValueError(f"--transform {transform!r}: expected none or one of {', '.join(TRANSFORMS)}")
        return InProcessTransforms(TRANSFORMS[transform]())
    if hasattr(transform, "for_split"):
        return transform  # type: ignore[return-value]
    return InProcessTransforms(transform)


def declared_tokenizer(inner: Tokenizer, declared: tuple[str, tuple[str, ...]] | None) -> Tokenizer:
    """The tokenizer with a declared transform's (name, markers) markers as zero-byte pieces, each checked
    to be one piece (its texts go through a BatchTransform)."""
    if declared is None:
        return inner
    return TransformedTokenizer(inner, DeclaredTransform(*declared))


class TransformedTokenizer:
    """A tokenizer with a declared transform: encode(encode_text(t)), decode_text(decode(ids))."""

    def __init__(self, inner: Tokenizer, transform: TextTransform):
        self.inner, self.transform = inner, transform
        self.kind = f"{inner.kind}+{transform.name}"
        self.vocab_size = inner.vocab_size
        self.bos_id = inner.bos_id
        encoded = inner.encode(list(transform.markers))
        for m, ids in zip(transform.markers, encoded, strict=True):
            if len(ids) != 1:
                raise ValueError(
                    f"the {transform.name} transform's marker U+{ord(m):04X} is {len(ids)} tokens of this "
                    f"{inner.kind} tokenizer, not one piece: add each marker as a user-defined symbol, so "
                    "that the byte table can count it as 0 bytes"
                )
        self.marker_ids = tuple(int(ids[0]) for ids in encoded)

    def encode(self, texts: Sequence[str]) -> list[list[int]]:
        return self.inner.encode([self.transform.encode_text(t) for t in texts])

    def decode(self, ids: Sequence[int]) -> str:
        return self.transform.decode_text(self.inner.decode(ids))

    def byte_table(self) -> ByteTable:
        t = self.inner.byte_table()
        base, space, boundary = t.base_bytes.copy(), t.has_leading_space.copy(), t.is_boundary.copy()
        for i in self.marker_ids:
            base[i], space[i], boundary[i] = 0, False, False
        return ByteTable(base, space, boundary)


# ---- the pieces' length: an entry's own tokenizer holds no long text ----

MAX_PIECE_CHARS = 16
"""The most characters a piece of a SentencePiece tokenizer may spell (its leading "▁" included): SentencePiece's
own trainer bound (`max_sentencepiece_length`), and the longest piece of the official sp1024 (12) and sp8192 (16).
A tokenizer does not count toward the cap, and its pieces are chosen by the entry: with pieces of any length it
could hold the validation text itself, each document a few tokens of consecutive ids."""


def refuse_long_pieces(tok: Tokenizer) -> None:
    """ValueError (one line) when a piece of the tokenizer (a transform's inner one) spells more than
    MAX_PIECE_CHARS characters; control, unknown, unused and byte pieces spell nothing or one byte."""
    inner = tok.inner if isinstance(tok, TransformedTokenizer) else tok
    if not isinstance(inner, SentencePieceTokenizer):
        return
    sp = inner.sp
    long = [
        i
        for i in range(inner.vocab_size)
        if len(sp.id_to_piece(i)) > MAX_PIECE_CHARS
        and not (sp.is_control(i) or sp.is_unknown(i) or sp.is_unused(i) or sp.is_byte(i))
    ]
    if long:
        piece = sp.id_to_piece(long[0])
        raise ValueError(
            f"tokenizer {inner.path.name}: {len(long):,} piece(s) longer than {MAX_PIECE_CHARS} characters, the first id "
            f"{long[0]} of {len(piece):,} ({piece[:24]!r}…): a tokenizer does not count toward the cap, so a piece may "
            f"spell at most {MAX_PIECE_CHARS} characters (SentencePiece's own bound, max_sentencepiece_length)"
        )


def refuse_denormalizer(tok: Tokenizer) -> None:
    """ValueError (one line) when a SentencePiece tokenizer (a transform's inner one) has denormalisation rules.

    SentencePiece rewrites its decoded text with the model's `denormalizer_spec` rules, of any length, which no
    piece spells and no proof sees: with a normaliser that turns each 40 characters of validation text into as many
    3-byte characters (one piece each, under VAL_ONLY_MIN_BYTES) and a denormaliser that turns them back, every
    proof held while the tokenizer held the text (tests/unit/data/test_attack_data.py). The official tokenizers and
    every one SentencePiece trains without `denormalization_rule_tsv` have none."""
    inner = tok.inner if isinstance(tok, TransformedTokenizer) else tok
    if not isinstance(inner, SentencePieceTokenizer):
        return
    from sentencepiece import sentencepiece_model_pb2

    proto = sentencepiece_model_pb2.ModelProto()  # type: ignore[attr-defined]
    proto.ParseFromString(inner.sp.serialized_model_proto())
    rules = proto.denormalizer_spec.precompiled_charsmap
    if rules:
        raise ValueError(
            f"tokenizer {inner.path.name}: its denormalizer_spec holds {len(rules):,} bytes of rules that rewrite the "
            "decoded text, text no piece spells: a tokenizer does not count toward the cap, so it may have none "
            "(train it without denormalization_rule_tsv, or clear denormalizer_spec)"
        )


# ---- the pieces the validation split alone uses: text the tokenizer holds, on a record track ----


def val_only_pieces(
    val_counts: np.ndarray, train_counts: np.ndarray, spell: PieceLengths | None
) -> dict[str, Any]:
    """The manifest's `pieces` block: how many pieces of VAL_ONLY_MIN_BYTES bytes or more the validation tokens use
    and the training tokens never do (both as counts per id), and the first of them."""
    n = min(val_counts.size, train_counts.size)
    only = np.flatnonzero((val_counts[:n] > 0) & (train_counts[:n] == 0))
    if spell is not None:
        only = only[spell.lengths[only] >= VAL_ONLY_MIN_BYTES]
    return {
        "val_only": int(only.size),
        "val_only_ids": only[:16].tolist(),
        "min_bytes": VAL_ONLY_MIN_BYTES,
        "meaning": "pieces the validation tokens use and the training tokens never do (data/proof.py)",
    }


# ---- the harness's own spelling of the pieces (for (c) and for locating a count failure) ----


_BYTE_PIECE = re.compile(r"^<0x([0-9A-Fa-f]{2})>$")


@dataclass(frozen=True)
class Speller:
    """Per-id spelling: raw bytes (leading "▁" as a space), whether it starts with "▁", the piece."""

    raw: list[bytes]
    lead_space: np.ndarray  # bool (V,)
    pieces: list[str]
    decode: Any  # ids -> bytes, the tokenizer's own decode (None: no cross-check)

    @property
    def lengths(self) -> np.ndarray:
        return np.array([len(b) for b in self.raw], dtype=np.int64)

    def token_lengths(self, ids: np.ndarray) -> np.ndarray:
        """Bytes each token of one document spells (the first token drops its leading space)."""
        out = self.lengths[ids]
        if ids.size:
            out[0] -= int(self.lead_space[ids[0]])
        return out

    def spell(self, ids: np.ndarray) -> bytes:
        b = b"".join(self.raw[i] for i in ids.tolist())
        return b[1:] if ids.size and self.lead_space[ids[0]] else b


def speller_for(tok: Tokenizer) -> Speller:
    """The independent speller of a SentencePiece or byte260 tokenizer."""
    V = tok.vocab_size
    if isinstance(tok, ByteTokenizer):
        raw = [b""] * BYTE260_OFFSET + [bytes([b]) for b in range(256)]
        pieces = ["<pad>", "<s>", "</s>", "<unk>"] + [f"<0x{b:02X}>" for b in range(256)]
        return Speller(raw, np.zeros(V, dtype=np.bool_), pieces, None)
    if isinstance(tok, SentencePieceTokenizer):
        sp = tok.sp
        raw, lead, pieces = [], np.zeros(V, dtype=np.bool_), []
        for i in range(V):
            piece = sp.id_to_piece(i)
            pieces.append(piece)
            if sp.is_control(i) or sp.is_unknown(i) or sp.is_unused(i):
                raw.append(b"")
            elif sp.is_byte(i):
                m = _BYTE_PIECE.match(piece)
                if m is None:
                    raise ValueError(f"tokenizer {tok.path}: byte piece {i} is {piece!r}, not <0xHH>")
                raw.append(bytes([int(m.group(1), 16)]))
            else:
                raw.append(piece.replace(SPACE_MARK, " ").encode("utf-8"))
                lead[i] = piece.startswith(SPACE_MARK)
        return Speller(raw, lead, pieces, lambda ids: sp.decode([int(i) for i in ids], out_type=bytes))
    raise ValueError(
        f"the tokenizer audit reads SentencePiece and byte260 tokenizers, not {type(tok).__name__}"
    )


@dataclass(frozen=True)
class PieceLengths:
    """Bytes each piece spells (a leading "▁" as one space), and the pieces' names."""

    lengths: np.ndarray  # int64 (V,)
    lead_space: np.ndarray  # bool (V,)
    pieces: list[str]

    def of(self, ids: np.ndarray) -> np.ndarray:
        out = self.lengths[ids]
        if ids.size:
            out[0] -= int(self.lead_space[ids[0]])  # after BOS the leading "▁" spells nothing
        return out


def piece_lengths(tok: Tokenizer) -> PieceLengths | None:
    """The harness's spelling of a SentencePiece or byte260 tokenizer's pieces; None for other kinds."""
    inner = tok.inner if isinstance(tok, TransformedTokenizer) else tok
    if not isinstance(inner, SentencePieceTokenizer | ByteTokenizer):
        return None
    try:
        sp = speller_for(inner)
    except ValueError:  # a byte piece not named <0xHH>: no spelling, the proof stands on (a) and (b)
        return None
    lengths = sp.lengths.copy()
    if isinstance(tok, TransformedTokenizer):
        lengths[list(tok.marker_ids)] = 0
    return PieceLengths(lengths, sp.lead_space, sp.pieces)


# ---- the proof ----


def _around(b: bytes, off: int) -> str:
    lo, hi = max(0, off - AROUND), min(len(b), off + AROUND)
    return ("…" if lo else "") + repr(b[lo:hi]) + ("…" if hi < len(b) else "")


def _first_difference(a: bytes, b: bytes) -> int:
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    lo, hi = 0, n  # the common prefix is a[:lo]; a[:hi] != b[:hi]
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid
    return lo


@dataclass(frozen=True)
class DocFailure:
    doc: int
    kind: str  # "decode" | "count" | "attribution" | "text"
    offset: int | None  # byte offset in the canonical text of the first difference
    detail: str

    def line(self) -> str:
        return f"document {self.doc}: {self.detail}"


@dataclass
class ProofReport:
    canonical: str
    transform: str | None
    tokenizer: str
    docs: int = 0
    tokens: int = 0
    canonical_bytes: int = 0
    table_bytes: int = 0
    failed_docs: int = 0
    attribution_checked_docs: int = 0
    seconds: float = 0.0
    encode_seconds: float = 0.0
    first: DocFailure | None = None

    @property
    def passed(self) -> bool:
        return self.docs > 0 and self.failed_docs == 0

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else 0.0

    def as_dict(self) -> dict[str, Any]:
        return {
            "format": PROOF_FORMAT,
            "format_version": PROOF_FORMAT_VERSION,
            "passed": self.passed,
            "tokenizer": self.tokenizer,
            "canonical": self.canonical,
            "transform": self.transform,
            "docs": self.docs,
            "tokens": self.tokens,
            "canonical_bytes": self.canonical_bytes,
            "table_bytes": self.table_bytes,
            "failed_docs": self.failed_docs,
            "attribution_checked_docs": self.attribution_checked_docs,
            "first_failure": None if self.first is None else self.first.line(),
            "first_failed_doc": None if self.first is None else self.first.doc,
            "first_failure_kind": None if self.first is None else self.first.kind,
            "first_failure_offset": None if self.first is None else self.first.offset,
            "seconds": round(self.seconds, 3),
            "encode_seconds": round(self.encode_seconds, 3),
            "tokens_per_s": round(self.tokens_per_s),
        }

    def summary(self) -> str:
        """One line: the verdict, and on a failure the first failing document."""
        what = f"canonical {self.canonical}, transform {self.transform or 'none'}, tokenizer {self.tokenizer}"
        speed = (
            f"{self.seconds:.2f} s ({self.encode_seconds:.2f} s encoding), {self.tokens_per_s:,.0f} tokens/s, "
            f"{self.seconds / max(self.tokens, 1) * 1e6:.2f} s per 1M tokens"
        )
        if self.first is None:
            if not self.docs:
                return f"tokenizer proof FAILED ({what}): no documents given"
            return (
                f"tokenizer proof PASSED ({what}): {self.docs:,} documents, {self.tokens:,} tokens, "
                f"{self.canonical_bytes:,} canonical bytes; every document decodes to its canonical text and "
                f"the byte table counts its bytes (per token on {self.attribution_checked_docs:,}); {speed}"
            )
        return (
            f"tokenizer proof FAILED ({what}): {self.first.line()} "
            f"[{self.failed_docs:,} of {self.docs:,} documents fail]"
        )


def _check_document(
    d: int,
    canonical: str,
    ids_list: Sequence[int],
    decoded: str,
    bos_id: int,
    table: ByteTable,
    spell: PieceLengths | None,
    rep: ProofReport,
) -> DocFailure | None:
    try:
        cb = canonical.encode("utf-8")
    except UnicodeEncodeError as e:
        return DocFailure(
            d, "text", None, f"the document is not valid Unicode text ({e.reason} at {e.start})"
        )
    rep.canonical_bytes += len(cb)
    ids = np.asarray(ids_list, dtype=np.int64)
    rep.tokens += int(ids.size)
    if ids.size and (int(ids.min()) < 0 or int(ids.max()) >= table.vocab_size):
        return DocFailure(d, "text", None, f"a token id outside the byte table's {table.vocab_size} entries")
    db = decoded.encode("utf-8", errors="surrogatepass")
    prev = np.concatenate([[bos_id], ids[:-1]]).astype(np.int64)
    per = table.token_bytes(prev, ids) if ids.size else np.zeros(0, np.int64)
    counted = int(per.sum())
    rep.table_bytes += counted
    if db != cb:
        at = _first_difference(cb, db)
        return DocFailure(
            d,
            "decode",
            at,
            f"decoding differs from the canonical text at byte {at:,} (canonical {len(cb):,} bytes, "
            f"decoded {len(db):,}): canonical {_around(cb, at)} vs decoded {_around(db, at)}",
        )
    spelled = spell.of(ids) if spell is not None else None
    usable = spelled is not None and int(spelled.sum()) == len(cb)
    where = ""
    off: int | None = None
    if usable and spelled is not None and not np.array_equal(per, spelled):
        i = int(np.flatnonzero(per != spelled)[0])
        off = int(spelled[:i].sum())
        piece = spell.pieces[int(ids[i])] if spell is not None else "?"
        where = (
            f"first departure at byte {off:,}, token {i} (id {int(ids[i])}, piece {piece!r}): table "
            f"{int(per[i])}, spelled {int(spelled[i])}; canonical there {_around(cb, off)}"
        )
    if counted != len(cb):
        return DocFailure(
            d,
            "count",
            off,
            f"the byte table counts {counted:,} bytes, the canonical text has {len(cb):,} "
            f"({counted - len(cb):+,}); "
            + (
                where
                or (
                    "no offset: the harness cannot spell this tokenizer's pieces"
                    if spelled is None
                    else f"no offset: the pieces spell {int(spelled.sum()):,} bytes, not the canonical count"
                )
            ),
        )
    if usable:
        rep.attribution_checked_docs += 1
        if where:
            return DocFailure(
                d,
                "attribution",
                off,
                f"the document's total is right ({len(cb):,} bytes) but the byte table moves bytes between its "
                f"tokens: {where}",
            )
    return None


def prove_tokenizer(
    tok: Tokenizer,
    texts: Sequence[str],
    *,
    canonical: str = "auto",
    transform: str | TextTransform | SplitTransforms | None = None,
    table: ByteTable | None = None,
    batch_docs: int = 256,
) -> ProofReport:
    """Run the proof on every document of `texts` (see the module's docstring).

    A declared transform runs a batch at a time through one split's batch transform ("audit"; a submitted
    transform.py in one confined child): each batch is transformed, tokenized once, decoded, and the
    decodings transformed back."""
    tfs = split_transforms(transform)
    if tfs is None:
        return _prove(tok, texts, canonical, None, None, table, batch_docs)
    if canonical == "auto":  # its own child, as the build's: the audit child's documents count from 0
        with tfs.for_split("probe") as probe:
            canonical = choose_canonical(tok, probe)
    with tfs.for_split("audit") as child:
        return _prove(tok, texts, canonical, tfs, child, table, batch_docs)


def _prove(
    inner: Tokenizer,
    texts: Sequence[str],
    canonical: str,
    transforms: SplitTransforms | None,
    child: BatchTransform | None,
    table: ByteTable | None,
    batch_docs: int,
) -> ProofReport:
    t0 = time.perf_counter()
    tok = declared_tokenizer(inner, None if transforms is None else (transforms.name, transforms.markers))
    refuse_long_pieces(tok)
    refuse_denormalizer(tok)
    name = choose_canonical(inner, child) if canonical == "auto" else canonical
    canon = canonical_function(name)
    table = tok.byte_table() if table is None else table
    spell = piece_lengths(tok)
    rep = ProofReport(name, None if transforms is None else transforms.name, tok.kind)
    for start in range(0, len(texts), batch_docs):
        canonical_chunk = canon(list(texts[start : start + batch_docs]))
        t1 = time.perf_counter()
        # what the build tokenizes: the canonical text, transformed when a transform is declared
        encoded = inner.encode(canonical_chunk if child is None else child.encode_texts(canonical_chunk))
        rep.encode_seconds += time.perf_counter() - t1
        if len(encoded) != len(canonical_chunk):
            raise ValueError(f"the tokenizer returned {len(encoded)} documents for {len(canonical_chunk)}")
        decoded = [inner.decode(ids) for ids in encoded]  # the tokenizer's own decode, whatever it is
        if child is not None:
            decoded = child.decode_texts(decoded)
        for k, (c, ids, dec) in enumerate(zip(canonical_chunk, encoded, decoded, strict=True)):
            rep.docs += 1
            failure = _check_document(start + k, c, ids, dec, tok.bos_id, table, spell, rep)
            if failure is not None:
                rep.failed_docs += 1
                if rep.first is None:
                    rep.first = failure
    rep.seconds = time.perf_counter() - t0
    return rep


# ---- the build's proof: every document, and the bytes each token covers ----


def attribute_documents(
    canonical_texts: Sequence[str],
    ids_list: Sequence[Sequence[int]],
    decoded: Sequence[str],
    spell: PieceLengths,
) -> tuple[list[np.ndarray], list[int], DocFailure | None]:
    """The proof `pgolf data build` runs on every document it tokenizes, and the byte counts it keeps.

    Per document: the tokens' decoding (`decoded`, the transform undone) must be its canonical text byte
    for byte, and the bytes each token's piece spells (`spell`: markers 0, a leading "▁" after BOS
    nothing) must sum to the canonical text's UTF-8 byte count. Returns each document's per-token counts
    and canonical byte count up to the first failure, and that failure (None when all hold); the
    failure's `doc` is the index in `canonical_texts`.
    """
    per_doc: list[np.ndarray] = []
    doc_bytes: list[int] = []
    for d, (text, ids_raw, dec) in enumerate(zip(canonical_texts, ids_list, decoded, strict=True)):
        try:
            cb = text.encode("utf-8")
        except UnicodeEncodeError as e:
            return (
                per_doc,
                doc_bytes,
                DocFailure(d, "text", None, f"not valid Unicode text ({e.reason} at {e.start})"),
            )
        db = dec.encode("utf-8", errors="surrogatepass")
        if db != cb:
            at = _first_difference(cb, db)
            return (
                per_doc,
                doc_bytes,
                DocFailure(
                    d,
                    "decode",
                    at,
                    f"decoding differs from the canonical text at byte {at:,} (canonical {len(cb):,} bytes, decoded "
                    f"{len(db):,}): canonical {_around(cb, at)} vs decoded {_around(db, at)}",
                ),
            )
        ids = np.asarray(ids_raw, dtype=np.int64)
        per = spell.of(ids) if ids.size else np.zeros(0, np.int64)
        if int(per.sum()) != len(cb):
            return (
                per_doc,
                doc_bytes,
                DocFailure(
                    d,
                    "count",
                    None,
                    f"the tokens' pieces spell {int(per.sum()):,} bytes, the canonical text has {len(cb):,}",
                ),
            )
        per_doc.append(per)
        doc_bytes.append(len(cb))
    return per_doc, doc_bytes, None
