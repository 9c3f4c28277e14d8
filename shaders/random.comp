// Counter-based random numbers: element i of a stream is a hash of (stream, i), the same
// function as the CPU kernels use, so both backends draw the same uniforms.
// RAND: uniform [0, 1); RANDN: standard normal (Box-Muller); SAMPLE_CATEGORICAL: Gumbel-max
// over each column of the logits, an i32 class per column; RANDINT: i32 floor(u * high) for a
// uniform u, below high (x holds high).
#version 450
#include "common.glsl"

layout(buffer_reference, std430, buffer_reference_align = 8) readonly buffer Stream { uint64_t value; };

layout(push_constant) uniform Push {
    Floats x;  // SAMPLE_CATEGORICAL's logits, RANDINT's high
    Words o;
    uint64_t stream;
    uint n;     // outputs
    uint rows;  // SAMPLE_CATEGORICAL: classes per column
    uint64_t stream_at;  // nonzero: the stream is read here (a recorded program's per-replay draw)
    float below;  // RAND: the cap, the largest value below 1 of the dtype the result is rounded to
} pc;

uint64_t stream;

uint64_t splitmix64(uint64_t x) {
    x += 0x9E3779B97F4A7C15ul;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ul;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBul;
    return x ^ (x >> 31);
}

// 24 random bits as a float in [0, 1): exact in f32, identical to the CPU's f32 path.
float uniform_at(uint64_t i) { return float(uint(splitmix64(stream ^ splitmix64(i)) >> 40)) * (1.0 / 16777216.0); }

void main() {
    uint i = flat_invocation();
    if (i >= pc.n) return;
    stream = pc.stream_at != 0ul ? Stream(pc.stream_at).value : pc.stream;
#if defined(RAND)
    pc.o.v[i] = floatBitsToUint(min(uniform_at(uint64_t(i)), pc.below));
#elif defined(RANDN)
    float u1 = 1.0 - uniform_at(2ul * i), u2 = uniform_at(2ul * i + 1ul);
    pc.o.v[i] = floatBitsToUint(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
#elif defined(SAMPLE_CATEGORICAL)
    uint best = 0;
    float best_value = -infinity();
    for (uint r = 0; r < pc.rows; ++r) {
        float u = uniform_at(uint64_t(i * pc.rows + r));
        float value = pc.x.v[i * pc.rows + r] - log(-log(u + 5.9604645e-8));
        if (value > best_value) {
            best_value = value;
            best = r;
        }
    }
    pc.o.v[i] = best;
#elif defined(RANDINT)
    float high = pc.x.v[0];
    float draw = uniform_at(uint64_t(i)) * high;  // f32, as the CPU computes it
    uint last = high >= 1.0 ? uint(min(high, 2147483647.0)) - 1u : 0u;
    pc.o.v[i] = draw >= 0.0 ? min(uint(min(draw, 2147483647.0)), last) : 0u;
#endif
}
