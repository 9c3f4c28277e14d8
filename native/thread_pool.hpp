// A small persistent thread pool for the CPU kernels.
//
// Work is cut into chunks whose boundaries depend only on the problem size and the grain, never
// on the number of threads, so results do not change with set_num_threads (reductions combine
// per-chunk partials in chunk order).
#pragma once

#include <cstdint>
#include <functional>

namespace rk {

int num_threads();
void set_num_threads(int n);

// Calls fn(begin, end) over [0, n) in chunks of `grain` items. Runs inline when there is a
// single chunk or a single thread.
void parallel_for(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn);

// The number of chunks parallel_for(n, grain, ...) makes. Not (n + grain - 1) / grain: near
// INT64_MAX that sum wraps to a negative count, and the pool would wait for chunks that never run.
inline int64_t chunk_count(int64_t n, int64_t grain) { return grain <= 0 ? 1 : n / grain + (n % grain != 0); }

}  // namespace rk
