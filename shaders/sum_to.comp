// out = x summed over the dimensions where out has size 1 and x does not: for short sums
// (per_invocation) one invocation per output element, adding its elements in order; else one
// workgroup per output element (and, where few outputs each sum many elements, per z slice of its reduction),
// its invocations striding over the reduced elements, then a tree in shared memory (a fixed order:
// results do not vary between runs). Where the reduction is split, each slice writes its partial
// sums as a whole output, one after the other from pc.o, and sum_splits.comp adds them in order.
#version 450
#include "common.glsl"

layout(push_constant) uniform Push {
    Floats x;
    Floats o;
    uint xne[4];
    uint one[4];  // output sizes
    uint n_out;
    uint n_reduced;
    // where the kept dimensions form one block, the reduced elements before it: output g's element r
    // lies at r % inner + inner (g + n_out (r / inner)) (a whole sum or one over features: inner =
    // n_reduced; one over the batch, as a bias gradient: 1; conv2d's bias gradient: W' H'); 0 where
    // they do not (each element's index decoded dimension by dimension)
    uint inner;
    uint split_len;  // reduced elements per z slice
    uint per_invocation;  // 1: an invocation per output (short sums: native/vulkan/vk_kernels.cpp)
} pc;

shared float partial[256];

// x's index of reduced element r of output g (its kept coordinates fixed_index)
uint decoded_index(uint r, uint fixed_index[4]) {
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
    return index;
}

// x's index of reduced element r of output g
uint element_index(uint r, uint g, uint fixed_index[4]) {
    return pc.inner != 0u ? r % pc.inner + pc.inner * (g + pc.n_out * (r / pc.inner)) : decoded_index(r, fixed_index);
}

void main() {
    uint g = pc.per_invocation != 0u ? flat_invocation() : flat_group();
    if (g >= pc.n_out) return;  // uniform per workgroup where a workgroup sums one output
    uint rest = g, fixed_index[4];
    for (uint d = 0; d < 4; ++d) {
        fixed_index[d] = rest % pc.one[d];
        rest /= pc.one[d];
    }
    if (pc.per_invocation != 0u) {  // uniform: no workgroup reaches the barriers below
        float sum = 0.0;
        for (uint r = 0; r < pc.n_reduced; ++r) sum += pc.x.v[element_index(r, g, fixed_index)];
        pc.o.v[g] = sum;
        return;
    }
    uint begin = min(gl_WorkGroupID.z * pc.split_len, pc.n_reduced), end = min(pc.n_reduced, begin + pc.split_len);
    float s = 0.0;
    for (uint r = begin + gl_LocalInvocationID.x; r < end; r += 256) {
        s += pc.x.v[element_index(r, g, fixed_index)];
    }
    partial[gl_LocalInvocationID.x] = s;
    barrier();
    for (uint width = 128; width > 0; width /= 2) {
        if (gl_LocalInvocationID.x < width) partial[gl_LocalInvocationID.x] += partial[gl_LocalInvocationID.x + width];
        barrier();
    }
    if (gl_LocalInvocationID.x == 0) pc.o.v[gl_WorkGroupID.z * pc.n_out + g] = partial[0];
}
