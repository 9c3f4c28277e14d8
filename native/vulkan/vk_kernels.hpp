// The fused optimizer updates on the GPU (the ops' vk_<name> kernels are declared in ops.hpp).
#pragma once

#include "optim.hpp"
#include "tensor.hpp"

namespace rk::vk {

void adam(TensorImpl& w, const TensorImpl& g, TensorImpl& m, TensorImpl& v, const AdamCoefficients& c);
void sgd(TensorImpl& w, const TensorImpl& g, TensorImpl& velocity, double lr, double momentum, double weight_decay);

}  // namespace rk::vk
