/*
 * kernelpack.verify's structural walker in C: the same verdict as verify._Walker, ~20x faster.
 *
 * Why: kp.load verifies every artifact before anything is decoded, and in a warm start (many
 * cached kernels in a fresh process) that pure-Python table walk was the largest single cost
 * of a load. This file answers only "accept, and the root table is here" or "reject"; on a
 * reject verify.py runs the Python walker, which stays the reference and the source of every
 * error message. So the rule here is: never accept what the Python walker rejects. The checks
 * are those of verify.py's module docstring, per field, in slot order (the order differs from
 * the Python walker's only in which error comes first, and no error is reported from here).
 *
 * The schema is not compiled in: verify.py passes a description built from the same _PLANS
 * the Python walker uses (a tuple per table of (category, size, align, extra, limit) per
 * field), converted here on first use and cached by identity. The limits the Python walker
 * reads as module globals at call time (table depth, name length, file size, body alignment)
 * come with every call, so a test that patches one sees both walkers change.
 *
 * Compiled into kernelpack.runtime._launch (limited C API, links against nothing), whose init
 * adds verify_fast to the module (kp_verify_init); kernelpack/_verify_native.py imports it.
 *
 * Safety: every read is bounds-checked before it happens, little-endian loads go through
 * memcpy, and all position arithmetic is in uint64_t (positions are < 2**31, offsets < 2**32,
 * so no sum overflows).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* Field categories; _verify_native.CATEGORIES maps verify.py's plan categories to these. */
enum {
    CAT_SCALAR = 0, /* a scalar or a struct: only inside the table and aligned */
    CAT_ENUM = 1,   /* ubyte, extra = number of values */
    CAT_BOOL = 2,   /* ubyte 0 or 1 */
    CAT_STR = 3,    /* offset to a string, limit = longest length */
    CAT_VEC = 4,    /* offset to a scalar vector, extra = element size, limit = longest count */
    CAT_BODY = 5,   /* CAT_VEC whose data must also start body_align-aligned (Pack.body) */
    CAT_VSTR = 6,   /* offset to a vector of names (each at most max_name bytes) */
    CAT_VTAB = 7,   /* offset to a vector of tables, extra = table index */
    CAT_TAB = 8,    /* offset to a table, extra = table index */
    CAT_COUNT = 9
};

/* Recursion bound whatever max_depth a caller passes: ~200 bytes of C stack per level (the
 * schema nests 4 deep, MAX_TABLE_DEPTH is 16). A deeper file is rejected here, and so left to
 * the Python walker: a description whose tables nest recursively, with a large max_depth, made
 * the recursion as deep as the buffer allows (one level per 8 bytes) and overflowed the stack. */
#define MAX_C_DEPTH 32

typedef struct {
    uint8_t cat;
    uint8_t size;  /* bytes of the field in its table */
    uint8_t align; /* 1, 2, 4 or 8 */
    uint32_t extra;
    uint64_t limit;
} Field;

typedef struct {
    Py_ssize_t nfields;
    Field *fields;
} Table;

/* The converted description and the object it came from (held, so its id stays unique). */
static PyObject *desc_object = NULL;
static Table *desc_tables = NULL;
static Py_ssize_t desc_ntables = 0;

typedef struct {
    const uint8_t *b;
    uint64_t n;
    uint8_t *seen; /* one bit per 4-aligned position: referenced already */
    uint64_t max_depth, max_name, body_align;
} Walk;

static inline uint32_t rd_u32(const uint8_t *b, uint64_t pos) {
    uint32_t v;
    memcpy(&v, b + pos, 4);
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    v = __builtin_bswap32(v);
#endif
    return v;
}

static inline uint16_t rd_u16(const uint8_t *b, uint64_t pos) {
    uint16_t v;
    memcpy(&v, b + pos, 2);
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    v = __builtin_bswap16(v);
#endif
    return v;
}

/* Strict UTF-8 as Python's codec decodes it (Unicode table 3-7): no overlongs, surrogates,
 * code points above U+10FFFF, stray continuation bytes or cut-off sequences. */
static int utf8_valid(const uint8_t *s, uint64_t len) {
    uint64_t i = 0;
    while (i < len) {
        if (i + 8 <= len) {
            uint64_t word;
            memcpy(&word, s + i, 8);
            if ((word & 0x8080808080808080ULL) == 0) {
                i += 8;
                continue;
            }
        }
        uint8_t c = s[i];
        if (c < 0x80) {
            i++;
            continue;
        }
        if (c < 0xC2)
            return 0;
        if (c < 0xE0) {
            if (i + 1 >= len || (s[i + 1] & 0xC0) != 0x80)
                return 0;
            i += 2;
            continue;
        }
        if (c < 0xF0) {
            uint8_t lo = c == 0xE0 ? 0xA0 : 0x80, hi = c == 0xED ? 0x9F : 0xBF;
            if (i + 2 >= len || s[i + 1] < lo || s[i + 1] > hi || (s[i + 2] & 0xC0) != 0x80)
                return 0;
            i += 3;
            continue;
        }
        if (c < 0xF5) {
            uint8_t lo = c == 0xF0 ? 0x90 : 0x80, hi = c == 0xF4 ? 0x8F : 0xBF;
            if (i + 3 >= len || s[i + 1] < lo || s[i + 1] > hi ||
                (s[i + 2] & 0xC0) != 0x80 || (s[i + 3] & 0xC0) != 0x80)
                return 0;
            i += 4;
            continue;
        }
        return 0;
    }
    return 1;
}

/* Follow the uoffset at pos (inside the buffer, 4-aligned): the target must be non-zero away,
 * 4-aligned, hold 4 bytes and be new. Returns 0 and the target, or -1. */
static int deref(Walk *w, uint64_t pos, uint64_t *target) {
    uint32_t off = rd_u32(w->b, pos);
    uint64_t t = pos + off;
    if (off == 0 || t % 4 || t + 4 > w->n)
        return -1;
    uint64_t bit = t / 4;
    if (w->seen[bit / 8] & (1u << (bit % 8)))
        return -1;
    w->seen[bit / 8] |= (uint8_t)(1u << (bit % 8));
    *target = t;
    return 0;
}

/* The string at target (its 4 length bytes are inside): length, NUL, UTF-8. */
static int string(Walk *w, uint64_t target, uint64_t limit, uint64_t *covered) {
    uint64_t length = rd_u32(w->b, target);
    uint64_t end = target + 4 + length;
    if (length > limit || end + 1 > w->n || w->b[end] != 0 || !utf8_valid(w->b + target + 4, length))
        return -1;
    *covered += length;
    return 0;
}

static int table(Walk *w, uint64_t pos, uint32_t tidx, uint64_t depth, uint64_t *covered_out);

/* A vector of names or tables at target: count, bounds, then every element. */
static int elements(Walk *w, uint64_t target, const Field *f, uint64_t depth,
                    uint64_t *covered_out) {
    uint64_t count = rd_u32(w->b, target), start = target + 4, covered = 0;
    if (count == 0)
        return 0;
    if (count > f->limit || start + 4 * count > w->n)
        return -1;
    for (uint64_t i = 0; i < count; i++) {
        uint64_t elem;
        if (deref(w, start + 4 * i, &elem) < 0)
            return -1;
        if (f->cat == CAT_VSTR) {
            if (string(w, elem, w->max_name, &covered) < 0)
                return -1;
        } else if (table(w, elem, f->extra, depth + 1, &covered) < 0) {
            return -1;
        }
        if (covered > w->n) /* overlapping data: see verify._Walker.overlap */
            return -1;
    }
    *covered_out += covered;
    return 0;
}

/* The table at pos (not yet checked at all) of type tidx and everything below it; adds the
 * bytes of string and vector data of its subtree to *covered_out. */
static int table(Walk *w, uint64_t pos, uint32_t tidx, uint64_t depth, uint64_t *covered_out) {
    const uint8_t *b = w->b;
    uint64_t n = w->n, covered = 0;
    if (depth > w->max_depth || depth > MAX_C_DEPTH || pos % 4 || pos + 4 > n)
        return -1;
    int32_t soff = (int32_t)rd_u32(b, pos);
    int64_t vts = (int64_t)pos - (int64_t)soff;
    if (vts < 0 || vts % 2 || (uint64_t)vts + 4 > n)
        return -1;
    uint64_t vt = (uint64_t)vts;
    uint64_t vt_size = rd_u16(b, vt), t_size = rd_u16(b, vt + 2);
    if (vt_size < 4 || vt_size % 2 || vt + vt_size > n || t_size < 4 || pos + t_size > n)
        return -1;
    const Table *t = &desc_tables[tidx];
    uint64_t nslots = (vt_size - 4) / 2;
    if (nslots > (uint64_t)t->nfields)
        nslots = (uint64_t)t->nfields; /* slots of a newer minor version are ignored */
    for (uint64_t i = 0; i < nslots; i++) {
        uint64_t voff = rd_u16(b, vt + 4 + 2 * i);
        if (voff == 0)
            continue;
        const Field *f = &t->fields[i];
        uint64_t fpos = pos + voff, target, count;
        if (voff < 4 || voff + f->size > t_size || fpos % f->align)
            return -1;
        switch (f->cat) {
        case CAT_SCALAR:
            break;
        case CAT_ENUM:
            if (b[fpos] >= f->extra)
                return -1;
            break;
        case CAT_BOOL:
            if (b[fpos] > 1)
                return -1;
            break;
        default: /* an offset */
            if (deref(w, fpos, &target) < 0)
                return -1;
            if (f->cat == CAT_TAB) {
                if (table(w, target, f->extra, depth + 1, &covered) < 0)
                    return -1;
            } else if (f->cat == CAT_STR) {
                if (string(w, target, f->limit, &covered) < 0)
                    return -1;
            } else if (f->cat == CAT_VEC || f->cat == CAT_BODY) {
                count = rd_u32(b, target);
                if (count > f->limit || target + 4 + count * f->extra > n ||
                    (target + 4) % (f->extra < 8 ? f->extra : 8) ||
                    (f->cat == CAT_BODY && (target + 4) % w->body_align))
                    return -1;
                covered += count * f->extra;
            } else if (elements(w, target, f, depth, &covered) < 0) {
                return -1;
            }
        }
    }
    if (covered > n)
        return -1;
    *covered_out += covered;
    return 0;
}

static void free_tables(Table *tables, Py_ssize_t ntables) {
    if (tables == NULL)
        return;
    for (Py_ssize_t i = 0; i < ntables; i++)
        PyMem_Free(tables[i].fields);
    PyMem_Free(tables);
}

/* One int of a field description in [lo, hi]; -1 with ValueError/TypeError otherwise. Only an
 * int (or subclass) is read: PyLong_AsLongLong would call another object's __index__, that is
 * run Python code in the middle of load_desc. */
static int desc_int(PyObject *field, Py_ssize_t i, long long lo, long long hi, Py_ssize_t ti,
                    Py_ssize_t fi, long long *out) {
    PyObject *item = PyTuple_GetItem(field, i);
    if (!PyLong_Check(item)) {
        PyErr_Format(PyExc_TypeError, "tables[%zd][%zd][%zd] must be an int", ti, fi, i);
        return -1;
    }
    long long v = PyLong_AsLongLong(item);
    if (v == -1 && PyErr_Occurred())
        return -1;
    if (v < lo || v > hi) {
        PyErr_Format(PyExc_ValueError, "tables[%zd][%zd][%zd] must be in %lld..%lld (got %lld)",
                     ti, fi, i, lo, hi, v);
        return -1;
    }
    *out = v;
    return 0;
}

/* Convert the description (see _verify_native.tables) and make it the cached one; -1 with an
 * exception, the cache unchanged. Built in locals and installed only at the end: Python code
 * run meanwhile (an item's __index__, before desc_int took ints only; an error message's %R)
 * may call verify_fast and replace the cache, and writing through the globals then wrote
 * into that other description's arrays (a heap overflow when it had fewer tables). */
static int load_desc(PyObject *tables) {
    if (!PyTuple_Check(tables)) {
        PyErr_Format(PyExc_TypeError, "tables must be a tuple (got %R)", tables);
        return -1;
    }
    Py_ssize_t nt = PyTuple_Size(tables);
    Table *out = PyMem_Calloc(nt ? (size_t)nt : 1, sizeof(Table));
    if (out == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t ti = 0; ti < nt; ti++) {
        PyObject *fields = PyTuple_GetItem(tables, ti);
        if (!PyTuple_Check(fields)) {
            PyErr_Format(PyExc_TypeError, "tables[%zd] must be a tuple (got %R)", ti, fields);
            goto fail;
        }
        Py_ssize_t nf = PyTuple_Size(fields);
        out[ti].fields = PyMem_Calloc(nf ? (size_t)nf : 1, sizeof(Field));
        if (out[ti].fields == NULL) {
            PyErr_NoMemory();
            goto fail;
        }
        out[ti].nfields = nf;
        for (Py_ssize_t fi = 0; fi < nf; fi++) {
            PyObject *field = PyTuple_GetItem(fields, fi);
            long long cat, size, align, extra, limit;
            if (!PyTuple_Check(field) || PyTuple_Size(field) != 5) {
                PyErr_Format(PyExc_TypeError, "tables[%zd][%zd] must be a 5-tuple (got %R)",
                             ti, fi, field);
                goto fail;
            }
            if (desc_int(field, 0, 0, CAT_COUNT - 1, ti, fi, &cat) < 0 ||
                desc_int(field, 1, 1, 64, ti, fi, &size) < 0 ||
                desc_int(field, 2, 1, 8, ti, fi, &align) < 0 ||
                desc_int(field, 3, 0, 0xFFFFFFFFLL, ti, fi, &extra) < 0 ||
                desc_int(field, 4, 0, 0xFFFFFFFFLL, ti, fi, &limit) < 0)
                goto fail;
            if ((align & (align - 1)) != 0 || (cat >= CAT_STR && (size != 4 || align != 4)) ||
                ((cat == CAT_VEC || cat == CAT_BODY) && (extra < 1 || extra > 8)) ||
                ((cat == CAT_TAB || cat == CAT_VTAB) && extra >= nt)) {
                PyErr_Format(PyExc_ValueError, "tables[%zd][%zd] is inconsistent (got %R)",
                             ti, fi, field);
                goto fail;
            }
            out[ti].fields[fi] = (Field){(uint8_t)cat, (uint8_t)size, (uint8_t)align,
                                         (uint32_t)extra, (uint64_t)limit};
        }
    }
    PyObject *old = desc_object; /* released last: its dealloc may run Python code too */
    free_tables(desc_tables, desc_ntables);
    desc_tables = out;
    desc_ntables = nt;
    Py_INCREF(tables);
    desc_object = tables;
    Py_XDECREF(old);
    return 0;
fail:
    free_tables(out, nt);
    return -1;
}

/* A non-negative int argument; -1 with an exception otherwise. */
static int arg_u64(PyObject *o, const char *what, uint64_t *out) {
    unsigned long long v = PyLong_AsUnsignedLongLong(o);
    if (v == (unsigned long long)-1 && PyErr_Occurred()) {
        PyErr_Clear();
        PyErr_Format(PyExc_ValueError, "%s must be an int >= 0 (got %R)", what, o);
        return -1;
    }
    *out = v;
    return 0;
}

/* The walk over a buffer already fetched; returns the root offset, -1 (reject). */
static long long walk(const uint8_t *b, uint64_t n, uint32_t root_table, const char *ident,
                      Py_ssize_t ident_len, uint64_t max_depth, uint64_t max_name,
                      uint64_t max_file, uint64_t body_align) {
    uint64_t header = ident != NULL ? 8 : 4;
    if (n > max_file || n < header)
        return -1;
    if (ident != NULL && (ident_len != 4 || memcmp(b + 4, ident, 4) != 0))
        return -1;
    uint64_t root = rd_u32(b, 0);
    if (root < header || root % 4 || root + 4 > n)
        return -1;
    /* one bit per 4-aligned position; on the stack for buffers up to 128 KiB, so the
     * walk's C stack stays under ~5 KiB for the schema's 4 levels (~11 KiB at MAX_C_DEPTH),
     * well inside the smallest thread stack Python allows (32 KiB); calloc above */
    uint8_t small[4096];
    uint64_t seen_bytes = (n / 4 + 8) / 8;
    uint8_t *seen = small;
    if (seen_bytes > sizeof small) {
        seen = calloc((size_t)seen_bytes, 1);
        if (seen == NULL)
            return -3;
    } else {
        memset(small, 0, (size_t)seen_bytes);
    }
    Walk w = {b, n, seen, max_depth, max_name, body_align};
    seen[(root / 4) / 8] |= (uint8_t)(1u << ((root / 4) % 8));
    uint64_t covered = 0;
    int ok = table(&w, root, root_table, 0, &covered);
    if (seen != small)
        free(seen);
    return ok < 0 ? -1 : (long long)root;
}

static PyObject *verify_fast(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    uint64_t root_table, max_depth, max_name, max_file, body_align;
    const char *ident = NULL;
    Py_ssize_t ident_len = 0;
    if (nargs != 8) {
        PyErr_Format(PyExc_TypeError, "verify_fast takes 8 arguments (got %zd)", nargs);
        return NULL;
    }
    /* Exactly bytes, bytearray or memoryview (what kp.load passes) and an identifier of
     * exactly bytes, or the Python walker decides: what it reads of a subclass is the
     * subclass's __len__, __getitem__ and __ne__, not these bytes (a bytes subclass whose
     * len() is 3 was accepted here and rejected there), and another exporter's __buffer__
     * (3.12) runs Python code, which may call verify_fast and replace the description that
     * was just checked. From here to the walk's end no Python code runs but on error paths. */
    PyObject *buf = args[0];
    if (!PyBytes_CheckExact(buf) && !PyByteArray_CheckExact(buf) && !PyMemoryView_Check(buf))
        return PyLong_FromLong(-2);
    if (args[2] != Py_None && !PyBytes_CheckExact(args[2]))
        return PyLong_FromLong(-2);
    if (args[3] != desc_object && load_desc(args[3]) < 0)
        return NULL;
    if (arg_u64(args[1], "root_table", &root_table) < 0 ||
        arg_u64(args[4], "max_depth", &max_depth) < 0 ||
        arg_u64(args[5], "max_name", &max_name) < 0 ||
        arg_u64(args[6], "max_file_size", &max_file) < 0 ||
        arg_u64(args[7], "body_align", &body_align) < 0)
        return NULL;
    if (root_table >= (uint64_t)desc_ntables || body_align == 0) {
        PyErr_Format(PyExc_ValueError, "root_table must be < %zd and body_align > 0 (got %R, %R)",
                     desc_ntables, args[1], args[7]);
        return NULL;
    }
    if (args[2] != Py_None) {
        char *data;
        if (PyBytes_AsStringAndSize(args[2], &data, &ident_len) < 0)
            return NULL;
        ident = data;
    }
    Py_buffer view;
    if (PyObject_GetBuffer(buf, &view, PyBUF_CONTIG_RO | PyBUF_FORMAT) < 0) {
        PyErr_Clear(); /* a released or strided memoryview: the Python walker decides */
        return PyLong_FromLong(-2);
    }
    long long result = -2;
    /* only a flat run of unsigned bytes, as the Python walker indexes them (len() and
     * buf[i] of a 'c', 'I' or 2-D memoryview mean something else) */
    if (view.ndim == 1 && view.itemsize == 1 &&
        (view.format == NULL || strcmp(view.format, "B") == 0))
        result = walk(view.buf, (uint64_t)view.len, (uint32_t)root_table, ident, ident_len,
                      max_depth, max_name, max_file, body_align);
    PyBuffer_Release(&view);
    if (result == -3)
        return PyErr_NoMemory();
    return PyLong_FromLongLong(result);
}

static PyMethodDef methods[] = {
    {"verify_fast", (PyCFunction)(void (*)(void))verify_fast, METH_FASTCALL,
     "verify_fast(buf, root_table, identifier, tables, max_depth, max_name, max_file_size, "
     "body_align) -> int\n\n"
     "The root table's offset when verify._Walker would accept buf, -1 when it is rejected, "
     "-2 when buf or identifier is of a kind left to the Python walker. tables: see "
     "kernelpack._verify_native.tables (cached by identity)."},
    {NULL, NULL, 0, NULL},
};

int kp_verify_init(PyObject *module) {
    return PyModule_AddFunctions(module, methods);
}
