// C[m, n] = op(A)[m, k] @ op(B)[k, n] in f32 for outputs too small to fill the GPU with 64 x 64
// tiles (an RL network's layers at batch 64: a [256, 64] output is 4 such tiles, 4 busy
// multiprocessors of 132, each walking all of k). Here a workgroup takes a 16 x 16 tile, so the
// same output spreads over 16 times more workgroups. k goes in slices of 64 (four reads in flight
// per invocation and operand), and the next slice is read into registers while the current one
// is summed. The sums are bound by shared-memory reads: each quarter of the workgroup takes a
// quarter of every slice's k, and each invocation a 2 x 2 block of outputs, reading two pairs
// (one 8-byte read each) per four multiply-adds, where one output per invocation read two
// floats per multiply-add (a 256 x 256 x 256 product took 5.5 us on the H200); the quarters'
// sums are added in shared memory at the end. LINEAR as in matmul.comp.
// Where even 16 x 16 tiles are few and k is long (a 3136-input layer at batch 32), k is cut into
// z slices of pc.split_k (a multiple of BK): z = batch slice + batch slices x k slice, each
// writing its partial product from pc.c on; sum_splits.comp adds them in order (and applies
// LINEAR's epilogue, so the split kernel is the plain one). RELU_MASK (matmul_relu_mask, unsplit
// products only): C where matmul_relu_mask's y > 0, else 0, relu_back's value on the product.
#version 450
#extension GL_EXT_control_flow_attributes : require
#include "common.glsl"
#include "matmul_common.glsl"

const uint TILE = 16, BK = 64, QUARTER = BK / 4;
const uint LOADS = TILE * BK / 256;  // elements of each operand an invocation stages per slice

// Pairs of rows (As) and of columns (Bs) along the tile, one pair of padding per k: a row of 18
// floats keeps the transposed operands' stores on different banks and the pairs 8-byte aligned.
shared vec2 As[BK][TILE / 2 + 1];
shared vec2 Bs[BK][TILE / 2 + 1];
shared float sums[4][TILE * TILE];  // each quarter's sums of the tile's outputs

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
    // this invocation's quarter of k, and its outputs: rows 2 tx, 2 tx + 1 and columns 2 ty, 2 ty + 1 of the tile
    uint quarter = t / 64, tx = t % 8, ty = (t % 64) / 8;

    float next_a[LOADS], next_b[LOADS];
    [[unroll]] for (uint l = 0; l < LOADS; ++l) {
        uvec2 sa = a_slot(t + 256 * l), sb = b_slot(t + 256 * l);
        next_a[l] = load_a(base_a, row0 + sa.x, k_begin + sa.y);
        next_b[l] = load_b(base_b, k_begin + sb.y, col0 + sb.x);
    }
    vec2 acc0 = vec2(0.0), acc1 = vec2(0.0);  // column 2 ty, column 2 ty + 1 (rows 2 tx, 2 tx + 1 each)
    for (uint p0 = k_begin; p0 < k_end; p0 += BK) {
        [[unroll]] for (uint l = 0; l < LOADS; ++l) {
            uvec2 sa = a_slot(t + 256 * l), sb = b_slot(t + 256 * l);
            As[sa.y][sa.x / 2][sa.x % 2] = next_a[l];
            Bs[sb.y][sb.x / 2][sb.x % 2] = next_b[l];
        }
        barrier();
        if (p0 + BK < k_end) {
            [[unroll]] for (uint l = 0; l < LOADS; ++l) {
                uvec2 sa = a_slot(t + 256 * l), sb = b_slot(t + 256 * l);
                next_a[l] = load_a(base_a, row0 + sa.x, p0 + BK + sa.y);
                next_b[l] = load_b(base_b, p0 + BK + sb.y, col0 + sb.x);
            }
        }
        [[unroll]] for (uint q = 0; q < QUARTER; ++q) {  // zeros past k
            uint p = quarter * QUARTER + q;
            vec2 a = As[p][tx], b = Bs[p][ty];
            acc0 += a * b.x;
            acc1 += a * b.y;
        }
        barrier();
    }
    uint out0 = 2 * tx + 2 * ty * TILE;  // the tile's element (2 tx, 2 ty), column-major
    sums[quarter][out0] = acc0.x;
    sums[quarter][out0 + 1] = acc0.y;
    sums[quarter][out0 + TILE] = acc1.x;
    sums[quarter][out0 + TILE + 1] = acc1.y;
    barrier();
    uint i = row0 + t % TILE, j = col0 + t / TILE;
    float acc = ((sums[0][t] + sums[1][t]) + sums[2][t]) + sums[3][t];
    if (i >= pc.m || j >= pc.n) return;
    uint e = base_c + i + j * pc.m;
#if defined(RELU_MASK)
    pc.c.v[e] = pc.mask.v[e] > 0.0 ? acc : 0.0;  // relu_back's value (binary.comp's, y NaN gives 0)
#else
    pc.c.v[e] = epilogue(acc, i);
#endif
}
