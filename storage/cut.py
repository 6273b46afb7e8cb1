"""Cutting a data directory's commit log back to an earlier offset, and every derived file with it.

A replica that rejoins a shard may hold records the new primary never had (it was the primary
and wrote them after its fence, or it followed a primary that lost them): it cuts its log back to
where the new primary's history and its own agree (storage.epochs `end_of`). Nothing derived may
then point past the shorter log (RocketMQ #10668): the ready queues are cut to where the first cut
RELEASE record of each topic put its units, and the files that are rebuilt from the log — TimerLog,
wheel, message table, key and far indexes, checkpoints — are removed, so that the next open
(storage.recovery, a full rescan) rebuilds them from exactly the shorter log. The epoch file
forgets the epochs that start past the cut.

The directory must not be open (the LOCK is taken here).
"""

from __future__ import annotations

import logging
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from delayd.storage import checkpoint as ckpt
from delayd.storage.commitlog import CommitLog, RecordType, release_parts
from delayd.storage.datadir import DataDir
from delayd.storage.epochs import EpochFile
from delayd.storage.readyqueues import ReadyQueues
from delayd.storage.store import StoreConfig

log = logging.getLogger("delayd.storage")


@dataclass(slots=True)
class CutReport:
    offset: int
    bytes_cut: int = 0
    records_cut: int = 0
    ready_cut: dict[str, int] = field(default_factory=dict)  # topic -> units dropped

    def line(self) -> str:
        return (f"cut the commit log back to {self.offset}: {self.bytes_cut} bytes ({self.records_cut} records) "
                f"dropped, ready queues {self.ready_cut or 'unchanged'}; derived files rebuilt at the next open")


def cut(path: Path, offset: int, cfg: StoreConfig | None = None) -> CutReport:
    """Cut the commit log of the (closed) data directory at `path` back to `offset`, a record
    boundary at or below its end, and make every derived file agree (see the module docstring)."""
    cfg = cfg or StoreConfig()
    data = DataDir.open(Path(path))
    rep = CutReport(offset)
    try:
        layout = data.layout
        commit = CommitLog(layout.commitlog, cfg.commit_segment_bytes)
        try:
            if not commit.start <= offset <= commit.end:
                raise ValueError(f"cut at {offset}: the log holds [{commit.start}, {commit.end})")
            if offset < commit.end:
                commit.read(offset)  # a record starts there (CorruptData otherwise: nothing is cut)
            lows: dict[str, int] = {}
            for rec in commit.scan(offset):
                rep.records_cut += 1
                if rec.type == RecordType.RELEASE:
                    first, _units = release_parts(rec.body)
                    lows[rec.topic] = min(first, lows.get(rec.topic, first))
            rep.bytes_cut = commit.files.truncate(offset, "cut back to the primary's log")
        finally:
            commit.close()
        ready = ReadyQueues(layout.ready, cfg.ready_segment_units, cfg.ready_open_files)
        try:
            for topic, first in lows.items():
                if n := ready.truncate(topic, first):
                    rep.ready_cut[topic] = n
        finally:
            ready.close()
        for p in (layout.checkpoint, ckpt.previous(layout.checkpoint), layout.timerwheel):
            p.unlink(missing_ok=True)
        for d in (layout.timerlog, layout.msgtable):
            shutil.rmtree(d, ignore_errors=True)
        for db in (layout.keys, layout.far):
            for p in db.parent.glob(db.name + "*"):
                p.unlink(missing_ok=True)
        EpochFile(layout.epochs).cut(offset)
    finally:
        data.close()
    log.warning("%s", rep.line())
    return rep
