"""The bytes bpb divides by: counted from the documents, one count per validation token.

bits per byte = loss in bits / the UTF-8 bytes of the text scored. The text is the *canonical* text
of the validation documents (a choice each dataset and track states: data/proof.py CANONICALS), and
its bytes are counted by the harness when it builds the dataset, never read off a submission's piece
table: `pgolf data build` tokenizes each document's canonical text, proves that the tokens decode to
it byte for byte, and attributes its bytes to the tokens (each token gets the bytes its piece spells,
a transform's markers none); a document whose token counts do not sum to its canonical byte count
fails the build. The counts go beside the validation shards in `val_bytes.bin`:

    header   256 int32 (little-endian): [0] magic 20261202, [1] version 1, [2] token count,
             [3] document count, the rest zero
    tokens   uint16 per validation token, in shard order: the bytes of canonical text that token
             covers (0 for a BOS)
    docs     uint32 per validation document: its canonical text's UTF-8 byte count

The file size must be exactly 1024 + 2 * tokens + 4 * docs bytes. The scorer (scoring/score/scorer.py)
loads it through `load_canonical_bytes`, which checks it against the manifest (sha256, counts), the
validation tokens (a zero at every BOS and nowhere a document has text), itself (each document's
token counts sum to its canonical byte count) and the tokenizer (each count is what its token's piece
spells, `check_spelled`), and a scored target then counts `counts[position]`:
a windowed or subset evaluation counts exactly the bytes its scored tokens cover, and two tokenizers
scored on the same documents divide by the same total.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from data.io import atomic_writer, sha256_file

VAL_BYTES_NAME = "val_bytes.bin"
VAL_BYTES_MAGIC = 20261202
VAL_BYTES_VERSION = 1
HEADER_INTS = 256
HEADER_BYTES = HEADER_INTS * 4
TOKEN_BYTES_DTYPE = np.dtype("<u2")
DOC_BYTES_DTYPE = np.dtype("<u4")
BYTE_SOURCE_CANONICAL = "canonical"
BYTE_SOURCE_TABLE = "piece_table"


class CanonicalBytesError(ValueError):
    """The byte counts beside a dataset are malformed or do not belong to it."""


def write_val_bytes(path: str | os.PathLike[str], token_bytes: np.ndarray, doc_bytes: np.ndarray) -> str:
    """Write the counts (see the module docstring); returns the file's sha256."""
    token_bytes, doc_bytes = np.asarray(token_bytes), np.asarray(doc_bytes)
    if token_bytes.size and int(token_bytes.max()) > np.iinfo(TOKEN_BYTES_DTYPE).max:
        raise ValueError(f"a token covering {int(token_bytes.max())} bytes does not fit {VAL_BYTES_NAME}")
    header = np.zeros(HEADER_INTS, dtype="<i4")
    header[:4] = VAL_BYTES_MAGIC, VAL_BYTES_VERSION, token_bytes.size, doc_bytes.size
    with atomic_writer(path) as f:
        f.write(header.tobytes())
        f.write(token_bytes.astype(TOKEN_BYTES_DTYPE, copy=False).tobytes())
        f.write(doc_bytes.astype(DOC_BYTES_DTYPE, copy=False).tobytes())
    return sha256_file(path)


@dataclass(frozen=True)
class ValBytes:
    token_bytes: np.ndarray  # uint16 (tokens,)
    doc_bytes: np.ndarray  # uint32 (docs,)


def read_val_bytes(path: str | os.PathLike[str]) -> ValBytes:
    """Validated contents of a `val_bytes.bin`."""
    path = Path(path)
    hint = "HINT: rebuild the dataset with `pgolf data build`."
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found: the dataset has no canonical byte counts. {hint}")
    size = path.stat().st_size
    if size < HEADER_BYTES:
        raise CanonicalBytesError(f"{path} is {size} bytes, shorter than its header. {hint}")
    header = np.fromfile(path, dtype="<i4", count=HEADER_INTS)
    if int(header[0]) != VAL_BYTES_MAGIC or int(header[1]) != VAL_BYTES_VERSION:
        raise CanonicalBytesError(
            f"{path}: magic {int(header[0])} version {int(header[1])}, expected {VAL_BYTES_MAGIC} version "
            f"{VAL_BYTES_VERSION}: not this harness's byte counts. {hint}"
        )
    tokens, docs = int(header[2]), int(header[3])
    expected = HEADER_BYTES + TOKEN_BYTES_DTYPE.itemsize * tokens + DOC_BYTES_DTYPE.itemsize * docs
    if tokens < 0 or docs < 0 or size != expected:
        raise CanonicalBytesError(
            f"{path} declares {tokens} tokens and {docs} documents, so {expected} bytes, but is {size}. {hint}"
        )
    raw = path.read_bytes()
    t_end = HEADER_BYTES + TOKEN_BYTES_DTYPE.itemsize * tokens
    return ValBytes(
        np.frombuffer(raw, dtype=TOKEN_BYTES_DTYPE, count=tokens, offset=HEADER_BYTES),
        np.frombuffer(raw, dtype=DOC_BYTES_DTYPE, count=docs, offset=t_end),
    )


class TargetBytes(Protocol):
    """What the evaluation asks of a denominator: the bytes of each scored target."""

    @property
    def vocab_size(self) -> int: ...

    @property
    def source(self) -> str: ...

    def target_bytes(
        self, positions: np.ndarray, prev_ids: np.ndarray, target_ids: np.ndarray
    ) -> np.ndarray: ...


@dataclass(frozen=True)
class CanonicalBytes:
    """Bytes per validation token, from the documents: what a scored target at a position counts."""

    counts: np.ndarray  # int64 (tokens,)
    vocab_size: int
    source: str = BYTE_SOURCE_CANONICAL

    def target_bytes(self, positions: np.ndarray, prev_ids: np.ndarray, target_ids: np.ndarray) -> np.ndarray:
        """Bytes of the targets at `positions` of the validation stream (the ids are not needed)."""
        del prev_ids, target_ids
        return self.counts[np.asarray(positions, dtype=np.int64)]


def check_val_bytes(vb: ValBytes, tokens: np.ndarray, bos_id: int, where: str) -> None:
    """The counts belong to these tokens: one per token, 0 at each BOS, each document's sum its total."""
    if vb.token_bytes.size != tokens.size:
        raise CanonicalBytesError(
            f"{where}: {vb.token_bytes.size:,} byte counts for {tokens.size:,} validation tokens: the counts "
            "belong to another dataset. HINT: rebuild the dataset with `pgolf data build`"
        )
    starts = np.flatnonzero(np.asarray(tokens) == bos_id)  # each document's BOS
    if starts.size != vb.doc_bytes.size or (starts.size and starts[0] != 0):
        raise CanonicalBytesError(
            f"{where}: {vb.doc_bytes.size:,} documents counted, the validation tokens hold {starts.size:,} "
            "(BOS tokens): the counts belong to another dataset"
        )
    if starts.size and int(vb.token_bytes[starts].max()) != 0:
        d = int(np.flatnonzero(vb.token_bytes[starts])[0])
        raise CanonicalBytesError(f"{where}: the BOS of document {d} is counted as text")
    sums = np.add.reduceat(vb.token_bytes.astype(np.int64), starts) if starts.size else np.zeros(0, np.int64)
    bad = np.flatnonzero(sums != vb.doc_bytes.astype(np.int64))
    if bad.size:
        d = int(bad[0])
        raise CanonicalBytesError(
            f"{where}: document {d}'s tokens count {int(sums[d]):,} bytes, its canonical text has "
            f"{int(vb.doc_bytes[d]):,}"
        )


def canonical_entry(manifest_raw: dict[str, Any]) -> dict[str, Any] | None:
    """The manifest's `canonical` block (None: a dataset built before version 3, or downloaded)."""
    block = manifest_raw.get("canonical")
    return block if isinstance(block, dict) else None


def load_canonical_bytes(
    root: str | os.PathLike[str],
    manifest_raw: dict[str, Any],
    tokens: np.ndarray,
    vocab_size: int,
    bos_id: int,
) -> CanonicalBytes | None:
    """The dataset's canonical byte counts, checked (None when the dataset has none)."""
    block = canonical_entry(manifest_raw)
    if block is None:
        return None
    entry = block.get("val_bytes") or {}
    path = Path(root) / str(entry.get("file", VAL_BYTES_NAME))
    if sha256_file(path) != entry.get("sha256"):
        raise CanonicalBytesError(
            f"{path}: sha256 differs from the manifest's: the byte counts were changed after the build. "
            "HINT: rebuild the dataset with `pgolf data build`"
        )
    vb = read_val_bytes(path)
    check_val_bytes(vb, tokens, bos_id, str(path))
    check_claims(vb, manifest_raw, str(path))
    check_spelled(vb, tokens, bos_id, spelled_lengths(root, manifest_raw), str(path))
    return CanonicalBytes(vb.token_bytes.astype(np.int64), vocab_size)


def check_claims(vb: ValBytes, manifest_raw: dict[str, Any], where: str) -> None:
    """The manifest's figures of the validation split (what a record track's check reads: `docs.val`) are those
    of the counts, which belong to the validation tokens the scorer reads (check_val_bytes)."""
    block = canonical_entry(manifest_raw) or {}
    entry = block.get("val_bytes") or {}
    found = {"docs.val": vb.doc_bytes.size, "canonical.val_bytes.docs": vb.doc_bytes.size}
    found |= {"canonical.val_bytes.tokens": vb.token_bytes.size}
    found |= {"canonical.val_bytes.total_bytes": int(vb.doc_bytes.astype(np.int64).sum())}
    claimed = {
        "docs.val": (manifest_raw.get("docs") or {}).get("val"),
        "canonical.val_bytes.docs": entry.get("docs"),
        "canonical.val_bytes.tokens": entry.get("tokens"),
        "canonical.val_bytes.total_bytes": entry.get("total_bytes"),
    }
    for key, want in claimed.items():
        if want is not None and want != found[key]:
            raise CanonicalBytesError(
                f"{where}: the manifest's {key} is {want}, the validation split holds {found[key]}: the manifest "
                "was changed after the build. HINT: rebuild the dataset with `pgolf data build`"
            )


def spelled_lengths(root: str | os.PathLike[str], manifest_raw: dict[str, Any]) -> Any:
    """What each piece of the dataset's tokenizer spells (data/proof.py PieceLengths: a declared transform's
    markers 0), the harness's own spelling: what the build counted each token as."""
    from data.proof import declared_tokenizer, piece_lengths, refuse_denormalizer, refuse_long_pieces
    from data.tokenizer import load_tokenizer

    block = canonical_entry(manifest_raw) or {}
    markers = tuple(block.get("markers") or ())
    inner = load_tokenizer(Path(root) / str(manifest_raw["tokenizer"]["file"]))
    declared = (str(block.get("transform")), markers) if markers else None
    try:
        tok = declared_tokenizer(inner, declared)
        refuse_long_pieces(tok)
        refuse_denormalizer(tok)
        spell = piece_lengths(tok)
    except ValueError as e:
        raise CanonicalBytesError(f"{root}: the byte counts' tokenizer cannot be spelled: {e}") from e
    if spell is None:
        raise CanonicalBytesError(
            f"{root}: the harness cannot spell this tokenizer's pieces, so no byte counts can belong to it"
        )
    return spell


def check_spelled(vb: ValBytes, tokens: np.ndarray, bos_id: int, spell: Any, where: str) -> None:
    """Each token counts the bytes its piece spells (a leading "▁" nothing right after its document's BOS, 0
    at a BOS), as the build counted them: counts that sum right but are not the tokens' spelling (inflated
    with each document's total and the manifest's sha256 rewritten) are refused."""
    t = np.asarray(tokens)  # the shards' uint16 ids: no wider copy of the 62 M of the official split
    if t.size and int(t.max()) >= spell.lengths.size:
        raise CanonicalBytesError(f"{where}: a validation token id beyond the tokenizer's vocabulary")
    want = spell.lengths.astype(np.int32)[t]
    after_bos = np.zeros(t.size, dtype=np.bool_)
    after_bos[1:] = t[:-1] == bos_id
    want -= spell.lead_space[t] & after_bos
    want[t == bos_id] = 0
    bad = np.flatnonzero(vb.token_bytes != want)
    if bad.size:
        i = int(bad[0])
        raise CanonicalBytesError(
            f"{where}: validation token {i:,} (id {int(t[i])}, piece {spell.pieces[int(t[i])]!r}) counts "
            f"{int(vb.token_bytes[i])} bytes, its piece spells {int(want[i])} ({bad.size:,} token(s) differ): "
            "the byte counts are not what the tokens spell. HINT: rebuild the dataset with `pgolf data build`"
        )
