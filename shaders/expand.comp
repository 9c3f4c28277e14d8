// out = x repeated along its dimensions of size 1 (any 4-byte dtype).
#version 450
#include "common.glsl"

layout(push_constant) uniform Push {
    Words x;
    Words o;
    uint ne[4];  // output sizes
    uint sx[4];  // element strides of x (0 where broadcast)
    uint n;
} pc;

void main() {
    uint i = flat_invocation();
    if (i >= pc.n) return;
    uint rest = i, index = 0;
    for (uint d = 0; d < 4; ++d) {
        index += (rest % pc.ne[d]) * pc.sx[d];
        rest /= pc.ne[d];
    }
    pc.o.v[i] = pc.x.v[index];
}
