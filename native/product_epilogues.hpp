// The pass that gives a captured program's products their gradient epilogue: a matmul whose only
// reader is relu_back (a hidden ReLU layer's input gradient in a backward pass) becomes one
// matmul_relu_mask node, the product's kernel applying relu_back's value as it writes. On the GPU
// that takes a dependency level of one small elementwise kernel off each such layer of an update;
// on the CPU, a pass over the layer's gradient, each block masked while it is in its core's cache.
#pragma once

#include <unordered_set>
#include <vector>

#include "ops.hpp"

namespace rk {

// Replaces each f32 matmul read only by one relu_back(product, y) (y of the product's shape), with
// no node with side effects between the two (an in-place write could change what the moved
// product reads), by a matmul_relu_mask node at relu_back's position. `outputs`: the program's
// outputs (a product that is one stays).
void fuse_relu_back_into_products(std::vector<Node>& nodes, const std::unordered_set<const TensorImpl*>& outputs);

}  // namespace rk
