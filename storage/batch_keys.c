/*
 * The key filter's three batch functions (specified by storage/keyfilter.py, the reference, with
 * its byte table): filter_add, filter_maybe and filter_claim over a blocked Bloom filter held in a
 * bytearray.
 * A pair's hash is built from Python's own hash of the key and of the topic (cached by str
 * objects), so both implementations agree within a process; the filter is never stored.
 *
 * And the key index's write order (specified by storage/keyindex.py's key_order, the reference).
 */
#include "batch_core.h"

#define KF_BLOCK 64
#define KF_PROBES 6
#define KF_GOLDEN 0x9E3779B97F4A7C15ull

static inline uint64_t kf_mix(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* The filter's bytes (held as a writable export: the bytearray cannot be resized meanwhile), the
 * topic's part of every pair's hash, and the keys as a fast sequence. */
typedef struct {
    Buf bits;
    uint64_t nblocks, topic_part;
    PyObject *keys;
} KfArgs;

static int kf_open(PyObject *args, KfArgs *a) {
    PyObject *bo, *topic, *keys;
    a->bits.held = 0;
    a->keys = NULL;
    if (!PyArg_ParseTuple(args, "OOO", &bo, &topic, &keys)) return -1;
    if (!PyByteArray_Check(bo)) { PyErr_SetString(PyExc_TypeError, "bits: expected a bytearray"); return -1; }
    Py_ssize_t len = PyByteArray_GET_SIZE(bo);
    if (len == 0 || len % KF_BLOCK) {
        PyErr_Format(PyExc_ValueError, "bits: %zd bytes is not a whole number of %d-byte blocks", len, KF_BLOCK);
        return -1;
    }
    if (!PyUnicode_Check(topic)) { PyErr_SetString(PyExc_TypeError, "topic: expected a str"); return -1; }
    if (!PyList_Check(keys) && !PyTuple_Check(keys)) {
        PyErr_SetString(PyExc_TypeError, "keys: expected a list or a tuple");
        return -1;
    }
    Py_hash_t th = PyObject_Hash(topic);
    if (th == -1) return -1;
    if (buf_get(bo, &a->bits, 1, "bits") < 0) return -1;
    a->nblocks = (uint64_t)len / KF_BLOCK;
    a->topic_part = (uint64_t)th * KF_GOLDEN;
    Py_INCREF(keys);
    a->keys = keys;
    return 0;
}

static void kf_close(KfArgs *a) {
    buf_release(&a->bits);
    Py_XDECREF(a->keys);
}

/* The bit numbers (within the filter) of one pair. */
static inline void kf_places(const KfArgs *a, Py_hash_t kh, uint64_t place[KF_PROBES]) {
    uint64_t z = kf_mix((uint64_t)kh + a->topic_part);
    uint64_t base = (((z & 0xFFFFFFFFull) * a->nblocks) >> 32) * KF_BLOCK * 8;
    uint64_t w = kf_mix(z);
    for (int i = 0; i < KF_PROBES; i++) place[i] = base + ((w >> (9 * i)) & 511);
}

/* Keys are taken KF_AHEAD at a time: their blocks are hashed and prefetched first, then read or
 * set, so the cache misses of a batch's random blocks overlap instead of coming one by one. Each
 * key of a group is held until its group is done (a key's __hash__ may change the list). */
#define KF_AHEAD 16

typedef struct {
    uint64_t place[KF_AHEAD][KF_PROBES];
    PyObject *key[KF_AHEAD];  /* held; NULL: None, no block */
    Py_ssize_t n;             /* keys of the group */
    int failed;               /* an error is set (a hash, or filter_maybe's append): stop after the group */
} KfAhead;

/* Hash and prefetch keys [i, i + KF_AHEAD) of the filter's keys, as many as the list holds (its
 * size is asked before each). */
static void kf_ahead(const KfArgs *a, Py_ssize_t i, KfAhead *h, int write) {
    const uint8_t *bits = a->bits.view.buf;
    h->n = 0;
    h->failed = 0;
    while (h->n < KF_AHEAD && i + h->n < PySequence_Fast_GET_SIZE(a->keys)) {
        PyObject *key = PySequence_Fast_GET_ITEM(a->keys, i + h->n);
        if (key == Py_None) {
            h->key[h->n++] = NULL;
            continue;
        }
        Py_INCREF(key);
        Py_hash_t kh = PyObject_Hash(key);
        if (kh == -1) {
            Py_DECREF(key);
            h->failed = 1;
            return;
        }
        h->key[h->n] = key;
        uint64_t *place = h->place[h->n++];
        kf_places(a, kh, place);
        if (write) __builtin_prefetch(bits + (place[0] >> 3), 1);
        else __builtin_prefetch(bits + (place[0] >> 3), 0);
    }
}

static void kf_drop(KfAhead *h) {
    for (Py_ssize_t j = 0; j < h->n; j++) Py_XDECREF(h->key[j]);
    h->n = 0;
}

PyObject *filter_add(PyObject *self, PyObject *args) {
    KfArgs a;
    if (kf_open(args, &a) < 0) { kf_close(&a); return NULL; }
    uint8_t *bits = a.bits.view.buf;
    long long n = 0;
    KfAhead h;
    for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(a.keys); i += KF_AHEAD) {
        kf_ahead(&a, i, &h, 1);
        for (Py_ssize_t j = 0; j < h.n; j++) {  /* the keys before a failed one are added, as one by one */
            if (!h.key[j]) continue;
            for (int k = 0; k < KF_PROBES; k++) bits[h.place[j][k] >> 3] |= (uint8_t)(1u << (h.place[j][k] & 7));
            n++;
        }
        kf_drop(&h);
        if (h.failed) { kf_close(&a); return NULL; }
    }
    kf_close(&a);
    return PyLong_FromLongLong(n);
}

PyObject *filter_maybe(PyObject *self, PyObject *args) {
    KfArgs a;
    if (kf_open(args, &a) < 0) { kf_close(&a); return NULL; }
    const uint8_t *bits = a.bits.view.buf;
    PyObject *out = PyList_New(0);
    if (!out) { kf_close(&a); return NULL; }
    KfAhead h;
    for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(a.keys); i += KF_AHEAD) {
        kf_ahead(&a, i, &h, 0);
        for (Py_ssize_t j = 0; j < h.n && !h.failed; j++) {
            if (!h.key[j]) continue;
            int all = 1;
            for (int k = 0; k < KF_PROBES && all; k++) all = (bits[h.place[j][k] >> 3] >> (h.place[j][k] & 7)) & 1;
            if (all && PyList_Append(out, h.key[j]) < 0) h.failed = 1;
        }
        kf_drop(&h);
        if (h.failed) {
            Py_DECREF(out);
            kf_close(&a);
            return NULL;
        }
    }
    kf_close(&a);
    return out;
}

/* filter_claim: filter_maybe and filter_add in one pass over the keys, each key's answer read
 * just before its own pair is set (a key that repeats is a maybe the second time). Returns
 * (maybe, added). The keys before one that cannot be hashed are claimed, as one by one. */
PyObject *filter_claim(PyObject *self, PyObject *args) {
    KfArgs a;
    if (kf_open(args, &a) < 0) { kf_close(&a); return NULL; }
    uint8_t *bits = a.bits.view.buf;
    PyObject *out = PyList_New(0);
    if (!out) { kf_close(&a); return NULL; }
    long long n = 0;
    int failed = 0;
    KfAhead h;
    for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(a.keys) && !failed; i += KF_AHEAD) {
        kf_ahead(&a, i, &h, 1);
        failed = h.failed;
        for (Py_ssize_t j = 0; j < h.n; j++) {
            if (!h.key[j]) continue;
            int all = 1;
            for (int k = 0; k < KF_PROBES; k++) {
                uint8_t *byte = bits + (h.place[j][k] >> 3), mask = (uint8_t)(1u << (h.place[j][k] & 7));
                all &= (*byte & mask) != 0;
                *byte |= mask;
            }
            n++;
            if (all && PyList_Append(out, h.key[j]) < 0) { failed = 1; break; }
        }
        kf_drop(&h);
    }
    kf_close(&a);
    if (failed) { Py_DECREF(out); return NULL; }
    return Py_BuildValue("(NL)", out, n);
}

/* ------------------------------------------------------------------------------------------ */
/* key_order(runs): the order in which the key index writes the keys of put_runs, each run a tuple
 * (topic, keys, ...) with keys a list or tuple of str or None (no key): by topic, then key, in
 * UTF-8 byte order (SQLite's BINARY collation), keys of one pair in their given order; None left
 * out. Returns each key's place among all the runs' keys laid end to end (None counted), as u64
 * in the machine's byte order (an array('Q')). The sort runs without the GIL (a checkpoint's keys
 * take tens of milliseconds, which the event loop must not wait for): the strings are held by a
 * copy of every list, and a str's UTF-8 bytes, once made, live as long as the str. */

typedef struct {
    const char *topic, *key;
    Py_ssize_t topic_len, key_len;
    uint64_t code;
} KoKey;

static inline int ko_bytes(const char *a, Py_ssize_t an, const char *b, Py_ssize_t bn) {
    int c = memcmp(a, b, (size_t)(an < bn ? an : bn));
    return c ? c : (an > bn) - (an < bn);
}

static int ko_cmp(const void *pa, const void *pb) {
    const KoKey *a = pa, *b = pb;
    int c = a->topic == b->topic ? 0 : ko_bytes(a->topic, a->topic_len, b->topic, b->topic_len);
    if (!c) c = ko_bytes(a->key, a->key_len, b->key, b->key_len);
    return c ? c : (a->code > b->code) - (a->code < b->code);
}

PyObject *key_order(PyObject *self, PyObject *args) {
    PyObject *runs, *held = NULL, *out = NULL;
    KoKey *k = NULL;
    if (!PyArg_ParseTuple(args, "O", &runs)) return NULL;
    if (!PyList_Check(runs)) { PyErr_SetString(PyExc_TypeError, "runs: expected a list"); return NULL; }
    Py_ssize_t nruns = PyList_GET_SIZE(runs);
    held = PyList_New(nruns);  /* (topic, a copy of keys) per run: `runs` may change meanwhile */
    if (!held) return NULL;
    Py_ssize_t n = 0;
    for (Py_ssize_t r = 0; r < nruns; r++) {
        PyObject *run = PyList_GET_ITEM(runs, r);
        if (!PyTuple_Check(run) || PyTuple_GET_SIZE(run) < 2) {
            PyErr_Format(PyExc_TypeError, "run %zd: expected a tuple (topic, keys, ...)", r);
            goto done;
        }
        PyObject *topic = PyTuple_GET_ITEM(run, 0), *keys = PyTuple_GET_ITEM(run, 1);
        if (!PyUnicode_Check(topic)) { PyErr_Format(PyExc_TypeError, "run %zd: topic must be a str", r); goto done; }
        if (!PyList_Check(keys) && !PyTuple_Check(keys)) {
            PyErr_Format(PyExc_TypeError, "run %zd: keys must be a list or a tuple", r);
            goto done;
        }
        PyObject *copy = PySequence_Tuple(keys);
        if (!copy) goto done;
        Py_ssize_t len = PyTuple_GET_SIZE(copy);
        PyObject *pair = PyTuple_Pack(2, topic, copy);
        Py_DECREF(copy);
        if (!pair) goto done;
        PyList_SET_ITEM(held, r, pair);
        n += len;
    }
    k = PyMem_Malloc(n ? (size_t)n * sizeof *k : 1);
    if (!k) { PyErr_NoMemory(); goto done; }
    Py_ssize_t m = 0, place = 0;
    for (Py_ssize_t r = 0; r < nruns; r++) {
        PyObject *pair = PyList_GET_ITEM(held, r), *keys = PyTuple_GET_ITEM(pair, 1);
        Py_ssize_t topic_len;
        const char *topic = PyUnicode_AsUTF8AndSize(PyTuple_GET_ITEM(pair, 0), &topic_len);
        if (!topic) goto done;  /* not encodable (a lone surrogate): UnicodeEncodeError */
        for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(keys); i++, place++) {
            PyObject *key = PyTuple_GET_ITEM(keys, i);
            if (key == Py_None) continue;
            if (!PyUnicode_Check(key)) {
                PyErr_Format(PyExc_TypeError, "run %zd, key %zd: expected a str or None", r, i);
                goto done;
            }
            k[m].key = PyUnicode_AsUTF8AndSize(key, &k[m].key_len);
            if (!k[m].key) goto done;
            k[m].topic = topic;
            k[m].topic_len = topic_len;
            k[m].code = (uint64_t)place;
            m++;
        }
    }
    Py_BEGIN_ALLOW_THREADS
    qsort(k, (size_t)m, sizeof *k, ko_cmp);
    Py_END_ALLOW_THREADS
    out = PyBytes_FromStringAndSize(NULL, m * 8);
    if (!out) goto done;
    uint8_t *o = (uint8_t *)PyBytes_AS_STRING(out);
    for (Py_ssize_t i = 0; i < m; i++) memcpy(o + 8 * i, &k[i].code, 8);
done:
    PyMem_Free(k);
    Py_DECREF(held);
    return out;
}
