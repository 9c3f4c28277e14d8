// The sum of a product's partial outputs, one per slice of its reduction (conv2d.comp and
// matmul_small.comp where they split k): o[e] = sum over the slices s, in order, of
// partials[s n + e]; LINEAR then adds the bias of row e % rows and applies the activation (the
// linear op's epilogue, which a slice's partial cannot apply).
#version 450
#include "common.glsl"

layout(push_constant) uniform Push {
    Floats partials;
    Floats o;
    uint n;       // elements of the output
    uint splits;  // slices
#if defined(LINEAR)
    Floats bias;
    uint rows;        // the output's rows (the bias index is the row)
    uint activation;  // 0 none, 1 relu, 2 tanh, 3 sigmoid
#endif
} pc;

void main() {
    uint e = flat_invocation();
    if (e >= pc.n) return;
    float total = 0.0;
    for (uint s = 0; s < pc.splits; ++s) total += pc.partials.v[s * pc.n + e];
#if defined(LINEAR)
    total = linear_activation(pc.activation, total + pc.bias.v[e % pc.rows]);
#endif
    pc.o.v[e] = total;
}
