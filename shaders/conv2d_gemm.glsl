// The implicit GEMMs of conv2d and its two backward helpers, shared by conv2d.comp (f32, SIMT
// tiles) and conv2d_coopmat.comp (f16 on cooperative matrices): the push constants, and for each
// kind (FORWARD, BACK_INPUT, BACK_WEIGHT) how a row of A is decoded, how elements of A and B are
// read from the tensors, and where an output element goes. The including shader defines INPUTS
// and OUTPUTS, the buffer types of the operands (and bias) and of the output.
//   FORWARD:     m: output pixels (ow, oh, n), n: C_out, k: taps (kw, kh, ci)
//                A = the patch of x at the pixel, B = w as [K, C_out]; C -> o [W', H', C_out, N],
//                plus the bias of its channel and the activation (conv2d's epilogue) where unsplit
//   BACK_INPUT:  per stride phase (z), m: its input pixels (ix, iy, n), n: C_in, k: the taps that
//                reach them (kw, kh, co); A = the g [W', H', C_out, N] that the pixel reached through
//                tap (kw, kh), 0 where the tap falls outside; B = w; C -> o = d x [W, H, C_in, N]
//   BACK_WEIGHT: m: taps (kw, kh, ci), n: C_out, k: output pixels; A = x at the tap of each
//                pixel, B = g; C -> o = d w [K, C_out]
// Split k: where the output has too few tiles to keep the GPU busy, the reduction is cut into z
// slices of pc.split_k (BACK_INPUT: each stride phase's reduction alike), each writing its partial
// sum as a whole f32 output, one after the other from pc.o; sum_splits.comp adds them in order.

layout(push_constant) uniform Push {
    INPUTS a;  // FORWARD, BACK_WEIGHT: x; BACK_INPUT: g
    INPUTS b;  // FORWARD, BACK_INPUT: w; BACK_WEIGHT: g
    OUTPUTS o;
    uint in_w, in_h, c_in, n;
    uint k_w, k_h, c_out;
    uint out_w, out_h;
    uint stride_w, stride_h, pad_w, pad_h, dil_w, dil_h;
    uint m, cols, k;  // the GEMM's sizes (BACK_WEIGHT: k is every output pixel)
    uint groups_m;    // tiles along m
    uint split_k;     // the reduction's length per z slice (k, or more, where it is not split)
    uint tap_step_w, tap_step_h;  // BACK_INPUT: the least t with t dil = 0 mod stride, per axis
    uint epilogue;    // FORWARD, unsplit: bits 0-1 the activation (linear's codes), after bias[C_out] where bit 2 is set
    INPUTS bias;
} pc;

// What an invocation knows of the row of A it stages: offsets of its pixel or tap, valid false
// past the last row.
struct Row {
    int x0, y0;  // FORWARD: the window's corner (ow sw - pw, oh sh - ph); BACK_INPUT: (ix + pw, iy + ph);
                 // BACK_WEIGHT: the tap's offset (kw dw - pw, kh dh - ph)
    uint base;   // FORWARD: x's image n; BACK_INPUT: g's image n; BACK_WEIGHT: x's channel ci
    bool valid;
};

uint taps() { return pc.k_w * pc.k_h; }

// A position k along the reduction as three coordinates, a fastest (FORWARD: kw, kh, ci;
// BACK_INPUT: the phase's tap indices along w and h, co; BACK_WEIGHT: ow, oh, n), which load_a and
// load_b read: decoded once by walk_at, then stepped along k by walk_step without a division.
struct Walk {
    uint k, a, b, c;
};

uvec2 walk_sizes();  // how many values a and b take

Walk walk_at(uint k) {
    uvec2 size = walk_sizes();
    return Walk(k, k % size.x, (k / size.x) % size.y, k / (size.x * size.y));
}

void walk_step(inout Walk w) {
    uvec2 size = walk_sizes();
    ++w.k;
    if (++w.a < size.x) return;
    w.a = 0;
    if (++w.b < size.y) return;
    w.b = 0;
    ++w.c;
}

#if defined(FORWARD)

uint phases() { return 1u; }
uint setup() { return pc.k; }  // the reduction's length
uint gemm_rows() { return pc.m; }

Row row_of(uint r) {
    uint pixels = pc.out_w * pc.out_h, p = r % pixels;
    int ow = int(p % pc.out_w), oh = int(p / pc.out_w);
    return Row(ow * int(pc.stride_w) - int(pc.pad_w), oh * int(pc.stride_h) - int(pc.pad_h),
               (r / pixels) * pc.in_w * pc.in_h * pc.c_in, r < pc.m);
}

uvec2 walk_sizes() { return uvec2(pc.k_w, pc.k_h); }

float load_a(Row row, Walk w) {
    int ix = row.x0 + int(w.a * pc.dil_w), iy = row.y0 + int(w.b * pc.dil_h);
    if (ix < 0 || iy < 0 || ix >= int(pc.in_w) || iy >= int(pc.in_h)) return 0.0;
    return float(pc.a.v[row.base + uint(ix) + pc.in_w * (uint(iy) + pc.in_h * w.c)]);
}

float load_b(Walk w, uint col) { return float(pc.b.v[w.k + pc.k * col]); }

uint output_elements() { return pc.out_w * pc.out_h * pc.c_out * pc.n; }

uint output_index(uint r, uint col) {
    uint pixels = pc.out_w * pc.out_h;
    return r % pixels + pixels * (col + pc.c_out * (r / pixels));
}

// conv2d's epilogue on a whole sum (the kernel's where the reduction is not split)
float epilogue(float v, uint col) {
    if ((pc.epilogue & 4u) != 0u) v += float(pc.bias.v[col]);
    return linear_activation(pc.epilogue & 3u, v);
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

uint gemm_rows() { return ax.count * ay.count * pc.n; }  // the phase's

// the phase's row r as (ix, iy, n)
uvec3 pixel_of(uint r) {
    return uvec3(ax.first + (r % ax.count) * pc.stride_w, ay.first + ((r / ax.count) % ay.count) * pc.stride_h,
                 r / (ax.count * ay.count));
}

Row row_of(uint r) {
    if (r >= gemm_rows()) return Row(0, 0, 0, false);
    uvec3 p = pixel_of(r);
    return Row(int(p.x + pc.pad_w), int(p.y + pc.pad_h), p.z * pc.out_w * pc.out_h * pc.c_out, true);
}

uvec2 walk_sizes() { return uvec2(ax.taps, ay.taps); }

// the phase's tap w as (kw, kh, co)
uvec3 tap_of(Walk w) { return uvec3(ax.tap0 + w.a * ax.tap_step, ay.tap0 + w.b * ay.tap_step, w.c); }

// the g of the output pixel that read this input pixel through tap (kw, kh) of output channel co
float load_a(Row row, Walk w) {
    uvec3 t = tap_of(w);
    int tx = row.x0 - int(t.x * pc.dil_w), ty = row.y0 - int(t.y * pc.dil_h);  // multiples of the strides
    if (tx < 0 || ty < 0) return 0.0;
    uint ow = uint(tx) / pc.stride_w, oh = uint(ty) / pc.stride_h;
    if (ow >= pc.out_w || oh >= pc.out_h) return 0.0;
    return float(pc.a.v[row.base + ow + pc.out_w * (oh + pc.out_h * t.z)]);
}

float load_b(Walk w, uint ci) {
    uvec3 t = tap_of(w);
    return float(pc.b.v[t.x + pc.k_w * (t.y + pc.k_h * (ci + pc.c_in * t.z))]);
}

uint output_elements() { return pc.in_w * pc.in_h * pc.c_in * pc.n; }

uint output_index(uint r, uint ci) {
    uvec3 p = pixel_of(r);
    return p.x + pc.in_w * (p.y + pc.in_h * (ci + pc.c_in * p.z));
}

float epilogue(float v, uint col) { return v; }

#elif defined(BACK_WEIGHT)

uint phases() { return 1u; }
uint setup() { return pc.k; }
uint gemm_rows() { return pc.m; }

Row row_of(uint k) {
    uint tap = k % taps();
    return Row(int((tap % pc.k_w) * pc.dil_w) - int(pc.pad_w), int((tap / pc.k_w) * pc.dil_h) - int(pc.pad_h),
               (k / taps()) * pc.in_w * pc.in_h, k < pc.m);
}

uvec2 walk_sizes() { return uvec2(pc.out_w, pc.out_h); }

// x at this tap of output pixel w (ow, oh, n)
float load_a(Row row, Walk w) {
    int ix = row.x0 + int(w.a * pc.stride_w), iy = row.y0 + int(w.b * pc.stride_h);
    if (ix < 0 || iy < 0 || ix >= int(pc.in_w) || iy >= int(pc.in_h)) return 0.0;
    return float(pc.a.v[row.base + uint(ix) + pc.in_w * (uint(iy) + pc.in_h * pc.c_in * w.c)]);
}

float load_b(Walk w, uint co) {
    return float(pc.b.v[w.a + pc.out_w * (w.b + pc.out_h * (co + pc.c_out * w.c))]);
}

uint output_elements() { return pc.m * pc.cols; }

uint output_index(uint k, uint co) { return k + pc.m * co; }

float epilogue(float v, uint col) { return v; }

#endif

// The z slice of the reduction this workgroup sums (z = phase + phases * slice).
uint split() { return gl_WorkGroupID.z / phases(); }
