"""`pgolf`: the one command line of the harness.

    pgolf run SUBMISSION_DIR [--preset NAME] [--seed N] [--data DIR] [--out RUN_DIR] [--set SECTION.KEY=VALUE ...]
              [--nproc N] [--nnodes M --rdzv-endpoint HOST:PORT]
    pgolf pack STATE.safetensors --submission DIR --out ARTIFACT [--codec int8_zlib] [--preset NAME]
    pgolf unpack ARTIFACT --out STATE.safetensors
    pgolf score ARTIFACT --submission DIR --data DIR [--json]
    pgolf data build|...      datasets (data/cli.py)
    pgolf sample ARTIFACT --submission DIR [--prompt TEXT]   generate text with a packed model
    pgolf bench ...           benchmarks that print figures

The flag set is closed: tests/unit/test_cli.py lists every command and flag, so adding one is a
deliberate change. User errors print one line naming the input and a fix, and exit with status 2.
"""

from __future__ import annotations

import argparse
import json
import sys

from data import cli as data_cli
from data.io import write_json_atomic
from harness import sample
from harness.config import load_config
from scoring import cli as scoring_cli
from scoring.cap import ARTIFACT_CAP_BYTES, ArtifactTooLarge
from scoring.pack import model_config_of, pack_state, read_state


def cmd_run(args: argparse.Namespace) -> int:
    from harness.run import run_pipeline

    launch = [f"launch.{key}={value!r}" for key, value in
              (("nproc_per_node", args.nproc), ("nnodes", args.nnodes), ("rdzv_endpoint", args.rdzv_endpoint)) if value is not None]
    result = run_pipeline(
        args.submission, preset=args.preset, seed=args.seed, data_dir=args.data, out_dir=args.out,
        overrides=[*launch, *args.set], ledger=args.ledger,
    )
    return 0 if result["status"] == "ok" else 1


def cmd_pack(args: argparse.Namespace) -> int:
    state, meta = read_state(args.state)
    model_config = model_config_of(meta)
    if model_config is None:
        model_config = load_config(args.submission, args.preset).model
    record = pack_state(state, args.submission, args.out, codec_name=args.codec, model_config=model_config, cap_bytes=args.cap_bytes)
    if args.json_out:
        write_json_atomic(args.json_out, record)
    print(json.dumps({k: record[k] for k in ("bytes_code", "bytes_model", "bytes_total", "cap_bytes", "within_cap")}))
    if not record["within_cap"]:
        raise ArtifactTooLarge(record["bytes_code"], record["bytes_model"], record["cap_bytes"])
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="pgolf", description="The parameter-golf harness.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("run", help="train, pack, score and report a submission")
    p.add_argument("submission", help="submission (or baseline) folder")
    p.add_argument("--preset", help="named preset of the folder's config.toml")
    p.add_argument("--seed", type=int, help="overrides run.seed")
    p.add_argument("--data", help="dataset folder (default: the embedded corpus, built on first use)")
    p.add_argument("--out", help="run folder (default: runs/NAME-PRESET-TIMESTAMP)")
    p.add_argument("--nproc", type=int, help="ranks per node: GPUs per node, or CPU processes (launch.nproc_per_node)")
    p.add_argument("--nnodes", type=int, help="nodes, each running this same command (launch.nnodes)")
    p.add_argument("--rdzv-endpoint", help="HOST:PORT of torchrun's c10d rendezvous, for several nodes (launch.rdzv_endpoint)")
    p.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE", help="override one config key")
    p.add_argument("--ledger", help="results ledger to append to (default: RUN_DIR/../ledger.jsonl)")
    p.set_defaults(func=cmd_run)

    p = sub.add_parser("pack", help="quantize + compress a state into an artifact; enforce the cap")
    p.add_argument("state", help="a .safetensors state dict")
    p.add_argument("--submission", required=True, help="the submission folder (its code is counted and hashed)")
    p.add_argument("--out", required=True, help="artifact file to write")
    p.add_argument("--codec", default="int8_zlib", help="int8_zlib (default) or 'submission' for its codec.py")
    p.add_argument("--preset", help="preset whose [model] table the scorer will build, if the state does not record one")
    p.add_argument("--cap-bytes", type=int, default=ARTIFACT_CAP_BYTES)
    p.add_argument("--json-out", help="also write the pack record here")
    p.set_defaults(func=cmd_pack)

    scoring_cli.register(sub)
    sample.register(sub)

    p = sub.add_parser("data", help="datasets: build, download, verify")
    data_cli.register(p.add_subparsers(dest="data_command", required=True, metavar="DATA_COMMAND"))

    p = sub.add_parser("bench", help="benchmarks that print figures")
    bench_sub = p.add_subparsers(dest="bench_command", required=True, metavar="BENCH")
    _register_benches(bench_sub)
    return parser


def _register_benches(sub: argparse._SubParsersAction) -> None:
    from data import bench as data_bench
    from harness import bench as runner_bench
    from scoring import bench as scoring_bench

    runner_bench.register(sub)
    data_bench.register(sub)
    scoring_bench.register(sub)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return scoring_cli.run_command(args)
    except FileExistsError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
