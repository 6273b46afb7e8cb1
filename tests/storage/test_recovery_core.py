"""Recovery's loops in the batch core (storage/batch_recovery.c) against their Python references,
byte for byte, damaged input included: `restore_states`, `message_runs` and `census`
(storage/batch_recovery.py), `unit_prevs`
(storage/timerlog.py), `strip_slots` and `bad_slots` (storage/timerindex.py). `make asan` runs this file with
AddressSanitizer."""

from __future__ import annotations

import struct
from typing import Any

import pytest
from delayd.storage import batch, batch_recovery, timerindex, timerlog
from delayd.storage.batch import MROW_FMT
from delayd.storage.msgtable import ENTRY
from delayd.storage.timerlog import DAMAGED, NO_POS, UNIT, UNIT_SIZE
from delayd.storage.timerwheel import SLOT
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.storage.test_batch_differential import Span, same, span_states

c = pytest.importorskip("delayd.storage._batch", reason="the compiled batch core is built by pip install")
if c is batch:  # pragma: no cover
    pytest.skip("DELAYD_PURE=1: nothing to compare", allow_module_level=True)

SETTINGS = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
HEADER = 32


# ---------------------------------------------------------------------------------- restore_states
@st.composite
def restore_case(draw: Any) -> tuple[bytes, bytes, int, int]:
    """MessageRows of seqs 0-12 (a few past the span) and entries of every state, some of them
    garbage, in a span of 10 entries of which `valid` bytes were read."""
    rows = draw(st.lists(st.tuples(st.integers(0, 12) | st.sampled_from([2**64 - 1]), st.integers(-1, 2**40),
                                   st.integers(0, 2**32 - 1), st.integers(0, 4), st.integers(0, 7), st.integers(0, 1)),
                         max_size=30))
    raw = b"".join(MROW_FMT.pack(seq, 0, off, size, 7, 0, roll, rtype, keyed) for seq, off, size, roll, rtype, keyed in rows)
    entries = b"".join(ENTRY.pack(draw(st.integers(0, 5)), draw(st.integers(0, 3)), draw(st.integers(0, 4)),
                                  draw(st.integers(0, 99)), draw(st.integers(-1, 99))) for _ in range(10))
    return raw, entries, draw(st.integers(0, 160)), draw(st.integers(0, 3))


@SETTINGS
@given(restore_case(), st.booleans())
def test_restore_states(case: tuple[bytes, bytes, int, int], restore: bool) -> None:
    rows, entries, valid, base = case
    out = []
    for impl in (c, batch_recovery):
        spans = [Span(base, bytearray(entries), valid)]
        got = impl.restore_states(rows, spans, restore)
        out.append((got, span_states(spans)))
    assert out[0] == out[1]


def test_restore_states_as_recovery_reads_the_log() -> None:
    """A message, its roll copy and a cancel of another: the entries restored; a GROUP row and a
    seq no span holds are left, in order; the next seq is past the highest."""
    rows = b"".join([MROW_FMT.pack(3, 0, 100, 50, 7, 0, 0, 1, 0), MROW_FMT.pack(3, 0, 900, 50, 7, 0, 1, 3, 0),
                     MROW_FMT.pack(4, 0, 200, 40, 7, 0, 0, 2, 0), MROW_FMT.pack(9, 0, 300, 30, 7, 0, 0, 4, 0),
                     MROW_FMT.pack(20, 0, 400, 60, 7, 0, 0, 1, 0)])
    for impl in (c, batch_recovery):
        span = Span(0, bytearray(ENTRY.pack(1, 0, 0, 40, 200) * 5 + bytes(16 * 5)), 16 * 5)
        span.buf[16 * 3:16 * 4] = bytes(16)  # seq 3: lost with the power
        top, left = impl.restore_states(rows, [span], True)
        assert top == 21 and struct.unpack(f"<{len(left) // 4}I", left) == (3, 4)
        assert ENTRY.unpack_from(span.buf, 16 * 3) == (1, 0, 1, 50, 900)  # the roll copy is current
        assert span.buf[16 * 4] == 3  # cancelled
        assert impl.restore_states(b"", [span], True) == (0, b"")
        assert impl.restore_states(rows, [span], False)[1] == struct.pack("<I", 3)  # only the GROUP row


# ---------------------------------------------------------------------------------- message_runs, census
@SETTINGS
@given(st.lists(st.tuples(st.integers(0, 6) | st.sampled_from([2**64 - 1]), st.sampled_from([1, 1, 1, 2, 3, 5]),
                          st.sampled_from([7, 7, 8])), max_size=30),
       st.booleans(), st.binary(max_size=45))
def test_message_runs_and_census(rows: list[tuple[int, int, int]], counting: bool, junk: bytes) -> None:
    seq, raw = 0, b""
    for step, rtype, th in rows:  # mostly consecutive seqs, as a produce appends them
        seq = (seq + 1 if step else step) % 2**64 if counting else step
        raw += MROW_FMT.pack(seq, 0, 16 * len(raw), 40, th, 0, 0, rtype, 0)
    for f in ("message_runs", "census"):
        same(getattr(c, f), getattr(batch_recovery, f), raw)
        same(getattr(c, f), getattr(batch_recovery, f), junk)


def test_message_runs_are_a_produces_messages() -> None:
    rows = b"".join(MROW_FMT.pack(seq, 0, 0, 40, th, 0, 0, rtype, 0) for seq, th, rtype in
                    [(5, 7, 1), (6, 7, 1), (7, 8, 1), (9, 8, 1), (10, 8, 2), (11, 8, 1), (12, 8, 1), (2**64 - 1, 8, 1), (0, 8, 1)])
    assert struct.unpack("<12I", c.message_runs(rows)) == (0, 2, 2, 3, 3, 4, 5, 7, 7, 8, 8, 9)
    assert c.census(rows) == {(1, 7): (2, 0), (1, 8): (6, 2), (2, 8): (1, 4)}


# ---------------------------------------------------------------------------------- unit_prevs
@SETTINGS
@given(st.lists(st.tuples(st.sampled_from([UNIT_SIZE, 0, 7]), st.integers(-3, 600), st.integers(0, 9),
                          st.integers(-2, 5)), max_size=12),
       st.integers(0, 400).map(lambda k: k * UNIT_SIZE), st.binary(max_size=3))
def test_unit_prevs(units: list[tuple[int, int, int, int]], pos: int, junk: bytes) -> None:
    buf = b"".join(UNIT.pack(size, prev, magic, 0, 0, off, 0, 0, 0) for size, prev, magic, off in units)
    same(c.unit_prevs, timerlog.unit_prevs, buf, pos)
    same(c.unit_prevs, timerlog.unit_prevs, buf + junk, pos)  # not whole units: an error
    same(c.unit_prevs, timerlog.unit_prevs, buf, -UNIT_SIZE)


def test_unit_prevs_marks_what_is_not_sound() -> None:
    good = UNIT.pack(UNIT_SIZE, NO_POS, 1, 0, 0, 5, 0, 0, 0)
    ahead = UNIT.pack(UNIT_SIZE, UNIT_SIZE, 1, 0, 0, 5, 0, 0, 0)  # prev_pos at or after itself
    assert struct.unpack("<3q", c.unit_prevs(good + ahead + good, 0)) == (NO_POS, DAMAGED, NO_POS)


# ---------------------------------------------------------------------------------- strip_slots
@st.composite
def strip_case(draw: Any) -> tuple[bytearray, int, bytes]:
    """A wheel of 8 slots whose chains run through a tail of units from `pos` on (sound chains,
    chains into damage, slots before pos, garbage), and that tail's prev_positions."""
    pos = draw(st.integers(0, 4)) * UNIT_SIZE
    ntail = draw(st.integers(0, 12))
    prevs = [draw(st.sampled_from([NO_POS, DAMAGED]) | st.integers(-1, pos // UNIT_SIZE + i).map(lambda k: k * UNIT_SIZE)
                  | st.integers(-100, 10_000)) for i in range(ntail)]
    wheel = bytearray(HEADER)
    for _ in range(8):
        last = draw(st.integers(-1, pos // UNIT_SIZE + ntail + 1).map(lambda k: k * UNIT_SIZE) | st.integers(-5, 2000))
        wheel += SLOT.pack(draw(st.integers(0, 10**6)), draw(st.integers(-1, 500)), last,
                           draw(st.integers(-3, 20)), draw(st.integers(0, 7)))
    return wheel, pos, struct.pack(f"<{ntail}q", *prevs)


@SETTINGS
@given(strip_case())
def test_strip_slots(case: tuple[bytearray, int, bytes]) -> None:
    wheel, pos, tail = case
    w_c, w_ref = bytearray(wheel), bytearray(wheel)
    assert c.strip_slots(w_c, HEADER, pos, tail) == timerindex.strip_slots(w_ref, HEADER, pos, tail)
    assert w_c == w_ref


@SETTINGS
@given(st.binary(max_size=120), st.integers(-40, 140), st.integers(-60, 200), st.binary(max_size=20))
def test_strip_slots_takes_any_bytes(wheel: bytes, header: int, pos: int, tail: bytes) -> None:
    w_c, w_ref = bytearray(wheel), bytearray(wheel)
    same(lambda *a: c.strip_slots(w_c, *a), lambda *a: timerindex.strip_slots(w_ref, *a), header, pos, tail)
    assert w_c == w_ref


def test_strip_slots_cuts_chains_at_pos() -> None:
    """Slot A: units 0 (before pos) and 2, 3 after it; slot B: units 1 and 4, both after it... of
    which unit 4's prev is damaged."""
    pos = UNIT_SIZE
    tail = struct.pack("<4q", NO_POS, 0, 2 * UNIT_SIZE, DAMAGED)  # units 1, 2, 3, 4
    wheel = bytearray(HEADER) + SLOT.pack(1000, 0, 3 * UNIT_SIZE, 3, 1) + SLOT.pack(2000, UNIT_SIZE, UNIT_SIZE, 1, 1)
    assert c.strip_slots(wheel, HEADER, pos, tail) == (3, None)
    assert SLOT.unpack_from(wheel, HEADER) == (1000, 0, 0, 1, 1)  # unit 0 is left
    assert SLOT.unpack_from(wheel, HEADER + 32) == (0, NO_POS, NO_POS, 0, 0)
    broken = bytearray(HEADER) + SLOT.pack(3000, UNIT_SIZE, 4 * UNIT_SIZE, 2, 1)
    assert c.strip_slots(broken, HEADER, pos, tail) == (0, (3000, 4 * UNIT_SIZE))
    assert SLOT.unpack_from(broken, HEADER) == (3000, UNIT_SIZE, 4 * UNIT_SIZE, 2, 1)  # untouched


# ---------------------------------------------------------------------------------- bad_slots
POSITIONS = st.integers(-1, 12).map(lambda k: k * UNIT_SIZE) | st.integers(-60, 700)


@SETTINGS
@given(st.lists(st.tuples(st.integers(-2, 5).map(lambda k: k * 1000) | st.integers(-2000, 5000), POSITIONS, POSITIONS,
                          st.integers(-3, 5), st.integers(0, 7)), max_size=10),
       st.sampled_from([1, 10, 1000]) | st.integers(-3, 1000), st.sampled_from([0, UNIT_SIZE]) | st.integers(0, 400),
       st.integers(0, 700), st.binary(max_size=40))
def test_bad_slots(slots: list[tuple[int, int, int, int, int]], precision: int, start: int, end: int,
                   junk: bytes) -> None:
    wheel = bytes(HEADER) + b"".join(SLOT.pack(*f) for f in slots)
    same(c.bad_slots, timerindex.bad_slots, wheel, HEADER, precision, start, end)
    same(c.bad_slots, timerindex.bad_slots, wheel + junk, HEADER, precision, start, end)
    same(c.bad_slots, timerindex.bad_slots, junk, len(junk) // 2, 1000, start, end)


def test_bad_slots_names_each_kind_of_damage() -> None:
    good = SLOT.pack(2000, 52, 104, 2, 1) + SLOT.pack(3000, 104, 104, 1, 1)
    damaged = [SLOT.pack(2000, 52, 104, -1, 1), SLOT.pack(2001, 52, 104, 2, 1), SLOT.pack(2000, 52, 105, 2, 1),
               SLOT.pack(2000, 52, 520, 2, 1), SLOT.pack(2000, 0, 104, 2, 1), SLOT.pack(2000, 156, 104, 2, 1)]
    empty = SLOT.pack(2001, -7, 3, 0, 0)  # (num 0: not looked at)
    wheel = bytes(HEADER) + good + empty + b"".join(damaged)
    assert c.bad_slots(wheel, HEADER, 1000, 52, 520) == len(damaged)
