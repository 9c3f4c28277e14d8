// C[m, n] = op(A)[m, k] @ op(B)[k, n], column-major, op = transpose when ta / tb.
// LINEAR: C = act(A @ B + bias) with bias [m] and act (pc.activation) none, relu, tanh or sigmoid,
// applied to the accumulators before they are stored (the linear op: one kernel, not three).
// 64 x 64 output tiles per workgroup, k in slices of 16 staged in shared memory (8.5 KiB), each
// of the 256 invocations computing a 4 x 4 block; batch slices along z (dims 2 and 3,
// broadcast where a side has size 1).
#version 450
#include "common.glsl"

layout(push_constant) uniform Push {
    Floats a;
    Floats b;
    Floats c;
    uint m, n, k;
    uint lda, ldb;
    uint ta, tb;
    uint ne2;              // output batch size along dim 2
    uint sa2, sa3, sb2, sb3;  // element strides between batch slices (0 where broadcast)
    uint groups_m;         // tiles along m
#if defined(LINEAR)
    Floats bias;
    uint activation;       // 0 none, 1 relu, 2 tanh, 3 sigmoid
#endif
} pc;

float epilogue(float acc, uint i) {
#if defined(LINEAR)
    float z = acc + pc.bias.v[i];
    if (pc.activation == 1) return max(z, 0.0);
    if (pc.activation == 2) return tanh(z);
    if (pc.activation == 3) return sigmoid_of(z);
    return z;
#else
    return acc;
#endif
}

const uint BM = 64, BN = 64, BK = 16;
shared float As[BK][BM + 1];
shared float Bs[BK][BN + 1];

float load_a(uint base, uint i, uint p) {
    if (i >= pc.m || p >= pc.k) return 0.0;
    return pc.a.v[base + (pc.ta == 0 ? i + p * pc.lda : p + i * pc.lda)];
}

float load_b(uint base, uint p, uint j) {
    if (p >= pc.k || j >= pc.n) return 0.0;
    return pc.b.v[base + (pc.tb == 0 ? p + j * pc.ldb : j + p * pc.ldb)];
}

void main() {
    uint tile = flat_group();
    uint row0 = (tile % pc.groups_m) * BM, col0 = (tile / pc.groups_m) * BN;
    uint z = gl_WorkGroupID.z;
    uint i2 = z % pc.ne2, i3 = z / pc.ne2;
    uint base_a = i2 * pc.sa2 + i3 * pc.sa3, base_b = i2 * pc.sb2 + i3 * pc.sb3;
    uint base_c = z * pc.m * pc.n;
    uint t = gl_LocalInvocationID.x;
    uint tx = t % 16, ty = t / 16;  // this invocation computes rows tx + 16 r, columns ty + 16 c

    float acc[4][4];
    for (uint r = 0; r < 4; ++r)
        for (uint q = 0; q < 4; ++q) acc[r][q] = 0.0;

    for (uint p0 = 0; p0 < pc.k; p0 += BK) {
        for (uint e = t; e < BM * BK; e += 256) {
            uint i = e % BM, p = e / BM;
            As[p][i] = load_a(base_a, row0 + i, p0 + p);
        }
        for (uint e = t; e < BK * BN; e += 256) {
            uint p = e % BK, j = e / BK;
            Bs[p][j] = load_b(base_b, p0 + p, col0 + j);
        }
        barrier();
        for (uint p = 0; p < BK; ++p) {
            float av[4], bv[4];
            for (uint r = 0; r < 4; ++r) av[r] = As[p][tx + 16 * r];
            for (uint q = 0; q < 4; ++q) bv[q] = Bs[p][ty + 16 * q];
            for (uint r = 0; r < 4; ++r)
                for (uint q = 0; q < 4; ++q) acc[r][q] += av[r] * bv[q];
        }
        barrier();
    }
    for (uint q = 0; q < 4; ++q) {
        uint j = col0 + ty + 16 * q;
        if (j >= pc.n) continue;
        for (uint r = 0; r < 4; ++r) {
            uint i = row0 + tx + 16 * r;
            if (i < pc.m) pc.c.v[base_c + i + j * pc.m] = epilogue(acc[r][q], i);
        }
    }
}
