"""`pgolf check DIR`: the pre-flight of a submission folder, in seconds, before any training.

    pgolf check DIR [--preset P] [--set SECTION.KEY=VALUE ...] [--data DATA] [--json]
    pgolf check --machine      this machine's isolation: per guarantee of a record track's sandbox
                               (isolation/sandbox.py GUARANTEES), the mechanism that holds it or what is
                               missing, and whether a record track can run here (exit 0) or is refused (1)

One line per check, in this order (a check that needs an earlier one's result is skipped when that
one failed, and says so):

    submission   submission.json against its schema, model.py / train.py define their hooks
                 (harness/submission.py check_submission)
    config       config.toml, the preset and the overrides, held to the track's rules, and the data
                 variant against the track: exactly what `pgolf run` validates (harness/config.py
                 validate_run)
    data         with --data only: the dataset against the model's vocab_size, the declared
                 data_variant and the track (harness/run/datacheck.py), as `pgolf run` refuses it
    folder       the folder rules, judged by lstat before a byte is read (harness/run/staging.py
                 inspect_folder: regular files only, no links or bytecode, sizes against the cap)
    lint         the static check of the scored code (scoring/codecheck.py lint_scored_code)
    model        build_model(config) builds and its forward maps a tiny [2, L] int64 batch to
                 [2, L, V] with vocab <= V <= the scorer's limit, run in a confined process
    artifact     the estimated artifact: the initial weights packed with the chosen codec, plus the
                 counted code bytes, against the track's cap (scoring/artifact/pack.py, cap.py); an initial
                 state over STATE_ESTIMATE_MAX_BYTES is not read here (a warning; the run's pack decides)

Exit status: 0 every check passed (ok, or warn: a pass with a caveat); 1 a check failed (or was skipped because one it needs failed);
2 a usage error (no such folder, a malformed --set).

Submitted code runs only in the child process `python -P -B -m scoring.worker.build_check SPEC_JSON`
(scoring/worker/build_check.py, started by `confined_build`, never by hand), confined as the scorer's
model worker is (scoring/worker/confined.py: isolation/sandbox.py's plan with the seccomp filter;
Landlock reads of the staged scored code and the Python installation only, one private temp folder to
write, PID, mount and network namespaces where the machine allows, no capabilities, an address-space
limit, the worker's allow-listed environment). It sees no data: there is none to see. It builds the model, runs the
forward pass, writes the initial state (safetensors, no pickle) and, for `pack.codec = "submission"`,
the codec's encoded payload. This side reads them back without following links and packs the
built-in codec itself. What the child reports is advice, not a verdict: the real boundary is the run.

Two estimates: the initial weights packed (over the cap: FAIL), and the same tensors filled with N(0, 1)
noise (`dense_state`), since trained weights are dense and a fresh model's are not (the naive baseline,
`pgolf check` bytes_total: initial 4,935,372, dense 15,902,930; the reference's trained artifact:
15,863,489, its submission.json's claim); dense over the cap: `warn` (exit 0). An initial state over
STATE_ESTIMATE_MAX_BYTES is not read back at all (`warn`, not estimated): reading and packing it here costs
about 12 times its bytes of this process's memory, and its size is the submitted code's choice.
"""

from __future__ import annotations

import argparse
import json
import os
import stat
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from data.io import read_regular
from scoring.worker.build_check import (
    DENSE_PAYLOAD_FILE,
    PAYLOAD_FILE,
    PREFLIGHT_SPEC_FORMAT,
    PREFLIGHT_SPEC_VERSION,
    REPORT_FILE,
    STATE_FILE,
    dense_state,
)

CHECK_FORMAT = "pg-check"
CHECK_FORMAT_VERSION = 1
REPORT_MAX_BYTES = 1 << 16
BATCH_ROWS = 2
BATCH_MAX_LENGTH = 32
"""The tiny batch: 2 rows of min(eval.seq_len, 32) tokens."""
CHILD_TIMEOUT_S = 120.0
STATE_ESTIMATE_MAX_BYTES = 256 << 20
"""The largest initial state (the child's safetensors file) this process reads and packs for the estimate: reading
costs about 12x its size in memory here, in the official's own process (the queue's triage), which no limit
confines. Over it (4x the cap's bytes in float32 parameters: under 2 bits each to fit) the estimate is skipped with
a warning and the run's pack decides."""
EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2
CHECK_SKIPPED = "skip"
"""A check not run because one it needs failed (a check status, not a run status)."""
PASSING = ("ok", "warn")
"""Statuses that pass: warn is a pass with a caveat in its line (exit status 0)."""

CHECKS = ("submission", "config", "data", "folder", "lint", "model", "artifact")
FIXES = {
    "submission": "edit submission.json (schema: submissions/README.md; `pgolf new` writes a valid one)",
    "config": "edit config.toml or the --set named above (keys, types and track rules: docs/RULES.md)",
    "data": "pass --data a dataset of the model's vocabulary (pgolf data download --variant sp1024), or change [model] vocab_size",
    "folder": "keep only regular source files in the folder (docs/RULES.md, 'The folder')",
    "lint": "scored code may use only the tensors it is given and the allowed imports (submissions/README.md)",
    "model": "fix model.py: build_model(config) -> nn.Module, forward(input_ids [B, L] int64) -> logits [B, L, V]",
    "artifact": "shrink the model ([model] in config.toml) or the code, or use a stronger codec (pack.codec)",
}


@dataclass
class Check:
    name: str
    status: str
    """ok, warn (passes, with a caveat), FAIL, or skip (an earlier check it needs failed)."""
    detail: str
    fix: str = ""
    facts: dict[str, Any] = field(default_factory=dict)

    def line(self) -> str:
        text = f"{self.status:<5} {self.name:<11} {self.detail}"
        return text + (f"\n{'':17} fix: {self.fix}" if self.fix else "")


def vocab_of_variant(variant: str) -> int:
    """The vocabulary size a dataset variant's tokens range over: sp<N> -> N, byte260 -> 260."""
    return 260 if variant == "byte260" else int(variant.removeprefix("sp"))


def one_line(text: object, limit: int = 400) -> str:
    flat = " ".join(str(text).split())
    return flat[:limit] + ("…" if len(flat) > limit else "")


# ---- the trusted side ----


def confined_build(
    code_dir: Path,
    *,
    model_config: dict[str, Any],
    vocab_size: int,
    seq_len: int,
    dtype: str,
    codec: str,
    workdir: Path,
    sandbox: str = "auto",
    timeout_s: float = CHILD_TIMEOUT_S,
) -> tuple[dict[str, Any], Path]:
    """Run the child in the model worker's confinement; returns (its report, the folder it wrote).

    Raises ValueError with one line (the child's last error line) when it fails or times out.
    """
    from scoring.worker.child import default_memory_limit_bytes, exit_how
    from scoring.worker.confined import ConfinedChild, plan_confined

    out = workdir / "child"
    (out / "out").mkdir(parents=True)
    plan = plan_confined(out, [code_dir], sandbox=sandbox)
    spec = {
        "format": PREFLIGHT_SPEC_FORMAT,
        "format_version": PREFLIGHT_SPEC_VERSION,
        "code_dir": str(code_dir),
        "out": str(out / "out"),
        "model_config": model_config,
        "vocab_size": vocab_size,
        "rows": BATCH_ROWS,
        "length": min(seq_len, BATCH_MAX_LENGTH),
        "dtype": dtype,
        "codec": codec,
        "memory_limit_bytes": default_memory_limit_bytes(),
    }
    child = ConfinedChild(plan, "scoring.worker.build_check", spec, out, workdir / "policy.json")
    code = child.wait(timeout_s)
    if code is None:
        raise ValueError(f"building the model and one forward pass took more than {timeout_s:.0f} s")
    if code != 0:
        raise ValueError(one_line(child.error_line()) or f"the confined build failed ({exit_how(code)})")
    try:
        report = json.loads(read_regular(out / "out" / REPORT_FILE, REPORT_MAX_BYTES))
    except RecursionError:  # nested past the parser's depth: the child's report is malformed, not our crash
        raise ValueError("the confined build wrote a report nested too deeply") from None
    if not isinstance(report, dict):
        raise ValueError("the confined build wrote a report that is not a JSON object")
    wrong = _report_problem(
        report, rows=BATCH_ROWS, length=min(seq_len, BATCH_MAX_LENGTH), vocab_size=vocab_size
    )
    if wrong:
        raise ValueError(f"the confined build wrote a report that is not its build's: {wrong}")
    return report, out / "out"


def _report_problem(report: dict[str, Any], *, rows: int, length: int, vocab_size: int) -> str | None:
    """What in the child's report is not what its build could have said (None: nothing). The report is the
    submitted code's to rewrite (an exit handler), and this side prints it: an ESC sequence in `input`
    cleared the official's terminal and wrote a line of its own."""
    from harness.api import MODEL_OUTPUTS

    def count(v: Any) -> bool:
        return type(v) is int and v >= 0

    shape = report.get("shape")
    max_vocab = max(2 * vocab_size, vocab_size + 1024)  # the scorer's buffer, as the child checks it
    if not count(report.get("params")):
        return "params is not a count"
    if report.get("input") != [rows, length]:
        return f"input is not the [{rows}, {length}] batch it was given"
    if not (isinstance(shape, list) and len(shape) == 3 and all(map(count, shape))):
        return "shape is not [batch, seq, vocab]"
    if shape[:2] != [rows, length] or not vocab_size <= shape[2] <= max_vocab:
        return f"shape {shape} is not [{rows}, {length}, V] with {vocab_size} <= V <= {max_vocab}"
    if report.get("output") not in MODEL_OUTPUTS:
        return f"output is not one of {list(MODEL_OUTPUTS)}"
    return None


def _estimate_artifact(
    submission_dir: Path,
    child_out: Path,
    report: dict[str, Any],
    *,
    codec: str,
    model_config: dict[str, Any],
    cap_bytes: int,
    workdir: Path,
) -> dict[str, Any]:
    """bytes_code, bytes_model (the initial weights), bytes_model_dense (dense_state), cap_bytes.

    A built-in codec packs here (pack_state: the header and counting of a real pack); the submission's
    codec encoded in the child, and its payloads are framed here with the header a pack would write.
    """
    from types import SimpleNamespace

    from scoring.artifact.cap import code_bytes, counted_files
    from scoring.artifact.format import build_header, encode_artifact
    from scoring.artifact.pack import pack_state, read_state

    state_path = child_out / STATE_FILE
    st = os.lstat(state_path)  # the child's whole process tree is gone: nothing can swap it after this
    if not stat.S_ISREG(st.st_mode):
        raise ValueError(f"the confined build left {STATE_FILE} as something other than a regular file")
    state, _ = read_state(state_path)
    files = counted_files(submission_dir)
    n_code = code_bytes(submission_dir, files)
    sizes = []
    if codec != "submission":
        from concurrent.futures import ThreadPoolExecutor

        def pack(tensors: dict[str, Any], name: str) -> int:
            rec = pack_state(
                tensors,
                submission_dir,
                workdir / name,
                codec_name=codec,
                model_config=model_config,
                cap_bytes=cap_bytes,
            )
            return int(rec["bytes_model"])

        # the two packs side by side: the codec's quantiles and zlib release the GIL (on 2 cores, ~40 % less wall)
        with ThreadPoolExecutor(max_workers=2) as pool:
            jobs = [
                pool.submit(pack, state, "initial.pgolf"),
                pool.submit(pack, dense_state(state), "dense.pgolf"),
            ]
            sizes = [j.result() for j in jobs]
    else:
        name, version = report.get("codec_name"), report.get("codec_version")
        if not isinstance(name, str) or type(version) is not int:
            raise ValueError("codec.py must define NAME (str) and VERSION (int)")
        codec_id = SimpleNamespace(name=name, version=version)
        for fname in (PAYLOAD_FILE, DENSE_PAYLOAD_FILE):
            size = os.lstat(child_out / fname).st_size
            if size > cap_bytes:  # over the cap by its payload alone: no need to read it
                sizes.append(size)
                continue
            payload = read_regular(child_out / fname, cap_bytes)
            header = build_header(
                state,
                codec_id,
                payload,
                model_config=model_config,
                code_files=files,
                bytes_code=n_code,
            )
            sizes.append(len(encode_artifact(header, payload)))
    return {
        "bytes_code": n_code,
        "bytes_model": sizes[0],
        "bytes_total": n_code + sizes[0],
        "bytes_model_dense": sizes[1],
        "bytes_total_dense": n_code + sizes[1],
        "cap_bytes": cap_bytes,
    }


def _guard(name: str, checks: list[Check], fn: Callable[[], Check]) -> Check:
    """Run one check; a user-level error (ValueError and kin) becomes its FAIL line."""
    try:
        c = fn()
    except (ValueError, FileNotFoundError, TypeError, OSError) as e:
        c = Check(name, "FAIL", one_line(e), FIXES[name])
    checks.append(c)
    return c


def run_checks(
    submission_dir: str | Path,
    preset: str | None = None,
    overrides: list[str] | None = None,
    *,
    sandbox: str = "auto",
    data_dir: str | Path | None = None,
) -> list[Check]:
    """Every check of the module docstring, in order; never raises for a problem of the folder."""
    import tempfile

    from harness.config import load_config, validate_run
    from harness.run.staging import inspect_folder, stage_model_code
    from harness.submission import check_submission
    from scoring.codecheck import lint_scored_code
    from scoring.tracks import TRACKS

    root = Path(submission_dir)
    checks: list[Check] = []
    meta: dict[str, Any] = {}
    cfg: Any = None

    def submission() -> Check:
        from harness.commands.scaffold import PLACEHOLDERS

        meta.update(check_submission(root))
        detail = f"{meta['name']} by {meta['author']}, track {meta['track']}, data {meta['data_variant']}"
        left = [k for k, v in meta.items() if isinstance(v, str) and v in PLACEHOLDERS]
        if left:
            return Check(
                "submission", "warn", f"{detail}; placeholders to fill before a PR: {', '.join(left)}"
            )
        return Check("submission", "ok", detail)

    def config() -> Check:
        nonlocal cfg
        cfg = validate_run(root, preset, overrides)[1] if meta else load_config(root, preset, overrides)
        run, budget, pack = cfg.tables["run"], cfg.section("budget"), cfg.section("pack")
        track = TRACKS[run["track"]]
        detail = (
            f"preset {preset or '(defaults)'}: track {track.name}, train_s {budget.train_s:g}, "
            f"codec {pack.codec}, device {cfg.tables['launch']['device']}"
        )
        if cfg.loosened:
            detail += f"; loosens (unranked track, recorded): {', '.join(x['key'] for x in cfg.loosened)}"
        return Check("config", "ok", detail)

    s = _guard("submission", checks, submission)
    c = _guard("config", checks, config)
    cap_bytes = TRACKS[cfg.tables["run"]["track"]].cap_bytes if cfg is not None else None

    def data() -> Check:
        from data.manifest import load_manifest
        from harness.run.datacheck import REFUSE, dataset_findings

        if cfg is None:
            return Check("data", "skip", "skipped: needs config to pass first")
        manifest = load_manifest(Path(data_dir))  # type: ignore[arg-type]
        track = TRACKS[cfg.tables["run"]["track"]]
        found = dataset_findings(cfg.model, meta.get("data_variant"), track, manifest)
        facts = {"vocab_size": manifest.vocab_size, "findings": [list(f) for f in found]}
        refused = [f"{what}: {text}" for what, level, text in found if level == REFUSE]
        if refused:
            return Check("data", "FAIL", one_line("; ".join(refused)), FIXES["data"], facts)
        tokens = f"{manifest.split_tokens('train'):,} train / {manifest.split_tokens('val'):,} val tokens"
        detail = f"{manifest.root}: vocabulary {manifest.vocab_size}, {tokens}"
        if found:
            return Check(
                "data",
                "warn",
                one_line(f"{detail}; " + "; ".join(f"{w}: {t}" for w, _, t in found)),
                facts=facts,
            )
        return Check(
            "data", "ok", f"{detail}; fits the model, the variant and track {track.name}", facts=facts
        )

    d = _guard("data", checks, data) if data_dir is not None else None

    scan: Any = None

    def folder() -> Check:
        nonlocal scan
        scan = inspect_folder(root, cap_bytes=cap_bytes)
        return Check(
            "folder",
            "ok",
            f"{len(scan.files)} counted files, {scan.bytes_code:,} code bytes; "
            f"{len(scan.skipped)} uncounted (README.md, submission.json, caches)",
        )

    f = _guard("folder", checks, folder)

    def lint() -> Check:
        problems = lint_scored_code(root)
        if problems:
            more = f" (and {len(problems) - 3} more)" if len(problems) > 3 else ""
            return Check("lint", "FAIL", "; ".join(problems[:3]) + more, FIXES["lint"])
        return Check("lint", "ok", "scored code (every .py but train.py) passes the static check")

    lint_check = _guard("lint", checks, lint)

    needs = [x.name for x in (s, c, f, *([d] if d else [])) if x.status not in PASSING]
    if needs:
        why = f"skipped: needs {', '.join(needs)} to pass first"
        checks += [Check("model", "skip", why), Check("artifact", "skip", why)]
        return checks
    if lint_check.status not in PASSING:
        why = "skipped: the scored code fails the static check (the scorer would refuse it unrun)"
        checks += [Check("model", "skip", why), Check("artifact", "skip", why)]
        return checks

    ev = cfg.section("eval")
    codec = cfg.section("pack").codec
    vocab = vocab_of_variant(meta["data_variant"])
    with tempfile.TemporaryDirectory(prefix="pgolf-check-") as tmp:
        work = Path(tmp)
        built: dict[str, Any] = {}

        def model() -> Check:
            code = stage_model_code(root, work / "code", cap_bytes=cap_bytes)
            t0 = time.perf_counter()
            report, out = confined_build(
                code,
                model_config=cfg.model,
                vocab_size=vocab,
                seq_len=ev.seq_len,
                dtype=ev.dtype,
                codec=codec,
                workdir=work,
                sandbox=sandbox,
            )
            built.update(report=report, out=out)
            shape = report.get("shape")
            return Check(
                "model",
                "ok",
                f"build_model: {report.get('params', 0):,} parameters; forward {report.get('input')} int64 -> "
                f"{report.get('output', 'logits')} {shape} (confined, {time.perf_counter() - t0:.1f} s)",
            )

        m = _guard("model", checks, model)
        if m.status not in PASSING:
            checks.append(Check("artifact", "skip", "skipped: needs model to pass first"))
            return checks

        def artifact() -> Check:
            state_bytes = os.lstat(built["out"] / STATE_FILE).st_size
            if state_bytes > STATE_ESTIMATE_MAX_BYTES:
                return Check(
                    "artifact",
                    "warn",
                    f"not estimated: the initial state is {state_bytes:,} bytes, over the "
                    f"{STATE_ESTIMATE_MAX_BYTES:,} this check reads (warning; the run's pack decides)",
                    facts={"bytes_state": state_bytes},
                )
            est = _estimate_artifact(
                root,
                built["out"],
                built["report"],
                codec=codec,
                model_config=cfg.model,
                cap_bytes=int(cap_bytes or 0),
                workdir=work,
            )
            cap = est["cap_bytes"]
            text = (
                f"~{est['bytes_total']:,} bytes = code {est['bytes_code']:,} + model {est['bytes_model']:,} "
                f"(initial weights, {codec}); dense weights as trained ~{est['bytes_total_dense']:,}; cap {cap:,}"
            )
            if est["bytes_total"] > cap:
                over = est["bytes_total"] - cap
                return Check(
                    "artifact", "FAIL", f"{text}: over the cap by {over:,} bytes", FIXES["artifact"], est
                )
            if est["bytes_total_dense"] > cap:
                text += ": trained weights may not fit (warning; the run's pack decides)"
                return Check("artifact", "warn", text, facts=est)
            return Check("artifact", "ok", text, facts=est)

        _guard("artifact", checks, artifact)
    return checks


def cmd_check_machine() -> int:
    """`pgolf check --machine`: per guarantee of a record track's sandbox, what holds it on this machine."""
    from isolation.sandbox import machine_report, probe_machine

    lines = machine_report(probe_machine())
    for line in lines:
        print(line)
    return EXIT_OK if lines[-1].startswith("a record track can run") else EXIT_FAILED


def cmd_check(args: argparse.Namespace) -> int:
    if getattr(args, "machine", False):
        return cmd_check_machine()
    if args.submission is None:
        raise ValueError(
            "pgolf check: name a submission folder, or pass --machine for this machine's isolation"
        )
    root = Path(args.submission)
    if not root.is_dir():
        raise FileNotFoundError(f"{root}: no such submission folder (pgolf new NAME writes one)")
    from harness.config import parse_override

    for text in args.set:
        parse_override(text)  # a malformed --set is a usage error (exit 2), not a failed check
    t0 = time.perf_counter()
    if args.data and not Path(args.data).is_dir():
        raise FileNotFoundError(
            f"--data {args.data}: no such dataset folder (pgolf data download, or pgolf data build)"
        )
    checks = run_checks(root, args.preset, args.set, sandbox=args.sandbox, data_dir=args.data)
    elapsed_s = time.perf_counter() - t0
    failed = [c for c in checks if c.status not in PASSING]
    if args.json:
        print(
            json.dumps(
                {
                    "format": CHECK_FORMAT,
                    "format_version": CHECK_FORMAT_VERSION,
                    "submission": str(root),
                    "preset": args.preset,
                    "overrides": list(args.set),
                    "ok": not failed,
                    "time_s": round(elapsed_s, 3),
                    "checks": [
                        {"name": c.name, "status": c.status, "detail": c.detail, "fix": c.fix, **c.facts}
                        for c in checks
                    ],
                },
                indent=1,
            )
        )
    else:
        for c in checks:
            print(c.line())
        verdict = "all checks passed" if not failed else f"{len(failed)} of {len(checks)} checks did not pass"
        print(f"{verdict} in {elapsed_s:.1f} s: {root}")
    return EXIT_FAILED if failed else EXIT_OK


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "check",
        help="pre-flight a submission folder in seconds: schema, config, folder, lint, model shape, bytes",
        description=(
            "Checks a submission folder before any training: submission.json, the config (preset, --set, "
            "the track's rules), the folder rules, the scored-code lint, that build_model builds and its "
            "forward returns [batch, seq, vocab] (in a confined process), and the artifact's estimated "
            "bytes (the initial weights, and dense weights as trained; the chosen codec) against the cap. "
            "One line per check."
        ),
        epilog="exit status: 0 every check passed (ok or warn); 1 a check failed (FAIL) or was skipped; 2 usage error",
    )
    p.add_argument("submission", nargs="?", help="the submission folder")
    p.add_argument(
        "--machine",
        action="store_true",
        help="instead: what a record track's sandbox guarantees on this machine, one line per property",
    )
    p.add_argument("--preset", help="named preset of the folder's config.toml (as for pgolf run)")
    p.add_argument(
        "--set", action="append", default=[], metavar="SECTION.KEY=VALUE", help="override one config key"
    )
    p.add_argument("--json", action="store_true", help="print the checks as one JSON object (pg-check v1)")
    p.add_argument(
        "--data", help="also check this dataset against the model's vocabulary, the variant, the track"
    )
    p.add_argument(
        "--sandbox",
        choices=("auto", "required", "off"),
        default="auto",
        help="confinement of the model build: auto (every layer the machine offers), required, off",
    )
    p.set_defaults(func=cmd_check)
