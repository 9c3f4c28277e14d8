// Mamba's causal depthwise convolution (ggml_ssm_conv) and its backward helpers, one output
// element per invocation. Shapes in ne order (dim 0 fastest), L = d_conv - 1 + n_t:
//   FORWARD: a = sx [L, d_inner, n_s], b = c [d_conv, d_inner] -> o [d_inner, n_t, n_s]
//            o[i, t, s] = sum_k sx[t + k, i, s] c[k, i]
//   BACK_SX: a = g [d_inner, n_t, n_s], b = c -> o = d sx [L, d_inner, n_s]
//            o[p, i, s] = sum over the taps k with 0 <= p - k < n_t of g[i, p - k, s] c[k, i]
//   BACK_C:  a = g, b = sx -> o = d c [d_conv, d_inner]
//            o[k, i] = sum_{s, t} g[i, t, s] sx[t + k, i, s]
#version 450
#include "common.glsl"

layout(push_constant) uniform Push {
    Floats a;
    Floats b;
    Floats o;
    uint d_conv;
    uint d_inner;
    uint n_t;
    uint n_s;
    uint n;  // outputs
} pc;

void main() {
    uint e = flat_invocation();
    if (e >= pc.n) return;
    uint window = pc.d_conv - 1 + pc.n_t;
#if defined(FORWARD)
    uint i = e % pc.d_inner, t = (e / pc.d_inner) % pc.n_t, s = e / (pc.d_inner * pc.n_t);
    uint base = (s * pc.d_inner + i) * window + t;
    float acc = 0.0;
    for (uint k = 0; k < pc.d_conv; ++k) acc += pc.a.v[base + k] * pc.b.v[i * pc.d_conv + k];
    pc.o.v[e] = acc;
#elif defined(BACK_SX)
    uint p = e % window, i = (e / window) % pc.d_inner, s = e / (window * pc.d_inner);
    uint first = p + 1 > pc.n_t ? p + 1 - pc.n_t : 0;
    uint last = min(pc.d_conv - 1, p);
    float acc = 0.0;
    for (uint k = first; k <= last; ++k) acc += pc.a.v[(s * pc.n_t + (p - k)) * pc.d_inner + i] * pc.b.v[i * pc.d_conv + k];
    pc.o.v[e] = acc;
#elif defined(BACK_C)
    uint k = e % pc.d_conv, i = e / pc.d_conv;
    float acc = 0.0;
    for (uint s = 0; s < pc.n_s; ++s) {
        uint base = (s * pc.d_inner + i) * window + k;
        for (uint t = 0; t < pc.n_t; ++t) acc += pc.a.v[(s * pc.n_t + t) * pc.d_inner + i] * pc.b.v[base + t];
    }
    pc.o.v[e] = acc;
#endif
}
