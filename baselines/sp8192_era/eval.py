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

Over several scoring workers (one per GPU) the harness makes them a torch.distributed group and hands each
chunk to all (scoring/worker/group.py): as the record, each worker then trains on its share of every batch's
sequences and the gradients are summed over the group, so every worker takes the same steps, as one would
(up to the order of the sums).
"""

import math

import torch
import torch.distributed as dist
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
    world = dist.get_world_size() if dist.is_initialized() else 1
    rank = dist.get_rank() if world > 1 else 0
    model.train()
    for _ in range(int(cfg["ttt_epochs"])):
        for i in range(0, n_seqs, int(cfg["ttt_batch_seqs"])):
            x, y = x_all[i : i + int(cfg["ttt_batch_seqs"])], y_all[i : i + int(cfg["ttt_batch_seqs"])]
            model.ttt_optimizer.zero_grad(set_to_none=True)
            if world == 1:
                logits = model(x)  # (B, L, V)
                loss = F.cross_entropy(logits.float().reshape(-1, logits.size(-1)), y.reshape(-1))
                loss.backward()
            else:  # this worker's rows of the batch; the batch's mean loss is the group's sum over all of them
                n, x, y = y.numel(), x[rank::world], y[rank::world]
                if x.numel():
                    logits = model(x)
                    loss = F.cross_entropy(logits.float().reshape(-1, logits.size(-1)), y.reshape(-1), reduction="sum")
                    (loss / n).backward()
                # one all-reduce of every gradient at once, not one per tensor; the count of workers that had
                # each one last: a parameter no worker had a gradient for is left without one, as one worker would
                params = list(model.parameters())
                had = torch.tensor([p.grad is not None for p in params], dtype=torch.float32, device=params[0].device)
                flat = torch.cat([*((p.grad if p.grad is not None else torch.zeros_like(p)).float().reshape(-1) for p in params), had])
                dist.all_reduce(flat)
                *grads, had = flat.split([p.numel() for p in params] + [len(params)])
                for p, g, n in zip(params, grads, had.tolist(), strict=True):
                    p.grad = g.view_as(p).to(p.dtype) if n > 0 else None
            if cfg["ttt_grad_clip"] > 0:
                torch.nn.utils.clip_grad_norm_(model.parameters(), cfg["ttt_grad_clip"])
            model.ttt_optimizer.step()
    model.ttt_optimizer.zero_grad(set_to_none=True)
    model.ttt_chunks_done = done + 1
    model.eval()
