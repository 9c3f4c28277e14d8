// Fused optimizer updates: one call updates a whole parameter set in place, in one pass over
// the concatenation of its parameters' elements (one parallel pass on the CPU, one dispatch on
// the GPU). Hyperparameters are plain data, so a changing learning rate costs nothing.
#pragma once

#include <vector>

#include "ops.hpp"

namespace rk {

struct AdamHyper {
    double lr, beta1, beta2, eps, weight_decay;
    double bias_correction1, bias_correction2;  // 1 - beta^t, computed by the caller
    bool decoupled;                             // AdamW: decay the weights, not the gradient
};

// What an Adam update reads per element, computed once per step on the host: the eager update
// passes it directly, a captured update (the adam_step op) reads it from its hyper tensor.
struct AdamCoefficients {
    double beta1, beta2, eps, coupled_wd, decay, step, inv_bc2;  // double: f64 parameters need it
};
AdamCoefficients adam_coefficients(const AdamHyper& h);

// v = momentum * v + (g + wd * w); w -= lr * v   (plain SGD when momentum is 0)
struct SgdCoefficients {
    double momentum, weight_decay, lr;  // the order of a captured sgd_step's hyper tensor
};

constexpr int kHyperSize = 8;  // floats in a captured update's hyper tensor

// One parameter of an update: the parameter, its gradient and its state (Adam: the moments m
// and v; SGD: the velocity in m, v unused). All have the parameter's shape and dtype.
struct UpdateTensors {
    TensorImpl* w;
    const TensorImpl* g;
    TensorImpl* m;
    TensorImpl* v;
};
using UpdateSet = std::vector<UpdateTensors>;

// The eager updates of a parameter set (Python's optimizers), on the parameters' device.
void adam_update(const std::vector<TensorPtr>& params, const std::vector<TensorPtr>& grads,
                 const std::vector<TensorPtr>& m, const std::vector<TensorPtr>& v, const AdamHyper& h);
void sgd_update(const std::vector<TensorPtr>& params, const std::vector<TensorPtr>& grads,
                const std::vector<TensorPtr>& velocity, double lr, double momentum, double weight_decay);

// The update set of a captured adam_step / sgd_step op's inputs: hyper, scale, then per
// parameter w, g and its state (Adam: m, v; SGD: the velocity).
UpdateSet captured_update_set(const Inputs& in, bool adam);

// The update set of a polyak_step op's (target, source) pairs: w the target, g the source (m and
// v unused, set to the target).
UpdateSet polyak_set(const Inputs& in);

// The CPU kernels (the CPU backend's adam and sgd, and the captured ops'); grad_scale
// multiplies every gradient (a captured step's clipping factor).
void adam_cpu(const UpdateSet& set, const AdamCoefficients& c, float grad_scale = 1.0f);
void sgd_cpu(const UpdateSet& set, const SgdCoefficients& c, float grad_scale = 1.0f);

}  // namespace rk
