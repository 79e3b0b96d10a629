/* The hot path of a repeated small MPI all-reduce, compiled: an optional speed-up of
   hot_path.py's Bound.quick, which does the same in Python wherever this does not build or load.

   A Hot object is bound once to a persistent in-place all-reduce: its buffer (the payload,
   then this rank's check trailer), the reduced trailer every rank expects, and the request.
   run(x, out) copies x in, writes the trailer, starts the request, tests it (spinning, then
   yielding the core between tests, the GIL released) and, once complete, compares the
   reduced trailer and copies the result into out; run_at(x_address, out_address) does the
   same between the addresses of another library's arrays (PyTorch CPU tensors). MPI's
   MPI_Start and MPI_Test come as function pointers from the library mpi4py loaded and the
   request as the address of its handle, so nothing here depends on an MPI implementation's
   headers or ABI. */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <sched.h>
#include <string.h>
#include <time.h>

typedef int (*start_fn)(void *request);
typedef int (*test_fn)(void *request, int *flag, void *status);

enum { DONE = 0, PENDING = 1, MISMATCH = 2, REFUSED = 3 };

typedef struct {
    PyObject_HEAD
    char *head;           /* the payload's place in the request's buffer */
    Py_ssize_t nbytes;
    char *tail;           /* this rank's trailer's place, rewritten before every start */
    char *mine;
    Py_ssize_t tail_bytes;
    char *trailer;        /* the reduced trailer, compared with what every rank expects */
    char *expected;
    Py_ssize_t trailer_bytes;
    void *request;        /* the address of the request's handle */
    start_fn start;
    test_fn test;
    double spin, hold;    /* seconds: spin, then yield between tests, then hand over */
    char status[256];     /* room for any MPI_Status */
    PyObject *keep;       /* what owns the memory behind the pointers */
    unsigned long long ran; /* runs completed here (tests tell the compiled path ran) */
} Hot;

static double seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int Hot_init(Hot *self, PyObject *args, PyObject *kwds) {
    unsigned long long head, tail, mine, trailer, expected, request, start, test;
    PyObject *keep;
    (void)kwds;
    if (!PyArg_ParseTuple(args, "KnKKnKKnKKKddO", &head, &self->nbytes, &tail, &mine,
                          &self->tail_bytes, &trailer, &expected, &self->trailer_bytes,
                          &request, &start, &test, &self->spin, &self->hold, &keep))
        return -1;
    self->head = (char *)(uintptr_t)head;
    self->tail = (char *)(uintptr_t)tail;
    self->mine = (char *)(uintptr_t)mine;
    self->trailer = (char *)(uintptr_t)trailer;
    self->expected = (char *)(uintptr_t)expected;
    self->request = (void *)(uintptr_t)request;
    self->start = (start_fn)(uintptr_t)start;
    self->test = (test_fn)(uintptr_t)test;
    Py_INCREF(keep);
    Py_XSETREF(self->keep, keep);
    return 0;
}

static void Hot_dealloc(Hot *self) {
    Py_XDECREF(self->keep);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* One run from src (nbytes): copy it in, write the trailer, start, test (spinning, then
   yielding the core between tests, the GIL released). Returns DONE with the result in the
   request's buffer (not yet copied out), PENDING, MISMATCH or MPI's error code, negated. */
static long start_and_test(Hot *self, const char *src) {
    int rc, flag = 0;
    memcpy(self->head, src, (size_t)self->nbytes);
    memcpy(self->tail, self->mine, (size_t)self->tail_bytes);
    /* MPI's calls run without the GIL, the first ones too: one that never returns (MPICH's
       MPI_Test may not, once a peer died) must leave the hang guard's thread able to run */
    Py_BEGIN_ALLOW_THREADS
    rc = self->start(self->request);
    if (!rc)
        rc = self->test(self->request, &flag, self->status);
    if (!rc && !flag) {
        double now = seconds(), spin = now + self->spin, hold = now + self->hold;
        while (!rc && !flag) {
            now = seconds();
            if (now > spin) {
                if (now > hold)
                    break;
                sched_yield();
            }
            rc = self->test(self->request, &flag, self->status);
        }
    }
    Py_END_ALLOW_THREADS
    if (rc)
        return -(long)rc;
    if (!flag)
        return PENDING;
    if (memcmp(self->trailer, self->expected, (size_t)self->trailer_bytes))
        return MISMATCH;
    return DONE;
}

/* run(x, out) -> 0: done, the result in out; 1: started and still running after the hold
   (the caller tests the request from now on); 2: done, but the reduced trailer differs;
   3: refused, nothing started (x or out not C-contiguous, out read-only, a size differs);
   a negative number: MPI's error code, negated. */
static PyObject *Hot_run(Hot *self, PyObject *const *args, Py_ssize_t nargs) {
    Py_buffer x, out;
    long code;
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "run(x, out) takes two arrays");
        return NULL;
    }
    if (PyObject_GetBuffer(args[0], &x, PyBUF_C_CONTIGUOUS) < 0) {
        PyErr_Clear();
        return PyLong_FromLong(REFUSED);
    }
    if (PyObject_GetBuffer(args[1], &out, PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE) < 0) {
        PyErr_Clear();
        PyBuffer_Release(&x);
        return PyLong_FromLong(REFUSED);
    }
    if (x.len != self->nbytes || out.len != self->nbytes) {
        PyBuffer_Release(&x);
        PyBuffer_Release(&out);
        return PyLong_FromLong(REFUSED);
    }
    code = start_and_test(self, (const char *)x.buf);
    PyBuffer_Release(&x);
    if (code == DONE) {
        memcpy(out.buf, self->head, (size_t)self->nbytes);
        self->ran++;
    }
    PyBuffer_Release(&out);
    return PyLong_FromLong(code);
}

/* run_at(x_address, out_address): run() between the addresses of another library's arrays
   (PyTorch CPU tensors: no buffer protocol), which the caller has checked are C-contiguous,
   writable where written and nbytes long, and keeps alive. The same codes; never refused. */
static PyObject *Hot_run_at(Hot *self, PyObject *const *args, Py_ssize_t nargs) {
    unsigned long long src, dst;
    long code;
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "run_at(x_address, out_address) takes two addresses");
        return NULL;
    }
    src = PyLong_AsUnsignedLongLong(args[0]);
    dst = PyLong_AsUnsignedLongLong(args[1]);
    if (PyErr_Occurred())
        return NULL;
    code = start_and_test(self, (const char *)(uintptr_t)src);
    if (code == DONE) {
        memcpy((char *)(uintptr_t)dst, self->head, (size_t)self->nbytes);
        self->ran++;
    }
    return PyLong_FromLong(code);
}

static PyMethodDef Hot_methods[] = {
    {"run", (PyCFunction)(void (*)(void))Hot_run, METH_FASTCALL,
     "run(x, out): one all-reduce of x into out (see the module's source for the codes)"},
    {"run_at", (PyCFunction)(void (*)(void))Hot_run_at, METH_FASTCALL,
     "run_at(x_address, out_address): run() between two arrays' addresses"},
    {NULL, NULL, 0, NULL},
};

static PyMemberDef Hot_members[] = {
    {"ran", T_ULONGLONG, offsetof(Hot, ran), READONLY, "runs completed by the compiled path"},
    {NULL, 0, 0, 0, NULL},
};

static PyTypeObject HotType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "collectives.backends.mpi._hot.Hot",
    .tp_basicsize = sizeof(Hot),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A persistent in-place all-reduce's hot path, bound once",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Hot_init,
    .tp_dealloc = (destructor)Hot_dealloc,
    .tp_methods = Hot_methods,
    .tp_members = Hot_members,
};

static struct PyModuleDef hot_module = {
    PyModuleDef_HEAD_INIT, "_hot",
    "The hot path of a repeated small MPI all-reduce, compiled (see hot_path.py)", -1, NULL,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__hot(void) {
    PyObject *module;
    if (PyType_Ready(&HotType) < 0)
        return NULL;
    module = PyModule_Create(&hot_module);
    if (module == NULL)
        return NULL;
    Py_INCREF(&HotType);
    if (PyModule_AddObject(module, "Hot", (PyObject *)&HotType) < 0) {
        Py_DECREF(&HotType);
        Py_DECREF(module);
        return NULL;
    }
    return module;
}
