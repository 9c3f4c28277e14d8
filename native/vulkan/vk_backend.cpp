// The GPU backend: storage from the Vulkan context's pools, ops recorded by their vk_<name>
// kernels (vk_kernels.cpp), transfers through staging memory.
#include "backend.hpp"
#include "vulkan/vk_context.hpp"
#include "vulkan/vk_kernels.hpp"

namespace rk {
namespace {

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
        op_info(op).vk(inputs, attrs, out);
    }

    void upload(TensorImpl& dst, const void* host) override { ctx_.upload(dst, host); }
    void download(const TensorImpl& src, void* host) override { ctx_.download(src, host); }

    void adam(TensorImpl& w, const TensorImpl& g, TensorImpl& m, TensorImpl& v, const AdamHyper& h) override {
        vk::adam(w, g, m, v, h);
    }
    void sgd(TensorImpl& w, const TensorImpl& g, TensorImpl& velocity, double lr, double momentum,
             double weight_decay) override {
        vk::sgd(w, g, velocity, lr, momentum, weight_decay);
    }
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
    return true;
}

std::vector<std::pair<std::string, uint64_t>> gpu_counters(bool reset) {
    std::string why;
    vk::Context* ctx = vk::Context::get(&why);
    if (!ctx) return {};
    vk::TransferStats& s = ctx->stats();
    std::vector<std::pair<std::string, uint64_t>> out = {
        {"uploads", s.uploads},     {"downloads", s.downloads}, {"upload_bytes", s.upload_bytes},
        {"download_bytes", s.download_bytes}, {"submits", s.submits}, {"dispatches", s.dispatches},
        {"barriers", s.barriers},   {"validation_errors", ctx->validation_errors()}};
    if (reset) s = vk::TransferStats{};
    return out;
}

}  // namespace rk
