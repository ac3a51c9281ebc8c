"""Score-first test-time training (the record's "legal TTT"), through the harness's adapt hook.

The scorer scores each chunk of validation windows first (about eval.adapt_chunk_tokens targets,
32,768 as the record), and only then calls adapt(model, tokens) with exactly the tokens scored
(scoring/score/adapt.py). Here each chunk trains every parameter of the model for `ttt_epochs`
epochs of SGD (momentum `ttt_momentum`, gradient clip `ttt_grad_clip`) on sequences of
`ttt_seq_len` tokens, `ttt_batch_seqs` at a time; the LR follows a cosine from `ttt_lr` over
`ttt_chunks` chunks (the official split's chunk count; past it the LR is 0 and
the hook returns at once: a preset sets the TTT work an evaluation does by this count).
The settings are the model config's ttt_* keys (model.py), so a preset can change them.

Like the record, the last chunk is scored but never trained on (the hook only sees scored tokens;
what it learns from the last chunk is simply never used). The optimizer's momentum carries from
chunk to chunk, as the record's single SGD optimizer does.
"""

import math

import torch
import torch.nn.functional as F


def adapt(model, tokens):
    cfg = model.ttt
    if cfg["ttt_epochs"] <= 0 or cfg["ttt_lr"] <= 0 or tokens.numel() < 2:
        return
    if model.ttt_optimizer is None:
        model.ttt_optimizer = torch.optim.SGD(model.parameters(), lr=cfg["ttt_lr"], momentum=cfg["ttt_momentum"])
    done, total = model.ttt_chunks_done, max(int(cfg["ttt_chunks"]), 1)
    lr = cfg["ttt_lr"] * 0.5 * (1.0 + math.cos(math.pi * min(done / max(total - 1, 1), 1.0)))
    if lr <= 0.0:  # past the span (the record's last chunk): the model stays as it is, nothing is run
        model.ttt_chunks_done = done + 1
        return
    for g in model.ttt_optimizer.param_groups:
        g["lr"] = lr
    L = int(cfg["ttt_seq_len"])
    n_seqs = max((tokens.numel() - 1) // L, 1)
    L = min(L, tokens.numel() - 1)
    x_all = tokens[: n_seqs * L].view(n_seqs, L)  # (N, L)
    y_all = tokens[1 : n_seqs * L + 1].view(n_seqs, L)  # (N, L)
    model.train()
    for _ in range(int(cfg["ttt_epochs"])):
        for i in range(0, n_seqs, int(cfg["ttt_batch_seqs"])):
            x, y = x_all[i : i + int(cfg["ttt_batch_seqs"])], y_all[i : i + int(cfg["ttt_batch_seqs"])]
            logits = model(x)  # (B, L, V)
            loss = F.cross_entropy(logits.float().reshape(-1, logits.size(-1)), y.reshape(-1))
            model.ttt_optimizer.zero_grad(set_to_none=True)
            loss.backward()
            if cfg["ttt_grad_clip"] > 0:
                torch.nn.utils.clip_grad_norm_(model.parameters(), cfg["ttt_grad_clip"])
            model.ttt_optimizer.step()
    model.ttt_optimizer.zero_grad(set_to_none=True)
    model.ttt_chunks_done = done + 1
    model.eval()
