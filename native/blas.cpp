#include "blas.hpp"
#include "skinny_product.hpp"
#include "strided_product.hpp"

#include <dlfcn.h>

#include <algorithm>
#include <limits>
#include <stdexcept>
#include <vector>

#include "thread_pool.hpp"

namespace rk {
namespace {

constexpr int kColMajor = 102, kNoTrans = 111, kTrans = 112;  // CBLAS enum values

using SgemmFn = void (*)(int, int, int, int, int, int, float, const float*, int, const float*, int, float, float*, int);
using DgemmFn = void (*)(int, int, int, int, int, int, double, const double*, int, const double*, int, double, double*,
                         int);
using SgemvFn = void (*)(int, int, int, int, float, const float*, int, const float*, int, float, float*, int);
using SetThreadsFn = void (*)(int);

struct Blas {
    SgemmFn sgemm = nullptr;
    DgemmFn dgemm = nullptr;
    SgemvFn sgemv = nullptr;  // optional: products with one row or column of C
    std::string name;
} g_blas;

void* find_symbol(void* lib, std::initializer_list<const char*> names) {
    for (const char* n : names)
        if (void* s = dlsym(lib, n)) return s;
    return nullptr;
}

// The built-in kernel's columns [lo, hi) of C: each a sum of scaled columns of op(A), added to the
// column's old values where `accumulate`.
template <typename T>
void builtin_columns(bool ta, bool tb, int64_t m, int64_t k, const T* a, int64_t lda, const T* b, int64_t ldb, T* c,
                     int64_t ldc, bool accumulate, int64_t lo, int64_t hi) {
    for (int64_t j = lo; j < hi; ++j) {
        T* cj = c + j * ldc;
        if (!accumulate) std::fill(cj, cj + m, T(0));
        for (int64_t p = 0; p < k; ++p) {
            const T bpj = tb ? b[j + p * ldb] : b[p + j * ldb];
            if (!ta) {
                const T* ap = a + p * lda;
                for (int64_t i = 0; i < m; ++i) cj[i] += ap[i] * bpj;
            } else {
                for (int64_t i = 0; i < m; ++i) cj[i] += a[p + i * lda] * bpj;
            }
        }
    }
}

// The built-in kernel: columns of C in parallel.
template <typename T>
void gemm_builtin(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const T* a, int64_t lda, const T* b, int64_t ldb,
                  T* c, const BlockEpilogue& epilogue) {
    parallel_for(n, std::max<int64_t>(1, (1 << 16) / std::max<int64_t>(1, m * k)), [&](int64_t lo, int64_t hi) {
        builtin_columns(ta, tb, m, k, a, lda, b, ldb, c, m, false, lo, hi);
        if (epilogue) epilogue(0, m, lo, hi - lo);
    });
}

// A size passed to the BLAS, whose sizes are ints.
int blas_int(int64_t v) {
    if (v > std::numeric_limits<int>::max())
        throw std::overflow_error("gemm: size " + std::to_string(v) + " exceeds the BLAS's int");
    return int(v);
}

// Runs call(rows, columns, A's part, B's part, C's part) on blocks of C in parallel, each at least
// kGemmGrainFlops of work: blocks of columns, or of rows where C has fewer columns than rows and
// too few for two blocks (a batch of one), of even sizes.
constexpr int64_t kGemmGrainFlops = int64_t(1) << 20;
// Each block also has at least this many rows or columns: every block packs the other operand
// whole (A for a block of columns, B for a block of rows), which thin blocks pay for again and
// again (16 blocks of a 256 x 256 x 256 product took 40% longer than 2).
constexpr int64_t kGemmMinLines = 128;

// f32 products with A untransposed go through the AVX-512 strided products where the CPU has them
// and the product is small: the weight gradient of a DQN's 3136 x 512 layer (depth 32) took 0.73
// ms instead of 1.0. Deeper ones (its forward, depth 3136, whose weight comes from memory inside a
// training step) are cut into chunks of the depth, A prefetched (strided_product_from_memory).
constexpr int64_t kStridedMaxDepth = 512;
// ... and C has at least this many rows: a tile computes 32 rows whatever m is, and below 24 the
// BLAS was faster (m = 1, 6 and 16 at k = n = 256: 5, 11 and 28 us against 44; SAC's heads).
constexpr int64_t kStridedMinRows = 24;
constexpr int64_t kStridedMaxWork = int64_t(1) << 27;  // multiply-adds
constexpr int64_t kStridedTileRows = 32, kStridedTileColumns = 8;  // strided_product's tiles

// C = A^T B with few columns (a layer's input gradient, batch columns): computed as C^T = B^T A,
// B^T packed (n x k, small) so that a batch is a vector, A's columns read whole in order, C written
// transposed. Blocks of C's rows in parallel, each element one sum in order of the depth.
constexpr int64_t kStridedMaxColumns = 64;

void gemm_transposed_a(int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, const float* b, int64_t ldb,
                       float* c, const BlockEpilogue& epilogue) {
    thread_local std::vector<float> packed;
    packed.resize(size_t(n * k));
    float* b_t = packed.data();  // [n, k]: op(B)^T
    for (int64_t j = 0; j < n; ++j)
        for (int64_t r = 0; r < k; ++r) b_t[j + n * r] = b[r + ldb * j];
    const int64_t grain = std::max(kGemmMinLines, kGemmGrainFlops / std::max<int64_t>(1, 2 * n * k));
    parallel_for(m, grain, [&](int64_t lo, int64_t hi) {
        strided_product({n, hi - lo, k, b_t, n, a + lo * lda, 1, lda, c + lo, m, 1, false});
        if (epilogue) epilogue(lo, hi - lo, 0, n);
    });
}

// How a product's C is cut into blocks for the pool: tiles of rows and of columns (0: the BLAS's
// even blocks), and the least work (flops) and lines (rows or columns) a block takes.
struct Blocking {
    int64_t row_tile, column_tile, grain_flops, min_lines;
};
constexpr Blocking kBlasBlocks{0, 0, kGemmGrainFlops, kGemmMinLines};
constexpr Blocking kStridedBlocks{kStridedTileRows, kStridedTileColumns, kGemmGrainFlops, kGemmMinLines};
// The skinny products pack nothing wide, so a thin block costs no more than its share: a [6, 256]
// head from 256 deep (786k flops) runs on two threads, where the BLAS's grain kept it on one.
constexpr Blocking kSkinnyBlocks{8, 8, int64_t(1) << 18, 8};

// The lines (rows or columns of C) per block, for `lines` lines of `line_work` multiply-adds each.
// The BLAS's blocks (tile = 0) depend on the shape alone, never on the number of threads; they are
// of even sizes (400 rows in 4 blocks of 100, not 128, 128, 128 and 16). The strided products'
// elements do not depend on where a block starts (each is one sum in order of the depth), so
// their blocks (tile: the lines of a tile) are one per thread where there is work enough, each a
// whole number of tiles: 300 rows were 128 + 128 + 44 on 2 threads, one of them doing two thirds
// (TD3's 400-300 layers), and are now 160 + 140.
int64_t block_lines(int64_t lines, int64_t line_work, int64_t tile, const Blocking& blocking) {
    if (tile == 0) {
        const int64_t grain = std::max(blocking.min_lines, blocking.grain_flops / std::max<int64_t>(1, line_work));
        const int64_t blocks = chunk_count(lines, grain);
        return (lines + blocks - 1) / blocks;
    }
    const double work_blocks = double(lines) * double(line_work) / double(blocking.grain_flops);
    const int64_t most =
        std::max<int64_t>(1, std::min<int64_t>(lines / blocking.min_lines, int64_t(std::min(work_blocks, 1e6))));
    const int64_t blocks = std::min<int64_t>(num_threads(), most), tiles = (lines + tile - 1) / tile;
    return (tiles + blocks - 1) / blocks * tile;
}

template <typename T, typename Call>
void by_blocks(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const T* a, int64_t lda, const T* b, int64_t ldb,
               T* c, const BlockEpilogue& epilogue, const Call& call, const Blocking& blocking = kBlasBlocks) {
    // A batch of columns is split wherever it makes blocks: a layer's columns (its batch) then stay
    // on the core that computed them in the layer before, and each block reads part of B, not all
    // of it. TD3's 400 x 300 layer at batch 256 took 540-610 us in the update with blocks of rows
    // against 360-380 alone (the strided products); through OpenBLAS, alone, 510-740 us with
    // blocks of rows and 405-450 with blocks of columns.
    if (n >= m || n >= 2 * kGemmMinLines) {
        const int64_t grain = block_lines(n, 2 * m * k, blocking.column_tile, blocking);
        parallel_for(n, grain, [&](int64_t lo, int64_t hi) {
            const T* b_part = tb ? b + lo : b + lo * ldb;  // op(B)'s columns lo..hi: B's rows when transposed
            call(m, hi - lo, a, b_part, c + lo * m);
            if (epilogue) epilogue(0, m, lo, hi - lo);
        });
        return;
    }
    const int64_t grain = block_lines(m, 2 * n * k, blocking.row_tile, blocking);
    parallel_for(m, grain, [&](int64_t lo, int64_t hi) {
        const T* a_part = ta ? a + lo * lda : a + lo;  // op(A)'s rows lo..hi: A's columns when transposed
        call(hi - lo, n, a_part, b, c + lo);
        if (epilogue) epilogue(lo, hi - lo, 0, n);
    });
}

// A product whose C is one column (a policy acting on one observation) or one row (a value head's
// output) through the BLAS's gemv, which reads the matrix operand once where it lies: its gemm packs
// that operand at every call (OpenBLAS: a 256 x 256 Linear on one column replayed in 25 us, 6.4 with
// gemv). Up to this many multiply-adds, on one thread.
constexpr int64_t kGemvMaxWork = int64_t(1) << 22;

bool gemv_product(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, const float* b,
                  int64_t ldb, float* c) {
    if (!g_blas.sgemv || (n != 1 && m != 1) || double(m) * double(n) * double(k) > double(kGemvMaxWork)) return false;
    if (n == 1) {  // c = op(A) b, b = op(B)'s one column
        g_blas.sgemv(kColMajor, ta ? kTrans : kNoTrans, blas_int(ta ? k : m), blas_int(ta ? m : k), 1.0f, a,
                     blas_int(lda), b, blas_int(tb ? ldb : 1), 0.0f, c, 1);
        return true;
    }
    // c^T = op(B)^T a^T, a = op(A)'s one row
    g_blas.sgemv(kColMajor, tb ? kNoTrans : kTrans, blas_int(tb ? n : k), blas_int(tb ? k : n), 1.0f, b,
                 blas_int(ldb), a, blas_int(ta ? 1 : lda), 0.0f, c, 1);
    return true;
}

}  // namespace

bool load_blas(const std::string& path) {
    void* lib = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!lib) return false;
    auto sgemm = reinterpret_cast<SgemmFn>(find_symbol(lib, {"scipy_cblas_sgemm", "cblas_sgemm"}));
    auto dgemm = reinterpret_cast<DgemmFn>(find_symbol(lib, {"scipy_cblas_dgemm", "cblas_dgemm"}));
    if (!sgemm || !dgemm) {
        dlclose(lib);
        return false;
    }
    g_blas.sgemm = sgemm;
    g_blas.dgemm = dgemm;
    g_blas.sgemv = reinterpret_cast<SgemvFn>(find_symbol(lib, {"scipy_cblas_sgemv", "cblas_sgemv"}));
    g_blas.name = path;
    // One thread inside the BLAS: rlkit's pool splits a product by columns instead. OpenBLAS's
    // own threads spin and wait for each other, and on a machine with more runnable threads than
    // cores every product then waited a scheduler slice (a 2-thread DQN update took 64 ms instead
    // of 0.65 ms beside two busy processes).
    if (auto set_threads = reinterpret_cast<SetThreadsFn>(
            find_symbol(lib, {"scipy_openblas_set_num_threads", "openblas_set_num_threads"})))
        set_threads(1);
    return true;
}

std::string blas_name() { return g_blas.name; }


void gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, const float* b, int64_t ldb,
          float* c, const BlockEpilogue& epilogue) {
    const bool small = double(m) * double(n) * double(k) <= double(kStridedMaxWork) && strided_products_available();
    const bool strided = small && k <= kStridedMaxDepth;  // shallow: no cache blocking needed
    if (small && !ta && m >= kStridedMinRows)
        return by_blocks(ta, tb, m, n, k, a, lda, b, ldb, c, epilogue,
                         [&](int64_t rows, int64_t cols, const float* a_part, const float* b_part, float* c_part) {
                             const StridedProduct p{rows, cols, k, a_part, lda, b_part, tb ? ldb : 1, tb ? 1 : ldb,
                                                    c_part, 1, m, false};
                             strided ? strided_product(p) : strided_product_from_memory(p);
                         }, kStridedBlocks);
    if (strided && ta && !tb && n <= kStridedMaxColumns)
        return gemm_transposed_a(m, n, k, a, lda, b, ldb, c, epilogue);
    if (gemv_product(ta, tb, m, n, k, a, lda, b, ldb, c)) {  // one row or column, on this thread
        if (epilogue) epilogue(0, m, 0, n);
        return;
    }
    if (is_skinny_product(m, n, k) && skinny_products_available()) {  // few rows or columns, or shallow
        const SkinnySide side = skinny_side(m, n, k);
        return by_blocks(ta, tb, m, n, k, a, lda, b, ldb, c, epilogue,
                         [&](int64_t rows, int64_t cols, const float* a_part, const float* b_part, float* c_part) {
                             skinny_product(side, ta, tb, rows, cols, k, a_part, lda, b_part, ldb, c_part, m);
                         }, kSkinnyBlocks);
    }
    if (!g_blas.sgemm) return gemm_builtin(ta, tb, m, n, k, a, lda, b, ldb, c, epilogue);
    by_blocks(ta, tb, m, n, k, a, lda, b, ldb, c, epilogue,
              [&](int64_t rows, int64_t cols, const float* a_part, const float* b_part, float* c_part) {
                  g_blas.sgemm(kColMajor, ta ? kTrans : kNoTrans, tb ? kTrans : kNoTrans, int(rows), int(cols), int(k),
                               1.0f, a_part, int(lda), b_part, int(ldb), 0.0f, c_part, int(m));
              });
}

void gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const double* a, int64_t lda, const double* b,
          int64_t ldb, double* c, const BlockEpilogue& epilogue) {
    if (!g_blas.dgemm) return gemm_builtin(ta, tb, m, n, k, a, lda, b, ldb, c, epilogue);
    by_blocks(ta, tb, m, n, k, a, lda, b, ldb, c, epilogue,
              [&](int64_t rows, int64_t cols, const double* a_part, const double* b_part, double* c_part) {
                  g_blas.dgemm(kColMajor, ta ? kTrans : kNoTrans, tb ? kTrans : kNoTrans, int(rows), int(cols), int(k),
                               1.0, a_part, int(lda), b_part, int(ldb), 0.0, c_part, int(m));
              });
}

void gemm_serial(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, const float* b,
                 int64_t ldb, float* c, int64_t ldc, bool accumulate) {
    if (!g_blas.sgemm) return builtin_columns(ta, tb, m, k, a, lda, b, ldb, c, ldc, accumulate, 0, n);
    g_blas.sgemm(kColMajor, ta ? kTrans : kNoTrans, tb ? kTrans : kNoTrans, blas_int(m), blas_int(n), blas_int(k), 1.0f,
                 a, blas_int(lda), b, blas_int(ldb), accumulate ? 1.0f : 0.0f, c, blas_int(ldc));
}

void gemm_serial(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const double* a, int64_t lda, const double* b,
                 int64_t ldb, double* c, int64_t ldc, bool accumulate) {
    if (!g_blas.dgemm) return builtin_columns(ta, tb, m, k, a, lda, b, ldb, c, ldc, accumulate, 0, n);
    g_blas.dgemm(kColMajor, ta ? kTrans : kNoTrans, tb ? kTrans : kNoTrans, blas_int(m), blas_int(n), blas_int(k), 1.0,
                 a, blas_int(lda), b, blas_int(ldb), accumulate ? 1.0 : 0.0, c, blas_int(ldc));
}

}  // namespace rk
