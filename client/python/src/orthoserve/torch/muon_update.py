"""The part of Muon's step that comes before the orthogonalization, as one function (momentum_update) that both the
synchronous step and the overlapped sends (orthoserve.torch.overlap) call, so that the two cannot drift apart; and
what the result depends on (Inputs), to tell at step() whether an update computed during backward is still the one
the step would compute."""

from __future__ import annotations

import dataclasses
from typing import Any, Dict, Optional, Tuple

import torch

__all__ = ["momentum_update", "Inputs", "inputs_of", "entering_settings"]

# Settings that enter only when the step applies an update (the learning rate and its adjustment), not the update
# itself: an update computed before they changed is still the update.
_APPLIED_ONLY = ("lr", "adjust_lr_fn", "use_syrk")


def momentum_update(p: torch.Tensor, grad: torch.Tensor, buf: Optional[torch.Tensor],
                    settings: Dict[str, Any]) -> Tuple[Optional[torch.Tensor], torch.Tensor, torch.Tensor]:
    """(new gradient or None, new momentum buffer, update) of parameter p with gradient `grad` and momentum buffer
    `buf` (None before the first step) under a param group's `settings`: the l2 weight decay (grad + wd·p), the EMA
    momentum buf.lerp(grad, 1 - momentum), Nesterov's grad.lerp(buf, momentum) or the buffer itself. Everything is a
    new tensor: p, grad and buf are only read (the step writes them once every update is orthogonalized). Call it
    under torch.no_grad()."""
    new_grad = None
    if settings["weight_decay"] != 0.0 and settings["weight_decay_method"] == "l2":
        new_grad = grad = grad.add(p, alpha=settings["weight_decay"])
    if buf is None:
        buf = torch.zeros_like(p)
    buf = buf.lerp(grad, 1 - settings["momentum"])
    update = grad.lerp(buf, settings["momentum"]) if settings["nesterov"] else buf
    return new_grad, buf, update


def entering_settings(settings: Dict[str, Any]) -> Dict[str, Any]:
    """The settings of a param group that its updates and their orthogonalization depend on: all but lr and
    adjust_lr_fn, which the step applies with their values at step(), and weight_decay unless the method is "l2"
    (the other methods decay p when the step applies; l2 adds wd·p to the gradient). So a learning-rate (or weight
    decay) schedule set between backward and step() does not void the updates sent during backward."""
    out = {k: v for k, v in settings.items() if k not in _APPLIED_ONLY}
    if settings.get("weight_decay_method") != "l2":
        out.pop("weight_decay", None)
    return out


def _same(a: Any, b: Any) -> bool:
    """a == b for settings and options (numbers, strings, tuples, lists, dicts); False when the comparison is not a
    plain bool (a tensor among them): then the update is recomputed, never wrongly reused."""
    try:
        return bool(a == b)
    except Exception:  # noqa: BLE001 - an ambiguous comparison counts as a change.
        return False


@dataclasses.dataclass(frozen=True, eq=False)
class Inputs:
    """What one parameter's update was computed from: the gradient tensor (the object) and its version counter, the
    parameter's version counter (an l2 weight decay reads it), the momentum buffer (the object, None before the first
    step) and its version counter, and the settings and NS options that enter (entering_settings, the server's
    options). `matches` says whether a later look at the same parameter would compute the same update: every tensor
    the same object at the same version (a tensor changed in place bumps its version: accumulation into .grad,
    clip_grad_norm_, zero_grad(set_to_none=False), an optimizer step), the settings and options equal."""

    grad: torch.Tensor
    grad_version: int
    param_version: int
    buf: Optional[torch.Tensor]
    buf_version: int
    key: Tuple[Dict[str, Any], Dict[str, Any]]

    def matches(self, other: "Inputs") -> bool:
        return (self.grad is other.grad and self.grad_version == other.grad_version
                and self.param_version == other.param_version and self.buf is other.buf
                and self.buf_version == other.buf_version and _same(self.key[0], other.key[0])
                and _same(self.key[1], other.key[1]))


def inputs_of(p: torch.Tensor, buf: Optional[torch.Tensor], settings: Dict[str, Any],
              options: Dict[str, Any]) -> Inputs:
    """The Inputs of parameter p's update now: its current .grad (not None), `buf` (its momentum buffer or None),
    its group's `settings` and its NS `options`."""
    grad = p.grad
    assert grad is not None
    return Inputs(grad=grad, grad_version=grad._version, param_version=p._version, buf=buf,
                  buf_version=-1 if buf is None else buf._version, key=(entering_settings(settings), dict(options)))
