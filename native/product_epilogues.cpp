#include "product_epilogues.hpp"

#include <unordered_map>

namespace rk {

void fuse_relu_back_into_products(std::vector<Node>& nodes, const std::unordered_set<const TensorImpl*>& outputs) {
    std::unordered_map<const TensorImpl*, size_t> uses, producer;
    for (size_t k = 0; k < nodes.size(); ++k) {
        for (const TensorPtr& t : nodes[k].inputs) ++uses[t.get()];
        producer[nodes[k].out.get()] = k;
    }
    std::vector<bool> drop(nodes.size(), false);
    int64_t last_side_effect = -1;
    for (size_t k = 0; k < nodes.size(); ++k) {
        Node& node = nodes[k];
        if (has_side_effects(node.op)) last_side_effect = int64_t(k);
        if (node.op != Op::relu_back) continue;
        const TensorPtr &product = node.inputs[0], &y = node.inputs[1];
        auto found = producer.find(product.get());
        if (found == producer.end() || product.get() == y.get()) continue;
        const size_t m = found->second;
        const Node& matmul = nodes[m];
        if (matmul.op != Op::matmul || uses[product.get()] != 1 || outputs.count(product.get()) ||
            int64_t(m) < last_side_effect)
            continue;
        const bool all_f32 = matmul.inputs[0]->dtype == DType::f32 && matmul.inputs[1]->dtype == DType::f32 &&
                             product->dtype == DType::f32 && y->dtype == DType::f32;
        if (!all_f32 || y->ne != product->ne || node.out->ne != product->ne) continue;
        drop[m] = true;
        node = Node{Op::matmul_relu_mask, {matmul.inputs[0], matmul.inputs[1], y}, matmul.attrs, node.out};
    }
    erase_nodes(nodes, drop);
}

}  // namespace rk
