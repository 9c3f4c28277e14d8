// Reductions and broadcasting (sum_to, expand) and the per-column ops (softmax family, max,
// argmax, the fused softmax cross-entropy).
#include <algorithm>
#include <cmath>
#include <type_traits>
#include <vector>

#include "cpu_features.hpp"
#include "kernel_util.hpp"

#ifdef RK_X86_TARGETS
#include <immintrin.h>
#endif

namespace rk {

OutSpec shape_from_attrs(const char* op, const OpAttrs& attrs, size_t at, DType dtype) {
    if (attrs.ints.size() < at + kMaxDims + 1)
        throw std::invalid_argument(op_err(op, "expected a shape attribute (4 sizes and ndim)"));
    OutSpec spec;
    spec.dtype = dtype;
    spec.ndim = int(attrs.ints[at + kMaxDims]);
    if (spec.ndim < 2 || spec.ndim > kMaxDims)
        throw std::invalid_argument(op_err(op, "ndim must be 2, 3 or 4, got " + std::to_string(spec.ndim)));
    for (int d = 0; d < kMaxDims; ++d) {
        spec.ne[d] = attrs.ints[at + d];
        if (spec.ne[d] < 1) throw std::invalid_argument(op_err(op, "every size must be at least 1"));
        if (d >= spec.ndim && spec.ne[d] != 1)
            throw std::invalid_argument(op_err(op, "sizes beyond ndim must be 1"));
    }
    return spec;
}

namespace {

std::string spec_str(const OutSpec& s) {
    TensorImpl t;
    t.ne = s.ne;
    t.ndim = s.ndim;
    return t.shape_str();
}

// Output columns (all dims but 0) of `out`, each accumulating the matching columns of x. Where there
// are few output columns their rows are split too, each block of rows its own task (a layer's bias
// gradient, [400, 256] -> [400, 1], was one thread's work): every element is summed in the same
// order however the work is split.
constexpr int64_t kSumToMinBlockRows = 64;

// acc[i] += double(x[i + j stride]) for i < rows, then for each column j < count in order: a bias
// gradient's columns added into its sums, in double. AVX2 keeps 8 rows' sums in registers over
// all the columns (the baseline's loop added a column at a time, loading and storing every sum
// again, and widened 2 floats an instruction): the same additions in the same order, so the
// same bits. A [400, 256] -> [400, 1] sum_to took 26 us, 20 with AVX2 a column at a time.
#ifdef RK_X86_TARGETS
__attribute__((target("avx2"))) void add_columns_avx2(double* acc, const float* x, int64_t stride, int64_t count,
                                                     int64_t rows) {
    int64_t i = 0;
    for (; i + 8 <= rows; i += 8) {
        __m256d low = _mm256_loadu_pd(acc + i), high = _mm256_loadu_pd(acc + i + 4);
        for (int64_t j = 0; j < count; ++j) {
            const __m256 v = _mm256_loadu_ps(x + j * stride + i);
            low = _mm256_add_pd(low, _mm256_cvtps_pd(_mm256_castps256_ps128(v)));
            high = _mm256_add_pd(high, _mm256_cvtps_pd(_mm256_extractf128_ps(v, 1)));
        }
        _mm256_storeu_pd(acc + i, low);
        _mm256_storeu_pd(acc + i + 4, high);
    }
    for (int64_t j = 0; j < count; ++j)
        for (int64_t t = i; t < rows; ++t) acc[t] += double(x[j * stride + t]);
}
#endif

template <typename T>
void add_columns(double* acc, const T* x, int64_t stride, int64_t count, int64_t rows) {
#ifdef RK_X86_TARGETS
    if constexpr (std::is_same_v<T, float>) {
        if (cpu_has_avx2()) return add_columns_avx2(acc, x, stride, count, rows);
    }
#endif
    for (int64_t j = 0; j < count; ++j)
        for (int64_t i = 0; i < rows; ++i) acc[i] += double(x[j * stride + i]);
}

template <typename T>
void sum_to_kernel(const TensorImpl& x, TensorImpl& out) {
    const T* px = x.ptr<T>();
    T* po = out.ptr<T>();
    const bool reduce0 = out.ne[0] == 1 && x.ne[0] != 1;
    const int64_t ne0 = x.ne[0], out_cols = n_columns(out);
    const int64_t r1 = out.ne[1] == 1 ? x.ne[1] : 1, r2 = out.ne[2] == 1 ? x.ne[2] : 1,
                  r3 = out.ne[3] == 1 ? x.ne[3] : 1;
    const int64_t work_per_col = ne0 * r1 * r2 * r3;
    // Reducing dims 0 and 1 both: a plane's columns are one contiguous run, summed as one (a conv's
    // bias gradient sums runs of W' H', not columns of W').
    const bool plane_runs = reduce0 && r1 > 1;
    const int64_t run = plane_runs ? ne0 * r1 : ne0, steps1 = plane_runs ? 1 : r1;
    const bool split_rows = !reduce0 && out_cols < num_threads() && work_per_col >= 2 * kElementGrain;
    const int64_t row_blocks =
        split_rows ? std::max<int64_t>(1, std::min<int64_t>(ne0 / kSumToMinBlockRows, num_threads() / out_cols)) : 1;
    const int64_t block_rows = (out.ne[0] + row_blocks - 1) / row_blocks;  // out.ne[0]: ne0, or 1 where it is reduced
    const int64_t work_per_task = std::max<int64_t>(1, work_per_col / row_blocks);
    parallel_for(out_cols * row_blocks, std::max<int64_t>(1, kElementGrain / work_per_task), [&](int64_t lo, int64_t hi) {
        std::vector<double> acc(static_cast<size_t>(block_rows));
        for (int64_t task = lo; task < hi; ++task) {
            const int64_t c = task / row_blocks, row0 = (task % row_blocks) * block_rows;
            const int64_t rows = std::min(block_rows, out.ne[0] - row0);
            const int64_t o1 = c % out.ne[1], o2 = (c / out.ne[1]) % out.ne[2], o3 = c / (out.ne[1] * out.ne[2]);
            std::fill(acc.begin(), acc.end(), 0.0);
            for (int64_t j3 = 0; j3 < r3; ++j3)
                for (int64_t j2 = 0; j2 < r2; ++j2) {
                    const int64_t i2 = r2 > 1 ? j2 : o2, i3 = r3 > 1 ? j3 : o3;
                    const T* first = px + ((i3 * x.ne[2] + i2) * x.ne[1] + (r1 > 1 ? 0 : o1)) * ne0;  // column j1 = 0
                    if (!reduce0) {
                        add_columns(acc.data(), first + row0, ne0, steps1, rows);
                        continue;
                    }
                    for (int64_t j1 = 0; j1 < steps1; ++j1)
                        acc[0] += lane_sum(first + j1 * ne0, run, [](double v) { return v; });
                }
            T* oc = po + c * out.ne[0] + row0;
            for (int64_t i = 0; i < rows; ++i) oc[i] = T(acc[i]);
        }
    });
}

// Calls f(column pointer of x, column pointer of out) for every column, in parallel.
template <typename T, typename F>
void per_column(const TensorImpl& x, TensorImpl& out, F f) {
    const int64_t rows = x.ne[0], cols = n_columns(x), out_rows = out.ne[0];
    const T* px = x.ptr<T>();
    T* po = out.ptr<T>();
    parallel_for(cols, std::max<int64_t>(1, kElementGrain / rows), [&](int64_t lo, int64_t hi) {
        for (int64_t c = lo; c < hi; ++c) f(px + c * rows, po + c * out_rows, rows);
    });
}

// Same, for a (g, y) pair of equal shapes.
template <typename T, typename F>
void per_column2(const TensorImpl& g, const TensorImpl& y, TensorImpl& out, F f) {
    const int64_t rows = y.ne[0], cols = n_columns(y);
    const T *pg = g.ptr<T>(), *py = y.ptr<T>();
    T* po = out.ptr<T>();
    parallel_for(cols, std::max<int64_t>(1, kElementGrain / rows), [&](int64_t lo, int64_t hi) {
        for (int64_t c = lo; c < hi; ++c) f(pg + c * rows, py + c * rows, po + c * rows, rows);
    });
}

template <typename T>
T column_max(const T* x, int64_t n) {
    T best = x[0];
    for (int64_t i = 1; i < n; ++i) best = std::max(best, x[i]);
    return best;
}

// Index of the first maximum; a NaN counts as the maximum (as numpy.argmax).
template <typename T>
int64_t column_argmax(const T* x, int64_t n) {
    int64_t best = 0;
    for (int64_t i = 1; i < n && !std::isnan(x[best]); ++i)
        if (x[i] > x[best] || std::isnan(x[i])) best = i;
    return best;
}

template <typename T>
double column_logsumexp(const T* x, int64_t n) {
    const double mx = double(column_max(x, n));
    if (std::isinf(mx)) return mx;
    double s = 0;
    for (int64_t i = 0; i < n; ++i) s += std::exp(double(x[i]) - mx);
    return mx + std::log(s);
}

OutSpec per_column_reduced(const char* op, const Inputs& in) {
    require_float(op, *in[0], "x");
    OutSpec spec = same_as(*in[0]);
    spec.ne[0] = 1;
    return spec;
}

}  // namespace

OutSpec shape_sum_to(const Inputs& in, const OpAttrs& attrs) {
    const TensorImpl& x = *in[0];
    require_float("sum_to", x, "x");
    OutSpec spec = shape_from_attrs("sum_to", attrs, 0, x.dtype);
    for (int d = 0; d < kMaxDims; ++d)
        if (spec.ne[d] != x.ne[d] && spec.ne[d] != 1)
            throw std::invalid_argument("sum_to: cannot reduce " + x.shape_str() + " to " + spec_str(spec) +
                                        " (each target size must equal the input's or be 1)");
    return spec;
}

void cpu_sum_to(const Inputs& in, const OpAttrs&, TensorImpl& out) {
    dispatch_float(out.dtype, [&](auto tag) { sum_to_kernel<decltype(tag)>(*in[0], out); });
}

OutSpec shape_expand(const Inputs& in, const OpAttrs& attrs) {
    const TensorImpl& x = *in[0];
    require_float("expand", x, "x");
    OutSpec spec = shape_from_attrs("expand", attrs, 0, x.dtype);
    for (int d = 0; d < kMaxDims; ++d)
        if (spec.ne[d] != x.ne[d] && x.ne[d] != 1)
            throw std::invalid_argument("expand: cannot broadcast " + x.shape_str() + " to " + spec_str(spec) +
                                        " (each input size must equal the target's or be 1)");
    return spec;
}

void cpu_expand(const Inputs& in, const OpAttrs&, TensorImpl& out) {
    const TensorImpl& x = *in[0];
    const Shape s = broadcast_strides(x, out.ne);
    dispatch_float(out.dtype, [&](auto tag) {
        using T = decltype(tag);
        const T* px = x.ptr<T>();
        T* po = out.ptr<T>();
        const int64_t ne0 = out.ne[0];
        parallel_for(n_columns(out), std::max<int64_t>(1, kElementGrain / ne0), [&](int64_t lo, int64_t hi) {
            for (int64_t c = lo; c < hi; ++c) {
                const int64_t o1 = c % out.ne[1], o2 = (c / out.ne[1]) % out.ne[2], o3 = c / (out.ne[1] * out.ne[2]);
                const T* src = px + o1 * s[1] + o2 * s[2] + o3 * s[3];
                T* dst = po + c * ne0;
                if (s[0]) std::copy(src, src + ne0, dst);
                else std::fill(dst, dst + ne0, src[0]);
            }
        });
    });
}

OutSpec shape_softmax(const Inputs& in, const OpAttrs&) {
    require_float("softmax", *in[0], "x");
    return same_as(*in[0]);
}

void cpu_softmax(const Inputs& in, const OpAttrs&, TensorImpl& out) {
    dispatch_float(out.dtype, [&](auto tag) {
        using T = decltype(tag);
        per_column<T>(*in[0], out, [](const T* x, T* y, int64_t n) {
            const T mx = column_max(x, n);
            double s = 0;
            for (int64_t i = 0; i < n; ++i) s += (y[i] = std::exp(x[i] - mx));
            const T inv = T(1.0 / s);
            for (int64_t i = 0; i < n; ++i) y[i] *= inv;
        });
    });
}

OutSpec shape_log_softmax(const Inputs& in, const OpAttrs&) {
    require_float("log_softmax", *in[0], "x");
    return same_as(*in[0]);
}

void cpu_log_softmax(const Inputs& in, const OpAttrs&, TensorImpl& out) {
    dispatch_float(out.dtype, [&](auto tag) {
        using T = decltype(tag);
        per_column<T>(*in[0], out, [](const T* x, T* y, int64_t n) {
            const double lse = column_logsumexp(x, n);  // subtracted in double: x - lse cancels
            for (int64_t i = 0; i < n; ++i) y[i] = T(double(x[i]) - lse);
        });
    });
}

namespace {
OutSpec column_back_spec(const char* op, const Inputs& in) {
    const TensorImpl &g = *in[0], &y = *in[1];
    require_same_float(op, g, y);
    if (g.ne != y.ne)
        throw std::invalid_argument(op_err(op, "shapes " + g.shape_str() + " and " + y.shape_str() + " must be equal"));
    return same_as(y);
}
}  // namespace

OutSpec shape_softmax_back(const Inputs& in, const OpAttrs&) { return column_back_spec("softmax_back", in); }

void cpu_softmax_back(const Inputs& in, const OpAttrs&, TensorImpl& out) {
    dispatch_float(out.dtype, [&](auto tag) {
        using T = decltype(tag);
        per_column2<T>(*in[0], *in[1], out, [](const T* g, const T* y, T* o, int64_t n) {
            double dot = 0;
            for (int64_t i = 0; i < n; ++i) dot += double(g[i]) * y[i];
            for (int64_t i = 0; i < n; ++i) o[i] = y[i] * (g[i] - T(dot));
        });
    });
}

OutSpec shape_log_softmax_back(const Inputs& in, const OpAttrs&) { return column_back_spec("log_softmax_back", in); }

void cpu_log_softmax_back(const Inputs& in, const OpAttrs&, TensorImpl& out) {
    dispatch_float(out.dtype, [&](auto tag) {
        using T = decltype(tag);
        per_column2<T>(*in[0], *in[1], out, [](const T* g, const T* y, T* o, int64_t n) {
            double s = 0;
            for (int64_t i = 0; i < n; ++i) s += g[i];
            for (int64_t i = 0; i < n; ++i) o[i] = g[i] - std::exp(y[i]) * T(s);
        });
    });
}

OutSpec shape_max(const Inputs& in, const OpAttrs&) { return per_column_reduced("max", in); }

void cpu_max(const Inputs& in, const OpAttrs&, TensorImpl& out) {
    dispatch_float(out.dtype, [&](auto tag) {
        using T = decltype(tag);
        per_column<T>(*in[0], out, [](const T* x, T* y, int64_t n) { y[0] = x[column_argmax(x, n)]; });
    });
}

OutSpec shape_argmax(const Inputs& in, const OpAttrs&) {
    OutSpec spec = per_column_reduced("argmax", in);
    spec.dtype = DType::i32;
    return spec;
}

void cpu_argmax(const Inputs& in, const OpAttrs&, TensorImpl& out) {
    const TensorImpl& x = *in[0];
    int32_t* po = out.ptr<int32_t>();
    dispatch_float(x.dtype, [&](auto tag) {
        using T = decltype(tag);
        const T* px = x.ptr<T>();
        const int64_t rows = x.ne[0];
        parallel_for(n_columns(x), std::max<int64_t>(1, kElementGrain / rows), [&](int64_t lo, int64_t hi) {
            for (int64_t c = lo; c < hi; ++c) po[c] = int32_t(column_argmax(px + c * rows, rows));
        });
    });
}

OutSpec shape_softmax_cross_entropy(const Inputs& in, const OpAttrs&) {
    const TensorImpl &logits = *in[0], &target = *in[1];
    require_same_float("softmax_cross_entropy", logits, target);
    if (logits.ne != target.ne)
        throw std::invalid_argument("softmax_cross_entropy: logits " + logits.shape_str() + " and target " +
                                    target.shape_str() + " must have the same shape [classes, batch]");
    return OutSpec{{1, 1, 1, 1}, 2, logits.dtype};
}

void cpu_softmax_cross_entropy(const Inputs& in, const OpAttrs&, TensorImpl& out) {
    const TensorImpl &logits = *in[0], &target = *in[1];
    const int64_t rows = logits.ne[0], cols = n_columns(logits);
    std::vector<double> per_col(cols);
    dispatch_float(out.dtype, [&](auto tag) {
        using T = decltype(tag);
        const T *px = logits.ptr<T>(), *pt = target.ptr<T>();
        parallel_for(cols, std::max<int64_t>(1, kElementGrain / rows), [&](int64_t lo, int64_t hi) {
            for (int64_t c = lo; c < hi; ++c) {
                const T* x = px + c * rows;
                const T* t = pt + c * rows;
                const double lse = column_logsumexp(x, rows);
                double s = 0;
                for (int64_t i = 0; i < rows; ++i)
                    if (t[i] != T(0)) s += double(t[i]) * (lse - double(x[i]));
                per_col[c] = s;
            }
        });
        double total = 0;
        for (double v : per_col) total += v;
        out.ptr<T>()[0] = T(total / double(cols));
    });
}

}  // namespace rk
