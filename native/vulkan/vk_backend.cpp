// The GPU backend: storage from the Vulkan context's pools, ops recorded by their vk_<name>
// kernels (vk_kernels.cpp), transfers through staging memory.
#include "backend.hpp"
#include "vulkan/vk_context.hpp"
#include "vulkan/vk_kernels.hpp"

namespace rk {
namespace {

// u8 is a storage dtype on the GPU: gathered by whole 32-bit words, copied, or widened to f32.
bool u8_supported(Op op, const TensorImpl& t) {
    return op == Op::reshape || op == Op::cast || (op == Op::get_rows && t.ne[0] % 4 == 0);
}

class VulkanBackend final : public Backend {
  public:
    explicit VulkanBackend(vk::Context& ctx) : ctx_(ctx) {}

    std::shared_ptr<Storage> allocate(size_t nbytes) override { return ctx_.allocate(nbytes); }

    void run(Op op, const Inputs& inputs, const OpAttrs& attrs, TensorImpl& out) override {
        for (const auto& t : inputs)
            if (t->dtype == DType::f64)
                throw TypeError(std::string(op_info(op).name) + ": f64 tensors are CPU-only (for gradient checks)");
        if (out.dtype == DType::f64)
            throw TypeError(std::string(op_info(op).name) + ": f64 tensors are CPU-only (for gradient checks)");
        for (const auto& t : inputs)
            if (t->dtype == DType::u8 && !u8_supported(op, *t))
                throw TypeError(std::string(op_info(op).name) + ": u8 tensors on the GPU support get_rows (rows a "
                                "multiple of 4), reshape and cast to f32; got " + t->shape_str());
        op_info(op).vk(inputs, attrs, out);
    }

    void upload(TensorImpl& dst, size_t offset, const void* host, size_t n) override {
        ctx_.upload(dst, offset, host, n);
    }
    void download(const TensorImpl& src, size_t offset, void* host, size_t n) override {
        ctx_.download(src, offset, host, n);
    }

    void write_inline(TensorImpl& dst, const void* host, size_t n) override { ctx_.write(dst, host, n); }
    std::unique_ptr<RecordedProgram> recorded_program(TensorImpl& inputs, TensorImpl& outputs,
                                                      size_t early_bytes) override {
        return std::make_unique<vk::RecordedCommands>(ctx_, inputs, outputs, early_bytes);
    }
    bool takes_half(Op op, const Inputs& inputs) const override { return vk::takes_half(op, inputs); }
    void submit() override { ctx_.submit(); }
    void synchronize() override { ctx_.flush(); }

  private:
    vk::Context& ctx_;
};

}  // namespace

Backend* vulkan_backend(std::string* why) {
    static VulkanBackend* gpu = nullptr;  // lives as long as the (never destroyed) context
    if (gpu) return gpu;
    vk::Context* ctx = vk::Context::get(why);
    if (!ctx) return nullptr;
    gpu = new VulkanBackend(*ctx);
    return gpu;
}

void set_gpu_poison(bool on) {
    std::string why;
    if (vk::Context* ctx = vk::Context::get(&why)) ctx->set_poison(on);
}

bool set_gpu_profiling(bool on) {
    std::string why;
    vk::Context* ctx = vk::Context::get(&why);
    if (!ctx) return false;
    ctx->set_profiling(on);
    return ctx->profiling() == on;
}

int64_t set_gpu_submit_after(int64_t microseconds) {
    std::string why;
    vk::Context* ctx = vk::Context::get(&why);
    return ctx ? ctx->set_submit_after(std::chrono::microseconds(microseconds)).count() : 0;
}

PipelineStatistics gpu_pipeline_statistics() {
    std::string why;
    vk::Context* ctx = vk::Context::get(&why);
    return ctx ? ctx->pipeline_statistics() : PipelineStatistics{};
}

bool gpu_info(GpuInfo* info) {
    std::string why;
    vk::Context* ctx = vk::Context::get(&why);
    if (!ctx) return false;
    info->name = ctx->device_name();
    info->memory = ctx->device_memory();
    info->subgroup_size = ctx->limits().subgroup_size;
    info->max_shared_memory = ctx->limits().max_shared_memory;
    info->memory_in_use = ctx->memory_in_use();
    info->memory_reserved = ctx->memory_reserved();
    info->validation = ctx->validating();
    info->subgroup_quad = ctx->limits().subgroup_quad;
    info->pipeline_statistics = ctx->keeps_pipeline_statistics();
    return true;
}

std::string gpu_matmul_kernel(DType dtype, int64_t m, int64_t n, int64_t k, int64_t batch) {
    std::string why;
    return vk::Context::get(&why) ? vk::matmul_kernel(dtype, m, n, k, batch) : std::string();
}

std::string gpu_conv2d_kernel(DType dtype) {
    std::string why;
    return vk::Context::get(&why) ? vk::conv2d_kernel(dtype) : std::string();
}

std::string gpu_scan_kernel(bool backward, int64_t d_state, int64_t head_dim, int64_t n_tok, bool mamba1) {
    std::string why;
    const ScanDims d{d_state, head_dim, 1, n_tok, 1, 1, 1, mamba1 ? d_state : 1};
    return vk::Context::get(&why) ? vk::scan_kernel(d, backward) : std::string();
}

int provoke_validation_error() {
    std::string why;
    vk::Context* ctx = vk::Context::get(&why);
    return ctx ? ctx->provoke_validation_error() : -1;
}

std::vector<std::pair<std::string, uint64_t>> gpu_counters(bool reset) {
    std::string why;
    vk::Context* ctx = vk::Context::get(&why);
    if (!ctx) return {};
    vk::TransferStats& s = ctx->stats();
    std::vector<std::pair<std::string, uint64_t>> out = {
        {"uploads", s.uploads},     {"downloads", s.downloads}, {"upload_bytes", s.upload_bytes},
        {"download_bytes", s.download_bytes}, {"submits", s.submits}, {"dispatches", s.dispatches},
        {"barriers", s.barriers},   {"recordings", s.recordings}, {"validation_errors", ctx->validation_errors()}};
    if (reset) s = vk::TransferStats{};
    return out;
}

}  // namespace rk
