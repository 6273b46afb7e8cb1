"""The key index: (topic, key) -> the message that holds the key, in SQLite.

Why SQLite: keys must not live in a per-message Python dict (memory has to stay flat with
10M keyed messages), and a B-tree on disk with a bounded page cache is exactly that. SQLite
ships with Python, is crash-safe on its own, and its B-tree gives ordered, compact storage
(see BENCHMARKS.md for inserts/s, lookups/s and RSS at 10M keys).

The index is derived data, like the TimerLog: the commit log is the truth. Its `meta` row
`commit_pos` says up to which commit-log offset its content is complete; it is written in
the same transaction as the entries, so after any crash recovery replays the log from
`min(checkpoint, commit_pos)` and the index agrees with the log again. Entries say nothing
about state: a lookup's caller checks the message table (scheduled, delivered, cancelled),
so an entry that missed an update can never produce a wrong answer.

A key filter (storage/keyfilter.py) in memory answers first: only the keys it may hold are
looked up (`FilterBuild` says how it is built without ever missing a key).

Tables `keys` and `recent` (the same columns; one row per key in each):

    column      type     meaning
    ----------  -------  ---------------------------------------------------------------
    topic       TEXT     topic name                      } primary key
    key         TEXT     business key                    }
    seq         INTEGER  message sequence number holding the key
    deliver_at  INTEGER  its due time, epoch ms
    done_at     INTEGER  when it was delivered (NULL while pending), for the dedup window

Two tables, so that the B-tree a checkpoint inserts into stays small. Inserting a batch of
random keys into one big B-tree dirties nearly every leaf page, and each page is written once
to the WAL and once back: with 3M keys held, 100,000 new keys cost 0.6 s (BENCHMARKS.md), and
the cost grows with the index. New rows go to `recent`; once it holds about
sqrt(MERGE_SCALE x the rows of `keys`) rows (at least MERGE_MIN), checkpoints move it into `keys`
a key range of MERGE_SLICE rows at a time, each range rewriting only its own part of `keys`.
A row in `recent` is newer than a row of the same pair in `keys` (which it replaces when it
moves): lookups read both tables in one statement and take it; a release or an expiry that
deletes a row of `recent` also deletes the pair's older row in `keys`; a move replaces it.
Keys that arrive in order (growing order numbers, timestamps) need no move: a checkpoint's
stretch of keys (key order, JSON_ROWS of them) under which neither table holds a row, from its
first pair to its last, goes straight into `keys`, where it touches only the pages at that gap;
none of its pairs is held anywhere, so no older row of one can be left behind (BENCHMARKS.md).

Version history: 1 — original (`PRAGMA user_version`; `stored_version` reads it from the
file header without opening the database, so a newer index is refused before anything is
written). 2 — the table `recent` (a version-1 index is opened as it is, with `recent` empty;
version 1 refuses a version-2 index, whose newest rows it would not read).
"""

from __future__ import annotations

import bisect
import contextlib
import functools
import json
import logging
import math
import sqlite3
import sys
import threading
import time
from array import array
from collections.abc import Callable, Iterable, Sequence
from itertools import accumulate, chain, groupby, islice, repeat
from operator import itemgetter
from pathlib import Path
from typing import Any, Protocol, TypeVar

from delayd.storage import native
from delayd.storage.errors import CorruptData, UnsupportedVersion
from delayd.storage.keyfilter import KeyFilter
from delayd.storage.overlay import Overlay, Released, Rows, Run

log = logging.getLogger("delayd.storage")

KEYINDEX_VERSION = 2
SQLITE_USER_VERSION_AT = 60  # the file header's user_version: a big-endian u32 at byte 60
SQLITE_MAGIC = b"SQLite format 3\x00"
# A new index's page size: a checkpoint's write of keys costs its thread about a fifth less CPU
# a key with 16 KiB pages than with SQLite's 4 KiB (fewer pages, each its header, WAL frame and
# copy back), a lookup that finds its key (a bigger page read) about a tenth more (BENCHMARKS.md).
PAGE_SIZE = 16384


def stored_version(path: Path) -> int | None:
    """The key index version recorded in `path` (SQLite's user_version, from the file header),
    None when there is no readable database file. Reads 64 bytes; opens no connection (which
    would create -wal and -shm files)."""
    try:
        with open(path, "rb") as f:
            head = f.read(SQLITE_USER_VERSION_AT + 4)
    except FileNotFoundError:
        return None
    if len(head) < SQLITE_USER_VERSION_AT + 4 or not head.startswith(SQLITE_MAGIC):
        return None
    return int.from_bytes(head[SQLITE_USER_VERSION_AT:SQLITE_USER_VERSION_AT + 4], "big")


def connect(path: Path, cache_kib: int) -> sqlite3.Connection:
    """A connection to one of the data directory's SQLite indexes (keys, far): WAL, so a reader
    never waits for the writer; synchronous=NORMAL, so a commit is atomic, and what a power loss
    takes back is redone from the commit log (each index stores the log position it covers).
    A new database gets PAGE_SIZE pages (an existing one keeps its own: SQLite reads either)."""
    db = sqlite3.connect(path, isolation_level="DEFERRED", check_same_thread=False)
    try:  # not a database: nothing is left open
        db.execute(f"PRAGMA page_size={PAGE_SIZE}")  # (before WAL: the first write fixes it)
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=NORMAL")
        db.execute(f"PRAGMA cache_size=-{cache_kib}")
    except BaseException:
        db.close()
        raise
    return db


def sqlite_bytes(path: Path) -> int:
    """Bytes of the SQLite database at `path` with its -wal and -shm files (one that SQLite
    removes between the listing and its stat counts nothing)."""
    total = 0
    for p in path.parent.glob(path.name + "*"):
        with contextlib.suppress(FileNotFoundError):
            total += p.stat().st_size
    return total


def write_commit_pos(w: sqlite3.Connection, commit_pos: int, written: int | None) -> int:
    """Commit the writer's transaction with `commit_pos` recorded, and return it. Not written
    again when it is the one written last (`written`): an idle daemon's checkpoint (every
    second) changes no page then, and SQLite appends nothing to the write-ahead log (it wrote
    a 16 KiB page a second to each index's)."""
    if commit_pos != written:
        w.execute("INSERT OR REPLACE INTO meta (name, value) VALUES ('commit_pos', ?)", (commit_pos,))
    w.commit()
    return commit_pos


class SqliteIndex(Protocol):
    def count(self) -> int: ...
    def close(self) -> None: ...


Index = TypeVar("Index", bound=SqliteIndex)


def open_or_set_aside(path: Path, make: Callable[[Path], Index], what: str) -> tuple[Index, bool]:
    """The SQLite index at `path` (one of the data directory's, derived from the commit log),
    read through with a count; or, when it is unusable, a new empty one after the damaged
    files are closed and renamed `<name>.bad-<time>.sqlite`; and whether it was set aside."""
    index = None
    try:
        index = make(path)
        index.count()
        return index, False
    except (sqlite3.DatabaseError, CorruptData) as e:
        if index is not None:
            index.close()
        log.warning("%s unusable (%s); rebuilding it from the commit log", what, e)
        bad = f"{path.name.removesuffix('.sqlite')}.bad-{int(time.time())}.sqlite"
        for p in path.parent.glob(path.name + "*"):
            p.rename(p.with_name(p.name.replace(path.name, bad)))
        return make(path), True


def key_order(runs: list[tuple[Any, ...]], text: bool = False) -> Any:
    """The order in which `apply` writes the keys of consecutive put_runs, each run a tuple
    (topic, keys, ...): by topic, then key, in UTF-8 byte order (SQLite's BINARY collation, the
    primary key's order), keys of one pair in their given order, None (no key) left out; as
    each key's place among all the runs' keys laid end to end (None counted), an array('Q')'s
    bytes. Inserted in key order, a checkpoint's keys walk the B-tree once instead of touching
    a random page each (BENCHMARKS.md). With `text`: (that order, the keys' UTF-8 laid end to
    end in that order, and the bounds of each key in it: n + 1 u64s, key i is
    text[bounds[i]:bounds[i + 1]]), which `key_rows_json` reads instead of the strs. The
    reference of the compiled `key_order` (storage/batch_keyrows.c), which sorts and copies the
    keys without holding the GIL: the event loop must not wait for a checkpoint's sort."""
    if not isinstance(runs, list):
        raise TypeError("runs: expected a list")
    found = []
    place = 0
    for r, run in enumerate(runs):
        check_run(r, run, first_seq=False)
        topic, keys = run[0], run[1]
        t = topic.encode()
        for i, key in enumerate(keys):
            if key is not None:
                if not isinstance(key, str):
                    raise TypeError(f"run {r}, key {i}: expected a str or None")
                found.append((t, key.encode(), place + i))
        place += len(keys)
    found.sort()
    order = array("Q", [code for _, _, code in found]).tobytes()
    if not text:
        return order
    return order, b"".join(k for _, k, _ in found), array("Q", accumulate((len(k) for _, k, _ in found), initial=0)).tobytes()


I64_MAX = (1 << 63) - 1


def check_run(r: int, run: Any, first_seq: bool) -> None:
    """The shape `key_order` and `key_rows_json` take a run in: a tuple (topic, keys, ...), with
    `first_seq` (topic, keys, first_seq, ...) and the run's seqs within an i64."""
    if not isinstance(run, tuple) or len(run) < 2 + first_seq:
        raise TypeError(f"run {r}: expected a tuple (topic, keys, {'first_seq, ' * first_seq}...)")
    if not isinstance(run[0], str):
        raise TypeError(f"run {r}: topic must be a str")
    if not isinstance(run[1], (list, tuple)):
        raise TypeError(f"run {r}: keys must be a list or a tuple")
    if first_seq:
        if not isinstance(run[2], int):
            raise TypeError(f"run {r}: first_seq must be an int")
        if not 0 <= run[2] <= I64_MAX - len(run[1]):
            raise ValueError(f"run {r}: sequence numbers out of range")


def key_rows_json(runs: list[tuple[Any, ...]], order: bytes, dues: Any, limit: int, text: Any,
                  bounds: Any) -> tuple[list[tuple[str, str, bytes]], bytes]:
    """The rows `apply` writes for consecutive put_runs, each run a tuple (topic, keys,
    first_seq, ...) whose message `first_seq + i` holds `keys[i]`, for the places `order` names
    (key_order's, or a stretch of them), whose keys' UTF-8 is in `text` as `bounds` says
    (key_order's with `text`, cut to the stretch: row j's key is text[bounds[j]:bounds[j + 1]],
    one bound more than rows), with `dues` (each key's due time laid end to end as
    i64, None counted), as `PUT_JSON` reads them: chunks of at most `limit` rows of one topic,
    each (topic, keys, numbers) where `keys` is the JSON array of the keys (json.dumps, compact,
    not ASCII-escaped) that SQLite's json_each walks, and `numbers` the row's seq and deliver_at
    in fixed-width decimal, NUMBER_DIGITS ASCII bytes each (b"%020d"), that row i finds at
    2 x NUMBER_DIGITS x i with substr. A key holding a NUL is left out (SQLite's JSON functions
    cut a string at it) and its place returned, as u64s, for `put_rows` to bind. Of the runs only
    the topics, first seqs and sizes are read, never a key: a checkpoint's keys can be written
    a stretch at a time, and the compiled `key_rows_json` (storage/batch_keyrows.c), of which this
    is the reference, makes every row without the GIL: the checkpoint's thread holds it for the
    runs and the result only, instead of binding four parameters a key (or reading a str a key),
    and the event loop does not wait for it (BENCHMARKS.md)."""
    if not isinstance(limit, int):
        raise TypeError("limit: expected an int")
    if not isinstance(runs, list):
        raise TypeError("runs: expected a list")
    starts: list[int] = []
    total = 0
    for r, run in enumerate(runs):
        check_run(r, run, first_seq=True)
        run[0].encode()  # not encodable (a lone surrogate): UnicodeEncodeError
        starts.append(total)
        total += len(run[1])
    due = memoryview(dues).cast("B")
    if len(due) != 8 * total:
        raise ValueError(f"dues: {len(due)} bytes for {total} keys")
    due_at = array("q")
    due_at.frombytes(due)
    view = memoryview(order).cast("B")
    if len(view) % 8:
        raise ValueError("order: not a whole number of u64s")
    places = array("Q")
    places.frombytes(view)
    if limit < 1:
        raise ValueError("limit: at least one row a chunk")
    keys_text = memoryview(text).cast("B")
    view = memoryview(bounds).cast("B")
    if len(view) != 8 * (len(places) + 1):
        raise ValueError(f"bounds: {len(view)} bytes for {len(places)} rows")
    at = array("Q")
    at.frombytes(view)
    named: list[tuple[int, bytes, int]] = []  # (run, key, place): every row checked before any is written
    rest: list[int] = []
    for j, place in enumerate(places):
        if place >= total:
            raise ValueError(f"order: place {place} names no key")
        if at[j] > at[j + 1] or at[j + 1] > len(keys_text):
            raise ValueError(f"bounds: row {j} out of order or past the text")
        key = bytes(keys_text[at[j]:at[j + 1]])
        if b"\0" in key:
            rest.append(place)
        else:
            named.append((bisect.bisect_right(starts, place) - 1, key, place))
    chunks: list[tuple[str, str, bytes]] = []
    rows: list[str] = []
    numbers = bytearray()
    at_topic = ""
    for r, key, place in named:
        topic, first_seq = runs[r][0], runs[r][2]
        if rows and (topic != at_topic or len(rows) == limit):
            chunks.append((at_topic, json.dumps(rows, separators=(",", ":"), ensure_ascii=False), bytes(numbers)))
            rows, numbers = [], bytearray()
        at_topic = topic
        rows.append(key.decode())  # (not UTF-8: UnicodeDecodeError)
        numbers += b"%020d%020d" % (first_seq + place - starts[r], due_at[place])
    if rows:
        chunks.append((at_topic, json.dumps(rows, separators=(",", ":"), ensure_ascii=False), bytes(numbers)))
    return chunks, array("Q", rest).tobytes()


_compiled = native.compiled()
ops: Any = _compiled if _compiled is not None else sys.modules[__name__]

Op = tuple[str, Any]
TABLES = ("recent", "keys")  # the newer first
DELIVERED = "UPDATE {table} SET done_at=? WHERE topic=? AND key=? AND seq=?"
PUT = "INSERT OR REPLACE INTO recent (topic, key, seq, deliver_at, done_at) VALUES "
PUT_ROW = "(?, ?, ?, ?, NULL)"
# Parameters one INSERT of many rows carries at most (under the 999 of SQLite before 3.32).
# Python's sqlite3 gives the GIL up and takes it back around every step, and an executemany
# steps once a row; a statement of many rows is one step: half the CPU a row, and a handful of
# switches with the event loop's thread instead of one a row (BENCHMARKS.md).
INSERT_PARAMS = 800


@functools.cache
def _insert_sql(head: str, row: str, rows: int) -> str:
    return head + ", ".join([row] * rows)


def insert_rows(db: sqlite3.Connection, head: str, row: str, width: int, rows: Iterable[tuple[Any, ...]]) -> None:
    """`head` + VALUES `row` (`width` parameters) for every row, in their order, as few statements
    as INSERT_PARAMS allows: a later row of a primary key replaces an earlier one (SQLite inserts a
    statement's rows in order) as it would in an executemany. How storage.farindex writes its rows,
    and the key index those `key_rows_json` leaves to binding."""
    flat = chain.from_iterable(rows)  # no Python code a row: C iterators
    per = max(1, INSERT_PARAMS // width) * width
    while params := list(islice(flat, per)):
        db.execute(_insert_sql(head, row, len(params) // width), params)


# The same rows from a chunk of `key_rows_json` (topic, keys, numbers): json_each walks the keys'
# JSON array (`key` is an element's index, `value` its string) and each row's two numbers are cut
# from fixed places of the ASCII digits (substr of a BLOB is by byte, no walk). SQLite makes the rows
# in one step, with the GIL let go, where binding four parameters a row holds it; and where three
# json_extract of a [key, seq, deliver_at] element parse it three times, this costs half the CPU a
# key (BENCHMARKS.md). json_each keeps the array's order: a later row of a key still replaces an
# earlier one.
NUMBER_DIGITS = 20  # b"%020d": any i64, "-9223372036854775808" included
PUT_JSON = ("INSERT OR REPLACE INTO recent (topic, key, seq, deliver_at, done_at) SELECT ?1, value, "
            f"CAST(substr(?3, 1 + {2 * NUMBER_DIGITS} * key, {NUMBER_DIGITS}) AS INTEGER), "
            f"CAST(substr(?3, {1 + NUMBER_DIGITS} + {2 * NUMBER_DIGITS} * key, {NUMBER_DIGITS}) AS INTEGER), "
            "NULL FROM json_each(?2)")
JSON_ROWS = 8192  # rows a PUT_JSON statement (a key's text and 40 bytes of digits a row)
PUT_GAP_JSON = PUT_JSON.replace("INTO recent", "INTO keys")
# Whether either table holds a pair from (?1, ?2) to (?3, ?4): a search of each primary key.
IN_GAP = "SELECT " + " OR ".join(f"EXISTS (SELECT 1 FROM {t} WHERE (topic, key) BETWEEN (?1, ?2) AND (?3, ?4))" for t in TABLES)


def has_json(db: sqlite3.Connection) -> bool:
    """Whether this SQLite has json_each (built in since 3.38, an extension before)."""
    try:
        return db.execute("""SELECT key, value FROM json_each('["k"]')""").fetchone() == (0, "k")
    except sqlite3.OperationalError:
        return False


def put_rows(db: sqlite3.Connection, rows: Iterable[tuple[str, str | None, int, int]]) -> None:
    """Write (topic, key, seq, deliver_at) rows: the message `seq` holds the key."""
    insert_rows(db, PUT, PUT_ROW, 4, rows)


def delivery_order(rows: list[tuple[int, str, str, int]]) -> list[tuple[int, str, str, int]]:
    """Delivered rows (done_at, topic, key, seq) in (topic, key) order, the primary key's (the
    compiled `key_order` sorts them without holding the GIL): in the order messages come due their
    keys are random, and their updates would touch a random page each; in key order they walk the
    B-tree once (100,000 into 1M random keys: 40 % less CPU, BENCHMARKS.md). Each row updates only
    its own message's row, so the order changes nothing else."""
    if len(rows) < 2:
        return rows
    runs, flat = [], []
    for topic, group in groupby(rows, itemgetter(1)):
        part = list(group)
        runs.append((topic, [r[2] for r in part]))
        flat.extend(part)
    return [flat[p] for p in array("Q", ops.key_order(runs))]


def put_delivered(db: sqlite3.Connection, done_at: int, topic: str, keys: Sequence[str | None], seqs: bytes) -> None:
    """Write `delivered_keys`' rows: message seqs[i] (u64s) holding keys[i] was delivered at
    `done_at`. In key order, as `delivery_order`; the rows made by C-level iterators (no Python
    code a row, no str a key before the writer's thread)."""
    order, seq = memoryview(ops.key_order([(topic, keys)])).cast("Q"), memoryview(seqs).cast("Q")
    for table in TABLES:
        db.executemany(DELIVERED.format(table=table), zip(repeat(done_at), repeat(topic), map(keys.__getitem__, order),
                                                          map(seq.__getitem__, order), strict=False))


# Keys a chunk of a filter's build. Each chunk takes the GIL back twice (after SQLite's step and
# after the filter's pass), and beside an event loop busy with Python each time waits out a switch
# interval (5 ms): a build of 300,000 keys took 3.3 µs a key in chunks of 4,096, 1.4 in chunks of
# 16,384, 0.9 in chunks of 65,536 (BENCHMARKS.md, twenty-eighth session).
SCAN_CHUNK = 16384
# A chunk of a topic's keys in key order as the bytes of one JSON array: the first chunk (`after`
# empty), then those after ?2 (a search of the primary key: an OR with "?2 IS NULL" made it read the
# topic from its first key for every chunk). The last key comes from the filter's pass
# (`KeyFilter.add_json`): max(key) beside the array cost SQLite a third more a key.
SCAN_JSON = ("SELECT CAST(json_group_array(key) AS BLOB) FROM (SELECT key FROM {table} WHERE topic = ?1{after} "
             "ORDER BY key LIMIT {n})")


def key_chunk(db: sqlite3.Connection, table: str, topic: str, after: str | None) -> bytes:
    """The next SCAN_CHUNK keys of `topic` in `table` after `after` (None: from its first), in key
    order, as the bytes of one JSON array (fewer at the end; b"[]" past it), for
    `KeyFilter.add_json`, which reads it without a str a key and sets the bits without the GIL. A
    chunk is one statement's step: Python's sqlite3 gives the GIL up and takes it back around every
    step, and read a row at a time (`scan_keys`) a build waits for the GIL again after every key
    while the event loop is busy. Beside a thread running Python without a pause, a build read
    that way took 60 µs a key and kept the other thread off its CPU 1.1 µs a key; as JSON, 2.3 µs
    and 0.15 (`bench.keyindex_gil --scan`, BENCHMARKS.md, twenty-sixth session; idle, 0.45 µs a
    key either way), and since the twenty-eighth session 1.4-1.6 µs and 0.02-0.05."""
    sql = SCAN_JSON.format(table=table, n=SCAN_CHUNK, after="" if after is None else " AND key > ?2")
    chunk: bytes = db.execute(sql, (topic,) if after is None else (topic, after)).fetchone()[0]
    return chunk


def scan_keys(db: sqlite3.Connection, table: str, topic: str) -> Iterable[list[str]]:
    """Every key of `topic` in `table`, a row at a time, SCAN_CHUNK keys a list (within the caller's
    transaction): where SQLite has no JSON functions (`key_chunk`). One-column rows cost half of
    what (topic, key) rows do."""
    cur = db.execute(f"SELECT key FROM {table} WHERE topic = ?", (topic,))
    while rows := cur.fetchmany(SCAN_CHUNK):
        yield [r[0] for r in rows]


def table_rows(db: sqlite3.Connection) -> list[int]:
    """The rows of each of TABLES, in their order."""
    return [int(db.execute(f"SELECT count(*) FROM {t}").fetchone()[0]) for t in TABLES]


# `recent` moves into `keys` once it holds max(MERGE_MIN, isqrt(MERGE_SCALE * rows of keys)) rows,
# MERGE_SLICE rows (a key range) a checkpoint. A checkpoint of B random keys into `recent` of R
# rows rewrites pages in proportion to R, a move of R rows into `keys` of K rows in proportion to
# K: per key about R / 2B + K / R (R grows from 0), least near R = sqrt(2BK); MERGE_SCALE is 2B
# for B = 100,000 keys a checkpoint.
MERGE_MIN = 1 << 18
MERGE_SCALE = 200_000
MERGE_SLICE = 1 << 18
# A filter is built for GROWTH times the keys it starts with, and built again when it has taken
# that many: each build scans every key of the index (0.6-1 µs a key), so a key is scanned about
# 1 / (GROWTH - 1) times over its life; past 4M keys of capacity the filter costs
# BITS_PER_KEY * GROWTH bits a held key right after a build (storage.keyfilter `filter_bits`).
GROWTH = 3
CATCH_UP_PASSES = 3  # a build's passes over the keys recorded while it ran (FilterBuild)


class FilterBuild:
    """A key filter being built in a thread: `scan` reads every (topic, key) of the index in one
    read transaction (one snapshot) into a new filter, while `recorded` collects, on the event
    loop, the keys the overlay held when the build began and every key put since. The filter
    `KeyIndex` installs is the scan's plus the recorded keys: a key the index holds at any later
    moment was either in the snapshot, or put after the build began, or in the overlay then
    (a put reaches the database only after its overlay entry exists, and leaves the overlay only
    once the database holds it), so the filter lacks none of them. Once its scan is done, the
    thread adds the keys recorded so far itself (`caught_up` of them; a produce's packed keys
    without the GIL), and the install adds only those recorded after: adding 100,000 recorded
    keys cost the event loop 2-3 ms (BENCHMARKS.md)."""

    def __init__(self, path: Path, recorded: list[tuple[str, Sequence[str | None]]], as_json: bool) -> None:
        self.path = path
        self.recorded = recorded
        self.as_json = as_json  # read the keys as JSON (`key_chunk`): where SQLite has json_group_array
        self.caught_up = 0  # recorded[:caught_up] are in `result`
        self.result: KeyFilter | None = None
        self.failed = False
        self.stop = False
        self.thread: threading.Thread | None = None

    @property
    def done(self) -> bool:
        return self.result is not None or self.failed

    def start(self) -> None:
        self.thread = threading.Thread(target=self.scan, name="delayd-keyfilter", daemon=True)
        self.thread.start()

    def scan(self) -> None:
        try:
            db = connect(self.path, 2048)
        except sqlite3.Error as e:
            log.warning("key filter not built (%s); every key is looked up in the index", e)
            self.failed = True
            return
        try:
            db.execute("BEGIN")
            n = sum(table_rows(db))
            f = KeyFilter(GROWTH * (n + sum(len(keys) for _, keys in self.recorded)))
            for table in TABLES:
                for (topic,) in db.execute(f"SELECT DISTINCT topic FROM {table}").fetchall():
                    if not self.as_json:
                        for keys in scan_keys(db, table, topic):
                            if self.stop:
                                return
                            f.add(topic, keys)
                        continue
                    added, last = SCAN_CHUNK, None
                    while added == SCAN_CHUNK:  # (fewer: the topic's last chunk)
                        if self.stop:
                            return
                        added, last = f.add_json(topic, key_chunk(db, table, topic, last))
            for _ in range(CATCH_UP_PASSES):  # again for those recorded meanwhile (a list only grows)
                upto = len(self.recorded)
                for recorded_topic, recorded_keys in self.recorded[self.caught_up:upto]:
                    f.add(recorded_topic, recorded_keys, alone=True)
                self.caught_up = upto
            self.result = f
        except Exception as e:  # a damaged index: lookups stay correct without the filter
            log.warning("key filter not built (%s); every key is looked up in the index", e)
            self.failed = True
        finally:
            db.rollback()
            db.close()

    def cancel(self) -> None:
        self.stop = True
        if self.thread is not None:
            self.thread.join()


class KeyIndex:
    """Reads answer at once; writes are queued and applied in one transaction per checkpoint.

    Produce must not wait for B-tree writes, so `put_many`, `release`, `delivered` and
    `expire` only queue an operation and update an overlay that lookups consult first.
    `take_ops` (event-loop thread) hands the queue to `apply` (a worker thread, on its own
    connection: SQLite does the B-tree work without the GIL) and moves the overlay aside;
    `applied` drops it once the database answers for it, or `requeue` puts the operations
    back if the write failed. The overlay holds at most one or two checkpoint intervals.
    """

    def __init__(self, path: Path, cache_kib: int = 16384) -> None:
        self.path = Path(path)
        self.created = not self.path.exists()
        self.db = self._connect(cache_kib)
        try:  # a newer or damaged file: nothing is left open
            empty = self._prepare()
        except BaseException:
            self.db.close()
            raise
        self.writer = self._connect(cache_kib)
        self.json_rows = has_json(self.writer)  # `_put_runs` writes keys as JSON text, a build reads them so
        # Rows of `recent` and of `keys` (counted by the first `apply`, then kept: an estimate,
        # a replaced row counted as new), and where the move of `recent` into `keys` is (the
        # pair the next slice starts at; None: no move under way).
        self._rows: list[int] | None = None
        self._pos_written: int | None = None  # the commit_pos `apply` last wrote (None: not known)
        self._merge_from: tuple[str, str] | None = None
        self._ops: list[Op] = []
        self._queued = 0  # keys put in `_ops`
        self._writing = 0  # keys put in the operations `apply` is writing
        # `_flushing` is the part being written by `apply`, `_current` what came after.
        self._current = Overlay()
        self._flushing = Overlay()
        # Keys that may be held (storage.keyfilter): None until the first build is done, then
        # every put adds to it; built again in a thread (`_build`) when it fills up.
        self._filter: KeyFilter | None = None
        self._build: FilterBuild | None = None
        if empty:
            self._filter = KeyFilter(0)
        else:
            self._start_build()

    def _connect(self, cache_kib: int) -> sqlite3.Connection:
        return connect(self.path, cache_kib)

    def _prepare(self) -> bool:
        """Refuse a newer index, create the tables if missing; whether the index is empty."""
        version = self.db.execute("PRAGMA user_version").fetchone()[0]
        if version > KEYINDEX_VERSION:
            raise UnsupportedVersion(str(self.path), version, KEYINDEX_VERSION)
        for table in TABLES:  # (the same columns and index each)
            self.db.execute(f"CREATE TABLE IF NOT EXISTS {table} (topic TEXT NOT NULL, key TEXT NOT NULL, "
                            "seq INTEGER NOT NULL, deliver_at INTEGER NOT NULL, done_at INTEGER, "
                            "PRIMARY KEY (topic, key)) WITHOUT ROWID")
            self.db.execute(f"CREATE INDEX IF NOT EXISTS {table}_done ON {table}(done_at) WHERE done_at IS NOT NULL")
        self.db.execute("CREATE TABLE IF NOT EXISTS meta (name TEXT PRIMARY KEY, value INTEGER) WITHOUT ROWID")
        self.db.execute(f"PRAGMA user_version={KEYINDEX_VERSION}")
        self.db.commit()
        if version != KEYINDEX_VERSION:  # the file's header too (`stored_version`), not only the WAL
            self.db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        return all(self.db.execute(f"SELECT 1 FROM {t} LIMIT 1").fetchone() is None for t in TABLES)

    @property
    def commit_pos(self) -> int:
        row = self.db.execute("SELECT value FROM meta WHERE name='commit_pos'").fetchone()
        return int(row[0]) if row else 0

    # -- reads ----------------------------------------------------------------------------------
    def lookup(self, topic: str, key: str) -> tuple[int, int, int | None] | None:
        """(seq, deliver_at, done_at) of the message holding `key`, or None."""
        return self.lookup_many(topic, [key]).get(key)

    def lookup_many(self, topic: str, keys: Sequence[str]) -> dict[str, tuple[int, int, int | None]]:
        """(seq, deliver_at, done_at) of the messages holding `keys`, by key."""
        return self._lookup(topic, keys, False)[0]

    def claim_many(self, topic: str, keys: Sequence[str]) -> tuple[dict[str, tuple[int, int, int | None]], list[str] | None]:
        """lookup_many for a produce's keys, to be put by the put_run that follows at once (told
        so by its `claimed`): the filter takes them in the same pass that asks it
        (`KeyFilter.claim`; a key claimed and then not put only leaves the filter a little
        fuller). Also the keys the filter could not rule out (None while there is no filter):
        each key is asked just before it is added, so the second of two equal keys is always one
        of them, and a key that repeats in `keys` is among them."""
        return self._lookup(topic, keys, True)

    def _lookup(self, topic: str, keys: Sequence[str], claim: bool) -> tuple[dict[str, tuple[int, int, int | None]], list[str] | None]:
        out: dict[str, tuple[int, int, int | None]] = {}
        self._install_finished()
        maybe = None
        if claim:
            maybe = self._added(topic, keys, claim=True)[0]
            keys = maybe if maybe is not None else keys
        elif self._filter is not None:
            keys = self._filter.maybe(topic, keys)  # usually none: new keys
        if not keys:
            return out, maybe
        ask = list(keys)  # (without a filter, a produce's Keys: every key, made a str here)
        for overlay in (self._current, self._flushing):  # the newer first
            hits = overlay.find(topic, ask) if ask and overlay else {}  # usually none: new keys
            if hits:
                for k, held in hits.items():
                    if held is not None:  # None: released
                        out[k] = (*held, None)
                ask = [k for k in ask if k not in hits]
        for i in range(0, len(ask), 450):  # under SQLite's bound-parameter limit (999 before 3.32)
            part = ask[i:i + 450]
            marks = ",".join("?" * len(part))
            older = []  # both tables in one statement (one snapshot: a move cannot fall between them)
            for k, seq, deliver_at, done_at, new in self.db.execute(
                    f"SELECT key, seq, deliver_at, done_at, 1 FROM recent WHERE topic=? AND key IN ({marks}) UNION ALL "
                    f"SELECT key, seq, deliver_at, done_at, 0 FROM keys WHERE topic=? AND key IN ({marks})",
                    [topic, *part, topic, *part]):
                row = (int(seq), int(deliver_at), done_at)
                if new:
                    out[k] = row
                else:
                    older.append((k, row))
            for k, row in older:
                out.setdefault(k, row)  # (a row of `recent` is the newer)
        return out, maybe

    # -- writes (queued) ------------------------------------------------------------------------
    def put_many(self, rows: list[tuple[str, str, int, int]]) -> None:
        """(topic, key, seq, deliver_at): the message `seq` now holds the key."""
        if not rows:
            return
        self._ops.append(("put", rows))
        self._queued += len(rows)
        for topic, group in groupby(rows, itemgetter(0)):
            entry = Rows(topic, list(group))
            self._added(topic, entry.keys)
            self._current.put(entry)

    def put_run(self, topic: str, keys: Sequence[str | None], first_seq: int, dues: Sequence[int],
                claimed: int | None = None) -> None:
        """put_many for consecutive messages of one topic: message `first_seq + i` holds
        `keys[i]` (None: it has no key), due `dues[i]`. The rows are built by `apply`, in the
        worker thread. Neither sequence may change afterwards. `claimed`: the keys were claimed
        by a claim_many with no other put between (a put may start a filter build, which would
        not know them); how many of them are not None."""
        if len(keys) != len(dues):
            raise ValueError(f"{len(keys)} keys, {len(dues)} due times")
        self._ops.append(("run", (topic, keys, first_seq, dues)))
        named = claimed if claimed is not None else self._added(topic, keys)[1]
        self._queued += named if named is not None else len(keys) - keys.count(None)
        self._current.put(Run(topic, keys, first_seq, dues))  # one object for the batch, no object a key

    # -- the key filter -------------------------------------------------------------------------
    def _added(self, topic: str, keys: Sequence[str | None], claim: bool = False) -> tuple[list[str] | None, int | None]:
        """`keys` of `topic` are (about to be) in the overlay: the filter must know them. With
        `claim`, the keys the filter may have held before (None without a filter); and how many
        of them are keys (not None), when the filter counted them."""
        self._install_finished()  # here too: a follower only puts, and the recorded keys would pile up
        f = self._filter
        maybe = named = None
        if f is not None:
            if claim:
                maybe, named = f.claim(topic, keys)
            else:
                named = f.add(topic, keys)
            if f.full and self._build is None:
                self._start_build()
        if self._build is not None:
            self._build.recorded.append((topic, keys))
        return maybe, named

    def _start_build(self) -> None:
        recorded: list[tuple[str, Sequence[str | None]]] = [*self._current.keys(), *self._flushing.keys()]
        self._build = FilterBuild(self.path, recorded, self.json_rows)
        self._build.start()

    def _install_finished(self) -> None:
        """Install the filter a finished build made (a failed build is dropped: lookups go on
        without a filter)."""
        b = self._build
        if b is None or not b.done:
            return
        self._build = None
        if b.result is not None:
            for topic, keys in b.recorded[b.caught_up:]:  # (the build's thread added the others)
                b.result.add(topic, keys)
            self._filter = b.result
            if b.result.full:  # filled while it was built: again, bigger
                self._start_build()

    @property
    def filter_ready(self) -> bool:
        """Whether lookups consult a complete filter (installing a finished build first)."""
        self._install_finished()
        return self._filter is not None

    def release(self, topic: str, key: str, seq: int) -> None:
        """The key is free again (its message was cancelled)."""
        self._ops.append(("release", (topic, key, seq)))
        hits = self._current.find(topic, [key]) or self._flushing.find(topic, [key])
        held = hits.get(key)
        if held is None or held[0] == seq:  # (not in the overlay, released, or held by `seq`)
            self._current.put(Released(topic, key))

    def delivered(self, rows: list[tuple[int, str, str, int]]) -> None:
        """(done_at, topic, key, seq): the message was delivered; the key stays taken for the
        dedup window (until `expire`)."""
        if rows:
            self._ops.append(("delivered", rows))

    def delivered_keys(self, done_at: int, topic: str, keys: Sequence[str | None], seqs: bytes) -> None:
        """`delivered` for messages of one topic delivered at `done_at`: message seqs[i] (u64s)
        holds keys[i] (None: it has none). `keys` as storage.batch `record_keys` gives them (the
        compiled one: packed, no str a key); the writer takes the rows from them in key order."""
        if len(keys) != keys.count(None):
            self._ops.append(("delivered_keys", (done_at, topic, keys, seqs)))

    def expire(self, before_ms: int) -> None:
        """Forget keys of messages delivered before `before_ms` (outside the dedup window)."""
        self._ops.append(("expire", before_ms))

    def take_ops(self) -> list[Op]:
        """Hand the queued operations to `apply`; the overlay moves aside until `applied`."""
        ops, self._ops = self._ops, []
        self._writing, self._queued = self._writing + self._queued, 0
        if self._flushing:  # an earlier write failed and was requeued: keep its entries too
            self._flushing.absorb(self._current)
        else:
            self._flushing = self._current
        self._current = Overlay()
        return ops

    def requeue(self, ops: list[Op]) -> None:
        """`apply` failed: the operations go back in front, to be written next time."""
        self._ops[:0] = ops
        self._queued, self._writing = self._queued + self._writing, 0

    def apply(self, ops: list[Op], commit_pos: int) -> None:
        """Write queued operations and the log position they cover, atomically. Runs on the
        writer connection; safe in a worker thread while the event loop keeps reading."""
        w = self.writer
        if self._rows is None:
            self._rows = table_rows(w)
        rows = list(self._rows)  # (kept only once the transaction commits)
        runs: list[tuple[str, Sequence[str | None], int, Sequence[int]]] = []  # consecutive runs
        for kind, arg in ops:
            if kind == "run":
                runs.append(arg)
                rows[0] += len(arg[1]) - arg[1].count(None)
                continue
            self._put_runs(runs, rows)  # before what comes after them
            runs = []
            if kind == "put":
                put_rows(w, arg)
                rows[0] += len(arg)
            elif kind == "release":
                if w.execute("DELETE FROM recent WHERE topic=? AND key=? AND seq=?", arg).rowcount:
                    w.execute("DELETE FROM keys WHERE topic=? AND key=? AND seq<?", arg)  # the older row it replaced
                else:
                    w.execute("DELETE FROM keys WHERE topic=? AND key=? AND seq=?", arg)
            elif kind == "delivered":
                arg = delivery_order(arg)
                for table in TABLES:
                    w.executemany(DELIVERED.format(table=table), arg)
            elif kind == "delivered_keys":
                put_delivered(w, *arg)
            elif kind == "expire":  # (a pair's older row in `keys` goes with its row in `recent`)
                rows[1] -= w.execute("DELETE FROM keys WHERE (topic, key) IN (SELECT topic, key FROM recent "
                                     "WHERE done_at IS NOT NULL AND done_at < ?)", (arg,)).rowcount
                for i, table in enumerate(TABLES):
                    rows[i] -= w.execute(f"DELETE FROM {table} WHERE done_at IS NOT NULL AND done_at < ?", (arg,)).rowcount
        self._put_runs(runs, rows)
        merge_from = self._merge(rows)
        self._pos_written = write_commit_pos(w, commit_pos, self._pos_written)
        self._rows, self._merge_from = rows, merge_from

    def _merge(self, rows: list[int]) -> tuple[str, str] | None:
        """Move the next slice of `recent` into `keys` when a move is under way or due (the
        module's docstring): the rows of a key range, MERGE_SLICE of them, each replacing the
        older row of its pair. Where the next slice starts (None: the move is over)."""
        start = self._merge_from
        if start is None:
            if rows[0] < max(MERGE_MIN, math.isqrt(MERGE_SCALE * max(rows[1], 0))):
                return None
            start = ("", "")  # (every pair sorts at or after it)
        w = self.writer
        end = w.execute("SELECT topic, key FROM recent WHERE (topic, key) >= (?, ?) ORDER BY topic, key "
                        "LIMIT 1 OFFSET ?", (*start, MERGE_SLICE)).fetchone()
        where, args = ("(topic, key) >= (?, ?) AND (topic, key) < (?, ?)", (*start, *end)) if end else \
            ("(topic, key) >= (?, ?)", start)
        w.execute("INSERT OR REPLACE INTO keys (topic, key, seq, deliver_at, done_at) "
                  f"SELECT topic, key, seq, deliver_at, done_at FROM recent WHERE {where}", args)
        moved = w.execute(f"DELETE FROM recent WHERE {where}", args).rowcount
        rows[0] -= moved
        rows[1] += moved
        return (str(end[0]), str(end[1])) if end else None

    def _put_runs(self, runs: list[tuple[str, Sequence[str | None], int, Sequence[int]]], rows: list[int]) -> None:
        """Write the keys of consecutive runs in key order (`key_order`, which also lays their
        UTF-8 out in that order): as JSON text that SQLite's json_each reads (`key_rows_json`,
        made from that text without the GIL; SQLite then steps
        through a chunk of rows with the GIL let go), and the keys that cannot go that way
        (a NUL; every key where SQLite has no JSON functions) as bound parameters, taken from
        the runs laid end to end by C-level iterators (no Python code per row). Into `recent`,
        counted in `rows` (`apply`'s), except a stretch of keys that falls in a gap of both
        tables (`_in_gap`): it goes straight into `keys` and is moved from `rows[0]` to `rows[1]`."""
        if not runs:
            return
        order, text, bounds = ops.key_order(runs, True) if self.json_rows else (ops.key_order(runs), b"", b"")
        dues = array("q")
        for run in runs:
            d = run[3]
            if isinstance(d, (array, memoryview)) and d.itemsize == 8:
                dues.frombytes(memoryview(d).cast("B"))
            else:
                dues.extend(d)
        if self.json_rows:  # a stretch of JSON_ROWS keys at a time: one statement's text in memory
            rest = []
            starts = list(accumulate((len(run[1]) for run in runs[:-1]), initial=0))
            for i in range(0, len(order), 8 * JSON_ROWS):
                stretch, at = order[i:i + 8 * JSON_ROWS], bounds[i:i + 8 * JSON_ROWS + 8]
                chunks, nul = ops.key_rows_json(runs, stretch, dues, JSON_ROWS, text, at)
                gap = self._in_gap(runs, starts, stretch, text, at)
                for chunk in chunks:
                    self.writer.execute(PUT_GAP_JSON if gap else PUT_JSON, chunk)
                if gap:
                    moved = (len(stretch) - len(nul)) // 8
                    rows[0] -= moved
                    rows[1] += moved
                rest.append(nul)
            order = b"".join(rest)
            if not order:
                return
        at = array("Q", order)
        keys = list(chain.from_iterable(run[1] for run in runs))
        seqs = array("q", chain.from_iterable(range(run[2], run[2] + len(run[1])) for run in runs))
        topics = list(chain.from_iterable(repeat(run[0], len(run[1])) for run in runs))
        put_rows(self.writer, zip(map(topics.__getitem__, at), map(keys.__getitem__, at),
                                  map(seqs.__getitem__, at), map(dues.__getitem__, at), strict=True))

    def _in_gap(self, runs: list[tuple[str, Sequence[str | None], int, Sequence[int]]], starts: list[int],
                stretch: bytes, text: bytes, bounds: bytes) -> bool:
        """Whether no row of either table sorts between the first and the last pair of a stretch
        of `key_order` (its places, and its bounds into `text`): then none of its pairs is held,
        and its rows can go straight into `keys` (the module's docstring)."""
        places, at = memoryview(stretch).cast("Q"), memoryview(bounds).cast("Q")  # (two numbers of each read)
        first, last = (runs[bisect.bisect_right(starts, places[j]) - 1][0] for j in (0, -1))
        pairs = (first, str(text[at[0]:at[1]], "utf-8"), last, str(text[at[-2]:at[-1]], "utf-8"))
        return not self.writer.execute(IN_GAP, pairs).fetchone()[0]

    def applied(self) -> None:
        """The database now holds what `take_ops` handed out: drop that part of the overlay."""
        self._flushing = Overlay()
        self._writing = 0

    @property
    def unwritten(self) -> int:
        """Keys put that the database does not hold yet: what the overlay answers for, in
        memory (a produce's keys packed: 74 bytes of the process's memory a keyed message
        produced and not yet written, BENCHMARKS.md, 32 of them the overlay's table, filled
        only once a key is looked for). The broker refuses keyed produce while it is over
        `max_unwritten_keys` (the write of random keys into a big index is slower than produce)."""
        return self._queued + self._writing

    def commit(self, commit_pos: int) -> None:
        """Apply everything queued now, on this thread (recovery and shutdown)."""
        self.apply(self.take_ops(), commit_pos)
        self.applied()

    def count(self) -> int:
        """Rows in both tables (a pair whose older row waits in `keys` for the move counts twice)."""
        return sum(table_rows(self.db))

    def reset(self) -> None:
        if self._build is not None:
            self._build.cancel()
            self._build = None
        self._filter = KeyFilter(0)
        self._ops.clear()
        self._queued = self._writing = 0
        self._current, self._flushing = Overlay(), Overlay()
        for table in TABLES:
            self.writer.execute(f"DELETE FROM {table}")
        self.writer.execute("DELETE FROM meta")
        self.writer.commit()
        self._rows, self._merge_from, self._pos_written = [0, 0], None, None

    def disk_bytes(self) -> int:
        return sqlite_bytes(self.path)

    def close(self) -> None:
        if self._build is not None:
            self._build.cancel()
        self.writer.close()
        self.db.close()
