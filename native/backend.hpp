// A backend computes ops on one device: it allocates storage there and runs (or records) one
// op's kernel into an output of that device. apply() and Graph::run() pick the backend from
// the tensors' device; everything above this interface is device-agnostic.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "ops.hpp"

namespace rk {

// A program's work recorded once and run whole at every replay (on the GPU, one command
// buffer re-submitted). The host writes the input block's bytes into input_staging() before
// submit() and reads the output block's bytes from output_staging() after wait().
// One dependency level of a recorded program: its mean GPU time per run and what it runs.
struct LevelTime {
    double mean_us = 0;
    std::string label;
};

class RecordedProgram {
  public:
    virtual ~RecordedProgram() = default;
    // Records `kernels` (the program's ops) between a copy of the input staging into the input
    // block and a copy of the output block into the output staging, replacing any earlier
    // recording. Random ops read their streams from the input block's bytes at streams_offset
    // (8 bytes each, in the order they are recorded); n_streams of them are expected.
    virtual void record(const std::function<void()>& kernels, size_t streams_offset, size_t n_streams) = 0;
    // Starts the recording after all work recorded before it and returns while it runs; work
    // recorded later runs after it. Waits for an earlier submission first.
    virtual void submit() = 0;
    // Waits for the last submission to finish (nothing to wait for: returns at once).
    virtual void wait() = 0;
    // Waits until the running submission has copied the output block's early bytes into the
    // output staging (nothing running: returns at once).
    virtual void wait_early() = 0;
    virtual void* input_staging() = 0;
    virtual const void* output_staging() = 0;
    // Per dependency level, where the program was recorded with GPU profiling on; else empty.
    virtual std::vector<LevelTime> level_times() const { return {}; }
};

class Backend {
  public:
    virtual ~Backend() = default;
    virtual std::shared_ptr<Storage> allocate(size_t nbytes) = 0;
    // Runs op into `out` (already sized, storage assigned). Kernels see f32/f64/i32 only, except
    // where takes_half says otherwise.
    virtual void run(Op op, const Inputs& inputs, const OpAttrs& attrs, TensorImpl& out) = 0;
    // Host <-> device copies of n bytes at a byte offset into a tensor (counted in
    // transfer_stats on the GPU): whole tensors, or a few columns of a buffer.
    virtual void upload(TensorImpl& dst, size_t offset, const void* host, size_t n) = 0;
    virtual void download(const TensorImpl& src, size_t offset, void* host, size_t n) = 0;
    // Writes n bytes of host data (a multiple of 4, a few KiB at most) into dst as part of the work
    // recorded so far, not as a transfer: on the GPU inside the command buffer (no staging, not
    // counted among the uploads). The coefficients of an eager optimizer update.
    virtual void write_inline(TensorImpl& dst, const void* host, size_t n) = 0;
    // A recorder for a program with these input and output blocks, whose first early_bytes of
    // outputs go to the host as soon as they are written (0: with the rest, at the end); null
    // where the backend runs ops as they come (the CPU), and a program executes its nodes at
    // every replay instead.
    virtual std::unique_ptr<RecordedProgram> recorded_program(TensorImpl&, TensorImpl&, size_t) { return nullptr; }
    // Starts what is recorded so far without waiting (the end of a training step).
    virtual void submit() {}
    // Waits for everything recorded so far.
    virtual void synchronize() {}
    // Whether op's kernel reads these f16 or bf16 inputs as they are; otherwise they are widened
    // to f32 first (and a 16-bit result rounded once at the end).
    virtual bool takes_half(Op, const Inputs&) const { return false; }
};

// The Vulkan backend, created on first use; null (and `why` says what is missing) where no
// Vulkan loader, driver or device exists, or the build has no Vulkan.
Backend* vulkan_backend(std::string* why);

// The backend of a device; for the GPU, raises a clear error where Vulkan is unavailable.
Backend& backend(Device device);

// Whether the GPU backend can be used here, and if not, why (empty when it can).
std::string gpu_unavailable_reason();

// What the GPU backend reports: its device, and its counters since the last reset (uploads,
// downloads and their bytes, submits, dispatches, barriers, programs' command buffers recorded,
// validation errors). Empty where there is no GPU backend.
struct GpuInfo {
    std::string name;
    uint64_t memory = 0;
    uint32_t subgroup_size = 0, max_shared_memory = 0;
    uint64_t memory_in_use = 0, memory_reserved = 0;
    bool validation = false;  // the Khronos validation layer is on (RLKIT_VK_VALIDATION=1)
    bool subgroup_quad = false;  // quad operations in compute shaders (the register recurrences need them)
    bool pipeline_statistics = false;  // pipelines' statistics are kept (gpu_pipeline_statistics)
};
bool gpu_info(GpuInfo* info);
// The kernel GPU matmul uses for operands of this dtype and an [m, n] output with `batch`
// slices over a reduction of k, in words (empty without a GPU).
std::string gpu_matmul_kernel(DType dtype, int64_t m, int64_t n, int64_t k, int64_t batch);
// The kernel the GPU's conv2d (and its backward helpers) runs on operands of this dtype, in words
// (empty without a GPU).
std::string gpu_conv2d_kernel(DType dtype);
// The shader the GPU's ssm_scan (backward: ssm_scan_back) runs at these sizes (empty without a GPU).
std::string gpu_scan_kernel(bool backward, int64_t d_state, int64_t head_dim, int64_t n_tok, bool mamba1);
// Tests: fill every new GPU allocation with NaN, so that elements a kernel fails to write show.
void set_gpu_poison(bool on);
// Programs recorded from now on time their GPU work per dependency level (Program::level_times);
// false where the GPU cannot time its queue.
bool set_gpu_profiling(bool on);
// An eager GPU recording the host has spent this many microseconds on is submitted at its next
// command (0: only when read, synchronized or 4096 commands long; default 200). Returns the
// previous value (0 without a GPU).
int64_t set_gpu_submit_after(int64_t microseconds);
std::vector<std::pair<std::string, uint64_t>> gpu_counters(bool reset);
// The driver compiler's statistics of each GPU pipeline made so far (registers, spills, shared
// memory), by shader, as (name, value) pairs: empty unless RLKIT_VK_PIPELINE_STATISTICS=1 was set
// before the GPU's first use and the driver offers VK_KHR_pipeline_executable_properties.
using PipelineStatistics = std::map<std::string, std::vector<std::pair<std::string, std::string>>>;
PipelineStatistics gpu_pipeline_statistics();
// Tests: errors the validation layer reports for one deliberately invalid Vulkan call (-1 when
// the layer is off or there is no GPU): proof that validation is really active.
int provoke_validation_error();

// A new tensor with storage on `device`.
TensorPtr make_on(Device device, const Shape& ne, int ndim, DType dtype, const char* what = "tensor");

// Runs op on the backend of out's device; f16 is computed in f32 (cast in, cast out).
void execute(Op op, const Inputs& inputs, const OpAttrs& attrs, TensorImpl& out);

}  // namespace rk
