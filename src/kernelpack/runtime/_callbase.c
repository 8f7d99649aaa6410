/*
 * kernelpack.runtime._launch.CallBase: Program.__call__ without a Python frame.
 *
 * Program(*args, out=..., stream=...) in Python costs about half a microsecond before it
 * reaches the fast path (building *args, **kwargs and the keyword-only defaults), a tenth of a
 * small launch. program.Program derives from this type when the extension is built: calling an
 * instance forwards (args, out, stream) to self._kp_bound.call when the program is bound and
 * the only keywords are out= and stream=; anything else goes to self._kp_general_call(*args,
 * **kwargs), the Python path (kernelpack.runtime.call_program).
 */
#include "_fastcall.h"

#include <stddef.h>

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

/* The call is not for the fast path: drop `bound` (a reference the caller owned) and return
 * self._kp_general_call. */
static PyObject *general_method(PyObject *self, PyObject *bound) {
    Py_DECREF(bound);
    return PyObject_GetAttr(self, s_general_call);
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
    method = general_method(self, bound);
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
    method = general_method(self, bound);
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
    {Py_tp_doc, "Base of program.Program (a loaded pack's programs): calling an instance launches through its bound fast "
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

int kp_callbase_init(PyObject *module) {
    PyObject *base;
    if (kp_intern(&s_kp_bound, "_kp_bound") < 0 || kp_intern(&s_call, "call") < 0 ||
        kp_intern(&s_general_call, "_kp_general_call") < 0 || kp_intern(&s_out, "out") < 0 ||
        kp_intern(&s_stream, "stream") < 0)
        return -1;
    base = PyType_FromSpec(&callbase_spec);
    if (base == NULL)
        return -1;
    if (PyModule_AddObject(module, "CallBase", base) < 0) {
        Py_DECREF(base);
        return -1;
    }
#ifdef KP_CALLBASE_VECTORCALL
    return PyModule_AddIntConstant(module, "CALL_VECTORCALL", 1);
#else
    return PyModule_AddIntConstant(module, "CALL_VECTORCALL", 0);
#endif
}
