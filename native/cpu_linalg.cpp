// matmul: C = op(A) @ op(B) per batch slice (dims 2 and 3 broadcast), through gemm().
#include <algorithm>
#include <climits>

#include "blas.hpp"
#include "kernel_util.hpp"

namespace rk {

OutSpec shape_matmul(const Inputs& in, const OpAttrs& attrs) {
    const TensorImpl &a = *in[0], &b = *in[1];
    require_same_float("matmul", a, b);
    if (attrs.ints.size() != 2) throw std::invalid_argument("matmul: expected attributes transpose_a, transpose_b");
    const bool ta = attrs.ints[0] != 0, tb = attrs.ints[1] != 0;
    const int64_t m = ta ? a.ne[1] : a.ne[0], ka = ta ? a.ne[0] : a.ne[1];
    const int64_t kb = tb ? b.ne[1] : b.ne[0], n = tb ? b.ne[0] : b.ne[1];
    if (ka != kb)
        throw std::invalid_argument("matmul: inner dimensions differ: a" + std::string(ta ? "^T" : "") + " is " +
                                    a.shape_str() + " (k=" + std::to_string(ka) + "), b" + (tb ? "^T" : "") + " is " +
                                    b.shape_str() + " (k=" + std::to_string(kb) + "); expected a [m, k] @ b [k, n]");
    if (std::max({m, n, ka}) > INT_MAX) throw std::invalid_argument("matmul: a dimension exceeds 2^31 - 1");
    OutSpec spec;
    spec.dtype = a.dtype;
    spec.ndim = std::max(a.ndim, b.ndim);
    spec.ne = {m, n, 1, 1};
    for (int d = 2; d < kMaxDims; ++d) {
        if (a.ne[d] != b.ne[d] && a.ne[d] != 1 && b.ne[d] != 1)
            throw std::invalid_argument("matmul: batch dimensions of " + a.shape_str() + " and " + b.shape_str() +
                                        " do not broadcast (each must match or be 1)");
        spec.ne[d] = std::max(a.ne[d], b.ne[d]);
    }
    return spec;
}

void cpu_matmul(const Inputs& in, const OpAttrs& attrs, TensorImpl& out) {
    const TensorImpl &a = *in[0], &b = *in[1];
    const bool ta = attrs.ints[0] != 0, tb = attrs.ints[1] != 0;
    const int64_t m = out.ne[0], n = out.ne[1], k = ta ? a.ne[0] : a.ne[1];
    const int64_t a_slice = a.ne[0] * a.ne[1], b_slice = b.ne[0] * b.ne[1], c_slice = m * n;
    dispatch_float(out.dtype, [&](auto tag) {
        using T = decltype(tag);
        for (int64_t i3 = 0; i3 < out.ne[3]; ++i3) {
            for (int64_t i2 = 0; i2 < out.ne[2]; ++i2) {
                const int64_t sa = (a.ne[2] == 1 ? 0 : i2) + (a.ne[3] == 1 ? 0 : i3) * a.ne[2];
                const int64_t sb = (b.ne[2] == 1 ? 0 : i2) + (b.ne[3] == 1 ? 0 : i3) * b.ne[2];
                const int64_t sc = i2 + i3 * out.ne[2];
                gemm(ta, tb, m, n, k, a.ptr<T>() + sa * a_slice, a.ne[0], b.ptr<T>() + sb * b_slice, b.ne[0],
                     out.ptr<T>() + sc * c_slice);
            }
        }
    });
}

}  // namespace rk
