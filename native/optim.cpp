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
                 const AdamHyper& h) {
    const T b1 = T(h.beta1), b2 = T(h.beta2), eps = T(h.eps);
    const T coupled_wd = h.decoupled ? T(0) : T(h.weight_decay);
    const T decay = h.decoupled ? T(1.0 - h.lr * h.weight_decay) : T(1);
    const T step = T(h.lr / h.bias_correction1), inv_bc2 = T(1.0 / h.bias_correction2);
    // Captured by value: constants held by reference could alias the stores and block vectorising.
    parallel_for(n, kElementGrain, [=](int64_t lo, int64_t hi) {
        for (int64_t i = lo; i < hi; ++i) {
            const T gi = g[i] + coupled_wd * w[i];
            const T mi = b1 * m[i] + (T(1) - b1) * gi;
            const T vi = b2 * v[i] + (T(1) - b2) * gi * gi;
            m[i] = mi;
            v[i] = vi;
            w[i] = decay * w[i] - step * mi / (std::sqrt(vi * inv_bc2) + eps);
        }
    });
}

}  // namespace

void adam_cpu(TensorImpl& w, const TensorImpl& g, TensorImpl& m, TensorImpl& v, const AdamHyper& h) {
    dispatch_float(w.dtype, [&](auto tag) {
        using T = decltype(tag);
        adam_kernel<T>(w.ptr<T>(), g.ptr<T>(), m.ptr<T>(), v.ptr<T>(), w.numel(), h);
    });
}

void sgd_cpu(TensorImpl& w, const TensorImpl& g, TensorImpl& velocity, double lr, double momentum, double weight_decay) {
    dispatch_float(w.dtype, [&](auto tag) {
        using T = decltype(tag);
        T *pw = w.ptr<T>(), *vel = velocity.ptr<T>();
        const T* pg = g.ptr<T>();
        const T mu = T(momentum), wd = T(weight_decay), rate = T(lr);
        parallel_for(w.numel(), kElementGrain, [=](int64_t lo, int64_t hi) {
            for (int64_t i = lo; i < hi; ++i) {
                const T gi = pg[i] + wd * pw[i];
                vel[i] = mu * vel[i] + gi;
                pw[i] -= rate * vel[i];
            }
        });
    });
}

void adam_update(const std::vector<TensorPtr>& params, const std::vector<TensorPtr>& grads,
                 const std::vector<TensorPtr>& m, const std::vector<TensorPtr>& v, const AdamHyper& h) {
    check_set("adam_update", params, {&grads, &m, &v});
    for (size_t k = 0; k < params.size(); ++k) {
        backend(params[k]->device).adam(*params[k], *grads[k], *m[k], *v[k], h);
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

}  // namespace rk
