"""Muon's param groups: add_param_group is atomic (a group that fails a check leaves the optimizer as it was). No
server: the orthogonalization is the identity, as in test_muon_steps.py."""

import pytest
import torch

from orthoserve.torch import Muon


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
