/*
 * kernelpack.runtime._launch: cuLaunchKernel for Python with ten plain integers.
 *
 * Why this exists: a launch through cuda.bindings costs about 4 us of host time on an H200
 * host, roughly twice the driver's own cost, because each call converts a CUfunction and a
 * CUstream object, checks the kernelParams argument's type and builds a CUresult enum for the
 * answer. kernelpack's launch path already holds every value as a Python int (function handle,
 * grid, block, shared memory, stream handle, the address of a prepacked kernelParams array),
 * so this module forwards them to the driver with nothing in between.
 *
 * It links against nothing: the caller hands it the address of the driver's cuLaunchKernel,
 * which runtime/native.py asks the driver for with cuGetProcAddress through cuda.bindings
 * (so both paths use the same libcuda and the same default-stream semantics). Until then,
 * launch() raises RuntimeError.
 *
 * Built with the limited C API (abi3), so one build serves every Python from 3.11 on.
 * Optional: when it is not built, runtime/native.py falls back to cuda.bindings.
 */
#include "_launch.h"
#include <signal.h>
#include <stdint.h>

kp_launch_fn kp_cu_launch_kernel = NULL;

/* An unsigned 32-bit argument; -1 with an exception set when it does not fit. */
static int as_uint(PyObject *o, const char *what, unsigned int *out) {
    unsigned long v = PyLong_AsUnsignedLong(o);
    if (v == (unsigned long)-1 && PyErr_Occurred()) {
        PyErr_Format(PyExc_OverflowError, "%s must be an int in [0, 2**32) (got %R)", what, o);
        return -1;
    }
    if (v > 0xFFFFFFFFUL) {
        PyErr_Format(PyExc_OverflowError, "%s must be an int in [0, 2**32) (got %R)", what, o);
        return -1;
    }
    *out = (unsigned int)v;
    return 0;
}

/* A pointer-sized argument (a handle or an address); -1 with an exception set otherwise. */
static int as_pointer(PyObject *o, const char *what, void **out) {
    unsigned long long v = PyLong_AsUnsignedLongLong(o);
    if (v == (unsigned long long)-1 && PyErr_Occurred()) {
        PyErr_Format(PyExc_OverflowError, "%s must be an int in [0, 2**64) (got %R)", what, o);
        return -1;
    }
    if (sizeof(void *) < sizeof(unsigned long long) && v > (unsigned long long)UINTPTR_MAX) {
        PyErr_Format(PyExc_OverflowError, "%s does not fit a pointer (got %R)", what, o);
        return -1;
    }
    *out = (void *)(uintptr_t)v;
    return 0;
}

static PyObject *bind(PyObject *self, PyObject *address) {
    void *p;
    (void)self;
    if (as_pointer(address, "address", &p) < 0)
        return NULL;
    if (p == NULL) {
        PyErr_SetString(PyExc_ValueError, "address of cuLaunchKernel must not be 0");
        return NULL;
    }
    kp_cu_launch_kernel = (kp_launch_fn)p;
    Py_RETURN_NONE;
}

static const char *const uint_names[7] = {
    "grid x", "grid y", "grid z", "block x", "block y", "block z", "shared_mem",
};

static PyObject *launch(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    void *func, *stream, *params;
    unsigned int dims[7];
    int i, err;
    (void)self;
    if (nargs != 11) {
        PyErr_Format(PyExc_TypeError, "launch takes 11 arguments (function, grid x/y/z, "
                     "block x/y/z, shared_mem, stream, kernel_params, extra) (got %zd)", nargs);
        return NULL;
    }
    if (kp_cu_launch_kernel == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "kernelpack.runtime._launch is not bound to the "
                        "driver yet (call bind(address of cuLaunchKernel) first)");
        return NULL;
    }
    if (as_pointer(args[0], "function", &func) < 0)
        return NULL;
    for (i = 0; i < 7; i++)
        if (as_uint(args[1 + i], uint_names[i], &dims[i]) < 0)
            return NULL;
    if (as_pointer(args[8], "stream", &stream) < 0 ||
        as_pointer(args[9], "kernel_params", &params) < 0)
        return NULL;
    if (func == NULL) {
        PyErr_SetString(PyExc_ValueError, "function handle must not be 0");
        return NULL;
    }
    /* "extra" (the driver's other way of passing parameters) is not supported: only 0 */
    if (!PyLong_Check(args[10]) || PyObject_IsTrue(args[10])) {
        PyErr_Format(PyExc_ValueError, "extra must be 0 (got %R)", args[10]);
        return NULL;
    }
    /* The driver copies the parameter values before it returns; the GIL is released meanwhile,
     * as cuda.bindings does, so other Python threads run during the launch. */
    Py_BEGIN_ALLOW_THREADS
    err = kp_cu_launch_kernel(func, dims[0], dims[1], dims[2], dims[3], dims[4], dims[5], dims[6],
                           stream, (void **)params, NULL);
    Py_END_ALLOW_THREADS
    /* a 1-tuple, as cuda.bindings answers, so callers unpack either the same way */
    {
        PyObject *code = PyLong_FromLong(err), *answer;
        if (code == NULL)
            return NULL;
        answer = PyTuple_New(1);
        if (answer == NULL) {
            Py_DECREF(code);
            return NULL;
        }
        PyTuple_SetItem(answer, 0, code); /* steals the reference */
        return answer;
    }
}

static PyObject *is_bound(PyObject *self, PyObject *unused) {
    (void)self;
    (void)unused;
    return PyBool_FromLong(kp_cu_launch_kernel != NULL);
}

/* signal_restarts(signum): whether signum's action restarts interrupted system calls
 * (SA_RESTART), read with sigaction; None where the signal cannot be asked about. Asked by
 * kernelpack/_interrupts.py before it swaps a Python handler (signal.signal drops the flag):
 * ctypes' way to it, CDLL(None) and a buffer type, cost ~40 µs of a process's first kp.load. */
static PyObject *signal_restarts(PyObject *self, PyObject *arg) {
    struct sigaction action;
    long signum = PyLong_AsLong(arg);
    (void)self;
    if (signum == -1 && PyErr_Occurred())
        return NULL;
    if (signum <= 0 || signum > INT_MAX || sigaction((int)signum, NULL, &action) != 0)
        Py_RETURN_NONE;
#ifdef SA_RESTART
    return PyBool_FromLong((action.sa_flags & SA_RESTART) != 0);
#else
    Py_RETURN_NONE;
#endif
}

static PyMethodDef methods[] = {
    {"signal_restarts", (PyCFunction)signal_restarts, METH_O,
     "signal_restarts(signum) -> bool | None: whether the signal's action has SA_RESTART "
     "(None: the signal cannot be asked about)."},
    {"bind", (PyCFunction)bind, METH_O,
     "bind(address): use the cuLaunchKernel at this address (from cuGetProcAddress)."},
    {"is_bound", (PyCFunction)is_bound, METH_NOARGS,
     "is_bound() -> bool: whether bind() has been called."},
    {"launch", (PyCFunction)(void (*)(void))launch, METH_FASTCALL,
     "launch(function, gx, gy, gz, bx, by, bz, shared_mem, stream, kernel_params, extra) -> "
     "(CUresult,)\n\n"
     "cuLaunchKernel with raw handles, answered like cuda.bindings' (0 = success). "
     "kernel_params is the address of a void* array (0: no parameters); extra must be 0."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_launch",
    "cuLaunchKernel with plain integers (see runtime/native.py).", -1, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__launch(void) {
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    if (kp_fastcall_init(m) < 0 || kp_verify_init(m) < 0 || kp_fbread_init(m) < 0 ||
        kp_zstd_init(m) < 0 || kp_drvcall_init(m) < 0 || kp_fdowner_init(m) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
