// Elementwise f(x) for the unary op OP_CODE (elementwise.glsl); its float attributes come in
// p0, p1.
#version 450
#include "common.glsl"
#include "elementwise.glsl"

layout(push_constant) uniform Push {
    Floats x;
    Floats o;
    uint n;
    float p0;
    float p1;
} pc;

void main() {
    uint i = flat_invocation();
    if (i >= pc.n) return;
    pc.o.v[i] = elementwise_value(OP_CODE, pc.x.v[i], 0.0, pc.p0, pc.p1);
}
