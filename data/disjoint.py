"""No validation document in training: the normalisation, the digests, the build's guard, the digest file.

A training document is a copy of a validation document when one of three digests matches (docs/RULES.md,
"No validation document in training"):

    identical text                   blake2b-128 of the UTF-8 text
    equal after normalisation        blake2b-128 of `normalise(text)`
    equal once tokenized             blake2b-128 of `normalise(tokenizer.decode(its tokens))`

`normalise` (NORMALISATION, "pg-norm/1"), in this order:
  1. Unicode NFKC (compatibility forms fold: "ﬁ" -> "fi", fullwidth "Ｈ" -> "H");
  2. case folding (`str.casefold`), then NFKC again, so the result is stable;
  3. every control character (category Cc) other than TAB, LF, FF, CR and NEL removed, and U+200B..U+200F
     (zero-width spaces and marks), U+2581 ("▁"), U+FEFF (BOM) and U+FFFD (replacement) made spaces:
     what the reference tokenizer's own `nmt_nfkc` rule does, so a text and its tokenizer round trip
     normalise alike;
  4. every run of whitespace (`str.isspace`) made one space, and the ends stripped.

The third digest is the one a dataset's shards can be checked against: `pgolf data verify` decodes every
training document (split at BOS) with the dataset's tokenizer and looks its digest up among the
validation documents'. The build computes it from the very tokens it writes, so a build that passes
the guard passes verify.

`ValidationIndex` keeps the digests of the validation documents (three dicts of 16-byte digests,
about 340 bytes a document: 17 MB measured for the challenge's 50,000), never their texts.

The digest file (VAL_DIGESTS_NAME, beside the manifest): format "pg-val-digests" version 1,
little-endian:

    offset  0  8 bytes   magic b"pgvaldig"
    offset  8  uint32    format version (1)
    offset 12  uint32    digest size in bytes (16)
    offset 16  uint64    count N
    offset 24  16 bytes  the normalisation's name, ASCII, NUL-padded ("pg-norm/1")
    offset 40  N x 16    the distinct "equal once tokenized" digests of the validation documents,
                         in ascending byte order
"""

from __future__ import annotations

import hashlib
import os
import re
import struct
import unicodedata
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from data.io import atomic_writer
from data.tokenizer import BYTE260_OFFSET, ByteTokenizer, SentencePieceTokenizer, Tokenizer

NORMALISATION = "pg-norm/1"
NORMALISATION_DESCRIPTION = (
    "NFKC, case folding, NFKC again; control characters other than TAB LF FF CR NEL removed; "
    "U+200B-U+200F, U+2581, U+FEFF, U+FFFD made spaces; whitespace runs made one space, ends stripped"
)
DIGEST = "blake2b-128"
DIGEST_BYTES = 16
RECORD_BYTES = 3 * DIGEST_BYTES
"""Per document: identical-text digest, normalised digest, tokenized digest."""

MATCH_EXACT = "identical text"
MATCH_NORMALISED = f"equal after normalisation ({NORMALISATION}: NFKC, case folding, whitespace collapsed)"
MATCH_TOKENIZED = f"equal once tokenized, decoded and normalised ({NORMALISATION})"

VAL_DIGESTS_NAME = "val_digests.bin"
VAL_DIGESTS_FORMAT = "pg-val-digests"
VAL_DIGESTS_VERSION = 1
_MAGIC = b"pgvaldig"
_HEADER = struct.Struct("<8sIIQ16s")

POLICY_REFUSE = "refuse"
POLICY_DROP = "drop"
DROPPED_LISTED = 1000
"""At most this many dropped documents are listed by index in the manifest (all are counted)."""

_ODD = re.compile(r"[\x00-\x08\x0b\x0e-\x1f\x7f-\x84\x86-\x9f\u200b-\u200f\u2581\ufeff\ufffd]")
_ODD_TABLE = str.maketrans(
    {
        **dict.fromkeys(
            [*range(0x00, 0x09), 0x0B, *range(0x0E, 0x20), *range(0x7F, 0x85), *range(0x86, 0xA0)], None
        ),
        **dict.fromkeys([*range(0x200B, 0x2010), 0x2581, 0xFEFF, 0xFFFD], " "),
    }
)


def normalise(text: str) -> str:
    """The text as `pg-norm/1` sees it (see the module docstring)."""
    if text.isascii():
        s = text.lower()  # NFKC is the identity on ASCII, and ASCII case folding is lower()
    else:
        s = unicodedata.normalize("NFKC", unicodedata.normalize("NFKC", text).casefold())
    if _ODD.search(s):
        s = s.translate(_ODD_TABLE)
    return " ".join(s.split())


def digest(text: str) -> bytes:
    """blake2b-128 of a text's UTF-8 (lone surrogates passed through, so no text is refused here)."""
    return hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=DIGEST_BYTES).digest()


def normalised_digest(text: str) -> bytes:
    return digest(normalise(text))


def without_markers(texts: Sequence[str], markers: Sequence[str]) -> list[str]:
    """The texts with a declared transform's marker characters removed (they spell no canonical byte)."""
    if not markers:
        return list(texts)
    drop = dict.fromkeys(map(ord, markers))
    return [t.translate(drop) for t in texts]


def decode_documents(tok: Tokenizer, docs: Sequence[np.ndarray] | Sequence[list[int]]) -> list[str]:
    """Each document's tokens (no BOS) as text, exactly as the tokenizer decodes them."""
    if isinstance(tok, ByteTokenizer):  # ByteTokenizer.decode, without a Python int per token
        out = []
        for d in docs:
            a = np.asarray(d)
            out.append(
                (a[a >= BYTE260_OFFSET] - BYTE260_OFFSET)
                .astype(np.uint8)
                .tobytes()
                .decode("utf-8", "replace")
            )
        return out
    lists = [d if isinstance(d, list) else np.asarray(d).tolist() for d in docs]
    if isinstance(tok, SentencePieceTokenizer):
        # One thread: parallelism comes from worker processes.
        return list(tok.sp.decode(lists, num_threads=1)) if lists else []
    return [tok.decode(d) for d in lists]


def document_records(
    tok: Tokenizer,
    texts: Sequence[str],
    ids: Sequence[list[int]] | None,
    decoded: Sequence[str] | None = None,
) -> bytes:
    """RECORD_BYTES per document: its three digests, the third from the token ids written (`ids`, no
    BOS; None for byte260, whose tokens decode to the text itself), or from `decoded`, their decoding
    when the caller has it already."""
    out = bytearray()
    if decoded is not None:
        for t, d in zip(texts, decoded, strict=True):
            out += digest(t) + normalised_digest(t) + normalised_digest(d)
        return bytes(out)
    if ids is None:
        if not isinstance(tok, ByteTokenizer):
            raise ValueError(f"token ids are needed to digest documents tokenized by {tok.kind}")
        for t in texts:
            n = normalised_digest(t)
            out += digest(t) + n + n
        return bytes(out)
    for t, d in zip(texts, decode_documents(tok, ids), strict=True):
        out += digest(t) + normalised_digest(t) + normalised_digest(d)
    return bytes(out)


def split_records(blob: bytes) -> Iterator[tuple[bytes, bytes, bytes]]:
    for i in range(0, len(blob), RECORD_BYTES):
        yield (
            blob[i : i + DIGEST_BYTES],
            blob[i + DIGEST_BYTES : i + 2 * DIGEST_BYTES],
            blob[i + 2 * DIGEST_BYTES : i + RECORD_BYTES],
        )


@dataclass(frozen=True, slots=True)
class Match:
    val_index: int
    how: str


@dataclass(slots=True)
class ValidationIndex:
    """Digests of the validation documents -> the index (in the source) of the first with each."""

    exact: dict[bytes, int] = field(default_factory=dict)
    normalised: dict[bytes, int] = field(default_factory=dict)
    tokenized: dict[bytes, int] = field(default_factory=dict)

    def add(self, index: int, exact: bytes, normalised: bytes, tokenized: bytes | None = None) -> None:
        self.exact.setdefault(exact, index)
        self.normalised.setdefault(normalised, index)
        if tokenized is not None:
            self.tokenized.setdefault(tokenized, index)

    def add_text(self, index: int, text: str) -> None:
        self.add(index, digest(text), normalised_digest(text))

    def match(self, exact: bytes, normalised: bytes, tokenized: bytes | None = None) -> Match | None:
        if (i := self.exact.get(exact)) is not None:
            return Match(i, MATCH_EXACT)
        if (i := self.normalised.get(normalised)) is not None:
            return Match(i, MATCH_NORMALISED)
        if tokenized is not None and (i := self.tokenized.get(tokenized)) is not None:
            return Match(i, MATCH_TOKENIZED)
        return None

    def match_text(self, text: str) -> Match | None:
        return self.match(digest(text), normalised_digest(text))


class ValidationLeakError(ValueError):
    """A training document is a copy of a validation document (the build refuses it)."""


def refusal(train_index: int, m: Match) -> str:
    """The one line a refused build prints."""
    return (
        f"source document {train_index} (training) is source document {m.val_index} (validation): {m.how}. "
        "Refused: no validation document may reach training, and no dataset was written. "
        "HINT: remove it from the source, or pass --drop-val-duplicates to drop such documents "
        "(each is counted and listed in the manifest)"
    )


@dataclass(slots=True)
class TrainGuard:
    """Checks training documents against a ValidationIndex under a policy: refuse (stop at the first
    copy) or drop (skip and list each)."""

    index: ValidationIndex
    policy: str = POLICY_REFUSE
    refused: tuple[int, Match] | None = None
    dropped: list[tuple[int, int, str]] = field(default_factory=list)
    dropped_count: int = 0

    def __post_init__(self) -> None:
        if self.policy not in (POLICY_REFUSE, POLICY_DROP):
            raise ValueError(f"policy must be {POLICY_REFUSE!r} or {POLICY_DROP!r}, got {self.policy!r}")

    def keep(self, train_index: int, m: Match | None, *, record: bool = True) -> bool:
        """Whether the document goes to training; a refusal raises ValidationLeakError."""
        if m is None:
            return True
        if self.policy == POLICY_REFUSE:
            self.refused = (train_index, m)
            raise ValidationLeakError(refusal(train_index, m))
        if record:
            self.dropped_count += 1
            if len(self.dropped) < DROPPED_LISTED:
                self.dropped.append((train_index, m.val_index, m.how))
        return False

    def filter_texts(self, texts: Iterable[str], start: int) -> Iterator[str]:
        """Training texts for the tokenizer trainer: copies skipped (drop) or the stream ended at the
        first (refuse; `raise_if_refused` raises after the trainer returns, so no exception crosses
        the trainer's C++ loop)."""
        for i, t in enumerate(texts, start):
            try:
                if not self.keep(i, self.index.match_text(t), record=False):
                    continue
            except ValidationLeakError:
                return
            yield t

    def raise_if_refused(self) -> None:
        if self.refused is not None:
            raise ValidationLeakError(refusal(*self.refused))


# ---- The digest file ----


def write_val_digests(path: str | os.PathLike[str], digests: Iterable[bytes]) -> str:
    """Write the sorted distinct digests; returns the file's sha256."""
    unique = sorted(set(digests))
    if any(len(d) != DIGEST_BYTES for d in unique):
        raise ValueError(f"every digest must be {DIGEST_BYTES} bytes")
    header = _HEADER.pack(
        _MAGIC, VAL_DIGESTS_VERSION, DIGEST_BYTES, len(unique), NORMALISATION.encode("ascii")
    )
    body = header + b"".join(unique)
    with atomic_writer(path) as f:
        f.write(body)
    return hashlib.sha256(body).hexdigest()


def read_val_digests(path: str | os.PathLike[str]) -> frozenset[bytes]:
    """Read and check a digest file (format, version, normalisation, size, order)."""
    path = Path(path)
    raw = path.read_bytes()
    if len(raw) < _HEADER.size:
        raise ValueError(f"{path}: {len(raw)} bytes, shorter than the {_HEADER.size}-byte header")
    magic, version, size, count, norm = _HEADER.unpack_from(raw)
    if magic != _MAGIC:
        raise ValueError(f"{path}: not a {VAL_DIGESTS_FORMAT} file (magic {magic!r})")
    if version != VAL_DIGESTS_VERSION:
        raise ValueError(
            f"{path}: {VAL_DIGESTS_FORMAT} version {version}; this harness reads {VAL_DIGESTS_VERSION}"
        )
    name = norm.rstrip(b"\0").decode("ascii", "replace")
    if size != DIGEST_BYTES or name != NORMALISATION:
        raise ValueError(
            f"{path}: digests of {size} bytes under {name!r}; expected {DIGEST_BYTES} under {NORMALISATION!r}"
        )
    if len(raw) != _HEADER.size + count * DIGEST_BYTES:
        raise ValueError(
            f"{path}: declares {count} digests but holds {len(raw) - _HEADER.size} bytes of them"
        )
    body = raw[_HEADER.size :]
    digests = [body[i : i + DIGEST_BYTES] for i in range(0, len(body), DIGEST_BYTES)]
    if any(a >= b for a, b in zip(digests, digests[1:], strict=False)):
        raise ValueError(f"{path}: digests are not in strictly ascending order")
    return frozenset(digests)
