"""`pgolf run`: data → train → pack → score → report, each phase its own process.

    1. data    resolve the dataset (--data DIR, or the embedded corpus, built on first use)
    2. train   torchrun -m harness.train.rank, given a view holding the training shards alone;
               supervised against the budget (harness/run/launch.py)
    3. pack    python -m harness.cli pack: codec + artifact + cap check
    4. score   python -m scoring score, given the artifact, the model code (the folder without
               train.py) and a view holding the validation shards alone, made only after training ended
    5. report  result.json (harness/run/result.py), appended to the results ledger, and a card printed

Every phase writes its versioned JSON record into RUN_DIR; a phase that fails stops the pipeline
and the result records the status (error, over_budget, over_cap) instead of a score.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import math
import os
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from data.embedded import ensure_embedded_dataset
from data.io import read_json, sha256_file, write_json_atomic
from data.manifest import Manifest, load_manifest, make_split_view
from harness.config import LaunchConfig, PackConfig, ResolvedConfig, validate_run
from harness.run.datacheck import data_identity, official_data_problem, refuse_mismatched_data
from harness.run.launch import pack_command
from harness.run.load import (
    choose_threads,
    describe_threads,
    load_between,
    measure_load,
    read_load,
    threads_set,
)
from harness.run.plot import plot_run
from harness.run.result import build_result, minimal_result, print_card, write_result
from harness.run.signals import how_stopped, stop_signals_ignored, stop_signals_interrupt
from harness.run.staging import folder_verdict, stage_folder, stage_model_code
from harness.run.text import NAME_MAX_CHARS, visible
from harness.run.tracking import Tracker, finish_tracking
from harness.run.train_phase import run_sealed_pack, run_train_phase
from harness.train.rank import METRICS_FILE, STATE_FILE
from isolation.processes import die_with_parent
from isolation.sandbox import missing_layers, parse_layers, probe_machine, require_layers
from scoring.artifact.cap import code_bytes, counted_files
from scoring.artifact.format import ArtifactError, read_artifact
from scoring.artifact.pack import PackRecord
from scoring.codecheck import lint_scored_code
from scoring.score.cli import EXIT_CODES, STATUS_OF_EXIT, ScoreRequest
from scoring.score.record import ScoreFailure, ScoreRecord, cause_line, read_score_record
from scoring.score.remote import WORKER_ISOLATION
from scoring.statuses import Status
from scoring.tracks import Track, get_track

SCORER_STARTUP_S = 300.0
"""The scorer process's own allowance beyond the eval deadline (imports, starting workers, reading data)."""


def default_run_dir(submission_dir: Path, preset: str | None) -> Path:
    stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    return Path("runs") / f"{submission_dir.resolve().name}-{preset or 'default'}-{stamp}"


def _gptq_spec(pack: PackConfig) -> dict[str, Any] | None:
    """The rank's GPTQ pack step (harness/train/gptq.py): its config and the codec whose grid it keeps; None: off."""
    gptq = pack.gptq()
    return {**gptq.to_json(), "codec": pack.codec} if gptq.enabled else None


def _subprocess_env() -> dict[str, str]:
    env = dict(os.environ)
    root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


PROGRESS_EVERY_S = 30.0
"""A phase that runs longer says so this often (`[score] 60 s of ...`)."""


def _run_phase(
    name: str,
    cmd: list[str],
    log_path: Path,
    timeout_s: float | None = None,
    progress: Callable[[float], str] | None = None,
) -> int | None:
    """Run one phase's process, its output into `log_path`; its exit status (None: killed at `timeout_s`).
    `progress(elapsed_s)`: the line printed every PROGRESS_EVERY_S while it runs."""
    print(f"[{name}] {' '.join(cmd[1:4])} ...", flush=True)
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(
            cmd,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=_subprocess_env(),
            start_new_session=True,
            preexec_fn=die_with_parent,  # the harness killed: the phase dies with it
        )
        t0 = time.monotonic()
        try:
            while True:
                left = None if timeout_s is None else timeout_s - (time.monotonic() - t0)
                try:
                    return proc.wait(
                        timeout=PROGRESS_EVERY_S if left is None else max(min(PROGRESS_EVERY_S, left), 0)
                    )
                except subprocess.TimeoutExpired:
                    if left is not None and left <= PROGRESS_EVERY_S:
                        raise
                    if progress is not None:
                        print(progress(time.monotonic() - t0), flush=True)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            return None
        except KeyboardInterrupt:  # Ctrl-C: the phase's process group goes with the run
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            raise


TAIL_LINE_MAX_CHARS = 1000
"""What `_tail` shows of one line of a phase's log."""


def _tail(path: Path, lines: int = 15) -> str:
    """The last `lines` lines of a phase's log, for the official's terminal: the log is the ranks' own output, so
    each line is shown as text (text.visible: an ESC sequence would move the cursor over the card, set the window's
    title or, through OSC 52, the official's clipboard)."""
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""
    return "\n".join(visible(line, TAIL_LINE_MAX_CHARS) for line in text.splitlines()[-lines:])


def keep_packed_code(submission_dir: Path, code_files: dict[str, str], dest: Path) -> None:
    """Copy the counted files into RUN_DIR/code, so `pgolf verify RUN_DIR` has the code that was packed."""
    for rel in code_files:
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(submission_dir / rel, dest / rel)


def require_isolation(launch: LaunchConfig) -> None:
    """Under launch.sandbox 'required', refuse (SandboxRefused, before anything starts) when this machine
    lacks an isolation layer that training or the model worker would use and no official allowed it."""
    if launch.sandbox != "required":
        return
    caps = probe_machine()
    train = missing_layers(caps, network=launch.network, multi_node=launch.nnodes > 1, seccomp=False)
    worker = missing_layers(caps, **WORKER_ISOLATION)
    require_layers(tuple(dict.fromkeys(train + worker)), parse_layers(launch.allow_missing_layers), "run")


def run_pipeline(
    submission_dir: str | Path,
    *,
    preset: str | None = None,
    seed: int | None = None,
    data_dir: str | Path | None = None,
    out_dir: str | Path | None = None,
    overrides: list[str] | None = None,
    ledger: str | Path | None = None,
    private: Sequence[str | Path] = (),
) -> dict[str, Any]:
    """`private`: folders beyond the run's own (its parent, the ledger's) out of every sandboxed phase's broad
    read rules: the other entries' runs, where the caller keeps them beside this one's folder."""
    t_pipeline = time.perf_counter()
    submission_dir = Path(submission_dir).resolve()
    # the folder, submission.json, every config value and the track's rules: checked before anything runs
    meta, cfg = validate_run(submission_dir, preset, overrides, seed=seed)
    run_cfg = cfg.section("run")
    launch: LaunchConfig = cfg.section("launch")
    track = get_track(run_cfg.track)
    # the folder rules, by lstat before anything copies it: links, FIFOs, hard links, sizes, encodings
    folder = folder_verdict(submission_dir, cap_bytes=track.cap_bytes)
    device = launch.resolved_device()
    require_isolation(launch)  # a record track on a machine without every layer: refused now, not mid-run
    run_dir = Path(out_dir) if out_dir else default_run_dir(submission_dir, preset)
    if run_dir.exists() and any(run_dir.iterdir()):
        raise FileExistsError(f"run folder {run_dir} already exists and is not empty; pass a new --out")

    # ---- 1. data: found and held to the model before the run folder exists (a refusal leaves nothing) ----
    t0 = time.perf_counter()
    data_root = Path(data_dir).resolve() if data_dir else ensure_embedded_dataset()
    manifest = load_manifest(data_root)
    data_warnings = refuse_mismatched_data(cfg.model, manifest)  # a model that cannot embed its tokens
    data_s = time.perf_counter() - t0

    run_dir.mkdir(parents=True, exist_ok=True)
    run_dir = run_dir.resolve()
    write_json_atomic(run_dir / "config.json", cfg.record())  # with the track rules it loosened
    # as given, and the track rules they loosened (an unranked track: recorded, shown on the card and the board)
    phases: dict[str, Any] = {"command": {"overrides": list(overrides or []), "loosened": cfg.loosened}}
    phases["data"] = {"dir": str(data_root), "time_s": data_s, **data_identity(manifest)}
    if data_warnings:
        phases["data"]["warnings"] = data_warnings
        for text in data_warnings:
            print(f"[data] warning: {text}", file=sys.stderr, flush=True)
    # wandb (off unless [log] / --wandb asks): init in its own thread, bounded; never blocks or fails the run
    tags = [track.name, visible(preset or "default", 40), visible(meta.get("name") or "", NAME_MAX_CHARS)]
    tracker = Tracker(cfg.section("log"), run_dir, tags=tags, untrusted=submission_dir)
    tracker.start()
    try:
        with stop_signals_interrupt():  # SIGTERM ends the run as Ctrl-C does (harness/run/signals.py)
            result = _phases(
                submission_dir,
                run_dir,
                cfg,
                meta,
                track,
                phases,
                manifest,
                data_root,
                folder,
                device,
                ledger,
                t_pipeline,
                tracker,
                private=private,
            )
    except Exception as e:  # noqa: BLE001 - every run that started ends with a result record
        # the detail: one line naming the cause and where; the traceback in RUN_DIR/harness_error.log
        full = "".join(traceback.format_exception(e))
        (run_dir / "harness_error.log").write_text(full, encoding="utf-8", errors="replace")
        where = traceback.extract_tb(e.__traceback__)[-1:]
        at = f" at {Path(where[0].filename).name}:{where[0].lineno}" if where else ""
        detail = cause_line(f"the harness failed ({type(e).__name__}{at}): {e}")
        phases["harness"] = {
            "status": Status.ERROR,
            "detail": f"{detail} (traceback: {run_dir / 'harness_error.log'})",
            "traceback": full[-4000:],
        }
        print(f"error: the run failed: {detail}", file=sys.stderr)
        result = _finish(run_dir, cfg, meta, track, phases, manifest, ledger, t_pipeline, status=Status.ERROR)
    except (
        KeyboardInterrupt
    ) as e:  # Ctrl-C or SIGTERM: the phase's processes are gone; the run ends with a record
        with stop_signals_ignored():  # a second Ctrl-C or SIGTERM cannot cut the record short
            during = next((p for p in ("train", "pack", "score") if p not in phases), "report")
            how, signum = how_stopped(e)
            phases["interrupted"] = {
                "status": Status.INTERRUPTED,
                "detail": f"stopped by {how} during the {during} phase",
                "phase": during,
                "signal": signum,
            }
            print(
                f"interrupted: the run stopped during the {during} phase; record in {run_dir}",
                file=sys.stderr,
            )
            result = _finish(
                run_dir, cfg, meta, track, phases, manifest, ledger, t_pipeline, status=Status.INTERRUPTED
            )
    print(f"[log] {finish_tracking(tracker, run_dir, result)}", flush=True)  # after the verdict
    return result


def score_progress(eval_deadline_s: float) -> Callable[[float], str]:
    """The score phase's progress line: seconds so far and what is left of the eval budget (with its grace)."""

    def line(elapsed_s: float) -> str:
        if not math.isfinite(eval_deadline_s):
            return f"[score] {elapsed_s:.0f} s (untimed)"
        return (
            f"[score] {elapsed_s:.0f} s; {max(eval_deadline_s - elapsed_s, 0):.0f} s of the eval budget left"
        )

    return line


def choose_launch_threads(
    launch: LaunchConfig, device: str, measure: Callable[[], dict[str, Any]] = measure_load
) -> tuple[LaunchConfig, dict[str, Any] | None]:
    """On CPU, the torch threads per rank: launch.threads where set, else from the cores other processes
    leave free over a short window (harness/run/load.py choose_threads); the launch to train with and the
    record of the choice (None on CUDA, where the ranks' threads only feed the GPU)."""
    if device != "cpu":
        return launch, None
    if launch.threads:
        return launch, threads_set(launch.threads)
    rec = choose_threads(measure(), launch.nproc_per_node)
    return dataclasses.replace(launch, threads=rec["threads_per_rank"]), rec


def _phases(
    submission_dir: Path,
    run_dir: Path,
    cfg: ResolvedConfig,
    meta: dict[str, Any],
    track: Track,
    phases: dict[str, Any],
    manifest: Manifest,
    data_root: Path,
    folder: dict[str, Any],
    device: str,
    ledger: str | Path | None,
    t_pipeline: float,
    tracker: Tracker | None = None,
    private: Sequence[str | Path] = (),
) -> dict[str, Any]:
    run_cfg = cfg.section("run")
    budget = cfg.section("budget")
    launch: LaunchConfig = cfg.section("launch")
    problem = official_data_problem(track, phases["data"])
    if problem:
        phases["data"]["problem"] = problem
        print(f"data refused: {problem}", file=sys.stderr)
        return _finish(
            run_dir, cfg, meta, track, phases, manifest, ledger, t_pipeline, status=Status.INVALID_DATA
        )
    print(
        f"[data] {data_root} ({manifest.split_tokens('train'):,} train / {manifest.split_tokens('val'):,} val tokens)",
        flush=True,
    )
    phases["folder"] = folder
    if folder["status"] != Status.OK:  # a verdict on the entry (illegal, over_cap), never a traceback
        print(f"folder refused: {folder['detail']}", file=sys.stderr)
        return _finish(
            run_dir, cfg, meta, track, phases, manifest, ledger, t_pipeline, status=folder["status"]
        )
    # the scorer would refuse this code after training: say so before spending the training budget
    problems = lint_scored_code(submission_dir)
    if problems:
        phases["code_check"] = {"status": Status.ILLEGAL, "problems": problems}
        detail = "code check failed: the scorer refuses this submission's scored code:\n  " + "\n  ".join(
            problems[:12]
        )
        print(detail, file=sys.stderr)
        return _finish(run_dir, cfg, meta, track, phases, manifest, ledger, t_pipeline, status=Status.ILLEGAL)

    launch, threads = choose_launch_threads(launch, device)
    if threads is not None:
        print(f"[threads] {describe_threads(threads)}", flush=True)

    with tempfile.TemporaryDirectory(prefix="pgolf-views-") as views_tmp:
        views = Path(views_tmp)
        # ---- 2. train ----
        if tracker is not None:  # tailed by a thread as rank 0 appends to it (train_phase.py's OUT)
            tracker.follow(views / "train-phase" / "out" / METRICS_FILE)
        # staged in its own folder (train view, submission copy, spec), sandboxed, supervised: harness/run/train_phase.py
        phases["train"] = run_train_phase(
            submission_dir=submission_dir,
            data_root=data_root,
            run_dir=run_dir,
            stage_root=views,
            model_config=cfg.model,
            hparams=cfg.train,
            seed=run_cfg.seed,
            budget=budget,
            launch=launch,
            device=device,
            train_shards=cfg.section("data").train_shards,
            base_env=_subprocess_env(),
            gptq=_gptq_spec(cfg.section("pack")),
            private=[ledger_path(run_dir, ledger).parent, *map(Path, private)],
        )
        if threads is not None:
            phases["train"]["threads"] = threads
        if phases["train"]["status"] != Status.OK:
            return _finish(
                run_dir,
                cfg,
                meta,
                track,
                phases,
                manifest,
                ledger,
                t_pipeline,
                status=phases["train"]["status"],
                hint=_tail(run_dir / "train.log"),
            )
        if (
            phases["train"].get("role") == "secondary_node"
        ):  # several nodes: the node of global rank 0 packs and scores
            write_json_atomic(
                run_dir / "train_phase.json",
                {"format": "pg-train-phase", "format_version": 1, **phases["train"]},
            )
            print(
                f"[train] done on this node (not the node of rank 0); its record: {run_dir / 'train_phase.json'}",
                flush=True,
            )
            return {"status": Status.OK, "role": "secondary_node", "phases": phases}

        # ---- 3. pack ----
        artifact = run_dir / "artifact.pgolf"
        packed = stage_folder(submission_dir, views / "packed_code", cap_bytes=track.cap_bytes).dest
        cmd = pack_command(
            run_dir / STATE_FILE, Path(packed), artifact, codec=cfg.section("pack").codec,
            cap_bytes=track.cap_bytes, json_out=run_dir / "pack.json",
        )  # fmt: skip
        sealed_pack = cfg.section("pack").codec == "submission"
        if sealed_pack:  # its encode is training-side code: on the clock, sandboxed
            returncode, sealed = run_sealed_pack(
                run_dir=run_dir,
                submission_dir=Path(packed),  # the staged copy: what is counted is what runs
                data_root=data_root,
                budget=budget,
                launch=launch,
                train_time_s=phases["train"]["train_time_s"],
                cap_bytes=track.cap_bytes,
                log_path=run_dir / "pack.log",
                base_env=_subprocess_env(),
                private=[ledger_path(run_dir, ledger).parent, *map(Path, private)],
            )
            phases["train"]["codec_encode"] = sealed
            pack_wall_s = sealed["wall_s"]
            if sealed["status"] != Status.OK:
                phases["train"].update(status=sealed["status"], detail=sealed.get("detail", ""))
                return _finish(
                    run_dir, cfg, meta, track, phases, manifest, ledger, t_pipeline, status=sealed["status"]
                )
        else:
            t_pack = time.monotonic()
            returncode = _run_phase("pack", cmd, run_dir / "pack.log")
            pack_wall_s = time.monotonic() - t_pack
        if not (run_dir / "pack.json").is_file() or not artifact.is_file():
            what = "no pack.json" if not (run_dir / "pack.json").is_file() else "no artifact"
            phases["pack"] = {
                "status": Status.ERROR,
                "detail": f"the pack wrote {what}",
                "log_tail": _tail(run_dir / "pack.log"),
            }
            return _finish(
                run_dir, cfg, meta, track, phases, manifest, ledger, t_pipeline, status=Status.ERROR
            )
        try:
            phases["pack"] = PackRecord.from_json(
                read_json(run_dir / "pack.json", what="pack.json")
            ).to_json()
        except ValueError as e:  # written by the pack process (for a custom codec, beside submitted code)
            phases["pack"] = {"status": Status.ERROR, "detail": f"pack.json: {e}"}
            return _finish(
                run_dir, cfg, meta, track, phases, manifest, ledger, t_pipeline, status=Status.ERROR
            )
        # every figure from this side: the artifact's bytes and hash from the file, the code's from the staged copy
        measured, disagree = measure_pack(phases["pack"], artifact, Path(packed), track.cap_bytes)
        phases["pack"] = {**phases["pack"], **measured, "wall_s": pack_wall_s}
        if sealed_pack:  # its clock is the orchestrator's (run_sealed_pack), never the record's own figure
            encode = phases["train"]["codec_encode"]
            phases["pack"].update(
                encode_time_s=encode["encode_clock_s"],
                reported_encode_time_s=encode["reported_encode_time_s"],
            )
        if disagree:
            # written by the process that ran the submission's codec (illegal), or by the harness's own pack (error)
            phases["pack"].update(
                status=Status.ILLEGAL if sealed_pack else Status.ERROR,
                detail="the pack record disagrees with the artifact on disk: " + "; ".join(disagree),
            )
            return _finish(
                run_dir,
                cfg,
                meta,
                track,
                phases,
                manifest,
                ledger,
                t_pipeline,
                status=phases["pack"]["status"],
            )
        keep_packed_code(views / "packed_code", phases["pack"]["code_files"], run_dir / "code")
        if not phases["pack"]["within_cap"]:
            return _finish(
                run_dir, cfg, meta, track, phases, manifest, ledger, t_pipeline, status=Status.OVER_CAP
            )
        if returncode != 0:
            phases["pack"].update(
                status=Status.ERROR, detail=f"the pack process exited with status {returncode}"
            )
            return _finish(
                run_dir, cfg, meta, track, phases, manifest, ledger, t_pipeline, status=Status.ERROR
            )

        # ---- 4. score ----
        staged = stage_model_code(submission_dir, views / "model_code", cap_bytes=track.cap_bytes)
        val_view = make_split_view(data_root, views / "val", "val")
        ev = cfg.section("eval").to_eval_config(track)
        score_out = views / "score_out" / "score.json"  # the one folder the confined scorer may write
        score_out.parent.mkdir()
        eval_deadline_s = track.eval_budget_s + budget.grace_s
        score_threads, score_choice = os.cpu_count() or 1, None
        if threads is not None and threads["chosen_by"] == "load":  # measured again: the load moves
            score_choice = choose_threads(measure_load(), 1)
            score_threads = score_choice["threads_per_rank"]
            print(f"[threads] scoring: {describe_threads(score_choice)}", flush=True)
        request = ScoreRequest(
            artifact=artifact,
            code_dir=staged,
            data_dir=val_view,
            eval=ev,
            device=device,
            threads=score_threads,
            sandbox=launch.sandbox,  # the model worker's: off only when the whole run is unsandboxed (recorded)
            confine=launch.sandbox != "off",
            protect=(data_root,),
            # the other runs, the ledger
            private=(run_dir.parent, ledger_path(run_dir, ledger).parent, *map(Path, private)),
            eval_budget_s=eval_deadline_s,
            allow_missing_layers=parse_layers(launch.allow_missing_layers),
            json_out=score_out,
            # on a GPU node the windows go over as many GPUs as trained (one worker each); CPU: one worker
            scoring_workers=launch.nproc_per_node if device.startswith("cuda") else 1,
        )
        cmd = [sys.executable, "-m", "scoring", *request.to_argv()]
        outer_s = eval_deadline_s + SCORER_STARTUP_S if math.isfinite(eval_deadline_s) else None
        load_start = read_load()  # the machine's load over scoring (harness/run/load.py), at its two ends
        returncode = _run_phase(
            "score", cmd, run_dir / "score.log", timeout_s=outer_s, progress=score_progress(eval_deadline_s)
        )
        score_load = load_between(load_start, read_load())
        record: ScoreRecord | ScoreFailure | None = None
        malformed = ""
        if score_out.is_file():
            try:
                record = read_score_record(read_json(score_out, what="score.json"))
            except ValueError as e:
                malformed = f"score.json: {e}"
        if returncode != 0 or not isinstance(record, ScoreRecord):
            # the verdict is the scorer's exit status and its record's status field, never a search of its log
            status: str = (
                STATUS_OF_EXIT.get(returncode, Status.ERROR)
                if returncode is not None
                else Status.OVER_EVAL_BUDGET
            )
            if isinstance(record, ScoreFailure) and record.status in EXIT_CODES:
                status = record.status
            elif status == Status.OK:  # exit 0 without a readable score
                status = Status.ERROR
            detail = (record.detail if isinstance(record, ScoreFailure) else "") or malformed
            if isinstance(record, ScoreFailure) and record.origin != "submission":
                detail = f"a harness failure, not the entry's ({record.origin}): {detail}"
            detail = detail or (
                f"the scorer wrote no readable record (exit status {returncode})"
                if returncode is not None
                else f"the scorer was killed at its deadline ({outer_s:.0f} s)"
            )
            phases["score"] = {
                "status": status,
                "detail": f"{cause_line(detail)} (the whole output: {run_dir / 'score.log'})",
                "origin": record.origin if isinstance(record, ScoreFailure) else "scorer",
                "returncode": returncode,
                "machine_load": score_load,
                "threads_choice": score_choice,
            }
            return _finish(run_dir, cfg, meta, track, phases, manifest, ledger, t_pipeline, status=status)
        phases["score"] = record.to_json()
        write_json_atomic(run_dir / "score.json", phases["score"])
        phases["score"] = {
            **phases["score"],
            "machine_load": score_load,
            "threads_choice": score_choice,
        }  # the harness's
        status = Status.OK
        return _finish(run_dir, cfg, meta, track, phases, manifest, ledger, t_pipeline, status=status)


def _short(value: Any, limit: int = 80) -> str:
    text = json.dumps(value, sort_keys=True) if not isinstance(value, str) else value
    return text if len(text) <= limit else text[: limit - 1] + "…"


def measure_pack(
    pack: dict[str, Any], artifact: Path, packed: Path, cap_bytes: int
) -> tuple[dict[str, Any], list[str]]:
    """The pack's figures as this process measures them, and where the pack record says otherwise.

    The artifact's size and sha256 come from the file on disk (lstat: a regular file), the counted code's
    files, sha256 and bytes from the staged copy that was packed, and the cap verdict from those; the
    artifact header's own record of the code must name the same files. A pack record is written by the
    pack process, which for a custom codec runs submitted code: it is compared, never believed."""
    st = os.lstat(artifact)
    if not stat.S_ISREG(st.st_mode):
        raise ValueError(f"{artifact} is not a regular file")
    files = counted_files(packed)
    n_code, n_model = code_bytes(packed, files), st.st_size
    measured: dict[str, Any] = {
        "artifact_sha256": sha256_file(artifact),
        "code_files": files,
        "bytes_code": n_code,
        "bytes_model": n_model,
        "bytes_total": n_code + n_model,
        "cap_bytes": cap_bytes,
    }
    measured["within_cap"] = measured["bytes_total"] <= cap_bytes
    disagree = [
        f"{k} {_short(pack.get(k))} in the record, {_short(v)} measured"
        for k, v in measured.items()
        if pack.get(k) != v
    ]
    try:
        header_files = read_artifact(artifact).header.get("code_files")
    except ArtifactError as e:
        header_files = f"unreadable ({e})"
    if header_files != files:
        disagree.append(f"the artifact header's code files {_short(header_files)}, {_short(files)} counted")
    measured["measured_by"] = "orchestrator"
    if disagree:
        measured["reported"] = {k: pack.get(k) for k in measured if k in pack and pack.get(k) != measured[k]}
    return measured, disagree


def plot_title(name: Any, track: str, preset: Any, seed: Any) -> str:
    """The training plot's title: the name is data, escaped and bounded (a 60,000-character name cost 36 s)."""
    return f"{visible(name, NAME_MAX_CHARS)} · {track} · preset {visible(preset, 40)} · seed {seed}"


def ledger_path(run_dir: Path, ledger: str | Path | None) -> Path:
    """The results ledger a run appends to: `ledger`, else ledger.jsonl beside the run's folder. Its folder is out of
    every sandboxed phase's broad read rules, as the other runs beside this one are."""
    return (Path(ledger) if ledger else run_dir.parent / "ledger.jsonl").absolute()


def _finish(
    run_dir, cfg, meta, track, phases, manifest, ledger, t_pipeline, *, status: str, hint: str = ""
) -> dict[str, Any]:
    if "train" in phases:  # drawn after training, off the clock; a plot that fails is noted, never a verdict
        seed = cfg.tables["run"]["seed"]
        title = plot_title(meta.get("name") or run_dir.name, track.name, cfg.preset, seed)
        budget_s = cfg.tables.get("budget", {}).get("train_s")
        phases["plot"] = plot_run(
            run_dir,
            phases,
            title=title,
            budget_s=budget_s if isinstance(budget_s, int | float) else None,
            status=status,
        )
    ledger_file = ledger_path(run_dir, ledger)
    try:
        result = build_result(
            run_dir,
            cfg,
            meta,
            track,
            phases,
            manifest,
            status=status,
            pipeline_s=time.perf_counter() - t_pipeline,
        )
        write_result(run_dir, result, ledger_file)
    except Exception as e:  # noqa: BLE001 - a record whose parts cannot be written still ends the run with one
        result = minimal_result(
            run_dir,
            cfg,
            meta,
            track,
            status=Status.ERROR,
            detail=cause_line(f"the result could not be built: {e}"),
        )
        write_result(run_dir, result, ledger_file)
    print_card(result)
    if status != Status.OK and hint:
        print(f"--- last lines of {run_dir / 'train.log'} ---\n{hint}", file=sys.stderr)
    return result
