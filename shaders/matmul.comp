// C[m, n] = op(A)[m, k] @ op(B)[k, n] in f32, column-major, op = transpose when ta / tb.
// LINEAR: C = act(A @ B + bias) with bias [m] and act (pc.activation) none, relu, tanh or sigmoid,
// applied to the accumulators before they are stored (the linear op: one kernel, not three).
// The SIMT kernel: BM x BN output tiles per workgroup (64 x 64, or 128 x 128 with LARGE_TILE),
// k in slices of 16 staged in shared memory, each of the 256 invocations (16 x 16) computing a
// TM x TN block of 4-row by 4-column groups in registers; the next slice is read from device
// memory into registers while the current one is multiplied. Batch slices along z (dims 2 and 3,
// broadcast where a side has size 1).
#version 450
#extension GL_EXT_control_flow_attributes : require
#include "common.glsl"
#include "matmul_common.glsl"

#if defined(LARGE_TILE)
const uint TM = 8, TN = 8;  // rows and columns per invocation: 128 x 128 tiles, for large outputs
#else
const uint TM = 4, TN = 4;  // 64 x 64 tiles, for outputs too small to fill the GPU with large ones
#endif
const uint BM = 16 * TM, BN = 16 * TN, BK = 16;
const uint LOADS_A = BM * BK / 256, LOADS_B = BK * BN / 256;  // elements each invocation stages

// Each invocation reads vec4s of 4 consecutive rows (columns); one vec4 of padding per slice row
// keeps the stores of transposed operands off a single bank.
shared vec4 As[BK][BM / 4 + 1];
shared vec4 Bs[BK][BN / 4 + 1];

// Element e of a tile's staged slice as (row or column index, k index): consecutive invocations
// take consecutive elements along the operand's contiguous dimension, so device reads coalesce.
uvec2 a_slot(uint e) { return pc.ta == 0 ? uvec2(e % BM, e / BM) : uvec2(e / BK, e % BK); }
uvec2 b_slot(uint e) { return pc.tb == 0 ? uvec2(e / BK, e % BK) : uvec2(e % BN, e / BN); }

void main() {
    uint tile = flat_group();
    uint row0 = (tile % pc.groups_m) * BM, col0 = (tile / pc.groups_m) * BN;
    uint z = gl_WorkGroupID.z;
    uint i2 = z % pc.ne2, i3 = z / pc.ne2;
    uint base_a = i2 * pc.sa2 + i3 * pc.sa3, base_b = i2 * pc.sb2 + i3 * pc.sb3;
    uint base_c = z * pc.m * pc.n;
    uint t = gl_LocalInvocationID.x;
    // this invocation computes rows 4 (16 r + tx) + 0..3 and columns 4 (16 q + ty) + 0..3
    uint tx = t % 16, ty = t / 16;

    float acc[TM][TN];
    [[unroll]] for (uint r = 0; r < TM; ++r)
        [[unroll]] for (uint q = 0; q < TN; ++q) acc[r][q] = 0.0;

    float next_a[LOADS_A], next_b[LOADS_B];
    [[unroll]] for (uint l = 0; l < LOADS_A; ++l) {
        uvec2 s = a_slot(t + 256 * l);
        next_a[l] = load_a(base_a, row0 + s.x, s.y);
    }
    [[unroll]] for (uint l = 0; l < LOADS_B; ++l) {
        uvec2 s = b_slot(t + 256 * l);
        next_b[l] = load_b(base_b, s.y, col0 + s.x);
    }

    for (uint p0 = 0; p0 < pc.k; p0 += BK) {
        [[unroll]] for (uint l = 0; l < LOADS_A; ++l) {
            uvec2 s = a_slot(t + 256 * l);
            As[s.y][s.x / 4][s.x % 4] = next_a[l];
        }
        [[unroll]] for (uint l = 0; l < LOADS_B; ++l) {
            uvec2 s = b_slot(t + 256 * l);
            Bs[s.y][s.x / 4][s.x % 4] = next_b[l];
        }
        barrier();
        if (p0 + BK < pc.k) {
            [[unroll]] for (uint l = 0; l < LOADS_A; ++l) {
                uvec2 s = a_slot(t + 256 * l);
                next_a[l] = load_a(base_a, row0 + s.x, p0 + BK + s.y);
            }
            [[unroll]] for (uint l = 0; l < LOADS_B; ++l) {
                uvec2 s = b_slot(t + 256 * l);
                next_b[l] = load_b(base_b, p0 + BK + s.y, col0 + s.x);
            }
        }
        [[unroll]] for (uint p = 0; p < BK; ++p) {
            vec4 av[TM / 4], bv[TN / 4];
            [[unroll]] for (uint r = 0; r < TM / 4; ++r) av[r] = As[p][16 * r + tx];
            [[unroll]] for (uint q = 0; q < TN / 4; ++q) bv[q] = Bs[p][16 * q + ty];
            [[unroll]] for (uint r = 0; r < TM; ++r)
                [[unroll]] for (uint q = 0; q < TN; ++q) acc[r][q] += av[r / 4][r % 4] * bv[q / 4][q % 4];
        }
        barrier();
    }
    [[unroll]] for (uint q = 0; q < TN; ++q) {
        uint j = col0 + 4 * (16 * (q / 4) + ty) + q % 4;
        if (j >= pc.n) continue;
        [[unroll]] for (uint r = 0; r < TM; ++r) {
            uint i = row0 + 4 * (16 * (r / 4) + tx) + r % 4;
            if (i < pc.m) pc.c.v[base_c + i + j * pc.m] = epilogue(acc[r][q], i);
        }
    }
}
