"""The conventional split of a model's parameters between Muon and AdamW (muon_param_groups): Muon for the hidden
weight matrices, AdamW for the input embeddings, the output head, and the gains and biases."""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Set, Tuple, Union

import torch

__all__ = ["muon_param_groups"]

_EMBEDDINGS = (torch.nn.Embedding, torch.nn.EmbeddingBag)


def _head_ids(model: torch.nn.Module, head: Union[None, bool, str, torch.nn.Module]) -> Set[int]:
    """The ids of the output head's parameters: `head` (a submodule, or its name in model.named_modules()), False for
    none, None for the last torch.nn.Linear of model.modules()."""
    if head is False:
        return set()
    if head is None or head is True:
        linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
        module: Optional[torch.nn.Module] = linears[-1] if linears else None
    elif isinstance(head, str):
        module = dict(model.named_modules()).get(head)
        if module is None:
            raise ValueError(f"muon_param_groups: the model has no submodule named {head!r} (head=)")
    elif isinstance(head, torch.nn.Module):
        module = head
    else:
        raise TypeError(f"muon_param_groups: head must be a module, a module name, None or False, got "
                        f"{type(head).__name__}")
    return set() if module is None else {id(p) for p in module.parameters()}


def muon_param_groups(model: torch.nn.Module, *, head: Union[None, bool, str, torch.nn.Module] = None,
                      **muon_group_options: Any) -> Tuple[List[Dict[str, Any]], List[Dict[str, Any]]]:
    """(muon_groups, adamw_groups): the param groups of Muon and of AdamW for `model`, split as Muon is meant to be
    used: Muon for the hidden weights (parameters of >= 2 dims); AdamW for the parameters of the input embeddings
    (torch.nn.Embedding, torch.nn.EmbeddingBag), of the output head, and those of < 2 dims (norms' gains, biases).

    head: the output head: None (default) for the model's last torch.nn.Linear in model.modules() order (an LM's
      lm_head, a classifier), a submodule or its name in model.named_modules(), or False for none. A head whose
      weight is tied to the embedding is one parameter, the embedding's: AdamW's either way.
    muon_group_options: settings of the Muon group (lr, weight_decay, nd, ... as Muon's param groups take them).
    Each side is a list of at most one group (empty when it has no parameters) whose "params" are the
    (name, parameter) pairs of model.named_parameters(), so that Muon names the matrices on the wire after them:
        muon_groups, adamw_groups = muon_param_groups(model, lr=0.02)
        opt = Muon(muon_groups); adamw = torch.optim.AdamW(adamw_groups, lr=3e-4)
    """
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"muon_param_groups: model must be a torch.nn.Module, got {type(model).__name__}")
    to_adamw = _head_ids(model, head)
    for module in model.modules():
        if isinstance(module, _EMBEDDINGS):
            to_adamw.update(id(p) for p in module.parameters())
    muon: List[Tuple[str, torch.nn.Parameter]] = []
    adamw: List[Tuple[str, torch.nn.Parameter]] = []
    for name, p in model.named_parameters():
        (adamw if p.dim() < 2 or id(p) in to_adamw else muon).append((name, p))
    return ([dict(params=muon, **muon_group_options)] if muon else [],
            [dict(params=adamw)] if adamw else [])
