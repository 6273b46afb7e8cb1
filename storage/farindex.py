"""The far-future index: pending messages due beyond the roll window, in due order, in SQLite.

Why it exists: inside the roll window the TimerWheel and its TimerLog chains say what is due
when, slot by slot. A message due later sits in a ROLL unit at a roll slot (RIP-43), which says
when it will be looked at again, not when it is due; `Store.far_counts` only counts such
messages per hour. Listing pending messages in due order (storage.browse) needs them ordered
by due time, without reading the commit log: this table is that order.

Maintenance: the indexing path calls `put` when a message first gets a ROLL unit and `remove`
when it comes inside the window (its roll copy gets a DEFAULT unit) or is cancelled while far.
Rows say nothing about state: a reader checks the message table, so a row that missed an
update can never list a message that is not pending (it is skipped and pruned).

Crash consistency, as for the key index (storage.keyindex): derived from the commit log.
Writes are queued and applied in one transaction per checkpoint, with the commit-log
position indexed at that checkpoint (`commit_pos`). Recovery (`replay`) brings the table back
up to the log by scanning from `min(commit_pos, checkpoint)` and putting every message the
message table says is parked far (SCHEDULED with the store's FAR flag); an unusable or missing
table is rebuilt that way from the oldest segment.

Table `far` (one row per far-future message):

    column      type     meaning
    ----------  -------  -------------------------------------------------------------
    deliver_at  INTEGER  due time, epoch ms                  } primary key: due order
    seq         INTEGER  message sequence number             }
    topic_hash  INTEGER  crc32 of the topic (index far_topic: one topic in due order)

Table `meta`: `commit_pos` (see above).
Version history: 1 — original (`PRAGMA user_version`).
"""

from __future__ import annotations

import heapq
import sqlite3
from collections.abc import Iterable
from itertools import repeat
from operator import itemgetter
from pathlib import Path
from typing import Any

from delayd.storage.batch import MROW_FMT
from delayd.storage.commitlog import RecordType
from delayd.storage.errors import UnsupportedVersion
from delayd.storage.keyindex import connect, insert_rows, open_or_set_aside, sqlite_bytes, write_commit_pos
from delayd.storage.msgtable import MessageState, MessageTable

FARINDEX_VERSION = 1
_MESSAGE, _ROLL = int(RecordType.MESSAGE), int(RecordType.ROLL)

Row = tuple[int, int, int]  # (deliver_at, seq, topic_hash)
PUT_ROW = "(?, ?, ?)"
Op = tuple[str, Any]


class FarIndex:
    """Reads answer at once; writes are queued and applied in one transaction per checkpoint.

    As in KeyIndex, `put`/`remove` only queue an operation and update an in-memory overlay
    (seq -> row, or None once removed) that reads merge in; `take_ops` hands the queue to
    `apply` (a worker thread, own connection) and moves the overlay aside until `applied`.
    The overlay holds what one or two checkpoint intervals indexed, never the backlog.
    """

    def __init__(self, path: Path, cache_kib: int = 8192) -> None:
        self.path = Path(path)
        self.created = not self.path.exists()
        self.db = self._connect(cache_kib)
        try:  # a newer or damaged file: nothing is left open
            self._prepare()
        except BaseException:
            self.db.close()
            raise
        self.writer = self._connect(cache_kib)
        # The rows of a checkpoint's puts, for SQLite to sort before they go in (`apply`): the
        # writer's own temporary table, in a temporary file (temp_store FILE), not on the heap.
        self.writer.execute("CREATE TEMP TABLE IF NOT EXISTS far_in (deliver_at INTEGER, seq INTEGER, "
                            "topic_hash INTEGER)")
        self._ops: list[Op] = []
        self._writing = 0  # operations handed to `apply` and not yet applied
        self._current: dict[int, Row | None] = {}
        self._flushing: dict[int, Row | None] = {}
        self._pos_written: int | None = None  # the commit_pos `apply` last wrote (None: not known)

    def _connect(self, cache_kib: int) -> sqlite3.Connection:
        return connect(self.path, cache_kib)

    def _prepare(self) -> None:
        """Refuse a newer index, create the tables if missing."""
        version = self.db.execute("PRAGMA user_version").fetchone()[0]
        if version not in (0, FARINDEX_VERSION):
            raise UnsupportedVersion(str(self.path), version, FARINDEX_VERSION)
        self.db.execute("CREATE TABLE IF NOT EXISTS far (deliver_at INTEGER NOT NULL, seq INTEGER NOT NULL, "
                        "topic_hash INTEGER NOT NULL, PRIMARY KEY (deliver_at, seq)) WITHOUT ROWID")
        self.db.execute("CREATE INDEX IF NOT EXISTS far_topic ON far(topic_hash, deliver_at, seq)")
        self.db.execute("CREATE TABLE IF NOT EXISTS meta (name TEXT PRIMARY KEY, value INTEGER) WITHOUT ROWID")
        self.db.execute(f"PRAGMA user_version={FARINDEX_VERSION}")
        self.db.commit()

    @property
    def commit_pos(self) -> int:
        row = self.db.execute("SELECT value FROM meta WHERE name='commit_pos'").fetchone()
        return int(row[0]) if row else 0

    # -- writes (queued) ------------------------------------------------------------------------
    def put(self, deliver_at: int, seq: int, topic_hash: int) -> None:
        self.put_many([(deliver_at, seq, topic_hash)])

    def put_many(self, rows: Iterable[Row]) -> None:
        """The message of each (deliver_at, seq, topic_hash) row is parked far, in order."""
        rows = list(rows)
        self._ops.extend(zip(repeat("put"), rows))
        self._current.update(zip(map(itemgetter(1), rows), rows, strict=True))

    def remove(self, deliver_at: int, seq: int) -> None:
        self._ops.append(("remove", (deliver_at, seq)))
        self._current[seq] = None

    def prune(self, rows: Iterable[tuple[int, int]]) -> None:
        """Rows a reader found stale (the message is no longer parked far): drop them."""
        for deliver_at, seq in rows:
            self.remove(deliver_at, seq)

    def take_ops(self) -> list[Op]:
        ops, self._ops = self._ops, []
        self._writing += len(ops)
        if self._flushing:  # an earlier write failed and was requeued: keep its entries too
            self._flushing.update(self._current)
        else:
            self._flushing = self._current
        self._current = {}
        return ops

    def requeue(self, ops: list[Op]) -> None:
        self._ops[:0] = ops
        self._writing = 0

    @property
    def unwritten(self) -> int:
        """Operations the database does not hold yet, held in memory (about 200 bytes each): the
        broker refuses a produce of far messages while it is over `max_unwritten_far` (rows put
        in due order into a big table are slower than produce)."""
        return len(self._ops) + self._writing

    def apply(self, ops: list[Op], commit_pos: int) -> None:
        """Write queued operations and the indexed position they cover, atomically (worker thread)."""
        w = self.writer
        i = 0
        while i < len(ops):  # consecutive operations of one kind are written together, in order
            kind = ops[i][0]
            j = i
            while j < len(ops) and ops[j][0] == kind:
                j += 1
            args = [op[1] for op in ops[i:j]]
            if kind == "put":
                # In primary-key order: random due times would each touch a page of their own.
                # SQLite sorts them in one step (no GIL held); a row put twice is the same row.
                w.execute("DELETE FROM far_in")
                insert_rows(w, "INSERT INTO far_in (deliver_at, seq, topic_hash) VALUES ", PUT_ROW, 3, args)
                w.execute("INSERT OR REPLACE INTO far (deliver_at, seq, topic_hash) "
                          "SELECT deliver_at, seq, topic_hash FROM far_in ORDER BY deliver_at, seq")
                w.execute("DELETE FROM far_in")
            else:
                w.executemany("DELETE FROM far WHERE deliver_at=? AND seq=?", args)
            i = j
        self._pos_written = write_commit_pos(w, commit_pos, self._pos_written)

    def applied(self) -> None:
        self._flushing = {}
        self._writing = 0

    def commit(self, commit_pos: int) -> None:
        """Apply everything queued now, on this thread (recovery and shutdown)."""
        self.apply(self.take_ops(), commit_pos)
        self.applied()

    def reset(self) -> None:
        self._ops.clear()
        self._writing = 0
        self._current, self._flushing = {}, {}
        self.writer.execute("DELETE FROM far")
        self.writer.execute("DELETE FROM meta")
        self.writer.commit()
        self._pos_written = None

    # -- reads ----------------------------------------------------------------------------------
    def after(self, deliver_at: int, seq: int, to_ms: int, topic_hash: int | None, n: int) -> list[Row]:
        """Up to `n` rows with (deliver_at, seq) greater than the given pair and deliver_at <= to_ms,
        in due order, for one topic hash or all. Rows may be stale: the caller checks the state."""
        if not self._current and not self._flushing:
            return self._query(deliver_at, seq, to_ms, topic_hash, n)
        overlay = {**self._flushing, **self._current}
        # The overlay's own rows in range, merged with the database's rows the overlay did not
        # change (read on until `n` of those are found: the overlay may hide some).
        mine = heapq.nsmallest(n, (r for r in overlay.values() if r is not None and (r[0], r[1]) > (deliver_at, seq)
                                   and r[0] <= to_ms and (topic_hash is None or r[2] == topic_hash)))
        theirs: list[Row] = []
        at = (deliver_at, seq)
        while len(theirs) < n:
            rows = self._query(*at, to_ms, topic_hash, n)
            theirs += [r for r in rows if r[1] not in overlay]
            if len(rows) < n:
                break
            at = rows[-1][:2]
        return list(heapq.merge(mine, theirs))[:n]

    def _query(self, deliver_at: int, seq: int, to_ms: int, topic_hash: int | None, n: int) -> list[Row]:
        # A row-value comparison: SQLite seeks the primary key (or far_topic) straight to the
        # cursor, so a page costs O(page) even inside a million rows due in the same ms (a
        # range on deliver_at alone would step over every row of that ms before the cursor).
        where = "(deliver_at, seq) > (?, ?) AND deliver_at <= ?"
        args: list[int] = [deliver_at, seq, to_ms]
        if topic_hash is not None:
            where = "topic_hash = ? AND " + where
            args.insert(0, topic_hash)
        return [(int(d), int(s), int(t)) for d, s, t in self.db.execute(
            f"SELECT deliver_at, seq, topic_hash FROM far WHERE {where} ORDER BY deliver_at, seq LIMIT ?",
            (*args, n))]

    def count(self) -> int:
        return int(self.db.execute("SELECT count(*) FROM far").fetchone()[0])

    def disk_bytes(self) -> int:
        return sqlite_bytes(self.path)

    def close(self) -> None:
        self.writer.close()
        self.db.close()


def open_far(path: Path) -> tuple[FarIndex, bool]:
    """The far index at `path` (a data directory's far.sqlite), and whether it must be rebuilt
    (new, or unusable and set aside as far.bad-<time>.sqlite)."""
    far, bad = open_or_set_aside(Path(path), FarIndex, "far index")
    return far, bad or far.created


def replay(far: FarIndex, chunks: Iterable[bytes], msgs: MessageTable, far_flag: int) -> int:
    """Recovery: put every message of the MessageRows in `chunks` (storage.batch, in log order)
    that the message table says is pending and parked far (its flags carry `far_flag`).
    Idempotent; returns the rows put. The state is the message table's current one, so a
    record's own offset does not matter: a message first indexed before the scan start but
    rolled since is found by its roll copy."""
    n = 0
    for rows in chunks:
        picked = [(seq, due, th) for seq, due, _o, _s, th, _t, _r, rtype, _f in MROW_FMT.iter_unpack(rows)
                  if rtype == _MESSAGE or rtype == _ROLL]
        msgs.begin_batch(p[0] for p in picked)  # one read per run of seqs, not one per record
        try:
            for seq, deliver_at, topic_hash in picked:
                if msgs.get(seq)[0] == MessageState.SCHEDULED and msgs.flags(seq) & far_flag:
                    far.put(deliver_at, seq, topic_hash)
                    n += 1
        finally:
            msgs.end_batch()
    return n
