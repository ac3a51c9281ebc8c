"""`kill -USR1` on a pgolf command prints its threads' stacks and the command goes on (harness/cli.py)."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

from tests.conftest import REPO


def test_sigusr1_dumps_the_stacks_and_the_command_goes_on() -> None:
    script = (
        "import sys, time; from harness import cli; cli.dump_stacks_on_sigusr1(); "
        "print('ready', flush=True); time.sleep(1.5); print('went on', flush=True)"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", script], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
    time.sleep(0.2)
    proc.send_signal(signal.SIGUSR1)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert out == "went on\n"
    assert "Current thread" in err and "line" in err  # faulthandler's stack format
