/*
 * Shared by the C fast path's files: _fastcall.c (the call), _fastcall_spec.c (building a
 * FastCall from what runtime/fast_native.py hands over) and _callbase.c (Program's call).
 * See _fastcall.c for what the fast path does and why.
 */
#ifndef KERNELPACK_FASTCALL_H
#define KERNELPACK_FASTCALL_H

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
/* a key as words (exchange-API path): per tensor its rank and dims, then the symbols */
#define KEY_WORDS (MAX_KEY * (MAX_DIMS + 1))

typedef union {
    uint64_t u;
    int64_t i;
    double d;
} Value;

enum { KIND_NONE = 0, KIND_POINTER, KIND_FLOAT, KIND_INT };

/* DLPack's C exchange API (dlpack.h 1.2+, `__dlpack_c_exchange_api__` on a tensor type, a
 * capsule named "dlpack_exchange_api"): a framework's own functions that describe one of its
 * tensors as a DLTensor and name its current stream, with no Python call. PyTorch has it from
 * 2.10. Declared here from the DLPack specification (only the members kernelpack calls are
 * typed; the layout is the spec's). */
enum { KP_DL_CPU = 1, KP_DL_CUDA = 2 };
typedef struct { int32_t device_type; int32_t device_id; } KpDLDevice;
typedef struct { uint8_t code; uint8_t bits; uint16_t lanes; } KpDLDataType;
typedef struct {
    void *data;
    KpDLDevice device;
    int32_t ndim;
    KpDLDataType dtype;
    int64_t *shape;
    int64_t *strides; /* in elements; NULL: C-contiguous */
    uint64_t byte_offset;
} KpDLTensor;
typedef struct KpDLHeader {
    uint32_t major, minor;
    struct KpDLHeader *prev_api;
} KpDLHeader;
typedef struct {
    KpDLHeader header;
    void *managed_tensor_allocator;
    void *managed_tensor_from_py_object_no_sync;
    void *managed_tensor_to_py_object_no_sync;
    /* 0, or -1 with a Python exception set; the DLTensor borrows the tensor's memory */
    int (*dltensor_from_py_object_no_sync)(void *py_object, KpDLTensor *out);
    int (*current_work_stream)(int32_t device_type, int32_t device_id, void **out_stream);
} KpDLExchangeAPI;

#define MAX_DIMS 16 /* a tensor's rank on the exchange-API path (higher: the general path) */

typedef struct {
    Py_ssize_t arg; /* position in the call's arguments */
    int slot;       /* value slot */
    PyObject *dtype;
    KpDLDataType dl; /* the dtype as DLPack names it (exchange-API path) */
    uint64_t misaligned; /* pointer bits that must be 0 (cupy views can be misaligned) */
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
    KpDLDataType dl;
    uint64_t misaligned; /* as TensorIn's */
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
    int slot;           /* a value slot: an input's, or a scratch buffer's */
    uint64_t value;     /* the input's size in bytes, or the buffer's offset in the call's
                         * one scratch allocation */
} SlotValue;

/* fastpath.WRITTEN_SPAN: on an overlap span's size, the input is one the program writes */
#define KP_WRITTEN_SPAN (1ULL << 63)

/* What one out= array is checked against per call (fastpath.out_overlap): its size, and the
 * non-empty tensor inputs' value slots and sizes it must not partially overlap (any shared
 * byte where the size carries KP_WRITTEN_SPAN). */
typedef struct {
    uint64_t nbytes;
    Py_ssize_t nspans;
    SlotValue *spans;
} OutOverlap;

typedef struct {
    int a, b;           /* value slots: an argument the program writes (role inout), another */
    int both_written;   /* b is written too: any shared byte conflicts, not only a partial one */
    uint64_t na, nb;    /* their sizes in bytes (non-zero) */
} WrittenPair;

typedef struct {
    PyObject *shapes;   /* tuple of the outputs' shapes */
    Py_ssize_t *likes;  /* per output: argument to allocate it like, or -1 */
    int nlaunch;
    EntryLaunch *launches;
    Py_ssize_t nviews;  /* arguments that may be torch's lazy conj/neg views: asked per call */
    Py_ssize_t *views;
    int view_out;       /* the same for every out= array */
    /* per output (at least one): what its out= array is checked against; outputs must also
     * share no byte with each other (aliasing.check_disjoint_outputs) */
    Py_ssize_t noverlaps;
    OutOverlap *overlaps;
    /* argument pairs that may not share memory (fastpath.written_pairs): checked per call */
    Py_ssize_t npairs;
    WrittenPair *pairs;
    /* the variant's scratch as one allocation (fastpath.scratch_layout): hooks.scratch(
     * scratch_nbytes, device) per call, each buffer's slot at its offset; nscratch 0: none */
    uint64_t scratch_nbytes;
    Py_ssize_t nscratch;
    SlotValue *scratch;
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

/* torch: dtype, shape (attributes), is_contiguous(), get_device(), data_ptr(), is_conj(),
 * is_neg() (methods).
 * cupy: dtype, shape, _c_contiguous (a stored flag; `flags` builds an object per read) and
 * data (the MemoryPointer, whose ptr and device_id are read generically); the method
 * accesses are unused. */
typedef struct {
    Access dtype, shape, is_contiguous, get_device, data_ptr, data, is_conj, is_neg;
} Reader;

typedef struct {
    PyObject_HEAD
    PyObject *tensor_type, *empty_like, *raw_stream, *hooks, *states, *cache;
    /* cupy arrays: CuPy allocates and streams on its current device, which must be the
     * arrays' (current_device() is asked per call); raw_stream() is get_current_stream. */
    int cupy;
    /* torch's lazy conjugate/negative views are asked for (the entry says which arguments):
     * the tensor type has is_conj() and is_neg() */
    int lazy_views;
    PyObject *current_device;
    /* torch's exchange API (NULL: the attribute reads of `rd`), the capsule holding it, and
     * the last call's key with its entry: a call whose shapes and symbols equal the last
     * one's takes that entry without building the Python key (last_len -1: none) */
    const KpDLExchangeAPI *dlx;
    PyObject *dlx_capsule, *last_capsule;
    Py_ssize_t last_len;
    int64_t last_key[KEY_WORDS];
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

static inline PyObject *call_method(PyObject *name, PyObject *const *args, size_t n) {
    return PyObject_VectorcallMethod(name, args, n | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
}

static inline PyObject *call_method0(PyObject *self, PyObject *name) {
    return PyObject_VectorcallMethod(name, &self, 1 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
}

/* _fastcall_spec.c: the FastCall type's construction and lifetime slots. */
PyObject *kp_fastcall_new(PyTypeObject *type, PyObject *args, PyObject *kwargs);
int kp_fastcall_traverse(FastCall *self, visitproc visit, void *arg);
int kp_fastcall_clear(FastCall *self);
void kp_fastcall_dealloc(FastCall *self);

/* _callbase.c: adds CallBase and CALL_VECTORCALL to the module; -1 on error. */
int kp_callbase_init(PyObject *module);

/* _fastcall.c: an interned string into *where; -1 on error. */
int kp_intern(PyObject **where, const char *text);

#endif
