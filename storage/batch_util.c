/*
 * The shared helpers of delayd.storage._batch (declared in batch_core.h): CRC-32, views of Python
 * buffers, the growable output buffer, the u64 map, message-table spans, the commit-log record
 * check and strict UTF-8.
 */
#include "batch_core.h"

/* ------------------------------------------------------------------------------------------ */
/* CRC-32 (the zlib/ISO-HDLC polynomial, = zlib.crc32): slicing by 8, and on x86-64 machines with
 * PCLMULQDQ the 16-byte blocks of a buffer of 64 bytes or more folded by carry-less multiplies
 * (Gopal et al., "Fast CRC Computation for Generic Polynomials Using PCLMULQDQ Instruction",
 * Intel 2009: the bit-reflected constants of its appendix, as zlib forks use them). */

static uint32_t crc_table[8][256];

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define CRC_FOLD 1
#define CRC_FOLD_MIN 64
static int crc_fold_ok;  /* set by crc_init when the CPU has PCLMULQDQ and SSE4.1 */

static int crc_fold_possible(void) {
    return __builtin_cpu_supports("pclmul") && __builtin_cpu_supports("sse4.1");
}

/* The CRC state (not inverted) after `len` bytes (len >= 64, a multiple of 16) from `crc`. */
__attribute__((target("pclmul,sse4.1")))
static uint32_t crc_fold(const uint8_t *p, size_t len, uint32_t crc) {
    const __m128i k1k2 = _mm_set_epi64x(0x01c6e41596, 0x0154442bd4);
    const __m128i k3k4 = _mm_set_epi64x(0x00ccaa009e, 0x01751997d0);
    const __m128i k5k0 = _mm_set_epi64x(0, 0x0163cd6124);
    const __m128i poly = _mm_set_epi64x(0x01f7011641, 0x01db710641);
    const __m128i low32 = _mm_setr_epi32(~0, 0, ~0, 0);
    __m128i x1 = _mm_loadu_si128((const __m128i *)p), x2 = _mm_loadu_si128((const __m128i *)(p + 16)),
            x3 = _mm_loadu_si128((const __m128i *)(p + 32)), x4 = _mm_loadu_si128((const __m128i *)(p + 48));
    x1 = _mm_xor_si128(x1, _mm_cvtsi32_si128((int)crc));
    p += 64;
    len -= 64;
    while (len >= 64) {  /* four lanes, 64 bytes a round */
        __m128i x5 = _mm_clmulepi64_si128(x1, k1k2, 0x00), x6 = _mm_clmulepi64_si128(x2, k1k2, 0x00),
                x7 = _mm_clmulepi64_si128(x3, k1k2, 0x00), x8 = _mm_clmulepi64_si128(x4, k1k2, 0x00);
        x1 = _mm_clmulepi64_si128(x1, k1k2, 0x11);
        x2 = _mm_clmulepi64_si128(x2, k1k2, 0x11);
        x3 = _mm_clmulepi64_si128(x3, k1k2, 0x11);
        x4 = _mm_clmulepi64_si128(x4, k1k2, 0x11);
        x1 = _mm_xor_si128(_mm_xor_si128(x1, x5), _mm_loadu_si128((const __m128i *)p));
        x2 = _mm_xor_si128(_mm_xor_si128(x2, x6), _mm_loadu_si128((const __m128i *)(p + 16)));
        x3 = _mm_xor_si128(_mm_xor_si128(x3, x7), _mm_loadu_si128((const __m128i *)(p + 32)));
        x4 = _mm_xor_si128(_mm_xor_si128(x4, x8), _mm_loadu_si128((const __m128i *)(p + 48)));
        p += 64;
        len -= 64;
    }
    /* the four lanes into one */
    __m128i x5 = _mm_clmulepi64_si128(x1, k3k4, 0x00);
    x1 = _mm_xor_si128(_mm_xor_si128(_mm_clmulepi64_si128(x1, k3k4, 0x11), x2), x5);
    x5 = _mm_clmulepi64_si128(x1, k3k4, 0x00);
    x1 = _mm_xor_si128(_mm_xor_si128(_mm_clmulepi64_si128(x1, k3k4, 0x11), x3), x5);
    x5 = _mm_clmulepi64_si128(x1, k3k4, 0x00);
    x1 = _mm_xor_si128(_mm_xor_si128(_mm_clmulepi64_si128(x1, k3k4, 0x11), x4), x5);
    while (len >= 16) {  /* the rest, 16 bytes at a time */
        x5 = _mm_clmulepi64_si128(x1, k3k4, 0x00);
        x1 = _mm_xor_si128(_mm_xor_si128(_mm_clmulepi64_si128(x1, k3k4, 0x11),
                                         _mm_loadu_si128((const __m128i *)p)), x5);
        p += 16;
        len -= 16;
    }
    /* 128 bits to 64 */
    x2 = _mm_clmulepi64_si128(x1, k3k4, 0x10);
    x1 = _mm_xor_si128(_mm_srli_si128(x1, 8), x2);
    x2 = _mm_srli_si128(x1, 4);
    x1 = _mm_xor_si128(_mm_clmulepi64_si128(_mm_and_si128(x1, low32), k5k0, 0x00), x2);
    /* Barrett reduction to 32 bits */
    x2 = _mm_clmulepi64_si128(_mm_and_si128(x1, low32), poly, 0x10);
    x2 = _mm_clmulepi64_si128(_mm_and_si128(x2, low32), poly, 0x00);
    x1 = _mm_xor_si128(x1, x2);
    return (uint32_t)_mm_extract_epi32(x1, 1);
}
#endif

void crc_init(void) {
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++) c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
        crc_table[0][i] = c;
    }
    for (uint32_t i = 0; i < 256; i++)
        for (int t = 1; t < 8; t++)
            crc_table[t][i] = (crc_table[t - 1][i] >> 8) ^ crc_table[0][crc_table[t - 1][i] & 0xFF];
#ifdef CRC_FOLD
    __builtin_cpu_init();
    crc_fold_ok = crc_fold_possible();
#endif
}

uint32_t crc32_update(uint32_t crc, const uint8_t *p, size_t n) {
    crc = ~crc;
#ifdef CRC_FOLD
    if (crc_fold_ok && n >= CRC_FOLD_MIN) {
        size_t blocks = n & ~(size_t)15;
        crc = crc_fold(p, blocks, crc);
        p += blocks;
        n -= blocks;
    }
#endif
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

/* ------------------------------------------------------------------------------------------ */
/* sorting rows: radix by the keys, then insertion by cmp (see batch_core.h)                    */

#define SORT_INSERTION_MAX 48  /* up to this many rows the radix passes cost more */
#define SORT_MAX_WIDTH 64

static void insertion_sort(uint8_t *rows, Py_ssize_t n, size_t w, int (*cmp)(const void *, const void *)) {
    uint8_t hold[SORT_MAX_WIDTH];
    for (Py_ssize_t i = 1; i < n; i++) {
        uint8_t *row = rows + i * w;
        if (cmp(row - w, row) <= 0) continue;
        memcpy(hold, row, w);
        Py_ssize_t j = i;
        while (j > 0 && cmp(rows + (j - 1) * w, hold) > 0) j--;
        memmove(rows + (j + 1) * w, rows + j * w, (size_t)(i - j) * w);
        memcpy(rows + j * w, hold, w);
    }
}

typedef struct {
    uint64_t key;  /* the field, as unsigned order */
    uint64_t row;  /* which row it came from */
} KeyRow;

/* Stable LSD radix sort of n KeyRows by key, a pass for each byte in which the keys differ;
 * `tmp` has room for n. */
static void radix_keys(KeyRow *a, KeyRow *tmp, Py_ssize_t n) {
    uint64_t differ = 0;
    for (Py_ssize_t i = 1; i < n; i++) differ |= a[i].key ^ a[0].key;
    KeyRow *src = a, *dst = tmp;
    for (int shift = 0; shift < 64; shift += 8) {
        if (!((differ >> shift) & 0xFF)) continue;
        Py_ssize_t at[256] = {0}, sum = 0;
        for (Py_ssize_t i = 0; i < n; i++) at[(src[i].key >> shift) & 0xFF]++;
        for (int v = 0; v < 256; v++) {
            Py_ssize_t c = at[v];
            at[v] = sum;
            sum += c;
        }
        for (Py_ssize_t i = 0; i < n; i++) dst[at[(src[i].key >> shift) & 0xFF]++] = src[i];
        KeyRow *t = src;
        src = dst;
        dst = t;
    }
    if (src != a) memcpy(a, src, (size_t)n * sizeof *a);
}

static inline int same_keys(const uint8_t *a, const uint8_t *b, const SortKey *keys, int nkeys) {
    for (int f = 0; f < nkeys; f++)
        if (rd64(a + keys[f].at) != rd64(b + keys[f].at)) return 0;
    return 1;
}

int sort_rows(uint8_t *rows, Py_ssize_t n, size_t w, const SortKey *keys, int nkeys,
              int (*cmp)(const void *, const void *)) {
    if (w > SORT_MAX_WIDTH) {  /* wider than insertion_sort's row buffer (no caller's rows are) */
        qsort(rows, (size_t)n, w, cmp);
        return 0;
    }
    if (n <= SORT_INSERTION_MAX) {
        insertion_sort(rows, n, w, cmp);
        return 0;
    }
    KeyRow *kr = PyMem_Malloc((size_t)n * 2 * sizeof *kr);
    uint8_t *sorted = PyMem_Malloc((size_t)n * w);
    if (!kr || !sorted) {
        PyMem_Free(kr);
        PyMem_Free(sorted);
        PyErr_NoMemory();
        return -1;
    }
    for (int f = nkeys - 1; f >= 0; f--) {  /* least significant key first: each sort is stable */
        uint64_t flip = keys[f].is_signed ? 1ull << 63 : 0;  /* int64 order as unsigned */
        for (Py_ssize_t i = 0; i < n; i++) {
            uint64_t r = f == nkeys - 1 ? (uint64_t)i : kr[i].row;
            kr[i].row = r;
            kr[i].key = rd64(rows + r * w + keys[f].at) ^ flip;
        }
        radix_keys(kr, kr + n, n);
    }
    for (Py_ssize_t i = 0; i < n; i++) memcpy(sorted + i * w, rows + kr[i].row * w, w);
    memcpy(rows, sorted, (size_t)n * w);
    PyMem_Free(kr);
    PyMem_Free(sorted);
    for (Py_ssize_t i = 0; i < n;) {  /* rows whose keys are all equal: in cmp's order */
        Py_ssize_t j = i + 1;
        while (j < n && same_keys(rows + (j - 1) * w, rows + j * w, keys, nkeys)) j++;
        if (j - i > SORT_INSERTION_MAX) qsort(rows + i * w, (size_t)(j - i), w, cmp);  /* never quadratic */
        else if (j - i > 1) insertion_sort(rows + i * w, j - i, w, cmp);
        i = j;
    }
    return 0;
}

/* ------------------------------------------------------------------------------------------ */
/* small helpers                                                                               */

int buf_get(PyObject *obj, Buf *b, int writable, const char *what) {
    b->held = 0;
    if (PyObject_GetBuffer(obj, &b->view, writable ? PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS : PyBUF_C_CONTIGUOUS) < 0) {
        PyErr_Format(PyExc_TypeError, "%s: expected a %sbuffer", what, writable ? "writable " : "");
        return -1;
    }
    b->held = 1;
    return 0;
}

void buf_release(Buf *b) {
    if (b->held) PyBuffer_Release(&b->view);
    b->held = 0;
}

int out_reserve(Out *o, size_t extra) {
    if (o->n + extra <= o->cap) return 0;
    size_t cap = o->cap ? o->cap : 4096;
    while (cap < o->n + extra) cap *= 2;
    uint8_t *p = PyMem_Realloc(o->p, cap);
    if (!p) { PyErr_NoMemory(); return -1; }
    o->p = p;
    o->cap = cap;
    return 0;
}

uint8_t *out_take(Out *o, size_t n) {
    if (out_reserve(o, n) < 0) return NULL;
    uint8_t *p = o->p + o->n;
    o->n += n;
    return p;
}

PyObject *out_bytes(Out *o) {
    PyObject *b = PyBytes_FromStringAndSize((const char *)o->p, (Py_ssize_t)o->n);
    PyMem_Free(o->p);
    o->p = NULL;
    o->n = o->cap = 0;
    return b;
}

void out_free(Out *o) { PyMem_Free(o->p); o->p = NULL; o->n = o->cap = 0; }

int map_init(Map *m, size_t expected) {
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

void map_free(Map *m) { PyMem_Free(m->keys); PyMem_Free(m->vals); PyMem_Free(m->used); memset(m, 0, sizeof(*m)); }

static inline size_t map_hash(uint64_t k) { k ^= k >> 33; k *= 0xff51afd7ed558ccdULL; k ^= k >> 33; return (size_t)k; }

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

size_t map_slot(Map *m, uint64_t k, int64_t init, int *inserted) {
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

int map_has(const Map *m, uint64_t k) {
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

void spans_release(Spans *sp) {
    for (Py_ssize_t i = 0; i < sp->n; i++) buf_release(&sp->s[i].buf);
    PyMem_Free(sp->s);
    sp->s = NULL;
    sp->n = 0;
}

/* `spans`: a list of objects with attributes base (int), buf (bytearray), valid, lo, hi (ints),
 * sorted by base and not overlapping (MessageTable.begin_batch makes them). */
int spans_get(PyObject *list, Spans *sp) {
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
int spans_commit(Spans *sp) {
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
uint8_t *span_entry(Spans *sp, uint64_t seq, Span **which, int *readable) {
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

/* ------------------------------------------------------------------------------------------ */
/* commit-log records                                                                          */

/* Check the record at buf[i:]; 0 ok, else a SCAN_* outcome. Mirrors commitlog.decode's order:
 * header cut → torn; impossible length → corrupt; cut record → torn; crc → corrupt; version;
 * unknown type → corrupt. */
int check_record(const uint8_t *buf, size_t n, size_t i, int verify, uint32_t *length) {
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

Read *find_read(Read *reads, Py_ssize_t nreads, int64_t off, uint32_t size) {
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

Read *reads_get(PyObject *list, Py_ssize_t *n) {
    Py_ssize_t nreads = PyList_GET_SIZE(list), held = 0;
    Read *reads = PyMem_Calloc(nreads ? (size_t)nreads : 1, sizeof(Read));
    if (!reads) { PyErr_NoMemory(); return NULL; }
    for (; held < nreads; held++) {
        PyObject *data;
        long long start;
        if (!PyArg_ParseTuple(PyList_GET_ITEM(list, held), "LO", &start, &data) ||
            buf_get(data, &reads[held].b, 0, "read") < 0) {
            reads_release(reads, held);
            return NULL;
        }
        reads[held].start = start;
    }
    *n = nreads;
    return reads;
}

void reads_release(Read *reads, Py_ssize_t n) {
    if (!reads) return;
    for (Py_ssize_t j = 0; j < n; j++) buf_release(&reads[j].b);
    PyMem_Free(reads);
}

const uint8_t *record_in(Read *reads, Py_ssize_t nreads, int64_t off, uint32_t size, int *outcome, uint32_t *length) {
    Read *rd = find_read(reads, nreads, off, size < RECORD_HEADER ? RECORD_HEADER : size);
    *outcome = 0;
    if (!rd) return NULL;
    size_t at = (size_t)(off - rd->start);  /* checked against the read that holds it, not `size` */
    *outcome = check_record(rd->b.view.buf, (size_t)rd->b.view.len, at, 1, length);
    return (const uint8_t *)rd->b.view.buf + at;
}

/* ------------------------------------------------------------------------------------------ */
/* UTF-8                                                                                       */

/* Strict UTF-8 (what bytes.decode() accepts): no overlongs, no surrogates, nothing past U+10FFFF. */
int utf8_ok(const uint8_t *s, size_t n) {
    size_t i = 0;
    while (i < n) {
        if (n - i >= 8) {  /* eight ASCII bytes at a time */
            uint64_t w;
            memcpy(&w, s + i, 8);
            if (!(w & 0x8080808080808080ull)) { i += 8; continue; }
        }
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

/* crc_folds(on=None) -> bool: whether crc32 folds blocks with PCLMULQDQ (True only where the CPU
 * has it); `on` turns that on or off first (the differential tests check both ways). */
PyObject *py_crc_folds(PyObject *self, PyObject *args) {
    PyObject *on = Py_None;
    if (!PyArg_ParseTuple(args, "|O", &on)) return NULL;
#ifdef CRC_FOLD
    if (on != Py_None) {
        int want = PyObject_IsTrue(on);
        if (want < 0) return NULL;
        crc_fold_ok = want && crc_fold_possible();
    }
    return PyBool_FromLong(crc_fold_ok);
#else
    return PyBool_FromLong(0);
#endif
}

/* crc32(data, value=0) -> int: zlib.crc32, for tests and callers that have no zlib at hand. */
PyObject *py_crc32(PyObject *self, PyObject *args) {
    PyObject *o;
    unsigned int v = 0;
    if (!PyArg_ParseTuple(args, "O|I", &o, &v)) return NULL;
    Buf b;
    if (buf_get(o, &b, 0, "data") < 0) return NULL;
    uint32_t c = crc32_update(v, b.view.buf, (size_t)b.view.len);
    buf_release(&b);
    return PyLong_FromUnsignedLong(c);
}
