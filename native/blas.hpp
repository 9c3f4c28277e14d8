// Matrix multiply through a BLAS loaded at run time (scipy-openblas32 from PyPI), run single-
// threaded on blocks of C spread over rlkit's pool, with a plain multi-threaded kernel
// where none is loaded. Column-major, like every rlkit tensor.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

namespace rk {

// Loads sgemm/dgemm from a shared library; returns false (and keeps the built-in kernel)
// where the library or its symbols are missing.
bool load_blas(const std::string& path);
std::string blas_name();  // "" when the built-in kernel is in use

// What a product does to its C block by block, on the thread that computed the block, while the
// block is still in that core's cache (a layer's bias and activation, relu_back's mask): called
// as epilogue(first row, rows, first column, columns) once for each block of a set that covers C.
using BlockEpilogue = std::function<void(int64_t, int64_t, int64_t, int64_t)>;

// C[m, n] = op(A) @ op(B), op = transpose when ta / tb; lda, ldb are the stored row counts; then
// the epilogue, if any, on C's blocks.
void gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, const float* b,
          int64_t ldb, float* c, const BlockEpilogue& epilogue = {});
void gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const double* a, int64_t lda, const double* b,
          int64_t ldb, double* c, const BlockEpilogue& epilogue = {});

// C[m, n] (ldc rows stored) = op(A) @ op(B), plus C's own values where `accumulate`: one product on
// the calling thread, for kernels that spread their own tasks over rlkit's pool (a parallel_for
// inside a task of the pool would run inline anyway). Throws where a size exceeds the BLAS's int.
void gemm_serial(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, const float* b,
                 int64_t ldb, float* c, int64_t ldc, bool accumulate);
void gemm_serial(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const double* a, int64_t lda, const double* b,
                 int64_t ldb, double* c, int64_t ldc, bool accumulate);

}  // namespace rk
