// What the GPU kernels tell besides the ops' vk_<name> (declared in ops.hpp): which matmul kernel
// runs where (vk_matmul_kernels.cpp) and which scan kernel (vk_sequence_kernels.cpp).
#pragma once

#include <string>

#include "ops.hpp"
#include "ssm_scan.hpp"
#include "tensor.hpp"

namespace rk::vk {

// Whether op runs on these f16 or bf16 inputs as they are (matmul and linear, conv2d and its
// backward helpers, on cooperative matrices) rather than on f32 copies.
bool takes_half(Op op, const Inputs& inputs);
// Whether conv2d (or a backward helper of it) multiplies these inputs on cooperative matrices: all
// f16, on a device that has them (vk_conv_kernels.cpp).
bool conv2d_on_cooperative_matrices(const Inputs& inputs);
// The kernel conv2d uses for operands of this dtype, in words.
std::string conv2d_kernel(DType dtype);
// The kernel matmul uses here for operands of this dtype and an [m, n] output with `batch`
// slices, in words.
std::string matmul_kernel(DType dtype, int64_t m, int64_t n, int64_t k, int64_t batch);
// The shader ssm_scan (or, with backward, ssm_scan_back) runs for these sizes.
std::string scan_kernel(const ScanDims& d, bool backward);

}  // namespace rk::vk
