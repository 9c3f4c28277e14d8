// gated_linear_attn in chunks of L tokens, fused: per (sequence, head) the chunks in order, the
// state carried from one to the next, nothing per chunk written but the state at its start.
// Sizes as the recurrence's (recurrence.hpp): k, v, q, log_gate [S, H, T], state [S*S*H, n_seqs].
// In a chunk of n tokens (the last may be shorter), Z its start state [i, j] (i a key channel, j a
// value channel), qs = scale q, and every decay a running sum of log gates from s up (never a
// difference of two sums, which would lose the digits of gates near 1; its exp never above 1):
//   D[s, t, i] = exp(sum of log_gate[r, i] over s < r <= t)   (s <= t)
//   E[t, i]    = exp(sum over 0 <= r <= t)                    (the start state's decay to token t)
//   F[s, i]    = D[s, n-1, i]                                 (token s's input decayed to the end)
//   A[t, s]    = sum_i qs[t, i] k[s, i] D[s, t, i]
//   y[t, j]    = sum_i qs[t, i] E[t, i] Z[i, j] + sum_{s <= t} A[t, s] v[s, j]
//   Z'[i, j]   = E[n-1, i] Z[i, j] + sum_s k[s, i] F[s, i] v[s, j]
// gla_chunks (k, v, q, log_gate, state; ints: L; floats: scale) -> a column [y [S, H, T],
//   the final state [S*S*H, n_seqs], the state at each chunk's start [S*S, c, H, n_seqs]].
//
// gla_chunks_back (g like the output, k, v, q, log_gate, state, the forward's output; the same
// attributes) -> a column [gk, gv, gq, glog_gate (each [S, H, T]), gstate [S*S*H, n_seqs]]. Per
// chunk, from the last, with dZ' the gradient of its end state and dA[t, s] = dy[t] . v[s]:
//   gv[s, j]  = sum_{t >= s} A[t, s] dy[t, j] + sum_i k[s, i] F[s, i] dZ'[i, j]
//   gqs[t, i] = sum_{s <= t} dA[t, s] k[s, i] D[s, t, i] + E[t, i] sum_j Z[i, j] dy[t, j]
//   gk[s, i]  = sum_{t >= s} dA[t, s] qs[t, i] D[s, t, i] + F[s, i] sum_j dZ'[i, j] v[s, j]
//   dZ[i, j]  = E[n-1, i] dZ'[i, j] + sum_t qs[t, i] E[t, i] dy[t, j]  (+ g of that start state)
// and the log gates' within the chunk, each log gate r through every decay that spans it (sums of
// products of the same sign as the forward's, no difference of large sums: float32 keeps the
// recurrence's precision), with W = sum_j Z[i, j] dZ'[i, j]:
//   glog_gate[r, i] = E[n-1, i] W + sum_{t >= r} qs[t, i] E[t, i] sum_j Z[i, j] dy[t, j]
//                   + sum_{s < r} k[s, i] F[s, i] sum_j dZ'[i, j] v[s, j]
//                   + sum_{s < r <= t} dA[t, s] qs[t, i] k[s, i] D[s, t, i]
#include <algorithm>
#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "blas.hpp"
#include "kernel_util.hpp"
#include "recurrence.hpp"

namespace rk {
namespace {

struct ChunkDims {
    RecurrenceDims d;
    int64_t L, c;  // tokens per chunk, chunks per sequence
    int64_t y() const { return size_mul(d.token(), d.T); }
    int64_t states() const { return size_mul(d.matrix(), d.H, d.n_seqs); }
    int64_t starts() const { return size_mul(states(), c); }
    int64_t total() const { return size_add(y(), states(), starts()); }
    // sequence b, head h: token tl's vector, its state, its chunk q's start state
    int64_t token(int64_t b, int64_t h, int64_t tl) const { return ((b * d.seq_len() + tl) * d.H + h) * d.S; }
    int64_t state(int64_t b, int64_t h) const { return (b * d.H + h) * d.matrix(); }
    int64_t start(int64_t b, int64_t h, int64_t q) const { return ((b * d.H + h) * c + q) * d.matrix(); }
};

constexpr const char* kNames[] = {"k", "v", "q", "log_gate"};

ChunkDims chunk_dims(const char* op, const Inputs& in, size_t first, const OpAttrs& attrs) {
    if (attrs.ints.size() != 1 || attrs.ints[0] < 1)
        throw std::invalid_argument(op_err(op, "expected one int attribute: the chunk length L >= 1"));
    if (attrs.floats.size() != 1 || !std::isfinite(attrs.floats[0]))
        throw std::invalid_argument(op_err(op, "expected one finite float attribute: scale"));
    std::vector<NamedInput> vectors;
    for (size_t a = 0; a < 4; ++a) vectors.push_back({in[first + a].get(), kNames[a]});
    const RecurrenceDims d = recurrence_dims(op, vectors, *in[first + 4]);
    const int64_t L = std::min(attrs.ints[0], std::max<int64_t>(1, d.seq_len()));
    ChunkDims cd{d, L, (d.seq_len() + L - 1) / L};
    cd.total();  // checked, and a chunk's decays [L, L, S] (each worker's scratch, each workgroup's on the GPU)
    size_mul(L, L, d.S);
    return cd;
}

// One chunk of one (sequence, head): its decays D and E and its pairs A, in the worker's scratch
// (the loops run along the channels, contiguous in every array: they vectorise, exp too).
template <typename T>
struct Chunk {
    int64_t S = 0, n = 0, stride = 0;  // channels, tokens, a token's vector to the next's
    const T *k = nullptr, *v = nullptr, *q = nullptr, *lg = nullptr;  // the chunk's first token's vectors
    T scale = 1;
    std::vector<T> D, E, A, sum;  // D [s][t][i] (s <= t), E [t][i], A [t][s] (scale included)
    std::vector<T> QE, KF;        // [t][i]: scale q E (what reads the start state), k F (what reaches the end)

    const T* d(int64_t s, int64_t t) const { return D.data() + (s * n + t) * S; }  // [i]
    const T* f(int64_t s) const { return d(s, n - 1); }
    const T* e(int64_t t) const { return E.data() + t * S; }
    const T* row(const T* x, int64_t t) const { return x + t * stride; }

    void load(const ChunkDims& cd, const T* pk, const T* pv, const T* pq, const T* plg, int64_t at, int64_t tokens) {
        S = cd.d.S, n = tokens, stride = cd.d.token();
        k = pk + at, v = pv + at, q = pq + at, lg = plg + at;
        D.assign(size_t(n * n * S), T(0));
        E.assign(size_t(n * S), T(0));
        sum.assign(size_t(S), T(0));
        for (int64_t t = 0; t < n; ++t) {  // from the start, through t
            const T* g = row(lg, t);
            T* out = E.data() + t * S;
            for (int64_t i = 0; i < S; ++i) {
                sum[size_t(i)] += g[i];
                out[i] = exp_of(sum[size_t(i)]);
            }
        }
        for (int64_t s = 0; s < n; ++s) {  // each range its own running sum from s
            std::fill(D.begin() + (s * n + s) * S, D.begin() + (s * n + s + 1) * S, T(1));
            std::fill(sum.begin(), sum.end(), T(0));
            for (int64_t t = s + 1; t < n; ++t) {
                const T* g = row(lg, t);
                T* out = D.data() + (s * n + t) * S;
                for (int64_t i = 0; i < S; ++i) {
                    sum[size_t(i)] += g[i];
                    out[i] = exp_of(sum[size_t(i)]);
                }
            }
        }
        A.assign(size_t(n * n), T(0));
        for (int64_t t = 0; t < n; ++t)
            for (int64_t s = 0; s <= t; ++s) {
                const T *qt = row(q, t), *ks = row(k, s), *dst = d(s, t);
                T a = 0;
                for (int64_t i = 0; i < S; ++i) a += qt[i] * ks[i] * dst[i];
                A[size_t(t * n + s)] = scale * a;
            }
        QE.resize(size_t(n * S));
        KF.resize(size_t(n * S));
        for (int64_t t = 0; t < n; ++t)
            for (int64_t i = 0; i < S; ++i) {
                QE[size_t(t * S + i)] = scale * row(q, t)[i] * e(t)[i];
                KF[size_t(t * S + i)] = row(k, t)[i] * f(t)[i];
            }
    }
};

// Every (sequence, head) a task: enough chunks' work per thread.
void for_each_head(const ChunkDims& cd, const std::function<void(int64_t b, int64_t h)>& fn) {
    const RecurrenceDims& d = cd.d;
    const int64_t work = std::max<int64_t>(1, d.seq_len() * d.matrix() * 4);
    parallel_for(d.n_seqs * d.H, std::max<int64_t>(1, kElementGrain / work), [&](int64_t lo, int64_t hi) {
        for (int64_t task = lo; task < hi; ++task) fn(task / d.H, task % d.H);
    });
}

template <typename T>
void forward(const ChunkDims& cd, const Inputs& in, T scale, TensorImpl& out) {
    const RecurrenceDims& d = cd.d;
    const int64_t S = d.S;
    const T *pk = in[0]->ptr<T>(), *pv = in[1]->ptr<T>(), *pq = in[2]->ptr<T>(), *plg = in[3]->ptr<T>();
    const T* pstate = in[4]->ptr<T>();
    T *py = out.ptr<T>(), *pfinal = py + cd.y(), *pstarts = pfinal + cd.states();
    for_each_head(cd, [&](int64_t b, int64_t h) {
        Chunk<T> ch;
        ch.scale = scale;
        std::vector<T> Z(pstate + cd.state(b, h), pstate + cd.state(b, h) + d.matrix());  // [i * S + j]
        for (int64_t qi = 0; qi < cd.c; ++qi) {
            const int64_t t0 = qi * cd.L, n = std::min(cd.L, d.seq_len() - t0), at = cd.token(b, h, t0);
            std::copy(Z.begin(), Z.end(), pstarts + cd.start(b, h, qi));
            ch.load(cd, pk, pv, pq, plg, at, n);
            // y [S(j), n] (ld S H): the start state's part, Z^T QE through the BLAS, then the chunk's
            // tokens s <= t (a loop: a product would carry a NaN to the tokens before it)
            T* y = py + at;
            gemm_serial(false, false, S, n, S, Z.data(), S, ch.QE.data(), S, y, ch.stride, false);
            for (int64_t t = 0; t < n; ++t)
                for (int64_t s = 0; s <= t; ++s) add_scaled(S, ch.A[size_t(t * n + s)], ch.row(ch.v, s), y + t * ch.stride);
            const T* whole = ch.e(n - 1);  // the next state: Z decayed, + V KF^T
            for (int64_t i = 0; i < S; ++i)
                for (int64_t j = 0; j < S; ++j) Z[size_t(i * S + j)] *= whole[i];
            gemm_serial(false, true, S, S, n, ch.v, ch.stride, ch.KF.data(), S, Z.data(), S, true);
        }
        std::copy(Z.begin(), Z.end(), pfinal + cd.state(b, h));
    });
}

template <typename T>
void backward(const ChunkDims& cd, const Inputs& in, T scale, TensorImpl& out) {
    const RecurrenceDims& d = cd.d;
    const int64_t S = d.S;
    const T *g = in[0]->ptr<T>(), *pk = in[1]->ptr<T>(), *pv = in[2]->ptr<T>(), *pq = in[3]->ptr<T>(),
            *plg = in[4]->ptr<T>(), *fwd = in[6]->ptr<T>();
    const T *g_final = g + cd.y(), *g_starts = g_final + cd.states();
    const T* starts = fwd + cd.y() + cd.states();
    const int64_t per_token = cd.y();
    T *gk = out.ptr<T>(), *gv = gk + per_token, *gq = gv + per_token, *glg = gq + per_token, *gstate = glg + per_token;
    for_each_head(cd, [&](int64_t b, int64_t h) {
        Chunk<T> ch;
        ch.scale = scale;
        const T* gZf = g_final + cd.state(b, h);
        std::vector<T> dZ(gZf, gZf + d.matrix()), dZ_next(size_t(d.matrix())), dA, ZY, ZV, spans, running(static_cast<size_t>(S));
        for (int64_t qi = cd.c - 1; qi >= 0; --qi) {
            const int64_t t0 = qi * cd.L, n = std::min(cd.L, d.seq_len() - t0), at = cd.token(b, h, t0);
            const T* Z = starts + cd.start(b, h, qi);
            ch.load(cd, pk, pv, pq, plg, at, n);
            const T* dy = g + at;
            auto dyt = [&](int64_t t) { return ch.row(dy, t); };
            dA.assign(size_t(n * n), T(0));  // [t, s]: dy[t] . v[s]
            for (int64_t t = 0; t < n; ++t)
                for (int64_t s = 0; s <= t; ++s) dA[size_t(t * n + s)] = dot(dyt(t), ch.row(ch.v, s), S);
            ZY.resize(size_t(n * S));  // [t][i]: sum_j Z[i, j] dy[t, j]
            ZV.resize(size_t(n * S));  // [s][i]: sum_j dZ'[i, j] v[s, j]
            gemm_serial(true, false, S, n, S, Z, S, dy, ch.stride, ZY.data(), S, false);
            gemm_serial(true, false, S, n, S, dZ.data(), S, ch.v, ch.stride, ZV.data(), S, false);
            gemm_serial(false, false, S, n, S, dZ.data(), S, ch.KF.data(), S, gv + at, ch.stride, false);  // gv's state part
            for (int64_t s = 0; s < n; ++s) {
                T *out_v = gv + at + s * ch.stride, *out_k = gk + at + s * ch.stride;
                const T *fs = ch.f(s), *zv = ZV.data() + s * S;
                for (int64_t t = s; t < n; ++t) add_scaled(S, ch.A[size_t(t * n + s)], dyt(t), out_v);
                for (int64_t i = 0; i < S; ++i) out_k[i] = fs[i] * zv[i];
                for (int64_t t = s; t < n; ++t) {
                    const T w = scale * dA[size_t(t * n + s)];
                    const T *qt = ch.row(ch.q, t), *dst = ch.d(s, t);
                    for (int64_t i = 0; i < S; ++i) out_k[i] += w * qt[i] * dst[i];
                }
            }
            for (int64_t t = 0; t < n; ++t) {
                T* out_q = gq + at + t * ch.stride;
                const T *et = ch.e(t), *zy = ZY.data() + t * S;
                for (int64_t i = 0; i < S; ++i) out_q[i] = et[i] * zy[i];
                for (int64_t s = 0; s <= t; ++s) {
                    const T w = dA[size_t(t * n + s)];
                    const T *ks = ch.row(ch.k, s), *dst = ch.d(s, t);
                    for (int64_t i = 0; i < S; ++i) out_q[i] += w * ks[i] * dst[i];
                }
                for (int64_t i = 0; i < S; ++i) out_q[i] *= scale;
            }
            // the log gates': each log gate r through every decay that spans it
            spans.assign(size_t(n * S), T(0));
            const T* whole = ch.e(n - 1);
            for (int64_t i = 0; i < S; ++i) running[size_t(i)] = whole[i] * dot(Z + i * S, dZ.data() + i * S, S);
            for (int64_t r = n - 1; r >= 0; --r) {  // the start state's decay to the tokens t >= r
                const T *qe = ch.QE.data() + r * S, *zy = ZY.data() + r * S;
                T* span = spans.data() + r * S;
                for (int64_t i = 0; i < S; ++i) {
                    running[size_t(i)] += qe[i] * zy[i];
                    span[i] += running[size_t(i)];
                }
            }
            std::fill(running.begin(), running.end(), T(0));
            for (int64_t r = 0; r < n; ++r) {  // the earlier tokens' inputs decayed to the end
                const T *kf = ch.KF.data() + r * S, *zv = ZV.data() + r * S;
                T* span = spans.data() + r * S;
                for (int64_t i = 0; i < S; ++i) {
                    span[i] += running[size_t(i)];
                    running[size_t(i)] += kf[i] * zv[i];
                }
            }
            for (int64_t s = 0; s < n; ++s) {  // pairs (t, s): the tokens s < r <= t
                std::fill(running.begin(), running.end(), T(0));
                const T* ks = ch.row(ch.k, s);
                for (int64_t t = n - 1; t > s; --t) {
                    const T w = scale * dA[size_t(t * n + s)];
                    const T *qt = ch.row(ch.q, t), *dst = ch.d(s, t);
                    T* span = spans.data() + t * S;
                    for (int64_t i = 0; i < S; ++i) {
                        running[size_t(i)] += w * qt[i] * ks[i] * dst[i];
                        span[i] += running[size_t(i)];
                    }
                }
            }
            for (int64_t r = 0; r < n; ++r) std::copy_n(spans.data() + r * S, S, glg + at + r * ch.stride);
            // then the start state's gradient, its own added
            const T* gZ = g_starts + cd.start(b, h, qi);
            for (int64_t i = 0; i < S; ++i)
                for (int64_t j = 0; j < S; ++j) dZ_next[size_t(i * S + j)] = whole[i] * dZ[size_t(i * S + j)] + gZ[i * S + j];
            gemm_serial(false, true, S, S, n, dy, ch.stride, ch.QE.data(), S, dZ_next.data(), S, true);  // + dY QE^T
            dZ.swap(dZ_next);
        }
        std::copy(dZ.begin(), dZ.end(), gstate + cd.state(b, h));
    });
}

}  // namespace

OutSpec shape_gla_chunks(const Inputs& in, const OpAttrs& attrs) {
    return OutSpec{{chunk_dims("gla_chunks", in, 0, attrs).total(), 1, 1, 1}, 2, in[0]->dtype};
}

void cpu_gla_chunks(const Inputs& in, const OpAttrs& attrs, TensorImpl& out) {
    const ChunkDims cd = chunk_dims("gla_chunks", in, 0, attrs);
    dispatch_float(out.dtype, [&](auto tag) {
        using T = decltype(tag);
        forward<T>(cd, in, T(attrs.floats[0]), out);
    });
}

OutSpec shape_gla_chunks_back(const Inputs& in, const OpAttrs& attrs) {
    const char* op = "gla_chunks_back";
    const ChunkDims cd = chunk_dims(op, in, 1, attrs);
    require_packed_output(op, *in[0], "g", *in[1], "k", cd.total());
    require_packed_output(op, *in[6], "out", *in[1], "k", cd.total());
    return OutSpec{{size_add(size_mul(4, cd.y()), cd.states()), 1, 1, 1}, 2, in[1]->dtype};
}

void cpu_gla_chunks_back(const Inputs& in, const OpAttrs& attrs, TensorImpl& out) {
    const ChunkDims cd = chunk_dims("gla_chunks_back", in, 1, attrs);
    dispatch_float(out.dtype, [&](auto tag) {
        using T = decltype(tag);
        backward<T>(cd, in, T(attrs.floats[0]), out);
    });
}

}  // namespace rk
