// out = x with its dims reordered: out's element (i0, i1, i2, i3) is x's at
// i0 s0 + i1 s1 + i2 s2 + i3 s3, s the stride of x along each of out's dims (any 4-byte dtype).
#version 450
#include "common.glsl"

layout(push_constant) uniform Push {
    Words x;
    Words o;
    uint ne0;  // out's sizes (the last is implied by n)
    uint ne1;
    uint ne2;
    uint s0;
    uint s1;
    uint s2;
    uint s3;
    uint n;
} pc;

void main() {
    uint e = flat_invocation();
    if (e >= pc.n) return;
    uint i0 = e % pc.ne0, rest = e / pc.ne0;
    uint i1 = rest % pc.ne1;
    rest /= pc.ne1;
    uint i2 = rest % pc.ne2, i3 = rest / pc.ne2;
    pc.o.v[e] = pc.x.v[i0 * pc.s0 + i1 * pc.s1 + i2 * pc.s2 + i3 * pc.s3];
}
