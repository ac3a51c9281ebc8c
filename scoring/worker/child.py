"""The one entry point of a confined child: how every process that runs submitted code starts and ends.

    python -P -B -m scoring.worker          SPEC_JSON   the model worker (scoring/worker/process.py)
    python -P -B -m scoring.worker.decode   SPEC_JSON   a custom codec's decode (pgolf unpack)
    python -P -B -m scoring.worker.generate SPEC_JSON   pgolf generate's model
    python -P -B -m scoring.worker.build_check SPEC_JSON  pgolf check's model build

Each module's `main(argv)` is `run_child(argv, ...)` with its own spec format and body. In order:

- the spec: the one JSON argument, an object of the module's `format` and `format_version`; bytecode
  writing off (submitted code leaves no .pyc behind);
- the limits: on CPU (the spec's `device`, "cpu" when absent) an address-space limit of the spec's
  `memory_limit_bytes` (0: none; CUDA reserves more virtual memory than any cap); the spec's `threads`
  (0: as the process found it);
- the body; any exception it raises (BaseException: SystemExit and KeyboardInterrupt too) becomes its
  traceback (the last 4,000 characters) and then ONE line on stderr, the last one:

      pgolf-confined-error: <ExceptionType>: <message, one printable line>[ (<file>:<line>)]

  the location being the deepest frame in the spec's `code_dir` (the submitted code), when there is one.

Exit status (EXIT_*): 0 the body ended well; 1 it failed (the line says why); 2 the argument is not a
spec of the module's format (the line says so); 3 the submitted code lacks what was asked (Unsupported:
e.g. a model with no forward_cached for `pgolf generate --speculative`). The trusted side reads the line
with `error_line` and believes only that it is a line of text.
"""

from __future__ import annotations

import json
import os
import resource
import sys
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

ERROR_PREFIX = "pgolf-confined-error: "
EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_UNSUPPORTED = 0, 1, 2, 3
TRACEBACK_KEEP_CHARS = 4000


class Unsupported(ValueError):
    """The submitted code lacks what the requested mode needs (exit status EXIT_UNSUPPORTED)."""


def printable_lines(text: str) -> str:
    """`text` line by line, each character that is not printable as "?" (the text may be a hostile process's: an
    ESC sequence in it would rewrite the terminal it is printed on, or set the official's clipboard)."""
    return "\n".join("".join(c if c.isprintable() else "?" for c in line) for line in text.splitlines())


def one_line(text: str, limit: int = 600) -> str:
    """The last non-empty line of `text`, printable characters only (the text may be a hostile process's)."""
    lines = [ln for ln in text.splitlines() if ln.strip()]
    last = lines[-1] if lines else ""
    clean = "".join(c if c.isprintable() else "?" for c in last).strip()
    return clean[:limit] + ("…" if len(clean) > limit else "")


# ---- the limits ----


def default_memory_limit_bytes() -> int:
    """Three quarters of the machine's memory: a runaway allocation fails fast instead of taking the machine."""
    try:
        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") * 3 // 4)
    except (ValueError, OSError):
        return 0


def limit_memory(limit_bytes: int) -> str:
    """Cap this process's address space (CPU only: CUDA reserves more virtual memory than any cap)."""
    if limit_bytes <= 0:
        return "none"
    resource.setrlimit(resource.RLIMIT_AS, (limit_bytes, limit_bytes))
    return f"RLIMIT_AS {limit_bytes:,} bytes"


_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
_ALLOCATOR_TUNED: str | None = None


def tune_cpu_allocator() -> str:
    """Make glibc malloc keep freed memory for reuse (idempotent); returns what was done.

    A CPU forward allocates and frees its activations every batch. By default glibc serves large
    blocks with fresh mmaps and hands them back on free, so every batch pays page faults for its
    activations again (about 40% of the scoring time of a small model on 2 cores). Raising the
    mmap and trim thresholds makes freed blocks stay in the heap and be reused; it changes no
    number. It is process-wide, so the scorer's own process calls it (score_artifact, verify-legacy,
    the bench's scorer process), and so does the model worker. Other C libraries: a no-op.
    """
    import ctypes

    global _ALLOCATOR_TUNED
    if _ALLOCATOR_TUNED is None:
        try:
            libc = ctypes.CDLL("libc.so.6")
            ok = (
                libc.mallopt(_M_MMAP_THRESHOLD, 1 << 30) == 1
                and libc.mallopt(_M_TRIM_THRESHOLD, (1 << 31) - 1) == 1
            )
            _ALLOCATOR_TUNED = (
                "glibc mallopt: mmap threshold 1 GiB, trim threshold 2 GiB"
                if ok
                else "default (mallopt refused)"
            )
        except (OSError, AttributeError):
            _ALLOCATOR_TUNED = "default (not glibc)"
    return _ALLOCATOR_TUNED


# ---- the confined side ----


def load_spec(argv: list[str], fmt: str, version: int, usage: str) -> dict[str, Any] | str:
    """The one JSON argument, checked for its format; else the reason it is not one (a string)."""
    sys.dont_write_bytecode = True
    if len(argv) != 1:
        return f"usage: {usage}"
    try:
        spec = json.loads(argv[0])
    except ValueError:
        return f"not a {fmt} v{version} spec (not JSON)"
    if not isinstance(spec, dict) or spec.get("format") != fmt or spec.get("format_version") != version:
        return f"not a {fmt} v{version} spec"
    return spec


def where_raised(e: BaseException, code_dir: object) -> str:
    """(file:line) of the deepest frame in the submission's code, if any."""
    if not isinstance(code_dir, str) or not code_dir:
        return ""
    frames = [f for f in traceback.extract_tb(e.__traceback__) if f.filename.startswith(code_dir)]
    return f" ({Path(frames[-1].filename).name}:{frames[-1].lineno})" if frames else ""


def report_failure(e: BaseException, spec: dict[str, Any]) -> int:
    """The traceback, then the one error line, on stderr; the exit status the failure calls for."""
    print("".join(traceback.format_exception(e))[-TRACEBACK_KEEP_CHARS:], file=sys.stderr)
    print(
        f"{ERROR_PREFIX}{type(e).__name__}: {one_line(str(e))}{where_raised(e, spec.get('code_dir'))}",
        file=sys.stderr,
        flush=True,
    )
    return EXIT_UNSUPPORTED if isinstance(e, Unsupported) else EXIT_FAILED


def run_child(
    argv: list[str],
    *,
    spec_format: str,
    spec_version: int,
    usage: str,
    body: Callable[[dict[str, Any], str], int | None],
) -> int:
    """Load the spec, set the limits, run `body(spec, memory_limit)`; its exit status (module docstring).

    `memory_limit` says what limit was set (for a record); `body` returns an exit status or None (0)."""
    spec = load_spec(argv, spec_format, spec_version, usage)
    if isinstance(spec, str):
        print(f"{ERROR_PREFIX}{spec}", file=sys.stderr, flush=True)
        return EXIT_USAGE
    try:
        if spec.get("device", "cpu") == "cpu":
            memory = limit_memory(int(spec.get("memory_limit_bytes", 0)))
        else:
            memory = "none (CUDA)"
        if int(spec.get("threads", 0)):
            import torch

            torch.set_num_threads(int(spec["threads"]))
        code = body(spec, memory)
        return EXIT_OK if code is None else code
    except BaseException as e:  # noqa: BLE001 - the boundary: every failure becomes one last line
        return report_failure(e, spec)


# ---- the trusted side ----


def error_line(output: str) -> str:
    """What a confined child said of its failure: its last ERROR_PREFIX line (without the prefix), else its
    last line; printable, bounded (the output is a hostile process's)."""
    said = next((ln for ln in reversed(output.splitlines()) if ln.startswith(ERROR_PREFIX)), None)
    return one_line(said.removeprefix(ERROR_PREFIX) if said is not None else output)


def exit_how(code: int) -> str:
    """'exit status N' or 'killed by signal N'."""
    return f"killed by signal {-code}" if code < 0 else f"exit status {code}"
