// out[j, i] = x[i, j] in every slice of dims 2 and 3 (any 4-byte dtype).
#version 450
#include "common.glsl"

layout(push_constant) uniform Push {
    Words x;
    Words o;
    uint rows;  // of x
    uint cols;  // of x
    uint n;
} pc;

void main() {
    uint e = flat_invocation();
    if (e >= pc.n) return;
    uint slice = pc.rows * pc.cols;
    uint s = e / slice, k = e % slice;
    uint j = k % pc.cols, i = k / pc.cols;  // out is [cols, rows]: element (j, i)
    pc.o.v[e] = pc.x.v[s * slice + i + j * pc.rows];
}
