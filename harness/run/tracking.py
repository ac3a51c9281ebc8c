"""Experiment tracking with wandb, on the trusted side only, and the reader of a run's metrics file.

    pgolf run DIR --wandb offline            # or --set log.wandb=online; [log] in config.toml names the project

The ranks have no network inside their sandbox and never import wandb. The orchestrator feeds it:
live, from a thread that tails the metrics file rank 0 appends to (metrics.jsonl, harness/train/rank.py),
and at the end from the records (the resolved config, the counted code's hashes, bytes, val_bpb,
status, provenance). The metrics file is written by a process that ran submitted code, so it is
hostile input: it is opened without following links and only if it is a regular file, read in
bounded chunks up to a cap, and every line is checked (MetricsReader); the rank's numbers go to
wandb under `rank/` so they cannot pose as the scorer's (val_bpb is the result's alone).
What reaches wandb is bounded: at most WANDB_MAX_NAMES metric names and WANDB_MAX_LINES lines a run.

Tracking never blocks or fails a run. Modes: "disabled" (the default: wandb is not even imported),
"offline" (files under RUN_DIR/wandb, `wandb sync` uploads them later) and "online". wandb.init
runs in its own thread with wandb's init_timeout set to log.init_timeout_s and a deadline a little
past it: measured on this machine, online mode with a key and no reachable service otherwise hangs
about 100 s in init. When init fails or misses the deadline, the run goes on without tracking and the
log says so in one line (Tracker.note). WANDB_MODE=disabled in the environment switches tracking
off whatever the config says (wandb's own kill switch).
"""

from __future__ import annotations

import json
import math
import os
import re
import stat
import threading
import time
from pathlib import Path
from typing import Any

from data.io import write_json_atomic
from harness.config import LogConfig
from harness.run.text import visible

METRICS_MAX_BYTES = 64 * 1024 * 1024
"""Read at most this much of a metrics file (the rest is ignored and counted as skipped)."""
METRICS_LINE_MAX_BYTES = 4096
METRICS_MAX_KEYS = 32
WANDB_TAG_MAX_CHARS = 64
"""wandb refuses a longer tag, and with it the whole init (a submission's 80-character name is one)."""
WANDB_MAX_NAMES = 256
"""The most distinct metric names a run sends to wandb: a line naming one more is skipped (a 64 MiB file of
new names each line would otherwise be ~10^6 metrics in the official's account)."""
WANDB_MAX_LINES = 100_000
"""The most metric lines a run sends to wandb (a step each); the rest are skipped (the plot still reads them all)."""
WANDB_CONFIG_MAX_KEYS = 1000
"""The most config keys of the entry's making a run sends to wandb (ENTRY_SIZED_PREFIXES: any number otherwise)."""
WANDB_CONFIG_VALUE_MAX_CHARS = 1000
"""A longer config value (a string, or a list as JSON) is cut to this, then "…"; a key to WANDB_KEY_MAX_CHARS."""
WANDB_KEY_MAX_CHARS = 200
CONFIG_DROPPED_KEY = "config_keys_dropped"
ENTRY_SIZED_PREFIXES = ("config/model/", "config/train/", "code_files/")
"""The config keys whose number the entry sets: the rest (the receipt, the harness's tables) are the harness's."""
_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_./-]{0,63}")
_CHUNK_BYTES = 1024 * 1024
FINISH_TIMEOUT_S = 30.0
"""How long the end of a run waits for wandb to write or upload what it holds."""
FINISH_FLUSH_S = 5.0
"""How long the end of a run keeps logging metric lines still pending (a burst written at the end can take
minutes to log): past it they are skipped, so the result's summary and config are never left behind."""
DEADLINE_SLACK_S = 10.0
"""The thread's deadline past wandb's own init_timeout (wandb's timeout is the one that normally fires)."""


# ---- The metrics file (hostile input) ----


def parse_metrics_line(line: bytes) -> dict[str, float] | None:
    """One line of metrics.jsonl -> {"step": int, name: finite float, ...}, or None when it is not
    one: too long, not a JSON object, no integer step >= 0, a bad key, a non-finite or non-number value."""
    if len(line) > METRICS_LINE_MAX_BYTES:
        return None
    try:
        d = json.loads(line, parse_constant=lambda c: None)
    except (ValueError, UnicodeDecodeError, RecursionError):  # deep nesting: RecursionError
        return None
    if not isinstance(d, dict) or len(d) > METRICS_MAX_KEYS + 1:
        return None
    step = d.pop("step", None)
    if not isinstance(step, int) or isinstance(step, bool) or not 0 <= step < 2**53:
        return None
    out: dict[str, float] = {"step": step}
    for k, v in d.items():
        if not _KEY.fullmatch(k) or isinstance(v, bool) or not isinstance(v, int | float):
            return None
        try:
            value = float(v)
        except OverflowError:  # an integer of hundreds of digits: no float holds it
            return None
        if not math.isfinite(value):
            return None
        out[k] = value
    return out


class MetricsReader:
    """Reads a metrics file as it grows: `poll()` returns the complete lines appended since the last call.

    The file is opened once (O_NOFOLLOW, O_NONBLOCK; refused unless a regular file), so it can be
    moved or unlinked while read; a line still being written waits for its newline."""

    def __init__(self, path: Path, max_bytes: int = METRICS_MAX_BYTES) -> None:
        self.path = path
        self.max_bytes = max_bytes
        self.skipped = 0
        """Lines that were not metrics (parse_metrics_line), plus one if the cap was reached."""
        self.refused = ""
        """Why the file was not read (a link, a FIFO, ...), or empty."""
        self._fd: int | None = None
        self._read = 0
        self._partial = b""
        self._capped = False

    def _open(self) -> bool:
        if self._fd is not None:
            return True
        if self.refused:
            return False
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        except FileNotFoundError:
            return False
        except OSError as e:  # a link (ELOOP), no permission, ...
            self.refused = f"{self.path.name}: {e.strerror or e}"
            return False
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            self.refused = f"{self.path.name} is not a regular file"
            return False
        self._fd = fd
        return True

    def poll(self, *, final: bool = False) -> list[dict[str, float]]:
        """The complete lines appended since the last call (`final`: a last line without its newline too)."""
        if not self._open() or self._fd is None:
            return []
        out = []
        while self._read < self.max_bytes:
            data = os.read(self._fd, min(_CHUNK_BYTES, self.max_bytes - self._read))
            if not data:
                break
            self._read += len(data)
            *lines, self._partial = (self._partial + data).split(b"\n")
            if len(self._partial) > METRICS_LINE_MAX_BYTES:  # no newline in sight: not a metrics line
                self._partial, self.skipped = b"", self.skipped + 1
            out += self._parse(lines)
        if self._read >= self.max_bytes and not self._capped:
            self._capped, self.skipped = True, self.skipped + 1  # the rest of the file is not read
        if final and self._partial:
            out += self._parse([self._partial])
            self._partial = b""
        return out

    def _parse(self, lines: list[bytes]) -> list[dict[str, float]]:
        out = []
        for line in lines:
            if line.strip():
                rec = parse_metrics_line(line)
                if rec is None:
                    self.skipped += 1
                else:
                    out.append(rec)
        return out

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def read_metrics(path: Path) -> tuple[list[dict[str, float]], int, str]:
    """The whole metrics file: (records, lines skipped, why it was refused or "")."""
    reader = MetricsReader(path)
    try:
        return reader.poll(final=True), reader.skipped, reader.refused
    finally:
        reader.close()


# ---- wandb ----


def _flat(prefix: str, value: Any, out: dict[str, Any]) -> dict[str, Any]:
    """Nested dicts -> "a/b/c" keys (wandb's config and summary show flat keys best)."""
    if isinstance(value, dict):
        for k, v in value.items():
            _flat(f"{prefix}/{k}" if prefix else str(k), v, out)
    else:
        out[prefix] = value
    return out


def summary_of(result: dict[str, Any]) -> dict[str, Any]:
    """What a run's wandb summary holds: the result's numbers and verdict (never the rank's word)."""
    keys = (
        "status", "verification", "val_bpb", "val_loss", "val_tokens", "val_bytes", "unigram_bpb",
        "bytes_total", "bytes_code", "bytes_model", "cap_bytes", "within_cap", "train_time_s", "steps",
        "tokens_seen", "world_size", "eval_time_s", "track", "preset", "seed",
    )  # fmt: skip
    return {k: result[k] for k in keys if result.get(k) is not None}


def bounded_config(flat: dict[str, Any]) -> dict[str, Any]:
    """A flat config as wandb gets it: at most WANDB_CONFIG_MAX_KEYS keys of the entry's size (its [model] and
    [train], one per counted file; past them CONFIG_DROPPED_KEY says how many more), every key of the harness's
    own, each key and long value cut, so an entry can neither flood the official's account nor push out the receipt."""

    def cut(text: str, limit: int) -> str:
        return text if len(text) <= limit else text[: limit - 1] + "…"

    out: dict[str, Any] = {}
    entry_keys = dropped = 0
    for k, v in flat.items():
        if k.startswith(ENTRY_SIZED_PREFIXES):
            if entry_keys >= WANDB_CONFIG_MAX_KEYS:
                dropped += 1
                continue
            entry_keys += 1
        if isinstance(v, str):
            v = cut(v, WANDB_CONFIG_VALUE_MAX_CHARS)
        elif not isinstance(v, bool | int | float | type(None)):  # a list (TOML arrays)
            text = json.dumps(v, default=str)
            v = v if len(text) <= WANDB_CONFIG_VALUE_MAX_CHARS else cut(text, WANDB_CONFIG_VALUE_MAX_CHARS)
        out[cut(k, WANDB_KEY_MAX_CHARS)] = v
    if dropped:
        out[CONFIG_DROPPED_KEY] = dropped
    return out


def config_of(result: dict[str, Any]) -> dict[str, Any]:
    """The run's config for wandb: the resolved tables, the submission, the counted code and the receipt."""
    prov = result.get("provenance") or {}
    tables = result.get("config") or {}
    # the harness's own first: past WANDB_CONFIG_MAX_KEYS an entry's [model] and [train] keys are dropped, never these
    return {
        "provenance": {k: v for k, v in prov.items() if k != "code_files"},
        "run_dir": result.get("run_dir"),
        "code_files": prov.get("code_files") or {},
        "submission": result.get("submission") or {},
        "config": {k: tables[k] for k in sorted(tables, key=lambda name: name in ("model", "train"))},
    }


def _in_an_entry(path: Path, cwd: Path) -> bool:
    """Whether `path` (resolved) lies in a folder holding a submission.json, from its own folder up to `cwd`."""
    for d in path.resolve().parents:
        if (d / "submission.json").exists():
            return True
        if d == cwd:
            break
    return False


def entry_settings_file(untrusted: Path | None) -> Path | None:
    """The settings file wandb.init would read from the current folder (`wandb/settings`, `.wandb/settings`:
    base_url, entity, mode, ...) when that folder is inside the submission's `untrusted` folder or any other
    entry's (a folder holding a submission.json); else None. wandb reads it before init's own arguments and dir
    apply: an entry run from its own folder chose the server the official's API key went to, and so did an
    entry named wandb beside the one run, from the folder holding both."""
    if untrusted is None:
        return None
    try:
        cwd, root = Path.cwd(), untrusted.resolve()
        for name in (".wandb", "wandb"):  # wandb reads .wandb/settings where .wandb exists
            settings = cwd / name / "settings"
            # run from inside the entry, or from the folder holding it when the entry is itself named wandb
            if os.path.lexists(settings) and (
                cwd.resolve().is_relative_to(root)
                or settings.resolve().is_relative_to(root)
                or _in_an_entry(settings, cwd.resolve())
            ):
                return settings
    except (OSError, RuntimeError):  # no current folder (removed): wandb's init fails on it in its own thread
        return None
    return None


class Tracker:
    """One run's wandb run, fed from a background thread; every call returns promptly and never raises.

    start() begins init in a thread; follow(path) tails the metrics file from another; finish(result)
    stops the tail, logs the records and closes the run, each bounded. `note` is the one line the
    run prints about tracking."""

    def __init__(
        self, cfg: LogConfig, run_dir: Path, *, tags: list[str] | None = None, untrusted: Path | None = None
    ) -> None:
        """`untrusted`: the submission's folder (wandb must read no settings file of the entry's)."""
        self.cfg = cfg
        self.run_dir = run_dir
        self.untrusted = untrusted
        self.tags = [t[:WANDB_TAG_MAX_CHARS] for t in (tags or []) if t][:20]
        self.mode = cfg.wandb
        if self.mode != "disabled" and os.environ.get("WANDB_MODE") == "disabled":
            self.mode = "disabled"
            self.note = "wandb: disabled (WANDB_MODE=disabled in the environment)"
        else:
            self.note = "wandb: disabled" if self.mode == "disabled" else f"wandb: {self.mode}, starting"
        self.logged = 0
        self._read_skipped = 0
        self._dropped = 0
        self._run: Any = None
        self._lock = threading.Lock()
        self._pending: list[dict[str, float]] = []
        self._last_step = -1
        self._names: set[str] = set()
        self.capped = ""
        """Which cap on what is sent to wandb was reached (WANDB_MAX_NAMES, WANDB_MAX_LINES), or empty."""
        self._stop = threading.Event()
        self._flush_until = math.inf
        self._init_thread: threading.Thread | None = None
        self._tail_thread: threading.Thread | None = None
        self._deadline = 0.0

    @property
    def skipped(self) -> int:
        """Lines not logged: not metrics (the reader's count) plus those wandb could not take (a step back, a cap)."""
        return self._read_skipped + self._dropped

    @property
    def active(self) -> bool:
        return self.mode != "disabled"

    @property
    def tracked(self) -> bool:
        """Whether a wandb run was started (init returned in time)."""
        return self._run is not None

    def start(self) -> None:
        if not self.active:
            return
        planted = entry_settings_file(self.untrusted)
        if planted is not None:
            self.mode = "disabled"
            self.note = (
                f"wandb: not started: {planted} is the submission's (or another entry's) and wandb would read it "
                "(it can name the server your key is sent to and the account); run pgolf from a folder outside "
                "the entries"
            )
            return
        self._deadline = time.monotonic() + self.cfg.init_timeout_s + DEADLINE_SLACK_S
        self._init_thread = threading.Thread(target=self._init, name="pgolf-wandb-init", daemon=True)
        self._init_thread.start()

    def _init(self) -> None:
        t0 = time.monotonic()
        try:
            import wandb  # lazily: a run that does not track never imports it
        except ImportError:
            self.note = (
                f"wandb: {self.mode} requested but wandb is not installed (pip install wandb); not tracked"
            )
            return
        mode: Any = self.mode  # one of WANDB_MODES (wandb types it as a Literal)
        try:
            run = wandb.init(
                project=self.cfg.project,
                entity=self.cfg.entity or None,
                name=self.cfg.run_name or self.run_dir.name,
                dir=str(self.run_dir),
                mode=mode,
                tags=self.tags,
                reinit="create_new",
                settings=wandb.Settings(
                    init_timeout=self.cfg.init_timeout_s,
                    finish_timeout=FINISH_TIMEOUT_S,
                    console="off",  # the orchestrator's output stays its own
                    silent=True,
                    x_disable_stats=True,  # no sampling thread competing with training for the cores
                    # the current folder's git (an entry's own checkout, run from it) is no record of the run's
                    disable_git=True,
                    save_code=False,  # the counted code is logged from the records, not guessed
                ),
            )
        except Exception as e:  # noqa: BLE001 - tracking never fails a run
            msg = " ".join((str(e).strip().splitlines() or [""])[0].split())[:200]  # its first line
            self.note = (
                f"wandb: {self.mode} init failed after {time.monotonic() - t0:.1f} s "
                f"({type(e).__name__}: {msg}); this run is not tracked"
            )
            return
        with self._lock:
            if self._stop.is_set() and time.monotonic() > self._deadline:  # given up on: close it again
                self._close(run)
                return
            self._run = run
            where = getattr(run, "dir", "") if self.mode == "offline" else getattr(run, "url", "") or ""
            self.note = f"wandb: {self.mode}, run {getattr(run, 'id', '?')}" + (
                f" ({where})" if where else ""
            )

    def _wait_init(self) -> bool:
        """Whether a run is ready, waiting for init at most until its deadline."""
        if self._init_thread is None:
            return False
        self._init_thread.join(max(0.0, self._deadline - time.monotonic()))
        if self._init_thread.is_alive():
            self.note = (
                f"wandb: {self.mode} init did not finish in {self.cfg.init_timeout_s + DEADLINE_SLACK_S:.0f} s "
                "(service unreachable?); this run is not tracked"
            )
            return False
        return self._run is not None

    def follow(self, path: Path, poll_s: float = 1.0) -> None:
        """Tail `path` (the ranks' metrics file) until finish(); lines wait in memory for init."""
        if not self.active or self._tail_thread is not None:
            return
        self._tail_thread = threading.Thread(
            target=self._tail, args=(path, poll_s), name="pgolf-wandb-tail", daemon=True
        )
        self._tail_thread.start()

    def _tail(self, path: Path, poll_s: float) -> None:
        reader = MetricsReader(path)
        try:
            while True:
                stopping = self._stop.wait(poll_s)
                with self._lock:
                    self._pending += reader.poll(final=stopping)
                    self._read_skipped = reader.skipped
                    self._flush()
                if stopping:
                    return
        except Exception as e:  # noqa: BLE001 - tracking never fails a run
            self.note += f"; stopped following the metrics ({type(e).__name__}: {e})"
        finally:
            reader.close()

    def _flush(self) -> None:
        """Log what is pending to the run, if it is ready (the caller holds the lock)."""
        if self._run is None:
            return
        for i, rec in enumerate(self._pending):
            if self._stop.is_set() and time.monotonic() > self._flush_until:  # the summary must not wait
                self._dropped += len(self._pending) - i
                self.capped = self.capped or f"lines still pending {FINISH_FLUSH_S:g} s after the run ended"
                break
            step = int(rec["step"])
            if step < self._last_step:  # wandb's steps only go forward
                self._dropped += 1
                continue
            if self.logged >= WANDB_MAX_LINES:
                self._dropped += 1
                self.capped = self.capped or f"more than {WANDB_MAX_LINES} lines"
                continue
            new = rec.keys() - self._names
            if new and len(self._names) + len(new) > WANDB_MAX_NAMES + 1:  # + "step"
                self._dropped += 1
                self.capped = self.capped or f"more than {WANDB_MAX_NAMES} metric names"
                continue
            self._names |= new
            self._run.log({f"rank/{k}": v for k, v in rec.items() if k != "step"}, step=step)
            self._last_step = step
            self.logged += 1
        self._pending.clear()

    def finish(self, result: dict[str, Any]) -> str:
        """Stop following, log the records, close the run; returns the note. Bounded; never raises."""
        if not self.active:
            return self.note
        self._flush_until = time.monotonic() + FINISH_FLUSH_S
        self._stop.set()
        if self._tail_thread is not None:
            self._tail_thread.join(10.0)
        if not self._wait_init():
            return self.note
        done = threading.Event()

        def close() -> None:
            try:
                with self._lock:
                    self._flush()
                    run = self._run
                run.config.update(bounded_config(_flat("", config_of(result), {})), allow_val_change=True)
                run.summary.update(summary_of(result))
                self._close(run)
            except Exception as e:  # noqa: BLE001 - tracking never fails a run
                self.note += f"; the records were not all logged ({type(e).__name__}: {e})"
            finally:
                done.set()

        threading.Thread(target=close, name="pgolf-wandb-finish", daemon=True).start()
        if not done.wait(FINISH_TIMEOUT_S + DEADLINE_SLACK_S):
            self.note += (
                f"; finish did not return in {FINISH_TIMEOUT_S + DEADLINE_SLACK_S:.0f} s, left behind"
            )
        else:
            self.note += (
                f"; {self.logged} metric line(s) logged"
                + (f", {self.skipped} skipped" if self.skipped else "")
                + (f" (wandb gets no {self.capped})" if self.capped else "")
            )
        return self.note

    @staticmethod
    def _close(run: Any) -> None:
        try:
            run.finish()
        except Exception:  # noqa: BLE001 - tracking never fails a run
            pass


NOTE_MAX_CHARS = 1000
TRACKING_RECORD = "tracking.json"
TRACKING_FORMAT = "pg-tracking"
TRACKING_FORMAT_VERSION = 1


def finish_tracking(tracker: Tracker, run_dir: Path, result: dict[str, Any]) -> str:
    """End of `pgolf run`: close the wandb run with the result, record what happened in
    RUN_DIR/tracking.json (when tracking was asked for) and return the one line the run prints: as
    text.visible shows it (it names the run folder, from the submission folder's name, and wandb's errors)."""
    note = visible(tracker.finish(result), NOTE_MAX_CHARS)
    if tracker.cfg.wandb != "disabled":
        try:
            write_json_atomic(
                run_dir / TRACKING_RECORD,
                {
                    "format": TRACKING_FORMAT,
                    "format_version": TRACKING_FORMAT_VERSION,
                    "requested": tracker.cfg.wandb,
                    "mode": tracker.mode,
                    "tracked": tracker.tracked,
                    "metric_lines_logged": tracker.logged,
                    "metric_lines_skipped": tracker.skipped,
                    "note": note,
                },
            )
        except OSError as e:
            note += f"; {TRACKING_RECORD} not written ({e})"
    return note
