// out = x summed over the dimensions where out has size 1 and x does not: one workgroup per
// output element, its invocations striding over the reduced elements, then a tree in shared
// memory (a fixed order: results do not vary between runs).
#version 450
#include "common.glsl"

layout(push_constant) uniform Push {
    Floats x;
    Floats o;
    uint xne[4];
    uint one[4];  // output sizes
    uint n_out;
    uint n_reduced;
} pc;

shared float partial[256];

void main() {
    uint g = flat_group();
    if (g >= pc.n_out) return;  // uniform per workgroup
    uint rest = g, fixed_index[4];
    for (uint d = 0; d < 4; ++d) {
        fixed_index[d] = rest % pc.one[d];
        rest /= pc.one[d];
    }
    float s = 0.0;
    for (uint r = gl_LocalInvocationID.x; r < pc.n_reduced; r += 256) {
        uint left = r, index = 0, stride = 1;
        for (uint d = 0; d < 4; ++d) {
            uint id;
            if (pc.one[d] == 1 && pc.xne[d] != 1) {
                id = left % pc.xne[d];
                left /= pc.xne[d];
            } else {
                id = fixed_index[d];
            }
            index += id * stride;
            stride *= pc.xne[d];
        }
        s += pc.x.v[index];
    }
    partial[gl_LocalInvocationID.x] = s;
    barrier();
    for (uint width = 128; width > 0; width /= 2) {
        if (gl_LocalInvocationID.x < width) partial[gl_LocalInvocationID.x] += partial[gl_LocalInvocationID.x + width];
        barrier();
    }
    if (gl_LocalInvocationID.x == 0) pc.o.v[g] = partial[0];
}
