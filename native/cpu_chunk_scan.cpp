// chunk_scan: a chunked recurrence's states passed from chunk to chunk (rlkit/core/recurrences.py,
// _pass_between_chunks: ssm_scan's chunked form), one step per chunk,
// where a product with the [c+1, c+1] decays between every pair of chunks had done it in c^2.
// Shapes in ne order, R rows sharing each decay, K decays, c chunks, N sequences:
//   X [R, K, c, N]:  each chunk's own contribution to the state at its end
//   first [R, K, N]: the state before the first chunk
//   decay [K, c, N]: each chunk's decay of the state (linear space), the same for the R rows
// Per (r, k, n): Z_0 = first, Z_{q+1} = decay_q Z_q + X_q. Output one column: the states before each
// chunk, Z_0 .. Z_{c-1} [R, K, c, N], then the final state Z_c [R, K, N].
//
// chunk_scan_back (g like the output, first, decay; first gives the sizes and is not read) -> a column
// [gX [R, K, c, N], gfirst [R, K, N]]: from the end, D_c = g's final block, and per chunk back
// gX_q = D_{q+1}, D_q = g_q + decay_q D_{q+1}; gfirst = D_0. The decay's gradient, the sum over the
// rows of gX_q Z_q, is the vjp rule's (rlkit/core/vjp.py).
#include <algorithm>
#include <string>

#include "kernel_util.hpp"

namespace rk {
namespace {

struct ScanDims {
    int64_t R, K, c, N;
    int64_t plane() const { return R * K; }           // one chunk's state, all K
    int64_t starts() const { return plane() * c * N; }  // the states before each chunk
    int64_t finals() const { return plane() * N; }
    // chunk q of sequence n: its plane's first element, its decays' first
    int64_t at(int64_t q, int64_t n) const { return plane() * (q + c * n); }
    int64_t decay_at(int64_t q, int64_t n) const { return K * (q + c * n); }
};

// The sizes from first [R, K, N] and decay [K, c, N], checked.
ScanDims scan_dims(const char* op, const TensorImpl& first, const TensorImpl& decay) {
    require_float(op, first, "first");
    require_float(op, decay, "decay");
    require_like(op, decay, first, "decay", "first");
    if (first.ne[3] != 1 || decay.ne[3] != 1 || decay.ne[0] != first.ne[1] || decay.ne[2] != first.ne[2])
        throw std::invalid_argument(op_err(op, "first must be [R, K, N] and decay [K, c, N], got first " +
                                                   first.shape_str() + " and decay " + decay.shape_str()));
    const ScanDims d{first.ne[0], first.ne[1], decay.ne[1], first.ne[2]};
    size_add(size_mul(d.R, d.K, d.c, d.N), size_mul(d.R, d.K, d.N));  // the output's size, checked
    return d;
}

// The forward's sizes: X [R, K, c, N] against first and decay.
ScanDims forward_dims(const Inputs& in) {
    const char* op = "chunk_scan";
    const ScanDims d = scan_dims(op, *in[1], *in[2]);
    require_float(op, *in[0], "X");
    require_like(op, *in[0], *in[1], "X", "first");
    if (in[0]->ne != Shape{d.R, d.K, d.c, d.N})
        throw std::invalid_argument(op_err(op, "X must be [R, K, c, N] = " + sizes({d.R, d.K, d.c, d.N}) +
                                                   " (first [R, K, N], decay [K, c, N]), got " + in[0]->shape_str()));
    return d;
}

}  // namespace

OutSpec shape_chunk_scan(const Inputs& in, const OpAttrs&) {
    const ScanDims d = forward_dims(in);
    return OutSpec{{d.starts() + d.finals(), 1, 1, 1}, 2, in[0]->dtype};
}

void cpu_chunk_scan(const Inputs& in, const OpAttrs&, TensorImpl& out) {
    const ScanDims d = forward_dims(in);
    dispatch_float(out.dtype, [&](auto tag) {
        using T = decltype(tag);
        const T *X = in[0]->ptr<T>(), *first = in[1]->ptr<T>(), *decay = in[2]->ptr<T>();
        T *starts = out.ptr<T>(), *finals = starts + d.starts();
        // a task per (k, n): its R rows walk the chunks; consecutive rows, consecutive memory
        parallel_for(d.K * d.N, std::max<int64_t>(1, 4096 / d.R / std::max<int64_t>(d.c, 1)), [&](int64_t lo, int64_t hi) {
            for (int64_t task = lo; task < hi; ++task) {
                const int64_t k = task % d.K, n = task / d.K, row = d.R * k;
                std::copy_n(first + d.plane() * n + row, d.R, starts + d.at(0, n) + row);
                for (int64_t q = 0; q < d.c; ++q) {
                    const T* z = starts + d.at(q, n) + row;
                    const T* x = X + d.at(q, n) + row;
                    T* next = (q + 1 < d.c ? starts + d.at(q + 1, n) : finals + d.plane() * n) + row;
                    const T a = decay[d.decay_at(q, n) + k];
                    for (int64_t r = 0; r < d.R; ++r) next[r] = a * z[r] + x[r];
                }
            }
        });
    });
}

OutSpec shape_chunk_scan_back(const Inputs& in, const OpAttrs&) {
    const char* op = "chunk_scan_back";
    const ScanDims d = scan_dims(op, *in[1], *in[2]);
    const TensorImpl& g = *in[0];
    require_float(op, g, "g");
    require_like(op, g, *in[1], "g", "first");
    if (g.numel() != d.starts() + d.finals() || g.ne[1] != 1)
        throw std::invalid_argument(op_err(op, "g " + g.shape_str() + " is not the forward's output shape [" +
                                                   std::to_string(d.starts() + d.finals()) + "]"));
    return OutSpec{{d.starts() + d.finals(), 1, 1, 1}, 2, in[1]->dtype};
}

void cpu_chunk_scan_back(const Inputs& in, const OpAttrs&, TensorImpl& out) {
    const ScanDims d = scan_dims("chunk_scan_back", *in[1], *in[2]);
    dispatch_float(out.dtype, [&](auto tag) {
        using T = decltype(tag);
        const T *g_starts = in[0]->ptr<T>(), *g_finals = g_starts + d.starts(), *decay = in[2]->ptr<T>();
        T *gX = out.ptr<T>(), *gfirst = gX + d.starts();
        parallel_for(d.K * d.N, std::max<int64_t>(1, 4096 / d.R / std::max<int64_t>(d.c, 1)), [&](int64_t lo, int64_t hi) {
            for (int64_t task = lo; task < hi; ++task) {
                const int64_t k = task % d.K, n = task / d.K, row = d.R * k;
                T* D = gfirst + d.plane() * n + row;  // the walking gradient, D_0 when done
                std::copy_n(g_finals + d.plane() * n + row, d.R, D);
                for (int64_t q = d.c - 1; q >= 0; --q) {
                    std::copy_n(D, d.R, gX + d.at(q, n) + row);  // gX_q = D_{q+1}
                    const T* g = g_starts + d.at(q, n) + row;
                    const T a = decay[d.decay_at(q, n) + k];
                    for (int64_t r = 0; r < d.R; ++r) D[r] = g[r] + a * D[r];
                }
            }
        });
    });
}

}  // namespace rk
