"""`pgolf verify RESULT_OR_RUN_DIR`: recompute every hash of a result's receipt and re-score its artifact.

    pgolf verify RUN_DIR... [--submission DIR] [--data DIR] [--device D] [--tol-bpb X] [--ledger FILE] [--json]
                 [--executor inline|local|slurm] [--partition P] [--time-min M] [--cpus N] [--gpus N] ...

Many folders: each is verified (inline: here, one after another; local or slurm: one job per result
through submitit, harness/records/executors.py, which says what a job may report and how the
verdict is decided on this side); one line per verdict, its differences, and a count; the exit
status is 1 when any failed.

Checks, each printed with what the result says and what was found:
- the artifact's sha256 (the receipt, the pack record and the score record all name it), its size
  (bytes_model), the code bytes and their sum (bytes_total), and the cap verdict;
- every counted code file's sha256, with no counted file missing or added, and the artifact
  header's own record of the code (the artifact binds the code it was packed with);
- the data manifest's and the tokenizer's sha256;
- a re-score in a fresh process (`python -m scoring score`, the pipeline's own command, with the
  model code staged without train.py and a validation-only view of the data), with the recorded
  mode, sequence length, stride, batch, subset and dtype: val_tokens and val_bytes must be equal,
  val_loss and val_bpb equal within the tolerance (default 1e-6; a re-score on other hardware
  may need more), and the probes must pass again.

The model code comes from --submission, else RUN_DIR/code (when the runner keeps a copy), else the
result's provenance.submission_dir, else the folder named in RUN_DIR/train_spec.json. Only this command sets a result's
`verification` ("verified" or "failed"): it rewrites result.json with the verdict and a
"pg-verification" record, writes RUN_DIR/verification.json, and appends that record to the ledger,
keyed by the sha256 of the result without its verification fields (`result_digest`), so the
leaderboard ranks a ledger line only when a verification record for exactly that result exists.
The command (its flags, inline or on an executor) is harness/records/verify_cli.py.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
import traceback
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from data.io import read_json, sha256_file, write_json_atomic
from data.manifest import MANIFEST_NAME, load_manifest, make_split_view
from harness.config import TRACK_KEYS
from harness.run.datacheck import data_identity, official_data_problem
from harness.run.staging import FolderRefused, stage_folder, stage_model_code
from isolation.sandbox import parse_layers
from scoring.artifact.cap import code_bytes, counted_files
from scoring.artifact.format import ArtifactError, read_artifact
from scoring.score.cli import ScoreRequest
from scoring.score.eval_config import EvalConfig
from scoring.score.record import ScoreFailure, cause_line, read_score_record, unscored_targets_problem
from scoring.statuses import FAILED, SCORED, VERIFIED, VERIFY_ERROR
from scoring.tracks import TRACKS, subset_problem

VERIFY_FORMAT = "pg-verification"
VERIFY_FORMAT_VERSION = 1
VERIFICATION_FIELDS = ("verification", "verification_record")
ARTIFACT_FILE = "artifact.pgolf"
NOT_SCORED = "result has a score"
"""The check a result without a score fails (any status but ok): nothing is re-scored."""


@dataclass(frozen=True, kw_only=True, slots=True)
class VerifyConfig:
    tol_bpb: float = 1e-6
    """Largest |Δ val_bpb| (bits/byte) and |Δ val_loss| (nats/token) accepted from the re-score."""
    device: str | None = None
    """Re-score device; None: the device the result was scored on."""
    threads: int = 0
    """Torch threads of the re-score (0: the thread count the result recorded)."""
    timeout_s: float = 6 * 3600.0
    allow_missing_layers: tuple[str, ...] = ()
    """Isolation layers the verifying official accepts as missing on this machine (the re-score's model
    workers run under the track's sandbox rule, 'required' on record tracks); recorded in the re-score."""
    scoring_workers: int | None = None
    """Model workers of the re-score; None: as many as the result was scored with (`scoring_workers` of its score
    record). With score-first adaptation they form a group whose size the bits depend on; with fewer GPUs than
    that, another count re-scores it, and the difference is then the tolerance's to judge."""

    def __post_init__(self) -> None:
        parse_layers(self.allow_missing_layers, "--allow-missing-layer")
        if self.scoring_workers is not None and self.scoring_workers < 1:
            raise ValueError(f"--scoring-workers must be >= 1, got {self.scoring_workers}")
        if not self.tol_bpb >= 0:
            raise ValueError(f"--tol-bpb must be >= 0, got {self.tol_bpb}")
        if self.threads < 0 or self.timeout_s <= 0:
            raise ValueError(
                f"threads must be >= 0 and timeout_s positive, got {self.threads}, {self.timeout_s}"
            )


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    expected: Any
    actual: Any

    def line(self) -> str:
        mark = "ok  " if self.ok else "DIFF"
        return f"  {mark} {self.name}: result says {self.expected!r}, found {self.actual!r}"


def result_digest(result: dict[str, Any]) -> str:
    """sha256 of the result's canonical JSON without its verification fields (how the ledger keys it)."""
    core = {k: v for k, v in result.items() if k not in VERIFICATION_FIELDS}
    return hashlib.sha256(
        json.dumps(core, sort_keys=True, separators=(",", ":"), allow_nan=False).encode()
    ).hexdigest()


def locate(path: str | os.PathLike[str]) -> tuple[Path, Path]:
    """(result.json, run folder) from either, absolute (the re-score's processes run in folders of their own)."""
    p = Path(path).absolute()
    result_path = p / "result.json" if p.is_dir() else p
    if not result_path.is_file():
        raise FileNotFoundError(f"no result at {result_path}; pass a run folder or its result.json")
    return result_path, result_path.parent


def code_folder(
    run_dir: Path, submission: str | os.PathLike[str] | None, result: dict[str, Any]
) -> Path | None:
    """--submission, else RUN_DIR/code, else provenance.submission_dir, else train_spec.json's folder."""
    if submission is not None:
        if not Path(submission).is_dir():
            raise FileNotFoundError(
                f"--submission {submission} is not a folder; pass the submission folder the result was packed from"
            )
        return Path(submission).absolute()
    if (run_dir / "code").is_dir():
        return run_dir / "code"
    recorded = (result.get("provenance") or {}).get("submission_dir")
    if recorded and Path(recorded).is_dir():
        return Path(recorded)
    spec = run_dir / "train_spec.json"
    if spec.is_file():
        folder = read_json(spec, what="train spec").get("submission_dir")
        if folder and Path(folder).is_dir():
            return Path(folder)
    return None


def _check(checks: list[Check], name: str, expected: Any, actual: Any) -> None:
    checks.append(Check(name, expected == actual, expected, actual))


def _code_checks(checks: list[Check], result: dict[str, Any], files: dict[str, str], code_dir: Path) -> None:
    for rel, want in sorted(files.items()):
        p = code_dir / rel
        _check(checks, f"code {rel} sha256", want, sha256_file(p) if p.is_file() else "missing")
    _check(checks, "counted code files", sorted(files), sorted(counted_files(code_dir)))
    present = {rel: want for rel, want in files.items() if (code_dir / rel).is_file()}
    _check(checks, "bytes_code", result.get("bytes_code"), code_bytes(code_dir, present))


def receipt_checks(
    result: dict[str, Any], run_dir: Path, code_dir: Path | None, data_dir: Path | None
) -> list[Check]:
    """Recompute every hash and byte count of the receipt; one Check per fact."""
    prov = result.get("provenance") or {}
    pack = (result.get("phases") or {}).get("pack") or {}
    score = (result.get("phases") or {}).get("score") or {}
    checks: list[Check] = []
    artifact = run_dir / ARTIFACT_FILE
    if not artifact.is_file():
        checks.append(Check("artifact file", False, str(artifact), "missing"))
    else:
        digest = sha256_file(artifact)
        _check(checks, "artifact sha256 (receipt)", prov.get("artifact_sha256"), digest)
        _check(checks, "artifact sha256 (score record)", score.get("artifact_sha256"), digest)
        _check(checks, "bytes_model (artifact size)", result.get("bytes_model"), artifact.stat().st_size)
        try:
            header_code = read_artifact(artifact).header.get("code_files")
        except ArtifactError as e:
            header_code = f"unreadable: {e}"
        _check(checks, "code files bound in the artifact header", prov.get("code_files"), header_code)
    files: dict[str, str] = prov.get("code_files") or {}
    if code_dir is None:
        checks.append(
            Check("code folder", False, "the submission's code", "not found; pass --submission DIR")
        )
    else:
        with tempfile.TemporaryDirectory(prefix="pgolf-verify-code-") as tmp:
            try:  # a shipped code bundle is compared as it was packed: expanded beside itself
                staged = stage_folder(code_dir, Path(tmp) / "code").dest
            except (FolderRefused, OSError) as e:
                checks.append(Check("code folder stages", False, "the folder rules hold", str(e)))
            else:
                _code_checks(checks, result, files, Path(staged))
    if artifact.is_file():
        total = sum(int(result.get(k) or 0) for k in ("bytes_code", "bytes_model"))
        _check(checks, "bytes_total = bytes_code + bytes_model", result.get("bytes_total"), total)
        _check(checks, "within_cap", result.get("within_cap"), total <= int(result.get("cap_bytes") or 0))
    _check(
        checks,
        "pack record agrees",
        [pack.get(k) for k in ("artifact_sha256", "bytes_total")],
        [prov.get("artifact_sha256"), result.get("bytes_total")],
    )
    if data_dir is None or not (data_dir / MANIFEST_NAME).is_file():
        checks.append(Check("data folder", False, prov.get("data_dir"), "not found; pass --data DIR"))
    else:
        _check(
            checks,
            "data manifest sha256",
            prov.get("data_manifest_sha256"),
            sha256_file(data_dir / MANIFEST_NAME),
        )
        _check(
            checks,
            "tokenizer sha256",
            prov.get("tokenizer_sha256"),
            sha256_file(load_manifest(data_dir).tokenizer_path),
        )
    return checks


def track_checks(result: dict[str, Any], data_dir: Path | None, data_given: bool) -> list[Check]:
    """The result held to its track's rules, derived from scoring/tracks.py, never from the result's claims:
    the cap, the eval subset, every track-set config value, the training budget it claims to have kept, and
    on a record track the official dataset, named by the verifier (--data), not by the result."""
    track = TRACKS.get(str(result.get("track")))
    if track is None:
        return [Check("track is one this harness knows", False, sorted(TRACKS), result.get("track"))]
    checks: list[Check] = []
    score = (result.get("phases") or {}).get("score") or {}
    tables = result.get("config") or {}  # the resolved tables, as the run recorded them
    _check(checks, f"cap is the track's ({track.name})", track.cap_bytes, result.get("cap_bytes"))
    if not track.record:  # an unranked track's rules may be loosened (config.json records how)
        return checks
    _check(checks, f"eval subset is the track's ({track.name})", None, subset_problem(track, score))
    for key, of_track in TRACK_KEYS.items():
        section, _, name = key.partition(".")
        _check(checks, f"config {key} is the track's", of_track(track), (tables.get(section) or {}).get(name))
    if (
        track.device != "auto"
    ):  # the CPU track: trained (and so scored) on the CPU, as the run's launch records
        train = (result.get("phases") or {}).get("train") or {}
        _check(
            checks,
            f"trained on the track's device ({track.device})",
            track.device,
            (train.get("launch") or {}).get("device"),
        )
    budget_s = (tables.get("budget") or {}).get("train_s")
    _check(
        checks,
        "budget.train_s within the track's",
        True,
        isinstance(budget_s, int | float) and budget_s <= track.train_budget_s,
    )
    _check(checks, "every target of its tokens scored (mode aside)", None, unscored_targets_problem(score))
    _check(checks, "dataset named by the verifier (--data), not by the result", True, data_given)
    if data_dir is not None and (data_dir / MANIFEST_NAME).is_file():
        problem = official_data_problem(track, data_identity(load_manifest(data_dir)))
        _check(
            checks, f"official dataset ({track.documents.name if track.documents else 'any'})", None, problem
        )
    return checks


def rescore_request(
    result: dict[str, Any],
    artifact: Path,
    staged: Path,
    val_view: Path,
    out: Path,
    data_dir: Path,
    cfg: VerifyConfig,
) -> ScoreRequest:
    """The run's own score request again (scoring/score/cli.py's ScoreRequest: one builder for run and verify)."""
    score = result["phases"]["score"]
    ev = (result.get("config") or {}).get("eval") or {}
    track = TRACKS.get(str(result.get("track")))
    docs = score.get("eval_subset_docs") or None
    subset = (
        {"max_tokens": track.eval_max_tokens, "max_docs": track.eval_max_docs}
        if track is not None and track.record
        else {"max_tokens": None, "max_docs": docs}
        if docs
        else {"max_tokens": score.get("eval_subset_max_tokens") or None, "max_docs": None}
    )
    eval_cfg = EvalConfig(
        mode=str(score["eval_mode"]),
        seq_len=int(score["eval_seq_len"]),
        batch_seqs=int(score.get("eval_batch_seqs") or ev.get("batch_seqs") or 32),
        # a record track's own subset (track_checks fails a result that claims another); a cut by documents is
        # resolved again on the verifier's dataset
        **subset,
        dtype=str(score["eval_dtype"]),
        stride=score.get("eval_stride") if score["eval_mode"] != "standard" else None,
        adapt_chunk_tokens=int(ev.get("adapt_chunk_tokens") or EvalConfig().adapt_chunk_tokens),
    )
    return ScoreRequest(
        artifact=artifact,
        code_dir=staged,
        data_dir=val_view,
        eval=eval_cfg,
        device=cfg.device or str(score.get("device") or "cpu"),
        threads=cfg.threads or int(score.get("threads") or 0),
        sandbox=verify_sandbox(result),
        protect=(data_dir,),
        private=(artifact.parent.parent,),  # the folder of the run under check: other runs, the ledger
        allow_missing_layers=cfg.allow_missing_layers,
        json_out=out,
        scoring_workers=cfg.scoring_workers or recorded_scoring_workers(result),
    )


MAX_RECORDED_SCORING_WORKERS = 8
"""The most model workers a re-score starts on a result's own word (a node's GPUs); `--scoring-workers` may ask
for more. A result.json is the submitter's file: a figure of its own never starts a thousand processes here."""


def recorded_scoring_workers(result: dict[str, Any]) -> int:
    """The model workers the result was scored with (one in records from before the count, or where the figure is
    not a count), at most MAX_RECORDED_SCORING_WORKERS."""
    k = ((result.get("phases") or {}).get("score") or {}).get("scoring_workers")
    return (
        min(k, MAX_RECORDED_SCORING_WORKERS)
        if isinstance(k, int) and not isinstance(k, bool) and k >= 1
        else 1
    )


def verify_sandbox(result: dict[str, Any]) -> str:
    """The model workers' sandbox rule for a re-score: the track's ('required' on a record track), never
    looser than the run's own; 'auto' for a track this harness does not know."""
    track = TRACKS.get(str(result.get("track")))
    return track.sandbox if track is not None else "auto"


class HarnessFailure(RuntimeError):
    """The verification could not be carried out for a reason that is the harness's, not the entry's: the
    re-score's scorer refused its input (exit 2), failed itself, or left no readable record. `log` holds the
    whole output, for verify_error.log."""

    def __init__(self, message: str, log: str = ""):
        super().__init__(message)
        self.log = log


def rescore(
    result: dict[str, Any], run_dir: Path, code_dir: Path, data_dir: Path, cfg: VerifyConfig
) -> tuple[dict[str, Any] | None, str]:
    """Score the artifact again in a fresh process; (score record, or None when the entry's re-score failed,
    and the process's output tail). HarnessFailure when the failure is the harness's (see the class)."""
    with tempfile.TemporaryDirectory(prefix="pgolf-verify-") as tmp:
        t = Path(tmp)
        staged = t / "model_code"
        stage_model_code(code_dir, staged)
        view = make_split_view(data_dir, t / "val", "val")
        out = (
            t / "out" / "score.json"
        )  # the confined scorer may write beneath out/ only, never beside the view
        out.parent.mkdir()
        env = dict(os.environ)
        root = str(Path(__file__).resolve().parents[2])
        env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        request = rescore_request(result, run_dir / ARTIFACT_FILE, staged, view, out, data_dir, cfg)
        proc = subprocess.run(
            [sys.executable, "-m", "scoring", *request.to_argv()],
            capture_output=True,
            text=True,
            env=env,
            timeout=cfg.timeout_s,
            check=False,
        )
        output = proc.stdout + proc.stderr
        tail = output[-3000:]
        if not out.is_file():
            raise HarnessFailure(f"the re-score wrote no record (exit status {proc.returncode})", output)
        try:
            record = read_score_record(read_json(out, what="re-score record"))
        except ValueError as e:  # a malformed score.json: the scorer is the harness's
            raise HarnessFailure(f"the re-score's score.json is malformed: {e}", output) from None
        if isinstance(record, ScoreFailure) and (record.origin != "submission" or proc.returncode == 2):
            raise HarnessFailure(f"the re-score failed ({record.origin}): {record.detail}", output)
        if isinstance(record, ScoreFailure):  # the entry's own failure on re-scoring: a verdict
            return None, f"re-score {record.status}: {record.detail}"
        if proc.returncode != 0:
            raise HarnessFailure(
                f"the re-score wrote a score but exited with status {proc.returncode}", output
            )
        return record.to_json(), tail


def score_checks(
    result: dict[str, Any], new: dict[str, Any] | None, tail: str, cfg: VerifyConfig
) -> list[Check]:
    if new is None:
        return [Check("re-score in a fresh process", False, "a score", f"failed: {tail.strip()[-800:]}")]
    old = result["phases"]["score"]
    checks: list[Check] = []
    for k in ("val_tokens", "val_bytes", "eval_mode", "eval_seq_len", "eval_windows"):
        _check(checks, f"re-score {k}", old.get(k), new.get(k))
    for k in ("val_loss", "val_bpb"):
        a, b = result.get(k), new.get(k)
        ok = isinstance(a, float | int) and isinstance(b, float | int) and abs(a - b) <= cfg.tol_bpb
        checks.append(Check(f"re-score {k} (tolerance {cfg.tol_bpb:g})", ok, a, b))
    _check(checks, "re-score probes passed", True, bool((new.get("probes") or {}).get("passed")))
    return checks


def append_ledger(ledger: Path, record: dict[str, Any]) -> None:
    ledger.parent.mkdir(parents=True, exist_ok=True)
    with open(ledger, "a", encoding="utf-8") as f:
        fcntl.flock(f, fcntl.LOCK_EX)  # one whole line per record, even with concurrent writers
        f.write(json.dumps(record, sort_keys=True, allow_nan=False) + "\n")
        fcntl.flock(f, fcntl.LOCK_UN)


def read_result(path: str | os.PathLike[str]) -> tuple[Path, Path, dict[str, Any]]:
    """(result.json, run folder, the result) from either path; a user error when it is not a pg-result."""
    result_path, run_dir = locate(path)
    result = read_json(result_path, what="result")
    if not isinstance(result, dict):  # a forged or broken claim: a JSON array, a number
        raise ValueError(
            f"{result_path} is not a pg-result record (a JSON {type(result).__name__}, not an object); "
            "pass the result.json a run wrote"
        )
    if result.get("format") != "pg-result":
        raise ValueError(f"{result_path} is not a pg-result record (format {result.get('format')!r})")
    return result_path, run_dir, result


def resolve_inputs(
    run_dir: Path,
    result: dict[str, Any],
    submission: str | os.PathLike[str] | None,
    data: str | os.PathLike[str] | None,
) -> tuple[Path | None, Path | None]:
    """(code folder, data folder) the verification reads; None where not found (a failed check)."""
    code_dir = code_folder(run_dir, submission, result)
    if data is not None and not (Path(data) / MANIFEST_NAME).is_file():
        raise FileNotFoundError(f"--data {data} is not a dataset folder (no {MANIFEST_NAME})")
    recorded = (result.get("provenance") or {}).get("data_dir")
    data_dir: Path | None = Path(data).absolute() if data else (Path(recorded) if recorded else None)
    data_dir = data_dir if data_dir is not None and data_dir.is_dir() else None
    return code_dir, data_dir


def entry_checks(
    result: dict[str, Any], run_dir: Path, code_dir: Path | None, data_dir: Path | None, *, data_given: bool
) -> list[Check]:
    """The receipt and track checks (resolve_inputs gives the folders): what every verdict starts from,
    inline, in a job and on the submitting side (harness/records/executors.py)."""
    return receipt_checks(result, run_dir, code_dir, data_dir) + track_checks(result, data_dir, data_given)


def is_scored(result: dict[str, Any]) -> bool:
    """Whether the result has a score to re-score (a scored status and a score phase)."""
    return result.get("status") in SCORED and "score" in (result.get("phases") or {})


def commit_verdict(
    result_path: Path,
    result: dict[str, Any],
    record: dict[str, Any],
    ledger: str | os.PathLike[str] | None,
) -> None:
    """Write a verdict: result.json's verification fields, RUN_DIR/verification.json, and the ledger line
    (the given ledger, else RUN_DIR/../ledger.jsonl when it exists)."""
    run_dir = result_path.parent
    result["verification"] = record["status"]
    result["verification_record"] = {k: v for k, v in record.items() if k != "checks"}
    write_json_atomic(result_path, result)
    write_json_atomic(run_dir / "verification.json", record)
    ledger_path = Path(ledger) if ledger else run_dir.parent / "ledger.jsonl"
    if ledger or ledger_path.is_file():
        append_ledger(ledger_path, record)


def verification_record(
    result: dict[str, Any],
    run_dir: Path,
    code_dir: Path | None,
    data_dir: Path | None,
    cfg: VerifyConfig,
    checks: list[Check],
    *,
    wall_s: float,
) -> dict[str, Any]:
    """The "pg-verification" record of these checks: "verified" exactly when there are checks and all pass."""
    return {
        "format": VERIFY_FORMAT,
        "format_version": VERIFY_FORMAT_VERSION,
        "status": VERIFIED if checks and all(c.ok for c in checks) else FAILED,
        "result_sha256": result_digest(result),
        "run_dir": str(run_dir),
        "verified_unix_s": time.time(),
        "verify_wall_s": wall_s,
        "code_dir": str(code_dir) if code_dir else None,
        "data_dir": str(data_dir) if data_dir else None,
        "tol_bpb": cfg.tol_bpb,
        "differences": [asdict(c) for c in checks if not c.ok],
        "checks": [asdict(c) for c in checks],
    }


def verify_result(
    path: str | os.PathLike[str],
    *,
    submission: str | os.PathLike[str] | None = None,
    data: str | os.PathLike[str] | None = None,
    cfg: VerifyConfig | None = None,
    ledger: str | os.PathLike[str] | None = None,
    write: bool = True,
) -> dict[str, Any]:
    """Verify one result; returns the "pg-verification" record: "verified" or "failed" (a verdict, written
    when `write`), or "error" (the harness could not verify it: never written over the earlier verdict)."""
    cfg = cfg or VerifyConfig()
    result_path, run_dir, result = read_result(path)
    t0 = time.perf_counter()
    code_dir, data_dir = resolve_inputs(run_dir, result, submission, data)
    try:
        checks = entry_checks(result, run_dir, code_dir, data_dir, data_given=data is not None)
        if not is_scored(result):
            checks.append(Check(NOT_SCORED, False, "a scored result", f"status {result.get('status')!r}"))
        elif code_dir is not None and data_dir is not None and (run_dir / ARTIFACT_FILE).is_file():
            try:
                new, tail = rescore(result, run_dir, code_dir, data_dir, cfg)
            except HarnessFailure as e:
                if all(c.ok for c in checks):  # nothing found against the entry: no verdict can be given
                    return harness_error(run_dir, str(e), e.log, time.perf_counter() - t0)
                new, tail = None, f"a harness failure: {e}"  # a difference already found is the verdict
            checks += score_checks(result, new, tail, cfg)
        record = verification_record(
            result, run_dir, code_dir, data_dir, cfg, checks, wall_s=time.perf_counter() - t0
        )
    except Exception as e:  # noqa: BLE001 - the harness's own failure is never a verdict on the entry
        where = traceback.extract_tb(e.__traceback__)[-1:]
        at = f" at {Path(where[0].filename).name}:{where[0].lineno}" if where else ""
        return harness_error(
            run_dir,
            f"the harness failed ({type(e).__name__}{at}): {e}",
            "".join(traceback.format_exception(e)),
            time.perf_counter() - t0,
        )
    if write:
        commit_verdict(result_path, result, record, ledger)
    return record


VERIFY_ERROR_LOG = "verify_error.log"


def harness_error(run_dir: Path, why: str, log: str, wall_s: float) -> dict[str, Any]:
    """The record of a verification the harness could not carry out: status "error", one line naming the
    cause, the whole output or traceback in RUN_DIR/verify_error.log. It is never committed: result.json,
    verification.json and the ledger keep the earlier verdict (scoring/statuses.py VERIFY_ERROR)."""
    log_path: Path | None = run_dir / VERIFY_ERROR_LOG
    try:
        assert log_path is not None
        log_path.write_text(log or why, encoding="utf-8", errors="replace")
    except OSError:
        log_path = None
    return {
        "format": VERIFY_FORMAT,
        "format_version": VERIFY_FORMAT_VERSION,
        "status": VERIFY_ERROR,
        "run_dir": str(run_dir),
        "detail": cause_line(why),
        "log": str(log_path) if log_path else None,
        "verified_unix_s": time.time(),
        "verify_wall_s": wall_s,
        "checks": [],
        "differences": [],
    }


def not_a_result(path: str | os.PathLike[str], e: Exception) -> dict[str, Any]:
    """The error record of a path in a batch that is no result (no result.json, not a pg-result): one line."""
    run_dir = Path(path).absolute()
    run_dir = run_dir.parent if run_dir.name == "result.json" else run_dir
    return {
        "format": VERIFY_FORMAT,
        "format_version": VERIFY_FORMAT_VERSION,
        "status": VERIFY_ERROR,
        "run_dir": str(run_dir),
        "detail": cause_line(str(e)),
        "log": None,
        "verified_unix_s": time.time(),
        "verify_wall_s": 0.0,
        "checks": [],
        "differences": [],
    }
