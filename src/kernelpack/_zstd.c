/*
 * Reading zstd frames in C for kernelpack._zstd: kernelpack's own decoder (_zstd_inflate.c),
 * and the system's libzstd opened with dlopen.
 *
 * Why the built-in decoder: the first call of a loaded program decompresses its image, and
 * opening libzstd for it (the dlopen below) cost ~170 us of a ~2 ms first call on a 2-core CI
 * box, the largest fixed cost left on that path; the zstd_builtin_* functions decode with no
 * library to open. kernelpack/_zstd.py asks them first.
 *
 * Why libzstd is still here: _zstd.py's second choice, and the reference that
 * tests/test_zstd.py and benchmarks/zstd_decode.py hold the decoders to. Opening it through
 * ctypes (CDLL, then argtypes and a call interface for each of six functions) took ~160 us on
 * a 2-core CI box and ~260 us on an H200 host; here it is opened lazily (RTLD_LAZY: only the
 * functions used are bound), once, and called directly, nothing per call.
 *
 * The same rules for both doors and the ctypes one (kernelpack/_zstd.py says them in full):
 * only the first frame of the input is decoded, into at most raw_size bytes (a header
 * declaring no content with raw_size 0 gives b"" unread, as zstandard does); errors are
 * ValueError with the decoder's own words (Python turns them into ZstdFormatError). libzstd
 * must be >= 1.4.0 with every function below, else zstd_open() answers False and Python falls
 * back to ctypes, then to the zstandard package; its prototypes are zstd.h's stable API,
 * declared here so that building needs no zstd headers and the extension links against
 * nothing.
 *
 * Compiled into kernelpack.runtime._launch (limited C API), whose init calls kp_zstd_init.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stddef.h>
#include "_zstd_inflate.h"
#ifndef _WIN32
#include <dlfcn.h>
#endif

#define KP_ZSTD_MIN_VERSION 10400u                     /* 1.4.0 */
#define KP_CONTENTSIZE_UNKNOWN (0ULL - 1)              /* ZSTD_CONTENTSIZE_UNKNOWN */
#define KP_CONTENTSIZE_ERROR (0ULL - 2)                /* ZSTD_CONTENTSIZE_ERROR */
#define KP_RELEASE_GIL_FROM ((Py_ssize_t)1 << 18)     /* decompress larger outputs without the GIL */

typedef unsigned (*version_fn)(void);
typedef unsigned long long (*content_size_fn)(const void *, size_t);
typedef size_t (*frame_size_fn)(const void *, size_t);
typedef unsigned (*is_error_fn)(size_t);
typedef const char *(*error_name_fn)(size_t);
typedef void *(*create_fn)(void);
typedef size_t (*free_fn)(void *);
typedef size_t (*decompress_fn)(void *, void *, size_t, const void *, size_t);

static struct {
    int state; /* 0: not tried yet, 1: usable, -1: absent, too old or missing a function */
    content_size_fn content_size;
    frame_size_fn frame_size;
    is_error_fn is_error;
    error_name_fn error_name;
    create_fn create;
    free_fn free_ctx;
    decompress_fn decompress;
} z;

/* One idle decompression context, taken and given back under the GIL; a second thread
 * decompressing at the same time makes (and frees) its own. */
static void *idle_ctx;

#ifndef _WIN32
static void *symbol(void *lib, const char *name, int *missing) {
    void *f = dlsym(lib, name);
    if (f == NULL)
        *missing = 1;
    return f;
}
#endif

/* Open libzstd once (under the GIL: every caller holds it). */
static int open_libzstd(void) {
    void *lib;
    version_fn version;
    int missing = 0;
    if (z.state != 0)
        return z.state;
    z.state = -1;
#ifdef _WIN32
    (void)lib, (void)version, (void)missing;
    return z.state; /* no libzstd.so.1 there: the zstandard package reads the frames */
#else
    lib = dlopen("libzstd.so.1", RTLD_LAZY | RTLD_LOCAL);
    if (lib == NULL)
        return z.state;
    version = (version_fn)symbol(lib, "ZSTD_versionNumber", &missing);
    z.content_size = (content_size_fn)symbol(lib, "ZSTD_getFrameContentSize", &missing);
    z.frame_size = (frame_size_fn)symbol(lib, "ZSTD_findFrameCompressedSize", &missing);
    z.is_error = (is_error_fn)symbol(lib, "ZSTD_isError", &missing);
    z.error_name = (error_name_fn)symbol(lib, "ZSTD_getErrorName", &missing);
    z.create = (create_fn)symbol(lib, "ZSTD_createDCtx", &missing);
    z.free_ctx = (free_fn)symbol(lib, "ZSTD_freeDCtx", &missing);
    z.decompress = (decompress_fn)symbol(lib, "ZSTD_decompressDCtx", &missing);
    if (missing || version() < KP_ZSTD_MIN_VERSION) {
        dlclose(lib);
        return z.state;
    }
    z.state = 1; /* the library stays open for the process */
    return z.state;
#endif
}

static PyObject *zstd_open(PyObject *self, PyObject *unused) {
    (void)self;
    (void)unused;
    return PyBool_FromLong(open_libzstd() == 1);
}

static int usable(void) {
    if (open_libzstd() == 1)
        return 1;
    PyErr_SetString(PyExc_RuntimeError, "libzstd is not usable here (zstd_open() is False)");
    return 0;
}

static PyObject *format_error(const char *what, size_t code) {
    PyErr_Format(PyExc_ValueError, "%s: %s", what, z.error_name(code));
    return NULL;
}

/* zstd_content_size(data) -> the size the first frame's header declares, -1 for none. */
static PyObject *zstd_content_size(PyObject *self, PyObject *args) {
    Py_buffer src;
    unsigned long long size;
    (void)self;
    if (!usable() || !PyArg_ParseTuple(args, "y*:zstd_content_size", &src))
        return NULL;
    size = z.content_size(src.buf, (size_t)src.len);
    PyBuffer_Release(&src);
    if (size == KP_CONTENTSIZE_ERROR) {
        PyErr_SetString(PyExc_ValueError, "error determining content size from frame header");
        return NULL;
    }
    if (size == KP_CONTENTSIZE_UNKNOWN)
        return PyLong_FromLong(-1);
    return PyLong_FromUnsignedLongLong(size);
}

static size_t run(void *ctx, char *out, Py_ssize_t raw_size, Py_buffer *src, size_t frame) {
    size_t got;
    if (raw_size < KP_RELEASE_GIL_FROM)
        return z.decompress(ctx, out, (size_t)raw_size, src->buf, frame);
    Py_BEGIN_ALLOW_THREADS
    got = z.decompress(ctx, out, (size_t)raw_size, src->buf, frame);
    Py_END_ALLOW_THREADS
    return got;
}

/* zstd_decompress(data, raw_size) -> bytes: the first frame of data, decompressed into at most
 * raw_size bytes (fewer when the frame holds fewer: the caller compares lengths). */
static PyObject *zstd_decompress(PyObject *self, PyObject *args) {
    Py_buffer src;
    Py_ssize_t raw_size;
    PyObject *out = NULL, *result = NULL;
    void *ctx;
    size_t frame, got;
    (void)self;
    if (!usable() || !PyArg_ParseTuple(args, "y*n:zstd_decompress", &src, &raw_size))
        return NULL;
    if (raw_size < 0) {
        PyErr_Format(PyExc_ValueError, "raw_size must be >= 0 (got %zd)", raw_size);
        goto done;
    }
    if (raw_size == 0 && z.content_size(src.buf, (size_t)src.len) == 0) {
        /* as zstandard does: a header declaring no content gives b"" unread */
        result = PyBytes_FromStringAndSize(NULL, 0);
        goto done;
    }
    frame = z.frame_size(src.buf, (size_t)src.len);
    if (z.is_error(frame)) {
        format_error("decompression error", frame);
        goto done;
    }
    out = PyBytes_FromStringAndSize(NULL, raw_size > 0 ? raw_size : 1);
    if (out == NULL)
        goto done;
    ctx = idle_ctx;
    idle_ctx = NULL;
    if (ctx == NULL && (ctx = z.create()) == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    got = run(ctx, PyBytes_AsString(out), raw_size, &src, frame);
    if (idle_ctx == NULL)
        idle_ctx = ctx;
    else
        z.free_ctx(ctx);
    if (z.is_error(got))
        format_error("decompression error", got);
    else if ((Py_ssize_t)got == raw_size && raw_size > 0)
        result = Py_NewRef(out);
    else /* fewer bytes than declared: a copy of what came out (the caller names the error) */
        result = PyBytes_FromStringAndSize(PyBytes_AsString(out), (Py_ssize_t)got);
done:
    Py_XDECREF(out);
    PyBuffer_Release(&src);
    return result;
}

/* ---- the built-in decoder (_zstd_inflate.c): no library to open, thread-safe */

/* zstd_builtin_content_size(data) -> the size the first frame's header declares, -1 for none. */
static PyObject *zstd_builtin_content_size(PyObject *self, PyObject *args) {
    Py_buffer src;
    uint64_t size = 0;
    char err[KP_ZSTD_ERROR_SIZE];
    int rc;
    (void)self;
    if (!PyArg_ParseTuple(args, "y*:zstd_builtin_content_size", &src))
        return NULL;
    rc = kp_zstd_content_size((const uint8_t *)src.buf, (size_t)src.len, &size, err);
    PyBuffer_Release(&src);
    if (rc == KP_ZSTD_UNKNOWN)
        return PyLong_FromLong(-1);
    if (rc != KP_ZSTD_OK) {
        PyErr_Format(PyExc_ValueError, "error determining content size from frame header: %s",
                     err);
        return NULL;
    }
    return PyLong_FromUnsignedLongLong((unsigned long long)size);
}

/* zstd_builtin_frame_size(data) -> the size in bytes of the first frame (header, blocks,
 * checksum), from its block headers. */
static PyObject *zstd_builtin_frame_size(PyObject *self, PyObject *args) {
    Py_buffer src;
    size_t size = 0;
    char err[KP_ZSTD_ERROR_SIZE];
    int rc;
    (void)self;
    if (!PyArg_ParseTuple(args, "y*:zstd_builtin_frame_size", &src))
        return NULL;
    rc = kp_zstd_frame_size((const uint8_t *)src.buf, (size_t)src.len, &size, err);
    PyBuffer_Release(&src);
    if (rc != KP_ZSTD_OK) {
        PyErr_Format(PyExc_ValueError, "not a complete zstd frame: %s", err);
        return NULL;
    }
    return PyLong_FromSize_t(size);
}

/* zstd_builtin_decompress(data, raw_size) -> bytes: as zstd_decompress, decoded here. The
 * output buffer is the declared content size when the header has one below raw_size, so a
 * caller's generous bound costs no memory (and a frame declaring more fails before any). */
static PyObject *zstd_builtin_decompress(PyObject *self, PyObject *args) {
    Py_buffer src;
    Py_ssize_t raw_size, cap;
    PyObject *out = NULL, *result = NULL;
    uint64_t declared = 0;
    size_t got = 0;
    char err[KP_ZSTD_ERROR_SIZE];
    int rc;
    (void)self;
    if (!PyArg_ParseTuple(args, "y*n:zstd_builtin_decompress", &src, &raw_size))
        return NULL;
    if (raw_size < 0) {
        PyErr_Format(PyExc_ValueError, "raw_size must be >= 0 (got %zd)", raw_size);
        goto done;
    }
    cap = raw_size;
    if (kp_zstd_content_size((const uint8_t *)src.buf, (size_t)src.len, &declared, err) ==
        KP_ZSTD_OK) {
        if (raw_size == 0 && declared == 0) {
            /* as zstandard does: a header declaring no content gives b"" unread */
            result = PyBytes_FromStringAndSize(NULL, 0);
            goto done;
        }
        if (declared < (uint64_t)raw_size) /* the decoder writes no more than declared */
            cap = (Py_ssize_t)declared;
    }
    out = PyBytes_FromStringAndSize(NULL, cap > 0 ? cap : 1);
    if (out == NULL)
        goto done;
    if (cap < KP_RELEASE_GIL_FROM) {
        rc = kp_zstd_decompress((const uint8_t *)src.buf, (size_t)src.len,
                                (uint8_t *)PyBytes_AsString(out), (size_t)cap, &got, err);
    } else {
        uint8_t *dst = (uint8_t *)PyBytes_AsString(out);
        Py_BEGIN_ALLOW_THREADS
        rc = kp_zstd_decompress((const uint8_t *)src.buf, (size_t)src.len, dst, (size_t)cap,
                                &got, err);
        Py_END_ALLOW_THREADS
    }
    if (rc == KP_ZSTD_NOMEM)
        PyErr_NoMemory();
    else if (rc != KP_ZSTD_OK)
        PyErr_Format(PyExc_ValueError, "decompression error: %s", err);
    else if ((Py_ssize_t)got == cap && cap > 0)
        result = Py_NewRef(out);
    else /* fewer bytes than allowed: a copy of what came out (the caller names the error) */
        result = PyBytes_FromStringAndSize(PyBytes_AsString(out), (Py_ssize_t)got);
done:
    Py_XDECREF(out);
    PyBuffer_Release(&src);
    return result;
}

static PyMethodDef zstd_methods[] = {
    {"zstd_open", zstd_open, METH_NOARGS,
     "zstd_open() -> bool: whether the system's libzstd (>= 1.4.0) is usable (opened once)."},
    {"zstd_content_size", zstd_content_size, METH_VARARGS,
     "zstd_content_size(data) -> int: the first frame's declared content size, -1 for none."},
    {"zstd_decompress", zstd_decompress, METH_VARARGS,
     "zstd_decompress(data, raw_size) -> bytes: the first frame, at most raw_size bytes."},
    {"zstd_builtin_content_size", zstd_builtin_content_size, METH_VARARGS,
     "zstd_builtin_content_size(data) -> int: as zstd_content_size, read by the built-in "
     "decoder."},
    {"zstd_builtin_frame_size", zstd_builtin_frame_size, METH_VARARGS,
     "zstd_builtin_frame_size(data) -> int: the first frame's size in bytes."},
    {"zstd_builtin_decompress", zstd_builtin_decompress, METH_VARARGS,
     "zstd_builtin_decompress(data, raw_size) -> bytes: as zstd_decompress, decoded by the "
     "built-in decoder (no libzstd)."},
    {NULL, NULL, 0, NULL},
};

int kp_zstd_init(PyObject *module) {
    return PyModule_AddFunctions(module, zstd_methods);
}
