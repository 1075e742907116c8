"""The calls of the service are excluded from torch.compile tracing (orthoserve.torch.not_traced): a function that
calls newton_schulz, a RemoteNewtonSchulz or Muon.step compiles (backend "eager"), runs, and gives the eager
results; the graphs around the call hold only the function's own operations. Without the exclusion, Dynamo traced
into the gRPC client and failed there."""

import pytest
import torch

import orthoserve.torch
from orthoserve.torch import Muon, RemoteNewtonSchulz, newton_schulz

if not hasattr(torch, "compile"):
    pytest.skip("this torch has no torch.compile", allow_module_level=True)
try:
    import torch._dynamo  # noqa: F401
except ImportError:  # pragma: no cover - a torch built without Dynamo
    pytest.skip("this torch has no Dynamo", allow_module_level=True)


def compiled(fn, graphs):
    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    torch._dynamo.reset()
    try:
        return torch.compile(fn, backend=backend)
    except RuntimeError as e:  # e.g. a Python version this torch's Dynamo does not support
        pytest.skip(f"torch.compile is unavailable here: {e}")


@pytest.fixture()
def default_client(client):
    orthoserve.torch.set_default_client(client)
    yield client
    orthoserve.torch.set_default_client(None)


@pytest.mark.deadline(120)
def test_newton_schulz_under_torch_compile(default_client):
    def f(x):
        return newton_schulz(x * 2, steps=5, coefficient_type="quintic") + 1

    graphs = []
    x = torch.randn(16, 8)
    got = compiled(f, graphs)(x)
    torch.testing.assert_close(got, f(x), rtol=0, atol=0)
    # The multiplication before the call and the addition after it: two graphs, nothing of the call in them.
    assert len(graphs) == 2
    ops = [n.target for g in graphs for n in g.graph.nodes if n.op == "call_function"]
    assert len(ops) == 2, ops


@pytest.mark.deadline(120)
def test_remote_newton_schulz_under_torch_compile(client):
    ns = RemoteNewtonSchulz(client, steps=5, precision="highest")

    def f(x):
        return ns(x.abs()).sum(dim=0)

    x = torch.randn(3, 12, 6)
    torch.testing.assert_close(compiled(f, [])(x), f(x), rtol=0, atol=0)


@pytest.mark.deadline(180)
def test_muon_step_under_torch_compile(client):
    torch.manual_seed(0)
    a, b = torch.nn.Linear(8, 6, bias=False), torch.nn.Linear(8, 6, bias=False)
    b.load_state_dict(a.state_dict())
    opts = [Muon(m.parameters(), client=client, lr=0.05, fp32_matmul_prec="highest") for m in (a, b)]
    x = torch.randn(4, 8)

    def train_step(model, opt):
        opt.zero_grad()
        model(x).square().mean().backward()
        opt.step()

    step = compiled(train_step, [])
    for _ in range(2):
        step(a, opts[0])
        train_step(b, opts[1])
    torch.testing.assert_close(a.weight.detach(), b.weight.detach(), rtol=0, atol=0)
