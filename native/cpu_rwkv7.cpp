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
#include "recurrence.hpp"

namespace rk {
namespace {

const char* const kArgNames[] = {"r", "w", "k", "v", "a", "b", "state"};

struct Wkv7Dims {
    int64_t S, H, T, n_seqs;
    int64_t seq_len() const { return T / n_seqs; }
    int64_t tokens_numel() const { return S * H * T; }  // one of r, w, k, v, a, b
    int64_t state_numel() const { return S * S * H * n_seqs; }
    int64_t n_chunks() const { return (seq_len() + kRecurrenceChunk - 1) / kRecurrenceChunk; }
    // Columns [S*H] after the gradients in the backward output: the GPU kernel's scratch, per
    // (sequence, head) the adjoint, one chunk's states and the checkpoints (S x S each), sa and gsa.
    // Checked: chunks times S times n_seqs may pass int64 for pending inputs.
    int64_t scratch_columns() const { return size_mul(n_seqs, size_add(size_mul(1 + kRecurrenceChunk + n_chunks(), S), 2)); }
};

// Checks the seven inputs (r, w, k, v, a, b, state) starting at in[first] and returns the dims.
Wkv7Dims wkv7_dims(const char* op, const Inputs& in, size_t first) {
    std::vector<NamedInput> vectors;
    for (size_t x = 0; x < 6; ++x) vectors.push_back({in[first + x].get(), kArgNames[x]});
    const RecurrenceDims d = recurrence_dims(op, vectors, *in[first + 6]);
    return {d.S, d.H, d.T, d.n_seqs};
}

// One token's update of one head's state in place: sa = S a, then S = S diag(w) + v k^T + sa b^T.
template <typename T>
void advance(T* st, const T* w, const T* k, const T* v, const T* a, const T* b, T* sa, int64_t S) {
    for (int64_t i = 0; i < S; ++i) sa[i] = dot(a, st + i * S, S);
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
                    for (int64_t i = 0; i < d.S; ++i) y_t[i] = dot(st + i * d.S, x.r, d.S);
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
    return OutSpec{{d.S * d.H, size_add(6 * d.T, d.S * d.n_seqs, d.scratch_columns()), 1, 1}, 2, g.dtype};
}

namespace {

// Where one token's gradients of one head go: r, w, k, v, a, b are consecutive blocks of `block`.
template <typename T>
struct TokenGrads {
    T *r, *w, *k, *v, *a, *b;
    TokenGrads(T* grads, int64_t block, int64_t at)
        : r(grads + at), w(r + block), k(w + block), v(k + block), a(v + block), b(a + block) {}
};

// One token of the walk back (reference/vulkan-ssm.md 5.3), prev = S_{t-1}, D = dL/dS_t from the
// later tokens on entry and dL/dS_{t-1} on return:
//   D += gy r^T;  gr = S_t^T gy;  gw[j] = sum_i D S_{t-1};  gk = D^T v;  gv = D k;  gb = D^T sa;
//   gsa = D b;  ga = S_{t-1}^T gsa;  D = D diag(w) + gsa a^T
//
// The loops over j are functions whose arrays are __restrict: the gradients of one token all
// point into one output, and without that promise the compiler does not vectorise them.
template <typename T>
void row_sums_back(int64_t S, const T* __restrict p, const T* __restrict d, const T* __restrict w,
                   const T* __restrict k, const T* __restrict b, T gy_i, T v_i, T sa_i, T* __restrict gr,
                   T* __restrict gw, T* __restrict gk, T* __restrict gb) {
    for (int64_t j = 0; j < S; ++j) {
        gr[j] += gy_i * (p[j] * w[j] + v_i * k[j] + sa_i * b[j]);  // S_t[i, j]
        gw[j] += d[j] * p[j];
        gk[j] += d[j] * v_i;
        gb[j] += d[j] * sa_i;
    }
}

template <typename T>
void carry_back(int64_t S, const T* __restrict p, const T* __restrict w, const T* __restrict a, T gsa_i,
                T* __restrict d, T* __restrict ga) {
    for (int64_t j = 0; j < S; ++j) {
        ga[j] += gsa_i * p[j];
        d[j] = d[j] * w[j] + gsa_i * a[j];
    }
}

template <typename T>
void step_back(const Token<T>& x, const T* prev, const T* gy, T* D, T* sa, T* gsa, const TokenGrads<T>& out,
               int64_t S) {
    for (int64_t i = 0; i < S; ++i) sa[i] = dot(x.a, prev + i * S, S);
    for (int64_t i = 0; i < S; ++i)
        for (int64_t j = 0; j < S; ++j) D[i * S + j] += gy[i] * x.r[j];
    for (int64_t j = 0; j < S; ++j) out.r[j] = out.w[j] = out.k[j] = out.b[j] = out.a[j] = 0;
    for (int64_t i = 0; i < S; ++i) {
        const T* row = D + i * S;
        row_sums_back(S, prev + i * S, row, x.w, x.k, x.b, gy[i], x.v[i], sa[i], out.r, out.w, out.k, out.b);
        out.v[i] = dot(row, x.k, S);
        gsa[i] = dot(row, x.b, S);
    }
    for (int64_t i = 0; i < S; ++i) carry_back(S, prev + i * S, x.w, x.a, gsa[i], D + i * S, out.a);
}

// The backward of one (sequence, head). A forward pass keeps the state before every
// kRecurrenceChunk-th token (the checkpoints); then, chunk by chunk from the end, the chunk's states are
// recomputed from its checkpoint and the adjoint walks back through them. The update is never
// inverted: a state is only ever recomputed forwards.
template <typename T>
class BackwardTask {
  public:
    BackwardTask(const Inputs& in, const Wkv7Dims& d)
        : in_(in), d_(d), SS_(d.S * d.S), n_chunks_((d.seq_len() + kRecurrenceChunk - 1) / kRecurrenceChunk),
          checkpoints_(n_chunks_ * SS_), states_(kRecurrenceChunk * SS_), adjoint_(SS_), sa_(d.S), gsa_(d.S) {}

    void run(int64_t seq, int64_t h, T* grads) {
        const int64_t task = seq * d_.H + h, L = d_.seq_len();
        h_ = h;
        t0_ = seq * L;
        std::copy_n(in_[7]->ptr<T>() + task * SS_, SS_, checkpoints_.data());
        for (int64_t c = 0; c + 1 < n_chunks_; ++c) {
            fill_chunk(c, kRecurrenceChunk);
            T* next = checkpoints_.data() + (c + 1) * SS_;
            std::copy_n(states_.data() + (kRecurrenceChunk - 1) * SS_, SS_, next);
            advance_by(next, t0_ + (c + 1) * kRecurrenceChunk - 1);
        }
        const T* g = in_[0]->ptr<T>();
        std::copy_n(g + d_.tokens_numel() + task * SS_, SS_, adjoint_.data());  // dL/d final state
        for (int64_t c = n_chunks_ - 1; c >= 0; --c) {
            const int64_t len = std::min(kRecurrenceChunk, L - c * kRecurrenceChunk);
            fill_chunk(c, len);
            for (int64_t q = len - 1; q >= 0; --q) {
                const int64_t t = t0_ + c * kRecurrenceChunk + q, at = (t * d_.H + h) * d_.S;
                step_back(token<T>(in_, 1, d_, t, h), states_.data() + q * SS_, g + at, adjoint_.data(), sa_.data(),
                          gsa_.data(), TokenGrads<T>(grads, d_.tokens_numel(), at), d_.S);
            }
        }
        std::copy_n(adjoint_.data(), SS_, grads + 6 * d_.tokens_numel() + task * SS_);
    }

  private:
    void advance_by(T* st, int64_t t) {
        const Token<T> x = token<T>(in_, 1, d_, t, h_);
        advance(st, x.w, x.k, x.v, x.a, x.b, sa_.data(), d_.S);
    }

    // states_[q] := the state before token q of chunk c, for q < len (q = 0 is the checkpoint)
    void fill_chunk(int64_t c, int64_t len) {
        std::copy_n(checkpoints_.data() + c * SS_, SS_, states_.data());
        for (int64_t q = 1; q < len; ++q) {
            std::copy_n(states_.data() + (q - 1) * SS_, SS_, states_.data() + q * SS_);
            advance_by(states_.data() + q * SS_, t0_ + c * kRecurrenceChunk + q - 1);
        }
    }

    const Inputs& in_;
    const Wkv7Dims d_;
    const int64_t SS_, n_chunks_;
    std::vector<T> checkpoints_, states_, adjoint_, sa_, gsa_;
    int64_t h_ = 0, t0_ = 0;
};

}  // namespace

void cpu_rwkv_wkv7_back(const Inputs& in, const OpAttrs&, TensorImpl& out) {
    const Wkv7Dims d = wkv7_dims("rwkv_wkv7_back", in, 1);
    dispatch_float(out.dtype, [&](auto tag) {
        using T = decltype(tag);
        // one task per (sequence, head): its gradient columns and state block are its own
        parallel_for(d.n_seqs * d.H, task_grain(d), [&](int64_t lo, int64_t hi) {
            BackwardTask<T> task(in, d);  // memory: the checkpoints and one chunk of states
            for (int64_t k = lo; k < hi; ++k) task.run(k / d.H, k % d.H, out.ptr<T>());
        });
    });
}

}  // namespace rk
