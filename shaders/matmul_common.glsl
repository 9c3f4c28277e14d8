// Shared by the f32 matmul kernels (matmul.comp, matmul_small.comp): their push constants, the
// LINEAR epilogue (and matmul_small's RELU_MASK), and bounds-checked reads of op(A) and op(B)
// (zero outside the matrices).
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
    uint split_k;          // matmul_small.comp: the reduction's length per z slice (a multiple of its BK)
#if defined(LINEAR)
    Floats bias;
    uint activation;       // 0 none, 1 relu, 2 tanh, 3 sigmoid
#elif defined(RELU_MASK)
    Floats mask;           // matmul_relu_mask's y, shaped like C: C where y > 0, else 0
#endif
} pc;

float epilogue(float acc, uint i) {
#if defined(LINEAR)
    return linear_activation(pc.activation, acc + pc.bias.v[i]);
#else
    return acc;
#endif
}

float load_a(uint base, uint i, uint p) {
    if (i >= pc.m || p >= pc.k) return 0.0;
    return pc.a.v[base + (pc.ta == 0 ? i + p * pc.lda : p + i * pc.lda)];
}

float load_b(uint base, uint p, uint j) {
    if (p >= pc.k || j >= pc.n) return 0.0;
    return pc.b.v[base + (pc.tb == 0 ? p + j * pc.ldb : j + p * pc.ldb)];
}
