// The geometry of the 2-D convolution and max pooling ops (native/cpu_conv.cpp), shared by the
// shape rules, the CPU kernels and the Vulkan kernels. Every pair is (w, h): ne order, dim 0 first.
#pragma once

#include "kernel_util.hpp"
#include "ops.hpp"

namespace rk {

// A convolution's ints, in this order in every conv op: stride, padding, dilation, each (w, h).
struct ConvParams {
    int64_t stride_w, stride_h, pad_w, pad_h, dil_w, dil_h;
};

// x [in_w, in_h, c_in, n] * w [k_w, k_h, c_in, c_out] -> [out_w, out_h, c_out, n]
struct ConvGeometry {
    int64_t in_w, in_h, c_in, n;
    int64_t k_w, k_h, c_out;
    ConvParams p;
    int64_t out_w, out_h;
    int64_t patch() const { return k_w * k_h * c_in; }  // K: the GEMM's reduction over (kw, kh, ci)
    int64_t pixels() const { return out_w * out_h; }    // output pixels per image
};

// The checked ints of a conv op (stride and dilation >= 1, padding >= 0); `extra` more ints follow.
ConvParams conv_params(const char* op, const OpAttrs& attrs, size_t extra = 0);
// The geometry of x (ne) convolved with w (ne), checked: matching channels, a kernel that fits the
// padded input, sizes that do not overflow. Errors name `op` and both shapes.
ConvGeometry conv_geometry(const char* op, const Shape& x, const Shape& w, const ConvParams& p);
// conv2d's geometry from its inputs (x, w, and an optional bias b) and ints (the conv's, then an
// optional activation), checked.
ConvGeometry conv2d_geometry(const Inputs& in, const OpAttrs& attrs);
// conv2d's epilogue: the bias (null where there is none) and the activation applied after it.
struct ConvEpilogue {
    const TensorImpl* bias;
    Activation act;
};
ConvEpilogue conv2d_epilogue(const Inputs& in, const OpAttrs& attrs, const ConvGeometry& g);
// The forward geometry of the backward helpers (ints: the conv's, then the input's or the
// kernel's (w, h)), checked against the upstream gradient g.
ConvGeometry back_input_geometry(const TensorImpl& g, const TensorImpl& w, const OpAttrs& attrs);
ConvGeometry back_weight_geometry(const TensorImpl& g, const TensorImpl& x, const OpAttrs& attrs);

// max_pool2d over the planes of x [in_w, in_h, C, N] (planes = C N); ints: kernel, stride,
// padding, each (w, h).
struct PoolGeometry {
    int64_t in_w, in_h, planes;
    int64_t k_w, k_h, stride_w, stride_h, pad_w, pad_h;
    int64_t out_w, out_h;
};
PoolGeometry pool_geometry(const char* op, const TensorImpl& x, const OpAttrs& attrs);

}  // namespace rk
