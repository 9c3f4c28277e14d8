#include "views.hpp"

#include <algorithm>
#include <unordered_set>

#include "planner.hpp"

namespace rk {

namespace {

// The byte offset of node's output in its input's bytes, where it is a view of them.
std::optional<size_t> view_offset(const Node& node) {
    if (node.op == Op::reshape) return size_t(0);
    if (node.op != Op::slice_rows) return std::nullopt;
    const TensorImpl& x = *node.inputs[0];
    if (x.ne[1] * x.ne[2] * x.ne[3] != 1) return std::nullopt;  // rows of several columns are not one run
    const size_t offset = size_t(node.attrs.ints[0]) * dtype_size(x.dtype);  // start < numel: no overflow
    if (offset % kArenaAlign != 0) return std::nullopt;
    return offset;
}

}  // namespace

std::vector<std::optional<View>> find_views(const std::vector<Node>& nodes, const std::vector<bool>& live,
                                            const std::function<bool(size_t)>& may_share) {
    std::unordered_map<const TensorImpl*, size_t> producer;
    std::unordered_set<const TensorImpl*> written;  // inputs of ops with side effects
    for (size_t k = 0; k < nodes.size(); ++k) {
        if (!live[k]) continue;
        producer[nodes[k].out.get()] = k;
        if (has_side_effects(nodes[k].op))
            for (const auto& in : nodes[k].inputs) written.insert(in.get());
    }
    std::vector<std::optional<View>> views(nodes.size());
    for (size_t k = 0; k < nodes.size(); ++k) {
        if (!live[k]) continue;
        const std::optional<size_t> offset = view_offset(nodes[k]);
        if (!offset || written.count(nodes[k].out.get()) || !may_share(k)) continue;
        const TensorImpl* x = nodes[k].inputs[0].get();
        auto p = producer.find(x);
        if (p == producer.end() || written.count(x)) continue;
        // A view of a view reads its root's bytes; the tensors between were each checked when made.
        views[k] = views[p->second] ? View{views[p->second]->root, views[p->second]->byte_offset + *offset}
                                    : View{p->second, *offset};
    }
    return views;
}

void extend_roots_last_use(const std::vector<Node>& nodes, const std::vector<std::optional<View>>& views,
                           std::unordered_map<const TensorImpl*, size_t>& last_use) {
    for (size_t k = 0; k < nodes.size(); ++k) {
        if (!views[k]) continue;
        auto read = last_use.find(nodes[k].out.get());
        size_t& root_read = last_use[nodes[views[k]->root].out.get()];
        if (read != last_use.end()) root_read = std::max(root_read, read->second);
    }
}

void place_views(const std::vector<Node>& nodes, const std::vector<std::optional<View>>& views) {
    for (size_t k = 0; k < nodes.size(); ++k) {
        if (!views[k]) continue;
        const TensorImpl& root = *nodes[views[k]->root].out;
        nodes[k].out->storage = root.storage;
        nodes[k].out->offset = root.offset + views[k]->byte_offset;
    }
}

size_t count_views(const std::vector<std::optional<View>>& views) {
    return size_t(std::count_if(views.begin(), views.end(), [](const auto& v) { return v.has_value(); }));
}

}  // namespace rk
