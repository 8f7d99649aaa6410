/*
 * The CUDA driver called from C for runtime/libcuda.py: driver_symbol() opens libcuda and finds
 * cuGetProcAddress_v2, driver_call() calls any entry point the runtime uses.
 *
 * Why: a process's first launch makes about twenty driver calls (initializing, the device, its
 * primary context, loading the library, finding the kernel), each to a function that must first
 * be found. Through ctypes every one of them cost a function object, its argument types and a
 * call interface built on first use, then ctypes' argument conversion per call: ~135 us of a
 * first call on an H200 host for work the driver does in a few microseconds. Here a call is one
 * C function taking the entry point's address and a string saying what each argument is.
 *
 * driver_call(address, kinds, *args) -> (CUresult, *outputs). One character of kinds per C
 * argument, in order:
 *   v  an integer value (a handle, a size, a flag, an int): the next Python int, as 64 bits
 *   r  bytes (a NUL-terminated name, an image), or None for NULL. Only bytes: CPython keeps a
 *      NUL after a bytes object's last byte, so a name is terminated where the object ends; any
 *      other buffer (a memoryview slice, a bytearray) may not be, and the driver would read on
 *      past it (ctypes' c_char_p, the other door's type, refuses them too)
 *   w  a writable buffer (a bytearray the driver writes into)
 *   i  an output int: the address of a zeroed slot; its int value is returned
 *   p  an output pointer or 64-bit handle: returned as an int (0 for NULL)
 *   s  an output const char *: returned as bytes (None for NULL)
 * Every driver function returns CUresult and takes integers and pointers only, so each argument
 * is passed as a 64-bit integer through a function type of the right arity. That is the calling
 * convention's own rule on the two ABIs this is compiled for (x86-64 System V and AArch64
 * Linux: integer arguments in 64-bit registers, then 8-byte stack slots; a callee reads the low
 * bits of a narrower type), and nowhere else: elsewhere these functions do not exist and
 * libcuda.py calls through ctypes, with each argument's exact C type. The GIL is released for
 * the call (loading a library can take milliseconds; a Python fake driver takes it back).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#if defined(__linux__) && (defined(__x86_64__) || defined(__aarch64__))
#define KP_DRIVER_CALL 1
#include <dlfcn.h>
#endif

#ifdef KP_DRIVER_CALL

#define MAX_ARGS 11 /* cuLaunchKernel's */

typedef uint64_t u64;
typedef int (*f0)(void);
typedef int (*f1)(u64);
typedef int (*f2)(u64, u64);
typedef int (*f3)(u64, u64, u64);
typedef int (*f4)(u64, u64, u64, u64);
typedef int (*f5)(u64, u64, u64, u64, u64);
typedef int (*f6)(u64, u64, u64, u64, u64, u64);
typedef int (*f7)(u64, u64, u64, u64, u64, u64, u64);
typedef int (*f8)(u64, u64, u64, u64, u64, u64, u64, u64);
typedef int (*f9)(u64, u64, u64, u64, u64, u64, u64, u64, u64);
typedef int (*f10)(u64, u64, u64, u64, u64, u64, u64, u64, u64, u64);
typedef int (*f11)(u64, u64, u64, u64, u64, u64, u64, u64, u64, u64, u64);

static int call_with(void *fn, Py_ssize_t n, const u64 *a) {
    switch (n) {
    case 0: return ((f0)fn)();
    case 1: return ((f1)fn)(a[0]);
    case 2: return ((f2)fn)(a[0], a[1]);
    case 3: return ((f3)fn)(a[0], a[1], a[2]);
    case 4: return ((f4)fn)(a[0], a[1], a[2], a[3]);
    case 5: return ((f5)fn)(a[0], a[1], a[2], a[3], a[4]);
    case 6: return ((f6)fn)(a[0], a[1], a[2], a[3], a[4], a[5]);
    case 7: return ((f7)fn)(a[0], a[1], a[2], a[3], a[4], a[5], a[6]);
    case 8: return ((f8)fn)(a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7]);
    case 9: return ((f9)fn)(a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7], a[8]);
    case 10: return ((f10)fn)(a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7], a[8], a[9]);
    default: return ((f11)fn)(a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7], a[8], a[9], a[10]);
    }
}

/* The output in slot i as a Python object (kinds[i] is 'i', 'p' or 's'). */
static PyObject *output(char kind, const u64 *slot) {
    if (kind == 'i') {
        int32_t value;
        memcpy(&value, slot, sizeof value); /* written at the slot's address, as an int */
        return PyLong_FromLong(value);
    }
    if (kind == 'p')
        return PyLong_FromUnsignedLongLong(*slot);
    if (*slot == 0)
        Py_RETURN_NONE;
    return PyBytes_FromString((const char *)(uintptr_t)*slot);
}

static PyObject *driver_call(PyObject *self, PyObject *const *argv, Py_ssize_t nargs) {
    void *fn;
    const char *kinds;
    Py_ssize_t nkinds, i, next = 2, nout = 0, nbufs = 0, j;
    u64 a[MAX_ARGS], slots[MAX_ARGS];
    Py_buffer bufs[MAX_ARGS];
    PyObject *result = NULL, *item;
    int err;
    (void)self;
    if (nargs < 2) {
        PyErr_SetString(PyExc_TypeError, "driver_call(address, kinds, *args)");
        return NULL;
    }
    fn = PyLong_AsVoidPtr(argv[0]);
    if (fn == NULL) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_ValueError, "driver_call: the entry point's address is 0");
        return NULL;
    }
    kinds = PyUnicode_AsUTF8AndSize(argv[1], &nkinds);
    if (kinds == NULL)
        return NULL;
    if (nkinds > MAX_ARGS) {
        PyErr_Format(PyExc_ValueError, "driver_call: %zd arguments, at most %d", nkinds, MAX_ARGS);
        return NULL;
    }
    memset(slots, 0, sizeof slots);
    for (i = 0; i < nkinds; i++) {
        char k = kinds[i];
        if (k == 'i' || k == 'p' || k == 's') {
            a[i] = (u64)(uintptr_t)&slots[i];
            nout++;
            continue;
        }
        if (k != 'v' && k != 'r' && k != 'w') {
            PyErr_Format(PyExc_ValueError, "driver_call: unknown argument kind %R", argv[1]);
            goto done;
        }
        if (next >= nargs) {
            PyErr_Format(PyExc_TypeError, "driver_call: kinds %R take more than %zd arguments",
                         argv[1], nargs - 2);
            goto done;
        }
        if (k == 'v') {
            a[i] = PyLong_AsUnsignedLongLongMask(argv[next]);
            if (a[i] == (u64)-1 && PyErr_Occurred())
                goto done;
        } else if (k == 'r') {
            if (argv[next] == Py_None) {
                a[i] = 0;
            } else if (PyBytes_Check(argv[next])) {
                /* immutable and kept alive by argv for the call: no export needed */
                a[i] = (u64)(uintptr_t)PyBytes_AsString(argv[next]);
            } else {
                PyErr_Format(PyExc_TypeError, "driver_call: argument %zd ('r') must be bytes "
                             "or None (got %R)", next - 2, (PyObject *)Py_TYPE(argv[next]));
                goto done;
            }
        } else {
            /* held until the call returns: the object cannot be resized under the driver */
            if (PyObject_GetBuffer(argv[next], &bufs[nbufs], PyBUF_WRITABLE) < 0)
                goto done;
            a[i] = (u64)(uintptr_t)bufs[nbufs++].buf;
        }
        next++;
    }
    if (next != nargs) {
        PyErr_Format(PyExc_TypeError, "driver_call: kinds %R take %zd arguments (got %zd)",
                     argv[1], next - 2, nargs - 2);
        goto done;
    }
    Py_BEGIN_ALLOW_THREADS
    err = call_with(fn, nkinds, a);
    Py_END_ALLOW_THREADS
    result = PyTuple_New(1 + nout);
    if (result == NULL)
        goto done;
    item = PyLong_FromLong(err);
    if (item == NULL || PyTuple_SetItem(result, 0, item) < 0)
        goto fail;
    for (i = 0, j = 1; i < nkinds; i++) {
        if (kinds[i] != 'i' && kinds[i] != 'p' && kinds[i] != 's')
            continue;
        item = output(kinds[i], &slots[i]);
        if (item == NULL || PyTuple_SetItem(result, j++, item) < 0)
            goto fail;
    }
    goto done;
fail:
    Py_CLEAR(result);
done:
    for (i = 0; i < nbufs; i++)
        PyBuffer_Release(&bufs[i]);
    return result;
}

/* driver_symbol(library, name) -> the address of name in library (0: not there); OSError with
 * the dynamic loader's words when the library cannot be opened. The library stays open.
 * library is what ctypes.CDLL takes, the other door's opener: a str, bytes or os.PathLike,
 * encoded as the file system's names are (PyUnicode_FSConverter). */
static PyObject *driver_symbol(PyObject *self, PyObject *args) {
    const char *library, *name;
    PyObject *path = NULL;
    void *handle, *address = NULL;
    char message[512];
    (void)self;
    if (!PyArg_ParseTuple(args, "O&s:driver_symbol", PyUnicode_FSConverter, &path, &name))
        return NULL;
    library = PyBytes_AsString(path);
    if (library == NULL) {
        Py_DECREF(path);
        return NULL;
    }
    message[0] = '\0';
    Py_BEGIN_ALLOW_THREADS
    handle = dlopen(library, RTLD_NOW | RTLD_LOCAL);
    if (handle == NULL) {
        const char *why = dlerror();
        snprintf(message, sizeof message, "%s", why != NULL ? why : library);
    } else {
        address = dlsym(handle, name);
    }
    Py_END_ALLOW_THREADS
    Py_DECREF(path);
    if (handle == NULL) {
        PyErr_SetString(PyExc_OSError, message);
        return NULL;
    }
    return PyLong_FromVoidPtr(address);
}

static PyMethodDef drvcall_methods[] = {
    {"driver_call", (PyCFunction)(void (*)(void))driver_call, METH_FASTCALL,
     "driver_call(address, kinds, *args) -> (CUresult, *outputs): call a driver entry point."},
    {"driver_symbol", driver_symbol, METH_VARARGS,
     "driver_symbol(library, name) -> int: dlopen library, the address of name (0: none)."},
    {NULL, NULL, 0, NULL},
};

int kp_drvcall_init(PyObject *module) {
    return PyModule_AddFunctions(module, drvcall_methods);
}

#else /* not an ABI this knows: libcuda.py calls through ctypes */

int kp_drvcall_init(PyObject *module) {
    (void)module;
    return 0;
}

#endif
