// Free-range bookkeeping shared by the graph and program planners (offsets in one arena) and the
// Vulkan memory pools (offsets in device memory blocks).
#pragma once

#include <algorithm>
#include <cstddef>
#include <map>
#include <optional>

#include "tensor.hpp"

namespace rk {

constexpr size_t kArenaAlign = 64;
inline size_t arena_aligned(size_t n) { return (n + kArenaAlign - 1) / kArenaAlign * kArenaAlign; }

// Free ranges of a region, first fit; a returned range merges with its free neighbours.
class FreeList {
  public:
    // The offset of a range of `size` bytes taken from the lowest free range that fits, if any.
    std::optional<size_t> take(size_t size) {
        for (auto it = free_.begin(); it != free_.end(); ++it) {
            if (it->second < size) continue;
            const size_t offset = it->first, rest = it->second - size;
            free_.erase(it);
            if (rest) free_[offset + size] = rest;
            return offset;
        }
        return std::nullopt;
    }

    void give(size_t offset, size_t size) {
        auto it = free_.emplace(offset, size).first;
        auto next = std::next(it);
        if (next != free_.end() && it->first + it->second == next->first) {
            it->second += next->second;
            free_.erase(next);
        }
        if (it != free_.begin()) {
            auto prev = std::prev(it);
            if (prev->first + prev->second == it->first) {
                prev->second += it->second;
                free_.erase(it);
            }
        }
    }

  private:
    std::map<size_t, size_t> free_;  // offset -> size
};

// Offsets in one arena that grows as needed: the high-water mark is the arena's size.
class ArenaPlanner {
  public:
    size_t allocate(size_t size) {
        size = arena_aligned(std::max<size_t>(size, 1));
        if (auto offset = free_.take(size)) return *offset;
        const size_t offset = top_;
        top_ = size_t(size_add(int64_t(top_), int64_t(size)));  // the arena is one tensor's storage
        return offset;
    }

    void release(size_t offset, size_t size) { free_.give(offset, arena_aligned(std::max<size_t>(size, 1))); }

    size_t high_water() const { return top_; }

  private:
    FreeList free_;
    size_t top_ = 0;
};

}  // namespace rk
