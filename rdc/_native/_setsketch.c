/* The set sketch: set reconciliation by BCH syndromes over GF(2^32) (PinSketch). Each side
 * sends the odd power sums of its 32-bit fingerprints; XORed, they are the sums of the
 * symmetric difference D, from which Berlekamp-Massey gives the polynomial whose roots are
 * exactly D, and each side tests its own elements as roots. Specification, and why:
 * setsketch_ref.py; this file must agree with it byte for byte.
 *
 * Contract (the Python functions, at the bottom):
 *   set_sketch(elements, capacity) -> 4 * capacity bytes: s1, s3, ..., s(2 capacity - 1).
 *   set_locator(sums) -> l1..lL of the monic P = x^L + l1 x^(L-1) + ... + lL whose roots are
 *     D when |D| <= c = len(sums) / 4; b"" for an empty D; None when D cannot be decoded
 *     (L > c, lL = 0, or P without L distinct roots in the field).
 *   set_roots(elements, locator) -> ascending indices of the elements that are roots of P.
 * All words are u32 little-endian. ValueError: lengths not whole words; set_sketch: a zero
 * element or capacity outside 1..64; set_locator: empty sums or more than 64 words (the
 * sums come from a peer, and decoding costs O(c^2)). Every function takes path=None, a code
 * path of the field multiply (paths(), default_path()); the answer never depends on it.
 * field_mul(a, b) exposes the multiply for tests.
 *
 * The field: polynomial basis modulo x^32 + x^7 + x^3 + x^2 + 1. A product is a 32x32
 * carry-less multiply (PCLMULQDQ where the CPU has it, else integer multiplies with holes)
 * folded twice by x^32 = x^7 + x^3 + x^2 + 1. The part above the Python glue does not touch
 * the Python API. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdint.h>
#include <string.h>

#include "le_bytes.h"

#define MAX_CAPACITY 64

#if defined(__x86_64__) && defined(__GNUC__)
#define SETSKETCH_X86 1
#include <immintrin.h>
#define TARGET_CLMUL __attribute__((target("sse2,pclmul")))
#endif

#define ALWAYS_INLINE static inline __attribute__((always_inline))

/* ---------------------------------------------------------------- the field */

/* A carry-less product (degree <= 62) modulo the field polynomial. The bits above 32 fold
 * down as hi * (x^7 + x^3 + x^2 + 1), which overflows by at most 6 bits; those fold once
 * more, into bits below 13. */
ALWAYS_INLINE uint32_t reduce(uint64_t p) {
    uint64_t hi = p >> 32;
    uint64_t t = (p & 0xFFFFFFFFu) ^ hi ^ (hi << 2) ^ (hi << 3) ^ (hi << 7);
    uint64_t over = t >> 32;
    return (uint32_t)(t ^ over ^ (over << 2) ^ (over << 3) ^ (over << 7));
}

/* Carry-less 32x32 by integer multiplies (BearSSL's bmul): each operand split into four
 * with 3-bit holes between the bits kept, so the at most 8 terms a product bit sums carry
 * only into the holes, which are masked off. Constant time, 16 multiplies. */
ALWAYS_INLINE uint64_t clmul_portable(uint32_t a, uint32_t b) {
    const uint64_t m0 = 0x11111111u, m1 = 0x22222222u, m2 = 0x44444444u, m3 = 0x88888888u;
    uint64_t a0 = a & m0, a1 = a & m1, a2 = a & m2, a3 = a & m3;
    uint64_t b0 = b & m0, b1 = b & m1, b2 = b & m2, b3 = b & m3;
    uint64_t z0 = (a0 * b0) ^ (a1 * b3) ^ (a2 * b2) ^ (a3 * b1);
    uint64_t z1 = (a0 * b1) ^ (a1 * b0) ^ (a2 * b3) ^ (a3 * b2);
    uint64_t z2 = (a0 * b2) ^ (a1 * b1) ^ (a2 * b0) ^ (a3 * b3);
    uint64_t z3 = (a0 * b3) ^ (a1 * b2) ^ (a2 * b1) ^ (a3 * b0);
    return (z0 & 0x1111111111111111u) | (z1 & 0x2222222222222222u) |
           (z2 & 0x4444444444444444u) | (z3 & 0x8888888888888888u);
}

ALWAYS_INLINE uint32_t mul_portable(uint32_t a, uint32_t b) {
    return reduce(clmul_portable(a, b));
}

#ifdef SETSKETCH_X86
TARGET_CLMUL ALWAYS_INLINE uint32_t mul_clmul(uint32_t a, uint32_t b) {
    __m128i p = _mm_clmulepi64_si128(_mm_cvtsi32_si128((int)a), _mm_cvtsi32_si128((int)b), 0);
    return reduce((uint64_t)_mm_cvtsi128_si64(p));
}
#endif

/* ---------------------------------------------------------------- the kernels */

/* The bodies are written once over a multiply MUL and compiled per code path: each path's
 * functions carry its target attribute, so the multiply inlines into the loops. */

/* sums[k] ^= e^(2k+1) for each element, four elements at a time (independent chains of
 * products fill the multiplier's latency). */
#define SKETCH_BODY(MUL)                                                                 \
    size_t i = 0;                                                                        \
    for (; i + 4 <= n; i += 4) {                                                         \
        const uint8_t *at = elements + 4 * i;                                            \
        uint32_t p0 = load32le(at), p1 = load32le(at + 4), p2 = load32le(at + 8),        \
                 p3 = load32le(at + 12);                                                 \
        uint32_t q0 = MUL(p0, p0), q1 = MUL(p1, p1), q2 = MUL(p2, p2), q3 = MUL(p3, p3); \
        sums[0] ^= p0 ^ p1 ^ p2 ^ p3;                                                    \
        for (size_t k = 1; k < capacity; k++) {                                          \
            p0 = MUL(p0, q0);                                                            \
            p1 = MUL(p1, q1);                                                            \
            p2 = MUL(p2, q2);                                                            \
            p3 = MUL(p3, q3);                                                            \
            sums[k] ^= p0 ^ p1 ^ p2 ^ p3;                                                \
        }                                                                                \
    }                                                                                    \
    for (; i < n; i++) {                                                                 \
        uint32_t power = load32le(elements + 4 * i), square = MUL(power, power);         \
        sums[0] ^= power;                                                                \
        for (size_t k = 1; k < capacity; k++) {                                          \
            power = MUL(power, square);                                                  \
            sums[k] ^= power;                                                            \
        }                                                                                \
    }

/* Horner's rule for P(e), four elements at a time; found[] gets the indices of roots,
 * the count is returned. */
#define ROOTS_BODY(MUL)                                                           \
    size_t count = 0, i = 0;                                                      \
    for (; i + 4 <= n; i += 4) {                                                  \
        const uint8_t *at = elements + 4 * i;                                     \
        uint32_t e0 = load32le(at), e1 = load32le(at + 4), e2 = load32le(at + 8), \
                 e3 = load32le(at + 12), v0 = 1, v1 = 1, v2 = 1, v3 = 1;          \
        for (size_t j = 0; j < degree; j++) {                                     \
            v0 = MUL(v0, e0) ^ locator[j];                                        \
            v1 = MUL(v1, e1) ^ locator[j];                                        \
            v2 = MUL(v2, e2) ^ locator[j];                                        \
            v3 = MUL(v3, e3) ^ locator[j];                                        \
        }                                                                         \
        if (!v0) found[count++] = i;                                              \
        if (!v1) found[count++] = i + 1;                                          \
        if (!v2) found[count++] = i + 2;                                          \
        if (!v3) found[count++] = i + 3;                                          \
    }                                                                             \
    for (; i < n; i++) {                                                          \
        uint32_t e = load32le(elements + 4 * i), v = 1;                           \
        for (size_t j = 0; j < degree; j++) v = MUL(v, e) ^ locator[j];           \
        if (!v) found[count++] = i;                                               \
    }                                                                             \
    return count;

typedef struct {
    uint32_t (*mul)(uint32_t, uint32_t);
    void (*sketch)(const uint8_t *elements, size_t n, size_t capacity, uint32_t *sums);
    size_t (*roots)(const uint8_t *elements, size_t n, const uint32_t *locator,
                    size_t degree, size_t *found);
} field_path;

static uint32_t mul_portable_fn(uint32_t a, uint32_t b) { return mul_portable(a, b); }
static void sketch_portable(const uint8_t *elements, size_t n, size_t capacity,
                            uint32_t *sums) {
    SKETCH_BODY(mul_portable)
}
static size_t roots_portable(const uint8_t *elements, size_t n, const uint32_t *locator,
                             size_t degree, size_t *found) {
    ROOTS_BODY(mul_portable)
}

#ifdef SETSKETCH_X86
TARGET_CLMUL static uint32_t mul_clmul_fn(uint32_t a, uint32_t b) { return mul_clmul(a, b); }
TARGET_CLMUL static void sketch_clmul(const uint8_t *elements, size_t n, size_t capacity,
                                      uint32_t *sums) {
    SKETCH_BODY(mul_clmul)
}
TARGET_CLMUL static size_t roots_clmul(const uint8_t *elements, size_t n,
                                       const uint32_t *locator, size_t degree, size_t *found) {
    ROOTS_BODY(mul_clmul)
}
#endif

enum { PATH_PORTABLE, PATH_CLMUL, PATHS };
static const char *const path_names[PATHS] = {"portable", "clmul"};
static const field_path field_paths[PATHS] = {
    {mul_portable_fn, sketch_portable, roots_portable},
#ifdef SETSKETCH_X86
    {mul_clmul_fn, sketch_clmul, roots_clmul},
#else
    {NULL, NULL, NULL},
#endif
};

static int path_available(int path) {
    switch (path) {
    case PATH_PORTABLE: return 1;
#ifdef SETSKETCH_X86
    case PATH_CLMUL: __builtin_cpu_init(); return __builtin_cpu_supports("pclmul");
#endif
    default: return 0;
    }
}

/* ---------------------------------------------------------------- decoding */

typedef uint32_t (*mul_fn)(uint32_t, uint32_t);

/* a^(2^32 - 2) = a^-1 for nonzero a. */
static uint32_t field_inverse(mul_fn mul, uint32_t a) {
    uint32_t result = 1, power = a;
    for (int i = 0; i < 31; i++) {
        power = mul(power, power);
        result = mul(result, power);
    }
    return result;
}

/* Berlekamp-Massey over syndromes S1..SN (N <= 2 MAX_CAPACITY): connection[0..N] gets
 * Lambda (zero above its degree); returns its length L. */
static size_t berlekamp_massey(mul_fn mul, const uint32_t *syndromes, size_t total,
                               uint32_t *connection) {
    uint32_t previous[2 * MAX_CAPACITY + 1] = {0}, before[2 * MAX_CAPACITY + 1];
    memset(connection, 0, (total + 1) * sizeof *connection);
    connection[0] = previous[0] = 1;
    size_t length = 0, shift = 1;
    uint32_t last = 1;
    for (size_t n = 0; n < total; n++) {
        uint32_t d = syndromes[n];
        for (size_t i = 1; i <= length; i++) d ^= mul(connection[i], syndromes[n - i]);
        if (!d) {
            shift++;
            continue;
        }
        uint32_t scale = mul(d, field_inverse(mul, last));
        memcpy(before, connection, (total + 1) * sizeof *connection);
        /* x^shift B(x) has degree at most n + 1 <= N: nothing is cut. */
        for (size_t i = 0; i + shift <= total; i++)
            connection[i + shift] ^= mul(scale, previous[i]);
        if (2 * length <= n) {
            length = n + 1 - length;
            memcpy(previous, before, (total + 1) * sizeof *connection);
            last = d;
            shift = 1;
        } else {
            shift++;
        }
    }
    return length;
}

/* Whether P = x^L + l1 x^(L-1) + ... + lL has L distinct roots in the field: x^(2^32) = x
 * mod P (x^(2^32) - x is the product of x - a over the field). 32 squarings mod P. */
static int splits(mul_fn mul, const uint32_t *locator, size_t degree) {
    uint32_t x[MAX_CAPACITY] = {0}, residue[MAX_CAPACITY], wide[2 * MAX_CAPACITY];
    if (degree == 1)
        x[0] = locator[0];
    else
        x[1] = 1;
    memcpy(residue, x, degree * sizeof *x);
    for (int round = 0; round < 32; round++) {
        memset(wide, 0, (2 * degree - 1) * sizeof *wide);
        for (size_t i = 0; i < degree; i++) wide[2 * i] = mul(residue[i], residue[i]);
        for (size_t d = 2 * degree - 2; d >= degree; d--) { /* x^L = sum l_j x^(L-j) */
            uint32_t top = wide[d];
            if (top)
                for (size_t j = 1; j <= degree; j++) wide[d - j] ^= mul(top, locator[j - 1]);
        }
        memcpy(residue, wide, degree * sizeof *wide);
    }
    return memcmp(residue, x, degree * sizeof *x) == 0;
}

/* The locator of the odd sums (capacity words): its degree L, 0 for no difference, or -1
 * when the difference cannot be decoded. locator[0..L) gets l1..lL. */
static int locate(mul_fn mul, const uint32_t *odd, size_t capacity, uint32_t *locator) {
    uint32_t syndromes[2 * MAX_CAPACITY], connection[2 * MAX_CAPACITY + 1];
    size_t total = 2 * capacity;
    for (size_t k = 1; k <= total; k++) {
        uint32_t half = k % 2 ? 0 : syndromes[k / 2 - 1];
        syndromes[k - 1] = k % 2 ? odd[k / 2] : mul(half, half);
    }
    size_t length = berlekamp_massey(mul, syndromes, total, connection);
    if (length == 0) return 0;
    if (length > capacity || connection[length] == 0) return -1;
    memcpy(locator, connection + 1, length * sizeof *locator);
    return splits(mul, locator, length) ? (int)length : -1;
}

/* ---------------------------------------------------------------- Python glue */

static int default_path = PATH_PORTABLE; /* the best this CPU has, set at import */

/* The path named, or the default; -1 with ValueError set. */
static int path_of(const char *name) {
    if (!name) return default_path;
    for (int p = 0; p < PATHS; p++)
        if (strcmp(name, path_names[p]) == 0 && path_available(p)) return p;
    PyErr_Format(PyExc_ValueError, "%s: not a set sketch code path this CPU can run", name);
    return -1;
}

/* A buffer of whole u32 words; -1 with ValueError set (and the buffer released). */
static int get_words(PyObject *obj, Py_buffer *view, size_t *n, const char *what) {
    if (PyObject_GetBuffer(obj, view, PyBUF_SIMPLE) < 0) return -1;
    if (view->len % 4) {
        PyBuffer_Release(view);
        PyErr_Format(PyExc_ValueError, "%s must be a multiple of 4 bytes", what);
        return -1;
    }
    *n = (size_t)view->len / 4;
    return 0;
}

static PyObject *py_set_sketch(PyObject *module, PyObject *args, PyObject *kwds) {
    (void)module;
    static char *kwlist[] = {"elements", "capacity", "path", NULL};
    PyObject *obj;
    Py_ssize_t capacity;
    const char *path_name = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "On|$z:set_sketch", kwlist, &obj, &capacity,
                                     &path_name))
        return NULL;
    int path = path_of(path_name);
    if (path < 0) return NULL;
    Py_buffer view;
    size_t n;
    if (get_words(obj, &view, &n, "elements") < 0) return NULL;
    PyObject *result = NULL;
    if (capacity < 1 || capacity > MAX_CAPACITY) {
        PyErr_Format(PyExc_ValueError, "capacity must be in 1..%d", MAX_CAPACITY);
        goto done;
    }
    const uint8_t *elements = view.buf;
    for (size_t i = 0; i < n; i++)
        if (!load32le(elements + 4 * i)) {
            PyErr_SetString(PyExc_ValueError, "elements must be nonzero");
            goto done;
        }
    uint32_t sums[MAX_CAPACITY] = {0};
    field_paths[path].sketch(elements, n, (size_t)capacity, sums);
    if (!(result = PyBytes_FromStringAndSize(NULL, 4 * capacity))) goto done;
    uint8_t *out = (uint8_t *)PyBytes_AS_STRING(result);
    for (Py_ssize_t k = 0; k < capacity; k++) store32le(out + 4 * k, sums[k]);
done:
    PyBuffer_Release(&view);
    return result;
}

static PyObject *py_set_locator(PyObject *module, PyObject *args, PyObject *kwds) {
    (void)module;
    static char *kwlist[] = {"sums", "path", NULL};
    PyObject *obj;
    const char *path_name = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O|$z:set_locator", kwlist, &obj, &path_name))
        return NULL;
    int path = path_of(path_name);
    if (path < 0) return NULL;
    Py_buffer view;
    size_t capacity;
    if (get_words(obj, &view, &capacity, "sums") < 0) return NULL;
    if (capacity < 1 || capacity > MAX_CAPACITY) {
        PyBuffer_Release(&view);
        return PyErr_Format(PyExc_ValueError, "sums must hold 1..%d words", MAX_CAPACITY);
    }
    uint32_t odd[MAX_CAPACITY], locator[MAX_CAPACITY];
    for (size_t k = 0; k < capacity; k++) odd[k] = load32le((const uint8_t *)view.buf + 4 * k);
    PyBuffer_Release(&view);
    int degree = locate(field_paths[path].mul, odd, capacity, locator);
    if (degree < 0) Py_RETURN_NONE;
    PyObject *result = PyBytes_FromStringAndSize(NULL, 4 * degree);
    if (!result) return NULL;
    uint8_t *out = (uint8_t *)PyBytes_AS_STRING(result);
    for (int k = 0; k < degree; k++) store32le(out + 4 * k, locator[k]);
    return result;
}

static PyObject *py_set_roots(PyObject *module, PyObject *args, PyObject *kwds) {
    (void)module;
    static char *kwlist[] = {"elements", "locator", "path", NULL};
    PyObject *elements_obj, *locator_obj;
    const char *path_name = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OO|$z:set_roots", kwlist, &elements_obj,
                                     &locator_obj, &path_name))
        return NULL;
    int path = path_of(path_name);
    if (path < 0) return NULL;
    Py_buffer elements, locator_view;
    size_t n, degree;
    if (get_words(elements_obj, &elements, &n, "elements") < 0) return NULL;
    if (get_words(locator_obj, &locator_view, &degree, "locator") < 0) {
        PyBuffer_Release(&elements);
        return NULL;
    }
    PyObject *result = NULL;
    uint32_t *locator = NULL;
    size_t *found = NULL;
    if (degree == 0) { /* P = 1: no roots */
        result = PyList_New(0);
        goto done;
    }
    locator = PyMem_Malloc(degree * sizeof *locator);
    found = PyMem_Malloc((n ? n : 1) * sizeof *found);
    if (!locator || !found) {
        PyErr_NoMemory();
        goto done;
    }
    for (size_t j = 0; j < degree; j++)
        locator[j] = load32le((const uint8_t *)locator_view.buf + 4 * j);
    size_t count = field_paths[path].roots(elements.buf, n, locator, degree, found);
    if (!(result = PyList_New((Py_ssize_t)count))) goto done;
    for (size_t k = 0; k < count; k++) {
        PyObject *index = PyLong_FromSize_t(found[k]);
        if (!index) {
            Py_CLEAR(result);
            goto done;
        }
        PyList_SET_ITEM(result, (Py_ssize_t)k, index);
    }
done:
    PyMem_Free(locator);
    PyMem_Free(found);
    PyBuffer_Release(&elements);
    PyBuffer_Release(&locator_view);
    return result;
}

static PyObject *py_field_mul(PyObject *module, PyObject *args, PyObject *kwds) {
    (void)module;
    static char *kwlist[] = {"a", "b", "path", NULL};
    unsigned long a, b;
    const char *path_name = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "kk|$z:field_mul", kwlist, &a, &b, &path_name))
        return NULL;
    int path = path_of(path_name);
    if (path < 0) return NULL;
    if (a > 0xFFFFFFFFul || b > 0xFFFFFFFFul)
        return PyErr_Format(PyExc_ValueError, "field elements are below 2**32");
    return PyLong_FromUnsignedLong(field_paths[path].mul((uint32_t)a, (uint32_t)b));
}

static PyObject *py_paths(PyObject *module, PyObject *unused) {
    (void)module;
    (void)unused;
    PyObject *list = PyList_New(0);
    for (int p = 0; list && p < PATHS; p++) {
        if (!path_available(p)) continue;
        PyObject *name = PyUnicode_FromString(path_names[p]);
        if (!name || PyList_Append(list, name) < 0) Py_CLEAR(list);
        Py_XDECREF(name);
    }
    return list;
}

static PyObject *py_default_path(PyObject *module, PyObject *unused) {
    (void)module;
    (void)unused;
    return PyUnicode_FromString(path_names[default_path]);
}

static PyMethodDef methods[] = {
    {"set_sketch", (PyCFunction)(void (*)(void))py_set_sketch, METH_VARARGS | METH_KEYWORDS,
     "set_sketch(elements, capacity, *, path=None) -> the odd power sums (setsketch_ref)"},
    {"set_locator", (PyCFunction)(void (*)(void))py_set_locator, METH_VARARGS | METH_KEYWORDS,
     "set_locator(sums, *, path=None) -> l1..lL of the roots' polynomial, b\"\", or None"},
    {"set_roots", (PyCFunction)(void (*)(void))py_set_roots, METH_VARARGS | METH_KEYWORDS,
     "set_roots(elements, locator, *, path=None) -> indices of the elements that are roots"},
    {"field_mul", (PyCFunction)(void (*)(void))py_field_mul, METH_VARARGS | METH_KEYWORDS,
     "field_mul(a, b, *, path=None) -> a * b in GF(2^32)"},
    {"paths", py_paths, METH_NOARGS, "paths() -> the code paths this CPU can run"},
    {"default_path", py_default_path, METH_NOARGS, "default_path() -> the path taken by default"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "_setsketch", "Set reconciliation sketches over GF(2^32).", -1,
    methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__setsketch(void) {
    for (int p = PATHS - 1; p >= 0; p--)
        if (path_available(p)) {
            default_path = p;
            break;
        }
    return PyModule_Create(&module_def);
}
