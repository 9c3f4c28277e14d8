// The Vulkan context's recorder: storage, the eager command buffers in rotation, barriers between
// dependent work only, dispatches, fills, copies and command-buffer writes, host transfers through
// staging memory, and submission (a captured program's recording goes through enqueue too).
#include <algorithm>
#include <array>
#include <chrono>
#include <cstring>
#include <stdexcept>
#include <thread>

#include "vulkan/vk_context.hpp"

namespace rk::vk {

namespace {

constexpr uint32_t kMaxRecorded = 4096;      // dispatches recorded before an early submit
constexpr size_t kMaxUnsynced = 256;         // ranges tracked between barriers
constexpr uint64_t kMaxUpdateBytes = 65536;  // vkCmdUpdateBuffer's limit per command
constexpr uint64_t kMaxInFlightStaging = uint64_t(256) << 20;
// Uploads and downloads go through staging memory in pieces of at most this many bytes: one
// staging buffer as large as a tensor of more than 2 GiB was past what lavapipe allocates, and
// reading such a tensor back crashed the process.
constexpr uint64_t kMaxTransferPiece = uint64_t(64) << 20;

}  // namespace

std::shared_ptr<Storage> Context::allocate(uint64_t nbytes, bool poison) {
    if (nbytes > device_memory_)  // the driver may still hand it out (lavapipe did), against the spec
        throw OutOfMemory("out of GPU memory: a tensor of " + std::to_string(nbytes) + " bytes is larger than " +
                          device_name_ + "'s memory (" + std::to_string(device_memory_) + " bytes)");
    auto a = device_pool_->allocate(nbytes);
    if (poison_ && poison) fill_range(device_pool_->buffer(*a), a->offset, device_pool_->address(*a), a->size, 0x7fc00000u);
    auto s = std::make_shared<Storage>();
    s->device = Device::gpu;
    s->address = device_pool_->address(*a);
    s->nbytes = nbytes;
    s->keep_alive = a;
    if (program_) program_->keep.push_back(s);  // a temporary of a recorded kernel: reused at every replay
    return s;
}

std::pair<VkBuffer, uint64_t> Context::locate(const TensorImpl& t) const {
    auto* a = static_cast<Allocation*>(t.storage->keep_alive.get());
    return {a->pool->buffer(*a), a->offset + t.offset};
}

void Context::begin_if_needed() {
    if (recording_) return;
    Slot& slot = slots_[slot_];
    if (slot.held_by) slot.held_by->wait();  // a program submitted with this batch may still run
    if (slot.busy) retire(slot);
    VkCommandBufferBeginInfo bi{VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO};
    bi.flags = VK_COMMAND_BUFFER_USAGE_ONE_TIME_SUBMIT_BIT;
    check(api_.vkBeginCommandBuffer(slot.cmd, &bi), "vkBeginCommandBuffer");
    cmd_ = slot.cmd;
    recording_ = true;
    recording_since_ = std::chrono::steady_clock::now();
    unsynced_reads_.clear();
    unsynced_writes_.clear();
    // Earlier submissions may still run and their memory may be reused here: a barrier at the
    // start orders this command buffer after everything submitted before it.
    if (submitted_) barrier();
}

void Context::wait_for(VkFence fence) {
    // Polls first: a blocking wait adds a sleep and a wake-up (tens of microseconds) to every
    // short submission (an agent's step); past a millisecond the thread sleeps in the driver.
    constexpr auto kSpin = std::chrono::microseconds(1000);
    const auto until = std::chrono::steady_clock::now() + kSpin;
    while (std::chrono::steady_clock::now() < until) {
        const VkResult status = api_.vkGetFenceStatus(device_, fence);
        if (status == VK_SUCCESS) return;
        if (status != VK_NOT_READY) check(status, "vkGetFenceStatus (the GPU did not finish: device lost?)");
        std::this_thread::yield();
    }
    check(api_.vkWaitForFences(device_, 1, &fence, VK_TRUE, UINT64_MAX), "vkWaitForFences (the GPU did not finish: device lost?)");
}

void Context::retire(Slot& slot) {
    wait_for(slot.fence);
    check(api_.vkResetFences(device_, 1, &slot.fence), "vkResetFences");
    check(api_.vkResetCommandBuffer(slot.cmd, 0), "vkResetCommandBuffer");
    slot.keep.clear();
    slot.busy = false;
}

void Context::barrier() {
    VkMemoryBarrier mb{VK_STRUCTURE_TYPE_MEMORY_BARRIER};
    mb.srcAccessMask = VK_ACCESS_SHADER_WRITE_BIT | VK_ACCESS_TRANSFER_WRITE_BIT;
    mb.dstAccessMask = VK_ACCESS_SHADER_READ_BIT | VK_ACCESS_SHADER_WRITE_BIT | VK_ACCESS_TRANSFER_READ_BIT |
                       VK_ACCESS_TRANSFER_WRITE_BIT;
    const VkPipelineStageFlags stages = VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT | VK_PIPELINE_STAGE_TRANSFER_BIT;
    api_.vkCmdPipelineBarrier(cmd_, stages, stages, 0, 1, &mb, 0, nullptr, 0, nullptr);
    unsynced_reads_.clear();
    unsynced_writes_.clear();
    ++stats_.barriers;
}

void Context::access(const std::vector<Range>& reads, const std::vector<Range>& writes) {
    begin_if_needed();
    // A read after an unsynced write, or a write after an unsynced read or write, needs a barrier.
    // Long runs of independent work (many column writes) also get one, to keep the checks short.
    if (any_overlap(reads, unsynced_writes_) || any_overlap(writes, unsynced_writes_) ||
        any_overlap(writes, unsynced_reads_) || unsynced_reads_.size() + unsynced_writes_.size() > kMaxUnsynced)
        barrier();
    unsynced_reads_.insert(unsynced_reads_.end(), reads.begin(), reads.end());
    unsynced_writes_.insert(unsynced_writes_.end(), writes.begin(), writes.end());
}

void Context::enqueue(std::vector<Range> reads, std::vector<Range> writes,
                      std::function<void(VkCommandBuffer)> emit, std::string label) {
    if (program_) {
        program_->commands.push_back({std::move(reads), std::move(writes), std::move(emit), std::move(label)});
        return;
    }
    access(reads, writes);
    emit(cmd_);
}

void Context::dispatch(const std::string& shader, const void* push, uint32_t push_size, uint64_t groups,
                       const std::vector<Range>& reads, const std::vector<Range>& writes, uint32_t groups_z) {
    if (push_size > kPushConstantBytes) throw std::logic_error(shader + ": push constants exceed 128 bytes");
    if (groups == 0) return;
    if (groups_z > limits_.max_group_count_z)
        throw std::invalid_argument(shader + ": " + std::to_string(groups_z) + " batch slices in one dispatch; " +
                                    device_name_ + " runs at most " + std::to_string(limits_.max_group_count_z));
    VkPipeline p = pipeline(shader);
    const uint64_t max_x = limits_.max_group_count_x;
    const uint32_t gx = uint32_t(std::min<uint64_t>(groups, max_x));
    const uint32_t gy = uint32_t((groups + gx - 1) / gx);  // shaders fold (x, y) back into one index
    std::array<uint8_t, kPushConstantBytes> constants{};
    std::memcpy(constants.data(), push, push_size);
    enqueue(reads, writes, [this, p, constants, push_size, gx, gy, groups_z](VkCommandBuffer cmd) {
        api_.vkCmdBindPipeline(cmd, VK_PIPELINE_BIND_POINT_COMPUTE, p);
        api_.vkCmdPushConstants(cmd, layout_, VK_SHADER_STAGE_COMPUTE_BIT, 0, push_size, constants.data());
        api_.vkCmdDispatch(cmd, gx, gy, groups_z);
    }, program_ ? shader + "[" + std::to_string(groups * groups_z) + "]" : std::string());
    ++stats_.dispatches;
    count_recorded();
}

void Context::count_recorded() {
    if (!program_ && (++recorded_ >= kMaxRecorded || recorded_for_long())) submit();
}

bool Context::recorded_for_long() const {
    return submit_after_.count() > 0 && std::chrono::steady_clock::now() - recording_since_ >= submit_after_;
}

void Context::fill(const TensorImpl& dst, uint32_t pattern) {
    const auto [buffer, offset] = locate(dst);
    fill_range(buffer, offset, dst.address(), align_up(dst.nbytes(), 4), pattern);
}

void Context::fill_range(VkBuffer buffer, uint64_t offset, uint64_t address, uint64_t size, uint32_t pattern) {
    enqueue({}, {{address, address + size}},
            [this, buffer, offset, size, pattern](VkCommandBuffer cmd) { api_.vkCmdFillBuffer(cmd, buffer, offset, size, pattern); },
            "fill");
}

void Context::copy(const TensorImpl& src, const TensorImpl& dst) {
    const auto [sb, so] = locate(src);
    const auto [db, doff] = locate(dst);
    const uint64_t size = std::min(src.nbytes(), dst.nbytes());
    const VkBufferCopy region{so, doff, size};
    enqueue({{src.address(), src.address() + size}}, {{dst.address(), dst.address() + size}},
            [this, sb, db, region](VkCommandBuffer cmd) { api_.vkCmdCopyBuffer(cmd, sb, db, 1, &region); }, "copy");
    count_recorded();
}

void Context::write(const TensorImpl& dst, const void* data, uint64_t bytes) {
    if (bytes % 4 != 0 || bytes > dst.nbytes()) throw std::logic_error("write: bad size for the destination");
    const auto [buffer, offset] = locate(dst);
    write_range(buffer, offset, dst.address(), data, bytes);
}

TensorPtr Context::table(const void* data, uint64_t bytes) {
    const uint64_t padded = (bytes + 3) / 4 * 4;  // vkCmdUpdateBuffer writes whole words
    TensorPtr t = make_pending({int64_t(padded), 1, 1, 1}, 2, DType::u8, Device::gpu, "table");
    t->storage = allocate(padded, false);  // not poisoned: written whole before anything reads it
    std::vector<uint8_t> copy(padded, 0);
    std::memcpy(copy.data(), data, bytes);
    if (program_)
        program_->tables.push_back({t->storage, std::move(copy)});
    else
        write(*t, copy.data(), padded);
    return t;
}

void Context::write_tables(std::vector<TableWrite>& tables) {
    for (const TableWrite& w : tables) {
        auto* a = static_cast<Allocation*>(w.storage->keep_alive.get());
        write_range(a->pool->buffer(*a), a->offset, w.storage->address, w.bytes.data(), w.bytes.size());
    }
    tables.clear();
}

void Context::write_range(VkBuffer buffer, uint64_t offset, uint64_t address, const void* data, uint64_t bytes) {
    const auto* first = static_cast<const uint8_t*>(data);
    std::vector<uint8_t> bytes_copy(first, first + bytes);  // the caller's data may be gone when a program emits
    enqueue({}, {{address, address + bytes}},
            [this, buffer, offset, bytes_copy = std::move(bytes_copy)](VkCommandBuffer cmd) {
                for (uint64_t done = 0; done < bytes_copy.size(); done += kMaxUpdateBytes) {
                    const uint64_t n = std::min<uint64_t>(kMaxUpdateBytes, bytes_copy.size() - done);
                    api_.vkCmdUpdateBuffer(cmd, buffer, offset + done, n, bytes_copy.data() + done);
                }
            },
            "write");
    count_recorded();
}

void Context::upload(const TensorImpl& dst, uint64_t offset, const void* host, uint64_t size) {
    if (program_) throw std::logic_error("upload while a program records its command buffer");
    for (uint64_t done = 0; done < size; done += kMaxTransferPiece) {
        const uint64_t n = std::min(kMaxTransferPiece, size - done);
        upload_piece(dst, offset + done, static_cast<const uint8_t*>(host) + done, n);
    }
}

void Context::upload_piece(const TensorImpl& dst, uint64_t offset, const void* host, uint64_t size) {
    auto staging = staging_pool_->allocate(size);
    std::memcpy(staging_pool_->host(*staging), host, size);
    const auto [db, doff] = locate(dst);
    const uint64_t begin = dst.address() + offset;
    access({}, {{begin, begin + size}});
    VkBufferCopy region{staging->offset, doff + offset, size};
    api_.vkCmdCopyBuffer(cmd_, staging_pool_->buffer(*staging), db, 1, &region);
    in_flight_.push_back(std::move(staging));
    in_flight_bytes_ += size;
    ++stats_.uploads;
    stats_.upload_bytes += size;
    if (in_flight_bytes_ > kMaxInFlightStaging || ++recorded_ >= kMaxRecorded || recorded_for_long()) submit();
}

void Context::download(const TensorImpl& src, uint64_t offset, void* host, uint64_t size) {
    if (program_) throw std::logic_error("download while a program records its command buffer");
    for (uint64_t done = 0; done < size; done += kMaxTransferPiece) {
        const uint64_t n = std::min(kMaxTransferPiece, size - done);
        download_piece(src, offset + done, static_cast<uint8_t*>(host) + done, n);
    }
}

void Context::download_piece(const TensorImpl& src, uint64_t offset, void* host, uint64_t size) {
    auto staging = staging_pool_->allocate(size);
    const auto [sb, so] = locate(src);
    const uint64_t begin = src.address() + offset;
    access({{begin, begin + size}}, {});
    VkBufferCopy region{so + offset, staging->offset, size};
    api_.vkCmdCopyBuffer(cmd_, sb, staging_pool_->buffer(*staging), 1, &region);
    VkMemoryBarrier mb{VK_STRUCTURE_TYPE_MEMORY_BARRIER};  // make the copy visible to the host
    mb.srcAccessMask = VK_ACCESS_TRANSFER_WRITE_BIT;
    mb.dstAccessMask = VK_ACCESS_HOST_READ_BIT;
    api_.vkCmdPipelineBarrier(cmd_, VK_PIPELINE_STAGE_TRANSFER_BIT, VK_PIPELINE_STAGE_HOST_BIT, 0, 1, &mb, 0, nullptr,
                              0, nullptr);
    flush();
    std::memcpy(host, staging_pool_->host(*staging), size);
    ++stats_.downloads;
    stats_.download_bytes += size;
}

void Context::submit() {
    if (program_) throw std::logic_error("submit while a program records its command buffer");
    if (!recording_) return;
    Slot& slot = end_recording();
    queue_submit(&slot.cmd, 1, slot.fence);
    slot.busy = true;
}

Context::Slot& Context::end_recording() {
    Slot& slot = slots_[slot_];
    check(api_.vkEndCommandBuffer(slot.cmd), "vkEndCommandBuffer");
    recording_ = false;
    slot.keep = std::move(in_flight_);
    in_flight_.clear();
    in_flight_bytes_ = 0;
    recorded_ = 0;
    slot_ = (slot_ + 1) % slots_.size();
    return slot;
}

void Context::queue_submit(const VkCommandBuffer* cmds, uint32_t n, VkFence fence) {
    VkSubmitInfo si{VK_STRUCTURE_TYPE_SUBMIT_INFO};
    si.commandBufferCount = n;
    si.pCommandBuffers = cmds;
    check(api_.vkQueueSubmit(queue_, 1, &si, fence), "vkQueueSubmit");
    ++stats_.submits;
    submitted_ = true;
}

void Context::flush() {
    submit();
    for (size_t k = 1; k <= slots_.size(); ++k) {  // oldest first
        Slot& slot = slots_[(slot_ + k - 1) % slots_.size()];
        if (slot.busy) retire(slot);
    }
}

}  // namespace rk::vk
