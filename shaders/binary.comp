// Elementwise a (op) b with broadcasting: strides of 0 repeat a dimension of size 1.
// Variants (OP_*): the arithmetic ops, comparisons and the fused backward helpers (g, saved).
#version 450
#include "common.glsl"

layout(push_constant) uniform Push {
    Floats a;
    Floats b;
    Floats o;
    uint ne[4];  // output sizes
    uint sa[4];  // element strides of a (0 where broadcast)
    uint sb[4];
    uint n;
    float p0;
    float p1;
} pc;

float apply_op(float x, float y) {
#if defined(OP_ADD)
    return x + y;
#elif defined(OP_SUB)
    return x - y;
#elif defined(OP_MUL)
    return x * y;
#elif defined(OP_DIV)
    return x / y;
#elif defined(OP_MINIMUM)
    return nan_min(x, y);
#elif defined(OP_MAXIMUM)
    return nan_max(x, y);
#elif defined(OP_GE)
    return x >= y ? 1.0 : 0.0;
#elif defined(OP_GT)
    return x > y ? 1.0 : 0.0;
#elif defined(OP_RELU_BACK)
    return y > 0.0 ? x : 0.0;
#elif defined(OP_SIGMOID_BACK)
    return x * y * (1.0 - y);
#elif defined(OP_TANH_BACK)
    return x * (1.0 - y * y);
#elif defined(OP_SILU_BACK)
    float s = sigmoid_of(y);
    return x * s * (1.0 + y * (1.0 - s));
#elif defined(OP_CLAMP_BACK)
    return (y > pc.p0 && y < pc.p1) ? x : 0.0;
#endif
}

void main() {
    uint i = flat_invocation();
    if (i >= pc.n) return;
    uint i0 = i % pc.ne[0];
    uint r = i / pc.ne[0];
    uint i1 = r % pc.ne[1];
    r /= pc.ne[1];
    uint i2 = r % pc.ne[2];
    uint i3 = r / pc.ne[2];
    uint ia = i0 * pc.sa[0] + i1 * pc.sa[1] + i2 * pc.sa[2] + i3 * pc.sa[3];
    uint ib = i0 * pc.sb[0] + i1 * pc.sb[1] + i2 * pc.sb[2] + i3 * pc.sb[3];
    pc.o.v[i] = apply_op(pc.a.v[ia], pc.b.v[ib]);
}
