#include <cstring>

#include "ops.hpp"

namespace rk {
namespace {

const OpInfo kOps[] = {
#define RK_OP(name, n_inputs) {#name, n_inputs, shape_##name, cpu_##name},
#include "ops.def"
#undef RK_OP
};
static_assert(sizeof(kOps) / sizeof(kOps[0]) == size_t(Op::count), "every op in ops.def has one table entry");

thread_local Graph* t_recording = nullptr;

// Copies a tensor into a new one of another float dtype (f16 <-> f32 <-> f64).
TensorPtr converted(const TensorImpl& src, DType dtype) {
    TensorPtr dst = make_tensor(src.ne, src.ndim, dtype);
    OpAttrs attrs;
    attrs.ints = {int64_t(dtype)};
    cpu_cast({std::make_shared<TensorImpl>(src)}, attrs, *dst);
    return dst;
}

}  // namespace

const OpInfo& op_info(Op op) { return kOps[int(op)]; }

Op op_from_name(const std::string& name) {
    for (int i = 0; i < int(Op::count); ++i)
        if (name == kOps[i].name) return Op(i);
    throw std::invalid_argument("unknown op '" + name + "'");
}

Graph* recording_graph() { return t_recording; }
void set_recording_graph(Graph* g) { t_recording = g; }

void run_cpu(Op op, const Inputs& inputs, const OpAttrs& attrs, TensorImpl& out) {
    const OpInfo& info = op_info(op);
    bool any_half = out.dtype == DType::f16;
    for (const auto& t : inputs) any_half |= t->dtype == DType::f16;
    if (!any_half || op == Op::cast) {
        info.cpu(inputs, attrs, out);
        return;
    }
    // On the CPU, f16 is a storage format: compute in f32 and round the result once.
    Inputs wide;
    wide.reserve(inputs.size());
    for (const auto& t : inputs) wide.push_back(t->dtype == DType::f16 ? converted(*t, DType::f32) : t);
    if (out.dtype != DType::f16) {
        info.cpu(wide, attrs, out);
        return;
    }
    TensorPtr wide_out = make_tensor(out.ne, out.ndim, DType::f32);
    info.cpu(wide, attrs, *wide_out);
    OpAttrs to_half;
    to_half.ints = {int64_t(DType::f16)};
    cpu_cast({wide_out}, to_half, out);
}

TensorPtr apply(Op op, const Inputs& inputs, const OpAttrs& attrs) {
    const OpInfo& info = op_info(op);
    if (int(inputs.size()) != info.n_inputs)
        throw std::invalid_argument(std::string(info.name) + ": expected " + std::to_string(info.n_inputs) +
                                    " tensor inputs, got " + std::to_string(inputs.size()));
    for (const auto& t : inputs)
        if (!t) throw TypeError(std::string(info.name) + ": an input tensor is missing (None)");
    OutSpec spec = info.shape(inputs, attrs);
    if (Graph* g = recording_graph()) {
        TensorPtr out = make_pending(spec.ne, spec.ndim, spec.dtype);
        g->record(Node{op, inputs, attrs, out});
        return out;
    }
    for (const auto& t : inputs)
        if (t->pending())
            throw std::runtime_error(std::string(info.name) + ": input " + t->shape_str() +
                                     " is pending: run the graph that records it first");
    TensorPtr out = make_tensor(spec.ne, spec.ndim, spec.dtype);
    run_cpu(op, inputs, attrs, *out);
    return out;
}

}  // namespace rk
