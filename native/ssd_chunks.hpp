// ssm_scan's chunked form (Mamba-2's state-space duality), fused: the sizes its ops share between
// the CPU kernels (cpu_ssd_chunks.cpp, which has the formulas) and the GPU's.
//
// Inputs, shapes in ne order: u [P, H, T, N] (x times the step), log_decay [H, T, N] (the step
// times A), B and C [D, G, T, N] (head h reads group h / (H / G)), first [D, P, H, N] (each
// sequence's initial states); ints: L, the tokens per chunk (1 to kSsdMaxChunk). A state's
// element (d, p) of head h lies at d + D p of its plane of D P.
#pragma once

#include "kernel_util.hpp"

namespace rk {

// The longest chunk the kernels take: the GPU's keep a chunk's [L, L] pairs in shared memory.
constexpr int64_t kSsdMaxChunk = 64;

struct SsdDims {
    int64_t P, H, T, N, D, G, L, c;  // c: chunks per sequence, the last one short where L does not divide T
    int64_t plane() const { return D * P; }
    int64_t y() const { return P * H * T * N; }
    int64_t finals() const { return plane() * H * N; }
    int64_t starts() const { return plane() * H * c * N; }
    int64_t decays() const { return H * T * N; }
    int64_t inputs_bc() const { return D * G * T * N; }
    // the forward's output: [y, final states]
    int64_t total() const { return y() + finals(); }
    // the backward's output: [gu, glog_decay, gB, gC, gfirst]
    int64_t grads() const { return y() + decays() + 2 * inputs_bc() + finals(); }
    // tokens of chunk q (L, or fewer in the last)
    int64_t valid(int64_t q) const { return std::min(L, T - q * L); }
};

// The sizes of (u, log_decay, B, C, first) at in[first_input..], each checked against the others,
// every size of the outputs computed with overflow checks.
SsdDims ssd_dims(const char* op, const Inputs& in, size_t first_input, const OpAttrs& attrs);

}  // namespace rk
