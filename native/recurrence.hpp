// The sizes and packed layouts shared by the RWKV-6 and gated-linear-attention recurrences
// (rwkv_wkv6, gated_linear_attn and their _back helpers), for the CPU kernels and the Vulkan
// recording (rwkv_wkv7, cpu_rwkv7.cpp, checkpoints at the same chunk length). Shapes in ne order,
// as ggml gives them:
//   per-token vectors (k, v, r or q, td or g): [S, H, T], T tokens of n_seqs sequences of T / n_seqs
//   state: [S*S*H, n_seqs], head h's S x S matrix at state[h*S*S + i*S + j] of its sequence's column
//   forward output: [S*H, T + S*n_seqs]: T columns of y, then the new state
// The backward helpers return [S*H, n_cols] packing (in this order) the gradients of the four
// per-token inputs (T columns each), for rwkv_wkv6 the bonus u per sequence (n_seqs columns, the
// caller sums them), the initial state's (S*n_seqs columns), then scratch: per (sequence, head)
// `slabs()` S x S matrices: [0] the working state, [1, n_chunks] the state at the start of every
// chunk of kChunk tokens, then kChunk slots for the states inside one chunk. The backward pass
// keeps only those, recomputing a chunk's states forward before walking it backwards. (The GPU
// kernels use that region; the CPU keeps the same matrices in each worker's own memory.)
#pragma once

#include <cstdint>
#include <vector>

#include "ops.hpp"

namespace rk {

constexpr int64_t kRecurrenceChunk = 16;  // tokens between stored states in the backward pass

struct RecurrenceDims {
    int64_t S, H, T, n_seqs;
    int64_t seq_len() const { return T / n_seqs; }
    int64_t n_chunks() const { return (seq_len() + kRecurrenceChunk - 1) / kRecurrenceChunk; }
    int64_t matrix() const { return S * S; }
    int64_t token() const { return S * H; }  // elements of one token's vector
    int64_t slabs() const { return 1 + n_chunks() + kRecurrenceChunk; }
};

// Element offsets of the regions of a backward helper's packed output.
struct BackLayout {
    int64_t grads;    // the four per-token gradients, T columns each
    int64_t bonus;    // rwkv_wkv6's u gradient per sequence [S*H, n_seqs] (gated_linear_attn: none)
    int64_t state;    // the initial state's gradient [S*S*H, n_seqs]
    int64_t scratch;  // slabs() matrices per (sequence, head)
    int64_t total;
};

// Checked (size_add, size_mul): the scratch's slabs times the state may pass int64 for pending inputs.
inline BackLayout back_layout(const RecurrenceDims& d, bool with_bonus) {
    BackLayout l{};
    l.grads = 0;
    l.bonus = size_mul(4, d.token(), d.T);
    l.state = size_add(l.bonus, with_bonus ? size_mul(d.token(), d.n_seqs) : 0);
    const int64_t state_numel = size_mul(d.matrix(), d.H, d.n_seqs);
    l.scratch = size_add(l.state, state_numel);
    l.total = size_add(l.scratch, size_mul(d.slabs(), state_numel));
    return l;
}

// A per-token input of a recurrence and its name in error messages.
struct NamedInput {
    const TensorImpl* tensor;
    const char* name;
};

// The sizes of a recurrence's inputs, checked (cpu_rwkv.cpp): every per-token vector a float
// [S, H, T] tensor like the first, the state [S*S*H, n_seqs] of the same dtype (S*S*H computed
// with size_mul), T divisible by n_seqs. Shared by rwkv_wkv6, gated_linear_attn and rwkv_wkv7.
// Then S*S, S*H and S*n_seqs are at most a tensor's element count, and T + S*n_seqs fits int64.
RecurrenceDims recurrence_dims(const char* op, const std::vector<NamedInput>& vectors, const TensorImpl& state);

// The sizes read from k [S, H, T] and state [S*S*H, n_seqs] (shapes the shape rule validated).
inline RecurrenceDims recurrence_sizes(const TensorImpl& k, const TensorImpl& state) {
    return {k.ne[0], k.ne[1], k.ne[2], state.ne[1]};
}

}  // namespace rk
