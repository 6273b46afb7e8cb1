/*
 * Every function here takes a batch's keys as a list or tuple of str or None, or as Keys (a
 * produce batch's keys packed, batch_keyseq.c), whose keys are read without a str each; and
 * filter_add_json a chunk of the key index's keys as JSON text.
 *
 * The key filter's batch functions (specified by storage/keyfilter.py, the reference, with its
 * byte table): filter_add, filter_add_json, filter_maybe and filter_claim over a blocked Bloom
 * filter held in a bytearray.
 * A pair's hash is built from Python's own hash of the key and of the topic (cached by str
 * objects), so both implementations agree within a process; the filter is never stored.
 *
 * The key index's overlay tables (overlay_put, overlay_find: storage/overlay.py is the reference),
 * found by the same pair hash.
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

/* Check the filter's bytearray (a whole number of blocks) and take its block count (its bytes are
 * held later, by buf_get, once every argument is checked). */
static int kf_bits(PyObject *bo, KfArgs *a) {
    if (!PyByteArray_Check(bo)) { PyErr_SetString(PyExc_TypeError, "bits: expected a bytearray"); return -1; }
    Py_ssize_t len = PyByteArray_GET_SIZE(bo);
    if (len == 0 || len % KF_BLOCK) {
        PyErr_Format(PyExc_ValueError, "bits: %zd bytes is not a whole number of %d-byte blocks", len, KF_BLOCK);
        return -1;
    }
    a->nblocks = (uint64_t)len / KF_BLOCK;
    return 0;
}

/* Check the topic and take its part of the pairs' hashes (storage/keyfilter.py keys_part). */
static int kf_topic(PyObject *topic, KfArgs *a) {
    if (!PyUnicode_Check(topic)) { PyErr_SetString(PyExc_TypeError, "topic: expected a str"); return -1; }
    Py_hash_t th = PyObject_Hash(topic);
    if (th == -1) return -1;
    a->topic_part = (uint64_t)th * KF_GOLDEN;
    return 0;
}

/* Check the topic and the keys (storage/keyfilter.py keys_part), and take the topic's part of the
 * pairs' hashes and a reference to the keys (the filter's bits are left alone). */
static int kf_keys(PyObject *topic, PyObject *keys, KfArgs *a) {
    if (kf_topic(topic, a) < 0) return -1;
    if (!PyList_Check(keys) && !PyTuple_Check(keys) && !keys_check(keys)) {
        PyErr_SetString(PyExc_TypeError, "keys: expected a list, a tuple or Keys");
        return -1;
    }
    Py_INCREF(keys);
    a->keys = keys;
    return 0;
}

static int kf_open(PyObject *args, KfArgs *a) {
    PyObject *bo, *topic, *keys;
    a->bits.held = 0;
    a->keys = NULL;
    if (!PyArg_ParseTuple(args, "OOO", &bo, &topic, &keys)) return -1;
    if (kf_bits(bo, a) < 0 || kf_keys(topic, keys, a) < 0) return -1;
    return buf_get(bo, &a->bits, 1, "bits");
}

static void kf_close(KfArgs *a) {
    buf_release(&a->bits);
    Py_XDECREF(a->keys);
}

/* A pair's hash (storage/keyfilter.py pair_hash): the filter's places and the overlay's slots. */
static inline uint64_t kf_pair(const KfArgs *a, Py_hash_t kh) { return kf_mix((uint64_t)kh + a->topic_part); }

/* The bit numbers (within the filter) of one pair. */
static inline void kf_places(const KfArgs *a, Py_hash_t kh, uint64_t place[KF_PROBES]) {
    uint64_t z = kf_pair(a, kh);
    uint64_t base = (((z & 0xFFFFFFFFull) * a->nblocks) >> 32) * KF_BLOCK * 8;
    uint64_t w = kf_mix(z);
    for (int i = 0; i < KF_PROBES; i++) place[i] = base + ((w >> (9 * i)) & 511);
}

/* Keys are taken KF_AHEAD at a time: their blocks are hashed and prefetched first, then read or
 * set, so the cache misses of a batch's random blocks overlap instead of coming one by one. Each
 * key of a list is held until its group is done (a key's __hash__ may change the list). */
#define KF_AHEAD 16

typedef struct {
    uint64_t place[KF_AHEAD][KF_PROBES];
    PyObject *key[KF_AHEAD];  /* a list's key, held; NULL: one of Keys, or None */
    Py_ssize_t at[KF_AHEAD];  /* the key's place; -1: None, no block */
    Py_ssize_t n;             /* keys of the group */
    int failed;               /* an error is set (a hash, or filter_maybe's append): stop after the group */
} KfAhead;

/* Hash and prefetch keys [i, i + KF_AHEAD) of the filter's keys, as many as there are (a list's
 * size is asked before each). */
static void kf_ahead(const KfArgs *a, Py_ssize_t i, KfAhead *h, int write) {
    const uint8_t *bits = a->bits.view.buf;
    h->n = 0;
    h->failed = 0;
    while (h->n < KF_AHEAD && i + h->n < ks_len(a->keys)) {
        Py_ssize_t at = i + h->n;
        Py_hash_t kh;
        PyObject *held = keys_check(a->keys) ? NULL : Py_NewRef(PySequence_Fast_GET_ITEM(a->keys, at));
        int got = ks_hash(a->keys, at, &kh);
        if (got <= 0) {
            Py_XDECREF(held);
            if (got < 0) {
                h->failed = 1;
                return;
            }
            h->key[h->n] = NULL;
            h->at[h->n++] = -1;
            continue;
        }
        h->key[h->n] = held;
        h->at[h->n] = at;
        uint64_t *place = h->place[h->n++];
        kf_places(a, kh, place);
        if (write) __builtin_prefetch(bits + (place[0] >> 3), 1);
        else __builtin_prefetch(bits + (place[0] >> 3), 0);
    }
}

/* Key j of a group, a new reference (a str). */
static PyObject *kf_key(const KfArgs *a, const KfAhead *h, Py_ssize_t j) {
    return h->key[j] ? Py_NewRef(h->key[j]) : keys_item((Keys *)a->keys, h->at[j]);
}

static void kf_drop(KfAhead *h) {
    for (Py_ssize_t j = 0; j < h->n; j++) Py_XDECREF(h->key[j]);
    h->n = 0;
}

/* filter_add(bits, topic, keys, alone=False): add (topic, key) for every key that is not None; the
 * number added. `alone`: no other thread uses the bits meanwhile (a build's own filter, not
 * installed yet), so packed keys (Keys, hashed when they were read: kf_ahead touches no Python
 * object for them, and none can fail) are added without the GIL. */
PyObject *filter_add(PyObject *self, PyObject *args) {
    PyObject *bo, *topic, *keys;
    int alone = 0;
    KfArgs a = {.bits.held = 0, .keys = NULL};
    if (!PyArg_ParseTuple(args, "OOO|p", &bo, &topic, &keys, &alone) || kf_bits(bo, &a) < 0 ||
        kf_keys(topic, keys, &a) < 0 || buf_get(bo, &a.bits, 1, "bits") < 0) {
        kf_close(&a);
        return NULL;
    }
    uint8_t *bits = a.bits.view.buf;
    long long n = 0;
    KfAhead h = {.failed = 0};
    PyThreadState *released = alone && keys_check(a.keys) ? PyEval_SaveThread() : NULL;
    for (Py_ssize_t i = 0; i < ks_len(a.keys) && !h.failed; i += KF_AHEAD) {
        kf_ahead(&a, i, &h, 1);
        for (Py_ssize_t j = 0; j < h.n; j++) {  /* the keys before a failed one are added, as one by one */
            if (h.at[j] < 0) continue;
            for (int k = 0; k < KF_PROBES; k++) bits[h.place[j][k] >> 3] |= (uint8_t)(1u << (h.place[j][k] & 7));
            n++;
        }
        kf_drop(&h);
    }
    if (released) PyEval_RestoreThread(released);
    kf_close(&a);
    return h.failed ? NULL : PyLong_FromLongLong(n);
}

PyObject *filter_maybe(PyObject *self, PyObject *args) {
    KfArgs a;
    if (kf_open(args, &a) < 0) { kf_close(&a); return NULL; }
    const uint8_t *bits = a.bits.view.buf;
    PyObject *out = PyList_New(0);
    if (!out) { kf_close(&a); return NULL; }
    KfAhead h;
    for (Py_ssize_t i = 0; i < ks_len(a.keys); i += KF_AHEAD) {
        kf_ahead(&a, i, &h, 0);
        for (Py_ssize_t j = 0; j < h.n && !h.failed; j++) {
            if (h.at[j] < 0) continue;
            int all = 1;
            for (int k = 0; k < KF_PROBES && all; k++) all = (bits[h.place[j][k] >> 3] >> (h.place[j][k] & 7)) & 1;
            if (all) {
                PyObject *key = kf_key(&a, &h, j);
                if (!key || PyList_Append(out, key) < 0) h.failed = 1;
                Py_XDECREF(key);
            }
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

/* filter_add_json(bits, topic, chunk): filter_add of the keys in `chunk`, bytes holding a JSON
 * array of strings in UTF-8, as SQLite's json_group_array writes the key index's keys (the filter's
 * build reads them so, storage/keyindex.py key_chunk), and the last of them (None for no key),
 * after which the build's next chunk starts (asked of SQLite with max(key), it cost a third of the
 * build's CPU). Without a str a key, and without the GIL while the chunk is read and the bits are
 * set: a key of ASCII without an escape is hashed from its bytes (Python hashes an ASCII str's
 * bytes as they are, bytes_hash); any other key (rare: keys are mostly ASCII) is made a str
 * with the GIL, as json.loads makes it. Returns (added, last). A chunk that is not such an array:
 * ValueError, and nothing added. No other thread may use the bits meanwhile (a build's own filter,
 * installed once it is done): they are set without the GIL. */
typedef struct {
    size_t at, len;   /* the string's text between its quotes: chunk[at:at + len] */
    Py_hash_t hash;   /* its key's hash; set with the GIL when `plain` is 0 */
    int plain;        /* ASCII without an escape */
} JsonKey;

static inline size_t json_space(const uint8_t *s, size_t n, size_t i) {
    while (i < n && (s[i] == ' ' || s[i] == '\t' || s[i] == '\n' || s[i] == '\r')) i++;
    return i;
}

/* The strings of the array in s[0:n] into *keys (PyMem_Raw: no GIL needed); NULL, or what is
 * wrong with the chunk ("no memory": the allocation failed). */
static const char *json_keys(const uint8_t *s, size_t n, JsonKey **keys, size_t *count) {
    size_t cap = 0, m = 0, i = json_space(s, n, 0);
    JsonKey *k = NULL;
    const char *bad = NULL;
    if (i >= n || s[i] != '[') { bad = "not a JSON array"; goto done; }
    i = json_space(s, n, i + 1);
    if (i < n && s[i] == ']') { i++; goto end; }
    for (;;) {
        if (i >= n || s[i] != '"') { bad = "an item is not a string"; goto done; }
        size_t at = ++i;
        int plain = 1;
        for (;;) {
            if (i >= n) { bad = "a string is not closed"; goto done; }
            uint8_t c = s[i];
            if (c == '"') break;
            if (c < 0x20) { bad = "a control character in a string"; goto done; }
            if (c == '\\' || c >= 0x80) plain = 0;
            i += c == '\\' ? 2 : 1;  /* (the escape itself is read by json.loads) */
        }
        if (m == cap) {
            cap = cap ? 2 * cap : 1024;
            JsonKey *grown = PyMem_RawRealloc(k, cap * sizeof *k);
            if (!grown) { bad = "no memory"; goto done; }
            k = grown;
        }
        k[m++] = (JsonKey){.at = at, .len = i - at, .hash = 0, .plain = plain};
        i = json_space(s, n, i + 1);
        if (i < n && s[i] == ',') { i = json_space(s, n, i + 1); continue; }
        if (i < n && s[i] == ']') { i++; break; }
        bad = "expected ',' or ']' after an item";
        goto done;
    }
end:
    if (json_space(s, n, i) != n) bad = "more after the array";
done:
    if (bad) { PyMem_RawFree(k); k = NULL; m = 0; }
    *keys = k;
    *count = m;
    return bad;
}

/* A key's str: a plain key's ASCII as it is; any other's as json.loads makes it of its quoted text
 * (the reference's own way), which fails for a bad escape or bad UTF-8. New reference, or NULL. */
static PyObject *json_key_str(const uint8_t *s, const JsonKey *k) {
    if (k->plain) return PyUnicode_FromStringAndSize((const char *)s + k->at, (Py_ssize_t)k->len);
    PyObject *json = PyImport_ImportModule("json");
    PyObject *text = json ? PyUnicode_DecodeUTF8((const char *)s + k->at - 1, (Py_ssize_t)k->len + 2, "strict") : NULL;
    PyObject *key = text ? PyObject_CallMethod(json, "loads", "O", text) : NULL;
    Py_XDECREF(json);
    Py_XDECREF(text);
    if (key && !PyUnicode_Check(key)) {
        Py_DECREF(key);
        PyErr_SetString(PyExc_ValueError, "chunk: an item is not a string");
        return NULL;
    }
    return key;
}

/* Set the bits of m hashed keys, as kf_ahead takes them: a group's blocks prefetched, then set. */
static void json_set(const KfArgs *a, uint8_t *bits, const JsonKey *k, size_t m) {
    for (size_t i = 0; i < m; i += KF_AHEAD) {
        uint64_t place[KF_AHEAD][KF_PROBES];
        size_t g = m - i < KF_AHEAD ? m - i : KF_AHEAD;
        for (size_t j = 0; j < g; j++) {
            kf_places(a, k[i + j].hash, place[j]);
            __builtin_prefetch(bits + (place[j][0] >> 3), 1);
        }
        for (size_t j = 0; j < g; j++)
            for (int p = 0; p < KF_PROBES; p++) bits[place[j][p] >> 3] |= (uint8_t)(1u << (place[j][p] & 7));
    }
}

PyObject *filter_add_json(PyObject *self, PyObject *args) {
    PyObject *bo, *topic, *chunk;
    KfArgs a = {.bits.held = 0, .keys = NULL};
    if (!PyArg_ParseTuple(args, "OOO", &bo, &topic, &chunk) || kf_bits(bo, &a) < 0 || kf_topic(topic, &a) < 0)
        return NULL;
    if (!PyBytes_Check(chunk)) { PyErr_SetString(PyExc_TypeError, "chunk: expected bytes"); return NULL; }
    if (buf_get(bo, &a.bits, 1, "bits") < 0) return NULL;
    const uint8_t *s = (const uint8_t *)PyBytes_AS_STRING(chunk);  /* (bytes: never changes) */
    uint8_t *bits = a.bits.view.buf;
    size_t n = (size_t)PyBytes_GET_SIZE(chunk), m = 0, hard = 0;
    JsonKey *k = NULL;
    const char *bad;
    Py_BEGIN_ALLOW_THREADS
    bad = json_keys(s, n, &k, &m);
    for (size_t i = 0; i < m; i++) {
        if (k[i].plain) k[i].hash = bytes_hash(s + k[i].at, (Py_ssize_t)k[i].len);
        else hard++;
    }
    if (!bad && !hard) json_set(&a, bits, k, m);  /* the usual chunk: the GIL let go once */
    Py_END_ALLOW_THREADS
    if (bad) {
        if (strcmp(bad, "no memory") == 0) PyErr_NoMemory();
        else PyErr_Format(PyExc_ValueError, "chunk: %s", bad);
        buf_release(&a.bits);
        return NULL;
    }
    PyObject *last = NULL;  /* the last key's str, made with the others that are not plain */
    if (hard) {  /* (every key is hashed before a bit is set: a bad one adds nothing) */
        for (size_t i = 0; i < m; i++) {
            if (k[i].plain) continue;
            PyObject *key = json_key_str(s, &k[i]);
            k[i].hash = key ? PyObject_Hash(key) : -1;
            if (k[i].hash == -1) {
                Py_XDECREF(key);
                Py_XDECREF(last);
                PyMem_RawFree(k);
                buf_release(&a.bits);
                return NULL;
            }
            if (i == m - 1) last = key;
            else Py_DECREF(key);
        }
        Py_BEGIN_ALLOW_THREADS
        json_set(&a, bits, k, m);
        Py_END_ALLOW_THREADS
    }
    if (!last && m) last = json_key_str(s, &k[m - 1]);  /* (plain: fails only for memory) */
    else if (!last) last = Py_NewRef(Py_None);
    PyMem_RawFree(k);
    buf_release(&a.bits);
    return last ? Py_BuildValue("(nN)", (Py_ssize_t)m, last) : NULL;
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
    for (Py_ssize_t i = 0; i < ks_len(a.keys) && !failed; i += KF_AHEAD) {
        kf_ahead(&a, i, &h, 1);
        failed = h.failed;
        for (Py_ssize_t j = 0; j < h.n; j++) {
            if (h.at[j] < 0) continue;
            int all = 1;
            for (int k = 0; k < KF_PROBES; k++) {
                uint8_t *byte = bits + (h.place[j][k] >> 3), mask = (uint8_t)(1u << (h.place[j][k] & 7));
                all &= (*byte & mask) != 0;
                *byte |= mask;
            }
            n++;
            if (all) {
                PyObject *key = kf_key(&a, &h, j);
                int bad = !key || PyList_Append(out, key) < 0;
                Py_XDECREF(key);
                if (bad) { failed = 1; break; }
            }
        }
        kf_drop(&h);
    }
    kf_close(&a);
    if (failed) { Py_DECREF(out); return NULL; }
    return Py_BuildValue("(NL)", out, n);
}

/* ------------------------------------------------------------------------------------------ */
/* The key index's overlay tables (specified by storage/overlay.py, the reference, with its byte
 * table): overlay_put and overlay_find over one open-addressing table in a bytearray, a slot
 * (pair hash, 1 + entry, place) a key, found by the pair hash the filter uses. */

#define OV_HEADER 16
#define OV_SLOT 16

typedef struct {
    Buf table;
    uint8_t *slots;
    uint64_t nslots, room, used;
} OvTable;

/* Check the table's shape and its header; 0, or -1 with an error set. */
static int ov_open(PyObject *to, OvTable *t) {
    t->table.held = 0;
    if (!PyByteArray_Check(to)) { PyErr_SetString(PyExc_TypeError, "table: expected a bytearray"); return -1; }
    Py_ssize_t len = PyByteArray_GET_SIZE(to);
    uint64_t n = len >= OV_HEADER + 2 * OV_SLOT && (len - OV_HEADER) % OV_SLOT == 0 ? (uint64_t)(len - OV_HEADER) / OV_SLOT : 0;
    if (!n || (n & (n - 1))) {
        PyErr_Format(PyExc_ValueError, "table: %zd bytes is not a %d-byte header and a power of two (2 or more) of %d-byte slots",
                     len, OV_HEADER, OV_SLOT);
        return -1;
    }
    if (buf_get(to, &t->table, 1, "table") < 0) return -1;
    uint8_t *p = t->table.view.buf;
    t->slots = p + OV_HEADER;
    t->nslots = n;
    t->room = n / 2;
    t->used = rd64(p);
    if (t->used > t->room) {
        PyErr_Format(PyExc_ValueError, "table: damaged (%llu entries held, room for %llu)",
                     (unsigned long long)t->used, (unsigned long long)t->room);
        buf_release(&t->table);
        return -1;
    }
    return 0;
}

/* The keys' checks are the filter's (kf_keys, no bits held). */
static int ov_keys(PyObject *topic, PyObject *keys, KfArgs *a) {
    a->bits.held = 0;
    a->keys = NULL;
    return kf_keys(topic, keys, a);
}

/* overlay_put(table, topic, keys, entry, start): a slot for each key from keys[start] on (None
 * left out) while the table has room: (pair hash, entry + 1, the key's place). Returns the place
 * of the first key not taken (len(keys) when all were). Keys are hashed OV_AHEAD at a time and
 * their first slots prefetched, as the filter does; a key that cannot be hashed leaves the keys
 * before it in the table, as one by one. */
#define OV_AHEAD 16

PyObject *overlay_put(PyObject *self, PyObject *args) {
    PyObject *to, *topic, *keys;
    long long entry;
    Py_ssize_t start;
    if (!PyArg_ParseTuple(args, "OOOLn", &to, &topic, &keys, &entry, &start)) return NULL;
    if (entry < 0 || entry >= 0xFFFFFFFFll) { PyErr_SetString(PyExc_ValueError, "entry: out of range"); return NULL; }
    KfArgs a;
    if (ov_keys(topic, keys, &a) < 0) return NULL;
    if (start < 0 || start > ks_len(keys) || ks_len(keys) > 0xFFFFFFFFll) {
        PyErr_SetString(PyExc_ValueError, "start: out of range");
        kf_close(&a);
        return NULL;
    }
    OvTable t;
    if (ov_open(to, &t) < 0) { kf_close(&a); return NULL; }
    uint64_t mask = t.nslots - 1, used = t.used;
    Py_ssize_t i = start;
    int failed = 0;
    while (!failed && used < t.room && i < ks_len(a.keys)) {
        uint64_t z[OV_AHEAD];
        Py_ssize_t at[OV_AHEAD];
        int n = 0;
        Py_ssize_t next = i;
        /* hash a group (no more keys than the room left), prefetching each one's first slot */
        while (n < OV_AHEAD && used + (uint64_t)n < t.room && next < ks_len(a.keys)) {
            Py_hash_t kh;
            int got = ks_hash(a.keys, next, &kh);
            if (got == 0) { next++; continue; }
            if (got < 0) { failed = 1; break; }
            z[n] = kf_pair(&a, kh);
            at[n++] = next++;
            __builtin_prefetch(t.slots + ((z[n - 1] >> 32) & mask) * OV_SLOT, 1);
        }
        for (int j = 0; j < n; j++) {
            uint64_t s = (z[j] >> 32) & mask, probes = 0;
            while (rd32(t.slots + s * OV_SLOT + 8) != 0 && ++probes < t.nslots) s = (s + 1) & mask;
            uint8_t *slot = t.slots + s * OV_SLOT;
            if (rd32(slot + 8) != 0) {  /* no free slot although the header says there is room */
                PyErr_SetString(PyExc_ValueError, "table: damaged (no free slot)");
                failed = 1;
                break;
            }
            wr64(slot, z[j]);
            wr32(slot + 8, (uint32_t)entry + 1);
            wr32(slot + 12, (uint32_t)at[j]);
            used++;
        }
        i = failed ? i : next;
    }
    /* (i stays where it was when the group failed: the reference stops at the failing key) */
    wr64(t.table.view.buf, used);
    buf_release(&t.table);
    kf_close(&a);
    if (failed) return NULL;
    /* the room ran out: the place of the next key (None skipped, as the reference does) */
    Py_ssize_t len = ks_len(keys);
    while (i < len && ks_none(keys, i)) i++;
    return PyLong_FromSsize_t(i);
}

/* overlay_find(table, topic, keys): (place in keys, entry, the key's place in the entry) for every
 * slot whose pair hash is a key's (None left out), in the keys' order, each key's in probe order.
 * A slot's hash can be another pair's: the caller compares the keys. */
PyObject *overlay_find(PyObject *self, PyObject *args) {
    PyObject *to, *topic, *keys;
    if (!PyArg_ParseTuple(args, "OOO", &to, &topic, &keys)) return NULL;
    KfArgs a;
    if (ov_keys(topic, keys, &a) < 0) return NULL;
    OvTable t;
    if (ov_open(to, &t) < 0) { kf_close(&a); return NULL; }
    PyObject *out = PyList_New(0);
    uint64_t mask = t.nslots - 1;
    for (Py_ssize_t i = 0; out && i < ks_len(a.keys); i++) {
        Py_hash_t kh;
        int got = ks_hash(a.keys, i, &kh);
        if (got == 0) continue;
        if (got < 0) { Py_CLEAR(out); break; }
        uint64_t z = kf_pair(&a, kh), s = (z >> 32) & mask;
        for (uint64_t probes = 0; probes < t.nslots; probes++, s = (s + 1) & mask) {
            const uint8_t *slot = t.slots + s * OV_SLOT;
            uint32_t e = rd32(slot + 8);
            if (e == 0) break;
            if (rd64(slot) != z) continue;
            PyObject *hit = Py_BuildValue("(nkk)", i, (unsigned long)(e - 1), (unsigned long)rd32(slot + 12));
            if (!hit || PyList_Append(out, hit) < 0) { Py_XDECREF(hit); Py_CLEAR(out); break; }
            Py_DECREF(hit);
        }
    }
    buf_release(&t.table);
    kf_close(&a);
    return out;
}
