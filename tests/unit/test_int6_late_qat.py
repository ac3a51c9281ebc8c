"""int6_era's late QAT under torch.compile: switched by a tensor the graph reads, so turning it on mid-run is no
recompile on the clock.

The first H200 run compiled a second graph for late QAT (a Python flag Dynamo guards on): 166 s of compile
warm-up, of the track's 180 s allowance. Now train.py gives every CastedLinear one shared 0-dim buffer,
`qat_mix`, and switches QAT by filling it. Checked here on CPU with a Dynamo backend that counts the graphs it is
handed (no Inductor, so the test is fast): flipping the buffer compiles nothing, and both settings give exactly
the eager forward and gradients; the control, flipping the Python flag under the same compile, is seen to
recompile (so the count can tell).
"""

from __future__ import annotations

import importlib.util

import pytest
import torch

from tests.conftest import REPO

TINY = dict(
    num_layers=2, model_dim=32, num_heads=2, num_kv_heads=1, xsa_last_n=1, ve_layers="1", ve_dim=8,
    bigram_vocab_size=32, bigram_dim=8, vocab_size=64,
)  # fmt: skip


def _module():
    spec = importlib.util.spec_from_file_location("int6_model", REPO / "baselines" / "int6_era" / "model.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _step(f, model, x):
    """Logits and the gradient of every parameter for one forward/backward (fresh gradients)."""
    model.zero_grad(set_to_none=True)
    out = f(x)
    out.float().square().mean().backward()
    return out.detach().clone(), [p.grad.clone() for p in model.parameters() if p.grad is not None]


def _same(a, b):
    assert torch.equal(a[0], b[0]) and len(a[1]) == len(b[1])
    assert all(torch.equal(u, v) for u, v in zip(a[1], b[1], strict=True))


@pytest.fixture()
def graphs():
    seen: list[object] = []

    def backend(gm, example_inputs):
        seen.append(gm)
        return gm.forward

    torch._dynamo.reset()
    yield seen, backend
    torch._dynamo.reset()


def _setup(mod):
    torch.manual_seed(0)
    model = mod.build_model(dict(TINY)).train()
    x = torch.randint(0, TINY["vocab_size"], (2, 16))
    linears = [m for m in model.modules() if isinstance(m, mod.CastedLinear)]
    eager_off = _step(model, model, x)
    for m in linears:
        m.qat = True
    eager_on = _step(model, model, x)
    for m in linears:
        m.qat = False
    return model, x, linears, eager_off, eager_on


def test_switching_late_qat_on_compiles_nothing_and_is_exactly_eager(graphs) -> None:
    seen, backend = graphs
    mod = _module()
    model, x, linears, eager_off, eager_on = _setup(mod)
    mix = torch.zeros(())
    for m in linears:
        m.register_buffer("qat_mix", mix, persistent=False)
    assert "qat_mix" not in "".join(model.state_dict())  # the artifact holds the same tensors as before
    f = torch.compile(model, backend=backend, dynamic=False)
    _same(_step(f, model, x), eager_off)  # mix 0.0: exactly the plain weight
    compiled = len(seen)
    assert compiled >= 1
    mix.fill_(1.0)  # what train.py's set_qat(True) does at the switch
    _same(_step(f, model, x), eager_on)  # exactly the eager QAT forward and gradients
    assert len(seen) == compiled, "switching late QAT on compiled a graph"


def test_control_flipping_the_python_flag_under_compile_recompiles(graphs) -> None:
    seen, backend = graphs
    mod = _module()
    model, x, linears, eager_off, eager_on = _setup(mod)
    f = torch.compile(model, backend=backend, dynamic=False)
    _same(_step(f, model, x), eager_off)
    compiled = len(seen)
    for m in linears:
        m.qat = True
    _same(_step(f, model, x), eager_on)
    assert len(seen) > compiled  # the old switch: a second graph, compiled where the switch happens
