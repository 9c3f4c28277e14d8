// ssm_scan's chunked form (Mamba-2's SSD, rlkit/core/recurrences.py) fused in three steps: each
// chunk's own state, the states passed from chunk to chunk, then each chunk's outputs; the chunks'
// work runs in parallel, only the passing walks the chunks in order. Layouts: ssd_chunks.hpp.
//
// In chunk q of sequence n, head h (group g), with its n_q tokens t, s and their log decays a,
// every decay the exp of a sum of log decays in increasing order (never a difference of two
// running sums, which would lose the digits of decays near 1; never above 1 for a <= 0):
//   K[t, s] = exp(sum of a_r over s < r <= t)    (s <= t)   the decay from token s to token t
//   f[t]    = exp(sum over 0 <= r <= t)                      the start state's decay to token t
//   e[s]    = K[n_q - 1, s]                                  token s's input decayed to the end
//   A_q     = f[n_q - 1]                                     the chunk's decay of its start state
//   M[t, s] = (C_t . B_s) K[t, s]                            (s <= t)
//   X_q     = sum_s e[s] B_s u_s^T                           [D, P]: the chunk's own state at its end
//   Z_0 = first, Z_{q+1} = A_q Z_q + X_q                     the state at each chunk's start
//   y_t     = sum_{s <= t} M[t, s] u_s + f[t] Z_q^T C_t
// ssd_chunks (u, log_decay, B, C, first; ints: L) -> a column [y [P, H, T, N], the final states
// [D, P, H, N]]; the states at the chunks' starts [D P, H, c, N] stay in scratch.
//
// ssd_chunks_back (g like the output, u, log_decay, B, C, first; ints: L) -> a column [gu,
// glog_decay, gB, gC, gfirst]. It computes the start states again (two of the forward's three
// steps) rather than keeping D P H c N floats from the forward to the backward pass.
// With gy the outputs' gradient, G[t, s] = gy_t . u_s:
//   gZ_q (of the start state, before passing) = sum_t f[t] C_t gy_t^T
//   passed back from the end: gX_q = gZ'_{q+1}, gZ'_q = gZ_q + A_q gZ'_{q+1}, gZ'_c = g's final,
//   gfirst = gZ'_0
//   gu_s  = sum_{t >= s} M[t, s] gy_t + e[s] gX_q^T B_s
//   gC_t  = sum_{s <= t} G[t, s] K[t, s] B_s + f[t] Z_q gy_t
//   gB_s  = sum_{t >= s} G[t, s] K[t, s] C_t + e[s] gX_q u_s          (summed over the group's heads)
//   ga_r  = sum_{s < r <= t} G[t, s] M[t, s] + sum_{s < r} E[s] + sum_{t >= r} F[t] + A_q sum(gX_q * Z_q),
//           E[s] = e[s] u_s . gX_q^T B_s = B_s . (e[s] gX_q u_s)    (the last, gB_s's term through the state)
//           F[t] = f[t] gy_t . Z_q^T C_t = C_t . (f[t] Z_q gy_t)    (the last, gC_t's)
// A NaN in a token reaches the outputs of its head from that token on, and the final state, as in
// the recurrence: the products over pairs of tokens add the triangle s <= t only, never a later
// token's vector times 0 (triangle_product).
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "blas.hpp"
#include "ssd_chunks.hpp"
#include "thread_pool.hpp"

namespace rk {

SsdDims ssd_dims(const char* op, const Inputs& in, size_t first_input, const OpAttrs& attrs) {
    if (attrs.ints.size() != 1 || attrs.ints[0] < 1 || attrs.ints[0] > kSsdMaxChunk)
        throw std::invalid_argument(op_err(op, "expected one int attribute: the chunk length L, 1 to " +
                                                   std::to_string(kSsdMaxChunk)));
    require_same_float_inputs(op, in, first_input, {"u", "log_decay", "B", "C", "first"});
    const TensorImpl &u = *in[first_input], &la = *in[first_input + 1], &B = *in[first_input + 2],
                     &C = *in[first_input + 3], &first = *in[first_input + 4];
    const int64_t P = u.ne[0], H = u.ne[1], T = u.ne[2], N = u.ne[3], D = B.ne[0], G = B.ne[1];
    if (la.ne != Shape{H, T, N, 1})
        throw std::invalid_argument(op_err(op, "log_decay must be [H, T, N] = " + sizes({H, T, N}) + " (u [P, H, T, N]), got " +
                                                   la.shape_str()));
    if (B.ne[2] != T || B.ne[3] != N || G < 1 || H % G != 0)
        throw std::invalid_argument(op_err(op, "B must be [D, G, T, N] with G dividing H = " + std::to_string(H) +
                                                   " and T, N of u " + u.shape_str() + ", got " + B.shape_str()));
    if (C.ne != B.ne) throw std::invalid_argument(op_err(op, "C must be like B " + B.shape_str() + ", got " + C.shape_str()));
    if (first.ne != Shape{D, P, H, N})
        throw std::invalid_argument(op_err(op, "first must be [D, P, H, N] = " + sizes({D, P, H, N}) + ", got " +
                                                   first.shape_str()));
    const int64_t L = std::min(attrs.ints[0], std::max<int64_t>(T, 1));
    const SsdDims d{P, H, T, N, D, G, L, T / L + (T % L != 0)};
    // every size below, checked: the outputs and the scratch
    size_add(size_mul(P, H, T, N), size_mul(D, P, H, N), size_mul(D, P, H, d.c, N));
    size_add(size_mul(P, H, T, N), size_mul(H, T, N), size_mul(2, D, G, T, N), size_mul(D, P, H, N));
    return d;
}

namespace {

// Whether every element of a [rows, cols] block (ld rows stored) is finite.
template <typename T>
bool all_finite(const T* x, int64_t rows, int64_t cols, int64_t ld) {
    for (int64_t j = 0; j < cols; ++j)
        for (int64_t i = 0; i < rows; ++i)
            if (!std::isfinite(x[i + ld * j])) return false;
    return true;
}

// One chunk of one head's tokens: pointers to its first token's vectors (the next token's a
// stride further: columns of matrices with that leading dimension), its decays (K, f, e as the
// header's) and its pairs, [n_q, n_q] matrices stored with L rows, (t, s) at t + L s.
template <typename T>
struct Chunk {
    const SsdDims& d;
    int64_t n_q;                     // tokens
    const T *u, *a, *B, *C;          // token 0's vectors
    int64_t su, sa, sb;              // strides: u's (P H), the log decays' (H), B's and C's (D G)
    std::vector<T> K, f, e, M;       // M = S K (0 above the diagonal), S[t, s] = C_t . B_s

    Chunk(const SsdDims& dims, const T* u_all, const T* la_all, const T* B_all, const T* C_all, int64_t q, int64_t h,
          int64_t n)
        : d(dims), n_q(dims.valid(q)), su(dims.P * dims.H), sa(dims.H), sb(dims.D * dims.G) {
        const int64_t t0 = q * d.L + d.T * n, g = h / (d.H / d.G);
        u = u_all + d.P * h + su * t0;
        a = la_all + h + sa * t0;
        B = B_all + d.D * g + sb * t0;
        C = C_all + d.D * g + sb * t0;
        decays();
    }
    const T* u_at(int64_t t) const { return u + su * t; }
    const T* B_at(int64_t t) const { return B + sb * t; }
    const T* C_at(int64_t t) const { return C + sb * t; }
    int64_t at(int64_t t, int64_t s) const { return t + d.L * s; }

    void decays() {
        K.assign(d.L * d.L, T(0));
        f.resize(n_q);
        e.resize(n_q);
        T sum = 0;
        for (int64_t t = 0; t < n_q; ++t) f[t] = exp_of(sum += a[sa * t]);
        for (int64_t s = 0; s < n_q; ++s) {
            T from_s = 0;
            K[at(s, s)] = exp_of(from_s);
            for (int64_t t = s + 1; t < n_q; ++t) K[at(t, s)] = exp_of(from_s += a[sa * t]);
            e[s] = K[at(n_q - 1, s)];
        }
    }
    T chunk_decay() const { return f[n_q - 1]; }

    // out[t, s] = left_t . right_s for s <= t, exactly 0 above the diagonal: one product of the
    // chunk's vectors, each entry its own dot (a NaN stays in its own pairs)
    void dots(const T* left, int64_t sl, const T* right, int64_t sr, int64_t k, std::vector<T>& out) const {
        out.assign(d.L * d.L, T(0));
        gemm_serial(true, false, n_q, n_q, k, left, sl, right, sr, out.data(), d.L, false);
        for (int64_t s = 0; s < n_q; ++s)
            for (int64_t t = 0; t < s; ++t) out[at(t, s)] = T(0);
    }

    // out = pairs ([L, L]) times the decays K between their tokens (0 above the diagonal)
    void decayed(const T* pairs, std::vector<T>& out) const {
        out.assign(d.L * d.L, T(0));
        for (int64_t s = 0; s < n_q; ++s)
            for (int64_t t = s; t < n_q; ++t) out[at(t, s)] = pairs[at(t, s)] * K[at(t, s)];
    }

    // out [D, P] = sum_t left_t (weight[t] right_t)^T, right with stride `sr`
    void outer_sum(const std::vector<T>& weight, const T* left, const T* right, int64_t sr, T* out) const {
        std::vector<T> weighted(d.P * n_q);  // [P, n_q]
        for (int64_t t = 0; t < n_q; ++t)
            for (int64_t p = 0; p < d.P; ++p) weighted[p + d.P * t] = weight[t] * right[sr * t + p];
        gemm_serial(false, true, d.D, d.P, n_q, left, sb, weighted.data(), d.P, out, d.D, false);
    }
};

// out[:, j] (ld_out) = sum over i of x[:, i] (ld_x, `rows` long) times the lower-triangular
// pairs' (i, j) (pairs_of_row: (j, i) instead, summing i <= j), i from the triangle only: one
// product where x is finite (the zeros outside the triangle then add nothing), else the triangle
// alone, so that a NaN or infinity in x never reaches the columns it does not belong to.
template <typename T>
void triangle_product(const T* x, int64_t ld_x, int64_t rows, const std::vector<T>& pairs, int64_t L, int64_t n_q,
                      bool pairs_of_row, T* out, int64_t ld_out) {
    if (all_finite(x, rows, n_q, ld_x)) {
        gemm_serial(false, pairs_of_row, rows, n_q, n_q, x, ld_x, pairs.data(), L, out, ld_out, false);
        return;
    }
    for (int64_t j = 0; j < n_q; ++j) {
        T* column = out + ld_out * j;
        std::fill_n(column, rows, T(0));
        if (pairs_of_row)
            for (int64_t i = 0; i <= j; ++i) add_scaled(rows, pairs[j + L * i], x + ld_x * i, column);
        else
            for (int64_t i = j; i < n_q; ++i) add_scaled(rows, pairs[i + L * j], x + ld_x * i, column);
    }
}

// The start states' plane of chunk q, head h, sequence n in [D P, H, c, N]; a final state's in [D P, H, N].
int64_t start_plane(const SsdDims& d, int64_t q, int64_t h, int64_t n) { return d.plane() * (h + d.H * (q + d.c * n)); }
int64_t final_plane(const SsdDims& d, int64_t h, int64_t n) { return d.plane() * (h + d.H * n); }

// Each task of parallel_for over (q, h, n), the chunk fastest.
template <typename F>
void for_each_chunk(const SsdDims& d, const F& body) {
    parallel_for(d.c * d.H * d.N, 1, [&](int64_t lo, int64_t hi) {
        for (int64_t i = lo; i < hi; ++i) body(i % d.c, (i / d.c) % d.H, i / (d.c * d.H));
    });
}

// The passing of states along the chunks, in place in `planes` ([D P, H, c, N]): forward, each
// plane holds X_q and leaves with Z_q (the final state Z_c to `last`, Z_0 from `edge`); backward,
// each holds gZ_q and leaves with gX_q (gZ'_c from `edge`, gZ'_0 to `last`).
template <typename T>
void pass_states(const SsdDims& d, T* planes, const T* decay, const T* edge, T* last, bool backward) {
    parallel_for(d.H * d.N, 1, [&](int64_t lo, int64_t hi) {
        std::vector<T> z(d.plane());
        for (int64_t i = lo; i < hi; ++i) {
            const int64_t h = i % d.H, n = i / d.H;
            std::copy_n(edge + final_plane(d, h, n), d.plane(), z.data());
            for (int64_t step = 0; step < d.c; ++step) {
                const int64_t q = backward ? d.c - 1 - step : step;
                T* plane = planes + start_plane(d, q, h, n);
                const T A = decay[h + d.H * (q + d.c * n)];
                for (int64_t r = 0; r < d.plane(); ++r) {
                    const T x = plane[r];
                    plane[r] = z[r];
                    z[r] = backward ? x + A * z[r] : A * z[r] + x;
                }
            }
            std::copy_n(z.data(), d.plane(), last + final_plane(d, h, n));
        }
    });
}

// The state at each chunk's start into `starts` [D P, H, c, N], the final states into `finals`:
// each chunk's own state X_q, then the passing along the chunks. u, log_decay, B, C, first at in[at..].
// Returns the chunks' decays A_q [H, c, N].
template <typename T>
std::vector<T> start_states(const SsdDims& d, const Inputs& in, size_t at, T* starts, T* finals) {
    const T *u = in[at]->ptr<T>(), *la = in[at + 1]->ptr<T>(), *B = in[at + 2]->ptr<T>(), *C = in[at + 3]->ptr<T>();
    std::vector<T> decay(d.H * d.c * d.N);
    for_each_chunk(d, [&](int64_t q, int64_t h, int64_t n) {
        Chunk<T> k(d, u, la, B, C, q, h, n);
        k.outer_sum(k.e, k.B, k.u, k.su, starts + start_plane(d, q, h, n));
        decay[h + d.H * (q + d.c * n)] = k.chunk_decay();
    });
    pass_states(d, starts, decay.data(), in[at + 4]->ptr<T>(), finals, false);
    return decay;
}

// S[t, s] = C_t . B_s of every chunk's pairs (0 above the diagonal), [L L, c, G, N]: a group's
// heads read the same B and C, so they share their chunks' scores. u, log_decay, B, C at in[at..].
template <typename T>
std::vector<T> group_scores(const SsdDims& d, const Inputs& in, size_t at) {
    const T *u = in[at]->ptr<T>(), *la = in[at + 1]->ptr<T>(), *B = in[at + 2]->ptr<T>(), *C = in[at + 3]->ptr<T>();
    std::vector<T> scores(size_mul(d.L, d.L, d.G, d.c, d.N));
    const int64_t heads = d.H / d.G;
    parallel_for(d.c * d.G * d.N, 1, [&](int64_t lo, int64_t hi) {
        std::vector<T> S;
        for (int64_t i = lo; i < hi; ++i) {
            const int64_t q = i % d.c, group = (i / d.c) % d.G, n = i / (d.c * d.G);
            const Chunk<T> k(d, u, la, B, C, q, group * heads, n);  // its first head's: the group's B and C
            k.dots(k.C, k.sb, k.B, k.sb, d.D, S);
            std::copy(S.begin(), S.end(), scores.begin() + d.L * d.L * i);
        }
    });
    return scores;
}

// chunk q's scores in group_scores' [L L, c, G, N] for head h of sequence n
template <typename T>
const T* scores_of(const SsdDims& d, const std::vector<T>& scores, int64_t q, int64_t h, int64_t n) {
    return scores.data() + d.L * d.L * (q + d.c * (h / (d.H / d.G) + d.G * n));
}

template <typename T>
void ssd_forward(const SsdDims& d, const Inputs& in, T* out) {
    const T *u = in[0]->ptr<T>(), *la = in[1]->ptr<T>(), *B = in[2]->ptr<T>(), *C = in[3]->ptr<T>();
    T* y = out;
    std::vector<T> starts_kept(d.starts());
    T* starts = starts_kept.data();
    start_states(d, in, 0, starts, out + d.y());
    const std::vector<T> scores = group_scores<T>(d, in, 0);
    for_each_chunk(d, [&](int64_t q, int64_t h, int64_t n) {
        Chunk<T> k(d, u, la, B, C, q, h, n);
        k.decayed(scores_of(d, scores, q, h, n), k.M);
        T* y_q = y + (k.u - u);
        triangle_product(k.u, k.su, d.P, k.M, d.L, k.n_q, true, y_q, k.su);  // sum_{s <= t} M[t, s] u_s
        std::vector<T> w(d.P * k.n_q);  // [P, n_q]: Z^T C_t
        gemm_serial(true, false, d.P, k.n_q, d.D, starts + start_plane(d, q, h, n), d.D, k.C, k.sb, w.data(), d.P, false);
        for (int64_t t = 0; t < k.n_q; ++t)
            for (int64_t p = 0; p < d.P; ++p) y_q[k.su * t + p] += k.f[t] * w[p + d.P * t];
    });
}

// One chunk's gradients (the header's) from its group's scores S: gB's and gC's terms through the
// states added into the group's (their heads in order), the pairs' gradient G K added to
// `pairs_sum` (for pair_gradients, once for the group's heads).
template <typename T>
void chunk_gradients(Chunk<T>& k, const T* S, const T* gy, const T* Z, const T* gX, const SsdDims& d, T* gu, T* ga,
                     T* gB, T* gC, std::vector<T>& pairs_sum) {
    const int64_t n_q = k.n_q, P = d.P, D = d.D, L = d.L;
    k.decayed(S, k.M);
    std::vector<T> G, gS, v(P * n_q), dense(D * n_q), E(n_q), F(n_q);
    k.dots(gy, k.su, k.u, k.su, P, G);  // G[t, s] = gy_t . u_s
    k.decayed(G.data(), gS);
    for (int64_t i = 0; i < L * L; ++i) pairs_sum[i] += gS[i];
    gemm_serial(true, false, P, n_q, D, gX, D, k.B, k.sb, v.data(), P, false);  // v_s = gX^T B_s
    triangle_product(gy, k.su, P, k.M, L, n_q, false, gu, k.su);                 // sum_{t >= s} M[t, s] gy_t
    for (int64_t s = 0; s < n_q; ++s)
        for (int64_t p = 0; p < P; ++p) gu[k.su * s + p] += k.e[s] * v[p + P * s];
    // gC's and gB's terms through the states, and from them the tokens' terms of glog_decay
    // E[s] = e[s] u_s . v_s = B_s . gB_s and F[t] = f[t] gy_t . Z^T C_t = C_t . gC_t (one product
    // fewer than through Z^T C_t; the GPU's STATE_GRADS_B and _C make them so too): each token's
    // term decay[t] dense_t added to g's, and own_t . term into ends[t]
    auto add_state_terms = [&](const std::vector<T>& decay, const T* own, T* g, std::vector<T>& ends) {
        for (int64_t t = 0; t < n_q; ++t) {
            T sum = 0;
            for (int64_t i = 0; i < D; ++i) {
                const T term = decay[t] * dense[i + D * t];
                g[k.sb * t + i] += term;
                sum += own[k.sb * t + i] * term;
            }
            ends[t] = sum;
        }
    };
    gemm_serial(false, false, D, n_q, P, Z, D, gy, k.su, dense.data(), D, false);  // Z gy_t
    add_state_terms(k.f, k.C, gC, F);
    gemm_serial(false, false, D, n_q, P, gX, D, k.u, k.su, dense.data(), D, false);  // gX u_s
    add_state_terms(k.e, k.B, gB, E);
    const T gA = dot(gX, Z, d.plane());
    // the pairs' part: R[t, s] = sum over t' >= t of G K S (= G M), then each r's sum over s < r
    std::vector<T> R(L * L, T(0));
    for (int64_t s = 0; s < n_q; ++s) {
        T sum = 0;
        for (int64_t t = n_q - 1; t > s; --t) R[k.at(t, s)] = sum += gS[k.at(t, s)] * S[k.at(t, s)];
    }
    T E_before = 0, F_from = 0;
    std::vector<T> F_suffix(n_q);
    for (int64_t t = n_q - 1; t >= 0; --t) F_suffix[t] = F_from += F[t];
    for (int64_t r = 0; r < n_q; ++r) {
        T pairs = 0;
        for (int64_t s = 0; s < r; ++s) pairs += R[k.at(r, s)];
        ga[k.sa * r] = pairs + E_before + F_suffix[r] + k.chunk_decay() * gA;
        E_before += E[r];
    }
}

// gC_t += sum_{s <= t} P[t, s] B_s, gB_s += sum_{t >= s} P[t, s] C_t: the terms through the pairs
// of a group's chunk, P its heads' G K summed (B and C are the group's)
template <typename T>
void pair_gradients(const Chunk<T>& k, const std::vector<T>& pairs, T* gB, T* gC) {
    const int64_t D = k.d.D, n_q = k.n_q;
    std::vector<T> tri(D * n_q);
    triangle_product(k.B, k.sb, D, pairs, k.d.L, n_q, true, tri.data(), D);
    for (int64_t t = 0; t < n_q; ++t)
        for (int64_t i = 0; i < D; ++i) gC[k.sb * t + i] += tri[i + D * t];
    triangle_product(k.C, k.sb, D, pairs, k.d.L, n_q, false, tri.data(), D);
    for (int64_t s = 0; s < n_q; ++s)
        for (int64_t i = 0; i < D; ++i) gB[k.sb * s + i] += tri[i + D * s];
}

template <typename T>
void ssd_backward(const SsdDims& d, const Inputs& in, T* out) {
    const T *g = in[0]->ptr<T>(), *u = in[1]->ptr<T>(), *la = in[2]->ptr<T>(), *B = in[3]->ptr<T>(),
            *C = in[4]->ptr<T>();
    T *gu = out, *ga = gu + d.y(), *gB = ga + d.decays(), *gC = gB + d.inputs_bc(), *gfirst = gC + d.inputs_bc();
    std::vector<T> starts_again(d.starts()), finals_again(d.finals()), planes(d.starts());
    const T* starts = starts_again.data();
    const std::vector<T> decay = start_states(d, in, 1, starts_again.data(), finals_again.data());
    for_each_chunk(d, [&](int64_t q, int64_t h, int64_t n) {  // gZ_q: the start state's own gradient
        Chunk<T> k(d, u, la, B, C, q, h, n);
        k.outer_sum(k.f, k.C, g + (k.u - u), k.su, planes.data() + start_plane(d, q, h, n));
    });
    pass_states(d, planes.data(), decay.data(), g + d.y(), gfirst, true);
    std::fill_n(gB, 2 * d.inputs_bc(), T(0));
    const std::vector<T> scores = group_scores<T>(d, in, 1);
    const int64_t heads = d.H / d.G;
    parallel_for(d.c * d.G * d.N, 1, [&](int64_t lo, int64_t hi) {  // a group's heads in order: gB, gC summed alike
        std::vector<T> pairs_sum(d.L * d.L);
        for (int64_t i = lo; i < hi; ++i) {
            const int64_t q = i % d.c, group = (i / d.c) % d.G, n = i / (d.c * d.G);
            std::fill(pairs_sum.begin(), pairs_sum.end(), T(0));
            for (int64_t h = group * heads; h < (group + 1) * heads; ++h) {
                Chunk<T> k(d, u, la, B, C, q, h, n);
                const int64_t at = start_plane(d, q, h, n), from_u = k.u - u, from_b = k.B - B;
                chunk_gradients(k, scores_of(d, scores, q, h, n), g + from_u, starts + at, planes.data() + at, d,
                                gu + from_u, ga + (k.a - la), gB + from_b, gC + from_b, pairs_sum);
                if (h == (group + 1) * heads - 1)  // after the group's last head (its chunk's B and C are the group's)
                    pair_gradients(k, pairs_sum, gB + from_b, gC + from_b);
            }
        }
    });
}

}  // namespace

OutSpec shape_ssd_chunks(const Inputs& in, const OpAttrs& attrs) {
    const SsdDims d = ssd_dims("ssd_chunks", in, 0, attrs);
    return OutSpec{{d.total(), 1, 1, 1}, 2, in[0]->dtype};
}

void cpu_ssd_chunks(const Inputs& in, const OpAttrs& attrs, TensorImpl& out) {
    const SsdDims d = ssd_dims("ssd_chunks", in, 0, attrs);
    dispatch_float(out.dtype, [&](auto tag) { ssd_forward(d, in, out.ptr<decltype(tag)>()); });
}

OutSpec shape_ssd_chunks_back(const Inputs& in, const OpAttrs& attrs) {
    const char* op = "ssd_chunks_back";
    const SsdDims d = ssd_dims(op, in, 1, attrs);
    require_packed_output(op, *in[0], "g", *in[1], "u", d.total());
    return OutSpec{{d.grads(), 1, 1, 1}, 2, in[1]->dtype};
}

void cpu_ssd_chunks_back(const Inputs& in, const OpAttrs& attrs, TensorImpl& out) {
    const SsdDims d = ssd_dims("ssd_chunks_back", in, 1, attrs);
    dispatch_float(out.dtype, [&](auto tag) { ssd_backward(d, in, out.ptr<decltype(tag)>()); });
}

}  // namespace rk
