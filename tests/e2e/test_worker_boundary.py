"""The model worker is the boundary: hostile scored code, run through the real scorer and its confined worker.

Each model here gets past the static lint (scoring/codecheck.py) on purpose, by routes a deny-list over
Python source cannot see (a string annotation that typing evaluates), so what stops it is the process and
the kernel: the worker cannot read the validation data or anything else outside its code and artifact,
cannot write outside its temp folder, reach the network, signal or trace the scorer, or change the
scorer's tools; a runaway allocation, a forward that never returns, or a codec that decodes garbage each
end in a specific verdict with a record, never a traceback. A leak, if it worked, would show: the leaking
models predict the next validation token perfectly once they have read it (val_bpb near 0).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from scoring.artifact.cap import ARTIFACT_CAP_BYTES
from scoring.artifact.pack import pack_state
from scoring.codecheck import lint_scored_code
from scoring.score.cli import EXIT_CODES
from scoring.score.evaluate import EvalConfig
from scoring.score.probes import ProbeConfig
from scoring.score.scorer import score_artifact
from tests.conftest import REPO
from tests.unit.scoring.test_eval_support import (  # noqa: F401
    TINY_CONFIG,
    TINY_MODEL,
    _one_thread,
    pack_tiny,
    write_submission,
)

EVAL = EvalConfig(seq_len=32, batch_seqs=8, max_tokens=512)

# Runs `code` (a Python expression) at import time, past the static lint: typing evaluates the annotation.
SMUGGLE = """
import typing


def _smuggled(x: "{code}"):
    pass


try:
    SMUGGLED = typing.get_type_hints(_smuggled)["x"]
except Exception as e:  # noqa: BLE001
    SMUGGLED = repr(e)
"""

# A model that predicts the next validation token perfectly if SMUGGLED holds the validation tokens.
LEAKY_FORWARD = TINY_MODEL.replace(
    "        return self.head(torch.tanh(e + self.mix * prev))",
    "        out = self.head(torch.tanh(e + self.mix * prev))\n"
    "        if isinstance(SMUGGLED, bytes) and len(SMUGGLED) > 1024:\n"
    "            out = out + 100.0  # a leak would show as a perfect score\n"
    "        return out",
)


def smuggling_model(code: str) -> str:
    return LEAKY_FORWARD + SMUGGLE.format(code=code.replace('"', '\\"'))


def pack_clean(folder: Path, out: Path) -> None:
    """Pack `folder` with the honest tiny model's weights, without importing the folder's model.py here."""
    import torch

    clean = write_submission(out.parent / "clean_for_weights")
    torch.manual_seed(0)
    from scoring.worker.loading import build_model

    state = build_model(clean, TINY_CONFIG).state_dict()
    pack_state(
        state, folder, out, codec_name="int8_zlib", model_config=TINY_CONFIG, cap_bytes=ARTIFACT_CAP_BYTES
    )


def score(tmp_path: Path, data: Path, model_src: str, **kw) -> dict:
    folder = write_submission(tmp_path / "sub", model_src=model_src)
    assert lint_scored_code(folder) == [], (
        "the test model should get past the lint: the worker is what is tested"
    )
    pack_clean(folder, tmp_path / "a.pgolf")
    # what these tests watch is the model worker's boundary; the probes' fresh workers are the same worker
    # (scoring/score/remote.py) and are tested in tests/unit/scoring/test_probes.py: none here unless asked
    kw.setdefault("probe_cfg", ProbeConfig(probes=0))
    return score_artifact(tmp_path / "a.pgolf", folder, data, EVAL, threads=1, **kw)


def score_cli(tmp_path: Path, data: Path, folder: Path, artifact: Path, *extra: str) -> tuple[int, dict]:
    out = tmp_path / "new_folder" / "score.json"  # --json-out into a folder that does not exist yet
    r = subprocess.run(
        [sys.executable, "-m", "scoring", "score", str(artifact), "--submission", str(folder), "--data", str(data),
         "--seq-len", "32", "--batch-seqs", "8", "--max-tokens", "512", "--threads", "1", "--json-out", str(out),
         *extra],
        capture_output=True, text=True, cwd=REPO, timeout=300, check=False,
    )  # fmt: skip
    assert "Traceback" not in r.stderr.splitlines()[-1:] and out.is_file(), r.stderr[-2000:]
    return r.returncode, json.loads(out.read_text())


@pytest.fixture(scope="module")
def honest_bpb(tiny_dataset, tmp_path_factory) -> float:
    return score(tmp_path_factory.mktemp("honest"), tiny_dataset, TINY_MODEL)["val_bpb"]


def _val_shard(data: Path) -> str:
    return str(sorted(data.glob("fineweb_val_*.bin"))[0].resolve())


@pytest.mark.parametrize(
    "route",
    [
        "__import__('builtins').open('{path}', 'rb').read()",
        "__import__('torch').sys.modules['builtins'].open('{path}', 'rb').read()",
        "__import__('pathlib').Path('{path}').read_bytes()",
        "__import__('numpy').fromfile('{path}', dtype='uint8').tobytes()",
    ],
    ids=["open", "torch.sys.modules", "pathlib", "numpy.fromfile"],
)
def test_scored_code_cannot_read_the_validation_data(tmp_path, tiny_dataset, honest_bpb, route):
    rec = score(tmp_path, tiny_dataset, smuggling_model(route.format(path=_val_shard(tiny_dataset))))
    assert rec["status"] == "ok" and rec["val_bpb"] == honest_bpb  # it ran, and learned nothing


# A model whose every prediction is uniform (log2 260 bits a token) if its folder gave it uncounted bytes.
READS_ITS_FOLDER = TINY_MODEL.replace(
    "        return self.head(torch.tanh(e + self.mix * prev))",
    "        out = self.head(torch.tanh(e + self.mix * prev))\n"
    "        if isinstance(SMUGGLED, list) and any(SMUGGLED):\n"
    "            out = out * 0.0  # what the cap did not count reached the model\n"
    "        return out",
) + SMUGGLE.format(
    code="[__import__('pathlib').Path(__file__).parent.joinpath(*n.split('/')).exists() "
    "for n in ('README.md', 'submission.json', 'pkg/README.md', 'empty-folder-named-with-data')]"
)


def test_scored_code_reads_nothing_the_cap_did_not_count(tmp_path, tiny_dataset, honest_bpb):
    """`pgolf score A --submission DIR` on the folder as written (README.md says so): the worker was given DIR
    whole, so it read README.md and submission.json (any size: not counted) and the names of empty folders (no
    file: not counted). The scorer gives it a copy of the packed files alone."""
    folder = write_submission(tmp_path / "sub", model_src=READS_ITS_FOLDER)
    (folder / "README.md").write_bytes(b"uncounted " * 100_000)
    (folder / "pkg").mkdir()
    (folder / "pkg" / "README.md").write_bytes(b"uncounted too")
    (folder / "empty-folder-named-with-data").mkdir()
    assert lint_scored_code(folder) == []
    pack_clean(folder, tmp_path / "a.pgolf")
    rec = score_artifact(
        tmp_path / "a.pgolf", folder, tiny_dataset, EVAL, threads=1, probe_cfg=ProbeConfig(probes=0)
    )
    assert rec["status"] == "ok" and rec["val_bpb"] == honest_bpb
    assert (folder / "README.md").is_file()  # the folder given is left as it was


# A model whose every prediction is uniform unless it found the artifact it reads free of extended attributes.
READS_ITS_ARTIFACT_XATTRS = TINY_MODEL.replace(
    "        return self.head(torch.tanh(e + self.mix * prev))",
    "        out = self.head(torch.tanh(e + self.mix * prev))\n"
    "        if SMUGGLED != [[]]:\n"
    "            out = out * 0.0  # bytes beside the artifact's reached the model (or the look failed)\n"
    "        return out",
) + SMUGGLE.format(
    code="[[a for a in __import__('os').listxattr(__import__('json').loads(__import__('sys').argv[1])['artifact']) "
    "if a.startswith('user.')]]"
)


@pytest.mark.parametrize("world", [True, False], ids=["world", "no-world"])
def test_scored_code_reads_no_extended_attribute_of_the_artifact(
    tmp_path, tiny_dataset, honest_bpb, monkeypatch, world
):
    """HOLE (before the fix): the workers read the artifact in place, so what a file holds beside its bytes reached
    the model: user xattrs (a codec's process sets them on the artifact it wrote; about 3 kB on ext4, 26 MB measured
    on tmpfs for an empty file, unbounded on XFS), which no cap counts. The scorer gives the workers a copy of the
    artifact's bytes alone (and the sealed pack takes the codec's artifact so: harness/run/train_phase.py
    take_bytes). A world copies a small file it may read (isolation/world.py); a machine without one (no root or
    no overlayfs: Landlock alone) showed the worker the file itself."""
    if not world:
        import dataclasses

        import isolation.sandbox as sandbox

        caps = sandbox.probe_machine()
        monkeypatch.setattr(sandbox, "probe_machine", lambda: dataclasses.replace(caps, overlay=False))
    folder = write_submission(tmp_path / "sub", model_src=READS_ITS_ARTIFACT_XATTRS)
    assert lint_scored_code(folder) == []
    pack_clean(folder, tmp_path / "a.pgolf")
    os.setxattr(tmp_path / "a.pgolf", "user.pgolf.weights", b"w" * 1000)
    rec = score_artifact(
        tmp_path / "a.pgolf", folder, tiny_dataset, EVAL, threads=1, probe_cfg=ProbeConfig(probes=0)
    )
    assert rec["status"] == "ok" and rec["val_bpb"] == honest_bpb, rec.get("val_bpb")
    assert os.listxattr(tmp_path / "a.pgolf") == ["user.pgolf.weights"]  # the file given is left as it was


def test_scored_code_cannot_write_outside_its_temp_folder(tmp_path, tiny_dataset, honest_bpb):
    target = tmp_path / "pwned.txt"
    rec = score(
        tmp_path, tiny_dataset, smuggling_model(f"__import__('builtins').open('{target}', 'w').write('x')")
    )
    assert rec["val_bpb"] == honest_bpb and not target.exists()


def test_scored_code_reaches_no_network(tmp_path, tiny_dataset):
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    srv.settimeout(0.5)
    port = srv.getsockname()[1]
    code = f"__import__('socket').create_connection(('127.0.0.1', {port}), timeout=2).sendall(b'leak')"
    rec = score(tmp_path, tiny_dataset, smuggling_model(code))
    with pytest.raises(TimeoutError):
        srv.accept()  # the worker's loopback is its own network namespace's
    srv.close()
    assert rec["status"] == "ok"


def test_scored_code_cannot_signal_or_trace_the_scorer(tmp_path, tiny_dataset):
    me = os.getpid()  # this test process is the scorer
    code = (
        f"[__import__('os').kill({me}, 19), "
        f"__import__('ctypes').CDLL(None).ptrace(16, {me}, 0, 0)]"  # SIGSTOP; PTRACE_ATTACH
    )
    rec = score(tmp_path, tiny_dataset, smuggling_model(code))
    assert rec["status"] == "ok"  # still running, never stopped
    worker = rec["workers"][0]
    assert worker["isolation"]["seccomp"] and worker["reported"]["NoNewPrivs"] == "1"
    assert worker["reported"]["CapEff"] == "0000000000000000"


def test_a_monkeypatch_or_kernel_swap_in_the_worker_does_not_reach_the_scorer(
    tmp_path, tiny_dataset, honest_bpb
):
    code = (
        "[setattr(__import__('torch'), 'isfinite', lambda x: x == x), "
        "__import__('torch').library.Library('aten', 'IMPL').impl('neg', lambda *a, **k: None, 'CPU')]"
    )
    rec = score(tmp_path, tiny_dataset, smuggling_model(code))
    assert rec["status"] == "ok" and rec["val_bpb"] == honest_bpb


SUBCLASS_OUTPUT = (
    TINY_MODEL.replace(
        "        return self.head(torch.tanh(e + self.mix * prev))",
        "        return self.head(torch.tanh(e + self.mix * prev)).as_subclass(Liar)",
    )
    + '''

class Liar(torch.Tensor):
    """A tensor subclass that lies about arithmetic: the scorer must never call its methods."""

    def abs(self):
        return self * 0

    def logsumexp(self, *args, **kwargs):
        return self.sum() * 0

    def double(self):
        return self * 0
'''
)


def test_a_tensor_subclass_output_changes_nothing(tmp_path, tiny_dataset, honest_bpb):
    rec = score(tmp_path, tiny_dataset, SUBCLASS_OUTPUT)
    assert rec["status"] == "ok" and rec["val_bpb"] == honest_bpb


@pytest.mark.long
def test_a_runaway_allocation_is_out_of_memory(tmp_path, tiny_dataset):
    model = TINY_MODEL.replace(
        "        e = self.emb(ids)\n", "        e = self.emb(ids)\n        torch.empty(1 << 42)\n"
    )
    folder = write_submission(tmp_path / "sub", model_src=model)
    pack_clean(folder, tmp_path / "a.pgolf")
    code, rec = score_cli(tmp_path, tiny_dataset, folder, tmp_path / "a.pgolf")
    assert code == EXIT_CODES["out_of_memory"] and rec["status"] == "out_of_memory", rec


def test_a_forward_that_never_returns_is_killed_at_the_eval_deadline(tmp_path, tiny_dataset):
    model = TINY_MODEL.replace(
        "        e = self.emb(ids)\n", "        e = self.emb(ids)\n        while True:\n            pass\n"
    )
    folder = write_submission(tmp_path / "sub", model_src=model)
    pack_clean(folder, tmp_path / "a.pgolf")
    code, rec = score_cli(tmp_path, tiny_dataset, folder, tmp_path / "a.pgolf", "--eval-budget-s", "3")
    assert code == EXIT_CODES["over_eval_budget"] and rec["status"] == "over_eval_budget", rec


def test_nan_logits_are_an_error_with_a_record(tmp_path, tiny_dataset):
    model = TINY_MODEL.replace(
        "        return self.head(torch.tanh(e + self.mix * prev))",
        "        return self.head(torch.tanh(e + self.mix * prev)) * float('nan')",
    )
    folder = write_submission(tmp_path / "sub", model_src=model)
    pack_clean(folder, tmp_path / "a.pgolf")
    code, rec = score_cli(tmp_path, tiny_dataset, folder, tmp_path / "a.pgolf")
    assert code == EXIT_CODES["error"] and rec["status"] == "error" and "non-finite" in rec["detail"], rec


BAD_CODEC = '''"""decode() returns a string: the worker's failure, reported as an error verdict."""
import json

NAME = "bad"
VERSION = 1


def encode(state):
    return json.dumps(sorted(state)).encode()


def decode(payload):
    return "not a state dict"
'''


def test_a_codec_that_decodes_garbage_is_an_error_with_a_record(tmp_path, tiny_dataset):
    folder = write_submission(tmp_path / "sub")
    (folder / "codec.py").write_text(BAD_CODEC)
    import torch

    from scoring.worker.loading import build_model

    torch.manual_seed(0)
    state = build_model(folder, TINY_CONFIG).state_dict()
    pack_state(state, folder, tmp_path / "a.pgolf", codec_name="submission", model_config=TINY_CONFIG,
               cap_bytes=ARTIFACT_CAP_BYTES)  # fmt: skip
    code, rec = score_cli(tmp_path, tiny_dataset, folder, tmp_path / "a.pgolf")
    assert code == EXIT_CODES["error"] and rec["status"] == "error" and rec["detail"], rec


def test_the_scorer_process_imports_no_submitted_code(tmp_path, tiny_dataset):
    rec = score(tmp_path, tiny_dataset, TINY_MODEL)
    assert not [m for m in sys.modules if m.startswith("pgolf_submission")]
    assert rec["workers"][0]["reported"]["pid"] != os.getpid()
    assert (
        "process: the model worker"
        in rec["enforcement"]["submitted code never shares a process with validation data"]
    )


PEEK_AFTER_ADAPTING = TINY_MODEL.replace(
    "        return self.head(torch.tanh(e + self.mix * prev))",
    "        out = self.head(torch.tanh(e + self.mix * prev))\n"
    "        if self.peeking:\n"
    "            nxt = torch.cat([ids[:, 1:], ids[:, -1:]], dim=1)\n"
    "            out = out + 40.0 * torch.nn.functional.one_hot(nxt, out.shape[-1]).to(out.dtype)\n"
    "        return out",
).replace(
    "        self.head = nn.Linear(dim, vocab_size, bias=False)\n",
    "        self.head = nn.Linear(dim, vocab_size, bias=False)\n        self.peeking = False\n",
)
SWITCH_ON = """def adapt(model, tokens):
    model.peeking = True  # honest in the first chunk, peeking once it has adapted
"""


def test_a_model_that_peeks_only_after_adapting_fails_the_probes(tmp_path, tiny_dataset):
    """Probe workers replay the adaptation the main worker had, then must reproduce its scored logits."""
    from scoring.score.probes import ProbeFailure

    folder = write_submission(tmp_path / "sub", model_src=PEEK_AFTER_ADAPTING, eval_src=SWITCH_ON)
    pack_clean(folder, tmp_path / "a.pgolf")
    cfg = EvalConfig(seq_len=32, batch_seqs=2, max_tokens=512, adapt_chunk_tokens=64)
    with pytest.raises(ProbeFailure, match="probe failed"):
        score_artifact(
            tmp_path / "a.pgolf", folder, tiny_dataset, cfg, threads=1, probe_cfg=ProbeConfig(probes=4)
        )


# Peeks at the next token, and raises MemoryError in any worker whose first batch is not the first scored
# batch (its rows come in a secret order; their sum does not): every probe worker, never the main one.
PEEK_THEN_OOM_WHEN_PROBED = (
    TINY_MODEL.replace(
        "        e = self.emb(ids)\n",
        "        if self.first:\n"
        "            self.first = False\n"
        "            if int(ids.sum()) != FIRST_BATCH_SUM:\n"
        "                raise MemoryError('a probe, by its first batch')\n"
        "        e = self.emb(ids)\n",
    )
    .replace(
        "prev = torch.cat([torch.zeros_like(e[:, :1]), e[:, :-1]], dim=1)",
        "prev = torch.cat([e[:, 1:], torch.zeros_like(e[:, :1])], dim=1)  # the NEXT token",
    )
    .replace(
        "        self.head = nn.Linear(dim, vocab_size, bias=False)\n",
        "        self.head = nn.Linear(dim, vocab_size, bias=False)\n        self.first = True\n",
    )
)


def test_a_peeking_model_whose_probe_workers_raise_memory_error_is_illegal(tmp_path, tiny_dataset):
    """It ended out_of_memory (the probe worker's own word for the MemoryError it raised); a probe worker
    that fails is a failed probe, whatever it says: illegal, naming the probe."""
    from data.shards import read_split
    from scoring.score.cli import verdict_of
    from scoring.score.probes import ProbeFailure

    first = int(read_split(tiny_dataset, "val")[: EVAL.batch_seqs * EVAL.seq_len].astype("int64").sum())
    model = PEEK_THEN_OOM_WHEN_PROBED.replace("class Tiny", f"FIRST_BATCH_SUM = {first}\n\n\nclass Tiny")
    with pytest.raises(ProbeFailure, match=r"probe 1 of 1 \(batch \d\) failed: .*out_of_memory") as caught:
        score(tmp_path, tiny_dataset, model, probe_cfg=ProbeConfig(probes=1))
    assert verdict_of(caught.value) == "illegal"


def test_a_worker_that_sigkills_itself_is_an_error_not_out_of_memory(tmp_path, tiny_dataset):
    """SIGKILL was read as the kernel's OOM killer: a model could pick out_of_memory over error by killing
    its own worker. Only a rise of the kernel's OOM kill count (the scorer's reading) makes it one. (In its
    PID namespace the worker is PID 1, whose own SIGKILL the kernel ignores: the attack needs a machine
    without that namespace, as sandbox 'off' gives.)"""
    from scoring.score.remote import WorkerFailure

    model = TINY_MODEL.replace(
        "        e = self.emb(ids)\n",
        "        SMUGGLED.kill(SMUGGLED.getpid(), 9)\n        e = self.emb(ids)\n",
    ) + SMUGGLE.format(code="__import__('os')")
    with pytest.raises(WorkerFailure, match="neither the scorer nor the kernel's OOM killer") as caught:
        score(tmp_path, tiny_dataset, model, sandbox="off")
    assert caught.value.kind == "error"


# A model whose build does work (here: sleeps, as a model fitting itself at build time would compute).
SLOW_BUILD = TINY_MODEL.replace(
    "def build_model(config):\n", "def build_model(config):\n    SMUGGLED.sleep(1.0)\n"
) + SMUGGLE.format(code="__import__('time')")


def test_building_the_model_counts_on_the_eval_clock(tmp_path, tiny_dataset):
    """A model that fitted itself at build time ran 62 s in each of 5 workers while the record said
    eval_time_s 0.2: the build was off every clock. Now the clock starts when the main worker is told to
    decode and build; the probe workers' builds get a bounded, recorded allowance."""
    from scoring.score.remote import EvalDeadline

    rec = score(tmp_path / "a", tiny_dataset, SLOW_BUILD, probe_cfg=ProbeConfig(probes=1))
    clock = rec["eval_clock"]
    assert (
        clock["build_time_s"] >= 2.0 and rec["eval_time_s"] == clock["build_time_s"] + clock["scoring_time_s"]
    )
    assert clock["probe_allowance_s"] >= 60.0 and clock["probe_wall_s"] >= 2.0  # each probe worker builds too
    with pytest.raises(EvalDeadline):  # a budget the scoring alone would keep, the build not
        score(tmp_path / "b", tiny_dataset, SLOW_BUILD, eval_budget_s=0.8)


def test_relative_paths_work_in_score(tmp_path, tiny_dataset):
    """`pgolf score` with a relative artifact failed: the model worker runs in a folder of its own, where
    the path named nothing. The scorer makes every path absolute before a process of its own sees it."""
    import shutil

    folder = write_submission(tmp_path / "sub")
    pack_clean(folder, tmp_path / "a.pgolf")
    shutil.copytree(tiny_dataset, tmp_path / "data")
    r = subprocess.run(
        [sys.executable, "-m", "harness.cli", "score", "a.pgolf", "--submission", "sub", "--data", "data",
         "--seq-len", "32", "--batch-seqs", "8", "--max-tokens", "512", "--threads", "1", "--probes", "1",
         "--json-out", "out/score.json"],
        capture_output=True, text=True, cwd=tmp_path, timeout=300, check=False,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )  # fmt: skip
    assert r.returncode == 0, (r.stdout[-1000:], r.stderr[-2000:])
    assert json.loads((tmp_path / "out" / "score.json").read_text())["status"] == "ok"


DEEP_FOLDER = TINY_MODEL.replace(
    "def build_model(config):\n",
    "def build_model(config):\n"
    "    import os\n"
    "\n"
    "    if os.path.basename(os.getcwd()) != 'home':  # the test's own build, at the pack\n"
    "        return Tiny(config.get('vocab_size', 260), config.get('dim', 16))\n"
    "    fd = os.open('.', os.O_RDONLY)\n"
    "    for _ in range(3000):\n"
    "        os.mkdir('d', dir_fd=fd)\n"
    "        os.close(os.open('f', os.O_CREAT | os.O_WRONLY, dir_fd=fd))\n"
    "        deeper = os.open('d', os.O_RDONLY, dir_fd=fd)\n"
    "        os.close(fd)\n"
    "        fd = deeper\n"
    "    os.symlink('/etc', 'etc', dir_fd=fd)\n",
)


def test_a_worker_s_folder_however_deep_is_removed_when_it_closes(tmp_path):
    """A model left a folder 3,000 levels deep in its own temp folder: shutil.rmtree (Python 3.11) recursed
    once per level, and its RecursionError, which ignore_errors does not cover, came out of the scorer's close
    of that worker (a traceback, the probes never run, the folder left behind). The folder is removed whole,
    and the link at its bottom is not followed."""
    from scoring.score.remote import start_worker
    from tests.unit.scoring.test_eval_support import tiny_worker_config

    folder = write_submission(tmp_path / "sub", model_src=DEEP_FOLDER)
    pack_tiny(folder, tmp_path / "a.pgolf")
    worker = start_worker(tiny_worker_config(folder, tmp_path / "a.pgolf"))
    try:
        worker.wait_ready()
        home = worker._tmp / "home"
        assert (home / "d" / "d" / "f").is_file()
    finally:
        worker.close()
    assert not worker._tmp.exists() and Path("/etc/passwd").exists()
