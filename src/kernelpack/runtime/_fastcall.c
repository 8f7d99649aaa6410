/*
 * kernelpack.runtime._launch.FastCall: the PyTorch fast path (runtime/fast_torch.py) in C.
 *
 * Why: after the launch itself went to C (_launch.c), a fast call of a small kernel still spent
 * about 3 us of host time in Python around a 3.5 us driver call (H200 host): reading each
 * tensor's dtype, contiguity, device, shape and pointer, building the plan-cache key, packing
 * the parameter block. The attribute reads themselves are torch's (the same calls are made
 * here); what C removes is the interpreter's work between them, which was most of it.
 *
 * What it does per call is exactly fast_torch.py's closure, and it keeps that closure's rule:
 * anything unusual (another array type, a subclass, a dtype/contiguity/device mismatch, a
 * shape the planner refuses, an int out of its dtype's range, a float too large for float32,
 * outputs for another stream, several outputs with out=) goes to the general path *before*
 * anything is allocated or launched, and the general path explains any error.
 *
 * Per-call state lives on the C stack (values, the parameter block, the kernelParams array),
 * so concurrent threads never share a block and need no lock; the GIL is released only around
 * the driver call. Everything that depends on a shape comes from Python once per distinct key
 * (hooks.entry(key): output shapes, which input each output may be allocated like, and per
 * launch its dimensions and a parameter-block template holding the planner's computed values),
 * so the expressions are the planner's, never evaluated here.
 *
 * The current context: a launch on a default stream (handle < 3) goes to the thread's current
 * context. A thread remembers the device whose primary context it last confirmed (only when
 * the hooks say that may be trusted: one visible device); forget_contexts() makes every thread
 * ask again. A failed launch on a remembered context asks the hooks to check it and launches
 * once more when it had changed (fastpath.py's FastCore.relaunch, the same rule).
 */
#include "_launch.h"

#include <float.h>
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* Exported by CPython since 3.9, but in the limited API only from 3.12: declared here so that
 * the abi3 build (Py_LIMITED_API 3.11) can call methods without a bound-method object. */
#if defined(Py_LIMITED_API) && Py_LIMITED_API + 0 < 0x030C0000
PyAPI_FUNC(PyObject *) PyObject_VectorcallMethod(PyObject *name, PyObject *const *args,
                                                 size_t nargsf, PyObject *kwnames);
#endif
/* The same for PyObject_Vectorcall: exported since 3.11 (setup.py builds the extension only
 * for 3.11 and later). */
#if defined(Py_LIMITED_API) && Py_LIMITED_API + 0 < 0x030C0000
PyAPI_FUNC(PyObject *) PyObject_Vectorcall(PyObject *callable, PyObject *const *args,
                                           size_t nargsf, PyObject *kwnames);
#endif
#ifndef PY_VECTORCALL_ARGUMENTS_OFFSET
#define PY_VECTORCALL_ARGUMENTS_OFFSET ((size_t)1 << (8 * sizeof(size_t) - 1))
#endif

#if defined(_MSC_VER)
#define KP_THREAD_LOCAL __declspec(thread)
#else
#define KP_THREAD_LOCAL _Thread_local
#endif

/* Limits of what a FastCall takes on (larger programs keep the Python fast path). */
#define MAX_VALUES 256        /* value slots a call writes (tensors, outputs, scalars) */
#define MAX_PARAM_BYTES 4096  /* one launch's parameter block: the classic CUDA limit */
#define MAX_PARAMS 512        /* one launch's parameters */
#define MAX_KEY 64            /* tensors + symbol scalars in the plan-cache key */
#define MAX_LAUNCHES 64       /* launches of all variants together */
#define ENTRY_CACHE_SIZE 256  /* distinct keys kept; cleared when full, as fastpath.py does */

typedef union {
    uint64_t u;
    int64_t i;
    double d;
} Value;

enum { KIND_NONE = 0, KIND_POINTER, KIND_FLOAT, KIND_INT };

typedef struct {
    Py_ssize_t arg; /* position in the call's arguments */
    int slot;       /* value slot */
    PyObject *dtype;
} TensorIn;

typedef struct {
    Py_ssize_t arg;
    int slot;
    int as_f32; /* some parameter takes it as float32: a value too large for it falls back */
} FloatIn;

typedef struct {
    Py_ssize_t arg;
    int slot;
    int64_t lo, hi; /* the dtype's range, clipped to int64 (larger values fall back) */
    int is_symbol;  /* part of the plan-cache key */
} IntIn;

typedef struct {
    int slot;
    PyObject *dtype;
} OutSpec;

typedef struct {
    uint32_t offset;
    char code; /* struct code */
    int value; /* value slot */
} DynParam;

typedef struct {
    Py_ssize_t size;
    int nparams;
    uint32_t *offsets;
    int ndyn;
    DynParam *dyn; /* the parameters read from the call; the others come from the template */
} Layout;

typedef struct {
    int j; /* which layout / function */
    unsigned int dims[7];
    unsigned char *tmpl; /* layouts[j].size bytes */
} EntryLaunch;

typedef struct {
    PyObject *shapes;   /* tuple of the outputs' shapes */
    Py_ssize_t *likes;  /* per output: argument to allocate it like, or -1 */
    int nlaunch;
    EntryLaunch *launches;
} Entry;

/* How a tensor's attribute or method is read. Looked up once on the tensor type: a data
 * descriptor (torch's getset `dtype`, `shape`) is called through its getter and a method
 * (`data_ptr`, ...) through vectorcall, skipping the type and instance-dict lookups of every
 * attribute access (a sixth of the C path's own time). Names the type does not define
 * (attributes set per instance) are read the generic way. An instance attribute shadowing a
 * method of the exact tensor type is not honoured (torch tensors have none). */
typedef struct {
    PyObject *name;
    PyObject *descr;    /* NULL: generic lookup */
    descrgetfunc get;   /* attributes: the descriptor's getter */
} Access;

typedef struct {
    Access dtype, shape, is_contiguous, get_device, data_ptr;
} Reader;

typedef struct {
    PyObject_HEAD
    PyObject *tensor_type, *empty_like, *raw_stream, *hooks, *states, *cache;
    Reader rd;
    Py_ssize_t n_in;
    int ntensors, nfloats, nints, nouts, nsymbols, nvalues, nlayouts, trust_context;
    TensorIn *tensors;
    FloatIn *floats;
    IntIn *ints;
    OutSpec *outs;
    Layout *layouts;
    PyObject *last_state; /* the device state whose function handles are in last_funcs */
    void **last_funcs;
    Py_ssize_t fast_calls; /* calls completed here (tests check which path ran) */
} FastCall;

static PyTypeObject *FastCallType = NULL;

static PyObject *s_flat, *s_allocate, *s_entry, *s_confirm_context, *s_recover,
    *s_launch_failed, *s_slow, *s_stream_handle;

/* The remembered context (see the top): valid while epoch matches context_epoch. */
static long context_epoch = 1;
static KP_THREAD_LOCAL long tls_epoch = 0;
static KP_THREAD_LOCAL long tls_device = -1;

/* ---- small helpers ------------------------------------------------------------------------ */

static PyObject *call_method(PyObject *name, PyObject *const *args, size_t n) {
    return PyObject_VectorcallMethod(name, args, n | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
}

static PyObject *call_method0(PyObject *self, PyObject *name) {
    return PyObject_VectorcallMethod(name, &self, 1 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
}

static PyObject *read_attr(const Access *a, PyObject *obj) {
    if (a->get != NULL)
        return a->get(a->descr, obj, (PyObject *)Py_TYPE(obj));
    return PyObject_GetAttr(obj, a->name);
}

static PyObject *call_access(const Access *a, PyObject *obj) {
    if (a->descr != NULL)
        return PyObject_Vectorcall(a->descr, &obj, 1, NULL);
    return call_method0(obj, a->name);
}

/* The Access for `name` on `type`; is_method: called rather than read. */
static int access_init(Access *a, PyObject *type, const char *name, int is_method) {
    PyObject *descr;
    a->name = PyUnicode_InternFromString(name);
    if (a->name == NULL)
        return -1;
    descr = PyObject_GetAttr(type, a->name);
    if (descr == NULL) {
        PyErr_Clear();
        return 0;
    }
    if (is_method) {
        /* a function or method descriptor (binds to instances), not e.g. a staticmethod */
        if (PyCallable_Check(descr) && PyType_GetSlot(Py_TYPE(descr), Py_tp_descr_get) &&
            !PyType_GetSlot(Py_TYPE(descr), Py_tp_descr_set)) {
            a->descr = descr;
            return 0;
        }
    } else {
        descrgetfunc get = (descrgetfunc)PyType_GetSlot(Py_TYPE(descr), Py_tp_descr_get);
        if (get != NULL && PyType_GetSlot(Py_TYPE(descr), Py_tp_descr_set)) {
            a->descr = descr;
            a->get = get;
            return 0;
        }
    }
    Py_DECREF(descr);
    return 0;
}

static void access_clear(Access *a) {
    Py_CLEAR(a->name);
    Py_CLEAR(a->descr);
    a->get = NULL;
}

static int reader_init(Reader *rd, PyObject *type) {
    if (access_init(&rd->dtype, type, "dtype", 0) < 0 ||
        access_init(&rd->shape, type, "shape", 0) < 0 ||
        access_init(&rd->is_contiguous, type, "is_contiguous", 1) < 0 ||
        access_init(&rd->get_device, type, "get_device", 1) < 0 ||
        access_init(&rd->data_ptr, type, "data_ptr", 1) < 0)
        return -1;
    return 0;
}

static void reader_clear(Reader *rd) {
    access_clear(&rd->dtype);
    access_clear(&rd->shape);
    access_clear(&rd->is_contiguous);
    access_clear(&rd->get_device);
    access_clear(&rd->data_ptr);
}

/* obj.get_device() as a C long; -2 with an exception set on failure. */
static long device_of(const Reader *rd, PyObject *obj) {
    PyObject *r = call_access(&rd->get_device, obj);
    long d;
    if (r == NULL)
        return -2;
    d = PyLong_AsLong(r);
    Py_DECREF(r);
    if (d == -1 && PyErr_Occurred())
        return -2;
    return d;
}

/* obj.data_ptr(); 0 with an exception set on failure (a null tensor pointer is fine: the
 * exception is what tells them apart). */
static uint64_t pointer_of(const Reader *rd, PyObject *obj) {
    PyObject *r = call_access(&rd->data_ptr, obj);
    unsigned long long p;
    if (r == NULL)
        return 0;
    p = PyLong_AsUnsignedLongLong(r);
    Py_DECREF(r);
    return (uint64_t)p;
}

/* 1: obj.dtype is dtype; 0: not; -1: error. */
static int has_dtype(const Reader *rd, PyObject *obj, PyObject *dtype) {
    PyObject *d = read_attr(&rd->dtype, obj);
    int same;
    if (d == NULL)
        return -1;
    same = d == dtype;
    Py_DECREF(d);
    return same;
}

/* 1: obj.is_contiguous() is True; 0: not; -1: error. */
static int contiguous(const Reader *rd, PyObject *obj) {
    PyObject *r = call_access(&rd->is_contiguous, obj);
    int yes;
    if (r == NULL)
        return -1;
    yes = r == Py_True;
    Py_DECREF(r);
    return yes;
}

static int write_param(unsigned char *at, char code, Value v) {
    switch (code) {
    case 'Q':
    case 'q': memcpy(at, &v.u, 8); return 0;
    case 'i': { int32_t x = (int32_t)v.i; memcpy(at, &x, 4); return 0; }
    case 'I': { uint32_t x = (uint32_t)v.i; memcpy(at, &x, 4); return 0; }
    case 'h': { int16_t x = (int16_t)v.i; memcpy(at, &x, 2); return 0; }
    case 'H': { uint16_t x = (uint16_t)v.i; memcpy(at, &x, 2); return 0; }
    case 'b': { int8_t x = (int8_t)v.i; memcpy(at, &x, 1); return 0; }
    case 'B': { uint8_t x = (uint8_t)v.i; memcpy(at, &x, 1); return 0; }
    case 'f': { float x = (float)v.d; memcpy(at, &x, 4); return 0; }
    case 'd': memcpy(at, &v.d, 8); return 0;
    default: return -1;
    }
}

static Py_ssize_t code_size(char code) {
    switch (code) {
    case 'Q': case 'q': case 'd': return 8;
    case 'i': case 'I': case 'f': return 4;
    case 'h': case 'H': return 2;
    case 'b': case 'B': return 1;
    default: return 0;
    }
}

/* The range an int parameter code holds (for checking a scalar's declared range fits it). */
static int code_range(char code, int64_t *lo, int64_t *hi) {
    switch (code) {
    case 'q': case 'Q': *lo = INT64_MIN; *hi = INT64_MAX; return 0;
    case 'i': *lo = INT32_MIN; *hi = INT32_MAX; return 0;
    case 'I': *lo = 0; *hi = UINT32_MAX; return 0;
    case 'h': *lo = INT16_MIN; *hi = INT16_MAX; return 0;
    case 'H': *lo = 0; *hi = UINT16_MAX; return 0;
    case 'b': *lo = INT8_MIN; *hi = INT8_MAX; return 0;
    case 'B': *lo = 0; *hi = UINT8_MAX; return 0;
    default: return -1;
    }
}

/* ---- entries (one per distinct key) ------------------------------------------------------- */

static void entry_free(Entry *e) {
    int k;
    if (e == NULL)
        return;
    Py_XDECREF(e->shapes);
    PyMem_Free(e->likes);
    if (e->launches != NULL)
        for (k = 0; k < e->nlaunch; k++)
            PyMem_Free(e->launches[k].tmpl);
    PyMem_Free(e->launches);
    PyMem_Free(e);
}

static void entry_capsule_free(PyObject *capsule) {
    entry_free((Entry *)PyCapsule_GetPointer(capsule, "kernelpack.fastcall.entry"));
}

static int as_uint32(PyObject *o, unsigned int *out) {
    unsigned long v = PyLong_AsUnsignedLong(o);
    if (v == (unsigned long)-1 && PyErr_Occurred())
        return -1;
    if (v > 0xFFFFFFFFUL) {
        PyErr_SetString(PyExc_OverflowError, "launch dimension does not fit 32 bits");
        return -1;
    }
    *out = (unsigned int)v;
    return 0;
}

/* The C entry for hooks.entry(key)'s answer (shapes, likes, launches); NULL with an exception
 * set when the answer is malformed (a bug in fast_native.py, reported as such). */
static Entry *entry_from(FastCall *self, PyObject *answer) {
    PyObject *shapes, *likes, *launches;
    Entry *e;
    Py_ssize_t k, n;
    if (!PyTuple_Check(answer) || PyTuple_Size(answer) != 3) {
        PyErr_SetString(PyExc_TypeError, "FastCall: hooks.entry must answer None or "
                        "(shapes, likes, launches)");
        return NULL;
    }
    shapes = PyTuple_GetItem(answer, 0);
    likes = PyTuple_GetItem(answer, 1);
    launches = PyTuple_GetItem(answer, 2);
    if (!PyTuple_Check(shapes) || !PyTuple_Check(likes) || !PyTuple_Check(launches) ||
        PyTuple_Size(shapes) != self->nouts || PyTuple_Size(likes) != self->nouts) {
        PyErr_SetString(PyExc_TypeError, "FastCall: hooks.entry answered tuples of the wrong "
                        "kind or length");
        return NULL;
    }
    e = PyMem_Calloc(1, sizeof(Entry));
    if (e == NULL)
        return (Entry *)PyErr_NoMemory();
    Py_INCREF(shapes);
    e->shapes = shapes;
    e->likes = PyMem_Calloc(self->nouts ? self->nouts : 1, sizeof(Py_ssize_t));
    n = PyTuple_Size(launches);
    e->launches = PyMem_Calloc(n ? n : 1, sizeof(EntryLaunch));
    if (e->likes == NULL || e->launches == NULL) {
        entry_free(e);
        return (Entry *)PyErr_NoMemory();
    }
    for (k = 0; k < self->nouts; k++) {
        e->likes[k] = PyLong_AsSsize_t(PyTuple_GetItem(likes, k));
        if (e->likes[k] == -1 && PyErr_Occurred()) {
            entry_free(e);
            return NULL;
        }
        if (e->likes[k] >= self->n_in) {
            PyErr_SetString(PyExc_ValueError, "FastCall: an output's 'like' is not an argument");
            entry_free(e);
            return NULL;
        }
    }
    for (k = 0; k < n; k++) {
        PyObject *item = PyTuple_GetItem(launches, k), *tmpl;
        EntryLaunch *el = &e->launches[k];
        Py_ssize_t d, size;
        char *bytes;
        e->nlaunch = (int)k + 1; /* so entry_free frees what is made */
        if (!PyTuple_Check(item) || PyTuple_Size(item) != 9) {
            PyErr_SetString(PyExc_TypeError, "FastCall: a launch is (j, gx, gy, gz, bx, by, "
                            "bz, shared_mem, template)");
            entry_free(e);
            return NULL;
        }
        el->j = (int)PyLong_AsLong(PyTuple_GetItem(item, 0));
        if (PyErr_Occurred() || el->j < 0 || el->j >= self->nlayouts) {
            PyErr_Clear();
            PyErr_SetString(PyExc_ValueError, "FastCall: a launch's index is out of range");
            entry_free(e);
            return NULL;
        }
        for (d = 0; d < 7; d++)
            if (as_uint32(PyTuple_GetItem(item, 1 + d), &el->dims[d]) < 0) {
                entry_free(e);
                return NULL;
            }
        tmpl = PyTuple_GetItem(item, 8);
        size = self->layouts[el->j].size;
        if (!PyBytes_Check(tmpl) || PyBytes_Size(tmpl) != size) {
            PyErr_SetString(PyExc_ValueError, "FastCall: a launch's template is not bytes of "
                            "its parameter block's size");
            entry_free(e);
            return NULL;
        }
        el->tmpl = PyMem_Malloc(size ? size : 1);
        if (el->tmpl == NULL) {
            entry_free(e);
            return (Entry *)PyErr_NoMemory();
        }
        bytes = PyBytes_AsString(tmpl);
        memcpy(el->tmpl, bytes, size);
    }
    e->nlaunch = (int)n;
    return e;
}

/* The entry for key: borrowed capsule, Py_None when the planner refuses the key, NULL on
 * error. */
static PyObject *entry_for(FastCall *self, PyObject *key) {
    PyObject *capsule = PyDict_GetItemWithError(self->cache, key), *answer;
    PyObject *args[2];
    Entry *e;
    if (capsule != NULL || PyErr_Occurred())
        return capsule;
    args[0] = self->hooks;
    args[1] = key;
    answer = call_method(s_entry, args, 2);
    if (answer == NULL)
        return NULL;
    if (answer == Py_None) {
        Py_DECREF(answer);
        return Py_None;
    }
    e = entry_from(self, answer);
    Py_DECREF(answer);
    if (e == NULL)
        return NULL;
    capsule = PyCapsule_New(e, "kernelpack.fastcall.entry", entry_capsule_free);
    if (capsule == NULL) {
        entry_free(e);
        return NULL;
    }
    if (PyDict_Size(self->cache) >= ENTRY_CACHE_SIZE)
        PyDict_Clear(self->cache);
    if (PyDict_SetItem(self->cache, key, capsule) < 0) {
        Py_DECREF(capsule);
        return NULL;
    }
    Py_DECREF(capsule); /* the cache holds it */
    return capsule;
}

/* The function handles of device state st (st.flat, ints), cached while st stays the same. */
static void **functions_of(FastCall *self, PyObject *st) {
    PyObject *flat;
    void **funcs;
    int j;
    if (st == self->last_state)
        return self->last_funcs;
    flat = PyObject_GetAttr(st, s_flat);
    if (flat == NULL)
        return NULL;
    if (!PyList_Check(flat) || PyList_Size(flat) != self->nlayouts) {
        Py_DECREF(flat);
        PyErr_SetString(PyExc_ValueError, "FastCall: the device state's function list does "
                        "not match the program's launches");
        return NULL;
    }
    funcs = PyMem_Calloc(self->nlayouts ? self->nlayouts : 1, sizeof(void *));
    if (funcs == NULL) {
        Py_DECREF(flat);
        return (void **)PyErr_NoMemory();
    }
    for (j = 0; j < self->nlayouts; j++) {
        funcs[j] = PyLong_AsVoidPtr(PyList_GetItem(flat, j));
        if (PyErr_Occurred()) {
            Py_DECREF(flat);
            PyMem_Free(funcs);
            return NULL;
        }
    }
    Py_DECREF(flat);
    PyMem_Free(self->last_funcs);
    Py_XDECREF(self->last_state);
    Py_INCREF(st);
    self->last_state = st;
    self->last_funcs = funcs;
    return funcs;
}

/* ---- the call ----------------------------------------------------------------------------- */

static int launch_one(FastCall *self, const EntryLaunch *el, void *func, void *stream,
                      const Value *vals) {
    const Layout *lay = &self->layouts[el->j];
    union {
        double align;
        unsigned char bytes[MAX_PARAM_BYTES];
    } block;
    void *params[MAX_PARAMS];
    int k, err;
    if (lay->size)
        memcpy(block.bytes, el->tmpl, lay->size);
    for (k = 0; k < lay->ndyn; k++) {
        const DynParam *p = &lay->dyn[k];
        write_param(block.bytes + p->offset, p->code, vals[p->value]);
    }
    for (k = 0; k < lay->nparams; k++)
        params[k] = block.bytes + lay->offsets[k];
    /* the driver copies the parameters before it returns */
    Py_BEGIN_ALLOW_THREADS
    err = kp_cu_launch_kernel(func, el->dims[0], el->dims[1], el->dims[2], el->dims[3],
                              el->dims[4], el->dims[5], el->dims[6], stream,
                              lay->nparams ? params : NULL, NULL);
    Py_END_ALLOW_THREADS
    return err;
}

/* A failed launch: on a remembered default-stream context, have the hooks check it and launch
 * again when it had changed; otherwise have them raise the LaunchError. 0: recovered. */
static int recover(FastCall *self, int err, PyObject *st, long device, uint64_t sh,
                   const EntryLaunch *el, void *func, const Value *vals) {
    PyObject *args[10], *r;
    int k;
    if (sh < 3 && tls_epoch == context_epoch && tls_device == device) {
        tls_device = -1;
        args[0] = self->hooks;
        args[1] = st;
        r = call_method(s_recover, args, 2);
        if (r == NULL)
            return -1;
        k = PyObject_IsTrue(r);
        Py_DECREF(r);
        if (k < 0)
            return -1;
        if (k) {
            err = launch_one(self, el, func, (void *)(uintptr_t)sh, vals);
            if (!err) {
                if (self->trust_context) {
                    tls_epoch = context_epoch;
                    tls_device = device;
                }
                return 0;
            }
        }
    }
    args[0] = self->hooks;
    args[1] = PyLong_FromLong(err);
    args[2] = PyLong_FromLong(el->j);
    for (k = 0; k < 7; k++)
        args[3 + k] = PyLong_FromUnsignedLong(el->dims[k]);
    r = NULL;
    for (k = 1; k < 10 && args[k] != NULL; k++)
        ;
    if (k == 10)
        r = call_method(s_launch_failed, args, 10);
    for (k = 1; k < 10; k++)
        Py_XDECREF(args[k]);
    Py_XDECREF(r);
    if (!PyErr_Occurred())
        PyErr_Format(PyExc_RuntimeError, "launch failed with CUresult %d", err);
    return -1;
}

/* The call's arguments into vals and key (tensor shapes, then symbol scalars), and the device
 * of the tensors. 1: read; 0: the call does not fit (general path); -1: error. */
static int read_arguments(FastCall *self, PyObject *args, Value *vals, PyObject *key,
                          long *device) {
    int k, r, nk = 0;
    long d;
    for (k = 0; k < self->ntensors; k++) {
        const TensorIn *ti = &self->tensors[k];
        PyObject *t = PyTuple_GetItem(args, ti->arg), *shape;
        if ((PyObject *)Py_TYPE(t) != self->tensor_type)
            return 0;
        if ((r = has_dtype(&self->rd, t, ti->dtype)) <= 0 ||
            (r = contiguous(&self->rd, t)) <= 0)
            return r;
        if ((d = device_of(&self->rd, t)) == -2)
            return -1;
        if (k == 0)
            *device = d;
        else if (d != *device)
            return 0;
        shape = read_attr(&self->rd.shape, t);
        if (shape == NULL)
            return -1;
        PyTuple_SetItem(key, nk++, shape); /* steals */
        vals[ti->slot].u = pointer_of(&self->rd, t);
        if (PyErr_Occurred())
            return -1;
    }
    for (k = 0; k < self->nfloats; k++) {
        const FloatIn *fi = &self->floats[k];
        PyObject *v = PyTuple_GetItem(args, fi->arg);
        double x;
        if (!PyFloat_CheckExact(v))
            return 0;
        x = PyFloat_AsDouble(v);
        if (fi->as_f32 && isfinite(x) && isinf((float)x))
            return 0; /* struct would refuse it: the general path says why */
        vals[fi->slot].d = x;
    }
    for (k = 0; k < self->nints; k++) {
        const IntIn *ii = &self->ints[k];
        PyObject *v = PyTuple_GetItem(args, ii->arg);
        long long x;
        int overflow;
        if (!PyLong_CheckExact(v))
            return 0;
        x = PyLong_AsLongLongAndOverflow(v, &overflow);
        if (x == -1 && PyErr_Occurred())
            return -1;
        if (overflow || x < ii->lo || x > ii->hi)
            return 0;
        vals[ii->slot].i = (int64_t)x;
        if (ii->is_symbol) {
            Py_INCREF(v);
            PyTuple_SetItem(key, nk++, v);
        }
    }
    return 1;
}

/* The outputs, allocated like an input where the entry says so, else by hooks.allocate; their
 * pointers into vals. Returns the call's result (one output, a tuple, or None). */
static PyObject *allocate_outputs(FastCall *self, const Entry *e, PyObject *args,
                                  PyObject *device_obj, Value *vals) {
    PyObject *made[8] = {NULL}, *result;
    int k;
    for (k = 0; k < self->nouts; k++) {
        PyObject *a[4];
        if (e->likes[k] >= 0) {
            a[0] = PyTuple_GetItem(args, e->likes[k]);
            made[k] = PyObject_Vectorcall(self->empty_like, a, 1, NULL);
        } else {
            a[0] = self->hooks;
            a[1] = PyTuple_GetItem(e->shapes, k);
            a[2] = self->outs[k].dtype;
            a[3] = device_obj;
            made[k] = call_method(s_allocate, a, 4);
        }
        if (made[k] == NULL)
            goto failed;
        vals[self->outs[k].slot].u = pointer_of(&self->rd, made[k]);
        if (PyErr_Occurred())
            goto failed;
    }
    if (self->nouts == 1)
        return made[0];
    if (self->nouts == 0)
        Py_RETURN_NONE;
    result = PyTuple_New(self->nouts);
    if (result == NULL)
        goto failed;
    for (k = 0; k < self->nouts; k++)
        PyTuple_SetItem(result, k, made[k]); /* steals */
    return result;
failed:
    for (k = 0; k < self->nouts; k++)
        Py_XDECREF(made[k]);
    return NULL;
}

/* out= (one tensor of this type): dtype, contiguity, shape and device as the entry wants, its
 * pointer into vals. 1: fits; 0: general path; -1: error. */
static int check_out(FastCall *self, const Entry *e, PyObject *out, long device, Value *vals) {
    PyObject *shape;
    int r;
    long d;
    if (self->nouts != 1 || (PyObject *)Py_TYPE(out) != self->tensor_type)
        return 0;
    if ((r = has_dtype(&self->rd, out, self->outs[0].dtype)) <= 0 ||
        (r = contiguous(&self->rd, out)) <= 0)
        return r;
    shape = read_attr(&self->rd.shape, out);
    if (shape == NULL)
        return -1;
    r = PyObject_RichCompareBool(shape, PyTuple_GetItem(e->shapes, 0), Py_EQ);
    Py_DECREF(shape);
    if (r <= 0)
        return r;
    if ((d = device_of(&self->rd, out)) == -2)
        return -1;
    if (d != device)
        return 0;
    vals[self->outs[0].slot].u = pointer_of(&self->rd, out);
    return PyErr_Occurred() ? -1 : 1;
}

/* The raw stream handle: the caller's stream= (hooks.stream_handle), else torch's current
 * stream of the device. -1 with an exception set on failure. */
static int stream_of(FastCall *self, PyObject *stream, PyObject *device_obj, uint64_t *sh) {
    PyObject *a[2], *r;
    if (stream == Py_None) {
        r = PyObject_Vectorcall(self->raw_stream, &device_obj, 1, NULL);
    } else {
        a[0] = self->hooks;
        a[1] = stream;
        r = call_method(s_stream_handle, a, 2);
    }
    if (r == NULL)
        return -1;
    *sh = (uint64_t)PyLong_AsUnsignedLongLong(r);
    Py_DECREF(r);
    return PyErr_Occurred() ? -1 : 0;
}

/* Every launch of the entry, in order, on the device state st (the current context checked
 * first on a default stream). -1 with an exception set on failure. */
static int launch_all(FastCall *self, const Entry *e, PyObject *st, long device, uint64_t sh,
                      const Value *vals) {
    void **funcs, *use[MAX_LAUNCHES];
    int k;
    if (sh < 3 && !(tls_epoch == context_epoch && tls_device == device)) {
        PyObject *a[2], *r;
        a[0] = self->hooks;
        a[1] = st;
        r = call_method(s_confirm_context, a, 2);
        if (r == NULL)
            return -1;
        Py_DECREF(r);
        if (self->trust_context) {
            tls_epoch = context_epoch;
            tls_device = device;
        }
    }
    funcs = functions_of(self, st);
    if (funcs == NULL)
        return -1;
    /* copied now: another thread may replace last_funcs while the GIL is released */
    for (k = 0; k < e->nlaunch; k++)
        use[k] = funcs[e->launches[k].j];
    for (k = 0; k < e->nlaunch; k++) {
        const EntryLaunch *el = &e->launches[k];
        int err = launch_one(self, el, use[k], (void *)(uintptr_t)sh, vals);
        if (err && recover(self, err, st, device, sh, el, use[k], vals) < 0)
            return -1;
    }
    return 0;
}

static PyObject *fastcall_call(FastCall *self, PyObject *const *argv, Py_ssize_t nargs) {
    PyObject *args, *out, *stream, *key, *device_obj = NULL, *capsule = NULL, *st = NULL;
    PyObject *result = NULL, *a[4];
    Value vals[MAX_VALUES];
    const Entry *e;
    long device = -1;
    uint64_t sh;
    int fits;
    if (nargs != 3) {
        PyErr_Format(PyExc_TypeError, "FastCall.call takes (args, out, stream) (got %zd "
                     "arguments)", nargs);
        return NULL;
    }
    args = argv[0];
    out = argv[1];
    stream = argv[2];
    if (!PyTuple_Check(args) || PyTuple_Size(args) != self->n_in ||
        (stream != Py_None && out == Py_None))
        goto slow; /* outputs for another stream: the general path */
    key = PyTuple_New(self->ntensors + self->nsymbols);
    if (key == NULL)
        return NULL;
    fits = read_arguments(self, args, vals, key, &device);
    if (fits > 0) {
        device_obj = PyLong_FromLong(device);
        fits = device_obj == NULL ? -1 : 1;
    }
    if (fits > 0) {
        st = PyDict_GetItemWithError(self->states, device_obj);
        /* none: a first call on this device (or host memory); the general path binds it */
        fits = st != NULL ? 1 : PyErr_Occurred() ? -1 : 0;
    }
    if (fits > 0) {
        capsule = entry_for(self, key); /* Py_None: the planner refuses the key */
        fits = capsule == NULL ? -1 : capsule != Py_None;
    }
    Py_DECREF(key);
    if (fits <= 0) {
        Py_XDECREF(device_obj);
        if (fits < 0)
            return NULL;
        goto slow;
    }
    /* both kept while in use: another thread may clear the cache or the states meanwhile */
    Py_INCREF(capsule);
    Py_INCREF(st);
    e = (const Entry *)PyCapsule_GetPointer(capsule, "kernelpack.fastcall.entry");
    if (e == NULL)
        goto done;
    if (out == Py_None) {
        result = allocate_outputs(self, e, args, device_obj, vals);
    } else {
        fits = check_out(self, e, out, device, vals);
        if (fits == 0) {
            Py_DECREF(st);
            Py_DECREF(capsule);
            Py_DECREF(device_obj);
            goto slow;
        }
        if (fits > 0) {
            Py_INCREF(out);
            result = out;
        }
    }
    if (result != NULL && (stream_of(self, stream, device_obj, &sh) < 0 ||
                           launch_all(self, e, st, device, sh, vals) < 0))
        Py_CLEAR(result);
    if (result != NULL)
        self->fast_calls++;
done:
    Py_DECREF(st);
    Py_DECREF(capsule);
    Py_DECREF(device_obj);
    return result;
slow:
    a[0] = self->hooks;
    a[1] = args;
    a[2] = out;
    a[3] = stream;
    return call_method(s_slow, a, 4);
}

/* ---- construction ------------------------------------------------------------------------- */

static int int_item(PyObject *tuple, Py_ssize_t i, long *out) {
    PyObject *o = PyTuple_GetItem(tuple, i);
    if (o == NULL)
        return -1;
    *out = PyLong_AsLong(o);
    return (*out == -1 && PyErr_Occurred()) ? -1 : 0;
}

static int bad(const char *what) {
    PyErr_Format(PyExc_ValueError, "FastCall: %s", what);
    return -1;
}

/* A tuple of tuples of `width` items each; its length in *n. */
static int rows(PyObject *o, Py_ssize_t width, const char *what, int *n) {
    Py_ssize_t k;
    if (!PyTuple_Check(o))
        return bad(what);
    for (k = 0; k < PyTuple_Size(o); k++) {
        PyObject *row = PyTuple_GetItem(o, k);
        if (!PyTuple_Check(row) || PyTuple_Size(row) != width)
            return bad(what);
    }
    *n = (int)PyTuple_Size(o);
    return 0;
}

static int slot_ok(FastCall *self, long slot, unsigned char *kinds, int kind) {
    if (slot < 0 || slot >= self->nvalues)
        return bad("a value slot is out of range");
    if (kinds[slot] != KIND_NONE)
        return bad("a value slot is written twice");
    kinds[slot] = (unsigned char)kind;
    return 0;
}

static int read_inputs(FastCall *self, PyObject *tensors, PyObject *floats, PyObject *ints,
                       PyObject *outs, unsigned char *kinds) {
    long a, s;
    int k;
    if (rows(tensors, 3, "tensors must be (arg, slot, dtype) rows", &self->ntensors) < 0 ||
        rows(floats, 2, "floats must be (arg, slot) rows", &self->nfloats) < 0 ||
        rows(ints, 5, "ints must be (arg, slot, lo, hi, is_symbol) rows", &self->nints) < 0 ||
        rows(outs, 2, "outputs must be (slot, dtype) rows", &self->nouts) < 0)
        return -1;
    if (self->ntensors < 1)
        return bad("a program needs a tensor input");
    if (self->nouts > 8)
        return bad("more than 8 outputs");
    self->tensors = PyMem_Calloc(self->ntensors, sizeof(TensorIn));
    self->floats = PyMem_Calloc(self->nfloats + 1, sizeof(FloatIn));
    self->ints = PyMem_Calloc(self->nints + 1, sizeof(IntIn));
    self->outs = PyMem_Calloc(self->nouts + 1, sizeof(OutSpec));
    if (!self->tensors || !self->floats || !self->ints || !self->outs) {
        PyErr_NoMemory();
        return -1;
    }
    for (k = 0; k < self->ntensors; k++) {
        PyObject *row = PyTuple_GetItem(tensors, k);
        if (int_item(row, 0, &a) < 0 || int_item(row, 1, &s) < 0)
            return -1;
        if (a < 0 || a >= self->n_in)
            return bad("a tensor's argument position is out of range");
        if (slot_ok(self, s, kinds, KIND_POINTER) < 0)
            return -1;
        self->tensors[k].arg = a;
        self->tensors[k].slot = (int)s;
        self->tensors[k].dtype = PyTuple_GetItem(row, 2);
        Py_INCREF(self->tensors[k].dtype);
    }
    for (k = 0; k < self->nfloats; k++) {
        PyObject *row = PyTuple_GetItem(floats, k);
        if (int_item(row, 0, &a) < 0 || int_item(row, 1, &s) < 0)
            return -1;
        if (a < 0 || a >= self->n_in)
            return bad("a float's argument position is out of range");
        if (slot_ok(self, s, kinds, KIND_FLOAT) < 0)
            return -1;
        self->floats[k].arg = a;
        self->floats[k].slot = (int)s;
    }
    for (k = 0; k < self->nints; k++) {
        PyObject *row = PyTuple_GetItem(ints, k);
        IntIn *ii = &self->ints[k];
        long long lo, hi;
        if (int_item(row, 0, &a) < 0 || int_item(row, 1, &s) < 0)
            return -1;
        if (a < 0 || a >= self->n_in)
            return bad("an int's argument position is out of range");
        if (slot_ok(self, s, kinds, KIND_INT) < 0)
            return -1;
        lo = PyLong_AsLongLong(PyTuple_GetItem(row, 2));
        hi = PyLong_AsLongLong(PyTuple_GetItem(row, 3));
        if (PyErr_Occurred())
            return -1;
        ii->arg = a;
        ii->slot = (int)s;
        ii->lo = lo;
        ii->hi = hi;
        ii->is_symbol = PyObject_IsTrue(PyTuple_GetItem(row, 4));
        if (ii->is_symbol < 0)
            return -1;
        self->nsymbols += ii->is_symbol;
    }
    if (self->ntensors + self->nsymbols > MAX_KEY)
        return bad("too many tensors and symbols for the key");
    for (k = 0; k < self->nouts; k++) {
        PyObject *row = PyTuple_GetItem(outs, k);
        if (int_item(row, 0, &s) < 0)
            return -1;
        if (slot_ok(self, s, kinds, KIND_POINTER) < 0)
            return -1;
        self->outs[k].slot = (int)s;
        self->outs[k].dtype = PyTuple_GetItem(row, 1);
        Py_INCREF(self->outs[k].dtype);
    }
    return 0;
}

/* Whether a parameter of `code` can take value slot `slot` as read from the call. */
static int param_ok(FastCall *self, const unsigned char *kinds, int slot, char code) {
    int k;
    int64_t lo, hi;
    switch (kinds[slot]) {
    case KIND_POINTER:
        return code == 'Q' ? 0 : bad("a tensor parameter is not a 64-bit pointer");
    case KIND_FLOAT:
        if (code == 'd')
            return 0;
        if (code != 'f')
            return bad("a float scalar's parameter is not float32/float64");
        for (k = 0; k < self->nfloats; k++)
            if (self->floats[k].slot == slot)
                self->floats[k].as_f32 = 1;
        return 0;
    case KIND_INT:
        if (code_range(code, &lo, &hi) < 0)
            return bad("an int scalar's parameter is not an integer");
        for (k = 0; k < self->nints; k++)
            if (self->ints[k].slot == slot &&
                (self->ints[k].lo < lo || self->ints[k].hi > hi))
                return bad("an int scalar's range does not fit its parameter");
        return 0;
    default:
        return bad("a parameter reads a value slot no argument writes");
    }
}

static int read_layouts(FastCall *self, PyObject *layouts, const unsigned char *kinds) {
    int j;
    if (!PyTuple_Check(layouts))
        return bad("layouts must be a tuple");
    if (PyTuple_Size(layouts) > MAX_LAUNCHES)
        return bad("more than 64 launches");
    self->nlayouts = (int)PyTuple_Size(layouts);
    self->layouts = PyMem_Calloc(self->nlayouts + 1, sizeof(Layout));
    if (self->layouts == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    for (j = 0; j < self->nlayouts; j++) {
        PyObject *row = PyTuple_GetItem(layouts, j), *offsets, *dyn;
        Layout *lay = &self->layouts[j];
        long size, v;
        int k;
        if (!PyTuple_Check(row) || PyTuple_Size(row) != 3)
            return bad("a layout is (size, offsets, dynamic)");
        if (int_item(row, 0, &size) < 0)
            return -1;
        offsets = PyTuple_GetItem(row, 1);
        dyn = PyTuple_GetItem(row, 2);
        if (size < 0 || size > MAX_PARAM_BYTES)
            return bad("a parameter block is larger than 4096 bytes");
        if (!PyTuple_Check(offsets) || PyTuple_Size(offsets) > MAX_PARAMS)
            return bad("a launch has more than 512 parameters");
        if (rows(dyn, 3, "dynamic parameters must be (offset, code, slot) rows",
                 &lay->ndyn) < 0)
            return -1;
        lay->size = size;
        lay->nparams = (int)PyTuple_Size(offsets);
        lay->offsets = PyMem_Calloc(lay->nparams + 1, sizeof(uint32_t));
        lay->dyn = PyMem_Calloc(lay->ndyn + 1, sizeof(DynParam));
        if (lay->offsets == NULL || lay->dyn == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        for (k = 0; k < lay->nparams; k++) {
            if (int_item(offsets, k, &v) < 0)
                return -1;
            if (v < 0 || v >= size)
                return bad("a parameter offset is outside its block");
            lay->offsets[k] = (uint32_t)v;
        }
        for (k = 0; k < lay->ndyn; k++) {
            PyObject *item = PyTuple_GetItem(dyn, k), *code;
            DynParam *p = &lay->dyn[k];
            long off, slot;
            const char *c;
            if (int_item(item, 0, &off) < 0 || int_item(item, 2, &slot) < 0)
                return -1;
            code = PyTuple_GetItem(item, 1);
            c = PyUnicode_Check(code) ? PyUnicode_AsUTF8AndSize(code, NULL) : NULL;
            if (c == NULL || strlen(c) != 1 || code_size(c[0]) == 0)
                return bad("a dynamic parameter's code is not one of QqiIhHbBfd");
            if (off < 0 || off + code_size(c[0]) > size)
                return bad("a dynamic parameter lies outside its block");
            if (slot < 0 || slot >= self->nvalues)
                return bad("a dynamic parameter's value slot is out of range");
            if (param_ok(self, kinds, (int)slot, c[0]) < 0)
                return -1;
            p->offset = (uint32_t)off;
            p->code = c[0];
            p->value = (int)slot;
        }
    }
    return 0;
}

static void fastcall_release(FastCall *self);

static PyObject *fastcall_new(PyTypeObject *type, PyObject *args, PyObject *kwargs) {
    PyObject *tensor_type, *empty_like, *raw_stream, *hooks, *states, *tensors, *floats, *ints,
        *outs,
        *layouts;
    Py_ssize_t n_in, nvalues;
    int trust;
    FastCall *self;
    unsigned char kinds[MAX_VALUES];
    allocfunc alloc;
    if (kwargs != NULL && PyDict_Size(kwargs)) {
        PyErr_SetString(PyExc_TypeError, "FastCall takes positional arguments only");
        return NULL;
    }
    if (!PyArg_ParseTuple(args, "OOOOO!nOOOOnOp:FastCall", &tensor_type, &empty_like, &raw_stream,
                          &hooks, &PyDict_Type, &states, &n_in, &tensors, &floats, &ints,
                          &outs, &nvalues, &layouts, &trust))
        return NULL;
    if (!PyType_Check(tensor_type)) {
        PyErr_SetString(PyExc_TypeError, "FastCall: tensor_type must be a type");
        return NULL;
    }
    if (n_in < 0 || nvalues < 0 || nvalues > MAX_VALUES) {
        PyErr_SetString(PyExc_ValueError, "FastCall: more than 256 value slots");
        return NULL;
    }
    alloc = (allocfunc)PyType_GetSlot(type, Py_tp_alloc);
    self = (FastCall *)alloc(type, 0);
    if (self == NULL)
        return NULL;
    self->tensor_type = tensor_type;
    self->empty_like = empty_like;
    self->raw_stream = raw_stream;
    self->hooks = hooks;
    self->states = states;
    Py_INCREF(tensor_type);
    Py_INCREF(empty_like);
    Py_INCREF(raw_stream);
    Py_INCREF(hooks);
    Py_INCREF(states);
    self->cache = PyDict_New();
    self->n_in = n_in;
    self->nvalues = (int)nvalues;
    self->trust_context = trust;
    memset(kinds, KIND_NONE, sizeof kinds);
    if (self->cache == NULL || reader_init(&self->rd, tensor_type) < 0 ||
        read_inputs(self, tensors, floats, ints, outs, kinds) < 0 ||
        read_layouts(self, layouts, kinds) < 0) {
        Py_DECREF(self);
        return NULL;
    }
    return (PyObject *)self;
}

static int fastcall_traverse(FastCall *self, visitproc visit, void *arg) {
    int k;
    Py_VISIT((PyObject *)Py_TYPE((PyObject *)self));
    Py_VISIT(self->tensor_type);
    Py_VISIT(self->empty_like);
    Py_VISIT(self->raw_stream);
    Py_VISIT(self->hooks);
    Py_VISIT(self->states);
    Py_VISIT(self->cache);
    Py_VISIT(self->last_state);
    Py_VISIT(self->rd.dtype.descr);
    Py_VISIT(self->rd.shape.descr);
    Py_VISIT(self->rd.is_contiguous.descr);
    Py_VISIT(self->rd.get_device.descr);
    Py_VISIT(self->rd.data_ptr.descr);
    if (self->tensors)
        for (k = 0; k < self->ntensors; k++)
            Py_VISIT(self->tensors[k].dtype);
    if (self->outs)
        for (k = 0; k < self->nouts; k++)
            Py_VISIT(self->outs[k].dtype);
    return 0;
}

static int fastcall_clear(FastCall *self) {
    Py_CLEAR(self->tensor_type);
    Py_CLEAR(self->empty_like);
    Py_CLEAR(self->raw_stream);
    Py_CLEAR(self->hooks);
    Py_CLEAR(self->states);
    Py_CLEAR(self->cache);
    Py_CLEAR(self->last_state);
    reader_clear(&self->rd);
    return 0;
}

static void fastcall_release(FastCall *self) {
    int k;
    if (self->tensors) {
        for (k = 0; k < self->ntensors; k++)
            Py_XDECREF(self->tensors[k].dtype);
        PyMem_Free(self->tensors);
        self->tensors = NULL;
    }
    if (self->outs) {
        for (k = 0; k < self->nouts; k++)
            Py_XDECREF(self->outs[k].dtype);
        PyMem_Free(self->outs);
        self->outs = NULL;
    }
    PyMem_Free(self->floats);
    PyMem_Free(self->ints);
    self->floats = NULL;
    self->ints = NULL;
    if (self->layouts) {
        for (k = 0; k < self->nlayouts; k++) {
            PyMem_Free(self->layouts[k].offsets);
            PyMem_Free(self->layouts[k].dyn);
        }
        PyMem_Free(self->layouts);
        self->layouts = NULL;
    }
    PyMem_Free(self->last_funcs);
    self->last_funcs = NULL;
}

static void fastcall_dealloc(FastCall *self) {
    PyTypeObject *type = Py_TYPE((PyObject *)self);
    freefunc tp_free = (freefunc)PyType_GetSlot(type, Py_tp_free);
    PyObject_GC_UnTrack((PyObject *)self);
    fastcall_clear(self);
    fastcall_release(self);
    tp_free((PyObject *)self);
    Py_DECREF((PyObject *)type);
}

static PyObject *fastcall_get_fast_calls(FastCall *self, void *closure) {
    (void)closure;
    return PyLong_FromSsize_t(self->fast_calls);
}

static PyObject *fastcall_get_entries(FastCall *self, void *closure) {
    (void)closure;
    return PyLong_FromSsize_t(self->cache ? PyDict_Size(self->cache) : 0);
}

static PyMethodDef fastcall_methods[] = {
    {"call", (PyCFunction)(void (*)(void))fastcall_call, METH_FASTCALL,
     "call(args, out, stream): launch like the PyTorch fast path, or hand the call to "
     "hooks.slow(args, out, stream) when it does not fit."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef fastcall_getset[] = {
    {"fast_calls", (getter)fastcall_get_fast_calls, NULL,
     "calls completed here (not handed to hooks.slow)", NULL},
    {"entries", (getter)fastcall_get_entries, NULL, "distinct keys cached", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyType_Slot fastcall_slots[] = {
    {Py_tp_new, fastcall_new},
    {Py_tp_dealloc, fastcall_dealloc},
    {Py_tp_traverse, fastcall_traverse},
    {Py_tp_clear, fastcall_clear},
    {Py_tp_methods, fastcall_methods},
    {Py_tp_getset, fastcall_getset},
    {Py_tp_doc, "FastCall(tensor_type, empty_like, raw_stream, hooks, states, n_in, tensors, floats, "
                "ints, outputs, n_values, layouts, trust_context): the PyTorch fast path of one "
                "program (built by runtime/fast_native.py)."},
    {0, NULL},
};

static PyType_Spec fastcall_spec = {
    "kernelpack.runtime._launch.FastCall", sizeof(FastCall), 0,
    Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC, fastcall_slots,
};

/* ---- CallBase: Program.__call__ without a Python frame -------------------------------------
 *
 * Program(*args, out=..., stream=...) in Python costs about half a microsecond before it
 * reaches the fast path (building *args, **kwargs and the keyword-only defaults), a tenth of a
 * small launch. loader.Program derives from this type when the extension is built: calling an
 * instance forwards (args, out, stream) to self._kp_bound.call when the program is bound and
 * the only keywords are out= and stream=; anything else goes to self._kp_general_call(*args,
 * **kwargs), the Python path (kernelpack.runtime.call_program). */

static PyObject *s_kp_bound, *s_call, *s_general_call, *s_out, *s_stream;

static int keyword_is(PyObject *key, PyObject *name) {
    if (key == name)
        return 1;
    return PyUnicode_Check(key) && PyUnicode_Compare(key, name) == 0;
}

/* out= or stream= into a[2] / a[3] (the bound call's arguments); 0 for any other keyword
 * (named inputs: the general path merges them). */
static int take_keyword(PyObject *key, PyObject *value, PyObject **a) {
    if (keyword_is(key, s_out))
        a[2] = value;
    else if (keyword_is(key, s_stream))
        a[3] = value;
    else
        return 0;
    return 1;
}

static PyObject *callbase_call(PyObject *self, PyObject *args, PyObject *kwargs) {
    PyObject *bound = PyObject_GetAttr(self, s_kp_bound), *method, *result;
    if (bound == NULL)
        return NULL;
    if (bound != Py_None) {
        PyObject *a[4], *key, *value;
        Py_ssize_t pos = 0;
        int plain = 1;
        a[0] = bound;
        a[1] = args;
        a[2] = Py_None;
        a[3] = Py_None;
        if (kwargs != NULL)
            while (plain && PyDict_Next(kwargs, &pos, &key, &value))
                plain = take_keyword(key, value, a);
        if (plain) {
            result = call_method(s_call, a, 4);
            Py_DECREF(bound);
            return result;
        }
    }
    Py_DECREF(bound);
    method = PyObject_GetAttr(self, s_general_call);
    if (method == NULL)
        return NULL;
    result = PyObject_Call(method, args, kwargs);
    Py_DECREF(method);
    return result;
}

#if defined(Py_LIMITED_API) && Py_LIMITED_API + 0 >= 0x030C0000
/* From 3.12 a heap type may take vectorcall in the limited API, and Python subclasses such as
 * Program inherit it: a call then builds neither the keywords dict nor the arguments tuple
 * of tp_call (about 0.2 us on an H200 host), only the tuple the fast path takes. */
#define KP_CALLBASE_VECTORCALL 1

typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
} CallBaseObject;

static PyObject *callbase_vectorcall(PyObject *self, PyObject *const *args, size_t nargsf,
                                     PyObject *kwnames) {
    Py_ssize_t n = PyVectorcall_NARGS(nargsf), nkw = kwnames ? PyTuple_Size(kwnames) : 0, k;
    PyObject *bound = PyObject_GetAttr(self, s_kp_bound), *method, *result;
    if (bound == NULL)
        return NULL;
    if (bound != Py_None) {
        PyObject *a[4];
        int plain = 1;
        a[0] = bound;
        a[2] = Py_None;
        a[3] = Py_None;
        for (k = 0; plain && k < nkw; k++)
            plain = take_keyword(PyTuple_GetItem(kwnames, k), args[n + k], a);
        if (plain) {
            a[1] = PyTuple_New(n);
            if (a[1] == NULL) {
                Py_DECREF(bound);
                return NULL;
            }
            for (k = 0; k < n; k++) {
                Py_INCREF(args[k]);
                PyTuple_SetItem(a[1], k, args[k]);
            }
            result = call_method(s_call, a, 4);
            Py_DECREF(a[1]);
            Py_DECREF(bound);
            return result;
        }
    }
    Py_DECREF(bound);
    method = PyObject_GetAttr(self, s_general_call);
    if (method == NULL)
        return NULL;
    result = PyObject_Vectorcall(method, args, nargsf & ~PY_VECTORCALL_ARGUMENTS_OFFSET, kwnames);
    Py_DECREF(method);
    return result;
}

static PyObject *callbase_new(PyTypeObject *type, PyObject *args, PyObject *kwargs) {
    allocfunc alloc = (allocfunc)PyType_GetSlot(type, Py_tp_alloc);
    PyObject *self = alloc(type, 0);
    (void)args;
    (void)kwargs;
    if (self != NULL)
        ((CallBaseObject *)self)->vectorcall = callbase_vectorcall;
    return self;
}

static PyMemberDef callbase_members[] = {
    {"__vectorcalloffset__", Py_T_PYSSIZET, offsetof(CallBaseObject, vectorcall), Py_READONLY,
     NULL},
    {NULL, 0, 0, 0, NULL},
};
#endif

static PyType_Slot callbase_slots[] = {
    {Py_tp_call, callbase_call},
#ifdef KP_CALLBASE_VECTORCALL
    {Py_tp_new, callbase_new},
    {Py_tp_members, callbase_members},
#endif
    {Py_tp_doc, "Base of loader.Program: calling an instance launches through its bound fast "
                "path (see runtime/_fastcall.c)."},
    {0, NULL},
};

static PyType_Spec callbase_spec = {
    "kernelpack.runtime._launch.CallBase",
#ifdef KP_CALLBASE_VECTORCALL
    sizeof(CallBaseObject), 0,
    Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_VECTORCALL,
#else
    sizeof(PyObject), 0, Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE,
#endif
    callbase_slots,
};

static PyObject *forget_contexts(PyObject *self, PyObject *unused) {
    (void)self;
    (void)unused;
    context_epoch++;
    Py_RETURN_NONE;
}

static PyMethodDef module_functions[] = {
    {"forget_contexts", forget_contexts, METH_NOARGS,
     "forget_contexts(): every thread asks for its current context again on its next "
     "default-stream launch."},
    {NULL, NULL, 0, NULL},
};

static int intern(PyObject **where, const char *text) {
    *where = PyUnicode_InternFromString(text);
    return *where == NULL ? -1 : 0;
}

int kp_fastcall_init(PyObject *module) {
    if (intern(&s_flat, "flat") < 0 ||
        intern(&s_allocate, "allocate") < 0 || intern(&s_entry, "entry") < 0 ||
        intern(&s_confirm_context, "confirm_context") < 0 ||
        intern(&s_recover, "recover") < 0 || intern(&s_launch_failed, "launch_failed") < 0 ||
        intern(&s_slow, "slow") < 0 || intern(&s_stream_handle, "stream_handle") < 0)
        return -1;
    if (intern(&s_kp_bound, "_kp_bound") < 0 || intern(&s_call, "call") < 0 ||
        intern(&s_general_call, "_kp_general_call") < 0 || intern(&s_out, "out") < 0 ||
        intern(&s_stream, "stream") < 0)
        return -1;
    {
        PyObject *base = PyType_FromSpec(&callbase_spec);
        if (base == NULL)
            return -1;
        if (PyModule_AddObject(module, "CallBase", base) < 0) {
            Py_DECREF(base);
            return -1;
        }
    }
#ifdef KP_CALLBASE_VECTORCALL
    if (PyModule_AddIntConstant(module, "CALL_VECTORCALL", 1) < 0)
#else
    if (PyModule_AddIntConstant(module, "CALL_VECTORCALL", 0) < 0)
#endif
        return -1;
    FastCallType = (PyTypeObject *)PyType_FromSpec(&fastcall_spec);
    if (FastCallType == NULL)
        return -1;
    Py_INCREF((PyObject *)FastCallType);
    if (PyModule_AddObject(module, "FastCall", (PyObject *)FastCallType) < 0) {
        Py_DECREF(FastCallType);
        return -1;
    }
    return PyModule_AddFunctions(module, module_functions);
}
