/*
 * Keys: a produce batch's keys, packed — what `encode_produce` and `encode_produce_raw` give for
 * the keys of a batch instead of a list of str or None. A keyed produce used to make a str a key
 * (tens of nanoseconds each on the event loop, and as long again to free it after the key index's
 * write); the filter, the overlay and the index's write only need a key's bytes and its hash, so
 * the batch's keys are kept as one run of UTF-8 and a table of entries, and a str is made only
 * where Python asks for one key (a key the filter could not rule out, an overlay hit, the
 * reference code).
 *
 * To Python, Keys is an immutable sequence of str or None (len, [i], iteration, count, == against
 * a list, a tuple or Keys; and `repeats()`, whether a key is there twice, without a str a key):
 * equal, key for key, to the list the reference (storage/batch.py) gives;
 * tests/storage/test_batch_differential.py and tests/storage/test_keyseq.py check both. `Keys(iterable)` packs any keys (tests, the
 * reference's keys). In memory (never stored), an entry a key:
 *
 *     field  type       meaning
 *     -----  ---------  ------------------------------------------------------------------------
 *     at     u32        the key's UTF-8 starts at text[at]
 *     len    u32        its length in bytes; KEY_NONE (2**32 - 1): the message has no key
 *     hash   Py_hash_t  hash() of the key's str (for ASCII, Python's hash of the bytes, which is
 *                       the str's; otherwise of the str, made once), what the key filter and the
 *                       overlay's tables are found by (storage/keyfilter.py pair_hash)
 */
#include "batch_core.h"

/* hash(str) of a key's UTF-8: a str of ASCII characters hashes its bytes as they are. */
static Py_hash_t key_hash(const char *s, uint32_t len) {
    uint32_t i = 0;
    for (; i + 8 <= len; i += 8) {
        uint64_t w;
        memcpy(&w, s + i, 8);
        if (w & 0x8080808080808080ull) break;
    }
    while (i < len && !((uint8_t)s[i] & 0x80)) i++;
    if (i == len) return bytes_hash(s, (Py_ssize_t)len);
    PyObject *str = PyUnicode_DecodeUTF8(s, (Py_ssize_t)len, "strict");
    if (!str) return -1;
    Py_hash_t h = PyObject_Hash(str);
    Py_DECREF(str);
    return h;
}

Keys *keys_new(Py_ssize_t n, size_t text_len) {
    if (n < 0 || (uint64_t)n > UINT32_MAX || text_len >= KEY_NONE) {
        PyErr_SetString(PyExc_OverflowError, "keys: more than 2**32 keys or bytes");
        return NULL;
    }
    Keys *k = PyObject_New(Keys, &KeysType);
    if (!k) return NULL;
    k->n = n;
    k->named = 0;
    k->e = PyMem_Malloc(n ? (size_t)n * sizeof *k->e : 1);
    k->text = PyMem_Malloc(text_len ? text_len : 1);
    if (!k->e || !k->text) {
        Py_DECREF(k);
        PyErr_NoMemory();
        return NULL;
    }
    for (Py_ssize_t i = 0; i < n; i++) k->e[i] = (KeyEntry){.at = 0, .len = KEY_NONE, .hash = 0};
    return k;
}

int keys_set(Keys *k, Py_ssize_t i, const char *s, uint32_t len, uint32_t at) {
    memcpy(k->text + at, s, len);
    Py_hash_t h = key_hash(k->text + at, len);
    if (h == -1) return -1;
    if (k->e[i].len == KEY_NONE) k->named++;
    k->e[i] = (KeyEntry){.at = at, .len = len, .hash = h};
    return 0;
}

PyObject *keys_item(const Keys *k, Py_ssize_t i) {
    const KeyEntry *e = &k->e[i];
    if (e->len == KEY_NONE) Py_RETURN_NONE;
    return PyUnicode_DecodeUTF8(k->text + e->at, (Py_ssize_t)e->len, "strict");
}

/* Keys(keys): keys, any iterable of str or None, packed. */
static PyObject *Keys_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    PyObject *src;
    if (kwds && PyDict_GET_SIZE(kwds)) { PyErr_SetString(PyExc_TypeError, "Keys() takes no keyword arguments"); return NULL; }
    if (!PyArg_ParseTuple(args, "O:Keys", &src)) return NULL;
    PyObject *seq = PySequence_Fast(src, "keys: expected an iterable");
    if (!seq) return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    size_t total = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *key = PySequence_Fast_GET_ITEM(seq, i);
        Py_ssize_t len;
        if (key == Py_None) continue;
        if (!PyUnicode_Check(key)) {
            PyErr_Format(PyExc_TypeError, "key %zd: expected a str or None", i);
            goto fail;
        }
        if (!PyUnicode_AsUTF8AndSize(key, &len)) goto fail;  /* a lone surrogate: UnicodeEncodeError */
        total += (size_t)len;
        if (total >= KEY_NONE) { PyErr_SetString(PyExc_OverflowError, "keys: more than 2**32 bytes"); goto fail; }
    }
    Keys *k = keys_new(n, total);
    if (!k) goto fail;
    uint32_t at = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *key = PySequence_Fast_GET_ITEM(seq, i);
        Py_ssize_t len;
        if (key == Py_None) continue;
        const char *s = PyUnicode_AsUTF8AndSize(key, &len);  /* (made above) */
        if (!s || keys_set(k, i, s, (uint32_t)len, at) < 0) { Py_DECREF(k); goto fail; }
        at += (uint32_t)len;
    }
    Py_DECREF(seq);
    return (PyObject *)k;
fail:
    Py_DECREF(seq);
    return NULL;
}

static void Keys_dealloc(Keys *k) {
    PyMem_Free(k->e);
    PyMem_Free(k->text);
    PyObject_Free(k);
}

static Py_ssize_t Keys_len(Keys *k) { return k->n; }

static PyObject *Keys_item(Keys *k, Py_ssize_t i) {
    if (i < 0 || i >= k->n) { PyErr_SetString(PyExc_IndexError, "Keys index out of range"); return NULL; }
    return keys_item(k, i);
}

/* A value as a key to compare with: 1 and its UTF-8 (s NULL: None), or 0 when it equals no key and
 * not None (not a str, or a lone surrogate, which has no UTF-8 as every key has). */
static int as_key(PyObject *x, const char **s, Py_ssize_t *len) {
    *s = NULL;
    *len = 0;
    if (x == Py_None) return 1;
    if (!PyUnicode_Check(x)) return 0;
    *s = PyUnicode_AsUTF8AndSize(x, len);
    if (!*s) PyErr_Clear();
    return *s != NULL;
}

/* Entry i is the key s (NULL: None). */
static inline int key_is(const Keys *k, Py_ssize_t i, const char *s, Py_ssize_t len) {
    const KeyEntry *e = &k->e[i];
    if (e->len == KEY_NONE || !s) return e->len == KEY_NONE && !s;
    return e->len == (uint64_t)len && memcmp(k->text + e->at, s, (size_t)len) == 0;
}

/* count(x): how many keys equal x (None: the messages without a key), as list.count answers. */
static PyObject *Keys_count(Keys *k, PyObject *x) {
    const char *s;
    Py_ssize_t len, c = 0;
    if (!as_key(x, &s, &len)) return PyLong_FromSsize_t(0);
    if (!s) return PyLong_FromSsize_t(k->n - k->named);
    for (Py_ssize_t i = 0; i < k->n; i++) c += key_is(k, i, s, len);
    return PyLong_FromSsize_t(c);
}

/* == and != against Keys, a list or a tuple: the same keys in the same order (as a list of them
 * would compare); unhashable, as a list is. */
static PyObject *Keys_richcompare(Keys *k, PyObject *other, int op) {
    if ((op != Py_EQ && op != Py_NE) || !(keys_check(other) || PyList_Check(other) || PyTuple_Check(other)))
        Py_RETURN_NOTIMPLEMENTED;
    const Keys *o = keys_check(other) ? (const Keys *)other : NULL;
    int eq = (o ? o->n : PySequence_Fast_GET_SIZE(other)) == k->n;
    for (Py_ssize_t i = 0; eq && i < k->n; i++) {  /* (as_key runs no Python code: a list stays as it is) */
        const char *s = NULL;
        Py_ssize_t len = 0;
        if (o) {
            if (o->e[i].len != KEY_NONE) s = o->text + o->e[i].at, len = (Py_ssize_t)o->e[i].len;
            eq = key_is(k, i, s, len);
        } else {
            eq = as_key(PySequence_Fast_GET_ITEM(other, i), &s, &len) && key_is(k, i, s, len);
        }
    }
    return PyBool_FromLong(op == Py_EQ ? eq : !eq);
}

/* repeats(): whether a key (not None) is there twice, found by the keys' hashes in a table of
 * twice their number of slots, the bytes compared only where two hashes are equal. */
static PyObject *Keys_repeats(Keys *k, PyObject *unused) {
    size_t nslots = 2;
    while (nslots < 2 * (size_t)k->named) nslots <<= 1;
    Py_ssize_t *slot = PyMem_Malloc(nslots * sizeof *slot);  /* 1 + the entry holding it; 0: free */
    if (!slot) return PyErr_NoMemory();
    memset(slot, 0, nslots * sizeof *slot);
    int found = 0;
    for (Py_ssize_t i = 0; i < k->n && !found; i++) {
        const KeyEntry *e = &k->e[i];
        if (e->len == KEY_NONE) continue;
        size_t s = (size_t)((uint64_t)e->hash * 0x9E3779B97F4A7C15ull >> 32) & (nslots - 1);
        for (; slot[s]; s = (s + 1) & (nslots - 1)) {
            const KeyEntry *o = &k->e[slot[s] - 1];
            if (o->hash == e->hash && o->len == e->len && memcmp(k->text + o->at, k->text + e->at, e->len) == 0) {
                found = 1;
                break;
            }
        }
        slot[s] = i + 1;
    }
    PyMem_Free(slot);
    return PyBool_FromLong(found);
}

static PyObject *Keys_named(Keys *k, void *closure) { return PyLong_FromSsize_t(k->named); }

static PySequenceMethods Keys_sequence = {
    .sq_length = (lenfunc)Keys_len,
    .sq_item = (ssizeargfunc)Keys_item,
};

static PyMethodDef Keys_methods[] = {
    {"count", (PyCFunction)Keys_count, METH_O, "how many keys equal the value (None: the messages without one)"},
    {"repeats", (PyCFunction)Keys_repeats, METH_NOARGS, "whether a key (not None) is there twice"},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef Keys_getset[] = {
    {"named", (getter)Keys_named, NULL, "how many are keys (not None)", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

PyTypeObject KeysType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "delayd.storage._batch.Keys",
    .tp_basicsize = sizeof(Keys),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_SEQUENCE,
    .tp_doc = "Keys(keys): a batch's keys (str or None), packed",
    .tp_new = Keys_new,
    .tp_dealloc = (destructor)Keys_dealloc,
    .tp_richcompare = (richcmpfunc)Keys_richcompare,
    .tp_hash = PyObject_HashNotImplemented,
    .tp_as_sequence = &Keys_sequence,
    .tp_methods = Keys_methods,
    .tp_getset = Keys_getset,
};
