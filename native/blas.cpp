#include "blas.hpp"

#include <dlfcn.h>

#include <algorithm>

#include "thread_pool.hpp"

namespace rk {
namespace {

constexpr int kColMajor = 102, kNoTrans = 111, kTrans = 112;  // CBLAS enum values

using SgemmFn = void (*)(int, int, int, int, int, int, float, const float*, int, const float*, int, float, float*, int);
using DgemmFn = void (*)(int, int, int, int, int, int, double, const double*, int, const double*, int, double, double*,
                         int);
using SetThreadsFn = void (*)(int);

struct Blas {
    SgemmFn sgemm = nullptr;
    DgemmFn dgemm = nullptr;
    SetThreadsFn set_threads = nullptr;
    std::string name;
} g_blas;

void* find_symbol(void* lib, std::initializer_list<const char*> names) {
    for (const char* n : names)
        if (void* s = dlsym(lib, n)) return s;
    return nullptr;
}

// The built-in kernel: columns of C in parallel, each a sum of scaled columns of op(A).
template <typename T>
void gemm_builtin(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const T* a, int64_t lda, const T* b, int64_t ldb,
                  T* c) {
    parallel_for(n, std::max<int64_t>(1, (1 << 16) / std::max<int64_t>(1, m * k)), [&](int64_t lo, int64_t hi) {
        for (int64_t j = lo; j < hi; ++j) {
            T* cj = c + j * m;
            std::fill(cj, cj + m, T(0));
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
    });
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
    g_blas.set_threads = reinterpret_cast<SetThreadsFn>(
        find_symbol(lib, {"scipy_openblas_set_num_threads", "openblas_set_num_threads"}));
    g_blas.name = path;
    if (g_blas.set_threads) g_blas.set_threads(num_threads());
    return true;
}

std::string blas_name() { return g_blas.name; }

void blas_set_num_threads(int n) {
    if (g_blas.set_threads) g_blas.set_threads(n);
}

void gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, const float* b, int64_t ldb,
          float* c) {
    if (g_blas.sgemm)
        g_blas.sgemm(kColMajor, ta ? kTrans : kNoTrans, tb ? kTrans : kNoTrans, int(m), int(n), int(k), 1.0f, a,
                     int(lda), b, int(ldb), 0.0f, c, int(m));
    else
        gemm_builtin(ta, tb, m, n, k, a, lda, b, ldb, c);
}

void gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const double* a, int64_t lda, const double* b,
          int64_t ldb, double* c) {
    if (g_blas.dgemm)
        g_blas.dgemm(kColMajor, ta ? kTrans : kNoTrans, tb ? kTrans : kNoTrans, int(m), int(n), int(k), 1.0, a,
                     int(lda), b, int(ldb), 0.0, c, int(m));
    else
        gemm_builtin(ta, tb, m, n, k, a, lda, b, ldb, c);
}

}  // namespace rk
