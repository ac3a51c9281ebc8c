"""Score-first test-time adaptation: the hook gets each chunk only after every token in it is scored,
never a token it has not been scored on, nothing beyond its chunk, and its time counts on the eval
clock. Hooks that reach outside what they are given are refused before they run."""

from __future__ import annotations

import time

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from data.shards import read_split
from data.tokenizer import ByteTokenizer
from scoring.codecheck import CodeCheckFailure, lint_scored_code
from scoring.score.evaluate import EvalConfig, evaluate
from scoring.score.scorer import score_artifact
from scoring.worker.adapt import AdaptationViolation, ScoreFirstAdapter, load_hook
from tests.unit.scoring.test_eval_support import _one_thread, pack_tiny, write_submission  # noqa: F401 (fixture)

V = 260
CPU = torch.device("cpu")
TABLE = ByteTokenizer().byte_table()


class Unigram(nn.Module):
    def __init__(self):
        super().__init__()
        self.logits = nn.Parameter(torch.zeros(V))

    def forward(self, ids):
        return self.logits.expand(*ids.shape, V)


@pytest.fixture(scope="module")
def tokens(tiny_dataset) -> np.ndarray:
    return read_split(tiny_dataset, "val")[:3000].astype(np.int64)


def run(model, tokens, hook, mode="standard", chunk=256, on_scored=None):
    cfg = EvalConfig(
        mode=mode,
        seq_len=32,
        batch_seqs=4,
        adapt_chunk_tokens=chunk,
        stride=None if mode == "standard" else 16,
    )
    adapter = ScoreFirstAdapter(hook)
    return evaluate(model, tokens, TABLE, cfg, CPU, adapter=adapter, on_scored=on_scored), adapter


@pytest.mark.parametrize("mode", ["standard", "sliding", "documents"])
def test_hook_sees_only_scored_tokens_in_order(tokens, mode):
    events: list[tuple[str, np.ndarray]] = []
    got: list[torch.Tensor] = []

    def hook(model, chunk):
        events.append(("delivered", np.array([])))
        got.append(chunk.clone())

    res, adapter = run(
        Unigram(), tokens, hook, mode, on_scored=lambda pos, n, b: events.append(("scored", pos))
    )
    scored_so_far: set[int] = set()
    k = 0
    for kind, pos in events:
        if kind == "scored":
            scored_so_far |= set(pos.tolist())
            continue
        a, b = adapter.delivered[k]
        for p in range(a, b):  # every delivered position was scored already
            assert p in scored_so_far, (mode, p)
        assert got[k].tolist() == tokens[a:b].tolist()
        k += 1
    assert k == len(adapter.delivered) == res.chunks > 1
    spans = adapter.delivered
    assert spans[0][0] == 1 and all(
        spans[i][1] == spans[i + 1][0] for i in range(len(spans) - 1)
    )  # in order, no gaps
    assert spans[-1][1] - 1 == max(scored_so_far)  # nothing past the last scored target


def test_score_first_the_first_chunk_is_scored_before_any_adaptation(tokens):
    """A hook that learns the unigram distribution changes later chunks' losses, never the first chunk's."""

    def learn(model, chunk):
        opt = torch.optim.SGD(model.parameters(), lr=0.5)
        for _ in range(5):
            opt.zero_grad()
            F.cross_entropy(model(chunk[None])[0], chunk).backward()
            opt.step()

    per: dict[str, dict[int, float]] = {"adapt": {}, "none": {}}
    for name, hook in (("adapt", learn), ("none", lambda m, c: None)):
        run(
            Unigram(),
            tokens,
            hook,
            on_scored=lambda pos, n, b, d=per[name]: d.update(zip(pos.tolist(), n.tolist(), strict=True)),
        )
    first = [p for p in per["none"] if p <= 256]
    assert all(per["adapt"][p] == per["none"][p] for p in first)
    assert sum(per["adapt"].values()) < sum(per["none"].values())  # the adaptation helped later chunks


def test_a_hostile_hook_gets_nothing_beyond_its_chunk(tokens):
    seen: list[dict] = []

    def hostile(model, chunk):
        info = {"numel": chunk.numel(), "storage_bytes": chunk.untyped_storage().nbytes()}
        try:  # read past the end of the chunk through its storage
            torch.as_strided(chunk, (chunk.numel() + 64,), (1,))
            info["read_past"] = True
        except RuntimeError:
            info["read_past"] = False
        chunk.fill_(7)  # and scribble on it: the scorer must not care
        seen.append(info)

    res_hostile, _ = run(Unigram(), tokens, hostile)
    res_plain, _ = run(Unigram(), tokens, lambda m, c: None)
    for info in seen:
        assert info["storage_bytes"] == info["numel"] * 8  # the tensor owns exactly its chunk
        assert info["read_past"] is False
    assert (
        res_hostile.sums.loss_nats == res_plain.sums.loss_nats
        and res_hostile.sums.bytes == res_plain.sums.bytes
    )


def test_weights_that_move_while_scoring_are_a_violation(tokens):
    class LearnsInForward(Unigram):
        def forward(self, ids):
            with torch.no_grad():
                self.logits.add_(
                    F.one_hot(ids[:, -1], V).float().sum(0)
                )  # trains on the window it is scoring
            return super().forward(ids)

    with pytest.raises(AdaptationViolation, match="logits changed while chunk 0 was being scored"):
        run(LearnsInForward(), tokens, lambda m, c: None)


def test_the_eval_clock_covers_adaptation(tokens):
    res, adapter = run(Unigram(), tokens, lambda m, c: time.sleep(0.02))
    assert adapter.adapt_time_s >= 0.02 * res.chunks
    assert res.eval_time_s >= res.adapt_time_s == adapter.adapt_time_s


HOSTILE_HOOKS = {
    "frames": (
        "import sys\n\ndef adapt(model, tokens):\n    future = sys._getframe(2).f_locals['toks']\n",
        "uses 'sys'",
    ),
    "gc": ("import gc\n\ndef adapt(model, tokens):\n    gc.get_objects()\n", "imports 'gc'"),
    "files": ("def adapt(model, tokens):\n    open('/proc/self/cmdline').read()\n", "uses 'open'"),
    "dunder": ("def adapt(model, tokens):\n    tokens.__class__.__subclasses__()\n", "attribute '__class__'"),
    "storage": ("def adapt(model, tokens):\n    tokens.untyped_storage()\n", "attribute 'untyped_storage'"),
    "helper": (
        "from helper import peek\n\ndef adapt(model, tokens):\n    peek()\n",
        "helper.py:1: imports 'os'",
    ),
}


@pytest.mark.parametrize("name", sorted(HOSTILE_HOOKS))
def test_hooks_that_reach_outside_are_refused_before_they_run(tmp_path, name):
    src, why = HOSTILE_HOOKS[name]
    folder = write_submission(tmp_path / name, eval_src=src)
    (folder / "helper.py").write_text("import os\n\ndef peek():\n    return os.listdir('/')\n")
    with pytest.raises(CodeCheckFailure, match="code check failed"):
        load_hook(folder)
    assert any(why in p for p in lint_scored_code(folder)), lint_scored_code(folder)


GOOD_HOOK = '''"""Adapt the output head on each scored chunk (one SGD step)."""
import torch
import torch.nn.functional as F


def adapt(model, tokens):
    opt = torch.optim.SGD(model.head.parameters(), lr=0.1)
    opt.zero_grad()
    F.cross_entropy(model(tokens[None, :-1])[0], tokens[1:]).backward()
    opt.step()
'''


@pytest.mark.long
def test_score_artifact_runs_the_submission_hook(tmp_path, tiny_dataset):
    folder = write_submission(tmp_path / "ttt", eval_src=GOOD_HOOK)
    assert lint_scored_code(folder) == []
    pack_tiny(folder, tmp_path / "a.pgolf")
    rec = score_artifact(
        tmp_path / "a.pgolf",
        folder,
        tiny_dataset,
        EvalConfig(seq_len=32, max_tokens=1024, adapt_chunk_tokens=256),
        threads=1,
    )
    ad = rec["adaptation"]
    assert ad["protocol"] == "score-first" and ad["chunks"] == 4 and ad["tokens_delivered"] == 1024
    assert rec["eval_time_s"] >= ad["adapt_time_s"] > 0
    assert ad["where"] == "model worker"
    assert rec["probes"]["passed"] and rec["probes"]["base"].endswith("after replaying the adaptation")
    # the replays are recorded beside the allowance that bounded them
    probes = rec["probes"]
    replayed = [p for p in probes["probes"] if p["adaptation_chunks_replayed"]]
    assert all(p["replay_time_s"] > 0 for p in replayed)
    assert probes["replay_time_s"] == sum(p["replay_time_s"] for p in probes["probes"])
    assert rec["eval_clock"]["probe_allowance_s"] > probes["replay_time_s"]
    # bounded by two passes of the main worker's adaptation, timed per chunk (chunk_begin + adapt)
    bound = probes["replay_bound"]
    assert bound["bounded"] and bound["allowance_s"] >= 2 * ad["adapt_time_s"] > 0
    assert bound["estimate_s"] <= bound["allowance_s"]
    # on CPU the logits cross as they always did: pageable shared memory, recorded with its reason
    crossing = rec["crossing"]
    assert (crossing["scorer"], crossing["worker"]) == ("pageable", "pageable")
    assert crossing["why"] == {"scorer": "cpu", "worker": "cpu"} and crossing["logits_bytes"] > 0
    assert crossing["version"] == 2 and crossing["scorer_by_worker"] == ["pageable"]  # one worker, one path
