/*
 * The timer stages in delayd.storage._batch: enqueue-get (scan the commit log into MessageRows),
 * enqueue-put (TimerLog units and wheel slots), dequeue-get (walk a slot's chain) and
 * dequeue-get-message (which units are live, and their DueRows).
 */
#include "batch_core.h"

/* ------------------------------------------------------------------------------------------ */
/* scan: decode a buffer of commit-log records into MessageRows                                */

/* scan_rows(buf, base_offset, verify, max_records) -> (rows, consumed, outcome)
 * Decode whole records from the start of `buf` (at commit-log offset base_offset) into
 * MessageRows until max_records, the end of the buffer, or a record that does not check out.
 * `consumed` is the bytes of the records decoded; `outcome` says why it stopped there (0: end of
 * buffer or max_records, 1: torn, 2: corrupt, 3: newer/unknown version) — the caller decides
 * whether that is a chunk boundary, a torn tail or damage to resync past (CommitLog.scan). */
PyObject *scan_rows(PyObject *self, PyObject *args) {
    PyObject *buf_o;
    long long base;
    int verify;
    Py_ssize_t max_records;
    if (!PyArg_ParseTuple(args, "OLpn", &buf_o, &base, &verify, &max_records)) return NULL;
    Buf b;
    if (buf_get(buf_o, &b, 0, "buf") < 0) return NULL;
    Out o = {0};
    const uint8_t *buf = b.view.buf;
    size_t n = (size_t)b.view.len, i = 0;
    Py_ssize_t count = 0;
    int outcome = SCAN_OK;
    while (i < n && count < max_records) {
        uint32_t len = 0;
        int c = check_record(buf, n, i, verify, &len);
        if (c != SCAN_OK) { outcome = c; break; }
        const uint8_t *r = buf + i;
        uint8_t *w = out_take(&o, MROW);
        if (!w) { buf_release(&b); out_free(&o); return NULL; }
        size_t tl = r[38], gl = r[39];
        wr64(w, rd64(r + 12));
        wri64(w + 8, rdi64(r + 20));
        wri64(w + 16, base + (int64_t)i);
        wr32(w + 24, len);
        wr32(w + 28, crc32_update(0, r + RECORD_HEADER, tl));
        wr32(w + 32, tag_hash(r + RECORD_HEADER + tl, gl));
        wr16(w + 36, rd16(r + 36));
        w[38] = r[9];
        w[39] = rd16(r + 40) ? ROW_KEYED : 0;
        i += len;
        count++;
    }
    buf_release(&b);
    PyObject *rows = out_bytes(&o);
    if (!rows) return NULL;
    return Py_BuildValue("(Nni)", rows, (Py_ssize_t)i, outcome);
}

/* scan_starts(buf, start, verify) -> (starts, end, batch_end, stop)
 * commitlog.scan_buffer's loop: the whole, valid records from buf[start:] up to the first that is
 * not. `starts`: each record's position (i64); `end`: where the run ends; `batch_end`: where its
 * last complete atomic batch ends (a record without CONTINUED closes one); `stop`: 0 END (the
 * buffer ends on a record boundary), 1 CUT (less than a header left), 2 DAMAGED (a CRC mismatch),
 * 3 CHECK (the frame or layout is off: the caller's decode() says whether the record is cut,
 * damaged or of a newer version). */
PyObject *scan_starts(PyObject *self, PyObject *args) {
    PyObject *buf_o;
    Py_ssize_t start;
    int verify;
    if (!PyArg_ParseTuple(args, "Onp", &buf_o, &start, &verify)) return NULL;
    Buf b;
    if (buf_get(buf_o, &b, 0, "buf") < 0) return NULL;
    const uint8_t *buf = b.view.buf;
    Py_ssize_t n = b.view.len;
    if (start < 0 || start > n) { buf_release(&b); PyErr_SetString(PyExc_IndexError, "start"); return NULL; }
    Out o = {0};
    Py_ssize_t pos = start, batch_end = start;
    int stop = 0;
    while (pos <= n - RECORD_HEADER) {
        const uint8_t *r = buf + pos;
        uint32_t len = rd32(r);
        uint64_t fields = (uint64_t)RECORD_HEADER + r[38] + r[39] + rd16(r + 40) + rd16(r + 42) + rd32(r + 44);
        if (r[8] != RECORD_VERSION || len != fields || len > MAX_RECORD || r[9] < REC_MESSAGE || r[9] > REC_RELEASE ||
            (Py_ssize_t)len > n - pos) {
            stop = 3;
            break;
        }
        if (verify && crc32_update(0, r + 8, len - 8) != rd32(r + 4)) { stop = 2; break; }
        uint8_t *w = out_take(&o, 8);
        if (!w) { buf_release(&b); return NULL; }
        wri64(w, pos);
        pos += len;
        if (!(rd16(r + 10) & FLAG_CONTINUED)) batch_end = pos;
    }
    if (stop == 0 && pos < n) stop = 1;
    buf_release(&b);
    PyObject *starts = out_bytes(&o);
    if (!starts) return NULL;
    return Py_BuildValue("(Nnni)", starts, pos, batch_end, stop);
}

/* ------------------------------------------------------------------------------------------ */
/* enqueue-put: TimerLog units and wheel slots for a batch of MessageRows                      */

typedef struct {
    int64_t first, last;
    int32_t num;
    uint32_t magic;
} SlotState;

/* Messages due at random times read a wheel slot each at a random place of the mapped wheel
 * (2 days of 1 s slots: 5.5 MB), and that read was most of index_rows' time (perf: 87 % of it,
 * batches of 1,000 due over 1-48 h); the slot of the row IR_AHEAD on is fetched ahead. */
#define IR_AHEAD 16

/* index_rows(rows, start, spans, wheel, header_size, precision, nslots, load_time,
 *            window_end, unsafe_from, tlog_pos, now_ms, max_units)
 *   -> (consumed, units, slots, late, counts, far, near)
 *
 * enqueue-put for MessageRows[start:], in order, as storage.batch.index_rows specifies: a GROUP
 * record is consumed with nothing to index; a MESSAGE whose table entry is SCHEDULED at this
 * record and whose due time is inside the window (and whose slot may take a unit: fire before
 * `unsafe_from`) gets a DEFAULT unit — in its own slot, or, when that slot was already loaded
 * (due before `load_time`), in slot `load_time` plus a DueRow in `late` for dequeue-put; a MESSAGE
 * that is cancelled loses its schedule flags, one delivered or superseded is consumed as is. A
 * MESSAGE due beyond the window is parked far (RIP-43): a ROLL unit at its roll slot, `base + window
 * / 2` when it is due within a third of a window after the window's end, else `base + window` (base
 * = max(now_ms, load_time), window = window_end - base, which must be positive), flag FAR, and a
 * FarRow (deliver_at i64, seq u64, topic hash u32) in `far` for the caller's far index and hourly
 * counts. A ROLL record (a far message's roll copy) is current when its message is SCHEDULED and
 * the table points at it, or at an older record whose roll_count is not above the copy's (the
 * entry then moves to the copy, once its unit is sure to be made); it gets its unit as a MESSAGE
 * does, except that one still far makes no FarRow (it is in the far index) and one come inside
 * the window makes a FarRow in `near` (it leaves the far index); a stale one is consumed as is.
 * Anything else (cancel records, a full slot lap) stops the batch at that
 * row: `consumed` says how far it got and the caller's reference path takes the row. Units are
 * returned (not written): the caller appends them to the TimerLog and then applies `slots` (the
 * new state of every slot touched, 32-byte wheel slots) — units reach the file before any slot
 * points at them. `counts`: the wheel slot index (u32) of every message now counted in its slot,
 * for the caller to add to the schedule once the units are on file (a batch that fails and is
 * retried counts once: add_counts). The spans' flag bytes are updated in place. */
PyObject *index_rows(PyObject *self, PyObject *args) {
    PyObject *rows_o, *spans_o, *wheel_o;
    Py_ssize_t start, header_size, max_units;
    long long precision, nslots, load_time, window_end, unsafe_from, tlog_pos, now_ms;
    if (!PyArg_ParseTuple(args, "OnOOnLLLLLLLn", &rows_o, &start, &spans_o, &wheel_o, &header_size, &precision,
                          &nslots, &load_time, &window_end, &unsafe_from, &tlog_pos, &now_ms, &max_units))
        return NULL;
    if (precision <= 0 || nslots <= 0) { PyErr_SetString(PyExc_ValueError, "bad wheel geometry"); return NULL; }
    Buf rb = {.held = 0}, wb = {.held = 0};
    Spans sp = {0};
    Out units = {0}, late = {0}, incs = {0}, far = {0}, near = {0};
    Map slots = {0};
    SlotState *states = NULL;
    int64_t *slot_times = NULL;
    PyObject *res = NULL;
    if (buf_get(rows_o, &rb, 0, "rows") < 0 || buf_get(wheel_o, &wb, 0, "wheel") < 0 || spans_get(spans_o, &sp) < 0)
        goto done;
    if (rb.view.len % MROW || header_size < 0 || wb.view.len < header_size + nslots * SLOT_SIZE) {
        PyErr_SetString(PyExc_ValueError, "rows or wheel have the wrong size");
        goto done;
    }
    Py_ssize_t nrows = rb.view.len / MROW;
    if (start < 0 || start > nrows) { PyErr_SetString(PyExc_IndexError, "start"); goto done; }
    if (map_init(&slots, 64) < 0) goto done;
    size_t state_cap = 64;
    states = PyMem_Malloc(state_cap * sizeof(SlotState));
    slot_times = PyMem_Malloc(state_cap * sizeof(int64_t));
    if (!states || !slot_times) { PyErr_NoMemory(); goto done; }
    const uint8_t *wheel = wb.view.buf;
    int64_t pos = tlog_pos;
    Py_ssize_t i = start, made = 0;
    for (; i < nrows && made < max_units; i++) {
        if (i + IR_AHEAD < nrows) {  /* the wheel slot a row ahead will read, fetched now (below) */
            const uint8_t *ahead = (const uint8_t *)rb.view.buf + (i + IR_AHEAD) * MROW;
            int64_t due = rdi64(ahead + 8), fire = due < load_time ? load_time : due;
            if ((ahead[38] == REC_MESSAGE || ahead[38] == REC_ROLL) && due <= window_end)
                __builtin_prefetch(wheel + header_size + fmod64(floordiv64(fire, precision), nslots) * SLOT_SIZE);
        }
        const uint8_t *row = (const uint8_t *)rb.view.buf + i * MROW;
        uint8_t type = row[38];
        if (type == REC_GROUP) continue;
        if (type != REC_MESSAGE && type != REC_ROLL) break;
        uint64_t seq = rd64(row);
        int64_t deliver_at = rdi64(row + 8), offset = rdi64(row + 16);
        Span *span;
        int readable;
        uint8_t *entry = span_entry(&sp, seq, &span, &readable);
        if (!entry) break;  /* not in the batch's spans: the reference path reads it */
        uint8_t state = readable ? entry[0] : ST_UNKNOWN;
        int64_t eoff = readable ? rdi64(entry + 8) : -1;
        Py_ssize_t at = entry - (uint8_t *)span->buf.view.buf;
        int moved = 0;  /* a roll copy the entry moves to */
        if (type == REC_ROLL) {
            if (state == ST_CANCELLED || state == ST_DELIVERED ||
                (state == ST_SCHEDULED && eoff != offset && rd16(row + 36) < rd16(entry + 2)))
                continue;
            if (state != ST_SCHEDULED) break;  /* UNKNOWN: the reference decides */
            moved = eoff != offset;
        } else if (state == ST_CANCELLED) {  /* never in the schedule */
            entry[1] = 0;
            span_touch(span, at + 1, at + 2);
            continue;
        } else if (state != ST_SCHEDULED || eoff != offset) {
            if (state == ST_DELIVERED || (state == ST_SCHEDULED && eoff != offset)) continue;
            break;  /* UNKNOWN: the reference decides */
        }
        int64_t fire;
        uint32_t magic = UNIT_DEFAULT;
        if (deliver_at > window_end) {  /* far: a ROLL unit at its roll slot */
            int64_t base = now_ms > load_time ? now_ms : load_time, window = window_end - base;
            if (window <= 0) break;  /* no window to roll in: the reference decides */
            fire = base + (deliver_at - window_end < window / 3 ? window / 2 : window);
            magic = UNIT_ROLL;
        } else {
            fire = deliver_at < load_time ? load_time : deliver_at;
        }
        if (fire >= unsafe_from) break;  /* the slot's previous lap is not dispatched yet */
        if (fire - now_ms > INT32_MAX || fire - now_ms < INT32_MIN) break;  /* delay is an i32 */
        int64_t st = fire - fmod64(fire, precision);
        if (moved) {  /* as MessageTable.set: state, flags 0, roll_count, size, offset */
            entry[0] = ST_SCHEDULED;
            entry[1] = 0;
            wr16(entry + 2, rd16(row + 36));
            wr32(entry + 4, rd32(row + 24));
            wri64(entry + 8, offset);
            span_touch(span, at, at + ENTRY_SIZE);
        }
        int ins;
        size_t ms = map_slot(&slots, (uint64_t)st, (int64_t)slots.n, &ins);
        if (ms == SIZE_MAX) goto done;
        if (ins) {
            size_t k = (size_t)slots.vals[ms];
            if (k >= state_cap) {
                state_cap *= 2;
                SlotState *ns = PyMem_Realloc(states, state_cap * sizeof(SlotState));
                if (!ns) { PyErr_NoMemory(); goto done; }
                states = ns;
                int64_t *nt = PyMem_Realloc(slot_times, state_cap * sizeof(int64_t));
                if (!nt) { PyErr_NoMemory(); goto done; }
                slot_times = nt;
            }
            const uint8_t *s = wheel + header_size + fmod64(floordiv64(st, precision), nslots) * SLOT_SIZE;
            SlotState *ss = &states[k];
            slot_times[k] = st;
            if (rdi64(s) == st && rdi32(s + 24) > 0) {
                ss->first = rdi64(s + 8); ss->last = rdi64(s + 16); ss->num = rdi32(s + 24); ss->magic = rd32(s + 28);
            } else {
                ss->first = NO_POS; ss->last = NO_POS; ss->num = 0; ss->magic = 0;
            }
        }
        SlotState *ss = &states[slots.vals[ms]];
        uint8_t *u = out_take(&units, UNIT_SIZE);
        if (!u) goto done;
        wr32(u, UNIT_SIZE);
        wri64(u + 4, ss->last);
        wr32(u + 12, magic);
        wri64(u + 16, now_ms);
        wri32(u + 24, (int32_t)(fire - now_ms));
        wri64(u + 28, offset);
        wr32(u + 36, rd32(row + 24));
        wr32(u + 40, rd32(row + 28));
        wr64(u + 44, seq);
        if (ss->num == 0) ss->first = pos;
        ss->last = pos;
        ss->num++;
        ss->magic |= magic;
        pos += UNIT_SIZE;
        made++;
        /* parked far now (a roll copy's message is in the far index already), or come near */
        int to_far = magic == UNIT_ROLL && type == REC_MESSAGE, to_near = magic != UNIT_ROLL && type == REC_ROLL;
        if (to_far || to_near) {
            uint8_t *f = out_take(to_far ? &far : &near, FAR_ROW);
            if (!f) goto done;
            wri64(f, deliver_at);
            wr64(f + 8, seq);
            wr32(f + 16, rd32(row + 28));
        }
        if (magic == UNIT_ROLL) {
            entry[1] = MT_FLAG_FAR;
        } else if (deliver_at >= load_time) {
            uint8_t *c = out_take(&incs, 4);
            if (!c) goto done;
            wr32(c, (uint32_t)fmod64(floordiv64(deliver_at, precision), nslots));
            entry[1] = MT_FLAG_SLOT;
        } else {
            entry[1] = 0;
            uint8_t *d = out_take(&late, DROW);
            if (!d) goto done;
            wri64(d, deliver_at);
            wr64(d + 8, seq);
            wri64(d + 16, offset);
            wr32(d + 24, rd32(row + 24));
            wr32(d + 28, rd32(row + 28));
            wr32(d + 32, rd32(row + 32));
            wr32(d + 36, row[39]);
            wri64(d + 40, st);
        }
        span_touch(span, at + 1, at + 2);
    }
    if (spans_commit(&sp) < 0) goto done;
    PyObject *slot_bytes = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)(slots.n * SLOT_SIZE));
    if (!slot_bytes) goto done;
    uint8_t *sb = (uint8_t *)PyBytes_AS_STRING(slot_bytes);
    for (size_t k = 0; k < slots.n; k++) {
        uint8_t *s = sb + k * SLOT_SIZE;
        wri64(s, slot_times[k]);
        wri64(s + 8, states[k].first);
        wri64(s + 16, states[k].last);
        wri32(s + 24, states[k].num);
        wr32(s + 28, states[k].magic);
    }
    PyObject *ub = out_bytes(&units), *lb = ub ? out_bytes(&late) : NULL, *cb = lb ? out_bytes(&incs) : NULL;
    PyObject *fb = cb ? out_bytes(&far) : NULL, *nb = fb ? out_bytes(&near) : NULL;
    if (!ub || !lb || !cb || !fb || !nb) {
        Py_XDECREF(ub); Py_XDECREF(lb); Py_XDECREF(cb); Py_XDECREF(fb); Py_XDECREF(nb); Py_DECREF(slot_bytes);
        goto done;
    }
    res = Py_BuildValue("(nNNNNNN)", i - start, ub, slot_bytes, lb, cb, fb, nb);
done:
    buf_release(&rb);
    buf_release(&wb);
    spans_release(&sp);
    out_free(&units);
    out_free(&late);
    out_free(&incs);
    out_free(&far);
    out_free(&near);
    map_free(&slots);
    PyMem_Free(states);
    PyMem_Free(slot_times);
    return res;
}

/* add_counts(counts, slot_indexes): counts[i] += 1 (i32) for every u32 index (index_rows'
 * `counts`, once its units are on file). An index out of range is an error, nothing added. */
PyObject *add_counts(PyObject *self, PyObject *args) {
    PyObject *c_o, *i_o;
    if (!PyArg_ParseTuple(args, "OO", &c_o, &i_o)) return NULL;
    Buf cb, ib;
    if (buf_get(c_o, &cb, 1, "counts") < 0) return NULL;
    if (buf_get(i_o, &ib, 0, "indexes") < 0) { buf_release(&cb); return NULL; }
    PyObject *res = NULL;
    Py_ssize_t n = ib.view.len / 4, slots = cb.view.len / 4;
    const uint8_t *ix = ib.view.buf;
    int ok = ib.view.len % 4 == 0 && cb.view.len % 4 == 0;
    for (Py_ssize_t k = 0; ok && k < n; k++) ok = rd32(ix + 4 * k) < (uint64_t)slots;
    if (!ok) {
        PyErr_SetString(PyExc_ValueError, "slot index out of range");
    } else {
        uint8_t *c = cb.view.buf;
        for (Py_ssize_t k = 0; k < n; k++) {
            uint8_t *p = c + 4 * (size_t)rd32(ix + 4 * k);
            wri32(p, rdi32(p) + 1);
        }
        res = Py_None;
        Py_INCREF(res);
    }
    buf_release(&cb);
    buf_release(&ib);
    return res;
}

/* put_slots(wheel, header_size, precision, nslots, slots): write 32-byte slots (from
 * index_rows) to their places in the mapped wheel. */
PyObject *put_slots(PyObject *self, PyObject *args) {
    PyObject *wheel_o, *slots_o;
    Py_ssize_t header_size;
    long long precision, nslots;
    if (!PyArg_ParseTuple(args, "OnLLO", &wheel_o, &header_size, &precision, &nslots, &slots_o)) return NULL;
    if (precision <= 0 || nslots <= 0) { PyErr_SetString(PyExc_ValueError, "bad wheel geometry"); return NULL; }
    Buf wb, sb;
    if (buf_get(wheel_o, &wb, 1, "wheel") < 0) return NULL;
    if (buf_get(slots_o, &sb, 0, "slots") < 0) { buf_release(&wb); return NULL; }
    PyObject *res = NULL;
    if (sb.view.len % SLOT_SIZE || wb.view.len < header_size + nslots * SLOT_SIZE) {
        PyErr_SetString(PyExc_ValueError, "slots or wheel have the wrong size");
    } else {
        const uint8_t *s = sb.view.buf;
        for (Py_ssize_t k = 0; k < sb.view.len / SLOT_SIZE; k++, s += SLOT_SIZE) {
            int64_t st = rdi64(s);
            memcpy((uint8_t *)wb.view.buf + header_size + fmod64(floordiv64(st, precision), nslots) * SLOT_SIZE, s, SLOT_SIZE);
        }
        res = Py_None;
        Py_INCREF(res);
    }
    buf_release(&wb);
    buf_release(&sb);
    return res;
}

/* ------------------------------------------------------------------------------------------ */
/* dequeue-get: walk a slot's chain                                                            */

typedef struct {
    PyObject_HEAD
    int64_t slot_time, precision, pos;
    Map deleted;
} Walker;

static int Walker_init(Walker *w, PyObject *args, PyObject *kw) {
    long long slot_time, precision, last_pos;
    if (!PyArg_ParseTuple(args, "LLL", &slot_time, &precision, &last_pos)) return -1;
    if (precision <= 0) { PyErr_SetString(PyExc_ValueError, "precision"); return -1; }
    w->slot_time = slot_time;
    w->precision = precision;
    w->pos = last_pos;
    map_free(&w->deleted);
    return map_init(&w->deleted, 8);
}

static void Walker_dealloc(Walker *w) {
    map_free(&w->deleted);
    Py_TYPE(w)->tp_free((PyObject *)w);
}

/* feed(buf, buf_pos, max_units) -> (units, outcome)
 * Walk the chain from the current position while its units lie inside `buf` (the TimerLog bytes
 * at position buf_pos), newest first, applying DELETE markers (always newer than their target):
 * UnitRows (pos + the 52 unit bytes) of the live units, at most max_units of them. `outcome`: 0
 * the chain ended, 1 more to come (`pos` is the next unit, outside `buf` or past max_units), 2
 * damage at `pos` (a unit that is not one, or one that belongs to another slot). */
static PyObject *Walker_feed(Walker *w, PyObject *args) {
    PyObject *buf_o;
    long long buf_pos;
    Py_ssize_t max_units;
    if (!PyArg_ParseTuple(args, "OLn", &buf_o, &buf_pos, &max_units)) return NULL;
    Buf b;
    if (buf_get(buf_o, &b, 0, "buf") < 0) return NULL;
    Out o = {0};
    int outcome = 1;
    Py_ssize_t made = 0;
    const uint8_t *buf = b.view.buf;
    int64_t end = buf_pos + b.view.len;
    while (1) {
        if (w->pos == NO_POS) { outcome = 0; break; }
        if (made >= max_units || w->pos < buf_pos || w->pos + UNIT_SIZE > end) { outcome = 1; break; }
        const uint8_t *u = buf + (w->pos - buf_pos);
        int64_t prev = rdi64(u + 4), enq = rdi64(u + 16), off = rdi64(u + 28);
        uint32_t magic = rd32(u + 12);
        int32_t delay = rdi32(u + 24);
        if (rd32(u) != UNIT_SIZE || prev >= w->pos || prev < NO_POS || magic == 0 || magic >= 8 || off < 0) {
            outcome = 2;
            break;
        }
        int64_t fire = enq + delay;
        if (fire - fmod64(fire, w->precision) != w->slot_time) { outcome = 2; break; }
        uint64_t seq = rd64(u + 44);
        if (magic & UNIT_DELETE) {
            int ins;
            if (map_slot(&w->deleted, seq, 0, &ins) == SIZE_MAX) { buf_release(&b); out_free(&o); return NULL; }
        } else if (!map_has(&w->deleted, seq)) {
            uint8_t *r = out_take(&o, UROW);
            if (!r) { buf_release(&b); return NULL; }
            wri64(r, w->pos);
            memcpy(r + 8, u, UNIT_SIZE);
            made++;
        }
        w->pos = prev;
    }
    buf_release(&b);
    PyObject *units = out_bytes(&o);
    if (!units) return NULL;
    return Py_BuildValue("(Ni)", units, outcome);
}

static PyObject *Walker_get_pos(Walker *w, void *closure) { return PyLong_FromLongLong(w->pos); }

static PyMethodDef Walker_methods[] = {
    {"feed", (PyCFunction)Walker_feed, METH_VARARGS, "walk the chain through one window of TimerLog bytes"},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef Walker_getset[] = {
    {"pos", (getter)Walker_get_pos, NULL, "the next unit to read (-1: the chain ended)", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

PyTypeObject WalkerType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "delayd.storage._batch.Walker",
    .tp_basicsize = sizeof(Walker),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Walker(slot_time, precision, last_pos): one slot's chain, newest first",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Walker_init,
    .tp_dealloc = (destructor)Walker_dealloc,
    .tp_methods = Walker_methods,
    .tp_getset = Walker_getset,
};

/* ------------------------------------------------------------------------------------------ */
/* dequeue-get-message: units → dues                                                           */

/* classify(units, spans) -> (kinds, locations)
 * For each UnitRow: 0 drop (cancelled, delivered, unknown, or a stale unit of a message that
 * rolled since), 1 due (DEFAULT), 2 roll (ROLL): the message is SCHEDULED and the table points at
 * this unit's record. `locations` holds (offset i64, size u32) of the current record of every
 * live unit, in unit order — what the caller reads. */
PyObject *classify(PyObject *self, PyObject *args) {
    PyObject *units_o, *spans_o;
    if (!PyArg_ParseTuple(args, "OO", &units_o, &spans_o)) return NULL;
    Buf ub;
    Spans sp = {0};
    if (buf_get(units_o, &ub, 0, "units") < 0) return NULL;
    if (spans_get(spans_o, &sp) < 0) { buf_release(&ub); return NULL; }
    PyObject *kinds = NULL, *res = NULL;
    Out locs = {0};
    if (ub.view.len % UROW) { PyErr_SetString(PyExc_ValueError, "units"); goto done; }
    Py_ssize_t n = ub.view.len / UROW;
    kinds = PyBytes_FromStringAndSize(NULL, n);
    if (!kinds) goto done;
    uint8_t *k = (uint8_t *)PyBytes_AS_STRING(kinds);
    for (Py_ssize_t i = 0; i < n; i++) {
        const uint8_t *u = (const uint8_t *)ub.view.buf + i * UROW + 8;
        Span *span;
        int readable;
        uint8_t *e = span_entry(&sp, rd64(u + 44), &span, &readable);
        k[i] = 0;
        if (!e || !readable || e[0] != ST_SCHEDULED || rdi64(e + 8) != rdi64(u + 28)) continue;
        k[i] = (rd32(u + 12) & UNIT_ROLL) ? 2 : 1;
        uint8_t *l = out_take(&locs, 12);
        if (!l) goto done;
        wri64(l, rdi64(e + 8));
        wr32(l + 8, rd32(e + 4));
    }
    PyObject *lb = out_bytes(&locs);
    if (!lb) goto done;
    res = Py_BuildValue("(ON)", kinds, lb);
done:
    Py_XDECREF(kinds);
    out_free(&locs);
    buf_release(&ub);
    spans_release(&sp);
    return res;
}

/* The records of the units of one kind, for dues and roll_copies: `visit` gets each unit (past its
 * 8-byte position) and its record from `reads`, checked like commitlog.decode with CRC (its length
 * in `len`), and returns 0, or -1 with an error set. A unit whose record is not in `reads`
 * (outcome 0: the caller reads it itself) or does not check out (1 torn, 2 corrupt, 3 version)
 * goes into the returned list of problems, (unit index, outcome); NULL with an error set. */
typedef int (*UnitRecordVisit)(void *ctx, const uint8_t *u, const uint8_t *r, uint32_t len);

static PyObject *unit_records(PyObject *units_o, PyObject *kinds_o, PyObject *reads_o, uint8_t kind,
                              UnitRecordVisit visit, void *ctx) {
    Buf ub, kb;
    if (buf_get(units_o, &ub, 0, "units") < 0) return NULL;
    if (buf_get(kinds_o, &kb, 0, "kinds") < 0) { buf_release(&ub); return NULL; }
    Py_ssize_t nreads = 0;
    PyObject *problems = NULL;
    Read *reads = reads_get(reads_o, &nreads);
    if (!reads) goto fail;
    Py_ssize_t n = ub.view.len / UROW;
    if (ub.view.len % UROW || kb.view.len != n) { PyErr_SetString(PyExc_ValueError, "units/kinds"); goto fail; }
    problems = PyList_New(0);
    if (!problems) goto fail;
    const uint8_t *kinds = kb.view.buf;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (kinds[i] != kind) continue;
        const uint8_t *u = (const uint8_t *)ub.view.buf + i * UROW + 8;
        int outcome;
        uint32_t len = 0;
        const uint8_t *r = record_in(reads, nreads, rdi64(u + 28), rd32(u + 36), &outcome, &len);
        if (!r || outcome) {
            PyObject *p = Py_BuildValue("(ni)", i, r ? outcome : 0);
            if (!p || PyList_Append(problems, p) < 0) { Py_XDECREF(p); goto fail; }
            Py_DECREF(p);
            continue;
        }
        if (visit(ctx, u, r, len) < 0) goto fail;
    }
    goto done;
fail:
    Py_CLEAR(problems);
done:
    reads_release(reads, nreads);
    buf_release(&ub);
    buf_release(&kb);
    return problems;
}

typedef struct {
    Out o;
    int64_t slot_time;
} DuesCtx;

static int due_of(void *ctx, const uint8_t *u, const uint8_t *r, uint32_t len) {
    DuesCtx *c = ctx;
    size_t tl = r[38], gl = r[39];
    uint8_t *d = out_take(&c->o, DROW);
    if (!d) return -1;
    wri64(d, rdi64(r + 20));
    wr64(d + 8, rd64(r + 12));
    wri64(d + 16, rdi64(u + 28));
    wr32(d + 24, len);
    wr32(d + 28, crc32_update(0, r + RECORD_HEADER, tl));
    wr32(d + 32, tag_hash(r + RECORD_HEADER + tl, gl));
    wr32(d + 36, rd16(r + 40) ? ROW_KEYED : 0);
    wri64(d + 40, c->slot_time);
    return 0;
}

/* dues(units, kinds, reads, slot_time) -> (dues, problems)
 * The DueRows of the units classified 1, from their records (unit_records): deliver_at, seq,
 * offset and size from the record, the topic hash and tag hash of its topic and tag, the keyed
 * bit. `problems` as unit_records gives them. */
PyObject *dues(PyObject *self, PyObject *args) {
    PyObject *units_o, *kinds_o, *reads_o;
    DuesCtx c = {.o = {0}};
    if (!PyArg_ParseTuple(args, "OOO!L", &units_o, &kinds_o, &PyList_Type, &reads_o, &c.slot_time)) return NULL;
    PyObject *problems = unit_records(units_o, kinds_o, reads_o, 1, due_of, &c), *res = NULL;
    if (problems) {
        PyObject *db = out_bytes(&c.o);
        res = db ? Py_BuildValue("(NN)", db, problems) : NULL;
        if (!db) Py_DECREF(problems);
    }
    out_free(&c.o);
    return res;
}

typedef struct {
    Out data, sizes;
} RollCtx;

static int roll_copy_of(void *ctx, const uint8_t *u, const uint8_t *r, uint32_t len) {
    RollCtx *c = ctx;
    uint8_t *copy = out_take(&c->data, len), *z = out_take(&c->sizes, 4);
    if (!copy || !z) return -1;
    memcpy(copy, r, len);  /* record_in checked that all `len` bytes are in the read */
    copy[9] = REC_ROLL;
    wr16(copy + 10, 0);
    uint16_t roll = rd16(copy + 36);
    wr16(copy + 36, roll == 0xFFFF ? roll : (uint16_t)(roll + 1));
    wr32(copy + 4, crc32_update(0, copy + 8, len - 8));
    wr32(z, len);
    return 0;
}

/* roll_copies(units, kinds, reads) -> (data, sizes, problems)
 * The roll copies of the units classified 2, packed back to back for one append (`sizes`: each
 * copy's length, u32), in unit order: the record (unit_records) again, with type ROLL, flags 0,
 * roll_count + 1 (it stays at 0xFFFF) and its CRC made anew. `problems` as in dues. */
PyObject *roll_copies(PyObject *self, PyObject *args) {
    PyObject *units_o, *kinds_o, *reads_o;
    if (!PyArg_ParseTuple(args, "OOO!", &units_o, &kinds_o, &PyList_Type, &reads_o)) return NULL;
    RollCtx c = {.data = {0}, .sizes = {0}};
    PyObject *problems = unit_records(units_o, kinds_o, reads_o, 2, roll_copy_of, &c), *res = NULL;
    if (problems) {
        PyObject *data = out_bytes(&c.data), *sizes = data ? out_bytes(&c.sizes) : NULL;
        res = sizes ? Py_BuildValue("(NNN)", data, sizes, problems) : NULL;
        if (!sizes) { Py_XDECREF(data); Py_DECREF(problems); }
    }
    out_free(&c.data);
    out_free(&c.sizes);
    return res;
}
