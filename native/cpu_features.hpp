// What the processor offers beyond the build's baseline (x86-64: SSE2), for the kernels compiled a
// second time with a target attribute and chosen at run time (AVX2 loops, AVX2 + FMA products,
// AVX-512 products). False on other processors and compilers, where those builds do not exist.
#pragma once

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define RK_X86_TARGETS 1  // target("avx2", ...) attributes and the intrinsics' headers are available
#endif

namespace rk {

inline bool cpu_has_avx2() {
#ifdef RK_X86_TARGETS
    static const bool has = __builtin_cpu_supports("avx2");
    return has;
#else
    return false;
#endif
}

inline bool cpu_has_avx2_fma() {
#ifdef RK_X86_TARGETS
    static const bool has = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    return has;
#else
    return false;
#endif
}

inline bool cpu_has_avx512f() {
#ifdef RK_X86_TARGETS
    static const bool has = __builtin_cpu_supports("avx512f");
    return has;
#else
    return false;
#endif
}

}  // namespace rk
