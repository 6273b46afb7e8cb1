/*
 * The key index's checkpoint write, specified by storage/keyindex.py (the reference, compared byte
 * for byte by tests/storage/test_key_order.py): the order in which it writes a checkpoint's keys
 * (key_order) and its rows as JSON text (key_rows_json). A run's keys are a list or tuple of str
 * or None, or Keys (a produce batch's keys packed, batch_keyseq.c).
 */
#include "batch_core.h"

/* key_order(runs): the order in which the key index writes the keys of put_runs, each run a tuple
 * (topic, keys, ...) with keys a list or tuple of str or None (no key): by topic, then key, in
 * UTF-8 byte order (SQLite's BINARY collation), keys of one pair in their given order; None left
 * out. Returns each key's place among all the runs' keys laid end to end (None counted), as u64
 * in the machine's byte order (an array('Q')); with `text` true, (that order, the keys' UTF-8 laid
 * end to end in that order, the n + 1 u64 bounds of the keys in it) for key_rows_json. With the
 * GIL the keys' UTF-8 is copied, in the runs' order, from one str to the next as they were made;
 * the sort and the text run without it, on the copy (a checkpoint's keys take tens of
 * milliseconds, which the event loop must not wait for; and no str is held or let go). */

typedef struct {
    size_t at;  /* the key's UTF-8 in the copy */
    Py_ssize_t key_len;
    uint64_t code;
} KoKey;

/* What the sort moves: a key's topic as its rank among the topics, the key's 8 bytes after the
 * prefix every key shares (big-endian, 0-padded), and where its KoKey is. Two keys whose `prefix`
 * differs are in that order: their first difference past the shared prefix is a byte of it, or
 * one of them ends there (its padding is then the lower, and the shorter key sorts first). Only
 * equal prefixes read the keys' bytes, which lie wherever each str was made: a sort that compared
 * the bytes themselves (glibc's qsort of KoKeys, through pointers to them) waited on memory at
 * every step (a million random keys: about three times the time, BENCHMARKS.md). */
typedef struct {
    uint64_t prefix;
    uint32_t topic, at;
} KoSort;

static void ko_prefixes(const char *copy, const KoKey *k, KoSort *s, Py_ssize_t m) {
    Py_ssize_t shared = m ? k[0].key_len : 0;
    for (Py_ssize_t i = 1; i < m && shared; i++) {
        Py_ssize_t n = k[i].key_len < shared ? k[i].key_len : shared, j = 0;
        while (j < n && copy[k[i].at + (size_t)j] == copy[k[0].at + (size_t)j]) j++;
        shared = j;
    }
    for (Py_ssize_t i = 0; i < m; i++) {
        uint64_t v = 0;
        for (Py_ssize_t j = shared; j < shared + 8; j++)
            v = v << 8 | (j < k[i].key_len ? (uint8_t)copy[k[i].at + (size_t)j] : 0);
        s[i].prefix = v;
    }
}

static inline int ko_bytes(const char *a, Py_ssize_t an, const char *b, Py_ssize_t bn) {
    int c = memcmp(a, b, (size_t)(an < bn ? an : bn));
    return c ? c : (an > bn) - (an < bn);
}

/* By topic, then key, then place (KoKeys are in place order). */
static inline int ko_less(const KoSort *a, const KoSort *b, const char *copy, const KoKey *k) {
    if (a->topic != b->topic) return a->topic < b->topic;
    if (a->prefix != b->prefix) return a->prefix < b->prefix;
    int c = ko_bytes(copy + k[a->at].at, k[a->at].key_len, copy + k[b->at].at, k[b->at].key_len);
    return c ? c < 0 : a->at < b->at;
}

#define KO_RUN 16  /* insertion-sorted before the merges */

/* Merge sort of s[0..m) by ko_less, `t` as big for the merges. */
static void ko_sort(KoSort *s, KoSort *t, Py_ssize_t m, const char *copy, const KoKey *k) {
    for (Py_ssize_t lo = 0; lo < m; lo += KO_RUN) {
        Py_ssize_t hi = lo + KO_RUN < m ? lo + KO_RUN : m;
        for (Py_ssize_t i = lo + 1; i < hi; i++) {
            KoSort x = s[i];
            Py_ssize_t j = i;
            for (; j > lo && ko_less(&x, &s[j - 1], copy, k); j--) s[j] = s[j - 1];
            s[j] = x;
        }
    }
    KoSort *from = s, *to = t;
    for (Py_ssize_t w = KO_RUN; w < m; w *= 2) {
        for (Py_ssize_t lo = 0; lo < m; lo += 2 * w) {
            Py_ssize_t mid = lo + w < m ? lo + w : m, hi = lo + 2 * w < m ? lo + 2 * w : m;
            Py_ssize_t i = lo, j = mid, o = lo;
            while (i < mid && j < hi) to[o++] = ko_less(&from[j], &from[i], copy, k) ? from[j++] : from[i++];
            while (i < mid) to[o++] = from[i++];
            while (j < hi) to[o++] = from[j++];
        }
        KoSort *x = from;
        from = to;
        to = x;
    }
    if (from != s) memcpy(s, from, (size_t)m * sizeof *s);
}

/* Each run's topic as its rank among the runs' topics (equal topics, one rank). 0, or -1 with
 * an error set. */
typedef struct { const char *topic; Py_ssize_t len, run; } KoTopic;

static int ko_topic_cmp(const void *pa, const void *pb) {
    const KoTopic *a = pa, *b = pb;
    int c = ko_bytes(a->topic, a->len, b->topic, b->len);
    return c ? c : (a->run > b->run) - (a->run < b->run);
}

static int ko_topic_ranks(PyObject *runs, uint32_t *rank) {
    Py_ssize_t nruns = PyList_GET_SIZE(runs);
    KoTopic *t = PyMem_Malloc(nruns ? (size_t)nruns * sizeof *t : 1);
    if (!t) { PyErr_NoMemory(); return -1; }
    for (Py_ssize_t r = 0; r < nruns; r++) {
        t[r].topic = PyUnicode_AsUTF8AndSize(PyTuple_GET_ITEM(PyList_GET_ITEM(runs, r), 0), &t[r].len);
        if (!t[r].topic) { PyMem_Free(t); return -1; }
        t[r].run = r;
    }
    qsort(t, (size_t)nruns, sizeof *t, ko_topic_cmp);
    uint32_t at = 0;
    for (Py_ssize_t i = 0; i < nruns; i++) {
        if (i && ko_bytes(t[i].topic, t[i].len, t[i - 1].topic, t[i - 1].len)) at++;
        rank[t[i].run] = at;
    }
    PyMem_Free(t);
    return 0;
}

/* The shape key_order and key_rows_json take a run in (storage/keyindex.py check_run): a tuple
 * (topic str, keys list or tuple, ...); with `first` (not NULL) (topic, keys, first_seq, ...) and
 * the run's seqs within an i64, first_seq stored there. 0, or -1 with an error set. */
static int check_run(PyObject *run, Py_ssize_t r, int64_t *first) {
    if (!PyTuple_Check(run) || PyTuple_GET_SIZE(run) < (first ? 3 : 2)) {
        PyErr_Format(PyExc_TypeError, "run %zd: expected a tuple (topic, keys, %s...)", r, first ? "first_seq, " : "");
        return -1;
    }
    PyObject *keys = PyTuple_GET_ITEM(run, 1);
    if (!PyUnicode_Check(PyTuple_GET_ITEM(run, 0))) {
        PyErr_Format(PyExc_TypeError, "run %zd: topic must be a str", r);
        return -1;
    }
    if (!PyList_Check(keys) && !PyTuple_Check(keys) && !keys_check(keys)) {
        PyErr_Format(PyExc_TypeError, "run %zd: keys must be a list, a tuple or Keys", r);
        return -1;
    }
    if (!first) return 0;
    PyObject *seq = PyTuple_GET_ITEM(run, 2);
    if (!PyLong_Check(seq)) { PyErr_Format(PyExc_TypeError, "run %zd: first_seq must be an int", r); return -1; }
    int overflow = 0;
    long long s = PyLong_AsLongLongAndOverflow(seq, &overflow);
    if (s == -1 && PyErr_Occurred()) return -1;
    if (overflow || s < 0 || s > INT64_MAX - (long long)ks_len(keys)) {
        PyErr_Format(PyExc_ValueError, "run %zd: sequence numbers out of range", r);
        return -1;
    }
    *first = (int64_t)s;
    return 0;
}

PyObject *key_order(PyObject *self, PyObject *args) {
    PyObject *runs, *out = NULL, *order = NULL, *text = NULL, *bounds = NULL;
    KoKey *k = NULL;
    KoSort *s = NULL;
    uint32_t *rank = NULL;
    Out copy = {0};
    int with_text = 0;
    if (!PyArg_ParseTuple(args, "O|p", &runs, &with_text)) return NULL;
    if (!PyList_Check(runs)) { PyErr_SetString(PyExc_TypeError, "runs: expected a list"); return NULL; }
    Py_ssize_t nruns = PyList_GET_SIZE(runs), n = 0;
    for (Py_ssize_t r = 0; r < nruns; r++) {
        PyObject *run = PyList_GET_ITEM(runs, r);
        if (check_run(run, r, NULL) < 0) return NULL;
        n += ks_len(PyTuple_GET_ITEM(run, 1));
    }
    if (n > (Py_ssize_t)UINT32_MAX || nruns > (Py_ssize_t)UINT32_MAX) {
        PyErr_SetString(PyExc_OverflowError, "more than 2**32 keys or runs");
        return NULL;
    }
    k = PyMem_Malloc(n ? (size_t)n * sizeof *k : 1);
    s = PyMem_Malloc(n ? (size_t)n * 2 * sizeof *s : 1);  /* and as many for the merges */
    rank = PyMem_Malloc(nruns ? (size_t)nruns * sizeof *rank : 1);
    if (!k || !s || !rank) { PyErr_NoMemory(); goto done; }
    if (out_reserve(&copy, 1) < 0) goto done;  /* (a buffer even when every key is empty) */
    Py_ssize_t m = 0, place = 0;
    for (Py_ssize_t r = 0; r < nruns; r++) {
        PyObject *run = PyList_GET_ITEM(runs, r), *keys = PyTuple_GET_ITEM(run, 1);
        if (!PyUnicode_AsUTF8(PyTuple_GET_ITEM(run, 0))) goto done;  /* a lone surrogate: UnicodeEncodeError */
        const Keys *packed = keys_check(keys) ? (const Keys *)keys : NULL;
        for (Py_ssize_t i = 0, len = ks_len(keys); i < len; i++, place++) {
            const char *utf8;
            if (packed) {
                const KeyEntry *e = &packed->e[i];
                if (e->len == KEY_NONE) continue;
                utf8 = packed->text + e->at;
                k[m].key_len = (Py_ssize_t)e->len;
            } else {
                PyObject *key = PySequence_Fast_ITEMS(keys)[i];
                if (key == Py_None) continue;
                if (!PyUnicode_Check(key)) {
                    PyErr_Format(PyExc_TypeError, "run %zd, key %zd: expected a str or None", r, i);
                    goto done;
                }
                utf8 = PyUnicode_AsUTF8AndSize(key, &k[m].key_len);
            }
            if (!utf8 || out_reserve(&copy, (size_t)k[m].key_len) < 0) goto done;
            memcpy(copy.p + copy.n, utf8, (size_t)k[m].key_len);
            k[m].at = copy.n;
            copy.n += (size_t)k[m].key_len;
            k[m].code = (uint64_t)place;
            s[m].topic = (uint32_t)r;  /* (its rank, below) */
            s[m].at = (uint32_t)m;
            m++;
        }
    }
    if (ko_topic_ranks(runs, rank) < 0) goto done;  /* (every topic's UTF-8 is made: no error) */
    for (Py_ssize_t i = 0; i < m; i++) s[i].topic = rank[s[i].topic];
    order = PyBytes_FromStringAndSize(NULL, m * 8);
    if (!order) goto done;
    if (with_text) {  /* (made now, filled without the GIL: nothing else sees them yet) */
        text = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)copy.n);
        bounds = PyBytes_FromStringAndSize(NULL, (m + 1) * 8);
        if (!text || !bounds) goto done;
    }
    Py_BEGIN_ALLOW_THREADS
    const char *c = (const char *)copy.p;
    ko_prefixes(c, k, s, m);
    ko_sort(s, s + m, m, c, k);
    uint8_t *o = (uint8_t *)PyBytes_AS_STRING(order);
    for (Py_ssize_t i = 0; i < m; i++) memcpy(o + 8 * i, &k[s[i].at].code, 8);
    if (with_text) {  /* the keys' UTF-8 in key order */
        char *t = PyBytes_AS_STRING(text);
        uint8_t *b = (uint8_t *)PyBytes_AS_STRING(bounds);
        uint64_t at = 0;
        wr64(b, 0);
        for (Py_ssize_t i = 0; i < m; i++) {
            const KoKey *key = &k[s[i].at];
            memcpy(t + at, c + key->at, (size_t)key->key_len);
            at += (uint64_t)key->key_len;
            wr64(b + 8 * (i + 1), at);
        }
    }
    Py_END_ALLOW_THREADS
    out = with_text ? PyTuple_Pack(3, order, text, bounds) : Py_NewRef(order);
done:
    PyMem_Free(k);
    PyMem_Free(s);
    PyMem_Free(rank);
    out_free(&copy);
    Py_XDECREF(order);
    Py_XDECREF(text);
    Py_XDECREF(bounds);
    return out;
}

/* ------------------------------------------------------------------------------------------ */
/* key_rows_json(runs, order, dues, limit, text, bounds): the rows the key index writes for
 * put_runs, each run a tuple (topic, keys, first_seq, ...), for the places `order` names
 * (key_order's, or a stretch of them), whose keys' UTF-8 is in `text` as `bounds` says (key_order's
 * with `text`, cut to the same stretch: the key of row j is text[bounds[j]:bounds[j + 1]], one u64
 * more than `order` holds), with `dues` (each key's due time as i64, laid end to end, None
 * counted), as the key index's PUT_JSON reads them: a list of (topic, keys, numbers) chunks of at
 * most `limit` rows of one topic, `keys` the JSON array of the keys exactly as json.dumps writes
 * it (compact, not ASCII-escaped), `numbers` each row's seq and deliver_at as KR_DIGITS ASCII
 * digits each, zero padded (b"%020d"); and, as u64s, the places of keys holding a NUL, which
 * SQLite's JSON functions cut short (the caller binds those). Of the runs only the topics, first
 * seqs and sizes are read, never a key's str: every row is made without the GIL, which the
 * checkpoint's thread then holds for the runs and the result only. Specified by
 * storage/keyindex.py's key_rows_json. */

typedef struct {
    uint64_t key, key_len, escaped;  /* the key's UTF-8 in `text`; its length in JSON */
    Py_ssize_t run;
    int64_t seq, due;
} KrRow;

typedef struct {
    const char *topic;  /* UTF-8, as long as the runs are held */
    Py_ssize_t topic_len, start;
    int64_t first;
} KrRun;

static inline size_t kr_escaped(const char *s, uint64_t n) {
    size_t m = 0;
    for (uint64_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '"' || c == '\\' || c == '\b' || c == '\f' || c == '\n' || c == '\r' || c == '\t') m += 2;
        else if (c < 0x20) m += 6;
        else m += 1;
    }
    return m;
}

static inline char *kr_escape(char *o, const char *s, uint64_t n) {
    static const char hex[] = "0123456789abcdef";
    for (uint64_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        switch (c) {
        case '"': *o++ = '\\'; *o++ = '"'; break;
        case '\\': *o++ = '\\'; *o++ = '\\'; break;
        case '\b': *o++ = '\\'; *o++ = 'b'; break;
        case '\f': *o++ = '\\'; *o++ = 'f'; break;
        case '\n': *o++ = '\\'; *o++ = 'n'; break;
        case '\r': *o++ = '\\'; *o++ = 'r'; break;
        case '\t': *o++ = '\\'; *o++ = 't'; break;
        default:
            if (c < 0x20) {
                memcpy(o, "\\u00", 4);
                o[4] = hex[c >> 4];
                o[5] = hex[c & 15];
                o += 6;
            } else {
                *o++ = (char)c;
            }
        }
    }
    return o;
}

#define KR_DIGITS 20  /* "-9223372036854775808" (storage/keyindex.py NUMBER_DIGITS) */

/* `v` as b"%020d" writes it: a '-' first when negative, then zeros up to KR_DIGITS bytes. */
static inline char *kr_digits(char *o, int64_t v) {
    uint64_t u = v < 0 ? (uint64_t)0 - (uint64_t)v : (uint64_t)v;
    for (int i = KR_DIGITS - 1; i >= 0; i--) {
        o[i] = (char)('0' + u % 10);
        u /= 10;
    }
    if (v < 0) o[0] = '-';  /* (the 20th digit of any i64 but INT64_MIN's is a zero) */
    return o + KR_DIGITS;
}

static inline int kr_same_topic(const KrRun *a, const KrRun *b) {
    return a == b || (a->topic_len == b->topic_len && !memcmp(a->topic, b->topic, (size_t)a->topic_len));
}

/* The run holding `place`: the last whose start is at or below it (runs without keys share a start). */
static inline Py_ssize_t kr_run_of(const KrRun *rn, Py_ssize_t nruns, uint64_t place) {
    Py_ssize_t lo = 0, hi = nruns;  /* rn[lo].start <= place < rn[hi].start (hi == nruns: the end) */
    while (hi - lo > 1) {
        Py_ssize_t mid = lo + (hi - lo) / 2;
        if ((uint64_t)rn[mid].start <= place) lo = mid;
        else hi = mid;
    }
    return lo;
}

/* The due time of the row KR_AHEAD on is fetched ahead: in key order the places are random. */
#define KR_AHEAD 16

/* What key_rows_json does without the GIL: the rows, then the chunks' text and digits. */
typedef struct {
    const KrRun *rn;
    Py_ssize_t nruns, n, norder;
    const uint8_t *order, *bounds, *due;
    const char *text;
    uint64_t text_len;
    long long limit;
    KrRow *rows;
    uint8_t *rest;
    Py_ssize_t nrows, nrest, nchunks, *ends;  /* ends: per chunk its rows' end, then its text's end */
    char *json, *digits;
    int bad;  /* 1: a place names no key (`bad_at` the place), 2: bounds out of order or past the text (row) */
    uint64_t bad_at;
    int nomem;
} KrWork;

static void kr_rows(KrWork *w) {
    const uint8_t *ob = w->order, *bb = w->bounds;
    for (Py_ssize_t j = 0; j < w->norder; j++) {
        if (j + KR_AHEAD < w->norder) {
            uint64_t q = rd64(ob + 8 * (j + KR_AHEAD));
            if (q < (uint64_t)w->n) __builtin_prefetch(w->due + 8 * q);
        }
        uint64_t p = rd64(ob + 8 * j), at = rd64(bb + 8 * j), end = rd64(bb + 8 * (j + 1));
        if (p >= (uint64_t)w->n) { w->bad = 1; w->bad_at = p; return; }
        if (at > end || end > w->text_len) { w->bad = 2; w->bad_at = (uint64_t)j; return; }
        const char *key = w->text + at;
        if (memchr(key, 0, end - at)) {
            wr64(w->rest + 8 * w->nrest++, p);
            continue;
        }
        Py_ssize_t r = kr_run_of(w->rn, w->nruns, p);
        w->rows[w->nrows++] = (KrRow){at, end - at, kr_escaped(key, end - at), r,
                                      w->rn[r].first + (int64_t)(p - (uint64_t)w->rn[r].start), rdi64(w->due + 8 * p)};
    }
}

static void kr_text(KrWork *w) {
    const KrRow *rows = w->rows;
    Py_ssize_t nrows = w->nrows, *ends = w->ends, *tends = ends + nrows + 1;
    for (Py_ssize_t j = 0, start = 0; j <= nrows; j++) {
        if (j > start && (j == nrows || (long long)(j - start) == w->limit ||
                          !kr_same_topic(&w->rn[rows[j].run], &w->rn[rows[start].run]))) {
            ends[w->nchunks++] = j;
            start = j;
        }
    }
    size_t size = 1;
    for (Py_ssize_t j = 0; j < nrows; j++) size += 5 + rows[j].escaped;  /* ,"key" and (at most one a row) [ ] */
    w->json = PyMem_RawMalloc(size);
    w->digits = PyMem_RawMalloc(nrows ? (size_t)nrows * 2 * KR_DIGITS : 1);
    if (!w->json || !w->digits) { w->nomem = 1; return; }
    char *o = w->json, *d = w->digits;
    for (Py_ssize_t c = 0, j = 0; c < w->nchunks; c++) {
        *o++ = '[';
        for (Py_ssize_t start = j; j < ends[c]; j++) {
            if (j > start) *o++ = ',';
            *o++ = '"';
            const char *key = w->text + rows[j].key;
            if (rows[j].escaped == rows[j].key_len) {
                memcpy(o, key, rows[j].key_len);
                o += rows[j].key_len;
            } else {
                o = kr_escape(o, key, rows[j].key_len);
            }
            *o++ = '"';
            d = kr_digits(d, rows[j].seq);
            d = kr_digits(d, rows[j].due);
        }
        *o++ = ']';
        tends[c] = o - w->json;
    }
}

PyObject *key_rows_json(PyObject *self, PyObject *args) {
    PyObject *runs_o, *runs = NULL, *order_o, *dues_o, *limit_o, *text_o, *bounds_o, *out = NULL, *chunks = NULL, *rest = NULL;
    KrWork w = {0};
    KrRun *rn = NULL;
    Buf order = {.held = 0}, dues = {.held = 0}, text = {.held = 0}, bounds = {.held = 0};
    if (!PyArg_ParseTuple(args, "OOOOOO", &runs_o, &order_o, &dues_o, &limit_o, &text_o, &bounds_o)) return NULL;
    if (!PyLong_Check(limit_o)) { PyErr_SetString(PyExc_TypeError, "limit: expected an int"); return NULL; }
    if (!PyList_Check(runs_o)) { PyErr_SetString(PyExc_TypeError, "runs: expected a list"); return NULL; }
    runs = PyList_AsTuple(runs_o);  /* the runs as they are now: the list may change meanwhile */
    if (!runs) return NULL;
    Py_ssize_t nruns = PyTuple_GET_SIZE(runs), n = 0;
    rn = PyMem_Calloc(nruns ? (size_t)nruns : 1, sizeof *rn);
    if (!rn) { PyErr_NoMemory(); goto done; }
    for (Py_ssize_t r = 0; r < nruns; r++) {
        PyObject *run = PyTuple_GET_ITEM(runs, r);
        if (check_run(run, r, &rn[r].first) < 0) goto done;
        rn[r].topic = PyUnicode_AsUTF8AndSize(PyTuple_GET_ITEM(run, 0), &rn[r].topic_len);
        if (!rn[r].topic) goto done;  /* not encodable (a lone surrogate): UnicodeEncodeError */
        rn[r].start = n;
        n += ks_len(PyTuple_GET_ITEM(run, 1));
    }
    if (buf_get(dues_o, &dues, 0, "dues") < 0) goto done;
    if (dues.view.len != 8 * n) {
        PyErr_Format(PyExc_ValueError, "dues: %zd bytes for %zd keys", dues.view.len, n);
        goto done;
    }
    if (buf_get(order_o, &order, 0, "order") < 0) goto done;
    if (order.view.len % 8) { PyErr_SetString(PyExc_ValueError, "order: not a whole number of u64s"); goto done; }
    int big = 0;
    long long limit = PyLong_AsLongLongAndOverflow(limit_o, &big);
    if (limit == -1 && PyErr_Occurred()) goto done;
    if (big) limit = big < 0 ? -1 : LLONG_MAX;
    if (limit < 1) { PyErr_SetString(PyExc_ValueError, "limit: at least one row a chunk"); goto done; }
    if (buf_get(text_o, &text, 0, "text") < 0 || buf_get(bounds_o, &bounds, 0, "bounds") < 0) goto done;
    Py_ssize_t norder = order.view.len / 8;
    if (bounds.view.len != 8 * (norder + 1)) {
        PyErr_Format(PyExc_ValueError, "bounds: %zd bytes for %zd rows", bounds.view.len, norder);
        goto done;
    }
    w = (KrWork){.rn = rn, .nruns = nruns, .n = n, .norder = norder, .order = order.view.buf,
                 .bounds = bounds.view.buf, .due = dues.view.buf, .text = text.view.buf,
                 .text_len = (uint64_t)text.view.len, .limit = limit};
    w.rows = PyMem_Malloc(norder ? (size_t)norder * sizeof *w.rows : 1);  /* the places written as JSON */
    w.ends = PyMem_Malloc(((size_t)norder + 1) * 2 * sizeof *w.ends);
    rest = PyBytes_FromStringAndSize(NULL, norder * 8);  /* the places the caller binds (trimmed below) */
    if (!w.rows || !w.ends || !rest) { if (rest) PyErr_NoMemory(); goto done; }
    w.rest = (uint8_t *)PyBytes_AS_STRING(rest);
    Py_BEGIN_ALLOW_THREADS
    kr_rows(&w);
    if (!w.bad) kr_text(&w);
    Py_END_ALLOW_THREADS
    if (w.bad == 1) {
        PyErr_Format(PyExc_ValueError, "order: place %llu names no key", (unsigned long long)w.bad_at);
        goto done;
    }
    if (w.bad) {
        PyErr_Format(PyExc_ValueError, "bounds: row %llu out of order or past the text", (unsigned long long)w.bad_at);
        goto done;
    }
    if (w.nomem) { PyErr_NoMemory(); goto done; }
    if (_PyBytes_Resize(&rest, w.nrest * 8) < 0) goto done;
    chunks = PyList_New(w.nchunks);
    if (!chunks) goto done;
    for (Py_ssize_t c = 0, *tends = w.ends + w.nrows + 1; c < w.nchunks; c++) {
        Py_ssize_t at = c ? tends[c - 1] : 0, first = c ? w.ends[c - 1] : 0;
        PyObject *s = PyUnicode_DecodeUTF8(w.json + at, tends[c] - at, "strict");  /* (a key not UTF-8: an error) */
        PyObject *numbers = s ? PyBytes_FromStringAndSize(w.digits + 2 * KR_DIGITS * first, 2 * KR_DIGITS * (w.ends[c] - first)) : NULL;
        PyObject *chunk = numbers ? PyTuple_Pack(3, PyTuple_GET_ITEM(PyTuple_GET_ITEM(runs, w.rows[first].run), 0), s, numbers) : NULL;
        Py_XDECREF(s);
        Py_XDECREF(numbers);
        if (!chunk) goto done;
        PyList_SET_ITEM(chunks, c, chunk);
    }
    out = PyTuple_Pack(2, chunks, rest);
done:
    buf_release(&order);
    buf_release(&dues);
    buf_release(&text);
    buf_release(&bounds);
    PyMem_RawFree(w.json);
    PyMem_RawFree(w.digits);
    PyMem_Free(w.ends);
    PyMem_Free(w.rows);
    PyMem_Free(rn);
    Py_XDECREF(chunks);
    Py_XDECREF(rest);
    Py_XDECREF(runs);
    return out;
}
