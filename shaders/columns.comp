// Per-column ops, one workgroup per column (over dim 0): SOFTMAX, LOG_SOFTMAX, SOFTMAX_BACK
// (a = g, b = y), LOG_SOFTMAX_BACK (a = g, b = y), MAX and ARGMAX (first maximum; a NaN counts
// as the maximum, as numpy). Reductions use a shared-memory tree, at any subgroup size.
#version 450
#include "common.glsl"

layout(push_constant) uniform Push {
    Floats a;
    Floats b;
    Floats o;
    uint rows;
    uint cols;
} pc;

shared float red[256];
shared uint red_index[256];

float reduce_sum(float v) {
    uint t = gl_LocalInvocationID.x;
    red[t] = v;
    barrier();
    for (uint w = 128; w > 0; w /= 2) {
        if (t < w) red[t] += red[t + w];
        barrier();
    }
    float r = red[0];
    barrier();
    return r;
}

// (value, index) wins over (other, other_index) when larger, a NaN, or equal with a smaller index.
bool better(float v, uint i, float w, uint j) {
    if (isnan(w)) return isnan(v) && i < j;
    if (isnan(v)) return true;
    return v > w || (v == w && i < j);
}

uint reduce_argmax(float v, uint i) {
    uint t = gl_LocalInvocationID.x;
    red[t] = v;
    red_index[t] = i;
    barrier();
    for (uint w = 128; w > 0; w /= 2) {
        if (t < w && better(red[t + w], red_index[t + w], red[t], red_index[t])) {
            red[t] = red[t + w];
            red_index[t] = red_index[t + w];
        }
        barrier();
    }
    uint r = red_index[0];
    barrier();
    return r;
}

void main() {
    uint c = flat_group();
    if (c >= pc.cols) return;  // uniform per workgroup
    uint base = c * pc.rows, t = gl_LocalInvocationID.x;
#if defined(SOFTMAX) || defined(LOG_SOFTMAX) || defined(MAX) || defined(ARGMAX)
    float best = -infinity();
    uint best_i = 0xffffffffu;
    for (uint i = t; i < pc.rows; i += 256) {
        float x = pc.a.v[base + i];
        if (best_i == 0xffffffffu || better(x, i, best, best_i)) {
            best = x;
            best_i = i;
        }
    }
    uint arg = reduce_argmax(best, best_i);
    float mx = pc.a.v[base + arg];
#endif
#if defined(MAX)
    if (t == 0) pc.o.v[c] = mx;
#elif defined(ARGMAX)
    if (t == 0) Words(uint64_t(pc.o)).v[c] = arg;  // the output is i32: stored as bits, never as a float
#elif defined(SOFTMAX) || defined(LOG_SOFTMAX)
    float s = 0.0;
    for (uint i = t; i < pc.rows; i += 256) s += exp(pc.a.v[base + i] - mx);
    float total = reduce_sum(s);
#if defined(SOFTMAX)
    float inv = 1.0 / total;
    for (uint i = t; i < pc.rows; i += 256) pc.o.v[base + i] = exp(pc.a.v[base + i] - mx) * inv;
#else
    // (x - max) - log(sum): subtracting the max first keeps the digits a large max would cancel
    float log_total = log(total);
    for (uint i = t; i < pc.rows; i += 256) pc.o.v[base + i] = (pc.a.v[base + i] - mx) - log_total;
#endif
#elif defined(SOFTMAX_BACK)
    float s = 0.0;
    for (uint i = t; i < pc.rows; i += 256) s += pc.a.v[base + i] * pc.b.v[base + i];
    float dot_gy = reduce_sum(s);
    for (uint i = t; i < pc.rows; i += 256) pc.o.v[base + i] = pc.b.v[base + i] * (pc.a.v[base + i] - dot_gy);
#elif defined(LOG_SOFTMAX_BACK)
    float s = 0.0;
    for (uint i = t; i < pc.rows; i += 256) s += pc.a.v[base + i];
    float sum_g = reduce_sum(s);
    for (uint i = t; i < pc.rows; i += 256) pc.o.v[base + i] = pc.a.v[base + i] - exp(pc.b.v[base + i]) * sum_g;
#endif
}
