// chunk_scan and its backward (native/cpu_chunk_scan.cpp has the layouts and the formulas): a
// chunked recurrence's states passed from chunk to chunk. One invocation per element (r, k, n) of
// a state walks the chunks (FORWARD) or walks them back (BACKWARD), consecutive invocations on
// consecutive rows r, so every chunk's reads and writes coalesce; the CPU kernel's order of
// operations.
#version 450
#include "common.glsl"

layout(push_constant) uniform Push {
    Floats a;      // FORWARD: X; BACKWARD: g
    Floats first;  // FORWARD only
    Floats decay;
    Floats o;
    uint R;
    uint K;
    uint c;
    uint N;
} pc;

void main() {
    uint id = flat_invocation(), plane = pc.R * pc.K;
    if (id >= plane * pc.N) return;
    uint e = id % plane, n = id / plane, k = e / pc.R;
    uint starts = plane * pc.c * pc.N;  // the output's (FORWARD) or g's (BACKWARD) final states
#if defined(FORWARD)
    float z = pc.first.v[id];
    for (uint q = 0; q < pc.c; ++q) {
        uint at = plane * (q + pc.c * n) + e;
        pc.o.v[at] = z;
        z = pc.decay.v[pc.K * (q + pc.c * n) + k] * z + pc.a.v[at];
    }
    pc.o.v[starts + id] = z;
#else
    float d = pc.a.v[starts + id];
    for (uint q = pc.c; q-- > 0;) {
        uint at = plane * (q + pc.c * n) + e;
        pc.o.v[at] = d;  // gX_q = D_{q+1}
        d = pc.a.v[at] + pc.decay.v[pc.K * (q + pc.c * n) + k] * d;
    }
    pc.o.v[starts + id] = d;
#endif
}
