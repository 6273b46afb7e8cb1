/*
 * pull in delayd.storage._batch: which stretches of the commit log to read, a consumer group's
 * new messages as PullRows, the msgpack answer of a pull, the keys of released records, and the
 * receipts of an ack. The Python reference: storage/batch_pull.py.
 */
#include "batch_core.h"

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

PyObject *read_plan(PyObject *self, PyObject *args) {
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
    static const SortKey by_off[] = {{offsetof(Loc, off), 1}};  /* then cmp_loc: by end */
    if (!sorted && sort_rows((uint8_t *)locs, n, sizeof(Loc), by_off, 1, cmp_loc) < 0) goto done;
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

static uint8_t *mp_bin(uint8_t *p, const uint8_t *s, size_t n) {
    if (n < 256) { *p++ = 0xc4; *p++ = (uint8_t)n; }
    else if (n < 65536) { *p++ = 0xc5; *p++ = (uint8_t)(n >> 8); *p++ = (uint8_t)n; }
    else { *p++ = 0xc6; for (int k = 3; k >= 0; k--) *p++ = (uint8_t)(n >> (8 * k)); }
    memcpy(p, s, n);
    return p + n;
}

/* Rows ahead whose record encode_pull asks the cache for (a 1,000-message pull of a burst's
 * records, scattered over 165 MB of log, in process: 790-818 us without, 693-697 us with 8). */
#ifndef PULL_PREFETCH
#define PULL_PREFETCH 8
#endif

/* The fields of a pulled message, in the order of the answer; bit k of `fields` keeps field k. */
enum { F_ID = 1, F_RECEIPT = 2, F_TOPIC = 4, F_KEY = 8, F_TAG = 16, F_HEADERS = 32, F_BODY = 64,
       F_DELIVER_AT = 128, F_DELIVERED_AT = 256, F_ATTEMPT = 512, F_ALL = 1023 };

/* encode_pull(rows, prefix, tokens, reads, fields=1023) -> (answer, problems)
 * The msgpack answer of a pull, {"messages": [...]}, exactly as msgpack.packb would encode the
 * API's message objects (id, receipt, topic, key, tag, headers, body, deliver_at, delivered_at,
 * attempt; only those whose bit is set in `fields`, in that order), built from PullRows and their
 * records in `reads` ((commit-log offset, bytes) sorted by offset) without a Python object per
 * message: headers are copied as stored (checked to be a map of str to str), the body as bin.
 * A record that is not in `reads` or does not check out (CRC, version, UTF-8 of topic/tag/key,
 * headers) is left out and named in `problems` as (row index, outcome) — 0 not read, 1 torn,
 * 2 corrupt, 3 version — whichever fields are asked for. */
PyObject *encode_pull(PyObject *self, PyObject *args) {
    PyObject *rows_o, *prefix_o, *tokens_o, *reads_o;
    PyObject *fields_o = NULL;
    if (!PyArg_ParseTuple(args, "OO!O!O!|O", &rows_o, &PyBytes_Type, &prefix_o, &PyList_Type, &tokens_o, &PyList_Type,
                          &reads_o, &fields_o))
        return NULL;
    unsigned long long fields = F_ALL;
    if (fields_o) {
        if (!PyLong_Check(fields_o)) {
            PyErr_SetString(PyExc_TypeError, "fields must be int");
            return NULL;
        }
        fields = PyLong_AsUnsignedLongLong(fields_o);
        if (PyErr_Occurred() || (fields & ~(unsigned long long)F_ALL)) {
            PyErr_Clear();
            PyErr_SetString(PyExc_ValueError, "fields");
            return NULL;
        }
    }
    uint8_t nfields = (uint8_t)__builtin_popcountll(fields);
    Buf rb;
    if (buf_get(rows_o, &rb, 0, "rows") < 0) return NULL;
    Py_ssize_t nreads = 0, ntok = PyList_GET_SIZE(tokens_o);
    Read *reads = NULL;
    const char **tok = PyMem_Calloc(ntok ? (size_t)ntok : 1, sizeof(char *));
    Py_ssize_t *toklen = PyMem_Calloc(ntok ? (size_t)ntok : 1, sizeof(Py_ssize_t));
    Out o = {0};
    PyObject *problems = NULL, *res = NULL;
    if (!tok || !toklen) { PyErr_NoMemory(); goto done; }
    for (Py_ssize_t k = 0; k < ntok; k++) {
        PyObject *t = PyList_GET_ITEM(tokens_o, k);
        if (!PyUnicode_Check(t) || !(tok[k] = PyUnicode_AsUTF8AndSize(t, &toklen[k]))) {
            PyErr_Clear();
            PyErr_SetString(PyExc_TypeError, "tokens must be str");
            goto done;
        }
    }
    if (!(reads = reads_get(reads_o, &nreads))) goto done;
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
        if (i + PULL_PREFETCH < n) {
            /* A burst's records lie all over the log (released in deliver_at order): ask for the
             * record a few rows ahead now, so its cache and TLB misses overlap this one's work. */
            const uint8_t *ahead = row + PULL_PREFETCH * PROW;
            int64_t aoff = rdi64(ahead);
            uint32_t asize = rd32(ahead + 8);
            Read *ard = find_read(reads, nreads, aoff, asize < RECORD_HEADER ? RECORD_HEADER : asize);
            if (ard) {
                const uint8_t *a = (const uint8_t *)ard->b.view.buf + (aoff - ard->start);
                __builtin_prefetch(a);
                if (asize > 64) __builtin_prefetch(a + 64);
            }
        }
        uint32_t token = rd32(row + 52);
        if (token >= (uint64_t)ntok) { PyErr_SetString(PyExc_IndexError, "token"); goto done; }
        int outcome;
        uint32_t len = 0;
        const uint8_t *r = record_in(reads, nreads, rdi64(row), rd32(row + 8), &outcome, &len);
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
        *q++ = (uint8_t)(0x80 | nfields);  /* a map of at most 10 */
        char small[256];  /* the id and receipt; a longer node id takes the heap */
        char *idbuf = rcl <= sizeof small ? small : PyMem_Malloc(rcl);
        if (!idbuf) { PyErr_NoMemory(); goto done; }
        memcpy(idbuf, prefix, plen);
        memcpy(idbuf + plen, hexseq, sl);
        idbuf[idl] = '.';
        memcpy(idbuf + idl + 1, hexidx, il);
        idbuf[idl + 1 + il] = '.';
        memcpy(idbuf + idl + 2 + il, tok[token], (size_t)toklen[token]);
        if (fields & F_ID) { q = mp_fixstr(q, "id"); q = mp_str(q, idbuf, (Py_ssize_t)idl); }
        if (fields & F_RECEIPT) { q = mp_fixstr(q, "receipt"); q = mp_str(q, idbuf, (Py_ssize_t)rcl); }
        if (idbuf != small) PyMem_Free(idbuf);
        if (fields & F_TOPIC) { q = mp_fixstr(q, "topic"); q = mp_str(q, (const char *)topic, (Py_ssize_t)tl); }
        if (fields & F_KEY) {
            q = mp_fixstr(q, "key");
            if (kl) q = mp_str(q, (const char *)key, (Py_ssize_t)kl); else *q++ = 0xc0;
        }
        if (fields & F_TAG) {
            q = mp_fixstr(q, "tag");
            if (gl) q = mp_str(q, (const char *)tag, (Py_ssize_t)gl); else *q++ = 0xc0;
        }
        if (fields & F_HEADERS) {
            q = mp_fixstr(q, "headers");
            if (hl) { memcpy(q, hdr, hl); q += hl; } else *q++ = 0x80;
        }
        if (fields & F_BODY) { q = mp_fixstr(q, "body"); q = mp_bin(q, body, bl); }
        if (fields & F_DELIVER_AT) { q = mp_fixstr(q, "deliver_at"); q = mp_uint_or_int(q, rdi64(r + 20)); }
        if (fields & F_DELIVERED_AT) { q = mp_fixstr(q, "delivered_at"); q = mp_uint_or_int(q, rdi64(row + 24)); }
        if (fields & F_ATTEMPT) { q = mp_fixstr(q, "attempt"); q = mp_uint_or_int(q, rd32(row + 48)); }
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
    reads_release(reads, nreads);
    PyMem_Free(tok);
    PyMem_Free(toklen);
    out_free(&o);
    Py_XDECREF(problems);
    buf_release(&rb);
    return res;
}

/* record_keys(locs, reads, stride=12) -> (keys, seqs, problems): the key (packed: Keys, None where
 * the record has none or is a problem) and the seq (u64; 0 for a problem) of the record located at
 * the start of each row of `locs` ((offset i64, size u32), rows of `stride` bytes), from `reads`
 * as encode_pull takes them; problems as encode_pull names them (0 not read, torn, corrupt,
 * version), UTF-8 checked for topic, tag and key. No object a record: dequeue-put marks a burst of
 * keyed messages delivered in the key index with it. */
typedef struct {
    const uint8_t *key;
    uint32_t kl;
    uint64_t seq;
} KeyAt;

PyObject *record_keys(PyObject *self, PyObject *args) {
    PyObject *locs_o, *reads_o;
    Py_ssize_t stride = 12;
    if (!PyArg_ParseTuple(args, "OO!|n", &locs_o, &PyList_Type, &reads_o, &stride)) return NULL;
    Buf lb;
    if (buf_get(locs_o, &lb, 0, "locs") < 0) return NULL;
    Py_ssize_t nreads = 0, n = 0;
    KeyAt *at = NULL;
    Keys *keys = NULL;
    PyObject *problems = NULL, *seqs = NULL, *res = NULL;
    Read *reads = reads_get(reads_o, &nreads);
    if (!reads) goto done;
    if (stride < 12 || lb.view.len % stride) { PyErr_SetString(PyExc_ValueError, "locs/stride"); goto done; }
    n = lb.view.len / stride;
    at = PyMem_Calloc(n ? (size_t)n : 1, sizeof(KeyAt));
    problems = PyList_New(0);
    seqs = PyBytes_FromStringAndSize(NULL, 8 * n);
    if (!at || !problems || !seqs) { if (!at) PyErr_NoMemory(); goto done; }
    uint8_t *sq = (uint8_t *)PyBytes_AS_STRING(seqs);
    size_t text = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        const uint8_t *row = (const uint8_t *)lb.view.buf + i * stride;
        int outcome;
        uint32_t len = 0;
        const uint8_t *r = record_in(reads, nreads, rdi64(row), rd32(row + 8), &outcome, &len);
        if (r && !outcome) {
            size_t tl = r[38], gl = r[39], kl = rd16(r + 40);
            const uint8_t *topic = r + RECORD_HEADER, *tag = topic + tl, *key = tag + gl;
            if (!utf8_ok(topic, tl) || !utf8_ok(tag, gl) || !utf8_ok(key, kl)) outcome = SCAN_CORRUPT;
            else at[i] = (KeyAt){.key = kl ? key : NULL, .kl = (uint32_t)kl, .seq = rd64(r + 12)};
        }
        if (!r || outcome) {
            wr64(sq + 8 * i, 0);
            PyObject *pr = Py_BuildValue("(ni)", i, r ? outcome : 0);
            if (!pr || PyList_Append(problems, pr) < 0) { Py_XDECREF(pr); goto done; }
            Py_DECREF(pr);
            continue;
        }
        wr64(sq + 8 * i, at[i].seq);
        text += at[i].kl;
    }
    keys = keys_new(n, text);
    if (!keys) goto done;
    uint32_t place = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (!at[i].key) continue;
        if (keys_set(keys, i, (const char *)at[i].key, at[i].kl, place) < 0) goto done;
        place += at[i].kl;
    }
    res = PyTuple_Pack(3, (PyObject *)keys, seqs, problems);
done:
    reads_release(reads, nreads);
    PyMem_Free(at);
    Py_XDECREF(keys);
    Py_XDECREF(seqs);
    Py_XDECREF(problems);
    buf_release(&lb);
    return res;
}

/* Receipts are `{id}.{index hex}.{token}`. In canonical form (lowercase hex, no sign, no leading
 * zeros, 1 to 16 digits, a token without '.') a receipt gives its ready-queue index and where its
 * token starts: 1; else 0, and the caller's reference parser (Groups.parse_receipt) decides it. */
static int receipt_canonical(const char *s, Py_ssize_t len, uint64_t *index, Py_ssize_t *token_at) {
    Py_ssize_t d2 = -1, d1 = -1;
    for (Py_ssize_t k = len - 1; k >= 0; k--) {
        if (s[k] == '.') { if (d2 < 0) d2 = k; else { d1 = k; break; } }
    }
    if (d1 < 0) return 0;
    Py_ssize_t hl = d2 - d1 - 1;
    if (hl < 1 || hl > 16 || (hl > 1 && s[d1 + 1] == '0')) return 0;
    uint64_t v = 0;
    for (Py_ssize_t k = d1 + 1; k < d2; k++) {
        char ch = s[k];
        int dv = ch >= '0' && ch <= '9' ? ch - '0' : ch >= 'a' && ch <= 'f' ? ch - 'a' + 10 : -1;
        if (dv < 0) return 0;
        v = (v << 4) | (uint64_t)dv;
    }
    *index = v;
    *token_at = d2 + 1;
    return 1;
}

/* The distinct tokens of a batch of receipts, numbered in order of first appearance. A batch
 * usually has one (the pull's): a token equal to the last one found costs a memcmp, no str. */
typedef struct {
    PyObject *tokens;  /* list of str */
    PyObject *seen;    /* str -> its number */
    const char *last;  /* the last token found (in the caller's buffer), its length and number */
    Py_ssize_t last_len, last_k;
} Tokens;

/* The number of the token s[0:len] (valid UTF-8), -1 with an exception set. */
static Py_ssize_t token_number(Tokens *t, const char *s, Py_ssize_t len) {
    if (t->last && t->last_len == len && memcmp(t->last, s, (size_t)len) == 0) return t->last_k;
    PyObject *token = PyUnicode_FromStringAndSize(s, len);
    if (!token) return -1;
    Py_ssize_t k;
    PyObject *known = PyDict_GetItemWithError(t->seen, token);
    if (known) {
        k = PyLong_AsSsize_t(known);
    } else {
        if (PyErr_Occurred()) { Py_DECREF(token); return -1; }
        k = PyList_GET_SIZE(t->tokens);
        PyObject *kk = PyLong_FromSsize_t(k);
        if (!kk || PyDict_SetItem(t->seen, token, kk) < 0 || PyList_Append(t->tokens, token) < 0) {
            Py_XDECREF(kk); Py_DECREF(token); return -1;
        }
        Py_DECREF(kk);
    }
    Py_DECREF(token);
    t->last = s;
    t->last_len = len;
    t->last_k = k;
    return k;
}

/* The answer of both parsers for n receipts: (indexes, token_ids, tokens); `at(i, &len)` gives
 * receipt i's UTF-8 (NULL: not a str, or not UTF-8: not canonical). */
typedef const char *(*ReceiptAt)(void *ctx, Py_ssize_t i, Py_ssize_t *len);

static PyObject *receipts_parsed(Py_ssize_t n, ReceiptAt at, void *ctx) {
    PyObject *idx = PyBytes_FromStringAndSize(NULL, n * 8), *tid = PyBytes_FromStringAndSize(NULL, n * 4);
    Tokens t = {.tokens = PyList_New(0), .seen = PyDict_New()};
    PyObject *res = NULL;
    if (!idx || !tid || !t.tokens || !t.seen) goto done;
    uint8_t *ip = (uint8_t *)PyBytes_AS_STRING(idx), *tp = (uint8_t *)PyBytes_AS_STRING(tid);
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_ssize_t len, token_at;
        uint64_t v;
        const char *s = at(ctx, i, &len);
        wr64(ip + 8 * i, 0);
        wr32(tp + 4 * i, 0xFFFFFFFFu);
        if (!s || !receipt_canonical(s, len, &v, &token_at)) continue;
        Py_ssize_t k = token_number(&t, s + token_at, len - token_at);
        if (k < 0) goto done;
        wr64(ip + 8 * i, v);
        wr32(tp + 4 * i, (uint32_t)k);
    }
    res = PyTuple_Pack(3, idx, tid, t.tokens);
done:
    Py_XDECREF(idx);
    Py_XDECREF(tid);
    Py_XDECREF(t.tokens);
    Py_XDECREF(t.seen);
    return res;
}

static const char *list_receipt(void *ctx, Py_ssize_t i, Py_ssize_t *len) {
    PyObject *r = PyList_GET_ITEM((PyObject *)ctx, i);
    if (!PyUnicode_CheckExact(r)) return NULL;
    const char *s = PyUnicode_AsUTF8AndSize(r, len);
    if (!s) PyErr_Clear();  /* a lone surrogate: not UTF-8 */
    return s;
}

/* parse_receipts(receipts) -> (indexes, token_ids, tokens)
 * For each receipt of the list: its ready-queue index (u64) and the number of its token in
 * `tokens` (the distinct tokens, u32); a receipt not in canonical form (receipt_canonical), or
 * not a str, gets index 0 and token id 0xFFFFFFFF. */
PyObject *parse_receipts(PyObject *self, PyObject *args) {
    PyObject *list;
    if (!PyArg_ParseTuple(args, "O!", &PyList_Type, &list)) return NULL;
    return receipts_parsed(PyList_GET_SIZE(list), list_receipt, list);
}

typedef struct {
    const uint8_t *s;
    int64_t *start;  /* each receipt's payload */
    size_t *len;
} RawReceipts;

static const char *raw_receipt(void *ctx, Py_ssize_t i, Py_ssize_t *len) {
    RawReceipts *r = ctx;
    *len = (Py_ssize_t)r->len[i];
    return (const char *)r->s + r->start[i];
}

/* parse_receipts_raw(body, max_n) -> (indexes, token_ids, tokens) | None
 * parse_receipts of an ack's msgpack body read in place: a map of one entry, the str "receipts",
 * to an array of at most max_n str (any of their msgpack forms, UTF-8), and nothing after it. None
 * for any other body (the caller decodes it and answers what is wrong with it). */
PyObject *parse_receipts_raw(PyObject *self, PyObject *args) {
    PyObject *body;
    Py_ssize_t max_n;
    if (!PyArg_ParseTuple(args, "On", &body, &max_n)) return NULL;
    Buf b;
    if (buf_get(body, &b, 0, "body") < 0) return NULL;
    Mp m = {b.view.buf, (const uint8_t *)b.view.buf + b.view.len};
    RawReceipts r = {.s = b.view.buf, .start = NULL, .len = NULL};
    PyObject *res = NULL;
    uint64_t count;
    /* each str takes a byte at least */
    if (!mp_envelope(&m, "receipts", &count) || max_n < 0 || count > (uint64_t)max_n || count > (uint64_t)(m.end - m.p)) {
        res = Py_NewRef(Py_None);
        goto done;
    }
    r.start = PyMem_Malloc((size_t)(count ? count : 1) * sizeof(int64_t));
    r.len = PyMem_Malloc((size_t)(count ? count : 1) * sizeof(size_t));
    if (!r.start || !r.len) { PyErr_NoMemory(); goto done; }
    for (uint64_t i = 0; i < count; i++) {
        MpVal v;  /* a str's payload is checked as UTF-8 by mp_read */
        if (!mp_read(&m, &v) || v.kind != MK_STR) { res = Py_NewRef(Py_None); goto done; }
        r.start[i] = v.s - r.s;
        r.len[i] = (size_t)v.n;
    }
    res = m.p == m.end ? receipts_parsed((Py_ssize_t)count, raw_receipt, &r) : Py_NewRef(Py_None);
done:
    PyMem_Free(r.start);
    PyMem_Free(r.len);
    buf_release(&b);
    return res;
}

/* take_rows(units, first_index, exclude, wanted, max_n, attempt, token) -> (rows, consumed, skipped)
 * A consumer group handing out new messages from its cursor (Groups.take): the ready units at
 * indexes first_index.. in `units` (40 bytes each), skipping those in `exclude` (sorted u64
 * indexes: acked or leased already) and, when `wanted` (u32 tag hashes) is not None, those whose
 * tag is not wanted (their indexes come back in `skipped`: they count as consumed by the group);
 * at most max_n PullRows with the given attempt and token number. `consumed`: units examined,
 * the cursor's advance. */
PyObject *take_rows(PyObject *self, PyObject *args) {
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
