"""The record-script reader (scoring/worker/legacy_script.py) against hostile record scripts.

The reader runs in the scorer's own process, so a script it cannot read must be refused in one line
(LegacyError, exit status 2 through the CLI), never crash it with a traceback, never make it hold
unbounded memory, and never hand the worker's JSON spec a value JSON cannot carry. Each case below
crashed the reader (LZMAError, RecursionError, OverflowError, TypeError) or let a bad value through
before the fix on branch attack-25.
"""

from __future__ import annotations

import base64
import json
import lzma
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from scoring.worker import legacy_script
from scoring.worker.legacy import LegacyError
from scoring.worker.legacy_script import eval_settings, find_script, read_hyperparameters, read_record_script
from tests.conftest import REPO

GPT = "class GPT:\n    def __init__(self, x=1):\n        pass\n"


def _record(tmp_path: Path, source: str) -> Path:
    (tmp_path / "train_gpt.py").write_text(source, encoding="utf-8")
    return tmp_path


def _wrapper(payload: str, raw: bool = False) -> str:
    fmt = ", format=lzma.FORMAT_RAW, filters=[{'id': lzma.FILTER_LZMA2}]" if raw else ""
    return f"import lzma, base64\nexec(lzma.decompress(base64.b85decode({payload}){fmt}))\n"


def _b85(data: bytes) -> str:
    return repr(base64.b85encode(data).decode())


@pytest.mark.parametrize(
    ("payload", "raw", "said"),
    [
        ('"00000000"', False, "does not decode"),  # not lzma: LZMAError before the fix
        ('"~~~~~"', False, "does not decode"),  # not base85
        (_b85(lzma.compress(b"\xff\xfe not utf-8")), False, "does not decode"),
        (_b85(lzma.compress(b"x = 1\n")[:20]), False, "does not decode"),  # truncated stream
        (_b85(b"\x03garbage"), True, "does not decode"),  # raw LZMA2: no such chunk kind
    ],
)
def test_a_payload_that_does_not_decode_is_refused_in_one_line(tmp_path, payload, raw, said):
    rec = _record(tmp_path, _wrapper(payload, raw))
    with pytest.raises(LegacyError, match=said) as e:
        read_record_script(rec, None, {})
    assert str(rec / "train_gpt.py") in str(e.value) and "\n" not in str(e.value)
    with pytest.raises(LegacyError, match=said):  # verify-legacy reads the settings first, the same way
        read_hyperparameters(rec / "train_gpt.py", {})


def test_a_decompression_bomb_is_refused_before_it_is_held(tmp_path, monkeypatch):
    monkeypatch.setattr(legacy_script, "SOURCE_MAX_BYTES", 1 << 20)
    bomb = lzma.compress(b"#" * (2 << 20), preset=0)
    assert len(bomb) < 4096  # a few KB that would expand 500-fold
    rec = _record(tmp_path, _wrapper(_b85(bomb)))
    with pytest.raises(LegacyError, match=r"decompresses to over 1,048,576 bytes"):
        read_record_script(rec, None, {})
    # the control: the same size under the limit is read
    ok = lzma.compress(b"#" * ((1 << 20) - 100) + b"\nclass Hyperparameters:\n    x = 3\n" + GPT.encode())
    rs = read_record_script(_record(tmp_path, _wrapper(_b85(ok))), None, {})
    assert rs.hyperparameters == {"x": 3} and rs.packaging == ["self-extracting (lzma + base85)"]


def test_the_default_bound_holds_a_record_script_with_room():
    assert 1 << 20 < legacy_script.SOURCE_MAX_BYTES <= 64 << 20


@pytest.mark.parametrize(
    "source",
    [
        _wrapper("+".join(['"a"'] * 20_000)),  # the payload's string concatenation, 20,000 deep
        f"class Hyperparameters:\n    x = {'-' * 5_000}1\n{GPT}",  # a field's unary minus, 5,000 deep
    ],
    ids=["concatenation", "unary-minus"],
)
def test_an_expression_nested_past_the_recursion_limit_is_refused(tmp_path, source):
    rec = _record(tmp_path, source)
    with pytest.raises(LegacyError, match="nests too deeply"):
        read_record_script(rec, None, {})
    with pytest.raises(LegacyError, match="nests too deeply"):
        read_hyperparameters(rec / "train_gpt.py", {})


def test_exec_of_a_file_outside_the_record_folder_is_refused(tmp_path):
    rec = _record(tmp_path, 'exec(open(__file__.replace("train_gpt.py", "../secret.py")).read())\n')
    with pytest.raises(LegacyError, match=r"not a file beside it"):
        read_record_script(rec, None, {})


def test_a_script_that_is_not_utf8_is_named(tmp_path):
    (tmp_path / "train_gpt.py").write_bytes(b"x = '\xff'\n")
    with pytest.raises(LegacyError, match=r"train_gpt.py is not UTF-8 text"):
        read_record_script(tmp_path, None, {})


@pytest.mark.parametrize("value", ["1e999", "-5", "0.5", "'abc'", "True", "float('nan')"])
def test_a_window_length_that_is_not_a_whole_number_is_refused(tmp_path, value):
    rec = _record(tmp_path, f"class Hyperparameters:\n    eval_seq_len = {value}\n{GPT}")
    with pytest.raises(LegacyError, match=r"Hyperparameters.eval_seq_len = .* is not a whole number"):
        read_record_script(rec, None, {})
    rec = _record(tmp_path, f"class Hyperparameters:\n    eval_stride = {value}\n{GPT}")
    with pytest.raises(LegacyError, match=r"Hyperparameters.eval_stride = .* is not a whole number"):
        read_record_script(rec, None, {})


def test_the_window_settings_of_an_honest_script_are_unchanged():
    assert eval_settings({"train_seq_len": 1024, "eval_stride": 64}) == {
        "seq_len": 1024, "mode": "sliding", "stride": 64, "ttt": False,
    }  # fmt: skip
    assert eval_settings({"eval_seq_len": 2048.0, "train_seq_len": 1024}) == {
        "seq_len": 2048, "mode": "standard", "stride": None, "ttt": False,
    }  # fmt: skip
    assert eval_settings({})["seq_len"] == 1024


def test_values_json_cannot_carry_stay_with_the_worker(tmp_path):
    """bytes, complex and Ellipsis constants crashed json.dumps of the worker's spec (TypeError) before."""
    src = (
        "class Hyperparameters:\n    blob = b'ab'\n    z = 1j\n    e = ...\n    n = 3\n"
        f"{GPT}\nargs = Hyperparameters()\nmodel = GPT(x=2j)\n"
    )
    rs = read_record_script(_record(tmp_path, src), None, {})
    assert rs.hyperparameters == {"n": 3}
    assert rs.gpt_kwargs == {} and rs.gpt_call == {"x": "2j"}  # evaluated in the confined worker
    json.dumps({"h": rs.hyperparameters, "k": rs.gpt_kwargs, "c": rs.gpt_call})


def test_verify_legacy_refuses_a_corrupt_payload_in_one_line(tmp_path, tiny_dataset):
    (tmp_path / "rec").mkdir()
    rec = _record(tmp_path / "rec", _wrapper('"00000000"'))
    (tmp_path / "a.ptz").write_bytes(b"x")
    r = subprocess.run(
        [sys.executable, "-m", "harness.cli", "verify-legacy", str(rec), "--artifact", str(tmp_path / "a.ptz"),
         "--data", str(tiny_dataset)],
        capture_output=True, text=True, cwd=REPO, timeout=300,
    )  # fmt: skip
    assert r.returncode == 2, r.stderr
    assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert "self-extracting payload does not decode" in r.stderr


def _within(seconds: float, fn):
    """fn()'s result or exception, or a failure if it is still running after `seconds` (a FIFO blocks)."""
    out: list = []

    def run():
        try:
            out.append(("ok", fn()))
        except BaseException as e:  # noqa: BLE001 - handed to the test
            out.append(("raised", e))

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(seconds)
    assert out, f"still reading after {seconds} s"
    return out[0]


def test_a_fifo_or_device_beside_the_script_is_not_read(tmp_path):
    """A FIFO named *.py blocked the scorer's search for the script; /dev/zero as the script filled its memory."""
    os.mkfifo(tmp_path / "a.py")
    (tmp_path / "b.py").write_text("class GPT:\n    pass\n", encoding="utf-8")
    assert _within(10, lambda: find_script(tmp_path, None)) == ("ok", tmp_path / "b.py")
    how, e = _within(10, lambda: read_hyperparameters(tmp_path / "a.py", {}))
    assert how == "raised" and isinstance(e, LegacyError) and "is not a regular file" in str(e)

    zero = tmp_path / "zero"
    zero.mkdir()
    (zero / "train_gpt.py").symlink_to("/dev/zero")
    how, e = _within(10, lambda: read_record_script(zero, "train_gpt.py", {}))
    assert how == "raised" and isinstance(e, LegacyError) and "not a record's script" in str(e)
    how, e = _within(10, lambda: read_record_script(zero, None, {}))  # not a file: not the script
    assert how == "raised" and isinstance(e, FileNotFoundError)


def test_a_script_over_the_bound_is_refused(tmp_path, monkeypatch):
    monkeypatch.setattr(legacy_script, "SOURCE_MAX_BYTES", 1000)
    rec = _record(tmp_path, "#" * 1001 + f"\nclass Hyperparameters:\n    x = 1\n{GPT}")
    with pytest.raises(LegacyError, match="is not a regular file of at most 1,000 bytes"):
        read_record_script(rec, None, {})


def test_the_record_models_own_error_reaches_the_terminal_printable():
    """The worker's report quotes the record's exception; before the fix its ESC/BEL/bidi characters went raw to
    verify-legacy's `error:` line."""
    from scoring.score.legacy import _worker_error
    from scoring.score.remote import WorkerFailure

    report = (
        "Traceback (most recent call last):\n  File x\nRuntimeError: bad \x1b]0;owned\x07 \x1b[2J\u202e done"
    )
    said = str(_worker_error(WorkerFailure("error", report)))
    assert (
        said
        == "the record's model failed in the model worker (error): RuntimeError: bad ?]0;owned? ?[2J? done"
    )


def test_the_reader_imports_nothing_of_the_record_even_on_sys_path(tmp_path, monkeypatch):
    """The missing-module check asks importlib where a module is (find_spec), never imports it: with the
    record folder first on sys.path (verify-legacy run from inside it), a module and a package of the record
    that write a sentinel on import are found, and not run."""
    sentinel = tmp_path / "ran"
    (tmp_path / "rec").mkdir()
    side_effect = f"open({str(sentinel)!r}, 'w').write('ran')\n"
    (tmp_path / "rec" / "evil_mod.py").write_text(side_effect, encoding="utf-8")
    (tmp_path / "rec" / "evil_pkg").mkdir()
    (tmp_path / "rec" / "evil_pkg" / "__init__.py").write_text(side_effect, encoding="utf-8")
    src = (
        "import evil_mod\nimport evil_pkg.sub\nfrom evil_pkg import thing\nimport not_installed_anywhere_xyz\n"
        "class Hyperparameters:\n    n = 2\n"
        "class GPT:\n    def __init__(self, n=1):\n        evil_mod.f(); evil_pkg.sub.g(); thing()\n"
        "        not_installed_anywhere_xyz.h()\n"
    )
    rec = _record(tmp_path / "rec", src)
    monkeypatch.syspath_prepend(str(rec))
    with pytest.raises(
        LegacyError, match=r"needs not_installed_anywhere_xyz, which this machine does not have"
    ):
        read_record_script(rec, None, {})
    assert not sentinel.exists()
    assert not {"evil_mod", "evil_pkg"} & set(sys.modules)


def test_a_script_or_sibling_linking_outside_the_record_is_refused(tmp_path):
    """A link out would put a file of the verifier's into the worker's spec, which the worker's own sandbox
    would not let it read."""
    outside = tmp_path / "verifier_private.py"
    outside.write_text(f"class Hyperparameters:\n    secret = 'hunter2'\n{GPT}", encoding="utf-8")
    (tmp_path / "rec").mkdir()
    rec = _record(tmp_path / "rec", 'exec(open(__file__.replace("train_gpt.py", "model_def.py")).read())\n')
    (rec / "model_def.py").symlink_to(outside)
    with pytest.raises(LegacyError, match=r"model_def.py links outside the record's folder"):
        read_record_script(rec, None, {})
    (rec / "train_gpt.py").unlink()
    (rec / "train_gpt.py").symlink_to(outside)
    with pytest.raises(LegacyError, match=r"train_gpt.py links outside the record's folder"):
        read_record_script(rec, None, {})
    (rec / "inner.py").write_text(outside.read_text(), encoding="utf-8")  # the control: a link within is read
    (rec / "train_gpt.py").unlink()
    (rec / "train_gpt.py").symlink_to("inner.py")
    assert read_record_script(rec, None, {}).hyperparameters == {"secret": "hunter2"}


def test_the_code_bytes_are_every_file_the_scored_code_came_from_as_shipped(tmp_path):
    """verify-legacy's bytes_code is the sum of `code_files`. Before the fix it was the script's text re-encoded:
    a stub that exec()s a sibling counted the stub alone, and CRLF line ends were counted one byte each."""
    body = f"class Hyperparameters:\n    n = 2\n{GPT}W = '{'7' * 5000}'\n".replace("\n", "\r\n").encode()
    plain = tmp_path / "plain"
    plain.mkdir()
    (plain / "train_gpt.py").write_bytes(body)
    rs = read_record_script(plain, None, {})
    assert rs.hyperparameters == {"n": 2} and rs.packaging == []
    assert rs.code_files == {"train_gpt.py": len(body)}

    stubbed = tmp_path / "stubbed"
    stubbed.mkdir()
    stub = b'exec(open(__file__.replace("train_gpt.py", "model_def.py")).read())\r\n'
    (stubbed / "train_gpt.py").write_bytes(stub)
    (stubbed / "model_def.py").write_bytes(body)
    rs = read_record_script(stubbed, None, {})
    assert rs.hyperparameters == {"n": 2} and rs.packaging == ["exec of model_def.py"]
    assert rs.code_files == {"train_gpt.py": len(stub), "model_def.py": len(body)}

    # a sibling that is itself a self-extracting script: both files count, the payload (inside one) does not again
    wrapped = _wrapper(_b85(lzma.compress(body))).encode()
    (stubbed / "model_def.py").write_bytes(wrapped)
    rs = read_record_script(stubbed, None, {})
    assert rs.packaging == ["exec of model_def.py", "self-extracting (lzma + base85)"]
    assert rs.code_files == {"train_gpt.py": len(stub), "model_def.py": len(wrapped)}


_HELD = """
import resource, sys
from pathlib import Path
from scoring.worker.legacy import LegacyError
from scoring.worker.legacy_script import read_record_script
vm_bytes = int(next(l for l in open("/proc/self/status") if l.startswith("VmSize")).split()[1]) * 1024
resource.setrlimit(resource.RLIMIT_AS, (vm_bytes + (256 << 20), resource.RLIM_INFINITY))
for rec in sys.argv[1:]:
    try:
        print("read", read_record_script(Path(rec), None, {}).hyperparameters)
    except LegacyError as e:
        print("refused", e)
    except MemoryError:
        print("MemoryError")
"""


def test_a_payload_of_tiny_expressions_is_refused_before_it_is_parsed(tmp_path):
    """ast.parse holds some 500 bytes of the scorer's memory a token: a 4 KB script whose payload decompresses
    to 16 MiB of `0,` held 8 GB of the verifier's process before the fix (26 s), under the bound on decompressed
    bytes. Read here with 256 MiB of address space to spare (2 MiB of `0,`, a GB before the fix): refused in
    one line, not a MemoryError; the control, as many characters in a string (few tokens, as a payload), read."""
    tail = "\nclass Hyperparameters:\n    n = 2\n" + GPT
    bomb = lzma.compress(("X = [" + "0," * (1 << 20) + "]" + tail).encode(), preset=9)
    ok = lzma.compress(("X = '" + "0," * (1 << 20) + "'" + tail).encode(), preset=9)
    assert len(bomb) < 8192
    (tmp_path / "bomb").mkdir()
    (tmp_path / "ok").mkdir()
    _record(tmp_path / "bomb", _wrapper(_b85(bomb)))
    _record(tmp_path / "ok", _wrapper(_b85(ok)))
    r = subprocess.run(
        [sys.executable, "-c", _HELD, str(tmp_path / "bomb"), str(tmp_path / "ok")],
        capture_output=True, text=True, cwd=REPO, timeout=120, env={**os.environ, "PYTHONPATH": str(REPO)},
    )  # fmt: skip
    assert r.returncode == 0, r.stderr[-2000:]
    said = r.stdout.splitlines()
    assert said[0].startswith("refused") and "over 500,000 Python tokens" in said[0], said
    assert said[1:] == ["read {'n': 2}"], said
