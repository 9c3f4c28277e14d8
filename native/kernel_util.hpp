// Helpers shared by the shape rules and the CPU kernels.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <limits>
#include <string>

#include "ops.hpp"
#include "thread_pool.hpp"

namespace rk {

// Elements per parallel chunk of elementwise work: small ops run inline.
constexpr int64_t kElementGrain = 1 << 15;

inline std::string op_err(const char* op, const std::string& msg) { return std::string(op) + ": " + msg; }

// The sum of term(double(v[i])) over i < n in double, over 8 interleaved partial sums added up in
// a fixed order (the tail, then the lanes): the loop vectorises, where a single running sum is a
// chain of dependent adds (1 ms over NatureCNN's 1.7M gradients in sum_squares, 0.2 ms for the
// bias gradient of its first layer in sum_to).
template <typename T, typename Term>
double lane_sum(const T* v, int64_t n, Term term) {
    constexpr int64_t kLanes = 8;
    double part[kLanes] = {};
    int64_t i = 0;
    for (; i + kLanes <= n; i += kLanes)
        for (int64_t l = 0; l < kLanes; ++l) part[l] += term(double(v[i + l]));
    double total = 0.0;
    for (; i < n; ++i) total += term(double(v[i]));
    for (double p : part) total += p;
    return total;
}

// The functions the values of the elementwise ops call (native/elementwise.def), each defined alike
// in shaders/common.glsl. The activations among them are the fused linear op's too (cpu_linalg.cpp),
// so a fused layer gives what its unfused ops give, NaN included.
template <typename T>
T relu_of(T x) {
    return (x > T(0) || std::isnan(x)) ? x : T(0);  // NaN propagates, as in numpy
}

// exp's reduction, which exp_of and tanh_of share: x = n ln2 + r with |r| <= ln2 / 2 (ln2 in two
// parts, the first exact in n ln2); returns e^r - 1 by its Taylor series to r^7 (the next term is
// below 5e-9 of e^r), and n, an integer, through `n` (NaN for NaN).
inline float expm1_reduced(float x, float& n) {
    const float round = 12582912.0f;               // 1.5 * 2^23: adding it rounds to an integer
    n = (x * 1.44269504f + round) - round;         // nearest integer to x / ln2
    const float r = (x - n * 0.693145751953125f) - n * 1.42860677e-6f;
    float q = 1.0f / 5040.0f;
    q = q * r + 1.0f / 720.0f;
    q = q * r + 1.0f / 120.0f;
    q = q * r + 1.0f / 24.0f;
    q = q * r + 1.0f / 6.0f;
    q = q * r + 0.5f;
    q = q * r + 1.0f;
    return q * r;
}

// 2^k for an integer k in [-126, 127], by its bits.
inline float pow2_of(int32_t k) {
    const int32_t bits = (k + 127) << 23;
    float value;
    std::memcpy(&value, &bits, 4);
    return value;
}

// exp. In float, a form without calls or branches, so the loops over a tensor vectorise (glibc's
// expf is a call per element, 3 ns here): e^r (expm1_reduced plus 1), then 2^n in two factors so
// that results below 2^-126 round once into the subnormals. (The build's -fno-trapping-math lets
// its selects vectorise.) Within 2 ulp of the correctly rounded value; inf above 88.73, 0 below
// -103.98, NaN for NaN.
inline float exp_of(float x) {
    const float clamped = std::min(std::max(x, -104.0f), 89.0f);  // NaN stays NaN (std::max/min return x)
    float n;
    const float p = expm1_reduced(clamped, n) + 1.0f;
    const int32_t k = int32_t(n == n ? n : 0.0f);  // n in [-150, 128]; 0 for NaN (p is NaN then)
    const int32_t half = k / 2;
    return p * pow2_of(half) * pow2_of(k - half);
}

inline double exp_of(double x) { return std::exp(x); }

template <typename T>
T sigmoid_of(T x) {
    const T e = exp_of(-std::abs(x));  // never above 1: no overflow on either side
    return x >= 0 ? T(1) / (T(1) + e) : e / (T(1) + e);
}

// tanh. In float, a form without calls, as exp_of, so that its loops vectorise (glibc's tanhf is a
// call per element: a policy's [6, 256] actions took 25 us on one core): with u = expm1(-2|x|) in
// (-1, 0], tanh|x| = -u / (2 + u). expm1 from exp's reduction, y = n ln2 + r: 2^n (1 + q) - 1 with
// q = e^r - 1, as 2^n q + (2^n - 1), so that a small |x| keeps its digits (both parts exact where
// n = 0). Within 3 ulp of the correctly rounded value; +-1 beyond |x| = 9.5 (tanh rounds to 1
// there), the sign of x kept (-0 gives -0), NaN for NaN.
inline float tanh_of(float x) {
    float n;  // in [-27, 0]
    const float q = expm1_reduced(-2.0f * std::min(std::abs(x), 9.5f), n);  // NaN stays NaN
    const float scale = pow2_of(int32_t(n == n ? n : 0.0f));
    const float u = scale * q + (scale - 1.0f);  // expm1(-2|x|)
    return std::copysign(-u / (2.0f + u), x);
}

inline double tanh_of(double x) { return std::tanh(x); }

// The activations the fused linear and conv2d ops apply after their bias, in the order of their
// activation attribute (rlkit.core.ops.LINEAR_ACTIVATIONS).
enum class Activation : int64_t { none = 0, relu = 1, tanh = 2, sigmoid = 3 };

// NaN below 0 and -inf at 0 (common.glsl spells these out)
template <typename T>
T log_of(T x) {
    return std::log(x);
}

// log1p. In float, a form without calls, as exp_of, so that its loops vectorise (softplus's
// log1p(e^-|x|): glibc's log1pf is a call per element, softplus [6, 256] took 34 us): w = 1 + x =
// 2^k m with m in [0.75, 1.5) by its bits, log m = log(1 + f) with f = m - 1 (exact) as fdlibm
// writes it, f - (f^2 / 2 - s (f^2 / 2 + R)) with s = f / (2 + f) and R the series of 2 atanh(s)
// past its first term (to s^12: below 4e-10 of log m), plus k ln2 in two parts and e / w, where e
// is what rounding 1 + x to w lost (exact). -inf at -1, NaN below -1 and for NaN, inf at inf,
// x itself for zeros and tiny x (log1p x = x there).
inline float log1p_of(float x) {
    const float w = 1.0f + x;
    int32_t bits;
    std::memcpy(&bits, &w, 4);
    const int32_t k = (bits - 0x3f400000) >> 23;  // 0x3f400000: 0.75
    const int32_t m_bits = bits - k * (1 << 23);
    float m;
    std::memcpy(&m, &m_bits, 4);
    const float f = m - 1.0f, s = f / (2.0f + f), z = s * s, half_f2 = 0.5f * f * f;
    const float r = z * (2.0f / 3.0f + z * (2.0f / 5.0f + z * (2.0f / 7.0f + z * (2.0f / 9.0f + z * (2.0f / 11.0f)))));
    const float lost = std::abs(x) > 1.0f ? 1.0f - (w - x) : x - (w - 1.0f);  // 1 + x - w, exactly
    const float kf = float(k);
    const float y = kf * 0.693145751953125f + ((kf * 1.42860677e-6f + lost / w) + (f - (half_f2 - s * (half_f2 + r))));
    const float inf = std::numeric_limits<float>::infinity();
    const float outside = x == -1.0f ? -inf : (x == x ? std::numeric_limits<float>::quiet_NaN() : x);
    return x > -1.0f ? ((x == inf || x == 0.0f) ? x : y) : outside;
}

inline double log1p_of(double x) { return std::log1p(x); }

template <typename T>
T sqrt_of(T x) {
    return std::sqrt(x);
}

template <typename T>
T pow_of(T x, T p) {
    return std::pow(x, p);
}

// min and max that propagate NaN, as numpy's
template <typename T>
T nan_min(T a, T b) {
    return (std::isnan(a) || std::isnan(b)) ? a + b : std::min(a, b);
}

template <typename T>
T nan_max(T a, T b) {
    return (std::isnan(a) || std::isnan(b)) ? a + b : std::max(a, b);
}

// sum_i a[i] b[i] as kLanes interleaved partial sums, added up in a fixed order at the end: the
// compiler keeps them in one vector register, where a single running sum is a chain of adds it
// may not reorder (no -ffast-math), so the loop would not vectorise.
template <typename T>
T dot(const T* a, const T* b, int64_t n) {
    constexpr int64_t kLanes = 8;
    T part[kLanes] = {};
    int64_t i = 0;
    for (; i + kLanes <= n; i += kLanes)
        for (int64_t l = 0; l < kLanes; ++l) part[l] += a[i + l] * b[i + l];
    T total = 0;
    for (; i < n; ++i) total += a[i] * b[i];
    for (int64_t l = 0; l < kLanes; ++l) total += part[l];
    return total;
}

// out[i] += a x[i] over i < n (x and out do not overlap): a product's loop with its output
// innermost, which vectorises.
template <typename T>
void add_scaled(int64_t n, T a, const T* __restrict x, T* __restrict out) {
    for (int64_t i = 0; i < n; ++i) out[i] += a * x[i];
}

inline void require_float(const char* op, const TensorImpl& t, const char* arg) {
    if (!is_float(t.dtype))
        throw TypeError(op_err(op, std::string(arg) + " must be a float tensor (f32, f16, bf16 or f64), got " + dtype_name(t.dtype)));
}

inline void require_index(const char* op, const TensorImpl& t, const char* arg) {
    if (t.dtype != DType::i32)
        throw TypeError(op_err(op, std::string(arg) + " must be an i32 index tensor, got " + dtype_name(t.dtype)));
}

inline void require_same_float(const char* op, const TensorImpl& a, const TensorImpl& b) {
    require_float(op, a, "a");
    require_float(op, b, "b");
    if (a.dtype != b.dtype)
        throw TypeError(op_err(op, std::string("dtypes differ: ") + dtype_name(a.dtype) + " and " + dtype_name(b.dtype) +
                                       " (expected the same float dtype)"));
}

// t (named arg) has the dtype of `first` (named first_arg); TypeError naming both otherwise.
inline void require_like(const char* op, const TensorImpl& t, const TensorImpl& first, const char* arg, const char* first_arg) {
    if (t.dtype != first.dtype)
        throw TypeError(op_err(op, std::string("dtypes differ: ") + first_arg + " is " + dtype_name(first.dtype) + " but " +
                                       arg + " is " + dtype_name(t.dtype) + " (expected the same float dtype)"));
}

// A backward helper's upstream gradient or saved forward output (named arg): one column of the
// forward's `total` elements, of the dtype of `first` (named first_arg).
inline void require_packed_output(const char* op, const TensorImpl& t, const char* arg, const TensorImpl& first,
                                  const char* first_arg, int64_t total) {
    require_like(op, t, first, arg, first_arg);
    if (t.numel() != total || t.ne[1] != 1)
        throw std::invalid_argument(op_err(op, std::string(arg) + " " + t.shape_str() + " is not the forward's output shape [" +
                                                   std::to_string(total) + ", 1]"));
}

// The inputs in[first], in[first + 1], ... named `names`: each a float tensor of the first one's dtype.
inline void require_same_float_inputs(const char* op, const Inputs& in, size_t first, std::initializer_list<const char*> names) {
    size_t x = first;
    for (const char* name : names) {
        require_float(op, *in[x], name);
        require_like(op, *in[x++], *in[first], name, *names.begin());
    }
}

// Sizes as error messages write shapes: "[a, b, ...]".
inline std::string sizes(std::initializer_list<int64_t> dims) {
    std::string s = "[";
    for (int64_t d : dims) s += (s.size() > 1 ? ", " : "") + std::to_string(d);
    return s + "]";
}

inline void require_2d(const char* op, const TensorImpl& t, const char* arg) {
    if (t.ndim > 2 && (t.ne[2] != 1 || t.ne[3] != 1))
        throw std::invalid_argument(op_err(op, std::string(arg) + " must be 2-D [rows, columns], got " + t.shape_str()));
}

inline OutSpec same_as(const TensorImpl& t) { return OutSpec{t.ne, t.ndim, t.dtype}; }

// Reads the shape attributes ne[0..3], ndim stored from position `at` of attrs.ints.
OutSpec shape_from_attrs(const char* op, const OpAttrs& attrs, size_t at, DType dtype);

// Calls f with a value of the computing type of a float tensor (kernels never see f16 or bf16).
template <typename F>
void dispatch_float(DType dtype, F&& f) {
    switch (dtype) {
        case DType::f32: f(float{}); return;
        case DType::f64: f(double{}); return;
        default: throw std::logic_error("kernel called with a non-float dtype");
    }
}

// Element strides of a tensor broadcast to `out` (0 along broadcast dims).
inline Shape broadcast_strides(const TensorImpl& t, const Shape& out) {
    Shape s{};
    int64_t stride = 1;
    for (int d = 0; d < kMaxDims; ++d) {
        s[d] = (t.ne[d] == 1 && out[d] != 1) ? 0 : stride;
        stride *= t.ne[d];
    }
    return s;
}

// Number of columns when a tensor is seen as [ne0, everything else].
inline int64_t n_columns(const TensorImpl& t) { return t.ne[1] * t.ne[2] * t.ne[3]; }

}  // namespace rk
