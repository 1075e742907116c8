"""The functions of orthoserve.torch that call the service are excluded from torch.compile tracing (not_traced): a
call of one under torch.compile is a graph break, and runs eagerly, as outside torch.compile. Dynamo cannot trace a
gRPC call (it fails inside the client, turning the bytes of a result into a tensor)."""

from __future__ import annotations

from typing import Callable, TypeVar

import torch

__all__ = ["not_traced"]

F = TypeVar("F", bound=Callable)


def not_traced(fn: F) -> F:
    """`fn` excluded from torch.compile tracing: torch.compiler.disable(fn), else torch._dynamo.disable(fn) on a
    torch without torch.compiler.disable, else `fn` itself (a torch without torch.compile). The signature and
    docstring stay fn's (inspect follows __wrapped__)."""
    disable = getattr(getattr(torch, "compiler", None), "disable", None)
    if disable is None:
        try:
            import torch._dynamo as dynamo
        except ImportError:
            return fn
        disable = getattr(dynamo, "disable", None)
        if disable is None:
            return fn
    return disable(fn)
