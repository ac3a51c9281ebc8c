"""The tool guard: the scorer's own tools, checked while submission code runs in its process.

Before the submission's code is imported, the scorer records the identity of every attribute of
the modules and classes it computes with (the watch list it passes in: builtins, math, numpy, torch,
torch.Tensor, torch.nn.functional, the aten op it uses, and its own scoring modules; torch.compile
in a model is fine: see SELF_PATCHED), the kernels registered for every aten operator, and the depth
of torch's mode stacks. It checks them again after every forward pass and adaptation step
(attributes, modes and the kernels it runs itself), and in full once the model is built and at the
end; anything replaced, removed or (on a class) added, or a mode left active, fails the score,
naming it (CodeCheckFailure: the run is `illegal`).
"""

from __future__ import annotations

import types
from typing import Any

import torch

from scoring.codecheck import CodeCheckFailure

Watched = list[tuple[str, Any]]
"""(name, module or class) pairs whose attributes the guard snapshots."""


_MISSING = object()
SELF_PATCHED = frozenset({"torch.manual_seed"})
"""Replaced by torch itself when a model compiles (torch._dynamo wraps it on import); the scorer never
calls it. torch.nn.Module is not watched either: compile patches it, and it is the model's own
territory (what the model returns is checked by the probes)."""


HOT_OPS = (
    "aten::copy_",
    "aten::_log_softmax.out",
    "aten::gather.out",
    "aten::neg",
    "aten::isfinite",
    "aten::all",
    "aten::any",
    "aten::isnan",
    "aten::eq.Scalar",
    "aten::index.Tensor",
    "aten::squeeze.dim",
    "aten::unsqueeze",
    "aten::slice.Tensor",
    "aten::empty.memory_format",
    "aten::_local_scalar_dense",
    "aten::sum",
    "aten::detach",
    "aten::_to_copy",
    "aten::view",
)
"""The kernels the scorer runs on the logits and targets between forward passes: checked after every one."""


def _kernels(names: list[str]) -> dict[str, str]:
    return {n: torch._C._dispatch_dump_table(n) for n in names}


def _mode_depths() -> tuple[int, int]:
    return torch._C._len_torch_function_stack(), torch._C._len_torch_dispatch_stack()


class ToolGuard:
    """Identity of every attribute of the scorer's tools, taken before submission code is imported; also
    torch's kernel registrations (a kernel registered through torch.library would compute for the scorer
    too) and its mode stacks (a function mode left entered, say by a suspended generator, would see
    every torch call the scorer makes)."""

    def __init__(self, watched: Watched) -> None:
        self._objs = watched
        self._snap = [dict(vars(obj)) for _, obj in self._objs]
        all_ops = set(torch._C._dispatch_get_all_op_names())
        self._hot = [n for n in HOT_OPS if n in all_ops]
        self._all = sorted(n for n in all_ops if n.startswith("aten::"))
        self._kernels = _kernels(self._all)  # about 0.15 s: all of aten, compared in full twice per score
        self._modes = _mode_depths()
        self.checks = 0

    def __call__(self, when: str = "", *, full: bool = False) -> None:
        """Raise CodeCheckFailure naming the first tool replaced, removed or added since the snapshot.

        `full` compares every aten kernel registration (about 0.15 s); otherwise the scorer's own (HOT_OPS).
        """
        self.checks += 1
        if _mode_depths() != self._modes:
            self._fail(
                f"a torch function or dispatch mode was left active (stack depths {_mode_depths()}, were {self._modes})",
                when,
            )
        for name in self._all if full else self._hot:
            if torch._C._dispatch_dump_table(name) != self._kernels[name]:
                self._fail(f"the kernels of {name} were replaced", when)
        for (name, obj), snap in zip(self._objs, self._snap, strict=True):
            cur = vars(obj)
            for k, v in snap.items():
                if cur.get(k, _MISSING) is not v and f"{name}.{k}" not in SELF_PATCHED:
                    self._fail(f"{name}.{k} was {'removed' if k not in cur else 'replaced'}", when)
            if not isinstance(obj, types.ModuleType) and len(cur) != len(snap):
                added = sorted(set(cur) - set(snap))
                self._fail(f"{name} gained {', '.join(map(repr, added[:3]))}", when)

    @staticmethod
    def _fail(what: str, when: str) -> None:
        raise CodeCheckFailure(
            f"code check failed: {what}{' ' + when if when else ''}: submission code changed a "
            "tool the scorer computes with"
        )

    def record(self) -> dict[str, Any]:
        return {
            "watched": [n for n, _ in self._objs],
            "kernels_watched": len(self._all),
            "checks": self.checks,
        }
