// C[m, n] = op(A)[m, k] @ op(B)[k, n] for f16 (or, variant BF16, bf16) A, B and C with f32
// accumulation, on cooperative matrices (tensor cores): matmul.comp's push constants and LINEAR
// epilogue (bias of A's dtype here). Used only where the device lists 16x16x16 fragments of that
// type with f32 sums and runs 32-invocation subgroups (vk_context.cpp): the 256 invocations are
// 8 subgroups.
// A workgroup computes a 128 x 256 tile; subgroup s owns the 64 x 64 block at
// (64 (s % 2), 64 (s / 2)) as 4 x 4 fragments (each B fragment read from shared memory serves
// four products, each A fragment four: 128 x 128 tiles of 4 x 2 fragments reached 48 TFLOP/s at
// 4096 on the H200, these 61, 84 with the branch-free reads below). k goes in slices of 32, staged
// in shared memory as 8-element (16-byte) chunks along each operand's contiguous dimension, so a
// transposed operand (variants TRANSPOSE_A, TRANSPOSE_B) is loaded row-major instead of being
// transposed; the next slice is read into registers while the current one is multiplied (48 KiB
// of shared memory, NVIDIA Vulkan's limit, leaves no room for a second slice). Results leave
// through a per-subgroup 16 x 16 f32 scratch, where edges are clipped and the epilogue applied.
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
#if defined(BF16)
#extension GL_EXT_bfloat16 : require
#define ELEMENT bfloat16_t
#else
#define ELEMENT float16_t
#endif
#include "common.glsl"

layout(buffer_reference, std430, buffer_reference_align = 2) buffer Halfs { ELEMENT v[]; };
layout(buffer_reference, std430, buffer_reference_align = 16) buffer Chunks { uvec4 v[]; };

layout(push_constant) uniform Push {
    Halfs a;
    Halfs b;
    Halfs c;
    uint m, n, k;
    uint lda, ldb;
    uint ta, tb;
    uint ne2;              // output batch size along dim 2
    uint sa2, sa3, sb2, sb3;  // element strides between batch slices (0 where broadcast)
    uint groups_m;         // tiles along m
    uint split_k;          // matmul_small.comp's (the host's MatmulPush), unused here
    Halfs bias;            // LINEAR only
    uint activation;       // LINEAR only: 0 none, 1 relu, 2 tanh, 3 sigmoid
    uint chunked;          // bit 0: A, bit 1: B may be read as whole 16-byte chunks (aligned, lda % 8 == 0)
} pc;

float epilogue(float acc, uint i) {
#if defined(LINEAR)
    return linear_activation(pc.activation, acc + float(pc.bias.v[i]));
#else
    return acc;
#endif
}

const uint BM = 128, BN = 256, BK = 32;  // 8 subgroups as 2 x 4, each 64 x 64: 4 x 4 fragments
// Shared slices in chunks of 8 halves; a slice is [BK][BM + 8] (rows contiguous) or [BM][BK + 8]
// (k contiguous), the 8 halves of padding spreading fragment rows over the banks.
const uint WIDE_A = (BM + 8) / 8, WIDE_B = (BN + 8) / 8, NARROW = (BK + 8) / 8;  // chunks per shared row
const uint LOADS_A = BM * BK / 8 / 256, LOADS_B = BN * BK / 8 / 256;  // chunks each invocation stages
shared uvec4 As[max(BK * WIDE_A, BM * NARROW)];
shared uvec4 Bs[max(BK * WIDE_B, BN * NARROW)];
shared float scratch[8 * 256];  // each subgroup's 16 x 16 fragment on its way out, column-major

#include "coopmat.glsl"

// Eight 16-bit elements at element `at` along a contiguous dimension, zero past `limit` there or
// where the other index is out of range: one 16-byte read where allowed (`whole`), else each
// element's bits from the 32-bit word that holds it (the same for f16 and bf16; bit casts of a
// bfloat16_t would need 16-bit integers, a device feature rlkit does not ask for).
uint read_bits(Halfs src, uint at, uint index, uint limit) {
    if (index >= limit) return 0u;
    uint64_t byte = uint64_t(src) + 2 * uint64_t(at);
    // (The word's address as `byte & ~3` gave wrong products in the VK_NV_cooperative_matrix build
    // on the H200; the KHR build was right with either.)
    uint word = Words(byte - (byte & 3ul)).v[0];
    return (byte & 2) != 0 ? word >> 16 : word & 0xffffu;
}

uint read_pair(Halfs src, uint at, uint start, uint limit) {
    return read_bits(src, at, start, limit) | (read_bits(src, at + 1, start + 1, limit) << 16);
}

uvec4 read_chunk(Halfs src, bool whole, uint at, uint start, uint limit, bool inside) {
    bool wanted = inside && start < limit;
    if (whole) {
        // Without a branch: a chunk is wholly inside or outside (the leading dimension is a multiple
        // of 8), one outside reads element 0 instead and is replaced by zeros. NVIDIA's compiler
        // waits for a load inside a branch where the branch joins (63 -> 74 TFLOP/s at 4096 on the H200).
        uvec4 chunk = Chunks(uint64_t(src) + 2 * uint64_t(wanted ? at : 0)).v[0];
        return wanted ? chunk : uvec4(0);
    }
    if (!wanted) return uvec4(0);
    return uvec4(read_pair(src, at, start, limit), read_pair(src, at + 2, start + 2, limit),
                 read_pair(src, at + 4, start + 4, limit), read_pair(src, at + 6, start + 6, limit));
}

// The staging layouts and fragment loads are fixed per variant (TRANSPOSE_A, TRANSPOSE_B): no
// branch around a cooperative-matrix load.

// Chunk c (0..511) of A's slice at k = p0, and where it goes in As.
uvec4 read_a(bool whole, uint c, uint base, uint row0, uint p0, out uint slot) {
#if !defined(TRANSPOSE_A)
    uint r = c % (BM / 8), p = c / (BM / 8), i = row0 + 8 * r;  // rows contiguous: (rows 8 r.., column p)
    slot = p * WIDE_A + r;
    return read_chunk(pc.a, whole, base + i + (p0 + p) * pc.lda, i, pc.m, p0 + p < pc.k);
#else
    uint q = c % (BK / 8), i = c / (BK / 8), p = p0 + 8 * q;  // k contiguous: (row i, k 8 q..)
    slot = i * NARROW + q;
    return read_chunk(pc.a, whole, base + p + (row0 + i) * pc.lda, p, pc.k, row0 + i < pc.m);
#endif
}

uvec4 read_b(bool whole, uint c, uint base, uint col0, uint p0, out uint slot) {
#if !defined(TRANSPOSE_B)
    uint q = c % (BK / 8), j = c / (BK / 8), p = p0 + 8 * q;  // k contiguous: (k 8 q.., column j)
    slot = j * NARROW + q;
    return read_chunk(pc.b, whole, base + p + (col0 + j) * pc.ldb, p, pc.k, col0 + j < pc.n);
#else
    uint r = c % (BN / 8), p = c / (BN / 8), j = col0 + 8 * r;  // columns contiguous: (k p, columns 8 r..)
    slot = p * WIDE_B + r;
    return read_chunk(pc.b, whole, base + j + (p0 + p) * pc.ldb, j, pc.n, p0 + p < pc.k);
#endif
}

// A's 16 x 16 fragment at rows i.., k kk.. of the staged slice; B's at k kk.., columns j...
FRAGMENT_A a_fragment(uint i, uint kk) {
    FRAGMENT_A f;
#if !defined(TRANSPOSE_A)
    LOAD_FRAGMENT(f, As, kk * WIDE_A + i / 8, WIDE_A, COLUMN_MAJOR);
#else
    LOAD_FRAGMENT(f, As, i * NARROW + kk / 8, NARROW, ROW_MAJOR);
#endif
    return f;
}

FRAGMENT_B b_fragment(uint kk, uint j) {
    FRAGMENT_B f;
#if !defined(TRANSPOSE_B)
    LOAD_FRAGMENT(f, Bs, j * NARROW + kk / 8, NARROW, COLUMN_MAJOR);
#else
    LOAD_FRAGMENT(f, Bs, kk * WIDE_B + j / 8, WIDE_B, ROW_MAJOR);
#endif
    return f;
}

// Writes fragment f, the output block at rows i0.., columns j0.., through subgroup s's scratch:
// clipped at the edges, the epilogue applied, rounded to f16 (bf16).
void store_fragment(FRAGMENT_C f, uint i0, uint j0, uint base_c, uint s) {
    STORE_FRAGMENT(f, scratch, 256 * s, 16, COLUMN_MAJOR);
    subgroupMemoryBarrierShared();
    subgroupBarrier();
    for (uint e = gl_SubgroupInvocationID; e < 256; e += 32) {
        uint i = i0 + e % 16, j = j0 + e / 16;
        if (i < pc.m && j < pc.n) pc.c.v[base_c + i + j * pc.m] = ELEMENT(epilogue(scratch[256 * s + e], i));
    }
    subgroupBarrier();
}

// The workgroup's output tile. whole_a, whole_b: whether A and B are read in whole chunks, constants
// in the CHUNKED variants (for operands that both allow it), which keep only the chunk reads. (Both
// paths in one shader, chosen at run time, made NVIDIA's compiler slow the chunked one to 63 TFLOP/s.)
void multiply_tile(bool whole_a, bool whole_b) {
    uint tile = flat_group();
    uint row0 = (tile % pc.groups_m) * BM, col0 = (tile / pc.groups_m) * BN;
    uint z = gl_WorkGroupID.z;
    uint i2 = z % pc.ne2, i3 = z / pc.ne2;
    uint base_a = i2 * pc.sa2 + i3 * pc.sa3, base_b = i2 * pc.sb2 + i3 * pc.sb3;
    uint base_c = z * pc.m * pc.n;
    uint t = gl_LocalInvocationID.x;
    uint s = gl_SubgroupID;
    uint wm = 64 * (s % 2), wn = 64 * (s / 2);  // this subgroup's corner in the tile

    // The accumulators are named, not an array: NVIDIA's compiler kept an array of cooperative
    // matrices in local memory (about 30 TFLOP/s instead of tensor-core rates).
    // (One declaration each: glslang 13 misreads a list of cooperative-matrix declarators.)
#define DECLARE_ROW(r) FRAGMENT_C c##r##0 = FRAGMENT_C(0.0); FRAGMENT_C c##r##1 = FRAGMENT_C(0.0); \
                       FRAGMENT_C c##r##2 = FRAGMENT_C(0.0); FRAGMENT_C c##r##3 = FRAGMENT_C(0.0);
#define ROW_MMA(r) a = a_fragment(wm + 16 * r, kk);                                              \
                   c##r##0 = MUL_ADD(a, b0, c##r##0); c##r##1 = MUL_ADD(a, b1, c##r##1);      \
                   c##r##2 = MUL_ADD(a, b2, c##r##2); c##r##3 = MUL_ADD(a, b3, c##r##3);
#define ROW_STORE(r) store_fragment(c##r##0, i0 + 16 * r, j0, base_c, s);                        \
                     store_fragment(c##r##1, i0 + 16 * r, j0 + 16, base_c, s);                   \
                     store_fragment(c##r##2, i0 + 16 * r, j0 + 32, base_c, s);                   \
                     store_fragment(c##r##3, i0 + 16 * r, j0 + 48, base_c, s);
    DECLARE_ROW(0)
    DECLARE_ROW(1)
    DECLARE_ROW(2)
    DECLARE_ROW(3)

    uvec4 next_a[LOADS_A], next_b[LOADS_B];
    uint slot_a[LOADS_A], slot_b[LOADS_B];
    [[unroll]] for (uint l = 0; l < LOADS_A; ++l) next_a[l] = read_a(whole_a, t + 256 * l, base_a, row0, 0, slot_a[l]);
    [[unroll]] for (uint l = 0; l < LOADS_B; ++l) next_b[l] = read_b(whole_b, t + 256 * l, base_b, col0, 0, slot_b[l]);

    for (uint p0 = 0; p0 < pc.k; p0 += BK) {
        [[unroll]] for (uint l = 0; l < LOADS_A; ++l) As[slot_a[l]] = next_a[l];
        [[unroll]] for (uint l = 0; l < LOADS_B; ++l) Bs[slot_b[l]] = next_b[l];
        barrier();
        // The next slice, read while this one is multiplied; past the last slice it is all zeros,
        // read without a branch (63 -> 86 TFLOP/s at 4096 on the H200 with the chunk reads above).
        uint next_p0 = min(p0 + BK, pc.k);
        [[unroll]] for (uint l = 0; l < LOADS_A; ++l)
            next_a[l] = read_a(whole_a, t + 256 * l, base_a, row0, next_p0, slot_a[l]);
        [[unroll]] for (uint l = 0; l < LOADS_B; ++l)
            next_b[l] = read_b(whole_b, t + 256 * l, base_b, col0, next_p0, slot_b[l]);
        [[unroll]] for (uint kk = 0; kk < BK; kk += 16) {
            FRAGMENT_B b0 = b_fragment(kk, wn);
            FRAGMENT_B b1 = b_fragment(kk, wn + 16);
            FRAGMENT_B b2 = b_fragment(kk, wn + 32);
            FRAGMENT_B b3 = b_fragment(kk, wn + 48);
            FRAGMENT_A a;
            ROW_MMA(0)
            ROW_MMA(1)
            ROW_MMA(2)
            ROW_MMA(3)
        }
        barrier();
    }

    uint i0 = row0 + wm, j0 = col0 + wn;
    ROW_STORE(0)
    ROW_STORE(1)
    ROW_STORE(2)
    ROW_STORE(3)
}

void main() {
#if defined(CHUNKED)
    multiply_tile(true, true);
#else
    multiply_tile((pc.chunked & 1) != 0, (pc.chunked & 2) != 0);
#endif
}
