"""storage.inspect: `check` and `dump` read a data directory without the LOCK and change nothing.
(The corruption tests in tests/robustness check that each injected fault is reported.)"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from delayd.storage import inspect
from delayd.storage.recovery import open_store as open_data_dir
from delayd.storage.store import NewMessage, Store

from tests.storage.driver import SMALL, Driver, drain, open_store


def snapshot(d: Path) -> dict[str, tuple[int, int]]:
    return {str(p.relative_to(d)): (p.stat().st_size, p.stat().st_mtime_ns) for p in d.rglob("*") if p.is_file()}


@pytest.fixture
def live(tmp_path: Path) -> Store:
    """A store that stays open (holding the LOCK) with messages in every state."""
    clock = [1_000_000]
    s = open_store(tmp_path / "data", clock)
    drv = Driver(s, clock)
    seqs = s.append_messages([NewMessage("orders" if i % 2 else "mail", b"m%d" % i, clock[0] + 40 * i,
                                         tag="t" if i % 3 else None, key=f"k{i}") for i in range(30)], clock[0])
    s.flush_commit()
    s.append_cancel(seqs[-1], "orders")
    drain(drv, clock[0] + 400)
    drv.checkpoint()
    return s


def test_check_of_a_live_store_is_ok_and_touches_nothing(live: Store) -> None:
    d = live.dir
    before = snapshot(d)
    rep = inspect.check(d, SMALL)
    assert rep.ok, rep.text()
    assert rep.checkpoint == "ok" and rep.commit_records == len(list(live.commit.scan(0))) > 31
    assert rep.damaged_records == 0
    assert rep.timerlog_units > 0 and rep.wheel_units > 0 and rep.ready_units > 5
    assert rep.msgtable_entries == 30
    text = rep.text()
    assert text.startswith(f"data dir {d}: OK") and f"{rep.commit_records} records" in text
    for what in inspect.DUMP_KINDS:
        assert list(inspect.dump(d, what, config=SMALL))
    assert snapshot(d) == before
    live.close()


def test_dump_lines(live: Store) -> None:
    d = live.dir
    lines = list(inspect.dump(d, "commitlog"))
    assert lines[0].startswith("# commit log")
    assert lines[1].startswith("offset=0 size=") and "type=MESSAGE seq=1 topic='mail'" in lines[1]
    assert "deliver_at=1000000" in lines[1] and "key='k0'" in lines[1]
    assert any("type=CANCEL seq=30" in ln for ln in lines)
    assert len(list(inspect.dump(d, "commitlog", limit=3))) == 3
    bases = live.commit.files.bases
    seg = list(inspect.dump(d, "commitlog", segment=bases[-1]))
    assert seg[0].endswith(f"segments [{bases[-1]}]")
    with pytest.raises(Exception, match="no commit-log segment"):
        list(inspect.dump(d, "commitlog", segment=12345))

    units = list(inspect.dump(d, "timerlog"))
    assert units[1].startswith("pos=0 prev=-1 magic=DEFAULT fire=") and "seq=1" in units[1]
    slots = list(inspect.dump(d, "wheel"))
    assert slots[0].startswith(f"# TimerWheel {d / 'timerwheel'}: 10 ms x {SMALL.slot_count} slots")
    assert all(" first=" in ln and " num=" in ln and " magic=" in ln for ln in slots[1:])
    cp = list(inspect.dump(d, "checkpoint"))
    assert cp[0] == "# checkpoint: valid" and any(ln.startswith("next_seq=31") for ln in cp)
    ready = list(inspect.dump(d, "ready", topic="mail"))
    assert ready[0].startswith("# ready queue mail") and "seq=1" in ready[1] and "late_ms=" in ready[1]
    table = list(inspect.dump(d, "msgtable", start=30, config=SMALL))
    assert table == [ln for ln in table if ln.startswith("seq=30 state=CANCELLED")] and len(table) == 1
    with pytest.raises(ValueError):
        list(inspect.dump(d, "nothing"))
    live.close()


def test_damage_shows_in_dump_and_check(live: Store) -> None:
    d = live.dir
    live.close()
    seg = d / "commitlog" / f"{0:020d}"
    with open(seg, "r+b") as f:
        f.seek(50)  # in the first record (56 bytes)
        b = f.read(1)
        f.seek(50)
        f.write(bytes((b[0] ^ 1,)))
    lines = list(inspect.dump(d, "commitlog"))
    assert "DAMAGED" in lines[1] and "ChecksumMismatch" in lines[1]
    rep = inspect.check(d, SMALL)
    assert not rep.ok and rep.damaged_records == 1
    assert "damaged record at offset 0" in rep.text()


def test_check_of_an_empty_or_missing_directory(tmp_path: Path) -> None:
    assert inspect.check(tmp_path / "nothing").ok
    d = tmp_path / "fresh"
    open_data_dir(d, SMALL)[0].close()
    assert inspect.check(d).ok
    assert list(inspect.dump(d, "checkpoint")) == ["# checkpoint: missing", "# checkpoint.prev: missing"]


def test_check_opens_nothing_for_writing(live: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    real = os.open
    modes: list[int] = []

    def spy(path: str | Path, flags: int, *a: int) -> int:
        modes.append(flags)
        return real(path, flags, *a)

    monkeypatch.setattr(os, "open", spy)
    inspect.check(live.dir, SMALL)
    for what in inspect.DUMP_KINDS:
        list(inspect.dump(live.dir, what, config=SMALL))
    monkeypatch.undo()
    assert modes and all(m & (os.O_WRONLY | os.O_RDWR | os.O_CREAT) == 0 for m in modes)
    live.close()
