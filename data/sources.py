"""Document sources for `pgolf data build`: where the raw text comes from, read lazily and in order.

    DocumentSource(kind="jsonl", path="docs.jsonl")                       one JSON object a line
    DocumentSource(kind="parquet", path="shards/")                        a .parquet file or a folder of them
    DocumentSource(kind="text", path="book.txt")                          one document per .txt file
    DocumentSource(kind="hf", path="HuggingFaceFW/fineweb", config="sample-10BT")   streamed with `datasets`

A source is re-iterable: every `iter(source)` reopens it and yields the same documents in the same
order, so a build can read it twice (once to train a tokenizer, once to tokenize). Nothing is held
in memory beyond one batch.

Selection and order (deterministic): the documents are taken in the source's own order: lines of
a jsonl file, rows of the parquet files in sorted file-name order, .txt files in sorted name order,
rows of a hub dataset as `datasets` streams them at a pinned revision. `max_docs` keeps the first
N. Nothing is shuffled; the build records a sha256 over the selected documents (see
`data.build.selection_sha256`) so two builds can be compared. The official challenge selection is
a seeded shuffle of the whole of FineWeb sample-10BT that cannot be reproduced by streaming; to
rebuild it exactly, build from its published `docs_selected.jsonl` as a local jsonl file.

Text files: a `.txt` file is ONE document (its whole UTF-8 text, byte for byte); a folder gives one
document per `*.txt` file. Blank lines do not separate documents because real web documents
(FineWeb included) contain blank lines between their paragraphs, so splitting on them would cut
documents apart silently.

`hf` sources use `datasets.load_dataset(..., streaming=True)`; the same code path reads a local
file when `path` is a `datasets` builder name ("json", "parquet", "text") and `data_files` names the
file, which is how it is tested without network.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SOURCE_KINDS = ("jsonl", "parquet", "text", "hf")
PARQUET_BATCH_ROWS = 1024
DEFAULT_HF_DATASET = "HuggingFaceFW/fineweb"
DEFAULT_HF_CONFIG = "sample-10BT"


@dataclass(frozen=True, kw_only=True, slots=True)
class DocumentSource:
    """A re-iterable, ordered stream of documents (str)."""

    kind: str
    """One of SOURCE_KINDS."""
    path: str
    """A file or folder for local kinds; a hub dataset id (or a `datasets` builder name) for "hf"."""
    field: str = "text"
    """The column / JSON field holding the text (ignored for "text")."""
    max_docs: int | None = None
    """Keep only the first N documents (None: all)."""
    config: str | None = None
    """hf only: the dataset configuration, e.g. "sample-10BT"."""
    split: str = "train"
    """hf only: the split to stream."""
    revision: str | None = None
    """hf only: a commit or tag, so the selection is reproducible."""
    data_files: str | None = None
    """hf only: local file(s) for a builder such as "json" or "parquet"."""

    def __post_init__(self) -> None:
        if self.kind not in SOURCE_KINDS:
            raise ValueError(f"DocumentSource.kind must be one of {SOURCE_KINDS}, got {self.kind!r}")
        if self.max_docs is not None and self.max_docs <= 0:
            raise ValueError(f"max_docs must be positive (or None for all), got {self.max_docs}")
        if self.kind != "hf" and not Path(self.path).exists():
            raise FileNotFoundError(
                f"documents not found: {self.path} (HINT: pass an existing --docs file or folder)"
            )

    def __iter__(self) -> Iterator[str]:
        reader = {"jsonl": _iter_jsonl, "parquet": _iter_parquet, "text": _iter_text, "hf": _iter_hf}[
            self.kind
        ]
        count = 0
        for text in reader(self):
            yield text
            count += 1
            if self.max_docs is not None and count >= self.max_docs:
                return

    def describe(self) -> dict[str, Any]:
        """What the manifest records as `source`."""
        out: dict[str, Any] = {"kind": self.kind, "field": self.field, "max_docs": self.max_docs}
        if self.kind == "hf":
            out.update(dataset=self.path, config=self.config, split=self.split, revision=self.revision)
            if self.data_files:
                out["data_files"] = str(Path(self.data_files).resolve())
        else:
            out["path"] = str(Path(self.path).resolve())
        return out


def source_from_path(
    path: str | os.PathLike[str], *, field: str = "text", max_docs: int | None = None
) -> DocumentSource:
    """Pick the kind from the file name: .jsonl/.json → jsonl, .parquet (or a folder of them) → parquet,
    .txt (or a folder of them) → text."""
    p = Path(path)
    if not p.exists():
        raise FileNotFoundError(
            f"documents not found: {p} (HINT: pass a .jsonl, .parquet or .txt file or a folder)"
        )
    if p.is_dir():
        if any(p.glob("*.parquet")):
            kind = "parquet"
        elif any(p.glob("*.txt")):
            kind = "text"
        else:
            raise ValueError(f"folder {p} holds no *.parquet or *.txt files; pass a file or a folder of them")
    else:
        suffix = p.suffix.lower()
        kinds = {".jsonl": "jsonl", ".json": "jsonl", ".parquet": "parquet", ".txt": "text"}
        if suffix not in kinds:
            raise ValueError(f"unknown document file type {p.name!r}: expected .jsonl, .parquet or .txt")
        kind = kinds[suffix]
    return DocumentSource(kind=kind, path=str(p), field=field, max_docs=max_docs)


def _check_text(value: object, where: str, field: str) -> str:
    if not isinstance(value, str):
        raise ValueError(
            f"{where}: field {field!r} is {type(value).__name__}, expected a string (HINT: pass --field)"
        )
    return value


def _iter_jsonl(src: DocumentSource) -> Iterator[str]:
    with open(src.path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{src.path}:{lineno}: not a JSON object ({e})") from e
            if not isinstance(obj, dict) or src.field not in obj:
                raise ValueError(f"{src.path}:{lineno}: expected an object with a string field {src.field!r}")
            yield _check_text(obj[src.field], f"{src.path}:{lineno}", src.field)


def _parquet_files(path: Path) -> list[Path]:
    files = sorted(path.glob("*.parquet")) if path.is_dir() else [path]
    if not files:
        raise FileNotFoundError(f"no .parquet files in {path}")
    return files


def _iter_parquet(src: DocumentSource) -> Iterator[str]:
    import pyarrow.parquet as pq

    for file in _parquet_files(Path(src.path)):
        pf = pq.ParquetFile(file)
        if src.field not in pf.schema_arrow.names:
            raise ValueError(
                f"{file}: no column {src.field!r} (columns: {pf.schema_arrow.names}); pass --field"
            )
        row = 0
        for batch in pf.iter_batches(columns=[src.field], batch_size=PARQUET_BATCH_ROWS):
            for value in batch.column(0).to_pylist():
                yield _check_text(value, f"{file} row {row}", src.field)
                row += 1


def _iter_text(src: DocumentSource) -> Iterator[str]:
    path = Path(src.path)
    files = sorted(path.glob("*.txt")) if path.is_dir() else [path]
    for file in files:
        try:
            yield file.read_bytes().decode("utf-8")
        except UnicodeDecodeError as e:
            raise ValueError(f"{file} is not UTF-8 text ({e}); convert it first") from e


def _iter_hf(src: DocumentSource) -> Iterator[str]:
    for i, row in enumerate(iter_hf_rows(src)):
        if src.field not in row:
            raise ValueError(
                f"{src.path} row {i}: no field {src.field!r} (fields: {sorted(row)}); pass --field"
            )
        yield _check_text(row[src.field], f"{src.path} row {i}", src.field)


def iter_hf_rows(src: DocumentSource) -> Iterator[dict[str, Any]]:
    """Rows of a `datasets` streaming dataset (hub id, or a builder name with local `data_files`)."""
    try:
        import datasets
    except ImportError as e:
        raise ImportError("streaming from the hub needs `datasets`: pip install 'pgolf[hub]'") from e
    kwargs: dict[str, Any] = {"split": src.split, "streaming": True}
    if src.config:
        kwargs["name"] = src.config
    if src.revision:
        kwargs["revision"] = src.revision
    if src.data_files:
        kwargs["data_files"] = src.data_files
    try:
        ds = datasets.load_dataset(src.path, **kwargs)
    except (ConnectionError, FileNotFoundError) as e:  # no network, unknown dataset / config / files
        raise FileNotFoundError(
            f"cannot open dataset {src.path!r} (config {src.config!r}, split {src.split!r}, revision {src.revision!r}): {e}. "
            "HINT: check the network or HF_ENDPOINT, or build from local files with --docs"
        ) from e
    yield from ds
