/*
 * batch_core.h — what the files of delayd.storage._batch share: the constants of the on-disk
 * records and in-memory rows, little-endian field access, and the helpers and stage functions
 * one file defines and another uses. Everything declared here is BATCH_HIDDEN: the shared
 * object exports PyInit__batch and nothing else (check: nm -D --defined-only).
 */
#ifndef DELAYD_BATCH_CORE_H
#define DELAYD_BATCH_CORE_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stddef.h>
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
#define MT_FLAG_FAR 2

/* In-memory rows passed between stages (byte tables in storage/batch.py, PullRow's in storage/batch_pull.py). */
#define MROW 40  /* MessageRow: seq, deliver_at, offset, size, topic_hash, tag_hash, roll, type, bits */
#define DROW 48  /* DueRow: deliver_at, seq, offset, size, topic_hash, tag_hash, bits, slot_time */
#define FAR_ROW 20  /* FarRow: deliver_at, seq, topic_hash (index_rows: a message parked far) */
#define UROW 60  /* UnitRow: pos, then the 52 unit bytes */
#define PROW 56  /* PullRow: the 40-byte ready unit, index u64, attempt u32, token u32 */
#define ROW_KEYED 1

/* Visible to the other files of the module, not outside the shared object. */
#define BATCH_HIDDEN __attribute__((visibility("hidden")))

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
/* CRC-32 (batch_util.c)                                                                       */

BATCH_HIDDEN void crc_init(void);
BATCH_HIDDEN uint32_t crc32_update(uint32_t crc, const uint8_t *p, size_t n);

/* The ready queue's tag hash: crc32 of the tag, 1 if that is 0, 0 for no tag. */
static inline uint32_t tag_hash(const uint8_t *tag, size_t n) {
    if (n == 0) return 0;
    uint32_t h = crc32_update(0, tag, n);
    return h ? h : 1;
}

/* ------------------------------------------------------------------------------------------ */
/* sorting rows (batch_util.c)                                                                 */

/* One u64 field of a row that rows sort by, at byte `at`; `is_signed`: compared as int64. */
typedef struct {
    size_t at;
    int is_signed;
} SortKey;

/* Sort n rows of w bytes in place into the order `cmp` gives, which must be a total order that
 * agrees with the keys (most significant first) where they differ: a radix sort by the keys (a
 * pass for each byte in which the rows differ), then `cmp` orders each run of rows whose keys are
 * equal; small arrays take an insertion sort by `cmp` alone, rows wider than 64 bytes qsort. -1
 * with MemoryError set when the scratch space cannot be had. The result is what qsort with `cmp`
 * gives. */
BATCH_HIDDEN int sort_rows(uint8_t *rows, Py_ssize_t n, size_t w, const SortKey *keys, int nkeys,
                           int (*cmp)(const void *, const void *));

/* ------------------------------------------------------------------------------------------ */
/* buffers, growable output, u64 maps (batch_util.c)                                           */

/* A read-only or writable view of a Python buffer, released by buf_release. */
typedef struct {
    Py_buffer view;
    int held;
} Buf;

BATCH_HIDDEN int buf_get(PyObject *obj, Buf *b, int writable, const char *what);
BATCH_HIDDEN void buf_release(Buf *b);

/* A growable byte buffer. */
typedef struct {
    uint8_t *p;
    size_t n, cap;
} Out;

BATCH_HIDDEN int out_reserve(Out *o, size_t extra);
BATCH_HIDDEN uint8_t *out_take(Out *o, size_t n);
BATCH_HIDDEN PyObject *out_bytes(Out *o);
BATCH_HIDDEN void out_free(Out *o);

/* d[key] = val, taking both new references (NULL: an error is already set); 0, or -1 with an error set. */
static inline int dict_set_owned(PyObject *d, PyObject *key, PyObject *val) {
    int r = key && val ? PyDict_SetItem(d, key, val) : -1;
    Py_XDECREF(key);
    Py_XDECREF(val);
    return r;
}

/* A small open-addressing set/map of u64 keys (seqs, slot times). */
typedef struct {
    uint64_t *keys;
    int64_t *vals;
    uint8_t *used;
    size_t cap, n;
} Map;

BATCH_HIDDEN int map_init(Map *m, size_t expected);
BATCH_HIDDEN void map_free(Map *m);
/* Returns the slot of `k` (inserting it with value `init` when absent), or SIZE_MAX on no memory. */
BATCH_HIDDEN size_t map_slot(Map *m, uint64_t k, int64_t init, int *inserted);
BATCH_HIDDEN int map_has(const Map *m, uint64_t k);

/* ------------------------------------------------------------------------------------------ */
/* message-table spans: the entries of a batch, held in memory (batch_util.c)                  */

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

BATCH_HIDDEN void spans_release(Spans *sp);
BATCH_HIDDEN int spans_get(PyObject *list, Spans *sp);
BATCH_HIDDEN int spans_commit(Spans *sp);
BATCH_HIDDEN uint8_t *span_entry(Spans *sp, uint64_t seq, Span **which, int *readable);

static inline void span_touch(Span *s, Py_ssize_t lo, Py_ssize_t hi) {
    if (lo < s->lo) s->lo = lo;
    if (hi > s->hi) s->hi = hi;
}

/* ------------------------------------------------------------------------------------------ */
/* commit-log records and the reads that hold them (batch_util.c)                              */

enum { SCAN_OK = 0, SCAN_TORN = 1, SCAN_CORRUPT = 2, SCAN_VERSION = 3 };

BATCH_HIDDEN int check_record(const uint8_t *buf, size_t n, size_t i, int verify, uint32_t *length);

/* The record at commit-log offset `off` inside one of the read buffers (`reads`: a list of
 * (start_offset, bytes) sorted by start), or NULL. */
typedef struct {
    int64_t start;
    Buf b;
} Read;

BATCH_HIDDEN Read *find_read(Read *reads, Py_ssize_t nreads, int64_t off, uint32_t size);
/* A batch call's `reads` (a list of (start offset, buffer)) held as Read: the array (PyMem), their
 * number in *n; NULL with an error set and nothing held. reads_release lets them go (NULL: none). */
BATCH_HIDDEN Read *reads_get(PyObject *list, Py_ssize_t *n);
BATCH_HIDDEN void reads_release(Read *reads, Py_ssize_t n);
/* The record located at (off, size) in `reads` with check_record's outcome (the CRC checked) in
 * *outcome and, when 0, its length in *length; NULL (outcome 0) when no read holds it. */
BATCH_HIDDEN const uint8_t *record_in(Read *reads, Py_ssize_t nreads, int64_t off, uint32_t size, int *outcome,
                                      uint32_t *length);

/* ------------------------------------------------------------------------------------------ */
/* UTF-8 (batch_util.c), msgpack reading and writing                                           */

BATCH_HIDDEN int utf8_ok(const uint8_t *s, size_t n);

/* The reader stays inline: produce reads every field of every message with it. */

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

static inline uint64_t be(const uint8_t *p, int k) {
    uint64_t v = 0;
    for (int i = 0; i < k; i++) v = (v << 8) | p[i];
    return v;
}

/* One value's header (and a str/bin's payload): 1 read, 0 truncated or a form taken by no one. */
static inline int mp_read(Mp *m, MpVal *v) {
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

/* A request body's envelope, {name: [...]}: a map of exactly one entry, the str `name`, and an
 * array's header: 1 with the array's count in *n and m at its first item; 0 for anything else. */
static inline int mp_envelope(Mp *m, const char *name, uint64_t *n) {
    MpVal v;
    size_t nl = strlen(name);
    if (!mp_read(m, &v) || v.kind != MK_MAP || v.n != 1 || !mp_read(m, &v) || v.kind != MK_STR || v.n != nl ||
        memcmp(v.s, name, nl) != 0 || !mp_need(m, 1))
        return 0;
    uint8_t t = *m->p++;
    if ((t & 0xf0) == 0x90) *n = t & 0x0f;
    else if (t == 0xdc && mp_need(m, 2)) { *n = be(m->p, 2); m->p += 2; }
    else if (t == 0xdd && mp_need(m, 4)) { *n = be(m->p, 4); m->p += 4; }
    else return 0;
    return 1;
}

/* The msgpack writers below stay inline: produce's and pull's answers call them per field. */

static inline uint8_t *mp_str(uint8_t *p, const char *s, Py_ssize_t n) {
    if (n < 32) *p++ = (uint8_t)(0xa0 | n);
    else if (n < 256) { *p++ = 0xd9; *p++ = (uint8_t)n; }
    else if (n < 65536) { *p++ = 0xda; *p++ = (uint8_t)(n >> 8); *p++ = (uint8_t)n; }
    else { *p++ = 0xdb; *p++ = (uint8_t)(n >> 24); *p++ = (uint8_t)(n >> 16); *p++ = (uint8_t)(n >> 8); *p++ = (uint8_t)n; }
    memcpy(p, s, (size_t)n);
    return p + n;
}

static inline uint8_t *mp_fixstr(uint8_t *p, const char *s) { return mp_str(p, s, (Py_ssize_t)strlen(s)); }

static inline uint8_t *mp_uint_or_int(uint8_t *p, int64_t v) {
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

static inline size_t hex_of(uint64_t v, char *out) {
    char tmp[16];
    size_t n = 0;
    do { tmp[n++] = "0123456789abcdef"[v & 15]; v >>= 4; } while (v);
    for (size_t k = 0; k < n; k++) out[k] = tmp[n - 1 - k];
    return n;
}

/* ------------------------------------------------------------------------------------------ */
/* the module's functions, by file (the table is in _batch.c)                                  */

/* batch_util.c */
BATCH_HIDDEN PyObject *py_crc32(PyObject *self, PyObject *args);
BATCH_HIDDEN PyObject *py_crc_folds(PyObject *self, PyObject *args);

/* batch_produce.c: produce */
BATCH_HIDDEN int batch_produce_init(void);  /* interns the field names; 0, or -1 with an error set */
BATCH_HIDDEN PyObject *encode_produce(PyObject *self, PyObject *args);
BATCH_HIDDEN PyObject *encode_produce_raw(PyObject *self, PyObject *args);
BATCH_HIDDEN PyObject *produced_rows(PyObject *self, PyObject *args);
BATCH_HIDDEN PyObject *record_offsets(PyObject *self, PyObject *args);
BATCH_HIDDEN PyObject *encode_produced(PyObject *self, PyObject *args);

/* batch_timer.c: enqueue-get, enqueue-put, dequeue-get, dequeue-get-message */
BATCH_HIDDEN PyObject *scan_rows(PyObject *self, PyObject *args);
BATCH_HIDDEN PyObject *scan_starts(PyObject *self, PyObject *args);
BATCH_HIDDEN PyObject *index_rows(PyObject *self, PyObject *args);
BATCH_HIDDEN PyObject *add_counts(PyObject *self, PyObject *args);
BATCH_HIDDEN PyObject *put_slots(PyObject *self, PyObject *args);
BATCH_HIDDEN extern PyTypeObject WalkerType;
BATCH_HIDDEN PyObject *classify(PyObject *self, PyObject *args);
BATCH_HIDDEN PyObject *dues(PyObject *self, PyObject *args);
BATCH_HIDDEN PyObject *roll_copies(PyObject *self, PyObject *args);

/* batch_release.c: dequeue-put, and the batch counters */
BATCH_HIDDEN extern PyTypeObject DueHeapType;
BATCH_HIDDEN PyObject *release_rows(PyObject *self, PyObject *args);
BATCH_HIDDEN PyObject *set_states(PyObject *self, PyObject *args);
BATCH_HIDDEN PyObject *seq_runs(PyObject *self, PyObject *args);
BATCH_HIDDEN PyObject *lateness(PyObject *self, PyObject *args);
BATCH_HIDDEN PyObject *bucket_counts(PyObject *self, PyObject *args);
BATCH_HIDDEN PyObject *unit_bounds(PyObject *self, PyObject *arg);
BATCH_HIDDEN PyObject *tally(PyObject *self, PyObject *args);

/* batch_recovery.c: recovery after a crash */
BATCH_HIDDEN PyObject *restore_states(PyObject *self, PyObject *args);
BATCH_HIDDEN PyObject *unit_prevs(PyObject *self, PyObject *args);
BATCH_HIDDEN PyObject *strip_slots(PyObject *self, PyObject *args);
BATCH_HIDDEN PyObject *message_runs(PyObject *self, PyObject *arg);
BATCH_HIDDEN PyObject *census(PyObject *self, PyObject *arg);
BATCH_HIDDEN PyObject *bad_slots(PyObject *self, PyObject *args);

/* batch_pull.c: pull and ack */
BATCH_HIDDEN PyObject *read_plan(PyObject *self, PyObject *args);
BATCH_HIDDEN PyObject *encode_pull(PyObject *self, PyObject *args);
BATCH_HIDDEN PyObject *record_keys(PyObject *self, PyObject *args);
BATCH_HIDDEN PyObject *parse_receipts(PyObject *self, PyObject *args);
BATCH_HIDDEN PyObject *parse_receipts_raw(PyObject *self, PyObject *args);
BATCH_HIDDEN PyObject *take_rows(PyObject *self, PyObject *args);

/* ------------------------------------------------------------------------------------------ */
/* a batch's keys, packed (batch_keyseq.c, its byte table there)                               */

#define KEY_NONE UINT32_MAX  /* an entry's len: the message has no key */
typedef struct {
    uint32_t at, len;  /* the key's UTF-8: text[at:at + len] */
    Py_hash_t hash;    /* hash() of the key's str */
} KeyEntry;
typedef struct {
    PyObject_HEAD
    Py_ssize_t n, named;  /* entries; of them keys (not None) */
    KeyEntry *e;
    char *text;
} Keys;
BATCH_HIDDEN extern PyTypeObject KeysType;
/* n entries, every one None, and room for text_len bytes of keys; NULL with an error set */
BATCH_HIDDEN Keys *keys_new(Py_ssize_t n, size_t text_len);
/* entry i: the key s (valid UTF-8) copied to text[at:at + len], hashed; 0, or -1 with an error set */
BATCH_HIDDEN int keys_set(Keys *k, Py_ssize_t i, const char *s, uint32_t len, uint32_t at);
BATCH_HIDDEN PyObject *keys_item(const Keys *k, Py_ssize_t i);  /* new reference: str or None */
static inline int keys_check(PyObject *o) { return Py_IS_TYPE(o, &KeysType); }

/* Python's hash of bytes: of a str of ASCII characters, its hash (the str hashes its bytes as they
 * are), so a key's UTF-8 is hashed without a str. Needs no GIL. */
static inline Py_hash_t bytes_hash(const void *s, Py_ssize_t n) {
#if PY_VERSION_HEX >= 0x030D0000
    return Py_HashBuffer(s, n);
#else
    return _Py_HashBytes(s, n);
#endif
}

/* Keys given as a list or tuple, or as Keys: how many (a list's size can change while its keys
 * are hashed, so it is asked each time), whether key i is None, and its hash. */
static inline Py_ssize_t ks_len(PyObject *keys) {
    return keys_check(keys) ? ((Keys *)keys)->n : PySequence_Fast_GET_SIZE(keys);
}

static inline int ks_none(PyObject *keys, Py_ssize_t i) {
    return keys_check(keys) ? ((Keys *)keys)->e[i].len == KEY_NONE : PySequence_Fast_GET_ITEM(keys, i) == Py_None;
}

/* 1 and the hash of key i; 0: None; -1: an error is set (a key that cannot be hashed). */
static inline int ks_hash(PyObject *keys, Py_ssize_t i, Py_hash_t *h) {
    if (keys_check(keys)) {
        const KeyEntry *e = &((Keys *)keys)->e[i];
        *h = e->hash;
        return e->len != KEY_NONE;
    }
    PyObject *key = PySequence_Fast_GET_ITEM(keys, i);
    if (key == Py_None) return 0;
    Py_INCREF(key);
    *h = PyObject_Hash(key);
    Py_DECREF(key);
    return *h == -1 ? -1 : 1;
}

/* ------------------------------------------------------------------------------------------ */
/* the key filter and the key index's overlay (batch_keys.c)                                  */

BATCH_HIDDEN PyObject *filter_add(PyObject *self, PyObject *args);
BATCH_HIDDEN PyObject *filter_add_json(PyObject *self, PyObject *args);
BATCH_HIDDEN PyObject *filter_maybe(PyObject *self, PyObject *args);
BATCH_HIDDEN PyObject *filter_claim(PyObject *self, PyObject *args);
BATCH_HIDDEN PyObject *overlay_put(PyObject *self, PyObject *args);
BATCH_HIDDEN PyObject *overlay_find(PyObject *self, PyObject *args);

/* ------------------------------------------------------------------------------------------ */
/* the key index's write order and rows (batch_keyrows.c)                                     */

BATCH_HIDDEN PyObject *key_order(PyObject *self, PyObject *args);
BATCH_HIDDEN PyObject *key_rows_json(PyObject *self, PyObject *args);

/* batch_sync.c: the group commit's fsync thread */
BATCH_HIDDEN extern PyTypeObject SyncerType;

#endif /* DELAYD_BATCH_CORE_H */
