"""Dataset manifests: what a dataset folder holds, with hashes, so any copy can be checked.

A dataset folder holds `manifest.json`, the tokenizer file and the shards. The manifest
(format "pg-dataset", version 2) lists each shard's name, split, token count, document count, byte
size and sha256, the tokenizer's file and sha256, the document counts per split, a sha256 over
the selected documents (the selection and its order), and the unigram counts of the training
tokens (for the unigram reference bpb every result prints).

Version 2 adds, for a folder `pgolf data build` wrote: `split_sha256` (the same hash over each split's
documents alone, in order: the validation set's identity and the training set's, less any dropped
copy) and `disjoint` (the policy, the normalisation, and `val_digests`: the file beside the manifest
holding the validation documents' digests, its sha256 and count; data/disjoint.py). A downloaded
folder has neither. Version 1 manifests are still read; `pgolf data verify` says it cannot prove
disjointness from them ("built before v2") and checks the folder's validation shards instead.

Version 3 adds `canonical`: the canonical text every document was tokenized from and proved against
(data/proof.py), a declared transform, the proof's record, and `val_bytes` (the file of per-token byte
counts that bpb divides by, its sha256 and totals: data/canonical.py). A folder without it is scored with
the byte table of its tokenizer, which the result records (`byte_source: piece_table`); a record track
refuses it.

`make_split_view` makes the folder a phase is allowed to see: the training process gets a view
holding the training shards alone, the scorer a view holding the validation shards alone.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from data.io import read_json, sha256_file, write_json_atomic
from data.shards import read_header

DATA_LOCATION_ENV = ("PG_DATA_DIR", "PGOLF_DATA", "HF_HOME", "HF_DATASETS_CACHE")
"""Environment variables that say where datasets live: never in a sandboxed process's environment (it is an
allow-list, scoring/worker/env.py, that names none of them)."""


def data_root() -> Path:
    """Where built datasets are cached: `$PG_DATA_DIR` or `~/.cache/pgolf/datasets`."""
    env = os.environ.get("PG_DATA_DIR")
    return Path(env) if env else Path.home() / ".cache" / "pgolf" / "datasets"


def dataset_locations() -> list[Path]:
    """Folders where this machine keeps datasets: data_root() and every folder DATA_LOCATION_ENV names, those that
    exist, resolved. A sandboxed phase's broad read rules leave them out (its `private` folders,
    isolation/sandbox.py broad_hidden): another dataset of the same documents kept under a broad read root (/opt,
    say) holds the validation text in its own tokens, and a run protects only its own dataset."""
    named = [data_root(), *(Path(v) for v in (os.environ.get(k) for k in DATA_LOCATION_ENV) if v)]
    return sorted({Path(os.path.realpath(p)) for p in named if os.path.isdir(p)})


MANIFEST_NAME = "manifest.json"
MANIFEST_FORMAT = "pg-dataset"
MANIFEST_VERSION = 3
READABLE_VERSIONS = (1, 2, 3)
CANONICAL_SINCE_VERSION = 3
"""The first version whose builds record the canonical byte counts (`canonical`, data/canonical.py)."""
DISJOINT_SINCE_VERSION = 2
"""The first version whose builds record the validation documents' digests (`disjoint`)."""


@dataclass(frozen=True)
class ShardEntry:
    name: str
    split: str
    tokens: int
    docs: int
    bytes: int
    sha256: str


@dataclass(frozen=True)
class Manifest:
    """A parsed, validated `manifest.json`. `raw` keeps every field as written."""

    root: Path
    raw: dict[str, Any]

    @property
    def shards(self) -> list[ShardEntry]:
        return [ShardEntry(**s) for s in self.raw["shards"]]

    def shard_paths(self, split: str) -> list[Path]:
        return [self.root / s.name for s in self.shards if s.split == split]

    @property
    def format_version(self) -> int:
        return int(self.raw["format_version"])

    @property
    def tokenizer_path(self) -> Path:
        return self.root / self.raw["tokenizer"]["file"]

    @property
    def vocab_size(self) -> int:
        return int(self.raw["tokenizer"]["vocab_size"])

    @property
    def markers(self) -> tuple[str, ...]:
        """A declared transform's markers (canonical.markers): removed from decoded text before digesting."""
        return tuple((self.raw.get("canonical") or {}).get("markers") or ())

    @property
    def bos_id(self) -> int:
        return int(self.raw["tokenizer"]["bos_id"])

    def split_tokens(self, split: str) -> int:
        return sum(s.tokens for s in self.shards if s.split == split)


def shard_entry(path: Path, split: str, docs: int) -> dict[str, Any]:
    return {
        "name": path.name,
        "split": split,
        "tokens": read_header(path),
        "docs": docs,
        "bytes": path.stat().st_size,
        "sha256": sha256_file(path),
    }


def load_manifest(directory: str | os.PathLike[str]) -> Manifest:
    """Read and check `DIR/manifest.json` (format, version, required fields)."""
    root = Path(directory)
    path = root / MANIFEST_NAME
    if not path.is_file():
        raise FileNotFoundError(
            f"no {MANIFEST_NAME} in {root}: not a dataset folder. "
            "HINT: build one with `pgolf data build` or download one with `pgolf data download`."
        )
    raw = read_json(path, what="dataset manifest")
    if raw.get("format") != MANIFEST_FORMAT:
        raise ValueError(f"{path}: format is {raw.get('format')!r}, expected {MANIFEST_FORMAT!r}")
    if raw.get("format_version") not in READABLE_VERSIONS:
        raise ValueError(
            f"{path}: format_version {raw.get('format_version')!r}; this harness reads versions "
            f"{', '.join(map(str, READABLE_VERSIONS))}"
        )
    for key in ("tokenizer", "shards", "docs"):
        if key not in raw:
            raise ValueError(f"{path}: missing field {key!r}; rebuild the dataset")
    return Manifest(root, raw)


def write_manifest(directory: str | os.PathLike[str], fields: dict[str, Any]) -> Path:
    path = Path(directory) / MANIFEST_NAME
    write_json_atomic(path, {"format": MANIFEST_FORMAT, "format_version": MANIFEST_VERSION, **fields})
    return path


def _link_or_copy(src: Path, dst: Path) -> None:
    """Hard-link when the filesystem allows (no bytes copied, no path back to the source), else copy."""
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def make_split_view(src: str | os.PathLike[str], dst: str | os.PathLike[str], split: str) -> Path:
    """Make `dst` a dataset folder holding only `split`'s shards, the tokenizer and a filtered manifest.

    Files are hard links (or copies), never symbolic links, so the view does not reveal where the
    other split lives. The validation digest file stays behind: no view needs it (training must not
    hold anything derived from validation text), and disjointness is verified on the source folder.
    """
    m = load_manifest(src)
    dst = Path(dst)
    if dst.exists():
        shutil.rmtree(dst)
    dst.mkdir(parents=True)
    raw = dict(m.raw)
    raw["shards"] = [s for s in m.raw["shards"] if s["split"] == split]
    raw["view"] = {"split": split, "source_manifest_sha256": sha256_file(m.root / MANIFEST_NAME)}
    if split != "train":
        raw.pop("train_unigram_counts", None)
    elif isinstance(raw.get("pieces"), dict):
        # which pieces only the validation text uses is a fact of that text: the count stays, the ids go
        raw["pieces"] = {k: v for k, v in raw["pieces"].items() if k != "val_only_ids"}
    for s in raw["shards"]:
        _link_or_copy(m.root / s["name"], dst / s["name"])
    canonical = raw.get("canonical")
    if split == "val" and isinstance(canonical, dict) and isinstance(canonical.get("val_bytes"), dict):
        name = str(canonical["val_bytes"]["file"])
        _link_or_copy(
            m.root / name, dst / name
        )  # the scorer's denominator travels with the validation shards
    _link_or_copy(m.tokenizer_path, dst / m.raw["tokenizer"]["file"])
    write_json_atomic(dst / MANIFEST_NAME, {k: v for k, v in raw.items()})
    return dst
