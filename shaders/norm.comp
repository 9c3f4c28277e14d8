// The sum of the squares of every element of a set of tensors (a global gradient norm's square),
// in one dispatch. Workgroup i sums the squares of chunk i of the set (a record of the table: a
// tensor's address and which of its elements) into partial i; the workgroup that finishes last
// (each counts itself done once its partial is written) sums the partials into the output and
// sets the count back to 0 for the next run. A second dispatch for the total had cost a
// dependency level of its own in every captured update. Both sums go by a tree in shared memory
// in a fixed order, so the result does not depend on which workgroup finishes last.
#version 450
#include "common.glsl"

struct Chunk {
    Floats x;
    uint begin;
    uint count;
};

layout(buffer_reference, std430, buffer_reference_align = 8) readonly buffer Chunks { Chunk chunk[]; };
// Coherent: the last workgroup reads the others' partials through the device's shared cache.
layout(buffer_reference, std430, buffer_reference_align = 4) coherent buffer SharedFloats { float v[]; };
layout(buffer_reference, std430, buffer_reference_align = 4) coherent buffer Count { uint done; };

layout(push_constant) uniform Push {
    Chunks table;          // the chunks
    SharedFloats partials; // one per chunk
    Floats o;              // the [1, 1] result
    Count count;           // workgroups done: 0 before and after every dispatch
    uint n_chunks;
} pc;

shared float partial[256];
shared bool finishes;  // whether this workgroup is the last one done

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
    uint id = flat_group();
    if (id >= pc.n_chunks) return;  // uniform per workgroup
    Chunk k = pc.table.chunk[id];
    float s = 0.0;
    for (uint i = k.begin + t; i < k.begin + k.count; i += 256) {
        float v = k.x.v[i];
        s += v * v;
    }
    float chunk_sum = workgroup_sum(s);
    if (t == 0) {
        pc.partials.v[id] = chunk_sum;
        memoryBarrierBuffer();  // the partial is visible before the count says it is done
        finishes = atomicAdd(pc.count.done, 1u) == pc.n_chunks - 1u;
    }
    barrier();
    if (!finishes) return;  // uniform per workgroup
    memoryBarrierBuffer();
    float total = 0.0;
    for (uint i = t; i < pc.n_chunks; i += 256) total += pc.partials.v[i];
    total = workgroup_sum(total);
    if (t == 0) {
        pc.o.v[0] = total;
        pc.count.done = 0u;
    }
}
