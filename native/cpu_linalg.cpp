// matmul: C = op(A) @ op(B) per batch slice (dims 2 and 3 broadcast), through gemm(); linear:
// act(W x + b) in one op (the product, then the bias and the activation on it in place).
#include <algorithm>
#include <climits>
#include <cmath>

#include "blas.hpp"
#include "kernel_util.hpp"

namespace rk {

namespace {

// The product's shape, for matmul and linear (errors name `op`).
OutSpec product_spec(const char* op, const TensorImpl& a, const TensorImpl& b, bool ta, bool tb) {
    const int64_t m = ta ? a.ne[1] : a.ne[0], ka = ta ? a.ne[0] : a.ne[1];
    const int64_t kb = tb ? b.ne[1] : b.ne[0], n = tb ? b.ne[0] : b.ne[1];
    if (ka != kb)
        throw std::invalid_argument(op_err(op, "inner dimensions differ: a" + std::string(ta ? "^T" : "") + " is " +
                                    a.shape_str() + " (k=" + std::to_string(ka) + "), b" + (tb ? "^T" : "") + " is " +
                                    b.shape_str() + " (k=" + std::to_string(kb) + "); expected a [m, k] @ b [k, n]"));
    if (std::max({m, n, ka}) > INT_MAX)
        throw std::invalid_argument(op_err(op, "a dimension of " + a.shape_str() + " and " + b.shape_str() +
                                                   " exceeds 2^31 - 1"));
    OutSpec spec;
    spec.dtype = a.dtype;
    spec.ndim = std::max(a.ndim, b.ndim);
    spec.ne = {m, n, 1, 1};
    for (int d = 2; d < kMaxDims; ++d) {
        if (a.ne[d] != b.ne[d] && a.ne[d] != 1 && b.ne[d] != 1)
            throw std::invalid_argument(op_err(op, "batch dimensions of " + a.shape_str() + " and " + b.shape_str() +
                                        " do not broadcast (each must match or be 1)"));
        spec.ne[d] = std::max(a.ne[d], b.ne[d]);
    }
    return spec;
}

}  // namespace

OutSpec shape_matmul(const Inputs& in, const OpAttrs& attrs) {
    const TensorImpl &a = *in[0], &b = *in[1];
    require_same_float("matmul", a, b);
    if (attrs.ints.size() != 2) throw std::invalid_argument("matmul: expected attributes transpose_a, transpose_b");
    return product_spec("matmul", a, b, attrs.ints[0] != 0, attrs.ints[1] != 0);
}

namespace {

// The products of every batch slice, each slice's C given to the epilogue that
// slice_epilogue(slice's first element) returns (an empty one: none).
template <typename T, typename SliceEpilogue>
void products(const Inputs& in, const OpAttrs& attrs, TensorImpl& out, const SliceEpilogue& slice_epilogue) {
    const TensorImpl &a = *in[0], &b = *in[1];
    const bool ta = attrs.ints[0] != 0, tb = attrs.ints[1] != 0;
    const int64_t m = out.ne[0], n = out.ne[1], k = ta ? a.ne[0] : a.ne[1];
    const int64_t a_slice = a.ne[0] * a.ne[1], b_slice = b.ne[0] * b.ne[1], c_slice = m * n;
    for (int64_t i3 = 0; i3 < out.ne[3]; ++i3) {
        for (int64_t i2 = 0; i2 < out.ne[2]; ++i2) {
            const int64_t sa = (a.ne[2] == 1 ? 0 : i2) + (a.ne[3] == 1 ? 0 : i3) * a.ne[2];
            const int64_t sb = (b.ne[2] == 1 ? 0 : i2) + (b.ne[3] == 1 ? 0 : i3) * b.ne[2];
            const int64_t sc = i2 + i3 * out.ne[2];
            gemm(ta, tb, m, n, k, a.ptr<T>() + sa * a_slice, a.ne[0], b.ptr<T>() + sb * b_slice, b.ne[0],
                 out.ptr<T>() + sc * c_slice, slice_epilogue(sc * c_slice));
        }
    }
}

}  // namespace

void cpu_matmul(const Inputs& in, const OpAttrs& attrs, TensorImpl& out) {
    dispatch_float(out.dtype, [&](auto tag) {
        products<decltype(tag)>(in, attrs, out, [](int64_t) { return BlockEpilogue{}; });
    });
}

OutSpec shape_matmul_relu_mask(const Inputs& in, const OpAttrs& attrs) {
    const TensorImpl &a = *in[0], &b = *in[1], &y = *in[2];
    require_same_float("matmul_relu_mask", a, b);
    if (a.dtype != DType::f32 || y.dtype != DType::f32)
        throw TypeError("matmul_relu_mask: a, b and y must be f32, got " + std::string(dtype_name(a.dtype)) + " and " +
                        dtype_name(y.dtype));
    if (attrs.ints.size() != 2)
        throw std::invalid_argument("matmul_relu_mask: expected attributes transpose_a, transpose_b");
    const OutSpec spec = product_spec("matmul_relu_mask", a, b, attrs.ints[0] != 0, attrs.ints[1] != 0);
    if (y.ne != spec.ne)
        throw std::invalid_argument("matmul_relu_mask: y is " + y.shape_str() + "; expected the product's shape");
    return spec;
}

// The product with relu_back's value applied to each block of it as it is computed: where y > 0
// the product, else 0 (y NaN: 0).
void cpu_matmul_relu_mask(const Inputs& in, const OpAttrs& attrs, TensorImpl& out) {
    const float* y = in[2]->ptr<float>();
    float* o = out.ptr<float>();
    const int64_t m = out.ne[0];
    products<float>(in, attrs, out, [&](int64_t slice) -> BlockEpilogue {
        return [=](int64_t r0, int64_t rows, int64_t c0, int64_t cols) {
            for (int64_t j = c0; j < c0 + cols; ++j) {
                const float* yc = y + slice + j * m;
                float* oc = o + slice + j * m;
                for (int64_t i = r0; i < r0 + rows; ++i) oc[i] = yc[i] > 0.0f ? oc[i] : 0.0f;
            }
        };
    });
}

Activation linear_activation(const OpAttrs& attrs) {
    if (attrs.ints.size() != 1 || attrs.ints[0] < 0 || attrs.ints[0] > 3)
        throw std::invalid_argument("linear: expected one attribute, the activation (0 none, 1 relu, 2 tanh, 3 sigmoid)");
    return Activation(attrs.ints[0]);
}

OutSpec shape_linear(const Inputs& in, const OpAttrs& attrs) {
    const TensorImpl &w = *in[0], &x = *in[1], &b = *in[2];
    linear_activation(attrs);
    require_same_float("linear", w, x);
    require_same_float("linear", w, b);
    require_2d("linear", w, "W");
    if (x.ne[0] != w.ne[1])
        throw std::invalid_argument("linear: W " + w.shape_str() + " is [out, in] with in = " + std::to_string(w.ne[1]) +
                                    " but x " + x.shape_str() + " has " + std::to_string(x.ne[0]) + " rows");
    if (b.ne[0] != w.ne[0] || b.numel() != w.ne[0])
        throw std::invalid_argument("linear: b must be [out, 1] = [" + std::to_string(w.ne[0]) + ", 1] for W " +
                                    w.shape_str() + ", got " + b.shape_str());
    return product_spec("linear", w, x, false, false);
}

namespace {

// Rows [r0, r0 + rows) of columns [c0, c0 + cols) of the product out [m, columns]: act(out + bias),
// in place. One loop per activation, so that each compiles to vector code: with the activation
// chosen per element, a 256 x 256 layer's bias and ReLU took 130 us, four times its 23-deep
// product (SAC's first layers).
template <typename T, typename Act>
void add_bias_then(T* out, const T* bias, int64_t m, int64_t r0, int64_t rows, int64_t c0, int64_t cols, Act act) {
    for (int64_t j = c0; j < c0 + cols; ++j) {
        T* column = out + j * m;
        for (int64_t i = r0; i < r0 + rows; ++i) column[i] = act(T(column[i] + bias[i]));
    }
}

}  // namespace

// The product, each block of it given its bias and activation by the thread that computed it,
// while it is in that core's cache (a separate pass over TD3's 400 x 256 layer took about a third
// of its 23-deep product's time).
void cpu_linear(const Inputs& in, const OpAttrs& attrs, TensorImpl& out) {
    const Activation act = linear_activation(attrs);
    const int64_t m = out.ne[0];
    dispatch_float(out.dtype, [&](auto tag) {
        using T = decltype(tag);
        const T* bias = in[2]->ptr<T>();
        T* o = out.ptr<T>();
        products<T>({in[0], in[1]}, OpAttrs{{0, 0}, {}}, out, [&](int64_t slice) -> BlockEpilogue {
            T* c = o + slice;
            return [=](int64_t r0, int64_t rows, int64_t c0, int64_t cols) {
                switch (act) {
                    case Activation::none: return add_bias_then(c, bias, m, r0, rows, c0, cols, [](T z) { return z; });
                    case Activation::relu:
                        return add_bias_then(c, bias, m, r0, rows, c0, cols, [](T z) { return relu_of(z); });
                    case Activation::tanh:
                        return add_bias_then(c, bias, m, r0, rows, c0, cols, [](T z) { return tanh_of(z); });
                    case Activation::sigmoid:
                        return add_bias_then(c, bias, m, r0, rows, c0, cols, [](T z) { return sigmoid_of(z); });
                }
            };
        });
    });
}

}  // namespace rk
