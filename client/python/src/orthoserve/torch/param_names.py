"""The names of an optimizer's parameters on the wire (MatrixSpec.name, which the server's errors and logs use): the
names of `named_parameters()` when the param groups carry them (torch.optim's "param_names"), else "p<n>"; unique
among the optimizer's parameters (unique_name), and fitted to the server's Limits.max_name_bytes (fit_names)."""

from __future__ import annotations

import hashlib
from typing import Callable, Collection, List

__all__ = ["unique_name", "fit_name", "fit_names"]

# Names of at most this many bytes fit every server's limit: no server limit is read for them.
SAFE_NAME_BYTES = 64
# The server's default --max-name-bytes: the limit of a server that states none (Limits.max_name_bytes 0).
DEFAULT_MAX_NAME_BYTES = 1024
# Hex digits of the sha256 of the whole name that end a shortened name (fit_name).
_HASH_CHARS = 16


def unique_name(name: str, taken: Collection[str]) -> str:
    """`name`, or when `taken` holds it, the first of "name#2", "name#3", ... that it does not."""
    if name not in taken:
        return name
    n = 2
    while f"{name}#{n}" in taken:
        n += 1
    return f"{name}#{n}"


def fit_name(name: str, limit: int) -> str:
    """`name` when its UTF-8 encoding has at most `limit` bytes; else its longest prefix that leaves room (never
    half a character) followed by "~" and the first hex digits of the sha256 of the whole name, `limit` bytes at
    most: distinct names stay distinct (but for a hash collision), and the same name always gives the same result
    (on every rank of a group step)."""
    data = name.encode()
    if len(data) <= limit:
        return name
    digest = hashlib.sha256(data).hexdigest()
    suffix = "~" + digest[:_HASH_CHARS]
    keep = limit - len(suffix)
    if keep <= 0:
        return digest[:max(1, limit)]
    return data[:keep].decode("utf-8", errors="ignore") + suffix


def fit_names(names: List[str], limit_of: Callable[[], int]) -> List[str]:
    """`names` fitted to the server's name limit (fit_name): limit_of() (the server's Limits.max_name_bytes; 0 for
    DEFAULT_MAX_NAME_BYTES) is asked only when a name is longer than SAFE_NAME_BYTES. ValueError when two of the
    fitted names are equal (distinct names whose shortened forms collide)."""
    if all(len(n.encode()) <= SAFE_NAME_BYTES for n in names):
        return names
    limit = int(limit_of()) or DEFAULT_MAX_NAME_BYTES
    fitted = [fit_name(n, limit) for n in names]
    if len(set(fitted)) != len(fitted):
        raise ValueError(f"orthoserve: parameter names shortened to the server's limit of {limit} bytes are no longer "
                         "unique; give the parameters shorter names")
    return fitted
