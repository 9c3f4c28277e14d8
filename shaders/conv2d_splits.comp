// The weight gradient of conv2d from the partial sums of its z slices (conv2d.comp, BACK_WEIGHT):
// o[e] = sum over the slices s, in order, of partials[s n + e].
#version 450
#include "common.glsl"

layout(push_constant) uniform Push {
    Floats partials;
    Floats o;
    uint n;       // elements of the gradient
    uint splits;  // slices
} pc;

void main() {
    uint e = flat_invocation();
    if (e >= pc.n) return;
    float total = 0.0;
    for (uint s = 0; s < pc.splits; ++s) total += pc.partials.v[s * pc.n + e];
    pc.o.v[e] = total;
}
