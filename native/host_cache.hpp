// Freed host blocks of tensors, kept for the next tensor of the same size. glibc hands a block
// of 128 KiB or more back to the system when it is freed (mmap), so every large tensor a step
// makes (the same sizes at every step) took its pages anew, one page fault per 4 KiB: on a
// 2-core VM the tape's backward pass of ssm_scan spent half its time in them. Blocks of at least
// kMinKeptBytes are kept by size up to a budget, the oldest given back first; a block the budget
// cannot hold goes back at once. Under AddressSanitizer nothing is kept, so that a use after free
// is still reported.
#pragma once

#include <cstddef>

namespace rk {

constexpr size_t kMinKeptBytes = size_t(1) << 20;

// A 64-byte aligned block of `bytes` (a multiple of 64): a kept block of that size, else a new
// one. Null when the system has no memory left, even after every kept block was given back.
void* host_block_acquire(size_t bytes);

// Gives back a block from host_block_acquire: kept while the budget allows, else freed.
void host_block_release(void* block, size_t bytes);

struct HostCacheStats {
    size_t budget_bytes;  // 0: nothing is kept (RLKIT_HOST_CACHE_MIB=0, or AddressSanitizer)
    size_t kept_bytes;
    size_t kept_blocks;
    size_t reused_blocks;  // acquisitions served by a kept block, since the process started
};

HostCacheStats host_cache_stats();

// Frees every kept block.
void host_cache_clear();

}  // namespace rk
