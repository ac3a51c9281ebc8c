"""A submitted transform.py, run confined one child per split (scoring/worker/transform.py).

The equivalence: a submitted copy of the built-in case transform builds the same shards as `--transform case`,
byte for byte. The hostile ones: a transform whose decode drops a character is refused by the proof (split
and document named, no dataset); one that reads the documents file cannot (it is outside its sandbox);
one that remembers what the validation child saw finds nothing in the training child.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from data.build import TokenizerProofError, build_dataset
from data.verify import verify_dataset
from scoring.worker.transform import ConfinedTransforms, TransformFailure, frame, unframe

REPO = Path(__file__).resolve().parents[3]
CASE_COPY = REPO / "tests" / "unit" / "data" / "transforms" / "case_copy.py"
SAMPLE = REPO.parent / "shared" / "data" / "fineweb" / "sample.jsonl"
N_DOCS, VAL_DOCS = 120, 30


@pytest.fixture(scope="module")
def docs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if not SAMPLE.is_file():
        pytest.skip(f"{SAMPLE} absent: the sample documents are not on this machine")
    out = tmp_path_factory.mktemp("docs") / "docs.jsonl"
    with SAMPLE.open(encoding="utf-8") as f:
        out.write_text("".join(next(f) for _ in range(N_DOCS)), encoding="utf-8")
    return out


def _texts(path: Path) -> list[str]:
    return [json.loads(line)["text"] for line in path.read_text(encoding="utf-8").splitlines()]


def _build(docs: Path, out: Path, transform: object) -> Path:
    return build_dataset(
        _texts(docs),
        out,
        val_docs=VAL_DOCS,
        vocab_size=400,  # trained on the transformed training text, the markers as pieces
        workers=1,
        transform=transform,  # type: ignore[arg-type]
        progress=False,
    )


def _submitted(tmp: Path, body: str) -> Path:
    src = tmp / "submitted" / "transform.py"
    src.parent.mkdir(parents=True, exist_ok=True)
    src.write_text(body, encoding="utf-8")
    return src


@given(st.lists(st.text(max_size=50), max_size=20))
def test_transform_framing_round_trips(texts: list[str]) -> None:
    assert unframe(frame(texts)) == texts


def test_transform_submitted_case_copy_builds_identical_shards(docs: Path, tmp_path: Path) -> None:
    a = _build(docs, tmp_path / "builtin", "case")
    b = _build(docs, tmp_path / "submitted", ConfinedTransforms(CASE_COPY, reset_page_cache=False))
    names = sorted(p.name for p in a.glob("*.bin"))
    assert names and names == sorted(p.name for p in b.glob("*.bin"))
    for name in names:
        assert (a / name).read_bytes() == (b / name).read_bytes(), name
    manifest = json.loads((b / "manifest.json").read_text())
    assert manifest["canonical"]["transform"] == "case"
    assert manifest["transform"]["name"] == "case" and len(manifest["transform"]["sha256"]) == 64
    tokenizer = manifest["tokenizer"]["file"]  # trained on the same text: the same file, byte for byte
    assert (a / tokenizer).read_bytes() == (b / tokenizer).read_bytes()
    children = manifest["transform"]["children"]  # each child's split and confinement, in order
    assert [c["split"] for c in children] == ["declare", "train", "probe", "val", "train"]
    for c in children:
        assert c["mode"] != "off" and set(c["guarantees"]) and "missing_layers" in c
    # pgolf data verify proves both disjoint from the shards and the manifest's markers (it once decoded a
    # transformed dataset with the markers in, and every validation digest differed from the build's)
    assert verify_dataset(a).ok, verify_dataset(a).problems()
    # and hashes the transform file against the manifest (never runs it)
    assert verify_dataset(b, transform=CASE_COPY).ok
    edited = _submitted(tmp_path, CASE_COPY.read_text(encoding="utf-8") + "\n# edited\n")
    bad = verify_dataset(b, transform=edited)
    assert not bad.ok and any("not the same file" in p for p in bad.problems())
    assert any("its file was not checked" in line for line in verify_dataset(b, quick=True).totals)
    plain = verify_dataset(a, transform=CASE_COPY, quick=True)
    assert not plain.ok and "built without one" in " ".join(plain.problems())


def test_transform_that_drops_a_character_is_refused(docs: Path, tmp_path: Path) -> None:
    body = CASE_COPY.read_text(encoding="utf-8") + (
        "\n_seen = [0]\n_decode0 = decode_text\n\n\ndef decode_text(text):\n"
        "    _seen[0] += 1\n"
        "    out = _decode0(text)\n"
        "    return out[:-1] if _seen[0] == 7 and out else out\n"
    )
    out = tmp_path / "out"
    with pytest.raises(TokenizerProofError, match=r"val document 6 .*No dataset was written"):
        _build(docs, out, ConfinedTransforms(_submitted(tmp_path, body), reset_page_cache=False))
    assert not list(out.glob("*.bin"))


def test_transform_cannot_read_the_documents_file(docs: Path, tmp_path: Path) -> None:
    body = (
        f"NAME = 'peek'\nMARKERS = ()\nSTOLEN = open({str(docs)!r}).read(100)\n"
        "def encode_text(t):\n    return t\n"
        "def decode_text(t):\n    return t\n"
    )
    with pytest.raises(TransformFailure, match=r"failed to start .*(PermissionError|Errno)"):
        ConfinedTransforms(_submitted(tmp_path, body), reset_page_cache=False)


def test_transform_train_child_learns_nothing_of_validation(tmp_path: Path) -> None:
    body = (
        "import os\nNAME = 'spy'\nMARKERS = ()\n"
        "def encode_text(t):\n"
        "    for d in (os.environ.get('HOME', '/nonexistent'), '/tmp'):\n"
        "        try:\n"
        "            with open(os.path.join(d, 'spy-seen.txt'), 'a') as f:\n"
        "                f.write(t)\n"
        "        except OSError:\n"
        "            pass\n"
        "    return t\n"
        "def decode_text(t):\n"
        "    found = []\n"
        "    for d in (os.environ.get('HOME', '/nonexistent'), '/tmp'):\n"
        "        try:\n"
        "            found.append(open(os.path.join(d, 'spy-seen.txt')).read())\n"
        "        except OSError:\n"
        "            pass\n"
        "    return '|'.join(found)\n"
    )
    tf = ConfinedTransforms(_submitted(tmp_path, body), reset_page_cache=False)
    with tf.for_split("val") as val:
        val.encode_texts(["the secret validation text"])
    with tf.for_split("train") as train:
        assert "secret" not in train.decode_texts(["x"])[0]


def test_transform_output_refused_when_too_large_or_wrong_count(tmp_path: Path) -> None:
    big = _submitted(
        tmp_path,
        "NAME = 'big'\nMARKERS = ()\ndef encode_text(t):\n    return t * 10 + 'x' * 2000\ndecode_text = encode_text\n",
    )
    with (
        ConfinedTransforms(big, reset_page_cache=False).for_split("val") as child,
        pytest.raises(TransformFailure, match=r"split val"),
    ):
        child.encode_texts(["abc"])


def test_transform_deadline(tmp_path: Path) -> None:
    slow = _submitted(
        tmp_path,
        "import time\nNAME = 'slow'\nMARKERS = ()\ndef encode_text(t):\n    time.sleep(30)\n    return t\n"
        "decode_text = encode_text\n",
    )
    with (
        ConfinedTransforms(slow, reset_page_cache=False, timeout_s=2).for_split("train") as child,
        pytest.raises(TransformFailure, match=r"within 2 s \(split train\)"),
    ):
        child.encode_texts(["abc"])


def test_transform_audit_through_the_child_equals_builtin(docs: Path, tmp_path: Path) -> None:
    from data.proof import CaseTransform, prove_tokenizer
    from data.tokenizer import load_tokenizer

    tok = load_tokenizer(_build(docs, tmp_path / "d", "case") / "tokenizer_400_bpe_case.model")
    texts = _texts(docs)[:VAL_DOCS]
    a = prove_tokenizer(tok, texts, transform=CaseTransform())
    b = prove_tokenizer(tok, texts, transform=ConfinedTransforms(CASE_COPY, reset_page_cache=False))
    assert a.passed and b.passed
    assert (a.docs, a.tokens, a.canonical, a.transform) == (b.docs, b.tokens, b.canonical, b.transform)


_RAW_REPLY = """import json, os, struct, sys
NAME = 'raw'
MARKERS = ()
_FD = json.loads(sys.argv[1])['out_fd']


def encode_text(t):
    texts = {texts!r}
    payload = {tag!r} + struct.pack('<I', len(texts)) + b''.join(struct.pack('<I', len(b)) + b for b in texts)
    os.write(_FD, struct.pack('<I', len(payload)) + payload)
    os._exit(0)


decode_text = encode_text
"""


@pytest.mark.parametrize(
    ("texts", "refusal"),
    [
        ([b"a", b"b"], r"gave back 2 texts for 1 to encode \(split val\); no dataset was written$"),
        ([b"\xff"], r"not UTF-8 .*split val"),
        (b"untagged", r"malformed reply to encode \(no reply tag\)"),
    ],
)
def test_transform_raw_reply_refused(tmp_path: Path, texts: list[bytes] | bytes, refusal: str) -> None:
    tag, texts = (b"", [texts]) if isinstance(texts, bytes) else (b"K", texts)
    src = _submitted(tmp_path, _RAW_REPLY.format(texts=texts, tag=tag))
    with (
        ConfinedTransforms(src, reset_page_cache=False).for_split("val") as child,
        pytest.raises(TransformFailure, match=refusal),
    ):
        child.encode_texts(["x"])


def test_a_child_that_stops_reading_cannot_stall_the_trusted_side(tmp_path: Path) -> None:
    """The child answers its hello, then never reads again (it replaced its own reader): a batch larger than
    the pipe's buffer must not block the trusted side's write past the deadline."""
    deaf = _submitted(
        tmp_path,
        "import sys, time\nsys.modules['__main__']._read_msg = lambda *a, **k: time.sleep(3600)\n"
        "NAME = 'deaf'\nMARKERS = ()\ndef encode_text(t):\n    return t\ndecode_text = encode_text\n",
    )
    with (
        ConfinedTransforms(deaf, reset_page_cache=False, timeout_s=2).for_split("val") as child,
        pytest.raises(TransformFailure, match=r"did not encode a batch within 2 s \(split val\)"),
    ):
        child.encode_texts(["x" * (1 << 20)])


_RAISES_ON_ONE = """NAME = 'fussy'
MARKERS = ()


def encode_text(t):
    return t


def decode_text(t):
    if 'sorry' in t:
        raise ValueError('invalid marker placement')
    return t
"""


def test_a_transform_that_raises_is_refused_naming_the_document(tmp_path: Path) -> None:
    # The record's own case transform raised on one sample document under sp1024's NFKC (U+00BA), and the
    # refusal named only the batch; the audit's document numbers also counted canonical auto's probe text.
    from data.proof import prove_tokenizer
    from data.tokenizer import ByteTokenizer

    src = _submitted(tmp_path, _RAISES_ON_ONE)
    texts = ["fine", "also fine", "so sorry", "fine again"]
    with pytest.raises(
        TransformFailure,
        match=r"raised on document 2 of the split \(decode\): ValueError: invalid marker placement "
        r"\(transform.py:11\) \(split audit\)$",
    ):
        prove_tokenizer(ByteTokenizer(), texts, transform=ConfinedTransforms(src, reset_page_cache=False))


_IDENTITY = "NAME = 'ident'\nMARKERS = ()\ndef encode_text(t):\n    return t\ndecode_text = encode_text\n"


def _lacking_caps():
    from isolation.sandbox import MachineCaps

    return MachineCaps(landlock_abi=5, root=False, unshare=None)  # as tests/unit/test_gpu_check.py's


def test_the_manifest_says_how_confined_the_transform_was(tmp_path: Path, monkeypatch) -> None:
    """A build with sandbox 'auto' on a machine without namespaces, worlds or signal scoping runs its
    transform with what holds; the manifest (pg-transform-record v1) and `pgolf data verify` name what was
    missing. The control: the same build on this machine's own layers says every one held (where it has
    them), so the record does tell the two apart."""
    import isolation.sandbox as sandbox
    from data.build import TRANSFORM_RECORD_FORMAT, TRANSFORM_RECORD_VERSION

    texts = [f"document {i}: " + "some plain text " * 20 for i in range(12)]
    src = _submitted(tmp_path, _IDENTITY)

    def build(out: Path) -> tuple[dict, str]:
        tf = ConfinedTransforms(src, reset_page_cache=False)
        build_dataset(texts, out, val_docs=4, tokenizer="byte260", canonical="raw", workers=1, transform=tf)
        return json.loads((out / "manifest.json").read_text())["transform"], verify_dataset(out).table()

    held, held_table = build(tmp_path / "held")
    assert held["format"] == TRANSFORM_RECORD_FORMAT and held["format_version"] == TRANSFORM_RECORD_VERSION
    assert [c["split"] for c in held["children"]] == ["declare", "val", "train"]
    if not sandbox.missing_layers(sandbox.probe_machine(), network="auto", multi_node=False, seccomp=True):
        assert held["missing_layers"] == [] and held["guarantees_not_held"] == {}
        assert "every isolation layer and guarantee held" in held_table, held_table

    monkeypatch.setattr(sandbox, "probe_machine", _lacking_caps)
    lacking, table = build(tmp_path / "lacking")
    lost = ["namespaces", "network_namespace", "signal_scoping", "world"]
    assert lacking["missing_layers"] == lost
    for c in lacking["children"]:
        assert c["mode"] == "auto" and c["missing_layers"] == lost and c["namespaces"] == []
    assert lacking["guarantees_not_held"] == {
        "no_network": "missing",
        "no_signals_or_tracing_outside": "missing",  # Landlock ABI 5 and no PID namespace
        "no_ipc_outside": "missing",
        "nothing_shared": "missing",
    }
    line = next(ln for ln in table.splitlines() if ln.startswith("transform 'ident'"))
    assert (
        "sandbox auto" in line
        and "layers missing: namespaces, network_namespace, signal_scoping, world" in line
    )
    assert "no_network (missing)" in line and "nothing_shared (missing)" in line
