"""`pgolf data verify`'s disjointness checks: every training document, decoded from the shards, against
the validation documents.

One pass over the training shards (a pool of processes, a shard each at a time) does both checks:

- **digests** (always, unless `--quick`): each training document (BOS to the next BOS; a document may
  continue into the next shard) is decoded with the dataset's tokenizer, normalised (pg-norm/1,
  data/disjoint.py) and hashed; its digest must not be a validation document's. The validation digests
  are computed the same way from the folder's own validation shards, and where the manifest records a
  digest file (`disjoint.val_digests`, builds since manifest v2) that file must hold exactly them.
  A hit is a problem naming the training document (its index in the split, its shard and token
  offset) and the validation document (its index and place).
- **own tokens** (whenever training documents are decoded): each training document's tokens must be the
  tokenizer's encoding of the text they decode to. Both checks see only that text: validation documents
  written as tokens of another encoding (sp1024 byte pieces of each byte + 1, which a train.py undoes)
  decode to other text and passed both. The honest builds of sample.jsonl (sp1024, sp8192, sp1024 + case,
  byte260) re-encode exactly; it costs an encode of the training text (sp1024: 1.1 to 3.4 CPU s for
  13.9 M characters with digests alone, 3.1 to 5.8 with the windows).
- **windows** (`--against-docs FILE`: the validation documents as text, for a folder built elsewhere):
  every 25-character window of each validation document's skeleton (its normalised text's letters and
  digits, `skeleton`: a mark, space or zero-width character put into the text every few characters
  breaks no window) is hashed (a polynomial
  rolling hash mod 2^64 over code points, then the splitmix64 finaliser); one window in `sample` (by
  hash value, so the same windows are kept on both sides; 8 by default) is kept, and a window found in
  more than MAX_DOCS_PER_WINDOW validation documents is dropped as boilerplate. A training document is
  reported when it holds more than `threshold` (0.25 by default) of a validation document's kept
  windows, and at least MIN_SHARED_WINDOWS of them: the training document, the validation document's
  index in FILE, and the fraction. A validation document more than `threshold` of whose kept windows are in
  the training documents taken together (a document cut in parts, each its own training document) is
  reported too ("spread"), naming the training documents that hold the most of them. Training documents equal to one of FILE's documents after
  normalisation are reported too.

Why characters of normalised text rather than tokens: a window of tokens means a different length of text
under every tokenizer (13 bytes under byte260, about 30 under sp1024), and tokens change with case and
context; characters of the normalised text are the same for every tokenizer and every way of writing a text
that pg-norm/1 folds (case, width, whitespace).

Why 25 letters and digits and 0.25: an edit every so often (a letter put in, a word changed) leaves whole only
the windows between two edits. With 50 and 0.5, 50 validation documents of sample.jsonl, each in training
with a letter put in every 100 characters or a word changed in every 8 or 16, went unreported, 50 of 50 and
49 of 50. With 25 and 0.25 all 50 are reported for each (and every 60 characters), and the honest training
documents of sample.jsonl (2,148 against its 500 validation ones) hold at most 11.5 % of one's windows (at 50:
12.8 %). 25 letters and digits are 5 or 6 English words: a copied paragraph gives dozens of windows.

Why the skeleton: a validation document with a mark put in every 40 characters ("|", a zero-width space)
kept no window of its normalised text whole, and no digest matched, yet a model learns the
text from it almost whole. Letters drawn like Latin ones (Cyrillic "о", Greek "ο") are read as those
(`LOOK_ALIKES`): NFKC keeps them. What is left to an attacker is putting letters or digits into the text
every 30 or so characters (measured: docs/RULES.md), which the model then learns too.

Memory: the validation windows kept cost 12 bytes each (hash + document), about 1.5 bytes per character of
validation text at 1 in 8: some 180 MB (skeletons) for the challenge's 50,000 documents (150 M characters).
"""

from __future__ import annotations

import multiprocessing as mp
import os
import re
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from data.disjoint import (
    MATCH_NORMALISED,
    NORMALISATION,
    VAL_DIGESTS_NAME,
    decode_documents,
    digest,
    normalise,
    read_val_digests,
    without_markers,
)
from data.io import sha256_file
from data.manifest import DISJOINT_SINCE_VERSION, Manifest
from data.shards import read_shard
from data.tokenizer import SentencePieceTokenizer, load_tokenizer

WINDOW_CHARS = 25
DEFAULT_SAMPLE = 8
DEFAULT_THRESHOLD = 0.25
MIN_SHARED_WINDOWS = 3
MAX_DOCS_PER_WINDOW = 8
BATCH_TOKENS = 1 << 20
BATCH_DOCS = 1024
PROBLEMS_LISTED = 50

_P = np.uint64(0x9E3779B97F4A7C15)  # odd, so invertible mod 2^64
_P_INV = np.uint64(pow(0x9E3779B97F4A7C15, -1, 1 << 64))
_M1, _M2 = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB)
_S30, _S27, _S31 = np.uint64(30), np.uint64(27), np.uint64(31)
_POWERS: list[np.ndarray] = []


def _powers(n: int) -> tuple[np.ndarray, np.ndarray]:
    """P^i and P^-i mod 2^64 for i in [0, n] (cached, grown by doubling)."""
    if not _POWERS or _POWERS[0].size <= n:
        size = max(n + 1, 2 * (_POWERS[0].size if _POWERS else 1 << 16))
        with np.errstate(over="ignore"):
            pw = np.cumprod(np.concatenate([[np.uint64(1)], np.full(size - 1, _P, dtype=np.uint64)]))
            ipw = np.cumprod(np.concatenate([[np.uint64(1)], np.full(size - 1, _P_INV, dtype=np.uint64)]))
        _POWERS[:] = [pw.astype(np.uint64), ipw.astype(np.uint64)]
    return _POWERS[0], _POWERS[1]


def _mix(x: np.ndarray) -> np.ndarray:
    """The splitmix64 finaliser: every bit of the rolling hash reaches every bit."""
    x = x ^ (x >> _S30)
    x = x * _M1
    x = x ^ (x >> _S27)
    x = x * _M2
    return x ^ (x >> _S31)


_NOT_ALNUM = re.compile(r"[\W_]+")

LOOK_ALIKES = str.maketrans(
    # Cyrillic, Greek and Latin letters (as casefolded) drawn like a Latin letter, as that letter. NFKC keeps them:
    # a Cyrillic look-alike for 1 in 5 of a, e, o, p, c, x, y, i left no window whole and passed the windows.
    "аеёорсхуіїјѕԁԛԝһӏвкмнтαβεζηικμνορτυχγϲϳıȷɑɡ",
    "aeeopcxyiijsdqwhlbkmhtabezhikmvoptuxycjijag",
)


def skeleton(normalised: str) -> str:
    """The letters and digits of a normalised text, in order, a look-alike of a Latin letter as that letter (what
    the windows are of: see the module docstring)."""
    return _NOT_ALNUM.sub("", normalised).translate(LOOK_ALIKES)


def window_hashes(texts: Sequence[str], sample: int = DEFAULT_SAMPLE) -> tuple[np.ndarray, np.ndarray]:
    """The kept windows of the skeletons of already-normalised texts: (hashes uint64, index in `texts` int64), in
    order."""
    texts = [skeleton(t) for t in texts]
    lens = np.fromiter((len(t) for t in texts), dtype=np.int64, count=len(texts))
    n = int(lens.sum())
    nwin = n - WINDOW_CHARS + 1
    if nwin <= 0:
        return np.zeros(0, dtype=np.uint64), np.zeros(0, dtype=np.int64)
    cps = np.frombuffer("".join(texts).encode("utf-32-le", "surrogatepass"), dtype="<u4").astype(np.uint64)
    pw, ipw = _powers(n)
    with np.errstate(over="ignore"):
        prefix = np.zeros(n + 1, dtype=np.uint64)
        np.cumsum(cps * pw[:n], out=prefix[1:])
        win = (prefix[WINDOW_CHARS:] - prefix[:-WINDOW_CHARS]) * ipw[:nwin]
        doc = np.repeat(np.arange(len(texts), dtype=np.int64), lens)[:nwin]
        starts = np.cumsum(lens) - lens
        inside = np.arange(nwin, dtype=np.int64) - starts[doc] + WINDOW_CHARS <= lens[doc]
        h = _mix(win[inside])
    d = doc[inside]
    if sample > 1:
        keep = h % np.uint64(sample) == 0
        h, d = h[keep], d[keep]
    return h, d


def _unique_pairs(h: np.ndarray, d: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Distinct (hash, document) pairs, sorted by hash then document."""
    order = np.lexsort((d, h))
    h, d = h[order], d[order]
    first = np.ones(h.size, dtype=np.bool_)
    first[1:] = (h[1:] != h[:-1]) | (d[1:] != d[:-1])
    return h[first], d[first]


@dataclass(frozen=True)
class WindowIndex:
    """The validation documents' kept windows: sorted hashes, their documents, and each document's count."""

    hashes: np.ndarray
    docs: np.ndarray
    windows: np.ndarray
    sample: int
    common_dropped: int
    """Distinct windows dropped because more than MAX_DOCS_PER_WINDOW validation documents hold them."""

    @classmethod
    def build(cls, normalised: Sequence[str], sample: int = DEFAULT_SAMPLE) -> WindowIndex:
        hs, ds = [], []
        for i in range(0, len(normalised), BATCH_DOCS):
            h, d = window_hashes(normalised[i : i + BATCH_DOCS], sample)
            hs.append(h)
            ds.append(d + i)
        h, d = _unique_pairs(
            np.concatenate(hs) if hs else np.zeros(0, np.uint64),
            np.concatenate(ds) if ds else np.zeros(0, np.int64),
        )
        group = np.flatnonzero(np.r_[True, h[1:] != h[:-1]]) if h.size else np.zeros(0, np.int64)
        counts = np.diff(np.r_[group, h.size])
        common = counts > MAX_DOCS_PER_WINDOW
        keep = ~np.repeat(common, counts)
        h, d = h[keep], d[keep].astype(np.int32)
        return cls(h, d, np.bincount(d, minlength=len(normalised)), sample, int(common.sum()))

    def shared(self, h: np.ndarray, d: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """For training windows (hashes `h` of documents `d`): (training document, validation document,
        distinct windows shared) for every pair that shares one."""
        empty = np.zeros(0, np.int64)
        if not self.hashes.size or not h.size:
            return empty, empty, empty
        order = np.argsort(h, kind="stable")  # sorted queries: searchsorted walks the index in order
        h, d = h[order], d[order]
        lo = np.minimum(np.searchsorted(self.hashes, h, "left"), self.hashes.size - 1)
        hit = self.hashes[lo] == h
        if not hit.any():
            return empty, empty, empty
        h, d = _unique_pairs(h[hit], d[hit])  # a window repeated in one training document counts once
        lo = np.searchsorted(self.hashes, h, "left")
        n = np.searchsorted(self.hashes, h, "right") - lo
        row = np.repeat(np.arange(h.size), n)
        idx = lo[row] + np.arange(row.size) - np.repeat(np.cumsum(n) - n, n)
        tdoc, vdoc = d[row], self.docs[idx].astype(np.int64)
        key, shared = np.unique(tdoc * max(1, self.windows.size) + vdoc, return_counts=True)
        return key // max(1, self.windows.size), key % max(1, self.windows.size), shared

    def positions(self, h: np.ndarray) -> np.ndarray:
        """The places in the index (into `hashes` and `docs`) of every kept window among the hashes `h`: what
        a set of training documents covers of each validation document, whichever document holds the window."""
        if not self.hashes.size or not h.size:
            return np.zeros(0, np.int64)
        h = np.unique(h)
        lo = np.searchsorted(self.hashes, h, "left")
        n = np.searchsorted(self.hashes, h, "right") - lo
        row = np.repeat(np.arange(h.size), n)
        return lo[row] + np.arange(row.size) - np.repeat(np.cumsum(n) - n, n)


# ---- The pass over a split's shards ----


@dataclass(frozen=True, slots=True)
class DocPlace:
    shard: str
    offset: int
    """Token offset of the document's BOS in its shard (its first token where it has no BOS)."""


@dataclass(frozen=True, slots=True)
class Overlap:
    """A training document that is, or holds most of, a validation document."""

    train_doc: int
    train_place: DocPlace
    val_doc: int
    against: str
    """"validation shards" or the --against-docs file."""
    match: str
    """MATCH_NORMALISED for a digest hit, "windows" for the window check, "spread" for a validation document
    whose windows are mostly in training, spread over several documents (`train_docs`)."""
    fraction: float = 1.0
    shared: int = 0
    val_windows: int = 0
    train_fraction: float = 1.0
    val_place: DocPlace | None = None
    train_docs: tuple[int, ...] = ()
    """"spread": the training documents that hold most of the windows, most first (at most SPREAD_LISTED)."""

    def line(self) -> str:
        if self.match == "spread":
            docs = ", ".join(map(str, self.train_docs))
            return (
                f"validation document {self.val_doc} of {self.against}: {self.fraction:.1%} of its {WINDOW_CHARS}-character "
                f"windows ({self.shared} of its {self.val_windows} kept) are in training, spread over training documents "
                f"{docs} (the first in {self.train_place.shard}, token {self.train_place.offset:,}); none holds most of them"
            )
        where = f"training document {self.train_doc} ({self.train_place.shard}, token {self.train_place.offset:,})"
        if self.match == "windows":
            return (
                f"{where} holds {self.fraction:.1%} of the {WINDOW_CHARS}-character windows of validation "
                f"document {self.val_doc} of {self.against} ({self.shared} of its {self.val_windows} kept "
                f"windows; {self.train_fraction:.1%} of this document's)"
            )
        val = f"validation document {self.val_doc}"
        val += (
            f" ({self.val_place.shard}, token {self.val_place.offset:,})"
            if self.val_place
            else f" of {self.against}"
        )
        return f"{where} is {val}: {self.match}"


@dataclass(slots=True)
class _ShardScan:
    docs: int = 0
    chars: int = 0
    places: list[int] = field(default_factory=list)
    digests: list[bytes] = field(default_factory=list)
    hits: list[tuple[int, int, str, int]] = field(default_factory=list)
    """(document in shard, offset, which set, validation document)."""
    windows: list[tuple[int, int, int, int, float]] = field(default_factory=list)
    """(document in shard, offset, validation document, shared, fraction of the training document's)."""
    covered: list[np.ndarray] = field(default_factory=list)
    """Places in the window index (WindowIndex.positions) that the shard's documents hold."""
    pairs: list[np.ndarray] = field(default_factory=list)
    """Rows (document in shard, offset, validation document, shared windows): every pair that shares one."""
    undecodable: str | None = None
    """Why the shard's documents could not be decoded (token ids beyond the vocabulary)."""
    foreign: list[tuple[int, int, int]] = field(default_factory=list)
    """(document in shard, offset, first token that differs): documents whose tokens are not the tokenizer's
    encoding of the text they decode to."""


_STATE: dict[str, Any] = {}


def _init_scan(state: dict[str, Any]) -> None:
    _STATE.clear()
    _STATE.update(state)
    _STATE["tok"] = load_tokenizer(state["tokenizer"])


def _shard_documents(paths: Sequence[Path], k: int, bos: int) -> Iterator[tuple[int, np.ndarray]]:
    """(offset, tokens without BOS) of each document that starts in shard k; the last one continues
    into the following shards up to their first BOS. Tokens before shard 0's first BOS are a document
    without one."""
    toks = np.asarray(read_shard(paths[k]))
    starts = np.flatnonzero(toks == bos)

    def tail(begin: int) -> np.ndarray:
        parts = [toks[begin:]]
        for nxt in paths[k + 1 :]:
            t = np.asarray(read_shard(nxt))
            b = np.flatnonzero(t == bos)
            parts.append(t[: b[0]] if b.size else t)
            if b.size:
                break
        return np.concatenate(parts) if len(parts) > 1 else parts[0]

    if k == 0 and (not starts.size or starts[0] != 0):
        yield 0, (toks[: starts[0]] if starts.size else tail(0))
    for j, s in enumerate(starts.tolist()):
        yield s, (toks[s + 1 : starts[j + 1]] if j + 1 < starts.size else tail(s + 1))


def _encode(tok: Any, texts: list[str]) -> list[list[int]]:
    """The tokenizer's own tokens of each text (one thread: parallelism comes from worker processes)."""
    if isinstance(tok, SentencePieceTokenizer):
        return list(tok.sp.encode(texts, out_type=int, num_threads=1)) if texts else []
    return tok.encode(texts)


def _first_difference(a: np.ndarray, b: np.ndarray) -> int:
    n = min(a.size, b.size)
    differ = np.flatnonzero(a[:n] != b[:n])
    return int(differ[0]) if differ.size else n


def _batched(docs: Iterable[tuple[int, np.ndarray]]) -> Iterator[list[tuple[int, np.ndarray]]]:
    batch: list[tuple[int, np.ndarray]] = []
    tokens = 0
    for off, d in docs:
        batch.append((off, d))
        tokens += d.size
        if tokens >= BATCH_TOKENS or len(batch) >= BATCH_DOCS:
            yield batch
            batch, tokens = [], 0
    if batch:
        yield batch


def _scan_shard(k: int) -> _ShardScan:
    st = _STATE
    paths, collect = st["paths"], st["collect"]
    sets: list[tuple[str, dict[bytes, int]]] = st["sets"]
    index: WindowIndex | None = st["windows"]
    out = _ShardScan()
    for batch in _batched(_shard_documents(paths, k, st["bos"])):
        top = max((int(d.max()) for _, d in batch if d.size), default=0)
        if top >= st["vocab_size"]:
            out.undecodable = (
                f"{paths[k].name}: a document holds token id {top}, beyond the tokenizer's vocabulary of "
                f"{st['vocab_size']}: the shard's documents from token {batch[0][0]:,} on were not decoded"
            )
            return out
        spelled = decode_documents(st["tok"], [d for _, d in batch])
        if st.get("re_encode"):
            # what the checks below see is the text the tokens decode to: tokens of another encoding (another
            # tokenizer's, or shifted ids a train.py undoes) decode to other text, and encode to other tokens
            for i, ((off, d), again) in enumerate(zip(batch, _encode(st["tok"], spelled), strict=True)):
                ids, back = d.astype(np.int64), np.asarray(again, dtype=np.int64)
                if ids.size != back.size or not np.array_equal(ids, back):
                    out.foreign.append((out.docs + i, off, _first_difference(ids, back)))
        texts = [normalise(t) for t in without_markers(spelled, st["markers"])]
        base = out.docs
        for i, ((off, _), t) in enumerate(zip(batch, texts, strict=True)):
            dg = digest(t)
            out.chars += len(t)
            if collect:
                out.places.append(off)
                out.digests.append(dg)
            for name, table in sets:
                if (v := table.get(dg)) is not None:
                    out.hits.append((base + i, off, name, v))
        out.docs += len(batch)
        if index is not None:
            h, d = window_hashes(texts, index.sample)
            tdoc, vdoc, shared = index.shared(h, d)
            out.covered.append(np.unique(index.positions(h)))
            if tdoc.size:
                offs = np.fromiter((off for off, _ in batch), dtype=np.int64, count=len(batch))
                out.pairs.append(np.stack([base + tdoc, offs[tdoc], vdoc, shared], axis=1))
                own = np.bincount(d, minlength=len(texts))
                frac = shared / np.maximum(index.windows[vdoc], 1)
                for t_, v_, s_, f_ in zip(
                    tdoc.tolist(), vdoc.tolist(), shared.tolist(), frac.tolist(), strict=True
                ):
                    if f_ > st["threshold"] and s_ >= MIN_SHARED_WINDOWS:
                        out.windows.append((base + t_, batch[t_][0], v_, s_, s_ / max(int(own[t_]), 1)))
    return out


def _scan(state: dict[str, Any], n: int, workers: int) -> Iterator[_ShardScan]:
    workers = max(1, min(workers, n))
    if workers == 1:
        _init_scan(state)
        yield from (_scan_shard(k) for k in range(n))
        return
    method = "fork" if "fork" in mp.get_all_start_methods() else "spawn"
    with mp.get_context(method).Pool(workers, initializer=_init_scan, initargs=(state,)) as pool:
        yield from pool.imap(_scan_shard, range(n))


def default_workers() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)


# ---- The check ----


@dataclass(frozen=True)
class DisjointReport:
    lines: tuple[str, ...]
    problems: tuple[str, ...]
    overlaps: tuple[Overlap, ...] = ()
    train_docs_per_s: float | None = None


def _listed(overlaps: list[Overlap]) -> list[str]:
    lines = [o.line() for o in overlaps[:PROBLEMS_LISTED]]
    if len(overlaps) > PROBLEMS_LISTED:
        lines.append(f"... and {len(overlaps) - PROBLEMS_LISTED} more overlapping training document(s)")
    return lines


def check_disjoint(
    m: Manifest,
    *,
    failed: Sequence[str] = (),
    digests: bool = True,
    against_docs: str | os.PathLike[str] | None = None,
    threshold: float = DEFAULT_THRESHOLD,
    sample: int = DEFAULT_SAMPLE,
    workers: int | None = None,
) -> DisjointReport:
    """The disjointness checks of a dataset folder (see the module docstring). `failed`: shards whose
    integrity checks failed (missing, a bad header or size, a wrong sha256): nothing is proven over them."""
    if not 0 <= threshold < 1:
        raise ValueError(f"--ngram-threshold must be in [0, 1), got {threshold}")
    if sample < 1:
        raise ValueError(f"--ngram-sample must be at least 1, got {sample}")
    workers = default_workers() if workers is None else workers
    if workers < 1:
        raise ValueError(f"--workers must be positive, got {workers}")
    lines: list[str] = []
    problems: list[str] = []
    if failed:
        return DisjointReport((f"disjoint: not checked: {len(failed)} shard(s) failed the checks above",), ())

    record = m.raw.get("disjoint")
    view = (m.raw.get("view") or {}).get("split")
    train_paths = m.shard_paths("train")
    val_paths = m.shard_paths("val")
    base: dict[str, Any] = {
        "tokenizer": str(m.tokenizer_path),
        "bos": m.bos_id,
        "vocab_size": m.vocab_size,
        "markers": m.markers,
        "windows": None,
        "threshold": threshold,
    }
    sets: list[tuple[str, dict[bytes, int]]] = []
    val_places: list[DocPlace] = []

    # The validation side: the folder's own validation shards (decoded), and the manifest's file.
    if digests and view:
        lines.append(
            f"disjoint: cannot prove disjointness: built before v{DISJOINT_SINCE_VERSION} and no validation shards here"
            if m.format_version < DISJOINT_SINCE_VERSION and not val_paths
            else f"disjoint: a {view} split view: disjointness is verified on the source dataset, "
            f"which holds both splits and {VAL_DIGESTS_NAME}"
        )
    elif digests and val_paths:
        t0 = time.perf_counter()
        val_table: dict[bytes, int] = {}
        n = 0
        for k, scan in enumerate(
            _scan({**base, "paths": val_paths, "collect": True, "sets": []}, len(val_paths), workers)
        ):
            if scan.undecodable:
                problems.append(f"disjoint: {scan.undecodable}")
            for off, dg in zip(scan.places, scan.digests, strict=True):
                val_table.setdefault(dg, n)
                val_places.append(DocPlace(val_paths[k].name, off))
                n += 1
        sets.append(("validation shards", val_table))
        lines.append(
            f"disjoint: {n:,} validation documents decoded from {len(val_paths)} shard(s), normalised "
            f"({NORMALISATION}) and hashed: {len(val_table):,} distinct ({time.perf_counter() - t0:.1f} s)"
        )
        if record is None and m.format_version < DISJOINT_SINCE_VERSION:
            lines.append(
                f"disjoint: cannot prove disjointness from the manifest: built before v{DISJOINT_SINCE_VERSION} "
                "(it records no validation digests); checked against this folder's validation shards instead"
            )
        elif record is None:
            lines.append(
                "disjoint: no manifest here; checked against this folder's validation shards"
                if m.raw.get("bare")
                else "disjoint: the manifest records no validation digests (not built by `pgolf data build`); "
                "checked against this folder's validation shards"
            )
        else:
            bad = _check_digest_file(m, record, frozenset(val_table))
            problems += bad
            if not bad:
                lines.append(
                    f"disjoint: {VAL_DIGESTS_NAME} (sha256 in the manifest) holds exactly these digests"
                )
    elif digests:
        lines.append(
            "disjoint: no validation shards here"
            + ("; checked against --against-docs only" if against_docs is not None else ": not checked")
        )

    # The --against-docs side: the validation documents as text.
    index: WindowIndex | None = None
    against = str(against_docs) if against_docs is not None else None
    if against is not None:
        from data.sources import source_from_path

        t0 = time.perf_counter()
        normed = [normalise(t) for t in source_from_path(against)]
        ext_table: dict[bytes, int] = {}
        for i, t in enumerate(normed):
            ext_table.setdefault(digest(t), i)
        sets.append((against, ext_table))
        index = WindowIndex.build(normed, sample)
        base["windows"] = index
        short = int(np.count_nonzero(index.windows == 0))
        lines.append(
            f"against-docs {against}: {len(normed):,} validation documents normalised, {index.hashes.size:,} "
            f"{WINDOW_CHARS}-character windows kept (1 in {sample}; {index.common_dropped:,} dropped as held by more "
            f"than {MAX_DOCS_PER_WINDOW} documents; {short:,} document(s) too short for any, checked by digest only) "
            f"in {time.perf_counter() - t0:.1f} s"
        )

    if not sets or not train_paths:
        return DisjointReport(tuple(lines), tuple(problems))

    t0 = time.perf_counter()
    overlaps: list[Overlap] = []
    docs = chars = 0
    covered = np.zeros(index.hashes.size if index is not None else 0, dtype=np.bool_)
    pairs: list[np.ndarray] = []  # (training document, shard, offset, validation document, shared)
    state = {**base, "paths": train_paths, "collect": False, "sets": sets, "re_encode": True}
    foreign: list[str] = []
    for k, scan in enumerate(_scan(state, len(train_paths), workers)):
        shard = train_paths[k].name
        if scan.undecodable:
            problems.append(f"disjoint: {scan.undecodable}")
        foreign += [
            f"disjoint: training document {docs + local} ({shard}, token {off:,}) is not this tokenizer's encoding "
            f"of the text it decodes to (from its token {at:,}): tokens of another encoding hide their text from "
            "these checks"
            for local, off, at in scan.foreign
        ]
        for local, off, name, v in scan.hits:
            vp = val_places[v] if name == "validation shards" else None
            overlaps.append(
                Overlap(docs + local, DocPlace(shard, off), v, name, MATCH_NORMALISED, val_place=vp)
            )
        for local, off, v, shared, own in scan.windows:
            assert against is not None and index is not None
            total = int(index.windows[v])
            overlaps.append(
                Overlap(
                    docs + local,
                    DocPlace(shard, off),
                    v,
                    against,
                    "windows",
                    shared / total,
                    shared,
                    total,
                    own,
                )
            )
        for c in scan.covered:
            covered[c] = True
        for p in scan.pairs:
            pairs.append(np.column_stack([p[:, 0] + docs, np.full(len(p), k), p[:, 1:]]))
        docs += scan.docs
        chars += scan.chars
    if index is not None and against is not None:
        reported = {o.val_doc for o in overlaps if o.against == against}
        overlaps += _spread(index, covered, pairs, reported, against, train_paths, threshold)
    elapsed = time.perf_counter() - t0
    rate = docs / max(elapsed, 1e-9)
    checks = "digests" + (f", {WINDOW_CHARS}-character windows" if against else "") + " and its own tokens"
    lines.append(
        f"disjoint: {docs:,} training documents ({chars / 1e6:.1f} M characters) decoded and checked ({checks}) "
        f"in {elapsed:.1f} s on {max(1, min(workers, len(train_paths)))} worker(s): {rate:,.0f} documents/s"
    )
    copies = {(o.train_doc, o.against, o.val_doc) for o in overlaps if o.match != "windows"}
    overlaps = [
        o for o in overlaps if o.match != "windows" or (o.train_doc, o.against, o.val_doc) not in copies
    ]
    overlaps.sort(key=lambda o: (o.train_doc, o.against, o.val_doc))
    problems += _listed(overlaps)
    problems += foreign[:PROBLEMS_LISTED]
    if len(foreign) > PROBLEMS_LISTED:
        problems.append(
            f"disjoint: ... and {len(foreign) - PROBLEMS_LISTED} more not this tokenizer's encoding"
        )
    if not overlaps:
        lines.append(
            "disjoint: no training document is a validation document"
            + (" or holds most of one" if against else "")
        )
    return DisjointReport(tuple(lines), tuple(problems), tuple(overlaps), rate)


SPREAD_LISTED = 5


def _spread(
    index: WindowIndex,
    covered: np.ndarray,
    pairs: list[np.ndarray],
    reported: set[int],
    against: str,
    train_paths: Sequence[Path],
    threshold: float,
) -> list[Overlap]:
    """Validation documents more than `threshold` of whose kept windows (and at least MIN_SHARED_WINDOWS) are in
    the training documents taken together, though no one of them holds that much: one cut in parts, each part a
    training document of its own, is no less in training than the whole."""
    cov = np.bincount(index.docs[covered].astype(np.int64), minlength=index.windows.size)
    frac = cov / np.maximum(index.windows, 1)
    flagged = [
        int(v)
        for v in np.flatnonzero((frac > threshold) & (cov >= MIN_SHARED_WINDOWS))
        if int(v) not in reported
    ]
    if not flagged:
        return []
    rows = np.concatenate(pairs) if pairs else np.zeros((0, 5), np.int64)
    out = []
    for v in flagged:
        mine = rows[rows[:, 3] == v]
        mine = mine[np.lexsort((mine[:, 0], -mine[:, 4]))][:SPREAD_LISTED]
        first = mine[np.argmin(mine[:, 0])] if mine.size else None
        out.append(
            Overlap(
                int(first[0]) if first is not None else -1,
                DocPlace(train_paths[int(first[1])].name, int(first[2]))
                if first is not None
                else DocPlace("?", 0),
                v,
                against,
                "spread",
                float(frac[v]),
                int(cov[v]),
                int(index.windows[v]),
                train_docs=tuple(sorted(int(t) for t in mine[:, 0])),
            )
        )
    return out


def _check_digest_file(m: Manifest, record: dict[str, Any], from_shards: frozenset[bytes]) -> list[str]:
    """The manifest's digest file: present, the recorded sha256 and count, and exactly the digests of
    the validation shards."""
    info = record.get("val_digests") or {}
    path = m.root / str(info.get("file", VAL_DIGESTS_NAME))
    if not path.is_file():
        return [f"disjoint: {path.name} is missing (the manifest records it)"]
    got = sha256_file(path)
    if got != info.get("sha256"):
        return [
            f"disjoint: {path.name}: sha256 {got[:16]}… but the manifest says {str(info.get('sha256'))[:16]}…"
        ]
    try:
        recorded = read_val_digests(path)
    except ValueError as e:
        return [f"disjoint: {e}"]
    if recorded != from_shards:
        return [
            f"disjoint: {path.name} holds {len(recorded):,} digests, {len(recorded - from_shards):,} of them not of the "
            f"validation shards, which have {len(from_shards - recorded):,} it lacks"
        ]
    return []
