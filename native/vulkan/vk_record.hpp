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

template <typename Push>
void record(const std::string& shader, const Push& push, uint64_t n_groups, std::vector<Range> reads,
            std::vector<Range> writes, uint32_t groups_z = 1) {
    static_assert(sizeof(Push) <= kPushConstantBytes, "push constants are limited to 128 bytes");
    ctx().dispatch(shader, &push, sizeof(Push), n_groups, reads, writes, groups_z);
}

// A split product's epilogue, applied after the sum of its slices: bias[(e / bias_stride) % rows]
// added where there is a bias (linear: the row, stride 1; conv2d: the output channel, stride
// W' H'), then the activation (linear's codes, 0 none).
struct SplitEpilogue {
    const TensorImpl* bias;
    uint32_t rows, bias_stride, activation;
};

// The partial outputs of a product split into `splits` slices of its reduction, each shaped like
// `out`, one after the other: [numel, splits] f32 (their indices checked to fit 32 bits).
inline TensorPtr split_partials(const TensorImpl& out, int64_t splits, const char* op) {
    u32(size_mul(out.numel(), splits), op);
    return make_on(Device::gpu, {out.numel(), splits, 1, 1}, 2, DType::f32);
}

// Records sum_splits.comp: out = the sum, in order, of the `splits` partial outputs held one
// after the other in `partials`, then `epilogue` (its EPILOGUE variant, where there is one); the
// HALF variants (_f16) where out, and the bias, are f16.
inline void record_sum_splits(const TensorImpl& partials, uint32_t splits, const SplitEpilogue& epilogue,
                              TensorImpl& out, const char* op) {
    if (out.dtype != DType::f32 && out.dtype != DType::f16)
        throw std::logic_error(std::string(op) + ": split sums are written as f32 or f16, not " + dtype_name(out.dtype));
    if (epilogue.bias && epilogue.bias->dtype != out.dtype)
        throw std::logic_error(std::string(op) + ": a split sum's bias has the output's dtype");
    const std::string half = out.dtype == DType::f16 ? "_f16" : "";
    struct Push {
        uint64_t partials, o;
        uint32_t n, splits;
        uint64_t bias;
        uint32_t has_bias, rows, bias_stride, activation;
    } p{partials.address(), out.address(), u32(out.numel(), op), splits, epilogue.bias ? epilogue.bias->address() : 0,
        epilogue.bias != nullptr, epilogue.rows, epilogue.bias_stride, epilogue.activation};
    std::vector<Range> reads{span(partials)};
    if (epilogue.bias) reads.push_back(span(*epilogue.bias));
    if (epilogue.bias || epilogue.activation) {
        record("sum_splits_epilogue" + half, p, groups(p.n), reads, {span(out)});
    } else {  // the plain variant's push constants are the first four fields
        struct Plain {
            uint64_t partials, o;
            uint32_t n, splits;
        } plain{p.partials, p.o, p.n, p.splits};
        record("sum_splits" + half, plain, groups(p.n), reads, {span(out)});
    }
}

// A u8 tensor holding `records`: the tables of chunks and steps that kernels read by address,
// written once (Context::table).
template <typename Record>
TensorPtr device_table(const std::vector<Record>& records) {
    return ctx().table(records.data(), records.size() * sizeof(Record));
}

}  // namespace rk::vk
