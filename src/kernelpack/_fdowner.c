/*
 * kernelpack.runtime._launch.owned_dup: a duplicate of a file descriptor owned by a C object,
 * for kernelpack/_images.py's PackFile (the descriptor a large pack's images are read from).
 *
 * Why in C: the descriptor must be closed when the last reader of the pack goes away, and
 * whatever closes it must not be Python code. A weakref.finalize callback is (weakref.py): a
 * Ctrl-C landing as it starts is raised inside it, printed as "Exception ignored" and lost
 * (the user's Ctrl-C did nothing), and os.close never ran (the descriptor stayed open for the
 * life of the process; review 34). An io.FileIO would close from C too, but warns "unclosed
 * file" (ResourceWarning) when dropped, which a pack never asks its user to close. Here the
 * dup and the taking of ownership are one C call, and the close is the object's deallocation:
 * no bytecode runs between them, so no Python signal handler can.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <errno.h>
#include <fcntl.h>
#include <unistd.h>

typedef struct {
    PyObject_HEAD int fd; /* -1 once closed */
} FdOwner;

static void fdowner_dealloc(PyObject *self) {
    PyTypeObject *type = Py_TYPE(self);
    freefunc tp_free = (freefunc)PyType_GetSlot(type, Py_tp_free);
    int fd = ((FdOwner *)self)->fd;
    if (fd >= 0)
        close(fd); /* (EINTR: Linux closes the descriptor anyway; nothing to retry) */
    tp_free(self);
    Py_DECREF((PyObject *)type); /* instances of a heap type hold a reference to it */
}

static PyObject *fdowner_fileno(PyObject *self, PyObject *unused) {
    (void)unused;
    if (((FdOwner *)self)->fd < 0) {
        PyErr_SetString(PyExc_ValueError, "the descriptor is closed");
        return NULL;
    }
    return PyLong_FromLong(((FdOwner *)self)->fd);
}

static PyObject *fdowner_close(PyObject *self, PyObject *unused) {
    int fd = ((FdOwner *)self)->fd;
    (void)unused;
    ((FdOwner *)self)->fd = -1;
    if (fd >= 0)
        close(fd);
    Py_RETURN_NONE;
}

/* No copies: a copy would close the descriptor a second time (or, made through object's own
 * pickling, descriptor 0, which it never owned). */
static PyObject *fdowner_reduce(PyObject *self, PyObject *unused) {
    (void)self;
    (void)unused;
    PyErr_SetString(PyExc_TypeError, "an FdOwner cannot be pickled or copied (it owns a file "
                                     "descriptor of this process)");
    return NULL;
}

static PyMethodDef fdowner_methods[] = {
    {"fileno", fdowner_fileno, METH_NOARGS, "fileno() -> int: the owned descriptor."},
    {"__reduce__", fdowner_reduce, METH_NOARGS, "Refused: see _fdowner.c."},
    {"__reduce_ex__", (PyCFunction)(void (*)(void))fdowner_reduce, METH_O, "Refused."},
    {"close", fdowner_close, METH_NOARGS, "close(): close it now (deallocation does otherwise)."},
    {NULL, NULL, 0, NULL},
};

static PyType_Slot fdowner_slots[] = {
    {Py_tp_dealloc, fdowner_dealloc},
    {Py_tp_methods, fdowner_methods},
    {Py_tp_doc, "A file descriptor closed when this object is deallocated (see owned_dup)."},
    {0, NULL},
};

/* made only by owned_dup: FdOwner() or FdOwner.__new__ would own descriptor 0 (zeroed memory) */
static PyType_Spec fdowner_spec = {
    "kernelpack.runtime._launch.FdOwner", sizeof(FdOwner), 0,
    Py_TPFLAGS_DEFAULT | Py_TPFLAGS_DISALLOW_INSTANTIATION, fdowner_slots,
};

static PyTypeObject *FdOwnerType = NULL;

/* owned_dup(fd): a close-on-exec duplicate of fd, owned by a new FdOwner. OSError as dup. */
static PyObject *owned_dup(PyObject *self, PyObject *arg) {
    FdOwner *owner;
    long fd = PyLong_AsLong(arg);
    int copy;
    (void)self;
    if (fd == -1 && PyErr_Occurred())
        return NULL;
    if (fd < 0 || fd > INT_MAX) {
        PyErr_Format(PyExc_ValueError, "owned_dup: %ld is not a file descriptor", fd);
        return NULL;
    }
    /* allocated first: a failed allocation must not leave a duplicate nobody owns */
    owner = (FdOwner *)PyType_GenericAlloc(FdOwnerType, 0);
    if (owner == NULL)
        return NULL;
    owner->fd = -1;
    Py_BEGIN_ALLOW_THREADS
    copy = fcntl((int)fd, F_DUPFD_CLOEXEC, 0);
    Py_END_ALLOW_THREADS
    if (copy < 0) {
        PyErr_SetFromErrno(PyExc_OSError);
        Py_DECREF(owner);
        return NULL;
    }
    owner->fd = copy;
    return (PyObject *)owner;
}

static PyMethodDef module_methods[] = {
    {"owned_dup", owned_dup, METH_O,
     "owned_dup(fd) -> FdOwner: a duplicate of fd (close-on-exec) that is closed when the "
     "returned object is deallocated, with no Python code between (see _fdowner.c)."},
    {NULL, NULL, 0, NULL},
};

int kp_fdowner_init(PyObject *module) {
    FdOwnerType = (PyTypeObject *)PyType_FromSpec(&fdowner_spec);
    if (FdOwnerType == NULL)
        return -1;
    Py_INCREF((PyObject *)FdOwnerType);
    if (PyModule_AddObject(module, "FdOwner", (PyObject *)FdOwnerType) < 0) {
        Py_DECREF((PyObject *)FdOwnerType);
        return -1;
    }
    return PyModule_AddFunctions(module, module_methods);
}
