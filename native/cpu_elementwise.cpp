// Elementwise ops: the shape rules and CPU kernels of the ops of native/elementwise.def, and cast.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <type_traits>

#include "cpu_features.hpp"
#include "kernel_util.hpp"

namespace rk {
namespace {

OutSpec broadcast_spec(const char* op, const Inputs& in) {
    const TensorImpl &a = *in[0], &b = *in[1];
    require_same_float(op, a, b);
    OutSpec spec;
    spec.dtype = a.dtype;
    spec.ndim = std::max(a.ndim, b.ndim);
    for (int d = 0; d < kMaxDims; ++d) {
        if (a.ne[d] != b.ne[d] && a.ne[d] != 1 && b.ne[d] != 1)
            throw std::invalid_argument(op_err(op, "shapes " + a.shape_str() + " and " + b.shape_str() +
                                                       " do not broadcast (each dimension must match or be 1)"));
        spec.ne[d] = std::max(a.ne[d], b.ne[d]);
    }
    return spec;
}

template <typename T, typename F>
void binary_kernel(const TensorImpl& a, const TensorImpl& b, TensorImpl& out, F f) {
    const T* pa = a.ptr<T>();
    const T* pb = b.ptr<T>();
    T* po = out.ptr<T>();
    const int64_t n = out.numel();
    if (a.numel() == n && b.numel() == n) {
        parallel_for(n, kElementGrain, [&](int64_t lo, int64_t hi) {
            for (int64_t i = lo; i < hi; ++i) po[i] = f(pa[i], pb[i]);
        });
        return;
    }
    const Shape sa = broadcast_strides(a, out.ne), sb = broadcast_strides(b, out.ne);
    const int64_t ne0 = out.ne[0], ne1 = out.ne[1], ne2 = out.ne[2];
    const int64_t rows = n / ne0;
    parallel_for(rows, std::max<int64_t>(1, kElementGrain / ne0), [&](int64_t lo, int64_t hi) {
        for (int64_t r = lo; r < hi; ++r) {
            const int64_t i1 = r % ne1, i2 = (r / ne1) % ne2, i3 = r / (ne1 * ne2);
            const T* ra = pa + i1 * sa[1] + i2 * sa[2] + i3 * sa[3];
            const T* rb = pb + i1 * sb[1] + i2 * sb[2] + i3 * sb[3];
            T* ro = po + r * ne0;
            if (sa[0] && sb[0]) {
                for (int64_t i = 0; i < ne0; ++i) ro[i] = f(ra[i], rb[i]);
            } else if (sb[0]) {
                for (int64_t i = 0; i < ne0; ++i) ro[i] = f(ra[0], rb[i]);
            } else if (sa[0]) {
                for (int64_t i = 0; i < ne0; ++i) ro[i] = f(ra[i], rb[0]);
            } else {
                for (int64_t i = 0; i < ne0; ++i) ro[i] = f(ra[0], rb[0]);
            }
        }
    });
}

// The unary ops whose loop over floats has an AVX2 + FMA build beside the baseline's, chosen at
// run time: those that compute exp's polynomial (exp_of, tanh_of; softplus also log1p_of's), 8
// lanes with FMA against the baseline's 4 (exp: 0.66 ns an element on a 2-core EPYC VM, 2.2 with
// 4 lanes, 3.5 for glibc's expf per element). Nothing else in their values is a product added to
// something, so the two builds differ only inside those polynomials (both within 2 ulp, tanh 3).
constexpr bool has_wide_build(Op op) {
    return op == Op::exp || op == Op::sigmoid || op == Op::silu || op == Op::tanh || op == Op::softplus;
}

#ifdef RK_X86_TARGETS
template <typename F>
__attribute__((target("avx2,fma"))) void map_floats_wide(const float* x, float* out, int64_t n, F f) {
    for (int64_t i = 0; i < n; ++i) out[i] = f(x[i]);
}
#endif
std::atomic<bool> wide_builds{cpu_has_avx2_fma()};  // other processors: the baseline's loops

template <typename T, Op op, typename F>
void unary_kernel(const TensorImpl& x, TensorImpl& out, F f) {
    const T* px = x.ptr<T>();
    T* po = out.ptr<T>();
    parallel_for(x.numel(), kElementGrain, [&](int64_t lo, int64_t hi) {
#ifdef RK_X86_TARGETS
        if constexpr (std::is_same_v<T, float> && has_wide_build(op)) {
            if (wide_builds.load(std::memory_order_relaxed)) return map_floats_wide(px + lo, po + lo, hi - lo, f);
        }
#endif
        for (int64_t i = lo; i < hi; ++i) po[i] = f(px[i]);
    });
}

void require_float_attrs(const char* op, const OpAttrs& attrs, size_t n) {
    if (attrs.floats.size() != n)
        throw std::invalid_argument(op_err(op, "expected " + std::to_string(n) + " float attributes, got " +
                                                   std::to_string(attrs.floats.size())));
    if (n == 2 && !(attrs.floats[0] <= attrs.floats[1]))  // clamp bounds
        throw std::invalid_argument(op_err(op, "lo must be <= hi, got lo=" + std::to_string(attrs.floats[0]) +
                                                   ", hi=" + std::to_string(attrs.floats[1])));
}

template <ElementwiseKind kind>
OutSpec elementwise_spec(const char* op, const Inputs& in, const OpAttrs& attrs, size_t n_floats) {
    require_float_attrs(op, attrs, n_floats);
    if constexpr (kind == ElementwiseKind::unary) {
        require_float(op, *in[0], "x");
        return same_as(*in[0]);
    } else if constexpr (kind == ElementwiseKind::binary) {
        return broadcast_spec(op, in);
    } else {  // a backward helper's (g, saved) must have one shape
        const TensorImpl &g = *in[0], &x = *in[1];
        require_same_float(op, g, x);
        if (g.ne != x.ne)
            throw std::invalid_argument(op_err(op, "shapes " + g.shape_str() + " and " + x.shape_str() + " must be equal"));
        return same_as(x);
    }
}

// Runs value(x, y, p0, p1) over every element (y: 0 for unary ops); p0, p1 are the float
// attributes, 0 where the op takes fewer.
template <ElementwiseKind kind, Op op, typename Value>
void run_elementwise(const Inputs& in, const OpAttrs& attrs, TensorImpl& out, Value value) {
    dispatch_float(out.dtype, [&](auto tag) {
        using T = decltype(tag);
        const T p0 = attrs.floats.size() > 0 ? T(attrs.floats[0]) : T(0);
        const T p1 = attrs.floats.size() > 1 ? T(attrs.floats[1]) : T(0);
        if constexpr (kind == ElementwiseKind::unary)
            unary_kernel<T, op>(*in[0], out, [=](T x) -> T { return value(x, T(0), p0, p1); });
        else
            binary_kernel<T>(*in[0], *in[1], out, [=](T x, T y) -> T { return value(x, y, p0, p1); });
    });
}

// The values of native/elementwise.def as functions of (x, y, p0, p1), for T = float or double.
namespace values {
using std::abs;
using std::clamp;
using std::isnan;
using std::max;
template <typename T>
T exp(T x) {
    return exp_of(x);
}
#define RK_ELEMENTWISE(name, kind, code, n_floats, grad, value) \
    template <typename T>                                        \
    T name##_value(T x, T y, T p0, T p1) {                       \
        return value;                                            \
    }
#include "elementwise.def"
#undef RK_ELEMENTWISE
}  // namespace values

}  // namespace

bool set_wide_elementwise(bool on) { return wide_builds.exchange(on && cpu_has_avx2_fma()); }

#define RK_ELEMENTWISE(name, kind, code, n_floats, grad, value)                                       \
    OutSpec shape_##name(const Inputs& in, const OpAttrs& attrs) {                                    \
        return elementwise_spec<ElementwiseKind::kind>(#name, in, attrs, n_floats);                   \
    }                                                                                                 \
    void cpu_##name(const Inputs& in, const OpAttrs& attrs, TensorImpl& out) {                        \
        run_elementwise<ElementwiseKind::kind, Op::name>(                                             \
            in, attrs, out, [](auto x, auto y, auto p0, auto p1) { return values::name##_value(x, y, p0, p1); }); \
    }
#include "elementwise.def"
#undef RK_ELEMENTWISE

OutSpec shape_cast(const Inputs& in, const OpAttrs& attrs) {
    if (attrs.ints.size() != 1 || attrs.ints[0] < 0 || attrs.ints[0] > int64_t(DType::bf16))
        throw std::invalid_argument("cast: expected one dtype attribute");
    if (attrs.floats.size() > 1)
        throw std::invalid_argument("cast: expected at most one float attribute, the scale");
    OutSpec spec = same_as(*in[0]);
    spec.dtype = DType(attrs.ints[0]);
    const DType from = in[0]->dtype;
    if (!attrs.floats.empty() && (is_float(from) || (spec.dtype != DType::f32 && spec.dtype != DType::f64)))
        throw TypeError("cast: a scale applies to casts from u8 or i32 to f32 or f64 (images to floats); got " +
                        std::string(dtype_name(from)) + " to " + dtype_name(spec.dtype));
    return spec;
}

namespace {
double load(const TensorImpl& t, int64_t i) {
    switch (t.dtype) {
        case DType::f32: return t.ptr<float>()[i];
        case DType::f64: return t.ptr<double>()[i];
        case DType::i32: return t.ptr<int32_t>()[i];
        case DType::u8: return t.ptr<uint8_t>()[i];
        case DType::f16: return half_to_float(t.ptr<uint16_t>()[i]);
        case DType::bf16: return bf16_to_float(t.ptr<uint16_t>()[i]);
    }
    return 0;
}
// v as a float rounded to odd (inexact results get an odd last bit): rounding that float to f16
// or bf16 then gives the correctly rounded value of v, which rounding to nearest twice does not.
float to_odd_float(double v) {
    float f = float(v);
    if (!std::isfinite(v) || double(f) == v) return f;
    if (std::fabs(double(f)) > std::fabs(v)) f = std::nextafter(f, 0.0f);
    uint32_t bits;
    std::memcpy(&bits, &f, 4);
    bits |= 1u;
    std::memcpy(&f, &bits, 4);
    return f;
}
void store(TensorImpl& t, int64_t i, double v) {
    switch (t.dtype) {
        case DType::f32: t.ptr<float>()[i] = float(v); return;
        case DType::f64: t.ptr<double>()[i] = v; return;
        case DType::i32:  // toward zero, saturating; NaN becomes 0 (a plain conversion is undefined)
            t.ptr<int32_t>()[i] = std::isnan(v) ? 0 : int32_t(std::clamp(v, -2147483648.0, 2147483647.0));
            return;
        case DType::f16: t.ptr<uint16_t>()[i] = float_to_half(to_odd_float(v)); return;
        case DType::bf16: t.ptr<uint16_t>()[i] = float_to_bf16(to_odd_float(v)); return;
        case DType::u8:  // rounded and saturated to 0..255; NaN becomes 0
            t.ptr<uint8_t>()[i] = std::isnan(v) ? 0 : uint8_t(std::clamp(std::nearbyint(v), 0.0, 255.0));
            return;
    }
}
}  // namespace

// out[i] = convert(x[i]) over every element, in parallel: the hot conversions of 16-bit storage.
template <typename From, typename To, typename Convert>
void convert_all(const TensorImpl& x, TensorImpl& out, Convert convert) {
    const From* px = x.ptr<From>();
    To* po = out.ptr<To>();
    parallel_for(x.numel(), kElementGrain, [&](int64_t lo, int64_t hi) {
        for (int64_t i = lo; i < hi; ++i) po[i] = convert(px[i]);
    });
}

// Integers to floats times the scale attribute, in the result's precision: the bits of cast then
// scale, in one pass (images: bytes to [0, 1]).
void cast_scaled(const TensorImpl& x, double scale, TensorImpl& out) {
    const float s32 = float(scale);
    if (x.dtype == DType::u8 && out.dtype == DType::f32)
        return convert_all<uint8_t, float>(x, out, [s32](uint8_t v) { return float(v) * s32; });
    if (x.dtype == DType::u8)  // to f64
        return convert_all<uint8_t, double>(x, out, [scale](uint8_t v) { return double(v) * scale; });
    if (out.dtype == DType::f32)
        return convert_all<int32_t, float>(x, out, [s32](int32_t v) { return float(v) * s32; });
    convert_all<int32_t, double>(x, out, [scale](int32_t v) { return double(v) * scale; });
}

void cpu_cast(const Inputs& in, const OpAttrs& attrs, TensorImpl& out) {
    const TensorImpl& x = *in[0];
    const DType from = x.dtype, to = out.dtype;
    if (!attrs.floats.empty()) return cast_scaled(x, attrs.floats[0], out);  // the shape rule checked the dtypes
    if (from == DType::f32 && to == DType::f16) return convert_all<float, uint16_t>(x, out, float_to_half);
    if (from == DType::f16 && to == DType::f32) return convert_all<uint16_t, float>(x, out, half_to_float);
    if (from == DType::f32 && to == DType::bf16) return convert_all<float, uint16_t>(x, out, float_to_bf16);
    if (from == DType::bf16 && to == DType::f32) return convert_all<uint16_t, float>(x, out, bf16_to_float);
    // images: bytes to floats, exact (a DQN batch of Atari stacks is 900k of them)
    if (from == DType::u8 && to == DType::f32) return convert_all<uint8_t, float>(x, out, [](uint8_t v) { return float(v); });
    if (from == DType::u8 && to == DType::f64) return convert_all<uint8_t, double>(x, out, [](uint8_t v) { return double(v); });
    parallel_for(x.numel(), kElementGrain, [&](int64_t lo, int64_t hi) {
        for (int64_t i = lo; i < hi; ++i) store(out, i, load(x, i));
    });
}

}  // namespace rk
