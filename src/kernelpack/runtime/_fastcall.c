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
 * out= arrays that share memory) goes to the general path *before* anything is allocated or
 * launched, and the general path explains any error; a stream of another device is refused
 * here, before anything is allocated, by hooks.stream_handle with the general path's words.
 *
 * Per-call state lives on the C stack (values, the parameter block, the kernelParams array),
 * so concurrent threads never share a block and need no lock; the GIL is released only around
 * the driver call. Everything that depends on a shape comes from Python once per distinct key
 * (hooks.entry(key): output shapes, which input each output may be allocated like, and per
 * launch its dimensions and a parameter-block template holding the planner's computed values),
 * so the expressions are the planner's, never evaluated here.
 *
 * Python runs in the middle of a call (the tensors' attributes, a key's hashing and release,
 * the hooks, finalizers) and may call again, clear the entry cache or drop the device state:
 * whatever the call uses after such a point it holds a reference to (the entry's capsule, the
 * state), function handles are copied before the state they replace is released, and nesting
 * is bounded (fastcall_call). tests/runtime/test_review11_fastcall_*.py try each.
 *
 * The current context: a launch on a default stream (handle < 3) goes to the thread's current
 * context. A thread remembers the device whose primary context it last confirmed (only when
 * the hooks say that may be trusted: one visible device); forget_contexts() makes every thread
 * ask again. A failed launch on a remembered context asks the hooks to check it and launches
 * once more when it had changed (fastpath.py's FastCore.relaunch, the same rule).
 */
#include "_fastcall.h"

#include <math.h>
#include <string.h>

static PyTypeObject *FastCallType = NULL;

static PyObject *s_flat, *s_allocate, *s_scratch, *s_entry, *s_context_was_lost,
    *s_pop_context, *s_launch_failed, *s_slow, *s_stream_handle, *s_ptr, *s_device_id;

/* The remembered context (see the top): valid while epoch matches context_epoch. */
static long context_epoch = 1;
static KP_THREAD_LOCAL long tls_epoch = 0;
static KP_THREAD_LOCAL long tls_device = -1;

/* How deep this thread's FastCall calls are nested (see fastcall_call). */
#define MAX_NESTING 32
static KP_THREAD_LOCAL int tls_nesting = 0;

/* ---- small helpers ------------------------------------------------------------------------ */

/* hooks.<name>(arg): a new reference, NULL with an exception set. */
static PyObject *call_hook(FastCall *self, PyObject *name, PyObject *arg) {
    PyObject *a[2];
    a[0] = self->hooks;
    a[1] = arg;
    return call_method(name, a, 2);
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

/* obj.get_device() into *device. 1: read; 0: not an int of C long's range (the general path
 * meets it and explains, as the closure's struct packing sends it there); -1: error. */
static int device_of(const Reader *rd, PyObject *obj, long *device) {
    PyObject *r = call_access(&rd->get_device, obj);
    int overflow;
    if (r == NULL)
        return -1;
    *device = PyLong_AsLongAndOverflow(r, &overflow);
    Py_DECREF(r);
    if (*device == -1 && PyErr_Occurred()) { /* not an int (its __index__ raised, too) */
        PyErr_Clear();
        return 0;
    }
    return !overflow;
}

/* obj.data_ptr() into *ptr. 1: read (a null tensor pointer is fine); 0: not an int in
 * [0, 2**64) (the general path says so); -1: error. */
static int pointer_of(const Reader *rd, PyObject *obj, uint64_t *ptr) {
    PyObject *r = call_access(&rd->data_ptr, obj);
    if (r == NULL)
        return -1;
    *ptr = (uint64_t)PyLong_AsUnsignedLongLong(r);
    Py_DECREF(r);
    if (*ptr == (uint64_t)-1 && PyErr_Occurred()) { /* not an int, negative or too large */
        PyErr_Clear();
        return 0;
    }
    return 1;
}

/* 1: r is expected; 0: not; -1: r is NULL (an error is set). Takes r's reference. */
static int is_object(PyObject *r, PyObject *expected) {
    int same;
    if (r == NULL)
        return -1;
    same = r == expected;
    Py_DECREF(r);
    return same;
}

/* 1: obj.dtype is dtype; 0: not; -1: error. */
static int has_dtype(const Reader *rd, PyObject *obj, PyObject *dtype) {
    return is_object(read_attr(&rd->dtype, obj), dtype);
}

/* 1: obj is one of torch's lazy views (is_conj() or is_neg() is True: its memory does not
 * hold its values, see fastpath.lazy_view_checks); 0: not; -1: error. */
static int lazy_view(const Reader *rd, PyObject *obj) {
    int r = is_object(call_access(&rd->is_conj, obj), Py_True);
    return r != 0 ? r : is_object(call_access(&rd->is_neg, obj), Py_True);
}

/* 1: obj is C-contiguous (torch: is_contiguous() is True; cupy: _c_contiguous is True);
 * 0: not; -1: error. */
static int contiguous(const FastCall *self, PyObject *obj) {
    const Access *a = &self->rd.is_contiguous;
    return is_object(self->cupy ? read_attr(a, obj) : call_access(a, obj), Py_True);
}

/* A cupy array's memory: data.ptr into *ptr and, when device is not NULL, data.device_id
 * into *device. -1 with an exception set on failure. */
static int cupy_memory(const Reader *rd, PyObject *obj, uint64_t *ptr, long *device) {
    PyObject *mem = read_attr(&rd->data, obj), *v;
    int failed;
    if (mem == NULL)
        return -1;
    v = PyObject_GetAttr(mem, s_ptr);
    failed = v == NULL;
    if (!failed) {
        *ptr = (uint64_t)PyLong_AsUnsignedLongLong(v);
        Py_DECREF(v);
        failed = PyErr_Occurred() != NULL;
    }
    if (!failed && device != NULL) {
        v = PyObject_GetAttr(mem, s_device_id);
        failed = v == NULL;
        if (!failed) {
            *device = PyLong_AsLong(v);
            Py_DECREF(v);
            failed = *device == -1 && PyErr_Occurred();
        }
    }
    Py_DECREF(mem);
    return failed ? -1 : 0;
}

/* What the call needs of one array: of this path's exact type, with this dtype, contiguous;
 * its pointer into *ptr, its device into *device and (shape not NULL) its shape, a new
 * reference, into *shape. 1: read; 0: the general path takes the call; -1: error. */
static int read_array(FastCall *self, PyObject *obj, PyObject *dtype, uint64_t misaligned,
                      uint64_t *ptr, long *device, PyObject **shape) {
    const Reader *rd = &self->rd;
    int r;
    if ((PyObject *)Py_TYPE(obj) != self->tensor_type)
        return 0;
    if ((r = has_dtype(rd, obj, dtype)) < 0)
        return r;
    if (r == 0) { /* NumPy dtypes are compared by identity, then equality (fast_cupy.py) */
        PyObject *d;
        if (!self->cupy || (d = read_attr(&rd->dtype, obj)) == NULL)
            return self->cupy ? -1 : 0;
        r = PyObject_RichCompareBool(d, dtype, Py_EQ);
        Py_DECREF(d);
        if (r <= 0)
            return r;
    }
    if ((r = contiguous(self, obj)) < 0 && PyErr_ExceptionMatches(PyExc_Exception)) {
        PyErr_Clear(); /* is_contiguous() raised (a sparse layout): the general path explains */
        return 0;
    }
    if (r <= 0)
        return r;
    if (self->cupy) {
        if (cupy_memory(rd, obj, ptr, device) < 0)
            return -1;
        if (*ptr & misaligned)
            return 0; /* the general path refuses it, naming the argument */
    } else {
        if ((r = device_of(rd, obj, device)) <= 0)
            return r;
        if ((r = pointer_of(rd, obj, ptr)) < 0 && PyErr_ExceptionMatches(PyExc_Exception)) {
            PyErr_Clear(); /* data_ptr() raised (a sparse tensor has no storage): the general */
            return 0;      /* path names the argument and what is wrong with it */
        }
        if (r <= 0)
            return r;
    }
    if (shape != NULL && (*shape = read_attr(&rd->shape, obj)) == NULL)
        return -1;
    return 1;
}

/* C-contiguity of a DLTensor as torch's is_contiguous() decides it: size-1 dims' strides do
 * not matter, and an empty tensor is contiguous. */
static int dl_contiguous(const KpDLTensor *t) {
    int64_t expect = 1;
    int k;
    if (t->strides == NULL)
        return 1;
    for (k = 0; k < t->ndim; k++)
        if (t->shape[k] == 0)
            return 1;
    for (k = t->ndim - 1; k >= 0; k--) {
        if (t->shape[k] != 1 && t->strides[k] != expect)
            return 0;
        expect *= t->shape[k];
    }
    return 1;
}

/* read_array through the exchange API: one C call of torch's instead of five attribute reads.
 * The DLTensor into *t (its shape borrowed from the tensor), the pointer into *ptr and the
 * device into *device (-1 for host memory, as get_device() says). 1: read; 0: the general path
 * takes it (whatever torch refused to describe, too: its error is cleared, and the general
 * path meets it again and explains). */
static int read_dl(FastCall *self, PyObject *obj, KpDLDataType want, uint64_t *ptr,
                   long *device, KpDLTensor *t) {
    if ((PyObject *)Py_TYPE(obj) != self->tensor_type)
        return 0;
    if (self->dlx->dltensor_from_py_object_no_sync(obj, t) != 0) {
        PyErr_Clear();
        return 0;
    }
    if (t->dtype.code != want.code || t->dtype.bits != want.bits || t->dtype.lanes != 1 ||
        t->ndim < 0 || t->ndim > MAX_DIMS || !dl_contiguous(t))
        return 0;
    if (t->device.device_type == KP_DL_CUDA)
        *device = t->device.device_id;
    else if (t->device.device_type == KP_DL_CPU)
        *device = -1;
    else
        return 0;
    *ptr = (uint64_t)(uintptr_t)t->data + t->byte_offset;
    return 1;
}

/* 1: the DLTensor's shape is the tuple of ints `shape`; 0: not; -1: error. */
static int dl_shape_is(const KpDLTensor *t, PyObject *shape) {
    int k;
    if (!PyTuple_Check(shape) || PyTuple_Size(shape) != t->ndim)
        return 0;
    for (k = 0; k < t->ndim; k++) {
        long long d = PyLong_AsLongLong(PyTuple_GetItem(shape, k));
        if (d == -1 && PyErr_Occurred())
            return -1;
        if (d != t->shape[k])
            return 0;
    }
    return 1;
}

/* An output just allocated: its pointer into *ptr (through the exchange API when it is of the
 * API's own type, else data_ptr()). -1 with an exception set on failure. */
static int output_pointer(FastCall *self, PyObject *obj, uint64_t *ptr) {
    if (self->cupy)
        return cupy_memory(&self->rd, obj, ptr, NULL);
    if (self->dlx != NULL && (PyObject *)Py_TYPE(obj) == self->tensor_type) {
        KpDLTensor t;
        if (self->dlx->dltensor_from_py_object_no_sync(obj, &t) == 0) {
            *ptr = (uint64_t)(uintptr_t)t.data + t.byte_offset;
            return 0;
        }
        PyErr_Clear(); /* data_ptr() says what is wrong, if anything is */
    }
    switch (pointer_of(&self->rd, obj, ptr)) {
    case 1:
        return 0;
    case 0:
        PyErr_Format(PyExc_TypeError, "FastCall: an allocated output's data_ptr() is not an "
                     "int in [0, 2**64) (an output of %R)", (PyObject *)Py_TYPE(obj));
        break;
    }
    return -1;
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

/* ---- entries (one per distinct key) ------------------------------------------------------- */

static void entry_free(Entry *e) {
    int k;
    if (e == NULL)
        return;
    Py_XDECREF(e->shapes);
    PyMem_Free(e->likes);
    PyMem_Free(e->views);
    if (e->overlaps != NULL)
        for (k = 0; k < e->noverlaps; k++)
            PyMem_Free(e->overlaps[k].spans);
    PyMem_Free(e->overlaps);
    PyMem_Free(e->pairs);
    PyMem_Free(e->scratch);
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

/* hooks.entry's (total, ((value slot, value), ...)) pairs of `what` (the overlap's out= size
 * and the inputs' spans, the scratch's size and the buffers' offsets): the total into *total,
 * the pairs into a new array *items of *n. -1 with an exception set when malformed. */
static int slot_values(FastCall *self, PyObject *answer, const char *what, uint64_t *total,
                       Py_ssize_t *n, SlotValue **items) {
    PyObject *pairs;
    Py_ssize_t k;
    if (!PyTuple_Check(answer) || PyTuple_Size(answer) != 2 ||
        !PyTuple_Check(pairs = PyTuple_GetItem(answer, 1))) {
        PyErr_Format(PyExc_TypeError, "FastCall: hooks.entry's %s is (total, ((slot, value), "
                     "...))", what);
        return -1;
    }
    *total = PyLong_AsUnsignedLongLong(PyTuple_GetItem(answer, 0));
    if (PyErr_Occurred())
        return -1;
    *n = PyTuple_Size(pairs);
    *items = PyMem_Calloc(*n ? *n : 1, sizeof(SlotValue));
    if (*items == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    for (k = 0; k < *n; k++) {
        PyObject *item = PyTuple_GetItem(pairs, k);
        long slot;
        if (!PyTuple_Check(item) || PyTuple_Size(item) != 2) {
            PyErr_Format(PyExc_TypeError, "FastCall: an item of hooks.entry's %s is (slot, "
                         "value)", what);
            return -1;
        }
        slot = PyLong_AsLong(PyTuple_GetItem(item, 0));
        (*items)[k].value = PyLong_AsUnsignedLongLong(PyTuple_GetItem(item, 1));
        if (PyErr_Occurred())
            return -1;
        if (slot < 0 || slot >= self->nvalues) {
            PyErr_Format(PyExc_ValueError, "FastCall: a value slot of hooks.entry's %s is out "
                         "of range", what);
            return -1;
        }
        (*items)[k].slot = (int)slot;
    }
    return 0;
}

/* The scratch of hooks.entry's answer: None, or (nbytes, ((value slot, offset), ...)) with
 * every offset within nbytes (an empty buffer may lie at the end, offset == nbytes). */
static int scratch_from(FastCall *self, Entry *e, PyObject *scratch) {
    Py_ssize_t k;
    if (scratch == Py_None)
        return 0;
    if (slot_values(self, scratch, "scratch", &e->scratch_nbytes, &e->nscratch,
                    &e->scratch) < 0)
        return -1;
    for (k = 0; k < e->nscratch; k++)
        if (e->scratch[k].value > e->scratch_nbytes) {
            PyErr_SetString(PyExc_ValueError, "FastCall: a scratch buffer's offset is past "
                            "the scratch's size");
            return -1;
        }
    return 0;
}

/* hooks.entry's overlap: with one output (or none) its (nbytes, ((slot, size), ...)), with
 * several a tuple of one such pair per output (fastpath.FastCore.plan), into e->overlaps. -1
 * with an exception set when malformed. */
static int overlaps_from(FastCall *self, Entry *e, PyObject *overlap) {
    Py_ssize_t k, n = self->nouts > 1 ? self->nouts : 1;
    if (self->nouts > 1 && (!PyTuple_Check(overlap) || PyTuple_Size(overlap) != n)) {
        PyErr_SetString(PyExc_TypeError, "FastCall: hooks.entry's overlap has one (total, "
                        "spans) per output");
        return -1;
    }
    e->overlaps = PyMem_Calloc(n, sizeof(OutOverlap));
    if (e->overlaps == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    for (k = 0; k < n; k++) {
        OutOverlap *o = &e->overlaps[k];
        e->noverlaps = k + 1; /* so entry_free frees what is made */
        if (slot_values(self, self->nouts > 1 ? PyTuple_GetItem(overlap, k) : overlap,
                        "overlap", &o->nbytes, &o->nspans, &o->spans) < 0)
            return -1;
    }
    return 0;
}

/* hooks.entry's written pairs: ((slot a, nbytes a, slot b, nbytes b, both written), ...)
 * into e->pairs. -1 with an exception set when malformed. */
static int pairs_from(FastCall *self, Entry *e, PyObject *pairs) {
    Py_ssize_t k;
    if (!PyTuple_Check(pairs)) {
        PyErr_SetString(PyExc_TypeError, "FastCall: hooks.entry's written pairs are a tuple");
        return -1;
    }
    e->npairs = PyTuple_Size(pairs);
    e->pairs = PyMem_Calloc(e->npairs ? e->npairs : 1, sizeof(WrittenPair));
    if (e->pairs == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    for (k = 0; k < e->npairs; k++) {
        PyObject *item = PyTuple_GetItem(pairs, k);
        WrittenPair *wp = &e->pairs[k];
        long a, b;
        if (!PyTuple_Check(item) || PyTuple_Size(item) != 5) {
            PyErr_SetString(PyExc_TypeError, "FastCall: a written pair is (slot, nbytes, slot, "
                            "nbytes, both written)");
            return -1;
        }
        /* each conversion checked before the next: PyObject_IsTrue may run Python code,
         * which must not start with an exception pending */
        if (((a = PyLong_AsLong(PyTuple_GetItem(item, 0))) == -1 && PyErr_Occurred()) ||
            ((wp->na = PyLong_AsUnsignedLongLong(PyTuple_GetItem(item, 1))) == (uint64_t)-1 &&
             PyErr_Occurred()) ||
            ((b = PyLong_AsLong(PyTuple_GetItem(item, 2))) == -1 && PyErr_Occurred()) ||
            ((wp->nb = PyLong_AsUnsignedLongLong(PyTuple_GetItem(item, 3))) == (uint64_t)-1 &&
             PyErr_Occurred()) ||
            (wp->both_written = PyObject_IsTrue(PyTuple_GetItem(item, 4))) < 0)
            return -1;
        if (a < 0 || a >= self->nvalues || b < 0 || b >= self->nvalues) {
            PyErr_SetString(PyExc_ValueError, "FastCall: a value slot of a written pair is out "
                            "of range");
            return -1;
        }
        wp->a = (int)a;
        wp->b = (int)b;
    }
    return 0;
}

/* Whether a call may not pass the non-empty byte ranges [a, a + na) and [b, b + nb)
 * together: any shared byte when the program writes both, else a partial overlap (the very
 * same range is in-place use). aliasing.conflicts is the Python twin; both fast-path checks
 * below decide with this one test. */
static int conflicts(uint64_t a, uint64_t na, uint64_t b, uint64_t nb, int both_written) {
    return (b >= a ? b - a < na : a - b < nb) && (both_written || a != b || na != nb);
}

/* Whether two arguments of a pair share memory in a way the general path refuses
 * (aliasing.inputs_to_copy_for_written). vals holds the inputs' pointers (read_arguments). */
static int written_conflict(const Entry *e, const Value *vals) {
    Py_ssize_t k;
    for (k = 0; k < e->npairs; k++) {
        const WrittenPair *wp = &e->pairs[k];
        if (conflicts(vals[wp->a].u, wp->na, vals[wp->b].u, wp->nb, wp->both_written))
            return 1;
    }
    return 0;
}

/* The C entry for hooks.entry(key)'s answer (shapes, likes, launches, views, view_out,
 * overlap, scratch[, written pairs]); NULL with an exception set when the answer is malformed
 * (a bug in fast_native.py, reported as such). */
static Entry *entry_from(FastCall *self, PyObject *answer) {
    PyObject *shapes, *likes, *launches, *views;
    Entry *e;
    Py_ssize_t k, n;
    int view_out;
    if (!PyTuple_Check(answer) || (PyTuple_Size(answer) != 7 && PyTuple_Size(answer) != 8)) {
        PyErr_SetString(PyExc_TypeError, "FastCall: hooks.entry must answer None or "
                        "(shapes, likes, launches, views, view_out, overlap, scratch[, "
                        "written pairs])");
        return NULL;
    }
    shapes = PyTuple_GetItem(answer, 0);
    likes = PyTuple_GetItem(answer, 1);
    launches = PyTuple_GetItem(answer, 2);
    views = PyTuple_GetItem(answer, 3);
    view_out = PyObject_IsTrue(PyTuple_GetItem(answer, 4));
    if (view_out < 0)
        return NULL;
    if (!PyTuple_Check(shapes) || !PyTuple_Check(likes) || !PyTuple_Check(launches) ||
        !PyTuple_Check(views) || PyTuple_Size(views) > self->n_in ||
        PyTuple_Size(shapes) != self->nouts || PyTuple_Size(likes) != self->nouts) {
        PyErr_SetString(PyExc_TypeError, "FastCall: hooks.entry answered tuples of the wrong "
                        "kind or length");
        return NULL;
    }
    n = PyTuple_Size(launches);
    if (n > MAX_LAUNCHES) { /* launch_all copies each launch's function onto its stack */
        PyErr_Format(PyExc_ValueError, "FastCall: hooks.entry answered %zd launches (at most "
                     "%d)", n, MAX_LAUNCHES);
        return NULL;
    }
    e = PyMem_Calloc(1, sizeof(Entry));
    if (e == NULL)
        return (Entry *)PyErr_NoMemory();
    Py_INCREF(shapes);
    e->shapes = shapes;
    e->likes = PyMem_Calloc(self->nouts ? self->nouts : 1, sizeof(Py_ssize_t));
    e->launches = PyMem_Calloc(n ? n : 1, sizeof(EntryLaunch));
    e->nviews = PyTuple_Size(views);
    e->views = PyMem_Calloc(e->nviews ? e->nviews : 1, sizeof(Py_ssize_t));
    e->view_out = view_out;
    if (e->likes == NULL || e->launches == NULL || e->views == NULL) {
        entry_free(e);
        return (Entry *)PyErr_NoMemory();
    }
    if (overlaps_from(self, e, PyTuple_GetItem(answer, 5)) < 0 ||
        scratch_from(self, e, PyTuple_GetItem(answer, 6)) < 0 ||
        (PyTuple_Size(answer) == 8 && pairs_from(self, e, PyTuple_GetItem(answer, 7)) < 0)) {
        entry_free(e);
        return NULL;
    }
    for (k = 0; k < e->nviews; k++) {
        e->views[k] = PyLong_AsSsize_t(PyTuple_GetItem(views, k));
        if (e->views[k] == -1 && PyErr_Occurred()) {
            entry_free(e);
            return NULL;
        }
        if (e->views[k] < 0 || e->views[k] >= self->n_in) {
            PyErr_SetString(PyExc_ValueError, "FastCall: a view to check is not an argument");
            entry_free(e);
            return NULL;
        }
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
        long j;
        char *bytes;
        e->nlaunch = (int)k + 1; /* so entry_free frees what is made */
        if (!PyTuple_Check(item) || PyTuple_Size(item) != 9) {
            PyErr_SetString(PyExc_TypeError, "FastCall: a launch is (j, gx, gy, gz, bx, by, "
                            "bz, shared_mem, template)");
            entry_free(e);
            return NULL;
        }
        j = PyLong_AsLong(PyTuple_GetItem(item, 0)); /* checked before it is narrowed */
        if (PyErr_Occurred() || j < 0 || j >= self->nlayouts) {
            PyErr_Clear();
            PyErr_SetString(PyExc_ValueError, "FastCall: a launch's index is out of range");
            entry_free(e);
            return NULL;
        }
        el->j = (int)j;
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

/* The entry for key: a new reference to its capsule, or to Py_None when the key's calls go
 * to the general path (hooks.entry answered None; remembered like an entry); NULL on error.
 * New, not borrowed: what the caller does next may run Python (the key's release runs its
 * shapes' finalizers; a shape's __hash__ runs while the key is stored) and a re-entrant call
 * may clear the cache, which would free a borrowed capsule. */
static PyObject *entry_for(FastCall *self, PyObject *key) {
    PyObject *capsule = PyDict_GetItemWithError(self->cache, key), *answer;
    Entry *e;
    if (capsule != NULL || PyErr_Occurred()) {
        Py_XINCREF(capsule);
        return capsule;
    }
    answer = call_hook(self, s_entry, key);
    if (answer == NULL)
        return NULL;
    if (answer == Py_None) {
        capsule = answer; /* the reference the call answered with */
    } else {
        e = entry_from(self, answer);
        Py_DECREF(answer);
        if (e == NULL)
            return NULL;
        capsule = PyCapsule_New(e, "kernelpack.fastcall.entry", entry_capsule_free);
        if (capsule == NULL) {
            entry_free(e);
            return NULL;
        }
    }
    if (PyDict_Size(self->cache) >= ENTRY_CACHE_SIZE)
        PyDict_Clear(self->cache);
    if (PyDict_SetItem(self->cache, key, capsule) < 0) {
        Py_DECREF(capsule);
        return NULL;
    }
    return capsule;
}

/* The function handles of device state st (st.flat, ints), cached while st stays the same,
 * for the entry's launches into use[]. -1 with an exception set on failure. The handles are
 * copied before the state they replace is released: its release may run Python (a finalizer)
 * that calls again and replaces last_funcs, and another thread may do the same while the GIL
 * is released around a launch. */
static int functions_of(FastCall *self, PyObject *st, const Entry *e, void **use) {
    PyObject *flat, *old_state;
    void **funcs, **old_funcs;
    int j;
    if (st != self->last_state) {
        flat = PyObject_GetAttr(st, s_flat);
        if (flat == NULL)
            return -1;
        if (!PyList_Check(flat) || PyList_Size(flat) != self->nlayouts) {
            Py_DECREF(flat);
            PyErr_SetString(PyExc_ValueError, "FastCall: the device state's function list "
                            "does not match the program's launches");
            return -1;
        }
        funcs = PyMem_Calloc(self->nlayouts ? self->nlayouts : 1, sizeof(void *));
        if (funcs == NULL) {
            Py_DECREF(flat);
            PyErr_NoMemory();
            return -1;
        }
        for (j = 0; j < self->nlayouts; j++) {
            funcs[j] = PyLong_AsVoidPtr(PyList_GetItem(flat, j));
            if (PyErr_Occurred()) {
                Py_DECREF(flat);
                PyMem_Free(funcs);
                return -1;
            }
        }
        Py_DECREF(flat);
        for (j = 0; j < e->nlaunch; j++)
            use[j] = funcs[e->launches[j].j];
        old_funcs = self->last_funcs;
        old_state = self->last_state;
        Py_INCREF(st);
        self->last_state = st;
        self->last_funcs = funcs;
        PyMem_Free(old_funcs);
        Py_XDECREF(old_state);
        return 0;
    }
    for (j = 0; j < e->nlaunch; j++)
        use[j] = self->last_funcs[e->launches[j].j];
    return 0;
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

/* Whether hooks.context_was_lost's answer r is PUSHED (runtime/device.py: 2, Device.enter):
 * the device's context went over another device's; hooks.pop_context follows the launches. */
static int was_pushed(PyObject *r) {
    return PyLong_Check(r) && PyLong_AsLong(r) == 2;
}

/* hooks.pop_context(st), keeping an exception already set. */
static void pop_context(FastCall *self, PyObject *st) {
    PyObject *type, *value, *tb, *r;
    PyErr_Fetch(&type, &value, &tb);
    r = call_hook(self, s_pop_context, st);
    Py_XDECREF(r);
    if (type != NULL)
        PyErr_Restore(type, value, tb);
    else if (r == NULL)
        PyErr_Clear(); /* nothing to report it to: the launches went through */
}

/* A failed launch: on a remembered default-stream context, have the hooks check it and launch
 * again when it had changed; otherwise have them raise the LaunchError. 0: recovered. */
static int recover(FastCall *self, int err, PyObject *st, long device, uint64_t sh,
                   const EntryLaunch *el, void *func, const Value *vals) {
    PyObject *args[10], *r;
    int k;
    if (sh < 3 && tls_epoch == context_epoch && tls_device == device) {
        tls_device = -1;
        r = call_hook(self, s_context_was_lost, st);
        if (r == NULL)
            return -1;
        k = PyObject_IsTrue(r);
        int pushed = k > 0 && was_pushed(r);
        Py_DECREF(r);
        if (k < 0)
            return -1;
        if (k) {
            err = launch_one(self, el, func, (void *)(uintptr_t)sh, vals);
            if (pushed)
                pop_context(self, st);
            else if (!err && self->trust_context) {
                tls_epoch = context_epoch;
                tls_device = device;
            }
            if (!err)
                return 0;
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

/* The call's arguments into vals, the device of the tensors, and the plan-cache key: tensor
 * shapes then symbol scalars, into the tuple `key`, or (exchange-API path, key NULL) as words
 * into words[*nwords]: per tensor its rank and dims, then the symbols. 1: read; 0: the call
 * does not fit (general path); -1: error. */
static int read_arguments(FastCall *self, PyObject *args, Value *vals, PyObject *key,
                          int64_t *words, Py_ssize_t *nwords, long *device) {
    int k, r, nk = 0;
    Py_ssize_t nw = 0;
    long d;
    for (k = 0; k < self->ntensors; k++) {
        const TensorIn *ti = &self->tensors[k];
        PyObject *obj = PyTuple_GetItem(args, ti->arg);
        if (key == NULL) {
            KpDLTensor t;
            int j;
            r = read_dl(self, obj, ti->dl, &vals[ti->slot].u, &d, &t);
            if (r > 0) {
                words[nw++] = t.ndim;
                for (j = 0; j < t.ndim; j++)
                    words[nw++] = t.shape[j];
            }
        } else {
            PyObject *shape = NULL;
            r = read_array(self, obj, ti->dtype, ti->misaligned, &vals[ti->slot].u, &d,
                           &shape);
            if (shape != NULL)
                PyTuple_SetItem(key, nk++, shape); /* steals */
        }
        if (r <= 0)
            return r;
        if (k == 0)
            *device = d;
        else if (d != *device)
            return 0;
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
        if (!ii->is_symbol)
            continue;
        if (key == NULL) {
            words[nw++] = (int64_t)x;
        } else {
            Py_INCREF(v);
            PyTuple_SetItem(key, nk++, v);
        }
    }
    if (nwords != NULL)
        *nwords = nw;
    return 1;
}

/* The plan-cache key of words (see read_arguments) as a tuple: shape tuples, then ints. */
static PyObject *key_of_words(FastCall *self, const int64_t *words) {
    PyObject *key = PyTuple_New(self->ntensors + self->nsymbols), *item;
    Py_ssize_t nw = 0;
    int k, j, ndim;
    if (key == NULL)
        return NULL;
    for (k = 0; k < self->ntensors + self->nsymbols; k++) {
        if (k < self->ntensors) {
            ndim = (int)words[nw++];
            item = PyTuple_New(ndim);
            for (j = 0; item != NULL && j < ndim; j++) {
                PyObject *dim = PyLong_FromLongLong(words[nw++]);
                if (dim == NULL)
                    Py_CLEAR(item);
                else
                    PyTuple_SetItem(item, j, dim);
            }
        } else {
            item = PyLong_FromLongLong(words[nw++]);
        }
        if (item == NULL) {
            Py_DECREF(key);
            return NULL;
        }
        PyTuple_SetItem(key, k, item);
    }
    return key;
}

/* The outputs, allocated like an input where the entry says so, else by hooks.allocate (CuPy:
 * cupy.ndarray); their pointers into vals. With stream=, every output by hooks.allocate(shape,
 * dtype, device, handle), from that stream's pool (torch) or arena (CuPy). Returns the call's
 * result (one output, a tuple, or None). */
static PyObject *allocate_outputs(FastCall *self, const Entry *e, PyObject *args,
                                  PyObject *device_obj, Value *vals, PyObject *handle) {
    PyObject *made[8] = {NULL}, *result;
    int k;
    for (k = 0; k < self->nouts; k++) {
        PyObject *a[5];
        if (handle != NULL) {
            a[0] = self->hooks;
            a[1] = PyTuple_GetItem(e->shapes, k);
            a[2] = self->outs[k].dtype;
            a[3] = device_obj;
            a[4] = handle;
            made[k] = call_method(s_allocate, a, 5);
        } else if (self->cupy) {
            /* cupy.ndarray(shape, dtype): what cupy.empty does, without its Python frame, and
             * cheaper than empty_like's order logic; CuPy's current device is the arrays'. */
            a[0] = PyTuple_GetItem(e->shapes, k);
            a[1] = self->outs[k].dtype;
            made[k] = PyObject_Vectorcall(self->tensor_type, a, 2, NULL);
        } else if (e->likes[k] >= 0) {
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
        if (output_pointer(self, made[k], &vals[self->outs[k].slot].u) < 0)
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

/* The scratch's pointer: an array's as output_pointer reads it, or, for another owner that
 * hooks.scratch returns (arrays._PoolBlock: a block of torch's caching allocator for a stream=
 * handle), its data_ptr() looked up by name, as the tensor type's own data_ptr descriptor
 * refuses any other object. -1 with an exception set on failure. */
static int scratch_pointer(FastCall *self, PyObject *obj, uint64_t *ptr) {
    PyObject *r;
    if (self->cupy || (PyObject *)Py_TYPE(obj) == self->tensor_type)
        return output_pointer(self, obj, ptr);
    if ((r = call_method0(obj, self->rd.data_ptr.name)) == NULL)
        return -1;
    *ptr = (uint64_t)PyLong_AsUnsignedLongLong(r);
    Py_DECREF(r);
    if (*ptr == (uint64_t)-1 && PyErr_Occurred()) {
        PyErr_Format(PyExc_TypeError, "FastCall: a scratch owner's data_ptr() is not an int "
                     "in [0, 2**64) (a %R)", (PyObject *)Py_TYPE(obj));
        return -1;
    }
    return 0;
}

/* The call's scratch (the entry's, one allocation by hooks.scratch(nbytes, device) for the
 * device's current stream, which the call launches on; with stream= hooks.scratch(nbytes,
 * device, sh), for the stream= handle sh: from that stream's pool or stream-ordered, as the
 * general path allocates it), each buffer's pointer into vals; *keep holds it until the
 * launches are queued. -1 with an exception set on failure. */
static int allocate_scratch(FastCall *self, const Entry *e, PyObject *device_obj, Value *vals,
                            int given, uint64_t sh, PyObject **keep) {
    PyObject *a[4], *n, *h = NULL;
    uint64_t base = 0;
    Py_ssize_t k;
    if (e->scratch_nbytes > 0) {
        n = PyLong_FromUnsignedLongLong(e->scratch_nbytes);
        if (n == NULL)
            return -1;
        if (given && (h = PyLong_FromUnsignedLongLong(sh)) == NULL) {
            Py_DECREF(n);
            return -1;
        }
        a[0] = self->hooks;
        a[1] = n;
        a[2] = device_obj;
        a[3] = h;
        *keep = call_method(s_scratch, a, given ? 4 : 3);
        Py_DECREF(n);
        Py_XDECREF(h);
        if (*keep == NULL || scratch_pointer(self, *keep, &base) < 0)
            return -1;
    }
    for (k = 0; k < e->nscratch; k++) /* none at all: every buffer is empty (null) */
        vals[e->scratch[k].slot].u = base == 0 ? 0 : base + e->scratch[k].value;
    return 0;
}

/* One out= array (the output k's, of this tensor type): dtype, contiguity, shape and device
 * as the entry wants, and no conflict with an input; its pointer into *ptr. 1: fits; 0:
 * general path; -1: error. */
static int check_one_out(FastCall *self, const Entry *e, Py_ssize_t k, PyObject *out,
                         long device, const Value *vals, uint64_t *ptr) {
    const OutOverlap *o = &e->overlaps[k];
    PyObject *shape = NULL;
    Py_ssize_t s;
    int r;
    long d;
    if (self->dlx != NULL) {
        KpDLTensor t;
        r = read_dl(self, out, self->outs[k].dl, ptr, &d, &t);
        if (r > 0)
            r = dl_shape_is(&t, PyTuple_GetItem(e->shapes, k));
    } else {
        r = read_array(self, out, self->outs[k].dtype, self->outs[k].misaligned, ptr, &d,
                       &shape);
        if (r > 0)
            r = PyObject_RichCompareBool(shape, PyTuple_GetItem(e->shapes, k), Py_EQ);
        Py_XDECREF(shape);
    }
    if (r <= 0)
        return r;
    if (d != device)
        return 0;
    if (e->view_out && self->lazy_views && (r = lazy_view(&self->rd, out)) != 0)
        return r < 0 ? -1 : 0;
    for (s = 0; s < o->nspans; s++) { /* vals holds the inputs' pointers (read_arguments) */
        uint64_t p = vals[o->spans[s].slot].u, n = o->spans[s].value & ~KP_WRITTEN_SPAN;
        if (conflicts(*ptr, o->nbytes, p, n, (o->spans[s].value & KP_WRITTEN_SPAN) != 0))
            return 0; /* partially overlaps an input, or shares memory with an input the
                       * program writes: the general path refuses it */
    }
    return 1;
}

/* out=: one array of this tensor type for a single output, a tuple of one per output for
 * several (each as check_one_out says, and no two sharing a byte: the general path refuses
 * that); the pointers into vals. 1: fits; 0: general path; -1: error. */
static int check_out(FastCall *self, const Entry *e, PyObject *out, long device, Value *vals) {
    uint64_t ptr;
    Py_ssize_t a, b;
    int r;
    if (self->nouts == 1) {
        r = check_one_out(self, e, 0, out, device, vals, &ptr);
        if (r > 0)
            vals[self->outs[0].slot].u = ptr;
        return r;
    }
    /* exactly a tuple: a namedtuple (torch's structseqs) goes to the general path, which
     * answers a plain tuple of the arrays, as the closures do (review 72a) */
    if (self->nouts < 2 || !PyTuple_CheckExact(out) || PyTuple_Size(out) != self->nouts)
        return 0;
    for (a = 0; a < self->nouts; a++) {
        /* output slots are not the inputs' ones: writing them early leaves the spans intact */
        r = check_one_out(self, e, a, PyTuple_GetItem(out, a), device, vals, &ptr);
        if (r <= 0)
            return r;
        vals[self->outs[a].slot].u = ptr;
    }
    for (a = 0; a < self->nouts; a++)
        for (b = a + 1; b < self->nouts; b++)
            if (e->overlaps[a].nbytes && e->overlaps[b].nbytes && /* empty: shares nothing */
                conflicts(vals[self->outs[a].slot].u, e->overlaps[a].nbytes,
                          vals[self->outs[b].slot].u, e->overlaps[b].nbytes, 1))
                return 0;
    return 1;
}

/* The raw stream handle: the caller's stream= (hooks.stream_handle), else torch's current
 * stream of the device (through the exchange API where there is one). -1 with an exception
 * set on failure. */
static int stream_of(FastCall *self, PyObject *stream, PyObject *device_obj, long device,
                     uint64_t *sh) {
    PyObject *r;
    if (stream == Py_None && self->dlx != NULL && device >= 0) {
        void *current = NULL;
        if (self->dlx->current_work_stream(KP_DL_CUDA, (int32_t)device, &current) != 0)
            return -1;
        *sh = (uint64_t)(uintptr_t)current;
        return 0;
    }
    if (stream != Py_None) { /* hooks.stream_handle(stream, device): refuses another device's */
        PyObject *a[3];
        a[0] = self->hooks;
        a[1] = stream;
        a[2] = device_obj != NULL ? device_obj : Py_None;
        r = call_method(s_stream_handle, a, 3);
    } else if (self->cupy) { /* cupy.cuda.get_current_stream().ptr */
        PyObject *current = PyObject_Vectorcall(self->raw_stream, NULL, 0, NULL);
        if (current == NULL)
            return -1;
        r = PyObject_GetAttr(current, s_ptr);
        Py_DECREF(current);
    } else {
        r = PyObject_Vectorcall(self->raw_stream, &device_obj, 1, NULL);
    }
    if (r == NULL)
        return -1;
    *sh = (uint64_t)PyLong_AsUnsignedLongLong(r);
    Py_DECREF(r);
    return PyErr_Occurred() ? -1 : 0;
}

/* Every launch of the entry, in order, on the device state st (the current context checked
 * first on a default stream; pushed over another device's, it is popped after). -1 with an
 * exception set on failure. */
static int launch_all(FastCall *self, const Entry *e, PyObject *st, long device, uint64_t sh,
                      const Value *vals) {
    void *use[MAX_LAUNCHES];
    int k, pushed = 0, rc = 0;
    if (sh < 3 && !(tls_epoch == context_epoch && tls_device == device)) {
        PyObject *r = call_hook(self, s_context_was_lost, st);
        if (r == NULL)
            return -1;
        pushed = was_pushed(r);
        Py_DECREF(r);
        if (self->trust_context && !pushed) {
            tls_epoch = context_epoch;
            tls_device = device;
        }
    }
    /* copied: another thread may replace last_funcs while the GIL is released */
    if (functions_of(self, st, e, use) < 0)
        rc = -1;
    for (k = 0; rc == 0 && k < e->nlaunch; k++) {
        const EntryLaunch *el = &e->launches[k];
        int err = launch_one(self, el, use[k], (void *)(uintptr_t)sh, vals);
        if (err && recover(self, err, st, device, sh, el, use[k], vals) < 0)
            rc = -1;
    }
    if (pushed)
        pop_context(self, st);
    return rc;
}

/* The entry of the key `words` (exchange-API path; a new reference, to Py_None when the
 * planner refuses it, NULL with *fits -1 on error): the last call's when the key is the same
 * (no Python key is built), else the cache's through the key tuple, which then becomes the
 * last one. */
static PyObject *remembered_entry(FastCall *self, const int64_t *words, Py_ssize_t nwords,
                                  int *fits) {
    PyObject *key, *capsule;
    if (nwords == self->last_len && self->last_capsule != NULL &&
        memcmp(words, self->last_key, (size_t)nwords * sizeof(int64_t)) == 0) {
        Py_INCREF(self->last_capsule);
        return self->last_capsule;
    }
    key = key_of_words(self, words);
    if (key == NULL) {
        *fits = -1;
        return NULL;
    }
    capsule = entry_for(self, key);
    Py_DECREF(key);
    if (capsule == NULL) {
        *fits = -1;
        return NULL;
    }
    if (capsule != Py_None) { /* the cache may drop it: the last key holds its own reference */
        PyObject *old = self->last_capsule;
        Py_INCREF(capsule);
        self->last_capsule = capsule;
        memcpy(self->last_key, words, (size_t)nwords * sizeof(int64_t));
        self->last_len = nwords;
        Py_XDECREF(old); /* last: the fields are consistent whatever its release runs */
    }
    return capsule;
}

static PyObject *fastcall_run(FastCall *self, PyObject *const *argv, Py_ssize_t nargs) {
    PyObject *args, *out, *stream, *key, *device_obj = NULL, *capsule = NULL, *st = NULL;
    PyObject *result = NULL, *scratch = NULL, *a[4];
    Value vals[MAX_VALUES];
    const Entry *e;
    long device = -1;
    uint64_t sh;
    int fits;
    Py_ssize_t k, nwords = 0;
    int64_t words[KEY_WORDS];
    if (nargs != 3) {
        PyErr_Format(PyExc_TypeError, "FastCall.call takes (args, out, stream) (got %zd "
                     "arguments)", nargs);
        return NULL;
    }
    args = argv[0];
    out = argv[1];
    stream = argv[2];
    if (!PyTuple_Check(args) || PyTuple_Size(args) != self->n_in)
        goto slow;
    key = NULL;
    if (self->dlx == NULL) {
        key = PyTuple_New(self->ntensors + self->nsymbols);
        if (key == NULL)
            return NULL;
    }
    fits = read_arguments(self, args, vals, key, words, &nwords, &device);
    if (fits > 0 && self->cupy) { /* CuPy allocates and streams on its current device */
        PyObject *current = PyObject_Vectorcall(self->current_device, NULL, 0, NULL);
        long c = current == NULL ? -1 : PyLong_AsLong(current);
        Py_XDECREF(current);
        fits = c == -1 && PyErr_Occurred() ? -1 : c == device;
    }
    if (fits > 0) {
        device_obj = PyLong_FromLong(device);
        fits = device_obj == NULL ? -1 : 1;
    }
    if (fits > 0) {
        /* held from here: hooks.entry and the key's hashing run Python, which may empty the
         * states (a device state is freed with the last reference to it) */
        st = PyDict_GetItemWithError(self->states, device_obj);
        Py_XINCREF(st);
        /* none: a first call on this device (or host memory); the general path binds it */
        fits = st != NULL ? 1 : PyErr_Occurred() ? -1 : 0;
    }
    /* the capsule is a new reference (entry_for says why), kept while in use: another
     * thread, or a re-entrant call, may clear the cache meanwhile */
    if (fits > 0 && key == NULL)
        capsule = remembered_entry(self, words, nwords, &fits);
    else if (fits > 0)
        capsule = entry_for(self, key); /* Py_None: the planner refuses the key */
    if (fits > 0)
        fits = capsule == NULL ? -1 : capsule != Py_None;
    Py_XDECREF(key);
    if (fits <= 0) {
        Py_XDECREF(capsule);
        Py_XDECREF(st);
        Py_XDECREF(device_obj);
        if (fits < 0)
            return NULL;
        goto slow;
    }
    e = (const Entry *)PyCapsule_GetPointer(capsule, "kernelpack.fastcall.entry");
    if (e == NULL)
        goto done;
    for (k = 0; self->lazy_views && k < e->nviews; k++) {
        fits = lazy_view(&self->rd, PyTuple_GetItem(args, e->views[k]));
        if (fits < 0)
            goto done;
        if (fits > 0) { /* a lazy view: the general path refuses it */
            Py_DECREF(st);
            Py_DECREF(capsule);
            Py_DECREF(device_obj);
            goto slow;
        }
    }
    if (e->npairs && written_conflict(e, vals)) { /* the general path refuses it */
        Py_DECREF(st);
        Py_DECREF(capsule);
        Py_DECREF(device_obj);
        goto slow;
    }
    if (stream != Py_None) { /* the handle first, as the general path reads it first */
        if (stream_of(self, stream, device_obj, device, &sh) < 0)
            goto done;
        if (self->cupy && e->nscratch && sh < 3) {
            /* CuPy's scratch for stream= is the driver's stream-ordered memory, which on a
             * default stream needs the device's context current: the general path makes it
             * so (taken here, before any output is allocated) */
            Py_DECREF(st);
            Py_DECREF(capsule);
            Py_DECREF(device_obj);
            goto slow;
        }
    }
    if (out == Py_None) { /* stream='s outputs from its pool: the hook, given the handle */
        PyObject *handle = NULL;
        if (stream != Py_None && (handle = PyLong_FromUnsignedLongLong(sh)) == NULL)
            goto done;
        result = allocate_outputs(self, e, args, device_obj, vals, handle);
        Py_XDECREF(handle);
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
    if (result != NULL && stream == Py_None && stream_of(self, stream, device_obj, device, &sh) < 0)
        Py_CLEAR(result);
    if (result != NULL && ((e->nscratch &&
                            allocate_scratch(self, e, device_obj, vals, stream != Py_None, sh,
                                             &scratch) < 0) ||
                           launch_all(self, e, st, device, sh, vals) < 0))
        Py_CLEAR(result);
    if (result != NULL)
        self->fast_calls++;
    Py_XDECREF(scratch); /* after the launches are queued: the allocator reuses it in order */
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

/* FastCall.call. A call made from inside another (a callback of the first calling again)
 * more than MAX_NESTING deep goes to the general path: each level keeps about 11 KB of C stack
 * (the key words and the values), so unbounded nesting overflowed the C stack (a crash)
 * before Python's recursion limit could raise RecursionError; the general path's frames are
 * Python's and it raises. */
static PyObject *fastcall_call(FastCall *self, PyObject *const *argv, Py_ssize_t nargs) {
    PyObject *result;
    if (tls_nesting >= MAX_NESTING && nargs == 3) {
        PyObject *a[4];
        a[0] = self->hooks;
        a[1] = argv[0];
        a[2] = argv[1];
        a[3] = argv[2];
        return call_method(s_slow, a, 4);
    }
    tls_nesting++;
    result = fastcall_run(self, argv, nargs);
    tls_nesting--;
    return result;
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

static PyObject *fastcall_get_flavor(FastCall *self, void *closure) {
    (void)closure;
    return PyUnicode_FromString(self->cupy ? "cupy" : "torch");
}

static PyObject *fastcall_get_hooks(FastCall *self, void *closure) {
    (void)closure;
    if (self->hooks == NULL)
        Py_RETURN_NONE;
    Py_INCREF(self->hooks);
    return self->hooks;
}

static PyGetSetDef fastcall_getset[] = {
    {"flavor", (getter)fastcall_get_flavor, NULL, "the arrays it takes: 'torch' or 'cupy'",
     NULL},
    {"hooks", (getter)fastcall_get_hooks, NULL,
     "the Python side (runtime/fast_native.Hooks): entries, allocation, the fallback", NULL},
    {"fast_calls", (getter)fastcall_get_fast_calls, NULL,
     "calls completed here (not handed to hooks.slow)", NULL},
    {"entries", (getter)fastcall_get_entries, NULL, "distinct keys cached", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyType_Slot fastcall_slots[] = {
    {Py_tp_new, kp_fastcall_new},
    {Py_tp_dealloc, kp_fastcall_dealloc},
    {Py_tp_traverse, kp_fastcall_traverse},
    {Py_tp_clear, kp_fastcall_clear},
    {Py_tp_methods, fastcall_methods},
    {Py_tp_getset, fastcall_getset},
    {Py_tp_doc, "FastCall(tensor_type, empty_like, raw_stream, hooks, states, n_in, tensors, "
                "floats, ints, outputs, n_values, layouts, trust_context, flavor='torch', "
                "current_device=None, dlpack=None, scratch_slots=None): the PyTorch (or, with "
                "flavor 'cupy' and CuPy's current-device getter, the CuPy) fast path of one "
                "program (built by runtime/fast_native.py)."},
    {0, NULL},
};

static PyType_Spec fastcall_spec = {
    "kernelpack.runtime._launch.FastCall", sizeof(FastCall), 0,
    Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC, fastcall_slots,
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

int kp_intern(PyObject **where, const char *text) {
    *where = PyUnicode_InternFromString(text);
    return *where == NULL ? -1 : 0;
}

int kp_fastcall_init(PyObject *module) {
    if (kp_intern(&s_flat, "flat") < 0 ||
        kp_intern(&s_allocate, "allocate") < 0 || kp_intern(&s_scratch, "scratch") < 0 ||
        kp_intern(&s_entry, "entry") < 0 ||
        kp_intern(&s_context_was_lost, "context_was_lost") < 0 ||
        kp_intern(&s_pop_context, "pop_context") < 0 ||
        kp_intern(&s_launch_failed, "launch_failed") < 0 ||
        kp_intern(&s_slow, "slow") < 0 || kp_intern(&s_stream_handle, "stream_handle") < 0 ||
        kp_intern(&s_ptr, "ptr") < 0 || kp_intern(&s_device_id, "device_id") < 0)
        return -1;
    if (kp_callbase_init(module) < 0)
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
