/* Vector helpers shared by the native kernels (stacked_readout.c, tilted_moments.c; docs/performance.md#native-readout):
   GCC vector extensions, 64-byte vectors where AVX-512 is there, else 32-byte ones; 2^x (x ≤ 0) as the Taylor
   polynomial of 2^f, f = x − k ∈ [−½, ½], times 2^k set in the exponent bits (the polynomial within 1.5e-8
   of 2^f for float, 4e-17 for double; with the type's own rounding, within about one ulp); sums and maxima across lanes in a fixed order. Concatenated before each kernel's
   source (largeprompt.kernel.native_build), so that the two compile from one text. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#ifdef __AVX512F__
#define VBYTES 64
#else
#define VBYTES 32
#endif

typedef float vf __attribute__((vector_size(VBYTES)));
typedef int32_t vfi __attribute__((vector_size(VBYTES)));
typedef double vd __attribute__((vector_size(VBYTES)));
typedef int64_t vdi __attribute__((vector_size(VBYTES)));
#define NF (VBYTES / 4)
#define ND (VBYTES / 8)
#define LOG2E 1.4426950408889634

static inline vf exp2_vf(vf x) {
    const vf lo = (vf){} - 125.0f;
    x = (vf)(((vfi)x & ~(x < lo)) | ((vfi)lo & (x < lo)));
    vfi k = __builtin_convertvector(x - 0.5f, vfi); /* ceil(x − ½) for x ≤ 0: the nearest integer */
    vf f = x - __builtin_convertvector(k, vf);
    vf p = (vf){} + 1.5252733804059838e-05f;
    p = 0.00015403530393381606f + f * p;
    p = 0.0013333558146428441f + f * p;
    p = 0.009618129107628477f + f * p;
    p = 0.055504108664821576f + f * p;
    p = 0.2402265069591007f + f * p;
    p = 0.6931471805599453f + f * p;
    p = 1.0f + f * p; /* Σ (f ln 2)^n / n!, n ≤ 7 */
    return p * (vf)((k + 127) << 23);
}

static inline vd exp2_vd(vd x) {
    static const double c[14] = {1.0, 0.6931471805599453, 0.2402265069591007, 0.055504108664821576,
                                 0.009618129107628477, 0.0013333558146428441, 0.00015403530393381606,
                                 1.5252733804059838e-05, 1.3215486790144305e-06, 1.0178086009239696e-07,
                                 7.054911620801121e-09, 4.44553827187081e-10, 2.5678435993488196e-11,
                                 1.3691488853904124e-12}; /* (ln 2)^n / n! */
    const vd lo = (vd){} - 1020.0;
    x = (vd)(((vdi)x & ~(x < lo)) | ((vdi)lo & (x < lo)));
    vdi k = __builtin_convertvector(x - 0.5, vdi);
    vd f = x - __builtin_convertvector(k, vd);
    vd p = (vd){} + c[13];
    for (int n = 12; n >= 0; n--) p = c[n] + f * p;
    return p * (vd)((k + 1023) << 52);
}

/* Sums and maxima across lanes by halving (a fixed tree: the same order on every call). */
#ifdef __clang__
#define SHUFFLE(v, idx) __builtin_shufflevector(v, v, idx)
#else
#define SHUFFLE(v, idx) __builtin_shuffle(v, idx)
#endif
#if VBYTES == 64
#define HALVES_F ((vfi){8, 9, 10, 11, 12, 13, 14, 15, 0, 1, 2, 3, 4, 5, 6, 7})
#define QUARTERS_F ((vfi){4, 5, 6, 7, 0, 1, 2, 3, 12, 13, 14, 15, 8, 9, 10, 11})
#define PAIRS_F ((vfi){2, 3, 0, 1, 6, 7, 4, 5, 10, 11, 8, 9, 14, 15, 12, 13})
#define SINGLES_F ((vfi){1, 0, 3, 2, 5, 4, 7, 6, 9, 8, 11, 10, 13, 12, 15, 14})
#define HALVES_D ((vdi){4, 5, 6, 7, 0, 1, 2, 3})
#define PAIRS_D ((vdi){2, 3, 0, 1, 6, 7, 4, 5})
#define SINGLES_D ((vdi){1, 0, 3, 2, 5, 4, 7, 6})
#define FOLD_F(v, OP) (v = OP(v, SHUFFLE(v, HALVES_F)), v = OP(v, SHUFFLE(v, QUARTERS_F)), v = OP(v, SHUFFLE(v, PAIRS_F)), v = OP(v, SHUFFLE(v, SINGLES_F)))
#define FOLD_D(v, OP) (v = OP(v, SHUFFLE(v, HALVES_D)), v = OP(v, SHUFFLE(v, PAIRS_D)), v = OP(v, SHUFFLE(v, SINGLES_D)))
#else
#define HALVES_F ((vfi){4, 5, 6, 7, 0, 1, 2, 3})
#define PAIRS_F ((vfi){2, 3, 0, 1, 6, 7, 4, 5})
#define SINGLES_F ((vfi){1, 0, 3, 2, 5, 4, 7, 6})
#define HALVES_D ((vdi){2, 3, 0, 1})
#define SINGLES_D ((vdi){1, 0, 3, 2})
#define FOLD_F(v, OP) (v = OP(v, SHUFFLE(v, HALVES_F)), v = OP(v, SHUFFLE(v, PAIRS_F)), v = OP(v, SHUFFLE(v, SINGLES_F)))
#define FOLD_D(v, OP) (v = OP(v, SHUFFLE(v, HALVES_D)), v = OP(v, SHUFFLE(v, SINGLES_D)))
#endif
#if VBYTES == 64
#define LANES_float ((vfi){0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15})
#define LANES_double ((vdi){0, 1, 2, 3, 4, 5, 6, 7})
#else
#define LANES_float ((vfi){0, 1, 2, 3, 4, 5, 6, 7})
#define LANES_double ((vdi){0, 1, 2, 3})
#endif
/* Lanewise select by a comparison's mask (all ones: x, else y), and the lanewise maximum made of it (no NaN in). */
#define VSELECT(V, VI, mask, x, y) ((V)(((VI)(x) & (mask)) | ((VI)(y) & ~(mask))))
#define VMAX(V, VI, x, y) VSELECT(V, VI, (x) < (y), y, x)

/* The online softmax of both kernels, one chunk at a time (docs/performance.md#native-moments):
   CHUNK_SCORES puts the scores of vectors k0 … k1−1 in out[k − k0] (SCORE: an expression in k_), the last vector's
   lanes past the prompt (k_ ≥ full) set to the running lanewise maximum `high` so that they never raise it, and
   leaves the chunk's lanewise maximum in `high`; RAISE_REFERENCE then, where the chunk's maximum `top` exceeds the
   reference `ref` the sums were taken under, scales them by 2^(ref − top) (0 while nothing is summed: ref = −∞)
   with the statement RESCALE, which reads `factor`, and raises `ref` to `top`: no weight exceeds 1. */
#define CHUNK_SCORES(V, VI, out, k0, k1, full, tail_mask, high, SCORE)                                              \
    for (int k_ = (k0); k_ < (k1); k_++) {                                                                          \
        V x_ = SCORE;                                                                                               \
        if (k_ >= (full)) x_ = VSELECT(V, VI, tail_mask, x_, high);                                                 \
        out[k_ - (k0)] = x_;                                                                                        \
        high = VMAX(V, VI, high, x_);                                                                               \
    }
#define RAISE_REFERENCE(T, V, EXP2, ref, top, RESCALE)                                                              \
    if ((top) > (ref)) {                                                                                            \
        const T factor = (ref) == -INFINITY ? (T)0 : EXP2((V){} + ((ref) - (top)))[0];                              \
        RESCALE;                                                                                                    \
        (ref) = (top);                                                                                              \
    }

#define ADD(x, y) ((x) + (y))
#define MAXF(x, y) VMAX(vf, vfi, x, y)
#define MAXD(x, y) VMAX(vd, vdi, x, y)
static inline float hsum_vf(vf v) { return FOLD_F(v, ADD), v[0]; }
static inline double hsum_vd(vd v) { return FOLD_D(v, ADD), v[0]; }
static inline float hmax_vf(vf v) { return FOLD_F(v, MAXF), v[0]; }
static inline double hmax_vd(vd v) { return FOLD_D(v, MAXD), v[0]; }
static inline vf load_vf(const float *ptr) { /* consecutive tokens of one feature, at any alignment */
    vf v;
    memcpy(&v, ptr, sizeof v);
    return v;
}
static inline vd load_vd(const double *ptr) {
    vd v;
    memcpy(&v, ptr, sizeof v);
    return v;
}

#define V_float vf
#define VI_float vfi
#define LOAD_float load_vf
#define EXP2_float exp2_vf
#define HSUM_float hsum_vf
#define HMAX_float hmax_vf
#define V_double vd
#define VI_double vdi
#define LOAD_double load_vd
#define EXP2_double exp2_vd
#define HSUM_double hsum_vd
#define HMAX_double hmax_vd
