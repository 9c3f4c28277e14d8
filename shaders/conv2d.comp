// 2-D convolution of images [W, H, C, N] (ne order, dim 0 fastest) with kernels [KW, KH, C_in,
// C_out], and its two backward helpers, each an implicit GEMM C[m, n] = sum_k A[m, k] B[k, n]
// whose operands are read straight from the tensors (no patch matrix in memory):
//   FORWARD:     m: output pixels (ow, oh, n), n: C_out, k: taps (kw, kh, ci)
//                A = the patch of x at the pixel, B = w as [K, C_out]; C -> o [W', H', C_out, N],
//                plus the bias of its channel and the activation (conv2d's epilogue) where unsplit
//   BACK_INPUT:  per stride phase (z), m: its input pixels (ix, iy, n), n: C_in, k: the taps that
//                reach them (kw, kh, co); A = the g [W', H', C_out, N] that the pixel reached through
//                tap (kw, kh), 0 where the tap falls outside; B = w; C -> o = d x [W, H, C_in, N]
//   BACK_WEIGHT: m: taps (kw, kh, ci), n: C_out, k: output pixels; A = x at the tap of each
//                pixel, B = g; C -> o = d w [K, C_out]
// Tiles of BM x BN outputs per workgroup, k in slices of BK staged in shared memory; each of the
// 256 invocations (16 x 16) computes TM x TN outputs, rows tx + 16 r and columns ty + 16 q. An
// invocation stages the same row of A at every slice, so the row's pixel or tap is decoded once,
// and reads the next slice into registers while the current one is summed.
// Split k: where the output has too few tiles to keep the GPU busy, the reduction is cut into z
// slices of pc.split_k (BACK_INPUT: each stride phase's reduction alike), each writing its partial
// sum as a whole output, one after the other from pc.o; sum_splits.comp adds them in order.
#version 450
#extension GL_EXT_control_flow_attributes : require
#include "common.glsl"

layout(push_constant) uniform Push {
    Floats a;  // FORWARD, BACK_WEIGHT: x; BACK_INPUT: g
    Floats b;  // FORWARD, BACK_INPUT: w; BACK_WEIGHT: g
    Floats o;
    uint in_w, in_h, c_in, n;
    uint k_w, k_h, c_out;
    uint out_w, out_h;
    uint stride_w, stride_h, pad_w, pad_h, dil_w, dil_h;
    uint m, cols, k;  // the GEMM's sizes (BACK_WEIGHT: k is every output pixel)
    uint groups_m;    // tiles along m
    uint split_k;     // the reduction's length per z slice (k, or more, where it is not split)
    uint tap_step_w, tap_step_h;  // BACK_INPUT: the least t with t dil = 0 mod stride, per axis
    uint epilogue;    // FORWARD, unsplit: bits 0-1 the activation (linear's codes), after bias[C_out] where bit 2 is set
    Floats bias;
} pc;

const uint TM = 4, TN = 2;
const uint BM = 16 * TM, BN = 16 * TN, BK = 16;
const uint LOADS_A = BM * BK / 256, LOADS_B = BK * BN / 256;

shared float As[BK][BM];
shared float Bs[BK][BN + 1];  // one float of padding: the stores of a column step along k

// What an invocation knows of the row of A it stages: offsets of its pixel or tap, valid false
// past the last row.
struct Row {
    int x0, y0;  // FORWARD: the window's corner (ow sw - pw, oh sh - ph); BACK_INPUT: (ix + pw, iy + ph);
                 // BACK_WEIGHT: the tap's offset (kw dw - pw, kh dh - ph)
    uint base;   // FORWARD: x's image n; BACK_INPUT: g's image n; BACK_WEIGHT: x's channel ci
    bool valid;
};

uint taps() { return pc.k_w * pc.k_h; }

#if defined(FORWARD)

Row row_of(uint r) {
    uint pixels = pc.out_w * pc.out_h, p = r % pixels;
    int ow = int(p % pc.out_w), oh = int(p / pc.out_w);
    return Row(ow * int(pc.stride_w) - int(pc.pad_w), oh * int(pc.stride_h) - int(pc.pad_h),
               (r / pixels) * pc.in_w * pc.in_h * pc.c_in, r < pc.m);
}

float load_a(Row row, uint k) {
    uint tap = k % taps(), ci = k / taps();
    int ix = row.x0 + int((tap % pc.k_w) * pc.dil_w), iy = row.y0 + int((tap / pc.k_w) * pc.dil_h);
    if (ix < 0 || iy < 0 || ix >= int(pc.in_w) || iy >= int(pc.in_h)) return 0.0;
    return pc.a.v[row.base + uint(ix) + pc.in_w * (uint(iy) + pc.in_h * ci)];
}

float load_b(uint k, uint col) { return pc.b.v[k + pc.k * col]; }

uint split() { return gl_WorkGroupID.z; }

void store(uint r, uint col, float v) {
    uint pixels = pc.out_w * pc.out_h;
    if ((pc.epilogue & 4u) != 0u) v += pc.bias.v[col];
    v = linear_activation(pc.epilogue & 3u, v);
    pc.o.v[split() * pixels * pc.c_out * pc.n + r % pixels + pixels * (col + pc.c_out * (r / pixels))] = v;
}

#elif defined(BACK_INPUT)

// One stride phase per z: the input pixels whose ix + pw is qx mod sw (and iy + ph qy mod sh) are
// reached only by the taps with kw dw = qx mod sw (kh dh = qy mod sh), so each phase is a GEMM of
// its own over its pixels and those taps alone, sw sh times less work than masking every tap.
struct Axis {
    uint first, count;            // the phase's first input index and how many it holds
    uint tap0, tap_step, taps;    // its first tap, the step between its taps, how many
};
Axis ax, ay;  // this workgroup's phase, set by setup()

Axis axis_phase(uint q, uint stride, uint pad, uint dil, uint in_size, uint k_size, uint tap_step) {
    Axis a;
    a.first = (q + stride - pad % stride) % stride;  // (first + pad) % stride == q
    a.count = a.first < in_size ? (in_size - 1 - a.first) / stride + 1 : 0;
    a.tap_step = tap_step;
    a.tap0 = 0;
    a.taps = 0;
    for (uint k = 0; k < min(k_size, a.tap_step); ++k)
        if ((k * dil) % stride == q) { a.tap0 = k; a.taps = (k_size - 1 - k) / a.tap_step + 1; break; }
    return a;
}

uint phases() { return pc.stride_w * pc.stride_h; }

uint setup() {  // the phase's reduction length
    uint z = gl_WorkGroupID.z % phases();
    ax = axis_phase(z % pc.stride_w, pc.stride_w, pc.pad_w, pc.dil_w, pc.in_w, pc.k_w, pc.tap_step_w);
    ay = axis_phase(z / pc.stride_w, pc.stride_h, pc.pad_h, pc.dil_h, pc.in_h, pc.k_h, pc.tap_step_h);
    return ax.taps * ay.taps * pc.c_out;
}

// the phase's row r as (ix, iy, n)
uvec3 pixel_of(uint r) {
    return uvec3(ax.first + (r % ax.count) * pc.stride_w, ay.first + ((r / ax.count) % ay.count) * pc.stride_h,
                 r / (ax.count * ay.count));
}

Row row_of(uint r) {
    if (r >= ax.count * ay.count * pc.n) return Row(0, 0, 0, false);
    uvec3 p = pixel_of(r);
    return Row(int(p.x + pc.pad_w), int(p.y + pc.pad_h), p.z * pc.out_w * pc.out_h * pc.c_out, true);
}

// the phase's tap k as (kw, kh, co)
uvec3 tap_of(uint k) {
    return uvec3(ax.tap0 + (k % ax.taps) * ax.tap_step, ay.tap0 + ((k / ax.taps) % ay.taps) * ay.tap_step,
                 k / (ax.taps * ay.taps));
}

// the g of the output pixel that read this input pixel through tap (kw, kh) of output channel co
float load_a(Row row, uint k) {
    uvec3 t = tap_of(k);
    int tx = row.x0 - int(t.x * pc.dil_w), ty = row.y0 - int(t.y * pc.dil_h);  // multiples of the strides
    if (tx < 0 || ty < 0) return 0.0;
    uint ow = uint(tx) / pc.stride_w, oh = uint(ty) / pc.stride_h;
    if (ow >= pc.out_w || oh >= pc.out_h) return 0.0;
    return pc.a.v[row.base + ow + pc.out_w * (oh + pc.out_h * t.z)];
}

float load_b(uint k, uint ci) {
    uvec3 t = tap_of(k);
    return pc.b.v[t.x + pc.k_w * (t.y + pc.k_h * (ci + pc.c_in * t.z))];
}

uint split() { return gl_WorkGroupID.z / phases(); }

void store(uint r, uint ci, float v) {
    uvec3 p = pixel_of(r);
    pc.o.v[split() * pc.in_w * pc.in_h * pc.c_in * pc.n + p.x + pc.in_w * (p.y + pc.in_h * (ci + pc.c_in * p.z))] = v;
}

#elif defined(BACK_WEIGHT)

Row row_of(uint k) {
    uint tap = k % taps();
    return Row(int((tap % pc.k_w) * pc.dil_w) - int(pc.pad_w), int((tap / pc.k_w) * pc.dil_h) - int(pc.pad_h),
               (k / taps()) * pc.in_w * pc.in_h, k < pc.m);
}

// x at this tap of output pixel r
float load_a(Row row, uint r) {
    uint pixels = pc.out_w * pc.out_h, p = r % pixels;
    int ix = row.x0 + int((p % pc.out_w) * pc.stride_w), iy = row.y0 + int((p / pc.out_w) * pc.stride_h);
    if (ix < 0 || iy < 0 || ix >= int(pc.in_w) || iy >= int(pc.in_h)) return 0.0;
    return pc.a.v[row.base + uint(ix) + pc.in_w * (uint(iy) + pc.in_h * pc.c_in * (r / pixels))];
}

float load_b(uint r, uint co) {
    uint pixels = pc.out_w * pc.out_h;
    return pc.b.v[r % pixels + pixels * (co + pc.c_out * (r / pixels))];
}

uint split() { return gl_WorkGroupID.z; }

void store(uint k, uint co, float v) { pc.o.v[split() * pc.m * pc.cols + k + pc.m * co] = v; }

#endif

// This invocation's share of a slice of A and B (rows of A by row_of, elements of B consecutive
// along k), zero past the reduction's end or the output's.
void load_slice(Row row, uint col0, uint k0, uint k_end, inout float a[LOADS_A], inout float b[LOADS_B]) {
    uint t = gl_LocalInvocationID.x;
    [[unroll]] for (uint l = 0; l < LOADS_A; ++l) {
        uint kk = t / BM + (256 / BM) * l;
        a[l] = (row.valid && k0 + kk < k_end) ? load_a(row, k0 + kk) : 0.0;
    }
    [[unroll]] for (uint l = 0; l < LOADS_B; ++l) {
        uint e = t + 256 * l, kk = e % BK, col = e / BK;
        b[l] = (k0 + kk < k_end && col0 + col < pc.cols) ? load_b(k0 + kk, col0 + col) : 0.0;
    }
}

void main() {
    uint tile = flat_group();
    uint row0 = (tile % pc.groups_m) * BM, col0 = (tile / pc.groups_m) * BN;
    uint t = gl_LocalInvocationID.x, tx = t % 16, ty = t / 16;
#if defined(BACK_INPUT)
    uint k_total = setup();
#else
    uint k_total = pc.k;
#endif
    uint k_begin = min(split() * pc.split_k, k_total), k_end = min(k_total, k_begin + pc.split_k);
    // the row of A this invocation stages (element t + 256 l of a slice: row t % BM, k t / BM + 4 l)
    Row row = row_of(row0 + t % BM);

    float acc[TM][TN];
    [[unroll]] for (uint r = 0; r < TM; ++r)
        [[unroll]] for (uint q = 0; q < TN; ++q) acc[r][q] = 0.0;

    float next_a[LOADS_A], next_b[LOADS_B];
    load_slice(row, col0, k_begin, k_end, next_a, next_b);
    for (uint k0 = k_begin; k0 < k_end; k0 += BK) {
        [[unroll]] for (uint l = 0; l < LOADS_A; ++l) As[t / BM + (256 / BM) * l][t % BM] = next_a[l];
        [[unroll]] for (uint l = 0; l < LOADS_B; ++l) {
            uint e = t + 256 * l;
            Bs[e % BK][e / BK] = next_b[l];
        }
        barrier();
        if (k0 + BK < k_end) load_slice(row, col0, k0 + BK, k_end, next_a, next_b);  // in flight while summing
        [[unroll]] for (uint p = 0; p < BK; ++p) {
            float av[TM], bv[TN];
            [[unroll]] for (uint r = 0; r < TM; ++r) av[r] = As[p][tx + 16 * r];
            [[unroll]] for (uint q = 0; q < TN; ++q) bv[q] = Bs[p][ty + 16 * q];
            [[unroll]] for (uint r = 0; r < TM; ++r)
                [[unroll]] for (uint q = 0; q < TN; ++q) acc[r][q] += av[r] * bv[q];
        }
        barrier();
    }
    [[unroll]] for (uint q = 0; q < TN; ++q) {
        uint col = col0 + ty + 16 * q;
        if (col >= pc.cols) continue;
        [[unroll]] for (uint r = 0; r < TM; ++r) {
            uint i = row0 + tx + 16 * r;
#if defined(BACK_INPUT)
            if (i < ax.count * ay.count * pc.n) store(i, col, acc[r][q]);
#else
            if (i < pc.m) store(i, col, acc[r][q]);
#endif
        }
    }
}
