// mean over columns of sum_i t_i (logsumexp(x) - x_i): one workgroup, each invocation taking
// whole columns, then a tree in shared memory.
#version 450
#include "common.glsl"

layout(push_constant) uniform Push {
    Floats x;
    Floats t;
    Floats o;
    uint rows;
    uint cols;
} pc;

shared float partial[256];

void main() {
    uint t = gl_LocalInvocationID.x;
    float s = 0.0;
    for (uint c = t; c < pc.cols; c += 256) {
        uint base = c * pc.rows;
        float mx = pc.x.v[base];
        for (uint i = 1; i < pc.rows; ++i) mx = max(mx, pc.x.v[base + i]);
        float e = 0.0;
        for (uint i = 0; i < pc.rows; ++i) e += exp(pc.x.v[base + i] - mx);
        float log_e = log(e);
        for (uint i = 0; i < pc.rows; ++i) {
            float w = pc.t.v[base + i];
            if (w != 0.0) s += w * ((mx - pc.x.v[base + i]) + log_e);  // logsumexp - x, without cancelling digits
        }
    }
    partial[t] = s;
    barrier();
    for (uint w = 128; w > 0; w /= 2) {
        if (t < w) partial[t] += partial[t + w];
        barrier();
    }
    if (t == 0) pc.o.v[0] = partial[0] / float(pc.cols);
}
