"""The scorer's command line: `python -m scoring score|unpack` (what the run's score phase, `pgolf verify`
and `pgolf score` execute, in a fresh process). It imports the scorer (scoring/score/) and the artifact
format, nothing of the harness's records, benches or training code (tests/unit/test_import_closure.py).

    score    bits per byte of an artifact on a validation dataset (scoring/score/scorer.py)
    unpack   an artifact's tensors, dequantized, as safetensors

`ScoreRequest` is the one definition of the scorer's command line: the harness builds it with
`to_argv()` (the run's score phase and verify alike), and this module parses it back. The verdict
travels as the exit status (EXIT_CODES) and the record's `status` field: a failed score still
writes its record (status, detail) to --json-out, never a bare traceback.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from data.io import write_json_atomic
from isolation.sandbox import KERNEL_LAYERS, SandboxRefused, parse_layers
from scoring.artifact.format import ArtifactError
from scoring.codecheck import CodeCheckFailure
from scoring.errors import exit_code_of
from scoring.score.eval_config import EVAL_DTYPES, EVAL_MODES, EvalConfig
from scoring.score.evaluate import RuleViolation
from scoring.score.probes import ProbeConfig
from scoring.score.record import ScoreFailure, cause_line
from scoring.score.remote import EvalDeadline, WorkerFailure
from scoring.score.scorer import DeviceUnavailable, score_artifact
from scoring.statuses import ERROR, ILLEGAL, OK, OUT_OF_MEMORY, OVER_EVAL_BUDGET
from scoring.worker.decode import unpack_artifact
from scoring.worker.wire import BadAnswer

EXIT_CODES: dict[str, int] = {OK: 0, ERROR: 1, ILLEGAL: 3, OVER_EVAL_BUDGET: 4, OUT_OF_MEMORY: 5}
"""The scorer's exit status per verdict (2 is a usage error: bad arguments or inputs)."""
STATUS_OF_EXIT: dict[int, str] = {v: k for k, v in EXIT_CODES.items()}
SANDBOX_MODES = ("auto", "required", "off")
OUTPUT_TRACEBACK_CHARS = 20_000


@dataclass(frozen=True, kw_only=True)
class ScoreRequest:
    """Everything the scorer process is told (its argv); see `to_argv` / `from_args`."""

    artifact: Path
    code_dir: Path
    """The staged scored code (the submission folder without train.py)."""
    data_dir: Path
    """A dataset folder holding the validation split (a view made after training)."""
    eval: EvalConfig
    device: str = "cpu"
    threads: int = 0
    sandbox: str = "auto"
    """The model workers' sandbox: auto, required (refuse unless every isolation layer holds), off."""
    confine: bool = True
    """Also confine the scorer itself once it has read the data."""
    protect: tuple[Path, ...] = ()
    """More folders no worker and (once confined) not the scorer may read: the dataset a view was made from."""
    private: tuple[Path, ...] = ()
    """Folders out of the workers' broad read rules (the folder of the run whose artifact this is: the other runs)."""
    eval_budget_s: float = math.inf
    """Past this (the track's eval budget + grace) the worker is killed: over_eval_budget."""
    probes: int = ProbeConfig().probes
    memory_limit_bytes: int = -1
    """The worker's address-space limit on CPU; -1: three quarters of the machine's memory; 0: none."""
    allow_missing_layers: tuple[str, ...] = ()
    """Isolation layers an official accepts as missing under sandbox 'required' (recorded in score.json)."""
    json_out: Path | None = None
    scoring_workers: int = 1
    """Model workers the windows are sharded over (on CUDA one per device, cuda:0 .. cuda:K-1)."""

    def to_argv(self) -> list[str]:
        e = self.eval
        argv = [
            "score", str(self.artifact), "--submission", str(self.code_dir), "--data", str(self.data_dir),
            "--mode", e.mode, "--seq-len", str(e.seq_len), "--batch-seqs", str(e.batch_seqs),
            "--max-tokens", str(e.max_tokens or 0), "--max-docs", str(e.max_docs or 0), "--dtype", e.dtype, "--stride", str(e.stride or 0),
            "--adapt-chunk-tokens", str(e.adapt_chunk_tokens), "--device", self.device,
            "--threads", str(self.threads), "--sandbox", self.sandbox, "--eval-budget-s", repr(self.eval_budget_s),
            "--probes", str(self.probes), "--memory-limit-bytes", str(self.memory_limit_bytes),
            "--scoring-workers", str(self.scoring_workers),
        ]  # fmt: skip
        if not self.confine:
            argv.append("--no-confine")
        for p in self.protect:
            argv += ["--protect", str(p)]
        for p in self.private:
            argv += ["--private", str(p)]
        for layer in self.allow_missing_layers:
            argv += ["--allow-missing-layer", layer]
        if self.json_out is not None:
            argv += ["--json-out", str(self.json_out)]
        return argv

    @staticmethod
    def from_args(args: argparse.Namespace) -> ScoreRequest:
        cfg = EvalConfig(
            mode=args.mode,
            seq_len=args.seq_len,
            batch_seqs=args.batch_seqs,
            max_tokens=args.max_tokens or None,
            max_docs=args.max_docs or None,
            dtype=args.dtype,
            stride=args.stride or None,
            adapt_chunk_tokens=args.adapt_chunk_tokens,
        )
        # every path absolute: the model workers run in folders of their own (a relative artifact failed there)
        return ScoreRequest(
            artifact=Path(args.artifact).absolute(),
            code_dir=Path(args.submission).absolute(),
            data_dir=Path(args.data).absolute(),
            eval=cfg,
            device=args.device,
            threads=args.threads,
            sandbox="off" if args.no_confine else args.sandbox,
            confine=not args.no_confine,
            protect=tuple(Path(p).absolute() for p in args.protect),
            private=tuple(Path(p).absolute() for p in args.private),
            eval_budget_s=float(args.eval_budget_s),
            probes=args.probes,
            memory_limit_bytes=args.memory_limit_bytes,
            allow_missing_layers=parse_layers(args.allow_missing_layer, "--allow-missing-layer"),
            json_out=Path(args.json_out).absolute() if args.json_out else None,
            scoring_workers=args.scoring_workers,
        )


def verdict_of(exc: BaseException) -> str:
    """The status a failed score gets: illegal (a broken rule), over_eval_budget, out_of_memory, or error."""
    if isinstance(exc, RuleViolation | CodeCheckFailure):
        return ILLEGAL
    if isinstance(exc, EvalDeadline):
        return OVER_EVAL_BUDGET
    if isinstance(exc, WorkerFailure):
        return exc.kind
    if isinstance(exc, MemoryError):
        return OUT_OF_MEMORY
    return ERROR


def origin_of(exc: BaseException) -> str:
    """Who a failure is on (scoring/score/record.py FAILURE_ORIGINS): the submission when its worker failed or
    a rule was broken, the input when the scorer refused what it was given, else the scorer itself."""
    if isinstance(exc, RuleViolation | CodeCheckFailure | EvalDeadline | WorkerFailure | BadAnswer):
        return "submission"
    if isinstance(exc, FileNotFoundError | ArtifactError | SandboxRefused | DeviceUnavailable):
        return "input"
    return "scorer"


def failure_record(status: str, exc: BaseException) -> dict[str, Any]:
    """The record of a failed score: one line naming the cause (the worker's message or the traceback's last
    line, with where the scorer's own failure happened); the whole traceback goes to stderr (the score log)."""
    origin = origin_of(exc)
    detail = cause_line(str(exc)) or type(exc).__name__
    if origin == "scorer":
        where = traceback.extract_tb(exc.__traceback__)[-1:] if exc.__traceback__ else []
        at = f" at {Path(where[0].filename).name}:{where[0].lineno}" if where else ""
        detail = cause_line(f"the scorer failed ({type(exc).__name__}{at}): {exc}")
    print("".join(traceback.format_exception(exc))[-OUTPUT_TRACEBACK_CHARS:], file=sys.stderr, flush=True)
    return ScoreFailure(status=status, detail=detail, origin=origin).to_json()


def cmd_score(args: argparse.Namespace) -> int:
    req = ScoreRequest.from_args(args)
    if req.json_out is not None:  # a new folder is made now, before the scorer confines itself to it
        req.json_out.resolve().parent.mkdir(parents=True, exist_ok=True)
    write_dirs = [req.json_out.resolve().parent] if req.json_out else []
    try:
        record = score_artifact(
            req.artifact,
            req.code_dir,
            req.data_dir,
            req.eval,
            device=req.device,
            threads=req.threads,
            sandbox=req.sandbox,
            confine=req.confine,
            write_dirs=write_dirs,
            protect=req.protect,
            private=req.private,
            eval_budget_s=req.eval_budget_s,
            probe_cfg=ProbeConfig(probes=req.probes),
            memory_limit_bytes=None if req.memory_limit_bytes < 0 else req.memory_limit_bytes,
            allow_missing_layers=req.allow_missing_layers,
            scoring_workers=req.scoring_workers,
        )
    except (
        FileNotFoundError,
        ArtifactError,
        SandboxRefused,
        DeviceUnavailable,
    ) as e:  # bad input: one line, exit 2 (and a record)
        if req.json_out:
            write_json_atomic(req.json_out, failure_record(ERROR, e))
        raise ValueError(str(e)) from e
    except Exception as e:  # noqa: BLE001 - the verdict boundary: every failure ends in a record and a status
        status = verdict_of(e)
        failure = failure_record(status, e)
        if req.json_out:
            write_json_atomic(req.json_out, failure)
        print(f"score {status}: {failure['detail']}", file=sys.stderr)
        return EXIT_CODES[status]
    if req.json_out:
        write_json_atomic(req.json_out, record)
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
    d = EvalConfig()
    p = sub.add_parser("score", help="score an artifact: bits per byte on the validation split")
    p.add_argument("artifact")
    p.add_argument(
        "--submission", required=True, help="the submission's scored code (model.py builds the model)"
    )
    p.add_argument("--data", required=True, help="dataset folder with the validation shards")
    p.add_argument("--mode", default=d.mode, choices=EVAL_MODES)
    p.add_argument("--seq-len", type=int, default=d.seq_len)
    p.add_argument("--batch-seqs", type=int, default=d.batch_seqs)
    p.add_argument(
        "--max-tokens", type=int, default=0, help="score only the first N validation tokens (0: all)"
    )
    p.add_argument(
        "--max-docs",
        type=int,
        default=0,
        help="score only the first N validation documents, each to its end (0: all; the CPU record track's subset)",
    )
    p.add_argument("--dtype", default=d.dtype, choices=EVAL_DTYPES)
    p.add_argument(
        "--stride",
        type=int,
        default=0,
        help="sliding/documents modes: targets per window (0: the mode's default)",
    )
    p.add_argument(
        "--adapt-chunk-tokens",
        type=int,
        default=d.adapt_chunk_tokens,
        help="score-first adaptation (eval.py): targets scored before the hook sees them",
    )
    p.add_argument("--device", default="cpu")
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    p.add_argument(
        "--sandbox",
        default="auto",
        choices=SANDBOX_MODES,
        help="the model worker's sandbox: every layer the machine offers, required (refuse unless every layer holds), or off",
    )
    p.add_argument(
        "--no-confine",
        action="store_true",
        help="run the model worker unsandboxed and do not confine the scorer (recorded; for debugging)",
    )
    p.add_argument(
        "--protect",
        action="append",
        default=[],
        metavar="PATH",
        help="another folder the model must not read (the dataset a view was made from); repeatable",
    )
    p.add_argument(
        "--private",
        action="append",
        default=[],
        metavar="PATH",
        help="a folder out of the model's broad read rules (the runs beside this artifact's); repeatable",
    )
    p.add_argument(
        "--allow-missing-layer",
        action="append",
        default=[],
        metavar="LAYER",
        help="an official's decision: under --sandbox required, accept that this machine lacks LAYER "
        f"({', '.join(KERNEL_LAYERS)}); recorded in score.json; repeatable",
    )
    p.add_argument(
        "--eval-budget-s",
        type=float,
        default=math.inf,
        help="kill the model worker past this (over_eval_budget)",
    )
    p.add_argument("--probes", type=int, default=ProbeConfig().probes, help="probe batches (fresh workers)")
    p.add_argument(
        "--scoring-workers",
        type=int,
        default=1,
        help="model workers the windows are sharded over (CUDA: one per device, cuda:0 .. K-1); same bits",
    )
    p.add_argument(
        "--memory-limit-bytes",
        type=int,
        default=-1,
        help="the model worker's memory limit on CPU (-1: 3/4 of the machine, 0: none)",
    )
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument(
        "--json-out", help="also write the record to this file (a failed score writes its verdict)"
    )
    p.set_defaults(func=cmd_score)

    p = sub.add_parser("unpack", help="decode an artifact to a safetensors file of the dequantized tensors")
    p.add_argument("artifact")
    p.add_argument("--out", required=True)
    p.add_argument("--submission", help="needed only for an artifact packed with the submission's own codec")
    p.set_defaults(func=cmd_unpack)


def run_command(args: argparse.Namespace) -> int:
    """Run a parsed command; a user error (scoring/errors.py exit_code_of) becomes one clear line and its exit
    status (2); anything else is a bug and keeps its traceback."""
    try:
        return int(args.func(args) or 0)
    except Exception as e:
        code = exit_code_of(e)
        if code is None:
            raise
        print(f"error: {e}", file=sys.stderr)
        return code


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m scoring", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    register(sub)
    args = parser.parse_args(argv)
    return run_command(args)
