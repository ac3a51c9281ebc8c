"""`pgolf sample` and `pgolf generate` print a hostile model's text without its terminal commands.

The confined process's ids are checked against the vocabulary, but any id in range is the model's
choice, and byte tokens (byte260, SentencePiece byte fallback) decode to any byte: ESC, BEL, the
bidi overrides. Before the fix on branch attack-25 the decoded text went to the terminal raw, so a
model could retitle the window, write the clipboard (OSC 52) or hide text. Here the confined run is
replaced by the ids such a model would send back; everything after it is the commands' own code.
"""

from __future__ import annotations

import argparse

import pytest

from data.tokenizer import BYTE260_FILENAME, write_byte260
from harness.commands import generate
from harness.commands.generate import GenRun, printable

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
