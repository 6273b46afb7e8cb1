"""The batch core's recovery loops in Python: the reference of storage/batch_recovery.c's
`restore_states`, `message_runs` and `census` (its `unit_prevs` is referenced in storage/timerlog.py,
its `strip_slots` and `bad_slots` in storage/timerindex.py, beside what they work on). storage/batch.py says
how a reference and the compiled core relate; `batch.ops` is the one in use. Recovery
(storage/recovery.py) runs them over the MessageRows of the commit log past the checkpoint.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence

from delayd.storage.batch_common import MROW_FMT, SpanLike, require, span_entry, touch
from delayd.storage.commitlog import RecordType
from delayd.storage.msgtable import ENTRY, MessageState

MROW = MROW_FMT.size
_MESSAGE, _CANCEL, _ROLL, _GROUP = (int(t) for t in (RecordType.MESSAGE, RecordType.CANCEL, RecordType.ROLL,
                                                     RecordType.GROUP))
_SCHEDULED, _DELIVERED, _CANCELLED = int(MessageState.SCHEDULED), int(MessageState.DELIVERED), \
    int(MessageState.CANCELLED)


def restore_states(rows: bytes, spans: Sequence[SpanLike], restore: bool) -> tuple[int, bytes]:
    """Recovery's pass over MessageRows (storage/recovery.py `_restore_state`, for the rows whose
    entries the spans hold): with `restore`, a MESSAGE row makes an UNKNOWN entry SCHEDULED at
    its record, a ROLL row makes an UNKNOWN or SCHEDULED entry of a roll count not above its own
    SCHEDULED at the copy, a CANCEL row makes an entry neither DELIVERED nor CANCELLED
    CANCELLED. (the rows' highest seq + 1, or 0; the u32 indexes of the rows left to the
    caller, in order: GROUP rows, and with `restore` the MESSAGE, ROLL and CANCEL rows of seqs
    no span holds.)"""
    require(len(rows) % MROW == 0, "rows")
    top = 0
    left = []
    for k, (seq, _due, offset, size, _th, _tag, roll, rtype, _flags) in enumerate(MROW_FMT.iter_unpack(rows)):
        top = max(top, seq + 1)
        if rtype == _GROUP:
            left.append(k)
        if not restore or rtype not in (_MESSAGE, _ROLL, _CANCEL):
            continue
        hit = span_entry(spans, seq)
        if hit is None:
            left.append(k)
            continue
        span, at, _readable = hit
        state, _f, held_roll, _s, _o = ENTRY.unpack_from(span.buf, at)
        if at + ENTRY.size > span.valid or state > _CANCELLED:
            state, held_roll = 0, 0  # (UNKNOWN, as MessageTable.get reads it)
        if rtype == _MESSAGE and state == 0 or rtype == _ROLL and state in (0, _SCHEDULED) and roll >= held_roll:
            ENTRY.pack_into(span.buf, at, _SCHEDULED, 0, roll if rtype == _ROLL else 0, size, offset)
            touch(span, at, at + ENTRY.size)
        elif rtype == _CANCEL and state not in (_DELIVERED, _CANCELLED):
            span.buf[at] = _CANCELLED
            touch(span, at, at + 1)
    return top, struct.pack(f"<{len(left)}I", *left)


def message_runs(rows: bytes) -> bytes:
    """The runs of MESSAGE rows that a produce appended together: consecutive rows of one topic
    hash whose seqs follow one another, as u32 pairs (first row, row after the last), in order.
    (Recovery queues the keys of each run as that produce did: KeyIndex.put_run.)"""
    require(len(rows) % MROW == 0, "rows")
    out: list[int] = []
    prev: tuple[int, int] | None = None  # (seq, topic hash) of a MESSAGE row just before
    for k, (seq, _due, _off, _size, th, _tag, _roll, rtype, _flags) in enumerate(MROW_FMT.iter_unpack(rows)):
        if rtype != _MESSAGE:
            prev = None
            continue
        if prev is not None and seq == prev[0] + 1 and th == prev[1]:
            out[-1] = k + 1
        else:
            out += [k, k + 1]
        prev = (seq, th)
    return struct.pack(f"<{len(out)}I", *out)


def census(rows: bytes) -> dict[tuple[int, int], tuple[int, int]]:
    """{(record type, topic hash): (rows, the first one's index)} of MessageRows."""
    require(len(rows) % MROW == 0, "rows")
    out: dict[tuple[int, int], tuple[int, int]] = {}
    for k, (_seq, _due, _off, _size, th, _tag, _roll, rtype, _flags) in enumerate(MROW_FMT.iter_unpack(rows)):
        n, first = out.get((rtype, th), (0, k))
        out[(rtype, th)] = (n + 1, first)
    return out
