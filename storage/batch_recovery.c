/*
 * batch_recovery.c — recovery's per-record, per-unit and per-slot loops (storage/recovery.py after a
 * crash): the message table's entries restored from a chunk of MessageRows (`restore_states`), the
 * runs of messages whose keys are replayed (`message_runs`) and the rows counted by type and topic
 * (`census`), references in storage/batch_recovery.py; the prev_pos of the TimerLog units past the
 * checkpoint (`unit_prevs`, reference in storage/timerlog.py); the wheel's check (`bad_slots`) and
 * its slots walked back through those units (`strip_slots`), references in storage/timerindex.py.
 * A kill -9 under load leaves about a second's produce to redo; in Python these loops took most of
 * the restart (BENCHMARKS.md).
 */
#include "batch_core.h"

#define DAMAGED (-2)  /* storage/timerlog.py: no sound unit at that position */

/* restore_states(rows, spans, restore) -> (highest seq + 1 or 0, u32 indexes of rows left) */
PyObject *restore_states(PyObject *self, PyObject *args) {
    PyObject *rows_o, *spans_o;
    int restore;
    if (!PyArg_ParseTuple(args, "OOp", &rows_o, &spans_o, &restore)) return NULL;
    Buf rb;
    Spans sp = {0};
    Out left = {0};
    if (buf_get(rows_o, &rb, 0, "rows") < 0) return NULL;
    if (spans_get(spans_o, &sp) < 0) { buf_release(&rb); return NULL; }
    PyObject *res = NULL;
    if (rb.view.len % MROW) { PyErr_SetString(PyExc_ValueError, "rows"); goto done; }
    Py_ssize_t n = rb.view.len / MROW;
    const uint8_t *rows = rb.view.buf;
    uint64_t top = 0;
    int any = 0;
    for (Py_ssize_t k = 0; k < n; k++) {
        const uint8_t *r = rows + k * MROW;
        uint64_t seq = rd64(r);
        if (!any || seq > top) top = seq;
        any = 1;
        uint8_t rtype = r[38];
        int leave = rtype == REC_GROUP;
        if (restore && (rtype == REC_MESSAGE || rtype == REC_ROLL || rtype == REC_CANCEL)) {
            Span *span;
            int readable;
            uint8_t *e = span_entry(&sp, seq, &span, &readable);
            if (!e) {
                leave = 1;
            } else {
                Py_ssize_t at = e - (uint8_t *)span->buf.view.buf;
                /* (what MessageTable.get reads: the span's valid bytes grow with what was written) */
                Py_ssize_t valid = span->valid > span->hi ? span->valid : span->hi;
                uint8_t state = e[0];
                uint16_t held_roll = rd16(e + 2), roll = rd16(r + 36);
                if (at + ENTRY_SIZE > valid || state > ST_CANCELLED) state = ST_UNKNOWN, held_roll = 0;
                if ((rtype == REC_MESSAGE && state == ST_UNKNOWN) ||
                    (rtype == REC_ROLL && (state == ST_UNKNOWN || state == ST_SCHEDULED) && roll >= held_roll)) {
                    e[0] = ST_SCHEDULED;
                    e[1] = 0;
                    wr16(e + 2, rtype == REC_ROLL ? roll : 0);
                    wr32(e + 4, rd32(r + 24));
                    wr64(e + 8, rd64(r + 16));
                    span_touch(span, at, at + ENTRY_SIZE);
                } else if (rtype == REC_CANCEL && state != ST_DELIVERED && state != ST_CANCELLED) {
                    e[0] = ST_CANCELLED;
                    span_touch(span, at, at + 1);
                }
            }
        }
        if (leave) {
            if (out_reserve(&left, 4) < 0) goto done;
            wr32(left.p + left.n, (uint32_t)k);
            left.n += 4;
        }
    }
    if (spans_commit(&sp) < 0) goto done;
    PyObject *top_o = PyLong_FromUnsignedLongLong(any ? top : 0);
    if (top_o && any) {  /* + 1 as a Python int: the highest u64 seq has no u64 successor */
        PyObject *one = PyLong_FromLong(1), *sum = one ? PyNumber_Add(top_o, one) : NULL;
        Py_XDECREF(one);
        Py_SETREF(top_o, sum);
    }
    if (top_o) res = Py_BuildValue("(Ny#)", top_o, (const char *)(left.p ? left.p : (uint8_t *)""), (Py_ssize_t)left.n);
done:
    PyMem_Free(left.p);
    buf_release(&rb);
    spans_release(&sp);
    return res;
}

/* unit_prevs(buf, pos) -> bytes: each unit's prev_pos (native i64), DAMAGED where it is not sound */
PyObject *unit_prevs(PyObject *self, PyObject *args) {
    PyObject *buf_o;
    long long pos;
    if (!PyArg_ParseTuple(args, "OL", &buf_o, &pos)) return NULL;
    Buf b;
    if (buf_get(buf_o, &b, 0, "buf") < 0) return NULL;
    PyObject *res = NULL;
    if (b.view.len % UNIT_SIZE || pos < 0) {
        PyErr_Format(PyExc_ValueError, "unit_prevs: %zd bytes at %lld are not whole units", b.view.len, pos);
        goto done;
    }
    Py_ssize_t n = b.view.len / UNIT_SIZE;
    res = PyBytes_FromStringAndSize(NULL, n * 8);
    if (!res) goto done;
    uint8_t *out = (uint8_t *)PyBytes_AS_STRING(res);
    const uint8_t *u = b.view.buf;
    for (Py_ssize_t i = 0; i < n; i++, u += UNIT_SIZE) {
        /* timerlog.sound: size, NO_POS <= prev < the unit's position, 0 < magic < 8, offset >= 0 */
        int64_t prev = rdi64(u + 4), at = (int64_t)pos + (int64_t)i * UNIT_SIZE;
        uint32_t magic = rd32(u + 12);
        int ok = rd32(u) == UNIT_SIZE && prev >= NO_POS && prev < at && magic > 0 && magic < 8 && rdi64(u + 28) >= 0;
        wri64(out + 8 * i, ok ? prev : DAMAGED);
    }
done:
    buf_release(&b);
    return res;
}

/* strip_slots(wheel, header_size, pos, tail) -> (units unlinked, None or (slot_time, position)) */
PyObject *strip_slots(PyObject *self, PyObject *args) {
    PyObject *wheel_o, *tail_o;
    Py_ssize_t header;
    long long pos;
    if (!PyArg_ParseTuple(args, "OnLO", &wheel_o, &header, &pos, &tail_o)) return NULL;
    Buf wb, tb;
    if (buf_get(wheel_o, &wb, 1, "wheel") < 0) return NULL;
    if (buf_get(tail_o, &tb, 0, "tail") < 0) { buf_release(&wb); return NULL; }
    PyObject *res = NULL;
    if (header < 0 || header > wb.view.len || (wb.view.len - header) % SLOT_SIZE || pos < 0 || pos % UNIT_SIZE ||
        tb.view.len % 8) {
        PyErr_SetString(PyExc_ValueError, "strip_slots: wheel, header_size, pos or tail");
        goto done;
    }
    uint8_t *slots = (uint8_t *)wb.view.buf + header;
    Py_ssize_t nslots = (wb.view.len - header) / SLOT_SIZE;
    const uint8_t *prevs = tb.view.buf;
    uint64_t ntail = (uint64_t)(tb.view.len / 8);
    long long removed = 0;
    for (Py_ssize_t k = 0; k < nslots; k++) {
        uint8_t *s = slots + k * SLOT_SIZE;
        int64_t t = rdi64(s), first = rdi64(s + 8), last = rdi64(s + 16);
        int32_t num = rdi32(s + 24);
        if (num == 0 || last < pos) continue;
        long long n = 0;
        while (last != NO_POS && last >= pos) {
            uint64_t d = (uint64_t)(last - pos), i = d / UNIT_SIZE;
            int64_t prev = i < ntail ? rdi64(prevs + 8 * i) : DAMAGED;
            if (d % UNIT_SIZE || i >= ntail || prev == DAMAGED || prev >= last) {  /* (prev < last: the walk ends) */
                res = Py_BuildValue("(L(LL))", removed, (long long)t, (long long)last);
                goto done;
            }
            last = prev;
            n++;
        }
        removed += n;
        if (last == NO_POS || (long long)num - n <= 0) {
            wri64(s, 0);
            wri64(s + 8, NO_POS);
            wri64(s + 16, NO_POS);
            wri32(s + 24, 0);
            wr32(s + 28, 0);
        } else {
            wri64(s + 8, first);
            wri64(s + 16, last);
            wri32(s + 24, (int32_t)((long long)num - n));
        }
    }
    res = Py_BuildValue("(LO)", removed, Py_None);
done:
    buf_release(&tb);
    buf_release(&wb);
    return res;
}

/* message_runs(rows) -> bytes: (first row, row after the last) u32 pairs of the runs of MESSAGE
 * rows of one topic hash whose seqs follow one another */
PyObject *message_runs(PyObject *self, PyObject *arg) {
    Buf rb;
    Out out = {0};
    if (buf_get(arg, &rb, 0, "rows") < 0) return NULL;
    PyObject *res = NULL;
    if (rb.view.len % MROW) { PyErr_SetString(PyExc_ValueError, "rows"); goto done; }
    Py_ssize_t n = rb.view.len / MROW;
    const uint8_t *rows = rb.view.buf;
    int open = 0;  /* the row before was a MESSAGE row: its run may go on */
    uint64_t prev_seq = 0;
    uint32_t prev_th = 0;
    for (Py_ssize_t k = 0; k < n; k++) {
        const uint8_t *r = rows + k * MROW;
        if (r[38] != REC_MESSAGE) { open = 0; continue; }
        uint64_t seq = rd64(r);
        uint32_t th = rd32(r + 28);
        if (open && prev_seq != UINT64_MAX && seq == prev_seq + 1 && th == prev_th) {
            wr32(out.p + out.n - 4, (uint32_t)(k + 1));
        } else {
            if (out_reserve(&out, 8) < 0) goto done;
            wr32(out.p + out.n, (uint32_t)k);
            wr32(out.p + out.n + 4, (uint32_t)(k + 1));
            out.n += 8;
        }
        open = 1;
        prev_seq = seq;
        prev_th = th;
    }
    res = PyBytes_FromStringAndSize((const char *)(out.p ? out.p : (uint8_t *)""), (Py_ssize_t)out.n);
done:
    PyMem_Free(out.p);
    buf_release(&rb);
    return res;
}

/* census(rows) -> {(record type, topic hash): (rows, the first one's index)} */
PyObject *census(PyObject *self, PyObject *arg) {
    Buf rb;
    if (buf_get(arg, &rb, 0, "rows") < 0) return NULL;
    PyObject *out = NULL;
    if (rb.view.len % MROW) { PyErr_SetString(PyExc_ValueError, "rows"); goto done; }
    out = PyDict_New();
    if (!out) goto done;
    Py_ssize_t n = rb.view.len / MROW;
    const uint8_t *rows = rb.view.buf;
    for (Py_ssize_t k = 0; k < n;) {  /* runs of one (type, topic hash): a dict update per run, not per row */
        uint8_t rtype = rows[k * MROW + 38];
        uint32_t th = rd32(rows + k * MROW + 28);
        Py_ssize_t j = k + 1;
        while (j < n && rows[j * MROW + 38] == rtype && rd32(rows + j * MROW + 28) == th) j++;
        PyObject *key = Py_BuildValue("(iI)", (int)rtype, (unsigned int)th);
        PyObject *old = key ? PyDict_GetItemWithError(out, key) : NULL;
        long long count = j - k, first = k;
        if (old) {
            count += PyLong_AsLongLong(PyTuple_GET_ITEM(old, 0));
            first = PyLong_AsLongLong(PyTuple_GET_ITEM(old, 1));
        }
        PyObject *val = (key && !PyErr_Occurred()) ? Py_BuildValue("(LL)", count, first) : NULL;
        if (dict_set_owned(out, key, val) < 0) { Py_CLEAR(out); goto done; }
        k = j;
    }
done:
    buf_release(&rb);
    return out;
}

/* bad_slots(wheel, header_size, precision, start, end) -> the slots whose fields cannot be right */
PyObject *bad_slots(PyObject *self, PyObject *args) {
    PyObject *wheel_o;
    Py_ssize_t header;
    long long precision, start, end;
    if (!PyArg_ParseTuple(args, "OnLLL", &wheel_o, &header, &precision, &start, &end)) return NULL;
    Buf wb;
    if (buf_get(wheel_o, &wb, 0, "wheel") < 0) return NULL;
    PyObject *res = NULL;
    if (header < 0 || header > wb.view.len || (wb.view.len - header) % SLOT_SIZE || precision <= 0) {
        PyErr_SetString(PyExc_ValueError, "bad_slots: wheel, header_size or precision");
        goto done;
    }
    const uint8_t *slots = (const uint8_t *)wb.view.buf + header;
    Py_ssize_t nslots = (wb.view.len - header) / SLOT_SIZE;
    long long bad = 0;
    for (Py_ssize_t k = 0; k < nslots; k++) {
        const uint8_t *s = slots + k * SLOT_SIZE;
        int32_t num = rdi32(s + 24);
        if (num == 0) continue;
        int64_t t = rdi64(s), first = rdi64(s + 8), last = rdi64(s + 16);
        /* (a C remainder is 0 exactly where Python's is: the grid checks need no floor) */
        if (num < 0 || t % precision || last % UNIT_SIZE || last < start || last >= end || first < start || first > last)
            bad++;
    }
    res = PyLong_FromLongLong(bad);
done:
    buf_release(&wb);
    return res;
}
