// The sizes and packed layouts of Mamba's selective scan (ggml_ssm_scan), shared by its shape
// rules, CPU kernels and Vulkan kernels. Shapes in ne order (dim 0 fastest), as ggml gives them:
//   s   [d_state, head_dim, n_head, n_rs]   initial states, column ids[q] for sequence q
//   x   [head_dim, n_head, n_tok, n_seqs]
//   dt  [n_head, n_tok, n_seqs]             raw; softplus is applied inside
//   A   [1, n_head] (Mamba-2: one decay per head) or [d_state, n_head] (Mamba-1: one per state)
//   B,C [d_state, n_group, n_tok, n_seqs]   head h reads group h / (n_head / n_group)
//   ids i32 [n_seqs]
// Forward output, one column: y [head_dim, n_head, n_tok, n_seqs], then the final states
// [d_state, head_dim, n_head, n_seqs].
// Backward output, one column, in this order:
//   gs0 [d_state, head_dim, n_head, n_seqs]  gradient of each sequence's initial state
//   gx  like x,  gdt like dt
//   gA, gB, gC [d_state, n_head, n_tok, n_seqs]: per head and token (sums over heads, tokens and
//       sequences are left to the caller, so no two tasks write one element)
//   scratch: per (sequence, head) task, the state at each chunk start [n_chunks][E], the states
//       and the state gradients of one chunk [Q][E] each, one chunk's per-state dt terms
//       [Q][d_state], and a running state [E] (the GPU's, when a state is too large for registers).
//       E = d_state * head_dim. The GPU's kernels use it; the CPU keeps its checkpoints and
//       chunk states in each worker's own memory and leaves the region untouched.
// The backward pass keeps states only at chunk starts (every Q tokens, Q = ceil(sqrt(n_tok)))
// and recomputes the states inside a chunk from its start: memory grows with sqrt(n_tok), and the
// decay is never inverted. (The GPU's tiled backward, ssm_scan_tiled.comp, fills a task's scratch
// with checkpoints only, as many as it holds, so its chunks are shorter.)
#pragma once

#include <cmath>
#include <cstdint>

#include "ops.hpp"

namespace rk {

struct ScanDims {
    int64_t d_state, head_dim, n_head, n_tok, n_seqs, n_group, n_rs, a_rows;

    // Checked (size_add, size_mul): with pending inputs, the shape rule's sizes may multiply past
    // int64; once the rule has computed backward_size() or the forward's total, every other size
    // here is smaller and the kernels' plain index arithmetic cannot overflow.
    int64_t state_size() const { return size_mul(d_state, head_dim); }
    int64_t tasks() const { return size_mul(n_head, n_seqs); }
    int64_t y_size() const { return size_mul(head_dim, n_head, n_tok, n_seqs); }
    int64_t final_size() const { return size_mul(state_size(), tasks()); }
    int64_t per_token_size() const { return size_mul(d_state, n_head, n_tok, n_seqs); }  // gA, gB, gC
    int64_t chunk() const { return std::max<int64_t>(1, int64_t(std::ceil(std::sqrt(double(n_tok))))); }
    int64_t n_chunks() const { return (n_tok + chunk() - 1) / chunk(); }
    int64_t scratch_per_task() const {
        return size_add(size_mul(n_chunks() + 2 * chunk() + 1, state_size()), size_mul(chunk(), d_state));
    }

    // Offsets of the backward output's regions, in elements.
    int64_t gs0_at() const { return 0; }
    int64_t gx_at() const { return final_size(); }
    int64_t gdt_at() const { return size_add(gx_at(), y_size()); }
    int64_t ga_at() const { return size_add(gdt_at(), size_mul(n_head, n_tok, n_seqs)); }
    int64_t gb_at() const { return size_add(ga_at(), per_token_size()); }
    int64_t gc_at() const { return size_add(gb_at(), per_token_size()); }
    int64_t scratch_at() const { return size_add(gc_at(), per_token_size()); }
    int64_t backward_size() const { return size_add(scratch_at(), size_mul(tasks(), scratch_per_task())); }
};

// Checks the seven inputs (s, x, dt, A, B, C, ids) starting at in[first] and returns their sizes.
ScanDims scan_dims(const char* op, const Inputs& in, size_t first);

}  // namespace rk
