// dtype conversions. u8 travels as four bytes per 32-bit word; f16 travels as pairs of halves in 32-bit words: F32_TO_F16 writes one
// word (two elements) per invocation; the buffer is padded to whole words.
#version 450
#include "common.glsl"

layout(push_constant) uniform Push {
    Words x;
    Words o;
    uint n;  // elements
} pc;

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
#elif defined(F32_TO_I32)
    if (i >= pc.n) return;
    float f = uintBitsToFloat(pc.x.v[i]);
    // toward zero, saturating; NaN becomes 0 (as the CPU kernel)
    int v = isnan(f) ? 0 : (f >= 2147483647.0 ? 2147483647 : (f <= -2147483648.0 ? int(0x80000000u) : int(f)));
    pc.o.v[i] = uint(v);
#elif defined(U8_TO_F32)
    if (i >= pc.n) return;
    pc.o.v[i] = floatBitsToUint(float((pc.x.v[i / 4] >> (8 * (i % 4))) & 0xffu));
#elif defined(I32_TO_F32)
    if (i >= pc.n) return;
    pc.o.v[i] = floatBitsToUint(float(int(pc.x.v[i])));
#endif
}
