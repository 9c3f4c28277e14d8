// Copies a window of rows: out[dst0 + r, c] = x[src0 + r, c] for r < n; elsewhere out is zero
// (zero_outside: one invocation per element of out) or left as it is (one invocation per element
// of the window, so two dispatches fill the two halves of a concat, each reading and writing its
// own). Any 4-byte dtype.
#version 450
#include "common.glsl"

layout(push_constant) uniform Push {
    Words x;
    Words o;
    uint x_rows;
    uint out_rows;
    uint src0;
    uint dst0;
    uint n;
    uint zero_outside;
    uint total;  // invocations: elements of out (zero_outside) or of the window
} pc;

void main() {
    uint e = flat_invocation();
    if (e >= pc.total) return;
    if (pc.zero_outside == 0) {
        uint r = e % pc.n, c = e / pc.n;
        pc.o.v[pc.dst0 + r + c * pc.out_rows] = pc.x.v[pc.src0 + r + c * pc.x_rows];
        return;
    }
    uint r = e % pc.out_rows, c = e / pc.out_rows;
    if (r >= pc.dst0 && r < pc.dst0 + pc.n) {
        pc.o.v[e] = pc.x.v[pc.src0 + (r - pc.dst0) + c * pc.x_rows];
    } else {
        pc.o.v[e] = 0u;
    }
}
