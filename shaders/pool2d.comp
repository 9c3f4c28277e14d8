// Max pooling of the planes of images [W, H, C, N] (ne order), windows of k_w x k_h at strides
// (stride_w, stride_h) from (-pad_w, -pad_h); the padding counts as -inf (never kept: every window
// holds an element of x). A window keeps its first maximum in memory order, or its first NaN
// (native/cpu_conv.cpp's window_argmax, the same rule).
//   FORWARD:  a = x -> o [W', H', C, N], one invocation per output
//   BACKWARD: a = x, g [W', H', C, N] -> o = d x like x, one invocation per input element: the
//             sum, over the windows that kept it (oh, then ow, ascending, as the CPU adds them),
//             of their g
#version 450
#include "common.glsl"

layout(push_constant) uniform Push {
    Floats a;
    Floats g;
    Floats o;
    uint in_w, in_h, out_w, out_h;
    uint k_w, k_h, stride_w, stride_h, pad_w, pad_h;
    uint n;  // invocations
} pc;

// The offset in its plane of the element window (ow, oh) keeps.
uint window_argmax(uint plane, uint ow, uint oh) {
    int x0 = int(ow * pc.stride_w) - int(pc.pad_w), y0 = int(oh * pc.stride_h) - int(pc.pad_h);
    uint best = 0;
    bool found = false;
    for (int iy = max(y0, 0); iy < min(y0 + int(pc.k_h), int(pc.in_h)); ++iy)
        for (int ix = max(x0, 0); ix < min(x0 + int(pc.k_w), int(pc.in_w)); ++ix) {
            uint i = uint(ix) + pc.in_w * uint(iy);
            float v = pc.a.v[plane + i], kept = found ? pc.a.v[plane + best] : 0.0;
            if (!found || (!isnan(kept) && (v > kept || isnan(v)))) {
                best = i;
                found = true;
            }
        }
    return best;
}

void main() {
    uint e = flat_invocation();
    if (e >= pc.n) return;
#if defined(FORWARD)
    uint pixels = pc.out_w * pc.out_h, c = e / pixels, p = e % pixels;
    uint plane = c * pc.in_w * pc.in_h;
    pc.o.v[e] = pc.a.v[plane + window_argmax(plane, p % pc.out_w, p / pc.out_w)];
#elif defined(BACKWARD)
    uint pixels = pc.in_w * pc.in_h, c = e / pixels, i = e % pixels;
    uint ix = i % pc.in_w, iy = i / pc.in_w, plane = c * pixels;
    // the windows holding (ix, iy): ow sw - pw <= ix <= ow sw - pw + k_w - 1
    uint tx = ix + pc.pad_w, ty = iy + pc.pad_h;
    uint ow0 = tx + 1 > pc.k_w ? (tx + 1 - pc.k_w + pc.stride_w - 1) / pc.stride_w : 0;
    uint oh0 = ty + 1 > pc.k_h ? (ty + 1 - pc.k_h + pc.stride_h - 1) / pc.stride_h : 0;
    uint ow1 = min(tx / pc.stride_w + 1, pc.out_w), oh1 = min(ty / pc.stride_h + 1, pc.out_h);
    float total = 0.0;
    for (uint oh = oh0; oh < oh1; ++oh)
        for (uint ow = ow0; ow < ow1; ++ow)
            if (window_argmax(plane, ow, oh) == i) total += pc.g.v[ow + pc.out_w * (oh + pc.out_h * c)];
    pc.o.v[e] = total;
#endif
}
