// conv2d and its two backward helpers for f16 images and kernels on cooperative matrices (tensor
// cores), f32 accumulation: the implicit GEMMs of conv2d_gemm.glsl (FORWARD, BACK_INPUT,
// BACK_WEIGHT), their operands gathered from the tensors into shared memory (no patch matrix in
// memory). Used only where the device lists 16x16x16 f16 fragments with f32 sums and runs
// 32-invocation subgroups, as matmul_coopmat.comp (vk_context.cpp): the 256 invocations are 8
// subgroups.
// A workgroup computes a 64 x 64 tile of the GEMM's output; subgroup s owns the 16 x 32 block at
// (16 (s % 4), 32 (s / 4)) as 1 x 2 fragments. k goes in slices of 32, staged in shared memory with
// k contiguous (each invocation gathers 8 consecutive k of one row of A and of one column of B,
// their tensor coordinates decoded once and stepped, and stores them as one 16-byte chunk), the next slice read into registers while the current one is
// multiplied. Results leave through a per-subgroup 16 x 16 f32 scratch: rounded to f16 with
// conv2d's epilogue where the reduction is whole, else as f32 partial sums for sum_splits.comp.
#version 450
#if defined(KHR_COOPMAT)
#extension GL_KHR_cooperative_matrix : require
#else
#extension GL_NV_cooperative_matrix : require
#endif
#extension GL_KHR_memory_scope_semantics : require
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
#extension GL_EXT_shader_16bit_storage : require
#extension GL_EXT_control_flow_attributes : require
#extension GL_GOOGLE_include_directive : require  // glslangValidator does not imply it, as glslc does
#include "common.glsl"

layout(buffer_reference, std430, buffer_reference_align = 2) buffer Halfs { float16_t v[]; };

#define INPUTS Halfs
#define OUTPUTS Halfs
#include "conv2d_gemm.glsl"

#define ELEMENT float16_t
#include "coopmat.glsl"

const uint BM = 64, BN = 64, BK = 32;
const uint CHUNKS = (BK + 8) / 8;  // 16-byte chunks per staged row: BK halves and 8 of padding,
                                   // which spread the fragments' rows over the banks
shared uvec4 As[BM * CHUNKS];      // [row][k]
shared uvec4 Bs[BN * CHUNKS];      // [column][k]
shared float scratch[8 * 256];     // each subgroup's 16 x 16 fragment on its way out, column-major

uvec4 pack_chunk(float e[8]) {
    return uvec4(packFloat2x16(f16vec2(e[0], e[1])), packFloat2x16(f16vec2(e[2], e[3])),
                 packFloat2x16(f16vec2(e[4], e[5])), packFloat2x16(f16vec2(e[6], e[7])));
}

// This invocation's chunks of a slice: k k0 + 8 q.. of its row of A and of column col of B, zero
// past the reduction's end or the output's; the 8 positions walked from one decoded k.
void load_slice(Row row, uint col, uint q, uint k0, uint k_end, out uvec4 a, out uvec4 b) {
    a = uvec4(0);
    b = uvec4(0);
    uint k = k0 + 8 * q;
    if (k >= k_end) return;
    float ea[8], eb[8];
    bool col_valid = col < pc.cols;
    Walk w = walk_at(k);
    [[unroll]] for (uint e = 0; e < 8; ++e) {
        bool inside = k + e < k_end;
        ea[e] = (row.valid && inside) ? load_a(row, w) : 0.0;
        eb[e] = (col_valid && inside) ? load_b(w, col) : 0.0;
        walk_step(w);
    }
    a = pack_chunk(ea);
    b = pack_chunk(eb);
}

// Writes fragment f, the output block at GEMM rows i0.., columns j0.., through subgroup s's scratch.
void store_fragment(FRAGMENT_C f, uint i0, uint j0, uint s, bool partial) {
    STORE_FRAGMENT(f, scratch, 256 * s, 16, COLUMN_MAJOR);
    subgroupMemoryBarrierShared();
    subgroupBarrier();
    uint rows = gemm_rows();
    for (uint e = gl_SubgroupInvocationID; e < 256; e += 32) {
        uint i = i0 + e % 16, j = j0 + e / 16;
        if (i >= rows || j >= pc.cols) continue;
        float v = scratch[256 * s + e];
        if (partial) Floats(uint64_t(pc.o)).v[split() * output_elements() + output_index(i, j)] = v;
        else pc.o.v[output_index(i, j)] = float16_t(epilogue(v, j));
    }
    subgroupBarrier();
}

void main() {
    uint tile = flat_group();
    uint row0 = (tile % pc.groups_m) * BM, col0 = (tile / pc.groups_m) * BN;
    uint t = gl_LocalInvocationID.x, s = gl_SubgroupID;
    uint wm = 16 * (s % 4), wn = 32 * (s / 4);  // this subgroup's corner in the tile
    uint k_total = setup();
    uint k_begin = min(split() * pc.split_k, k_total), k_end = min(k_total, k_begin + pc.split_k);
    // the row of A and the column of B this invocation stages, and which chunk of k
    uint r = t % BM, q = t / BM;
    Row row = row_of(row0 + r);

    FRAGMENT_C c0 = FRAGMENT_C(0.0);
    FRAGMENT_C c1 = FRAGMENT_C(0.0);
    uvec4 next_a, next_b;
    load_slice(row, col0 + r, q, k_begin, k_end, next_a, next_b);
    for (uint k0 = k_begin; k0 < k_end; k0 += BK) {
        As[r * CHUNKS + q] = next_a;
        Bs[r * CHUNKS + q] = next_b;
        barrier();
        if (k0 + BK < k_end) load_slice(row, col0 + r, q, k0 + BK, k_end, next_a, next_b);  // in flight while multiplying
        [[unroll]] for (uint kk = 0; kk < BK; kk += 16) {
            FRAGMENT_A a;
            FRAGMENT_B b0;
            FRAGMENT_B b1;
            LOAD_FRAGMENT(a, As, wm * CHUNKS + kk / 8, CHUNKS, ROW_MAJOR);
            LOAD_FRAGMENT(b0, Bs, wn * CHUNKS + kk / 8, CHUNKS, COLUMN_MAJOR);
            LOAD_FRAGMENT(b1, Bs, (wn + 16) * CHUNKS + kk / 8, CHUNKS, COLUMN_MAJOR);
            c0 = MUL_ADD(a, b0, c0);
            c1 = MUL_ADD(a, b1, c1);
        }
        barrier();
    }
    bool partial = gl_NumWorkGroups.z > phases();
    store_fragment(c0, row0 + wm, col0 + wn, s, partial);
    store_fragment(c1, row0 + wm, col0 + wn + 16, s, partial);
}
