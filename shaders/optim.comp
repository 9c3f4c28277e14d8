// Fused optimizer updates of one parameter, in place. ADAM: Adam / AdamW (coupled_wd adds
// wd * w to the gradient, decay = 1 - lr * wd scales w); SGD: momentum and weight decay.
// The coefficients come in push constants (an eager step) or, with FROM_BUFFERS (a captured
// step), from a hyper buffer written before each replay, with a gradient scale: a non-finite
// scale (a non-finite gradient norm) leaves the parameter and its state untouched.
#version 450
#include "common.glsl"

layout(push_constant) uniform Push {
    Floats w;
    Floats g;
    Floats m;  // SGD: the velocity
    Floats v;
    uint n;
    float beta1;     // SGD: momentum
    float beta2;     // SGD: weight decay
    float eps;       // SGD: lr
    float coupled_wd;
    float decay;
    float step;      // Adam: lr / (1 - beta1^t)
    float inv_bc2;   // 1 / (1 - beta2^t)
    Floats hyper;    // FROM_BUFFERS: the seven coefficients above, in order
    Floats scale;    // FROM_BUFFERS: the gradient's factor
} pc;

void main() {
    uint i = flat_invocation();
    if (i >= pc.n) return;
#if defined(FROM_BUFFERS)
    float scale = pc.scale.v[0];
    if (isnan(scale) || isinf(scale)) return;
    float c[7] = float[7](pc.hyper.v[0], pc.hyper.v[1], pc.hyper.v[2], pc.hyper.v[3], pc.hyper.v[4], pc.hyper.v[5],
                          pc.hyper.v[6]);
#else
    float scale = 1.0;
    float c[7] = float[7](pc.beta1, pc.beta2, pc.eps, pc.coupled_wd, pc.decay, pc.step, pc.inv_bc2);
#endif
    float w = pc.w.v[i];
#if defined(ADAM)
    float g = scale * pc.g.v[i] + c[3] * w;
    float m = c[0] * pc.m.v[i] + (1.0 - c[0]) * g;
    float v = c[1] * pc.v.v[i] + (1.0 - c[1]) * g * g;
    pc.m.v[i] = m;
    pc.v.v[i] = v;
    pc.w.v[i] = c[4] * w - c[5] * m / (sqrt(v * c[6]) + c[2]);
#elif defined(SGD)
    float g = scale * pc.g.v[i] + c[1] * w;  // c: momentum, weight decay, lr
    float vel = c[0] * pc.m.v[i] + g;
    pc.m.v[i] = vel;
    pc.w.v[i] = w - c[2] * vel;
#endif
}
