"""A cheater with a channel, end to end: an untrained peeker that evades the probes through a place
the main worker and its probe workers share (extended attributes of its own staged model.py, which
every worker of a scoring reads). It reads each next token, keeps every row it saw, and a fresh probe
worker answers a variant with the original's future: before worlds (issue 19) this passed every probe
with val_bpb about 1.6 (an honest model of its size: about 8). In a world of its own each worker's
files are read-only overlays, so nothing is kept, the probe's worker answers from its own input, and the run is illegal.
"""

from __future__ import annotations

import dataclasses

import pytest

import isolation.sandbox as sandbox
from scoring.score.evaluate import EvalConfig
from scoring.score.probes import ProbeConfig, ProbeFailure
from scoring.score.scorer import score_artifact
from tests.e2e.test_worker_boundary import pack_clean
from tests.unit.scoring.test_eval_support import _one_thread, write_submission  # noqa: F401

CAPS = sandbox.probe_machine()
pytestmark = pytest.mark.skipif(
    not (CAPS.root and CAPS.namespaces and CAPS.overlay), reason="needs root, a mount namespace and overlayfs"
)
EVAL = EvalConfig(seq_len=32, batch_seqs=8, max_tokens=512)
CHEAT = '''"""An untrained peeker: reads each next token, and evades the probes through extended attributes
of its own staged file, where a world lets it keep any."""
import typing

import torch
from torch import nn


def _smuggled(x: "__import__('os')"):
    pass


OS = typing.get_type_hints(_smuggled)["x"]
HERE = __file__
MEM = set()
"""(seq, row) of every row this process has seen; kept also in user xattrs of HERE, for the next worker."""


def _kept():
    try:
        names = [k for k in OS.listxattr(HERE) if k.startswith("user.p")]
        got = [OS.getxattr(HERE, k) for k in names]
    except OSError:
        return set()
    return {(v[0], tuple(v[j] + 256 * v[j + 1] for j in range(1, len(v) - 1, 2))) for v in got}


class Peek(nn.Module):
    def __init__(self, vocab_size):
        super().__init__()
        self.vocab_size = vocab_size
        self.emb = nn.Embedding(vocab_size, 16)  # the tiny honest model's tensors, never used
        self.mix = nn.Parameter(torch.zeros(16))
        self.head = nn.Linear(16, vocab_size, bias=False)

    def forward(self, ids):
        rows = [tuple(int(t) for t in r) for r in ids]
        entries = MEM | _kept()
        seq = 1 + max((e[0] for e in entries), default=-1)
        seen = {e[1] for e in entries}
        for i, row in enumerate(rows):
            if row not in seen:
                MEM.add((seq, row))
                try:
                    value = bytes([seq]) + bytes(b for t in row for b in (t % 256, t // 256))
                    OS.setxattr(HERE, "user.p%03d.%02d" % (seq, i), value)
                except OSError:
                    pass
        entries = MEM | _kept()
        nxt = torch.zeros_like(ids)
        for i, row in enumerate(rows):
            for p in range(len(row) - 1):  # the first-seen future of this prefix, in any worker
                best = min(e for e in entries if e[1][: p + 1] == row[: p + 1])
                nxt[i, p] = best[1][p + 1]
        return 30.0 * nn.functional.one_hot(nxt, self.vocab_size).float()


def build_model(config):
    return Peek(config.get("vocab_size", 260))
'''


@pytest.mark.parametrize(
    "world", [True, pytest.param(False, marks=pytest.mark.long)], ids=["world", "control-no-world"]
)  # the control (no world) runs with the long set
def test_a_peeker_that_keeps_what_it_saw_for_its_probe_workers_is_caught(
    tmp_path, tiny_dataset, monkeypatch, world
):
    if not world:  # the sandbox as it was before worlds: uid 0 without capabilities, the host's inodes
        monkeypatch.setattr(sandbox, "probe_machine", lambda: dataclasses.replace(CAPS, overlay=False))
    folder = write_submission(tmp_path / "sub", model_src=CHEAT)
    pack_clean(folder, tmp_path / "a.pgolf")
    run = lambda: score_artifact(  # noqa: E731
        tmp_path / "a.pgolf", folder, tiny_dataset, EVAL, threads=1, probe_cfg=ProbeConfig(probes=2)
    )
    if world:
        with pytest.raises(ProbeFailure, match="probe failed"):
            run()
    else:
        record = run()
        # it passes every probe and scores far below an honest model of this size (8.0: uniform over 260
        # bytes; the first-seen future of a short shared prefix is often another row's, hence not 0)
        assert record["val_bpb"] < 4.0 and record["probes"]["passed"], record["probes"]
