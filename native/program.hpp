// A Program is a recorded graph kept for replay: a captured training step. Its inputs are
// placeholders that live in one block (filled by one upload per replay), its outputs live in
// another (read by one download), its intermediates in an arena planned once by liveness.
// Tensors it reads but does not make (parameters, optimizer moments, buffers) are read where
// they are at each replay, so in-place updates and buffer writes are seen.
//
// On the GPU the program's kernels are recorded into a command buffer once (at the first
// replay) and that buffer is re-submitted at every replay. What a recording bakes in is checked
// cheaply before each submission: the device address of every tensor the program reads or
// writes without owning it (a moved one re-records). Random ops read their streams from the
// input block, which the host fills with fresh draws from the global generator at every replay;
// optimizer coefficients and step counts are inputs too (capture's host inputs).
#pragma once

#include <memory>
#include <utility>
#include <vector>

#include "backend.hpp"
#include "ops.hpp"
#include "views.hpp"

namespace rk {

class Program {
  public:
    // nodes: a recording; inputs: pending tensors no node produces; outputs: node outputs, of
    // which the first n_early can be read before the program ends (early).
    Program(std::vector<Node> nodes, Inputs inputs, Inputs outputs, size_t n_early = 0);

    // Runs the program: host_inputs[i] holds inputs[i]'s bytes, outputs are written to
    // host_outputs[i]. On the GPU: one upload, one submission, one download.
    void replay(const std::vector<const void*>& host_inputs, const std::vector<void*>& host_outputs);
    // replay() in two halves, so that the host works while the GPU runs the program: launch
    // copies the inputs and starts the run (on the GPU it returns while the program runs; work
    // submitted later runs after it; on the CPU the program runs to its end here), finish
    // waits for it and copies the outputs. A second launch before finish is a logic_error.
    void launch(const std::vector<const void*>& host_inputs);
    void finish(const std::vector<void*>& host_outputs);
    // Between launch and finish: copies the first n_early outputs to host_outputs as soon as
    // they are computed. On the GPU the program copies them out and signals the host at the
    // level after their last kernel, while the rest of it runs (an agent's actions, read before
    // its update ends); on the CPU the program has run whole at launch.
    void early(const std::vector<void*>& host_outputs);
    size_t n_early() const { return n_early_; }

    const Inputs& inputs() const { return inputs_; }
    const Inputs& outputs() const { return outputs_; }
    size_t n_nodes() const { return nodes_.size(); }
    size_t n_live() const;
    // Live nodes that read their input's bytes in place rather than run (native/views.hpp).
    size_t n_views() const;
    size_t arena_bytes() const { return arena_bytes_; }
    Device device() const { return device_; }
    // On the GPU: the mean GPU time of each dependency level and what it runs, where the program
    // was recorded with profiling on (set_gpu_profiling) and has run. On the CPU: the mean time of
    // each live node ("op [output shape]"), where it was created with set_cpu_profiling on and has
    // run. Else empty.
    std::vector<LevelTime> level_times() const;

  private:
    void execute_nodes();
    // Each live node's level in a schedule by data dependencies alone (in-place updates after
    // earlier reads of what they write), and the level at which its output is read last (its
    // own where nothing reads it): what the GPU arena plans its reuse by.
    struct DataLevels {
        std::vector<uint32_t> level, ready;
    };
    DataLevels data_levels() const;
    bool recording_is_current() const;
    void record();

    std::vector<Node> nodes_;
    std::vector<bool> live_;
    std::vector<std::optional<View>> views_;  // per node: the node whose bytes it reads, where it is a view
    Inputs inputs_, outputs_;
    size_t n_early_ = 0, early_bytes_ = 0;  // the early outputs, and the bytes of the block they lead
    Device device_ = Device::cpu;
    TensorPtr input_block_, output_block_;  // u8 tensors holding every input / output
    std::vector<size_t> input_offsets_, output_offsets_;
    std::shared_ptr<Storage> arena_;
    size_t arena_bytes_ = 0;
    size_t streams_offset_ = 0, n_streams_ = 0;  // the random ops' streams, after the inputs
    std::unique_ptr<RecordedProgram> recorded_;  // null where the backend runs nodes as they come
    bool recorded_ok_ = false;                   // recorded_ holds a finished recording
    bool launched_ = false;                      // launched, its outputs not read yet
    // Tensors the program reads or writes but does not own, and their addresses when recorded.
    std::vector<std::pair<TensorPtr, uint64_t>> external_addresses_;
    // CPU profiling: each node's summed seconds over `timed_runs_` replays (empty when off).
    std::vector<double> node_seconds_;
    size_t timed_runs_ = 0;
};

// CPU programs created from now on time each node at every replay (Program::level_times).
void set_cpu_profiling(bool on);

}  // namespace rk
