"""Build a dataset folder from documents: tokenizer → shards → manifest.

    pgolf data build --docs FILE (--tokenizer MODEL | --tokenizer byte260 | --vocab-size N) --out DIR
    pgolf data build --hf-dataset HuggingFaceFW/fineweb --hf-config sample-10BT --max-docs N ...

The documents come in a fixed order (see data/sources.py); the first `val_docs` (50,000 by default,
the challenge's split) are validation, the rest training. Each document is written as BOS followed
by the tokenizer's own encoding of its text, and shards hold `shard_tokens` tokens (100,000,000 by
default; the last shard of a split fewer). A document may continue into the next shard; a shard's
`docs` counts the documents that start in it (its BOS tokens).

Tokenizers: a SentencePiece `.model` (copied beside the shards), `byte260` (256 bytes + 4
specials), or a BPE trained here with the reference settings for any vocabulary size (trained on
the training documents only, so validation text never shapes the tokenizer). Training reads the
source once more before tokenizing (a hub stream is streamed twice), and SentencePiece holds its
training text in memory: `tokenizer_train_docs` caps how many training documents it sees.

No validation document reaches training (data/disjoint.py): every document's digests (its text, its
normalised text, and its tokens decoded and normalised) are taken as it is tokenized; the validation
documents' go into an index (16-byte digests, never texts) and each training document is looked up
in it. A copy is refused in one line naming both documents' source indices and how they matched, and
no dataset is written; `--drop-val-duplicates` leaves copies out instead, counted and listed in the
manifest. The manifest records each split's own sha256 and the validation digests' file
(`val_digests.bin`), so `pgolf data verify` can prove the splits disjoint from the shards.

Tokenization runs on all cores: batches of documents go to a pool of worker processes, each with
its own copy of the tokenizer, and come back in submission order, so the output is identical to
encoding the documents one by one. At most 2 batches per worker are in flight, so memory stays
bounded however long the stream is. The manifest is written last; a folder without one is not a
dataset.
"""

from __future__ import annotations

import hashlib
import json
import multiprocessing as mp
import os
import shutil
import time
from collections import deque
from collections.abc import Generator, Iterable, Iterator, Sequence
from contextlib import ExitStack, closing
from dataclasses import dataclass
from itertools import chain, islice
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

from data.canonical import TOKEN_BYTES_DTYPE, VAL_BYTES_NAME, write_val_bytes
from data.disjoint import (
    DIGEST,
    MATCH_EXACT,
    MATCH_NORMALISED,
    MATCH_TOKENIZED,
    NORMALISATION,
    NORMALISATION_DESCRIPTION,
    POLICY_DROP,
    POLICY_REFUSE,
    VAL_DIGESTS_NAME,
    TrainGuard,
    ValidationIndex,
    ValidationLeakError,
    decode_documents,
    document_records,
    split_records,
    without_markers,
    write_val_digests,
)
from data.io import sha256_file
from data.manifest import MANIFEST_NAME, shard_entry, write_manifest
from data.official import OFFICIAL_TOKENIZERS
from data.proof import (
    CANONICALS,
    PROOF_FORMAT,
    PROOF_FORMAT_VERSION,
    TRANSFORMS,
    BatchTransform,
    InProcessBatch,
    SplitTransforms,
    attribute_documents,
    canonical_description,
    canonical_function,
    choose_canonical,
    declared_tokenizer,
    piece_lengths,
    refuse_denormalizer,
    refuse_long_pieces,
    split_transforms,
    val_only_pieces,
)
from data.shards import TOKEN_DTYPE, read_shard, read_split, shard_name, write_shard
from data.tokenizer import (
    BYTE260_FILENAME,
    BYTE260_OFFSET,
    ByteTokenizer,
    SentencePieceTokenizer,
    Tokenizer,
    load_tokenizer,
    pieces_in_text_order,
    train_sentencepiece,
    write_byte260,
)

DEFAULT_SHARD_TOKENS = 100_000_000
DEFAULT_VAL_DOCS = 50_000
ENCODE_BATCH_DOCS = 256
ENCODE_BATCH_BYTES = 1 << 20
MAX_VOCAB_SIZE = 65_536


def default_workers() -> int:
    """Cores this process may use (affinity-aware)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)


def read_jsonl_texts(path: str | os.PathLike[str], field: str = "text") -> list[str]:
    """All documents of a jsonl file as a list (for small corpora; builds stream instead)."""
    from data.sources import DocumentSource

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"documents file not found: {path}")
    return list(DocumentSource(kind="jsonl", path=str(path), field=field))


class SelectionHash:
    """Incremental sha256 over documents in order (length-prefixed, so boundaries count)."""

    def __init__(self) -> None:
        self._h = hashlib.sha256()
        self.docs = 0

    def update(self, text: str) -> int:
        """Add one document; returns its UTF-8 byte length."""
        b = text.encode("utf-8")
        self._h.update(len(b).to_bytes(8, "little"))
        self._h.update(b)
        self.docs += 1
        return len(b)

    def hexdigest(self) -> str:
        return self._h.hexdigest()


def selection_sha256(texts: Iterable[str]) -> str:
    """sha256 over the selected documents in order (length-prefixed, so boundaries count)."""
    h = SelectionHash()
    for t in texts:
        h.update(t)
    return h.hexdigest()


# ---- Encoding (in worker processes) ----

_WORKER_TOKENIZER: Tokenizer | None = None


def _init_worker(tokenizer_path: str) -> None:
    global _WORKER_TOKENIZER
    _WORKER_TOKENIZER = load_tokenizer(tokenizer_path)


def encode_documents(tok: Tokenizer, texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    """Encode documents as one flat uint16 array of [BOS, tokens...] per document, plus each
    document's length in that array (BOS included). Equal to concatenating BOS + tok.encode([t])."""
    flat, lens, _ = _encode(tok, texts)
    return flat, lens


def _encode(tok: Tokenizer, texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray, list[list[int]] | None]:
    """`encode_documents`, plus the token ids as lists (None for byte260, whose ids are the bytes)."""
    ids: list[list[int]] | None = None
    if isinstance(tok, ByteTokenizer):
        raw = [t.encode("utf-8") for t in texts]
        lens = np.fromiter((len(b) + 1 for b in raw), dtype=np.int64, count=len(raw))
        body = np.frombuffer(b"".join(raw), dtype=np.uint8).astype(TOKEN_DTYPE) + BYTE260_OFFSET
    else:
        # One thread: parallelism comes from the worker processes (sentencepiece's batch encode
        # would otherwise start a thread per core in every worker).
        if isinstance(tok, SentencePieceTokenizer):
            ids = tok.sp.encode(list(texts), out_type=int, num_threads=1)
        else:
            ids = tok.encode(texts)
        lens = np.fromiter((len(x) + 1 for x in ids), dtype=np.int64, count=len(ids))
        body = np.fromiter(chain.from_iterable(ids), dtype=TOKEN_DTYPE, count=int(lens.sum()) - len(ids))
    flat = np.empty(int(lens.sum()), dtype=TOKEN_DTYPE)
    starts = np.zeros(len(lens), dtype=np.int64)
    np.cumsum(lens[:-1], out=starts[1:])
    is_bos = np.zeros(flat.size, dtype=np.bool_)
    is_bos[starts] = True
    flat[is_bos] = tok.bos_id
    flat[~is_bos] = body
    return flat, lens, ids


def _encode_in_worker(texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
    assert _WORKER_TOKENIZER is not None, "worker tokenizer not initialised"
    return encode_documents(_WORKER_TOKENIZER, texts)


def encode_with_records(tok: Tokenizer, texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray, bytes]:
    """`encode_documents`, plus each document's three digests (data/disjoint.py) from its text and
    from the tokens written."""
    flat, lens, ids = _encode(tok, texts)
    return flat, lens, document_records(tok, texts, ids)


def _encode_records_in_worker(texts: list[str]) -> tuple[np.ndarray, np.ndarray, bytes]:
    assert _WORKER_TOKENIZER is not None, "worker tokenizer not initialised"
    return encode_with_records(_WORKER_TOKENIZER, texts)


@dataclass(frozen=True)
class EncodeSpec:
    """What every tokenizing process needs to encode and prove a document (picklable: it goes to workers)."""

    tokenizer_path: str
    canonical: str
    """The canonical text (data/proof.py CANONICALS): what is tokenized, what decoding must give back."""
    transform: str | None = None
    """A declared reversible transform (data/proof.py TRANSFORMS), applied after the canonical text."""
    declared: tuple[str, tuple[str, ...]] | None = None
    """(name, markers) of a batch transform (data/proof.py SplitTransforms: a submitted transform.py, run
    confined one split at a time); its texts go through the encoder's `batch`, in this process."""


@dataclass(frozen=True)
class Encoded:
    """One batch, encoded and proved (`failure`: the first document that fails, with its index)."""

    flat: np.ndarray
    lens: np.ndarray
    records: bytes
    token_bytes: np.ndarray | None
    """uint16 aligned with `flat`, BOS 0: the canonical bytes each token covers (validation batches)."""
    doc_bytes: np.ndarray
    failure: tuple[int, str] | None = None


class ProvingEncoder:
    """Tokenizes a document's canonical text (transformed when declared) and runs the proof on it."""

    def __init__(self, spec: EncodeSpec):
        self.spec = spec
        self.inner = load_tokenizer(spec.tokenizer_path)
        builtin = TRANSFORMS[spec.transform]() if spec.transform else None
        self.batch: BatchTransform | None = None if builtin is None else InProcessBatch(builtin)
        """The batch transform: a built-in's, or (`spec.declared`) the split's, set by encode_proved_ordered."""
        declared = (builtin.name, tuple(builtin.markers)) if builtin is not None else spec.declared
        self.markers: tuple[str, ...] = () if declared is None else tuple(declared[1])
        self.tok: Tokenizer = declared_tokenizer(self.inner, declared)
        self.canon = canonical_function(spec.canonical)
        refuse_long_pieces(self.tok)
        refuse_denormalizer(self.tok)
        spell = piece_lengths(self.tok)
        if spell is None:
            raise ValueError(
                f"{spec.tokenizer_path}: the harness cannot spell this tokenizer's pieces, so it cannot count the "
                "bytes each token covers; HINT: a SentencePiece model whose byte pieces are named <0xHH>, or byte260"
            )
        self.spell = spell

    def encode(self, texts: Sequence[str], keep_bytes: bool) -> Encoded:
        canon = self.canon(list(texts))
        assert self.batch is not None or self.spec.declared is None, "a declared transform is set per split"
        fed = canon if self.batch is None else self.batch.encode_texts(canon)
        flat, lens, ids = _encode(self.inner, fed)
        if ids is None:  # byte260: the ids are the bytes of what was fed
            bodies = np.split(flat, np.cumsum(lens)[:-1])
            ids = [b[1:].astype(np.int64).tolist() for b in bodies]
        spelled = decode_documents(self.inner, ids)  # what the tokens spell, markers and all
        decoded = spelled if self.batch is None else self.batch.decode_texts(spelled)
        # the tokenized digest is of what the tokens spell less the markers, which `pgolf data verify`
        # computes from the shards and the manifest alone (it never runs a transform)
        records = document_records(self.tok, texts, ids, without_markers(spelled, self.markers))
        per_doc, doc_bytes, failure = attribute_documents(canon, ids, decoded, self.spell)
        token_bytes = None
        if keep_bytes and failure is None:
            token_bytes = np.zeros(flat.size, dtype=TOKEN_BYTES_DTYPE)
            starts = np.concatenate([[0], np.cumsum(lens)[:-1]])
            for s0, per in zip(starts.tolist(), per_doc, strict=True):
                token_bytes[s0 + 1 : s0 + 1 + per.size] = per
        return Encoded(
            flat,
            lens,
            records,
            token_bytes,
            np.asarray(doc_bytes, dtype=np.int64),
            None if failure is None else (failure.doc, failure.detail),
        )


_WORKER_ENCODER: ProvingEncoder | None = None


def _init_proving_worker(spec: EncodeSpec) -> None:
    global _WORKER_ENCODER
    _WORKER_ENCODER = ProvingEncoder(spec)


def _encode_proving_in_worker(texts: list[str], keep_bytes: bool) -> Encoded:
    assert _WORKER_ENCODER is not None, "worker encoder not initialised"
    return _WORKER_ENCODER.encode(texts, keep_bytes)


def encode_proved_ordered(
    spec: EncodeSpec,
    batches: Iterator[EncodeBatch],
    workers: int,
    transforms: SplitTransforms | None = None,
) -> Generator[tuple[EncodeBatch, Encoded], None, None]:
    """Encode and prove batches on `workers` processes; results in input order, at most 2*workers in flight.

    With `transforms` (a batch transform: in this process, one split at a time) the split's transform is
    opened at its first batch and closed before the next split's is opened."""
    if workers <= 1 or transforms is not None:
        enc = ProvingEncoder(spec)
        with ExitStack() as stack:
            split = None
            for b in batches:
                if transforms is not None and b.split != split:
                    stack.close()  # the other split's child ends before this one starts
                    enc.batch = stack.enter_context(transforms.for_split(b.split))
                    split = b.split
                yield b, enc.encode(b.texts, b.split == "val")
        return
    method = "fork" if "fork" in mp.get_all_start_methods() else "spawn"
    with mp.get_context(method).Pool(workers, initializer=_init_proving_worker, initargs=(spec,)) as pool:
        pending: deque[tuple[EncodeBatch, Any]] = deque()
        for b in batches:
            pending.append((b, pool.apply_async(_encode_proving_in_worker, (b.texts, b.split == "val"))))
            if len(pending) >= 2 * workers:
                done, res = pending.popleft()
                yield done, res.get()
        while pending:
            done, res = pending.popleft()
            yield done, res.get()


class TokenizerProofError(ValueError):
    """A document's tokens do not decode to its canonical text, or do not count its bytes: no dataset."""


@dataclass(frozen=True)
class EncodeBatch:
    split: str
    texts: list[str]
    text_bytes: int
    start: int = 0
    """The source index of the batch's first document."""


def _batches(texts: Iterable[str], val_docs: int, selection: SelectionHash) -> Iterator[EncodeBatch]:
    """Group documents into batches (by count and bytes) that never straddle the val/train boundary."""
    batch: list[str] = []
    nbytes = 0
    start = 0
    split = "val"
    for text in texts:
        doc_split = "val" if selection.docs < val_docs else "train"
        if doc_split != split:
            if batch:
                yield EncodeBatch(split, batch, nbytes, start)
            batch, nbytes, split = [], 0, doc_split
        if not batch:
            start = selection.docs
        nbytes += selection.update(text)
        batch.append(text)
        if len(batch) >= ENCODE_BATCH_DOCS or nbytes >= ENCODE_BATCH_BYTES:
            yield EncodeBatch(split, batch, nbytes, start)
            batch, nbytes = [], 0
    if batch:
        yield EncodeBatch(split, batch, nbytes, start)


def _pool(tokenizer_path: Path, workers: int) -> Any:
    """A pool of tokenizer workers. fork where the OS has it: spawn and forkserver re-import the
    caller's `__main__`, which breaks any script without an `if __name__ == "__main__"` guard. The
    workers run only numpy and the tokenizer, never torch or OpenMP code, so the usual hazard of
    forking a threaded parent does not reach them."""
    method = "fork" if "fork" in mp.get_all_start_methods() else "spawn"
    return mp.get_context(method).Pool(workers, initializer=_init_worker, initargs=(str(tokenizer_path),))


def _map_ordered(
    tokenizer_path: Path, batches: Iterator[EncodeBatch], workers: int, local: Any, remote: Any
) -> Iterator[tuple[EncodeBatch, Any]]:
    """`local(tok, texts)` in this process, or `remote(texts)` on `workers` processes; results in input
    order, at most 2*workers in flight."""
    if workers <= 1:
        tok = load_tokenizer(tokenizer_path)
        for b in batches:
            yield b, local(tok, b.texts)
        return
    with _pool(tokenizer_path, workers) as pool:
        pending: deque[tuple[EncodeBatch, Any]] = deque()
        for b in batches:
            pending.append((b, pool.apply_async(remote, (b.texts,))))
            if len(pending) >= 2 * workers:
                done, res = pending.popleft()
                yield done, res.get()
        while pending:
            done, res = pending.popleft()
            yield done, res.get()


def encode_ordered(
    tokenizer_path: Path, batches: Iterator[EncodeBatch], workers: int
) -> Iterator[tuple[EncodeBatch, np.ndarray, np.ndarray]]:
    """Encode batches on `workers` processes; results in input order, at most 2*workers in flight."""
    for b, (flat, lens) in _map_ordered(
        tokenizer_path, batches, workers, encode_documents, _encode_in_worker
    ):
        yield b, flat, lens


def encode_records_ordered(
    tokenizer_path: Path, batches: Iterator[EncodeBatch], workers: int
) -> Generator[tuple[EncodeBatch, np.ndarray, np.ndarray, bytes], None, None]:
    """`encode_ordered` with each document's digests (`encode_with_records`)."""
    for b, (flat, lens, records) in _map_ordered(
        tokenizer_path, batches, workers, encode_with_records, _encode_records_in_worker
    ):
        yield b, flat, lens, records


# ---- Shard writing ----


class _SplitWriter:
    """Cuts one split's token stream into shards of `shard_tokens`."""

    def __init__(self, out: Path, split: str, shard_tokens: int, bos_id: int, counts: np.ndarray | None):
        self.out, self.split, self.shard_tokens, self.bos_id, self.counts = (
            out,
            split,
            shard_tokens,
            bos_id,
            counts,
        )
        self.pending: list[np.ndarray] = []
        self.pending_tokens = 0
        self.entries: list[dict[str, Any]] = []
        self.docs = 0
        self.tokens = 0
        self.text_bytes = 0
        self.write_s = 0.0

    def add(self, flat: np.ndarray, docs: int, text_bytes: int) -> None:
        if self.counts is not None:
            self.counts += np.bincount(flat, minlength=self.counts.size)
        self.pending.append(flat)
        self.pending_tokens += flat.size
        self.docs += docs
        self.tokens += flat.size
        self.text_bytes += text_bytes
        if self.pending_tokens >= self.shard_tokens:
            self._flush(final=False)

    def _flush(self, final: bool) -> None:
        while self.pending_tokens >= self.shard_tokens or (final and self.pending_tokens > 0):
            flat = np.concatenate(self.pending) if len(self.pending) > 1 else self.pending[0]
            take, rest = flat[: self.shard_tokens], flat[self.shard_tokens :]
            path = self.out / shard_name(self.split, len(self.entries))
            t0 = time.perf_counter()
            write_shard(path, take)
            self.write_s += time.perf_counter() - t0
            self.entries.append(shard_entry(path, self.split, int(np.count_nonzero(take == self.bos_id))))
            self.pending = [rest] if rest.size else []
            self.pending_tokens = int(rest.size)

    def close(self) -> list[dict[str, Any]]:
        self._flush(final=True)
        return self.entries


# ---- The build ----


def _prepare_out(out: Path, overwrite: bool) -> None:
    out.mkdir(parents=True, exist_ok=True)
    old = [
        p
        for p in out.iterdir()
        if p.name in (MANIFEST_NAME, VAL_DIGESTS_NAME, VAL_BYTES_NAME)
        or (p.name.startswith("fineweb_") and p.suffix == ".bin")
    ]
    if old and not overwrite:
        raise FileExistsError(
            f"{out} already holds a dataset ({len(old)} shard/manifest files); "
            "HINT: pass --overwrite to replace it, or choose a new --out"
        )
    for p in old:
        p.unlink()


def _prepare_tokenizer(
    out: Path,
    texts: Iterable[str],
    tokenizer: str | os.PathLike[str] | None,
    vocab_size: int | None,
    val_docs: int,
    tokenizer_train_docs: int | None,
    policy: str,
    transform: str | SplitTransforms | None = None,
) -> Path:
    if vocab_size is not None:
        if iter(texts) is texts:
            raise ValueError(
                "training a tokenizer reads the documents twice; pass a list or a DocumentSource, not an iterator"
            )
        # The tokenizer learns from training documents only, and never from a copy (identical or equal
        # after normalisation; the tokenized digest needs this tokenizer) of a validation document: the
        # validation documents' text digests are taken first (one more read of them).
        index = ValidationIndex()
        for i, text in enumerate(islice(iter(texts), val_docs)):
            index.add_text(i, text)
        guard = TrainGuard(index, policy)
        stop = None if tokenizer_train_docs is None else val_docs + tokenizer_train_docs
        train_texts: Iterable[str] = guard.filter_texts(islice(iter(texts), val_docs, stop), val_docs)
        tfs = split_transforms(transform)
        stack = ExitStack()
        # trained on what it will tokenize: the transformed text (a confined transform's train-split child
        # transforms it), markers as pieces
        if tfs is not None:
            train_texts = _batched_encode(stack.enter_context(tfs.for_split("train")), train_texts)
        suffix = "" if transform is None else f"_{_transform_name(transform)}"
        with stack:
            path = train_sentencepiece(
                train_texts,
                vocab_size,
                out / f"tokenizer_{vocab_size}_bpe{suffix}.model",
                user_defined_symbols=() if tfs is None else tfs.markers,
            )
        try:
            guard.raise_if_refused()
        except ValidationLeakError:
            path.unlink(missing_ok=True)
            raise
        return path
    if str(tokenizer) == "byte260":
        path = out / BYTE260_FILENAME
        write_byte260(path)
        return path
    src = Path(tokenizer)  # type: ignore[arg-type]
    if not src.is_file():
        raise FileNotFoundError(
            f"--tokenizer {src} not found (HINT: a SentencePiece .model file, or 'byte260')"
        )
    dst = out / src.name
    raw = src.read_bytes()
    if hashlib.sha256(raw).hexdigest() in OFFICIAL_TOKENIZERS or not src.name.endswith(".model"):
        if src.resolve() != dst.resolve():
            shutil.copyfile(src, dst)
        return dst
    # an entry's own SentencePiece model: its pieces numbered in the order of their text (the ids carry nothing)
    dst.write_bytes(pieces_in_text_order(raw))
    return dst


def piece_order(tok_path: Path, tokenizer: str | os.PathLike[str] | None, vocab_size: int | None) -> str:
    """The manifest's `tokenizer.piece_order` of a tokenizer _prepare_tokenizer made: "official", one of
    data/official.py NEUTRAL_PIECE_ORDERS, or "as given" (a file of another kind, not renumbered)."""
    if vocab_size is not None:
        return "trained here"
    if str(tokenizer) == "byte260" or tok_path.name == BYTE260_FILENAME:
        return "built in"
    if sha256_file(tok_path) in OFFICIAL_TOKENIZERS:
        return "official"
    return "text" if tok_path.name.endswith(".model") else "as given"


TRANSFORM_RECORD_FORMAT = "pg-transform-record"
TRANSFORM_RECORD_VERSION = 1
"""1: `children` (each child's split, sandbox mode, layers and guarantees, in the order they ran) and their
sums `missing_layers` and `guarantees_not_held` (docs/RULES.md "A submitted transform")."""


def transform_block(tfs: SplitTransforms) -> dict[str, Any]:
    """The manifest's record of a submitted transform: its NAME, its file's sha256, and each child's split
    and confinement (the layers and guarantees its sandbox held), in the order they ran; then what any child
    lacked (`missing_layers`), and each guarantee some child ran without, with how (`guarantees_not_held`:
    "missing" or "allowed missing: L"), so that a build with sandbox 'auto' on a machine without some layers
    says afterwards how confined its transform was."""
    children = [dict(c) for c in getattr(tfs, "confinement", [])]
    missing = sorted({str(m) for c in children for m in c.get("missing_layers") or ()})
    not_held: dict[str, str] = {}
    for c in children:
        if c.get("mode") == "off":
            not_held.update({"sandbox": "off"})
        for prop, how in (c.get("guarantees") or {}).items():
            if str(how) == "missing" or str(how).startswith("allowed missing"):
                not_held.setdefault(str(prop), str(how))
    return {
        "format": TRANSFORM_RECORD_FORMAT,
        "format_version": TRANSFORM_RECORD_VERSION,
        "name": tfs.name,
        "sha256": tfs.sha256,
        "children": children,
        "missing_layers": missing,
        "guarantees_not_held": not_held,
    }


def _transform_name(transform: str | SplitTransforms | None) -> str | None:
    return transform if transform is None or isinstance(transform, str) else transform.name


def _encode_spec(
    tok: Tokenizer, tok_path: str, canonical: str, transform: str | SplitTransforms | None
) -> tuple[EncodeSpec, SplitTransforms | None]:
    """The EncodeSpec (canonical `auto` resolved, through the transform) and the batch transform of a
    submitted one (None for a built-in, which every tokenizing process runs itself)."""
    batch_tf = None if transform is None or isinstance(transform, str) else transform
    declared = None if batch_tf is None else (batch_tf.name, batch_tf.markers)
    if canonical == "auto":
        tfs = split_transforms(transform)
        if tfs is None:
            canonical = choose_canonical(tok)
        else:  # its own child ("probe"), which sees the probe text and no document
            with tfs.for_split("probe") as child:
                canonical = choose_canonical(tok, child)
    return EncodeSpec(
        tok_path, canonical, transform if isinstance(transform, str) else None, declared
    ), batch_tf


def _batched_encode(child: BatchTransform, texts: Iterable[str], batch: int = 256) -> Iterator[str]:
    it = iter(texts)
    while chunk := list(islice(it, batch)):
        yield from child.encode_texts(chunk)


def build_dataset(
    texts: Iterable[str],
    out: str | os.PathLike[str],
    *,
    val_docs: int = DEFAULT_VAL_DOCS,
    tokenizer: str | os.PathLike[str] | None = None,
    vocab_size: int | None = None,
    shard_tokens: int = DEFAULT_SHARD_TOKENS,
    source: dict[str, Any] | None = None,
    workers: int | None = None,
    tokenizer_train_docs: int | None = None,
    overwrite: bool = False,
    progress: bool | None = None,
    drop_val_duplicates: bool = False,
    canonical: str = "auto",
    transform: str | SplitTransforms | None = None,
) -> Path:
    """Tokenize `texts` (a list, or a re-iterable such as `DocumentSource`) into a dataset folder.

    Exactly one of `tokenizer` (a `.model` file or "byte260") and `vocab_size` (train a SentencePiece
    BPE on the training documents with the reference settings; `tokenizer_train_docs` caps how many)
    must be given. `workers` processes tokenize (default: all cores; byte260 encodes in-process).
    Returns the folder.

    A training document that is a copy of a validation document (identical, equal after normalisation,
    or equal once tokenized: data/disjoint.py) is refused: `ValidationLeakError`, one line naming both
    source indices and the match, and no dataset. With `drop_val_duplicates` it is left out instead,
    counted and listed in the manifest (`disjoint.dropped`).

    Every document is tokenized from its canonical text (`canonical`: data/proof.py CANONICALS; auto: sp1024
    for a tokenizer that normalises as sp1024 does, raw otherwise), through `transform` when one is declared,
    and proved: its tokens decode to the canonical text byte for byte, and the bytes their pieces spell sum
    to its UTF-8 byte count. A document that fails is `TokenizerProofError` (one line: the split, the
    document's source index, the byte offset and both texts there) and no dataset is written. The
    validation tokens' byte counts go to `val_bytes.bin` (data/canonical.py), the denominator of bpb.
    """
    if canonical != "auto" and canonical not in CANONICALS:
        raise ValueError(f"--canonical {canonical!r}: expected auto or one of {', '.join(CANONICALS)}")
    split_transforms(transform if isinstance(transform, str) else None)  # an unknown built-in name: refused
    if (tokenizer is None) == (vocab_size is None):
        raise ValueError("give exactly one of --tokenizer MODEL|byte260 and --vocab-size N")
    if isinstance(texts, Sequence) and not 0 < val_docs < len(texts):
        raise ValueError(
            f"--val-docs must be between 1 and {len(texts) - 1} (the corpus has {len(texts)} documents), got {val_docs}"
        )
    if val_docs <= 0:
        raise ValueError(f"--val-docs must be positive, got {val_docs}")
    if shard_tokens <= 0:
        raise ValueError(f"shard_tokens must be positive, got {shard_tokens}")
    workers = default_workers() if workers is None else workers
    if workers <= 0:
        raise ValueError(f"--workers must be positive, got {workers}")
    policy = POLICY_DROP if drop_val_duplicates else POLICY_REFUSE
    out = Path(out)
    _prepare_out(out, overwrite)

    tok_path = _prepare_tokenizer(
        out, texts, tokenizer, vocab_size, val_docs, tokenizer_train_docs, policy, transform
    )
    tok = load_tokenizer(tok_path)
    if tok.vocab_size > MAX_VOCAB_SIZE:
        raise ValueError(
            f"a vocabulary of {tok.vocab_size} does not fit uint16 shards (max {MAX_VOCAB_SIZE})"
        )
    spec, batch_tf = _encode_spec(tok, str(tok_path), canonical, transform)
    canonical, tname = spec.canonical, _transform_name(transform)
    # refuses here, before any worker starts, a tokenizer the proof cannot read
    proving = ProvingEncoder(spec)
    markers = proving.markers

    if batch_tf is not None:
        workers = 1  # the split's one confined child transforms every batch of it, from this process
    if isinstance(tok, ByteTokenizer):
        workers = 1  # byte260 encoding is a memory copy (~500 MB/s); shipping text to workers costs more
    counts = np.zeros(tok.vocab_size, dtype=np.int64)
    val_counts = np.zeros(tok.vocab_size, dtype=np.int64)
    writers = {
        "val": _SplitWriter(out, "val", shard_tokens, tok.bos_id, val_counts),
        "train": _SplitWriter(out, "train", shard_tokens, tok.bos_id, counts),
    }
    selection = SelectionHash()
    split_hash = {"val": SelectionHash(), "train": SelectionHash()}
    guard = TrainGuard(ValidationIndex(), policy)
    total = len(texts) if isinstance(texts, Sequence) else None
    val_token_bytes: list[np.ndarray] = []
    val_doc_bytes: list[np.ndarray] = []
    canonical_bytes = {"val": 0, "train": 0}
    t0 = time.perf_counter()
    try:
        with (
            tqdm(
                total=total, desc="tokenize", unit="doc", disable=None if progress is None else not progress
            ) as bar,
            closing(
                encode_proved_ordered(spec, _batches(texts, val_docs, selection), workers, batch_tf)
            ) as encoded,
        ):
            for batch, enc in encoded:
                if enc.failure is not None:
                    d, detail = enc.failure
                    raise TokenizerProofError(
                        f"the tokenizer {tok_path.name} (canonical {canonical}, transform {tname or 'none'}) "
                        f"fails its proof on {batch.split} document {batch.start + d} (source index): {detail}. "
                        "No dataset was written. HINT: check the tokenizer and transform with `pgolf audit-tokenizer`"
                    )
                if batch.split == "val":
                    assert enc.token_bytes is not None
                    val_token_bytes.append(enc.token_bytes)
                    val_doc_bytes.append(enc.doc_bytes)
                canonical_bytes[batch.split] += int(enc.doc_bytes.sum())
                flat, lens, text_bytes = _guard_batch(
                    guard, batch, enc.flat, enc.lens, enc.records, split_hash
                )
                writers[batch.split].add(flat, len(lens), text_bytes)
                bar.update(len(batch.texts))
    except BaseException:  # a leak, a failed proof, a refused submitted transform: no dataset
        _remove_outputs(out)
        raise
    elapsed_s = time.perf_counter() - t0
    if writers["train"].docs == 0:
        _remove_outputs(out)
        if guard.dropped_count:
            raise ValueError(
                f"every training document ({guard.dropped_count}) is a copy of a validation document and was dropped: "
                "no training documents left"
            )
        raise ValueError(
            f"the corpus has {selection.docs} documents and --val-docs is {val_docs}: no training documents left. "
            f"HINT: pass --val-docs below {selection.docs} (or more documents)"
        )
    shards = writers["val"].close() + writers["train"].close()
    digests_sha256 = write_val_digests(out / VAL_DIGESTS_NAME, guard.index.tokenized)
    token_bytes = np.concatenate(val_token_bytes)
    doc_bytes = np.concatenate(val_doc_bytes)
    val_bytes_sha256 = write_val_bytes(out / VAL_BYTES_NAME, token_bytes, doc_bytes)
    if guard.dropped_count:
        print(
            f"dropped {guard.dropped_count} training document(s) that copy a validation document "
            f"(listed in {MANIFEST_NAME} disjoint.dropped)"
        )
    text_mb = (writers["val"].text_bytes + writers["train"].text_bytes) / 1e6
    print(
        f"tokenized and proved {selection.docs} documents ({text_mb:.1f} MB, canonical {canonical}, transform "
        f"{tname or 'none'}) in {elapsed_s:.1f} s on {workers} worker(s): "
        f"{text_mb / max(elapsed_s, 1e-9):.2f} MB/s, {text_mb / max(elapsed_s, 1e-9) / workers:.2f} MB/s per worker"
    )
    write_manifest(
        out,
        {
            "tokenizer": {
                "file": tok_path.name,
                "kind": tok.kind,
                "vocab_size": tok.vocab_size,
                "bos_id": tok.bos_id,
                "sha256": sha256_file(tok_path),
                "trained_here": vocab_size is not None,
                "piece_order": piece_order(tok_path, tokenizer, vocab_size),
            },
            "docs": {"val": writers["val"].docs, "train": writers["train"].docs},
            "tokens": {"val": writers["val"].tokens, "train": writers["train"].tokens},
            "text_bytes": {"val": writers["val"].text_bytes, "train": writers["train"].text_bytes},
            "selection_sha256": selection.hexdigest(),
            "selection": {
                "docs": selection.docs,
                "val_docs": val_docs,
                "order": "source order; the first val_docs documents are validation",
            },
            "split_sha256": {s: h.hexdigest() for s, h in split_hash.items()},
            "disjoint": {
                "policy": policy,
                "matches": [MATCH_EXACT, MATCH_NORMALISED, MATCH_TOKENIZED],
                "normalisation": NORMALISATION,
                "normalisation_description": NORMALISATION_DESCRIPTION,
                "digest": DIGEST,
                "val_digests": {
                    "file": VAL_DIGESTS_NAME,
                    "sha256": digests_sha256,
                    "count": len(guard.index.tokenized),
                },
                "dropped_count": guard.dropped_count,
                "dropped": [{"train_index": t, "val_index": v, "match": how} for t, v, how in guard.dropped],
            },
            "canonical": canonical_block(
                canonical,
                tname,
                val_bytes_sha256,
                token_bytes,
                doc_bytes,
                canonical_bytes,
                {"docs": {"val": writers["val"].docs, "train": writers["train"].docs + guard.dropped_count}},
                markers,
            ),
            **({} if batch_tf is None else {"transform": transform_block(batch_tf)}),
            "shard_tokens": shard_tokens,
            "source": source or {},
            "shards": shards,
            "train_unigram_counts": counts.tolist(),
            "pieces": val_only_pieces(val_counts, counts, proving.spell),
        },
    )
    return out


def _remove_outputs(out: Path) -> None:
    """What a failed build leaves nothing of: the shards and the digest file (never a manifest)."""
    for p in out.glob("fineweb_*.bin"):
        p.unlink()
    (out / VAL_DIGESTS_NAME).unlink(missing_ok=True)
    (out / VAL_BYTES_NAME).unlink(missing_ok=True)


def _guard_batch(
    guard: TrainGuard,
    batch: EncodeBatch,
    flat: np.ndarray,
    lens: np.ndarray,
    records: bytes,
    split_hash: dict[str, SelectionHash],
) -> tuple[np.ndarray, np.ndarray, int]:
    """Validation documents' digests go into the index; each training document is checked against it
    (all validation documents come first in the source, so the index is complete by then). Returns
    the batch's tokens, lengths and text bytes, less any dropped document."""
    hashes = split_hash[batch.split]
    if batch.split == "val":
        for i, (text, rec) in enumerate(zip(batch.texts, split_records(records), strict=True)):
            guard.index.add(batch.start + i, *rec)
            hashes.update(text)
        return flat, lens, batch.text_bytes
    keep = np.ones(len(lens), dtype=np.bool_)
    for i, (text, rec) in enumerate(zip(batch.texts, split_records(records), strict=True)):
        if guard.keep(batch.start + i, guard.index.match(*rec)):
            hashes.update(text)
        else:
            keep[i] = False
    if keep.all():
        return flat, lens, batch.text_bytes
    dropped_bytes = sum(len(t.encode("utf-8")) for t, k in zip(batch.texts, keep, strict=True) if not k)
    return flat[np.repeat(keep, lens)], lens[keep], batch.text_bytes - dropped_bytes


def summarize(out: str | os.PathLike[str]) -> str:
    """One line about a built dataset, for the CLI."""
    raw = json.loads((Path(out) / MANIFEST_NAME).read_text(encoding="utf-8"))
    n = {s: sum(1 for e in raw["shards"] if e["split"] == s) for s in ("val", "train")}
    return (
        f"{out}: {raw['docs']['val']} val docs / {raw['tokens']['val']} tokens in {n['val']} shard(s), "
        f"{raw['docs']['train']} train docs / {raw['tokens']['train']} tokens in {n['train']} shard(s), "
        f"tokenizer {raw['tokenizer']['file']} (vocab {raw['tokenizer']['vocab_size']})"
    )


# ---- Proving a dataset built elsewhere ----


def prove_dataset(
    directory: str | os.PathLike[str],
    texts: Iterable[str],
    *,
    canonical: str = "auto",
    transform: str | SplitTransforms | None = None,
    workers: int | None = None,
    progress: bool | None = None,
) -> dict[str, Any]:
    """Prove a dataset this harness did not build (the official cached shards): its validation documents,
    given in order, are tokenized from their canonical text again and must give the validation shards' tokens
    exactly, document by document; each is proved (data/proof.py) and counted, and `val_bytes.bin` plus the
    manifest's `canonical` block and `split_sha256.val` are written (manifest version 3). Returns the block.

    A document whose tokens differ from the shards', or that fails the proof, is `TokenizerProofError` naming
    it (and the first differing token); nothing is written then. Only the first `docs.val` documents of
    `texts` are read.
    """
    from data.manifest import load_manifest

    root = Path(directory)
    m = load_manifest(root)
    if (m.raw.get("view") or {}).get("split") == "train":
        raise ValueError(f"{root} is a training view: prove the dataset folder it was made from")
    val = np.asarray(read_split(root, "val"))
    n_docs = int(m.raw["docs"]["val"])
    tok = load_tokenizer(m.tokenizer_path)
    spec, batch_tf = _encode_spec(tok, str(m.tokenizer_path), canonical, transform)
    canonical, tname = spec.canonical, _transform_name(transform)
    proving = ProvingEncoder(spec)
    markers = proving.markers
    workers = 1 if batch_tf is not None else default_workers() if workers is None else workers
    selection = SelectionHash()
    val_hash = SelectionHash()
    token_bytes = np.zeros(val.size, dtype=TOKEN_BYTES_DTYPE)
    doc_bytes: list[np.ndarray] = []
    at = 0
    docs_iter = islice(iter(texts), n_docs)
    with (
        tqdm(
            total=n_docs, desc="prove", unit="doc", disable=None if progress is None else not progress
        ) as bar,
        closing(
            encode_proved_ordered(spec, _batches(docs_iter, n_docs, selection), workers, batch_tf)
        ) as encoded,
    ):
        for batch, enc in encoded:
            if enc.failure is not None:
                d, detail = enc.failure
                raise TokenizerProofError(
                    f"{root}: the tokenizer fails its proof on validation document {batch.start + d}: {detail}"
                )
            got = val[at : at + enc.flat.size]
            if not np.array_equal(got, enc.flat):
                differ = np.flatnonzero(got != enc.flat[: got.size])
                k = int(differ[0]) if differ.size else got.size  # or the shards end inside this batch
                d = int(np.searchsorted(np.cumsum(enc.lens), k, side="right"))
                raise TokenizerProofError(
                    f"{root}: validation document {batch.start + d} tokenizes to other tokens than the shards hold "
                    f"(first difference at validation token {at + k:,}): these are not the documents the shards "
                    "were made from, or not in their order, or not this canonical text"
                )
            assert enc.token_bytes is not None
            token_bytes[at : at + enc.flat.size] = enc.token_bytes
            doc_bytes.append(enc.doc_bytes)
            for t in batch.texts:
                val_hash.update(t)
            at += enc.flat.size
            bar.update(len(batch.texts))
    if selection.docs != n_docs or at != val.size:
        raise TokenizerProofError(
            f"{root}: {selection.docs:,} documents given give {at:,} tokens; the validation split holds {n_docs:,} "
            f"documents and {val.size:,} tokens. HINT: pass the validation documents, in order (the first "
            f"{n_docs:,} of the selection)"
        )
    counts = np.concatenate(doc_bytes) if doc_bytes else np.zeros(0, np.int64)
    sha = write_val_bytes(root / VAL_BYTES_NAME, token_bytes, counts)
    block = canonical_block(
        canonical,
        tname,
        sha,
        token_bytes,
        counts,
        {"val": int(counts.sum())},
        {"docs": {"val": n_docs}, "proved_after_the_build": True},
        markers,
    )
    raw = {k: v for k, v in m.raw.items() if k not in ("format", "format_version")}
    raw["canonical"] = block
    if batch_tf is not None:
        raw["transform"] = transform_block(batch_tf)
    raw["split_sha256"] = {**(raw.get("split_sha256") or {}), "val": val_hash.hexdigest()}
    # the training split counted from its shards, never taken from the manifest given (whoever wrote it): absent,
    # short or edited counts made every validation piece look used in training
    train_counts = np.zeros(tok.vocab_size, dtype=np.int64)
    for e in m.raw["shards"]:
        if e["split"] == "train":
            train_counts += np.bincount(
                np.asarray(read_shard(root / str(e["name"]))), minlength=tok.vocab_size
            )[: tok.vocab_size]
    raw["train_unigram_counts"] = train_counts.tolist()
    raw["pieces"] = val_only_pieces(np.bincount(val, minlength=tok.vocab_size), train_counts, proving.spell)
    write_manifest(root, raw)
    return block


def canonical_block(
    canonical: str,
    transform: str | None,
    val_bytes_sha256: str,
    token_bytes: np.ndarray,
    doc_bytes: np.ndarray,
    canonical_bytes: dict[str, int],
    proof: dict[str, Any],
    markers: Sequence[str] = (),
) -> dict[str, Any]:
    """The manifest's `canonical` block (data/manifest.py version 3), for a build and for `prove_dataset`.
    `markers`: the transform's, which spell no canonical byte (verify removes them before digesting)."""
    return {
        "text": canonical,
        "description": canonical_description(canonical),
        "transform": transform,
        **({"markers": list(markers)} if markers else {}),
        "fed_to_tokenizer": "the canonical text"
        + ("" if transform is None else f", {transform}-transformed"),
        "val_bytes": {
            "file": VAL_BYTES_NAME,
            "sha256": val_bytes_sha256,
            "tokens": int(token_bytes.size),
            "docs": int(doc_bytes.size),
            "total_bytes": int(doc_bytes.sum()),
        },
        "canonical_bytes": canonical_bytes,
        "proof": {
            "format": PROOF_FORMAT,
            "format_version": PROOF_FORMAT_VERSION,
            "passed": True,
            "checks": "every document: decode(tokens) is its canonical text byte for byte; the bytes its tokens' "
            "pieces spell sum to its canonical UTF-8 byte count"
            + (
                "; tokenized again, it gives the shards' tokens"
                if proof.get("proved_after_the_build")
                else ""
            ),
            **proof,
        },
    }
