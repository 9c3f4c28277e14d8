// 2-D convolution of images [W, H, C, N] (ne order, dim 0 fastest) with kernels [KW, KH, C_in,
// C_out], and its two backward helpers, summed in f32 on SIMT tiles: the implicit GEMMs of
// conv2d_gemm.glsl (FORWARD, BACK_INPUT, BACK_WEIGHT), their operands read straight from the
// tensors (no patch matrix in memory).
// Tiles of BM x BN outputs per workgroup, k in slices of BK staged in shared memory; each of the
// 256 invocations (16 x 16) computes TM x TN outputs, rows tx + 16 r and columns ty + 16 q. An
// invocation stages the same row of A at every slice, so the row's pixel or tap is decoded once,
// and reads the next slice into registers while the current one is summed.
#version 450
#extension GL_EXT_control_flow_attributes : require
#include "common.glsl"

#define INPUTS Floats
#define OUTPUTS Floats
#include "conv2d_gemm.glsl"

const uint TM = 4, TN = 2;
const uint BM = 16 * TM, BN = 16 * TN, BK = 16;
const uint LOADS_A = BM * BK / 256, LOADS_B = BK * BN / 256;

shared float As[BK][BM];
shared float Bs[BK][BN + 1];  // one float of padding: the stores of a column step along k

// The output element (r, col) of this slice: where the reduction is split, a partial sum, else
// the whole sum with conv2d's epilogue.
void store(uint r, uint col, float v) {
    if (gl_NumWorkGroups.z > phases()) pc.o.v[split() * output_elements() + output_index(r, col)] = v;
    else pc.o.v[output_index(r, col)] = epilogue(v, col);
}

// This invocation's share of a slice of A and B (rows of A by row_of, elements of B consecutive
// along k), zero past the reduction's end or the output's.
void load_slice(Row row, uint col0, uint k0, uint k_end, inout float a[LOADS_A], inout float b[LOADS_B]) {
    uint t = gl_LocalInvocationID.x;
    [[unroll]] for (uint l = 0; l < LOADS_A; ++l) {
        uint kk = t / BM + (256 / BM) * l;
        a[l] = (row.valid && k0 + kk < k_end) ? load_a(row, walk_at(k0 + kk)) : 0.0;
    }
    [[unroll]] for (uint l = 0; l < LOADS_B; ++l) {
        uint e = t + 256 * l, kk = e % BK, col = e / BK;
        b[l] = (k0 + kk < k_end && col0 + col < pc.cols) ? load_b(walk_at(k0 + kk), col0 + col) : 0.0;
    }
}

void main() {
    uint tile = flat_group();
    uint row0 = (tile % pc.groups_m) * BM, col0 = (tile / pc.groups_m) * BN;
    uint t = gl_LocalInvocationID.x, tx = t % 16, ty = t / 16;
    uint k_total = setup();
    uint k_begin = min(split() * pc.split_k, k_total), k_end = min(k_total, k_begin + pc.split_k);
    // the row of A this invocation stages (element t + 256 l of a slice: row t % BM, k t / BM + 4 l)
    Row row = row_of(row0 + t % BM);

    float acc[TM][TN];
    [[unroll]] for (uint r = 0; r < TM; ++r)
        [[unroll]] for (uint q = 0; q < TN; ++q) acc[r][q] = 0.0;

    float next_a[LOADS_A], next_b[LOADS_B];
    load_slice(row, col0, k_begin, k_end, next_a, next_b);
    for (uint k0 = k_begin; k0 < k_end; k0 += BK) {
        [[unroll]] for (uint l = 0; l < LOADS_A; ++l) As[t / BM + (256 / BM) * l][t % BM] = next_a[l];
        [[unroll]] for (uint l = 0; l < LOADS_B; ++l) {
            uint e = t + 256 * l;
            Bs[e % BK][e / BK] = next_b[l];
        }
        barrier();
        if (k0 + BK < k_end) load_slice(row, col0, k0 + BK, k_end, next_a, next_b);  // in flight while summing
        [[unroll]] for (uint p = 0; p < BK; ++p) {
            float av[TM], bv[TN];
            [[unroll]] for (uint r = 0; r < TM; ++r) av[r] = As[p][tx + 16 * r];
            [[unroll]] for (uint q = 0; q < TN; ++q) bv[q] = Bs[p][ty + 16 * q];
            [[unroll]] for (uint r = 0; r < TM; ++r)
                [[unroll]] for (uint q = 0; q < TN; ++q) acc[r][q] += av[r] * bv[q];
        }
        barrier();
    }
    [[unroll]] for (uint q = 0; q < TN; ++q) {
        uint col = col0 + ty + 16 * q;
        if (col >= pc.cols) continue;
        [[unroll]] for (uint r = 0; r < TM; ++r) {
            uint i = row0 + tx + 16 * r;
            if (i < gemm_rows()) store(i, col, acc[r][q]);
        }
    }
}
