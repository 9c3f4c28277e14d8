#include "program.hpp"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <unordered_map>
#include <unordered_set>

#include "backend.hpp"
#include "elementwise_chain.hpp"
#include "product_epilogues.hpp"
#include "planner.hpp"
#include "random.hpp"
#include "views.hpp"

namespace rk {
namespace {

// Byte offsets of tensors packed one after another (64-byte aligned), and the total. A tensor
// listed twice (a function returning one result twice) has one place, its first.
size_t pack(const Inputs& tensors, std::vector<size_t>& offsets) {
    size_t total = 0;
    std::unordered_map<const TensorImpl*, size_t> placed;
    for (const auto& t : tensors) {
        auto [at, first] = placed.emplace(t.get(), total);
        offsets.push_back(at->second);
        if (first) total = size_t(size_add(int64_t(total), int64_t(arena_aligned(t->nbytes()))));  // one block holds them all
    }
    return total;
}

constexpr size_t kStreamBytes = sizeof(uint64_t);
constexpr uint32_t kGpuReuseSlack = 1;  // levels (see the arena's planning below)

bool cpu_profiling = false;

void place(const TensorPtr& t, const TensorPtr& block, size_t offset) {
    t->storage = block->storage;
    t->offset = block->offset + offset;
}

}  // namespace

Program::Program(std::vector<Node> nodes, Inputs inputs, Inputs outputs, size_t n_early)
    : nodes_(std::move(nodes)), inputs_(std::move(inputs)), outputs_(std::move(outputs)), n_early_(n_early) {
    if (nodes_.empty()) throw std::invalid_argument("capture: the traced function ran no op");
    if (outputs_.empty()) throw std::invalid_argument("capture: the traced function has no output");
    if (n_early_ > outputs_.size())
        throw std::invalid_argument("capture: " + std::to_string(n_early_) + " early outputs of a function with " +
                                    std::to_string(outputs_.size()));
    device_ = nodes_[0].out->device;
    std::unordered_map<const TensorImpl*, size_t> producer;
    std::unordered_set<const TensorImpl*> placeholders;
    for (const auto& t : inputs_) placeholders.insert(t.get());
    for (size_t k = 0; k < nodes_.size(); ++k) {
        if (nodes_[k].out->device != device_) throw std::invalid_argument("capture: ops ran on more than one device");
        for (const auto& in : nodes_[k].inputs) {
            const bool known = producer.count(in.get()) || placeholders.count(in.get()) || !in->pending();
            if (!known)
                throw std::invalid_argument(std::string("capture: an input of ") + op_info(nodes_[k].op).name +
                                            " comes from outside the trace and was never computed");
        }
        producer[nodes_[k].out.get()] = k;
    }
    std::unordered_set<const TensorImpl*> is_output;
    for (const auto& t : outputs_) {
        if (!producer.count(t.get())) throw std::invalid_argument("capture: an output was not computed by the traced ops");
        is_output.insert(t.get());
    }
    // Products take their relu_back (on the CPU applied to each block of the product while it is in
    // its core's cache); on the GPU runs of elementwise ops become one kernel each.
    fuse_relu_back_into_products(nodes_, is_output);
    if (device_ == Device::gpu) fuse_elementwise_chains(nodes_, is_output);
    producer.clear();
    for (size_t k = 0; k < nodes_.size(); ++k) producer[nodes_[k].out.get()] = k;

    // Live: the outputs, the in-place updates, and everything they read.
    live_.assign(nodes_.size(), false);
    for (size_t k = nodes_.size(); k-- > 0;) {
        live_[k] = live_[k] || is_output.count(nodes_[k].out.get()) || has_side_effects(nodes_[k].op);
        if (!live_[k]) continue;
        for (const auto& in : nodes_[k].inputs) {
            auto p = producer.find(in.get());
            if (p != producer.end()) live_[p->second] = true;
        }
    }
    std::unordered_map<const TensorImpl*, size_t> last_use;
    std::unordered_set<const TensorImpl*> external;
    for (size_t k = 0; k < nodes_.size(); ++k) {
        if (!live_[k]) continue;
        n_streams_ += draws_random(nodes_[k].op);
        for (const auto& in : nodes_[k].inputs) {
            last_use[in.get()] = k;
            if (!producer.count(in.get()) && !placeholders.count(in.get()) && external.insert(in.get()).second)
                external_addresses_.emplace_back(in, 0);
        }
    }

    // Reshapes and slices of a column read their input's bytes in place (an output keeps its own
    // place in the output block): no copy, and no kernel.
    views_ = find_views(nodes_, live_, [&](size_t k) { return !is_output.count(nodes_[k].out.get()); });

    // Inputs and outputs get blocks of their own (one transfer each way); intermediates share
    // an arena by liveness, planned once for every replay.
    Backend& be = backend(device_);
    // The input block ends with the random ops' streams (written at every replay).
    streams_offset_ = pack(inputs_, input_offsets_);
    const size_t in_bytes = std::max(streams_offset_ + n_streams_ * kStreamBytes, kArenaAlign);
    const size_t out_bytes = std::max(pack(outputs_, output_offsets_), kArenaAlign);
    input_block_ = make_on(device_, {int64_t(in_bytes), 1, 1, 1}, 2, DType::u8);
    output_block_ = make_on(device_, {int64_t(out_bytes), 1, 1, 1}, 2, DType::u8);
    for (size_t i = 0; i < inputs_.size(); ++i) place(inputs_[i], input_block_, input_offsets_[i]);
    for (size_t i = 0; i < outputs_.size(); ++i) place(outputs_[i], output_block_, output_offsets_[i]);
    // The early outputs lead the block: its first early_bytes (an early output also listed later
    // keeps its first place).
    for (size_t i = 0; i < n_early_; ++i)
        early_bytes_ = std::max(early_bytes_, output_offsets_[i] + outputs_[i]->nbytes());

    // On the GPU the recorder runs independent kernels side by side between barriers (by
    // address ranges): an intermediate's bytes are reused only by a node whose level by data
    // dependencies is more than kGpuReuseSlack levels past their last reader's, so that a
    // reuse seldom makes a kernel wait. Reuse after a fixed delay of 32 nodes instead had kept
    // a DQN program of 16 gradient steps at 418 levels on lavapipe's schedule, each step's
    // batch sampled only once bytes of the step before were free (301 now, as with no reuse at
    // all; its arena 3.7 MiB against 1.9 before and 14.7 without reuse; the SAC update's 54
    // levels stay, a slack of 0 made them 55). On the CPU nodes run one after another: bytes
    // are reused at once.
    const bool gpu = device_ == Device::gpu;
    DataLevels levels = gpu ? data_levels() : DataLevels{std::vector<uint32_t>(nodes_.size(), 0),
                                                         std::vector<uint32_t>(nodes_.size(), 0)};
    const std::vector<uint32_t>& level = levels.level;
    std::vector<uint32_t>& ready = levels.ready;
    // a view's root keeps its bytes until the view's last reader (by node on the CPU, by level on the GPU)
    extend_roots_last_use(nodes_, views_, last_use);
    for (size_t k = 0; k < nodes_.size(); ++k)
        if (views_[k]) ready[views_[k]->root] = std::max(ready[views_[k]->root], ready[k]);
    ArenaPlanner planner;
    std::vector<size_t> offset(nodes_.size(), 0);
    std::vector<std::vector<size_t>> frees_after(nodes_.size());
    for (size_t k = 0; k < nodes_.size(); ++k) {
        if (!live_[k]) continue;
        if (!is_output.count(nodes_[k].out.get()) && !views_[k]) {
            const uint32_t before = gpu ? (level[k] > kGpuReuseSlack ? level[k] - kGpuReuseSlack : 0)
                                        : FreeList::kAnyLevel;
            offset[k] = planner.allocate(nodes_[k].out->nbytes(), before);
            auto lu = last_use.find(nodes_[k].out.get());
            frees_after[lu == last_use.end() ? k : lu->second].push_back(k);
        }
        for (size_t j : frees_after[k]) planner.release(offset[j], nodes_[j].out->nbytes(), ready[j]);
    }
    arena_bytes_ = planner.high_water();
    arena_ = be.allocate(std::max<size_t>(arena_bytes_, kArenaAlign));
    for (size_t k = 0; k < nodes_.size(); ++k) {
        if (!live_[k] || is_output.count(nodes_[k].out.get()) || views_[k]) continue;
        nodes_[k].out->storage = arena_;
        nodes_[k].out->offset = offset[k];
    }
    place_views(nodes_, views_);
    recorded_ = be.recorded_program(*input_block_, *output_block_, early_bytes_);
    if (!recorded_ && cpu_profiling) node_seconds_.assign(nodes_.size(), 0.0);
}

Program::DataLevels Program::data_levels() const {
    // A node's level: one after the last write of each tensor it reads (its producer, or an
    // in-place update before it), and for an in-place update one after every earlier read of
    // what it writes (it writes its inputs, counted as all of them).
    std::vector<uint32_t> level(nodes_.size(), 0);
    std::unordered_map<const TensorImpl*, uint32_t> written, read;  // a tensor's last write's and latest read's levels
    for (size_t k = 0; k < nodes_.size(); ++k) {
        if (!live_[k]) continue;
        const bool in_place = has_side_effects(nodes_[k].op);
        uint32_t after = 0;
        for (const auto& in : nodes_[k].inputs) {
            auto w = written.find(in.get());
            if (w != written.end()) after = std::max(after, w->second);
            if (in_place) {
                auto r = read.find(in.get());
                if (r != read.end()) after = std::max(after, r->second);
            }
        }
        level[k] = after + 1;
        written[nodes_[k].out.get()] = level[k];
        for (const auto& in : nodes_[k].inputs) {
            uint32_t& r = read[in.get()];
            r = std::max(r, level[k]);
            if (in_place) written[in.get()] = level[k];
        }
    }
    std::vector<uint32_t> ready(level);
    for (size_t k = 0; k < nodes_.size(); ++k) {
        auto r = read.find(nodes_[k].out.get());
        if (live_[k] && r != read.end()) ready[k] = std::max(ready[k], r->second);
    }
    return {std::move(level), std::move(ready)};
}

void set_cpu_profiling(bool on) { cpu_profiling = on; }

std::vector<LevelTime> Program::level_times() const {
    if (recorded_) return recorded_->level_times();
    std::vector<LevelTime> times;
    if (!timed_runs_) return times;
    for (size_t k = 0; k < nodes_.size(); ++k)
        if (live_[k] && !views_[k])
            times.push_back({node_seconds_[k] * 1e6 / double(timed_runs_),
                             std::string(op_info(nodes_[k].op).name) + " " + nodes_[k].out->shape_str()});
    return times;
}

size_t Program::n_live() const { return size_t(std::count(live_.begin(), live_.end(), true)); }

size_t Program::n_views() const { return count_views(views_); }

void Program::replay(const std::vector<const void*>& host_inputs, const std::vector<void*>& host_outputs) {
    if (host_outputs.size() != outputs_.size())
        throw std::invalid_argument("replay: expected " + std::to_string(outputs_.size()) + " outputs");
    launch(host_inputs);
    finish(host_outputs);
}

void Program::launch(const std::vector<const void*>& host_inputs) {
    if (launched_) throw std::logic_error("launch: the program's previous launch was not finished (its outputs not read)");
    if (host_inputs.size() != inputs_.size())
        throw std::invalid_argument("launch: expected " + std::to_string(inputs_.size()) + " inputs");
    if (!recorded_) {
        std::vector<char> packed(size_t(input_block_->numel()), 0);
        for (size_t i = 0; i < inputs_.size(); ++i)
            std::memcpy(packed.data() + input_offsets_[i], host_inputs[i], inputs_[i]->nbytes());
        backend(device_).upload(*input_block_, 0, packed.data(), packed.size());
        execute_nodes();
        launched_ = true;
        return;
    }
    if (!recording_is_current()) record();
    char* staging = static_cast<char*>(recorded_->input_staging());
    for (size_t i = 0; i < inputs_.size(); ++i)
        std::memcpy(staging + input_offsets_[i], host_inputs[i], inputs_[i]->nbytes());
    // One fresh stream per random op, drawn in node order: the numbers an eager replay draws.
    for (size_t s = 0; s < n_streams_; ++s) {
        const uint64_t stream = next_stream();
        std::memcpy(staging + streams_offset_ + s * kStreamBytes, &stream, kStreamBytes);
    }
    recorded_->submit();
    launched_ = true;
}

void Program::early(const std::vector<void*>& host_outputs) {
    if (!launched_) throw std::logic_error("early: the program was not launched, or its outputs were read");
    if (host_outputs.size() != n_early_)
        throw std::invalid_argument("early: expected " + std::to_string(n_early_) + " outputs");
    std::vector<char> results;
    const char* block = nullptr;
    if (recorded_) {
        recorded_->wait_early();
        block = static_cast<const char*>(recorded_->output_staging());
    } else {  // the program ran to its end at launch
        results.resize(early_bytes_);
        backend(device_).download(*output_block_, 0, results.data(), results.size());
        block = results.data();
    }
    for (size_t i = 0; i < n_early_; ++i)
        std::memcpy(host_outputs[i], block + output_offsets_[i], outputs_[i]->nbytes());
}

void Program::finish(const std::vector<void*>& host_outputs) {
    if (!launched_) throw std::logic_error("finish: the program was not launched");
    if (host_outputs.size() != outputs_.size())
        throw std::invalid_argument("finish: expected " + std::to_string(outputs_.size()) + " outputs");
    launched_ = false;  // a failed wait leaves nothing to finish: the next launch may try again
    if (!recorded_) {
        std::vector<char> results(size_t(output_block_->numel()));
        backend(device_).download(*output_block_, 0, results.data(), results.size());
        for (size_t i = 0; i < outputs_.size(); ++i)
            std::memcpy(host_outputs[i], results.data() + output_offsets_[i], outputs_[i]->nbytes());
        return;
    }
    recorded_->wait();
    const char* results = static_cast<const char*>(recorded_->output_staging());
    for (size_t i = 0; i < outputs_.size(); ++i)
        std::memcpy(host_outputs[i], results + output_offsets_[i], outputs_[i]->nbytes());
}

void Program::execute_nodes() {
    using clock = std::chrono::steady_clock;
    const bool timed = !node_seconds_.empty();
    for (size_t k = 0; k < nodes_.size(); ++k) {
        if (!live_[k] || views_[k]) continue;
        const clock::time_point start = timed ? clock::now() : clock::time_point{};
        execute(nodes_[k].op, nodes_[k].inputs, nodes_[k].attrs, *nodes_[k].out);
        if (timed) node_seconds_[k] += std::chrono::duration<double>(clock::now() - start).count();
    }
    timed_runs_ += timed;
}

bool Program::recording_is_current() const {
    if (!recorded_ok_) return false;
    for (const auto& [t, address] : external_addresses_)
        if (!t->storage || t->address() != address) return false;
    return true;
}

void Program::record() {
    recorded_ok_ = false;
    recorded_->record([this] { execute_nodes(); }, streams_offset_, n_streams_);
    for (auto& [t, address] : external_addresses_) address = t->address();
    recorded_ok_ = true;
}

}  // namespace rk
