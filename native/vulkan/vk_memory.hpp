// Device memory (vk_memory.cpp): pools of large blocks, sub-allocated, addressed by buffer device
// address.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "planner.hpp"
#include "vulkan/vk_api.hpp"

namespace rk::vk {

inline uint64_t align_up(uint64_t n, uint64_t a) { return (n + a - 1) / a * a; }

class MemoryPool;

// One sub-allocation; returns its range to the pool when destroyed.
struct Allocation {
    MemoryPool* pool = nullptr;
    int block = -1;
    uint64_t offset = 0, size = 0;
    ~Allocation();
};

// Blocks of one memory type, each one VkBuffer over one VkDeviceMemory, sub-allocated first-fit.
class MemoryPool {
  public:
    MemoryPool(const Api& api, VkDevice device, uint32_t memory_type, bool mapped, uint64_t block_size,
               uint64_t alignment);
    ~MemoryPool();
    std::shared_ptr<Allocation> allocate(uint64_t size);
    void release(int block, uint64_t offset, uint64_t size);
    uint64_t address(const Allocation& a) const { return blocks_[a.block].address + a.offset; }
    VkBuffer buffer(const Allocation& a) const { return blocks_[a.block].buffer; }
    void* host(const Allocation& a) const { return static_cast<char*>(blocks_[a.block].mapped) + a.offset; }
    uint64_t bytes_in_use() const { return in_use_; }
    uint64_t bytes_reserved() const;

  private:
    struct Block {
        VkDeviceMemory memory = VK_NULL_HANDLE;
        VkBuffer buffer = VK_NULL_HANDLE;
        uint64_t address = 0, size = 0;
        void* mapped = nullptr;
        FreeList free;
    };
    int add_block(uint64_t size);
    const Api& api_;
    VkDevice device_;
    uint32_t memory_type_;
    bool mapped_;
    uint64_t block_size_, alignment_, in_use_ = 0;
    std::vector<Block> blocks_;
    std::mutex mutex_;
};

}  // namespace rk::vk
