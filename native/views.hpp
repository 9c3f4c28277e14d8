// Views: a reshape, or a slice of rows of a tensor of one column, outputs its input's bytes (all
// of them, or one run of them). Where a graph or a program can prove nothing tells the two apart,
// the node gives its output its input's storage at an offset and runs no kernel: no copy.
#pragma once

#include <functional>
#include <optional>
#include <unordered_map>
#include <vector>

#include "ops.hpp"

namespace rk {

struct View {
    size_t root;         // the node whose output's bytes the view reads (itself not a view)
    size_t byte_offset;  // where in those bytes the view's start
};

// For each node, the node whose bytes it reads in place, or nullopt where it runs its kernel. A
// live node is a view where it is a reshape, or a slice_rows of one column starting at a
// multiple of kArenaAlign bytes (so every kernel sees addresses as aligned as the arena's); its
// input is made by a live node of `nodes`; no op with side effects takes the view or any tensor
// whose bytes it shares (those ops write their inputs); and `may_share(k)` (the caller's rule for
// node k's output: not a tensor anything outside the graph holds) allows it.
std::vector<std::optional<View>> find_views(const std::vector<Node>& nodes, const std::vector<bool>& live,
                                            const std::function<bool(size_t)>& may_share);

// Extends each root's last read (`last_use`: a tensor's last reader, by node index) to its views'
// last reads, so that a planner keeps the root's bytes while a view is still read.
void extend_roots_last_use(const std::vector<Node>& nodes, const std::vector<std::optional<View>>& views,
                           std::unordered_map<const TensorImpl*, size_t>& last_use);

// Gives each view its root's storage (at its offset); the roots must have theirs.
void place_views(const std::vector<Node>& nodes, const std::vector<std::optional<View>>& views);

// How many nodes are views.
size_t count_views(const std::vector<std::optional<View>>& views);

}  // namespace rk
