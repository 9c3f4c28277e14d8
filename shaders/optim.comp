// Fused optimizer updates of one parameter, in place. ADAM: Adam / AdamW (coupled_wd adds
// wd * w to the gradient, decay = 1 - lr * wd scales w); SGD: momentum and weight decay.
#version 450
#include "common.glsl"

layout(push_constant) uniform Push {
    Floats w;
    Floats g;
    Floats m;  // SGD: the velocity
    Floats v;
    uint n;
    float beta1;     // SGD: momentum
    float beta2;
    float eps;
    float coupled_wd;
    float decay;
    float step;      // Adam: lr / (1 - beta1^t); SGD: lr
    float inv_bc2;   // 1 / (1 - beta2^t)
} pc;

void main() {
    uint i = flat_invocation();
    if (i >= pc.n) return;
    float w = pc.w.v[i];
    float g = pc.g.v[i] + pc.coupled_wd * w;
#if defined(ADAM)
    float m = pc.beta1 * pc.m.v[i] + (1.0 - pc.beta1) * g;
    float v = pc.beta2 * pc.v.v[i] + (1.0 - pc.beta2) * g * g;
    pc.m.v[i] = m;
    pc.v.v[i] = v;
    pc.w.v[i] = pc.decay * w - pc.step * m / (sqrt(v * pc.inv_bc2) + pc.eps);
#elif defined(SGD)
    float vel = pc.beta1 * pc.m.v[i] + g;
    pc.m.v[i] = vel;
    pc.w.v[i] = w - pc.step * vel;
#endif
}
