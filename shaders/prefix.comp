// Prefix sums and the search over them, for sampling by priority on the device.
// CUMSUM: inclusive prefix sums down each column, one workgroup per column: each invocation sums
// a contiguous chunk, the chunk totals are scanned in shared memory, then each chunk is written
// with its offset. SEARCHSORTED: per query, the number of sorted values <= q (at most n - 1).
#version 450
#include "common.glsl"

layout(push_constant) uniform Push {
    Floats a;  // CUMSUM: x; SEARCHSORTED: the sorted column
    Floats b;  // SEARCHSORTED: the queries
    Words o;
    uint rows;
    uint n;    // CUMSUM: columns; SEARCHSORTED: queries
} pc;

shared float totals[256];

void main() {
#if defined(CUMSUM)
    uint c = flat_group();
    if (c >= pc.n) return;  // uniform per workgroup
    uint t = gl_LocalInvocationID.x, base = c * pc.rows;
    uint chunk = (pc.rows + 255) / 256, begin = min(t * chunk, pc.rows), end = min(begin + chunk, pc.rows);
    float s = 0.0;
    for (uint i = begin; i < end; ++i) s += pc.a.v[base + i];
    totals[t] = s;
    barrier();
    for (uint w = 1; w < 256; w *= 2) {  // inclusive scan of the chunk totals (Hillis-Steele)
        float add = t >= w ? totals[t - w] : 0.0;
        barrier();
        totals[t] += add;
        barrier();
    }
    float running = t > 0 ? totals[t - 1] : 0.0;
    for (uint i = begin; i < end; ++i) {
        running += pc.a.v[base + i];
        pc.o.v[base + i] = floatBitsToUint(running);
    }
#elif defined(SEARCHSORTED)
    uint j = flat_invocation();
    if (j >= pc.n) return;
    float q = pc.b.v[j];
    uint lo = 0, hi = pc.rows;  // the first index whose value exceeds q
    while (lo < hi) {
        uint mid = (lo + hi) / 2;
        if (pc.a.v[mid] <= q) lo = mid + 1;
        else hi = mid;
    }
    pc.o.v[j] = min(lo, pc.rows - 1);
#endif
}
