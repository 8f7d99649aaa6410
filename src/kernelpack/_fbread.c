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

/* A scalar at pos (code: see code_size), sign-extended to 64 bits for a signed type. */
static int scalar(const Buf *buf, uint64_t pos, long code, uint64_t *out) {
    unsigned size = code_size(code);
    uint64_t v;
    if (size == 0 || rd(buf, pos, size, &v) < 0)
        return -1;
    if (code < 0 && size < 8 && (v >> (8 * size - 1)) & 1) /* sign-extend */
        v |= ~(uint64_t)0 << (8 * size);
    *out = v;
    return 0;
}

/* A scalar's Python int (code: see code_size). */
static PyObject *number(const Buf *buf, uint64_t pos, long code) {
    uint64_t v;
    if (scalar(buf, pos, code, &v) < 0)
        return NULL;
    if (code > 0)
        return PyLong_FromUnsignedLongLong((unsigned long long)v);
    return PyLong_FromLongLong((long long)v);
}

/* A table's vtable, read once for all of its fields. */
typedef struct {
    uint64_t pos, vt, nslots;
} Vt;

static int vt_of(const Buf *buf, uint64_t pos, Vt *t) {
    uint64_t soff, vlen;
    if (rd(buf, pos, 4, &soff) < 0)
        return -1;
    t->pos = pos;
    t->vt = pos - (uint64_t)(int64_t)(int32_t)(uint32_t)soff; /* wraps past 2^64 if negative */
    if (rd(buf, t->vt, 2, &vlen) < 0)
        return -1;
    t->nslots = vlen >= 4 ? (vlen - 4) / 2 : 0;
    return 0;
}

/* Where the field in vtable slot `slot` (>= 0) of the table lies (0: absent). */
static int slot_at(const Buf *buf, const Vt *t, long slot, uint64_t *fpos) {
    uint64_t voff = 0;
    if ((uint64_t)slot < t->nslots && rd(buf, t->vt + 4 + 2 * (uint64_t)slot, 2, &voff) < 0)
        return -1;
    *fpos = voff ? t->pos + voff : 0;
    return 0;
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
    Vt t;
    if (depth > MAX_SPEC_DEPTH) {
        PyErr_Format(PyExc_ValueError, "fb_tree: the spec nests more than %d tables deep",
                     MAX_SPEC_DEPTH);
        return NULL;
    }
    if (vt_of(buf, pos, &t) < 0)
        return NULL;
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
        uint64_t fpos = 0;
        if (slot < 0)
            PyErr_Format(PyExc_ValueError, "fb_tree: slot %ld is negative", slot);
        else
            slot_at(buf, &t, slot, &fpos);
        if (!PyErr_Occurred())
            value = fpos ? field(buf, fpos, kind, PyTuple_GetItem(item, 2), depth)
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

/* ---- the module index check of kp.load (loader.py, for a large pack) ----------------------
 *
 * kp.load checks every module of the index: its name is an identifier, its kernel names are
 * non-empty, sorted and unique, and every image's metadata is one ImageInfo would accept (the
 * conditions of loader._plain_images: a zstd image, known kind and suffix, arch 1..99 / 0..9,
 * 32-byte digests, raw_size within MAX_IMAGE_SIZE, a blob that exists, one image per target in
 * target order). Reading each module with fb_tree made Python lists of every field of every
 * image only to look at them once: about 7 µs a module, most of a 100-module pack's load.
 * module_index checks the same conditions on the buffer and makes only the names; anything it
 * does not accept is handed back (None) to the Python path, which decides and words the error,
 * so this function never decides that a file is bad, only that it is plainly good. */

typedef struct {
    int64_t v;
    int big; /* an unsigned value above INT64_MAX: fails every check below */
} Num;

/* One field of a spec, resolved once per call: its slot, scalar code and default. */
typedef struct {
    long slot, code;
    Num dflt;
} Field;

/* Spec item i as a Field of kind want_kind; -1 with an exception for a malformed item. */
static int field_of(PyObject *spec, Py_ssize_t i, long want_kind, Field *f) {
    PyObject *item = PyTuple_GetItem(spec, i);
    long kind;
    if (item == NULL || !PyTuple_Check(item) || PyTuple_Size(item) < 4) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_TypeError, "module_index: a spec item is a tuple "
                                             "(slot, kind, arg, default, ...)");
        return -1;
    }
    f->slot = PyLong_AsLong(PyTuple_GetItem(item, 0));
    kind = PyLong_AsLong(PyTuple_GetItem(item, 1));
    if (PyErr_Occurred())
        return -1;
    if (kind != want_kind || f->slot < 0) {
        PyErr_Format(PyExc_ValueError, "module_index: spec item %zd has kind %ld and slot %ld, "
                     "expected kind %ld", i, kind, f->slot, want_kind);
        return -1;
    }
    f->code = 0;
    f->dflt.v = 0;
    f->dflt.big = 0;
    if (kind == K_NUM) {
        int overflow = 0;
        f->code = PyLong_AsLong(PyTuple_GetItem(item, 2));
        if (code_size(f->code) == 0)
            return -1;
        f->dflt.v = PyLong_AsLongLongAndOverflow(PyTuple_GetItem(item, 3), &overflow);
        if (f->dflt.v == -1 && PyErr_Occurred())
            return -1;
        f->dflt.big = overflow != 0;
    }
    return 0;
}

/* Numeric field f of the table (its default when absent). */
static int num_at(const Buf *buf, const Vt *t, const Field *f, Num *out) {
    uint64_t fpos, v;
    if (slot_at(buf, t, f->slot, &fpos) < 0)
        return -1;
    if (!fpos) {
        *out = f->dflt;
        return 0;
    }
    if (scalar(buf, fpos, f->code, &v) < 0)
        return -1;
    out->big = f->code > 0 && v > (uint64_t)INT64_MAX; /* then v is not read */
    out->v = (int64_t)v;
    return 0;
}

/* Start and count of a vector field (elements of elsize bytes; count 0 when absent). */
static int vec_at(const Buf *buf, const Vt *t, const Field *f, uint64_t elsize, uint64_t *start,
                  uint64_t *count) {
    uint64_t fpos;
    if (slot_at(buf, t, f->slot, &fpos) < 0)
        return -1;
    *start = *count = 0;
    return fpos ? vector(buf, fpos, elsize, start, count) : 0;
}

/* Whether string a sorts strictly before b, as Python compares them: by code point, which
 * for UTF-8 (checked by the verifier) is byte order, a prefix first. */
static int before(const uint8_t *a, uint64_t an, const uint8_t *b, uint64_t bn) {
    int c = memcmp(a, b, an < bn ? an : bn);
    return c < 0 || (c == 0 && an < bn);
}

enum { L_KINDS, L_SUFFIXES, L_ZSTD, L_DIGEST, L_MAX_IMAGE, L_BLOBS, L_COUNT };
/* Image fields, in loader._IMAGE_FIELDS's order; those checked below. */
enum { F_KIND = 0, F_MAJOR = 1, F_MINOR = 2, F_SUFFIX = 3, F_CODEC = 7, F_RAW_SIZE = 8,
       F_DIGEST = 9, F_RAW_DIGEST = 10, F_BLOB = 11, F_COUNT = 12 };
/* The Module spec's fields (loader._MODULE) and the image spec's, resolved once per call. */
typedef struct {
    Field name, kernels, images, image[F_COUNT];
} Spec;

static int spec_of(PyObject *spec, Spec *out) {
    static const int numeric[] = {F_KIND, F_MAJOR, F_MINOR, F_SUFFIX, F_CODEC, F_RAW_SIZE,
                                  F_BLOB};
    PyObject *item, *ispec;
    if (PyTuple_Size(spec) != 3 || field_of(spec, 0, K_STR, &out->name) < 0 ||
        field_of(spec, 1, K_VSTR, &out->kernels) < 0 ||
        field_of(spec, 2, K_VTAB, &out->images) < 0) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_ValueError, "module_index: the Module spec has 3 fields");
        return -1;
    }
    item = PyTuple_GetItem(spec, 2);
    ispec = PyTuple_GetItem(item, 2);
    if (!PyTuple_Check(ispec) || PyTuple_Size(ispec) != F_COUNT) {
        PyErr_SetString(PyExc_ValueError, "module_index: the images spec has 12 fields");
        return -1;
    }
    for (size_t i = 0; i < sizeof numeric / sizeof numeric[0]; i++)
        if (field_of(ispec, numeric[i], K_NUM, &out->image[numeric[i]]) < 0)
            return -1;
    if (field_of(ispec, F_DIGEST, K_BYTES, &out->image[F_DIGEST]) < 0 ||
        field_of(ispec, F_RAW_DIGEST, K_BYTES, &out->image[F_RAW_DIGEST]) < 0)
        return -1;
    return 0;
}

/* 1: the images of the module table are plain (see the section's top), 0: not, -1: error. */
static int plain_images(const Buf *buf, const Vt *mt, const Spec *sp, const int64_t *lim) {
    uint64_t start, count, off;
    int64_t last[4] = {-1, -1, -1, -1};
    const Field *f = sp->image;
    if (vec_at(buf, mt, &sp->images, 4, &start, &count) < 0)
        return -1;
    if (count == 0)
        return 0;
    for (uint64_t i = 0; i < count; i++) {
        uint64_t at = start + 4 * i, ds, dn, rs, rn;
        Num kind, major, minor, suffix, codec, raw, blob;
        Vt t;
        if (rd(buf, at, 4, &off) < 0 || vt_of(buf, at + off, &t) < 0)
            return -1;
        if (num_at(buf, &t, &f[F_KIND], &kind) < 0 || num_at(buf, &t, &f[F_MAJOR], &major) < 0 ||
            num_at(buf, &t, &f[F_MINOR], &minor) < 0 ||
            num_at(buf, &t, &f[F_SUFFIX], &suffix) < 0 ||
            num_at(buf, &t, &f[F_CODEC], &codec) < 0 ||
            num_at(buf, &t, &f[F_RAW_SIZE], &raw) < 0 || num_at(buf, &t, &f[F_BLOB], &blob) < 0 ||
            vec_at(buf, &t, &f[F_DIGEST], 1, &ds, &dn) < 0 ||
            vec_at(buf, &t, &f[F_RAW_DIGEST], 1, &rs, &rn) < 0)
            return -1;
        if (kind.big || major.big || minor.big || suffix.big || codec.big || raw.big ||
            blob.big)
            return 0;
        if (!(0 <= kind.v && kind.v < lim[L_KINDS] && 0 < major.v && major.v < 100 &&
              0 <= minor.v && minor.v < 10 && 0 <= suffix.v && suffix.v < lim[L_SUFFIXES] &&
              codec.v == lim[L_ZSTD] && dn == (uint64_t)lim[L_DIGEST] &&
              rn == (uint64_t)lim[L_DIGEST] && 0 <= raw.v && raw.v <= lim[L_MAX_IMAGE] &&
              0 <= blob.v && blob.v < lim[L_BLOBS]))
            return 0;
        int64_t key[4] = {kind.v, major.v, minor.v, suffix.v}; /* ImageInfo.sort_key's order */
        int later = 0;
        for (int k = 0; k < 4; k++) {
            if (key[k] != last[k]) {
                later = key[k] > last[k];
                break;
            }
        }
        if (!later)
            return 0;
        memcpy(last, key, sizeof last);
    }
    return 1;
}

/* 1: the kernel names of the module table are non-empty, sorted and unique; 0: not. */
static int plain_kernels(const Buf *buf, const Vt *mt, const Spec *sp) {
    uint64_t start, count, prev_start = 0, prev_len = 0;
    if (vec_at(buf, mt, &sp->kernels, 4, &start, &count) < 0)
        return -1;
    for (uint64_t i = 0; i < count; i++) {
        uint64_t s, n;
        if (vector(buf, start + 4 * i, 1, &s, &n) < 0)
            return -1;
        if (n == 0 || (i > 0 && !before(buf->b + prev_start, prev_len, buf->b + s, n)))
            return 0;
        prev_start = s;
        prev_len = n;
    }
    return 1;
}

/* module_index(buf, start, count, spec, limits) -> list[str] | None: see the section's top.
 * start, count: the vector of Module tables (Tables.start, len); spec: loader._MODULE;
 * limits: (kind count, suffix count, the zstd codec's code, DIGEST_SIZE, MAX_IMAGE_SIZE, the
 * number of blobs). */
static PyObject *module_index(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    int64_t lim[L_COUNT];
    Py_buffer view;
    PyObject *names = NULL;
    (void)self;
    if (nargs != 5 || !PyTuple_Check(args[3]) || !PyTuple_Check(args[4]) ||
        PyTuple_Size(args[4]) != L_COUNT) {
        PyErr_SetString(PyExc_TypeError,
                        "module_index(buf, start, count, spec, limits): 5 arguments, spec and "
                        "limits (6 ints) tuples");
        return NULL;
    }
    for (int i = 0; i < L_COUNT; i++) {
        lim[i] = PyLong_AsLongLong(PyTuple_GetItem(args[4], i));
        if (lim[i] == -1 && PyErr_Occurred())
            return NULL;
    }
    unsigned long long start = PyLong_AsUnsignedLongLong(args[1]);
    if (start == (unsigned long long)-1 && PyErr_Occurred())
        return NULL;
    Py_ssize_t count = PyLong_AsSsize_t(args[2]);
    if (count < 0) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_ValueError, "module_index: count must be >= 0");
        return NULL;
    }
    if (PyObject_GetBuffer(args[0], &view, PyBUF_CONTIG_RO) < 0)
        return NULL;
    Buf buf = {(const uint8_t *)view.buf, (uint64_t)view.len};
    Spec sp;
    if (spec_of(args[3], &sp) < 0) {
        PyBuffer_Release(&view);
        return NULL;
    }
    names = PyList_New(count);
    for (Py_ssize_t i = 0; names != NULL && i < count; i++) {
        uint64_t at = (uint64_t)start + 4 * (uint64_t)i, off, fpos, s, n;
        PyObject *name = NULL;
        Vt mt;
        int ok = -1;
        if (rd(&buf, at, 4, &off) < 0 || vt_of(&buf, at + off, &mt) < 0 ||
            slot_at(&buf, &mt, sp.name.slot, &fpos) < 0)
            goto fail;
        if (!fpos) { /* no name: not an identifier; the Python path says so */
            ok = 0;
            goto fail;
        }
        if (vector(&buf, fpos, 1, &s, &n) < 0)
            goto fail;
        name = PyUnicode_DecodeUTF8((const char *)buf.b + s, (Py_ssize_t)n, "strict");
        if (name == NULL)
            goto fail;
        ok = PyUnicode_IsIdentifier(name) == 1;
        if (ok == 1)
            ok = plain_kernels(&buf, &mt, &sp);
        if (ok == 1)
            ok = plain_images(&buf, &mt, &sp, lim);
        if (ok == 1) {
            PyList_SetItem(names, i, name); /* steals the reference */
            continue;
        }
    fail:
        Py_XDECREF(name);
        Py_CLEAR(names);
        if (ok == 0) { /* not plain: the Python path decides */
            PyBuffer_Release(&view);
            Py_RETURN_NONE;
        }
    }
    PyBuffer_Release(&view);
    return names;
}

static PyMethodDef methods[] = {
    {"fb_tree", (PyCFunction)(void (*)(void))fb_tree, METH_FASTCALL,
     "fb_tree(buf, pos, spec) -> list\n\n"
     "The fields of the table at pos that spec names (see kernelpack._fbread.tree_spec), "
     "tables within read as such lists too. ValueError for a read outside buf."},
    {"module_index", (PyCFunction)(void (*)(void))module_index, METH_FASTCALL,
     "module_index(buf, start, count, spec, limits) -> list[str] | None\n\n"
     "The names of the count Module tables of the vector at start when every module passes "
     "kp.load's index checks (kernelpack.loader), else None: the Python path then decides."},
    {NULL, NULL, 0, NULL},
};

int kp_fbread_init(PyObject *module) {
    return PyModule_AddFunctions(module, methods);
}
