// RWKV-7's recurrence (ggml_rwkv_wkv7) and its backward helper. Shapes in ne order, as ggml's:
//   r, w, k, v, a, b [S, H, T]: T tokens of n_seqs equal sequences (sequence s owns tokens
//                               [s T/n_seqs, (s+1) T/n_seqs)), S the head size, H heads
//   state [S*S*H, n_seqs]:      head h's S x S matrix of sequence s at (s*H + h)*S*S + i*S + j,
//                               i the value row, j the key column
// Per token of head h (w the decay in linear space):
//   sa[i]  = sum_j a[j] S[i, j]
//   S[i,j] = S[i,j] w[j] + v[i] k[j] + sa[i] b[j]
//   y[i]   = sum_j S[i, j] r[j]
// Forward output [S*H, T + S*n_seqs]: the T columns of y, then the final states (state's layout).
// Backward output [S*H, 6T + S*n_seqs]: the gradients of r, w, k, v, a, b (T columns each, in
// that order), then the gradient of state.
#include <algorithm>
#include <vector>

#include "kernel_util.hpp"

namespace rk {
namespace {

const char* const kArgNames[] = {"r", "w", "k", "v", "a", "b", "state"};

struct Wkv7Dims {
    int64_t S, H, T, n_seqs;
    int64_t seq_len() const { return T / n_seqs; }
    int64_t tokens_numel() const { return S * H * T; }  // one of r, w, k, v, a, b
    int64_t state_numel() const { return S * S * H * n_seqs; }
};

// Checks the seven inputs (r, w, k, v, a, b, state) starting at in[first] and returns the dims.
Wkv7Dims wkv7_dims(const char* op, const Inputs& in, size_t first) {
    const TensorImpl& r = *in[first];
    for (size_t x = 0; x < 7; ++x) {
        const TensorImpl& t = *in[first + x];
        require_float(op, t, kArgNames[x]);
        if (t.dtype != r.dtype)
            throw TypeError(op_err(op, std::string(kArgNames[x]) + " is " + dtype_name(t.dtype) + " but r is " +
                                           dtype_name(r.dtype) + " (expected the same float dtype for every input)"));
    }
    if (r.ne[3] != 1)
        throw std::invalid_argument(op_err(op, "r must be [S, H, T] (3-D), got " + r.shape_str()));
    for (size_t x = 1; x < 6; ++x) {
        const TensorImpl& t = *in[first + x];
        if (t.ne != r.ne)
            throw std::invalid_argument(op_err(op, std::string(kArgNames[x]) + " " + t.shape_str() + " differs from r " +
                                                       r.shape_str() + " (expected r, w, k, v, a, b all [S, H, T])"));
    }
    const Wkv7Dims d{r.ne[0], r.ne[1], r.ne[2], 1};
    const TensorImpl& state = *in[first + 6];
    if (state.ne[0] != d.S * d.S * d.H || state.ne[2] != 1 || state.ne[3] != 1)
        throw std::invalid_argument(op_err(op, "state " + state.shape_str() + " must be [S*S*H, n_seqs] = [" +
                                                   std::to_string(d.S * d.S * d.H) + ", n_seqs] for S = " +
                                                   std::to_string(d.S) + ", H = " + std::to_string(d.H)));
    const int64_t n_seqs = state.ne[1];
    if (d.T % n_seqs != 0)
        throw std::invalid_argument(op_err(op, "T = " + std::to_string(d.T) + " tokens do not split into n_seqs = " +
                                                   std::to_string(n_seqs) + " equal sequences (state's dim 1)"));
    return {d.S, d.H, d.T, n_seqs};
}

// One token's update of one head's state in place: sa = S a, then S = S diag(w) + v k^T + sa b^T.
template <typename T>
void advance(T* st, const T* w, const T* k, const T* v, const T* a, const T* b, T* sa, int64_t S) {
    for (int64_t i = 0; i < S; ++i) {
        T acc = 0;
        for (int64_t j = 0; j < S; ++j) acc += a[j] * st[i * S + j];
        sa[i] = acc;
    }
    for (int64_t i = 0; i < S; ++i)
        for (int64_t j = 0; j < S; ++j) st[i * S + j] = st[i * S + j] * w[j] + v[i] * k[j] + sa[i] * b[j];
}

// Pointers to one token's vectors of one head in each of r, w, k, v, a, b.
template <typename T>
struct Token {
    const T *r, *w, *k, *v, *a, *b;
};

template <typename T>
Token<T> token(const Inputs& in, size_t first, const Wkv7Dims& d, int64_t t, int64_t h) {
    const int64_t at = (t * d.H + h) * d.S;
    return {in[first]->ptr<T>() + at,     in[first + 1]->ptr<T>() + at, in[first + 2]->ptr<T>() + at,
            in[first + 3]->ptr<T>() + at, in[first + 4]->ptr<T>() + at, in[first + 5]->ptr<T>() + at};
}

// Grain of the (sequence, head) tasks: each walks its whole sequence over an S x S state.
int64_t task_grain(const Wkv7Dims& d) { return std::max<int64_t>(1, kElementGrain / (d.seq_len() * d.S * d.S)); }

// Tokens between the states the backward keeps (it recomputes the ones in between).
constexpr int64_t kWkv7Chunk = 16;

}  // namespace

OutSpec shape_rwkv_wkv7(const Inputs& in, const OpAttrs&) {
    const Wkv7Dims d = wkv7_dims("rwkv_wkv7", in, 0);
    return OutSpec{{d.S * d.H, d.T + d.S * d.n_seqs, 1, 1}, 2, in[0]->dtype};
}

void cpu_rwkv_wkv7(const Inputs& in, const OpAttrs&, TensorImpl& out) {
    const Wkv7Dims d = wkv7_dims("rwkv_wkv7", in, 0);
    dispatch_float(out.dtype, [&](auto tag) {
        using T = decltype(tag);
        T* y = out.ptr<T>();
        T* final_state = y + d.tokens_numel();
        const T* state = in[6]->ptr<T>();
        // one task per (sequence, head): it owns its state and its rows of y
        parallel_for(d.n_seqs * d.H, task_grain(d), [&](int64_t lo, int64_t hi) {
            std::vector<T> sa(d.S);
            for (int64_t task = lo; task < hi; ++task) {
                const int64_t seq = task / d.H, h = task % d.H;
                T* st = final_state + task * d.S * d.S;  // updated in place, token by token
                std::copy_n(state + task * d.S * d.S, d.S * d.S, st);
                for (int64_t t = seq * d.seq_len(); t < (seq + 1) * d.seq_len(); ++t) {
                    const Token<T> x = token<T>(in, 0, d, t, h);
                    advance(st, x.w, x.k, x.v, x.a, x.b, sa.data(), d.S);
                    T* y_t = y + (t * d.H + h) * d.S;
                    for (int64_t i = 0; i < d.S; ++i) {
                        T acc = 0;
                        for (int64_t j = 0; j < d.S; ++j) acc += st[i * d.S + j] * x.r[j];
                        y_t[i] = acc;
                    }
                }
            }
        });
    });
}

OutSpec shape_rwkv_wkv7_back(const Inputs& in, const OpAttrs&) {
    const Wkv7Dims d = wkv7_dims("rwkv_wkv7_back", in, 1);
    const TensorImpl& g = *in[0];
    require_float("rwkv_wkv7_back", g, "g");
    if (g.dtype != in[1]->dtype)
        throw TypeError(op_err("rwkv_wkv7_back", "g and r have different dtypes"));
    if (g.ne[0] != d.S * d.H || g.ne[1] != d.T + d.S * d.n_seqs || g.ne[2] != 1 || g.ne[3] != 1)
        throw std::invalid_argument(op_err("rwkv_wkv7_back", "g " + g.shape_str() + " is not the forward's output shape [" +
                                                                 std::to_string(d.S * d.H) + ", " +
                                                                 std::to_string(d.T + d.S * d.n_seqs) + "]"));
    return OutSpec{{d.S * d.H, 6 * d.T + d.S * d.n_seqs, 1, 1}, 2, g.dtype};
}

// Per (sequence, head): a forward pass keeps the state before every kWkv7Chunk-th token; then,
// chunk by chunk from the end, the chunk's states are recomputed from its checkpoint and the
// adjoint D = dL/dS walks back through them (reference/vulkan-ssm.md 5.3):
//   D += gy r^T;  gr = S_t^T gy;  gw[j] = sum_i D S_{t-1};  gk = D^T v;  gv = D k;  gb = D^T sa;
//   gsa = D b;  ga = S_{t-1}^T gsa;  D = D diag(w) + gsa a^T
// The update is never inverted: a state is only ever recomputed forwards.
void cpu_rwkv_wkv7_back(const Inputs& in, const OpAttrs&, TensorImpl& out) {
    const Wkv7Dims d = wkv7_dims("rwkv_wkv7_back", in, 1);
    dispatch_float(out.dtype, [&](auto tag) {
        using T = decltype(tag);
        const T* g = in[0]->ptr<T>();
        const T* state = in[7]->ptr<T>();
        T* grads = out.ptr<T>();  // r, w, k, v, a, b: T columns each, then the state's
        const int64_t S = d.S, SS = S * S, L = d.seq_len(), n_chunks = (L + kWkv7Chunk - 1) / kWkv7Chunk;
        parallel_for(d.n_seqs * d.H, task_grain(d), [&](int64_t lo, int64_t hi) {
            std::vector<T> checkpoints(n_chunks * SS), states(kWkv7Chunk * SS), adjoint(SS), sa(S), gsa(S);
            for (int64_t task = lo; task < hi; ++task) {
                const int64_t seq = task / d.H, h = task % d.H, t0 = seq * L;
                // states[q] := the state before token c*C + q of chunk c (q = 0 is the checkpoint)
                auto fill_chunk = [&](int64_t c, int64_t len) {
                    std::copy_n(checkpoints.data() + c * SS, SS, states.data());
                    for (int64_t q = 1; q < len; ++q) {
                        std::copy_n(states.data() + (q - 1) * SS, SS, states.data() + q * SS);
                        const Token<T> x = token<T>(in, 1, d, t0 + c * kWkv7Chunk + q - 1, h);
                        advance(states.data() + q * SS, x.w, x.k, x.v, x.a, x.b, sa.data(), S);
                    }
                };
                std::copy_n(state + task * SS, SS, checkpoints.data());
                for (int64_t c = 0; c + 1 < n_chunks; ++c) {
                    fill_chunk(c, kWkv7Chunk);
                    T* next = checkpoints.data() + (c + 1) * SS;
                    std::copy_n(states.data() + (kWkv7Chunk - 1) * SS, SS, next);
                    const Token<T> x = token<T>(in, 1, d, t0 + (c + 1) * kWkv7Chunk - 1, h);
                    advance(next, x.w, x.k, x.v, x.a, x.b, sa.data(), S);
                }
                T* D = adjoint.data();
                std::copy_n(g + d.tokens_numel() + task * SS, SS, D);  // dL/d final state
                for (int64_t c = n_chunks - 1; c >= 0; --c) {
                    const int64_t len = std::min(kWkv7Chunk, L - c * kWkv7Chunk);
                    fill_chunk(c, len);
                    for (int64_t q = len - 1; q >= 0; --q) {
                        const int64_t t = t0 + c * kWkv7Chunk + q, at = (t * d.H + h) * S;
                        const Token<T> x = token<T>(in, 1, d, t, h);
                        const T* prev = states.data() + q * SS;  // S_{t-1}
                        const T* gy = g + at;
                        T *gr = grads + at, *gw = gr + d.tokens_numel(), *gk = gw + d.tokens_numel();
                        T *gv = gk + d.tokens_numel(), *ga = gv + d.tokens_numel(), *gb = ga + d.tokens_numel();
                        for (int64_t i = 0; i < S; ++i) {
                            T acc = 0;
                            for (int64_t j = 0; j < S; ++j) acc += x.a[j] * prev[i * S + j];
                            sa[i] = acc;
                        }
                        for (int64_t i = 0; i < S; ++i)
                            for (int64_t j = 0; j < S; ++j) D[i * S + j] += gy[i] * x.r[j];
                        for (int64_t j = 0; j < S; ++j) gr[j] = gw[j] = gk[j] = gb[j] = ga[j] = 0;
                        for (int64_t i = 0; i < S; ++i) {
                            T acc_v = 0, acc_sa = 0;
                            for (int64_t j = 0; j < S; ++j) {
                                const T p = prev[i * S + j], dij = D[i * S + j];
                                gr[j] += gy[i] * (p * x.w[j] + x.v[i] * x.k[j] + sa[i] * x.b[j]);  // gy^T S_t
                                gw[j] += dij * p;
                                gk[j] += dij * x.v[i];
                                gb[j] += dij * sa[i];
                                acc_v += dij * x.k[j];
                                acc_sa += dij * x.b[j];
                            }
                            gv[i] = acc_v;
                            gsa[i] = acc_sa;
                        }
                        for (int64_t i = 0; i < S; ++i)
                            for (int64_t j = 0; j < S; ++j) {
                                ga[j] += gsa[i] * prev[i * S + j];
                                D[i * S + j] = D[i * S + j] * x.w[j] + gsa[i] * x.a[j];
                            }
                    }
                }
                std::copy_n(D, SS, grads + 6 * d.tokens_numel() + task * SS);
            }
        });
    });
}

}  // namespace rk
