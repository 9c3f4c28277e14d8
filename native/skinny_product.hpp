// Products with a skinny side, on AVX2 + FMA: a C of at most 32 rows (a policy's or a value head
// over a batch: [6, 256] from 256 deep; a first layer's input gradient, [23, 256]) or columns (its
// weight gradient, [400, 23] from a batch of 256), or a depth of at most 8 (a head's input
// gradient: [256, 256] from 6 deep). The BLAS packs the wide operand at every call for a few lines
// of work on it: OpenBLAS took 28-32 us for the [6, 256] head and its weight gradient on a 2-core
// AVX2 machine (numpy's own product the same), and TD3's [400, 23] weight gradient ran at 35
// GFLOP/s, a third of a core's peak.
#pragma once

#include <cstdint>

namespace rk {

// A product is skinny where its depth is at most kSkinnyMaxDepth, or C has at most kSkinnyMaxLines
// rows or columns and the depth is at most kSkinnyMaxPanelDepth (8 of op(A)'s rows, 32 KB, stay in
// the first-level cache while every column of C reads them).
constexpr int64_t kSkinnyMaxDepth = 8, kSkinnyMaxLines = 32, kSkinnyMaxPanelDepth = 1024;

// Whether skinny_product runs here: the CPU has AVX2 and FMA and tests have not turned it off.
bool skinny_products_available();
// Tests: turn the skinny products off (the BLAS then runs them) or back on where the CPU has
// them; returns the previous setting.
bool set_skinny_products(bool on);

// Whether C[m, n] = op(A) op(B) of depth k is skinny (above).
bool is_skinny_product(int64_t m, int64_t n, int64_t k);

// What a skinny product's kernel runs along: the depth's few steps (each column of C a sum of
// scaled columns of op(A)), C's few rows, or its few columns (C^T's rows). Chosen from the whole
// product's shape, so that an element's sum does not depend on the block of C it is computed in.
enum class SkinnySide { depth, rows, columns };
SkinnySide skinny_side(int64_t m, int64_t n, int64_t k);

// C[i + ldc j] = sum_{r < k} op(A)[i, r] op(B)[r, j] for i < m, j < n (a block of a skinny product
// whose side is `side`); op(A)[i, r] = ta ? a[r + lda i] : a[i + lda r], op(B)[r, j] = tb ? b[j +
// ldb r] : b[r + ldb j]. Each element is one sum of fused multiply-adds in an order fixed by the
// side, k and the transpositions (the same bits with any number of threads); NaN and infinities
// propagate.
void skinny_product(SkinnySide side, bool ta, bool tb, int64_t m, int64_t n, int64_t k, const float* a, int64_t lda,
                    const float* b, int64_t ldb, float* c, int64_t ldc);

}  // namespace rk
