#include "optim.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <sstream>
#include <string>
#include <type_traits>
#include <unordered_set>

#include "backend.hpp"
#include "cpu_features.hpp"
#include "kernel_util.hpp"

namespace rk {
namespace {

// Checks one parameter of a set: a float parameter (f32, or f64 on the CPU) whose gradient and
// state tensors match its shape, dtype and device. `index` names it in the messages.
void check_member(const char* op, size_t index, const TensorImpl& w, std::initializer_list<const TensorImpl*> others) {
    if (w.dtype != DType::f32 && w.dtype != DType::f64)
        throw TypeError(op_err(op, "parameter " + std::to_string(index) + " must be f32 or f64, got " +
                                       dtype_name(w.dtype)));
    if (w.dtype == DType::f64 && w.device == Device::gpu)
        throw TypeError(op_err(op, "parameter " + std::to_string(index) + " is f64: f64 tensors are CPU-only"));
    for (const TensorImpl* t : others) {
        if (t->device != w.device)
            throw std::invalid_argument(op_err(op, "parameter " + std::to_string(index) + " is on the " +
                                                       device_name(w.device) + " but its state/gradient is on the " +
                                                       device_name(t->device)));
        if (t->ne != w.ne || t->dtype != w.dtype)
            throw std::invalid_argument(op_err(op, "parameter " + std::to_string(index) + " is " + w.shape_str() + " " +
                                                       dtype_name(w.dtype) + " but its state/gradient is " +
                                                       t->shape_str() + " " + dtype_name(t->dtype)));
    }
}

// Checks a whole set: every member as above, all on one device, and no parameter twice (one
// updated twice in one pass would race on the GPU).
void check_set(const char* op, const UpdateSet& set) {
    std::unordered_set<const TensorImpl*> seen;
    for (size_t k = 0; k < set.size(); ++k) {
        const UpdateTensors& u = set[k];
        if (u.w->device != set[0].w->device)
            throw std::invalid_argument(op_err(op, "parameter " + std::to_string(k) + " is on the " +
                                                       device_name(u.w->device) + ", parameter 0 on the " +
                                                       device_name(set[0].w->device)));
        check_member(op, k, *u.w, {u.g, u.m, u.v});
        if (!seen.insert(u.w).second)
            throw std::invalid_argument(op_err(op, "parameter " + std::to_string(k) + " is listed twice"));
    }
}

// One more version of every tensor an update writes.
void bump_versions(const UpdateSet& set) {
    for (const UpdateTensors& u : set) {
        u.w->note_write();
        u.m->note_write();
        if (u.v != u.m) u.v->note_write();
    }
}

// Calls piece(k, begin, end) on the elements [begin, end) of parameter k, for every parameter
// of the set, in one parallel pass over the concatenation of their elements (small parameters
// share a chunk; chunk boundaries do not depend on the number of threads).
template <typename Piece>
void for_each_piece(const UpdateSet& set, const Piece& piece) {
    std::vector<int64_t> start(set.size() + 1, 0);
    for (size_t k = 0; k < set.size(); ++k) start[k + 1] = start[k] + set[k].w->numel();
    parallel_for(start.back(), kElementGrain, [&](int64_t lo, int64_t hi) {
        size_t k = size_t(std::upper_bound(start.begin(), start.end(), lo) - start.begin()) - 1;
        for (; lo < hi; ++k) {
            const int64_t end = std::min(hi, start[k + 1]);
            if (end > lo) piece(k, lo - start[k], end - start[k]);
            lo = end;
        }
    });
}

// What an update reads per element: its hyper tensor's values (ops.def), in double so that f64
// parameters keep their precision.
struct AdamCoefficients {
    double beta1, beta2, eps, coupled_wd, decay, step, inv_bc2;
};

// v = momentum * v + (g + wd * w); w -= lr * v   (plain SGD when momentum is 0)
struct SgdCoefficients {
    double momentum, weight_decay, lr;
};

// Adam on n elements; restrict-qualified so that the loop vectorises.
template <typename T>
__attribute__((always_inline)) inline void adam_kernel(T* __restrict w, const T* __restrict g, T* __restrict m,
                                                       T* __restrict v, int64_t n, const AdamCoefficients& c,
                                                       T grad_scale) {
    const T b1 = T(c.beta1), b2 = T(c.beta2), eps = T(c.eps), coupled_wd = T(c.coupled_wd), decay = T(c.decay);
    const T step = T(c.step), inv_bc2 = T(c.inv_bc2);
    for (int64_t i = 0; i < n; ++i) {
        const T gi = grad_scale * g[i] + coupled_wd * w[i];
        const T mi = b1 * m[i] + (T(1) - b1) * gi;
        const T vi = b2 * v[i] + (T(1) - b2) * gi * gi;
        m[i] = mi;
        v[i] = vi;
        w[i] = decay * w[i] - step * mi / (std::sqrt(vi * inv_bc2) + eps);
    }
}

#ifdef RK_X86_TARGETS
// The f32 kernel compiled for AVX2 as well, chosen at run time: its square roots and divisions 8
// lanes wide instead of 4 took half the time (0.63 -> 0.35 ms for half of NatureCNN's 1.7M
// parameters on one core). AVX2 without FMA: no multiply-add is fused, so the bits are those of
// the baseline build.
__attribute__((target("avx2"))) void adam_kernel_avx2(float* __restrict w, const float* __restrict g,
                                                      float* __restrict m, float* __restrict v, int64_t n,
                                                      const AdamCoefficients& c, float grad_scale) {
    adam_kernel<float>(w, g, m, v, n, c, grad_scale);
}
#endif

template <typename T>
void sgd_kernel(T* __restrict w, const T* __restrict g, T* __restrict velocity, int64_t n, const SgdCoefficients& c,
                T grad_scale) {
    const T mu = T(c.momentum), wd = T(c.weight_decay), rate = T(c.lr);
    for (int64_t i = 0; i < n; ++i) {
        const T gi = grad_scale * g[i] + wd * w[i];
        velocity[i] = mu * velocity[i] + gi;
        w[i] -= rate * velocity[i];
    }
}

// The CPU kernels; grad_scale multiplies every gradient (a captured step's clipping factor).
void adam_cpu(const UpdateSet& set, const AdamCoefficients& c, float grad_scale) {
    for_each_piece(set, [&](size_t k, int64_t begin, int64_t end) {
        const UpdateTensors& u = set[k];
        dispatch_float(u.w->dtype, [&](auto tag) {
            using T = decltype(tag);
#ifdef RK_X86_TARGETS
            if constexpr (std::is_same_v<T, float>)
                if (cpu_has_avx2())
                    return adam_kernel_avx2(u.w->ptr<T>() + begin, u.g->ptr<T>() + begin, u.m->ptr<T>() + begin,
                                            u.v->ptr<T>() + begin, end - begin, c, grad_scale);
#endif
            adam_kernel<T>(u.w->ptr<T>() + begin, u.g->ptr<T>() + begin, u.m->ptr<T>() + begin,
                           u.v->ptr<T>() + begin, end - begin, c, T(grad_scale));
        });
    });
}

void sgd_cpu(const UpdateSet& set, const SgdCoefficients& c, float grad_scale) {
    for_each_piece(set, [&](size_t k, int64_t begin, int64_t end) {
        const UpdateTensors& u = set[k];
        dispatch_float(u.w->dtype, [&](auto tag) {
            using T = decltype(tag);
            sgd_kernel<T>(u.w->ptr<T>() + begin, u.g->ptr<T>() + begin, u.m->ptr<T>() + begin, end - begin, c,
                          T(grad_scale));
        });
    });
}

}  // namespace

// ---- the updates (ops adam_step and sgd_step) ----------------------------------------------
//
// Inputs: hyper, scale, then per parameter (w, g, m, v) for Adam or (w, g, velocity) for SGD.
// The scale is the factor every gradient is multiplied by; with the attributes ints {1}, floats
// {max_grad_norm} it is the gradients' sum of squares, from which the update computes the
// clipping factor itself (update_factor): a captured step then needs no ops between the norm
// and the update, one dependency level fewer per optimizer on the GPU.

bool scale_is_sum_squares(const OpAttrs& attrs) { return !attrs.ints.empty() && attrs.ints[0] == 1; }

namespace {

constexpr size_t kLeadingInputs = 2;  // hyper, scale

// The clipping factor of a sum of squares: min(max_grad_norm / (sqrt(s) + 1e-6), 1), or 1 where
// max_grad_norm is 0; NaN where s is not finite, so the update skips itself. rlkit/core/
// capturing.py's _gradient_factor, op for op in f32 where the sum is finite (shaders/optim.comp
// likewise).
float gradient_factor(float sum_squares, float max_grad_norm) {
    if (!std::isfinite(sum_squares)) return std::numeric_limits<float>::quiet_NaN();
    if (max_grad_norm == 0.0f) return 1.0f;
    return std::min(max_grad_norm / (std::sqrt(sum_squares) + 1e-6f), 1.0f);
}

// An update's attributes as an error message names them: "1 ints and 1 floats, ints[0] = 2, floats[0] = 1".
std::string given_attrs(const OpAttrs& attrs) {
    std::ostringstream out;
    out << attrs.ints.size() << " ints and " << attrs.floats.size() << " floats";
    if (!attrs.ints.empty()) out << ", ints[0] = " << attrs.ints[0];
    if (!attrs.floats.empty()) out << ", floats[0] = " << attrs.floats[0];
    return out.str();
}

// The factor the update multiplies the gradients by: the scale input, or the clipping factor of
// the sum of squares it holds.
float update_factor(const TensorImpl& scale, const OpAttrs& attrs) {
    const float value = scale.ptr<float>()[0];
    return scale_is_sum_squares(attrs) ? gradient_factor(value, float(attrs.floats[0])) : value;
}

size_t inputs_per_parameter(bool adam) { return adam ? 4 : 3; }

OutSpec update_spec(const char* op, const Inputs& in, const OpAttrs& attrs, bool adam) {
    const size_t per_param = inputs_per_parameter(adam);
    if (in.size() < kLeadingInputs + per_param || (in.size() - kLeadingInputs) % per_param != 0)
        throw std::invalid_argument(op_err(op, "expected hyper, scale, then " + std::to_string(per_param) +
                                                   " tensors per parameter; got " + std::to_string(in.size()) +
                                                   " inputs"));
    const TensorImpl &hyper = *in[0], &scale = *in[1];
    if ((hyper.dtype != DType::f32 && hyper.dtype != DType::f64) || hyper.numel() != kHyperSize)
        throw std::invalid_argument(op_err(op, "hyper must be f32 with 8 values (or f64, on the CPU), got " +
                                                   hyper.shape_str() + " " + dtype_name(hyper.dtype)));
    if (scale.dtype != DType::f32 || scale.numel() != 1)
        throw std::invalid_argument(op_err(op, "scale must be an f32 [1, 1], got " + scale.shape_str()));
    if (!(attrs.ints.empty() || (attrs.ints.size() == 1 && attrs.ints[0] == 1 && attrs.floats.size() == 1 &&
                                 std::isfinite(attrs.floats[0]) && attrs.floats[0] >= 0.0)))
        throw std::invalid_argument(op_err(op, "attributes must be none, or ints {1} with floats {max_grad_norm}, a "
                                               "finite number >= 0; got " + given_attrs(attrs)));
    check_set(op, update_set(in, adam));
    return OutSpec{{1, 1, 1, 1}, 2, DType::f32};
}

// The hyper tensor's values, f32 (the GPU's, a captured step's) or f64 (an eager step's on the CPU).
std::array<double, kHyperSize> hyper_values(const TensorImpl& hyper) {
    std::array<double, kHyperSize> h;
    for (int k = 0; k < kHyperSize; ++k)
        h[k] = hyper.dtype == DType::f64 ? hyper.ptr<double>()[k] : double(hyper.ptr<float>()[k]);
    return h;
}

}  // namespace

UpdateSet update_set(const Inputs& in, bool adam) {
    const size_t per_param = inputs_per_parameter(adam);
    UpdateSet set;
    set.reserve((in.size() - kLeadingInputs) / per_param);
    for (size_t at = kLeadingInputs; at < in.size(); at += per_param)
        set.push_back({in[at].get(), in[at + 1].get(), in[at + 2].get(), in[at + per_param - 1].get()});
    return set;
}

OutSpec shape_adam_step(const Inputs& in, const OpAttrs& attrs) { return update_spec("adam_step", in, attrs, true); }

void count_eager_update(Op op, const Inputs& in) {
    if (op == Op::adam_step || op == Op::sgd_step) bump_versions(update_set(in, op == Op::adam_step));
}

void cpu_adam_step(const Inputs& in, const OpAttrs& attrs, TensorImpl& out) {
    const std::array<double, kHyperSize> h = hyper_values(*in[0]);
    const float scale = update_factor(*in[1], attrs);
    out.ptr<float>()[0] = in[1]->ptr<float>()[0];  // the scale input (finite where the update ran)
    if (!std::isfinite(scale)) return;
    adam_cpu(update_set(in, true), AdamCoefficients{h[0], h[1], h[2], h[3], h[4], h[5], h[6]}, scale);
}

OutSpec shape_sgd_step(const Inputs& in, const OpAttrs& attrs) { return update_spec("sgd_step", in, attrs, false); }

void cpu_sgd_step(const Inputs& in, const OpAttrs& attrs, TensorImpl& out) {
    const std::array<double, kHyperSize> h = hyper_values(*in[0]);
    const float scale = update_factor(*in[1], attrs);
    out.ptr<float>()[0] = in[1]->ptr<float>()[0];  // the scale input (finite where the update ran)
    if (!std::isfinite(scale)) return;
    sgd_cpu(update_set(in, false), SgdCoefficients{h[0], h[1], h[2]}, scale);
}

// ---- gradient norms and target networks (ops sum_squares and polyak_step) ----------------------

OutSpec shape_sum_squares(const Inputs& in, const OpAttrs&) {
    if (in.empty()) throw std::invalid_argument(op_err("sum_squares", "expected at least one tensor"));
    for (size_t k = 0; k < in.size(); ++k) {
        const TensorImpl& x = *in[k];
        const std::string which = "tensor " + std::to_string(k);
        if (x.dtype != DType::f32 && x.dtype != DType::f64)
            throw TypeError(op_err("sum_squares", which + " must be f32 or f64 (cast f16 to f32 first), got " +
                                                      dtype_name(x.dtype)));
        if (x.dtype != in[0]->dtype)
            throw TypeError(op_err("sum_squares", which + " is " + dtype_name(x.dtype) + ", tensor 0 " +
                                                      dtype_name(in[0]->dtype) + " (expected one dtype)"));
        if (x.device != in[0]->device)
            throw std::invalid_argument(op_err("sum_squares", which + " is on the " + device_name(x.device) +
                                                                  ", tensor 0 on the " + device_name(in[0]->device)));
    }
    return OutSpec{{1, 1, 1, 1}, 2, in[0]->dtype};
}

// In double, over the tensors' elements one after another cut into chunks of kElementGrain (from
// the sizes alone), whose sums are added in chunk order: the same result with any number of threads.
void cpu_sum_squares(const Inputs& in, const OpAttrs&, TensorImpl& out) {
    std::vector<int64_t> start(in.size() + 1, 0);
    for (size_t k = 0; k < in.size(); ++k) start[k + 1] = size_add(start[k], in[k]->numel());
    std::vector<double> chunk_sums(size_t(chunk_count(start.back(), kElementGrain)), 0.0);
    dispatch_float(out.dtype, [&](auto tag) {
        using T = decltype(tag);
        parallel_for(start.back(), kElementGrain, [&](int64_t lo, int64_t hi) {
            double& sum = chunk_sums[size_t(lo / kElementGrain)];
            size_t k = size_t(std::upper_bound(start.begin(), start.end(), lo) - start.begin()) - 1;
            for (; lo < hi; ++k) {
                const int64_t end = std::min(hi, start[k + 1]);
                if (end > lo) sum += lane_sum(in[k]->ptr<T>() + (lo - start[k]), end - lo, [](double v) { return v * v; });
                lo = end;
            }
        });
        double total = 0.0;
        for (double s : chunk_sums) total += s;
        out.ptr<T>()[0] = T(total);
    });
}

UpdateSet polyak_set(const Inputs& in) {
    UpdateSet set;
    for (size_t at = 0; at + 1 < in.size(); at += 2)
        set.push_back({in[at].get(), in[at + 1].get(), in[at].get(), in[at].get()});
    return set;
}

OutSpec shape_polyak_step(const Inputs& in, const OpAttrs& attrs) {
    if (in.empty() || in.size() % 2 != 0)
        throw std::invalid_argument(op_err("polyak_step", "expected (target, source) pairs; got " +
                                                              std::to_string(in.size()) + " inputs"));
    if (attrs.floats.size() != 1 || !(attrs.floats[0] >= 0.0 && attrs.floats[0] <= 1.0))
        throw std::invalid_argument(op_err("polyak_step", "tau must be one number in [0, 1]"));
    const UpdateSet set = polyak_set(in);
    check_set("polyak_step", set);
    std::unordered_set<const TensorImpl*> sources;
    for (const UpdateTensors& u : set) sources.insert(u.g);
    for (size_t k = 0; k < set.size(); ++k)
        if (sources.count(set[k].w))
            throw std::invalid_argument(op_err("polyak_step", "target " + std::to_string(k) +
                                                                  " is also a source (expected separate networks)"));
    return OutSpec{{1, 1, 1, 1}, 2, DType::f32};
}

void cpu_polyak_step(const Inputs& in, const OpAttrs& attrs, TensorImpl& out) {
    const double tau = attrs.floats[0];
    out.ptr<float>()[0] = 0.0f;
    const UpdateSet set = polyak_set(in);
    for_each_piece(set, [&](size_t k, int64_t begin, int64_t end) {
        dispatch_float(set[k].w->dtype, [&](auto tag) {
            using T = decltype(tag);
            T* __restrict target = set[k].w->ptr<T>() + begin;
            const T* __restrict source = set[k].g->ptr<T>() + begin;
            const T a = T(tau), b = T(1.0 - tau);
            if (tau == 1.0) {  // a copy, even where the target holds Inf or NaN
                std::copy(source, source + (end - begin), target);
                return;
            }
            for (int64_t i = 0; i < end - begin; ++i) target[i] = a * source[i] + b * target[i];
        });
    });
}

// ---- master weights (op cast_into) ------------------------------------------------------------
//
// A captured step with master weights rounds each updated f32 master into its f16 / bf16
// parameter, in place: the parameter's storage is what the captured program reads.

OutSpec shape_cast_into(const Inputs& in, const OpAttrs&) {
    const char* op = "cast_into";
    if (in.empty() || in.size() % 2 != 0)
        throw std::invalid_argument(op_err(op, "expected (target, source) pairs; got " + std::to_string(in.size()) +
                                                   " inputs"));
    std::unordered_set<const TensorImpl*> targets;
    for (size_t at = 0; at < in.size(); at += 2) {
        const TensorImpl &target = *in[at], &source = *in[at + 1];
        const std::string which = "pair " + std::to_string(at / 2);
        if (!is_float(target.dtype) || !is_float(source.dtype))
            throw TypeError(op_err(op, which + ": expected float tensors, got " + dtype_name(target.dtype) + " and " +
                                           dtype_name(source.dtype)));
        if (target.ne != source.ne)
            throw std::invalid_argument(op_err(op, which + ": the target is " + target.shape_str() + ", the source " +
                                                       source.shape_str()));
        if (target.device != source.device || target.device != in[0]->device)
            throw std::invalid_argument(op_err(op, which + " is not on the device of pair 0"));
        if (&target == &source || !targets.insert(&target).second)
            throw std::invalid_argument(op_err(op, which + ": its target is its source or the target of another pair"));
    }
    return OutSpec{{1, 1, 1, 1}, 2, DType::f32};
}

void cpu_cast_into(const Inputs& in, const OpAttrs& attrs, TensorImpl& out) {
    out.ptr<float>()[0] = 0.0f;
    for (size_t at = 0; at < in.size(); at += 2) cpu_cast({in[at + 1]}, attrs, *in[at]);
}

}  // namespace rk
