// What every file of Vulkan kernels uses to record a dispatch: the context, the workgroup size,
// a tensor's memory range, the 32-bit size checks, the push-constant limit, and the tables that
// kernels read by address.
#pragma once

#include <climits>
#include <stdexcept>
#include <string>
#include <vector>

#include "tensor.hpp"
#include "vulkan/vk_context.hpp"

namespace rk::vk {

constexpr uint64_t kGroup = 256;  // local_size_x of every shader

inline Context& ctx() {
    std::string why;
    Context* c = Context::get(&why);
    if (!c) throw std::runtime_error("no GPU: " + why);
    return *c;
}

inline uint64_t groups(uint64_t n) { return (n + kGroup - 1) / kGroup; }

inline Range span(const TensorImpl& t) { return {t.address(), t.address() + (t.nbytes() + 3) / 4 * 4}; }

inline uint32_t u32(int64_t n, const char* what) {
    if (n < 0 || n > int64_t(UINT32_MAX))
        throw std::invalid_argument(std::string(what) + ": a size exceeds the GPU kernels' 32-bit indexing");
    return uint32_t(n);
}

inline void shape4(const Shape& ne, uint32_t out[4], const char* what) {
    for (int d = 0; d < kMaxDims; ++d) out[d] = u32(ne[d], what);
}

// sum_splits.comp's EPILOGUE variant: the partial outputs of a split product, summed in order,
// then a bias (row (e / bias_stride) % rows) and an activation (linear's codes) applied.
struct SumEpiloguePush {
    uint64_t partials, o;
    uint32_t n, splits;
    uint64_t bias;
    uint32_t has_bias, rows, bias_stride, activation;
};

template <typename Push>
void record(const std::string& shader, const Push& push, uint64_t n_groups, std::vector<Range> reads,
            std::vector<Range> writes, uint32_t groups_z = 1) {
    static_assert(sizeof(Push) <= kPushConstantBytes, "push constants are limited to 128 bytes");
    ctx().dispatch(shader, &push, sizeof(Push), n_groups, reads, writes, groups_z);
}

// A u8 tensor holding `records`, written into the command buffer (a recorded program carries
// its own copy): the tables of chunks and steps that kernels read by address.
template <typename Record>
TensorPtr device_table(const std::vector<Record>& records) {
    const uint64_t bytes = records.size() * sizeof(Record);
    TensorPtr table = make_on(Device::gpu, {int64_t(bytes), 1, 1, 1}, 2, DType::u8);
    ctx().write(*table, records.data(), bytes);
    return table;
}

}  // namespace rk::vk
