// Captured programs' command buffers: the program's commands scheduled in dependency levels
// when its recording ends, recorded once and re-submitted at every replay (RecordedCommands).
#include <chrono>
#include <cstring>
#include <thread>
#include <utility>

#include "vulkan/vk_context.hpp"

namespace rk::vk {

namespace {

constexpr size_t kScheduleLookback = 64;  // levels a program's command may move up past

}  // namespace

void Context::emit_scheduled(std::vector<DeferredCommand>& commands, LevelProfile* profile) {
    struct Level {
        std::vector<Range> reads, writes;
        std::vector<size_t> members;
    };
    std::vector<Level> levels;
    for (size_t i = 0; i < commands.size(); ++i) {
        const DeferredCommand& c = commands[i];
        // Searches down from the newest level; a command that depends on none of the last
        // kScheduleLookback levels stays just above them (the barriers below keep it correct).
        const size_t lowest = levels.size() > kScheduleLookback ? levels.size() - kScheduleLookback : 0;
        size_t placed = lowest;
        for (size_t level = levels.size(); level > lowest; --level) {
            const Level& l = levels[level - 1];
            if (any_overlap(c.reads, l.writes) || any_overlap(c.writes, l.writes) || any_overlap(c.writes, l.reads)) {
                placed = level;
                break;
            }
        }
        if (placed == levels.size()) levels.emplace_back();
        Level& l = levels[placed];
        l.reads.insert(l.reads.end(), c.reads.begin(), c.reads.end());
        l.writes.insert(l.writes.end(), c.writes.begin(), c.writes.end());
        l.members.push_back(i);
    }
    if (profile) {
        prepare_profile(*profile, levels.size());
        api_.vkCmdWriteTimestamp(cmd_, VK_PIPELINE_STAGE_BOTTOM_OF_PIPE_BIT, profile->pool, 0);
    }
    for (size_t level = 0; level < levels.size(); ++level) {
        if (level > 0) barrier();  // the first level follows the program's opening barrier
        for (size_t i : levels[level].members) commands[i].emit(cmd_);
        if (!profile) continue;
        // after every command of the level: the interval since the last stamp is the level's
        // time, its barrier's wait included
        api_.vkCmdWriteTimestamp(cmd_, VK_PIPELINE_STAGE_BOTTOM_OF_PIPE_BIT, profile->pool, uint32_t(level + 1));
        std::string& label = profile->labels[level];
        for (size_t i : levels[level].members) label += (label.empty() ? "" : " ") + commands[i].label;
    }
}

void Context::prepare_profile(LevelProfile& profile, size_t n_levels) {
    const uint32_t needed = uint32_t(n_levels + 1);
    if (profile.capacity < needed) {  // the program waited before re-recording: the pool is idle
        if (profile.pool != VK_NULL_HANDLE) api_.vkDestroyQueryPool(device_, profile.pool, nullptr);
        profile.pool = VK_NULL_HANDLE;
        profile.capacity = 0;
        VkQueryPoolCreateInfo qci{VK_STRUCTURE_TYPE_QUERY_POOL_CREATE_INFO};
        qci.queryType = VK_QUERY_TYPE_TIMESTAMP;
        qci.queryCount = needed;
        check(api_.vkCreateQueryPool(device_, &qci, nullptr, &profile.pool), "vkCreateQueryPool");
        profile.capacity = needed;
    }
    api_.vkCmdResetQueryPool(cmd_, profile.pool, 0, needed);
    profile.labels.assign(n_levels, std::string());
    profile.total_ns.assign(n_levels, 0.0);
    profile.runs = 0;
}

// ---- programs ---------------------------------------------------------------------------
//
// Ordering: a program's command buffer is submitted after the eager recording made before the
// replay (in the same batch, just before it) and starts with a full barrier, which orders it
// after every command submitted earlier on the queue; the next eager command buffer starts
// with a barrier too (begin_if_needed), so work recorded after a replay sees its results. The
// host fills the input staging only while the program is not pending (run waits for it), and
// vkQueueSubmit makes those writes visible to the device.

void Context::begin_program(VkCommandBuffer cmd, ProgramRecording* recording) {
    submit();  // the eager recording so far goes first; the program's barrier orders it after
    VkCommandBufferBeginInfo bi{VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO};
    check(api_.vkBeginCommandBuffer(cmd, &bi), "vkBeginCommandBuffer");
    eager_stats_ = stats_;
    stats_ = TransferStats{};  // count what one run of the program does
    cmd_ = cmd;
    recording_ = true;
    program_ = recording;
    barrier();
}

void Context::end_program() {
    program_->counted = stats_;
    stats_ = eager_stats_;
    program_ = nullptr;
    recording_ = false;
    cmd_ = VK_NULL_HANDLE;
}

uint64_t Context::take_stream_slot() {
    if (!program_) return 0;
    if (program_->next_stream >= program_->streams_end)
        throw std::logic_error("a program records more random ops than it reserved streams for");
    const uint64_t slot = program_->next_stream;
    program_->next_stream += sizeof(uint64_t);
    return slot;
}

Context::ProgramCommands Context::take_program_commands() {
    if (!spare_program_commands_.empty()) {
        ProgramCommands commands = spare_program_commands_.back();
        spare_program_commands_.pop_back();
        return commands;
    }
    return new_commands();
}

Context::ProgramCommands Context::new_commands() {
    ProgramCommands commands;
    VkCommandBufferAllocateInfo cai{VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO};
    cai.commandPool = pool_;
    cai.level = VK_COMMAND_BUFFER_LEVEL_PRIMARY;
    cai.commandBufferCount = 1;
    check(api_.vkAllocateCommandBuffers(device_, &cai, &commands.cmd), "vkAllocateCommandBuffers");
    VkFenceCreateInfo fci{VK_STRUCTURE_TYPE_FENCE_CREATE_INFO};
    VkResult r = api_.vkCreateFence(device_, &fci, nullptr, &commands.fence);
    if (r != VK_SUCCESS) api_.vkFreeCommandBuffers(device_, pool_, 1, &commands.cmd);
    check(r, "vkCreateFence");
    return commands;
}

void Context::give_back_program_commands(ProgramCommands commands) {
    // Not pending (its program waited) and unsignaled: reset, it is as good as new.
    if (api_.vkResetCommandBuffer(commands.cmd, 0) == VK_SUCCESS) {
        spare_program_commands_.push_back(commands);
        return;
    }
    api_.vkDestroyFence(device_, commands.fence, nullptr);
    api_.vkFreeCommandBuffers(device_, pool_, 1, &commands.cmd);
}

RecordedCommands::RecordedCommands(Context& ctx, TensorImpl& inputs, TensorImpl& outputs, size_t early_bytes)
    : ctx_(ctx), inputs_(inputs), outputs_(outputs), early_bytes_(early_bytes), commands_(ctx.take_program_commands()) {
    try {
        input_staging_ = ctx_.staging_pool_->allocate(inputs_.nbytes());
        output_staging_ = ctx_.staging_pool_->allocate(outputs_.nbytes());
        if (early_bytes_ > 0) {
            VkEventCreateInfo eci{VK_STRUCTURE_TYPE_EVENT_CREATE_INFO};
            check(ctx_.api_.vkCreateEvent(ctx_.device_, &eci, nullptr, &early_event_), "vkCreateEvent");
        }
    } catch (...) {
        ctx_.give_back_program_commands(commands_);
        throw;
    }
    std::memset(input_staging(), 0, inputs_.nbytes());  // the padding between inputs is copied too
}

RecordedCommands::~RecordedCommands() {
    try {
        wait();
    } catch (const std::exception&) {
        if (pending_eager_) pending_eager_->held_by = nullptr;
        return;  // the device is lost: its command buffer, fence and event stay as they are
    }
    if (profile_ && profile_->pool != VK_NULL_HANDLE) ctx_.api_.vkDestroyQueryPool(ctx_.device_, profile_->pool, nullptr);
    if (early_event_ != VK_NULL_HANDLE) ctx_.api_.vkDestroyEvent(ctx_.device_, early_event_, nullptr);
    ctx_.give_back_program_commands(commands_);
}

void RecordedCommands::wait_early() {
    if (!pending_ || early_event_ == VK_NULL_HANDLE) return wait();
    // Polled (the host has no blocking wait for an event): spinning first, as wait_for does,
    // then in short sleeps; the fence is checked too, so that a device lost ends the wait.
    const Api& api = ctx_.api_;
    const auto spin_until = std::chrono::steady_clock::now() + std::chrono::microseconds(1000);
    for (;;) {
        const VkResult status = api.vkGetEventStatus(ctx_.device_, early_event_);
        if (status == VK_EVENT_SET) return;
        if (status != VK_EVENT_RESET) check(status, "vkGetEventStatus (the GPU did not finish: device lost?)");
        const VkResult done = api.vkGetFenceStatus(ctx_.device_, commands_.fence);
        if (done != VK_NOT_READY) return wait();  // finished (the event is set too), or lost: wait says which
        if (std::chrono::steady_clock::now() < spin_until)
            std::this_thread::yield();
        else
            std::this_thread::sleep_for(std::chrono::microseconds(20));
    }
}

void RecordedCommands::wait() {
    if (!pending_) return;
    const Api& api = ctx_.api_;
    ctx_.wait_for(commands_.fence);
    check(api.vkResetFences(ctx_.device_, 1, &commands_.fence), "vkResetFences");
    pending_ = false;
    if (Context::Slot* eager = std::exchange(pending_eager_, nullptr)) {
        // done with the program's batch: its slot is free again (its own fence was not used)
        check(api.vkResetCommandBuffer(eager->cmd, 0), "vkResetCommandBuffer");
        eager->keep.clear();
        eager->held_by = nullptr;
    }
    if (profile_) read_profile();
}

void RecordedCommands::record(const std::function<void()>& kernels, size_t streams_offset, size_t n_streams) {
    const Api& api = ctx_.api_;
    wait();
    check(api.vkResetCommandBuffer(commands_.cmd, 0), "vkResetCommandBuffer");
    recording_ = Context::ProgramRecording{};  // the previous recording's temporaries are free again
    recording_.next_stream = inputs_.address() + streams_offset;
    recording_.streams_end = recording_.next_stream + n_streams * sizeof(uint64_t);
    VkCommandBuffer cmd = commands_.cmd;
    ctx_.begin_program(cmd, &recording_);
    try {
        const auto [in_buffer, in_offset] = ctx_.locate(inputs_);
        const VkBuffer in_staging = ctx_.staging_pool_->buffer(*input_staging_);
        const VkBufferCopy in_region{input_staging_->offset, in_offset, inputs_.nbytes()};
        ctx_.enqueue({}, {{inputs_.address(), inputs_.address() + inputs_.nbytes()}},
                     [&api, in_staging, in_buffer, in_region](VkCommandBuffer c) {
                         api.vkCmdCopyBuffer(c, in_staging, in_buffer, 1, &in_region);
                     },
                     "inputs");

        kernels();
        if (recording_.next_stream != recording_.streams_end)
            throw std::logic_error("a program recorded fewer random ops than it reserved streams for");

        const auto [out_buffer, out_offset] = ctx_.locate(outputs_);
        const VkBuffer out_staging = ctx_.staging_pool_->buffer(*output_staging_);
        const uint64_t early = early_bytes_;
        if (early > 0) {  // scheduled after the kernels that write the early outputs, last in its level
            const VkBufferCopy early_region{out_offset, output_staging_->offset, early};
            const VkEvent event = early_event_;
            ctx_.enqueue({{outputs_.address(), outputs_.address() + early}}, {},
                         [&api, out_buffer, out_staging, early_region, event](VkCommandBuffer c) {
                             api.vkCmdCopyBuffer(c, out_buffer, out_staging, 1, &early_region);
                             VkMemoryBarrier mb{VK_STRUCTURE_TYPE_MEMORY_BARRIER};  // visible to the host
                             mb.srcAccessMask = VK_ACCESS_TRANSFER_WRITE_BIT;
                             mb.dstAccessMask = VK_ACCESS_HOST_READ_BIT;
                             api.vkCmdPipelineBarrier(c, VK_PIPELINE_STAGE_TRANSFER_BIT, VK_PIPELINE_STAGE_HOST_BIT, 0,
                                                      1, &mb, 0, nullptr, 0, nullptr);
                             api.vkCmdSetEvent(c, event, VK_PIPELINE_STAGE_TRANSFER_BIT);
                         },
                         "early outputs");
        }
        const VkBufferCopy out_region{out_offset + early, output_staging_->offset + early, outputs_.nbytes() - early};
        if (out_region.size > 0)
            ctx_.enqueue({{outputs_.address() + early, outputs_.address() + outputs_.nbytes()}}, {},
                         [&api, out_buffer, out_staging, out_region](VkCommandBuffer c) {
                             api.vkCmdCopyBuffer(c, out_buffer, out_staging, 1, &out_region);
                         },
                         "outputs");
        if (ctx_.profiling() && !profile_) profile_ = std::make_unique<LevelProfile>();
        ctx_.emit_scheduled(recording_.commands, profile_.get());
        recording_.commands.clear();  // the closures hold nothing the command buffer needs
        VkMemoryBarrier mb{VK_STRUCTURE_TYPE_MEMORY_BARRIER};  // make the copy visible to the host
        mb.srcAccessMask = VK_ACCESS_TRANSFER_WRITE_BIT;
        mb.dstAccessMask = VK_ACCESS_HOST_READ_BIT;
        api.vkCmdPipelineBarrier(cmd, VK_PIPELINE_STAGE_TRANSFER_BIT, VK_PIPELINE_STAGE_HOST_BIT, 0, 1, &mb, 0,
                                 nullptr, 0, nullptr);
        check(api.vkEndCommandBuffer(cmd), "vkEndCommandBuffer");
    } catch (...) {
        api.vkEndCommandBuffer(cmd);  // abandoned: reset before the next recording
        recording_.tables.clear();
        ctx_.end_program();
        recording_ = Context::ProgramRecording{};
        throw;
    }
    ctx_.end_program();
    ctx_.write_tables(recording_.tables);  // eager: submitted before the first replay
    TransferStats& run = recording_.counted;
    run.uploads = run.downloads = 1;
    run.upload_bytes = inputs_.nbytes();
    run.download_bytes = outputs_.nbytes();
    ++ctx_.stats_.recordings;
}

void RecordedCommands::submit() {
    wait();
    if (early_event_ != VK_NULL_HANDLE)  // set by the last run, which has ended
        check(ctx_.api_.vkResetEvent(ctx_.device_, early_event_), "vkResetEvent");
    // Eager work recorded before this replay runs first, in the same submission: its command
    // buffer, then the program's (whose opening barrier orders it after everything before).
    Context::Slot* eager = ctx_.recording_ ? &ctx_.end_recording() : nullptr;
    const VkCommandBuffer cmds[2] = {eager ? eager->cmd : commands_.cmd, commands_.cmd};
    ctx_.queue_submit(eager ? cmds : cmds + 1, eager ? 2 : 1, commands_.fence);
    pending_ = true;
    if (eager) {
        eager->held_by = this;
        pending_eager_ = eager;
    }
    const TransferStats& run = recording_.counted;
    TransferStats& total = ctx_.stats_;
    total.uploads += run.uploads;
    total.downloads += run.downloads;
    total.upload_bytes += run.upload_bytes;
    total.download_bytes += run.download_bytes;
    total.dispatches += run.dispatches;
    total.barriers += run.barriers;
}

void RecordedCommands::read_profile() {
    const size_t n = profile_->total_ns.size();
    std::vector<uint64_t> stamps(n + 1);
    check(ctx_.api_.vkGetQueryPoolResults(ctx_.device_, profile_->pool, 0, uint32_t(n + 1), stamps.size() * sizeof(uint64_t),
                                          stamps.data(), sizeof(uint64_t), VK_QUERY_RESULT_64_BIT | VK_QUERY_RESULT_WAIT_BIT),
          "vkGetQueryPoolResults");
    const uint32_t bits = ctx_.limits_.timestamp_bits;
    const uint64_t mask = bits >= 64 ? ~uint64_t(0) : (uint64_t(1) << bits) - 1;
    for (size_t level = 0; level < n; ++level)
        profile_->total_ns[level] += double((stamps[level + 1] - stamps[level]) & mask) * ctx_.limits_.timestamp_period_ns;
    ++profile_->runs;
}

std::vector<LevelTime> RecordedCommands::level_times() const {
    std::vector<LevelTime> times;
    if (!profile_ || profile_->runs == 0) return times;
    for (size_t level = 0; level < profile_->total_ns.size(); ++level)
        times.push_back({profile_->total_ns[level] / 1e3 / double(profile_->runs), profile_->labels[level]});
    return times;
}

}  // namespace rk::vk
