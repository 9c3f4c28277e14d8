// Chains of elementwise ops run as one op (elementwise_chain): what a chain may hold, how its
// steps are stored in the op's attributes, and the pass that fuses a captured GPU program's
// runs of unary and binary ops into chains (one dispatch and one barrier level instead of one
// per op).
#pragma once

#include <cstdint>
#include <unordered_set>
#include <vector>

#include "ops.hpp"

namespace rk {

constexpr size_t kMaxChainInputs = 8;  // chain.comp's push constants hold 8 input addresses
constexpr size_t kMaxChainSteps = 16;

// An elementwise op (native/elementwise.def): its code in the shaders (a chain's steps name their
// ops by it), and how many float attributes it takes (scale's factor, clamp's bounds, ...). A
// chain holds every elementwise op.
struct ElementwiseOp {
    Op op;
    ElementwiseKind kind;
    uint32_t code;
    size_t n_floats;
    bool binary() const { return kind != ElementwiseKind::unary; }
};

// The entry of `op`, or null where op is not elementwise.
const ElementwiseOp* elementwise_op(Op op);
// Every entry, in the list's order.
const std::vector<ElementwiseOp>& elementwise_ops();

// One step of a chain: op applied to operands a (and b, binary ops), each an input's index or
// kChainValue (the value so far); p0, p1 are its float attributes (0 where it takes fewer).
constexpr int kChainValue = -1;
constexpr int kChainNone = -2;  // b of a unary op
struct ChainStep {
    Op op;
    int a, b;
    float p0, p1;
};

// Attributes: ints ne[0..3], ndim (the output's shape), then (op, a, b) per step; floats (p0, p1)
// per step. chain_steps reads them back (the shape rule has checked them).
std::vector<ChainStep> chain_steps(const OpAttrs& attrs);

// Replaces runs of chainable f32 nodes of a GPU program, each reading the one before it as the
// sole reader of its output, by elementwise_chain nodes at the position of each run's last node.
// A reader of a small run's output that has other readers too (at most kRecomputedElements
// elements, elementwise_chain.cpp) begins a run of its own with a copy of that run's steps. A
// run never crosses a node with side effects (an in-place write could change what a moved node
// reads). `outputs`: the program's outputs (they stay nodes' outputs).
void fuse_elementwise_chains(std::vector<Node>& nodes, const std::unordered_set<const TensorImpl*>& outputs);

}  // namespace rk
