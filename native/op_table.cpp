#include <cstring>

#include "backend.hpp"
#include "optim.hpp"

namespace rk {
namespace {

#ifdef RLKIT_VULKAN
#define RK_VK_KERNEL(name) vk_##name
#else
#define RK_VK_KERNEL(name) nullptr
#endif

const OpInfo kOps[] = {
#define RK_OP(name, n_inputs, grad) {#name, n_inputs, differentiability::grad, shape_##name, cpu_##name, RK_VK_KERNEL(name)},
#include "ops.def"
#undef RK_OP
};
static_assert(sizeof(kOps) / sizeof(kOps[0]) == size_t(Op::count), "every op in ops.def has one table entry");

thread_local Graph* t_recording = nullptr;

}  // namespace

const OpInfo& op_info(Op op) { return kOps[int(op)]; }

Op op_from_name(const std::string& name) {
    for (int i = 0; i < int(Op::count); ++i)
        if (name == kOps[i].name) return Op(i);
    throw std::invalid_argument("unknown op '" + name + "'");
}

Graph* recording_graph() { return t_recording; }
void set_recording_graph(Graph* g) { t_recording = g; }

namespace {

class CpuBackend final : public Backend {
  public:
    std::shared_ptr<Storage> allocate(size_t nbytes) override { return Storage::allocate(nbytes); }
    void run(Op op, const Inputs& inputs, const OpAttrs& attrs, TensorImpl& out) override {
        op_info(op).cpu(inputs, attrs, out);
    }
    void upload(TensorImpl& dst, size_t offset, const void* host, size_t n) override {
        std::memcpy(static_cast<char*>(dst.data()) + offset, host, n);
    }
    void download(const TensorImpl& src, size_t offset, void* host, size_t n) override {
        std::memcpy(host, static_cast<const char*>(src.data()) + offset, n);
    }
    void write_inline(TensorImpl& dst, const void* host, size_t n) override { upload(dst, 0, host, n); }
};

// A copy of t in another dtype, on t's device.
TensorPtr converted(const TensorPtr& t, DType dtype) {
    TensorPtr dst = make_on(t->device, t->ne, t->ndim, dtype);
    backend(t->device).run(Op::cast, {t}, OpAttrs{{int64_t(dtype)}, {}}, *dst);
    return dst;
}

}  // namespace

#ifndef RLKIT_VULKAN
Backend* vulkan_backend(std::string* why) {
    *why = std::string("this build of rlkit has no Vulkan backend: ") +
           (std::string(RLKIT_VULKAN_OPTION) == "OFF"
                ? "it was built with RLKIT_VULKAN=OFF (reinstall rlkit without it, with the Vulkan headers and "
                  "glslc there: Debian: apt-get install libvulkan-dev glslc)"
                : "it was built where the Vulkan headers or glslc were missing (Debian: apt-get install "
                  "libvulkan-dev glslc, then reinstall rlkit)");
    return nullptr;
}
bool gpu_info(GpuInfo*) { return false; }
std::string gpu_matmul_kernel(DType, int64_t, int64_t, int64_t, int64_t) { return {}; }
std::string gpu_conv2d_kernel(DType) { return {}; }
std::string gpu_scan_kernel(bool, int64_t, int64_t, int64_t, bool) { return {}; }
void set_gpu_poison(bool) {}
bool set_gpu_profiling(bool on) { return !on; }
int64_t set_gpu_submit_after(int64_t) { return 0; }
std::vector<std::pair<std::string, uint64_t>> gpu_counters(bool) { return {}; }
PipelineStatistics gpu_pipeline_statistics() { return {}; }
int provoke_validation_error() { return -1; }
#endif

Backend& backend(Device device) {
    static CpuBackend cpu;
    if (device == Device::cpu) return cpu;
    std::string why;
    Backend* gpu = vulkan_backend(&why);
    if (!gpu) throw std::runtime_error("no GPU: " + why);
    return *gpu;
}

std::string gpu_unavailable_reason() {
    std::string why;
    return vulkan_backend(&why) ? std::string() : why;
}

TensorPtr make_on(Device device, const Shape& ne, int ndim, DType dtype, const char* what) {
    TensorPtr t = make_pending(ne, ndim, dtype, device, what);
    t->storage = backend(device).allocate(t->nbytes());
    return t;
}

void execute(Op op, const Inputs& inputs, const OpAttrs& attrs, TensorImpl& out) {
    Backend& be = backend(out.device);
    bool any_half = is_half(out.dtype);
    for (const auto& t : inputs) any_half |= is_half(t->dtype);
    // cast and cast_into convert between the dtypes themselves (cast_into writes its f16 / bf16 targets)
    if (!any_half || op == Op::cast || op == Op::cast_into || be.takes_half(op, inputs)) {
        be.run(op, inputs, attrs, out);
        return;
    }
    // f16 and bf16 are storage formats here: compute in f32 and round the result once.
    Inputs wide;
    wide.reserve(inputs.size());
    for (const auto& t : inputs) wide.push_back(is_half(t->dtype) ? converted(t, DType::f32) : t);
    if (!is_half(out.dtype)) {
        be.run(op, wide, attrs, out);
        return;
    }
    TensorPtr wide_out = make_on(out.device, out.ne, out.ndim, DType::f32);
    be.run(op, wide, attrs, *wide_out);
    be.run(Op::cast, {wide_out}, OpAttrs{{int64_t(out.dtype)}, {}}, out);
}

OutSpec check_inputs(Op op, const Inputs& inputs, const OpAttrs& attrs, Device& device) {
    const OpInfo& info = op_info(op);
    if (info.n_inputs != kVariadic && int(inputs.size()) != info.n_inputs)
        throw std::invalid_argument(std::string(info.name) + ": expected " + std::to_string(info.n_inputs) +
                                    " tensor inputs, got " + std::to_string(inputs.size()));
    for (const auto& t : inputs)
        if (!t) throw TypeError(std::string(info.name) + ": an input tensor is missing (None)");
    if (!inputs.empty()) device = inputs[0]->device;
    for (const auto& t : inputs)
        if (t->device != device)
            throw std::invalid_argument(std::string(info.name) + ": inputs are on different devices (" +
                                        device_name(device) + " and " + device_name(t->device) +
                                        "); move one with .to()");
    OutSpec spec;
    try {
        spec = info.shape(inputs, attrs);
    } catch (const SizeError& e) {  // a size the rule derived from its inputs overflows
        std::string shapes;
        for (const auto& t : inputs) shapes += (shapes.empty() ? "" : ", ") + t->shape_str();
        throw SizeError(std::string(info.name) + ": " + e.what() + (inputs.empty() ? "" : " (inputs " + shapes + ")"));
    }
    return spec;
}

TensorPtr apply(Op op, const Inputs& inputs, const OpAttrs& attrs, Device device) {
    const OpInfo& info = op_info(op);
    const OutSpec spec = check_inputs(op, inputs, attrs, device);
    if (Graph* g = recording_graph()) {
        TensorPtr out = make_pending(spec.ne, spec.ndim, spec.dtype, device, info.name);
        g->record(Node{op, inputs, attrs, out});
        return out;
    }
    for (const auto& t : inputs)
        if (t->pending())
            throw std::runtime_error(std::string(info.name) + ": input " + t->shape_str() +
                                     " is pending: run the graph that records it first");
    TensorPtr out = make_on(device, spec.ne, spec.ndim, spec.dtype, info.name);
    execute(op, inputs, attrs, *out);
    count_eager_update(op, inputs);
    return out;
}

}  // namespace rk
