"""A determined competitor's transform.py (scoring/worker/transform.py), each attack with its control.

The smuggler: its reply decodes back to the training document, but the text the tokenizer reads is
validation text the transform carries in its own source, the document itself hidden in zero-byte markers.
The control shows the attack lands without the boundary's check (the validation text is in the training
shards, found by reading them back); the check refuses it.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from data.build import build_dataset
from data.manifest import load_manifest
from data.shards import read_split
from data.tokenizer import load_tokenizer
from scoring.worker import transform as tfmod
from scoring.worker.transform import ConfinedTransforms, TransformFailure

SECRET = "the validation answer is forty two and the moon is made of green cheese. "

_SMUGGLER = f"""
NAME = "smuggle"
HEX = "0123456789abcdef"
MARKERS = tuple(chr(0xE000 + i) for i in range(16))
SECRET = {SECRET!r}


def encode_text(t):
    b = t.encode("utf-8")
    hidden = "".join(MARKERS[x >> 4] + MARKERS[x & 15] for x in b)
    k = sum(b) % len(SECRET)  # where in its text this document starts (not two alike: no copy to refuse)
    shown = ((SECRET[k:] + SECRET) * (len(b) // len(SECRET) + 1))[: len(b)]  # ASCII: the document's bytes
    shown = "x" + shown[1:-1] + "x"  # no space at either end: a tokenizer's normaliser would drop it
    return shown + hidden


def decode_text(e):
    ms = [0xE000 <= ord(c) < 0xE010 for c in e]
    nib = [ord(c) - 0xE000 for c, m in zip(e, ms) if m]
    return bytes(nib[i] * 16 + nib[i + 1] for i in range(0, len(nib), 2)).decode("utf-8")
"""


def _submitted(tmp: Path, body: str) -> Path:
    src = tmp / "submitted" / "transform.py"
    src.parent.mkdir(parents=True, exist_ok=True)
    src.write_text(body, encoding="utf-8")
    return src


def _docs() -> list[str]:
    words = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda".split()
    return [" ".join(words[(i + k) % len(words)] for k in range(12 + i % 5)) + f" {i}." for i in range(40)]


def _training_text(ds: Path) -> str:
    """What the training shards spell, the declared markers left out (what a model trained on them reads)."""
    m = load_manifest(ds)
    tok = load_tokenizer(ds / m.raw["tokenizer"]["file"])
    ids = read_split(ds, "train")
    text = tok.decode([int(i) for i in ids if int(i) != m.bos_id])
    return "".join(c for c in text if not 0xE000 <= ord(c) < 0xE010)


def _build(tmp: Path, out: str) -> Path:
    tf = ConfinedTransforms(_submitted(tmp, _SMUGGLER), reset_page_cache=False)
    return build_dataset(
        _docs(), tmp / out, val_docs=8, vocab_size=300, workers=1, transform=tf, progress=False
    )


def test_a_transform_cannot_put_text_of_its_own_into_the_training_shards(tmp_path: Path, monkeypatch) -> None:
    # control: without the reply's check the smuggler's build passes its proof, and the training shards
    # hold the text it carried (the test can see the attack land)
    with monkeypatch.context() as m:
        m.setattr(tfmod, "unexplained_change", lambda text, out, markers, escapes=None: None, raising=False)
        ds = _build(tmp_path, "control")
        assert SECRET.strip() in _training_text(ds)
    with pytest.raises(
        TransformFailure,
        match=r"changed document 0 of the batch's split \(encode\) beyond case and markers at byte 0: "
        r".*\(split train\); no dataset was written$",
    ):
        _build(tmp_path, "refused")
    assert not list((tmp_path / "refused").glob("fineweb_*"))


@given(st.text(alphabet=st.characters(codec="utf-8") | st.sampled_from("\ue000\ue001AbÉßİſΣ"), max_size=60))
def test_the_reference_case_transform_changes_nothing_but_case_and_markers(text: str) -> None:
    from data.proof import CaseTransform

    tf = CaseTransform()
    assert tfmod.unexplained_change(text, tf.encode_text(text), tf.markers) is None


@pytest.mark.parametrize(
    ("text", "out", "why"),
    [
        ("abc", "abx", r"at byte 2: 'c' became 'x'"),
        ("abc", "\ue000abc", r"adds 1 marker\(s\) to a text it leaves unchanged"),
        ("Abc", "\ue000a\ue000bc", r"adds 2 markers for 1 changed character\(s\)"),
        ("abc", "ab", r"at byte 2: its text less the markers has 2 characters, the document 3"),
    ],
)
def test_changes_beyond_case_and_markers_are_named(text: str, out: str, why: str) -> None:
    import re

    said = tfmod.unexplained_change(text, out, ("\ue000",))
    assert said is not None and re.fullmatch(why, said), said


# ---- notes left by the validation child for the training child, and the parent attacked ----

_SPY = """
import ctypes, fcntl, json, os, signal, socket, time
NAME = "spy"
MARKERS = ()
NOTE, P, PARENT = {note!r}, {target!r}, {parent!r}
PLACES = {{"home": os.path.join(os.environ.get("HOME", "/nonexistent"), NOTE), "tmp": "/tmp/" + NOTE,
          "shm": "/dev/shm/" + NOTE}}


def _daemon(secret):  # outlives the child if it can: a lock, an abstract socket, its name
    if os.fork():
        return
    os.setsid()
    if os.fork():
        os._exit(0)
    try:
        ctypes.CDLL(None).prctl(15, NOTE[:15].encode(), 0, 0, 0)  # PR_SET_NAME: found by the test
        s = socket.socket(socket.AF_UNIX)
        s.bind("\\0" + NOTE)
        s.listen(1)
        f = open(P, "rb")
        fcntl.flock(f, fcntl.LOCK_EX)
        s.settimeout(0.2)
        end = time.time() + 60
        while time.time() < end:
            try:
                c, _ = s.accept()
                c.sendall(secret.encode())
                c.close()
            except OSError:
                pass
    finally:
        os._exit(0)


def encode_text(t):  # the validation child: the secret left everywhere it can reach
    for path in PLACES.values():
        try:
            with open(path, "w") as f:
                f.write(t)
        except OSError:
            pass
    for act in (
        lambda: os.setxattr(P, "user.pgspy", t.encode()),
        lambda: os.chmod(P, 0o4777),
        lambda: os.utime(P, (123456789, 123456789)),
    ):
        try:
            act()
        except OSError:
            pass
    _daemon(t)
    time.sleep(1.0)  # the daemon binds and locks before this child is closed
    return t


def decode_text(t):  # the training child: every note read back, then the parent tried
    found = {{}}
    for key, path in PLACES.items():
        try:
            found[key] = open(path).read()
        except OSError:
            pass
    try:
        found["xattr"] = os.getxattr(P, "user.pgspy").decode()
    except OSError:
        pass
    st = os.stat(P)
    found["mode"], found["mtime"] = st.st_mode & 0o7777, int(st.st_mtime)
    with open(P, "rb") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            found["flock"] = "held"
    s = socket.socket(socket.AF_UNIX)
    try:
        s.connect("\\0" + NOTE)
        found["socket"] = s.recv(100).decode()
    except OSError:
        pass
    libc = ctypes.CDLL(None, use_errno=True)  # page-cache residency of a file both can read
    libc.mmap.restype, libc.mmap.argtypes = ctypes.c_void_p, (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int,
                                                               ctypes.c_int, ctypes.c_int, ctypes.c_long)
    libc.mincore.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p)
    with open(P, "rb") as f:
        addr = libc.mmap(None, 4096, 1, 1, f.fileno(), 0)  # PROT_READ, MAP_SHARED
        if libc.mincore(ctypes.c_void_p(addr), 4096, ctypes.create_string_buffer(1)) == 0:
            found["mincore"] = "answered"
    try:
        os.kill(PARENT, signal.SIGUSR1)
        found["signal"] = "sent"
    except OSError:
        pass
    try:
        found["parent_environ"] = len(open(f"/proc/{{PARENT}}/environ", "rb").read())
    except OSError:
        pass
    return json.dumps(found)
"""


def _survivors(note: str) -> list[int]:
    """Processes named `note` (the spy's daemon), anywhere on this machine."""
    pids = []
    for d in Path("/proc").iterdir():
        try:
            if d.name.isdigit() and (d / "comm").read_text().strip() == note[:15]:
                pids.append(int(d.name))
        except OSError:
            pass
    return pids


@pytest.mark.parametrize("sandbox", ["auto", "off"], ids=["confined", "control-unconfined"])
def test_the_validation_child_leaves_the_training_child_nothing(tmp_path: Path, sandbox: str) -> None:
    """The validation child leaves its text in HOME, /tmp and /dev/shm, in an extended attribute, the mode
    bits and the times of a file both children can read, in a lock held on that file and an abstract socket
    held by a daemon that leaves its session; the training child reads each back, asks the page cache,
    signals the trusted parent and reads its environment. Confined, nothing arrives and no process of the
    first child outlives it. The control runs the same pair unconfined (sandbox off, the shared file a
    temporary one): every channel but HOME carries the secret there, so each assertion can fail; and there
    the daemon, holding the child's output pipe, must not stall the trusted side (it did, 60 s)."""
    import os
    import secrets
    import signal
    import time

    from isolation.sandbox import missing_layers, probe_machine

    if sandbox == "auto" and missing_layers(probe_machine(), network="auto", multi_node=False, seccomp=True):
        pytest.skip(
            "this machine lacks isolation layers (pgolf check --machine): the confined case needs them all"
        )
    note = f"pgspy{secrets.token_hex(5)}"
    if sandbox == "off":
        target = tmp_path / "shared.txt"
        target.write_text("a file both children can read\n" * 200)
    else:  # a file of the Python installation: every world reads it
        target = Path(json.__file__)
    before = os.stat(target)
    got: list[int] = []
    old = signal.signal(signal.SIGUSR1, lambda *_: got.append(1))
    body = _SPY.format(note=note, target=str(target), parent=os.getpid())
    tf = ConfinedTransforms(_submitted(tmp_path, body), sandbox=sandbox, reset_page_cache=False)
    try:
        t0 = time.monotonic()
        with tf.for_split("val") as val:
            val.encode_texts(["SECRET-VALIDATION-TEXT"])
        closed_s = time.monotonic() - t0  # a daemon holding the child's output stalled this 60 s once
        alive = _survivors(note)
        with tf.for_split("train") as train:
            found = json.loads(train.decode_texts(["x"])[0])
    finally:
        signal.signal(signal.SIGUSR1, old)
        for pid in _survivors(note):  # the control's daemon, which this test started
            os.kill(pid, signal.SIGKILL)
        for leftover in (Path("/tmp") / note, Path("/dev/shm") / note):
            leftover.unlink(missing_ok=True)
    carried = {k for k, v in found.items() if "SECRET" in str(v) or v == "held"}
    changed = {
        k
        for k in ("mode", "mtime")
        if found[k] != {"mode": before.st_mode & 0o7777, "mtime": int(before.st_mtime)}[k]
    }
    reached = {k for k in ("mincore", "signal", "parent_environ") if k in found} | (
        {"signal"} if got else set()
    )
    if sandbox == "off":
        assert carried == {"tmp", "shm", "xattr", "flock", "socket"}, found
        assert changed == {"mode", "mtime"} and reached == {"mincore", "signal", "parent_environ"}, found
        assert alive, "the control's daemon outlived its child"
    else:
        assert carried == set() and changed == set() and reached == set() and not alive, (found, alive)
    assert closed_s < 15, f"the trusted side waited {closed_s:.0f} s for the validation child to close"


# ---- ordinary characters declared as markers: the escape position as a free character ----

_MARKER_LETTERS = f"""
NAME = "lettermarks"
MARKERS = tuple("abcdefghijklmnopqrstuvwxyz")
SHOWN = {SECRET.upper().replace(" ", "_")!r}  # no marker letter in it: upper case, "_" for a space


def encode_text(t):
    out, k = [], 0
    for c in t:
        if c in MARKERS:  # "an escape of a literal marker": the marker kept (0 bytes), then its own text
            out.append(c + SHOWN[k % len(SHOWN)])
            k += 1
        else:
            out.append(c)
    return "".join(out)


def decode_text(e):
    out, i = [], 0
    while i < len(e):
        out.append(e[i])
        i += 2 if e[i] in MARKERS else 1
    return "".join(out)
"""


def test_a_transform_cannot_spell_its_own_text_where_the_document_has_a_marker(
    tmp_path: Path, monkeypatch
) -> None:
    """Where the document holds a declared marker character, the check took any character as its "escape". A
    transform that declares the lower-case letters its markers writes each one as itself (a zero-byte marker)
    followed by a character of its own text, of the same UTF-8 length: every proof holds, and the training
    shards' counted tokens spell the transform's text. An escape is now one fixed character per marker."""
    shown = SECRET.upper().replace(" ", "_")[:40]
    src = _submitted(tmp_path, _MARKER_LETTERS)

    def build(out: str) -> Path:
        tf = ConfinedTransforms(src, reset_page_cache=False)
        return build_dataset(
            _docs(), tmp_path / out, val_docs=8, vocab_size=400, workers=1, transform=tf, progress=False
        )

    def spelled(ds: Path) -> str:  # the training shards less the zero-byte markers and the document's spaces
        m = load_manifest(ds)
        tok = load_tokenizer(ds / m.raw["tokenizer"]["file"])
        text = tok.decode([int(i) for i in read_split(ds, "train") if int(i) != m.bos_id])
        return "".join(c for c in text if not ("a" <= c <= "z" or c == " "))

    with monkeypatch.context() as m:  # control: the attack lands without the check
        m.setattr(tfmod, "unexplained_change", lambda text, out, markers, escapes=None: None, raising=False)
        assert shown in spelled(build("control"))
    with pytest.raises(
        TransformFailure,
        match=r"beyond case and markers at byte \d+: the marker '[a-z]' became .*one escape per marker",
    ):
        build("refused")
    assert not list((tmp_path / "refused").glob("fineweb_*"))


@pytest.mark.parametrize(
    ("text", "out", "ok"),
    [
        ("\ue000x\ue000", "\ue001\ue100x\ue001\ue100", True),  # the same escape each time (CaseTransform's)
        ("\ue000x\ue000", "\ue001\ue100x\ue001\ue101", False),  # a second escape: a character of its choice
    ],
)
def test_an_escape_is_one_fixed_character_per_marker(text: str, out: str, ok: bool) -> None:
    said = tfmod.unexplained_change(text, out, ("\ue000", "\ue001"))
    assert (said is None) == ok, said
