/*
 * delayd.storage._batch — the compiled batch core.
 *
 * Every function here takes a whole batch and returns a whole batch: the per-message loops of
 * produce, enqueue-put, dequeue-get, dequeue-get-message and dequeue-put, out of Python. The
 * row layouts, the record and unit byte tables and the exact semantics are specified by the pure
 * Python reference in storage/batch.py (the pull's in storage/batch_pull.py);
 * tests/storage/test_batch_differential.py checks, with hypothesis, that both give the same bytes
 * for the same input, damaged input included.
 *
 * Rules kept throughout: every read is bounds-checked against the buffer it comes from (damaged
 * input is an error, never a crash or an out-of-bounds read); nothing here allocates per message
 * on the Python heap except where a Python object is the result; no function keeps a pointer
 * into a Python buffer after it returns.
 *
 * The code is split by pipeline stage: batch_produce.c (produce), batch_timer.c (enqueue-get,
 * enqueue-put, dequeue-get, dequeue-get-message), batch_release.c (dequeue-put and the batch
 * counters), batch_pull.c (pull and ack), batch_keyseq.c (a batch's keys, packed), batch_keys.c
 * (the key filter, the key index's overlay), batch_keyrows.c (the key index's write order and
 * rows), batch_sync.c (the group commit's fsync thread), batch_recovery.c (recovery's loops)
 * and batch_util.c (CRC, buffers, maps, spans, UTF-8),
 * sharing batch_core.h. This file is the module table and its initialisation, and PyInit__batch
 * is the one symbol the shared object exports.
 */

#include "batch_core.h"

/* ------------------------------------------------------------------------------------------ */

static PyMethodDef methods[] = {
    {"crc32", py_crc32, METH_VARARGS, "zlib.crc32"},
    {"crc_folds", py_crc_folds, METH_VARARGS, "whether crc32 uses PCLMULQDQ (on: turn it on or off)"},
    {"encode_produce", encode_produce, METH_VARARGS, "validate and encode a produce batch"},
    {"encode_produce_raw", encode_produce_raw, METH_VARARGS, "validate and encode a msgpack produce body"},
    {"produced_rows", produced_rows, METH_VARARGS, "message-table entries and MessageRows of appended records"},
    {"record_offsets", record_offsets, METH_VARARGS, "the offsets of records written back to back"},
    {"scan_rows", scan_rows, METH_VARARGS, "decode commit-log records into MessageRows"},
    {"scan_starts", scan_starts, METH_VARARGS, "commitlog.scan_buffer's loop"},
    {"index_rows", index_rows, METH_VARARGS, "enqueue-put for a batch of MessageRows"},
    {"put_slots", put_slots, METH_VARARGS, "write wheel slots"},
    {"add_counts", add_counts, METH_VARARGS, "add one to the counts at these slot indexes"},
    {"classify", classify, METH_VARARGS, "dequeue-get-message: which units are live"},
    {"dues", dues, METH_VARARGS, "dequeue-get-message: DueRows from records"},
    {"roll_copies", roll_copies, METH_VARARGS, "dequeue-get-message: far messages' roll copies"},
    {"release_rows", release_rows, METH_VARARGS, "dequeue-put: ready units per topic"},
    {"set_states", set_states, METH_VARARGS, "set message-table states"},
    {"seq_runs", seq_runs, METH_VARARGS, "runs of seqs for batched message-table reads"},
    {"restore_states", restore_states, METH_VARARGS, "recovery: message-table entries from MessageRows"},
    {"unit_prevs", unit_prevs, METH_VARARGS, "recovery: the prev_pos of TimerLog units"},
    {"strip_slots", strip_slots, METH_VARARGS, "recovery: unlink units past a position from the wheel"},
    {"message_runs", message_runs, METH_O, "recovery: the runs of MESSAGE rows a produce appended"},
    {"census", census, METH_O, "recovery: MessageRows counted by type and topic hash"},
    {"bad_slots", bad_slots, METH_VARARGS, "recovery: the wheel slots whose fields cannot be right"},
    {"encode_pull", encode_pull, METH_VARARGS, "the msgpack answer of a pull"},
    {"record_keys", record_keys, METH_VARARGS, "the keys and seqs of records, packed"},
    {"parse_receipts", parse_receipts, METH_VARARGS, "indexes and tokens of receipts"},
    {"parse_receipts_raw", parse_receipts_raw, METH_VARARGS, "parse_receipts of an ack's msgpack body"},
    {"lateness", lateness, METH_VARARGS, "now - the due time of rows"},
    {"bucket_counts", bucket_counts, METH_VARARGS, "histogram buckets of a batch of values"},
    {"unit_bounds", unit_bounds, METH_O, "lowest commit offset and latest release of ready units"},
    {"tally", tally, METH_VARARGS, "count the values of an i64 field of rows"},
    {"take_rows", take_rows, METH_VARARGS, "a group's new messages from its cursor, as PullRows"},
    {"encode_produced", encode_produced, METH_VARARGS, "the answer of a produce"},
    {"read_plan", read_plan, METH_VARARGS, "the stretches of the log to read for records"},
    {"filter_add", filter_add, METH_VARARGS, "add keys of a topic to the key filter"},
    {"filter_add_json", filter_add_json, METH_VARARGS, "add the keys of a JSON array of strings to the key filter"},
    {"filter_maybe", filter_maybe, METH_VARARGS, "the keys of a topic the key filter may hold"},
    {"filter_claim", filter_claim, METH_VARARGS, "filter_maybe and filter_add in one pass"},
    {"overlay_put", overlay_put, METH_VARARGS, "keys of an entry into a key index overlay table"},
    {"overlay_find", overlay_find, METH_VARARGS, "the slots of an overlay table holding keys' pair hashes"},
    {"key_order", key_order, METH_VARARGS, "the order in which the key index writes the keys of runs"},
    {"key_rows_json", key_rows_json, METH_VARARGS, "the key index's rows of runs as JSON text for json_each"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_batch", "delayd's compiled batch core", -1, methods};

PyMODINIT_FUNC PyInit__batch(void) {
    crc_init();
    if (batch_produce_init() < 0) return NULL;
    if (PyType_Ready(&WalkerType) < 0 || PyType_Ready(&DueHeapType) < 0 || PyType_Ready(&SyncerType) < 0 ||
        PyType_Ready(&KeysType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (!m) return NULL;
    Py_INCREF(&WalkerType);
    Py_INCREF(&DueHeapType);
    Py_INCREF(&SyncerType);
    Py_INCREF(&KeysType);
    if (PyModule_AddObject(m, "Walker", (PyObject *)&WalkerType) < 0 ||
        PyModule_AddObject(m, "DueHeap", (PyObject *)&DueHeapType) < 0 ||
        PyModule_AddObject(m, "Syncer", (PyObject *)&SyncerType) < 0 ||
        PyModule_AddObject(m, "Keys", (PyObject *)&KeysType) < 0 ||
        PyModule_AddIntConstant(m, "MROW", MROW) < 0 || PyModule_AddIntConstant(m, "DROW", DROW) < 0 ||
        PyModule_AddIntConstant(m, "UROW", UROW) < 0 || PyModule_AddIntConstant(m, "PROW", PROW) < 0 || PyModule_AddIntConstant(m, "RECORD_HEADER", RECORD_HEADER) < 0 ||
        PyModule_AddIntConstant(m, "UNIT_SIZE", UNIT_SIZE) < 0 || PyModule_AddIntConstant(m, "ENTRY_SIZE", ENTRY_SIZE) < 0 ||
        PyModule_AddIntConstant(m, "READY_UNIT", READY_UNIT) < 0 || PyModule_AddIntConstant(m, "RECORD_VERSION", RECORD_VERSION) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
