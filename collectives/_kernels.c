/* The compiled combine kernels: dst = op(first, srcs[0], srcs[1], ...) in one pass.
 *
 * NumPy offers only binary ufuncs, so reducing k + 1 arrays makes k passes over the
 * destination. These kernels read every operand once and write the destination once, block
 * by block through an accumulator that stays in L1, in exactly the order of the binary
 * passes: acc = ((first op s0) op s1) op s2 ..., so the results are bitwise those of NumPy's
 * ufuncs applied left to right. collectives/kernels.py is the only caller; it falls back to
 * NumPy for anything this file declines (see combine() below).
 *
 * Covered: SUM and PROD on float32, float64 and every integer type, MAX and MIN on integers,
 * and SUM and PROD on the narrow floats of wire compression: bfloat16 (ml_dtypes') and, where
 * the CPU converts halves (x86 F16C), float16. The integer kernels are _integer_kernels.c's,
 * whose table this module loads (load_integer_kernels); they use unsigned arithmetic, which wraps
 * exactly as NumPy's integer ufuncs do (signed overflow would be undefined in C). Floating MAX
 * and MIN stay with NumPy: the choice between +0.0 and -0.0 and between two NaNs is NumPy's
 * own. Narrow floats compute each operation in float32 and round it back to nearest-even, as
 * NumPy's float16 and ml_dtypes' bfloat16 ufuncs do. Built without -ffast-math, so no
 * operation is reassociated or contracted.
 *
 * convert() casts between float32/float64 and the narrow floats the same way NumPy and
 * ml_dtypes (0.7 on) do: float64 to float16 and to bfloat16 rounded once, through float32
 * rounded to odd. Which NaN comes out is not promised.
 */

#include <math.h>

#include "_kernels.h"

/* Type codes, in this order: f32 f64 i8 i16 i32 i64 u8 u16 u32 u64 f16 bf16 (kernels.py
 * mirrors it). */
#define TYPES 12
#define T_F32 0
#define T_F64 1
#define T_F16 10
#define T_BF16 11
static const Py_ssize_t ITEMSIZE[TYPES] = {4, 8, 1, 2, 4, 8, 1, 2, 4, 8, 2, 2};
static int half_ok = 0; /* the CPU converts halves (set when the module loads) */

#define F_SUM(T, W, a, b) ((a) + (b))
#define F_PROD(T, W, a, b) ((a) * (b))

/* bfloat16: the upper half of a float32; rounding to nearest-even by adding 0x7fff plus the
 * lowest kept bit (NaNs stay NaNs, quiet). Plain integer C, which compilers vectorize. */
static inline float bf16_to_float(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static inline uint16_t float_to_bf16(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u);
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

/* float64 to a narrow float rounded once, as NumPy (float16) and ml_dtypes 0.7 (bfloat16) do:
 * to float32 rounded to odd (an inexact result with an even last bit moves one step toward
 * the double, so the float keeps a sticky bit), which then rounds to the nearest narrow float
 * exactly as the double would. (Rounded to nearest twice, a double just past the midpoint of
 * two bfloat16s became the midpoint, then the even one.) */
static inline float float_to_odd(double d)
{
    float f = (float)d;
    if ((double)f != d && d == d) {
        uint32_t u;
        memcpy(&u, &f, sizeof u);
        if (!(u & 1u)) u = fabs((double)f) < fabs(d) ? u + 1u : u - 1u;
        memcpy(&f, &u, sizeof f);
    }
    return f;
}

#define BF_SUM(T, W, a, b) float_to_bf16(bf16_to_float(a) + bf16_to_float(b))
#define BF_PROD(T, W, a, b) float_to_bf16(bf16_to_float(a) * bf16_to_float(b))

#define KERNEL(NAME, T, W, F) KERNEL_WITH(CLONES, NAME, T, W, F)

KERNEL(sum_f32, float, float, F_SUM)
KERNEL(prod_f32, float, float, F_PROD)
KERNEL(sum_f64, double, double, F_SUM)
KERNEL(prod_f64, double, double, F_PROD)

KERNEL(sum_bf16, uint16_t, float, BF_SUM)
KERNEL(prod_bf16, uint16_t, float, BF_PROD)

/* float16 through the F16C instructions (x86), chosen at run time: 8 lanes at a time, every
 * source folded in before the lanes are stored, each operation rounded back to a half. A
 * lane is read before it is written, so dst may be `first` itself. */
#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define HAVE_F16C 1
#define F16C __attribute__((target("avx2,f16c")))
#define ROUND_NEAREST (_MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)

F16C static inline __m256 load_halves(const uint16_t *p)
{
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
}

#define HALF_KERNEL(NAME, VOP, SOP)                                                        \
    F16C static void NAME(char *dst, const char *first, const char *const *srcs,           \
                          Py_ssize_t k, Py_ssize_t n)                                      \
    {                                                                                      \
        uint16_t *out = (uint16_t *)dst;                                                   \
        const uint16_t *a = (const uint16_t *)first;                                       \
        Py_ssize_t i = 0;                                                                  \
        for (; i + 8 <= n; i += 8) {                                                       \
            __m128i h = _mm256_cvtps_ph(                                                   \
                VOP(load_halves(a + i), load_halves((const uint16_t *)srcs[0] + i)),       \
                ROUND_NEAREST);                                                            \
            for (Py_ssize_t j = 1; j < k; j++)                                             \
                h = _mm256_cvtps_ph(                                                       \
                    VOP(_mm256_cvtph_ps(h), load_halves((const uint16_t *)srcs[j] + i)),   \
                    ROUND_NEAREST);                                                        \
            _mm_storeu_si128((__m128i *)(out + i), h);                                     \
        }                                                                                  \
        for (; i < n; i++) {                                                               \
            unsigned short h = a[i];                                                       \
            for (Py_ssize_t j = 0; j < k; j++)                                             \
                h = _cvtss_sh(_cvtsh_ss(h) SOP _cvtsh_ss(((const uint16_t *)srcs[j])[i]),  \
                              ROUND_NEAREST);                                              \
            out[i] = h;                                                                    \
        }                                                                                  \
    }

HALF_KERNEL(sum_f16, _mm256_add_ps, +)
HALF_KERNEL(prod_f16, _mm256_mul_ps, *)
#endif

/* --- casts between float32/float64 and the narrow floats ------------------------------ */

typedef void (*cast_fn)(char *, const char *, Py_ssize_t);

CLONES static void f32_to_bf16(char *dst, const char *src, Py_ssize_t n)
{
    const float *in = (const float *)src;
    uint16_t *out = (uint16_t *)dst;
    for (Py_ssize_t i = 0; i < n; i++) out[i] = float_to_bf16(in[i]);
}

CLONES static void f64_to_bf16(char *dst, const char *src, Py_ssize_t n)
{
    const double *in = (const double *)src;
    uint16_t *out = (uint16_t *)dst;
    for (Py_ssize_t i = 0; i < n; i++) out[i] = float_to_bf16(float_to_odd(in[i]));
}

CLONES static void bf16_to_f32(char *dst, const char *src, Py_ssize_t n)
{
    const uint16_t *in = (const uint16_t *)src;
    float *out = (float *)dst;
    for (Py_ssize_t i = 0; i < n; i++) out[i] = bf16_to_float(in[i]);
}

CLONES static void bf16_to_f64(char *dst, const char *src, Py_ssize_t n)
{
    const uint16_t *in = (const uint16_t *)src;
    double *out = (double *)dst;
    for (Py_ssize_t i = 0; i < n; i++) out[i] = (double)bf16_to_float(in[i]);
}

#ifdef HAVE_F16C
F16C static void f32_to_f16(char *dst, const char *src, Py_ssize_t n)
{
    const float *in = (const float *)src;
    uint16_t *out = (uint16_t *)dst;
    Py_ssize_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(out + i), _mm256_cvtps_ph(_mm256_loadu_ps(in + i),
                                                                ROUND_NEAREST));
    for (; i < n; i++) out[i] = _cvtss_sh(in[i], ROUND_NEAREST);
}

F16C static void f16_to_f32(char *dst, const char *src, Py_ssize_t n)
{
    const uint16_t *in = (const uint16_t *)src;
    float *out = (float *)dst;
    Py_ssize_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(out + i, load_halves(in + i));
    for (; i < n; i++) out[i] = _cvtsh_ss(in[i]);
}

F16C static void f16_to_f64(char *dst, const char *src, Py_ssize_t n)
{
    const uint16_t *in = (const uint16_t *)src;
    double *out = (double *)dst;
    Py_ssize_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 f = load_halves(in + i);
        _mm256_storeu_pd(out + i, _mm256_cvtps_pd(_mm256_castps256_ps128(f)));
        _mm256_storeu_pd(out + i + 4, _mm256_cvtps_pd(_mm256_extractf128_ps(f, 1)));
    }
    for (; i < n; i++) out[i] = (double)_cvtsh_ss(in[i]);
}

F16C static void f64_to_f16(char *dst, const char *src, Py_ssize_t n)
{
    const double *in = (const double *)src;
    uint16_t *out = (uint16_t *)dst;
    const __m256d magnitude = _mm256_castsi256_pd(_mm256_set1_epi64x(0x7fffffffffffffffLL));
    const __m256i low_words = _mm256_setr_epi32(0, 2, 4, 6, 1, 3, 5, 7);
    Py_ssize_t i = 0;
    for (; i + 4 <= n; i += 4) {
        __m256d d = _mm256_loadu_pd(in + i);
        __m128 f = _mm256_cvtpd_ps(d);
        __m256d back = _mm256_cvtps_pd(f);
        __m256d inexact = _mm256_cmp_pd(back, d, _CMP_NEQ_OQ);  /* (NaNs: false) */
        __m256d up = _mm256_cmp_pd(_mm256_and_pd(back, magnitude), _mm256_and_pd(d, magnitude),
                                   _CMP_LT_OQ);
        __m128i inexact32 = _mm256_castsi256_si128(
            _mm256_permutevar8x32_epi32(_mm256_castpd_si256(inexact), low_words));
        __m128i up32 = _mm256_castsi256_si128(
            _mm256_permutevar8x32_epi32(_mm256_castpd_si256(up), low_words));
        __m128i bits = _mm_castps_si128(f);
        __m128i even = _mm_cmpeq_epi32(_mm_and_si128(bits, _mm_set1_epi32(1)),
                                       _mm_setzero_si128());
        __m128i step = _mm_blendv_epi8(_mm_set1_epi32(-1), _mm_set1_epi32(1), up32);
        bits = _mm_add_epi32(bits, _mm_and_si128(_mm_and_si128(inexact32, even), step));
        _mm_storel_epi64((__m128i *)(out + i), _mm_cvtps_ph(_mm_castsi128_ps(bits),
                                                            ROUND_NEAREST));
    }
    for (; i < n; i++) out[i] = _cvtss_sh(float_to_odd(in[i]), ROUND_NEAREST);
}
#define HALF_CAST(NAME) NAME
#else
#define HALF_CAST(NAME) NULL
#endif

/* [dst type][src type]: f32, f64, f16, bf16 (indices 0, 1, 2, 3) */
static cast_fn CASTS[4][4] = {
    {NULL, NULL, HALF_CAST(f16_to_f32), bf16_to_f32},
    {NULL, NULL, HALF_CAST(f16_to_f64), bf16_to_f64},
    {HALF_CAST(f32_to_f16), HALF_CAST(f64_to_f16), NULL, NULL},
    {f32_to_bf16, f64_to_bf16, NULL, NULL},
};

static int cast_index(int type)
{
    return type == T_F32 ? 0 : type == T_F64 ? 1 : type == T_F16 ? 2 : type == T_BF16 ? 3 : -1;
}

#ifdef HAVE_F16C
#define HALF(OP) OP##_f16
#else
#define HALF(OP) NULL
#endif
#define ROW(OP, SUFFIX)                                                                   \
    {OP##_f32##SUFFIX, OP##_f64##SUFFIX, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,    \
     HALF(OP), OP##_bf16##SUFFIX}
/* [in place?][op][type]; the integer types' entries come from _integer_kernels as the module
 * loads (NULL where that module is not built: NumPy combines integers then) */
static kernel_fn KERNELS[2][4][TYPES] = {
    {ROW(sum, ), ROW(prod, ), {NULL}, {NULL}},
    {ROW(sum, _acc), ROW(prod, _acc), {NULL}, {NULL}},
};

/* Fill the integer types' entries from _integer_kernels; 1 if it is there, 0 if not. */
static int load_integer_kernels(void)
{
    PyObject *module = PyImport_ImportModule("collectives._integer_kernels");
    PyObject *capsule = module ? PyObject_GetAttrString(module, "TABLE") : NULL;
    integer_table *table = capsule ? PyCapsule_GetPointer(capsule, INTEGER_CAPSULE) : NULL;
    Py_XDECREF(capsule);
    Py_XDECREF(module);
    if (table == NULL) {
        PyErr_Clear();
        return 0;
    }
    for (int shared = 0; shared < 2; shared++)
        for (int op = 0; op < 4; op++)
            for (int t = 0; t < INTEGER_TYPES; t++)
                KERNELS[shared][op][t + 2] = (*table)[shared][op][t];
    return 1;
}

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
    if (KERNELS[0][op][type] == NULL || k < 1 || k > MAX_OPERANDS - 2 ||
        (type == T_F16 && !half_ok))
        Py_RETURN_FALSE;

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

static PyObject *convert(PyObject *self, PyObject *args)
{
    (void)self;
    int dst_type, src_type;
    PyObject *dst_obj, *src_obj;
    if (!PyArg_ParseTuple(args, "iiOO", &dst_type, &src_type, &dst_obj, &src_obj)) return NULL;
    int di = cast_index(dst_type), si = cast_index(src_type);
    if (di < 0 || si < 0 || CASTS[di][si] == NULL ||
        ((dst_type == T_F16 || src_type == T_F16) && !half_ok))
        Py_RETURN_FALSE;
    Py_buffer views[2];
    int status = acquire(dst_obj, &views[0], 1);
    if (status != 0) {
        if (status < 0) return NULL;
        Py_RETURN_FALSE;
    }
    status = acquire(src_obj, &views[1], 0);
    if (status != 0) {
        release(views, 1);
        if (status < 0) return NULL;
        Py_RETURN_FALSE;
    }
    Py_ssize_t n = views[0].len / ITEMSIZE[dst_type];
    const char *src = (const char *)views[1].buf;
    char *dst = (char *)views[0].buf;
    if (views[0].len % ITEMSIZE[dst_type] != 0 || views[1].len != n * ITEMSIZE[src_type]) {
        release(views, 2);
        PyErr_SetString(PyExc_ValueError, "a cast between buffers of different lengths");
        return NULL;
    }
    if (n > 0 && src < dst + views[0].len && dst < src + views[1].len) {
        release(views, 2); /* overlapping: NumPy's to buffer */
        Py_RETURN_FALSE;
    }
    if (n > 0) {
        cast_fn cast = CASTS[di][si];
        Py_BEGIN_ALLOW_THREADS
        cast(dst, src, n);
        Py_END_ALLOW_THREADS
    }
    release(views, 2);
    Py_RETURN_TRUE;
}

static PyMethodDef methods[] = {
    {"combine", combine, METH_VARARGS,
     "combine(op, type, dst, first, srcs) -> bool: dst = op(first, *srcs) left to right in one "
     "pass over C-contiguous buffers of equal length; False where it declines (the caller then "
     "uses NumPy)."},
    {"convert", convert, METH_VARARGS,
     "convert(dst_type, src_type, dst, src) -> bool: dst = src cast between float32/float64 "
     "and float16/bfloat16, as NumPy and ml_dtypes cast; False where it declines."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_kernels",
    "The compiled one-pass combine kernels (see collectives.kernels).", -1, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__kernels(void)
{
#ifdef HAVE_F16C
    half_ok = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c");
#endif
    int integers = load_integer_kernels();
    PyObject *m = PyModule_Create(&module);
    if (m != NULL && (PyModule_AddIntConstant(m, "HALF", half_ok) < 0 ||
                      PyModule_AddIntConstant(m, "INTEGERS", integers) < 0)) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
