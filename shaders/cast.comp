// dtype conversions. u8 travels as four bytes per 32-bit word; f16 and bf16 travel as pairs of
// 16-bit values in 32-bit words: F32_TO_F16 and F32_TO_BF16 write one word (two elements) per
// invocation; the buffer is padded to whole words.
#version 450
#include "common.glsl"

layout(push_constant) uniform Push {
    Words x;
    Words o;
    uint n;  // elements
    float scale;  // U8_TO_F32 and I32_TO_F32: each value times this (1 for a plain cast)
} pc;

// f's bfloat16 bits: its upper half rounded to nearest even (as the CPU's float_to_bf16); a NaN
// stays a quiet NaN.
uint bf16_bits(float f) {
    uint x = floatBitsToUint(f);
    if (isnan(f)) return (x >> 16) | 0x40u;
    return (x + 0x7fffu + ((x >> 16) & 1u)) >> 16;
}

void main() {
    uint i = flat_invocation();
#if defined(F32_TO_F16)
    if (2 * i >= pc.n) return;
    float lo = uintBitsToFloat(pc.x.v[2 * i]);
    float hi = 2 * i + 1 < pc.n ? uintBitsToFloat(pc.x.v[2 * i + 1]) : 0.0;
    pc.o.v[i] = packHalf2x16(vec2(lo, hi));
#elif defined(F16_TO_F32)
    if (i >= pc.n) return;
    vec2 pair = unpackHalf2x16(pc.x.v[i / 2]);
    pc.o.v[i] = floatBitsToUint((i % 2 == 0) ? pair.x : pair.y);
#elif defined(F32_TO_BF16)
    if (2 * i >= pc.n) return;
    uint lo = bf16_bits(uintBitsToFloat(pc.x.v[2 * i]));
    uint hi = 2 * i + 1 < pc.n ? bf16_bits(uintBitsToFloat(pc.x.v[2 * i + 1])) : 0u;
    pc.o.v[i] = lo | (hi << 16);
#elif defined(BF16_TO_F32)
    if (i >= pc.n) return;
    pc.o.v[i] = ((pc.x.v[i / 2] >> (16 * (i % 2))) & 0xffffu) << 16;
#elif defined(F32_TO_I32)
    if (i >= pc.n) return;
    float f = uintBitsToFloat(pc.x.v[i]);
    // toward zero, saturating; NaN becomes 0 (as the CPU kernel)
    int v = isnan(f) ? 0 : (f >= 2147483647.0 ? 2147483647 : (f <= -2147483648.0 ? int(0x80000000u) : int(f)));
    pc.o.v[i] = uint(v);
#elif defined(U8_TO_F32)
    if (i >= pc.n) return;
    pc.o.v[i] = floatBitsToUint(float((pc.x.v[i / 4] >> (8 * (i % 4))) & 0xffu) * pc.scale);
#elif defined(I32_TO_F32)
    if (i >= pc.n) return;
    pc.o.v[i] = floatBitsToUint(float(int(pc.x.v[i])) * pc.scale);
#endif
}
