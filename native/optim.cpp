#include "optim.hpp"

#include <cmath>

#include "backend.hpp"
#include "kernel_util.hpp"

namespace rk {
namespace {

void check_set(const char* op, const std::vector<TensorPtr>& params, std::initializer_list<const std::vector<TensorPtr>*> others) {
    for (const auto* other : others)
        if (other->size() != params.size())
            throw std::invalid_argument(op_err(op, "every list must have one entry per parameter"));
    for (size_t i = 0; i < params.size(); ++i) {
        const TensorImpl& p = *params[i];
        if (p.dtype != DType::f32 && p.dtype != DType::f64)
            throw TypeError(op_err(op, std::string("parameters must be f32 or f64, got ") + dtype_name(p.dtype)));
        for (const auto* other : others) {
            const TensorImpl& t = *(*other)[i];
            if (t.device != p.device)
                throw std::invalid_argument(op_err(op, "parameter " + std::to_string(i) + " is on the " +
                                                           device_name(p.device) + " but its state/gradient is on the " +
                                                           device_name(t.device)));
            if (t.ne != p.ne || t.dtype != p.dtype)
                throw std::invalid_argument(op_err(op, "parameter " + std::to_string(i) + " is " + p.shape_str() + " " +
                                                           dtype_name(p.dtype) + " but its state/gradient is " +
                                                           t.shape_str() + " " + dtype_name(t.dtype)));
        }
    }
}

}  // namespace

namespace {

// One parameter's Adam update; restrict-qualified so that the loop vectorises.
template <typename T>
void adam_kernel(T* __restrict w, const T* __restrict g, T* __restrict m, T* __restrict v, int64_t n,
                 const AdamCoefficients& c, T grad_scale) {
    const T b1 = T(c.beta1), b2 = T(c.beta2), eps = T(c.eps), coupled_wd = T(c.coupled_wd), decay = T(c.decay);
    const T step = T(c.step), inv_bc2 = T(c.inv_bc2);
    // Captured by value: constants held by reference could alias the stores and block vectorising.
    parallel_for(n, kElementGrain, [=](int64_t lo, int64_t hi) {
        for (int64_t i = lo; i < hi; ++i) {
            const T gi = grad_scale * g[i] + coupled_wd * w[i];
            const T mi = b1 * m[i] + (T(1) - b1) * gi;
            const T vi = b2 * v[i] + (T(1) - b2) * gi * gi;
            m[i] = mi;
            v[i] = vi;
            w[i] = decay * w[i] - step * mi / (std::sqrt(vi * inv_bc2) + eps);
        }
    });
}

}  // namespace

AdamCoefficients adam_coefficients(const AdamHyper& h) {
    AdamCoefficients c;
    c.beta1 = h.beta1;
    c.beta2 = h.beta2;
    c.eps = h.eps;
    c.coupled_wd = h.decoupled ? 0.0 : h.weight_decay;
    c.decay = h.decoupled ? 1.0 - h.lr * h.weight_decay : 1.0;
    c.step = h.lr / h.bias_correction1;
    c.inv_bc2 = 1.0 / h.bias_correction2;
    return c;
}

void adam_cpu(TensorImpl& w, const TensorImpl& g, TensorImpl& m, TensorImpl& v, const AdamCoefficients& c,
              float grad_scale) {
    dispatch_float(w.dtype, [&](auto tag) {
        using T = decltype(tag);
        adam_kernel<T>(w.ptr<T>(), g.ptr<T>(), m.ptr<T>(), v.ptr<T>(), w.numel(), c, T(grad_scale));
    });
}

void sgd_cpu(TensorImpl& w, const TensorImpl& g, TensorImpl& velocity, double lr, double momentum, double weight_decay,
             float grad_scale) {
    dispatch_float(w.dtype, [&](auto tag) {
        using T = decltype(tag);
        T *pw = w.ptr<T>(), *vel = velocity.ptr<T>();
        const T* pg = g.ptr<T>();
        const T mu = T(momentum), wd = T(weight_decay), rate = T(lr), scale = T(grad_scale);
        parallel_for(w.numel(), kElementGrain, [=](int64_t lo, int64_t hi) {
            for (int64_t i = lo; i < hi; ++i) {
                const T gi = scale * pg[i] + wd * pw[i];
                vel[i] = mu * vel[i] + gi;
                pw[i] -= rate * vel[i];
            }
        });
    });
}

void adam_update(const std::vector<TensorPtr>& params, const std::vector<TensorPtr>& grads,
                 const std::vector<TensorPtr>& m, const std::vector<TensorPtr>& v, const AdamHyper& h) {
    check_set("adam_update", params, {&grads, &m, &v});
    const AdamCoefficients c = adam_coefficients(h);
    for (size_t k = 0; k < params.size(); ++k) {
        backend(params[k]->device).adam(*params[k], *grads[k], *m[k], *v[k], c);
        ++params[k]->version;
        ++m[k]->version;
        ++v[k]->version;
    }
}

void sgd_update(const std::vector<TensorPtr>& params, const std::vector<TensorPtr>& grads,
                const std::vector<TensorPtr>& velocity, double lr, double momentum, double weight_decay) {
    check_set("sgd_update", params, {&grads, &velocity});
    for (size_t k = 0; k < params.size(); ++k) {
        backend(params[k]->device).sgd(*params[k], *grads[k], *velocity[k], lr, momentum, weight_decay);
        ++params[k]->version;
        ++velocity[k]->version;
    }
}

// ---- the captured updates (ops adam_step and sgd_step) ------------------------------------

namespace {

OutSpec update_spec(const char* op, const Inputs& in, size_t n_state) {
    const TensorImpl& w = *in[0];
    if (w.dtype != DType::f32 && w.dtype != DType::f64)
        throw TypeError(op_err(op, std::string("parameters must be f32 or f64, got ") + dtype_name(w.dtype)));
    for (size_t k = 1; k <= n_state; ++k)
        if (in[k]->ne != w.ne || in[k]->dtype != w.dtype)
            throw std::invalid_argument(op_err(op, "input " + std::to_string(k) + " " + in[k]->shape_str() +
                                                       " must match the parameter " + w.shape_str()));
    const TensorImpl &hyper = *in[n_state + 1], &scale = *in[n_state + 2];
    if (hyper.dtype != DType::f32 || hyper.numel() != kHyperSize)
        throw std::invalid_argument(op_err(op, "hyper must be f32 with 8 values, got " + hyper.shape_str()));
    if (scale.dtype != DType::f32 || scale.numel() != 1)
        throw std::invalid_argument(op_err(op, "scale must be an f32 [1, 1], got " + scale.shape_str()));
    return OutSpec{{1, 1, 1, 1}, 2, DType::f32};
}

}  // namespace

OutSpec shape_adam_step(const Inputs& in, const OpAttrs&) { return update_spec("adam_step", in, 3); }

void cpu_adam_step(const Inputs& in, const OpAttrs&, TensorImpl& out) {
    const float* h = in[4]->ptr<float>();
    const float scale = in[5]->ptr<float>()[0];
    out.ptr<float>()[0] = scale;
    if (!std::isfinite(scale)) return;
    const AdamCoefficients c{h[0], h[1], h[2], h[3], h[4], h[5], h[6]};
    adam_cpu(*in[0], *in[1], *in[2], *in[3], c, scale);
}

OutSpec shape_sgd_step(const Inputs& in, const OpAttrs&) { return update_spec("sgd_step", in, 2); }

void cpu_sgd_step(const Inputs& in, const OpAttrs&, TensorImpl& out) {
    const float* h = in[3]->ptr<float>();
    const float scale = in[4]->ptr<float>()[0];
    out.ptr<float>()[0] = scale;
    if (!std::isfinite(scale)) return;
    sgd_cpu(*in[0], *in[1], *in[2], h[2], h[0], h[1], scale);
}

}  // namespace rk
