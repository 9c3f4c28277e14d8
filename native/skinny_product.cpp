#include "skinny_product.hpp"

#include <algorithm>
#include <atomic>
#include <stdexcept>
#include <vector>

#include "cpu_features.hpp"

#ifdef RK_X86_TARGETS
#include <immintrin.h>
#endif

namespace rk {

bool is_skinny_product(int64_t m, int64_t n, int64_t k) {
    if (m < 1 || n < 1 || k < 1) return false;
    return k <= kSkinnyMaxDepth || (std::min(m, n) <= kSkinnyMaxLines && k <= kSkinnyMaxPanelDepth);
}

SkinnySide skinny_side(int64_t m, int64_t n, int64_t k) {
    if (k <= kSkinnyMaxDepth) return SkinnySide::depth;
    return m <= n ? SkinnySide::rows : SkinnySide::columns;
}

#ifdef RK_X86_TARGETS
namespace {

#define RK_AVX2 __attribute__((target("avx2,fma")))
#define RK_AVX2_INLINE __attribute__((target("avx2,fma"), always_inline)) inline

constexpr int64_t kGroupRows = 8;  // rows of C a few-rows kernel keeps in registers
constexpr int64_t kShallowRows = 256;  // rows of a shallow product's op(A) packed at a time (8 KB at depth 8)

// Where the kernels' output element (i, j) goes: c[i row + j column] (C itself, or C^T where
// the product's few lines are C's columns).
struct Out {
    float* c;
    int64_t row, column;
    float& at(int64_t i, int64_t j) const { return c[i * row + j * column]; }
};

// Lanes [0, count) of a vector on, the rest off (maskload reads 0 there and maskstore skips them).
RK_AVX2_INLINE __m256i first_lanes(int64_t count) {
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(int(std::clamp<int64_t>(count, 0, 8))),
                              _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

RK_AVX2_INLINE float lane_sum(__m256 v) {
    const __m128 quad = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    const __m128 pair = _mm_add_ps(quad, _mm_movehl_ps(quad, quad));
    return _mm_cvtss_f32(_mm_add_ss(pair, _mm_movehdup_ps(pair)));
}

// ---- few rows, op(B)'s columns contiguous: dot products along the depth ----------------------

// acc[j][i] += op(A)[i, r..r+8) * bv[j]: each load of A serves J columns.
template <int M, int J>
RK_AVX2_INLINE void depth_step(__m256 (&acc)[J][M], const float* rows, int64_t stride, int64_t r, const __m256* bv) {
#pragma GCC unroll 8
    for (int i = 0; i < M; ++i) {
        const __m256 av = _mm256_loadu_ps(rows + stride * i + r);
#pragma GCC unroll 8
        for (int j = 0; j < J; ++j) acc[j][i] = _mm256_fmadd_ps(av, bv[j], acc[j][i]);
    }
}

// Columns j0..j0+J of M rows: each element 8 partial sums along the depth, then its lanes summed.
// `rows`: op(A)'s M rows, `stride` floats apart, zero past k.
template <int M, int J>
RK_AVX2 void depth_columns(int64_t j0, int64_t k, const float* rows, int64_t stride, const float* b, int64_t ldb,
                           const Out& out) {
    const int64_t whole = k & ~int64_t(7);
    __m256 acc[J][M];
#pragma GCC unroll 8
    for (int j = 0; j < J; ++j)
#pragma GCC unroll 8
        for (int i = 0; i < M; ++i) acc[j][i] = _mm256_setzero_ps();
    for (int64_t r = 0; r < whole; r += 8) {
        __m256 bv[J];
#pragma GCC unroll 8
        for (int j = 0; j < J; ++j) bv[j] = _mm256_loadu_ps(b + ldb * (j0 + j) + r);
        depth_step<M, J>(acc, rows, stride, r, bv);
    }
    if (whole < k) {  // the rows are zero past k and maskload reads zeros: 0 * 0 adds nothing
        const __m256i tail = first_lanes(k - whole);
        __m256 bv[J];
#pragma GCC unroll 8
        for (int j = 0; j < J; ++j) bv[j] = _mm256_maskload_ps(b + ldb * (j0 + j) + whole, tail);
        depth_step<M, J>(acc, rows, stride, whole, bv);
    }
#pragma GCC unroll 8
    for (int j = 0; j < J; ++j)
#pragma GCC unroll 8
        for (int i = 0; i < M; ++i) out.at(i, j0 + j) = lane_sum(acc[j][i]);
}

template <int M>
void rows_along_depth(int64_t n, int64_t k, const float* rows, int64_t stride, const float* b, int64_t ldb,
                      const Out& out) {
    constexpr int J = M <= 3 ? 4 : M <= 6 ? 2 : 1;  // at most 12 sums in the 16 registers
    int64_t j = 0;
    for (; j + J <= n; j += J) depth_columns<M, J>(j, k, rows, stride, b, ldb, out);
    for (; j < n; ++j) depth_columns<M, 1>(j, k, rows, stride, b, ldb, out);
}

// ---- few rows, op(B)'s rows contiguous: 8 columns of C per vector ----------------------------

// A tile of 8 J columns of M rows, each element one sum in order of the depth. `packed`: op(A) as
// [k][M]. Tiles of 16 columns read whole cache lines of op(B)'s rows, which lie a row of B apart.
template <int M, int J>
RK_AVX2 void across_tile(int64_t j0, int64_t columns, int64_t k, const float* packed, const float* b, int64_t ldb,
                         const Out& out) {
    __m256i mask[J];
#pragma GCC unroll 8
    for (int v = 0; v < J; ++v) mask[v] = first_lanes(columns - 8 * v);
    const bool full = columns == 8 * J;
    __m256 acc[J][M];
#pragma GCC unroll 8
    for (int v = 0; v < J; ++v)
#pragma GCC unroll 8
        for (int i = 0; i < M; ++i) acc[v][i] = _mm256_setzero_ps();
    for (int64_t r = 0; r < k; ++r) {
        const float* row = b + j0 + ldb * r;
        __m256 bv[J];
#pragma GCC unroll 8
        for (int v = 0; v < J; ++v) bv[v] = full ? _mm256_loadu_ps(row + 8 * v) : _mm256_maskload_ps(row + 8 * v, mask[v]);
#pragma GCC unroll 8
        for (int i = 0; i < M; ++i) {
            const __m256 av = _mm256_broadcast_ss(packed + M * r + i);
#pragma GCC unroll 8
            for (int v = 0; v < J; ++v) acc[v][i] = _mm256_fmadd_ps(av, bv[v], acc[v][i]);
        }
    }
#pragma GCC unroll 8
    for (int v = 0; v < J; ++v)
#pragma GCC unroll 8
        for (int i = 0; i < M; ++i) {
            if (out.column == 1) {  // C^T's rows are C's columns: the tile's lanes lie side by side
                _mm256_maskstore_ps(&out.at(i, j0 + 8 * v), mask[v], acc[v][i]);
                continue;
            }
            alignas(32) float lanes[8];
            _mm256_store_ps(lanes, acc[v][i]);
            for (int64_t jj = 0; jj < std::min<int64_t>(8, columns - 8 * v); ++jj) out.at(i, j0 + 8 * v + jj) = lanes[jj];
        }
}

template <int M>
void rows_across_columns(int64_t n, int64_t k, const float* packed, const float* b, int64_t ldb, const Out& out) {
    constexpr int J = M <= 6 ? 2 : 1;  // at most 12 sums in the 16 registers
    for (int64_t j0 = 0; j0 < n; j0 += 8 * J)
        across_tile<M, J>(j0, std::min<int64_t>(8 * J, n - j0), k, packed, b, ldb, out);
}

// ---- shallow: columns of C as sums of k scaled columns of op(A) --------------------------------

// Columns j0..j0+J, 8 rows per vector, each element one sum in order of the depth. `blocks`:
// op(A) as [ceil(m / 8)][K][8] (each 8 rows' K vectors together, zero past m), read in order;
// op(B)[r, j] at b[r b_r + j b_n]. Each load of A serves J columns.
template <int K, int J>
RK_AVX2 void shallow_columns(int64_t j0, int64_t m, const float* blocks, const float* b, int64_t b_r, int64_t b_n,
                             float* c, int64_t ldc) {
    const int64_t whole = m & ~int64_t(7);
    __m256 scale[J][K];
#pragma GCC unroll 8
    for (int j = 0; j < J; ++j)
#pragma GCC unroll 8
        for (int r = 0; r < K; ++r) scale[j][r] = _mm256_broadcast_ss(b + b_r * r + b_n * (j0 + j));
    for (int64_t i = 0; i < m; i += 8, blocks += 8 * K) {
        __m256 acc[J];
#pragma GCC unroll 8
        for (int j = 0; j < J; ++j) acc[j] = _mm256_setzero_ps();
#pragma GCC unroll 8
        for (int r = 0; r < K; ++r) {
            const __m256 av = _mm256_loadu_ps(blocks + 8 * r);
#pragma GCC unroll 8
            for (int j = 0; j < J; ++j) acc[j] = _mm256_fmadd_ps(av, scale[j][r], acc[j]);
        }
        if (i < whole) {
#pragma GCC unroll 8
            for (int j = 0; j < J; ++j) _mm256_storeu_ps(c + ldc * (j0 + j) + i, acc[j]);
        } else {
            const __m256i tail = first_lanes(m - whole);
#pragma GCC unroll 8
            for (int j = 0; j < J; ++j) _mm256_maskstore_ps(c + ldc * (j0 + j) + i, tail, acc[j]);
        }
    }
}

template <int K>
void shallow(int64_t m, int64_t n, const float* blocks, const float* b, int64_t b_r, int64_t b_n, float* c,
             int64_t ldc) {
    constexpr int J = K <= 6 ? 2 : 1;  // J K broadcasts and J sums in registers
    int64_t j = 0;
    for (; j + J <= n; j += J) shallow_columns<K, J>(j, m, blocks, b, b_r, b_n, c, ldc);
    for (; j < n; ++j) shallow_columns<K, 1>(j, m, blocks, b, b_r, b_n, c, ldc);
}

// ---- dispatch ---------------------------------------------------------------------------------

// Kernel<size>::run(args...) for size 1..8.
template <template <int> class Kernel, typename... Args>
void by_size(int64_t size, const Args&... args) {
    switch (size) {
        case 1: return Kernel<1>::run(args...);
        case 2: return Kernel<2>::run(args...);
        case 3: return Kernel<3>::run(args...);
        case 4: return Kernel<4>::run(args...);
        case 5: return Kernel<5>::run(args...);
        case 6: return Kernel<6>::run(args...);
        case 7: return Kernel<7>::run(args...);
        default: return Kernel<8>::run(args...);
    }
}

template <int M>
struct RowsAlongDepth {
    static void run(int64_t n, int64_t k, const float* rows, int64_t stride, const float* b, int64_t ldb,
                    const Out& out) {
        rows_along_depth<M>(n, k, rows, stride, b, ldb, out);
    }
};

template <int M>
struct RowsAcrossColumns {
    static void run(int64_t n, int64_t k, const float* packed, const float* b, int64_t ldb, const Out& out) {
        rows_across_columns<M>(n, k, packed, b, ldb, out);
    }
};

template <int K>
struct Shallow {
    static void run(int64_t m, int64_t n, const float* blocks, const float* b, int64_t b_r, int64_t b_n, float* c,
                    int64_t ldc) {
        shallow<K>(m, n, blocks, b, b_r, b_n, c, ldc);
    }
};

// op(A)[i, r] for A stored column-major with lda rows.
float element(bool ta, const float* a, int64_t lda, int64_t i, int64_t r) { return ta ? a[r + lda * i] : a[i + lda * r]; }

// The product's output through `out`, its m rows in groups of 8, each group's op(A) packed.
void few_rows(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, const float* b,
              int64_t ldb, const Out& out) {
    thread_local std::vector<float> packed;
    for (int64_t i0 = 0; i0 < m; i0 += kGroupRows) {
        const int64_t rows = std::min(kGroupRows, m - i0);
        const Out group{out.c + i0 * out.row, out.row, out.column};
        if (!tb) {  // the group's rows, each padded with zeros to whole vectors
            const int64_t stride = (k + 7) & ~int64_t(7);
            packed.assign(size_t(rows * stride), 0.0f);
            for (int64_t i = 0; i < rows; ++i)
                for (int64_t r = 0; r < k; ++r) packed[size_t(i * stride + r)] = element(ta, a, lda, i0 + i, r);
            by_size<RowsAlongDepth>(rows, n, k, static_cast<const float*>(packed.data()), stride, b, ldb, group);
            continue;
        }
        packed.resize(size_t(rows * k));
        for (int64_t r = 0; r < k; ++r)
            for (int64_t i = 0; i < rows; ++i) packed[size_t(r * rows + i)] = element(ta, a, lda, i0 + i, r);
        by_size<RowsAcrossColumns>(rows, n, k, static_cast<const float*>(packed.data()), b, ldb, group);
    }
}

std::atomic<bool> enabled{cpu_has_avx2_fma()};

}  // namespace

bool skinny_products_available() { return enabled.load(std::memory_order_relaxed); }
bool set_skinny_products(bool on) { return enabled.exchange(on && cpu_has_avx2_fma()); }

void skinny_product(SkinnySide side, bool ta, bool tb, int64_t m, int64_t n, int64_t k, const float* a, int64_t lda,
                    const float* b, int64_t ldb, float* c, int64_t ldc) {
    if (side == SkinnySide::depth) {
        // op(A) in blocks of 8 rows, each block's k vectors together, read in order (op(A)'s own
        // columns, 1 KB apart as C's, collided with C's stores), kShallowRows rows at a time
        thread_local std::vector<float> blocks;
        for (int64_t i0 = 0; i0 < m; i0 += kShallowRows) {
            const int64_t rows = std::min(kShallowRows, m - i0);
            blocks.assign(size_t((rows + 7) / 8 * k * 8), 0.0f);
            for (int64_t i = 0; i < rows; ++i)
                for (int64_t r = 0; r < k; ++r)
                    blocks[size_t((i / 8) * k * 8 + r * 8 + i % 8)] = element(ta, a, lda, i0 + i, r);
            by_size<Shallow>(k, rows, n, static_cast<const float*>(blocks.data()), b, tb ? ldb : 1, tb ? 1 : ldb,
                             c + i0, ldc);
        }
        return;
    }
    if (side == SkinnySide::rows) return few_rows(ta, tb, m, n, k, a, lda, b, ldb, Out{c, 1, ldc});
    // Few columns: C^T = op(B)^T op(A)^T, whose rows are C's columns (op(B)^T is B read with the
    // other transposition flag), written into C transposed.
    few_rows(!tb, !ta, n, m, k, b, ldb, a, lda, Out{c, ldc, 1});
}

#else  // other processors: the BLAS runs every product

bool skinny_products_available() { return false; }
bool set_skinny_products(bool) { return false; }
void skinny_product(SkinnySide, bool, bool, int64_t, int64_t, int64_t, const float*, int64_t, const float*, int64_t,
                    float*, int64_t) {
    throw std::logic_error("skinny_product: not built for this processor (skinny_products_available() is false)");
}

#endif

}  // namespace rk
