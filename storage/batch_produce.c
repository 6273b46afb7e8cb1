/*
 * produce in delayd.storage._batch: a batch of message objects, or the msgpack request body
 * itself, validated and encoded into commit-log records; the message-table entries and rows of
 * the appended records; the answer of a produce.
 */
#include "batch_core.h"

/* An integer value as i64: 1, or 0 when it is not an integer or out of i64's range. */
static int mp_i64(const MpVal *v, int64_t *out) {
    if (v->kind == MK_INT) { *out = v->i; return 1; }
    if (v->kind == MK_UINT && v->u <= (uint64_t)INT64_MAX) { *out = (int64_t)v->u; return 1; }
    return 0;
}

static size_t utf8_chars(const uint8_t *s, size_t n) {
    size_t c = 0;
    for (size_t i = 0; i < n; i++) c += (s[i] & 0xC0) != 0x80;
    return c;
}

/* ------------------------------------------------------------------------------------------ */
/* produce: validate a batch of message objects and encode it into commit-log records          */

enum { F_BODY, F_BODY_B64, F_DELAY, F_DELIVER_AT, F_KEY, F_TAG, F_HEADERS, F_REPLACE, F_COUNT };
static PyObject *field_names[F_COUNT];
#define FIELD(name) {name, sizeof(name) - 1}
static const struct { const char *s; size_t n; } field_cstr[F_COUNT] = {
    FIELD("body"), FIELD("body_b64"), FIELD("delay_ms"), FIELD("deliver_at"), FIELD("key"), FIELD("tag"),
    FIELD("headers"), FIELD("replace")};

typedef struct {
    const char *body;
    Py_ssize_t body_len;
    const char *key;
    Py_ssize_t key_len;
    const char *tag;
    Py_ssize_t tag_len;
    PyObject *headers;    /* borrowed dict, NULL when none */
    const uint8_t *hdr_raw;  /* or: the entries of a msgpack map in the request body (str: str each) */
    const uint8_t *hdr_end;  /* the end of that body */
    Py_ssize_t hdr_count;
    Py_ssize_t hdr_len;   /* msgpack-encoded length */
    int64_t deliver_at;
    int replace;
} Item;

typedef struct {
    int64_t max_body, max_delay, max_tag_chars, max_tag_bytes, max_key_bytes, max_headers, max_header_bytes;
} Limits;

/* The limits tuple both produce entry points take, and their topic (bytes) checked: 0, or -1 with
 * an exception set. */
static int parse_limits(PyObject *limits_o, PyObject *topic_o, Limits *lim) {
    if (!PyArg_ParseTuple(limits_o, "LLLLLLL", &lim->max_body, &lim->max_delay, &lim->max_tag_chars,
                          &lim->max_tag_bytes, &lim->max_key_bytes, &lim->max_headers, &lim->max_header_bytes))
        return -1;
    Py_ssize_t topic_len = PyBytes_GET_SIZE(topic_o);
    if (topic_len < 1 || topic_len > 255) {
        PyErr_SetString(PyExc_ValueError, "topic must be 1-255 bytes");
        return -1;
    }
    return 0;
}

/* UTF-8 of an exact str, or NULL (error cleared) when it has lone surrogates. */
static const char *utf8_of(PyObject *s, Py_ssize_t *n) {
    const char *p = PyUnicode_AsUTF8AndSize(s, n);
    if (!p) PyErr_Clear();
    return p;
}

static Py_ssize_t mp_str_len(Py_ssize_t n) { return n < 32 ? 1 + n : n < 256 ? 2 + n : n < 65536 ? 3 + n : 5 + n; }

static Py_ssize_t mp_map_header_len(Py_ssize_t n) { return n < 16 ? 1 : n < 65536 ? 3 : 5; }

static uint8_t *mp_map_header(uint8_t *p, Py_ssize_t n) {
    if (n < 16) *p++ = (uint8_t)(0x80 | n);
    else if (n < 65536) { *p++ = 0xde; *p++ = (uint8_t)(n >> 8); *p++ = (uint8_t)n; }
    else { *p++ = 0xdf; *p++ = (uint8_t)(n >> 24); *p++ = (uint8_t)(n >> 16); *p++ = (uint8_t)(n >> 8); *p++ = (uint8_t)n; }
    return p;
}

static int64_t as_i64(PyObject *o, int *ok) {
    int overflow = 0;
    long long v = PyLong_AsLongLongAndOverflow(o, &overflow);
    if (overflow || (v == -1 && PyErr_Occurred())) {
        PyErr_Clear();
        *ok = 0;
        return 0;
    }
    *ok = 1;
    return (int64_t)v;
}

/* 1: valid and parsed into *it; 0: the fast path does not decide this item (the Python parser
 * must: it may be invalid, or valid in a form only the reference handles). -1: error set. */
static int parse_item(PyObject *obj, int64_t now_ms, const Limits *lim, Item *it) {
    if (!PyDict_CheckExact(obj)) return 0;
    memset(it, 0, sizeof(*it));
    PyObject *v[F_COUNT] = {0};
    PyObject *k, *val;
    Py_ssize_t pos = 0;
    while (PyDict_Next(obj, &pos, &k, &val)) {
        if (!PyUnicode_CheckExact(k)) return 0;
        int f = -1;
        for (int i = 0; i < F_COUNT; i++) {
            if (k == field_names[i] || PyUnicode_Compare(k, field_names[i]) == 0) { f = i; break; }
        }
        if (PyErr_Occurred()) return -1;
        if (f < 0) return 0;
        v[f] = val;
    }
    if (v[F_BODY_B64] || !v[F_BODY]) return 0;
    if (PyBytes_CheckExact(v[F_BODY])) {
        it->body = PyBytes_AS_STRING(v[F_BODY]);
        it->body_len = PyBytes_GET_SIZE(v[F_BODY]);
    } else if (PyUnicode_CheckExact(v[F_BODY])) {
        it->body = utf8_of(v[F_BODY], &it->body_len);
        if (!it->body) return 0;
    } else {
        return 0;
    }
    if (it->body_len > lim->max_body) return 0;
    if (v[F_DELAY] && v[F_DELIVER_AT]) return 0;
    int ok;
    if (v[F_DELAY]) {
        if (!PyLong_CheckExact(v[F_DELAY])) return 0;
        int64_t d = as_i64(v[F_DELAY], &ok);
        if (!ok || d < 0 || d > lim->max_delay) return 0;
        it->deliver_at = now_ms + d;
    } else if (v[F_DELIVER_AT]) {
        if (!PyLong_CheckExact(v[F_DELIVER_AT])) return 0;
        int64_t t = as_i64(v[F_DELIVER_AT], &ok);
        if (!ok || t < 0 || t > now_ms + lim->max_delay) return 0;
        it->deliver_at = t;
    } else {
        it->deliver_at = now_ms;
    }
    if (v[F_KEY] && v[F_KEY] != Py_None) {
        if (!PyUnicode_CheckExact(v[F_KEY])) return 0;
        it->key = utf8_of(v[F_KEY], &it->key_len);
        if (!it->key || it->key_len < 1 || it->key_len > lim->max_key_bytes || it->key_len > 65535) return 0;
    }
    if (v[F_TAG] && v[F_TAG] != Py_None) {
        if (!PyUnicode_CheckExact(v[F_TAG])) return 0;
        if (PyUnicode_GET_LENGTH(v[F_TAG]) > lim->max_tag_chars) return 0;
        it->tag = utf8_of(v[F_TAG], &it->tag_len);
        if (!it->tag || it->tag_len > lim->max_tag_bytes || it->tag_len > 255) return 0;
        if (it->tag_len == 0) it->tag = NULL;  /* "" is no tag */
    }
    if (v[F_HEADERS] && v[F_HEADERS] != Py_None) {
        PyObject *h = v[F_HEADERS];
        if (!PyDict_CheckExact(h)) return 0;
        Py_ssize_t n = PyDict_GET_SIZE(h);
        if (n > lim->max_headers) return 0;
        if (n) {
            Py_ssize_t size = 0, enc = mp_map_header_len(n), hp = 0;
            PyObject *hk, *hv;
            while (PyDict_Next(h, &hp, &hk, &hv)) {
                if (!PyUnicode_CheckExact(hk) || !PyUnicode_CheckExact(hv)) return 0;
                Py_ssize_t kl, vl;
                if (!utf8_of(hk, &kl) || !utf8_of(hv, &vl)) return 0;
                size += kl + vl;
                enc += mp_str_len(kl) + mp_str_len(vl);
            }
            if (size > lim->max_header_bytes || enc > 65535) return 0;
            it->headers = h;
            it->hdr_len = enc;
        }
    }
    if (v[F_REPLACE]) {
        if (v[F_REPLACE] == Py_True) it->replace = 1;
        else if (v[F_REPLACE] != Py_False) return 0;
    }
    return 1;
}

static uint8_t *encode_record(uint8_t *p, const Item *it, const uint8_t *topic, Py_ssize_t topic_len,
                              uint64_t seq, int64_t produced_at, uint16_t flags) {
    uint8_t *start = p;
    uint32_t length = (uint32_t)(RECORD_HEADER + topic_len + it->tag_len + it->key_len + it->hdr_len + it->body_len);
    wr32(p, length);
    p[8] = RECORD_VERSION;
    p[9] = REC_MESSAGE;
    wr16(p + 10, flags);
    wr64(p + 12, seq);
    wri64(p + 20, it->deliver_at);
    wri64(p + 28, produced_at);
    wr16(p + 36, 0);
    p[38] = (uint8_t)topic_len;
    p[39] = (uint8_t)it->tag_len;
    wr16(p + 40, (uint16_t)it->key_len);
    wr16(p + 42, (uint16_t)it->hdr_len);
    wr32(p + 44, (uint32_t)it->body_len);
    p += RECORD_HEADER;
    memcpy(p, topic, (size_t)topic_len);
    p += topic_len;
    if (it->tag_len) { memcpy(p, it->tag, (size_t)it->tag_len); p += it->tag_len; }
    if (it->key_len) { memcpy(p, it->key, (size_t)it->key_len); p += it->key_len; }
    if (it->headers) {
        p = mp_map_header(p, PyDict_GET_SIZE(it->headers));
        Py_ssize_t hp = 0;
        PyObject *hk, *hv;
        while (PyDict_Next(it->headers, &hp, &hk, &hv)) {
            Py_ssize_t kl, vl;
            const char *ks = PyUnicode_AsUTF8AndSize(hk, &kl), *vs = PyUnicode_AsUTF8AndSize(hv, &vl);
            p = mp_str(p, ks, kl);
            p = mp_str(p, vs, vl);
        }
    } else if (it->hdr_raw) {  /* re-encoded in the shortest form, as msgpack.packb writes it */
        p = mp_map_header(p, it->hdr_count);
        Mp m = {it->hdr_raw, it->hdr_end};
        MpVal s;
        for (Py_ssize_t e = 0; e < 2 * it->hdr_count && mp_read(&m, &s); e++)  /* (each a whole str: checked) */
            p = mp_str(p, (const char *)s.s, (Py_ssize_t)s.n);
    }
    memcpy(p, it->body, (size_t)it->body_len);
    p += it->body_len;
    wr32(start + 4, crc32_update(0, start + 8, length - 8));
    return p;
}

static PyObject *encode_items(const Item *its, Py_ssize_t n, const uint8_t *topic, Py_ssize_t topic_len,
                              int64_t now_ms, int64_t first_seq, PyObject *select_o);

/* encode_produce(items, topic, now_ms, first_seq, limits, select) -> tuple | None
 *
 * Validates every item of a produce batch; None when the fast path does not decide the batch
 * (the caller then runs the reference parser, which raises the right error or handles the form).
 * Otherwise (records, sizes, deliver_at, keys, replace): the MESSAGE records of the selected
 * items (all items when `select` is None; an array of u32 item indexes otherwise) with seqs
 * first_seq, first_seq+1, ..., each CONTINUED but the last; their sizes (u32 each); every item's
 * due time (i64 each); keys (a Keys of str|None per item, batch_keyseq.c, or None if no item has
 * a key) and replace (a list of bool per item, or None if none asks to replace). */
PyObject *encode_produce(PyObject *self, PyObject *args) {
    PyObject *items, *topic_o, *limits_o, *select_o;
    long long now_ms, first_seq;
    if (!PyArg_ParseTuple(args, "O!O!LLO!O", &PyList_Type, &items, &PyBytes_Type, &topic_o, &now_ms, &first_seq,
                          &PyTuple_Type, &limits_o, &select_o))
        return NULL;
    Limits lim;
    if (parse_limits(limits_o, topic_o, &lim) < 0) return NULL;
    const uint8_t *topic = (const uint8_t *)PyBytes_AS_STRING(topic_o);
    Py_ssize_t topic_len = PyBytes_GET_SIZE(topic_o);
    Py_ssize_t n = PyList_GET_SIZE(items);
    Item *its = PyMem_Calloc(n ? (size_t)n : 1, sizeof(Item));
    if (!its) return PyErr_NoMemory();
    PyObject *result = NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        int r = parse_item(PyList_GET_ITEM(items, i), now_ms, &lim, &its[i]);
        if (r < 0) goto done;
        if (r == 0) { result = Py_None; Py_INCREF(Py_None); goto done; }
    }
    result = encode_items(its, n, topic, topic_len, now_ms, first_seq, select_o);
done:
    PyMem_Free(its);
    return result;
}

/* The records, sizes, due times, keys and replace flags of parsed items (encode_produce's result),
 * None when a selected item's record would pass MAX_RECORD, NULL with an error set. */
static PyObject *encode_items(const Item *its, Py_ssize_t n, const uint8_t *topic, Py_ssize_t topic_len,
                              int64_t now_ms, int64_t first_seq, PyObject *select_o) {
    PyObject *result = NULL, *keys = Py_None, *replace = Py_None, *records = NULL, *sizes = NULL, *dues = NULL;
    Py_INCREF(Py_None);
    Py_INCREF(Py_None);
    Buf sel = {.held = 0};
    int any_key = 0, any_replace = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        any_key |= its[i].key != NULL;
        any_replace |= its[i].replace;
    }
    const uint32_t *selected = NULL;
    Py_ssize_t m = n;
    if (select_o != Py_None) {
        if (buf_get(select_o, &sel, 0, "select") < 0) goto done;
        if (sel.view.len % 4) { PyErr_SetString(PyExc_ValueError, "select must hold u32 indexes"); goto done; }
        selected = sel.view.buf;
        m = sel.view.len / 4;
        for (Py_ssize_t j = 0; j < m; j++)
            if (selected[j] >= (uint64_t)n) { PyErr_SetString(PyExc_IndexError, "select index out of range"); goto done; }
    }
    size_t total = 0;
    for (Py_ssize_t j = 0; j < m; j++) {
        const Item *it = &its[selected ? selected[j] : (uint32_t)j];
        size_t len = RECORD_HEADER + (size_t)(topic_len + it->tag_len + it->key_len + it->hdr_len + it->body_len);
        if (len > MAX_RECORD) { result = Py_None; Py_INCREF(Py_None); goto done; }
        total += len;
    }
    records = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)total);
    sizes = PyBytes_FromStringAndSize(NULL, m * 4);
    dues = PyBytes_FromStringAndSize(NULL, n * 8);
    if (!records || !sizes || !dues) goto done;
    uint8_t *p = (uint8_t *)PyBytes_AS_STRING(records), *sz = (uint8_t *)PyBytes_AS_STRING(sizes);
    for (Py_ssize_t j = 0; j < m; j++) {
        const Item *it = &its[selected ? selected[j] : (uint32_t)j];
        uint8_t *q = encode_record(p, it, topic, topic_len, (uint64_t)first_seq + (uint64_t)j, now_ms,
                                   j < m - 1 ? FLAG_CONTINUED : 0);
        wr32(sz + 4 * j, (uint32_t)(q - p));
        p = q;
    }
    uint8_t *dp = (uint8_t *)PyBytes_AS_STRING(dues);
    for (Py_ssize_t i = 0; i < n; i++) wri64(dp + 8 * i, its[i].deliver_at);
    if (any_key) {  /* (a key is at most 65,535 bytes of valid UTF-8: parse_item, parse_raw_item) */
        size_t text = 0;
        for (Py_ssize_t i = 0; i < n; i++) text += its[i].key ? (size_t)its[i].key_len : 0;
        Keys *packed = keys_new(n, text);
        if (!packed) goto done;
        Py_DECREF(keys);
        keys = (PyObject *)packed;
        uint32_t at = 0;
        for (Py_ssize_t i = 0; i < n; i++) {
            if (!its[i].key) continue;
            if (keys_set(packed, i, its[i].key, (uint32_t)its[i].key_len, at) < 0) goto done;
            at += (uint32_t)its[i].key_len;
        }
    }
    if (any_replace) {
        Py_DECREF(replace);
        replace = PyList_New(n);
        if (!replace) goto done;
        for (Py_ssize_t i = 0; i < n; i++) {
            PyObject *b = its[i].replace ? Py_True : Py_False;
            Py_INCREF(b);
            PyList_SET_ITEM(replace, i, b);
        }
    }
    result = PyTuple_Pack(5, records, sizes, dues, keys, replace);
done:
    buf_release(&sel);
    Py_XDECREF(records);
    Py_XDECREF(sizes);
    Py_XDECREF(dues);
    Py_XDECREF(keys);
    Py_XDECREF(replace);
    return result;
}

/* ------------------------------------------------------------------------------------------ */
/* produce from the request body itself: msgpack {"messages": [...]} to records, no objects    */

#define MAX_RAW_HEADERS 64  /* a message with more is left to the reference parser */

/* One message map of a raw batch into *it (the same checks as parse_item, on the bytes): 1
 * decided, 0 not (the reference parser decides). `elements` counts map keys and values. */
static int parse_raw_item(Mp *m, int64_t now_ms, const Limits *lim, Item *it, int64_t *elements) {
    MpVal v, k;
    memset(it, 0, sizeof(*it));
    if (!mp_read(m, &v) || v.kind != MK_MAP || v.n > F_COUNT) return 0;
    uint64_t fields = v.n;
    *elements += 2 * (int64_t)fields;
    unsigned seen = 0;
    int has_body = 0;
    for (uint64_t e = 0; e < fields; e++) {
        if (!mp_read(m, &k) || k.kind != MK_STR) return 0;
        int f = -1;
        for (int i = 0; i < F_COUNT; i++)
            if (k.n == field_cstr[i].n && memcmp(k.s, field_cstr[i].s, field_cstr[i].n) == 0) { f = i; break; }
        if (f < 0 || f == F_BODY_B64 || (seen & (1u << f))) return 0;  /* unknown, body_b64, a repeat */
        seen |= 1u << f;
        if (!mp_read(m, &v)) return 0;
        int64_t x;
        switch (f) {
        case F_BODY:
            if (v.kind != MK_STR && v.kind != MK_BIN) return 0;
            it->body = (const char *)v.s;
            it->body_len = (Py_ssize_t)v.n;
            has_body = 1;
            break;
        case F_DELAY:
            if (!mp_i64(&v, &x) || x < 0 || x > lim->max_delay) return 0;
            it->deliver_at = now_ms + x;
            break;
        case F_DELIVER_AT:
            if (!mp_i64(&v, &x) || x < 0 || x > now_ms + lim->max_delay) return 0;
            it->deliver_at = x;
            break;
        case F_KEY:
            if (v.kind == MK_NIL) break;
            if (v.kind != MK_STR || v.n < 1 || (int64_t)v.n > lim->max_key_bytes || v.n > 65535) return 0;
            it->key = (const char *)v.s;
            it->key_len = (Py_ssize_t)v.n;
            break;
        case F_TAG:
            if (v.kind == MK_NIL) break;
            if (v.kind != MK_STR || (int64_t)utf8_chars(v.s, v.n) > lim->max_tag_chars ||
                (int64_t)v.n > lim->max_tag_bytes || v.n > 255)
                return 0;
            if (v.n) { it->tag = (const char *)v.s; it->tag_len = (Py_ssize_t)v.n; }
            break;
        case F_HEADERS: {
            if (v.kind == MK_NIL) break;
            if (v.kind != MK_MAP || (int64_t)v.n > lim->max_headers || v.n > MAX_RAW_HEADERS) return 0;
            *elements += 2 * (int64_t)v.n;
            if (!v.n) break;
            const uint8_t *first = m->p, *names[MAX_RAW_HEADERS];
            uint64_t lens[MAX_RAW_HEADERS];
            Py_ssize_t size = 0, enc = mp_map_header_len((Py_ssize_t)v.n);
            MpVal hk, hv;
            for (uint64_t h = 0; h < v.n; h++) {
                if (!mp_read(m, &hk) || hk.kind != MK_STR || !mp_read(m, &hv) || hv.kind != MK_STR) return 0;
                for (uint64_t j = 0; j < h; j++)  /* a repeated name: the reference keeps the last value */
                    if (lens[j] == hk.n && memcmp(names[j], hk.s, hk.n) == 0) return 0;
                names[h] = hk.s;
                lens[h] = hk.n;
                size += (Py_ssize_t)(hk.n + hv.n);
                enc += mp_str_len((Py_ssize_t)hk.n) + mp_str_len((Py_ssize_t)hv.n);
            }
            if (size > lim->max_header_bytes || enc > 65535) return 0;
            it->hdr_raw = first;
            it->hdr_end = m->end;
            it->hdr_count = (Py_ssize_t)v.n;
            it->hdr_len = enc;
            break;
        }
        case F_REPLACE:
            if (v.kind == MK_TRUE) it->replace = 1;
            else if (v.kind != MK_FALSE) return 0;
            break;
        }
    }
    if (!has_body || it->body_len > lim->max_body) return 0;
    if ((seen & (1u << F_DELAY)) && (seen & (1u << F_DELIVER_AT))) return 0;
    if (!(seen & ((1u << F_DELAY) | (1u << F_DELIVER_AT)))) it->deliver_at = now_ms;
    return 1;
}

/* encode_produce_raw(raw, topic, now_ms, first_seq, limits, max_batch, max_elements, select)
 *
 * encode_produce for a msgpack produce body as it arrived, {"messages": [...]}, read straight from
 * the bytes. None when this does not decide the body; then the caller's reference path does. It
 * decides a subset of what the reference (storage.batch) decides — never a body the reference
 * leaves undecided — and where it decides, its result is the reference's, byte for byte. */
PyObject *encode_produce_raw(PyObject *self, PyObject *args) {
    PyObject *raw_o, *topic_o, *limits_o, *select_o;
    long long now_ms, first_seq, max_batch, max_elements;
    if (!PyArg_ParseTuple(args, "OO!LLO!LLO", &raw_o, &PyBytes_Type, &topic_o, &now_ms, &first_seq, &PyTuple_Type,
                          &limits_o, &max_batch, &max_elements, &select_o))
        return NULL;
    Limits lim;
    if (parse_limits(limits_o, topic_o, &lim) < 0) return NULL;
    const uint8_t *topic = (const uint8_t *)PyBytes_AS_STRING(topic_o);
    Py_ssize_t topic_len = PyBytes_GET_SIZE(topic_o);
    Buf raw;
    if (buf_get(raw_o, &raw, 0, "raw") < 0) return NULL;
    Item *its = NULL;
    PyObject *result = NULL;
    Mp m = {raw.view.buf, (const uint8_t *)raw.view.buf + raw.view.len};
    int64_t elements = 0;
    /* {"messages": [ ... ]}: an array of 1..max_batch */
    uint64_t n;
    if (!mp_envelope(&m, "messages", &n)) goto undecided;
    if (n < 1 || (long long)n > max_batch || n > (uint64_t)raw.view.len) goto undecided;
    elements = 2 + (int64_t)n;
    its = PyMem_Calloc((size_t)n, sizeof(Item));
    if (!its) { PyErr_NoMemory(); goto done; }
    for (uint64_t i = 0; i < n; i++)
        if (!parse_raw_item(&m, now_ms, &lim, &its[i], &elements)) goto undecided;
    if (m.p != m.end || elements > max_elements) goto undecided;
    result = encode_items(its, (Py_ssize_t)n, topic, topic_len, now_ms, first_seq, select_o);
    goto done;
undecided:
    result = Py_None;
    Py_INCREF(Py_None);
done:
    PyMem_Free(its);
    buf_release(&raw);
    return result;
}

/* ------------------------------------------------------------------------------------------ */
/* message-table entries and rows for appended records                                         */

/* record_offsets(sizes, start): the offset of each of records written back to back from `start`,
 * their lengths given as u32s: i64s (an array('q')'s bytes). Specified by storage/commitlog.py's
 * record_offsets; the prefix sum in Python cost produce 38 ns a message. */
PyObject *record_offsets(PyObject *self, PyObject *args) {
    PyObject *sizes_o, *start_o, *out = NULL;
    if (!PyArg_ParseTuple(args, "OO", &sizes_o, &start_o)) return NULL;
    Buf sb;
    if (buf_get(sizes_o, &sb, 0, "sizes") < 0) return NULL;
    if (sb.view.len % 4) { PyErr_SetString(PyExc_ValueError, "sizes: not a whole number of u32s"); goto done; }
    if (!PyLong_Check(start_o)) { PyErr_SetString(PyExc_TypeError, "start: expected an int"); goto done; }
    int overflow = 0;
    long long start = PyLong_AsLongLongAndOverflow(start_o, &overflow);
    if (start == -1 && PyErr_Occurred()) goto done;
    Py_ssize_t n = sb.view.len / 4;
    const uint8_t *s = sb.view.buf;
    uint64_t total = 0;  /* (at most 2^32 a size: no wrap below 2^32 sizes) */
    for (Py_ssize_t i = 0; i < n; i++) total += rd32(s + 4 * i);
    if (overflow || start < 0 || total > (uint64_t)(INT64_MAX - start)) {
        PyErr_SetString(PyExc_ValueError, "offsets out of range");
        goto done;
    }
    out = PyBytes_FromStringAndSize(NULL, 8 * n);
    if (!out) goto done;
    uint8_t *o = (uint8_t *)PyBytes_AS_STRING(out);
    int64_t pos = start;
    for (Py_ssize_t i = 0; i < n; i++) {
        wri64(o + 8 * i, pos);
        pos += (int64_t)rd32(s + 4 * i);
    }
done:
    buf_release(&sb);
    return out;
}

/* produced_rows(records, offsets, topic_hash) -> (entries, rows)
 * For records just appended (a buffer of whole records and each one's commit-log offset, i64):
 * the message-table entries (SCHEDULED, flags 0, roll 0, size, offset) and the MessageRows that
 * enqueue-put indexes, read from the record headers — what a scan of the log would give, without
 * the second trip through the file. */
PyObject *produced_rows(PyObject *self, PyObject *args) {
    PyObject *rec_o, *off_o;
    unsigned int topic_hash;
    if (!PyArg_ParseTuple(args, "OOI", &rec_o, &off_o, &topic_hash)) return NULL;
    Buf rb, ob;
    if (buf_get(rec_o, &rb, 0, "records") < 0) return NULL;
    if (buf_get(off_o, &ob, 0, "offsets") < 0) { buf_release(&rb); return NULL; }
    PyObject *entries = NULL, *rows = NULL, *res = NULL;
    Py_ssize_t n = ob.view.len / 8;
    if (ob.view.len % 8) { PyErr_SetString(PyExc_ValueError, "offsets must be i64"); goto done; }
    entries = PyBytes_FromStringAndSize(NULL, n * ENTRY_SIZE);
    rows = PyBytes_FromStringAndSize(NULL, n * MROW);
    if (!entries || !rows) goto done;
    const uint8_t *r = rb.view.buf, *end = r + rb.view.len;
    const uint8_t *offs = ob.view.buf;
    uint8_t *e = (uint8_t *)PyBytes_AS_STRING(entries), *w = (uint8_t *)PyBytes_AS_STRING(rows);
    for (Py_ssize_t i = 0; i < n; i++) {
        if (end - r < RECORD_HEADER) { PyErr_SetString(PyExc_ValueError, "records shorter than their offsets"); goto done; }
        uint32_t len = rd32(r);
        if (len < RECORD_HEADER || (size_t)(end - r) < len) { PyErr_SetString(PyExc_ValueError, "record length"); goto done; }
        size_t tl = r[38], gl = r[39], kl = rd16(r + 40);
        if (RECORD_HEADER + tl + gl > len) { PyErr_SetString(PyExc_ValueError, "record fields"); goto done; }
        int64_t off = rdi64(offs + 8 * i);
        e[0] = ST_SCHEDULED; e[1] = 0; wr16(e + 2, 0); wr32(e + 4, len); wri64(e + 8, off);
        e += ENTRY_SIZE;
        wr64(w, rd64(r + 12));
        wri64(w + 8, rdi64(r + 20));
        wri64(w + 16, off);
        wr32(w + 24, len);
        wr32(w + 28, topic_hash);
        wr32(w + 32, tag_hash(r + RECORD_HEADER + tl, gl));
        wr16(w + 36, rd16(r + 36));
        w[38] = r[9];
        w[39] = kl ? ROW_KEYED : 0;
        w += MROW;
        r += len;
    }
    res = PyTuple_Pack(2, entries, rows);
done:
    Py_XDECREF(entries);
    Py_XDECREF(rows);
    buf_release(&rb);
    buf_release(&ob);
    return res;
}

/* ------------------------------------------------------------------------------------------ */
/* the answer of a produce                                                                     */

/* encode_produced(seqs, deliver_at, duplicate, prefix, as_json) -> bytes
 * The answer of a produce, {"messages": [{"id", "deliver_at", "duplicate"}, ...]}, as
 * msgpack.packb or json.dumps(separators=(",", ":")) would write it: ids are prefix + seq in hex
 * (u64 seqs, i64 due times, u8 duplicate flags). JSON needs an ASCII prefix (None otherwise: the
 * caller encodes it). */
PyObject *encode_produced(PyObject *self, PyObject *args) {
    PyObject *seq_o, *due_o, *dup_o, *prefix_o;
    int as_json;
    if (!PyArg_ParseTuple(args, "OOOO!p", &seq_o, &due_o, &dup_o, &PyBytes_Type, &prefix_o, &as_json)) return NULL;
    Buf sb = {.held = 0}, db = {.held = 0}, ub = {.held = 0};
    Out o = {0};
    PyObject *res = NULL;
    /* `seqs` an int: the first of consecutive seqs, one a due time */
    int consecutive = PyLong_Check(seq_o);
    unsigned long long first = consecutive ? PyLong_AsUnsignedLongLong(seq_o) : 0;
    if (consecutive && first == (unsigned long long)-1 && PyErr_Occurred()) {
        if (PyErr_ExceptionMatches(PyExc_OverflowError)) {
            PyErr_Clear();
            PyErr_SetString(PyExc_ValueError, "seqs: out of range");
        }
        return NULL;
    }
    if ((!consecutive && buf_get(seq_o, &sb, 0, "seqs") < 0) || buf_get(due_o, &db, 0, "deliver_at") < 0 ||
        buf_get(dup_o, &ub, 0, "duplicate") < 0)
        goto done;
    Py_ssize_t n = (consecutive ? db.view.len : sb.view.len) / 8;
    if ((!consecutive && sb.view.len % 8) || db.view.len != n * 8 || ub.view.len != n) {
        PyErr_SetString(PyExc_ValueError, "seqs, deliver_at and duplicate must be of one length");
        goto done;
    }
    if (consecutive && n && first > UINT64_MAX - (uint64_t)(n - 1)) {
        PyErr_SetString(PyExc_ValueError, "seqs: out of range");
        goto done;
    }
    const char *prefix = PyBytes_AS_STRING(prefix_o);
    size_t plen = (size_t)PyBytes_GET_SIZE(prefix_o);
    if (as_json) {
        for (size_t k = 0; k < plen; k++)
            if ((uint8_t)prefix[k] >= 0x80 || prefix[k] == '"' || prefix[k] == '\\' || (uint8_t)prefix[k] < 0x20) {
                res = Py_None; Py_INCREF(res); goto done;
            }
    }
    uint8_t *p = out_take(&o, 16);
    if (!p) goto done;
    if (as_json) {
        memcpy(p, "{\"messages\":[", 13);
        o.n = 13;
    } else {
        uint8_t *q = p;
        *q++ = 0x81;
        q = mp_fixstr(q, "messages");
        if (n < 16) *q++ = (uint8_t)(0x90 | n);
        else if (n < 65536) { *q++ = 0xdc; *q++ = (uint8_t)(n >> 8); *q++ = (uint8_t)n; }
        else { *q++ = 0xdd; for (int k = 3; k >= 0; k--) *q++ = (uint8_t)((uint64_t)n >> (8 * k)); }
        o.n = (size_t)(q - p);
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        char hex[16];
        size_t hl = hex_of(consecutive ? (uint64_t)first + (uint64_t)i : rd64((const uint8_t *)sb.view.buf + 8 * i), hex);
        int64_t due = rdi64((const uint8_t *)db.view.buf + 8 * i);
        int dup = ((const uint8_t *)ub.view.buf)[i] != 0;
        uint8_t *q = out_take(&o, 80 + plen + hl);
        if (!q) goto done;
        uint8_t *q0 = q;
        if (as_json) {
            q += sprintf((char *)q, "%s{\"id\":\"", i ? "," : "");
            memcpy(q, prefix, plen); q += plen;
            memcpy(q, hex, hl); q += hl;
            q += sprintf((char *)q, "\",\"deliver_at\":%lld,\"duplicate\":%s}", (long long)due, dup ? "true" : "false");
        } else {
            *q++ = 0x83;
            q = mp_fixstr(q, "id");
            char idbuf[64 + 16];
            if (plen > 64) { PyErr_SetString(PyExc_ValueError, "prefix"); goto done; }
            memcpy(idbuf, prefix, plen);
            memcpy(idbuf + plen, hex, hl);
            q = mp_str(q, idbuf, (Py_ssize_t)(plen + hl));
            q = mp_fixstr(q, "deliver_at");
            q = mp_uint_or_int(q, due);
            q = mp_fixstr(q, "duplicate");
            *q++ = dup ? 0xc3 : 0xc2;
        }
        o.n -= 80 + plen + hl - (size_t)(q - q0);
    }
    if (as_json) {
        uint8_t *q = out_take(&o, 2);
        if (!q) goto done;
        q[0] = ']'; q[1] = '}';
    }
    res = out_bytes(&o);
done:
    buf_release(&sb);
    buf_release(&db);
    buf_release(&ub);
    out_free(&o);
    return res;
}

int batch_produce_init(void) {
    for (int i = 0; i < F_COUNT; i++) {
        field_names[i] = PyUnicode_InternFromString(field_cstr[i].s);
        if (!field_names[i]) return -1;
    }
    return 0;
}
