// Elementwise f(x); variants OP_*; scale, pow and clamp read their numbers from p0, p1.
#version 450
#include "common.glsl"

layout(push_constant) uniform Push {
    Floats x;
    Floats o;
    uint n;
    float p0;
    float p1;
} pc;

float apply_op(float x) {
#if defined(OP_NEG)
    return -x;
#elif defined(OP_RELU)
    return (x > 0.0 || isnan(x)) ? x : 0.0;
#elif defined(OP_SIGMOID)
    return sigmoid_of(x);
#elif defined(OP_TANH)
    return safe_tanh(x);
#elif defined(OP_SOFTPLUS)
    return max(x, 0.0) + log(1.0 + exp(-abs(x)));
#elif defined(OP_SILU)
    return x * sigmoid_of(x);
#elif defined(OP_EXP)
    return exp(x);
#elif defined(OP_LOG)
    return x < 0.0 ? quiet_nan() : (x == 0.0 ? -infinity() : log(x));
#elif defined(OP_SQRT)
    return x < 0.0 ? quiet_nan() : sqrt(x);
#elif defined(OP_SQUARE)
    return x * x;
#elif defined(OP_ABS)
    return abs(x);
#elif defined(OP_SIGN)
    return x > 0.0 ? 1.0 : (x < 0.0 ? -1.0 : 0.0);
#elif defined(OP_SCALE)
    return x * pc.p0;
#elif defined(OP_POW)
    return c_pow(x, pc.p0);
#elif defined(OP_CLAMP)
    return isnan(x) ? x : clamp(x, pc.p0, pc.p1);
#endif
}

void main() {
    uint i = flat_invocation();
    if (i >= pc.n) return;
    pc.o.v[i] = apply_op(pc.x.v[i]);
}
