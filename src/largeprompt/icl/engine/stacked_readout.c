/* The stacked engine's readout of every run in one pass over each prompt (docs/performance.md#native-readout).

   Prompt b holds tokens z'_i ∈ R^D, i < L, stored feature by feature (z'_ij at p + b·bs + j·fs + i); the true
   tokens are z = T z' (T the frame of a whitened draw, or I). Run r has tilt a_br = U_r q_b and value direction
   u_r; in the prompt's frame a' = Tᵀa and u' = Tᵀu, so that s_i = a·z_i = a'·z'_i and w_i = u'·z'_i.

   softmax run (tilt scaled by log₂e, e_i = 2^(s_i − M), M the running maximum, Z = Σ e_i):
     m' = Σ e z' / Z,  n' = Σ e w z' / Z,  ŷ = u'·m',  ∇a-moment = T (n' − ŷ m'),  ∇u-moment = T m';
   linear run (C' = Σ z' z'ᵀ / L, once per prompt):
     ŷ = a'·C'u',  ∇a-moment = T C'u',  ∇u-moment = T C'a'.

   A softmax run's scores stay in a chunk of CHUNK_VECTORS vectors in L1, rescaled when the maximum grows, so
   nothing overflows; sums are kept in vector lanes and added across lanes in a fixed order, so a result depends
   only on the inputs. 2^x (x ≤ 0) is the Taylor polynomial of 2^f, f = x − k ∈ [−½, ½], times 2^k set in the
   exponent bits: within about one ulp (the polynomial is within 1.5e-8 / 4e-17 of 2^f). GCC vector extensions: 64-byte vectors
   where AVX-512 is there, else 32-byte ones. */
#define CHUNK_VECTORS 16
#define MAX_D 8

/* Vector k of feature j: from memory, or for the last, partial vector from the zero-padded copy. */
#define ZV(LOAD, N, j, k) ((k) < full ? LOAD(z[j] + (k) * (N)) : LOAD(pad + (j) * (N)))

/* One softmax run on one prompt, D = DD: m' and (if tilted) n' of the header, from the base-2 tilt and u'. */
#define DEFINE_SOFTMAX(NAME, T, V, VI, N, LOAD, EXP2, HSUM, HMAX, DD)                                            \
    static void NAME(const T *const *z, const T *pad, int L, const T *tilt, const T *up, T *mean, T *tilted) {   \
        const int full = L / N, vectors = (L + N - 1) / N;                                                       \
        const VI tail_mask = LANES_##T < (L - full * N); /* the valid lanes of the last vector: all ones */       \
        V s[CHUNK_VECTORS], Z = {}, m[DD] = {}, t[DD] = {};                                                      \
        T top = -INFINITY;                                                                                       \
        for (int c0 = 0; c0 < vectors; c0 += CHUNK_VECTORS) {                                                    \
            const int c1 = c0 + CHUNK_VECTORS < vectors ? c0 + CHUNK_VECTORS : vectors;                          \
            V high = (V){} - INFINITY;                                                                           \
            CHUNK_SCORES(V, VI, s, c0, c1, full, tail_mask, high,                                                \
                         ({ V x = {}; for (int j = 0; j < DD; j++) x += tilt[j] * ZV(LOAD, N, j, k_); x; }))     \
            const T chunk_top = HMAX(high);                                                                      \
            RAISE_REFERENCE(T, V, EXP2, top, chunk_top,                                                          \
                            { Z *= factor; for (int j = 0; j < DD; j++) (m[j] *= factor, t[j] *= factor); })     \
            for (int k = c0; k < c1; k++) {                                                                      \
                V e = EXP2(s[k - c0] - top), w = {}, zk[DD];                                                     \
                if (k >= full) e = VSELECT(V, VI, tail_mask, e, (V){});                                          \
                for (int j = 0; j < DD; j++) zk[j] = ZV(LOAD, N, j, k);                                                   \
                Z += e;                                                                                          \
                for (int j = 0; j < DD; j++) m[j] += e * zk[j];                                                  \
                if (!tilted) continue;                                                                           \
                for (int j = 0; j < DD; j++) w += up[j] * zk[j];                                                 \
                const V ew = e * w;                                                                              \
                for (int j = 0; j < DD; j++) t[j] += ew * zk[j];                                                 \
            }                                                                                                    \
        }                                                                                                        \
        const T inverse = (T)1 / HSUM(Z);                                                                        \
        for (int j = 0; j < DD; j++) {                                                                           \
            mean[j] = HSUM(m[j]) * inverse;                                                                      \
            if (tilted) tilted[j] = HSUM(t[j]) * inverse;                                                        \
        }                                                                                                        \
    }

/* C' = Σ z' z'ᵀ / L of one prompt [DD, DD]. */
#define DEFINE_SECOND(NAME, T, V, N, LOAD, HSUM, DD)                                                             \
    static void NAME(const T *const *z, const T *pad, int L, T *second) {                                        \
        const int full = L / N, vectors = (L + N - 1) / N;                                                       \
        V acc[DD][DD] = {};                                                                                      \
        for (int k = 0; k < vectors; k++) {                                                                      \
            V zk[DD];                                                                                            \
            for (int j = 0; j < DD; j++) zk[j] = ZV(LOAD, N, j, k);                                                       \
            for (int j = 0; j < DD; j++)                                                                         \
                for (int i = j; i < DD; i++) acc[j][i] += zk[j] * zk[i];                                         \
        }                                                                                                        \
        for (int j = 0; j < DD; j++)                                                                             \
            for (int i = j; i < DD; i++) second[j * DD + i] = second[i * DD + j] = HSUM(acc[j][i]) / L;          \
    }

/* out = T v, or Tᵀ v if ``transposed`` (T [D, D] row-major), or v where there is no frame; v and out are read
   and written with strides vs and os (a column of a matrix: stride D), and may be the same vector. */
#define DEFINE_FRAMED(NAME, T)                                                                                   \
    static inline void NAME(const T *frame, int transposed, const T *v, int vs, int D, T *out, int os) {         \
        T mapped[MAX_D];                                                                                         \
        for (int j = 0; j < D; j++) {                                                                            \
            T acc = 0;                                                                                           \
            if (!frame) acc = v[j * vs];                                                                         \
            else                                                                                                 \
                for (int k = 0; k < D; k++) acc += (transposed ? frame[k * D + j] : frame[j * D + k]) * v[k * vs]; \
            mapped[j] = acc;                                                                                     \
        }                                                                                                        \
        for (int j = 0; j < D; j++) out[j * os] = mapped[j];                                                     \
    }
DEFINE_FRAMED(framed_float, float)
DEFINE_FRAMED(framed_double, double)

/* Every run on one prompt (a [R, D] of this prompt, up = u' [R, D]); outputs this prompt's rows (for_a and for_u
   NULL: the prediction only). */
#define DEFINE_PROMPT(NAME, SOFTMAX, SECOND, FRAMED, T, DD)                                                      \
    static void NAME(const T *const *z, const T *pad, int L, int R, const uint8_t *softmax, const T *a,          \
                     const T *up, const T *frame, T *pred, T *for_a, T *for_u) {                                 \
        T second[DD * DD], ap[DD], tilt[DD], mean[DD], tilted[DD], fa[DD], fu[DD];                               \
        int have_second = 0;                                                                                     \
        for (int r = 0; r < R; r++) {                                                                            \
            const T *ur = up + r * DD;                                                                           \
            FRAMED(frame, 1, a + r * DD, 1, DD, ap, 1); /* a' = Tᵀa */                                           \
            T y = 0;                                                                                             \
            if (softmax[r]) {                                                                                    \
                for (int j = 0; j < DD; j++) tilt[j] = (T)LOG2E * ap[j];                                         \
                SOFTMAX(z, pad, L, tilt, ur, mean, for_a ? tilted : 0);                                          \
                for (int j = 0; j < DD; j++) y += ur[j] * mean[j];                                               \
                for (int j = 0; j < DD; j++) fa[j] = for_a ? tilted[j] - y * mean[j] : 0, fu[j] = mean[j];       \
            } else {                                                                                             \
                if (!have_second) SECOND(z, pad, L, second), have_second = 1;                                    \
                for (int j = 0; j < DD; j++) {                                                                   \
                    T cu = 0, ca = 0;                                                                            \
                    for (int k = 0; k < DD; k++) cu += second[j * DD + k] * ur[k], ca += second[j * DD + k] * ap[k]; \
                    fa[j] = cu, fu[j] = ca;                                                                      \
                    y += ap[j] * cu;                                                                             \
                }                                                                                                \
            }                                                                                                    \
            pred[r] = y;                                                                                         \
            if (for_a) FRAMED(frame, 0, fa, 1, DD, for_a + r * DD, 1), FRAMED(frame, 0, fu, 1, DD, for_u + r * DD, 1); \
        }                                                                                                        \
    }

/* Every prompt b < B of one D: gathers feature pointers, pads the tail, forms u' = Tᵀu once. */
#define DEFINE_BATCH_D(NAME, T, N, DD)                                                                           \
    DEFINE_SOFTMAX(NAME##_softmax, T, V_##T, VI_##T, N, LOAD_##T, EXP2_##T, HSUM_##T, HMAX_##T, DD)              \
    DEFINE_SECOND(NAME##_second, T, V_##T, N, LOAD_##T, HSUM_##T, DD)                                            \
    DEFINE_PROMPT(NAME##_prompt, NAME##_softmax, NAME##_second, framed_##T, T, DD)                               \
    static void NAME(const T *p, int64_t bs, int64_t fs, int B, int L, int R, const uint8_t *softmax, const T *a, \
                     const T *u, const T *frame, T *pred, T *for_a, T *for_u, const T *query, const T *target,   \
                     T *loss, T *grad_U, T *grad_u) {                                                            \
        const T *z[DD];                                                                                          \
        T pad[DD * N] __attribute__((aligned(VBYTES)));                                                          \
        T up[R * DD + 1], y[R + 1], fa[R * DD + 1], fu[R * DD + 1];                                              \
        for (int r = 0; r < R; r++) framed_##T(frame, 1, u + r * DD, 1, DD, up + r * DD, 1); /* u' = Tᵀu */      \
        if (query) memset(loss, 0, sizeof(T) * R), memset(grad_U, 0, sizeof(T) * R * DD * DD),                   \
            memset(grad_u, 0, sizeof(T) * R * DD);                                                               \
        const int full = L / N;                                                                                  \
        for (int b = 0; b < B; b++) {                                                                            \
            for (int j = 0; j < DD; j++) {                                                                       \
                z[j] = p + b * bs + j * fs;                                                                      \
                for (int l = 0; l < N; l++) pad[j * N + l] = full * N + l < L ? z[j][full * N + l] : (T)0;       \
            }                                                                                                    \
            const int64_t rows = (int64_t)b * R * DD;                                                            \
            const int moments = query || for_a;                                                                  \
            NAME##_prompt(z, pad, L, R, softmax, a + rows, up, frame, query ? y : pred + (int64_t)b * R,         \
                          moments ? (query ? fa : for_a + rows) : 0, moments ? (query ? fu : for_u + rows) : 0);  \
            if (!query) continue;                                                                                \
            for (int r = 0; r < R; r++) { /* the batch MSE and Σ_b ∂ℓ/∂ŷ (∇a-moment ⊗ q_b, ∇u-moment) */        \
                const T residual = y[r] - target[b], g = (T)2 * residual / (T)B;                                 \
                loss[r] += residual * residual;                                                                  \
                for (int j = 0; j < DD; j++) {                                                                   \
                    const T ga = g * fa[r * DD + j];                                                             \
                    for (int k = 0; k < DD; k++) grad_U[(r * DD + j) * DD + k] += ga * query[b * DD + k];        \
                    grad_u[r * DD + j] += g * fu[r * DD + j];                                                    \
                }                                                                                                \
            }                                                                                                    \
        }                                                                                                        \
        if (!query) return;                                                                                      \
        for (int r = 0; r < R; r++) loss[r] /= (T)B;                                                             \
        const T root = sqrt((double)DD);                                                                         \
        for (int i = 0; i < R * DD * DD; i++) grad_U[i] /= root;                                                 \
    }


#define DEFINE_ALL_D(T, N)                                                                                       \
    DEFINE_BATCH_D(batch_##T##_2, T, N, 2)                                                                       \
    DEFINE_BATCH_D(batch_##T##_3, T, N, 3)                                                                       \
    DEFINE_BATCH_D(batch_##T##_4, T, N, 4)                                                                       \
    DEFINE_BATCH_D(batch_##T##_5, T, N, 5)                                                                       \
    DEFINE_BATCH_D(batch_##T##_6, T, N, 6)                                                                       \
    DEFINE_BATCH_D(batch_##T##_7, T, N, 7)                                                                       \
    DEFINE_BATCH_D(batch_##T##_8, T, N, 8)

DEFINE_ALL_D(float, NF)
DEFINE_ALL_D(double, ND)

/* The entry points: tokens at p + b·bs + j·fs + i; softmax [R] (1: softmax, 0: linear), a [B, R, D] (U q, not
   scaled), u [R, D], frame [D, D] (NULL: none). Outputs: pred [B, R], and for_a, for_u [B, R, D] unless NULL; or,
   with query [B, D] and target [B], the batch MSE loss [R], ∇U = Σ_b ∂ℓ/∂ŷ ∇a-moment q_bᵀ/√D [R, D, D] and
   ∇u = Σ_b ∂ℓ/∂ŷ ∇u-moment [R, D] (∂ℓ/∂ŷ = 2(ŷ − y)/B), pred and for_a/for_u then unused. Returns 0, or 1 if D is
   outside 2…MAX_D (the caller then uses torch). */
#define ARGS p, bs, fs, B, L, R, softmax, a, u, frame, pred, for_a, for_u, query, target, loss, grad_U, grad_u
#define DEFINE_ENTRY(T)                                                                                          \
    int stacked_readout_##T(const T *p, int64_t bs, int64_t fs, int B, int L, int D, int R, const uint8_t *softmax, \
                            const T *a, const T *u, const T *frame, T *pred, T *for_a, T *for_u, const T *query,  \
                            const T *target, T *loss, T *grad_U, T *grad_u) {                                    \
        switch (D) {                                                                                             \
        case 2: batch_##T##_2(ARGS); return 0;                                                                   \
        case 3: batch_##T##_3(ARGS); return 0;                                                                   \
        case 4: batch_##T##_4(ARGS); return 0;                                                                   \
        case 5: batch_##T##_5(ARGS); return 0;                                                                   \
        case 6: batch_##T##_6(ARGS); return 0;                                                                   \
        case 7: batch_##T##_7(ARGS); return 0;                                                                   \
        case 8: batch_##T##_8(ARGS); return 0;                                                                   \
        default: return 1;                                                                                       \
        }                                                                                                        \
    }

DEFINE_ENTRY(float)
DEFINE_ENTRY(double)

/* One plain-SGD step of every run (docs/performance.md#native-readout): U_r = K_rᵀQ_r/√D, u_r = V_rᵀO_rᵀ,
   a_br = U_r q_b, then the batch MSE and ∇U, ∇u of stacked_readout (with a frame T: on U' = TᵀU and u' = Tᵀu,
   once per run, and ∇U = T∇U', ∇u = T∇u' at the end, so that no prompt pays for T); a run whose loss is not finite or exceeds
   ``threshold`` is left as it is and flagged in ``diverged`` (its weights stay where its loss blew up); every
   other run steps θ ← θ − lr_r ∇θ with ∇Q = K∇U, ∇K = Q∇Uᵀ, ∇V = Oᵀ∇uᵀ, ∇O = (V∇u)ᵀ, all from the weights before
   the step. Q, K, V [R, D, D] and O [R, 1, D] contiguous, updated in place; lr [R]; outputs loss [R] and
   diverged [R]. Returns 0, 1 if D is outside 2…MAX_D, 2 if memory ran out. */
#define DEFINE_SGD(T)                                                                                            \
    int stacked_sgd_##T(const T *p, int64_t bs, int64_t fs, int B, int L, int D, int R, const uint8_t *softmax,   \
                        const T *query, const T *target, const T *frame, T *Q, T *K, T *V, T *O, const T *lr,    \
                        T threshold, T *loss, uint8_t *diverged) {                                               \
        if (D < 2 || D > MAX_D) return 1;                                                                        \
        const int DD2 = D * D;                                                                                   \
        T *U = malloc(sizeof(T) * ((size_t)R * DD2 * 2 + (size_t)R * D * 2 + (size_t)B * R * D));               \
        if (!U) return 2;                                                                                        \
        T *grad_U = U + (size_t)R * DD2, *u = grad_U + (size_t)R * DD2, *grad_u = u + (size_t)R * D;             \
        T *a = grad_u + (size_t)R * D;                                                                           \
        const T root = sqrt((double)D);                                                                          \
        for (int r = 0; r < R; r++) {                                                                            \
            const T *q = Q + r * DD2, *k = K + r * DD2, *v = V + r * DD2, *o = O + r * D;                        \
            for (int i = 0; i < D; i++)                                                                          \
                for (int j = 0; j < D; j++) {                                                                    \
                    T acc = 0;                                                                                   \
                    for (int m = 0; m < D; m++) acc += k[m * D + i] * q[m * D + j];                              \
                    U[r * DD2 + i * D + j] = acc / root;                                                         \
                }                                                                                                \
            for (int j = 0; j < D; j++) {                                                                        \
                T acc = 0;                                                                                       \
                for (int m = 0; m < D; m++) acc += v[m * D + j] * o[m];                                          \
                u[r * D + j] = acc;                                                                              \
            }                                                                                                    \
        }                                                                                                        \
        if (frame) /* the prompt's frame once per run, in place: U' = TᵀU (column by column), u' = Tᵀu */        \
            for (int r = 0; r < R; r++) {                                                                        \
                for (int j = 0; j < D; j++) framed_##T(frame, 1, U + r * DD2 + j, D, D, U + r * DD2 + j, D);      \
                framed_##T(frame, 1, u + r * D, 1, D, u + r * D, 1);                                             \
            }                                                                                                    \
        for (int b = 0; b < B; b++)                                                                              \
            for (int r = 0; r < R; r++)                                                                          \
                for (int i = 0; i < D; i++) {                                                                    \
                    T acc = 0;                                                                                   \
                    for (int j = 0; j < D; j++) acc += U[r * DD2 + i * D + j] * query[b * D + j];                \
                    a[((size_t)b * R + r) * D + i] = acc;                                                        \
                }                                                                                                \
        /* in the prompt's own frame; its gradients ∇U', ∇u' map back by T below */                               \
        stacked_readout_##T(p, bs, fs, B, L, D, R, softmax, a, u, 0, 0, 0, 0, query, target, loss, grad_U,        \
                            grad_u);                                                                             \
        if (frame) /* back to the tokens' frame, in place: ∇U = T∇U', ∇u = T∇u' */                                \
            for (int r = 0; r < R; r++) {                                                                        \
                for (int j = 0; j < D; j++) framed_##T(frame, 0, grad_U + r * DD2 + j, D, D, grad_U + r * DD2 + j, D); \
                framed_##T(frame, 0, grad_u + r * D, 1, D, grad_u + r * D, 1);                                   \
            }                                                                                                    \
        for (int r = 0; r < R; r++) {                                                                            \
            diverged[r] = !(isfinite(loss[r]) && loss[r] <= threshold);                                          \
            if (diverged[r] || lr[r] == 0) continue;                                                             \
            T *q = Q + r * DD2, *k = K + r * DD2, *v = V + r * DD2, *o = O + r * D;                              \
            const T *gU = grad_U + r * DD2, *gu = grad_u + r * D;                                                \
            T gq[MAX_D * MAX_D], gk[MAX_D * MAX_D], gv[MAX_D * MAX_D], go[MAX_D];                                \
            for (int i = 0; i < D; i++)                                                                          \
                for (int j = 0; j < D; j++) {                                                                    \
                    T aq = 0, ak = 0;                                                                            \
                    for (int m = 0; m < D; m++) aq += k[i * D + m] * gU[m * D + j], ak += q[i * D + m] * gU[j * D + m]; \
                    gq[i * D + j] = aq, gk[i * D + j] = ak, gv[i * D + j] = o[i] * gu[j];                        \
                }                                                                                                \
            for (int i = 0; i < D; i++) {                                                                        \
                T acc = 0;                                                                                       \
                for (int m = 0; m < D; m++) acc += v[i * D + m] * gu[m];                                         \
                go[i] = acc;                                                                                     \
            }                                                                                                    \
            for (int i = 0; i < DD2; i++) q[i] -= lr[r] * gq[i], k[i] -= lr[r] * gk[i], v[i] -= lr[r] * gv[i];   \
            for (int i = 0; i < D; i++) o[i] -= lr[r] * go[i];                                                   \
        }                                                                                                        \
        free(U);                                                                                                 \
        return 0;                                                                                                \
    }

DEFINE_SGD(float)
DEFINE_SGD(double)
