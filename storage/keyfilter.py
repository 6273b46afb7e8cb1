"""The key filter: which (topic, key) pairs the key index may hold, answered from memory.

Most keys a producer sends are new. Without a filter every one of them costs a B-tree lookup in
keys.sqlite on the event loop (1.0-1.5 µs a key, a third of a keyed produce); with it, a key the
filter has never seen is known to be free after one probe of one cache line, and only the keys
the filter may hold (those held, and at most about 0.005% more, 2.5% in a filter of more than 4M
keys: false positives) are looked up.

It is a blocked Bloom filter (Putze, Sanders and Singler, "Cache-, Hash- and Space-Efficient
Bloom Filters", 2007), in memory only: never written to disk, built again in every process
(storage.keyindex builds it from the index in a thread). It never answers "free" for a pair
that was added; it cannot forget one, so keys that are released or expire stay "maybe" until
the next build.

Memory layout (`bits`, a bytearray of `nblocks * 64` bytes):

    offset       size  field   meaning
    -----------  ----  ------  -----------------------------------------------------------------
    64 * b         64  block   512 bits; a pair sets (and asks for) PROBES bits of one block

Hashing a pair: `z = mix(hash(key) + hash(topic) * GOLDEN)` (64-bit, Python's own string hash,
which the string caches, so a dict insert of the same key later costs no hashing; it differs
between processes, which is why the filter is never stored). The block is
`((z & 0xFFFFFFFF) * nblocks) >> 32`; with `w = mix(z)`, bit `i` of the pair in its block is
`(w >> (9 * i)) & 511`, for i in 0..PROBES-1, bit n of a block being bit (n & 7) of its byte
n >> 3. `mix` is the splitmix64 finaliser.

The functions come twice, like the batch core: compiled (`filter_add`, `filter_add_json`,
`filter_maybe`, `filter_claim` in storage/batch_keys.c, module delayd.storage._batch) and here in
Python as the reference; tests/storage/test_keyfilter.py checks both give the same bits and answers.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from typing import Any

from delayd.storage import native

BLOCK = 64  # bytes a block
PROBES = 6
# Bits a key at capacity: BITS_PER_KEY (about 2.5% false maybes), or up to SMALL_BITS_PER_KEY
# (about 0.005%; 16 bits: 0.12%) while the filter stays within SMALL_FILTER_BYTES. False maybes
# cost a SQLite query on the event loop (BENCHMARKS.md: up to 170 us a batch of 1,000 new keys at
# 8 bits a key, 30-100 us for one or two keys), and 4 MiB is little next to what a big index
# costs; past 4M keys of capacity it is 1 byte a key.
BITS_PER_KEY = 8
SMALL_BITS_PER_KEY = 32
SMALL_FILTER_BYTES = 4 << 20
MIN_CAPACITY = 1 << 16
GOLDEN = 0x9E3779B97F4A7C15
M64 = (1 << 64) - 1


def mix(z: int) -> int:
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
    return z ^ (z >> 31)


def _checked(bits: Any, topic: Any, keys: Any) -> tuple[int, int]:
    """The filter's block count and the topic's part of every pair's hash, once the arguments
    are checked (in the compiled functions' order)."""
    if not isinstance(bits, bytearray):
        raise TypeError("bits: expected a bytearray")
    if len(bits) == 0 or len(bits) % BLOCK:
        raise ValueError(f"bits: {len(bits)} bytes is not a whole number of {BLOCK}-byte blocks")
    return len(bits) // BLOCK, keys_part(topic, keys)


def keys_part(topic: Any, keys: Any) -> int:
    """The topic's part of every pair's hash, once the topic and the keys are checked (also
    storage.overlay's)."""
    if not isinstance(topic, str):
        raise TypeError("topic: expected a str")
    if not isinstance(keys, (list, tuple)):
        raise TypeError("keys: expected a list or a tuple")
    return (hash(topic) & M64) * GOLDEN


def pair_hash(key: Any, tpart: int) -> int:
    """The pair's hash z, `tpart` the topic's part (also what storage.overlay's tables find a key by)."""
    return mix(((hash(key) & M64) + tpart) & M64)


def _places(key: Any, tpart: int, nblocks: int) -> list[int]:
    """The bit numbers (within the filter) of the pair (topic, key)."""
    z = pair_hash(key, tpart)
    base = (((z & 0xFFFFFFFF) * nblocks) >> 32) * BLOCK * 8
    w = mix(z)
    return [base + ((w >> (9 * i)) & 511) for i in range(PROBES)]


def filter_add(bits: bytearray, topic: str, keys: Sequence[Any], alone: bool = False) -> int:
    """Add (topic, key) for every key that is not None; the number added. `alone`: no other
    thread uses `bits` meanwhile (the compiled one then adds packed keys without the GIL)."""
    nblocks, t = _checked(bits, topic, keys)
    n = 0
    for key in keys:
        if key is None:
            continue
        for p in _places(key, t, nblocks):
            bits[p >> 3] |= 1 << (p & 7)
        n += 1
    return n


def filter_add_json(bits: bytearray, topic: str, chunk: bytes) -> tuple[int, str | None]:
    """filter_add of the keys in `chunk`, a JSON array of strings in UTF-8, as SQLite's
    json_group_array writes the key index's keys (a filter's build reads them so); the number
    added, and the last key (None for none), after which the build's next chunk starts. A chunk
    that is not such an array: ValueError, and nothing added. The compiled one makes no str for a
    key of ASCII without an escape, and reads the chunk and sets the bits without the GIL: no other
    thread may use `bits` meanwhile (a build's own filter, not installed yet)."""
    _checked(bits, topic, [])
    if not isinstance(chunk, bytes):
        raise TypeError("chunk: expected bytes")
    keys = json.loads(chunk.decode())  # (UnicodeDecodeError and JSONDecodeError are ValueErrors)
    if not isinstance(keys, list) or not all(isinstance(k, str) for k in keys):
        raise ValueError("chunk: not a JSON array of strings")
    return filter_add(bits, topic, keys), keys[-1] if keys else None


def filter_maybe(bits: bytearray, topic: str, keys: Sequence[Any]) -> list[Any]:
    """The keys (in order, None left out) whose pair may have been added; for every other key
    the pair certainly was not."""
    nblocks, t = _checked(bits, topic, keys)
    return [key for key in keys if key is not None and all(
        bits[p >> 3] >> (p & 7) & 1 for p in _places(key, t, nblocks))]


def filter_bits(capacity: int) -> int:
    """The bits of a filter for `capacity` pairs: SMALL_BITS_PER_KEY a pair as long as that fits
    in SMALL_FILTER_BYTES, then SMALL_FILTER_BYTES until BITS_PER_KEY a pair needs more."""
    return max(capacity * BITS_PER_KEY, min(capacity * SMALL_BITS_PER_KEY, SMALL_FILTER_BYTES * 8))


def filter_claim(bits: bytearray, topic: str, keys: Sequence[Any]) -> tuple[list[Any], int]:
    """filter_maybe and filter_add in one pass: for each key (None left out) in order, whether its
    pair may have been added (before its own), then add it. The maybe keys, and the number added.
    A produce asks the filter about its keys and puts them in one go (KeyIndex.claim_many)."""
    nblocks, t = _checked(bits, topic, keys)
    maybe = []
    n = 0
    for key in keys:
        if key is None:
            continue
        places = _places(key, t, nblocks)
        if all(bits[p >> 3] >> (p & 7) & 1 for p in places):
            maybe.append(key)
        for p in places:
            bits[p >> 3] |= 1 << (p & 7)
        n += 1
    return maybe, n


class KeyFilter:
    """One filter, sized for `capacity` pairs (`filter_bits`, whole blocks)."""

    __slots__ = ("bits", "capacity", "added")

    def __init__(self, capacity: int) -> None:
        self.capacity = max(capacity, MIN_CAPACITY)
        nblocks = -(-filter_bits(self.capacity) // (BLOCK * 8))
        self.bits = bytearray(nblocks * BLOCK)
        self.added = 0

    def add(self, topic: str, keys: Sequence[str | None], alone: bool = False) -> int:
        """Add the pairs; how many keys were added (those not None). `alone`: only while no other
        thread uses the filter (its build), and then a produce's packed keys without the GIL."""
        n: int = ops.filter_add(self.bits, topic, keys, alone)
        self.added += n
        return n

    def add_json(self, topic: str, chunk: bytes) -> tuple[int, str | None]:
        """Add the pairs of the keys in `chunk`, a JSON array of strings (`filter_add_json`): how
        many, and the last key. Only while no other thread uses the filter (its build)."""
        n, last = ops.filter_add_json(self.bits, topic, chunk)
        self.added += n
        return n, last

    def maybe(self, topic: str, keys: Sequence[str]) -> list[str]:
        return ops.filter_maybe(self.bits, topic, keys)

    def claim(self, topic: str, keys: Sequence[str | None]) -> tuple[list[str], int]:
        """maybe, then add, in one pass (`filter_claim`): the keys that may have been added
        before, and how many were added."""
        maybe, n = ops.filter_claim(self.bits, topic, keys)
        self.added += n
        return maybe, n

    @property
    def full(self) -> bool:
        return self.added > self.capacity


_compiled = native.compiled()
ops: Any = _compiled if _compiled is not None else sys.modules[__name__]
