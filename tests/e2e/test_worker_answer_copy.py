"""What the scorer scores is its own copy of a worker's answer, taken when the worker answers: a worker
keeps its mapping of the shared output buffer, so anything computed from the buffer itself could be
changed under the scorer's feet by a thread of the worker (scoring/score/remote.py WorkerModel.logits)."""

from __future__ import annotations

import torch

from scoring.score.remote import WorkerConfig, start_worker
from tests.unit.scoring.test_eval_support import TINY_CONFIG, _one_thread, pack_tiny, write_submission  # noqa: F401


def test_the_answer_is_copied_out_of_the_shared_buffer(tmp_path):
    folder = write_submission(tmp_path / "sub")
    pack_tiny(folder, tmp_path / "a.pgolf")
    worker = start_worker(
        WorkerConfig(
            code_dir=folder,
            artifact=tmp_path / "a.pgolf",
            threads=1,
            vocab_size=TINY_CONFIG["vocab_size"],
            max_tokens_per_batch=4 * 16,
        )
    )
    try:
        worker.wait_ready()
        x_BL = torch.randint(0, TINY_CONFIG["vocab_size"], (4, 16))
        first = worker.logits(x_BL)
        kept = first.clone()
        shared = worker.outbuf.tensor(torch.float32, first.numel())
        assert torch.equal(shared.view_as(first), first)  # the copy holds the answer...
        start, end = shared.data_ptr(), shared.data_ptr() + worker.outbuf.nbytes
        assert not start <= first.data_ptr() < end  # ...in the scorer's own memory
        shared.fill_(123.0)  # what a racing worker thread would do after its answer
        assert torch.equal(first, kept)
        assert torch.equal(worker.logits(x_BL), kept)  # and a fresh answer is read anew
    finally:
        worker.close()
