"""A determined competitor's transform.py (scoring/worker/transform.py), each attack with its control.

The smuggler: its reply decodes back to the training document, but the text the tokenizer reads is
validation text the transform carries in its own source, the document itself hidden in zero-byte markers.
The control shows the attack lands without the boundary's check (the validation text is in the training
shards, found by reading them back); the check refuses it.
"""

from __future__ import annotations

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
        m.setattr(tfmod, "unexplained_change", lambda text, out, markers: None, raising=False)
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
        ("abc", "abd", r"at byte 2: 'c' became 'd'"),
        ("abc", "\ue000abc", r"adds 1 marker\(s\) to a text it leaves unchanged"),
        ("Abc", "\ue000a\ue000bc", r"adds 2 markers for 1 changed character\(s\)"),
        ("abc", "ab", r"at byte 2: its text less the markers has 2 characters, the document 3"),
    ],
)
def test_changes_beyond_case_and_markers_are_named(text: str, out: str, why: str) -> None:
    import re

    said = tfmod.unexplained_change(text, out, ("\ue000",))
    assert said is not None and re.fullmatch(why, said), said
