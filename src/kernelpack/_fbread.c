/*
 * kernelpack._fbread's bulk reader in C: a whole tree of tables in one call.
 *
 * Why: decoding a summary read a Program table field by field from Python (Table.values, a
 * struct call and a list append per field, a Table object per element of every vector of
 * tables): about a third of decode_program, and more on a process's first decode, where
 * every Python function runs cold. A load or a warm start decodes one summary per program
 * used, so this was a fixed cost of every first call.
 *
 * What it reads is told, not compiled in: _fbread.tree_spec() turns a table's field names into
 * a spec, a tuple with one (slot, kind, arg, default, name) item per field, where arg is the
 * scalar code, the struct's member codes or, for a table or a vector of tables, the sub-spec.
 * fb_tree(buf, pos, spec) answers a list of the fields' values, each what Table.get answers
 * except that a table is its own such list (and a vector of tables a list of them): Python's
 * Table.tree reads the same spec through Table.get, and the tests hold the two to each other.
 *
 * Safety: the buffers read here have been verified (kernelpack.verify) before any of their
 * tables exist, but this function is callable with any buffer, so every read is bounds-checked
 * anyway (a ValueError naming the offset; never a read outside the buffer), strings are
 * decoded as strict UTF-8 by Python, and the recursion follows the spec, capped at
 * MAX_SPEC_DEPTH levels whatever the spec says. Compiled into kernelpack.runtime._launch
 * (limited C API), whose init adds fb_tree (kp_fbread_init).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

/* Field kinds; _fbread.py's KINDS names them. */
enum { K_NUM = 0, K_STRUCT = 1, K_STR = 2, K_BYTES = 3, K_VEC = 4, K_VSTR = 5, K_TAB = 6,
       K_VTAB = 7 };

/* The schema nests four tables deep; a spec deeper than this is refused. */
#define MAX_SPEC_DEPTH 16

typedef struct {
    const uint8_t *b;
    uint64_t n;
} Buf;

static int out_of_range(uint64_t pos, uint64_t size) {
    PyErr_Format(PyExc_ValueError,
                 "fb_tree: a read of %llu bytes at offset %llu is outside the buffer: not a "
                 "verified kernelpack FlatBuffer",
                 (unsigned long long)size, (unsigned long long)pos);
    return -1;
}

/* Little-endian unsigned read of `size` (1, 2, 4 or 8) bytes at pos, bounds-checked. */
static int rd(const Buf *buf, uint64_t pos, unsigned size, uint64_t *out) {
    if (pos > buf->n || size > buf->n - pos)
        return out_of_range(pos, size);
    uint64_t v = 0;
    for (unsigned i = 0; i < size; i++)
        v |= (uint64_t)buf->b[pos + i] << (8 * i);
    *out = v;
    return 0;
}

/* The size in bytes of a scalar code (the size, negative for a signed type), or 0 with an
 * exception set for anything else (an error converting it included). */
static unsigned code_size(long code) {
    if (code == -1 && PyErr_Occurred()) /* the conversion failed (not an int, too large) */
        return 0;
    switch (code) { /* the whole long: no cast or negation before it is known to be small */
    case 1: case -1: return 1;
    case 2: case -2: return 2;
    case 4: case -4: return 4;
    case 8: case -8: return 8;
    default:
        PyErr_Format(PyExc_ValueError, "fb_tree: scalar code %ld is not one of +-1, 2, 4, 8",
                     code);
        return 0;
    }
}

/* A scalar's Python int (code: see code_size). */
static PyObject *number(const Buf *buf, uint64_t pos, long code) {
    unsigned size = code_size(code);
    uint64_t v;
    if (size == 0)
        return NULL;
    if (rd(buf, pos, size, &v) < 0)
        return NULL;
    if (code > 0)
        return PyLong_FromUnsignedLongLong((unsigned long long)v);
    if (size < 8 && (v >> (8 * size - 1)) & 1) /* sign-extend */
        v |= ~(uint64_t)0 << (8 * size);
    return PyLong_FromLongLong((long long)v);
}

/* Where the vector (or string) that the offset at fpos points to starts, and its count. */
static int vector(const Buf *buf, uint64_t fpos, uint64_t elsize, uint64_t *start,
                  uint64_t *count) {
    uint64_t off, target, c;
    if (rd(buf, fpos, 4, &off) < 0)
        return -1;
    target = fpos + off;
    if (rd(buf, target, 4, &c) < 0)
        return -1;
    *start = target + 4;
    *count = c;
    if (*start > buf->n || c * elsize > buf->n - *start)
        return out_of_range(*start, c * elsize);
    return 0;
}

static PyObject *string_at(const Buf *buf, uint64_t fpos) {
    uint64_t start, count;
    if (vector(buf, fpos, 1, &start, &count) < 0)
        return NULL;
    return PyUnicode_DecodeUTF8((const char *)buf->b + start, (Py_ssize_t)count, "strict");
}

static PyObject *table(const Buf *buf, uint64_t pos, PyObject *spec, int depth);

/* One present field at fpos, of `kind` with `arg` (see the top). */
static PyObject *field(const Buf *buf, uint64_t fpos, long kind, PyObject *arg, int depth) {
    uint64_t start, count, off;
    PyObject *out, *item;
    switch (kind) {
    case K_NUM:
        return number(buf, fpos, PyLong_AsLong(arg));
    case K_STRUCT: {
        Py_ssize_t n = PyTuple_Check(arg) ? PyTuple_Size(arg) : -1;
        if (n < 0 && !PyErr_Occurred())
            PyErr_SetString(PyExc_TypeError, "fb_tree: a struct's arg is a tuple of codes");
        if (n < 0)
            return NULL;
        out = PyTuple_New(n);
        uint64_t at = fpos;
        for (Py_ssize_t i = 0; out != NULL && i < n; i++) {
            PyObject *member = PyTuple_GetItem(arg, i);
            long code = member == NULL ? -1 : PyLong_AsLong(member);
            item = member == NULL ? NULL : number(buf, at, code);
            if (item == NULL || PyTuple_SetItem(out, i, item) < 0) {
                Py_CLEAR(out);
                break;
            }
            at += code_size(code);
        }
        return out;
    }
    case K_STR:
        return string_at(buf, fpos);
    case K_BYTES:
        if (vector(buf, fpos, 1, &start, &count) < 0)
            return NULL;
        return PyBytes_FromStringAndSize((const char *)buf->b + start, (Py_ssize_t)count);
    case K_VEC: {
        long code = PyLong_AsLong(arg);
        uint64_t size = code_size(code);
        if (size == 0 || vector(buf, fpos, size, &start, &count) < 0)
            return NULL;
        out = PyTuple_New((Py_ssize_t)count);
        for (uint64_t i = 0; out != NULL && i < count; i++) {
            item = number(buf, start + i * size, code);
            if (item == NULL || PyTuple_SetItem(out, (Py_ssize_t)i, item) < 0)
                Py_CLEAR(out);
        }
        return out;
    }
    case K_VSTR:
    case K_VTAB:
        if (vector(buf, fpos, 4, &start, &count) < 0)
            return NULL;
        out = PyList_New((Py_ssize_t)count);
        for (uint64_t i = 0; out != NULL && i < count; i++) {
            uint64_t at = start + 4 * i;
            if (kind == K_VSTR) {
                item = string_at(buf, at);
            } else if (rd(buf, at, 4, &off) < 0) {
                item = NULL;
            } else {
                item = table(buf, at + off, arg, depth + 1);
            }
            if (item == NULL || PyList_SetItem(out, (Py_ssize_t)i, item) < 0)
                Py_CLEAR(out);
        }
        return out;
    case K_TAB:
        if (rd(buf, fpos, 4, &off) < 0)
            return NULL;
        return table(buf, fpos + off, arg, depth + 1);
    default:
        PyErr_Format(PyExc_ValueError, "fb_tree: unknown field kind %ld", kind);
        return NULL;
    }
}

/* An absent field: the default the spec gives, or a fresh empty list for a vector of strings
 * or tables (as Table.get answers: the caller may keep and extend it). */
static PyObject *absent(long kind, PyObject *dflt) {
    if (kind == K_VSTR || kind == K_VTAB)
        return PyList_New(0);
    Py_INCREF(dflt);
    return dflt;
}

/* The table at pos: a list of its spec's fields. */
static PyObject *table(const Buf *buf, uint64_t pos, PyObject *spec, int depth) {
    uint64_t soff, vt, vlen;
    if (depth > MAX_SPEC_DEPTH) {
        PyErr_Format(PyExc_ValueError, "fb_tree: the spec nests more than %d tables deep",
                     MAX_SPEC_DEPTH);
        return NULL;
    }
    if (rd(buf, pos, 4, &soff) < 0)
        return NULL;
    vt = pos - (uint64_t)(int64_t)(int32_t)(uint32_t)soff; /* wraps past 2^64 if negative */
    if (rd(buf, vt, 2, &vlen) < 0)
        return NULL;
    uint64_t nslots = vlen >= 4 ? (vlen - 4) / 2 : 0;
    if (!PyTuple_Check(spec)) {
        PyErr_SetString(PyExc_TypeError, "fb_tree: a spec is a tuple of field items");
        return NULL;
    }
    Py_ssize_t nfields = PyTuple_Size(spec);
    PyObject *out = PyList_New(nfields);
    for (Py_ssize_t i = 0; out != NULL && i < nfields; i++) {
        PyObject *item = PyTuple_GetItem(spec, i), *value = NULL;
        long slot, kind;
        if (item == NULL || !PyTuple_Check(item) || PyTuple_Size(item) < 4) {
            if (!PyErr_Occurred())
                PyErr_SetString(PyExc_TypeError,
                                "fb_tree: a spec item is a tuple (slot, kind, arg, default, ...)");
            Py_CLEAR(out);
            break;
        }
        slot = PyLong_AsLong(PyTuple_GetItem(item, 0));
        kind = PyLong_AsLong(PyTuple_GetItem(item, 1));
        if ((slot == -1 || kind == -1) && PyErr_Occurred()) {
            Py_CLEAR(out);
            break;
        }
        uint64_t voff = 0;
        if (slot < 0) {
            PyErr_Format(PyExc_ValueError, "fb_tree: slot %ld is negative", slot);
        } else if ((uint64_t)slot < nslots) {
            rd(buf, vt + 4 + 2 * (uint64_t)slot, 2, &voff);
        }
        if (!PyErr_Occurred())
            value = voff ? field(buf, pos + voff, kind, PyTuple_GetItem(item, 2), depth)
                         : absent(kind, PyTuple_GetItem(item, 3));
        if (value == NULL || PyList_SetItem(out, i, value) < 0)
            Py_CLEAR(out);
    }
    return out;
}

static PyObject *fb_tree(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 3) {
        PyErr_Format(PyExc_TypeError, "fb_tree takes 3 arguments (got %zd)", nargs);
        return NULL;
    }
    if (!PyTuple_Check(args[2])) {
        PyErr_SetString(PyExc_TypeError, "fb_tree: spec must be a tuple");
        return NULL;
    }
    unsigned long long pos = PyLong_AsUnsignedLongLong(args[1]);
    if (pos == (unsigned long long)-1 && PyErr_Occurred())
        return NULL;
    Py_buffer view;
    if (PyObject_GetBuffer(args[0], &view, PyBUF_CONTIG_RO) < 0)
        return NULL;
    Buf buf = {(const uint8_t *)view.buf, (uint64_t)view.len};
    PyObject *out = table(&buf, (uint64_t)pos, args[2], 0);
    PyBuffer_Release(&view);
    return out;
}

static PyMethodDef methods[] = {
    {"fb_tree", (PyCFunction)(void (*)(void))fb_tree, METH_FASTCALL,
     "fb_tree(buf, pos, spec) -> list\n\n"
     "The fields of the table at pos that spec names (see kernelpack._fbread.tree_spec), "
     "tables within read as such lists too. ValueError for a read outside buf."},
    {NULL, NULL, 0, NULL},
};

int kp_fbread_init(PyObject *module) {
    return PyModule_AddFunctions(module, methods);
}
