/* The stacked engine's softmax readout in one pass over each prompt (docs/performance.md#native-readout).

   For prompt b (tokens z_i ∈ R^D, i < L, stored feature by feature: z_ij at p + b·bs + j·fs + i) and run r
   (tilt a_br, already scaled by log₂e, and value direction u_r):

     s_i = a_br·z_i,  w_i = u_r·z_i,  e_i = 2^(s_i − M),  Z = Σ e_i,
     mean_br = Σ e_i z_i / Z,  tilted_br = Σ e_i w_i z_i / Z,

   M the running maximum of the scores (rescaled chunk by chunk, so that nothing overflows), and once per prompt
   second_b = Σ z_i z_iᵀ / L. A chunk's scores stay in L1; the sums are kept in vector lanes and added across
   lanes in a fixed order, so a result depends only on the inputs. 2^x (x ≤ 0) is the Taylor polynomial of 2^f,
   f = x − k ∈ [−½, ½], times 2^k set in the exponent bits: relative error below 1.5e-8 (float), 4e-17
   (double). GCC vector extensions: 64-byte vectors where AVX-512 is there, else 32-byte ones. */
#include <math.h>
#include <stdint.h>
#include <string.h>

#ifdef __AVX512F__
#define VBYTES 64
#else
#define VBYTES 32
#endif
#define CHUNK_VECTORS 16

typedef float vf __attribute__((vector_size(VBYTES)));
typedef int32_t vfi __attribute__((vector_size(VBYTES)));
typedef double vd __attribute__((vector_size(VBYTES)));
typedef int64_t vdi __attribute__((vector_size(VBYTES)));
#define NF (VBYTES / 4)
#define ND (VBYTES / 8)

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

static inline float hsum_vf(vf v) {
    float s = 0.0f;
    for (int l = 0; l < NF; l++) s += v[l];
    return s;
}
static inline double hsum_vd(vd v) {
    double s = 0.0;
    for (int l = 0; l < ND; l++) s += v[l];
    return s;
}
static inline float hmax_vf(vf v) {
    float s = v[0];
    for (int l = 1; l < NF; l++) s = v[l] > s ? v[l] : s;
    return s;
}
static inline double hmax_vd(vd v) {
    double s = v[0];
    for (int l = 1; l < ND; l++) s = v[l] > s ? v[l] : s;
    return s;
}

/* A vector of consecutive tokens of one feature, at any alignment. */
static inline vf load_vf(const float *ptr) {
    vf v;
    memcpy(&v, ptr, sizeof v);
    return v;
}
static inline vd load_vd(const double *ptr) {
    vd v;
    memcpy(&v, ptr, sizeof v);
    return v;
}
#define LOADV(V, ptr) _Generic((ptr), const float *: load_vf, float *: load_vf, const double *: load_vd, double *: load_vd)(ptr)

/* One prompt, every run, D a compile-time constant. z[j] → feature j's L tokens (the tail padded in pad). */
#define DEFINE_PROMPT(NAME, T, V, VI, N, EXP2, HSUM, HMAX, DD)                                                    \
    static void NAME(const T *const *z, const T *pad, int L, int S, const T *a, const T *u, T *mean, T *tilted,  \
                     T *second) {                                                                                 \
        const int full = L / N, vectors = (L + N - 1) / N;                                                        \
        VI tail_mask;                                                                                             \
        for (int l = 0; l < N; l++) tail_mask[l] = l < L - full * N ? -1 : 0;                                     \
        V s[CHUNK_VECTORS];                                                                                       \
        for (int r = 0; r < S; r++) {                                                                             \
            const T *ar = a + r * DD, *ur = u + r * DD;                                                           \
            V Z = {}, m[DD] = {}, t[DD] = {};                                                                     \
            T top = -INFINITY;                                                                                    \
            for (int c0 = 0; c0 < vectors; c0 += CHUNK_VECTORS) {                                                 \
                const int c1 = c0 + CHUNK_VECTORS < vectors ? c0 + CHUNK_VECTORS : vectors;                       \
                V high = (V){} - INFINITY;                                                                        \
                for (int k = c0; k < c1; k++) {                                                                   \
                    V sc = {};                                                                                    \
                    for (int j = 0; j < DD; j++)                                                                  \
                        sc += ar[j] * (k < full ? LOADV(V, z[j] + k * N) : LOADV(V, pad + j * N));                \
                    if (k >= full) sc = (V)(((VI)sc & tail_mask) | ((VI)high & ~tail_mask));              \
                    s[k - c0] = sc;                                                                               \
                    high = (V)(((VI)high & ~(high < sc)) | ((VI)sc & (high < sc)));                               \
                }                                                                                                 \
                const T chunk_top = HMAX(high);                                                                   \
                if (chunk_top > top) { /* rescale what was summed under the old maximum */                        \
                    const T factor = top == -INFINITY ? (T)0 : EXP2((V){} + (top - chunk_top))[0];                \
                    Z *= factor;                                                                                  \
                    for (int j = 0; j < DD; j++) m[j] *= factor, t[j] *= factor;                                  \
                    top = chunk_top;                                                                              \
                }                                                                                                 \
                for (int k = c0; k < c1; k++) {                                                                   \
                    V e = EXP2(s[k - c0] - top), w = {};                                                          \
                    if (k >= full) e = (V)((VI)e & tail_mask);                                                \
                    const T *base = k < full ? 0 : pad;                                                           \
                    V zk[DD];                                                                                     \
                    for (int j = 0; j < DD; j++) zk[j] = base ? LOADV(V, pad + j * N) : LOADV(V, z[j] + k * N);   \
                    for (int j = 0; j < DD; j++) w += ur[j] * zk[j];                                              \
                    Z += e;                                                                                       \
                    const V ew = e * w;                                                                           \
                    for (int j = 0; j < DD; j++) m[j] += e * zk[j];                                               \
                    if (tilted)                                                                                   \
                        for (int j = 0; j < DD; j++) t[j] += ew * zk[j];                                          \
                }                                                                                                 \
            }                                                                                                     \
            const T total = HSUM(Z);                                                                              \
            for (int j = 0; j < DD; j++) {                                                                        \
                mean[r * DD + j] = HSUM(m[j]) / total;                                                            \
                if (tilted) tilted[r * DD + j] = HSUM(t[j]) / total;                                              \
            }                                                                                                     \
        }                                                                                                         \
        if (!second) return;                                                                                      \
        V acc[DD][DD] = {};                                                                                       \
        for (int k = 0; k < vectors; k++) {                                                                       \
            V zk[DD];                                                                                             \
            for (int j = 0; j < DD; j++) zk[j] = k < full ? LOADV(V, z[j] + k * N) : LOADV(V, pad + j * N);       \
            for (int j = 0; j < DD; j++)                                                                          \
                for (int i = j; i < DD; i++) acc[j][i] += zk[j] * zk[i];                                          \
        }                                                                                                         \
        for (int j = 0; j < DD; j++)                                                                              \
            for (int i = j; i < DD; i++) second[j * DD + i] = second[i * DD + j] = HSUM(acc[j][i]) / L;           \
    }

/* Every prompt b < B of one D: gathers feature pointers, pads the tail and calls the D-specialised prompt. */
#define DEFINE_BATCH_D(NAME, PROMPT, T, N, DD)                                                                    \
    DEFINE_PROMPT(PROMPT, T, V_##T, VI_##T, N, EXP2_##T, HSUM_##T, HMAX_##T, DD)                                  \
    static void NAME(const T *p, int64_t bs, int64_t fs, int B, int L, int S, const T *a, const T *u, T *mean,    \
                     T *tilted, T *second) {                                                                      \
        const T *z[DD];                                                                                           \
        T pad[DD * N] __attribute__((aligned(VBYTES)));                                                           \
        const int full = L / N;                                                                                   \
        for (int b = 0; b < B; b++) {                                                                             \
            for (int j = 0; j < DD; j++) {                                                                        \
                z[j] = p + b * bs + j * fs;                                                                       \
                for (int l = 0; l < N; l++) pad[j * N + l] = full * N + l < L ? z[j][full * N + l] : (T)0;        \
            }                                                                                                     \
            const int64_t rows = (int64_t)b * S * DD;                                                             \
            PROMPT(z, pad, L, S, a + rows, u, mean + rows, tilted ? tilted + rows : 0,                            \
                   second ? second + (int64_t)b * DD * DD : 0);                                                   \
        }                                                                                                         \
    }

#define V_float vf
#define VI_float vfi
#define EXP2_float exp2_vf
#define HSUM_float hsum_vf
#define HMAX_float hmax_vf
#define V_double vd
#define VI_double vdi
#define EXP2_double exp2_vd
#define HSUM_double hsum_vd
#define HMAX_double hmax_vd

#define DEFINE_ALL_D(T, N)                                                                                        \
    DEFINE_BATCH_D(batch_##T##_2, prompt_##T##_2, T, N, 2)                                                        \
    DEFINE_BATCH_D(batch_##T##_3, prompt_##T##_3, T, N, 3)                                                        \
    DEFINE_BATCH_D(batch_##T##_4, prompt_##T##_4, T, N, 4)                                                        \
    DEFINE_BATCH_D(batch_##T##_5, prompt_##T##_5, T, N, 5)                                                        \
    DEFINE_BATCH_D(batch_##T##_6, prompt_##T##_6, T, N, 6)                                                        \
    DEFINE_BATCH_D(batch_##T##_7, prompt_##T##_7, T, N, 7)                                                        \
    DEFINE_BATCH_D(batch_##T##_8, prompt_##T##_8, T, N, 8)

DEFINE_ALL_D(float, NF)
DEFINE_ALL_D(double, ND)

/* The entry points: tokens at p + b·bs + j·fs + i; a [B, S, D], u [S, D]; mean and tilted [B, S, D] (tilted may be
   NULL), second [B, D, D] (may be NULL). Returns 0, or 1 if D is outside 2…8 (the caller then uses torch). */
#define DEFINE_ENTRY(T)                                                                                           \
    int stacked_readout_##T(const T *p, int64_t bs, int64_t fs, int B, int L, int D, int S, const T *a,           \
                            const T *u, T *mean, T *tilted, T *second) {                                          \
        switch (D) {                                                                                              \
        case 2: batch_##T##_2(p, bs, fs, B, L, S, a, u, mean, tilted, second); return 0;                          \
        case 3: batch_##T##_3(p, bs, fs, B, L, S, a, u, mean, tilted, second); return 0;                          \
        case 4: batch_##T##_4(p, bs, fs, B, L, S, a, u, mean, tilted, second); return 0;                          \
        case 5: batch_##T##_5(p, bs, fs, B, L, S, a, u, mean, tilted, second); return 0;                          \
        case 6: batch_##T##_6(p, bs, fs, B, L, S, a, u, mean, tilted, second); return 0;                          \
        case 7: batch_##T##_7(p, bs, fs, B, L, S, a, u, mean, tilted, second); return 0;                          \
        case 8: batch_##T##_8(p, bs, fs, B, L, S, a, u, mean, tilted, second); return 0;                          \
        default: return 1;                                                                                        \
        }                                                                                                         \
    }

DEFINE_ENTRY(float)
DEFINE_ENTRY(double)
