"""Which fleet member a request goes to, from a ServerInfo's membership (the rule above `service Orthogonalizer`
in proto/orthoserve/v1/orthogonalizer.proto)."""

from __future__ import annotations

from typing import Iterable, List, Sequence

from orthoserve._proto.v1 import orthogonalizer_pb2 as pb

__all__ = ["member_addresses", "ready_addresses", "preferred_address", "unique"]


def member_addresses(info: pb.ServerInfo) -> List[str]:
    """Every member's public address, by rank; [] when the server lists no members or one lacks an address."""
    members = sorted(info.members, key=lambda m: m.rank)
    if not members or not all(m.address for m in members):
        return []
    return [m.address for m in members]


def ready_addresses(info: pb.ServerInfo) -> List[str]:
    """The ready members' (the current generation's) addresses by rank; all members' when none is marked ready;
    [] when the server lists no usable members."""
    if not member_addresses(info):
        return []
    members = sorted(info.members, key=lambda m: m.rank)
    ready = [m.address for m in members if m.ready]
    return ready or [m.address for m in members]


def preferred_address(info: pb.ServerInfo, rank: int, world: int, fallback: Sequence[str], avoid: str = "") -> str:
    """Trainer rank `rank` of `world`: the member at position floor(rank * M / world) of the M ready members
    sorted by rank (all members if none is ready); of `fallback` by the same rule when none are listed. When that
    one is `avoid` (where the previous attempt failed: it may still look ready while it stalls or drains) and the
    pool has another, the next one in the pool instead."""
    pool = ready_addresses(info) or list(fallback)
    i = rank * len(pool) // world
    if pool[i] == avoid and len(pool) > 1:
        i = (i + 1) % len(pool)
    return pool[i]


def unique(addresses: Iterable[str]) -> List[str]:
    """The addresses in order, each once."""
    seen, out = set(), []
    for a in addresses:
        if a and a not in seen:
            seen.add(a)
            out.append(a)
    return out
