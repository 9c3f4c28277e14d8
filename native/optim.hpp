// Fused optimizer updates: one call updates a whole parameter set in place. Hyperparameters
// are plain data, so a changing learning rate costs nothing.
#pragma once

#include <vector>

#include "tensor.hpp"

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
constexpr int kHyperSize = 8;  // floats in a captured update's hyper tensor

void adam_update(const std::vector<TensorPtr>& params, const std::vector<TensorPtr>& grads,
                 const std::vector<TensorPtr>& m, const std::vector<TensorPtr>& v, const AdamHyper& h);

// v = momentum * v + (g + wd * w); w -= lr * v   (plain SGD when momentum is 0)
void sgd_update(const std::vector<TensorPtr>& params, const std::vector<TensorPtr>& grads,
                const std::vector<TensorPtr>& velocity, double lr, double momentum, double weight_decay);

// The CPU kernels of one parameter (the CPU backend's adam and sgd); grad_scale multiplies the
// gradient (a captured step's clipping factor).
void adam_cpu(TensorImpl& w, const TensorImpl& g, TensorImpl& m, TensorImpl& v, const AdamCoefficients& c,
              float grad_scale = 1.0f);
void sgd_cpu(TensorImpl& w, const TensorImpl& g, TensorImpl& velocity, double lr, double momentum, double weight_decay,
             float grad_scale = 1.0f);

}  // namespace rk
