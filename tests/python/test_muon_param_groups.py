"""Muon's param groups: add_param_group is atomic (a group that fails a check leaves the optimizer as it was). No
server: the orthogonalization is the identity, as in test_muon_steps.py."""

import pytest
import torch

from orthoserve.torch import Muon, muon_param_groups


class IdentityMuon(Muon):
    def orthogonalize_batch(self, params, updates):
        return [u.clone() for u in updates]


def _snapshot(opt):
    return ([[id(p) for p in g["params"]] for g in opt.param_groups], dict(opt._names))


@pytest.mark.deadline(30)
@pytest.mark.parametrize("bad", [
    dict(params=[torch.nn.Parameter(torch.ones(4, 4)), torch.nn.Parameter(torch.ones(4))]),  # A 1-D parameter.
    dict(params=iter([torch.nn.Parameter(torch.ones(4, 4)), torch.nn.Parameter(torch.ones(3))])),  # An iterator.
    dict(params=[torch.nn.Parameter(torch.ones(4, 4))], lr=-1.0),  # A bad setting.
    dict(params=[torch.nn.Parameter(torch.ones(4, 4))], coefficient_type="nope"),
], ids=["1-d", "1-d-iterator", "negative-lr", "coefficient-type"])
def test_a_refused_group_leaves_the_optimizer_unchanged(bad):
    w = torch.nn.Parameter(torch.ones(3, 5))
    opt = IdentityMuon([w], lr=0.1, momentum=0.0, weight_decay=0.0)
    before = _snapshot(opt)
    with pytest.raises(ValueError):
        opt.add_param_group(bad)
    assert _snapshot(opt) == before and len(opt.param_groups) == 1
    # The optimizer still steps (a half-added group with a 1-D parameter would fail here).
    w.grad = torch.ones_like(w)
    opt.step()
    assert torch.equal(w.detach(), torch.full((3, 5), 0.9))


@pytest.mark.deadline(30)
def test_a_parameter_already_in_a_group_is_refused_and_nothing_changes():
    w, v = torch.nn.Parameter(torch.ones(3, 5)), torch.nn.Parameter(torch.ones(2, 2))
    opt = IdentityMuon([w])
    before = _snapshot(opt)
    with pytest.raises(ValueError, match="more than one parameter group"):
        opt.add_param_group(dict(params=[v, w]))
    assert _snapshot(opt) == before
    opt.add_param_group(dict(params=[v], lr=0.5))  # The same group without w is taken.
    assert len(opt.param_groups) == 2 and opt.param_groups[1]["lr"] == 0.5


@pytest.mark.deadline(30)
def test_a_good_group_is_added_with_its_settings():
    opt = IdentityMuon([torch.nn.Parameter(torch.ones(3, 5))], lr=0.1)
    v = torch.nn.Parameter(torch.ones(2, 3, 4))
    opt.add_param_group(dict(params=v, num_ns_steps=3))  # A lone tensor, an alias.
    assert opt.param_groups[1]["params"] == [v] and opt.param_groups[1]["ns_steps"] == 3
    with pytest.raises(TypeError, match="ordered collections"):  # torch's own check of a set.
        opt.add_param_group(dict(params={torch.nn.Parameter(torch.ones(2, 2))}))
    assert len(opt.param_groups) == 2


class TinyLM(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.wte = torch.nn.Embedding(10, 8)
        self.blocks = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 8))
        self.experts = torch.nn.Parameter(torch.randn(2, 8, 8))
        self.norm = torch.nn.LayerNorm(8)
        self.lm_head = torch.nn.Linear(8, 10, bias=False)

    def forward(self, tokens):
        x = self.blocks(self.wte(tokens))
        return self.lm_head(self.norm(x + torch.einsum("btd,edf->btf", x, self.experts)))


def names(groups):
    return [n for g in groups for n, _ in g["params"]]


@pytest.mark.deadline(30)
def test_muon_param_groups_splits_hidden_weights_from_embeddings_head_norms_and_biases():
    model = TinyLM()
    muon_groups, adamw_groups = muon_param_groups(model, lr=0.02, nd="batch")
    assert names(muon_groups) == ["experts", "blocks.0.weight", "blocks.2.weight"]
    assert names(adamw_groups) == ["wte.weight", "blocks.0.bias", "blocks.2.bias", "norm.weight", "norm.bias",
                                   "lm_head.weight"]
    assert muon_groups[0]["lr"] == 0.02 and muon_groups[0]["nd"] == "batch" and set(adamw_groups[0]) == {"params"}
    # Every parameter on exactly one side.
    assert sorted(names(muon_groups) + names(adamw_groups)) == sorted(n for n, _ in model.named_parameters())
    # Both optimizers take them, and train the model.
    opt, adamw = IdentityMuon(muon_groups), torch.optim.AdamW(adamw_groups, lr=1e-3)
    assert opt._names[id(model.experts)] == "experts"
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    model(torch.tensor([[1, 2, 3]])).square().mean().backward()
    opt.step()
    adamw.step()
    assert all(not torch.equal(before[n], p.detach()) for n, p in model.named_parameters())


@pytest.mark.deadline(30)
def test_muon_param_groups_head_choices():
    model = TinyLM()
    model.lm_head.weight = model.wte.weight  # Tied: one parameter, the embedding's, on AdamW's side.
    muon_groups, adamw_groups = muon_param_groups(model)
    assert names(muon_groups) == ["experts", "blocks.0.weight", "blocks.2.weight"]
    assert "wte.weight" in names(adamw_groups) and "lm_head.weight" not in names(adamw_groups)
    # head=False: the last Linear is a hidden weight; a head by name or module.
    model = TinyLM()
    assert "lm_head.weight" in names(muon_param_groups(model, head=False)[0])
    for head in ("blocks.2", model.blocks[2]):
        muon_groups, adamw_groups = muon_param_groups(model, head=head)
        assert names(muon_groups) == ["experts", "blocks.0.weight", "lm_head.weight"]
        assert "blocks.2.weight" in names(adamw_groups)
    with pytest.raises(ValueError, match="no submodule named 'nope'"):
        muon_param_groups(model, head="nope")
    with pytest.raises(TypeError):
        muon_param_groups(list(model.parameters()))
    # A model with nothing for one side gives no group for it (an empty group would be refused by torch).
    norm = torch.nn.LayerNorm(4)
    muon_groups, adamw_groups = muon_param_groups(norm)
    assert muon_groups == [] and names(adamw_groups) == ["weight", "bias"]
