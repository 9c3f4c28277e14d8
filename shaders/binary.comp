// Elementwise a (op) b with broadcasting: strides of 0 repeat a dimension of size 1. The op is
// OP_CODE (elementwise.glsl): a binary op or a backward helper (g, saved).
#version 450
#include "common.glsl"
#include "elementwise.glsl"

layout(push_constant) uniform Push {
    Floats a;
    Floats b;
    Floats o;
    uint ne[4];  // output sizes
    uint sa[4];  // element strides of a (0 where broadcast)
    uint sb[4];
    uint n;
    float p0;
    float p1;
} pc;

void main() {
    uint i = flat_invocation();
    if (i >= pc.n) return;
    uint i0 = i % pc.ne[0];
    uint r = i / pc.ne[0];
    uint i1 = r % pc.ne[1];
    r /= pc.ne[1];
    uint i2 = r % pc.ne[2];
    uint i3 = r / pc.ne[2];
    uint ia = i0 * pc.sa[0] + i1 * pc.sa[1] + i2 * pc.sa[2] + i3 * pc.sa[3];
    uint ib = i0 * pc.sb[0] + i1 * pc.sb[1] + i2 * pc.sb[2] + i3 * pc.sb[3];
    pc.o.v[i] = elementwise_value(OP_CODE, pc.a.v[ia], pc.b.v[ib], pc.p0, pc.p1);
}
