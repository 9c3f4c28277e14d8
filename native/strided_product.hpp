// The CPU convolution's products (native/cpu_conv.cpp) with AVX-512 where the CPU has it: small
// matrices whose operands lie at arbitrary strides, so that a band of patches, a kernel and a band
// of an output-shaped gradient are read where they are, in the orientation each pass needs, and
// the result goes straight where it belongs (transposed where it must). The BLAS packs both
// operands of every call instead, and the one this project loads may be held to 256-bit kernels
// (OPENBLAS_CORETYPE).
#pragma once

#include <cstdint>

namespace rk {

// C[i c_m + j c_n] = (accumulate ? C[...] : 0) + sum_{r < depth} A[i + r lda] B[r b_r + j b_n]
// for i < m, j < n: each element summed in order of r by fused multiply-adds (the same rounding
// with any number of threads; NaN and infinities propagate). Where b_rows and b_cols are given,
// B's element (r, j) is B[b_rows[r] + b_cols[j]] instead: a convolution's patches read straight
// from the image (b_rows: each tap's offset in a window, b_cols: each pixel's window).
struct StridedProduct {
    int64_t m, n, depth;
    const float* a;
    int64_t lda;
    const float* b;
    int64_t b_r, b_n;
    float* c;
    int64_t c_m, c_n;
    bool accumulate;
    const int64_t* b_rows = nullptr;  // depth offsets
    const int64_t* b_cols = nullptr;  // n offsets
    int64_t prefetch = 0;             // A's rows this many steps of the depth ahead are prefetched (0: none)
};

// Whether strided_product runs here: the CPU has AVX-512F and tests have not turned it off.
bool strided_products_available();
// Tests: turn the AVX-512 products off (the BLAS then runs the convolution) or back on where the
// CPU has them; returns the previous setting.
bool set_strided_products(bool on);
// Computes p; only where strided_products_available().
void strided_product(const StridedProduct& p);
// The same for a deep product whose A comes from memory (a large layer's weight, evicted between
// uses): the depth cut into chunks whose A panels stay in the core's cache while every column
// tile reads them, A prefetched ahead of its use. Chunks after the first add to C, so each element
// is a sum of its chunks' sums.
void strided_product_from_memory(const StridedProduct& p);

}  // namespace rk
