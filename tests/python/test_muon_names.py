"""Muon takes named_parameters() and sends the names as the matrices' names (MatrixSpec.name): unique within the
optimizer, and fitted to the server's Limits.max_name_bytes. The wire is read from a recording fake server (which
echoes each matrix back); the name limit is the real server's."""

import pytest
import torch

import orthoserve
from conftest import start_server
from fake_server import FakeServer
from orthoserve.torch import Muon
from orthoserve.torch.param_names import fit_name, fit_names, unique_name


def model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 6, bias=False), torch.nn.Tanh(), torch.nn.Linear(6, 3, bias=False))


def step_names(fake, opt, params):
    for p in params:
        p.grad = torch.ones_like(p)
    opt.step()
    messages = fake.servicer.streams[-1]
    return [m.spec.name for m in messages if m.WhichOneof("kind") == "spec"]


@pytest.fixture()
def fake():
    server = FakeServer()
    yield server
    server.stop()


@pytest.mark.deadline(60)
def test_named_parameters_name_the_matrices_on_the_wire(fake):
    m = model()
    with orthoserve.Client(fake.address) as client:
        opt = Muon(m.named_parameters(), client=client, lr=0.1)
        assert step_names(fake, opt, list(m.parameters())) == ["0.weight", "2.weight"]
        # Param groups of (name, tensor) pairs, as torch.optim takes them; the settings per group as before.
        m2 = model()
        opt = Muon([dict(params=[("first", m2[0].weight)], lr=0.5), dict(params=[("second", m2[2].weight)])],
                   client=client, lr=0.1)
        assert step_names(fake, opt, list(m2.parameters())) == ["first", "second"]
        assert [g["lr"] for g in opt.param_groups] == [0.5, 0.1]
        # Without names: p0, p1 (as before).
        m3 = model()
        opt = Muon(m3.parameters(), client=client, lr=0.1)
        assert step_names(fake, opt, list(m3.parameters())) == ["p0", "p1"]


@pytest.mark.deadline(60)
def test_names_are_made_unique_and_the_group_added_later_too(fake):
    a, b, c = (torch.nn.Parameter(torch.randn(3, 4)) for _ in range(3))
    with orthoserve.Client(fake.address) as client:
        opt = Muon([dict(params=[("w", a)]), dict(params=[("w", b)])], client=client)
        opt.add_param_group(dict(params=[("w", c)], lr=0.2))
        assert step_names(fake, opt, [a, b, c]) == ["w", "w#2", "w#3"]
    with pytest.raises(ValueError, match=r"\(bias\)"):  # A refused parameter is named in the error.
        Muon([("w", a), ("bias", torch.nn.Parameter(torch.ones(3)))], client=client)


@pytest.mark.deadline(60)
def test_unnamed_and_named_groups_do_not_mix():
    a, b = torch.nn.Parameter(torch.randn(3, 4)), torch.nn.Parameter(torch.randn(3, 4))
    opt = Muon([("a", a)], client=None)
    with pytest.raises(ValueError, match="with/without names"):  # torch's own rule.
        opt.add_param_group(dict(params=[b]))
    assert len(opt.param_groups) == 1


def test_fit_name():
    assert fit_name("layers.3.attn.qkv.weight", 24) == "layers.3.attn.qkv.weight"
    long = "blocks." + "x" * 100 + ".weight"
    short = fit_name(long, 40)
    assert len(short.encode()) <= 40 and short.startswith("blocks.xxx") and "~" in short
    assert fit_name(long, 40) == short and fit_name(long + "2", 40) != short  # Stable, and distinct per name.
    assert len(fit_name("é" * 50, 30).encode()) <= 30 and fit_name("é" * 50, 30).encode().decode()  # Whole chars.
    assert unique_name("w", {"w", "w#2"}) == "w#3" and unique_name("v", {"w"}) == "v"
    asked = []
    assert fit_names(["a", "b"], lambda: asked.append(1) or 10) == ["a", "b"] and not asked  # Short: no question.
    assert [len(n) for n in fit_names(["a", "y" * 80], lambda: 0)] == [1, 80]  # 0: the server's default, 1024.


@pytest.mark.deadline(120)
def test_a_long_name_is_shortened_to_the_servers_limit(tmp_path):
    server = start_server(tmp_path, ["--max-name-bytes", "48"])
    try:
        long = "model.layers.0." + "very_long_module_name." * 4 + "weight"
        torch.manual_seed(0)
        w = torch.nn.Parameter(torch.randn(8, 6))
        ref = torch.nn.Parameter(w.detach().clone())
        with orthoserve.Client(server.address) as client:
            assert client.info().limits.max_name_bytes == 48
            opt = Muon([(long, w), ("short", torch.nn.Parameter(torch.randn(4, 4)))], client=client, lr=0.1,
                       fp32_matmul_prec="highest")
            other = Muon([ref], client=client, lr=0.1, fp32_matmul_prec="highest")
            for p in (w, ref):
                p.grad = torch.ones_like(p) + torch.arange(48.0).reshape(8, 6) / 48
            opt.param_groups[0]["params"][1].grad = torch.ones(4, 4)
            opt.step()
            other.step()
        assert torch.equal(w.detach(), ref.detach())  # The same numbers as with a short name.
    finally:
        server.stop()
