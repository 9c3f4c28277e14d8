#include "strided_product.hpp"

#include <algorithm>
#include <atomic>

#include "cpu_features.hpp"

#ifdef RK_X86_TARGETS
#include <immintrin.h>
#endif

namespace rk {

#ifdef RK_X86_TARGETS
namespace {

constexpr int64_t kRows = 32;  // a tile's rows: two 16-float registers

constexpr int kFullCols = 8;  // a full tile's columns

// A row of C, 8 contiguous floats: stored, or added to C's values where `accumulate`.
__attribute__((target("avx512f"), always_inline)) inline void store_row(float* c, __m256 row, bool accumulate) {
    _mm256_storeu_ps(c, accumulate ? _mm256_add_ps(_mm256_loadu_ps(c), row) : row);
}

// A full tile whose rows are contiguous in C (C = the transposed product, c_n = 1): its 16
// accumulators (column j, 16 rows each) transposed in registers into 32 rows of 8 floats, 4 x 4
// blocks by unpack and shuffle, then pairs of blocks joined by a permute. The element-by-element
// copy took ~300 cycles a tile: a fifth of a tile of depth 100 (a weight gradient's bands).
__attribute__((target("avx512f"), always_inline)) inline void store_rows(const StridedProduct& p, int64_t rows, float* c,
                                                        const __m512 (&acc)[kFullCols][2]) {
    // lanes [x.0, y.0, x.1, y.1] and [x.2, y.2, x.3, y.3] of two vectors x, y of 4 128-bit lanes
    const __m512i low = _mm512_setr_epi32(0, 1, 2, 3, 16, 17, 18, 19, 4, 5, 6, 7, 20, 21, 22, 23);
    const __m512i high = _mm512_setr_epi32(8, 9, 10, 11, 24, 25, 26, 27, 12, 13, 14, 15, 28, 29, 30, 31);
#pragma GCC unroll 2
    for (int h = 0; h < 2; ++h) {
        __m512 t[8], u[8];  // per 128-bit lane L (rows 4L..4L+3 of this half):
#pragma GCC unroll 4
        for (int q = 0; q < 4; ++q) {  // t[2q]: [c0 c'0 c1 c'1], t[2q+1]: [c2 c'2 c3 c'3] of columns 2q, 2q+1
            t[2 * q] = _mm512_unpacklo_ps(acc[2 * q][h], acc[2 * q + 1][h]);
            t[2 * q + 1] = _mm512_unpackhi_ps(acc[2 * q][h], acc[2 * q + 1][h]);
        }
#pragma GCC unroll 2
        for (int g = 0; g < 2; ++g) {  // u[4g + q]: row q's columns 4g..4g+3
            u[4 * g + 0] = _mm512_shuffle_ps(t[4 * g], t[4 * g + 2], _MM_SHUFFLE(1, 0, 1, 0));
            u[4 * g + 1] = _mm512_shuffle_ps(t[4 * g], t[4 * g + 2], _MM_SHUFFLE(3, 2, 3, 2));
            u[4 * g + 2] = _mm512_shuffle_ps(t[4 * g + 1], t[4 * g + 3], _MM_SHUFFLE(1, 0, 1, 0));
            u[4 * g + 3] = _mm512_shuffle_ps(t[4 * g + 1], t[4 * g + 3], _MM_SHUFFLE(3, 2, 3, 2));
        }
#pragma GCC unroll 4
        for (int q = 0; q < 4; ++q) {
            const __m512 pairs[2] = {_mm512_permutex2var_ps(u[q], low, u[4 + q]),    // rows q, 4 + q
                                     _mm512_permutex2var_ps(u[q], high, u[4 + q])};  // rows 8 + q, 12 + q
#pragma GCC unroll 4
            for (int s = 0; s < 4; ++s) {
                const int64_t i = 16 * h + 4 * s + q;
                if (i >= rows) continue;
                const __m512 pair = pairs[s / 2];
                const __m256 row = s % 2 ? _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(pair), 1))
                                         : _mm512_castps512_ps256(pair);
                store_row(c + i * p.c_m, row, p.accumulate);
            }
        }
    }
}

// Rows [i0, i0 + 32) and columns [j0, j0 + NR) of C, in 2 NR accumulator registers held over the
// whole depth. Rows past m are loaded as zeros and never stored.
template <int NR, bool kTables>
__attribute__((target("avx512f"))) void tile(const StridedProduct& p, int64_t i0, int64_t j0) {
    const int64_t rows = std::min(kRows, p.m - i0);
    const __mmask16 lo = rows >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << rows) - 1);
    const __mmask16 hi = rows >= 32 ? __mmask16(0xFFFF) : rows <= 16 ? __mmask16(0) : __mmask16((1u << (rows - 16)) - 1);
    __m512 acc[NR][2];
#pragma GCC unroll 8
    for (int j = 0; j < NR; ++j) acc[j][0] = acc[j][1] = _mm512_setzero_ps();
    const float* a = p.a + i0;
    const float* column[NR];  // B's column j0 + j, at row 0 (tables: before the row's offset)
#pragma GCC unroll 8
    for (int j = 0; j < NR; ++j) column[j] = p.b + (kTables ? p.b_cols[j0 + j] : (j0 + j) * p.b_n);
    const int64_t ahead = p.prefetch * p.lda;
    for (int64_t r = 0; r < p.depth; ++r, a += p.lda) {
        if (ahead) {  // the two cache lines of this step's rows, p.prefetch steps ahead
            _mm_prefetch(reinterpret_cast<const char*>(a + ahead), _MM_HINT_T0);
            _mm_prefetch(reinterpret_cast<const char*>(a + ahead + 16), _MM_HINT_T0);
        }
        const __m512 a0 = _mm512_maskz_loadu_ps(lo, a), a1 = _mm512_maskz_loadu_ps(hi, a + 16);
        const int64_t row = kTables ? p.b_rows[r] : r * p.b_r;
#pragma GCC unroll 8
        for (int j = 0; j < NR; ++j) {
            const __m512 bj = _mm512_set1_ps(column[j][row]);
            acc[j][0] = _mm512_fmadd_ps(a0, bj, acc[j][0]);
            acc[j][1] = _mm512_fmadd_ps(a1, bj, acc[j][1]);
        }
    }
    if (p.c_m == 1) {  // a column of the tile is contiguous in C
#pragma GCC unroll 8
        for (int j = 0; j < NR; ++j) {
            float* c = p.c + i0 + (j0 + j) * p.c_n;
            if (p.accumulate) {
                acc[j][0] = _mm512_add_ps(_mm512_maskz_loadu_ps(lo, c), acc[j][0]);
                acc[j][1] = _mm512_add_ps(_mm512_maskz_loadu_ps(hi, c + 16), acc[j][1]);
            }
            _mm512_mask_storeu_ps(c, lo, acc[j][0]);
            _mm512_mask_storeu_ps(c + 16, hi, acc[j][1]);
        }
        return;
    }
    if constexpr (NR == kFullCols)
        if (p.c_n == 1) return store_rows(p, rows, p.c + i0 * p.c_m + j0, acc);
    alignas(64) float tile_values[NR][kRows];  // C transposed (the forward pass): element by element
#pragma GCC unroll 8
    for (int j = 0; j < NR; ++j) {
        _mm512_store_ps(tile_values[j], acc[j][0]);
        _mm512_store_ps(tile_values[j] + 16, acc[j][1]);
    }
    for (int64_t i = 0; i < rows; ++i) {
        float* c = p.c + (i0 + i) * p.c_m + j0 * p.c_n;
        for (int j = 0; j < NR; ++j) c[j * p.c_n] = (p.accumulate ? c[j * p.c_n] : 0.0f) + tile_values[j][i];
    }
}

using TileFn = void (*)(const StridedProduct&, int64_t, int64_t);
constexpr int kCols = kFullCols;  // a tile's columns: 16 accumulators, 2 A loads and 8 broadcasts per step
constexpr TileFn kTiles[2][kCols + 1] = {
    {nullptr, tile<1, false>, tile<2, false>, tile<3, false>, tile<4, false>, tile<5, false>, tile<6, false>,
     tile<7, false>, tile<8, false>},
    {nullptr, tile<1, true>, tile<2, true>, tile<3, true>, tile<4, true>, tile<5, true>, tile<6, true>, tile<7, true>,
     tile<8, true>}};

std::atomic<bool> enabled{cpu_has_avx512f()};

}  // namespace

bool strided_products_available() { return enabled.load(std::memory_order_relaxed); }

bool set_strided_products(bool on) { return enabled.exchange(on && cpu_has_avx512f()); }

// The wider operand's tiles outside: its panel of a tile (32 rows or 8 columns by the depth) stays
// in cache while the other operand's tiles stream past it, and is read from memory once.
void strided_product(const StridedProduct& p) {
    const auto& tiles = kTiles[p.b_rows != nullptr];
    if (p.m > p.n) {
        for (int64_t i0 = 0; i0 < p.m; i0 += kRows)
            for (int64_t j0 = 0; j0 < p.n; j0 += kCols) tiles[std::min<int64_t>(kCols, p.n - j0)](p, i0, j0);
        return;
    }
    for (int64_t j0 = 0; j0 < p.n; j0 += kCols) {
        const TileFn tile_fn = tiles[std::min<int64_t>(kCols, p.n - j0)];
        for (int64_t i0 = 0; i0 < p.m; i0 += kRows) tile_fn(p, i0, j0);
    }
}

// A DQN's 3136 x 512 Linear (batch 32) comes from memory at every forward, since Adam streams
// 47 MB between; the BLAS took 1.0-1.35 ms for it inside the update, these chunks with the
// prefetch 0.8-1.0 ms (chunks of 128 and 256, prefetch 16 to 64 steps ahead: within noise).
constexpr int64_t kMemoryChunk = 128;     // steps of the depth per chunk: a 32-row A panel is 16 KB
constexpr int64_t kMemoryPrefetch = 64;   // steps ahead: into the next chunk's panel at a chunk's end

void strided_product_from_memory(const StridedProduct& p) {
    for (int64_t r0 = 0; r0 < p.depth; r0 += kMemoryChunk) {
        StridedProduct chunk = p;
        chunk.depth = std::min(kMemoryChunk, p.depth - r0);
        chunk.a = p.a + r0 * p.lda;
        if (p.b_rows)
            chunk.b_rows = p.b_rows + r0;
        else
            chunk.b = p.b + r0 * p.b_r;
        chunk.accumulate = p.accumulate || r0 > 0;
        chunk.prefetch = kMemoryPrefetch;  // past A's end in the last chunk: a prefetch never faults
        strided_product(chunk);
    }
}

#else

bool strided_products_available() { return false; }
bool set_strided_products(bool) { return false; }
void strided_product(const StridedProduct&) {}
void strided_product_from_memory(const StridedProduct&) {}

#endif

}  // namespace rk
