/* The native hot loop of the streaming tilted moments (docs/performance.md#native-moments).

   Prompt b (b < n) holds tokens z_i ∈ R^D, i < l, z_ij at t[b·bs + i·ts + j·fs] (any strides: a prompt shared by
   every query has bs = 0). Query r of prompt b has the base-2 tilt a = log₂e · a_true, a reference score M [n, q]
   and the sums S [n, q, W] at s[b·sn + r·sq + k·sw], W = 1 + D (+ D² with the second moment), laid out as the torch
   path lays them out: S = Σ_i 2^(a·z_i − M) [z_i, 1, z_i ⊗ z_i].

   A block of CHUNK tokens is copied feature-major into L1 once and serves every query of its prompt. For each
   query, its scores stay in L1; where the chunk's maximum exceeds M, S is rescaled by 2^(M − max) and M raised, so
   no weight exceeds 1 and nothing overflows (M = −∞ on entry means "no token yet"). Weights and sums are kept in
   vector lanes and added across lanes in a fixed order, so a result depends only on the inputs; only the
   symmetric second moment's upper triangle is summed. The vector helpers (2^x, lane sums) are vector_math.h's. */
#define CHUNK_VECTORS 32
#define MAX_D 8

/* One query over one chunk already in L1 (zc[j] the chunk's feature j, zero-padded to whole vectors): raise M if
   the chunk's maximum exceeds it, then add the chunk's weighted sums to S. SECOND: also the z ⊗ z rows. */
#define DEFINE_QUERY(NAME, T, V, VI, N, EXP2, HSUM, HMAX, DD, SECOND)                                          \
    static void NAME(V zc[DD][CHUNK_VECTORS], int len, const T *a, T *ref, T *s, int64_t sw) {                  \
        const int full = len / N, vectors = (len + N - 1) / N;                                                  \
        const VI tail_mask = LANES_##T < (len - full * N); /* the valid lanes of the last vector */              \
        V sc[CHUNK_VECTORS], high = (V){} - INFINITY;                                                           \
        CHUNK_SCORES(V, VI, sc, 0, vectors, full, tail_mask, high,                                              \
                     ({ V x = {}; for (int j = 0; j < DD; j++) x += a[j] * zc[j][k_]; x; }))                    \
        const T top = HMAX(high);                                                                               \
        RAISE_REFERENCE(T, V, EXP2, *ref, top, for (int k = 0; k < 1 + DD + (SECOND ? DD * DD : 0); k++) s[k * sw] *= factor) \
        V Z = {}, m[DD] = {}, c[SECOND ? DD * (DD + 1) / 2 : 1] = {};                                           \
        for (int k = 0; k < vectors; k++) {                                                                     \
            V e = EXP2(sc[k] - *ref);                                                                           \
            if (k >= full) e = VSELECT(V, VI, tail_mask, e, (V){});                                             \
            Z += e;                                                                                             \
            for (int j = 0, p = 0; j < DD; j++) {                                                               \
                const V ez = e * zc[j][k];                                                                      \
                m[j] += ez;                                                                                     \
                if (SECOND)                                                                                     \
                    for (int i = j; i < DD; i++, p++) c[p] += ez * zc[i][k];                                    \
            }                                                                                                   \
        }                                                                                                       \
        for (int j = 0; j < DD; j++) s[j * sw] += HSUM(m[j]);                                                   \
        s[DD * sw] += HSUM(Z);                                                                                  \
        if (SECOND)                                                                                             \
            for (int j = 0, p = 0; j < DD; j++)                                                                 \
                for (int i = j; i < DD; i++, p++) {                                                             \
                    const T add = HSUM(c[p]);                                                                   \
                    s[(1 + DD + j * DD + i) * sw] += add;                                                       \
                    if (i != j) s[(1 + DD + i * DD + j) * sw] += add;                                           \
                }                                                                                               \
    }

/* Every prompt and query of one D: the prompt's chunk is copied feature-major into L1, then each query reads it. */
#define DEFINE_D(NAME, T, N, DD)                                                                                \
    DEFINE_QUERY(NAME##_first, T, V_##T, VI_##T, N, EXP2_##T, HSUM_##T, HMAX_##T, DD, 0)                         \
    DEFINE_QUERY(NAME##_second, T, V_##T, VI_##T, N, EXP2_##T, HSUM_##T, HMAX_##T, DD, 1)                        \
    static void NAME(const T *t, int64_t bs, int64_t ts, int64_t fs, int64_t n, int64_t l, int64_t q, const T *a, T *ref,   \
                     T *s, int64_t sn, int64_t sq, int64_t sw, int second) {                                    \
        V_##T zc[DD][CHUNK_VECTORS] __attribute__((aligned(VBYTES)));                                            \
        for (int64_t b = 0; b < n; b++)                                                                         \
            for (int64_t c0 = 0; c0 < l; c0 += CHUNK_VECTORS * N) {                                             \
                const int len = l - c0 < CHUNK_VECTORS * N ? (int)(l - c0) : CHUNK_VECTORS * N;                 \
                const T *base = t + b * bs + c0 * ts;                                                           \
                T *flat = (T *)zc;                                                                              \
                for (int j = 0; j < DD; j++) {                                                                  \
                    T *row = flat + j * CHUNK_VECTORS * N;                                                      \
                    for (int i = 0; i < len; i++) row[i] = base[(int64_t)i * ts + j * fs];                      \
                    for (int i = len; i < (len + N - 1) / N * N; i++) row[i] = (T)0;                            \
                }                                                                                               \
                for (int64_t r = 0; r < q; r++) {                                                               \
                    const int64_t at = b * q + r;                                                               \
                    T *out = s + b * sn + r * sq;                                                               \
                    if (second)                                                                                 \
                        NAME##_second(zc, len, a + at * DD, ref + at, out, sw);                                 \
                    else                                                                                        \
                        NAME##_first(zc, len, a + at * DD, ref + at, out, sw);                                  \
                }                                                                                               \
            }                                                                                                   \
    }

#define DEFINE_ALL_D(T, N)                                                                                      \
    DEFINE_D(moments_##T##_1, T, N, 1)                                                                          \
    DEFINE_D(moments_##T##_2, T, N, 2)                                                                          \
    DEFINE_D(moments_##T##_3, T, N, 3)                                                                          \
    DEFINE_D(moments_##T##_4, T, N, 4)                                                                          \
    DEFINE_D(moments_##T##_5, T, N, 5)                                                                          \
    DEFINE_D(moments_##T##_6, T, N, 6)                                                                          \
    DEFINE_D(moments_##T##_7, T, N, 7)                                                                          \
    DEFINE_D(moments_##T##_8, T, N, 8)

DEFINE_ALL_D(float, NF)
DEFINE_ALL_D(double, ND)

/* The entry points: tokens t [n, l, D] at strides (bs, ts, fs), base-2 tilts a [n, q, D] contiguous, references
   ref [n, q] contiguous (−∞: no token yet), sums s [n, q, W] at strides (sn, sq, sw); both updated in place.
   Returns 0, or 1 if D is outside 1…MAX_D (the caller then uses torch). */
#define ARGS t, bs, ts, fs, n, l, q, a, ref, s, sn, sq, sw, second
#define DEFINE_ENTRY(T)                                                                                         \
    int tilted_moments_##T(const T *t, int64_t bs, int64_t ts, int64_t fs, int64_t n, int64_t l, int D, int64_t q,  \
                           const T *a, T *ref, T *s, int64_t sn, int64_t sq, int64_t sw, int second) {          \
        switch (D) {                                                                                            \
        case 1: moments_##T##_1(ARGS); return 0;                                                                \
        case 2: moments_##T##_2(ARGS); return 0;                                                                \
        case 3: moments_##T##_3(ARGS); return 0;                                                                \
        case 4: moments_##T##_4(ARGS); return 0;                                                                \
        case 5: moments_##T##_5(ARGS); return 0;                                                                \
        case 6: moments_##T##_6(ARGS); return 0;                                                                \
        case 7: moments_##T##_7(ARGS); return 0;                                                                \
        case 8: moments_##T##_8(ARGS); return 0;                                                                \
        default: return 1;                                                                                      \
        }                                                                                                       \
    }

DEFINE_ENTRY(float)
DEFINE_ENTRY(double)
