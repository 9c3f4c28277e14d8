// Device memory pools (vk_memory.hpp).
#include "vulkan/vk_memory.hpp"

#include <algorithm>
#include <stdexcept>
#include <string>

#include "ops.hpp"

namespace rk::vk {

Allocation::~Allocation() {
    if (pool) pool->release(block, offset, size);
}

MemoryPool::MemoryPool(const Api& api, VkDevice device, uint32_t memory_type, bool mapped, uint64_t block_size,
                       uint64_t alignment)
    : api_(api), device_(device), memory_type_(memory_type), mapped_(mapped), block_size_(block_size),
      alignment_(alignment) {}

MemoryPool::~MemoryPool() {
    for (auto& b : blocks_) {
        if (b.mapped) api_.vkUnmapMemory(device_, b.memory);
        api_.vkDestroyBuffer(device_, b.buffer, nullptr);
        api_.vkFreeMemory(device_, b.memory, nullptr);
    }
}

int MemoryPool::add_block(uint64_t size) {
    Block b;
    b.size = size;
    VkBufferCreateInfo info{VK_STRUCTURE_TYPE_BUFFER_CREATE_INFO};
    info.size = size;
    info.usage = VK_BUFFER_USAGE_STORAGE_BUFFER_BIT | VK_BUFFER_USAGE_TRANSFER_SRC_BIT |
                 VK_BUFFER_USAGE_TRANSFER_DST_BIT | VK_BUFFER_USAGE_SHADER_DEVICE_ADDRESS_BIT;
    check(api_.vkCreateBuffer(device_, &info, nullptr, &b.buffer), "vkCreateBuffer");
    VkMemoryRequirements req;
    api_.vkGetBufferMemoryRequirements(device_, b.buffer, &req);
    VkMemoryAllocateFlagsInfo flags{VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_FLAGS_INFO};
    flags.flags = VK_MEMORY_ALLOCATE_DEVICE_ADDRESS_BIT;
    VkMemoryAllocateInfo alloc{VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_INFO, &flags};
    alloc.allocationSize = req.size;
    alloc.memoryTypeIndex = memory_type_;
    VkResult r = api_.vkAllocateMemory(device_, &alloc, nullptr, &b.memory);
    if (r != VK_SUCCESS) {
        api_.vkDestroyBuffer(device_, b.buffer, nullptr);
        throw OutOfMemory("out of GPU memory: could not allocate a block of " + std::to_string(size >> 20) +
                          " MiB (VkResult " + std::to_string(int(r)) + ")");
    }
    check(api_.vkBindBufferMemory(device_, b.buffer, b.memory, 0), "vkBindBufferMemory");
    if (mapped_) check(api_.vkMapMemory(device_, b.memory, 0, VK_WHOLE_SIZE, 0, &b.mapped), "vkMapMemory");
    VkBufferDeviceAddressInfo addr{VK_STRUCTURE_TYPE_BUFFER_DEVICE_ADDRESS_INFO};
    addr.buffer = b.buffer;
    b.address = api_.vkGetBufferDeviceAddress(device_, &addr);
    b.free.give(0, size);
    blocks_.push_back(std::move(b));
    return int(blocks_.size()) - 1;
}

std::shared_ptr<Allocation> MemoryPool::allocate(uint64_t size) {
    std::lock_guard<std::mutex> lk(mutex_);
    size = align_up(std::max<uint64_t>(size, 1), alignment_);
    for (int pass = 0; pass < 2; ++pass) {
        for (int bi = 0; bi < int(blocks_.size()); ++bi) {
            if (auto offset = blocks_[bi].free.take(size)) {
                auto a = std::make_shared<Allocation>();
                a->pool = this;
                a->block = bi;
                a->offset = *offset;
                a->size = size;
                in_use_ += size;
                return a;
            }
        }
        add_block(std::max(block_size_, size));  // a tensor larger than a block gets its own
    }
    throw std::logic_error("MemoryPool: a fresh block could not hold the allocation");
}

void MemoryPool::release(int block, uint64_t offset, uint64_t size) {
    std::lock_guard<std::mutex> lk(mutex_);
    blocks_[block].free.give(offset, size);
    in_use_ -= size;
}

uint64_t MemoryPool::bytes_reserved() const {
    uint64_t total = 0;
    for (const auto& b : blocks_) total += b.size;
    return total;
}

}  // namespace rk::vk
