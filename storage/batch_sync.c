/*
 * Syncer: fsyncs lists of file descriptors in a thread of its own that never takes the GIL
 * (the group commit's fsyncs, storage/fsyncer.py). The Python reference is
 * storage.fsyncer.Syncer, with the same interface and results:
 *
 *     s = Syncer()          # starts the thread
 *     s.fileno()            # readable once a job has finished (an event loop watches it)
 *     s.submit([fd, ...])   # -> job id; the job owns the fds: fsynced in order, the first
 *                           #    failure ends the fsyncs, and every fd is closed
 *     s.done()              # -> [(job id, errno or 0), ...] of the jobs finished, in order
 *     s.close()             # finishes the jobs submitted, stops the thread; idempotent
 *
 * Through a worker thread of Python's, every fsync cost the event loop's thread a wake-up of
 * that worker and two hand-overs of the GIL (70-80 µs of its CPU on 2 cores, BENCHMARKS.md); here
 * a submit is a lock and a signal, and the loop learns of the end from a pipe it polls anyway.
 */

#include "batch_core.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <unistd.h>

typedef struct Job {
    struct Job *next;
    long long id;
    int err;
    Py_ssize_t nfds;
    int fds[];
} Job;

typedef struct {
    PyObject_HEAD
    pthread_mutex_t mu;
    pthread_cond_t cv;
    pthread_t thread;
    Job *todo, *todo_tail;  /* submitted, not started: a FIFO */
    Job *done, *done_tail;  /* finished, not yet handed out */
    int rfd, wfd;           /* the pipe: a byte written per finished job */
    int started, stopping, closed;
    long long next_id;
} Syncer;

static void *syncer_main(void *arg) {
    Syncer *s = arg;
    pthread_mutex_lock(&s->mu);
    for (;;) {
        while (!s->todo && !s->stopping) pthread_cond_wait(&s->cv, &s->mu);
        Job *j = s->todo;
        if (!j) break;  /* stopping, and nothing left */
        s->todo = j->next;
        if (!s->todo) s->todo_tail = NULL;
        pthread_mutex_unlock(&s->mu);
        j->err = 0;
        for (Py_ssize_t i = 0; i < j->nfds; i++) {
            if (!j->err && fsync(j->fds[i]) != 0) j->err = errno ? errno : EIO;
        }
        for (Py_ssize_t i = 0; i < j->nfds; i++) close(j->fds[i]);
        j->next = NULL;
        pthread_mutex_lock(&s->mu);
        if (s->done_tail) s->done_tail->next = j; else s->done = j;
        s->done_tail = j;
        pthread_mutex_unlock(&s->mu);
        char one = 1;
        ssize_t w;
        do { w = write(s->wfd, &one, 1); } while (w < 0 && errno == EINTR);
        /* EAGAIN: the pipe is full of unread bytes, and one is enough to wake the reader */
        pthread_mutex_lock(&s->mu);
    }
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

static int set_flags(int fd) {
    int fl = fcntl(fd, F_GETFL);
    if (fl < 0 || fcntl(fd, F_SETFL, fl | O_NONBLOCK) < 0) return -1;
    int fdfl = fcntl(fd, F_GETFD);
    if (fdfl < 0 || fcntl(fd, F_SETFD, fdfl | FD_CLOEXEC) < 0) return -1;
    return 0;
}

static int Syncer_init(Syncer *s, PyObject *args, PyObject *kw) {
    if (!PyArg_ParseTuple(args, ":Syncer")) return -1;
    if (s->started || s->closed) {
        PyErr_SetString(PyExc_RuntimeError, "Syncer: already initialised");
        return -1;
    }
    int p[2];
    if (pipe(p) != 0) { PyErr_SetFromErrno(PyExc_OSError); return -1; }
    if (set_flags(p[0]) < 0 || set_flags(p[1]) < 0) {
        PyErr_SetFromErrno(PyExc_OSError);
        close(p[0]);
        close(p[1]);
        return -1;
    }
    s->rfd = p[0];
    s->wfd = p[1];
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, NULL);
    int rc = pthread_create(&s->thread, NULL, syncer_main, s);
    if (rc != 0) {
        errno = rc;
        PyErr_SetFromErrno(PyExc_OSError);
        pthread_mutex_destroy(&s->mu);
        pthread_cond_destroy(&s->cv);
        close(p[0]);
        close(p[1]);
        s->rfd = s->wfd = -1;
        return -1;
    }
    s->started = 1;
    return 0;
}

static PyObject *Syncer_new(PyTypeObject *type, PyObject *args, PyObject *kw) {
    Syncer *s = (Syncer *)type->tp_alloc(type, 0);
    if (s) s->rfd = s->wfd = -1;
    return (PyObject *)s;
}

static void free_jobs(Job *j) {
    while (j) {
        Job *next = j->next;
        PyMem_RawFree(j);
        j = next;
    }
}

/* Stop the thread once it has finished every job submitted; the jobs not handed out by done()
 * are dropped (their fds are closed all the same). */
static void syncer_stop(Syncer *s) {
    /* stopping is set with the GIL held: a close() from a second thread, while the first waits
     * for the thread without the GIL, returns at once instead of joining it twice */
    if (!s->started || s->closed || s->stopping) return;
    pthread_mutex_lock(&s->mu);
    s->stopping = 1;
    pthread_cond_signal(&s->cv);
    pthread_mutex_unlock(&s->mu);
    Py_BEGIN_ALLOW_THREADS
    pthread_join(s->thread, NULL);
    Py_END_ALLOW_THREADS
    s->closed = 1;
    free_jobs(s->done);
    s->done = s->done_tail = NULL;
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->cv);
    close(s->rfd);
    close(s->wfd);
    s->rfd = s->wfd = -1;
}

static void Syncer_dealloc(Syncer *s) {
    syncer_stop(s);
    Py_TYPE(s)->tp_free((PyObject *)s);
}

static int usable(Syncer *s) {
    if (!s->started || s->closed) {
        PyErr_SetString(PyExc_ValueError, "Syncer: closed");
        return 0;
    }
    return 1;
}

static PyObject *Syncer_fileno(Syncer *s, PyObject *unused) {
    if (!usable(s)) return NULL;
    return PyLong_FromLong(s->rfd);
}

/* submit(fds) -> job id. fds: a list or tuple of ints >= 0. Nothing is taken when it raises. */
static PyObject *Syncer_submit(Syncer *s, PyObject *arg) {
    if (!usable(s)) return NULL;
    if (!PyList_Check(arg) && !PyTuple_Check(arg)) {
        PyErr_SetString(PyExc_TypeError, "fds: expected a list or a tuple of ints");
        return NULL;
    }
    Py_ssize_t n = PySequence_Fast_GET_SIZE(arg);
    if (n > (PY_SSIZE_T_MAX - (Py_ssize_t)sizeof(Job)) / (Py_ssize_t)sizeof(int)) return PyErr_NoMemory();
    Job *j = PyMem_RawMalloc(sizeof(Job) + (size_t)n * sizeof(int));
    if (!j) return PyErr_NoMemory();
    PyObject **items = PySequence_Fast_ITEMS(arg);
    for (Py_ssize_t i = 0; i < n; i++) {
        if (!PyLong_Check(items[i])) {
            PyMem_RawFree(j);
            PyErr_Format(PyExc_TypeError, "fds[%zd]: expected an int", i);
            return NULL;
        }
        int overflow = 0;
        long long v = PyLong_AsLongLongAndOverflow(items[i], &overflow);
        if (v == -1 && PyErr_Occurred()) { PyMem_RawFree(j); return NULL; }
        if (overflow || v < 0 || v > INT_MAX) {
            PyMem_RawFree(j);
            PyErr_Format(PyExc_ValueError, "fds[%zd]: %R is not a file descriptor", i, items[i]);
            return NULL;
        }
        j->fds[i] = (int)v;
    }
    j->nfds = n;
    j->next = NULL;
    j->err = 0;
    pthread_mutex_lock(&s->mu);
    if (s->stopping) {  /* close() under way in another thread: the thread may be gone */
        pthread_mutex_unlock(&s->mu);
        PyMem_RawFree(j);
        PyErr_SetString(PyExc_ValueError, "Syncer: closed");
        return NULL;
    }
    j->id = s->next_id++;
    if (s->todo_tail) s->todo_tail->next = j; else s->todo = j;
    s->todo_tail = j;
    pthread_cond_signal(&s->cv);
    pthread_mutex_unlock(&s->mu);
    return PyLong_FromLongLong(j->id);
}

static PyObject *Syncer_done(Syncer *s, PyObject *unused) {
    if (!usable(s)) return NULL;
    char buf[256];
    while (read(s->rfd, buf, sizeof buf) > 0) {}  /* empty the pipe: EAGAIN once it is */
    pthread_mutex_lock(&s->mu);
    Job *j = s->done;
    s->done = s->done_tail = NULL;
    pthread_mutex_unlock(&s->mu);
    PyObject *out = PyList_New(0);
    if (!out) { free_jobs(j); return NULL; }
    for (Job *k = j; k; k = k->next) {
        PyObject *t = Py_BuildValue("(Li)", k->id, k->err);
        if (!t || PyList_Append(out, t) < 0) {
            Py_XDECREF(t);
            Py_DECREF(out);
            free_jobs(j);
            return NULL;
        }
        Py_DECREF(t);
    }
    free_jobs(j);
    return out;
}

static PyObject *Syncer_close(Syncer *s, PyObject *unused) {
    syncer_stop(s);
    Py_RETURN_NONE;
}

static PyMethodDef Syncer_methods[] = {
    {"fileno", (PyCFunction)Syncer_fileno, METH_NOARGS, "a descriptor readable once a job has finished"},
    {"submit", (PyCFunction)Syncer_submit, METH_O, "fsync and close these fds in the thread; the job's id"},
    {"done", (PyCFunction)Syncer_done, METH_NOARGS, "[(job id, errno or 0)] of the jobs finished since the last call"},
    {"close", (PyCFunction)Syncer_close, METH_NOARGS, "finish the jobs submitted and stop the thread"},
    {NULL, NULL, 0, NULL},
};

PyTypeObject SyncerType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "delayd.storage._batch.Syncer",
    .tp_basicsize = sizeof(Syncer),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Syncer(): fsyncs lists of fds in a thread that never takes the GIL",
    .tp_new = Syncer_new,
    .tp_init = (initproc)Syncer_init,
    .tp_dealloc = (destructor)Syncer_dealloc,
    .tp_methods = Syncer_methods,
};
