// 2-D convolution and max pooling of images, as ggml's conv_2d lays them out (ne order, dim 0
// fastest): images x [W, H, C, N], kernels w [KW, KH, C_in, C_out], results [W', H', C, N], so that
// PyTorch's C-order (N, C, H, W) batches and (C_out, C_in, KH, KW) weights are the same bytes.
//
// The CPU convolution is a GEMM over rows of output pixels: a block of rows r = (ow, oh, n) of the
// patch matrix [rows, K] (K = KW * KH * C_in, one column per kernel tap and input channel) is
// gathered from x, multiplied by w seen as [K, C_out] through the BLAS, and scattered into the
// output; the backward passes multiply the same blocks the other way round. A block holds at most
// kPatchBudget elements, so the scratch stays small whatever the batch.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "blas.hpp"
#include "conv.hpp"
#include "kernel_util.hpp"

namespace rk {

// ---- shapes ------------------------------------------------------------------------------

namespace {

std::string pair_str(int64_t w, int64_t h) { return "(w " + std::to_string(w) + ", h " + std::to_string(h) + ")"; }

// The output size along one axis: (in + 2 pad - dil (k - 1) - 1) / stride + 1, every term checked.
int64_t conv_out_size(const char* op, const char* axis, int64_t in, int64_t k, int64_t stride, int64_t pad,
                      int64_t dil, const std::string& shapes) {
    const int64_t padded = size_add(in, size_mul(2, pad));
    const int64_t span = size_add(size_mul(dil, k - 1), 1);
    if (span > padded)
        throw std::invalid_argument(op_err(op, shapes + ": the kernel spans " + std::to_string(span) + " along the " + axis +
                                               " (dilation x (kernel - 1) + 1) but the padded input is only " +
                                               std::to_string(padded) + " (input + 2 x padding); expected a kernel "
                                               "that fits the padded input"));
    return (padded - span) / stride + 1;
}

void require_positive(const char* op, const char* what, int64_t w, int64_t h, int64_t least) {
    if (w < least || h < least)
        throw std::invalid_argument(op_err(op, std::string(what) + " " + pair_str(w, h) + " must be at least " +
                                               std::to_string(least)));
}

void require_float_pair(const char* op, const TensorImpl& a, const char* a_name, const TensorImpl& b, const char* b_name) {
    require_float(op, a, a_name);
    require_float(op, b, b_name);
    if (a.dtype != b.dtype)
        throw TypeError(op_err(op, std::string(a_name) + " is " + dtype_name(a.dtype) + " but " + b_name + " is " +
                                       dtype_name(b.dtype) + " (expected the same float dtype)"));
}

}  // namespace

ConvParams conv_params(const char* op, const OpAttrs& attrs, size_t extra) {
    if (attrs.ints.size() != 6 + extra)
        throw std::invalid_argument(op_err(op, "expected ints stride, padding, dilation as (w, h) pairs" +
                                               std::string(extra ? " then 2 sizes" : "") + "; got " +
                                               std::to_string(attrs.ints.size()) + " ints"));
    const auto& i = attrs.ints;
    ConvParams p{i[0], i[1], i[2], i[3], i[4], i[5]};
    require_positive(op, "stride", p.stride_w, p.stride_h, 1);
    require_positive(op, "padding", p.pad_w, p.pad_h, 0);
    require_positive(op, "dilation", p.dil_w, p.dil_h, 1);
    return p;
}

ConvGeometry conv_geometry(const char* op, const Shape& x, const Shape& w, const ConvParams& p) {
    const std::string shapes = "x [" + std::to_string(x[0]) + ", " + std::to_string(x[1]) + ", " + std::to_string(x[2]) +
                               ", " + std::to_string(x[3]) + "], w [" + std::to_string(w[0]) + ", " + std::to_string(w[1]) +
                               ", " + std::to_string(w[2]) + ", " + std::to_string(w[3]) + "]";
    if (x[2] != w[2])
        throw std::invalid_argument(op_err(op, shapes + ": x [W, H, C, N] has C = " + std::to_string(x[2]) +
                                               " channels but w [KW, KH, C_in, C_out] expects C_in = " + std::to_string(w[2])));
    ConvGeometry g{x[0], x[1], x[2], x[3], w[0], w[1], w[3], p, 0, 0};
    g.out_w = conv_out_size(op, "width", g.in_w, g.k_w, p.stride_w, p.pad_w, p.dil_w, shapes);
    g.out_h = conv_out_size(op, "height", g.in_h, g.k_h, p.stride_h, p.pad_h, p.dil_h, shapes);
    size_mul(g.patch(), g.out_w, g.out_h, g.n);  // the implicit patch matrix's elements are indexable
    return g;
}

OutSpec shape_conv2d(const Inputs& in, const OpAttrs& attrs) {
    const TensorImpl &x = *in[0], &w = *in[1];
    require_float_pair("conv2d", x, "x", w, "w");
    const ConvGeometry g = conv_geometry("conv2d", x.ne, w.ne, conv_params("conv2d", attrs));
    return OutSpec{{g.out_w, g.out_h, g.c_out, g.n}, 4, x.dtype};
}

// (g [W', H', C_out, N], w) -> dx [W, H, C_in, N]; ints: the conv's, then W, H
OutSpec shape_conv2d_input_back(const Inputs& in, const OpAttrs& attrs) {
    const TensorImpl &dy = *in[0], &w = *in[1];
    require_float_pair("conv2d_input_back", dy, "g", w, "w");
    const ConvGeometry geo = back_input_geometry(dy, w, attrs);
    return OutSpec{{geo.in_w, geo.in_h, geo.c_in, geo.n}, 4, dy.dtype};
}

// (g [W', H', C_out, N], x) -> dw [KW, KH, C_in, C_out]; ints: the conv's, then KW, KH
OutSpec shape_conv2d_weight_back(const Inputs& in, const OpAttrs& attrs) {
    const TensorImpl &dy = *in[0], &x = *in[1];
    require_float_pair("conv2d_weight_back", dy, "g", x, "x");
    const ConvGeometry geo = back_weight_geometry(dy, x, attrs);
    return OutSpec{{geo.k_w, geo.k_h, geo.c_in, geo.c_out}, 4, dy.dtype};
}

namespace {

void require_output_shape(const char* op, const TensorImpl& dy, const ConvGeometry& geo) {
    if (dy.ne[0] != geo.out_w || dy.ne[1] != geo.out_h || dy.ne[2] != geo.c_out || dy.ne[3] != geo.n)
        throw std::invalid_argument(op_err(op, "g " + dy.shape_str() + " is not the convolution's output shape [" +
                                               std::to_string(geo.out_w) + ", " + std::to_string(geo.out_h) + ", " +
                                               std::to_string(geo.c_out) + ", " + std::to_string(geo.n) + "]"));
}

}  // namespace

ConvGeometry back_input_geometry(const TensorImpl& dy, const TensorImpl& w, const OpAttrs& attrs) {
    const char* op = "conv2d_input_back";
    const ConvParams p = conv_params(op, attrs, 2);
    const int64_t in_w = attrs.ints[6], in_h = attrs.ints[7];
    require_positive(op, "input size", in_w, in_h, 1);
    const ConvGeometry geo = conv_geometry(op, {in_w, in_h, w.ne[2], dy.ne[3]}, w.ne, p);
    require_output_shape(op, dy, geo);
    return geo;
}

ConvGeometry back_weight_geometry(const TensorImpl& dy, const TensorImpl& x, const OpAttrs& attrs) {
    const char* op = "conv2d_weight_back";
    const ConvParams p = conv_params(op, attrs, 2);
    const int64_t k_w = attrs.ints[6], k_h = attrs.ints[7];
    require_positive(op, "kernel size", k_w, k_h, 1);
    const ConvGeometry geo = conv_geometry(op, x.ne, {k_w, k_h, x.ne[2], dy.ne[2]}, p);
    require_output_shape(op, dy, geo);
    return geo;
}

// ---- the CPU convolution -------------------------------------------------------------------

namespace {

constexpr int64_t kPatchBudget = int64_t(1) << 21;  // elements of one block of the patch matrix (8 MiB in f32)

// The rows [begin, begin + rows) of the patch matrix: r = ow + W' (oh + H' n).
struct RowBlock {
    int64_t begin, rows;
};

// Calls visit(r, ow, oh, n) for every row of a block, in order, without a division per row.
template <typename F>
void for_each_row(const ConvGeometry& g, const RowBlock& b, F&& visit) {
    int64_t ow = b.begin % g.out_w, oh = (b.begin / g.out_w) % g.out_h, n = b.begin / g.pixels();
    for (int64_t r = 0; r < b.rows; ++r) {
        visit(r, ow, oh, n);
        if (++ow == g.out_w) {
            ow = 0;
            if (++oh == g.out_h) oh = 0, ++n;
        }
    }
}

// The element of x that patch column k = (kw, kh, ci) reads at an output pixel, or -1 in the padding.
struct Tap {
    int64_t kw, kh, ci;
};
Tap tap_of(const ConvGeometry& g, int64_t k) { return {k % g.k_w, (k / g.k_w) % g.k_h, k / (g.k_w * g.k_h)}; }

int64_t input_index(const ConvGeometry& g, const Tap& t, int64_t ow, int64_t oh, int64_t n) {
    const int64_t ix = ow * g.p.stride_w + t.kw * g.p.dil_w - g.p.pad_w;
    const int64_t iy = oh * g.p.stride_h + t.kh * g.p.dil_h - g.p.pad_h;
    if (ix < 0 || ix >= g.in_w || iy < 0 || iy >= g.in_h) return -1;
    return ix + g.in_w * (iy + g.in_h * (t.ci + g.c_in * n));
}

int64_t column_grain(int64_t rows) { return std::max<int64_t>(1, kElementGrain / std::max<int64_t>(rows, 1)); }

// patches [rows, K] (column-major) = the block's rows of the implicit patch matrix of x
template <typename T>
void gather_patches(const ConvGeometry& g, const T* x, const RowBlock& b, T* patches) {
    parallel_for(g.patch(), column_grain(b.rows), [&](int64_t lo, int64_t hi) {
        for (int64_t k = lo; k < hi; ++k) {
            const Tap t = tap_of(g, k);
            T* column = patches + k * b.rows;
            for_each_row(g, b, [&](int64_t r, int64_t ow, int64_t oh, int64_t n) {
                const int64_t i = input_index(g, t, ow, oh, n);
                column[r] = i < 0 ? T(0) : x[i];
            });
        }
    });
}

// dx += the block's patch gradients [rows, K] put back where gather_patches read them. One task per
// input channel: the taps of different channels never write the same element of dx.
template <typename T>
void scatter_patches(const ConvGeometry& g, const T* patches, const RowBlock& b, T* dx) {
    const int64_t taps = g.k_w * g.k_h;
    parallel_for(g.c_in, column_grain(b.rows * taps), [&](int64_t lo, int64_t hi) {
        for (int64_t ci = lo; ci < hi; ++ci)
            for (int64_t tap = 0; tap < taps; ++tap) {
                const int64_t k = ci * taps + tap;
                const Tap t = tap_of(g, k);
                const T* column = patches + k * b.rows;
                for_each_row(g, b, [&](int64_t r, int64_t ow, int64_t oh, int64_t n) {
                    const int64_t i = input_index(g, t, ow, oh, n);
                    if (i >= 0) dx[i] += column[r];
                });
            }
    });
}

// rows [rows, C_out] <-> the block's pixels of an output-shaped tensor [W', H', C_out, N]
template <typename T, bool kToRows>
void move_rows(const ConvGeometry& g, const RowBlock& b, T* rows, T* image) {
    parallel_for(g.c_out, column_grain(b.rows), [&](int64_t lo, int64_t hi) {
        for (int64_t co = lo; co < hi; ++co)
            for_each_row(g, b, [&](int64_t r, int64_t ow, int64_t oh, int64_t n) {
                T& pixel = image[ow + g.out_w * (oh + g.out_h * (co + g.c_out * n))];
                if (kToRows) rows[r + co * b.rows] = pixel;
                else pixel = rows[r + co * b.rows];
            });
    });
}

// Calls f(block) for consecutive blocks of the patch matrix's rows, each within kPatchBudget.
template <typename F>
void for_each_block(const ConvGeometry& g, F&& f) {
    const int64_t total = g.pixels() * g.n;
    const int64_t per_block = std::max<int64_t>(1, kPatchBudget / g.patch());
    for (int64_t begin = 0; begin < total; begin += per_block) f(RowBlock{begin, std::min(per_block, total - begin)});
}

}  // namespace

void cpu_conv2d(const Inputs& in, const OpAttrs& attrs, TensorImpl& out) {
    const TensorImpl &x = *in[0], &w = *in[1];
    const ConvGeometry g = conv_geometry("conv2d", x.ne, w.ne, conv_params("conv2d", attrs));
    dispatch_float(out.dtype, [&](auto tag) {
        using T = decltype(tag);
        std::vector<T> patches, rows;
        for_each_block(g, [&](const RowBlock& b) {
            patches.resize(size_t(b.rows * g.patch()));  // [rows, K]
            rows.resize(size_t(b.rows * g.c_out));       // [rows, C_out]
            gather_patches(g, x.ptr<T>(), b, patches.data());
            gemm(false, false, b.rows, g.c_out, g.patch(), patches.data(), b.rows, w.ptr<T>(), g.patch(), rows.data());
            move_rows<T, false>(g, b, rows.data(), out.ptr<T>());
        });
    });
}

void cpu_conv2d_input_back(const Inputs& in, const OpAttrs& attrs, TensorImpl& out) {
    const TensorImpl &dy = *in[0], &w = *in[1];
    const ConvGeometry g = back_input_geometry(dy, w, attrs);
    dispatch_float(out.dtype, [&](auto tag) {
        using T = decltype(tag);
        std::fill_n(out.ptr<T>(), out.numel(), T(0));
        std::vector<T> patches, rows;
        for_each_block(g, [&](const RowBlock& b) {
            rows.resize(size_t(b.rows * g.c_out));       // [rows, C_out]
            patches.resize(size_t(b.rows * g.patch()));  // [rows, K]
            move_rows<T, true>(g, b, rows.data(), dy.ptr<T>());
            gemm(false, true, b.rows, g.patch(), g.c_out, rows.data(), b.rows, w.ptr<T>(), g.patch(), patches.data());
            scatter_patches(g, patches.data(), b, out.ptr<T>());
        });
    });
}

void cpu_conv2d_weight_back(const Inputs& in, const OpAttrs& attrs, TensorImpl& out) {
    const TensorImpl &dy = *in[0], &x = *in[1];
    const ConvGeometry g = back_weight_geometry(dy, x, attrs);
    dispatch_float(out.dtype, [&](auto tag) {
        using T = decltype(tag);
        T* dw = out.ptr<T>();  // [K, C_out]
        std::fill_n(dw, out.numel(), T(0));
        std::vector<T> patches, rows, block_dw(size_t(out.numel()));
        for_each_block(g, [&](const RowBlock& b) {
            patches.resize(size_t(b.rows * g.patch()));  // [rows, K]
            rows.resize(size_t(b.rows * g.c_out));       // [rows, C_out]
            gather_patches(g, x.ptr<T>(), b, patches.data());
            move_rows<T, true>(g, b, rows.data(), dy.ptr<T>());
            gemm(true, false, g.patch(), g.c_out, b.rows, patches.data(), b.rows, rows.data(), b.rows, block_dw.data());
            for (size_t e = 0; e < block_dw.size(); ++e) dw[e] += block_dw[e];  // blocks in order: deterministic
        });
    });
}

// ---- max pooling ---------------------------------------------------------------------------

PoolGeometry pool_geometry(const char* op, const TensorImpl& x, const OpAttrs& attrs) {
    require_float(op, x, "x");
    if (attrs.ints.size() != 6)
        throw std::invalid_argument(op_err(op, "expected ints kernel, stride, padding as (w, h) pairs; got " +
                                               std::to_string(attrs.ints.size()) + " ints"));
    const auto& i = attrs.ints;
    PoolGeometry g{x.ne[0], x.ne[1], x.ne[2] * x.ne[3], i[0], i[1], i[2], i[3], i[4], i[5], 0, 0};
    require_positive(op, "kernel", g.k_w, g.k_h, 1);
    require_positive(op, "stride", g.stride_w, g.stride_h, 1);
    require_positive(op, "padding", g.pad_w, g.pad_h, 0);
    // every window then holds an element of x (PyTorch's rule too): a window of padding alone has no maximum
    if (2 * g.pad_w > g.k_w || 2 * g.pad_h > g.k_h)
        throw std::invalid_argument(op_err(op, "padding " + pair_str(g.pad_w, g.pad_h) + " must be at most half the kernel " +
                                               pair_str(g.k_w, g.k_h)));
    const std::string shape = "x " + x.shape_str();
    g.out_w = conv_out_size(op, "width", g.in_w, g.k_w, g.stride_w, g.pad_w, 1, shape);
    g.out_h = conv_out_size(op, "height", g.in_h, g.k_h, g.stride_h, g.pad_h, 1, shape);
    return g;
}

OutSpec shape_max_pool2d(const Inputs& in, const OpAttrs& attrs) {
    const TensorImpl& x = *in[0];
    const PoolGeometry g = pool_geometry("max_pool2d", x, attrs);
    return OutSpec{{g.out_w, g.out_h, x.ne[2], x.ne[3]}, 4, x.dtype};
}

// (g like max_pool2d's output, x) -> dx like x; ints: max_pool2d's
OutSpec shape_max_pool2d_back(const Inputs& in, const OpAttrs& attrs) {
    const TensorImpl &dy = *in[0], &x = *in[1];
    require_float_pair("max_pool2d_back", dy, "g", x, "x");
    const PoolGeometry g = pool_geometry("max_pool2d_back", x, attrs);
    if (dy.ne[0] != g.out_w || dy.ne[1] != g.out_h || dy.ne[2] != x.ne[2] || dy.ne[3] != x.ne[3])
        throw std::invalid_argument(op_err("max_pool2d_back", "g " + dy.shape_str() + " is not the pooling's output shape for x " +
                                                                 x.shape_str()));
    return same_as(x);
}

namespace {

// The offset in its plane of the element a window keeps: its first maximum in memory order (rows
// of the window top to bottom, each left to right), or its first NaN, which a NaN-propagating max
// would return. The padding is -inf: never kept, since every window holds an element of x.
template <typename T>
int64_t window_argmax(const PoolGeometry& g, const T* plane, int64_t ow, int64_t oh) {
    const int64_t x0 = ow * g.stride_w - g.pad_w, y0 = oh * g.stride_h - g.pad_h;
    int64_t best = -1;
    for (int64_t iy = std::max<int64_t>(y0, 0); iy < std::min(y0 + g.k_h, g.in_h); ++iy)
        for (int64_t ix = std::max<int64_t>(x0, 0); ix < std::min(x0 + g.k_w, g.in_w); ++ix) {
            const int64_t i = ix + g.in_w * iy;
            if (best < 0 || (!std::isnan(plane[best]) && (plane[i] > plane[best] || std::isnan(plane[i])))) best = i;
        }
    return best;
}

}  // namespace

void cpu_max_pool2d(const Inputs& in, const OpAttrs& attrs, TensorImpl& out) {
    const TensorImpl& x = *in[0];
    const PoolGeometry g = pool_geometry("max_pool2d", x, attrs);
    dispatch_float(out.dtype, [&](auto tag) {
        using T = decltype(tag);
        const T* px = x.ptr<T>();
        T* po = out.ptr<T>();
        parallel_for(g.planes, column_grain(g.in_w * g.in_h), [&](int64_t lo, int64_t hi) {
            for (int64_t c = lo; c < hi; ++c) {
                const T* plane = px + c * g.in_w * g.in_h;
                for (int64_t oh = 0; oh < g.out_h; ++oh)
                    for (int64_t ow = 0; ow < g.out_w; ++ow)
                        po[ow + g.out_w * (oh + g.out_h * c)] = plane[window_argmax(g, plane, ow, oh)];
            }
        });
    });
}

// Each window's gradient goes to the element it kept (summed where windows overlap); one task per
// plane, so no two tasks write one element.
void cpu_max_pool2d_back(const Inputs& in, const OpAttrs& attrs, TensorImpl& out) {
    const TensorImpl &dy = *in[0], &x = *in[1];
    const PoolGeometry g = pool_geometry("max_pool2d_back", x, attrs);
    dispatch_float(out.dtype, [&](auto tag) {
        using T = decltype(tag);
        const T *px = x.ptr<T>(), *pg = dy.ptr<T>();
        T* po = out.ptr<T>();
        const int64_t plane_size = g.in_w * g.in_h;
        parallel_for(g.planes, column_grain(plane_size), [&](int64_t lo, int64_t hi) {
            for (int64_t c = lo; c < hi; ++c) {
                const T* plane = px + c * plane_size;
                T* grad = po + c * plane_size;
                std::fill_n(grad, plane_size, T(0));
                for (int64_t oh = 0; oh < g.out_h; ++oh)
                    for (int64_t ow = 0; ow < g.out_w; ++ow)
                        grad[window_argmax(g, plane, ow, oh)] += pg[ow + g.out_w * (oh + g.out_h * c)];
            }
        });
    });
}

}  // namespace rk
