"""Drive a Store the way the broker's pipeline does, on a fake clock (used by the storage model
tests and tests/robustness/test_storage_corruption.py).

enqueue-get/put: `batch.read_rows` from `indexed` + `indexer.index_rows`, plus its late rows;
dequeue-get: `dispatch.open_slot` for every slot whose start is <= now; dequeue-get-message:
`dispatch.resolve`, rolling far ones forward and dropping unreadable records; dequeue-put:
`dispatch.release` each DueRow only once the clock has reached its `deliver_at` (as
broker/pipeline.py does). `pending` and `released` hold them decoded (Due, ReadyUnit).

Run as `python -m tests.storage.driver DATA_DIR SEED` it is the child of the kill -9 test:
it produces, cancels and delivers with a seeded RNG and prints one line per acknowledged
operation (after the commit log is flushed) until it is killed.
"""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from delayd.storage import batch
from delayd.storage.msgtable import MessageState
from delayd.storage.readyqueue import ReadyUnit, tag_hash
from delayd.storage.recovery import open_store as open_data_dir
from delayd.storage.store import Due, NewMessage, Store, StoreConfig

TOPICS = ("orders", "mail")

# Tiny geometry so that a test crosses segments, laps and rolls within a few seconds of fake time.
SMALL = StoreConfig(precision_ms=10, roll_window_ms=200, commit_segment_bytes=4096, timerlog_segment_units=16,
                    ready_segment_units=8, msgtable_segment_entries=64)


@dataclass
class Driver:
    store: Store
    clock: list[int]  # the fake wall clock, shared with the Store's clock_ms
    lookahead_ms: int = 0
    pending: list[Due] = field(default_factory=list)
    released: list[ReadyUnit] = field(default_factory=list)
    blocked: int = 0
    unreadable: int = 0  # units whose commit-log record did not decode (dropped, like the broker)
    last_cp: int | None = None

    @property
    def now(self) -> int:
        return self.clock[0]

    @now.setter
    def now(self, value: int) -> None:
        assert value >= self.clock[0], "the fake clock only moves forward"
        self.clock[0] = value

    def enqueue(self) -> None:
        s = self.store
        while True:
            rows, _pos = batch.read_rows(s.commit, s.indexed, 256)
            if not rows:
                return
            result = s.indexer.index_rows(rows, self.now)
            self.pending.extend(Due.rows(result.late))
            if result.blocked:  # the next unit would overwrite an unread lap: wait for a checkpoint
                self.blocked += 1
                return

    def dequeue(self) -> None:
        s = self.store
        p = s.cfg.precision_ms
        while s.load_time_ms <= self.now + self.lookahead_ms:
            t = s.load_time_ms
            for chunk in s.dispatch.open_slot(t):
                res = s.dispatch.resolve(chunk, t)
                self.unreadable += len(res.unreadable)
                for r in res.copies():
                    assert r.deliver_at > t, "a message due now must not be rolled again"
                if res.roll:
                    s.dispatch.roll_forward(res.roll, res.roll_sizes)
                for due in Due.rows(res.due):
                    # A Due never leaves a slot before its own (the timer side is never early).
                    assert due.deliver_at - due.deliver_at % p <= t, (due, t)
                    self.pending.append(due)

    def release(self) -> list[ReadyUnit]:
        ready = [d for d in self.pending if d.deliver_at <= self.now]
        if not ready:
            return []
        self.pending = [d for d in self.pending if d.deliver_at > self.now]
        out = self.store.dispatch.release(b"".join(d.row() for d in ready), self.now).units()
        for u in out:
            assert u.deliver_at <= self.now and u.released_at == self.now
        self.released.extend(out)
        return out

    def step(self) -> list[ReadyUnit]:
        self.enqueue()
        self.dequeue()
        self.enqueue()  # roll copies and late ones
        return self.release()

    def read_time(self) -> int:
        """Every slot before this time is fully dispatched (nothing of it still in flight)."""
        return min([self.store.load_time_ms] + [d.slot_time for d in self.pending])

    def checkpoint(self) -> None:
        self.enqueue()  # the RELEASE records of the last releases, as enqueue-get would by now
        self.store.checkpoint(self.read_time(), {})

    def advance(self, ms: int, tick: int = 7, checkpoint_every_ms: int = 100) -> None:
        end = self.now + ms
        if self.last_cp is None:
            self.last_cp = self.now
        while self.now < end:
            self.now = min(end, self.now + tick)
            self.step()
            if self.now - self.last_cp >= checkpoint_every_ms:
                self.checkpoint()
                self.last_cp = self.now
                self.enqueue()


@contextlib.contextmanager
def no_fsync() -> Iterator[None]:
    """fsync as a no-op. What these tests check survives a process crash through the page cache
    alone; power loss is not simulated, and thousands of fsyncs would only make them slow."""
    real = os.fsync, os.fdatasync
    os.fsync = os.fdatasync = lambda fd: None
    try:
        yield
    finally:
        os.fsync, os.fdatasync = real


def open_store(d: Path, clock: list[int], cfg: StoreConfig = SMALL) -> Store:
    s, _report = open_data_dir(d, cfg, lambda: clock[0])
    return s


def save_files(d: Path, pattern: str) -> Path:
    """A copy of the files of data directory `d` matching `pattern` as they are now (beside `d`)."""
    saved = d.parent / f"{d.name}-saved-{pattern.strip('*')}"
    shutil.rmtree(saved, ignore_errors=True)
    saved.mkdir()
    for f in d.glob(pattern):
        shutil.copy(f, saved / f.name)
    return saved


def restore_files(d: Path, pattern: str, saved: Path) -> None:
    """The files matching `pattern` as `save_files` copied them: whatever was written to them since
    is lost, as a kill -9 loses an index's commits that had not reached the disk."""
    for f in d.glob(pattern):
        f.unlink()
    for f in saved.iterdir():
        shutil.copy(f, d / f.name)


def release_now(store: Store, seqs: list[int], now: int) -> list[ReadyUnit]:
    """Release already-indexed messages `seqs` at `now` straight from their records (as if each
    were due now): what a test of the consuming side needs in its ready queues."""
    rows = []
    for seq in seqs:
        _st, off, size, _roll = store.state(seq)
        rec = store.read_record(off, size)
        rows.append(Due(now, seq, off, size, store.counters.topic_hash(rec.topic),
                        tag_hash(rec.tag), rec.key is not None, now - now % store.cfg.precision_ms).row())
    return store.dispatch.release(b"".join(rows), now).units()


def topic_of(store: Store, seq: int) -> str:
    _st, off, size, _roll = store.state(seq)
    return store.read_record(off, size).topic


def ready_units(store: Store) -> dict[str, list[ReadyUnit]]:
    return {t: list(store.ready.scan(t, 0)) for t in store.ready.topics()}


def delivered_seqs(store: Store) -> list[int]:
    return [u.seq for units in ready_units(store).values() for u in units]


def drain(drv: Driver, until: int, tick: int = 9) -> None:
    """Run the pipeline until the clock reaches `until`, checkpointing as the broker does."""
    while drv.now < until:
        drv.advance(min(until - drv.now, 200), tick=tick)


def child(data_dir: Path, seed: int) -> None:
    os.fsync = os.fdatasync = lambda fd: None  # see no_fsync(): a SIGKILL leaves the page cache intact
    rng = random.Random(seed)
    clock = [1_000_000]
    s = open_store(data_dir, clock)
    drv = Driver(s, clock)
    print("ready", flush=True)
    while True:
        op = rng.random()
        if op < 0.5:
            msgs = [NewMessage(rng.choice(TOPICS), b"m%d" % rng.randrange(10**6),
                               drv.now + rng.randrange(-20, 900)) for _ in range(rng.randrange(1, 6))]
            seqs = s.append_messages(msgs, drv.now)
            s.flush_commit()
            print("ack", drv.now, *(f"{q}:{m.deliver_at}" for q, m in zip(seqs, msgs, strict=True)), flush=True)
        elif op < 0.6 and s.next_seq > 1:
            seq = rng.randrange(1, s.next_seq)
            if s.state(seq)[0] == MessageState.SCHEDULED:
                s.append_cancel(seq, topic_of(s, seq))
                s.flush_commit()
                print("cancel", seq, flush=True)
        else:
            drv.advance(rng.randrange(1, 40))
            print("clock", drv.now, flush=True)


if __name__ == "__main__":
    child(Path(sys.argv[1]), int(sys.argv[2]))
