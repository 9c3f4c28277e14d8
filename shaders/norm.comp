// The sum of the squares of every element of a set of tensors (a global gradient norm's square),
// in two dispatches. PARTIALS: workgroup i sums the squares of chunk i of the set (a record of
// the table: a tensor's address and which of its elements) into partial i. TOTAL: one workgroup
// sums the partials into the output. Both reduce by a tree in shared memory, in a fixed order,
// so results do not vary between runs.
#version 450
#include "common.glsl"

struct Chunk {
    Floats x;
    uint begin;
    uint count;
};

layout(buffer_reference, std430, buffer_reference_align = 8) readonly buffer Chunks { Chunk chunk[]; };

layout(push_constant) uniform Push {
    Chunks table;    // PARTIALS: the chunks
    Floats partials; // PARTIALS writes one per chunk, TOTAL reads them
    Floats o;        // TOTAL: the [1, 1] result
    uint n_chunks;
} pc;

shared float partial[256];

float workgroup_sum(float s) {
    uint t = gl_LocalInvocationID.x;
    partial[t] = s;
    barrier();
    for (uint half_size = 128; half_size > 0; half_size >>= 1) {
        if (t < half_size) partial[t] += partial[t + half_size];
        barrier();
    }
    return partial[0];
}

void main() {
    uint t = gl_LocalInvocationID.x;
#if defined(PARTIALS)
    uint id = flat_group();
    if (id >= pc.n_chunks) return;  // uniform per workgroup
    Chunk k = pc.table.chunk[id];
    float s = 0.0;
    for (uint i = k.begin + t; i < k.begin + k.count; i += 256) {
        float v = k.x.v[i];
        s += v * v;
    }
    float total = workgroup_sum(s);
    if (t == 0) pc.partials.v[id] = total;
#elif defined(TOTAL)
    float s = 0.0;
    for (uint i = t; i < pc.n_chunks; i += 256) s += pc.partials.v[i];
    float total = workgroup_sum(s);
    if (t == 0) pc.o.v[0] = total;
#endif
}
