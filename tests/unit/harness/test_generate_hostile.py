"""`pgolf sample` and `pgolf generate` print a hostile model's text without its terminal commands.

The confined process's ids are checked against the vocabulary, but any id in range is the model's
choice, and byte tokens (byte260, SentencePiece byte fallback) decode to any byte: ESC, BEL, the
bidi overrides. Before the fix on branch attack-25 the decoded text went to the terminal raw, so a
model could retitle the window, write the clipboard (OSC 52) or hide text. Here the confined run is
replaced by the ids such a model would send back; everything after it is the commands' own code.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import shutil
import signal
import threading
import time
import uuid
from pathlib import Path

import pytest

from data.tokenizer import BYTE260_FILENAME, write_byte260
from harness.commands import generate
from harness.commands.generate import GenerateFailure, GenRun, generate_confined, printable
from isolation.sandbox import probe_machine
from scoring.artifact.cap import ARTIFACT_CAP_BYTES
from scoring.artifact.pack import pack_state
from tests.conftest import REPO

HOSTILE = "\x1b]52;c;cm0gLXJmIH4=\x07\x1b[2J\x1b]0;owned\x07ok\u202edcba\r"
"""OSC 52 (set the clipboard), clear the screen, set the title, a right-to-left override, a carriage return."""


def _ids(text: str) -> list[int]:
    return [b + 4 for b in text.encode("utf-8")]  # byte260: 4 specials, then the bytes


@pytest.fixture()
def hostile_run(monkeypatch):
    def fake(artifact, code_dir, *, max_tokens, speculative, **_):
        toks = (_ids(HOSTILE) * max_tokens)[:max_tokens]
        runs = [GenRun("plain", False, toks, 0.5, max_tokens, 0, 0)]
        return runs + ([GenRun("speculative", False, toks, 0.5, 1, 0, 0)] if speculative else [])

    monkeypatch.setattr(generate, "generate_confined", fake)


def _args(tmp_path, **kw) -> argparse.Namespace:
    write_byte260(tmp_path / BYTE260_FILENAME)
    common = dict(
        artifact=str(tmp_path / "a.pgolf"), submission=str(tmp_path), data=None,
        tokenizer=str(tmp_path / BYTE260_FILENAME), prompt="hi", temperature=0.0, top_k=0, seed=0,
        context=1024, threads=1,
    )  # fmt: skip
    return argparse.Namespace(**{**common, **kw})


def _assert_inert(out: str) -> None:
    text = out.split("\n\n[")[0]
    assert not any(c in text for c in "\x1b\x07\r\u202e"), repr(text)
    assert text.startswith("hi\\x1b]52;c;cm0gLXJmIH4=\\x07\\x1b[2J\\x1b]0;owned\\x07ok\\u202edcba\\r")


def test_sample_prints_no_terminal_control(tmp_path, hostile_run, capsys):
    n = len(_ids(HOSTILE))
    assert generate.cmd_sample(_args(tmp_path, tokens=n)) == 0
    _assert_inert(capsys.readouterr().out)


def test_generate_prints_no_terminal_control(tmp_path, hostile_run, capsys):
    n = len(_ids(HOSTILE))
    args = _args(tmp_path, max_tokens=n, speculative=True, draft_k=0)
    assert generate.cmd_generate(args) == 0
    _assert_inert(capsys.readouterr().out)


def test_printable_keeps_text_newlines_tabs_and_every_script():
    honest = (
        "Line one,\n\tindented: café, naïve, 日本語, emoji 🙂, a\u00a0non-breaking space, \ufffd replaced"
    )
    assert printable(honest) == honest
    assert printable("\x00\x7f\x9b\u2028\u200b") == "\\x00\\x7f\\x9b\\u2028\\u200b"


HANG_MODEL = """
import os, sys

import torch

from model_base import build_model as _honest


def build_model(config):
    if os.fork() == 0:  # a grandchild in a session of its own, holding the result pipe, asleep
        os.setsid()
        os.execv(sys.executable, [sys.executable, "-c", "import time; time.sleep(600)", "MARK"])
    while True:  # and the process itself never answers
        pass
"""


def _cmdlines_with(needle: bytes) -> list[int]:
    found = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                if needle in (d / "cmdline").read_bytes().split(b"\0"):
                    found.append(int(d.name))
            except OSError:
                pass
    return found


@pytest.mark.xfail(
    not probe_machine().namespaces,
    reason="known gap: without a PID namespace (root + unshare) nothing kills a grandchild in a session of its own",
    strict=False,
)
def test_a_model_that_hangs_and_detaches_a_grandchild_is_ended_at_the_deadline(tmp_path):
    """generate's confined process: a build that spins forever after forking a grandchild into a new session
    (holding the result pipe) ends at timeout_s, and the grandchild does not outlive the command."""
    mark = f"pgolf-attack-{uuid.uuid4().hex}"
    code = tmp_path / "code"
    shutil.copytree(REPO / "tests" / "fixtures" / "submissions" / "tiny_lm", code)
    (code / "model_base.py").write_text((code / "model.py").read_text())
    (code / "model.py").write_text(HANG_MODEL.replace('"MARK"', repr(mark)))
    honest = importlib.util.spec_from_file_location("attack_tiny_lm", code / "model_base.py")
    assert honest is not None and honest.loader is not None
    module = importlib.util.module_from_spec(honest)
    honest.loader.exec_module(module)
    cfg = {"vocab_size": 260, "dim": 8}
    state = module.build_model(cfg).state_dict()
    pack_state(state, code, tmp_path / "a.pgolf", codec_name="int8_zlib", model_config=cfg,
               cap_bytes=ARTIFACT_CAP_BYTES)  # fmt: skip
    seen: list[int] = []

    def watch() -> None:  # the grandchild did start (the attack ran), while the command waited
        while not done.is_set():
            seen.extend(_cmdlines_with(mark.encode()))
            time.sleep(0.2)

    done = threading.Event()
    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    t0 = time.monotonic()
    try:
        with pytest.raises(GenerateFailure, match=r"did not end within 8 s"):
            generate_confined(
                tmp_path / "a.pgolf", code, prompt=[1, 70], max_tokens=2, temperature=0.0, top_k=0, seed=0,
                speculative=False, draft_k=0, context=64, vocab_size=260, threads=1, timeout_s=8.0,
                recompute=True,
            )  # fmt: skip
    finally:
        done.set()
        watcher.join()
    assert time.monotonic() - t0 < 60
    assert seen, "the hostile build never started its grandchild: the test would prove nothing"
    deadline = time.monotonic() + 10
    while _cmdlines_with(mark.encode()) and time.monotonic() < deadline:
        time.sleep(0.2)
    left = _cmdlines_with(mark.encode())
    for pid in left:  # never leave it running, whatever the assertion says
        os.kill(pid, signal.SIGKILL)
    assert left == [], f"the detached grandchild outlived generate: {left}"
