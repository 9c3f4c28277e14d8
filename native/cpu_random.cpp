// Random ops: rand, randn, randint and the Gumbel-max categorical sampler.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <type_traits>

#include "kernel_util.hpp"
#include "random.hpp"

namespace rk {
namespace {

constexpr uint64_t kDefaultSeed = 0x5EEDull;
std::atomic<uint64_t> g_seed{kDefaultSeed};
std::atomic<uint64_t> g_counter{0};

uint64_t splitmix64(uint64_t x) {
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

OutSpec random_spec(const char* op, const OpAttrs& attrs) {
    if (attrs.ints.size() != kMaxDims + 2) throw std::invalid_argument(op_err(op, "expected a shape and a dtype"));
    const int64_t dtype = attrs.ints[kMaxDims + 1];
    if (dtype < 0 || dtype > int64_t(DType::bf16) || !is_float(DType(dtype)))
        throw TypeError(op_err(op, "the dtype must be a float dtype"));
    return shape_from_attrs(op, attrs, 0, DType(dtype));
}

// Elements per task of randn: a normal value costs about 25 ns (a hash, a log and a cosine), so a
// policy's [6, 256] noise took 38 us on one core in tasks of kElementGrain. Each value depends on
// its stream and index alone, however the work is split.
constexpr int64_t kNormalGrain = 512;

template <typename F>
void fill_random(TensorImpl& out, F value_at, int64_t grain = kElementGrain) {
    const uint64_t stream = next_stream();
    dispatch_float(out.dtype, [&](auto tag) {
        using T = decltype(tag);
        T* po = out.ptr<T>();
        parallel_for(out.numel(), grain, [&](int64_t lo, int64_t hi) {
            for (int64_t i = lo; i < hi; ++i) po[i] = T(value_at(stream, uint64_t(i)));
        });
    });
}

}  // namespace

void manual_seed(uint64_t seed) {
    g_seed = seed;
    g_counter = 0;
}

RngState rng_state() { return {g_seed.load(), g_counter.load()}; }

void set_rng_state(const RngState& state) {
    g_seed = state.seed;
    g_counter = state.counter;
}

uint64_t next_stream() { return splitmix64(g_seed.load() ^ splitmix64(g_counter.fetch_add(1))); }

double uniform_at(uint64_t stream, uint64_t i) {
    return double(splitmix64(stream ^ splitmix64(i)) >> 11) * 0x1.0p-53;
}

float uniform24_at(uint64_t stream, uint64_t i) {
    return float(uint32_t(splitmix64(stream ^ splitmix64(i)) >> 40)) * 0x1.0p-24f;
}

double normal_at(uint64_t stream, uint64_t i) {
    const double u1 = 1.0 - uniform_at(stream, 2 * i), u2 = uniform_at(stream, 2 * i + 1);  // u1 in (0, 1]
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2);
}

float normal24_at(uint64_t stream, uint64_t i) {
    const float u1 = 1.0f - uniform24_at(stream, 2 * i), u2 = uniform24_at(stream, 2 * i + 1);
    return std::sqrt(-2.0f * std::log(u1)) * std::cos(6.283185307179586f * u2);
}

OutSpec shape_full(const Inputs&, const OpAttrs& attrs) {
    if (attrs.ints.size() != kMaxDims + 2 || attrs.floats.size() != 1)
        throw std::invalid_argument("full: expected a shape, a dtype and a value");
    const int64_t dtype = attrs.ints[kMaxDims + 1];
    if (dtype < 0 || dtype > int64_t(DType::bf16)) throw TypeError("full: unknown dtype");
    return shape_from_attrs("full", attrs, 0, DType(dtype));
}

void cpu_full(const Inputs&, const OpAttrs& attrs, TensorImpl& out) {
    const double value = attrs.floats[0];
    if (out.dtype == DType::i32) {
        std::fill(out.ptr<int32_t>(), out.ptr<int32_t>() + out.numel(), int32_t(value));
        return;
    }
    if (out.dtype == DType::u8) {
        std::fill(out.ptr<uint8_t>(), out.ptr<uint8_t>() + out.numel(), uint8_t(std::clamp(value, 0.0, 255.0)));
        return;
    }
    dispatch_float(out.dtype, [&](auto tag) {
        using T = decltype(tag);
        std::fill(out.ptr<T>(), out.ptr<T>() + out.numel(), T(value));
    });
}

OutSpec shape_rand(const Inputs&, const OpAttrs& attrs) { return random_spec("rand", attrs); }
void cpu_rand(const Inputs&, const OpAttrs& attrs, TensorImpl& out) {
    // f64 draws 53 bits; f32, f16 and bf16 draw the 24-bit values the GPU shader draws. Rounding
    // to f16 or bf16 must not reach 1: cap at its largest value below 1.
    const DType dtype = DType(attrs.ints[kMaxDims + 1]);
    if (dtype == DType::f64) {
        fill_random(out, uniform_at);
        return;
    }
    const float below_one = largest_below_one(dtype);
    fill_random(out, [below_one](uint64_t stream, uint64_t i) { return std::min(uniform24_at(stream, i), below_one); });
}

OutSpec shape_randn(const Inputs&, const OpAttrs& attrs) { return random_spec("randn", attrs); }
void cpu_randn(const Inputs&, const OpAttrs& attrs, TensorImpl& out) {
    if (DType(attrs.ints[kMaxDims + 1]) == DType::f64) fill_random(out, normal_at, kNormalGrain);
    else fill_random(out, normal24_at, kNormalGrain);
}

OutSpec shape_randint(const Inputs& in, const OpAttrs& attrs) {
    const TensorImpl& high = *in[0];
    require_float("randint", high, "high");
    if (high.numel() != 1)
        throw std::invalid_argument(op_err("randint", "high must have one element, got " + high.shape_str()));
    if (attrs.ints.size() != kMaxDims + 1) throw std::invalid_argument(op_err("randint", "expected a shape"));
    return shape_from_attrs("randint", attrs, 0, DType::i32);
}

// floor(u * high) for the uniform u that rand draws in high's dtype, computed in that dtype (so
// it equals cast(rand * high) to i32), kept below high where the product rounds up to it; 0
// where high < 1.
void cpu_randint(const Inputs& in, const OpAttrs&, TensorImpl& out) {
    const TensorImpl& high_tensor = *in[0];
    const uint64_t stream = next_stream();
    int32_t* po = out.ptr<int32_t>();
    dispatch_float(high_tensor.dtype, [&](auto tag) {
        using T = decltype(tag);
        using Compute = std::conditional_t<std::is_same_v<T, double>, double, float>;
        const Compute high = Compute(*high_tensor.ptr<T>());
        const int64_t last = high >= Compute(1) ? int64_t(std::min<Compute>(high, Compute(2147483647.0))) - 1 : 0;
        parallel_for(out.numel(), kElementGrain, [&](int64_t lo, int64_t hi) {
            for (int64_t i = lo; i < hi; ++i) {
                const Compute u = std::is_same_v<Compute, double> ? Compute(uniform_at(stream, uint64_t(i)))
                                                                  : Compute(uniform24_at(stream, uint64_t(i)));
                const Compute draw = u * high;
                const int64_t whole = draw >= Compute(0) ? int64_t(std::min<Compute>(draw, Compute(4294967296.0))) : 0;
                po[i] = int32_t(std::min(whole, last));
            }
        });
    });
}

OutSpec shape_sample_categorical(const Inputs& in, const OpAttrs&) {
    require_float("sample_categorical", *in[0], "logits");
    OutSpec spec = same_as(*in[0]);
    spec.ne[0] = 1;
    spec.dtype = DType::i32;
    return spec;
}

// argmax over classes of logits + Gumbel noise: a draw from softmax(logits) per column.
void cpu_sample_categorical(const Inputs& in, const OpAttrs&, TensorImpl& out) {
    const TensorImpl& logits = *in[0];
    const uint64_t stream = next_stream();
    const int64_t rows = logits.ne[0];
    int32_t* po = out.ptr<int32_t>();
    dispatch_float(logits.dtype, [&](auto tag) {
        using T = decltype(tag);
        const T* px = logits.ptr<T>();
        parallel_for(n_columns(logits), std::max<int64_t>(1, kElementGrain / rows), [&](int64_t lo, int64_t hi) {
            for (int64_t c = lo; c < hi; ++c) {
                int64_t best = 0;
                double best_value = -INFINITY;
                for (int64_t i = 0; i < rows; ++i) {
                    const double u = uniform24_at(stream, uint64_t(c * rows + i));  // as the GPU draws
                    const double value = double(px[c * rows + i]) - std::log(-std::log(u + 0x1.0p-24));
                    if (value > best_value) best_value = value, best = i;
                }
                po[c] = int32_t(best);
            }
        });
    });
}

}  // namespace rk
