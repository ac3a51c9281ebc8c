"""`pgolf data ...`: build, download and verify datasets.

    pgolf data build --docs FILE|DIR (--tokenizer MODEL|byte260 | --vocab-size N) --out DIR [--val-docs 50000]
    pgolf data build --hf-dataset HuggingFaceFW/fineweb --hf-config sample-10BT --max-docs N ... --out DIR
    pgolf data download --variant sp1024 [--train-shards N] [--repo ID] [--revision REV] [--out DIR]
    pgolf data verify DIR [--quick] [--against-docs VAL.jsonl [--ngram-threshold 0.25] [--ngram-sample 8]]
    pgolf data verify DIR --transform FILE.py       (a dataset built with a submitted transform: its file)
    pgolf data verify SHARDS_DIR --tokenizer MODEL --against-docs VAL.jsonl     (a folder without a manifest)

`register(subparsers)` adds the commands; harness/cli.py mounts them under `pgolf data`. The same
commands run without the harness as `python -m data.cli ...`. Exit status: 0 on success, 1 when a
download or a verification fails, 2 on a user error (a one-line message naming the input).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import Any

from data.build import DEFAULT_SHARD_TOKENS, DEFAULT_VAL_DOCS, build_dataset, prove_dataset, summarize
from data.download import DEFAULT_REPO_ID, DownloadError, download_variant
from data.overlap import DEFAULT_SAMPLE, DEFAULT_THRESHOLD
from data.proof import CANONICALS, TRANSFORMS
from data.sources import DEFAULT_HF_CONFIG, DocumentSource, source_from_path
from data.verify import verify_dataset

USER_ERRORS = (ValueError, FileNotFoundError, FileExistsError)


def printable(text: str) -> str:
    """An error's words for the terminal: control characters (escape sequences a hub or a file put in a name)
    shown as "?", never sent raw."""
    return "".join(c if c.isprintable() or c == "\n" else "?" for c in text)


TransformResolver = Callable[[str], Any]
"""FILE.py -> data/proof.py SplitTransforms (a submitted transform, run confined): harness/cli.py's."""
_RESOLVER: TransformResolver | None = None


def resolve_transform(value: str, resolver: TransformResolver | None = None) -> Any:
    """--transform: none -> None, a built-in name, or FILE.py through `resolver` (default: the one
    `register` was given)."""
    resolver = resolver or _RESOLVER
    if value == "none":
        return None
    if value in TRANSFORMS:
        return value
    if not value.endswith(".py"):
        raise ValueError(f"--transform {value!r}: expected none, {', '.join(TRANSFORMS)} or a FILE.py")
    if resolver is None:
        raise ValueError(
            f"--transform {value}: a submitted transform runs confined, which `python -m data.cli` cannot "
            "do; use `pgolf data build`"
        )
    return resolver(value)


def cmd_build(args: argparse.Namespace) -> int:
    if args.docs:
        src = source_from_path(args.docs, field=args.field, max_docs=args.max_docs or None)
    else:
        src = DocumentSource(
            kind="hf",
            path=args.hf_dataset,
            config=args.hf_config or None,
            split=args.hf_split,
            revision=args.hf_revision,
            field=args.field,
            max_docs=args.max_docs or None,
        )
    out = build_dataset(
        src,
        args.out,
        val_docs=args.val_docs,
        tokenizer=args.tokenizer,
        vocab_size=args.vocab_size,
        shard_tokens=args.shard_tokens,
        source=src.describe(),
        workers=args.workers,
        tokenizer_train_docs=args.tokenizer_train_docs,
        overwrite=args.overwrite,
        drop_val_duplicates=args.drop_val_duplicates,
        canonical=args.canonical,
        transform=resolve_transform(args.transform),
    )
    print(summarize(out))
    return 0


def cmd_prove(args: argparse.Namespace) -> int:
    src = source_from_path(args.docs, field=args.field)
    block = prove_dataset(
        args.dir,
        src,
        canonical=args.canonical,
        transform=resolve_transform(args.transform),
        workers=args.workers,
    )
    vb = block["val_bytes"]
    print(
        f"{args.dir}: proved {vb['docs']:,} validation documents ({vb['tokens']:,} tokens, {vb['total_bytes']:,} "
        f"canonical bytes, canonical {block['text']}); wrote {vb['file']} and the manifest's canonical block"
    )
    return 0


def cmd_download(args: argparse.Namespace) -> int:
    try:
        out = download_variant(
            args.variant,
            args.out,
            train_shards=args.train_shards,
            repo_id=args.repo,
            revision=args.revision,
            endpoint=args.endpoint,
        )
    except DownloadError as e:
        print(f"error: {printable(str(e))}", file=sys.stderr)
        return 1
    print(summarize(out))
    return 0


def cmd_verify(args: argparse.Namespace) -> int:
    report = verify_dataset(
        args.dir,
        quick=args.quick,
        against_docs=args.against_docs,
        ngram_threshold=args.ngram_threshold,
        ngram_sample=args.ngram_sample,
        workers=args.workers,
        tokenizer=args.tokenizer,
        transform=args.transform,
    )
    print(report.table())
    return 0 if report.ok else 1


def register(sub: argparse._SubParsersAction, resolver: TransformResolver | None = None) -> None:
    """Add the commands; `resolver` runs a --transform FILE.py confined (harness/cli.py gives one)."""
    global _RESOLVER
    _RESOLVER = resolver
    p = sub.add_parser(
        "prove",
        help="prove a dataset built elsewhere (the official shards) against its validation documents, and "
        "write the canonical byte counts bpb divides by",
    )
    p.add_argument("dir", help="the dataset folder (its manifest.json)")
    p.add_argument(
        "--docs", required=True, help="the documents, in order (the validation ones first): .jsonl etc."
    )
    p.add_argument("--field", default="text", help="field / column holding the text (default: text)")
    p.add_argument("--canonical", choices=("auto", *CANONICALS), default="auto", help="as for build")
    p.add_argument(
        "--transform",
        default="none",
        metavar="none|" + "|".join(TRANSFORMS) + "|FILE.py",
        help="as for build",
    )
    p.add_argument("--workers", type=int, default=None, help="tokenizing processes (default: all cores)")
    p.set_defaults(func=cmd_prove)

    p = sub.add_parser("build", help="tokenize documents into shards + manifest")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--docs", help="a .jsonl, .parquet or .txt file, or a folder of .parquet / .txt files")
    src.add_argument("--hf-dataset", help="stream a hub dataset with `datasets`, e.g. HuggingFaceFW/fineweb")
    p.add_argument(
        "--hf-config",
        default=DEFAULT_HF_CONFIG,
        help=f"hub dataset configuration (default {DEFAULT_HF_CONFIG})",
    )
    p.add_argument("--hf-split", default="train", help="hub dataset split (default train)")
    p.add_argument("--hf-revision", help="hub dataset commit or tag (pin it for a reproducible selection)")
    p.add_argument("--field", default="text", help="field / column holding the text (default: text)")
    tok = p.add_mutually_exclusive_group(required=True)
    tok.add_argument("--tokenizer", help="a SentencePiece .model file, or 'byte260'")
    tok.add_argument(
        "--vocab-size", type=int, help="train a SentencePiece BPE of this size (reference settings)"
    )
    p.add_argument(
        "--tokenizer-train-docs", type=int, help="train the tokenizer on at most N training documents"
    )
    p.add_argument(
        "--canonical",
        choices=("auto", *CANONICALS),
        default="auto",
        help="the text every document is tokenized from, and must decode back to, and whose bytes bpb counts: "
        "sp1024 (as the official sp1024 normalises it; the record tracks' text), raw (as given); auto: sp1024 "
        "for a tokenizer that normalises as sp1024 does, else raw",
    )
    p.add_argument(
        "--transform",
        default="none",
        metavar="none|" + "|".join(TRANSFORMS) + "|FILE.py",
        help="a reversible text transform, part of the tokenizer (case: CaseOps-style case markers; FILE.py: "
        "a submitted transform.py, run confined, one child per split, docs/RULES.md); with "
        "--vocab-size the tokenizer is trained on the transformed text with the markers as pieces",
    )
    p.add_argument(
        "--val-docs",
        type=int,
        default=DEFAULT_VAL_DOCS,
        help=f"the first N documents are validation (default {DEFAULT_VAL_DOCS:,})",
    )
    p.add_argument("--max-docs", type=int, default=0, help="use only the first N documents (0 = all)")
    p.add_argument(
        "--shard-tokens",
        type=int,
        default=DEFAULT_SHARD_TOKENS,
        help=f"tokens per shard (default {DEFAULT_SHARD_TOKENS:,})",
    )
    p.add_argument("--workers", type=int, help="tokenizer processes (default: all cores)")
    p.add_argument("--out", required=True, help="output dataset folder")
    p.add_argument("--overwrite", action="store_true", help="replace a dataset already in --out")
    p.add_argument(
        "--drop-val-duplicates",
        action="store_true",
        help="leave out (and count in the manifest) every training document that copies a validation "
        "document, instead of refusing the build (the default)",
    )
    p.set_defaults(func=cmd_build)

    p = sub.add_parser("download", help="fetch the official cached shards from the dataset hub")
    p.add_argument(
        "--variant",
        default="sp1024",
        help="sp1024 (default), sp4096, sp8192, byte260, ... as the repo has them",
    )
    p.add_argument("--train-shards", type=int, help="how many training shards (default: 80, or all if fewer)")
    p.add_argument("--repo", default=DEFAULT_REPO_ID, help=f"dataset repo (default {DEFAULT_REPO_ID})")
    p.add_argument("--revision", default="main", help="branch, tag or commit (default main)")
    p.add_argument("--out", help="destination folder (default $PG_DATA_DIR/fineweb10B_VARIANT)")
    p.add_argument("--endpoint", help="hub endpoint (default: $HF_ENDPOINT or huggingface.co)")
    p.set_defaults(func=cmd_download)

    p = sub.add_parser("verify", help="check a dataset folder against its manifest")
    p.add_argument("dir", help="dataset folder")
    p.add_argument(
        "--quick",
        action="store_true",
        help="headers, sizes and counts only; skip sha256, document counts and the disjointness check",
    )
    p.add_argument(
        "--against-docs",
        metavar="FILE",
        help="validation documents as text (.jsonl, .parquet, .txt): report training documents equal to one "
        "after normalisation or holding more than --ngram-threshold of its 25-character windows",
    )
    p.add_argument(
        "--ngram-threshold",
        type=float,
        default=DEFAULT_THRESHOLD,
        help=f"fraction of a validation document's windows a training document must hold to be reported "
        f"(default {DEFAULT_THRESHOLD})",
    )
    p.add_argument(
        "--ngram-sample",
        type=int,
        default=DEFAULT_SAMPLE,
        help=f"keep one window in N, chosen by hash (default {DEFAULT_SAMPLE}; 1 keeps all)",
    )
    p.add_argument("--workers", type=int, help="processes decoding shards (default: all cores)")
    p.add_argument(
        "--tokenizer",
        help="for a folder of shards without manifest.json (an entry's own): the tokenizer (.model or "
        "byte260.json) they were made with; headers and disjointness are checked",
    )
    p.add_argument(
        "--transform",
        metavar="FILE.py",
        help="the submitted transform.py the dataset was built with: its sha256 against the manifest's (hashed, "
        "never run)",
    )
    p.set_defaults(func=cmd_verify)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m data.cli", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    register(parser.add_subparsers(dest="data_command", required=True, metavar="COMMAND"))
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except USER_ERRORS as e:
        print(f"error: {printable(str(e))}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
