#include "elementwise_chain.hpp"

#include <algorithm>
#include <iterator>
#include <string>
#include <unordered_map>

#include "kernel_util.hpp"

namespace rk {
namespace {

constexpr ElementwiseOp kElementwiseOps[] = {
#define RK_ELEMENTWISE(name, kind, code, n_floats, grad, value) {Op::name, ElementwiseKind::kind, code, n_floats},
#include "elementwise.def"
#undef RK_ELEMENTWISE
};

// A chain's step names its op by the code, in the shaders' switch: one op per code.
constexpr int ops_with_code(uint32_t code) {
    int n = 0;
    for (const ElementwiseOp& e : kElementwiseOps) n += e.code == code;
    return n;
}
#define RK_ELEMENTWISE(name, kind, code, n_floats, grad, value) \
    static_assert(ops_with_code(code) == 1, "native/elementwise.def: the code of " #name " is another op's too");
#include "elementwise.def"
#undef RK_ELEMENTWISE

constexpr size_t kShapeInts = 5;  // ne[0..3], ndim
constexpr size_t kStepInts = 3;   // op, a, b

const char* const kOp = "elementwise_chain";

// A chain whose output has other readers is copied into a reader's chain, which runs its steps
// again from its inputs, where the output has at most this many elements: the reader then waits
// for the chain's inputs instead of its output, a level less for a run of scalar chains over a
// batch (SAC's critic loss and its gradient both read q - y, which was a level of its own). The
// original still runs where a reader outside the copies needs it.
constexpr int64_t kRecomputedElements = 1 << 12;

bool full_size(const TensorImpl& t, const Shape& ne) { return t.ne == ne; }

// A node a chain can hold: an elementwise op on f32 tensors shaped like its output (or of one
// element, binary ops only), with the attributes its op takes.
bool chainable(const Node& node) {
    const ElementwiseOp* info = elementwise_op(node.op);
    if (!info || node.out->dtype != DType::f32 || node.attrs.floats.size() != info->n_floats) return false;
    for (const TensorPtr& t : node.inputs) {
        if (t->dtype != DType::f32) return false;
        if (!full_size(*t, node.out->ne) && (t->numel() != 1 || !info->binary())) return false;
    }
    return true;
}

struct Chain {
    size_t first;                  // the index of its first node
    std::vector<size_t> members;   // its nodes' indices, in order
    Inputs inputs;                 // the operands that are not the value so far
    std::vector<int64_t> steps;    // (op, a, b) per step
    std::vector<double> floats;    // (p0, p1) per step
};

// The inputs `node` would add to `chain` (those it does not hold yet, other than `value`).
size_t new_inputs(const Chain& chain, const Node& node, const TensorImpl* value) {
    std::vector<const TensorImpl*> added;
    for (const TensorPtr& t : node.inputs) {
        if (t.get() == value) continue;
        const bool held = std::any_of(chain.inputs.begin(), chain.inputs.end(), [&](const TensorPtr& h) { return h == t; });
        if (!held && std::find(added.begin(), added.end(), t.get()) == added.end()) added.push_back(t.get());
    }
    return added.size();
}

void add_step(Chain& chain, const Node& node, const TensorImpl* value) {
    const ElementwiseOp& info = *elementwise_op(node.op);
    auto operand = [&](const TensorPtr& t) -> int64_t {
        if (t.get() == value) return kChainValue;
        auto at = std::find(chain.inputs.begin(), chain.inputs.end(), t);
        if (at != chain.inputs.end()) return at - chain.inputs.begin();
        chain.inputs.push_back(t);
        return int64_t(chain.inputs.size()) - 1;
    };
    const int64_t a = operand(node.inputs[0]);
    const int64_t b = info.binary() ? operand(node.inputs[1]) : kChainNone;
    chain.steps.insert(chain.steps.end(), {int64_t(node.op), a, b});
    chain.floats.push_back(info.n_floats > 0 ? node.attrs.floats[0] : 0.0);
    chain.floats.push_back(info.n_floats > 1 ? node.attrs.floats[1] : 0.0);
}

}  // namespace

const ElementwiseOp* elementwise_op(Op op) {
    for (const ElementwiseOp& e : kElementwiseOps)
        if (e.op == op) return &e;
    return nullptr;
}

const std::vector<ElementwiseOp>& elementwise_ops() {
    static const std::vector<ElementwiseOp> all(std::begin(kElementwiseOps), std::end(kElementwiseOps));
    return all;
}

std::vector<ChainStep> chain_steps(const OpAttrs& attrs) {
    std::vector<ChainStep> steps;
    for (size_t at = kShapeInts, s = 0; at + kStepInts <= attrs.ints.size(); at += kStepInts, ++s)
        steps.push_back({Op(attrs.ints[at]), int(attrs.ints[at + 1]), int(attrs.ints[at + 2]),
                         float(attrs.floats[2 * s]), float(attrs.floats[2 * s + 1])});
    return steps;
}

OutSpec shape_elementwise_chain(const Inputs& in, const OpAttrs& attrs) {
    const size_t n_ints = attrs.ints.size();
    if (n_ints < kShapeInts + kStepInts || (n_ints - kShapeInts) % kStepInts != 0)
        throw std::invalid_argument(op_err(kOp, "expected ints ne[0..3], ndim, then (op, a, b) per step; got " +
                                                    std::to_string(n_ints) + " ints"));
    const size_t n_steps = (n_ints - kShapeInts) / kStepInts;
    if (n_steps > kMaxChainSteps)
        throw std::invalid_argument(op_err(kOp, std::to_string(n_steps) + " steps; at most " +
                                                    std::to_string(kMaxChainSteps)));
    if (attrs.floats.size() != 2 * n_steps)
        throw std::invalid_argument(op_err(kOp, "expected 2 floats per step (" + std::to_string(2 * n_steps) +
                                                    "), got " + std::to_string(attrs.floats.size())));
    if (in.empty() || in.size() > kMaxChainInputs)
        throw std::invalid_argument(op_err(kOp, "expected 1 to " + std::to_string(kMaxChainInputs) +
                                                    " inputs, got " + std::to_string(in.size())));
    const OutSpec spec = shape_from_attrs(kOp, attrs, 0, DType::f32);
    for (size_t k = 0; k < in.size(); ++k) {
        const TensorImpl& t = *in[k];
        if (t.dtype != DType::f32)
            throw TypeError(op_err(kOp, "input " + std::to_string(k) + " must be f32, got " + dtype_name(t.dtype)));
        if (t.device != in[0]->device)
            throw std::invalid_argument(op_err(kOp, "input " + std::to_string(k) + " is on another device than input 0"));
        if (!full_size(t, spec.ne) && t.numel() != 1)
            throw std::invalid_argument(op_err(kOp, "input " + std::to_string(k) + " is " + t.shape_str() +
                                                        "; inputs must have the output's shape or one element"));
    }
    const std::vector<ChainStep> steps = chain_steps(attrs);
    for (size_t s = 0; s < steps.size(); ++s) {
        const ChainStep& step = steps[s];
        const std::string which = "step " + std::to_string(s);
        const ElementwiseOp* info =
            int64_t(step.op) >= 0 && int64_t(step.op) < int64_t(Op::count) ? elementwise_op(step.op) : nullptr;
        if (!info) throw std::invalid_argument(op_err(kOp, which + ": op " + std::to_string(int64_t(step.op)) +
                                                               " is not an elementwise op a chain can hold"));
        auto check = [&](int operand, const char* name) {
            const bool value_ok = s > 0 && operand == kChainValue;
            if (!value_ok && (operand < 0 || size_t(operand) >= in.size()))
                throw std::invalid_argument(op_err(kOp, which + ": operand " + name + " is " + std::to_string(operand) +
                                                            "; expected an input index" + (s > 0 ? " or -1" : "")));
        };
        check(step.a, "a");
        if (info->binary()) {
            check(step.b, "b");
        } else if (step.b != kChainNone) {
            throw std::invalid_argument(op_err(kOp, which + ": a unary op's operand b must be -2"));
        }
        const auto sized = [&](int operand) { return operand == kChainValue || full_size(*in[operand], spec.ne); };
        if (s == 0 && !sized(step.a) && !(info->binary() && sized(step.b)))
            throw std::invalid_argument(op_err(kOp, "step 0 must read an input of the output's shape"));
    }
    return spec;
}

// Runs the steps one at a time with the ops' own kernels (the CPU gains nothing from fusing).
void cpu_elementwise_chain(const Inputs& in, const OpAttrs& attrs, TensorImpl& out) {
    const std::vector<ChainStep> steps = chain_steps(attrs);
    TensorPtr value;
    for (size_t s = 0; s < steps.size(); ++s) {
        const ChainStep& step = steps[s];
        const ElementwiseOp& info = *elementwise_op(step.op);
        auto operand = [&](int which) { return which == kChainValue ? value : in[which]; };
        Inputs args{operand(step.a)};
        if (info.binary()) args.push_back(operand(step.b));
        OpAttrs step_attrs;
        const float numbers[2] = {step.p0, step.p1};
        step_attrs.floats.assign(numbers, numbers + info.n_floats);
        const bool last = s + 1 == steps.size();
        TensorPtr result = last ? nullptr : make_tensor(out.ne, out.ndim, out.dtype);
        op_info(step.op).cpu(args, step_attrs, last ? out : *result);
        value = result;
    }
}

void fuse_elementwise_chains(std::vector<Node>& nodes, const std::unordered_set<const TensorImpl*>& outputs) {
    std::unordered_map<const TensorImpl*, size_t> uses;
    for (const Node& node : nodes)
        for (const TensorPtr& t : node.inputs) ++uses[t.get()];
    std::vector<Chain> chains;
    std::unordered_map<const TensorImpl*, size_t> chain_ending_in;  // a chain's last output -> the chain
    int64_t last_side_effect = -1;
    for (size_t k = 0; k < nodes.size(); ++k) {
        const Node& node = nodes[k];
        if (has_side_effects(node.op)) last_side_effect = int64_t(k);
        if (!chainable(node)) continue;
        // The chain this node extends: one whose output only it reads, else a small one to copy.
        // Of two such chains (a binary op on two runs' results), the one recorded last: the other
        // is then its input, whose level comes earlier, so the two runs make one level, not two
        // (the first run extended had waited for the second: skipped_count's sum of the flags of
        // the critic's early norm and the actor's late one).
        size_t extended = chains.size(), to_copy = chains.size();
        const TensorImpl *value = nullptr, *copied_value = nullptr;
        for (const TensorPtr& t : node.inputs) {
            auto found = chain_ending_in.find(t.get());
            if (found == chain_ending_in.end()) continue;
            const Chain& c = chains[found->second];
            const auto reads = size_t(std::count(node.inputs.begin(), node.inputs.end(), t));
            const bool fits = t->ne == node.out->ne && last_side_effect < int64_t(c.first) &&
                              c.steps.size() / kStepInts < kMaxChainSteps &&
                              c.inputs.size() + new_inputs(c, node, t.get()) <= kMaxChainInputs;
            if (fits && uses[t.get()] == reads && !outputs.count(t.get())) {
                if (!value || c.members.back() > chains[extended].members.back()) {
                    extended = found->second;
                    value = t.get();
                }
                continue;
            }
            if (fits && t->numel() <= kRecomputedElements && !copied_value) {
                to_copy = found->second;
                copied_value = t.get();
            }
        }
        const bool copied = !value && copied_value;
        if (copied) {  // this node's chain runs the small chain's steps again, from its inputs
            Chain copy = chains[to_copy];
            copy.members.clear();
            chains.push_back(std::move(copy));
            extended = chains.size() - 1;
            value = copied_value;
        } else if (extended == chains.size()) {
            chains.push_back(Chain{k, {}, {}, {}, {}});
        }
        Chain& chain = chains[extended];
        add_step(chain, node, value);
        chain.members.push_back(k);
        if (value && !copied) chain_ending_in.erase(value);  // a copied chain's other readers may copy it too
        chain_ending_in[node.out.get()] = extended;
    }
    std::vector<bool> drop(nodes.size(), false);
    for (Chain& chain : chains) {
        if (chain.steps.size() < 2 * kStepInts) continue;  // one op: it stays as it is
        for (size_t m = 0; m + 1 < chain.members.size(); ++m) drop[chain.members[m]] = true;
        Node& last = nodes[chain.members.back()];
        const TensorImpl& out = *last.out;
        OpAttrs attrs;
        attrs.ints = {out.ne[0], out.ne[1], out.ne[2], out.ne[3], out.ndim};
        attrs.ints.insert(attrs.ints.end(), chain.steps.begin(), chain.steps.end());
        attrs.floats = std::move(chain.floats);
        last = Node{Op::elementwise_chain, std::move(chain.inputs), std::move(attrs), last.out};
    }
    erase_nodes(nodes, drop);
}

}  // namespace rk
