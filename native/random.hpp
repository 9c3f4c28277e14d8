// The global random generator: counter-based, so a value depends only on the seed, the stream
// (one per op execution, in order) and the element index, never on the thread count.
#pragma once

#include <cstdint>

#include "tensor.hpp"

namespace rk {

void manual_seed(uint64_t seed);
// The generator's whole state (seed, streams drawn): saved in checkpoints so that a resumed
// run draws the same numbers as an uninterrupted one.
struct RngState {
    uint64_t seed, counter;
};
RngState rng_state();
void set_rng_state(const RngState& state);
uint64_t next_stream();  // a fresh stream key for one op execution

// Uniform in [0, 1) and standard normal values of element i of a stream.
double uniform_at(uint64_t stream, uint64_t i);
double normal_at(uint64_t stream, uint64_t i);
// The f32 draws: 24 random bits (exact in f32), the values the GPU shaders draw too.
float uniform24_at(uint64_t stream, uint64_t i);
float normal24_at(uint64_t stream, uint64_t i);
// The largest value below 1 of a float storage format: rand's f32 draws are capped there so that
// rounding them to f16 or bf16 never gives 1.
inline float largest_below_one(DType dtype) {
    if (dtype == DType::f16) return 1.0f - 0x1.0p-11f;
    if (dtype == DType::bf16) return 1.0f - 0x1.0p-8f;
    return 1.0f;  // f32: the 24-bit draws are below 1 already
}

}  // namespace rk
