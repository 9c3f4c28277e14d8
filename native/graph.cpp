// Graph execution: planning memory by liveness (planner.hpp) and an in-order executor.
#include <algorithm>
#include <map>
#include <unordered_map>

#include "backend.hpp"
#include "planner.hpp"
#include "views.hpp"

namespace rk {

GraphStats Graph::run() {
    std::vector<Node> nodes = std::move(nodes_);
    nodes_.clear();
    GraphStats stats;
    stats.n_nodes = nodes.size();

    // Which node produced each pending tensor, how many input slots read it, and where last.
    std::unordered_map<const TensorImpl*, size_t> producer, readers, last_use;
    for (size_t k = 0; k < nodes.size(); ++k) producer[nodes[k].out.get()] = k;
    for (size_t k = 0; k < nodes.size(); ++k) {
        for (const auto& in : nodes[k].inputs) {
            auto p = producer.find(in.get());
            if (p == producer.end()) {
                if (in->pending()) {
                    const std::string msg = std::string(op_info(nodes[k].op).name) + ": input " + in->shape_str() +
                                            " is pending from another graph that has not run";
                    nodes_ = std::move(nodes);  // nothing ran: the graph can run once that one has
                    throw std::runtime_error(msg);
                }
                continue;
            }
            ++readers[in.get()];
            last_use[in.get()] = k;
        }
    }

    const Device device = nodes.empty() ? Device::cpu : nodes[0].out->device;
    for (const auto& node : nodes)
        if (node.out->device != device)
            throw std::invalid_argument("a graph's nodes must all run on one device");

    // An output referenced by anything besides this graph (node.out plus its reader slots)
    // outlives the graph. Nodes that neither produce such an output nor feed a live node are
    // dead (every op is pure) and are skipped: a vjp rule may compute a gradient nobody needs.
    std::vector<bool> external(nodes.size()), live(nodes.size());
    for (size_t k = nodes.size(); k-- > 0;) {
        external[k] = nodes[k].out.use_count() > long(1 + readers[nodes[k].out.get()]);
        live[k] = live[k] || external[k] || has_side_effects(nodes[k].op);
        if (!live[k]) continue;
        for (const auto& in : nodes[k].inputs) {
            auto p = producer.find(in.get());
            if (p != producer.end()) live[p->second] = true;
        }
    }

    // Reshapes and slices of an intermediate's column read its bytes in place (no copy), which
    // then stay until the views' last reader.
    const std::vector<std::optional<View>> views = find_views(nodes, live, [&](size_t k) { return !external[k]; });
    extend_roots_last_use(nodes, views, last_use);

    // Live intermediates share one arena by liveness; a block is free again after its last reader.
    // Tiny tensors (scalars, constants) get a region of their own: placed in the holes large
    // intermediates leave, they would split those holes and push the next large one past them.
    constexpr size_t kSmall = 256;
    ArenaPlanner planner, small_planner;
    auto planner_for = [&](size_t nbytes) -> ArenaPlanner& { return nbytes <= kSmall ? small_planner : planner; };
    std::vector<size_t> offset(nodes.size(), 0);
    std::vector<bool> in_arena(nodes.size(), false);
    std::vector<std::vector<size_t>> frees_after(nodes.size());
    for (size_t k = 0; k < nodes.size(); ++k) {
        TensorImpl* out = nodes[k].out.get();
        const bool runs = live[k] && !views[k];  // frees due after a node that does not run still happen
        if (runs && external[k]) {
            out->storage = backend(out->device).allocate(out->nbytes());
            stats.kept_bytes += out->nbytes();
        } else if (runs) {
            in_arena[k] = true;
            offset[k] = planner_for(out->nbytes()).allocate(out->nbytes());
            stats.intermediate_bytes += out->nbytes();
            auto lu = last_use.find(out);  // a live intermediate always has a live reader
            frees_after[lu == last_use.end() ? k : lu->second].push_back(k);
        }
        for (size_t j : frees_after[k]) planner_for(nodes[j].out->nbytes()).release(offset[j], nodes[j].out->nbytes());
    }
    for (size_t k = 0; k < nodes.size(); ++k)  // the small region follows the large one
        if (in_arena[k] && nodes[k].out->nbytes() <= kSmall) offset[k] += planner.high_water();
    stats.arena_bytes = planner.high_water() + small_planner.high_water();
    stats.n_skipped = std::count(live.begin(), live.end(), false);
    stats.n_views = count_views(views);

    Backend& be = backend(device);
    std::shared_ptr<Storage> arena = be.allocate(stats.arena_bytes);
    for (size_t k = 0; k < nodes.size(); ++k) {
        if (!in_arena[k]) continue;
        nodes[k].out->storage = arena;
        nodes[k].out->offset = offset[k];
    }
    place_views(nodes, views);
    for (size_t k = 0; k < nodes.size(); ++k) {
        if (!live[k] || views[k]) continue;
        try {
            execute(nodes[k].op, nodes[k].inputs, nodes[k].attrs, *nodes[k].out);
        } catch (...) {
            // This node's output and every later one were never computed: make them pending
            // again instead of leaving uninitialised memory readable.
            for (size_t j = k; j < nodes.size(); ++j) {
                nodes[j].out->storage.reset();
                nodes[j].out->offset = 0;
            }
            throw;
        }
    }
    return stats;
}

}  // namespace rk
