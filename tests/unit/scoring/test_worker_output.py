"""What a dead model worker said reaches the official as text (scoring/score/remote.py WorkerModel._died).

The worker's last output (its own, or its submitted code's) becomes the detail of the failure: the score record,
the scorer's stderr (the terminal, when an official runs `python -m scoring score` by hand) and its traceback.
A worker printed ESC sequences there: OSC 52 set the official's clipboard, a cursor move rewrote the line
`score error: ...` above into one of its own. Each character that is not printable arrives as "?"."""

from __future__ import annotations

import subprocess
import sys
import threading

from scoring.score.remote import WorkerModel
from scoring.worker.confined import OutputTail

HOSTILE = (
    "import sys\n"
    "sys.stdout.write('loading\\n\\x1b]52;c;cm0gLXJmIH4K\\x07\\x1b[1A\\x1b[2Kval_bpb 0.5012\\r\\x9b2J\\n')\n"
    "sys.stdout.flush()\n"
    "sys.exit(3)\n"
)


def _dead_worker() -> WorkerModel:
    """A WorkerModel around a process that printed HOSTILE and exited (the parts `_died` reads)."""
    w = object.__new__(WorkerModel)
    w.proc = subprocess.Popen(
        [sys.executable, "-c", HOSTILE], stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    w.output = OutputTail()
    w._drain = threading.Thread(target=w.output.drain, args=(w.proc.stdout,), daemon=True)
    w._drain.start()
    w._oom_kills = 0
    return w


def test_a_dead_worker_s_last_words_are_printable_text():
    w = _dead_worker()
    failure = w._died()
    w.proc.stdout.close()
    text = str(failure)
    assert "the model worker exited with status 3" in text
    assert "loading" in text and "val_bpb 0.5012" in text  # what it said is kept, line by line
    assert all(c.isprintable() or c == "\n" for c in text), repr(text)
    assert "?]52;c;cm0gLXJmIH4K?" in text
