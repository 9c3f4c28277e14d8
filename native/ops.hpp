// The op table and how an op is applied: its shape rule runs at call time, then it is either
// executed at once (eager) or recorded into the graph that is recording on this thread.
#pragma once

#include <stdexcept>
#include <string>
#include <vector>

#include "tensor.hpp"

namespace rk {

// A wrong dtype or kind of argument (becomes Python's TypeError). Shape errors are
// std::invalid_argument (ValueError) and bad indices std::out_of_range (IndexError).
struct TypeError : std::invalid_argument {
    using std::invalid_argument::invalid_argument;
};

// Memory a device could not provide (becomes Python's MemoryError, with this message).
struct OutOfMemory : std::runtime_error {
    using std::runtime_error::runtime_error;
};

// The n_inputs of an op taking any number of inputs (its shape rule checks them).
constexpr int kVariadic = -1;

// The kinds of elementwise op (native/elementwise.def): unary, binary (broadcasting), and the
// fused backward helpers (upstream gradient, saved value: one shape).
enum class ElementwiseKind { unary, binary, backward };
constexpr int elementwise_inputs(ElementwiseKind kind) { return kind == ElementwiseKind::unary ? 1 : 2; }

enum class Op : int {
#define RK_OP(name, n_inputs, grad) name,
#include "ops.def"
#undef RK_OP
    count
};

struct OpAttrs {
    std::vector<int64_t> ints;
    std::vector<double> floats;
};

// What an op produces: decided by its shape rule from its inputs and attributes.
struct OutSpec {
    Shape ne{1, 1, 1, 1};
    int ndim = 2;
    DType dtype = DType::f32;
};

using Inputs = std::vector<TensorPtr>;
using ShapeRule = OutSpec (*)(const Inputs& in, const OpAttrs& attrs);
using CpuKernel = void (*)(const Inputs& in, const OpAttrs& attrs, TensorImpl& out);

// Records (Vulkan) an op's shader into an output on the GPU; same signature as the CPU kernel.
using VkKernel = CpuKernel;

// Whether an op is differentiable (ops.def's third column): a `grad` op is recorded on the tape
// and has a vjp rule in rlkit/core/vjp.py.
namespace differentiability {
constexpr bool grad = true, no_grad = false;
}

struct OpInfo {
    const char* name;
    int n_inputs;  // or kVariadic
    bool differentiable;
    ShapeRule shape;
    CpuKernel cpu;
    VkKernel vk;  // null in a build without Vulkan
};

const OpInfo& op_info(Op op);
Op op_from_name(const std::string& name);

// Ops that write into their inputs (the captured optimizer updates): a graph never skips them.
inline bool has_side_effects(Op op) {
    return op == Op::adam_step || op == Op::sgd_step || op == Op::polyak_step || op == Op::cast_into ||
           op == Op::put_cols;
}
// Ops that draw one fresh stream from the global generator at every execution.
inline bool draws_random(Op op) {
    return op == Op::rand || op == Op::randn || op == Op::randint || op == Op::sample_categorical;
}

// The checks apply makes before it runs an op: the number of inputs, one device (set into
// `device` from the inputs), the op's shape rule. Returns the output's spec; throws what apply would.
OutSpec check_inputs(Op op, const Inputs& inputs, const OpAttrs& attrs, Device& device);

// Validates and then runs (or records) one op on its inputs' device (`device` for ops
// without inputs).
TensorPtr apply(Op op, const Inputs& inputs, const OpAttrs& attrs, Device device = Device::cpu);

// Declarations of every shape rule and kernel named in ops.def.
#define RK_OP(name, n_inputs, grad)                                 \
    OutSpec shape_##name(const Inputs& in, const OpAttrs& attrs);   \
    void cpu_##name(const Inputs& in, const OpAttrs& attrs, TensorImpl& out);
#include "ops.def"
#undef RK_OP
#ifdef RLKIT_VULKAN
#define RK_OP(name, n_inputs, grad) void vk_##name(const Inputs& in, const OpAttrs& attrs, TensorImpl& out);
#include "ops.def"
#undef RK_OP
#endif

// A graph of recorded nodes, planned and executed at run(). While a graph is recording on a
// thread, apply() appends to it and returns pending tensors.
struct Node {
    Op op;
    Inputs inputs;
    OpAttrs attrs;
    TensorPtr out;
};

// Removes the nodes marked in `drop` (a graph pass's fused ones), keeping the others' order.
inline void erase_nodes(std::vector<Node>& nodes, const std::vector<bool>& drop) {
    size_t kept = 0;
    for (size_t k = 0; k < nodes.size(); ++k) {
        if (drop[k]) continue;
        if (kept != k) nodes[kept] = std::move(nodes[k]);  // a self-move would empty the node
        ++kept;
    }
    nodes.resize(kept);
}

struct GraphStats {
    size_t n_nodes = 0;
    size_t arena_bytes = 0;         // memory the planner used for intermediates
    size_t intermediate_bytes = 0;  // what they would take without reuse
    size_t kept_bytes = 0;          // outputs still referenced outside the graph
    size_t n_skipped = 0;           // dead nodes (no live reader, no outside reference)
    size_t n_views = 0;             // reshapes and slices that read their input's bytes in place (views.hpp)
};

class Graph {
  public:
    void record(Node node) { nodes_.push_back(std::move(node)); }
    // Plans memory by liveness (intermediates share one arena) and executes the live nodes in
    // order. Outputs referenced from outside the graph get their own storage; the graph is
    // empty afterwards.
    GraphStats run();
    size_t size() const { return nodes_.size(); }
    // Hands the recorded nodes over (to a Program); the graph is empty afterwards.
    std::vector<Node> take_nodes() { return std::move(nodes_); }

  private:
    std::vector<Node> nodes_;
};

// The graph recording on this thread, or null (eager).
Graph* recording_graph();
// Tests: the AVX2 + FMA builds of the float loops of exp, sigmoid and silu on (where the CPU has
// them) or off (the baseline's loops); returns the previous setting.
bool set_wide_elementwise(bool on);
void set_recording_graph(Graph* g);

}  // namespace rk
