/*
 * kernelpack.runtime._launch.FastCall, construction and lifetime: what runtime/fast_native.py
 * hands over (the program's inputs, outputs and per-launch parameter layouts) is checked once
 * here, so the per-call code in _fastcall.c can trust it: every slot written once, every
 * parameter inside its block, each parameter's kind able to take the value it reads. A layout
 * this code cannot take raises ValueError and the Python closure takes the program instead.
 */
#include "_fastcall.h"

#include <string.h>

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

static int reader_init(Reader *rd, PyObject *type, int cupy) {
    if (access_init(&rd->dtype, type, "dtype", 0) < 0 ||
        access_init(&rd->shape, type, "shape", 0) < 0)
        return -1;
    if (cupy)
        return access_init(&rd->is_contiguous, type, "_c_contiguous", 0) < 0 ||
                       access_init(&rd->data, type, "data", 0) < 0
                   ? -1
                   : 0;
    if (access_init(&rd->is_contiguous, type, "is_contiguous", 1) < 0 ||
        access_init(&rd->get_device, type, "get_device", 1) < 0 ||
        access_init(&rd->data_ptr, type, "data_ptr", 1) < 0 ||
        access_init(&rd->is_conj, type, "is_conj", 1) < 0 ||
        access_init(&rd->is_neg, type, "is_neg", 1) < 0)
        return -1;
    return 0;
}

static void reader_clear(Reader *rd) {
    access_clear(&rd->dtype);
    access_clear(&rd->shape);
    access_clear(&rd->is_contiguous);
    access_clear(&rd->get_device);
    access_clear(&rd->data_ptr);
    access_clear(&rd->data);
    access_clear(&rd->is_conj);
    access_clear(&rd->is_neg);
}

/* The pointer bits an array of `dtype` (a NumPy or torch dtype) must have clear: its
 * element's alignment (a complex one's part's), less one. A cupy `view` can make a pointer
 * that is not (a float64 view at offset 4): the kernel would fault on the misaligned address,
 * which poisons the context, so such an array takes the general path, which refuses it.
 * 0 (no check) for a dtype that does not say its size. */
static int misaligned_bits(PyObject *dtype, uint64_t *bits) {
    PyObject *v = PyObject_GetAttrString(dtype, "itemsize");
    long size, complex_ = 0;
    *bits = 0;
    if (v == NULL) {
        PyErr_Clear();
        return 0;
    }
    size = PyLong_AsLong(v);
    Py_DECREF(v);
    if (size <= 0) {
        PyErr_Clear();
        return 0;
    }
    v = PyObject_GetAttrString(dtype, "kind"); /* NumPy: 'c' */
    if (v != NULL) {
        complex_ = PyUnicode_Check(v) && PyUnicode_CompareWithASCIIString(v, "c") == 0;
        Py_DECREF(v);
    } else {
        PyErr_Clear();
        v = PyObject_GetAttrString(dtype, "is_complex"); /* torch */
        if (v == NULL)
            PyErr_Clear();
        else {
            complex_ = v == Py_True;
            Py_DECREF(v);
        }
    }
    if (complex_)
        size /= 2;
    if (size & (size - 1)) /* not a power of two: no such element type */
        return 0;
    *bits = (uint64_t)size - 1;
    return 0;
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

/* A row's (argument position, value slot), both checked; the slot is marked as `kind`. */
static int arg_and_slot(FastCall *self, PyObject *row, unsigned char *kinds, int kind,
                        const char *bad_arg, Py_ssize_t *arg, int *slot) {
    long a, s;
    if (int_item(row, 0, &a) < 0 || int_item(row, 1, &s) < 0)
        return -1;
    if (a < 0 || a >= self->n_in)
        return bad(bad_arg);
    if (slot_ok(self, s, kinds, kind) < 0)
        return -1;
    *arg = a;
    *slot = (int)s;
    return 0;
}

static int read_inputs(FastCall *self, PyObject *tensors, PyObject *floats, PyObject *ints,
                       PyObject *outs, unsigned char *kinds) {
    long s;
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
        if (arg_and_slot(self, row, kinds, KIND_POINTER,
                         "a tensor's argument position is out of range", &self->tensors[k].arg,
                         &self->tensors[k].slot) < 0)
            return -1;
        self->tensors[k].dtype = PyTuple_GetItem(row, 2);
        Py_INCREF(self->tensors[k].dtype);
        if (misaligned_bits(self->tensors[k].dtype, &self->tensors[k].misaligned) < 0)
            return -1;
    }
    for (k = 0; k < self->nfloats; k++) {
        if (arg_and_slot(self, PyTuple_GetItem(floats, k), kinds, KIND_FLOAT,
                         "a float's argument position is out of range", &self->floats[k].arg,
                         &self->floats[k].slot) < 0)
            return -1;
    }
    for (k = 0; k < self->nints; k++) {
        PyObject *row = PyTuple_GetItem(ints, k);
        IntIn *ii = &self->ints[k];
        if (arg_and_slot(self, row, kinds, KIND_INT, "an int's argument position is out of range",
                         &ii->arg, &ii->slot) < 0)
            return -1;
        ii->lo = PyLong_AsLongLong(PyTuple_GetItem(row, 2));
        ii->hi = PyLong_AsLongLong(PyTuple_GetItem(row, 3));
        if (PyErr_Occurred())
            return -1;
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
        if (misaligned_bits(self->outs[k].dtype, &self->outs[k].misaligned) < 0)
            return -1;
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

/* The DLPack (code, bits) rows of `o` (one per item of `n`) into the `dl` of each. */
static int dl_rows(PyObject *o, int n, KpDLDataType *first, size_t stride) {
    int k, count;
    if (rows(o, 2, "DLPack dtypes must be (code, bits) rows", &count) < 0)
        return -1;
    if (count != n)
        return bad("one DLPack dtype per tensor and per output");
    for (k = 0; k < n; k++) {
        long code, bits;
        KpDLDataType *dl = (KpDLDataType *)((char *)first + k * stride);
        if (int_item(PyTuple_GetItem(o, k), 0, &code) < 0 ||
            int_item(PyTuple_GetItem(o, k), 1, &bits) < 0)
            return -1;
        if (code < 0 || code > 255 || bits <= 0 || bits > 255)
            return bad("a DLPack dtype is out of range");
        dl->code = (uint8_t)code;
        dl->bits = (uint8_t)bits;
        dl->lanes = 1;
    }
    return 0;
}

/* dlpack: None, or (the tensor type's __dlpack_c_exchange_api__ capsule, the tensors' and the
 * outputs' DLPack dtypes). An API of another major version, or without the two functions the
 * call uses, leaves the attribute reads in place. */
static int read_dlpack(FastCall *self, PyObject *dlpack) {
    PyObject *capsule;
    const KpDLExchangeAPI *api;
    self->last_len = -1;
    if (dlpack == Py_None)
        return 0;
    if (self->cupy)
        return bad("the DLPack exchange API is read for torch tensors only");
    if (!PyTuple_Check(dlpack) || PyTuple_Size(dlpack) != 3)
        return bad("dlpack is (capsule, tensor dtypes, output dtypes)");
    capsule = PyTuple_GetItem(dlpack, 0);
    api = (const KpDLExchangeAPI *)PyCapsule_GetPointer(capsule, "dlpack_exchange_api");
    if (api == NULL)
        return -1;
    if (api->header.major != 1 || api->header.minor < 2 ||
        api->dltensor_from_py_object_no_sync == NULL || api->current_work_stream == NULL)
        return 0;
    if (dl_rows(PyTuple_GetItem(dlpack, 1), self->ntensors, &self->tensors[0].dl,
                sizeof(TensorIn)) < 0 ||
        dl_rows(PyTuple_GetItem(dlpack, 2), self->nouts, &self->outs[0].dl,
                sizeof(OutSpec)) < 0)
        return -1;
    Py_INCREF(capsule);
    self->dlx_capsule = capsule;
    self->dlx = api;
    return 0;
}

/* The value slots of scratch buffers (a tuple of ints, None: none), which a call writes with
 * pointers into its scratch allocation (the entry's, _fastcall.c allocate_scratch). */
static int read_scratch(FastCall *self, PyObject *slots, unsigned char *kinds) {
    Py_ssize_t k;
    long s;
    if (slots == Py_None)
        return 0;
    if (!PyTuple_Check(slots))
        return bad("scratch slots must be a tuple of ints");
    for (k = 0; k < PyTuple_Size(slots); k++)
        if (int_item(slots, k, &s) < 0 || slot_ok(self, s, kinds, KIND_POINTER) < 0)
            return -1;
    return 0;
}

static void fastcall_release(FastCall *self);

PyObject *kp_fastcall_new(PyTypeObject *type, PyObject *args, PyObject *kwargs) {
    PyObject *tensor_type, *empty_like, *raw_stream, *hooks, *states, *tensors, *floats, *ints,
        *outs,
        *layouts, *current_device = Py_None, *dlpack = Py_None, *scratch_slots = Py_None;
    const char *flavor = "torch";
    Py_ssize_t n_in, nvalues;
    int trust, cupy;
    FastCall *self;
    unsigned char kinds[MAX_VALUES];
    allocfunc alloc;
    if (kwargs != NULL && PyDict_Size(kwargs)) {
        PyErr_SetString(PyExc_TypeError, "FastCall takes positional arguments only");
        return NULL;
    }
    if (!PyArg_ParseTuple(args, "OOOOO!nOOOOnOp|sOOO:FastCall", &tensor_type, &empty_like,
                          &raw_stream, &hooks, &PyDict_Type, &states, &n_in, &tensors, &floats,
                          &ints, &outs, &nvalues, &layouts, &trust, &flavor, &current_device,
                          &dlpack, &scratch_slots))
        return NULL;
    if (!PyType_Check(tensor_type)) {
        PyErr_SetString(PyExc_TypeError, "FastCall: tensor_type must be a type");
        return NULL;
    }
    cupy = strcmp(flavor, "cupy") == 0;
    if (!cupy && strcmp(flavor, "torch") != 0) {
        PyErr_Format(PyExc_ValueError, "FastCall: flavor must be 'torch' or 'cupy' (got %s)",
                     flavor);
        return NULL;
    }
    if (cupy == (current_device == Py_None) || (cupy && !PyCallable_Check(current_device))) {
        PyErr_SetString(PyExc_TypeError, "FastCall: current_device is a callable for cupy "
                        "arrays, and only for them");
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
    self->cupy = cupy;
    if (cupy) {
        Py_INCREF(current_device);
        self->current_device = current_device;
    }
    self->cache = PyDict_New();
    self->n_in = n_in;
    self->nvalues = (int)nvalues;
    self->trust_context = trust;
    memset(kinds, KIND_NONE, sizeof kinds);
    if (self->cache == NULL || reader_init(&self->rd, tensor_type, cupy) < 0 ||
        read_inputs(self, tensors, floats, ints, outs, kinds) < 0 ||
        read_scratch(self, scratch_slots, kinds) < 0 ||
        read_layouts(self, layouts, kinds) < 0 || read_dlpack(self, dlpack) < 0) {
        Py_DECREF(self);
        return NULL;
    }
    self->lazy_views = !cupy && self->rd.is_conj.descr != NULL && self->rd.is_neg.descr != NULL;
    return (PyObject *)self;
}

int kp_fastcall_traverse(FastCall *self, visitproc visit, void *arg) {
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
    Py_VISIT(self->rd.data.descr);
    Py_VISIT(self->rd.is_conj.descr);
    Py_VISIT(self->rd.is_neg.descr);
    Py_VISIT(self->current_device);
    Py_VISIT(self->dlx_capsule);
    Py_VISIT(self->last_capsule);
    if (self->tensors)
        for (k = 0; k < self->ntensors; k++)
            Py_VISIT(self->tensors[k].dtype);
    if (self->outs)
        for (k = 0; k < self->nouts; k++)
            Py_VISIT(self->outs[k].dtype);
    return 0;
}

int kp_fastcall_clear(FastCall *self) {
    Py_CLEAR(self->tensor_type);
    Py_CLEAR(self->empty_like);
    Py_CLEAR(self->raw_stream);
    Py_CLEAR(self->hooks);
    Py_CLEAR(self->states);
    Py_CLEAR(self->cache);
    Py_CLEAR(self->last_state);
    Py_CLEAR(self->current_device);
    Py_CLEAR(self->last_capsule);
    self->last_len = -1;
    self->dlx = NULL; /* the capsule owns the table */
    Py_CLEAR(self->dlx_capsule);
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

void kp_fastcall_dealloc(FastCall *self) {
    PyTypeObject *type = Py_TYPE((PyObject *)self);
    freefunc tp_free = (freefunc)PyType_GetSlot(type, Py_tp_free);
    PyObject_GC_UnTrack((PyObject *)self);
    kp_fastcall_clear(self);
    fastcall_release(self);
    tp_free((PyObject *)self);
    Py_DECREF((PyObject *)type);
}
