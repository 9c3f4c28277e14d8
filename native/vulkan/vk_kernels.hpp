// The fused optimizer updates on the GPU (the ops' vk_<name> kernels are declared in ops.hpp).
#pragma once

#include "optim.hpp"
#include "tensor.hpp"

namespace rk::vk {

// One dispatch each, over every parameter of the set.
void adam(const UpdateSet& set, const AdamCoefficients& c);
void sgd(const UpdateSet& set, const SgdCoefficients& c);

}  // namespace rk::vk
