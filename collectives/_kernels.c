/* The compiled combine kernels: dst = op(first, srcs[0], srcs[1], ...) in one pass.
 *
 * NumPy offers only binary ufuncs, so reducing k + 1 arrays makes k passes over the
 * destination. These kernels read every operand once and write the destination once, block
 * by block through an accumulator that stays in L1, in exactly the order of the binary
 * passes: acc = ((first op s0) op s1) op s2 ..., so the results are bitwise those of NumPy's
 * ufuncs applied left to right. collectives/kernels.py is the only caller; it falls back to
 * NumPy for anything this file declines (see combine() below).
 *
 * Covered: SUM and PROD on float32, float64 and every integer type, MAX and MIN on integers.
 * Integers use unsigned arithmetic, which wraps exactly as NumPy's integer ufuncs do (signed
 * overflow would be undefined in C). Floating MAX and MIN stay with NumPy: the choice between
 * +0.0 and -0.0 and between two NaNs is NumPy's own. Built without -ffast-math, so no
 * operation is reassociated or contracted.
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#define BLOCK 512 /* elements per accumulator block: 4 KiB of float64 */
#define MAX_OPERANDS 64

#if defined(__x86_64__) && defined(__GNUC__) && defined(__has_attribute)
#if __has_attribute(target_clones) && defined(__GLIBC__)
#define CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#endif
#endif
#ifndef CLONES
#define CLONES
#endif

enum { OP_SUM = 0, OP_PROD = 1, OP_MAX = 2, OP_MIN = 3 };

#define F_SUM(T, W, a, b) ((a) + (b))
#define F_PROD(T, W, a, b) ((a) * (b))
#define I_SUM(T, W, a, b) ((T)((W)(a) + (W)(b)))
#define I_PROD(T, W, a, b) ((T)((W)(a) * (W)(b)))
#define I_MAX(T, W, a, b) ((a) > (b) ? (a) : (b))
#define I_MIN(T, W, a, b) ((a) < (b) ? (a) : (b))

/* One block of one kernel: OUT[0..m) = F(first, srcs...) for the elements lo..lo+m. The first
 * group folds `first` with up to three sources; later groups fold three more sources into
 * OUT each, so each source is read once and OUT stays in L1 between the groups. */
#define BLOCK_BODY(T, W, F, OUT)                                                            \
    do {                                                                                    \
        const T *restrict a = (const T *)first + lo;                                        \
        Py_ssize_t j = k < 3 ? k : 3;                                                       \
        if (j == 1) {                                                                       \
            const T *restrict s0 = (const T *)srcs[0] + lo;                                 \
            for (Py_ssize_t i = 0; i < m; i++) OUT[i] = F(T, W, a[i], s0[i]);               \
        } else if (j == 2) {                                                                \
            const T *restrict s0 = (const T *)srcs[0] + lo;                                 \
            const T *restrict s1 = (const T *)srcs[1] + lo;                                 \
            for (Py_ssize_t i = 0; i < m; i++) OUT[i] = F(T, W, F(T, W, a[i], s0[i]), s1[i]); \
        } else {                                                                            \
            const T *restrict s0 = (const T *)srcs[0] + lo;                                 \
            const T *restrict s1 = (const T *)srcs[1] + lo;                                 \
            const T *restrict s2 = (const T *)srcs[2] + lo;                                 \
            for (Py_ssize_t i = 0; i < m; i++)                                              \
                OUT[i] = F(T, W, F(T, W, F(T, W, a[i], s0[i]), s1[i]), s2[i]);              \
        }                                                                                   \
        for (; j + 3 <= k; j += 3) {                                                        \
            const T *restrict s0 = (const T *)srcs[j] + lo;                                 \
            const T *restrict s1 = (const T *)srcs[j + 1] + lo;                             \
            const T *restrict s2 = (const T *)srcs[j + 2] + lo;                             \
            for (Py_ssize_t i = 0; i < m; i++)                                              \
                OUT[i] = F(T, W, F(T, W, F(T, W, OUT[i], s0[i]), s1[i]), s2[i]);            \
        }                                                                                   \
        for (; j < k; j++) {                                                                \
            const T *restrict s0 = (const T *)srcs[j] + lo;                                 \
            for (Py_ssize_t i = 0; i < m; i++) OUT[i] = F(T, W, OUT[i], s0[i]);             \
        }                                                                                   \
    } while (0)

/* Two kernels per type and op: NAME writes straight into dst, which must share no memory
 * with any operand; NAME_acc folds each block in a local accumulator and copies it out, so
 * dst may be `first` itself or any operand (combining in place). */
#define KERNEL(NAME, T, W, F)                                                              \
    CLONES static void NAME(char *dst, const char *first, const char *const *srcs,          \
                            Py_ssize_t k, Py_ssize_t n)                                     \
    {                                                                                       \
        for (Py_ssize_t lo = 0; lo < n; lo += BLOCK) {                                      \
            Py_ssize_t m = n - lo < BLOCK ? n - lo : BLOCK;                                 \
            T *restrict out = (T *)dst + lo;                                                \
            BLOCK_BODY(T, W, F, out);                                                       \
        }                                                                                   \
    }                                                                                       \
    CLONES static void NAME##_acc(char *dst, const char *first, const char *const *srcs,    \
                                  Py_ssize_t k, Py_ssize_t n)                               \
    {                                                                                       \
        T acc[BLOCK];                                                                       \
        for (Py_ssize_t lo = 0; lo < n; lo += BLOCK) {                                      \
            Py_ssize_t m = n - lo < BLOCK ? n - lo : BLOCK;                                 \
            BLOCK_BODY(T, W, F, acc);                                                       \
            memcpy((T *)dst + lo, acc, (size_t)m * sizeof(T));                              \
        }                                                                                   \
    }

typedef void (*kernel_fn)(char *, const char *, const char *const *, Py_ssize_t, Py_ssize_t);

KERNEL(sum_f32, float, float, F_SUM)
KERNEL(prod_f32, float, float, F_PROD)
KERNEL(sum_f64, double, double, F_SUM)
KERNEL(prod_f64, double, double, F_PROD)

#define INTEGER_KERNELS(S, T, W)              \
    KERNEL(sum_##S, T, W, I_SUM)              \
    KERNEL(prod_##S, T, W, I_PROD)            \
    KERNEL(max_##S, T, W, I_MAX)              \
    KERNEL(min_##S, T, W, I_MIN)

/* 8- and 16-bit values compute in uint32_t: uint8_t and uint16_t would promote to int,
 * whose overflow is undefined; the low bits of the wrapped uint32_t are NumPy's result. */
INTEGER_KERNELS(i8, int8_t, uint32_t)
INTEGER_KERNELS(i16, int16_t, uint32_t)
INTEGER_KERNELS(i32, int32_t, uint32_t)
INTEGER_KERNELS(i64, int64_t, uint64_t)
INTEGER_KERNELS(u8, uint8_t, uint32_t)
INTEGER_KERNELS(u16, uint16_t, uint32_t)
INTEGER_KERNELS(u32, uint32_t, uint32_t)
INTEGER_KERNELS(u64, uint64_t, uint64_t)

/* Type codes, in this order: f32 f64 i8 i16 i32 i64 u8 u16 u32 u64 (kernels.py mirrors it). */
#define TYPES 10
static const Py_ssize_t ITEMSIZE[TYPES] = {4, 8, 1, 2, 4, 8, 1, 2, 4, 8};
#define ROW(OP, SUFFIX)                                                                   \
    {OP##_f32##SUFFIX, OP##_f64##SUFFIX, OP##_i8##SUFFIX, OP##_i16##SUFFIX, OP##_i32##SUFFIX, \
     OP##_i64##SUFFIX, OP##_u8##SUFFIX, OP##_u16##SUFFIX, OP##_u32##SUFFIX, OP##_u64##SUFFIX}
#define INTEGER_ROW(OP, SUFFIX)                                                           \
    {NULL, NULL, OP##_i8##SUFFIX, OP##_i16##SUFFIX, OP##_i32##SUFFIX, OP##_i64##SUFFIX,    \
     OP##_u8##SUFFIX, OP##_u16##SUFFIX, OP##_u32##SUFFIX, OP##_u64##SUFFIX}
/* [in place?][op][type] */
static const kernel_fn KERNELS[2][4][TYPES] = {
    {ROW(sum, ), ROW(prod, ), INTEGER_ROW(max, ), INTEGER_ROW(min, )},
    {ROW(sum, _acc), ROW(prod, _acc), INTEGER_ROW(max, _acc), INTEGER_ROW(min, _acc)},
};

static void release(Py_buffer *views, int count)
{
    for (int i = 0; i < count; i++) PyBuffer_Release(&views[i]);
}

/* Acquire a C-contiguous buffer; 0 on success, 1 to decline (not contiguous, read-only, not
 * a buffer: NumPy's own ufuncs then handle it, or say what is wrong), -1 on other errors. */
static int acquire(PyObject *obj, Py_buffer *view, int writable)
{
    if (PyObject_GetBuffer(obj, view, writable ? PyBUF_CONTIG : PyBUF_CONTIG_RO) == 0) return 0;
    if (PyErr_ExceptionMatches(PyExc_BufferError) || PyErr_ExceptionMatches(PyExc_ValueError) ||
        PyErr_ExceptionMatches(PyExc_TypeError)) {
        PyErr_Clear();
        return 1;
    }
    return -1;
}

static PyObject *combine(PyObject *self, PyObject *args)
{
    (void)self;
    int op, type;
    PyObject *dst_obj, *first_obj, *srcs_obj;
    if (!PyArg_ParseTuple(args, "iiOOO!", &op, &type, &dst_obj, &first_obj, &PyTuple_Type,
                          &srcs_obj))
        return NULL;
    if (op < 0 || op > 3 || type < 0 || type >= TYPES) {
        PyErr_Format(PyExc_ValueError, "unknown op %d or type %d", op, type);
        return NULL;
    }
    Py_ssize_t k = PyTuple_GET_SIZE(srcs_obj);
    if (KERNELS[0][op][type] == NULL || k < 1 || k > MAX_OPERANDS - 2) Py_RETURN_FALSE;

    Py_buffer views[MAX_OPERANDS];
    const char *srcs[MAX_OPERANDS];
    int held = 0, status = 0;
    PyObject *objects[MAX_OPERANDS];
    objects[0] = dst_obj;
    objects[1] = first_obj;
    for (Py_ssize_t i = 0; i < k; i++) objects[i + 2] = PyTuple_GET_ITEM(srcs_obj, i);
    for (; held < k + 2; held++) {
        status = acquire(objects[held], &views[held], held == 0);
        if (status != 0) break;
    }
    if (status != 0) {
        release(views, held);
        if (status < 0) return NULL;
        Py_RETURN_FALSE;
    }
    Py_ssize_t itemsize = ITEMSIZE[type], len = views[0].len;
    if (len % itemsize != 0) {
        release(views, held);
        PyErr_SetString(PyExc_ValueError, "the destination's length is not whole elements");
        return NULL;
    }
    char *dst = (char *)views[0].buf;
    int shared = 0; /* some operand is dst itself: the accumulator kernel */
    for (int i = 1; i < held; i++) {
        const char *p = (const char *)views[i].buf;
        if (views[i].len != len) {
            release(views, held);
            PyErr_SetString(PyExc_ValueError, "operands of a combine differ in length");
            return NULL;
        }
        /* Partial overlap with the destination: a block written would be read again later.
         * NumPy buffers that case; leave it to NumPy. (Exactly the same memory is fine.) */
        if (p != dst && p < dst + len && dst < p + len) {
            release(views, held);
            Py_RETURN_FALSE;
        }
        shared |= p == dst && len > 0;
        if (i >= 2) srcs[i - 2] = p;
    }
    if (len > 0) {
        const char *first = (const char *)views[1].buf;
        kernel_fn kernel = KERNELS[shared][op][type];
        Py_BEGIN_ALLOW_THREADS
        kernel(dst, first, srcs, k, len / itemsize);
        Py_END_ALLOW_THREADS
    }
    release(views, held);
    Py_RETURN_TRUE;
}

static PyMethodDef methods[] = {
    {"combine", combine, METH_VARARGS,
     "combine(op, type, dst, first, srcs) -> bool: dst = op(first, *srcs) left to right in one "
     "pass over C-contiguous buffers of equal length; False where it declines (the caller then "
     "uses NumPy)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_kernels",
    "The compiled one-pass combine kernels (see collectives.kernels).", -1, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__kernels(void) { return PyModule_Create(&module); }
