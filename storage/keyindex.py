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

Table `keys` (one row per key):

    column      type     meaning
    ----------  -------  ---------------------------------------------------------------
    topic       TEXT     topic name                      } primary key
    key         TEXT     business key                    }
    seq         INTEGER  message sequence number holding the key
    deliver_at  INTEGER  its due time, epoch ms
    done_at     INTEGER  when it was delivered (NULL while pending), for the dedup window

Version history: 1 — original (`PRAGMA user_version`).
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

from storage.errors import UnsupportedVersion

KEYINDEX_VERSION = 1


class KeyIndex:
    def __init__(self, path: Path, cache_kib: int = 8192) -> None:
        self.path = Path(path)
        self.created = not self.path.exists()
        self.db = sqlite3.connect(self.path, isolation_level="DEFERRED", check_same_thread=False)
        version = self.db.execute("PRAGMA user_version").fetchone()[0]
        if version not in (0, KEYINDEX_VERSION):
            raise UnsupportedVersion(f"{self.path}: key index version {version}")
        # WAL: readers never block; NORMAL: a commit is atomic, and what a power loss takes
        # back is redone from the commit log (see commit_pos).
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=NORMAL")
        self.db.execute(f"PRAGMA cache_size=-{cache_kib}")
        self.db.execute("CREATE TABLE IF NOT EXISTS keys (topic TEXT NOT NULL, key TEXT NOT NULL, "
                        "seq INTEGER NOT NULL, deliver_at INTEGER NOT NULL, done_at INTEGER, "
                        "PRIMARY KEY (topic, key)) WITHOUT ROWID")
        self.db.execute("CREATE INDEX IF NOT EXISTS keys_done ON keys(done_at) WHERE done_at IS NOT NULL")
        self.db.execute("CREATE TABLE IF NOT EXISTS meta (name TEXT PRIMARY KEY, value INTEGER) WITHOUT ROWID")
        self.db.execute(f"PRAGMA user_version={KEYINDEX_VERSION}")
        self.db.commit()

    @property
    def commit_pos(self) -> int:
        row = self.db.execute("SELECT value FROM meta WHERE name='commit_pos'").fetchone()
        return int(row[0]) if row else 0

    def lookup(self, topic: str, key: str) -> tuple[int, int, int | None] | None:
        """(seq, deliver_at, done_at) of the message holding `key`, or None."""
        row = self.db.execute("SELECT seq, deliver_at, done_at FROM keys WHERE topic=? AND key=?",
                              (topic, key)).fetchone()
        return (int(row[0]), int(row[1]), row[2]) if row else None

    def put_many(self, rows: list[tuple[str, str, int, int]]) -> None:
        """(topic, key, seq, deliver_at): the message `seq` now holds the key."""
        self.db.executemany("INSERT INTO keys (topic, key, seq, deliver_at, done_at) VALUES (?, ?, ?, ?, NULL) "
                            "ON CONFLICT (topic, key) DO UPDATE SET seq=excluded.seq, "
                            "deliver_at=excluded.deliver_at, done_at=NULL WHERE excluded.seq >= keys.seq", rows)

    def release(self, topic: str, key: str, seq: int) -> None:
        """The key is free again (its message was cancelled)."""
        self.db.execute("DELETE FROM keys WHERE topic=? AND key=? AND seq=?", (topic, key, seq))

    def delivered(self, rows: list[tuple[int, str, str, int]]) -> None:
        """(done_at, topic, key, seq): the message was delivered; the key stays taken for the
        dedup window."""
        self.db.executemany("UPDATE keys SET done_at=? WHERE topic=? AND key=? AND seq=?", rows)

    def expire(self, before_ms: int) -> int:
        """Forget keys of messages delivered before `before_ms` (outside the dedup window)."""
        return self.db.execute("DELETE FROM keys WHERE done_at IS NOT NULL AND done_at < ?", (before_ms,)).rowcount

    def commit(self, commit_pos: int) -> None:
        """Make everything so far one atomic step, complete up to commit-log offset `commit_pos`."""
        self.db.execute("INSERT OR REPLACE INTO meta (name, value) VALUES ('commit_pos', ?)", (commit_pos,))
        self.db.commit()

    def count(self) -> int:
        return int(self.db.execute("SELECT count(*) FROM keys").fetchone()[0])

    def reset(self) -> None:
        self.db.execute("DELETE FROM keys")
        self.db.execute("DELETE FROM meta")
        self.db.commit()

    def disk_bytes(self) -> int:
        return sum(p.stat().st_size for p in self.path.parent.glob(self.path.name + "*"))

    def close(self) -> None:
        self.db.commit()
        self.db.close()
