"""`pgolf verify-legacy RECORD_DIR --artifact FILE`: score an entry of the reference challenge as it was made.

A reference entry is one training script (`train_gpt.py`) and the artifact its own serializer wrote.
This module is the command only; the parts live in scoring/:

- **the record-script reader** (scoring/worker/legacy_script.py): the script read as text here, in
  the scorer, never run: self-extracting scripts decoded as data, the Hyperparameters and GPT's
  arguments read statically (`--hparam NAME=VALUE` overrides a field or its environment variable),
  the record's own evaluation settings, and a one-line refusal for a script this machine cannot run
  (a missing CUDA-only module, newer Python syntax);
- **the model worker's legacy build mode** (scoring/worker/legacy.py): the record's imports and
  definitions (never its top level or main()) run in the confined worker, its artifact is
  decompressed, read with `torch.load(weights_only=True)` and dequantized with the reference's or
  the record's own numerics;
- **the scorer** (scoring/score/legacy.py over scoring/score/scorer.py's score_core, the one
  `pgolf score` and `pgolf verify` run): windows, the float64 loss over the byte table's bytes, the
  probes in fresh workers, the "pg-legacy-score" record. Bytes are the script file's as shipped (and
  the file beside it that a stub exec()s: all of a record's code counts) plus the artifact file's size.

Measured on records of openai/parameter-golf (bpb of verify-legacy against each record's own
eval_val, 19 records): docs/measurements/2026-12-02-verify-legacy.md, made by scripts/measure_legacy.py.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from data.io import write_json_atomic
from scoring.artifact.cap import ARTIFACT_CAP_BYTES
from scoring.score.eval_config import EVAL_DTYPES, EVAL_MODES, EvalConfig
from scoring.score.legacy import score_legacy
from scoring.worker.legacy import FALLBACKS
from scoring.worker.legacy_script import SCRIPT_NAME, eval_settings, find_script, read_hyperparameters


def cmd_verify_legacy(args: argparse.Namespace) -> int:
    overrides = {}
    for item in args.hparam:
        k, sep, v = item.partition("=")
        if not sep:
            raise ValueError(f"--hparam {item!r}: expected NAME=VALUE, e.g. --hparam NUM_LAYERS=10")
        overrides[k.strip()] = v.strip()
    settings = eval_settings(read_hyperparameters(find_script(Path(args.record), args.script), overrides))
    mode = args.mode or settings["mode"]
    cfg = EvalConfig(
        mode=mode,
        seq_len=args.seq_len or settings["seq_len"],
        batch_seqs=args.batch_seqs,
        max_tokens=args.max_tokens or None,
        dtype=args.dtype,
        stride=args.stride or (settings["stride"] if mode == "sliding" else None),
    )
    rec = score_legacy(
        args.record,
        args.artifact,
        args.data,
        cfg=cfg,
        hparams=overrides,
        script=args.script,
        device=args.device,
        cap_bytes=args.cap_bytes,
        fallbacks=tuple(args.fallback),
    )
    if args.json_out:
        write_json_atomic(args.json_out, rec)
    if args.json:
        print(json.dumps(rec, sort_keys=True))
        return 0
    print(
        f"legacy record {args.record}: val_loss {rec['val_loss']:.6f} nats/token  val_bpb {rec['val_bpb']:.6f} bits/byte "
        f"({rec['val_tokens']:,} tokens, {rec['eval_mode']}, seq_len {rec['eval_seq_len']})"
    )
    print(
        f"  bytes_total {rec['bytes_total']:,} = script {rec['bytes_code']:,} + artifact {rec['bytes_model']:,} "
        f"(cap {rec['cap_bytes']:,}, within_cap {rec['within_cap']})"
    )
    for k, d in rec["claimed_minus_scored"].items():
        print(f"  claimed {k} {rec['claimed'][k]} vs scored {rec[k]:.6f} (claimed - scored = {d:+.6g})")
    print("  scored in a confined model worker; probes passed in fresh workers")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "verify-legacy",
        help="score a reference-format record (its training script + the artifact its serializer wrote) with the trusted scorer",
    )
    p.add_argument(
        "record", help="the record folder (train_gpt.py, optional submission.json with the claimed numbers)"
    )
    p.add_argument(
        "--artifact",
        required=True,
        help="the artifact the record's serializer wrote (e.g. final_model.int8.ptz)",
    )
    p.add_argument(
        "--data", required=True, help="dataset folder with the validation shards and the tokenizer"
    )
    p.add_argument("--script", help=f"the training script's name (default: {SCRIPT_NAME})")
    p.add_argument(
        "--hparam",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a Hyperparameters value the run set by env var",
    )
    p.add_argument(
        "--mode",
        default="",
        choices=("", *EVAL_MODES),
        help="default: the script's own (sliding if it sets eval_stride)",
    )
    p.add_argument(
        "--seq-len", type=int, default=0, help="window length (0: the script's eval_seq_len or train_seq_len)"
    )
    p.add_argument("--stride", type=int, default=0)
    p.add_argument("--batch-seqs", type=int, default=32)
    p.add_argument(
        "--max-tokens", type=int, default=0, help="score only the first N validation tokens (0: all)"
    )
    p.add_argument("--dtype", default="float32", choices=EVAL_DTYPES)
    p.add_argument("--device", default="cpu")
    p.add_argument("--cap-bytes", type=int, default=ARTIFACT_CAP_BYTES)
    p.add_argument(
        "--fallback",
        action="append",
        default=[],
        choices=sorted(FALLBACKS),
        help="run a record that needs this CUDA-only module with a PyTorch stand-in (recorded)",
    )
    p.add_argument("--json", action="store_true")
    p.add_argument("--json-out", help="also write the record to this file")
    p.set_defaults(func=cmd_verify_legacy)
