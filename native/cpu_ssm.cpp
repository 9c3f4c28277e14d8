// State-space layer ops: the causal depthwise convolution of Mamba (ggml_ssm_conv) and its two
// backward helpers. Shapes in ne order (dim 0 fastest), as ggml gives them:
//   sx [d_conv - 1 + n_t, d_inner, n_s]  (the conv state, then the sequence, along dim 0)
//   c  [d_conv, d_inner]                 (one filter per channel)
//   out[i, t, s] = sum_k sx[t + k, i, s] * c[k, i]
#include <algorithm>

#include "kernel_util.hpp"

namespace rk {
namespace {

// The sizes of one ssm_conv: d_conv taps, d_inner channels, n_t steps, n_s sequences.
struct ConvDims {
    int64_t d_conv, d_inner, n_t, n_s;
    int64_t window() const { return d_conv - 1 + n_t; }  // sx's dim 0
};

void require_3d(const char* op, const TensorImpl& t, const char* arg) {
    if (t.ne[3] != 1)
        throw std::invalid_argument(op_err(op, std::string(arg) + " must have at most 3 dimensions, got " + t.shape_str()));
}

ConvDims forward_dims(const TensorImpl& sx, const TensorImpl& c) {
    require_same_float("ssm_conv", sx, c);
    require_3d("ssm_conv", sx, "sx");
    require_2d("ssm_conv", c, "c");
    if (c.ne[1] != sx.ne[1])
        throw std::invalid_argument(op_err("ssm_conv", "c [d_conv, d_inner] has d_inner " + std::to_string(c.ne[1]) +
                                                           " but sx [d_conv - 1 + n_t, d_inner, n_s] has " +
                                                           std::to_string(sx.ne[1])));
    if (sx.ne[0] < c.ne[0])
        throw std::invalid_argument(op_err("ssm_conv", "sx has " + std::to_string(sx.ne[0]) + " steps along dim 0, fewer "
                                                           "than d_conv = " + std::to_string(c.ne[0]) +
                                                           " (expected d_conv - 1 conv-state steps and at least one more)"));
    return {c.ne[0], c.ne[1], sx.ne[0] - c.ne[0] + 1, sx.ne[2]};
}

// The dims of a backward helper from the upstream gradient g [d_inner, n_t, n_s] and d_conv.
ConvDims backward_dims(const char* op, const TensorImpl& g, const TensorImpl& other, int64_t d_conv) {
    require_same_float(op, g, other);
    require_3d(op, g, "g");
    return {d_conv, g.ne[0], g.ne[1], g.ne[2]};
}

}  // namespace

OutSpec shape_ssm_conv(const Inputs& in, const OpAttrs&) {
    const ConvDims d = forward_dims(*in[0], *in[1]);
    return OutSpec{{d.d_inner, d.n_t, d.n_s, 1}, 3, in[0]->dtype};
}

void cpu_ssm_conv(const Inputs& in, const OpAttrs&, TensorImpl& out) {
    const TensorImpl &sx = *in[0], &c = *in[1];
    const ConvDims d = forward_dims(sx, c);
    dispatch_float(out.dtype, [&](auto tag) {
        using T = decltype(tag);
        const T *ps = sx.ptr<T>(), *pc = c.ptr<T>();
        T* po = out.ptr<T>();
        // one task per (sequence, channel): its window of sx is contiguous
        parallel_for(d.n_s * d.d_inner, std::max<int64_t>(1, kElementGrain / (d.window() * d.d_conv)),
                     [&](int64_t lo, int64_t hi) {
            for (int64_t task = lo; task < hi; ++task) {
                const int64_t s = task / d.d_inner, i = task % d.d_inner;
                const T* window = ps + (s * d.d_inner + i) * d.window();
                const T* filter = pc + i * d.d_conv;
                for (int64_t t = 0; t < d.n_t; ++t) {
                    T acc = 0;
                    for (int64_t k = 0; k < d.d_conv; ++k) acc += window[t + k] * filter[k];
                    po[(s * d.n_t + t) * d.d_inner + i] = acc;
                }
            }
        });
    });
}

OutSpec shape_ssm_conv_sx_back(const Inputs& in, const OpAttrs&) {
    const TensorImpl &g = *in[0], &c = *in[1];
    const ConvDims d = backward_dims("ssm_conv_sx_back", g, c, c.ne[0]);
    if (c.ne[1] != d.d_inner)
        throw std::invalid_argument(op_err("ssm_conv_sx_back", "c and g disagree on d_inner"));
    return OutSpec{{d.window(), d.d_inner, d.n_s, 1}, 3, g.dtype};
}

void cpu_ssm_conv_sx_back(const Inputs& in, const OpAttrs&, TensorImpl& out) {
    const TensorImpl &g = *in[0], &c = *in[1];
    const ConvDims d = backward_dims("ssm_conv_sx_back", g, c, c.ne[0]);
    dispatch_float(out.dtype, [&](auto tag) {
        using T = decltype(tag);
        const T *pg = g.ptr<T>(), *pc = c.ptr<T>();
        T* po = out.ptr<T>();
        parallel_for(d.n_s * d.d_inner, std::max<int64_t>(1, kElementGrain / (d.window() * d.d_conv)),
                     [&](int64_t lo, int64_t hi) {
            for (int64_t task = lo; task < hi; ++task) {
                const int64_t s = task / d.d_inner, i = task % d.d_inner;
                T* window = po + (s * d.d_inner + i) * d.window();
                const T* filter = pc + i * d.d_conv;
                // sx[p] reaches out[t] through tap k = p - t, for the t in range
                for (int64_t p = 0; p < d.window(); ++p) {
                    T acc = 0;
                    for (int64_t k = std::max<int64_t>(0, p - d.n_t + 1); k <= std::min(d.d_conv - 1, p); ++k)
                        acc += pg[(s * d.n_t + (p - k)) * d.d_inner + i] * filter[k];
                    window[p] = acc;
                }
            }
        });
    });
}

OutSpec shape_ssm_conv_c_back(const Inputs& in, const OpAttrs&) {
    const TensorImpl &g = *in[0], &sx = *in[1];
    const ConvDims d = backward_dims("ssm_conv_c_back", g, sx, sx.ne[0] - g.ne[1] + 1);
    if (sx.ne[1] != d.d_inner || sx.ne[2] != d.n_s || d.d_conv < 1)
        throw std::invalid_argument(op_err("ssm_conv_c_back", "sx " + sx.shape_str() + " does not fit g " + g.shape_str()));
    return OutSpec{{d.d_conv, d.d_inner, 1, 1}, 2, g.dtype};
}

void cpu_ssm_conv_c_back(const Inputs& in, const OpAttrs&, TensorImpl& out) {
    const TensorImpl &g = *in[0], &sx = *in[1];
    const ConvDims d = backward_dims("ssm_conv_c_back", g, sx, sx.ne[0] - g.ne[1] + 1);
    dispatch_float(out.dtype, [&](auto tag) {
        using T = decltype(tag);
        const T *pg = g.ptr<T>(), *ps = sx.ptr<T>();
        T* po = out.ptr<T>();
        // one task per channel: it sums over every sequence and step, so no two tasks share an output
        parallel_for(d.d_inner, std::max<int64_t>(1, kElementGrain / (d.n_s * d.window() * d.d_conv)),
                     [&](int64_t lo, int64_t hi) {
            for (int64_t i = lo; i < hi; ++i) {
                for (int64_t k = 0; k < d.d_conv; ++k) {
                    double acc = 0;
                    for (int64_t s = 0; s < d.n_s; ++s) {
                        const T* window = ps + (s * d.d_inner + i) * d.window();
                        for (int64_t t = 0; t < d.n_t; ++t) acc += double(pg[(s * d.n_t + t) * d.d_inner + i]) * window[t + k];
                    }
                    po[i * d.d_conv + k] = T(acc);
                }
            }
        });
    });
}

}  // namespace rk
