// The Vulkan column of the op table for images: conv2d and its backward helpers as implicit GEMMs
// (shaders/conv2d_gemm.glsl: no patch matrix in memory; f32 SIMT tiles in conv2d.comp, f16 on
// cooperative matrices in conv2d_coopmat.comp where the device has them), and max pooling
// (shaders/pool2d.comp). The shape rules (native/cpu_conv.cpp) have checked every shape; the sizes
// are checked here to fit the shaders' 32-bit indexing.
#include <algorithm>
#include <cstdint>
#include <utility>

#include "backend.hpp"
#include "conv.hpp"
#include "kernel_util.hpp"
#include "vulkan/vk_kernels.hpp"
#include "vulkan/vk_record.hpp"

namespace rk {

using vk::groups;
using vk::record;
using vk::span;
using vk::u32;

namespace {

// A conv2d kernel: its shader variants' suffix, its tile (rows x columns of the GEMM's output per
// workgroup) and the slice of k it stages at a time.
struct ConvKernel {
    const char* suffix;
    int64_t tile_m, tile_n, slice_k;
};
constexpr ConvKernel kSimt{"", 64, 32, 16};               // conv2d.comp, f32
constexpr ConvKernel kCooperative{"_coopmat", 64, 64, 32};  // conv2d_coopmat.comp, f16

// The kernel for operands of this dtype: f16 ones reach a conv2d kernel only where
// conv2d_on_cooperative_matrices has let them through unwidened. (128 x 8 SIMT tiles for outputs
// of at most 8 channels, a first layer's input gradient, were tried: no faster on the H200, in
// f32 or f16.)
const ConvKernel& conv_kernel(DType dtype) { return dtype == DType::f16 ? kCooperative : kSimt; }

// A GEMM whose output has few tiles (NatureCNN's later layers at batch 32: 50 to 82 workgroups
// on the H200's 132 multiprocessors, each walking a reduction of 512 or more) waits on device
// reads: its reduction is cut into z slices of at least kMinSplitK until about kTargetGroups
// workgroups run, and their partial sums are added in order by sum_splits.comp. A slice holds
// at most kMaxSplitK (its loop stays short).
constexpr int64_t kMinSplitK = 64, kMaxSplitK = int64_t(1) << 18, kTargetGroups = 512;

struct ConvPush {
    uint64_t a, b, o;
    uint32_t in_w, in_h, c_in, n;
    uint32_t k_w, k_h, c_out;
    uint32_t out_w, out_h;
    uint32_t stride_w, stride_h, pad_w, pad_h, dil_w, dil_h;
    uint32_t m, cols, k;
    uint32_t groups_m;
    uint32_t split_k;
    uint32_t tap_step_w, tap_step_h;
    // FORWARD: conv2d's epilogue, applied by the kernel where the reduction is not split: bits 0-1
    // the activation (linear's codes), bit 2 set where there is a bias
    uint32_t epilogue;
    uint64_t bias;
};

constexpr uint32_t kEpilogueBias = 4;  // ConvPush::epilogue's bit for a bias

// Refuses a dispatch whose invocations would loop more often than the device lets one run before
// it ends its loops early (lavapipe: Limits::loop_iterations), which would give wrong numbers.
void check_loop_budget(const char* op, double iterations) {
    const uint64_t budget = vk::ctx().limits().loop_iterations;
    if (budget == 0 || iterations <= double(budget)) return;
    throw std::runtime_error(std::string(op) + ": one invocation of the GPU kernel would loop about " +
                             std::to_string(int64_t(iterations)) + " times; " + vk::ctx().device_name() +
                             " ends a shader's loops after " + std::to_string(budget) +
                             " and would give wrong numbers. Run it on the CPU (rc.device('cpu'))");
}

// The least t >= 1 with t dil a multiple of stride: the step between the taps of one stride phase.
int64_t tap_step(int64_t stride, int64_t dil) {
    int64_t a = stride, b = dil;
    while (b != 0) a = std::exchange(b, a % b);  // a = gcd(stride, dil)
    return stride / a;
}

// The push constants of a conv2d GEMM m x cols x k over geometry g, in the tiles of `kernel`.
ConvPush conv_push(const char* op, const ConvGeometry& g, const ConvKernel& kernel, uint64_t a, uint64_t b, uint64_t o,
                   int64_t m, int64_t cols, int64_t k) {
    // every index the shader forms stays below the larger tensor's element count, itself checked;
    // its pixel coordinates are signed 32-bit ints, from -padding to the padded input's end
    u32(size_mul(g.in_w, g.in_h, g.c_in, g.n), op);
    for (int64_t span : {size_add(g.in_w, size_mul(2, g.p.pad_w), size_mul(g.p.dil_w, g.k_w), g.p.stride_w),
                         size_add(g.in_h, size_mul(2, g.p.pad_h), size_mul(g.p.dil_h, g.k_h), g.p.stride_h)})
        if (span > INT32_MAX) throw std::invalid_argument(std::string(op) + ": a size exceeds the GPU kernels' 32-bit indexing");
    u32(size_mul(g.out_w, g.out_h, g.c_out, g.n), op);
    u32(size_mul(g.patch(), g.c_out), op);
    return ConvPush{a, b, o,
                    u32(g.in_w, op), u32(g.in_h, op), u32(g.c_in, op), u32(g.n, op),
                    u32(g.k_w, op), u32(g.k_h, op), u32(g.c_out, op),
                    u32(g.out_w, op), u32(g.out_h, op),
                    u32(g.p.stride_w, op), u32(g.p.stride_h, op), u32(g.p.pad_w, op), u32(g.p.pad_h, op),
                    u32(g.p.dil_w, op), u32(g.p.dil_h, op),
                    u32(m, op), u32(cols, op), u32(k, op),
                    u32((m + kernel.tile_m - 1) / kernel.tile_m, op), u32(k, op),
                    u32(tap_step(g.p.stride_w, g.p.dil_w), op), u32(tap_step(g.p.stride_h, g.p.dil_h), op),
                    0, 0};
}

uint64_t tiles(const ConvPush& p, const ConvKernel& kernel) {
    return uint64_t(p.groups_m) * ((p.cols + kernel.tile_n - 1) / kernel.tile_n);
}

// The reduction's length per z slice for `groups` workgroups (tiles times the z the GEMM already
// has) over a reduction of `k`: k itself where the tiles alone keep the GPU busy.
int64_t split_length(const ConvKernel& kernel, uint64_t groups, int64_t k) {
    const int64_t wanted = std::max<int64_t>(1, kTargetGroups / int64_t(std::max<uint64_t>(groups, 1)));
    const int64_t splits = std::max(std::min(wanted, std::max<int64_t>(1, k / kMinSplitK)), (k + kMaxSplitK - 1) / kMaxSplitK);
    const int64_t length = (k + splits - 1) / splits;
    return std::max(kernel.slice_k, (length + kernel.slice_k - 1) / kernel.slice_k * kernel.slice_k);  // whole slices of k
}

// Records `shader` with its reduction cut into slices of p.split_k (z = phase + phases * slice):
// straight into `out` where there is one slice, else into partial outputs, then summed in order
// (with `epilogue`, conv2d's forward only: the bias of each output channel, then the activation;
// in the kernel where there is one slice, after the sum where there are more).
void record_split(const char* op, const std::string& gemm, const ConvKernel& kernel, ConvPush p, int64_t k,
                  uint32_t phases, std::vector<vk::Range> reads, const ConvEpilogue& epilogue, TensorImpl& out) {
    const std::string shader = gemm + kernel.suffix;
    const int64_t splits = (k + p.split_k - 1) / p.split_k;
    if (splits <= 1) {
        p.epilogue = uint32_t(epilogue.act) | (epilogue.bias ? kEpilogueBias : 0);
        if (epilogue.bias) {
            p.bias = epilogue.bias->address();
            reads.push_back(span(*epilogue.bias));
        }
        record(shader, p, tiles(p, kernel), reads, {span(out)}, phases);
        return;
    }
    const uint32_t z = u32(size_mul(splits, phases), op);
    if (z > 65535) throw std::invalid_argument(std::string(op) + ": too many slices of the reduction for the GPU kernel");
    TensorPtr partials = vk::split_partials(out, splits, op);
    p.o = partials->address();
    record(shader, p, tiles(p, kernel), reads, {span(*partials)}, z);
    vk::record_sum_splits(*partials, uint32_t(splits),
                          {epilogue.bias, p.cols, u32(size_mul(p.out_w, p.out_h), op), uint32_t(epilogue.act)}, out, op);
}

}  // namespace

namespace vk {

bool conv2d_on_cooperative_matrices(const Inputs& in) {
    const bool f16 = std::all_of(in.begin(), in.end(), [](const TensorPtr& t) { return t->dtype == DType::f16; });
    return f16 && ctx().limits().cooperative_matrix_f16;
}

std::string conv2d_kernel(DType dtype) {
    auto tile = [](const ConvKernel& kernel) {
        return std::to_string(kernel.tile_m) + "x" + std::to_string(kernel.tile_n) + " tiles";
    };
    if (dtype == DType::f16 && ctx().limits().cooperative_matrix_f16)
        return "implicit GEMM on cooperative matrices, " + tile(kCooperative) + " of 16x16x16 f16 fragments, f32 accumulation";
    const std::string widened = is_half(dtype) ? std::string(" (") + dtype_name(dtype) + " operands widened to f32)" : "";
    return "implicit GEMM, f32 SIMT, " + tile(kSimt) + widened;
}

}  // namespace vk

void vk_conv2d(const Inputs& in, const OpAttrs& attrs, TensorImpl& out) {
    const TensorImpl &x = *in[0], &w = *in[1];
    const ConvGeometry g = conv2d_geometry(in, attrs);
    const ConvEpilogue epilogue = conv2d_epilogue(in, attrs, g);
    const ConvKernel& kernel = conv_kernel(x.dtype);
    ConvPush p = conv_push("conv2d", g, kernel, x.address(), w.address(), out.address(), size_mul(g.pixels(), g.n),
                           g.c_out, g.patch());
    p.split_k = u32(split_length(kernel, tiles(p, kernel), p.k), "conv2d");
    check_loop_budget("conv2d", double(p.split_k) / kernel.slice_k);
    record_split("conv2d", "conv2d_forward", kernel, p, p.k, 1, {span(x), span(w)}, epilogue, out);
}

void vk_conv2d_input_back(const Inputs& in, const OpAttrs& attrs, TensorImpl& out) {
    const char* op = "conv2d_input_back";
    const TensorImpl &dy = *in[0], &w = *in[1];
    const ConvGeometry g = back_input_geometry(dy, w, attrs);
    // one z slice per stride phase, each with at most ceil(W / sw) ceil(H / sh) N rows
    const int64_t phases = size_mul(g.p.stride_w, g.p.stride_h);
    if (phases > 65535)
        throw std::invalid_argument(std::string(op) + ": strides " + std::to_string(g.p.stride_w) + " x " +
                                    std::to_string(g.p.stride_h) + " make more than 65535 phases for the GPU kernel");
    const int64_t rows = size_mul((g.in_w + g.p.stride_w - 1) / g.p.stride_w, (g.in_h + g.p.stride_h - 1) / g.p.stride_h, g.n);
    const ConvKernel& kernel = conv_kernel(dy.dtype);
    ConvPush p = conv_push(op, g, kernel, dy.address(), w.address(), out.address(), rows, g.c_in,
                           size_mul(g.k_w, g.k_h, g.c_out));
    // the longest phase's reduction: its taps along each axis, times C_out
    const int64_t phase_k = size_mul((g.k_w + p.tap_step_w - 1) / p.tap_step_w, (g.k_h + p.tap_step_h - 1) / p.tap_step_h, g.c_out);
    p.split_k = u32(split_length(kernel, tiles(p, kernel) * uint64_t(phases), phase_k), op);
    check_loop_budget(op, double(p.split_k) / kernel.slice_k + double(g.k_w + g.k_h));
    record_split(op, "conv2d_back_input", kernel, p, phase_k, uint32_t(phases), {span(dy), span(w)}, {}, out);
}

void vk_conv2d_weight_back(const Inputs& in, const OpAttrs& attrs, TensorImpl& out) {
    const char* op = "conv2d_weight_back";
    const TensorImpl &dy = *in[0], &x = *in[1];
    const ConvGeometry g = back_weight_geometry(dy, x, attrs);
    const int64_t pixels = size_mul(g.pixels(), g.n);  // the reduction
    const ConvKernel& kernel = conv_kernel(dy.dtype);
    ConvPush p = conv_push(op, g, kernel, x.address(), dy.address(), out.address(), g.patch(), g.c_out, pixels);
    p.split_k = u32(split_length(kernel, tiles(p, kernel), pixels), op);
    check_loop_budget(op, double(p.split_k) / kernel.slice_k);
    record_split(op, "conv2d_back_weight", kernel, p, pixels, 1, {span(x), span(dy)}, {}, out);
}

namespace {

struct PoolPush {
    uint64_t a, g, o;
    uint32_t in_w, in_h, out_w, out_h;
    uint32_t k_w, k_h, stride_w, stride_h, pad_w, pad_h;
    uint32_t n;
};

PoolPush pool_push(const char* op, const PoolGeometry& g, uint64_t a, uint64_t grad, uint64_t o, int64_t n) {
    return PoolPush{a, grad, o, u32(g.in_w, op), u32(g.in_h, op), u32(g.out_w, op), u32(g.out_h, op),
                    u32(g.k_w, op), u32(g.k_h, op), u32(g.stride_w, op), u32(g.stride_h, op),
                    u32(g.pad_w, op), u32(g.pad_h, op), u32(n, op)};
}

}  // namespace

void vk_max_pool2d(const Inputs& in, const OpAttrs& attrs, TensorImpl& out) {
    const TensorImpl& x = *in[0];
    const PoolGeometry g = pool_geometry("max_pool2d", x, attrs);
    u32(x.numel(), "max_pool2d");
    const PoolPush p = pool_push("max_pool2d", g, x.address(), 0, out.address(), out.numel());
    check_loop_budget("max_pool2d", double(g.k_w) * double(g.k_h));
    record("pool2d_max", p, groups(p.n), {span(x)}, {span(out)});
}

void vk_max_pool2d_back(const Inputs& in, const OpAttrs& attrs, TensorImpl& out) {
    const TensorImpl &dy = *in[0], &x = *in[1];
    const PoolGeometry g = pool_geometry("max_pool2d_back", x, attrs);
    const PoolPush p = pool_push("max_pool2d_back", g, x.address(), dy.address(), out.address(), out.numel());
    // each element visits the windows holding it, and each of those its elements
    const double windows = double((g.k_w + g.stride_w - 1) / g.stride_w + 1) * double((g.k_h + g.stride_h - 1) / g.stride_h + 1);
    check_loop_budget("max_pool2d_back", windows * (1.0 + double(g.k_w) * double(g.k_h)));
    record("pool2d_max_back", p, groups(p.n), {span(x), span(dy)}, {span(out)});
}

}  // namespace rk
