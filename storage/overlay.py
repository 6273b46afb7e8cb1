"""The key index's overlay: the keys put that its database does not hold yet, in memory.

The key index (storage/keyindex.py) queues its writes for a checkpoint and answers lookups from
the overlay first. Every keyed message produced goes in, and almost none is ever looked up
there (the key filter rules new keys out first), so a put has to be cheap: an overlay keeps the
entries as they came (a produce batch's `Run` is one object for all its keys) and finds a key
through tables of hashes, one slot of 16 bytes a key, filled by a compiled loop without a Python
object per key. A Python dict from key to entry cost 110-140 ns a key to fill on the event loop
(BENCHMARKS.md, twentieth session).

An overlay is a list of entries, numbered in the order they were put, and a list of tables,
newest last; a key's answer is its newest entry (the highest number, then the highest place in
it). A table takes up to half its slots (SLICE keys), then the next one begins: a table stays
near the CPU's caches while it is filled, and never grows or rehashes on the event loop.
The tables are filled when a key is looked for, with the entries put since the last look: an
overlay's keys that are written (and the overlay dropped) before a look never cost a slot, and
their tables are never allocated (50-60 ns less event-loop CPU a keyed message produced with a
fresh index: 0.20-0.22 µs more than a keyless one before, 0.15-0.16 now; BENCHMARKS.md). A look
pays for what was put since the one before: 2-5 ms after 100,000-250,000 keys with none between
(a key filter's false maybe looks too, so a busy keyed produce fills the tables as it goes).

Table (a bytearray of 16 + 16 * nslots bytes, nslots a power of two, 2 or more; fields
little-endian, as the batch core reads every field; never stored, like the filter):

    offset        size  field  meaning
    ------------  ----  -----  --------------------------------------------------------------
    0                8  used   slots holding a key (at most nslots / 2)
    8                8  -      zero
    16 + 16 * s      8  hash   slot s: the pair's hash (storage.keyfilter `pair_hash`)
    24 + 16 * s      4  entry  1 + the number of the entry holding the key; 0: the slot is free
    28 + 16 * s      4  at     the key's place in that entry's keys

A pair's first slot is `(hash >> 32) & (nslots - 1)`, then the next ones in turn (linear
probing). Two pairs can share a hash: `find` answers every slot with the hash asked, and the
overlay compares the keys.

The functions come twice, like the key filter's: compiled (`overlay_put`, `overlay_find` in
storage/batch_keys.c, module delayd.storage._batch) and here in Python as the reference;
tests/storage/test_overlay.py checks both leave the same bytes and give the same answers.
"""

from __future__ import annotations

import operator
import struct
import sys
from collections.abc import Sequence
from typing import Any

from delayd.storage import native
from delayd.storage.keyfilter import keys_part, pair_hash

HEADER = 16
SLOT = struct.Struct("<QII")  # hash, 1 + entry, at
assert SLOT.size == 16
_USED = struct.Struct("<Q")
# Keys a table takes: 2 * SLICE slots, 1 MiB. Filling a table far beyond the CPU's caches costs
# a cache miss a key; more tables cost a probe each for the (few) keys looked up in the overlay.
SLICE = 1 << 15

Held = tuple[int, int] | None  # a key's (seq, deliver_at); None: released


def new_table(keys: int) -> bytearray:
    """An empty table with room for `keys` keys (at least 1)."""
    return bytearray(HEADER + SLOT.size * (1 << max(keys * 2 - 1, 1).bit_length()))


def _opened(table: Any) -> tuple[int, int]:
    """(nslots, used) of a table, once it is checked."""
    if not isinstance(table, bytearray):
        raise TypeError("table: expected a bytearray")
    n = (len(table) - HEADER) // SLOT.size if len(table) >= HEADER + 2 * SLOT.size and (len(table) - HEADER) % SLOT.size == 0 else 0
    if not n or n & (n - 1):
        raise ValueError(f"table: {len(table)} bytes is not a {HEADER}-byte header and a power of two (2 or more) "
                         f"of {SLOT.size}-byte slots")
    used = _USED.unpack_from(table)[0]
    if used > n // 2:
        raise ValueError(f"table: damaged ({used} entries held, room for {n // 2})")
    return n, used


def overlay_put(table: bytearray, topic: str, keys: Sequence[Any], entry: int, start: int) -> int:
    """A slot for each key from keys[start] on (None left out) while the table has room:
    (pair hash, entry + 1, the key's place). The place of the first key not taken (None keys
    skipped), len(keys) when all were."""
    entry, start = operator.index(entry), operator.index(start)
    if not 0 <= entry < 0xFFFFFFFF:
        raise ValueError("entry: out of range")
    tpart = keys_part(topic, keys)
    if not 0 <= start <= len(keys) or len(keys) > 0xFFFFFFFF:
        raise ValueError("start: out of range")
    n, used = _opened(table)
    mask = n - 1
    i = start
    try:
        while i < len(keys):
            key = keys[i]
            if key is not None:
                if used == n // 2:
                    break
                z = pair_hash(key, tpart)
                s = (z >> 32) & mask
                for _ in range(n):
                    if SLOT.unpack_from(table, HEADER + s * SLOT.size)[1] == 0:
                        break
                    s = (s + 1) & mask
                else:
                    raise ValueError("table: damaged (no free slot)")
                SLOT.pack_into(table, HEADER + s * SLOT.size, z, entry + 1, i)
                used += 1
            i += 1
    finally:
        _USED.pack_into(table, 0, used)
    return i


def overlay_find(table: bytearray, topic: str, keys: Sequence[Any]) -> list[tuple[int, int, int]]:
    """(place in keys, entry, the key's place in the entry) for every slot whose pair hash is a
    key's (None left out), in the keys' order, each key's in probe order."""
    tpart = keys_part(topic, keys)
    n, _used = _opened(table)
    mask = n - 1
    out = []
    for i, key in enumerate(keys):
        if key is None:
            continue
        z = pair_hash(key, tpart)
        s = (z >> 32) & mask
        for _ in range(n):
            h, e, at = SLOT.unpack_from(table, HEADER + s * SLOT.size)
            if e == 0:
                break
            if h == z:
                out.append((i, e - 1, at))
            s = (s + 1) & mask
    return out


class Run:
    """A produce batch's keys (KeyIndex.put_run): message first_seq + i holds keys[i] (None:
    no key), due dues[i]. `keys` as the produce gave them: from the batch core, packed
    (storage/batch_keyseq.c `Keys`: a str is made only for a key asked for)."""

    __slots__ = ("topic", "keys", "first_seq", "dues")

    def __init__(self, topic: str, keys: Sequence[str | None], first_seq: int, dues: Sequence[int]) -> None:
        self.topic, self.keys, self.first_seq, self.dues = topic, keys, first_seq, dues

    def held(self, at: int) -> Held:
        return self.first_seq + at, int(self.dues[at])


class Rows:
    """Rows (topic, key, seq, deliver_at) of one topic (KeyIndex.put_many)."""

    __slots__ = ("topic", "keys", "rows")

    def __init__(self, topic: str, rows: list[tuple[str, str, int, int]]) -> None:
        self.topic, self.rows = topic, rows
        self.keys = [r[1] for r in rows]

    def held(self, at: int) -> Held:
        return self.rows[at][2], self.rows[at][3]


class Released:
    """A key made free (KeyIndex.release)."""

    __slots__ = ("topic", "keys")

    def __init__(self, topic: str, key: str) -> None:
        self.topic, self.keys = topic, [key]

    def held(self, at: int) -> Held:
        return None


Entry = Run | Rows | Released


class Overlay:
    """Entries in the order they were put, and the tables that find their keys (the module's
    docstring)."""

    __slots__ = ("entries", "tables", "filled")

    def __init__(self) -> None:
        self.entries: list[Entry] = []
        self.tables: list[bytearray] = []
        self.filled = 0  # entries whose keys the tables hold (those before this number)

    def __bool__(self) -> bool:
        return bool(self.entries)

    def put(self, entry: Entry) -> None:
        """Its keys now answer with `entry`, over what was put before (in the tables from the
        next `find` on)."""
        self.entries.append(entry)

    def _fill(self) -> None:
        """A slot for every key of the entries put since the last fill."""
        while self.filled < len(self.entries):
            number = self.filled
            entry = self.entries[number]
            start = 0
            while True:
                if self.tables:
                    start = ops.overlay_put(self.tables[-1], entry.topic, entry.keys, number, start)
                    if start == len(entry.keys):
                        break
                self.tables.append(new_table(SLICE))
            self.filled = number + 1

    def find(self, topic: str, keys: list[str]) -> dict[str, Held]:
        """The newest answer of each of `keys` the overlay has (None: released)."""
        self._fill()
        best: dict[int, tuple[int, int]] = {}
        entries = self.entries
        for table in self.tables:
            for i, number, at in ops.overlay_find(table, topic, keys):
                if (number, at) > best.get(i, (-1, -1)):
                    e = entries[number]
                    if e.topic == topic and e.keys[at] == keys[i]:
                        best[i] = (number, at)
        return {keys[i]: entries[number].held(at) for i, (number, at) in best.items()}

    def keys(self) -> list[tuple[str, Sequence[str | None]]]:
        """(topic, keys) of every entry."""
        return [(e.topic, e.keys) for e in self.entries]

    def absorb(self, newer: Overlay) -> None:
        """Take `newer`'s entries in, over this overlay's."""
        for e in newer.entries:
            self.put(e)


_compiled = native.compiled()
ops: Any = _compiled if _compiled is not None else sys.modules[__name__]
