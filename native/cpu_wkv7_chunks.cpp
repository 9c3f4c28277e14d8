// wkv7_chunk_states: rwkv_wkv7's chunked form passes the state from chunk to chunk with this op
// (rlkit/core/recurrences.py, _chunked_wkv7), so the loop over chunks is one kernel rather than a
// few ops per chunk. Shapes in ne order, N the batch (heads times sequences), c the chunks:
//   W, U, B, K, V [L, S, N, c]: per chunk, rows are its L tokens, columns the S key (W, B, K) or
//                               value (U, V) channels
//   decay [S, N, c]:            per chunk, its whole decay of each key channel
//   Z0 [S, S, N]:               the state before the first chunk, key channels in rows (dim 0)
// Per batch n and chunk q, from Z = Z_q:
//   T       = W_q Z + U_q                          [L, S]  (the chunk's sa, from its start state)
//   Z_{q+1} = decay_q * Z + B_q^T T + K_q^T V_q    (decay scales each key row)
// Output one column: Z_q for q = 0 .. c [S, S, N, c+1] (the state before each chunk, then after the
// last), then T_q [L, S, N, c] (each chunk's sa, which its outputs take too).
//
// wkv7_chunk_states_back (g like the output, W, U, B, K, V, decay, Z0, the forward's output):
// a column [gW, gU, gB, gK, gV, gdecay, gZ0]. From the end, with D the gradient of Z_{q+1} (the
// final's gradient first), T the forward's and gT its part of g:
//   dT = B_q D + gT_q;  gU_q = dT;  gV_q = K_q D;  gB_q = T D^T;  gK_q = V_q D^T;  gW_q = dT Z_q^T;
//   gdecay_q[i] = sum_j D[i, j] Z_q[i, j];  D = decay_q * D + W_q^T dT + g_q
// and gZ0 is D after the first chunk.
#include <algorithm>
#include <string>
#include <vector>

#include "kernel_util.hpp"

namespace rk {
namespace {

const char* const kChunkArgNames[] = {"W", "U", "B", "K", "V", "decay", "Z0"};

struct ChunkDims {
    int64_t L, S, N, c;
    int64_t block() const { return L * S * N * c; }  // one of W, U, B, K, V
    int64_t states() const { return S * S * N * (c + 1); }
    int64_t matrix() const { return S * S; }
};

// Checks the seven inputs starting at in[first] (see the top) and returns the sizes.
ChunkDims chunk_dims(const char* op, const Inputs& in, size_t first) {
    require_same_float_inputs(op, in, first, {"W", "U", "B", "K", "V", "decay", "Z0"});
    const TensorImpl& W = *in[first];
    const ChunkDims d{W.ne[0], W.ne[1], W.ne[2], W.ne[3]};
    for (size_t x = 1; x < 5; ++x)
        if (in[first + x]->ne != W.ne)
            throw std::invalid_argument(op_err(op, std::string(kChunkArgNames[x]) + " must be [L, S, N, c] like W " +
                                                       W.shape_str() + ", got " + in[first + x]->shape_str()));
    const Shape decay{d.S, d.N, d.c, 1}, start{d.S, d.S, d.N, 1};
    if (in[first + 5]->ne != decay)
        throw std::invalid_argument(op_err(op, "decay must be [S, N, c] = " + sizes({d.S, d.N, d.c}) + ", got " +
                                                   in[first + 5]->shape_str()));
    if (in[first + 6]->ne != start)
        throw std::invalid_argument(op_err(op, "Z0 must be [S, S, N] = " + sizes({d.S, d.S, d.N}) + ", got " +
                                                   in[first + 6]->shape_str()));
    size_add(size_mul(d.S, d.S, d.N, d.c + 1), size_mul(d.L, d.S, d.N, d.c));  // the output's size, checked first
    return d;
}

int64_t forward_numel(const ChunkDims& d) { return d.states() + d.block(); }  // checked by chunk_dims

// out[i] = M[l, i] for one chunk's M [L, S]: its columns as rows, so that the loops over a key
// channel i run over consecutive memory.
template <typename T>
void transpose(const ChunkDims& d, const T* M, T* out) {
    for (int64_t i = 0; i < d.S; ++i)
        for (int64_t l = 0; l < d.L; ++l) out[i + l * d.S] = M[l + i * d.L];
}

// out[i] += a x[i] + b y[i] over i < n (add_scaled, kernel_util.hpp, for one term): the products'
// loops with their outputs innermost, which vectorise (__restrict), each output summing its terms
// in the order the GPU kernel does.
template <typename T>
void add_scaled2(int64_t n, T a, const T* __restrict x, T b, const T* __restrict y, T* __restrict out) {
    for (int64_t i = 0; i < n; ++i) out[i] += a * x[i] + b * y[i];
}

// T = W Z + U for one chunk: W, U, T [L, S], Z [S, S] (column-major).
template <typename T>
void sa_of_chunk(const ChunkDims& d, const T* W, const T* U, const T* Z, T* out) {
    for (int64_t j = 0; j < d.S; ++j) {
        T* t = out + j * d.L;
        std::copy_n(U + j * d.L, d.L, t);
        for (int64_t i = 0; i < d.S; ++i) add_scaled(d.L, Z[i + j * d.S], W + i * d.L, t);
    }
}

// The (n, chunk) block of one of W, U, B, K, V, and of the states.
struct ChunkAt {
    const ChunkDims& d;
    int64_t n;
    int64_t block(int64_t q) const { return (n + d.N * q) * d.L * d.S; }
    int64_t state(int64_t q) const { return (n + d.N * q) * d.matrix(); }
    int64_t decay(int64_t q) const { return (n + d.N * q) * d.S; }
};

}  // namespace

OutSpec shape_wkv7_chunk_states(const Inputs& in, const OpAttrs&) {
    const ChunkDims d = chunk_dims("wkv7_chunk_states", in, 0);
    return OutSpec{{forward_numel(d), 1, 1, 1}, 2, in[0]->dtype};
}

void cpu_wkv7_chunk_states(const Inputs& in, const OpAttrs&, TensorImpl& out) {
    const ChunkDims d = chunk_dims("wkv7_chunk_states", in, 0);
    dispatch_float(out.dtype, [&](auto tag) {
        using T = decltype(tag);
        const T *W = in[0]->ptr<T>(), *U = in[1]->ptr<T>(), *B = in[2]->ptr<T>(), *K = in[3]->ptr<T>(),
                *V = in[4]->ptr<T>(), *decay = in[5]->ptr<T>(), *Z0 = in[6]->ptr<T>();
        T* Z = out.ptr<T>();
        T* sa_out = Z + d.states();
        // one task per batch: it owns its states
        parallel_for(d.N, 1, [&](int64_t lo, int64_t hi) {
            std::vector<T> Bt(d.S * d.L), Kt(d.S * d.L);
            for (int64_t n = lo; n < hi; ++n) {
                const ChunkAt at{d, n};
                std::copy_n(Z0 + n * d.matrix(), d.matrix(), Z + at.state(0));
                for (int64_t q = 0; q < d.c; ++q) {
                    const T* z = Z + at.state(q);
                    T* next = Z + at.state(q + 1);
                    const int64_t b = at.block(q);
                    T* sa = sa_out + b;
                    sa_of_chunk(d, W + b, U + b, z, sa);
                    transpose(d, B + b, Bt.data());
                    transpose(d, K + b, Kt.data());
                    const T* g = decay + at.decay(q);
                    for (int64_t j = 0; j < d.S; ++j) {  // next[:, j] = g z[:, j] + B^T T[:, j] + K^T V[:, j]
                        T* out_j = next + j * d.S;
                        for (int64_t i = 0; i < d.S; ++i) out_j[i] = g[i] * z[i + j * d.S];
                        for (int64_t l = 0; l < d.L; ++l)
                            add_scaled2(d.S, sa[l + j * d.L], Bt.data() + l * d.S, V[b + l + j * d.L], Kt.data() + l * d.S, out_j);
                    }
                }
            }
        });
    });
}

OutSpec shape_wkv7_chunk_states_back(const Inputs& in, const OpAttrs&) {
    const char* op = "wkv7_chunk_states_back";
    const ChunkDims d = chunk_dims(op, in, 1);
    const int64_t n = forward_numel(d);
    for (size_t x : {size_t(0), size_t(8)}) {
        const TensorImpl& t = *in[x];
        const char* name = x == 0 ? "g" : "out";
        require_float(op, t, name);
        if (t.dtype != in[1]->dtype)
            throw TypeError(op_err(op, std::string(name) + " and W have different dtypes"));
        if (t.numel() != n || t.ne[1] != 1)
            throw std::invalid_argument(op_err(op, std::string(name) + " " + t.shape_str() +
                                                       " is not the forward's output shape [" + std::to_string(n) + "]"));
    }
    const int64_t total = size_add(size_mul(5, d.block()), size_mul(d.S, d.N, d.c), size_mul(d.matrix(), d.N));
    return OutSpec{{total, 1, 1, 1}, 2, in[1]->dtype};
}

void cpu_wkv7_chunk_states_back(const Inputs& in, const OpAttrs&, TensorImpl& out) {
    const ChunkDims d = chunk_dims("wkv7_chunk_states_back", in, 1);
    dispatch_float(out.dtype, [&](auto tag) {
        using T = decltype(tag);
        const T *g = in[0]->ptr<T>(), *W = in[1]->ptr<T>(), *B = in[3]->ptr<T>(), *K = in[4]->ptr<T>(),
                *V = in[5]->ptr<T>(), *decay = in[6]->ptr<T>(), *Z = in[8]->ptr<T>();
        const T *sa_all = Z + d.states(), *gT = g + d.states();  // the forward's T and its gradient
        T* gW = out.ptr<T>();
        T *gU = gW + d.block(), *gB = gU + d.block(), *gK = gB + d.block(), *gV = gK + d.block();
        T *gdecay = gV + d.block(), *gZ0 = gdecay + d.S * d.N * d.c;
        parallel_for(d.N, 1, [&](int64_t lo, int64_t hi) {
            std::vector<T> Wt(d.S * d.L);
            for (int64_t n = lo; n < hi; ++n) {
                const ChunkAt at{d, n};
                T* D = gZ0 + n * d.matrix();  // the gradient of the state after chunk q, walking back
                std::copy_n(g + at.state(d.c), d.matrix(), D);
                for (int64_t q = d.c - 1; q >= 0; --q) {
                    const int64_t b = at.block(q);
                    const T* z = Z + at.state(q);
                    const T* gamma = decay + at.decay(q);
                    const T* sa = sa_all + b;
                    T* dT = gU + b;
                    // dT = gT + B D, gV = K D: column j of each sums the rows of B or K over i
                    std::copy_n(gT + b, d.L * d.S, dT);
                    std::fill_n(gV + b, d.L * d.S, T(0));
                    for (int64_t j = 0; j < d.S; ++j)
                        for (int64_t i = 0; i < d.S; ++i) {
                            add_scaled(d.L, D[i + j * d.S], B + b + i * d.L, dT + j * d.L);
                            add_scaled(d.L, D[i + j * d.S], K + b + i * d.L, gV + b + j * d.L);
                        }
                    // gB = T D^T, gK = V D^T, gW = dT Z^T (column i sums over j), gdecay[i] = sum_j D Z
                    std::fill_n(gB + b, d.L * d.S, T(0));
                    std::fill_n(gK + b, d.L * d.S, T(0));
                    std::fill_n(gW + b, d.L * d.S, T(0));
                    for (int64_t i = 0; i < d.S; ++i) {
                        T gd = 0;
                        for (int64_t j = 0; j < d.S; ++j) {
                            const T dij = D[i + j * d.S], zij = z[i + j * d.S];
                            gd += dij * zij;
                            add_scaled(d.L, dij, sa + j * d.L, gB + b + i * d.L);
                            add_scaled(d.L, dij, V + b + j * d.L, gK + b + i * d.L);
                            add_scaled(d.L, zij, dT + j * d.L, gW + b + i * d.L);
                        }
                        gdecay[at.decay(q) + i] = gd;
                    }
                    transpose(d, W + b, Wt.data());
                    const T* g_q = g + at.state(q);
                    for (int64_t j = 0; j < d.S; ++j) {  // D = decay D + g_q + W^T dT
                        T* D_j = D + j * d.S;
                        for (int64_t i = 0; i < d.S; ++i) D_j[i] = gamma[i] * D_j[i] + g_q[i + j * d.S];
                        for (int64_t l = 0; l < d.L; ++l)
                            add_scaled(d.S, dT[l + j * d.L], Wt.data() + l * d.S, D_j);
                    }
                }
            }
        });
    });
}

}  // namespace rk
