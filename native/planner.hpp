// Free-range bookkeeping shared by the graph and program planners (offsets in one arena) and the
// Vulkan memory pools (offsets in device memory blocks).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>

#include "tensor.hpp"

namespace rk {

constexpr size_t kArenaAlign = 64;
inline size_t arena_aligned(size_t n) { return (n + kArenaAlign - 1) / kArenaAlign * kArenaAlign; }

// Free ranges of a region, first fit; a returned range merges with its free neighbours. Each
// range has a "ready" level (the GPU program planner's: the latest level at which what last
// held its bytes is read); take(size, before) only takes ranges ready before that level.
class FreeList {
  public:
    static constexpr uint32_t kAnyLevel = UINT32_MAX;

    // The offset of a range of `size` bytes taken from the lowest free range that fits and is
    // ready before level `before`, if any.
    std::optional<size_t> take(size_t size, uint32_t before = kAnyLevel) {
        for (auto it = free_.begin(); it != free_.end(); ++it) {
            if (it->second.size < size || it->second.ready >= before) continue;
            const size_t offset = it->first, rest = it->second.size - size;
            const uint32_t ready = it->second.ready;
            free_.erase(it);
            if (rest) free_[offset + size] = {rest, ready};
            return offset;
        }
        return std::nullopt;
    }

    // Gives a range back, ready from level `ready` (a merged range is ready when both are).
    void give(size_t offset, size_t size, uint32_t ready = 0) {
        auto it = free_.emplace(offset, Range{size, ready}).first;
        auto next = std::next(it);
        if (next != free_.end() && it->first + it->second.size == next->first) {
            it->second = {it->second.size + next->second.size, std::max(it->second.ready, next->second.ready)};
            free_.erase(next);
        }
        if (it != free_.begin()) {
            auto prev = std::prev(it);
            if (prev->first + prev->second.size == it->first) {
                prev->second = {prev->second.size + it->second.size, std::max(prev->second.ready, it->second.ready)};
                free_.erase(it);
            }
        }
    }

  private:
    struct Range {
        size_t size;
        uint32_t ready;
    };
    std::map<size_t, Range> free_;  // offset -> its range
};

// Offsets in one arena that grows as needed: the high-water mark is the arena's size.
class ArenaPlanner {
  public:
    // A range for a tensor first written at level `level` (FreeList::take's `before`).
    size_t allocate(size_t size, uint32_t level = FreeList::kAnyLevel) {
        size = arena_aligned(std::max<size_t>(size, 1));
        if (auto offset = free_.take(size, level)) return *offset;
        const size_t offset = top_;
        top_ = size_t(size_add(int64_t(top_), int64_t(size)));  // the arena is one tensor's storage
        return offset;
    }

    void release(size_t offset, size_t size, uint32_t ready = 0) {
        free_.give(offset, arena_aligned(std::max<size_t>(size, 1)), ready);
    }

    size_t high_water() const { return top_; }

  private:
    FreeList free_;
    size_t top_ = 0;
};

}  // namespace rk
