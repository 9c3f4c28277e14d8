// What the files of sequence kernels share (vk_sequence_kernels.cpp, the recurrences;
// vk_chunk_kernels.cpp, the chunked forms): the guard against drivers that cut long loops short,
// and the memory ranges an op's dispatch reads.
#pragma once

#include <stdexcept>
#include <string>
#include <vector>

#include "kernel_util.hpp"
#include "vulkan/vk_record.hpp"

namespace rk::vk {

// The counts of loops in the sequence shaders come from reading them; lavapipe was seen to count
// about 1.2 times as many (rwkv_wkv7 at head size 64 went wrong from about 950 tokens, where 59
// per token were counted), so they are doubled.
constexpr double kLoopMargin = 2.0;

// Refuses a dispatch whose invocations would run more loop iterations than the device lets a
// shader invocation run before it ends its loops early (lavapipe: Limits::loop_iterations), which
// would give wrong numbers without an error. `iterations` bounds one invocation's from above.
inline void check_loop_budget(const char* op, int64_t count, const char* unit, double iterations) {
    const uint64_t budget = ctx().limits().loop_iterations;
    if (budget == 0 || iterations <= double(budget)) return;
    throw std::runtime_error(std::string(op) + ": " + std::to_string(count) + " " + unit + " need about " +
                             std::to_string(int64_t(iterations)) + " loop iterations in one shader invocation; " +
                             ctx().device_name() + " ends a shader's loops after " + std::to_string(budget) +
                             " and would give wrong numbers. Run it on the CPU (rc.device('cpu')), or in shorter "
                             "pieces carrying the state");
}

// The memory ranges of an op's inputs: what its dispatch reads.
inline std::vector<Range> spans(const Inputs& in) {
    std::vector<Range> reads;
    for (const TensorPtr& t : in) reads.push_back(span(*t));
    return reads;
}

}  // namespace rk::vk
