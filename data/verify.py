"""Check a dataset folder against its manifest: `pgolf data verify DIR [--quick]`.

For every shard the manifest lists: the header (magic, version, a size that matches the declared
count), the byte size, the token count, the document count (BOS tokens) and the sha256; for the
tokenizer file its sha256; for each split the document and token totals. A shard file in the folder
that the manifest does not list is a failure too, since anything globbing `fineweb_*` would read it.
`--quick` skips the checks that read every byte (sha256, document counts, disjointness).

Disjointness (data/overlap.py): every training document, decoded from the shards with the dataset's
tokenizer and normalised, is looked up among the validation documents' digests (from the validation
shards, and the manifest's digest file where it records one); `--against-docs FILE` also checks the
training documents against the documents of FILE, by digest and by 25-character windows, for a
folder built elsewhere. Each overlapping training document is a problem naming both documents.

The canonical byte counts (`val_bytes.bin`, manifest version 3: data/canonical.py) are checked against
the manifest's sha256 and against the validation tokens: one count per token, 0 at each BOS, each
document's counts summing to its canonical byte count, each count what its token's piece spells (the
dataset's tokenizer, a declared transform's markers 0), as the build counted it.

The result is a table, one row per file; the exit status is 0 when every check holds, 1 otherwise
(2 when the folder is not a dataset at all).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from data.canonical import VAL_BYTES_NAME, canonical_entry, load_canonical_bytes
from data.io import sha256_file
from data.manifest import MANIFEST_NAME, MANIFEST_VERSION, Manifest, load_manifest
from data.overlap import DEFAULT_SAMPLE, DEFAULT_THRESHOLD, DisjointReport, check_disjoint
from data.shards import ShardError, list_shards, parse_shard_name, read_header, read_shard, read_split
from data.tokenizer import load_tokenizer

CHECKS = ("header", "size", "count", "bos", "sha256")
LEGEND = (
    "checks: header = magic, version and a size matching the declared count; size = bytes vs manifest; "
    "count = tokens vs manifest; bos = documents (BOS tokens) vs manifest; sha256 = hash vs manifest"
)
OK, FAIL, SKIP = "ok", "FAIL", "-"


@dataclass(frozen=True, kw_only=True, slots=True)
class FileCheck:
    """The checks of one file; `problems` says what failed, with expected and actual values."""

    name: str
    split: str
    results: dict[str, str]
    problems: tuple[str, ...] = ()
    tokens: int = 0
    """Tokens found (header count; 0 when unreadable)."""
    docs: int | None = None
    """Documents found (BOS tokens), None when not counted (--quick)."""
    token_counts: np.ndarray | None = None
    """How often each token id occurs in the shard (the vocabulary's ids), None when not read whole (--quick)."""

    @property
    def ok(self) -> bool:
        return not self.problems


@dataclass(frozen=True, kw_only=True, slots=True)
class VerifyReport:
    root: Path
    files: tuple[FileCheck, ...]
    totals: tuple[str, ...] = field(default=())
    total_problems: tuple[str, ...] = field(default=())
    disjoint: DisjointReport | None = None
    """The disjointness checks (None under --quick without --against-docs)."""

    @property
    def ok(self) -> bool:
        return (
            all(f.ok for f in self.files)
            and not self.total_problems
            and not (self.disjoint and self.disjoint.problems)
        )

    def problems(self) -> list[str]:
        return (
            [f"{f.name}: {p}" for f in self.files for p in f.problems]
            + list(self.total_problems)
            + list(self.disjoint.problems if self.disjoint else ())
        )

    def table(self) -> str:
        """A fixed-width table: one row per file, one column per check, then the split totals."""
        head = ["file", "split", "tokens", "docs", *CHECKS, "result"]
        rows = [
            [
                f.name,
                f.split,
                f"{f.tokens:,}" if f.split in ("val", "train") else "",
                "" if f.docs is None else f"{f.docs:,}",
                *(f.results.get(c, SKIP) for c in CHECKS),
                "OK" if f.ok else "FAIL",
            ]
            for f in self.files
        ]
        widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]
        fmt = "  ".join(f"{{:<{w}}}" for w in widths)
        lines = [fmt.format(*head), fmt.format(*("-" * w for w in widths))]
        lines += [fmt.format(*r) for r in rows]
        lines += list(self.totals)
        lines += list(self.disjoint.lines if self.disjoint else ())
        lines.append(LEGEND)
        bad = self.problems()
        lines.append(f"{self.root}: " + ("all checks hold" if not bad else f"{len(bad)} problem(s):"))
        lines += [f"  - {p}" for p in bad]
        return "\n".join(lines)


def _check_val_bytes(m: Manifest, *, quick: bool) -> FileCheck:
    """The canonical byte counts (data/canonical.py): the manifest's sha256, and that they belong to the
    validation tokens (one per token, 0 at each BOS, each document's counts summing to its canonical bytes)."""
    block = canonical_entry(m.raw)
    if block is None:
        # built before version 3, or downloaded: scored with the byte table (unranked), or proved later
        return FileCheck(name="(no canonical byte counts: pgolf data prove)", split="bytes", results={})
    name = str((block.get("val_bytes") or {}).get("file", VAL_BYTES_NAME))
    if quick:
        return FileCheck(
            name=name, split="bytes", results={"header": OK if (m.root / name).is_file() else FAIL}
        )
    try:
        tokens = read_split(m.root, "val")
        load_canonical_bytes(m.root, m.raw, tokens, m.vocab_size, m.bos_id)
    except (ValueError, FileNotFoundError) as e:
        return FileCheck(name=name, split="bytes", results={"sha256": FAIL}, problems=(str(e),))
    vb = block["val_bytes"]
    return FileCheck(
        name=name,
        split="bytes",
        results={"header": OK, "count": OK, "bos": OK, "sha256": OK},
        tokens=int(vb.get("tokens", 0)),
        docs=int(vb.get("docs", 0)),
    )


def _check_shard(m: Manifest, entry: dict[str, object], *, full: bool) -> FileCheck:
    name, split = str(entry["name"]), str(entry["split"])
    path = m.root / name
    results = dict.fromkeys(CHECKS, SKIP)
    problems: list[str] = []
    if not path.is_file():
        return FileCheck(
            name=name, split=split, results={c: FAIL for c in CHECKS}, problems=("file is missing",), docs=0
        )
    size = path.stat().st_size
    results["size"] = OK if size == entry["bytes"] else FAIL
    if size != entry["bytes"]:
        problems.append(f"size {size} bytes, manifest says {entry['bytes']}")
    try:
        count = read_header(path)
        results["header"] = OK
    except ShardError as e:
        results["header"] = FAIL
        problems.append(f"bad header: {str(e).split(' HINT')[0]}")
        count = None
    docs: int | None = None
    counts: np.ndarray | None = None
    if count is not None:
        results["count"] = OK if count == entry["tokens"] else FAIL
        if count != entry["tokens"]:
            problems.append(f"header declares {count} tokens, manifest says {entry['tokens']}")
        if full:
            ids = np.asarray(read_shard(path))
            docs = int(np.count_nonzero(ids == m.bos_id))
            counts = np.bincount(ids, minlength=m.vocab_size)[: m.vocab_size]
            results["bos"] = OK if docs == entry["docs"] else FAIL
            if docs != entry["docs"]:
                problems.append(f"{docs} documents (BOS tokens), manifest says {entry['docs']}")
    if full:
        digest = sha256_file(path)
        results["sha256"] = OK if digest == entry["sha256"] else FAIL
        if digest != entry["sha256"]:
            problems.append(f"sha256 {digest[:16]}… but manifest says {str(entry['sha256'])[:16]}…")
    return FileCheck(
        name=name,
        split=split,
        results=results,
        problems=tuple(problems),
        tokens=count or 0,
        docs=docs,
        token_counts=counts,
    )


def bare_manifest(directory: str | os.PathLike[str], tokenizer: str | os.PathLike[str]) -> Manifest:
    """An in-memory manifest for a folder of `fineweb_{val,train}_NNNNNN.bin` shards that has none: each
    shard as its header says, the tokenizer given. Nothing in it is a claim to check but the headers."""
    root = Path(directory)
    if (root / MANIFEST_NAME).is_file():
        raise ValueError(
            f"{root} has a {MANIFEST_NAME}: --tokenizer is only for a folder of shards without one"
        )
    tok_path = Path(tokenizer)
    tok = load_tokenizer(tok_path)
    shards = []
    for split in ("val", "train"):
        for p in list_shards(root, split):
            try:
                tokens = read_header(p)
            except ShardError:
                tokens = -1
            shards.append(
                {
                    "name": p.name,
                    "split": split,
                    "tokens": tokens,
                    "docs": 0,
                    "bytes": p.stat().st_size,
                    "sha256": "",
                }
            )
    if not any(s["split"] == "train" for s in shards):
        raise FileNotFoundError(f"no training shards (fineweb_train_NNNNNN.bin) in {root}")
    raw = {
        "format": "pg-dataset",
        "format_version": MANIFEST_VERSION,
        "bare": True,
        "tokenizer": {
            "file": str(tok_path.resolve()),
            "kind": tok.kind,
            "vocab_size": tok.vocab_size,
            "bos_id": tok.bos_id,
        },
        "docs": {},
        "shards": shards,
    }
    return Manifest(root, raw)


def _hashed_file(
    name: str, split: str, path: Path, want: object, *, quick: bool, differs: Callable[[str], str]
) -> FileCheck:
    """A file the manifest names by sha256 (`want`; not checked when absent or under --quick): missing, equal,
    or `differs(digest)`."""
    if not path.is_file():
        return FileCheck(name=name, split=split, results={"sha256": FAIL}, problems=("file is missing",))
    if not want or quick:
        return FileCheck(name=path.name, split=split, results={})
    digest = sha256_file(path)
    if digest == want:
        return FileCheck(name=path.name, split=split, results={"sha256": OK})
    return FileCheck(name=path.name, split=split, results={"sha256": FAIL}, problems=(differs(digest),))


def _check_transform(m: Manifest, path: str | os.PathLike[str] | None, *, quick: bool) -> list[FileCheck]:
    """A submitted transform's file (`--transform FILE.py`) against the manifest's sha256 of the one the
    dataset was built with: hashed, never run (without the file, verify_dataset's totals say so)."""
    if path is None:
        return []
    p = Path(path)
    recorded = m.raw.get("transform")
    if not recorded:
        return [
            FileCheck(
                name=p.name,
                split="transform",
                results={"sha256": FAIL},
                problems=("the manifest records no submitted transform: this dataset was built without one",),
            )
        ]
    want = str(recorded.get("sha256"))
    return [
        _hashed_file(
            p.name,
            "transform",
            p,
            want,
            quick=quick,
            differs=lambda digest: (
                f"sha256 {digest[:16]}… but the dataset was built with transform "
                f"{recorded.get('name')!r} of sha256 {want[:16]}…: not the same file"
            ),
        )
    ]


def transform_confinement_line(recorded: dict[str, Any]) -> str:
    """One line of what the manifest records of a submitted transform's confined children (data/build.py
    transform_block): their splits in order, the sandbox modes, and every layer or guarantee one lacked."""
    name = recorded.get("name")
    if recorded.get("format_version") is None:
        return (
            f"transform {name!r}: how its children were confined is not recorded (built before "
            "pg-transform-record v1)"
        )
    children = list(recorded.get("children") or ())
    splits = ", ".join(str(c.get("split")) for c in children)
    modes = "/".join(dict.fromkeys(str(c.get("mode")) for c in children)) or "none"
    missing = list(recorded.get("missing_layers") or ())
    not_held = dict(recorded.get("guarantees_not_held") or {})
    line = f"transform {name!r}: {len(children)} confined child(ren) ({splits}), sandbox {modes}; "
    if not missing and not not_held:
        return line + "every isolation layer and guarantee held"
    return (
        line
        + f"layers missing: {', '.join(missing) or 'none'}; guarantees not held: "
        + (", ".join(f"{p} ({how})" for p, how in not_held.items()) or "none")
    )


def _counts_problems(m: Manifest, shards: Sequence[FileCheck]) -> list[str]:
    """The manifest's token counts of the training split (`train_unigram_counts`) and its `pieces` block (the
    pieces the validation split alone uses, which a record track bounds: data/proof.py val_only_pieces), against
    what the shards hold (their checks' counts: each shard read once)."""
    from data.canonical import CanonicalBytesError, spelled_lengths
    from data.proof import val_only_pieces

    found = {"train": np.zeros(m.vocab_size, np.int64), "val": np.zeros(m.vocab_size, np.int64)}
    for f in shards:
        if f.token_counts is not None:
            found[f.split] += f.token_counts
    problems = []
    recorded = m.raw.get("train_unigram_counts")
    if recorded is not None and not np.array_equal(np.asarray(recorded, dtype=np.int64), found["train"]):
        problems.append("train_unigram_counts: the manifest's counts are not the training shards' tokens")
    pieces = m.raw.get("pieces")
    if isinstance(pieces, dict):
        try:
            spell = spelled_lengths(m.root, m.raw)
        except CanonicalBytesError:
            spell = None
        want = val_only_pieces(found["val"], found["train"], spell)["val_only"]
        if pieces.get("val_only") != want:
            problems.append(
                f"pieces.val_only: the manifest says {pieces.get('val_only')}, the shards give {want} (pieces the "
                "validation split uses and the training split never does)"
            )
    return problems


def verify_dataset(
    directory: str | os.PathLike[str],
    *,
    quick: bool = False,
    against_docs: str | os.PathLike[str] | None = None,
    ngram_threshold: float = DEFAULT_THRESHOLD,
    ngram_sample: int = DEFAULT_SAMPLE,
    workers: int | None = None,
    tokenizer: str | os.PathLike[str] | None = None,
    transform: str | os.PathLike[str] | None = None,
) -> VerifyReport:
    """Check every file of a dataset folder against its manifest, and the training documents against
    the validation documents (see the module docstring). `tokenizer`: for a folder of shards without a
    manifest (an entry's own): the tokenizer they were made with; only their headers are checked, then
    disjointness. `transform`: the submitted transform.py the dataset was built with, hashed against the
    manifest's record."""
    bare = tokenizer is not None
    m = bare_manifest(directory, tokenizer) if tokenizer is not None else load_manifest(directory)
    entries = list(m.raw["shards"])
    files = [_check_shard(m, e, full=not quick and not bare) for e in entries]

    tok = m.raw["tokenizer"]
    tok_path = m.root / str(tok["file"])
    files.append(
        _hashed_file(
            str(tok["file"]),
            "tokenizer",
            tok_path,
            tok.get("sha256"),
            quick=quick,
            differs=lambda digest: f"sha256 {digest[:16]}… but manifest says {str(tok['sha256'])[:16]}…",
        )
    )

    files += _check_transform(m, transform, quick=quick)

    listed = {str(e["name"]) for e in entries}
    for p in sorted(m.root.glob("fineweb_*.bin")):
        if p.name not in listed and parse_shard_name(p.name) is not None:
            files.append(
                FileCheck(
                    name=p.name,
                    split="?",
                    results={},
                    problems=("shard file not listed in the manifest; remove it",),
                )
            )

    totals: list[str] = []
    total_problems: list[str] = []
    view_split = (m.raw.get("view") or {}).get("split")  # a make_split_view folder holds one split
    for split in ("val", "train"):
        if view_split and split != view_split:
            continue
        # Totals of what the files hold (as measured above), against the manifest's split totals.
        found = [f for f in files[: len(entries)] if f.split == split]
        tokens = sum(f.tokens for f in found)
        counted = [f.docs for f in found if f.docs is not None]
        docs = sum(counted) if len(counted) == len(found) else None
        want_docs = m.raw["docs"].get(split)
        want_tokens = (m.raw.get("tokens") or {}).get(split)
        totals.append(
            f"{split}: {len(found)} shard(s), {tokens:,} tokens, "
            + (f"{docs:,} docs" if docs is not None else "docs not counted")
        )
        if docs is not None and want_docs is not None and docs != want_docs:
            total_problems.append(
                f"{split}: shards hold {docs} documents, manifest docs.{split} says {want_docs}"
            )
        if want_tokens is not None and tokens != want_tokens:
            total_problems.append(
                f"{split}: shards hold {tokens} tokens, manifest tokens.{split} says {want_tokens}"
            )
    if not view_split and not bare and not any(e["split"] == "val" for e in entries):
        total_problems.append("no validation shards listed")
    if not bare and view_split != "train":
        files.append(_check_val_bytes(m, quick=quick))
    if not quick and not bare and not view_split and all(f.ok for f in files[: len(entries)]):
        total_problems += _counts_problems(m, files[: len(entries)])
    recorded = m.raw.get("transform")
    if recorded:
        totals.append(transform_confinement_line(recorded))
    if recorded and transform is None:
        totals.append(
            f"transform: built with the submitted transform {recorded.get('name')!r} (sha256 "
            f"{str(recorded.get('sha256'))[:16]}…); its file was not checked (HINT: --transform FILE.py)"
        )
    disjoint = None
    if not quick or against_docs is not None:
        failed = [f.name for f in files[: len(entries)] if not f.ok]
        disjoint = check_disjoint(
            m,
            failed=failed,
            digests=not quick,
            against_docs=against_docs,
            threshold=ngram_threshold,
            sample=ngram_sample,
            workers=workers,
        )
    return VerifyReport(
        root=m.root,
        files=tuple(files),
        totals=tuple(totals),
        total_problems=tuple(total_problems),
        disjoint=disjoint,
    )
