"""A dataset against the submission that would train on it: what `pgolf run` refuses before anything
starts, and what `pgolf check DIR --data DATA` prints (harness/commands/preflight.py).

- vocabulary: a model whose [model] vocab_size is below the dataset's tokenizer's cannot embed every
  token (a rank fails at its first batch, "torchrun exited with status 1", the cause only in
  train.log): refused. One above it trains and scores, with output rows no target ever selects: warned.
- variant: the data_variant submission.json declares (sp1024, byte260, ...) against the dataset's
  vocabulary: warned (the run's record names the data it trained on).
- track: a record track trains and scores on the official dataset only (the embedded corpus and other
  tokenizers are `invalid_data`, official_data_problem below): refused by check, a
  verdict with a result by run.
"""

from __future__ import annotations

import json
from typing import Any

from data.canonical import canonical_entry
from data.manifest import Manifest
from scoring.tracks import Track, dataset_problem

REFUSE, WARN = "refuse", "warn"


def data_identity(manifest: Manifest) -> dict[str, Any]:
    """What the result records of the dataset: its tokenizer, its documents, its canonical text, whether it is
    the embedded corpus."""
    tok = manifest.raw.get("tokenizer") or {}
    source = manifest.raw.get("source") or {}
    canonical = canonical_entry(manifest.raw)
    return {
        "tokenizer_sha256": tok.get("sha256"),
        "selection_sha256": manifest.raw.get("selection_sha256"),
        "embedded_corpus": isinstance(source, dict) and "embedded" in json.dumps(source).lower(),
        "val_docs": (manifest.raw.get("docs") or {}).get("val"),
        "val_tokens": manifest.split_tokens("val"),
        "val_text_sha256": (manifest.raw.get("split_sha256") or {}).get("val"),
        "canonical": None if canonical is None else canonical.get("text"),
        "transform": None if canonical is None else canonical.get("transform"),
        "val_only_pieces": (manifest.raw.get("pieces") or {}).get("val_only"),
        "piece_order": tok.get("piece_order"),
    }


def official_data_problem(track: Track, identity: dict[str, Any]) -> str | None:
    """On a record track the dataset must be the track's documents (scoring/tracks.py dataset_problem), built
    and proved by the harness, and not the embedded corpus (whose validation text any process can rebuild from
    the Python installation). Any tokenizer the build proved may be scored."""
    if not track.record or track.documents is None:
        return None
    if identity["embedded_corpus"]:
        return (
            f"track {track.name} is a record track: the embedded corpus cannot be scored on it (its validation text "
            "ships with Python). HINT: pgolf data download, then --data DIR; or run on the smoke track"
        )
    problem = dataset_problem(track.documents, identity)
    if problem is None:
        return None
    return (
        f"track {track.name} is a record track: {problem}. HINT: on other documents, run unranked: "
        "--set run.track='non_record_16mb'"
    )


def _variant_vocab(variant: str) -> int | None:
    if variant == "byte260":
        return 260
    digits = variant.removeprefix("sp")
    return int(digits) if variant.startswith("sp") and digits.isdigit() else None


def dataset_findings(
    model_config: dict[str, Any], variant: str | None, track: Track | None, manifest: Manifest
) -> list[tuple[str, str, str]]:
    """(what, level, text) for each way the dataset does not fit: level REFUSE or WARN; [] when it fits.
    `variant` None: the declared variant is not judged; `track` None: the track's rule is not."""
    found: list[tuple[str, str, str]] = []
    data_vocab = manifest.vocab_size
    where = manifest.root
    model_vocab = model_config.get("vocab_size")
    if isinstance(model_vocab, int) and not isinstance(model_vocab, bool):
        if model_vocab < data_vocab:
            found.append(
                (
                    "vocabulary",
                    REFUSE,
                    f"the dataset {where} has a vocabulary of {data_vocab} tokens but the model's vocab_size is "
                    f"{model_vocab}: tokens {model_vocab}..{data_vocab - 1} cannot be embedded. HINT: --data a "
                    f"dataset of {model_vocab} tokens, or --set model.vocab_size={data_vocab}",
                )
            )
        elif model_vocab > data_vocab:
            found.append(
                (
                    "vocabulary",
                    WARN,
                    f"the model's vocab_size {model_vocab} is above the dataset's {data_vocab}: "
                    f"{model_vocab - data_vocab} output rows are never a target (another variant's dataset?)",
                )
            )
    expected = _variant_vocab(variant) if variant else None
    if expected is not None and expected != data_vocab:
        found.append(
            (
                "variant",
                WARN,
                f"submission.json declares data_variant {variant!r} ({expected} tokens), the dataset has "
                f"{data_vocab}",
            )
        )
    problem = official_data_problem(track, data_identity(manifest)) if track is not None else None
    if problem:
        found.append(("track", REFUSE, problem))
    return found


def refuse_mismatched_data(model_config: dict[str, Any], manifest: Manifest) -> list[str]:
    """ValueError (one line) when the model cannot train on the dataset's tokens; the warnings otherwise.
    The track's verdict on the data (invalid_data) is the run's to record, so it is not raised here."""
    findings = dataset_findings(model_config, None, None, manifest)
    for what, level, text in findings:
        if level == REFUSE:
            raise ValueError(f"--data refused ({what}): {text}")
    return [text for _, level, text in findings if level == WARN]
