"""Consistent hash ring with virtual nodes: which shard owns a (topic, key).

Each node is hashed onto a 64-bit circle `vnodes` times (`"{node}#{i}"`); a key belongs to the first
point clockwise from its own hash. Adding a node to N moves only the keys that now land on the new
node's points - about 1/(N+1) of them - and nothing moves between the old nodes. The hash is
BLAKE2b, not Python's `hash()`, so every process and every SDK version agrees on the placement.
"""

from __future__ import annotations

import bisect
import hashlib
from collections.abc import Iterable

DEFAULT_VNODES = 160


def hash64(data: bytes) -> int:
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "big")


def routing_key(topic: str, key: str) -> bytes:
    # NUL cannot appear in a topic name, so ("a", "b\0c") and ("a\0b", "c") never collide.
    return topic.encode("utf-8") + b"\x00" + key.encode("utf-8")


class HashRing:
    def __init__(self, nodes: Iterable[str] = (), vnodes: int = DEFAULT_VNODES) -> None:
        if vnodes < 1:
            raise ValueError("vnodes must be >= 1")
        self.vnodes = vnodes
        self._points: list[int] = []
        self._owners: list[str] = []
        self._nodes: set[str] = set()
        for node in nodes:
            self.add(node)

    @property
    def nodes(self) -> frozenset[str]:
        return frozenset(self._nodes)

    def __len__(self) -> int:
        return len(self._nodes)

    def add(self, node: str) -> None:
        if node in self._nodes:
            return
        self._nodes.add(node)
        for i in range(self.vnodes):
            point = hash64(f"{node}#{i}".encode())
            at = bisect.bisect_left(self._points, point)
            # Ties between nodes (astronomically rare) are broken by name so order of adds is irrelevant.
            while at < len(self._points) and self._points[at] == point and self._owners[at] < node:
                at += 1
            self._points.insert(at, point)
            self._owners.insert(at, node)

    def remove(self, node: str) -> None:
        if node not in self._nodes:
            return
        self._nodes.discard(node)
        keep = [(p, o) for p, o in zip(self._points, self._owners, strict=True) if o != node]
        self._points = [p for p, _ in keep]
        self._owners = [o for _, o in keep]

    def owner(self, key: bytes) -> str:
        if not self._points:
            raise LookupError("the hash ring is empty")
        at = bisect.bisect_right(self._points, hash64(key))
        return self._owners[at % len(self._owners)]

    def owner_of(self, topic: str, key: str) -> str:
        return self.owner(routing_key(topic, key))
