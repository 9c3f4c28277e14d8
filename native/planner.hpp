// The memory planner shared by graphs and programs: offsets in one arena, first fit, freed blocks
// merged with their neighbours.
#pragma once

#include <algorithm>
#include <cstddef>
#include <map>

namespace rk {

constexpr size_t kArenaAlign = 64;
inline size_t arena_aligned(size_t n) { return (n + kArenaAlign - 1) / kArenaAlign * kArenaAlign; }

// First-fit offsets in one arena; freed blocks are merged with their neighbours.
class ArenaPlanner {
  public:
    size_t allocate(size_t size) {
        size = arena_aligned(std::max<size_t>(size, 1));
        for (auto it = free_.begin(); it != free_.end(); ++it) {
            if (it->second < size) continue;
            size_t offset = it->first, rest = it->second - size;
            free_.erase(it);
            if (rest) free_[offset + size] = rest;
            return offset;
        }
        size_t offset = top_;
        top_ += size;
        return offset;
    }

    void release(size_t offset, size_t size) {
        size = arena_aligned(std::max<size_t>(size, 1));
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

    size_t high_water() const { return top_; }

  private:
    std::map<size_t, size_t> free_;  // offset -> size
    size_t top_ = 0;
};

}  // namespace rk
