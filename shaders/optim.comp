// Fused optimizer updates of a whole parameter set, in place, in one dispatch. ADAM: Adam /
// AdamW (coupled_wd adds wd * w to the gradient, decay = 1 - lr * wd scales w); SGD: momentum
// and weight decay; POLYAK: a target network's update, w = tau g + (1 - tau) w with g the
// source network's parameter (tau = 1 copies, even over a non-finite target). Workgroup i updates
// the elements of chunk i of the set: a record of the table (the parameter's, gradient's and
// state's addresses, and which of their elements). Adam and SGD read their coefficients from a
// hyper buffer (an eager step writes it with the dispatch, a captured one before each replay) and
// the gradients' factor from a scale buffer (or the clipping factor of the sum of squares it
// holds): a non-finite factor (a non-finite gradient norm) leaves the parameters and their state
// untouched.
#version 450
#include "common.glsl"

struct Chunk {
    Floats w;
    Floats g;
    Floats m;  // SGD: the velocity
    Floats v;  // SGD: unused
    uint begin;
    uint count;
};

layout(buffer_reference, std430, buffer_reference_align = 8) readonly buffer Chunks { Chunk chunk[]; };

layout(push_constant) uniform Push {
    Chunks table;
    // Adam: beta1, beta2, eps, coupled_wd, decay, step = lr / (1 - beta1^t), inv_bc2 = 1 / (1 - beta2^t)
    // SGD: momentum, weight decay, lr
    Floats hyper;
    Floats scale;  // the gradients' factor, or their sum of squares where scale_is_sum_squares
    uint n_chunks;
    float tau;  // Polyak
    uint scale_is_sum_squares;
    float max_grad_norm;
} pc;

// native/optim.cpp's gradient_factor, op for op: the clipping factor of a finite sum of squares
// (1 without clipping); main skips the update where the sum is not finite.
float gradient_factor(float sum_squares, float max_grad_norm) {
    return max_grad_norm == 0.0 ? 1.0 : min(max_grad_norm / (sqrt(sum_squares) + 1e-6), 1.0);
}

void main() {
    uint id = flat_group();
    if (id >= pc.n_chunks) return;
#if defined(ADAM) || defined(SGD)
    float scale = pc.scale.v[0];
    if (isnan(scale) || isinf(scale)) return;  // a non-finite factor or sum of squares: no update
    if (pc.scale_is_sum_squares != 0) scale = gradient_factor(scale, pc.max_grad_norm);
    float c[7] = float[7](pc.hyper.v[0], pc.hyper.v[1], pc.hyper.v[2], pc.hyper.v[3], pc.hyper.v[4], pc.hyper.v[5],
                          pc.hyper.v[6]);
#endif
    Chunk k = pc.table.chunk[id];
    uint end = k.begin + k.count;
    for (uint i = k.begin + gl_LocalInvocationID.x; i < end; i += gl_WorkGroupSize.x) {
        float w = k.w.v[i];
#if defined(ADAM)
        float g = scale * k.g.v[i] + c[3] * w;
        float m = c[0] * k.m.v[i] + (1.0 - c[0]) * g;
        float v = c[1] * k.v.v[i] + (1.0 - c[1]) * g * g;
        k.m.v[i] = m;
        k.v.v[i] = v;
        k.w.v[i] = c[4] * w - c[5] * m / (sqrt(v * c[6]) + c[2]);
#elif defined(SGD)
        float g = scale * k.g.v[i] + c[1] * w;
        float vel = c[0] * k.m.v[i] + g;
        k.m.v[i] = vel;
        k.w.v[i] = w - c[2] * vel;
#elif defined(POLYAK)
        float source = k.g.v[i];
        k.w.v[i] = pc.tau == 1.0 ? source : pc.tau * source + (1.0 - pc.tau) * w;
#endif
    }
}
