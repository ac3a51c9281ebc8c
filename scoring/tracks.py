"""Tracks: the rules a result is held to (budgets, cap, data, hardware, significance).

A track fixes the train and eval budgets, the byte cap, the validation documents, the hardware it is
meant for and the significance rule for new records; and every rule that decides how strictly an
entry is judged: the grace before a late run is killed, the startup and warm-up allowances, the
scored validation subset and the sandbox requirement. A run may use less training time than its
track allows, never more. On a record track none of these can be changed by a submission's config
or an official's `--set` (harness/config.py applies them); an unranked track's rules may be
loosened, and what was loosened is recorded with the run. Tracks change only with a version bump
and a line in docs (change history).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from data.official import (  # noqa: F401 (SP1024_SHA256, SP8192_SHA256: the tracks' names)
    NEUTRAL_PIECE_ORDERS,
    OFFICIAL_TOKENIZERS,
    SP1024_SHA256,
    SP8192_SHA256,
    VAL_ONLY_MIN_BYTES,
)
from scoring.artifact.cap import ARTIFACT_CAP_BYTES
from scoring.errors import ConfigError, did_you_mean


@dataclass(frozen=True, kw_only=True, slots=True)
class DocumentSet:
    """The validation documents a record track is scored on, and the canonical text bpb counts.

    A track names documents, not a token stream: any tokenizer the harness has proved on them (data/proof.py,
    run by `pgolf data build`) may be scored, and every score divides by the UTF-8 bytes of the same canonical
    text (data/canonical.py), so scores of two tokenizers are comparable by construction. A dataset is the
    track's when its validation split has `docs` documents, its canonical text is `canonical`, the sha256 over
    the documents' texts in order (the manifest's `split_sha256.val`) is `text_sha256` where that is pinned, and,
    for an official tokenizer, its validation token count is what the challenge's logs printed.
    """

    name: str
    docs: int
    canonical: str
    text_sha256: str | None = None
    """None: not pinned in this version of the harness (the split's hash is recorded with every result, and an
    official pins it here from the official documents; see docs/RULES.md)."""
    logged_val_tokens: tuple[tuple[str, int, int], ...] = ()
    """(tokenizer sha256, tokens, seq_len): the challenge's logs print the validation tokens the reference used,
    ((total - 1) // seq_len) * seq_len; a dataset of that tokenizer must give the same figure."""


FINEWEB_VAL = DocumentSet(
    name="fineweb_val_50k",
    docs=50_000,
    canonical="sp1024",
    text_sha256=None,
    # "val_loader:... fineweb10B_sp1024 ... tokens:62021632" (60 logs) and "val_tokens: 40540160" (sp8192 era,
    # seq_len 2048) in openai/parameter-golf's records
    logged_val_tokens=((SP1024_SHA256, 62_021_632, 1024), (SP8192_SHA256, 40_540_160, 2048)),
)
"""The challenge's validation split: the first 50,000 documents of its selected FineWeb documents, scored as the
official sp1024 normalises them (which keeps every sp1024 record's bytes exactly as the reference counted them)."""


VAL_ONLY_PIECES_MAX = 64
"""On a record track, the most pieces (of VAL_ONLY_MIN_BYTES bytes or more: data/proof.py val_only_pieces) the
validation split may use that the training split, the official text, never does: beyond it the uncounted tokenizer
holds validation text (see data/official.py VAL_ONLY_MIN_BYTES)."""


def dataset_problem(docs: DocumentSet, identity: dict[str, Any]) -> str | None:
    """Why a dataset is not `docs` (one line naming what differs), or None. `identity`: harness.run.pipeline
    data_identity (from the manifest)."""
    where = f"the official validation split ({docs.name})"
    if identity.get("canonical") is None:
        return (
            f"the dataset has no canonical byte counts (built before manifest version 3, or downloaded), so its bpb "
            f"could not be counted from the documents of {where}. HINT: `pgolf data build` from the documents "
            "(or `pgolf data prove DIR --docs FILE` for downloaded shards)"
        )
    if identity["canonical"] != docs.canonical:
        return f"the dataset's canonical text is {identity['canonical']!r}; {where} is scored as {docs.canonical!r}"
    if identity.get("val_docs") != docs.docs:
        return f"the dataset's validation split has {identity.get('val_docs')} documents; {where} has {docs.docs:,}"
    if docs.text_sha256 is not None and identity.get("val_text_sha256") != docs.text_sha256:
        return (
            f"the dataset's validation documents hash to {str(identity.get('val_text_sha256'))[:16]}…; {where} "
            f"hashes to {docs.text_sha256[:16]}…"
        )
    order = identity.get("piece_order")
    if identity.get("tokenizer_sha256") not in OFFICIAL_TOKENIZERS and order not in NEUTRAL_PIECE_ORDERS:
        return (
            f"the dataset's tokenizer numbers its pieces in an order of the entry's own (piece_order {order!r}): ids "
            "are free to carry the validation text's order. HINT: `pgolf data build --tokenizer MODEL` numbers an "
            "entry's pieces in the order of their text"
        )
    only = identity.get("val_only_pieces")
    if not isinstance(only, int) or only > VAL_ONLY_PIECES_MAX:
        return (
            f"the dataset's tokenizer has {only} pieces of {VAL_ONLY_MIN_BYTES} bytes or more that the validation split "
            f"uses and its training split never does (at most {VAL_ONLY_PIECES_MAX}): the uncounted tokenizer holds "
            "validation text"
            if isinstance(only, int)
            else "the dataset records no count of the pieces its validation split alone uses (built before it). HINT: "
            "rebuild it with `pgolf data build` (or `pgolf data prove DIR --docs FILE` for downloaded shards)"
        )
    for sha, logged, seq_len in docs.logged_val_tokens:
        n = identity.get("val_tokens")
        if (
            identity.get("tokenizer_sha256") == sha
            and isinstance(n, int)
            and ((n - 1) // seq_len) * seq_len != logged
        ):
            return (
                f"the dataset's {OFFICIAL_TOKENIZERS.get(sha, 'official')} validation split has {n:,} tokens "
                f"({((n - 1) // seq_len) * seq_len:,} at seq_len {seq_len}); the challenge's logs give {logged:,}"
            )
    return None


CPU_TRACK_DOCS = 1_700
"""The CPU record track's validation subset: its first this-many documents (Track.eval_max_docs)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Track:
    name: str
    train_budget_s: float
    """Wall-clock training budget in seconds (inf: untimed)."""
    eval_budget_s: float
    """Wall-clock evaluation budget in seconds (inf: untimed)."""
    cap_bytes: int
    documents: DocumentSet | None
    """The validation documents results are scored on (None: any dataset; an unranked track)."""
    hardware: str
    record: bool
    """Whether results on this track compete for records (and need significance)."""
    margin_nats: float = 0.005
    p_value: float = 0.01
    eval_max_tokens: int | None = None
    """Validation subset scored on this track, in tokens (None: the full split). The config key eval.max_tokens."""
    eval_max_docs: int | None = None
    """Validation subset scored on this track, in documents, each to its end (None: no cut by documents). The
    config key eval.max_docs. A record track that scores a subset cuts it by documents: a cut by tokens falls
    elsewhere in the text for each tokenizer, and which documents are scored would be the entrant's choice."""
    grace_s: float = 30.0
    """Seconds past the training budget before the training processes are killed (budget.grace_s)."""
    startup_s: float = 300.0
    """Allowance before the clock starts: imports, process-group setup (budget.startup_s)."""
    warmup_max_s: float = 180.0
    """Most seconds of off-clock compile warm-up accepted (budget.warmup_max_s)."""
    sandbox: str = "auto"
    """launch.sandbox: "required" (refuse to train unless the Landlock sandbox holds) or "auto"
    (every isolation layer the machine offers, each missing one recorded)."""
    network: str = "auto"
    """launch.network: "auto" (one node, as root: loopback only) or "host"."""
    device: str = "auto"
    """launch.device where the track's hardware fixes it: "cpu" (the CPU track trains and scores on the CPU; a
    GPU is not in its sandbox), or "auto" (the entrant's choice)."""
    version: int = 3
    """3: code bytes count each counted file's path too (scoring/artifact/cap.py counted_size), the CPU track
    trains and scores on the CPU, returned log-probabilities are normalised by the scorer, documents mode asks
    fixed ranges of padded rows; 2: record tracks name documents (DocumentSet), any proven tokenizer; 1 named the
    sp1024 data variant."""

    def __post_init__(self) -> None:
        if (
            self.sandbox not in ("auto", "required")
            or self.network not in ("auto", "host")
            or self.device not in ("auto", "cpu", "cuda")
        ):
            raise ValueError(
                f"track {self.name}: sandbox must be 'auto' or 'required', network 'auto' or 'host' and device "
                f"'auto', 'cpu' or 'cuda', got {self.sandbox!r}, {self.network!r}, {self.device!r}"
            )
        if self.record and self.documents is None:
            raise ValueError(f"track {self.name}: a record track names its validation documents")
        if self.eval_max_tokens is not None and self.eval_max_tokens <= 0:
            raise ValueError(f"track {self.name}: eval_max_tokens must be None or positive")
        if self.eval_max_docs is not None and self.eval_max_docs <= 0:
            raise ValueError(f"track {self.name}: eval_max_docs must be None or positive")
        if self.record and self.eval_max_tokens is not None:
            raise ValueError(
                f"track {self.name}: a record track cuts its subset by documents (eval_max_docs)"
            )


TRACKS: dict[str, Track] = {
    t.name: t
    for t in (
        Track(
            name="10min_16mb",
            train_budget_s=600.0,
            eval_budget_s=600.0,
            cap_bytes=ARTIFACT_CAP_BYTES,
            documents=FINEWEB_VAL,
            hardware="8xH100 SXM",
            record=True,
            sandbox="required",
        ),
        Track(
            name="non_record_16mb",
            train_budget_s=math.inf,
            eval_budget_s=math.inf,
            cap_bytes=ARTIFACT_CAP_BYTES,
            documents=None,
            hardware="any",
            record=False,
        ),
        Track(
            # The CPU track: the whole pipeline on CPU. Scoring covers the first 1,700 validation documents, each
            # to its end: about 2.1 M sp1024 tokens at the split's mean of 1,240 a document (62,021,632 / 50,000),
            # 1/29 of the split, so that it fits the eval budget. The same text for every tokenizer.
            name="cpu_10min_16mb",
            train_budget_s=600.0,
            eval_budget_s=600.0,
            cap_bytes=ARTIFACT_CAP_BYTES,
            documents=FINEWEB_VAL,
            hardware="CPU",
            record=True,
            eval_max_docs=CPU_TRACK_DOCS,
            grace_s=60.0,  # a CPU step is slow: a rank may need longer to reach its next tick and return
            sandbox="required",
            device="cpu",
        ),
        Track(
            name="smoke",
            train_budget_s=600.0,
            eval_budget_s=600.0,
            cap_bytes=ARTIFACT_CAP_BYTES,
            documents=None,
            hardware="any",
            record=False,
        ),
    )
}


def subset_problem(track: Track, score: dict[str, Any]) -> str | None:
    """Why a score's validation subset is not its track's (None: it is): a cut by documents (eval_subset_docs),
    resolved to tokens on the scored dataset, or by tokens (eval_subset_max_tokens), or the full split."""
    subset, docs = score.get("eval_subset_max_tokens") or None, score.get("eval_subset_docs") or None

    def said(tokens: Any, n_docs: Any) -> str:
        if isinstance(n_docs, int):
            return f"the first {n_docs:,} validation documents"
        return f"the first {tokens:,} validation tokens" if isinstance(tokens, int) else "the full split"

    if track.eval_max_docs is not None:
        if docs == track.eval_max_docs:
            return None
    elif docs is None and subset == track.eval_max_tokens:
        return None
    return (
        f"scored on {said(subset, docs)}; the track {track.name} scores "
        f"{said(track.eval_max_tokens, track.eval_max_docs)}"
    )


def get_track(name: str) -> Track:
    if name not in TRACKS:
        raise ConfigError(
            f"unknown track {name!r}{did_you_mean(name, TRACKS)}; known tracks: {', '.join(TRACKS)}"
        )
    return TRACKS[name]
