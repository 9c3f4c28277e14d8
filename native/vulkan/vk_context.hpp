// The Vulkan device rlkit computes on, in one Context: its bring-up and teardown (vk_device.cpp:
// instance, device choice, limits, queues, memory pools), shader pipelines (vk_pipelines.cpp), and
// the recorder (vk_recorder.cpp) that puts dispatches and copies into one command buffer with
// barriers only between dependent work, submitted when the host reads a value (or the recording
// grows large or old); captured programs' command buffers (vk_program.cpp: their commands scheduled in
// dependency levels). Memory is vk_memory.hpp's: large blocks sub-allocated, addressed by buffer
// device address.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "backend.hpp"
#include "tensor.hpp"
#include "vulkan/vk_api.hpp"
#include "vulkan/vk_memory.hpp"

namespace rk::vk {

constexpr uint32_t kPushConstantBytes = 128;  // lavapipe's limit; every push block fits in it

// A byte range of device memory, by device address.
struct Range {
    uint64_t begin, end;
};

// Whether any range of xs shares a byte with any range of ys.
inline bool any_overlap(const std::vector<Range>& xs, const std::vector<Range>& ys) {
    for (const Range& x : xs)
        for (const Range& y : ys)
            if (x.begin < y.end && y.begin < x.end) return true;
    return false;
}

struct Limits {
    uint32_t subgroup_size = 0;
    bool subgroup_arithmetic = false;  // subgroupAdd and the like in compute shaders
    bool subgroup_quad = false;        // subgroupQuadSwapHorizontal/Vertical in compute shaders
    // The loop iterations a shader invocation may run in all before the driver ends its loops
    // early (0: no such limit). lavapipe's gallivm counts every loop of a shader against one
    // budget, LP_MAX_TGSI_LOOP_ITERATIONS, and then cuts them short: wrong results, no error.
    uint64_t loop_iterations = 0;
    uint32_t max_shared_memory = 0;
    uint32_t max_push_constants = 0;
    uint32_t max_group_count_x = 0;
    uint32_t max_group_count_z = 0;  // a dispatch's z, which batched kernels count their batch slices in
    uint64_t max_allocation = 0;
    // Cooperative matrices with f16 inputs, f32 accumulators, 16x16x16 subgroup-scope fragments and
    // 32-invocation subgroups: what matmul_coopmat.comp assumes. The extension is the one the
    // shader was built for: VK_KHR_cooperative_matrix where the build had a shader compiler that
    // knows it (glslang 13.1+), else VK_NV_cooperative_matrix (glslc 2023.2 knows only that one).
    bool cooperative_matrix_f16 = false;
    // The same with bf16 inputs (VK_KHR_shader_bfloat16), where the build has the bf16 variants
    // (a shader compiler that knows GL_EXT_bfloat16).
    bool cooperative_matrix_bf16 = false;
    // Nanoseconds per timestamp tick on the compute queue, and the ticks' valid bits (0: the
    // queue cannot time).
    double timestamp_period_ns = 0;
    uint32_t timestamp_bits = 0;
};

struct TransferStats {
    uint64_t uploads = 0, downloads = 0, upload_bytes = 0, download_bytes = 0;
    uint64_t submits = 0, dispatches = 0, barriers = 0;
    uint64_t recordings = 0;  // programs' command buffers recorded (once per program, unless re-recorded)
};

class RecordedCommands;

// Where a captured program's GPU time goes: a timestamp after the opening barrier and after each
// dependency level of its command buffer, the intervals summed over runs. Programs recorded
// while profiling is on (Context::set_profiling) carry one; the timestamps cost a little, so
// benchmarks leave it off.
struct LevelProfile {
    VkQueryPool pool = VK_NULL_HANDLE;
    uint32_t capacity = 0;            // timestamps the pool holds
    std::vector<std::string> labels;  // per level: its commands' labels
    std::vector<double> total_ns;     // per level: summed over runs
    uint64_t runs = 0;
};

class Context {
  public:
    // The process's Vulkan context, created on first use; null with `why` set where Vulkan or a
    // suitable device is missing.
    static Context* get(std::string* why);
    ~Context();

    const Limits& limits() const { return limits_; }
    const std::string& device_name() const { return device_name_; }
    uint64_t device_memory() const { return device_memory_; }
    TransferStats& stats() { return stats_; }
    uint32_t validation_errors() const { return validation_errors_; }
    // Tests: makes one deliberately invalid call and returns the errors the validation layer
    // reported for it (counted apart from validation_errors), or -1 when the layer is off.
    int provoke_validation_error();
    bool validating() const { return messenger_ != VK_NULL_HANDLE; }
    uint64_t memory_in_use() const { return device_pool_->bytes_in_use(); }
    uint64_t memory_reserved() const { return device_pool_->bytes_reserved(); }

    // Device-local storage of n bytes (a sub-allocation), addressed by its device address.
    // With poisoning on (tests), new storage is filled with NaN so unwritten elements show.
    std::shared_ptr<Storage> allocate(uint64_t nbytes, bool poison = true);
    void set_poison(bool on) { poison_ = on; }
    // An eager recording the host has spent this long on is submitted at its next command, so
    // that the GPU runs it while the host records the rest (0: only when read, synchronized or
    // kMaxRecorded commands long). Returns the previous value.
    std::chrono::microseconds set_submit_after(std::chrono::microseconds after) { return std::exchange(submit_after_, after); }
    // Programs recorded from now on time each dependency level (where the queue can time).
    void set_profiling(bool on) { profiling_ = on && limits_.timestamp_bits > 0; }
    bool profiling() const { return profiling_; }
    // What the driver's compiler says of each pipeline made so far (registers, spills, shared
    // memory: VK_KHR_pipeline_executable_properties), by shader, as (name, value) pairs; empty
    // unless RLKIT_VK_PIPELINE_STATISTICS=1 was set when the context was made and the driver
    // offers the extension. Which workgroups an SM holds follows from these without a profiler.
    const PipelineStatistics& pipeline_statistics() const { return pipeline_statistics_; }
    bool keeps_pipeline_statistics() const { return get_statistics_ != nullptr; }

    // Records one compute dispatch of `shader` over `groups` workgroups (x may exceed the device
    // limit: it is folded into y); the shader reads `reads` and writes `writes`.
    void dispatch(const std::string& shader, const void* push, uint32_t push_size, uint64_t groups,
                  const std::vector<Range>& reads, const std::vector<Range>& writes, uint32_t groups_z = 1);
    void fill(const TensorImpl& dst, uint32_t pattern);
    void fill_range(VkBuffer buffer, uint64_t offset, uint64_t address, uint64_t size, uint32_t pattern);
    void copy(const TensorImpl& src, const TensorImpl& dst);
    // Records a write of `bytes` (a multiple of 4) of host data into dst, carried in the command
    // buffer itself: no staging and no transfer to count, and a program's recording repeats it
    // at every replay (small tables of device addresses that kernels read).
    void write(const TensorImpl& dst, const void* data, uint64_t bytes);
    // A table of `bytes` of host data that kernels read by address (chunk and step records), on
    // its own storage and written once: while a program records, by an eager write once the
    // recording ends (submitted before the program's first replay) rather than a command of the
    // program repeated at every replay (SAC's update wrote 40 tables, 17.8 us of its first level
    // on the H200, the same bytes every time).
    TensorPtr table(const void* data, uint64_t bytes);

    // Host data in and out through staging memory, in pieces of at most 64 MiB.
    void upload(const TensorImpl& dst, uint64_t offset, const void* host, uint64_t size);
    void download(const TensorImpl& src, uint64_t offset, void* host, uint64_t size);
    // Submits what is recorded without waiting (the GPU starts while the host goes on).
    void submit();
    // Submits what is recorded and waits for every submission.
    void flush();

    // While a program records: the device address its next random op reads its stream from
    // (8 bytes, filled by the host before every submission); 0 when no program records.
    uint64_t take_stream_slot();

  private:
    void upload_piece(const TensorImpl& dst, uint64_t offset, const void* host, uint64_t size);
    void download_piece(const TensorImpl& src, uint64_t offset, void* host, uint64_t size);
    friend class RecordedCommands;
    // A program's recording (between begin_program and end_program): the recorder's calls go into
    // the program's command buffer instead of the eager ones, with no early submits and no host
    // transfers; storage allocated meanwhile lives as long as the recording.
    // A command recorded into a program: what it reads and writes, and how to put it into a
    // command buffer. Programs keep their commands until the recording ends, then schedule them.
    struct DeferredCommand {
        std::vector<Range> reads, writes;
        std::function<void(VkCommandBuffer)> emit;
        std::string label;  // what it is (a shader and its workgroups), for level profiles
    };
    struct TableWrite {
        std::shared_ptr<Storage> storage;
        std::vector<uint8_t> bytes;
    };
    struct ProgramRecording {
        uint64_t next_stream = 0, streams_end = 0;
        std::vector<std::shared_ptr<Storage>> keep;
        std::vector<TableWrite> tables;  // written once, eagerly, when the recording has ended
        std::vector<DeferredCommand> commands;  // in the order the kernels recorded them
        TransferStats counted;                  // what the recording counted (stats of one run)
    };
    // Puts a command into the eager recording now (with a barrier if it depends on unsynced
    // work), or into the program being recorded.
    void enqueue(std::vector<Range> reads, std::vector<Range> writes, std::function<void(VkCommandBuffer)> emit,
                 std::string label);
    // Emits a program's commands in dependency levels: every command goes into the earliest
    // level after all the commands it depends on (read after write, write after read or
    // write, by address range), and one barrier separates consecutive levels. Independent work
    // (two critics, a batch's gathers) then shares a level instead of a barrier each.
    // With a profile, a timestamp follows the opening barrier and each level (see LevelProfile).
    void emit_scheduled(std::vector<DeferredCommand>& commands, LevelProfile* profile);
    // Sizes the profile's query pool for n_levels + 1 timestamps and resets them in cmd_.
    void prepare_profile(LevelProfile& profile, size_t n_levels);
    // A command buffer and fence for a program: recycled from programs destroyed earlier (so that
    // thousands of short-lived captures make no new Vulkan objects), or made.
    struct ProgramCommands {
        VkCommandBuffer cmd = VK_NULL_HANDLE;
        VkFence fence = VK_NULL_HANDLE;
    };
    ProgramCommands take_program_commands();
    ProgramCommands new_commands();  // a primary command buffer of pool_ and an unsignalled fence
    void give_back_program_commands(ProgramCommands commands);
    std::vector<ProgramCommands> spare_program_commands_;
    void begin_program(VkCommandBuffer cmd, ProgramRecording* recording);
    void end_program();
    void write_tables(std::vector<TableWrite>& tables);  // eagerly, after end_program
    // Records a write of host bytes into [offset, offset + size) of buffer (device address `address`).
    void write_range(VkBuffer buffer, uint64_t offset, uint64_t address, const void* data, uint64_t bytes);
    void count_recorded();  // one more command; an eager recording this long (or this old) is submitted
    bool recorded_for_long() const;  // the eager recording began submit_after_ ago or earlier
    Context() = default;
    void init(std::string* why);
    void begin_if_needed();
    void barrier();
    void access(const std::vector<Range>& reads, const std::vector<Range>& writes);
    VkPipeline pipeline(const std::string& shader);
    void keep_statistics(const std::string& shader, VkPipeline pipeline);
    std::pair<VkBuffer, uint64_t> locate(const TensorImpl& t) const;

    Api api_;
    void* loader_ = nullptr;
    VkInstance instance_ = VK_NULL_HANDLE;
    VkDebugUtilsMessengerEXT messenger_ = VK_NULL_HANDLE;
    VkPhysicalDevice physical_ = VK_NULL_HANDLE;
    VkDevice device_ = VK_NULL_HANDLE;
    VkQueue queue_ = VK_NULL_HANDLE;
    uint32_t queue_family_ = 0;
    VkCommandPool pool_ = VK_NULL_HANDLE;
    // A few command buffers in rotation: one records while earlier ones run. Each keeps the
    // staging memory its copies read until its fence signals.
    struct Slot {
        VkCommandBuffer cmd = VK_NULL_HANDLE;
        VkFence fence = VK_NULL_HANDLE;
        bool busy = false;
        // A program submitted with this slot's batch ahead of it (under the program's fence), not
        // yet waited for: the slot is reused only after that program's wait().
        RecordedCommands* held_by = nullptr;
        std::vector<std::shared_ptr<Allocation>> keep;
    };
    std::vector<Slot> slots_;
    size_t slot_ = 0;
    void retire(Slot& slot);
    void wait_for(VkFence fence);  // until the fence signals
    // Ends the eager recording; its slot keeps the staging its copies read. Submit it next.
    Slot& end_recording();
    void queue_submit(const VkCommandBuffer* cmds, uint32_t n, VkFence fence);
    VkCommandBuffer cmd_ = VK_NULL_HANDLE;  // the recording slot's command buffer
    VkPipelineLayout layout_ = VK_NULL_HANDLE;
    std::unordered_map<std::string, VkPipeline> pipelines_;
    // Set where the device was made with pipelineExecutableInfo (RLKIT_VK_PIPELINE_STATISTICS=1).
    PFN_vkGetPipelineExecutablePropertiesKHR get_executables_ = nullptr;
    PFN_vkGetPipelineExecutableStatisticsKHR get_statistics_ = nullptr;
    PipelineStatistics pipeline_statistics_;
    std::unique_ptr<MemoryPool> device_pool_, staging_pool_;
    Limits limits_;
    std::string device_name_;
    uint64_t device_memory_ = 0;
    TransferStats stats_;
    uint32_t validation_errors_ = 0;
    bool provoking_ = false;  // inside provoke_validation_error
    int provoked_errors_ = 0;

    bool poison_ = false;
    bool profiling_ = false;
    bool recording_ = false;
    bool submitted_ = false;  // anything was ever submitted (a new command buffer starts with a barrier)
    ProgramRecording* program_ = nullptr;
    TransferStats eager_stats_;  // stats_ as they were before a program's recording began
    uint32_t recorded_ = 0;
    std::chrono::steady_clock::time_point recording_since_;  // when the eager command buffer began
    // A tape's forward and backward take the host milliseconds of Python and recording: submitted
    // only at the end, all of it came before all of the GPU's time. An agent's step records for
    // less and still goes to the GPU in one submit.
    std::chrono::microseconds submit_after_{200};
    std::vector<Range> unsynced_reads_, unsynced_writes_;
    std::vector<std::shared_ptr<Allocation>> in_flight_;  // staging kept until the submit completes
    uint64_t in_flight_bytes_ = 0;

    friend VKAPI_ATTR VkBool32 VKAPI_CALL on_validation_message(VkDebugUtilsMessageSeverityFlagBitsEXT,
                                                               VkDebugUtilsMessageTypeFlagsEXT,
                                                               const VkDebugUtilsMessengerCallbackDataEXT*, void*);
};

// A captured program's command buffer: a copy of the input staging into the program's input
// block, its kernels, and a copy of its output block into the output staging; recorded once,
// submitted at every replay, and waited for before the host reads the outputs, before it is
// submitted or recorded again, and before the eager batch submitted with it is reused. Where
// the outputs begin with early bytes, those are copied out in the level after the kernels
// that write them, and an event tells the host (wait_early) while the rest runs.
class RecordedCommands final : public RecordedProgram {
  public:
    RecordedCommands(Context& ctx, TensorImpl& inputs, TensorImpl& outputs, size_t early_bytes);
    ~RecordedCommands() override;
    void record(const std::function<void()>& kernels, size_t streams_offset, size_t n_streams) override;
    void submit() override;
    void wait() override;
    void wait_early() override;
    void* input_staging() override { return ctx_.staging_pool_->host(*input_staging_); }
    const void* output_staging() override { return ctx_.staging_pool_->host(*output_staging_); }
    std::vector<LevelTime> level_times() const override;

  private:
    void read_profile();  // adds the last run's level intervals to profile_
    Context& ctx_;
    TensorImpl &inputs_, &outputs_;  // the program's blocks (the program outlives this)
    const size_t early_bytes_;
    VkEvent early_event_ = VK_NULL_HANDLE;  // set by the device once the early bytes are in the staging
    Context::ProgramCommands commands_;
    bool pending_ = false;
    Context::Slot* pending_eager_ = nullptr;  // the eager batch submitted ahead of the pending run
    std::shared_ptr<Allocation> input_staging_, output_staging_;
    Context::ProgramRecording recording_;
    std::unique_ptr<LevelProfile> profile_;  // where the program was recorded with profiling on
};

}  // namespace rk::vk
