"""`pgolf verify RUN_DIR...`: the command over harness/records/verify.py (one result, inline) and
harness/records/executors.py (one job per result, local or Slurm); the checks and the verdict are
verify.py's.

Apart from both so that neither imports the other: the executors build on verify's checks, and the
command chooses between them.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from data.io import read_json
from harness.records.executors import ExecutorConfig, run_verifications
from harness.records.verify import (
    Check,
    VerifyConfig,
    not_a_result,
    read_result,
    verify_result,
)
from harness.run.text import visible
from isolation.sandbox import KERNEL_LAYERS, parse_layers
from scoring.statuses import FAILED, UNVERIFIED, VERIFY_ERROR


def earlier_verdict(run_dir: Path) -> str:
    """The verdict result.json holds now (for the line of an error: it stands)."""
    try:
        result = read_json(run_dir / "result.json", what="result")
    except (OSError, ValueError):
        return "none (no readable result.json)"
    if not isinstance(result, dict):  # a JSON array or number where a result belongs
        return "none (result.json is not a JSON object)"
    return visible(result.get("verification") or UNVERIFIED, 40)


def print_record(rec: dict[str, Any], *, as_json: bool, all_checks: bool) -> None:
    if as_json:
        print(json.dumps(rec, sort_keys=True))
        return
    job = rec.get("executor")
    where = f" [{job['kind']} job {job['job_id']}, {job['state']}]" if job else ""
    if rec["status"] == VERIFY_ERROR:
        log = f"; log: {rec['log']}" if rec.get("log") else ""
        print(
            f"verify {visible(rec['run_dir'])}: ERROR (the harness could not verify it: {visible(rec['detail'])}){where}; "
            f"the earlier verdict stands ({earlier_verdict(Path(rec['run_dir']))}){log}"
        )
        return
    print(
        f"verify {visible(rec['run_dir'])}: {rec['status'].upper()} ({len(rec['checks'])} checks, "
        f"{len(rec['differences'])} difference(s)){where}"
    )
    for c in rec["checks"] if all_checks else rec["differences"]:
        print(Check(**c).line())


def cmd_verify(args: argparse.Namespace) -> int:
    cfg = VerifyConfig(
        tol_bpb=args.tol_bpb,
        device=args.device,
        threads=args.threads,
        allow_missing_layers=parse_layers(args.allow_missing_layer, "--allow-missing-layer"),
        scoring_workers=args.scoring_workers,
    )
    paths: list[str] = args.result
    if args.executor == "inline":
        records = []
        for p in paths:  # a folder that is no result is one line of its own; the others are verified
            try:
                read_result(p)
            except (FileNotFoundError, ValueError) as e:
                records.append(not_a_result(p, e))
                continue
            records.append(
                verify_result(p, submission=args.submission, data=args.data, cfg=cfg, ledger=args.ledger)
            )
    else:
        ecfg = ExecutorConfig(
            kind=args.executor,
            folder=Path(args.jobs_folder) if args.jobs_folder else None,
            partition=args.partition,
            time_min=args.time_min,
            cpus=args.cpus,
            gpus=args.gpus,
            mem_gb=args.mem_gb,
            max_parallel=args.max_parallel,
        )
        records = run_verifications(
            paths, submission=args.submission, data=args.data, vcfg=cfg, ecfg=ecfg, ledger=args.ledger
        )
    for rec in records:  # one folder: every check; several: each verdict and its differences
        print_record(rec, as_json=args.json, all_checks=len(paths) == 1)
    failed = sum(r["status"] == FAILED for r in records)
    errors = sum(r["status"] == VERIFY_ERROR for r in records)
    if len(records) > 1 and not args.json:
        print(
            f"{len(records) - failed - errors} of {len(records)} verified, {failed} failed"
            + (
                f", {errors} not verified for a harness error (their earlier verdicts stand)"
                if errors
                else ""
            )
        )
    return 1 if failed else (3 if errors else 0)  # 3: no verdict failed, but some could not be verified


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "verify", help="recompute a result's hashes and re-score its artifact in a fresh process"
    )
    p.add_argument("result", nargs="+", help="run folders or their result.json files")
    p.add_argument(
        "--submission", help="the submission folder (default: RUN_DIR/code, else the one in train_spec.json)"
    )
    p.add_argument("--data", help="the dataset folder (default: the one the result records)")
    p.add_argument("--device", help="re-score device (default: the one the result was scored on)")
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: as recorded)")
    p.add_argument(
        "--scoring-workers",
        type=int,
        default=None,
        help="model workers of the re-score (default: as many as the result was scored with; on CUDA one per GPU)",
    )
    p.add_argument(
        "--allow-missing-layer",
        action="append",
        default=[],
        metavar="LAYER",
        help="an official's decision: on a record track, re-score although this machine lacks LAYER "
        f"({', '.join(KERNEL_LAYERS)}); recorded in the re-score; repeatable",
    )
    p.add_argument(
        "--tol-bpb", type=float, default=VerifyConfig().tol_bpb, help="accepted |Δ| of val_bpb and val_loss"
    )
    p.add_argument(
        "--ledger", help="ledger to append the verification to (default: RUN_DIR/../ledger.jsonl if present)"
    )
    p.add_argument("--json", action="store_true", help="print each verification record as one JSON object")
    p.add_argument(
        "--executor",
        choices=("inline", "local", "slurm"),
        default="inline",
        help="inline: in this process, one after another; local: one job per result on this machine; "
        "slurm: one Slurm job per result (harness/records/executors.py)",
    )
    p.add_argument(
        "--jobs-folder",
        help="the jobs' folder, on a filesystem the nodes share; each invocation makes a new one in it "
        "(default: .verify-jobs/ beside the first run)",
    )
    p.add_argument("--partition", help="slurm partition (default: the cluster's default)")
    p.add_argument(
        "--time-min", type=int, help="job time limit in minutes (default: 2x the track's eval budget + 10)"
    )
    p.add_argument("--cpus", type=int, help="CPUs per job (default: the threads the result was scored with)")
    p.add_argument(
        "--gpus",
        type=int,
        help="GPUs per job (default: the result's scoring workers if it was scored on CUDA)",
    )
    p.add_argument("--mem-gb", type=float, help="memory per job in GB (default: the partition's default)")
    p.add_argument(
        "--max-parallel",
        type=int,
        default=0,
        help="jobs in flight at once (0: all on slurm, by CPUs on local)",
    )
    p.set_defaults(func=cmd_verify)
