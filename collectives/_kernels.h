/* What the two halves of the compiled combine kernels share: the kernels' signature, one
 * block's loops, and the CPUs each kernel is compiled for. _kernels.c holds the floating
 * kernels and the module; _integer_kernels.c the integer kernels, a module of its own so that
 * the two compile at once (each about half of the compile), which hands its table to
 * _kernels.c in a capsule when _kernels loads. */

#ifndef COLLECTIVES_KERNELS_H
#define COLLECTIVES_KERNELS_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#define BLOCK 512 /* elements per accumulator block: 4 KiB of float64 */
#define MAX_OPERANDS 64

/* Each kernel is compiled for AVX-512, AVX2 and the baseline, chosen at load time. The integer
 * kernels leave out the AVX-512 clone: they were most of the compile (-O3: 44 of 55 s), and the
 * reductions that training runs at scale are of floats. */
#if defined(__x86_64__) && defined(__GNUC__) && defined(__has_attribute)
#if __has_attribute(target_clones) && defined(__GLIBC__)
#define CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#define INT_CLONES __attribute__((target_clones("avx2", "default")))
#endif
#endif
#ifndef CLONES
#define CLONES
#define INT_CLONES
#endif

enum { OP_SUM = 0, OP_PROD = 1, OP_MAX = 2, OP_MIN = 3 };

typedef void (*kernel_fn)(char *, const char *, const char *const *, Py_ssize_t, Py_ssize_t);

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
#define KERNEL_WITH(ATTR, NAME, T, W, F)                                                   \
    ATTR static void NAME(char *dst, const char *first, const char *const *srcs,          \
                            Py_ssize_t k, Py_ssize_t n)                                     \
    {                                                                                       \
        /* up to three sources: one pass over everything; more: blocks kept in L1 */        \
        Py_ssize_t step = k <= 3 ? (n > 0 ? n : 1) : BLOCK;                                 \
        for (Py_ssize_t lo = 0; lo < n; lo += step) {                                       \
            Py_ssize_t m = n - lo < step ? n - lo : step;                                   \
            T *restrict out = (T *)dst + lo;                                                \
            BLOCK_BODY(T, W, F, out);                                                       \
        }                                                                                   \
    }                                                                                       \
    ATTR static void NAME##_acc(char *dst, const char *first, const char *const *srcs,    \
                                  Py_ssize_t k, Py_ssize_t n)                               \
    {                                                                                       \
        T acc[BLOCK];                                                                       \
        for (Py_ssize_t lo = 0; lo < n; lo += BLOCK) {                                      \
            Py_ssize_t m = n - lo < BLOCK ? n - lo : BLOCK;                                 \
            BLOCK_BODY(T, W, F, acc);                                                       \
            memcpy((T *)dst + lo, acc, (size_t)m * sizeof(T));                              \
        }                                                                                   \
    }

/* The integer kernels' table, [in place?][op][type - 2] for the types i8 i16 i32 i64 u8 u16
 * u32 u64 (codes 2 to 9), in the capsule _integer_kernels.TABLE (named INTEGER_CAPSULE). */
#define INTEGER_TYPES 8
#define INTEGER_CAPSULE "collectives._integer_kernels.TABLE"
typedef kernel_fn integer_table[2][4][INTEGER_TYPES];

#endif
