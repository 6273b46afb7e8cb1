/*
 * delayd.storage._batch — the compiled batch core.
 *
 * Every function here takes a whole batch and returns a whole batch: the per-message loops of
 * produce, enqueue-put, dequeue-get, dequeue-get-message and dequeue-put, out of Python. The
 * row layouts, the record and unit byte tables and the exact semantics are specified by the pure
 * Python reference in storage/batch.py; tests/storage/test_batch_differential.py checks, with
 * hypothesis, that both give the same bytes for the same input, damaged input included.
 *
 * Rules kept throughout: every read is bounds-checked against the buffer it comes from (damaged
 * input is an error, never a crash or an out-of-bounds read); nothing here allocates per message
 * on the Python heap except where a Python object is the result; no function keeps a pointer
 * into a Python buffer after it returns.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "delayd's file formats are little-endian; this build assumes a little-endian machine"
#endif

/* ------------------------------------------------------------------------------------------ */
/* constants shared with the Python modules (asserted equal at import by storage/batch.py)    */

#define RECORD_VERSION 1
#define RECORD_HEADER 48
#define MAX_RECORD (64u * 1024u * 1024u)
#define REC_MESSAGE 1
#define REC_CANCEL 2
#define REC_ROLL 3
#define REC_GROUP 4
#define REC_RELEASE 5  /* the last record type (storage/commitlog.py RecordType) */
#define FLAG_CONTINUED 1

#define UNIT_SIZE 52
#define UNIT_DEFAULT 1
#define UNIT_ROLL 2
#define UNIT_DELETE 4
#define NO_POS (-1)

#define SLOT_SIZE 32
#define ENTRY_SIZE 16
#define READY_UNIT 40

#define ST_UNKNOWN 0
#define ST_SCHEDULED 1
#define ST_DELIVERED 2
#define ST_CANCELLED 3
#define MT_FLAG_SLOT 1

/* In-memory rows passed between stages (byte tables in storage/batch.py). */
#define MROW 40  /* MessageRow: seq, deliver_at, offset, size, topic_hash, tag_hash, roll, type, bits */
#define DROW 48  /* DueRow: deliver_at, seq, offset, size, topic_hash, tag_hash, bits, slot_time */
#define UROW 60  /* UnitRow: pos, then the 52 unit bytes */
#define ROW_KEYED 1

/* ------------------------------------------------------------------------------------------ */
/* little-endian field access                                                                  */

static inline uint16_t rd16(const uint8_t *p) { uint16_t v; memcpy(&v, p, 2); return v; }
static inline uint32_t rd32(const uint8_t *p) { uint32_t v; memcpy(&v, p, 4); return v; }
static inline uint64_t rd64(const uint8_t *p) { uint64_t v; memcpy(&v, p, 8); return v; }
static inline int64_t rdi64(const uint8_t *p) { int64_t v; memcpy(&v, p, 8); return v; }
static inline int32_t rdi32(const uint8_t *p) { int32_t v; memcpy(&v, p, 4); return v; }
static inline void wr16(uint8_t *p, uint16_t v) { memcpy(p, &v, 2); }
static inline void wr32(uint8_t *p, uint32_t v) { memcpy(p, &v, 4); }
static inline void wr64(uint8_t *p, uint64_t v) { memcpy(p, &v, 8); }
static inline void wri64(uint8_t *p, int64_t v) { memcpy(p, &v, 8); }
static inline void wri32(uint8_t *p, int32_t v) { memcpy(p, &v, 4); }

/* Floor division and modulo as Python does them (slot arithmetic on possibly negative times). */
static inline int64_t floordiv64(int64_t a, int64_t b) { int64_t q = a / b; if ((a % b != 0) && ((a < 0) != (b < 0))) q--; return q; }
static inline int64_t fmod64(int64_t a, int64_t b) { int64_t m = a % b; if (m != 0 && ((m < 0) != (b < 0))) m += b; return m; }

/* ------------------------------------------------------------------------------------------ */
/* CRC-32 (the zlib/ISO-HDLC polynomial, = zlib.crc32), slicing by 8                           */

static uint32_t crc_table[8][256];

static void crc_init(void) {
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++) c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
        crc_table[0][i] = c;
    }
    for (uint32_t i = 0; i < 256; i++)
        for (int t = 1; t < 8; t++)
            crc_table[t][i] = (crc_table[t - 1][i] >> 8) ^ crc_table[0][crc_table[t - 1][i] & 0xFF];
}

static uint32_t crc32_update(uint32_t crc, const uint8_t *p, size_t n) {
    crc = ~crc;
    while (n >= 8) {
        uint32_t a = rd32(p) ^ crc, b = rd32(p + 4);
        crc = crc_table[7][a & 0xFF] ^ crc_table[6][(a >> 8) & 0xFF] ^ crc_table[5][(a >> 16) & 0xFF] ^
              crc_table[4][a >> 24] ^ crc_table[3][b & 0xFF] ^ crc_table[2][(b >> 8) & 0xFF] ^
              crc_table[1][(b >> 16) & 0xFF] ^ crc_table[0][b >> 24];
        p += 8;
        n -= 8;
    }
    while (n--) crc = crc_table[0][(crc ^ *p++) & 0xFF] ^ (crc >> 8);
    return ~crc;
}

/* The ready queue's tag hash: crc32 of the tag, 1 if that is 0, 0 for no tag. */
static inline uint32_t tag_hash(const uint8_t *tag, size_t n) {
    if (n == 0) return 0;
    uint32_t h = crc32_update(0, tag, n);
    return h ? h : 1;
}

/* ------------------------------------------------------------------------------------------ */
/* small helpers                                                                               */

/* A read-only or writable view of a Python buffer, released by buf_release. */
typedef struct {
    Py_buffer view;
    int held;
} Buf;

static int buf_get(PyObject *obj, Buf *b, int writable, const char *what) {
    b->held = 0;
    if (PyObject_GetBuffer(obj, &b->view, writable ? PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS : PyBUF_C_CONTIGUOUS) < 0) {
        PyErr_Format(PyExc_TypeError, "%s: expected a %sbuffer", what, writable ? "writable " : "");
        return -1;
    }
    b->held = 1;
    return 0;
}

static void buf_release(Buf *b) {
    if (b->held) PyBuffer_Release(&b->view);
    b->held = 0;
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

/* A growable byte buffer. */
typedef struct {
    uint8_t *p;
    size_t n, cap;
} Out;

static int out_reserve(Out *o, size_t extra) {
    if (o->n + extra <= o->cap) return 0;
    size_t cap = o->cap ? o->cap : 4096;
    while (cap < o->n + extra) cap *= 2;
    uint8_t *p = PyMem_Realloc(o->p, cap);
    if (!p) { PyErr_NoMemory(); return -1; }
    o->p = p;
    o->cap = cap;
    return 0;
}

static uint8_t *out_take(Out *o, size_t n) {
    if (out_reserve(o, n) < 0) return NULL;
    uint8_t *p = o->p + o->n;
    o->n += n;
    return p;
}

static PyObject *out_bytes(Out *o) {
    PyObject *b = PyBytes_FromStringAndSize((const char *)o->p, (Py_ssize_t)o->n);
    PyMem_Free(o->p);
    o->p = NULL;
    o->n = o->cap = 0;
    return b;
}

static void out_free(Out *o) { PyMem_Free(o->p); o->p = NULL; o->n = o->cap = 0; }

/* A small open-addressing set/map of u64 keys (seqs, slot times). */
typedef struct {
    uint64_t *keys;
    int64_t *vals;
    uint8_t *used;
    size_t cap, n;
} Map;

static int map_init(Map *m, size_t expected) {
    size_t cap = 16;
    while (cap < expected * 2 + 1) cap *= 2;
    m->keys = PyMem_Calloc(cap, sizeof(uint64_t));
    m->vals = PyMem_Calloc(cap, sizeof(int64_t));
    m->used = PyMem_Calloc(cap, 1);
    m->cap = cap;
    m->n = 0;
    if (!m->keys || !m->vals || !m->used) { PyErr_NoMemory(); return -1; }
    return 0;
}

static void map_free(Map *m) { PyMem_Free(m->keys); PyMem_Free(m->vals); PyMem_Free(m->used); memset(m, 0, sizeof(*m)); }

static inline size_t map_hash(uint64_t k) { k ^= k >> 33; k *= 0xff51afd7ed558ccdULL; k ^= k >> 33; return (size_t)k; }

/* Returns the slot of `k` (inserting it with value `init` when absent), or SIZE_MAX on no memory. */
static size_t map_slot(Map *m, uint64_t k, int64_t init, int *inserted);

static int map_grow(Map *m) {
    Map bigger;
    if (map_init(&bigger, m->cap) < 0) return -1;
    for (size_t i = 0; i < m->cap; i++) {
        if (m->used[i]) {
            int ins;
            size_t s = map_slot(&bigger, m->keys[i], m->vals[i], &ins);
            (void)s;
        }
    }
    map_free(m);
    *m = bigger;
    return 0;
}

static size_t map_slot(Map *m, uint64_t k, int64_t init, int *inserted) {
    if ((m->n + 1) * 2 > m->cap && map_grow(m) < 0) return SIZE_MAX;
    size_t mask = m->cap - 1, i = map_hash(k) & mask;
    while (m->used[i]) {
        if (m->keys[i] == k) { *inserted = 0; return i; }
        i = (i + 1) & mask;
    }
    m->used[i] = 1;
    m->keys[i] = k;
    m->vals[i] = init;
    m->n++;
    *inserted = 1;
    return i;
}

static int map_has(const Map *m, uint64_t k) {
    if (!m->cap) return 0;
    size_t mask = m->cap - 1, i = map_hash(k) & mask;
    while (m->used[i]) {
        if (m->keys[i] == k) return 1;
        i = (i + 1) & mask;
    }
    return 0;
}

/* ------------------------------------------------------------------------------------------ */
/* message-table spans: the entries of a batch, held in memory (storage/msgtable.py _Span)     */

typedef struct {
    PyObject *obj;      /* the _Span (borrowed from the list) */
    uint64_t base;      /* seq of the first entry in buf */
    Py_ssize_t valid;   /* bytes of buf read from the file; entries past it are UNKNOWN */
    Py_ssize_t lo, hi;  /* bytes changed in this call */
    Buf buf;
} Span;

typedef struct {
    Span *s;
    Py_ssize_t n;
} Spans;

static void spans_release(Spans *sp) {
    for (Py_ssize_t i = 0; i < sp->n; i++) buf_release(&sp->s[i].buf);
    PyMem_Free(sp->s);
    sp->s = NULL;
    sp->n = 0;
}

/* `spans`: a list of objects with attributes base (int), buf (bytearray), valid, lo, hi (ints),
 * sorted by base and not overlapping (MessageTable.begin_batch makes them). */
static int spans_get(PyObject *list, Spans *sp) {
    sp->s = NULL;
    sp->n = 0;
    if (!PyList_Check(list)) { PyErr_SetString(PyExc_TypeError, "spans must be a list"); return -1; }
    Py_ssize_t n = PyList_GET_SIZE(list);
    sp->s = PyMem_Calloc(n ? (size_t)n : 1, sizeof(Span));
    if (!sp->s) { PyErr_NoMemory(); return -1; }
    for (Py_ssize_t i = 0; i < n; i++) {
        Span *s = &sp->s[i];
        s->obj = PyList_GET_ITEM(list, i);
        PyObject *base = PyObject_GetAttrString(s->obj, "base");
        PyObject *valid = base ? PyObject_GetAttrString(s->obj, "valid") : NULL;
        PyObject *bufo = valid ? PyObject_GetAttrString(s->obj, "buf") : NULL;
        int ok = bufo != NULL;
        if (ok) {
            s->base = PyLong_AsUnsignedLongLong(base);
            s->valid = PyLong_AsSsize_t(valid);
            ok = !PyErr_Occurred() && buf_get(bufo, &s->buf, 1, "span buffer") == 0;
        }
        Py_XDECREF(base);
        Py_XDECREF(valid);
        Py_XDECREF(bufo);
        if (!ok) { sp->n = i; spans_release(sp); return -1; }
        s->lo = s->buf.view.len;
        s->hi = 0;
        sp->n = i + 1;
    }
    return 0;
}

/* Write back what changed: lo/hi/valid, as _Span.touch() does. */
static int spans_commit(Spans *sp) {
    for (Py_ssize_t i = 0; i < sp->n; i++) {
        Span *s = &sp->s[i];
        if (s->lo >= s->hi) continue;
        PyObject *lo = PyObject_GetAttrString(s->obj, "lo");
        PyObject *hi = lo ? PyObject_GetAttrString(s->obj, "hi") : NULL;
        if (!hi) { Py_XDECREF(lo); return -1; }
        Py_ssize_t olo = PyLong_AsSsize_t(lo), ohi = PyLong_AsSsize_t(hi);
        Py_DECREF(lo);
        Py_DECREF(hi);
        if (PyErr_Occurred()) return -1;
        Py_ssize_t nlo = s->lo < olo ? s->lo : olo, nhi = s->hi > ohi ? s->hi : ohi;
        PyObject *v;
        v = PyLong_FromSsize_t(nlo);
        if (!v || PyObject_SetAttrString(s->obj, "lo", v) < 0) { Py_XDECREF(v); return -1; }
        Py_DECREF(v);
        v = PyLong_FromSsize_t(nhi);
        if (!v || PyObject_SetAttrString(s->obj, "hi", v) < 0) { Py_XDECREF(v); return -1; }
        Py_DECREF(v);
        if (nhi > s->valid) {
            v = PyLong_FromSsize_t(nhi);
            if (!v || PyObject_SetAttrString(s->obj, "valid", v) < 0) { Py_XDECREF(v); return -1; }
            Py_DECREF(v);
        }
    }
    return 0;
}

/* The entry of `seq` in the spans, or NULL when no span holds it (*readable says whether the
 * bytes were read from the file: an entry past `valid` is UNKNOWN). */
static uint8_t *span_entry(Spans *sp, uint64_t seq, Span **which, int *readable) {
    Py_ssize_t lo = 0, hi = sp->n;
    while (lo < hi) {
        Py_ssize_t mid = (lo + hi) / 2;
        if (sp->s[mid].base <= seq) lo = mid + 1; else hi = mid;
    }
    if (lo == 0) return NULL;
    Span *s = &sp->s[lo - 1];
    uint64_t k = seq - s->base;
    if (k >= (uint64_t)(s->buf.view.len / ENTRY_SIZE)) return NULL;
    Py_ssize_t at = (Py_ssize_t)k * ENTRY_SIZE;
    *which = s;
    *readable = at + ENTRY_SIZE <= s->valid;
    return (uint8_t *)s->buf.view.buf + at;
}

static inline void span_touch(Span *s, Py_ssize_t lo, Py_ssize_t hi) {
    if (lo < s->lo) s->lo = lo;
    if (hi > s->hi) s->hi = hi;
}

/* ------------------------------------------------------------------------------------------ */
/* msgpack, read                                                                               */

static int utf8_ok(const uint8_t *s, size_t n);

/* A msgpack reader over one buffer: every read is bounds-checked; a value it does not take is
 * "not decided" (0), never guessed at. */
typedef struct {
    const uint8_t *p, *end;
} Mp;

enum { MK_NIL, MK_FALSE, MK_TRUE, MK_INT, MK_UINT, MK_STR, MK_BIN, MK_MAP, MK_OTHER };

typedef struct {
    int kind;
    int64_t i;          /* MK_INT (negative, or any signed encoding) */
    uint64_t u;         /* MK_UINT */
    const uint8_t *s;   /* MK_STR, MK_BIN: the payload */
    uint64_t n;         /* MK_STR, MK_BIN: payload length; MK_MAP: entries */
} MpVal;

static inline int mp_need(const Mp *m, size_t k) { return (size_t)(m->end - m->p) >= k; }

static uint64_t be(const uint8_t *p, int k) {
    uint64_t v = 0;
    for (int i = 0; i < k; i++) v = (v << 8) | p[i];
    return v;
}

/* One value's header (and a str/bin's payload): 1 read, 0 truncated or a form taken by no one. */
static int mp_read(Mp *m, MpVal *v) {
    if (!mp_need(m, 1)) return 0;
    uint8_t t = *m->p++;
    int k = 0;
    v->s = NULL;
    v->n = 0;
    if (t <= 0x7f) { v->kind = MK_UINT; v->u = t; return 1; }
    if (t >= 0xe0) { v->kind = MK_INT; v->i = (int8_t)t; return 1; }
    if ((t & 0xf0) == 0x80) { v->kind = MK_MAP; v->n = t & 0x0f; return 1; }
    if ((t & 0xe0) == 0xa0) { v->kind = MK_STR; v->n = t & 0x1f; goto payload; }
    switch (t) {
    case 0xc0: v->kind = MK_NIL; return 1;
    case 0xc2: v->kind = MK_FALSE; return 1;
    case 0xc3: v->kind = MK_TRUE; return 1;
    case 0xc4: case 0xc5: case 0xc6:
        k = 1 << (t - 0xc4);
        if (!mp_need(m, (size_t)k)) return 0;
        v->kind = MK_BIN; v->n = be(m->p, k); m->p += k;
        goto payload;
    case 0xd9: case 0xda: case 0xdb:
        k = 1 << (t - 0xd9);
        if (!mp_need(m, (size_t)k)) return 0;
        v->kind = MK_STR; v->n = be(m->p, k); m->p += k;
        goto payload;
    case 0xcc: case 0xcd: case 0xce: case 0xcf:
        k = 1 << (t - 0xcc);
        if (!mp_need(m, (size_t)k)) return 0;
        v->kind = MK_UINT; v->u = be(m->p, k); m->p += k;
        return 1;
    case 0xd0: case 0xd1: case 0xd2: case 0xd3: {
        k = 1 << (t - 0xd0);
        if (!mp_need(m, (size_t)k)) return 0;
        uint64_t raw = be(m->p, k);
        m->p += k;
        int shift = 64 - 8 * k;
        v->kind = MK_INT;
        v->i = shift ? (int64_t)(raw << shift) >> shift : (int64_t)raw;
        return 1;
    }
    case 0xde: case 0xdf:
        k = t == 0xde ? 2 : 4;
        if (!mp_need(m, (size_t)k)) return 0;
        v->kind = MK_MAP; v->n = be(m->p, k); m->p += k;
        return 1;
    default:
        v->kind = MK_OTHER;  /* arrays, floats, ext, 0xc1: nothing a decided message holds */
        return 1;
    }
payload:
    if (!mp_need(m, v->n)) return 0;
    v->s = m->p;
    m->p += v->n;
    return v->kind != MK_STR || utf8_ok(v->s, v->n);
}

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
static const char *field_cstr[F_COUNT] = {"body", "body_b64", "delay_ms", "deliver_at", "key", "tag", "headers", "replace"};

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

/* UTF-8 of an exact str, or NULL (error cleared) when it has lone surrogates. */
static const char *utf8_of(PyObject *s, Py_ssize_t *n) {
    const char *p = PyUnicode_AsUTF8AndSize(s, n);
    if (!p) PyErr_Clear();
    return p;
}

static Py_ssize_t mp_str_len(Py_ssize_t n) { return n < 32 ? 1 + n : n < 256 ? 2 + n : n < 65536 ? 3 + n : 5 + n; }

static uint8_t *mp_str(uint8_t *p, const char *s, Py_ssize_t n) {
    if (n < 32) *p++ = (uint8_t)(0xa0 | n);
    else if (n < 256) { *p++ = 0xd9; *p++ = (uint8_t)n; }
    else if (n < 65536) { *p++ = 0xda; *p++ = (uint8_t)(n >> 8); *p++ = (uint8_t)n; }
    else { *p++ = 0xdb; *p++ = (uint8_t)(n >> 24); *p++ = (uint8_t)(n >> 16); *p++ = (uint8_t)(n >> 8); *p++ = (uint8_t)n; }
    memcpy(p, s, (size_t)n);
    return p + n;
}

static Py_ssize_t mp_map_header_len(Py_ssize_t n) { return n < 16 ? 1 : n < 65536 ? 3 : 5; }

static uint8_t *mp_map_header(uint8_t *p, Py_ssize_t n) {
    if (n < 16) *p++ = (uint8_t)(0x80 | n);
    else if (n < 65536) { *p++ = 0xde; *p++ = (uint8_t)(n >> 8); *p++ = (uint8_t)n; }
    else { *p++ = 0xdf; *p++ = (uint8_t)(n >> 24); *p++ = (uint8_t)(n >> 16); *p++ = (uint8_t)(n >> 8); *p++ = (uint8_t)n; }
    return p;
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
 * due time (i64 each); keys (a list of str|None per item, or None if no item has a key) and
 * replace (a list of bool per item, or None if none asks to replace). */
static PyObject *encode_produce(PyObject *self, PyObject *args) {
    PyObject *items, *topic_o, *limits_o, *select_o;
    long long now_ms, first_seq;
    if (!PyArg_ParseTuple(args, "O!O!LLO!O", &PyList_Type, &items, &PyBytes_Type, &topic_o, &now_ms, &first_seq,
                          &PyTuple_Type, &limits_o, &select_o))
        return NULL;
    Limits lim;
    if (!PyArg_ParseTuple(limits_o, "LLLLLLL", &lim.max_body, &lim.max_delay, &lim.max_tag_chars, &lim.max_tag_bytes,
                          &lim.max_key_bytes, &lim.max_headers, &lim.max_header_bytes))
        return NULL;
    const uint8_t *topic = (const uint8_t *)PyBytes_AS_STRING(topic_o);
    Py_ssize_t topic_len = PyBytes_GET_SIZE(topic_o);
    if (topic_len < 1 || topic_len > 255) { PyErr_SetString(PyExc_ValueError, "topic must be 1-255 bytes"); return NULL; }
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
    if (any_key) {
        Py_DECREF(keys);
        keys = PyList_New(n);
        if (!keys) goto done;
        for (Py_ssize_t i = 0; i < n; i++) {
            PyObject *kv = its[i].key ? PyUnicode_DecodeUTF8(its[i].key, its[i].key_len, "strict") : (Py_INCREF(Py_None), Py_None);
            if (!kv) goto done;
            PyList_SET_ITEM(keys, i, kv);
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
        for (int i = 0; i < F_COUNT; i++) {
            size_t fl = strlen(field_cstr[i]);
            if (k.n == fl && memcmp(k.s, field_cstr[i], fl) == 0) { f = i; break; }
        }
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
static PyObject *encode_produce_raw(PyObject *self, PyObject *args) {
    PyObject *raw_o, *topic_o, *limits_o, *select_o;
    long long now_ms, first_seq, max_batch, max_elements;
    if (!PyArg_ParseTuple(args, "OO!LLO!LLO", &raw_o, &PyBytes_Type, &topic_o, &now_ms, &first_seq, &PyTuple_Type,
                          &limits_o, &max_batch, &max_elements, &select_o))
        return NULL;
    Limits lim;
    if (!PyArg_ParseTuple(limits_o, "LLLLLLL", &lim.max_body, &lim.max_delay, &lim.max_tag_chars, &lim.max_tag_bytes,
                          &lim.max_key_bytes, &lim.max_headers, &lim.max_header_bytes))
        return NULL;
    const uint8_t *topic = (const uint8_t *)PyBytes_AS_STRING(topic_o);
    Py_ssize_t topic_len = PyBytes_GET_SIZE(topic_o);
    if (topic_len < 1 || topic_len > 255) { PyErr_SetString(PyExc_ValueError, "topic must be 1-255 bytes"); return NULL; }
    Buf raw;
    if (buf_get(raw_o, &raw, 0, "raw") < 0) return NULL;
    Item *its = NULL;
    PyObject *result = NULL;
    Mp m = {raw.view.buf, (const uint8_t *)raw.view.buf + raw.view.len};
    MpVal v;
    int64_t elements = 0;
    /* {"messages": [ ... ]}: one field, exactly that name, an array of 1..max_batch */
    if (!mp_read(&m, &v) || v.kind != MK_MAP || v.n != 1 || !mp_read(&m, &v) || v.kind != MK_STR || v.n != 8 ||
        memcmp(v.s, "messages", 8) != 0 || !mp_need(&m, 1))
        goto undecided;
    uint8_t t = *m.p++;
    uint64_t n;
    if ((t & 0xf0) == 0x90) n = t & 0x0f;
    else if (t == 0xdc && mp_need(&m, 2)) { n = be(m.p, 2); m.p += 2; }
    else if (t == 0xdd && mp_need(&m, 4)) { n = be(m.p, 4); m.p += 4; }
    else goto undecided;
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

/* produced_rows(records, offsets, topic_hash) -> (entries, rows)
 * For records just appended (a buffer of whole records and each one's commit-log offset, i64):
 * the message-table entries (SCHEDULED, flags 0, roll 0, size, offset) and the MessageRows that
 * enqueue-put indexes, read from the record headers — what a scan of the log would give, without
 * the second trip through the file. */
static PyObject *produced_rows(PyObject *self, PyObject *args) {
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
/* scan: decode a buffer of commit-log records into MessageRows                                */

enum { SCAN_OK = 0, SCAN_TORN = 1, SCAN_CORRUPT = 2, SCAN_VERSION = 3 };

/* Check the record at buf[i:]; 0 ok, else a SCAN_* outcome. Mirrors commitlog.decode's order:
 * header cut → torn; impossible length → corrupt; cut record → torn; crc → corrupt; version;
 * unknown type → corrupt. */
static int check_record(const uint8_t *buf, size_t n, size_t i, int verify, uint32_t *length) {
    if (n - i < RECORD_HEADER) return SCAN_TORN;
    const uint8_t *r = buf + i;
    uint32_t len = rd32(r);
    uint64_t fields = (uint64_t)RECORD_HEADER + r[38] + r[39] + rd16(r + 40) + rd16(r + 42) + rd32(r + 44);
    if (len < RECORD_HEADER || len > MAX_RECORD || len != fields) return SCAN_CORRUPT;
    if (n - i < len) return SCAN_TORN;
    if (verify && crc32_update(0, r + 8, len - 8) != rd32(r + 4)) return SCAN_CORRUPT;
    if (r[8] != RECORD_VERSION) return SCAN_VERSION;
    if (r[9] < REC_MESSAGE || r[9] > REC_RELEASE) return SCAN_CORRUPT;
    *length = len;
    return SCAN_OK;
}

/* scan_rows(buf, base_offset, verify, max_records) -> (rows, consumed, outcome)
 * Decode whole records from the start of `buf` (at commit-log offset base_offset) into
 * MessageRows until max_records, the end of the buffer, or a record that does not check out.
 * `consumed` is the bytes of the records decoded; `outcome` says why it stopped there (0: end of
 * buffer or max_records, 1: torn, 2: corrupt, 3: newer/unknown version) — the caller decides
 * whether that is a chunk boundary, a torn tail or damage to resync past (CommitLog.scan). */
static PyObject *scan_rows(PyObject *self, PyObject *args) {
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
static PyObject *scan_starts(PyObject *self, PyObject *args) {
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

/* index_rows(rows, start, spans, wheel, header_size, precision, nslots, load_time,
 *            window_end, unsafe_from, tlog_pos, now_ms, max_units)
 *   -> (consumed, units, slots, late, counts)
 *
 * enqueue-put for MessageRows[start:], in order, as storage.batch.index_rows specifies: a GROUP
 * record is consumed with nothing to index; a MESSAGE whose table entry is SCHEDULED at this
 * record and whose due time is inside the window (and whose slot may take a unit: fire before
 * `unsafe_from`) gets a DEFAULT unit — in its own slot, or, when that slot was already loaded
 * (due before `load_time`), in slot `load_time` plus a DueRow in `late` for dequeue-put; a MESSAGE
 * that is cancelled loses its schedule flags, one delivered or superseded is consumed as is.
 * Anything else (cancel and roll records, far messages, a full slot lap) stops the batch at that
 * row: `consumed` says how far it got and the caller's reference path takes the row. Units are
 * returned (not written): the caller appends them to the TimerLog and then applies `slots` (the
 * new state of every slot touched, 32-byte wheel slots) — units reach the file before any slot
 * points at them. `counts`: the wheel slot index (u32) of every message now counted in its slot,
 * for the caller to add to the schedule once the units are on file (a batch that fails and is
 * retried counts once: add_counts). The spans' flag bytes are updated in place. */
static PyObject *index_rows(PyObject *self, PyObject *args) {
    PyObject *rows_o, *spans_o, *wheel_o;
    Py_ssize_t start, header_size, max_units;
    long long precision, nslots, load_time, window_end, unsafe_from, tlog_pos, now_ms;
    if (!PyArg_ParseTuple(args, "OnOOnLLLLLLLn", &rows_o, &start, &spans_o, &wheel_o, &header_size, &precision,
                          &nslots, &load_time, &window_end, &unsafe_from, &tlog_pos, &now_ms, &max_units))
        return NULL;
    if (precision <= 0 || nslots <= 0) { PyErr_SetString(PyExc_ValueError, "bad wheel geometry"); return NULL; }
    Buf rb = {.held = 0}, wb = {.held = 0};
    Spans sp = {0};
    Out units = {0}, late = {0}, incs = {0};
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
        const uint8_t *row = (const uint8_t *)rb.view.buf + i * MROW;
        uint8_t type = row[38];
        if (type == REC_GROUP) continue;
        if (type != REC_MESSAGE) break;
        uint64_t seq = rd64(row);
        int64_t deliver_at = rdi64(row + 8), offset = rdi64(row + 16);
        Span *span;
        int readable;
        uint8_t *entry = span_entry(&sp, seq, &span, &readable);
        if (!entry) break;  /* not in the batch's spans: the reference path reads it */
        uint8_t state = readable ? entry[0] : ST_UNKNOWN;
        int64_t eoff = readable ? rdi64(entry + 8) : -1;
        Py_ssize_t at = entry - (uint8_t *)span->buf.view.buf;
        if (state == ST_CANCELLED) {  /* never in the schedule */
            entry[1] = 0;
            span_touch(span, at + 1, at + 2);
            continue;
        }
        if (state != ST_SCHEDULED || eoff != offset) {
            if (state == ST_DELIVERED || (state == ST_SCHEDULED && eoff != offset)) continue;
            break;  /* UNKNOWN: the reference decides */
        }
        if (deliver_at > window_end) break;  /* far: a ROLL unit, the reference path */
        int64_t fire = deliver_at < load_time ? load_time : deliver_at;
        if (fire >= unsafe_from) break;  /* the slot's previous lap is not dispatched yet */
        if (fire - now_ms > INT32_MAX || fire - now_ms < INT32_MIN) break;  /* delay is an i32 */
        int64_t st = fire - fmod64(fire, precision);
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
        wr32(u + 12, UNIT_DEFAULT);
        wri64(u + 16, now_ms);
        wri32(u + 24, (int32_t)(fire - now_ms));
        wri64(u + 28, offset);
        wr32(u + 36, rd32(row + 24));
        wr32(u + 40, rd32(row + 28));
        wr64(u + 44, seq);
        if (ss->num == 0) ss->first = pos;
        ss->last = pos;
        ss->num++;
        ss->magic |= UNIT_DEFAULT;
        pos += UNIT_SIZE;
        made++;
        if (deliver_at >= load_time) {
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
    if (!ub || !lb || !cb) { Py_XDECREF(ub); Py_XDECREF(lb); Py_XDECREF(cb); Py_DECREF(slot_bytes); goto done; }
    res = Py_BuildValue("(nNNNN)", i - start, ub, slot_bytes, lb, cb);
done:
    buf_release(&rb);
    buf_release(&wb);
    spans_release(&sp);
    out_free(&units);
    out_free(&late);
    out_free(&incs);
    map_free(&slots);
    PyMem_Free(states);
    PyMem_Free(slot_times);
    return res;
}

/* add_counts(counts, slot_indexes): counts[i] += 1 (i32) for every u32 index (index_rows'
 * `counts`, once its units are on file). An index out of range is an error, nothing added. */
static PyObject *add_counts(PyObject *self, PyObject *args) {
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
static PyObject *put_slots(PyObject *self, PyObject *args) {
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

static PyTypeObject WalkerType = {
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
static PyObject *classify(PyObject *self, PyObject *args) {
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

/* The record at commit-log offset `off` inside one of the read buffers (`reads`: a list of
 * (start_offset, bytes) sorted by start), or NULL. */
typedef struct {
    int64_t start;
    Buf b;
} Read;

static Read *find_read(Read *reads, Py_ssize_t nreads, int64_t off, uint32_t size) {
    Py_ssize_t lo = 0, hi = nreads;
    while (lo < hi) {
        Py_ssize_t mid = (lo + hi) / 2;
        if (reads[mid].start <= off) lo = mid + 1; else hi = mid;
    }
    if (lo == 0) return NULL;
    Read *r = &reads[lo - 1];
    if (off < r->start || off + (int64_t)size > r->start + r->b.view.len) return NULL;
    return r;
}

/* dues(units, kinds, reads, slot_time) -> (dues, problems)
 * The DueRows of the units classified 1, from their records (taken from `reads`, checked like
 * commitlog.decode with CRC): deliver_at, seq, offset and size from the record, the topic hash and
 * tag hash of its topic and tag, the keyed bit. `problems`: (unit index, outcome) for units whose
 * record is not in `reads` (outcome 0: the caller reads it itself) or does not check out (1 torn,
 * 2 corrupt, 3 version). */
static PyObject *dues(PyObject *self, PyObject *args) {
    PyObject *units_o, *kinds_o, *reads_o;
    long long slot_time;
    if (!PyArg_ParseTuple(args, "OOO!L", &units_o, &kinds_o, &PyList_Type, &reads_o, &slot_time)) return NULL;
    Buf ub, kb;
    if (buf_get(units_o, &ub, 0, "units") < 0) return NULL;
    if (buf_get(kinds_o, &kb, 0, "kinds") < 0) { buf_release(&ub); return NULL; }
    Py_ssize_t nreads = PyList_GET_SIZE(reads_o);
    Read *reads = PyMem_Calloc(nreads ? (size_t)nreads : 1, sizeof(Read));
    Py_ssize_t held = 0;
    Out o = {0};
    PyObject *problems = NULL, *res = NULL;
    if (!reads) { PyErr_NoMemory(); goto done; }
    for (; held < nreads; held++) {
        PyObject *t = PyList_GET_ITEM(reads_o, held);
        PyObject *data;
        long long start;
        if (!PyArg_ParseTuple(t, "LO", &start, &data)) goto done;
        reads[held].start = start;
        if (buf_get(data, &reads[held].b, 0, "read") < 0) goto done;
    }
    Py_ssize_t n = ub.view.len / UROW;
    if (ub.view.len % UROW || kb.view.len != n) { PyErr_SetString(PyExc_ValueError, "units/kinds"); goto done; }
    problems = PyList_New(0);
    if (!problems) goto done;
    const uint8_t *kinds = kb.view.buf;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (kinds[i] != 1) continue;
        const uint8_t *u = (const uint8_t *)ub.view.buf + i * UROW + 8;
        int64_t off = rdi64(u + 28);
        uint32_t size = rd32(u + 36);
        Read *rd = find_read(reads, nreads, off, size < RECORD_HEADER ? RECORD_HEADER : size);
        const uint8_t *r = NULL;
        int outcome = 0;
        uint32_t len = 0;
        if (rd) {
            /* checked against the read that holds it, not against the size the table claims */
            const uint8_t *base = rd->b.view.buf;
            size_t at = (size_t)(off - rd->start);
            r = base + at;
            int c = check_record(base, (size_t)rd->b.view.len, at, 1, &len);
            if (c != SCAN_OK) outcome = c;
        }
        if (!r || outcome) {
            PyObject *p = Py_BuildValue("(ni)", i, r ? outcome : 0);
            if (!p || PyList_Append(problems, p) < 0) { Py_XDECREF(p); goto done; }
            Py_DECREF(p);
            continue;
        }
        size_t tl = r[38], gl = r[39];
        uint8_t *d = out_take(&o, DROW);
        if (!d) goto done;
        wri64(d, rdi64(r + 20));
        wr64(d + 8, rd64(r + 12));
        wri64(d + 16, off);
        wr32(d + 24, len);
        wr32(d + 28, crc32_update(0, r + RECORD_HEADER, tl));
        wr32(d + 32, tag_hash(r + RECORD_HEADER + tl, gl));
        wr32(d + 36, rd16(r + 40) ? ROW_KEYED : 0);
        wri64(d + 40, slot_time);
    }
    PyObject *db = out_bytes(&o);
    if (!db) goto done;
    res = Py_BuildValue("(NO)", db, problems);
done:
    for (Py_ssize_t j = 0; j < held; j++) buf_release(&reads[j].b);
    PyMem_Free(reads);
    out_free(&o);
    Py_XDECREF(problems);
    buf_release(&ub);
    buf_release(&kb);
    return res;
}

/* ------------------------------------------------------------------------------------------ */
/* dequeue-put: a heap of DueRows by (deliver_at, seq), and the release                        */

typedef struct {
    PyObject_HEAD
    uint8_t *rows;  /* heap of DueRows */
    Py_ssize_t n, cap;
} DueHeap;

static inline int due_less(const uint8_t *a, const uint8_t *b) {
    int64_t ta = rdi64(a), tb = rdi64(b);
    if (ta != tb) return ta < tb;
    uint64_t sa = rd64(a + 8), sb = rd64(b + 8);
    if (sa != sb) return sa < sb;
    return memcmp(a, b, DROW) < 0;  /* a total order: the same rows come out the same way */
}

static void heap_swap(uint8_t *a, uint8_t *b) {
    uint8_t t[DROW];
    memcpy(t, a, DROW); memcpy(a, b, DROW); memcpy(b, t, DROW);
}

static void DueHeap_dealloc(DueHeap *h) {
    PyMem_Free(h->rows);
    Py_TYPE(h)->tp_free((PyObject *)h);
}

/* push(dues): add DueRows. */
static PyObject *DueHeap_push(DueHeap *h, PyObject *arg) {
    Buf b;
    if (buf_get(arg, &b, 0, "dues") < 0) return NULL;
    if (b.view.len % DROW) { buf_release(&b); PyErr_SetString(PyExc_ValueError, "dues"); return NULL; }
    Py_ssize_t add = b.view.len / DROW;
    if (h->n + add > h->cap) {
        Py_ssize_t cap = h->cap ? h->cap : 256;
        while (cap < h->n + add) cap *= 2;
        uint8_t *p = PyMem_Realloc(h->rows, (size_t)cap * DROW);
        if (!p) { buf_release(&b); return PyErr_NoMemory(); }
        h->rows = p;
        h->cap = cap;
    }
    for (Py_ssize_t k = 0; k < add; k++) {
        Py_ssize_t i = h->n++;
        memcpy(h->rows + i * DROW, (const uint8_t *)b.view.buf + k * DROW, DROW);
        while (i > 0) {
            Py_ssize_t parent = (i - 1) / 2;
            if (!due_less(h->rows + i * DROW, h->rows + parent * DROW)) break;
            heap_swap(h->rows + i * DROW, h->rows + parent * DROW);
            i = parent;
        }
    }
    buf_release(&b);
    Py_RETURN_NONE;
}

/* pop(now_ms, max) -> dues: the DueRows due at or before now_ms, earliest first, at most max. */
static PyObject *DueHeap_pop(DueHeap *h, PyObject *args) {
    long long now;
    Py_ssize_t max;
    if (!PyArg_ParseTuple(args, "Ln", &now, &max)) return NULL;
    Out o = {0};
    Py_ssize_t got = 0;
    while (got < max && h->n > 0 && rdi64(h->rows) <= now) {
        uint8_t *d = out_take(&o, DROW);
        if (!d) return NULL;
        memcpy(d, h->rows, DROW);
        got++;
        h->n--;
        if (h->n == 0) break;
        memcpy(h->rows, h->rows + h->n * DROW, DROW);
        Py_ssize_t i = 0;
        for (;;) {
            Py_ssize_t l = 2 * i + 1, r = l + 1, m = i;
            if (l < h->n && due_less(h->rows + l * DROW, h->rows + m * DROW)) m = l;
            if (r < h->n && due_less(h->rows + r * DROW, h->rows + m * DROW)) m = r;
            if (m == i) break;
            heap_swap(h->rows + i * DROW, h->rows + m * DROW);
            i = m;
        }
    }
    return out_bytes(&o);
}

/* next_due() -> int | None: the earliest deliver_at held. */
static PyObject *DueHeap_next(DueHeap *h, PyObject *unused) {
    if (h->n == 0) Py_RETURN_NONE;
    return PyLong_FromLongLong(rdi64(h->rows));
}

static Py_ssize_t DueHeap_len(DueHeap *h) { return h->n; }

static PyMethodDef DueHeap_methods[] = {
    {"push", (PyCFunction)DueHeap_push, METH_O, "add DueRows"},
    {"pop", (PyCFunction)DueHeap_pop, METH_VARARGS, "take the DueRows due by now_ms, earliest first"},
    {"next_due", (PyCFunction)DueHeap_next, METH_NOARGS, "the earliest deliver_at held, or None"},
    {NULL, NULL, 0, NULL},
};

static PySequenceMethods DueHeap_seq = {.sq_length = (lenfunc)DueHeap_len};

static PyTypeObject DueHeapType = {
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
static PyObject *release_rows(PyObject *self, PyObject *args) {
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
static PyObject *set_states(PyObject *self, PyObject *args) {
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

/* crc32(data, value=0) -> int: zlib.crc32, for tests and callers that have no zlib at hand. */
static PyObject *py_crc32(PyObject *self, PyObject *args) {
    PyObject *o;
    unsigned int v = 0;
    if (!PyArg_ParseTuple(args, "O|I", &o, &v)) return NULL;
    Buf b;
    if (buf_get(o, &b, 0, "data") < 0) return NULL;
    uint32_t c = crc32_update(v, b.view.buf, (size_t)b.view.len);
    buf_release(&b);
    return PyLong_FromUnsignedLong(c);
}

/* seq_runs(seqs, segment_entries, gap, stride=8, at=0) -> list[(segment, lo, hi)]
 * The distinct u64 seqs, sorted, cut into runs of one message-table segment whose neighbours
 * are at most `gap` apart: each run is read with one pread (MessageTable.begin_runs). `seqs` is a
 * buffer of rows of `stride` bytes with the u64 seq `at` that offset in each (8, 0: plain u64s). */
static int cmp_u64(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

static PyObject *seq_runs(PyObject *self, PyObject *args) {
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
    if (!sorted) qsort(s, (size_t)n, 8, cmp_u64);
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

/* read_plan(rows, stride, bases, span, gap) -> bytes: the stretches of the commit log to read for
 * the records located at the start of each row ((offset i64, size u32), rows of `stride` bytes),
 * as (start, end) i64 pairs in offset order: neighbours at most `gap` apart share a stretch of at
 * most `span` bytes, and no stretch runs past the next segment base (`bases`: ascending i64). */
typedef struct {
    int64_t off;
    int64_t end;
} Loc;

static int cmp_loc(const void *a, const void *b) {
    const Loc *x = a, *y = b;
    if (x->off != y->off) return x->off < y->off ? -1 : 1;
    return x->end < y->end ? -1 : x->end > y->end;
}

static PyObject *read_plan(PyObject *self, PyObject *args) {
    PyObject *ro, *bo;
    Py_ssize_t stride;
    long long span, gap;
    if (!PyArg_ParseTuple(args, "OnOLL", &ro, &stride, &bo, &span, &gap)) return NULL;
    if (stride < 12 || span < 0 || gap < 0) { PyErr_SetString(PyExc_ValueError, "stride/span/gap"); return NULL; }
    Buf r, b;
    if (buf_get(ro, &r, 0, "rows") < 0) return NULL;
    if (buf_get(bo, &b, 0, "bases") < 0) { buf_release(&r); return NULL; }
    PyObject *res = NULL;
    Loc *locs = NULL;
    Out out = {0};
    const uint8_t *rb = r.view.buf, *bb = b.view.buf;
    Py_ssize_t nb = b.view.len / 8;
    if (r.view.len % stride || b.view.len % 8) { PyErr_SetString(PyExc_ValueError, "rows/bases"); goto done; }
    for (Py_ssize_t k = 1; k < nb; k++)
        if (rdi64(bb + (k - 1) * 8) > rdi64(bb + k * 8)) { PyErr_SetString(PyExc_ValueError, "bases must ascend"); goto done; }
    Py_ssize_t n = r.view.len / stride;
    locs = PyMem_Malloc((size_t)(n ? n : 1) * sizeof(Loc));
    if (!locs) { PyErr_NoMemory(); goto done; }
    int sorted = 1;
    for (Py_ssize_t i = 0; i < n; i++) {
        int64_t off = rdi64(rb + i * stride);
        uint32_t size = rd32(rb + i * stride + 8);
        locs[i].off = off;
        locs[i].end = off > INT64_MAX - (int64_t)size ? INT64_MAX : off + (int64_t)size;
        if (i && cmp_loc(&locs[i - 1], &locs[i]) > 0) sorted = 0;
    }
    if (!sorted) qsort(locs, (size_t)n, sizeof(Loc), cmp_loc);
    Py_ssize_t seg = 0;
    for (Py_ssize_t i = 0; i < n;) {
        int64_t start = locs[i].off, end = locs[i].end;
        while (seg < nb && rdi64(bb + seg * 8) <= start) seg++;
        int64_t limit = seg < nb ? rdi64(bb + seg * 8) : INT64_MAX;  /* the first base past start */
        Py_ssize_t k = i + 1;
        while (k < n && locs[k].end <= limit && (uint64_t)locs[k].end - (uint64_t)start <= (uint64_t)span &&
               (locs[k].off <= end || (uint64_t)locs[k].off - (uint64_t)end <= (uint64_t)gap)) {
            if (locs[k].end > end) end = locs[k].end;
            k++;
        }
        uint8_t *w = out_take(&out, 16);
        if (!w) goto done;
        wri64(w, start);
        wri64(w + 8, end);
        i = k;
    }
    res = out_bytes(&out);
done:
    PyMem_Free(locs);
    PyMem_Free(out.p);
    buf_release(&r);
    buf_release(&b);
    return res;
}

/* ------------------------------------------------------------------------------------------ */
/* pull: the answer to a pull, encoded once, from ready units and their records                */

#define PROW 56  /* PullRow: the 40-byte ready unit, index u64, attempt u32, token u32 */

/* Strict UTF-8 (what bytes.decode() accepts): no overlongs, no surrogates, nothing past U+10FFFF. */
static int utf8_ok(const uint8_t *s, size_t n) {
    size_t i = 0;
    while (i < n) {
        uint8_t c = s[i];
        if (c < 0x80) { i++; continue; }
        size_t len;
        uint32_t cp;
        if (c >= 0xC2 && c <= 0xDF) { len = 2; cp = c & 0x1F; }
        else if (c >= 0xE0 && c <= 0xEF) { len = 3; cp = c & 0x0F; }
        else if (c >= 0xF0 && c <= 0xF4) { len = 4; cp = c & 0x07; }
        else return 0;
        if (n - i < len) return 0;
        for (size_t k = 1; k < len; k++) {
            if ((s[i + k] & 0xC0) != 0x80) return 0;
            cp = (cp << 6) | (s[i + k] & 0x3F);
        }
        if ((len == 3 && cp < 0x800) || (len == 4 && (cp < 0x10000 || cp > 0x10FFFF)) || (cp >= 0xD800 && cp <= 0xDFFF))
            return 0;
        i += len;
    }
    return 1;
}

/* A msgpack str at s[*at:n] in its shortest form (what msgpack.packb writes): its length, the
 * payload checked as UTF-8, *at moved past it; -1 when it is not one. */
static int64_t mp_read_str(const uint8_t *s, size_t n, size_t *at, size_t *len) {
    if (*at >= n) return -1;
    uint8_t t = s[*at];
    size_t hdr, l;
    if ((t & 0xE0) == 0xA0) { hdr = 1; l = t & 0x1F; }
    else if (t == 0xd9) { if (n - *at < 2) return -1; hdr = 2; l = s[*at + 1]; if (l < 32) return -1; }
    else if (t == 0xda) { if (n - *at < 3) return -1; hdr = 3; l = ((size_t)s[*at + 1] << 8) | s[*at + 2]; if (l < 256) return -1; }
    else return -1;  /* str32 would be over the headers' 64 KiB */
    if (n - *at - hdr < l) return -1;
    if (!utf8_ok(s + *at + hdr, l)) return -1;
    size_t start = *at + hdr;
    *at = start + l;
    *len = l;
    return (int64_t)start;
}

#define MAX_HEADERS_ON_FILE 64

/* Whether s[0:n] is exactly the msgpack.packb of a dict of str to str with at most 64 entries and
 * no key twice (the headers of a record, as produce wrote them): what is copied into a pull's
 * answer must be what decoding and encoding them again would give. */
static int headers_ok(const uint8_t *s, size_t n) {
    if (n == 0) return 0;
    size_t at = 1, count;
    uint8_t t = s[0];
    if ((t & 0xF0) == 0x80) count = t & 0x0F;
    else if (t == 0xde) { if (n < 3) return 0; count = ((size_t)s[1] << 8) | s[2]; at = 3; if (count < 16) return 0; }
    else return 0;
    if (count > MAX_HEADERS_ON_FILE) return 0;
    size_t kstart[MAX_HEADERS_ON_FILE], klen[MAX_HEADERS_ON_FILE];
    for (size_t k = 0; k < count; k++) {
        size_t l, vl;
        int64_t ks = mp_read_str(s, n, &at, &l);
        if (ks < 0 || mp_read_str(s, n, &at, &vl) < 0) return 0;
        for (size_t j = 0; j < k; j++)
            if (klen[j] == l && memcmp(s + kstart[j], s + ks, l) == 0) return 0;
        kstart[k] = (size_t)ks;
        klen[k] = l;
    }
    return at == n;
}

static uint8_t *mp_uint_or_int(uint8_t *p, int64_t v) {
    if (v >= 0) {
        uint64_t u = (uint64_t)v;
        if (u < 0x80) *p++ = (uint8_t)u;
        else if (u <= 0xFF) { *p++ = 0xcc; *p++ = (uint8_t)u; }
        else if (u <= 0xFFFF) { *p++ = 0xcd; *p++ = (uint8_t)(u >> 8); *p++ = (uint8_t)u; }
        else if (u <= 0xFFFFFFFFu) { *p++ = 0xce; for (int k = 3; k >= 0; k--) *p++ = (uint8_t)(u >> (8 * k)); }
        else { *p++ = 0xcf; for (int k = 7; k >= 0; k--) *p++ = (uint8_t)(u >> (8 * k)); }
    } else {
        if (v >= -32) *p++ = (uint8_t)(int8_t)v;
        else if (v >= -128) { *p++ = 0xd0; *p++ = (uint8_t)(int8_t)v; }
        else if (v >= -32768) { *p++ = 0xd1; uint16_t u = (uint16_t)(int16_t)v; *p++ = (uint8_t)(u >> 8); *p++ = (uint8_t)u; }
        else if (v >= INT32_MIN) { *p++ = 0xd2; uint32_t u = (uint32_t)(int32_t)v; for (int k = 3; k >= 0; k--) *p++ = (uint8_t)(u >> (8 * k)); }
        else { *p++ = 0xd3; uint64_t u = (uint64_t)v; for (int k = 7; k >= 0; k--) *p++ = (uint8_t)(u >> (8 * k)); }
    }
    return p;
}

static uint8_t *mp_bin(uint8_t *p, const uint8_t *s, size_t n) {
    if (n < 256) { *p++ = 0xc4; *p++ = (uint8_t)n; }
    else if (n < 65536) { *p++ = 0xc5; *p++ = (uint8_t)(n >> 8); *p++ = (uint8_t)n; }
    else { *p++ = 0xc6; for (int k = 3; k >= 0; k--) *p++ = (uint8_t)(n >> (8 * k)); }
    memcpy(p, s, n);
    return p + n;
}

static uint8_t *mp_fixstr(uint8_t *p, const char *s) { return mp_str(p, s, (Py_ssize_t)strlen(s)); }

static size_t hex_of(uint64_t v, char *out) {
    char tmp[16];
    size_t n = 0;
    do { tmp[n++] = "0123456789abcdef"[v & 15]; v >>= 4; } while (v);
    for (size_t k = 0; k < n; k++) out[k] = tmp[n - 1 - k];
    return n;
}

/* encode_pull(rows, prefix, tokens, reads) -> (answer, problems)
 * The msgpack answer of a pull, {"messages": [...]}, exactly as msgpack.packb would encode the
 * API's message objects (id, receipt, topic, key, tag, headers, body, deliver_at, delivered_at,
 * attempt), built from PullRows and their records in `reads` ((commit-log offset, bytes) sorted
 * by offset) without a Python object per message: headers are copied as stored (checked to be
 * a map of str to str), the body as bin. A record that is not in `reads` or does not check out
 * (CRC, version, UTF-8 of topic/tag/key, headers) is left out and named in `problems` as
 * (row index, outcome) — 0 not read, 1 torn, 2 corrupt, 3 version. */
static PyObject *encode_pull(PyObject *self, PyObject *args) {
    PyObject *rows_o, *prefix_o, *tokens_o, *reads_o;
    if (!PyArg_ParseTuple(args, "OO!O!O!", &rows_o, &PyBytes_Type, &prefix_o, &PyList_Type, &tokens_o, &PyList_Type, &reads_o))
        return NULL;
    Buf rb;
    if (buf_get(rows_o, &rb, 0, "rows") < 0) return NULL;
    Py_ssize_t nreads = PyList_GET_SIZE(reads_o), held = 0, ntok = PyList_GET_SIZE(tokens_o);
    Read *reads = PyMem_Calloc(nreads ? (size_t)nreads : 1, sizeof(Read));
    const char **tok = PyMem_Calloc(ntok ? (size_t)ntok : 1, sizeof(char *));
    Py_ssize_t *toklen = PyMem_Calloc(ntok ? (size_t)ntok : 1, sizeof(Py_ssize_t));
    Out o = {0};
    PyObject *problems = NULL, *res = NULL;
    if (!reads || !tok || !toklen) { PyErr_NoMemory(); goto done; }
    for (Py_ssize_t k = 0; k < ntok; k++) {
        PyObject *t = PyList_GET_ITEM(tokens_o, k);
        if (!PyUnicode_Check(t) || !(tok[k] = PyUnicode_AsUTF8AndSize(t, &toklen[k]))) {
            PyErr_Clear();
            PyErr_SetString(PyExc_TypeError, "tokens must be str");
            goto done;
        }
    }
    for (; held < nreads; held++) {
        PyObject *t = PyList_GET_ITEM(reads_o, held);
        PyObject *data;
        long long start;
        if (!PyArg_ParseTuple(t, "LO", &start, &data)) goto done;
        reads[held].start = start;
        if (buf_get(data, &reads[held].b, 0, "read") < 0) goto done;
    }
    if (rb.view.len % PROW) { PyErr_SetString(PyExc_ValueError, "rows"); goto done; }
    problems = PyList_New(0);
    if (!problems) goto done;
    const char *prefix = PyBytes_AS_STRING(prefix_o);
    size_t plen = (size_t)PyBytes_GET_SIZE(prefix_o);
    Py_ssize_t n = rb.view.len / PROW, kept = 0;
    if (out_reserve(&o, 16) < 0) goto done;
    o.n = 16;  /* room for the map and array headers, written last */
    for (Py_ssize_t i = 0; i < n; i++) {
        const uint8_t *row = (const uint8_t *)rb.view.buf + i * PROW;
        int64_t off = rdi64(row);
        uint32_t size = rd32(row + 8);
        uint32_t token = rd32(row + 52);
        if (token >= (uint64_t)ntok) { PyErr_SetString(PyExc_IndexError, "token"); goto done; }
        Read *rd = find_read(reads, nreads, off, size < RECORD_HEADER ? RECORD_HEADER : size);
        int outcome = 0;
        uint32_t len = 0;
        const uint8_t *r = NULL;
        if (rd) {
            size_t at = (size_t)(off - rd->start);
            r = (const uint8_t *)rd->b.view.buf + at;
            outcome = check_record(rd->b.view.buf, (size_t)rd->b.view.len, at, 1, &len);
        }
        const uint8_t *topic = NULL, *tag = NULL, *key = NULL, *hdr = NULL, *body = NULL;
        size_t tl = 0, gl = 0, kl = 0, hl = 0, bl = 0;
        if (r && !outcome) {
            tl = r[38]; gl = r[39]; kl = rd16(r + 40); hl = rd16(r + 42); bl = rd32(r + 44);
            topic = r + RECORD_HEADER; tag = topic + tl; key = tag + gl; hdr = key + kl; body = hdr + hl;
            if (!utf8_ok(topic, tl) || !utf8_ok(tag, gl) || !utf8_ok(key, kl) || (hl && !headers_ok(hdr, hl)))
                outcome = SCAN_CORRUPT;
        }
        if (!r || outcome) {
            PyObject *pr = Py_BuildValue("(ni)", i, r ? outcome : 0);
            if (!pr || PyList_Append(problems, pr) < 0) { Py_XDECREF(pr); goto done; }
            Py_DECREF(pr);
            continue;
        }
        char hexseq[16], hexidx[16];
        size_t sl = hex_of(rd64(row + 32), hexseq), il = hex_of(rd64(row + 40), hexidx);
        size_t idl = plen + sl, rcl = idl + 1 + il + 1 + (size_t)toklen[token];
        size_t need = 1 + 8 * 10 + 5 + idl + 5 + rcl + 5 + tl + 5 + gl + 5 + kl + 1 + hl + 5 + bl + 3 * 9;
        uint8_t *p = out_take(&o, need);
        if (!p) goto done;
        uint8_t *q = p;
        *q++ = 0x8a;  /* a map of 10 */
        q = mp_fixstr(q, "id");
        char *idbuf = PyMem_Malloc(rcl);
        if (!idbuf) { PyErr_NoMemory(); goto done; }
        memcpy(idbuf, prefix, plen);
        memcpy(idbuf + plen, hexseq, sl);
        q = mp_str(q, idbuf, (Py_ssize_t)idl);
        idbuf[idl] = '.';
        memcpy(idbuf + idl + 1, hexidx, il);
        idbuf[idl + 1 + il] = '.';
        memcpy(idbuf + idl + 2 + il, tok[token], (size_t)toklen[token]);
        q = mp_fixstr(q, "receipt");
        q = mp_str(q, idbuf, (Py_ssize_t)rcl);
        PyMem_Free(idbuf);
        q = mp_fixstr(q, "topic");
        q = mp_str(q, (const char *)topic, (Py_ssize_t)tl);
        q = mp_fixstr(q, "key");
        if (kl) q = mp_str(q, (const char *)key, (Py_ssize_t)kl); else *q++ = 0xc0;
        q = mp_fixstr(q, "tag");
        if (gl) q = mp_str(q, (const char *)tag, (Py_ssize_t)gl); else *q++ = 0xc0;
        q = mp_fixstr(q, "headers");
        if (hl) { memcpy(q, hdr, hl); q += hl; } else *q++ = 0x80;
        q = mp_fixstr(q, "body");
        q = mp_bin(q, body, bl);
        q = mp_fixstr(q, "deliver_at");
        q = mp_uint_or_int(q, rdi64(r + 20));
        q = mp_fixstr(q, "delivered_at");
        q = mp_uint_or_int(q, rdi64(row + 24));
        q = mp_fixstr(q, "attempt");
        q = mp_uint_or_int(q, rd32(row + 48));
        o.n -= need - (size_t)(q - p);
        kept++;
    }
    /* {"messages": [ ... ]}: the headers go right before the first message */
    uint8_t head[16], *h = head;
    *h++ = 0x81;
    h = mp_fixstr(h, "messages");
    if (kept < 16) *h++ = (uint8_t)(0x90 | kept);
    else if (kept < 65536) { *h++ = 0xdc; *h++ = (uint8_t)(kept >> 8); *h++ = (uint8_t)kept; }
    else { *h++ = 0xdd; for (int k = 3; k >= 0; k--) *h++ = (uint8_t)((uint64_t)kept >> (8 * k)); }
    size_t hn = (size_t)(h - head);
    memcpy(o.p + 16 - hn, head, hn);
    PyObject *body_o = PyBytes_FromStringAndSize((const char *)o.p + 16 - hn, (Py_ssize_t)(o.n - 16 + hn));
    if (!body_o) goto done;
    res = Py_BuildValue("(NO)", body_o, problems);
done:
    for (Py_ssize_t j = 0; j < held; j++) buf_release(&reads[j].b);
    PyMem_Free(reads);
    PyMem_Free(tok);
    PyMem_Free(toklen);
    out_free(&o);
    Py_XDECREF(problems);
    buf_release(&rb);
    return res;
}

/* parse_receipts(receipts) -> (indexes, token_ids, tokens)
 * Receipts are `{id}.{index hex}.{token}`. For each: its ready-queue index (u64) and the number of
 * its token in `tokens` (the distinct tokens, u32); a receipt not in that canonical form (lowercase
 * hex, no sign, no leading zeros, a token without '.') gets token id 0xFFFFFFFF and the caller's
 * reference parser (Groups.parse_receipt) decides it. */
static PyObject *parse_receipts(PyObject *self, PyObject *args) {
    PyObject *list;
    if (!PyArg_ParseTuple(args, "O!", &PyList_Type, &list)) return NULL;
    Py_ssize_t n = PyList_GET_SIZE(list);
    PyObject *idx = PyBytes_FromStringAndSize(NULL, n * 8), *tid = PyBytes_FromStringAndSize(NULL, n * 4);
    PyObject *tokens = PyList_New(0), *seen = PyDict_New(), *res = NULL;
    if (!idx || !tid || !tokens || !seen) goto done;
    uint8_t *ip = (uint8_t *)PyBytes_AS_STRING(idx), *tp = (uint8_t *)PyBytes_AS_STRING(tid);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *r = PyList_GET_ITEM(list, i);
        wr64(ip + 8 * i, 0);
        wr32(tp + 4 * i, 0xFFFFFFFFu);
        if (!PyUnicode_CheckExact(r)) continue;
        Py_ssize_t len;
        const char *s = PyUnicode_AsUTF8AndSize(r, &len);
        if (!s) { PyErr_Clear(); continue; }
        Py_ssize_t d2 = -1, d1 = -1;
        for (Py_ssize_t k = len - 1; k >= 0; k--) {
            if (s[k] == '.') { if (d2 < 0) d2 = k; else { d1 = k; break; } }
        }
        if (d1 < 0) continue;
        Py_ssize_t hl = d2 - d1 - 1;
        if (hl < 1 || hl > 16 || (hl > 1 && s[d1 + 1] == '0')) continue;
        uint64_t v = 0;
        int ok = 1;
        for (Py_ssize_t k = d1 + 1; k < d2; k++) {
            char ch = s[k];
            int dv = ch >= '0' && ch <= '9' ? ch - '0' : ch >= 'a' && ch <= 'f' ? ch - 'a' + 10 : -1;
            if (dv < 0) { ok = 0; break; }
            v = (v << 4) | (uint64_t)dv;
        }
        if (!ok) continue;
        PyObject *token = PyUnicode_FromStringAndSize(s + d2 + 1, len - d2 - 1);
        if (!token) goto done;
        PyObject *known = PyDict_GetItemWithError(seen, token);
        Py_ssize_t k;
        if (known) {
            k = PyLong_AsSsize_t(known);
        } else {
            if (PyErr_Occurred()) { Py_DECREF(token); goto done; }
            k = PyList_GET_SIZE(tokens);
            PyObject *kk = PyLong_FromSsize_t(k);
            if (!kk || PyDict_SetItem(seen, token, kk) < 0 || PyList_Append(tokens, token) < 0) {
                Py_XDECREF(kk); Py_DECREF(token); goto done;
            }
            Py_DECREF(kk);
        }
        Py_DECREF(token);
        wr64(ip + 8 * i, v);
        wr32(tp + 4 * i, (uint32_t)k);
    }
    res = PyTuple_Pack(3, idx, tid, tokens);
done:
    Py_XDECREF(idx);
    Py_XDECREF(tid);
    Py_XDECREF(tokens);
    Py_XDECREF(seen);
    return res;
}

/* take_rows(units, first_index, exclude, wanted, max_n, attempt, token) -> (rows, consumed, skipped)
 * A consumer group handing out new messages from its cursor (Groups.take): the ready units at
 * indexes first_index.. in `units` (40 bytes each), skipping those in `exclude` (sorted u64
 * indexes: acked or leased already) and, when `wanted` (u32 tag hashes) is not None, those whose
 * tag is not wanted (their indexes come back in `skipped`: they count as consumed by the group);
 * at most max_n PullRows with the given attempt and token number. `consumed`: units examined,
 * the cursor's advance. */
static PyObject *take_rows(PyObject *self, PyObject *args) {
    PyObject *units_o, *excl_o, *wanted_o;
    unsigned long long first;
    Py_ssize_t max_n;
    unsigned int attempt, token;
    if (!PyArg_ParseTuple(args, "OKOOnII", &units_o, &first, &excl_o, &wanted_o, &max_n, &attempt, &token)) return NULL;
    Buf ub = {.held = 0}, eb = {.held = 0}, wb = {.held = 0};
    Out rows = {0}, skipped = {0};
    PyObject *res = NULL;
    if (buf_get(units_o, &ub, 0, "units") < 0 || buf_get(excl_o, &eb, 0, "exclude") < 0) goto done;
    if (wanted_o != Py_None && buf_get(wanted_o, &wb, 0, "wanted") < 0) goto done;
    if (ub.view.len % READY_UNIT || eb.view.len % 8 || (wb.held && wb.view.len % 4)) {
        PyErr_SetString(PyExc_ValueError, "units, exclude or wanted have the wrong size");
        goto done;
    }
    const uint8_t *ex = eb.view.buf;
    Py_ssize_t nex = eb.view.len / 8, e = 0, nw = wb.held ? wb.view.len / 4 : 0, n = ub.view.len / READY_UNIT, i = 0, made = 0;
    for (Py_ssize_t k = 1; k < nex; k++)
        if (rd64(ex + 8 * k) < rd64(ex + 8 * (k - 1))) { PyErr_SetString(PyExc_ValueError, "exclude must be sorted"); goto done; }
    for (; i < n && made < max_n; i++) {
        uint64_t index = first + (uint64_t)i;
        while (e < nex && rd64(ex + 8 * e) < index) e++;
        if (e < nex && rd64(ex + 8 * e) == index) continue;
        const uint8_t *u = (const uint8_t *)ub.view.buf + i * READY_UNIT;
        if (wb.held) {
            uint32_t th = rd32(u + 12);
            int hit = 0;
            for (Py_ssize_t w = 0; w < nw && !hit; w++) hit = rd32((const uint8_t *)wb.view.buf + 4 * w) == th;
            if (!hit) {
                uint8_t *sk = out_take(&skipped, 8);
                if (!sk) goto done;
                wr64(sk, index);
                continue;
            }
        }
        uint8_t *r = out_take(&rows, PROW);
        if (!r) goto done;
        memcpy(r, u, READY_UNIT);
        wr64(r + 40, index);
        wr32(r + 48, attempt);
        wr32(r + 52, token);
        made++;
    }
    PyObject *rb = out_bytes(&rows), *sb = rb ? out_bytes(&skipped) : NULL;
    if (!sb) { Py_XDECREF(rb); goto done; }
    res = Py_BuildValue("(NnN)", rb, i, sb);
done:
    buf_release(&ub);
    buf_release(&eb);
    buf_release(&wb);
    out_free(&rows);
    out_free(&skipped);
    return res;
}

/* encode_produced(seqs, deliver_at, duplicate, prefix, as_json) -> bytes
 * The answer of a produce, {"messages": [{"id", "deliver_at", "duplicate"}, ...]}, as
 * msgpack.packb or json.dumps(separators=(",", ":")) would write it: ids are prefix + seq in hex
 * (u64 seqs, i64 due times, u8 duplicate flags). JSON needs an ASCII prefix (None otherwise: the
 * caller encodes it). */
static PyObject *encode_produced(PyObject *self, PyObject *args) {
    PyObject *seq_o, *due_o, *dup_o, *prefix_o;
    int as_json;
    if (!PyArg_ParseTuple(args, "OOOO!p", &seq_o, &due_o, &dup_o, &PyBytes_Type, &prefix_o, &as_json)) return NULL;
    Buf sb = {.held = 0}, db = {.held = 0}, ub = {.held = 0};
    Out o = {0};
    PyObject *res = NULL;
    if (buf_get(seq_o, &sb, 0, "seqs") < 0 || buf_get(due_o, &db, 0, "deliver_at") < 0 || buf_get(dup_o, &ub, 0, "duplicate") < 0)
        goto done;
    Py_ssize_t n = sb.view.len / 8;
    if (sb.view.len % 8 || db.view.len != n * 8 || ub.view.len != n) {
        PyErr_SetString(PyExc_ValueError, "seqs, deliver_at and duplicate must be of one length");
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
        size_t hl = hex_of(rd64((const uint8_t *)sb.view.buf + 8 * i), hex);
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

/* lateness(rows, stride, at, now_ms) -> bytes: now_ms - the i64 due time `at` that offset of every
 * row of `stride` bytes (i64 each): DueRows (48, 0) or ready-queue units (40, 16). */
static PyObject *lateness(PyObject *self, PyObject *args) {
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
static PyObject *bucket_counts(PyObject *self, PyObject *args) {
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
static PyObject *unit_bounds(PyObject *self, PyObject *arg) {
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
static PyObject *tally(PyObject *self, PyObject *args) {
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
        int bad = !val || PyDict_SetItem(out, key, val) < 0;
        Py_XDECREF(key);
        Py_XDECREF(val);
        if (bad) { Py_CLEAR(out); goto done; }
        k = j;
    }
done:
    buf_release(&b);
    return out;
}

/* ------------------------------------------------------------------------------------------ */

static PyMethodDef methods[] = {
    {"crc32", py_crc32, METH_VARARGS, "zlib.crc32"},
    {"encode_produce", encode_produce, METH_VARARGS, "validate and encode a produce batch"},
    {"encode_produce_raw", encode_produce_raw, METH_VARARGS, "validate and encode a msgpack produce body"},
    {"produced_rows", produced_rows, METH_VARARGS, "message-table entries and MessageRows of appended records"},
    {"scan_rows", scan_rows, METH_VARARGS, "decode commit-log records into MessageRows"},
    {"scan_starts", scan_starts, METH_VARARGS, "commitlog.scan_buffer's loop"},
    {"index_rows", index_rows, METH_VARARGS, "enqueue-put for a batch of MessageRows"},
    {"put_slots", put_slots, METH_VARARGS, "write wheel slots"},
    {"add_counts", add_counts, METH_VARARGS, "add one to the counts at these slot indexes"},
    {"classify", classify, METH_VARARGS, "dequeue-get-message: which units are live"},
    {"dues", dues, METH_VARARGS, "dequeue-get-message: DueRows from records"},
    {"release_rows", release_rows, METH_VARARGS, "dequeue-put: ready units per topic"},
    {"set_states", set_states, METH_VARARGS, "set message-table states"},
    {"seq_runs", seq_runs, METH_VARARGS, "runs of seqs for batched message-table reads"},
    {"encode_pull", encode_pull, METH_VARARGS, "the msgpack answer of a pull"},
    {"parse_receipts", parse_receipts, METH_VARARGS, "indexes and tokens of receipts"},
    {"lateness", lateness, METH_VARARGS, "now - the due time of rows"},
    {"bucket_counts", bucket_counts, METH_VARARGS, "histogram buckets of a batch of values"},
    {"unit_bounds", unit_bounds, METH_O, "lowest commit offset and latest release of ready units"},
    {"tally", tally, METH_VARARGS, "count the values of an i64 field of rows"},
    {"take_rows", take_rows, METH_VARARGS, "a group's new messages from its cursor, as PullRows"},
    {"encode_produced", encode_produced, METH_VARARGS, "the answer of a produce"},
    {"read_plan", read_plan, METH_VARARGS, "the stretches of the log to read for records"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_batch", "delayd's compiled batch core", -1, methods};

PyMODINIT_FUNC PyInit__batch(void) {
    crc_init();
    for (int i = 0; i < F_COUNT; i++) {
        field_names[i] = PyUnicode_InternFromString(field_cstr[i]);
        if (!field_names[i]) return NULL;
    }
    if (PyType_Ready(&WalkerType) < 0 || PyType_Ready(&DueHeapType) < 0) return NULL;
    PyObject *m = PyModule_Create(&module);
    if (!m) return NULL;
    Py_INCREF(&WalkerType);
    Py_INCREF(&DueHeapType);
    if (PyModule_AddObject(m, "Walker", (PyObject *)&WalkerType) < 0 ||
        PyModule_AddObject(m, "DueHeap", (PyObject *)&DueHeapType) < 0 ||
        PyModule_AddIntConstant(m, "MROW", MROW) < 0 || PyModule_AddIntConstant(m, "DROW", DROW) < 0 ||
        PyModule_AddIntConstant(m, "UROW", UROW) < 0 || PyModule_AddIntConstant(m, "PROW", PROW) < 0 || PyModule_AddIntConstant(m, "RECORD_HEADER", RECORD_HEADER) < 0 ||
        PyModule_AddIntConstant(m, "UNIT_SIZE", UNIT_SIZE) < 0 || PyModule_AddIntConstant(m, "ENTRY_SIZE", ENTRY_SIZE) < 0 ||
        PyModule_AddIntConstant(m, "READY_UNIT", READY_UNIT) < 0 || PyModule_AddIntConstant(m, "RECORD_VERSION", RECORD_VERSION) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
