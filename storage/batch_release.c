/*
 * dequeue-put in delayd.storage._batch: the heap of DueRows, the release into ready units and
 * message-table states; and the small batch helpers around the stages (runs of seqs for
 * message-table reads, lateness, histogram buckets, ready-unit bounds, tallies).
 */
#include "batch_core.h"

/* ------------------------------------------------------------------------------------------ */
/* dequeue-put: the DueRows held until due, by (deliver_at, seq), and the release             */

/* A push of RUN_MIN rows or more (a slot's chunk: 256 in a burst) is sorted once and kept as a
 * run; the runs' heads are a small heap of their own. A pop then sifts through a few thousand
 * heads that stay in cache, where one heap of a million 48-byte rows missed the cache at every
 * level (about 0.4 µs a row). Smaller pushes go to that heap of rows; a pop takes the smaller
 * of the two tops. The order is the reference's total order either way. */
#define RUN_MIN 32

typedef struct {
    int64_t t;          /* the head row's deliver_at and seq, inline: sifting reads no row */
    uint64_t seq;
    uint8_t *row, *end; /* the head row, and the end of the run */
    uint8_t *buf;       /* the run's rows (freed once they are all taken) */
} Run;

typedef struct {
    PyObject_HEAD
    uint8_t *rows;  /* heap of DueRows (small pushes) */
    Py_ssize_t n, cap;
    Run *runs;      /* heap of sorted runs, by head */
    Py_ssize_t nruns, runcap;
    Py_ssize_t held; /* rows in runs, not yet taken */
} DueHeap;

static inline int due_less(const uint8_t *a, const uint8_t *b) {
    int64_t ta = rdi64(a), tb = rdi64(b);
    if (ta != tb) return ta < tb;
    uint64_t sa = rd64(a + 8), sb = rd64(b + 8);
    if (sa != sb) return sa < sb;
    return memcmp(a, b, DROW) < 0;  /* a total order: the same rows come out the same way */
}

static int due_cmp(const void *a, const void *b) {
    if (due_less(a, b)) return -1;
    return due_less(b, a);
}

static inline int run_less(const Run *a, const Run *b) {
    if (a->t != b->t) return a->t < b->t;
    if (a->seq != b->seq) return a->seq < b->seq;
    return memcmp(a->row, b->row, DROW) < 0;
}

static inline void run_head(Run *r) {
    r->t = rdi64(r->row);
    r->seq = rd64(r->row + 8);
}

static void runs_sift_down(DueHeap *h, Py_ssize_t i) {
    Run r = h->runs[i];
    Py_ssize_t n = h->nruns;
    for (;;) {
        Py_ssize_t l = 2 * i + 1;
        if (l >= n) break;
        if (l + 1 < n && run_less(&h->runs[l + 1], &h->runs[l])) l++;
        if (!run_less(&h->runs[l], &r)) break;
        h->runs[i] = h->runs[l];
        i = l;
    }
    h->runs[i] = r;
}

static void DueHeap_dealloc(DueHeap *h) {
    for (Py_ssize_t k = 0; k < h->nruns; k++) PyMem_Free(h->runs[k].buf);
    PyMem_Free(h->runs);
    PyMem_Free(h->rows);
    Py_TYPE(h)->tp_free((PyObject *)h);
}

static int push_rows(DueHeap *h, const uint8_t *src, Py_ssize_t add) {
    if (h->n + add > h->cap) {
        Py_ssize_t cap = h->cap ? h->cap : 256;
        while (cap < h->n + add) cap *= 2;
        uint8_t *p = PyMem_Realloc(h->rows, (size_t)cap * DROW);
        if (!p) { PyErr_NoMemory(); return -1; }
        h->rows = p;
        h->cap = cap;
    }
    for (Py_ssize_t k = 0; k < add; k++) {
        /* The new row rises through a hole: one copy per level, not a swap. */
        const uint8_t *row = src + k * DROW;
        Py_ssize_t i = h->n++;
        while (i > 0) {
            Py_ssize_t parent = (i - 1) / 2;
            if (!due_less(row, h->rows + parent * DROW)) break;
            memcpy(h->rows + i * DROW, h->rows + parent * DROW, DROW);
            i = parent;
        }
        memcpy(h->rows + i * DROW, row, DROW);
    }
    return 0;
}

static int push_run(DueHeap *h, const uint8_t *src, Py_ssize_t add) {
    if (h->nruns == h->runcap) {
        Py_ssize_t cap = h->runcap ? h->runcap * 2 : 64;
        Run *p = PyMem_Realloc(h->runs, (size_t)cap * sizeof(Run));
        if (!p) { PyErr_NoMemory(); return -1; }
        h->runs = p;
        h->runcap = cap;
    }
    uint8_t *buf = PyMem_Malloc((size_t)add * DROW);
    if (!buf) { PyErr_NoMemory(); return -1; }
    memcpy(buf, src, (size_t)add * DROW);
    Py_ssize_t k = 1;
    while (k < add && !due_less(buf + k * DROW, buf + (k - 1) * DROW)) k++;
    static const SortKey by_due[] = {{0, 1}, {8, 0}};  /* deliver_at, seq; then due_cmp: the rest */
    if (k < add && sort_rows(buf, add, DROW, by_due, 2, due_cmp) < 0) {
        PyMem_Free(buf);
        return -1;
    }
    Run r = {0, 0, buf, buf + add * DROW, buf};
    run_head(&r);
    Py_ssize_t i = h->nruns++;
    while (i > 0) {
        Py_ssize_t parent = (i - 1) / 2;
        if (!run_less(&r, &h->runs[parent])) break;
        h->runs[i] = h->runs[parent];
        i = parent;
    }
    h->runs[i] = r;
    h->held += add;
    return 0;
}

/* push(dues): add DueRows. */
static PyObject *DueHeap_push(DueHeap *h, PyObject *arg) {
    Buf b;
    if (buf_get(arg, &b, 0, "dues") < 0) return NULL;
    if (b.view.len % DROW) { buf_release(&b); PyErr_SetString(PyExc_ValueError, "dues"); return NULL; }
    Py_ssize_t add = b.view.len / DROW;
    int rc = 0;
    if (add >= RUN_MIN) rc = push_run(h, b.view.buf, add);
    else if (add) rc = push_rows(h, b.view.buf, add);
    buf_release(&b);
    if (rc < 0) return NULL;
    Py_RETURN_NONE;
}

/* The heap of rows gives up its top: Floyd's pop, the hole at the root sinks along the smaller
 * children to a leaf (one comparison a level), then the last row rises from there. */
static void rows_pop(DueHeap *h) {
    h->n--;
    if (h->n == 0) return;
    const uint8_t *last = h->rows + h->n * DROW;
    Py_ssize_t i = 0, n = h->n;
    for (;;) {
        Py_ssize_t l = 2 * i + 1;
        if (l >= n) break;
        if (l + 1 < n && due_less(h->rows + (l + 1) * DROW, h->rows + l * DROW)) l++;
        memcpy(h->rows + i * DROW, h->rows + l * DROW, DROW);
        i = l;
    }
    while (i > 0) {
        Py_ssize_t parent = (i - 1) / 2;
        if (!due_less(last, h->rows + parent * DROW)) break;
        memcpy(h->rows + i * DROW, h->rows + parent * DROW, DROW);
        i = parent;
    }
    if (h->rows + i * DROW != last) memcpy(h->rows + i * DROW, last, DROW);
}

/* The first run gives up its head row. */
static void runs_pop(DueHeap *h) {
    Run *top = &h->runs[0];
    h->held--;
    top->row += DROW;
    if (top->row == top->end) {
        PyMem_Free(top->buf);
        *top = h->runs[--h->nruns];
        if (h->nruns == 0) return;
    } else {
        run_head(top);
        /* The row after it is read when this run comes up again: ask for it now (runs are
         * walked in step, each a row at a time, which no hardware prefetcher follows). */
        if (top->row + DROW < top->end) __builtin_prefetch(top->row + DROW);
    }
    runs_sift_down(h, 0);
}

/* The earliest row held, and whether it is a run's. */
static inline const uint8_t *due_first(DueHeap *h, int *in_run) {
    if (h->nruns == 0) { *in_run = 0; return h->n ? h->rows : NULL; }
    *in_run = h->n == 0 || due_less(h->runs[0].row, h->rows);
    return *in_run ? h->runs[0].row : h->rows;
}

/* pop(now_ms, max) -> dues: the DueRows due at or before now_ms, earliest first, at most max. */
static PyObject *DueHeap_pop(DueHeap *h, PyObject *args) {
    long long now;
    Py_ssize_t max;
    if (!PyArg_ParseTuple(args, "Ln", &now, &max)) return NULL;
    Out o = {0};
    for (Py_ssize_t got = 0; got < max; got++) {
        int in_run;
        const uint8_t *first = due_first(h, &in_run);
        if (first == NULL || rdi64(first) > now) break;
        uint8_t *d = out_take(&o, DROW);
        if (!d) { out_free(&o); return NULL; }
        memcpy(d, first, DROW);
        if (in_run) runs_pop(h);
        else rows_pop(h);
    }
    return out_bytes(&o);
}

/* next_due() -> int | None: the earliest deliver_at held. */
static PyObject *DueHeap_next(DueHeap *h, PyObject *unused) {
    int in_run;
    const uint8_t *first = due_first(h, &in_run);
    if (first == NULL) Py_RETURN_NONE;
    return PyLong_FromLongLong(rdi64(first));
}

static Py_ssize_t DueHeap_len(DueHeap *h) { return h->n + h->held; }

static PyMethodDef DueHeap_methods[] = {
    {"push", (PyCFunction)DueHeap_push, METH_O, "add DueRows"},
    {"pop", (PyCFunction)DueHeap_pop, METH_VARARGS, "take the DueRows due by now_ms, earliest first"},
    {"next_due", (PyCFunction)DueHeap_next, METH_NOARGS, "the earliest deliver_at held, or None"},
    {NULL, NULL, 0, NULL},
};

static PySequenceMethods DueHeap_seq = {.sq_length = (lenfunc)DueHeap_len};

PyTypeObject DueHeapType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "delayd.storage._batch.DueHeap",
    .tp_basicsize = sizeof(DueHeap),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "DueHeap(): DueRows ordered by (deliver_at, seq)",
    .tp_new = PyType_GenericNew,
    .tp_dealloc = (destructor)DueHeap_dealloc,
    .tp_methods = DueHeap_methods,
    .tp_as_sequence = &DueHeap_seq,
};

/* release_rows(dues, spans, now_ms) -> {topic_hash: (ready_units, seqs, keyed)}
 * dequeue-put's check and bookkeeping for a batch of DueRows: a message is released once, only
 * while SCHEDULED at the same record (a cancel that arrived meanwhile wins). Per topic hash: the
 * 40-byte ready-queue units (offset, size, tag_hash, deliver_at, released_at, seq), the u64
 * seqs released, and the (offset i64, size u32) records of those that have a key (the key index
 * marks them delivered: their records are read for the keys). Nothing is marked here: the caller appends each topic's units, then marks them
 * with mark_delivered (a full disk fails one topic without marking it). */
PyObject *release_rows(PyObject *self, PyObject *args) {
    PyObject *dues_o, *spans_o;
    long long now;
    if (!PyArg_ParseTuple(args, "OOL", &dues_o, &spans_o, &now)) return NULL;
    Buf db;
    Spans sp = {0};
    if (buf_get(dues_o, &db, 0, "dues") < 0) return NULL;
    if (spans_get(spans_o, &sp) < 0) { buf_release(&db); return NULL; }
    Map seen = {0}, topics = {0};
    Out *outs = NULL, *seqs = NULL, *keyed = NULL;
    uint32_t *topic_of = NULL;
    PyObject *res = NULL;
    Py_ssize_t n = db.view.len / DROW;
    if (db.view.len % DROW) { PyErr_SetString(PyExc_ValueError, "dues"); goto done; }
    if (map_init(&seen, (size_t)n) < 0 || map_init(&topics, 8) < 0) goto done;
    outs = PyMem_Calloc((size_t)n + 1, sizeof(Out));
    seqs = PyMem_Calloc((size_t)n + 1, sizeof(Out));
    keyed = PyMem_Calloc((size_t)n + 1, sizeof(Out));
    topic_of = PyMem_Calloc((size_t)n + 1, sizeof(uint32_t));
    if (!outs || !seqs || !keyed || !topic_of) { PyErr_NoMemory(); goto done; }
    for (Py_ssize_t i = 0; i < n; i++) {
        const uint8_t *d = (const uint8_t *)db.view.buf + i * DROW;
        uint64_t seq = rd64(d + 8);
        if (map_has(&seen, seq)) continue;
        Span *span;
        int readable;
        uint8_t *e = span_entry(&sp, seq, &span, &readable);
        if (!e || !readable || e[0] != ST_SCHEDULED || rdi64(e + 8) != rdi64(d + 16)) continue;
        int ins;
        if (map_slot(&seen, seq, 0, &ins) == SIZE_MAX) goto done;
        uint32_t th = rd32(d + 28);
        size_t t = map_slot(&topics, th, (int64_t)topics.n, &ins);
        if (t == SIZE_MAX) goto done;
        size_t k = (size_t)topics.vals[t];
        topic_of[k] = th;
        uint8_t *r = out_take(&outs[k], READY_UNIT), *s = r ? out_take(&seqs[k], 8) : NULL;
        if (!s) goto done;
        wri64(r, rdi64(d + 16));
        wr32(r + 8, rd32(d + 24));
        wr32(r + 12, rd32(d + 32));
        wri64(r + 16, rdi64(d));
        wri64(r + 24, now);
        wr64(r + 32, seq);
        wr64(s, seq);
        if (rd32(d + 36) & ROW_KEYED) {
            uint8_t *kl = out_take(&keyed[k], 12);
            if (!kl) goto done;
            wri64(kl, rdi64(d + 16));
            wr32(kl + 8, rd32(d + 24));
        }
    }
    res = PyDict_New();
    if (!res) goto done;
    for (size_t k = 0; k < topics.n; k++) {
        PyObject *key = PyLong_FromUnsignedLong(topic_of[k]);
        PyObject *a = out_bytes(&outs[k]), *b = out_bytes(&seqs[k]), *kd = out_bytes(&keyed[k]);
        PyObject *v = (a && b && kd) ? PyTuple_Pack(3, a, b, kd) : NULL;
        int bad = !key || !v || PyDict_SetItem(res, key, v) < 0;
        Py_XDECREF(key); Py_XDECREF(a); Py_XDECREF(b); Py_XDECREF(kd); Py_XDECREF(v);
        if (bad) { Py_CLEAR(res); goto done; }
    }
done:
    if (outs) for (Py_ssize_t i = 0; i <= n; i++) out_free(&outs[i]);
    if (seqs) for (Py_ssize_t i = 0; i <= n; i++) out_free(&seqs[i]);
    if (keyed) for (Py_ssize_t i = 0; i <= n; i++) out_free(&keyed[i]);
    PyMem_Free(outs);
    PyMem_Free(seqs);
    PyMem_Free(keyed);
    PyMem_Free(topic_of);
    map_free(&seen);
    map_free(&topics);
    buf_release(&db);
    spans_release(&sp);
    return res;
}

/* set_states(seqs, spans, state): the entries of u64 seqs take `state` (those in the spans;
 * returns how many were not, for the caller to write itself). */
PyObject *set_states(PyObject *self, PyObject *args) {
    PyObject *seqs_o, *spans_o;
    int state;
    if (!PyArg_ParseTuple(args, "OOi", &seqs_o, &spans_o, &state)) return NULL;
    if (state < 0 || state > 255) { PyErr_SetString(PyExc_ValueError, "state"); return NULL; }
    Buf sb;
    Spans sp = {0};
    if (buf_get(seqs_o, &sb, 0, "seqs") < 0) return NULL;
    if (spans_get(spans_o, &sp) < 0) { buf_release(&sb); return NULL; }
    PyObject *res = NULL;
    Py_ssize_t missing = 0;
    if (sb.view.len % 8) { PyErr_SetString(PyExc_ValueError, "seqs"); goto done; }
    for (Py_ssize_t i = 0; i < sb.view.len / 8; i++) {
        Span *span;
        int readable;
        uint8_t *e = span_entry(&sp, rd64((const uint8_t *)sb.view.buf + 8 * i), &span, &readable);
        if (!e) { missing++; continue; }
        e[0] = (uint8_t)state;
        Py_ssize_t at = e - (uint8_t *)span->buf.view.buf;
        span_touch(span, at, at + 1);
    }
    if (spans_commit(&sp) < 0) goto done;
    res = PyLong_FromSsize_t(missing);
done:
    buf_release(&sb);
    spans_release(&sp);
    return res;
}

/* ------------------------------------------------------------------------------------------ */
/* small batch helpers                                                                         */

/* seq_runs(seqs, segment_entries, gap, stride=8, at=0) -> list[(segment, lo, hi)]
 * The distinct u64 seqs, sorted, cut into runs of one message-table segment whose neighbours
 * are at most `gap` apart: each run is read with one pread (MessageTable.begin_runs). `seqs` is a
 * buffer of rows of `stride` bytes with the u64 seq `at` that offset in each (8, 0: plain u64s). */
static int cmp_u64(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

PyObject *seq_runs(PyObject *self, PyObject *args) {
    PyObject *o;
    unsigned long long per, gap;
    Py_ssize_t stride = 8, at = 0;
    if (!PyArg_ParseTuple(args, "OKK|nn", &o, &per, &gap, &stride, &at)) return NULL;
    if (per == 0) { PyErr_SetString(PyExc_ValueError, "segment_entries"); return NULL; }
    if (stride < 8 || at < 0 || at + 8 > stride) { PyErr_SetString(PyExc_ValueError, "stride/at"); return NULL; }
    Buf b;
    if (buf_get(o, &b, 0, "seqs") < 0) return NULL;
    if (b.view.len % stride) { buf_release(&b); PyErr_SetString(PyExc_ValueError, "seqs"); return NULL; }
    Py_ssize_t n = b.view.len / stride;
    uint64_t *s = PyMem_Malloc((size_t)(n ? n : 1) * 8);
    if (!s) { buf_release(&b); return PyErr_NoMemory(); }
    for (Py_ssize_t i = 0; i < n; i++) s[i] = rd64((const uint8_t *)b.view.buf + i * stride + at);
    buf_release(&b);
    int sorted = 1;
    for (Py_ssize_t i = 1; i < n && sorted; i++) sorted = s[i - 1] <= s[i];
    static const SortKey whole[] = {{0, 0}};
    if (!sorted && sort_rows((uint8_t *)s, n, 8, whole, 1, cmp_u64) < 0) { PyMem_Free(s); return NULL; }
    PyObject *out = PyList_New(0);
    Py_ssize_t i = 0;
    while (out && i < n) {
        uint64_t seg = s[i] / per;
        Py_ssize_t j = i + 1;
        while (j < n && s[j] / per == seg && s[j] - s[j - 1] <= gap) j++;
        PyObject *t = Py_BuildValue("(KKK)", seg, s[i] % per, s[j - 1] % per);
        if (!t || PyList_Append(out, t) < 0) { Py_XDECREF(t); Py_CLEAR(out); break; }
        Py_DECREF(t);
        i = j;
    }
    PyMem_Free(s);
    return out;
}

/* lateness(rows, stride, at, now_ms) -> bytes: now_ms - the i64 due time `at` that offset of every
 * row of `stride` bytes (i64 each): DueRows (48, 0) or ready-queue units (40, 16). */
PyObject *lateness(PyObject *self, PyObject *args) {
    PyObject *o;
    Py_ssize_t stride, at;
    long long now;
    if (!PyArg_ParseTuple(args, "OnnL", &o, &stride, &at, &now)) return NULL;
    if (stride < 8 || at < 0 || at + 8 > stride) { PyErr_SetString(PyExc_ValueError, "stride/at"); return NULL; }
    Buf b;
    if (buf_get(o, &b, 0, "rows") < 0) return NULL;
    if (b.view.len % stride) { buf_release(&b); PyErr_SetString(PyExc_ValueError, "rows"); return NULL; }
    Py_ssize_t n = b.view.len / stride;
    PyObject *out = PyBytes_FromStringAndSize(NULL, n * 8);
    if (out) {
        uint8_t *p = (uint8_t *)PyBytes_AS_STRING(out);
        for (Py_ssize_t i = 0; i < n; i++) wri64(p + 8 * i, now - rdi64((const uint8_t *)b.view.buf + i * stride + at));
    }
    buf_release(&b);
    return out;
}

/* bucket_counts(values, bounds) -> (counts, total): how many i64 `values` fall in each bucket
 * (value <= bounds[k], the first such k; the last count is past every bound: +Inf), and their
 * sum — a Prometheus histogram's observations of a whole batch at once. `bounds` ascending i64s. */
PyObject *bucket_counts(PyObject *self, PyObject *args) {
    PyObject *o, *bounds_o;
    if (!PyArg_ParseTuple(args, "OO", &o, &bounds_o)) return NULL;
    Buf b, bb;
    if (buf_get(o, &b, 0, "values") < 0) return NULL;
    if (buf_get(bounds_o, &bb, 0, "bounds") < 0) { buf_release(&b); return NULL; }
    PyObject *res = NULL;
    Py_ssize_t n = b.view.len / 8, nb = bb.view.len / 8;
    long long *counts = NULL;
    if (b.view.len % 8 || bb.view.len % 8) { PyErr_SetString(PyExc_ValueError, "values/bounds"); goto done; }
    for (Py_ssize_t k = 1; k < nb; k++)
        if (rdi64((const uint8_t *)bb.view.buf + 8 * k) < rdi64((const uint8_t *)bb.view.buf + 8 * (k - 1))) {
            PyErr_SetString(PyExc_ValueError, "bounds must ascend");
            goto done;
        }
    counts = PyMem_Calloc((size_t)nb + 1, sizeof(long long));
    if (!counts) { PyErr_NoMemory(); goto done; }
    long long total = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        int64_t v = rdi64((const uint8_t *)b.view.buf + 8 * i);
        Py_ssize_t lo = 0, hi = nb;  /* the first bound >= v */
        while (lo < hi) {
            Py_ssize_t mid = (lo + hi) / 2;
            if (rdi64((const uint8_t *)bb.view.buf + 8 * mid) < v) lo = mid + 1; else hi = mid;
        }
        counts[lo]++;
        total += v;
    }
    PyObject *list = PyList_New(nb + 1);
    if (!list) goto done;
    for (Py_ssize_t k = 0; k <= nb; k++) {
        PyObject *c = PyLong_FromLongLong(counts[k]);
        if (!c) { Py_DECREF(list); goto done; }
        PyList_SET_ITEM(list, k, c);
    }
    res = Py_BuildValue("(NL)", list, total);
done:
    PyMem_Free(counts);
    buf_release(&b);
    buf_release(&bb);
    return res;
}

/* unit_bounds(units) -> (lowest commit offset, latest release time) of packed 40-byte ready-queue
 * units (what ready-queue retention keeps per segment); (1 << 62, 0) for none. */
PyObject *unit_bounds(PyObject *self, PyObject *arg) {
    Buf b;
    if (buf_get(arg, &b, 0, "units") < 0) return NULL;
    if (b.view.len % READY_UNIT) { buf_release(&b); PyErr_SetString(PyExc_ValueError, "units"); return NULL; }
    int64_t lo = (int64_t)1 << 62, hi = 0;
    for (Py_ssize_t k = 0; k < b.view.len / READY_UNIT; k++) {
        const uint8_t *u = (const uint8_t *)b.view.buf + k * READY_UNIT;
        int64_t off = rdi64(u), rel = rdi64(u + 24);
        if (off < lo) lo = off;
        if (rel > hi) hi = rel;
    }
    buf_release(&b);
    return Py_BuildValue("(LL)", (long long)lo, (long long)hi);
}

/* tally(rows, stride, at) -> {value: count} of the i64 field `at` that offset in rows of `stride`
 * bytes (dequeue-put's in-flight accounting: DueRows per slot). */
PyObject *tally(PyObject *self, PyObject *args) {
    PyObject *o;
    Py_ssize_t stride, at;
    if (!PyArg_ParseTuple(args, "Onn", &o, &stride, &at)) return NULL;
    if (stride < 8 || at < 0 || at + 8 > stride) { PyErr_SetString(PyExc_ValueError, "stride/at"); return NULL; }
    Buf b;
    if (buf_get(o, &b, 0, "rows") < 0) return NULL;
    PyObject *out = NULL;
    if (b.view.len % stride) { PyErr_SetString(PyExc_ValueError, "rows"); goto done; }
    out = PyDict_New();
    if (!out) goto done;
    Py_ssize_t nrows = b.view.len / stride;
    for (Py_ssize_t k = 0; k < nrows;) {  /* runs of one value: a dict update per run, not per row */
        int64_t cur = rdi64((const uint8_t *)b.view.buf + k * stride + at);
        Py_ssize_t j = k + 1;
        while (j < nrows && rdi64((const uint8_t *)b.view.buf + j * stride + at) == cur) j++;
        PyObject *key = PyLong_FromLongLong(cur);
        PyObject *old = key ? PyDict_GetItemWithError(out, key) : NULL;
        long long add = (long long)(j - k) + (old ? PyLong_AsLongLong(old) : 0);
        PyObject *val = (key && !PyErr_Occurred()) ? PyLong_FromLongLong(add) : NULL;
        if (dict_set_owned(out, key, val) < 0) { Py_CLEAR(out); goto done; }
        k = j;
    }
done:
    buf_release(&b);
    return out;
}
