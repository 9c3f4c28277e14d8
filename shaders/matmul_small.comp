// C[m, n] = op(A)[m, k] @ op(B)[k, n] in f32 for outputs too small to fill the GPU with 64 x 64
// tiles (an RL network's layers at batch 64: a [256, 64] output is 4 such tiles, 4 busy
// multiprocessors of 132, each walking all of k). Here a workgroup takes a 16 x 16 tile and each
// of its 256 invocations one element, so the same output spreads over 16 times more workgroups.
// Such a kernel waits on device reads, not arithmetic: k goes in slices of 64 (four reads in
// flight per invocation and operand), and the next slice is read into registers while the
// current one is summed. LINEAR as in matmul.comp.
// Where even 16 x 16 tiles are few and k is long (a 3136-input layer at batch 32), k is cut into
// z slices of pc.split_k (a multiple of BK): z = batch slice + batch slices x k slice, each
// writing its partial product from pc.c on; sum_splits.comp adds them in order (and applies
// LINEAR's epilogue, so the split kernel is the plain one).
#version 450
#extension GL_EXT_control_flow_attributes : require
#include "common.glsl"
#include "matmul_common.glsl"

const uint TILE = 16, BK = 64;
const uint LOADS = TILE * BK / 256;  // elements of each operand an invocation stages per slice

// One padding column keeps the transposed operands' stores off a single bank.
shared float As[BK][TILE + 1];
shared float Bs[BK][TILE + 1];

// Element e of a slice as (row or column within the tile, k within the slice): consecutive
// invocations take consecutive elements along the operand's contiguous dimension (rows of A,
// k of B, unless transposed), so device reads coalesce.
uvec2 a_slot(uint e) { return pc.ta == 0 ? uvec2(e % TILE, e / TILE) : uvec2(e / BK, e % BK); }
uvec2 b_slot(uint e) { return pc.tb == 0 ? uvec2(e / BK, e % BK) : uvec2(e % TILE, e / TILE); }

void main() {
    uint tile = flat_group();
    uint row0 = (tile % pc.groups_m) * TILE, col0 = (tile / pc.groups_m) * TILE;
    uint z = gl_WorkGroupID.z;
    uint splits = (pc.k + pc.split_k - 1) / pc.split_k, batches = gl_NumWorkGroups.z / max(splits, 1u);
    uint batch = z % batches, k_begin = (z / batches) * pc.split_k, k_end = min(pc.k, k_begin + pc.split_k);
    uint i2 = batch % pc.ne2, i3 = batch / pc.ne2;
    uint base_a = i2 * pc.sa2 + i3 * pc.sa3, base_b = i2 * pc.sb2 + i3 * pc.sb3;
    uint base_c = z * pc.m * pc.n;  // the batch slice's output, after those of the earlier k slices
    uint t = gl_LocalInvocationID.x;
    uint tx = t % TILE, ty = t / TILE;  // this invocation's output: row row0 + tx, column col0 + ty

    float next_a[LOADS], next_b[LOADS];
    [[unroll]] for (uint l = 0; l < LOADS; ++l) {
        uvec2 sa = a_slot(t + 256 * l), sb = b_slot(t + 256 * l);
        next_a[l] = load_a(base_a, row0 + sa.x, k_begin + sa.y);
        next_b[l] = load_b(base_b, k_begin + sb.y, col0 + sb.x);
    }
    float acc = 0.0;
    for (uint p0 = k_begin; p0 < k_end; p0 += BK) {
        [[unroll]] for (uint l = 0; l < LOADS; ++l) {
            uvec2 sa = a_slot(t + 256 * l), sb = b_slot(t + 256 * l);
            As[sa.y][sa.x] = next_a[l];
            Bs[sb.y][sb.x] = next_b[l];
        }
        barrier();
        if (p0 + BK < k_end) {
            [[unroll]] for (uint l = 0; l < LOADS; ++l) {
                uvec2 sa = a_slot(t + 256 * l), sb = b_slot(t + 256 * l);
                next_a[l] = load_a(base_a, row0 + sa.x, p0 + BK + sa.y);
                next_b[l] = load_b(base_b, p0 + BK + sb.y, col0 + sb.x);
            }
        }
        [[unroll]] for (uint p = 0; p < BK; ++p) acc += As[p][tx] * Bs[p][ty];  // zeros past k
        barrier();
    }
    uint i = row0 + tx, j = col0 + ty;
    if (i < pc.m && j < pc.n) pc.c.v[base_c + i + j * pc.m] = epilogue(acc, i);
}
