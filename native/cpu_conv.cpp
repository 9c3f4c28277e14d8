// 2-D convolution and max pooling of images, as ggml's conv_2d lays them out (ne order, dim 0
// fastest): images x [W, H, C, N], kernels w [KW, KH, C_in, C_out], results [W', H', C, N], so that
// PyTorch's C-order (N, C, H, W) batches and (C_out, C_in, KH, KW) weights are the same bytes.
//
// The CPU convolution is a GEMM per band of output rows of one image: the band's patches
// [K, pixels] (K = KW * KH * C_in, a pixel's taps contiguous in w's (kw, kh, ci) order, so each
// kernel row's KW taps are one short contiguous copy from x) are gathered into a per-thread
// scratch and multiplied, transposed, by w seen as [K, C_out] through the BLAS, straight into the
// output, where a band of an image is a [pixels, C_out] matrix of leading dimension W' H' (no
// reordering pass). The backward passes multiply the same bands the other way round. Bands are the parallel tasks, each one BLAS call on its thread: DQN's products are small
// (400 x 32 x 256 an image at NatureCNN's first layer), too small to split further.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

#include "blas.hpp"
#include "conv.hpp"
#include "kernel_util.hpp"
#include "strided_product.hpp"

namespace rk {

// ---- shapes ------------------------------------------------------------------------------

namespace {

std::string pair_str(int64_t w, int64_t h) { return "(w " + std::to_string(w) + ", h " + std::to_string(h) + ")"; }

// The output size along one axis: (in + 2 pad - dil (k - 1) - 1) / stride + 1, every term checked.
int64_t conv_out_size(const char* op, const char* axis, int64_t in, int64_t k, int64_t stride, int64_t pad,
                      int64_t dil, const std::string& shapes) {
    const int64_t padded = size_add(in, size_mul(2, pad));
    const int64_t span = size_add(size_mul(dil, k - 1), 1);
    if (span > padded)
        throw std::invalid_argument(op_err(op, shapes + ": the kernel spans " + std::to_string(span) + " along the " + axis +
                                               " (dilation x (kernel - 1) + 1) but the padded input is only " +
                                               std::to_string(padded) + " (input + 2 x padding); expected a kernel "
                                               "that fits the padded input"));
    return (padded - span) / stride + 1;
}

void require_positive(const char* op, const char* what, int64_t w, int64_t h, int64_t least) {
    if (w < least || h < least)
        throw std::invalid_argument(op_err(op, std::string(what) + " " + pair_str(w, h) + " must be at least " +
                                               std::to_string(least)));
}

void require_float_pair(const char* op, const TensorImpl& a, const char* a_name, const TensorImpl& b, const char* b_name) {
    require_float(op, a, a_name);
    require_float(op, b, b_name);
    if (a.dtype != b.dtype)
        throw TypeError(op_err(op, std::string(a_name) + " is " + dtype_name(a.dtype) + " but " + b_name + " is " +
                                       dtype_name(b.dtype) + " (expected the same float dtype)"));
}

}  // namespace

ConvParams conv_params(const char* op, const OpAttrs& attrs, size_t extra) {
    if (attrs.ints.size() != 6 + extra)
        throw std::invalid_argument(op_err(op, "expected ints stride, padding, dilation as (w, h) pairs" +
                                               std::string(extra == 2 ? " then 2 sizes" : extra == 1 ? " then the activation" : "") +
                                               "; got " +
                                               std::to_string(attrs.ints.size()) + " ints"));
    const auto& i = attrs.ints;
    ConvParams p{i[0], i[1], i[2], i[3], i[4], i[5]};
    require_positive(op, "stride", p.stride_w, p.stride_h, 1);
    require_positive(op, "padding", p.pad_w, p.pad_h, 0);
    require_positive(op, "dilation", p.dil_w, p.dil_h, 1);
    return p;
}

ConvGeometry conv_geometry(const char* op, const Shape& x, const Shape& w, const ConvParams& p) {
    const std::string shapes = "x [" + std::to_string(x[0]) + ", " + std::to_string(x[1]) + ", " + std::to_string(x[2]) +
                               ", " + std::to_string(x[3]) + "], w [" + std::to_string(w[0]) + ", " + std::to_string(w[1]) +
                               ", " + std::to_string(w[2]) + ", " + std::to_string(w[3]) + "]";
    if (x[2] != w[2])
        throw std::invalid_argument(op_err(op, shapes + ": x [W, H, C, N] has C = " + std::to_string(x[2]) +
                                               " channels but w [KW, KH, C_in, C_out] expects C_in = " + std::to_string(w[2])));
    ConvGeometry g{x[0], x[1], x[2], x[3], w[0], w[1], w[3], p, 0, 0};
    g.out_w = conv_out_size(op, "width", g.in_w, g.k_w, p.stride_w, p.pad_w, p.dil_w, shapes);
    g.out_h = conv_out_size(op, "height", g.in_h, g.k_h, p.stride_h, p.pad_h, p.dil_h, shapes);
    size_mul(g.patch(), g.out_w, g.out_h, g.n);  // the implicit patch matrix's elements are indexable
    return g;
}

ConvEpilogue conv2d_epilogue(const Inputs& in, const OpAttrs& attrs, const ConvGeometry& g) {
    const TensorImpl* bias = in.size() == 3 ? in[2].get() : nullptr;
    if (bias) {
        require_float_pair("conv2d", *in[0], "x", *bias, "b");
        if (bias->numel() != g.c_out || bias->ne[0] != g.c_out)
            throw std::invalid_argument(op_err("conv2d", "b must hold C_out = " + std::to_string(g.c_out) +
                                                         " biases, shaped [" + std::to_string(g.c_out) + "] or [" +
                                                         std::to_string(g.c_out) + ", 1]; got " + bias->shape_str()));
    }
    const int64_t act = attrs.ints.size() == 7 ? attrs.ints[6] : 0;
    if (act < 0 || act > 3)
        throw std::invalid_argument(op_err("conv2d", "the activation is " + std::to_string(act) +
                                                     "; expected 0 none, 1 relu, 2 tanh or 3 sigmoid"));
    return {bias, Activation(act)};
}

ConvGeometry conv2d_geometry(const Inputs& in, const OpAttrs& attrs) {
    if (in.size() != 2 && in.size() != 3)
        throw std::invalid_argument(op_err("conv2d", "expected 2 inputs (x, w) or 3 (x, w, b), got " + std::to_string(in.size())));
    const TensorImpl &x = *in[0], &w = *in[1];
    require_float_pair("conv2d", x, "x", w, "w");
    const size_t extra = attrs.ints.size() == 7 ? 1 : 0;  // the activation
    return conv_geometry("conv2d", x.ne, w.ne, conv_params("conv2d", attrs, extra));
}

OutSpec shape_conv2d(const Inputs& in, const OpAttrs& attrs) {
    const ConvGeometry g = conv2d_geometry(in, attrs);
    conv2d_epilogue(in, attrs, g);
    return OutSpec{{g.out_w, g.out_h, g.c_out, g.n}, 4, in[0]->dtype};
}

// (g [W', H', C_out, N], w) -> dx [W, H, C_in, N]; ints: the conv's, then W, H
OutSpec shape_conv2d_input_back(const Inputs& in, const OpAttrs& attrs) {
    const TensorImpl &dy = *in[0], &w = *in[1];
    require_float_pair("conv2d_input_back", dy, "g", w, "w");
    const ConvGeometry geo = back_input_geometry(dy, w, attrs);
    return OutSpec{{geo.in_w, geo.in_h, geo.c_in, geo.n}, 4, dy.dtype};
}

// (g [W', H', C_out, N], x) -> dw [KW, KH, C_in, C_out]; ints: the conv's, then KW, KH
OutSpec shape_conv2d_weight_back(const Inputs& in, const OpAttrs& attrs) {
    const TensorImpl &dy = *in[0], &x = *in[1];
    require_float_pair("conv2d_weight_back", dy, "g", x, "x");
    const ConvGeometry geo = back_weight_geometry(dy, x, attrs);
    return OutSpec{{geo.k_w, geo.k_h, geo.c_in, geo.c_out}, 4, dy.dtype};
}

namespace {

void require_output_shape(const char* op, const TensorImpl& dy, const ConvGeometry& geo) {
    if (dy.ne[0] != geo.out_w || dy.ne[1] != geo.out_h || dy.ne[2] != geo.c_out || dy.ne[3] != geo.n)
        throw std::invalid_argument(op_err(op, "g " + dy.shape_str() + " is not the convolution's output shape [" +
                                               std::to_string(geo.out_w) + ", " + std::to_string(geo.out_h) + ", " +
                                               std::to_string(geo.c_out) + ", " + std::to_string(geo.n) + "]"));
}

}  // namespace

ConvGeometry back_input_geometry(const TensorImpl& dy, const TensorImpl& w, const OpAttrs& attrs) {
    const char* op = "conv2d_input_back";
    const ConvParams p = conv_params(op, attrs, 2);
    const int64_t in_w = attrs.ints[6], in_h = attrs.ints[7];
    require_positive(op, "input size", in_w, in_h, 1);
    const ConvGeometry geo = conv_geometry(op, {in_w, in_h, w.ne[2], dy.ne[3]}, w.ne, p);
    require_output_shape(op, dy, geo);
    return geo;
}

ConvGeometry back_weight_geometry(const TensorImpl& dy, const TensorImpl& x, const OpAttrs& attrs) {
    const char* op = "conv2d_weight_back";
    const ConvParams p = conv_params(op, attrs, 2);
    const int64_t k_w = attrs.ints[6], k_h = attrs.ints[7];
    require_positive(op, "kernel size", k_w, k_h, 1);
    const ConvGeometry geo = conv_geometry(op, x.ne, {k_w, k_h, x.ne[2], dy.ne[2]}, p);
    require_output_shape(op, dy, geo);
    return geo;
}

// ---- the CPU convolution -------------------------------------------------------------------

namespace {

// Elements of one band's patch matrix: a band of a DQN-sized image fits in a core's L2 cache with
// its output, and the scratch stays small whatever the batch.
constexpr int64_t kBandBudget = int64_t(1) << 17;
// The weight gradient sums its bands in this many fixed groups (fewer where there are fewer bands),
// each on one thread, then adds the groups up in order: enough groups to keep a few cores busy,
// few enough that adding them up stays cheap.
constexpr int64_t kWeightGroups = 16;
// ... and each group at least this many output pixels deep where there are enough: NatureCNN's
// third layer in 16 groups made products of depth 98 (two 7 x 7 images), whose tiles spend a
// larger share of their time loading and storing, and every group adds a K x C_out block to the
// final sum.
constexpr int64_t kWeightGroupPixels = 256;

// Output rows [oh_begin, oh_end) of image n: one task's slice of the patch matrix.
struct Band {
    int64_t n, oh_begin, oh_end;
};

// How an image's output rows are cut into bands: the same for every image, from the shape alone.
struct Banding {
    int64_t rows_per_band, per_image, total;
};

Banding banding(const ConvGeometry& g) {
    const int64_t row_elements = size_mul(g.out_w, g.patch());
    const int64_t most_rows = std::clamp<int64_t>(kBandBudget / row_elements, 1, g.out_h);
    const int64_t per_image = (g.out_h + most_rows - 1) / most_rows;
    const int64_t rows_per_band = (g.out_h + per_image - 1) / per_image;  // even bands
    const int64_t per_image_even = (g.out_h + rows_per_band - 1) / rows_per_band;
    return {rows_per_band, per_image_even, size_mul(per_image_even, g.n)};
}

// The number of groups: from the shape alone, so the rounding is the same with any thread count.
int64_t weight_groups(const ConvGeometry& g, const Banding& b) {
    const int64_t deep_enough = std::max<int64_t>(1, size_mul(g.pixels(), g.n) / kWeightGroupPixels);
    return std::min({b.total, kWeightGroups, deep_enough});
}

Band band_at(const ConvGeometry& g, const Banding& b, int64_t index) {
    const int64_t n = index / b.per_image, begin = (index % b.per_image) * b.rows_per_band;
    return {n, begin, std::min(begin + b.rows_per_band, g.out_h)};
}

int64_t band_pixels(const ConvGeometry& g, const Band& b) { return (b.oh_end - b.oh_begin) * g.out_w; }

// The band's first pixel in an output-shaped tensor [W', H', C_out, N]; its channels lie
// W' H' apart, so a band is a [pixels, C_out] matrix of leading dimension W' H'.
template <typename T>
T* band_origin(const ConvGeometry& g, const Band& b, T* image) {
    return image + g.out_w * (b.oh_begin + g.out_h * g.c_out * b.n);
}

// Reusable buffers per thread, float type and use: a band's patches and the weight gradient's
// group sums, without an allocation per band or per call (a fresh block of megabytes came back
// from the kernel as new zeroed pages each time: 5% of a DQN update). Each keeps its largest size
// for the thread's life.
struct PatchScratch {};
struct GroupSumScratch {};

template <typename T, typename Use = PatchScratch>
T* thread_scratch(int64_t elements) {
    thread_local std::vector<T> buffer;
    if (buffer.size() < size_t(elements)) buffer.resize(size_t(elements));
    return buffer.data();
}

// Patch entry k = (kw, kh, ci): the tap that reads x at (ow stride + kw dil - pad, ...).
struct Tap {
    int64_t kw, kh, ci;
};
Tap tap_of(const ConvGeometry& g, int64_t k) { return {k % g.k_w, (k / g.k_w) % g.k_h, k / (g.k_w * g.k_h)}; }

// Calls visit(taps, row, x0, inside) for each output pixel of the band (in pixel order) and each
// (ci, kh) of the kernel: taps is the pixel's KW patch entries of that input channel and kernel
// row (entry kw reads row[x0 + kw dil_w]), row the input row they read (null where it is the
// padding), inside whether every tap of the pixel reads inside the row (dilation 1). A pixel's K
// patch entries are contiguous, (kw, kh, ci) in w's order, so the taps of one kernel row are KW
// neighbours in both x and the patches: short contiguous copies, not strided gathers (kKW > 0:
// the kernel width known at compile time).
template <int64_t kKW, typename T, typename P, typename F>
void for_each_pixel_row(const ConvGeometry& g, const Band& b, T* x, P* patches, F&& visit) {
    const int64_t k_w = kKW > 0 ? kKW : g.k_w, span = (k_w - 1) * g.p.dil_w + 1;
    T* image = x + g.in_w * g.in_h * g.c_in * b.n;
    P* taps = patches;
    for (int64_t oh = b.oh_begin; oh < b.oh_end; ++oh)
        for (int64_t ow = 0; ow < g.out_w; ++ow) {
            const int64_t x0 = ow * g.p.stride_w - g.p.pad_w;
            const bool inside = g.p.dil_w == 1 && x0 >= 0 && x0 + span <= g.in_w;
            for (int64_t ci = 0; ci < g.c_in; ++ci)
                for (int64_t kh = 0; kh < g.k_h; ++kh, taps += k_w) {
                    const int64_t iy = oh * g.p.stride_h + kh * g.p.dil_h - g.p.pad_h;
                    visit(taps, iy < 0 || iy >= g.in_h ? nullptr : image + g.in_w * (iy + g.in_h * ci), x0, inside);
                }
        }
}

// patches [K, band pixels] (column-major: a pixel's K entries contiguous) = the band's patches of x
template <int64_t kKW, typename T>
void gather_band_kw(const ConvGeometry& g, const T* x, const Band& b, T* patches) {
    const int64_t k_w = kKW > 0 ? kKW : g.k_w;
    for_each_pixel_row<kKW>(g, b, x, patches, [&](T* taps, const T* row, int64_t x0, bool inside) {
        if (!row) return void(std::fill_n(taps, k_w, T(0)));
        if (inside) return void(std::memcpy(taps, row + x0, size_t(k_w) * sizeof(T)));  // kKW > 0: a few vector moves
        for (int64_t kw = 0; kw < k_w; ++kw) {
            const int64_t ix = x0 + kw * g.p.dil_w;
            taps[kw] = ix >= 0 && ix < g.in_w ? row[ix] : T(0);
        }
    });
}

// dx += the band's patch gradients [K, band pixels], put back where gather_band read them
// (pixel by pixel, in pixel order)
template <int64_t kKW, typename T>
void scatter_band_kw(const ConvGeometry& g, const T* patches, const Band& b, T* dx) {
    const int64_t k_w = kKW > 0 ? kKW : g.k_w;
    for_each_pixel_row<kKW>(g, b, dx, patches, [&](const T* taps, T* row, int64_t x0, bool inside) {
        if (!row) return;
        if (inside) {
            for (int64_t kw = 0; kw < k_w; ++kw) row[x0 + kw] += taps[kw];
            return;
        }
        for (int64_t kw = 0; kw < k_w; ++kw) {
            const int64_t ix = x0 + kw * g.p.dil_w;
            if (ix >= 0 && ix < g.in_w) row[ix] += taps[kw];
        }
    });
}

// The kernel widths of NatureCNN and ImpalaCNN (3, 4, 8) with their copies unrolled.
template <typename T>
void gather_band(const ConvGeometry& g, const T* x, const Band& b, T* patches) {
    switch (g.k_w) {
        case 3: return gather_band_kw<3>(g, x, b, patches);
        case 4: return gather_band_kw<4>(g, x, b, patches);
        case 8: return gather_band_kw<8>(g, x, b, patches);
        default: return gather_band_kw<0>(g, x, b, patches);
    }
}

template <typename T>
void scatter_band(const ConvGeometry& g, const T* patches, const Band& b, T* dx) {
    switch (g.k_w) {
        case 3: return scatter_band_kw<3>(g, patches, b, dx);
        case 4: return scatter_band_kw<4>(g, patches, b, dx);
        case 8: return scatter_band_kw<8>(g, patches, b, dx);
        default: return scatter_band_kw<0>(g, patches, b, dx);
    }
}

// The three products of a band: f32 through the AVX-512 strided products where the CPU has them
// (read in place, the forward's result written transposed), else through the BLAS.
bool use_strided(float) { return strided_products_available(); }
bool use_strided(double) { return false; }

// out band [pixels, C_out] (leading dimension W' H') = patches^T w; w_t: w as [C_out, K], for the
// strided product alone
template <typename T>
void forward_product(const ConvGeometry& g, const T* patches, int64_t pixels, const T* w, const T* w_t, T* out_band) {
    if constexpr (std::is_same_v<T, float>)
        if (use_strided(T{}))
            return strided_product({g.c_out, pixels, g.patch(), w_t, g.c_out, patches, 1, g.patch(), out_band, g.pixels(), 1, false});
    gemm_serial(true, false, pixels, g.c_out, g.patch(), patches, g.patch(), w, g.patch(), out_band, g.pixels(), false);
}

// patch gradients [K, pixels] = w g_band^T
template <typename T>
void input_back_product(const ConvGeometry& g, const T* w, const T* dy_band, int64_t pixels, T* patches) {
    if constexpr (std::is_same_v<T, float>)
        if (use_strided(T{}))
            return strided_product({g.patch(), pixels, g.c_out, w, g.patch(), dy_band, g.pixels(), 1, patches, 1, g.patch(), false});
    gemm_serial(false, true, g.patch(), pixels, g.c_out, w, g.patch(), dy_band, g.pixels(), patches, g.patch(), false);
}

// dw [K, C_out] (+)= patches g_band
template <typename T>
void weight_back_product(const ConvGeometry& g, const T* patches, const T* dy_band, int64_t pixels, T* dw, bool accumulate) {
    if constexpr (std::is_same_v<T, float>)
        if (use_strided(T{}))
            return strided_product({g.patch(), g.c_out, pixels, patches, g.patch(), dy_band, 1, g.pixels(), dw, 1, g.patch(), accumulate});
    gemm_serial(false, false, g.patch(), g.c_out, pixels, patches, g.patch(), dy_band, g.pixels(), dw, g.patch(), accumulate);
}

struct TransposedWeightScratch {};
struct TransposedGradScratch {};

// Without padding every window lies inside the image, and the strided products read patches
// straight from x (no gathered copy): tap k of output pixel p of image n at
// n W H C_in + windows[p] + taps[k].
bool reads_in_place(const ConvGeometry& g) { return g.p.pad_w == 0 && g.p.pad_h == 0; }

struct PatchOffsets {
    std::vector<int64_t> taps, windows;
};

PatchOffsets patch_offsets(const ConvGeometry& g) {
    PatchOffsets o{std::vector<int64_t>(size_t(g.patch())), std::vector<int64_t>(size_t(g.pixels()))};
    for (int64_t k = 0; k < g.patch(); ++k) {
        const Tap t = tap_of(g, k);
        o.taps[size_t(k)] = t.kw * g.p.dil_w + g.in_w * (t.kh * g.p.dil_h + g.in_h * t.ci);
    }
    for (int64_t oh = 0; oh < g.out_h; ++oh)
        for (int64_t ow = 0; ow < g.out_w; ++ow)
            o.windows[size_t(ow + g.out_w * oh)] = ow * g.p.stride_w + g.in_w * oh * g.p.stride_h;
    return o;
}

// A group's share of dw, in place: dw^T [C_out, K] = g^T [C_out, pixels] patches^T over every pixel
// of bands [first, last) in order (one product of that depth), g transposed into a scratch and the
// patches read from x through offset tables; written transposed into sums [K, C_out].
void weight_back_in_place(const ConvGeometry& g, const Banding& bands, const PatchOffsets& offsets, const float* x,
                          const float* dy, int64_t first, int64_t last, float* sums) {
    int64_t pixels = 0;
    for (int64_t i = first; i < last; ++i) pixels += band_pixels(g, band_at(g, bands, i));
    float* g_t = thread_scratch<float, TransposedGradScratch>(size_mul(pixels, g.c_out));  // [C_out, pixels]
    int64_t* windows = thread_scratch<int64_t, TransposedGradScratch>(pixels);           // each pixel's window in x
    int64_t r = 0;
    for (int64_t i = first; i < last; ++i) {
        const Band b = band_at(g, bands, i);
        const float* dy_band = band_origin(g, b, dy);
        const int64_t image = g.in_w * g.in_h * g.c_in * b.n, start = g.out_w * b.oh_begin;
        for (int64_t p = 0; p < band_pixels(g, b); ++p, ++r) {
            windows[r] = image + offsets.windows[size_t(start + p)];
            for (int64_t c = 0; c < g.c_out; ++c) g_t[c + g.c_out * r] = dy_band[p + g.pixels() * c];
        }
    }
    strided_product({g.c_out, g.patch(), pixels, g_t, g.c_out, x, 0, 0, sums, g.patch(), 1, false, windows,
                     offsets.taps.data()});
}

// Bands per task of a parallel_for over bands: about kElementGrain multiply-adds at least.
int64_t band_grain(const ConvGeometry& g, const Banding& b) {
    const int64_t band_work = size_mul(b.rows_per_band * g.out_w, g.patch(), g.c_out);
    return std::max<int64_t>(1, kElementGrain / std::max<int64_t>(band_work, 1));
}

}  // namespace

// A band's bias and activation, in place: `pixels` outputs of each channel, channels W' H' apart.
// One loop per activation, so that each compiles to vector code.
template <typename T, typename Act>
void add_bias_then(const ConvGeometry& g, const T* bias, int64_t pixels, T* out_band, Act act) {
    for (int64_t c = 0; c < g.c_out; ++c) {
        T* column = out_band + c * g.pixels();
        const T add = bias ? bias[c] : T(0);
        for (int64_t p = 0; p < pixels; ++p) column[p] = act(T(column[p] + add));
    }
}

template <typename T>
void apply_epilogue(const ConvGeometry& g, const ConvEpilogue& epilogue, int64_t pixels, T* out_band) {
    const T* bias = epilogue.bias ? epilogue.bias->ptr<T>() : nullptr;
    switch (epilogue.act) {
        case Activation::none:
            if (bias) add_bias_then(g, bias, pixels, out_band, [](T z) { return z; });
            break;
        case Activation::relu: add_bias_then(g, bias, pixels, out_band, [](T z) { return relu_of(z); }); break;
        case Activation::tanh: add_bias_then(g, bias, pixels, out_band, [](T z) { return tanh_of(z); }); break;
        case Activation::sigmoid: add_bias_then(g, bias, pixels, out_band, [](T z) { return sigmoid_of(z); }); break;
    }
}

// Each band: its patches times w [K, C_out], written straight into the output, whose band is a
// [pixels, C_out] matrix of leading dimension W' H', then its bias and activation. Bands are
// independent tasks.
void cpu_conv2d(const Inputs& in, const OpAttrs& attrs, TensorImpl& out) {
    const TensorImpl &x = *in[0], &w = *in[1];
    const ConvGeometry g = conv2d_geometry(in, attrs);
    const ConvEpilogue epilogue = conv2d_epilogue(in, attrs, g);
    const Banding bands = banding(g);
    dispatch_float(out.dtype, [&](auto tag) {
        using T = decltype(tag);
        T* w_t = nullptr;  // w as [C_out, K], on this thread's scratch, read by every task
        if (use_strided(T{})) {
            w_t = thread_scratch<T, TransposedWeightScratch>(w.numel());
            const T* pw = w.ptr<T>();
            for (int64_t c = 0; c < g.c_out; ++c)
                for (int64_t k = 0; k < g.patch(); ++k) w_t[c + g.c_out * k] = pw[k + g.patch() * c];
        }
        const bool in_place = w_t && reads_in_place(g);
        const PatchOffsets offsets = in_place ? patch_offsets(g) : PatchOffsets{};
        parallel_for(bands.total, band_grain(g, bands), [&](int64_t lo, int64_t hi) {
            for (int64_t i = lo; i < hi; ++i) {
                const Band b = band_at(g, bands, i);
                T* out_band = band_origin(g, b, out.ptr<T>());
                bool done = false;
                if constexpr (std::is_same_v<T, float>)
                    if (in_place) {
                        const float* image = x.ptr<float>() + g.in_w * g.in_h * g.c_in * b.n;
                        strided_product({g.c_out, band_pixels(g, b), g.patch(), w_t, g.c_out, image, 0, 0, out_band,
                                         g.pixels(), 1, false, offsets.taps.data(),
                                         offsets.windows.data() + g.out_w * b.oh_begin});
                        done = true;
                    }
                if (!done) {
                    T* patches = thread_scratch<T>(band_pixels(g, b) * g.patch());
                    gather_band(g, x.ptr<T>(), b, patches);
                    forward_product(g, patches, band_pixels(g, b), w.ptr<T>(), w_t, out_band);
                }
                apply_epilogue(g, epilogue, band_pixels(g, b), out_band);  // while the band is in cache
            }
        });
    });
}

// Each band's patch gradients g_band [pixels, C_out] times w^T, added back into its image. One task
// per image: the bands of an image overlap in dx where the kernel is larger than the stride.
void cpu_conv2d_input_back(const Inputs& in, const OpAttrs& attrs, TensorImpl& out) {
    const TensorImpl &dy = *in[0], &w = *in[1];
    const ConvGeometry g = back_input_geometry(dy, w, attrs);
    const Banding bands = banding(g);
    const int64_t image_size = g.in_w * g.in_h * g.c_in;
    dispatch_float(out.dtype, [&](auto tag) {
        using T = decltype(tag);
        parallel_for(g.n, std::max<int64_t>(1, band_grain(g, bands) / bands.per_image), [&](int64_t lo, int64_t hi) {
            std::fill(out.ptr<T>() + lo * image_size, out.ptr<T>() + hi * image_size, T(0));
            for (int64_t i = lo * bands.per_image; i < hi * bands.per_image; ++i) {
                const Band b = band_at(g, bands, i);
                T* patches = thread_scratch<T>(band_pixels(g, b) * g.patch());
                input_back_product(g, w.ptr<T>(), band_origin(g, b, dy.ptr<T>()), band_pixels(g, b), patches);
                scatter_band(g, patches, b, out.ptr<T>());
            }
        });
    });
}

// dw [K, C_out] = the sum over bands of patches^T g_band. The bands fall into fixed groups (from
// the shape alone); each group sums its bands in order on one thread, and the groups' sums are
// added in group order: the same rounding on every run and with any number of threads.
void cpu_conv2d_weight_back(const Inputs& in, const OpAttrs& attrs, TensorImpl& out) {
    const TensorImpl &dy = *in[0], &x = *in[1];
    const ConvGeometry g = back_weight_geometry(dy, x, attrs);
    const Banding bands = banding(g);
    const int64_t groups = weight_groups(g, bands), dw_size = out.numel();
    dispatch_float(out.dtype, [&](auto tag) {
        using T = decltype(tag);
        T* sums = thread_scratch<T, GroupSumScratch>(size_mul(groups, dw_size));  // [K, C_out] per group, all written
        const bool in_place = use_strided(T{}) && reads_in_place(g);
        const PatchOffsets offsets = in_place ? patch_offsets(g) : PatchOffsets{};
        parallel_for(groups, 1, [&](int64_t lo, int64_t hi) {
            for (int64_t group = lo; group < hi; ++group) {
                const int64_t first = bands.total * group / groups, last = bands.total * (group + 1) / groups;
                if constexpr (std::is_same_v<T, float>)
                    if (in_place) {
                        weight_back_in_place(g, bands, offsets, x.ptr<float>(), dy.ptr<float>(), first, last,
                                             sums + group * dw_size);
                        continue;
                    }
                for (int64_t i = first; i < last; ++i) {
                    const Band b = band_at(g, bands, i);
                    T* patches = thread_scratch<T>(band_pixels(g, b) * g.patch());
                    gather_band(g, x.ptr<T>(), b, patches);
                    weight_back_product(g, patches, band_origin(g, b, dy.ptr<T>()), band_pixels(g, b),
                                        sums + group * dw_size, i != first);
                }
            }
        });
        T* dw = out.ptr<T>();
        parallel_for(dw_size, kElementGrain, [&](int64_t lo, int64_t hi) {
            std::copy(sums + lo, sums + hi, dw + lo);
            for (int64_t group = 1; group < groups; ++group)
                for (int64_t e = lo; e < hi; ++e) dw[e] += sums[group * dw_size + e];
        });
    });
}

// ---- max pooling ---------------------------------------------------------------------------

namespace {

int64_t column_grain(int64_t rows) { return std::max<int64_t>(1, kElementGrain / std::max<int64_t>(rows, 1)); }

}  // namespace

PoolGeometry pool_geometry(const char* op, const TensorImpl& x, const OpAttrs& attrs) {
    require_float(op, x, "x");
    if (attrs.ints.size() != 6)
        throw std::invalid_argument(op_err(op, "expected ints kernel, stride, padding as (w, h) pairs; got " +
                                               std::to_string(attrs.ints.size()) + " ints"));
    const auto& i = attrs.ints;
    PoolGeometry g{x.ne[0], x.ne[1], x.ne[2] * x.ne[3], i[0], i[1], i[2], i[3], i[4], i[5], 0, 0};
    require_positive(op, "kernel", g.k_w, g.k_h, 1);
    require_positive(op, "stride", g.stride_w, g.stride_h, 1);
    require_positive(op, "padding", g.pad_w, g.pad_h, 0);
    // every window then holds an element of x (PyTorch's rule too): a window of padding alone has no maximum
    if (2 * g.pad_w > g.k_w || 2 * g.pad_h > g.k_h)
        throw std::invalid_argument(op_err(op, "padding " + pair_str(g.pad_w, g.pad_h) + " must be at most half the kernel " +
                                               pair_str(g.k_w, g.k_h)));
    const std::string shape = "x " + x.shape_str();
    g.out_w = conv_out_size(op, "width", g.in_w, g.k_w, g.stride_w, g.pad_w, 1, shape);
    g.out_h = conv_out_size(op, "height", g.in_h, g.k_h, g.stride_h, g.pad_h, 1, shape);
    return g;
}

OutSpec shape_max_pool2d(const Inputs& in, const OpAttrs& attrs) {
    const TensorImpl& x = *in[0];
    const PoolGeometry g = pool_geometry("max_pool2d", x, attrs);
    return OutSpec{{g.out_w, g.out_h, x.ne[2], x.ne[3]}, 4, x.dtype};
}

// (g like max_pool2d's output, x) -> dx like x; ints: max_pool2d's
OutSpec shape_max_pool2d_back(const Inputs& in, const OpAttrs& attrs) {
    const TensorImpl &dy = *in[0], &x = *in[1];
    require_float_pair("max_pool2d_back", dy, "g", x, "x");
    const PoolGeometry g = pool_geometry("max_pool2d_back", x, attrs);
    if (dy.ne[0] != g.out_w || dy.ne[1] != g.out_h || dy.ne[2] != x.ne[2] || dy.ne[3] != x.ne[3])
        throw std::invalid_argument(op_err("max_pool2d_back", "g " + dy.shape_str() + " is not the pooling's output shape for x " +
                                                                 x.shape_str()));
    return same_as(x);
}

namespace {

// The offset in its plane of the element a window keeps: its first maximum in memory order (rows
// of the window top to bottom, each left to right), or its first NaN, which a NaN-propagating max
// would return. The padding is -inf: never kept, since every window holds an element of x.
template <typename T>
int64_t window_argmax(const PoolGeometry& g, const T* plane, int64_t ow, int64_t oh) {
    const int64_t x0 = ow * g.stride_w - g.pad_w, y0 = oh * g.stride_h - g.pad_h;
    int64_t best = -1;
    for (int64_t iy = std::max<int64_t>(y0, 0); iy < std::min(y0 + g.k_h, g.in_h); ++iy)
        for (int64_t ix = std::max<int64_t>(x0, 0); ix < std::min(x0 + g.k_w, g.in_w); ++ix) {
            const int64_t i = ix + g.in_w * iy;
            if (best < 0 || (!std::isnan(plane[best]) && (plane[i] > plane[best] || std::isnan(plane[i])))) best = i;
        }
    return best;
}

}  // namespace

void cpu_max_pool2d(const Inputs& in, const OpAttrs& attrs, TensorImpl& out) {
    const TensorImpl& x = *in[0];
    const PoolGeometry g = pool_geometry("max_pool2d", x, attrs);
    dispatch_float(out.dtype, [&](auto tag) {
        using T = decltype(tag);
        const T* px = x.ptr<T>();
        T* po = out.ptr<T>();
        parallel_for(g.planes, column_grain(g.in_w * g.in_h), [&](int64_t lo, int64_t hi) {
            for (int64_t c = lo; c < hi; ++c) {
                const T* plane = px + c * g.in_w * g.in_h;
                for (int64_t oh = 0; oh < g.out_h; ++oh)
                    for (int64_t ow = 0; ow < g.out_w; ++ow)
                        po[ow + g.out_w * (oh + g.out_h * c)] = plane[window_argmax(g, plane, ow, oh)];
            }
        });
    });
}

// Each window's gradient goes to the element it kept (summed where windows overlap); one task per
// plane, so no two tasks write one element.
void cpu_max_pool2d_back(const Inputs& in, const OpAttrs& attrs, TensorImpl& out) {
    const TensorImpl &dy = *in[0], &x = *in[1];
    const PoolGeometry g = pool_geometry("max_pool2d_back", x, attrs);
    dispatch_float(out.dtype, [&](auto tag) {
        using T = decltype(tag);
        const T *px = x.ptr<T>(), *pg = dy.ptr<T>();
        T* po = out.ptr<T>();
        const int64_t plane_size = g.in_w * g.in_h;
        parallel_for(g.planes, column_grain(plane_size), [&](int64_t lo, int64_t hi) {
            for (int64_t c = lo; c < hi; ++c) {
                const T* plane = px + c * plane_size;
                T* grad = po + c * plane_size;
                std::fill_n(grad, plane_size, T(0));
                for (int64_t oh = 0; oh < g.out_h; ++oh)
                    for (int64_t ow = 0; ow < g.out_w; ++ow)
                        grad[window_argmax(g, plane, ow, oh)] += pg[ow + g.out_w * (oh + g.out_h * c)];
            }
        });
    });
}

}  // namespace rk
