// The sum of a product's partial outputs, one per slice of its reduction (conv2d.comp and
// matmul_small.comp where they split k): o[e] = sum over the slices s, in order, of
// partials[s n + e]; EPILOGUE then adds the bias of row (e / bias_stride) % rows (the linear op's
// row, conv2d's output channel) and applies the activation, which a slice's partial cannot.
// HALF: the output and the bias are f16 (conv2d_coopmat.comp's f32 partials), the sum rounded once.
#version 450
#include "common.glsl"
#if defined(HALF)
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
#extension GL_EXT_shader_16bit_storage : require
layout(buffer_reference, std430, buffer_reference_align = 2) buffer Halfs { float16_t v[]; };
#define OUTPUTS Halfs
#else
#define OUTPUTS Floats
#endif

layout(push_constant) uniform Push {
    Floats partials;
    OUTPUTS o;
    uint n;       // elements of the output
    uint splits;  // slices
#if defined(EPILOGUE)
    OUTPUTS bias;
    uint has_bias;     // 0: no bias, the activation alone
    uint rows;         // biases
    uint bias_stride;  // consecutive elements that share a bias (1 for linear, W' H' for conv2d)
    uint activation;   // 0 none, 1 relu, 2 tanh, 3 sigmoid
#endif
} pc;

void main() {
    uint e = flat_invocation();
    if (e >= pc.n) return;
    float total = 0.0;
    for (uint s = 0; s < pc.splits; ++s) total += pc.partials.v[s * pc.n + e];
#if defined(EPILOGUE)
    if (pc.has_bias != 0u) total += float(pc.bias.v[(e / pc.bias_stride) % pc.rows]);
    total = linear_activation(pc.activation, total);
#endif
#if defined(HALF)
    pc.o.v[e] = float16_t(total);
#else
    pc.o.v[e] = total;
#endif
}
