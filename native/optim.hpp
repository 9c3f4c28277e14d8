// Fused optimizer updates (the ops adam_step and sgd_step): one op updates a whole parameter set
// in place, in one pass over the concatenation of its parameters' elements (one parallel pass on
// the CPU, one dispatch on the GPU), eager or captured alike. Its coefficients are an input
// tensor the caller computes once per step, so a changing learning rate costs nothing.
#pragma once

#include <vector>

#include "ops.hpp"

namespace rk {

// Values in an update's hyper tensor: Adam's beta1, beta2, eps, coupled_wd, decay, step,
// inv_bc2; SGD's momentum, weight_decay, lr (ops.def).
constexpr int kHyperSize = 8;

// One parameter of an update: the parameter, its gradient and its state (Adam: the moments m
// and v; SGD: the velocity in m, v unused). All have the parameter's shape and dtype.
struct UpdateTensors {
    TensorImpl* w;
    const TensorImpl* g;
    TensorImpl* m;
    TensorImpl* v;
};
using UpdateSet = std::vector<UpdateTensors>;

// The update set of an adam_step / sgd_step op's inputs: hyper, scale, then per parameter w, g
// and its state (Adam: m, v; SGD: the velocity).
UpdateSet update_set(const Inputs& in, bool adam);

// Whether an adam_step / sgd_step's scale input is the gradients' sum of squares (attributes
// ints {1}, floats {max_grad_norm}) rather than their factor.
bool scale_is_sum_squares(const OpAttrs& attrs);

// After an eager adam_step / sgd_step (apply): the versions of the tensors it updated go up, as a
// host write's do, so what compares versions (a captured function over the parameters, DQN's
// host copy of its network) sees the step. A replay's update is the captured function's own.
void count_eager_update(Op op, const Inputs& in);

// The update set of a polyak_step op's (target, source) pairs: w the target, g the source (m and
// v unused, set to the target).
UpdateSet polyak_set(const Inputs& in);

}  // namespace rk
