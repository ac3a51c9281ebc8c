"""`pgolf unpack` and `pgolf sample` run no submitted code in the official's process.

A custom codec.py (unpack, sample) and model.py (sample) run only in a confined process: the decode
process of scoring/worker/decode.py, or the model worker. Hostile code here tries to create a file
outside its temp folder (by the reported route, torch.load of a pickle that runs a shell command,
and by a plain open past the static lint); the file never appears, and the command either succeeds
or fails with one clear line, never a traceback. Honest code gives what it gave before: a custom
codec unpacks to the same tensors, and `pgolf sample` prints the same text as the in-process
sampler it replaced (kept below, verbatim, as the reference).
"""

from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from data.io import sha256_bytes
from scoring.artifact.cap import ARTIFACT_CAP_BYTES
from scoring.artifact.format import artifact_codec, decode_state, read_artifact, write_artifact
from scoring.artifact.pack import pack_state, state_equal
from scoring.codecheck import lint_scored_code
from scoring.worker.decode import DecodeFailure, decode_confined, unpack_artifact
from tests.conftest import BASELINE, REPO
from tests.unit.scoring.test_eval_support import TINY_CONFIG, TINY_MODEL, _one_thread, write_submission  # noqa: F401

HONEST_CODEC = '''"""An honest custom codec: safetensors bytes."""
from safetensors.torch import load, save

NAME = "fixture_safetensors"
VERSION = 1


def encode(state):
    return save({k: v.contiguous() for k, v in state.items()})


def decode(payload):
    return load(payload)
'''

# The reported attack: a codec that unpickles its payload (the payload runs a shell command).
PICKLE_CODEC = '''"""decode() unpickles the payload."""
import io

import torch

NAME = "pickled"
VERSION = 1


def encode(state):
    buf = io.BytesIO()
    torch.save(state, buf)
    return buf.getvalue()


def decode(payload):
    return torch.load(io.BytesIO(payload), weights_only=False)
'''

# Runs `code` (a Python expression) past the static lint: typing evaluates the string annotation.
SMUGGLE = """

def _smuggled(x: "{code}"):
    pass


def smuggle():
    try:
        return typing.get_type_hints(_smuggled)["x"]
    except Exception as e:  # noqa: BLE001
        return repr(e)
"""


def smuggling(code: str) -> str:
    return SMUGGLE.replace("{code}", code.replace('"', '\\"'))


def write_code(target: Path) -> str:
    return f"__import__('builtins').open('{target}', 'w').write('pwned')"


def writing_codec(target: Path) -> str:
    """Honest decoding, after an attempt to write `target` (its failure swallowed)."""
    return HONEST_CODEC.replace("from safetensors", "import typing\n\nfrom safetensors").replace(
        "    return load(payload)", "    smuggle()\n    return load(payload)"
    ) + smuggling(write_code(target))


class _Shell:
    def __init__(self, cmd: str):
        self.cmd = cmd

    def __reduce__(self):
        return (os.system, (self.cmd,))


def tiny_state() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {
        "emb.weight": torch.randn(260, 16, generator=g),
        "mix": torch.randn(16, generator=g),
        "head.weight": torch.randn(260, 16, generator=g).to(torch.bfloat16),
        "count": torch.tensor([3, 4], dtype=torch.int64),
    }


def pack_tiny_model(folder: Path, out: Path) -> None:
    """The tiny model's tensors, packed with the built-in codec (nothing of `folder` is imported here)."""
    g = torch.Generator().manual_seed(0)
    state = {"emb.weight": torch.randn(260, 16, generator=g), "mix": torch.full((16,), 0.5),
             "head.weight": torch.randn(260, 16, generator=g)}  # fmt: skip
    pack_state(
        state, folder, out, codec_name="int8_zlib", model_config=TINY_CONFIG, cap_bytes=ARTIFACT_CAP_BYTES
    )


def packed(folder: Path, codec_src: str, out: Path) -> Path:
    (folder / "codec.py").write_text(codec_src)
    pack_state(
        tiny_state(),
        folder,
        out,
        codec_name="submission",
        model_config=TINY_CONFIG,
        cap_bytes=ARTIFACT_CAP_BYTES,
    )
    return out


def with_payload(artifact: Path, payload: bytes) -> None:
    header = dict(
        read_artifact(artifact).header, payload_bytes=len(payload), payload_sha256=sha256_bytes(payload)
    )
    write_artifact(artifact, header, payload)


def pgolf(*argv: str, timeout: int = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "harness.cli", *argv],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=timeout,
        check=False,
    )


def assert_one_clear_line(r: subprocess.CompletedProcess[str]) -> str:
    assert r.returncode in (1, 2), (r.returncode, r.stdout, r.stderr)
    assert "Traceback" not in r.stderr, r.stderr[-3000:]
    lines = r.stderr.strip().splitlines()
    assert lines and lines[-1].startswith("error: "), r.stderr[-3000:]
    return lines[-1]


# ---- pgolf unpack ----


def test_the_reported_pickle_codec_runs_its_shell_command_only_confined(tmp_path):
    target = tmp_path / "pwned_by_pickle"
    folder = write_submission(tmp_path / "sub")
    artifact = packed(folder, PICKLE_CODEC, tmp_path / "a.pgolf")
    payload = io.BytesIO()
    torch.save(_Shell(f"touch {target}"), payload)  # torch.load(weights_only=False) runs it
    with_payload(artifact, payload.getvalue())
    # the control: decoded in this process (what `pgolf unpack` did before), the command runs
    art = read_artifact(artifact)
    with pytest.raises(Exception):  # noqa: B017, PT011 - os.system's int is not a state dict
        decode_state(art, artifact_codec(art, folder))
    assert target.exists()
    target.unlink()

    out = tmp_path / "out" / "state.safetensors"
    r = pgolf("unpack", str(artifact), "--out", str(out), "--submission", str(folder))
    line = assert_one_clear_line(r)
    assert "the submission's codec failed to decode" in line
    assert not target.exists() and not out.exists()


def test_a_codec_that_writes_outside_gets_nothing_written_and_still_unpacks(tmp_path):
    target = tmp_path / "pwned_by_open"
    folder = write_submission(tmp_path / "sub")
    artifact = packed(folder, writing_codec(target), tmp_path / "a.pgolf")
    assert lint_scored_code(folder) == [], (
        "the hostile codec should get past the lint: the sandbox is what is tested"
    )
    out = tmp_path / "state.safetensors"
    r = pgolf("unpack", str(artifact), "--out", str(out), "--submission", str(folder))
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.strip() == f"wrote 4 tensors to {out}"
    assert not target.exists()
    assert state_equal(load_file(out), tiny_state())


def test_an_honest_custom_codec_unpacks_to_the_same_tensors(tmp_path):
    folder = write_submission(tmp_path / "sub")
    artifact = packed(folder, HONEST_CODEC, tmp_path / "a.pgolf")
    art = read_artifact(artifact)
    before = decode_state(art, artifact_codec(art, folder))  # the old in-process decode (honest code)
    state = unpack_artifact(artifact, tmp_path / "out.safetensors", folder)
    assert state_equal(state, before) and state_equal(load_file(tmp_path / "out.safetensors"), before)
    assert state_equal(state, tiny_state())


def test_a_built_in_codec_still_unpacks_without_a_submission(tmp_path):
    folder = write_submission(tmp_path / "sub")
    pack_state(
        tiny_state(), folder, tmp_path / "a.pgolf", codec_name="int8_zlib", model_config={}, cap_bytes=10**9
    )
    state = unpack_artifact(tmp_path / "a.pgolf", tmp_path / "out.safetensors")
    assert state_equal(load_file(tmp_path / "out.safetensors"), state)


def test_a_custom_codec_without_its_folder_is_one_line(tmp_path):
    folder = write_submission(tmp_path / "sub")
    artifact = packed(folder, HONEST_CODEC, tmp_path / "a.pgolf")
    r = pgolf("unpack", str(artifact), "--out", str(tmp_path / "o.safetensors"))
    assert r.returncode == 2 and "pass --submission" in assert_one_clear_line(r)


FORGED = {
    # the codec leaves a link to a file of the official's where the state file goes, and exits 0
    "symlink": "os.symlink('/etc/passwd', os.environ['TMPDIR'] + '/state.safetensors')",
    # the codec writes a state file with other shapes than the header's, and exits 0
    "shapes": "save_file({'emb.weight': torch.zeros(1000, 260), 'mix': torch.zeros(16), "
    "'head.weight': torch.zeros(260, 16), 'count': torch.zeros(2)}, os.environ['TMPDIR'] + '/state.safetensors')",
    # the state file is a FIFO: opening it must not block this process
    "fifo": "os.mkfifo(os.environ['TMPDIR'] + '/state.safetensors')",
}


@pytest.mark.parametrize("how", sorted(FORGED))
def test_what_the_confined_decode_leaves_is_not_believed(tmp_path, how):
    codec = (
        "import os\n\nimport torch\nfrom safetensors.torch import save_file\n\nNAME = 'forger'\nVERSION = 1\n\n\n"
        "def encode(state):\n    return b'x'\n\n\n"
        f"def decode(payload):\n    {FORGED[how]}\n    os._exit(0)\n"
    )
    folder = write_submission(tmp_path / "sub")
    artifact = packed(folder, codec, tmp_path / "a.pgolf")
    with pytest.raises(DecodeFailure, match="state file|shape"):
        decode_confined(artifact, folder)


def test_a_decode_that_never_returns_is_killed(tmp_path):
    codec = HONEST_CODEC.replace("    return load(payload)", "    while True:\n        pass")
    folder = write_submission(tmp_path / "sub")
    artifact = packed(folder, codec, tmp_path / "a.pgolf")
    with pytest.raises(DecodeFailure, match="did not decode"):
        decode_confined(artifact, folder, timeout_s=5)


# ---- pgolf sample ----


def test_a_model_that_writes_outside_gets_nothing_written_and_still_samples(tmp_path, tiny_dataset):
    target = tmp_path / "pwned_by_model"
    model = "import typing\n\n" + TINY_MODEL + smuggling(write_code(target)) + "\n\nSMUGGLED = smuggle()\n"
    folder = write_submission(tmp_path / "sub", model_src=model)
    assert lint_scored_code(folder) == []
    pack_tiny_model(folder, tmp_path / "a.pgolf")
    r = pgolf("sample", str(tmp_path / "a.pgolf"), "--submission", str(folder), "--data", str(tiny_dataset),
              "--tokens", "8", "--threads", "1")  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    assert "[8 tokens in" in r.stdout
    assert not target.exists()


def test_a_model_whose_write_fails_ends_sample_with_one_line(tmp_path, tiny_dataset):
    target = tmp_path / "pwned_by_model"
    folder = write_submission(tmp_path / "sub", model_src=TINY_MODEL + f"\n{write_code(target)}\n")
    pack_tiny_model(folder, tmp_path / "a.pgolf")
    r = pgolf("sample", str(tmp_path / "a.pgolf"), "--submission", str(folder), "--data", str(tiny_dataset),
              "--tokens", "4", "--threads", "1")  # fmt: skip
    line = assert_one_clear_line(r)
    # Landlock refuses it (PermissionError); in a world of its own the folder is on a read-only root
    refused = "PermissionError" in line or "Read-only file system" in line
    assert r.returncode == 1 and "the model worker failed" in line and refused, line
    assert not target.exists()


@torch.inference_mode()
def old_sample_text(artifact: Path, folder: Path, tok, prompt: str, n: int, context: int, temperature: float,
                    top_k: int, seed: int) -> str:  # fmt: skip
    """What `pgolf sample` printed before it used a worker: the model built and run in this process (verbatim)."""
    from scoring.worker.loading import load_model

    art = read_artifact(artifact)
    model = load_model(art, decode_state(art, artifact_codec(art, folder)), folder, torch.device("cpu"))
    prompt_ids = [tok.bos_id] + (tok.encode([prompt])[0] if prompt else [])
    g = torch.Generator().manual_seed(seed)
    ids = list(prompt_ids)
    out: list[int] = []
    for _ in range(n):
        x = torch.tensor([ids[-context:]], dtype=torch.long)
        logits = model(x)[0, -1, : tok.vocab_size].double()
        if temperature <= 0:
            nxt = int(torch.argmax(logits))
        else:
            logits = logits / temperature
            if 0 < top_k < logits.numel():
                kth = torch.topk(logits, top_k).values[-1]
                logits = logits.masked_fill(logits < kth, float("-inf"))
            nxt = int(torch.multinomial(torch.softmax(logits, -1), 1, generator=g))
        ids.append(nxt)
        out.append(nxt)
    return tok.decode(prompt_ids[1:] + out)


@pytest.fixture(scope="module")
def baseline_artifact(tmp_path_factory) -> Path:
    """The naive baseline's tiny preset, packed as `pgolf run` packs it (random weights: no training needed)."""
    from harness.config import load_config
    from scoring.worker.loading import build_model

    cfg = load_config(BASELINE, "tiny").model
    torch.manual_seed(1337)
    model = build_model(BASELINE, cfg)
    with (
        torch.no_grad()
    ):  # a larger spread than the init's, so the text is not a tie-break of near-equal logits
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    out = tmp_path_factory.mktemp("baseline") / "artifact.pgolf"
    pack_state(
        model.state_dict(),
        BASELINE,
        out,
        codec_name="int8_zlib",
        model_config=cfg,
        cap_bytes=ARTIFACT_CAP_BYTES,
    )
    return out


@pytest.mark.parametrize(
    ("prompt", "n", "context", "temperature", "top_k", "seed"),
    [
        ("The quick brown", 12, 1024, 0.0, 40, 0),
        ("", 16, 1024, 0.8, 40, 0),
        ("Hello there", 16, 6, 1.2, 0, 3),
    ],
    ids=["greedy", "default-sampling", "short-context"],
)
def test_sample_prints_what_the_in_process_sampler_printed(baseline_artifact, sp_dataset, prompt, n, context,
                                                           temperature, top_k, seed):  # fmt: skip
    from data.manifest import load_manifest
    from data.tokenizer import load_tokenizer

    tok = load_tokenizer(load_manifest(sp_dataset).tokenizer_path)
    want = old_sample_text(baseline_artifact, BASELINE, tok, prompt, n, context, temperature, top_k, seed)
    r = pgolf("sample", str(baseline_artifact), "--submission", str(BASELINE), "--data", str(sp_dataset),
              "--prompt", prompt, "--tokens", str(n), "--context", str(context), "--temperature", str(temperature),
              "--top-k", str(top_k), "--seed", str(seed), "--threads", "1")  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    text, _, stats = r.stdout.rpartition("\n\n[")
    assert stats.startswith(f"{n} tokens in") and text == want


@pytest.mark.long  # a whole scored run: minutes of the default suite's 10 on 2 cores
def test_sample_and_generate_take_a_run_folder(baseline_artifact, sp_dataset, tmp_path):
    """RUN_DIR stands for its artifact.pgolf, its code/ (what was packed) and the data it was scored on."""
    import json
    import shutil

    from scoring.artifact.cap import counted_files

    run = tmp_path / "run"
    (run / "code").mkdir(parents=True)
    shutil.copy2(baseline_artifact, run / "artifact.pgolf")
    for rel in counted_files(BASELINE):
        shutil.copy2(BASELINE / rel, run / "code" / rel)
    (run / "result.json").write_text(json.dumps({"provenance": {"data_dir": str(sp_dataset)}}))
    args = ("--prompt", "The quick brown", "--temperature", "0", "--threads", "1")
    by_run = pgolf("sample", str(run), "--tokens", "12", *args)
    by_hand = pgolf("sample", str(baseline_artifact), "--submission", str(BASELINE), "--data", str(sp_dataset),
                    "--tokens", "12", *args)  # fmt: skip
    assert by_run.returncode == 0 == by_hand.returncode, by_run.stderr[-3000:]
    assert by_run.stdout.rpartition("\n\n[")[0] == by_hand.stdout.rpartition("\n\n[")[0] != ""
    gen = pgolf("generate", str(run), "--prompt", "The quick brown", "--max-tokens", "8", "--threads", "1")
    assert gen.returncode == 0 and "8 tokens in" in gen.stdout, gen.stderr[-3000:]
    bare = pgolf("sample", str(baseline_artifact))
    assert bare.returncode == 2 and "needs --submission DIR (or pass the run folder instead)" in bare.stderr
    (tmp_path / "code_only").mkdir()
    empty = pgolf("sample", str(tmp_path / "code_only"), "--data", str(sp_dataset))
    assert empty.returncode == 2 and "a folder without artifact.pgolf" in empty.stderr


def test_a_codec_reads_nothing_under_the_officials_pythonpath(tmp_path, monkeypatch):
    """The official runs pgolf with PYTHONPATH naming a broad folder (PYTHONPATH=. from the home folder): every
    import folder was a read rule of the confined decode, so a codec read ~/.ssh and the HF token there and
    could say them in its error line. The process imports from none of those folders (its PYTHONPATH is the
    project's alone), so it reads none of them now; the decode still works."""
    home = tmp_path / "home"
    secret = home / ".ssh" / "id_ed25519"
    secret.parent.mkdir(parents=True)
    secret.write_text("FAKE-PRIVATE-KEY")
    monkeypatch.setenv("PYTHONPATH", f"{REPO}{os.pathsep}{home}")
    monkeypatch.setattr(sys, "path", [*sys.path, str(home)])
    reading = HONEST_CODEC.replace(
        "    return load(payload)",
        f"    try:\n        said = open({str(secret)!r}).read()\n    except OSError:\n        return load(payload)\n"
        "    raise ValueError('read: ' + said)",
    )
    folder = write_submission(tmp_path / "sub")
    artifact = packed(folder, reading, tmp_path / "a.pgolf")
    assert state_equal(decode_confined(artifact, folder), tiny_state())


def test_a_built_in_codecs_payload_is_decompressed_only_confined(tmp_path, monkeypatch):
    """`pgolf unpack` decoded a built-in codec's payload in the official's process, with no limit: a 98 KB
    int8_zlib artifact of zeros (a [100000, 1000] tensor) took 1.2 GB of memory and wrote 400 MB, so a 16 MB one
    asks some 160 GB. It decodes in the confined process now, under its memory limit; the tensors are the same."""
    import scoring.worker.decode as decode_mod

    def in_this_process(*args, **kwargs):
        raise AssertionError("a built-in codec decoded in the official's process")

    folder = write_submission(tmp_path / "sub")
    pack_state(
        tiny_state(), folder, tmp_path / "a.pgolf", codec_name="int8_zlib", model_config={}, cap_bytes=10**9
    )
    art = read_artifact(tmp_path / "a.pgolf")
    want = decode_state(art, artifact_codec(art, None))
    monkeypatch.setattr(decode_mod, "artifact_codec", in_this_process)
    state = unpack_artifact(tmp_path / "a.pgolf", tmp_path / "out.safetensors")
    assert state_equal(state, want) and state_equal(load_file(tmp_path / "out.safetensors"), want)


def test_a_built_in_codec_bomb_fails_in_one_line_under_the_childs_limit(tmp_path):
    """The same zeros decode in the confined process, whose address-space limit ends them (here 1 GB, the
    default three quarters of the machine): one line, nothing allocated in the official's process."""
    folder = write_submission(tmp_path / "sub")
    bomb = tmp_path / "bomb.pgolf"
    pack_state(
        {"w": torch.zeros(100_000, 1000)},
        folder,
        bomb,
        codec_name="int8_zlib",
        model_config={},
        cap_bytes=10**9,
    )
    assert bomb.stat().st_size < 100_000
    with pytest.raises(
        DecodeFailure, match=r"^codec int8_zlib failed to decode bomb.pgolf \(exit status 1\): "
    ):
        decode_confined(bomb, None, memory_limit_bytes=1_000_000_000)
