"""`pgolf`: the one command line of the harness.

    pgolf run SUBMISSION_DIR [--preset NAME] [--seed N] [--data DIR] [--out RUN_DIR] [--set SECTION.KEY=VALUE ...]
              [--nproc N] [--nnodes M --rdzv-endpoint HOST:PORT] [--wandb disabled|offline|online]
    pgolf pack STATE.safetensors --submission DIR --out ARTIFACT [--codec int8_zlib] [--preset NAME]
    pgolf unpack ARTIFACT --out STATE.safetensors
    pgolf score ARTIFACT --submission DIR --data DIR [--json]      the sealed scorer (scoring/score/cli.py)
    pgolf verify | verify-legacy | compare | leaderboard | audit-tokenizer    records (harness/records/)
    pgolf data build|...      datasets (data/cli.py)
    pgolf sample ARTIFACT --submission DIR [--prompt TEXT]   generate text with a packed model
    pgolf generate ARTIFACT --submission DIR --prompt TEXT [--speculative]   KV cache, drafting with MTP heads
    pgolf new NAME [--from BASELINE] | check DIR [--preset P]   scaffold an entry; pre-flight it (harness/commands/)
    pgolf tune SUBMISSION [--preset P] [--write-preset NAME]   CPU settings by measurement (harness/commands/tune.py)
    pgolf bench ...           benchmarks that print figures (harness/bench/, data/bench.py)

Each command lives in the module named in COMMANDS and is imported only when it runs (a plain
`pgolf score` loads the scorer and nothing of the records or training code); `pgolf --help` and
`pgolf --version` import none (SUMMARIES), `pgolf COMMAND --help` that command's module alone.
The flag set is closed: tests/unit/harness/test_cli.py lists every command and flag, so adding one is a
deliberate change. User errors print one line naming the input and a fix, and exit with status 2.
"""

from __future__ import annotations

import argparse
import difflib
import faulthandler
import importlib
import json
import signal
import sys
import threading
from pathlib import Path

COMMANDS: dict[str, str] = {
    "run": "harness.cli",
    "pack": "harness.cli",
    "score": "scoring.score.cli",
    "unpack": "scoring.score.cli",
    "audit-tokenizer": "scoring.score.audit",
    "verify": "harness.records.verify_cli",
    "verify-legacy": "harness.records.legacy",
    "compare": "harness.records.compare",
    "leaderboard": "harness.records.leaderboard",
    "reproduce": "harness.records.reproduce",
    "queue": "harness.records.queue",
    "chain": "harness.records.chain",
    "sample": "harness.commands.generate",
    "generate": "harness.commands.generate",
    "tune": "harness.commands.tune",
    "new": "harness.commands.scaffold",
    "check": "harness.commands.preflight",
    "data": "data.cli",
    "bench": "harness.bench",
}
"""Command -> the module whose `register(sub)` adds it (imported lazily)."""
SUMMARIES: dict[str, str] = {
    "run": "train, pack, score and report a submission",
    "pack": "quantize + compress a state into an artifact; enforce the cap",
    "score": "score an artifact: bits per byte on the validation split",
    "unpack": "decode an artifact to a safetensors file of the dequantized tensors",
    "audit-tokenizer": "prove that decoding gives back the canonical text and the byte table counts its bytes",
    "verify": "recompute a result's hashes and re-score its artifact in a fresh process",
    "verify-legacy": "score a reference-format record with the trusted scorer",
    "compare": "one-sided Welch test: does NEW beat OLD by the track's margin at its p-value?",
    "leaderboard": "build the leaderboard (markdown, JSON, HTML page) from the results ledger",
    "reproduce": "re-train an entry from its folder and test its claimed scores",
    "queue": "triage a folder of entries, then reproduce each as jobs (local or Slurm)",
    "chain": "records accepted in submission order, with why for every entry",
    "sample": "generate text from a packed model (what was scored)",
    "generate": "generate with a packed model on CPU: KV cache, speculative drafting",
    "tune": "measure the CPU settings that matter for a preset; write the ones that help",
    "new": "write a new submission folder from a baseline (runs as it is)",
    "check": "pre-flight a submission folder in seconds: schema, config, folder, lint, model shape, bytes",
    "data": "datasets: build, download, verify",
    "bench": "benchmarks that print figures",
}
"""`pgolf --help`'s one line per command, without importing any command's module (torch and scipy take
5-13 s to import on a busy 2-core machine); `pgolf COMMAND --help` prints the module's own."""

EXIT_INTERRUPTED = 130
"""The exit status after Ctrl-C (128 + SIGINT, as a shell reports it)."""


def cmd_run(args: argparse.Namespace) -> int:
    from harness.config import validate_run
    from scoring.statuses import Status

    launch = [
        f"launch.{key}={value!r}"
        for key, value in (
            ("nproc_per_node", args.nproc),
            ("nnodes", args.nnodes),
            ("rdzv_endpoint", args.rdzv_endpoint),
            ("allow_missing_layers", ",".join(args.allow_missing_layer) or None),
        )
        if value is not None
    ]
    overrides = [*launch, *([f"log.wandb={args.wandb!r}"] if args.wandb else []), *args.set]
    # the folder, submission.json and every config value first, before torch and the pipeline load: a typo
    # is refused in well under a second (run_pipeline checks them again, at no cost)
    validate_run(Path(args.submission).resolve(), args.preset, overrides, seed=args.seed)
    from harness.run.pipeline import run_pipeline

    result = run_pipeline(
        args.submission,
        preset=args.preset,
        seed=args.seed,
        data_dir=args.data,
        out_dir=args.out,
        overrides=overrides,
        ledger=args.ledger,
    )
    if result["status"] == Status.INTERRUPTED:  # 128 + the signal: 130 Ctrl-C, 143 SIGTERM
        return 128 + int(
            result.get("phases", {}).get("interrupted", {}).get("signal", EXIT_INTERRUPTED - 128)
        )
    return 0 if result["status"] == Status.OK else 1


def cmd_pack(args: argparse.Namespace) -> int:
    from data.io import write_json_atomic
    from harness.config import load_config
    from harness.run.launch import CODEC_CLOCK_MARKER
    from scoring.artifact.cap import ArtifactTooLarge
    from scoring.artifact.pack import model_config_of, pack_state, read_state

    state, meta = read_state(args.state)
    model_config = model_config_of(meta)
    if model_config is None:
        model_config = load_config(args.submission, args.preset).model
    if args.codec == "submission":  # from here on submitted code runs in this process: the clock's start
        sys.stdout.buffer.write(CODEC_CLOCK_MARKER + b"\n")
        sys.stdout.flush()
    record = pack_state(
        state,
        args.submission,
        args.out,
        codec_name=args.codec,
        model_config=model_config,
        cap_bytes=args.cap_bytes,
    )
    if args.json_out:
        write_json_atomic(args.json_out, record)
    print(
        json.dumps(
            {k: record[k] for k in ("bytes_code", "bytes_model", "bytes_total", "cap_bytes", "within_cap")}
        )
    )
    if not record["within_cap"]:
        raise ArtifactTooLarge(record["bytes_code"], record["bytes_model"], record["cap_bytes"])
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    """`run` and `pack` (the commands this module implements)."""
    from harness.config import WANDB_MODES
    from scoring.artifact.cap import ARTIFACT_CAP_BYTES

    p = sub.add_parser("run", help="train, pack, score and report a submission")
    p.add_argument("submission", help="submission (or baseline) folder")
    p.add_argument("--preset", help="named preset of the folder's config.toml")
    p.add_argument("--seed", type=int, help="overrides run.seed")
    p.add_argument("--data", help="dataset folder (default: the embedded corpus, built on first use)")
    p.add_argument("--out", help="run folder (default: runs/NAME-PRESET-TIMESTAMP)")
    p.add_argument(
        "--nproc", type=int, help="ranks per node: GPUs per node, or CPU processes (launch.nproc_per_node)"
    )
    p.add_argument("--nnodes", type=int, help="nodes, each running this same command (launch.nnodes)")
    p.add_argument(
        "--rdzv-endpoint",
        help="HOST:PORT of torchrun's c10d rendezvous, for several nodes (launch.rdzv_endpoint)",
    )
    p.add_argument(
        "--set", action="append", default=[], metavar="SECTION.KEY=VALUE", help="override one config key"
    )
    p.add_argument(
        "--allow-missing-layer",
        action="append",
        default=[],
        metavar="LAYER",
        help="an official's decision: on a track that requires every isolation layer, accept that this machine "
        "lacks LAYER (landlock, namespaces, network_namespace, signal_scoping, seccomp); recorded; repeatable",
    )
    p.add_argument(
        "--wandb",
        choices=WANDB_MODES,
        help="track the run with wandb (log.wandb): offline writes RUN_DIR/wandb; never blocks or fails a run",
    )
    p.add_argument("--ledger", help="results ledger to append to (default: RUN_DIR/../ledger.jsonl)")
    p.set_defaults(func=cmd_run)

    p = sub.add_parser("pack", help="quantize + compress a state into an artifact; enforce the cap")
    p.add_argument("state", help="a .safetensors state dict")
    p.add_argument(
        "--submission", required=True, help="the submission folder (its code is counted and hashed)"
    )
    p.add_argument("--out", required=True, help="artifact file to write")
    p.add_argument(
        "--codec",
        default="int8_zlib",
        help="int8_zlib (default), a built-in codec spec such as int6_zstd22 (docs/RULES.md), or 'submission'",
    )
    p.add_argument(
        "--preset", help="preset whose [model] table the scorer will build, if the state does not record one"
    )
    p.add_argument("--cap-bytes", type=int, default=ARTIFACT_CAP_BYTES)
    p.add_argument("--json-out", help="also write the pack record here")
    p.set_defaults(func=cmd_pack)


def version() -> str:
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as dist_version

    try:
        return f"pgolf {dist_version('pgolf')}"
    except PackageNotFoundError:  # run from a checkout that was never installed
        return "pgolf (not installed: version unknown)"


def _top_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="pgolf", description="The parameter-golf harness.")
    parser.add_argument("--version", action="version", version=version())
    return parser


def summary_parser() -> argparse.ArgumentParser:
    """Every command by name and summary line only: `pgolf`, `pgolf --help`, `pgolf --version`, a mistyped
    command. Imports no command's module."""
    parser = _top_parser()
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in COMMANDS:
        sub.add_parser(name, help=SUMMARIES[name], add_help=False)
    return parser


def _confined_transform(path: str) -> object:
    """`--transform FILE.py`: the submitted transform, one confined child per split (scoring/worker/transform.py)."""
    from scoring.worker.transform import ConfinedTransforms

    return ConfinedTransforms(path)


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The parser with every command, or with `only` that command's module imported."""
    parser = _top_parser()
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    modules = [COMMANDS[only]] if only in COMMANDS else list(dict.fromkeys(COMMANDS.values()))
    for name in modules:
        if name == "data.cli":
            p = sub.add_parser("data", help="datasets: build, download, verify")
            importlib.import_module(name).register(
                p.add_subparsers(dest="data_command", required=True, metavar="DATA_COMMAND"),
                _confined_transform,
            )
        elif name == "harness.bench":
            p = sub.add_parser("bench", help="benchmarks that print figures")
            importlib.import_module(name).register(
                p.add_subparsers(dest="bench_command", required=True, metavar="BENCH")
            )
        else:
            importlib.import_module(name).register(sub)
    return parser


def run_command(args: argparse.Namespace) -> int:
    """Run a parsed command; a user error (scoring/errors.py exit_code_of) becomes one clear line and its exit
    status (2); anything else is a bug and keeps its traceback."""
    from scoring.errors import exit_code_of

    try:
        return int(args.func(args) or 0)
    except Exception as e:
        code = exit_code_of(e)
        if code is None:
            raise
        print(f"error: {e}", file=sys.stderr)
        return code
    except KeyboardInterrupt:  # before a run started (or a command without a record): one line, no traceback
        print(f"interrupted: pgolf {args.command} stopped by Ctrl-C", file=sys.stderr)
        return EXIT_INTERRUPTED


def dump_stacks_on_sigusr1() -> None:
    """`kill -USR1 PID` prints every thread's Python stack to stderr and the command goes on: how an
    official (or a test that timed out) sees where a run that does not end is waiting."""
    if not hasattr(signal, "SIGUSR1") or threading.current_thread() is not threading.main_thread():
        return
    stderr = sys.__stderr__  # the process's own (a caller may have redirected sys.stderr to a buffer: no fd)
    if stderr is None:
        return
    try:
        faulthandler.register(signal.SIGUSR1, file=stderr, all_threads=True, chain=False)
    except (AttributeError, ValueError, OSError):  # no stderr at all (io.UnsupportedOperation is an OSError)
        pass


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    dump_stacks_on_sigusr1()
    first = next((a for a in argv if not a.startswith("-")), None)
    if first not in COMMANDS:  # no command, --help, --version, or a mistyped one: answered without imports
        near = difflib.get_close_matches(first, COMMANDS, n=1) if argv and argv[0] == first else []
        if near:
            summary_parser().error(
                f"argument COMMAND: invalid choice: {first!r} (did you mean {near[0]}?); "
                f"choose from {', '.join(COMMANDS)}"
            )
        summary_parser().parse_args(argv)
    args = build_parser(first).parse_args(argv)
    return run_command(args)


if __name__ == "__main__":
    raise SystemExit(main())
