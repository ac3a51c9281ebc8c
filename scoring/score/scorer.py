"""The scorer: bits per byte of an artifact, in a process that runs no submitted code.

    score_artifact(artifact, code_dir, data_dir, cfg, ...) -> the pg-score record (raises on a failed score)
    score_core(worker_cfg, data_dir, manifest, tokenizer, cfg, dev, ...) -> CoreScore (steps 2 to 6)

`score_core` is the one scorer core: `pgolf score` and the re-score of `pgolf verify` reach it through
score_artifact (in `python -m scoring score`), `pgolf verify-legacy` through scoring/score/legacy.py
with the worker's legacy build mode (WorkerConfig.legacy) and the byte table as the denominator.

It holds the validation tokens and byte tables, builds the windows in plan order, computes the
float64 loss and bpb itself, runs the probes and writes the record. The submission's scored code
(model.py, eval.py, codec.py: decoding included, since a custom codec is submitted code) runs only
in model workers (scoring/worker/, started through scoring/score/remote.py), confined before they
import anything of the submission. In order:

1. read the artifact's header and copy the staged code into a folder of this process's own, under the folder
   rules, checking that it is exactly what was packed (every counted file of `code_dir` recorded, with its
   sha256; `copy_packed_code`): the workers get that copy, never `code_dir`, so nothing the cap did not count
   (README.md, submission.json, folders without a counted file) reaches them, and a copy of the artifact's
   bytes alone (`copy_artifact`: never its xattrs); lint the scored code (a friendly early verdict);
2. start the main worker and the probe workers (fresh processes that will see one batch each), before
   this process reads any validation data and before it confines itself (a confined process cannot
   create the namespaces a worker gets);
3. read the validation tokens, the tokenizer and the manifest; confine this process (Landlock:
   scoring/score/confine.py) when asked;
4. audit the tokenizer's byte table when it is not a known official one (scoring/score/audit.py);
5. evaluate (scoring/score/evaluate.py): windows to the worker, logits back through shared memory,
   the loss here; score-first adaptation in the worker, a chunk handed over only after its scores
   are recorded; every wait has the evaluation deadline (budget + grace), past which the worker is
   killed;
6. probe (scoring/score/probes.py): real batches chosen with a secret seed, variants in fresh workers.

The record (format "pg-score", version 2) carries the numbers, the mode, dtype, device, the probe,
audit and adaptation records, how each worker was confined, and which layer enforced which rule.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
import platform
import tempfile
import time
from collections.abc import Iterable, Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import numpy as np
import torch

from data.canonical import BYTE_SOURCE_CANONICAL, TargetBytes, canonical_entry, load_canonical_bytes
from data.io import read_regular, sha256_bytes, sha256_file
from data.manifest import MANIFEST_NAME, Manifest, load_manifest
from data.shards import read_split
from data.tokenizer import Tokenizer, load_tokenizer
from harness.api import EVAL_HOOK_FILE, MODEL_FILE, TRAIN_FILE
from isolation.sandbox import raise_memlock
from isolation.world import PageCacheReset
from scoring.artifact.cap import CODE_BUNDLE, FolderRefused, read_counted, scan_folder
from scoring.artifact.format import ArtifactError, read_artifact
from scoring.codecheck import require_clean_code, scored_files
from scoring.score.audit import KNOWN_TOKENIZER_SHA256, audit_token_stream
from scoring.score.bpb import METRIC_VERSION, metric_table
from scoring.score.confine import confine_scorer, private_workdir
from scoring.score.evaluate import (
    EvalConfig,
    EvalResult,
    Scorable,
    batch_count,
    eval_tokens,
    evaluate,
)
from scoring.score.pool import WorkerPool, shared_net_here, start_pool
from scoring.score.probes import (
    PROBE_WORKERS_PER_PROBE,
    ProbeConfig,
    ProbeFailure,
    plan_probes,
    replay_seconds,
    run_probes,
)
from scoring.score.record import ScoreRecord
from scoring.score.remote import EvalDeadline, WorkerConfig, WorkerModel, start_worker
from scoring.score.windows import resolve_documents
from scoring.worker.child import default_memory_limit_bytes, tune_cpu_allocator
from scoring.worker.cpu_math import warm_cpu_math

ENFORCEMENT = {
    "submitted code never shares a process with validation data": "process: the model worker (scoring/worker/)",
    "the worker reads only its code, the artifact and the Python installation": "kernel: Landlock (+ mount namespace)",
    "the worker reaches no network and no other process": "kernel: network and PID namespaces, seccomp, Landlock ptrace scope",
    "windows only in plan order; eval.py sees a chunk only after it is scored": "scorer process (it builds and sends every window)",
    "the loss and bpb are computed from the returned logits, in float64": "scorer process",
    "no peeking, no row mixing, same behaviour when probed": "probes in fresh workers (scoring/score/probes.py)",
    "log-probabilities sum to one at every position": "scorer process (check_normalized)",
    "evaluation deadline and memory limit": "scorer process (kills the worker) + RLIMIT_AS in the worker (CPU)",
    "allowed imports, no files or monkeypatching in scored code": "static lint (scoring/codecheck.py): early, friendly, not a boundary",
}
"""Which layer enforces which rule (recorded in every score)."""


class DeviceUnavailable(ValueError):
    """The device asked for is not on this machine (bad input: exit 2, never a verdict on the entry)."""


NOT_FOR_SCORED_CODE = (TRAIN_FILE, CODE_BUNDLE)
"""Counted files the workers are never given: the training code, and the bundle that may hold it."""


def copy_packed_code(artifact_header: dict[str, Any], code_dir: Path, dest: Path) -> list[str]:
    """Copy into the new folder `dest` the counted files of `code_dir` but NOT_FOR_SCORED_CODE, each one the
    artifact recorded, with the sha256 it recorded; returns their names. The workers are given `dest` alone.

    `code_dir` is read under the folder rules (scoring/artifact/cap.py: lstat, no link followed, each file
    read as the scan saw it), so the copy holds exactly what the cap counted. Given the folder as written
    (`pgolf score A --submission DIR`), the worker read README.md and submission.json (any size, never
    counted) and the names of folders holding no counted file. Recorded files may be missing (train.py is
    never staged for scoring).
    """
    recorded = artifact_header.get("code_files", {})
    try:
        scan = scan_folder(code_dir)
        files = [(f.rel, read_counted(code_dir, f)) for f in scan.files if f.rel not in NOT_FOR_SCORED_CODE]
    except FolderRefused as e:
        raise ArtifactError(f"the scored code's folder: {e}") from None
    for rel, data in files:
        if rel not in recorded:
            raise ArtifactError(
                f"{code_dir / rel} is not among the code files packed into the artifact; stage the packed code only"
            )
        if sha256_bytes(data) != recorded[rel]:
            raise ArtifactError(
                f"{code_dir / rel} differs from the code packed into the artifact (sha256 {recorded[rel][:12]}…); "
                "score with the submission folder the artifact was packed from"
            )
    if MODEL_FILE not in dict(files):
        raise ArtifactError(f"{code_dir} has no {MODEL_FILE} matching the artifact")
    dest.mkdir(parents=True)
    for rel, data in files:
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        (dest / rel).write_bytes(data)
    return [rel for rel, _ in files]


ARTIFACT_COPY = "artifact.pgolf"


def copy_artifact(src: Path, dest: Path) -> Path:
    """The artifact's bytes alone in the new file `dest` (read without following a link, a regular file only): the
    workers read that copy, never `src`. In place they read what the file holds beside its bytes too: user xattrs,
    which the process that wrote it may set (about 3 kB on ext4, 26 MB measured on tmpfs, unbounded on XFS) and no
    cap counts. A world copies a file it may read; a machine without worlds showed the workers the file itself."""
    try:
        data = read_regular(src)
    except (OSError, ValueError) as e:
        raise ArtifactError(f"{src}: the artifact cannot be read as a regular file ({e})") from None
    with open(dest, "xb") as f:
        f.write(data)
    return dest


def denominator_record(manifest_raw: dict[str, Any], denominator: TargetBytes) -> dict[str, Any]:
    """What the score's bytes were counted from (the record's `denominator`)."""
    block = canonical_entry(manifest_raw) or {}
    if denominator.source != BYTE_SOURCE_CANONICAL:
        return {
            "source": denominator.source,
            "why": "the dataset has no canonical byte counts (built before manifest version 3, or downloaded): "
            "the tokenizer's byte table counted each target",
        }
    vb = block.get("val_bytes") or {}
    return {
        "source": BYTE_SOURCE_CANONICAL,
        "canonical": block.get("text"),
        "transform": block.get("transform"),
        "val_bytes_sha256": vb.get("sha256"),
        "split_docs": vb.get("docs"),
        "split_bytes": vb.get("total_bytes"),
    }


def tokenizer_audit(tokenizer: Tokenizer, tokenizer_sha256: str, tokens: np.ndarray) -> dict[str, Any]:
    """Audit the byte table on the scored documents unless the tokenizer is a known official one.

    byte260's table is exact by construction (one byte per byte piece) and is not audited either.
    A failed audit fails the score (ProbeFailure, with the first mismatching document).
    """
    if tokenizer_sha256 in KNOWN_TOKENIZER_SHA256 or tokenizer.kind == "byte260":
        return {
            "ran": False,
            "reason": f"known tokenizer ({tokenizer.kind}, sha256 {tokenizer_sha256[:12]}…)",
        }
    report = audit_token_stream(tokenizer, tokens)
    if not report.passed:
        raise ProbeFailure(f"the dataset's tokenizer failed the byte-table audit:\n{report.summary()}")
    return {"ran": True, "reason": "tokenizer brought by the dataset/submission", **report.as_dict()}


PROBE_SLACK_S = 60.0
"""The probe workers' allowance beyond what the main worker's build and forward passes took."""


def probe_allowance(
    build_s: float,
    scoring_s: float,
    batches: int,
    workers: int,
    adapt_s: float = 0.0,
    replay_s: float = 0.0,
    parallel: int = 1,
) -> float:
    """Seconds the probe workers get, all together, to build and answer their probes: each build as long as the
    main worker's (they run one at a time), a few forward passes each at the main worker's pace, the replays of
    the score-first adaptation (`replay_s`, all of them together: scoring/score/probes.py replay_seconds, the
    chosen probes' replays by the main worker's seconds per chunk, at least two passes of its adaptation), and
    PROBE_SLACK_S."""
    # `parallel` workers scored side by side: one batch took that many times the scoring time per batch
    per_forward = parallel * max(scoring_s - adapt_s, 0.0) / max(batches, 1)
    return PROBE_SLACK_S + workers * (build_s + 2 * per_forward) + replay_s


def _ready_at(worker: WorkerModel) -> float:
    """Wait for the worker's ready (in a pool's thread, while this one reads the data); when it came, by this
    process's monotonic clock. The thread only reads the socket."""
    worker.wait_ready()
    return time.monotonic()


def _one_at_a_time(
    workers: Iterable[WorkerModel | WorkerPool], cache: PageCacheReset
) -> Iterator[WorkerModel | WorkerPool]:
    """Each worker (or a group's fresh workers, together) started only once the one before it is closed and the
    page cache emptied of it: no two probe workers ever run submitted code at the same time, and none finds what
    another left."""
    before: WorkerModel | WorkerPool | None = None
    for w in workers:
        if before is not None:
            before.close()
            cache.reset()
        w.start()
        w.wait_ready()
        before = w
        yield w


@dataclasses.dataclass(frozen=True)
class CoreScore:
    """What the scorer core measured with one build of the model (the main worker's): the caller writes the record."""

    result: EvalResult
    probes: dict[str, Any]
    tokens_available: int
    """Validation tokens the dataset holds (the scored subset may be fewer)."""
    denominator: TargetBytes
    audit: dict[str, Any]
    confinement: dict[str, Any]
    build_s: float
    eval_clock_s: float
    """Build + scoring, by this process's clock: what the eval budget bounds."""
    probe_allowance_s: float | None
    probe_wall_s: float
    workers: list[dict[str, Any]]
    """How each worker was confined: the main one, the first probe worker, the shards."""
    forwards: int
    adaptation: dict[str, Any] | None
    tokenizer_sha256: str
    artifact_sha256: str
    manifest_sha256: str
    cfg: EvalConfig | None = None
    """The eval config as scored: a cut by documents resolved to max_tokens (windows.py resolve_documents)."""
    crossing: dict[str, Any] | None = None
    """How the logits crossed from the scoring workers (remote.py WorkerModel.crossing_record, bytes summed)."""


BYTE_SOURCES = ("dataset", "byte_table")
"""What bpb divides by: the dataset's canonical byte counts where it has them, else the tokenizer's byte table
(the normal scorer); or always the byte table (verify-legacy: the reference challenge's own denominator)."""


def score_core(
    worker_cfg: WorkerConfig,
    data_dir: Path,
    manifest: Manifest,
    tokenizer: Tokenizer,
    cfg: EvalConfig,
    dev: torch.device,
    *,
    eval_budget_s: float = math.inf,
    probe_cfg: ProbeConfig | None = None,
    scoring_workers: int = 1,
    workdir: tuple[Path, str] | None = None,
    protect: Iterable[str | os.PathLike[str]] = (),
    write_dirs: Iterable[str | os.PathLike[str]] = (),
    bytes_from: str = "dataset",
) -> CoreScore:
    """Steps 2 to 6 of the module docstring, for any model worker: `worker_cfg` says what the workers build
    (a packed submission, or with `legacy` set a reference-challenge record: scoring/worker/legacy.py). The
    main worker, any shards and the probe workers are started before the validation data is read; `workdir`
    (scoring/score/confine.py private_workdir) confines this process once it has read the data."""
    if bytes_from not in BYTE_SOURCES:
        raise ValueError(f"bytes_from {bytes_from!r}: expected one of {', '.join(BYTE_SOURCES)}")
    probe_cfg = probe_cfg or ProbeConfig()
    table = tokenizer.byte_table()
    adapting, code_dir = worker_cfg.adapt, worker_cfg.code_dir
    n_probe_workers = probe_cfg.probes * PROBE_WORKERS_PER_PROBE
    finite = math.isfinite(eval_budget_s)
    if scoring_workers < 1:
        raise ValueError(f"scoring_workers must be >= 1, got {scoring_workers}")
    if dev.type == "cuda" and scoring_workers > torch.cuda.device_count():
        raise DeviceUnavailable(
            f"scoring_workers={scoring_workers}: this machine has {torch.cuda.device_count()} CUDA device(s)"
        )
    if dev.type == "cuda" and scoring_workers > 1 and dev.index != 0:
        raise DeviceUnavailable(
            f"--device {dev} with {scoring_workers} scoring workers: they take cuda:0 .. cuda:{scoring_workers - 1}; "
            "give --device cuda:0 (or cuda), or set CUDA_VISIBLE_DEVICES"
        )
    if dev.type == "cuda":
        # this side page-locks the logits buffers (scoring/worker/pinning.py), as the workers do theirs (their
        # sandbox raises the limit: isolation/sandbox.py memlock_unlimited); a refusal only leaves them pageable
        raise_memlock()
    shard_devices = [
        worker_cfg.device if dev.type == "cpu" else f"cuda:{k}" for k in range(1, scoring_workers)
    ]
    # with score-first adaptation over several workers, they form a group (scoring/score/pool.py) and so does
    # each probe's set of fresh workers, of the same size on the same devices: a probe looks like scoring
    grouped = adapting and scoring_workers > 1
    net = grouped and shared_net_here(worker_cfg.sandbox)  # asked of the machine once for every group
    devices = [worker_cfg.device, *shard_devices]
    with ExitStack() as stack:
        pool = start_pool(worker_cfg, devices, grouped=grouped, stack=stack, net=net)
        main, shards = pool.workers[0], pool.workers[1:]
        # The eval clock starts now: decoding the artifact, building the model and any warm-up in the worker
        # count against the budget (a model that fitted itself at build time ran 62 s off every clock).
        t_clock = time.monotonic()
        pool.deadline = t_clock + eval_budget_s if finite else None
        pool.start()  # each told to build, in order (a group without a namespace of its own: its port let go first)
        # started in order, the main one first: each decodes and builds while this process reads the data (probe
        # workers wait idle)
        building = pool.submit_each([functools.partial(_ready_at, w) for w in pool.workers])
        # the probe workers get the main one's spec (adaptation included): nothing tells them apart
        probe_cfg_w = dataclasses.replace(worker_cfg, role="probe")
        probe_workers: list[WorkerModel | WorkerPool] = [
            start_pool(probe_cfg_w, devices, grouped=True, stack=stack, net=net)
            if grouped
            else start_worker(probe_cfg_w)
            for _ in range(n_probe_workers)
        ]
        for u in probe_workers:
            stack.callback(u.close)
        # opened while this process may write it (before it confines itself): see isolation/world.py
        cache = PageCacheReset.open(roots=[r.path for r in main.plan.rules if r.access == "ro"])
        stack.callback(cache.close)
        tokens = read_split(data_dir, "val")
        cfg = resolve_documents(cfg, tokens, tokenizer.bos_id)
        # this process's own loss (log-softmax in float64) goes through MKL's vector math too: warmed like
        # the workers' (scoring/worker/cpu_math.py), so no first call can change a scored number
        warm_cpu_math()
        canonical = (
            load_canonical_bytes(data_dir, manifest.raw, tokens, table.vocab_size, tokenizer.bos_id)
            if bytes_from == "dataset"
            else None
        )
        denominator: TargetBytes = table if canonical is None else canonical
        tokenizer_sha256 = sha256_file(manifest.tokenizer_path)
        artifact_sha256, manifest_sha256 = (
            sha256_file(worker_cfg.artifact),
            sha256_file(data_dir / MANIFEST_NAME),
        )
        confinement: dict[str, Any] = {
            "applied": False,
            "reason": "not asked (--no-confine, or scored in-process)",
        }
        if workdir is not None:  # everything is read: from here on, the dataset is out of reach
            confinement = confine_scorer(
                code_dir=code_dir,
                protected=[data_dir, manifest.root, *map(Path, protect)],
                write_dirs=list(map(Path, write_dirs)),
                device=dev.type,
                workdir=workdir,
            )
        audit = (
            tokenizer_audit(tokenizer, tokenizer_sha256, eval_tokens(tokens, cfg))
            if canonical is None
            else {
                "ran": False,
                "reason": "the denominator is the dataset's canonical byte counts, proved document by document when "
                "it was built (data/proof.py); the byte table counts nothing",
            }
        )
        # the last ready; all waited for at once (a shard that fails is the answer, not the main one's wait)
        build_s = max(pool.gather(building)) - t_clock
        plan = plan_probes(batch_count(tokens, cfg, tokenizer.bos_id, adapting), probe_cfg)
        # the rest of the budget, from now: this process's own preparation after the build is not the entry's
        pool.deadline = time.monotonic() + eval_budget_s - build_s if finite else None
        scoring: WorkerModel | WorkerPool = pool if shards else main
        result = evaluate(
            scoring,
            tokens,
            denominator,
            cfg,
            dev,
            bos_id=tokenizer.bos_id,
            adapter=scoring if adapting else None,
            keep_batches=plan.batches,
            shuffle_seed=plan.seed,
        )
        eval_clock_s = build_s + result.eval_time_s
        if finite and eval_clock_s > eval_budget_s:  # it ended between two looks at the deadline
            raise EvalDeadline(
                f"the evaluation took {eval_clock_s:.1f} s (build {build_s:.1f} s + scoring {result.eval_time_s:.1f} s) "
                f"by the scorer's clock: past its budget of {eval_budget_s:.1f} s"
            )
        # The probe workers repeat the build and a few forward passes: bounded by an allowance, recorded, from
        # what the main worker took (a probe worker past it is a failed probe: scoring/score/probes.py).
        chunk_replay_s = list(scoring.chunk_replay_s) if adapting else []
        probe_allowance_s = probe_allowance(
            build_s,
            result.eval_time_s,
            result.batches,
            n_probe_workers,
            result.adapt_time_s,
            replay_seconds(plan, result.kept_chunks, chunk_replay_s) if adapting else 0.0,
            parallel=len(devices),
        )
        # the main worker is gone before any probe worker runs submitted code: nothing of it is alive to hold
        # a lock, a socket or a page for them, and it never learns which of its batches are compared
        if shards:  # the pool timed the adaptation of all its workers at once
            main._adapt_s = result.adapt_time_s
        main_described = main.describe()
        shards_described = [w.describe() for w in shards]
        forwards = sum(w.forwards for w in pool.workers)
        crossing = pool.crossing_record()
        adaptation = (
            main.adaptation_record(cfg.adapt_chunk_tokens, sha256_file(code_dir / EVAL_HOOK_FILE))
            if adapting
            else None
        )
        if adaptation is not None and grouped:  # what the scorer made, not what the workers said of it
            adaptation["group"] = {
                "world_size": len(devices),
                "devices": devices,
                "network": "a loopback-only namespace of the group's own"
                if pool.net is not None
                else "the host's loopback",
                "probes": "each probe in a fresh group of the same size, every worker given its batch",
            }
        pool.close()  # every scoring worker, the collecting threads, a group's namespace
        cache.reset()
        t_probes = time.monotonic()
        for u in probe_workers:  # one deadline for them all: the allowance is for every probe worker together
            u.deadline = t_probes + probe_allowance_s
        fresh = _one_at_a_time(probe_workers, cache)
        scored_toks = eval_tokens(tokens, cfg)

        def replay(worker: Scorable, chunk: int) -> None:  # the main worker's adaptation, chunk by chunk
            assert isinstance(worker, WorkerModel | WorkerPool)
            for k, (first, end) in enumerate(main.delivered[:chunk]):
                worker.before_chunk(None, k)
                worker.after_chunk(None, k, np.ascontiguousarray(scored_toks[first:end]), first)

        probes = run_probes(
            plan,
            result.kept,
            fresh,
            scored_toks,
            probe_cfg,
            replay=replay if adapting else None,
            kept_chunks=result.kept_chunks,
            total_batches=result.batches,
            chunk_replay_s=chunk_replay_s,
        )
        probe_wall_s = time.monotonic() - t_probes
        if probes.get(
            "ran"
        ):  # the replays' share of the probes (eval_clock.probe_allowance_s bounded them all)
            probes["replay_time_s"] = sum(p.get("replay_time_s", 0.0) for p in probes["probes"])
        for u in probe_workers:  # the last of them gone, the page cache emptied: nothing for a later run
            u.close()
        cache.reset()
        probes["page_cache"] = cache.describe()
        workers = [main_described, *(w.describe() for w in probe_workers[:1]), *shards_described]
    return CoreScore(
        result=result,
        probes=probes,
        tokens_available=int(tokens.size),
        denominator=denominator,
        audit=audit,
        confinement=confinement,
        build_s=build_s,
        eval_clock_s=eval_clock_s,
        probe_allowance_s=probe_allowance_s if probe_workers else None,
        probe_wall_s=probe_wall_s,
        workers=workers,
        forwards=forwards,
        adaptation=adaptation,
        tokenizer_sha256=tokenizer_sha256,
        artifact_sha256=artifact_sha256,
        manifest_sha256=manifest_sha256,
        cfg=cfg,
        crossing=crossing,
    )


def scoring_device(device: str) -> torch.device:
    """The device asked for, refused (DeviceUnavailable) when this machine has none of it."""
    dev = torch.device(device)
    if dev.type == "cuda" and not torch.cuda.is_available():  # the machine's, not the entry's: refused input
        raise DeviceUnavailable(f"--device {device}: this machine has no CUDA device torch can use")
    if dev.type == "cuda" and dev.index is None:  # "cuda" is the current GPU: named, so every worker's is
        dev = torch.device("cuda", torch.cuda.current_device())
    return dev


def score_artifact(
    artifact_path: str | os.PathLike[str],
    code_dir: str | os.PathLike[str],
    data_dir: str | os.PathLike[str],
    cfg: EvalConfig,
    device: str = "cpu",
    threads: int = 0,
    *,
    sandbox: str = "auto",
    confine: bool = False,
    write_dirs: Iterable[str | os.PathLike[str]] = (),
    protect: Iterable[str | os.PathLike[str]] = (),
    private: Iterable[str | os.PathLike[str]] = (),
    eval_budget_s: float = math.inf,
    probe_cfg: ProbeConfig | None = None,
    memory_limit_bytes: int | None = None,
    allow_missing_layers: tuple[str, ...] = (),
    scoring_workers: int = 1,
) -> dict[str, Any]:
    """Score one artifact (see the module docstring). `sandbox` is the workers' (auto, required, off);
    `confine` restricts this process too once it has read the data (irreversible: one score per process).
    `scoring_workers` > 1 shards the windows over that many model workers (WorkerPool; on CUDA one per device,
    cuda:0 .. cuda:K-1): the same sums to the bit, the extra workers closed with the main one before the probes."""
    t_start = time.perf_counter()
    # absolute: the workers run in folders of their own, so a relative path would name another file there
    code_dir, data_dir, artifact_path = (
        Path(code_dir).absolute(),
        Path(data_dir).absolute(),
        Path(artifact_path).absolute(),
    )
    if threads:
        torch.set_num_threads(threads)
    dev = scoring_device(device)
    allocator = tune_cpu_allocator() if dev.type == "cpu" else "torch caching allocator"
    artifact = read_artifact(artifact_path)
    workdir = private_workdir() if confine else None
    with ExitStack() as cleanup:  # the workers get a copy of the packed files alone (copy_packed_code)
        # confined, the reaper of the scorer's temp folder removes the copy (this process may not)
        copy_root = workdir[0] if workdir else Path(cleanup.enter_context(tempfile.TemporaryDirectory()))
        checked = copy_packed_code(artifact.header, code_dir, copy_root / "code")
        code_dir = copy_root / "code"
        artifact_path = copy_artifact(artifact_path, copy_root / ARTIFACT_COPY)
        artifact = read_artifact(artifact_path)
        require_clean_code(code_dir)
        scored = scored_files(code_dir)
        adapting = (code_dir / EVAL_HOOK_FILE).is_file()
        protected = tuple(Path(p) for p in [data_dir, *protect])
        manifest = load_manifest(data_dir)
        tokenizer = load_tokenizer(manifest.tokenizer_path)
        table = tokenizer.byte_table()
        worker_cfg = WorkerConfig(
            code_dir=code_dir,
            artifact=Path(artifact_path),
            device=dev.type if dev.type == "cpu" else str(dev),
            dtype=cfg.dtype,
            threads=torch.get_num_threads(),
            vocab_size=table.vocab_size,
            max_tokens_per_batch=cfg.batch_seqs * cfg.seq_len,
            adapt=adapting,
            sandbox=sandbox,
            protected=protected,
            private=tuple(Path(p) for p in private),
            memory_limit_bytes=default_memory_limit_bytes()
            if memory_limit_bytes is None
            else memory_limit_bytes,
            workdir=workdir[0] if workdir else None,
            allow_missing_layers=allow_missing_layers,
        )
        core = score_core(
            worker_cfg,
            data_dir,
            manifest,
            tokenizer,
            cfg,
            dev,
            eval_budget_s=eval_budget_s,
            probe_cfg=probe_cfg,
            scoring_workers=scoring_workers,
            workdir=workdir,
            protect=protect,
            write_dirs=write_dirs,
        )
    result, sums = core.result, core.result.sums
    cfg = core.cfg or cfg
    finite = math.isfinite(eval_budget_s)
    return ScoreRecord(
        metric_version=METRIC_VERSION,
        metrics=metric_table(),
        val_loss=sums.val_loss,
        val_bpb=sums.val_bpb,
        byte_perplexity=sums.byte_perplexity,
        val_loss_sum_nats=sums.loss_nats,
        val_tokens=sums.tokens,
        val_bytes=sums.bytes,
        val_tokens_available=core.tokens_available,
        eval_subset_max_tokens=cfg.max_tokens,
        eval_subset_docs=cfg.max_docs,
        eval_mode=cfg.mode,
        eval_dtype=cfg.dtype,
        eval_seq_len=cfg.seq_len,
        eval_stride=cfg.resolved_stride,
        eval_batch_seqs=cfg.batch_seqs,
        eval_windows=result.windows,
        eval_batches=result.batches,
        eval_time_s=core.eval_clock_s,
        eval_budget_s=eval_budget_s if finite else None,
        eval_clock={
            "measured_by": "scorer",
            "build_time_s": core.build_s,
            "scoring_time_s": result.eval_time_s,
            "from": "the main worker told to decode and build, to its last scored batch",
            "probe_allowance_s": core.probe_allowance_s,
            "probe_wall_s": core.probe_wall_s,
        },
        denominator=denominator_record(manifest.raw, core.denominator),
        probes=core.probes,
        rows_shuffled=True,
        tokenizer_audit=core.audit,
        adaptation=core.adaptation,
        code_check={"static": "passed", "files": scored, "code_files_checked": checked},
        workers=core.workers,
        worker_forwards=core.forwards,
        enforcement=ENFORCEMENT,
        confinement=core.confinement,
        score_wall_s=time.perf_counter() - t_start,
        device=dev.type,
        device_name=torch.cuda.get_device_name(dev)
        if dev.type == "cuda"
        else platform.processor() or platform.machine(),
        threads=torch.get_num_threads(),
        allocator=allocator,
        submission_files_seen=checked,
        artifact_sha256=core.artifact_sha256,
        codec=artifact.header["codec"],
        data_manifest_sha256=core.manifest_sha256,
        tokenizer_sha256=core.tokenizer_sha256,
        torch=torch.__version__,
        crossing=core.crossing,
        scoring_workers=scoring_workers,
    ).to_json()
