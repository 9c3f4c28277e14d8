// decayed_pairs: the products of the chunked recurrences' pairs of tokens within a chunk
// (rlkit/core/recurrences.py), weighted per channel by the decays between the two tokens, without
// the [S, L, L] tensor of those decays that composed ops would write. Shapes in ne order:
//   left, right, log_decay [S, L, B]: S channels, the L tokens of a chunk, B chunks
//   out [L, L, B]: out[t, s] = sum_j left[j, t] right[j, s] exp(sum of log_decay[j, r] over the
//                  steps r between s and t), for s <= t with s < r <= t (ints[0] = 1, "through
//                  the last": the state after token t), or for s < t with s < r < t (0: the state
//                  token t reads before its own update); 0 elsewhere
// Each range's sum is its own running sum from s (never a difference of two running sums, which
// would lose the digits of a decay near 1 over long chunks), so exponents are never above 0.
//
// decayed_pairs_back (g [L, L, B], left, right, log_decay; the same int) -> a column [g_left, g_right,
// g_log_decay, scratch], each [S, L, B] (the scratch, the GPU's, zeros on return): with
// x[t, s] = g[t, s] left[j, t] right[j, s] exp(...) per channel j,
//   g_left[j, t] = sum_s g[t, s] right[j, s] exp(...), g_right[j, s] likewise,
//   g_log_decay[j, r] = the sum of x over the pairs whose range holds r: per s, the suffix sums
//                       over t of x[., s] (a pair (t', s) holds r = end(t) iff t' >= t).
// The CPU loops run over the channels (consecutive in memory, so they vectorise); the GPU has an
// invocation per pair of tokens in the forward and per (chunk, channel) in the backward
// (shaders/decayed_pairs.comp). The backward's terms are summed in the same order on both; the
// forward's channels in 8 lanes on the CPU (dot) and one by one on the GPU.
#include <cmath>
#include <string>
#include <vector>

#include "kernel_util.hpp"

namespace rk {
namespace {

const char* const kPairArgNames[] = {"left", "right", "log_decay"};

struct PairDims {
    int64_t S, L, B;
    bool through_last;
    // The last step of pair (t, s)'s range (its first is s + 1).
    int64_t range_end(int64_t t) const { return through_last ? t : t - 1; }
};

// Checks (left, right, log_decay) at in[first..] and the int attribute; returns the sizes.
PairDims pair_dims(const char* op, const Inputs& in, size_t first, const OpAttrs& attrs) {
    if (attrs.ints.size() != 1 || (attrs.ints[0] != 0 && attrs.ints[0] != 1))
        throw std::invalid_argument(op_err(op, "expected one int attribute, through_last: 0 or 1"));
    require_same_float_inputs(op, in, first, {kPairArgNames[0], kPairArgNames[1], kPairArgNames[2]});
    const TensorImpl& left = *in[first];
    for (size_t x = 0; x < 3; ++x) {
        const TensorImpl& t = *in[first + x];
        if (t.ne != left.ne || t.ne[3] != 1)
            throw std::invalid_argument(op_err(op, std::string(kPairArgNames[x]) + " must be [S, L, B] like left " +
                                                       left.shape_str() + ", got " + t.shape_str()));
    }
    size_mul(left.ne[1], left.ne[1], left.ne[2]);  // the output's size, checked
    return {left.ne[0], left.ne[1], left.ne[2], attrs.ints[0] == 1};
}

// The loops over the channels (consecutive in memory): they vectorise (__restrict).
template <typename T>
void add_to(int64_t n, const T* __restrict x, T* __restrict out) {
    for (int64_t i = 0; i < n; ++i) out[i] += x[i];
}

template <typename T>
void multiply(int64_t n, const T* __restrict a, const T* __restrict b, T* __restrict out) {
    for (int64_t i = 0; i < n; ++i) out[i] = a[i] * b[i];
}

// One pair's terms of the gradients, every channel: weight = g exp(...), g_left[t] += weight
// right[s], g_right[s] += weight left[t], x = weight left[t] right[s].
template <typename T>
void pair_terms(int64_t n, T g, const T* __restrict decay, const T* __restrict left_t, const T* __restrict right_s,
                T* __restrict g_left_t, T* __restrict g_right_s, T* __restrict x) {
    for (int64_t j = 0; j < n; ++j) {
        const T weight = g * decay[j];
        g_left_t[j] += weight * right_s[j];
        g_right_s[j] += weight * left_t[j];
        x[j] = weight * left_t[j] * right_s[j];
    }
}

// Per-channel vectors of one worker: the running sums of the log decays, their exps, a product.
template <typename T>
struct ChannelWork {
    std::vector<T> sum, decay, product;
    explicit ChannelWork(int64_t S) : sum(S), decay(S), product(S) {}
    // Adds step end(t)'s log decays to the running sums of pair (t, s) (none while the range is
    // empty) and takes their exps; log_decay is the chunk's [S, L].
    void decays(const PairDims& d, const T* log_decay, int64_t s, int64_t t) {
        if (d.range_end(t) > s) add_to(d.S, log_decay + d.range_end(t) * d.S, sum.data());
        for (int64_t j = 0; j < d.S; ++j) decay[j] = exp_of(sum[j]);
    }
};

}  // namespace

OutSpec shape_decayed_pairs(const Inputs& in, const OpAttrs& attrs) {
    const PairDims d = pair_dims("decayed_pairs", in, 0, attrs);
    return OutSpec{{d.L, d.L, d.B, 1}, 3, in[0]->dtype};
}

void cpu_decayed_pairs(const Inputs& in, const OpAttrs& attrs, TensorImpl& out) {
    const PairDims d = pair_dims("decayed_pairs", in, 0, attrs);
    dispatch_float(out.dtype, [&](auto tag) {
        using T = decltype(tag);
        const T *left = in[0]->ptr<T>(), *right = in[1]->ptr<T>(), *log_decay = in[2]->ptr<T>();
        T* o = out.ptr<T>();
        parallel_for(d.B, std::max<int64_t>(1, kElementGrain / (d.S * d.L * d.L)), [&](int64_t lo, int64_t hi) {
            ChannelWork<T> w(d.S);
            for (int64_t b = lo; b < hi; ++b) {
                T* pairs = o + b * d.L * d.L;
                std::fill_n(pairs, d.L * d.L, T(0));
                const int64_t at = b * d.S * d.L;  // [j, t] at at + j + t S
                for (int64_t s = 0; s < d.L; ++s) {
                    std::fill_n(w.sum.data(), d.S, T(0));
                    for (int64_t t = d.through_last ? s : s + 1; t < d.L; ++t) {
                        w.decays(d, log_decay + at, s, t);
                        multiply(d.S, right + at + s * d.S, w.decay.data(), w.product.data());
                        pairs[t + s * d.L] = dot(left + at + t * d.S, w.product.data(), d.S);
                    }
                }
            }
        });
    });
}

OutSpec shape_decayed_pairs_back(const Inputs& in, const OpAttrs& attrs) {
    const PairDims d = pair_dims("decayed_pairs_back", in, 1, attrs);
    const TensorImpl& g = *in[0];
    require_float("decayed_pairs_back", g, "g");
    if (g.dtype != in[1]->dtype)
        throw TypeError(op_err("decayed_pairs_back", "g and left have different dtypes"));
    const Shape want{d.L, d.L, d.B, 1};
    if (g.ne != want)
        throw std::invalid_argument(op_err("decayed_pairs_back", "g " + g.shape_str() + " is not the forward's output shape [" +
                                                                     std::to_string(d.L) + ", " + std::to_string(d.L) +
                                                                     ", " + std::to_string(d.B) + "]"));
    return OutSpec{{size_mul(4, d.S, d.L, d.B), 1, 1, 1}, 2, g.dtype};
}

void cpu_decayed_pairs_back(const Inputs& in, const OpAttrs& attrs, TensorImpl& out) {
    const PairDims d = pair_dims("decayed_pairs_back", in, 1, attrs);
    dispatch_float(out.dtype, [&](auto tag) {
        using T = decltype(tag);
        const T *g = in[0]->ptr<T>(), *left = in[1]->ptr<T>(), *right = in[2]->ptr<T>(), *log_decay = in[3]->ptr<T>();
        const int64_t block = d.S * d.L * d.B;
        T *g_left = out.ptr<T>(), *g_right = g_left + block, *g_log_decay = g_right + block;
        std::fill_n(g_left, 4 * block, T(0));  // the three gradients, then the scratch
        parallel_for(d.B, std::max<int64_t>(1, kElementGrain / (d.S * d.L * d.L)), [&](int64_t lo, int64_t hi) {
            ChannelWork<T> w(d.S);
            std::vector<T> x(d.L * d.S);  // x[., t, s] of one column s, every channel
            for (int64_t b = lo; b < hi; ++b) {
                const T* pair_grads = g + b * d.L * d.L;
                const int64_t at = b * d.S * d.L;
                for (int64_t s = 0; s < d.L; ++s) {
                    const int64_t first = d.through_last ? s : s + 1;
                    const T* right_s = right + at + s * d.S;
                    std::fill_n(w.sum.data(), d.S, T(0));
                    for (int64_t t = first; t < d.L; ++t) {
                        w.decays(d, log_decay + at, s, t);
                        pair_terms(d.S, pair_grads[t + s * d.L], w.decay.data(), left + at + t * d.S, right_s,
                                   g_left + at + t * d.S, g_right + at + s * d.S, x.data() + t * d.S);
                    }
                    std::fill_n(w.product.data(), d.S, T(0));  // the suffix sums over t, per channel
                    for (int64_t t = d.L - 1; t >= first; --t) {
                        add_to(d.S, x.data() + t * d.S, w.product.data());
                        if (d.range_end(t) > s) add_to(d.S, w.product.data(), g_log_decay + at + d.range_end(t) * d.S);
                    }
                }
            }
        });
    });
}

}  // namespace rk
