"""`pgolf data ...` commands: build (documents → dataset), and the data family's other verbs.

Each command module exposes `register(subparsers)`; harness/cli.py mounts them under `pgolf data`.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from data.build import DEFAULT_SHARD_TOKENS, build_dataset, read_jsonl_texts


def cmd_build(args: argparse.Namespace) -> int:
    texts = read_jsonl_texts(args.docs, field=args.field)
    if args.max_docs:
        texts = texts[: args.max_docs]
    out = build_dataset(
        texts,
        args.out,
        val_docs=args.val_docs,
        tokenizer=args.tokenizer,
        vocab_size=args.vocab_size,
        shard_tokens=args.shard_tokens,
        source={"kind": "jsonl", "path": str(Path(args.docs).resolve()), "field": args.field},
    )
    print(f"dataset written to {out}")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("build", help="tokenize documents into shards + manifest")
    p.add_argument("--docs", required=True, help="documents: a .jsonl file with a text field")
    p.add_argument("--field", default="text", help="JSON field holding the text (default: text)")
    tok = p.add_mutually_exclusive_group(required=True)
    tok.add_argument("--tokenizer", help="a SentencePiece .model file, or 'byte260'")
    tok.add_argument("--vocab-size", type=int, help="train a SentencePiece BPE of this size (reference settings)")
    p.add_argument("--val-docs", type=int, required=True, help="the first N documents are validation")
    p.add_argument("--max-docs", type=int, default=0, help="use only the first N documents (0 = all)")
    p.add_argument("--shard-tokens", type=int, default=DEFAULT_SHARD_TOKENS, help="tokens per shard")
    p.add_argument("--out", required=True, help="output dataset folder")
    p.set_defaults(func=cmd_build)
