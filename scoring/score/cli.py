"""The scorer's command line: `python -m scoring score|unpack` (what the run's score phase and `pgolf
score` execute, in a fresh process). It imports the scorer (scoring/score/) and the artifact format,
nothing of the harness's records, benches or training code (tests/unit/test_import_closure.py).

    score    bits per byte of an artifact on a validation dataset (scoring/score/scorer.py)
    unpack   an artifact's tensors, dequantized, as safetensors
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from data.io import write_json_atomic
from scoring.artifact.pack import unpack_artifact
from scoring.score.evaluate import EVAL_DTYPES, EVAL_MODES, EvalConfig
from scoring.score.scorer import score_artifact


def cmd_score(args: argparse.Namespace) -> int:
    cfg = EvalConfig(
        mode=args.mode,
        seq_len=args.seq_len,
        batch_seqs=args.batch_seqs,
        max_tokens=args.max_tokens or None,
        dtype=args.dtype,
        stride=args.stride or None,
        adapt_chunk_tokens=args.adapt_chunk_tokens,
    )
    write_dirs = [Path(args.json_out).resolve().parent] if args.json_out else []
    record = score_artifact(
        args.artifact,
        args.submission,
        args.data,
        cfg,
        device=args.device,
        threads=args.threads,
        confine=not args.no_confine,
        write_dirs=write_dirs,
        protect=args.protect,
    )
    if args.json_out:
        write_json_atomic(args.json_out, record)
    if args.json:
        print(json.dumps(record, sort_keys=True))
    else:
        print(
            f"val_loss {record['val_loss']:.8f} nats/token  val_bpb {record['val_bpb']:.8f} bits/byte  "
            f"({record['val_tokens']:,} tokens, {record['val_bytes']:,} bytes, {record['eval_mode']}, "
            f"{record['eval_dtype']}, {record['eval_time_s']:.1f} s)"
        )
    return 0


def cmd_unpack(args: argparse.Namespace) -> int:
    state = unpack_artifact(args.artifact, args.out, args.submission)
    print(f"wrote {len(state)} tensors to {args.out}")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("score", help="score an artifact: bits per byte on the validation split")
    p.add_argument("artifact")
    p.add_argument(
        "--submission", required=True, help="the submission folder (its model.py builds the model)"
    )
    p.add_argument("--data", required=True, help="dataset folder with the validation shards")
    p.add_argument("--mode", default="standard", choices=EVAL_MODES)
    p.add_argument("--seq-len", type=int, default=1024)
    p.add_argument("--batch-seqs", type=int, default=32)
    p.add_argument(
        "--max-tokens", type=int, default=0, help="score only the first N validation tokens (0: all)"
    )
    p.add_argument("--dtype", default="float32", choices=EVAL_DTYPES)
    p.add_argument(
        "--stride",
        type=int,
        default=0,
        help="sliding/documents modes: targets per window (0: the mode's default)",
    )
    p.add_argument(
        "--adapt-chunk-tokens",
        type=int,
        default=EvalConfig().adapt_chunk_tokens,
        help="score-first adaptation (eval.py): targets scored before the hook sees them",
    )
    p.add_argument("--device", default="cpu")
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    p.add_argument(
        "--no-confine",
        action="store_true",
        help="do not restrict the scorer with Landlock before the model runs (recorded; see scoring/score/confine.py)",
    )
    p.add_argument(
        "--protect",
        action="append",
        default=[],
        metavar="PATH",
        help="another folder the model must not read (the dataset a view was made from); repeatable",
    )
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--json-out", help="also write the record to this file")
    p.set_defaults(func=cmd_score)

    p = sub.add_parser("unpack", help="decode an artifact to a safetensors file of the dequantized tensors")
    p.add_argument("artifact")
    p.add_argument("--out", required=True)
    p.add_argument("--submission", help="needed only for an artifact packed with the submission's own codec")
    p.set_defaults(func=cmd_unpack)


USER_ERRORS = (ValueError, FileNotFoundError, TypeError)


def run_command(args: argparse.Namespace) -> int:
    """Run a parsed command; user errors become one clear line and exit status 2."""
    try:
        return int(args.func(args) or 0)
    except USER_ERRORS as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m scoring", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    register(sub)
    args = parser.parse_args(argv)
    return run_command(args)


if __name__ == "__main__":
    raise SystemExit(main())
