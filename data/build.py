"""Build a dataset folder from documents: tokenizer → shards → manifest.

    pgolf data build --docs FILE.jsonl (--tokenizer MODEL | --vocab-size N) --val-docs N --out DIR

The first `val_docs` documents are validation, the rest training; each document is written as BOS
followed by its tokens; shards hold `shard_tokens` tokens (the last one of a split fewer). The
tokenizer file is copied beside the shards and the manifest records everything with sha256.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

from data.io import sha256_file
from data.manifest import shard_entry, write_manifest
from data.shards import shard_name, write_shard
from data.tokenizer import (
    BYTE260_FILENAME,
    Tokenizer,
    load_tokenizer,
    train_sentencepiece,
    write_byte260,
)

DEFAULT_SHARD_TOKENS = 100_000_000
ENCODE_BATCH_DOCS = 256


def read_jsonl_texts(path: str | os.PathLike[str], field: str = "text") -> list[str]:
    """Documents of a jsonl file (one JSON object a line, text in `field`)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"documents file not found: {path}")
    texts = []
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{lineno}: not a JSON object ({e})") from e
            if not isinstance(obj, dict) or not isinstance(obj.get(field), str):
                raise ValueError(f"{path}:{lineno}: expected an object with a string field {field!r}")
            texts.append(obj[field])
    return texts


def selection_sha256(texts: Iterable[str]) -> str:
    """sha256 over the selected documents in order (length-prefixed, so boundaries count)."""
    h = hashlib.sha256()
    for t in texts:
        b = t.encode("utf-8")
        h.update(len(b).to_bytes(8, "little"))
        h.update(b)
    return h.hexdigest()


def _encode_docs(tok: Tokenizer, texts: Sequence[str], desc: str) -> Iterator[np.ndarray]:
    """Yield each document as a uint16 array BOS + tokens, in order."""
    with tqdm(total=len(texts), desc=desc, unit="doc", disable=None, leave=False) as bar:
        for i in range(0, len(texts), ENCODE_BATCH_DOCS):
            batch = texts[i : i + ENCODE_BATCH_DOCS]
            for ids in tok.encode(batch):
                arr = np.empty(len(ids) + 1, dtype=np.uint16)
                arr[0] = tok.bos_id
                arr[1:] = ids
                yield arr
            bar.update(len(batch))


def _write_split(
    tok: Tokenizer, texts: Sequence[str], split: str, out: Path, shard_tokens: int, counts: np.ndarray | None
) -> list[dict[str, Any]]:
    entries: list[dict[str, Any]] = []
    pending: list[np.ndarray] = []
    pending_tokens = 0
    pending_docs = 0

    def flush(final: bool) -> None:
        nonlocal pending, pending_tokens, pending_docs
        while pending_tokens >= shard_tokens or (final and pending_tokens > 0):
            flat = np.concatenate(pending)
            take, rest = flat[:shard_tokens], flat[shard_tokens:]
            path = out / shard_name(split, len(entries))
            write_shard(path, take)
            docs = int((take == tok.bos_id).sum())
            entries.append(shard_entry(path, split, docs))
            pending = [rest] if rest.size else []
            pending_tokens = int(rest.size)
            pending_docs = 0

    for arr in _encode_docs(tok, texts, f"tokenize {split}"):
        if counts is not None:
            counts += np.bincount(arr, minlength=counts.size)[: counts.size]
        pending.append(arr)
        pending_tokens += arr.size
        pending_docs += 1
        if pending_tokens >= shard_tokens:
            flush(final=False)
    flush(final=True)
    return entries


def build_dataset(
    texts: Sequence[str],
    out: str | os.PathLike[str],
    *,
    val_docs: int,
    tokenizer: str | os.PathLike[str] | None = None,
    vocab_size: int | None = None,
    shard_tokens: int = DEFAULT_SHARD_TOKENS,
    source: dict[str, Any] | None = None,
) -> Path:
    """Tokenize `texts` into a dataset folder at `out`; returns the folder.

    Exactly one of `tokenizer` (a `.model` file or "byte260") and `vocab_size` (train a SentencePiece
    BPE on the training documents with the reference settings) must be given.
    """
    if (tokenizer is None) == (vocab_size is None):
        raise ValueError("give exactly one of --tokenizer MODEL and --vocab-size N")
    if not 0 < val_docs < len(texts):
        raise ValueError(f"--val-docs must be between 1 and {len(texts) - 1} (the corpus has {len(texts)} documents), got {val_docs}")
    if shard_tokens <= 0:
        raise ValueError(f"shard_tokens must be positive, got {shard_tokens}")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    val_texts, train_texts = texts[:val_docs], texts[val_docs:]

    if vocab_size is not None:
        tok_path = train_sentencepiece(train_texts, vocab_size, out / f"tokenizer_{vocab_size}_bpe.model")
    elif str(tokenizer) == "byte260":
        tok_path = out / BYTE260_FILENAME
        write_byte260(tok_path)
    else:
        src = Path(tokenizer)  # type: ignore[arg-type]
        if not src.is_file():
            raise FileNotFoundError(f"--tokenizer {src} not found")
        tok_path = out / src.name
        if src.resolve() != tok_path.resolve():
            shutil.copyfile(src, tok_path)
    tok = load_tokenizer(tok_path)
    if tok.vocab_size > 65_536:
        raise ValueError(f"vocabulary of {tok.vocab_size} does not fit uint16 shards")

    counts = np.zeros(tok.vocab_size, dtype=np.int64)
    shards = _write_split(tok, val_texts, "val", out, shard_tokens, None)
    shards += _write_split(tok, train_texts, "train", out, shard_tokens, counts)
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
            },
            "docs": {"val": len(val_texts), "train": len(train_texts)},
            "tokens": {
                "val": sum(s["tokens"] for s in shards if s["split"] == "val"),
                "train": sum(s["tokens"] for s in shards if s["split"] == "train"),
            },
            "selection_sha256": selection_sha256(texts),
            "shard_tokens": shard_tokens,
            "source": source or {},
            "shards": shards,
            "train_unigram_counts": counts.tolist(),
        },
    )
    return out
